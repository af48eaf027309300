"""Anthropic's Messages API end to end through the real `anthropic` SDK against SmolLM2: text answers whole and
streamed (the SDK's stream helper, and the raw named events in order), stop reasons and stop sequences, usage and
count_tokens, tool use round trips (calls constrained by their input_schema), and the extension fields the SDK
no longer types (temperature, top_p, top_k) sent as the raw API has them."""
from __future__ import annotations

import json
import re
import urllib.request

import anthropic
import pytest

WEATHER = {"name": "get_weather", "description": "Current weather in a city",
           "input_schema": {"type": "object", "additionalProperties": False, "required": ["city", "unit"],
                            "properties": {"city": {"type": "string", "maxLength": 16},
                                           "unit": {"enum": ["celsius", "fahrenheit"]}}}}
TIME = {"name": "get_time", "input_schema": {"type": "object", "required": ["tz"], "additionalProperties": False,
                                             "properties": {"tz": {"type": "string", "pattern": "^[A-Z]{3}$"}}}}
ASK = [{"role": "user", "content": "What is the weather in Paris right now?"}]
COLORS = [{"role": "user", "content": "Name three colors."}]
GREEDY = {"temperature": 0}  # the SDK no longer has the field: sent as extra_body, as the raw API takes it


@pytest.fixture(scope="module")
def client(server):
    return anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)


def raw_events(server, body: dict, headers: dict | None = None) -> list[tuple[str, dict]]:
    """(event name, data) of a raw stream, checking the framing: an `event:` line, then a `data:` line of the same
    type, then a blank line."""
    req = urllib.request.Request(server.url + "/v1/messages", data=json.dumps({**body, "stream": True}).encode(),
                                 headers={"Content-Type": "application/json", **(headers or {})})
    with urllib.request.urlopen(req, timeout=60) as r:
        assert r.headers["Content-Type"].startswith("text/event-stream")
        text = r.read().decode()
    assert text.endswith("\n\n")
    out = []
    for block in text[:-2].split("\n\n"):
        name_line, data_line = block.split("\n")
        name, data = name_line.removeprefix("event: "), json.loads(data_line.removeprefix("data: "))
        assert name_line.startswith("event: ") and data["type"] == name, block
        out.append((name, data))
    return out


def check_call(block):
    assert block.type == "tool_use" and re.fullmatch(r"toolu_[A-Za-z0-9]{24}", block.id)
    if block.name == "get_weather":
        assert set(block.input) == {"city", "unit"} and len(block.input["city"]) <= 16
        assert block.input["unit"] in ("celsius", "fahrenheit")
    else:
        assert block.name == "get_time" and set(block.input) == {"tz"} and re.fullmatch("[A-Z]{3}", block.input["tz"])


def test_a_text_answer(client, model_name):
    r = client.messages.create(model=model_name, max_tokens=40, system="Answer briefly.", messages=COLORS,
                               metadata={"user_id": "u-1"}, extra_body=GREEDY)
    assert r.type == "message" and r.role == "assistant" and r.model == model_name
    assert re.fullmatch(r"msg_[0-9a-f]{32}", r.id)
    assert [b.type for b in r.content] == ["text"] and r.content[0].text.strip()
    assert r.stop_reason == "end_turn" and r.stop_sequence is None
    assert 0 < r.usage.output_tokens < 40 and r.usage.input_tokens + r.usage.cache_read_input_tokens > 10


def test_max_tokens_and_its_stop_reason(client, model_name):
    r = client.messages.create(model=model_name, max_tokens=3, messages=COLORS, extra_body=GREEDY)
    assert r.stop_reason == "max_tokens" and r.usage.output_tokens == 3
    # 0 generates nothing (Anthropic's way to warm its cache): an empty message, at once
    r = client.messages.create(model=model_name, max_tokens=0, messages=COLORS)
    assert r.content == [] and r.stop_reason == "max_tokens" and r.usage.output_tokens == 0


def test_a_stop_sequence_ends_the_answer_and_is_named(client, model_name):
    whole = client.messages.create(model=model_name, max_tokens=40, messages=COLORS, extra_body=GREEDY)
    text = whole.content[0].text
    word = re.findall(r"[A-Za-z]{3,}", text)[1]  # a word the greedy answer will write again
    r = client.messages.create(model=model_name, max_tokens=40, messages=COLORS, stop_sequences=["@@@", word],
                               extra_body=GREEDY)
    assert r.stop_reason == "stop_sequence" and r.stop_sequence == word
    assert r.content[0].text == text[:text.index(word)]


def test_sampling_fields_are_applied(client, model_name):
    greedy = client.messages.create(model=model_name, max_tokens=12, messages=COLORS, extra_body=GREEDY)
    # top_k 1 is greedy whatever the temperature; top_p and metadata are taken as well
    top1 = client.messages.create(model=model_name, max_tokens=12, messages=COLORS, metadata={"user_id": "x"},
                                  extra_body={"temperature": 1.0, "top_k": 1, "top_p": 0.9})
    assert top1.content[0].text == greedy.content[0].text


def test_the_stream_helper_gives_the_same_message(client, model_name):
    kw = {"model": model_name, "max_tokens": 40, "system": [{"type": "text", "text": "Answer briefly."}],
          "messages": COLORS, "extra_body": GREEDY}
    whole = client.messages.create(**kw)
    with client.messages.stream(**kw) as stream:
        texts = list(stream.text_stream)
        final = stream.get_final_message()
    assert "".join(texts) == whole.content[0].text == final.content[0].text
    assert final.stop_reason == whole.stop_reason == "end_turn"
    assert final.usage.output_tokens == whole.usage.output_tokens
    assert (final.usage.input_tokens + final.usage.cache_read_input_tokens
            == whole.usage.input_tokens + whole.usage.cache_read_input_tokens)


def test_raw_events_come_in_anthropics_order(server, model_name):
    events = raw_events(server, {"model": model_name, "max_tokens": 8, "messages": COLORS, **GREEDY},
                        headers={"anthropic-version": "2023-06-01"})
    names = [n for n, _ in events if n != "ping"]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    assert names[1] == "content_block_start" and names[-3] == "content_block_stop"
    assert set(names[2:-3]) == {"content_block_delta"}
    start = events[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None and start["usage"]["output_tokens"] == 0
    deltas = [d for n, d in events if n == "content_block_delta"]
    assert all(d["index"] == 0 and d["delta"]["type"] == "text_delta" for d in deltas)
    end = next(d for n, d in events if n == "message_delta")
    assert end["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None} and end["usage"]["output_tokens"] == 8
    assert ("ping", {"type": "ping"}) in events


def test_count_tokens_is_the_prompt_of_the_same_request(client, model_name):
    for kw in ({"messages": COLORS, "system": "Be brief."},
               {"messages": ASK, "tools": [WEATHER, TIME], "tool_choice": {"type": "auto"}}):
        counted = client.messages.count_tokens(model=model_name, **kw).input_tokens
        r = client.messages.create(model=model_name, max_tokens=1, **kw)
        assert counted == r.usage.input_tokens + r.usage.cache_read_input_tokens > 5
    # the tools are part of the prompt
    assert client.messages.count_tokens(model=model_name, messages=ASK, tools=[WEATHER]).input_tokens > \
        client.messages.count_tokens(model=model_name, messages=ASK).input_tokens + 20


def test_the_prefix_cache_shows_as_cache_read_tokens(client, model_name):
    system = "You are a terse assistant. " * 12  # several KV blocks of the same prefix
    first = client.messages.create(model=model_name, max_tokens=1, system=system, messages=COLORS)
    again = client.messages.create(model=model_name, max_tokens=1, system=system, messages=ASK)
    assert again.usage.cache_read_input_tokens >= 64
    assert first.usage.input_tokens + first.usage.cache_read_input_tokens > again.usage.cache_read_input_tokens


@pytest.mark.parametrize("choice", [{"type": "any"},
                                    {"type": "tool", "name": "get_time", "disable_parallel_tool_use": True}])
def test_forced_tool_calls_are_tool_use_blocks(client, model_name, choice):
    r = client.messages.create(model=model_name, max_tokens=200, messages=ASK, tools=[WEATHER, TIME],
                               tool_choice=choice, extra_body={"temperature": 0.9})
    assert r.stop_reason == "tool_use" and r.content and all(b.type == "tool_use" for b in r.content)
    for block in r.content:
        check_call(block)
    if choice["type"] == "tool":
        assert [b.name for b in r.content] == ["get_time"]


def test_disable_parallel_tool_use_gives_one_call(client, model_name):
    r = client.messages.create(model=model_name, max_tokens=200, messages=ASK, tools=[WEATHER, TIME],
                               tool_choice={"type": "any", "disable_parallel_tool_use": True})
    assert len(r.content) == 1 and r.stop_reason == "tool_use"
    check_call(r.content[0])


def test_tool_choice_none_answers_in_text(client, model_name):
    r = client.messages.create(model=model_name, max_tokens=10, messages=ASK, tools=[WEATHER],
                               tool_choice={"type": "none"}, extra_body=GREEDY)
    assert [b.type for b in r.content] == ["text"] and r.stop_reason in ("end_turn", "max_tokens")


def test_streamed_tool_use_rebuilds_the_same_call(client, server, model_name):
    kw = {"model": model_name, "max_tokens": 200, "messages": ASK, "tools": [WEATHER],
          "tool_choice": {"type": "tool", "name": "get_weather"}}
    whole = client.messages.create(**kw, extra_body=GREEDY)
    with client.messages.stream(**kw, extra_body=GREEDY) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use" == whole.stop_reason
    assert [(b.name, b.input) for b in final.content] == [(b.name, b.input) for b in whole.content]
    events = raw_events(server, {**{k: v for k, v in kw.items()}, **GREEDY})
    starts = [d for n, d in events if n == "content_block_start"]
    assert starts[0]["index"] == 0 and starts[0]["content_block"]["type"] == "tool_use"
    assert starts[0]["content_block"]["input"] == {} and starts[0]["content_block"]["name"] == "get_weather"
    fragments = "".join(d["delta"]["partial_json"] for n, d in events
                        if n == "content_block_delta" and d["index"] == 0)
    assert json.loads(fragments) == whole.content[0].input


def test_a_tool_result_round_trip(client, model_name):
    first = client.messages.create(model=model_name, max_tokens=200, messages=ASK, tools=[WEATHER],
                                   tool_choice={"type": "any", "disable_parallel_tool_use": True})
    call = first.content[0]
    history = ASK + [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]}]
    for result in ({"type": "tool_result", "tool_use_id": call.id, "content": "18 C and cloudy"},
                   {"type": "tool_result", "tool_use_id": call.id, "is_error": True,
                    "content": [{"type": "text", "text": "the weather service is down"}]}):
        turn = {"role": "user", "content": [result, {"type": "text", "text": "Say it in one sentence."}]}
        second = client.messages.create(model=model_name, max_tokens=30, messages=history + [turn],
                                        tools=[WEATHER], tool_choice={"type": "none"}, extra_body=GREEDY)
        assert [b.type for b in second.content] == ["text"] and second.content[0].text.strip()
        # the result is in the prompt: the count grows with it
        without = client.messages.count_tokens(model=model_name, messages=history + [
            {"role": "user", "content": [{**result, "content": ""}, turn["content"][1]]}], tools=[WEATHER])
        with_it = client.messages.count_tokens(model=model_name, messages=history + [turn], tools=[WEATHER])
        assert with_it.input_tokens > without.input_tokens


def test_an_assistant_prefill_is_continued(client, model_name):
    r = client.messages.create(model=model_name, max_tokens=6, extra_body=GREEDY,
                               messages=COLORS + [{"role": "assistant", "content": "The first color is"}])
    plain = client.messages.create(model=model_name, max_tokens=6, messages=COLORS, extra_body=GREEDY)
    assert r.content[0].text != plain.content[0].text and r.content[0].text.strip()


def test_output_config_format_constrains_the_answer(client, model_name):
    schema = {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}}, "required": ["color"],
              "additionalProperties": False}
    r = client.messages.create(model=model_name, max_tokens=40, messages=COLORS,
                               output_config={"format": {"type": "json_schema", "schema": schema}})
    assert json.loads(r.content[0].text)["color"] in ("red", "green", "blue")
