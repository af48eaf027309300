"""The Responses API's renderer: a request becomes a chat conversation, then the chat template's text.

`instructions` is the system message, then the stored conversation of `previous_response_id` (its input and
output), then `input` (a string, or items: items.py); the system and developer messages before the first turn
become one. `text.format`, `tools` (tools.py: functions, namespaces, hosted tools left out) and `tool_choice` map
onto chat completions' fields; every problem names the Responses API's own field. What was left out (hosted
tools, their items) is logged and named in response headers (ChatPlan.headers).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec

from inferd.server.apis.chat.render import render_chat
from inferd.server.apis.responses.items import input_messages, merge_leading_system
from inferd.server.apis.responses.request import ResponsesRequest
from inferd.server.apis.responses.store import ResponseStore, not_found
from inferd.server.apis.responses.tools import ToolNames, chat_tool_choice, chat_tools
from inferd.server.apis.sampling import sampling_params
from inferd.server.generation import PromptText, Rendered, limits
from inferd.server.protocol import Limits, ProtocolError
from inferd.server.state import ServerState
from inferd.server.structured import ChatPrep, prepare_chat, tool_request, with_reasoning
from inferd.text.grammar import GrammarError, GrammarSpec, response_format_grammar

log = logging.getLogger("inferd.server")

# request fields the response object repeats
ECHOED = (
    "instructions",
    "max_output_tokens",
    "temperature",
    "top_p",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "text",
    "previous_response_id",
    "metadata",
    "store",
    "reasoning",
    "service_tier",
    "truncation",
    "user",
    "safety_identifier",
    "prompt_cache_key",
    "max_tool_calls",
    "top_logprobs",
)
IGNORED_TOOLS_HEADER = "x-inferd-ignored-tools"
IGNORED_ITEMS_HEADER = "x-inferd-ignored-items"


@dataclass
class ChatPlan:
    messages: list[dict[str, Any]]  # the whole conversation to render
    new_messages: list[dict[str, Any]]  # what this request added (stored with the output)
    tools: list[dict[str, Any]] | None = None  # chat-completions form
    tool_choice: Any = None
    response_format: dict[str, Any] | None = None  # text.format, flat as the Responses API has it
    parallel_tool_calls: bool | None = None
    max_tokens: int | None = None
    store: bool = True
    echo: dict[str, Any] = field(default_factory=dict)  # request fields the response repeats
    names: ToolNames = field(default_factory=ToolNames)  # namespaced functions back to the client's names
    ignored_tools: list[str] = field(default_factory=list)  # hosted tools left out of the prompt
    ignored_items: list[str] = field(default_factory=list)  # hosted tools' input items left out
    reasoning_content: bool = False  # include: reasoning.encrypted_content (the thinking, given back to replay)

    @property
    def headers(self) -> dict[str, str] | None:
        """What was left out, for the client to see."""
        out = {}
        if self.ignored_tools:
            out[IGNORED_TOOLS_HEADER] = ", ".join(self.ignored_tools)
        if self.ignored_items:
            out[IGNORED_ITEMS_HEADER] = ", ".join(sorted(set(self.ignored_items)))
        return out or None


@dataclass
class ResponsesContext:
    """What the encoder needs: the plan (echoed fields, the conversation to store), the store, the tool settings."""

    plan: ChatPlan
    store: ResponseStore
    prep: ChatPrep


def response_store(state: ServerState) -> ResponseStore:
    if state.responses is None:
        state.responses = ResponseStore(state.settings.responses_store_size, state.settings.responses_ttl_s)
    return state.responses


def check_fields(req: ResponsesRequest) -> None:
    """The fields a local server cannot honour, refused by name; text.verbosity checked (and then ignored)."""
    if req.background:
        raise ProtocolError("background responses are not supported: the request waits for its answer", "background")
    if req.conversation is not None:
        raise ProtocolError(
            "conversation is not supported: send the items in input, or use previous_response_id", "conversation"
        )
    if req.prompt is not None:
        raise ProtocolError("prompt (a stored prompt template) is not supported: send instructions", "prompt")
    verbosity = (req.text or {}).get("verbosity")
    if verbosity is not None and verbosity not in ("low", "medium", "high"):
        raise ProtocolError(f"text.verbosity must be low, medium or high, got {verbosity!r}", "text.verbosity")
    if req.include is not None and not all(isinstance(x, str) for x in req.include):
        raise ProtocolError("include must be a list of strings", "include")


def plan(req: ResponsesRequest, store: ResponseStore) -> ChatPlan:
    """A Responses request -> the conversation and the chat fields it amounts to."""
    check_fields(req)
    history: list[dict[str, Any]] = []
    if req.previous_response_id is not None:
        stored = store.get(req.previous_response_id)
        if stored is None:
            raise not_found(req.previous_response_id)
        history = [m for m in stored.messages if m.get("role") != "system"]  # instructions are not carried over
    new = input_messages(req.input)
    system = [{"role": "system", "content": req.instructions}] if req.instructions else []
    fmt = (req.text or {}).get("format")
    tools = chat_tools(req.tools)
    choice, allowed = chat_tool_choice(req.tool_choice, tools)
    if not allowed and choice in ("auto", "none"):  # every tool was a hosted one: a plain answer
        allowed, choice = None, None
    if tools.ignored or new.ignored:
        log.info(
            "responses: left out hosted tools [%s] and input items [%s]",
            ", ".join(tools.ignored),
            ", ".join(sorted(set(new.ignored))),
        )
    return ChatPlan(
        messages=merge_leading_system(system + history + new.messages),
        new_messages=new.messages,
        tools=allowed,
        tool_choice=choice,
        response_format=dict(fmt) if isinstance(fmt, Mapping) else None,
        parallel_tool_calls=req.parallel_tool_calls,
        max_tokens=req.max_output_tokens,
        store=req.store,
        echo={k: msgspec.to_builtins(getattr(req, k)) for k in ECHOED},
        names=tools.names,
        ignored_tools=tools.ignored,
        ignored_items=new.ignored,
        reasoning_content="reasoning.encrypted_content" in (req.include or ()),
    )


def template_messages(messages: list[dict[str, Any]], limits: Limits) -> list[dict[str, Any]]:
    """The conversation as chat completions' checked messages are (a call-only assistant turn has empty content)."""
    if not messages:
        raise ProtocolError("input must contain at least one message", "input")
    if len(messages) > limits.max_messages:
        raise ProtocolError(f"too many messages: {len(messages)} > {limits.max_messages}", "input")
    return [{**m, "content": m.get("content") or ""} for m in messages]


def text_format_grammar(fmt: dict[str, Any] | None) -> GrammarSpec | None:
    if fmt is None:
        return None
    try:
        return response_format_grammar(fmt, "text.format")
    except GrammarError as e:
        raise ProtocolError(str(e), e.param) from None


def effort_variables(req: ResponsesRequest) -> dict[str, Any]:
    """reasoning.effort as chat completions' reasoning_effort reaches the template: `none`/`minimal` switch thinking
    off where the template reads enable_thinking, and the effort itself for templates that read it (gpt-oss)."""
    effort = req.reasoning.effort if req.reasoning is not None else None
    if effort is None:
        return {}
    return {"enable_thinking": effort not in ("none", "minimal"), "reasoning_effort": effort}


async def render(state: ServerState, req: ResponsesRequest) -> Rendered[ResponsesContext]:
    store = response_store(state)
    p = plan(req, store)
    messages = template_messages(p.messages, limits(state))
    tools = tool_request(p.tools, p.tool_choice, p.parallel_tool_calls)
    prep = await prepare_chat(state, messages, tools, text_format_grammar(p.response_format))
    text = render_chat(state, prep.messages, True, prep.tools, param="input", extra=effort_variables(req))
    prep = with_reasoning(state, prep, text)
    return Rendered(
        [PromptText(text, add_special=False)],
        lambda j: sampling_params(state.sampling_defaults, temperature=req.temperature, top_p=req.top_p, seed=req.seed),
        ResponsesContext(p, store, prep),
        "input",
        max_tokens=req.max_output_tokens,
        max_tokens_param="max_output_tokens",
        constraint=prep.constraint,
        shown_special=prep.shown_special,
    )
