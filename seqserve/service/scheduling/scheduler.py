"""The decode scheduler's core: a synchronous, model-free scheduler (vLLM `DecodeScheduler.step`).

    work = core.schedule()            # evict, place, admit; what to run now
    result = core.execute(item)       # encoder or decoder_step calls (any thread)
    outcomes = core.update(item, result)   # beam bookkeeping, answers, failures

`core.step()` does the three in a row; the asyncio decode loop (decoding.py) runs `execute` off
the event loop and overlaps work items. Every live request is in one table with one status
(work.Status): WAITING (in the admission queue), ENCODING (its encoder batch runs),
DECODING (encoded: waiting for a group, or in one), then FINISHED or ABORTED as it leaves.

- schedule(): evict cancelled requests from idle groups; place encoded requests into the
  idle group with the fewest rows; admit waiting requests while the live-hypothesis budget
  allows (each reserves `beam_size` rows) as one encoder batch, unless one is running; and
  launch a decoder step for every idle group with rows.
- update(): an encoder batch's requests become DECODING (to be placed); a step's outputs go
  through the group's vectorised beam search (beam_search.py), finished requests are answered and
  leave with their rows.

With `DecodeConfig.groups` G > 1 the requests are split into G groups whose steps take turns
on the runtime, so one group's update overlaps another's step. `continuous=False` admits a
batch only when the previous one has completely finished (request-level batching).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from seqserve.service.core.errors import InferenceFailed, QueueFull, ShuttingDown
from seqserve.service.runtimes.base import Runtime
from seqserve.service.scheduling.base import (
    Admission,
    BatchCost,
    CostEstimate,
    NullObserver,
    Observer,
    WaitMargin,
    admit_by_wait,
)
from seqserve.service.scheduling.finished import Found
from seqserve.service.scheduling.group import DecodeGroup
from seqserve.service.scheduling.loop import Outcome, RequestTable, Status
from seqserve.service.scheduling.search import DecodeLimits, Hypothesis, SearchOptions, max_steps
from seqserve.service.scheduling.work import (
    DecodeConfig,
    Decoded,
    EncodeResult,
    EncodeWork,
    Request,
    StepResult,
    StepStats,
    StepWork,
    Work,
    execute,
)

ARRIVALS_WEIGHT = 0.25
"""The newest schedule's weight in `DecodeScheduler.arrivals` (the average follows a change
of load within a few schedules, a few decoder steps)."""


@dataclass(eq=False)
class _Encoded:
    """An encoder batch's requests waiting for a group (all DECODING)."""

    requests: list[Request]
    memory: np.ndarray  # (n, S, D)
    state: np.ndarray  # (n, state_dim)
    lengths: np.ndarray  # (n,)
    keys: np.ndarray | None  # (n, S, A): the encoder's projected attention keys, if any


class DecodeScheduler(RequestTable[Request]):
    """See module doc."""

    def __init__(self, runtime: Runtime, limits: DecodeLimits, config: DecodeConfig,
                 observer: Observer | None = None,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        super().__init__()
        self.runtime = runtime
        self.limits = limits
        self.config = config
        self.observer: Observer = observer or NullObserver()
        self.clock = clock
        self.stats = StepStats()
        self._epoch = 0  # bumped by a reset: work scheduled before it is stale
        self.admit_cost = CostEstimate()
        """Seconds per admitted request while others waited: the admission rate."""
        self.margin = WaitMargin(config.max_queue_wait_s, clock)
        """What `expected_wait` adds to the estimate for its own error."""
        self.decode_cost = CostEstimate()
        """Seconds from admission to answer per request (warm-up included)."""
        self.step_cost = BatchCost()
        """Seconds of a decoder step, fixed + per row (fitted from the groups' steps): what
        a request's fewest steps cost with its rows (sources x beam)."""
        self._backlog_since: float | None = None
        self._held_for = 0  # schedules the waiting sources were held for (`_held`)
        self._arrived = 0  # sources added since the last schedule
        self.arrivals = 0.0
        """Sources added per schedule, a decayed average (`ARRIVALS_WEIGHT`): `_held`
        holds the waiting sources only where more are expected before the next schedule."""
        self._reset()

    def _reset(self) -> None:
        self._queue: deque[Request] = deque()  # admission order (status says who is still in)
        self._waiting = 0
        self._encoded: list[_Encoded] = []
        self._cancelled: set[int] = set()  # DECODING requests to evict from their group
        self.groups = [DecodeGroup(self.limits) for _ in range(self.config.groups)]
        self._busy: set[int] = set()  # groups whose step is out
        self._encoding = False
        self._settling: list[tuple[list[Request], list[int], Found]] = []
        self._epoch += 1

    # -- requests in ----------------------------------------------------------------------

    def add(self, sources: Sequence[list[int]], options: SearchOptions,
            deadline: float | None = None) -> list[Request]:
        """Queue sources (all or none): ShuttingDown while closing, QueueFull when the queue
        cannot take them all or they would wait past their budget (`deadline`, a
        time.monotonic() value, capped by `max_queue_wait_s`)."""
        cfg = self.config
        if self.closing:
            raise ShuttingDown("the translator is shutting down", retry_after=cfg.retry_after_s)
        if self._waiting + len(sources) > cfg.max_queue:
            raise QueueFull(f"translator queue full ({self._waiting} of {cfg.max_queue} "
                            "waiting)", retry_after=cfg.retry_after_s)
        wait = self.expected_wait()
        if deadline is not None:
            self._admit_by_wait(sources, options, deadline, wait)
        now = self.clock()
        admission = Admission(wait or 0.0, self.margin.factor, len(sources))
        requests = [Request(next(self._ids), list(src), options, now, admission=admission)
                    for src in sources]
        for r in requests:
            self.table[r.rid] = r
        self._queue.extend(requests)
        self._waiting += len(requests)
        self._arrived += len(requests)
        return requests

    def expected_wait(self, sources: int = 0) -> float | None:
        """Seconds `sources` more would wait for admission (None: not measured yet), with
        the margin for the estimate's own error (`WaitMargin`)."""
        return self.margin(self.admit_cost.seconds(self._waiting + sources))

    def _admit_by_wait(self, sources: Sequence[list[int]], options: SearchOptions,
                       deadline: float, wait: float | None) -> None:
        """QueueFull when the expected wait plus the request's compute (the measured cost per
        request, or its fewest decoder steps when more) would pass `deadline`. An idle model
        whose estimate is stale still refuses by it, and decodes the refused sources itself,
        answering no one, to measure again: a slow spell's estimate cannot refuse forever,
        and no request is let through on a guess only to miss its deadline (a 504)."""
        floor = self._fewest_steps_cost(sources, options) or 0.0
        service = max(self.decode_cost.per_unit or 0.0, floor) or None
        admit_by_wait("translator", wait, service, deadline,
                      self.config.max_queue_wait_s, self.config.retry_after_s,
                      not self.table and self.decode_cost.stale(),
                      lambda: self._probe(sources, options))

    def _fewest_steps_cost(self, sources: Sequence[list[int]],
                           options: SearchOptions) -> float | None:
        """Seconds the request's fewest decoder steps take at the measured cost of a step
        (fixed + per row): no source ends before `min_length` tokens (or its length cap),
        whatever the load. Its steps run with the rows already decoding (sources x beam, plus
        the live rows it joins) and take turns with every other busy group's steps: counted
        at the load of now (a request joining a long decode was admitted on its own rows'
        cost, then missed its deadline)."""
        if not options.min_length or not sources:
            return None
        steps = max(min(options.min_length, max_steps(options, len(src), self.limits))
                    for src in sources)
        busy = sum(1 for g in self.groups if g.rows)
        rows = len(sources) * options.beam_size + self.live_rows
        return self.step_cost.seconds(steps * rows, batches=steps * max(1, busy))

    def _probe(self, sources: Sequence[list[int]], options: SearchOptions) -> None:
        """Queue `sources` with no one waiting for them: their answer updates the costs."""
        now = self.clock()
        for src in sources:
            r = Request(next(self._ids), list(src), options, now)
            self.table[r.rid] = r
            self._queue.append(r)
            self._waiting += 1

    def cancel(self, rid: int) -> None:
        """The caller gave up on a request: it leaves now, or at its group's next update."""
        r = self.table.get(rid)
        if r is None or r.status in (Status.FINISHED, Status.ABORTED):
            return
        if r.status is Status.WAITING:
            self._waiting -= 1
            del self.table[rid]
        elif r.status is Status.DECODING:
            self._cancelled.add(rid)
        r.status = Status.ABORTED

    # -- views ----------------------------------------------------------------------------

    @property
    def live_rows(self) -> int:
        return sum(g.rows for g in self.groups)

    def has_work(self) -> bool:
        return bool(self.table) or bool(self._busy) or self._encoding or bool(self._settling)

    # -- the step -------------------------------------------------------------------------

    def step(self) -> list[Outcome]:
        """schedule, execute and update, in a row (no event loop needed)."""
        outcomes = []
        for work in self.schedule():
            outcomes += self.update(work, self.execute(work))
        return outcomes + self.settle()

    def lane(self, work: Work) -> int:
        """The work lane of an item: encoder batches on one thread, decoder steps on another."""
        return 0 if isinstance(work, EncodeWork) else 1

    def execute(self, work: Work) -> EncodeResult | StepResult:
        """Run one work item on the runtime; reads only the item (safe on any thread)."""
        return execute(self.runtime, work)

    def schedule(self) -> list[Work]:
        """Evict, place, admit; the work to run now."""
        for i, group in enumerate(self.groups):
            if i not in self._busy:
                self._evict(group)
        self._place()
        work: list[Work] = []
        admitted = self._admit()
        if admitted:
            self._encoding = True
            work.append(EncodeWork(admitted, self.config.pad_id, self._epoch))
        for i, group in enumerate(self.groups):
            if i not in self._busy and group.rows:
                self._busy.add(i)
                work.append(StepWork(group, i, group.inputs(), group.beams.rows.request))
        return work

    def update(self, work: Work, result: EncodeResult | StepResult) -> list[Outcome]:
        """Apply a finished work item; the requests that left."""
        if isinstance(work, EncodeWork):
            assert isinstance(result, EncodeResult)
            return self._encoded_batch(work, result)
        assert isinstance(result, StepResult)
        self._busy.discard(work.index)
        if self.groups[work.index] is not work.group:  # reset since: nobody waits for it
            return []
        try:
            return self._stepped(work.group, result)
        except Exception as exc:  # malformed outputs: fail this group's requests only
            self.groups[work.index] = DecodeGroup(self.limits)
            return [self._fail(self.table[rid], exc) for rid in work.group.keys.tolist()
                    if rid in self.table]

    def settle(self) -> list[Outcome]:
        """The answers of the requests that finished in the updates since the last call.
        Their n-best was copied out in `update`; building the answers (a `Hypothesis` per
        hypothesis) waits for this call, which the driver makes once it has launched the
        next steps, so that the decoder does not wait for it."""
        settling, self._settling = self._settling, []
        return [self._answer(r, hyps, steps) for requests, steps_of, found in settling
                for r, steps, hyps in zip(requests, steps_of, found.hypotheses(), strict=True)]

    def fail_all(self, error: Exception) -> list[Outcome]:
        """Fail every live request (a bug in the loop must not hang its clients); those
        already finished are answered."""
        outcomes = self.settle() + [self._fail(r, error) for r in list(self.table.values())]
        self._reset()
        return outcomes

    # -- schedule's parts -----------------------------------------------------------------

    def _evict(self, group: DecodeGroup) -> None:
        if self._cancelled and len(group.keys):
            gone = np.isin(group.keys, list(self._cancelled))  # (Q,)
            if gone.any():
                for rid in group.keys[gone].tolist():
                    self._cancelled.discard(rid)
                    self.table.pop(rid, None)
                group.evict(~gone)

    def _place(self) -> None:
        """Encoded requests join the idle group with the fewest rows, if it has no more rows
        than any group (the groups stay balanced)."""
        if not self._encoded:
            return
        idle = [g for i, g in enumerate(self.groups) if i not in self._busy]
        if not idle:
            return
        group = min(idle, key=lambda g: g.rows)
        if group.rows and group.rows > min(g.rows for g in self.groups):
            return
        for batch in self._encoded:
            live = [i for i, r in enumerate(batch.requests) if r.status is Status.DECODING]
            for r in batch.requests:
                if r.status is Status.ABORTED:  # cancelled after its encoder ran
                    self._cancelled.discard(r.rid)
                    self.table.pop(r.rid, None)
            if not live:
                continue
            n = len(batch.requests)
            memory, lengths, state, keys = batch.memory, batch.lengths, batch.state, batch.keys
            if len(live) < n or not len(memory) == len(state) == n or (
                    keys is not None and len(keys) != n):
                at = np.array(live)  # (else all of them, one encoder row each: as they are)
                memory, lengths, state = memory[at], lengths[at], state[at]
                keys = None if keys is None else keys[at]
            joining = [batch.requests[i] for i in live]
            group.join([r.rid for r in joining], [r.options for r in joining],
                       [len(r.src_ids) for r in joining], memory, lengths, state, keys)
        self._encoded = []

    def _admit(self) -> list[Request]:
        cfg = self.config
        self.arrivals += ARRIVALS_WEIGHT * (self._arrived - self.arrivals)
        self._arrived = 0
        if self._encoding:
            return []
        if not cfg.continuous and (self._encoded or any(g.rows for g in self.groups)):
            return []
        reserved = sum(g.reserved() for g in self.groups)
        reserved += sum(r.options.beam_size for b in self._encoded for r in b.requests)
        admitted: list[Request] = []
        now = self.clock()
        if self._held():
            return admitted
        while self._queue and len(admitted) < cfg.max_admit:
            head = self._queue[0]
            if head.status is not Status.WAITING:  # cancelled while queued
                self._queue.popleft()
                continue
            if reserved + head.options.beam_size > cfg.max_live_hypotheses:
                break
            reserved += head.options.beam_size
            head.status, head.admitted = Status.ENCODING, now
            admitted.append(self._queue.popleft())
        self._waiting -= len(admitted)
        self._note_admission(len(admitted), now)
        if admitted:
            self.margin.started(self.observer, [(now - r.submitted, r.admission)
                                                for r in admitted if r.admission is not None])
        return admitted

    def _held(self) -> bool:
        """Whether the waiting sources are held for a fuller encoder batch (`admit_steps`):
        only while a group decodes (its next step comes by itself), at least one more source
        is expected before the next schedule (`arrivals`: where they come fewer, holding
        fills no batch, and a held source only joins the steps late: at 4 connections 22%
        fewer translations a second with a 4-step hold than with none, docs/performance.md
        section 43), fewer than `max_admit` wait and they were held for fewer schedules than
        `admit_steps`."""
        cfg = self.config
        if self._held_for >= cfg.admit_steps or not 0 < self._waiting < cfg.max_admit \
                or self.arrivals < 1.0 or not any(g.rows for g in self.groups):
            self._held_for = 0
            return False
        self._held_for += 1
        return True

    def _note_admission(self, count: int, now: float) -> None:
        """Learn the admission rate from admissions made while others were waiting (an idle
        scheduler's pace says nothing about its capacity): from one admission to the next,
        however many schedules admitted none in between (restarting the clock at each of
        those, while the live-hypothesis budget was full, measured the time since the last
        step instead: an estimate that ran low at 3x load, 36% of sources by over 0.1 s,
        `seqserve_queue_wait_estimate_error_seconds`, admitted waits of 1.3 s at p99)."""
        if count and self._backlog_since is not None:
            self.admit_cost.observe(count, now - self._backlog_since)
        if count or not self._waiting:
            self._backlog_since = now if self._waiting else None

    # -- update's parts -------------------------------------------------------------------

    def _encoded_batch(self, work: EncodeWork, result: EncodeResult) -> list[Outcome]:
        if work.epoch != self._epoch:
            return []
        self._encoding = False
        self.observer.on_encode(result.seconds, len(work.requests))
        outcomes = []
        for i, r in enumerate(work.requests):
            if i in result.failed:
                outcomes.append(self._fail(r, result.failed[i]))
            elif r.status is Status.ABORTED:  # cancelled while encoding
                self.table.pop(r.rid, None)
            else:
                r.status = Status.DECODING
        if len(outcomes) < len(work.requests):
            self._encoded.append(_Encoded(work.requests, result.memory, result.state,
                                          result.lengths, result.keys))
        return outcomes

    def _stepped(self, group: DecodeGroup, result: StepResult) -> list[Outcome]:
        """Beam bookkeeping for the group's step; answer and evict who finished. A step's
        cost, for admission, is its graph's time and its bookkeeping's (`advance`)."""
        start = time.perf_counter()
        group.advance(result.out)
        if result.batched:
            self.stats.add(group.rows, result.seconds)
            self.step_cost.observe(group.rows,
                                   result.seconds + time.perf_counter() - start)
            self.observer.on_step(result.seconds, group.rows)
        leave = group.beams.done.copy()  # (Q,)
        outcomes = []
        for q, exc in result.failed.items():
            leave[q] = True
            outcomes.append(self._fail(self.table[int(group.keys[q])], exc))
        if self._cancelled:
            leave |= np.isin(group.keys, list(self._cancelled))
        positions = np.flatnonzero(leave)
        if not len(positions):
            return outcomes
        keys = group.keys.tolist()  # (Q,) the requests' ids
        answered = [q for q in positions.tolist() if q not in result.failed
                    and self.table[keys[q]].status is Status.DECODING]
        if answered:  # answered by `settle`, once the next steps are out
            at = np.array(answered, np.int64)
            requests = [self.table[keys[q]] for q in answered]
            for r in requests:
                r.status = Status.FINISHED
            self._settling.append((requests, group.beams.reqs.steps[at].tolist(),
                                   group.beams.gathered(at)))
        for rid in (keys[q] for q in positions.tolist()):
            self._cancelled.discard(rid)
            self.table.pop(rid, None)
        group.evict(~leave)
        return outcomes

    def _answer(self, r: Request, hyps: list[Hypothesis], steps: int) -> Outcome:
        now = self.clock()
        best = hyps[0] if hyps else None
        tokens = len(best.token_ids) - int(best.ended) if best else 0  # EOS not counted
        self.stats.generated_tokens += tokens
        self.observer.on_finish(tokens, now - r.admitted)
        self.decode_cost.observe(1, now - r.admitted)
        return Outcome(r, Decoded(hyps, r.admitted - r.submitted, now - r.admitted, steps))

    def _fail(self, r: Request, exc: Exception) -> Outcome:
        r.status = Status.ABORTED
        self.table.pop(r.rid, None)
        self._cancelled.discard(r.rid)
        error = exc if isinstance(exc, InferenceFailed) else InferenceFailed(
            f"decoding failed: {exc}")
        return Outcome(r, error)
