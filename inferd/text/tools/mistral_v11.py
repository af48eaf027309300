"""Mistral's tool calls from tokenizer v11 on (Mistral Small 3.1/3.2, Devstral, Magistral, Ministral 3): the
marker repeated before every call, the name in plain text, the arguments one JSON value,

    [TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}

and, in templates that want ids (Mistral Small 3.2), `[TOOL_CALLS]name[CALL_ID]id[ARGS]{...}` with a 9-character
alphanumeric id. The markers are control tokens, and the grammar matches them as token ids, so the text `[ARGS]`
cannot stand in for the token.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence

from inferd.text.parsing import ContentDelta, ToolDelta
from inferd.text.tools.base import CallParser, ToolCall
from inferd.text.tools.grammar_rules import args_schema
from inferd.text.tools.mistral_tokens import ARGS, CALL_ID, ID_LEN, MARKERS, TOOL_CALLS, mistral_id, new_mistral_id
from inferd.text.tools.scanner import JsonValue, partial_suffix
from inferd.text.tools.syntax import CallSyntax
from inferd.text.tools.validation import TOOL_NAME, Tool, ToolError


class MistralV11Parser(CallParser):
    OPEN = TOOL_CALLS

    def __init__(self, new_id: Callable[[], str], tool_names: Iterable[str] = ()):
        super().__init__(new_id, tool_names)
        self._head = ""  # the text after [TOOL_CALLS] until [ARGS]
        self._value: JsonValue | None = None

    def _opened(self, marker_text: str, marker: str) -> None:
        # (the whitespace before the marker is kept to give back if it is not a call)
        self._mode, self._head, self._marker = "head", "", marker_text

    def _step(self, events: list[ToolDelta], final: bool) -> bool:
        if self._mode == "head":
            return self._step_head(events, final)
        if self._mode == "args":
            return self._step_args(events, final)
        return super()._step(events, final)

    def _step_head(self, events: list[ToolDelta], final: bool) -> bool:
        """Reads the name (and an id the model wrote) up to [ARGS]; the call starts there. A name that is not a
        name, or text that ends before [ARGS], was not a call: it goes back out as content."""
        self._head += self._buf
        self._buf = ""
        at_args, at_id = self._head.find(ARGS), self._head.find(CALL_ID)
        name_end = min(i for i in (at_args, at_id, len(self._head)) if i >= 0)
        name = self._head[:name_end].strip()
        undecided = name_end == len(self._head)
        if undecided:  # the name may go on, or a marker may be arriving
            keep = max(partial_suffix(self._head, ARGS), partial_suffix(self._head, CALL_ID))
            name = self._head[: len(self._head) - keep].strip()
        if (name and not TOOL_NAME.match(name)) or (final and at_args < 0):
            events.append(ContentDelta(self._marker + self._head))
            self._head, self._mode = "", "text"
            self._seen_text = True
            return False
        if at_args < 0:
            return False
        self._buf = self._head[at_args + len(ARGS) :]
        self._head = ""
        self._start_call(name, events)
        self._seen_text_since_call = False
        self._value = JsonValue()
        self._mode = "args"
        return True

    def _step_args(self, events: list[ToolDelta], final: bool) -> bool:
        value = self._value
        assert value is not None
        taken = value.feed(self._buf)
        self._buf = self._buf[taken:]
        self._send_args(value.raw if value.raw or not (final or value.done) else "{}", events)
        if value.done or final:
            self._value = None
            self._mode = "text"
            return bool(self._buf)
        return False


def grammar(
    tools: Sequence[Tool], *, parallel: bool, trigger_token_id: int | None, markers: Mapping[str, int], call_ids: bool
) -> str:
    """`[TOOL_CALLS]name([CALL_ID]id)?[ARGS]{args per the tool's schema}`, once or (parallel) repeated; the markers
    are the vocabulary's tokens (markers: mistral_tokens.marker_ids)."""
    for m in (TOOL_CALLS, ARGS) + ((CALL_ID,) if call_ids else ()):
        if m not in markers:
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


def write_calls(calls: Sequence[ToolCall], with_ids: bool = False) -> str:
    return "".join(TOOL_CALLS + c.name + (CALL_ID + c.id if with_ids else "") + ARGS + c.arguments for c in calls)


SYNTAX = CallSyntax(
    "mistral_v11",
    MistralV11Parser,
    grammar,
    write_calls,
    trigger=TOOL_CALLS,
    shown_markers=MARKERS,
    new_id=new_mistral_id,
    template_call_id=mistral_id,
)
