"""A stand-in for the Engine that checks the scheduler's inputs instead of running a model (vLLM-style).

It keeps the token id written at every (block, offset) as its "K/V", and before each step asserts that the
positions a sequence attends to hold exactly that sequence's history: a wrong block table, a bad prefix-cache
hit or a block shared while being written shows up as an assertion here. The "model" samples a token that
depends only on the history (and seed), so a sequence's output is the same alone, batched or preempted.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np

from inferd.engine.types import SamplingParams  # noqa: F401  (re-exported for the tests)

VOCAB = 1000
EOS = 999


@dataclass
class FakeOut:
    tokens: list
    logprobs: list
    top_logprobs: list
    logits: object = None


def fake_next_token(history, seed=None) -> int:
    data = np.asarray(history, dtype=np.int64).tobytes() + str(seed).encode()
    return zlib.crc32(data) % (VOCAB - 1)     # never EOS by itself


class FakeEngine:
    block_size = 64

    def __init__(self, num_kv_blocks=64, max_batch_tokens=256, max_seqs=8, eos_after=None, max_logits_rows=None):
        self.num_kv_blocks = num_kv_blocks
        self.max_batch_tokens = max_batch_tokens
        self.max_logits_rows = max_logits_rows or max_batch_tokens
        self.max_seqs = max_seqs
        self.vocab_size = VOCAB
        self.weight_bytes = 1000
        self.kv_bytes_per_token = 10
        self.kv = np.full((num_kv_blocks, self.block_size), -1, dtype=np.int64)
        self.eos_after = eos_after or {}    # first prompt token -> emit EOS as the n-th generated token
        self.steps = []                     # per step: list of (start_pos, num_tokens, num_sampled)
        self.seeds_seen = []

    def step(self, seqs):
        assert 0 < len(seqs) <= self.max_seqs, len(seqs)
        assert sum(len(s.token_ids) for s in seqs) <= self.max_batch_tokens
        assert sum(len(s.token_ids) if s.want_logits else s.num_sampled for s in seqs) <= self.max_logits_rows
        bs = self.block_size
        written = {}
        for i, s in enumerate(seqs):
            end = s.start_pos + len(s.token_ids)
            assert len(s.block_table) * bs >= end, "block table does not cover the positions"
            assert list(s.history[s.start_pos:end]) == list(s.token_ids)
            for pos in range(s.start_pos, end):
                b = s.block_table[pos // bs]
                assert written.setdefault(b, i) == i, "two sequences write one block in one step"
            # what attention would read: every earlier position must hold this sequence's token
            for pos in range(s.start_pos):
                got = self.kv[s.block_table[pos // bs], pos % bs]
                assert got == s.history[pos], f"stale K/V at position {pos}: {got} != {s.history[pos]}"
        self.steps.append([(s.start_pos, len(s.token_ids), s.num_sampled) for s in seqs])
        outs = []
        for s in seqs:
            for j, tok in enumerate(s.token_ids):
                pos = s.start_pos + j
                self.kv[s.block_table[pos // bs], pos % bs] = tok
            n = len(s.token_ids)
            tokens = []
            seed = s.params.seed if s.params is not None else None
            if s.num_sampled:
                self.seeds_seen.append(seed)
            # one token per sampled row (several when speculative drafts are verified), each from the history
            # up to and including that row's token
            for k in range(n - s.num_sampled, n):
                hist = list(s.history[:s.start_pos + k + 1])
                n_gen = len(hist) - s.num_prompt
                if self.eos_after.get(hist[0]) == n_gen + 1:
                    tokens.append(EOS)
                else:
                    tokens.append(self.next_token(hist, seed))
            want_lp = s.params is not None and s.params.logprobs is not None
            logits = None
            if s.want_logits:
                logits = np.zeros((len(s.token_ids), VOCAB), dtype=np.float32)
                logits[:, 5] = 3.0   # token 5 is the most likely everywhere
            outs.append(FakeOut(tokens, [-0.5] * len(tokens) if want_lp else [],
                                [[(t, -0.5)] for t in tokens] if want_lp else [], logits))
        return outs

    def next_token(self, history, seed=None) -> int:
        return fake_next_token(history, seed)


class CopyingFakeEngine(FakeEngine):
    """A FakeEngine that can copy one KV block to another, as the CPU engine can: the scheduler then hits cached
    prefixes within a block, and step()'s stale-K/V check sees what the copies brought."""

    def copy_kv_block(self, src: int, dst: int) -> None:
        self.kv[dst] = self.kv[src]


def run_alone(prompt, max_tokens, seed=None):
    """The tokens a request must produce, computed without any scheduler."""
    hist = list(prompt)
    for _ in range(max_tokens):
        hist.append(fake_next_token(hist, seed))
    return hist[len(prompt):]

