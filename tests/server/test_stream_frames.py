"""The short per-token path of a stream: pre-encoded text frames equal the encoded chunk byte for byte, outputs of
one choice that arrived together are merged (text, tokens and logprobs in order, each once), and a stream whose
outputs piled up while the event loop was busy still carries every token's text exactly once, cut at its stop
string, with the right usage."""

import threading

import aiohttp
import pytest

from inferd.engine.request import FinishReason, RequestOutput, Usage
from inferd.server.apis.chat import encode as chat
from inferd.server.apis.completions import encode as completions
from inferd.server.choices import merge_outputs
from inferd.server.sse import TextFrames, sse_event

from .test_sse import parse_events

TEXTS = ["", "a", " hello", 'quote " and \\ backslash', "new\nline\ttab", "\x00\x01\x1f control", "é ü 中文 🙂",
         "</script>", "\u2028\u2029", TextFrames.MARK[1:]]


@pytest.mark.parametrize("text", TEXTS)
def test_chat_text_frame_is_the_encoded_chunk(text):
    def chunk(content):
        return chat.ChatCompletionChunk("chatcmpl-1", 1700000000, "smol \"model\"",
                                     [chat.ChatChunkChoice(3, chat.Delta(content=content), None, None)], "fp_1")
    assert TextFrames(chunk(TextFrames.MARK))(text) == sse_event(chunk(text))


@pytest.mark.parametrize("text", TEXTS)
def test_completion_text_frame_is_the_encoded_chunk(text):
    def chunk(t):
        return completions.CompletionResponse("cmpl-1", 1, "m", [completions.CompletionChoice(0, t, None, None)], "fp")
    assert TextFrames(chunk(TextFrames.MARK))(text) == sse_event(chunk(text))


def test_a_template_without_the_marker_is_refused():
    with pytest.raises(ValueError, match="marker"):
        TextFrames(completions.CompletionResponse("cmpl-1", 1, "m", [completions.CompletionChoice(0, "x", None, None)],
                                                  "fp"))


def test_merge_keeps_every_token_once_in_order():
    outs = [RequestOutput("r", [1], "a", [-0.1], [[(1, -0.1)]], usage=Usage(5, 1, 0)),
            RequestOutput("r", [2, 3], "bc", [-0.2, -0.3], None, usage=Usage(5, 3, 0)),
            RequestOutput("r", [4], "d", [-0.4], [[(4, -0.4), (9, -2.0)]], finish_reason=FinishReason.LENGTH,
                          usage=Usage(5, 4, 0))]
    m = merge_outputs(outs)
    assert (m.token_ids, m.text, m.logprobs) == ([1, 2, 3, 4], "abcd", [-0.1, -0.2, -0.3, -0.4])
    assert m.top_logprobs == [[(1, -0.1)], [], [], [(4, -0.4), (9, -2.0)]]
    assert m.finish_reason == FinishReason.LENGTH and m.usage == Usage(5, 4, 0)
    assert merge_outputs(outs[1:2]) is outs[1]


def test_merge_without_logprobs_or_with_an_error_last():
    outs = [RequestOutput("r", [1], "a"), RequestOutput("r", finish_reason=FinishReason.ERROR, error_status=500,
                                                        error_message="boom")]
    m = merge_outputs(outs)
    assert (m.token_ids, m.text, m.logprobs, m.top_logprobs, m.prompt_logprobs) == ([1], "a", None, None, None)
    assert (m.finish_reason, m.error_status, m.error_message) == (FinishReason.ERROR, 500, "boom")


def hold_the_loop_while(srv, tokens: int):
    """A function that blocks the server's event loop until the running request has generated `tokens` more
    tokens or has finished, so its outputs pile up in its mailbox and arrive together; and the event set when
    the tokens were reached."""
    loop_blocked = threading.Event()
    release = threading.Event()
    seen: dict = {}

    def before_step(states):
        if not loop_blocked.is_set():
            return
        for st in states:
            seen.setdefault(st, len(st.output_ids))
            if len(st.output_ids) - seen[st] >= tokens:
                release.set()

    def block():
        loop_blocked.set()
        engine_loop = srv.state.engine_loop
        for _ in range(2000):
            if release.wait(0.005) or not (engine_loop.num_running or engine_loop.num_waiting):
                return

    srv.state.engine_loop.before_step = before_step
    return block, release


async def stream_with_a_busy_loop(srv, path, body, hold_after_chunks=3, tokens=6, must_reach=True):
    """POST a stream; after its first few events block the server's loop while `tokens` more are generated."""
    block, release = hold_the_loop_while(srv, tokens)
    raw = b""
    async with aiohttp.ClientSession() as s:
        async with s.post(srv.url + path, json=body) as r:
            assert r.status == 200
            events = 0
            while line := await r.content.readline():
                raw += line
                if line == b"\n":
                    events += 1
                    if events == hold_after_chunks:
                        srv.loop.call_soon_threadsafe(block)
    assert release.is_set() or not must_reach, "the scheduler never produced the tokens the test waited for"
    return [v for k, v in parse_events(raw.decode()) if k == "data"]


async def test_outputs_that_arrived_together_are_one_chunk_with_every_token(make_server):
    srv = make_server()
    msgs = [{"role": "user", "content": "Count from one to fifty."}]
    body = {"messages": msgs, "max_tokens": 30, "temperature": 0, "ignore_eos": True, "logprobs": True}
    async with aiohttp.ClientSession() as s:
        async with s.post(srv.url + "/v1/chat/completions", json=body) as r:
            full = await r.json()
    data = await stream_with_a_busy_loop(srv, "/v1/chat/completions",
                                         {**body, "stream": True, "stream_options": {"include_usage": True}})
    assert data[-1] == "[DONE]"
    chunks = data[:-1]
    per_chunk = [len(c["choices"][0]["logprobs"]["content"]) for c in chunks
                 if c["choices"] and c["choices"][0].get("logprobs")]
    assert max(per_chunk) >= 6        # the tokens generated while the loop was held came as one chunk
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == full["choices"][0]["message"]["content"]
    lps = [e for c in chunks if c["choices"] and c["choices"][0].get("logprobs")
           for e in c["choices"][0]["logprobs"]["content"]]
    assert [e["token"] for e in lps] == [e["token"] for e in full["choices"][0]["logprobs"]["content"]]
    assert chunks[-1]["usage"]["completion_tokens"] == 30 == sum(per_chunk)
    finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    assert finishes.count("length") == 1 and finishes[-1] == "length"
    srv.wait_idle()


async def test_a_stop_string_still_cuts_a_coalesced_stream(make_server):
    srv = make_server()
    body = {"prompt": "1, 2, 3, 4, 5, 6, 7, 8,", "max_tokens": 40, "temperature": 0, "ignore_eos": True}
    async with aiohttp.ClientSession() as s:
        async with s.post(srv.url + "/v1/completions", json={**body, "logprobs": 0}) as r:
            choice = (await r.json())["choices"][0]
    unstopped, tokens = choice["text"], choice["logprobs"]["tokens"]
    stop = "".join(tokens[7:10])                   # spans tokens that arrive while the loop is held
    assert stop.strip(), tokens
    cut = unstopped[:unstopped.index(stop)]
    data = await stream_with_a_busy_loop(srv, "/v1/completions",
                                         {**body, "stop": [stop], "stream": True,
                                          "stream_options": {"include_usage": True}}, hold_after_chunks=2,
                                         must_reach=False)
    chunks = data[:-1]
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == cut
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "stop"
    assert chunks[-1]["usage"]["completion_tokens"] < 40
    srv.wait_idle()


async def test_the_end_of_a_stream_is_one_write(server):
    """The last text, the finish chunk, usage and [DONE] leave together: the client reads them in one piece."""
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}
    async with aiohttp.ClientSession() as s:
        async with s.post(server.url + "/v1/chat/completions", json=body) as r:
            pieces = [p async for p in r.content.iter_any()]
    last = pieces[-1].decode()
    assert '"finish_reason":"length"' in last and '"usage":' in last and last.endswith("data: [DONE]\n\n")
    events = parse_events(b"".join(pieces).decode())
    assert events[-2][1]["usage"]["completion_tokens"] == 5
