"""Each C kernel of inferd._cpu against float64 numpy on random data of awkward shapes (row counts that are not
multiples of the 8-row tile, blocks per row that are odd). Every path this CPU can run is checked.

Tolerances: float matmuls within 1e-5 of the |W| |x| bound (float32 accumulation, <= 1024 terms); quantized
matmuls within 1e-5 of that bound against float64 on the engine's own 8-bit activations (the integer part is
exact, only the per-block float accumulation rounds), and within the 8-bit rounding bound (half a step per
activation) against unquantized activations; rmsnorm within 2e-6 relative.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf import quants as gguf_quants

from inferd import _cpu

QTYPES = ("Q8_0", "Q4_0", "Q4_1")
ALL_TYPES = ("F32", "F16", "BF16") + QTYPES
SHAPES = [(37, 96), (1003, 160), (8, 32), (13, 256)]
ALL_PATHS = ("scalar", "avx2", "avx512vnni", "avxvnni")


def path_available(name: str) -> bool:
    old = _cpu.get_path()
    try:
        _cpu.set_path(name)
        return True
    except ValueError:
        return False
    finally:
        _cpu.set_path(old)


PATHS = [pytest.param(p, marks=pytest.mark.skipif(not path_available(p), reason=f"this CPU cannot run {p}"))
         for p in ALL_PATHS]


# ---- numpy references -----------------------------------------------------------------------------------------
def roundf(v: np.ndarray) -> np.ndarray:
    """C roundf: half away from zero (float64 arithmetic is exact for float32 inputs)."""
    v = v.astype(np.float64)
    return np.sign(v) * np.floor(np.abs(v) + 0.5)


def quantize_llamacpp(x: np.ndarray, type_name: str) -> np.ndarray:
    """llama.cpp's quantize_row_*_ref (ggml-quants.c) in numpy, float32 arithmetic as in C:
    Q8_0: d = amax/127, q = roundf(x * (1/d)); Q4_0: d = max/-8 with max the first value of largest magnitude,
    q = min(15, (int)(x * (1/d) + 8.5)); Q4_1: d = (max-min)/15, m = min, q = min(15, (int)((x-min) * (1/d) + 0.5)).
    Nibbles: value j in the low half of byte j, value j+16 in the high half. Scales stored as f16 (RNE)."""
    f32 = np.float32
    b = np.asarray(x, f32).reshape(x.shape[0], -1, 32)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        if type_name == "Q8_0":
            d = (np.abs(b).max(-1) / f32(127)).astype(f32)
            inv = np.where(d != 0, f32(1) / d, f32(0)).astype(f32)
            q = roundf((b * inv[..., None]).astype(f32)).astype(np.int8)
            blocks = np.concatenate([d.astype(np.float16)[..., None].view(np.uint8), q.view(np.uint8)], -1)
        elif type_name == "Q4_0":
            idx = np.abs(b).argmax(-1)
            vmax = np.take_along_axis(b, idx[..., None], -1)[..., 0]
            d = (vmax / f32(-8)).astype(f32)
            inv = np.where(d != 0, f32(1) / d, f32(0)).astype(f32)
            q = np.minimum(15, np.trunc((b * inv[..., None]).astype(f32) + f32(8.5))).astype(np.uint8)
            packed = q[..., :16] | (q[..., 16:] << 4)
            blocks = np.concatenate([d.astype(np.float16)[..., None].view(np.uint8), packed], -1)
        elif type_name == "Q4_1":
            mn, mx = b.min(-1), b.max(-1)
            d = ((mx - mn) / f32(15)).astype(f32)
            inv = np.where(d != 0, f32(1) / d, f32(0)).astype(f32)
            q = np.minimum(15, np.trunc(((b - mn[..., None]).astype(f32) * inv[..., None]).astype(f32) + f32(0.5)))
            packed = q.astype(np.uint8)[..., :16] | (q.astype(np.uint8)[..., 16:] << 4)
            blocks = np.concatenate([d.astype(np.float16)[..., None].view(np.uint8),
                                     mn.astype(np.float16)[..., None].view(np.uint8), packed], -1)
    return np.ascontiguousarray(blocks.reshape(x.shape[0], -1))


def dequant_gguf(data: np.ndarray, type_name: str, cols: int) -> np.ndarray:
    return gguf_quants.dequantize(np.ascontiguousarray(data), GGMLQuantizationType[type_name]).reshape(-1, cols)


def raw_weight(values: np.ndarray, type_name: str) -> np.ndarray:
    """float32 (rows, cols) -> the raw array Weight() takes for type_name."""
    if type_name == "F32":
        return np.ascontiguousarray(values, np.float32)
    if type_name == "F16":
        return values.astype(np.float16).view(np.uint16)
    if type_name == "BF16":
        u = values.astype(np.float32).view(np.uint32).astype(np.uint64)
        return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return _cpu.quantize(values, type_name)


def exact_values(raw: np.ndarray, type_name: str, cols: int) -> np.ndarray:
    """float64 values of a raw weight, decoded without the engine."""
    if type_name == "F32":
        return raw.astype(np.float64)
    if type_name == "F16":
        return raw.view(np.float16).astype(np.float64)
    if type_name == "BF16":
        return (raw.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return dequant_gguf(raw, type_name, cols).astype(np.float64)


def special_rows(cols: int, rng) -> np.ndarray:
    """Rows whose blocks hit the corners of the quantizers: zeros, constants, +-amax ties, tiny scales (f16
    subnormal or zero), huge scales (f16 overflow), one outlier, values at exact rounding midpoints."""
    nb = cols // 32
    blocks = [
        np.zeros(32), np.full(32, 0.75), np.full(32, -3.0),
        np.r_[2.0, -2.0, rng.uniform(-1, 1, 30)], np.r_[-2.0, 2.0, rng.uniform(-1, 1, 30)],
        rng.standard_normal(32) * 1e-6, rng.standard_normal(32) * 1e-9, rng.standard_normal(32) * 1e6,
        np.r_[100.0, rng.standard_normal(31) * 0.01],
        np.arange(32) - 15.5,                                   # Q4_1: steps of exactly 31/15
        (np.arange(32) % 17 - 8) * 0.5 + 0.25,                  # midpoints for Q4_0
        np.r_[127.0, 0.5, -0.5, 1.5, -1.5, 2.5, np.full(26, 0.49999997)],   # Q8_0 d = 1: roundf ties, 0.5 - ulp
    ]
    flat = np.concatenate([blocks[i % len(blocks)] for i in range(max(nb, len(blocks)))])
    n = -(-len(flat) // cols)
    flat = np.r_[flat, np.zeros(n * cols - len(flat))]
    return flat.reshape(n, cols).astype(np.float32)


def test_my_roundf_reference_is_c_roundf():
    v = np.array([0.5, -0.5, 1.5, 2.5, -2.5, 0.49999997, -0.49999997, 126.5, 1e-30], np.float32)
    np.testing.assert_array_equal(roundf(v), [1, -1, 2, 3, -3, 0, -0, 127, 0])


# ---- quantize --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("type_name", QTYPES)
@pytest.mark.parametrize("rows,cols", SHAPES)
def test_quantize_equals_llamacpp_reference(type_name, rows, cols):
    rng = np.random.default_rng(rows * cols)
    x = np.concatenate([rng.standard_normal((rows, cols)).astype(np.float32) * rng.uniform(0.01, 10, (rows, 1)),
                        special_rows(cols, rng)]).astype(np.float32)
    got = _cpu.quantize(x, type_name)
    assert got.dtype == np.uint8 and got.shape == (len(x), _cpu.row_bytes(type_name, cols))
    np.testing.assert_array_equal(got, quantize_llamacpp(x, type_name))


@pytest.mark.parametrize("type_name", QTYPES)
def test_quantize_equals_repo_and_gguf_references(type_name):
    """The same bytes as tests/model/quant_ref.py and as the gguf package's quantizers (both ports of
    llama.cpp), on random rows (their float32 midpoint corners are checked above against C roundf)."""
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((37, 160)) * rng.uniform(0.01, 10, (37, 1))).astype(np.float32)
    got = _cpu.quantize(x, type_name)
    np.testing.assert_array_equal(got, gguf_quants.quantize(x, GGMLQuantizationType[type_name]).reshape(37, -1))
    quant_ref = pytest.importorskip("tests.model.quant_ref")
    np.testing.assert_array_equal(got, quant_ref.quantize_reference(x, type_name))


def test_quantize_rejects_bad_input():
    with pytest.raises(ValueError, match="multiple of 32"):
        _cpu.quantize(np.zeros((2, 40), np.float32), "Q8_0")
    with pytest.raises(ValueError, match="cannot quantize"):
        _cpu.quantize(np.zeros((2, 32), np.float32), "F16")


# ---- weights: repacking into tiles and back --------------------------------------------------------------------
@pytest.mark.parametrize("type_name", ALL_TYPES)
@pytest.mark.parametrize("rows,cols", SHAPES)
def test_weight_dequantize_is_exact(type_name, rows, cols):
    rng = np.random.default_rng(rows + cols)
    raw = raw_weight(rng.standard_normal((rows, cols)).astype(np.float32), type_name)
    w = _cpu.Weight(type_name, rows, cols, raw)
    got = w.dequantize()
    assert got.shape == (rows, cols) and got.dtype == np.float32
    np.testing.assert_array_equal(got, exact_values(raw, type_name, cols).astype(np.float32))


def test_weight_rejects_bad_shapes():
    with pytest.raises(ValueError):
        _cpu.Weight("Q8_0", 4, 64, np.zeros((4, 10), np.uint8))          # wrong byte count
    with pytest.raises(ValueError):
        _cpu.Weight("Q4_0", 4, 48, np.zeros((4, 27), np.uint8))          # cols not a multiple of 32
    with pytest.raises(ValueError):
        _cpu.Weight("Q9_9", 4, 32, np.zeros((4, 34), np.uint8))
    with pytest.raises(ValueError, match="columns"):
        _cpu.Weight("F32", 4, 32, np.zeros((4, 32), np.float32)).matmul(np.zeros((2, 64), np.float32))


def test_f16_conversion_round_trips_every_finite_half():
    """Every finite f16 bit pattern decodes to the float32 numpy gives, in dequantize (scalar f16_to_f32) and in
    each path's matmul (F16C on SIMD paths): y = W e_j reads column j exactly."""
    bits = np.arange(65536, dtype=np.uint16)
    finite = bits[np.isfinite(bits.view(np.float16))]                     # 63488 patterns
    w = finite[: len(finite) // 8 * 8].reshape(-1, 8)                      # (7936, 8)
    expect = w.view(np.float16).astype(np.float32)
    weight = _cpu.Weight("F16", w.shape[0], 8, w)
    np.testing.assert_array_equal(weight.dequantize().view(np.uint32), expect.view(np.uint32))
    old = _cpu.get_path()
    try:
        for p in ALL_PATHS:
            if path_available(p):
                _cpu.set_path(p)
                y = weight.matmul(np.eye(8, dtype=np.float32))            # (8, rows) = W.T (-0 sums to +0)
                np.testing.assert_array_equal(y, expect.T, err_msg=p)
    finally:
        _cpu.set_path(old)


def test_f32_to_f16_rounding_via_quantized_scales():
    """The C f32->f16 conversion (used for scales and the KV cache) rounds like numpy (IEEE nearest even),
    including subnormals, overflow to inf and exact ties: Q8_0 stores f16(amax / 127)."""
    rng = np.random.default_rng(3)
    amax = np.concatenate([
        np.exp(rng.uniform(np.log(1e-12), np.log(1e7), 4000)),           # all ranges, subnormal .. inf
        (np.arange(1, 2049) * 2.0 ** -24) * 127,                         # near the subnormal grid
        (1 + (2 * np.arange(1, 512) + 1) * 2.0 ** -11) * 127,            # exact f16 midpoints (ties) * 127
        np.array([65504.0, 65519.0, 65520.0, 65536.0]) * 127,
    ]).astype(np.float32)
    x = np.zeros((len(amax), 32), np.float32)
    x[:, 0] = amax
    got = _cpu.quantize(x, "Q8_0")[:, :2].copy().view(np.uint16)[:, 0]
    with np.errstate(over="ignore"):
        want = (amax / np.float32(127)).astype(np.float32).astype(np.float16).view(np.uint16)
    np.testing.assert_array_equal(got, want)


# ---- activation quantization -----------------------------------------------------------------------------------
def _act_input(n_blocks: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(n_blocks * 32).astype(np.float32) * rng.uniform(0.001, 100, n_blocks).repeat(32)
    x[:32] = 0                                                            # an all-zero block
    x[32:64] = np.linspace(-1, 1, 32)
    x[64:96] = (np.arange(32) - 16) * (1 / 127.0)                         # values on the step grid
    x[96:128] = np.r_[127.0, np.arange(31) + 0.5]                         # exact midpoints: round half even
    return x


@pytest.mark.parametrize("kernel_path", PATHS, indirect=True)
def test_activation_quantization_is_within_half_a_step(kernel_path):
    x = _act_input(45, 1)
    d, isum, qs, hsum = _cpu.quantize_activations(x)
    b = x.reshape(-1, 32).astype(np.float64)
    amax = np.abs(b).max(1)
    np.testing.assert_allclose(d, amax / 127, rtol=1e-6)
    assert np.all(np.abs(qs.astype(np.int32)) <= 127)
    np.testing.assert_array_equal(isum, qs.astype(np.int32).sum(1))
    np.testing.assert_array_equal(hsum, qs.astype(np.int32).reshape(-1, 2, 16).sum(2))   # Q6_K's half sums
    err = np.abs(qs * d[:, None].astype(np.float64) - b)
    assert np.all(err <= d[:, None] * (0.5 + 1e-5) + 1e-30)
    np.testing.assert_array_equal(qs[0], 0)
    np.testing.assert_array_equal(qs[3], np.r_[127, np.arange(31) + 0.5].round().astype(np.int8))  # half even


def test_activation_quantization_bytes_equal_across_paths():
    old = _cpu.get_path()
    results = {}
    try:
        for p in ALL_PATHS:
            if path_available(p):
                _cpu.set_path(p)
                results[p] = _cpu.quantize_activations(_act_input(61, 2))
    finally:
        _cpu.set_path(old)
    assert len(results) >= 2, "at least scalar and one SIMD path should run on x86-64 CI machines"
    base = results.pop("scalar")
    for p, (d, isum, qs, hsum) in results.items():
        np.testing.assert_array_equal(d.view(np.uint32), base[0].view(np.uint32), err_msg=p)
        np.testing.assert_array_equal(isum, base[1], err_msg=p)
        np.testing.assert_array_equal(qs, base[2], err_msg=p)
        np.testing.assert_array_equal(hsum, base[3], err_msg=p)


def test_activation_quantization_rejects_bad_lengths():
    for n in (0, 31, 40):
        with pytest.raises(ValueError):
            _cpu.quantize_activations(np.ones(n, np.float32))


# ---- matmul ----------------------------------------------------------------------------------------------------
def engine_activations(x: np.ndarray) -> np.ndarray:
    """float64 values of the 8-bit activations the engine makes of x (ntok, cols), with the active path."""
    out = []
    for row in x:
        d, _, qs, _ = _cpu.quantize_activations(row)
        out.append((qs.astype(np.float64) * d[:, None].astype(np.float64)).reshape(-1))
    return np.array(out)


@pytest.mark.parametrize("kernel_path", PATHS, indirect=True)
@pytest.mark.parametrize("type_name", ALL_TYPES)
@pytest.mark.parametrize("rows,cols", [(37, 96), (1003, 160), (13, 1024)])
def test_matmul_matches_float64(kernel_path, type_name, rows, cols):
    rng = np.random.default_rng(rows * 7 + cols)
    raw = raw_weight(rng.standard_normal((rows, cols)).astype(np.float32) / math.sqrt(cols), type_name)
    W = exact_values(raw, type_name, cols)
    weight = _cpu.Weight(type_name, rows, cols, raw)
    for ntok in (1, 6):                                                   # 6: a group of 4 tokens plus a tail
        x = rng.standard_normal((ntok, cols)).astype(np.float32)
        y = weight.matmul(x)
        assert y.shape == (ntok, rows) and y.dtype == np.float32
        if type_name in QTYPES:
            xq = engine_activations(x)
            bound = np.abs(xq) @ np.abs(W).T
            assert np.all(np.abs(y - xq @ W.T) <= 1e-5 * bound + 1e-30), "not the exact integer math"
            # against unquantized activations: each activation is off by at most half a step of its block
            d = np.abs(x.reshape(ntok, -1, 32)).max(-1) / 127
            step_bound = (d.repeat(32, axis=1) / 2) @ np.abs(W).T
            assert np.all(np.abs(y - x.astype(np.float64) @ W.T) <= step_bound * (1 + 1e-3) + 1e-5 * bound)
        else:
            bound = np.abs(x.astype(np.float64)) @ np.abs(W).T
            assert np.all(np.abs(y - x.astype(np.float64) @ W.T) <= 1e-5 * bound + 1e-30)


@pytest.mark.parametrize("kernel_path", PATHS, indirect=True)
@pytest.mark.parametrize("type_name", ALL_TYPES)
def test_matmul_accumulates_into_y(kernel_path, type_name):
    rng = np.random.default_rng(11)
    rows, cols = 37, 96
    weight = _cpu.Weight(type_name, rows, cols, raw_weight(rng.standard_normal((rows, cols)).astype(np.float32),
                                                           type_name))
    x = rng.standard_normal((3, cols)).astype(np.float32)
    y0 = rng.standard_normal((3, rows)).astype(np.float32)
    y = y0.copy()
    out = weight.matmul(x, y)
    assert out is y
    np.testing.assert_array_equal(y, y0 + weight.matmul(x))


# ---- rmsnorm ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [96, 160, 576, 4096])
def test_rms_norm_matches_float64(n):
    rng = np.random.default_rng(n)
    x = (rng.standard_normal(n) * 30).astype(np.float32)
    x[0] = 2000.0                                                         # a massive activation
    g = rng.uniform(-2, 2, n).astype(np.float32)
    for eps in (1e-5, 1e-6):
        got = _cpu.rms_norm(x, g, eps)
        x64 = x.astype(np.float64)
        want = x64 / np.sqrt(np.mean(x64 * x64) + eps) * g
        np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-12)
    tiny = np.full(n, 1e-4, np.float32)                                   # eps matters when x is small
    np.testing.assert_allclose(_cpu.rms_norm(tiny, np.ones(n, np.float32), 1e-5),
                               1e-4 / np.sqrt(1e-8 + 1e-5), rtol=2e-6)


# ---- gated units -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kernel_path", PATHS)
def test_gated_units_match_float64(kernel_path):
    """SwiGLU silu(g) u and GeGLU gelu_tanh(g) u (Gemma's tanh approximation), over the range where exp saturates
    (within 2e-6 relative; 1e-12 absolute in the negative tail)."""
    _cpu.set_path(kernel_path)
    rng = np.random.default_rng(12)
    g = np.concatenate([rng.standard_normal(4000) * 3, np.linspace(-120, 120, 96)]).astype(np.float32)
    u = rng.standard_normal(g.size).astype(np.float32)
    g64, u64 = g.astype(np.float64), u.astype(np.float64)
    inner = np.sqrt(2 / np.pi) * (g64 + 0.044715 * g64 ** 3)
    # 0.5 (1 + tanh(a)) written as 1 / (1 + exp(-2a)): the same function, without float64's cancellation in
    # 1 + tanh(a) for large negative a (checked on the rest of the range)
    with np.errstate(over="ignore"):
        half_one_plus_tanh = 1 / (1 + np.exp(-2 * inner))
    moderate = np.abs(inner) < 5
    np.testing.assert_allclose(half_one_plus_tanh[moderate], 0.5 * (1 + np.tanh(inner[moderate])), rtol=1e-12)
    gelu = g64 * half_one_plus_tanh
    silu = g64 / (1 + np.exp(-g64))
    for kind, want in (("geglu", gelu * u64), ("swiglu", silu * u64)):
        got = _cpu.glu(g, u, kind)
        assert np.all(np.isfinite(got)), kind
        # atol: in the far negative tail exp(-z) turns float32's rounding of z into a few 1e-6 of values < 1e-13
        np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-12, err_msg=kind)


def test_gated_units_reject_bad_input():
    with pytest.raises(ValueError, match="multiple of 8"):
        _cpu.glu(np.zeros(12, np.float32), np.zeros(12, np.float32), "geglu")
    with pytest.raises(ValueError, match="unknown"):
        _cpu.glu(np.zeros(8, np.float32), np.zeros(8, np.float32), "relu")
