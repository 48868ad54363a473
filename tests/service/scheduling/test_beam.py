"""The search rules of search.py, through the vectorised search (one request or several, no
decode loop): penalties, the stopping bound, early stopping, limits, sampling."""

from __future__ import annotations

import math

import numpy as np
import pytest
from fake_translator import FakeTranslator, decode_with_beams

from seqserve.service.scheduling.beam_search import Beams
from seqserve.service.scheduling.finished import Entries, FinishedStore
from seqserve.service.scheduling.search import (
    LENGTH_SLACK,
    DecodeLimits,
    SearchOptions,
    coverage_penalty,
    length_penalty,
    max_steps,
)


def _no_early_stop(monkeypatch: pytest.MonkeyPatch) -> None:
    """Requests stop only when no live hypothesis is left (run to the length cap), and keep
    every hypothesis that the bound would drop. It patches the numpy step
    (`Beams(kernel=False)`): the compiled one has no such hook."""
    def done_when_empty(self: Beams, going: np.ndarray, val: np.ndarray) -> np.ndarray:
        return np.logical_not(going.any(1))

    def all_hopeful(self: Beams, val: np.ndarray) -> np.ndarray:
        return np.ones(val.shape, bool)

    monkeypatch.setattr(Beams, "_stopped", done_when_empty)
    monkeypatch.setattr(Beams, "_hopeful", all_hopeful)


def _record_finished(monkeypatch: pytest.MonkeyPatch) -> list[tuple[tuple[int, ...], float]]:
    """Every hypothesis that finishes, n-best or not: (tokens, score). The numpy step's
    (`Beams(kernel=False)`), as `_no_early_stop`."""
    sink: list[tuple[tuple[int, ...], float]] = []
    merge = FinishedStore.merge

    def recording(self: FinishedStore, request: np.ndarray, new: Entries,
                  n_best: np.ndarray) -> None:
        for tokens, length, score in zip(new.tokens, new.length, new.score, strict=True):
            sink.append((tuple(tokens[:length].tolist()), float(score)))
        merge(self, request, new, n_best)

    monkeypatch.setattr(FinishedStore, "merge", recording)
    return sink


def test_penalty_formulas() -> None:
    assert length_penalty(7, 0.0) == 1.0
    assert length_penalty(7, 0.6) == pytest.approx((12 / 6) ** 0.6)
    cov = np.array([0.5, 1.7, 0.0])
    expected = 0.3 * (math.log(0.5) + math.log(1.0) + math.log(1e-12))
    assert coverage_penalty(cov, 0.3) == pytest.approx(expected)
    assert coverage_penalty(cov, 0.0) == 0.0


def test_scores_follow_the_formulas(kernel: bool) -> None:
    """Each answer's score is its log-prob, length and coverage penalties (search.py)."""
    fake = FakeTranslator(seed=2)
    opts = SearchOptions(beam_size=3, n_best=3, length_penalty=0.7, coverage_penalty=0.4)
    results, _ = decode_with_beams(fake, [([5, 6, 7, 8], opts)], kernel=kernel)
    for hyp in results[0]:
        assert hyp.coverage is not None and hyp.coverage.shape == (4,)
        expected = hyp.logprob / length_penalty(len(hyp.token_ids), 0.7)
        expected += coverage_penalty(hyp.coverage, 0.4)
        assert hyp.score == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("alpha,beta", [(0.0, 0.0), (0.6, 0.0), (1.5, 0.4), (0.0, 0.5)])
def test_stopping_bound_is_an_upper_bound(alpha: float, beta: float,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """No finished hypothesis ever scores above the bound of any of its live ancestors."""
    fake = FakeTranslator(seed=3)
    _no_early_stop(monkeypatch)
    finished = _record_finished(monkeypatch)
    bounds: dict[tuple[int, ...], float] = {}

    def record(beams: Beams) -> None:
        steps = beams.reqs.steps[beams.rows.request]
        for tokens, n, bound in zip(beams.rows.tokens, steps, beams.bounds(), strict=True):
            bounds[tuple(tokens[:n].tolist())] = float(bound)

    opts = SearchOptions(beam_size=4, n_best=4, length_penalty=alpha, coverage_penalty=beta,
                         max_length=12)
    for src in ([5, 6, 7], [9, 4, 11, 12], [20]):
        finished.clear()
        bounds.clear()
        decode_with_beams(fake, [(src, opts)], record, kernel=False)
        assert finished
        for tokens, score in finished:
            for prefix, bound in bounds.items():
                if tokens[: len(prefix)] == prefix:
                    assert score <= bound + 1e-12


def test_early_stop_saves_steps_without_changing_results(
        monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeTranslator(seed=1)
    job = ([5, 9, 13, 17], SearchOptions(beam_size=3, n_best=2, length_penalty=0.4,
                                         coverage_penalty=0.1, max_length=30))
    early, early_steps = decode_with_beams(fake, [job], kernel=False)
    _no_early_stop(monkeypatch)
    full, full_steps = decode_with_beams(fake, [job], kernel=False)
    assert early_steps[0] < full_steps[0]
    assert [h.token_ids for h in early[0]] == [h.token_ids for h in full[0]]


def test_max_steps_takes_the_smallest_cap() -> None:
    limits = DecodeLimits(bos_id=2, eos_id=3, vocab_size=8000, max_decode_length=50)
    assert max_steps(SearchOptions(max_length_ratio=None), 10, limits) == 50
    assert max_steps(SearchOptions(max_length_ratio=1.5), 10, limits) == 15 + LENGTH_SLACK
    assert max_steps(SearchOptions(max_length=7, max_length_ratio=1.5), 10, limits) == 7
    assert max_steps(SearchOptions(max_length=70, max_length_ratio=None), 10, limits) == 50


def test_min_length_and_max_length_hold(kernel: bool) -> None:
    fake = FakeTranslator(eos_slope=3.0)  # EOS soon: min_length has to hold it back
    opts = SearchOptions(beam_size=2, n_best=2, min_length=5, max_length=9)
    results, _ = decode_with_beams(fake, [([5, 6, 7], opts)], kernel=kernel)
    for hyp in results[0]:
        body = hyp.token_ids[:-1] if hyp.ended else hyp.token_ids
        assert len(body) >= 5 and len(hyp.token_ids) <= 9


def test_truncated_at_the_cap_without_eos(kernel: bool) -> None:
    fake = FakeTranslator(eos_slope=0.0)  # EOS never likely: everything reaches the cap
    results, steps = decode_with_beams(fake, [([5, 6, 7], SearchOptions(beam_size=3, n_best=3,
                                                                        max_length=4))],
                                      kernel=kernel)
    assert steps == [4]
    assert all(len(h.token_ids) == 4 and not h.ended for h in results[0])


def test_tiny_top_p_sampling_is_greedy(kernel: bool) -> None:
    fake = FakeTranslator()
    for src in ([5, 6], [9, 10, 11, 12]):
        greedy, _ = decode_with_beams(fake, [(src, SearchOptions(beam_size=1))], kernel=kernel)
        nucleus, _ = decode_with_beams(fake, [(src, SearchOptions(beam_size=1, top_p=1e-9,
                                                                   seed=5))],
                                       kernel=kernel)
        assert greedy[0][0].token_ids == nucleus[0][0].token_ids


def test_a_tiny_temperature_samples_greedily(kernel: bool) -> None:
    """temperature 5e-324 (a valid positive number) picks the best token at every step, the
    same tokens as greedy search, instead of NaN probabilities (a 500 once)."""
    fake = FakeTranslator(seed=3)
    src = [5, 6, 7, 8]
    results = []
    for opts in (SearchOptions(beam_size=1, temperature=5e-324, seed=1, max_length=12),
                 SearchOptions(beam_size=1, max_length=12)):
        found, _ = decode_with_beams(fake, [(src, opts)], kernel=kernel)
        results.append(found[0][0].token_ids)
    assert results[0] == results[1]


def test_attention_rows_are_kept_per_hypothesis(kernel: bool) -> None:
    fake = FakeTranslator()
    opts = SearchOptions(beam_size=3, n_best=2, return_attention=True)
    results, _ = decode_with_beams(fake, [([5, 6, 7], opts), ([9, 10, 11, 12, 13], opts)],
                                   kernel=kernel)
    for src_len, hyps in zip((3, 5), results, strict=True):
        for hyp in hyps:
            matrix = hyp.attention_matrix()
            assert matrix is not None and matrix.shape == (len(hyp.token_ids), src_len)
            np.testing.assert_allclose(matrix.sum(1), 1.0, rtol=1e-5)  # softmax rows
