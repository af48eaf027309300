"""The Responses API's `input` items -> chat messages, as agents replay whole conversations without
previous_response_id: messages (user, assistant, system, developer), function_call and function_call_output items
(namespaced calls under the name the model saw), and reasoning items, whose thinking goes with the assistant turn
that follows it. Items of hosted tools (web search calls, shell calls, MCP items...) were run elsewhere and mean
nothing to the model here: they are left out and named (InputMessages.ignored).

A reasoning item's `encrypted_content` is what this server wrote (include: ["reasoning.encrypted_content"]): the
thinking itself, marked and base64-encoded, not encrypted, so that a client that keeps nothing else can give the
thinking back; another server's opaque content is ignored.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from inferd.server.apis.responses.tools import exposed_name
from inferd.server.protocol import ProtocolError

ENCRYPTED_PREFIX = "inferd-reasoning-v1:"
TEXT_PARTS = ("input_text", "output_text", "text", "summary_text", "reasoning_text")
ROLES = ("user", "assistant", "system", "developer")
# items of tools that ran elsewhere (hosted tools): left out of the prompt
HOSTED_ITEMS = frozenset(
    {
        "web_search_call",
        "file_search_call",
        "computer_call",
        "computer_call_output",
        "code_interpreter_call",
        "image_generation_call",
        "local_shell_call",
        "local_shell_call_output",
        "shell_call",
        "shell_call_output",
        "apply_patch_call",
        "apply_patch_call_output",
        "mcp_list_tools",
        "mcp_approval_request",
        "mcp_approval_response",
        "mcp_call",
        "custom_tool_call",
        "custom_tool_call_output",
        "tool_search_call",
        "tool_search_output",
        "compaction",
        "compaction_trigger",
    }
)


@dataclass
class InputMessages:
    messages: list[dict[str, Any]]
    ignored: list[str] = field(default_factory=list)  # item types left out


def encrypt_reasoning(text: str) -> str:
    return ENCRYPTED_PREFIX + base64.b64encode(text.encode()).decode()


def decrypt_reasoning(content: Any) -> str | None:
    if not isinstance(content, str) or not content.startswith(ENCRYPTED_PREFIX):
        return None
    try:
        return base64.b64decode(content[len(ENCRYPTED_PREFIX) :], validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        return None


def content_text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        parts = []
        for j, p in enumerate(content):
            kind = p.get("type") if isinstance(p, Mapping) else type(p).__name__
            if isinstance(p, Mapping) and kind == "refusal":
                parts.append(str(p.get("refusal", "")))
                continue
            if not isinstance(p, Mapping) or kind not in TEXT_PARTS:
                raise ProtocolError(
                    f"{where}[{j}]: content type {kind!r} is not supported (text only)", f"{where}[{j}]"
                )
            parts.append(str(p.get("text", "")))
        return "".join(parts)
    raise ProtocolError(f"{where} must be a string or a list of text parts", where)


def _reasoning_text(item: Mapping[str, Any], where: str) -> str:
    """The thinking a reasoning item carries: its reasoning_text parts, else what this server encoded."""
    content = item.get("content")
    text = content_text(content, f"{where}.content") if content else ""
    return text or decrypt_reasoning(item.get("encrypted_content")) or ""


def input_messages(items: Any) -> InputMessages:
    """`input` -> chat messages; consecutive function_call items become one assistant message with tool_calls."""
    if isinstance(items, str):
        return InputMessages([{"role": "user", "content": items}])
    if not isinstance(items, Sequence):
        raise ProtocolError("input must be a string or a list of items", "input")
    out: list[dict[str, Any]] = []
    ignored: list[str] = []
    thinking = ""  # from reasoning items, for the assistant turn that follows

    def assistant_turn(msg: dict[str, Any]) -> dict[str, Any]:
        nonlocal thinking
        if thinking:
            msg["reasoning_content"] = thinking
            thinking = ""
        return msg

    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, Mapping):
            raise ProtocolError(f"{where} must be an object", where)
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            role = item.get("role")
            if role not in ROLES:
                raise ProtocolError(f"{where}.role must be user, assistant, system or developer", f"{where}.role")
            msg = {
                "role": "system" if role == "developer" else role,
                "content": content_text(item.get("content"), f"{where}.content"),
            }
            if role == "assistant":
                msg = assistant_turn(msg)
            else:
                thinking = ""
            out.append(msg)
        elif kind == "function_call":
            name, call_id, ns = item.get("name"), item.get("call_id"), item.get("namespace")
            if not isinstance(name, str) or not isinstance(call_id, str):
                raise ProtocolError(f"{where} needs name and call_id", where)
            if isinstance(ns, str) and ns:
                name = exposed_name(ns, name)
            call = {
                "id": call_id,
                "type": "function",
                "function": {"name": name, "arguments": item.get("arguments") or "{}"},
            }
            if out and out[-1]["role"] == "assistant" and not thinking:  # the same turn: its text, then calls
                out[-1].setdefault("tool_calls", []).append(call)
            else:
                out.append(assistant_turn({"role": "assistant", "content": None, "tool_calls": [call]}))
        elif kind == "function_call_output":
            call_id = item.get("call_id")
            if not isinstance(call_id, str) or not call_id:
                raise ProtocolError(f"{where} needs call_id", f"{where}.call_id")
            output = item.get("output")
            text = output if isinstance(output, str) else content_text(output, f"{where}.output")
            out.append({"role": "tool", "tool_call_id": call_id, "content": text})
        elif kind == "reasoning":
            thinking += _reasoning_text(item, where)
        elif kind in HOSTED_ITEMS:
            ignored.append(str(kind))
        else:
            raise ProtocolError(
                f"{where}: item type {kind!r} is not supported (message, function_call, function_call_output, "
                "reasoning; hosted tools' items are left out)",
                f"{where}.type",
            )
    return InputMessages(out, ignored)


def merge_leading_system(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Instructions and the developer messages before the first turn, as the one system message most chat
    templates accept (many refuse a second one)."""
    lead = 0
    while lead < len(messages) and messages[lead]["role"] == "system":
        lead += 1
    if lead < 2:
        return messages
    merged = "\n\n".join(m["content"] for m in messages[:lead] if m["content"])
    return [{"role": "system", "content": merged}] + messages[lead:]
