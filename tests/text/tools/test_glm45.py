"""inferd.text.tools.glm45: GLM-4.5+'s calls (`<tool_call>name\n<arg_key>k</arg_key>\n<arg_value>v</arg_value>`)
parsed whole and streamed (any split gives the same calls), values typed by the tool's schema, the grammar walked,
detection from the published templates and past calls rendered through them and parsed back."""
from __future__ import annotations

import json

import pytest

from inferd.text.chat import ChatTemplate
from inferd.text.tools import (GLM45, ToolArgsDelta, ToolCallParser, ToolCallStart, detect_format, marker_token_ids,
                               parse_tool_calls,
                               parse_tools, prepare_messages, template_tools, tool_call_grammar)
from tests.text.tools.calls import (TIME, assert_lazy_grammar_takes, assert_parses, assert_streams_like_whole,
                                    check_call, ids, walk, weather)
from tests.text.tools.templates import template

WEATHER = weather(max_city=10)
SCHEMAS = {"edit": {"type": "object", "properties": {"path": {"type": "string"}, "line": {"type": "integer"},
                                                     "opts": {"type": "object"}}}}


def call(name, pairs):
    return f"<tool_call>{name}\n" + "".join(f"<arg_key>{k}</arg_key>\n<arg_value>{v}</arg_value>\n"
                                            for k, v in pairs) + "</tool_call>"


CASES = [
    (call("get_weather", [("city", "Paris"), ("unit", "celsius")]), None,
     [("get_weather", '{"city": "Paris", "unit": "celsius"}')]),
    ("I will look it up.\n" + call("get_time", [("tz", "CET")]) + "\n" + call("get_weather", [("city", "Oslo")]),
     "I will look it up.", [("get_time", '{"tz": "CET"}'), ("get_weather", '{"city": "Oslo"}')]),
    (call("write", [("text", 'two\nlines "q" </arg_val')]), None,
     [("write", '{"text": "two\\nlines \\"q\\" </arg_val"}')]),
    ("<tool_call>f</tool_call>", None, [("f", "{}")]),
    ("<tool_call>f\n<arg_key>a</arg_key>\n<arg_value>cut", None, [("f", '{"a": "cut"}')]),
    ("A <tool_call> tag in text", "A <tool_call> tag in text", []),
    ("plain text", "plain text", []),
]


@pytest.mark.parametrize("text,content,calls", CASES)
def test_parse_whole_output(text, content, calls):
    assert_parses(GLM45, text, content, calls, ids, lambda i: f"call_{i}")


@pytest.mark.parametrize("text,content,calls", CASES)
def test_streamed_deltas_rebuild_the_same_calls(text, content, calls):
    assert_streams_like_whole(GLM45, text, content, calls, ids, seed=7, trials=30, max_cuts=30)


def test_values_typed_by_the_schema():
    text = call("edit", [("path", "12"), ("line", "12"), ("opts", '{"a": true}')])
    _, calls = parse_tool_calls(text, GLM45, ids(), param_schemas=SCHEMAS)
    assert json.loads(calls[0].arguments) == {"path": "12", "line": 12, "opts": {"a": True}}


def test_name_first_then_argument_fragments():
    parser = ToolCallParser(GLM45, ids())
    assert parser.feed("<tool_call>get_wea") == []
    assert parser.feed("ther\n<arg_key>city</arg_key>\n<arg_value>Pa") == [
        ToolCallStart(0, "call_0", "get_weather"), ToolArgsDelta(0, '{"city": "'), ToolArgsDelta(0, "Pa")]
    assert parser.feed("ris</arg_value>\n</tool_call>") == [ToolArgsDelta(0, 'ris"'), ToolArgsDelta(0, "}")]
    assert parser.finish() == []


@pytest.mark.parametrize("parallel", [False, True])
def test_required_grammar_gives_valid_calls(mistral, parallel):
    tok, compiler = mistral
    tools = parse_tools([WEATHER, TIME])
    compiled = compiler.compile_sync(tool_call_grammar(tools, GLM45, parallel=parallel))
    for seed in range(4):
        text = walk(tok, compiler, compiled.new_matcher(), seed, max_tokens=400)
        content, calls = parse_tool_calls(text, GLM45, ids())
        assert content is None and calls and (parallel or len(calls) == 1), text
        for c in calls:
            check_call(c, max_city=10)


def test_auto_grammar_starts_at_the_marker_token(tiny_vocab):
    tok, compiler = tiny_vocab(GLM45)
    assert_lazy_grammar_takes(tok, compiler, GLM45, parse_tools([TIME, WEATHER]),
                              "Checking.\n" + call("get_time", [("tz", "CET")]) + "\n" +
                              call("get_weather", [("city", "Rome"), ("unit", "celsius")]))


@pytest.mark.parametrize("name", ["GLM-4.6", "GLM-4.7-Flash"])
def test_detected_and_past_calls_render_as_the_model_writes_them(name):
    src = template(name)
    fmt = detect_format(src)
    assert fmt.name == GLM45 and fmt.template_renders_tools
    tools = parse_tools([WEATHER, {"type": "function", "function": {"name": "edit", "parameters": SCHEMAS["edit"]}}])
    args = '{"path": "a.py", "line": 3, "opts": {"x": 1}}'
    history = [{"role": "user", "content": "Fix a.py"},
               {"role": "assistant", "content": "", "tool_calls": [
                   {"id": "call_1", "type": "function", "function": {"name": "edit", "arguments": args}}]},
               {"role": "tool", "tool_call_id": "call_1", "content": "done"}]
    text = ChatTemplate(src).render(prepare_messages(history, fmt, tools), True, template_tools(tools, fmt))
    block = text[text.index("<tool_call>edit"):]
    block = block[: block.index("</tool_call>") + len("</tool_call>")]
    _, calls = parse_tool_calls(block, fmt, ids(), param_schemas=SCHEMAS)
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("edit", json.loads(args))]


@pytest.mark.parametrize("parallel", [False, True])
def test_required_grammar_on_the_marker_tokens_gives_valid_calls(tiny_vocab, parallel):
    """GLM's vocabulary has its argument tags as tokens: the grammar matches them as tokens, the text keeps them."""
    tok, compiler = tiny_vocab(GLM45)
    markers = marker_token_ids(GLM45, tok.hf.token_to_id)
    assert set(markers) == {"<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"}
    edit = {"type": "object", "required": ["line"], "additionalProperties": False, "properties": {
        "path": {"type": "string", "maxLength": 8}, "line": {"type": "integer", "minimum": 0, "maximum": 999}}}
    tools = parse_tools([WEATHER, TIME, {"type": "function", "function": {"name": "edit", "parameters": edit}}])
    compiled = compiler.compile_sync(tool_call_grammar(tools, GLM45, parallel=parallel, markers=markers))
    for seed in range(4):
        text = walk(tok, compiler, compiled.new_matcher(), seed, max_tokens=300)
        content, calls = parse_tool_calls(text, GLM45, ids(), param_schemas={t.name: t.parameters for t in tools})
        assert content is None and calls and (parallel or len(calls) == 1), text
        for c in calls:
            if c.name == "edit":
                assert isinstance(json.loads(c.arguments)["line"], int), text
            else:
                check_call(c, max_city=10)
