"""The KServe v2 / Triton gRPC services: `inference.GRPCInferenceService` and `grpc.health.v1`.

Every RPC runs through the gRPC front's share (`front.py`: request id, API keys, in-flight
count, deadline, metrics, access log, status codes) and the one request lifecycle
(`api/lifecycle.py`: lookup, deadline, shedding, in flight, disconnects), as HTTP's routes do:

- ServerLive, ServerReady (`AppState.ready`: every version loaded, not draining), ModelReady
  (false for a version that is not ready, and for an unknown model or version, as Triton),
  ServerMetadata, ModelMetadata (the HTTP OIP's, `oip/tasks.signature`);
- ModelInfer: the HTTP OIP's infer (`oip/routes.infer_answer`'s steps on the request
  `codec.v2_request` reads: the same checks, the same task code, `sequence_id`,
  `sequence_start` and `sequence_end` as sessions);
- ModelStreamInfer: each request on the stream is answered on it, concurrently, each its own
  request for the lifecycle, the metrics and the log; a failed one is a response with its
  `error_message` (the stream goes on). A stream with no request for
  `stream_idle_timeout_s` while none of its requests is in flight ends UNAVAILABLE (as an
  idle connection closes). A language model's request streams its generation as
  the HTTP generate_stream does: input `text_input` BYTES [1] (an optional `stream` BOOL
  input, as vLLM's examples send, must be true), the generate extension's parameters as
  request parameters (`max_tokens`, `temperature`, `top_k`, `top_p`, `seed`, `stop`), one
  response per token (`text_output` BYTES [1]), then a last one with an empty `text_output`
  and the parameters `finish_reason`, `prompt_tokens`, `completion_tokens`; every response
  says `triton_final_response` (true on the last). Any other model answers each request
  with one response (`triton_final_response` true). When the server stops listening, a
  stream takes no new request: it ends once its requests are answered;
- grpc.health.v1 Check / Watch: service "" (also "inference.GRPCInferenceService" and
  "ready") is SERVING once the server is ready, NOT_SERVING while loading or draining;
  "live" SERVING while the process answers; another name NOT_FOUND (Check) or
  SERVICE_UNKNOWN (Watch). A Watch ends, after a last NOT_SERVING, when the server stops.

- RepositoryIndex, RepositoryModelLoad / Unload, ModelConfig, ModelStatistics: the model
  control's, as HTTP answers them (`repository.py`).

Any other RPC (Triton's shared-memory, trace and log RPCs, health's List) answers
UNIMPLEMENTED: no handler is registered for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from pydantic import ValidationError

from seqserve.service.api.common import describe_errors
from seqserve.service.api.generate import count_tokens, token_timer
from seqserve.service.api.grpc import codec
from seqserve.service.api.grpc import messages as pb
from seqserve.service.api.grpc.front import Front, Rpc, done_future, request_id
from seqserve.service.api.grpc.repository import RepositoryRpcs
from seqserve.service.api.lifecycle import Call, RequestCall, admit
from seqserve.service.api.oip import codec as oip
from seqserve.service.api.oip import tasks
from seqserve.service.api.oip.generate import StreamParameters
from seqserve.service.core.errors import BadRequest, ServiceError
from seqserve.service.web.state import AppState
from seqserve.service.workers.base import RequestContext
from seqserve.service.workers.lm import LMWorker

EXTENSIONS = ("binary_tensor_data", "parameters", "sequence", "generate", "model_repository",
              "statistics", "model_configuration")
"""The protocol extensions ServerMetadata lists (the server's, as over HTTP)."""
FINAL = "triton_final_response"
STREAM_PARAMETERS = ("triton_enable_empty_final_response",)
"""Request parameters of Triton's stream protocol (its clients send them): accepted, removed
before the generate parameters are read (every response says `triton_final_response`)."""
WATCH_PERIOD_S = 0.5
"""How often a health Watch looks at the status."""
READY_SERVICES = ("", pb.INFERENCE, "ready")
LIVE_SERVICES = ("live",)


def _rpc(service: str, method: str, endpoint: str, **rules: bool) -> Rpc:
    return Rpc(f"/{service}/{method}", endpoint, **rules)


LIVE = _rpc(pb.INFERENCE, "ServerLive", "grpc_server_live", traffic=False, health=True)
READY = _rpc(pb.INFERENCE, "ServerReady", "grpc_server_ready", traffic=False, health=True)
MODEL_READY = _rpc(pb.INFERENCE, "ModelReady", "grpc_model_ready")
SERVER_METADATA = _rpc(pb.INFERENCE, "ServerMetadata", "grpc_server_metadata")
MODEL_METADATA = _rpc(pb.INFERENCE, "ModelMetadata", "grpc_model_metadata")
INFER = _rpc(pb.INFERENCE, "ModelInfer", "grpc_infer", inference=True)
STREAM_INFER = _rpc(pb.INFERENCE, "ModelStreamInfer", "grpc_stream_infer", inference=True)
CHECK = _rpc(pb.HEALTH, "Check", "grpc_health", traffic=False, health=True)
WATCH = _rpc(pb.HEALTH, "Watch", "grpc_health", traffic=False, health=True)


class InferenceService:
    """The RPCs of both services for one app's state (module doc)."""

    def __init__(self, state: AppState, version: str) -> None:
        self.state = state
        self.version = version
        self.front = Front(state)
        self.closing = asyncio.Event()
        """Set when the server stops listening (streams end once their requests are
        answered, Watches at once)."""

    def handlers(self) -> list[grpc.GenericRpcHandler]:
        """The generic handlers of both services, one per method the .proto declares."""
        own: dict[str, dict[str, Callable[..., Any]]] = {
            pb.INFERENCE: {
                "ServerLive": self.server_live, "ServerReady": self.server_ready,
                "ModelReady": self.model_ready, "ServerMetadata": self.server_metadata,
                "ModelMetadata": self.model_metadata, "ModelInfer": self.model_infer,
                "ModelStreamInfer": self.model_stream_infer,
                **RepositoryRpcs(self.state, self.front).methods()},
            pb.HEALTH: {"Check": self.check, "Watch": self.watch},
        }
        out: list[grpc.GenericRpcHandler] = []
        for service, methods in own.items():
            table = {}
            for name, (request, response, client_streams, server_streams) in \
                    pb.method_types(service).items():
                make = _HANDLERS[client_streams, server_streams]
                table[name] = make(methods[name], request_deserializer=request.FromString,
                                   response_serializer=response.SerializeToString)
            out.append(grpc.method_handlers_generic_handler(service, table))
        return out

    # -- health and metadata ----------------------------------------------------------

    async def server_live(self, request: Any, context: Any) -> Any:
        return await self.front.unary(LIVE, context, "", None, _now(pb.ServerLiveResponse(
            live=True)))

    async def server_ready(self, request: Any, context: Any) -> Any:
        return await self.front.unary(READY, context, "", None, lambda call: _value(
            pb.ServerReadyResponse(ready=self.state.ready)))

    async def model_ready(self, request: Any, context: Any) -> Any:
        def ready(call: Call) -> Any:
            try:
                entry = self.state.repository.entry(call.model, call.version)
            except ServiceError:  # no such model or version: not ready (Triton's answer)
                return pb.ModelReadyResponse(ready=False)
            return pb.ModelReadyResponse(ready=entry.state == "ready"
                                         and not self.state.draining)

        return await self.front.unary(MODEL_READY, context, request.name,
                                      request.version or None, lambda call: _value(ready(call)))

    async def server_metadata(self, request: Any, context: Any) -> Any:
        return await self.front.unary(SERVER_METADATA, context, "", None, _now(
            pb.ServerMetadataResponse(name="seqserve", version=self.version,
                                      extensions=EXTENSIONS)))

    async def model_metadata(self, request: Any, context: Any) -> Any:
        def metadata(call: Call) -> Any:
            repo = self.state.repository
            entry, worker = repo.ready(call.model, call.version)
            inputs, outputs = tasks.signature(worker)
            versions = [str(v) for v, e in sorted(repo.versions(call.model).items())
                        if e.state == "ready"]
            tensor = pb.ModelMetadataResponse.TensorMetadata
            return pb.ModelMetadataResponse(
                name=call.model, versions=versions, platform=f"seqserve_{entry.task}",
                inputs=[tensor(**t) for t in inputs], outputs=[tensor(**t) for t in outputs])

        return await self.front.unary(MODEL_METADATA, context, request.name,
                                      request.version or None,
                                      lambda call: _value(metadata(call)))

    async def check(self, request: Any, context: Any) -> Any:
        def status(call: Call) -> Any:
            found = self._health(request.service)
            if found is None:
                raise _UnknownService(f"unknown service {request.service[:128]!r}")
            return pb.HealthCheckResponse(status=found)

        return await self.front.unary(CHECK, context, "", None, lambda call: _value(
            status(call)))

    async def watch(self, request: Any, context: Any) -> AsyncIterator[Any]:
        await self.front.opened(WATCH, context)
        last = None
        while True:
            found = self._health(request.service)
            now = pb.SERVICE_UNKNOWN if found is None else found
            if self.closing.is_set():
                now = pb.NOT_SERVING if found is not None else now
            if now != last:
                yield pb.HealthCheckResponse(status=now)
                last = now
            if self.closing.is_set():
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.closing.wait(), WATCH_PERIOD_S)

    def _health(self, service: str) -> int | None:
        if service in READY_SERVICES:
            return pb.SERVING if self.state.ready else pb.NOT_SERVING
        if service in LIVE_SERVICES:
            return pb.SERVING
        return None

    # -- inference ------------------------------------------------------------------

    async def model_infer(self, request: Any, context: Any) -> Any:
        return await self.front.unary(INFER, context, request.model_name,
                                      request.model_version or None,
                                      lambda call: self.infer(call, request))

    async def infer(self, call: Call, request: Any) -> Any:
        """One infer request's answer: HTTP OIP infer's steps (`oip.tasks.run_infer`)."""
        entry, _, outputs, asked, extra = await tasks.run_infer(
            self.state, call, lambda call: codec.v2_request(request))
        version = tasks.answered_version(entry, extra)
        return codec.infer_response(entry.name, version, request.id, outputs,
                                    asked, extra, typed=codec.typed_data(request))

    async def model_stream_infer(self, requests: Any, context: Any) -> None:
        """Each request of the stream, concurrently, answered on it (module doc)."""
        metadata = await self.front.opened(STREAM_INFER, context)
        gone = done_future(context)
        lock = asyncio.Lock()

        async def emit(response: Any) -> None:
            async with lock:
                await context.write(response)

        running: set[asyncio.Future[None]] = set()
        incoming = aiter(requests)
        closing = asyncio.ensure_future(self.closing.wait())
        idle_s = self.state.settings.stream_idle_timeout_s
        idle = False
        nxt: asyncio.Future[Any] | None = None
        try:
            while True:
                if nxt is None:
                    nxt = asyncio.ensure_future(anext(incoming, None))
                done, _ = await asyncio.wait({nxt, closing, *running},
                                             timeout=None if running else idle_s,
                                             return_when=asyncio.FIRST_COMPLETED)
                if not nxt.done() and (closing.done() or not done):
                    nxt.cancel()  # the server stops listening, or the stream sat idle
                    idle = not done
                    break
                if not nxt.done():  # one of its requests finished: wait on
                    continue
                request, nxt = nxt.result(), None
                if request is None:
                    break
                task = asyncio.ensure_future(self._stream_request(
                    request, context, metadata, gone, emit))
                running.add(task)
                task.add_done_callback(running.discard)
            if running:
                await asyncio.gather(*running)
        finally:
            closing.cancel()
            for left in running:
                left.cancel()
        if idle:
            await context.abort(grpc.StatusCode.UNAVAILABLE,
                                f"ModelStreamInfer stream idle for {idle_s:g} s (no request, "
                                "none in flight: stream_idle_timeout_s): open a new stream")

    async def _stream_request(self, request: Any, context: Any, metadata: dict[str, str],
                              gone: asyncio.Future[Any],
                              emit: Callable[[Any], Awaitable[None]]) -> None:
        async def work(call: Call) -> None:
            _, worker = self.state.repository.ready(call.model, call.version)
            if isinstance(worker, LMWorker):
                await self.generate(call, request, emit)
                return
            response = await self.infer(call, request)
            response.parameters[FINAL].bool_param = True
            await emit(pb.ModelStreamInferResponse(infer_response=response))

        outcome = await self.front.run(STREAM_INFER, context, request.model_name,
                                       request.model_version or None, work, metadata,
                                       request_id(metadata), gone, check_key=False)
        if outcome.status != 200:
            failed = pb.ModelInferResponse(model_name=request.model_name,
                                           model_version=request.model_version, id=request.id)
            with contextlib.suppress(Exception):  # the stream may be over
                await emit(pb.ModelStreamInferResponse(error_message=outcome.message,
                                                       infer_response=failed))

    async def generate(self, call: Call, request: Any,
                       emit: Callable[[Any], Awaitable[None]]) -> None:
        """A language model's streamed generation (module doc): the lifecycle's admission,
        then its tokens inside the request's one `RequestCall`."""
        found: dict[str, Any] = {}

        def read(call: Call) -> None:
            found["req"], found["tail"] = codec.v2_request(request)
            call.asked_s = oip.timeout_s(found["req"])

        entry, worker, timeout = admit(self.state, call, LMWorker, read=read)
        prompt, params = generate_request(found["req"], found["tail"])
        context = RequestContext(deadline=time.monotonic() + timeout)
        generation = worker.start([prompt], params, context,
                                  token_timer(self.state, call.model))
        head = (entry.name, str(entry.version), request.id)
        finish = "length"
        async with RequestCall(self.state, call, context=context):
            try:
                async for batch in generation.batches():
                    for ev in batch:
                        if "text" in ev:
                            await emit(pb.ModelStreamInferResponse(
                                infer_response=codec.text_response(*head, ev["text"],
                                                                   {FINAL: False})))
                        finish = ev.get("finish_reason", finish)
                usage = generation.usage()
                await emit(pb.ModelStreamInferResponse(infer_response=codec.text_response(
                    *head, "", {"finish_reason": finish, **usage, FINAL: True})))
            finally:
                count_tokens(self.state, call.model, generation)


def generate_request(req: Any, tail: bytes) -> tuple[str, Any]:
    """The prompt and the `GenerateParams` of a streamed generate request (module doc)."""
    inputs = oip.decode_inputs(req, tail)
    stream = inputs.pop("stream", None)
    if stream is not None and (stream.datatype != "BOOL" or stream.data != [True]):
        raise BadRequest("input 'stream' must be BOOL [1] true (or left out): "
                         "ModelStreamInfer streams")
    text = inputs.get("text_input")
    if text is None or len(inputs) != 1:
        raise BadRequest(f"expected the input 'text_input' (BYTES [1]) and optionally "
                         f"'stream', got {sorted([*inputs, *(['stream'] if stream else [])])}")
    if text.datatype != "BYTES" or len(text.data) != 1 or len(text.shape) not in (1, 2):
        raise BadRequest(f"input 'text_input' must be one text, BYTES [1] (or [1, 1]), got "
                         f"{text.datatype} {text.shape}")
    prompt = text.data[0]
    if isinstance(prompt, bytes):
        try:
            prompt = prompt.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise BadRequest("text_input[0] is not valid UTF-8") from exc
    given = oip.request_parameters(req)
    for name in STREAM_PARAMETERS:
        given.pop(name, None)
    try:
        params = StreamParameters.model_validate(given).params()
    except ValidationError as exc:
        raise BadRequest(f"bad parameters: {describe_errors(exc.errors())}") from exc
    return prompt, params


class _UnknownService(ServiceError, status=404):
    """A health Check for a service this server does not know (NOT_FOUND, as the health
    protocol asks)."""


def _now(response: Any) -> Callable[[Call], Awaitable[Any]]:
    return lambda call: _value(response)


async def _value(response: Any) -> Any:
    return response


_HANDLERS: dict[tuple[bool, bool], Callable[..., grpc.RpcMethodHandler]] = {
    (False, False): grpc.unary_unary_rpc_method_handler,
    (False, True): grpc.unary_stream_rpc_method_handler,
    (True, False): grpc.stream_unary_rpc_method_handler,
    (True, True): grpc.stream_stream_rpc_method_handler,
}
