"""What coding agents send to the Responses API, replayed against the real server through the openai SDK,
streaming and not (tests/server/responses_agent_requests.py): a whole conversation in `input` with no
previous_response_id, namespace and hosted tools side by side, store false and the agents' other fields. The
hosted tools are left out and named in the x-inferd-ignored-tools header; a namespaced call comes back under the
client's own name with its namespace; the call's output items replay into the next request; nothing with store
false can be fetched or continued; a choice that forces a hosted tool is a 400 in OpenAI's envelope."""
from __future__ import annotations

import json

import openai
import pytest

from tests.server.responses_agent_requests import IGNORED_HEADER, agent_request

READ_ONLY = {"type": "allowed_tools", "mode": "required",
             "tools": [{"type": "function", "name": "read_file", "namespace": "mcp__fs__"}]}


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def sdk_args(model, body):
    """The body as the SDK's arguments: client_metadata is not among them, so it goes in extra_body."""
    body = {**body, "model": model}
    extra = {"client_metadata": body.pop("client_metadata"), "seed": 3}
    return body, extra


def test_the_whole_agent_request_is_answered(client, model_name):
    body, extra = sdk_args(model_name, agent_request())
    raw = client.responses.with_raw_response.create(**body, extra_body=extra)
    assert raw.status_code == 200 and raw.headers["x-inferd-ignored-tools"] == IGNORED_HEADER
    assert raw.headers["x-inferd-ignored-items"] == "web_search_call"
    r = raw.parse()
    assert r.status in ("completed", "incomplete") and r.store is False
    assert r.reasoning.effort == "medium" and r.reasoning.summary == "auto"
    assert r.prompt_cache_key == agent_request()["prompt_cache_key"] and r.usage.input_tokens > 100
    names = {(getattr(o, "namespace", None), o.name) for o in r.output if o.type == "function_call"}
    assert names <= {(None, "shell"), ("mcp__fs__", "read_file")}
    with pytest.raises(openai.NotFoundError):                    # store false: nothing kept
        client.responses.retrieve(r.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model=model_name, input="and?", previous_response_id=r.id)


def test_a_namespaced_call_comes_back_under_the_clients_name_streamed_and_not(client, model_name):
    body, extra = sdk_args(model_name, agent_request(tool_choice=READ_ONLY, temperature=0.9))
    whole = client.responses.create(**body, extra_body=extra)
    (call,) = [o for o in whole.output if o.type == "function_call"]
    assert (call.namespace, call.name) == ("mcp__fs__", "read_file")
    assert set(json.loads(call.arguments)) == {"path"} and len(json.loads(call.arguments)["path"]) <= 24
    with client.responses.with_streaming_response.create(**body, stream=True, extra_body=extra) as raw:
        assert raw.headers["x-inferd-ignored-tools"] == IGNORED_HEADER
        events = list(raw.parse())
    assert events[-1].type == "response.completed"
    added = [e.item for e in events if e.type == "response.output_item.added" and e.item.type == "function_call"]
    assert [(i.namespace, i.name) for i in added] == [("mcp__fs__", "read_file")]
    args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    final = events[-1].response
    (streamed,) = [o for o in final.output if o.type == "function_call"]
    assert args == streamed.arguments == call.arguments and streamed.namespace == "mcp__fs__"

    # the agent replays the output with the result, still without previous_response_id
    replay = agent_request(input=agent_request()["input"] + [o.model_dump(exclude_none=True) for o in whole.output]
                           + [{"type": "function_call_output", "call_id": call.call_id, "output": "print('hi')"}],
                           max_output_tokens=16)
    body, extra = sdk_args(model_name, replay)
    again = client.responses.create(**body, extra_body=extra)
    assert again.status in ("completed", "incomplete")


def test_reasoning_items_replay_and_only_hosted_tools_mean_a_plain_answer(client, model_name):
    body, extra = sdk_args(model_name, agent_request(
        tools=agent_request()["tools"][2:], max_output_tokens=8,
        input=[{"type": "reasoning", "id": "rs_1", "summary": [],
                "content": [{"type": "reasoning_text", "text": "The user greets me."}]},
               {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hello!"}]},
               {"role": "user", "content": "Say hi again."}]))
    raw = client.responses.with_raw_response.create(**body, extra_body=extra)
    r = raw.parse()
    assert raw.status_code == 200 and r.status in ("completed", "incomplete")
    assert all(o.type in ("message", "reasoning") for o in r.output)


@pytest.mark.parametrize("choice", [{"type": "web_search_preview"}, {"type": "file_search"},
                                    {"type": "mcp", "server_label": "deepwiki"}])
def test_forcing_a_hosted_tool_is_a_clear_400(client, model_name, choice):
    body, extra = sdk_args(model_name, agent_request(tool_choice=choice))
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(**body, extra_body=extra)
    assert e.value.body["param"] == "tool_choice" and "cannot run" in e.value.body["message"]
