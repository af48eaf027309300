"""inferd.text.tools.validation: the `tools` and `tool_choice` request fields, every problem naming its field."""
from __future__ import annotations

import pytest

from inferd.text.tools import ToolError, parse_tool_choice, parse_tools
from tests.text.tools.calls import TIME, WEATHER


def test_parse_tools_and_choice():
    tools = parse_tools([WEATHER, TIME])
    assert [t.name for t in tools] == ["get_weather", "get_time"]
    assert tools[0].as_openai() == WEATHER
    assert parse_tool_choice(None, tools) == ("auto", None)
    assert parse_tool_choice(None, []) == ("none", None)
    assert parse_tool_choice("none", tools) == ("none", None)
    assert parse_tool_choice("required", tools) == ("required", None)
    assert parse_tool_choice({"type": "function", "function": {"name": "get_time"}}, tools) == ("required",
                                                                                               "get_time")


@pytest.mark.parametrize("tools,param", [
    ("x", "tools"),
    ([{"type": "retrieval"}], "tools[0].type"),
    ([{"type": "function"}], "tools[0].function"),
    ([{"type": "function", "function": {"name": "bad name"}}], "tools[0].function.name"),
    ([{"type": "function", "function": {"name": "f", "parameters": []}}], "tools[0].function.parameters"),
    ([WEATHER, WEATHER], "tools[1].function.name"),
])
def test_bad_tools_name_the_field(tools, param):
    with pytest.raises(ToolError) as e:
        parse_tools(tools)
    assert e.value.param == param


@pytest.mark.parametrize("choice,tools,param", [
    ("sometimes", [WEATHER], "tool_choice"),
    ("required", [], "tool_choice"),
    ({"type": "function", "function": {"name": "nope"}}, [WEATHER], "tool_choice.function.name"),
    ({"type": "function"}, [WEATHER], "tool_choice"),
])
def test_bad_tool_choice_names_the_field(choice, tools, param):
    with pytest.raises(ToolError) as e:
        parse_tool_choice(choice, parse_tools(tools))
    assert e.value.param == param
