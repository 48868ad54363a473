"""Tag schemas: POST /v1/models/{name}/tag request and answer (sequence taggers).

Each whitespace word of a text comes back with its label, that label's probability and its
character span [start, end) in the text as sent, so `text[start:end] == token`.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, StrictStr

from service.schemas import HARD_MAX_TEXTS


class TagRequest(BaseModel):
    """POST /v1/models/{name}/tag body."""

    model_config = ConfigDict(extra="forbid")

    texts: list[StrictStr] = Field(
        min_length=1, max_length=HARD_MAX_TEXTS, description="Texts to tag (non-empty)."
    )


class TaggedToken(BaseModel):
    token: str = Field(description="The whitespace word, exactly text[start:end].")
    label: str | None = Field(description="Its tag (null when cut off by the token limit).")
    probability: float | None = Field(description="Probability of `label`.")
    start: int = Field(description="Character offset where the word starts.")
    end: int = Field(description="Character offset after the word.")


class Tagging(BaseModel):
    tokens: list[TaggedToken]
    num_tokens: int = Field(description="Subword pieces the model saw (after truncation).")
    truncated: bool = Field(description="True when the text was cut to the token limit.")


class TagResponse(BaseModel):
    model: str
    version: int
    results: list[Tagging]
