"""inferd.text.tools.rendering: tools, past calls and their results into the chat template: the real
Qwen2.5-Coder template (where the file is present), a generic template taught the Hermes syntax, and Mistral Small
3.2's published v11 template (with and without call ids)."""
from __future__ import annotations

import json
import re

from inferd.text.chat import render_chat
from inferd.text.tools import HERMES, GENERIC, detect_format, mistral_id, parse_tools, prepare_messages, template_tools
from tests.text.mistral_v11 import MISTRAL_SMALL_32, MISTRAL_V11_NO_IDS
from tests.text.tools.calls import WEATHER, conversation, needs_qwen, weather

CONVERSATION = conversation("call_1")
MISTRAL_CONVERSATION = conversation("call_abc")
MISTRAL_WEATHER = weather(max_city=10)


class _BOS_EOS:  # what render_chat reads from a tokenizer
    bos_token, eos_token = "<s>", "</s>"


@needs_qwen
def test_qwen_template_renders_tools_calls_and_results(qwen):
    _, template, _ = qwen
    fmt = detect_format(template)
    assert fmt.name == HERMES and fmt.template_renders_tools
    tools = parse_tools([WEATHER])
    text = render_chat(template, prepare_messages(CONVERSATION, fmt, tools), tools=template_tools(tools, fmt))
    assert "<tools>\n" + json.dumps(WEATHER) + "\n</tools>" in text
    # the call as the model would write it: arguments as an object, not a JSON string inside a string
    assert ('<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", '
            '"unit": "celsius"}}\n</tool_call><|im_end|>') in text
    assert "<|im_start|>user\n<tool_response>\n22 C, sunny\n</tool_response><|im_end|>" in text
    assert text.endswith("<|im_start|>assistant\n")


def test_generic_template_gets_a_tools_block_and_text_calls():
    fmt = detect_format(None)                                   # ChatML fallback: no tool support
    assert fmt.name == GENERIC and not fmt.template_renders_tools
    tools = parse_tools([WEATHER])
    msgs = prepare_messages([{"role": "system", "content": "Be brief."}] + CONVERSATION, fmt, tools)
    assert template_tools(tools, fmt) is None
    assert msgs[0]["role"] == "system" and msgs[0]["content"].startswith("Be brief.\n\n# Tools")
    assert json.dumps(WEATHER) in msgs[0]["content"]
    assert msgs[2] == {"role": "assistant", "content": '<tool_call>\n{"name": "get_weather", "arguments": '
                                                       '{"city": "Paris", "unit": "celsius"}}\n</tool_call>'}
    assert msgs[3] == {"role": "user", "content": "<tool_response>\n22 C, sunny\n</tool_response>"}
    text = render_chat(None, msgs)
    assert "<|im_start|>user\n<tool_response>" in text


def test_generic_template_writes_several_calls_after_the_content_and_groups_their_results():
    fmt = detect_format(None)
    calls = [{"id": f"c{i}", "type": "function", "function": {"name": "f", "arguments": {"i": i}}} for i in (1, 2)]
    msgs = prepare_messages([
        {"role": "user", "content": "Go."},
        {"role": "assistant", "content": "Two calls.", "tool_calls": calls},
        {"role": "tool", "tool_call_id": "c1", "content": "one"},
        {"role": "tool", "tool_call_id": "c2", "content": "two"},
    ], fmt)
    assert msgs[1] == {"role": "assistant", "content": 'Two calls.\n<tool_call>\n{"name": "f", "arguments": '
                       '{"i": 1}}\n</tool_call>\n<tool_call>\n{"name": "f", "arguments": {"i": 2}}\n</tool_call>'}
    assert msgs[2] == {"role": "user", "content": "<tool_response>\none\n</tool_response>\n"
                                                  "<tool_response>\ntwo\n</tool_response>"}
    assert len(msgs) == 3


def test_tool_messages_get_their_function_name():
    fmt = detect_format("{{ tools }} <tool_call>")
    msgs = prepare_messages(CONVERSATION, fmt)
    assert msgs[2]["name"] == "get_weather" and msgs[2]["content"] == "22 C, sunny"
    assert msgs[1]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris", "unit": "celsius"}


def test_v11_template_renders_calls_ids_and_results():
    fmt = detect_format(MISTRAL_SMALL_32)
    tools = parse_tools([MISTRAL_WEATHER])
    msgs = prepare_messages(MISTRAL_CONVERSATION, fmt, tools)
    cid = mistral_id("call_abc")
    assert re.fullmatch(r"[A-Za-z0-9]{9}", cid) and cid == mistral_id("call_abc") != mistral_id("call_abd")
    assert msgs[1]["tool_calls"][0]["id"] == cid and msgs[2]["tool_call_id"] == cid
    text = render_chat(MISTRAL_SMALL_32, msgs, tools=template_tools(tools, fmt), tokenizer=_BOS_EOS)
    assert text.startswith("<s>[SYSTEM_PROMPT]You are Mistral Small 3.")
    assert ("[AVAILABLE_TOOLS]" + json.dumps([MISTRAL_WEATHER]) + "[/AVAILABLE_TOOLS][INST]Weather in Paris?[/INST]"
            ) in text
    assert text.endswith(f'[TOOL_CALLS]get_weather[CALL_ID]{cid}[ARGS]{{"city": "Paris", "unit": "celsius"}}</s>'
                         f"[TOOL_RESULTS]{cid}[TOOL_CONTENT]22 C, sunny[/TOOL_RESULTS]")
    nine = [{**MISTRAL_CONVERSATION[1], "tool_calls": [{**MISTRAL_CONVERSATION[1]["tool_calls"][0],
                                                         "id": "Ab3dE6gH9"}]},
            {**MISTRAL_CONVERSATION[2], "tool_call_id": "Ab3dE6gH9"}]
    kept = prepare_messages(MISTRAL_CONVERSATION[:1] + nine, fmt, tools)
    assert kept[1]["tool_calls"][0]["id"] == "Ab3dE6gH9" == kept[2]["tool_call_id"]     # valid ids stay


def test_v11_template_without_ids():
    fmt = detect_format(MISTRAL_V11_NO_IDS)
    tools = parse_tools([MISTRAL_WEATHER])
    text = render_chat(MISTRAL_V11_NO_IDS, prepare_messages(MISTRAL_CONVERSATION, fmt, tools),
                       tools=template_tools(tools, fmt), tokenizer=_BOS_EOS)
    assert text.endswith('[TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "unit": "celsius"}</s>'
                         "[TOOL_RESULTS]22 C, sunny[/TOOL_RESULTS]")
