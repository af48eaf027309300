"""Numpy reference of GGUF block quantization, written from llama.cpp's ggml-quants.c (quantize_row_q8_0_ref,
quantize_row_q4_0_ref, quantize_row_q4_1_ref), to check inferd._cpu.quantize bit for bit.

All arithmetic is float32 as in the C code; scales are stored as IEEE f16 (round to nearest even).
"""
from __future__ import annotations

import numpy as np

BLOCK = 32


def _blocks(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    if x.ndim != 2 or x.shape[1] % BLOCK:
        raise ValueError(f"need a 2-D float array with rows of a multiple of {BLOCK}, got shape {x.shape}")
    return x.reshape(x.shape[0], x.shape[1] // BLOCK, BLOCK)


def _f16_bytes(d: np.ndarray) -> np.ndarray:
    return d.astype(np.float16).view(np.uint8).reshape(*d.shape, 2)


def _safe_inverse(d: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)


def quantize_reference(x: np.ndarray, type_name: str) -> np.ndarray:
    """float32 (rows, cols) -> uint8 (rows, bytes_per_row) GGUF blocks of Q8_0, Q4_0 or Q4_1."""
    b = _blocks(x)
    rows, nb = b.shape[:2]
    if type_name == "Q8_0":
        # d = amax / 127; q = roundf(x / d) (half away from zero); block = f16 d, 32 x int8
        d = (np.abs(b).max(axis=2) / np.float32(127)).astype(np.float32)
        scaled = b * _safe_inverse(d)[..., None]
        # the + 0.5 in float64: in float32, 0.49999997 + 0.5 rounds up to 1 where C's roundf gives 0
        q = (np.sign(scaled) * np.floor(np.abs(scaled).astype(np.float64) + 0.5)).astype(np.int8)
        out = np.concatenate([_f16_bytes(d), q.view(np.uint8)], axis=2)
    elif type_name == "Q4_0":
        # the signed value of largest magnitude (first one on ties) maps to -8: d = max / -8
        idx = np.abs(b).argmax(axis=2)
        vmax = np.take_along_axis(b, idx[..., None], axis=2)[..., 0]
        d = (vmax / np.float32(-8)).astype(np.float32)
        q = np.minimum(15, (b * _safe_inverse(d)[..., None] + np.float32(8.5)).astype(np.int8)).astype(np.uint8)
        packed = q[..., :16] | (q[..., 16:] << 4)  # value j in the low nibble of byte j, j + 16 in the high one
        out = np.concatenate([_f16_bytes(d), packed], axis=2)
    elif type_name == "Q4_1":
        vmin, vmax = b.min(axis=2), b.max(axis=2)
        d = ((vmax - vmin) / np.float32(15)).astype(np.float32)
        q = np.minimum(15, ((b - vmin[..., None]) * _safe_inverse(d)[..., None] + np.float32(0.5)).astype(np.int8))
        q = q.astype(np.uint8)
        packed = q[..., :16] | (q[..., 16:] << 4)
        out = np.concatenate([_f16_bytes(d), _f16_bytes(vmin), packed], axis=2)
    else:
        raise ValueError(f"quantize_reference: unsupported type {type_name}")
    return np.ascontiguousarray(out.reshape(rows, -1))
