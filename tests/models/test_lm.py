"""The language model: the serving entry points agree with the training forward, truncated
BPTT training learns, `seqserve train lm` writes a run with perplexity and bits per char, and
the exported bundle (prefill + lm_step) passes parity and batch invariance in verify."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from seqserve.models.data.pydoc_corpus import load_text_corpus, pydoc_topics
from seqserve.models.errors import DataError
from seqserve.models.nn.lm import LanguageModel, LMConfig

VARIANTS = [dict(cell="lstm"), dict(cell="gru", num_layers=2), dict(cell="rnn", num_layers=3),
            dict(cell="lstm", proj_size=8, peephole=True, num_layers=2, tie_weights=True),
            dict(cell="lstm", cifg=True, tie_weights=True)]


@pytest.mark.parametrize("options", VARIANTS, ids=lambda o: "-".join(f"{k}{v}" for k, v in
                                                                     o.items()))
def test_prefill_and_step_agree_with_the_training_forward(options: dict[str, object]) -> None:
    torch.manual_seed(0)
    model = LanguageModel(LMConfig(vocab_size=50, embed_size=12, hidden_size=16,
                                   **options)).eval()  # type: ignore[arg-type]
    ids = torch.randint(4, 50, (3, 9))
    lengths = torch.tensor([9, 5, 1])
    ids[1, 5:] = 0
    ids[2, 1:] = 0
    logits, _ = model(ids)
    reference = torch.log_softmax(logits, -1)
    state, log_probs = model.prefill(ids, lengths)
    assert state.shape == (3, model.config.state_dim)
    for b, n in enumerate(lengths.tolist()):
        assert torch.allclose(log_probs[b, :n], reference[b, :n], atol=1e-5)
        assert torch.all(log_probs[b, n:] == 0)
        alone, _ = model.prefill(ids[b : b + 1, :n], lengths[b : b + 1])
        assert torch.allclose(alone[0], state[b], atol=1e-6)  # state at the row's own end
    prefix, _ = model.prefill(ids[:1, :8], torch.tensor([8]))
    new_state, step = model.lm_step(ids[0, 8:9], prefix)
    assert torch.allclose(step[0], log_probs[0, 8], atol=1e-5)
    assert torch.allclose(new_state[0], state[0], atol=1e-5)


def test_config_refuses_bad_combinations() -> None:
    with pytest.raises(ValueError, match="num_layers"):
        LMConfig(num_layers=4)
    with pytest.raises(ValueError, match="cell='lstm'"):
        LMConfig(cell="gru", peephole=True)


def test_builtin_corpus_is_split_by_document() -> None:
    corpus = load_text_corpus("pydoc-topics")
    total = len(pydoc_topics())
    counts = {k: len(v) for k, v in corpus.splits.items()}
    assert sum(counts.values()) == total and min(counts.values()) >= 1
    train = set(corpus.splits["train"])
    assert not train & set(corpus.splits["test"]) and not train & set(corpus.splits["valid"])
    assert corpus.splits == load_text_corpus("pydoc-topics").splits  # deterministic


def test_user_files_one_document_each(tmp_path: Path) -> None:
    for i in range(4):
        (tmp_path / f"d{i}.txt").write_text(f"document {i}\nsecond line\n")
    corpus = load_text_corpus(str(tmp_path))
    assert sum(len(v) for v in corpus.splits.values()) == 4
    assert all("\n" in d for v in corpus.splits.values() for d in v)
    (tmp_path / "one.txt").write_text("a\nb\n")
    with pytest.raises(DataError, match="at least 3"):
        load_text_corpus(str(tmp_path / "one.txt"))


def test_training_run_stores_perplexity_and_learns(tiny_lm_run: Path) -> None:
    metrics = json.loads((tiny_lm_run / "test_metrics.json").read_text())
    config = json.loads((tiny_lm_run / "config.json").read_text())
    history = json.loads((tiny_lm_run / "metrics.json").read_text())["epochs"]
    assert config["task"] == "lm" and config["train"]["tbptt"] == 16
    assert (tiny_lm_run / "curves.png").stat().st_size > 1000 and (tiny_lm_run / "DONE").exists()
    vocab = config["model"]["vocab_size"]
    # far better than uniform over the vocabulary: the model learned the word sequences
    assert 1.0 < metrics["perplexity"] < vocab / 3
    assert metrics["bits_per_char"] > 0 and history[-1]["valid_perplexity"] > 0
    assert history[-1]["train_loss"] < history[0]["train_loss"] or len(history) == 1


def test_cli_train_lm_on_text_files(tmp_path: Path) -> None:
    from seqserve.cli import main

    docs = tmp_path / "docs"
    docs.mkdir()
    for i in range(5):
        (docs / f"{i}.txt").write_text(" ".join(["the cat sat on the mat"] * (3 + i)))
    code = main(["train", "lm", "--data", str(docs), "--out", str(tmp_path / "run"),
                 "--cell", "rnn", "--hidden", "16", "--embed", "8", "--layers", "2",
                 "--vocab-size", "30", "--epochs", "1", "--batch-size", "2", "--tbptt", "8",
                 "--tie-weights", "--threads", "1", "--quiet"])
    assert code == 0
    metrics = json.loads((tmp_path / "run" / "test_metrics.json").read_text())
    assert metrics["perplexity"] > 1.0 and "bits_per_char" in metrics


def test_export_and_verify(tiny_lm_repo: Path) -> None:
    from seqserve.export.manifest import load_bundle
    from seqserve.export.verify import verify_bundle

    bundle = tiny_lm_repo / "tiny-lm" / "1"
    manifest = load_bundle(bundle)
    assert manifest.task == "lm" and set(manifest.graphs) == {"prefill", "lm_step"}
    assert manifest.source_run["test_metrics"]["perplexity"] > 1.0
    assert manifest.parity["passed"]
    report = verify_bundle(bundle, grid={"batch_sizes": (1, 4), "lengths": (1, 5)})
    assert report["parity"]["passed"]
    assert set(report["parity"]["parity_max_abs"]["onnx"]) == {
        "prefill.state", "prefill.log_probs", "lm_step.new_state", "lm_step.log_probs"}
