"""Tagger: shapes, loss masking, batch invariance, the numbers-tags data, word alignment,
metrics and a short real training run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from seqserve.models.config import TaggerConfig
from seqserve.models.data import tags as tagdata
from seqserve.models.data.registry import generate, load_dataset, save_dataset
from seqserve.models.errors import DataError
from seqserve.models.nn.tagger import IGNORE_INDEX, Tagger
from seqserve.models.text.tokenizer import train_tokenizer
from seqserve.models.text.word_align import align, piece_labels
from seqserve.models.train.run import run_training
from seqserve.models.train.tagger import encode_tagging, label_scores

torch.set_num_threads(1)

LENGTHS = [5, 1, 8, 3]


def _model(**overrides: object) -> Tagger:
    torch.manual_seed(0)
    cfg = TaggerConfig(vocab_size=50, num_labels=6, embed_size=8, hidden_size=10,
                       num_layers=2, dropout=0.0, **overrides)  # type: ignore[arg-type]
    return Tagger(cfg).eval()


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    lengths = torch.tensor(LENGTHS)
    ids = torch.randint(4, 50, (len(LENGTHS), max(LENGTHS)))
    ids = ids.masked_fill(torch.arange(max(LENGTHS)) >= lengths.unsqueeze(1), 0)
    return ids, lengths


def test_shapes_and_log_probs() -> None:
    model = _model()
    ids, lengths = _batch()
    logits, loss = model(ids, lengths)
    assert logits.shape == (4, 8, 6) and loss is None
    log_probs = model.tag(ids, lengths)
    assert log_probs.shape == (4, 8, 6)
    for row, n in enumerate(LENGTHS):
        torch.testing.assert_close(log_probs[row, :n].exp().sum(-1), torch.ones(n))
        assert not log_probs[row, n:].any()


def test_loss_ignores_unlabelled_positions() -> None:
    model = _model()
    ids, lengths = _batch()
    labels = torch.randint(0, 6, ids.shape)
    labels[ids == 0] = IGNORE_INDEX
    with torch.no_grad():
        _, loss = model(ids, lengths, labels)
    longer = torch.cat([ids, torch.zeros(4, 3, dtype=torch.long)], 1)  # more padding
    longer_labels = torch.cat([labels, torch.full((4, 3), IGNORE_INDEX)], 1)
    with torch.no_grad():
        _, loss_longer = model(longer, lengths, longer_labels)
        _, loss_changed = model(ids, lengths, changed_labels(labels))
    assert loss is not None and loss_longer is not None
    torch.testing.assert_close(loss, loss_longer)
    assert loss_changed is not None and float(loss_changed) != float(loss)


def changed_labels(labels: torch.Tensor) -> torch.Tensor:
    """The same labels with the first (always labelled) position moved to another class."""
    changed = labels.clone()
    changed[0, 0] = (changed[0, 0] + 1) % 6
    return changed


@pytest.mark.parametrize("overrides", [{}, {"cell": "gru"}, {"cifg": True, "proj_size": 4}])
def test_batch_invariance(overrides: dict[str, object]) -> None:
    model = _model(**overrides)
    ids, lengths = _batch()
    out = model.tag(ids, lengths)
    for row, n in enumerate(LENGTHS):
        alone = model.tag(ids[row : row + 1, :n], lengths[row : row + 1])
        assert (out[row, :n] - alone[0]).abs().max() <= 1e-5


def test_numbers_tags_dataset() -> None:
    ds = generate("numbers-tags", size=400, seed=1)
    assert ds.task == "tagging" and ds.labels == sorted(tagdata.TAGS)
    texts = {s: {r["text"] for r in rows if r["form"] != "small"}  # small: seen values
             for s, rows in ds.splits.items()}
    assert not texts["train"] & texts["test"] and not texts["valid"] & texts["test"]
    for row in ds.splits["train"]:
        assert len(row["tags"]) == len(row["text"].split())
        assert set(row["tags"]) <= set(tagdata.TAGS)
    words, tags = tagdata.tagged("cardinal", 234_506)
    assert list(zip(words, tags, strict=True)) == [
        ("two", "unit"), ("hundred", "hundred"), ("and", "conj"), ("thirty-four", "ten"),
        ("thousand", "scale"), ("five", "unit"), ("hundred", "hundred"), ("and", "conj"),
        ("six", "unit")]
    assert tagdata.tagged("year", 1987) == (["nineteen", "eighty-seven"], ["year", "year"])
    assert tagdata.tagged("currency", (1, 5, "EUR"))[1] == ["unit", "currency", "conj", "unit",
                                                            "cents"]


def test_written_tagging_folder_round_trips(tmp_path: Path) -> None:
    ds = generate("numbers-tags", size=50)
    back = load_dataset(save_dataset(ds, tmp_path / "d"))
    assert back.task == "tagging" and back.splits["test"] == ds.splits["test"]
    bad = tmp_path / "d" / "valid.jsonl"
    bad.write_text(json.dumps({"text": "one two", "tags": ["unit"]}) + "\n")
    with pytest.raises(DataError, match="1 tags for 2"):
        load_dataset(tmp_path / "d")


def test_alignment_slices_words_and_labels_first_pieces(tmp_path: Path) -> None:
    tok = train_tokenizer(generate("numbers-tags", size=300).texts(), tmp_path / "t.model", 120)
    text = "  twenty-one  Thousand and\tfive  "
    pieces = tok.encode_with_offsets(text)
    aligned = align(text, pieces)
    assert [w.text for w in aligned] == text.split()
    for w in aligned:
        assert text[w.start : w.end] == w.text
        piece = pieces[w.piece]
        assert piece.start < w.end and piece.end > w.start
    labels = piece_labels(text, pieces, [7, 8, 9, 10])
    assert [labels[w.piece] for w in aligned] == [7, 8, 9, 10]
    assert sum(label != IGNORE_INDEX for label in labels) == 4
    encoded = encode_tagging([{"text": text, "tags": ["a", "b", "a", "b"]}], tok, ["a", "b"], 2)
    assert len(encoded[0].source) == 2  # truncated; words past the cut are dropped
    assert list(encoded[0].target).count(IGNORE_INDEX) <= 1


def test_label_scores() -> None:
    scores = label_scores([0, 0, 1, 2], [0, 1, 1, 2], ["a", "b", "c"])
    assert scores["f1/a"] == pytest.approx(2 / 3) and scores["f1/b"] == pytest.approx(2 / 3)
    assert scores["f1/c"] == 1.0
    assert scores["macro_f1"] == pytest.approx((2 / 3 + 2 / 3 + 1) / 3)


def test_training_run_learns(tmp_path: Path) -> None:
    metrics = run_training(
        "tagger", "numbers-tags", tmp_path / "run",
        {"vocab_size": 300, "embed_size": 24, "hidden_size": 24, "num_layers": 1,
         "max_length": 48},
        {"epochs": 2, "batch_size": 32, "lr": 1e-2, "warmup_steps": 10, "num_threads": 1},
        progress=False, data_size=800)
    assert metrics["token_accuracy"] > 0.8 and metrics["macro_f1"] > 0.6
    assert {f"f1/{t}" for t in ("unit", "year", "month")} <= set(metrics)
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["task"] == "tagger" and config["labels"] == sorted(tagdata.TAGS)
    assert (tmp_path / "run" / "DONE").is_file()


def test_user_tagging_files(tmp_path: Path) -> None:
    rows = [{"text": f"w{i} and w{i + 1}", "tags": ["noun", "conj", "noun"]} for i in range(60)]
    jsonl = tmp_path / "tags.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows))
    ds = load_dataset(jsonl)
    assert ds.task == "tagging" and ds.labels == ["conj", "noun"]
    assert sum(len(v) for v in ds.splits.values()) == 60
    tsv = tmp_path / "tags.tsv"
    tsv.write_text("text\ttags\n" + "".join(f"{r['text']}\t{' '.join(r['tags'])}\n"
                                          for r in rows))
    assert load_dataset(tsv).splits["train"][0]["tags"] == ["noun", "conj", "noun"]
    jsonl.write_text(json.dumps({"text": "a b", "tags": "x y"}) + "\n")
    with pytest.raises(DataError, match="list"):
        load_dataset(jsonl)
