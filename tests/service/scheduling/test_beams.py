"""The vectorised search (`Beams`) with many requests of mixed options in one pass: each
request's result equals the reference full-vocabulary search, and equals its result alone."""

from __future__ import annotations

import random

import numpy as np
import pytest
from fake_translator import FakeTranslator, decode_with_beams
from reference_search import reference_beam_search

from seqserve.service.scheduling.beam_search import Beams
from seqserve.service.scheduling.search import Hypothesis, SearchOptions, max_steps

MIXED = [
    SearchOptions(beam_size=1),
    SearchOptions(beam_size=5, length_penalty=0.6, coverage_penalty=0.2),
    SearchOptions(beam_size=5, n_best=5, length_penalty=1.0),
    SearchOptions(beam_size=3, min_length=6, no_repeat_ngram_size=2, length_penalty=0.2),
    SearchOptions(beam_size=2, n_best=2, no_repeat_ngram_size=1, coverage_penalty=0.5),
    SearchOptions(beam_size=4, n_best=2, no_repeat_ngram_size=3, max_length=7),
    SearchOptions(beam_size=1, min_length=4, no_repeat_ngram_size=1),
    SearchOptions(beam_size=16, n_best=3, length_penalty=0.3),
]


def _sources(n: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [[int(t) for t in rng.integers(4, 24, size=int(rng.integers(1, 11)))]
            for _ in range(n)]


def test_mixed_requests_equal_the_reference(kernel: bool) -> None:
    fake = FakeTranslator(seed=4)
    rng = random.Random(1)
    jobs = [(src, rng.choice(MIXED)) for src in _sources(40)]
    results, _ = decode_with_beams(fake, jobs, kernel=kernel)
    for (src, o), hyps in zip(jobs, results, strict=True):
        memory, state = fake.encode_one(src)
        ref = reference_beam_search(
            fake.step_one, memory, state, bos=2, eos=3,
            max_len=max_steps(o, len(src), fake.limits), beam=o.beam_size, n_best=o.n_best,
            alpha=o.length_penalty, beta=o.coverage_penalty, min_length=o.min_length,
            no_repeat=o.no_repeat_ngram_size)
        assert [h.token_ids for h in hyps] == [tuple(r.tokens) for r in ref]
        np.testing.assert_allclose([h.score for h in hyps], [r.score for r in ref], rtol=1e-9)


def test_together_equals_alone_with_sampling_mixed_in(kernel: bool) -> None:
    fake = FakeTranslator(seed=5)
    rng = random.Random(2)
    options = [*MIXED, SearchOptions(beam_size=1, temperature=0.8, seed=3),
               SearchOptions(beam_size=1, top_k=3, top_p=0.9, seed=4),
               SearchOptions(beam_size=1, temperature=1.3, no_repeat_ngram_size=1, seed=9)]
    jobs = [(src, rng.choice(options)) for src in _sources(30, seed=7)]
    together, steps = decode_with_beams(fake, jobs, kernel=kernel)
    for job, hyps, n in zip(jobs, together, steps, strict=True):
        alone, alone_steps = decode_with_beams(fake, [job], kernel=kernel)
        assert [h.token_ids for h in hyps] == [h.token_ids for h in alone[0]]
        assert [h.score for h in hyps] == [h.score for h in alone[0]]
        assert n == alone_steps[0]


def test_join_and_keep_move_only_their_requests(kernel: bool) -> None:
    """Requests join and leave between steps; the others' state is untouched."""
    fake = FakeTranslator()
    beams = Beams(fake.limits, kernel=kernel)
    opts = [SearchOptions(beam_size=2, return_attention=True), SearchOptions(beam_size=3),
            SearchOptions(beam_size=1, coverage_penalty=0.5)]
    beams.join([10, 11, 12], opts, [3, 5, 2])
    beams.set_source_width(5)
    assert beams.reqs.key.tolist() == [10, 11, 12] and beams.n_rows == 3
    assert beams.rows.tokens.shape == (3, int(beams.reqs.max_steps.max()))
    assert beams.rows.coverage.shape == (3, 5) and beams.rows.attention.shape[2] == 5
    beams.keep(np.array([True, False, True]))
    assert beams.reqs.key.tolist() == [10, 12] and beams.rows.request.tolist() == [0, 1]
    beams.keep(np.array([False, True]))
    assert beams.rows.attention.shape[1:] == (0, 0)  # nobody asks for attention any more
    assert beams.prepare() == 3  # 2B + 1 of the beam-1 request


def test_hopeless_hypotheses_are_dropped_without_changing_any_answer(
        kernel: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """A live hypothesis whose bound cannot beat its request's n-th finished one is dropped
    (`Beams._hopeful`): the same n-best, scores and steps as a search that keeps every one
    (the numpy step with the rule off), in fewer row-steps; the numpy and compiled steps
    drop the same rows."""
    fake = FakeTranslator(seed=6)
    rng = random.Random(3)
    jobs = [(src, rng.choice(MIXED)) for src in _sources(40, seed=11)]

    def run(kernel: bool) -> tuple[list[list[Hypothesis]], list[int], int]:
        rows = [0]
        results, steps = decode_with_beams(
            fake, jobs, lambda b: rows.__setitem__(0, rows[0] + b.n_rows), kernel=kernel)
        return results, steps, rows[0]

    pruned, pruned_steps, pruned_rows = run(kernel)
    numpy_rows = run(False)[2]
    with monkeypatch.context() as patched:
        patched.setattr(Beams, "_hopeful", lambda self, val: np.ones(val.shape, bool))
        kept, kept_steps, kept_rows = run(False)
    assert pruned_steps == kept_steps
    for got, want in zip(pruned, kept, strict=True):
        assert [h.token_ids for h in got] == [h.token_ids for h in want]
        assert [h.score for h in got] == [h.score for h in want]
    assert pruned_rows == numpy_rows < kept_rows
