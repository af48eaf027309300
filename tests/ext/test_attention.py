"""The attention kernel on its own (inferd._cpu.attention over ext/cpu/attention.c) against float64 numpy: causal
and bidirectional, over all keys and over sliding windows narrower and wider than a 64-position KV block, for runs of
up to 4 tokens that start anywhere in a block, with GQA; and its promises: every path gives the same bits, and a
token's output does not depend on the other tokens of its run.

Tolerance: 2e-6 relative to the largest |v| (float32 scores and sums over at most a few hundred keys; K and V are
the same f16 values on both sides)."""
from __future__ import annotations

import numpy as np
import pytest

from inferd import _cpu
from tests.ext.paths import PATHS

BLOCK = _cpu.BLOCK_SIZE


def make_cache(seq_len: int, n_kv: int, hd: int, seed: int):
    """K and V of seq_len positions in a shuffled block table: (blocks, n_kv, 64, hd) f16 each, and the table."""
    rng = np.random.default_rng(seed)
    n_blocks = (seq_len + BLOCK - 1) // BLOCK
    table = rng.permutation(n_blocks + 2)[:n_blocks].astype(np.int32)         # spare blocks, out of order
    k = np.zeros((n_blocks + 2, n_kv, BLOCK, hd), np.float16)
    v = np.zeros_like(k)
    keys = (rng.standard_normal((seq_len, n_kv, hd)) * 0.6).astype(np.float16)
    vals = rng.standard_normal((seq_len, n_kv, hd)).astype(np.float16)
    for p in range(seq_len):
        k[table[p // BLOCK], :, p % BLOCK] = keys[p]
        v[table[p // BLOCK], :, p % BLOCK] = vals[p]
    return k, v, table, keys.astype(np.float64), vals.astype(np.float64)


def reference(q, keys, vals, pos0, seq_len, causal, window, scale):
    """float64 attention of q (ntok, n_heads, hd) at positions pos0.. over keys/vals (seq_len, n_kv, hd)."""
    ntok, n_heads, _ = q.shape
    group = n_heads // keys.shape[1]
    out = np.empty(q.shape)
    k_pos = np.arange(keys.shape[0])
    for t in range(ntok):
        p = pos0 + t
        seen = (k_pos <= p) if causal else (k_pos < seq_len)
        if window:
            seen &= np.abs(p - k_pos) < window
        for h in range(n_heads):
            s = keys[seen, h // group] @ q[t, h].astype(np.float64) * scale
            w = np.exp(s - s.max())
            out[t, h] = (w / w.sum()) @ vals[seen, h // group]
    return out


CASES = [  # (pos0, ntok, causal, window, seq_len)
    (0, 7, True, 0, 0), (60, 7, True, 0, 0), (130, 4, True, 0, 0),          # plain causal, across blocks
    (100, 6, True, 24, 0), (126, 5, True, 24, 0), (62, 4, True, 3, 0),      # windows inside a block
    (150, 8, True, 70, 0), (190, 3, True, 64, 0), (200, 5, True, 65, 0),    # windows spanning blocks
    (0, 5, True, 1, 0), (70, 6, True, 1, 0),                                # only the token itself
    (0, 9, False, 0, 9), (40, 8, False, 0, 150),                            # bidirectional (an encoder)
    (100, 7, False, 30, 200), (120, 4, False, 64, 190),                     # bidirectional, windowed
]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("pos0,ntok,causal,window,seq_len", CASES)
@pytest.mark.parametrize("n_heads,n_kv,hd", [(2, 1, 64), (4, 2, 128), (1, 1, 256)])
def test_attention_matches_float64(path, pos0, ntok, causal, window, seq_len, n_heads, n_kv, hd):
    _cpu.set_path(path)
    total = pos0 + ntok if causal else seq_len
    k, v, table, keys, vals = make_cache(total, n_kv, hd, seed=pos0 + ntok + window)
    q = np.random.default_rng(7).standard_normal((ntok, n_heads, hd)).astype(np.float32)
    scale = 1.0 / np.sqrt(hd) if hd != 256 else 0.0625 * 1.3                 # the model's own scale, too
    got = _cpu.attention(q, k, v, table, pos0, seq_len=seq_len, causal=causal, window=window, scale=scale)
    want = reference(q, keys, vals, pos0, seq_len, causal, window, np.float32(scale))
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-6 * np.abs(vals).max())


def test_window_changes_the_result():
    """The window is not ignored: a token beyond it attends differently than with all keys."""
    k, v, table, _, _ = make_cache(140, 1, 64, seed=3)
    q = np.random.default_rng(8).standard_normal((1, 2, 64)).astype(np.float32)
    full = _cpu.attention(q, k, v, table, 139)
    windowed = _cpu.attention(q, k, v, table, 139, window=40)
    assert np.abs(full - windowed).max() > 1e-2


@pytest.mark.parametrize("pos0,ntok,causal,window,seq_len", CASES)
def test_attention_identical_on_every_path_and_alone(pos0, ntok, causal, window, seq_len):
    """Bit for bit: every path the same, and each token computed alone equals it computed in its run."""
    total = pos0 + ntok if causal else seq_len
    k, v, table, _, _ = make_cache(total, 2, 64, seed=11)
    q = np.random.default_rng(9).standard_normal((ntok, 4, 64)).astype(np.float32)
    results = {}
    for p in PATHS:
        _cpu.set_path(p)
        runs = _cpu.attention(q, k, v, table, pos0, seq_len=seq_len, causal=causal, window=window)
        alone = np.stack([_cpu.attention(q[t:t + 1], k, v, table, pos0 + t, seq_len=seq_len, causal=causal,
                                         window=window)[0] for t in range(ntok)])
        np.testing.assert_array_equal(runs.view(np.uint32), alone.view(np.uint32), err_msg=f"{p}: run vs alone")
        results[p] = runs
    for p in PATHS[1:]:
        np.testing.assert_array_equal(results[p].view(np.uint32), results[PATHS[0]].view(np.uint32), err_msg=p)


def test_attention_rejects_a_short_block_table():
    k, v, table, _, _ = make_cache(70, 1, 64, seed=1)
    q = np.zeros((1, 1, 64), np.float32)
    with pytest.raises(ValueError, match="block table"):
        _cpu.attention(q, k, v, table[:1], 69)
    with pytest.raises(ValueError, match="shapes"):
        _cpu.attention(np.zeros((1, 1, 48), np.float32), k, v, table, 3)


# ---- the GEMM-shaped kernel's own shapes: runs of up to 16 tokens, GQA groups of 3 and 6, key segments ----------
SEGMENT = _cpu.SEGMENT_BLOCKS * BLOCK                                    # keys per softmax segment
LONG_CASES = [  # (pos0, ntok, causal, window, seq_len): runs crossing blocks and segments, windows across them
    (50, 16, True, 0, 0), (SEGMENT - 5, 16, True, 0, 0), (2 * SEGMENT - 1, 3, True, 0, 0),
    (2 * SEGMENT + 30, 16, True, SEGMENT + 7, 0), (SEGMENT + 60, 9, True, 100, 0),
    (SEGMENT - 40, 16, False, 0, SEGMENT + 90), (SEGMENT - 40, 16, False, 70, SEGMENT + 90),
]
SHAPES = [(3, 1, 64), (6, 1, 128), (12, 2, 64), (6, 2, 256)]                 # (n_heads, n_kv_heads, head_dim)


@pytest.mark.parametrize("pos0,ntok,causal,window,seq_len", LONG_CASES)
@pytest.mark.parametrize("n_heads,n_kv,hd", SHAPES)
def test_long_runs_match_float64(pos0, ntok, causal, window, seq_len, n_heads, n_kv, hd):
    """Sums over up to ~2100 keys in float32: 5e-6 of the largest |v|."""
    total = pos0 + ntok if causal else seq_len
    k, v, table, keys, vals = make_cache(total, n_kv, hd, seed=pos0 + window)
    q = np.random.default_rng(5).standard_normal((ntok, n_heads, hd)).astype(np.float32)
    got = _cpu.attention(q, k, v, table, pos0, seq_len=seq_len, causal=causal, window=window)
    want = reference(q, keys, vals, pos0, seq_len, causal, window, np.float32(1.0 / np.sqrt(hd)))
    np.testing.assert_allclose(got, want, rtol=0, atol=5e-6 * np.abs(vals).max())


@pytest.mark.parametrize("pos0,ntok,causal,window,seq_len", LONG_CASES)
@pytest.mark.parametrize("n_heads,n_kv,hd", SHAPES)
def test_long_runs_identical_on_every_path_any_run_and_split(pos0, ntok, causal, window, seq_len, n_heads, n_kv,
                                                             hd):
    """Bit for bit, on every path: runs of 16, 5 and 1 tokens (a token alone is a decode step), and every token
    computed as key segments apart, merged in order (a decode step split across threads)."""
    total = pos0 + ntok if causal else seq_len
    k, v, table, _, _ = make_cache(total, n_kv, hd, seed=3)
    q = np.random.default_rng(4).standard_normal((ntok, n_heads, hd)).astype(np.float32)
    assert_same_bits_every_path_run_and_split(q, k, v, table, pos0, seq_len=seq_len, causal=causal, window=window)


def assert_same_bits_every_path_run_and_split(q, k, v, table, pos0, **kw):
    """_cpu.attention(q, k, v, table, pos0, **kw) the same bits on every path, in runs of 16, 5 and 1 tokens, and
    split into key segments merged in order"""
    first = None
    for p in PATHS:
        _cpu.set_path(p)
        want = _cpu.attention(q, k, v, table, pos0, **kw)
        for what, got in {"runs of 5": _cpu.attention(q, k, v, table, pos0, run=5, **kw),
                          "alone": _cpu.attention(q, k, v, table, pos0, run=1, **kw),
                          "alone, split": _cpu.attention(q, k, v, table, pos0, run=1, split=True, **kw),
                          "runs of 16, split": _cpu.attention(q, k, v, table, pos0, split=True, **kw)}.items():
            np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32), err_msg=f"{p}: {what}")
        if first is None:
            first = want
        np.testing.assert_array_equal(want.view(np.uint32), first.view(np.uint32), err_msg=f"{p} vs {PATHS[0]}")


def test_keys_are_stored_transposed_and_read_back():
    """The engine-facing wrapper takes (blocks, n_kv, 64, hd) caches whatever the kernel's layout: a key's values
    all matter (a change in one dimension of one key changes that token's output)."""
    k, v, table, _, _ = make_cache(70, 1, 64, seed=2)
    q = np.random.default_rng(3).standard_normal((1, 3, 64)).astype(np.float32)
    base = _cpu.attention(q, k, v, table, 69)
    k2 = k.copy()
    k2[table[1], 0, 69 % BLOCK, 37] += np.float16(2.0)
    assert np.abs(_cpu.attention(q, k2, v, table, 69) - base).max() > 1e-4
    with pytest.raises(ValueError, match="run"):
        _cpu.attention(q, k, v, table, 69, run=_cpu.MAX_RUN_TOKENS + 1)
