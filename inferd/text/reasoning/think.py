"""`<think>...</think>` reasoning (Qwen3, Qwen3.5, DeepSeek-R1 and its distills, GLM-4.5, SmolLM3): the thinking
comes out as ReasoningDelta, the answer after the closing tag as ContentDelta.

Only a think block at the start of the output is reasoning (after optional whitespace); a template that opens the
block itself in the prompt (DeepSeek-R1's `<think>\\n` after the assistant turn) starts the output inside it
(`start_in_thinking`). Text that could still be the start of a tag is held back until it is decided, and the
whitespace around the thinking (the newlines the models write inside the tags and after the closing one) is
dropped, so the reasoning and the answer each begin and end with their own words.
"""

from __future__ import annotations

from collections.abc import Sequence

from inferd.text.parsing import ContentDelta, Delta, ReasoningDelta

OPEN, CLOSE = "<think>", "</think>"


class ThinkParser:
    def __init__(self, start_in_thinking: bool = False, open_tag: str = OPEN, close_tag: str = CLOSE):
        self.open_tag, self.close_tag = open_tag, close_tag
        self.state = "thinking" if start_in_thinking else "start"
        self.held = ""  # text not yet decided
        self.content_started = False  # whitespace after the closing tag is dropped until the answer begins
        self.reasoning_started = False

    def feed(self, text: str, token_ids: Sequence[int] = ()) -> list[Delta]:
        self.held += text
        out: list[Delta] = []
        while True:
            before = (self.state, self.held)
            if self.state == "start":
                self._start()
            elif self.state == "thinking":
                self._thinking(out)
            if self.state == "content" and self.held:
                self._content(out)
            if (self.state, self.held) == before:
                return out

    def finish(self) -> list[Delta]:
        out: list[Delta] = []
        if self.state == "thinking":
            text = self.held.rstrip() if self.reasoning_started else self.held.strip()
            if text:
                out.append(ReasoningDelta(text))
        elif self.held and (self.content_started or self.held.strip()):
            out.append(ContentDelta(self.held if self.content_started else self.held.lstrip()))
        self.held = ""
        return out

    def _start(self) -> None:
        lead = self.held.lstrip()
        if lead.startswith(self.open_tag):
            self.state, self.held = "thinking", lead[len(self.open_tag) :]
        elif not (self.open_tag.startswith(lead)):  # not a think block: all of it is the answer
            self.state, self.content_started = "content", True

    def _thinking(self, out: list[Delta]) -> None:
        if not self.reasoning_started:
            self.held = self.held.lstrip()
            if not self.held:
                return
        end = self.held.find(self.close_tag)
        if end >= 0:
            self._reason(out, self.held[:end].rstrip())
            self.state, self.held = "content", self.held[end + len(self.close_tag) :]
            return
        # keep back what could begin the closing tag, and trailing whitespace that may precede it
        keep = _partial_suffix(self.held, self.close_tag)
        body = self.held[: len(self.held) - keep]
        safe = body.rstrip()
        self._reason(out, safe)
        self.held = self.held[len(safe) :]

    def _reason(self, out: list[Delta], text: str) -> None:
        if text:
            out.append(ReasoningDelta(text))
            self.reasoning_started = True

    def _content(self, out: list[Delta]) -> None:
        if not self.content_started:
            self.held = self.held.lstrip()
            if not self.held:
                return
            self.content_started = True
        out.append(ContentDelta(self.held))
        self.held = ""


def _partial_suffix(text: str, marker: str) -> int:
    """Length of the longest end of `text` that is a proper start of `marker`."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:n]):
            return n
    return 0
