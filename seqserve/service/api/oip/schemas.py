"""Open Inference Protocol (KServe v2) REST schemas: infer request/response and metadata."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr

from seqserve.service.api.common import WholeInt, standard_bounds


class V2RequestInput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: StrictStr
    shape: list[WholeInt]
    datatype: StrictStr
    parameters: dict[str, Any] | None = None
    data: Any = None


class OutputParameters(BaseModel):
    """Parameters of one requested output."""

    model_config = ConfigDict(extra="forbid", json_schema_extra=standard_bounds)

    binary_data: StrictBool | None = None
    """Send this output in the binary tensor data extension (else JSON `data`)."""
    classification: WholeInt | None = Field(None, ge=1)
    """Triton's classification extension: refused (400), this server does not implement it."""


class V2RequestOutput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: StrictStr
    parameters: OutputParameters | None = None


class ProtocolParameters(BaseModel):
    """The request-level parameters that belong to the protocol, not to the model: checked
    here, then removed before the task sees the parameters."""

    model_config = ConfigDict(json_schema_extra=standard_bounds)

    binary_data_output: StrictBool | None = None
    """Every output in the binary tensor data extension unless the output says otherwise."""
    content_type: StrictStr | None = None
    """Accepted and ignored."""
    headers: dict[str, StrictStr] | None = None
    """Accepted and ignored."""
    timeout: WholeInt | None = Field(None, ge=1)
    """The request's deadline in microseconds (Triton's unit): at most the server's
    `request_timeout_s`; admission refuses it (429) when its model's queue is longer."""
    priority: WholeInt | None = Field(None, ge=0)
    """Triton's scheduling priority: accepted and ignored (every request of a model is
    batched in arrival order within its deadline)."""


class V2InferRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model_name: StrictStr | None = None
    """The KServe SDK sends the model's name (and version) in the body too: it must be the
    path's (400 naming the mismatch otherwise)."""
    model_version: StrictStr | None = None
    id: StrictStr | None = None
    parameters: dict[str, Any] | None = None
    inputs: list[V2RequestInput] = Field(min_length=1)
    outputs: list[V2RequestOutput] | None = None


class V2ResponseOutput(BaseModel):
    name: str
    shape: list[int]
    datatype: str
    parameters: dict[str, Any] | None = None
    data: list[Any] | None = None


class V2InferResponse(BaseModel):
    model_name: str
    model_version: str | None = None
    id: str | None = None
    parameters: dict[str, Any] | None = None
    outputs: list[V2ResponseOutput]


class V2MetadataTensor(BaseModel):
    name: str
    datatype: str
    shape: list[int]


class V2ModelMetadata(BaseModel):
    name: str
    versions: list[str]
    platform: str
    inputs: list[V2MetadataTensor]
    outputs: list[V2MetadataTensor]


class V2ServerMetadata(BaseModel):
    name: str
    version: str
    extensions: list[str]
