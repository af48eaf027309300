"""What the XML-style formats share (Qwen3-Coder's `<parameter=k>v</parameter>`, GLM-4.5's
`<arg_key>k</arg_key><arg_value>v</arg_value>`): their parameter values are bare text, typed by the tool's JSON
schema (a string stays as written; integer, number, boolean, object and array values are read as JSON, and stay a
string when they do not parse), and the call's arguments go out as one JSON object built as the values arrive.

Also here: the base parser of those formats (XmlCallParser: the marker search that tells a complete closing marker
from one still arriving), and the Lark for a parameter's value under its schema.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from inferd.text.grammar import JSON_WHITESPACE
from inferd.text.parsing import ContentDelta, ToolDelta
from inferd.text.tools.base import CallParser

_JSON_TYPES = {str: "string", bool: "boolean", int: "number", float: "number", dict: "object", list: "array"}


def value_types(schema: Any) -> set[str]:
    """The JSON types a parameter's schema allows (empty: the schema does not say)."""
    if not isinstance(schema, Mapping):
        return set()
    kind = schema.get("type")
    if isinstance(kind, str):
        return {kind}
    if isinstance(kind, list):
        return {k for k in kind if isinstance(k, str)}
    values = list(schema["enum"]) if isinstance(schema.get("enum"), list) else []
    if "const" in schema:
        values.append(schema["const"])
    if values:
        return {"null" if v is None else _JSON_TYPES.get(type(v), "string") for v in values}
    out: set[str] = set()
    for key in ("anyOf", "oneOf"):
        for sub in schema.get(key) or ():
            out |= value_types(sub)
    return out


def is_text(schema: Any) -> bool:
    """The value is kept as the text the model wrote: a string, or a schema that names no type."""
    types = value_types(schema)
    return not types or "string" in types


def typed(raw: str, schema: Any) -> Any:
    """A parameter's text as its schema's type."""
    if is_text(schema):
        return raw
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw


def property_schema(params: Mapping[str, Any] | None, key: str) -> Any:
    props = params.get("properties") if isinstance(params, Mapping) else None
    return props.get(key) if isinstance(props, Mapping) else None


class ArgsJson:
    """One call's arguments as JSON text, grown parameter by parameter. A text value streams as it arrives (JSON
    string escaping works character by character, so the pieces add up to the whole value's escaping); a typed value
    goes out once complete."""

    def __init__(self, params: Mapping[str, Any] | None):
        self.params = params
        self.text = ""
        self._count = 0
        self._key = ""
        self._streams = False
        self._sent = 0  # how much of the current text value went out
        self.closed = False

    @property
    def streams(self) -> bool:
        return self._streams

    def open_param(self, key: str) -> None:
        self.text += ("{" if self._count == 0 else ", ") + json.dumps(key, ensure_ascii=False) + ": "
        self._count += 1
        self._key = key
        self._streams = is_text(property_schema(self.params, key))
        self._sent = 0
        if self._streams:
            self.text += '"'

    def value_so_far(self, raw: str) -> None:
        """A text value's beginning (only what can no longer change)."""
        if self._streams and len(raw) > self._sent:
            self.text += json.dumps(raw[self._sent :], ensure_ascii=False)[1:-1]
            self._sent = len(raw)

    def close_param(self, raw: str) -> None:
        if self._streams:
            self.value_so_far(raw)
            self.text += '"'
        else:
            self.text += json.dumps(typed(raw, property_schema(self.params, self._key)), ensure_ascii=False)
        self._streams = False

    def close(self) -> None:
        if not self.closed:
            self.text += "}" if self._count else "{}"
            self.closed = True


def first_marker(text: str, markers: Sequence[str], final: bool) -> tuple[int, str] | None:
    """The earliest complete marker in text, once no marker that could begin before it is still arriving;
    None when there is none yet (or at the end: none at all)."""
    found = [(i, m) for m in markers if (i := text.find(m)) >= 0]
    best = min(found) if found else None
    if final:
        return best
    limit = best[0] if best else len(text)
    for m in markers:  # a marker cut off at the end of the text, starting before the best one
        for k in range(min(len(m) - 1, len(text)), 0, -1):
            if len(text) - k < limit and text.endswith(m[:k]):
                return None
    return best


def held_back(text: str, markers: Sequence[str]) -> int:
    """How much of text's end may still become one of the markers."""
    keep = 0
    for m in markers:
        for k in range(min(len(m) - 1, len(text)), 0, -1):
            if text.endswith(m[:k]):
                keep = max(keep, k)
                break
    return keep


class XmlCallParser(CallParser):
    """The calls' markers read from the text; a call that turns out not to be one (no name where the name goes)
    goes back out as text. Subclasses read the call after OPEN in their own modes."""

    def __init__(self, new_id: Callable[[], str], tool_names: Iterable[str] = ()):
        super().__init__(new_id, tool_names)
        self._args: ArgsJson | None = None
        self._consumed = ""  # the call's text so far, given back if it was not a call
        self._value_started = False  # the current value's first character was read

    def _not_a_call(self, events: list[ToolDelta]) -> bool:
        events.append(ContentDelta(self._marker + self._consumed + self._buf))
        self._buf, self._consumed, self._mode = "", "", "text"
        self._seen_text = True
        return False

    def _take(self, n: int) -> str:
        piece, self._buf = self._buf[:n], self._buf[n:]
        self._consumed += piece
        return piece

    def _begin(self, name: str, events: list[ToolDelta]) -> None:
        self._start_call(name, events)
        self._seen_text_since_call = False
        self._args = ArgsJson(self.param_schemas.get(name))

    def _end_call(self, events: list[ToolDelta]) -> None:
        if self._args is not None:
            self._args.close()
            self._send_args(self._args.text, events)
            self._args = None
        self._consumed = ""

    def _flush(self, events: list[ToolDelta]) -> None:
        if self._args is not None:  # an unfinished call (length limit): what there is
            self._end_call(events)
        elif self._mode != "text" and (self._consumed or self._marker):
            events.append(ContentDelta(self._marker + self._consumed))
            self._consumed = ""


# ---- grammar -----------------------------------------------------------------------------------------------------
def regex_literal(text: str) -> str:
    """text as a Lark /regex/ that matches it exactly."""
    out = []
    for ch in text:
        if ch == "\n":
            out.append("\\n")
        elif ch.isalnum() or ch in "<>=_ ":
            out.append(ch)
        else:
            out.append("\\" + ch)
    return "".join(out)


def value_lark(rule: str, schema: Any, close: str, markers: Mapping[str, int] | None = None) -> str:
    """Lark rules: `rule` is one parameter value valid against its schema, then `close`. A text value is one lexeme
    with its closing marker (any text without that marker), so it cannot run past it; where the closing marker is
    a token of the vocabulary (markers), text cannot spell it, and the value is any text before that token."""
    end_lark = marker_lark(close, markers or {})
    if not is_text(schema):
        body = {**dict(schema), "x-guidance": {"whitespace_pattern": JSON_WHITESPACE}}
        return f"{rule}: {rule}_json {end_lark}\n{rule}_json: %json {json.dumps(body)}\n"
    assert schema is None or isinstance(schema, Mapping)
    s: Mapping[str, Any] = schema or {}
    choices = list(s["enum"]) if isinstance(s.get("enum"), list) else ([s["const"]] if "const" in s else [])
    if choices and all(isinstance(c, str) for c in choices):
        return f"{rule}: (" + " | ".join(json.dumps(c) for c in choices) + f") {end_lark}\n"
    pattern = s.get("pattern")
    if isinstance(pattern, str) and re.fullmatch(r"\^[^/]*[^\\]\$", pattern):  # an anchored pattern: the whole value
        return f"{rule}: /{pattern[1:-1]}/ {end_lark}\n"
    low = s.get("minLength", 0) if isinstance(s.get("minLength"), int) else 0
    high = s.get("maxLength") if isinstance(s.get("maxLength"), int) else None
    count = f"{{{low},{high}}}" if high is not None else (f"{{{low},}}" if low else "*")
    term = rule.upper()
    if markers and close in markers:
        return f"{rule}: {term} {end_lark}\n{term}: /(?s:.{count})/\n"
    end = regex_literal(close)
    return f"{rule}: {term}\n{term}: /(?s:.{count}){end}/ & ~/(?s:.*){end}(?s:.+)/\n"


def params_lark(prefix: str, params: Mapping[str, Any], param: Callable[[str, str, Any], str]) -> tuple[str, str]:
    """(the sequence of a tool's parameter rules, their definitions): each property in the schema's order, the
    required ones always, the others optional. param(rule, key, schema) defines one. A schema without properties
    takes none."""
    found = params.get("properties")
    props: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
    required = set(params.get("required") or ()) if isinstance(params.get("required"), list) else set()
    seq, rules = [], ""
    for j, (key, sub) in enumerate(props.items()):
        rule = f"{prefix}_{j}"
        seq.append(rule if key in required else rule + "?")
        rules += param(rule, key, sub)
    return " ".join(seq), rules


def marker_lark(text: str, markers: Mapping[str, int]) -> str:
    """A marker in a grammar: its token where the vocabulary has it as one token (a control token cannot be
    spelled as text), else its text."""
    return f"<[{markers[text]}]>" if text in markers else json.dumps(text)
