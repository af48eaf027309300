"""Prompt-lookup speculative decoding.

Drafts come from the sequence itself: find the latest earlier occurrence of its last n tokens (n from 4 down to
2) and propose the tokens that followed it. The engine verifies the drafts in one step (the decode token plus the
drafts, each row sampled), and drafts are accepted up to the first one that differs from what was sampled.

Why the output is exactly plain decoding's: a row's logits are bitwise the same in any batch shape, and the
sampler's random number depends only on (seed, position); so the token sampled after an accepted draft is the
token plain decoding would have sampled there, greedy or seeded.

The gate stops drafting where it does not pay: when fewer than 30% of the drafted tokens of the last 10 attempts
were accepted, speculation pauses, for 10 steps the first time and twice as long each time after (at most 80),
until an attempt window is good again.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence


class PromptLookup:
    """An index of the sequence's n-grams (2 to 4 tokens) to the latest place each occurred with a token after
    it, updated as tokens arrive, so a proposal costs a few dictionary lookups rather than a scan."""

    def __init__(self, tokens: Sequence[int] = (), max_draft: int = 4, min_ngram: int = 2, max_ngram: int = 4):
        self.tokens: list[int] = []
        self.index: dict[tuple[int, ...], int] = {}
        self.max_draft, self.min_ngram, self.max_ngram = max_draft, min_ngram, max_ngram
        self.extend(tokens)

    def extend(self, tokens: Sequence[int]) -> None:
        for token in tokens:
            self.tokens.append(token)
            end = len(self.tokens) - 2  # n-grams ending here now have a token after them
            for n in range(self.min_ngram, self.max_ngram + 1):
                if end - n + 1 >= 0:
                    self.index[tuple(self.tokens[end - n + 1 : end + 1])] = end - n + 1

    def propose(self) -> list[int]:
        """Tokens that followed the latest earlier match of the last n tokens, longest n first."""
        for n in range(self.max_ngram, self.min_ngram - 1, -1):
            if len(self.tokens) <= n:
                continue
            start = self.index.get(tuple(self.tokens[-n:]))
            if start is not None:
                return self.tokens[start + n : start + n + self.max_draft]
        return []


def accept(draft: Sequence[int], sampled: Sequence[int]) -> list[int]:
    """Tokens to append after verifying `draft`: sampled[i] is what the model chose after draft[:i] (one more than
    the drafts). Keeps drafts while they agree, then the model's own token at the first disagreement (or the
    extra token when every draft was right)."""
    out = []
    for i, token in enumerate(sampled):
        out.append(token)
        if i >= len(draft) or draft[i] != token:
            break
    return out


class AcceptanceGate:
    """Pauses speculation while it mostly fails (see the module doc)."""

    def __init__(self, window: int = 10, min_rate: float = 0.3, first_pause: int = 10, max_pause: int = 80):
        self.attempts: deque[tuple[int, int]] = deque(maxlen=window)  # (drafted, accepted)
        self.min_rate = min_rate
        self.first_pause = first_pause
        self.max_pause = max_pause
        self.next_pause = first_pause
        self.paused_for = 0

    def allow(self) -> bool:
        """Whether to draft this step (counts a paused step)."""
        if self.paused_for > 0:
            self.paused_for -= 1
            return False
        return True

    def record(self, drafted: int, accepted: int) -> None:
        if drafted <= 0:
            return
        self.attempts.append((drafted, accepted))
        if len(self.attempts) < (self.attempts.maxlen or 0):
            return
        total = sum(d for d, _ in self.attempts)
        rate = sum(a for _, a in self.attempts) / total
        if rate < self.min_rate:
            self.paused_for = self.next_pause
            self.next_pause = min(2 * self.next_pause, self.max_pause)
            self.attempts.clear()
        else:
            self.next_pause = self.first_pause

    @property
    def acceptance_rate(self) -> float | None:
        total = sum(d for d, _ in self.attempts)
        return sum(a for _, a in self.attempts) / total if total else None
