"""Automatic prefix caching through the API: shared system prompts and multi-turn chats report cached_tokens."""

import openai

from inferd.engine.child_blocks import common_prefix

SYSTEM = ("You are a meticulous assistant for a shipping company. Always answer in one short sentence, "
          "quote tracking numbers exactly, never invent dates, and when unsure say that you will check. "
          "Customers may ask about parcels, pallets, customs forms, delivery windows, refunds and damaged "
          "goods; be polite, precise and brief. ") * 2


def rendered_ids(srv, messages):
    text = srv.state.chat_template.render(messages, add_generation_prompt=True)
    return srv.state.tokenizer.encode(text, add_special=False)


def test_shared_system_prompt_and_multi_turn_hit_the_cache(make_server):
    srv = make_server()
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)
    model = srv.state.served_model_name
    m1 = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Where is parcel 123?"}]
    m2 = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Can I get a refund?"}]
    ids1, ids2 = rendered_ids(srv, m1), rendered_ids(srv, m2)
    assert len(ids1) > 140

    r1 = client.chat.completions.create(model=model, messages=m1, max_tokens=8, temperature=0)
    assert r1.usage.prompt_tokens == len(ids1)
    assert r1.usage.prompt_tokens_details.cached_tokens == 0

    r2 = client.chat.completions.create(model=model, messages=m2, max_tokens=8, temperature=0)
    expected = common_prefix(ids1, ids2)  # to the token: whole blocks, then within the block where they part
    assert expected > 128 and expected % 64
    assert r2.usage.prompt_tokens_details.cached_tokens == expected

    # the next turn of the first conversation reuses its whole prompt (and the reply as far as it is the same)
    m3 = m1 + [{"role": "assistant", "content": r1.choices[0].message.content},
               {"role": "user", "content": "And parcel 456?"}]
    r3 = client.chat.completions.create(model=model, messages=m3, max_tokens=8, temperature=0)
    assert r3.usage.prompt_tokens_details.cached_tokens >= len(ids1)

    # the counters agree with what the responses reported
    srv.wait_idle()
    hits = srv.metric("inferd:prefix_cache_hits_total")
    assert hits == sum(r.usage.prompt_tokens_details.cached_tokens for r in (r1, r2, r3))
    assert srv.metric("inferd:prefix_cache_queries_total") == sum(r.usage.prompt_tokens for r in (r1, r2, r3))
    assert srv.metric("inferd:kv_cache_cached_blocks") >= len(ids1) // 64
    assert srv.metric("inferd:kv_cache_usage_perc") == 0.0   # cached blocks are reusable, not in use


def test_cached_prefix_gives_the_same_greedy_text(make_server):
    srv = make_server()
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)
    model = srv.state.served_model_name
    m = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Where is parcel 123?"}]
    a = client.chat.completions.create(model=model, messages=m, max_tokens=16, temperature=0)
    b = client.chat.completions.create(model=model, messages=m, max_tokens=16, temperature=0)
    assert b.usage.prompt_tokens_details.cached_tokens > 0
    assert b.choices[0].message.content == a.choices[0].message.content


def test_prefix_caching_can_be_disabled(make_server):
    srv = make_server(enable_prefix_caching=False)
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)
    m = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hi"}]
    for _ in range(2):
        r = client.chat.completions.create(model=srv.state.served_model_name, messages=m, max_tokens=2)
        assert r.usage.prompt_tokens_details.cached_tokens == 0
