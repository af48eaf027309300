"""Convert loaded tensors into the types the engine computes with (tensor.NATIVE_TYPES: F32, F16, BF16, Q4_0,
Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS, MXFP4, IQ3_S, IQ3_XXS, IQ2_S, IQ2_XS, IQ2_XXS,
IQ1_M, IQ1_S, TQ1_0, TQ2_0).

- Native types pass through untouched: the arrays stay views over the file's mmap, nothing is copied; the C side
  repacks them into its tiles straight from there, in their own bit width.
- requantize() gives any readable type's values as Q8_0 (the CUDA engine's route for the types its kernels lack).
- Float weights (HF checkpoints, F16/F32 GGUFs) are quantized on request to q8_0 or q4_0 by the C kernel
  inferd._cpu.quantize. With q4_0 the token embedding and output head go to Q8_0 instead: the output head is the
  matrix most sensitive to quantization (llama.cpp keeps it at Q6_K in its 4-bit presets for the same reason).
- Vectors (norm weights, biases) in F16/BF16 become F32: they are tiny and the engine adds/multiplies them in f32.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from .tensor import NATIVE_TYPES, Tensor, bytes_per_row

LOADABLE_TYPES = NATIVE_TYPES
QUANTIZE_TARGETS = ("q8_0", "q4_0")
FLOAT_TYPES = ("F32", "F16", "BF16")
_CHUNK_VALUES = 1 << 22  # convert ~16 MiB of f32 at a time so a 7B model never needs a full f32 copy


def check_quantize_arg(quantize: str | None) -> str | None:
    if quantize is None:
        return None
    q = quantize.lower()
    if q not in QUANTIZE_TARGETS:
        raise ValueError(f"quantize must be one of {', '.join(QUANTIZE_TARGETS)} or None, got {quantize!r}")
    return q


def target_type(t: Tensor, quantize: str | None = None) -> str:
    """The type tensor `t` will have after convert_tensor."""
    if t.rows == 1 and t.type in ("F16", "BF16"):
        return "F32"
    # not the vectors, nor a matrix of rows shorter than a block (a Gated DeltaNet's convolution taps)
    if quantize and t.type in FLOAT_TYPES and t.rows > 1 and t.cols % 32 == 0:
        if quantize == "q4_0" and t.name not in ("token_embd.weight", "output.weight"):
            return "Q4_0"
        return "Q8_0"
    if t.type not in NATIVE_TYPES:
        raise ValueError(
            f"tensor {t.name} has type {t.type}, which cannot be loaded (supported: {', '.join(LOADABLE_TYPES)})"
        )
    return t.type


def convert_tensor(t: Tensor, quantize: str | None = None) -> Tensor:
    quantize = check_quantize_arg(quantize)
    target = target_type(t, quantize)
    if target == t.type:
        return t
    if target == "F32":
        return Tensor(t.name, "F32", t.rows, t.cols, to_float32(t, 0, t.rows))
    return requantize(t, target)


def requantize(t: Tensor, target: str = "Q8_0") -> Tensor:
    """t's values quantized to `target` (Q8_0, Q4_0, Q4_1), ~16 MiB of float32 at a time."""
    out = np.empty((t.rows, bytes_per_row(target, t.cols)), dtype=np.uint8)
    step = max(1, _CHUNK_VALUES // t.cols)
    for r0 in range(0, t.rows, step):
        r1 = min(t.rows, r0 + step)
        out[r0:r1] = quantize_rows(to_float32(t, r0, r1), target)
    return Tensor(t.name, target, t.rows, t.cols, out)


def convert_all(tensors: Iterable[Tensor], quantize: str | None = None) -> dict[str, Tensor]:
    """Every tensor in the type the engines take."""
    quantize = check_quantize_arg(quantize)
    return {t.name: convert_tensor(t, quantize) for t in tensors}


def to_float32(t: Tensor, r0: int, r1: int) -> np.ndarray:
    """Rows [r0, r1) of `t` as float32 (r1 - r0, cols)."""
    rows = t.data[r0:r1]
    if t.type == "F32":
        return np.array(rows, dtype=np.float32)
    if t.type == "F16":
        return rows.view(np.float16).astype(np.float32)
    if t.type == "BF16":
        return (rows.astype(np.uint32) << 16).view(np.float32)  # bf16 is the top half of an f32
    from gguf import GGMLQuantizationType, quants  # the gguf package's reference code: only a few loads get here

    return quants.dequantize(np.ascontiguousarray(rows), GGMLQuantizationType[t.type]).astype(np.float32)


def quantize_rows(x: np.ndarray, type_name: str) -> np.ndarray:
    """float32 (rows, cols) -> GGUF blocks uint8 (rows, bytes_per_row) via the C kernel."""
    try:
        from inferd import _cpu  # imported here so that reading files works before/without the extension
    except ImportError as e:
        raise RuntimeError(
            f"quantizing to {type_name} needs the C extension inferd._cpu, which is not built "
            f"({e}); build it with `pip install -e .`"
        ) from e
    return _cpu.quantize(np.ascontiguousarray(x, dtype=np.float32), type_name)
