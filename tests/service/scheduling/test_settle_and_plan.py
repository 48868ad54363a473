"""Issue 38: a finished request's answer is built by `settle`, after the driver launched the
next steps (the decoder does not wait for it), and is the same answer; and `plan_batch`
puts rows of equal length in one batch when batches cost nothing fixed."""

from __future__ import annotations

import asyncio

from fake_translator import FakeTranslator
from service_fakes import decode_config

from seqserve.service.scheduling.batcher import plan_batch
from seqserve.service.scheduling.decoding import DecodeLoop
from seqserve.service.scheduling.scheduler import DecodeScheduler
from seqserve.service.scheduling.search import SearchOptions
from seqserve.service.scheduling.work import Decoded, EncodeWork, Status, StepWork

SOURCES = [[5, 6, 7], [9, 4, 11, 12, 13, 8], [14], [15, 16, 17, 18, 19, 20], [7, 7, 7, 7]]


def test_a_finished_request_is_answered_by_settle_after_the_next_step_is_out() -> None:
    fake = FakeTranslator()
    core = DecodeScheduler(fake, fake.limits, decode_config())
    short, long = core.add([[14], [15, 16, 17, 18, 19, 20]],
                           SearchOptions(beam_size=2, max_length=2))
    work = core.schedule()
    assert [type(w) for w in work] == [EncodeWork]
    assert core.update(work[0], core.execute(work[0])) == [] and core.settle() == []
    finished = []
    while not finished:
        (step,) = core.schedule()
        assert isinstance(step, StepWork)
        assert core.update(step, core.execute(step)) == []  # answers wait for settle
        if any(r.status is Status.FINISHED for r in (short, long)):
            assert core.has_work()
            core.schedule()  # the next step would be launched here
            finished = core.settle()
    assert {o.request.rid for o in finished} <= {short.rid, long.rid}
    assert all(isinstance(o.result, Decoded) and o.result.hypotheses for o in finished)
    assert core.settle() == []


def test_settled_answers_equal_a_loop_run_and_the_sync_step() -> None:
    opts = SearchOptions(beam_size=3, n_best=2, length_penalty=0.6, coverage_penalty=0.2,
                         return_attention=True)

    async def through_the_loop() -> list[Decoded]:
        fake = FakeTranslator()
        async with DecodeLoop(fake, fake.limits, decode_config(groups=2)) as loop:
            return await loop.translate(SOURCES, opts)

    looped = asyncio.run(through_the_loop())
    fake = FakeTranslator()
    core = DecodeScheduler(fake, fake.limits, decode_config())
    requests = core.add(SOURCES, opts)
    answers = {}
    while core.has_work():
        answers.update((o.request.rid, o.result) for o in core.step())
    for r, d in zip(requests, looped, strict=True):
        assert [h.token_ids for h in answers[r.rid].hypotheses] == \
            [h.token_ids for h in d.hypotheses]
        assert [h.score for h in answers[r.rid].hypotheses] == [h.score for h in d.hypotheses]


def test_fail_all_answers_the_finished_ones_first() -> None:
    fake = FakeTranslator()
    core = DecodeScheduler(fake, fake.limits, decode_config())
    core.add(SOURCES, SearchOptions(beam_size=2, max_length=1))
    settled = None
    while settled is None:
        for w in core.schedule():
            core.update(w, core.execute(w))
        if core._settling:
            settled = core.fail_all(RuntimeError("bug"))
    answered = [o for o in settled if isinstance(o.result, Decoded)]
    assert answered and not core.table and not core.has_work()


def test_equal_lengths_share_a_batch_without_a_fixed_cost() -> None:
    assert plan_batch([1] * 50, 0, 32, 32 * 256, 0.0) == (0, 32)
    assert plan_batch([1] * 50, 40, 32, 32 * 256, 0.0) == (32, 50)
    assert plan_batch([3] * 8, 2, 32, 1000, 0.0) == (0, 8)
    assert plan_batch([1] * 50, 0, 32, 32 * 256, 64.0) == (0, 32)
    assert plan_batch([1, 1, 2, 5, 9], 0, 32, 8192, 0.0) == (0, 2)  # padding still counts
