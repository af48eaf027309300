"""The Messages API's refusals: every one in Anthropic's envelope ({"type": "error", "error": {"type", "message"}})
with the status the `anthropic` SDK maps to its exception classes, whether the pipeline, a middleware (API keys,
a model still loading, no such route) or count_tokens refused; `x-api-key` and `Authorization: Bearer` on every
route."""
from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request

import anthropic
import openai
import pytest

from inferd.server.apis.messages.errors import error_body
from inferd.server.protocol import ProtocolError

ASK = [{"role": "user", "content": "Hi"}]


def post(url: str, path: str, body, headers: dict | None = None, method: str = "POST") -> tuple[int, object]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url + path, data=data, method=method,
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def anthropic_error(payload, kind: str, words: str) -> str:
    assert isinstance(payload, dict) and payload["type"] == "error" and set(payload) == {"type", "error"}, payload
    assert payload["error"]["type"] == kind and set(payload["error"]) == {"type", "message"}, payload
    assert words in payload["error"]["message"], payload
    return payload["error"]["message"]


@pytest.fixture(scope="module")
def client(server):
    return anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)


def body(model, **kw):
    return {"model": model, "max_tokens": 4, "messages": ASK, **kw}


IMAGE = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
BAD_BODIES = [
    (lambda m: {"model": m, "messages": ASK}, "max_tokens"),
    (lambda m: body(m, max_tokens=-1), "max_tokens"),
    (lambda m: body(m, messages=[]), "at least one message"),
    (lambda m: body(m, messages=[{"role": "user", "content": [IMAGE]}]), "image input is not supported"),
    (lambda m: body(m, messages=[{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t",
                                                             "content": [IMAGE]}]}]), "image input is not supported"),
    (lambda m: body(m, messages=[{"role": "user", "content": [{"type": "document", "source": {}}]}]),
     "document input is not supported"),
    (lambda m: body(m, messages=[{"role": "user", "content": [{"type": "video"}]}]), "video"),
    (lambda m: body(m, messages=[{"role": "system", "content": "x"}]), "role"),
    (lambda m: body(m, messages=[{"role": "user", "content": []}]), "at least one content block"),
    (lambda m: body(m, messages=[{"role": "user", "content": [{"type": "tool_use", "id": "t", "name": "f",
                                                             "input": {}}]}]), "tool_use block is not allowed"),
    (lambda m: body(m, messages=ASK + [{"role": "assistant", "content": [
        {"type": "tool_use", "id": "t", "name": "f", "input": {}}]}]), "tool_result"),
    (lambda m: body(m, stop_sequences=[""]), "stop_sequences"),
    (lambda m: body(m, temperature=-1), "temperature"),
    (lambda m: body(m, top_k=-3), "top_k"),
    (lambda m: body(m, thinking={"type": "enabled", "budget_tokens": 10}), "budget_tokens"),
    (lambda m: body(m, thinking={"type": "sometimes"}), "thinking"),
    (lambda m: body(m, tools=[{"name": "bad name!", "input_schema": {"type": "object"}}]), "tools.0.name"),
    (lambda m: body(m, tools=[{"name": "f"}]), "input_schema"),
    (lambda m: body(m, tool_choice={"type": "any"}), "needs tools"),
    (lambda m: body(m, tools=[{"name": "f", "input_schema": {"type": "object"}}], tool_choice={"type": "tool"}),
     "names the tool"),
    (lambda m: body(m, tools=[{"name": "f", "input_schema": {"type": "object"}}],
                    tool_choice={"type": "tool", "name": "g"}), "no tool is named 'g'"),
    (lambda m: body(m, output_config={"format": {"type": "json_schema", "schema": {"type": "nonsense"}}}),
     "output_config.format.schema"),
]


@pytest.mark.parametrize("make, words", BAD_BODIES)
def test_bad_bodies_are_400s_in_anthropics_envelope(server, model_name, make, words):
    status, payload = post(server.url, "/v1/messages", make(model_name))
    assert status == 400, payload
    anthropic_error(payload, "invalid_request_error", words)


def test_the_sdk_raises_its_own_classes(client, model_name):
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(model=model_name, max_tokens=4, messages=[{"role": "user", "content": [IMAGE]}])
    anthropic_error(e.value.body, "invalid_request_error", "image input is not supported")
    with pytest.raises(anthropic.NotFoundError) as e:
        client.messages.create(model="claude-sonnet-4-5", max_tokens=4, messages=ASK)
    anthropic_error(e.value.body, "not_found_error", "claude-sonnet-4-5")
    with pytest.raises(anthropic.NotFoundError):
        client.messages.count_tokens(model="claude-sonnet-4-5", messages=ASK)


def test_not_json_and_count_tokens_refusals(server, model_name):
    status, payload = post(server.url, "/v1/messages", b"{not json")
    assert status == 400 and anthropic_error(payload, "invalid_request_error", "JSON")
    status, payload = post(server.url, "/v1/messages/count_tokens", {"model": model_name, "messages": []})
    assert status == 400 and anthropic_error(payload, "invalid_request_error", "at least one message")
    status, payload = post(server.url, "/v1/messages/count_tokens", {"messages": ASK})
    assert status == 400 and anthropic_error(payload, "invalid_request_error", "model")
    # count_tokens needs no max_tokens, and takes the fields of a messages body
    status, payload = post(server.url, "/v1/messages/count_tokens", {**body(model_name), "stream": True})
    assert status == 200 and set(payload) == {"input_tokens"} and payload["input_tokens"] > 0


def test_routes_and_methods_under_messages_answer_in_anthropics_envelope(server):
    status, payload = post(server.url, "/v1/messages/batches", {})
    assert status == 404 and anthropic_error(payload, "not_found_error", "no route")
    status, payload = post(server.url, "/v1/messages", None, method="GET")
    assert status == 405 and anthropic_error(payload, "invalid_request_error", "not allowed")
    status, payload = post(server.url, "/v1/nothing", {})  # every other route keeps OpenAI's envelope
    assert status == 404 and payload["error"]["type"] == "not_found_error" and "param" in payload["error"]


def test_statuses_map_to_anthropics_error_types():
    kinds = {s: error_body(ProtocolError("x", status=s)).error.type for s in (400, 401, 404, 413, 429, 500, 503, 504)}
    assert kinds == {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
                     413: "request_too_large", 429: "rate_limit_error", 500: "api_error", 503: "overloaded_error",
                     504: "api_error"}
    assert error_body(ProtocolError("must be positive", "max_tokens")).error.message == "max_tokens: must be positive"


def test_a_loading_model_is_overloaded_error(make_server, loaded_model):
    release = threading.Event()

    def slow_load():
        release.wait(30)
        return loaded_model
    srv = make_server(model=None, load=slow_load, wait_ready=False)
    try:
        client = anthropic.Anthropic(base_url=srv.url, api_key="unused", max_retries=0)
        with pytest.raises(anthropic.ServiceUnavailableError) as e:
            client.messages.create(model="m", max_tokens=4, messages=ASK)
        anthropic_error(e.value.body, "overloaded_error", "still loading")
        assert e.value.response.headers["Retry-After"] == "5"
    finally:
        release.set()
        srv.call(srv.state.ready_event.wait())


def test_x_api_key_and_bearer_both_work_on_every_route(make_server):
    srv = make_server(api_keys=["sk-right"])
    name = srv.state.served_model_name
    good = anthropic.Anthropic(base_url=srv.url, api_key="sk-right", max_retries=0)
    assert good.messages.create(model=name, max_tokens=2, messages=ASK).usage.output_tokens == 2
    assert good.messages.count_tokens(model=name, messages=ASK).input_tokens > 0
    bearer = anthropic.Anthropic(base_url=srv.url, auth_token="sk-right", max_retries=0)  # Authorization: Bearer
    assert bearer.messages.create(model=name, max_tokens=2, messages=ASK).stop_reason == "max_tokens"
    with pytest.raises(anthropic.AuthenticationError) as e:
        anthropic.Anthropic(base_url=srv.url, api_key="sk-wrong", max_retries=0).messages.create(
            model=name, max_tokens=2, messages=ASK)
    anthropic_error(e.value.body, "authentication_error", "incorrect API key")
    status, payload = post(srv.url, "/v1/messages", body(name))
    assert status == 401 and "x-api-key" in anthropic_error(payload, "authentication_error", "missing API key")
    # the OpenAI routes take x-api-key too, and keep their own envelope
    status, payload = post(srv.url, "/v1/chat/completions", {"messages": ASK, "max_tokens": 1},
                           headers={"x-api-key": "sk-right"})
    assert status == 200 and payload["object"] == "chat.completion"
    # a gateway may add the other header: either one holding the key lets the request in
    status, payload = post(srv.url, "/v1/messages", body(name),
                           headers={"Authorization": "Bearer sk-gateway", "x-api-key": "sk-right"})
    assert status == 200 and payload["type"] == "message"
    with pytest.raises(openai.AuthenticationError) as oe:
        openai.OpenAI(base_url=srv.url + "/v1", api_key="sk-wrong", max_retries=0).models.list()
    assert oe.value.body["type"] == "authentication_error"
    assert [m.id for m in openai.OpenAI(base_url=srv.url + "/v1", api_key="sk-right").models.list()] == [name]
