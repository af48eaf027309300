"""OpenAI's harmony format (gpt-oss): the output is a run of messages, each a header, `<|message|>`, a body and a
terminator, and the header's channel says what the body is:

    <|channel|>analysis<|message|>THINKING<|end|>
    <|start|>assistant<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{"a": 1}<|call|>
    <|start|>assistant<|channel|>final<|message|>ANSWER<|return|>

analysis is the thinking (ReasoningDelta); final, and commentary without a recipient (a preamble meant for the
user), are the answer (ContentDelta); a body addressed `to=functions.NAME` (in the header before or after the
channel) is a tool call (ToolCallStart, then its arguments as ToolArgsDelta, exactly as written). The markup
itself never comes out. The prompt ends with `<|start|>assistant`, so the output opens with the first header; an
output that does not open with one (a model that ignores the format) is all answer.

The markers are control tokens: the tokenizer must show them in the decoded text (SHOWN_TOKENS) for this parser
to see them, which is why the format is told apart by its template and not by the text.

Calls are constrained as the other formats' are, by a grammar whose markers are token ids. A call ends the turn
(`<|call|>` is an end-of-generation token), so a turn holds one call: parallel calls come one turn each. Every
message opens with `<|channel|>`, so no single token tells a call from the answer: "auto" is parsed but not
constrained (as Llama 3's JSON calls are), "required" and a named function are constrained from the first token.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence

from inferd.text.parsing import ContentDelta, Delta, ReasoningDelta, ToolArgsDelta, ToolCallStart
from inferd.text.tools.base import ToolCall, new_call_id
from inferd.text.tools.grammar_rules import args_schema
from inferd.text.tools.syntax import CallSyntax
from inferd.text.tools.validation import Tool, ToolError

START, CHANNEL, MESSAGE, CONSTRAIN = "<|start|>", "<|channel|>", "<|message|>", "<|constrain|>"
END, CALL, RETURN = "<|end|>", "<|call|>", "<|return|>"
TERMINATORS = (END, CALL, RETURN, START)  # a body ends at any of them (START: a model that forgot its <|end|>)
SHOWN_TOKENS = (START, CHANNEL, MESSAGE, CONSTRAIN, END, CALL, RETURN)
HEADER_OPENINGS = (CHANNEL, START, " to=", "to=", CONSTRAIN)
MAX_HEADER = 512  # a header longer than this is not one: the rest is answer text
FUNCTIONS = "functions."
_RECIPIENT = re.compile(r"to=([^\s<]+)")
_CHANNEL = re.compile(re.escape(CHANNEL) + r"\s*([A-Za-z_]+)")


def is_harmony_template(template: str | None) -> bool:
    src = template or ""
    return CHANNEL in src and MESSAGE in src


class HarmonyParser:
    """An OutputParser (inferd.text.parsing) for harmony output; `calls` holds the tool calls it has parsed."""

    def __init__(self, new_id: Callable[[], str] = new_call_id):
        self.new_id = new_id
        self.state = "header"  # header | body | plain
        self.held = ""
        self.channel: str | None = None
        self.recipient: str | None = None
        self.calls: list[ToolCall] = []
        self.messages = 0  # headers read so far

    def feed(self, text: str, token_ids: Sequence[int] = ()) -> list[Delta]:
        self.held += text
        out: list[Delta] = []
        while True:
            before = (self.state, len(self.held))
            if self.state == "header":
                self._header()
            elif self.state == "body":
                self._body(out, final=False)
            elif self.held:
                out.append(ContentDelta(self.held))
                self.held = ""
            if (self.state, len(self.held)) == before:
                return out

    def finish(self) -> list[Delta]:
        out: list[Delta] = []
        if self.state == "body":
            self._body(out, final=True)
        elif self.state == "plain" or (self.state == "header" and self.messages == 0):
            if self.held.strip():
                out.append(ContentDelta(self.held))
        self.held = ""
        return out

    def _header(self) -> None:
        lead = self.held.lstrip()
        if not lead:
            return
        if self.messages == 0 and not any(o.startswith(lead[: len(o)]) for o in HEADER_OPENINGS):
            self.state = "plain"  # the model ignored the format
            return
        end = self.held.find(MESSAGE)
        if end < 0:
            if len(self.held) > MAX_HEADER:
                self.state = "plain"
            return
        header, self.held = self.held[:end], self.held[end + len(MESSAGE) :]
        channel = _CHANNEL.search(header)
        recipient = _RECIPIENT.search(header)
        self.channel = channel.group(1) if channel else None
        self.recipient = recipient.group(1) if recipient else None
        self.messages += 1
        self.state = "body"
        if self.recipient is not None and self.is_call:
            self.calls.append(ToolCall(self.new_id(), self.recipient.removeprefix(FUNCTIONS), ""))

    @property
    def is_call(self) -> bool:
        return self.recipient is not None and self.recipient != "assistant"

    def _body(self, out: list[Delta], final: bool) -> None:
        cut = min((i for i in (self.held.find(t) for t in TERMINATORS) if i >= 0), default=-1)
        if cut >= 0:
            self._emit(out, self.held[:cut])
            rest = self.held[cut:]
            for t in (END, CALL, RETURN):
                if rest.startswith(t):
                    rest = rest[len(t) :]
                    break
            self.held, self.state = rest, "header"
            self._close_call(out)
            return
        keep = 0 if final else _partial_marker(self.held)
        self._emit(out, self.held[: len(self.held) - keep])
        self.held = self.held[len(self.held) - keep :]
        if final:
            self._close_call(out)

    def _emit(self, out: list[Delta], text: str) -> None:
        if not text:
            return
        if self.is_call:
            call = self.calls[-1]
            if not call.arguments:
                out.append(ToolCallStart(len(self.calls) - 1, call.id, call.name))
            call.arguments += text
            out.append(ToolArgsDelta(len(self.calls) - 1, text))
        elif self.channel == "analysis":
            out.append(ReasoningDelta(text))
        else:
            out.append(ContentDelta(text))

    def _close_call(self, out: list[Delta]) -> None:
        """A call whose body was empty still comes out, with `{}` for its arguments."""
        if self.is_call and not self.calls[-1].arguments:
            self._emit(out, "{}")
        self.recipient = None


def _partial_marker(text: str) -> int:
    """Length of the end of `text` that could still become a terminator (from its last `<|` or a lone `<`)."""
    at = text.rfind("<")
    if at < 0:
        return 0
    tail = text[at:]
    return len(tail) if any(t.startswith(tail) for t in TERMINATORS) else 0


# ---- the registry's record: the call grammar --------------------------------------------------------------

MARKERS = (START, CHANNEL, MESSAGE, CONSTRAIN, END, CALL)


def parser(new_id: Callable[[], str], tool_names: Iterable[str] = ()) -> HarmonyParser:
    return HarmonyParser(new_id)


def grammar(
    tools: Sequence[Tool], *, parallel: bool, trigger_token_id: int | None, markers: Mapping[str, int], call_ids: bool
) -> str:
    """An optional analysis message, then one call of one of `tools` with arguments per its schema."""
    missing = [m for m in MARKERS if m not in markers]
    if missing:
        raise ToolError(f"this model's vocabulary has no {missing[0]} token", "tools")
    tok = {m: f"<[{markers[m]}]>" for m in MARKERS}
    lark = "start: thinking? call\n"
    lark += f'thinking: {tok[CHANNEL]} "analysis" {tok[MESSAGE]} THOUGHT {tok[END]} {tok[START]} "assistant"\n'
    lark += "THOUGHT: /(?s:.*)/\n"
    lark += f'call: {tok[CHANNEL]} "commentary to=functions." (' + " | ".join(f"fn_{i}" for i in range(len(tools)))
    lark += ")\n"
    for i, t in enumerate(tools):
        lark += f'fn_{i}: {json.dumps(t.name)} " " {tok[CONSTRAIN]} "json" {tok[MESSAGE]} args_{i} {tok[CALL]}\n'
        lark += f"args_{i}: %json " + json.dumps(args_schema(t)) + "\n"
    return lark


def write_calls(calls: Sequence[ToolCall], with_ids: bool = False) -> str:
    return "".join(
        f"{CHANNEL}commentary to=functions.{c.name} {CONSTRAIN}json{MESSAGE}{c.arguments}{CALL}" for c in calls
    )


SYNTAX = CallSyntax("harmony", parser, grammar, write_calls, shown_markers=MARKERS, json_answer_is_distinct=False)
