"""Tool calling: OpenAI `tools` and tool messages into the chat template, the model's tool-call syntax back into
OpenAI `tool_calls` (whole or as streaming deltas), and the grammars that make a call valid by construction.

Syntaxes (chosen from the chat template's text, `detect_format`):
- hermes (Qwen2.5, Hermes, and most templates with a `tools` variable): `<tool_call>\\n{"name": ..., "arguments":
  {...}}\\n</tool_call>`, one block per call;
- llama3 (Llama 3.1+ JSON tool calling): `{"name": ..., "parameters": {...}}`, optionally after <|python_tag|>,
  several separated by `;`;
- mistral: `[TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]` (before Mistral's tokenizer v11);
- mistral_v11: `[TOOL_CALLS]name[ARGS]{...}` per call, `[TOOL_CALLS]name[CALL_ID]id[ARGS]{...}` where the template
  wants ids (mistral_tools.py: the markers are control tokens kept in the text, ids are 9 alphanumerics);
- generic (a template that knows nothing of tools): the tools are rendered in a system block (GENERIC_TOOLS_BLOCK)
  that asks for the hermes syntax; past calls and results are written into the conversation as that syntax.

Grammars: `tool_choice` "required" or a named function constrains the whole output to one call (or several,
with parallel_tool_calls) whose arguments are valid against the function's parameters schema. "auto" lets the
model write text; from the format's trigger token on (hermes <tool_call>, mistral [TOOL_CALLS], single tokens)
the same call grammar applies (a lazy grammar: LazyMatcher). Llama 3's JSON calls have no trigger token, so "auto"
is parsed but not constrained there.
"""

from __future__ import annotations

import json
import re
import secrets
import string
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import llguidance as llg
import numpy as np

from inferd.text.grammar import JSON_WHITESPACE, CompiledGrammar, GrammarError, GrammarSpec, SequenceMatcher
from inferd.text.mistral_tools import (
    ARGS,
    CALL_ID,
    TOOL_CALLS,
    JsonValue,
    marker_ids,
    mistral_id,
    new_mistral_id,
    v11_grammar_lark,
)

HERMES, LLAMA3, MISTRAL, MISTRAL_V11, GENERIC = "hermes", "llama3", "mistral", "mistral_v11", "generic"

GENERIC_TOOLS_BLOCK = (
    "# Tools\n\nYou may call one or more functions to assist with the user query. The functions, as JSON "
    "signatures, are within <tools></tools>:\n<tools>\n{tools}\n</tools>\n\nTo call a function, answer with one "
    "<tool_call></tool_call> block per call, each holding a JSON object with the function's name and arguments:\n"
    '<tool_call>\n{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>'
)

_NAME = re.compile(r"^[a-zA-Z0-9_.-]{1,64}$")


class ToolError(GrammarError):
    """A bad `tools`/`tool_choice`/tool message; `param` names the field."""


@dataclass(frozen=True)
class Tool:
    name: str
    description: str | None
    parameters: Mapping[str, Any]
    strict: bool = False

    def as_openai(self) -> dict[str, Any]:
        fn: dict[str, Any] = {"name": self.name}
        if self.description is not None:
            fn["description"] = self.description
        fn["parameters"] = dict(self.parameters)
        return {"type": "function", "function": fn}


@dataclass(frozen=True)
class ToolFormat:
    name: str  # hermes | llama3 | mistral | mistral_v11 | generic
    template_renders_tools: bool  # the template takes `tools` and tool messages itself
    call_ids: bool = False  # mistral_v11: calls carry [CALL_ID]id before [ARGS]

    @property
    def is_mistral(self) -> bool:
        return self.name in (MISTRAL, MISTRAL_V11)


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text, exactly as the model wrote it

    def as_openai(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


# ---- request validation ---------------------------------------------------------------------------------------
def parse_tools(tools: Any, param: str = "tools") -> list[Tool]:
    """OpenAI's `tools` (type "function" only) -> Tools; ToolError naming the bad entry."""
    if tools is None:
        return []
    if not isinstance(tools, Sequence) or isinstance(tools, (str, bytes)):
        raise ToolError(f"{param} must be a list of tools", param)
    out: list[Tool] = []
    for i, t in enumerate(tools):
        where = f"{param}[{i}]"
        if not isinstance(t, Mapping) or t.get("type") != "function":
            raise ToolError(f'{where} must be {{"type": "function", "function": {{...}}}}', f"{where}.type")
        fn = t.get("function")
        if not isinstance(fn, Mapping):
            raise ToolError(f"{where}.function must be an object with a name", f"{where}.function")
        name = fn.get("name")
        if not isinstance(name, str) or not _NAME.match(name):
            raise ToolError(
                f"{where}.function.name must be 1-64 letters, digits, '_', '.' or '-', got {name!r}",
                f"{where}.function.name",
            )
        params = fn.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(params, Mapping):
            raise ToolError(f"{where}.function.parameters must be a JSON schema object", f"{where}.function.parameters")
        desc = fn.get("description")
        if desc is not None and not isinstance(desc, str):
            raise ToolError(f"{where}.function.description must be a string", f"{where}.function.description")
        if any(o.name == name for o in out):
            raise ToolError(f"{where}.function.name {name!r} is given twice", f"{where}.function.name")
        out.append(Tool(name, desc, params, bool(fn.get("strict", False))))
    return out


def parse_tool_choice(choice: Any, tools: Sequence[Tool], param: str = "tool_choice") -> tuple[str, str | None]:
    """("none" | "auto" | "required", the forced function's name or None). Without tools: ("none", None)."""
    if choice is None:
        return ("auto" if tools else "none"), None
    if isinstance(choice, str):
        if choice not in ("none", "auto", "required"):
            raise ToolError(f"{param} must be none, auto, required or a named function, got {choice!r}", param)
        if choice != "none" and not tools:
            raise ToolError(f"{param} {choice!r} needs tools", param)
        return choice, None
    fn = choice.get("function") if isinstance(choice, Mapping) and choice.get("type") == "function" else None
    name = fn.get("name") if isinstance(fn, Mapping) else None
    if not isinstance(name, str):
        raise ToolError(
            f'{param} must be none, auto, required or {{"type": "function", "function": {{"name": ...}}}}', param
        )
    if not any(t.name == name for t in tools):
        raise ToolError(f"{param} names function {name!r}, which is not among the tools", f"{param}.function.name")
    return "required", name


# ---- the template's format and the conversation -------------------------------------------------------------------
def detect_format(template: str | None, token_id_of: Callable[[str], int | None] | None = None) -> ToolFormat:
    """The tool-call syntax from the chat template's text (and, for Mistral, the vocabulary's control tokens)."""
    src = template or ""
    renders = "tools" in src
    if TOOL_CALLS in src:
        vocab = marker_ids(token_id_of) if token_id_of is not None else {}
        if ARGS in src or (ARGS in vocab and "[{" not in src and '"arguments"' not in src):
            return ToolFormat(MISTRAL_V11, renders, call_ids=CALL_ID in src)
        return ToolFormat(MISTRAL, renders)
    if "<tool_call>" in src:
        return ToolFormat(HERMES, renders)
    if "<|python_tag|>" in src or ("ipython" in src and "parameters" in src):
        return ToolFormat(LLAMA3, renders)
    return ToolFormat(HERMES if renders else GENERIC, renders)


def prepare_messages(
    messages: Sequence[Mapping[str, Any]], fmt: ToolFormat, tools: Sequence[Tool] = ()
) -> list[dict[str, Any]]:
    """The conversation as the template expects it.

    Templates that render tools get assistant tool_calls with `arguments` as an object (they `tojson` it) and tool
    messages with their function's `name` filled in from the call they answer. A generic template gets the tools
    in a system block and the calls/results written as hermes-syntax text (tool results as user turns)."""
    names: dict[str, str] = {}
    out: list[dict[str, Any]] = []
    fix_id = mistral_id if fmt.is_mistral else str  # Mistral's templates accept only 9-character ids
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping):
            raise ToolError(f"messages[{i}] must be an object", f"messages[{i}]")
        msg = dict(m)
        role = msg.get("role")
        if role == "assistant" and msg.get("tool_calls"):
            calls = []
            for j, tc in enumerate(msg["tool_calls"]):
                fn = tc.get("function") if isinstance(tc, Mapping) else None
                if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
                    raise ToolError(
                        f"messages[{i}].tool_calls[{j}] must have function.name", f"messages[{i}].tool_calls[{j}]"
                    )
                args = fn.get("arguments", "{}")
                try:
                    args_obj = json.loads(args) if isinstance(args, str) else args
                except json.JSONDecodeError:
                    args_obj = args
                call_id = fix_id(str(tc["id"])) if tc.get("id") else None
                if call_id:
                    names[call_id] = fn["name"]
                calls.append(
                    {"id": call_id, "type": "function", "function": {"name": fn["name"], "arguments": args_obj}}
                )
            msg["tool_calls"] = calls
        elif role == "tool":
            msg["content"] = _text(msg.get("content"), i)
            if msg.get("tool_call_id"):
                msg["tool_call_id"] = fix_id(str(msg["tool_call_id"]))
            if "name" not in msg and msg.get("tool_call_id") in names:
                msg["name"] = names[msg["tool_call_id"]]
        out.append(msg)
    if fmt.template_renders_tools:
        return out
    return _generic_conversation(out, tools)


def shown_tokens(fmt: ToolFormat, token_id_of: Callable[[str], int | None]) -> frozenset[int]:
    """Control tokens that the output text must keep for the parser to see the calls (Mistral's markers)."""
    return frozenset(marker_ids(token_id_of).values()) if fmt.is_mistral else frozenset()


def template_tools(tools: Sequence[Tool], fmt: ToolFormat) -> list[dict[str, Any]] | None:
    """What to pass as the template's `tools` variable (None for a generic template: the block carries them)."""
    return [t.as_openai() for t in tools] if fmt.template_renders_tools and tools else None


def _text(content: Any, index: int) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list) and all(isinstance(p, Mapping) and p.get("type") == "text" for p in content):
        return "".join(str(p.get("text", "")) for p in content)
    raise ToolError(f"messages[{index}].content must be a string or a list of text parts", f"messages[{index}].content")


def _generic_conversation(messages: list[dict[str, Any]], tools: Sequence[Tool]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for m in messages:
        if m.get("role") == "assistant" and m.get("tool_calls"):
            calls = [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]} for c in m["tool_calls"]]
            blocks = "".join(f"\n<tool_call>\n{json.dumps(c, ensure_ascii=False)}\n</tool_call>" for c in calls)
            content = m.get("content") or ""
            out.append({"role": "assistant", "content": (content + blocks).strip("\n")})
        elif m.get("role") == "tool":
            block = f"<tool_response>\n{m['content']}\n</tool_response>"
            if out and out[-1].get("role") == "user" and out[-1].get("_tool_results"):
                out[-1]["content"] += "\n" + block
            else:
                out.append({"role": "user", "content": block, "_tool_results": True})
        else:
            out.append(m)
    for m in out:
        m.pop("_tool_results", None)
    if tools:
        block = GENERIC_TOOLS_BLOCK.format(
            tools="\n".join(json.dumps(t.as_openai(), ensure_ascii=False) for t in tools)
        )
        if out and out[0].get("role") == "system":
            out[0] = {**out[0], "content": f"{_text(out[0].get('content'), 0)}\n\n{block}"}
        else:
            out.insert(0, {"role": "system", "content": block})
    return out


# ---- output parsing -----------------------------------------------------------------------------------------------
@dataclass
class ContentDelta:
    text: str


@dataclass
class ToolCallStart:
    index: int
    id: str
    name: str


@dataclass
class ToolArgsDelta:
    index: int
    text: str


Event = ContentDelta | ToolCallStart | ToolArgsDelta


def new_call_id() -> str:
    alphabet = string.ascii_letters + string.digits
    return "call_" + "".join(secrets.choice(alphabet) for _ in range(24))


class _CallObject:
    """Scans one JSON call object ({"name": ..., "arguments"|"parameters": ...}) a piece at a time and says what
    to emit: the call's start once its name is complete, then the arguments' text as it arrives (exactly as
    written, never past the value's end)."""

    ARG_KEYS = ("arguments", "parameters")

    def __init__(self) -> None:
        self.raw = ""
        self.depth = 0
        self.in_str = False
        self.esc = False
        self.done = False
        self.key: str | None = None  # the top-level key whose value is being read
        self.expect = "open"  # open | key | colon | value | after
        self.tok_start = 0  # where the current key or value text began in raw
        self.name: str | None = None
        self.args_start: int | None = None
        self.args_end: int | None = None
        self.args_is_string = False

    def feed(self, text: str) -> int:
        """Consumes text up to the end of the object; returns how many characters it took."""
        for n, ch in enumerate(text):
            if self.done:
                return n
            self.raw += ch
            self._char(ch, len(self.raw) - 1)
        return len(text)

    def _char(self, ch: str, i: int) -> None:
        if self.in_str:
            if self.esc:
                self.esc = False
            elif ch == "\\":
                self.esc = True
            elif ch == '"':
                self.in_str = False
                if self.depth == 1 and self.expect == "key":
                    self.key = json.loads(self.raw[self.tok_start : i + 1])
                    self.expect = "colon"
                elif self.depth == 1 and self.expect == "value":
                    self._value_end(i + 1)
            return
        if ch == '"':
            self.in_str = True
            if self.depth == 1 and self.expect in ("key", "value"):
                if self.expect == "value":
                    self._value_start(i)
                self.tok_start = i
            return
        if ch.isspace():
            return
        if self.expect == "open":
            if ch == "{":
                self.depth, self.expect = 1, "key"
            else:  # not an object: not a call
                self.done = True
            return
        if ch in "{[":
            if self.depth == 1 and self.expect == "value":
                self._value_start(i)
            self.depth += 1
            return
        if ch in "}]":
            self.depth -= 1
            if self.depth == 1 and self.expect == "value":
                self._value_end(i + 1)
            elif self.depth == 0:
                if self.expect == "value":
                    self._value_end(i)
                self.done = True
            return
        if self.depth == 1:
            if ch == ":" and self.expect == "colon":
                self.expect = "value"
                self.tok_start = -1
            elif ch == ",":
                if self.expect == "value":
                    self._value_end(i)
                self.expect = "key"
            elif self.expect == "value" and self.tok_start < 0:
                self._value_start(i)  # a number or literal

    def _value_start(self, i: int) -> None:
        self.tok_start = i
        if self.key in self.ARG_KEYS and self.args_start is None:
            self.args_start = i
            self.args_is_string = self.raw[i] == '"'

    def _value_end(self, end: int) -> None:
        text = self.raw[self.tok_start : end].rstrip()
        if self.key == "name" and self.name is None:
            try:
                value = json.loads(text)
                self.name = value if isinstance(value, str) else None
            except json.JSONDecodeError:
                self.name = None
        if self.key in self.ARG_KEYS and self.args_start == self.tok_start and self.args_end is None:
            self.args_end = self.tok_start + len(text)
        self.expect = "after"

    def arguments_so_far(self) -> str:
        """The arguments' text read so far (all of it once the value ended); "" for a string value until it ends."""
        if self.args_start is None or (self.args_is_string and self.args_end is None):
            return ""
        text = self.raw[self.args_start : self.args_end] if self.args_end is not None else self.raw[self.args_start :]
        if self.args_is_string:  # arguments sent as a JSON string holding JSON: OpenAI's form is the inner text
            try:
                inner = json.loads(text)
                return inner if isinstance(inner, str) else text
            except json.JSONDecodeError:
                return text
        return text


class ToolCallParser:
    """Feed the model's output text piece by piece; get back content deltas and OpenAI tool-call deltas (a call's
    index, id and name first, then fragments of its arguments). Streaming and whole-text parsing are this same
    parser, so they always agree."""

    def __init__(
        self,
        fmt: ToolFormat | str,
        new_id: Callable[[], str] | None = None,
        tool_names: Iterable[str] = (),
    ):
        """tool_names: the request's tools. With them, hermes-style models may also answer with a fenced
        ```json {"name": <a tool>, "arguments": {...}}``` block (Qwen2.5-Coder does), which counts as a call.
        new_id: makes call ids (default: "call_..." ids, Mistral's 9-character ones for the Mistral formats)."""
        self.fmt = fmt.name if isinstance(fmt, ToolFormat) else fmt
        self._new_id = new_id or (new_mistral_id if self.fmt in (MISTRAL, MISTRAL_V11) else new_call_id)
        self._head = ""  # mistral_v11: the text after [TOOL_CALLS] until [ARGS]
        self._value: JsonValue | None = None
        self._buf = ""  # text not yet handed out
        self._mode = "text"  # text | call | between | list
        self._obj: _CallObject | None = None
        self._started = False
        self._sent_args = 0
        self._calls: list[ToolCall] = []
        self._seen_text = False
        self._seen_text_since_call = False
        self._marker = ""
        open_marker = {
            HERMES: "<tool_call>",
            GENERIC: "<tool_call>",
            MISTRAL: TOOL_CALLS,
            MISTRAL_V11: TOOL_CALLS,
            LLAMA3: "<|python_tag|>",
        }[self.fmt]
        self._open = open_marker
        self._close = "</tool_call>" if self.fmt in (HERMES, GENERIC) else None
        self._tool_names = frozenset(tool_names)
        self._fence = "```json" if self.fmt in (HERMES, GENERIC) and self._tool_names else None
        self._fenced = False  # the current object opened with the fence

    @property
    def calls(self) -> list[ToolCall]:
        return self._calls

    def feed(self, text: str) -> list[Event]:
        self._buf += text
        events: list[Event] = []
        while self._step(events, final=False):
            pass
        return events

    def finish(self) -> list[Event]:
        events: list[Event] = []
        while self._step(events, final=True):
            pass
        if self._obj is not None and not self._obj.done and self._started:
            self._emit_args(events, final=True)  # an unfinished call (length limit): what there is
        elif self._obj is not None and not self._started:
            events.append(ContentDelta(self._marker + self._obj.raw))  # never became a call
        self._obj = None
        if self._buf:
            events.append(ContentDelta(self._buf))
            self._buf = ""
        return events

    # -- the state machine; returns True when it made progress and may continue
    def _step(self, events: list[Event], final: bool) -> bool:
        if self._mode == "text":
            return self._step_text(events, final)
        if self._mode == "call":
            return self._step_call(events)
        if self._mode == "between":
            return self._step_between(events, final)
        if self._mode == "v11_head":
            return self._step_v11_head(events, final)
        if self._mode == "v11_args":
            return self._step_v11_args(events, final)
        return self._step_list(events, final)

    def _step_text(self, events: list[Event], final: bool) -> bool:
        buf = self._buf
        if not buf:
            return False
        if self.fmt == LLAMA3 and not self._seen_text:
            stripped = buf.lstrip()
            if not stripped:
                return False
            if stripped.startswith("{"):  # Llama 3 answers a call with bare JSON
                self._buf = stripped
                self._start_object("")
                return True
        if self.fmt == MISTRAL and not self._seen_text and not self._calls:
            # [TOOL_CALLS] is a control token that the text may not show: a reply that opens with a list of
            # objects is the call list
            head = "".join(buf.split())[:2]
            if head in ("", "[") and not final:
                return False
            if head == "[{":
                self._buf = buf.lstrip()
                self._mode = "list"
                return True
        at, marker = buf.find(self._open), self._open
        fence_at = buf.find(self._fence) if self._fence else -1
        if self._fence and fence_at >= 0 and (at < 0 or fence_at < at):
            at, marker = fence_at, self._fence
        if at >= 0:
            before = buf[:at].rstrip()  # whitespace next to a call is not content
            if before.strip():
                events.append(ContentDelta(before))
                self._seen_text = True
            self._buf = buf[at + len(marker) :]
            if self.fmt == MISTRAL:
                self._mode = "list"
            elif self.fmt == MISTRAL_V11:  # (the whitespace before is kept to give back if it is not a call)
                self._mode, self._head, self._marker = "v11_head", "", buf[len(before) : at] + marker
            else:  # (kept to give back as text if what follows is not a call)
                self._start_object(buf[len(before) : at] + marker)
                self._fenced = marker == self._fence
            return True
        if final:
            if buf.strip() or not self._calls:
                events.append(ContentDelta(buf if not self._calls else buf.strip()))
            self._buf = ""
            return False
        # hold back what may still become the marker, and trailing whitespace (dropped if a call follows)
        keep = max(_partial_suffix(buf, self._open), _partial_suffix(buf, self._fence) if self._fence else 0)
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

    def _start_object(self, marker: str) -> None:
        self._marker = marker
        self._fenced = False
        self._seen_text_since_call = False
        self._obj = _CallObject()
        self._started = False
        self._sent_args = 0
        self._mode = "call"

    def _step_call(self, events: list[Event]) -> bool:
        obj = self._obj
        assert obj is not None
        if not self._buf:
            return False
        taken = obj.feed(self._buf)
        self._buf = self._buf[taken:]
        if not self._started and obj.name is not None and (not self._fenced or obj.name in self._tool_names):
            self._calls.append(ToolCall(self._new_id(), obj.name, ""))
            events.append(ToolCallStart(len(self._calls) - 1, self._calls[-1].id, obj.name))
            self._started = True
        if self._started:
            self._emit_args(events, final=obj.done)
        if obj.done:
            self._obj = None
            if not self._started:  # not a call after all: it was text
                events.append(ContentDelta(self._marker + obj.raw))
                self._mode = "text" if self.fmt != MISTRAL else "list"
                return True
            self._mode = "between" if self.fmt != MISTRAL else "list"
            return True
        return False

    def _emit_args(self, events: list[Event], final: bool) -> None:
        obj = self._obj
        assert obj is not None
        text = obj.arguments_so_far()
        if final and obj.args_start is None:
            text = "{}"
        if len(text) > self._sent_args:
            piece = text[self._sent_args :]
            self._sent_args = len(text)
            self._calls[-1].arguments += piece
            events.append(ToolArgsDelta(len(self._calls) - 1, piece))

    def _step_between(self, events: list[Event], final: bool) -> bool:
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
        if self._close and buf.startswith(self._close):
            self._buf = buf[len(self._close) :]
            self._mode = "text"
            return True
        if self.fmt == LLAMA3 and buf.startswith(";"):
            self._buf = buf[1:].lstrip()
            if self._buf.startswith("{"):
                self._start_object("")
                return True
            self._mode = "text"
            return True
        if self.fmt == LLAMA3 and buf.startswith("{"):
            self._buf = buf
            self._start_object("")
            return True
        if not final and (not buf or (self._close and self._close.startswith(buf))):
            return False
        self._mode = "text"
        return True

    # -- mistral v11: [TOOL_CALLS]name([CALL_ID]id)?[ARGS]{arguments}
    def _step_v11_head(self, events: list[Event], final: bool) -> bool:
        """Reads the name (and an id the model wrote) up to [ARGS]; the call starts there. A name that is not a
        name, or text that ends before [ARGS], was not a call: it goes back out as content."""
        self._head += self._buf
        self._buf = ""
        at_args, at_id = self._head.find(ARGS), self._head.find(CALL_ID)
        name_end = min(i for i in (at_args, at_id, len(self._head)) if i >= 0)
        name = self._head[:name_end].strip()
        undecided = name_end == len(self._head)
        if undecided:  # the name may go on, or a marker may be arriving
            keep = max(_partial_suffix(self._head, ARGS), _partial_suffix(self._head, CALL_ID))
            name = self._head[: len(self._head) - keep].strip()
        if (name and not _NAME.match(name)) or (final and at_args < 0):
            events.append(ContentDelta(self._marker + self._head))
            self._head, self._mode = "", "text"
            self._seen_text = True
            return False
        if at_args < 0:
            return False
        self._buf = self._head[at_args + len(ARGS) :]
        self._head = ""
        self._calls.append(ToolCall(self._new_id(), name, ""))
        events.append(ToolCallStart(len(self._calls) - 1, self._calls[-1].id, name))
        self._seen_text_since_call = False
        self._value = JsonValue()
        self._sent_args = 0
        self._mode = "v11_args"
        return True

    def _step_v11_args(self, events: list[Event], final: bool) -> bool:
        value = self._value
        assert value is not None
        taken = value.feed(self._buf)
        self._buf = self._buf[taken:]
        text = value.raw if value.raw or not (final or value.done) else "{}"
        if len(text) > self._sent_args:
            piece = text[self._sent_args :]
            self._sent_args = len(text)
            self._calls[-1].arguments += piece
            events.append(ToolArgsDelta(len(self._calls) - 1, piece))
        if value.done or final:
            self._value = None
            self._mode = "text"
            return bool(self._buf)
        return False

    def _step_list(self, events: list[Event], final: bool) -> bool:
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


def _partial_suffix(text: str, marker: str) -> int:
    """Length of the longest end of `text` that is a beginning of `marker` (held back until it is decided)."""
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:k]):
            return k
    return 0


def parse_tool_calls(
    text: str, fmt: ToolFormat | str, new_id: Callable[[], str] | None = None, tool_names: Iterable[str] = ()
) -> tuple[str | None, list[ToolCall]]:
    """The whole output -> (content or None, tool calls). Content that is only whitespace around calls is None."""
    parser = ToolCallParser(fmt, new_id, tool_names)
    events = parser.feed(text) + parser.finish()
    content = "".join(e.text for e in events if isinstance(e, ContentDelta))
    return (None if parser.calls and not content else content), parser.calls


# ---- grammars -----------------------------------------------------------------------------------------------------
def _call_schema(tools: Iterable[Tool], args_key: str) -> dict[str, Any]:
    options = [
        {
            "type": "object",
            "additionalProperties": False,
            "required": ["name", args_key],
            "properties": {"name": {"const": t.name}, args_key: dict(t.parameters)},
        }
        for t in tools
    ]
    schema: dict[str, Any] = options[0] if len(options) == 1 else {"anyOf": options}
    return {**schema, "x-guidance": {"whitespace_pattern": JSON_WHITESPACE}}


def tool_call_grammar(
    tools: Sequence[Tool],
    fmt: ToolFormat | str,
    *,
    only: str | None = None,
    parallel: bool = True,
    trigger_token_id: int | None = None,
    or_json: Mapping[str, Any] | None = None,
    markers: Mapping[str, int] | None = None,
) -> GrammarSpec:
    """A grammar for the tool-call part of the output: one call (several with `parallel`) of `tools` (only the
    one named `only` when given), arguments valid against the tool's parameters schema. For hermes and mistral it
    starts with the opening marker, so it serves both "required" (from the first token) and "auto" (a
    LazyMatcher starts it at the trigger token). or_json: a JSON schema the whole output may follow instead of
    calling (tool_choice "auto" with response_format: answer in that JSON, or call). markers: the Mistral control
    tokens' ids (mistral_tools.marker_ids), which mistral_v11 needs."""
    name = fmt.name if isinstance(fmt, ToolFormat) else fmt
    if or_json is not None and name == LLAMA3:
        raise ToolError(
            "response_format cannot be combined with tools for this model's JSON tool calls", "response_format"
        )
    chosen = [t for t in tools if only is None or t.name == only]
    if not chosen:
        raise ToolError("tool_choice names no given tool", "tool_choice")
    if name == MISTRAL_V11:
        lark = v11_grammar_lark(
            chosen,
            markers or {},
            call_ids=isinstance(fmt, ToolFormat) and fmt.call_ids,
            parallel=parallel,
            args_schema=lambda t: {**dict(t.parameters), "x-guidance": {"whitespace_pattern": JSON_WHITESPACE}},
        )
        return GrammarSpec(llg.LLMatcher.grammar_from_lark(_or_json(lark, or_json)), "tools", "tools")
    args_key = "parameters" if name == LLAMA3 else "arguments"
    obj = "%json " + json.dumps(_call_schema(chosen, args_key))

    def repeated(item: str, sep: str) -> str:
        return item + " (" + json.dumps(sep) + " " + item + ")*" if parallel else item

    if name in (HERMES, GENERIC):
        lark = "start: " + repeated("call", "\n") + "\n" + 'call: "<tool_call>\\n" obj "\\n</tool_call>"\n'
    elif name == MISTRAL:
        if trigger_token_id is None:
            raise ToolError("this model's vocabulary has no [TOOL_CALLS] token", "tools")
        lark = f'start: <[{trigger_token_id}]> " [" ' + repeated("obj", ", ") + ' "]"\n'
    else:
        lark = "start: " + repeated("obj", "; ") + "\n"
    lark += "obj: " + obj + "\n"
    grammar = llg.LLMatcher.grammar_from_lark(_or_json(lark, or_json))
    return GrammarSpec(grammar, "tools", "tools")


def _or_json(lark: str, or_json: Mapping[str, Any] | None) -> str:
    """The calls grammar, or (given a schema) that JSON answer instead."""
    if or_json is None:
        return lark
    lark = lark.replace("start: ", "calls: ", 1)
    return "start: answer | calls\nanswer: %json " + json.dumps(dict(or_json)) + "\n" + lark


def trigger_token(fmt: ToolFormat | str, token_id_of: Callable[[str], int | None]) -> int | None:
    """The single token that opens a call in this format (None when there is none)."""
    name = fmt.name if isinstance(fmt, ToolFormat) else fmt
    text = {HERMES: "<tool_call>", GENERIC: "<tool_call>", MISTRAL: TOOL_CALLS, MISTRAL_V11: TOOL_CALLS}.get(name)
    return token_id_of(text) if text else None


@dataclass
class LazyMatcher:
    """A matcher that starts at a trigger token ("auto" tool choice): unconstrained text until the model writes
    the trigger, then the call grammar from that token on (the trigger is the grammar's first token)."""

    compiled: CompiledGrammar
    trigger: int
    active: SequenceMatcher | None = field(default=None)

    def fill_mask(self, row: np.ndarray) -> bool:
        """Writes the mask and returns True once active; False (row untouched) while the text is free."""
        if self.active is None:
            return False
        self.active.fill_mask(row)
        return True

    def advance(self, token: int) -> bool:
        if self.active is None:
            if token != self.trigger:
                return True
            self.active = self.compiled.new_matcher()
        return self.active.advance(token)

    @property
    def is_done(self) -> bool:
        return self.active is not None and self.active.is_done

    @property
    def is_error(self) -> bool:
        return self.active is not None and self.active.is_error

    @property
    def error(self) -> str:
        return self.active.error if self.active is not None else ""

    def accepts_eos(self) -> bool:
        return self.active is None or self.active.accepts_eos()
