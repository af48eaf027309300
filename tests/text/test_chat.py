"""Chat templates rendered like transformers renders them, inside jinja2's immutable sandbox; stop strings."""
from __future__ import annotations

import datetime

import pytest

from inferd.text.chat import CHATML_TEMPLATE, ChatTemplate, ChatTemplateError, StopChecker, render_chat

SMOLLM2_TEMPLATE = (  # tokenizer.chat_template of SmolLM2-135M-Instruct.Q4_1.gguf
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
LLAMA2_TEMPLATE = (  # Llama 2 chat, abridged from its tokenizer_config.json
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
    "{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}"
    "{% set system_message = false %}{% endif %}{% for message in loop_messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if loop.index0 == 0 and system_message != false %}"
    "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
    "{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}"
    "{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}"
    "{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}")


class _Tok:
    bos_token, eos_token = "<s>", "</s>"


def test_smollm2_template():
    out = render_chat(SMOLLM2_TEMPLATE, [{"role": "user", "content": "Hi"}])
    assert out == ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
                   "<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    out = render_chat(SMOLLM2_TEMPLATE, [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}],
                      add_generation_prompt=False)
    assert out == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n"


def test_chatml_fallback_and_content_parts():
    msgs = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            {"role": "assistant", "content": None}]
    assert render_chat(None, msgs) == "<|im_start|>user\nab<|im_end|>\n<|im_start|>assistant\n<|im_end|>\n" \
                                      "<|im_start|>assistant\n"
    assert ChatTemplate(None).is_fallback and ChatTemplate(None).source == CHATML_TEMPLATE
    with pytest.raises(ChatTemplateError, match="message 0: only text content parts are supported"):
        render_chat(None, [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}])
    with pytest.raises(ChatTemplateError, match="message 1 is not an object with a role"):
        render_chat(None, [{"role": "user", "content": "x"}, "oops"])


def test_bos_eos_and_raise_exception():
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": " Hi "},
            {"role": "assistant", "content": "Hello"}, {"role": "user", "content": "Bye"}]
    assert render_chat(LLAMA2_TEMPLATE, msgs, _Tok()) == \
        "<s>[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\n Hi [/INST] Hello </s><s>[INST] Bye [/INST]"
    with pytest.raises(ChatTemplateError, match="chat template failed: Conversation roles must alternate"):
        render_chat(LLAMA2_TEMPLATE, [{"role": "assistant", "content": "x"}], _Tok())


def test_helpers_and_extensions():
    t = ChatTemplate("{{ messages | tojson }}|{{ {'b': '<é>'} | tojson(indent=1) }}|{{ strftime_now('%Y') }}"
                     "{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}[{{ m.role }}]{% endfor %}"
                     "{% generation %}G{% endgeneration %}")
    out = t.render([{"role": "user", "content": "x"}, {"role": "tool", "content": "y"}])
    year = str(datetime.datetime.now().year)
    assert out == ('[{"role": "user", "content": "x"}, {"role": "tool", "content": "y"}]|{\n "b": "<é>"\n}|'
                   + year + "[user]G")
    assert ChatTemplate("{{ tools | length }} {{ extra }}").render([], tools=[{"a": 1}], extra="E") == "1 E"


def test_template_errors_are_clear():
    with pytest.raises(ChatTemplateError, match=r"chat template does not compile: .*\(template line 1\)"):
        ChatTemplate("{% for m in messages %}")
    with pytest.raises(ChatTemplateError, match="chat template failed: TypeError"):
        ChatTemplate("{{ 1 + messages[0]['content'] }}").render([{"role": "user", "content": "x"}])


@pytest.mark.parametrize("source", [
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{% set x = messages.append({'role': 'x'}) %}",
    "{{ messages[0].update({'content': 'pwned'}) }}",
])
def test_sandbox_refuses_escapes_and_mutation(source):
    msgs = [{"role": "user", "content": "x"}]
    with pytest.raises(ChatTemplateError, match="chat template failed"):
        ChatTemplate(source).render(msgs)
    assert msgs == [{"role": "user", "content": "x"}]


@pytest.mark.parametrize("source", [
    "{{ 'x' * 1000000000 }}",
    "{{ 1000000000 * 'x' }}",
    "{{ [0] * 10**9 }}",
    "{{ 7 ** 100000 }}",
])
def test_sandbox_bounds_what_one_operator_builds(source):
    with pytest.raises(ChatTemplateError, match="chat template failed: .*(repetition|power)"):
        ChatTemplate(source).render([{"role": "user", "content": "x"}])


def test_sandbox_still_allows_ordinary_arithmetic():
    t = ChatTemplate("{{ '=' * 3 }}{{ 2 ** 10 }}{{ [1, 2] * 2 }}{{ 3 * 4 }}{{ 'ab' + 'c' }}")
    assert t.render([]) == "===1024[1, 2, 1, 2]12abc"


def test_a_render_that_runs_away_is_stopped_by_its_time_budget(monkeypatch):
    import signal
    import time

    import inferd.text.chat as chat
    monkeypatch.setattr(chat, "RENDER_BUDGET_S", 0.2)
    handler_before = signal.getsignal(signal.SIGALRM)
    # each loop is within the sandbox's bounds; nested, they would run for hours
    t = ChatTemplate("{% set r = range(100000) %}{% for a in r %}{% for b in r %}{% for c in r %}"
                     "{% endfor %}{% endfor %}{% endfor %}")
    start = time.monotonic()
    with pytest.raises(ChatTemplateError, match="took more than 0.2 s to render"):
        t.render([{"role": "user", "content": "x"}])
    assert time.monotonic() - start < 2.0
    # the timer is gone and the previous SIGALRM handler is back: later renders and alarms are unaffected
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    assert signal.getsignal(signal.SIGALRM) == handler_before
    assert ChatTemplate(None).render([{"role": "user", "content": "hi"}]).startswith("<|im_start|>user\nhi")


def _run(stops, pieces):
    checker = StopChecker(stops)
    out, matched = [], None
    for p in pieces:
        text, m = checker.feed(p)
        out.append(text)
        matched = matched or m
    return out, matched, checker.flush()


def test_stop_checker_holds_back_possible_prefixes():
    out, matched, tail = _run(["</s>"], ["Hello <", "/", "s> more"])
    assert out == ["Hello ", "", ""] and matched == "</s>" and tail == ""
    out, matched, tail = _run(["</s>"], ["a <", "b", " </", "x"])
    assert out == ["a ", "<b", " ", "</x"] and matched is None and tail == ""
    out, matched, tail = _run(["STOP"], ["abc ST"])
    assert out == ["abc "] and matched is None and tail == "ST"  # released at the end: it was real text


def test_stop_checker_earliest_stop_wins_and_swallows_the_rest():
    out, matched, _ = _run(["world", "lo w"], ["Hello world"])
    assert out == ["Hel"] and matched == "lo w"
    out, matched, _ = _run(["ab", "abc"], ["xabc"])
    assert out == ["x"] and matched == "abc"  # same start: the longest stop
    checker = StopChecker(["\n\n"])
    assert checker.feed("line\n") == ("line", None)
    assert checker.feed("\nnext") == ("", "\n\n")
    assert checker.feed("more") == ("", "\n\n") and checker.flush() == ""


def test_stop_checker_unicode_and_no_stops():
    out, matched, _ = _run(["。"], ["日本語", "です。次"])
    assert "".join(out) == "日本語です" and matched == "。"
    out, matched, tail = _run([""], ["plain", " text"])
    assert out == ["plain", " text"] and matched is None and tail == ""


def test_gemma_template_for_files_without_one():
    """What Gemma 3's own template renders (transformers, google/gemma-3-270m-it): system folded into the first user
    turn, the assistant called "model", BOS first."""
    from inferd.text.chat import GEMMA_TEMPLATE, default_template

    assert default_template("gemma3") == GEMMA_TEMPLATE and default_template("llama") is None
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": " Hi "},
            {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Bye"}]
    t = ChatTemplate(GEMMA_TEMPLATE, bos_token="<bos>", eos_token="<eos>")
    assert t.render(msgs) == ("<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello!"
                              "<end_of_turn>\n<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n")
    assert t.render(msgs[1:2], add_generation_prompt=False) == "<bos><start_of_turn>user\nHi<end_of_turn>\n"
    with pytest.raises(ChatTemplateError, match="alternate"):
        t.render([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])


def test_earlier_thinking_reaches_templates_by_either_name():
    from inferd.text.chat import render_chat
    from tests.text.harmony import GPT_OSS

    call = {"id": "c1", "type": "function", "function": {"name": "get_time", "arguments": {"tz": "CET"}}}
    messages = [
        {"role": "user", "content": "Time?"},
        {"role": "assistant", "content": None, "tool_calls": [call], "reasoning_content": "Ask the tool."},
        {"role": "tool", "tool_call_id": "c1", "content": "12:00"},
    ]
    prompt = render_chat(GPT_OSS, messages, reasoning_effort="high")
    assert "Reasoning: high" in prompt
    assert "<|start|>assistant<|channel|>analysis<|message|>Ask the tool.<|end|>" in prompt
    call_text = '<|start|>assistant to=functions.get_time<|channel|>commentary json<|message|>{"tz": "CET"}<|call|>'
    assert call_text in prompt
    assert '<|start|>functions.get_time to=assistant<|channel|>commentary<|message|>"12:00"<|end|>' in prompt
    assert prompt.endswith("<|start|>assistant")
    qwen_like = "{% for m in messages %}[{{ m.reasoning_content }}]{% endfor %}"
    assert render_chat(qwen_like, [{"role": "assistant", "content": "", "thinking": "hm"}]) == "[hm]"
