"""Every route of the API server: the generating APIs (one `Api` each, on the pipeline of generation.py), the
stored responses, Anthropic's token count, the OpenAI routes that do not generate (openai.py), embeddings
(embeddings.py), reranking (rerank.py) and Ollama's (apis/ollama/). Each answers errors in its API's envelope
(error_response)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aiohttp import web

from inferd.server import embeddings, model_admin, openai, prompt_cache, rerank
from inferd.server.apis.chat.encode import ChatEncoder
from inferd.server.apis.chat.render import render as render_chat_completion
from inferd.server.apis.chat.request import ChatCompletionRequest
from inferd.server.apis.completions.encode import CompletionsEncoder
from inferd.server.apis.completions.render import render as render_completion
from inferd.server.apis.completions.request import CompletionRequest
from inferd.server.apis.messages import count
from inferd.server.apis.messages.encode import MessagesEncoder
from inferd.server.apis.messages.errors import error_body as anthropic_error
from inferd.server.apis.messages.render import render as render_messages
from inferd.server.apis.messages.request import MessagesRequest
from inferd.server.apis.ollama import embed as ollama_embed
from inferd.server.apis.ollama import models as ollama_models
from inferd.server.apis.ollama.encode import ChatEncoder as OllamaChatEncoder
from inferd.server.apis.ollama.encode import GenerateEncoder as OllamaGenerateEncoder
from inferd.server.apis.ollama.render import render_chat_request as render_ollama_chat
from inferd.server.apis.ollama.render import render_generate as render_ollama_generate
from inferd.server.apis.ollama.request import ChatRequest as OllamaChatRequest
from inferd.server.apis.ollama.request import GenerateRequest as OllamaGenerateRequest
from inferd.server.apis.ollama.request import error_body as ollama_error_body
from inferd.server.apis.ollama.unload import answer_unloaded
from inferd.server.apis.responses.encode import ResponsesEncoder
from inferd.server.apis.responses.render import render as render_response
from inferd.server.apis.responses.request import ResponsesRequest
from inferd.server.apis.responses.stored import delete_response, get_response
from inferd.server.generation import Api
from inferd.server.protocol import ProtocolError
from inferd.server.sse import json_response

APIS: tuple[Api[Any, Any], ...] = (
    Api("/v1/chat/completions", ChatCompletionRequest, render_chat_completion, ChatEncoder, "chatcmpl"),
    Api("/v1/completions", CompletionRequest, render_completion, CompletionsEncoder, "cmpl"),
    Api("/v1/responses", ResponsesRequest, render_response, ResponsesEncoder, "resp"),
    Api(
        "/api/chat",
        OllamaChatRequest,
        render_ollama_chat,
        OllamaChatEncoder,
        "ollama",
        ollama_error_body,
        answer_unloaded,
    ),
    Api(
        "/api/generate",
        OllamaGenerateRequest,
        render_ollama_generate,
        OllamaGenerateEncoder,
        "ollama",
        ollama_error_body,
        answer_unloaded,
    ),
    Api("/v1/messages", MessagesRequest, render_messages, MessagesEncoder, "msg", error_body=anthropic_error),
)

OLLAMA_PREFIX = "/api/"


def error_body(path: str) -> Callable[[ProtocolError], object]:
    """The error envelope of the API whose routes `path` is among: a generating API's own (Anthropic's for
    /v1/messages and /v1/messages/count_tokens), Ollama's under /api/, OpenAI's for every other path."""
    for api in APIS:
        if path == api.path or path.startswith(api.path + "/"):
            return api.error_body
    return ollama_error_body if path.startswith(OLLAMA_PREFIX) else ProtocolError.body


def error_response(path: str, e: ProtocolError) -> web.Response:
    return json_response(error_body(path)(e), status=e.status, headers=e.headers)


def add_routes(app: web.Application) -> None:
    for api in APIS:
        app.router.add_post(api.path, api.handle)
    app.router.add_get("/v1/responses/{response_id}", get_response)
    app.router.add_delete("/v1/responses/{response_id}", delete_response)
    app.router.add_post(count.PATH, count.count_tokens)
    model_admin.add_routes(app)
    openai.add_routes(app)
    embeddings.add_routes(app)
    ollama_models.add_routes(app)
    ollama_embed.add_routes(app)
    rerank.add_routes(app)
    prompt_cache.add_routes(app)
