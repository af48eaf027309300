"""CORS (inferd.server.cors) on a small app with inferd's own error and API-key middlewares: preflights answered
without a key, Access-Control-Allow-Origin on every answer to an allowed origin (JSON, errors from each
middleware, an SSE stream), nothing for other origins or when the setting is empty."""
from __future__ import annotations

import asyncio

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from inferd.config import Settings
from inferd.server.middleware import auth_middleware, error_middleware, key_digest
from inferd.server.cors import setup_cors
from inferd.server.protocol import ProtocolError
from inferd.server.state import STATE, ServerState
from inferd.server.systemd import Notifier

SITE = "https://app.example.com"


def make_app(origins):
    app = web.Application(middlewares=[error_middleware, auth_middleware])
    app[STATE] = ServerState(settings=Settings(), notifier=Notifier(), api_key_digests=[key_digest("sk-test")])

    async def ok(request):
        return web.json_response({"ok": True})

    async def bad(request):
        raise ProtocolError("temperature must be in [0, 2]", param="temperature")

    async def stream(request):
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b"data: 1\n\n")
        await resp.write(b"data: [DONE]\n\n")
        return resp

    app.router.add_get("/v1/models", ok)
    app.router.add_post("/v1/bad", bad)
    app.router.add_post("/v1/stream", stream)
    setup_cors(app, origins)
    return app


def run(origins, scenario):
    async def main():
        async with TestClient(TestServer(make_app(origins))) as client:
            return await scenario(client)
    return asyncio.run(main())


AUTH = {"Authorization": "Bearer sk-test"}


def test_preflight_is_answered_without_an_api_key():
    async def scenario(client):
        r = await client.options("/v1/stream", headers={
            "Origin": SITE, "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type, x-stainless-os"})
        return r.status, dict(r.headers)
    status, headers = run([SITE], scenario)
    assert status == 204
    assert headers["Access-Control-Allow-Origin"] == SITE
    assert "POST" in headers["Access-Control-Allow-Methods"] and "DELETE" in headers["Access-Control-Allow-Methods"]
    assert headers["Access-Control-Allow-Headers"] == "authorization, content-type, x-stainless-os"
    assert int(headers["Access-Control-Max-Age"]) > 0
    assert "Origin" in headers["Vary"]


def test_every_answer_to_an_allowed_origin_carries_the_header():
    async def scenario(client):
        h = {"Origin": SITE}
        out = {}
        for name, method, path, headers in [("ok", "GET", "/v1/models", AUTH), ("no_key", "GET", "/v1/models", {}),
                                            ("bad", "POST", "/v1/bad", AUTH), ("404", "GET", "/v1/nope", AUTH),
                                            ("stream", "POST", "/v1/stream", AUTH)]:
            r = await client.request(method, path, headers={**h, **headers})
            body = await r.read()
            out[name] = (r.status, r.headers.get("Access-Control-Allow-Origin"), r.headers.get("Vary"), body)
        return out
    out = run([SITE, "http://localhost:5173"], scenario)
    assert out["ok"][:2] == (200, SITE)
    assert out["no_key"][:2] == (401, SITE) and b"API key" in out["no_key"][3]
    assert out["bad"][:2] == (400, SITE) and b'"param":"temperature"' in out["bad"][3].replace(b" ", b"")
    assert out["404"][:2] == (404, SITE)
    assert out["stream"][:2] == (200, SITE) and out["stream"][3].endswith(b"data: [DONE]\n\n")
    assert all("Origin" in v[2] for v in out.values())


def test_other_origins_get_no_header_and_a_refused_preflight():
    async def scenario(client):
        pre = await client.options("/v1/models", headers={"Origin": "https://evil.example",
                                                          "Access-Control-Request-Method": "GET"})
        body = await pre.json()
        r = await client.get("/v1/models", headers={"Origin": "https://evil.example", **AUTH})
        same = await client.get("/v1/models", headers=AUTH)                 # no Origin: not a CORS request
        return pre.status, body, r.status, r.headers, same.headers
    pre_status, body, status, headers, same = run([SITE], scenario)
    assert pre_status == 403 and body["error"]["code"] == "cors_origin_not_allowed"
    assert status == 200 and "Access-Control-Allow-Origin" not in headers
    assert "Access-Control-Allow-Origin" not in same


def test_star_allows_any_origin():
    async def scenario(client):
        r = await client.get("/v1/models", headers={"Origin": "https://anything.example", **AUTH})
        pre = await client.options("/v1/models", headers={"Origin": "https://x.example",
                                                          "Access-Control-Request-Method": "GET"})
        return r.headers.get("Access-Control-Allow-Origin"), pre.status, pre.headers
    allow, pre_status, pre_headers = run(["*"], scenario)
    assert allow == "*" and pre_status == 204
    assert pre_headers["Access-Control-Allow-Headers"].startswith("Authorization, Content-Type")


def test_empty_setting_adds_nothing():
    async def scenario(client):
        pre = await client.options("/v1/models", headers={"Origin": SITE, "Access-Control-Request-Method": "GET"})
        r = await client.get("/v1/models", headers={"Origin": SITE, **AUTH})
        return pre.status, pre.headers, r.headers
    pre_status, pre_headers, headers = run([], scenario)
    assert pre_status == 401 and "Access-Control-Allow-Origin" not in pre_headers   # auth as for any request
    assert "Access-Control-Allow-Origin" not in headers
