"""Ollama's embeddings: POST /api/embed (`input` a string or a list of them -> `embeddings`, a list of vectors)
and the older POST /api/embeddings (`prompt` -> `embedding`), on the server's embedding model(s) through the same
queue as /v1/embeddings. An empty input is answered with no vectors (Ollama's way to load the model)."""

from __future__ import annotations

import time
from typing import Annotated, Any

from aiohttp import web
from msgspec import Meta, Struct

from inferd.server.apis.ollama.request import Options, base_name, keep_alive_seconds
from inferd.server.embedding_service import EmbeddingService
from inferd.server.embeddings import EmbeddingRequest, build_response, check_dimensions, run_job, tokenize_inputs
from inferd.server.protocol import ProtocolError, decode
from inferd.server.sse import json_response
from inferd.server.state import STATE, ServerState


class EmbedRequest(Struct, kw_only=True):
    model: str
    input: Any = None  # a string or a list of strings
    truncate: bool = True  # Ollama's default: inputs over the model's limit are cut, not refused
    dimensions: Annotated[int, Meta(ge=1)] | None = None
    keep_alive: float | str | None = None
    options: Options | None = None  # nothing in them changes an embedding


class LegacyEmbeddingsRequest(Struct, kw_only=True):
    model: str
    prompt: str = ""
    keep_alive: float | str | None = None
    options: Options | None = None


class EmbedResponse(Struct):
    model: str
    embeddings: list[list[float]]
    total_duration: int = 0
    load_duration: int = 0
    prompt_eval_count: int = 0


def embedding_service(state: ServerState, name: str) -> EmbeddingService:
    """The embedding model `name` names (its `:latest` form too)."""
    for s in state.embeddings:
        if s.answers_to(name) or s.answers_to(base_name(name)):
            return s
    if state.model is not None and (name in state.model_names() or base_name(name) in state.model_names()):
        raise ProtocolError(
            f'"{name}" does not support embeddings: start the server with --embedding-model, or with --pooling to '
            "let the chat model embed",
            "model",
        )
    raise ProtocolError(f"model '{name}' not found", "model", status=404)


def input_texts(raw: Any) -> list[str]:
    if raw is None or raw == "":
        return []
    if isinstance(raw, str):
        return [raw]
    if isinstance(raw, list) and all(isinstance(x, str) for x in raw):
        return raw
    raise ProtocolError("input must be a string or a list of strings", "input")


async def vectors(
    service: EmbeddingService, texts: list[str], truncate: bool, dimensions: int | None
) -> tuple[list[list[float]], int]:
    """The texts' vectors as lists, and how many tokens they had."""
    dims = check_dimensions(service, dimensions)
    ids = await tokenize_inputs(service, EmbeddingRequest(input=texts, model=service.name, truncate=truncate))
    job = await run_job(service, ids)
    answer = build_response(service, EmbeddingRequest(input=texts), job, dims)
    return [d.embedding for d in answer.data if isinstance(d.embedding, list)], job.num_tokens


async def embed(request: web.Request) -> web.Response:
    state = request.app[STATE]
    req = decode(await request.read(), EmbedRequest)
    started = time.monotonic()
    keep_alive_seconds(req.keep_alive)
    service = embedding_service(state, req.model)
    texts = input_texts(req.input)
    if not texts:
        return json_response(EmbedResponse(req.model, []))
    embeddings, tokens = await vectors(service, texts, req.truncate, req.dimensions)
    total = int((time.monotonic() - started) * 1e9)
    return json_response(EmbedResponse(req.model, embeddings, total, 0, tokens))


async def legacy_embeddings(request: web.Request) -> web.Response:
    state = request.app[STATE]
    req = decode(await request.read(), LegacyEmbeddingsRequest)
    keep_alive_seconds(req.keep_alive)
    service = embedding_service(state, req.model)
    if not req.prompt:
        return json_response({"embedding": []})
    (vector,), _ = await vectors(service, [req.prompt], True, None)
    return json_response({"embedding": vector})


def add_routes(app: web.Application) -> None:
    app.router.add_post("/api/embed", embed)
    app.router.add_post("/api/embeddings", legacy_embeddings)
