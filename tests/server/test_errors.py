"""Every error case of the API through raw aiohttp: status, the OpenAI envelope, and a message that helps."""

import asyncio
import threading
import time

import aiohttp
import pytest

from tests.server.http_calls import CHAT, CMPL, MSG, call


def assert_error(status, payload, want_status, want_param=None, contains=(), type_=None):
    assert status == want_status, payload
    err = payload["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["param"] == want_param
    if type_:
        assert err["type"] == type_
    for c in (contains if isinstance(contains, tuple) else (contains,)):
        assert c in err["message"], err["message"]
    return err


@pytest.mark.parametrize("path, body, param, contains", [
    (CHAT, {"messages": MSG, "max_tokens": "x"}, "max_tokens", "Expected `int | null`, got `str`"),
    (CHAT, {"messages": MSG, "temperature": 3}, "temperature", "<= 2.0"),
    (CHAT, {"messages": MSG, "top_p": -0.1}, "top_p", ">= 0.0"),
    (CHAT, {"messages": MSG, "n": 0}, "n", ">= 1"),
    (CHAT, {"messages": MSG, "n": 9}, "n", "n must be at most 8, got 9"),
    (CHAT, {"messages": MSG, "presence_penalty": 2.5}, "presence_penalty", "<= 2.0"),
    (CHAT, {"messages": MSG, "max_tokens": -1}, "max_tokens", ">= 0"),
    (CHAT, {"messages": MSG, "max_completion_tokens": 0}, "max_completion_tokens", "at least 1"),
    (CHAT, {"messages": MSG, "max_tokens": 5, "max_completion_tokens": 6}, "max_completion_tokens", "disagree"),
    (CHAT, {"messages": MSG, "logprobs": True, "top_logprobs": 21}, "top_logprobs", "<= 20"),
    (CHAT, {"messages": MSG, "top_logprobs": 2}, "top_logprobs", "requires logprobs"),
    (CHAT, {}, "messages", "missing required field `messages`"),
    (CHAT, {"messages": []}, "messages", "at least one message"),
    (CHAT, {"messages": "hi"}, "messages", "Expected `array`, got `str`"),
    (CHAT, {"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role", "unsupported role 'wizard'"),
    (CHAT, {"messages": [{"content": "x"}]}, "messages[0].role", "missing required field `role`"),
    (CHAT, {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     "messages[0].content[0]", "only text content parts"),
    (CHAT, {"messages": MSG, "tools": [{"type": "function"}]}, "tools[0].function", "must be an object with a name"),
    (CHAT, {"messages": MSG, "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "maybe"},
     "tool_choice", "none, auto, required"),
    (CHAT, {"messages": MSG, "response_format": {"type": "xml"}}, "response_format.type", "not supported"),
    (CHAT, {"messages": MSG, "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "strin"}}}}, "response_format.json_schema.schema", "Invalid type: strin"),
    (CHAT, {"messages": MSG, "guided_regex": "(ab"}, "guided_regex", "invalid regular expression"),
    (CHAT, {"messages": MSG, "guided_json": {"type": "object", "not": {}}}, "guided_json", "cannot be enforced"),
    (CHAT, {"messages": MSG, "guided_choice": ["a"], "guided_regex": "a"}, "guided_choice", "send only one"),
    (CHAT, {"messages": [{"role": "tool", "content": "x"}]}, "messages[0].tool_call_id", "needs the tool_call_id"),
    (CHAT, {"messages": MSG, "stream_options": {"include_usage": True}}, "stream_options", "only allowed when"),
    (CHAT, {"messages": MSG, "stop": ""}, "stop", "must not be empty"),
    (CHAT, {"messages": MSG, "logit_bias": {"abc": 1}}, "logit_bias", "must be token ids"),
    (CHAT, {"messages": MSG, "logit_bias": {"99999999": 1}}, "logit_bias", "outside the vocabulary"),
    (CHAT, {"messages": MSG, "logit_bias": {"5": 101}}, "logit_bias", "<= 100.0"),
    (CMPL, {"prompt": "x", "suffix": "y"}, "suffix", "no fill-in-the-middle tokens"),
    (CMPL, {"prompt": ["x", "y"], "suffix": "y"}, "suffix", "needs a single text prompt"),
    (CMPL, {"prompt": "x", "grammar": 'root ::= "a" | b'}, "grammar", "invalid grammar"),
    (CMPL, {"prompt": "x", "best_of": 3}, "best_of", "best_of is not supported"),
    (CMPL, {"prompt": "x", "logprobs": 21}, "logprobs", "<= 20"),
    (CMPL, {"prompt": [1, "a"]}, "prompt", "prompt must be a string, a list of strings"),
    (CMPL, {"prompt": []}, "prompt", "must not be an empty list"),
    (CMPL, {"prompt": [[]]}, "prompt", "must not be empty"),
    (CMPL, {"prompt": [10 ** 9]}, "prompt", "token id 1000000000 is outside the vocabulary"),
    (CMPL, {"prompt": [-1]}, "prompt", "token id -1 is outside the vocabulary"),
    (CMPL, {"prompt": ""}, "prompt", "the prompt is empty"),
    (CMPL, {"max_tokens": 4}, "prompt", "missing required field `prompt`"),
])
async def test_bad_requests_are_400_with_param(server, path, body, param, contains):
    status, payload, _ = await call(server.url, path, body)
    assert_error(status, payload, 400, param, contains, "invalid_request_error")


@pytest.mark.parametrize("raw, contains", [
    (b"{not json", "could not parse the request body as JSON"),
    (b"", "could not parse the request body as JSON"),
    (b"[1, 2]", "Expected `object`, got `array`"),
    (b'{"messages": [{"role": "user", "content": "\xff"}]}', "could not parse"),
])
async def test_malformed_bodies(server, raw, contains):
    status, payload, _ = await call(server.url, CHAT, raw=raw)
    assert_error(status, payload, 400, None, contains)


async def test_prompt_plus_max_tokens_beyond_context_names_the_numbers(server):
    n_prompt = len(server.state.tokenizer.encode("Hello world"))
    status, payload, _ = await call(server.url, CMPL, {"prompt": "Hello world", "max_tokens": 8192})
    err = assert_error(status, payload, 400, "max_tokens",
                       ("maximum context length is 8192 tokens", f"requested {n_prompt + 8192} tokens",
                        f"{n_prompt} in the prompt, 8192 for the completion"))
    assert err["code"] == "context_length_exceeded"


async def test_prompt_longer_than_context(server):
    n = len(server.state.tokenizer.encode(" hello" * 9000))
    assert n > 8192
    status, payload, _ = await call(server.url, CMPL, {"prompt": " hello" * 9000, "max_tokens": 1})
    assert_error(status, payload, 400, "prompt", (f"the prompt has {n} tokens", "at most 8192"))


async def test_unknown_model_is_404_with_param_model(server):
    status, payload, _ = await call(server.url, CHAT, {"model": "gpt-5", "messages": MSG})
    err = assert_error(status, payload, 404, "model", "The model `gpt-5` does not exist", "not_found_error")
    assert err["code"] == "model_not_found"
    status, payload, _ = await call(server.url, "/v1/models/gpt-5", method="GET")
    assert_error(status, payload, 404, "model")


async def test_unknown_route_and_wrong_method(server):
    status, payload, _ = await call(server.url, "/v1/nothing", {})
    assert_error(status, payload, 404, None, "no route for POST /v1/nothing")
    status, payload, _ = await call(server.url, CHAT, method="GET")
    assert_error(status, payload, 405, None, "method GET is not allowed on /v1/chat/completions")


async def test_api_keys(make_server):
    srv = make_server(api_keys=["sk-right", "sk-other"])
    status, payload, headers = await call(srv.url, "/v1/models", method="GET")
    err = assert_error(status, payload, 401, None, "missing API key", "authentication_error")
    assert err["code"] == "invalid_api_key" and headers["WWW-Authenticate"] == "Bearer"
    for bad in ("Bearer sk-wrong", "Bearer sk-righ", "Basic sk-right", "sk-right"):
        status, payload, _ = await call(srv.url, "/v1/models", method="GET", headers={"Authorization": bad})
        assert status == 401, bad
    for good in ("sk-right", "sk-other"):
        status, payload, _ = await call(srv.url, "/v1/models", method="GET",
                                        headers={"Authorization": f"Bearer {good}"})
        assert status == 200
    status, _, _ = await call(srv.url, "/tokenize", {"prompt": "x"})
    assert status == 401
    for open_path in ("/health", "/metrics"):
        status, _, _ = await call(srv.url, open_path, method="GET")
        assert status == 200


async def test_oversized_body_is_413(make_server):
    srv = make_server(max_body_bytes=2000)
    status, payload, _ = await call(srv.url, CMPL, {"prompt": "x" * 5000})
    err = assert_error(status, payload, 413, None, "larger than the limit of 2000 bytes")
    assert err["code"] == "request_too_large"
    status, _, _ = await call(srv.url, CMPL, {"prompt": "small", "max_tokens": 1})
    assert status == 200


async def test_queue_full_is_503_with_retry_after(make_server):
    srv = make_server(max_running=1, max_waiting=1)
    sched = srv.state.engine_loop
    body = {"prompt": "Tell me a story.", "max_tokens": 2000, "ignore_eos": True, "stream": True}
    async with aiohttp.ClientSession() as s:
        first = await s.post(srv.url + CMPL, json=body)
        await first.content.readline()              # generating
        second_task = asyncio.ensure_future(s.post(srv.url + CMPL, json=body))
        deadline = time.monotonic() + 10
        while sched.num_waiting < 1 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert sched.num_running == 1 and sched.num_waiting == 1
        async with s.post(srv.url + CMPL, json=body) as third:
            payload = await third.json()
            assert third.status == 503
            assert third.headers["Retry-After"] == "1"
        assert payload["error"]["code"] == "queue_full"
        assert payload["error"]["type"] == "service_unavailable_error"
        first.close()
        second = await second_task
        second.close()
    srv.wait_idle()


async def test_engine_fault_is_500_and_the_server_keeps_serving(make_server):
    srv = make_server()
    marker = srv.state.tokenizer.encode("FAULT-INJECTION-MARKER", add_special=False)

    def inject(states):
        for st in states:
            ids = st.request.prompt_ids
            if any(ids[i:i + len(marker)] == marker for i in range(len(ids))):
                raise RuntimeError("injected engine fault")
    srv.state.engine_loop.before_step = inject
    status, payload, _ = await call(srv.url, CMPL, {"prompt": "FAULT-INJECTION-MARKER", "max_tokens": 4})
    assert_error(status, payload, 500, None, "injected engine fault", "internal_server_error")
    # neighbours in the same step are unaffected, and later requests work
    results = await asyncio.gather(
        call(srv.url, CMPL, {"prompt": "FAULT-INJECTION-MARKER again", "max_tokens": 4}),
        call(srv.url, CMPL, {"prompt": "A healthy request", "max_tokens": 4, "ignore_eos": True}))   # 4, not EOS
    assert [r[0] for r in results] == [500, 200]
    assert results[1][1]["usage"]["completion_tokens"] == 4
    srv.wait_idle()
    status, _, _ = await call(srv.url, "/health", method="GET")
    assert status == 200


async def test_health_is_503_while_loading_then_200(make_server, loaded_model):
    release = threading.Event()

    def slow_load():
        release.wait(30)
        return loaded_model
    srv = make_server(model=None, load=slow_load, wait_ready=False)
    status, payload, headers = await call(srv.url, "/health", method="GET")
    assert (status, payload, headers["Retry-After"]) == (503, {"status": "loading"}, "5")
    status, payload, _ = await call(srv.url, CHAT, {"messages": MSG})
    assert_error(status, payload, 503, None, "still loading", "service_unavailable_error")
    status, _, _ = await call(srv.url, "/metrics", method="GET")
    assert status == 503
    release.set()
    await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(srv.state.ready_event.wait(), srv.loop))
    status, payload, _ = await call(srv.url, "/health", method="GET")
    assert (status, payload) == (200, {"status": "ready"})


async def test_model_that_fails_to_load_is_reported(make_server):
    from inferd.model.errors import ModelLoadError

    def broken():
        raise ModelLoadError("/models/broken.gguf", "not a GGUF file (bad magic)")
    srv = make_server(model=None, load=broken, wait_ready=False)
    await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(srv.state.ready_event.wait(), srv.loop))
    status, payload, _ = await call(srv.url, "/health", method="GET")
    assert status == 503 and payload["status"] == "failed"
    assert "bad magic" in payload["error"]
    status, payload, _ = await call(srv.url, CMPL, {"prompt": "x"})
    assert_error(status, payload, 503, None, "the model failed to load")
