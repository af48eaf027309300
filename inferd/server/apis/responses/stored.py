"""GET and DELETE /v1/responses/{response_id}: a stored response, and forgetting it."""

from __future__ import annotations

from aiohttp import web

from inferd.server.apis.responses.render import response_store
from inferd.server.apis.responses.store import not_found
from inferd.server.sse import json_response
from inferd.server.state import STATE


async def get_response(request: web.Request) -> web.Response:
    rid = request.match_info["response_id"]
    stored = response_store(request.app[STATE]).get(rid)
    if stored is None:
        raise not_found(rid)
    return json_response(stored.response)


async def delete_response(request: web.Request) -> web.Response:
    rid = request.match_info["response_id"]
    if not response_store(request.app[STATE]).delete(rid):
        raise not_found(rid)
    return json_response({"id": rid, "object": "response.deleted", "deleted": True})
