"""The handlers' side of structured output and tool calling: request fields -> the rendered conversation, the
compiled constraint the scheduler applies, and the model's text -> OpenAI tool calls (whole or as stream deltas).

Kept out of openai.py so the endpoints only call prepare_chat / prepare_completion and wrap each choice's text
in a ChoiceTools. Every problem becomes a ProtocolError naming the request field.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import msgspec

from inferd.engine.constraints import Constraint
from inferd.server import protocol as P
from inferd.server.protocol import ProtocolError
from inferd.server.state import ServerState
from inferd.text.grammar import CONSTRAINT_FIELDS, GrammarCompiler, GrammarError, GrammarSpec, grammar_from_request
from inferd.text.tools import (
    ContentDelta,
    ToolArgsDelta,
    ToolCall,
    ToolCallParser,
    ToolCallStart,
    ToolFormat,
    detect_format,
    marker_ids,
    parse_tool_calls,
    parse_tool_choice,
    parse_tools,
    prepare_messages,
    shown_tokens,
    template_tools,
    tool_call_grammar,
    trigger_token,
)


def grammar_compiler(state: ServerState) -> GrammarCompiler:
    """The model's grammar compiler (its llguidance vocabulary is built once, in the background)."""
    if state.grammar is None:
        s = state.settings
        state.grammar = GrammarCompiler(
            state.tokenizer,
            state.engine.vocab_size if state.engine is not None else None,
            compile_timeout=s.grammar_compile_timeout_s,
        )
    return state.grammar


def constraint_fields(req: Any) -> dict[str, Any]:
    """The request's constraint fields as plain JSON values (what grammar_from_request reads)."""
    out: dict[str, Any] = {}
    for name in CONSTRAINT_FIELDS + ("guided_whitespace_pattern",):
        value = getattr(req, name, None)
        if value is not None:
            value = msgspec.to_builtins(value)
            if isinstance(value, Mapping):
                value = {k: v for k, v in value.items() if v is not None}
            out[name] = value
    return out


async def compile_spec(state: ServerState, spec: GrammarSpec | None, trigger: int | None = None) -> Constraint | None:
    if spec is None:
        return None
    if not getattr(state.engine, "supports_token_masks", False):
        raise ProtocolError(
            f"{spec.param}: constrained output is not available on this server's device "
            f"({state.settings.device}); it needs the CPU engine",
            spec.param,
        )
    try:
        compiled = await grammar_compiler(state).compile(spec)
    except GrammarError as e:
        raise ProtocolError(str(e), e.param) from None
    return Constraint(compiled, trigger_token=trigger)


@dataclass
class ChatPrep:
    messages: list[dict[str, Any]]  # for the chat template
    tools: list[dict[str, Any]] | None  # the template's `tools` variable
    constraint: Constraint | None  # what the scheduler applies to every choice
    tool_format: ToolFormat | None  # set: parse tool calls out of the text
    tool_names: tuple[str, ...] = ()
    shown_special: frozenset[int] = frozenset()  # control tokens the parser must see (Mistral's markers)


async def prepare_chat(
    state: ServerState, req: P.ChatCompletionRequest, messages: list[dict[str, Any]], template_source: str | None
) -> ChatPrep:
    """messages: check_messages' output (roles checked, tool_calls/tool_call_id kept)."""
    try:
        tools = parse_tools(req.tools)
        choice, only = parse_tool_choice(req.tool_choice, tools)
        spec = grammar_from_request(constraint_fields(req))
    except GrammarError as e:
        raise ProtocolError(str(e), e.param) from None
    tok = state.tokenizer
    fmt = detect_format(template_source, tok.hf.token_to_id)
    uses_tools = bool(tools) and choice != "none"
    has_tool_history = any(m.get("tool_calls") or m.get("role") == "tool" for m in messages)
    try:
        rendered = (
            prepare_messages(messages, fmt, tools if uses_tools else ()) if uses_tools or has_tool_history else messages
        )
    except GrammarError as e:
        raise ProtocolError(str(e), e.param) from None
    if not uses_tools:
        return ChatPrep(rendered, None, await compile_spec(state, spec), None)
    answer_schema = None
    if spec is not None and choice != "required":  # "auto": answer in the response format, or call a tool
        if spec.kind not in ("json_schema", "json_object"):
            raise ProtocolError(f"{spec.param}: only a JSON response format can be combined with tools", spec.param)
        answer_schema = json.loads(spec.grammar)["grammars"][0]["json_schema"]
    parallel = req.parallel_tool_calls is not False
    trigger = trigger_token(fmt, tok.hf.token_to_id)
    markers = marker_ids(tok.hf.token_to_id) if fmt.is_mistral else {}
    try:
        if choice == "required":  # the calls are forced; a response format is for a later answer
            call_spec: GrammarSpec | None = tool_call_grammar(
                tools, fmt, only=only, parallel=parallel, trigger_token_id=trigger, markers=markers
            )
            lazy = None
        elif answer_schema is not None:
            call_spec, lazy = (
                tool_call_grammar(
                    tools, fmt, parallel=parallel, trigger_token_id=trigger, or_json=answer_schema, markers=markers
                ),
                None,
            )
        elif trigger is not None:  # auto: free text, then the call grammar from the trigger token on
            call_spec = tool_call_grammar(tools, fmt, parallel=parallel, trigger_token_id=trigger, markers=markers)
            lazy = trigger
        else:  # auto without a trigger token (Llama 3 JSON): parsed, not constrained
            call_spec, lazy = None, None
    except GrammarError as e:
        raise ProtocolError(str(e), e.param) from None
    if call_spec is not None and not getattr(state.engine, "supports_token_masks", False):
        call_spec = None  # tool calls still work, only without the guarantee
    return ChatPrep(
        rendered,
        template_tools(tools, fmt),
        await compile_spec(state, call_spec, lazy),
        fmt,
        tuple(t.name for t in tools),
        shown_tokens(fmt, tok.hf.token_to_id),
    )


async def prepare_completion(state: ServerState, req: P.CompletionRequest) -> Constraint | None:
    try:
        spec = grammar_from_request(constraint_fields(req))
    except GrammarError as e:
        raise ProtocolError(str(e), e.param) from None
    return await compile_spec(state, spec)


# ---- output -------------------------------------------------------------------------------------------------------
def tool_call_infos(calls: list[ToolCall]) -> list[P.ToolCallInfo]:
    return [P.ToolCallInfo(c.id, P.FunctionCall(c.name, c.arguments)) for c in calls]


def parse_message(text: str, prep: ChatPrep) -> tuple[str | None, list[P.ToolCallInfo] | None]:
    """A whole answer -> (content, tool_calls or None)."""
    if prep.tool_format is None:
        return text, None
    content, calls = parse_tool_calls(text, prep.tool_format, tool_names=prep.tool_names)
    return content, (tool_call_infos(calls) or None)


class ChoiceTools:
    """One streamed choice's text -> (content delta, tool-call deltas) in OpenAI's shape."""

    def __init__(self, prep: ChatPrep):
        assert prep.tool_format is not None
        self.parser = ToolCallParser(prep.tool_format, tool_names=prep.tool_names)

    @property
    def has_calls(self) -> bool:
        return bool(self.parser.calls)

    def feed(self, text: str, final: bool = False) -> tuple[str, list[P.ToolCallDelta]]:
        events = self.parser.feed(text) if text else []
        if final:
            events += self.parser.finish()
        content = ""
        deltas: list[P.ToolCallDelta] = []
        for e in events:
            if isinstance(e, ContentDelta):
                content += e.text
            elif isinstance(e, ToolCallStart):
                deltas.append(P.ToolCallDelta(e.index, e.id, "function", P.FunctionDelta(name=e.name, arguments="")))
            elif isinstance(e, ToolArgsDelta):
                if deltas and deltas[-1].index == e.index and deltas[-1].function is not None:
                    f = deltas[-1].function
                    f.arguments = (f.arguments or "") + e.text
                else:
                    deltas.append(P.ToolCallDelta(e.index, function=P.FunctionDelta(arguments=e.text)))
        return content, deltas


def finish_reason(reason: str | None, has_calls: bool) -> str | None:
    """OpenAI says "tool_calls" when the answer ended with calls."""
    return "tool_calls" if has_calls and reason == "stop" else reason
