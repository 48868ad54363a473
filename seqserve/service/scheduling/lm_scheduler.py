"""The language models' model-free scheduler: `LMScheduler` (schedule, execute, update; one
table of requests), driven by `scheduling.lm.LMLoop`. See `scheduling.lm` for the design."""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from seqserve.service.core.errors import InferenceFailed, QueueFull, ShuttingDown
from seqserve.service.runtimes.base import Runtime
from seqserve.service.scheduling.base import (
    Admission,
    CostEstimate,
    NullObserver,
    Observer,
    Timed,
    Timing,
    WaitMargin,
    admit_by_wait,
)
from seqserve.service.scheduling.generation import (
    FINISH_EOS,
    FINISH_LENGTH,
    GenerateOptions,
    Sink,
    TokenEvent,
)
from seqserve.service.scheduling.lm_prefill import (
    PrefillOut,
    PrefillRow,
    plan_rows,
    run_prefill,
)
from seqserve.service.scheduling.lm_rows import Rows
from seqserve.service.scheduling.loop import Outcome, RequestTable, Status
from seqserve.service.scheduling.prefix_cache import PrefixCache
from seqserve.service.scheduling.sampling import (
    sample,
    sequence_keys,
    top_alternatives,
    top_arrays,
    tuned,
    uniforms,
)
from seqserve.service.scheduling.work import DecodeConfig

log = logging.getLogger("seqserve.lm")


@dataclass(eq=False)
class _Request:
    """One generate or score request: its rows and where their events go."""

    rid: int
    rows: list[list[int]]
    """Token rows to prefill: prompts (bos first) or texts to score (bos first)."""
    options: GenerateOptions | None
    """None: a score request."""
    sink: Sink | None
    submitted: float
    futures: list[Any] = field(default_factory=list)
    live: int = 0
    """Sequences not finished yet."""
    admitted: float = 0.0
    status: Status = Status.WAITING
    admission: Admission | None = None
    """Its admission: the queue wait it expected, 0 while unmeasured (None: a probe)."""
    top: int = 0
    """A score request: the alternatives (ids, log-probs) it asks for at every position."""
    start: tuple[bytes, int] | None = None
    """A score request that continues a state: (flat state bytes, pending token)."""
    score_state: bool = False
    """A score request that wants each text's state back (before its last token)."""
    cached: list[int] = field(default_factory=list)
    """Per row, the prompt tokens a cached prefix saved."""

    @property
    def sequences(self) -> int:
        return 0 if self.options is None else len(self.rows) * self.options.n


@dataclass(frozen=True)
class PrefillWork:
    requests: list[_Request]
    rows: list[PrefillRow]
    pad_id: int
    epoch: int
    keys: list[tuple[str, list[int], int]]
    """Per row: its cache scope, its whole row and the prefix length its tokens start at."""


@dataclass(frozen=True)
class StepWork:
    prev_ids: np.ndarray  # (R,)
    state: np.ndarray  # (R, S)
    epoch: int


@dataclass
class _Done:
    """A finished work item's outputs, or its failure."""

    out: dict[str, np.ndarray]
    seconds: float
    error: Exception | None = None
    prefill: PrefillOut | None = None


Work = PrefillWork | StepWork


class LMScheduler(RequestTable[_Request]):
    """See module doc."""

    def __init__(self, runtime: Runtime, eos_id: int, vocab_size: int, config: DecodeConfig,
                 observer: Observer | None = None,
                 clock: Callable[[], float] = time.perf_counter, takes_state: bool = False,
                 state_dim: int | None = None, cache: PrefixCache | None = None) -> None:
        super().__init__()
        self.runtime = runtime
        self.takes_state = takes_state
        """The prefill takes initial_state (schema 3): states continue in one call."""
        self.state_dim = state_dim
        self.cache = cache if cache is not None and cache.enabled and takes_state else None
        """The prefix cache (only for a prefill that takes initial_state: an older bundle's
        misses could not be cut into blocks)."""
        self.eos_id = eos_id
        self.vocab_size = vocab_size
        self.config = config
        self.observer: Observer = observer or NullObserver()
        self.clock = clock
        self._queue: deque[_Request] = deque()
        self._epoch = 0
        self.admit_cost = CostEstimate()
        """Seconds per admitted request while others waited: the admission rate."""
        self.margin = WaitMargin(config.max_queue_wait_s, clock)
        """What `expected_wait` adds to the estimate for its own error."""
        self.service_cost = CostEstimate()
        """Seconds from admission to the last token (or the scores) per request."""
        self._backlog_since: float | None = None
        self._entropy = np.random.default_rng()
        """Keys of the sequences of unseeded requests."""
        self.steps = 0
        self.generated = 0
        self._reset()

    def _reset(self) -> None:
        self.rows = Rows.empty()
        self.state: np.ndarray | None = None  # (N, S)
        self.last = np.zeros(0, dtype=np.int64)  # (N,)
        self._joining: list[tuple[Rows, np.ndarray, np.ndarray]] = []
        self._gone: set[tuple[int, int]] = set()  # (rid, index) to evict; index -1: all
        self._prefilling = False
        self._stepping = False
        self._epoch += 1

    # -- requests in ----------------------------------------------------------------------

    def add(self, rows: Sequence[list[int]], options: GenerateOptions | None, sink: Sink | None,
            deadline: float | None = None) -> _Request:
        """Queue one request (prompts with `options`, or texts to score with None):
        ShuttingDown while closing, QueueFull when the queue cannot take it or it would wait
        past its budget (`deadline`, a time.monotonic() value, capped by
        `max_queue_wait_s`). An idle model whose estimate is stale still refuses by it, and
        runs the refused request for no one to measure again (base.admit_by_wait)."""
        cfg = self.config
        if self.closing:
            raise ShuttingDown("the language model is shutting down",
                               retry_after=cfg.retry_after_s)
        if self._waiting + len(rows) > cfg.max_queue:
            raise QueueFull(f"language model queue full ({self._waiting} of {cfg.max_queue} "
                            "waiting)", retry_after=cfg.retry_after_s)
        wait = self.expected_wait()
        if deadline is not None:
            admit_by_wait("language model", wait, self.service_cost.per_unit,
                          deadline, cfg.max_queue_wait_s, cfg.retry_after_s,
                          not self.table and self.service_cost.stale(),
                          lambda: self._queue_request(rows, options, None))
        return self._queue_request(rows, options, sink, wait or 0.0)

    def _queue_request(self, rows: Sequence[list[int]], options: GenerateOptions | None,
                       sink: Sink | None, expected: float | None = None) -> _Request:
        admission = None if expected is None else Admission(expected, self.margin.factor, 1)
        r = _Request(next(self._ids), [list(x) for x in rows], options, sink, self.clock(),
                     admission=admission)
        self.table[r.rid] = r
        self._queue.append(r)
        self._waiting += len(rows)
        return r

    def expected_wait(self) -> float | None:
        """Seconds a request queued now would wait for admission (None: not measured yet),
        with the margin for the estimate's own error (`WaitMargin`)."""
        return self.margin(self.admit_cost.seconds(self._waiting))

    def cancel(self, rid: int) -> None:
        """The caller left: the request's rows go at the next schedule."""
        r = self.table.pop(rid, None)
        if r is None:
            return
        if r.status is Status.WAITING:
            self._waiting -= len(r.rows)
        r.status = Status.FINISHED
        self._gone.add((rid, -1))

    def stop(self, rid: int, index: int) -> None:
        """One sequence of a request is done (a stop string): its row goes at the next
        schedule; the request ends when its last sequence does (no event is sent for it)."""
        r = self.table.get(rid)
        if r is None or (rid, index) in self._gone:
            return
        self._gone.add((rid, index))
        r.live -= 1
        if r.live <= 0 and r.status is Status.DECODING:
            r.status = Status.FINISHED
            self.table.pop(rid, None)

    @property
    def live_rows(self) -> int:
        return len(self.rows) + sum(len(j[0]) for j in self._joining)

    def has_work(self) -> bool:
        return bool(self.table) or self._prefilling or self._stepping

    # -- schedule -------------------------------------------------------------------------

    def schedule(self) -> list[Work]:
        work: list[Work] = []
        if not self._stepping:
            self._evict()
            self._join()
        admitted = self._admit()
        rest = self._join_resumed(admitted)
        if len(rest) < len(admitted) and not self._stepping:
            self._join()  # continued states step from now on
        admitted = rest
        if admitted:
            self._prefilling = True
            rows, keys = plan_rows(admitted, self.cache)
            work.append(PrefillWork(admitted, rows, self.config.pad_id, self._epoch, keys))
        if not self._stepping and len(self.rows):
            assert self.state is not None
            self._stepping = True
            work.append(StepWork(self.last, self.state, self._epoch))
        return work

    def _join_resumed(self, admitted: list[_Request]) -> list[_Request]:
        """Generations that continue a state with no new tokens join the live rows at once,
        their pending token next to feed, exactly as if they had never stopped; the others
        (returned) need a prefill."""
        rest = []
        for r in admitted:
            o = r.options
            if o is None or o.resume is None or r.rows != [[]]:
                rest.append(r)
                continue
            state, pending, key, drawn = o.resume
            rows = Rows.of(r.rid, o, np.array([key], dtype=np.uint64))
            rows.drawn[:] = drawn
            r.live, r.status = 1, Status.DECODING
            r.cached = [0]
            self._joining.append((rows, np.frombuffer(state, dtype=np.float32)[None].copy(),
                                  np.array([pending], dtype=np.int64)))
        return rest

    def _alive(self, rows: Rows) -> np.ndarray:
        """Which of `rows` were neither cancelled nor stopped (N,) bool."""
        gone = self._gone
        return np.array([(rid, -1) not in gone and (rid, i) not in gone
                         for rid, i in zip(rows.rid.tolist(), rows.index.tolist(),
                                           strict=True)], dtype=bool)

    def _evict(self) -> None:
        if not self._gone:
            return
        if len(self.rows):
            keep = self._alive(self.rows)
            if not keep.all():
                self._keep(keep)
        joining = []
        for rows, state, last in self._joining:
            keep = self._alive(rows)
            if keep.any():
                joining.append((rows.take(keep), state[keep], last[keep]))
        self._joining = joining
        live = set(self.rows.rid.tolist()).union(*(j[0].rid.tolist() for j in self._joining))
        self._gone = {g for g in self._gone if g[0] in live or g[0] in self.table}

    def _keep(self, keep: np.ndarray) -> None:
        assert self.state is not None
        self.rows = self.rows.take(keep)
        self.state, self.last = self.state[keep], self.last[keep]

    def _join(self) -> None:
        if not self._joining:
            return
        old = [] if self.state is None or not len(self.rows) else [
            (self.rows, self.state, self.last)]
        parts = old + self._joining
        self.rows = Rows.concat([j[0] for j in parts])
        self.state = np.concatenate([j[1] for j in parts], axis=0)
        self.last = np.concatenate([j[2] for j in parts])
        self._joining = []

    def _admit(self) -> list[_Request]:
        cfg = self.config
        if self._prefilling:
            return []
        if not cfg.continuous and (len(self.rows) or self._joining or self._stepping):
            return []
        budget = cfg.max_live_hypotheses - self.live_rows
        admitted: list[_Request] = []
        count = 0
        now = self.clock()
        while self._queue and count < cfg.max_admit:
            head = self._queue[0]
            if head.status is not Status.WAITING:
                self._queue.popleft()
                continue
            if admitted and (head.sequences > budget or count + len(head.rows) > cfg.max_admit):
                break
            if head.sequences > budget and self.live_rows:
                break  # wait for rows to free up (a lone request over the budget still runs)
            budget -= head.sequences
            count += len(head.rows)
            head.status, head.admitted = Status.ENCODING, now
            self._waiting -= len(head.rows)
            admitted.append(self._queue.popleft())
        if admitted:
            self.margin.started(self.observer, [(now - r.submitted, r.admission)
                                                for r in admitted if r.admission is not None])
        if admitted and self._backlog_since is not None:
            self.admit_cost.observe(len(admitted), now - self._backlog_since)
        if admitted or not self._waiting:
            self._backlog_since = now if self._waiting else None
        return admitted

    # -- execute (any thread) -------------------------------------------------------------

    def lane(self, work: Work) -> int:
        """The work lane of an item: prefills on one thread, steps on another."""
        return 0 if isinstance(work, PrefillWork) else 1

    def execute(self, work: Work) -> _Done:
        start = time.perf_counter()
        try:
            if isinstance(work, PrefillWork):
                pre = run_prefill(self.runtime, work.rows, work.pad_id, self.takes_state,
                                  self.state_dim)
                return _Done({"state": pre.state, "log_probs": pre.log_probs,
                              "lengths": pre.lengths}, time.perf_counter() - start,
                             prefill=pre)
            else:
                out = self.runtime.run("lm_step", {"prev_ids": work.prev_ids,
                                                   "state": work.state})
        except Exception as exc:  # the requests of this item fail, the loop goes on
            return _Done({}, time.perf_counter() - start, exc)
        return _Done(out, time.perf_counter() - start)

    # -- update ---------------------------------------------------------------------------

    def update(self, work: Work, done: _Done) -> list[Outcome]:
        """Apply a finished item; the requests that ended with it (already answered: their
        sinks and futures had every event)."""
        if work.epoch != self._epoch:
            return []
        if isinstance(work, PrefillWork):
            self._prefilling = False
            ended = self._prefilled(work, done)
        else:
            self._stepping = False
            ended = self._stepped(done)
        return [Outcome(r, None) for r in ended]

    def _fail(self, r: _Request, exc: BaseException) -> None:
        error = exc if isinstance(exc, InferenceFailed) else InferenceFailed(
            f"language model failed: {exc}")
        r.status = Status.FINISHED
        self.table.pop(r.rid, None)
        self._gone.add((r.rid, -1))
        self.answer_error(r, error)

    def answer_error(self, request: _Request, error: BaseException) -> None:
        """End a request with `error`: through its sink, and its futures not done yet."""
        if request.sink is not None:
            request.sink(error)
        for f in request.futures:
            if not f.done():
                f.set_exception(error)

    def _keys(self, options: GenerateOptions, n: int) -> np.ndarray:
        """The random streams of a request's n sequences: from (seed, index), or fresh."""
        if options.seed is None:
            return self._entropy.integers(0, 2**64 - 1, size=n, dtype=np.uint64,
                                          endpoint=True)
        return sequence_keys(options.seed, np.arange(n, dtype=np.int64))

    def _prefilled(self, work: PrefillWork, done: _Done) -> list[_Request]:
        self.observer.on_encode(done.seconds, len(work.rows))
        longest = max(len(x.tokens) for x in work.rows)
        self.observer.on_batch(len(work.rows), longest * len(work.rows),
                               sum(len(x.tokens) for x in work.rows))
        if done.error is not None:
            for r in work.requests:
                if r.status is not Status.FINISHED:
                    self._fail(r, done.error)
            return list(work.requests)
        state, log_probs, lengths = done.out["state"], done.out["log_probs"], done.out["lengths"]
        if self.cache is not None and done.prefill is not None:
            for (scope, row, k), entry, cuts in zip(work.keys, work.rows,
                                                    done.prefill.cut_states, strict=True):
                for c, kept in zip(entry.cuts, cuts, strict=False):
                    self.cache.put(scope, row, k + c, kept)
            self.observer.on_prefix_cache(self.cache)
        cut_states = done.prefill.cut_states if done.prefill is not None else None
        ended: list[_Request] = []
        at = 0
        now = self.clock()
        live: list[_Request] = []
        parts: list[Rows] = []
        sources: list[np.ndarray] = []  # the prefill row of each sequence
        for r in work.requests:
            span = range(at, at + len(r.rows))
            at += len(r.rows)
            if r.status is Status.FINISHED:  # cancelled while its prefill ran
                continue
            if r.options is None:
                self._answer_scores(r, log_probs, lengths, span, now, work.rows, cut_states)
                ended.append(r)
                continue
            n = len(r.rows) * r.options.n
            rows_of = Rows.of(r.rid, r.options, self._keys(r.options, n))
            if r.options.resume is not None:  # the state's own random stream, continued
                rows_of.key[:], rows_of.drawn[:] = r.options.resume[2], r.options.resume[3]
            parts.append(rows_of)
            sources.append(np.repeat(np.arange(span.start, span.stop), r.options.n))
            r.live, r.status = n, Status.DECODING
            live.append(r)
        if not live:
            return ended
        rows, src = Rows.concat(parts), np.concatenate(sources)
        first = log_probs[src, lengths[src] - 1]  # (N, V) each prompt's next-token
        cached = [k for r in live for k in r.cached for _ in range(r.sequences // len(r.rows))
                  ] if any(any(r.cached) for r in live) else None
        keep, tokens = self._advance(rows, first, live, ended, state[src], cached,
                                     prefill=True)
        if keep.any():
            self._joining.append((rows.take(keep), state[src[keep]], tokens[keep]))
        return ended

    def _answer_scores(self, r: _Request, log_probs: np.ndarray, lengths: np.ndarray,
                       span: range, now: float, rows: list[PrefillRow],
                       cut_states: list[list[np.ndarray]] | None) -> None:
        for f, i in zip(r.futures or [None] * len(r.rows), span, strict=True):
            if f is None:  # a probe: no one waits for it
                continue
            n = int(lengths[i])
            row = rows[i].tokens  # bos (or a state's pending token) first
            targets = np.asarray(row[1:n], dtype=np.int64)  # the text's tokens after it
            lps = log_probs[i, np.arange(n - 1), targets].astype(np.float32)  # (n-1,)
            value: tuple[np.ndarray, ...] = (lps,)
            if r.top:  # and the best tokens at every position, from the same prefill
                ids, tops = top_arrays(log_probs[i, : n - 1], r.top)
                value = (lps, ids, tops.astype(np.float32))
            if r.score_state:  # the state before the text's last token, and that token
                assert cut_states is not None  # a scored row has >= 2 tokens: one cut
                before = cut_states[i][0]
                value = (*value, np.asarray(before, np.float32),
                         np.array([row[n - 1]], dtype=np.int64))
            if not f.done():
                f.set_result(Timed(value, Timing(r.admitted - r.submitted, now - r.admitted,
                                                 len(r.rows), 0)))
        r.status = Status.FINISHED
        self.table.pop(r.rid, None)
        self.service_cost.observe(1, now - r.admitted)

    def _stepped(self, done: _Done) -> list[_Request]:
        rows = self.rows
        if done.error is not None:
            for rid in set(rows.rid.tolist()):
                if rid in self.table:
                    self._fail(self.table[rid], done.error)
            self.rows, self.state, self.last = Rows.empty(), None, np.zeros(0, dtype=np.int64)
            return []
        self.steps += 1
        self.observer.on_step(done.seconds, len(rows))
        self.state = done.out["new_state"]
        requests = []
        for rid in _runs(rows.rid)[0]:
            r = self.table.get(rid)
            requests.append(r if r is not None and r.status is Status.DECODING else None)
        ended: list[_Request] = []
        keep, self.last = self._advance(rows, done.out["log_probs"], requests, ended,
                                        self.state)
        if not keep.all():
            self._keep(keep)
        return ended

    def _advance(self, rows: Rows, log_probs: np.ndarray, requests: Sequence[_Request | None],
                 ended: list[_Request], states: np.ndarray,
                 cached: list[int] | None = None, prefill: bool = False
                 ) -> tuple[np.ndarray, np.ndarray]:
        """Every row draws its next token from its log_probs (N, V); each request of
        `requests` (one per run of rows, None: cancelled) gets its events, finished
        sequences leave (into `ended` when their request did); `states` (N, S) are the rows'
        states the draw came from (a finish event carries its row's when asked), `cached`
        each row's prompt tokens a cached prefix saved (first events); `prefill`: these are
        the first events, which carry their request's queue wait. Returns which rows stay
        live (N,) bool and the tokens (N,) int64."""
        drawn_from = log_probs
        if rows.tuned.any():  # logit bias, penalties, ignore_eos: those rows' own copy
            drawn_from = tuned(log_probs, self._tuned_spans(rows, requests), rows.counts,
                               self.eos_id)
        tokens = sample(drawn_from, rows.temperature, rows.top_k, rows.top_p,
                        uniforms(rows.key, rows.drawn))
        if drawn_from is not log_probs:
            rows.count(tokens)
        rows.drawn += 1
        rows.left -= 1
        finished = (tokens == self.eos_id) | (rows.left <= 0)
        keep = ~finished
        chosen = log_probs[np.arange(len(tokens)), tokens].tolist()
        want = int(rows.top_logprobs.max(initial=0))
        tops = None
        if want:
            asks = np.flatnonzero(rows.top_logprobs > 0)
            alts = top_alternatives(log_probs[asks], want)
            tops = dict(zip(asks.tolist(), alts, strict=True))
        eos, gone = self.eos_id, self._gone
        token_list, index_list = tokens.tolist(), rows.index.tolist()
        finished_list, want_list = finished.tolist(), rows.top_logprobs.tolist()
        _, starts = _runs(rows.rid)
        for r, s, e in zip(requests, starts, starts[1:] + [len(tokens)], strict=True):
            if r is None:  # cancelled: its rows leave now
                keep[s:e] = False
                continue
            out = []
            queued = r.admitted - r.submitted if prefill else 0.0
            for i in range(s, e):
                token, index = token_list[i], index_list[i]
                if gone and (r.rid, index) in gone:  # stopped meanwhile: nothing more
                    keep[i] = False
                    continue
                finish = None
                if finished_list[i]:
                    finish = FINISH_EOS if token == eos else FINISH_LENGTH
                    r.live -= 1
                if token != eos:
                    self.generated += 1
                top = tops[i][: want_list[i]] if tops is not None and i in tops else ()
                event = TokenEvent(index, token, chosen[i], top, finish)
                if cached is not None:
                    event.cached = cached[i]
                if queued:
                    event.queued = queued
                if finish is not None and r.options is not None and r.options.return_state:
                    event.state = (states[i].astype(np.float32).tobytes(), int(rows.key[i]),
                                   int(rows.drawn[i]))
                out.append(event)
            if r.live <= 0:
                r.status = Status.FINISHED
                self.table.pop(r.rid, None)
                self.service_cost.observe(1, self.clock() - r.admitted)
                ended.append(r)
            if out and r.sink is not None:
                r.sink(out)
        return keep, tokens

    @staticmethod
    def _tuned_spans(rows: Rows, requests: Sequence[_Request | None]
                     ) -> list[tuple[int, int, GenerateOptions]]:
        """(start, end, options) of the runs of rows whose request tunes its draw."""
        _, starts = _runs(rows.rid)
        return [(s, e, r.options) for r, s, e in zip(requests, starts, starts[1:] + [len(rows)],
                                                      strict=True)
                if r is not None and r.options is not None and r.options.tuned]

    def fail_all(self, error: Exception) -> list[Outcome]:
        """Fail every live request (answered through their sinks and futures)."""
        failed = list(self.table.values())
        for r in failed:
            self._fail(r, error)
        self._reset()
        return [Outcome(r, error) for r in failed]


def _runs(rid: np.ndarray) -> tuple[list[int], list[int]]:
    """The request ids of the runs of equal `rid` (N,) and where each run starts."""
    if not len(rid):
        return [], []
    starts = [0, *(np.flatnonzero(rid[1:] != rid[:-1]) + 1).tolist()]
    return rid[starts].tolist(), starts
