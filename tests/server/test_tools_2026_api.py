"""The 2026 tool-call formats end to end through the real openai SDK: for each of Qwen3-Coder's XML, GLM-4.5's XML,
DeepSeek V3.1's and V3's (R1) calls, a tiny random model with that format's markers as control tokens and its
published chat template (tests/text/tools/tiny.py) behind the real server.

The model is random, so every call is made by the grammar: required / named tool_choice constrain from the first
token, and "auto" is steered onto the call with a logit_bias on the format's opening marker, after which the lazy
grammar constrains it. Checked: the calls parse into message.tool_calls and into delta.tool_calls (index, id, type
and name first, then argument fragments that add up to the whole call), typed values come out typed, no marker
reaches the content, and a second turn renders the call and its result through the template."""
from __future__ import annotations

import json

import openai
import pytest

from inferd.model.loader import load_model
from inferd.text.tools import syntax_of
from tests.server.conftest import ServerThread, make_settings
from tests.text.tools.tiny import MODELS, write_tiny

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "additionalProperties": False, "required": ["city", "unit"],
                   "properties": {"city": {"type": "string", "maxLength": 10},
                                  "unit": {"enum": ["celsius", "fahrenheit"]}}}}}
COUNT = {"type": "function", "function": {"name": "count", "parameters": {
    "type": "object", "additionalProperties": False, "required": ["n", "exact"],
    "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99}, "exact": {"type": "boolean"}}}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module", params=sorted(MODELS))
def served(request, tmp_path_factory):
    fmt = request.param
    path = write_tiny(tmp_path_factory.mktemp(fmt), fmt)
    srv = ServerThread(make_settings(), load_model(str(path))).start()
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)
    trigger = srv.state.tokenizer.hf.token_to_id(syntax_of(fmt).trigger)
    yield fmt, client, path.stem, trigger
    srv.stop()


def check_call(call):
    assert call.type == "function" and call.id.startswith("call_")
    args = json.loads(call.function.arguments)
    if call.function.name == "get_weather":
        assert set(args) == {"city", "unit"} and len(args["city"]) <= 10 and args["unit"] in ("celsius", "fahrenheit")
    else:
        assert call.function.name == "count" and set(args) == {"n", "exact"}
        assert isinstance(args["n"], int) and 0 <= args["n"] <= 99 and isinstance(args["exact"], bool)


@pytest.mark.parametrize("seed", [1, 2])
def test_required_gives_valid_typed_calls(served, seed):
    _, client, model, _ = served
    r = client.chat.completions.create(model=model, messages=ASK, tools=[WEATHER, COUNT], tool_choice="required",
                                       temperature=1.0, seed=seed, max_tokens=200)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None and choice.message.tool_calls
    for call in choice.message.tool_calls:
        check_call(call)


def test_named_choice_types_its_values(served):
    _, client, model, _ = served
    r = client.chat.completions.create(model=model, messages=ASK, tools=[WEATHER, COUNT], max_tokens=200,
                                       tool_choice={"type": "function", "function": {"name": "count"}},
                                       parallel_tool_calls=False, seed=4)
    calls = r.choices[0].message.tool_calls
    assert [c.function.name for c in calls] == ["count"] and r.choices[0].finish_reason == "tool_calls"
    check_call(calls[0])


@pytest.mark.parametrize("tool_choice", ["required", "auto"])
def test_streamed_calls_match_the_whole_answer(served, tool_choice):
    _, client, model, trigger = served
    kw = {"model": model, "messages": ASK, "tools": [WEATHER, COUNT], "tool_choice": tool_choice,
          "temperature": 1.0, "seed": 9, "max_tokens": 200, "parallel_tool_calls": False,
          "logit_bias": {str(trigger): 100} if tool_choice == "auto" else None}
    whole = client.chat.completions.create(**kw).choices[0]
    raw = list(client.chat.completions.create(**kw, stream=True))
    deltas = [d for ch in raw if ch.choices and ch.choices[0].delta.tool_calls for d in ch.choices[0].delta.tool_calls]
    assert deltas[0].index == 0 and deltas[0].type == "function" and deltas[0].id.startswith("call_")
    assert deltas[0].function.name == whole.message.tool_calls[0].function.name       # id and name come first
    assert all(d.id is None and d.function.name is None for d in deltas[1:])          # then argument fragments
    # (how many fragments depends on how many steps' outputs wait for the client at each read: not checked here)
    assert "".join(d.function.arguments or "" for d in deltas) == whole.message.tool_calls[0].function.arguments
    content = "".join(ch.choices[0].delta.content or "" for ch in raw if ch.choices)
    assert "tool" not in content and "<" not in content                               # no marker as content
    assert whole.finish_reason == "tool_calls"
    check_call(whole.message.tool_calls[0])


def test_second_turn_renders_calls_and_results(served):
    _, client, model, _ = served
    first = client.chat.completions.create(model=model, messages=ASK, tools=[WEATHER, COUNT], max_tokens=200,
                                           tool_choice="required", parallel_tool_calls=False, seed=5)
    assistant = first.choices[0].message.model_dump(exclude_none=True)
    cid = assistant["tool_calls"][0]["id"]
    messages = ASK + [assistant, {"role": "tool", "tool_call_id": cid, "content": "18 C and cloudy"}]
    again = client.chat.completions.create(model=model, messages=messages, tools=[WEATHER, COUNT], max_tokens=200,
                                           tool_choice="required", seed=2)
    check_call(again.choices[0].message.tool_calls[0])
