"""A reasoning budget (`max_thinking_tokens`): once a sequence has thought that many tokens, the closing of its
thinking is forced (`</think>`, or harmony's end of the analysis message and the start of the answer), and the
model answers from there. It is a matcher like the grammar's (fill_mask / advance / is_done), wrapped around the
request's own grammar matcher if it has one, so the scheduler applies it as it applies any constraint.

The thinking is told from the text of the sampled tokens: it opens where the format's opening marker appears
(or at the first token, for a prompt that opened it) and closes at the closing marker. Only the tokens inside count.
The forced tokens are those of the closing text; where a grammar constrains the output too, only as many of them
as the grammar allows are forced (harmony's call grammar takes the end of the analysis and the next message's
start, and then makes the call itself), and none at all until it allows the first (never inside a character).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from inferd.text.grammar.matcher import LazyMatcher, SequenceMatcher

Inner = SequenceMatcher | LazyMatcher


@dataclass(frozen=True)
class ThinkingBudget:
    limit: int  # thinking tokens allowed before the closing is forced
    open_text: str  # the marker that opens the thinking in the output
    close_text: str  # the marker that closes it
    forced: tuple[int, ...]  # the tokens written when the budget is spent
    piece: Callable[[int], str]  # a token's text, control tokens shown
    eos_ids: frozenset[int]
    vocab_size: int  # the mask rows' width in tokens (the model's logits)
    start_inside: bool = False  # the prompt opened the thinking: the output starts inside it

    def new_matcher(self, inner: Inner | None) -> BudgetMatcher:
        return BudgetMatcher(self, inner)


class BudgetMatcher:
    """One sequence's budget state around its grammar matcher (None: the output is otherwise free)."""

    def __init__(self, budget: ThinkingBudget, inner: Inner | None):
        self.budget = budget
        self.inner = inner
        self.inside = budget.start_inside
        self.spent = 0  # thinking tokens so far
        self.text = ""  # the output's text since the last marker, as far as a marker could reach back
        self.forcing: list[int] = []  # the forced tokens still to write
        self.ended = False  # an end-of-sequence token was taken while the output was free

    def fill_mask(self, row: np.ndarray) -> bool:
        if self.inside and self.spent >= self.budget.limit and not self.forcing:
            # where the grammar takes none of the closing yet (inside a UTF-8 character), the next step tries again
            self.forcing = self._allowed(self.budget.forced)
        if self.forcing:
            row[:] = 0
            token = self.forcing[0]
            row[token // 32] = np.uint32(1 << (token % 32))
            return True
        return self.inner.fill_mask(row) if self.inner is not None else False

    def advance(self, token: int) -> bool:
        if self.forcing and token == self.forcing[0]:
            self.forcing.pop(0)
        if self.inner is not None:
            if isinstance(self.inner, LazyMatcher) and self.inner.active is None and token in self.budget.eos_ids:
                self.ended = True
            elif not self.inner.advance(token):
                return False
        elif token in self.budget.eos_ids:
            self.ended = True
        self._track(token)
        return True

    def _track(self, token: int) -> None:
        b = self.budget
        if self.inside:
            self.spent += 1
        self.text += b.piece(token)
        marker = b.close_text if self.inside else b.open_text
        at = self.text.find(marker)
        if at >= 0:
            self.inside = not self.inside
            self.text = self.text[at + len(marker) :]
        else:
            self.text = self.text[-(max(len(b.open_text), len(b.close_text)) - 1) :]

    def _allowed(self, tokens: Sequence[int]) -> list[int]:
        inner = self.inner.active if isinstance(self.inner, LazyMatcher) else self.inner
        if inner is None:
            return list(tokens)
        return list(tokens[: inner.llmatcher.validate_tokens(list(tokens))])

    @property
    def is_done(self) -> bool:
        return self.ended or (self.inner is not None and self.inner.is_done)

    @property
    def is_error(self) -> bool:
        return self.inner is not None and self.inner.is_error

    @property
    def error(self) -> str:
        return self.inner.error if self.inner is not None else ""

    def accepts_eos(self) -> bool:
        return self.inner is None or self.inner.accepts_eos()
