"""Qwen3-Coder and Qwen3.5's XML tool calls: one block per call, each parameter's value as bare text,

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    </function>
    </tool_call>

The values are typed by the tool's schema (xml_args); the arguments go out as a JSON object. A value ends at its
`</parameter>` (or, where the model left that out, at the next `<parameter=` or `</function>`); one newline on
either side of it is the format's, not the value's.
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
FUNCTION, FUNCTION_END = "<function=", "</function>"
PARAM, PARAM_END = "<parameter=", "</parameter>"
_VALUE_ENDS = (PARAM_END, PARAM, FUNCTION_END)


class Qwen3CoderParser(XmlCallParser):
    OPEN = OPEN

    def _opened(self, marker_text: str, marker: str) -> None:
        self._mode, self._marker, self._consumed = "function", marker_text, ""

    def _step(self, events: list[ToolDelta], final: bool) -> bool:
        step = {
            "function": self._step_function,
            "params": self._step_params,
            "value": self._step_value,
            "close": self._step_close,
        }.get(self._mode)
        return step(events, final) if step else super()._step(events, final)

    def _step_function(self, events: list[ToolDelta], final: bool) -> bool:
        """`<function=NAME>`: the call starts once its name is complete; anything else was not a call."""
        rest = self._buf.lstrip()
        if not rest.startswith(FUNCTION):
            if FUNCTION.startswith(rest) and not final:
                return False
            return self._not_a_call(events)
        end = rest.find(">")
        if end < 0:
            name_so_far = rest[len(FUNCTION) :]
            if final or not TOOL_NAME.match(name_so_far or "a") or len(name_so_far) > 64:
                return self._not_a_call(events)
            return False
        name = rest[len(FUNCTION) : end]
        if not TOOL_NAME.match(name):
            return self._not_a_call(events)
        self._take(len(self._buf) - len(rest) + end + 1)
        self._begin(name, events)
        self._mode = "params"
        return True

    def _step_params(self, events: list[ToolDelta], final: bool) -> bool:
        args = self._args
        assert args is not None
        rest = self._buf.lstrip()
        if rest.startswith(PARAM):
            end = rest.find(">")
            if end < 0:
                if final:
                    return self._finish_call(events)
                return False
            args.open_param(rest[len(PARAM) : end].strip())
            self._send_args(args.text, events)
            self._buf = rest[end + 1 :]
            self._value_started = False
            self._mode = "value"
            return True
        if rest.startswith(FUNCTION_END):
            self._buf = rest[len(FUNCTION_END) :]
            self._end_call(events)
            self._mode = "close"
            return True
        if not final and any(m.startswith(rest) for m in (PARAM, FUNCTION_END)):
            return False
        return self._finish_call(events)  # text where a parameter belongs: the call ends there

    def _step_value(self, events: list[ToolDelta], final: bool) -> bool:
        args = self._args
        assert args is not None
        if not self._value_started:  # the newline after `<parameter=k>` is the format's
            if not self._buf and not final:
                return False
            if self._buf.startswith("\n"):
                self._buf = self._buf[1:]
            self._value_started = True
        found = first_marker(self._buf, _VALUE_ENDS, final)
        if found is None:
            if final:
                args.close_param(self._buf)
                self._buf = ""
                return self._finish_call(events)
            safe = self._buf[: len(self._buf) - held_back(self._buf, _VALUE_ENDS)]
            args.value_so_far(safe[:-1] if safe.endswith("\n") else safe)  # (a last newline may be the format's)
            self._send_args(args.text, events)
            return False
        at, marker = found
        raw = self._buf[:at]
        args.close_param(raw[:-1] if raw.endswith("\n") else raw)
        self._send_args(args.text, events)
        self._buf = self._buf[at + len(marker) :] if marker == PARAM_END else self._buf[at:]
        self._mode = "params"
        return True

    def _step_close(self, events: list[ToolDelta], final: bool) -> bool:
        rest = self._buf.lstrip()
        if rest.startswith(CLOSE):
            self._buf = rest[len(CLOSE) :]
        elif not final and CLOSE.startswith(rest):
            return False
        self._mode = "text"
        return True

    def _finish_call(self, events: list[ToolDelta]) -> bool:
        self._end_call(events)
        self._mode = "text"
        return True


def grammar(
    tools: Sequence[Tool], *, parallel: bool, trigger_token_id: int | None, markers: Mapping[str, int], call_ids: bool
) -> str:
    """Each call as the template writes one: the tool's parameters in its schema's order, each value valid against
    the parameter's schema; blocks separated by a newline when parallel."""
    open_, close = marker_lark(OPEN, markers), marker_lark(CLOSE, markers)
    lark = "start: " + ('call ("\\n" call)*' if parallel else "call") + "\n"
    lark += f'call: {open_} "\\n<function=" fn "</function>\\n" {close}\n'
    lark += "fn: " + " | ".join(f"fn_{i}" for i in range(len(tools))) + "\n"
    for i, t in enumerate(tools):

        def param(rule: str, key: str, schema: Any) -> str:
            head = json.dumps(f"{PARAM}{key}>\n", ensure_ascii=False)
            return f'{rule}: {head} {rule}_v "\\n"\n' + value_lark(f"{rule}_v", schema, "\n" + PARAM_END)

        seq, rules = params_lark(f"p_{i}", t.parameters, param)
        lark += f"fn_{i}: {json.dumps(t.name + '>' + chr(10))} {seq}\n" + rules
    return lark


def write_calls(calls: Sequence[ToolCall], with_ids: bool = False) -> str:
    out = []
    for c in calls:
        try:
            args = json.loads(c.arguments)
        except json.JSONDecodeError:
            args = {}
        params = "".join(
            f"<parameter={k}>\n{v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)}\n</parameter>\n"
            for k, v in (args.items() if isinstance(args, dict) else ())
        )
        out.append(f"{OPEN}\n{FUNCTION}{c.name}>\n{params}{FUNCTION_END}\n{CLOSE}")
    return "\n".join(out)


SYNTAX = CallSyntax("qwen3_coder", Qwen3CoderParser, grammar, write_calls, trigger=OPEN, shown_markers=(OPEN, CLOSE))
