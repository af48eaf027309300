"""inferd.text.tools.qwen3_coder: Qwen3-Coder / Qwen3.5's XML calls (`<tool_call><function=name><parameter=p>`)
parsed whole and streamed (any split gives the same calls), values typed by the tool's schema, the call grammar
walked, detection from the published templates and past calls rendered through them and parsed back."""
from __future__ import annotations

import json

import pytest

from inferd.text.chat import ChatTemplate
from inferd.text.tools import (QWEN3_CODER, ToolArgsDelta, ToolCallParser, ToolCallStart, detect_format,
                               parse_tool_calls, parse_tools, prepare_messages, template_tools, tool_call_grammar)
from tests.text.tools.calls import (TIME, assert_lazy_grammar_takes, assert_parses, assert_streams_like_whole,
                                    check_call, ids, walk, weather)
from tests.text.tools.templates import template

WEATHER = weather(max_city=10)
TYPED = {"type": "function", "function": {"name": "edit", "parameters": {"type": "object", "properties": {
    "path": {"type": "string"}, "line": {"type": "integer"}, "force": {"type": "boolean"},
    "opts": {"type": "object"}, "tags": {"type": "array", "items": {"type": "string"}}, "ratio": {"type": "number"},
    "any": {}}}}}
SCHEMAS = {"edit": TYPED["function"]["parameters"]}


def call(name, params):
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params)
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


CASES = [
    (call("get_weather", [("city", "Paris"), ("unit", "celsius")]), None,
     [("get_weather", '{"city": "Paris", "unit": "celsius"}')]),
    ("Let me check.\n\n" + call("get_time", [("tz", "CET")]) + "\n" + call("get_weather", [("city", "Oslo")]),
     "Let me check.", [("get_time", '{"tz": "CET"}'), ("get_weather", '{"city": "Oslo"}')]),
    (call("write", [("text", 'two\nlines "quoted" \\ and </param'), ("n", "1")]), None,
     [("write", '{"text": "two\\nlines \\"quoted\\" \\\\ and </param", "n": "1"}')]),
    (call("f", []), None, [("f", "{}")]),
    ("<tool_call>\n<function=f>\n<parameter=a>\ncut off", None, [("f", '{"a": "cut off"}')]),   # max_tokens
    ("<tool_call>\n<function=f>\n<parameter=a>\nx\n<parameter=b>\ny\n</function>\n</tool_call>", None,
     [("f", '{"a": "x", "b": "y"}')]),                                            # a </parameter> left out
    ("No call: <tool_call> is a tag.", "No call: <tool_call> is a tag.", []),
    ("<tool_call>\n<function=not a name>", "<tool_call>\n<function=not a name>", []),
    ("plain <b>text</b>", "plain <b>text</b>", []),
]


@pytest.mark.parametrize("text,content,calls", CASES)
def test_parse_whole_output(text, content, calls):
    assert_parses(QWEN3_CODER, text, content, calls, ids, lambda i: f"call_{i}")


@pytest.mark.parametrize("text,content,calls", CASES)
def test_streamed_deltas_rebuild_the_same_calls(text, content, calls):
    assert_streams_like_whole(QWEN3_CODER, text, content, calls, ids, seed=5, trials=30, max_cuts=30)


def test_values_typed_by_the_schema():
    text = call("edit", [("path", "a.py"), ("line", "12"), ("force", "true"), ("opts", '{"x": [1]}'),
                         ("tags", '["a", "b"]'), ("ratio", "0.5"), ("any", "7")])
    _, calls = parse_tool_calls(text, QWEN3_CODER, ids(), param_schemas=SCHEMAS)
    assert json.loads(calls[0].arguments) == {"path": "a.py", "line": 12, "force": True, "opts": {"x": [1]},
                                              "tags": ["a", "b"], "ratio": 0.5, "any": "7"}
    _, calls = parse_tool_calls(call("edit", [("line", "twelve"), ("path", "12")]), QWEN3_CODER, ids(),
                                param_schemas=SCHEMAS)
    assert json.loads(calls[0].arguments) == {"line": "twelve", "path": "12"}     # no JSON: kept as the string


def test_name_first_then_argument_fragments():
    parser = ToolCallParser(QWEN3_CODER, ids())
    assert parser.feed("<tool_call>\n<function=get_wea") == []
    assert parser.feed("ther>\n<parameter=city>\nPa") == [ToolCallStart(0, "call_0", "get_weather"),
                                                          ToolArgsDelta(0, '{"city": "'), ToolArgsDelta(0, "Pa")]
    assert parser.feed("ris\n</param") == [ToolArgsDelta(0, "ris")]               # the newline may be the format's
    assert parser.feed("eter>\n</function>\n</tool_call>") == [ToolArgsDelta(0, '"'), ToolArgsDelta(0, "}")]
    assert parser.finish() == []


# ---- grammars -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("parallel", [False, True])
def test_required_grammar_gives_valid_calls(mistral, parallel):
    tok, compiler = mistral
    tools = parse_tools([WEATHER, TIME])
    compiled = compiler.compile_sync(tool_call_grammar(tools, QWEN3_CODER, parallel=parallel))
    for seed in range(4):
        text = walk(tok, compiler, compiled.new_matcher(), seed, max_tokens=400)
        content, calls = parse_tool_calls(text, QWEN3_CODER, ids(), param_schemas={t.name: t.parameters for t in tools})
        assert content is None and calls and (parallel or len(calls) == 1), text
        for c in calls:
            check_call(c, max_city=10)


def test_typed_values_follow_their_schema(mistral):
    tok, compiler = mistral
    tools = parse_tools([{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "required": ["n", "ok"], "properties": {"n": {"type": "integer", "minimum": 0,
                                                                         "maximum": 9}, "ok": {"type": "boolean"}}}}}])
    compiled = compiler.compile_sync(tool_call_grammar(tools, QWEN3_CODER, parallel=False))
    for seed in range(3):
        text = walk(tok, compiler, compiled.new_matcher(), seed)
        _, calls = parse_tool_calls(text, QWEN3_CODER, ids(), param_schemas={"f": tools[0].parameters})
        args = json.loads(calls[0].arguments)
        assert isinstance(args["n"], int) and 0 <= args["n"] <= 9 and isinstance(args["ok"], bool), text


def test_auto_grammar_starts_at_the_marker_token(tiny_vocab):
    tok, compiler = tiny_vocab(QWEN3_CODER)
    assert_lazy_grammar_takes(tok, compiler, QWEN3_CODER, parse_tools([TIME]), "Let me see.\n" +
                              call("get_time", [("tz", "CET")]))


# ---- templates ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["Qwen3-Coder", "Qwen3.5-4B"])
def test_detected_and_past_calls_render_as_the_model_writes_them(name):
    src = template(name)
    fmt = detect_format(src)
    assert fmt.name == QWEN3_CODER and fmt.template_renders_tools
    tools = parse_tools([WEATHER, TYPED])
    args = '{"path": "a.py", "line": 3, "opts": {"x": 1}}'
    history = [{"role": "user", "content": "Fix a.py"},
               {"role": "assistant", "content": "", "tool_calls": [
                   {"id": "call_1", "type": "function", "function": {"name": "edit", "arguments": args}}]},
               {"role": "tool", "tool_call_id": "call_1", "content": "done"}]
    text = ChatTemplate(src).render(prepare_messages(history, fmt, tools), True, template_tools(tools, fmt))
    assert "<parameter=line>\n3\n</parameter>" in text and "<function=get_weather>" not in text.split("<tools>")[0]
    block = text[text.index("<tool_call>\n<function=edit>"):]
    block = block[: block.index("</tool_call>") + len("</tool_call>")]
    _, calls = parse_tool_calls(block, fmt, ids(), param_schemas={"edit": TYPED["function"]["parameters"]})
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("edit", json.loads(args))]
