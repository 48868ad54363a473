"""Open Inference Protocol (KServe v2) REST: server/model metadata and readiness (FastAPI's
routes), and infer (a `lifecycle.Route`)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel

from seqserve.service.api.common import ERRORS, app_state
from seqserve.service.api.lifecycle import Call, Route
from seqserve.service.api.oip import codec, tasks
from seqserve.service.api.oip.schemas import (
    V2InferRequest,
    V2ModelMetadata,
    V2ServerMetadata,
)
from seqserve.service.core.answers import Answer, encode_json
from seqserve.service.repository.entries import ModelEntry
from seqserve.service.web.responses import JsonResponse, as_response, error_for
from seqserve.service.web.state import AppState

router = APIRouter(prefix="/v2", tags=["v2"], responses=ERRORS)


@router.get("", name="v2_server_metadata")
async def server_metadata(request: Request) -> V2ServerMetadata:
    return V2ServerMetadata(name="seqserve", version=request.app.version, extensions=[
        "binary_tensor_data", "parameters", "sequence", "generate", "model_repository",
        "statistics", "model_configuration"])


def _metadata(request: Request, name: str, version: str | None) -> V2ModelMetadata:
    repo = app_state(request).repository
    entry, worker = repo.ready(name, version)
    inputs, outputs = tasks.signature(worker)
    versions = [str(v) for v, e in sorted(repo.versions(name).items()) if e.state == "ready"]
    return V2ModelMetadata.model_validate({
        "name": name, "versions": versions, "platform": f"seqserve_{entry.task}",
        "inputs": inputs, "outputs": outputs,
    })


@router.get("/models/{name}", name="v2_model_metadata")
async def model_metadata(name: str, request: Request) -> V2ModelMetadata:
    return _metadata(request, name, None)


@router.get("/models/{name}/versions/{version}", name="v2_model_metadata")
async def model_version_metadata(name: str, version: str, request: Request) -> V2ModelMetadata:
    return _metadata(request, name, version)


def _ready(request: Request, name: str, version: str | None) -> Response:
    entry = app_state(request).repository.entry(name, version)
    ok = entry.state == "ready" and not app_state(request).draining
    body: dict[str, Any] = {"name": name, "version": str(entry.version), "ready": ok}
    if ok:
        return JsonResponse(body)
    message = f"model {name!r} version {entry.version} is not ready ({entry.state})"
    return as_response(error_for(request.scope, 503, message, fields=body))


class ModelReadiness(BaseModel):
    name: str
    version: str
    ready: bool
    error: str | None = None
    request_id: str | None = None


READY: dict[int | str, dict[str, Any]] = {200: {"model": ModelReadiness},
                                          503: {"model": ModelReadiness}}


@router.get("/models/{name}/ready", name="v2_model_ready", responses=READY)
async def model_ready(name: str, request: Request) -> Response:
    return _ready(request, name, None)


@router.get("/models/{name}/versions/{version}/ready", name="v2_model_ready",
            responses=READY)
async def model_version_ready(name: str, version: str, request: Request) -> Response:
    return _ready(request, name, version)


async def infer_answer(state: AppState, call: Call, body: bytes) -> Answer:
    """An infer request's answer: JSON, or the binary tensor data extension's."""
    entry, req, outputs, asked, extra = await tasks.run_infer(
        state, call, lambda call: codec.parse_request(body, call.header(HEADER)))
    head, payload, media = response_parts(entry, req, outputs, asked, extra)
    return 200, [(b"content-type", media.encode()), *head,
                 (b"content-length", str(len(payload)).encode())], payload


HEADER = codec.HEADER.encode()
ROUTES = [Route("/v2", "infer", "v2_infer", None, answer=infer_answer, documented=False)]
"""POST /v2/models/{name}[/versions/{v}]/infer (`lifecycle.Route`): the OpenAPI document
lists one infer operation per served model instead (`server/openapi.py`): the body depends
on the model behind the path."""


def response_parts(entry: ModelEntry, req: V2InferRequest, outputs: list[codec.V2Tensor],
                   asked: list[str], parameters: dict[str, Any] | None = None
                   ) -> tuple[list[tuple[bytes, bytes]], bytes, str]:
    """Extra headers, body and media type of an infer answer with the `asked` outputs (all
    when none were named), each as JSON data or binary per the request, and the answer's
    own `parameters` if any."""
    head: dict[str, Any] = {"model_name": entry.name,
                            "model_version": tasks.answered_version(entry, parameters)}
    if req.id is not None:
        head["id"] = req.id
    if parameters:
        head["parameters"] = parameters
    blobs, listed = [], []
    for t in outputs:
        if asked and t.name not in asked:
            continue
        item: dict[str, Any] = {"name": t.name, "datatype": t.datatype, "shape": t.shape}
        if codec.wants_binary(req, t.name):
            blob = codec.encode_binary(t)
            item["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        else:
            item["data"] = [x.decode() if isinstance(x, bytes) else x for x in t.data]
        listed.append(item)
    head["outputs"] = listed
    text = encode_json(head)
    if not blobs:
        return [], text, "application/json"
    return ([(b"inference-header-content-length", str(len(text)).encode())],
            text + b"".join(blobs), "application/octet-stream")
