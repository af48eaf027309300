"""The middlewares every request passes: errors in the envelope of the route's API, API keys (Authorization or
x-api-key), and the lifecycle gate (503 while loading or after shutdown began; the routes an embedding-only server
answers)."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging

from aiohttp import web

from inferd.server import routes
from inferd.server.protocol import ProtocolError
from inferd.server.state import STATE

log = logging.getLogger("inferd.server")

OPEN_PATHS = ("/health", "/metrics", "/openapi.json")
# what an embedding-only server answers (besides /v1/models): its embeddings and reranking, and Ollama's listings
EMBEDDING_ONLY_PATHS = (
    "/v1/embeddings",
    "/v1/rerank",
    "/rerank",
    "/v2/rerank",
    "/v1/score",
    "/score",
    "/",
    "/api/embed",
    "/api/embeddings",
    "/api/tags",
    "/api/show",
    "/api/ps",
    "/api/version",
)


def key_digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def needs_auth(path: str) -> bool:
    return path.startswith(("/v1/", routes.OLLAMA_PREFIX)) or path in (
        "/tokenize",
        "/detokenize",
        "/rerank",
        "/v2/rerank",
        "/score",
    )


# ---- middlewares -------------------------------------------------------------------------------------------


@web.middleware
async def error_middleware(request: web.Request, handler):
    try:
        return await handler(request)
    except ProtocolError as e:
        return routes.error_response(request.path, e)
    except web.HTTPRequestEntityTooLarge:
        limit = request.app[STATE].settings.max_body_bytes
        return routes.error_response(
            request.path,
            ProtocolError(
                f"the request body is larger than the limit of {limit} bytes", status=413, code="request_too_large"
            ),
        )
    except web.HTTPException as e:
        if e.status < 400:
            raise
        message = {
            404: f"no route for {request.method} {request.path}",
            405: f"method {request.method} is not allowed on {request.path}",
        }.get(e.status, e.reason)
        return routes.error_response(request.path, ProtocolError(message, status=e.status))
    except (asyncio.CancelledError, ConnectionResetError):
        raise
    except Exception:
        log.exception("unhandled error in %s %s", request.method, request.path)
        return routes.error_response(
            request.path, ProtocolError("internal server error; the failure has been logged", status=500)
        )


def request_keys(request: web.Request) -> list[str]:
    """The API keys a request carries: `Authorization: Bearer KEY` (OpenAI's clients) and `x-api-key: KEY`
    (Anthropic's), on every route; either may hold the key (a gateway in front may add the other)."""
    keys = []
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        keys.append(token.strip())
    key = request.headers.get("x-api-key", "").strip()
    if key:
        keys.append(key)
    return keys


@web.middleware
async def auth_middleware(request: web.Request, handler):
    state = request.app[STATE]
    if state.api_key_digests and needs_auth(request.path):
        keys = request_keys(request)
        # Compare fixed-length digests of every configured key, without stopping at the first match: the
        # time taken says nothing about how much of a guess was right, or which key it resembled.
        ok = False
        for key in keys or [""]:
            digest = key_digest(key)
            for d in state.api_key_digests:
                ok |= hmac.compare_digest(digest, d)
        if not keys or not ok:
            given = "Authorization" in request.headers or "x-api-key" in request.headers
            message = (
                "incorrect API key provided"
                if given
                else "missing API key: send it as 'Authorization: Bearer KEY' or 'x-api-key: KEY'"
            )
            raise ProtocolError(message, status=401, code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
    return await handler(request)


@web.middleware
async def lifecycle_middleware(request: web.Request, handler):
    state = request.app[STATE]
    if request.path in OPEN_PATHS:
        return await handler(request)
    if state.status == "loading":
        raise ProtocolError("the model is still loading; retry shortly", status=503, headers={"Retry-After": "5"})
    if state.status == "failed":
        raise ProtocolError(f"the model failed to load: {state.failure}", status=503)
    if state.status == "draining" and not state.accepting:
        raise ProtocolError("the server is shutting down", status=503, headers={"Retry-After": "5"})
    if (
        state.model is None
        and not state.settings.many_models
        and state.embeddings
        and request.path not in EMBEDDING_ONLY_PATHS
        and not request.path.startswith("/v1/models")
    ):
        served = ", ".join(
            f"{'/v1/rerank' if e.kind == 'rerank' else '/v1/embeddings'}: `{e.name}`" for e in state.embeddings
        )
        raise ProtocolError(
            f"this server serves no chat model, only {served}",
            status=404,
            code="model_not_found",
        )
    state.in_flight += 1
    state.idle.clear()
    try:
        return await handler(request)
    finally:
        state.in_flight -= 1
        if state.in_flight == 0:
            state.idle.set()
