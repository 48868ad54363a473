"""The batch plan compiled (native/beam's `plan`, which `plan.plan_batch` calls where it is
built) against the Python plan (`plan.plan_in_python`, the reference): the same group for
random queues, lengths with ties and zeros, every limit binding in turn, fixed costs from none
to overwhelming; and its arguments checked."""

from __future__ import annotations

import random

import pytest

from seqserve.service.scheduling import plan
from seqserve.service.scheduling.plan import MIN_OVERHEAD, plan_batch, plan_in_python

pytestmark = pytest.mark.skipif(plan._compiled is None,  # noqa: SLF001
                                reason="the scheduling kernel is not built (native/beam/build.sh)")


def test_the_compiled_plan_chooses_as_the_python_plan() -> None:
    rng = random.Random(7)
    tied = 0
    for _ in range(20_000):
        n = rng.randint(0, 70)
        spread = rng.choice([(0, 4), (1, 300), (1, 20), (5, 6)])  # zeros, wide, narrow, ties
        lengths = sorted(rng.randint(*spread) for _ in range(n))
        anchor = rng.randint(0, max(n - 1, 0))
        max_rows = rng.randint(1, 20)
        max_tokens = rng.choice([1, 7, 64, 500, 4096, 10**6])
        overhead = rng.choice([0.0, MIN_OVERHEAD / 10, 0.5, 4.0, 64.0, 1e6, rng.random() * 100])
        chosen = plan_batch(lengths, anchor, max_rows, max_tokens, overhead)
        assert chosen == plan_in_python(lengths, anchor, max_rows, max_tokens, overhead), \
            (lengths, anchor, max_rows, max_tokens, overhead)
        if n:
            i, j = chosen
            assert i <= anchor < j and j - i <= max_rows
            tied += len(set(lengths)) < n
    assert tied > 5_000  # the ties (fewest rows first, fewer groups first) were exercised


def test_the_plan_of_a_known_queue() -> None:
    lengths = [2, 2, 3, 3, 40, 41, 41, 42]
    assert plan_batch(lengths, 0, 8, 10_000, 10) == (0, 4)
    assert plan_batch(lengths, 5, 8, 10_000, 10) == (4, 8)
    assert plan_batch(lengths, 5, 8, 10_000, 1e6) == (0, 8)  # a batch costs more than padding
    assert plan_batch(lengths, 5, 8, 82, 1e6) == (5, 7)  # two rows of 41 tokens at most
    assert plan_batch([], 0, 4, 100, 1.0) == (0, 0)


def test_the_compiled_plan_refuses_what_the_batcher_never_passes() -> None:
    compiled = plan._compiled  # noqa: SLF001
    with pytest.raises(ValueError, match="negative"):
        compiled([1, -2], 0, 4, 100, 1.0, MIN_OVERHEAD)
    with pytest.raises(ValueError, match="max_rows"):
        compiled([1, 2], 0, 0, 100, 1.0, MIN_OVERHEAD)
    with pytest.raises(TypeError):
        compiled((1, 2), 0, 4, 100, 1.0, MIN_OVERHEAD)  # a list, as the batcher builds it
    with pytest.raises(TypeError):
        compiled([1, "2"], 0, 4, 100, 1.0, MIN_OVERHEAD)
