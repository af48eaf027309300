"""What the tool-call tests share: the tools they call, call-id makers, a grammar walk (tokens drawn with the C
sampler under each step's mask, random logits, fixed seeds), and the check that any split of an output into
pieces streams the same calls and content as the whole-text parse."""
from __future__ import annotations

import json
import os
import random
import re
from pathlib import Path

import numpy as np
import pytest

from inferd import _cpu
from inferd.text.tools import ContentDelta, ToolArgsDelta, ToolCallParser, ToolCallStart, parse_tool_calls

QWEN = Path(os.environ.get("INFERD_TEST_MODELS", Path.home() / ".cache/inferd-test-models")) / \
    "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
needs_qwen = pytest.mark.skipif(not QWEN.is_file(), reason=f"{QWEN} not fetched (../shared/models/fetch.sh)")


def weather(max_city: int = 12) -> dict:
    return {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather in a city",
        "parameters": {"type": "object", "additionalProperties": False, "required": ["city", "unit"],
                       "properties": {"city": {"type": "string", "maxLength": max_city},
                                      "unit": {"enum": ["celsius", "fahrenheit"]}}}}}


WEATHER = weather()
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"tz": {"type": "string", "pattern": "^[A-Z]{3}$"}}, "required": ["tz"],
    "additionalProperties": False}}}


def conversation(call_id: str) -> list[dict]:
    return [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": call_id, "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'}}]},
        {"role": "tool", "tool_call_id": call_id, "content": [{"type": "text", "text": "22 C, sunny"}]},
    ]


def ids(prefix="call"):
    counter = iter(range(1000))
    return lambda: f"{prefix}_{next(counter)}"


def mistral_style_ids():
    counter = iter(range(1000))
    return lambda: f"id{next(counter):07d}"


def walk(tok, compiler, matcher, seed, max_tokens=300):
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


def check_call(call, max_city=12):
    args = json.loads(call.arguments)
    if call.name == "get_weather":
        assert set(args) == {"city", "unit"} and len(args["city"]) <= max_city
        assert args["unit"] in ("celsius", "fahrenheit")
    else:
        assert call.name == "get_time" and set(args) == {"tz"} and len(args["tz"]) == 3 and args["tz"].isupper()
        assert re.fullmatch("[A-Z]{3}", args["tz"])


def assert_streams_like_whole(fmt, text, content, calls, new_ids, seed, trials, max_cuts):
    """Any split of the text into pieces gives: each call's index, id and name before any of its arguments, then
    argument fragments that concatenate to the whole-output arguments; content deltas that concatenate to the
    whole-output content. (The first trial feeds one character at a time.)"""
    rng = random.Random(seed)
    for trial in range(trials):
        cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(1, max_cuts))))
        pieces = [text[a:b] for a, b in zip([0] + cuts, cuts + [len(text)])] if trial else list(text)
        parser = ToolCallParser(fmt, new_ids())
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


def assert_parses(fmt, text, content, calls, new_ids, id_of):
    """The whole-text parse gives that content and those calls, ids from new_ids in order."""
    got_content, got_calls = parse_tool_calls(text, fmt, new_ids())
    assert got_content == content
    assert [(c.name, c.arguments) for c in got_calls] == calls
    assert [c.id for c in got_calls] == [id_of(i) for i in range(len(calls))]
    return got_calls


def assert_lazy_grammar_takes(tok, compiler, fmt, tools, text):
    """Under tool_choice "auto" (the call grammar from the format's trigger token on, the markers as the
    vocabulary's tokens), the text before the call is free and the call, token by token, is what the grammar takes;
    the marker is one token of the text's encoding."""
    from inferd.text.tools import LazyMatcher, marker_token_ids, shown_tokens, tool_call_grammar, trigger_token

    token_id_of = tok.hf.token_to_id
    trigger = trigger_token(fmt, token_id_of)
    markers = marker_token_ids(fmt, token_id_of)
    assert trigger is not None and trigger in shown_tokens(fmt, token_id_of)
    compiled = compiler.compile_sync(tool_call_grammar(tools, fmt, parallel=True, trigger_token_id=trigger,
                                                       markers=markers))
    lazy = LazyMatcher(compiled, trigger)
    tokens = tok.encode(text, add_special=False)
    assert trigger in tokens and tok.decode(tokens, skip_special=False) == text
    for t in tokens:
        assert lazy.advance(t), (text, lazy.active.error if lazy.active else None)
    assert lazy.active is not None and lazy.accepts_eos()
