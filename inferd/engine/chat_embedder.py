"""A chat model used as an embedding model (the `pooling` setting, as vLLM's pooling runner allows): each input's
final hidden states (after the model's final norm) from the C forward pass without logits, pooled (the last
token's row, or the mean of all rows) and L2-normalized.

It has the Embedder's interface (tokenize, check_ids, embed, model.*), so the embedding queue, the
/v1/embeddings handler and the metrics serve it like any embedding model. Its forward passes run on a context of
their own (scratch and a KV cache just big enough for one batch) that shares the chat engine's weights; the queue's
steps run on the engine loop's thread, between the chat model's steps, so the two never run at once."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from .. import _cpu
from .embedder import InputTooLong, check_vocab, pack_batches

POOLING_MODES = ("none", "last", "mean")


@dataclass
class ChatEmbeddingModel:
    """What the server reads of an embedding model (EmbeddingModel's fields) for a chat model."""

    name: str
    dimensions: int
    max_seq_length: int
    pooling: str
    vocab: int
    normalize: bool = True
    matryoshka_dims: tuple[int, ...] = ()
    prompts: dict[str, str] = field(default_factory=dict)
    default_prompt: str | None = None


class ChatEmbedder:
    def __init__(
        self,
        engine,
        tokenizer,
        pooling: str,
        *,
        name: str,
        threads: int,
        max_batch_tokens: int = 2048,
        max_batch_seqs: int = 64,
    ):
        if pooling not in ("last", "mean"):
            raise ValueError(f"pooling must be 'last' or 'mean' to embed with a chat model, not {pooling!r}")
        cpu_model = getattr(engine, "_model", None)
        if not isinstance(cpu_model, _cpu.Model):
            raise ValueError("pooling (embeddings from the chat model) needs the CPU engine")
        if getattr(engine, "num_state_slots", 0):
            raise ValueError("pooling (embeddings from the chat model) is not built for models with recurrent layers")
        self.tokenizer = tokenizer
        self.pooling = pooling
        self.block_size = engine.block_size
        self.max_batch_tokens = max(1, min(max_batch_tokens, engine.context_length))
        self.max_batch_seqs = max_batch_seqs
        # every sequence of a batch rounds up to whole KV blocks
        blocks = -(-self.max_batch_tokens // self.block_size) + max_batch_seqs
        self.ctx = _cpu.Context(cpu_model, self.max_batch_tokens, 1, blocks, threads)
        self.dimensions = self.ctx.dim
        self.model = ChatEmbeddingModel(name, self.dimensions, self.max_batch_tokens, pooling, engine.vocab_size)

    @property
    def max_seq_length(self) -> int:
        return self.model.max_seq_length

    def tokenize(self, texts: Sequence[str], input_type: str | None = None, truncate: bool = False) -> list[list[int]]:
        """Token ids as the chat model's tokenizer gives them (BOS where the model wants one, no template)."""
        if input_type not in (None, "query", "document"):
            raise ValueError(f"input_type {input_type!r} is not one of this model's prompts (none)")
        out = [self.tokenizer.encode(t) for t in texts]
        return self._limit(out, truncate)

    def check_ids(self, seqs: Sequence[Sequence[int]], truncate: bool = False) -> list[list[int]]:
        check_vocab(seqs, self.model.vocab)
        return self._limit([list(s) for s in seqs], truncate)

    def _limit(self, seqs: list[list[int]], truncate: bool) -> list[list[int]]:
        limit = self.max_seq_length
        for i, ids in enumerate(seqs):
            if len(ids) > limit:
                if not truncate:
                    raise InputTooLong(i, len(ids), limit)
                seqs[i] = ids[:limit]
        return seqs

    def hidden(self, seqs: Sequence[Sequence[int]]) -> list[np.ndarray]:
        """Each input's final hidden states (len, dim) after the final norm, from the C forward pass."""
        out: list[np.ndarray] = []
        for lo, hi in pack_batches([len(s) for s in seqs], self.max_batch_tokens, self.max_batch_seqs):
            batch = seqs[lo:hi]
            lens = [len(s) for s in batch]
            nblocks = [-(-n // self.block_size) for n in lens]
            tables = np.zeros((len(batch), max(nblocks)), np.int32)
            first = np.cumsum([0] + nblocks)
            for i, n in enumerate(nblocks):
                tables[i, :n] = np.arange(first[i], first[i] + n)
            tokens = np.fromiter((t for s in batch for t in s), np.int32)
            positions = np.concatenate([np.arange(n, dtype=np.int32) for n in lens])
            seq_of = np.repeat(np.arange(len(batch), dtype=np.int32), lens)
            rows = self.ctx.final_hidden(tokens, positions, seq_of, tables)
            starts = np.cumsum([0] + lens)
            out.extend(rows[starts[i] : starts[i + 1]] for i in range(len(batch)))
        return out

    def embed(self, seqs: Sequence[Sequence[int]]) -> np.ndarray:
        """(len(seqs), dim) float32, pooled and L2-normalized, in the order given."""
        vectors = np.empty((len(seqs), self.dimensions), np.float32)
        for i, rows in enumerate(self.hidden(seqs)):
            v = rows[-1] if self.pooling == "last" else rows.mean(axis=0, dtype=np.float64)
            vectors[i] = v / max(float(np.linalg.norm(v)), 1e-12)
        return vectors
