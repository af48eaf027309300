"""What every API's requests share: the error a request the server will not run raises, and decoding a body into
the API's request Struct.

Decoding a body is one msgspec call: wrong types and out-of-range values come back as a ProtocolError
whose message says what was expected and where (`param`), which the server turns into a 400 with the
error envelope. Checks msgspec cannot express (mutually dependent fields, limits that depend on the model)
live beside each API's request Struct (inferd/server/apis/<api>/request.py), bounded by `Limits`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TypeVar

import msgspec
from msgspec import Struct

# ---- errors ---------------------------------------------------------------------------------------------


class ErrorInfo(Struct):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(Struct):
    error: ErrorInfo


class ProtocolError(Exception):
    """A request the server will not run; becomes an HTTP error with the OpenAI envelope."""

    def __init__(
        self,
        message: str,
        param: str | None = None,
        *,
        status: int = 400,
        type: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.message = message
        self.param = param
        self.status = status
        self.type = type or _ERROR_TYPES.get(status, "invalid_request_error")
        self.code = code
        self.headers = headers or {}

    def body(self) -> ErrorResponse:
        return ErrorResponse(ErrorInfo(self.message, self.type, self.param, self.code))


_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    500: "internal_server_error",
    503: "service_unavailable_error",
    504: "timeout_error",
}

_PATH = re.compile(r" - at `\$\.?(.*)`$")
_MISSING = re.compile(r"Object missing required field `([^`]*)`")


T = TypeVar("T")


def decode(body: bytes, type_: type[T]) -> T:
    """Decode and type-check a JSON body; any problem raises ProtocolError (400)."""
    try:
        return msgspec.json.decode(body, type=type_)
    except msgspec.ValidationError as e:
        message = str(e)
        m = _PATH.search(message)
        # msgspec writes `[...]` for a dict value; the dict's own name is the useful param
        param = (m.group(1).replace("[...]", "") or None) if m else None
        missing = _MISSING.match(message)
        if missing:  # name the missing field itself, not the object that lacks it
            param = f"{param}.{missing.group(1)}" if param else missing.group(1)
        raise ProtocolError(message, param) from None
    except msgspec.DecodeError as e:
        raise ProtocolError(f"could not parse the request body as JSON: {e}") from None


@dataclass
class Limits:
    """The bounds a request is checked against: the model's vocabulary and the server's settings."""

    vocab_size: int
    max_n: int = 8
    max_messages: int = 256
    max_stop: int = 16
