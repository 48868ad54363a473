"""Chat templates: a language model's conversation as one prompt text, the way Hugging Face
tokenizers carry it (`chat_template` in tokenizer_config.json; the bundle manifest's
`chat_template`, docs/bundle-format.md).

A template is Jinja, rendered in jinja2's sandbox (`ImmutableSandboxedEnvironment`: a bundle
is untrusted input; no attribute of Python internals, no mutation of what it is given,
`range` bounded) with what transformers' `apply_chat_template` gives it: `messages` (each
`{"role", "content"}`), `add_generation_prompt`, `bos_token`, `eos_token`, and
`raise_exception(message)` (a template's own refusal, e.g. roles that do not alternate).
`trim_blocks` and `lstrip_blocks` as transformers sets them. Torch-free; jinja2 is imported
on first use.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

from seqserve.models.errors import UserError

DEFAULT_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ message['role'] }}: {{ message['content'] | trim }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}")
"""The demo language model's template: one line per message, `role: content`, then
`assistant:` for the answer (a plain-text model's best guess at a conversation)."""
MAX_TEMPLATE_CHARS = 100_000
"""The longest template a bundle may carry (transformers' largest are ~10k characters)."""
EXAMPLE = ({"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
           {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Bye"})
"""The conversation `check_template` renders."""


class TemplateFailed(UserError):
    """A chat template that does not compile, or fails (or refuses) rendering a
    conversation: the message says why."""


def _raise(message: str) -> None:
    raise TemplateFailed(f"the chat template refused the conversation: {message}")


@functools.lru_cache(maxsize=16)
def _compiled(template: str) -> Any:
    from jinja2 import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        keep_trailing_newline=True)
    env.globals["raise_exception"] = _raise
    try:
        return env.from_string(template)
    except TemplateError as exc:
        raise TemplateFailed(f"the chat template does not compile: {exc}") from exc


def render(template: str, messages: Sequence[Mapping[str, Any]], bos_token: str | None,
           eos_token: str | None, add_generation_prompt: bool = True) -> str:
    """The prompt of `messages` (module doc); TemplateFailed saying why it failed."""
    from jinja2 import TemplateError

    compiled = _compiled(template)
    try:
        return str(compiled.render(messages=[dict(m) for m in messages],
                                   add_generation_prompt=add_generation_prompt,
                                   bos_token=bos_token or "", eos_token=eos_token or ""))
    except TemplateFailed:
        raise
    except TemplateError as exc:  # the sandbox's SecurityError is one
        raise TemplateFailed(f"the chat template failed: {exc}") from exc
    except (TypeError, ValueError, LookupError, ArithmeticError, RecursionError) as exc:
        raise TemplateFailed(f"the chat template failed: {type(exc).__name__}: {exc}"
                             ) from exc


def check_template(template: str, bos_token: str | None, eos_token: str | None) -> None:
    """A template a bundle may carry: not empty, at most MAX_TEMPLATE_CHARS, compiles, and
    renders `EXAMPLE` with and without the generation prompt; TemplateFailed otherwise."""
    if not template.strip():
        raise TemplateFailed("the chat template is empty")
    if len(template) > MAX_TEMPLATE_CHARS:
        raise TemplateFailed(f"the chat template has {len(template)} characters, over "
                             f"{MAX_TEMPLATE_CHARS}")
    for prompt in (True, False):
        render(template, EXAMPLE, bos_token, eos_token, prompt)


def read_template(given: str, what: str = "--chat-template") -> str:
    """The template `given` names: a file's text (a tokenizer_config.json: its
    `chat_template`, the one named "default" where it lists several), else `given` itself;
    checked (`check_template`). UserError saying what is wrong."""
    import json
    from pathlib import Path

    path = Path(given)
    text = given
    try:
        is_file = len(given) < 4096 and "\n" not in given and path.is_file()
    except OSError:
        is_file = False
    if is_file:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise UserError(f"{what} {given}: cannot read it ({exc})") from exc
        if path.suffix.lower() == ".json":
            try:
                found = json.loads(text).get("chat_template")
            except (ValueError, AttributeError) as exc:
                raise UserError(f"{what} {given}: not a JSON object ({exc})") from exc
            if isinstance(found, list):  # [{"name", "template"}, ...]
                found = next((t.get("template") for t in found if isinstance(t, dict)
                              and t.get("name") == "default"), None)
            if not isinstance(found, str):
                raise UserError(f"{what} {given}: no chat_template string in it")
            text = found
    try:
        check_template(text, "<s>", "</s>")
    except TemplateFailed as exc:
        raise UserError(f"{what}: {exc}") from exc
    return text
