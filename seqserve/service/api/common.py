"""What every route shares: the app state, the per-request `RequestContext`, the error schema,
the texts field and the one formatter of validation errors."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any

from fastapi import Request
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    Strict,
    StrictStr,
    WithJsonSchema,
)
from starlette.types import Scope

from seqserve.service.web.state import AppState
from seqserve.service.workers.base import text_pattern

HARD_MAX_TEXTS = 4096
"""Schema ceiling of texts per request (settings.max_texts is the live limit)."""


class ErrorResponse(BaseModel):
    """Every error answer (`seqserve.service.core.answers.error_answer`)."""

    error: str = Field(description="What was wrong, in one line.")
    request_id: str | None = Field(None, description="This request's X-Request-Id (every "
                                   "answer to a request that got past its headers).")


ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse} for code in (400, 404, 413, 422, 429, 500, 503, 504)
}
"""The error answers every POST route documents."""


def _whole(value: object) -> object:
    """A number without a fractional part is an integer (JSON Schema's rule): 5.0 -> 5."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


WholeInt = Annotated[int, BeforeValidator(_whole), Strict()]
"""An integer field: JSON integers and whole numbers (5, 5.0, 5e0); never a string, a bool or
5.5. The OpenAPI `integer` type means exactly this, so the document and the server agree."""

_BOUNDS = {"ge": "minimum", "le": "maximum", "gt": "exclusiveMinimum", "lt": "exclusiveMaximum"}


def standard_bounds(schema: dict[str, Any]) -> None:
    """pydantic writes the bounds of a union field (`int | None`, `float | int`) as `ge`/`le`/
    `gt`/`lt`, which JSON Schema ignores; rename them to `minimum`/`maximum`/`exclusive...`
    (a model's `json_schema_extra`), in every property's schema and the schemas inside it
    (a union's members, a dict's values, a list's items)."""
    for prop in schema.get("properties", {}).values():
        _rename_bounds(prop)


def _rename_bounds(node: dict[str, Any]) -> None:
    for short, name in _BOUNDS.items():
        if short in node:
            node[name] = node.pop(short)
    for inner in [*node.get("anyOf", []), node.get("additionalProperties"), node.get("items")]:
        if isinstance(inner, dict):
            _rename_bounds(inner)


TEXT_RULES = ("Each text: 1 to max_chars characters, at least one of them kept by the model's "
              "tokenizer (a text of only whitespace or control characters, or only punctuation "
              "for a tokenizer that drops it, has no tokens), no NUL, valid Unicode (no "
              "lone surrogates). A text over the model's token limit is a 400, or is cut to "
              "it when the server truncates (the answer then says `truncated`).")
Text = Annotated[StrictStr, WithJsonSchema({"type": "string", "minLength": 1,
                                            "pattern": text_pattern()})]
"""One input text. Its rules are checked once, for every protocol, by
`seqserve.service.workers.base.encode_texts`; the schema declares them (maxLength: see
openapi.py)."""


class TextsRequest(BaseModel):
    """Base of the v1 request bodies: a non-empty list of texts, no unknown fields."""

    model_config = ConfigDict(extra="forbid")

    texts: list[Text] = Field(min_length=1, max_length=HARD_MAX_TEXTS,
                              description=f"Texts, 1 to max_texts of them. {TEXT_RULES}")


def describe_errors(errors: Sequence[Any] | object, flags: bool = False) -> str:
    """One line per pydantic error, `loc: message` (`body.texts.0: Input should be a valid
    string`); with `flags`, the location is written as a CLI flag (`--n-best: ...`)."""
    parts = []
    for e in errors if isinstance(errors, list | tuple) else []:
        if e.get("type") == "json_invalid":
            parts.append(f"malformed JSON: {e.get('ctx', {}).get('error', e.get('msg'))}")
            continue
        loc = [str(x) for x in e.get("loc", ())]
        message = str(e.get("msg")).removeprefix("Value error, ")
        if flags:
            where = "--" + "-".join(loc).replace("_", "-") if loc else ""
            message = message.replace("_", "-")
        else:
            where = ".".join(loc)
        parts.append(f"{where}: {message}" if where else message)
    return "; ".join(parts) or "invalid request"


def app_state(request: Request) -> AppState:
    state: AppState = request.app.state.seqserve
    return state


def header(scope: Scope, name: bytes) -> str | None:
    """The value of the request header `name` (lower case), or None."""
    for key, value in scope["headers"]:
        if key == name:
            return bytes(value).decode("latin-1")
    return None
