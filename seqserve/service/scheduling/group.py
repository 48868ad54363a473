"""One decode group: its requests' beam state, their encoder memories in one padded bank, and
the decoder state rows. It builds the group's decoder_step feed and applies the outputs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from seqserve.service.scheduling.beam_search import Beams
from seqserve.service.scheduling.kernel import loaded
from seqserve.service.scheduling.search import DecodeLimits, SearchOptions

_kernel: Any = loaded("bank_add", "bank_free")  # None: the numpy below only


class MemoryBank:
    """Encoder memories, one slot per request, in one (slots, S, D) array that decoder_step
    reads through `memory_index`, and beside it, for a bundle whose encoder returns them, the
    memories' projected attention keys (slots, S, A) in the same slots. The used slots are
    always the first n (a request leaving moves the last one into its hole), so the step
    projects no memory nobody reads; a request joining or leaving copies only its own
    memory; the arrays are rebuilt only to grow, or to narrow S when the longest source leaves
    (S is the longest member's length)."""

    def __init__(self, kernel: Any = _kernel) -> None:
        self.kernel = kernel
        """The compiled `bank_add` / `bank_free` (native/beam), None: numpy's calls."""
        self.memory = np.zeros((0, 0, 0), np.float32)  # (slots, S, D)
        self.keys: np.ndarray | None = None  # (slots, S, A) when the encoder returns keys
        self.mask = np.zeros((0, 0), bool)  # (slots, S)
        self.lengths = np.zeros(0, np.int64)  # (slots,) source length
        self.used = 0  # slots 0 .. used-1 hold memories
        self.longest = 0  # the longest length of the used slots

    @property
    def width(self) -> int:
        return self.memory.shape[1]

    @property
    def key_dim(self) -> int | None:
        """The keys' width A, None when the bank holds no keys."""
        return None if self.keys is None else self.keys.shape[2]

    def _planes(self) -> list[np.ndarray]:
        return [self.memory] if self.keys is None else [self.memory, self.keys]

    def add(self, memory: np.ndarray, lengths: np.ndarray,
            keys: np.ndarray | None = None) -> np.ndarray:
        """Slots (n,) for n memories (n, S_n, D) (and their keys (n, S_n, A) when the bank
        holds keys); positions past each length read as zero. One call into the scheduling
        layer's compiled module where it is built and the memories are float32 (`kernel`),
        else numpy's calls (the reference: tests/service/scheduling/test_group.py checks
        that both write the same bank)."""
        n = len(lengths)
        capacity = len(self.lengths)
        if self.used + n > capacity:
            capacity = max(2 * capacity, self.used + n, 8)
        width = int(max(self.longest, lengths.max()))
        self._resize(capacity, width, memory.shape[2], None if keys is None else keys.shape[2])
        slots = np.arange(self.used, self.used + n)
        if self.kernel is not None and memory.dtype == np.float32 and (
                keys is None or keys.dtype == np.float32):
            self.kernel.bank_add(self.memory, self.keys, self.mask, self.lengths, self.used,
                                 memory, keys, lengths)
        else:
            s = min(width, memory.shape[1])
            valid = np.arange(width)[None] < lengths[:, None]  # (n, S)
            given = [memory] if keys is None else [memory, keys]
            for plane, values in zip(self._planes(), given, strict=True):
                block = plane[self.used : self.used + n]  # (n, S, D | A) a view
                block[:, s:] = 0.0
                block[:, :s] = np.where(valid[:, :s, None], values[:, :s], 0.0)
            self.mask[slots], self.lengths[slots] = valid, lengths
        self.used += n
        self.longest = width
        return slots

    def free(self, slots: np.ndarray) -> np.ndarray:
        """Free `slots`; the last used slots move into the holes. Returns the new slot of
        every slot (capacity,) (unchanged but for the moved ones). Compiled as `add` is."""
        left = self.used - len(slots)
        if self.kernel is not None:
            moved, longest = self.kernel.bank_free(self.memory, self.keys, self.mask,
                                                   self.lengths, self.used, slots)
        else:
            moved = np.arange(len(self.lengths))
            holes = np.sort(slots[slots < left])  # (h,) freed slots inside the used range
            gone = np.zeros(self.used, bool)
            gone[slots] = True
            tail = np.flatnonzero(~gone[left:]) + left  # (h,) used slots past the range
            for plane in self._planes():
                plane[holes] = plane[tail]
            self.mask[holes] = self.mask[tail]
            self.lengths[holes] = self.lengths[tail]
            self.lengths[left : self.used] = 0
            moved[tail] = holes
            longest = int(self.lengths[:left].max(initial=0))
        self.used = left
        self.longest = longest
        if longest < self.width:
            self._resize(len(self.lengths), longest, self.memory.shape[2], self.key_dim)
        return moved

    def view(self) -> tuple[np.ndarray, np.ndarray]:
        """(N, S, D) memory and (N, S) mask of the used slots (views, no copy)."""
        return self.memory[: self.used], self.mask[: self.used]

    def keys_view(self) -> np.ndarray | None:
        """(N, S, A) keys of the used slots (a view), None when the bank holds none."""
        return None if self.keys is None else self.keys[: self.used]

    def _resize(self, capacity: int, width: int, dim: int, key_dim: int | None) -> None:
        if (capacity, width, dim) == self.memory.shape and key_dim == self.key_dim:
            return
        n, s = self.used, min(width, self.width)
        memory = np.zeros((capacity, width, dim), np.float32)  # (slots, S, D)
        if self.memory.shape[2] == dim:
            memory[:n, :s] = self.memory[:n, :s]
        keys = None
        if key_dim is not None:
            keys = np.zeros((capacity, width, key_dim), np.float32)  # (slots, S, A)
            if self.keys is not None and self.key_dim == key_dim:
                keys[:n, :s] = self.keys[:n, :s]
        mask = np.zeros((capacity, width), bool)  # (slots, S)
        mask[:n, :s] = self.mask[:n, :s]
        lengths = np.zeros(capacity, np.int64)
        lengths[:n] = self.lengths[:n]
        self.memory, self.keys, self.mask, self.lengths = memory, keys, mask, lengths


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
             state: np.ndarray, attention_keys: np.ndarray | None = None) -> None:
        """Add encoded requests: memory (n, S, D), lengths (n,), initial state (n, state_dim)
        and, from an encoder that returns them, the memories' attention keys (n, S, A)."""
        slots = self.bank.add(memory, lengths, attention_keys)
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
        moved = self.bank.free(self.slots[~keep])
        self.slots = moved[self.slots[keep]]
        self.beams.keep(keep)
        self.beams.set_source_width(self.bank.width)

    def inputs(self) -> dict[str, np.ndarray]:
        """The decoder_step feed of every live row (fixes the step's k and n-gram bans)."""
        k = self.beams.prepare()
        memory, mask = self.bank.view()  # (N, S, D), (N, S)
        feed = {"prev_ids": self.beams.prev_ids(), "state": self.state, "memory": memory,
                "src_mask": mask, "memory_index": self.slots[self.beams.rows.request],
                "k": np.array([k], dtype=np.int64)}
        attention_keys = self.bank.keys_view()  # (N, S, A) or None
        if attention_keys is not None:
            feed["keys"] = attention_keys
        return feed

    def advance(self, out: dict[str, np.ndarray]) -> None:
        """Apply one decoder_step's outputs; `beams.done` says who finished."""
        parents = self.beams.step(out["topk_logprobs"], out["topk_ids"], out["attention"])
        self.state = out["new_state"][parents]  # (R', state_dim)
