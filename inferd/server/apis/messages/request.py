"""Anthropic's Messages API requests (POST /v1/messages and /v1/messages/count_tokens) and the checks msgspec cannot
express. Content blocks are a tagged union on `type`: a block of an unknown type is a 400 naming it; fields this
server has no use for (cache_control, citations, service_tier, ...) are accepted and ignored."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from msgspec import Meta, Struct

from inferd.server.protocol import Limits, ProtocolError
from inferd.text.tools.validation import TOOL_NAME


class TextBlock(Struct, tag="text", tag_field="type"):
    text: str


class ImageBlock(Struct, tag="image", tag_field="type"):
    source: Any = None


class DocumentBlock(Struct, tag="document", tag_field="type"):
    source: Any = None


class ToolUseBlock(Struct, tag="tool_use", tag_field="type"):
    id: str
    name: str
    input: dict[str, Any]


class ToolResultBlock(Struct, tag="tool_result", tag_field="type"):
    tool_use_id: str
    content: str | list[TextBlock | ImageBlock | DocumentBlock] | None = None
    is_error: bool = False


class ThinkingBlock(Struct, tag="thinking", tag_field="type"):
    thinking: str
    signature: str | None = None


class RedactedThinkingBlock(Struct, tag="redacted_thinking", tag_field="type"):
    data: str | None = None


Block = TextBlock | ImageBlock | DocumentBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock | RedactedThinkingBlock


class MessageParam(Struct):
    role: Literal["user", "assistant"]
    content: str | list[Block]


class ToolParam(Struct):
    """A client tool (no `type`, or "custom") has an input_schema; a typed one (web_search_20250305, bash_...) is
    one Anthropic runs or defines, which this server leaves out of the prompt."""

    name: str
    input_schema: dict[str, Any] | None = None
    description: str | None = None
    type: str | None = None
    strict: bool | None = None


class ToolChoiceParam(Struct):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool = False


class ThinkingParam(Struct):
    type: Literal["enabled", "disabled", "adaptive", "between_tools"]
    budget_tokens: Annotated[int, Meta(ge=1)] | None = None
    display: Literal["summarized", "omitted"] | None = None


class OutputFormatParam(Struct):
    type: Literal["json_schema"]
    schema: dict[str, Any]


class OutputConfigParam(Struct):
    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = None
    format: OutputFormatParam | None = None


class MessagesInput(Struct, kw_only=True):
    """What a prompt is made of: the body of count_tokens, and the first part of a messages request."""

    model: str
    messages: list[MessageParam]
    system: str | list[TextBlock] | None = None
    tools: list[ToolParam] | None = None
    tool_choice: ToolChoiceParam | None = None
    thinking: ThinkingParam | None = None
    output_config: OutputConfigParam | None = None


class MessagesRequest(MessagesInput, kw_only=True):
    max_tokens: Annotated[int, Meta(ge=0)]  # 0: nothing is generated (Anthropic's way to warm its cache)
    stream: bool = False
    stop_sequences: list[str] | None = None
    temperature: Annotated[float, Meta(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Meta(ge=0.0, le=1.0)] | None = None
    top_k: Annotated[int, Meta(ge=0)] | None = None
    metadata: dict[str, Any] | None = None


class CountTokensRequest(MessagesInput, kw_only=True):
    pass


def check_input(req: MessagesInput, limits: Limits) -> None:
    if not req.messages:
        raise ProtocolError("messages: at least one message is required", "messages")
    if len(req.messages) > limits.max_messages:
        raise ProtocolError(f"messages: too many messages ({len(req.messages)} > {limits.max_messages})", "messages")
    names: set[str] = set()
    for i, t in enumerate(req.tools or ()):
        if not TOOL_NAME.match(t.name):
            raise ProtocolError(
                f"tools.{i}.name: must be 1-64 letters, digits, '_', '.' or '-', got {t.name!r}", f"tools.{i}.name"
            )
        if t.name in names:
            raise ProtocolError(f"tools.{i}.name: tool {t.name!r} is given twice", f"tools.{i}.name")
        names.add(t.name)
        if t.type in (None, "custom") and t.input_schema is None:
            raise ProtocolError(f"tools.{i}.input_schema: a custom tool needs an input_schema", f"tools.{i}")
    choice = req.tool_choice
    if choice is not None and choice.type == "tool" and not choice.name:
        raise ProtocolError('tool_choice.name: a tool_choice of type "tool" names the tool', "tool_choice.name")


def check_request(req: MessagesRequest, limits: Limits) -> list[str]:
    """The request's checks beyond count_tokens'; returns its stop sequences."""
    check_input(req, limits)
    stops = list(req.stop_sequences or ())
    if len(stops) > limits.max_stop:
        raise ProtocolError(
            f"stop_sequences: at most {limits.max_stop} are supported, got {len(stops)}", "stop_sequences"
        )
    if any(not s for s in stops):
        raise ProtocolError("stop_sequences: a stop sequence must not be empty", "stop_sequences")
    budget = req.thinking.budget_tokens if req.thinking is not None else None
    if budget is not None and req.max_tokens and budget >= req.max_tokens:
        raise ProtocolError(
            f"max_tokens ({req.max_tokens}) must be greater than thinking.budget_tokens ({budget})", "max_tokens"
        )
    return stops
