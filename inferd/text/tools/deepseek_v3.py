"""DeepSeek V3's (and R1's) tool calls: the type, the name, then the arguments in a ```json fence,

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather
    ```json
    {"city": "Paris"}
    ```<｜tool▁call▁end｜><｜tool▁calls▁end｜>

The markers are tokens of DeepSeek's vocabulary (deepseek_calls holds what this form shares with V3.1's).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import inferd.text.tools.deepseek_calls as deepseek_calls
from inferd.text.tools.base import ToolCall
from inferd.text.tools.deepseek_calls import CALLS_BEGIN, MARKERS, DeepSeekParser
from inferd.text.tools.syntax import CallSyntax
from inferd.text.tools.validation import Tool


class DeepSeekV3Parser(DeepSeekParser):
    FENCED = True


def grammar(
    tools: Sequence[Tool], *, parallel: bool, trigger_token_id: int | None, markers: Mapping[str, int], call_ids: bool
) -> str:
    return deepseek_calls.grammar(tools, parallel=parallel, markers=markers, fenced=True)


def write_calls(calls: Sequence[ToolCall], with_ids: bool = False) -> str:
    return deepseek_calls.write_calls(calls, fenced=True)


SYNTAX = CallSyntax("deepseek_v3", DeepSeekV3Parser, grammar, write_calls, trigger=CALLS_BEGIN, shown_markers=MARKERS)
