"""Tiny random GGUFs that speak the 2026 tool-call formats: llama-shaped, with the format's markers and chat turns
as control tokens (the vocabulary's last ids) and the published chat template (tests/text/tools/templates.py), for
the grammar walks on the real markers and the server tests."""
from __future__ import annotations

from pathlib import Path

from tests.model.make_tiny import TinySpec, write_tiny_gguf
from tests.text.tools.templates import template

CHATML = ("<|im_start|>", "<|im_end|>")
XML = ("<tool_call>", "</tool_call>")
GLM = ("[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>")
DEEPSEEK = ("<｜User｜>", "<｜Assistant｜>", "<｜end▁of▁sentence｜>", "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>",
            "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>", "<｜tool▁output▁begin｜>",
            "<｜tool▁output▁end｜>")
# format -> (the llama.cpp template it uses, its control tokens)
MODELS = {
    "qwen3_coder": ("Qwen3-Coder", CHATML + XML),
    "glm45": ("GLM-4.6", GLM + XML + ("<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>")),
    "deepseek_v31": ("deepseek-ai-DeepSeek-V3.1", DEEPSEEK),
    "deepseek_v3": ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", DEEPSEEK),
}


def write_tiny(folder: Path, fmt: str) -> Path:
    name, controls = MODELS[fmt]
    return write_tiny_gguf(folder / f"tiny-{fmt}.gguf", TinySpec(vocab_size=640, context_length=2048, seed=13),
                           weight_type="Q8_0", chat_template=template(name), control_tokens=controls)
