"""DeepSeek V3.1's tool calls: the name, then the arguments bare,

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}<｜tool▁call▁end｜>
    <｜tool▁calls▁end｜>

(one line, here broken in two)

The markers are tokens of DeepSeek's vocabulary (deepseek_calls holds what this form shares with V3's).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import inferd.text.tools.deepseek_calls as deepseek_calls
from inferd.text.tools.base import ToolCall
from inferd.text.tools.deepseek_calls import CALLS_BEGIN, MARKERS, DeepSeekParser
from inferd.text.tools.syntax import CallSyntax
from inferd.text.tools.validation import Tool


class DeepSeekV31Parser(DeepSeekParser):
    FENCED = False


def grammar(
    tools: Sequence[Tool], *, parallel: bool, trigger_token_id: int | None, markers: Mapping[str, int], call_ids: bool
) -> str:
    return deepseek_calls.grammar(tools, parallel=parallel, markers=markers, fenced=False)


def write_calls(calls: Sequence[ToolCall], with_ids: bool = False) -> str:
    return deepseek_calls.write_calls(calls, fenced=False)


SYNTAX = CallSyntax("deepseek_v31", DeepSeekV31Parser, grammar, write_calls, trigger=CALLS_BEGIN, shown_markers=MARKERS)
