"""The batch plan: which rows of a batcher's queue go together (`Batcher._take_batch`): the
oldest row and its nearest neighbours by length, in the cheapest split of a window of the
queue sorted by length into batches (padding plus a fixed cost per batch).

`plan_batch` is one call into the scheduling layer's compiled module (`_beam_kernel.plan`,
native/beam/beam_kernel.c) where it is built, else the Python below (`plan_in_python`, the
reference: tests/service/scheduling/test_plan_kernel.py checks that both choose alike)."""

from __future__ import annotations

from typing import Any

from seqserve.service.scheduling.kernel import loaded

_compiled: Any = getattr(loaded("plan"), "plan", None)  # None: the Python plan only

PLAN_AGE = 4
"""`Batcher._take_batch`: how many batches' worth of the oldest rows a batch is chosen from."""
PLAN_REACH = 2
"""`plan_window`: how many batches' worth of rows on each side of the oldest row the plan
looks at."""


def plan_window(n: int, anchor: int, max_rows: int) -> tuple[int, int]:
    """The rows [lo, hi) of a length-sorted queue of `n` that `plan_batch` splits: the oldest
    row (`anchor`) and up to PLAN_REACH x `max_rows` rows on each side of it. Planning the
    whole queue cost O(queue x max_rows) per batch in Python: 1.9 ms for 256 rows, 15.6 ms for
    2,048, more than the batch itself under a backlog (py-spy of an API process at 3x
    overload: a third of its event loop); the window costs the same at any depth, and rows
    further away in length than two batches do not change which batch the oldest row joins
    but for rare ties (docs/performance.md section 20)."""
    reach = PLAN_REACH * max_rows
    return max(0, anchor - reach), min(n, anchor + reach + 1)


MIN_OVERHEAD = 1e-6
"""The least fixed cost `plan_batch` counts per batch (in tokens): a tie-break, not a cost."""


def plan_batch(lengths: list[int], anchor: int, max_rows: int, max_tokens: int,
               overhead: float) -> tuple[int, int]:
    """The group [i, j) of sorted `lengths` holding `anchor` in the cheapest split of all rows
    into contiguous groups, a group costing `overhead + rows x lengths[j-1]`, each group
    within `max_rows` and `max_tokens` (a single row always forms a valid group). A group
    costs at least `MIN_OVERHEAD` more than its rows, so that of splits equal in padding the
    one with fewer groups wins (with no overhead, rows of equal length went one per batch).
    Compiled where built (module doc): in Python it was the batcher's largest cost per batch
    on the event loop (docs/performance.md section 40)."""
    if _compiled is not None:
        found: tuple[int, int] = _compiled(lengths, anchor, max_rows, max_tokens,
                                           float(overhead), MIN_OVERHEAD)
        return found
    return plan_in_python(lengths, anchor, max_rows, max_tokens, overhead)


def plan_in_python(lengths: list[int], anchor: int, max_rows: int, max_tokens: int,
                   overhead: float) -> tuple[int, int]:
    """`plan_batch` in Python (where the module is not built, and the reference)."""
    n = len(lengths)
    fixed = max(overhead, MIN_OVERHEAD)
    best = [0.0] + [float("inf")] * n  # best[j]: cheapest split of lengths[:j]
    start = [0] * (n + 1)
    for j in range(1, n + 1):
        longest = lengths[j - 1]
        most = max(1, max_tokens // longest) if longest > 0 else max_rows  # rows by tokens
        before = best[max(0, j - max_rows, j - most): j]
        before.reverse()  # best[j - 1], best[j - 2], ...: the last group of 1, 2, ... rows
        # one comprehension, then min: a third cheaper than a loop with its tests (the
        # batcher plans every batch: 6-8% of an API process's main thread for 16-text
        # classify); the same sums in the same order, the fewest rows winning a tie
        costs = [b + fixed + rows * longest for rows, b in enumerate(before, 1)]
        low = min(costs)
        best[j], start[j] = low, j - 1 - costs.index(low)
    j = n
    while start[j] > anchor:
        j = start[j]
    return start[j], j
