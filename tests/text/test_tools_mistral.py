"""Mistral's v11 tool calls (`[TOOL_CALLS]name([CALL_ID]id)?[ARGS]{json}`): detection from the template and the
vocabulary, the conversation rendered through Mistral Small 3.2's published template, whole and streamed parsing
(which must agree), and the call grammars walked with the tiny Mistral vocabulary (tests/text/mistral_v11.py)."""
from __future__ import annotations

import json
import random
import re

import numpy as np
import pytest
from gguf import GGUFReader

from inferd import _cpu
from inferd.text.chat import render_chat
from inferd.text.grammar import GrammarCompiler
from inferd.text.tools import JsonValue, mistral_id
from inferd.text.tokenizer import Tokenizer
from inferd.text.tools import (
    MISTRAL,
    MISTRAL_V11,
    ContentDelta,
    LazyMatcher,
    ToolArgsDelta,
    ToolCallParser,
    ToolCallStart,
    ToolError,
    ToolFormat,
    detect_format,
    parse_tool_calls,
    parse_tools,
    prepare_messages,
    shown_tokens,
    template_tools,
    tool_call_grammar,
    trigger_token,
)
from inferd.text.tools import marker_ids
from tests.text.mistral_v11 import MISTRAL_SMALL_32, MISTRAL_V11_NO_IDS, write_tiny_mistral

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "additionalProperties": False, "required": ["city", "unit"],
                   "properties": {"city": {"type": "string", "maxLength": 10},
                                  "unit": {"enum": ["celsius", "fahrenheit"]}}}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"tz": {"type": "string", "pattern": "^[A-Z]{3}$"}}, "required": ["tz"],
    "additionalProperties": False}}}
CONVERSATION = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_abc", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'}}]},
    {"role": "tool", "tool_call_id": "call_abc", "content": [{"type": "text", "text": "22 C, sunny"}]},
]


class _BOS_EOS:  # what render_chat reads from a tokenizer
    bos_token, eos_token = "<s>", "</s>"


@pytest.fixture(scope="module")
def mistral(tmp_path_factory):
    path = write_tiny_mistral(tmp_path_factory.mktemp("mistral") / "tiny-mistral.gguf")
    tok = Tokenizer.from_gguf(GGUFReader(str(path)).fields)
    compiler = GrammarCompiler(tok, tok.vocab_size)
    yield tok, compiler
    compiler.close()


def ids():
    counter = iter(range(1000))
    return lambda: f"id{next(counter):07d}"


# ---- detection and rendering ------------------------------------------------------------------------------------
def test_detect_v11_from_the_template_and_the_vocabulary(mistral):
    tok, _ = mistral
    fmt = detect_format(MISTRAL_SMALL_32)
    assert fmt == ToolFormat(MISTRAL_V11, True, call_ids=True) and fmt.is_mistral
    assert detect_format(MISTRAL_V11_NO_IDS) == ToolFormat(MISTRAL_V11, True, call_ids=False)
    old = "{% if tools %}[AVAILABLE_TOOLS]{% endif %}[TOOL_CALLS] [{{ calls | tojson }}]"
    assert detect_format(old).name == MISTRAL                                    # no [ARGS] anywhere: the list form
    bare = "{% for t in tools %}[AVAILABLE_TOOLS]{% endfor %}{{ '[TOOL_CALLS]' + name }}"
    assert detect_format(bare).name == MISTRAL
    assert detect_format(bare, tok.hf.token_to_id).name == MISTRAL_V11          # ... but the vocabulary has [ARGS]
    assert detect_format(old, tok.hf.token_to_id).name == MISTRAL               # a template writing the JSON list
    markers = marker_ids(tok.hf.token_to_id)
    assert set(markers) == {"[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"}
    assert shown_tokens(fmt, tok.hf.token_to_id) == frozenset(markers.values())
    assert all(t in tok.special_ids for t in markers.values())                  # control tokens, hidden by default


def test_v11_template_renders_calls_ids_and_results():
    fmt = detect_format(MISTRAL_SMALL_32)
    tools = parse_tools([WEATHER])
    msgs = prepare_messages(CONVERSATION, fmt, tools)
    cid = mistral_id("call_abc")
    assert re.fullmatch(r"[A-Za-z0-9]{9}", cid) and cid == mistral_id("call_abc") != mistral_id("call_abd")
    assert msgs[1]["tool_calls"][0]["id"] == cid and msgs[2]["tool_call_id"] == cid
    text = render_chat(MISTRAL_SMALL_32, msgs, tools=template_tools(tools, fmt), tokenizer=_BOS_EOS)
    assert text.startswith("<s>[SYSTEM_PROMPT]You are Mistral Small 3.")
    assert ("[AVAILABLE_TOOLS]" + json.dumps([WEATHER]) + "[/AVAILABLE_TOOLS][INST]Weather in Paris?[/INST]") in text
    assert text.endswith(f'[TOOL_CALLS]get_weather[CALL_ID]{cid}[ARGS]{{"city": "Paris", "unit": "celsius"}}</s>'
                         f"[TOOL_RESULTS]{cid}[TOOL_CONTENT]22 C, sunny[/TOOL_RESULTS]")
    nine = [{**CONVERSATION[1], "tool_calls": [{**CONVERSATION[1]["tool_calls"][0], "id": "Ab3dE6gH9"}]},
            {**CONVERSATION[2], "tool_call_id": "Ab3dE6gH9"}]
    kept = prepare_messages(CONVERSATION[:1] + nine, fmt, tools)
    assert kept[1]["tool_calls"][0]["id"] == "Ab3dE6gH9" == kept[2]["tool_call_id"]     # valid ids stay


def test_v11_template_without_ids():
    fmt = detect_format(MISTRAL_V11_NO_IDS)
    tools = parse_tools([WEATHER])
    text = render_chat(MISTRAL_V11_NO_IDS, prepare_messages(CONVERSATION, fmt, tools),
                       tools=template_tools(tools, fmt), tokenizer=_BOS_EOS)
    assert text.endswith('[TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "unit": "celsius"}</s>'
                         "[TOOL_RESULTS]22 C, sunny[/TOOL_RESULTS]")


# ---- parsing ----------------------------------------------------------------------------------------------------
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
    got_content, got_calls = parse_tool_calls(text, MISTRAL_V11, ids())
    assert got_content == content
    assert [(c.name, c.arguments) for c in got_calls] == calls
    assert [c.id for c in got_calls] == [f"id{i:07d}" for i in range(len(calls))]


@pytest.mark.parametrize("text,content,calls", CASES)
def test_streamed_deltas_rebuild_the_same_calls(text, content, calls):
    """Any split of the text: each call's index, id and name come before its arguments, the argument fragments
    concatenate to the whole-output arguments and the content to the whole-output content."""
    rng = random.Random(3)
    for trial in range(25):
        cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(1, 25))))
        pieces = [text[a:b] for a, b in zip([0] + cuts, cuts + [len(text)])] if trial else list(text)
        parser = ToolCallParser(MISTRAL_V11, ids())
        events = [e for p in pieces for e in parser.feed(p)] + parser.finish()
        started, args, streamed = {}, {}, ""
        for e in events:
            if isinstance(e, ToolCallStart):
                assert e.index == len(started)
                started[e.index], args[e.index] = e.name, ""
            elif isinstance(e, ToolArgsDelta):
                assert e.index in started and e.text
                args[e.index] += e.text
            else:
                assert isinstance(e, ContentDelta) and e.text
                streamed += e.text
        assert [(started[i], args[i]) for i in sorted(started)] == calls
        assert (streamed or None) == content if calls else streamed == content


def test_name_first_then_argument_fragments():
    parser = ToolCallParser(MISTRAL_V11, ids())
    assert parser.feed("[TOOL_CALLS]get_wea") == []                    # the name is not complete yet
    events = parser.feed('ther[ARGS]{"city": "Pa')
    assert events == [ToolCallStart(0, "id0000000", "get_weather"), ToolArgsDelta(0, '{"city": "Pa')]
    assert parser.feed('ris"}  ') == [ToolArgsDelta(0, 'ris"}')]           # never past the closing brace
    assert parser.finish() == []


def test_default_ids_are_mistral_ids():
    _, calls = parse_tool_calls("[TOOL_CALLS]f[ARGS]{}", MISTRAL_V11)
    assert re.fullmatch(r"[A-Za-z0-9]{9}", calls[0].id)


def test_json_value_scanner():
    for text, value, rest in [('{"a": "}"} tail', '{"a": "}"}', " tail"), ("  [1, [2]]x", "[1, [2]]", "x"),
                              ('"s\\"q" z', '"s\\"q"', " z"), ("12[TOOL_CALLS]", "12", "[TOOL_CALLS]")]:
        v = JsonValue()
        taken = v.feed(text)
        assert (v.raw, text[taken:], v.done) == (value, rest, True)


# ---- grammars -----------------------------------------------------------------------------------------------------
def walk(tok, compiler, matcher, seed, max_tokens=200):
    rng = np.random.default_rng(seed)
    row = np.zeros(compiler.mask_words(), np.uint32)
    out = []
    for pos in range(max_tokens):
        constrained = matcher.fill_mask(row)
        logits = rng.standard_normal(compiler.vocab_size).astype(np.float32) * 3
        token = _cpu.sample(logits, {"temperature": 1.0, "seed": seed}, pos, allowed=row if constrained else None)[0]
        assert matcher.advance(token), matcher.error
        if token in tok.eos_ids:
            break
        out.append(token)
        if matcher.is_done:
            break
    return tok.decode(out, skip_special=False)


def check_call(call):
    args = json.loads(call.arguments)
    if call.name == "get_weather":
        assert set(args) == {"city", "unit"} and len(args["city"]) <= 10 and args["unit"] in ("celsius", "fahrenheit")
    else:
        assert call.name == "get_time" and re.fullmatch("[A-Z]{3}", args["tz"]) and set(args) == {"tz"}


@pytest.mark.parametrize("template", [MISTRAL_SMALL_32, MISTRAL_V11_NO_IDS])
@pytest.mark.parametrize("parallel", [False, True])
def test_required_grammar_gives_valid_calls(mistral, template, parallel):
    tok, compiler = mistral
    fmt = detect_format(template, tok.hf.token_to_id)
    markers = marker_ids(tok.hf.token_to_id)
    compiled = compiler.compile_sync(tool_call_grammar(parse_tools([WEATHER, TIME]), fmt, parallel=parallel,
                                                       markers=markers))
    for seed in range(4):
        text = walk(tok, compiler, compiled.new_matcher(), seed)
        assert text.startswith("[TOOL_CALLS]get_")
        assert ("[CALL_ID]" in text) == fmt.call_ids
        if fmt.call_ids:
            assert re.search(r"\[CALL_ID\][A-Za-z0-9]{9}\[ARGS\]", text), text
        content, calls = parse_tool_calls(text, fmt)
        assert content is None and calls, text
        assert len(calls) == 1 or parallel
        for c in calls:
            check_call(c)


def test_named_choice_forces_that_function(mistral):
    tok, compiler = mistral
    fmt = detect_format(MISTRAL_SMALL_32)
    compiled = compiler.compile_sync(tool_call_grammar(parse_tools([WEATHER, TIME]), fmt, only="get_time",
                                                       parallel=False, markers=marker_ids(tok.hf.token_to_id)))
    for seed in range(3):
        _, calls = parse_tool_calls(walk(tok, compiler, compiled.new_matcher(), seed), fmt)
        assert [c.name for c in calls] == ["get_time"]
        check_call(calls[0])


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
    text = "[TOOL_CALLS]" + walk(tok, compiler, lazy, seed=5)
    _, calls = parse_tool_calls(text, fmt)
    assert [c.name for c in calls] == ["get_weather"]
    check_call(calls[0])


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
        text = walk(tok, compiler, compiled.new_matcher(), seed)
        content, calls = parse_tool_calls(text, fmt)
        if calls:
            kinds.add("call")
            assert content is None and [c.name for c in calls] == ["get_time"]
            check_call(calls[0])
        else:
            kinds.add("json")
            assert json.loads(content)["answer"] in ("yes", "no")
    assert kinds
