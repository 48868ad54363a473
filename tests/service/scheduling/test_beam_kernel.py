"""The compiled step (native/beam, `Beams(kernel=True)`) against the numpy step (the
reference): random groups stepped in lockstep through both give identical selections,
parents, rows, done flags and n-best, step after step, with requests joining and leaving."""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from seqserve.service.scheduling import beam_native
from seqserve.service.scheduling.beam_search import Beams, _Selection
from seqserve.service.scheduling.finished import Found
from seqserve.service.scheduling.search import DecodeLimits, SearchOptions

pytestmark = pytest.mark.skipif(not beam_native.AVAILABLE,
                                reason="the beam kernel is not built (native/beam/build.sh)")

EOS = 3
TOKENS = 24  # ids drawn from the first TOKENS of the vocabulary: repeats, bans and EOS often


def _options(rng: np.random.Generator) -> SearchOptions:
    if rng.random() < 0.2:  # sampling (beam 1), a fixed seed
        return SearchOptions(beam_size=1, temperature=float(rng.choice([0.7, 1.0, 1.5])),
                             top_k=int(rng.choice([3, 5])) if rng.random() < 0.5 else None,
                             seed=int(rng.integers(1000)), max_length=int(rng.integers(2, 14)),
                             no_repeat_ngram_size=int(rng.choice([0, 0, 1, 2])),
                             return_attention=bool(rng.random() < 0.3))
    beam = int(rng.integers(1, 7))
    return SearchOptions(
        beam_size=beam, n_best=int(rng.integers(1, beam + 1)),
        min_length=int(rng.choice([0, 0, 2, 4])),
        no_repeat_ngram_size=int(rng.choice([0, 0, 0, 1, 2, 3])),
        length_penalty=float(rng.choice([0.0, 0.6, 1.0])),
        coverage_penalty=float(rng.choice([0.0, 0.0, 0.2, 0.5])),
        return_attention=bool(rng.random() < 0.3),
        max_length=int(rng.integers(2, 16)) if rng.random() < 0.8 else None)


def _outputs(rng: np.random.Generator, rows: int, k: int, width: int, dtype: Any,
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A decoder step's top-k: log-probs on a coarse grid (ties), best first; -inf rows now
    and then (nothing allowed); distinct ids with EOS among them often; attention rows."""
    lp = -np.round(rng.exponential(1.5, size=(rows, k)) * 2) / 2  # (R, k) many ties
    lp = -np.sort(-lp, axis=1)
    lp[rng.random(rows) < 0.04] = -np.inf
    ids = np.argsort(rng.random((rows, max(TOKENS, k))), axis=1)[:, :k]  # (R, k) distinct
    att = rng.random((rows, width)).astype(np.float32)
    att /= att.sum(1, keepdims=True) + np.float32(rng.random())
    return lp.astype(dtype), ids.astype(np.int64), att


def _same_selection(a: _Selection, b: _Selection) -> None:
    for name in ("row", "tok", "val", "valid", "starts"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.shape == y.shape, name
        np.testing.assert_array_equal(x, y, err_msg=name)


def _same_found(a: Found, b: Found) -> None:
    np.testing.assert_array_equal(a.counts, b.counts)
    for i, n in enumerate(a.counts.tolist()):
        for name in ("score", "logp", "length", "ended", "tokens", "coverage", "attention"):
            x, y = getattr(a.entries, name)[i, :n], getattr(b.entries, name)[i, :n]
            assert x.dtype == y.dtype and x.shape == y.shape, name
            np.testing.assert_array_equal(x, y, err_msg=name)  # bit for bit (NaN: none)
    ha, hb = a.hypotheses(), b.hypotheses()
    assert [[(h.token_ids, h.logprob, h.score, h.ended) for h in hs] for hs in ha] == \
        [[(h.token_ids, h.logprob, h.score, h.ended) for h in hs] for hs in hb]


def _recording(beams: Beams, sink: list[_Selection]) -> None:
    """Record the selection (after the sampling patch) that each step advances from."""
    if beams.kernel:
        return
    advance = beams._advance

    def spy(sel: _Selection, attention: np.ndarray) -> np.ndarray:
        sink.append(_Selection(*(x.copy() for x in (sel.row, sel.tok, sel.val, sel.valid,
                                                    sel.starts))))
        return advance(sel, attention)

    beams._advance = spy  # type: ignore[method-assign]


@pytest.mark.parametrize("seed,vocab,logp_dtype", [
    (0, 100, np.float32), (1, 100, np.float32), (2, 40000, np.float32),
    (3, 100, np.float64), (4, 70000, np.float64), (5, 100, np.float32),
])
def test_kernel_equals_numpy_in_lockstep(seed: int, vocab: int, logp_dtype: Any,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(seed)
    limits = DecodeLimits(bos_id=2, eos_id=EOS, vocab_size=vocab, max_decode_length=20)
    ref, fast = Beams(limits, kernel=False), Beams(limits, kernel=True)
    assert fast.kernel and not ref.kernel
    assert ref.rows.tokens.dtype == (np.int16 if vocab < 32768 else np.int32)
    seen: list[_Selection] = []
    _recording(ref, seen)
    fast_seen: list[_Selection] = []
    advance = beam_native.advance

    def spy(state: Any, row: np.ndarray, tok: np.ndarray, val: np.ndarray, valid: np.ndarray,
            attention: np.ndarray) -> np.ndarray:
        fast_seen.append(_Selection(row.copy(), tok.copy(), val.copy(), valid.copy(),
                                    np.zeros(0)))
        return advance(state, row, tok, val, valid, attention)

    monkeypatch.setattr(beam_native, "advance", spy)
    key, finished, steps = 0, 0, 0
    for _ in range(120):
        if len(ref) < 12 and rng.random() < 0.6:  # requests join
            n = int(rng.integers(1, 4))
            opts = [_options(rng) for _ in range(n)]
            srcs = [int(rng.integers(1, 9)) for _ in range(n)]
            for beams in (ref, fast):
                beams.join(list(range(key, key + n)), opts, srcs)
            key += n
        if not len(ref):
            continue
        width = int(max(ref.reqs.src_len.max(), 1)) + int(rng.integers(0, 3))
        for beams in (ref, fast):
            beams.set_source_width(width)
        k = ref.prepare()
        assert fast.prepare() == k
        lp, ids, att = _outputs(rng, ref.n_rows, k + int(rng.integers(0, 3)), width, logp_dtype)
        parents = ref.step(lp, ids, att)
        np.testing.assert_array_equal(fast.step(lp, ids, att), parents)
        steps += 1
        got = fast_seen[-1]
        _same_selection(_Selection(*(getattr(seen[-1], n) for n in ("row", "tok", "val",
                                                                     "valid")), got.starts),
                        got)
        for name in ("request", "logp", "last", "tokens", "coverage", "attention"):
            x, y = getattr(ref.rows, name), getattr(fast.rows, name)
            assert x.dtype == y.dtype and x.shape == y.shape, name
            np.testing.assert_array_equal(x, y, err_msg=name)
        np.testing.assert_array_equal(ref.done, fast.done)
        np.testing.assert_array_equal(ref.reqs.ints, fast.reqs.ints)
        every = np.arange(len(ref))
        _same_found(ref.gathered(every), fast.gathered(every))
        finished += int(ref.done.sum())
        leave = ref.done | (rng.random(len(ref)) < 0.05)  # done ones, and some cut off
        if leave.any():
            for beams in (ref, fast):
                beams.keep(~leave)
    assert steps > 60 and finished > 10


def _same_state(ref: Beams, fast: Beams, when: str, pool: bool = True) -> None:
    """Every array of the two states equal, with its dtype and shape, and the n-best. The
    slots' pool indices only where `pool` (the two steps compact the pool at different
    times: after steps only which slots are full compares, and what they gather)."""
    index = ref.finished.index, fast.finished.index
    if not pool:
        index = index[0] >= 0, index[1] >= 0
    pairs = [("reqs.ints", ref.reqs.ints, fast.reqs.ints),
             ("reqs.beta", ref.reqs.beta, fast.reqs.beta), ("done", ref.done, fast.done),
             ("finished.index", *index),
             ("finished.score", ref.finished.score, fast.finished.score),
             ("lp", ref._lp, fast._lp)]
    pairs += [(f"rows.{name}", getattr(ref.rows, name), getattr(fast.rows, name))
              for name in ("request", "logp", "last", "tokens", "coverage", "attention")]
    pairs += [(f"pool.{name}", getattr(ref.finished.pool, name)[:0],  # the pool's widths
               getattr(fast.finished.pool, name)[:0])
              for name in ("tokens", "coverage", "attention")]
    for name, x, y in pairs:
        assert x.dtype == y.dtype and x.shape == y.shape, f"{name} after {when}"
        np.testing.assert_array_equal(x, y, err_msg=f"{name} after {when}")
    assert sorted(ref.samplers) == sorted(fast.samplers), when
    every = np.arange(len(ref))
    _same_found(ref.gathered(every), fast.gathered(every))


def _membership_options(rng: np.random.Generator) -> SearchOptions:
    """`_options` with the length caps mixed further: a ratio cap or none, so that requests
    joining late grow the token width."""
    o = _options(rng)
    ratio = rng.choice([0, 1, 2])
    return replace(o, max_length_ratio=(None, 2.0, 0.5)[ratio],
                   max_length=o.max_length if rng.random() < 0.6 else None)


def _twin(ref: Beams) -> Beams:
    """A copy of the numpy search's state that joins and leaves through the kernel."""
    twin = copy.deepcopy(ref)
    twin.kernel = True
    return twin


@pytest.mark.parametrize("seed", range(24))
def test_join_and_keep_equal_numpy(seed: int) -> None:
    """The compiled join / keep (with the widths' reshape) against the numpy ones: a search
    stepped with numpy and one with the kernel in lockstep, every array of the state compared
    after every join, keep, source width change and step; and at every join and keep a copy
    of the numpy state changed through the kernel, compared with it bit for bit (the pool
    indices of the slots included)."""
    rng = np.random.default_rng(100 + seed)
    limits = DecodeLimits(bos_id=2, eos_id=EOS, vocab_size=(100, 40000)[seed % 2],
                          max_decode_length=int(rng.choice([12, 20, 40])))
    ref, fast = Beams(limits, kernel=False), Beams(limits, kernel=True)
    key, joins, keeps, drops = 0, 0, 0, 0
    for _ in range(60):
        joined = len(ref) < 14 and rng.random() < 0.5
        if joined:  # requests join (into an empty group too)
            n = int(rng.integers(1, 5))
            opts = [_membership_options(rng) for _ in range(n)]
            srcs = [int(rng.integers(1, 12)) for _ in range(n)]
            twin = _twin(ref)
            for beams in (ref, fast, twin):
                beams.join(list(range(key, key + n)), opts, srcs)
            key, joins = key + n, joins + 1
            _same_state(ref, twin, "join")
            _same_state(ref, fast, "join", pool=False)
        if not len(ref):
            continue
        if joined or rng.random() < 0.3:  # the source width follows the members (it may narrow)
            width = int(max(ref.reqs.src_len.max(), 1)) + int(rng.integers(0, 3))
            for beams in (ref, fast):
                beams.set_source_width(width)
            _same_state(ref, fast, "set_source_width", pool=False)
        for _ in range(int(rng.integers(0, 3))):
            k = ref.prepare()
            assert fast.prepare() == k
            width = ref._source_width
            lp, ids, att = _outputs(rng, ref.n_rows, k, width, np.float32)
            np.testing.assert_array_equal(fast.step(lp, ids, att), ref.step(lp, ids, att))
            _same_state(ref, fast, "step", pool=False)
            if ref.done.any():  # the done ones leave before the next step
                break
        choice = rng.random()
        leave = ref.done | (rng.random(len(ref)) < 0.2)
        if choice < 0.1:
            leave = np.ones(len(ref), bool)  # all of them
        elif choice < 0.2:
            leave = ref.done.copy()  # none but the done ones (nothing, often)
        twin = _twin(ref)
        for beams in (ref, fast, twin):
            beams.keep(~leave)
        keeps, drops = keeps + 1, drops + int(leave.sum())
        _same_state(ref, twin, "keep")
        _same_state(ref, fast, "keep", pool=False)
    assert joins > 10 and keeps > 20 and drops > 10


def test_join_and_keep_grow_and_drop_the_histories() -> None:
    """The widths' rules through the kernel: coverage and attention widths appear with a
    request that needs them and go with the last one; the token width only grows."""
    limits = DecodeLimits(bos_id=2, eos_id=EOS, vocab_size=100, max_decode_length=30)
    ref, fast = Beams(limits, kernel=False), Beams(limits, kernel=True)
    plain = SearchOptions(beam_size=2, max_length=5)
    rich = SearchOptions(beam_size=3, n_best=3, max_length=9, coverage_penalty=0.2,
                         return_attention=True)
    for beams in (ref, fast):
        beams.join([0, 1], [plain, plain], [4, 6])
        beams.set_source_width(6)
    _same_state(ref, fast, "join")
    assert fast.rows.tokens.shape[1:] == (5,) and fast.rows.coverage.shape[1] == 0
    for beams in (ref, fast):
        beams.join([2], [rich], [3])
    _same_state(ref, fast, "join")
    assert fast.rows.coverage.shape[1:] == (6,) and fast.rows.attention.shape[1:] == (9, 6)
    assert fast.finished.slots == 3
    for beams in (ref, fast):
        beams.keep(np.array([True, True, False]))
    _same_state(ref, fast, "keep")
    assert fast.rows.tokens.shape[1:] == (9,) and fast.rows.coverage.shape[1] == 0
    assert fast.rows.attention.shape[1:] == (0, 0) and fast.finished.slots == 3


def test_selection_equals_numpy_directly() -> None:
    """`beam_native.select` returns the numpy step's masked candidates and selection."""
    rng = np.random.default_rng(9)
    limits = DecodeLimits(bos_id=2, eos_id=EOS, vocab_size=100, max_decode_length=20)
    beams = Beams(limits, kernel=False)
    opts = [_options(rng) for _ in range(8)]
    beams.join(list(range(8)), opts, [4] * 8)
    beams.set_source_width(4)
    for _ in range(6):
        k = beams.prepare()
        plan = beams._plan
        assert plan is not None
        lp, ids, att = _outputs(rng, beams.n_rows, k + 2, 4, np.float32)
        neg, *arrays = beam_native.select(beams, lp, ids, k, plan.bans)
        want_neg = beams._masked(np.subtract(-beams.rows.logp[:, None], lp[:, :k],
                                             dtype=np.float64), ids[:, :k], plan)
        np.testing.assert_array_equal(neg, want_neg)
        _same_selection(_Selection(*arrays), beams._select(want_neg, ids[:, :k]))
        beams.step(lp, ids, att)
        if beams.done.any():
            beams.keep(~beams.done)
        if not len(beams):
            break


def test_wrong_inputs_raise_instead_of_crashing() -> None:
    kernel: Any = beam_native._kernel
    with pytest.raises(TypeError):
        kernel.select(np.zeros(2), np.zeros((2, 3)), np.zeros((2, 3)) + 0.5, np.zeros(2, int),
                      np.zeros((1, 13), np.int64), 3, 3, None)
    with pytest.raises(ValueError):
        kernel.select(np.zeros(2), np.zeros((2, 3)), np.zeros((2, 3), int), np.zeros(2, int),
                      np.zeros((1, 12), np.int64), 3, 3, None)
    with pytest.raises(ValueError):
        kernel.select(np.zeros(2), np.zeros((2, 3)), np.zeros((2, 3), int), np.zeros(2, int),
                      np.zeros((1, 13), np.int64), 4, 3, None)
    beams = Beams(DecodeLimits(bos_id=2, eos_id=EOS, vocab_size=100, max_decode_length=20))
    beams.join([0, 1], [SearchOptions(beam_size=2)] * 2, [3, 4])
    r, f = beams.rows, beams.finished
    state = [beams.reqs.ints, beams.reqs.beta, r.request, r.logp, r.last, r.tokens,
             r.coverage, r.attention, f.index, f.score, beams.done]
    new = np.zeros((1, 13), np.int64)
    with pytest.raises(TypeError):  # a mask of ints is not a mask
        kernel.keep(*state, np.ones(2, np.int64), 4)
    with pytest.raises(ValueError):
        kernel.keep(*state, np.ones(3, bool), 4)
    with pytest.raises(TypeError):  # float tokens
        kernel.keep(*state[:5], r.tokens.astype(float), *state[6:], np.ones(2, bool), 4)
    with pytest.raises(ValueError):  # rows not grouped by request
        kernel.keep(*state[:2], r.request[::-1].copy(), *state[3:], np.ones(2, bool), 4)
    with pytest.raises(ValueError):
        kernel.join(*state, np.zeros((1, 12), np.int64), np.zeros(1), 2, 4)
    with pytest.raises(ValueError):
        kernel.join(*state, new, np.zeros(2), 2, 4)
    with pytest.raises(ValueError):
        kernel.join(*state[:8], f.index[:1], *state[9:], new, np.zeros(1), 2, 4)
    with pytest.raises(TypeError):
        kernel.join(*state, new.astype(float) + 0.5, np.zeros(1), 2, 4)
    with pytest.raises(TypeError):
        kernel.join(*state[:-1], np.zeros(2), new, np.zeros(1), 2, 4)  # float done
    with pytest.raises(TypeError):
        kernel.keep(*state)
    with pytest.raises(TypeError):
        kernel.advance(*([np.zeros((1, 2))] * 12), 3, *([np.zeros(1)] * 10), 0, None, None)


def test_kernel_true_needs_the_module(monkeypatch: pytest.MonkeyPatch) -> None:
    limits = DecodeLimits(bos_id=2, eos_id=EOS, vocab_size=100, max_decode_length=20)
    monkeypatch.setattr(beam_native, "AVAILABLE", False)
    assert not Beams(limits).kernel
    with pytest.raises(RuntimeError, match="not built"):
        Beams(limits, kernel=True)
