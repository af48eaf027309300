"""Thinking apart from the answer, through the real openai SDK: a server whose chat template thinks aloud
(Qwen3's switch), SmolLM2 held to a `<think>...</think>answer` shape by a regex so the output's structure is
known; message.reasoning_content / .reasoning, the same streamed, and the template's switches."""
from __future__ import annotations

import re

import openai
import pytest

from inferd.text.chat import ChatTemplate

THINKING_TEMPLATE = (
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n"
    "{%- if m.role == 'assistant' and m.reasoning_content %}<think>\n{{ m.reasoning_content }}\n</think>\n\n"
    "{%- endif %}{{ m.content }}<|im_end|>\n{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n"
    "{%- if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
)
SHAPE = r"<think>\n[a-z]{3,8}( [a-z]{3,8}){1,3}\n</think>\n\n[A-Z][a-z]{2,8}( [a-z]{2,8}){0,2}\."
MSG = [{"role": "user", "content": "Name a color."}]


@pytest.fixture(scope="module")
def thinking_server(loaded_model):
    from tests.server.conftest import ServerThread, make_settings
    srv = ServerThread(make_settings(), loaded_model).start()
    tok = srv.state.tokenizer
    srv.state.chat_template = ChatTemplate(THINKING_TEMPLATE, tok.bos_token, tok.eos_token)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(thinking_server):
    return openai.OpenAI(base_url=thinking_server.url + "/v1", api_key="unused", max_retries=0)


def field(message, name):
    """An extension field of the SDK's message (absent when the server left it out)."""
    return (message.model_extra or {}).get(name)


def ask(client, model_name, **kw):
    kw.setdefault("extra_body", {"guided_regex": SHAPE})
    return client.chat.completions.create(model=model_name, messages=kw.pop("messages", MSG), max_tokens=60,
                                          temperature=0, **kw)


def test_the_thinking_comes_apart_from_the_answer(client, thinking_server):
    name = thinking_server.state.served_model_name
    m = ask(client, name).choices[0].message
    assert re.fullmatch(r"[a-z]{3,8}( [a-z]{3,8}){1,3}", field(m, "reasoning_content")), m
    assert field(m, "reasoning") == field(m, "reasoning_content")
    assert re.fullmatch(r"[A-Z][a-z]{2,8}( [a-z]{2,8}){0,2}\.", m.content), m
    assert "<think>" not in m.content and "</think>" not in m.content


def test_streamed_thinking_and_answer_equal_the_whole(client, thinking_server):
    name = thinking_server.state.served_model_name
    whole = ask(client, name).choices[0].message
    thinking, answer = [], []
    stream = client.chat.completions.create(model=name, messages=MSG, max_tokens=60, temperature=0, stream=True,
                                            extra_body={"guided_regex": SHAPE})
    for chunk in stream:
        delta = chunk.choices[0].delta
        extra = delta.model_extra or {}
        assert extra.get("reasoning") == extra.get("reasoning_content")
        thinking.append(extra.get("reasoning_content") or "")
        answer.append(delta.content or "")
    assert ("".join(thinking), "".join(answer)) == (field(whole, "reasoning_content"), whole.content)


def test_thinking_switched_off_gives_only_an_answer(client, thinking_server):
    name = thinking_server.state.served_model_name
    plain = {"guided_regex": r"[A-Z][a-z]{2,8}\."}
    for switch in ({"chat_template_kwargs": {"enable_thinking": False}}, {"reasoning_effort": "none"}):
        m = ask(client, name, extra_body={**plain, **switch}).choices[0].message
        assert re.fullmatch(r"[A-Z][a-z]{2,8}\.", m.content) and field(m, "reasoning_content") is None
    # the prompt the template wrote closes the block itself
    tok = thinking_server.state.tokenizer
    text = thinking_server.state.chat_template.render(MSG, enable_thinking=False)
    assert text.endswith("<think>\n\n</think>\n\n") and tok.encode(text, add_special=False)


def test_earlier_turns_reasoning_goes_back_to_the_template(thinking_server):
    from inferd.server.apis.chat.request import Message, check_messages
    from inferd.server.protocol import Limits
    msgs = [Message("user", "Hi"), Message("assistant", "Hello.", reasoning="greet back"), Message("user", "Bye")]
    checked = check_messages(msgs, Limits(vocab_size=100))
    assert checked[1]["reasoning_content"] == "greet back"
    text = thinking_server.state.chat_template.render(checked)
    assert "<|im_start|>assistant<think>\ngreet back\n</think>Hello.<|im_end|>" in text


@pytest.mark.parametrize("extra, param", [({"chat_template_kwargs": {"messages": []}}, "chat_template_kwargs"),
                                          ({"reasoning_effort": "extreme"}, "reasoning_effort")])
def test_bad_switches_are_400s_naming_the_field(client, thinking_server, extra, param):
    with pytest.raises(openai.BadRequestError) as e:
        ask(client, thinking_server.state.served_model_name, extra_body=extra)
    assert e.value.body["param"] == param


OPENS_THE_BLOCK = ("{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                   "{%- if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}")


def test_responses_api_gives_the_thinking_as_a_reasoning_item(make_server):
    srv = make_server()
    tok = srv.state.tokenizer
    srv.state.chat_template = ChatTemplate(OPENS_THE_BLOCK, tok.bos_token, tok.eos_token)
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)
    name = srv.state.served_model_name
    # the prompt opened the block and the answer is cut short: all of the output is thinking
    r = client.responses.create(model=name, input="Name a color.", max_output_tokens=12, temperature=0)
    kinds = [item.type for item in r.output]
    assert kinds == ["reasoning"], kinds
    thinking = r.output[0].content[0].text
    assert thinking and "<think>" not in thinking and not r.output_text
    # streamed: the same text through reasoning_text deltas, the item added and done
    events = list(client.responses.create(model=name, input="Name a color.", max_output_tokens=12, temperature=0,
                                          stream=True))
    deltas = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    assert deltas == thinking
    done = [e for e in events if e.type == "response.output_item.done"]
    assert [e.item.type for e in done] == ["reasoning"] and done[0].item.content[0].text == thinking


@pytest.fixture(scope="module")
def opened_block_server(loaded_model):
    from tests.server.conftest import ServerThread, make_settings
    srv = ServerThread(make_settings(max_thinking_tokens=10), loaded_model).start()
    tok = srv.state.tokenizer
    srv.state.chat_template = ChatTemplate(OPENS_THE_BLOCK, tok.bos_token, tok.eos_token)
    yield srv
    srv.stop()


def think(srv, **kw):
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)
    return client.chat.completions.create(model=srv.state.served_model_name, messages=MSG, max_tokens=30,
                                          temperature=0, logprobs=True, **kw)


FORCED = "\n</think>\n\n"


def written(r):
    return [t.token for t in r.choices[0].logprobs.content]


@pytest.mark.parametrize("budget", [4, 7])
def test_past_max_thinking_tokens_the_thinking_is_closed_and_the_model_answers(opened_block_server, budget):
    r = think(opened_block_server, extra_body={"max_thinking_tokens": budget})
    tokens = written(r)
    thought = "".join(tokens[:budget])
    assert "".join(tokens[budget:]).startswith(FORCED)  # the budget's tokens, then the forced closing
    m = r.choices[0].message
    assert field(m, "reasoning_content") == thought.strip()
    assert abs(r.usage.completion_tokens_details.reasoning_tokens - budget) <= 2


def test_the_servers_budget_applies_when_the_request_sets_none_and_0_lifts_it(opened_block_server):
    default = written(think(opened_block_server))
    assert "".join(default[10:]).startswith(FORCED)  # max_thinking_tokens = 10 in the settings
    free = written(think(opened_block_server, extra_body={"max_thinking_tokens": 0}))
    assert free[:10] == default[:10] and not "".join(free[10:]).startswith(FORCED)


def test_the_servers_chat_template_kwargs_apply_unless_the_request_sets_them(make_server):
    srv = make_server(chat_template_kwargs='{"enable_thinking": false}')
    tok = srv.state.tokenizer
    srv.state.chat_template = ChatTemplate(THINKING_TEMPLATE, tok.bos_token, tok.eos_token)
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)
    name = srv.state.served_model_name
    plain = ask(client, name, extra_body={"guided_regex": r"[A-Z][a-z]{2,8}\."}).choices[0].message
    assert re.fullmatch(r"[A-Z][a-z]{2,8}\.", plain.content) and field(plain, "reasoning_content") is None
    thinks = ask(client, name, extra_body={"guided_regex": SHAPE, "chat_template_kwargs": {"enable_thinking": True}})
    assert field(thinks.choices[0].message, "reasoning_content")


@pytest.mark.parametrize("value", ["{", "[1]"])
def test_bad_chat_template_kwargs_in_the_settings_are_named(value):
    from tests.server.conftest import make_settings
    with pytest.raises(ValueError, match="chat_template_kwargs"):
        make_settings(chat_template_kwargs=value)
