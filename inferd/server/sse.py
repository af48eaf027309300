"""The bytes an answer goes out as: a JSON body, or Server-Sent Events (`data:` events, `: ping` keep-alives, the
[DONE] line OpenAI's streams end with) and the pre-encoded frames of a text-only event."""

from __future__ import annotations

import msgspec
from aiohttp import web

PING = b": ping\n\n"
DONE = b"data: [DONE]\n\n"


def json_response(obj: object, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(body=msgspec.json.encode(obj), status=status, content_type="application/json", headers=headers)


def sse_event(obj: object) -> bytes:
    return b"data: " + msgspec.json.encode(obj) + b"\n\n"


class TextFrames:
    """The SSE event of a chunk that carries only text, encoded once with a marker in the text's place: each
    token's event is then the fixed head and tail around the text's JSON string, byte for byte what encoding the
    whole chunk gives (tests/server/test_stream_frames.py), without building and encoding the chunk's structs."""

    MARK = "\x00inferd-text\x00"

    def __init__(self, template: object):
        raw = sse_event(template)
        mark = msgspec.json.encode(self.MARK)
        if raw.count(mark) != 1:  # cannot happen with the server's own names; say so rather than misframe
            raise ValueError("the chunk template must hold the text marker exactly once")
        self.head, _, self.tail = raw.partition(mark)
        self._encode = msgspec.json.encode

    def __call__(self, text: str) -> bytes:
        return self.head + self._encode(text) + self.tail


SSE = "text/event-stream"


async def start_stream(
    request: web.Request, content_type: str = SSE, headers: dict[str, str] | None = None
) -> web.StreamResponse:
    """A streamed answer's headers, sent: no caching, and no buffering by a proxy in front (nginx); `headers`
    beside them."""
    resp = web.StreamResponse(
        headers={
            "Content-Type": content_type,
            "Cache-Control": "no-cache",
            "X-Accel-Buffering": "no",
            **(headers or {}),
        }
    )
    await resp.prepare(request)
    return resp
