"""Greedy decoding through the exported encoder + decoder_step graphs (a numpy host loop, as
the server runs it) equals the eager reference `seqserve.models.nn.decoding.greedy_decode` token for
token, for every cell type, through ONNX Runtime and TorchScript."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
import torch

from seqserve.export.bundle import export_run
from seqserve.models.checkpoint import load_run
from seqserve.models.nn.decoding import greedy_decode, max_decode_length

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch.jit.load

SENTENCES = ["one two three", "vingt et un", "forty", "cinq cent mille et huit neuf dix",
             "twelve thousand and eleven hundred"]
Graph = Callable[[dict[str, np.ndarray]], list[np.ndarray]]


def _onnx(path: Path) -> Graph:
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return lambda feed: list(sess.run(None, feed))


def _torchscript(path: Path) -> Graph:
    module = torch.jit.load(str(path))

    def run(feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        with torch.no_grad():
            return [o.numpy() for o in module(*(torch.from_numpy(v) for v in feed.values()))]

    return run


def _greedy(encoder: Graph, step: Graph, ids: np.ndarray, lens: np.ndarray, bos: int, eos: int,
            cap: int) -> list[list[int]]:
    """Host-side greedy loop over the two graphs; only k=1 ids leave the graph per step. An
    encoder that returns projected attention keys (schema 3) hands them to every step."""
    memory, src_mask, state, *keys = encoder({"src_ids": ids, "src_lengths": lens})
    rows = ids.shape[0]
    limits = [max_decode_length(int(n), cap) for n in lens]
    prev = np.full(rows, bos, dtype=np.int64)
    out: list[list[int]] = [[] for _ in range(rows)]
    done = [False] * rows
    for t in range(max(limits)):
        state, _, top_ids, _ = step({
            "prev_ids": prev, "state": state, "memory": memory, "src_mask": src_mask,
            "memory_index": np.arange(rows, dtype=np.int64), "k": np.array([1], np.int64),
            **({"keys": keys[0]} if keys else {})})
        prev = top_ids[:, 0]
        for r, tok in enumerate(prev.tolist()):
            if not done[r]:
                done[r] = tok == eos or t + 1 >= limits[r]
                if tok != eos:
                    out[r].append(tok)
        if all(done):
            break
    return out


@pytest.fixture(scope="module", params=["gru", "lstm", "rnn"])
def translator_bundle(request: pytest.FixtureRequest, make_run: Callable[..., Path],
                      tiny_repo: Path, tiny_translator_run: Path,
                      tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    if request.param == "gru":  # the shared fixture's model
        return tiny_translator_run, tiny_repo / "tiny-mt" / "1"
    run = make_run("translator", seed=3, cell=request.param, num_layers=2)
    return run, export_run(run, tmp_path_factory.mktemp("repo"), "mt", progress=False)


@pytest.mark.parametrize("fmt", ["onnx", "torchscript"])
def test_greedy_matches_eager(translator_bundle: tuple[Path, Path], fmt: str) -> None:
    run, bundle = translator_bundle
    model: Any
    model, config, tok = load_run(run)
    rows = [tok.encode(s) for s in SENTENCES]
    lens = np.array([len(r) for r in rows], dtype=np.int64)
    ids = np.zeros((len(rows), int(lens.max())), dtype=np.int64)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = r
    expected = greedy_decode(model, torch.from_numpy(ids), torch.from_numpy(lens))
    load = _onnx if fmt == "onnx" else _torchscript
    suffix = ".onnx" if fmt == "onnx" else ".pt"
    got = _greedy(load(bundle / f"encoder{suffix}"), load(bundle / f"decoder_step{suffix}"),
                  ids, lens, tok.bos_id, tok.eos_id, int(config["model"]["max_length"]))
    assert got == expected
    assert len({tuple(g) for g in got}) > 1  # the outputs depend on the source
