"""A language model's tokenizer over HTTP, as vLLM serves it: GET /tokenizer_info, POST
/tokenize, POST /detokenize (what lm-eval's `local-completions` with
`tokenizer_backend="remote"` reads: it strips `/v1/completions` from its base URL and calls
these at the root, with no model named).

- `POST /tokenize {"prompt": "...", "add_special_tokens": true, "model": "..."}` ->
  `{"tokens": [...], "count", "max_model_len", "token_strs"}`; with add_special_tokens
  (vLLM's default) bos first, as the server puts it before every prompt; special tokens
  written in the text by their strings (`<s>`, `</s>`, ...) are read as their ids;
- `POST /detokenize {"tokens": [...], "model": "..."}` -> `{"prompt": "..."}`, special ids
  written as their strings (so /tokenize of it gives the ids back);
- `GET /tokenizer_info[?model=...]` -> the tokenizer's class, its special tokens (strings
  and ids), vocabulary size and `model_max_length` (the token limit of one prompt).

`model` is optional where the server serves exactly one language model (what lm-eval
needs: it names none); with several, a 400 asks for it.

Every text model's tokenizer in Hugging Face's format, so HF-based tools (transformers'
`AutoTokenizer`, guidellm, lm-eval's HF tokenizer) count tokens as the server does, offline:
`GET /v1/models/{name}[/versions/{version}]/tokenizer.json` (the `tokenizers` format,
converted from SentencePiece where the bundle has a .model: `models.text.hf_files`) and
`tokenizer_config.json` beside it (special tokens, `model_max_length`, the bundle's
`chat_template`). Save both in one folder and load it.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr

from seqserve.service.api.common import ERRORS, WholeInt, app_state
from seqserve.service.core.errors import BadRequest, ModelNotFound
from seqserve.service.web.state import AppState
from seqserve.service.workers.hf_files import tokenizer_file
from seqserve.service.workers.lm import LMWorker

router = APIRouter(tags=["tokenizer"], responses={**ERRORS})
MAX_IDS = 1_000_000
"""Most ids one /detokenize takes (the body limit bounds it first, in practice)."""


class TokenizeRequest(BaseModel):
    """POST /tokenize body (vLLM's)."""

    model_config = ConfigDict(extra="forbid")

    prompt: StrictStr = Field(description="The text (special tokens by their strings).")
    add_special_tokens: StrictBool = Field(True, description="bos first, as the server puts "
                                                             "it before every prompt.")
    model: StrictStr | None = Field(None, description="Model name (optional with one "
                                                      "language model served).")
    return_token_strs: StrictBool = Field(False, description="Also each token's piece.")
    split_special_tokens: StrictBool = Field(
        False, description="Read special-token strings in the prompt (`<s>`, `</s>`, ...) "
        "as ordinary text; by default they are those tokens (Hugging Face's convention).")


class TokenizeResponse(BaseModel):
    model: str
    tokens: list[int]
    count: int
    max_model_len: int = Field(description="The token limit of one prompt.")
    token_strs: list[str] | None = None


class DetokenizeRequest(BaseModel):
    """POST /detokenize body (vLLM's)."""

    model_config = ConfigDict(extra="forbid")

    tokens: list[WholeInt] = Field(max_length=MAX_IDS, description="Token ids.")
    model: StrictStr | None = Field(None, description="Model name (optional with one "
                                                      "language model served).")


class DetokenizeResponse(BaseModel):
    model: str
    prompt: str


def language_model(state: AppState, name: str | None) -> LMWorker:
    """The named model's ready LM worker, or the one language model served."""
    repo = state.repository
    if name is not None:
        return repo.worker(name, None, LMWorker)[1]
    lms = sorted(n for n, versions in repo.entries.items()
                 if any(e.task == LMWorker.task for e in versions.values()))
    if len(lms) == 1:
        return repo.worker(lms[0], None, LMWorker)[1]
    if not lms:
        raise ModelNotFound("no language model is served here")
    raise BadRequest(f"several language models are served ({', '.join(lms)}): name one "
                     "(`model`)", param="model")


@router.get("/tokenizer_info", name="tokenizer_info")
async def tokenizer_info(request: Request, model: str | None = None) -> dict[str, Any]:
    """The language model's tokenizer: class, special tokens, vocabulary size, limit."""
    return language_model(app_state(request), model).tokenizer_info()


@router.post("/tokenize", name="tokenize")
async def tokenize(body: TokenizeRequest, request: Request) -> TokenizeResponse:
    """A text's token ids (special tokens by their strings)."""
    worker = language_model(app_state(request), body.model)
    ids = worker.tokenize(body.prompt, body.add_special_tokens, body.split_special_tokens)
    return TokenizeResponse(model=worker.ctx.name, tokens=ids, count=len(ids),
                            max_model_len=worker.ctx.limits.max_tokens,
                            token_strs=[worker.ctx.tokenizer.id_to_piece(i) for i in ids]
                            if body.return_token_strs else None)


@router.post("/detokenize", name="detokenize")
async def detokenize(body: DetokenizeRequest, request: Request) -> DetokenizeResponse:
    """The text of token ids (special tokens by their strings)."""
    worker = language_model(app_state(request), body.model)
    return DetokenizeResponse(model=worker.ctx.name, prompt=worker.detokenize(body.tokens))


def _hf_file(which: str, what: str) -> None:
    """GET `which` of a text model, default and pinned version."""
    def answer(request: Request, name: str, version: str | None) -> Response:
        _, worker = app_state(request).repository.ready(name, version)
        return Response(tokenizer_file(worker.ctx, name, which), media_type="application/json")

    async def default(request: Request, name: str) -> Response:
        return answer(request, name, None)

    async def pinned(request: Request, name: str, version: str) -> Response:
        return answer(request, name, version)

    for path, endpoint, suffix in ((f"/v1/models/{{name}}/{which}", default, ""),
                                   (f"/v1/models/{{name}}/versions/{{version}}/{which}", pinned,
                                    "_version")):
        router.add_api_route(
            path, endpoint, methods=["GET"], name=f"{which.split('.')[0]}{suffix}",
            summary=f"A text model's {which}", response_class=Response,
            responses={200: {"content": {"application/json": {"schema": {"type": "object"}}},
                             "description": f"{which} ({what})"}},
            description=f"The model's tokenizer as Hugging Face tools load it: {which} "
                        f"({what}); save it with the other file in one folder.")


_hf_file("tokenizer.json", "Hugging Face tokenizers format")
_hf_file("tokenizer_config.json", "special tokens, model_max_length, chat_template")
