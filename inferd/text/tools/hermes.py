"""Hermes / Qwen2.5 tool calls, the syntax of most templates with a `tools` variable (and the one a generic
template is taught): one block per call,

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

Given the request's tool names, a fenced ```json {"name": <a tool>, "arguments": {...}}``` block counts as a call
too (Qwen2.5-Coder answers "auto" that way).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence

from inferd.text.parsing import ToolDelta
from inferd.text.tools.base import JsonCallParser, ToolCall
from inferd.text.tools.grammar_rules import call_object, repeated
from inferd.text.tools.syntax import CallSyntax
from inferd.text.tools.validation import Tool

OPEN, CLOSE, FENCE = "<tool_call>", "</tool_call>", "```json"


class HermesParser(JsonCallParser):
    OPEN = OPEN

    def __init__(self, new_id: Callable[[], str], tool_names: Iterable[str] = ()):
        super().__init__(new_id, tool_names)
        self._fence = FENCE if self._tool_names else None

    def _opened(self, marker_text: str, marker: str) -> None:
        self._start_object(marker_text)
        self._fenced = marker == self._fence

    def _step(self, events: list[ToolDelta], final: bool) -> bool:
        if self._mode == "between":
            return self._step_between(final)
        return super()._step(events, final)

    def _step_between(self, final: bool) -> bool:
        """After a call's object: its closing marker (or fence), then text again."""
        buf = self._buf.lstrip()
        if self._fenced:
            if buf.startswith("```"):
                self._buf = buf[3:]
                self._fenced = False
                self._mode = "text"
                return True
            if not final and (not buf or "```".startswith(buf)):
                return False
            self._fenced = False
            self._mode = "text"
            return True
        if buf.startswith(CLOSE):
            self._buf = buf[len(CLOSE) :]
            self._mode = "text"
            return True
        if not final and (not buf or CLOSE.startswith(buf)):
            return False
        self._mode = "text"
        return True


def grammar(
    tools: Sequence[Tool], *, parallel: bool, trigger_token_id: int | None, markers: Mapping[str, int], call_ids: bool
) -> str:
    lark = "start: " + repeated("call", "\n", parallel) + "\n" + 'call: "<tool_call>\\n" obj "\\n</tool_call>"\n'
    return lark + "obj: " + call_object(tools, "arguments") + "\n"


def write_calls(calls: Sequence[ToolCall], with_ids: bool = False) -> str:
    return "\n".join(
        f'{OPEN}\n{{"name": {json.dumps(c.name, ensure_ascii=False)}, "arguments": {c.arguments}}}\n{CLOSE}'
        for c in calls
    )


SYNTAX = CallSyntax("hermes", HermesParser, grammar, write_calls, trigger=OPEN)
