"""inferd/text/reasoning: which templates think aloud, and where their outputs start."""

import pytest

from inferd.text.parsing import ContentDelta, ReasoningDelta
from inferd.text.reasoning import HARMONY, THINK, detect_reasoning, reasoning_parser, shown_texts
from inferd.text.tools.harmony import HarmonyParser

QWEN3_TAIL = "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}"
GPT_OSS_TAIL = "{{- '<|start|>assistant<|channel|>final<|message|>' + message.content + '<|end|>' }}"
R1_TAIL = "{% if add_generation_prompt %}{{'<｜Assistant｜><think>\\n'}}{% endif %}"


@pytest.mark.parametrize("template, expected", [(QWEN3_TAIL, THINK), (R1_TAIL, THINK), ("{{ messages }}", None),
                                                (GPT_OSS_TAIL, HARMONY),
                                                (None, None)])
def test_templates_that_write_think_tags_think(template, expected):
    assert detect_reasoning(template) == expected


def kinds(parser, text):
    return [(type(d).__name__, d.text) for d in parser.feed(text) + parser.finish()]


def test_a_prompt_ending_inside_the_block_starts_the_output_there():
    assert kinds(reasoning_parser(THINK, "<｜Assistant｜><think>\n"), "Hmm.</think>Hi") == [
        (ReasoningDelta.__name__, "Hmm."), (ContentDelta.__name__, "Hi")]
    # thinking switched off: the template closed the block, the output is the answer
    assert kinds(reasoning_parser(THINK, "<|im_start|>assistant\n<think>\n\n</think>\n\n"), "Hi") == [
        (ContentDelta.__name__, "Hi")]


def test_unknown_formats_are_named():
    with pytest.raises(ValueError, match="unknown reasoning format 'channels'"):
        reasoning_parser("channels", "")


def test_harmony_parses_with_its_markers_shown():
    assert isinstance(reasoning_parser(HARMONY, "<|start|>assistant"), HarmonyParser)
    assert "<|channel|>" in shown_texts(HARMONY) and shown_texts(THINK) == ()
