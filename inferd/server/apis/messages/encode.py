"""The Messages API's encoder: the answer's deltas (thinking, text, tool calls, from the same parsers chat
completions use) -> Anthropic content blocks (`thinking`, `text`, `tool_use`), the `message` object, and for
`stream: true` Anthropic's named SSE events: message_start, then per block content_block_start / _delta / _stop
with the block's index, then message_delta (stop_reason, usage) and message_stop; `ping` while waiting.

Usage is Anthropic's: input_tokens are the prompt's tokens the prefix cache did not hold, cache_read_input_tokens
those it did (their sum is what count_tokens says)."""

from __future__ import annotations

import json
import secrets
import string
from collections.abc import AsyncIterator, Sequence
from typing import Any

from msgspec import Struct

from inferd.engine.request import Usage
from inferd.server.apis.messages.errors import error_body
from inferd.server.apis.openai_fields import count_tokens
from inferd.server.apis.messages.render import MessagesContext
from inferd.server.apis.messages.request import MessagesRequest
from inferd.server.choices import Choice, Generation
from inferd.server.generation import Rendered
from inferd.server.protocol import ProtocolError
from inferd.server.sse import SSE, TextFrames, sse_event
from inferd.server.structured import answer_parser
from inferd.text.parsing import ContentDelta, Delta, ReasoningDelta, ToolArgsDelta, ToolCallStart


def event(name: str, body: object) -> bytes:
    """One named SSE event, as Anthropic's streams have them (`event:` then `data:`)."""
    return b"event: " + name.encode() + b"\n" + sse_event(body)


PING = event("ping", {"type": "ping"})


def tool_use_id() -> str:
    alphabet = string.ascii_letters + string.digits
    return "toolu_" + "".join(secrets.choice(alphabet) for _ in range(24))


class OutputTokensDetails(Struct):
    thinking_tokens: int


class MessageUsage(Struct, omit_defaults=True):
    input_tokens: int
    output_tokens: int
    cache_creation_input_tokens: int
    cache_read_input_tokens: int
    output_tokens_details: OutputTokensDetails | None = None  # where the answer has thinking


def message_usage(usage: Usage, thinking_tokens: int = 0) -> MessageUsage:
    details = OutputTokensDetails(thinking_tokens) if thinking_tokens else None
    return MessageUsage(
        usage.prompt_tokens - usage.cached_tokens, usage.completion_tokens, 0, usage.cached_tokens, details
    )


class MessageResponse(Struct, kw_only=True):
    id: str
    type: str = "message"
    role: str = "assistant"
    model: str
    content: list[dict[str, Any]]
    stop_reason: str | None
    stop_sequence: str | None
    usage: MessageUsage


class BlockBuilder:
    """The answer's deltas -> content blocks, and the stream events that build them. A block is open until one of
    another kind starts. Whitespace that would open a text block waits for text: after another block it is that
    block's separator and is dropped (a model's newlines between its thinking and its calls make no block)."""

    def __init__(self) -> None:
        self.blocks: list[dict[str, Any]] = []
        self.args: dict[int, str] = {}  # a tool_use block's index -> its input so far (JSON text)
        self.calls: dict[int, int] = {}  # a tool call's index among the calls -> its block's index
        self.open: int | None = None
        self.pending = ""
        self.frames: dict[int, TextFrames] = {}  # a text block's index -> its text_delta event, pre-encoded

    @property
    def has_tool_use(self) -> bool:
        return bool(self.calls)

    @property
    def thinking(self) -> str:
        return "".join(b["thinking"] for b in self.blocks if b["type"] == "thinking")

    def add(self, d: Delta) -> bytes:
        if isinstance(d, ContentDelta):
            return self._text(d.text)
        self.pending = ""
        if isinstance(d, ReasoningDelta):
            if not d.text:
                return b""
            opened = self._open_type() == "thinking"
            out = b"" if opened else self._start({"type": "thinking", "thinking": "", "signature": ""})
            i = self._index()
            self.blocks[i]["thinking"] += d.text
            return out + self._delta(i, {"type": "thinking_delta", "thinking": d.text})
        if isinstance(d, ToolCallStart):
            out = self._start({"type": "tool_use", "id": tool_use_id(), "name": d.name, "input": {}})
            self.calls[d.index] = self._index()
            self.args[self._index()] = ""
            return out
        assert isinstance(d, ToolArgsDelta)
        i = self.calls[d.index]
        self.args[i] += d.text
        return self._delta(i, {"type": "input_json_delta", "partial_json": d.text})

    def finish(self) -> bytes:
        out = b""
        if not self.blocks and self.pending:  # an answer of nothing but whitespace is still the answer
            pending, self.pending = self.pending, ""
            out = self._text(pending, force=True)
        return out + self._close()

    def content(self) -> list[dict[str, Any]]:
        """The blocks as the message holds them: each tool_use's input parsed from the JSON the model wrote."""
        out = []
        for i, block in enumerate(self.blocks):
            if block["type"] == "tool_use":
                block = {**block, "input": tool_input(self.args[i])}
            out.append(block)
        return out

    def _text(self, text: str, force: bool = False) -> bytes:
        if not text:
            return b""
        out = b""
        if self._open_type() != "text":
            text, self.pending = self.pending + text, ""
            if not text.strip() and not force:
                self.pending = text
                return b""
            if self.blocks:  # the separator after a block (thinking, a call) is not the text's
                text = text.lstrip()
            out = self._start({"type": "text", "text": ""})
        i = self._index()
        self.blocks[i]["text"] += text
        frames = self.frames.get(i)
        if frames is None:
            mark = {"type": "content_block_delta", "index": i, "delta": {"type": "text_delta", "text": TextFrames.MARK}}
            frames = self.frames[i] = TextFrames(mark)
            frames.head = b"event: content_block_delta\n" + frames.head
        return out + frames(text)

    def _open_type(self) -> str | None:
        return None if self.open is None else self.blocks[self.open]["type"]

    def _index(self) -> int:
        assert self.open is not None
        return self.open

    def _start(self, block: dict[str, Any]) -> bytes:
        out = self._close()
        self.blocks.append(block)
        self.open = len(self.blocks) - 1
        start = {"type": "content_block_start", "index": self.open, "content_block": block}
        return out + event("content_block_start", start)

    def _delta(self, i: int, delta: dict[str, Any]) -> bytes:
        return event("content_block_delta", {"type": "content_block_delta", "index": i, "delta": delta})

    def _close(self) -> bytes:
        if self.open is None:
            return b""
        i, self.open = self.open, None
        return event("content_block_stop", {"type": "content_block_stop", "index": i})


def tool_input(arguments: str) -> dict[str, Any]:
    """A call's arguments as tool_use's `input` (an object); a model's unparsable arguments come back as the text
    they were, so nothing it wrote is lost."""
    try:
        value = json.loads(arguments) if arguments.strip() else {}
    except json.JSONDecodeError:
        return {"arguments": arguments}
    return value if isinstance(value, dict) else {"arguments": value}


class MessagesEncoder:
    content_type = SSE

    def __init__(self, gen: Generation, req: MessagesRequest, rendered: Rendered[MessagesContext]):
        self.gen, self.req, self.context = gen, req, rendered.context
        self.parser, _ = answer_parser(self.context.prep)
        self.blocks = BlockBuilder()

    @property
    def id(self) -> str:
        return "msg_" + self.gen.rid.partition("-")[2]

    def deltas(self, text: str, token_ids: Sequence[int], final: bool) -> list[Delta]:
        if self.parser is None:
            return [ContentDelta(text)]
        out = list(self.parser.feed(text, token_ids)) if text else []
        return out + list(self.parser.finish()) if final else out

    def stop_reason(self, c: Choice) -> tuple[str, str | None]:
        if c.finish_reason == "length":
            prompt_len = len(self.gen.prompt_ids[c.prompt_index])
            cut = len(c.token_ids) < self.context.max_tokens
            full = prompt_len + len(c.token_ids) >= self.gen.state.max_model_len
            return ("model_context_window_exceeded" if cut and full else "max_tokens"), None
        if self.blocks.has_tool_use:
            return "tool_use", None
        if c.stop_string is not None:
            return "stop_sequence", c.stop_string
        return "end_turn", None

    def usage(self) -> MessageUsage:
        """The request's usage, the thinking's tokens counted on its text (as chat completions count them)."""
        return message_usage(self.gen.usage(), count_tokens(self.gen.state.tokenizer, self.blocks.thinking))

    def message(self, content: list[dict[str, Any]], usage: MessageUsage, c: Choice | None) -> MessageResponse:
        reason, sequence = self.stop_reason(c) if c is not None else (None, None)
        return MessageResponse(
            id=self.id,
            model=self.gen.model,
            content=content,
            stop_reason=reason,
            stop_sequence=sequence,
            usage=usage,
        )

    def full(self) -> MessageResponse:
        c = self.gen.choices[0]
        for d in self.deltas(c.text, c.token_ids, final=True):
            self.blocks.add(d)
        self.blocks.finish()
        return self.message(self.blocks.content(), self.usage(), c)

    async def stream(self) -> AsyncIterator[bytes]:
        gen = self.gen
        start = self.message([], MessageUsage(len(gen.prompt_ids[0]), 0, 0, 0), None)
        yield event("message_start", {"type": "message_start", "message": start}) + PING
        async for item in gen.outputs(gen.state.settings.sse_keepalive_s):
            if item is None:
                yield PING
                continue
            c, out = item
            final = out.finish_reason is not None
            events = b"".join(self.blocks.add(d) for d in self.deltas(out.text, out.token_ids, final))
            if final:
                events += self.blocks.finish() + self.end(c)
            if events:
                yield events

    def end(self, c: Choice) -> bytes:
        reason, sequence = self.stop_reason(c)
        stop = {"stop_reason": reason, "stop_sequence": sequence}
        delta = {"type": "message_delta", "delta": stop, "usage": self.usage()}
        return event("message_delta", delta) + event("message_stop", {"type": "message_stop"})

    def stream_error(self, err: ProtocolError) -> bytes:
        return event("error", error_body(err))

    def stream_end(self) -> bytes:
        return b""
