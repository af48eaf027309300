"""The natively computed GGUF types beyond Q4_0/Q4_1/Q8_0 (Q4_K, Q5_K, Q6_K, Q5_0, Q5_1, the low-bit Q2_K, Q3_K,
IQ4_NL, IQ4_XS, MXFP4, and the codebook and ternary types IQ3_S, IQ3_XXS, IQ2_S, IQ2_XS, IQ2_XXS, IQ1_M, IQ1_S, TQ2_0,
TQ1_0) against the gguf package's own dequantizer and float64 numpy, on every path this CPU runs, and fused weights
of several types. The codebook and ternary types' blocks are random valid ones (gguf cannot write them).

Weights are random valid blocks (every bit pattern of values and sub-block scales; tests/model/kquant_ref.py) and
blocks quantized from normal data; row counts are not multiples of the 8-row tile. Tolerance against float64 on
the engine's own 8-bit activations: the integer block sums are exact, only the per-block float accumulation
rounds (1e-5 of the |W| |x| bound, as in test_kernels.py)."""
from __future__ import annotations

import math

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf import quants as gguf_quants

from inferd import _cpu
from tests.ext.test_kernels import ALL_PATHS, PATHS, engine_activations, path_available
from tests.model.kquant_ref import LANE_TYPES, quantize_iq4_nl, quantize_k, random_blocks, random_lane_blocks

K_TYPES = ("Q4_K", "Q5_K", "Q6_K", "Q2_K", "Q3_K", "IQ4_XS") + LANE_TYPES
TYPES = K_TYPES + ("Q5_0", "Q5_1", "IQ4_NL", "MXFP4")
SHAPES = {"K": [(13, 256), (37, 512), (8, 1536)], "32": [(13, 96), (37, 160), (8, 1024)]}


def shapes(type_name):
    return SHAPES["K" if type_name in K_TYPES else "32"]


def gguf_values(raw: np.ndarray, type_name: str, cols: int) -> np.ndarray:
    return gguf_quants.dequantize(np.ascontiguousarray(raw), GGMLQuantizationType[type_name]).reshape(-1, cols)


def quantized(values: np.ndarray, type_name: str) -> np.ndarray:
    if type_name in LANE_TYPES:
        return random_lane_blocks(values, type_name)
    if type_name in K_TYPES:
        return quantize_k(values, type_name)
    if type_name == "IQ4_NL":
        return quantize_iq4_nl(values)
    return gguf_quants.quantize(values, GGMLQuantizationType[type_name]).reshape(values.shape[0], -1)


def on_every_path(compute):
    """{path: compute()} for every kernel path this CPU runs"""
    old = _cpu.get_path()
    try:
        results = {}
        for p in filter(path_available, ALL_PATHS):
            _cpu.set_path(p)
            results[p] = compute()
        return results
    finally:
        _cpu.set_path(old)


def weights(type_name, rows, cols, seed):
    """(random valid blocks, blocks quantized from N(0, 1/cols) data)"""
    rng = np.random.default_rng(seed)
    return [random_blocks(type_name, rows, cols, rng),
            quantized((rng.standard_normal((rows, cols)) / math.sqrt(cols)).astype(np.float32), type_name)]


@pytest.mark.parametrize("type_name", TYPES)
def test_dequantize_equals_gguf(type_name):
    for rows, cols in shapes(type_name):
        for raw in weights(type_name, rows, cols, rows + cols):
            w = _cpu.Weight(type_name, rows, cols, raw)
            np.testing.assert_array_equal(w.dequantize(), gguf_values(raw, type_name, cols).astype(np.float32))
            assert w.nbytes >= raw.nbytes


@pytest.mark.parametrize("kernel_path", PATHS, indirect=True)
@pytest.mark.parametrize("type_name", TYPES)
def test_matmul_matches_float64(kernel_path, type_name):
    rng = np.random.default_rng(5)
    for rows, cols in shapes(type_name):
        for raw in weights(type_name, rows, cols, rows * cols):
            W = gguf_values(raw, type_name, cols).astype(np.float64)
            w = _cpu.Weight(type_name, rows, cols, raw)
            for ntok in (1, 6, 9):                       # 9: a group of 8 (or two of 4) and a tail
                x = rng.standard_normal((ntok, cols)).astype(np.float32)
                x[0, :32] *= 1e-4                        # blocks of very different scales in one row
                y = w.matmul(x)
                xq = engine_activations(x)
                bound = np.abs(xq) @ np.abs(W).T
                assert np.all(np.abs(y - xq @ W.T) <= 1e-5 * bound + 1e-30), f"{type_name} {rows}x{cols} ntok {ntok}"


@pytest.mark.parametrize("type_name", TYPES)
def test_bad_shapes_are_refused(type_name):
    block = 256 if type_name in K_TYPES else 32
    cols = block + 32 if type_name in K_TYPES else 48
    with pytest.raises(ValueError):
        _cpu.Weight(type_name, 4, cols, np.zeros((4, 10), np.uint8))
    with pytest.raises(ValueError):
        _cpu.Weight(type_name, 4, block, np.zeros((4, 3), np.uint8))      # wrong byte count


# ---- fused weights ---------------------------------------------------------------------------------------------
def test_segments_of_different_types_compute_each_part():
    """Wq (Q4_K) | Wk (Q4_K) | Wv (Q6_K) | a Q8_0 part: one weight of 3 segments whose rows equal each part's own,
    bit for bit, on every path."""
    cols, rng = 512, np.random.default_rng(8)
    specs = [("Q4_K", 24), ("Q4_K", 16), ("Q6_K", 16), ("Q8_0", 13)]
    parts = []
    for t, rows in specs:
        values = (rng.standard_normal((rows, cols)) / math.sqrt(cols)).astype(np.float32)
        raw = quantized(values, t) if t != "Q8_0" else _cpu.quantize(values, "Q8_0")
        parts.append((t, rows, cols, raw))
    fused = _cpu.Weight("parts", 0, 0, None, parts=parts)
    singles = [_cpu.Weight(*p) for p in parts]
    np.testing.assert_array_equal(fused.dequantize(), np.concatenate([s.dequantize() for s in singles]))
    x = rng.standard_normal((5, cols)).astype(np.float32)
    old = _cpu.get_path()
    try:
        for p in filter(path_available, ALL_PATHS):
            _cpu.set_path(p)
            want = np.concatenate([s.matmul(x) for s in singles], axis=1)
            np.testing.assert_array_equal(fused.matmul(x).view(np.uint32), want.view(np.uint32))
    finally:
        _cpu.set_path(old)


def test_low_bit_segments_compute_each_part():
    """A Q3_K_M file's Wq|Wk (Q3_K) | Wv (Q5_K), and Q2_K | IQ4_XS | IQ4_NL: each part's rows, bit for bit, on every
    path, for a decode step and a prefill."""
    cols, rng = 512, np.random.default_rng(12)
    for specs in ([("Q3_K", 24), ("Q5_K", 16)], [("Q2_K", 16), ("IQ4_XS", 8), ("IQ4_NL", 11)],
                  [("MXFP4", 24), ("Q8_0", 16), ("MXFP4", 5)]):
        check_fused_parts(specs, cols, rng)


@pytest.mark.parametrize("specs", [
    [("IQ3_XXS", 24), ("IQ3_S", 16), ("Q4_K", 13)],       # an IQ3_XXS file's Q|K|V: IQ3_S K, Q4_K V
    [("IQ2_XXS", 16), ("IQ2_S", 8), ("IQ2_XS", 11)],
    [("IQ1_S", 8), ("IQ1_M", 16), ("Q2_K", 9)],
    [("TQ1_0", 16), ("TQ2_0", 8), ("IQ4_XS", 5)],
])
def test_codebook_segments_compute_each_part(specs):
    """Fused Q|K|V or gate|up of the codebook and ternary types beside each other and beside the K-quants: each
    part's rows, bit for bit, on every path, for a decode step and a prefill."""
    cols, rng = 512, np.random.default_rng(len(specs[0][0]) + specs[0][1])
    check_fused_parts(specs, cols, rng)


def check_fused_parts(specs, cols, rng):
    """A weight fused of parts (type, rows) dequantizes and multiplies as its parts one by one, bit for bit, on every
    path, for a decode step (1 token) and a prefill (12)."""
    parts = [(t, rows, cols, quantized((rng.standard_normal((rows, cols)) / math.sqrt(cols)).astype(np.float32), t))
             for t, rows in specs]
    fused = _cpu.Weight("parts", 0, 0, None, parts=parts)
    singles = [_cpu.Weight(*p) for p in parts]
    np.testing.assert_array_equal(fused.dequantize(), np.concatenate([s.dequantize() for s in singles]))
    x = rng.standard_normal((12, cols)).astype(np.float32)
    old = _cpu.get_path()
    try:
        for p in filter(path_available, ALL_PATHS):
            _cpu.set_path(p)
            for n in (1, 12):
                want = np.concatenate([s.matmul(x[:n]) for s in singles], axis=1)
                np.testing.assert_array_equal(fused.matmul(x[:n]).view(np.uint32), want.view(np.uint32))
    finally:
        _cpu.set_path(old)


def test_interleaved_parts_alternate_groups_of_rows():
    cols, rng = 256, np.random.default_rng(9)
    gate, up = (random_blocks("Q4_K", 64, cols, rng) for _ in range(2))
    fused = _cpu.Weight("parts", 0, 0, None, parts=[("Q4_K", 64, cols, gate), ("Q4_K", 64, cols, up)],
                        interleave=32)
    g, u = gguf_values(gate, "Q4_K", cols), gguf_values(up, "Q4_K", cols)
    want = np.concatenate([g[:32], u[:32], g[32:], u[32:]]).astype(np.float32)
    np.testing.assert_array_equal(fused.dequantize(), want)


def test_bad_fusions_are_refused():
    z = np.zeros((8, 144), np.uint8)
    with pytest.raises(ValueError, match="not supported"):        # four segments
        _cpu.Weight("parts", 0, 0, None, parts=[("Q4_K", 8, 256, z), ("Q6_K", 8, 256, np.zeros((8, 210), np.uint8)),
                                                ("Q4_K", 8, 256, z), ("Q8_0", 8, 256, np.zeros((8, 272), np.uint8))])
    with pytest.raises(ValueError):                               # a part of 5 rows before another: tiles straddle
        _cpu.Weight("parts", 0, 0, None,
                    parts=[("Q4_K", 5, 256, z[:5]), ("Q6_K", 8, 256, np.zeros((8, 210), np.uint8))])
    with pytest.raises(ValueError, match="not supported"):        # input widths differ
        _cpu.Weight("parts", 0, 0, None, parts=[("Q4_K", 8, 256, z), ("Q4_K", 8, 512, np.zeros((8, 288), np.uint8))])
    with pytest.raises(ValueError, match="not supported"):        # interleaved parts of two types
        _cpu.Weight("parts", 0, 0, None, parts=[("Q4_K", 8, 256, z), ("Q6_K", 8, 256, np.zeros((8, 210), np.uint8))],
                    interleave=8)


def test_mxfp4_every_exponent_and_code_dequantizes_as_gguf():
    """All 256 E8M0 exponents (0 and 1 give subnormal scales) with all 16 codes: gguf's values, exactly."""
    rows, cols = 256, 32
    raw = np.zeros((rows, 17), np.uint8)
    raw[:, 0] = np.arange(256)
    codes = np.arange(32) % 16
    raw[:, 1:] = (codes[:16] | (codes[16:][::-1] << 4)).astype(np.uint8)
    w = _cpu.Weight("MXFP4", rows, cols, raw)
    with np.errstate(over="ignore"):                    # the largest exponents' 12 * 2^127 is inf in both
        want = gguf_values(raw, "MXFP4", cols).astype(np.float32)
    np.testing.assert_array_equal(w.dequantize().view(np.uint32), want.view(np.uint32))
    assert want[0, 1] == 2.0 ** -128 and want[130, 7] == 12 * 4.0 and want[130, 15] == -12 * 4.0   # 2^(e-128) v


@pytest.mark.parametrize("ntok", [1, 9])
def test_mxfp4_small_exponents_through_the_kernels_as_scalar(ntok):
    """Exponents 0 and 1 (subnormal scales) beside normal ones in the SIMD kernels' scale decoding, for a decode
    step's group kernel (1 token) and a prefill's: the scalar path's bits on every path."""
    rows, cols = 43, 256
    rng = np.random.default_rng(5)
    raw = rng.integers(0, 256, (rows, cols // 32, 17), dtype=np.uint8)
    raw[:, :, 0] = rng.choice(np.array([0, 1, 2, 3, 4, 126, 127, 200], np.uint8), (rows, cols // 32))
    raw[:10, :, 0] = rng.integers(0, 2, (10, cols // 32))              # a tile and more of subnormal scales alone
    w = _cpu.Weight("MXFP4", rows, cols, np.ascontiguousarray(raw.reshape(rows, -1)))
    x = rng.standard_normal((ntok, cols)).astype(np.float32)
    results = on_every_path(lambda: w.matmul(x).view(np.uint32))
    assert len(results) > 1, "no SIMD path on this CPU"
    assert np.isfinite(results["scalar"].view(np.float32)).all()
    tiny = np.abs(results["scalar"].view(np.float32)[:, :10])
    assert (tiny > 0).all() and tiny.max() < 2.0 ** -100                # their sums: subnormal-scaled, not flushed
    for p, r in results.items():
        np.testing.assert_array_equal(r, results["scalar"], err_msg=p)


# ---- the codebook types' largest block sums ---------------------------------------------------------------------
def _largest_blocks(type_name: str, index: int) -> np.ndarray:
    """One block of type_name whose every grid index is `index`, every sign positive and every 4-bit scale 15 (d 1)"""
    size = {"IQ2_XXS": 66, "IQ2_XS": 74, "IQ2_S": 82, "IQ3_XXS": 98, "IQ3_S": 110}[type_name]
    b = np.zeros(size, np.uint8)
    b[0:2] = np.array([1.0], np.float16).view(np.uint8)
    if type_name in ("IQ2_XXS", "IQ3_XXS"):   # indices | u32 words: 4 x 7 sign bits (0), scale << 28
        words = np.full(8, 0xF0000000, np.uint32).view(np.uint8).reshape(8, 4)
        if type_name == "IQ2_XXS":
            q = b[2:66].reshape(8, 8)
            q[:, :4], q[:, 4:] = index, words
        else:
            b[2:66], b[66:98] = index, words.ravel()
    elif type_name == "IQ2_XS":               # u16: 9-bit index | sign bits (0) << 9 | scales (two nibbles)
        b[2:66] = np.full(32, index, np.uint16).view(np.uint8)
        b[66:74] = 0xFF
    elif type_name == "IQ2_S":                # qs | signs (0) | qh (2 index bits per 8 values) | scales
        b[2:34], b[66:74], b[74:82] = index & 255, (index >> 8) * 0x55, 0xFF
    else:                                     # IQ3_S: qs | qh (index bit 8) | signs (0) | scales
        b[2:66], b[66:74], b[106:110] = index & 255, 0xFF if index >> 8 else 0, 0xFF
    return b


@pytest.mark.parametrize("type_name", ["IQ3_S", "IQ3_XXS", "IQ2_S", "IQ2_XS", "IQ2_XXS"])
def test_codebook_largest_block_sums_are_exact(type_name):
    """Every index the grid's entry of the largest sum, every sign positive, every scale 15, every activation 127:
    about the largest block sum each type can give (the SIMD kernels add products in int16 before the scale, which
    must not overflow) equals float64's and the scalar path's, for a decode step and a prefill."""
    grid_size = {"IQ2_XXS": 256, "IQ2_XS": 512, "IQ2_S": 1024, "IQ3_XXS": 256, "IQ3_S": 512}[type_name]
    candidates = np.stack([_largest_blocks(type_name, k) for k in range(grid_size)])
    best = int(np.argmax(gguf_values(candidates, type_name, 256).sum(axis=1)))
    rows, cols = 16, 512
    raw = np.tile(_largest_blocks(type_name, best), (rows, cols // 256))
    W = gguf_values(raw, type_name, cols).astype(np.float64)
    assert W.min() > 0   # the grid entry of the largest sum, every value positive
    w = _cpu.Weight(type_name, rows, cols, raw)
    x = np.ones((12, cols), np.float32)
    results = on_every_path(lambda: [w.matmul(x[:n]) for n in (1, 12)])
    for p, ys in results.items():
        for y in ys:
            np.testing.assert_array_equal(y.view(np.uint32), results["scalar"][1][: len(y)].view(np.uint32), p)
            np.testing.assert_allclose(y, np.ones((len(y), cols)) @ W.T, rtol=1e-6)


# ---- Q6_K's largest block sums ----------------------------------------------------------------------------------
@pytest.mark.parametrize("sign", [1, -1])
@pytest.mark.parametrize("ntok", [1, 2, 12])
def test_q6_k_largest_block_sums_are_exact(sign, ntok):
    """Every 6-bit code 63 (value 31, stored as 63 by the tiles), every sub-block scale 127, every activation +-127:
    the largest products the AVX2 kernels add two at a time in int16 before a scale's madd (2 x 2 x 63 x 127 < 2^15).
    A decode step (1 token), a few tokens and a prefill's pairs of tiles: the scalar path's bits and float64's sums."""
    rows, cols = 16, 512
    block = np.zeros(210, np.uint8)               # ql[128] | qh[64] | scales[16] (int8) | d (f16)
    block[:192] = 0xFF
    block[192:208] = 127
    block[208:210] = np.array([2.0 ** -10], np.float16).view(np.uint8)
    raw = np.tile(block, (rows, cols // 256))
    W = gguf_values(raw, "Q6_K", cols).astype(np.float64)
    assert (W == W[0, 0]).all() and W[0, 0] > 0
    w = _cpu.Weight("Q6_K", rows, cols, raw)
    x = np.full((ntok, cols), float(sign), np.float32)
    results = on_every_path(lambda: w.matmul(x))
    assert len(results) > 1, "no SIMD path on this CPU"
    for p, y in results.items():
        np.testing.assert_array_equal(y.view(np.uint32), results["scalar"].view(np.uint32), p)
        np.testing.assert_allclose(y, x.astype(np.float64) @ W.T, rtol=1e-6)
