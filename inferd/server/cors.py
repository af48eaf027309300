"""CORS for browser clients: `cors_allowed_origins` (empty: no CORS headers at all, browsers refuse cross-origin
calls) lists the origins a page may call from, "*" for any.

- A preflight (OPTIONS with Origin and Access-Control-Request-Method) is answered here, before the API-key check
  (a browser never sends credentials on a preflight): 204 with Access-Control-Allow-Origin/-Methods/-Headers and
  Max-Age for an allowed origin, 403 in OpenAI's error envelope for another.
- Every other answer to an allowed origin carries Access-Control-Allow-Origin (and Vary: Origin), added when its
  headers are sent (aiohttp's on_response_prepare), so errors from any middleware and SSE streams get it too.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from aiohttp import web

ALLOW_METHODS = "GET, POST, DELETE, OPTIONS"
# what the OpenAI and Anthropic SDKs send from a browser when the preflight does not list its headers
DEFAULT_ALLOW_HEADERS = (
    "Authorization, Content-Type, OpenAI-Organization, OpenAI-Project, OpenAI-Beta, "
    "x-api-key, anthropic-version, anthropic-beta, anthropic-dangerous-direct-browser-access"
)
MAX_AGE_S = 600

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class CorsPolicy:
    def __init__(self, allowed_origins: Sequence[str]):
        origins = [o.strip().rstrip("/") for o in allowed_origins if o.strip()]
        self.any_origin = "*" in origins
        self.origins = frozenset(o for o in origins if o != "*")

    @property
    def enabled(self) -> bool:
        return self.any_origin or bool(self.origins)

    def allow_origin(self, origin: str | None) -> str | None:
        """The Access-Control-Allow-Origin value for a request from `origin`, or None (not allowed)."""
        if not origin or not self.enabled:
            return None
        if self.any_origin:
            return "*"
        return origin if origin.rstrip("/") in self.origins else None

    # -- aiohttp hooks
    @web.middleware
    async def preflight(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if not (
            self.enabled
            and request.method == "OPTIONS"
            and "Origin" in request.headers
            and "Access-Control-Request-Method" in request.headers
        ):
            return await handler(request)
        allowed = self.allow_origin(request.headers["Origin"])
        if allowed is None:
            return web.json_response(
                {
                    "error": {
                        "message": f"origin {request.headers['Origin']!r} is not allowed (cors_allowed_origins)",
                        "type": "invalid_request_error",
                        "param": None,
                        "code": "cors_origin_not_allowed",
                    }
                },
                status=403,
            )
        requested = request.headers.get("Access-Control-Request-Headers", "").strip()
        return web.Response(
            status=204,
            headers={
                "Access-Control-Allow-Origin": allowed,
                "Access-Control-Allow-Methods": ALLOW_METHODS,
                "Access-Control-Allow-Headers": requested or DEFAULT_ALLOW_HEADERS,
                "Access-Control-Max-Age": str(MAX_AGE_S),
                "Vary": "Origin, Access-Control-Request-Method, Access-Control-Request-Headers",
            },
        )

    async def on_response_prepare(self, request: web.Request, response: web.StreamResponse) -> None:
        allowed = self.allow_origin(request.headers.get("Origin"))
        if allowed is None or "Access-Control-Allow-Origin" in response.headers:
            return
        response.headers["Access-Control-Allow-Origin"] = allowed
        if allowed != "*":
            vary = response.headers.get("Vary")
            response.headers["Vary"] = f"{vary}, Origin" if vary else "Origin"


def setup_cors(app: web.Application, allowed_origins: Sequence[str]) -> CorsPolicy:
    """Installs the preflight middleware first in line and the header hook; nothing when the list is empty."""
    policy = CorsPolicy(allowed_origins)
    if policy.enabled:
        app.middlewares.insert(0, policy.preflight)
        app.on_response_prepare.append(policy.on_response_prepare)
    return policy
