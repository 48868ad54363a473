"""The memory bank and the decode group's feed."""

from __future__ import annotations

import numpy as np
import pytest
from fake_translator import FakeTranslator

from seqserve.service.scheduling import group
from seqserve.service.scheduling.group import DecodeGroup, MemoryBank
from seqserve.service.scheduling.search import SearchOptions


def _memories(lengths: list[int], width: int, dim: int = 3, fill: float = 7.0) -> np.ndarray:
    memory = np.full((len(lengths), width, dim), fill, np.float32)  # (n, S, D) garbage padding
    for i, n in enumerate(lengths):
        memory[i, :n] = i + 1
    return memory


KERNELS = [pytest.param(None, id="numpy"), pytest.param(
    group._kernel, id="compiled",  # noqa: SLF001
    marks=pytest.mark.skipif(group._kernel is None,  # noqa: SLF001
                             reason="the scheduling kernel is not built (native/beam/build.sh)"))]


@pytest.mark.parametrize("kernel", KERNELS)
def test_bank_keeps_used_slots_first_and_follows_the_longest_source(kernel: object) -> None:
    bank = MemoryBank(kernel)
    slots = bank.add(_memories([2, 5, 3], 5), np.array([2, 5, 3]))
    assert slots.tolist() == [0, 1, 2] and bank.width == 5
    memory, mask = bank.view()
    assert memory.shape[:2] == (3, 5) and mask.sum(1).tolist() == [2, 5, 3]
    assert (memory[0, :2] == 1).all() and not memory[0, 2:].any()  # padding zeroed
    moved = bank.free(np.array([1]))  # the longest leaves: the last slot fills its hole
    assert moved[2] == 1 and moved[0] == 0
    assert bank.width == 3 and bank.view()[0].shape[:2] == (2, 3)
    memory, mask = bank.view()
    assert (memory[1, :3] == 3).all() and mask.sum(1).tolist() == [2, 3]
    slots = bank.add(_memories([4], 4), np.array([4]))
    assert slots.tolist() == [2] and bank.width == 4
    memory, mask = bank.view()
    assert (memory[0, :2] == 1).all() and (memory[2, :4] == 1).all()
    assert memory.flags.c_contiguous and mask.flags.c_contiguous
    moved = bank.free(np.array([0, 2]))
    assert moved[1] == 0 and bank.view()[0].shape[:2] == (1, 3)
    assert (bank.view()[0][0, :3] == 3).all()


@pytest.mark.parametrize("kernel", KERNELS)
def test_bank_moves_attention_keys_with_their_memory(kernel: object) -> None:
    """A bank with projected attention keys (schema 3) keeps each request's keys in its
    memory's slot through joins, holes filled by the last slot, and narrowing."""
    bank = MemoryBank(kernel)
    lengths = np.array([2, 5, 3])
    keys = 10 * _memories([2, 5, 3], 5, dim=2, fill=9.0)  # (n, S, A), A != D
    bank.add(_memories([2, 5, 3], 5), lengths, keys)
    got = bank.keys_view()
    assert got is not None and got.shape == (3, 5, 2)
    assert (got[1] == 20).all() and (got[0, :2] == 10).all() and not got[0, 2:].any()
    bank.free(np.array([0]))  # slot 2 (length 3) moves into slot 0
    memory, mask = bank.view()
    got = bank.keys_view()
    assert got is not None and got.shape == (2, 5, 2)
    assert (memory[0, :3] == 3).all() and (got[0, :3] == 30).all() and not got[0, 3:].any()
    bank.free(np.array([1]))  # the longest leaves: narrowed to 3
    got = bank.keys_view()
    assert got is not None and got.shape == (1, 3, 2) and (got[0] == 30).all()
    assert MemoryBank().keys_view() is None


@pytest.mark.skipif(group._kernel is None,  # noqa: SLF001
                    reason="the scheduling kernel is not built (native/beam/build.sh)")
@pytest.mark.parametrize("with_keys", [False, True])
def test_the_compiled_bank_writes_what_numpy_writes(with_keys: bool) -> None:
    """Random joins and leaves (padded memories with garbage past their lengths, NaN and -0.0
    inside them, zero lengths, the longest leaving, growth, float64 memories that take
    numpy's path) through a compiled and a numpy bank: the same slots, moves and arrays,
    bytes included."""
    rng = np.random.default_rng(3)
    banks = [MemoryBank(group._kernel), MemoryBank(None)]  # noqa: SLF001
    moves = 0
    for _ in range(600):
        used = banks[0].used
        if used and rng.random() < 0.45:
            slots = rng.choice(used, int(rng.integers(1, used + 1)), replace=False)
            got = [b.free(slots.astype(np.int64)) for b in banks]
            assert got[0].tolist() == got[1].tolist()
            moves += int((got[0] != np.arange(len(got[0]))).sum())
        else:
            n, width = int(rng.integers(1, 6)), int(rng.integers(1, 14))
            lengths = rng.integers(0, width + 1, n)
            memory = rng.standard_normal((n, width, 4)).astype(
                np.float64 if rng.random() < 0.1 else np.float32)
            memory[rng.random(memory.shape) < 0.01] = np.nan
            memory[rng.random(memory.shape) < 0.01] = -0.0
            keys = rng.standard_normal((n, width, 3)).astype(np.float32) if with_keys else None
            got = [b.add(memory, lengths, keys) for b in banks]
            assert got[0].tolist() == got[1].tolist()
        a, b = banks
        assert (a.used, a.longest, a.width) == (b.used, b.longest, b.width)
        for x, y in [(a.memory, b.memory), (a.mask, b.mask), (a.lengths, b.lengths),
                     (a.keys, b.keys)]:
            assert (x is None) == (y is None)
            if x is not None:
                assert x.shape == y.shape and x.tobytes() == y.tobytes()
    assert moves > 100


@pytest.mark.skipif(group._kernel is None,  # noqa: SLF001
                    reason="the scheduling kernel is not built (native/beam/build.sh)")
def test_the_compiled_bank_refuses_what_does_not_fit() -> None:
    bank = MemoryBank(group._kernel)  # noqa: SLF001
    bank.add(_memories([2, 3], 3), np.array([2, 3]))
    kernel = group._kernel  # noqa: SLF001
    with pytest.raises(ValueError, match="distinct used slot"):
        bank.free(np.array([1, 1]))
    with pytest.raises(ValueError, match="distinct used slot"):
        bank.free(np.array([2]))
    with pytest.raises(ValueError, match="capacity"):
        kernel.bank_add(bank.memory, None, bank.mask, bank.lengths, len(bank.lengths),
                        _memories([1], 3), None, np.array([1]))
    with pytest.raises(ValueError, match="new keys"):
        kernel.bank_add(bank.memory, None, bank.mask, bank.lengths, 0, _memories([1], 3),
                        _memories([1], 3), np.array([1]))
    with pytest.raises(TypeError, match="float32"):
        kernel.bank_add(bank.memory, None, bank.mask, bank.lengths, 0,
                        _memories([1], 3).astype(np.float64), None, np.array([1]))
    assert bank.used == 2 and bank.lengths[:2].tolist() == [2, 3]


def test_group_feed_and_eviction() -> None:
    fake = FakeTranslator()
    group = DecodeGroup(fake.limits)
    sources = [[5, 6, 7], [9, 10], [11, 12, 13, 14]]
    encoded = fake.run("encoder", {"src_ids": np.array([s + [0] * (4 - len(s))
                                                        for s in sources]),
                                   "src_lengths": np.array([3, 2, 4])})
    group.join([7, 8, 9], [SearchOptions(beam_size=2)] * 3, [3, 2, 4], encoded["memory"],
               np.array([3, 2, 4]), encoded["state"])
    feed = group.inputs()
    assert feed["prev_ids"].tolist() == [2, 2, 2] and feed["k"].tolist() == [5]
    assert feed["memory_index"].tolist() == [0, 1, 2] and feed["memory"].shape[1] == 4
    group.advance(fake.run("decoder_step", feed))
    assert group.rows == 6 and group.state.shape == (6, fake.dim + 1)
    group.evict(np.array([True, True, False]))
    assert group.keys.tolist() == [7, 8] and group.rows == 4
    assert group.bank.width == 3 and group.inputs()["memory"].shape[1] == 3
