"""Matchers: one sequence's grammar state (the allowed-token mask for its next token), a compiled grammar that
hands out fresh ones, the step's masks computed in parallel, and the lazy matcher that starts at a trigger token.

LazyMatcher lives here rather than with tool calling: it is a matcher like SequenceMatcher (the scheduler side
holds either, behind the same fill_mask/advance/is_done calls), and only the trigger token it waits for comes
from a tool-call format; so the engine reads grammar state without depending on how tools are written.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import llguidance as llg
import numpy as np

from inferd.text.grammar.spec import GrammarSpec


class SequenceMatcher:
    """One sequence's grammar state: the allowed-token mask for its next token, advanced by what it samples.

    State: running (more tokens needed or allowed), done (the grammar is complete: nothing but EOS may follow, or
    EOS was taken while accepting), error (a token the grammar forbids, or a limit hit; `error` says which).
    """

    __slots__ = ("_eos", "_m")

    def __init__(self, matcher: llg.LLMatcher, eos_ids: frozenset[int]):
        self._m = matcher
        self._eos = eos_ids

    @property
    def llmatcher(self) -> llg.LLMatcher:
        return self._m

    def fill_mask(self, row: np.ndarray) -> bool:
        """Writes the allowed-token bitmask for the next token into `row` (contiguous int32/uint32 words); True
        (a LazyMatcher that has not started says False and leaves the row alone)."""
        if row.dtype.itemsize != 4 or not row.flags.c_contiguous or row.ndim != 1:
            raise ValueError("a mask row must be a contiguous 1-D array of 32-bit words")
        self._m.unsafe_compute_mask_ptr(row.ctypes.data, row.nbytes)
        return True

    def advance(self, token: int) -> bool:
        """Takes the sampled token; False when the grammar does not allow it (the matcher is in error then)."""
        return bool(self._m.consume_token(int(token)))

    def accepts_eos(self) -> bool:
        """The output so far is complete under the grammar (ending here would be valid)."""
        return bool(self._m.is_accepting())

    @property
    def is_done(self) -> bool:
        return bool(self._m.is_stopped()) and not self._m.is_error()

    @property
    def is_error(self) -> bool:
        return bool(self._m.is_error())

    @property
    def error(self) -> str:
        return str(self._m.get_error())

    def rollback(self, num_tokens: int) -> bool:
        return bool(self._m.rollback(num_tokens))


class CompiledGrammar:
    """A grammar compiled against one model's vocabulary; new_matcher() is cheap (a copy of a pristine one)."""

    def __init__(self, spec: GrammarSpec, matcher: llg.LLMatcher, eos_ids: frozenset[int], vocab_size: int):
        self.spec = spec
        self._pristine = matcher
        self._eos = eos_ids
        self.vocab_size = vocab_size  # the mask rows' width in tokens (the model's logits)
        self.warnings: list[str] = list(matcher.get_grammar_warnings())

    def new_matcher(self) -> SequenceMatcher:
        return SequenceMatcher(self._pristine.deep_copy(), self._eos)


def fill_masks(executor: llg.LLExecutor, rows: Sequence[tuple[SequenceMatcher, int]], masks: np.ndarray) -> None:
    """Computes the masks of several matchers in parallel (GIL released): row k of `masks` for each (matcher, k)."""
    if not rows:
        return
    if masks.dtype.itemsize != 4 or masks.ndim != 2 or not masks.flags.c_contiguous:
        raise ValueError("masks must be a contiguous 2-D array of 32-bit words")
    executor.unsafe_compute_mask_ptr(
        [(m.llmatcher, k) for m, k in rows], masks.ctypes.data, masks.shape[1] * 4, masks.shape[0]
    )


@dataclass
class LazyMatcher:
    """A matcher that starts at a trigger token ("auto" tool choice): unconstrained text until the model writes
    the trigger, then the call grammar from that token on (the trigger is the grammar's first token)."""

    compiled: CompiledGrammar
    trigger: int
    active: SequenceMatcher | None = field(default=None)

    def fill_mask(self, row: np.ndarray) -> bool:
        """Writes the mask and returns True once active; False (row untouched) while the text is free."""
        if self.active is None:
            return False
        self.active.fill_mask(row)
        return True

    def advance(self, token: int) -> bool:
        if self.active is None:
            if token != self.trigger:
                return True
            self.active = self.compiled.new_matcher()
        return self.active.advance(token)

    @property
    def is_done(self) -> bool:
        return self.active is not None and self.active.is_done

    @property
    def is_error(self) -> bool:
        return self.active is not None and self.active.is_error

    @property
    def error(self) -> str:
        return self.active.error if self.active is not None else ""

    def accepts_eos(self) -> bool:
        return self.active is None or self.active.accepts_eos()
