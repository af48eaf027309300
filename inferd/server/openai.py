"""OpenAI-compatible endpoints: completions, chat completions (streaming and not), models, tokenize,
detokenize and cache warm.

The handlers do all the text work (templates, tokenizing, JSON) on the event loop side; the scheduler
thread only ever sees token ids. A request with n choices (or several prompts) becomes one scheduler
request per choice, merged back into one response or one SSE stream here.
"""

from __future__ import annotations

import asyncio
import logging
import time
import unicodedata
import uuid
from dataclasses import dataclass, field
from typing import AsyncIterator

import msgspec
from aiohttp import web

from inferd.engine.engine import SamplingParams
from inferd.engine.request import FinishReason, Request, RequestOutput
from inferd.engine.scheduler import QueueFull, RequestHandle, SchedulerStopped
from inferd.server import protocol as P
from inferd.server.protocol import ProtocolError
from inferd.server.state import STATE, ServerState

log = logging.getLogger("inferd.server")

WARM_SENTINEL = "\ue000inferd-warm\ue001"   # private-use characters no real message contains


# ---- small helpers ----------------------------------------------------------------------------------------

def json_response(obj, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(body=msgspec.json.encode(obj), status=status, content_type="application/json",
                        headers=headers)


def error_response(e: ProtocolError) -> web.Response:
    return json_response(e.body(), status=e.status, headers=e.headers)


async def read_request(request: web.Request, type_):
    return P.decode(await request.read(), type_)


def limits(state: ServerState) -> P.Limits:
    return P.Limits(vocab_size=state.tokenizer.vocab_size, max_n=state.settings.max_n,
                    max_messages=state.settings.max_messages)


def check_model(state: ServerState, name: str | None) -> None:
    if name is not None and name not in state.model_names():
        raise ProtocolError(f"The model `{name}` does not exist; this server serves `{state.served_model_name}`",
                            "model", status=404, code="model_not_found")


async def encode(state: ServerState, text: str, add_special: bool) -> list[int]:
    # Long texts are tokenized off the loop so a huge prompt cannot stall every other stream.
    if len(text) < 20_000:
        return state.tokenizer.encode(text, add_special=add_special)
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(None, lambda: state.tokenizer.encode(text, add_special=add_special))


def render_chat(state: ServerState, messages: list[dict[str, str]], add_generation_prompt: bool) -> str:
    try:
        return state.chat_template.render(messages, add_generation_prompt=add_generation_prompt)
    except ValueError as e:   # ChatTemplateError: the template refused these messages
        raise ProtocolError(str(e), "messages") from None


def check_prompt_len(state: ServerState, n: int, param: str) -> None:
    cap = min(state.settings.max_prompt_tokens or state.max_model_len, state.max_model_len)
    if n > cap:
        raise ProtocolError(f"the prompt has {n} tokens; this server accepts at most {cap}", param,
                            code="context_length_exceeded")


def resolve_max_tokens(state: ServerState, requested: int | None, prompt_len: int, default: int | None,
                       param: str = "max_tokens") -> int:
    room = state.max_model_len - prompt_len
    cap = state.settings.max_tokens_limit or state.max_model_len
    if requested is None:
        if room <= 0:
            raise ProtocolError(f"This model's maximum context length is {state.max_model_len} tokens and the "
                                f"prompt already has {prompt_len}", "messages", code="context_length_exceeded")
        return min(room, cap, default if default is not None else room)
    if requested > cap:
        raise ProtocolError(f"{param} must be at most {cap}, got {requested}", param)
    if requested > room:
        raise ProtocolError(f"This model's maximum context length is {state.max_model_len} tokens. However, you "
                            f"requested {prompt_len + requested} tokens ({prompt_len} in the prompt, {requested} "
                            f"for the completion). Please reduce the prompt or {param}.", param,
                            code="context_length_exceeded")
    return requested


def sampling_params(req: P._SamplingRequest, state: ServerState, logprobs: int | None, choice: int) -> SamplingParams:
    seed = req.seed + choice if req.seed is not None and choice else req.seed   # n choices must differ
    params = SamplingParams(
        temperature=1.0 if req.temperature is None else req.temperature,
        top_k=0 if req.top_k is None or req.top_k < 0 else req.top_k,
        top_p=1.0 if req.top_p is None else req.top_p,
        min_p=0.0 if req.min_p is None else req.min_p,
        repetition_penalty=1.0 if req.repetition_penalty is None else req.repetition_penalty,
        presence_penalty=req.presence_penalty or 0.0,
        frequency_penalty=req.frequency_penalty or 0.0,
        logit_bias=P.logit_bias_ids(req.logit_bias, limits(state)),
        seed=seed, logprobs=logprobs)
    try:
        params.validate()
    except ValueError as e:
        raise ProtocolError(str(e), str(e).split(" ", 1)[0]) from None
    return params


def submit_all(state: ServerState, requests: list[Request]) -> list[RequestHandle]:
    handles: list[RequestHandle] = []
    try:
        for r in requests:
            handles.append(state.scheduler.submit(r))
    except QueueFull as e:
        for h in handles:
            h.abort()
        raise ProtocolError(f"the server is busy ({e}); retry shortly", status=503, code="queue_full",
                            headers={"Retry-After": "1"}) from None
    except SchedulerStopped as e:
        for h in handles:
            h.abort()
        raise ProtocolError(f"the server is not accepting requests: {e}", status=503,
                            headers={"Retry-After": "5"}) from None
    return handles


def output_error(out: RequestOutput) -> ProtocolError | None:
    if out.finish_reason == FinishReason.ERROR:
        return ProtocolError(out.error_message or "internal error", status=out.error_status or 500)
    if out.finish_reason == FinishReason.ABORT:
        return ProtocolError(out.error_message or "the request was aborted", status=503,
                             headers={"Retry-After": "5"})
    return None


def token_str(state: ServerState, token_id: int) -> str:
    return state.tokenizer.token_bytes(token_id, skip_special=False).decode("utf-8", errors="replace")


@dataclass
class Choice:
    """One choice's accumulated output."""
    handle: RequestHandle
    index: int
    prompt_index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    prompt_logprobs: list = field(default_factory=list)
    finish_reason: str | None = None
    usage: object = None

    def add(self, out: RequestOutput) -> None:
        self.text += out.text
        self.token_ids += out.token_ids
        if out.logprobs is not None:
            self.logprobs += out.logprobs
            self.top_logprobs += out.top_logprobs or [[] for _ in out.logprobs]
        if out.prompt_logprobs:
            self.prompt_logprobs += out.prompt_logprobs
        if out.usage is not None:
            self.usage = out.usage
        if out.finish_reason is not None:
            self.finish_reason = out.finish_reason.value


def total_usage(choices: list[Choice]) -> P.UsageInfo:
    """Prompt tokens count once per prompt (not once per choice); completion tokens for every choice."""
    per_prompt = {}
    completion = 0
    for c in choices:
        if c.usage is not None:
            per_prompt[c.prompt_index] = c.usage
            completion += c.usage.completion_tokens
    prompt = sum(u.prompt_tokens for u in per_prompt.values())
    cached = sum(u.cached_tokens for u in per_prompt.values())
    return P.usage_info(prompt, completion, cached)


async def merged_outputs(handles: list[RequestHandle], keepalive_s: float
                         ) -> AsyncIterator[tuple[int, RequestOutput] | None]:
    """Outputs of several requests as they arrive; None when `keepalive_s` passed without any."""
    if len(handles) == 1 and hasattr(asyncio, "timeout"):
        # The common case (one prompt, n = 1) waits on its queue directly: no task and no asyncio.wait per token,
        # which cost twice the event loop's time that writing the token out does (profiled at c = 8).
        handle, queue = handles[0], handles[0].state.queue
        while not handle.done:
            if queue.empty():
                try:
                    async with asyncio.timeout(keepalive_s):
                        out = await queue.get()
                except TimeoutError:
                    yield None
                    continue
            else:
                out = queue.get_nowait()
            handle.done = out.finish_reason is not None
            yield 0, out
        return
    tasks = {asyncio.ensure_future(h.state.queue.get()): i for i, h in enumerate(handles) if not h.done}
    try:
        while tasks:
            done, _ = await asyncio.wait(tasks, timeout=keepalive_s, return_when=asyncio.FIRST_COMPLETED)
            if not done:
                yield None
                continue
            for t in sorted(done, key=tasks.__getitem__):
                i = tasks.pop(t)
                out = t.result()
                if out.finish_reason is None:
                    tasks[asyncio.ensure_future(handles[i].state.queue.get())] = i
                else:
                    handles[i].done = True
                yield i, out
    finally:
        for t in tasks:
            t.cancel()


def log_request(state: ServerState, rid: str, choices: list[Choice], status: str) -> None:
    if not state.settings.log_requests:
        return
    usage = total_usage(choices)
    firsts = [c.handle.state.first_token_time for c in choices if c.handle.state.first_token_time]
    arrival = min(c.handle.state.arrival_time for c in choices)
    ttft = (min(firsts) - arrival) if firsts else None
    end = max((c.handle.state.finish_time or time.monotonic()) for c in choices)
    gen_time = end - min(firsts) if firsts else 0.0
    tps = usage.completion_tokens / gen_time if gen_time > 0 else 0.0
    log.info("%s %s prompt=%d cached=%d completion=%d ttft=%s tok/s=%.1f", rid, status, usage.prompt_tokens,
             usage.prompt_tokens_details.cached_tokens, usage.completion_tokens,
             f"{ttft:.3f}s" if ttft is not None else "-", tps)


# ---- SSE ---------------------------------------------------------------------------------------------------

async def start_sse(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                       "X-Accel-Buffering": "no"})
    await resp.prepare(request)
    return resp


async def send_event(resp: web.StreamResponse, obj) -> None:
    await resp.write(b"data: " + msgspec.json.encode(obj) + b"\n\n")


async def run_choices(request: web.Request, state: ServerState, rid: str, choices: list[Choice], stream_fn,
                      final_fn):
    """Drive the choices to completion; abort them all if the client goes away or anything fails."""
    try:
        if stream_fn is None:
            async for item in merged_outputs([c.handle for c in choices], 3600.0):
                if item is None:
                    continue
                i, out = item
                err = output_error(out)
                if err is not None:
                    raise err
                choices[i].add(out)
            log_request(state, rid, choices, "ok")
            return final_fn()
        return await stream_fn()
    except (asyncio.CancelledError, ConnectionResetError):
        state.metrics.on_client_disconnected()
        log_request(state, rid, choices, "client disconnected")
        raise
    except ProtocolError as e:
        log_request(state, rid, choices, f"error {e.status}")
        raise
    finally:
        for c in choices:
            c.handle.abort()   # no-op for finished ones; frees the blocks of the rest at the next step


async def stream_events(request: web.Request, state: ServerState, rid: str, choices: list[Choice],
                        on_output, on_start=None, on_end=None) -> web.StreamResponse:
    """The SSE loop shared by both endpoints: pings while waiting, an error event if a request fails."""
    resp = await start_sse(request)
    if on_start is not None:
        for c in choices:
            await on_start(resp, c)
    async for item in merged_outputs([c.handle for c in choices], state.settings.sse_keepalive_s):
        if item is None:
            await resp.write(b": ping\n\n")
            continue
        i, out = item
        err = output_error(out)
        if err is not None:
            await send_event(resp, err.body())
            await resp.write(b"data: [DONE]\n\n")
            log_request(state, rid, choices, f"error {err.status} (streamed)")
            return resp
        choices[i].add(out)
        await on_output(resp, choices[i], out)
    if on_end is not None:
        await on_end(resp)
    await resp.write(b"data: [DONE]\n\n")
    log_request(state, rid, choices, "ok")
    return resp


# ---- /v1/chat/completions -------------------------------------------------------------------------------

def chat_logprobs(state: ServerState, c: Choice, ids: list[int], lps: list[float], tops) -> P.ChatLogprobs:
    stop_ids = c.handle.state.request.stop_token_ids
    content = []
    for tok, lp, top in zip(ids, lps, tops):
        if tok in stop_ids:
            continue   # the end-of-turn token is not part of the answer
        content.append(P.TokenLogprob(
            token=token_str(state, tok), logprob=lp, bytes=list(state.tokenizer.token_bytes(tok, False)),
            top_logprobs=[P.TopLogprob(token_str(state, t), l, list(state.tokenizer.token_bytes(t, False)))
                          for t, l in top]))
    return P.ChatLogprobs(content)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    req = await read_request(request, P.ChatCompletionRequest)
    lim = limits(state)
    check_model(state, req.model)
    P.check_chat(req, lim)
    messages = P.check_messages(req.messages, lim)
    stops = P.stop_list(req.stop, lim)
    text = render_chat(state, messages, req.add_generation_prompt)
    prompt = await encode(state, text, add_special=False)   # the template wrote BOS itself if it wants one
    check_prompt_len(state, len(prompt), "messages")
    requested = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    max_tokens = resolve_max_tokens(state, requested, len(prompt), None,
                                    "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens")
    logprobs = (req.top_logprobs or 0) if req.logprobs else None
    rid = f"chatcmpl-{uuid.uuid4().hex}"
    stop_ids = frozenset() if req.ignore_eos else frozenset(state.tokenizer.eos_ids)
    timeout = state.settings.request_timeout_s or None
    reqs = [Request(f"{rid}-{j}", prompt, sampling_params(req, state, logprobs, j), max_tokens, stops, stop_ids,
                    timeout_s=timeout, speculative=req.speculative) for j in range(req.n)]
    choices = [Choice(h, j, 0) for j, h in enumerate(submit_all(state, reqs))]
    created = int(time.time())
    model = state.served_model_name
    fp = state.system_fingerprint

    def chunk(choice_list, usage=None):
        return P.ChatCompletionChunk(rid, created, model, choice_list, fp, usage=usage)

    async def on_start(resp, c):
        await send_event(resp, chunk([P.ChatChunkChoice(c.index, P.Delta(role="assistant", content=""), None, None)]))

    async def on_output(resp, c, out):
        lp = None
        if out.logprobs is not None and out.token_ids:
            lp = chat_logprobs(state, c, out.token_ids, out.logprobs, out.top_logprobs or [[]] * len(out.logprobs))
        if out.text or (lp is not None and lp.content):
            await send_event(resp, chunk([P.ChatChunkChoice(c.index, P.Delta(content=out.text), lp, None)]))
        if out.finish_reason is not None:
            await send_event(resp, chunk([P.ChatChunkChoice(c.index, P.Delta(), None, c.finish_reason)]))

    async def on_end(resp):
        if req.stream_options is not None and req.stream_options.include_usage:
            await send_event(resp, chunk([], total_usage(choices)))

    def final():
        return json_response(P.ChatCompletionResponse(rid, created, model, [
            P.ChatChoice(c.index, P.ChatMessage("assistant", c.text),
                         chat_logprobs(state, c, c.token_ids, c.logprobs, c.top_logprobs) if logprobs is not None
                         else None, c.finish_reason) for c in choices], fp, usage=total_usage(choices)))

    stream = (lambda: stream_events(request, state, rid, choices, on_output, on_start, on_end)) if req.stream else None
    return await run_choices(request, state, rid, choices, stream, final)


# ---- /v1/completions --------------------------------------------------------------------------------------

class LegacyLogprobs:
    """Builds the completions endpoint's logprobs object incrementally (text_offset runs across chunks)."""

    def __init__(self, state: ServerState, offset: int = 0):
        self.state = state
        self.offset = offset

    def build(self, entries: list[tuple[int, float | None, list[tuple[int, float]] | None]]) -> P.CompletionLogprobs:
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


def prompt_entries(prompt: list[int], prompt_logprobs) -> list:
    """(token, logprob, top) for every prompt token; the first has no logprob (nothing predicts it)."""
    entries = [(prompt[0], None, None)]
    for tok, (lp, top) in zip(prompt[1:], prompt_logprobs):
        entries.append((tok, lp, top))
    return entries


async def completions(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    req = await read_request(request, P.CompletionRequest)
    lim = limits(state)
    check_model(state, req.model)
    raw_prompts = P.check_completion(req, lim)
    stops = P.stop_list(req.stop, lim)
    prompts: list[list[int]] = []
    prompt_texts: list[str] = []
    for p in raw_prompts:
        ids = await encode(state, p, add_special=True) if isinstance(p, str) else p
        if not ids:
            raise ProtocolError("the prompt is empty (it has no tokens)", "prompt")
        check_prompt_len(state, len(ids), "prompt")
        prompts.append(ids)
        prompt_texts.append(p if isinstance(p, str) else state.tokenizer.decode(p))
    max_tokens = min(resolve_max_tokens(state, req.max_tokens, len(p), 16) for p in prompts)   # OpenAI's default
    want_lp = req.logprobs
    prompt_lp = want_lp if req.echo and want_lp is not None else None
    rid = f"cmpl-{uuid.uuid4().hex}"
    stop_ids = frozenset() if req.ignore_eos else frozenset(state.tokenizer.eos_ids)
    timeout = state.settings.request_timeout_s or None
    created = int(time.time())
    model, fp = state.served_model_name, state.system_fingerprint

    if max_tokens == 0 and prompt_lp is None:   # nothing to compute: answer without touching the engine
        usage = P.usage_info(sum(len(p) for p in prompts), 0, 0)
        empty = [P.CompletionChoice(i * req.n + j, prompt_texts[i] if req.echo else "", None, "length")
                 for i in range(len(prompts)) for j in range(req.n)]
        if not req.stream:
            return json_response(P.CompletionResponse(rid, created, model, empty, fp, usage=usage))
        resp = await start_sse(request)
        for choice in empty:
            await send_event(resp, P.CompletionResponse(rid, created, model, [choice], fp))
        if req.stream_options is not None and req.stream_options.include_usage:
            await send_event(resp, P.CompletionResponse(rid, created, model, [], fp, usage=usage))
        await resp.write(b"data: [DONE]\n\n")
        return resp

    reqs = [Request(f"{rid}-{i}-{j}", p, sampling_params(req, state, want_lp, j), max_tokens, stops, stop_ids,
                    prompt_logprobs=prompt_lp, timeout_s=timeout, speculative=req.speculative)
            for i, p in enumerate(prompts) for j in range(req.n)]
    handles = submit_all(state, reqs)
    choices = [Choice(h, k, k // req.n) for k, h in enumerate(handles)]
    builders = {c.index: LegacyLogprobs(state) for c in choices}

    def gen_entries(ids, lps, tops):
        return [(t, lp, top) for t, lp, top in zip(ids, lps, tops or [[]] * len(lps))]

    def echo_part(c: Choice, prompt_logprobs) -> tuple[str, list]:
        if not req.echo:
            return "", []
        entries = prompt_entries(prompts[c.prompt_index], prompt_logprobs) if want_lp is not None else []
        return prompt_texts[c.prompt_index], entries

    def chunk(c: Choice, text: str, lp, finish):
        return P.CompletionResponse(rid, created, model, [P.CompletionChoice(c.index, text, lp, finish)], fp)

    echoed: set[int] = set()

    async def on_output(resp, c, out):
        text, entries = "", []
        if req.echo and c.index not in echoed:
            # a choice's first output carries all its prompt logprobs: the prompt goes out once, complete
            echoed.add(c.index)
            text, entries = echo_part(c, c.prompt_logprobs)
        text += out.text
        if want_lp is not None and out.logprobs is not None:
            entries += gen_entries(out.token_ids, out.logprobs, out.top_logprobs)
        lp = builders[c.index].build(entries) if want_lp is not None and entries else None
        if text or lp is not None or out.finish_reason is not None:
            await send_event(resp, chunk(c, text, lp, c.finish_reason))

    async def on_end(resp):
        if req.stream_options is not None and req.stream_options.include_usage:
            await send_event(resp, P.CompletionResponse(rid, created, model, [], fp, usage=total_usage(choices)))

    def final():
        out = []
        for c in choices:
            text, entries = echo_part(c, c.prompt_logprobs)
            lp = None
            if want_lp is not None:
                entries += gen_entries(c.token_ids, c.logprobs, c.top_logprobs)
                lp = LegacyLogprobs(state).build(entries)
            out.append(P.CompletionChoice(c.index, text + c.text, lp, c.finish_reason))
        return json_response(P.CompletionResponse(rid, created, model, out, fp, usage=total_usage(choices)))

    stream = (lambda: stream_events(request, state, rid, choices, on_output, None, on_end)) if req.stream else None
    return await run_choices(request, state, rid, choices, stream, final)


# ---- models, tokenize, detokenize, cache warm ---------------------------------------------------------------

def model_card(state: ServerState) -> P.ModelCard:
    return P.ModelCard(state.served_model_name, state.created, "inferd", state.max_model_len)


async def list_models(request: web.Request) -> web.Response:
    state = request.app[STATE]
    cards = [msgspec.to_builtins(model_card(state))] if state.model is not None else []
    return json_response({"object": "list", "data": cards + [e.card() for e in state.embeddings]})


async def get_model(request: web.Request) -> web.Response:
    state = request.app[STATE]
    name = request.match_info["model"]
    for e in state.embeddings:
        if e.name == name:
            return json_response(e.card())
    if state.model is None or name not in state.model_names():
        raise ProtocolError(f"The model `{name}` does not exist", "model", status=404, code="model_not_found")
    return json_response(model_card(state))


async def tokenize(request: web.Request) -> web.Response:
    state = request.app[STATE]
    req = await read_request(request, P.TokenizeRequest)
    check_model(state, req.model)
    if (req.prompt is None) == (req.messages is None):
        raise ProtocolError("send exactly one of prompt or messages", "prompt")
    if req.messages is not None:
        text = render_chat(state, P.check_messages(req.messages, limits(state)), req.add_generation_prompt)
        ids = await encode(state, text, add_special=False)
    else:
        ids = await encode(state, req.prompt, add_special=req.add_special_tokens)
    return json_response(P.TokenizeResponse(len(ids), state.max_model_len, ids))


async def detokenize(request: web.Request) -> web.Response:
    state = request.app[STATE]
    req = await read_request(request, P.DetokenizeRequest)
    check_model(state, req.model)
    vocab = state.tokenizer.vocab_size
    bad = next((t for t in req.tokens if t >= vocab), None)
    if bad is not None:
        raise ProtocolError(f"token id {bad} is outside the vocabulary [0, {vocab})", "tokens")
    return json_response(P.DetokenizeResponse(state.tokenizer.decode(req.tokens)))


def _ends_at_boundary(text: str) -> bool:
    return bool(text) and unicodedata.category(text[-1]).startswith("P")


def stable_prefix(state: ServerState, text: str, ids: list[int], add_special: bool) -> list[int]:
    """The tokens of `text` that should stay the same whatever the user types next.

    BPE may merge the last token with what follows (" " + "world" -> " world"; with GPT-2-style
    vocabularies a trailing space is such a token too), so it is held back unless the text ends in
    punctuation; then typical continuations (a space, a letter, a newline, a digit) confirm the kept tokens
    do not move. A wrong guess costs only a cache miss on one block, never a wrong answer: blocks are
    matched by their token ids.
    """
    keep = len(ids) if _ends_at_boundary(text) else len(ids) - 1
    for probe in (" a", "a", "\n", "1"):
        probe_ids = state.tokenizer.encode(text + probe, add_special=add_special)
        while keep > 0 and probe_ids[:keep] != ids[:keep]:
            keep -= 1
    return ids[:max(keep, 0)]


async def cache_warm(request: web.Request) -> web.Response:
    state = request.app[STATE]
    req = await read_request(request, P.CacheWarmRequest)
    check_model(state, req.model)
    if (req.prompt is None) == (req.messages is None):
        raise ProtocolError("send exactly one of prompt or messages", "prompt")
    if req.messages is not None:
        messages = P.check_messages(req.messages, limits(state))
        # Render with a marker in place of the last message's text and cut there: what follows the draft
        # (end-of-turn, the assistant header) does not exist yet.
        marked = messages[:-1] + [{**messages[-1], "content": WARM_SENTINEL}]
        rendered = render_chat(state, marked, add_generation_prompt=False)
        cut = rendered.find(WARM_SENTINEL)
        if cut < 0:
            raise ProtocolError("the chat template drops the last message's text; cannot warm it", "messages")
        text, add_special = rendered[:cut] + messages[-1]["content"], False
    else:
        text, add_special = req.prompt, True
    ids = stable_prefix(state, text, await encode(state, text, add_special), add_special)
    check_prompt_len(state, len(ids), "messages" if req.messages is not None else "prompt")
    target = len(ids) // state.scheduler.block_size * state.scheduler.block_size
    if target == 0:
        return json_response(P.CacheWarmResponse(len(ids), 0, 0))
    (handle,) = submit_all(state, [Request(f"warm-{uuid.uuid4().hex}", ids, max_tokens=0, warm=True,
                                           timeout_s=state.settings.request_timeout_s or None)])
    try:
        out = await handle.state.queue.get()
        handle.done = True
    finally:
        handle.abort()
    err = output_error(out)
    if err is not None:
        raise err
    hit = out.usage.cached_tokens if out.usage else 0
    return json_response(P.CacheWarmResponse(len(ids), target, target - hit))


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_get("/v1/models", list_models)
    app.router.add_get("/v1/models/{model:.+}", get_model)
    app.router.add_post("/tokenize", tokenize)
    app.router.add_post("/detokenize", detokenize)
    app.router.add_post("/v1/cache/warm", cache_warm)
