"""The Responses API's request (POST /v1/responses); `input` items, tools and text.format are checked in depth by
the renderer, which turns them into a chat conversation. Fields that agents send and that mean nothing to a local
server (service_tier, safety_identifier, prompt_cache_key...) are typed here, so a bad value is still a 400, and
echoed in the response; docs/api.md says which are used."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from msgspec import Meta, Struct

from inferd.server.apis.openai_fields import Temperature, TopP

Effort = Literal["none", "minimal", "low", "medium", "high", "xhigh"]
Summary = Literal["auto", "concise", "detailed"]


class ReasoningConfig(Struct, kw_only=True, forbid_unknown_fields=False):
    effort: Effort | None = None
    summary: Summary | None = None
    generate_summary: Summary | None = None  # the older name of summary


class ResponsesRequest(Struct, kw_only=True, forbid_unknown_fields=False):
    input: str | list[dict[str, Any]]  # a user message, or message / function_call / ... items
    model: str | None = None
    instructions: str | None = None  # the system message (not carried over to a follow-up)
    max_output_tokens: Annotated[int, Meta(ge=1)] | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    tools: list[dict[str, Any]] | None = None  # function, namespace, and hosted tools (left out)
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    text: dict[str, Any] | None = None  # {"format": {"type": "text" | "json_object" | "json_schema"}, "verbosity"}
    stream: bool = False
    store: bool = True
    previous_response_id: str | None = None
    metadata: dict[str, str] | None = None
    seed: int | None = None
    reasoning: ReasoningConfig | None = None
    include: list[str] | None = None  # "reasoning.encrypted_content" is honoured; the rest are accepted
    prompt_cache_key: Annotated[str, Meta(max_length=1024)] | None = None
    client_metadata: dict[str, Any] | None = None
    safety_identifier: Annotated[str, Meta(max_length=1024)] | None = None
    user: Annotated[str, Meta(max_length=1024)] | None = None
    service_tier: Literal["auto", "default", "flex", "scale", "priority"] | None = None
    truncation: Literal["auto", "disabled"] | None = None
    max_tool_calls: Annotated[int, Meta(ge=1)] | None = None
    top_logprobs: Annotated[int, Meta(ge=0, le=20)] | None = None
    stream_options: dict[str, Any] | None = None
    background: bool | None = None  # only false: a response is answered while the request waits
    conversation: Any = None  # refused: conversations live on OpenAI's side
    prompt: Any = None  # refused: reusable prompts live on OpenAI's side
