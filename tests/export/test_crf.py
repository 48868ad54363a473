"""The CRF's batched Viterbi and marginals (export/crf.py) against brute force: every
labelling of every row enumerated and scored one by one, with random transitions, start and
end scores, over padded batches of rows of different lengths; and the bundle file's checks."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

from seqserve.export.crf import CRF, load_crf, marginals, save_crf, viterbi
from seqserve.models.errors import BundleError


def _random_crf(rng: np.random.Generator, labels: int) -> CRF:
    return CRF.from_arrays(rng.normal(0, 2, (labels, labels)), rng.normal(0, 2, labels),
                           rng.normal(0, 2, labels))


def _path_score(em: np.ndarray, path: tuple[int, ...], crf: CRF) -> float:
    """One labelling's score, summed position by position."""
    score = float(crf.start[path[0]]) + float(em[0, path[0]])
    for t in range(1, len(path)):
        score += float(crf.transitions[path[t - 1], path[t]]) + float(em[t, path[t]])
    return score + float(crf.end[path[-1]])


def _every_path(em: np.ndarray, crf: CRF) -> list[tuple[float, tuple[int, ...]]]:
    n, c = em.shape
    return [(_path_score(em, p, crf), p) for p in itertools.product(range(c), repeat=n)]


@pytest.mark.parametrize("seed", range(6))
def test_viterbi_is_the_best_labelling_of_each_row(seed: int) -> None:
    rng = np.random.default_rng(seed)
    labels = int(rng.integers(2, 5))
    crf = _random_crf(rng, labels)
    lengths = np.array([5, 1, 3, 5, 2])
    emissions = rng.normal(0, 2, (len(lengths), 5, labels)).astype(np.float32)
    emissions[1, 1:] = 1e6  # padding must change nothing, whatever it holds
    path, score = viterbi(emissions, lengths, crf)
    assert path.shape == (5, 5) and score.shape == (5,)
    for i, n in enumerate(lengths):
        best_score, best = max(_every_path(emissions[i, :n], crf))
        assert tuple(path[i, :n]) == best
        assert score[i] == pytest.approx(best_score, rel=1e-5, abs=1e-4)
        alone, alone_score = viterbi(emissions[i : i + 1, :n], lengths[i : i + 1], crf)
        assert (alone[0] == path[i, :n]).all() and alone_score[0] == score[i]


@pytest.mark.parametrize("seed", range(4))
def test_marginals_sum_every_labelling(seed: int) -> None:
    rng = np.random.default_rng(100 + seed)
    labels = 3
    crf = _random_crf(rng, labels)
    lengths = np.array([4, 2, 1])
    emissions = rng.normal(0, 1, (3, 4, labels)).astype(np.float32)
    got = marginals(emissions, lengths, crf)
    for i, n in enumerate(lengths):
        paths = _every_path(emissions[i, :n], crf)
        weights = np.exp(np.array([s for s, _ in paths]) - max(s for s, _ in paths))
        want = np.zeros((n, labels))
        for w, (_, p) in zip(weights, paths, strict=True):
            want[np.arange(n), p] += w
        want /= weights.sum()
        np.testing.assert_allclose(got[i, :n], want, rtol=1e-5, atol=1e-6)
        alone = marginals(emissions[i : i + 1, :n], lengths[i : i + 1], crf)
        np.testing.assert_allclose(alone[0], got[i, :n], rtol=1e-6, atol=1e-7)


def test_a_longer_batch_is_decoded_as_rows_alone() -> None:
    rng = np.random.default_rng(7)
    crf = _random_crf(rng, 6)
    lengths = rng.integers(1, 40, 16)
    emissions = rng.normal(0, 3, (16, 40, 6)).astype(np.float32)
    path, score = viterbi(emissions, lengths, crf)
    for i, n in enumerate(lengths):
        alone, alone_score = viterbi(emissions[i : i + 1, :n], lengths[i : i + 1], crf)
        assert (alone[0] == path[i, :n]).all() and alone_score[0] == score[i]


def test_the_bundle_file_round_trips_and_refuses_what_does_not_fit(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    crf = _random_crf(rng, 4)
    save_crf(tmp_path / "crf.npy", crf)
    back = load_crf(tmp_path / "crf.npy", 4)
    for a, b in ((back.transitions, crf.transitions), (back.start, crf.start),
                 (back.end, crf.end)):
        assert (a == b).all()
    with pytest.raises(BundleError, match=r"float32 array of shape \(5, 3\)"):
        load_crf(tmp_path / "crf.npy", 3)
    np.save(tmp_path / "wide.npy", np.zeros((6, 4), np.float64))
    with pytest.raises(BundleError, match="float64"):
        load_crf(tmp_path / "wide.npy", 4)
    bad = crf.to_array()
    bad[1, 2] = np.nan
    np.save(tmp_path / "nan.npy", bad)
    with pytest.raises(BundleError, match="finite"):
        load_crf(tmp_path / "nan.npy", 4)
    (tmp_path / "cut.npy").write_bytes((tmp_path / "crf.npy").read_bytes()[:-8])
    with pytest.raises(BundleError, match="ends before"):
        load_crf(tmp_path / "cut.npy", 4)
    (tmp_path / "text.npy").write_text("not an array")
    with pytest.raises(BundleError, match="not a readable"):
        load_crf(tmp_path / "text.npy", 4)
    with pytest.raises(ValueError, match="square"):
        CRF.from_arrays(np.zeros((2, 3)), np.zeros(2), np.zeros(2))
