"""Tag: POST /v1/models/{name}/tag (and /versions/{v}/tag) for sequence taggers.

Each whitespace word of a text comes back with its label, that label's probability and its
character span [start, end) in the text as sent, so `text[start:end] == token`. A tagger with
a CRF labels the best labelling of each text's tokens (Viterbi); `return_score` adds that
labelling's score.
"""

from __future__ import annotations

from pydantic import BaseModel, Field, StrictBool

from seqserve.service.api.common import TextsRequest
from seqserve.service.api.lifecycle import Route
from seqserve.service.workers.tagger import TaggerWorker


class TagRequest(TextsRequest):
    """POST /v1/models/{name}/tag body."""

    return_score: StrictBool = Field(
        False, description="Return each text's labelling score: a CRF tagger's Viterbi score "
        "(emission, transition, start and end scores of its best labelling), else the sum of "
        "the chosen labels' log-probabilities over the text's tokens.")


class TaggedToken(BaseModel):
    token: str = Field(description="The whitespace word, exactly text[start:end].")
    label: str | None = Field(description="Its tag (null when cut off by the token limit).")
    probability: float | None = Field(description="Probability of `label` (a CRF tagger: its "
                                      "marginal over every labelling of the text).")
    start: int = Field(description="Character offset where the word starts.")
    end: int = Field(description="Character offset after the word.")


class Tagging(BaseModel):
    tokens: list[TaggedToken]
    num_tokens: int = Field(description="Subword pieces the model saw (after truncation).")
    truncated: bool = Field(description="True when the text was cut to the token limit.")
    unknown_fraction: float = Field(0.0, description="Share of its tokens the model's "
                                    "tokenizer did not know (characters or words never seen "
                                    "in training): near 1, the answer is about nothing.")
    score: float | None = Field(None, description="With `return_score`: the labelling's score.")


class TagResponse(BaseModel):
    model: str
    version: int
    results: list[Tagging]


ROUTES = [Route(
    "/v1", "tag", "tag", TagRequest, TaggerWorker,
    begin=lambda w, body, ctx: w.begin_tag(body.texts, ctx, body.return_score),
    response_model=TagResponse,
    doc="Tag every whitespace word of each text with the default (highest ready) version.",
    version_doc="Tag texts with one version.")]
"""POST /v1/models/{name}[/versions/{v}]/tag (`lifecycle.Route`)."""
