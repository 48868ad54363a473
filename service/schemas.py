"""Request/response schemas: classifier (v1), model listing, and OIP (KServe v2).

Limits that do not depend on settings are declared here; the settings-dependent ones (texts
per request, characters, tokens) are checked by the worker against `Settings`. Translate
schemas live in the translator's own module.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

HARD_MAX_TEXTS = 4096
"""Schema ceiling of texts per request (settings.max_texts is the live limit)."""
HARD_MAX_CHARS = 1_000_000
"""Schema ceiling of characters per text (settings.max_chars is the live limit)."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ClassifyRequest(_Strict):
    """POST /v1/models/{name}/classify body."""

    texts: list[StrictStr] = Field(
        min_length=1, max_length=HARD_MAX_TEXTS, description="Texts to classify (non-empty)."
    )
    top_k: StrictInt = Field(1, ge=1, le=1000, description="How many labels to return per text.")
    return_attention: StrictBool = Field(
        False, description="Return each token's attention weight with its text span."
    )


class LabelProbability(BaseModel):
    label: str
    probability: float


class TokenAttention(BaseModel):
    token: str = Field(description="The tokenizer's piece.")
    weight: float = Field(description="Attention pooling weight (sums to 1 over the text).")
    start: int = Field(description="Character offset in the text where the piece starts.")
    end: int = Field(description="Character offset after the piece.")


class Classification(BaseModel):
    label: str
    score: float = Field(description="Probability of `label`.")
    top_k: list[LabelProbability]
    num_tokens: int = Field(description="Tokens the model saw (after truncation).")
    truncated: bool = Field(description="True when the text was cut to the token limit.")
    attention: list[TokenAttention] | None = None


class ClassifyResponse(BaseModel):
    model: str
    version: int
    results: list[Classification]


class ModelVersionInfo(BaseModel):
    version: int
    state: Literal["loading", "ready", "failed", "stopped"]
    reason: str | None = None
    task: str | None = None
    default: bool = False
    details: dict[str, Any] = Field(
        default_factory=dict, description="labels, limits, runtime, providers, metrics"
    )


class ModelInfo(BaseModel):
    name: str
    default_version: int | None
    versions: list[ModelVersionInfo]


class ModelList(BaseModel):
    models: list[ModelInfo]


class ErrorResponse(BaseModel):
    error: str


# ---- Open Inference Protocol (KServe v2) REST -------------------------------------------


class V2RequestInput(BaseModel):
    name: StrictStr
    shape: list[StrictInt]
    datatype: StrictStr
    parameters: dict[str, Any] | None = None
    data: Any = None


class V2RequestOutput(BaseModel):
    name: StrictStr
    parameters: dict[str, Any] | None = None


class V2InferRequest(BaseModel):
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
