"""Tensor: one weight as the engine receives it (shared by gguf.py, hf.py, quant.py and loader.py).

Layout contract with the engine:
- rows = output features, cols = input features (token_embd: rows = vocab); 1-D tensors have rows = 1.
- quantized types: uint8 (rows, bytes_per_row), GGUF block layout, blocks run along cols.
- F16 / BF16: uint16 (rows, cols) holding the raw 16-bit patterns (numpy has no bfloat16, and one dtype for both
  keeps the C side simple: it reinterprets the bits).
- F32: float32 (rows, cols).
Arrays may be read-only views over an mmap of the model file; nobody may write into them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .ggml_types import BLOCK_SIZES

# The types the engine computes with directly; everything else is converted by quant.py.
NATIVE_TYPES = (
    "F32",
    "F16",
    "BF16",
    "Q4_0",
    "Q4_1",
    "Q8_0",
    "Q4_K",
    "Q5_K",
    "Q6_K",
    "Q5_0",
    "Q5_1",
    "Q2_K",
    "Q3_K",
    "IQ4_NL",
    "IQ4_XS",
    "MXFP4",
    "IQ3_S",
    "IQ3_XXS",
    "IQ2_S",
    "IQ2_XS",
    "IQ2_XXS",
    "IQ1_M",
    "IQ1_S",
    "TQ1_0",
    "TQ2_0",
)


def block_info(type_name: str) -> tuple[int, int]:
    """(values per block, bytes per block) of a GGML type name, e.g. Q8_0 -> (32, 34)."""
    try:
        return BLOCK_SIZES[type_name]
    except KeyError:
        raise ValueError(f"unknown tensor type {type_name!r}") from None


def bytes_per_row(type_name: str, cols: int) -> int:
    block, size = block_info(type_name)
    if cols % block:
        raise ValueError(f"{type_name} needs a row length that is a multiple of {block}, got {cols}")
    return cols // block * size


def _expected_array(type_name: str, rows: int, cols: int) -> tuple[np.dtype, tuple[int, int]]:
    if type_name == "F32":
        return np.dtype(np.float32), (rows, cols)
    if type_name in ("F16", "BF16"):
        return np.dtype(np.uint16), (rows, cols)
    return np.dtype(np.uint8), (rows, bytes_per_row(type_name, cols))


@dataclass(eq=False)
class Tensor:
    name: str
    type: str
    rows: int
    cols: int
    data: np.ndarray

    def __post_init__(self) -> None:
        # A mismatch here is a bug in a loader, not bad input: the loaders check files before building Tensors.
        dtype, shape = _expected_array(self.type, self.rows, self.cols)
        if self.data.dtype != dtype or self.data.shape != shape:
            raise AssertionError(
                f"tensor {self.name}: {self.type} ({self.rows}, {self.cols}) needs {dtype} {shape}, "
                f"got {self.data.dtype} {self.data.shape}"
            )

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes)
