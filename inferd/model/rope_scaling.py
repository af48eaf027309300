"""llama3 RoPE scaling: its per-frequency factors, and its parameters read back from llama.cpp's rope_freqs tensor
or from a Hugging Face config's rope_scaling."""

from __future__ import annotations

import math
from typing import Any
from collections.abc import Mapping

import numpy as np

LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


def llama3_freq_factors(head_dim: int, theta: float, scaling: Mapping[str, float]) -> np.ndarray:
    """Per-frequency divisors of the rope angle for llama3 scaling, (head_dim/2,) float64.

    Same formula as HF's _compute_llama3_parameters and llama.cpp's rope_freqs tensor: high frequencies are
    kept, low ones divided by `factor`, the band between interpolated smoothly.
    """
    inv_freq = theta ** -(np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    wavelen = 2 * math.pi / inv_freq
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    orig = scaling["original_max_position_embeddings"]
    smooth = (orig / wavelen - low) / (high - low)
    mid = 1.0 / ((1 - smooth) / factor + smooth)
    return np.where(wavelen < orig / high, 1.0, np.where(wavelen > orig / low, factor, mid))


def llama3_from_factors(factors: np.ndarray, head_dim: int, theta: float, orig_hint: Any = None) -> dict | None:
    """Recover llama3 rope_scaling parameters from llama.cpp's rope_freqs tensor, checking the fit.

    Only the ratios orig/low and orig/high matter to the factors, so `orig` is taken from the file's
    original_context_length when present (else llama 3.1's 8192) and low/high are solved for.
    """
    if factors.shape != (head_dim // 2,):
        raise ValueError(f"rope_freqs.weight has {factors.size} values, expected head_dim/2 = {head_dim // 2}")
    if not np.all(np.isfinite(factors)) or factors.min() <= 0:
        raise ValueError("rope_freqs.weight holds non-positive or non-finite values")
    if np.allclose(factors, 1.0):
        return None
    factor = float(factors.max())
    orig = float(orig_hint or 8192)
    inv_freq = theta ** -(np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    wavelen = 2 * math.pi / inv_freq
    mid = (factors > 1 + 1e-4) & (factors < factor * (1 - 1e-4))
    low, high = 1.0, 4.0  # llama 3.1/3.2's values, used when the tensor has no smooth band to solve from
    if mid.sum() >= 2:
        smooth = (1 / factors[mid] - 1 / factor) / (1 - 1 / factor)
        slope, icept = np.polyfit(1 / wavelen[mid], smooth, 1)  # smooth = orig/(high-low)/wavelen - low/(high-low)
        if slope > 0:
            low = -icept * orig / slope
            high = low + orig / slope
    scaling = {
        "factor": factor,
        "low_freq_factor": float(low),
        "high_freq_factor": float(high),
        "original_max_position_embeddings": int(round(orig)),
    }
    if not np.allclose(llama3_freq_factors(head_dim, theta, scaling), factors, rtol=1e-3, atol=1e-4):
        raise ValueError("rope_freqs.weight does not follow llama3 rope scaling; this rope variant is not supported")
    return scaling


def check_llama3(s: Mapping[str, Any]) -> None:
    missing = [k for k in LLAMA3_KEYS if k not in s]
    if missing:
        raise ValueError(f"llama3 rope_scaling lacks {', '.join(missing)}")
    if not (
        s["factor"] >= 1
        and 0 < s["low_freq_factor"] < s["high_freq_factor"]
        and s["original_max_position_embeddings"] > 0
    ):
        raise ValueError(f"llama3 rope_scaling values are inconsistent: {dict(s)}")


def hf_rope_scaling(scaling: Mapping[str, Any] | None) -> dict | None:
    if not scaling:
        return None
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind in (None, "default"):
        return None
    if kind != "llama3":
        raise ValueError(f"rope scaling type {kind!r} is not supported (only llama3)")
    out: dict[str, Any] = {k: scaling.get(k) for k in LLAMA3_KEYS}
    check_llama3({k: v for k, v in out.items() if v is not None})  # raises if any is missing
    return {
        "factor": float(out["factor"]),
        "low_freq_factor": float(out["low_freq_factor"]),
        "high_freq_factor": float(out["high_freq_factor"]),
        "original_max_position_embeddings": int(out["original_max_position_embeddings"]),
    }
