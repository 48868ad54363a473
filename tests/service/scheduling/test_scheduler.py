"""The decode scheduler without an event loop: schedule, execute, update by hand; one status per
request; admission budget, cancellation, request-level mode, faults and groups."""

from __future__ import annotations

import numpy as np
import pytest
from fake_translator import FakeTranslator
from reference_search import reference_beam_search
from service_fakes import decode_config

from seqserve.service.core.errors import InferenceFailed, QueueFull, ShuttingDown
from seqserve.service.scheduling.scheduler import DecodeScheduler, Outcome
from seqserve.service.scheduling.search import SearchOptions, max_steps
from seqserve.service.scheduling.work import Decoded, EncodeWork, Status, StepWork

SOURCES = [[5, 6, 7], [9, 4, 11, 12, 13, 8], [14], [15, 16, 17, 18, 19, 20], [7, 7, 7, 7]]


def make_core(fake: FakeTranslator | None = None, **overrides: object) -> DecodeScheduler:
    fake = fake or FakeTranslator()
    return DecodeScheduler(fake, fake.limits, decode_config(**overrides))


def run_to_end(core: DecodeScheduler, limit: int = 500) -> dict[int, Outcome]:
    outcomes: dict[int, Outcome] = {}
    for _ in range(limit):
        if not core.has_work():
            return outcomes
        outcomes.update((o.request.rid, o) for o in core.step())
    raise AssertionError("the core did not finish")


def test_statuses_follow_one_request_through() -> None:
    core = make_core()
    (r,) = core.add([SOURCES[1]], SearchOptions(beam_size=3))
    assert r.status is Status.WAITING and core.table == {r.rid: r} and core.queued == 1
    work = core.schedule()
    assert [type(w) for w in work] == [EncodeWork] and r.status is Status.ENCODING
    assert core.queued == 0
    assert core.update(work[0], core.execute(work[0])) == []
    assert r.status is Status.DECODING and core.live_rows == 0  # encoded, not placed yet
    work = core.schedule()
    assert [type(w) for w in work] == [StepWork] and core.live_rows == 1
    outcomes = core.update(work[0], core.execute(work[0]))
    while not outcomes:
        outcomes = core.step()
    assert outcomes[0].request is r and r.status is Status.FINISHED
    assert isinstance(outcomes[0].result, Decoded) and outcomes[0].result.steps > 1
    assert core.table == {} and core.live_rows == 0 and not core.has_work()


def test_core_equals_reference_without_an_event_loop() -> None:
    fake = FakeTranslator()
    core = make_core(fake, max_live_hypotheses=12, max_admit=2)
    opts = SearchOptions(beam_size=4, n_best=2, length_penalty=0.6, coverage_penalty=0.2)
    requests = core.add(SOURCES, opts)
    outcomes = run_to_end(core)
    for src, r in zip(SOURCES, requests, strict=True):
        decoded = outcomes[r.rid].result
        assert isinstance(decoded, Decoded)
        memory, state = fake.encode_one(src)
        ref = reference_beam_search(fake.step_one, memory, state, bos=2, eos=3,
                                    max_len=max_steps(opts, len(src), fake.limits), beam=4,
                                    n_best=2, alpha=0.6, beta=0.2)
        assert [h.token_ids for h in decoded.hypotheses] == [tuple(x.tokens) for x in ref]
    steps = [rows for graph, rows in fake.calls if graph == "decoder_step"]
    assert max(steps) <= 12  # the live-hypothesis budget holds


def test_cancel_in_every_status() -> None:
    core = make_core()
    opts = SearchOptions(beam_size=2, min_length=20, max_length=30)
    waiting, encoding, decoding = (core.add([s], opts)[0] for s in SOURCES[:3])
    core.step()  # all three encoded (one admission batch)
    core.step()  # placed: their first step ran
    assert decoding.status is Status.DECODING and core.live_rows > 0
    late = core.add([SOURCES[3]], opts)[0]
    core.cancel(late.rid)
    assert late.status is Status.ABORTED and late.rid not in core.table and core.queued == 0
    for r in (waiting, encoding, decoding):
        core.cancel(r.rid)
    core.schedule()  # evicts the cancelled rows of the idle group
    assert core.live_rows == 0 and core.table == {}


def test_queue_bound_and_closing() -> None:
    core = make_core(max_queue=3)
    core.add(SOURCES[:3], SearchOptions())
    with pytest.raises(QueueFull):
        core.add(SOURCES[3:4], SearchOptions())
    core.closing = True
    with pytest.raises(ShuttingDown):
        core.add(SOURCES[:1], SearchOptions())


def test_request_level_mode_admits_after_the_batch() -> None:
    fake = FakeTranslator()
    core = make_core(fake, continuous=False, max_admit=2)
    core.add(SOURCES, SearchOptions(beam_size=2))
    run_to_end(core)
    encoder_rows = [rows for graph, rows in fake.calls if graph == "encoder"]
    assert encoder_rows == [2, 2, 1]
    assert max(rows for graph, rows in fake.calls if graph == "decoder_step") <= 4


def _encoder_batches(core: DecodeScheduler, arrivals: dict[int, int], steps: int
                     ) -> list[tuple[int, int]]:
    """Run `core` for `steps` schedules, adding `arrivals[i]` one-token sources before the
    i-th: the (schedule, sources) of every encoder batch it launched."""
    batches = []
    opts = SearchOptions(beam_size=2, min_length=40, max_length=50)
    for i in range(steps):
        if arrivals.get(i):
            core.add([[5 + j % 9] for j in range(arrivals[i])], opts)
        for work in core.schedule():
            if isinstance(work, EncodeWork):
                batches.append((i, len(work.requests)))
            core.update(work, core.execute(work))
        core.settle()
    return batches


def test_arrivals_wait_for_a_fuller_encoder_batch_only_while_others_decode() -> None:
    """`admit_steps`: sources that arrive while a group decodes, at least one a schedule on
    average (`arrivals`), are held for up to that many steps, or until `max_admit` wait, and
    are then encoded in one batch; sparser arrivals, nothing decoding, or `admit_steps` 0:
    encoded at the next step."""
    dense = {i: 2 for i in range(12)}  # two sources before each of the first 12 schedules
    assert _encoder_batches(make_core(max_admit=8, admit_steps=0), dense, 20) == [
        (i, 2) for i in range(12)]
    # the average passes one a schedule at the third (0.5, 0.875, 1.16): from then on held
    # two schedules (2, 3 -> 4), six at once; the last two also after the arrivals stop
    assert _encoder_batches(make_core(max_admit=8, admit_steps=2), dense, 20) == [
        (0, 2), (1, 2), (4, 6), (7, 6), (10, 6), (13, 2)]
    # four waiting fill a batch at once
    assert _encoder_batches(make_core(max_admit=4, admit_steps=2), dense, 20) == [
        (0, 2), (1, 2), (3, 4), (5, 4), (7, 4), (9, 4), (11, 4)]
    sparse = {0: 1, 3: 1, 4: 1, 5: 1, 12: 2, 20: 1}  # a held source would wait for no one
    assert _encoder_batches(make_core(max_admit=4, admit_steps=2), sparse, 30) == \
        _encoder_batches(make_core(max_admit=4, admit_steps=0), sparse, 30) == [
        (0, 1), (3, 1), (4, 1), (5, 1), (12, 2), (20, 1)]
    idle = make_core(max_admit=8, admit_steps=5)  # four at once (the average: 1.0), but
    assert _encoder_batches(idle, {0: 4}, 1) == [(0, 4)]  # nothing decodes yet


def test_faults_fail_only_their_requests() -> None:
    def fail_if(graph: str, inputs: dict[str, np.ndarray]) -> bool:
        if graph == "encoder":
            return bool((inputs["src_ids"] == 14).any())
        return bool((inputs["prev_ids"] == 21).any())

    core = make_core(FakeTranslator(fail_if=fail_if))
    requests = core.add(SOURCES, SearchOptions(beam_size=1))
    outcomes = run_to_end(core)
    failed = [r for r in requests if isinstance(outcomes[r.rid].result, InferenceFailed)]
    assert requests[2] in failed and len(failed) < len(requests)  # 14: poisoned source
    for r in requests:
        result = outcomes[r.rid].result
        if isinstance(result, Decoded):
            assert 21 not in result.hypotheses[0].token_ids[:-1]
    assert core.table == {} and core.live_rows == 0


def test_two_groups_take_turns_and_stay_balanced() -> None:
    fake = FakeTranslator()
    core = make_core(fake, groups=2, max_admit=1)
    opts = SearchOptions(beam_size=3, min_length=6, max_length=10)
    core.add(SOURCES[:2], opts)
    core.step()  # first encoded
    work = core.schedule()  # first placed and stepped, second admitted
    assert sorted(type(w).__name__ for w in work) == ["EncodeWork", "StepWork"]
    for w in work:
        core.update(w, core.execute(w))
    work = core.schedule()  # the second joins the other (empty) group: both step
    assert [w.index for w in work if isinstance(w, StepWork)] == [0, 1]
    assert [g.rows for g in core.groups] == [3, 1]


def test_abort_and_fail_all_empty_the_table() -> None:
    core = make_core()
    requests = core.add(SOURCES, SearchOptions(beam_size=2, min_length=10))
    core.step()
    core.step()
    aborted = [o.request for o in core.abort(ShuttingDown("stopped"))]
    assert {r.rid for r in aborted} == {r.rid for r in requests}
    assert all(r.status is Status.ABORTED for r in requests)
    core.step()
    assert core.live_rows == 0 and core.queued == 0
    core2 = make_core()
    core2.add(SOURCES, SearchOptions())
    core2.step()
    outcomes = core2.fail_all(RuntimeError("bug"))
    assert len(outcomes) == len(SOURCES) and core2.table == {} and not core2.has_work()
    assert all(isinstance(o.result, InferenceFailed) for o in outcomes)


def test_malformed_step_outputs_fail_only_that_group() -> None:
    class Truncating(FakeTranslator):
        """decoder_step drops the attention output of steps over more than 2 rows."""

        def run(self, graph: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            out = super().run(graph, inputs)
            if graph == "decoder_step" and len(inputs["prev_ids"]) > 2:
                del out["attention"]
            return out

    core = make_core(Truncating(), groups=2, max_admit=1)
    bad = core.add([SOURCES[0]], SearchOptions(beam_size=3))[0]
    good = core.add([SOURCES[1]], SearchOptions(beam_size=1, max_length=3))[0]
    outcomes = run_to_end(core)
    assert isinstance(outcomes[bad.rid].result, InferenceFailed)
    assert isinstance(outcomes[good.rid].result, Decoded)
    assert core.table == {} and core.live_rows == 0
