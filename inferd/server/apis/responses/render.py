"""The Responses API's renderer: a request becomes a chat conversation, then the chat template's text.

`instructions` is the system message, then the stored conversation of `previous_response_id` (its input and
output), then `input` (a string, or message / function_call / function_call_output items). `text.format`, `tools`
(flat function tools) and `tool_choice` map onto chat completions' fields; every problem names the Responses
API's own field.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from inferd.server.apis.chat.render import render_chat
from inferd.server.apis.responses.request import ResponsesRequest
from inferd.server.apis.responses.store import ResponseStore, not_found
from inferd.server.apis.sampling import sampling_params
from inferd.server.generation import PromptText, Rendered, limits
from inferd.server.protocol import Limits, ProtocolError
from inferd.server.state import ServerState
from inferd.server.structured import ChatPrep, prepare_chat, tool_request, with_reasoning
from inferd.text.grammar import GrammarError, GrammarSpec, response_format_grammar

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
)


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


def _content_text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        parts = []
        for j, p in enumerate(content):
            if not isinstance(p, Mapping) or p.get("type") not in ("input_text", "output_text", "text"):
                kind = p.get("type") if isinstance(p, Mapping) else type(p).__name__
                raise ProtocolError(
                    f"{where}[{j}]: content type {kind!r} is not supported (text only)", f"{where}[{j}]"
                )
            parts.append(str(p.get("text", "")))
        return "".join(parts)
    raise ProtocolError(f"{where} must be a string or a list of text parts", where)


def input_messages(items: Any) -> list[dict[str, Any]]:
    """`input` -> chat messages; consecutive function_call items become one assistant message with tool_calls."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    if not isinstance(items, Sequence):
        raise ProtocolError("input must be a string or a list of items", "input")
    out: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, Mapping):
            raise ProtocolError(f"{where} must be an object", where)
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise ProtocolError(f"{where}.role must be user, assistant, system or developer", f"{where}.role")
            out.append(
                {
                    "role": "system" if role == "developer" else role,
                    "content": _content_text(item.get("content"), f"{where}.content"),
                }
            )
        elif kind == "function_call":
            name, call_id = item.get("name"), item.get("call_id")
            if not isinstance(name, str) or not isinstance(call_id, str):
                raise ProtocolError(f"{where} needs name and call_id", where)
            call = {
                "id": call_id,
                "type": "function",
                "function": {"name": name, "arguments": item.get("arguments") or "{}"},
            }
            if out and out[-1]["role"] == "assistant" and out[-1].get("tool_calls") is not None:
                out[-1]["tool_calls"].append(call)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            call_id = item.get("call_id")
            if not isinstance(call_id, str) or not call_id:
                raise ProtocolError(f"{where} needs call_id", f"{where}.call_id")
            output = item.get("output")
            out.append(
                {
                    "role": "tool",
                    "tool_call_id": call_id,
                    "content": output if isinstance(output, str) else _content_text(output, f"{where}.output"),
                }
            )
        else:
            raise ProtocolError(
                f"{where}: item type {kind!r} is not supported (message, function_call, function_call_output)",
                f"{where}.type",
            )
    return out


def chat_tools(tools: Any) -> list[dict[str, Any]] | None:
    """Responses function tools are flat ({"type", "name", "parameters", ...}); chat nests them under function."""
    if tools is None:
        return None
    if not isinstance(tools, Sequence):
        raise ProtocolError("tools must be a list", "tools")
    out = []
    for i, t in enumerate(tools):
        if not isinstance(t, Mapping) or t.get("type") != "function":
            kind = t.get("type") if isinstance(t, Mapping) else None
            raise ProtocolError(f"tools[{i}]: tool type {kind!r} is not supported (function)", f"tools[{i}].type")
        fn = {k: t[k] for k in ("name", "description", "parameters", "strict") if t.get(k) is not None}
        out.append({"type": "function", "function": fn})
    return out


def chat_tool_choice(choice: Any) -> Any:
    if isinstance(choice, Mapping) and choice.get("type") == "function" and "name" in choice:
        return {"type": "function", "function": {"name": choice["name"]}}
    return choice


def plan(req: ResponsesRequest, store: ResponseStore) -> ChatPlan:
    """A Responses request -> the conversation and the chat fields it amounts to."""
    history: list[dict[str, Any]] = []
    if req.previous_response_id is not None:
        stored = store.get(req.previous_response_id)
        if stored is None:
            raise not_found(req.previous_response_id)
        history = [m for m in stored.messages if m.get("role") != "system"]  # instructions are not carried over
    new = input_messages(req.input)
    system = [{"role": "system", "content": req.instructions}] if req.instructions else []
    fmt = (req.text or {}).get("format")
    return ChatPlan(
        messages=system + history + new,
        new_messages=new,
        tools=chat_tools(req.tools),
        tool_choice=chat_tool_choice(req.tool_choice),
        response_format=dict(fmt) if isinstance(fmt, Mapping) else None,
        parallel_tool_calls=req.parallel_tool_calls,
        max_tokens=req.max_output_tokens,
        store=req.store,
        echo={k: getattr(req, k) for k in ECHOED},
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


async def render(state: ServerState, req: ResponsesRequest) -> Rendered[ResponsesContext]:
    store = response_store(state)
    p = plan(req, store)
    messages = template_messages(p.messages, limits(state))
    tools = tool_request(p.tools, p.tool_choice, p.parallel_tool_calls)
    prep = await prepare_chat(state, messages, tools, text_format_grammar(p.response_format))
    text = render_chat(state, prep.messages, True, prep.tools, param="input")
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
