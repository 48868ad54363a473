"""Classify: POST /v1/models/{name}/classify (and /versions/{v}/classify)."""

from __future__ import annotations

from pydantic import BaseModel, Field, StrictBool

from seqserve.service.api.common import TextsRequest, WholeInt
from seqserve.service.api.lifecycle import Route
from seqserve.service.workers.classifier import ClassifierWorker


class ClassifyRequest(TextsRequest):
    """POST /v1/models/{name}/classify body."""

    top_k: WholeInt = Field(1, ge=1, le=1000,
                            description="How many labels to return per text (at most all).")
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
    unknown_fraction: float = Field(0.0, description="Share of its tokens the model's "
                                    "tokenizer did not know (characters or words never seen "
                                    "in training): near 1, the answer is about nothing.")
    attention: list[TokenAttention] | None = None


class ClassifyResponse(BaseModel):
    model: str
    version: int
    results: list[Classification]


ROUTES = [Route(
    "/v1", "classify", "classify", ClassifyRequest, ClassifierWorker,
    begin=lambda w, body, ctx: w.begin_classify(body.texts, body.top_k, body.return_attention,
                                               ctx),
    response_model=ClassifyResponse,
    doc="Classify texts with the default (highest ready) version.",
    version_doc="Classify texts with one version.")]
"""POST /v1/models/{name}[/versions/{v}]/classify (`lifecycle.Route`)."""
