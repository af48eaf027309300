"""Every route of the API server: the generating APIs (one `Api` each, on the pipeline of generation.py), the
stored responses, and the OpenAI routes that do not generate (openai.py) and embeddings (embeddings.py)."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from inferd.server import embeddings, openai, prompt_cache
from inferd.server.apis.chat.encode import ChatEncoder
from inferd.server.apis.chat.render import render as render_chat_completion
from inferd.server.apis.chat.request import ChatCompletionRequest
from inferd.server.apis.completions.encode import CompletionsEncoder
from inferd.server.apis.completions.render import render as render_completion
from inferd.server.apis.completions.request import CompletionRequest
from inferd.server.apis.responses.encode import ResponsesEncoder
from inferd.server.apis.responses.render import render as render_response
from inferd.server.apis.responses.request import ResponsesRequest
from inferd.server.apis.responses.stored import delete_response, get_response
from inferd.server.generation import Api

APIS: tuple[Api[Any, Any], ...] = (
    Api("/v1/chat/completions", ChatCompletionRequest, render_chat_completion, ChatEncoder, "chatcmpl"),
    Api("/v1/completions", CompletionRequest, render_completion, CompletionsEncoder, "cmpl"),
    Api("/v1/responses", ResponsesRequest, render_response, ResponsesEncoder, "resp"),
)


def add_routes(app: web.Application) -> None:
    for api in APIS:
        app.router.add_post(api.path, api.handle)
    app.router.add_get("/v1/responses/{response_id}", get_response)
    app.router.add_delete("/v1/responses/{response_id}", delete_response)
    openai.add_routes(app)
    embeddings.add_routes(app)
    prompt_cache.add_routes(app)
