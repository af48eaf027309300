"""Reasoning formats: how a model writes its thinking apart from its answer, detected from its chat template.

`detect_reasoning(template)` names the format (or None: the model does not think aloud in a known way) and
`reasoning_parser(name, prompt)` makes its parser (an OutputParser, inferd.text.parsing) for one output of the
rendered `prompt`: a template that opened the think block itself starts the output inside it.

- think: `<think>...</think>` (Qwen3, DeepSeek-R1, GLM-4.5, SmolLM3; think.py);
- harmony: gpt-oss's channels (harmony.py), whose parser also gives the tool calls (`calls`) and whose markers
  are control tokens the decoded text must show (`shown_texts`).
"""

from __future__ import annotations

from inferd.text.parsing import OutputParser
from inferd.text.tools.harmony import SHOWN_TOKENS as HARMONY_SHOWN
from inferd.text.tools.harmony import HarmonyParser, is_harmony_template
from inferd.text.reasoning.think import CLOSE, OPEN, ThinkParser

THINK = "think"
HARMONY = "harmony"
FORMATS = (THINK, HARMONY)


def detect_reasoning(template: str | None) -> str | None:
    src = template or ""
    if is_harmony_template(src):
        return HARMONY
    return THINK if OPEN in src or CLOSE in src else None


def reasoning_parser(name: str, prompt: str) -> OutputParser:
    if name == HARMONY:
        return HarmonyParser()
    if name != THINK:
        raise ValueError(f"unknown reasoning format {name!r} (known: {', '.join(FORMATS)})")
    return ThinkParser(start_in_thinking=prompt.rstrip().endswith(OPEN))


def shown_texts(name: str) -> tuple[str, ...]:
    """The control tokens of the format that the output's text must keep for its parser."""
    return HARMONY_SHOWN if name == HARMONY else ()
