"""Ollama's answers: chat's `message` and generate's `response`, whole or as an NDJSON stream (one JSON object a
line, the last with done: true, why it ended and the timings in nanoseconds). Thinking goes to `thinking`, tool
calls to `message.tool_calls` with their arguments as an object, as Ollama writes them."""

from __future__ import annotations

import json
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from datetime import datetime, UTC
from typing import Any

import msgspec
from msgspec import Struct

from inferd.server.apis.chat.encode import ChoiceParser, TokenLogprob, chat_logprobs
from inferd.server.apis.ollama.render import Turn
from inferd.server.apis.ollama.request import OllamaError, OllamaRequest
from inferd.server.choices import Choice, Generation
from inferd.server.generation import Rendered
from inferd.server.protocol import ProtocolError
from inferd.server.sse import TextFrames

NDJSON = "application/x-ndjson"


def timestamp() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def ndjson(obj: object) -> bytes:
    return msgspec.json.encode(obj) + b"\n"


def ndjson_frames(template: object) -> TextFrames:
    """TextFrames around a line's text: the same JSON as the SSE event TextFrames frames, one newline after it."""
    frames = TextFrames(template)
    frames.head = frames.head.removeprefix(b"data: ")
    frames.tail = frames.tail.removesuffix(b"\n\n") + b"\n"
    return frames


class CallFunction(Struct):
    name: str
    arguments: Any  # an object, as Ollama writes it
    index: int


class OllamaToolCall(Struct):
    function: CallFunction
    id: str


class AssistantMessage(Struct, omit_defaults=True):
    role: str
    content: str
    thinking: str | None = None
    tool_calls: list[OllamaToolCall] | None = None


class Ending(Struct, omit_defaults=True, kw_only=True):
    """What the last line adds: why the answer ended, and its counts and durations (nanoseconds)."""

    done_reason: str | None = None
    total_duration: int | None = None
    load_duration: int | None = None
    prompt_eval_count: int | None = None
    prompt_eval_duration: int | None = None
    eval_count: int | None = None
    eval_duration: int | None = None


class ChatLine(Ending, omit_defaults=True, kw_only=True):
    model: str
    created_at: str
    message: AssistantMessage
    done: bool
    logprobs: list[TokenLogprob] | None = None


class GenerateLine(Ending, omit_defaults=True, kw_only=True):
    model: str
    created_at: str
    response: str
    done: bool
    thinking: str | None = None
    context: list[int] | None = None  # the prompt's and the answer's token ids: send it back to continue
    logprobs: list[TokenLogprob] | None = None


def ns(seconds: float) -> int:
    return max(int(seconds * 1e9), 0)


def end_line(line: Ending, gen: Generation, turn: Turn, reason: str) -> None:
    """`line`, made the last: why the answer ended and its timings (none for a load request, as Ollama's)."""
    line.done_reason = turn.load or reason
    if turn.load is not None:
        return
    usage = gen.usage()
    now = time.monotonic()
    prompt_s = eval_s = 0.0
    if gen.handles:
        h = gen.handles[0]
        end = h.finish_time or now
        first = h.first_token_time or end
        prompt_s, eval_s = first - h.arrival_time, end - first
    line.total_duration, line.load_duration = ns(now - turn.started), 0  # the model is loaded before serving
    line.prompt_eval_count, line.prompt_eval_duration = usage.prompt_tokens, ns(prompt_s)
    line.eval_count, line.eval_duration = usage.completion_tokens, ns(eval_s)


def tool_calls(parser: ChoiceParser | None, first: int = 0, final: bool = True) -> list[OllamaToolCall] | None:
    """The parsed calls from the `first` on, in Ollama's shape: all of them once the answer is `final`, else
    those that are complete (every call but the last begun)."""
    if parser is None or not parser.has_calls:
        return None
    assert parser.tools is not None  # has_calls
    calls = parser.tools.calls
    out = []
    for i, call in enumerate(calls[: len(calls) if final else len(calls) - 1][first:], first):
        try:
            args: Any = json.loads(call.arguments)
        except json.JSONDecodeError:  # cannot come out of a constrained call; kept as written otherwise
            args = call.arguments
        out.append(OllamaToolCall(CallFunction(call.name, args, i), call.id))
    return out or None


class OllamaEncoder(ABC):
    """What chat and generate share: parsing the answer, logprobs, the stream's pace and its last line. The two
    differ in their lines' shape (`line`, `last`)."""

    content_type = NDJSON

    def __init__(self, gen: Generation, req: OllamaRequest, rendered: Rendered[Turn]):
        self.gen, self.req, self.turn = gen, req, rendered.context
        self.created_at = timestamp()

    # ---- the two APIs' shapes -------------------------------------------------------------------------------

    @abstractmethod
    def line(
        self, content: str, thinking: str, calls: list[OllamaToolCall] | None, lp: list[TokenLogprob] | None
    ) -> ChatLine | GenerateLine:
        """One line of the answer: its text, thinking, whole tool calls, logprobs."""

    def last(self, line: ChatLine | GenerateLine, c: Choice) -> ChatLine | GenerateLine:
        """`line` as the answer's last: done, why, the timings."""
        line.done, line.created_at = True, timestamp()
        end_line(line, self.gen, self.turn, c.finish_reason or "stop")
        return line

    # ---- shared -------------------------------------------------------------------------------------------

    def parser(self) -> ChoiceParser | None:
        return ChoiceParser(self.turn.prep) if self.turn.prep.parses_answer else None

    def split(self, parser: ChoiceParser | None, text: str, final: bool) -> tuple[str, str]:
        if parser is None:
            return text, ""
        content, thinking, _ = parser.feed(text, final)
        return content, thinking if self.turn.show_thinking else ""

    def logprobs(self, ids: list[int], lps: list[float] | None, tops: Any) -> list[TokenLogprob] | None:
        if not self.req.logprobs or lps is None:
            return None
        return chat_logprobs(
            self.gen.state.tokenizer, self.gen.stop_token_ids, ids, lps, tops or [[]] * len(lps)
        ).content

    def full(self) -> Any:
        (c,) = self.gen.choices
        parser = self.parser()
        content, thinking = self.split(parser, c.text, final=True)
        line = self.line(content, thinking, tool_calls(parser), self.logprobs(c.token_ids, c.logprobs, c.top_logprobs))
        return self.last(line, c)

    async def stream(self) -> AsyncIterator[bytes]:
        gen = self.gen
        parser = self.parser()
        text_only = ndjson_frames(self.line(TextFrames.MARK, "", None, None))
        sent = 0  # tool calls sent: each goes out whole, once the next has begun or the answer has ended
        async for item in gen.outputs(gen.state.settings.sse_keepalive_s):
            if item is None:  # NDJSON has no keep-alive line; a client waits for the next object
                continue
            c, out = item
            final = out.finish_reason is not None
            content, thinking = self.split(parser, out.text, final)
            lp = self.logprobs(out.token_ids, out.logprobs, out.top_logprobs)
            events = b""
            if content and not thinking and lp is None:  # the common case: text only
                events = text_only(content)
            elif content or thinking or lp:
                events = ndjson(self.line(content, thinking, None, lp))
            calls = tool_calls(parser, sent, final)
            if calls:
                events += ndjson(self.line("", "", calls, None))
                sent += len(calls)
            if final:
                events += ndjson(self.last(self.line("", "", None, None), c))
            if events:
                yield events

    def stream_error(self, err: ProtocolError) -> bytes:
        return ndjson(OllamaError(err.message))

    def stream_end(self) -> bytes:
        return b""


class ChatEncoder(OllamaEncoder):
    def line(
        self, content: str, thinking: str, calls: list[OllamaToolCall] | None, lp: list[TokenLogprob] | None
    ) -> ChatLine:
        message = AssistantMessage("assistant", content, thinking or None, calls)
        return ChatLine(model=self.req.model_name, created_at=self.created_at, message=message, done=False, logprobs=lp)


class GenerateEncoder(OllamaEncoder):
    def line(
        self, content: str, thinking: str, calls: list[OllamaToolCall] | None, lp: list[TokenLogprob] | None
    ) -> GenerateLine:
        return GenerateLine(
            model=self.req.model_name,
            created_at=self.created_at,
            response=content,
            done=False,
            thinking=thinking or None,
            logprobs=lp,
        )

    def last(self, line: ChatLine | GenerateLine, c: Choice) -> ChatLine | GenerateLine:
        assert isinstance(line, GenerateLine)
        if self.turn.load is None:  # the conversation so far, to continue it with a later request's `context`
            line.context = self.gen.prompt_ids[c.prompt_index] + c.token_ids
        return super().last(line, c)
