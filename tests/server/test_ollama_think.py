"""`think` through the real `ollama` client: a server whose chat template thinks aloud, opening the think block in
the prompt (as DeepSeek-R1's does) unless told not to (Qwen3's enable_thinking switch), so SmolLM2's answer starts
inside the block: message.thinking and generate's thinking, never the content; think false; the levels."""
from __future__ import annotations

import ollama
import pytest

from tests.server.conftest import ServerThread, make_settings, with_template

TEMPLATE = (
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n"
    "{%- if m.role == 'assistant' and m.reasoning_content %}<think>\n{{ m.reasoning_content }}\n</think>\n\n"
    "{%- endif %}{{ m.content }}<|im_end|>\n{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n"
    "{%- if reasoning_effort is defined %}effort {{ reasoning_effort }}\n{% endif %}"
    "{%- if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n"
    "{%- else %}<think>\n{% endif %}{% endif %}"
)
ASK = [{"role": "user", "content": "Name a color."}]
OPTS = {"temperature": 0, "num_predict": 12}


@pytest.fixture(scope="module")
def thinking_server(loaded_model):
    srv = with_template(ServerThread(make_settings(), loaded_model).start(), TEMPLATE)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(thinking_server):
    return ollama.Client(host=thinking_server.url)


@pytest.fixture(scope="module")
def name(thinking_server):
    return thinking_server.state.served_model_name


def test_thinking_comes_apart_from_the_content(client, name):
    for think in (True, None):  # unset: the template's default, which thinks
        m = client.chat(model=name, messages=ASK, think=think, options=OPTS, stream=False).message
        assert m.thinking and "<think>" not in m.thinking and "</think>" not in m.thinking
        assert "<think>" not in m.content and "</think>" not in m.content


def test_streamed_thinking_adds_up_to_the_whole(client, name):
    whole = client.chat(model=name, messages=ASK, think=True, options=OPTS, stream=False).message
    parts = list(client.chat(model=name, messages=ASK, think=True, options=OPTS, stream=True))
    assert "".join(p.message.thinking or "" for p in parts) == whole.thinking
    assert "".join(p.message.content for p in parts) == whole.content


def test_think_false_answers_without_thinking(client, name):
    m = client.chat(model=name, messages=ASK, think=False, options=OPTS, stream=False).message
    assert m.thinking is None and m.content.strip()


@pytest.mark.parametrize("level", ["low", "medium", "high"])
def test_levels_think_and_reach_the_template(client, name, thinking_server, level):
    r = client.generate(model=name, prompt="Name a color.", think=level, options=OPTS)
    assert r.thinking and "<think>" not in r.response
    prompt = thinking_server.state.tokenizer.decode(list(r.context[: r.prompt_eval_count]), skip_special=False)
    assert prompt.endswith(f"effort {level}\n<think>\n")


def test_earlier_thinking_is_rendered_for_the_template(client, name):
    answer = {"role": "assistant", "content": "Blue."}
    history = ASK + [answer, {"role": "user", "content": "Another?"}]
    plain = client.chat(model=name, messages=history, options={"num_predict": 1}, stream=False)
    thought = ASK + [{**answer, "thinking": "the sky is blue"}, history[-1]]
    shown = client.chat(model=name, messages=thought, options={"num_predict": 1}, stream=False)
    assert shown.prompt_eval_count > plain.prompt_eval_count + 5


def test_an_unknown_level_is_refused(client, name):
    with pytest.raises(ollama.ResponseError) as e:
        client.chat(model=name, messages=ASK, think="max", stream=False)
    assert e.value.status_code == 400 and "think" in e.value.error


def test_show_says_the_model_thinks(client, name):
    assert "thinking" in client.show(name).capabilities
