"""A tagger's CRF (conditional random field) layer, torch-free: its scores as a bundle keeps
them, and batched Viterbi decoding and per-position marginals over a batch of emission
scores, in numpy.

A CRF tagger scores a whole labelling: the emission score of each position's label, plus
`transitions[a, b]` for every label `a` followed by label `b`, plus `start[first]` and
`end[last]`. Decoding finds the labelling with the highest score (Viterbi); a label's
marginal is its probability at that position summed over every labelling
(forward-backward). Both run over a padded batch, vectorised over the rows and the labels,
a loop over time only; a row's positions past its length change nothing (its score and
back-pointers are carried through unchanged), so a row decodes the same alone or in any
batch.

The bundle file (`crf.npy`, named by the manifest's `crf` field) is one float32 array of
C + 2 rows by C columns, C the number of labels: rows 0..C-1 the transition scores (row:
the label before, column: the label after), row C the start scores, row C+1 the end scores.
A bundle is untrusted: the array's header is checked against the labels before anything
else is read, and every score must be finite.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from seqserve.models.errors import BundleError

CRF_FILE = "crf.npy"
"""The CRF's file name inside a bundle."""


@dataclass(frozen=True)
class CRF:
    """A CRF's scores over C labels."""

    transitions: np.ndarray
    """float32 (C, C): score of label `a` (row) followed by label `b` (column)."""
    start: np.ndarray
    """float32 (C,): score of a labelling that starts with each label."""
    end: np.ndarray
    """float32 (C,): score of a labelling that ends with each label."""

    @classmethod
    def from_arrays(cls, transitions: np.ndarray, start: np.ndarray, end: np.ndarray) -> CRF:
        """Checked float32 copies: a square transition matrix, start and end one score per
        label, all finite (ValueError naming the flaw)."""
        t, s, e = (np.ascontiguousarray(x, dtype=np.float32)
                   for x in (transitions, start, end))
        if t.ndim != 2 or t.shape[0] != t.shape[1] or t.shape[0] < 1:
            raise ValueError(f"transitions must be a square (labels, labels) matrix, got "
                             f"shape {t.shape}")
        c = t.shape[0]
        if s.shape != (c,) or e.shape != (c,):
            raise ValueError(f"start and end must hold one score per label ({c}), got shapes "
                             f"{s.shape} and {e.shape}")
        if not (np.isfinite(t).all() and np.isfinite(s).all() and np.isfinite(e).all()):
            raise ValueError("the CRF's scores must all be finite numbers")
        return cls(t, s, e)

    @property
    def labels(self) -> int:
        return int(self.transitions.shape[0])

    def to_array(self) -> np.ndarray:
        """The bundle file's array: float32 (C + 2, C) (module doc)."""
        return np.ascontiguousarray(np.concatenate([self.transitions, self.start[None],
                                                    self.end[None]]))


def save_crf(path: str | os.PathLike[str], crf: CRF) -> None:
    """Write `crf` as a bundle's `crf.npy` (module doc)."""
    with open(path, "wb") as f:
        np.save(f, crf.to_array(), allow_pickle=False)


def load_crf(path: str | os.PathLike[str], labels: int) -> CRF:
    """Read a bundle's CRF file for a tagger of `labels` labels: float32 (labels + 2,
    labels) by its header (checked before the data is read), finite scores; BundleError
    naming the flaw."""
    file = Path(path)
    try:
        with file.open("rb") as f:
            version = np.lib.format.read_magic(f)
            if version not in ((1, 0), (2, 0), (3, 0)):
                raise BundleError(f"{file}: npy format version {version} is not read")
            header = (np.lib.format.read_array_header_1_0(f) if version == (1, 0) else
                      np.lib.format.read_array_header_2_0(f))
            shape, fortran, dtype = header
            if dtype != np.dtype("<f4") or shape != (labels + 2, labels) or fortran:
                raise BundleError(
                    f"{file}: a CRF over {labels} labels is a little-endian float32 array of "
                    f"shape ({labels + 2}, {labels}) (transitions, start, end), got {dtype} "
                    f"{shape}{' in Fortran order' if fortran else ''}")
            data = np.fromfile(f, dtype="<f4", count=(labels + 2) * labels)
    except (OSError, ValueError) as exc:
        raise BundleError(f"{file}: not a readable .npy array ({exc})") from exc
    if data.size != (labels + 2) * labels:
        raise BundleError(f"{file}: the file ends before its ({labels + 2}, {labels}) scores")
    array = data.reshape(labels + 2, labels)
    try:
        return CRF.from_arrays(array[:labels], array[labels], array[labels + 1])
    except ValueError as exc:
        raise BundleError(f"{file}: {exc}") from exc


def viterbi(emissions: np.ndarray, lengths: np.ndarray, crf: CRF
            ) -> tuple[np.ndarray, np.ndarray]:
    """The best labelling of each row of a padded batch and its score (module doc).

    `emissions` (B, T, C) scores per position and label, `lengths` (B,) each row's positions
    (>= 1); returns labels int64 (B, T) (past a row's length: its last label repeated) and
    scores float32 (B,). Ties go to the lowest label."""
    batch, steps, c = emissions.shape
    em = emissions.astype(np.float32, copy=False)
    rows = np.arange(batch)
    keep = np.broadcast_to(np.arange(c), (batch, c))  # a padded step's back-pointers
    score = crf.start + em[:, 0]  # (B, C)
    back = np.empty((max(steps - 1, 0), batch, c), np.int64)  # best previous label per step
    for t in range(1, steps):
        cand = score[:, :, None] + crf.transitions  # (B, C before, C after)
        best = cand.argmax(1)  # (B, C)
        nxt = np.take_along_axis(cand, best[:, None, :], 1)[:, 0] + em[:, t]  # (B, C)
        live = (t < lengths)[:, None]  # (B, 1)
        score = np.where(live, nxt, score)
        back[t - 1] = np.where(live, best, keep)
    score = score + crf.end
    last = score.argmax(-1)  # (B,)
    path = np.empty((batch, steps), np.int64)
    path[:, steps - 1] = last
    for t in range(steps - 1, 0, -1):
        last = back[t - 1][rows, last]
        path[:, t - 1] = last
    return path, score[rows, path[:, steps - 1]].astype(np.float32)


def _logsumexp(x: np.ndarray, axis: int) -> np.ndarray:
    top = x.max(axis=axis, keepdims=True)
    return np.squeeze(top, axis) + np.log(np.exp(x - top).sum(axis=axis))


def marginals(emissions: np.ndarray, lengths: np.ndarray, crf: CRF) -> np.ndarray:
    """Each label's probability at each position, over every labelling the CRF scores
    (forward-backward in log space): float32 (B, T, C) from emissions (B, T, C) and lengths
    (B,); past a row's length the values mean nothing."""
    batch, steps, c = emissions.shape
    em = emissions.astype(np.float64)
    trans = crf.transitions.astype(np.float64)[None]  # (1, C before, C after)
    alpha = np.empty((steps, batch, c))
    alpha[0] = crf.start + em[:, 0]
    for t in range(1, steps):
        nxt = _logsumexp(alpha[t - 1][:, :, None] + trans, 1) + em[:, t]
        alpha[t] = np.where((t < lengths)[:, None], nxt, alpha[t - 1])
    end = np.broadcast_to(crf.end.astype(np.float64), (batch, c))
    beta = np.empty((steps, batch, c))
    beta[steps - 1] = end
    for t in range(steps - 2, -1, -1):
        nxt = _logsumexp(trans + (em[:, t + 1] + beta[t + 1])[:, None, :], 2)
        beta[t] = np.where((t + 1 < lengths)[:, None], nxt, end)
    total = _logsumexp(alpha[steps - 1] + end, 1)  # (B,): log of the sum over labellings
    out = np.exp(alpha + beta - total[None, :, None])  # (T, B, C)
    return out.transpose(1, 0, 2).astype(np.float32)
