"""The Messages encoder's block builder on its own: thinking, text and tool calls of one answer become blocks with
consecutive indices, each opened, filled and closed by its events in order; whitespace between blocks makes no
block; the whole message's content equals what the events build (as the SDK's accumulator builds it)."""
from __future__ import annotations

import json

from inferd.server.apis.messages.encode import BlockBuilder, tool_input
from inferd.text.parsing import ContentDelta, ReasoningDelta, ToolArgsDelta, ToolCallStart

ANSWER = [ReasoningDelta("look it "), ReasoningDelta("up"), ContentDelta("\n\n"), ContentDelta("Let me "),
          ContentDelta("check."), ContentDelta("\n"), ToolCallStart(0, "call_1", "get_weather"),
          ToolArgsDelta(0, '{"city": '), ToolArgsDelta(0, '"Paris"}'), ContentDelta("\n"),
          ToolCallStart(1, "call_2", "get_time"), ToolArgsDelta(1, '{"tz": "CET"}')]


def events_of(raw: bytes) -> list[tuple[str, dict]]:
    out = []
    for block in raw.decode().split("\n\n")[:-1]:
        name, data = block.split("\n")
        out.append((name.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    return out


def rebuild(events: list[tuple[str, dict]]) -> list[dict]:
    """What a client makes of the events (the anthropic SDK's accumulator, in short)."""
    blocks: list[dict] = []
    args: dict[int, str] = {}
    open_ = None
    for name, e in events:
        if name == "content_block_start":
            assert open_ is None and e["index"] == len(blocks)
            blocks.append(dict(e["content_block"]))
            open_ = e["index"]
        elif name == "content_block_delta":
            assert e["index"] == open_
            d, b = e["delta"], blocks[e["index"]]
            if d["type"] == "text_delta":
                b["text"] += d["text"]
            elif d["type"] == "thinking_delta":
                b["thinking"] += d["thinking"]
            else:
                args[e["index"]] = args.get(e["index"], "") + d["partial_json"]
        else:
            assert name == "content_block_stop" and e["index"] == open_
            open_ = None
    assert open_ is None
    for i, text in args.items():
        blocks[i]["input"] = json.loads(text)
    return blocks


def test_blocks_of_a_thinking_answer_with_calls():
    builder = BlockBuilder()
    raw = b"".join(builder.add(d) for d in ANSWER) + builder.finish()
    content = builder.content()
    assert [(b["type"], b.get("text") or b.get("thinking") or b.get("name")) for b in content] == [
        ("thinking", "look it up"), ("text", "Let me check.\n"), ("tool_use", "get_weather"), ("tool_use", "get_time")]
    assert content[2]["input"] == {"city": "Paris"} and content[3]["input"] == {"tz": "CET"}
    assert content[2]["id"].startswith("toolu_") and content[2]["id"] != content[3]["id"]
    assert content[0]["signature"] == ""
    assert rebuild(events_of(raw)) == content
    assert builder.has_tool_use


def test_text_only_answers_and_whitespace():
    builder = BlockBuilder()
    raw = builder.add(ContentDelta("  ")) + builder.add(ContentDelta("Hi")) + builder.finish()
    assert builder.content() == [{"type": "text", "text": "  Hi"}] and rebuild(events_of(raw)) == builder.content()
    only_space = BlockBuilder()
    raw = only_space.add(ContentDelta("\n")) + only_space.finish()
    assert only_space.content() == [{"type": "text", "text": "\n"}] and rebuild(events_of(raw)) == only_space.content()
    empty = BlockBuilder()
    assert empty.add(ContentDelta("")) + empty.finish() == b"" and empty.content() == []
    assert not empty.has_tool_use


def test_tool_input_is_always_an_object():
    assert tool_input('{"a": 1}') == {"a": 1} and tool_input("") == {}
    assert tool_input('{"a": ') == {"arguments": '{"a": '} and tool_input("[1]") == {"arguments": [1]}
