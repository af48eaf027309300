"""Completions' encoder: choices -> text_completion (echoed prompt, legacy logprobs), or its stream (one
text_completion chunk per output, usage last)."""

from __future__ import annotations

from collections.abc import AsyncIterator

from msgspec import Struct

from inferd.server.apis.completions.request import CompletionRequest
from inferd.server.apis.openai_fields import UsageInfo, stream_error, token_str, usage_info, wants_usage
from inferd.server.choices import Choice, Generation
from inferd.server.generation import Rendered
from inferd.server.protocol import ProtocolError
from inferd.server.sse import DONE, PING, SSE, TextFrames
from inferd.text.tokenizer import Tokenizer

# (token, logprob, top) of one position; the first prompt token has neither (nothing predicts it)
Entry = tuple[int, float | None, list[tuple[int, float]] | None]


class CompletionLogprobs(Struct):
    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class CompletionChoice(Struct):
    index: int
    text: str
    logprobs: CompletionLogprobs | None
    finish_reason: str | None


class CompletionResponse(Struct):
    id: str
    created: int
    model: str
    choices: list[CompletionChoice]
    system_fingerprint: str
    object: str = "text_completion"
    usage: UsageInfo | None = None


class LegacyLogprobs:
    """Builds the completions endpoint's logprobs object incrementally (text_offset runs across chunks)."""

    def __init__(self, tokenizer: Tokenizer, offset: int = 0):
        self.tokenizer = tokenizer
        self.offset = offset

    def build(self, entries: list[Entry]) -> CompletionLogprobs:
        out = CompletionLogprobs([], [], [], [])
        for tok, lp, top in entries:
            s = token_str(self.tokenizer, tok)
            out.tokens.append(s)
            out.token_logprobs.append(lp)
            if top is None:
                out.top_logprobs.append(None)
            else:
                d = {token_str(self.tokenizer, t): l for t, l in top}
                if lp is not None:
                    d.setdefault(s, lp)
                out.top_logprobs.append(d)
            out.text_offset.append(self.offset)
            self.offset += len(s)
        return out


def generated_entries(ids: list[int], lps: list[float], tops: list[list[tuple[int, float]]] | None) -> list[Entry]:
    return [(t, lp, top) for t, lp, top in zip(ids, lps, tops or [[]] * len(lps))]


class CompletionsEncoder:
    content_type = SSE

    def __init__(self, gen: Generation, req: CompletionRequest, rendered: Rendered[list[str]]):
        self.gen, self.req, self.texts = gen, req, rendered.context
        self.want_lp = req.logprobs is not None

    def echo(self, c: Choice) -> tuple[str, list[Entry]]:
        """The prompt's text and, with logprobs, its entries (complete once the choice's prompt logprobs are)."""
        entries: list[Entry] = []
        if self.want_lp:
            prompt = self.gen.prompt_ids[c.prompt_index]
            entries = [(prompt[0], None, None)]
            entries += [(tok, lp, top) for tok, (lp, top) in zip(prompt[1:], c.prompt_logprobs)]
        return self.texts[c.prompt_index], entries

    def response(self, choices: list[CompletionChoice], usage: UsageInfo | None = None) -> CompletionResponse:
        gen = self.gen
        return CompletionResponse(gen.rid, gen.created, gen.model, choices, gen.fingerprint, usage=usage)

    def full(self) -> CompletionResponse:
        out = []
        for c in self.gen.choices:
            text, entries = self.echo(c) if self.req.echo else ("", [])
            entries += generated_entries(c.token_ids, c.logprobs, c.top_logprobs)
            # no entries: nothing was computed (max_tokens 0), and there are no logprobs to show
            lp = LegacyLogprobs(self.gen.state.tokenizer).build(entries) if self.want_lp and entries else None
            out.append(CompletionChoice(c.index, text + c.text, lp, c.finish_reason))
        return self.response(out, usage_info(self.gen.usage()))

    async def stream(self) -> AsyncIterator[bytes | CompletionResponse]:
        gen, want_lp = self.gen, self.want_lp
        builders = {c.index: LegacyLogprobs(gen.state.tokenizer) for c in gen.choices}
        text_frames = {
            c.index: TextFrames(self.response([CompletionChoice(c.index, TextFrames.MARK, None, None)]))
            for c in gen.choices
        }
        echoed: set[int] = set()
        async for item in gen.outputs(gen.state.settings.sse_keepalive_s):
            if item is None:
                yield PING
                continue
            c, out = item
            text, entries = "", list[Entry]()
            if self.req.echo and c.index not in echoed:
                # a choice's first output carries all its prompt logprobs: the prompt goes out once, complete
                echoed.add(c.index)
                text, entries = self.echo(c)
            text += out.text
            if want_lp and out.logprobs is not None:
                entries += generated_entries(out.token_ids, out.logprobs, out.top_logprobs)
            lp = builders[c.index].build(entries) if want_lp and entries else None
            if text and lp is None and c.finish_reason is None:  # the common case: text only
                yield text_frames[c.index](text)
            elif text or lp is not None or out.finish_reason is not None:
                yield self.response([CompletionChoice(c.index, text, lp, c.finish_reason)])
        if wants_usage(self.req):
            yield self.response([], usage_info(gen.usage()))

    def stream_error(self, err: ProtocolError) -> bytes:
        return stream_error(err)

    def stream_end(self) -> bytes:
        return DONE
