"""A real tool-capable model end to end: Qwen2.5-Coder-1.5B-Instruct Q4_K_M behind the server, through the openai
SDK: a two-turn weather-tool conversation, forced and auto (its <tool_call> token starts the lazy call grammar),
streaming and not; and fill-in-the-middle of a small Python function with its FIM tokens. Skipped without the
file (../shared/models/fetch.sh fetches it)."""
from __future__ import annotations

import json
import os
from pathlib import Path

import openai
import pytest

from tests.server.conftest import ServerThread, make_settings

QWEN = Path(os.environ.get("INFERD_TEST_MODELS", Path.home() / ".cache/inferd-test-models")) / \
    "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
pytestmark = pytest.mark.skipif(not QWEN.is_file(), reason=f"{QWEN} not fetched (../shared/models/fetch.sh)")

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City name"}},
                   "required": ["city"]}}}
ASK = [{"role": "user", "content": "What's the weather like in Paris today?"}]


@pytest.fixture(scope="module")
def qwen():
    from inferd.model.loader import load_model
    settings = make_settings(num_kv_blocks=64, max_running=4, served_model_name="qwen")
    srv = ServerThread(settings, load_model(QWEN)).start()
    yield srv, openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=600)
    srv.stop()


def ask(client, **kw):
    kw.setdefault("messages", ASK)
    return client.chat.completions.create(model="qwen", tools=[WEATHER], temperature=0.0, max_tokens=80, **kw)


@pytest.mark.parametrize("tool_choice", ["auto", "required"])
def test_weather_conversation_two_turns(qwen, tool_choice):
    _, client = qwen
    first = ask(client, tool_choice=tool_choice)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls", choice.message.content
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather"
    assert "paris" in json.loads(call.function.arguments)["city"].lower()
    messages = ASK + [choice.message.model_dump(exclude_none=True),
                      {"role": "tool", "tool_call_id": call.id, "content": '{"temperature_c": 22, "sky": "sunny"}'}]
    second = ask(client, messages=messages, tool_choice="none")     # answer from the result, in words
    answer = second.choices[0]
    assert answer.finish_reason == "stop" and answer.message.tool_calls is None
    assert "22" in answer.message.content


@pytest.mark.parametrize("tool_choice", ["auto", "required"])
def test_streamed_call_equals_the_whole_one(qwen, tool_choice):
    _, client = qwen
    whole = ask(client, tool_choice=tool_choice).choices[0]
    with client.chat.completions.stream(model="qwen", messages=ASK, tools=[WEATHER], tool_choice=tool_choice,
                                        temperature=0.0, max_tokens=80) as stream:
        final = stream.get_final_completion().choices[0]
    assert final.finish_reason == whole.finish_reason == "tool_calls"
    assert [(c.function.name, c.function.arguments) for c in final.message.tool_calls] == \
           [(c.function.name, c.function.arguments) for c in whole.message.tool_calls]


def test_fill_in_the_middle(qwen):
    _, client = qwen
    r = client.completions.create(model="qwen", prompt="def add(a, b):\n    ", suffix="\n\nprint(add(1, 2))\n",
                                  max_tokens=16, temperature=0.0)
    assert "return a + b" in r.choices[0].text
