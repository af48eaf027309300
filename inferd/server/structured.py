"""The renderers' side of structured output and tool calling: request fields -> the conversation the chat template
renders, its tools, and the compiled constraint the scheduler applies to every choice.

A chat-shaped renderer checks its tools (tool_request) and its answer format (a GrammarSpec: request_grammar for
OpenAI's constraint fields), then calls prepare_chat; a completions renderer calls prepare_completion. Every
problem becomes a ProtocolError naming the request field. The model's text -> tool calls is the encoders' side
(inferd.text.tools' parsers).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import msgspec

from inferd.engine.constraints import Constraint
from inferd.server.protocol import ProtocolError
from inferd.server.state import ServerState
from inferd.text.parsing import Chain, OutputParser
from inferd.text.grammar.budget import ThinkingBudget
from inferd.text.reasoning import BUDGET_MARKERS, detect_reasoning, reasoning_parser, shown_texts, starts_thinking
from inferd.text.grammar import CONSTRAINT_FIELDS, GrammarCompiler, GrammarError, GrammarSpec, grammar_from_request
from inferd.text.tools import (
    Tool,
    ToolCallParser,
    ToolFormat,
    detect_format,
    marker_token_ids,
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
    reasoning: Callable[[], OutputParser] | None = None  # set: the thinking is parsed out of the text
    # tool name -> parameters schema (the XML formats type their bare-text values by it)
    tool_params: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    @property
    def parses_answer(self) -> bool:
        """The answer's text holds more than content (tool calls, thinking): it goes through answer_parser."""
        return self.tool_format is not None or self.reasoning is not None


@dataclass
class ToolRequest:
    """A request's tools in chat completions' shape, checked: which may be called, and how."""

    tools: list[Tool]
    choice: str  # none | auto | required
    only: str | None  # required: the one function named by tool_choice, if any
    parallel: bool


def tool_request(tools: Any, tool_choice: Any, parallel_tool_calls: bool | None) -> ToolRequest:
    """tools and tool_choice as chat completions have them (a list of {"type": "function", "function": {...}})."""
    try:
        parsed = parse_tools(tools)
        choice, only = parse_tool_choice(tool_choice, parsed)
    except GrammarError as e:
        raise ProtocolError(str(e), e.param) from None
    return ToolRequest(parsed, choice, only, parallel_tool_calls is not False)


def request_grammar(req: Any) -> GrammarSpec | None:
    """The one output constraint among the request's constraint fields (response_format, guided_*, ...)."""
    try:
        return grammar_from_request(constraint_fields(req))
    except GrammarError as e:
        raise ProtocolError(str(e), e.param) from None


async def prepare_chat(
    state: ServerState, messages: list[dict[str, Any]], tool_req: ToolRequest, spec: GrammarSpec | None
) -> ChatPrep:
    """messages: checked (roles, tool_calls/tool_call_id kept); spec: the answer's format, if constrained."""
    tools, choice, only = tool_req.tools, tool_req.choice, tool_req.only
    tok = state.tokenizer
    fmt = detect_format(state.ready_template.source, tok.hf.token_to_id)
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
    parallel = tool_req.parallel
    trigger = trigger_token(fmt, tok.hf.token_to_id)
    markers = marker_token_ids(fmt, tok.hf.token_to_id)
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
        tool_params={t.name: t.parameters for t in tools},
    )


async def prepare_completion(state: ServerState, req: Any) -> Constraint | None:
    return await compile_spec(state, request_grammar(req))


def with_reasoning(
    state: ServerState, prep: ChatPrep, prompt: str, max_thinking_tokens: int | None = None, param: str = ""
) -> ChatPrep:
    """`prep`, set to parse the thinking out of the answer where the model's template thinks aloud, and to close
    the thinking after `max_thinking_tokens` (None: the server's max_thinking_tokens; 0: no limit)."""
    name = detect_reasoning(state.ready_template.source)
    if name is None:
        return prep
    token_id = state.tokenizer.hf.token_to_id
    shown = {i for i in (token_id(t) for t in shown_texts(name)) if i is not None}
    prep = replace(prep, reasoning=lambda: reasoning_parser(name, prompt), shown_special=prep.shown_special | shown)
    limit = state.settings.max_thinking_tokens if max_thinking_tokens is None else max_thinking_tokens
    if not limit:
        return prep
    if not getattr(state.engine, "supports_token_masks", False):
        raise ProtocolError(
            f"{param or 'max_thinking_tokens'}: a reasoning budget is not available on this server's device "
            f"({state.settings.device}); it needs the CPU engine",
            param or "max_thinking_tokens",
        )
    return replace(prep, constraint=_with_budget(state, prep.constraint, name, prompt, limit))


def _with_budget(state: ServerState, constraint: Constraint | None, name: str, prompt: str, limit: int) -> Constraint:
    tok = state.tokenizer
    markers = BUDGET_MARKERS[name]
    budget = ThinkingBudget(
        limit,
        markers.open,
        markers.close,
        tuple(tok.encode(markers.forced, add_special=False)),
        lambda t: tok.token_bytes(t, skip_special=False).decode("utf-8", errors="replace"),
        frozenset(tok.eos_ids),
        state.engine.vocab_size if state.engine is not None else tok.vocab_size,
        start_inside=starts_thinking(name, prompt),
    )
    if constraint is None:
        return Constraint(None, budget=budget)
    return replace(constraint, budget=budget)


def answer_parser(prep: ChatPrep) -> tuple[OutputParser | None, ToolCallParser | None]:
    """One choice's parser (None: the text is the answer as it is), and its tool-call part (for its calls): the
    reasoning parser first, the tool-call parser behind its answer text."""
    if not prep.parses_answer:
        return None, None
    tools = (
        ToolCallParser(prep.tool_format, tool_names=prep.tool_names, param_schemas=prep.tool_params)
        if prep.tool_format
        else None
    )
    if tools is not None and prep.tool_format is not None and prep.tool_format.parses_thinking:
        return tools, tools
    parsers = [p for p in (prep.reasoning() if prep.reasoning else None, tools) if p is not None]
    return (parsers[0] if len(parsers) == 1 else Chain(parsers[0], parsers[1])), tools
