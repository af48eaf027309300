"""inferd.text.parsing: the one parser interface. A tool-call parser is an OutputParser, and Chain puts a second
parser behind a first's content, the way a reasoning parser goes in front of the tool-call parser (a toy
`<think>` parser stands in for one here)."""
from __future__ import annotations

from collections.abc import Sequence

from inferd.text.parsing import (
    Chain,
    ContentDelta,
    Delta,
    OutputParser,
    ReasoningDelta,
    ToolArgsDelta,
    ToolCallStart,
)
from inferd.text.tools import HERMES, ToolCallParser


class ThinkTags:
    """Just enough of a reasoning parser: text up to </think> is thinking (no marker split across pieces)."""

    def __init__(self) -> None:
        self.thinking = True
        self.token_ids: list[int] = []

    def feed(self, text: str, token_ids: Sequence[int] = ()) -> list[Delta]:
        self.token_ids += token_ids
        if not self.thinking:
            return [ContentDelta(text)]
        head, sep, tail = text.partition("</think>")
        out: list[Delta] = [ReasoningDelta(head.removeprefix("<think>"))] if head else []
        if sep:
            self.thinking = False
            out += [ContentDelta(tail)] if tail else []
        return out

    def finish(self) -> list[Delta]:
        return []


def ids():
    counter = iter(range(100))
    return lambda: f"call_{next(counter)}"


def test_a_reasoning_parser_goes_in_front_of_the_tool_call_parser():
    first: OutputParser = ThinkTags()
    parser: OutputParser = Chain(first, ToolCallParser(HERMES, ids()))
    pieces = ["<think>The user wants", " the time.</think>Checking.\n<tool_", 'call>\n{"name": "get_time", ',
              '"arguments": {"tz": "CET"}}\n</tool_call>']
    deltas = [d for i, p in enumerate(pieces) for d in parser.feed(p, [i])] + list(parser.finish())
    assert [d for d in deltas if isinstance(d, ReasoningDelta)] == [ReasoningDelta("The user wants"),
                                                                     ReasoningDelta(" the time.")]
    assert "".join(d.text for d in deltas if isinstance(d, ContentDelta)) == "Checking."
    assert [d for d in deltas if isinstance(d, ToolCallStart)] == [ToolCallStart(0, "call_0", "get_time")]
    assert "".join(d.text for d in deltas if isinstance(d, ToolArgsDelta)) == '{"tz": "CET"}'
    assert first.token_ids == [0, 1, 2, 3]                    # the ids reach the first parser
    assert deltas.index(ReasoningDelta(" the time.")) < deltas.index(ContentDelta("Checking."))


def test_the_second_parser_flushes_at_finish():
    parser = Chain(ThinkTags(), ToolCallParser(HERMES, ids()))
    assert parser.feed("<think>hm</think>Answer <tool") == [ReasoningDelta("hm"), ContentDelta("Answer")]
    assert parser.finish() == [ContentDelta(" <tool")]        # held back as a possible marker, given back at the end
