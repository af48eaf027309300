"""Anthropic's error envelope, {"type": "error", "error": {"type", "message"}}, for every error of the Messages
routes (the pipeline's, and the middlewares': API keys, a model still loading, a body too large, no such route).
The HTTP status stays the server's own; the error's type is Anthropic's name for it."""

from __future__ import annotations

from msgspec import Struct

from inferd.server.protocol import ProtocolError

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",  # busy, loading or shutting down: retry later, as after Anthropic's 529
}


class ErrorDetail(Struct):
    type: str
    message: str


class ErrorBody(Struct, kw_only=True):
    type: str = "error"
    error: ErrorDetail


def error_type(status: int) -> str:
    return ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")


def error_body(e: ProtocolError) -> ErrorBody:
    """The message names the field where the error is about one (Anthropic's envelope has no `param`)."""
    message = e.message if not e.param or e.param in e.message else f"{e.param}: {e.message}"
    return ErrorBody(error=ErrorDetail(error_type(e.status), message))
