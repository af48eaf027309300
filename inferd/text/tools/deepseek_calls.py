"""What DeepSeek's two tool-call forms share: their markers (tokens of DeepSeek's vocabulary, with full-width bars
and a "▁" for the space), the parser, and the grammar. The calls are a list between `<｜tool▁calls▁begin｜>` and
`<｜tool▁calls▁end｜>`, each between `<｜tool▁call▁begin｜>` and `<｜tool▁call▁end｜>`:

- V3 (and R1, its distills): `function<｜tool▁sep｜>NAME` then the arguments in a ```json fence;
- V3.1: `NAME<｜tool▁sep｜>{...}`, the arguments bare.

A call that opens with `<｜tool▁call▁begin｜>` alone (the list marker left out) is read as well.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence

from inferd.text.parsing import ContentDelta, ToolDelta
from inferd.text.tools.base import CallParser, ToolCall
from inferd.text.tools.grammar_rules import args_schema
from inferd.text.tools.scanner import JsonValue
from inferd.text.tools.validation import TOOL_NAME, Tool
from inferd.text.tools.xml_args import first_marker, marker_lark

CALLS_BEGIN, CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CALL_BEGIN, CALL_END, SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
MARKERS = (CALLS_BEGIN, CALLS_END, CALL_BEGIN, CALL_END, SEP)
FENCE, FENCE_END = "```json", "```"


class DeepSeekParser(CallParser):
    OPEN = CALLS_BEGIN
    FENCED = False  # V3: `function<｜tool▁sep｜>NAME\n```json ...```

    def __init__(self, new_id: Callable[[], str], tool_names: Iterable[str] = ()):
        super().__init__(new_id, tool_names)
        self._fence = CALL_BEGIN  # a call without the list's marker
        self._head = ""
        self._value: JsonValue | None = None

    def _opened(self, marker_text: str, marker: str) -> None:
        self._marker, self._head = marker_text, ""
        self._mode = "head" if marker == CALL_BEGIN else "list"

    def _step(self, events: list[ToolDelta], final: bool) -> bool:
        step = {"list": self._step_list, "head": self._step_head, "args": self._step_args, "end": self._step_end}
        if self._mode in step:
            return step[self._mode](events, final)
        return super()._step(events, final)

    def _step_list(self, events: list[ToolDelta], final: bool) -> bool:
        """Between calls: the next call, or the list's end."""
        rest = self._buf.lstrip()
        for marker, mode in ((CALL_BEGIN, "head"), (CALLS_END, "text")):
            if rest.startswith(marker):
                self._buf, self._mode, self._head = rest[len(marker) :], mode, ""
                return True
        if not final and any(m.startswith(rest) for m in (CALL_BEGIN, CALLS_END)):
            return False
        if not self._calls:  # the list's marker and no call after it
            events.append(ContentDelta(self._marker))
        self._mode = "text"
        return True

    def _step_head(self, events: list[ToolDelta], final: bool) -> bool:
        """What comes before the arguments: the name (V3: the type, the separator, then the name's line)."""
        self._head += self._buf
        self._buf = ""
        sep = self._head.find(SEP)
        if sep >= 0 and self.FENCED:
            line_end = self._head.find("\n", sep)
            if line_end < 0 and not final:
                return False
            name = self._head[sep + len(SEP) : line_end if line_end >= 0 else len(self._head)].strip()
            after = self._head[line_end + 1 :] if line_end >= 0 else ""
        elif sep >= 0:
            name, after = self._head[:sep].strip(), self._head[sep + len(SEP) :]
        else:
            if final or len(self._head) > 128 + len(SEP):
                return self._not_a_call(events)
            return False
        if not TOOL_NAME.match(name):
            return self._not_a_call(events)
        self._buf, self._head = after, ""
        self._start_call(name, events)
        self._seen_text_since_call = False
        self._value = JsonValue()
        self._mode = "args"
        return True

    def _step_args(self, events: list[ToolDelta], final: bool) -> bool:
        if self.FENCED and self._value is not None and not self._value.raw:
            rest = self._buf.lstrip()
            if rest.startswith(FENCE):
                self._buf = rest[len(FENCE) :]
            elif not final and FENCE.startswith(rest):
                return False
        value = self._value
        assert value is not None
        taken = value.feed(self._buf)
        self._buf = self._buf[taken:]
        self._send_args(value.raw if value.raw or not (final or value.done) else "{}", events)
        if value.done or final:
            self._value = None
            self._mode = "end"
            return True
        return False

    def _step_end(self, events: list[ToolDelta], final: bool) -> bool:
        """After the arguments: the fence's end (V3), then the call's end marker."""
        found = first_marker(self._buf, (CALL_END, CALLS_END, CALL_BEGIN), final)
        if found is None:
            if final:
                self._buf = ""
            return False
        at, marker = found
        self._buf = self._buf[at + len(marker) :] if marker == CALL_END else self._buf[at:]
        self._mode = "list"
        return True

    def _not_a_call(self, events: list[ToolDelta]) -> bool:
        events.append(ContentDelta(self._marker + self._head))
        self._head, self._mode = "", "text"
        self._seen_text = True
        return False


def grammar(tools: Sequence[Tool], *, parallel: bool, markers: Mapping[str, int], fenced: bool) -> str:
    """The list of calls (one, or several with parallel), each tool's arguments valid against its schema; the
    markers as the vocabulary's tokens where it has them."""
    m = {k: marker_lark(k, markers) for k in MARKERS}
    lark = f"start: {m[CALLS_BEGIN]} " + ("call+" if parallel else "call") + f" {m[CALLS_END]}\n"
    lark += f"call: {m[CALL_BEGIN]} fn {m[CALL_END]}\n"
    lark += "fn: " + " | ".join(f"fn_{i}" for i in range(len(tools))) + "\n"
    for i, t in enumerate(tools):
        if fenced:
            lark += f'fn_{i}: "function" {m[SEP]} {json.dumps(t.name + chr(10) + FENCE + chr(10))} args_{i} '
            lark += json.dumps("\n" + FENCE_END) + "\n"
        else:
            lark += f"fn_{i}: {json.dumps(t.name)} {m[SEP]} args_{i}\n"
        lark += f"args_{i}: %json " + json.dumps(args_schema(t)) + "\n"
    return lark


def write_calls(calls: Sequence[ToolCall], fenced: bool) -> str:
    if not calls:
        return ""
    if fenced:
        body = "".join(
            f"{CALL_BEGIN}function{SEP}{c.name}\n{FENCE}\n{c.arguments}\n{FENCE_END}{CALL_END}" for c in calls
        )
    else:
        body = "".join(f"{CALL_BEGIN}{c.name}{SEP}{c.arguments}{CALL_END}" for c in calls)
    return CALLS_BEGIN + body + CALLS_END
