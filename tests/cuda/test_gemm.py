"""Prefill GEMM (bf16 in, float32 out, optional accumulate into C) against float64 numpy: cuBLAS when built in
and our own mma kernel, ragged shapes. The inputs are exact bf16 values, so only float32 accumulation differs:
||C - ref|| / ||ref|| < 1e-5."""
import numpy as np
import pytest

from tests.cuda.cuda_ref import bf16_bits_to_f32, poisoned, rel_err, to_bf16_bits, upload

SHAPES = [(1, 8, 8), (7, 100, 64), (128, 576, 576), (130, 1536, 576), (300, 200, 1544), (2048, 512, 256)]


@pytest.mark.parametrize("kind", [0, 1], ids=["cublas", "own"])
@pytest.mark.parametrize("M,N,K", SHAPES)
def test_gemm_bf16(cu, rng, kind, M, N, K):
    if kind == 0 and not cu.have_cublas():
        pytest.skip("built without cuBLAS")
    X = to_bf16_bits(rng.standard_normal((M, K)))
    W = to_bf16_bits(rng.standard_normal((N, K)))
    ref = bf16_bits_to_f32(X).astype(np.float64) @ bf16_bits_to_f32(W).astype(np.float64).T
    C = poisoned(cu, M * N * 4)
    cu.gemm_bf16(upload(cu, X), upload(cu, W), C, M, N, K, 0.0, kind)
    got = C.download(np.float32, (M, N))
    assert np.isfinite(got).all()
    assert rel_err(got, ref) < 1e-5
    C0 = rng.standard_normal((M, N)).astype(np.float32)
    dC = upload(cu, C0)
    cu.gemm_bf16(upload(cu, X), upload(cu, W), dC, M, N, K, 1.0, kind)
    assert rel_err(dC.download(np.float32, (M, N)), ref + C0) < 1e-5
