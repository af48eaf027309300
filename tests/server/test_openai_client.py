"""The real openai SDK (sync and async, streaming and not) against the real model."""

import math

import openai
import pytest

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture
def aclient(server):
    return openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def test_models_list_and_retrieve(client, model_name, server):
    models = client.models.list()
    assert [m.id for m in models.data] == [model_name]
    m = client.models.retrieve(model_name)
    assert (m.id, m.object, m.owned_by) == (model_name, "model", "inferd")
    assert m.created == server.state.created
    with pytest.raises(openai.NotFoundError) as e:
        client.models.retrieve("gpt-4")
    assert e.value.body["code"] == "model_not_found"


def test_chat_non_streaming(client, model_name):
    r = client.chat.completions.create(model=model_name, messages=QUESTION, max_tokens=12, temperature=0)
    assert r.id.startswith("chatcmpl-")
    assert r.object == "chat.completion"
    assert r.model == model_name
    assert r.system_fingerprint == "inferd"
    (choice,) = r.choices
    assert choice.message.role == "assistant"
    assert choice.message.content.strip()
    assert choice.finish_reason in ("stop", "length")
    assert r.usage.prompt_tokens > 10
    assert 1 <= r.usage.completion_tokens <= 12
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert r.usage.prompt_tokens_details.cached_tokens == 0


def test_chat_streaming_equals_non_streaming(client, model_name):
    kw = dict(model=model_name, messages=QUESTION, max_tokens=12, temperature=0)
    full = client.chat.completions.create(**kw).choices[0]
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [full.finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens >= 1
    assert all(c.id == chunks[0].id and c.object == "chat.completion.chunk" for c in chunks)


def test_completion_non_streaming_and_streaming(client, model_name):
    r = client.completions.create(model=model_name, prompt="The capital of France is", max_tokens=8,
                                  temperature=0)
    assert r.id.startswith("cmpl-") and r.object == "text_completion"
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 8
    stream = client.completions.create(model=model_name, prompt="The capital of France is", max_tokens=8,
                                       temperature=0, stream=True)
    assert "".join(c.choices[0].text for c in stream) == r.choices[0].text


def test_completion_default_max_tokens_is_16(client, model_name):
    r = client.completions.create(model=model_name, prompt="Count: 1, 2, 3,", temperature=0,
                                  extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 16


def test_zero_max_tokens_echo_returns_the_prompt(client, model_name):
    r = client.completions.create(model=model_name, prompt="Just the prompt", max_tokens=0, echo=True)
    assert ((r.choices[0].text, r.choices[0].finish_reason, r.usage.completion_tokens)
            == ("Just the prompt", "length", 0))
    stream = client.completions.create(model=model_name, prompt="Just the prompt", max_tokens=0, echo=True,
                                       stream=True)
    assert "".join(c.choices[0].text for c in stream) == "Just the prompt"
    # with logprobs it scores the prompt without generating
    r = client.completions.create(model=model_name, prompt="Just the prompt", max_tokens=0, echo=True, logprobs=0)
    lp = r.choices[0].logprobs
    assert lp.token_logprobs[0] is None and len(lp.token_logprobs) == r.usage.prompt_tokens
    assert all(x < 0 for x in lp.token_logprobs[1:])


def test_n_choices_and_list_prompts(client, model_name, server):
    r = client.completions.create(model=model_name, prompt=["Hello", "The sky is"], n=2, max_tokens=4,
                                  temperature=0.9, seed=3, extra_body={"ignore_eos": True})
    assert sorted(c.index for c in r.choices) == [0, 1, 2, 3]
    tok = server.state.tokenizer
    # prompt tokens count once per prompt, completion tokens once per choice
    assert r.usage.prompt_tokens == len(tok.encode("Hello")) + len(tok.encode("The sky is"))
    assert r.usage.completion_tokens == 16
    # token-id prompts work too and count exactly
    r = client.completions.create(model=model_name, prompt=[[1, 2, 3], [4, 5]], max_tokens=2, temperature=0)
    assert r.usage.prompt_tokens == 5 and len(r.choices) == 2


def test_chat_logprobs(client, model_name):
    r = client.chat.completions.create(model=model_name, messages=QUESTION, max_tokens=5, temperature=0,
                                       logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert 1 <= len(content) <= 5
    for tok in content:
        assert tok.logprob <= 0
        assert len(tok.top_logprobs) == 3
        # greedy: the chosen token is the most likely one
        assert tok.top_logprobs[0].token == tok.token
        assert math.isclose(tok.top_logprobs[0].logprob, tok.logprob, abs_tol=1e-4)
        assert bytes(tok.bytes).decode("utf-8", "replace") == tok.token
    assert "".join(t.token for t in content).startswith(r.choices[0].message.content[:3])


def test_completion_echo_with_logprobs(client, model_name):
    r = client.completions.create(model=model_name, prompt="The capital of France is", max_tokens=3,
                                  temperature=0, echo=True, logprobs=2)
    c = r.choices[0]
    assert c.text.startswith("The capital of France is")
    lp = c.logprobs
    n_prompt = r.usage.prompt_tokens
    assert len(lp.tokens) == n_prompt + 3
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert all(x is not None and x <= 0 for x in lp.token_logprobs[1:])
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)
    assert "".join(lp.tokens) == c.text


def test_stop_string_is_not_returned(client, model_name):
    kw = dict(model=model_name, prompt="1, 2, 3, 4, 5,", max_tokens=20, temperature=0)
    plain = client.completions.create(**kw).choices[0].text
    assert " 7" in plain
    r = client.completions.create(stop=[" 7"], **kw)
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].text == plain[:plain.index(" 7")]
    streamed = "".join(c.choices[0].text for c in client.completions.create(stop=[" 7"], stream=True, **kw))
    assert streamed == r.choices[0].text


async def test_async_client_chat_and_completion(aclient, model_name):
    r = await aclient.chat.completions.create(model=model_name, messages=QUESTION, max_tokens=6, temperature=0)
    assert r.choices[0].message.content
    stream = await aclient.completions.create(model=model_name, prompt="Once upon a time", max_tokens=6,
                                              temperature=0, stream=True)
    texts = [c.choices[0].text async for c in stream]
    assert len(texts) >= 1 and "".join(texts)
    stream = await aclient.chat.completions.create(model=model_name, messages=QUESTION, max_tokens=6,
                                                   temperature=0, stream=True)
    deltas = [c.choices[0].delta.content or "" async for c in stream if c.choices]
    assert "".join(deltas) == r.choices[0].message.content
