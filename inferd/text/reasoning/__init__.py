"""Reasoning formats: how a model writes its thinking apart from its answer, detected from its chat template.

`detect_reasoning(template)` names the format (or None: the model does not think aloud in a known way) and
`reasoning_parser(name, prompt)` makes its parser (an OutputParser, inferd.text.parsing) for one output of the
rendered `prompt`: a template that opened the think block itself starts the output inside it.
"""

from __future__ import annotations

from inferd.text.parsing import OutputParser
from inferd.text.reasoning.think import CLOSE, OPEN, ThinkParser

THINK = "think"
FORMATS = (THINK,)


def detect_reasoning(template: str | None) -> str | None:
    src = template or ""
    return THINK if OPEN in src or CLOSE in src else None


def reasoning_parser(name: str, prompt: str) -> OutputParser:
    if name != THINK:
        raise ValueError(f"unknown reasoning format {name!r} (known: {', '.join(FORMATS)})")
    return ThinkParser(start_in_thinking=prompt.rstrip().endswith(OPEN))
