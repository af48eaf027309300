"""Tool calling and the Responses API end to end through the real openai SDK against SmolLM2 (whose template knows
no tools: the generic tools block and hermes syntax), and CORS on the real app. Forced calls are grammar-
constrained, so even this small model's calls always parse against their schemas."""
from __future__ import annotations

import asyncio
import json

import aiohttp
import openai
import pytest

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "additionalProperties": False, "required": ["city", "unit"],
                   "properties": {"city": {"type": "string", "maxLength": 16},
                                  "unit": {"enum": ["celsius", "fahrenheit"]}}}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"tz": {"type": "string", "pattern": "^[A-Z]{3}$"}}, "required": ["tz"],
    "additionalProperties": False}}}
ASK = [{"role": "user", "content": "What is the weather in Paris right now?"}]


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def check_call(call):
    args = json.loads(call.function.arguments)
    if call.function.name == "get_weather":
        assert set(args) == {"city", "unit"} and len(args["city"]) <= 16 and args["unit"] in ("celsius", "fahrenheit")
    else:
        assert call.function.name == "get_time" and set(args) == {"tz"} and len(args["tz"]) == 3


@pytest.mark.parametrize("seed", [1, 2])
def test_required_tool_choice_gives_valid_calls(client, model_name, seed):
    r = client.chat.completions.create(model=model_name, messages=ASK, tools=[WEATHER, TIME], tool_choice="required",
                                       temperature=0.9, seed=seed, max_tokens=200)
    msg, choice = r.choices[0].message, r.choices[0]
    assert choice.finish_reason == "tool_calls" and msg.content is None and msg.tool_calls
    for call in msg.tool_calls:
        assert call.type == "function" and call.id.startswith("call_")
        check_call(call)


def test_named_tool_choice_and_no_parallel_calls(client, model_name):
    r = client.chat.completions.create(model=model_name, messages=ASK, tools=[WEATHER, TIME], max_tokens=200,
                                       tool_choice={"type": "function", "function": {"name": "get_time"}},
                                       parallel_tool_calls=False)
    calls = r.choices[0].message.tool_calls
    assert [c.function.name for c in calls] == ["get_time"]
    check_call(calls[0])


def test_streamed_calls_rebuild_the_same_calls(client, model_name):
    kw = {"model": model_name, "messages": ASK, "tools": [WEATHER, TIME], "tool_choice": "required",
          "temperature": 0.9, "seed": 7, "max_tokens": 200}
    whole = client.chat.completions.create(**kw).choices[0]
    with client.chat.completions.stream(**kw) as stream:
        final = stream.get_final_completion().choices[0]
    raw = list(client.chat.completions.create(**kw, stream=True))
    first_delta = next(ch.choices[0].delta.tool_calls[0] for ch in raw if ch.choices and ch.choices[0].delta.tool_calls)
    assert first_delta.index == 0 and first_delta.id and first_delta.function.name   # id and name come first
    assert final.finish_reason == "tool_calls" == whole.finish_reason
    assert [(c.function.name, c.function.arguments) for c in final.message.tool_calls] == \
           [(c.function.name, c.function.arguments) for c in whole.message.tool_calls]


def test_two_turn_conversation_with_a_tool_result(client, model_name):
    first = client.chat.completions.create(model=model_name, messages=ASK, tools=[WEATHER], tool_choice="required",
                                           max_tokens=200)
    call = first.choices[0].message.tool_calls[0]
    messages = ASK + [first.choices[0].message.model_dump(exclude_none=True),
                      {"role": "tool", "tool_call_id": call.id, "content": "18 C and cloudy"}]
    second = client.chat.completions.create(model=model_name, messages=messages, tools=[WEATHER], tool_choice="none",
                                            max_tokens=30)
    assert second.choices[0].message.tool_calls is None
    assert isinstance(second.choices[0].message.content, str) and second.choices[0].message.content


def test_auto_without_a_call_is_plain_text(client, model_name):
    r = client.chat.completions.create(model=model_name, messages=[{"role": "user", "content": "Say hello."}],
                                       tools=[WEATHER], max_tokens=12)
    msg = r.choices[0].message
    assert (msg.tool_calls is None and msg.content) or r.choices[0].finish_reason == "tool_calls"


# ---- the Responses API ----------------------------------------------------------------------------------------------
FLAT_WEATHER = {"type": "function", **WEATHER["function"]}


def test_responses_text_store_get_delete(client, model_name):
    r = client.responses.create(model=model_name, input="Name a color.", instructions="Answer in one word.",
                                max_output_tokens=8, temperature=0.0)
    assert r.status in ("completed", "incomplete") and r.output_text
    assert r.usage.input_tokens > 0 and r.usage.output_tokens > 0
    again = client.responses.retrieve(r.id)
    assert again.id == r.id and again.output_text == r.output_text
    follow = client.responses.create(model=model_name, input="And another?", previous_response_id=r.id,
                                     max_output_tokens=8)
    assert follow.previous_response_id == r.id and follow.output_text
    client.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)


def test_responses_stream_events(client, model_name):
    events = list(client.responses.create(model=model_name, input="Count to three.", max_output_tokens=12,
                                          stream=True))
    kinds = [e.type for e in events]
    assert kinds[0] == "response.created" and kinds[-1] in ("response.completed", "response.incomplete")
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == events[-1].response.output_text and deltas
    assert [e.sequence_number for e in events] == list(range(len(events)))


def test_responses_json_schema_format(client, model_name):
    schema = {"type": "object", "properties": {"color": {"enum": ["red", "blue"]}}, "required": ["color"],
              "additionalProperties": False}
    r = client.responses.create(model=model_name, input="Pick a color.", max_output_tokens=30,
                                text={"format": {"type": "json_schema", "name": "pick", "schema": schema}})
    assert json.loads(r.output_text)["color"] in ("red", "blue")


@pytest.mark.parametrize("stream", [False, True])
def test_responses_function_call_round_trip(client, model_name, stream):
    kw = {"model": model_name, "input": "What is the weather in Oslo?", "tools": [FLAT_WEATHER],
          "tool_choice": "required", "max_output_tokens": 120, "temperature": 0.7, "extra_body": {"seed": 3}}
    if stream:
        with client.responses.stream(**kw) as s:
            r = s.get_final_response()
    else:
        r = client.responses.create(**kw)
    calls = [o for o in r.output if o.type == "function_call"]
    assert calls and calls[0].name == "get_weather"
    args = json.loads(calls[0].arguments)
    assert set(args) == {"city", "unit"}
    r2 = client.responses.create(model=model_name, previous_response_id=r.id, max_output_tokens=20,
                                 input=[{"type": "function_call_output", "call_id": calls[0].call_id,
                                         "output": "3 C, snow"}])
    assert r2.status in ("completed", "incomplete") and r2.output_text


def test_responses_errors(client, model_name):
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model=model_name, input="x", previous_response_id="resp_nope")
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model=model_name, input=[{"type": "image", "url": "x"}])
    assert e.value.body["param"] == "input[0].type"
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model=model_name, input="x", text={"format": {
            "type": "json_schema", "name": "x", "schema": {"type": "strin"}}})
    assert e.value.body["param"] == "text.format.schema"
    assert e.value.body["message"].startswith("text.format.schema: ") and "Invalid type" in e.value.body["message"]


# ---- CORS on the real app --------------------------------------------------------------------------------------------
def test_cors_on_the_real_app(make_server, model_name):
    srv = make_server(cors_allowed_origins=["https://app.example.com"], api_keys=["sk-1"])

    async def main():
        async with aiohttp.ClientSession() as s:
            pre = await s.options(srv.url + "/v1/chat/completions", headers={
                "Origin": "https://app.example.com", "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "authorization, content-type"})
            async with s.post(srv.url + "/v1/chat/completions", headers={
                    "Origin": "https://app.example.com", "Authorization": "Bearer sk-1"},
                    json={"messages": ASK, "max_tokens": 3, "stream": True}) as r:
                body = await r.read()
                streamed = (r.status, r.headers.get("Access-Control-Allow-Origin"), body)
            return pre.status, pre.headers.get("Access-Control-Allow-Origin"), streamed

    pre_status, pre_origin, (status, origin, body) = asyncio.run(main())
    assert pre_status == 204 and pre_origin == "https://app.example.com"
    assert status == 200 and origin == "https://app.example.com" and body.endswith(b"data: [DONE]\n\n")


def test_auto_tools_with_a_response_format_answer_json_or_call(client, model_name):
    """An agent's structured final answer with tools available: the output is either that JSON or tool calls."""
    schema = {"type": "object", "properties": {"answer": {"type": "string", "maxLength": 30}}, "required": ["answer"],
              "additionalProperties": False}
    kinds = set()
    for seed in range(4):
        r = client.chat.completions.create(
            model=model_name, messages=ASK, tools=[WEATHER], temperature=1.0, seed=seed, max_tokens=150,
            parallel_tool_calls=False,
            response_format={"type": "json_schema", "json_schema": {"name": "final", "schema": schema}})
        msg = r.choices[0].message
        if msg.tool_calls:
            kinds.add("call")
            assert r.choices[0].finish_reason == "tool_calls"
            for call in msg.tool_calls:
                check_call(call)
        else:
            kinds.add("json")
            assert set(json.loads(msg.content)) == {"answer"}
    assert kinds
