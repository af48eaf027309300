"""The one pipeline every generating API runs: validate -> render -> tokenize -> submit -> collect, then the answer
in full or as a Server-Sent Events stream (docs/design/apis.md).

An API is a trio tied together by an `Api`: its request Struct, a renderer and an encoder. `Api.handle` decodes the
body into the Struct and checks the model (validate); the renderer checks the API's own rules and turns the request
into `Rendered` prompts (text or token ids), sampling per choice and the bounds of the answer (render); the pipeline
tokenizes the prompts, checks their length, resolves max tokens and submits one scheduler request per choice
(tokenize, submit); the API's encoder reads the `Generation` (collect) and builds the whole response once every
choice has finished, or the stream's events as outputs arrive. `respond()` runs whichever the request asked for,
aborts every choice if the client goes away or anything fails, and logs one line.

Detokenization and stop strings run in the engine loop's output processor (inferd/engine/output.py); the outputs
that arrive here carry finished text deltas.

The per-token path is kept short, because the event loop shares the cores with the kernels: outputs of one
choice that arrived together are merged into one (one SSE event, one socket write), a text-only chunk is the
two pre-encoded halves of its event around the text's JSON string (`TextFrames`), and once every choice has
finished the rest of the stream (last text, finish chunks, usage, [DONE]) goes out in one write.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from aiohttp import web

from inferd.engine.constraints import Constraint
from inferd.engine.loop import QueueFull, SchedulerStopped
from inferd.engine.mailbox import RequestHandle
from inferd.engine.request import Request
from inferd.engine.types import LoraUse, SamplingParams
from inferd.server.choices import Choice, Generation
from inferd.server.lora import request_lora, split_model, unknown_adapter
from inferd.server.protocol import Limits, ProtocolError, decode
from inferd.server.sse import json_response, sse_event, start_stream
from inferd.server.apis.ollama.request import keep_alive_seconds
from inferd.server.models import ModelManager, manager, use_model
from inferd.server.state import ServerState

# ---- the trio's interface -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PromptText:
    """A prompt the pipeline tokenizes (long ones off the event loop)."""

    text: str
    add_special: bool  # False when a chat template wrote BOS itself


Prompt = PromptText | list[int]  # text, or token ids as the request gave them

C = TypeVar("C")


@dataclass
class Rendered(Generic[C]):
    """What a renderer makes of a request: the prompts, how to sample each choice, the bounds of the answer, and
    whatever the API's encoder needs beside the outputs (`context`). Parameter names say which request field an
    error is about."""

    prompts: list[Prompt]
    sampling: Callable[[int], SamplingParams]  # the j-th choice of a prompt -> its sampling (n choices differ)
    context: C
    prompt_param: str  # the field the prompt came from ("messages", "prompt", "input")
    n: int = 1  # choices per prompt
    max_tokens: int | None = None  # as requested; None: what fits, up to default_max_tokens
    default_max_tokens: int | None = None
    max_tokens_param: str = "max_tokens"
    stop: Sequence[str] = ()
    ignore_eos: bool = False
    prompt_logprobs: int | None = None
    speculative: bool | None = None  # None: the server's setting
    constraint: Constraint | None = None  # the grammar every choice follows
    shown_special: frozenset[int] = frozenset()  # special tokens kept in the text (tool-call markers)
    lora: LoraUse | None = None  # the LoRA adapter every choice runs with (the request's model or lora field)


class ApiRequest(Protocol):
    """What the pipeline reads of every API's request Struct."""

    @property
    def model(self) -> str | None: ...

    @property
    def stream(self) -> bool: ...


class Encoder(Protocol):
    """A generation's outputs -> one API's answer; made per request, after the submit."""

    content_type: str  # of a stream: "text/event-stream" (Server-Sent Events), "application/x-ndjson", ...
    # (an encoder may also have `headers`, a dict of response headers that go out with the answer)

    def full(self) -> object:
        """The whole response (a Struct or plain JSON values), once every choice has finished."""
        ...

    def stream(self) -> AsyncIterator[bytes | object]:
        """The stream's events as outputs arrive (read `Generation.outputs`, which says when a keep-alive is due):
        bytes as they go out, or a Struct sent as one SSE `data:` event."""
        ...

    def stream_error(self, err: ProtocolError) -> bytes:
        """The last bytes of a stream in which a choice failed."""
        ...

    def stream_end(self) -> bytes:
        """The last bytes of a stream that ended well ([DONE] for OpenAI's chunk streams)."""
        ...


R = TypeVar("R", bound=ApiRequest)


@dataclass(frozen=True)
class Api(Generic[R, C]):
    """One generating API: where it is served, its request Struct, its renderer and its encoder."""

    path: str
    request: type[R]
    render: Callable[[ServerState, R], Awaitable[Rendered[C]]]
    encoder: Callable[[Generation, R, Rendered[C]], Encoder]
    id_prefix: str  # of the response's id ("chatcmpl", "cmpl", "resp")
    error_body: Callable[[ProtocolError], object] = ProtocolError.body  # the API's error envelope (OpenAI's)
    # a many-model daemon's answer that needs no model loaded (Ollama's unload of an unloaded model), or None
    without_model: Callable[[ModelManager, R], object | None] | None = None

    async def handle(self, request: web.Request) -> web.StreamResponse:
        try:
            req = decode(await request.read(), self.request)
            # Ollama's requests check their model themselves (in Ollama's words) and may say how long it stays loaded
            name = getattr(req, "model_name", None) or req.model
            models = manager(request.app)
            if models is not None and self.without_model is not None:
                answer = self.without_model(models, req)
                if answer is not None:
                    return json_response(answer)
            async with use_model(request.app, name, keep_alive(req)) as state:
                check_model(state, req.model)
                lora = request_lora(state, req.model, getattr(req, "lora", None))
                rendered = await self.render(state, req)
                rendered.lora = lora
                gen = await generate(state, self.id_prefix, rendered)
                return await respond(request, gen, self.encoder(gen, req, rendered), req.stream)
        except ProtocolError as e:
            return json_response(self.error_body(e), status=e.status, headers=e.headers)


# ---- validate, tokenize, submit -------------------------------------------------------------------------------


def keep_alive(req: object) -> float | None:
    """Ollama's keep_alive in seconds (None: not given); a malformed one is the renderer's 400."""
    try:
        return keep_alive_seconds(getattr(req, "keep_alive", None))
    except ProtocolError:
        return None


def limits(state: ServerState) -> Limits:
    return Limits(
        vocab_size=state.tokenizer.vocab_size, max_n=state.settings.max_n, max_messages=state.settings.max_messages
    )


def check_model(state: ServerState, name: str | None) -> None:
    served, _ = split_model(state, name)  # the base model, or one of its LoRA adapters
    if not served:
        base, sep, adapter = (name or "").rpartition(":")
        if sep and base in state.model_names():
            raise unknown_adapter(state, adapter, "model")
        raise ProtocolError(
            f"The model `{name}` does not exist; this server serves `{state.served_model_name}`",
            "model",
            status=404,
            code="model_not_found",
        )


async def encode(state: ServerState, text: str, add_special: bool) -> list[int]:
    # Long texts are tokenized off the loop so a huge prompt cannot stall every other stream.
    tokenizer = state.tokenizer
    if len(text) < 20_000:
        return tokenizer.encode(text, add_special=add_special)
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(None, lambda: tokenizer.encode(text, add_special=add_special))


def check_prompt_len(state: ServerState, n: int, param: str) -> None:
    cap = min(state.settings.max_prompt_tokens or state.max_model_len, state.max_model_len)
    if n > cap:
        raise ProtocolError(
            f"the prompt has {n} tokens; this server accepts at most {cap}", param, code="context_length_exceeded"
        )


def resolve_max_tokens(
    state: ServerState, requested: int | None, prompt_len: int, default: int | None, param: str, prompt_param: str
) -> int:
    room = state.max_model_len - prompt_len
    cap = state.settings.max_tokens_limit or state.max_model_len
    if requested is None:
        if room <= 0:
            raise ProtocolError(
                f"This model's maximum context length is {state.max_model_len} tokens and the "
                f"prompt already has {prompt_len}",
                prompt_param,
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


def submit_all(state: ServerState, requests: list[Request]) -> list[RequestHandle]:
    handles: list[RequestHandle] = []
    try:
        for r in requests:
            handles.append(state.ready_loop.submit(r))
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


async def generate(state: ServerState, id_prefix: str, r: Rendered[C]) -> Generation:
    """Tokenize, check and submit a rendered request: one scheduler request per prompt and choice, in choice order
    (prompt by prompt). A request with nothing to compute (no tokens to generate, no prompt logprobs) is answered
    without the engine: its choices finish at once."""
    prompts: list[list[int]] = []
    for p in r.prompts:
        ids = await encode(state, p.text, p.add_special) if isinstance(p, PromptText) else p
        if not ids:
            raise ProtocolError("the prompt is empty (it has no tokens)", r.prompt_param)
        check_prompt_len(state, len(ids), r.prompt_param)
        prompts.append(ids)
    max_tokens = min(
        resolve_max_tokens(state, r.max_tokens, len(ids), r.default_max_tokens, r.max_tokens_param, r.prompt_param)
        for ids in prompts
    )
    rid = f"{id_prefix}-{uuid.uuid4().hex}"
    eos = frozenset() if r.ignore_eos else frozenset(state.tokenizer.eos_ids)
    if max_tokens == 0 and r.prompt_logprobs is None:
        choices = [Choice(None, i * r.n + j, i) for i in range(len(prompts)) for j in range(r.n)]
        return Generation(state, rid, prompts, eos, choices)
    timeout = state.settings.request_timeout_s or None
    requests = [
        Request(
            f"{rid}-{i * r.n + j}",
            ids,
            r.sampling(j),
            max_tokens,
            r.stop,
            eos,
            prompt_logprobs=r.prompt_logprobs,
            timeout_s=timeout,
            speculative=r.speculative,
            constraint=r.constraint,
            shown_special=r.shown_special,
            lora=r.lora,
        )
        for i, ids in enumerate(prompts)
        for j in range(r.n)
    ]
    handles = submit_all(state, requests)
    return Generation(state, rid, prompts, eos, [Choice(h, k, k // r.n) for k, h in enumerate(handles)])


# ---- answering ---------------------------------------------------------------------------------------------


async def respond(request: web.Request, gen: Generation, encoder: Encoder, stream: bool) -> web.StreamResponse:
    """Run the full or the stream side of an encoder to the end; every choice is aborted on the way out (a no-op
    for finished ones; the rest free their KV blocks at the next step)."""
    try:
        if not stream:
            async for _ in gen.outputs(3600.0):
                pass
            response = json_response(encoder.full(), headers=getattr(encoder, "headers", None))
            gen.log("ok")
            return response
        return await write_stream(request, gen, encoder)
    except (asyncio.CancelledError, ConnectionResetError):
        if gen.state.metrics is not None:
            gen.state.metrics.on_client_disconnected()
        gen.log("client disconnected")
        raise
    except ProtocolError as e:
        gen.log(f"error {e.status}")
        raise
    finally:
        for h in gen.handles:
            h.abort()


async def write_stream(request: web.Request, gen: Generation, encoder: Encoder) -> web.StreamResponse:
    """The stream side: each chunk (bytes, or a Struct as one SSE event) as it comes, the encoder's error ending if
    a choice fails once the stream has started. Once every choice has finished, what is left comes without waiting
    and goes out with the stream's end in one write."""
    resp = await start_stream(request, encoder.content_type, getattr(encoder, "headers", None))
    tail: list[bytes] = []
    try:
        async for chunk in encoder.stream():
            data = chunk if isinstance(chunk, bytes) else sse_event(chunk)
            if gen.finished:
                tail.append(data)
            else:
                await resp.write(data)
    except ProtocolError as err:
        await resp.write(b"".join(tail) + encoder.stream_error(err))
        gen.log(f"error {err.status} (streamed)")
        return resp
    rest = b"".join(tail) + encoder.stream_end()
    if rest:
        await resp.write(rest)
    gen.log("ok")
    return resp
