"""Embedder: an embedding model in memory and the encoder that runs it. tokenize() turns texts into token ids
(prompts, limits, truncation), embed() turns many token-id sequences into vectors, packing them into as few
encoder calls as the batch limits allow (one nogil C call each: all layers, pooling, Dense, normalization)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .. import _cpu
from ..model.embedding import EmbeddingModel


class InputTooLong(ValueError):
    def __init__(self, index: int, length: int, limit: int):
        self.index, self.length, self.limit = index, length, limit
        super().__init__(
            f"input {index} has {length} tokens, more than the model's maximum of {limit}; shorten it or set truncate"
        )


def check_vocab(seqs: Sequence[Sequence[int]], vocab: int) -> None:
    """Every input holds at least one token and only ids of the vocabulary; the error names the input."""
    for i, ids in enumerate(seqs):
        if not ids:
            raise ValueError(f"input {i} is empty")
        bad = next((t for t in ids if not 0 <= t < vocab), None)
        if bad is not None:
            raise ValueError(f"input {i} holds token id {bad}, outside this model's vocabulary of {vocab}")


class Embedder:
    def __init__(
        self,
        model: EmbeddingModel,
        threads: int,
        max_batch_tokens: int = 8192,
        max_batch_seqs: int = 256,
        float_parts_bf16: bool | None = None,
    ):
        """float_parts_bf16: whether the float part of a quantized model's Wqkv (BERT's Wk|Wv under --quantize) runs
        in bf16, weights and activations rounded (ext/cpu/gemm_panels.c); None: where the CPU runs bf16 dot products
        faster than f32 ones (on AMD Zen 4 2.2x; on the Intel Xeons measured, slower)."""
        self.model = model
        self.max_batch_tokens = max(max_batch_tokens, model.max_seq_length)
        self.max_batch_seqs = max_batch_seqs
        _cpu.release_free_memory()  # what an earlier model freed: not under this one's peak
        if float_parts_bf16 is None:
            float_parts_bf16 = _cpu.encoder_bf16_preferred()
        self.float_parts_bf16 = float_parts_bf16 and any(k.endswith(".wqkv_f") for k in model.tensors)
        config = {**model.config, "wqkv_f_bf16": self.float_parts_bf16}
        self.weights = _cpu.EncoderModel(config, model.tensors)
        # the encoder holds its own copy of every matrix and a reference to each array it reads in place (vectors,
        # a float token embedding, which stays a view of the mapped file), so the loaded arrays go now
        model.tensors.clear()
        _cpu.release_free_memory()
        self.encoder = _cpu.Encoder(self.weights, self.max_batch_tokens, max_batch_seqs, threads)
        self.dimensions = model.dimensions

    @property
    def max_seq_length(self) -> int:
        return self.model.max_seq_length

    def prompt(self, input_type: str | None) -> str:
        """The prefix for input_type ('query', 'document', or any prompt name the model defines); '' for None, and
        for 'query' / 'document' on a model that has no such prompts (it embeds both kinds alike)."""
        name = input_type if input_type is not None else self.model.default_prompt
        if name is None or (name in ("query", "document") and name not in self.model.prompts):
            return ""
        if name not in self.model.prompts:
            known = ", ".join(sorted(self.model.prompts)) or "none"
            raise ValueError(f"input_type {name!r} is not one of this model's prompts ({known})")
        return self.model.prompts[name]

    def tokenize(self, texts: Sequence[str], input_type: str | None = None, truncate: bool = False) -> list[list[int]]:
        """Token ids of each text with the prompt prepended and the model's special tokens; an input over
        max_seq_length raises InputTooLong naming its index, or is cut as sentence-transformers cuts it."""
        prefix = self.prompt(input_type)
        full = [prefix + t for t in texts]
        out = [e.ids for e in self.model.tokenizer.encode_batch(full)]
        long = [i for i, ids in enumerate(out) if len(ids) > self.max_seq_length]
        if long and not truncate:
            raise InputTooLong(long[0], len(out[long[0]]), self.max_seq_length)
        if long:
            cut = self.model.truncating_tokenizer.encode_batch([full[i] for i in long])
            for i, e in zip(long, cut):
                out[i] = e.ids
        return out

    def check_ids(self, seqs: Sequence[Sequence[int]], truncate: bool = False) -> list[list[int]]:
        """Token-id inputs as given (no special tokens added), checked against the vocabulary and the length limit."""
        check_vocab(seqs, self.model.config["vocab"])
        out = []
        for i, ids in enumerate(seqs):
            if len(ids) > self.max_seq_length:
                if not truncate:
                    raise InputTooLong(i, len(ids), self.max_seq_length)
                ids = ids[: self.max_seq_length]
            out.append(list(ids))
        return out

    def embed(self, seqs: Sequence[Sequence[int]]) -> np.ndarray:
        """(len(seqs), dimensions) float32, in the order given."""
        out = np.empty((len(seqs), self.dimensions), np.float32)
        for lo, hi in self.batches([len(s) for s in seqs]):
            ids = np.fromiter((t for s in seqs[lo:hi] for t in s), np.int32)
            starts = np.zeros(hi - lo + 1, np.int32)
            np.cumsum([len(s) for s in seqs[lo:hi]], out=starts[1:])
            out[lo:hi], _ = self.encoder.encode(ids, starts)
        return out

    def batches(self, lengths: Sequence[int]) -> list[tuple[int, int]]:
        """Consecutive [lo, hi) ranges that each fit the encoder's token and sequence limits."""
        return pack_batches(lengths, self.max_batch_tokens, self.max_batch_seqs)


def pack_batches(lengths: Sequence[int], max_tokens: int, max_seqs: int) -> list[tuple[int, int]]:
    """Consecutive [lo, hi) ranges of inputs that each fit max_tokens tokens and max_seqs inputs (an input longer
    than max_tokens gets a range of its own)."""
    ranges, lo, tokens = [], 0, 0
    for i, n in enumerate(lengths):
        if i > lo and (tokens + n > max_tokens or i - lo == max_seqs):
            ranges.append((lo, i))
            lo, tokens = i, 0
        tokens += n
    if lengths:
        ranges.append((lo, len(lengths)))
    return ranges


def truncate_dimensions(vectors: np.ndarray, dimensions: int, normalize: bool) -> np.ndarray:
    """Matryoshka: the first `dimensions` values of each vector, L2-renormalized when the model normalizes."""
    v = np.ascontiguousarray(vectors[:, :dimensions])
    if normalize:
        v /= np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-12)
    return v
