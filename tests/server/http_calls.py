"""One raw HTTP call to a test server, for the tests that check statuses, envelopes and headers by hand."""
from __future__ import annotations

import json

import aiohttp

CHAT = "/v1/chat/completions"
CMPL = "/v1/completions"
MSG = [{"role": "user", "content": "hi"}]


async def call(base, path, body=None, *, method="POST", raw=None, headers=None):
    """(status, JSON payload or the text when it is not JSON, response headers)."""
    async with aiohttp.ClientSession() as s:
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        async with s.request(method, base + path, data=data, headers=headers) as r:
            text = await r.text()
            try:
                payload = json.loads(text)
            except ValueError:
                payload = text
            return r.status, payload, r.headers
