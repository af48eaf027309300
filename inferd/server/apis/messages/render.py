"""The Messages API's renderer: the Anthropic conversation, tools and thinking switch -> chat completions' messages
and tools (conversation.py, structured.py), then the chat template's text; the same prompt for count_tokens.

max_tokens is an upper bound here, as it is in Anthropic's API: an answer that would pass the model's context ends
there (stop_reason model_context_window_exceeded) instead of the request being refused."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from inferd.server.apis.chat.render import render_chat
from inferd.server.apis.messages.conversation import conversation
from inferd.server.apis.messages.request import (
    MessagesInput,
    MessagesRequest,
    OutputConfigParam,
    ThinkingParam,
    ToolChoiceParam,
    ToolParam,
    check_input,
    check_request,
)
from inferd.server.apis.sampling import sampling_params
from inferd.server.generation import PromptText, Rendered, limits
from inferd.server.protocol import ProtocolError
from inferd.server.state import ServerState
from inferd.server.structured import ChatPrep, prepare_chat, tool_request, with_reasoning
from inferd.text.grammar import GrammarError, GrammarSpec, json_schema_grammar

log = logging.getLogger("inferd.server")


@dataclass
class MessagesContext:
    prep: ChatPrep  # how the answer is parsed (thinking, tool calls)
    stops: list[str]
    max_tokens: int  # as requested: an answer cut shorter than that was cut by the context


def chat_tools(tools: list[ToolParam] | None) -> list[dict[str, Any]] | None:
    """Client tools in chat completions' shape; typed tools (Anthropic's own: web_search_..., bash_...) are left
    out, since this server cannot run them."""
    if tools is None:
        return None
    out = []
    for t in tools:
        if t.type not in (None, "custom"):
            log.info("messages: tool %r of type %r left out of the prompt (not run by this server)", t.name, t.type)
            continue
        fn: dict[str, Any] = {"name": t.name, "parameters": t.input_schema}
        if t.description is not None:
            fn["description"] = t.description
        if t.strict is not None:
            fn["strict"] = t.strict
        out.append({"type": "function", "function": fn})
    return out


def chat_tool_choice(choice: ToolChoiceParam | None, tools: list[dict[str, Any]] | None) -> Any:
    if choice is None:
        return None
    if choice.type in ("any", "tool") and not tools:
        raise ProtocolError(f"tool_choice: type {choice.type!r} needs tools", "tool_choice")
    if choice.type == "tool":
        if not any(t["function"]["name"] == choice.name for t in tools or ()):
            raise ProtocolError(f"tool_choice.name: no tool is named {choice.name!r}", "tool_choice.name")
        return {"type": "function", "function": {"name": choice.name}}
    if choice.type == "auto":
        return "auto" if tools else None
    return {"any": "required", "none": "none"}[choice.type]


def template_switches(thinking: ThinkingParam | None, output: OutputConfigParam | None) -> dict[str, Any]:
    """The template's variables for thinking: Qwen3's enable_thinking switch and its kin (thinking "adaptive",
    "between_tools" or absent: the template's own default), and gpt-oss's reasoning_effort from output_config's
    effort (its top three levels are gpt-oss's "high")."""
    extra: dict[str, Any] = {}
    if thinking is not None and thinking.type in ("enabled", "disabled"):
        extra["enable_thinking"] = thinking.type == "enabled"
    if output is not None and output.effort is not None:
        extra["reasoning_effort"] = output.effort if output.effort in ("low", "medium") else "high"
    return extra


def thinking_budget(state: ServerState, thinking: ThinkingParam | None) -> int | None:
    """budget_tokens as the reasoning budget (past it the thinking is closed) where the engine can force that; an
    engine that cannot (no token masks) leaves it a hint, as Anthropic's own budget is one, rather than refuse
    every request of a client that always sends it. None: the server's max_thinking_tokens."""
    if thinking is None or thinking.type != "enabled" or thinking.budget_tokens is None:
        return None
    return thinking.budget_tokens if getattr(state.engine, "supports_token_masks", False) else None


def answer_format(output: OutputConfigParam | None) -> GrammarSpec | None:
    """output_config.format: the answer's text follows the JSON schema (a grammar, as response_format's does)."""
    if output is None or output.format is None:
        return None
    try:
        return json_schema_grammar(output.format.schema, "output_config.format.schema")
    except GrammarError as e:
        raise ProtocolError(str(e), e.param) from None


async def render_prompt(
    state: ServerState, req: MessagesInput, spec: GrammarSpec | None = None
) -> tuple[str, ChatPrep]:
    """The prompt's text and how its answer is parsed: what /v1/messages generates from and count_tokens counts
    (`spec`, the answer's format, changes the constraint, never the prompt)."""
    check_input(req, limits(state))
    conv = conversation(req.system, req.messages)
    tools = chat_tools(req.tools)
    parallel = None if req.tool_choice is None else not req.tool_choice.disable_parallel_tool_use
    tool_req = tool_request(tools, chat_tool_choice(req.tool_choice, tools), parallel)
    prep = await prepare_chat(state, conv.messages, tool_req, spec)
    extra = template_switches(req.thinking, req.output_config)
    text = render_chat(state, prep.messages, True, prep.tools, extra=extra) + conv.prefill
    return text, with_reasoning(state, prep, text, thinking_budget(state, req.thinking), "thinking.budget_tokens")


async def render(state: ServerState, req: MessagesRequest) -> Rendered[MessagesContext]:
    stops = check_request(req, limits(state))
    text, prep = await render_prompt(state, req, answer_format(req.output_config))
    defaults = state.sampling_defaults
    return Rendered(
        [PromptText(text, add_special=False)],  # the template wrote BOS itself if it wants one
        lambda j: sampling_params(defaults, temperature=req.temperature, top_p=req.top_p, top_k=req.top_k),
        MessagesContext(prep, stops, req.max_tokens),
        "messages",
        default_max_tokens=req.max_tokens,  # an upper bound: what fits of it (see the module's docstring)
        stop=stops,
        constraint=prep.constraint,
        shown_special=prep.shown_special,
    )
