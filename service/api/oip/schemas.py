"""Open Inference Protocol (KServe v2) REST schemas: infer request/response and metadata."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr


class V2RequestInput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: StrictStr
    shape: list[StrictInt]
    datatype: StrictStr
    parameters: dict[str, Any] | None = None
    data: Any = None


class V2RequestOutput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: StrictStr
    parameters: dict[str, Any] | None = None


class V2InferRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

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
