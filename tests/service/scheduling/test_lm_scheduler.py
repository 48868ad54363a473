"""The language model's scheduler and its sampling, without a server: a fake LM whose
next-token distribution is a function of (previous token, state) only, driven through
schedule / execute / update. Vectorised sampling draws what each row's own distribution and
uniform say (greedy = argmax, top-k and top-p cut, the inverse CDF otherwise); a seed gives
the same tokens whatever else shares the batch; finishing (eos, length), stops and cancels;
admission refuses by the measured costs, and an idle model with a stale estimate refuses
too and generates the refused request for no one, to measure again. OpenAI's logit bias,
penalties and ignore_eos tune the draw of the rows that ask (and of no other); a score
request's best tokens come from the same prefill."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest
from service_fakes import decode_config

from seqserve.service.core.errors import QueueFull
from seqserve.service.scheduling.generation import GenerateOptions, TokenEvent
from seqserve.service.scheduling.lm_scheduler import LMScheduler
from seqserve.service.scheduling.sampling import (
    NUCLEUS_CANDIDATES,
    sample,
    sequence_keys,
    tuned,
    uniforms,
)

V, S, EOS = 40, 3, 2


class FakeLM:
    """prefill / lm_step with log-probs from a fixed table by (previous token, state[0]):
    every row's outputs depend on that row alone (batch-invariant by construction)."""

    name, providers = "fake", ["numpy"]

    def __init__(self, eos_bias: float = -4.0) -> None:
        rng = np.random.default_rng(0)
        logits = rng.normal(size=(V, 4, V)).astype(np.float32) * 2
        logits[..., EOS] += eos_bias
        self.table = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
        self.calls: list[tuple[str, int]] = []

    def _lp(self, prev: np.ndarray, state: np.ndarray) -> np.ndarray:
        return self.table[prev, state[:, 0].astype(np.int64) % 4]

    def run(self, graph: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if graph == "prefill":
            ids = inputs["input_ids"]  # pad 0 adds nothing to the state
            b, t = ids.shape
            state = np.zeros((b, S), np.float32)
            state[:, 0] = ids.sum(-1) % 4
            lp = np.stack([self._lp(ids[:, i], state) for i in range(t)], axis=1)
            self.calls.append((graph, b))
            return {"state": state, "log_probs": lp}
        prev, state = inputs["prev_ids"], inputs["state"]
        new = state.copy()
        new[:, 0] = (state[:, 0] + prev) % 4
        self.calls.append((graph, len(prev)))
        return {"new_state": new, "log_probs": self._lp(prev, new)}


def core(fake: FakeLM | None = None, **config: Any) -> LMScheduler:
    return LMScheduler(fake or FakeLM(), EOS, V, decode_config(max_queue=100, **config))


def run(c: LMScheduler, limit: int = 500) -> None:
    for _ in range(limit):
        if not c.has_work():
            return
        for work in c.schedule():
            c.update(work, c.execute(work))
    raise AssertionError("the scheduler did not finish")


def collect() -> tuple[dict[int, list[int]], dict[int, str | None], Any]:
    tokens: dict[int, list[int]] = {}
    finish: dict[int, str | None] = {}

    def sink(events: list[TokenEvent] | BaseException) -> None:
        assert isinstance(events, list)
        for e in events:
            assert e.token is not None and finish.get(e.index) is None
            tokens.setdefault(e.index, []).append(e.token)
            finish[e.index] = e.finish

    return tokens, finish, sink


def probs_of(log_probs: np.ndarray, t: float) -> np.ndarray:
    p = np.exp((log_probs - log_probs.max()) / t)
    return p / p.sum()


def test_sampling_follows_each_rows_distribution_and_cuts() -> None:
    """An even grid of uniforms through one row's inverse CDF hits each token in proportion
    to its probability: the whole distribution, top-k, top-p (inside the candidates and a
    nucleus wider than them), greedy."""
    rng = np.random.default_rng(1)
    v = 200
    peaked = rng.normal(size=v).astype(np.float32) * 3
    flat = rng.normal(size=v).astype(np.float32) * 0.05  # a nucleus past the candidates
    n = 4000
    u = (np.arange(n) + 0.5) / n

    def freq(row: np.ndarray, t: float, k: int, p: float) -> np.ndarray:
        lp = np.repeat(row[None, :], n, 0)
        got = sample(lp, np.full(n, t, np.float32), np.full(n, k), np.full(n, p, np.float32), u)
        return np.bincount(got, minlength=v) / n

    for row, t in ((peaked, 1.0), (peaked, 0.7), (flat, 1.0)):
        assert np.abs(freq(row, t, 0, 1.0) - probs_of(row, t)).max() < 2e-3
    order = np.argsort(-peaked)
    top = np.zeros(v)
    top[order[:5]] = probs_of(peaked, 1.0)[order[:5]]
    assert np.abs(freq(peaked, 1.0, 5, 1.0) - top / top.sum()).max() < 2e-3
    for row in (peaked, flat):
        p = probs_of(row, 1.0)
        ranked = np.argsort(-p)
        before = np.cumsum(p[ranked]) - p[ranked]
        nucleus = ranked[before < 0.9]
        want = np.zeros(v)
        want[nucleus] = p[nucleus] / p[nucleus].sum()
        got = freq(row, 1.0, 0, 0.9)
        assert np.abs(got - want).max() < 2e-3
        assert set(np.flatnonzero(got)) <= set(nucleus.tolist())
    assert (flat.size and (np.cumsum(np.sort(probs_of(flat, 1.0))[::-1])
                           [NUCLEUS_CANDIDATES - 1] < 0.9))  # the wide case was exercised
    greedy = sample(np.stack([peaked, flat]), np.zeros(2, np.float32), np.zeros(2, np.int64),
                    np.ones(2, np.float32), np.full(2, 0.99))
    assert greedy.tolist() == [int(peaked.argmax()), int(flat.argmax())]


def test_a_rows_token_does_not_depend_on_its_batch() -> None:
    rng = np.random.default_rng(2)
    r = 48
    lp = rng.normal(size=(r, 300)).astype(np.float32) * rng.uniform(0.05, 4, size=(r, 1))
    temps = rng.choice([0.0, 0.5, 1.0, 1.7], size=r).astype(np.float32)
    top_k = rng.choice([0, 1, 7, 50, 299, 1000], size=r)
    top_p = rng.choice([1.0, 0.5, 0.9, 0.999], size=r).astype(np.float32)
    u = uniforms(sequence_keys(5, np.arange(r)), np.zeros(r, np.int64))
    batch = sample(lp, temps, top_k, top_p, u)
    alone = [int(sample(lp[i : i + 1], temps[i : i + 1], top_k[i : i + 1], top_p[i : i + 1],
                        u[i : i + 1])[0]) for i in range(r)]
    assert batch.tolist() == alone
    perm = rng.permutation(r)
    assert sample(lp[perm], temps[perm], top_k[perm], top_p[perm], u[perm]).tolist() == \
        batch[perm].tolist()


def test_uniforms_are_a_function_of_seed_index_and_position() -> None:
    keys = sequence_keys(7, np.arange(4))
    assert np.array_equal(keys, sequence_keys(7, np.arange(4)))
    assert len(set(keys.tolist())) == 4 and not np.array_equal(keys, sequence_keys(8, np.arange(4)))
    draws = np.stack([uniforms(keys, np.full(4, k)) for k in range(2000)])  # (2000, 4)
    assert ((draws >= 0) & (draws < 1)).all()
    assert np.array_equal(draws[10], uniforms(keys, np.full(4, 10)))
    assert np.abs(draws.mean(0) - 0.5).max() < 0.03  # not a grid test, a sanity check
    assert len(np.unique(draws)) == draws.size


def test_a_seed_gives_the_same_tokens_whatever_shares_the_batch() -> None:
    opts = GenerateOptions(max_new_tokens=30, temperature=1.3, top_k=12, top_p=0.95, seed=11,
                           n=3)
    alone_tokens, _, sink = collect()
    c = core()
    c.add([[1, 5, 6]], opts, sink)
    run(c)
    busy_tokens, busy_finish, sink = collect()
    c = core()
    others = [collect()[2] for _ in range(5)]
    for i, other in enumerate(others[:3]):  # before it, in its prefill batch, and after
        c.add([[1, 9 + i]] * 2, GenerateOptions(max_new_tokens=20 + i, temperature=0.9), other)
    c.add([[1, 5, 6]], opts, sink)
    for work in c.schedule():
        c.update(work, c.execute(work))
    for other in others[3:]:  # joining while it runs
        c.add([[1, 20], [1, 21, 22]], GenerateOptions(max_new_tokens=25, temperature=0.0),
              other)
    run(c)
    assert busy_tokens == alone_tokens and sorted(busy_tokens) == [0, 1, 2]
    assert len({tuple(t) for t in busy_tokens.values()}) > 1  # n samples differ
    assert all(f is not None for f in busy_finish.values())
    assert max(n for _, n in c.runtime.calls) > 3  # it did share steps  # type: ignore[attr-defined]


def test_sequences_finish_on_eos_or_length_and_leave_their_rows() -> None:
    c = core(FakeLM(eos_bias=2.0))  # eos among the likely tokens
    tokens, finish, sink = collect()
    c.add([[1, 4]] * 6, GenerateOptions(max_new_tokens=9, temperature=1.0, seed=3), sink)
    run(c)
    for i in range(6):
        assert finish[i] in ("eos", "length")
        assert (tokens[i][-1] == EOS) == (finish[i] == "eos")
        assert EOS not in tokens[i][:-1] and len(tokens[i]) <= 9
        assert finish[i] == "eos" or len(tokens[i]) == 9
    assert {"eos", "length"} <= set(finish.values())
    assert c.live_rows == 0 and not c.table
    assert c.generated == sum(len(t) - (t[-1] == EOS) for t in tokens.values())


def test_stopped_and_cancelled_sequences_leave_at_the_next_step() -> None:
    fake = FakeLM(eos_bias=-50.0)
    c = core(fake)
    tokens, finish, sink = collect()
    gone_tokens, _, gone_sink = collect()
    r = c.add([[1, 4]] * 3, GenerateOptions(max_new_tokens=50, temperature=0.0), sink)
    g = c.add([[1, 5]] * 2, GenerateOptions(max_new_tokens=50, temperature=0.0), gone_sink)
    for _ in range(3):
        for work in c.schedule():
            c.update(work, c.execute(work))
    c.stop(r.rid, 1)
    c.cancel(g.rid)
    seen = {i: len(t) for i, t in tokens.items()}
    gone_seen = sum(len(t) for t in gone_tokens.values())
    for work in c.schedule():  # the step after the stop and the cancel: 2 rows left
        c.update(work, c.execute(work))
    assert fake.calls[-1] == ("lm_step", 2)
    run(c)
    assert len(tokens[1]) == seen[1] and finish[1] is None  # nothing after its stop
    assert sum(len(t) for t in gone_tokens.values()) == gone_seen
    assert len(tokens[0]) == len(tokens[2]) == 50 and finish[0] == "length"
    assert not c.table and c.live_rows == 0


def test_lm_refuses_by_admission_rate_and_service_time() -> None:
    c = core(max_admit=1, max_queue_wait_s=0.5)
    opts = GenerateOptions(max_new_tokens=4, temperature=0.0)
    c.admit_cost.observe(1, 0.2)  # one prompt admitted per 0.2 s while others waited
    c.service_cost.observe(1, 0.05)
    far = time.monotonic() + 60
    c.add([[1, 5]], opts, None, far)
    with pytest.raises(QueueFull, match="left"):
        c.add([[1, 6]], opts, None, time.monotonic() + 0.1)
    c.add([[1, 5]] * 2, opts, None, far)  # 3 waiting: 0.6 s ahead of the next
    with pytest.raises(QueueFull, match="expected queue wait") as refused:
        c.add([[1, 7]], opts, None, far)
    assert refused.value.retry_after is not None and refused.value.retry_after >= 0.5
    run(c)
    assert c.queued == 0 and not c.table


def test_an_idle_lm_refuses_by_its_old_estimate_and_measures_again() -> None:
    """No free pass that ends in a missed deadline (a 504): the stale estimate still refuses,
    and the refused prompts are generated for no one, so the next request meets a fresh one."""
    fake = FakeLM()
    c = core(fake)
    opts = GenerateOptions(max_new_tokens=5, temperature=0.0)
    c.service_cost.observe(1, 10.0)  # a slow spell: 10 s a request...
    c.service_cost.observed_at -= 5  # ...measured 5 s ago
    tokens, _, sink = collect()
    with pytest.raises(QueueFull, match="left"):
        c.add([[1, 5], [1, 6]], opts, sink, time.monotonic() + 1)
    assert c.has_work() and c.queued == 2  # the probe, which no one waits for
    run(c)
    assert fake.calls[0] == ("prefill", 2) and not tokens  # computed, sent to no one
    assert c.service_cost.per_unit is not None and c.service_cost.per_unit < 10
    assert not c.service_cost.stale()
    c.add([[1, 5]], opts, sink, time.monotonic() + 1)  # now it fits
    run(c)
    assert len(tokens[0]) == 5


def test_an_idle_lm_probes_with_scores_too() -> None:
    c = core()
    c.service_cost.observe(1, 10.0)
    c.service_cost.observed_at -= 5
    with pytest.raises(QueueFull):
        c.add([[1, 5, 6]], None, None, time.monotonic() + 1)
    run(c)  # the texts are scored for no one (no futures to answer)
    assert c.service_cost.per_unit is not None and c.service_cost.per_unit < 10


def test_bias_penalties_and_ignore_eos_tune_only_their_rows() -> None:
    rng = np.random.default_rng(4)
    lp = rng.normal(size=(4, 10)).astype(np.float32)
    counts = np.empty(4, dtype=object)
    counts[1] = {3: 2, 5: 1}
    opts = GenerateOptions(logit_bias=((7, -100.0), (2, 1.5)), frequency_penalty=0.5,
                           presence_penalty=0.25, ignore_eos=True)
    out = tuned(lp, [(1, 3, opts)], counts, EOS)
    assert np.array_equal(out[[0, 3]], lp[[0, 3]]) and out is not lp
    want = lp[1].copy()
    want[7] -= 100
    want[2] = -np.inf  # eos (2) masked after its bias
    want[3] -= 2 * 0.5 + 0.25
    want[5] -= 1 * 0.5 + 0.25
    assert np.allclose(out[1], want)
    assert out[2, 7] == lp[2, 7] - 100 and out[2, 2] == -np.inf  # no counts: bias and eos
    assert GenerateOptions(logit_bias=[[7, 1]]).logit_bias == ((7, 1.0),)  # type: ignore[arg-type]


def test_tuned_requests_draw_what_they_ask_and_others_do_not_change() -> None:
    plain = GenerateOptions(max_new_tokens=12, temperature=0.0)
    alone, _, sink = collect()
    c = core(FakeLM(eos_bias=3.0))
    c.add([[1, 4]], plain, sink)
    run(c)
    busy, _, sink = collect()
    forced, forced_finish, forced_sink = collect()
    penalized, _, penalized_sink = collect()
    c = core(FakeLM(eos_bias=3.0))
    c.add([[1, 4]], plain, sink)
    c.add([[1, 4]], GenerateOptions(max_new_tokens=12, temperature=0.0, ignore_eos=True,
                                    logit_bias=((9, 100.0),)), forced_sink)
    c.add([[1, 4]], GenerateOptions(max_new_tokens=12, temperature=0.0,
                                    frequency_penalty=2.0, ignore_eos=True), penalized_sink)
    run(c)
    assert busy == alone  # a tuned neighbour changes nothing of an untuned row
    assert forced[0] == [9] * 12 and forced_finish[0] == "length"
    assert EOS not in penalized[0] and len(penalized[0]) == 12
    assert max(np.bincount(penalized[0])) < 12


def test_a_score_requests_best_tokens_come_from_its_prefill() -> None:
    import asyncio

    from seqserve.service.scheduling.lm import LMLoop

    fake = FakeLM()
    row = [1, 5, 6, 7]

    async def scenario() -> tuple[Any, Any]:
        loop = LMLoop(fake, EOS, V, decode_config(max_queue=100))  # type: ignore[arg-type]
        loop.start()
        try:
            (plain,) = loop.score([row])
            (topped,) = loop.score([row], top=3)
            return await plain, await topped
        finally:
            await loop.drain(1.0, RuntimeError("stopped"))

    a, b = asyncio.run(scenario())
    assert len(a.value) == 1 and len(b.value) == 3
    lps, ids, tops = b.value
    assert np.array_equal(lps, a.value[0]) and ids.shape == tops.shape == (3, 3)
    table = fake.run("prefill", {"input_ids": np.array([row]), "lengths": np.array([4])})
    for j in range(3):
        want = np.argsort(-table["log_probs"][0, j], kind="stable")[:3]
        assert ids[j].tolist() == want.tolist()
        assert tops[j].tolist() == pytest.approx(table["log_probs"][0, j, want].tolist())
        assert lps[j] <= tops[j, 0]


def test_each_sequences_first_event_carries_its_requests_queue_wait() -> None:
    """The first event of every sequence says how long its request waited for admission (a
    generate answer's Server-Timing `queue`); later events say nothing."""
    now = [10.0]
    c = LMScheduler(FakeLM(), EOS, V, decode_config(max_queue=100, max_admit=1),
                    clock=lambda: now[0])
    seen: dict[str, list[TokenEvent]] = {"a": [], "b": []}
    options = GenerateOptions(max_new_tokens=3, temperature=1.0, seed=1, n=2)
    c.add([[1, 4]], options, lambda events: seen["a"].extend(events))  # type: ignore[union-attr]
    now[0] = 10.5
    c.add([[1, 5]], options, lambda events: seen["b"].extend(events))  # type: ignore[union-attr]
    for _ in range(50):
        if not c.has_work():
            break
        now[0] += 0.25
        for work in c.schedule():
            c.update(work, c.execute(work))
    first = {name: {} for name in seen}  # type: dict[str, dict[int, TokenEvent]]
    for name, events in seen.items():
        for e in events:
            first[name].setdefault(e.index, e)
        assert set(first[name]) == {0, 1}  # n = 2 sequences
        assert all(e.queued == 0 for e in events if first[name][e.index] is not e)
    queued_a = [e.queued for e in first["a"].values()]
    queued_b = [e.queued for e in first["b"].values()]
    assert queued_a == [pytest.approx(0.75)] * 2  # added at 10.0, admitted at 10.75
    assert queued_b == [pytest.approx(0.5)] * 2  # added at 10.5, one admission a schedule
