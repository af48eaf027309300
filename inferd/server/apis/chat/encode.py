"""Chat completions' encoder: choices -> chat.completion (tool calls parsed out of the text), or the stream of
chat.completion.chunk events (a role chunk, content or tool-call deltas, a finish chunk per choice, usage)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable

from msgspec import Struct

from inferd.server.apis.chat.request import ChatCompletionRequest
from inferd.server.apis.openai_fields import (
    UsageInfo,
    count_tokens,
    stream_error,
    token_str,
    usage_info,
    wants_usage,
)
from inferd.server.choices import Choice, Generation
from inferd.server.generation import Rendered
from inferd.server.protocol import ProtocolError
from inferd.server.sse import DONE, PING, SSE, TextFrames, sse_event
from inferd.server.structured import ChatPrep, answer_parser
from inferd.text.tokenizer import Tokenizer
from inferd.text.parsing import OutputParser, ReasoningDelta
from inferd.text.tools import ContentDelta, ToolArgsDelta, ToolCallStart


class TopLogprob(Struct):
    token: str
    logprob: float
    bytes: list[int]


class TokenLogprob(Struct):
    token: str
    logprob: float
    bytes: list[int]
    top_logprobs: list[TopLogprob]


class ChatLogprobs(Struct):
    content: list[TokenLogprob]


class FunctionCall(Struct):
    name: str
    arguments: str  # JSON text


class ToolCallInfo(Struct):
    id: str
    function: FunctionCall
    type: str = "function"


class ChatMessage(Struct, omit_defaults=True):
    role: str
    content: str | None
    tool_calls: list[ToolCallInfo] | None = None
    reasoning_content: str | None = None  # the thinking (vLLM's field; clients read either)
    reasoning: str | None = None  # the same, under vLLM's newer name


class ChatChoice(Struct):
    index: int
    message: ChatMessage
    logprobs: ChatLogprobs | None
    finish_reason: str | None


class ChatCompletionResponse(Struct):
    id: str
    created: int
    model: str
    choices: list[ChatChoice]
    system_fingerprint: str
    object: str = "chat.completion"
    usage: UsageInfo | None = None


class FunctionDelta(Struct, omit_defaults=True):
    name: str | None = None
    arguments: str | None = None


class ToolCallDelta(Struct, omit_defaults=True):
    """A streamed tool call: index, id, type and name in the first chunk, then argument fragments."""

    index: int
    id: str | None = None
    type: str | None = None
    function: FunctionDelta | None = None


class Delta(Struct, omit_defaults=True):
    role: str | None = None
    content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None


class ChatChunkChoice(Struct):
    index: int
    delta: Delta
    logprobs: ChatLogprobs | None
    finish_reason: str | None


class ChatCompletionChunk(Struct):
    id: str
    created: int
    model: str
    choices: list[ChatChunkChoice]
    system_fingerprint: str
    object: str = "chat.completion.chunk"
    usage: UsageInfo | None = None


# ---- pieces of a choice ------------------------------------------------------------------------------------


def chat_logprobs(
    tokenizer: Tokenizer,
    stop_ids: frozenset[int],
    ids: list[int],
    lps: list[float],
    tops: list[list[tuple[int, float]]],
) -> ChatLogprobs:
    content = []
    for tok, lp, top in zip(ids, lps, tops):
        if tok in stop_ids:
            continue  # the end-of-turn token is not part of the answer
        content.append(
            TokenLogprob(
                token=token_str(tokenizer, tok),
                logprob=lp,
                bytes=list(tokenizer.token_bytes(tok, False)),
                top_logprobs=[
                    TopLogprob(token_str(tokenizer, t), l, list(tokenizer.token_bytes(t, False))) for t, l in top
                ],
            )
        )
    return ChatLogprobs(content)


class ChoiceParser:
    """One choice's text -> its answer, its thinking and its tool calls in OpenAI's shape: the reasoning parser
    first (where the model thinks aloud), the tool-call parser behind its answer text (where tools were given)."""

    def __init__(self, prep: ChatPrep):
        parser, self.tools = answer_parser(prep)
        assert parser is not None, "a choice parser for a plan that parses nothing"
        self.parser: OutputParser = parser
        self.thinking = ""  # all of the choice's thinking so far

    @property
    def has_calls(self) -> bool:
        return self.tools is not None and bool(self.tools.calls)

    def feed(self, text: str, final: bool = False) -> tuple[str, str, list[ToolCallDelta]]:
        """(content, reasoning, tool-call deltas) that this piece of text decided."""
        events = list(self.parser.feed(text)) if text else []
        if final:
            events += self.parser.finish()
        content = reasoning = ""
        deltas: list[ToolCallDelta] = []
        for e in events:
            if isinstance(e, ContentDelta):
                content += e.text
            elif isinstance(e, ReasoningDelta):
                reasoning += e.text
            elif isinstance(e, ToolCallStart):
                deltas.append(ToolCallDelta(e.index, e.id, "function", FunctionDelta(name=e.name, arguments="")))
            elif isinstance(e, ToolArgsDelta):
                if deltas and deltas[-1].index == e.index and deltas[-1].function is not None:
                    f = deltas[-1].function
                    f.arguments = (f.arguments or "") + e.text
                else:
                    deltas.append(ToolCallDelta(e.index, function=FunctionDelta(arguments=e.text)))
        self.thinking += reasoning
        return content, reasoning, deltas

    def message(self, text: str) -> ChatMessage:
        """A whole answer as a message: content (None when the answer is only calls), calls, thinking."""
        content, reasoning, _ = self.feed(text, final=True)
        calls = [ToolCallInfo(c.id, FunctionCall(c.name, c.arguments)) for c in self.tools.calls] if self.tools else []
        answer = None if calls and not content.strip() else content
        thinking = reasoning or None
        return ChatMessage("assistant", answer, calls or None, reasoning_content=thinking, reasoning=thinking)


def finish_reason(reason: str | None, has_calls: bool) -> str | None:
    """OpenAI says "tool_calls" when the answer ended with calls."""
    return "tool_calls" if has_calls and reason == "stop" else reason


# ---- the encoder -------------------------------------------------------------------------------------------


class ChatEncoder:
    content_type = SSE

    def __init__(self, gen: Generation, req: ChatCompletionRequest, rendered: Rendered[ChatPrep]):
        self.gen, self.req, self.prep = gen, req, rendered.context
        self.tokenizer = gen.state.tokenizer

    def logprobs(self, ids: list[int], lps: list[float], tops: list[list[tuple[int, float]]]) -> ChatLogprobs:
        return chat_logprobs(self.tokenizer, self.gen.stop_token_ids, ids, lps, tops)

    def reasoning_tokens(self, parsers: Iterable[ChoiceParser]) -> int | None:
        """The choices' thinking in tokens, where the model thinks aloud."""
        if self.prep.reasoning is None:
            return None
        return sum(count_tokens(self.tokenizer, p.thinking) for p in parsers)

    def full(self) -> ChatCompletionResponse:
        gen = self.gen
        choices = []
        parsers = []
        for c in gen.choices:
            if self.prep.parses_answer:
                parsers.append(ChoiceParser(self.prep))
                message = parsers[-1].message(c.text)
            else:
                message = ChatMessage("assistant", c.text)
            choices.append(
                ChatChoice(
                    c.index,
                    message,
                    self.logprobs(c.token_ids, c.logprobs, c.top_logprobs) if self.req.logprobs else None,
                    finish_reason(c.finish_reason, bool(message.tool_calls)),
                )
            )
        usage = usage_info(gen.usage(), self.reasoning_tokens(parsers))
        return ChatCompletionResponse(gen.rid, gen.created, gen.model, choices, gen.fingerprint, usage=usage)

    def chunk(self, choices: list[ChatChunkChoice], usage: UsageInfo | None = None) -> ChatCompletionChunk:
        gen = self.gen
        return ChatCompletionChunk(gen.rid, gen.created, gen.model, choices, gen.fingerprint, usage=usage)

    async def stream(self) -> AsyncIterator[bytes]:
        """The stream's events, encoded: those of one output (its text, then its finish) in one piece."""
        gen, chunk = self.gen, self.chunk
        choices: list[Choice] = gen.choices
        parsers = {c.index: ChoiceParser(self.prep) for c in choices} if self.prep.parses_answer else {}
        text_frames = {
            c.index: TextFrames(chunk([ChatChunkChoice(c.index, Delta(content=TextFrames.MARK), None, None)]))
            for c in choices
        }
        yield b"".join(
            sse_event(chunk([ChatChunkChoice(c.index, Delta(role="assistant", content=""), None, None)]))
            for c in choices
        )
        async for item in gen.outputs(gen.state.settings.sse_keepalive_s):
            if item is None:
                yield PING
                continue
            c, out = item
            events = b""
            lp = None
            if out.logprobs is not None and out.token_ids:
                lp = self.logprobs(out.token_ids, out.logprobs, out.top_logprobs or [[]] * len(out.logprobs))
            content, thinking, calls = out.text, "", None
            if c.index in parsers:  # tool-call syntax and thinking never reach content
                content, thinking, deltas = parsers[c.index].feed(out.text, final=out.finish_reason is not None)
                calls = deltas or None
            if content and calls is None and not thinking and lp is None:  # the common case: text only
                events = text_frames[c.index](content)
            elif content or calls or thinking or (lp is not None and lp.content):
                delta = Delta(
                    content=content or None if calls or thinking else content,
                    tool_calls=calls,
                    reasoning_content=thinking or None,
                    reasoning=thinking or None,
                )
                events = sse_event(chunk([ChatChunkChoice(c.index, delta, lp, None)]))
            if out.finish_reason is not None:
                has_calls = c.index in parsers and parsers[c.index].has_calls
                reason = finish_reason(c.finish_reason, has_calls)
                events += sse_event(chunk([ChatChunkChoice(c.index, Delta(), None, reason)]))
            if events:
                yield events
        if wants_usage(self.req):
            yield sse_event(chunk([], usage_info(gen.usage(), self.reasoning_tokens(parsers.values()))))

    def stream_error(self, err: ProtocolError) -> bytes:
        return stream_error(err)

    def stream_end(self) -> bytes:
        return DONE
