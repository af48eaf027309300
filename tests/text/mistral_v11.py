"""Mistral v11 chat templates for the tool-calling tests, and a tiny random GGUF that uses one.

MISTRAL_SMALL_32: the chat template of mistralai/Mistral-Small-3.2-24B-Instruct-2506 as published (in its GGUFs and
llama.cpp's models/templates), with only the long default system message shortened: calls are written
`[TOOL_CALLS]name[CALL_ID]id[ARGS]{json}`, results `[TOOL_RESULTS]id[TOOL_CONTENT]text[/TOOL_RESULTS]`, and ids must
be 9 alphanumerics. MISTRAL_V11_NO_IDS: the same template as the v11 models without call ids write calls
(Devstral, Magistral: `[TOOL_CALLS]name[ARGS]{json}`, results `[TOOL_RESULTS]text[/TOOL_RESULTS]`).
"""
from __future__ import annotations

from pathlib import Path

from tests.model.make_tiny import TinySpec, write_tiny_gguf

MISTRAL_SMALL_32 = r'''{%- set today = strftime_now("%Y-%m-%d") %}
{%- set default_system_message = "You are Mistral Small 3. The current date is " + today + "." %}

{{- bos_token }}

{%- set system_prompt = default_system_message %}
{%- set loop_messages = messages %}

{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}

{%- if messages|length > 0 and messages[0]['role'] == 'system' %}
    {%- if messages[0]['content'] is string %}
        {%- set system_prompt = messages[0]['content'] %}
    {%- else %}
        {%- set system_prompt = messages[0]['content'][0]['text'] %}
    {%- endif %}
    {%- set loop_messages = messages[1:] %}
{%- endif %}

{%- set user_messages = loop_messages | selectattr("role", "equalto", "user") | list %}

{%- set ns = namespace(index=0) %}
{%- for message in loop_messages %}
    {%- if not (message.role == "tool" or (message.get('tool_calls'))) %}
        {%- if (message["role"] == "user") != (ns.index % 2 == 0) %}
            {{- raise_exception("After the optional system message, conversation roles must alternate user/assistant/user/assistant/...") }}
        {%- endif %}
        {%- set ns.index = ns.index + 1 %}
    {%- endif %}
{%- endfor %}

{{- '[SYSTEM_PROMPT]' + system_prompt + '[/SYSTEM_PROMPT]' }}

{%- for message in loop_messages %}
    {%- if message['role'] == 'system' %}
        {%- if message['content'] is string %}
            {{- '[SYSTEM_PROMPT]' + message['content'] + '[/SYSTEM_PROMPT]' }}
        {%- else %}
            {{- '[SYSTEM_PROMPT]' + message['content'][0]['text'] + '[/SYSTEM_PROMPT]' }}
        {%- endif %}
    {%- elif message['role'] == 'user' %}
        {%- if tools is not none and (message == user_messages[-1]) %}
            {{- '[AVAILABLE_TOOLS]' + tools|tojson + '[/AVAILABLE_TOOLS]' }}
        {%- endif %}
        {{- '[INST]' }}
        {%- if message['content'] is string %}
            {{- message['content'] }}
        {%- else %}
            {%- for block in message['content'] %}
                {%- if block['type'] == 'text' %}
                    {{- block['text'] }}
                {%- elif block['type'] in ['image', 'image_url'] %}
                    {{- '[IMG]' }}
                {%- else %}
                    {{- raise_exception('Only text and image blocks are supported in message content!') }}
                {%- endif %}
            {%- endfor %}
        {%- endif %}
        {{- '[/INST]' }}
    {%- elif message['role'] == 'assistant' %}
        {%- if message.get('tool_calls') %}
            {%- for tool_call in message.tool_calls %}
                {{- '[TOOL_CALLS]' + tool_call.function.name }}
                {%- if not tool_call.id is defined or tool_call.id is not string or tool_call.id|length != 9 %}
                    {{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}
                {%- endif %}
                {{- '[CALL_ID]' + tool_call.id }}
                {{- '[ARGS]' + tool_call['function']['arguments']|tojson }}
            {%- endfor %}
            {{- eos_token }}
        {%- elif message['content'] is string %}
            {{- message['content'] + eos_token }}
        {%- else %}
            {%- for block in message['content'] %}
                {%- if block['type'] == 'text' %}
                    {{- block['text'] }}
                {%- elif block['type'] in ['image', 'image_url'] %}
                    {{- '[IMG]' }}
                {%- else %}
                    {{- raise_exception('Only text and image blocks are supported in assistant content!') }}
                {%- endif %}
            {%- endfor %}
            {{- eos_token }}
        {%- endif %}
    {%- elif message['role'] == 'tool_results' or message['role'] == 'tool' %}
        {%- if message.content is defined and message.content.content is defined %}
            {%- set content = message.content.content %}
        {%- else %}
            {%- set content = message.content %}
        {%- endif %}
        {%- if not message.tool_call_id is defined or message.tool_call_id is not string or message['tool_call_id']|length != 9 %}
            {{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}
        {%- endif %}
        {{- '[TOOL_RESULTS]' + message.tool_call_id + '[TOOL_CONTENT]' + content|string + '[/TOOL_RESULTS]' }}
    {%- else %}
        {{- raise_exception('Only system, user, assistant, and tool roles are supported!') }}
    {%- endif %}
{%- endfor %}
'''  # noqa: E501 (the published template verbatim: two of its lines are longer than 120)

MISTRAL_V11_NO_IDS = MISTRAL_SMALL_32.replace(
    '                {%- if not tool_call.id is defined or tool_call.id is not string or tool_call.id|length != 9 %}\n'
    '                    {{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}\n'
    '                {%- endif %}\n'
    '                {{- \'[CALL_ID]\' + tool_call.id }}\n',
    "",
).replace(
    '        {%- if not message.tool_call_id is defined or message.tool_call_id is not string'
    ' or message[\'tool_call_id\']|length != 9 %}\n'
    '            {{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}\n'
    '        {%- endif %}\n'
    '        {{- \'[TOOL_RESULTS]\' + message.tool_call_id + \'[TOOL_CONTENT]\' + content|string'
    ' + \'[/TOOL_RESULTS]\' }}\n',
    "        {{- '[TOOL_RESULTS]' + content|string + '[/TOOL_RESULTS]' }}\n",
)

# Mistral's control tokens (tekken's special tokens, the ones these templates write)
CONTROL_TOKENS = ("[INST]", "[/INST]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]",
                  "[TOOL_CALLS]", "[IMG]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]", "[TOOL_CONTENT]", "[ARGS]",
                  "[CALL_ID]")


def write_tiny_mistral(path: str | Path, template: str = MISTRAL_SMALL_32) -> Path:
    """A tiny random llama-shaped GGUF with Mistral's control tokens (the vocabulary's last ids) and a v11 template."""
    return write_tiny_gguf(path, TinySpec(vocab_size=640, context_length=2048, seed=11), weight_type="Q8_0",
                           chat_template=template, control_tokens=CONTROL_TOKENS)
