"""gpt-oss's harmony end to end through the real openai SDK: a tiny random model with harmony's control tokens and
a gpt-oss-shaped chat template behind the real server. The model is random, so its output's shape is made by a
grammar (the call grammar of tool_choice "required", or a guided_grammar over the control tokens); what is checked
is the plumbing: the markers reach the parser and never the client, analysis comes out as reasoning, final as the
answer, a commentary message to=functions.x as tool_calls, streamed and whole alike, with the thinking counted."""
from __future__ import annotations

import json
import re

import openai
import pytest

from inferd.model.loader import load_model
from inferd.text.tools.harmony import SHOWN_TOKENS
from tests.server.conftest import ServerThread, make_settings
from tests.text.harmony import write_tiny_harmony

M = "tiny-harmony"
ASK = [{"role": "user", "content": "Name a color."}]
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"tz": {"type": "string", "pattern": "^[A-Z]{3}$"}}, "required": ["tz"],
    "additionalProperties": False}}}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    path = write_tiny_harmony(tmp_path_factory.mktemp("harmony-api") / f"{M}.gguf")
    srv = ServerThread(make_settings(max_thinking_tokens=12), load_model(str(path))).start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def shape(server):
    """Thinking, then the answer, as gpt-oss writes them, over the vocabulary's control tokens."""
    t = {m: f"<[{server.state.tokenizer.hf.token_to_id(m)}]>" for m in SHOWN_TOKENS}
    return {"guided_grammar": (
        f'start: {t["<|channel|>"]} "analysis" {t["<|message|>"]} /[a-z]{{3,8}}( [a-z]{{3,8}}){{1,3}}/ {t["<|end|>"]} '
        f'{t["<|start|>"]} "assistant" {t["<|channel|>"]} "final" {t["<|message|>"]} /[A-Z][a-z]{{2,8}}\\./'
    )}


def no_markup(text):
    return text is None or not any(m in text for m in SHOWN_TOKENS)


def extra(obj, name):
    return (obj.model_extra or {}).get(name)


def test_analysis_is_the_reasoning_and_final_the_answer(client, shape):
    r = client.chat.completions.create(model=M, messages=ASK, max_tokens=60, temperature=0, extra_body=shape)
    m = r.choices[0].message
    assert re.fullmatch(r"[a-z]{3,8}( [a-z]{3,8}){1,3}", extra(m, "reasoning_content")), m
    assert extra(m, "reasoning") == extra(m, "reasoning_content")
    assert re.fullmatch(r"[A-Z][a-z]{2,8}\.", m.content), m
    assert r.choices[0].finish_reason == "stop"
    reasoning = r.usage.completion_tokens_details.reasoning_tokens
    assert 2 <= reasoning < r.usage.completion_tokens


def test_streamed_as_the_whole(client, shape):
    whole = client.chat.completions.create(model=M, messages=ASK, max_tokens=60, temperature=0, extra_body=shape)
    thinking, answer = [], []
    stream = client.chat.completions.create(model=M, messages=ASK, max_tokens=60, temperature=0, stream=True,
                                            stream_options={"include_usage": True}, extra_body=shape)
    usage = None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        if not chunk.choices:
            continue
        d = chunk.choices[0].delta
        assert no_markup(d.content) and no_markup(extra(d, "reasoning_content"))
        thinking.append(extra(d, "reasoning_content") or "")
        answer.append(d.content or "")
    m = whole.choices[0].message
    assert ("".join(thinking), "".join(answer)) == (extra(m, "reasoning_content"), m.content)
    assert usage.completion_tokens_details.reasoning_tokens == whole.usage.completion_tokens_details.reasoning_tokens


@pytest.mark.parametrize("stream", [False, True])
def test_a_commentary_message_to_a_function_is_a_tool_call(client, stream):
    kw = dict(model=M, messages=[{"role": "user", "content": "Time in Paris?"}], tools=[TIME], tool_choice="required",
              max_tokens=120, temperature=0, extra_body={"max_thinking_tokens": 8})
    if not stream:
        r = client.chat.completions.create(**kw)
        choice = r.choices[0]
        calls = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls]
        assert no_markup(choice.message.content) and no_markup(extra(choice.message, "reasoning_content"))
        finish = choice.finish_reason
    else:
        args, names, finish = {}, {}, None
        for chunk in client.chat.completions.create(**kw, stream=True):
            c = chunk.choices[0]
            finish = c.finish_reason or finish
            assert no_markup(c.delta.content)
            for tc in c.delta.tool_calls or []:
                if tc.function.name:
                    names[tc.index] = tc.function.name
                args[tc.index] = args.get(tc.index, "") + (tc.function.arguments or "")
        calls = [(names[i], args[i]) for i in sorted(names)]
    assert finish == "tool_calls" and [n for n, _ in calls] == ["get_time"]
    assert re.fullmatch("[A-Z]{3}", json.loads(calls[0][1])["tz"])


def test_the_call_and_its_result_go_back_through_the_template(client):
    call = {"id": "call_1", "type": "function", "function": {"name": "get_time", "arguments": '{"tz": "CET"}'}}
    messages = [{"role": "user", "content": "Time?"},
                {"role": "assistant", "content": None, "tool_calls": [call], "reasoning_content": "Use the tool."},
                {"role": "tool", "tool_call_id": "call_1", "content": "12:00"}]
    r = client.chat.completions.create(model=M, messages=messages, tools=[TIME], max_tokens=4, temperature=0)
    assert r.usage.prompt_tokens > 20 and r.choices[0].finish_reason in ("stop", "length", "tool_calls")


def test_the_responses_api_gives_the_thinking_as_a_reasoning_item_before_the_call(client):
    r = client.responses.create(model=M, input="Time in Paris?", tools=[{"type": "function", **TIME["function"]}],
                                tool_choice="required", max_output_tokens=120, temperature=0)
    kinds = [item.type for item in r.output]
    assert kinds in (["reasoning", "function_call"], ["function_call"]), kinds
    call = r.output[-1]
    assert call.name == "get_time" and re.fullmatch("[A-Z]{3}", json.loads(call.arguments)["tz"])
    thinking = r.usage.output_tokens_details.reasoning_tokens
    assert (thinking > 0) == (kinds[0] == "reasoning") and thinking <= 12 + 2  # the server's budget
    for item in r.output:
        text = item.content[0].text if item.type == "reasoning" else item.arguments
        assert no_markup(text)
