"""POST /v1/completions: prompts (text or token ids) x n choices, with echo and legacy logprobs; the full
response or its stream."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from collections.abc import AsyncIterator

from aiohttp import web

from inferd.engine.request import Request
from inferd.server import protocol as P
from inferd.server.chat import token_str
from inferd.server.generation import (
    Choice,
    Generation,
    TextFrames,
    check_model,
    check_prompt_len,
    encode,
    json_response,
    limits,
    respond,
    resolve_max_tokens,
    sampling_params,
    sse_event,
    start_sse,
    stop_token_ids,
    wants_usage,
)
from inferd.server.protocol import ProtocolError
from inferd.server.state import STATE, ServerState
from inferd.server.structured import prepare_completion
from inferd.text.fim import FimUnsupported, fim_prompt_ids

# (token, logprob, top) of one position; the first prompt token has neither (nothing predicts it)
Entry = tuple[int, float | None, list[tuple[int, float]] | None]


class LegacyLogprobs:
    """Builds the completions endpoint's logprobs object incrementally (text_offset runs across chunks)."""

    def __init__(self, state: ServerState, offset: int = 0):
        self.state = state
        self.offset = offset

    def build(self, entries: list[Entry]) -> P.CompletionLogprobs:
        out = P.CompletionLogprobs([], [], [], [])
        for tok, lp, top in entries:
            s = token_str(self.state, tok)
            out.tokens.append(s)
            out.token_logprobs.append(lp)
            if top is None:
                out.top_logprobs.append(None)
            else:
                d = {token_str(self.state, t): l for t, l in top}
                if lp is not None:
                    d.setdefault(s, lp)
                out.top_logprobs.append(d)
            out.text_offset.append(self.offset)
            self.offset += len(s)
        return out


@dataclass
class Prompts:
    """The request's prompts as token ids and as the text echo returns."""

    ids: list[list[int]]
    texts: list[str]

    def echo(self, c: Choice, want_logprobs: bool) -> tuple[str, list[Entry]]:
        """The prompt's text and, with logprobs, its entries (complete once the choice's prompt logprobs are)."""
        prompt = self.ids[c.prompt_index]
        entries: list[Entry] = []
        if want_logprobs:
            entries = [(prompt[0], None, None)]
            entries += [(tok, lp, top) for tok, (lp, top) in zip(prompt[1:], c.prompt_logprobs)]
        return self.texts[c.prompt_index], entries


def generated_entries(ids: list[int], lps: list[float], tops: list[list[tuple[int, float]]] | None) -> list[Entry]:
    return [(t, lp, top) for t, lp, top in zip(ids, lps, tops or [[]] * len(lps))]


async def completions(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    req = P.decode(await request.read(), P.CompletionRequest)
    lim = limits(state)
    check_model(state, req.model)
    raw_prompts = P.check_completion(req, lim)
    stops = P.stop_list(req.stop, lim)
    prompts = Prompts([], [])
    for p in raw_prompts:
        if req.suffix is not None:  # fill in the middle: the code before the cursor, then after it
            try:
                ids = fim_prompt_ids(state.tokenizer, str(p), req.suffix)
            except FimUnsupported as e:
                raise ProtocolError(str(e), "suffix") from None
        else:
            ids = await encode(state, p, add_special=True) if isinstance(p, str) else p
        if not ids:
            raise ProtocolError("the prompt is empty (it has no tokens)", "prompt")
        check_prompt_len(state, len(ids), "prompt")
        prompts.ids.append(ids)
        prompts.texts.append(p if isinstance(p, str) else state.tokenizer.decode(p))
    max_tokens = min(resolve_max_tokens(state, req.max_tokens, len(p), 16) for p in prompts.ids)  # OpenAI's default
    prompt_lp = req.logprobs if req.echo and req.logprobs is not None else None
    if max_tokens == 0 and prompt_lp is None:  # nothing to compute: answer without touching the engine
        return await nothing_to_generate(request, state, req, prompts)
    eos = stop_token_ids(state, req.ignore_eos)
    timeout = state.settings.request_timeout_s or None
    constraint = await prepare_completion(state, req)
    gen = Generation.submit(
        state,
        "cmpl",
        lambda rid: [
            (
                i,
                Request(
                    f"{rid}-{i}-{j}",
                    p,
                    sampling_params(req, state, req.logprobs, j),
                    max_tokens,
                    stops,
                    eos,
                    prompt_logprobs=prompt_lp,
                    timeout_s=timeout,
                    speculative=req.speculative,
                    constraint=constraint,
                ),
            )
            for i, p in enumerate(prompts.ids)
            for j in range(req.n)
        ],
    )
    return await respond(
        request,
        gen,
        lambda: completions_full(gen, req, prompts),
        completions_stream(gen, req, prompts) if req.stream else None,
    )


def completions_full(gen: Generation, req: P.CompletionRequest, prompts: Prompts) -> P.CompletionResponse:
    want_lp = req.logprobs is not None
    out = []
    for c in gen.choices:
        text, entries = prompts.echo(c, want_lp) if req.echo else ("", [])
        lp = None
        if want_lp:
            entries += generated_entries(c.token_ids, c.logprobs, c.top_logprobs)
            lp = LegacyLogprobs(gen.state).build(entries)
        out.append(P.CompletionChoice(c.index, text + c.text, lp, c.finish_reason))
    return P.CompletionResponse(gen.rid, gen.created, gen.model, out, gen.fingerprint, usage=gen.usage())


async def completions_stream(
    gen: Generation, req: P.CompletionRequest, prompts: Prompts
) -> AsyncIterator[bytes | P.CompletionResponse | None]:
    want_lp = req.logprobs is not None
    builders = {c.index: LegacyLogprobs(gen.state) for c in gen.choices}
    text_frames = {
        c.index: TextFrames(
            P.CompletionResponse(
                gen.rid,
                gen.created,
                gen.model,
                [P.CompletionChoice(c.index, TextFrames.MARK, None, None)],
                gen.fingerprint,
            )
        )
        for c in gen.choices
    }
    echoed: set[int] = set()
    async for item in gen.outputs(gen.state.settings.sse_keepalive_s):
        if item is None:
            yield None
            continue
        c, out = item
        text, entries = "", list[Entry]()
        if req.echo and c.index not in echoed:
            # a choice's first output carries all its prompt logprobs: the prompt goes out once, complete
            echoed.add(c.index)
            text, entries = prompts.echo(c, want_lp)
        text += out.text
        if want_lp and out.logprobs is not None:
            entries += generated_entries(out.token_ids, out.logprobs, out.top_logprobs)
        lp = builders[c.index].build(entries) if want_lp and entries else None
        if text and lp is None and c.finish_reason is None:  # the common case: text only
            yield text_frames[c.index](text)
        elif text or lp is not None or out.finish_reason is not None:
            yield P.CompletionResponse(
                gen.rid,
                gen.created,
                gen.model,
                [P.CompletionChoice(c.index, text, lp, c.finish_reason)],
                gen.fingerprint,
            )
    if wants_usage(req):
        yield P.CompletionResponse(gen.rid, gen.created, gen.model, [], gen.fingerprint, usage=gen.usage())


async def nothing_to_generate(
    request: web.Request, state: ServerState, req: P.CompletionRequest, prompts: Prompts
) -> web.StreamResponse:
    """max_tokens 0 without echo logprobs: every choice is empty (or the echoed prompt) at once."""
    rid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
    model, fp = state.served_model_name, state.system_fingerprint
    usage = P.usage_info(sum(len(p) for p in prompts.ids), 0, 0)
    empty = [
        P.CompletionChoice(i * req.n + j, prompts.texts[i] if req.echo else "", None, "length")
        for i in range(len(prompts.ids))
        for j in range(req.n)
    ]
    if not req.stream:
        return json_response(P.CompletionResponse(rid, created, model, empty, fp, usage=usage))
    resp = await start_sse(request)
    for choice in empty:
        await resp.write(sse_event(P.CompletionResponse(rid, created, model, [choice], fp)))
    if wants_usage(req):
        await resp.write(sse_event(P.CompletionResponse(rid, created, model, [], fp, usage=usage)))
    await resp.write(b"data: [DONE]\n\n")
    return resp
