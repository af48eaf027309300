"""Decode GEMV against float64 numpy: every weight format, fused RMSNorm, residual add, SwiGLU, ragged shapes.

Tolerance: the weights are exact on both sides (the reference uses the dequantized values), so only the kernel's
float32 accumulation differs: |out - ref| <= 1e-4 * (|W| @ |gamma x|) * inv_rms + 1e-6, element by element (the
float32 rounding bound for sums of this length is far below that), and every output must have been written."""
import numpy as np
import pytest

from tests.cuda.cuda_ref import BF16, FORMAT_NAMES, I8, Q4, Q8, Q41, poisoned, quantize, rms_inv, silu, upload

FORMATS = [BF16, I8, Q8, Q4, Q41]
SHAPES = [(1, 32), (37, 576), (300, 2048), (130, 2080), (1000, 96), (65, 4160)]   # (N, K); K > 2048: several chunks
BATCHES = [1, 2, 3, 4, 5, 8, 9, 17]


def make(cu, fmt, rows, cols, rng):
    w = (rng.standard_normal((rows, cols)) * rng.uniform(0.2, 2.0, (rows, 1))).astype(np.float32)
    q, s, vals = quantize(fmt, w)
    mat = cu.Mat(fmt, rows, cols)
    mat.upload_raw(q, s)
    return mat, vals


def run(cu, mat, x, gamma, res, B, swiglu, N):
    K = x.shape[1]
    dx = upload(cu, x)
    dg = upload(cu, gamma) if gamma is not None else None
    dres = upload(cu, res) if res is not None else None
    out = poisoned(cu, B * N * 4)
    cu.gemv(mat, dx, K, dg, 1e-5, dres, N, out, N, B, swiglu)
    return out.download(np.float32, (B, N))


def reference(vals, x, gamma, res, swiglu):
    x64 = x.astype(np.float64)
    g = gamma.astype(np.float64) if gamma is not None else np.ones(x.shape[1])
    inv = rms_inv(x64, 1e-5) if gamma is not None else np.ones(x.shape[0])
    y = (x64 * g) @ vals.T * inv[:, None]
    bound = (np.abs(x64 * g) @ np.abs(vals).T) * inv[:, None]
    if swiglu:                       # (the callers check SwiGLU by relative error instead of the bound)
        n = vals.shape[0] // 2
        y = silu(y[:, :n]) * y[:, n:]
        bound = None
    if res is not None:
        y = y + res
    return y, bound


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: FORMAT_NAMES[f])
@pytest.mark.parametrize("N,K", SHAPES)
def test_gemv_matches_float64(cu, rng, fmt, N, K):
    if fmt != BF16 and K % 32:
        pytest.skip("quantized formats need K % 32 == 0")
    mat, vals = make(cu, fmt, N, K, rng)
    for B in BATCHES:
        x = rng.standard_normal((B, K)).astype(np.float32)
        out = run(cu, mat, x, None, None, B, False, N)
        ref, bound = reference(vals, x, None, None, False)
        assert np.isfinite(out).all(), f"B={B}: outputs left unwritten"
        assert (np.abs(out - ref) <= 1e-4 * bound + 1e-6).all(), f"B={B}: max err {np.abs(out - ref).max()}"


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: FORMAT_NAMES[f])
def test_gemv_rmsnorm_and_residual(cu, rng, fmt):
    N, K = 333, 2080
    mat, vals = make(cu, fmt, N, K, rng)
    for B in (1, 3, 8, 11):
        x = (rng.standard_normal((B, K)) * rng.uniform(0.1, 10, (B, 1))).astype(np.float32)
        gamma = (1 + 0.3 * rng.standard_normal(K)).astype(np.float32)
        res = rng.standard_normal((B, N)).astype(np.float32)
        out = run(cu, mat, x, gamma, res, B, False, N)
        ref, bound = reference(vals, x, gamma, res, False)
        assert np.isfinite(out).all()
        assert (np.abs(out - ref) <= 1e-4 * bound + 1e-5).all(), f"B={B}: max err {np.abs(out - ref).max()}"


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: FORMAT_NAMES[f])
def test_gemv_swiglu(cu, rng, fmt):
    H, K = 250, 576
    mat, vals = make(cu, fmt, 2 * H, K, rng)
    for B in (1, 2, 5, 8):
        x = rng.standard_normal((B, K)).astype(np.float32)
        gamma = (1 + 0.3 * rng.standard_normal(K)).astype(np.float32)
        out = run(cu, mat, x, gamma, None, B, True, H)
        ref, _ = reference(vals, x, gamma, None, True)
        assert np.isfinite(out).all()
        err = np.abs(out - ref).max() / np.abs(ref).max()
        assert err < 1e-5, f"B={B}: relative max err {err}"


def test_gemv_residual_in_place(cu, rng):
    """out may alias res (the runner adds into the residual stream in place)."""
    N, K = 200, 512
    mat, vals = make(cu, BF16, N, K, rng)
    B = 4
    x = rng.standard_normal((B, K)).astype(np.float32)
    res = rng.standard_normal((B, N)).astype(np.float32)
    dres = upload(cu, res)
    cu.gemv(mat, upload(cu, x), K, None, 0.0, dres, N, dres, N, B, False)
    out = dres.download(np.float32, (B, N))
    ref = x.astype(np.float64) @ vals.T + res
    assert np.abs(out - ref).max() < 1e-3


def test_gemv_batch_invariant(cu, rng):
    """A token's output is bit-identical whatever batch it runs in (the summation order never depends on B)."""
    for fmt in FORMATS:
        N, K = 300, 4160
        mat, _ = make(cu, fmt, N, K, rng)
        x = rng.standard_normal((17, K)).astype(np.float32)
        gamma = (1 + 0.3 * rng.standard_normal(K)).astype(np.float32)
        full = run(cu, mat, x, gamma, None, 17, False, N)
        for i in (0, 5, 16):
            alone = run(cu, mat, x[i:i + 1], gamma, None, 1, False, N)
            assert np.array_equal(alone[0], full[i]), f"{FORMAT_NAMES[fmt]}: token {i} differs alone"
