"""The grammars that make a tool call valid by construction.

tool_choice "required" or a named function constrains the whole output to one call (or several, with
parallel_tool_calls) whose arguments are valid against the function's parameters schema. "auto" lets the model
write text; from the format's trigger token on (Hermes <tool_call>, Mistral [TOOL_CALLS], single tokens) the same
call grammar applies (a lazy grammar: inferd.text.grammar.LazyMatcher). Llama 3's JSON calls have no trigger
token, so "auto" is parsed but not constrained there.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import llguidance as llg

from inferd.text.grammar import GrammarSpec
from inferd.text.tools.grammar_rules import or_json as answer_or_calls
from inferd.text.tools.registry import ToolFormat, syntax_of
from inferd.text.tools.validation import Tool, ToolError


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
    one named `only` when given), arguments valid against the tool's parameters schema. Where the format has a
    trigger token the grammar starts with it, so it serves both "required" (from the first token) and "auto" (a
    LazyMatcher starts it at the trigger token). or_json: a JSON schema the whole output may follow instead of
    calling (tool_choice "auto" with response_format: answer in that JSON, or call). markers: the Mistral control
    tokens' ids (mistral_tokens.marker_ids), which mistral_v11 needs."""
    syntax = syntax_of(fmt)
    if or_json is not None and not syntax.json_answer_is_distinct:
        raise ToolError(
            "response_format cannot be combined with tools for this model's JSON tool calls", "response_format"
        )
    chosen = [t for t in tools if only is None or t.name == only]
    if not chosen:
        raise ToolError("tool_choice names no given tool", "tool_choice")
    lark = syntax.grammar(
        chosen,
        parallel=parallel,
        trigger_token_id=trigger_token_id,
        markers=markers or {},
        call_ids=isinstance(fmt, ToolFormat) and fmt.call_ids,
    )
    return GrammarSpec(llg.LLMatcher.grammar_from_lark(answer_or_calls(lark, or_json)), "tools", "tools")


def trigger_token(fmt: ToolFormat | str, token_id_of: Callable[[str], int | None]) -> int | None:
    """The single token that opens a call in this format (None when there is none)."""
    text = syntax_of(fmt).trigger
    return token_id_of(text) if text else None
