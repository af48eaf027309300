"""Weight conversion on the GPU (load time) against the numpy ggml rules in cuda_ref.py, bit for bit: float
sources quantized to bf16 / int8 / Q8_0 / int4 (Q4_0's rule: the largest magnitude maps to -8); GGUF Q8_0, Q4_0
and Q4_1 blocks copied exactly; and the readers of the device formats (embedding rows, bf16 dequantization)."""
import numpy as np
import pytest

from tests.cuda.cuda_ref import (BF16, FORMAT_NAMES, I8, Q4, Q8, Q41, bf16_bits_to_f32, gguf_blocks, poisoned,
                                 quantize, to_bf16_bits, upload)


def download_mat(mat, fmt, rows, cols):
    qb = {BF16: (np.uint16, (rows, cols)), I8: (np.int8, (rows, cols)), Q8: (np.int8, (rows, cols)),
          Q4: (np.uint8, (rows, cols // 2)), Q41: (np.uint8, (rows, cols // 2))}[fmt]
    q = mat.q.download(*qb)
    s = None
    if fmt == I8:
        s = mat.s.download(np.float32, (rows,))
    elif fmt in (Q8, Q4):
        s = mat.s.download(np.uint16, (rows, cols // 32))
    elif fmt == Q41:
        s = mat.s.download(np.uint16, (rows, cols // 32, 2))
    return q, s


def weights(rng, rows, cols):
    w = (rng.standard_normal((rows, cols)) * rng.uniform(0.01, 4.0, (rows, 1))).astype(np.float32)
    w[0, :64] = 0.0                       # all-zero groups: scale 0
    w[1, 3] = 40.0                        # an outlier
    w[2, :32] = -w[2, :32]
    return w


@pytest.mark.parametrize("fmt", [BF16, I8, Q8, Q4], ids=lambda f: FORMAT_NAMES[f])
@pytest.mark.parametrize("src", ["F32", "F16", "BF16"])
def test_convert_from_float(cu, rng, fmt, src):
    rows, cols = 45, 608
    w = weights(rng, rows, cols)
    if src == "F16":
        data, w = w.astype(np.float16).view(np.uint16), w.astype(np.float16).astype(np.float32)
    elif src == "BF16":
        data = to_bf16_bits(w)
        w = bf16_bits_to_f32(data)
    else:
        data = w
    mat = cu.Mat(fmt, rows, cols)
    mat.q.fill(0xFF)
    if mat.s is not None:
        mat.s.fill(0xFF)
    d = upload(cu, data)
    # two calls: rows [0, 20) then [20, rows), as the engine fills fused matrices part by part
    row_bytes = data.nbytes // rows
    mat.convert(cu.SRC_TYPES[src], d, 0, 20, row_bytes)
    d2 = upload(cu, data[20:])
    mat.convert(cu.SRC_TYPES[src], d2, 20, rows - 20, row_bytes)
    q, s = download_mat(mat, fmt, rows, cols)
    rq, rs, _ = quantize(fmt, w)
    assert np.array_equal(q, rq.reshape(q.shape))
    if rs is not None:
        assert np.array_equal(s, rs.reshape(s.shape))


@pytest.mark.parametrize("gguf,fmt", [("Q8_0", Q8), ("Q4_0", Q4), ("Q4_1", Q41)])
def test_gguf_blocks_copied_exactly(cu, rng, gguf, fmt):
    rows, cols = 33, 544
    w = weights(rng, rows, cols)
    blocks = gguf_blocks(gguf, w)
    mat = cu.Mat(fmt, rows, cols)
    mat.convert(cu.SRC_TYPES[gguf], upload(cu, blocks), 0, rows, blocks.shape[1])
    q, s = download_mat(mat, fmt, rows, cols)
    rq, rs, _ = quantize(fmt, w)
    assert np.array_equal(q, rq.reshape(q.shape))
    assert np.array_equal(s, rs.reshape(s.shape))


@pytest.mark.parametrize("gguf", ["Q8_0", "Q4_0", "Q4_1"])
@pytest.mark.parametrize("fmt", [BF16, I8, Q4])
def test_gguf_blocks_requantized(cu, rng, gguf, fmt):
    """GGUF blocks into another format: dequantize, then the target's rule (what weight_dtype=int8 etc. do)."""
    rows, cols = 20, 256
    w = weights(rng, rows, cols)
    blocks = gguf_blocks(gguf, w)
    src_fmt = {"Q8_0": Q8, "Q4_0": Q4, "Q4_1": Q41}[gguf]
    vals = quantize(src_fmt, w)[2].astype(np.float32)   # what the blocks hold (exact in float32)
    mat = cu.Mat(fmt, rows, cols)
    mat.convert(cu.SRC_TYPES[gguf], upload(cu, blocks), 0, rows, blocks.shape[1])
    q, s = download_mat(mat, fmt, rows, cols)
    rq, rs, _ = quantize(fmt, vals)
    assert np.array_equal(q, rq.reshape(q.shape))
    if rs is not None:
        assert np.array_equal(s, rs.reshape(s.shape))


@pytest.mark.parametrize("fmt", [BF16, I8, Q8, Q4, Q41], ids=lambda f: FORMAT_NAMES[f])
def test_embed_and_dequant_bf16(cu, rng, fmt):
    rows, cols = 301, 192
    w = weights(rng, rows, cols)
    q, s, vals = quantize(fmt, w)
    mat = cu.Mat(fmt, rows, cols)
    mat.upload_raw(q, s)
    tokens = rng.integers(0, rows, 13).astype(np.int32)
    x = poisoned(cu, 13 * cols * 4)
    cu.embed(mat, upload(cu, tokens), 13, x)
    got = x.download(np.float32, (13, cols))
    assert np.array_equal(got, vals[tokens].astype(np.float32))
    out = poisoned(cu, rows * cols * 2)
    mat.dequant_bf16(out)
    got = bf16_bits_to_f32(out.download(np.uint16, (rows, cols)))
    assert np.array_equal(got, bf16_bits_to_f32(to_bf16_bits(vals.astype(np.float32))))


def test_random_fill_is_bounded_and_seeded(cu):
    a, b = cu.Mat(BF16, 64, 256), cu.Mat(BF16, 64, 256)
    a.convert(cu.SRC_RANDOM, None, seed=7, scale=0.5)
    b.convert(cu.SRC_RANDOM, None, seed=7, scale=0.5)
    va = bf16_bits_to_f32(a.q.download(np.uint16, (64, 256)))
    vb = bf16_bits_to_f32(b.q.download(np.uint16, (64, 256)))
    assert np.array_equal(va, vb)
    assert np.abs(va).max() <= 0.5 and va.std() > 0.2
