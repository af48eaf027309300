"""POST /api/chat through the real `ollama` client against SmolLM2: streamed and whole answers, `options` honoured
(num_predict, seed, stop, num_ctx), `format` as a schema, a tool call and its result sent back, the load idiom,
and Ollama's errors."""
from __future__ import annotations

import json

import httpx
import jsonschema
import ollama
import pytest

from inferd.server.apis.ollama import render as ollama_render

ASK = [{"role": "user", "content": "Name three colors."}]
GREEDY = {"temperature": 0, "num_predict": 12}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "additionalProperties": False, "required": ["city"],
                   "properties": {"city": {"type": "string", "maxLength": 16}}}}}


@pytest.fixture(scope="module")
def client(server):
    return ollama.Client(host=server.url)


def test_whole_answer_has_the_message_and_the_counts(client, model_name):
    r = client.chat(model=model_name, messages=ASK, options=GREEDY, stream=False)
    assert r.done and r.done_reason in ("stop", "length") and r.model == model_name
    assert r.message.role == "assistant" and r.message.content.strip()
    assert 0 < r.eval_count <= 12 and r.prompt_eval_count > 5
    assert r.total_duration >= r.prompt_eval_duration + r.eval_duration > 0 and r.load_duration == 0
    assert r.created_at.endswith("Z")


def test_the_stream_adds_up_to_the_whole_answer(client, model_name):
    whole = client.chat(model=model_name, messages=ASK, options=GREEDY, stream=False)
    parts = list(client.chat(model=model_name + ":latest", messages=ASK, options=GREEDY, stream=True))
    assert [p.done for p in parts] == [False] * (len(parts) - 1) + [True]
    assert len(parts) > 2 and parts[-1].message.content == ""
    assert "".join(p.message.content for p in parts) == whole.message.content
    last = parts[-1]
    assert (last.done_reason, last.eval_count, last.prompt_eval_count) == (
        whole.done_reason, whole.eval_count, whole.prompt_eval_count)
    assert all(p.model == model_name + ":latest" for p in parts)


def test_stream_is_the_default_and_is_ndjson(server, model_name):
    body = {"model": model_name, "messages": ASK, "options": {"num_predict": 3, "temperature": 0}}
    r = httpx.post(server.url + "/api/chat", json=body, timeout=60)
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/x-ndjson")
    lines = [json.loads(line) for line in r.text.splitlines()]
    assert lines[-1]["done"] is True and lines[-1]["eval_count"] == 3 and lines[-1]["done_reason"] == "length"
    assert all(line["done"] is False for line in lines[:-1])


def test_num_predict_caps_and_negative_means_until_done(client, model_name):
    r = client.chat(model=model_name, messages=ASK, options={"num_predict": 4, "temperature": 0}, stream=False)
    assert (r.eval_count, r.done_reason) == (4, "length")
    r = client.chat(model=model_name, messages=ASK, options={"num_predict": -1, "temperature": 0}, stream=False)
    assert r.done_reason == "stop" and r.eval_count > 4


def test_seed_reproduces_and_other_seeds_differ(client, model_name):
    def answer(seed):
        opts = {"seed": seed, "temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "num_predict": 24}
        return client.chat(model=model_name, messages=ASK, options=opts, stream=False).message.content
    first = answer(11)
    assert answer(11) == first
    assert any(answer(s) != first for s in (12, 13, 14))


def test_stop_cuts_the_answer(client, model_name):
    free = client.chat(model=model_name, messages=ASK, options={"temperature": 0, "num_predict": 30},
                       stream=False).message.content
    word = free.split()[1]
    cut = client.chat(model=model_name, messages=ASK, options={"temperature": 0, "num_predict": 30, "stop": [word]},
                      stream=False)
    assert cut.done_reason == "stop" and word not in cut.message.content
    assert free.startswith(cut.message.content)


def test_unknown_options_are_ignored_and_num_ctx_within_the_context_accepted(client, model_name, server):
    opts = {**GREEDY, "num_ctx": server.state.max_model_len, "mirostat": 2, "num_thread": 3, "made_up": "x"}
    plain = client.chat(model=model_name, messages=ASK, options=GREEDY, stream=False)
    r = client.chat(model=model_name, messages=ASK, options=opts, stream=False)
    assert r.message.content == plain.message.content


def test_format_schema_output_validates(client, model_name):
    schema = {"type": "object", "additionalProperties": False, "required": ["name", "age"],
              "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer"}}}
    msg = [{"role": "user", "content": "Describe a cat called Tom who is 3."}]
    r = client.chat(model=model_name, messages=msg, format=schema, options={"temperature": 0, "num_predict": 80},
                    stream=False)
    jsonschema.validate(json.loads(r.message.content), schema)
    r = client.chat(model=model_name, messages=msg, format="json", options={"temperature": 0.7, "seed": 2,
                    "num_predict": 120}, stream=False)
    assert r.done_reason == "stop" and isinstance(json.loads(r.message.content), dict)


@pytest.fixture
def forced_calls(monkeypatch):
    """Ollama's API has no tool_choice; this small model calls a tool only when made to, so the test makes it
    (tool_choice "required": the call is grammar-constrained) and records the prompts the server renders."""
    real_request, real_render = ollama_render.tool_request, ollama_render.render_chat
    prompts = []
    monkeypatch.setattr(ollama_render, "tool_request", lambda tools, choice, parallel: real_request(
        tools, "required" if tools else choice, False))

    def recording(*args, **kw):
        prompts.append(real_render(*args, **kw))
        return prompts[-1]
    monkeypatch.setattr(ollama_render, "render_chat", recording)
    return prompts


def test_tool_call_round_trip(client, model_name, forced_calls):
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    r = client.chat(model=model_name, messages=ask, tools=[WEATHER], options={"temperature": 0, "num_predict": 60},
                    stream=False)
    (call,) = r.message.tool_calls
    assert call.function.name == "get_weather" and set(call.function.arguments) == {"city"}
    assert r.message.content == "" and r.done_reason == "stop"
    streamed = [p for p in client.chat(model=model_name, messages=ask, tools=[WEATHER], stream=True,
                                       options={"temperature": 0, "num_predict": 60}) if p.message.tool_calls]
    assert [p.message.tool_calls for p in streamed] == [r.message.tool_calls]
    city = call.function.arguments["city"]
    history = ask + [r.message, {"role": "tool", "tool_name": "get_weather", "content": "Sunny, 23 degrees"}]
    answer = client.chat(model=model_name, messages=history, options=GREEDY, stream=False)
    assert answer.done and answer.eval_count > 0
    assert "Sunny, 23 degrees" in forced_calls[-1] and json.dumps(city) in forced_calls[-1]


def test_streamed_calls_are_the_whole_answers_calls(client, model_name, monkeypatch):
    real = ollama_render.tool_request
    monkeypatch.setattr(ollama_render, "tool_request", lambda tools, choice, parallel: real(tools, "required", True))
    kw = {"model": model_name, "tools": [WEATHER], "options": {"temperature": 0.9, "seed": 5, "num_predict": 120},
          "messages": [{"role": "user", "content": "Weather in Paris, Rome and Oslo?"}]}
    whole = client.chat(**kw, stream=False).message.tool_calls
    streamed = [call for p in client.chat(**kw, stream=True) for call in p.message.tool_calls or ()]
    assert whole and streamed == whole


def test_empty_messages_load_the_model(client, model_name, server):
    r = client.chat(model=model_name, messages=[], stream=False)
    assert (r.done, r.done_reason, r.message.content, r.eval_count) == (True, "load", "", None)
    body = {"model": model_name, "messages": [], "keep_alive": 0}
    assert httpx.post(server.url + "/api/chat", json=body, timeout=30).json()["done_reason"] == "unload"


def test_keep_alive_is_accepted_in_its_forms(client, model_name):
    for keep in ("5m", "1h30m", "-1", 300, -1, "0.5s"):
        assert client.chat(model=model_name, messages=ASK, options={"num_predict": 1}, keep_alive=keep,
                           stream=False).done


@pytest.mark.parametrize(("body", "status", "words"), [
    ({"model": "nope", "messages": ASK}, 404, "model 'nope' not found"),
    ({"messages": ASK}, 400, "model"),
    ({"model": "M", "messages": [{"role": "user", "content": "hi", "images": ["aGVsbG8="]}]}, 400, "images"),
    ({"model": "M", "messages": ASK, "options": {"num_ctx": 10**7}}, 400, "num_ctx"),
    ({"model": "M", "messages": ASK, "options": {"temperature": "hot"}}, 400, "temperature"),
    ({"model": "M", "messages": ASK, "keep_alive": "soon"}, 400, "keep_alive"),
    ({"model": "M", "messages": ASK, "format": "xml"}, 400, "format"),
    ({"model": "M", "messages": ASK, "think": True}, 400, "thinking"),
    ({"model": "M", "messages": [{"role": "robot", "content": "x"}]}, 400, "role"),
    ({"model": "M", "messages": ASK, "tools": [{"type": "function"}]}, 400, "function"),
])
def test_errors_in_ollamas_envelope(server, model_name, body, status, words):
    if body.get("model") == "M":
        body = {**body, "model": model_name}
    for stream in (False, True):
        r = httpx.post(server.url + "/api/chat", json={**body, "stream": stream}, timeout=30)
        assert r.status_code == status, r.text
        assert set(r.json()) == {"error"} and words in r.json()["error"], r.text


def test_client_raises_response_error(client):
    with pytest.raises(ollama.ResponseError) as e:
        client.chat(model="missing-model", messages=ASK, stream=False)
    assert e.value.status_code == 404 and e.value.error == "model 'missing-model' not found"
    with pytest.raises(ollama.ResponseError) as e:
        list(client.chat(model="missing-model", messages=ASK, stream=True))
    assert e.value.status_code == 404


def test_unknown_api_route_and_bad_json_use_ollamas_envelope(server):
    r = httpx.post(server.url + "/api/pull", json={"model": "x"}, timeout=30)
    assert r.status_code == 404 and set(r.json()) == {"error"}
    r = httpx.post(server.url + "/api/chat", content=b"{not json", timeout=30)
    assert r.status_code == 400 and set(r.json()) == {"error"}
