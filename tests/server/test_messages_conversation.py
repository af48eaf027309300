"""An Anthropic conversation as chat messages (inferd.server.apis.messages.conversation): system blocks, text
blocks, tool_use / tool_result in their places, is_error, thinking as reasoning_content, consecutive turns of one
role combined, a last assistant turn as a prefill, and what is refused."""
from __future__ import annotations

import msgspec
import pytest

from inferd.server.apis.messages.conversation import conversation
from inferd.server.apis.messages.request import MessageParam, TextBlock
from inferd.server.protocol import ProtocolError


def turns(*raw: dict) -> list[MessageParam]:
    return msgspec.convert(list(raw), list[MessageParam])


def test_a_tool_round_trip():
    conv = conversation("Be brief.", turns(
        {"role": "user", "content": [{"type": "text", "text": "<reminder>"}, {"type": "text", "text": "Weather?"}]},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "call it", "signature": "s"}, {"type": "text", "text": "Checking."},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
            {"type": "tool_use", "id": "toolu_2", "name": "get_time", "input": {}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "18 C"},
            {"type": "tool_result", "tool_use_id": "toolu_2", "is_error": True,
             "content": [{"type": "text", "text": "no "}, {"type": "text", "text": "clock"}]},
            {"type": "text", "text": "Thanks."}]}))
    assert conv.prefill == ""
    assert conv.messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "<reminder>\n\nWeather?"},
        {"role": "assistant", "content": "Checking.", "reasoning_content": "call it", "tool_calls": [
            {"id": "toolu_1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
            {"id": "toolu_2", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "18 C"},
        {"role": "tool", "tool_call_id": "toolu_2", "content": "Error: no clock"},
        {"role": "user", "content": "Thanks."}]


def test_system_blocks_consecutive_turns_and_a_prefill():
    conv = conversation([TextBlock("A."), TextBlock("B.")], turns(
        {"role": "user", "content": "Hi"}, {"role": "user", "content": "there"},
        {"role": "assistant", "content": "The answer"},
        {"role": "assistant", "content": [{"type": "text", "text": "is"}]}))
    assert conv.messages == [{"role": "system", "content": "A.\n\nB."}, {"role": "user", "content": "Hi\n\nthere"}]
    assert conv.prefill == "The answer\n\nis"


@pytest.mark.parametrize("raw, words", [
    ([{"role": "assistant", "content": "Hi"}], "needs a user message"),
    ([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": [
        {"type": "tool_use", "id": "t", "name": "f", "input": {}}]}], "send their tool_result"),
    ([{"role": "user", "content": []}], "messages.0.content: a message needs at least one content block"),
    ([{"role": "user", "content": [{"type": "image", "source": {}}]}], "messages.0.content.0: image input"),
    ([{"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "t"}]}], "tool_result block"),
])
def test_what_is_refused(raw, words):
    with pytest.raises(ProtocolError) as e:
        conversation(None, turns(*raw))
    assert words in e.value.message and e.value.status == 400
