"""The array helpers of the vectorised search against plain Python."""

from __future__ import annotations

import numpy as np
import pytest

from seqserve.service.scheduling.arrays import (
    banned_mask,
    distinct_count,
    fit,
    ngram_bans,
    segment_max,
    top_k_rows,
)


@pytest.mark.parametrize("seed", range(6))
def test_top_k_rows_is_a_stable_argsort_prefix(seed: int) -> None:
    rng = np.random.default_rng(seed)
    rows, cols, k = int(rng.integers(1, 40)), int(rng.integers(2, 60)), 0
    k = int(rng.integers(1, cols + 1))
    neg = np.round(rng.normal(size=(rows, cols)), 1)  # rounded: many ties
    neg[rng.random((rows, cols)) < 0.3] = np.inf  # masked candidates
    expected = np.argsort(neg, axis=1, kind="stable")[:, :k]
    got = top_k_rows(neg, k)
    finite = np.isfinite(np.take_along_axis(neg, expected, 1))
    # +inf entries are never chosen candidates: only their count must match
    assert (got[finite] == expected[finite]).all()
    assert (np.isfinite(np.take_along_axis(neg, got, 1)) == finite).all()


def test_segment_max() -> None:
    values = np.array([1.0, 5.0, -2.0, 3.0, 0.5])
    segment = np.array([0, 0, 2, 2, 3])
    np.testing.assert_array_equal(segment_max(values, segment, 5),
                                  [5.0, -np.inf, 3.0, 0.5, -np.inf])
    np.testing.assert_array_equal(segment_max(values[:0], segment[:0], 2), [-np.inf, -np.inf])


def _banned_brute(tokens: tuple[int, ...], n: int) -> set[int]:
    """Tokens t such that tokens + (t,) repeats an n-gram."""
    out = set()
    for t in set(tokens) | {99}:
        grams = [(*tokens, t)[i : i + n] for i in range(len(tokens) + 2 - n)]
        if len(grams) != len(set(grams)) and grams and grams[-1] in grams[:-1]:
            out.add(t)
    return out


def test_ngram_bans_match_brute_force() -> None:
    rng = np.random.default_rng(0)
    for n in (1, 2, 3, 4):
        width = 12
        lengths = rng.integers(0, width + 1, size=200)  # (R,)
        tokens = rng.integers(4, 8, size=(200, width)).astype(np.int32)  # (R, W)
        banned, ok = ngram_bans(tokens, lengths, n)
        counts = distinct_count(banned, ok)
        ids = np.tile(np.arange(10), (200, 1))  # (R, 10) every candidate id
        mask = banned_mask(ids, banned, ok)
        for r in range(200):
            history = tuple(tokens[r, : lengths[r]].tolist())
            expected = _banned_brute(history, n)
            assert set(banned[r][ok[r]].tolist()) == expected
            assert counts[r] == len(expected)
            assert set(np.flatnonzero(mask[r]).tolist()) == expected


def test_fit_cuts_and_pads_trailing_axes() -> None:
    a = np.arange(12).reshape(2, 2, 3)
    out = fit(a, 3, 2)
    assert out.shape == (2, 3, 2)
    np.testing.assert_array_equal(out[:, :2, :2], a[:, :, :2])
    assert not out[:, 2].any()
    assert fit(a, 2, 3) is a
