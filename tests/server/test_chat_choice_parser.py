"""apis/chat/encode.py's ChoiceParser: one choice's text -> answer, thinking and tool calls, the reasoning parser
in front of the tool-call parser; streamed pieces add up to the whole message."""

import json

import pytest

from inferd.server.apis.chat.encode import ChoiceParser
from inferd.server.structured import ChatPrep
from inferd.text.reasoning import THINK, reasoning_parser
from inferd.text.tools import HERMES, ToolFormat

TEXT = ('<think>\nThe user wants the weather; call the tool.\n</think>\n\nChecking.\n'
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>')


def prep(tools: bool, thinking: bool) -> ChatPrep:
    return ChatPrep([], None, None, ToolFormat(HERMES, True) if tools else None, ("get_weather",) if tools else (),
                    reasoning=(lambda: reasoning_parser(THINK, "<|im_start|>assistant\n")) if thinking else None)


def test_thinking_answer_and_calls_come_apart():
    m = ChoiceParser(prep(tools=True, thinking=True)).message(TEXT)
    assert m.reasoning_content == m.reasoning == "The user wants the weather; call the tool."
    assert m.content.strip() == "Checking."
    assert [(c.function.name, json.loads(c.function.arguments)) for c in m.tool_calls] == [
        ("get_weather", {"city": "Paris"})]


@pytest.mark.parametrize("size", [1, 3, 7, 20])
def test_streamed_pieces_add_up_to_the_whole(size):
    parser = ChoiceParser(prep(tools=True, thinking=True))
    content = thinking = args = ""
    names = []
    pieces = [TEXT[i:i + size] for i in range(0, len(TEXT), size)]
    for i, piece in enumerate(pieces):
        c, r, deltas = parser.feed(piece, final=i == len(pieces) - 1)
        content, thinking = content + c, thinking + r
        for d in deltas:
            names += [d.function.name] if d.function and d.function.name else []
            args += d.function.arguments or "" if d.function else ""
    whole = ChoiceParser(prep(tools=True, thinking=True)).message(TEXT)
    assert (thinking, content.strip(), names) == (whole.reasoning_content, whole.content.strip(), ["get_weather"])
    assert json.loads(args) == {"city": "Paris"} and parser.has_calls


def test_thinking_without_tools_and_tools_without_thinking():
    m = ChoiceParser(prep(tools=False, thinking=True)).message("<think>hm</think>Hi.")
    assert (m.reasoning_content, m.content, m.tool_calls) == ("hm", "Hi.", None)
    m = ChoiceParser(prep(tools=True, thinking=False)).message(TEXT)
    assert m.reasoning_content is None and "<think>" in m.content and len(m.tool_calls) == 1
