"""The decode scheduler over the numpy fake runtime: equals the reference search, batch
invariance, cancellation, overload and fault isolation."""

from __future__ import annotations

import asyncio
import random

import numpy as np
import pytest
from fake_translator import FakeTranslator
from reference_search import reference_beam_search
from service_fakes import decode_config

from seqserve.service.core.errors import InferenceFailed, QueueFull
from seqserve.service.scheduling.decoding import DecodeLoop
from seqserve.service.scheduling.search import Hypothesis, SearchOptions, max_steps

SOURCES = [
    [5, 6, 7],
    [9, 4, 11, 12, 13, 8],
    [14],
    [15, 16, 17, 18, 19, 20, 21, 22, 23, 5],
    [7, 7, 7, 7],
    [10, 20],
] + [[int(t) for t in np.random.default_rng(i).integers(4, 24, size=1 + i % 9)] for i in range(8)]

OPTION_SETS = [
    SearchOptions(beam_size=1),
    SearchOptions(beam_size=5),
    SearchOptions(beam_size=5, n_best=5),
    SearchOptions(beam_size=5, n_best=3, length_penalty=1.0),
    SearchOptions(beam_size=4, n_best=2, length_penalty=0.6, coverage_penalty=0.3),
    SearchOptions(beam_size=3, min_length=6, no_repeat_ngram_size=2, length_penalty=0.2),
    SearchOptions(beam_size=1, min_length=4, no_repeat_ngram_size=1),
    SearchOptions(beam_size=2, n_best=2, no_repeat_ngram_size=1, length_penalty=0.5),
    SearchOptions(beam_size=5, max_length=4),
    SearchOptions(beam_size=2, max_length_ratio=0.5),
]


def make_loop(fake: FakeTranslator | None = None, **overrides: object) -> DecodeLoop:
    fake = fake or FakeTranslator()
    return DecodeLoop(fake, fake.limits, decode_config(**overrides))


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(asyncio.wait_for(coro, timeout=60))


async def _translate_all(loop: DecodeLoop, jobs: list[tuple[list[int], SearchOptions]],
                         ) -> list[list[Hypothesis]]:
    async with loop:
        outs = await asyncio.gather(*(loop.translate([src], o) for src, o in jobs))
    return [o[0].hypotheses for o in outs]


@pytest.mark.parametrize("options", OPTION_SETS, ids=lambda o: repr(o)[13:60])
def test_decode_loop_equals_reference_search(options: SearchOptions) -> None:
    fake = FakeTranslator()
    groups = 1 + OPTION_SETS.index(options) % 2  # half the option sets with two groups
    got = run(_translate_all(make_loop(fake, groups=groups),
                             [(s, options) for s in SOURCES]))
    for src, hyps in zip(SOURCES, got, strict=True):
        memory, state = fake.encode_one(src)
        ref = reference_beam_search(
            fake.step_one, memory, state, bos=2, eos=3,
            max_len=max_steps(options, len(src), fake.limits), beam=options.beam_size,
            n_best=options.n_best, alpha=options.length_penalty,
            beta=options.coverage_penalty, min_length=options.min_length,
            no_repeat=options.no_repeat_ngram_size)
        assert [h.token_ids for h in hyps] == [tuple(r.tokens) for r in ref]
        np.testing.assert_allclose([h.score for h in hyps], [r.score for r in ref], rtol=1e-9)


def test_nbest_sorted_and_constraints_hold() -> None:
    opts = SearchOptions(beam_size=5, n_best=5, min_length=3, no_repeat_ngram_size=2,
                         length_penalty=0.8)
    for hyps in run(_translate_all(make_loop(), [(s, opts) for s in SOURCES])):
        scores = [h.score for h in hyps]
        assert len(hyps) == 5 and scores == sorted(scores, reverse=True)
        for h in hyps:
            body = h.token_ids[:-1] if h.ended else h.token_ids
            assert len(body) >= 3 and 3 not in body
            bigrams = list(zip(h.token_ids, h.token_ids[1:], strict=False))
            assert len(bigrams) == len(set(bigrams))


@pytest.mark.parametrize("calls", ["threads", "loop"])
def test_results_identical_alone_and_concurrent(calls: str) -> None:
    """Alone or batched with others, on lane threads or on the event loop's own thread, a
    request gets the same answer."""
    rng = random.Random(0)
    jobs = [(src, rng.choice(OPTION_SETS)) for src in SOURCES * 4]
    jobs += [(src, SearchOptions(beam_size=1, temperature=0.9, top_p=0.9, seed=i))
             for i, src in enumerate(SOURCES)]
    alone = [run(_translate_all(make_loop(), [job]))[0] for job in jobs]
    rng.shuffle(idx := list(range(len(jobs))))
    for groups in (1, 3):
        fake = FakeTranslator()
        loop = make_loop(fake, max_live_hypotheses=40, groups=groups, runtime_calls=calls)
        together = run(_translate_all(loop, [jobs[i] for i in idx]))
        for pos, i in enumerate(idx):
            assert [h.token_ids for h in together[pos]] == [h.token_ids for h in alone[i]]
        most = max(rows for graph, rows in fake.calls if graph == "decoder_step")
        assert most > 10  # batched


@pytest.mark.parametrize(("groups", "calls"), [(1, "threads"), (2, "threads"), (1, "loop")])
def test_continuous_batching_admits_new_requests_between_steps(groups: int, calls: str) -> None:
    """A request submitted while another decodes joins it at the next step (with the steps
    on the event loop's thread too: the loop takes requests between steps)."""
    fake = FakeTranslator(delay=0.002)
    loop = make_loop(fake, groups=groups, runtime_calls=calls)
    long_opts = SearchOptions(beam_size=4, min_length=20, max_length=30)

    async def scenario() -> None:
        async with loop:
            first = asyncio.ensure_future(loop.translate([SOURCES[1]], long_opts))
            while loop.stats.steps < 3:
                await asyncio.sleep(0.001)
            second = await loop.translate([SOURCES[0]], SearchOptions(beam_size=1))
            assert not first.done()  # joined mid-flight, answered before the long one
            await first
            assert second[0].hypotheses[0].token_ids

    run(scenario())
    rows = [r for g, r in fake.calls if g == "decoder_step"]
    if groups == 1:
        assert 5 in rows  # 4 beams + 1 greedy row in one step
    else:  # the greedy request got the other group: the two take turns
        assert any(rows[i : i + 4] == [4, 1, 4, 1] for i in range(len(rows)))


@pytest.mark.parametrize("continuous", [True, False])
def test_request_level_mode_waits_for_the_batch(continuous: bool) -> None:
    fake = FakeTranslator()
    loop = make_loop(fake, continuous=continuous, max_admit=2)
    jobs = [(s, SearchOptions(beam_size=2)) for s in SOURCES]
    results = run(_translate_all(loop, jobs))
    assert all(results)
    encoder_calls = [r for g, r in fake.calls if g == "encoder"]
    assert len(encoder_calls) == (len(SOURCES) + 1) // 2 and max(encoder_calls) == 2
    most_rows = max(r for g, r in fake.calls if g == "decoder_step")
    assert (most_rows > 4) if continuous else (most_rows <= 4)  # 2 requests x beam 2


def test_cancelled_request_frees_rows() -> None:
    fake = FakeTranslator(delay=0.002)
    loop = make_loop(fake)
    opts = SearchOptions(beam_size=5, min_length=35, max_length=40)

    async def scenario() -> None:
        async with loop:
            task = asyncio.ensure_future(loop.translate([SOURCES[3]], opts))
            while loop.live_rows < 5:
                await asyncio.sleep(0.001)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            for _ in range(200):
                if loop.live_rows == 0:
                    break
                await asyncio.sleep(0.002)
            assert loop.live_rows == 0
            steps = loop.stats.steps
            assert steps < 35  # it did not run to its min length
            out = await loop.translate([SOURCES[0]], SearchOptions(beam_size=1))
            assert out[0].hypotheses[0].token_ids

    run(scenario())


def test_overload_gives_queue_full_and_cap_queues() -> None:
    fake = FakeTranslator(delay=0.002)
    loop = make_loop(fake, max_live_hypotheses=5, max_queue=3)
    opts = SearchOptions(beam_size=5, min_length=5)

    async def scenario() -> None:
        async with loop:
            first = asyncio.ensure_future(loop.translate([SOURCES[0]], opts))
            await asyncio.sleep(0.01)
            queued = asyncio.ensure_future(loop.translate(SOURCES[1:4], opts))
            await asyncio.sleep(0)
            with pytest.raises(QueueFull):
                await loop.translate([SOURCES[4]], opts)
            await asyncio.gather(first, queued)
            assert loop.live_rows == 0

    run(scenario())
    assert max(r for g, r in fake.calls if g == "decoder_step") <= 5


@pytest.mark.parametrize(("groups", "calls"), [(1, "threads"), (2, "threads"), (1, "loop")])
def test_fault_fails_only_the_affected_request(groups: int, calls: str) -> None:
    poison = 23

    def fail_if(graph: str, inputs: dict[str, np.ndarray]) -> bool:
        if graph == "encoder":
            return bool((inputs["src_ids"] == poison).any())
        return bool((inputs["prev_ids"] == 21).any())  # decoder fault on one token

    opts = SearchOptions(beam_size=1)
    clean = run(_translate_all(make_loop(), [(s, opts) for s in SOURCES]))
    faulty = FakeTranslator(fail_if=fail_if)

    async def scenario() -> list[object]:
        async with make_loop(faulty, groups=groups, runtime_calls=calls) as loop:
            return await asyncio.gather(*(loop.translate([s], opts) for s in SOURCES),
                                        return_exceptions=True)

    got = run(scenario())
    failed = 0
    for src, hyps, out in zip(SOURCES, clean, got, strict=True):
        emits_21 = 21 in hyps[0].token_ids[:-1]
        if poison in src or emits_21:
            assert isinstance(out, InferenceFailed)
            failed += 1
        else:
            assert [h.token_ids for h in out[0].hypotheses] == [  # type: ignore[index]
                h.token_ids for h in hyps]
    assert failed >= 1


def test_sampling_is_seeded_and_top_k_one_is_greedy() -> None:
    greedy = run(_translate_all(make_loop(), [(s, SearchOptions(beam_size=1))
                                                for s in SOURCES]))
    top1 = run(_translate_all(make_loop(), [(s, SearchOptions(beam_size=1, top_k=1))
                                              for s in SOURCES]))
    assert [h[0].token_ids for h in top1] == [h[0].token_ids for h in greedy]
    hot = SearchOptions(beam_size=1, temperature=1.5, seed=7)
    a = run(_translate_all(make_loop(), [(s, hot) for s in SOURCES]))
    b = run(_translate_all(make_loop(), [(s, hot) for s in SOURCES]))
    assert [h[0].token_ids for h in a] == [h[0].token_ids for h in b]
    other = SearchOptions(beam_size=1, temperature=1.5, seed=8)
    c = run(_translate_all(make_loop(), [(s, other) for s in SOURCES * 3]))
    assert [h[0].token_ids for h in c[: len(SOURCES)]] != [h[0].token_ids for h in a]


def test_abort_fails_pending_work_and_stop_returns() -> None:
    from seqserve.service.core.errors import ShuttingDown

    fake = FakeTranslator(delay=0.002)
    loop = make_loop(fake, max_live_hypotheses=5)
    opts = SearchOptions(beam_size=5, min_length=35, max_length=40)

    async def scenario() -> None:
        loop.start()
        running = asyncio.ensure_future(loop.translate([SOURCES[0]], opts))
        queued = asyncio.ensure_future(loop.translate([SOURCES[1]], opts))
        while loop.live_rows < 5:
            await asyncio.sleep(0.001)
        loop.abort(ShuttingDown("stopped"))
        for task in (running, queued):
            with pytest.raises(ShuttingDown):
                await task
        await asyncio.wait_for(loop.stop(), 5)
        with pytest.raises(ShuttingDown):
            await loop.translate([SOURCES[2]], opts)

    run(scenario())


class _ExtraEncoderRow(FakeTranslator):
    """An encoder that returns one more (garbage) row than it was given sources."""

    def _encoder(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        out = super()._encoder(inputs)
        return {k: np.concatenate([v, np.full_like(v[:1], 9)]) for k, v in out.items()}


def test_an_encoder_that_returns_an_extra_row_decodes_as_before() -> None:
    """An encoder batch joins its group without copies only where the encoder's arrays have
    one row per request; one with an extra row is decoded as before (its rows taken by
    index), to the same answers."""
    jobs = [(src, SearchOptions(beam_size=3, n_best=2)) for src in SOURCES]
    want = run(_translate_all(make_loop(), jobs))
    got = run(_translate_all(make_loop(_ExtraEncoderRow()), jobs))
    assert got == want
