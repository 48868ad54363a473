"""The opt-in training hook: `gradient_flow_every` N writes one measurement every N steps."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from seqserve.models.train.run import run_training

torch.set_num_threads(1)

SMALL = {"vocab_size": 200, "embed_size": 16, "hidden_size": 16, "num_layers": 1,
         "max_length": 40}


def _train(out: Path, every: int, **model: object) -> dict[str, object]:
    return run_training("tagger", "numbers-tags", out, {**SMALL, **model},
                        {"epochs": 1, "batch_size": 20, "num_threads": 1,
                         "gradient_flow_every": every}, progress=False, data_size=400)


def test_measurements_every_n_steps(tmp_path: Path) -> None:
    _train(tmp_path / "run", 7)
    lines = (tmp_path / "run" / "gradient_flow.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert [r["step"] for r in records] == [7, 14]  # 400 examples / 20 = 20 steps
    for r in records:
        assert r["cell"] == "lstm" and len(r["norms"]) == r["length"] == 50
        assert r["norms"][0] > 0 and all(n >= 0 for n in r["norms"])


def test_off_by_default_and_skipped_for_variant_layers(tmp_path: Path) -> None:
    _train(tmp_path / "off", 0)
    assert not (tmp_path / "off" / "gradient_flow.jsonl").exists()
    _train(tmp_path / "variant", 5, peephole=True)
    assert not (tmp_path / "variant" / "gradient_flow.jsonl").exists()
    assert (tmp_path / "variant" / "DONE").is_file()
