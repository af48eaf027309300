"""Many streams at once: every one completes, well formed, with the text it would have had alone."""

import asyncio

import openai
import pytest

PROMPTS = [f"Write one sentence about the number {i}." for i in range(8)]


@pytest.fixture
def aclient(server):
    return openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


async def stream_text(aclient, model, prompt, **kw):
    stream = await aclient.chat.completions.create(model=model, messages=[{"role": "user", "content": prompt}],
                                                   stream=True, stream_options={"include_usage": True}, **kw)
    text, finish, usage, roles = "", None, None, 0
    async for c in stream:
        if c.usage is not None:
            usage = c.usage
        for ch in c.choices:
            roles += ch.delta.role == "assistant"
            text += ch.delta.content or ""
            finish = ch.finish_reason or finish
    return text, finish, usage, roles


async def test_concurrent_greedy_streams_match_their_solo_runs(aclient, server, model_name):
    kw = dict(max_tokens=24, temperature=0)
    solo = [await stream_text(aclient, model_name, p, **kw) for p in PROMPTS]
    batch_sizes = []
    server.state.engine_loop.before_step = lambda states: batch_sizes.append(len(states))
    try:
        together = await asyncio.gather(*(stream_text(aclient, model_name, p, **kw) for p in PROMPTS))
    finally:
        server.state.engine_loop.before_step = None
    assert max(batch_sizes) == 8      # they really ran side by side
    for (t1, f1, u1, r1), (t2, f2, u2, r2) in zip(solo, together):
        assert t2 == t1 and t1
        assert f2 == f1 and f1 in ("stop", "length")
        assert r1 == r2 == 1
        assert u2.completion_tokens == u1.completion_tokens
    server.wait_idle()
