"""/openapi.json: a minimal OpenAPI 3.1 document of the POST endpoints' request bodies (for clients and fuzzers)."""

from __future__ import annotations

from typing import Any

import msgspec
from aiohttp import web

from inferd.server import embeddings, model_admin, openai, rerank, routes
from inferd.server.apis.messages import count
from inferd.server.apis.messages.request import CountTokensRequest
from inferd.server.apis.ollama import embed as ollama_embed
from inferd.server.apis.ollama import models as ollama_models
from inferd.server.prompt_cache import CacheRestoreRequest, CacheSaveRequest

OPENAPI = web.AppKey("openapi", dict)


def openapi_document() -> dict[str, Any]:
    """A minimal OpenAPI 3.1 document of the POST endpoints' request bodies (for clients and fuzzers)."""
    bodies: dict[str, type] = {api.path: api.request for api in routes.APIS}
    bodies |= {
        "/tokenize": openai.TokenizeRequest,
        "/detokenize": openai.DetokenizeRequest,
        "/v1/cache/warm": openai.CacheWarmRequest,
        "/v1/cache/save": CacheSaveRequest,
        "/v1/cache/restore": CacheRestoreRequest,
        "/v1/embeddings": embeddings.EmbeddingRequest,
        "/api/embed": ollama_embed.EmbedRequest,
        "/api/embeddings": ollama_embed.LegacyEmbeddingsRequest,
        "/api/show": ollama_models.ShowRequest,
        count.PATH: CountTokensRequest,
        "/v1/rerank": rerank.RerankRequest,
        "/v1/score": rerank.ScoreRequest,
        "/v1/models/load": model_admin.ModelRequest,
        "/v1/models/unload": model_admin.ModelRequest,
    }
    _, components = msgspec.json.schema_components(list(bodies.values()), ref_template="#/components/schemas/{name}")
    paths: dict[str, Any] = {}
    for path, t in bodies.items():
        paths[path] = {
            "post": {
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{t.__name__}"}}},
                },
                "responses": {"200": {"description": "OK"}, "400": {"description": "invalid request"}},
            }
        }
    for path in ("/v1/models", "/health", "/metrics"):
        paths[path] = {"get": {"responses": {"200": {"description": "OK"}}}}
    paths["/v1/responses/{response_id}"] = {
        verb: {
            "parameters": [{"name": "response_id", "in": "path", "required": True, "schema": {"type": "string"}}],
            "responses": {"200": {"description": "OK"}, "404": {"description": "not stored (or expired)"}},
        }
        for verb in ("get", "delete")
    }
    return {
        "openapi": "3.1.0",
        "info": {"title": "inferd", "version": "0.1.0"},
        "paths": paths,
        "components": {"schemas": components},
    }


async def openapi(request: web.Request) -> web.Response:
    return web.json_response(request.app[OPENAPI])
