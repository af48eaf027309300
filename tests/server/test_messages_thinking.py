"""Thinking through the Messages API with the real `anthropic` SDK: a server whose chat template opens a think
block unless `enable_thinking` is false (Qwen3's switch), on SmolLM2. `thinking` maps to the switch, the thinking
comes out as `thinking` blocks (whole and streamed as thinking_delta) and counts in
usage.output_tokens_details, budget_tokens closes it (then the answer follows in a text block), and earlier
turns' thinking blocks go back to the template as reasoning_content."""
from __future__ import annotations

import anthropic
import pytest

from .conftest import ServerThread, make_settings

SWITCHED = (
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n"
    "{%- if m.role == 'assistant' and m.reasoning_content %}<think>\n{{ m.reasoning_content }}\n</think>\n\n"
    "{%- endif %}{{ m.content }}<|im_end|>\n{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n"
    "{%- if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n"
    "{%- else %}<think>\n{% endif %}{% endif %}"
)
ASK = [{"role": "user", "content": "Name a color."}]
ON = {"type": "enabled"}  # no budget_tokens: thinking without a budget (Anthropic requires one)


@pytest.fixture(scope="module")
def thinking_server(loaded_model):
    srv = ServerThread(make_settings(), loaded_model).start().use_template(SWITCHED)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(thinking_server):
    return anthropic.Anthropic(base_url=thinking_server.url, api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def name(thinking_server):
    return thinking_server.state.served_model_name


def test_thinking_comes_as_a_thinking_block(client, name):
    # the prompt opened the block and the answer is cut short: all of it is thinking
    for thinking in (ON, None):  # absent: the template's default, which thinks
        kw = {"thinking": thinking} if thinking else {}
        r = client.messages.create(model=name, max_tokens=12, messages=ASK, extra_body={"temperature": 0}, **kw)
        assert [b.type for b in r.content] == ["thinking"] and r.stop_reason == "max_tokens"
        block = r.content[0]
        assert block.thinking.strip() and "<think>" not in block.thinking and block.signature == ""
        # counted on the thinking's text, as chat completions count reasoning tokens
        assert 0 < r.usage.output_tokens_details.thinking_tokens <= r.usage.output_tokens == 12


def test_budget_tokens_closes_the_thinking_and_the_answer_follows(client, thinking_server, name):
    kw = {"model": name, "max_tokens": 40, "messages": ASK, "thinking": {"type": "enabled", "budget_tokens": 5},
          "extra_body": {"temperature": 0}}
    r = client.messages.create(**kw)
    assert [b.type for b in r.content][:2] == ["thinking", "text"], r.content
    tok = thinking_server.state.tokenizer
    assert 0 < len(tok.encode(r.content[0].thinking, add_special=False)) <= 6 and r.content[1].text.strip()
    assert "think>" not in r.content[1].text
    events = list(client.messages.create(**kw, stream=True))
    starts = [(e.index, e.content_block.type) for e in events if e.type == "content_block_start"]
    stops = [e.index for e in events if e.type == "content_block_stop"]
    assert starts[:2] == [(0, "thinking"), (1, "text")] and stops == [i for i, _ in starts]
    text = "".join(e.delta.text for e in events if e.type == "content_block_delta" and e.delta.type == "text_delta")
    assert text == "".join(b.text for b in r.content if b.type == "text")


def test_streamed_thinking_equals_the_whole(client, thinking_server, name):
    kw = {"model": name, "max_tokens": 12, "messages": ASK, "extra_body": {"temperature": 0}}
    whole = client.messages.create(**kw)
    events = list(client.messages.create(**kw, stream=True))
    start = next(e for e in events if e.type == "content_block_start")
    assert start.index == 0 and start.content_block.type == "thinking" and start.content_block.thinking == ""
    deltas = [e for e in events if e.type == "content_block_delta"]
    assert {(e.index, e.delta.type) for e in deltas} == {(0, "thinking_delta")}
    assert "".join(e.delta.thinking for e in deltas) == whole.content[0].thinking
    with client.messages.stream(**kw) as stream:
        final = stream.get_final_message()
    assert [(b.type, b.thinking) for b in final.content] == [("thinking", whole.content[0].thinking)]


def test_thinking_disabled_gives_only_text(client, name):
    r = client.messages.create(model=name, max_tokens=12, messages=ASK, thinking={"type": "disabled"},
                               extra_body={"temperature": 0})
    assert [b.type for b in r.content] == ["text"] and "think>" not in r.content[0].text


def test_earlier_thinking_blocks_reach_the_template(client, name, thinking_server):
    from inferd.server.apis.messages.conversation import conversation
    from inferd.server.apis.messages.request import MessageParam, TextBlock, ThinkingBlock
    turns = [MessageParam("user", "Hi"),
             MessageParam("assistant", [ThinkingBlock("greet back", "sig"), TextBlock("Hello.")]),
             MessageParam("user", "Bye")]
    conv = conversation(None, turns)
    assert conv.messages[1] == {"role": "assistant", "content": "Hello.", "reasoning_content": "greet back"}
    text = thinking_server.state.chat_template.render(conv.messages)
    assert "<|im_start|>assistant<think>\ngreet back\n</think>Hello.<|im_end|>" in text
    # through the API: the thinking is part of the prompt
    history = [{"role": "user", "content": "Hi"},
               {"role": "assistant", "content": [{"type": "thinking", "thinking": "greet back warmly", "signature": ""},
                                                 {"type": "text", "text": "Hello."}]},
               {"role": "user", "content": "Bye"}]
    plain = [history[0], {"role": "assistant", "content": "Hello."}, history[2]]
    with_it = client.messages.count_tokens(model=name, messages=history).input_tokens
    assert with_it > client.messages.count_tokens(model=name, messages=plain).input_tokens + 3
