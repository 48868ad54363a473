"""The compiled step (native/beam, `Beams(kernel=True)`) against the numpy step (the
reference): random groups stepped in lockstep through both give identical selections,
parents, rows, done flags and n-best, step after step, with requests joining and leaving."""

from __future__ import annotations

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
    with pytest.raises(TypeError):
        kernel.advance(*([np.zeros((1, 2))] * 12), 3, *([np.zeros(1)] * 10), 0, None, None)


def test_kernel_true_needs_the_module(monkeypatch: pytest.MonkeyPatch) -> None:
    limits = DecodeLimits(bos_id=2, eos_id=EOS, vocab_size=100, max_decode_length=20)
    monkeypatch.setattr(beam_native, "AVAILABLE", False)
    assert not Beams(limits).kernel
    with pytest.raises(RuntimeError, match="not built"):
        Beams(limits, kernel=True)
