"""inferd.text.tools.mistral_v11: Mistral's v11 calls (`[TOOL_CALLS]name([CALL_ID]id)?[ARGS]{json}`) parsed whole
and streamed, which must agree, and the call grammars walked with the tiny Mistral vocabulary
(tests/text/mistral_v11.py)."""
from __future__ import annotations

import json
import re

import numpy as np
import pytest

from inferd.text.tools import (
    MISTRAL_V11,
    LazyMatcher,
    ToolArgsDelta,
    ToolCallParser,
    ToolCallStart,
    ToolError,
    detect_format,
    marker_ids,
    parse_tool_calls,
    parse_tools,
    tool_call_grammar,
    trigger_token,
)
from tests.text.mistral_v11 import MISTRAL_SMALL_32, MISTRAL_V11_NO_IDS
from tests.text.tools.calls import (TIME, assert_parses, assert_streams_like_whole, check_call, mistral_style_ids,
                                    walk, weather)

WEATHER = weather(max_city=10)
CASES = [
    ('[TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "unit": "celsius"}', None,
     [("get_weather", '{"city": "Paris", "unit": "celsius"}')]),
    ('[TOOL_CALLS]get_weather[CALL_ID]a1B2c3D4e[ARGS]{"city": "Oslo", "unit": "celsius"}[TOOL_CALLS]get_time'
     '[CALL_ID]Z9y8X7w6v[ARGS]{"tz": "CET"}', None,
     [("get_weather", '{"city": "Oslo", "unit": "celsius"}'), ("get_time", '{"tz": "CET"}')]),
    ('Let me look.\n[TOOL_CALLS]f[ARGS]{"s": "a } ] [ARGS] \\" inside", "n": [1, {"x": null}]}', "Let me look.",
     [("f", '{"s": "a } ] [ARGS] \\" inside", "n": [1, {"x": null}]}')]),
    ("[TOOL_CALLS]f[ARGS] {}\n[TOOL_CALLS]g[ARGS]{}", None, [("f", "{}"), ("g", "{}")]),
    ('[TOOL_CALLS]f[ARGS]{"a": "cut', None, [("f", '{"a": "cut')]),               # cut off by max_tokens
    ("[TOOL_CALLS]f[ARGS]", None, [("f", "{}")]),
    ("No call: [TOOL_CALLS] is a token.", "No call: [TOOL_CALLS] is a token.", []),
    ("[TOOL_CALLS]half a name", "[TOOL_CALLS]half a name", []),
    ("plain text [with brackets]", "plain text [with brackets]", []),
]


@pytest.mark.parametrize("text,content,calls", CASES)
def test_parse_whole_output(text, content, calls):
    assert_parses(MISTRAL_V11, text, content, calls, mistral_style_ids, lambda i: f"id{i:07d}")


@pytest.mark.parametrize("text,content,calls", CASES)
def test_streamed_deltas_rebuild_the_same_calls(text, content, calls):
    assert_streams_like_whole(MISTRAL_V11, text, content, calls, mistral_style_ids, seed=3, trials=25, max_cuts=25)


def test_name_first_then_argument_fragments():
    parser = ToolCallParser(MISTRAL_V11, mistral_style_ids())
    assert parser.feed("[TOOL_CALLS]get_wea") == []                    # the name is not complete yet
    events = parser.feed('ther[ARGS]{"city": "Pa')
    assert events == [ToolCallStart(0, "id0000000", "get_weather"), ToolArgsDelta(0, '{"city": "Pa')]
    assert parser.feed('ris"}  ') == [ToolArgsDelta(0, 'ris"}')]           # never past the closing brace
    assert parser.finish() == []


def test_default_ids_are_mistral_ids():
    _, calls = parse_tool_calls("[TOOL_CALLS]f[ARGS]{}", MISTRAL_V11)
    assert re.fullmatch(r"[A-Za-z0-9]{9}", calls[0].id)


# ---- grammars -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("template", [MISTRAL_SMALL_32, MISTRAL_V11_NO_IDS])
@pytest.mark.parametrize("parallel", [False, True])
def test_required_grammar_gives_valid_calls(mistral, template, parallel):
    tok, compiler = mistral
    fmt = detect_format(template, tok.hf.token_to_id)
    markers = marker_ids(tok.hf.token_to_id)
    compiled = compiler.compile_sync(tool_call_grammar(parse_tools([WEATHER, TIME]), fmt, parallel=parallel,
                                                       markers=markers))
    for seed in range(4):
        text = walk(tok, compiler, compiled.new_matcher(), seed, max_tokens=200)
        assert text.startswith("[TOOL_CALLS]get_")
        assert ("[CALL_ID]" in text) == fmt.call_ids
        if fmt.call_ids:
            assert re.search(r"\[CALL_ID\][A-Za-z0-9]{9}\[ARGS\]", text), text
        content, calls = parse_tool_calls(text, fmt)
        assert content is None and calls, text
        assert len(calls) == 1 or parallel
        for c in calls:
            check_call(c, max_city=10)


def test_named_choice_forces_that_function(mistral):
    tok, compiler = mistral
    fmt = detect_format(MISTRAL_SMALL_32)
    compiled = compiler.compile_sync(tool_call_grammar(parse_tools([WEATHER, TIME]), fmt, only="get_time",
                                                       parallel=False, markers=marker_ids(tok.hf.token_to_id)))
    for seed in range(3):
        _, calls = parse_tool_calls(walk(tok, compiler, compiled.new_matcher(), seed, max_tokens=200), fmt)
        assert [c.name for c in calls] == ["get_time"]
        check_call(calls[0], max_city=10)


def test_auto_is_free_until_tool_calls_then_constrained(mistral):
    tok, compiler = mistral
    fmt = detect_format(MISTRAL_V11_NO_IDS)
    trigger = trigger_token(fmt, tok.hf.token_to_id)
    assert tok.decode([trigger], skip_special=False) == "[TOOL_CALLS]"
    compiled = compiler.compile_sync(tool_call_grammar(parse_tools([WEATHER]), fmt, parallel=False,
                                                       markers=marker_ids(tok.hf.token_to_id)))
    lazy = LazyMatcher(compiled, trigger)
    row = np.zeros(compiler.mask_words(), np.uint32)
    for t in tok.encode("the city", add_special=False):            # free text: no mask
        assert not lazy.fill_mask(row) and lazy.advance(t)
    assert lazy.advance(trigger) and lazy.fill_mask(row)            # the call grammar from the trigger on
    args_id = tok.hf.token_to_id("[ARGS]")
    assert not row[args_id >> 5] & (1 << (args_id & 31))            # a name must come before [ARGS]
    text = "[TOOL_CALLS]" + walk(tok, compiler, lazy, seed=5, max_tokens=200)
    _, calls = parse_tool_calls(text, fmt)
    assert [c.name for c in calls] == ["get_weather"]
    check_call(calls[0], max_city=10)


def test_v11_grammar_needs_the_markers():
    fmt = detect_format(MISTRAL_SMALL_32)
    with pytest.raises(ToolError, match=r"\[TOOL_CALLS\]"):
        tool_call_grammar(parse_tools([TIME]), fmt, markers={})
    with pytest.raises(ToolError, match=r"\[CALL_ID\]"):
        tool_call_grammar(parse_tools([TIME]), fmt, markers={"[TOOL_CALLS]": 5, "[ARGS]": 6})


def test_auto_with_a_response_format_is_that_json_or_calls(mistral):
    tok, compiler = mistral
    fmt = detect_format(MISTRAL_SMALL_32)
    answer = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}}, "required": ["answer"],
              "additionalProperties": False}
    compiled = compiler.compile_sync(tool_call_grammar(parse_tools([TIME]), fmt, parallel=False, or_json=answer,
                                                       markers=marker_ids(tok.hf.token_to_id)))
    kinds = set()
    for seed in range(8):
        text = walk(tok, compiler, compiled.new_matcher(), seed, max_tokens=200)
        content, calls = parse_tool_calls(text, fmt)
        if calls:
            kinds.add("call")
            assert content is None and [c.name for c in calls] == ["get_time"]
            check_call(calls[0], max_city=10)
        else:
            kinds.add("json")
            assert json.loads(content)["answer"] in ("yes", "no")
    assert kinds
