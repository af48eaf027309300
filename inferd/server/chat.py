"""POST /v1/chat/completions: messages -> chat template -> tokens -> n choices; the full response or its stream."""

from __future__ import annotations

from typing import Any
from collections.abc import AsyncIterator

from aiohttp import web

from inferd.engine.request import Request
from inferd.server import protocol as P
from inferd.server.generation import (
    Choice,
    Generation,
    TextFrames,
    check_model,
    check_prompt_len,
    encode,
    limits,
    respond,
    resolve_max_tokens,
    sampling_params,
    sse_event,
    stop_token_ids,
    wants_usage,
)
from inferd.server.protocol import ProtocolError
from inferd.server.state import STATE, ServerState
from inferd.server.structured import ChatPrep, ChoiceTools, finish_reason, parse_message, prepare_chat


def render_chat(
    state: ServerState,
    messages: list[dict[str, Any]],
    add_generation_prompt: bool,
    tools: list[dict[str, Any]] | None = None,
) -> str:
    try:
        return state.chat_template.render(messages, add_generation_prompt=add_generation_prompt, tools=tools)
    except ValueError as e:  # ChatTemplateError: the template refused these messages
        raise ProtocolError(str(e), "messages") from None


def token_str(state: ServerState, token_id: int) -> str:
    return state.tokenizer.token_bytes(token_id, skip_special=False).decode("utf-8", errors="replace")


def chat_logprobs(
    state: ServerState, c: Choice, ids: list[int], lps: list[float], tops: list[list[tuple[int, float]]]
) -> P.ChatLogprobs:
    stop_ids = c.handle.request.stop_token_ids
    content = []
    for tok, lp, top in zip(ids, lps, tops):
        if tok in stop_ids:
            continue  # the end-of-turn token is not part of the answer
        content.append(
            P.TokenLogprob(
                token=token_str(state, tok),
                logprob=lp,
                bytes=list(state.tokenizer.token_bytes(tok, False)),
                top_logprobs=[
                    P.TopLogprob(token_str(state, t), l, list(state.tokenizer.token_bytes(t, False))) for t, l in top
                ],
            )
        )
    return P.ChatLogprobs(content)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    req = P.decode(await request.read(), P.ChatCompletionRequest)
    lim = limits(state)
    check_model(state, req.model)
    P.check_chat(req, lim)
    messages = P.check_messages(req.messages, lim)
    stops = P.stop_list(req.stop, lim)
    prep = await prepare_chat(state, req, messages, state.chat_template.source)
    text = render_chat(state, prep.messages, req.add_generation_prompt, prep.tools)
    prompt = await encode(state, text, add_special=False)  # the template wrote BOS itself if it wants one
    check_prompt_len(state, len(prompt), "messages")
    param = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
    requested = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    max_tokens = resolve_max_tokens(state, requested, len(prompt), None, param)
    logprobs = (req.top_logprobs or 0) if req.logprobs else None
    eos = stop_token_ids(state, req.ignore_eos)
    timeout = state.settings.request_timeout_s or None
    gen = Generation.submit(
        state,
        "chatcmpl",
        lambda rid: [
            (
                0,
                Request(
                    f"{rid}-{j}",
                    prompt,
                    sampling_params(req, state, logprobs, j),
                    max_tokens,
                    stops,
                    eos,
                    timeout_s=timeout,
                    speculative=req.speculative,
                    constraint=prep.constraint,
                    shown_special=prep.shown_special,
                ),
            )
            for j in range(req.n)
        ],
    )
    return await respond(
        request,
        gen,
        lambda: chat_full(gen, logprobs is not None, prep),
        chat_stream(gen, req, prep) if req.stream else None,
    )


def chat_full(gen: Generation, with_logprobs: bool, prep: ChatPrep) -> P.ChatCompletionResponse:
    choices = []
    for c in gen.choices:
        content, calls = parse_message(c.text, prep)
        choices.append(
            P.ChatChoice(
                c.index,
                P.ChatMessage("assistant", content, calls),
                chat_logprobs(gen.state, c, c.token_ids, c.logprobs, c.top_logprobs) if with_logprobs else None,
                finish_reason(c.finish_reason, bool(calls)),
            )
        )
    return P.ChatCompletionResponse(gen.rid, gen.created, gen.model, choices, gen.fingerprint, usage=gen.usage())


async def chat_stream(gen: Generation, req: P.ChatCompletionRequest, prep: ChatPrep) -> AsyncIterator[bytes | None]:
    """The stream's events, encoded: those of one output (its text, then its finish) in one piece."""

    def chunk(choices: list[P.ChatChunkChoice], usage: P.UsageInfo | None = None) -> P.ChatCompletionChunk:
        return P.ChatCompletionChunk(gen.rid, gen.created, gen.model, choices, gen.fingerprint, usage=usage)

    tools = {c.index: ChoiceTools(prep) for c in gen.choices} if prep.tool_format else {}
    text_frames = {
        c.index: TextFrames(chunk([P.ChatChunkChoice(c.index, P.Delta(content=TextFrames.MARK), None, None)]))
        for c in gen.choices
    }
    yield b"".join(
        sse_event(chunk([P.ChatChunkChoice(c.index, P.Delta(role="assistant", content=""), None, None)]))
        for c in gen.choices
    )
    async for item in gen.outputs(gen.state.settings.sse_keepalive_s):
        if item is None:
            yield None
            continue
        c, out = item
        events = b""
        lp = None
        if out.logprobs is not None and out.token_ids:
            lp = chat_logprobs(gen.state, c, out.token_ids, out.logprobs, out.top_logprobs or [[]] * len(out.logprobs))
        content, calls = out.text, None
        if c.index in tools:  # tool-call syntax becomes delta.tool_calls, never content
            content, deltas = tools[c.index].feed(out.text, final=out.finish_reason is not None)
            calls = deltas or None
        if content and calls is None and lp is None:  # the common case: text only
            events = text_frames[c.index](content)
        elif content or calls or (lp is not None and lp.content):
            events = sse_event(
                chunk(
                    [
                        P.ChatChunkChoice(
                            c.index, P.Delta(content=content or None if calls else content, tool_calls=calls), lp, None
                        )
                    ]
                )
            )
        if out.finish_reason is not None:
            has_calls = c.index in tools and tools[c.index].has_calls
            events += sse_event(
                chunk([P.ChatChunkChoice(c.index, P.Delta(), None, finish_reason(c.finish_reason, has_calls))])
            )
        if events:
            yield events
    if wants_usage(req):
        yield sse_event(chunk([], gen.usage()))
