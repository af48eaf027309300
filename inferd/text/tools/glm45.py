"""GLM-4.5 / 4.6 / 4.7's XML tool calls: the name right after the marker, then key/value pairs of bare text,

    <tool_call>get_weather
    <arg_key>city</arg_key>
    <arg_value>Paris</arg_value>
    </tool_call>

The values are typed by the tool's schema (xml_args); the arguments go out as a JSON object.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from inferd.text.parsing import ToolDelta
from inferd.text.tools.base import ToolCall
from inferd.text.tools.syntax import CallSyntax
from inferd.text.tools.validation import TOOL_NAME, Tool
from inferd.text.tools.xml_args import XmlCallParser, first_marker, held_back, marker_lark, params_lark, value_lark

OPEN, CLOSE = "<tool_call>", "</tool_call>"
KEY, KEY_END, VALUE, VALUE_END = "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"
_NAME_ENDS = ("\n", KEY, CLOSE)
_VALUE_ENDS = (VALUE_END, KEY, CLOSE)


class Glm45Parser(XmlCallParser):
    OPEN = OPEN

    def _opened(self, marker_text: str, marker: str) -> None:
        self._mode, self._marker, self._consumed = "name", marker_text, ""

    def _step(self, events: list[ToolDelta], final: bool) -> bool:
        step = {"name": self._step_name, "args": self._step_args, "value": self._step_value}.get(self._mode)
        return step(events, final) if step else super()._step(events, final)

    def _step_name(self, events: list[ToolDelta], final: bool) -> bool:
        """The name, up to its line's end (or the first key, or the end of the call)."""
        found = first_marker(self._buf, _NAME_ENDS, final)
        if found is None:
            so_far = self._buf[: len(self._buf) - held_back(self._buf, _NAME_ENDS)].strip()
            if final or (so_far and not TOOL_NAME.match(so_far)):
                return self._not_a_call(events)
            return False
        at, _ = found
        name = self._buf[:at].strip()
        if not TOOL_NAME.match(name):
            return self._not_a_call(events)
        self._take(at)
        self._begin(name, events)
        self._mode = "args"
        return True

    def _step_args(self, events: list[ToolDelta], final: bool) -> bool:
        args = self._args
        assert args is not None
        rest = self._buf.lstrip()
        if rest.startswith(KEY):
            key_end, value_at = rest.find(KEY_END), rest.find(VALUE)
            if key_end < 0 or value_at < key_end:
                return self._finish_call(events) if final else False
            args.open_param(rest[len(KEY) : key_end].strip())
            self._send_args(args.text, events)
            self._buf = rest[value_at + len(VALUE) :]
            self._mode = "value"
            return True
        if rest.startswith(CLOSE):
            self._buf = rest[len(CLOSE) :]
            return self._finish_call(events)
        if not final and any(m.startswith(rest) for m in (KEY, CLOSE)):
            return False
        return self._finish_call(events)  # text where a key belongs: the call ends there

    def _step_value(self, events: list[ToolDelta], final: bool) -> bool:
        args = self._args
        assert args is not None
        found = first_marker(self._buf, _VALUE_ENDS, final)
        if found is None:
            if final:
                args.close_param(self._buf)
                self._buf = ""
                return self._finish_call(events)
            args.value_so_far(self._buf[: len(self._buf) - held_back(self._buf, _VALUE_ENDS)])
            self._send_args(args.text, events)
            return False
        at, marker = found
        args.close_param(self._buf[:at])
        self._send_args(args.text, events)
        self._buf = self._buf[at + len(marker) :] if marker == VALUE_END else self._buf[at:]
        self._mode = "args"
        return True

    def _finish_call(self, events: list[ToolDelta]) -> bool:
        self._end_call(events)
        self._mode = "text"
        return True


def grammar(
    tools: Sequence[Tool], *, parallel: bool, trigger_token_id: int | None, markers: Mapping[str, int], call_ids: bool
) -> str:
    """Each call as the template writes one: the name, then the tool's parameters in its schema's order, each value
    valid against the parameter's schema; blocks separated by a newline when parallel."""
    open_, close = marker_lark(OPEN, markers), marker_lark(CLOSE, markers)
    lark = "start: " + ('call ("\\n" call)*' if parallel else "call") + "\n"
    lark += f"call: {open_} fn {close}\n"
    lark += "fn: " + " | ".join(f"fn_{i}" for i in range(len(tools))) + "\n"

    key_, key_end, value_ = (marker_lark(m, markers) for m in (KEY, KEY_END, VALUE))

    def param(rule: str, key: str, schema: Any) -> str:
        head = f'{key_} {json.dumps(key, ensure_ascii=False)} {key_end} "\\n" {value_}'
        return f'{rule}: {head} {rule}_v "\\n"\n' + value_lark(f"{rule}_v", schema, VALUE_END, markers)

    for i, t in enumerate(tools):
        seq, rules = params_lark(f"a_{i}", t.parameters, param)
        lark += f"fn_{i}: {json.dumps(t.name + chr(10))} {seq}\n" + rules
    return lark


def write_calls(calls: Sequence[ToolCall], with_ids: bool = False) -> str:
    out = []
    for c in calls:
        try:
            args = json.loads(c.arguments)
        except json.JSONDecodeError:
            args = {}
        pairs = "".join(
            f"{KEY}{k}{KEY_END}\n{VALUE}{v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)}{VALUE_END}\n"
            for k, v in (args.items() if isinstance(args, dict) else ())
        )
        out.append(f"{OPEN}{c.name}\n{pairs}{CLOSE}")
    return "\n".join(out)


# (GLM's vocabulary has its argument tags as tokens too)
SYNTAX = CallSyntax(
    "glm45",
    Glm45Parser,
    grammar,
    write_calls,
    trigger=OPEN,
    shown_markers=(OPEN, CLOSE, KEY, KEY_END, VALUE, VALUE_END),
)
