"""The host side both engines share (inferd/engine/host_plan.py): the KV format a device keeps, the sampled rows
and their records, and a sequence's outputs."""
from __future__ import annotations

import numpy as np
import pytest

from inferd import _cpu
from inferd.engine.host_plan import kv_format, sampled_rows, sampling_records, seq_output, step_masks
from inferd.engine.types import SamplingParams, SeqInput


def test_kv_format_per_device():
    assert kv_format("cpu", "q8_0") == "q8_0" and kv_format("cpu", "bf16") == "bf16" and kv_format("cpu") == "f16"
    assert kv_format("cuda", "f16", "BF16") == "bf16"
    with pytest.raises(ValueError, match="kv_cache_dtype must be one of f16, bf16, q8_0, got 'BF16'"):
        kv_format("cpu", "BF16")
    for dtype in ("q8_0", "bf16"):
        with pytest.raises(ValueError, match=f"kv_cache_dtype {dtype} runs on the CPU engine only"):
            kv_format("cuda", dtype)
    with pytest.raises(ValueError, match="cuda_kv must be one of f16, bf16, got 'q8_0'"):
        kv_format("cuda", "f16", "q8_0")


MASK = np.full(4, 0xFFFFFFFF, np.uint32)


def step():
    seqs = [SeqInput([1, 2, 3], 0, [0], num_sampled=1, want_logits=True,
                     params=SamplingParams(temperature=0.5, top_k=3, seed=7, logprobs=1), allowed=MASK),
            SeqInput([4, 5], 3, [0], num_sampled=2, params=SamplingParams(temperature=0.9, seed=(1 << 64) + 9)),
            SeqInput([6], 5, [0], num_sampled=1, allowed=MASK * 0)]
    rows_of_seq = [(0, 3, 2), (3, 2, 0), (5, 1, 0)]     # (first row, rows, first sampled within)
    return seqs, rows_of_seq


def test_sampled_rows_skip_logits_only_rows_and_number_the_masks():
    seqs, rows_of_seq = step()
    rows = list(sampled_rows(seqs, rows_of_seq, 100))
    assert [(r.row, r.k, r.seed, r.mask_row) for r in rows] == [(2, 2, 7, 0), (3, 0, 9, -1), (4, 1, 9, -1),
                                                                (5, 0, rows[-1].seed, 1)]
    assert rows[-1].params.temperature == 0.0       # no params: greedy
    assert step_masks(rows).tolist() == [MASK.tolist(), [0, 0, 0, 0]]


def test_sampled_rows_refuse_what_no_sampler_can_do():
    bad_bias = [SeqInput([1], 0, [0], params=SamplingParams(logit_bias={100: 1.0}))]
    with pytest.raises(ValueError, match="logit_bias token 100 is outside the vocabulary of 100"):
        list(sampled_rows(bad_bias, [(0, 1, 0)], 100))
    drafts = [SeqInput([1, 2], 0, [0], num_sampled=2, allowed=MASK)]
    with pytest.raises(ValueError, match="a grammar's mask applies to one sampled row"):
        list(sampled_rows(drafts, [(0, 2, 0)], 100))


def test_records_fill_sampled_rows_and_leave_the_rest_greedy():
    seqs, rows_of_seq = step()
    p = sampling_records(_cpu.SAMPLE_PARAMS_DTYPE, 6, list(sampled_rows(seqs, rows_of_seq, 100)))
    assert p["temperature"].tolist() == [0.0, 0.0, 0.5, np.float32(0.9), np.float32(0.9), 0.0]
    assert p["top_k"].tolist() == [0, 0, 3, 0, 0, 0] and p["top_p"].tolist() == [1.0] * 6
    assert p["repetition_penalty"].tolist() == [1.0] * 6 and p["seed"][:4].tolist() == [0, 0, 7, 9]


def test_seq_output_takes_the_sequence_s_rows():
    seqs, rows_of_seq = step()
    tokens, logprobs = np.arange(10, 16), np.linspace(-1, -0.5, 6, dtype=np.float32)
    logits = np.arange(12, dtype=np.float32).reshape(6, 2)
    out = seq_output(seqs[0], rows_of_seq[0], tokens, logprobs, lambda s, r, k: [(r, float(k))], logits)
    assert (out.tokens, out.logprobs, out.top_logprobs) == ([12], [logprobs[2]], [[(2, 1.0)]])
    assert np.shares_memory(out.logits, logits) and out.logits.tolist() == logits[:3].tolist()
    copied = seq_output(seqs[0], rows_of_seq[0], tokens, logprobs, lambda *a: [], logits, copy_logits=True)
    assert not np.shares_memory(copied.logits, logits)
    out = seq_output(seqs[1], rows_of_seq[1], tokens, logprobs, lambda *a: [], None)
    assert (out.tokens, out.logprobs, out.logits) == ([13, 14], [], None)
