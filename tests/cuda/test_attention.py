"""RoPE + KV-cache write, split-KV decode attention (GQA, paged, ragged lengths, several splits) and the flash
prefill kernel (chunks after earlier context, causal), against float64 numpy.

Tolerances: decode computes in float32 from the cache's values, so ||out - ref|| / ||ref|| < 1e-4 per row. Prefill
rounds Q and the softmax weights P to the cache type for the tensor cores; the reference rounds Q the same way,
which leaves P's rounding: ||out - ref|| / ||ref|| < 3e-3 (f16) and 1.5e-2 (bf16) per row."""
import math

import numpy as np
import pytest

from tests.cuda.cuda_ref import bf16_bits_to_f32, poisoned, rel_err, to_bf16_bits, upload

KV = {"f16": 0, "bf16": 1}


def to_kv(x, kv):
    x = np.asarray(x, np.float32)
    return x.astype(np.float16).view(np.uint16) if kv == "f16" else to_bf16_bits(x)


def from_kv(bits, kv):
    bits = np.asarray(bits, np.uint16)
    return bits.view(np.float16).astype(np.float64) if kv == "f16" else bf16_bits_to_f32(bits).astype(np.float64)


def paged_setup(rng, lengths, n_kv, hd, kv, extra_blocks=3):
    """A random cache and shuffled block tables covering `lengths` positions per sequence."""
    need = [max(1, -(-n // 64)) for n in lengths]
    nblocks = sum(need) + extra_blocks
    perm = rng.permutation(nblocks)
    width = max(need)
    tables = np.zeros((len(lengths), width), np.int32)
    at = 0
    for s, n in enumerate(need):
        tables[s, :n] = perm[at:at + n]
        tables[s, n:] = perm[-1]            # never read
        at += n
    kc = to_kv(rng.standard_normal((nblocks, n_kv, 64, hd)), kv)
    vc = to_kv(rng.standard_normal((nblocks, n_kv, 64, hd)), kv)
    return tables, kc, vc


def gather(cache, tables, s, n, kvh, kv):
    """(n, hd) float64 values of sequence s's first n positions of KV head kvh."""
    p = np.arange(n)
    return from_kv(cache[tables[s, p // 64], kvh, p % 64], kv)


@pytest.mark.parametrize("kv", ["f16", "bf16"])
@pytest.mark.parametrize("neox", [False, True])
@pytest.mark.parametrize("bias", [False, True])
def test_rope_kv_write(cu, rng, kv, neox, bias):
    n_heads, n_kv, hd = 6, 2, 64
    q_dim, kv_dim = n_heads * hd, n_kv * hd
    ld = q_dim + 2 * kv_dim + 8                          # a row stride wider than the row
    lengths = [70, 1, 300]
    tables, _, _ = paged_setup(rng, lengths, n_kv, hd, kv)
    nblocks = int(tables.max()) + 1
    # tokens: a few positions of each sequence, in any order
    tok_seq = np.array([0, 0, 1, 2, 2, 2], np.int32)
    pos = np.array([5, 69, 0, 0, 64, 299], np.int32)
    T = len(pos)
    qkv = rng.standard_normal((T, ld)).astype(np.float32)
    b = rng.standard_normal(q_dim + 2 * kv_dim).astype(np.float32) if bias else None
    inv_freq = np.array([10000.0 ** (-2.0 * i / hd) for i in range(hd // 2)], np.float64)
    kc = cu.DeviceBuffer(nblocks * n_kv * 64 * hd * 2)
    vc = cu.DeviceBuffer(nblocks * n_kv * 64 * hd * 2)
    kc.fill(0x55)
    vc.fill(0x55)
    d_qkv = upload(cu, qkv)
    cu.rope_kv(d_qkv, ld, upload(cu, b) if bias else None, upload(cu, pos), upload(cu, tok_seq), upload(cu, tables),
               upload(cu, np.array([tables.shape[1]], np.int32)), upload(cu, inv_freq), n_heads, n_kv, hd, neox, KV[kv],
               kc, vc, T)
    got = d_qkv.download(np.float32, (T, ld))
    kcache = kc.download(np.uint16, (nblocks, n_kv, 64, hd))
    vcache = vc.download(np.uint16, (nblocks, n_kv, 64, hd))
    x = qkv.astype(np.float64) + (b.astype(np.float64) if bias else 0.0)
    half = hd // 2
    i0 = np.arange(half) if neox else 2 * np.arange(half)
    i1 = i0 + half if neox else i0 + 1
    written = np.zeros(kcache.shape[:3], bool)
    for t in range(T):
        ang = pos[t] * inv_freq
        c, s = np.cos(ang), np.sin(ang)
        for h in range(n_heads + n_kv):
            base = h * hd if h < n_heads else q_dim + (h - n_heads) * hd
            v = x[t, base:base + hd].copy()
            r = v.copy()
            r[i0] = v[i0] * c - v[i1] * s
            r[i1] = v[i0] * s + v[i1] * c
            phys, off = tables[tok_seq[t], pos[t] // 64], pos[t] % 64
            if h < n_heads:
                assert np.allclose(got[t, base:base + hd], r, rtol=1e-5, atol=1e-5)
            else:
                kvh = h - n_heads
                assert np.allclose(from_kv(kcache[phys, kvh, off], kv), r, rtol=2 ** -7, atol=1e-6)
                vv = x[t, q_dim + kv_dim + kvh * hd:q_dim + kv_dim + (kvh + 1) * hd]
                assert np.allclose(from_kv(vcache[phys, kvh, off], kv), vv, rtol=2 ** -7, atol=1e-6)
                written[phys, kvh, off] = True
    assert (kcache[~written] == 0x5555).all() and (vcache[~written] == 0x5555).all(), "wrote outside its rows"
    # k and v columns of qkv are left as they were (only q is rotated in place)
    assert np.array_equal(got[:, q_dim:], qkv[:, q_dim:])


@pytest.mark.parametrize("kv", ["f16", "bf16"])
@pytest.mark.parametrize("hd", [64, 96, 128])
@pytest.mark.parametrize("group", [1, 3, 4, 8])
def test_decode_attention(cu, rng, kv, hd, group):
    n_kv = 2
    n_heads = group * n_kv
    lengths = [1, 2, 63, 64, 65, 130, 700, 3001]
    B = len(lengths)
    tables, kc, vc = paged_setup(rng, lengths, n_kv, hd, kv)
    ldq = n_heads * hd + 4
    q = (rng.standard_normal((B, ldq)) * 1.5).astype(np.float32)
    max_splits = 8
    scale = 1.0 / math.sqrt(hd)
    part_o = poisoned(cu, B * n_heads * max_splits * hd * 4)
    part_ml = poisoned(cu, B * n_heads * max_splits * 2 * 4)
    out = poisoned(cu, B * n_heads * hd * 4)
    positions = np.array(lengths, np.int32) - 1
    cu.attn_decode(upload(cu, q), ldq, upload(cu, kc), upload(cu, vc), KV[kv], upload(cu, tables),
                   upload(cu, np.array([tables.shape[1]], np.int32)), upload(cu, positions), B, n_heads, n_kv, hd,
                   scale, 2, max_splits, part_o, part_ml, out, n_heads * hd)
    got = out.download(np.float32, (B, n_heads, hd))
    assert np.isfinite(got).all()
    for b, n in enumerate(lengths):
        for h in range(n_heads):
            K = gather(kc, tables, b, n, h // group, kv)
            V = gather(vc, tables, b, n, h // group, kv)
            s = K @ q[b, h * hd:(h + 1) * hd].astype(np.float64) * scale
            p = np.exp(s - s.max())
            ref = (p / p.sum()) @ V
            assert rel_err(got[b, h], ref) < 1e-4, f"seq {b} (len {n}) head {h}"


def test_decode_attention_batch_invariant(cu, rng):
    n_kv, hd, group = 2, 64, 4
    n_heads = n_kv * group
    lengths = [5, 1000, 129]
    tables, kc, vc = paged_setup(rng, lengths, n_kv, hd, "f16")
    q = rng.standard_normal((3, n_heads * hd)).astype(np.float32)
    dk, dv = upload(cu, kc), upload(cu, vc)
    width = upload(cu, np.array([tables.shape[1]], np.int32))
    part_o, part_ml = cu.DeviceBuffer(3 * n_heads * 32 * hd * 4), cu.DeviceBuffer(3 * n_heads * 32 * 2 * 4)

    def run(rows):
        out = poisoned(cu, len(rows) * n_heads * hd * 4)
        cu.attn_decode(upload(cu, q[rows]), n_heads * hd, dk, dv, 0, upload(cu, tables[rows]), width,
                       upload(cu, np.array(lengths, np.int32)[rows] - 1), len(rows), n_heads, n_kv, hd, 0.125, 2, 32,
                       part_o, part_ml, out, n_heads * hd)
        return out.download(np.float32, (len(rows), n_heads * hd))

    full = run([0, 1, 2])
    for i in range(3):
        assert np.array_equal(run([i])[0], full[i])


@pytest.mark.parametrize("kv", ["f16", "bf16"])
@pytest.mark.parametrize("hd", [64, 96, 128])
@pytest.mark.parametrize("group", [1, 4, 7])
def test_prefill_attention(cu, rng, kv, hd, group):
    n_kv = 2
    n_heads = group * n_kv
    chunks = [(0, 1), (0, 70), (5, 64), (100, 17), (1000, 130), (63, 2)]     # (pos0, T)
    lengths = [p + t for p, t in chunks]
    tables, kc, vc = paged_setup(rng, lengths, n_kv, hd, kv)
    qstart = np.cumsum([0] + [t for _, t in chunks]).astype(np.int32)
    rows = int(qstart[-1])
    ldq = n_heads * hd + 8
    q = (rng.standard_normal((rows, ldq)) * 1.5).astype(np.float32)
    scale = 1.0 / math.sqrt(hd)
    out = poisoned(cu, rows * n_heads * hd * 4)
    cu.attn_prefill(upload(cu, q), ldq, upload(cu, kc), upload(cu, vc), KV[kv], upload(cu, tables),
                    upload(cu, np.array([tables.shape[1]], np.int32)), upload(cu, qstart),
                    upload(cu, np.array([p for p, _ in chunks], np.int32)), len(chunks), max(t for _, t in chunks),
                    n_heads, n_kv, hd, scale, out, n_heads * hd)
    got = out.download(np.float32, (rows, n_heads, hd))
    assert np.isfinite(got).all()
    tol = 3e-3 if kv == "f16" else 1.5e-2
    qr = from_kv(to_kv(q, kv), kv)                      # the kernel feeds Q to the tensor cores in the cache type
    for s, (pos0, T) in enumerate(chunks):
        for h in range(n_heads):
            K = gather(kc, tables, s, pos0 + T, h // group, kv)
            V = gather(vc, tables, s, pos0 + T, h // group, kv)
            for i in range(T):
                r = qstart[s] + i
                sc = K[:pos0 + i + 1] @ qr[r, h * hd:(h + 1) * hd] * scale
                p = np.exp(sc - sc.max())
                ref = (p / p.sum()) @ V[:pos0 + i + 1]
                assert rel_err(got[r, h], ref) < tol, f"chunk {s} row {i} head {h}"
