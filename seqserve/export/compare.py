"""Numpy helpers for parity checks: test batches, row slicing by symbolic axis, diffs.

Torch-free. Axis names come from the graph specs: "batch"/"rows" index requests or
hypotheses, "seq"/"src_len" are padded time axes.
"""

from __future__ import annotations

import numpy as np

from seqserve.export.contract import TensorSpec

ROW_AXES = ("batch", "rows")
TIME_AXES = ("seq", "src_len", "time")
FIRST_TOKEN = 4  # ids below are specials (pad, unk, bos, eos)


def grid_lengths(lengths: tuple[int, ...], max_length: int) -> list[int]:
    """The grid's lengths that fit the model, plus the configured maximum, sorted."""
    return sorted({n for n in lengths if 1 <= n <= max_length} | {max_length})


def padded_batch(rng: np.random.Generator, batch: int, longest: int, vocab_size: int,
                 pad_id: int = 0, first_id: int = FIRST_TOKEN) -> tuple[np.ndarray, np.ndarray]:
    """A right-padded batch of random token ids with mixed lengths, the longest = `longest`.

    Outputs: ids (B, T) int64, lengths (B,) int64 (one row of length T, the rest random).
    """
    lengths = np.concatenate([[longest], rng.integers(1, longest + 1, size=batch - 1)])
    lengths = rng.permutation(lengths).astype(np.int64)  # (B,)
    ids = rng.integers(first_id, vocab_size, size=(batch, longest), dtype=np.int64)  # (B, T)
    ids[np.arange(longest)[None, :] >= lengths[:, None]] = pad_id
    return ids, lengths


def max_abs(a: np.ndarray, b: np.ndarray) -> float:
    """Largest absolute difference (bool and int arrays compared as float64)."""
    if a.shape != b.shape:
        return float("inf")
    if a.size == 0:
        return 0.0
    return float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64))))


def max_scaled(a: np.ndarray, b: np.ndarray) -> float:
    """Largest |a - b| / max(1, |b|): an absolute difference for values up to 1 in magnitude
    (probabilities, attention, logits near zero), a relative one above (the log-probability
    of an unlikely token, around -20, moves by more than 1e-5 when fp32 GEMMs are blocked
    differently for another batch size, while its rank does not)."""
    if a.shape != b.shape:
        return float("inf")
    if a.size == 0:
        return 0.0
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    return float(np.max(np.abs(a64 - b64) / np.maximum(1.0, np.abs(b64))))


def row_view(spec: TensorSpec, value: np.ndarray, row: int, length: int | None
             ) -> tuple[np.ndarray, np.ndarray]:
    """One row of a batched output, split into its valid part and its padded tail.

    The row axis (batch/rows) is indexed with `row` kept as a size-1 axis; a time axis
    (seq/src_len) is cut at `length` (the padded tail is returned separately, empty when
    there is none or `length` is None).
    """
    valid: np.ndarray = value
    tail = np.zeros((0,), dtype=value.dtype)
    for axis, dim in enumerate(spec.shape):
        if dim in ROW_AXES:
            valid = np.take(valid, [row], axis=axis)
        elif dim in TIME_AXES and length is not None:
            tail = np.take(valid, np.arange(length, valid.shape[axis]), axis=axis)
            valid = np.take(valid, np.arange(length), axis=axis)
    return valid, tail


def topk_id_mismatches(ref_ids: np.ndarray, ref_lp: np.ndarray, ids: np.ndarray,
                       lp: np.ndarray, tol: float) -> tuple[int, int]:
    """(real mismatches, tie swaps) between two top-k results of shape (R, k).

    A differing id is a tie swap (not an error) when both sides' log-probs at that position
    agree within `tol` and the reference has a near-equal neighbour there (or it is the last
    column, whose neighbour beyond k is not visible).
    """
    if ref_ids.shape != ids.shape:
        return max(ref_ids.size, ids.size), 0
    bad = ties = 0
    k = ref_ids.shape[1]
    for r, j in zip(*np.nonzero(ref_ids != ids), strict=True):
        same_value = abs(float(ref_lp[r, j]) - float(lp[r, j])) <= tol
        neighbours = [ref_lp[r, i] for i in (j - 1, j + 1) if 0 <= i < k]
        near_tie = j == k - 1 or any(abs(float(v - ref_lp[r, j])) <= 2 * tol for v in neighbours)
        if same_value and near_tie:
            ties += 1
        else:
            bad += 1
    return bad, ties
