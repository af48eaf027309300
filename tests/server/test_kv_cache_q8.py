"""A server with kv_cache_dtype = q8_0 on the real SmolLM2: the pool from kv_cache_mib is 32/17 the f16 one
(/metrics inferd:kv_cache_blocks), and it generates text end to end through the openai client: a sensible greedy
answer, streamed and not, and a shared system prompt served from the q8_0 prefix cache with the same text."""
from __future__ import annotations

import openai

from tests.server.test_prefix_cache import SYSTEM


def test_q8_0_server_holds_more_blocks_and_answers(make_server):
    f16 = make_server(num_kv_blocks=0, kv_cache_mib=64)
    q8 = make_server(num_kv_blocks=0, kv_cache_mib=64, kv_cache_dtype="q8_0")
    blocks_f16, blocks_q8 = f16.metric("inferd:kv_cache_blocks"), q8.metric("inferd:kv_cache_blocks")
    assert blocks_f16 == (64 << 20) // (30 * 3 * 64 * 2 * 2 * 64)            # SmolLM2: 30 layers, 3 KV heads of 64
    assert blocks_q8 == (64 << 20) // (30 * 3 * 64 * 2 * 34 // 32 * 64)
    assert 1.87 < blocks_q8 / blocks_f16 < 1.89

    client = openai.OpenAI(base_url=q8.url + "/v1", api_key="unused", max_retries=0)
    model = q8.state.served_model_name
    msgs = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
    r = client.chat.completions.create(model=model, messages=msgs, max_tokens=8, temperature=0)
    assert "Paris" in r.choices[0].message.content
    stream = client.chat.completions.create(model=model, messages=msgs, max_tokens=8, temperature=0, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == r.choices[0].message.content

    m = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Where is parcel 123?"}]
    a = client.chat.completions.create(model=model, messages=m, max_tokens=16, temperature=0)
    b = client.chat.completions.create(model=model, messages=m, max_tokens=16, temperature=0)
    assert b.usage.prompt_tokens_details.cached_tokens >= 128
    assert b.choices[0].message.content == a.choices[0].message.content and a.choices[0].message.content
