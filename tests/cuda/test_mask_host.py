"""The host side of grammar masks on the CUDA engine (runs without a GPU): the numpy reference the GPU tests compare
against agrees with the real CPU sampler under a mask, the engine's top logprobs of a masked row are the CPU
sampler's, and the per-row mask flags and rows the engine hands to the step."""
import numpy as np
import pytest

from inferd import _cpu
from inferd.engine.cuda_engine import _masked, _top_logprobs
from tests.cuda.cuda_ref import cpu_sample, pack_mask, unpack_mask

CASES = [dict(temperature=0.0), dict(temperature=1.0), dict(temperature=0.7, top_k=5),
         dict(temperature=1.0, top_p=0.8), dict(temperature=1.2, min_p=0.05),
         dict(temperature=1.0, top_k=50, top_p=0.9), dict(temperature=1.0, top_k=40, top_p=0.6, min_p=0.1)]


def test_pack_mask_is_the_samplers_layout():
    ok = np.zeros(70, bool)
    ok[[0, 31, 32, 69]] = True
    words = pack_mask(ok)
    assert words.dtype == np.dtype("<u4") and words.tolist() == [1 | (1 << 31), 1, 1 << 5]
    assert np.array_equal(unpack_mask(words, 70), ok)


@pytest.mark.parametrize("case", range(len(CASES)))
def test_reference_agrees_with_the_cpu_sampler_under_a_mask(case):
    rng = np.random.default_rng(case)
    V, n = 3001, 120
    for i in range(n):
        logits = (rng.standard_normal(V) * rng.uniform(0.5, 5)).astype(np.float32)
        ok = rng.random(V) < rng.choice([0.002, 0.05, 0.5])
        ok[rng.integers(V)] = True
        words = pack_mask(ok)
        p = dict(CASES[case], seed=int(rng.integers(1 << 62)))
        want, want_lp = cpu_sample(logits, p, i, allowed=words)
        tok, lp, _, _ = _cpu.sample(logits, {**p, "num_logprobs": 0}, i, allowed=words)
        assert ok[tok] and tok == want, f"row {i}: the reference drew {want}, the CPU sampler {tok}"
        assert abs(lp - want_lp) < 1e-4 * max(1.0, abs(want_lp))


def test_masked_top_logprobs_are_the_cpu_samplers():
    rng = np.random.default_rng(7)
    V = 1000
    for allowed_count in (2, 5, 300):
        logits = (rng.standard_normal(V) * 3).astype(np.float32)
        ok = np.zeros(V, bool)
        ok[rng.choice(V, allowed_count, replace=False)] = True
        words = pack_mask(ok)
        _, _, cpu_ids, cpu_lps = _cpu.sample(logits, {"temperature": 0.0, "num_logprobs": 5}, 0, allowed=words)
        cpu_top = [(t, lp) for t, lp in zip(cpu_ids, cpu_lps) if t >= 0]
        top = _top_logprobs(_masked(logits, words), 5)
        assert [t for t, _ in top] == [t for t, _ in cpu_top] and len(top) == min(5, allowed_count)
        assert np.allclose([lp for _, lp in top], [lp for _, lp in cpu_top], atol=1e-5)
    assert _masked(logits, None) is logits


def test_sampling_arrays_carry_masks_without_gpu():
    """Each constrained sampled row gets has_mask and the index of its mask among the step's; logits-only rows and
    free sequences get none; a mask on a drafting sequence is refused."""
    try:
        from inferd import _cuda
        from inferd.engine import cuda_engine
        from inferd.engine.types import SamplingParams, SeqInput
    except ImportError as e:
        pytest.skip(f"inferd._cuda is not built ({e})")
    eng = cuda_engine.CudaEngine.__new__(cuda_engine.CudaEngine)
    eng._cu, eng.vocab_size, eng.max_adj = _cuda, 100, 1000
    m0, m2 = pack_mask(np.arange(100) < 10), pack_mask(np.arange(100) % 7 == 0)
    sp = SamplingParams(temperature=0.5, seed=1)
    seqs = [SeqInput([1, 2, 3], 0, [0], 1, sp, allowed=m0), SeqInput([4], 5, [1], 1, sp),
            SeqInput([5, 6], 9, [2], 1, sp, allowed=m2)]
    rows_of_seq = [(0, 3, 2), (3, 1, 0), (4, 2, 1)]   # (first row, rows, logits-only rows before the sampled)
    params, _, _, masks, _ = eng._sampling_arrays(seqs, rows_of_seq, [0, 1, 2, 5, 9, 10], list(range(6)))
    assert params["has_mask"].tolist() == [0, 0, 1, 0, 0, 1]
    assert params["mask_row"][2] == 0 and params["mask_row"][5] == 1
    assert np.array_equal(masks, np.stack([m0, m2])) and masks.dtype == np.uint32
    _, _, _, none, _ = eng._sampling_arrays(seqs[1:2], [(0, 1, 0)], [5], [0])
    assert none is None
    with pytest.raises(ValueError, match="no drafts"):
        eng._sampling_arrays([SeqInput([1, 2], 0, [0], 2, sp, allowed=m0)], [(0, 2, 0)], [0, 1], [0, 1])
