"""The rule by which a front writes the lifecycle's one head refusal it may write itself, an
overloaded model's 429, without a call into Python per request (`FrontRule`; the native
front: native/front/src/shed.rs), and the app's inference paths it reads (`HeadRoutes`: the
hot path's `head_routes`). `web.middleware.HttpLifecycle.front_rule` makes it."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

from seqserve.service.core.answers import ErrorShape, Headers, error_answer
from seqserve.service.web.access_log import ID_BYTES, ID_MAX
from seqserve.service.web.responses import shape_of

if TYPE_CHECKING:
    from seqserve.service.web.access_log import AccessLog
    from seqserve.service.web.state import AppState


class HeadRoutes(NamedTuple):
    """An app's inference paths as a front reads them (the hot path's `head_routes`)."""

    pairs: list[tuple[str, str | None]]
    """The (model, version) pairs the paths name (version None: the default)."""
    paths: dict[str, tuple[int, str]]
    """Every inference path of them as a client sends it: its pair's index, its endpoint."""
    message: str
    """The refusal's message, `{ahead}`, `{front}` and `{budget}` where the seconds go ..."""
    after: str
    """... and what `{front}` is when the time since the front read it is the reason
    (`{waited}`)."""


class FrontRule:
    """What a front needs to write the one head refusal of `_head` it may write itself, an
    overloaded model's 429 (the app's `head`: `shed_early`), without a call into Python per
    request (the native front: native/front/src/shed.rs): its routes (again when the
    repository's models or versions change) and the state of each loop turn (`state`), both
    given by `publish`; and the accounting of what it refused (`refused`: the request
    metrics, the access log's left-out refusals). The front refuses only where this rule
    says `_head` would, and passes anything else (another content type, a CORS request, a
    line due in the access log) to the full decision."""

    MESSAGE = "@@message@@"
    REQUEST_ID = "@@request_id@@"
    """Where the message and the request id go in the error template."""
    MAX_AGE_S = 0.25
    """A state older than this refuses nothing at the front: a model's estimate changes as
    the loop turns that run its work publish it, and one that changed without a turn (the
    queue drained while the loop slept, or a test that sets it) reaches the front within
    this."""
    PRESSED = 0.1
    """A model whose expected wait is at least this share of `max_queue_wait_s` is pressed:
    the front then needs a fresh state often (`publish`)."""

    def __init__(self, state: AppState, cors: bool, log: AccessLog,
                 routes_of: Callable[[], HeadRoutes],
                 waits_of: Callable[[list[tuple[str, str | None]]], list[float]]) -> None:
        self.app_state = state
        self.cors = cors
        """CORS is on (a request with an Origin is the lifecycle's)."""
        self.log = log
        self.routes_of = routes_of
        self.waits_of = waits_of
        self.generation = -1
        """The repository's `generation` the front's routes were made of."""
        self.pairs: list[tuple[str, str | None]] = []
        self.series: list[tuple[str, str]] = []
        """Each series' (model, endpoint), by the index the front counts refusals under."""

    def publish(self, front: Any) -> bool:
        """Give `front` this turn's state (`Front.shed_state`), and first its routes
        (`Front.shed_routes`) when the repository's models or versions changed since the last
        call: the refusals it wrote by the routes they replace are counted by those. True
        when a model is pressed (`PRESSED`)."""
        state = self.app_state
        if state.repository.generation != self.generation:
            self.generation = state.repository.generation
            found = self.routes_of()
            paths, templates, series = self._routes(found)
            s = state.settings
            self.refused(front.shed_routes(
                paths, templates=templates, request_timeout_s=s.request_timeout_s,
                max_queue_wait_s=s.max_queue_wait_s, retry_after_s=s.retry_after_s,
                cors=self.cors, max_age_s=self.MAX_AGE_S,
                message=found.message, after=found.after, id_bytes=ID_BYTES,
                id_max=ID_MAX))
            self.pairs, self.series = found.pairs, series
        waits, open_, quiet = self.state()
        front.shed_state(waits, open_, quiet)
        return max((w for w in waits if w == w), default=0.0) >= \
            self.PRESSED * state.settings.max_queue_wait_s  # (NaN: not ready, left out)

    def _routes(self, found: HeadRoutes) -> tuple[dict[str, tuple[int, int, int]],
                                                  list[tuple[Headers, str]],
                                                  list[tuple[str, str]]]:
        """The front's routes of the app's paths: {path: (pair, series, template)}, the
        error templates (the one error answer of each path's shape, its content type and body
        with the markers), and each series' (model, endpoint)."""
        series: dict[tuple[str, str], int] = {}
        shapes: dict[ErrorShape, int] = {}
        templates: list[tuple[Headers, str]] = []
        paths: dict[str, tuple[int, int, int]] = {}
        for path, (index, endpoint) in found.paths.items():
            shape = shape_of({"path": path})
            if shape not in shapes:
                shapes[shape] = len(templates)
                _, headers, body = error_answer(429, self.MESSAGE, shape=shape,
                                                request_id=self.REQUEST_ID)
                templates.append(([h for h in headers if h[0] == b"content-type"],
                                  body.decode()))
            model = found.pairs[index][0]
            paths[path] = (index, series.setdefault((model, endpoint), len(series)),
                           shapes[shape])
        return paths, templates, list(series)

    def state(self) -> tuple[list[float], bool, float]:
        """This turn's state (`Front.shed_state`'s arguments): each pair's expected wait,
        whether a front may refuse at all (not draining, fewer than max_in_flight in flight:
        that 429 is `_head`'s first), until when a refusal's access line is left out."""
        state = self.app_state
        open_ = not state.draining and state.in_flight() < state.settings.max_in_flight
        return (self.waits_of(self.pairs), open_,
                self.log.quiet_until(time.monotonic()))

    def refused(self, tallies: list[tuple[int, float]]) -> None:
        """Count the front's refusals ([(series, seconds)]) as `answer_head` counts its own:
        the request metrics, and the access log's refusals left out."""
        count = self.app_state.metrics.on_request
        for series, seconds in tallies:
            model, endpoint = self.series[series]
            count(model, endpoint, 429, seconds)
        if tallies:
            self.log.left_out(len(tallies))
