"""Numpy writers of GGUF K-quant and IQ4 blocks (Q4_K, Q5_K, Q6_K, Q2_K, Q3_K, IQ4_NL, IQ4_XS) for tests: the gguf
package reads these types but does not write them. A plain quantizer (scales from each sub-block's range, rounded
to nearest), not llama.cpp's search for the best scales: tests need valid blocks with values close to the input,
and they read them back with gguf's own dequantize, so the packing below is checked against an independent reader.

random_blocks() gives arbitrary valid blocks (every bit pattern but the f16 scales is valid), which exercise
every value and scale, including those a quantizer rarely produces."""
from __future__ import annotations

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf import quants as gguf_quants

QK_K = 256


def _f16(v: np.ndarray) -> np.ndarray:
    return v.astype(np.float16).view(np.uint8).reshape(*v.shape, 2)


def _pack_scales_k4(sc: np.ndarray, mn: np.ndarray) -> np.ndarray:
    """(n, 8) 6-bit scales and mins -> (n, 12) bytes, the layout get_scale_min_k4 reads."""
    out = np.zeros((sc.shape[0], 12), np.uint8)
    sc, mn = sc.astype(np.uint8), mn.astype(np.uint8)
    out[:, 0:4] = (sc[:, 0:4] & 63) | ((sc[:, 4:8] >> 4) << 6)
    out[:, 4:8] = (mn[:, 0:4] & 63) | ((mn[:, 4:8] >> 4) << 6)
    out[:, 8:12] = (sc[:, 4:8] & 15) | ((mn[:, 4:8] & 15) << 4)
    return out


def _asym(x: np.ndarray, levels: int):
    """x (n, 8, 32) -> d, dmin (n,), sc, mn (n, 8), q (n, 8, 32) with x ~ d*sc*q - dmin*mn."""
    lo = np.minimum(x.min(-1), 0.0)
    hi = x.max(-1)
    scale, minv = (hi - lo) / levels, -lo
    d = (scale.max(-1) / 63).astype(np.float16).astype(np.float32)
    dmin = (minv.max(-1) / 63).astype(np.float16).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.clip(np.nan_to_num(np.rint(scale / d[:, None])), 0, 63)
        mn = np.clip(np.nan_to_num(np.rint(minv / dmin[:, None])), 0, 63)
        step = (d[:, None] * sc)[..., None]
        q = np.nan_to_num(np.rint((x + (dmin[:, None] * mn)[..., None]) / step))
    return d, dmin, sc, mn, np.clip(q, 0, levels).astype(np.uint8)


def quantize_k(x: np.ndarray, type_name: str) -> np.ndarray:
    """float32 (rows, cols), cols % 256 == 0 -> uint8 (rows, bytes_per_row) GGUF blocks."""
    rows, cols = x.shape
    if cols % QK_K:
        raise ValueError(f"{type_name} needs rows of a multiple of 256 values, got {cols}")
    b = np.asarray(x, np.float64).reshape(-1, QK_K)
    n = b.shape[0]
    if type_name in ("Q4_K", "Q5_K"):
        d, dmin, sc, mn, q = _asym(b.reshape(n, 8, 32), 15 if type_name == "Q4_K" else 31)
        q = q.reshape(n, 4, 2, 32)                               # chunk c: sub-blocks 2c (low), 2c+1 (high)
        qs = ((q[:, :, 0] & 15) | ((q[:, :, 1] & 15) << 4)).reshape(n, 128)
        head = [_f16(d), _f16(dmin), _pack_scales_k4(sc, mn)]
        if type_name == "Q4_K":
            out = np.concatenate(head + [qs], 1)
        else:
            hbit = (q >> 4) & 1                                   # (n, 4, 2, 32): bit 2c + half of qh[l]
            qh = np.zeros((n, 32), np.uint8)
            for c in range(4):
                for h in range(2):
                    qh |= (hbit[:, c, h] << (2 * c + h)).astype(np.uint8)
            out = np.concatenate(head + [qh, qs], 1)
    elif type_name == "Q6_K":
        s = b.reshape(n, 16, 16)
        amax_i = np.abs(s).argmax(-1)
        vmax = np.take_along_axis(s, amax_i[..., None], -1)[..., 0]
        scale = vmax / -32                                        # signed: the largest magnitude maps to -32
        imax = np.abs(scale).argmax(-1)
        d = (np.take_along_axis(scale, imax[:, None], -1)[:, 0] / -128).astype(np.float16).astype(np.float32)
        with np.errstate(divide="ignore", invalid="ignore"):
            sc = np.clip(np.nan_to_num(np.rint(scale / d[:, None])), -128, 127)
            step = (d[:, None] * sc)[..., None]
            q = np.clip(np.nan_to_num(np.rint(s / step)), -32, 31).astype(np.int16) + 32
        q = q.reshape(n, 2, 4, 32).astype(np.uint8)               # half n, quarter k (values 128n + 32k + l)
        ql = np.concatenate([(q[:, :, 0] & 15) | ((q[:, :, 2] & 15) << 4),
                             (q[:, :, 1] & 15) | ((q[:, :, 3] & 15) << 4)], -1).reshape(n, 128)
        qh = ((q[:, :, 0] >> 4) | ((q[:, :, 1] >> 4) << 2) | ((q[:, :, 2] >> 4) << 4) |
              ((q[:, :, 3] >> 4) << 6)).reshape(n, 64)
        out = np.concatenate([ql, qh, sc.astype(np.int8).view(np.uint8), _f16(d)], 1)
    elif type_name == "Q2_K":
        out = _q2_k(b)
    elif type_name == "Q3_K":
        out = _q3_k(b)
    elif type_name == "IQ4_XS":
        out = _iq4_xs(b)
    else:
        raise ValueError(type_name)
    return np.ascontiguousarray(out.astype(np.uint8).reshape(rows, -1))


def _q2_k(b: np.ndarray) -> np.ndarray:
    """(n, 256) -> (n, 84): scales[16] (sc | mn << 4) | qs[64] | d | dmin; x ~ d*sc*q - dmin*mn, q < 4."""
    n = b.shape[0]
    s = b.reshape(n, 16, 16)
    lo, hi = np.minimum(s.min(-1), 0.0), s.max(-1)
    scale, minv = (hi - lo) / 3, -lo
    d = (scale.max(-1) / 15).astype(np.float16).astype(np.float32)
    dmin = (minv.max(-1) / 15).astype(np.float16).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.clip(np.nan_to_num(np.rint(scale / d[:, None])), 0, 15).astype(np.uint8)
        mn = np.clip(np.nan_to_num(np.rint(minv / dmin[:, None])), 0, 15).astype(np.uint8)
        q = np.nan_to_num(np.rint((s + (dmin[:, None] * mn)[..., None]) / (d[:, None] * sc)[..., None]))
    q = np.clip(q, 0, 3).astype(np.uint8).reshape(n, 2, 4, 32)      # value 128h + 32k + l at qs[32h + l] bits 2k
    qs = (q[:, :, 0] | (q[:, :, 1] << 2) | (q[:, :, 2] << 4) | (q[:, :, 3] << 6)).reshape(n, 64)
    return np.concatenate([sc | (mn << 4), qs, _f16(d), _f16(dmin)], 1)


def _q3_k(b: np.ndarray) -> np.ndarray:
    """(n, 256) -> (n, 110): hmask[32] | qs[64] | scales[12] (6-bit, offset 32) | d; x ~ d*sc*q, -4 <= q < 4."""
    n = b.shape[0]
    s = b.reshape(n, 16, 16)
    vmax = np.take_along_axis(s, np.abs(s).argmax(-1)[..., None], -1)[..., 0]
    scale = vmax / -4                                              # the largest magnitude maps to -4
    d = (np.take_along_axis(scale, np.abs(scale).argmax(-1)[:, None], -1)[:, 0] / -32).astype(np.float16)
    d = d.astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.clip(np.nan_to_num(np.rint(scale / d[:, None])), -32, 31)
        q = np.nan_to_num(np.rint(s / (d[:, None] * sc)[..., None]))
    u = (np.clip(q, -4, 3) + 4).astype(np.uint8).reshape(n, 2, 4, 32)   # q + 4: low 2 bits, and the high bit
    qs = ((u[:, :, 0] & 3) | ((u[:, :, 1] & 3) << 2) | ((u[:, :, 2] & 3) << 4) | ((u[:, :, 3] & 3) << 6))
    hbit = (u.reshape(n, 8, 32) >> 2) & 1                           # value 32i + l: bit i of hmask[l]
    hmask = np.zeros((n, 32), np.uint8)
    for i in range(8):
        hmask |= (hbit[:, i] << i).astype(np.uint8)
    ls = (sc + 32).astype(np.uint8)
    scales = np.zeros((n, 12), np.uint8)
    scales[:, 0:8] = (ls[:, 0:8] & 15) | ((ls[:, 8:16] & 15) << 4)
    for m in range(4):
        scales[:, 8:12] |= ((ls[:, 4 * m:4 * m + 4] >> 4) << (2 * m)).astype(np.uint8)
    return np.concatenate([hmask, qs.reshape(n, 64), scales, _f16(d)], 1)


IQ4_VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.float64)


def _iq4_codes(x: np.ndarray, step: np.ndarray) -> np.ndarray:
    """x (..., k) / step (...) -> the nearest IQ4 grid value's code, uint8 (..., k)"""
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.nan_to_num(x / step[..., None])
    return np.abs(t[..., None] - IQ4_VALUES).argmin(-1).astype(np.uint8)


def quantize_iq4_nl(x: np.ndarray) -> np.ndarray:
    """float32 (rows, cols), cols % 32 == 0 -> (rows, cols / 32 * 18): d | qs[16] (codes j, j + 16 in byte j)."""
    rows, cols = x.shape
    b = np.asarray(x, np.float64).reshape(-1, 32)
    vmax = np.take_along_axis(b, np.abs(b).argmax(-1)[:, None], -1)[:, 0]
    d = (vmax / -127).astype(np.float16).astype(np.float32)        # the largest magnitude maps to -127
    q = _iq4_codes(b, d.astype(np.float64))
    out = np.concatenate([_f16(d), q[:, :16] | (q[:, 16:] << 4)], 1)
    return np.ascontiguousarray(out.reshape(rows, -1))


def _iq4_xs(b: np.ndarray) -> np.ndarray:
    """(n, 256) -> (n, 136): d | scales_h (u16) | scales_l[4] | qs[128]; x ~ d * (ls - 32) * IQ4_VALUES[q]."""
    n = b.shape[0]
    s = b.reshape(n, 8, 32)
    vmax = np.take_along_axis(s, np.abs(s).argmax(-1)[..., None], -1)[..., 0]
    scale = vmax / -127
    d = (np.take_along_axis(scale, np.abs(scale).argmax(-1)[:, None], -1)[:, 0] / -32).astype(np.float16)
    d = d.astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.clip(np.nan_to_num(np.rint(scale / d[:, None])), -32, 31)
    q = _iq4_codes(s, d[:, None].astype(np.float64) * sc)
    ls = (sc + 32).astype(np.uint16)
    scales_h = np.zeros(n, np.uint16)
    for i in range(8):
        scales_h |= ((ls[:, i] >> 4) << (2 * i)).astype(np.uint16)
    scales_l = ((ls[:, 0::2] & 15) | ((ls[:, 1::2] & 15) << 4)).astype(np.uint8)
    qs = (q[..., :16] | (q[..., 16:] << 4)).reshape(n, 128)
    return np.concatenate([_f16(d), scales_h.view(np.uint8).reshape(n, 2), scales_l, qs], 1)


# the types whose blocks come out of codebooks, sign bits and ternary digits (the engine keeps their blocks whole):
# gguf cannot write them, and a search over their grids is llama.cpp's work, not a test's: tests use random valid
# blocks of these (every index, sign and scale bit pattern is valid)
LANE_TYPES = ("IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M", "TQ1_0", "TQ2_0")
_D_OFFSET = {"TQ1_0": 52, "TQ2_0": 64}


def _set_d(type_name: str, data: np.ndarray, d: np.ndarray) -> None:
    """Write f16 scales d (rows, nb) into blocks data (rows, nb, size); IQ1_M's d lies in its scale words' top
    nibbles."""
    h = d.astype(np.float16).view(np.uint16)
    if type_name == "IQ1_M":
        sc = data[:, :, 48:56].copy().view(np.uint16) & np.uint16(0x0FFF)
        for k in range(4):
            sc[..., k] |= ((h >> (4 * k)) & 15) << 12
        data[:, :, 48:56] = sc.view(np.uint8)
    else:
        off = _D_OFFSET.get(type_name, 0)
        data[:, :, off:off + 2] = h.view(np.uint8).reshape(*h.shape, 2)


def random_blocks(type_name: str, rows: int, cols: int, rng: np.random.Generator, scale: float = 0.01) -> np.ndarray:
    """Random valid GGUF blocks: random bytes, with the f16 scales set to values in [0, scale) (MXFP4: exponents
    whose scales lie within [scale / 2^16, scale))."""
    block, size = GGML_QUANT_SIZES[GGMLQuantizationType[type_name]]
    nb = cols // block
    data = rng.integers(0, 256, (rows, nb, size), dtype=np.uint8)
    if type_name == "MXFP4":   # e | qs[16]: scale 2^(e - 128) times the doubled e2m1 values
        top = 128 + int(np.floor(np.log2(scale)))
        data[:, :, 0] = rng.integers(top - 16, top, (rows, nb), dtype=np.uint8)
        return np.ascontiguousarray(data.reshape(rows, nb * size))
    if type_name in LANE_TYPES:
        _set_d(type_name, data, rng.uniform(0, scale, (rows, nb)))
        return np.ascontiguousarray(data.reshape(rows, nb * size))
    offsets = {"Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0],
               "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208], "Q2_K": [80, 82], "Q3_K": [108],
               "IQ4_NL": [0], "IQ4_XS": [0]}[type_name]
    for off in offsets:
        data[:, :, off:off + 2] = _f16(rng.uniform(0, scale, (rows, nb)).astype(np.float32))
    return np.ascontiguousarray(data.reshape(rows, nb * size))


def random_lane_blocks(x: np.ndarray, type_name: str) -> np.ndarray:
    """Random valid blocks of a LANE_TYPES type, seeded by x, whose values have about x's root mean square: a stand-in
    for a quantizer of x (its values are not x's)."""
    rows, cols = x.shape
    rng = np.random.default_rng(int(np.frombuffer(np.ascontiguousarray(x, np.float32).tobytes()[:64].ljust(64, b"\0"),
                                                  np.uint32).sum()))
    data = random_blocks(type_name, rows, cols, rng, scale=1.0).reshape(rows, cols // QK_K, -1)
    _set_d(type_name, data, np.ones((rows, cols // QK_K)))
    unit = gguf_quants.dequantize(data.reshape(rows, -1), GGMLQuantizationType[type_name])
    rms = float(np.sqrt(np.mean(np.square(np.asarray(x, np.float64)))))
    _set_d(type_name, data, np.full((rows, cols // QK_K), rms / max(float(np.sqrt(np.mean(np.square(unit)))), 1e-30)))
    return np.ascontiguousarray(data.reshape(rows, -1))
