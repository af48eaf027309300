"""The encoder's float panel GEMM (gemm_panels.c) over F16 and BF16 weights: their panels keep the weight's own 16-bit
values (half the memory of f32 panels) where the CPU has no AVX-512F, widened to f32 in registers, and give the bits
of the f32 panels of the same values, on every path, for every token count; and those bits are float64's product
within the f32 accumulation's rounding."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from inferd import _cpu
from tests.ext.paths import PATHS
from tests.reference import to_bf16_bits


def stored(type_name: str, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the weight as stored, its values in float32)"""
    if type_name == "F16":
        h = w.astype(np.float16)
        return h.view(np.uint16), h.astype(np.float32)
    b = to_bf16_bits(w)
    return b, (b.astype(np.uint32) << 16).view(np.float32)


@pytest.mark.parametrize("type_name", ["F16", "BF16"])
def test_16bit_panels_give_the_f32_panels_bits(type_name):
    rng = np.random.default_rng(3)
    rows, cols = 37, 96                               # a last panel of 5 rows
    w = rng.standard_normal((rows, cols)).astype(np.float32) / np.sqrt(cols)
    bits, values = stored(type_name, w)
    x = rng.standard_normal((13, cols)).astype(np.float32)   # two passes of 6 tokens and one
    old = _cpu.get_path()
    try:
        for p in PATHS:
            _cpu.set_path(p)
            want, _ = _cpu.gemm_float("F32", values, x)
            for n in (1, 6, 13):
                got, kept = _cpu.gemm_float(type_name, bits, x[:n])
                np.testing.assert_array_equal(got.view(np.uint32), want[:n].view(np.uint32), err_msg=f"{p} {n}")
            assert kept == _cpu.float_panels_16bit(type_name)
    finally:
        _cpu.set_path(old)
    assert not _cpu.float_panels_16bit("F32")
    if "avx512f" not in Path("/proc/cpuinfo").read_text().split():   # the zmm GEMM reads f32 panels
        assert _cpu.float_panels_16bit(type_name)
    ref = x.astype(np.float64) @ values.astype(np.float64).T
    bound = np.abs(x).astype(np.float64) @ np.abs(values).astype(np.float64).T
    assert np.all(np.abs(want - ref) <= 1e-5 * bound)
