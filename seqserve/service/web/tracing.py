"""OpenTelemetry spans of the requests, exported over OTLP/HTTP (off by default:
`--otel-endpoint`; the `otel` extra, `pip install seqserve[otel]`).

Every request already has its place in a W3C trace (`web.access_log.Trace`: the client's
`traceparent` continued, else a new trace); with an endpoint set, the server also records its
span of that trace and exports it (batched, off the request path, by OpenTelemetry's SDK):

- the request's span, named by its method and route template (`POST
  /v1/models/{name}/classify`), from when the front read the request to its answer's end,
  with the span id its answer's `traceparent` names (the ids are the ones the server chose
  for the request: `_RequestIds`), its parent the client's span, and the attributes
  `http.request.method`, `http.route`, `http.response.status_code`, `seqserve.model`,
  `seqserve.version`, `seqserve.request_id`; an answer of 500 or more marks it an error;
- two children for a request that computed: `queue` (waiting for its batch, or for its
  admission to decoding) and `compute` (the runtime's time; a translation's or generation's
  whole decode), placed back from the answer by their durations (the request context knows
  how long, not when: the time after compute is the answer's own work); `compute` carries
  its summary: `seqserve.batch_rows` (the rows of the batch the request's rows ran in), and
  for a translation the decode steps, `seqserve.decode_steps`, and their mean,
  `seqserve.decode_step_ms` (one span per step would be one per 0.1 ms).

A new trace the server starts is sampled when spans are on (`traceparent` flags 01); a
client's decision (its flags) is kept: a parent not sampled records nothing.
"""

from __future__ import annotations

import contextvars
import time
from typing import Any

from seqserve.service.web.access_log import Trace

_ids: contextvars.ContextVar[tuple[int, int] | None] = contextvars.ContextVar(
    "seqserve_span_ids", default=None)
"""The (trace id, span id) the next span takes (`_RequestIds`)."""


class Spans:
    """The span recorder of one app (module doc); `of(settings)` is None when off."""

    def __init__(self, endpoint: str, service_name: str) -> None:
        from opentelemetry import trace as otel
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

        class _RequestIds(RandomIdGenerator):
            """The ids the server chose for the request (its `Trace`), else random ones."""

            def generate_trace_id(self) -> int:
                chosen = _ids.get()
                return chosen[0] if chosen is not None else super().generate_trace_id()

            def generate_span_id(self) -> int:
                chosen = _ids.get()
                return chosen[1] if chosen is not None else super().generate_span_id()

        self._otel = otel
        self.provider = TracerProvider(resource=Resource.create({"service.name": service_name}),
                                       id_generator=_RequestIds(), shutdown_on_exit=False)
        self.provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
        self.tracer = self.provider.get_tracer("seqserve")

    @classmethod
    def of(cls, settings: Any) -> Spans | None:
        """The recorder `settings` ask for (`otel_endpoint`), or None."""
        endpoint = getattr(settings, "otel_endpoint", None)
        return cls(endpoint, settings.otel_service_name) if endpoint else None

    def start(self, trace: Trace, name: str, started: float) -> Any:
        """The request's span, begun at `started` (`time.monotonic()`), with the trace's
        ids; `trace.flags` become the span's sampling decision."""
        otel = self._otel
        parent = otel.set_span_in_context(otel.NonRecordingSpan(otel.SpanContext(
            int(trace.trace_id, 16), int(trace.parent_id, 16), is_remote=True,
            trace_flags=otel.TraceFlags(int(trace.flags, 16))))) if trace.parent_id else None
        token = _ids.set((int(trace.trace_id, 16), int(trace.span_id, 16)))
        try:
            span = self.tracer.start_span(name, context=parent, kind=otel.SpanKind.SERVER,
                                          start_time=_wall_ns(started))
        finally:
            _ids.reset(token)
        trace.flags = f"{int(span.get_span_context().trace_flags):02x}"
        return span

    def end(self, span: Any, status: int, attributes: dict[str, Any], call: Any) -> None:
        """End the request's span with its answer: `status`, `attributes`, and the queue and
        compute children of its request context `call` (None: it computed nothing)."""
        if not span.is_recording():
            span.end()
            return
        now = time.time_ns()
        span.set_attributes({**attributes, "http.response.status_code": status})
        if status >= 500:
            span.set_status(self._otel.Status(self._otel.StatusCode.ERROR))
        if call is not None and call.computed:
            context = self._otel.set_span_in_context(span)
            compute_start = now - int(call.compute_s * 1e9)
            self.tracer.start_span("queue", context=context, start_time=compute_start - int(
                call.queue_s * 1e9)).end(compute_start)
            summary: dict[str, Any] = {}
            if call.batch_rows:
                summary["seqserve.batch_rows"] = call.batch_rows
            if call.decode_steps:
                summary["seqserve.decode_steps"] = call.decode_steps
                summary["seqserve.decode_step_ms"] = call.compute_s * 1000 / call.decode_steps
            self.tracer.start_span("compute", context=context, start_time=compute_start,
                                   attributes=summary).end(now)
        span.end(now)

    def shutdown(self) -> None:
        """Export what is left (the server stops)."""
        self.provider.shutdown()


def _wall_ns(monotonic: float) -> int:
    """The wall-clock time in ns of a `time.monotonic()` reading."""
    return time.time_ns() - int((time.monotonic() - monotonic) * 1e9)
