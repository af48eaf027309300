"""A step's sequences -> the flat arrays both engines take (tokens of every sequence one after another, prefill
chunks and decode tokens mixed), with every input checked and named when wrong."""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Sequence

import numpy as np

from inferd.config import KV_CACHE_DTYPES
from inferd.engine.types import BLOCK_SIZE, SeqInput


@dataclass
class FlatBatch:
    tokens: np.ndarray  # (num_tokens,) int32
    positions: np.ndarray  # (num_tokens,) int32
    seq_of_token: np.ndarray  # (num_tokens,) int32
    block_tables: np.ndarray  # (num_seqs, blocks of the longest) int32
    out_rows: np.ndarray  # (num_out,) int32: token index of each logits row, ascending
    sample_mask: np.ndarray  # (num_out,) int32: 1 where the row is sampled
    rows_of_seq: list[tuple[int, int, int]]  # per sequence: (first out row, rows, first sampled row within)
    state_slots: np.ndarray | None = None  # (num_seqs,) int32: each sequence's recurrent-state slot


def flatten(
    seqs: Sequence[SeqInput],
    *,
    vocab_size: int,
    context_length: int,
    num_kv_blocks: int,
    max_seqs: int,
    max_batch_tokens: int,
    max_logits_rows: int,
) -> FlatBatch:
    """Raises ValueError naming the sequence and the problem."""
    if len(seqs) > max_seqs:
        raise ValueError(f"{len(seqs)} sequences in one step; the engine takes at most {max_seqs}")
    tokens: list[int] = []
    positions: list[int] = []
    seq_of_token: list[int] = []
    out_rows: list[int] = []
    mask: list[int] = []
    rows_of_seq: list[tuple[int, int, int]] = []
    width = 1
    for i, s in enumerate(seqs):
        n = len(s.token_ids)
        if n == 0:
            raise ValueError(f"sequence {i} has no tokens")
        if not 0 <= s.num_sampled <= n:
            raise ValueError(f"sequence {i}: num_sampled {s.num_sampled} with {n} tokens")
        bad = [t for t in s.token_ids if not 0 <= t < vocab_size]
        if bad:
            raise ValueError(f"sequence {i}: token id {bad[0]} is outside the vocabulary of {vocab_size}")
        end = s.start_pos + n
        if s.start_pos < 0 or end > context_length:
            raise ValueError(
                f"sequence {i}: positions {s.start_pos}..{end - 1} are outside the context of {context_length}"
            )
        used = -(-end // BLOCK_SIZE)
        if len(s.block_table) < used:
            raise ValueError(f"sequence {i}: {len(s.block_table)} KV blocks cannot hold {end} positions")
        bad = [b for b in s.block_table[:used] if not 0 <= b < num_kv_blocks]
        if bad:
            raise ValueError(f"sequence {i}: KV block {bad[0]} does not exist (the cache has {num_kv_blocks})")
        if s.params is not None:
            s.params.validate()
        base = len(tokens)
        tokens.extend(s.token_ids)
        positions.extend(range(s.start_pos, end))
        seq_of_token.extend([i] * n)
        first_row = len(out_rows)
        first_logit = 0 if s.want_logits else n - s.num_sampled
        out_rows.extend(range(base + first_logit, base + n))
        mask.extend(int(k >= n - s.num_sampled) for k in range(first_logit, n))
        rows_of_seq.append((first_row, n - first_logit, n - s.num_sampled - first_logit))
        width = max(width, used)
    if len(tokens) > max_batch_tokens:
        raise ValueError(f"{len(tokens)} tokens in one step; the engine takes at most {max_batch_tokens}")
    if len(out_rows) > max_logits_rows:
        raise ValueError(f"{len(out_rows)} logits rows in one step; at most {max_logits_rows}")
    slots = [s.state_slot for s in seqs]
    tables = np.zeros((len(seqs), width), np.int32)
    for i, s in enumerate(seqs):
        k = min(width, len(s.block_table))
        tables[i, :k] = s.block_table[:k]
    return FlatBatch(
        np.asarray(tokens, np.int32),
        np.asarray(positions, np.int32),
        np.asarray(seq_of_token, np.int32),
        tables,
        np.asarray(out_rows, np.int32),
        np.asarray(mask, np.int32),
        rows_of_seq,
        np.asarray(slots, np.int32),
    )


def kv_bytes_per_token(config, kv_cache_dtype: str = "f16") -> int:
    """K and V of every attention layer (a hybrid's recurrent layers keep none): 16 bits a value (f16, bf16), or
    Q8_0's 34 bytes per 32 values (q8_0)."""
    layers = config.n_layers - len(getattr(config, "recurrent_layers", ()))
    values = 2 * layers * config.n_kv_heads * config.head_dim
    if kv_cache_dtype in ("f16", "bf16"):
        return 2 * values
    if kv_cache_dtype == "q8_0":
        return values * 34 // 32
    raise ValueError(f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)}, got {kv_cache_dtype!r}")


def state_bytes_per_seq(config) -> int:
    """One sequence's recurrent state (float32), 0 for a model without recurrent layers."""
    return 4 * getattr(config, "state_floats", 0) if getattr(config, "recurrent_layers", ()) else 0


class EngineShape:
    """What both engines were sized for, and the check of a step against it."""

    block_size = BLOCK_SIZE
    supports_lora = False  # SeqInput.lora (the CPU engine's add_adapter)

    def __init__(
        self,
        model,
        *,
        num_kv_blocks: int,
        max_batch_tokens: int,
        max_seqs: int,
        max_logits_rows: int | None,
        kv_cache_dtype: str = "f16",
    ):
        cfg = model.config
        self.model = model
        self.config = cfg
        self.vocab_size = cfg.vocab_size
        self.context_length = cfg.context_length
        self.max_batch_tokens = max_batch_tokens
        self.max_seqs = max_seqs
        self.num_kv_blocks = num_kv_blocks
        # speculative verification samples up to 5 rows per sequence
        self.max_logits_rows = min(max_logits_rows or max(64, 5 * max_seqs), max_batch_tokens)
        self.kv_cache_dtype = kv_cache_dtype
        self.kv_bytes_per_token = kv_bytes_per_token(cfg, kv_cache_dtype)

    @staticmethod
    def kv_blocks_for_bytes(config, nbytes: int, kv_cache_dtype: str = "f16") -> int:
        """Blocks of `kv_cache_dtype` that fit in nbytes (q8_0: 32/17 times the f16 count)."""
        return max(1, nbytes // (kv_bytes_per_token(config, kv_cache_dtype) * BLOCK_SIZE))

    def flatten(self, seqs: Sequence[SeqInput]) -> FlatBatch:
        return flatten(
            seqs,
            vocab_size=self.vocab_size,
            context_length=self.context_length,
            num_kv_blocks=self.num_kv_blocks,
            max_seqs=self.max_seqs,
            max_batch_tokens=self.max_batch_tokens,
            max_logits_rows=self.max_logits_rows,
        )
