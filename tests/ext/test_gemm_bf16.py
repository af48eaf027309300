"""The encoder's bf16 panel GEMM (gemm_panels.c): its rounding to bf16, and on every path the bits of a numpy emulation
of VDPBF16PS's definition (per output, for each column pair: acc += w_odd x_odd, then acc += w_even x_even, each
product exact in f32 and each sum rounded to nearest, a subnormal sum flushed to zero)."""
from __future__ import annotations

import numpy as np
import pytest

from inferd import _cpu
from tests.ext.paths import PATHS


def to_bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> the float32 value of its bf16 rounding (nearest, ties to even; subnormals to signed zero)"""
    u = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.uint64)
    sub = (u & 0x7F800000) == 0
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    r = np.where(sub, u & 0x80000000, r)
    return r.astype(np.uint32).view(np.float32)


def flush(s: np.ndarray) -> np.ndarray:
    return np.where(np.abs(s) < np.finfo(np.float32).tiny, np.copysign(np.float32(0), s), s).astype(np.float32)


def emulate(w: np.ndarray, x: np.ndarray) -> np.ndarray:
    wb, xb = to_bf16(w), to_bf16(x)
    acc = np.zeros((x.shape[0], w.shape[0]), np.float32)
    for j in range(0, w.shape[1], 2):
        for k in (j + 1, j):   # products of bf16 values are exact in float32
            acc = flush(acc + np.outer(xb[:, k], wb[:, k]).astype(np.float32))
    return acc


def test_rounding_to_bf16():
    f = np.array([1.0, 1 + 2**-8, 1 + 3 * 2**-8, 1 + 2**-9, 1 + 2**-8 + 2**-20, -2.5, 1e-40, -1e-40, 3e38],
                 np.float32)
    want = np.array([1.0, 1.0, 1 + 2**-6, 1.0, 1 + 2**-7, -2.5, 0.0, -0.0,
                     float(to_bf16(np.array([3e38], np.float32))[0])], np.float32)
    np.testing.assert_array_equal(to_bf16(f).view(np.uint32), want.view(np.uint32))
    # through the kernel: y = 1 * x (+ 0 * 0), so the rounded x itself (a signed zero may come back as +0)
    w, x = np.zeros((1, 32), np.float32), np.zeros((1, 32), np.float32)
    w[0, 0] = 1
    for v, r in zip(f, want):
        x[0, 0] = v
        assert _cpu.gemm_bf16(w, x)[0, 0] == r


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("rows, cols, ntok", [(1, 32, 1), (16, 64, 12), (45, 384, 29), (33, 160, 13), (64, 96, 40)])
def test_every_path_gives_the_emulated_bits(path, rows, cols, ntok):
    rng = np.random.default_rng(rows * cols + ntok)
    w = (rng.standard_normal((rows, cols)) * 0.05).astype(np.float32)
    x = rng.standard_normal((ntok, cols)).astype(np.float32)
    x[0, : cols // 2] *= 1e3      # outliers, and sums that cancel: the order of the additions shows
    want = emulate(w, x)
    old = _cpu.get_path()
    try:
        _cpu.set_path(path)
        got = _cpu.gemm_bf16(w, x)
    finally:
        _cpu.set_path(old)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    # and close to the float product
    np.testing.assert_allclose(got, x @ w.T, rtol=0, atol=2e-2 * np.abs(x @ w.T).max())


def test_the_order_of_a_pair_matters_and_is_kept():
    """x = (1, 0 | -1, 2^-24), w = 1: after the first pair acc = 1; then odd first, 1 + 2^-24 rounds to 1 and
    1 - 1 = 0, where even first (or an exact pair sum) would give 2^-24."""
    w, x = np.ones((1, 32), np.float32), np.zeros((1, 32), np.float32)
    x[0, :4] = 1.0, 0.0, -1.0, 2.0**-24
    assert emulate(w, x)[0, 0] == 0
    for path in PATHS:
        old = _cpu.get_path()
        try:
            _cpu.set_path(path)
            assert _cpu.gemm_bf16(w, x)[0, 0] == 0, path
        finally:
            _cpu.set_path(old)


def test_widths_other_than_multiples_of_32_are_refused():
    with pytest.raises(ValueError, match="multiple of 32"):
        _cpu.gemm_bf16(np.ones((2, 48), np.float32), np.ones((1, 48), np.float32))
