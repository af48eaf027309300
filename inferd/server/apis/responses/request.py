"""The Responses API's request (POST /v1/responses); `input` items, flat tools and text.format are checked in depth by
the renderer, which turns them into a chat conversation."""

from __future__ import annotations

from typing import Annotated, Any

from msgspec import Meta, Struct

from inferd.server.apis.openai_fields import Temperature, TopP


class ResponsesRequest(Struct, kw_only=True, forbid_unknown_fields=False):
    input: str | list[dict[str, Any]]  # a user message, or message / function_call / function_call_output items
    model: str | None = None
    instructions: str | None = None  # the system message (not carried over to a follow-up)
    max_output_tokens: Annotated[int, Meta(ge=1)] | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    tools: list[dict[str, Any]] | None = None  # {"type": "function", "name", "description", "parameters"}
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    text: dict[str, Any] | None = None  # {"format": {"type": "text" | "json_object" | "json_schema"}}
    stream: bool = False
    store: bool = True
    previous_response_id: str | None = None
    metadata: dict[str, str] | None = None
    seed: int | None = None
