"""Per-surface-form test scores: the grouping, the table, and what training and the commands
report (test_metrics.json, `seqserve train`, `seqserve demo`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from seqserve.cli import main
from seqserve.cli.demo import _format_metrics, _print_forms
from seqserve.models.data.surface import FORMS, SMALL
from seqserve.models.diagnostics.forms import (
    SEARCH_NAME,
    format_table,
    tagging_forms,
    translation_forms,
    worst,
)
from seqserve.models.text.normalization import PUNCT_AS_SPACE
from seqserve.models.train.run import run_training

torch.set_num_threads(1)

TINY = {"vocab_size": 200, "embed_size": 16, "hidden_size": 16, "num_layers": 1,
        "dropout": 0.0, "max_length": 32}
ONE_EPOCH = {"epochs": 1, "batch_size": 32, "lr": 1e-2, "num_threads": 1, "warmup_steps": 5,
             "patience": 0}


def test_translation_scores_each_form_alone() -> None:
    forms = ["a", "a", "b", "", "b"]
    hyps = ["vingt", "trente", "cent", "x", "mille"]
    refs = ["vingt", "vingt", "cent", "y", "mille"]
    out = translation_forms(forms, hyps, refs)
    assert list(out) == ["a", "b"]  # rows without a form are left out
    assert out["a"]["examples"] == 2 and out["a"]["exact_match"] == 0.5
    assert out["b"] == {"examples": 2, "exact_match": 1.0, "chrf": pytest.approx(100.0)}
    assert 0 < out["a"]["chrf"] < 100
    assert worst(out, "exact_match") == ("a", 0.5)


def test_tagging_scores_words_per_form() -> None:
    out = tagging_forms(["x", "y", "x"], [(3, 4), (2, 2), (5, 6)])
    assert out["x"] == {"examples": 2, "words": 10, "token_accuracy": 0.8}
    assert out["y"]["token_accuracy"] == 1.0
    lines = format_table(out)
    assert lines[0].split() == ["form", "rows", "token_accuracy"]
    assert lines[1].split() == ["x", "2", "80.00%"]
    assert format_table({}) == []


def test_translator_run_reports_every_form_with_the_server_search(tmp_path: Path) -> None:
    metrics = run_training("translator", "numbers-en-fr", tmp_path, TINY,
                           {**ONE_EPOCH, "tokenizer_type": "word"}, progress=False,
                           data_size=240)
    assert metrics["search"] == SEARCH_NAME
    assert set(metrics["forms"]) == {*FORMS, SMALL}
    for scores in metrics["forms"].values():
        assert scores["examples"] >= 1 and 0 <= scores["exact_match"] <= 1
        assert 0 <= scores["chrf"] <= 100
    assert sum(s["examples"] for s in metrics["forms"].values()) == metrics["examples"]
    assert json.loads((tmp_path / "test_metrics.json").read_text()) == metrics
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["tokenizer"]["normalization"] == PUNCT_AS_SPACE  # the dataset's choice


def test_train_command_prints_the_tagger_form_table(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["train", "tagger", "--data", "numbers-tags", "--size", "240", "--out",
                 str(tmp_path / "run"), "--epochs", "1", "--hidden", "8", "--embed", "8",
                 "--vocab-size", "120", "--threads", "1", "--quiet",
                 "--tokenizer-normalization", "nmt_nfkc_cf"])
    assert code == 0
    out = capsys.readouterr()
    printed = json.loads(out.out)  # stdout stays one JSON document
    assert set(printed["test"]["forms"]) == {*FORMS, SMALL}
    assert "per surface form" in out.err and "token_accuracy" in out.err
    for form in FORMS:
        assert f"\n{form} " in out.err
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["tokenizer"]["normalization"] == "nmt_nfkc_cf"  # the option wins


def test_demo_prints_forms_as_a_table_not_inline(capsys: pytest.CaptureFixture[str]) -> None:
    metrics = {"exact_match": 0.99, "search": SEARCH_NAME, "f1/unit": 1.0,
               "forms": {"plain": {"examples": 3, "exact_match": 1.0, "chrf": 100.0}}}
    line = _format_metrics(metrics)
    assert "forms" not in line and "f1/" not in line and "exact_match=0.9900" in line
    _print_forms("numbers-en-fr", metrics)
    printed = capsys.readouterr().out
    assert "per surface form" in printed and SEARCH_NAME in printed
    assert "plain" in printed and "100.00%" in printed
    _print_forms("langid", {"accuracy": 1.0})
    assert capsys.readouterr().out == ""
