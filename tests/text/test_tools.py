"""inferd.text.tools: tools into the chat template, the model's calls back out (whole and streamed, which must
agree), and the call grammars (required / named / lazy auto), checked with the real Qwen2.5-Coder chat template and
vocabulary where the file is present, and synthetic outputs for the Llama 3 and Mistral syntaxes."""
from __future__ import annotations

import json
import os
import random
from pathlib import Path

import numpy as np
import pytest

from inferd import _cpu
from inferd.text.chat import render_chat
from inferd.text.grammar import GrammarCompiler
from inferd.text.tokenizer import Tokenizer
from inferd.text.tools import (
    GENERIC,
    HERMES,
    LLAMA3,
    MISTRAL,
    ContentDelta,
    LazyMatcher,
    ToolArgsDelta,
    ToolCallParser,
    ToolCallStart,
    ToolError,
    detect_format,
    parse_tool_calls,
    parse_tool_choice,
    parse_tools,
    prepare_messages,
    template_tools,
    tool_call_grammar,
    trigger_token,
)

QWEN = Path(os.environ.get("INFERD_TEST_MODELS", Path.home() / ".cache/inferd-test-models")) / \
    "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
needs_qwen = pytest.mark.skipif(not QWEN.is_file(), reason=f"{QWEN} not fetched (../shared/models/fetch.sh)")

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "additionalProperties": False, "required": ["city", "unit"],
                   "properties": {"city": {"type": "string", "maxLength": 12},
                                  "unit": {"enum": ["celsius", "fahrenheit"]}}}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"tz": {"type": "string", "pattern": "^[A-Z]{3}$"}}, "required": ["tz"],
    "additionalProperties": False}}}
CONVERSATION = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "22 C, sunny"}]},
]


@pytest.fixture(scope="module")
def qwen():
    if not QWEN.is_file():
        pytest.skip(f"{QWEN} not fetched")
    from inferd.model.gguf import validate_gguf

    metadata = validate_gguf(str(QWEN)).metadata
    tok = Tokenizer.from_gguf(metadata)
    template = metadata["tokenizer.chat_template"]
    compiler = GrammarCompiler(tok, tok.vocab_size)
    yield tok, template, compiler
    compiler.close()


def ids(prefix="call"):
    counter = iter(range(1000))
    return lambda: f"{prefix}_{next(counter)}"


# ---- request fields ---------------------------------------------------------------------------------------------
def test_parse_tools_and_choice():
    tools = parse_tools([WEATHER, TIME])
    assert [t.name for t in tools] == ["get_weather", "get_time"]
    assert tools[0].as_openai() == WEATHER
    assert parse_tool_choice(None, tools) == ("auto", None)
    assert parse_tool_choice(None, []) == ("none", None)
    assert parse_tool_choice("none", tools) == ("none", None)
    assert parse_tool_choice("required", tools) == ("required", None)
    assert parse_tool_choice({"type": "function", "function": {"name": "get_time"}}, tools) == ("required",
                                                                                               "get_time")


@pytest.mark.parametrize("tools,param", [
    ("x", "tools"),
    ([{"type": "retrieval"}], "tools[0].type"),
    ([{"type": "function"}], "tools[0].function"),
    ([{"type": "function", "function": {"name": "bad name"}}], "tools[0].function.name"),
    ([{"type": "function", "function": {"name": "f", "parameters": []}}], "tools[0].function.parameters"),
    ([WEATHER, WEATHER], "tools[1].function.name"),
])
def test_bad_tools_name_the_field(tools, param):
    with pytest.raises(ToolError) as e:
        parse_tools(tools)
    assert e.value.param == param


@pytest.mark.parametrize("choice,tools,param", [
    ("sometimes", [WEATHER], "tool_choice"),
    ("required", [], "tool_choice"),
    ({"type": "function", "function": {"name": "nope"}}, [WEATHER], "tool_choice.function.name"),
    ({"type": "function"}, [WEATHER], "tool_choice"),
])
def test_bad_tool_choice_names_the_field(choice, tools, param):
    with pytest.raises(ToolError) as e:
        parse_tool_choice(choice, parse_tools(tools))
    assert e.value.param == param


# ---- rendering --------------------------------------------------------------------------------------------------
@needs_qwen
def test_qwen_template_renders_tools_calls_and_results(qwen):
    _, template, _ = qwen
    fmt = detect_format(template)
    assert fmt.name == HERMES and fmt.template_renders_tools
    tools = parse_tools([WEATHER])
    text = render_chat(template, prepare_messages(CONVERSATION, fmt, tools), tools=template_tools(tools, fmt))
    assert "<tools>\n" + json.dumps(WEATHER) + "\n</tools>" in text
    # the call as the model would write it: arguments as an object, not a JSON string inside a string
    assert ('<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", '
            '"unit": "celsius"}}\n</tool_call><|im_end|>') in text
    assert "<|im_start|>user\n<tool_response>\n22 C, sunny\n</tool_response><|im_end|>" in text
    assert text.endswith("<|im_start|>assistant\n")


def test_generic_template_gets_a_tools_block_and_text_calls():
    fmt = detect_format(None)                                   # ChatML fallback: no tool support
    assert fmt.name == GENERIC and not fmt.template_renders_tools
    tools = parse_tools([WEATHER])
    msgs = prepare_messages([{"role": "system", "content": "Be brief."}] + CONVERSATION, fmt, tools)
    assert template_tools(tools, fmt) is None
    assert msgs[0]["role"] == "system" and msgs[0]["content"].startswith("Be brief.\n\n# Tools")
    assert json.dumps(WEATHER) in msgs[0]["content"]
    assert msgs[2] == {"role": "assistant", "content": '<tool_call>\n{"name": "get_weather", "arguments": '
                                                       '{"city": "Paris", "unit": "celsius"}}\n</tool_call>'}
    assert msgs[3] == {"role": "user", "content": "<tool_response>\n22 C, sunny\n</tool_response>"}
    text = render_chat(None, msgs)
    assert "<|im_start|>user\n<tool_response>" in text


def test_tool_messages_get_their_function_name():
    fmt = detect_format("{{ tools }} <tool_call>")
    msgs = prepare_messages(CONVERSATION, fmt)
    assert msgs[2]["name"] == "get_weather" and msgs[2]["content"] == "22 C, sunny"
    assert msgs[1]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris", "unit": "celsius"}


@pytest.mark.parametrize("template,name", [
    ("{% for t in tools %}[AVAILABLE_TOOLS]{% endfor %}[TOOL_CALLS]", MISTRAL),
    ("{{ tools }}<|python_tag|>{{ '<|eom_id|>' }}", LLAMA3),
    ("{% if tools %}{{ tools | tojson }}{% endif %}", HERMES),
    ("{{ messages }}", GENERIC),
])
def test_detect_format(template, name):
    assert detect_format(template).name == name


# ---- parsing ----------------------------------------------------------------------------------------------------
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
    (LLAMA3, '{"name": "f", "parameters": {"a": 1}}; {"name": "g", "parameters": {}}', None,
     [("f", '{"a": 1}'), ("g", "{}")]),
    (LLAMA3, '<|python_tag|>{"name": "f", "parameters": {"a": [1, 2]}}', None, [("f", '{"a": [1, 2]}')]),
    (LLAMA3, "The answer is {x}.", "The answer is {x}.", []),
    (MISTRAL, '[TOOL_CALLS] [{"name": "f", "arguments": {"a": 1}}, {"name": "g", "arguments": {}}]', None,
     [("f", '{"a": 1}'), ("g", "{}")]),
    (MISTRAL, ' [{"name": "f", "arguments": {"a": 1}}]', None, [("f", '{"a": 1}')]),   # the control token unshown
    (MISTRAL, "[a link](x) and text", "[a link](x) and text", []),
    (GENERIC, 'Sure.\n<tool_call>\n{"name": "f", "arguments": {"x": true}}\n</tool_call>', "Sure.",
     [("f", '{"x": true}')]),
]


@pytest.mark.parametrize("fmt,text,content,calls", CASES)
def test_parse_whole_output(fmt, text, content, calls):
    got_content, got_calls = parse_tool_calls(text, fmt, ids())
    assert got_content == content
    assert [(c.name, c.arguments) for c in got_calls] == calls
    assert [c.id for c in got_calls] == [f"call_{i}" for i in range(len(calls))]
    for c in got_calls:
        if not c.arguments.endswith("CE"):
            json.loads(c.arguments)


@pytest.mark.parametrize("fmt,text,content,calls", CASES)
def test_streamed_deltas_rebuild_the_same_calls(fmt, text, content, calls):
    """Any split of the text into pieces gives: each call's index, id and name before any of its arguments, then
    argument fragments that concatenate to the whole-output arguments; content deltas that concatenate to the
    whole-output content."""
    rng = random.Random(7)
    for trial in range(20):
        cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(1, 30))))
        pieces = [text[a:b] for a, b in zip([0] + cuts, cuts + [len(text)])] if trial else list(text)
        parser = ToolCallParser(fmt, ids())
        events = [e for p in pieces for e in parser.feed(p)] + parser.finish()
        started: dict[int, tuple[str, str]] = {}
        args: dict[int, str] = {}
        streamed_content = ""
        for e in events:
            if isinstance(e, ToolCallStart):
                assert e.index == len(started) and e.index not in args
                started[e.index] = (e.id, e.name)
                args[e.index] = ""
            elif isinstance(e, ToolArgsDelta):
                assert e.index in started and e.text
                args[e.index] += e.text
            else:
                assert isinstance(e, ContentDelta) and e.text
                streamed_content += e.text
        assert [(started[i][1], args[i]) for i in sorted(started)] == calls
        assert (streamed_content or None) == content if calls else streamed_content == content


def test_arguments_stream_before_the_call_ends():
    parser = ToolCallParser(HERMES, ids())
    events = parser.feed('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par')
    assert isinstance(events[0], ToolCallStart) and events[0].name == "get_weather"
    assert "".join(e.text for e in events[1:] if isinstance(e, ToolArgsDelta)) == '{"city": "Par'
    assert parser.feed("<tool") == [ToolArgsDelta(0, "<tool")]       # inside a string: argument text, at once
    events = parser.feed('is"}}\n</tool_call>')
    assert events == [ToolArgsDelta(0, 'is"}')]                      # never past the arguments' closing brace


# ---- grammars ---------------------------------------------------------------------------------------------------
def walk(compiler, tok, matcher, seed, max_tokens=300):
    rng = np.random.default_rng(seed)
    row = np.zeros(compiler.mask_words(), np.uint32)
    out = []
    for pos in range(max_tokens):
        constrained = matcher.fill_mask(row)
        logits = rng.standard_normal(compiler.vocab_size).astype(np.float32) * 3
        token = _cpu.sample(logits, {"temperature": 1.0, "seed": seed}, pos,
                            allowed=row if constrained else None)[0]
        assert matcher.advance(token), matcher.error
        if token in tok.eos_ids:
            break
        out.append(token)
        if matcher.is_done:
            break
    return tok.decode(out, skip_special=False)


def check_call(call, tools_by_name):
    args = json.loads(call.arguments)
    if call.name == "get_weather":
        assert set(args) == {"city", "unit"} and len(args["city"]) <= 12 and args["unit"] in ("celsius",
                                                                                            "fahrenheit")
    else:
        assert call.name == "get_time" and set(args) == {"tz"} and len(args["tz"]) == 3 and args["tz"].isupper()


@needs_qwen
@pytest.mark.parametrize("parallel", [False, True])
def test_required_grammar_gives_valid_calls(qwen, parallel):
    tok, _, compiler = qwen
    tools = parse_tools([WEATHER, TIME])
    compiled = compiler.compile_sync(tool_call_grammar(tools, HERMES, parallel=parallel))
    for seed in range(4):
        text = walk(compiler, tok, compiled.new_matcher(), seed)
        content, calls = parse_tool_calls(text, HERMES)
        assert content is None and calls, text
        assert len(calls) == 1 or parallel
        for c in calls:
            check_call(c, tools)


@needs_qwen
def test_named_tool_choice_forces_that_function(qwen):
    tok, _, compiler = qwen
    compiled = compiler.compile_sync(tool_call_grammar(parse_tools([WEATHER, TIME]), HERMES, only="get_time",
                                                       parallel=False))
    for seed in range(3):
        _, calls = parse_tool_calls(walk(compiler, tok, compiled.new_matcher(), seed), HERMES)
        assert [c.name for c in calls] == ["get_time"]
        check_call(calls[0], None)


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
    text = "Sure, checking.\n" + walk(compiler, tok, _Forced(lazy, trigger), seed=3)
    content, calls = parse_tool_calls(text, HERMES)
    assert content == "Sure, checking." and calls
    for c in calls:
        check_call(c, None)


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


@needs_qwen
def test_llama3_and_mistral_grammars_compile_and_parse(qwen):
    tok, _, compiler = qwen
    tools = parse_tools([TIME])
    for fmt in (LLAMA3,):
        compiled = compiler.compile_sync(tool_call_grammar(tools, fmt))
        _, calls = parse_tool_calls(walk(compiler, tok, compiled.new_matcher(), 1), fmt)
        assert calls and all(c.name == "get_time" for c in calls)
    im_start = tok.hf.token_to_id("<|im_start|>")   # any special token stands in for [TOOL_CALLS] here
    compiled = compiler.compile_sync(tool_call_grammar(tools, MISTRAL, trigger_token_id=im_start))
    text = walk(compiler, tok, compiled.new_matcher(), 2).replace("<|im_start|>", "[TOOL_CALLS]")
    _, calls = parse_tool_calls(text, MISTRAL)
    assert calls and all(c.name == "get_time" for c in calls)


def test_mistral_grammar_needs_the_token():
    with pytest.raises(ToolError, match="TOOL_CALLS"):
        tool_call_grammar(parse_tools([TIME]), MISTRAL)


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
