"""Translate: POST /v1/models/{name}/translate (and /versions/{v}/translate).

The search options are declared here once (`TranslateOptions`: limits in `Field`, combinations
in a validator); the v1 body and the OIP `parameters` of translators are both checked against
them, and the decode scheduler trusts what passes.
"""

from __future__ import annotations

from typing import Any

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    ValidationError,
    model_validator,
)

from seqserve.service.api.common import (
    TextsRequest,
    WholeInt,
    describe_errors,
    standard_bounds,
)
from seqserve.service.api.lifecycle import Route
from seqserve.service.core.errors import BadRequest
from seqserve.service.scheduling.search import (
    DEFAULT_BEAM_SIZE,
    DEFAULTS,
    LENGTH_SLACK,
    MAX_BEAM_SIZE,
    SearchOptions,
)
from seqserve.service.workers.translator import TranslatorWorker

MAX_DECODE_LENGTH = 1024
"""Schema ceiling of max_length / min_length (the model's own limit applies too)."""
MAX_SEED = 2**53 - 1
"""Largest seed: the largest integer every JSON reader holds exactly (a double's mantissa)."""

Number = StrictFloat | StrictInt
SAMPLING = ("temperature", "top_k", "top_p")


def search_rule() -> dict[str, Any]:
    """The combination rule of the search options as JSON Schema (`anyOf`, one branch per beam
    width): sampling needs beam_size 1 (the default when a sampling option is set), and
    n_best <= the beam width in force (beam_size, else 1 when sampling, else the default)."""
    no_sampling = {name: {"type": "null"} for name in SAMPLING}
    branches: list[dict[str, Any]] = [
        {"required": ["beam_size"],
         "properties": {"beam_size": {"const": 1}, "n_best": {"maximum": 1}}},
        {"properties": {"beam_size": {"type": "null"}, "n_best": {"maximum": 1}}},
        {"properties": {"beam_size": {"type": "null"},
                        "n_best": {"maximum": DEFAULT_BEAM_SIZE}, **no_sampling}},
    ]
    branches += [{"required": ["beam_size"],
                  "properties": {"beam_size": {"const": b}, "n_best": {"maximum": b},
                                 **no_sampling}}
                 for b in range(2, MAX_BEAM_SIZE + 1)]
    return {"anyOf": branches}


def _schema_extra(schema: dict[str, Any]) -> None:
    standard_bounds(schema)
    schema.update(search_rule())


SEARCH_RULES = ("Sampling (temperature, top_k or top_p set) needs beam_size 1, which is then the "
                "default; otherwise the default beam_size is "
                f"{DEFAULT_BEAM_SIZE}. n_best must not exceed the beam width in force. "
                "min_length at or over the length cap (max_length, max_length_ratio, the "
                "model's limit) means no EOS: the output ends at the cap.")


class TranslateOptions(BaseModel):
    """Search options of one request; see `seqserve.service.scheduling.search.SearchOptions`.

    Sampling (temperature, top_k or top_p set) needs beam_size 1, which is then the default;
    otherwise beam_size defaults to `DEFAULT_BEAM_SIZE`. n_best must not exceed the beam width
    in force. min_length at or over the length cap means no EOS: the output ends at the cap.
    Every default is `SearchOptions`' own (`DEFAULTS`)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True,
                              json_schema_extra=lambda schema: _schema_extra(schema))

    beam_size: WholeInt | None = Field(
        None, ge=1, le=MAX_BEAM_SIZE,
        description=f"Beam width; 1 = greedy (or sampling). Default: {DEFAULT_BEAM_SIZE}, "
                    "or 1 when a sampling option is set (sampling needs beam_size 1).")
    n_best: WholeInt = Field(DEFAULTS.n_best, ge=1, le=MAX_BEAM_SIZE,
                              description="Hypotheses returned per text, best first.")
    max_length: WholeInt | None = Field(None, ge=1, le=MAX_DECODE_LENGTH,
                                         description="Cap on generated tokens (EOS included).")
    max_length_ratio: Number | None = Field(
        DEFAULTS.max_length_ratio, gt=0, le=100,
        description=f"Cap of ceil(ratio x source tokens) + {LENGTH_SLACK} generated tokens; "
                    "null = off.")
    min_length: WholeInt = Field(DEFAULTS.min_length, ge=0, le=MAX_DECODE_LENGTH,
                                 description="Tokens before EOS is allowed (at or over the "
                                             "length cap: no EOS, the output ends at the cap).")
    length_penalty: Number = Field(DEFAULTS.length_penalty, ge=0, le=10,
                                   description="GNMT alpha.")
    coverage_penalty: Number = Field(DEFAULTS.coverage_penalty, ge=0, le=10,
                                     description="GNMT beta.")
    no_repeat_ngram_size: WholeInt = Field(DEFAULTS.no_repeat_ngram_size, ge=0, le=16,
                                           description="Block repeated n-grams of this size.")
    temperature: Number | None = Field(
        None, gt=0, le=100, validation_alias=AliasChoices("temperature", "sampling_temperature"),
        description="Sampling temperature (turns sampling on; needs beam_size 1).")
    top_k: WholeInt | None = Field(None, ge=1, le=1000,
                                   description="Sample among the k best tokens.")
    top_p: Number | None = Field(None, gt=0, le=1,
                                 description="Nucleus mass, within the top-k candidates.")
    seed: WholeInt | None = Field(None, ge=0, le=MAX_SEED,
                                  description="Sampling seed (a JSON-safe integer).")
    return_attention: StrictBool = Field(DEFAULTS.return_attention,
                                         description="Return the attention matrix.")

    @property
    def sampling(self) -> bool:
        return self.temperature is not None or self.top_k is not None or self.top_p is not None

    @property
    def beam(self) -> int:
        """The beam width in force (the documented default when none was given)."""
        if self.beam_size is not None:
            return self.beam_size
        return 1 if self.sampling else DEFAULT_BEAM_SIZE

    @model_validator(mode="after")
    def _combinations(self) -> TranslateOptions:
        if self.sampling and self.beam != 1:
            raise ValueError("sampling (temperature/top_k/top_p) needs beam_size=1")
        if self.n_best > self.beam:
            raise ValueError(f"n_best ({self.n_best}) must be <= beam_size ({self.beam})")
        return self

    def search_options(self) -> SearchOptions:
        return SearchOptions(
            beam_size=self.beam, n_best=self.n_best, max_length=self.max_length,
            max_length_ratio=None if self.max_length_ratio is None
            else float(self.max_length_ratio),
            min_length=self.min_length, length_penalty=float(self.length_penalty),
            coverage_penalty=float(self.coverage_penalty),
            no_repeat_ngram_size=self.no_repeat_ngram_size,
            temperature=None if self.temperature is None else float(self.temperature),
            top_k=self.top_k, top_p=None if self.top_p is None else float(self.top_p),
            seed=self.seed, return_attention=self.return_attention,
        )

    @classmethod
    def from_parameters(cls, parameters: dict[str, Any]) -> TranslateOptions:
        """Options from OIP request `parameters` (protocol keys already removed); BadRequest
        (400) names what was wrong."""
        try:
            return cls.model_validate(parameters)
        except ValidationError as exc:
            raise BadRequest(f"bad translate parameters: {describe_errors(exc.errors())}"
                             ) from exc


class TranslateRequest(TranslateOptions, TextsRequest):
    """POST /v1/models/{name}/translate body."""


class TranslationHypothesis(BaseModel):
    translation: str
    score: float = Field(description="Final score: log-prob / length penalty + coverage term.")
    tokens: list[str] = Field(description="Target pieces (EOS excluded).")
    token_ids: list[int]


class AttentionMatrix(BaseModel):
    source_tokens: list[str]
    target_tokens: list[str] = Field(description="Generated pieces, EOS included when emitted.")
    weights: list[list[float]] = Field(
        description="target x source; each row sums to 1. Row t is the alignment behind "
                    "target token t: computed from h_t (luong decoder) or from s_{t-1} "
                    "(bahdanau). A fixed-context model (decoder none) has no attention: "
                    "return_attention is refused with 400.")


class Translation(BaseModel):
    translation: str
    score: float
    tokens: list[str]
    hypotheses: list[TranslationHypothesis] = Field(description="n-best, best first.")
    attention: AttentionMatrix | None = Field(None, description="Only with return_attention.")
    truncated: bool = Field(False, description="The source was cut to the token limit.")
    unknown_fraction: float = Field(0.0, description="Share of its tokens the model's "
                                    "tokenizer did not know (characters or words never seen "
                                    "in training): near 1, the answer is about nothing.")


class TranslateResponse(BaseModel):
    model: str
    version: int
    results: list[Translation]


ROUTES = [Route(
    "/v1", "translate", "translate", TranslateRequest, TranslatorWorker,
    begin=lambda w, body, ctx: w.begin_translate(body.texts, body.search_options(), ctx),
    response_model=TranslateResponse,
    doc="Translate texts with the default (highest ready) version: beam search or sampling,\n"
        "n-best hypotheses with scores and, on request, the attention matrix.",
    version_doc="Translate texts with one version.")]
"""POST /v1/models/{name}[/versions/{v}]/translate (`lifecycle.Route`)."""
