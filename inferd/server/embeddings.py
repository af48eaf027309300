"""POST /v1/embeddings in OpenAI's shape, for an embedding model served alone or beside a chat model.

    {"model": "...", "input": "text" | ["text", ...] | [1, 2, 3] | [[1, 2], [3]],
     "encoding_format": "float" | "base64", "dimensions": 256,
     "input_type": "query" | "document" (extension: the model's prompt prefix), "truncate": true (extension)}

Texts are tokenized here, on the event loop's side (big requests in a worker thread); the embedding queue's
thread only sees token ids and batches inputs across requests. Errors use the OpenAI envelope and name the bad
input by index (`input[3]`).
"""

from __future__ import annotations

import asyncio
import base64
import logging
import uuid
from typing import Any, Literal

import msgspec
from aiohttp import web
from msgspec import Struct

from inferd.engine.embedder import InputTooLong, truncate_dimensions
from inferd.engine.embedding_queue import EmbeddingJob, QueueFull
from inferd.server.embedding_service import EmbeddingService
from inferd.server.protocol import ProtocolError, decode
from inferd.server.state import STATE, ServerState

log = logging.getLogger("inferd.server")

MAX_INPUTS = 2048  # OpenAI's limit on inputs per request
TOKENIZE_OFF_LOOP_CHARS = 20_000


class EmbeddingRequest(Struct, forbid_unknown_fields=False):
    input: Any
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    user: str | None = None
    input_type: str | None = None  # extension: "query" | "document" | a prompt name of the model
    truncate: bool = False  # extension: cut inputs over the model's limit instead of refusing them


class EmbeddingData(Struct):
    index: int
    embedding: list[float] | str
    object: str = "embedding"


class EmbeddingUsage(Struct):
    prompt_tokens: int
    total_tokens: int


class EmbeddingResponse(Struct):
    data: list[EmbeddingData]
    model: str
    usage: EmbeddingUsage
    object: str = "list"


def parse_inputs(raw: Any) -> tuple[list[str] | None, list[list[int]] | None]:
    """(texts, None) or (None, token id lists) from OpenAI's four input shapes; ProtocolError on anything else."""
    if isinstance(raw, str):
        raw = [raw]
    if not isinstance(raw, list) or not raw:
        raise ProtocolError(
            "input must be a non-empty string, list of strings, list of token ids or list of lists of token ids",
            "input",
        )
    if len(raw) > MAX_INPUTS and not all(isinstance(x, int) for x in raw):
        raise ProtocolError(f"input holds {len(raw)} items; at most {MAX_INPUTS} per request", "input")
    if all(isinstance(x, str) for x in raw):
        for i, x in enumerate(raw):
            if not x:
                raise ProtocolError(f"input[{i}] is an empty string", f"input[{i}]")
        return raw, None
    if all(isinstance(x, int) and not isinstance(x, bool) for x in raw):
        return None, [raw]
    if all(isinstance(x, list) for x in raw):
        for i, x in enumerate(raw):
            if not x or not all(isinstance(t, int) and not isinstance(t, bool) for t in x):
                raise ProtocolError(f"input[{i}] must be a non-empty list of token ids", f"input[{i}]")
        return None, raw
    raise ProtocolError("input mixes types: send strings, or token ids, or lists of token ids", "input")


def check_dimensions(service: EmbeddingService, dimensions: int | None) -> int | None:
    native = service.embedder.dimensions
    if dimensions is None or dimensions == native:
        return None
    if not service.embedder.model.matryoshka_dims:
        raise ProtocolError(
            f"model `{service.name}` does not support the dimensions parameter (its vectors have "
            f"{native} values and were not trained to be truncated)",
            "dimensions",
        )
    if not 1 <= dimensions <= native:
        raise ProtocolError(f"dimensions must be between 1 and {native}", "dimensions")
    return dimensions


async def tokenize_inputs(service: EmbeddingService, req: EmbeddingRequest) -> list[list[int]]:
    texts, ids = parse_inputs(req.input)
    emb = service.embedder
    try:
        if texts is None:
            assert ids is not None
            return emb.check_ids(ids, truncate=req.truncate)
        if sum(len(t) for t in texts) < TOKENIZE_OFF_LOOP_CHARS:
            return emb.tokenize(texts, input_type=req.input_type, truncate=req.truncate)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, lambda: emb.tokenize(texts, req.input_type, req.truncate))
    except InputTooLong as e:
        raise ProtocolError(str(e), f"input[{e.index}]", code="context_length_exceeded") from None
    except ValueError as e:
        raise ProtocolError(str(e), "input_type" if "input_type" in str(e) else "input") from None


async def run_job(service: EmbeddingService, ids: list[list[int]]) -> EmbeddingJob:
    """Queues the inputs and waits for their vectors; a cancelled wait (the client went away) drops the job."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[EmbeddingJob] = loop.create_future()

    def resolve(job: EmbeddingJob) -> None:
        if not done.done():
            done.set_result(job)

    def on_done(job: EmbeddingJob) -> None:  # on the queue's thread
        loop.call_soon_threadsafe(resolve, job)

    job = EmbeddingJob(f"embd-{uuid.uuid4().hex}", ids, on_done)
    try:
        service.queue.submit(job)
    except QueueFull as e:
        raise ProtocolError(str(e), status=429, code="queue_full", headers={"Retry-After": "1"}) from None
    try:
        await done
    finally:
        if not done.done():
            service.queue.abort(job)
    if job.error is not None:
        raise ProtocolError(job.error, status=503 if "shutting down" in job.error else 500)
    return job


def build_response(
    service: EmbeddingService, req: EmbeddingRequest, job: EmbeddingJob, dimensions: int | None
) -> EmbeddingResponse:
    assert job.vectors is not None
    vectors = job.vectors
    if dimensions is not None:
        vectors = truncate_dimensions(vectors, dimensions, service.embedder.model.normalize)
    if req.encoding_format == "base64":  # OpenAI's: the little-endian float32 bytes of each vector
        data = [EmbeddingData(i, base64.b64encode(v.astype("<f4").tobytes()).decode()) for i, v in enumerate(vectors)]
    else:
        data = [EmbeddingData(i, v.tolist()) for i, v in enumerate(vectors)]
    tokens = job.num_tokens
    return EmbeddingResponse(data, service.name, EmbeddingUsage(tokens, tokens))


def pick_service(state: ServerState, name: str | None) -> EmbeddingService:
    """The embedding model a request's `model` names (the first one when it names none)."""
    services = [s for s in state.embeddings if s.kind == "embedding"]
    for s in services:
        if name is None or s.answers_to(name):
            return s
    names = ", ".join(f"`{s.name}`" for s in services)
    if name is not None and state.model is not None and name in state.model_names():
        raise ProtocolError(
            f"model `{name}` is a chat model and does not serve embeddings unless started with --pooling last or "
            f"--pooling mean; this server embeds with {names or 'no model (start it with --embedding-model)'}",
            "model",
            code="model_not_embedding",
        )
    if not services:
        raise ProtocolError(
            "this server has no embedding model; start it with --embedding-model PATH",
            "model",
            status=404,
            code="model_not_found",
        )
    raise ProtocolError(
        f"The model `{name}` does not exist; embedding models here: {names}",
        "model",
        status=404,
        code="model_not_found",
    )


async def embeddings(request: web.Request) -> web.Response:
    state = request.app[STATE]
    req = decode(await request.read(), EmbeddingRequest)
    service = pick_service(state, req.model)
    dimensions = check_dimensions(service, req.dimensions)
    ids = await tokenize_inputs(service, req)
    job = await run_job(service, ids)
    body = msgspec.json.encode(build_response(service, req, job, dimensions))
    return web.Response(body=body, content_type="application/json")


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/embeddings", embeddings)
