"""The chat templates inferd knows without a model's: ChatML, and Gemma's turns for Gemma files that ship none.
Kept apart from chat.py, which compiles templates with jinja2, so the model loader names a template without
importing jinja2 (it is imported by the server, beside the load)."""

from __future__ import annotations

# Used when a model ships no template; ChatML is what most small instruct models (SmolLM2, Qwen2) speak.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# Gemma's turn format (Gemma 3's own template, text only), for Gemma GGUF files that ship without a template (the
# base models): a system message is folded into the first user turn, the assistant's role is "model".
GEMMA_TEMPLATE = (
    "{{ bos_token }}"
    "{% if messages and messages[0]['role'] == 'system' %}"
    "{% set first_user_prefix = messages[0]['content'] + '\n\n' %}{% set loop_messages = messages[1:] %}"
    "{% else %}{% set first_user_prefix = '' %}{% set loop_messages = messages %}{% endif %}"
    "{% for message in loop_messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') }}"
    "{{ message['content'] | trim }}{{ '<end_of_turn>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)


def default_template(arch: str) -> str | None:
    """The template of a model family whose files may lack one (None: the ChatML fallback)."""
    return GEMMA_TEMPLATE if arch.startswith("gemma") else None
