"""Constrained sequences on the scheduler side: each one's matcher, the step's packed mask rows for the C sampler,
and what a sampled token does to the matcher.

A request carries a `Constraint`: a grammar compiled on the HTTP side, and whether it is lazy (tool calls under
tool_choice "auto" start at a trigger token); and/or a reasoning budget, which forces the end of the thinking
(inferd.text.grammar.budget). Each of its choices gets its own matcher at admission. Before a step,
`StepMasks.build` fills one mask row per constrained sampled row (llguidance's executor, several matchers in
parallel with the GIL released) and says which row each sequence uses; after it, `Constraint.advance` feeds the
sampled token and reports whether the choice goes on, is complete (the grammar accepts and nothing can follow)
or failed."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import llguidance as llg
import numpy as np

from inferd.text.grammar import CompiledGrammar, LazyMatcher, SequenceMatcher, fill_masks, mask_words
from inferd.text.grammar.budget import BudgetMatcher, ThinkingBudget

Matcher = SequenceMatcher | LazyMatcher | BudgetMatcher


@dataclass(frozen=True)
class Constraint:
    grammar: CompiledGrammar | None
    trigger_token: int | None = None  # set: lazy, unconstrained until this token is sampled
    budget: ThinkingBudget | None = None  # set: the thinking's end is forced past its budget

    def __post_init__(self) -> None:
        if self.grammar is None and self.budget is None:
            raise ValueError("a constraint needs a grammar or a budget")

    def new_matcher(self) -> Matcher:
        inner: SequenceMatcher | LazyMatcher | None = None
        if self.grammar is not None:
            inner = (
                LazyMatcher(self.grammar, self.trigger_token)
                if self.trigger_token is not None
                else self.grammar.new_matcher()
            )
        if self.budget is not None:
            return self.budget.new_matcher(inner)
        assert inner is not None
        return inner

    def new_mask(self) -> np.ndarray:
        """A mask row for one sequence: (vocab + 31) // 32 uint32 words."""
        vocab = self.grammar.vocab_size if self.grammar is not None else self.budget.vocab_size if self.budget else 0
        return np.zeros(mask_words(vocab), np.uint32)

    @staticmethod
    def advance(matcher: Matcher, token: int, eos_ids: frozenset[int]) -> Advance:
        """Feeds one sampled token. An end-of-sequence token is accepted only where the grammar may end."""
        if token < 0:
            return Advance(False, False, "the grammar allows no token here")
        if token in eos_ids and isinstance(matcher, LazyMatcher) and matcher.active is None:
            return Advance(True, True)
        if not matcher.advance(token):
            return Advance(False, False, matcher.error or "the sampled token is outside the grammar")
        return Advance(True, matcher.is_done)


@dataclass(frozen=True)
class Advance:
    ok: bool  # the token was allowed
    done: bool  # the grammar is complete: end the choice here ("stop")
    error: str | None = None  # why the matcher failed (a token outside the grammar, a limit)


class StepMasks:
    """A reusable (max_rows, words) mask buffer and the executor that fills it."""

    def __init__(self, vocab_size: int, max_rows: int, threads: int = 1):
        self.words = mask_words(vocab_size)
        self.buffer = np.zeros((max(1, max_rows), self.words), np.uint32)
        self.executor = llg.LLExecutor(num_threads=max(1, threads))

    def build(self, matchers: Sequence[SequenceMatcher | LazyMatcher | None]) -> tuple[np.ndarray | None, list[int]]:
        """matchers: one per sampled row (None: unconstrained). Returns (token_masks or None, mask_row per row:
        -1 for an unconstrained row or a lazy matcher that has not started)."""
        rows: list[int] = []
        full: list[tuple[SequenceMatcher, int]] = []
        n = 0
        for m in matchers:
            inner = m.active if isinstance(m, LazyMatcher) else m
            if inner is None:
                rows.append(-1)
                continue
            if n == len(self.buffer):
                self.buffer = np.zeros((2 * n, self.words), np.uint32)
            full.append((inner, n))
            rows.append(n)
            n += 1
        if not full:
            return None, rows
        fill_masks(self.executor, full, self.buffer[:n])
        return self.buffer[:n], rows
