"""Quantization: the numpy reference against hand-computed blocks and gguf's llama.cpp-exact quantizers, the C
kernel against the reference bit for bit, and the conversions quant.py applies on load."""
from __future__ import annotations

import importlib.util

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf import quants as gguf_quants

from inferd.model.quant import check_quantize_arg, convert_tensor, requantize, target_type, to_float32
from inferd.model.tensor import Tensor
from tests.model.kquant_ref import quantize_iq4_nl, quantize_k
from tests.model.make_tiny import random_kquant, to_bf16_bits
from tests.model.quant_ref import quantize_reference

HAVE_CPU = importlib.util.find_spec("inferd._cpu") is not None


def _f16(v: float) -> list[int]:
    return list(np.array([v], np.float16).view(np.uint8))


def test_reference_q8_0_known_block():
    x = np.full((1, 32), 0.5, np.float32)
    x[0, 0] = 1.0
    x[0, 1] = -0.25
    out = quantize_reference(x, "Q8_0")
    d = np.float32(1.0) / np.float32(127)
    assert out.shape == (1, 34)
    assert out[0, :2].tolist() == _f16(d)
    q = out[0, 2:].view(np.int8).tolist()
    # 0.5 * 127 = 63.5 rounds away from zero to 64; -0.25 * 127 = -31.75 -> -32
    assert q == [127, -32] + [64] * 30


def test_reference_q4_0_known_block():
    x = np.full((1, 32), 2.0, np.float32)
    x[0, 0] = -4.0  # largest magnitude, negative: d = -4 / -8 = 0.5, it maps to nibble 0
    out = quantize_reference(x, "Q4_0")
    assert out.shape == (1, 18) and out[0, :2].tolist() == _f16(0.5)
    # 2.0 / 0.5 + 8.5 = 12.5 -> 12; byte j holds value j (low nibble) and value j + 16 (high nibble)
    assert out[0, 2:].tolist() == [0xC0] + [0xCC] * 15
    pos = np.full((1, 32), -1.0, np.float32)
    pos[0, 31] = 4.0  # positive maximum: d = -0.5, so 4.0 -> nibble 0 and -1.0 -> 2 + 8.5 -> 10
    out = quantize_reference(pos, "Q4_0")
    assert out[0, :2].tolist() == _f16(-0.5) and out[0, 2:].tolist() == [0xAA] * 15 + [0x0A]


def test_reference_q4_1_known_block():
    x = np.linspace(-1.0, 2.0, 32, dtype=np.float32).reshape(1, 32)
    out = quantize_reference(x, "Q4_1")
    assert out.shape == (1, 20)
    assert out[0, :2].tolist() == _f16(np.float32(3.0) / np.float32(15)) and out[0, 2:4].tolist() == _f16(-1.0)
    low, high = out[0, 4:] & 0xF, out[0, 4:] >> 4
    assert low[0] == 0 and high[-1] == 15


def test_reference_zero_blocks():
    z = np.zeros((2, 64), np.float32)
    assert quantize_reference(z, "Q8_0").tolist() == [[0] * 68] * 2
    # d = 0 / -8 is -0.0 in llama.cpp too (f16 bits 0x8000); every value is nibble 8
    assert quantize_reference(z, "Q4_0").tolist() == [([0, 0x80] + [0x88] * 16) * 2] * 2


@pytest.mark.parametrize("type_name", ["Q8_0", "Q4_0", "Q4_1"])
@pytest.mark.parametrize("scale", [1.0, 1e-4, 300.0])
def test_reference_equals_gguf_quants(type_name, scale):
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((17, 96)) * scale).astype(np.float32)
    x[0, :32] = 0.0
    x[1, :32] = np.float32(scale)  # ties for the maximum: the first one wins in both
    x[2, :32] = -x[1, :32]
    x[3, 5] = x[3, 9] = -np.abs(x[3, :32]).max() * 2
    expected = gguf_quants.quantize(x, GGMLQuantizationType[type_name]).reshape(17, -1)
    np.testing.assert_array_equal(quantize_reference(x, type_name), expected)


@pytest.mark.skipif(not HAVE_CPU, reason="inferd._cpu is not built")
@pytest.mark.parametrize("type_name", ["Q8_0", "Q4_0", "Q4_1"])
@pytest.mark.parametrize("shape", [(1, 32), (3, 96), (65, 4160)])
def test_c_quantize_equals_reference(type_name, shape):
    from inferd import _cpu

    rng = np.random.default_rng(11)
    x = rng.standard_normal(shape).astype(np.float32) * rng.uniform(1e-3, 10, size=(shape[0], 1)).astype(np.float32)
    x[0, :32] = 0.0
    np.testing.assert_array_equal(_cpu.quantize(x, type_name), quantize_reference(x, type_name))


def _tensor(name: str, x: np.ndarray, type_name: str) -> Tensor:
    rows, cols = x.shape
    if type_name == "F32":
        data = x
    elif type_name == "F16":
        data = x.astype(np.float16).view(np.uint16)
    elif type_name == "BF16":
        data = to_bf16_bits(x)
    elif type_name.endswith("_K") or type_name == "IQ4_XS":
        data = quantize_k(x, type_name)
    elif type_name == "IQ4_NL":
        data = quantize_iq4_nl(x)
    else:
        data = gguf_quants.quantize(x, GGMLQuantizationType[type_name]).reshape(rows, -1)
    return Tensor(name, type_name, rows, cols, data)


@pytest.mark.parametrize("type_name", ["F32", "F16", "BF16", "Q4_0", "Q4_1", "Q8_0", "Q5_0", "Q5_1", "Q4_K",
                                       "Q5_K", "Q6_K", "Q2_K", "Q3_K", "IQ4_NL", "IQ4_XS"])
def test_native_types_pass_through_untouched(type_name):
    x = np.random.default_rng(1).standard_normal((8, 256)).astype(np.float32)
    t = _tensor("blk.0.ffn_up.weight", x, type_name)
    assert convert_tensor(t) is t  # no copy: the array stays a view of the file


def test_vectors_become_f32_exactly():
    x = np.random.default_rng(2).standard_normal((1, 64)).astype(np.float32)
    bf = convert_tensor(_tensor("blk.0.attn_norm.weight", x, "BF16"))
    assert (bf.type, bf.data.dtype, bf.data.shape) == ("F32", np.float32, (1, 64))
    np.testing.assert_array_equal(bf.data.view(np.uint32) & 0xFFFF, 0)
    np.testing.assert_array_equal(to_bf16_bits(bf.data), to_bf16_bits(x))
    f16 = convert_tensor(_tensor("blk.0.attn_q.bias", x, "F16"))
    np.testing.assert_array_equal(f16.data, x.astype(np.float16).astype(np.float32))
    # requested quantization leaves vectors alone
    assert convert_tensor(_tensor("output_norm.weight", x, "F32"), "q4_0").type == "F32"


@pytest.mark.parametrize("name,quantize,expected", [
    ("blk.0.ffn_up.weight", None, "BF16"), ("blk.0.ffn_up.weight", "q8_0", "Q8_0"),
    ("blk.0.ffn_up.weight", "q4_0", "Q4_0"), ("token_embd.weight", "q4_0", "Q8_0"),
    ("output.weight", "q4_0", "Q8_0"), ("output.weight", "Q8_0", "Q8_0"),
])
def test_target_types(name, quantize, expected):
    t = _tensor(name, np.zeros((4, 32), np.float32), "BF16")
    assert target_type(t, check_quantize_arg(quantize)) == expected


@pytest.mark.skipif(not HAVE_CPU, reason="inferd._cpu is not built (it quantizes on load)")
@pytest.mark.parametrize("quantize", ["q8_0", "q4_0"])
def test_float_weights_quantized_on_load_equal_the_reference(quantize):
    x = np.random.default_rng(3).standard_normal((40, 96)).astype(np.float32)
    t = _tensor("blk.1.attn_output.weight", x, "BF16")
    out = convert_tensor(t, quantize)
    assert (out.type, out.rows, out.cols) == (quantize.upper(), 40, 96)
    np.testing.assert_array_equal(out.data, quantize_reference(to_float32(t, 0, 40), quantize.upper()))


@pytest.mark.skipif(not HAVE_CPU, reason="inferd._cpu is not built (it quantizes to Q8_0)")
@pytest.mark.parametrize("type_name", ["Q2_K", "Q3_K", "IQ4_NL", "IQ4_XS", "IQ3_S", "IQ2_XXS", "IQ1_M", "TQ1_0"])
def test_requantize_gives_q8_0_of_the_values(type_name):
    """requantize (the CUDA engine's route for the types its kernels lack) writes Q8_0 of the file's values."""
    rows, cols = 6, 512
    data = random_kquant(rows, cols, type_name, seed=5)
    t = Tensor("blk.0.ffn_gate.weight", type_name, rows, cols, data)
    values = gguf_quants.dequantize(data, GGMLQuantizationType[type_name]).astype(np.float32)
    assert np.isfinite(values).all() and np.abs(values).max() > 0
    out = requantize(t)
    assert (out.type, out.data.shape) == ("Q8_0", (rows, cols // 32 * 34))
    np.testing.assert_array_equal(out.data, quantize_reference(values, "Q8_0"))
    # the added error is Q8_0's: half a step (amax / 127) plus 127 times the f16 rounding of the step
    # (relative 2^-11 for normal f16, absolute 2^-25 below f16's normal range)
    back = gguf_quants.dequantize(out.data, GGMLQuantizationType.Q8_0).reshape(rows, cols)
    step = np.abs(values.reshape(rows, -1, 32)).max(axis=2, keepdims=True) / 127
    bound = 0.5 * step + 127 * np.maximum(step * 2.0 ** -11, 2.0 ** -25)
    assert (np.abs(back - values).reshape(rows, -1, 32) <= bound * 1.0001).all()


def test_unsupported_type_and_argument_are_named():
    t = Tensor("blk.0.ffn_up.weight", "Q8_1", 2, 256, np.zeros((2, 320), np.uint8))
    with pytest.raises(ValueError, match="tensor blk.0.ffn_up.weight has type Q8_1, which cannot be loaded"):
        convert_tensor(t)
    with pytest.raises(ValueError, match="quantize must be one of q8_0, q4_0 or None, got 'q2_k'"):
        check_quantize_arg("q2_k")


def test_tensor_layout_is_checked():
    with pytest.raises(AssertionError, match=r"needs uint8 \(2, 34\)"):
        Tensor("w", "Q8_0", 2, 32, np.zeros((2, 32), np.uint8))
