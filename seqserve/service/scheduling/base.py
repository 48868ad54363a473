"""What the schedulers share: per-row timing, the observer they report to, right-padding."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import numpy as np

from seqserve.service.core.errors import QueueFull

R = TypeVar("R")


@dataclass(frozen=True)
class Timing:
    """Where one row's time went (seconds)."""

    queue_s: float
    """From submission to the start of its compute (its batch, or its admission)."""
    compute_s: float
    """Its batch's compute time (translators: admission to answer)."""
    batch_rows: int
    """Rows in its batch (0 for a translator's request: it has no one batch)."""
    decoder_steps: int
    """Decoder steps it took part in (translators; 0 for a batched row)."""


@dataclass(frozen=True)
class Timed(Generic[R]):
    """One row's result and where its time went: what a scheduler's future resolves to."""

    value: R
    timing: Timing


class Observer(Protocol):
    """Where a scheduler reports its work (Prometheus in the server, nothing in tests)."""

    def on_batch(self, rows: int, padded_tokens: int, real_tokens: int) -> None:
        """A batch (or an admission batch of encoders) was formed."""

    def on_depth(self, waiting: int, live_rows: int | None = None) -> None:
        """Rows waiting for compute changed; decoders also report their live hypotheses."""

    def on_encode(self, seconds: float, batch: int) -> None:
        """An encoder batch ran (translators)."""

    def on_step(self, seconds: float, rows: int) -> None:
        """A decoder step ran (translators)."""

    def on_finish(self, tokens: int, seconds: float) -> None:
        """A translation finished with `tokens` generated tokens (translators)."""

    def on_live_sequences(self, sequences: int) -> None:
        """Sequences a language model is generating changed."""

    def on_prefix_cache(self, cache: Any) -> None:
        """A language model's prefix cache changed (its cumulative `stats` and `bytes`)."""

    def on_sessions(self, live: int) -> None:
        """Live sessions of a stateful feature-sequence model changed."""

    def on_session_closed(self, lifetime_s: float, expired: bool) -> None:
        """A session ended (its last chunk, a restart) or expired after its idle timeout."""

    def on_wait_errors(self, errors: Sequence[float], model_errors: Sequence[float]) -> None:
        """Admitted work started: per row (or request), its actual queue wait minus the wait
        its admission expected (`expected_wait()`), and minus the cost model's own estimate
        before the margin (`WaitMargin`), seconds; once per batch or admission."""


class NullObserver:
    """An observer that records nothing."""

    def on_batch(self, rows: int, padded_tokens: int, real_tokens: int) -> None:
        pass

    def on_depth(self, waiting: int, live_rows: int | None = None) -> None:
        pass

    def on_encode(self, seconds: float, batch: int) -> None:
        pass

    def on_step(self, seconds: float, rows: int) -> None:
        pass

    def on_finish(self, tokens: int, seconds: float) -> None:
        pass

    def on_live_sequences(self, sequences: int) -> None:
        pass

    def on_prefix_cache(self, cache: Any) -> None:
        pass

    def on_sessions(self, live: int) -> None:
        pass

    def on_session_closed(self, lifetime_s: float, expired: bool) -> None:
        pass

    def on_wait_errors(self, errors: Sequence[float], model_errors: Sequence[float]) -> None:
        pass


def pad_rows(rows: Sequence[Sequence[int]], pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Right-pad token rows into ids (B, T) int64 and lengths (B,) int64, T = longest row."""
    lengths = np.array([len(r) for r in rows], dtype=np.int64)  # (B,)
    ids = np.full((len(rows), int(lengths.max())), pad_id, dtype=np.int64)  # (B, T)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = r
    return ids, lengths


PROBE_AFTER_S = 1.0
"""An idle model whose cost was last measured longer ago than this still refuses by it, and
runs the refused work for no one to measure again (`admit_by_wait`)."""


@dataclass
class Measured:
    """A cost measured online from recent batches (`CostEstimate`, `BatchCost`): seconds per
    unit of work, and when it was last measured. Unknown (None) until measured."""

    per_unit: float | None = None
    """Seconds per unit of work (a token, a row, a request)."""
    observed_at: float = 0.0
    """time.monotonic() of the last measurement."""

    def stale(self, after_s: float = PROBE_AFTER_S) -> bool:
        """No measurement for `after_s`: an idle model measures again with the work it
        refuses (a slow spell must not refuse every request forever)."""
        return time.monotonic() - self.observed_at > after_s


@dataclass
class CostEstimate(Measured):
    """Seconds of compute per unit of work (a token, a request), from recent batches: the
    exponential average of their seconds over that of their units. (An average of each
    batch's seconds / units, as before, runs high when the units vary: an admission of one
    request after a short interval weighs as much as one of twenty after a long one.)"""

    alpha: float = 0.2
    """Weight of the newest batch."""
    _units: float = 0.0
    """Exponential average of the batches' units (their seconds: `per_unit` x this)."""

    def observe(self, units: int, seconds: float) -> None:
        """Fold in a batch; after a gap (stale), the new measurement replaces the old one. No
        seconds is a measurement too (a batch handed to a busy instance's thread goes on
        with no gap between: `Batcher.gap`)."""
        if units <= 0 or seconds < 0:
            return
        if self.per_unit is None or self.stale():
            self._units, self.per_unit = float(units), seconds / units
        else:
            keep = 1 - self.alpha
            total = self.alpha * seconds + keep * self.per_unit * self._units
            self._units = self.alpha * units + keep * self._units
            self.per_unit = total / self._units
        self.observed_at = time.monotonic()

    def seconds(self, units: float, parallel: int = 1) -> float | None:
        """Expected seconds to work through `units` on `parallel` workers (None: unknown)."""
        return None if self.per_unit is None else units * self.per_unit / max(parallel, 1)


@dataclass(eq=False, slots=True)
class Admission:
    """One request's admission, shared by its rows (a batcher's texts) or sources (a
    translator's): the queue wait it expected, the scheduler's `WaitMargin.factor` then, and
    the longest wait of its work that started so far, with how much is left. Its rows may
    start in different batches (by length), and the request waits for the last one."""

    expected: float
    margin: float
    left: int
    longest: float = 0.0

    def started(self, wait: float) -> tuple[float, float, float] | None:
        """One of its rows or sources started after `wait` s: once the last has, (its
        longest wait, the expected wait, the margin then), else None."""
        self.longest = max(self.longest, wait)
        self.left -= 1
        return (self.longest, self.expected, self.margin) if self.left == 0 else None


def _upper(values: Iterable[float], q: float) -> float:
    """The `q` quantile of `values` (the one at index q x n of them sorted)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class WaitMargin:
    """What a scheduler's expected wait adds for its own error (`factor`): the QUANTILE of
    the ratios of recent requests' queue waits to the estimate before the margin (the last
    ROWS requests, or sources, that expected at least MIN_S), recomputed every EVERY
    observations, 1 to MAX. Under a starved CPU the rate a queue drains at changes from one
    moment to the next: at 3x overload on 2 cores, ~22% of 16-text classify's rows waited
    over 0.1 s more than a mean estimate and the admitted waits' p99 passed the bound
    (docs/performance.md section 20). Under overload the queue stays at the bound, so nearly
    every admitted request expects a wait just under it: the admitted waits' p99 is within
    the bound when admission goes by a ratio recent requests exceeded 1% of the time (a
    request of many rows waits for its last one: `Admission` folds in that wait, section
    22). (A factor learned by feedback, times (actual / expected) ** gain per batch, was
    tried first: it swung between its bounds every few hundred batches, the waits it
    learned from admitted under an older factor.)"""

    QUANTILE = 0.99
    ROWS = 512
    EVERY = 16
    MAX = 3.0
    MIN_S = 0.01
    TAIL_EVERY_S = 0.5
    TAIL_UP = 1.1
    TAIL_DOWN = 1.02
    TAIL_AIM = 0.9
    TAIL_LOW = 0.8

    __slots__ = ("factor", "tail", "bound", "clock", "_ratios", "_waits", "_seen", "_tail_at")

    def __init__(self, bound: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.factor = 1.0
        self.tail = 1.0
        """The feedback on top of the quantile (see `_follow_the_bound`)."""
        self.bound = bound
        """The queue wait admission holds (`max_queue_wait_s`; None: no feedback)."""
        self.clock = clock
        self._ratios: deque[float] = deque(maxlen=self.ROWS)
        self._waits: deque[float] = deque(maxlen=self.ROWS)
        self._seen = 0
        self._tail_at = clock()

    def observe(self, waits: Iterable[tuple[float, float, float]]) -> None:
        """Fold in (actual wait, expected wait, `factor` when it was expected) per row."""
        ratios = self._ratios
        for actual, expected, factor in waits:
            if expected >= self.MIN_S * factor:
                ratios.append(actual * factor / expected)  # to the estimate before it
            self._waits.append(actual)
        self._seen += 1
        if self._seen % self.EVERY == 0 and len(ratios) >= self.ROWS // 4:
            self._follow_the_bound()
            self.factor = min(self.MAX, max(1.0, _upper(ratios, self.QUANTILE)) * self.tail)

    def _follow_the_bound(self) -> None:
        """A slow feedback from the admitted requests' own waits: every TAIL_EVERY_S (about
        the time a wait at the bound takes to show), when the 99th percentile of the last
        ROWS requests' waits passed TAIL_AIM of the bound, the tail grows by that overshoot
        (at most TAIL_UP); when it is under TAIL_LOW of the bound the tail shrinks by
        TAIL_DOWN, to 1. The quantile of the ratios holds the bound where the estimate's
        error is steady; this covers a queue whose drain swings with the decoding batch's
        width (translate's and generate's admitted p99 at 3x overload stayed 8-15% over the
        bound, docs/performance.md section 23). It aims under the bound: a p99 of 0.5 s
        windows swings by ~10% from one to the next, and aimed at the bound itself the
        admitted waits' p99 over a run settled 7-9% over it (section 26)."""
        now = self.clock()
        waits = self._waits
        if self.bound is None or now - self._tail_at < self.TAIL_EVERY_S:
            return
        self._tail_at = now
        if len(waits) < self.ROWS // 4:
            return
        p99 = _upper(waits, 0.99)
        aim = self.TAIL_AIM * self.bound
        if p99 > aim:
            self.tail = min(self.MAX, self.tail * min(self.TAIL_UP, p99 / aim))
        elif p99 < self.TAIL_LOW * self.bound:
            self.tail = max(1.0, self.tail / self.TAIL_DOWN)

    def started(self, observer: Observer, starts: Iterable[tuple[float, Admission]]) -> None:
        """Admitted work started: (its queue wait, its request's `Admission`) per row,
        source or request. Each one's error (actual minus expected wait, and minus the
        estimate before the margin) goes to `observer`; each request whose work has now all
        started is folded in by its longest wait (a request waits for its last row: its
        Server-Timing `queue` is that wait)."""
        errors, model_errors, whole = [], [], []
        for wait, admission in starts:
            errors.append(wait - admission.expected)
            model_errors.append(wait - admission.expected / admission.margin)
            done = admission.started(wait)
            if done is not None:
                whole.append(done)
        observer.on_wait_errors(errors, model_errors)
        self.observe(whole)

    def __call__(self, wait: float | None) -> float | None:
        return None if wait is None else wait * self.factor


@dataclass
class BatchCost(Measured):
    """Seconds of one batch as `fixed + units x per_unit`, fitted online from the (units,
    seconds) of recent batches by exponentially decayed least squares. A batch of a few tiny
    rows is mostly its fixed cost (a runtime call, the hand-back), so seconds / units alone
    inflates the cost of a queue of tiny rows many times over; this keeps the two apart.

    Guards: both terms non-negative (a negative intercept or slope is refitted with that term
    at 0); with too few batches or sizes too alike to separate them (relative spread of the
    sizes under `min_spread`), the split of the last fit that separated them, scaled to these
    batches, else per-unit only (`fixed` 0, seconds / units of the decayed sums). After a gap
    (stale) the fit restarts from the new batch: its level replaces the old estimate, the old
    split stays (one tiny batch after a pause, slowed by a busy machine, must not turn into a
    per-token cost that refuses a queue of tiny rows). `per_unit` is the seconds per unit
    on top of `fixed`."""

    alpha: float = 0.05
    """Weight of the newest batch (the fit remembers ~1 / alpha batches)."""
    min_spread: float = 0.1
    """Least coefficient of variation of the remembered batch sizes that fits a fixed term."""
    min_batches: int = 3
    """Fewest batches since the last restart that fit a fixed term."""
    fixed: float = 0.0
    """Seconds of a batch whatever its size."""
    batches: int = 0
    """Batches folded in since the last restart."""
    _sums: tuple[float, float, float, float, float] = (0.0, 0.0, 0.0, 0.0, 0.0)
    """Decayed sums of 1, units, seconds, units^2, units x seconds."""
    _split: tuple[float, float] | None = None
    """(fixed, per_unit) of the last fit that separated the terms."""

    def observe(self, units: int, seconds: float) -> None:
        """Fold in a batch of `units` that took `seconds`, and refit."""
        if units <= 0 or seconds <= 0:
            return
        keep = 0.0 if self.per_unit is None or self.stale() else 1 - self.alpha
        if keep == 0.0:
            self.batches = 0
        w, sx, sy, sxx, sxy = (keep * v for v in self._sums)
        x, y = float(units), float(seconds)
        self._sums = (w + 1, sx + x, sy + y, sxx + x * x, sxy + x * y)
        self.batches += 1
        self.observed_at = time.monotonic()
        self.fixed, self.per_unit = self._fit()

    def _fit(self) -> tuple[float, float]:
        w, sx, sy, sxx, sxy = self._sums
        mx, my = sx / w, sy / w
        var = max(sxx / w - mx * mx, 0.0)
        if self.batches < self.min_batches or var < (self.min_spread * mx) ** 2:
            if self._split is None:
                return 0.0, sy / sx  # per-unit only
            fixed, slope = self._split  # its shape, at these batches' level
            scale = sy / max(w * fixed + sx * slope, 1e-12)
            return fixed * scale, slope * scale
        slope = (sxy / w - mx * my) / var
        fixed = my - slope * mx
        if fixed < 0:  # through the origin
            fixed, slope = 0.0, sxy / sxx
        elif slope < 0:  # size does not matter here: the mean batch
            fixed, slope = my, 0.0
        self._split = (fixed, slope)
        return fixed, slope

    def seconds(self, units: float, batches: float = 1, parallel: int = 1) -> float | None:
        """Expected seconds of `batches` batches holding `units` in all, on `parallel`
        workers (None: unknown)."""
        if self.per_unit is None:
            return None
        return (batches * self.fixed + units * self.per_unit) / max(parallel, 1)


DEADLINE_MARGIN = 2.0
"""A request's deadline must leave this many times its expected wait plus compute: the
estimates are means, so a request let through with a deadline just above them misses it about
half the time, and is answered 504 after its work was spent (schemathesis found one: an OIP
`timeout` of 464 us on a busy machine) instead of a 429 at once."""
HANDOFF_S = 0.002
"""And this many seconds more: what the cost model does not measure, a request's way to its
batch thread and back to the event loop (a thread switch and a loop turn each way), which a
deadline of a few ms cannot absorb (schemathesis, once it reached real models through the
repository index: an OIP `timeout` of 839 us admitted and answered 504)."""


def admission_refusal(wait: float | None, service: float | None, deadline: float,
                      max_wait_s: float | None, now: float) -> str | None:
    """Why a request should be refused now, or None: its expected queue wait is over the
    server's bound, or its deadline leaves less than DEADLINE_MARGIN times its wait plus its
    own expected compute, plus HANDOFF_S."""
    wait = wait or 0.0
    if max_wait_s is not None and wait > max_wait_s:
        return f"expected queue wait {wait:.3f} s > {max_wait_s:.3f} s allowed"
    total = wait + (service or 0.0)
    if (wait or service) and DEADLINE_MARGIN * total + HANDOFF_S > deadline - now:
        return (f"expected queue wait {wait:.3f} s + compute {service or 0.0:.3f} s, "
                f"x{DEADLINE_MARGIN:g} and +{HANDOFF_S * 1000:g} ms for safety, > the "
                f"request's {max(deadline - now, 0.0):.3f} s left")
    return None


def admit_by_wait(what: str, wait: float | None, service: float | None, deadline: float,
                  max_wait_s: float | None, retry_after_s: float, idle_and_stale: bool,
                  probe: Callable[[], object]) -> None:
    """Admission by expected wait, as every scheduler does it: QueueFull (Retry-After from
    the backlog) when `admission_refusal` refuses. An idle scheduler whose estimate is stale
    (`idle_and_stale`) still refuses by it, and calls `probe()` first, which queues the
    refused work for no one, to measure again: a slow spell's estimate cannot refuse
    forever, and no request is let through on a guess only to miss its deadline (a 504)."""
    why = admission_refusal(wait, service, deadline, max_wait_s, time.monotonic())
    if why is None:
        return
    if idle_and_stale:
        probe()
    raise QueueFull(f"{what} cannot take it in time: {why}",
                    retry_after=max(retry_after_s, wait or 0.0))
