"""POST /v1/messages/count_tokens: the tokens of the prompt a messages request with the same body would have (the
same conversation, system, tools and thinking switch, rendered the same way); max_tokens is not needed."""

from __future__ import annotations

from aiohttp import web

from inferd.server.apis.messages.errors import error_body
from inferd.server.apis.messages.render import render_prompt
from inferd.server.apis.messages.request import CountTokensRequest
from inferd.server.generation import check_model, encode
from inferd.server.models import use_model
from inferd.server.protocol import ProtocolError, decode
from inferd.server.sse import json_response

PATH = "/v1/messages/count_tokens"


async def count_tokens(request: web.Request) -> web.Response:
    try:
        req = decode(await request.read(), CountTokensRequest)
        async with use_model(request.app, req.model) as state:
            check_model(state, req.model)
            text, _ = await render_prompt(state, req)
            ids = await encode(state, text, add_special=False)
    except ProtocolError as e:
        return json_response(error_body(e), status=e.status, headers=e.headers)
    return json_response({"input_tokens": len(ids)})
