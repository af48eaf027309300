"""Speculative decoding through the server with the real SmolLM2: the same text with and without it (greedy,
seeded, a stop string), drafts made and accepted on repetitive text (the spec_decode counters), blocks freed;
enabled by the `speculative` setting or per request (the `speculative` extension field)."""

import openai

REPETITIVE = "The quick brown fox jumps over the lazy dog. " * 6


def test_same_text_with_and_without_speculation(make_server):
    srv = make_server(speculative=True)
    model = srv.state.served_model_name
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)
    cases = [dict(prompt=REPETITIVE, max_tokens=48, temperature=0),
             dict(prompt=REPETITIVE, max_tokens=48, temperature=0.9, top_p=0.95, seed=1234),
             dict(prompt=REPETITIVE, max_tokens=48, temperature=0, stop=["lazy dog. The quick brown fox jumps"])]
    for case in cases:
        plain = client.completions.create(model=model, **case, extra_body={"speculative": False, "ignore_eos": True})
        drafted_before = srv.metric("inferd:spec_decode_num_draft_tokens_total")
        spec = client.completions.create(model=model, **case, extra_body={"ignore_eos": True})   # the setting: on
        assert spec.choices[0].text == plain.choices[0].text, case
        assert spec.choices[0].finish_reason == plain.choices[0].finish_reason
        assert spec.usage.completion_tokens == plain.usage.completion_tokens
        if case["temperature"] == 0:
            assert srv.metric("inferd:spec_decode_num_draft_tokens_total") > drafted_before
    # greedy decoding of repetitive text: most drafts are right
    drafted = srv.metric("inferd:spec_decode_num_draft_tokens_total")
    accepted = srv.metric("inferd:spec_decode_num_accepted_tokens_total")
    assert 0 < accepted <= drafted
    srv.wait_idle()   # every KV block released


def test_chat_request_turns_speculation_on(server, model_name):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    messages = [{"role": "user", "content": "Repeat this line four times: " + REPETITIVE[:45]}]
    before = server.metric("inferd:spec_decode_num_draft_tokens_total")
    plain = client.chat.completions.create(model=model_name, messages=messages, max_tokens=60, temperature=0)
    assert server.metric("inferd:spec_decode_num_draft_tokens_total") == before   # off by default
    spec = client.chat.completions.create(model=model_name, messages=messages, max_tokens=60, temperature=0,
                                          extra_body={"speculative": True})
    assert spec.choices[0].message.content == plain.choices[0].message.content
    assert server.metric("inferd:spec_decode_num_draft_tokens_total") > before
    server.wait_idle()
