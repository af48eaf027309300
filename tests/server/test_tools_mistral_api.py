"""Mistral v11 tool calls end to end through the real openai SDK: a tiny random model with Mistral's control tokens
and Mistral Small 3.2's chat template (`[TOOL_CALLS]name[CALL_ID]id[ARGS]{json}`) behind the real server.

The model is random, so every call is made by the grammar: required / named tool_choice constrain from the first
token, and "auto" is steered onto (or off) the call with a logit_bias on [TOOL_CALLS], after which the lazy grammar
constrains the call. What is checked is the plumbing: the markers reach the parser, the calls parse into
message.tool_calls and delta.tool_calls alike, arguments are valid against the schemas, ids are Mistral's, and the
conversation goes back through the template."""
from __future__ import annotations

import json
import re

import openai
import pytest

from inferd.model.loader import load_model
from tests.server.conftest import ServerThread, make_settings
from tests.text.mistral_v11 import write_tiny_mistral

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "additionalProperties": False, "required": ["city", "unit"],
                   "properties": {"city": {"type": "string", "maxLength": 10},
                                  "unit": {"enum": ["celsius", "fahrenheit"]}}}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"tz": {"type": "string", "pattern": "^[A-Z]{3}$"}}, "required": ["tz"],
    "additionalProperties": False}}}
M = "tiny-mistral"  # the served name: the file name
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    path = write_tiny_mistral(tmp_path_factory.mktemp("mistral-api") / "tiny-mistral.gguf")
    srv = ServerThread(make_settings(), load_model(str(path))).start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def tool_calls_id(server):
    return server.state.tokenizer.hf.token_to_id("[TOOL_CALLS]")


def check_call(call):
    assert call.type == "function" and re.fullmatch(r"[A-Za-z0-9]{9}", call.id)
    args = json.loads(call.function.arguments)
    if call.function.name == "get_weather":
        assert set(args) == {"city", "unit"} and len(args["city"]) <= 10 and args["unit"] in ("celsius", "fahrenheit")
    else:
        assert call.function.name == "get_time" and set(args) == {"tz"} and re.fullmatch("[A-Z]{3}", args["tz"])


@pytest.mark.parametrize("seed", [1, 2])
def test_required_gives_valid_calls(client, seed):
    r = client.chat.completions.create(model=M, messages=ASK, tools=[WEATHER, TIME], tool_choice="required",
                                       temperature=1.0, seed=seed, max_tokens=200)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None and choice.message.tool_calls
    for call in choice.message.tool_calls:
        check_call(call)


def test_named_choice_one_call(client):
    r = client.chat.completions.create(model=M, messages=ASK, tools=[WEATHER, TIME], max_tokens=200,
                                       tool_choice={"type": "function", "function": {"name": "get_time"}},
                                       parallel_tool_calls=False, seed=4)
    calls = r.choices[0].message.tool_calls
    assert [c.function.name for c in calls] == ["get_time"] and r.choices[0].finish_reason == "tool_calls"
    check_call(calls[0])


@pytest.mark.parametrize("tool_choice", ["required", "auto"])
def test_streamed_calls_match_the_whole_answer(client, tool_calls_id, tool_choice):
    kw = {"model": M, "messages": ASK, "tools": [WEATHER, TIME], "tool_choice": tool_choice, "temperature": 1.0,
          "seed": 9, "max_tokens": 200, "parallel_tool_calls": False,
          "logit_bias": {str(tool_calls_id): 100} if tool_choice == "auto" else None}
    whole = client.chat.completions.create(**kw).choices[0]
    with client.chat.completions.stream(**kw) as stream:
        final = stream.get_final_completion().choices[0]
    raw = list(client.chat.completions.create(**kw, stream=True))
    deltas = [d for ch in raw if ch.choices and ch.choices[0].delta.tool_calls for d in ch.choices[0].delta.tool_calls]
    assert deltas[0].index == 0 and deltas[0].function.name in ("get_weather", "get_time")
    assert deltas[0].id and re.fullmatch(r"[A-Za-z0-9]{9}", deltas[0].id)          # id and name come first
    assert all(d.id is None and d.function.name is None for d in deltas[1:])     # then argument fragments
    assert "".join(d.function.arguments or "" for d in deltas) == whole.message.tool_calls[0].function.arguments
    assert all("[" not in (ch.choices[0].delta.content or "") for ch in raw if ch.choices)   # no marker as content
    assert whole.finish_reason == final.finish_reason == "tool_calls"
    assert [(c.function.name, c.function.arguments) for c in final.message.tool_calls] == \
           [(c.function.name, c.function.arguments) for c in whole.message.tool_calls]
    check_call(whole.message.tool_calls[0])


def test_auto_steered_off_the_call_is_text(client, tool_calls_id):
    r = client.chat.completions.create(model=M, messages=ASK, tools=[WEATHER], temperature=1.0, seed=3,
                                       max_tokens=20, logit_bias={str(tool_calls_id): -100})
    choice = r.choices[0]
    assert choice.message.tool_calls is None and choice.finish_reason in ("stop", "length")
    assert isinstance(choice.message.content, str)


@pytest.mark.parametrize("call_id", [None, "call_Q2hKc0LmVnW8xYzA1b2c3d4e"])
def test_second_turn_renders_calls_and_results(client, server, call_id):
    first = client.chat.completions.create(model=M, messages=ASK, tools=[WEATHER], tool_choice="required",
                                           parallel_tool_calls=False, max_tokens=200, seed=5)
    assistant = first.choices[0].message.model_dump(exclude_none=True)
    if call_id is not None:                      # a client's own id: Mistral's template needs 9 alphanumerics
        assistant["tool_calls"][0]["id"] = call_id
    cid = assistant["tool_calls"][0]["id"]
    messages = ASK + [assistant, {"role": "tool", "tool_call_id": cid, "content": "18 C and cloudy"}]
    second = client.chat.completions.create(model=M, messages=messages, tools=[WEATHER], tool_choice="none",
                                            max_tokens=10, seed=1)
    assert second.choices[0].message.tool_calls is None and second.choices[0].finish_reason in ("stop", "length")
    again = client.chat.completions.create(model=M, messages=messages, tools=[WEATHER], tool_choice="required",
                                           max_tokens=200, seed=2)
    check_call(again.choices[0].message.tool_calls[0])


def test_responses_api_function_call(client):
    r = client.responses.create(model=M, input="What is the weather in Oslo?", max_output_tokens=200,
                                tools=[{"type": "function", **WEATHER["function"]}], tool_choice="required",
                                extra_body={"seed": 3})
    calls = [o for o in r.output if o.type == "function_call"]
    assert [c.name for c in calls] == ["get_weather"] and re.fullmatch(r"[A-Za-z0-9]{9}", calls[0].call_id)
    assert set(json.loads(calls[0].arguments)) == {"city", "unit"}
    r2 = client.responses.create(model=M, previous_response_id=r.id, max_output_tokens=8,
                                 input=[{"type": "function_call_output", "call_id": calls[0].call_id,
                                         "output": "3 C, snow"}])
    assert r2.status in ("completed", "incomplete")
