"""Mistral's tool-call syntaxes: the control tokens that mark a call, call ids as Mistral's templates want them,
the v11 call grammar, and a scanner for one JSON value (a v11 call's arguments).

Two syntaxes (tools.py's MISTRAL and MISTRAL_V11 formats):
- before tokenizer v11 (Mistral 7B v0.3, Nemo, Small 3.0): `[TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]`,
  one JSON list after the marker;
- v11 and later (Mistral Small 3.1/3.2, Devstral, Magistral, Ministral 3): `[TOOL_CALLS]name[ARGS]{...}` per call,
  the marker repeated before every call, and in some templates (Mistral Small 3.2) `[TOOL_CALLS]name[CALL_ID]id
  [ARGS]{...}` with a 9-character alphanumeric id. The chat template tells which: a v11 template writes `[ARGS]`
  (and `[CALL_ID]` when it wants ids); a template that mentions only `[TOOL_CALLS]` is v11 when the vocabulary has
  an `[ARGS]` control token.

The markers are control tokens, which decoding normally drops: a request that parses Mistral calls keeps them in
its text (`shown_tokens`), as llama.cpp keeps its "preserved tokens".
"""

from __future__ import annotations

import hashlib
import json
import secrets
import string
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from inferd.text.tools import Tool

TOOL_CALLS, ARGS, CALL_ID = "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"
MARKERS = (TOOL_CALLS, ARGS, CALL_ID)
_ALNUM = string.ascii_letters + string.digits
ID_LEN = 9  # Mistral's templates refuse other call ids ("alphanumeric strings with length 9")


def new_mistral_id() -> str:
    return "".join(secrets.choice(_ALNUM) for _ in range(ID_LEN))


def mistral_id(call_id: str) -> str:
    """A call id as Mistral's templates accept it: kept when it is 9 alphanumerics, else a stable 9-character digest
    (the same for the assistant's call and the tool message that answers it)."""
    if len(call_id) == ID_LEN and all(c in _ALNUM for c in call_id):
        return call_id
    n = int.from_bytes(hashlib.sha256(call_id.encode()).digest()[:8], "big")
    out = []
    for _ in range(ID_LEN):
        n, d = divmod(n, len(_ALNUM))
        out.append(_ALNUM[d])
    return "".join(out)


def marker_ids(token_id_of: Callable[[str], int | None]) -> dict[str, int]:
    """The Mistral markers this vocabulary has as single tokens."""
    out = {}
    for m in MARKERS:
        i = token_id_of(m)
        if i is not None:
            out[m] = int(i)
    return out


def v11_grammar_lark(
    tools: Sequence[Tool],
    markers: Mapping[str, int],
    *,
    call_ids: bool,
    parallel: bool,
    args_schema: Callable[[Tool], dict[str, Any]],
) -> str:
    """Lark for v11 calls: `[TOOL_CALLS]name([CALL_ID]id)?[ARGS]{args per the tool's schema}`, once or (parallel)
    repeated. The markers are matched as their token ids, so the text `[ARGS]` cannot stand in for the token."""
    for m in (TOOL_CALLS, ARGS) + ((CALL_ID,) if call_ids else ()):
        if m not in markers:
            from inferd.text.tools import ToolError

            raise ToolError(f"this model's vocabulary has no {m} token", "tools")
    lark = "start: " + ("call+" if parallel else "call") + "\n"
    lark += f"call: <[{markers[TOOL_CALLS]}]> fn\n"
    lark += "fn: " + " | ".join(f"fn_{i}" for i in range(len(tools))) + "\n"
    for i, t in enumerate(tools):
        head = json.dumps(t.name)
        if call_ids:
            head += f" <[{markers[CALL_ID]}]> CALL_ID"
        lark += f"fn_{i}: {head} <[{markers[ARGS]}]> args_{i}\n"
        lark += f"args_{i}: %json " + json.dumps(args_schema(t)) + "\n"
    if call_ids:
        lark += f"CALL_ID: /[a-zA-Z0-9]{{{ID_LEN}}}/\n"
    return lark


class JsonValue:
    """Reads one JSON value (a v11 call's arguments) a piece at a time, stopping at its end: an object or array
    ends at its closing bracket, a string at its closing quote, a bare number or literal at whitespace or `[` (the
    next marker). Whitespace before the value is skipped, not kept."""

    def __init__(self) -> None:
        self.raw = ""
        self.done = False
        self._kind = ""  # "" (not started) | bracket | string | bare
        self._depth = 0
        self._in_str = False
        self._esc = False

    def feed(self, text: str) -> int:
        """Consumes text up to the end of the value; returns how many characters it took."""
        for n, ch in enumerate(text):
            if self.done:
                return n
            if not self._kind:
                if ch.isspace():
                    continue
                self._kind = "bracket" if ch in "{[" else "string" if ch == '"' else "bare"
                self._in_str = self._kind == "string"
                self._depth = 1 if self._kind == "bracket" else 0
                self.raw += ch
                continue
            if self._kind == "bare" and (ch.isspace() or ch == "["):
                self.done = True
                return n
            self.raw += ch
            if self._in_str:
                if self._esc:
                    self._esc = False
                elif ch == "\\":
                    self._esc = True
                elif ch == '"':
                    self._in_str = False
                    self.done = self._kind == "string"
            elif self._kind == "bracket":
                if ch == '"':
                    self._in_str = True
                elif ch in "{[":
                    self._depth += 1
                elif ch in "}]":
                    self._depth -= 1
                    self.done = self._depth == 0
        return len(text)
