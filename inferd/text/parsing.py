"""The one interface of the output parsers: the model's text goes in piece by piece as it is decoded, typed deltas
come out, and streaming and whole-text parsing are the same calls (so they always agree).

A parser (OutputParser) has two calls:
- `feed(text, token_ids=())` -> the deltas that this piece of output decides. A parser may hold back text that
  could still turn out to be one of its markers (`<tool_call` before the `>` arrives); it never loses it.
- `finish()` -> the output ended: what was held back, decided now (an unfinished call gives what it has).
`token_ids` are the ids that decoded to `text`, when the caller has them. Parsers that read markers from the text
(every tool-call format here) ignore them; a format whose markers are control tokens that text alone cannot tell
from ordinary words (gpt-oss harmony's `<|channel|>analysis<|message|>`) reads them.

Deltas: ContentDelta (the answer's text), ReasoningDelta (the model's thinking), ToolCallStart (a call's index,
id and name, once the name is complete) and ToolArgsDelta (the next fragment of that call's arguments, JSON text
exactly as written). Concatenated, the deltas of one kind rebuild what a whole-text parse gives.

Where parsers live: one module per format, in a package per kind: `inferd.text.tools` (tool-call syntaxes,
behind its registry) and `inferd.text.reasoning` (think tags so far). A reasoning parser is one more such
module: a class with feed() and finish() that emits ReasoningDelta for the thinking (`<think>...</think>`, or
harmony's analysis channel) and ContentDelta for the rest. `Chain(reasoning, tools)` then feeds the reasoning
parser's content into the tool-call parser, so a model that thinks and calls tools needs no parser that knows
both, and the consumers (the API encoders) see one stream of deltas.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass
class ContentDelta:
    text: str


@dataclass
class ReasoningDelta:
    text: str


@dataclass
class ToolCallStart:
    index: int  # the call's place among this output's calls, from 0
    id: str
    name: str


@dataclass
class ToolArgsDelta:
    index: int
    text: str


ToolDelta = ContentDelta | ToolCallStart | ToolArgsDelta  # what a tool-call parser emits
Delta = ToolDelta | ReasoningDelta


class OutputParser(Protocol):
    def feed(self, text: str, token_ids: Sequence[int] = ()) -> Sequence[Delta]: ...

    def finish(self) -> Sequence[Delta]: ...


class Chain:
    """Two parsers one after the other: `first`'s content goes through `then`; its other deltas pass as they are.
    The token ids go to `first` only (its content no longer lines up with tokens)."""

    def __init__(self, first: OutputParser, then: OutputParser):
        self.first = first
        self.then = then

    def feed(self, text: str, token_ids: Sequence[int] = ()) -> list[Delta]:
        return self._through(self.first.feed(text, token_ids), final=False)

    def finish(self) -> list[Delta]:
        return self._through(self.first.finish(), final=True)

    def _through(self, deltas: Sequence[Delta], final: bool) -> list[Delta]:
        out: list[Delta] = []
        for d in deltas:
            if isinstance(d, ContentDelta):
                out.extend(self.then.feed(d.text))
            else:
                out.append(d)
        if final:
            out.extend(self.then.finish())
        return out
