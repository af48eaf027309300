"""numpy references for the CUDA kernels: the device weight formats (packing and float64 values), ggml's
quantization rules, and a port of the CPU sampler. Shared by tests/cuda/test_*.py; nothing here needs a GPU."""
from __future__ import annotations

import math

import numpy as np

BF16, I8, Q8, Q4, Q41 = 0, 1, 2, 3, 4
FORMAT_NAMES = {BF16: "bf16", I8: "int8", Q8: "q8_0", Q4: "int4", Q41: "q4_1"}


def to_bf16_bits(x) -> np.ndarray:
    """float32 -> bf16 bit patterns, round to nearest even."""
    u = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def bf16_bits_to_f32(b) -> np.ndarray:
    return (np.asarray(b, np.uint16).astype(np.uint32) << 16).view(np.float32)


def bf16_round(x) -> np.ndarray:
    return bf16_bits_to_f32(to_bf16_bits(x))


def roundf(v: np.ndarray) -> np.ndarray:
    """C's roundf (halves away from zero) on float32, exactly."""
    v = np.asarray(v, np.float32)
    t = np.trunc(v)
    frac = np.abs(v - t)                       # exact in float32
    return np.where(frac >= np.float32(0.5), t + np.sign(v), t).astype(np.float32)


def _safe_inv(d: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return np.where(d != 0, np.float32(1.0) / np.where(d != 0, d, np.float32(1.0)),
                        np.float32(0.0)).astype(np.float32)


def quantize(fmt: int, w: np.ndarray):
    """ggml's rules, in float32 as the kernels compute them. Returns (q bytes, scale bytes or None, values
    float64 (rows, cols))."""
    w = np.ascontiguousarray(w, np.float32)
    rows, cols = w.shape
    if fmt == BF16:
        bits = to_bf16_bits(w)
        return bits, None, bf16_bits_to_f32(bits).astype(np.float64)
    if fmt == I8:
        amax = np.abs(w).max(axis=1)
        d = (amax / np.float32(127.0)).astype(np.float32)
        q = roundf(w * _safe_inv(d)[:, None]).astype(np.int8)
        return q, d.astype(np.float32), q.astype(np.float64) * d[:, None].astype(np.float64)
    g = w.reshape(rows, cols // 32, 32)
    if fmt == Q8:
        amax = np.abs(g).max(axis=2)
        d = (amax / np.float32(127.0)).astype(np.float32)
        q = roundf(g * _safe_inv(d)[..., None]).astype(np.int8)
        d16 = d.astype(np.float16)
        vals = q.astype(np.float64) * d16.astype(np.float64)[..., None]
        return q.reshape(rows, cols), d16.view(np.uint16), vals.reshape(rows, cols)
    if fmt == Q4:
        idx = np.abs(g).argmax(axis=2)            # first largest magnitude, as ggml's strict '<' scan
        mx = np.take_along_axis(g, idx[..., None], axis=2)[..., 0]
        d = (mx / np.float32(-8.0)).astype(np.float32)
        x = (g * _safe_inv(d)[..., None]).astype(np.float32) + np.float32(8.5)
        q = np.minimum(15, np.trunc(x).astype(np.int32)).astype(np.uint8)
        d16 = d.astype(np.float16)
        vals = (q.astype(np.float64) - 8.0) * d16.astype(np.float64)[..., None]
        return pack_nibbles(q), d16.view(np.uint16), vals.reshape(rows, cols)
    if fmt == Q41:
        mn = g.min(axis=2)
        mx = g.max(axis=2)
        d = ((mx - mn) / np.float32(15.0)).astype(np.float32)
        x = ((g - mn[..., None]).astype(np.float32) * _safe_inv(d)[..., None]).astype(np.float32) + np.float32(0.5)
        q = np.minimum(15, np.trunc(x).astype(np.int32)).astype(np.uint8)
        d16, m16 = d.astype(np.float16), mn.astype(np.float16)
        vals = q.astype(np.float64) * d16.astype(np.float64)[..., None] + m16.astype(np.float64)[..., None]
        s = np.stack([d16.view(np.uint16), m16.view(np.uint16)], axis=-1)
        return pack_nibbles(q), s, vals.reshape(rows, cols)
    raise ValueError(fmt)


def pack_nibbles(q: np.ndarray) -> np.ndarray:
    """(rows, groups, 32) codes 0..15 -> (rows, groups * 16) bytes: element j low nibble, j + 16 high nibble."""
    rows, groups, _ = q.shape
    b = (q[..., :16] | (q[..., 16:] << 4)).astype(np.uint8)
    return b.reshape(rows, groups * 16)


def gguf_blocks(fmt_name: str, w: np.ndarray) -> np.ndarray:
    """A float32 matrix in GGUF block layout (uint8 (rows, bytes per row)) for Q8_0 / Q4_0 / Q4_1."""
    rows, cols = w.shape
    if fmt_name == "Q8_0":
        q, d, _ = quantize(Q8, w)
        blocks = np.concatenate([d.reshape(rows, -1, 1).view(np.uint8).reshape(rows, -1, 2),
                                 q.reshape(rows, -1, 32).view(np.uint8)], axis=2)
    elif fmt_name == "Q4_0":
        q, d, _ = quantize(Q4, w)
        blocks = np.concatenate([d.reshape(rows, -1, 1).view(np.uint8).reshape(rows, -1, 2),
                                 q.reshape(rows, -1, 16)], axis=2)
    elif fmt_name == "Q4_1":
        q, s, _ = quantize(Q41, w)
        blocks = np.concatenate([np.ascontiguousarray(s).view(np.uint8).reshape(rows, -1, 4),
                                 q.reshape(rows, -1, 16)], axis=2)
    else:
        raise ValueError(fmt_name)
    return np.ascontiguousarray(blocks.reshape(rows, -1))


def rms_inv(x: np.ndarray, eps: float) -> np.ndarray:
    x = np.asarray(x, np.float64)
    return 1.0 / np.sqrt((x * x).mean(axis=-1) + eps)


def silu(x):
    return x / (1.0 + np.exp(-x))


# ---- the CPU sampler (ext/cpu/sample.c), ported line by line ----

def splitmix64(x: int) -> int:
    M = (1 << 64) - 1
    x = (x + 0x9E3779B97F4A7C15) & M
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M
    return x ^ (x >> 31)


def rng_uniform(seed: int, position: int) -> float:
    r = splitmix64((seed & ((1 << 64) - 1)) ^ splitmix64(position & ((1 << 64) - 1)))
    return float(np.float32(r >> 40) * np.float32(1.0 / 16777216.0))


def pack_mask(allowed: np.ndarray) -> np.ndarray:
    """A boolean (..., vocab) allowed-token array -> packed uint32 words, bit i & 31 of word i >> 5 (the samplers'
    and llguidance's layout)."""
    allowed = np.asarray(allowed, bool)
    V = allowed.shape[-1]
    padded = np.zeros(allowed.shape[:-1] + ((V + 31) // 32 * 32,), bool)
    padded[..., :V] = allowed
    return np.packbits(padded, axis=-1, bitorder="little").view("<u4")


def unpack_mask(words: np.ndarray, V: int) -> np.ndarray:
    return np.unpackbits(np.ascontiguousarray(words, "<u4").view(np.uint8), axis=-1, bitorder="little")[..., :V] == 1


# exp_scalar (ext/cpu/vecmath.h: Cephes' expf) in float32, operation for operation, so the weights are the CPU
# sampler's bits, not numpy's exp's (which differ in the last place and move draws that land near a boundary)
_EXP_LO, _EXP_HI = np.float32(-87.3365478515625), np.float32(88.3762626647949)
_EXP_POLY = [np.float32(c) for c in (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2,
                                     1.6666665459e-1, 5.0000001201e-1)]


def _fmaf(a, b, c) -> np.ndarray:
    """fmaf on float32 arrays, rounded once: a * b is exact in float64; the float64 sum a * b + c is rounded to odd
    (its exact error from a two-sum decides the neighbour), which a second rounding to float32 cannot spoil."""
    p = np.asarray(a, np.float32).astype(np.float64) * np.asarray(b, np.float32).astype(np.float64)
    c = np.asarray(c, np.float32).astype(np.float64)
    s = p + c
    t = s - p
    err = (p - (s - t)) + (c - t)
    even = (s.view(np.uint64) & 1) == 0
    s = np.where((err != 0) & even, np.nextafter(s, np.where(err > 0, np.inf, -np.inf)), s)
    return s.astype(np.float32)


def exp_cpu(x) -> np.ndarray:
    x = np.minimum(np.maximum(np.asarray(x, np.float32), _EXP_LO), _EXP_HI)
    n = np.rint(x * np.float32(1.44269504088896341))
    r = _fmaf(n, np.float32(-0.693359375), x)
    r = _fmaf(n, np.float32(2.12194440e-4), r)
    p = np.full_like(r, _EXP_POLY[0])
    for c in _EXP_POLY[1:]:
        p = _fmaf(p, r, c)
    y = _fmaf(p, r * r, r) + np.float32(1.0)
    scale = ((n.astype(np.int32) + 127) << 23).view(np.float32)
    return (y * scale).astype(np.float32)


def temperature_weights(lg: np.ndarray, inv_t: np.float32) -> tuple[np.ndarray, float]:
    """w = exp((l - max) * inv_t), exactly 0 for a masked (-inf) logit, and their sum in the CPU's order: double
    lanes over i % 8 for the full groups of 8, combined ((l0+l4)+(l1+l5))+((l2+l6)+(l3+l7)), then the tail."""
    m = np.float32(lg.max())
    w = np.where(lg == -np.inf, np.float32(0.0), exp_cpu((lg - m) * inv_t)).astype(np.float32)
    n8 = w.size // 8 * 8
    lanes = np.cumsum(w[:n8].reshape(-1, 8).astype(np.float64), axis=0)[-1] if n8 else np.zeros(8)
    z = float(((lanes[0] + lanes[4]) + (lanes[1] + lanes[5])) + ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7])))
    for x in w[n8:]:
        z += float(x)
    return w, z


def cpu_sample(logits: np.ndarray, p: dict, position: int, history=(), num_prompt: int = 0,
               bias: dict | None = None, allowed: np.ndarray | None = None) -> tuple[int, float]:
    """(token, logprob) as sample_row chooses them; logits float32 (vocab). allowed: packed mask words or None; a
    masked token's logit is -inf from the start (logprobs are the masked row's); nothing allowed gives (-1, -inf).

    The filters in the CPU sampler's order, which is the one definition for every backend: the top k by weight
    (ties: lower id first), then top-p over the mass of those k (of every token without top-k), then min-p
    relative to the best token (weight 1) over what is left, the best always kept; the draw walks the survivors
    from the heaviest. Sums are sequential float64 in that order (np.cumsum), as the C loops add them."""
    raw = np.asarray(logits, np.float32).copy()
    if allowed is not None:
        ok = unpack_mask(allowed, raw.size)
        if not ok.any():
            return -1, -math.inf
        raw[~ok] = -np.inf
    lg = raw.copy()
    V = lg.size
    m = float(raw.max())
    lse = m + math.log(float(np.exp((raw - np.float32(m)).astype(np.float64)).sum()))
    for tok, val in (bias or {}).items():
        lg[tok] = np.float32(lg[tok] + np.float32(val))
    rp, pp, fp = (np.float32(p.get(k, d)) for k, d in
                  (("repetition_penalty", 1.0), ("presence_penalty", 0.0), ("frequency_penalty", 0.0)))
    if rp != 1.0 or pp != 0.0 or fp != 0.0:
        seen, counts = set(), {}
        for i, t in enumerate(history):
            if t not in seen and rp != 1.0:
                lg[t] = lg[t] / rp if lg[t] > 0 else lg[t] * rp
            seen.add(t)
            if i >= num_prompt:
                counts[t] = counts.get(t, 0) + 1
        for t, n in counts.items():
            lg[t] = lg[t] - (pp + fp * np.float32(n))
    T = np.float32(p.get("temperature", 0.0))
    if T <= 0:
        chosen = int(np.argmax(lg))
        return chosen, float(raw[chosen]) - lse
    w, z = temperature_weights(lg, np.float32(1.0) / T)
    u = rng_uniform(p.get("seed", 0), position)
    top_k, top_p, min_p = int(p.get("top_k", 0)), np.float32(p.get("top_p", 1.0)), np.float32(p.get("min_p", 0.0))
    top_k_on = 0 < top_k < V
    if not (top_k_on or top_p < 1.0 or min_p > 0.0):
        c = np.cumsum(w.astype(np.float64))
        hits = np.nonzero(c > u * z)[0]
        chosen = int(hits[0]) if hits.size else int(np.nonzero(w > 0)[0][-1])
        return chosen, float(raw[chosen]) - lse
    ids = np.nonzero(w > 0)[0]                                   # masked tokens are never candidates
    if not top_k_on and min_p > 0.0:       # without top-k min-p may cut first (as on the CPU): same survivors
        ids = ids[w[ids] >= min(min_p, np.float32(1.0))]
    if 0 < top_k < ids.size:               # only the k heaviest and their ties need sorting
        ids = ids[w[ids] >= np.partition(w[ids], ids.size - top_k)[ids.size - top_k]]
    cand = ids[np.lexsort((ids, -w[ids]))]                       # heaviest first, lower id on ties
    if 0 < top_k < cand.size:
        cand = cand[:top_k]
    if top_p < 1.0:
        acc = np.cumsum(w[cand].astype(np.float64))
        zk = float(acc[-1]) if top_k_on else z
        reached = np.nonzero(acc >= float(top_p) * zk)[0]
        if reached.size:
            cand = cand[:reached[0] + 1]
    if min_p > 0.0:
        cand = cand[:max(1, int(np.count_nonzero(w[cand] >= min_p)))]   # sorted: the passing ones lead
    acc = np.cumsum(w[cand].astype(np.float64))
    hits = np.nonzero(acc > u * float(acc[-1]))[0]
    chosen = cand[hits[0]] if hits.size else cand[-1]
    return int(chosen), float(raw[chosen]) - lse


def poisoned(cu, nbytes: int):
    """A device buffer whose every byte is 0xFF (NaN as float32): outputs a kernel skips stay NaN."""
    buf = cu.DeviceBuffer(max(int(nbytes), 16))
    buf.fill(0xFF)
    return buf


def upload(cu, arr):
    return cu.DeviceBuffer.from_array(np.ascontiguousarray(arr))


def rel_err(out, ref) -> float:
    out = np.asarray(out, np.float64)
    ref = np.asarray(ref, np.float64)
    return float(np.linalg.norm(out - ref) / max(np.linalg.norm(ref), 1e-30))
