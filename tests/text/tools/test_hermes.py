"""inferd.text.tools.hermes: `<tool_call>` JSON blocks (and fenced ```json calls of a known tool) parsed whole and
streamed, which must agree, and the call grammars (required / named / lazy auto) walked with the real
Qwen2.5-Coder vocabulary where the file is present. A generic template's calls are this syntax too."""
from __future__ import annotations

import json

import numpy as np
import pytest

from inferd.text.tools import (
    GENERIC,
    HERMES,
    ContentDelta,
    LazyMatcher,
    ToolArgsDelta,
    ToolCallParser,
    ToolCallStart,
    parse_tool_calls,
    parse_tools,
    tool_call_grammar,
    trigger_token,
)
from tests.text.tools.calls import (TIME, WEATHER, assert_parses, assert_streams_like_whole, check_call, ids,
                                    needs_qwen, walk)

HERMES_OUT = ('Let me check both.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": '
              '"celsius", "note": "a } and a \\" inside"}}\n</tool_call>\n<tool_call>\n{"name": "get_time", '
              '"arguments": {"tz": "CET"}}\n</tool_call>')
CASES = [
    (HERMES, HERMES_OUT, "Let me check both.",
     [("get_weather", '{"city": "Paris", "unit": "celsius", "note": "a } and a \\" inside"}'),
      ("get_time", '{"tz": "CET"}')]),
    (HERMES, '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>', None, [("get_time", "{}")]),
    (HERMES, '<tool_call>\n{"arguments": {"tz": "UTC"}, "name": "get_time"}\n</tool_call>', None,
     [("get_time", '{"tz": "UTC"}')]),                                   # name after the arguments
    (HERMES, '<tool_call>\n{"name": "f", "arguments": "{\\"a\\": 1}"}\n</tool_call>', None,
     [("f", '{"a": 1}')]),                                               # arguments as a JSON string
    (HERMES, "No tools needed: 2 + 2 = 4.", "No tools needed: 2 + 2 = 4.", []),
    (HERMES, "I could use <tool_call> but no.", "I could use <tool_call> but no.", []),
    (HERMES, '<tool_call>\n{"name": "get_time", "arguments": {"tz": "CE', None,
     [("get_time", '{"tz": "CE')]),                                      # cut off by max_tokens
    (GENERIC, 'Sure.\n<tool_call>\n{"name": "f", "arguments": {"x": true}}\n</tool_call>', "Sure.",
     [("f", '{"x": true}')]),
]


@pytest.mark.parametrize("fmt,text,content,calls", CASES)
def test_parse_whole_output(fmt, text, content, calls):
    got_calls = assert_parses(fmt, text, content, calls, ids, lambda i: f"call_{i}")
    for c in got_calls:
        if not c.arguments.endswith("CE"):
            json.loads(c.arguments)


@pytest.mark.parametrize("fmt,text,content,calls", CASES)
def test_streamed_deltas_rebuild_the_same_calls(fmt, text, content, calls):
    assert_streams_like_whole(fmt, text, content, calls, ids, seed=7, trials=20, max_cuts=30)


def test_arguments_stream_before_the_call_ends():
    parser = ToolCallParser(HERMES, ids())
    events = parser.feed('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par')
    assert isinstance(events[0], ToolCallStart) and events[0].name == "get_weather"
    assert "".join(e.text for e in events[1:] if isinstance(e, ToolArgsDelta)) == '{"city": "Par'
    assert parser.feed("<tool") == [ToolArgsDelta(0, "<tool")]       # inside a string: argument text, at once
    events = parser.feed('is"}}\n</tool_call>')
    assert events == [ToolArgsDelta(0, 'is"}')]                      # never past the arguments' closing brace


FENCED = 'I will call it.\n```json\n{\n  "name": "get_time",\n  "arguments": {"tz": "UTC"}\n}\n```'


def test_a_fenced_json_call_of_a_known_tool_is_a_call():
    """Qwen2.5-Coder often answers `auto` with a ```json block instead of <tool_call>: with the request's tool names
    that is a call (also streamed piece by piece); a fenced object naming no tool stays text."""
    content, calls = parse_tool_calls(FENCED, HERMES, ids(), tool_names=["get_time"])
    assert content == "I will call it." and [(c.name, c.arguments) for c in calls] == [("get_time", '{"tz": "UTC"}')]
    parser = ToolCallParser(HERMES, ids(), tool_names=["get_time"])
    events = [e for ch in FENCED for e in parser.feed(ch)] + parser.finish()
    assert "".join(e.text for e in events if isinstance(e, ToolArgsDelta)) == '{"tz": "UTC"}'
    assert "".join(e.text for e in events if isinstance(e, ContentDelta)) == "I will call it."
    assert parse_tool_calls(FENCED, HERMES, ids())[1] == []                         # without tool names: text
    other = 'See:\n```json\n{"name": "Bob", "age": 3}\n```'
    assert parse_tool_calls(other, HERMES, ids(), tool_names=["get_time"]) == (other, [])
    code = "```json\n[1, 2]\n```"
    assert parse_tool_calls(code, HERMES, ids(), tool_names=["get_time"]) == (code, [])


# ---- grammars ---------------------------------------------------------------------------------------------------
@needs_qwen
@pytest.mark.parametrize("parallel", [False, True])
def test_required_grammar_gives_valid_calls(qwen, parallel):
    tok, _, compiler = qwen
    tools = parse_tools([WEATHER, TIME])
    compiled = compiler.compile_sync(tool_call_grammar(tools, HERMES, parallel=parallel))
    for seed in range(4):
        text = walk(tok, compiler, compiled.new_matcher(), seed)
        content, calls = parse_tool_calls(text, HERMES)
        assert content is None and calls, text
        assert len(calls) == 1 or parallel
        for c in calls:
            check_call(c)


@needs_qwen
def test_named_tool_choice_forces_that_function(qwen):
    tok, _, compiler = qwen
    compiled = compiler.compile_sync(tool_call_grammar(parse_tools([WEATHER, TIME]), HERMES, only="get_time",
                                                       parallel=False))
    for seed in range(3):
        _, calls = parse_tool_calls(walk(tok, compiler, compiled.new_matcher(), seed), HERMES)
        assert [c.name for c in calls] == ["get_time"]
        check_call(calls[0])


@needs_qwen
def test_auto_is_free_until_the_trigger_token_then_constrained(qwen):
    tok, _, compiler = qwen
    trigger = trigger_token(HERMES, tok.hf.token_to_id)
    assert trigger is not None and tok.decode([trigger], skip_special=False) == "<tool_call>"
    lazy = LazyMatcher(compiler.compile_sync(tool_call_grammar(parse_tools([WEATHER, TIME]), HERMES)), trigger)
    row = np.zeros(compiler.mask_words(), np.uint32)
    for t in tok.encode("Sure, checking.\n", add_special=False):     # free text: no mask
        assert not lazy.fill_mask(row) and lazy.advance(t)
    assert lazy.accepts_eos() and not lazy.is_done
    text = "Sure, checking.\n" + walk(tok, compiler, _Forced(lazy, trigger), seed=3)
    content, calls = parse_tool_calls(text, HERMES)
    assert content == "Sure, checking." and calls
    for c in calls:
        check_call(c)


class _Forced:
    """Walk helper: the model writes the trigger token first, then the lazy grammar takes over."""

    def __init__(self, lazy: LazyMatcher, trigger: int):
        self.lazy, self.trigger, self.first = lazy, trigger, True

    def fill_mask(self, row):
        if self.first:
            row[:] = 0
            row[self.trigger >> 5] = np.uint32(1 << (self.trigger & 31))
            return True
        return self.lazy.fill_mask(row)

    def advance(self, token):
        self.first = False
        return self.lazy.advance(token)

    @property
    def is_done(self):
        return self.lazy.is_done

    @property
    def error(self):
        return self.lazy.error
