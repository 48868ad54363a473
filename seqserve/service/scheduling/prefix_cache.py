"""Language models' prefix-state cache: the recurrent state after a prompt's prefix, kept so
that a prompt that extends it runs only its remainder.

A recurrent model's whole past is one fixed-size state (text-lm: 512 floats, 2 KiB), so a
cached prefix costs the same whatever its length, unlike a transformer's KV cache. Entries are
keyed by the exact token prefix (bos first) and a scope (the API key's, so that the timing of
a hit reveals nothing of another tenant's prompts), taken at block boundaries (every `block`
tokens) and at each prompt's end (the prompt less its last token, which is fed so that its
next-token distribution exists). The cache is a least-recently-used map bounded in bytes
(keys, states and a fixed overhead per entry); one per model version in each process that
runs it.

Continuing from a cached state runs the same cell equations on the same inputs as running the
whole prompt (the prefill is split at the same boundaries on a miss), so a hit answers exactly
what a miss answers (tested, greedy and seeded, alone and in mixed batches).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

ENTRY_OVERHEAD = 160
"""Bytes counted per entry beyond its key and state (the map's slot, the objects)."""
DEFAULT_BLOCK = 32


@dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    hit_tokens: int = 0


class PrefixCache:
    """See module doc. Not thread-safe: the scheduler's update thread alone uses it."""

    def __init__(self, capacity_bytes: int, block: int = DEFAULT_BLOCK) -> None:
        if block < 1:
            raise ValueError("block must be >= 1")
        self.capacity = max(0, int(capacity_bytes))
        self.block = block
        self._entries: OrderedDict[tuple[str, bytes], np.ndarray] = OrderedDict()
        self.bytes = 0
        self.stats = CacheStats()

    @property
    def enabled(self) -> bool:
        return self.capacity > 0

    def __len__(self) -> int:
        return len(self._entries)

    @staticmethod
    def _key(scope: str, row: list[int], k: int) -> tuple[str, bytes]:
        return scope, np.asarray(row[:k], dtype=np.int32).tobytes()

    def longest(self, scope: str, row: list[int]) -> tuple[int, np.ndarray | None]:
        """The longest cached prefix of `row` that leaves at least one token to feed: (its
        length, its state (S,)), or (0, None)."""
        for k in self.cuts(len(row), 0)[::-1]:
            key = self._key(scope, row, k)
            state = self._entries.get(key)
            if state is not None:
                self._entries.move_to_end(key)
                self.stats.hits += 1
                self.stats.hit_tokens += k
                return k, state
        self.stats.misses += 1
        return 0, None

    def cuts(self, n: int, after: int) -> list[int]:
        """Prefix lengths of a row of `n` tokens past `after` whose states are cached: every
        block boundary and the row less its last token, ascending."""
        if n < 2:
            return []
        out = list(range((after // self.block + 1) * self.block, n - 1, self.block))
        if n - 1 > after:
            out.append(n - 1)
        return out

    def put(self, scope: str, row: list[int], k: int, state: np.ndarray) -> None:
        """Keep the state after `row[:k]` (a copy), evicting the least recently used."""
        if not self.enabled:
            return
        key = self._key(scope, row, k)
        old = self._entries.pop(key, None)
        if old is not None:
            self.bytes -= self._size(key, old)
        value = np.array(state, dtype=np.float32, copy=True)
        size = self._size(key, value)
        if size > self.capacity:
            return
        self._entries[key] = value
        self.bytes += size
        while self.bytes > self.capacity:
            evicted_key, evicted = self._entries.popitem(last=False)
            self.bytes -= self._size(evicted_key, evicted)
            self.stats.evictions += 1

    @staticmethod
    def _size(key: tuple[str, bytes], state: np.ndarray) -> int:
        return len(key[0]) + len(key[1]) + state.nbytes + ENTRY_OVERHEAD
