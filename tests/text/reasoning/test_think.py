"""inferd/text/reasoning/think.py: <think>...</think> apart from the answer, the same whatever the stream's
pieces (every split of the output, markers cut anywhere)."""

import pytest

from inferd.text.parsing import ContentDelta, ReasoningDelta
from inferd.text.reasoning.think import ThinkParser


def parse(pieces, **kw):
    p = ThinkParser(**kw)
    deltas = [d for piece in pieces for d in p.feed(piece)] + p.finish()
    reasoning = "".join(d.text for d in deltas if isinstance(d, ReasoningDelta))
    content = "".join(d.text for d in deltas if isinstance(d, ContentDelta))
    return reasoning, content, deltas


def splits(text):
    """The whole text, then every way of cutting it in two, then one character at a time."""
    yield [text]
    for i in range(1, len(text)):
        yield [text[:i], text[i:]]
    yield list(text)


QWEN3 = "<think>\nThe user wants colors.\nRed, blue, green.\n</think>\n\nRed, blue and green."


@pytest.mark.parametrize("pieces", list(splits(QWEN3)))
def test_thinking_and_answer_apart_whatever_the_pieces(pieces):
    reasoning, content, _ = parse(pieces)
    assert reasoning == "The user wants colors.\nRed, blue, green."
    assert content == "Red, blue and green."


@pytest.mark.parametrize("pieces", list(splits("I was told to think first.</think>\nAnswer.")))
def test_a_prompt_that_opened_the_block_starts_the_output_inside_it(pieces):
    reasoning, content, _ = parse(pieces, start_in_thinking=True)
    assert (reasoning, content) == ("I was told to think first.", "Answer.")


@pytest.mark.parametrize("text", ["Plain answer <think> later is text.", "  indented answer", "<thin", "<b>bold</b>"])
def test_an_output_that_does_not_open_with_the_tag_is_all_answer(text):
    for pieces in splits(text):
        reasoning, content, _ = parse(pieces)
        assert reasoning == "" and content.strip() == text.strip()


def test_no_reasoning_delta_is_empty_and_streams_come_as_they_are_decided():
    _, _, deltas = parse(["<think>", "\n", "Hmm", ", ", "ok", "\n</thi", "nk>\n\n", "Yes", "."])
    assert all(d.text for d in deltas)
    assert [type(d).__name__ for d in deltas] == ["ReasoningDelta"] * 3 + ["ContentDelta"] * 2
    assert [d.text for d in deltas] == ["Hmm", ",", " ok", "Yes", "."]


def test_an_unfinished_block_is_all_reasoning_and_an_empty_block_gives_nothing():
    assert parse(list("<think>cut off here"))[:2] == ("cut off here", "")
    assert parse(["<think>\n\n</think>\n\nHi"])[:2] == ("", "Hi")
