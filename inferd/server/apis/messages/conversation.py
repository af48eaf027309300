"""An Anthropic conversation as the chat template's messages, the shape chat completions' checked messages have:
`system` becomes the system message; a user turn's `tool_result` blocks become `tool` messages (in their place
among its text); an assistant turn's `tool_use` blocks its tool_calls and its `thinking` blocks its
reasoning_content. Consecutive turns of one role are one turn, as Anthropic combines them (templates that want
roles to alternate then accept the conversation). A last assistant turn of text is a prefill: the answer
continues it."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from inferd.server.apis.messages.request import (
    Block,
    DocumentBlock,
    ImageBlock,
    MessageParam,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from inferd.server.protocol import ProtocolError

BLOCK_SEPARATOR = "\n\n"  # between the text blocks of a system prompt or a user turn, and between joined turns


@dataclass
class Conversation:
    messages: list[dict[str, Any]]
    prefill: str = ""  # the last assistant turn's text, which the answer continues


def unsupported(block: Block, where: str) -> ProtocolError:
    if isinstance(block, (ImageBlock, DocumentBlock)):
        kind = "image" if isinstance(block, ImageBlock) else "document"
        return ProtocolError(
            f"{where}: {kind} input is not supported by this server (text only): send the content as text", where
        )
    return ProtocolError(f"{where}: a {type_name(block)} block is not allowed here", where)


def type_name(block: Block) -> str:
    return str(type(block).__struct_config__.tag)


def system_text(system: str | list[TextBlock] | None) -> str | None:
    if system is None or isinstance(system, str):
        return system or None
    return BLOCK_SEPARATOR.join(b.text for b in system) or None


def result_text(block: ToolResultBlock, where: str) -> str:
    content = block.content
    if content is None or isinstance(content, str):
        text = content or ""
    else:
        parts = []
        for k, part in enumerate(content):
            if not isinstance(part, TextBlock):
                raise unsupported(part, f"{where}.content.{k}")
            parts.append(part.text)
        text = "".join(parts)
    # the template has no field for a failed call: the model reads it in the result
    return f"Error: {text}" if block.is_error else text


def user_messages(blocks: Sequence[Block], where: str) -> list[dict[str, Any]]:
    """A user turn's blocks, in order: runs of text as user messages, each tool_result as a tool message."""
    out: list[dict[str, Any]] = []
    texts: list[str] = []
    for k, b in enumerate(blocks):
        if isinstance(b, TextBlock):
            texts.append(b.text)
        elif isinstance(b, ToolResultBlock):
            if texts:
                out.append({"role": "user", "content": BLOCK_SEPARATOR.join(texts)})
                texts = []
            out.append({"role": "tool", "tool_call_id": b.tool_use_id, "content": result_text(b, f"{where}.{k}")})
        else:
            raise unsupported(b, f"{where}.{k}")
    if texts:
        out.append({"role": "user", "content": BLOCK_SEPARATOR.join(texts)})
    return out


def assistant_message(blocks: Sequence[Block], where: str) -> dict[str, Any]:
    texts: list[str] = []
    thinking: list[str] = []
    calls: list[dict[str, Any]] = []
    for k, b in enumerate(blocks):
        if isinstance(b, TextBlock):
            texts.append(b.text)
        elif isinstance(b, ThinkingBlock):
            thinking.append(b.thinking)
        elif isinstance(b, RedactedThinkingBlock):
            continue  # encrypted by Anthropic: nothing a local model could read
        elif isinstance(b, ToolUseBlock):
            arguments = json.dumps(b.input, ensure_ascii=False)
            calls.append({"id": b.id, "type": "function", "function": {"name": b.name, "arguments": arguments}})
        else:
            raise unsupported(b, f"{where}.{k}")
    msg: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
    if calls:
        msg["tool_calls"] = calls
    if thinking:
        msg["reasoning_content"] = "\n".join(thinking)
    return msg


def append_turn(out: list[dict[str, Any]], msg: dict[str, Any]) -> None:
    """`msg` after the conversation so far, joined to the last message when both are of one role (tool results
    stay apart: each answers its own call)."""
    last = out[-1] if out else None
    if last is None or last["role"] != msg["role"] or msg["role"] not in ("user", "assistant"):
        out.append(msg)
        return
    texts = [t for t in (last["content"], msg["content"]) if t]
    last["content"] = BLOCK_SEPARATOR.join(texts)
    if msg.get("tool_calls"):
        last["tool_calls"] = last.get("tool_calls", []) + msg["tool_calls"]
    if msg.get("reasoning_content"):
        thinking = [t for t in (last.get("reasoning_content"), msg["reasoning_content"]) if t]
        last["reasoning_content"] = "\n".join(thinking)


def conversation(system: str | list[TextBlock] | None, messages: Sequence[MessageParam]) -> Conversation:
    out: list[dict[str, Any]] = []
    text = system_text(system)
    if text is not None:
        out.append({"role": "system", "content": text})
    for i, m in enumerate(messages):
        where = f"messages.{i}.content"
        blocks: Sequence[Block] = [TextBlock(m.content)] if isinstance(m.content, str) else m.content
        if not blocks:
            raise ProtocolError(f"{where}: a message needs at least one content block", where)
        for msg in user_messages(blocks, where) if m.role == "user" else [assistant_message(blocks, where)]:
            append_turn(out, msg)
    prefill = ""
    last = out[-1]
    if last["role"] == "assistant":
        if last.get("tool_calls"):
            raise ProtocolError(
                "messages: the last message holds tool_use blocks; send their tool_result blocks in a user message",
                "messages",
            )
        prefill = last["content"]
        out.pop()
    if not any(m["role"] in ("user", "tool") for m in out):
        raise ProtocolError("messages: the conversation needs a user message", "messages")
    return Conversation(out, prefill)
