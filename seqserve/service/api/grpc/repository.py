"""Models while serving over gRPC: Triton's RepositoryIndex, RepositoryModelLoad,
RepositoryModelUnload, ModelConfig and ModelStatistics, answered as HTTP answers them.

Each RPC calls what the HTTP routes call (`api/repository.py`): the same model control
(`control_of`: the `Controller` itself in one process, else the link to the supervisor's, so a
load through any API process reaches every one), the same statistics summed over every
process (`statistics`), the same configuration (`model_config`); through the front's share
(`front.py`: the API key in the call's metadata, the request metrics, the access log).

Status codes: a model the control does not know, or no such model or version, NOT_FOUND; a
load that failed (with the reason), a configuration or files in the request (Triton's `config`
and `file:...` parameters: publish the bundle in the repository instead) or a repository name,
INVALID_ARGUMENT; what `--model-control` does not allow (HTTP's 409), FAILED_PRECONDITION; the
control not answering (the server stops), UNAVAILABLE. The configuration is model_config.proto's
part of Triton's, every other field of HTTP's answer in it: HTTP's `version` and `seqserve`
sections travel as the string parameters `version` and `seqserve` (JSON).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import grpc
from google.protobuf import json_format
from pydantic import ValidationError

from seqserve.service.api.common import describe_errors
from seqserve.service.api.grpc import messages as pb
from seqserve.service.api.grpc.front import Front, Rpc
from seqserve.service.api.lifecycle import Call
from seqserve.service.api.repository import (
    LoadParameters,
    config_of,
    control_of,
    entries,
    statistics,
)
from seqserve.service.core.errors import BadRequest, ServiceError
from seqserve.service.repository.control import Refused
from seqserve.service.web.state import AppState


def _rpc(method: str, endpoint: str) -> Rpc:
    return Rpc(f"/{pb.INFERENCE}/{method}", endpoint)


INDEX = _rpc("RepositoryIndex", "grpc_repository_index")
LOAD = _rpc("RepositoryModelLoad", "grpc_repository_load")
UNLOAD = _rpc("RepositoryModelUnload", "grpc_repository_unload")
CONFIG = _rpc("ModelConfig", "grpc_model_config")
STATISTICS = _rpc("ModelStatistics", "grpc_model_stats")


class ControlRefused(ServiceError):
    """A `Refused` of the model control, with its status (409: FAILED_PRECONDITION)."""

    def __init__(self, refused: Refused) -> None:
        super().__init__(str(refused))
        self.status = refused.status
        if refused.status == 409:
            self.grpc_code = grpc.StatusCode.FAILED_PRECONDITION


class RepositoryRpcs:
    """The five RPCs (module doc) for one app's state, over its front."""

    def __init__(self, state: AppState, front: Front) -> None:
        self.state, self.front = state, front

    def methods(self) -> dict[str, Callable[..., Any]]:
        return {"RepositoryIndex": self.index, "RepositoryModelLoad": self.load,
                "RepositoryModelUnload": self.unload, "ModelConfig": self.config,
                "ModelStatistics": self.statistics}

    async def index(self, request: Any, context: Any) -> Any:
        async def work(call: Call) -> Any:
            _one_repository(request)
            rows = await control_of(self.state).index(request.ready)
            model = pb.RepositoryIndexResponse.ModelIndex
            return pb.RepositoryIndexResponse(models=[model(**r) for r in rows])

        return await self.front.unary(INDEX, context, "", None, work)

    async def load(self, request: Any, context: Any) -> Any:
        return await self._change(LOAD, request, context, True)

    async def unload(self, request: Any, context: Any) -> Any:
        return await self._change(UNLOAD, request, context, False)

    async def _change(self, rpc: Rpc, request: Any, context: Any, load: bool) -> Any:
        async def work(call: Call) -> Any:
            _one_repository(request)
            _parameters(request)
            control = control_of(self.state)
            try:
                await (control.load(name) if load else control.unload(name))
            except Refused as exc:
                raise ControlRefused(exc) from None
            return (pb.RepositoryModelLoadResponse() if load
                    else pb.RepositoryModelUnloadResponse())

        name = request.model_name
        return await self.front.unary(rpc, context, name, None, work)

    async def config(self, request: Any, context: Any) -> Any:
        async def work(call: Call) -> Any:
            found = config_of(self.state, request.name, request.version or None)
            extra = {"version": found.pop("version"),
                     "seqserve": json.dumps(found.pop("seqserve"))}
            config = json_format.ParseDict(found, pb.ModelConfig())
            for key, value in extra.items():
                config.parameters[key].string_value = value
            return pb.ModelConfigResponse(config=config)

        return await self.front.unary(CONFIG, context, request.name, request.version or None,
                                      work)

    async def statistics(self, request: Any, context: Any) -> Any:
        async def work(call: Call) -> Any:
            if request.version and not request.name:
                raise BadRequest("a version without a model name: name the model too")
            found = entries(self.state, request.name or None, request.version or None)
            stats = statistics(self.state, found)
            return json_format.ParseDict({"model_stats": stats},
                                         pb.ModelStatisticsResponse())

        return await self.front.unary(STATISTICS, context, request.name,
                                      request.version or None, work)


def _one_repository(request: Any) -> None:
    if request.repository_name:
        raise BadRequest(f"repository_name {request.repository_name[:128]!r}: this server "
                         "serves one repository (--repo); leave it empty")


def _parameters(request: Any) -> None:
    """The load or unload parameters as HTTP's `LoadParameters` takes them (BadRequest)."""
    given: dict[str, Any] = {}
    for key, parameter in request.parameters.items():
        which = parameter.WhichOneof("parameter_choice")
        given[key] = None if which is None else getattr(parameter, which)
    try:
        LoadParameters.model_validate(given)
    except ValidationError as exc:
        raise BadRequest(f"bad parameters: {describe_errors(exc.errors())} (a configuration "
                         "or files are not taken: publish the bundle in the repository)"
                         ) from exc
