"""Reranking and pair scoring with a cross-encoder (server/rerank_service.py):

    POST /v1/rerank (also /rerank, /v2/rerank), Jina's and Cohere's shape:
      {"model": "...", "query": "...", "documents": ["text", {"text": "..."}, ...], "top_n": 3,
       "return_documents": true}
      -> {"id", "model", "results": [{"index", "relevance_score", "document": {"text"}}, ...] best first,
          "usage": {"prompt_tokens", "total_tokens"}}
    POST /v1/score (also /score), vLLM's: {"model", "text_1": str | [str], "text_2": str | [str]}
      -> {"id", "object": "list", "created", "model", "data": [{"index", "object": "score", "score"}], "usage"}

Every pair is cut to the model's length the way sentence-transformers' CrossEncoder cuts it (the longer text
first), so a long document never fails a request. Errors use the OpenAI envelope and name the bad field.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Annotated

import msgspec
from aiohttp import web
from msgspec import Meta, Struct

from inferd.engine.llm_reranker import LLMReranker
from inferd.engine.reranker import Reranker
from inferd.server.embedding_service import EmbeddingService
from inferd.server.embeddings import MAX_INPUTS, TOKENIZE_OFF_LOOP_CHARS, run_job
from inferd.server.protocol import ProtocolError, decode
from inferd.server.state import STATE, ServerState

RERANK_PATHS = ("/v1/rerank", "/rerank", "/v2/rerank")
SCORE_PATHS = ("/v1/score", "/score")


class Document(Struct, forbid_unknown_fields=False):
    text: str


class RerankRequest(Struct, forbid_unknown_fields=False):
    query: str
    documents: list[str | Document]
    model: str | None = None
    top_n: Annotated[int, Meta(ge=1)] | None = None
    return_documents: bool = True


class ScoreRequest(Struct, forbid_unknown_fields=False):
    text_1: str | list[str]
    text_2: str | list[str]
    model: str | None = None


class Usage(Struct):
    prompt_tokens: int
    total_tokens: int


class RerankResult(Struct, omit_defaults=True):
    index: int
    relevance_score: float
    document: Document | None = None


class RerankResponse(Struct):
    id: str
    model: str
    results: list[RerankResult]
    usage: Usage


class ScoreData(Struct):
    index: int
    score: float
    object: str = "score"


class ScoreResponse(Struct):
    id: str
    created: int
    model: str
    data: list[ScoreData]
    usage: Usage
    object: str = "list"


def pick_reranker(state: ServerState, name: str | None) -> EmbeddingService:
    """The reranker a request's `model` names (the first one when it names none)."""
    services = [s for s in state.embeddings if s.kind == "rerank"]
    for s in services:
        if name is None or s.answers_to(name):
            return s
    if not services:
        raise ProtocolError(
            "this server has no reranker; start it with --rerank-model PATH (a cross-encoder folder), or with "
            "--rerank-prompt qwen3 to rerank with the chat model (Qwen3-Reranker)",
            "model",
            status=404,
            code="model_not_found",
        )
    names = ", ".join(f"`{s.name}`" for s in services)
    raise ProtocolError(
        f"The model `{name}` does not exist or does not rerank; rerankers here: {names}",
        "model",
        status=404,
        code="model_not_found",
    )


def _check_texts(texts: list[str], param: str) -> None:
    if not texts:
        raise ProtocolError(f"{param} must not be empty", param)
    if len(texts) > MAX_INPUTS:
        raise ProtocolError(f"{param} holds {len(texts)} items; at most {MAX_INPUTS} per request", param)


async def score_pairs(service: EmbeddingService, pairs: list[tuple[str, str]], param: str) -> tuple[list[float], int]:
    """Each pair's score (the single label's activated logit) and the tokens read."""
    reranker = service.embedder
    assert isinstance(reranker, (Reranker, LLMReranker))
    labels = reranker.dimensions
    if labels != 1:
        raise ProtocolError(
            f"model `{service.name}` has {labels} labels; scoring needs a one-label cross-encoder", "model"
        )

    def tokenize() -> list[list[int]]:
        return list(reranker.tokenize_pairs(pairs))

    try:
        if sum(len(a) + len(b) for a, b in pairs) < TOKENIZE_OFF_LOOP_CHARS:
            ids = tokenize()
        else:
            ids = await asyncio.get_running_loop().run_in_executor(None, tokenize)
    except (TypeError, ValueError) as e:  # tokenizers refuses lone surrogates (valid JSON, not UTF-8)
        raise ProtocolError(f"a text cannot be tokenized: {e}", param) from None
    job = await run_job(service, list(ids))
    assert job.vectors is not None
    return [float(v) for v in job.vectors[:, 0]], job.num_tokens


async def rerank(request: web.Request) -> web.Response:
    state = request.app[STATE]
    req = decode(await request.read(), RerankRequest)
    service = pick_reranker(state, req.model)
    docs = [d if isinstance(d, str) else d.text for d in req.documents]
    _check_texts(docs, "documents")
    scores, tokens = await score_pairs(service, [(req.query, d) for d in docs], "documents")
    order = sorted(range(len(docs)), key=lambda i: (-scores[i], i))[: req.top_n or len(docs)]
    results = [RerankResult(i, scores[i], Document(docs[i]) if req.return_documents else None) for i in order]
    body = RerankResponse(f"rerank-{uuid.uuid4().hex}", service.name, results, Usage(tokens, tokens))
    return web.Response(body=msgspec.json.encode(body), content_type="application/json")


async def score(request: web.Request) -> web.Response:
    state = request.app[STATE]
    req = decode(await request.read(), ScoreRequest)
    service = pick_reranker(state, req.model)
    first = [req.text_1] if isinstance(req.text_1, str) else req.text_1
    second = [req.text_2] if isinstance(req.text_2, str) else req.text_2
    _check_texts(first, "text_1")
    _check_texts(second, "text_2")
    if len(first) == 1:  # vLLM's rule: one text_1 against every text_2, else pairwise
        first = first * len(second)
    if len(first) != len(second):
        raise ProtocolError(
            f"text_1 holds {len(first)} texts and text_2 {len(second)}: send one text_1, or as many as text_2",
            "text_2",
        )
    scores, tokens = await score_pairs(service, list(zip(first, second)), "text_2")
    data = [ScoreData(i, s) for i, s in enumerate(scores)]
    body = ScoreResponse(f"score-{uuid.uuid4().hex}", int(time.time()), service.name, data, Usage(tokens, tokens))
    return web.Response(body=msgspec.json.encode(body), content_type="application/json")


def add_routes(app: web.Application) -> None:
    for path in RERANK_PATHS:
        app.router.add_post(path, rerank)
    for path in SCORE_PATHS:
        app.router.add_post(path, score)
