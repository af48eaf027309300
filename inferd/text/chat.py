"""Chat templates (sandboxed jinja2, rendered the way transformers renders them) and stop-string matching."""

from __future__ import annotations

import json
import signal
import threading
from contextlib import contextmanager
from datetime import datetime
from functools import lru_cache
from typing import Any
from collections.abc import Iterable, Iterator, Mapping, Sequence

import jinja2
import jinja2.ext
from jinja2 import nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

# the templates live apart (no jinja2 there, for the model loader); named here as before
from inferd.text.chat_templates import CHATML_TEMPLATE as CHATML_TEMPLATE
from inferd.text.chat_templates import GEMMA_TEMPLATE as GEMMA_TEMPLATE
from inferd.text.chat_templates import default_template as default_template


class ChatTemplateError(ValueError):
    """A chat template that does not compile, or that refuses (raise_exception) or fails on the messages."""


class _GenerationTags(jinja2.ext.Extension):
    """Accept transformers' {% generation %}...{% endgeneration %} markers (used for training masks) as no-ops."""

    tags = {"generation"}

    def parse(self, parser: Any) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.Scope(body, lineno=lineno)


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    x: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None, sort_keys: bool = False
) -> str:
    # transformers' tojson: unlike jinja's built-in, no HTML escaping and non-ASCII kept as is
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


# Bounds on what one operator may build: a chat template comes with the model file, and one line of it such as
# {{ 'x' * 10**9 }} would otherwise hold the event loop and gigabytes of memory for every request.
MAX_REPEAT_LEN = 1 << 20  # items of a string or list made by `*`
MAX_POWER_BITS = 4096  # bits of an integer made by `**`
# Loops are bounded one by one (jinja's sandbox caps range() at 100k items), not in how they nest, so a render
# also has a time budget; real templates render in well under a millisecond.
RENDER_BUDGET_S = 1.0


class _BoundedSandbox(ImmutableSandboxedEnvironment):
    intercepted_binops = frozenset(["*", "**"])

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        if operator == "*":
            for seq, n in ((left, right), (right, left)):
                if isinstance(seq, (str, list, tuple)) and isinstance(n, int) and len(seq) * n > MAX_REPEAT_LEN:
                    raise jinja2.sandbox.SecurityError(
                        f"repetition makes {len(seq) * n} items, more than {MAX_REPEAT_LEN}"
                    )
        elif operator == "**" and isinstance(left, int) and isinstance(right, int) and right > 0:
            if abs(left) > 1 and right * max(abs(left).bit_length(), 1) > MAX_POWER_BITS:
                raise jinja2.sandbox.SecurityError(f"power of {right} makes more than {MAX_POWER_BITS} bits")
        return super().call_binop(context, operator, left, right)


def _environment() -> ImmutableSandboxedEnvironment:
    env = _BoundedSandbox(trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTags, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


class ChatTemplate:
    """A compiled chat template. source None -> the ChatML fallback."""

    def __init__(self, source: str | None, bos_token: str | None = None, eos_token: str | None = None):
        self.source = source if source is not None else CHATML_TEMPLATE
        self.is_fallback = source is None
        self.bos_token = bos_token or ""
        self.eos_token = eos_token or ""
        try:
            self._template = _environment().from_string(self.source)
        except jinja2.TemplateSyntaxError as e:
            raise ChatTemplateError(f"chat template does not compile: {e.message} (template line {e.lineno})") from e

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
        **extra: Any,
    ) -> str:
        """The prompt text. It already holds the template's special tokens (BOS included when the template writes
        it), so tokenize it with add_special=False, as transformers' apply_chat_template does."""
        msgs = [_flatten(m, i) for i, m in enumerate(messages)]
        try:
            with _time_budget(RENDER_BUDGET_S):
                return self._template.render(
                    messages=msgs,
                    add_generation_prompt=add_generation_prompt,
                    tools=tools,
                    bos_token=self.bos_token,
                    eos_token=self.eos_token,
                    **extra,
                )
        except ChatTemplateError:
            raise
        except jinja2.TemplateError as e:
            raise ChatTemplateError(f"chat template failed: {e.message or e}") from e
        except Exception as e:  # a template bug (e.g. a None + str) is still the template's fault, not ours
            raise ChatTemplateError(f"chat template failed: {type(e).__name__}: {e}") from e


@contextmanager
def _time_budget(seconds: float) -> Iterator[None]:
    """Interrupts the block with ChatTemplateError after `seconds`, by SIGALRM. Signals reach only the main thread,
    which is where the server's event loop renders; elsewhere (a test's server thread) the block is not timed."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        yield
        return
    active = True

    def expired(signum: int, frame: Any) -> None:
        if active:  # not once the block has ended, even if the timer fired just before it was cancelled
            raise ChatTemplateError(f"chat template took more than {seconds:g} s to render (a runaway loop?)")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        active = False
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@lru_cache(maxsize=32)
def _compiled(source: str | None, bos_token: str | None, eos_token: str | None) -> ChatTemplate:
    return ChatTemplate(source, bos_token, eos_token)


def render_chat(
    template: str | None,
    messages: Sequence[Mapping[str, Any]],
    tokenizer: Any = None,
    add_generation_prompt: bool = True,
    **extra: Any,
) -> str:
    """Render `messages` with a model's template (None -> ChatML), BOS/EOS texts taken from `tokenizer`.

    Compiled templates are cached, so calling this per request costs one render. Tokenize the result with
    add_special=False (the template writes its own BOS).
    """
    bos = getattr(tokenizer, "bos_token", None)
    eos = getattr(tokenizer, "eos_token", None)
    return _compiled(template, bos, eos).render(messages, add_generation_prompt=add_generation_prompt, **extra)


def _flatten(message: Mapping[str, Any], index: int) -> dict[str, Any]:
    """OpenAI clients may send content as [{"type": "text", "text": ...}]; most templates expect a string. An
    earlier turn's thinking goes by both the names templates read: `reasoning_content` (Qwen3's, DeepSeek's) and
    `thinking` (gpt-oss's)."""
    if not isinstance(message, Mapping) or "role" not in message:
        raise ChatTemplateError(f"message {index} is not an object with a role")
    out = dict(message)
    content = out.get("content")
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, Mapping) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise ChatTemplateError(f"message {index}: only text content parts are supported")
            texts.append(part["text"])
        out["content"] = "".join(texts)
    elif content is None:
        out["content"] = ""
    if out.get("reasoning_content") is not None and "thinking" not in out:
        out["thinking"] = out["reasoning_content"]
    elif out.get("thinking") is not None and "reasoning_content" not in out:
        out["reasoning_content"] = out["thinking"]
    return out


class StopChecker:
    """Feed generated text piece by piece; get back what is safe to show and whether a stop string matched.

    Text that could be the beginning of a stop string is held back until it either completes the stop (then it
    is dropped, as OpenAI's API drops the stop text) or can no longer match (then it is released).
    """

    def __init__(self, stops: Iterable[str]):
        self.stops = sorted({s for s in stops if s}, key=len, reverse=True)
        self._held = ""
        self.matched: str | None = None

    def feed(self, text: str) -> tuple[str, str | None]:
        """(text to emit now, the stop string if one just matched). After a match, everything is swallowed."""
        if self.matched is not None:
            return "", self.matched
        buf = self._held + text
        best: tuple[int, str] | None = None
        for s in self.stops:  # longest first, so on equal positions the longest stop wins
            i = buf.find(s)
            if i >= 0 and (best is None or i < best[0]):
                best = (i, s)
        if best is not None:
            self.matched, self._held = best[1], ""
            return buf[: best[0]], best[1]
        keep = 0
        for s in self.stops:
            for k in range(min(len(s) - 1, len(buf)), keep, -1):
                if buf.endswith(s[:k]):
                    keep = k
                    break
        self._held = buf[len(buf) - keep :] if keep else ""
        return buf[: len(buf) - keep], None

    def flush(self) -> str:
        """At the end of generation (no stop matched): the held-back text, which is real output."""
        held, self._held = self._held, ""
        return held if self.matched is None else ""
