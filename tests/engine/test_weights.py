"""Fusing a layer's matrices for the C engine (inferd/engine/weights.py): the spec of Wq|Wk|Wv (parts in order,
each in its own type where the kernels allow segments) and of the interleaved Wgate|Wup layout that lets forward.c
finish SwiGLU 32 hidden units at a time (the repack itself, in C, is checked through the forward pass)."""
from __future__ import annotations

import numpy as np
import pytest

from inferd.engine.weights import fuse
from inferd.model.tensor import Tensor
from tests.reference import dequantize, make_tensor


def rows_tagged(name: str, rows: int, cols: int, base: float, type_name: str = "F32"):
    """A tensor whose row r holds the value base + r everywhere, so a row can be recognised after fusing."""
    return make_tensor(name, np.repeat((base + np.arange(rows, dtype=np.float32))[:, None], cols, axis=1), type_name)


def test_concatenation_keeps_part_order_and_arrays():
    q, k = rows_tagged("q", 4, 32, 0.0), rows_tagged("k", 2, 32, 100.0)
    kind, parts, interleave = fuse([q, k])
    assert (kind, interleave) == ("parts", 0)
    assert [(t, rows, cols) for t, rows, cols, _ in parts] == [("F32", 4, 32), ("F32", 2, 32)]
    assert parts[0][3] is q.data and parts[1][3] is k.data     # the C side repacks from the file's arrays


def test_interleave_is_handed_to_the_repack():
    gate, up = rows_tagged("gate", 96, 32, 0.0), rows_tagged("up", 96, 32, 1000.0)
    kind, parts, interleave = fuse([gate, up], interleave=32)
    assert (kind, interleave, len(parts)) == ("parts", 32, 2)
    assert parts[0][3] is gate.data and parts[1][3] is up.data


def test_quantized_parts_of_different_types_stay_segments():
    """Q4_K_M's fused QKV: a Q4_K Q and K beside a Q6_K V, each computed in its own bit width."""
    rng = np.random.default_rng(3)
    q = make_tensor("q", rng.standard_normal((64, 256)).astype(np.float32), "Q4_K")
    v = make_tensor("v", rng.standard_normal((32, 256)).astype(np.float32), "Q6_K")
    _, parts, _ = fuse([q, v])
    assert [p[0] for p in parts] == ["Q4_K", "Q6_K"]


@pytest.mark.parametrize("interleave", [0, 32])
def test_mixed_types_that_cannot_be_segments_take_the_most_precise(interleave):
    rng = np.random.default_rng(4)
    a = make_tensor("a", rng.standard_normal((32, 64)).astype(np.float32), "Q4_0")
    b = make_tensor("b", rng.standard_normal((32, 64)).astype(np.float32), "F16")
    _, parts, _ = fuse([a, b], interleave=interleave)
    assert [p[0] for p in parts] == ["F16", "F16"]
    got = dequantize(Tensor("a16", "F16", 32, 64, np.ascontiguousarray(parts[0][3])))
    np.testing.assert_allclose(got, dequantize(a), rtol=1e-3, atol=1e-3)   # Q4_0 values are exact in F16 up to rounding


def test_interleave_refuses_parts_it_cannot_split():
    with pytest.raises(ValueError, match="cannot interleave"):
        fuse([rows_tagged("gate", 48, 32, 0.0), rows_tagged("up", 48, 32, 0.0)], interleave=32)
    with pytest.raises(ValueError, match="cannot interleave"):
        fuse([rows_tagged("gate", 64, 32, 0.0), rows_tagged("up", 32, 32, 0.0)], interleave=32)
    with pytest.raises(ValueError, match="input widths differ"):
        fuse([rows_tagged("gate", 32, 32, 0.0), rows_tagged("up", 32, 64, 0.0)])
