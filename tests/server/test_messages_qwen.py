"""The Messages API on a real tool-capable model: Qwen2.5-Coder-1.5B-Instruct Q4_K_M (its template renders the
tools; `<tool_call>` starts the lazy call grammar) through the `anthropic` SDK. The prompt of a conversation with
tool_use and tool_result blocks is, to the character, chat completions' prompt of the same conversation; with
tool_choice auto the model itself decides to call the tool, streamed as a tool_use block; the tool_result goes
back and the answer uses it. Skipped without the file (../shared/models/fetch.sh fetches it)."""
from __future__ import annotations

import anthropic
import msgspec
import pytest

from tests.server.conftest import ServerThread, make_settings
from tests.server.test_qwen_agents import QWEN

pytestmark = pytest.mark.skipif(not QWEN.is_file(), reason=f"{QWEN} not fetched (../shared/models/fetch.sh)")

SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "description": "City name"}},
          "required": ["city"]}
WEATHER = {"name": "get_weather", "description": "Get the current weather in a city", "input_schema": SCHEMA}
ASK = [{"role": "user", "content": "What's the weather like in Paris today?"}]
RESULT = "Sunny, 24 degrees Celsius"


@pytest.fixture(scope="module")
def qwen():
    from inferd.model.loader import load_model
    settings = make_settings(num_kv_blocks=64, max_running=4, served_model_name="qwen")
    srv = ServerThread(settings, load_model(QWEN)).start()
    yield srv, anthropic.Anthropic(base_url=srv.url, api_key="unused", max_retries=0, timeout=600)
    srv.stop()


def test_the_prompt_is_chat_completions_prompt(qwen):
    from inferd.server.apis.chat.render import render as render_chat
    from inferd.server.apis.chat.request import ChatCompletionRequest
    from inferd.server.apis.messages.render import render_prompt
    from inferd.server.apis.messages.request import MessagesRequest
    srv, _ = qwen
    messages = {"model": "qwen", "max_tokens": 10, "system": "Be brief.", "tools": [WEATHER], "messages": ASK + [
        {"role": "assistant", "content": [{"type": "text", "text": "Let me look."},
                                          {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                           "input": {"city": "Paris"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": RESULT},
                                     {"type": "text", "text": "And tomorrow?"}]}]}
    chat = {"model": "qwen", "tools": [{"type": "function", "function": {
        "name": "get_weather", "description": WEATHER["description"], "parameters": SCHEMA}}], "messages": [
        {"role": "system", "content": "Be brief."}, *ASK,
        {"role": "assistant", "content": "Let me look.", "tool_calls": [
            {"id": "toolu_1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": RESULT},
        {"role": "user", "content": "And tomorrow?"}]}
    text, _ = srv.call(render_prompt(srv.state, msgspec.convert(messages, MessagesRequest)))
    rendered = srv.call(render_chat(srv.state, msgspec.convert(chat, ChatCompletionRequest)))
    assert text == rendered.prompts[0].text
    assert "<tools>" in text and RESULT in text and "<tool_call>" in text


def test_an_auto_tool_call_and_its_result(qwen):
    _, client = qwen
    with client.messages.stream(model="qwen", max_tokens=80, messages=ASK, tools=[WEATHER],
                                extra_body={"temperature": 0}) as stream:
        first = stream.get_final_message()
    assert first.stop_reason == "tool_use"
    call = next(b for b in first.content if b.type == "tool_use")
    assert call.name == "get_weather" and call.input["city"].lower().startswith("paris")
    history = ASK + [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": RESULT}]}]
    # answered in words from the result (tool_choice none, as a client does once it has what it needs)
    second = client.messages.create(model="qwen", max_tokens=60, messages=history, tools=[WEATHER],
                                    tool_choice={"type": "none"}, extra_body={"temperature": 0})
    assert second.stop_reason == "end_turn" and [b.type for b in second.content] == ["text"]
    assert "24" in second.content[0].text
