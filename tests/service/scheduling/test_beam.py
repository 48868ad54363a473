"""Per-request search state: penalties, the stopping bound, n-gram blocking, limits, options."""

from __future__ import annotations

import math

import numpy as np
import pytest
from fake_translator import FakeTranslator

from service.scheduling.beam import (
    LENGTH_SLACK,
    DecodeLimits,
    Hypothesis,
    RequestSearch,
    SearchOptions,
    coverage_penalty,
    length_penalty,
    max_steps,
)


def drive(fake: FakeTranslator, src: list[int], search: RequestSearch,
          on_step: object = None) -> None:
    """Feed `search` full-vocabulary steps of the fake model (one row at a time)."""
    memory, state0 = fake.encode_one(src)
    states = np.array([state0])
    while not search.done:
        prev = search.prev_ids()
        outs = [fake.step_one(int(p), s, memory) for p, s in zip(prev, states, strict=True)]
        logp = np.stack([o[0] for o in outs])  # (R, V)
        order = np.argsort(-logp, axis=1, kind="stable")  # (R, V)
        top = np.take_along_axis(logp, order, axis=1)
        if callable(on_step):
            on_step(search)
        parents = search.step(top, order, np.stack([o[1] for o in outs]))
        states = np.stack([o[2] for o in outs])[parents] if len(parents) else states[:0]


def test_penalty_formulas() -> None:
    assert length_penalty(7, 0.0) == 1.0
    assert length_penalty(7, 0.6) == pytest.approx((12 / 6) ** 0.6)
    cov = np.array([0.5, 1.7, 0.0])
    expected = 0.3 * (math.log(0.5) + math.log(1.0) + math.log(1e-12))
    assert coverage_penalty(cov, 0.3) == pytest.approx(expected)
    assert coverage_penalty(cov, 0.0) == 0.0


@pytest.mark.parametrize("alpha,beta", [(0.0, 0.0), (0.6, 0.0), (1.5, 0.4), (0.0, 0.5)])
def test_stopping_bound_is_an_upper_bound(alpha: float, beta: float,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """No finished hypothesis ever scores above the bound of any of its live ancestors."""
    fake = FakeTranslator(seed=3)
    monkeypatch.setattr(RequestSearch, "_should_stop", lambda self: not self.live)
    for src in ([5, 6, 7], [9, 4, 11, 12], [20]):
        opts = SearchOptions(beam_size=4, n_best=4, length_penalty=alpha, coverage_penalty=beta,
                             max_length=12)
        search = RequestSearch(opts, len(src), fake.limits)
        bounds: dict[tuple[int, ...], float] = {}

        def record(s: RequestSearch, bounds: dict[tuple[int, ...], float] = bounds) -> None:
            for h in s.live:
                bounds[h.token_ids] = s.best_possible(h)

        everything: list[Hypothesis] = []
        monkeypatch.setattr(search, "_finish", _keep_all(search, everything))
        drive(fake, src, search, record)
        assert everything
        for hyp in everything:
            for prefix, bound in bounds.items():
                if hyp.token_ids[: len(prefix)] == prefix:
                    assert hyp.score <= bound + 1e-12


def _keep_all(search: RequestSearch, sink: list[Hypothesis]):  # type: ignore[no-untyped-def]
    original = search._finish

    def finish(hyp: Hypothesis, ended: bool = False) -> None:
        original(hyp, ended)
        sink.append(hyp)

    return finish


def test_early_stop_saves_steps_without_changing_results(
        monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeTranslator(seed=1)
    src = [5, 9, 13, 17]
    opts = SearchOptions(beam_size=3, n_best=2, length_penalty=0.4, coverage_penalty=0.1,
                         max_length=30)
    early = RequestSearch(opts, len(src), fake.limits)
    drive(fake, src, early)
    monkeypatch.setattr(RequestSearch, "_should_stop", lambda self: not self.live)
    full = RequestSearch(opts, len(src), fake.limits)
    drive(fake, src, full)
    assert early.steps < full.steps
    assert [h.token_ids for h in early.results()] == [h.token_ids for h in full.results()]


def test_banned_tokens_match_brute_force() -> None:
    rng = np.random.default_rng(0)
    for n in (1, 2, 3):
        search = RequestSearch(SearchOptions(no_repeat_ngram_size=n), 3, DecodeLimits())
        for _ in range(50):
            toks = tuple(int(t) for t in rng.integers(4, 8, size=rng.integers(0, 10)))
            brute = {t for t in range(4, 8)
                     if _has_repeat(toks + (t,), n)}
            assert search._banned(Hypothesis(toks, 0.0)) == brute


def _has_repeat(toks: tuple[int, ...], n: int) -> bool:
    grams = [toks[i : i + n] for i in range(len(toks) - n + 1)]
    return len(grams) != len(set(grams)) and grams[-1] in grams[:-1]


def test_max_steps_takes_the_smallest_cap() -> None:
    limits = DecodeLimits(max_decode_length=50)
    assert max_steps(SearchOptions(max_length_ratio=None), 10, limits) == 50
    assert max_steps(SearchOptions(max_length_ratio=1.5), 10, limits) == 15 + LENGTH_SLACK
    assert max_steps(SearchOptions(max_length=7, max_length_ratio=1.5), 10, limits) == 7
    assert max_steps(SearchOptions(max_length=70, max_length_ratio=None), 10, limits) == 50


def test_min_length_and_max_length_hold() -> None:
    fake = FakeTranslator(eos_slope=3.0)  # EOS soon: min_length has to hold it back
    opts = SearchOptions(beam_size=2, n_best=2, min_length=5, max_length=9)
    search = RequestSearch(opts, 3, fake.limits)
    drive(fake, [5, 6, 7], search)
    for hyp in search.results():
        body = hyp.token_ids[:-1] if hyp.ended else hyp.token_ids
        assert len(body) >= 5 and len(hyp.token_ids) <= 9


def test_tiny_top_p_sampling_is_greedy() -> None:
    fake = FakeTranslator()
    for src in ([5, 6], [9, 10, 11, 12]):
        greedy = RequestSearch(SearchOptions(beam_size=1), len(src), fake.limits)
        nucleus = RequestSearch(SearchOptions(beam_size=1, top_p=1e-9, seed=5), len(src),
                                fake.limits)
        drive(fake, src, greedy)
        drive(fake, src, nucleus)
        assert greedy.results()[0].token_ids == nucleus.results()[0].token_ids


def test_a_tiny_temperature_samples_greedily() -> None:
    """temperature 5e-324 (a valid positive number) picks the best token at every step, the
    same tokens as greedy search, instead of NaN probabilities (a 500 once)."""
    fake = FakeTranslator(seed=3)
    src = [5, 6, 7, 8]
    results = []
    for opts in (SearchOptions(beam_size=1, temperature=5e-324, seed=1, max_length=12),
                 SearchOptions(beam_size=1, max_length=12)):
        search = RequestSearch(opts, len(src), fake.limits)
        drive(fake, src, search)
        results.append(search.results()[0].token_ids)
    assert results[0] == results[1]
