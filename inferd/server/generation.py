"""What the generating endpoints share: turning request fields into scheduler requests, submitting them, merging
the outputs of several choices, and answering in full or as a Server-Sent Events stream.

Each endpoint (chat.py, completions.py) prepares a `Generation` (its choices, submitted) and writes a pair: a
`full` function that builds the whole response once every choice has finished, and a `stream` async generator
that yields the response's chunks as outputs arrive (None when a keep-alive ping is due). `respond()` runs
whichever the request asked for, aborts every choice if the client goes away or anything fails, and logs one line.

Detokenization and stop strings run in the scheduler thread (inferd/engine/scheduler.py's postprocess); the
outputs that arrive here carry finished text deltas.

The per-token path is kept short, because the event loop shares the cores with the kernels: outputs of one
choice that arrived together are merged into one (one SSE event, one socket write), a text-only chunk is the
two pre-encoded halves of its event around the text's JSON string (`TextFrames`), and once every choice has
finished the rest of the stream (last text, finish chunks, usage, [DONE]) goes out in one write.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass, field
from collections.abc import AsyncIterator, Callable

import msgspec
from aiohttp import web

from inferd.engine.loop import QueueFull, RequestHandle, SchedulerStopped
from inferd.engine.request import FinishReason, Request, RequestOutput, Usage
from inferd.engine.types import SamplingParams
from inferd.server import protocol as P
from inferd.server.protocol import ProtocolError
from inferd.server.state import ServerState

log = logging.getLogger("inferd.server")


# ---- request fields -> scheduler requests -----------------------------------------------------------------


def limits(state: ServerState) -> P.Limits:
    return P.Limits(
        vocab_size=state.tokenizer.vocab_size, max_n=state.settings.max_n, max_messages=state.settings.max_messages
    )


def check_model(state: ServerState, name: str | None) -> None:
    if name is not None and name not in state.model_names():
        raise ProtocolError(
            f"The model `{name}` does not exist; this server serves `{state.served_model_name}`",
            "model",
            status=404,
            code="model_not_found",
        )


async def encode(state: ServerState, text: str, add_special: bool) -> list[int]:
    # Long texts are tokenized off the loop so a huge prompt cannot stall every other stream.
    if len(text) < 20_000:
        return state.tokenizer.encode(text, add_special=add_special)
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(None, lambda: state.tokenizer.encode(text, add_special=add_special))


def check_prompt_len(state: ServerState, n: int, param: str) -> None:
    cap = min(state.settings.max_prompt_tokens or state.max_model_len, state.max_model_len)
    if n > cap:
        raise ProtocolError(
            f"the prompt has {n} tokens; this server accepts at most {cap}", param, code="context_length_exceeded"
        )


def resolve_max_tokens(
    state: ServerState, requested: int | None, prompt_len: int, default: int | None, param: str = "max_tokens"
) -> int:
    room = state.max_model_len - prompt_len
    cap = state.settings.max_tokens_limit or state.max_model_len
    if requested is None:
        if room <= 0:
            raise ProtocolError(
                f"This model's maximum context length is {state.max_model_len} tokens and the "
                f"prompt already has {prompt_len}",
                "messages",
                code="context_length_exceeded",
            )
        return min(room, cap, default if default is not None else room)
    if requested > cap:
        raise ProtocolError(f"{param} must be at most {cap}, got {requested}", param)
    if requested > room:
        raise ProtocolError(
            f"This model's maximum context length is {state.max_model_len} tokens. However, you "
            f"requested {prompt_len + requested} tokens ({prompt_len} in the prompt, {requested} "
            f"for the completion). Please reduce the prompt or {param}.",
            param,
            code="context_length_exceeded",
        )
    return requested


def sampling_params(req: P._SamplingRequest, state: ServerState, logprobs: int | None, choice: int) -> SamplingParams:
    seed = req.seed + choice if req.seed is not None and choice else req.seed  # n choices must differ
    greedy = req.top_p == 0.0  # OpenAI accepts top_p 0: only the most likely token, i.e. greedy
    params = SamplingParams(
        temperature=0.0 if greedy else 1.0 if req.temperature is None else req.temperature,
        top_k=0 if req.top_k is None or req.top_k < 0 else req.top_k,
        top_p=1.0 if req.top_p is None or greedy else req.top_p,
        min_p=0.0 if req.min_p is None else req.min_p,
        repetition_penalty=1.0 if req.repetition_penalty is None else req.repetition_penalty,
        presence_penalty=req.presence_penalty or 0.0,
        frequency_penalty=req.frequency_penalty or 0.0,
        logit_bias=P.logit_bias_ids(req.logit_bias, limits(state)),
        seed=seed,
        logprobs=logprobs,
    )
    try:
        params.validate()
    except ValueError as e:
        raise ProtocolError(str(e), str(e).split(" ", 1)[0]) from None
    return params


def stop_token_ids(state: ServerState, ignore_eos: bool | None) -> frozenset[int]:
    return frozenset() if ignore_eos else frozenset(state.tokenizer.eos_ids)


def submit_all(state: ServerState, requests: list[Request]) -> list[RequestHandle]:
    handles: list[RequestHandle] = []
    try:
        for r in requests:
            handles.append(state.engine_loop.submit(r))
    except QueueFull as e:
        for h in handles:
            h.abort()
        raise ProtocolError(
            f"the server is busy ({e}); retry shortly", status=503, code="queue_full", headers={"Retry-After": "1"}
        ) from None
    except SchedulerStopped as e:
        for h in handles:
            h.abort()
        raise ProtocolError(
            f"the server is not accepting requests: {e}", status=503, headers={"Retry-After": "5"}
        ) from None
    return handles


# ---- choices and their outputs ------------------------------------------------------------------------------


def output_error(out: RequestOutput) -> ProtocolError | None:
    if out.finish_reason == FinishReason.ERROR:
        return ProtocolError(out.error_message or "internal error", status=out.error_status or 500)
    if out.finish_reason == FinishReason.ABORT:
        return ProtocolError(out.error_message or "the request was aborted", status=503, headers={"Retry-After": "5"})
    return None


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
    prompt_logprobs: list[tuple[float, list[tuple[int, float]]]] = field(default_factory=list)
    finish_reason: str | None = None
    usage: Usage | None = None

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


@dataclass
class Generation:
    """One API request's choices (one scheduler request each), submitted, and the response's envelope."""

    state: ServerState
    rid: str
    choices: list[Choice]
    created: int = field(default_factory=lambda: int(time.time()))

    @classmethod
    def submit(
        cls, state: ServerState, prefix: str, requests: Callable[[str], list[tuple[int, Request]]]
    ) -> Generation:
        """`requests(rid)` lists (prompt index, Request) per choice, in choice order."""
        rid = f"{prefix}-{uuid.uuid4().hex}"
        made = requests(rid)
        handles = submit_all(state, [r for _, r in made])
        return cls(state, rid, [Choice(h, k, p) for k, (h, (p, _)) in enumerate(zip(handles, made))])

    @property
    def model(self) -> str:
        return self.state.served_model_name

    @property
    def fingerprint(self) -> str:
        return self.state.system_fingerprint

    def usage(self) -> P.UsageInfo:
        """Prompt tokens count once per prompt (not once per choice); completion tokens for every choice."""
        per_prompt: dict[int, Usage] = {}
        completion = 0
        for c in self.choices:
            if c.usage is not None:
                per_prompt[c.prompt_index] = c.usage
                completion += c.usage.completion_tokens
        prompt = sum(u.prompt_tokens for u in per_prompt.values())
        cached = sum(u.cached_tokens for u in per_prompt.values())
        return P.usage_info(prompt, completion, cached)

    @property
    def finished(self) -> bool:
        """Every choice has had its last output: the rest of a stream needs no more waiting."""
        return all(c.handle.done for c in self.choices)

    async def outputs(self, keepalive_s: float) -> AsyncIterator[tuple[Choice, RequestOutput] | None]:
        """Outputs as they arrive, already added to their choice (a choice's outputs that arrived together come
        merged into one); None when `keepalive_s` passed without any. A failed choice raises its ProtocolError,
        after what it produced before failing."""
        async for item in merged_outputs([c.handle for c in self.choices], keepalive_s):
            if item is None:
                yield None
                continue
            i, outs = item
            choice = self.choices[i]
            err = output_error(outs[-1])  # only a choice's last output can end it
            if err is not None:
                if len(outs) > 1:
                    out = merge_outputs(outs[:-1])
                    choice.add(out)
                    yield choice, out
                raise err
            out = merge_outputs(outs)
            choice.add(out)
            yield choice, out

    def log(self, status: str) -> None:
        if not self.state.settings.log_requests:
            return
        usage = self.usage()
        handles = [c.handle for c in self.choices]
        firsts = [h.first_token_time for h in handles if h.first_token_time]
        arrival = min(h.arrival_time for h in handles)
        ttft = (min(firsts) - arrival) if firsts else None
        end = max((h.finish_time or time.monotonic()) for h in handles)
        gen_time = end - min(firsts) if firsts else 0.0
        tps = usage.completion_tokens / gen_time if gen_time > 0 else 0.0
        log.info(
            "%s %s prompt=%d cached=%d completion=%d ttft=%s tok/s=%.1f",
            self.rid,
            status,
            usage.prompt_tokens,
            usage.prompt_tokens_details.cached_tokens,
            usage.completion_tokens,
            f"{ttft:.3f}s" if ttft is not None else "-",
            tps,
        )


def merge_outputs(outs: list[RequestOutput]) -> RequestOutput:
    """Outputs of one request that arrived together, as one: text, tokens and logprobs in order, the latest usage,
    the last one's finish and error."""
    if len(outs) == 1:
        return outs[0]
    last = outs[-1]
    logprobs = top = None
    if any(o.logprobs is not None for o in outs):
        logprobs = [x for o in outs for x in o.logprobs or ()]
        if any(o.top_logprobs for o in outs):
            top = [t for o in outs for t in o.top_logprobs or [[] for _ in o.logprobs or ()]]
    prompt = [x for o in outs for x in o.prompt_logprobs or ()] if any(o.prompt_logprobs for o in outs) else None
    return RequestOutput(
        last.request_id,
        token_ids=[t for o in outs for t in o.token_ids],
        text="".join(o.text for o in outs),
        logprobs=logprobs,
        top_logprobs=top,
        prompt_logprobs=prompt,
        finish_reason=last.finish_reason,
        error_status=last.error_status,
        error_message=last.error_message,
        usage=next((o.usage for o in reversed(outs) if o.usage is not None), None),
    )


async def merged_outputs(
    handles: list[RequestHandle], keepalive_s: float
) -> AsyncIterator[tuple[int, list[RequestOutput]] | None]:
    """Outputs of several requests as they arrive, each request's that arrived together in one list; None when
    `keepalive_s` passed without any."""
    if len(handles) == 1:  # the common case (one prompt, n = 1): no tasks
        handle = handles[0]
        while not handle.done:
            outs = await handle.get_all(keepalive_s)
            yield (0, outs) if outs else None
        return
    tasks = {asyncio.ensure_future(h.get_all()): i for i, h in enumerate(handles) if not h.done}
    try:
        while tasks:
            done, _ = await asyncio.wait(tasks, timeout=keepalive_s, return_when=asyncio.FIRST_COMPLETED)
            if not done:
                yield None
                continue
            for t in sorted(done, key=tasks.__getitem__):
                i = tasks.pop(t)
                outs = t.result()
                if not handles[i].done:
                    tasks[asyncio.ensure_future(handles[i].get_all())] = i
                yield i, outs
    finally:
        for t in tasks:
            t.cancel()


# ---- answering ---------------------------------------------------------------------------------------------


def json_response(obj, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(body=msgspec.json.encode(obj), status=status, content_type="application/json", headers=headers)


PING = b": ping\n\n"
DONE = b"data: [DONE]\n\n"


def sse_event(obj) -> bytes:
    return b"data: " + msgspec.json.encode(obj) + b"\n\n"


class TextFrames:
    """The SSE event of a chunk that carries only text, encoded once with a marker in the text's place: each
    token's event is then the fixed head and tail around the text's JSON string, byte for byte what encoding the
    whole chunk gives (tests/server/test_stream_frames.py), without building and encoding the chunk's structs."""

    MARK = "\x00inferd-text\x00"

    def __init__(self, template: object):
        raw = sse_event(template)
        mark = msgspec.json.encode(self.MARK)
        if raw.count(mark) != 1:  # cannot happen with the server's own names; say so rather than misframe
            raise ValueError("the chunk template must hold the text marker exactly once")
        self.head, _, self.tail = raw.partition(mark)
        self._encode = msgspec.json.encode

    def __call__(self, text: str) -> bytes:
        return self.head + self._encode(text) + self.tail


async def start_sse(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    )
    await resp.prepare(request)
    return resp


async def respond(
    request: web.Request, gen: Generation, full: Callable[[], object], stream: AsyncIterator[object | None] | None
) -> web.StreamResponse:
    """Run the full or the stream side of an endpoint to the end; every choice is aborted on the way out (a no-op
    for finished ones; the rest free their KV blocks at the next step)."""
    try:
        if stream is None:
            async for _ in gen.outputs(3600.0):
                pass
            response = json_response(full())
            gen.log("ok")
            return response
        return await write_stream(request, gen, stream)
    except (asyncio.CancelledError, ConnectionResetError):
        gen.state.metrics.on_client_disconnected()
        gen.log("client disconnected")
        raise
    except ProtocolError as e:
        gen.log(f"error {e.status}")
        raise
    finally:
        for c in gen.choices:
            c.handle.abort()


async def write_stream(
    request: web.Request, gen: Generation, chunks: AsyncIterator[object | None]
) -> web.StreamResponse:
    """The SSE side: each chunk (a struct, or an event already encoded as bytes) as a `data:` event, `: ping` for
    None, an error event then [DONE] if a choice fails once the stream has started. Once every choice has
    finished, what is left comes without waiting and goes out with [DONE] in one write."""
    resp = await start_sse(request)
    tail: list[bytes] = []
    try:
        async for chunk in chunks:
            data = PING if chunk is None else chunk if isinstance(chunk, bytes) else sse_event(chunk)
            if gen.finished:
                tail.append(data)
            else:
                await resp.write(data)
    except ProtocolError as err:
        await resp.write(b"".join(tail) + sse_event(err.body()) + DONE)
        gen.log(f"error {err.status} (streamed)")
        return resp
    await resp.write(b"".join(tail) + DONE)
    gen.log("ok")
    return resp


def wants_usage(req: P._SamplingRequest) -> bool:
    return req.stream_options is not None and bool(req.stream_options.include_usage)
