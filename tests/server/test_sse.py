"""Server-sent events on the wire: framing, chunk order, keepalive pings, and errors after the stream began."""

import asyncio
import json

import aiohttp

MSG = [{"role": "user", "content": "Say hello."}]


def parse_events(body: str):
    """(kind, value) per event: ('data', dict | '[DONE]') or ('comment', text); asserts the framing."""
    assert body.endswith("\n\n"), body[-50:]
    events = []
    for block in body[:-2].split("\n\n"):
        assert "\n" not in block, f"one line per event expected: {block!r}"
        if block.startswith(": "):
            events.append(("comment", block[2:]))
        else:
            assert block.startswith("data: "), block
            payload = block[len("data: "):]
            events.append(("data", payload if payload == "[DONE]" else json.loads(payload)))
    return events


async def post_stream(url, body):
    async with aiohttp.ClientSession() as s:
        async with s.post(url, json=body) as r:
            assert r.status == 200
            assert r.headers["Content-Type"] == "text/event-stream"
            assert r.headers["Cache-Control"] == "no-cache"
            return parse_events(await r.text())


async def test_chat_stream_order_role_content_finish_usage_done(server):
    events = await post_stream(server.url + "/v1/chat/completions",
                               {"messages": MSG, "max_tokens": 6, "temperature": 0, "stream": True,
                                "stream_options": {"include_usage": True}})
    data = [v for k, v in events if k == "data"]
    assert data[-1] == "[DONE]"
    chunks = data[:-1]
    assert chunks[0]["choices"] == [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                     "logprobs": None, "finish_reason": None}]
    finish_at = next(i for i, c in enumerate(chunks) if c["choices"] and c["choices"][0]["finish_reason"])
    content = chunks[1:finish_at]
    assert content and all(c["choices"][0]["delta"].keys() == {"content"} for c in content)
    assert chunks[finish_at]["choices"][0]["delta"] == {}
    assert chunks[finish_at]["choices"][0]["finish_reason"] in ("stop", "length")
    usage_chunk = chunks[finish_at + 1]
    assert finish_at + 2 == len(chunks)
    assert usage_chunk["choices"] == []
    assert usage_chunk["usage"]["completion_tokens"] <= 6
    assert usage_chunk["usage"]["total_tokens"] == (usage_chunk["usage"]["prompt_tokens"]
                                                    + usage_chunk["usage"]["completion_tokens"])
    for c in chunks:
        assert c["object"] == "chat.completion.chunk" and c["id"] == chunks[0]["id"]
    assert all(c["usage"] is None for c in chunks[:-1])


async def test_completion_stream_with_n_2_finishes_each_choice_once(server):
    events = await post_stream(server.url + "/v1/completions",
                               {"prompt": "One, two,", "max_tokens": 4, "n": 2, "temperature": 0.8, "seed": 1,
                                "stream": True})
    chunks = [v for k, v in events if k == "data"][:-1]
    finishes = sorted((c["choices"][0]["index"], c["choices"][0]["finish_reason"]) for c in chunks
                      if c["choices"][0]["finish_reason"])
    assert finishes == [(0, "length"), (1, "length")]
    assert all(c["object"] == "text_completion" for c in chunks)


async def test_keepalive_pings_while_waiting_in_the_queue(make_server):
    srv = make_server(max_running=1, sse_keepalive_s=0.05)
    long = {"prompt": "Tell me a long story.", "max_tokens": 2000, "ignore_eos": True, "stream": True}
    async with aiohttp.ClientSession() as s:
        first = await s.post(srv.url + "/v1/completions", json=long)
        await first.content.readline()
        second = await s.post(srv.url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 2, "stream": True})
        # the second request waits behind the first: only pings arrive
        lines = [await asyncio.wait_for(second.content.readline(), 5) for _ in range(6)]
        assert lines == [b": ping\n", b"\n"] * 3
        first.close()   # disconnect: the queue moves and the second finishes normally
        rest = parse_events((b"".join(lines) + await second.content.read()).decode())
        data = [v for k, v in rest if k == "data"]
        assert data[-1] == "[DONE]" and data[-2]["choices"][0]["finish_reason"] == "length"
        second.close()
    srv.wait_idle()


async def test_error_after_the_stream_started_is_an_error_event(make_server):
    srv = make_server()

    def fail_late(states):
        for st in states:
            if len(st.output_ids) >= 3 and st.request.max_tokens == 50:
                raise RuntimeError("engine exploded mid-stream")
    srv.state.engine_loop.before_step = fail_late
    events = await post_stream(srv.url + "/v1/chat/completions",
                               {"messages": MSG, "max_tokens": 50, "ignore_eos": True, "temperature": 0,
                                "stream": True})
    data = [v for k, v in events if k == "data"]
    assert data[-1] == "[DONE]"
    err = data[-2]["error"]
    assert "engine exploded mid-stream" in err["message"] and err["type"] == "internal_server_error"
    assert sum(1 for c in data[:-2] if c["choices"][0]["delta"].get("content")) >= 1   # tokens came first
    srv.wait_idle()
    # the server keeps serving
    events = await post_stream(srv.url + "/v1/chat/completions", {"messages": MSG, "max_tokens": 3,
                                                                  "stream": True})
    assert events[-1] == ("data", "[DONE]")
