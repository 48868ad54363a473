"""The training loop learns, writes the run directory of the contract, and the CLI drives it."""

from __future__ import annotations

import csv
import json
import random
from pathlib import Path

import pytest
import torch

from seqserve.cli import main
from seqserve.models.data.dataset import Dataset
from seqserve.models.train.run import run_training

torch.set_num_threads(1)

MARKERS = {"red": "warm", "blue": "cold", "green": "cold", "orange": "warm", "grey": "dull"}
FILLER = ["the", "a", "of", "and", "to", "in", "is", "it", "on", "at", "by", "we"]


def _classification(n: int, seed: int) -> list[dict[str, str]]:
    """Label = class of the one colour word hidden among filler words (chance ~ 1/3)."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        colour = rng.choice(sorted(MARKERS))
        words = rng.choices(FILLER, k=rng.randint(2, 7))
        words.insert(rng.randint(0, len(words)), colour)
        rows.append({"text": " ".join(words), "label": MARKERS[colour]})
    return rows


def _classification_dataset() -> Dataset:
    splits = {"train": _classification(600, 1), "valid": _classification(100, 2),
              "test": _classification(100, 3)}
    return Dataset("colours", "classification", splits, sorted(set(MARKERS.values())))


TINY_CLASSIFIER = {"vocab_size": 40, "embed_size": 16, "hidden_size": 16, "head_size": 16,
                   "num_layers": 1, "dropout": 0.0}
TINY_TRAIN = {"epochs": 4, "batch_size": 16, "lr": 1e-2, "num_threads": 1, "warmup_steps": 5,
              "tokenizer_type": "word", "patience": 0}


def test_tiny_classifier_learns_and_writes_the_run_directory(tmp_path: Path) -> None:
    test = run_training("classifier", _classification_dataset(), tmp_path, TINY_CLASSIFIER,
                        TINY_TRAIN, progress=False)
    assert test["accuracy"] > 0.8  # chance is about 0.4 (majority class)
    history = json.loads((tmp_path / "metrics.json").read_text())["epochs"]
    assert history[-1]["train_loss"] < history[0]["train_loss"]
    assert {"embedding", "rnn.forward_layers.0", "head.3"} <= set(history[0]["grad_norm"])
    for name in ("config.json", "tokenizer.model", "model.safetensors", "metrics.csv",
                 "curves.png", "test_metrics.json", "DONE"):
        assert (tmp_path / name).is_file(), name
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["task"] == "classifier" and config["labels"] == ["cold", "dull", "warm"]
    assert config["model"]["num_labels"] == 3
    with (tmp_path / "metrics.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(history) and "grad_norm/embedding" in rows[0]
    assert json.loads((tmp_path / "test_metrics.json").read_text()) == test


def test_training_is_reproducible_for_a_seed(tmp_path: Path) -> None:
    overrides = {**TINY_TRAIN, "epochs": 1}
    a = run_training("classifier", _classification_dataset(), tmp_path / "a", TINY_CLASSIFIER,
                     overrides, progress=False)
    b = run_training("classifier", _classification_dataset(), tmp_path / "b", TINY_CLASSIFIER,
                     overrides, progress=False)
    assert a["loss"] == b["loss"] and a["accuracy"] == b["accuracy"]


def _reversal(n: int, seed: int) -> list[dict[str, str]]:
    """Reverse a short sequence of words: needs attention over the whole source."""
    rng = random.Random(seed)
    words = ["one", "two", "three", "four", "five", "six", "seven", "eight"]
    rows = []
    for _ in range(n):
        src = rng.choices(words, k=rng.randint(1, 5))
        rows.append({"source": " ".join(src), "target": " ".join(reversed(src))})
    return rows


@pytest.mark.parametrize("decoder", ["luong", "bahdanau"])
def test_tiny_translator_learns_with_teacher_forcing_then_scheduled_sampling(
        tmp_path: Path, decoder: str) -> None:
    """Also the stepwise decoder (bahdanau: its context feeds the next step)."""
    splits = {"train": _reversal(600, 1), "valid": _reversal(50, 2), "test": _reversal(50, 3)}
    ds = Dataset("reverse", "translation", splits)
    model = {"vocab_size": 40, "embed_size": 16, "hidden_size": 32, "dropout": 0.0,
             "decoder": decoder}
    train = {**TINY_TRAIN, "epochs": 5, "lr": 1e-2, "batch_size": 32, "scheduled_sampling": 0.4}
    test = run_training("translator", ds, tmp_path, model, train, progress=False)
    history = json.loads((tmp_path / "metrics.json").read_text())["epochs"]
    assert history[-1]["train_loss"] < 0.5 * history[0]["train_loss"]
    assert test["token_accuracy"] > 0.6  # chance is 1/9
    assert {"exact_match", "chrf", "bleu"} <= set(test)
    assert [row["sampling_prob"] for row in history] == pytest.approx(
        [0.1 * (row["epoch"] - 1) for row in history])


def test_time_budget_stops_training_and_keeps_the_best_checkpoint(tmp_path: Path) -> None:
    train = {**TINY_TRAIN, "epochs": 50, "max_minutes": 0.0001}
    test = run_training("classifier", _classification_dataset(), tmp_path, TINY_CLASSIFIER,
                        train, progress=False)
    assert test["epochs_run"] == 1 and test["stop_reason"].startswith("time budget")
    assert (tmp_path / "model.safetensors").is_file() and (tmp_path / "DONE").is_file()


def test_cli_trains_from_user_data_files(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "data"
    data.mkdir()
    for split, rows in _classification_dataset().splits.items():
        lines = [json.dumps(r) for r in rows[:200]]
        (data / f"{split}.jsonl").write_text("\n".join(lines) + "\n")
    out = tmp_path / "run"
    code = main(["train", "classifier", "--data", str(data), "--out", str(out), "--epochs", "1",
                 "--hidden", "8", "--embed", "8", "--layers", "1", "--vocab-size", "40",
                 "--tokenizer-type", "word", "--threads", "1", "--quiet", "--cell", "gru"])
    assert code == 0 and (out / "DONE").is_file()
    config = json.loads((out / "config.json").read_text())
    assert config["model"]["cell"] == "gru" and config["model"]["hidden_size"] == 8
    printed = json.loads(capsys.readouterr().out)
    assert printed["test"]["examples"] == 100


def test_cli_reports_bad_options_and_task_mismatch_without_traceback(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "pairs.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in _reversal(50, 0)) + "\n")
    code = main(["train", "classifier", "--data", str(data), "--out", str(tmp_path / "r")])
    assert code == 2 and "translation" in capsys.readouterr().err
    code = main(["train", "translator", "--data", str(data), "--out", str(tmp_path / "r"),
                 "--hidden", "7", "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and "hidden_size" in err and "Traceback" not in err


def test_cli_decoder_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--decoder alone takes its score (none: none), also over --demo-defaults (which name
    the additive score); a score the decoder does not take is a clear error."""
    data = tmp_path / "pairs.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in _reversal(80, 0)) + "\n")
    base = ["train", "translator", "--data", str(data), "--epochs", "1", "--hidden", "8",
            "--embed", "8", "--vocab-size", "40", "--tokenizer-type", "word", "--quiet"]
    out = tmp_path / "none"
    assert main([*base, "--out", str(out), "--demo-defaults", "--decoder", "none",
                 "--forget-bias", "none", "--cell", "lstm", "--max-minutes", "0"]) == 0
    model = json.loads((out / "config.json").read_text())["model"]
    assert (model["decoder"], model["attention"], model["forget_bias"]) == ("none", "none", None)
    capsys.readouterr()
    assert main([*base, "--out", str(tmp_path / "bad"), "--decoder", "bahdanau",
                 "--attention", "dot"]) == 2
    err = capsys.readouterr().err
    assert "attention='dot' does not apply to decoder='bahdanau'" in err
    assert "Traceback" not in err


def test_metrics_on_hand_checked_cases() -> None:
    from seqserve.models.train.metrics import accuracy, macro_f1, translation_metrics

    predictions, labels = [0, 0, 1, 2, 2, 2], [0, 1, 1, 2, 2, 0]
    assert accuracy(predictions, labels) == pytest.approx(4 / 6)
    # per class F1: c0 = 2*1/(2+1+1) = .5, c1 = 2/(2+0+1) = 2/3, c2 = 4/(4+1+0) = .8
    assert macro_f1(predictions, labels, 3) == pytest.approx((0.5 + 2 / 3 + 0.8) / 3)
    refs = ["deux cent trente et un euros", "mille neuf cent quatre-vingt-dix-neuf"]
    perfect = translation_metrics(refs, [refs[0] + " ", refs[1]])
    assert perfect == {"exact_match": 1.0, "chrf": pytest.approx(100.0),
                       "bleu": pytest.approx(100.0)}
    half = translation_metrics(["deux cent", "mille un"], ["deux cent", "mille"])
    assert half["exact_match"] == 0.5 and 0 < half["chrf"] < 100
