"""Scanners the tool-call parsers share: one JSON call object (`{"name": ..., "arguments": {...}}`, as Hermes,
Llama 3 and Mistral before v11 write calls), one bare JSON value (a Mistral v11 call's arguments), and how much of
a text's end could still become a marker. Each scanner takes text a piece at a time and stops at its value's end,
so a parser knows where the call ends without waiting for the rest of the output."""

from __future__ import annotations

import json


class CallObject:
    """Scans one JSON call object ({"name": ..., "arguments"|"parameters": ...}) a piece at a time and says what
    to emit: the call's start once its name is complete, then the arguments' text as it arrives (exactly as
    written, never past the value's end)."""

    ARG_KEYS = ("arguments", "parameters")

    def __init__(self) -> None:
        self.raw = ""
        self.depth = 0
        self.in_str = False
        self.esc = False
        self.done = False
        self.key: str | None = None  # the top-level key whose value is being read
        self.expect = "open"  # open | key | colon | value | after
        self.tok_start = 0  # where the current key or value text began in raw
        self.name: str | None = None
        self.args_start: int | None = None
        self.args_end: int | None = None
        self.args_is_string = False

    def feed(self, text: str) -> int:
        """Consumes text up to the end of the object; returns how many characters it took."""
        for n, ch in enumerate(text):
            if self.done:
                return n
            self.raw += ch
            self._char(ch, len(self.raw) - 1)
        return len(text)

    def _char(self, ch: str, i: int) -> None:
        if self.in_str:
            if self.esc:
                self.esc = False
            elif ch == "\\":
                self.esc = True
            elif ch == '"':
                self.in_str = False
                if self.depth == 1 and self.expect == "key":
                    self.key = _string(self.raw[self.tok_start : i + 1])
                    self.expect = "colon"
                elif self.depth == 1 and self.expect == "value":
                    self._value_end(i + 1)
            return
        if ch == '"':
            self.in_str = True
            if self.depth == 1 and self.expect in ("key", "value"):
                if self.expect == "value":
                    self._value_start(i)
                self.tok_start = i
            return
        if ch.isspace():
            return
        if self.expect == "open":
            if ch == "{":
                self.depth, self.expect = 1, "key"
            else:  # not an object: not a call
                self.done = True
            return
        if ch in "{[":
            if self.depth == 1 and self.expect == "value":
                self._value_start(i)
            self.depth += 1
            return
        if ch in "}]":
            self.depth -= 1
            if self.depth == 1 and self.expect == "value":
                self._value_end(i + 1)
            elif self.depth == 0:
                if self.expect == "value":
                    self._value_end(i)
                self.done = True
            return
        if self.depth == 1:
            if ch == ":" and self.expect == "colon":
                self.expect = "value"
                self.tok_start = -1
            elif ch == ",":
                if self.expect == "value":
                    self._value_end(i)
                self.expect = "key"
            elif self.expect == "value" and self.tok_start < 0:
                self._value_start(i)  # a number or literal

    def _value_start(self, i: int) -> None:
        self.tok_start = i
        if self.key in self.ARG_KEYS and self.args_start is None:
            self.args_start = i
            self.args_is_string = self.raw[i] == '"'

    def _value_end(self, end: int) -> None:
        text = self.raw[self.tok_start : end].rstrip()
        if self.key == "name" and self.name is None:
            try:
                value = json.loads(text)
                self.name = value if isinstance(value, str) else None
            except json.JSONDecodeError:
                self.name = None
        if self.key in self.ARG_KEYS and self.args_start == self.tok_start and self.args_end is None:
            self.args_end = self.tok_start + len(text)
        self.expect = "after"

    def arguments_so_far(self) -> str:
        """The arguments' text read so far (all of it once the value ended); "" for a string value until it ends."""
        if self.args_start is None or (self.args_is_string and self.args_end is None):
            return ""
        text = self.raw[self.args_start : self.args_end] if self.args_end is not None else self.raw[self.args_start :]
        if self.args_is_string:  # arguments sent as a JSON string holding JSON: OpenAI's form is the inner text
            try:
                inner = json.loads(text)
                return inner if isinstance(inner, str) else text
            except json.JSONDecodeError:
                return text
        return text


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


def _string(quoted: str) -> str:
    """A JSON string as the model wrote it: raw control characters kept, a bad escape as its own text (the
    output is not always grammar-constrained, and what it wrote must never crash the parse)."""
    try:
        return json.loads(quoted, strict=False)
    except json.JSONDecodeError:
        return quoted[1:-1]


def partial_suffix(text: str, marker: str) -> int:
    """Length of the longest end of `text` that is a beginning of `marker` (held back until it is decided)."""
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:k]):
            return k
    return 0
