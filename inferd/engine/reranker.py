"""Reranker: a cross-encoder in memory and the encoder that scores (query, document) pairs. tokenize_pairs() turns
pairs into token ids (each a TokenPair, which knows where its second text begins, so the token types travel with
the ids through the embedding queue unchanged); embed() scores many pairs in as few encoder calls as the batch
limits allow, as the Embedder embeds texts, and returns each pair's activated logits."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..model.cross_encoder import CrossEncoderModel
from .embedder import Embedder


class TokenPair(list):
    """A pair's token ids; `second` is the index of its first token of type 1 (the document's)."""

    second: int

    def __init__(self, ids: Sequence[int], second: int):
        super().__init__(ids)
        self.second = second


class Reranker(Embedder):
    model: CrossEncoderModel

    def __init__(self, model: CrossEncoderModel, threads: int, max_batch_tokens: int = 8192, max_batch_seqs: int = 256):
        super().__init__(model, threads, max_batch_tokens, max_batch_seqs, float_parts_bf16=False)

    def tokenize_pairs(self, pairs: Sequence[tuple[str, str]]) -> list[TokenPair]:
        """Token ids of each (query, document) with the model's special tokens, cut to max_seq_length the way
        CrossEncoder cuts them (the longer text first)."""
        out = []
        for e in self.model.tokenizer.encode_batch(list(pairs)):
            second = next((i for i, t in enumerate(e.type_ids) if t == 1), len(e.ids))
            out.append(TokenPair(e.ids, second))
        return out

    def embed(self, seqs: Sequence[Sequence[int]]) -> np.ndarray:
        """(len(seqs), labels) float32 scores, in the order given: the activated logits of each pair."""
        out = np.empty((len(seqs), self.dimensions), np.float32)
        for lo, hi in self.batches([len(s) for s in seqs]):
            part = seqs[lo:hi]
            ids = np.fromiter((t for s in part for t in s), np.int32)
            types = np.fromiter((int(i >= getattr(s, "second", len(s))) for s in part for i in range(len(s))), np.int32)
            starts = np.zeros(hi - lo + 1, np.int32)
            np.cumsum([len(s) for s in part], out=starts[1:])
            out[lo:hi], _ = self.encoder.encode(ids, starts, type_ids=types)
        if self.model.activation == "sigmoid":
            out = (1.0 / (1.0 + np.exp(-out.astype(np.float64)))).astype(np.float32)
        return out
