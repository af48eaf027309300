"""Fusing a layer's matrices for the C engine (inferd/engine/weights.py): plain concatenation (Wq|Wk|Wv) and the
interleaved Wgate|Wup layout that lets forward.c finish SwiGLU 32 hidden units at a time."""
from __future__ import annotations

import numpy as np
import pytest

from inferd.engine.weights import fuse
from inferd.model.tensor import Tensor
from tests.reference import dequantize, make_tensor


def rows_tagged(name: str, rows: int, cols: int, base: float, type_name: str = "F32"):
    """A tensor whose row r holds the value base + r everywhere, so a row can be recognised after fusing."""
    return make_tensor(name, np.repeat((base + np.arange(rows, dtype=np.float32))[:, None], cols, axis=1), type_name)


def test_concatenation_keeps_part_order():
    q, k = rows_tagged("q", 4, 32, 0.0), rows_tagged("k", 2, 32, 100.0)
    type_name, rows, cols, data = fuse([q, k])
    assert (type_name, rows, cols) == ("F32", 6, 32)
    assert np.asarray(data)[:, 0].tolist() == [0, 1, 2, 3, 100, 101]


def test_interleave_puts_each_group_of_every_part_in_turn():
    gate, up = rows_tagged("gate", 96, 32, 0.0), rows_tagged("up", 96, 32, 1000.0)
    _, rows, _, data = fuse([gate, up], interleave=32)
    first = np.asarray(data)[:, 0]
    assert rows == 192
    expected = []
    for j in range(3):
        expected += list(range(32 * j, 32 * j + 32)) + list(range(1000 + 32 * j, 1000 + 32 * j + 32))
    assert first.tolist() == expected


@pytest.mark.parametrize("type_name", ["Q4_0", "Q8_0", "F16"])
def test_interleave_moves_whole_encoded_rows(type_name):
    rng = np.random.default_rng(3)
    gate = make_tensor("gate", rng.standard_normal((64, 64)).astype(np.float32), type_name)
    up = make_tensor("up", rng.standard_normal((64, 64)).astype(np.float32), type_name)
    fused_type, rows, cols, data = fuse([gate, up], interleave=32)
    got = dequantize(Tensor("fused", fused_type, rows, cols, np.ascontiguousarray(data)))
    g, u = dequantize(gate), dequantize(up)
    np.testing.assert_array_equal(got, np.concatenate([g[:32], u[:32], g[32:], u[32:]]))


def test_mixed_types_take_the_most_precise():
    a, b = rows_tagged("a", 32, 32, 0.0, "Q4_0"), rows_tagged("b", 32, 32, 0.0, "Q8_0")
    assert fuse([a, b], interleave=32)[0] == "Q8_0"


def test_interleave_refuses_parts_it_cannot_split():
    with pytest.raises(ValueError, match="cannot interleave"):
        fuse([rows_tagged("gate", 48, 32, 0.0), rows_tagged("up", 48, 32, 0.0)], interleave=32)
    with pytest.raises(ValueError, match="cannot interleave"):
        fuse([rows_tagged("gate", 64, 32, 0.0), rows_tagged("up", 32, 32, 0.0)], interleave=32)
    with pytest.raises(ValueError, match="input widths differ"):
        fuse([rows_tagged("gate", 32, 32, 0.0), rows_tagged("up", 32, 64, 0.0)])
