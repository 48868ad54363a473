"""What Hugging Face tools read of a text model, from its worker's context: its tokenizer as
tokenizer.json and tokenizer_config.json (`models.text.hf_files`), and a conversation as
one prompt through the bundle's chat template (`models.text.chat_template`).

Both files are built once per loaded tokenizer (kept beside it, weakly: an unloaded
version's go with it). A language model's tokenizer.json writes bos first, as the server puts
it before every prompt; the other tasks' read a text as they do, without it.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence
from typing import Any

from seqserve.models.text.chat_template import TemplateFailed, render
from seqserve.models.text.hf_files import dumps, tokenizer_config, tokenizer_json
from seqserve.service.core.errors import BadRequest, ModelNotFound
from seqserve.service.workers.base import WorkerContext

_BUILT: weakref.WeakKeyDictionary[Any, dict[str, bytes]] = weakref.WeakKeyDictionary()
NO_TEMPLATE = ("model {name!r} has no chat_template: its bundle carries none, so it serves "
               "/v1/completions only (add one with `seqserve pack lm --chat-template FILE` or "
               "`seqserve export --chat-template FILE`: a Jinja template, as Hugging Face "
               "tokenizer_config.json carries one)")


def _text_context(ctx: Any, name: str) -> WorkerContext[Any]:
    if not isinstance(ctx, WorkerContext):
        raise ModelNotFound(f"model {name!r} reads feature vectors, not texts: it has no "
                            "tokenizer")
    return ctx


def tokenizer_file(ctx: Any, name: str, which: str) -> bytes:
    """`which` ("tokenizer.json" or "tokenizer_config.json") of a text model's (source
    side's) tokenizer (module doc); ModelNotFound for a model without one."""
    ctx = _text_context(ctx, name)
    built = _BUILT.get(ctx.tokenizer)
    if built is None:
        bos_first = ctx.manifest.task == "lm"
        json_text = tokenizer_json(ctx.tokenizer, bos_first)
        config = tokenizer_config(ctx.tokenizer, ctx.limits.max_tokens, bos_first,
                                           ctx.manifest.chat_template)
        built = _BUILT[ctx.tokenizer] = {"tokenizer.json": json_text.encode(),
                                         "tokenizer_config.json": dumps(config)}
    return built[which]


def chat_prompt(ctx: WorkerContext[Any], messages: Sequence[Mapping[str, Any]]) -> str:
    """The prompt of a conversation through the model's chat template, with the generation
    prompt; BadRequest naming the missing template, or saying why the template failed."""
    template = ctx.manifest.chat_template
    if template is None:
        raise BadRequest(NO_TEMPLATE.format(name=ctx.name), param="model")
    tok = ctx.tokenizer

    def string(i: int) -> str | None:
        return tok.id_to_piece(i) if 0 <= i < tok.vocab_size else None

    try:
        return render(template, messages, string(tok.bos_id),
                                    string(tok.eos_id))
    except TemplateFailed as exc:
        raise BadRequest(str(exc), param="messages") from exc
