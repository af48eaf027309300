"""The encoder's bidirectional attention kernel (encoder_kernels.c) alone: every path gives the same bits as the
scalar one (blocks of eight queries in zmm with the last block overlapping, four in ymm, one at a time, masked
tails of keys and of softmax weights), and each is close to a float64 softmax attention; sliding windows too."""
from __future__ import annotations

import numpy as np
import pytest

from inferd import _cpu
from tests.ext.paths import PATHS

LENGTHS = [1, 5, 7, 8, 9, 13, 16, 17, 24, 31, 32, 33, 47, 64, 100, 223]


def reference(q, k, v, scale, window):
    n = q.shape[0]
    s = q.astype(np.float64) @ k.astype(np.float64).T * np.float64(np.float32(scale))
    if window:
        pos = np.arange(n)
        s = np.where(np.abs(pos[:, None] - pos[None, :]) < window, s, -np.inf)
    w = np.exp(s - s.max(1, keepdims=True))
    return (w / w.sum(1, keepdims=True)) @ v.astype(np.float64)


def run_paths(q, k, v, scale, window):
    old, got = _cpu.get_path(), {}
    try:
        for p in PATHS:
            _cpu.set_path(p)
            got[p] = _cpu.encoder_attention(q, k, v, scale, window)
    finally:
        _cpu.set_path(old)
    return got


@pytest.mark.parametrize("hd", [32, 64])
@pytest.mark.parametrize("n", LENGTHS)
@pytest.mark.parametrize("window", [0, 6])
def test_every_path_gives_the_scalar_bits_and_the_reference(n, hd, window):
    rng = np.random.default_rng(n * 100 + hd + window)
    q, k, v = (rng.standard_normal((n, hd)).astype(np.float32) for _ in range(3))
    q[0] *= 30.0                                    # one query with very peaked weights (tiny ones cut to 0)
    scale = hd ** -0.5
    got = run_paths(q, k, v, scale, window)
    for p, out in got.items():
        assert np.array_equal(out.view(np.uint32), got["scalar"].view(np.uint32)), (p, n, hd, window)
    want, top = reference(q, k, v, scale, window), np.abs(v).max()
    # float32 scores of the peaked query (|s| ~ 200) carry absolute errors ~ 1e-5, which its weights inherit
    np.testing.assert_allclose(got["scalar"][0], want[0], rtol=0, atol=3e-5 * top)
    np.testing.assert_allclose(got["scalar"][1:], want[1:], rtol=0, atol=2e-6 * top)


def test_a_query_gets_the_same_bits_in_any_block():
    """The last block of eight overlaps the one before (n = 13: queries 5..12): its rows are those that a sequence
    where the same query sits elsewhere in a block gives, so adding keys' rows never changes a row's bits."""
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((13, 32)).astype(np.float32) for _ in range(3))
    full = _cpu.encoder_attention(q, k, v, 0.2)
    assert np.array_equal(_cpu.encoder_attention(q[::-1].copy(), k, v, 0.2)[::-1], full)


def test_bad_shapes_are_refused():
    x = np.zeros((4, 32), np.float32)
    with pytest.raises(ValueError):
        _cpu.encoder_attention(x, np.zeros((5, 32), np.float32), x, 0.1)
    with pytest.raises(ValueError):
        odd = np.zeros((4, 12), np.float32)                     # hd not a multiple of 8
        _cpu.encoder_attention(odd, odd, odd, 0.1)
