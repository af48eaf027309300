"""Ollama's request bodies (chat, generate) and the checks msgspec cannot express: the model's name, `options`,
`format`, `think`, `keep_alive`, and the error envelope {"error": "..."}.

Fields are typed as Ollama's own server types them; an option Ollama knows but inferd has no use for
(num_thread, mirostat, ...) is ignored, as Ollama ignores options it does not know.
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Any

import msgspec
from msgspec import Meta, Struct

from inferd.server.protocol import ProtocolError
from inferd.server.state import ServerState
from inferd.text.grammar import GrammarError, GrammarSpec
from inferd.text.grammar.spec import json_schema_grammar

THINK_LEVELS = ("low", "medium", "high")
ROLES = ("system", "user", "assistant", "tool")


class OllamaError(Struct):
    error: str


def error_body(e: ProtocolError) -> OllamaError:
    return OllamaError(e.message)


class Options(Struct, forbid_unknown_fields=False):
    """The options inferd maps; any other key is ignored."""

    num_predict: int | None = None  # < 0 (Ollama's -1 and -2): until the context is full
    num_ctx: int | None = None  # checked against the server's context; the context itself is the server's
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    stop: str | list[str] | None = None
    seed: int | None = None  # < 0: random, as Ollama's default -1
    repeat_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None


class ToolCallFunction(Struct, forbid_unknown_fields=False):
    name: str
    arguments: dict[str, Any] | str = {}


class ToolCall(Struct, forbid_unknown_fields=False):
    function: ToolCallFunction
    id: str | None = None


class Message(Struct, forbid_unknown_fields=False):
    role: str
    content: str | None = None
    images: list[Any] | None = None
    thinking: str | None = None  # an earlier assistant turn's, for templates that show it
    tool_calls: list[ToolCall] | None = None
    tool_name: str | None = None  # role "tool": the function whose result this is


class OllamaRequest(Struct, kw_only=True):
    """What chat and generate share. The model is checked by the renderer, in Ollama's words (`model` is None for
    the pipeline's own check)."""

    model_name: str = msgspec.field(name="model")
    stream: bool = True  # Ollama streams unless told not to
    options: Options | None = None
    format: Any = None  # "json", a JSON schema, or "" / null for free text
    think: bool | str | None = None
    keep_alive: float | str | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, Meta(ge=0, le=20)] | None = None

    @property
    def model(self) -> None:
        return None


class ChatRequest(OllamaRequest, kw_only=True):
    messages: list[Message] | None = None
    tools: list[Any] | None = None


class GenerateRequest(OllamaRequest, kw_only=True):
    prompt: str | None = None
    suffix: str | None = None
    system: str | None = None
    template: str | None = None
    context: list[Annotated[int, Meta(ge=0)]] | None = None
    raw: bool = False
    images: list[Any] | None = None


# ---- checks -------------------------------------------------------------------------------------------------


def base_name(name: str) -> str:
    """`x:latest` is `x`, as Ollama's default tag."""
    return name[: -len(":latest")] if name.endswith(":latest") else name


def check_chat_model(state: ServerState, name: str) -> None:
    """The chat model answers to its served name, the name it was started with, and their `:latest` forms."""
    names = state.model_names()
    if name in names or base_name(name) in names:
        return
    if any(s.answers_to(name) or s.answers_to(base_name(name)) for s in state.embeddings):
        raise ProtocolError(f'"{name}" does not support generate or chat: it is an embedding model', "model")
    raise ProtocolError(f"model '{name}' not found", "model", status=404)


def check_request(state: ServerState, req: OllamaRequest) -> None:
    check_chat_model(state, req.model_name)
    keep_alive_seconds(req.keep_alive)
    if req.top_logprobs is not None and not req.logprobs:
        raise ProtocolError("top_logprobs requires logprobs to be true", "top_logprobs")
    opts = req.options
    if opts is not None and opts.num_ctx is not None:
        if opts.num_ctx < 1:
            raise ProtocolError(f"num_ctx must be at least 1, got {opts.num_ctx}", "options.num_ctx")
        if opts.num_ctx > state.max_model_len:
            raise ProtocolError(
                f"num_ctx {opts.num_ctx} is more than this server's context of {state.max_model_len} tokens; "
                f"the context is set when the server starts (--max-model-len)",
                "options.num_ctx",
            )


def refuse_images(images: list[Any] | None, param: str) -> None:
    if images:
        raise ProtocolError(f"{param}: images are not supported: this server's model reads text only", param)


_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_UNIT_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def keep_alive_seconds(value: float | str | None) -> float | None:
    """keep_alive as Ollama reads it: seconds as a number, or a duration ("5m", "1h30m", "-1"); negative is
    forever. It is accepted and checked; the model stays loaded whatever it says."""
    if value is None:
        return None
    if isinstance(value, (int, float)):
        if not math.isfinite(value):
            raise ProtocolError("keep_alive must be a finite number of seconds or a duration", "keep_alive")
        return float(value)
    text = value.strip()
    try:
        return float(text)
    except ValueError:
        pass
    sign = -1.0 if text.startswith("-") else 1.0
    body = text.lstrip("+-")
    parts = _DURATION.findall(body)
    if not body or "".join(n + u for n, u in parts) != body:
        raise ProtocolError(
            f'keep_alive {value!r} is not a duration (such as "5m", "1h30m", "-1") or a number of seconds',
            "keep_alive",
        )
    return sign * sum(float(n) * _UNIT_S[u] for n, u in parts)


def format_grammar(fmt: Any) -> GrammarSpec | None:
    """`format`: "json" (any JSON object) or a JSON schema the answer must follow; "" or null: free text."""
    if fmt is None or fmt == "":
        return None
    try:
        if fmt == "json":
            return json_schema_grammar({"type": "object"}, "format", kind="json_object")
        if isinstance(fmt, dict):
            return json_schema_grammar(fmt, "format")
    except GrammarError as e:
        raise ProtocolError(str(e), e.param) from None
    raise ProtocolError('format must be "json" or a JSON schema (an object)', "format")


def check_think(think: bool | str | None, model_thinks: bool) -> None:
    if isinstance(think, str) and think not in THINK_LEVELS:
        raise ProtocolError(f"think must be true, false or one of {', '.join(THINK_LEVELS)}, got {think!r}", "think")
    if think not in (None, False) and not model_thinks:
        raise ProtocolError("this model does not support thinking (its chat template does not think aloud)", "think")


def think_kwargs(think: bool | str | None) -> dict[str, Any]:
    """The template variables `think` sets: enable_thinking (Qwen3's and its kin's switch) and, for a level,
    reasoning_effort (gpt-oss's)."""
    if think is None:
        return {}
    extra: dict[str, Any] = {"enable_thinking": think is not False}
    if isinstance(think, str):
        extra["reasoning_effort"] = think
    return extra
