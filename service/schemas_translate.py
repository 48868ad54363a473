"""Translate schemas: search options (v1 body and OIP v2 `parameters`), request and answer.

Limits are declared with `Field`; option combinations are checked by a model validator, so
every bad option is a 422 with the field named (v2 maps the same errors to 400).
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
    StrictStr,
    ValidationError,
    model_validator,
)

from service.engine.search import SearchOptions
from service.errors import BadRequest
from service.schemas import HARD_MAX_TEXTS

MAX_BEAM_SIZE = 16
"""Largest beam a request may ask for (the live-hypothesis cap is the engine's)."""
MAX_DECODE_LENGTH = 1024
"""Schema ceiling of max_length / min_length (the model's own limit applies too)."""

Number = StrictFloat | StrictInt

OIP_PARAMETERS = frozenset({"binary_data_output", "content_type", "headers", "timeout"})
"""Request-level OIP parameters that belong to the protocol, not to the search."""


class TranslateOptions(BaseModel):
    """Search options of one request; see `service.engine.search.SearchOptions`."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    beam_size: StrictInt = Field(5, ge=1, le=MAX_BEAM_SIZE,
                                 description="Beam width; 1 = greedy (or sampling).")
    n_best: StrictInt = Field(1, ge=1, le=MAX_BEAM_SIZE,
                              description="Hypotheses returned per text, best first.")
    max_length: StrictInt | None = Field(None, ge=1, le=MAX_DECODE_LENGTH,
                                         description="Cap on generated tokens (EOS included).")
    max_length_ratio: Number | None = Field(
        2.0, gt=0, le=100,
        description="Cap of ceil(ratio x source tokens) + 10 generated tokens; null = off.")
    min_length: StrictInt = Field(0, ge=0, le=MAX_DECODE_LENGTH,
                                  description="Tokens before EOS is allowed.")
    length_penalty: Number = Field(0.0, ge=0, le=10, description="GNMT alpha.")
    coverage_penalty: Number = Field(0.0, ge=0, le=10, description="GNMT beta.")
    no_repeat_ngram_size: StrictInt = Field(0, ge=0, le=16,
                                            description="Block repeated n-grams of this size.")
    temperature: Number | None = Field(
        None, gt=0, le=100, validation_alias=AliasChoices("temperature", "sampling_temperature"),
        description="Sampling temperature (turns sampling on; needs beam_size 1).")
    top_k: StrictInt | None = Field(None, ge=1, le=1000,
                                    description="Sample among the k best tokens.")
    top_p: Number | None = Field(None, gt=0, le=1,
                                 description="Nucleus mass, within the top-k candidates.")
    seed: StrictInt | None = Field(None, ge=0, le=2**63 - 1, description="Sampling seed.")
    return_attention: StrictBool = Field(False, description="Return the attention matrix.")

    @model_validator(mode="after")
    def _combinations(self) -> TranslateOptions:
        sampling = self.temperature is not None or self.top_k is not None or self.top_p is not None
        if sampling and self.beam_size != 1:
            if "beam_size" in self.model_fields_set:
                raise ValueError("sampling (temperature/top_k/top_p) needs beam_size=1")
            self.beam_size = 1  # sampling asked without a beam: it is a beam of one
        if self.n_best > self.beam_size:
            raise ValueError(f"n_best ({self.n_best}) must be <= beam_size ({self.beam_size})")
        if self.max_length is not None and self.min_length >= self.max_length:
            raise ValueError("min_length must be < max_length")
        return self

    def search_options(self) -> SearchOptions:
        return SearchOptions(
            beam_size=self.beam_size, n_best=self.n_best, max_length=self.max_length,
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
    def from_parameters(cls, parameters: dict[str, Any] | None) -> TranslateOptions:
        """Options from OIP request `parameters` (protocol keys such as `binary_data_output`
        are not search options and are skipped); BadRequest (400) names what was wrong."""
        options = {k: v for k, v in (parameters or {}).items() if k not in OIP_PARAMETERS}
        try:
            return cls.model_validate(options)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or 'parameters'}: {e['msg']}"
                for e in exc.errors())
            raise BadRequest(f"bad translate parameters: {problems}") from exc


class TranslateRequest(TranslateOptions):
    """POST /v1/models/{name}/translate body."""

    texts: list[StrictStr] = Field(min_length=1, max_length=HARD_MAX_TEXTS,
                                   description="Source sentences.")


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
    attention: AttentionMatrix | None = None
    truncated: bool = Field(False, description="The source was cut to the token limit.")


class TranslateResponse(BaseModel):
    model: str
    version: int
    results: list[Translation]
