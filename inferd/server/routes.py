"""Every route of the API server: the generating APIs (one `Api` each, on the pipeline of generation.py), the
stored responses, the OpenAI routes that do not generate (openai.py) and embeddings (embeddings.py), and Ollama's
(apis/ollama/), whose errors have Ollama's envelope."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from inferd.server import embeddings, openai
from inferd.server.apis.chat.encode import ChatEncoder
from inferd.server.apis.chat.render import render as render_chat_completion
from inferd.server.apis.chat.request import ChatCompletionRequest
from inferd.server.apis.completions.encode import CompletionsEncoder
from inferd.server.apis.completions.render import render as render_completion
from inferd.server.apis.completions.request import CompletionRequest
from inferd.server.apis.ollama import embed as ollama_embed
from inferd.server.apis.ollama import models as ollama_models
from inferd.server.apis.ollama.encode import ChatEncoder as OllamaChatEncoder
from inferd.server.apis.ollama.encode import GenerateEncoder as OllamaGenerateEncoder
from inferd.server.apis.ollama.render import render_chat_request as render_ollama_chat
from inferd.server.apis.ollama.render import render_generate as render_ollama_generate
from inferd.server.apis.ollama.request import ChatRequest as OllamaChatRequest
from inferd.server.apis.ollama.request import GenerateRequest as OllamaGenerateRequest
from inferd.server.apis.ollama.request import error_body as ollama_error_body
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
    Api("/api/chat", OllamaChatRequest, render_ollama_chat, OllamaChatEncoder, "ollama", ollama_error_body),
    Api(
        "/api/generate",
        OllamaGenerateRequest,
        render_ollama_generate,
        OllamaGenerateEncoder,
        "ollama",
        ollama_error_body,
    ),
)

OLLAMA_PREFIX = "/api/"


def error_response(path: str, e: ProtocolError) -> web.Response:
    """An error in the envelope of the API `path` belongs to: Ollama's under /api/, else OpenAI's."""
    body = ollama_error_body(e) if path.startswith(OLLAMA_PREFIX) else e.body()
    return json_response(body, status=e.status, headers=e.headers)


def add_routes(app: web.Application) -> None:
    for api in APIS:
        app.router.add_post(api.path, api.handle)
    app.router.add_get("/v1/responses/{response_id}", get_response)
    app.router.add_delete("/v1/responses/{response_id}", delete_response)
    openai.add_routes(app)
    embeddings.add_routes(app)
    ollama_models.add_routes(app)
    ollama_embed.add_routes(app)
