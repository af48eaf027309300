"""Mistral's tool calls before tokenizer v11 (Mistral 7B v0.3, Nemo, Small 3.0): one JSON list after the marker,

    [TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}, ...]

A reply that opens with a list of objects is the call list even where the text does not show [TOOL_CALLS].
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from inferd.text.parsing import ToolDelta
from inferd.text.tools.base import JsonCallParser, ToolCall
from inferd.text.tools.grammar_rules import call_object, repeated
from inferd.text.tools.mistral_tokens import MARKERS, TOOL_CALLS, mistral_id, new_mistral_id
from inferd.text.tools.syntax import CallSyntax
from inferd.text.tools.validation import Tool, ToolError


class MistralParser(JsonCallParser):
    OPEN = TOOL_CALLS
    MODE_AFTER_CALL = MODE_AFTER_NOT_A_CALL = "list"

    def _bare_call(self, buf: str, final: bool) -> bool | None:
        if self._seen_text or self._calls:
            return None
        # [TOOL_CALLS] is a control token that the text may not show: a reply that opens with a list of objects
        # is the call list
        head = "".join(buf.split())[:2]
        if head in ("", "[") and not final:
            return False
        if head == "[{":
            self._buf = buf.lstrip()
            self._mode = "list"
            return True
        return None

    def _opened(self, marker_text: str, marker: str) -> None:
        self._mode = "list"

    def _step(self, events: list[ToolDelta], final: bool) -> bool:
        if self._mode == "list":
            return self._step_list(final)
        return super()._step(events, final)

    def _step_list(self, final: bool) -> bool:
        """Inside the list: its brackets and commas, each object a call; after `]`, text again."""
        buf = self._buf.lstrip()
        if buf.startswith(("[", ",")):
            self._buf = buf[1:]
            return True
        if buf.startswith("{"):
            self._buf = buf
            self._start_object("")
            return True
        if buf.startswith("]"):
            self._buf = buf[1:]
            self._mode = "text"
            return True
        if not buf and not final:
            return False
        self._mode = "text"
        return bool(buf)


def grammar(
    tools: Sequence[Tool], *, parallel: bool, trigger_token_id: int | None, markers: Mapping[str, int], call_ids: bool
) -> str:
    if trigger_token_id is None:
        raise ToolError("this model's vocabulary has no [TOOL_CALLS] token", "tools")
    lark = f'start: <[{trigger_token_id}]> " [" ' + repeated("obj", ", ", parallel) + ' "]"\n'
    return lark + "obj: " + call_object(tools, "arguments") + "\n"


def write_calls(calls: Sequence[ToolCall], with_ids: bool = False) -> str:
    objs = (f'{{"name": {json.dumps(c.name, ensure_ascii=False)}, "arguments": {c.arguments}}}' for c in calls)
    return f"{TOOL_CALLS} [" + ", ".join(objs) + "]"


SYNTAX = CallSyntax(
    "mistral",
    MistralParser,
    grammar,
    write_calls,
    trigger=TOOL_CALLS,
    shown_markers=MARKERS,
    new_id=new_mistral_id,
    template_call_id=mistral_id,
)
