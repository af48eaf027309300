"""The Responses API's translation of what coding agents send (inferd.server.apis.responses: tools, items,
render's plan): namespace tools flattened for the model and mapped back, hosted tools left out and named,
reasoning items carried to the turn they belong to, developer messages merged into the system message, the
agents' fields accepted (and bad values refused by name), and the response object validated by the SDK."""
from __future__ import annotations

import json

import msgspec
import pytest
from openai.types.responses import Response

from inferd.server.apis.responses.encode import ResponseBuilder
from inferd.server.apis.responses.items import decrypt_reasoning, encrypt_reasoning, input_messages
from inferd.server.apis.responses.render import IGNORED_ITEMS_HEADER, IGNORED_TOOLS_HEADER
from inferd.server.apis.responses.render import plan as plan_request
from inferd.server.apis.responses.request import ResponsesRequest
from inferd.server.apis.responses.store import ResponseStore
from inferd.server.apis.responses.tools import chat_tool_choice, chat_tools
from inferd.server.protocol import ProtocolError, decode
from inferd.text.parsing import ReasoningDelta
from inferd.text.tools import ContentDelta, ToolArgsDelta, ToolCallStart
from tests.server.responses_agent_requests import HOSTED, IGNORED_HEADER, NAMESPACE, SHELL, agent_request

USAGE = {"prompt_tokens": 30, "completion_tokens": 9, "cached_tokens": 0}


def plan(body):
    return plan_request(decode(msgspec.json.encode(body), ResponsesRequest), ResponseStore())


def test_namespace_tools_become_functions_and_hosted_tools_are_left_out():
    t = chat_tools([SHELL, NAMESPACE, *HOSTED])
    assert [x["function"]["name"] for x in t.tools] == ["shell", "mcp__fs__.read_file"]
    read = t.tools[1]["function"]
    assert read["description"] == "(mcp__fs__: The project's files.)\nReads a file."
    assert read["parameters"] == NAMESPACE["tools"][0]["parameters"]
    assert t.names.client_name("mcp__fs__.read_file") == ("mcp__fs__", "read_file")
    assert t.names.client_name("shell") == (None, "shell")
    assert ", ".join(t.ignored) == IGNORED_HEADER


@pytest.mark.parametrize("tools,param", [
    ([{"type": "retrieval"}], "tools[0].type"),
    ([{"type": "namespace", "tools": []}], "tools[0].name"),
    ([{"type": "namespace", "name": "n", "tools": [{"type": "web_search", "name": "w"}]}], "tools[0].tools[0].type"),
    ([{"type": "namespace", "name": "n" * 64, "tools": [{"type": "function", "name": "f"}]}],
     "tools[0].tools[0].name"),
    ([{"type": "function", "name": "bad name"}], "tools[0].name"),
    ("shell", "tools"),
])
def test_bad_tools_name_the_field(tools, param):
    with pytest.raises(ProtocolError) as e:
        chat_tools(tools)
    assert e.value.param == param and e.value.status == 400


@pytest.mark.parametrize("choice", [{"type": "web_search_preview"}, {"type": "file_search"},
                                    {"type": "mcp", "server_label": "deepwiki"}, {"type": "custom", "name": "x"},
                                    {"type": "computer_use_preview"}, {"type": "image_generation"},
                                    {"type": "code_interpreter"}])
def test_a_choice_forcing_a_hosted_tool_is_a_400(choice):
    with pytest.raises(ProtocolError) as e:
        chat_tool_choice(choice, chat_tools([SHELL, *HOSTED]))
    assert e.value.status == 400 and e.value.param == "tool_choice" and "cannot run" in e.value.message


def test_choices_of_namespaced_and_allowed_tools():
    t = chat_tools([SHELL, NAMESPACE])
    assert chat_tool_choice({"type": "function", "name": "read_file", "namespace": "mcp__fs__"}, t)[0] == \
        {"type": "function", "function": {"name": "mcp__fs__.read_file"}}
    mode, allowed = chat_tool_choice({"type": "allowed_tools", "mode": "required", "tools": [
        {"type": "function", "name": "read_file", "namespace": "mcp__fs__"}]}, t)
    assert mode == "required" and [x["function"]["name"] for x in allowed] == ["mcp__fs__.read_file"]
    assert chat_tool_choice("auto", t) == ("auto", t.tools)


def test_a_replayed_conversation_becomes_chat_messages():
    p = plan(agent_request())
    system, *rest = p.messages
    assert system == {"role": "system", "content": "You are a coding agent. Use the tools to inspect the project."
                                                   "\n\n<permissions>Commands run in a sandbox.</permissions>"}
    assert [m["role"] for m in rest] == ["user", "user", "assistant", "tool", "assistant", "tool", "assistant",
                                         "user"]
    ls, read = rest[2], rest[4]
    assert ls["tool_calls"][0]["function"] == {"name": "shell", "arguments": '{"command": ["ls"]}'}
    assert "reasoning_content" not in ls                     # another server's opaque thinking means nothing here
    assert read["tool_calls"][0]["function"]["name"] == "mcp__fs__.read_file"
    assert rest[5] == {"role": "tool", "tool_call_id": "call_read", "content": "# Demo project"}
    assert rest[6] == {"role": "assistant", "content": "There is README.md and main.py."}
    assert p.ignored_items == ["web_search_call"] and p.store is False and p.reasoning_content
    assert p.headers == {IGNORED_TOOLS_HEADER: IGNORED_HEADER, IGNORED_ITEMS_HEADER: "web_search_call"}
    assert [t["function"]["name"] for t in p.tools] == ["shell", "mcp__fs__.read_file"]


def test_reasoning_items_go_with_the_turn_that_follows():
    msgs = input_messages([
        {"role": "user", "content": "hi"},
        {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "think"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Let me look."}]},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "ok"},
        {"type": "reasoning", "id": "rs_2", "summary": [], "encrypted_content": encrypt_reasoning("again")},
        {"type": "function_call", "call_id": "c2", "name": "f", "arguments": "{}"},
    ]).messages
    assert msgs[1] == {"role": "assistant", "content": "Let me look.", "reasoning_content": "think",
                       "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}
    assert msgs[3]["reasoning_content"] == "again" and msgs[3]["tool_calls"][0]["id"] == "c2"
    assert decrypt_reasoning(encrypt_reasoning("é ✓")) == "é ✓" and decrypt_reasoning("gAAAA") is None


@pytest.mark.parametrize("change,param", [
    ({"reasoning": {"effort": "maximal"}}, "reasoning.effort"),
    ({"reasoning": {"summary": "long"}}, "reasoning.summary"),
    ({"service_tier": "gold"}, "service_tier"),
    ({"truncation": "middle"}, "truncation"),
    ({"include": "reasoning.encrypted_content"}, "include"),
    ({"text": {"verbosity": "loud"}}, "text.verbosity"),
    ({"background": True}, "background"),
    ({"conversation": "conv_1"}, "conversation"),
    ({"prompt": {"id": "pmpt_1"}}, "prompt"),
    ({"prompt_cache_key": 7}, "prompt_cache_key"),
    ({"tool_choice": {"type": "web_search"}}, "tool_choice"),
])
def test_bad_agent_fields_are_refused_by_name(change, param):
    with pytest.raises(ProtocolError) as e:
        plan(agent_request(**change))
    assert e.value.status == 400 and e.value.param == param, e.value.message


def test_only_hosted_tools_answer_in_text():
    p = plan(agent_request(tools=HOSTED, tool_choice="auto"))
    assert p.tools is None and p.tool_choice is None and len(p.ignored_tools) == len(HOSTED)


def test_the_response_maps_namespaced_calls_back_and_echoes_the_fields():
    p = plan(agent_request())
    b = ResponseBuilder("m", p)
    b.add(ReasoningDelta("I should read it."))
    b.add(ToolCallStart(0, "call_9", "mcp__fs__.read_file"))
    b.add(ToolArgsDelta(0, '{"path": "main.py"}'))
    r = b.finish("tool_calls", USAGE)
    events = b.drain()
    reasoning, call = r["output"]
    assert reasoning["type"] == "reasoning" and decrypt_reasoning(reasoning["encrypted_content"]) == \
        "I should read it."
    assert (call["name"], call["namespace"], json.loads(call["arguments"])) == \
        ("read_file", "mcp__fs__", {"path": "main.py"})
    done = [e for e in events if e["type"] == "response.output_item.done"]
    assert done[0]["item"]["encrypted_content"] == reasoning["encrypted_content"]
    assert b.output_messages()[0]["tool_calls"][0]["function"]["name"] == "mcp__fs__.read_file"
    sdk = Response.model_validate(r)
    assert sdk.reasoning.effort == "medium" and sdk.reasoning.summary == "auto" and sdk.store is False
    assert sdk.prompt_cache_key == "019a8c2e-5b6f-7d10-a2b3-c4d5e6f70819" and sdk.safety_identifier == "user-7f3a"
    assert sdk.truncation == "disabled" and sdk.service_tier == "default"
    assert sdk.output[1].namespace == "mcp__fs__" and sdk.output[1].name == "read_file"


def test_without_include_the_reasoning_has_no_content_to_replay():
    b = ResponseBuilder("m", plan(agent_request(include=None)))
    b.add(ReasoningDelta("thinking"))
    b.add(ContentDelta("answer"))
    r = b.finish("stop", USAGE)
    assert "encrypted_content" not in r["output"][0]


def test_reasoning_effort_reaches_the_template_as_chat_completions_does():
    from inferd.server.apis.responses.render import effort_variables

    def variables(body):
        return effort_variables(decode(msgspec.json.encode(body), ResponsesRequest))

    assert variables(agent_request()) == {"enable_thinking": True, "reasoning_effort": "medium"}
    assert variables(agent_request(reasoning={"effort": "minimal"}))["enable_thinking"] is False
    assert variables(agent_request(reasoning={"summary": "auto"})) == {}
