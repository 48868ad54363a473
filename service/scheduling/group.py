"""One decode group: its requests' beam state, their encoder memories in one padded bank, and
the decoder state rows. It builds the group's decoder_step feed and applies the outputs."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from service.scheduling.beam import DecodeLimits, SearchOptions
from service.scheduling.beams import Beams


class MemoryBank:
    """Encoder memories, one slot per request, in one (slots, S, D) array that decoder_step
    reads through `memory_index`. A request joining or leaving copies only its own memory; the
    array is rebuilt only to grow, or to narrow S when the longest source leaves (S is always
    the longest member's length, so the step attends over no more padding than needed)."""

    def __init__(self) -> None:
        self.memory = np.zeros((0, 0, 0), np.float32)  # (slots, S, D)
        self.mask = np.zeros((0, 0), bool)  # (slots, S)
        self.lengths = np.zeros(0, np.int64)  # (slots,) source length, 0: free

    @property
    def width(self) -> int:
        return self.memory.shape[1]

    def add(self, memory: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """Slots (n,) for n memories (n, S_n, D); positions past each length read as zero."""
        n = len(lengths)
        free = np.flatnonzero(self.lengths == 0)
        capacity = len(self.lengths)
        if len(free) < n:
            capacity = max(2 * capacity, capacity + n - len(free), 8)
        width = int(max(self.lengths.max(initial=0), lengths.max()))
        self._resize(capacity, width, memory.shape[2])
        slots = np.flatnonzero(self.lengths == 0)[:n]
        s = min(width, memory.shape[1])
        valid = np.arange(width)[None] < lengths[:, None]  # (n, S)
        self.memory[slots] = 0.0
        self.memory[slots, :s] = np.where(valid[:, :s, None], memory[:, :s], 0.0)  # (n, s, D)
        self.mask[slots] = valid
        self.lengths[slots] = lengths
        return slots

    def free(self, slots: np.ndarray) -> None:
        self.lengths[slots] = 0
        longest = int(self.lengths.max(initial=0))
        if longest < self.width:
            self._resize(len(self.lengths), longest, self.memory.shape[2])

    def view(self) -> tuple[np.ndarray, np.ndarray]:
        """(N, S, D) memory and (N, S) mask up to the last used slot (views, no copy)."""
        used = np.flatnonzero(self.lengths)
        end = int(used[-1]) + 1 if len(used) else 0
        return self.memory[:end], self.mask[:end]

    def _resize(self, capacity: int, width: int, dim: int) -> None:
        if (capacity, width, dim) == self.memory.shape:
            return
        memory = np.zeros((capacity, width, dim), np.float32)  # (slots, S, D)
        mask = np.zeros((capacity, width), bool)  # (slots, S)
        n, s = min(capacity, len(self.lengths)), min(width, self.width)
        if self.memory.shape[2] == dim:
            memory[:n, :s] = self.memory[:n, :s]
        mask[:n, :s] = self.mask[:n, :s]
        lengths = np.zeros(capacity, np.int64)
        lengths[:n] = self.lengths[:n]
        self.memory, self.mask, self.lengths = memory, mask, lengths


class DecodeGroup:
    """Requests that share one decoder_step call (see decoding.py for groups)."""

    def __init__(self, limits: DecodeLimits) -> None:
        self.beams = Beams(limits)
        self.bank = MemoryBank()
        self.slots = np.zeros(0, np.int64)  # (Q,) bank slot of each request
        self.state = np.zeros((0, 0), np.float32)  # (R, state_dim) decoder state rows

    @property
    def rows(self) -> int:
        return self.beams.n_rows

    @property
    def keys(self) -> np.ndarray:
        """(Q,) the requests' ids, in the group's order."""
        return self.beams.reqs.key

    def reserved(self) -> int:
        """Rows its requests may use (sum of their beam sizes)."""
        return int(self.beams.reqs.beam.sum())

    def join(self, keys: Sequence[int], options: Sequence[SearchOptions],
             src_lens: Sequence[int], memory: np.ndarray, lengths: np.ndarray,
             state: np.ndarray) -> None:
        """Add encoded requests: memory (n, S, D), lengths (n,), initial state (n, state_dim)."""
        slots = self.bank.add(memory, lengths)
        self.beams.join(keys, options, src_lens)
        self.beams.set_source_width(self.bank.width)
        self.slots = np.concatenate([self.slots, slots])
        state = state.astype(np.float32, copy=False)
        self.state = np.concatenate([self.state, state]) if len(self.state) else state

    def evict(self, keep: np.ndarray) -> None:
        """Keep the requests where `keep` (Q,) is set; free the others' rows and memory."""
        rows = keep[self.beams.rows.request]  # (R,)
        if not rows.all():
            self.state = self.state[rows]  # (R', state_dim)
        self.bank.free(self.slots[~keep])
        self.slots = self.slots[keep]
        self.beams.keep(keep)
        self.beams.set_source_width(self.bank.width)

    def inputs(self) -> dict[str, np.ndarray]:
        """The decoder_step feed of every live row (fixes the step's k and n-gram bans)."""
        k = self.beams.prepare()
        memory, mask = self.bank.view()  # (N, S, D), (N, S)
        return {"prev_ids": self.beams.prev_ids(), "state": self.state, "memory": memory,
                "src_mask": mask, "memory_index": self.slots[self.beams.rows.request],
                "k": np.array([k], dtype=np.int64)}

    def advance(self, out: dict[str, np.ndarray]) -> None:
        """Apply one decoder_step's outputs; `beams.done` says who finished."""
        parents = self.beams.step(out["topk_logprobs"], out["topk_ids"], out["attention"])
        self.state = out["new_state"][parents]  # (R', state_dim)
