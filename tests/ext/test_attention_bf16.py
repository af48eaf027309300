"""Attention over the bf16 KV cache (inferd._cpu.attention(kv_dtype="bf16") over ext/cpu/attention_bf16.c): the
cache's rounding of K and V, the result against float64 numpy computed on the same bf16 operands, and the promises the
f16 cache keeps: every path gives the same bits (VDPBF16PS on AVX-512 BF16, two fmas per pair elsewhere), and a
token's output is the same in a run of 16, of 5, alone, and split into key segments merged in order.

Tolerance against float64: the reference takes q, K and V rounded to bf16 as the kernel does, and the exact softmax
weights; the kernel rounds each weight to bf16 (relative to its block's running maximum) before it meets V, which
moves a weighted mean of V by at most 2^-9 of the largest |v| (each weight by at most 2^-9 of itself, the
normalizing sum unrounded); float32's own sums add far less. So: 2^-9 of the largest |v|.
"""
from __future__ import annotations

import numpy as np
import pytest

from inferd import _cpu
from tests.ext.paths import PATHS
from tests.ext.test_attention import (
    CASES, LONG_CASES, SHAPES, assert_same_bits_every_path_run_and_split, make_cache, reference,
)

BLOCK = _cpu.BLOCK_SIZE
FLOOR = 2.0 ** -40          # magnitudes below it round to 0 (attention_bf16.c: BF16_FLOOR)


def bf16(x) -> np.ndarray:
    """float32 values rounded to bf16 (to nearest even), as float32; below FLOOR 0"""
    u = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000).astype(np.uint32).view(np.float32)
    return np.where(np.abs(np.asarray(x, np.float32)) < FLOOR, np.float32(0), r)


def reference_bf16(q, keys, vals, pos0, seq_len, causal, window, scale):
    """float64 attention on q, K and V rounded to bf16"""
    return reference(bf16(q), bf16(keys).astype(np.float64), bf16(vals).astype(np.float64), pos0, seq_len, causal,
                     window, scale)


WEIGHT_ROUNDING = 2.0 ** -9


def test_the_cache_rounds_to_nearest_even_and_floors_tiny_values():
    one = np.float32(1.0)
    step = np.float32(2.0 ** -7)                                      # bf16's spacing just above 1
    special = np.array([one + step / 2, one + 3 * step / 2, one + step / 2 + 2.0 ** -20, -(one + 3 * step / 2),
                        2.0 ** -40, 2.0 ** -41, -(2.0 ** -41), 65504.0, 3.0e38, 0.0], np.float32)
    assert bf16(special).tolist()[:5] == [1.0, 1.0 + 2 * 2.0 ** -7, 1.0 + 2.0 ** -7, -(1.0 + 2 * 2.0 ** -7),
                                          2.0 ** -40]
    x = np.random.default_rng(0).standard_normal((130, 64)).astype(np.float32) * 3
    x[0, :special.size] = special
    for is_k in (True, False):
        got = _cpu.kv_bf16_roundtrip(x, is_k)
        np.testing.assert_array_equal(got.view(np.uint32), bf16(x).view(np.uint32), err_msg=f"is_k={is_k}")
    assert np.abs(bf16(x) - x).max() <= np.abs(x).max() * 2.0 ** -8


def bf16_inputs(total, n_kv, hd, seed):
    k, v, table, keys, vals = make_cache(total, n_kv, hd, seed)
    return k.astype(np.float32), v.astype(np.float32), table, keys, vals


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("pos0,ntok,causal,window,seq_len", CASES)
@pytest.mark.parametrize("n_heads,n_kv,hd", [(2, 1, 64), (4, 2, 128)])
def test_bf16_matches_float64(path, pos0, ntok, causal, window, seq_len, n_heads, n_kv, hd):
    _cpu.set_path(path)
    total = pos0 + ntok if causal else seq_len
    k, v, table, keys, vals = bf16_inputs(total, n_kv, hd, seed=pos0 + ntok + window)
    q = np.random.default_rng(7).standard_normal((ntok, n_heads, hd)).astype(np.float32)
    scale = np.float32(1.0 / np.sqrt(hd))
    got = _cpu.attention(q, k, v, table, pos0, seq_len=seq_len, causal=causal, window=window, kv_dtype="bf16")
    want = reference_bf16(q, keys, vals, pos0, seq_len, causal, window, scale)
    np.testing.assert_allclose(got, want, rtol=0, atol=WEIGHT_ROUNDING * np.abs(vals).max())
    exact = reference(q, keys, vals, pos0, seq_len, causal, window, scale)
    assert np.abs(got - exact).max() < 3e-3 * np.abs(vals).max()


@pytest.mark.parametrize("pos0,ntok,causal,window,seq_len", LONG_CASES)
@pytest.mark.parametrize("n_heads,n_kv,hd", SHAPES)
def test_bf16_long_runs_match_float64(pos0, ntok, causal, window, seq_len, n_heads, n_kv, hd):
    total = pos0 + ntok if causal else seq_len
    k, v, table, keys, vals = bf16_inputs(total, n_kv, hd, seed=pos0 + window)
    q = np.random.default_rng(5).standard_normal((ntok, n_heads, hd)).astype(np.float32)
    got = _cpu.attention(q, k, v, table, pos0, seq_len=seq_len, causal=causal, window=window, kv_dtype="bf16")
    want = reference_bf16(q, keys, vals, pos0, seq_len, causal, window, np.float32(1.0 / np.sqrt(hd)))
    np.testing.assert_allclose(got, want, rtol=0, atol=WEIGHT_ROUNDING * np.abs(vals).max())


@pytest.mark.parametrize("pos0,ntok,causal,window,seq_len", CASES[:6] + LONG_CASES)
@pytest.mark.parametrize("n_heads,n_kv,hd", SHAPES)
def test_bf16_identical_on_every_path_any_run_and_split(pos0, ntok, causal, window, seq_len, n_heads, n_kv, hd):
    """Bit for bit, on every path: runs of 16, 5 and 1 tokens (a token alone is a decode step), and every token
    computed as key segments apart, merged in order (a decode step split across threads)."""
    total = pos0 + ntok if causal else seq_len
    k, v, table, _, _ = bf16_inputs(total, n_kv, hd, seed=3)
    q = np.random.default_rng(4).standard_normal((ntok, n_heads, hd)).astype(np.float32)
    assert_same_bits_every_path_run_and_split(q, k, v, table, pos0, seq_len=seq_len, causal=causal, window=window,
                                              kv_dtype="bf16")


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("last", [64 + 6, 64 + 7, 64 + 63, 128])
def test_positions_past_the_last_key_are_never_read(path, last):
    """A block's slots past the sequence's last key hold whatever an earlier sequence left there: NaN there changes
    nothing (the value paired with an odd last key is taken as 0, not multiplied by a zero weight)."""
    _cpu.set_path(path)
    k, v, table, _, _ = bf16_inputs(last, 2, 64, seed=9)
    q = np.random.default_rng(2).standard_normal((5, 4, 64)).astype(np.float32)
    clean = _cpu.attention(q, k, v, table, last - 5, kv_dtype="bf16")
    if last % BLOCK:
        k[table[-1], :, last % BLOCK:] = np.nan
        v[table[-1], :, last % BLOCK:] = np.nan
    spare = next(b for b in range(len(k)) if b not in table)
    k[spare] = v[spare] = np.nan                                      # a block outside the table
    dirty = _cpu.attention(q, k, v, table, last - 5, kv_dtype="bf16")
    np.testing.assert_array_equal(dirty.view(np.uint32), clean.view(np.uint32))


def test_bf16_is_not_the_f16_cache():
    """The setting is used: the bf16 result differs from the f16 cache's, by about bf16's rounding."""
    k, v, table, _, vals = bf16_inputs(300, 2, 128, seed=1)
    q = np.random.default_rng(6).standard_normal((4, 6, 128)).astype(np.float32)
    f16 = _cpu.attention(q, k, v, table, 296)
    b16 = _cpu.attention(q, k, v, table, 296, kv_dtype="bf16")
    assert 1e-5 < np.abs(b16 - f16).max() / np.abs(vals).max() < 3e-3
    with pytest.raises(ValueError, match="kv_dtype must be f16 or bf16"):
        _cpu.attention(q, k, v, table, 296, kv_dtype="q8_0")
