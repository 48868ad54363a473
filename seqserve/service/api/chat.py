"""OpenAI-compatible chat completions: POST /v1/chat/completions, for language models whose
bundle carries a chat template (the manifest's `chat_template`: `seqserve pack lm
--chat-template`, `seqserve export --chat-template`; the demo's LM has one).

The conversation (`messages`, each `{role, content}`; content a string or a list of text
parts `{"type": "text", "text"}`, joined by newlines as vLLM joins them) is rendered through
the template in jinja2's sandbox with `add_generation_prompt`, `bos_token` and `eos_token`
as transformers renders it (`workers.hf_files.chat_prompt`), and that prompt is completed
by the `/v1/completions` machinery (api/openai.py: the same worker, limits, admission,
sampling and stop strings; its `Face` writes the answers in the chat shape). The fields:
`max_completion_tokens` (or the older `max_tokens`; default: the server's
max_new_tokens), `temperature`, `top_p`, `n`, `stop`, `seed`, `stream` and
`stream_options` (`include_usage`, vLLM's `continuous_usage_stats`), `logprobs` (true:
each generated token's log-prob) with `top_logprobs` (that many alternatives; without
logprobs it is ignored),
`presence_penalty`, `frequency_penalty`, `logit_bias`, `ignore_eos` (vLLM's), `user`
(accepted, unused). Any other field is a 400 naming it.

An answer is a `chat.completion`: `choices[i].message {role: "assistant", content}`,
`finish_reason`, `logprobs` (`{"content": [{token, logprob, bytes, top_logprobs}]}`) and
`usage` (the rendered prompt's tokens). Streamed: `chat.completion.chunk` events, first
each choice's `delta {role: "assistant", content: ""}`, then `delta {content}` pieces, the
last with its `finish_reason`, a usage chunk when asked, then `[DONE]`. A model without a
template: a 400 naming the missing `chat_template` and how to add one; a model that is not a
language model: the 404 completions gives.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr, ValidationError

from seqserve.service.api import openai
from seqserve.service.api.common import HARD_MAX_TEXTS, WholeInt, standard_bounds
from seqserve.service.api.generate import DEFAULTS, MAX_N, MAX_TOP_LOGPROBS, StopList, StopText
from seqserve.service.api.lifecycle import Call, Route, lookup
from seqserve.service.api.openai import Bias, CompletionRequest, Face, Penalty, StreamOptions
from seqserve.service.api.translate import MAX_SEED, Number
from seqserve.service.core.errors import BadRequest
from seqserve.service.web.state import AppState
from seqserve.service.workers.hf_files import chat_prompt
from seqserve.service.workers.lm import LMWorker

SERVED = ("model", "messages", "max_completion_tokens", "max_tokens", "temperature", "top_p",
          "n", "stop", "seed", "stream", "stream_options", "logprobs", "top_logprobs",
          "presence_penalty", "frequency_penalty", "logit_bias", "ignore_eos", "user")
Role = Literal["system", "developer", "user", "assistant", "tool"]


class TextPart(BaseModel):
    """A text part of a message's content (OpenAI's content parts; text only)."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["text"]
    text: StrictStr


class Message(BaseModel):
    """One message of the conversation."""

    model_config = ConfigDict(extra="forbid")

    role: Role
    content: StrictStr | Annotated[list[TextPart], Field(max_length=HARD_MAX_TEXTS)] | None \
        = Field(description="The text, or a list of text parts (joined by newlines); null "
                "(an assistant's message that only called tools, in OpenAI's): empty.")
    name: StrictStr | None = Field(None, description="The author's name (to the template).")
    def as_template_reads(self) -> dict[str, Any]:
        content = self.content
        if isinstance(content, list):
            content = "\n".join(part.text for part in content)
        out: dict[str, Any] = {"role": self.role, "content": content or ""}
        if self.name is not None:
            out["name"] = self.name
        return out


class ChatRequest(BaseModel):
    """OpenAI's chat completion request (the fields seqserve serves: module doc)."""

    model_config = ConfigDict(extra="forbid", json_schema_extra=standard_bounds)

    model: StrictStr = Field(description="Model name (a language-model bundle with a chat "
                                         "template).")
    messages: Annotated[list[Message], Field(min_length=1, max_length=HARD_MAX_TEXTS)] = \
        Field(description="The conversation so far.")
    max_completion_tokens: WholeInt | None = Field(
        None, ge=1, description="Most tokens generated per choice (default: the server's "
        "max_new_tokens).")
    max_tokens: WholeInt | None = Field(None, ge=1, description="The older name of "
                                                                "max_completion_tokens.")
    temperature: Number = Field(DEFAULTS.temperature, ge=0, le=2)
    top_p: Number = Field(DEFAULTS.top_p, gt=0, le=1)
    n: WholeInt = Field(DEFAULTS.n, ge=1, le=MAX_N)
    stop: StopText | StopList | None = None
    seed: WholeInt | None = Field(DEFAULTS.seed, ge=0, le=MAX_SEED)
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    logprobs: StrictBool = Field(False, description="Each generated token's log-prob.")
    top_logprobs: WholeInt | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS,
                                          description="Alternatives per token (with "
                                                      "logprobs; else ignored).")
    presence_penalty: Penalty = 0.0
    frequency_penalty: Penalty = 0.0
    logit_bias: dict[StrictStr, Bias] | None = Field(
        None, max_length=openai.MAX_LOGIT_BIAS, description="Token id (as a string) -> -100 to "
        "100, added to its logit before each draw.")
    ignore_eos: StrictBool = False
    user: StrictStr | None = Field(None, description="Accepted, unused.")

    def completion(self, prompt: str, limit: int) -> CompletionRequest:
        """The completion of `prompt` this request asks for (`limit`: the server's
        max_new_tokens, the default length)."""
        for name in ("max_completion_tokens", "max_tokens"):  # each within the limit
            given = getattr(self, name)
            if given is not None and given > limit:
                raise BadRequest(f"{name} {given} > the server's limit {limit}", param=name)
        wanted = self.max_completion_tokens or self.max_tokens
        return CompletionRequest(
            model=self.model, prompt=prompt, max_tokens=wanted or limit,
            temperature=self.temperature, top_p=self.top_p, n=self.n, stop=self.stop,
            seed=self.seed, stream=self.stream, stream_options=self.stream_options,
            logprobs=(self.top_logprobs or 0) if self.logprobs else None,
            presence_penalty=self.presence_penalty, frequency_penalty=self.frequency_penalty,
            logit_bias=self.logit_bias, ignore_eos=self.ignore_eos, best_of=None, user=None,
            split_special_tokens=False, return_state=False, state=None)


def _token(piece: str, logprob: float) -> dict[str, Any]:
    return {"token": piece, "logprob": logprob, "bytes": list(piece.encode())}


def _logprobs(given: dict[str, Any] | None) -> dict[str, Any] | None:
    """A text completion's log-probs (tokens, token_logprobs, top_logprobs) in the chat
    shape: {"content": [{token, logprob, bytes, top_logprobs: [...]}]}."""
    if given is None:
        return None
    return {"content": [{**_token(piece, lp), "top_logprobs": [
        _token(p, x) for p, x in (tops or {}).items()]}
        for piece, lp, tops in zip(given["tokens"], given["token_logprobs"],
                                   given["top_logprobs"], strict=True)]}


def _choice(text: dict[str, Any]) -> dict[str, Any]:
    return {"index": text["index"],
            "message": {"role": "assistant", "content": text["text"]},
            "logprobs": _logprobs(text["logprobs"]), "finish_reason": text["finish_reason"]}


def _delta(text: dict[str, Any]) -> dict[str, Any]:
    return {"index": text["index"], "delta": {"content": text["text"]} if text["text"] else {},
            "logprobs": _logprobs(text["logprobs"]), "finish_reason": text["finish_reason"]}


def _opening(index: int) -> dict[str, Any]:
    return {"index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
            "finish_reason": None}


CHAT = Face("chatcmpl", "chat.completion", "chat.completion.chunk", _choice, _delta,
            _opening)


async def chat(state: AppState, call: Call, body: ChatRequest) -> Any:
    """The chat completion of one body: the conversation rendered by the model's template,
    then completed (module doc)."""
    call.model = body.model
    _, worker = lookup(state, call, LMWorker)  # the refusals completions gives
    prompt = chat_prompt(worker.ctx, [m.as_template_reads() for m in body.messages])
    if not prompt:
        raise BadRequest("the chat template rendered the conversation as an empty prompt",
                         param="messages")
    return await openai.complete(state, call, body.completion(prompt, worker.max_new_tokens),
                                 CHAT)


def refused(exc: ValidationError) -> BadRequest:
    """A body that fails validation: OpenAI's 400, naming the field (a message's content
    that is neither a string nor text parts: saying so)."""
    for error in exc.errors():
        loc = error["loc"]
        if loc[:1] == ("messages",) and len(loc) > 3 and loc[2] == "content":
            return BadRequest(f"messages[{loc[1]}].content: a string or a list of text parts "
                              '({"type": "text", "text": ...}); other content parts (images, '
                              "audio, files) are not served", param="messages")
    return openai.refused(exc, SERVED)


ROUTES = [Route(
    "/v1", "chat/completions", "chat_completions", ChatRequest, answer=chat, by_model=False,
    reads="any", refused=refused, model_of=lambda body: body.model, tags=("openai",),
    responses=openai.responses("OpenAI chat.completion"),
    doc="OpenAI-compatible chat completion with a language model whose bundle carries a chat "
        "template (see the module doc).")]
"""POST /v1/chat/completions (`lifecycle.Route`), errors in OpenAI's shape."""
