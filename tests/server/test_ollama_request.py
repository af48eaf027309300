"""The Ollama request's pieces without a server: keep_alive durations, think's template switches, format, model
names, messages as the chat template gets them (tool calls with ids, results tied to them), and the pre-encoded
NDJSON text line being byte for byte the encoded line."""
from __future__ import annotations

import msgspec
import pytest

from inferd.server.apis.ollama.encode import AssistantMessage, ChatLine, ndjson, ndjson_frames
from inferd.server.apis.ollama.render import chat_messages
from inferd.server.apis.ollama.request import (
    Message,
    base_name,
    check_think,
    format_grammar,
    keep_alive_seconds,
    think_kwargs,
)
from inferd.server.protocol import Limits, ProtocolError
from inferd.server.sse import TextFrames


@pytest.mark.parametrize(("value", "seconds"), [
    (None, None), (300, 300.0), (-1, -1.0), ("5m", 300.0), ("1h30m", 5400.0), ("-1", -1.0), ("0", 0.0),
    ("300ms", 0.3), ("1.5h", 5400.0), ("-2m", -120.0), ("45", 45.0),
])
def test_keep_alive_durations(value, seconds):
    got = keep_alive_seconds(value)
    assert (got is None) if seconds is None else (got == pytest.approx(seconds))


@pytest.mark.parametrize("value", ["soon", "5 m", "m", "", "5d", "1h-3m", float("inf")])
def test_bad_keep_alive_is_a_400(value):
    with pytest.raises(ProtocolError) as e:
        keep_alive_seconds(value)
    assert e.value.status == 400 and e.value.param == "keep_alive"


def test_think_sets_the_template_switches():
    assert think_kwargs(None) == {}
    assert think_kwargs(False) == {"enable_thinking": False}
    assert think_kwargs(True) == {"enable_thinking": True}
    assert think_kwargs("high") == {"enable_thinking": True, "reasoning_effort": "high"}
    check_think(False, model_thinks=False)
    for bad, thinks in (("max", True), (True, False), ("low", False)):
        with pytest.raises(ProtocolError):
            check_think(bad, model_thinks=thinks)


def test_format():
    assert format_grammar(None) is None and format_grammar("") is None
    assert format_grammar("json").kind == "json_object"
    assert format_grammar({"type": "object", "properties": {"a": {"type": "integer"}}}).kind == "json_schema"
    for bad in ("xml", 3, ["json"]):
        with pytest.raises(ProtocolError) as e:
            format_grammar(bad)
        assert e.value.param == "format"


def test_names():
    assert base_name("smol:latest") == "smol" and base_name("qwen2.5:0.5b") == "qwen2.5:0.5b"


def test_messages_tie_tool_results_to_their_calls():
    msgs = msgspec.convert([
        {"role": "user", "content": "weather and time?"},
        {"role": "assistant", "content": "", "thinking": "two calls", "tool_calls": [
            {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
            {"function": {"name": "get_time", "arguments": '{"tz": "CET"}'}}]},
        {"role": "tool", "tool_name": "get_time", "content": "12:00"},
        {"role": "tool", "content": "sunny"},
    ], list[Message])
    out = chat_messages(msgs, Limits(vocab_size=10))
    calls = out[1]["tool_calls"]
    assert [c["id"] for c in calls] == ["call_1_0", "call_1_1"] and out[1]["reasoning_content"] == "two calls"
    assert calls[0]["function"] == {"name": "get_weather", "arguments": {"city": "Paris"}}
    assert (out[2]["tool_call_id"], out[2]["name"]) == ("call_1_1", "get_time")
    assert (out[3]["tool_call_id"], out[3]["name"]) == ("call_1_0", "get_weather")


@pytest.mark.parametrize("bad", [
    {"role": "robot", "content": "x"},
    {"role": "user", "content": "x", "images": ["aGk="]},
    {"role": "user", "content": "x", "tool_calls": [{"function": {"name": "f"}}]},
])
def test_bad_messages(bad):
    with pytest.raises(ProtocolError) as e:
        chat_messages(msgspec.convert([bad], list[Message]), Limits(vocab_size=10))
    assert e.value.param.startswith("messages[0]")


@pytest.mark.parametrize("text", ["hi", "", 'quote " and \\ back', "line\nbreak", "é ☃ \u0000"])
def test_the_text_line_is_the_encoded_line(text):
    def line(content):
        return ChatLine(model="m", created_at="t", message=AssistantMessage("assistant", content), done=False)
    assert ndjson_frames(line(TextFrames.MARK))(text) == ndjson(line(text))
