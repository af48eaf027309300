"""What every tool-call format's parser is built on: the call record, call ids, and two base classes.

CallParser is the text mode every format shares: it looks for the format's opening marker (OPEN), hands out the
text before it as content, and holds back a tail that may still become the marker (and trailing whitespace,
dropped when a call follows: whitespace next to a call is not content). When the marker arrives the format takes
over (`_opened`) and runs its own modes; a subclass's `_step` handles its modes and passes the rest up. A format
whose calls may open without the marker (Llama 3's bare JSON, Mistral's unshown control token) says so in
`_bare_call`.

JsonCallParser adds the mode that reads one JSON call object (scanner.CallObject): the call starts once its name
is complete, then its arguments stream out as written; an object that never names a call goes back out as text.
"""

from __future__ import annotations

import secrets
import string
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from inferd.text.parsing import ContentDelta, ToolArgsDelta, ToolCallStart, ToolDelta
from inferd.text.tools.scanner import CallObject, partial_suffix


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text, exactly as the model wrote it

    def as_openai(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


def new_call_id() -> str:
    alphabet = string.ascii_letters + string.digits
    return "call_" + "".join(secrets.choice(alphabet) for _ in range(24))


class CallParser:
    """Feed the model's output text piece by piece; get back content deltas and tool-call deltas (a call's index,
    id and name first, then fragments of its arguments). The modes step until one needs more text."""

    OPEN = ""  # the text that opens a call
    # tool name -> its parameters schema, for formats whose values are bare text typed by the schema (ToolCallParser
    # sets it; the JSON formats ignore it)
    param_schemas: Mapping[str, Mapping[str, Any]] = {}

    def __init__(self, new_id: Callable[[], str], tool_names: Iterable[str] = ()):
        self._new_id = new_id
        self._tool_names = frozenset(tool_names)
        self._fence: str | None = None  # a second opening marker (Hermes' ```json, given tool names)
        self._buf = ""  # text not yet handed out
        self._mode = "text"
        self._calls: list[ToolCall] = []
        self._sent_args = 0  # how much of the current call's arguments went out
        self._seen_text = False
        self._seen_text_since_call = False
        self._marker = ""  # the marker (with the whitespace before it) to give back if no call follows

    @property
    def calls(self) -> list[ToolCall]:
        return self._calls

    def feed(self, text: str, token_ids: Sequence[int] = ()) -> list[ToolDelta]:
        self._buf += text
        events: list[ToolDelta] = []
        while self._step(events, final=False):
            pass
        return events

    def finish(self) -> list[ToolDelta]:
        events: list[ToolDelta] = []
        while self._step(events, final=True):
            pass
        self._flush(events)
        if self._buf:
            events.append(ContentDelta(self._buf))
            self._buf = ""
        return events

    # -- what a format fills in
    def _step(self, events: list[ToolDelta], final: bool) -> bool:
        """One step of the current mode; True when it made progress and may go on."""
        if self._mode == "text":
            return self._step_text(events, final)
        raise AssertionError(f"{type(self).__name__} has no mode {self._mode!r}")

    def _opened(self, marker_text: str, marker: str) -> None:
        """The marker arrived (the text after it is in _buf); marker_text is it with the whitespace before it."""
        raise NotImplementedError

    def _bare_call(self, buf: str, final: bool) -> bool | None:
        """Before looking for the marker: a decision (the _step result) for a call that opens without one, or None."""
        return None

    def _flush(self, events: list[ToolDelta]) -> None:
        """At the end of the output, after the last steps: what an unfinished call still has to give."""

    # -- shared by the formats
    def _start_call(self, name: str, events: list[ToolDelta]) -> None:
        self._calls.append(ToolCall(self._new_id(), name, ""))
        events.append(ToolCallStart(len(self._calls) - 1, self._calls[-1].id, name))
        self._sent_args = 0

    def _send_args(self, text: str, events: list[ToolDelta]) -> None:
        """text: the current call's arguments so far; what of it has not gone out goes out."""
        if len(text) > self._sent_args:
            piece = text[self._sent_args :]
            self._sent_args = len(text)
            self._calls[-1].arguments += piece
            events.append(ToolArgsDelta(len(self._calls) - 1, piece))

    def _step_text(self, events: list[ToolDelta], final: bool) -> bool:
        buf = self._buf
        if not buf:
            return False
        bare = self._bare_call(buf, final)
        if bare is not None:
            return bare
        at, marker = buf.find(self.OPEN), self.OPEN
        fence_at = buf.find(self._fence) if self._fence else -1
        if self._fence and fence_at >= 0 and (at < 0 or fence_at < at):
            at, marker = fence_at, self._fence
        if at >= 0:
            before = buf[:at].rstrip()  # whitespace next to a call is not content
            if before.strip():
                events.append(ContentDelta(before))
                self._seen_text = True
            self._buf = buf[at + len(marker) :]
            self._opened(buf[len(before) : at] + marker, marker)  # (given back as text if no call follows)
            return True
        if final:
            if buf.strip() or not self._calls:
                events.append(ContentDelta(buf if not self._calls else buf.strip()))
            self._buf = ""
            return False
        # hold back what may still become the marker, and trailing whitespace (dropped if a call follows)
        keep = max(partial_suffix(buf, self.OPEN), partial_suffix(buf, self._fence) if self._fence else 0)
        head = buf[: len(buf) - keep]
        keep += len(head) - len(head.rstrip())
        out = buf[: len(buf) - keep]
        if out.strip():
            if self._calls and not self._seen_text_since_call:
                out = out.lstrip()
            events.append(ContentDelta(out))
            self._seen_text = True
            self._seen_text_since_call = True
            self._buf = buf[len(buf) - keep :]
        return False


class JsonCallParser(CallParser):
    """Formats whose calls are JSON objects with a name and arguments ("arguments" or "parameters")."""

    MODE_AFTER_CALL = "between"  # where a finished call leaves the parser
    MODE_AFTER_NOT_A_CALL = "text"  # ... and an object that was no call

    def __init__(self, new_id: Callable[[], str], tool_names: Iterable[str] = ()):
        super().__init__(new_id, tool_names)
        self._obj: CallObject | None = None
        self._started = False  # the current object's call went out
        self._fenced = False  # the current object opened with the fence

    def _step(self, events: list[ToolDelta], final: bool) -> bool:
        if self._mode == "call":
            return self._step_call(events)
        return super()._step(events, final)

    def _flush(self, events: list[ToolDelta]) -> None:
        if self._obj is not None and not self._obj.done and self._started:
            self._emit_args(events, final=True)  # an unfinished call (length limit): what there is
        elif self._obj is not None and not self._started:
            events.append(ContentDelta(self._marker + self._obj.raw))  # never became a call
        self._obj = None

    def _start_object(self, marker: str) -> None:
        self._marker = marker
        self._fenced = False
        self._seen_text_since_call = False
        self._obj = CallObject()
        self._started = False
        self._sent_args = 0
        self._mode = "call"

    def _step_call(self, events: list[ToolDelta]) -> bool:
        obj = self._obj
        assert obj is not None
        if not self._buf:
            return False
        taken = obj.feed(self._buf)
        self._buf = self._buf[taken:]
        if not self._started and obj.name is not None and (not self._fenced or obj.name in self._tool_names):
            self._start_call(obj.name, events)
            self._started = True
        if self._started:
            self._emit_args(events, final=obj.done)
        if obj.done:
            self._obj = None
            if not self._started:  # not a call after all: it was text
                events.append(ContentDelta(self._marker + obj.raw))
                self._mode = self.MODE_AFTER_NOT_A_CALL
                return True
            self._mode = self.MODE_AFTER_CALL
            return True
        return False

    def _emit_args(self, events: list[ToolDelta], final: bool) -> None:
        obj = self._obj
        assert obj is not None
        text = obj.arguments_so_far()
        if final and obj.args_start is None:
            text = "{}"
        self._send_args(text, events)
