"""The memory bank and the decode group's feed."""

from __future__ import annotations

import numpy as np
from fake_translator import FakeTranslator

from seqserve.service.scheduling.group import DecodeGroup, MemoryBank
from seqserve.service.scheduling.search import SearchOptions


def _memories(lengths: list[int], width: int, dim: int = 3, fill: float = 7.0) -> np.ndarray:
    memory = np.full((len(lengths), width, dim), fill, np.float32)  # (n, S, D) garbage padding
    for i, n in enumerate(lengths):
        memory[i, :n] = i + 1
    return memory


def test_bank_keeps_used_slots_first_and_follows_the_longest_source() -> None:
    bank = MemoryBank()
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


def test_bank_moves_attention_keys_with_their_memory() -> None:
    """A bank with projected attention keys (schema 3) keeps each request's keys in its
    memory's slot through joins, holes filled by the last slot, and narrowing."""
    bank = MemoryBank()
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
