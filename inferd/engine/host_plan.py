"""The host side both engines share: which KV cache format a device keeps, the sampled rows' records (each engine
then packs the few fields only its sampler reads), and a step's per-sequence outputs. The model's tensors come to
both from one layer plan (inferd.model.layers)."""

from __future__ import annotations

import random
from dataclasses import dataclass
from collections.abc import Callable, Iterator, Sequence

import numpy as np

from inferd.config import CUDA_KV, KV_CACHE_DTYPES
from inferd.engine.types import GREEDY, SamplingParams, SeqInput, SeqOutput


def kv_format(device: str, kv_cache_dtype: str = "f16", cuda_kv: str = "f16") -> str:
    """The KV cache format of an engine on `device`: kv_cache_dtype on the CPU (f16, bf16 or q8_0), cuda_kv on the GPU
    (f16 or bf16; kv_cache_dtype must then be f16). Raises ValueError naming the setting."""
    if device == "cuda":
        if kv_cache_dtype != "f16":
            raise ValueError(
                f"kv_cache_dtype {kv_cache_dtype} runs on the CPU engine only; on device = cuda the KV "
                f"format is cuda_kv (f16 or bf16)"
            )
        kv = cuda_kv.lower()
        if kv not in CUDA_KV:
            raise ValueError(f"cuda_kv must be one of {', '.join(CUDA_KV)}, got {cuda_kv!r}")
        return kv
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ValueError(f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)}, got {kv_cache_dtype!r}")
    return kv_cache_dtype


@dataclass
class SampledRow:
    """One logits row to sample, with what both engines' samplers need to know of it."""

    row: int  # index among the step's logits rows
    seq: SeqInput
    k: int  # index of the row's token in seq.token_ids
    params: SamplingParams
    seed: int  # the request's seed, or one drawn for this step (unseeded greedy)
    mask_row: int  # index of its grammar mask among the step's masks, or -1


def sampled_rows(
    seqs: Sequence[SeqInput], rows_of_seq: list[tuple[int, int, int]], vocab_size: int
) -> Iterator[SampledRow]:
    """The sampled rows of a step in order (logits-only rows skipped), their grammar masks numbered in that order.
    Raises ValueError for a logit_bias token outside the vocabulary, or a mask on a sequence sampling drafts."""
    masks = 0
    for s, (first, count, first_sampled) in zip(seqs, rows_of_seq):
        sp = s.params or GREEDY
        bad = [t for t in (sp.logit_bias or ()) if not 0 <= int(t) < vocab_size]
        if bad:
            raise ValueError(f"logit_bias token {bad[0]} is outside the vocabulary of {vocab_size}")
        seed = (sp.seed if sp.seed is not None else random.getrandbits(64)) & 0xFFFFFFFFFFFFFFFF
        n = len(s.token_ids)
        for r in range(first + first_sampled, first + count):
            mask_row = -1
            if s.allowed is not None:
                if s.num_sampled != 1:
                    raise ValueError("a grammar's mask applies to one sampled row (no drafts)")
                mask_row, masks = masks, masks + 1
            yield SampledRow(r, s, n - (first + count - r), sp, seed, mask_row)


def sampling_records(dtype: np.dtype, n_out: int, rows: list[SampledRow]) -> np.ndarray:
    """One record per logits row in an engine's sampler layout (`dtype`), with the fields both samplers read filled
    in: logits-only rows greedy with nothing to adjust, sampled rows with their parameters and seed."""
    p = np.zeros(n_out, dtype)
    p["top_p"] = 1.0
    p["repetition_penalty"] = 1.0
    for row in rows:
        sp, rec = row.params, p[row.row]
        rec["temperature"], rec["top_p"], rec["min_p"], rec["top_k"] = sp.temperature, sp.top_p, sp.min_p, sp.top_k
        rec["repetition_penalty"] = sp.repetition_penalty
        rec["presence_penalty"], rec["frequency_penalty"] = sp.presence_penalty, sp.frequency_penalty
        rec["seed"] = row.seed
    return p


def step_masks(rows: list[SampledRow]) -> np.ndarray | None:
    """The grammars' masks of the step, stacked in their mask_row order (None when no row has one)."""
    masks = [row.seq.allowed for row in rows if row.mask_row >= 0]
    return np.stack(masks) if masks else None  # type: ignore[arg-type]


def penalty_history(s: SeqInput, k: int) -> list[int]:
    """The sequence as known when sampling after token_ids[k]: its history, plus the tokens of this step (draft
    tokens of speculative decoding) that the history does not hold yet."""
    known = s.start_pos + k + 1
    return list(s.history[:known]) + list(s.token_ids[max(0, len(s.history) - s.start_pos) : k + 1])


# a sampled row's top-k (token, logprob) list: (sequence, logits row, k = its params.logprobs)
TopLogprobs = Callable[[SeqInput, int, int], list[tuple[int, float]]]


def seq_output(
    s: SeqInput,
    rows: tuple[int, int, int],
    tokens: np.ndarray,
    logprobs: np.ndarray,
    top_logprobs: TopLogprobs,
    logits: np.ndarray | None,
    copy_logits: bool = False,
) -> SeqOutput:
    """A sequence's part of a step's results: the tokens sampled on its rows (rows = (first, count, first sampled
    within)), their logprobs and top logprobs when asked for, its logits rows when it wants them."""
    first, count, first_sampled = rows
    out = SeqOutput()
    sampled = range(first + first_sampled, first + count)
    out.tokens = [int(tokens[r]) for r in sampled]
    sp = s.params
    if sp is not None and sp.logprobs is not None:
        out.logprobs = [float(logprobs[r]) for r in sampled]
        out.top_logprobs = [top_logprobs(s, r, sp.logprobs) for r in sampled]
    if s.want_logits:
        assert logits is not None  # a step returns logits when a sequence wants them
        out.logits = logits[first : first + count]
        if copy_logits:
            out.logits = out.logits.copy()
    return out
