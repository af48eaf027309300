"""The int8 KV cache's kernels (ext/cpu/attention_q8.c): the writer's Q8_0 rounding, attention over q8_0 K and V
against float64 numpy (causal, bidirectional, sliding windows, GQA, runs starting anywhere in a block), and its
promises: every path gives the same bits, and a token's output does not depend on the other tokens of its run.

Tolerances, stated:
- the cache holds each value to within half its block's step: |x - d q| <= d / 2 (+ f16 rounding of d), d =
  f16(amax / 127) of the 32 values;
- against float64 attention over the values the cache holds and the query as its 8-bit blocks hold it (d * q per 32
  values, the kernel's own rounding of q): 1e-5 of max|v|, float32's rounding of the scale products, softmax sums
  and output sums over a few hundred keys (the integer dot products are exact);
- against float64 attention over the unquantized keys and values: within 2% of max|v| on these random data
  (the model-level accuracy, perplexity within 0.5% of f16, is tests/engine/test_kv_cache_q8_real.py's)."""
from __future__ import annotations

import numpy as np
import pytest

from inferd import _cpu
from tests.ext.paths import PATHS
from tests.ext.test_attention import CASES, reference

BLOCK = _cpu.BLOCK_SIZE


def make_cache_q8(seq_len: int, n_kv: int, hd: int, seed: int):
    """K and V of seq_len positions in a shuffled block table, quantized by the engine's writer: the q8_0 caches,
    the table, the values they hold (seq_len, n_kv, hd) float64 and the float values they were made from."""
    rng = np.random.default_rng(seed)
    n_blocks = (seq_len + BLOCK - 1) // BLOCK
    table = rng.permutation(n_blocks + 2)[:n_blocks].astype(np.int32)
    k = np.zeros((n_blocks + 2, n_kv, BLOCK, hd), np.float32)
    v = np.zeros_like(k)
    keys = (rng.standard_normal((seq_len, n_kv, hd)) * 0.6).astype(np.float32)
    keys[:, :, :4] *= 8                                                   # outlier channels, as real K has
    vals = rng.standard_normal((seq_len, n_kv, hd)).astype(np.float32)
    for p in range(seq_len):
        k[table[p // BLOCK], :, p % BLOCK] = keys[p]
        v[table[p // BLOCK], :, p % BLOCK] = vals[p]
    kq, vq = _cpu.kvq8_pack(k, True), _cpu.kvq8_pack(v, False)
    k_held, v_held = _cpu.kvq8_unpack(kq, hd, True), _cpu.kvq8_unpack(vq, hd, False)
    pos = np.arange(seq_len)
    held_k = k_held[table[pos // BLOCK], :, pos % BLOCK].astype(np.float64)
    held_v = v_held[table[pos // BLOCK], :, pos % BLOCK].astype(np.float64)
    return kq, vq, table, held_k, held_v, keys.astype(np.float64), vals.astype(np.float64)


def held_query(q):
    """q as the kernel's 8-bit blocks hold it (quantize_act, the matmuls' activation rounding): d * q per 32."""
    out = np.empty(q.shape, np.float64)
    for idx in np.ndindex(q.shape[:2]):
        d, _, qs, _ = _cpu.quantize_activations(q[idx])
        out[idx] = (d.astype(np.float64)[:, None] * qs).reshape(-1)
    return out


def test_writer_rounds_to_the_nearest_step():
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((2, 3, BLOCK, 96)) * np.array([1e-3, 1.0, 300.0])[None, :, None, None]).astype(np.float32)
    x[0, 0, 5] = 0.0                                                      # an all-zero row: scale 0, values 0
    for is_k in (True, False):
        cache = _cpu.kvq8_pack(x, is_k)
        assert cache.shape == (2, 3, BLOCK * 96 * 17 // 16)              # 34 bytes per 32 values
        held = _cpu.kvq8_unpack(cache, 96, is_k)
        step = np.abs(x).reshape(2, 3, BLOCK, 3, 32).max(axis=4, keepdims=True) / 127
        err = np.abs(held - x).reshape(2, 3, BLOCK, 3, 32)
        assert np.all(err <= step * (0.5 + 2e-3) + 1e-30)
        assert np.all(held[0, 0, 5] == 0)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("pos0,ntok,causal,window,seq_len", CASES)
@pytest.mark.parametrize("n_heads,n_kv,hd", [(3, 1, 64), (6, 1, 128), (4, 2, 96), (1, 1, 256)])
def test_attention_q8_matches_float64(path, pos0, ntok, causal, window, seq_len, n_heads, n_kv, hd):
    _cpu.set_path(path)
    total = pos0 + ntok if causal else seq_len
    kq, vq, table, held_k, held_v, keys, vals = make_cache_q8(total, n_kv, hd, seed=pos0 + ntok + window)
    q = np.random.default_rng(7).standard_normal((ntok, n_heads, hd)).astype(np.float32)
    scale = 1.0 / np.sqrt(hd) if hd != 256 else 0.0625 * 1.3
    got = _cpu.attention_q8(q, kq, vq, table, pos0, seq_len=seq_len, causal=causal, window=window, scale=scale)
    want = reference(held_query(q), held_k, held_v, pos0, seq_len, causal, window, np.float32(scale))
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(held_v).max())
    exact = reference(q, keys, vals, pos0, seq_len, causal, window, np.float32(scale))
    np.testing.assert_allclose(got, exact, rtol=0, atol=0.02 * np.abs(vals).max())


SHAPES = [(3, 1, 64), (6, 1, 128), (12, 2, 64), (1, 1, 256)]


@pytest.mark.parametrize("n_heads,n_kv,hd", SHAPES)
def test_attention_q8_identical_on_every_path(n_heads, n_kv, hd):
    kq, vq, table, *_ = make_cache_q8(300, n_kv, hd, seed=11)
    q = np.random.default_rng(12).standard_normal((13, n_heads, hd)).astype(np.float32)
    q[2] *= 1e-3
    results = {}
    for p in PATHS:
        _cpu.set_path(p)
        results[p] = [_cpu.attention_q8(q, kq, vq, table, 287),
                      _cpu.attention_q8(q, kq, vq, table, 200, window=40),
                      _cpu.attention_q8(q, kq, vq, table, 150, seq_len=300, causal=False)]
    for p in PATHS[1:]:
        for i, (a, b) in enumerate(zip(results[p], results[PATHS[0]])):
            np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32), err_msg=f"{p} vs {PATHS[0]}, {i}")


@pytest.mark.parametrize("n_heads,n_kv,hd", SHAPES)
def test_attention_q8_token_independent_of_its_run(n_heads, n_kv, hd):
    """Runs of 1, 2, 3 and 4 tokens (rows grouped differently into row sets) give every token the same bits."""
    kq, vq, table, *_ = make_cache_q8(260, n_kv, hd, seed=21)
    q = np.random.default_rng(22).standard_normal((11, n_heads, hd)).astype(np.float32)
    for p in PATHS:
        _cpu.set_path(p)
        for kw in ({}, {"window": 30}):
            alone = _cpu.attention_q8(q, kq, vq, table, 249, run=1, **kw)
            for run in (2, 3, 4):
                got = _cpu.attention_q8(q, kq, vq, table, 249, run=run, **kw)
                np.testing.assert_array_equal(got.view(np.uint32), alone.view(np.uint32), err_msg=f"{p} run {run}")


def test_attention_q8_rejects_bad_shapes():
    kq, vq, table, *_ = make_cache_q8(70, 1, 64, seed=3)
    q = np.zeros((1, 2, 64), np.float32)
    with pytest.raises(ValueError, match="shapes"):
        _cpu.attention_q8(np.zeros((1, 2, 48), np.float32), kq, vq, table, 69)
    with pytest.raises(ValueError, match="block table"):
        _cpu.attention_q8(q, kq, vq, table[:1], 69)
    with pytest.raises(ValueError, match="multiple of 32"):
        _cpu.kvq8_pack(np.zeros((1, 1, BLOCK, 48), np.float32), True)
