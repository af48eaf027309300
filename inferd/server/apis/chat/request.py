"""The chat completions request and the checks msgspec cannot express; the messages' shape and their check are
shared with /tokenize and /v1/cache/warm."""

from __future__ import annotations

from typing import Annotated, Any

from msgspec import Meta, Struct

from inferd.server.apis.openai_fields import ResponseFormat, SamplingRequest, check_common
from inferd.server.protocol import Limits, ProtocolError

ROLES = ("system", "developer", "user", "assistant", "tool")
REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high")
TEMPLATE_VARIABLES = ("messages", "tools", "add_generation_prompt", "bos_token", "eos_token")  # the server's own


def template_kwargs(req: ChatCompletionRequest) -> dict[str, Any]:
    """The template's extra variables: the request's chat_template_kwargs, and reasoning_effort as the
    enable_thinking switch that thinking templates read (Qwen3's and its kin) unless the kwargs set it."""
    extra = dict(req.chat_template_kwargs or {})
    if req.reasoning_effort is not None:
        extra.setdefault("enable_thinking", req.reasoning_effort not in ("none", "minimal"))
        extra.setdefault("reasoning_effort", req.reasoning_effort)
    return extra


class ContentPart(Struct, forbid_unknown_fields=False):
    type: str
    text: str | None = None


class Message(Struct):
    role: str
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None  # assistant: the calls it made
    tool_call_id: str | None = None  # role "tool": the call this answers
    reasoning_content: str | None = None  # assistant: its thinking, for templates that show earlier turns' (vLLM)
    reasoning: str | None = None  # the same, under the field's newer name


class ChatCompletionRequest(SamplingRequest, kw_only=True):
    messages: list[Message]
    max_completion_tokens: Annotated[int, Meta(ge=0)] | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, Meta(ge=0, le=20)] | None = None
    response_format: ResponseFormat | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    functions: list[Any] | None = None
    add_generation_prompt: bool = True
    chat_template_kwargs: dict[str, Any] | None = None  # more variables for the template (enable_thinking, ...)
    reasoning_effort: str | None = None  # none/minimal: no thinking where the template can switch it off
    max_thinking_tokens: Annotated[int, Meta(ge=0)] | None = None  # past it the thinking is closed (0: no limit)


def message_text(m: Message, i: int) -> str:
    if m.content is None:
        return ""
    if isinstance(m.content, str):
        return m.content
    texts = []
    for j, part in enumerate(m.content):
        if part.type != "text" or part.text is None:
            raise ProtocolError(
                f"only text content parts are supported, got type {part.type!r}", f"messages[{i}].content[{j}]"
            )
        texts.append(part.text)
    return "".join(texts)


def check_messages(messages: list[Message] | None, limits: Limits) -> list[dict[str, Any]]:
    """Validated messages as plain {role, content} dicts for the chat template (plus tool_calls, tool_call_id and
    name where given; inferd.text.tools.prepare_messages shapes those for the template)."""
    if not messages:
        raise ProtocolError("messages must contain at least one message", "messages")
    if len(messages) > limits.max_messages:
        raise ProtocolError(f"too many messages: {len(messages)} > {limits.max_messages}", "messages")
    out = []
    for i, m in enumerate(messages):
        if m.role not in ROLES:
            raise ProtocolError(f"unsupported role {m.role!r}; use one of {', '.join(ROLES)}", f"messages[{i}].role")
        role = "system" if m.role == "developer" else m.role
        msg: dict[str, Any] = {"role": role, "content": message_text(m, i)}
        if m.tool_calls:
            if role != "assistant":
                raise ProtocolError("only assistant messages have tool_calls", f"messages[{i}].tool_calls")
            msg["tool_calls"] = m.tool_calls
        if role == "tool":
            if not m.tool_call_id:
                raise ProtocolError("a tool message needs the tool_call_id it answers", f"messages[{i}].tool_call_id")
            msg["tool_call_id"] = m.tool_call_id
        if m.name is not None:
            msg["name"] = m.name
        thinking = m.reasoning_content if m.reasoning_content is not None else m.reasoning
        if thinking is not None and role == "assistant":
            msg["reasoning_content"] = thinking
        out.append(msg)
    return out


def check_chat(req: ChatCompletionRequest, limits: Limits) -> None:
    check_common(req, limits)
    if req.functions:
        raise ProtocolError("functions (the deprecated form) are not supported; send tools", "functions")
    if req.reasoning_effort is not None and req.reasoning_effort not in REASONING_EFFORTS:
        raise ProtocolError(f"reasoning_effort must be one of {', '.join(REASONING_EFFORTS)}", "reasoning_effort")
    for key in req.chat_template_kwargs or {}:
        if key in TEMPLATE_VARIABLES:
            raise ProtocolError(f"{key} is set by the server, not by chat_template_kwargs", "chat_template_kwargs")
    if req.top_logprobs is not None and not req.logprobs:
        raise ProtocolError("top_logprobs requires logprobs to be true", "top_logprobs")
    for name in ("max_tokens", "max_completion_tokens"):
        if getattr(req, name) == 0:
            raise ProtocolError(f"{name} must be at least 1 for chat completions", name)
    if (
        req.max_tokens is not None
        and req.max_completion_tokens is not None
        and req.max_tokens != req.max_completion_tokens
    ):
        raise ProtocolError("max_tokens and max_completion_tokens disagree; send one of them", "max_completion_tokens")
