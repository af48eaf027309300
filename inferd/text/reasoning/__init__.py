"""Reasoning formats: how a model writes its thinking apart from its answer, detected from its chat template.

`detect_reasoning(template)` names the format (or None: the model does not think aloud in a known way) and
`reasoning_parser(name, prompt)` makes its parser (an OutputParser, inferd.text.parsing) for one output of the
rendered `prompt`: a template that opened the think block itself starts the output inside it.

- think: `<think>...</think>` (Qwen3, DeepSeek-R1, GLM-4.5, SmolLM3; think.py);
- harmony: gpt-oss's channels (harmony.py), whose parser also gives the tool calls (`calls`) and whose markers
  are control tokens the decoded text must show (`shown_texts`).
BUDGET_MARKERS say, per format, what a reasoning budget (inferd.text.grammar.budget) watches for and forces.
"""

from __future__ import annotations

from typing import NamedTuple

from inferd.text.parsing import OutputParser
from inferd.text.tools.harmony import CHANNEL, END, MESSAGE, START, HarmonyParser, is_harmony_template
from inferd.text.tools.harmony import SHOWN_TOKENS as HARMONY_SHOWN
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
    return ThinkParser(start_in_thinking=starts_thinking(name, prompt))


class BudgetMarkers(NamedTuple):
    """Where a format's thinking opens and closes in the output, and what is written to close it early."""

    open: str
    close: str
    forced: str


BUDGET_MARKERS = {
    THINK: BudgetMarkers(OPEN, CLOSE, "\n" + CLOSE + "\n\n"),
    # the end of the analysis message and the start of the answer's
    HARMONY: BudgetMarkers(f"{CHANNEL}analysis{MESSAGE}", END, f"{END}{START}assistant{CHANNEL}final{MESSAGE}"),
}


def starts_thinking(name: str, prompt: str) -> bool:
    """The rendered prompt opened the thinking itself, so the output starts inside it."""
    return name == THINK and prompt.rstrip().endswith(OPEN)


def shown_texts(name: str) -> tuple[str, ...]:
    """The control tokens of the format that the output's text must keep for its parser."""
    return HARMONY_SHOWN if name == HARMONY else ()
