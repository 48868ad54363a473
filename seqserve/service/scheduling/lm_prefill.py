"""A language model's prefill batch, rows that start from a state included: the rows of a
cached prefix (the remainder after it), of a client's state token (the pending token and the
new prompt after it), and rows whose states at some prefix lengths are wanted (to cache them,
or the state before a scored text's last token).

`run_prefill` runs every row over its tokens and returns, per row, the state after all of them,
the log-probs at every position and the states at the asked cut points:

- a bundle whose prefill takes `initial_state` (schema 3): the batch runs in segments between
  cut points, each segment one prefill call from the states the last one left (zeros at first);
  a row's cut points only split its own tokens, which the cell equations read one at a time,
  so a split row computes exactly what an unsplit one does (tested bit for bit);
- an older bundle: rows that start from zeros and want no cut run as one prefill; the others
  are fed through `lm_step` one token per call (the same cell equations, batched across those
  rows).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from seqserve.service.runtimes.base import Runtime
from seqserve.service.scheduling.base import pad_rows
from seqserve.service.scheduling.generation import GenerateOptions
from seqserve.service.scheduling.prefix_cache import PrefixCache


@dataclass
class PrefillRow:
    """One row to prefill."""

    tokens: list[int]
    """What to feed (at least one token)."""
    start: np.ndarray | None = None
    """The flat state (S,) to start from; None: zeros (a row that begins with bos)."""
    cuts: list[int] = field(default_factory=list)
    """Ascending prefix lengths (0 < c < len(tokens)) after which the state is wanted."""


@dataclass
class PrefillOut:
    state: np.ndarray
    """(B, S) after each row's last token."""
    log_probs: np.ndarray
    """(B, T, V): at each row's positions, the next token's; zero past its length."""
    lengths: np.ndarray
    """(B,) int64: each row's token count."""
    cut_states: list[list[np.ndarray]]
    """Per row, the state (S,) after each of its cuts."""


def run_prefill(runtime: Runtime, rows: Sequence[PrefillRow], pad_id: int,
                takes_state: bool, state_dim: int | None) -> PrefillOut:
    """See module doc. `state_dim`: the flat state's width (needed for the zeros of rows
    without a start when the graph takes initial_state)."""
    plain = all(r.start is None and not r.cuts for r in rows)
    if plain and not takes_state:
        ids, lengths = pad_rows([r.tokens for r in rows], pad_id)
        out = runtime.run("prefill", {"input_ids": ids, "lengths": lengths})
        return PrefillOut(out["state"], out["log_probs"], lengths, [[] for _ in rows])
    if takes_state:
        if state_dim is None:
            raise ValueError("the prefill takes initial_state but the bundle names no "
                             "state_dim")
        return _segments(runtime, rows, pad_id, state_dim)
    return _mixed(runtime, rows, pad_id)


def _segments(runtime: Runtime, rows: Sequence[PrefillRow], pad_id: int,
              state_dim: int) -> PrefillOut:
    n = len(rows)
    lengths = np.array([len(r.tokens) for r in rows], dtype=np.int64)
    states = np.zeros((n, state_dim), dtype=np.float32)
    for i, r in enumerate(rows):
        if r.start is not None:
            states[i] = r.start
    bounds = [[*r.cuts, len(r.tokens)] for r in rows]
    at = [0] * n
    log_probs: np.ndarray | None = None
    cut_states: list[list[np.ndarray]] = [[] for _ in rows]
    for j in range(max(len(b) for b in bounds)):
        active = [i for i in range(n) if j < len(bounds[i])]
        pieces = [rows[i].tokens[at[i] : bounds[i][j]] for i in active]
        ids, seg = pad_rows(pieces, pad_id)
        pick = np.array(active, dtype=np.int64)
        out = runtime.run("prefill", {"input_ids": ids, "lengths": seg,
                                      "initial_state": states[pick]})
        if log_probs is None:
            vocab = out["log_probs"].shape[-1]
            log_probs = np.zeros((n, int(lengths.max()), vocab), dtype=np.float32)
        for a, i in enumerate(active):
            end = bounds[i][j]
            log_probs[i, at[i] : end] = out["log_probs"][a, : end - at[i]]
            states[i] = out["state"][a]
            if j < len(bounds[i]) - 1:
                cut_states[i].append(states[i].copy())
            at[i] = end
    assert log_probs is not None
    return PrefillOut(states, log_probs, lengths, cut_states)


def _mixed(runtime: Runtime, rows: Sequence[PrefillRow], pad_id: int) -> PrefillOut:
    """An older bundle: plain rows in one prefill, the others through lm_step."""
    n = len(rows)
    lengths = np.array([len(r.tokens) for r in rows], dtype=np.int64)
    plain = [i for i, r in enumerate(rows) if r.start is None and not r.cuts]
    stepped = [i for i in range(n) if i not in set(plain)]
    states: np.ndarray | None = None
    log_probs: np.ndarray | None = None
    cut_states: list[list[np.ndarray]] = [[] for _ in rows]

    def place(i: int, state: np.ndarray, lps: np.ndarray, upto: int) -> None:
        nonlocal states, log_probs
        if states is None or log_probs is None:
            states = np.zeros((n, state.shape[-1]), dtype=np.float32)
            log_probs = np.zeros((n, int(lengths.max()), lps.shape[-1]), dtype=np.float32)
        states[i] = state
        log_probs[i, :upto] = lps[:upto]

    if plain:
        ids, lens = pad_rows([rows[i].tokens for i in plain], pad_id)
        out = runtime.run("prefill", {"input_ids": ids, "lengths": lens})
        for a, i in enumerate(plain):
            place(i, out["state"][a], out["log_probs"][a], int(lens[a]))
    if stepped:
        first = next((rows[i].start for i in stepped if rows[i].start is not None), None)
        width = first.shape[-1] if first is not None else _probe_width(runtime, pad_id)
        cur = np.zeros((len(stepped), width), dtype=np.float32)
        for a, i in enumerate(stepped):
            if rows[i].start is not None:
                cur[a] = rows[i].start
        longest = max(len(rows[i].tokens) for i in stepped)
        lps_all = None
        for t in range(longest):
            live = [a for a, i in enumerate(stepped) if t < len(rows[i].tokens)]
            pick = np.array(live, dtype=np.int64)
            prev = np.array([rows[stepped[a]].tokens[t] for a in live], dtype=np.int64)
            out = runtime.run("lm_step", {"prev_ids": prev, "state": cur[pick]})
            if lps_all is None:
                lps_all = np.zeros((len(stepped), longest, out["log_probs"].shape[-1]),
                                   dtype=np.float32)
            cur[pick] = out["new_state"]
            lps_all[pick, t] = out["log_probs"]
            for a in live:
                if t + 1 in rows[stepped[a]].cuts:
                    cut_states[stepped[a]].append(cur[a].copy())
        assert lps_all is not None
        for a, i in enumerate(stepped):
            place(i, cur[a], lps_all[a], len(rows[i].tokens))
    assert states is not None and log_probs is not None
    return PrefillOut(states, log_probs, lengths, cut_states)


def _probe_width(runtime: Runtime, pad_id: int) -> int:
    """The state width of an older bundle (its prefill over one token)."""
    out = runtime.run("prefill", {"input_ids": np.full((1, 1), max(pad_id, 0), np.int64),
                                  "lengths": np.ones(1, np.int64)})
    return int(out["state"].shape[-1])


class Planned(Protocol):
    """What `plan_rows` reads of an admitted request (lm_scheduler's `_Request`)."""

    rows: list[list[int]]
    options: GenerateOptions | None
    start: tuple[bytes, int] | None
    score_state: bool
    cached: list[int]


def plan_rows(admitted: Sequence[Planned], cache: PrefixCache | None
              ) -> tuple[list[PrefillRow], list[tuple[str, list[int], int]]]:
    """Each admitted row as the prefill runs it: a continued state's pending token and new
    tokens from that state; a prompt after its longest cached prefix, cut where the cache
    keeps states; a text to score whole (cut before its last token when its state is asked).
    Also per row: its cache scope, the whole row and the prefix length its tokens start at;
    each request's `cached` is set (per row, the tokens a cached prefix saved)."""
    rows: list[PrefillRow] = []
    keys: list[tuple[str, list[int], int]] = []
    for r in admitted:
        o = r.options
        r.cached = []
        for row in r.rows:
            scope, k = "", 0
            if o is not None and o.resume is not None:
                state, pending = o.resume[0], o.resume[1]
                entry = PrefillRow([pending, *row], np.frombuffer(state, np.float32))
            elif o is None:
                start = None if r.start is None else np.frombuffer(r.start[0], np.float32)
                tokens = row if r.start is None else [r.start[1], *row]
                cut = [len(tokens) - 1] if r.score_state and len(tokens) > 1 else []
                entry = PrefillRow(tokens, start, cut)
            elif cache is not None:
                scope = o.cache_scope
                k, found = cache.longest(scope, row)
                entry = PrefillRow(row[k:], found, [c - k for c in cache.cuts(len(row), k)])
            else:
                entry = PrefillRow(row)
            r.cached.append(k)
            rows.append(entry)
            keys.append((scope, row, k))
    return rows, keys
