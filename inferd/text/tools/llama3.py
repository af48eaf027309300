"""Llama 3.1+ JSON tool calls: `{"name": ..., "parameters": {...}}`, optionally after <|python_tag|>, several
separated by `;`. A reply that opens with a JSON object is a call; there is no single token that opens one, so
under tool_choice "auto" the calls are parsed but not constrained, and a JSON answer cannot be told from a call.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from inferd.text.parsing import ToolDelta
from inferd.text.tools.base import JsonCallParser, ToolCall
from inferd.text.tools.grammar_rules import call_object, repeated
from inferd.text.tools.syntax import CallSyntax
from inferd.text.tools.validation import Tool

PYTHON_TAG = "<|python_tag|>"


class Llama3Parser(JsonCallParser):
    OPEN = PYTHON_TAG

    def _bare_call(self, buf: str, final: bool) -> bool | None:
        if self._seen_text:
            return None
        stripped = buf.lstrip()
        if not stripped:
            return False
        if stripped.startswith("{"):  # Llama 3 answers a call with bare JSON
            self._buf = stripped
            self._start_object("")
            return True
        return None

    def _opened(self, marker_text: str, marker: str) -> None:
        self._start_object(marker_text)

    def _step(self, events: list[ToolDelta], final: bool) -> bool:
        if self._mode == "between":
            return self._step_between(final)
        return super()._step(events, final)

    def _step_between(self, final: bool) -> bool:
        """After a call's object: `;` and the next call, another object, or text again."""
        buf = self._buf.lstrip()
        if buf.startswith(";"):
            self._buf = buf[1:].lstrip()
            if self._buf.startswith("{"):
                self._start_object("")
                return True
            self._mode = "text"
            return True
        if buf.startswith("{"):
            self._buf = buf
            self._start_object("")
            return True
        if not final and not buf:
            return False
        self._mode = "text"
        return True


def grammar(
    tools: Sequence[Tool], *, parallel: bool, trigger_token_id: int | None, markers: Mapping[str, int], call_ids: bool
) -> str:
    return "start: " + repeated("obj", "; ", parallel) + "\n" + "obj: " + call_object(tools, "parameters") + "\n"


def write_calls(calls: Sequence[ToolCall], with_ids: bool = False) -> str:
    return "; ".join(
        f'{{"name": {json.dumps(c.name, ensure_ascii=False)}, "parameters": {c.arguments}}}' for c in calls
    )


SYNTAX = CallSyntax("llama3", Llama3Parser, grammar, write_calls, json_answer_is_distinct=False)
