"""inferd.text.tools.deepseek_v3 / deepseek_v31 (deepseek_calls): DeepSeek's call lists, V3's fenced form
(`function<｜tool▁sep｜>name\n```json\n{...}\n```) and V3.1's bare one (`name<｜tool▁sep｜>{...}`), parsed whole and
streamed (any split gives the same calls), the grammars walked on the real marker tokens, detection from the
published templates and past calls rendered through them and parsed back."""
from __future__ import annotations

import json

import pytest

from inferd.text.chat import ChatTemplate
from inferd.text.tools import (DEEPSEEK_V3, DEEPSEEK_V31, ToolArgsDelta, ToolCallParser, ToolCallStart, detect_format,
                               parse_tool_calls, parse_tools, prepare_messages, template_tools, tool_call_grammar)
from tests.text.tools.calls import (TIME, assert_lazy_grammar_takes, assert_parses, assert_streams_like_whole,
                                    check_call, ids, walk, weather)
from tests.text.tools.templates import template

B, E, CB, CE, SEP = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", \
    "<｜tool▁sep｜>"
WEATHER = weather(max_city=10)


def v31(*calls):
    return B + "".join(f"{CB}{n}{SEP}{a}{CE}" for n, a in calls) + E


def v3(*calls):
    return B + "".join(f"{CB}function{SEP}{n}\n```json\n{a}\n```{CE}" for n, a in calls) + E


TRICKY = '{"s": "a } ``` <｜tool▁call▁end｜> \\" x"}'
PAIRS = [("get_weather", '{"city": "Paris", "unit": "celsius"}'), ("get_time", '{"tz": "CET"}')]
CASES = {
    DEEPSEEK_V31: [
        (v31(PAIRS[0]), None, PAIRS[:1]),
        ("Checking.\n" + v31(*PAIRS), "Checking.", PAIRS),
        (v31(("f", TRICKY)), None, [("f", TRICKY)]),
        (f"{CB}f{SEP}{{}}{CE}", None, [("f", "{}")]),                        # the list's marker left out
        (f'{B}{CB}f{SEP}{{"a": "cut', None, [("f", '{"a": "cut')]),
        (f"{B}{CB}f{SEP}", None, [("f", "{}")]),
        ("plain text", "plain text", []),
    ],
    DEEPSEEK_V3: [
        (v3(PAIRS[0]), None, PAIRS[:1]),
        ("Checking.\n" + v3(*PAIRS), "Checking.", PAIRS),
        (v3(("f", "{}")), None, [("f", "{}")]),
        (f'{B}{CB}function{SEP}f\n```json\n{{"a": [1, 2', None, [("f", '{"a": [1, 2')]),
        ("plain ```json text", "plain ```json text", []),
    ],
}
ALL = [(fmt, *case) for fmt, cases in CASES.items() for case in cases]


@pytest.mark.parametrize("fmt,text,content,calls", ALL)
def test_parse_whole_output(fmt, text, content, calls):
    assert_parses(fmt, text, content, calls, ids, lambda i: f"call_{i}")


@pytest.mark.parametrize("fmt,text,content,calls", ALL)
def test_streamed_deltas_rebuild_the_same_calls(fmt, text, content, calls):
    assert_streams_like_whole(fmt, text, content, calls, ids, seed=11, trials=30, max_cuts=30)


def test_name_first_then_argument_fragments():
    parser = ToolCallParser(DEEPSEEK_V31, ids())
    assert parser.feed(f"{B}{CB}get_wea") == []
    assert parser.feed(f'ther{SEP}{{"city": "Pa') == [ToolCallStart(0, "call_0", "get_weather"),
                                                    ToolArgsDelta(0, '{"city": "Pa')]
    assert parser.feed(f'ris"}}{CE}{E}') == [ToolArgsDelta(0, 'ris"}')]
    assert parser.finish() == []


@pytest.mark.parametrize("fmt", [DEEPSEEK_V3, DEEPSEEK_V31])
@pytest.mark.parametrize("parallel", [False, True])
def test_required_grammar_on_the_marker_tokens_gives_valid_calls(tiny_vocab, fmt, parallel):
    tok, compiler = tiny_vocab(fmt)
    token_id_of = tok.hf.token_to_id
    markers = {m: token_id_of(m) for m in (B, E, CB, CE, SEP)}
    compiled = compiler.compile_sync(tool_call_grammar(parse_tools([WEATHER, TIME]), fmt, parallel=parallel,
                                                       markers=markers))
    for seed in range(3):
        text = walk(tok, compiler, compiled.new_matcher(), seed, max_tokens=300)
        content, calls = parse_tool_calls(text, fmt, ids())
        assert content is None and calls and (parallel or len(calls) == 1), text
        for c in calls:
            check_call(c, max_city=10)


@pytest.mark.parametrize("fmt,write", [(DEEPSEEK_V3, v3), (DEEPSEEK_V31, v31)])
def test_auto_grammar_starts_at_the_marker_token(tiny_vocab, fmt, write):
    tok, compiler = tiny_vocab(fmt)
    assert_lazy_grammar_takes(tok, compiler, fmt, parse_tools([WEATHER, TIME]), "Let me check.\n" + write(*PAIRS))


@pytest.mark.parametrize("name,fmt", [("deepseek-ai-DeepSeek-V3.1", DEEPSEEK_V31),
                                      ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", DEEPSEEK_V3)])
def test_detected_and_past_calls_render_as_the_model_writes_them(name, fmt):
    src = template(name)
    detected = detect_format(src)
    assert detected.name == fmt
    tools = parse_tools([WEATHER])
    args = '{"city": "Paris", "unit": "celsius"}'
    history = [{"role": "user", "content": "Weather in Paris?"},
               {"role": "assistant", "content": "", "tool_calls": [
                   {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": args}}]},
               {"role": "tool", "tool_call_id": "call_1", "content": "22 C"}]
    messages = prepare_messages(history, detected, tools)
    text = ChatTemplate(src).render(messages, True, template_tools(tools, detected))
    assert "get_weather" in text and "22 C" in text
    block = text[text.rindex(B):]
    block = block[: block.index(E) + len(E)]
    _, calls = parse_tool_calls(block, fmt, ids())
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", json.loads(args))]
    if not detected.template_renders_tools:          # the tools in a system block, the call shown in DeepSeek's form
        assert messages[0]["role"] == "system" and B in messages[0]["content"] and "<tool_call>" not in text
