"""inferd.text.tools.llama3: Llama 3's bare JSON calls (`;`-separated, optionally after <|python_tag|>) parsed whole
and streamed, which must agree, and the call grammar walked with the real Qwen2.5-Coder vocabulary where present."""
from __future__ import annotations

import json

import pytest

from inferd.text.tools import LLAMA3, ToolError, parse_tool_calls, parse_tools, tool_call_grammar
from tests.text.tools.calls import TIME, assert_parses, assert_streams_like_whole, ids, needs_qwen, walk

CASES = [
    (LLAMA3, '{"name": "f", "parameters": {"a": 1}}; {"name": "g", "parameters": {}}', None,
     [("f", '{"a": 1}'), ("g", "{}")]),
    (LLAMA3, '<|python_tag|>{"name": "f", "parameters": {"a": [1, 2]}}', None, [("f", '{"a": [1, 2]}')]),
    (LLAMA3, "The answer is {x}.", "The answer is {x}.", []),
]


@pytest.mark.parametrize("fmt,text,content,calls", CASES)
def test_parse_whole_output(fmt, text, content, calls):
    for c in assert_parses(fmt, text, content, calls, ids, lambda i: f"call_{i}"):
        json.loads(c.arguments)


@pytest.mark.parametrize("fmt,text,content,calls", CASES)
def test_streamed_deltas_rebuild_the_same_calls(fmt, text, content, calls):
    assert_streams_like_whole(fmt, text, content, calls, ids, seed=7, trials=20, max_cuts=30)


@needs_qwen
def test_grammar_compiles_and_parses(qwen):
    tok, _, compiler = qwen
    tools = parse_tools([TIME])
    compiled = compiler.compile_sync(tool_call_grammar(tools, LLAMA3))
    _, calls = parse_tool_calls(walk(tok, compiler, compiled.new_matcher(), 1), LLAMA3)
    assert calls and all(c.name == "get_time" for c in calls)


def test_a_json_answer_cannot_be_told_from_a_call():
    with pytest.raises(ToolError) as e:
        tool_call_grammar(parse_tools([TIME]), LLAMA3, or_json={"type": "object"})
    assert e.value.param == "response_format"
