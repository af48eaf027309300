"""The Responses API's pure parts (inferd.server.apis.responses): request -> chat conversation, chat deltas -> output
items and typed stream events, and the bounded TTL store. Every response object and every event is validated
with the openai SDK's own pydantic models, so a field the SDK needs cannot go missing."""
from __future__ import annotations

import typing

import msgspec
import pytest
from openai.types.responses import Response, ResponseStreamEvent

from inferd.server.apis.responses.encode import ResponseBuilder
from inferd.server.apis.responses.items import input_messages
from inferd.server.apis.responses.render import plan as plan_request
from inferd.server.apis.responses.request import ResponsesRequest
from inferd.server.apis.responses.store import ResponseStore
from inferd.server.protocol import ProtocolError
from inferd.text.tools import ContentDelta, ToolArgsDelta, ToolCallStart

# the SDK's event models by their "type" (the union is discriminated on it)
EVENT_MODELS = {typing.get_args(m.model_fields["type"].annotation)[0]: m
                for m in typing.get_args(typing.get_args(ResponseStreamEvent)[0])}


class EVENTS:
    @staticmethod
    def validate_python(event):
        return EVENT_MODELS[event["type"]].model_validate(event)


def plan(body, store):
    """The plan of a request body, decoded into its Struct as the server decodes it."""
    return plan_request(msgspec.convert(body, ResponsesRequest), store)


USAGE = {"prompt_tokens": 12, "completion_tokens": 7, "cached_tokens": 4}


def test_input_items_become_chat_messages():
    msgs = input_messages([
        {"role": "user", "content": "Weather in Paris?"},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
        {"type": "function_call", "call_id": "call_2", "name": "get_time", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "22 C"},
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Be brief."}]},
    ]).messages
    assert msgs[0] == {"role": "user", "content": "Weather in Paris?"}
    assert msgs[1]["role"] == "assistant" and [c["id"] for c in msgs[1]["tool_calls"]] == ["call_1", "call_2"]
    assert msgs[2] == {"role": "tool", "tool_call_id": "call_1", "content": "22 C"}
    assert msgs[3] == {"role": "system", "content": "Be brief."}
    assert input_messages("hi").messages == [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize("items,param", [
    (5, "input"),
    ([{"type": "image", "url": "x"}], "input[0].type"),
    ([{"role": "robot", "content": "x"}], "input[0].role"),
    ([{"role": "user", "content": [{"type": "input_image"}]}], "input[0].content[0]"),
    ([{"type": "function_call_output", "output": "x"}], "input[0].call_id"),
])
def test_bad_input_names_the_item(items, param):
    with pytest.raises(ProtocolError) as e:
        input_messages(items)
    assert e.value.param == param


def test_plan_maps_fields_and_chains_previous_responses():
    store = ResponseStore()
    body = {"model": "m", "input": "Hi", "instructions": "Answer in French.", "max_output_tokens": 50,
            "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
            "tool_choice": {"type": "function", "name": "f"},
            "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}}}
    p = plan(body, store)
    assert p.messages == [{"role": "system", "content": "Answer in French."}, {"role": "user", "content": "Hi"}]
    assert p.tools == [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    assert p.tool_choice == {"type": "function", "function": {"name": "f"}}
    assert p.response_format == {"type": "json_schema", "name": "x", "schema": {"type": "object"}}
    assert p.max_tokens == 50
    b = ResponseBuilder("m", p)
    b.add(ContentDelta("Bonjour"))
    first = b.finish("stop", USAGE)
    store.put(first, p.messages + b.output_messages())
    p2 = plan({"input": "And again?", "previous_response_id": first["id"]}, store)
    assert p2.messages == [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Bonjour"},
                           {"role": "user", "content": "And again?"}]      # instructions are not carried over
    with pytest.raises(ProtocolError) as e:
        plan({"input": "x", "previous_response_id": "resp_missing"}, store)
    assert e.value.status == 404 and "not found" in str(e.value)


def test_text_answer_and_its_events_validate_with_the_sdk():
    b = ResponseBuilder("smol", plan({"input": "Hi"}, ResponseStore()))
    for piece in ("Hel", "lo", "!"):
        b.add(ContentDelta(piece))
    final = b.finish("stop", USAGE)
    events = b.drain()
    parsed = [EVENTS.validate_python(e) for e in events]
    kinds = [e.type for e in parsed]
    assert kinds == ["response.created", "response.in_progress", "response.output_item.added",
                     "response.content_part.added", "response.output_text.delta", "response.output_text.delta",
                     "response.output_text.delta", "response.output_text.done", "response.content_part.done",
                     "response.output_item.done", "response.completed"]
    assert [e.sequence_number for e in parsed] == list(range(len(parsed)))
    resp = Response.model_validate(final)
    assert resp.output_text == "Hello!" and resp.status == "completed"
    assert resp.usage.input_tokens == 12 and resp.usage.input_tokens_details.cached_tokens == 4
    assert resp.usage.total_tokens == 19


def test_function_calls_and_their_events_validate_with_the_sdk():
    b = ResponseBuilder("smol", plan({"input": "Weather?", "tools": [
        {"type": "function", "name": "get_weather", "parameters": {"type": "object"}}]}, ResponseStore()))
    b.add(ContentDelta("Checking."))
    b.add(ToolCallStart(0, "call_a", "get_weather"))
    b.add(ToolArgsDelta(0, '{"city": '))
    b.add(ToolArgsDelta(0, '"Paris"}'))
    b.add(ToolCallStart(1, "call_b", "get_weather"))
    b.add(ToolArgsDelta(1, '{"city": "Rome"}'))
    final = b.finish("tool_calls", USAGE)
    parsed = [EVENTS.validate_python(e) for e in b.drain()]
    kinds = [e.type for e in parsed]
    assert kinds.count("response.function_call_arguments.delta") == 3
    assert kinds.count("response.function_call_arguments.done") == 2
    assert kinds.index("response.output_item.done") < kinds.index("response.function_call_arguments.delta")
    done = [e for e in parsed if e.type == "response.function_call_arguments.done"]
    assert [d.arguments for d in done] == ['{"city": "Paris"}', '{"city": "Rome"}']
    resp = Response.model_validate(final)
    calls = [o for o in resp.output if o.type == "function_call"]
    assert [(c.call_id, c.name, c.arguments) for c in calls] == [("call_a", "get_weather", '{"city": "Paris"}'),
                                                                ("call_b", "get_weather", '{"city": "Rome"}')]
    assert resp.output[0].type == "message" and resp.output_text == "Checking."
    assert b.output_messages() == [{"role": "assistant", "content": "Checking.", "tool_calls": [
        {"id": "call_a", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
        {"id": "call_b", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}]}]


def test_length_limit_is_an_incomplete_response():
    b = ResponseBuilder("smol", plan({"input": "Hi", "max_output_tokens": 3}, ResponseStore()))
    b.add(ContentDelta("a b c"))
    resp = Response.model_validate(b.finish("length", USAGE))
    assert resp.status == "incomplete" and resp.incomplete_details.reason == "max_output_tokens"
    assert b.drain()[-1]["type"] == "response.incomplete"


def test_store_is_bounded_and_expires():
    now = [0.0]
    store = ResponseStore(size=2, ttl_s=10, clock=lambda: now[0])
    for i in range(3):
        store.put({"id": f"r{i}"}, [])
    assert store.get("r0") is None and store.get("r1") is not None and len(store) == 2
    now[0] = 11
    assert store.get("r2") is None
    store.put({"id": "r3"}, [])
    assert store.delete("r3") and not store.delete("r3")
