"""inferd.text.tools.mistral: Mistral's calls before tokenizer v11 (`[TOOL_CALLS] [{...}, ...]`, the marker
possibly unshown) parsed whole and streamed, which must agree, and the call grammar, which needs the marker token."""
from __future__ import annotations

import json
import re

import pytest

from inferd.text.tools import MISTRAL, ToolError, parse_tool_calls, parse_tools, tool_call_grammar
from tests.text.tools.calls import TIME, assert_parses, assert_streams_like_whole, ids, needs_qwen, walk

CASES = [
    (MISTRAL, '[TOOL_CALLS] [{"name": "f", "arguments": {"a": 1}}, {"name": "g", "arguments": {}}]', None,
     [("f", '{"a": 1}'), ("g", "{}")]),
    (MISTRAL, ' [{"name": "f", "arguments": {"a": 1}}]', None, [("f", '{"a": 1}')]),   # the control token unshown
    (MISTRAL, "[a link](x) and text", "[a link](x) and text", []),
]


@pytest.mark.parametrize("fmt,text,content,calls", CASES)
def test_parse_whole_output(fmt, text, content, calls):
    for c in assert_parses(fmt, text, content, calls, ids, lambda i: f"call_{i}"):
        json.loads(c.arguments)


@pytest.mark.parametrize("fmt,text,content,calls", CASES)
def test_streamed_deltas_rebuild_the_same_calls(fmt, text, content, calls):
    assert_streams_like_whole(fmt, text, content, calls, ids, seed=7, trials=20, max_cuts=30)


def test_default_ids_are_mistral_ids():
    _, calls = parse_tool_calls('[TOOL_CALLS] [{"name": "f", "arguments": {}}]', MISTRAL)
    assert re.fullmatch(r"[A-Za-z0-9]{9}", calls[0].id)


@needs_qwen
def test_grammar_compiles_and_parses(qwen):
    tok, _, compiler = qwen
    tools = parse_tools([TIME])
    im_start = tok.hf.token_to_id("<|im_start|>")   # any special token stands in for [TOOL_CALLS] here
    compiled = compiler.compile_sync(tool_call_grammar(tools, MISTRAL, trigger_token_id=im_start))
    text = walk(tok, compiler, compiled.new_matcher(), 2).replace("<|im_start|>", "[TOOL_CALLS]")
    _, calls = parse_tool_calls(text, MISTRAL)
    assert calls and all(c.name == "get_time" for c in calls)


def test_grammar_needs_the_token():
    with pytest.raises(ToolError, match="TOOL_CALLS"):
        tool_call_grammar(parse_tools([TIME]), MISTRAL)
