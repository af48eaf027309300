# ruff: noqa: E501  (the chat template is data: its lines are kept as a template author writes them)
"""A harmony chat template for the gpt-oss tests, and a tiny random gpt-oss GGUF that uses one.

GPT_OSS: the parts of openai/gpt-oss's published chat template that decide the prompt's shape (system and
developer messages, tools as a `functions` namespace, earlier calls as commentary messages to=functions.NAME with
their results from functions.NAME, earlier thinking as `thinking`, the generation prompt `<|start|>assistant`),
with the tool types written as JSON instead of its TypeScript-like rendering."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from tests.model.make_tiny import GPTOSS_SPEC, write_tiny_gguf

GPT_OSS = r'''{{- "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.
Reasoning: " + (reasoning_effort if reasoning_effort is defined else "medium") + "

# Valid channels: analysis, commentary, final. Channel must be included for every message." }}
{%- if tools %}{{- "
Calls to these tools must go to the commentary channel: 'functions'." }}{%- endif %}
{{- "<|end|>" }}
{%- if messages[0].role in ("developer", "system") %}{%- set dev = messages[0].content %}{%- set loop_messages = messages[1:] %}
{%- else %}{%- set dev = "" %}{%- set loop_messages = messages %}{%- endif %}
{%- if dev or tools %}{{- "<|start|>developer<|message|>" }}
  {%- if dev %}{{- "# Instructions\n\n" + dev + "\n\n" }}{%- endif %}
  {%- if tools %}{{- "# Tools\n\n## functions\n\nnamespace functions {\n\n" }}
    {%- for t in tools %}{{- "type " + t.function.name + " = (_: " + t.function.parameters|tojson + ") => any;\n\n" }}{%- endfor %}
    {{- "} // namespace functions" }}{%- endif %}
  {{- "<|end|>" }}{%- endif %}
{%- set last = namespace(name=none) %}
{%- for message in loop_messages %}
  {%- if message.role == "assistant" and message.tool_calls %}
    {%- if message.thinking %}{{- "<|start|>assistant<|channel|>analysis<|message|>" + message.thinking + "<|end|>" }}{%- endif %}
    {%- set call = message.tool_calls[0].function %}
    {{- "<|start|>assistant to=functions." + call.name + "<|channel|>commentary json<|message|>" + call.arguments|tojson + "<|call|>" }}
    {%- set last.name = call.name %}
  {%- elif message.role == "assistant" %}
    {{- "<|start|>assistant<|channel|>final<|message|>" + message.content + "<|end|>" }}
  {%- elif message.role == "tool" %}
    {{- "<|start|>functions." + last.name + " to=assistant<|channel|>commentary<|message|>" + message.content|tojson + "<|end|>" }}
  {%- elif message.role == "user" %}
    {{- "<|start|>user<|message|>" + message.content + "<|end|>" }}
  {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|start|>assistant{%- endif %}'''

CONTROL_TOKENS = ("<|start|>", "<|channel|>", "<|message|>", "<|constrain|>", "<|end|>", "<|call|>", "<|return|>")


def write_tiny_harmony(path: str | Path) -> Path:
    """A tiny random gpt-oss GGUF (tests/model/make_tiny.py's, MXFP4 experts) with harmony's control tokens (the
    vocabulary's last ids), o200k's pre-tokenizer and GPT_OSS: the architecture and the chat format end to end."""
    return write_tiny_gguf(path, replace(GPTOSS_SPEC, context_length=2048, seed=13), weight_type="MXFP4",
                           chat_template=GPT_OSS, control_tokens=CONTROL_TOKENS, tokenizer_pre="gpt-4o")
