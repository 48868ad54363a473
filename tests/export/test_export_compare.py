"""seqserve.export.compare: the numpy helpers behind the parity report."""

from __future__ import annotations

import numpy as np

from seqserve.export.compare import (
    grid_lengths,
    max_abs,
    padded_batch,
    row_view,
    topk_id_mismatches,
)
from seqserve.export.contract import TensorSpec


def test_padded_batch() -> None:
    rng = np.random.default_rng(0)
    ids, lengths = padded_batch(rng, 16, 64, 50)
    assert ids.shape == (16, 64) and lengths.max() == 64 and lengths.min() >= 1
    for row, n in zip(ids, lengths, strict=True):
        assert np.all(row[n:] == 0) and np.all(row[:n] >= 4) and np.all(row[:n] < 50)
    assert grid_lengths((1, 7, 64), 40) == [1, 7, 40]
    assert grid_lengths((1, 7, 64), 256) == [1, 7, 64, 256]


def test_row_view_splits_padding() -> None:
    spec = TensorSpec("memory", "float32", ("batch", "src_len", "mem_dim"))
    value = np.arange(2 * 5 * 3, dtype=np.float32).reshape(2, 5, 3)
    valid, tail = row_view(spec, value, 1, 2)
    assert np.array_equal(valid, value[1:2, :2]) and np.array_equal(tail, value[1:2, 2:])
    valid, tail = row_view(TensorSpec("state", "float32", ("rows", "state_dim")),
                           value[:, 0], 0, 2)
    assert np.array_equal(valid, value[0:1, 0]) and tail.size == 0


def test_topk_id_mismatches() -> None:
    lp = np.array([[-0.1, -1.0, -1.00000001, -3.0]], dtype=np.float32)
    ids = np.array([[7, 8, 9, 10]])
    assert topk_id_mismatches(ids, lp, ids, lp, 1e-4) == (0, 0)
    swapped = np.array([[7, 9, 8, 10]])  # a near-tie at positions 1 and 2
    assert topk_id_mismatches(ids, lp, swapped, lp, 1e-4) == (0, 2)
    wrong = np.array([[8, 7, 9, 10]])  # ranks 0 and 1 are 0.9 apart: a real error
    wrong_lp = lp[:, [1, 0, 2, 3]]
    assert topk_id_mismatches(ids, lp, wrong, wrong_lp, 1e-4) == (2, 0)
    last = np.array([[7, 8, 9, 11]])  # last column: the reference's k+1-th is not visible
    assert topk_id_mismatches(ids, lp, last, lp, 1e-4) == (0, 1)
    last_lp = lp.copy()
    last_lp[0, 3] -= 0.5  # ... but a different value there is an error
    assert topk_id_mismatches(ids, lp, last, last_lp, 1e-4) == (1, 0)
    assert max_abs(lp, lp[:, :2]) == float("inf")
