"""A float64 numpy forward pass of a llama-family model, written from the model's definition rather than from the
engine, to check the C engine against (tests/engine/test_forward_reference.py, test_engine.py). Covers Llama,
Mistral, Qwen2, Qwen3 (QK-norm) and Gemma 3 (embedding scale, QK-norm, sandwich norms, tanh-GELU GeGLU, sliding-window
layers with their own RoPE base, query_pre_attn_scalar, logit soft-cap), and the mixtures of experts (Qwen3-MoE,
Qwen2-MoE with its shared expert, OLMoE with its QK-norm over all of q and k, Mixtral), and Qwen3.5's hybrid (Gated
DeltaNet layers beside attention with an output gate and partial RoPE), each switch written as Hugging Face's modeling
code defines it (the Gated DeltaNet's value heads read their key heads as llama.cpp's files lay them out).

- Weights are dequantized with the `gguf` package's numpy code (not with the engine's tile layout), so a bug in
  the engine's repacking shows up as a mismatch instead of being shared by both sides.
- Everything else is float64 with unquantized activations. The engine differs by float32 arithmetic, 8-bit
  activations for quantized weights, and an f16 KV cache; `kv_dtype=np.float16` makes the reference round
  K and V to f16 as the cache does, so float-weight models can be held to a tight tolerance.

`random_model()` builds tiny in-memory models (a `config` and GGUF-named `tensors`, what Engine takes) of every
variant the engine supports, for tests that need a model but not a file.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
from gguf import GGMLQuantizationType
from gguf import quants as gguf_quants

from inferd.model.arch import ARCHITECTURES
from inferd.model.model_config import ModelConfig
from inferd.model.tensor import Tensor

QUANT_TYPES = ("Q4_0", "Q4_1", "Q8_0", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K", "Q2_K", "Q3_K", "IQ4_NL", "IQ4_XS",
               "MXFP4")
# the codebook and ternary types: random valid blocks of the values' scale (tests/model/kquant_ref.py)
LANE_TYPES = ("IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M", "TQ1_0", "TQ2_0")
# gguf has no writer for these: tests/model/kquant_ref.py
K_TYPES = ("Q4_K", "Q5_K", "Q6_K", "Q2_K", "Q3_K", "IQ4_XS")
FILE_QUANT_TYPES = QUANT_TYPES + LANE_TYPES


# ---------------------------------------------------------------------------------------------- weights
def dequantize(t: Tensor, rows=None) -> np.ndarray:
    """float64 (rows, cols) values of a Tensor (or of the rows `rows` of it)."""
    data = np.asarray(t.data)
    if rows is not None:
        data = data[rows]
    if t.type == "F32":
        return data.astype(np.float64)
    if t.type == "F16":
        return data.view(np.float16).astype(np.float64)
    if t.type == "BF16":
        return (data.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    if t.type in FILE_QUANT_TYPES:
        out = gguf_quants.dequantize(np.ascontiguousarray(data), GGMLQuantizationType[t.type])
        return out.reshape(data.shape[0], t.cols).astype(np.float64)
    raise ValueError(f"reference: unsupported tensor type {t.type}")


def to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bit patterns (uint16), rounding to nearest even (finite inputs)."""
    u = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def make_tensor(name: str, values: np.ndarray, type_name: str) -> Tensor:
    """A Tensor of `type_name` holding float32 `values` (rows, cols); quantized with gguf's numpy quantizers."""
    x = np.ascontiguousarray(values, np.float32)
    if x.ndim == 1:
        x = x.reshape(1, -1)
    rows, cols = x.shape
    if type_name == "F32":
        data = x
    elif type_name == "F16":
        data = x.astype(np.float16).view(np.uint16)
    elif type_name == "BF16":
        data = to_bf16_bits(x)
    elif type_name in K_TYPES:
        from tests.model.kquant_ref import quantize_k
        data = quantize_k(x, type_name)
    elif type_name in LANE_TYPES:
        from tests.model.kquant_ref import random_lane_blocks
        data = random_lane_blocks(x, type_name)
    elif type_name == "IQ4_NL":
        from tests.model.kquant_ref import quantize_iq4_nl
        data = quantize_iq4_nl(x)
    elif type_name in QUANT_TYPES:
        data = gguf_quants.quantize(x, GGMLQuantizationType[type_name]).reshape(rows, -1)
    else:
        raise ValueError(type_name)
    return Tensor(name, type_name, rows, cols, np.ascontiguousarray(data))


# ---------------------------------------------------------------------------------------------- model math
def rms_norm(x: np.ndarray, gamma: np.ndarray, eps: float) -> np.ndarray:
    """x: (..., n): x / sqrt(mean(x^2) + eps) * gamma."""
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * gamma


def rope_inv_freq(cfg, local: bool = False) -> np.ndarray:
    """(head_dim/2,) angular frequencies theta^(-2i/d), with llama3 scaling as in HF's
    _compute_llama3_parameters: wavelengths above orig/low are stretched by `factor`, those below orig/high kept,
    the band between blended linearly in orig/wavelength; linear scaling divides them all by its factor.
    local: a sliding-window layer's frequencies (Gemma 3: their own base, never scaled)."""
    d = getattr(cfg, "rope_dims", 0) or cfg.head_dim
    if local and getattr(cfg, "rope_theta_local", None):
        return float(cfg.rope_theta_local) ** (-np.arange(0, d, 2, dtype=np.float64) / d)
    inv = float(cfg.rope_theta) ** (-np.arange(0, d, 2, dtype=np.float64) / d)
    if getattr(cfg, "rope_linear_factor", 1.0) != 1.0:
        inv = inv / cfg.rope_linear_factor
    s = cfg.rope_scaling
    if not s:
        return inv
    factor, low, high = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
    orig = s["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv
    scaled = np.where(wavelen > orig / low, inv / factor, inv)
    smooth = (orig / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= orig / high) & (wavelen <= orig / low)
    return np.where(medium, blended, scaled)


def yarn_inv_freq(cfg) -> tuple[np.ndarray, float]:
    """(head_dim/2,) frequencies under YaRN and the magnitude its cos and sin are scaled by, as llama.cpp's rope_yarn
    defines them: the correction band [low, high] of pair indices from beta_fast and beta_slow rotations over the
    original context, frequencies below it (pairs above high) divided by the factor, those above it kept, a linear ramp
    between (weighed by ext_factor); magnitude attn_factor (1 + 0.1 ln factor)."""
    y, d = cfg.yarn, cfg.head_dim
    base = float(cfg.rope_theta)

    def corr_dim(rotations):
        return d * math.log(y["original_context"] / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low = max(0.0, math.floor(corr_dim(y["beta_fast"])))
    high = min(d - 1.0, math.ceil(corr_dim(y["beta_slow"])))
    inv = base ** (-np.arange(0, d, 2, dtype=np.float64) / d)
    ramp = 1 - np.clip((np.arange(d // 2) - low) / max(0.001, high - low), 0, 1)
    mix = ramp * y["ext_factor"]
    inv = inv / y["factor"] * (1 - mix) + inv * mix
    mscale = y["attn_factor"] * ((1 + 0.1 * math.log(y["factor"])) if y["ext_factor"] != 0 else 1.0)
    return inv, mscale


def swiglu_oai(g: np.ndarray, u: np.ndarray) -> np.ndarray:
    """gpt-oss's clamped SwiGLU: x = min(g, 7), x sigmoid(1.702 x) (clamp(u, -7, 7) + 1)."""
    x = np.minimum(g, 7.0)
    return x / (1.0 + np.exp(-1.702 * x)) * (np.clip(u, -7.0, 7.0) + 1.0)


def apply_rope(x: np.ndarray, positions: np.ndarray, inv_freq: np.ndarray, neox: bool) -> np.ndarray:
    """x: (T, heads, head_dim). neox: pairs (i, i + d/2) (Hugging Face's rotate_half); else pairs (2i, 2i+1)."""
    ang = positions[:, None].astype(np.float64) * inv_freq[None, :]            # (T, d/2)
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    half = x.shape[-1] // 2
    if neox:
        a, b = x[..., :half], x[..., half:]
    else:
        a, b = x[..., 0::2], x[..., 1::2]
    ra, rb = a * cos - b * sin, a * sin + b * cos
    out = np.empty_like(x)
    if neox:
        out[..., :half], out[..., half:] = ra, rb
    else:
        out[..., 0::2], out[..., 1::2] = ra, rb
    return out


def quantize_activations(x: np.ndarray) -> np.ndarray:
    """x (..., n) rounded as the engine quantizes activations: per 32 values, d = amax/127, q = round-half-even
    (x/d). Only for `act_quant=True` diagnostics; the reference proper uses unquantized activations."""
    b = x.reshape(*x.shape[:-1], -1, 32)
    d = np.abs(b).max(axis=-1, keepdims=True) / 127.0
    q = np.rint(np.divide(b, d, out=np.zeros_like(b), where=d > 0))
    return (q * d).reshape(x.shape)


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """GELU's tanh approximation (gelu_pytorch_tanh, Gemma's hidden_activation)."""
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


@dataclass
class ReferenceOutput:
    hidden: np.ndarray        # (n_layers + 1, T, dim): the embeddings, then the residual stream after each layer
    logits: np.ndarray        # (len(logit_rows), vocab)
    k: list                   # per layer (T, n_kv_heads, head_dim): keys after RoPE (what the cache stores)
    v: list                   # per layer (T, n_kv_heads, head_dim)


class Reference:
    """The model of `config` with `tensors` (GGUF names), in float64."""

    def __init__(self, config: ModelConfig, tensors: dict):
        self.cfg = config
        self.t = tensors
        self._cache: dict[str, np.ndarray] = {}
        # per MoE layer run, each token's router margin: its k-th largest logit less the (k+1)-th (a near tie's
        # choice may go either way in float32)
        self.route_margins: list[np.ndarray] = []

    def w(self, name: str) -> np.ndarray:
        if name not in self._cache:
            self._cache[name] = dequantize(self.t[name])
        return self._cache[name]

    def release(self) -> None:
        """Forget the dequantized weights (they are made again on use)."""
        self._cache.clear()

    def vec(self, name: str) -> np.ndarray:
        return self.w(name).reshape(-1)

    def mm(self, x: np.ndarray, name: str, act_quant: bool = False) -> np.ndarray:
        """x @ W.T for the weight `name` (rows = outputs)."""
        if act_quant and self.t[name].type in FILE_QUANT_TYPES:
            x = quantize_activations(x)
        return x @ self.w(name).T

    def forward(self, token_ids, positions=None, logit_rows=None, kv_dtype=None, act_quant: bool = False,
                keep_weights: bool = True) -> ReferenceOutput:
        """One sequence from position 0 (or at `positions`, all attending causally to earlier rows of this call).

        logit_rows: the rows to compute logits for (default all). kv_dtype: np.float16 rounds K and V as the
        engine's cache does. act_quant: round the inputs of quantized matmuls to 8 bits as the engine does (a
        diagnostic that separates that rounding from real errors). keep_weights=False frees each dequantized
        matrix after use (big models)."""
        ids = np.asarray(token_ids, np.int64)
        pos = np.arange(len(ids)) if positions is None else np.asarray(positions, np.int64)
        x = self.embed(ids)
        hidden, ks, vs = [x], [], []
        for i in range(self.cfg.n_layers):
            x, k, v = self.layer(i, x, pos, kv_dtype=kv_dtype, act_quant=act_quant)
            hidden.append(x)
            ks.append(k)
            vs.append(v)
            if not keep_weights:
                self.release()
        rows = np.arange(len(ids)) if logit_rows is None else np.asarray(logit_rows, np.int64)
        return ReferenceOutput(np.stack(hidden), self.logits(x[rows], act_quant=act_quant), ks, vs)

    def embed(self, token_ids) -> np.ndarray:
        """(T, dim) rows of the token embedding, times the model's embedding scale (Gemma: sqrt(dim))."""
        return dequantize(self.t["token_embd.weight"], np.asarray(token_ids, np.int64)) * self.cfg.embed_scale

    def layer(self, i: int, x: np.ndarray, positions, kv_dtype=None, act_quant: bool = False):
        """Layer i on the residual stream x (T, dim) of one sequence at `positions` (causal within the call).
        Returns (x after the layer, k (T, n_kv_heads, head_dim) after RoPE, v); a Gated DeltaNet layer (which
        starts from an empty state at the call's first token) returns None for k and v."""
        cfg = self.cfg
        if i in getattr(cfg, "recurrent_layers", ()):
            p = f"blk.{i}."
            h = rms_norm(x, self.vec(p + "attn_norm.weight"), cfg.norm_eps)
            x = x + self.gated_delta_net(p, h, act_quant)
            return x + self.ffn(p, x, act_quant), None, None
        T = x.shape[0]
        pos = np.asarray(positions, np.int64)
        hd, nh, nkv = cfg.head_dim, cfg.n_heads, cfg.n_kv_heads
        group = nh // nkv
        p = f"blk.{i}."
        h = rms_norm(x, self.vec(p + "attn_norm.weight"), cfg.norm_eps)
        q = self.mm(h, p + "attn_q.weight", act_quant)
        gate = None
        if getattr(cfg, "attn_output_gate", False):        # Wq's rows per head: its q, then its output gate
            qg = q.reshape(T, nh, 2 * hd)
            q, gate = qg[:, :, :hd].reshape(T, nh * hd), qg[:, :, hd:]
        k = self.mm(h, p + "attn_k.weight", act_quant)
        v = self.mm(h, p + "attn_v.weight", act_quant)
        if cfg.qkv_bias:
            q = q + self.vec(p + "attn_q.bias")
            k = k + self.vec(p + "attn_k.bias")
            v = v + self.vec(p + "attn_v.bias")
        if cfg.qk_norm and cfg.qk_norm_full:                                  # OLMoE: all of q, all of k
            q = rms_norm(q, self.vec(p + "attn_q_norm.weight"), cfg.norm_eps)
            k = rms_norm(k, self.vec(p + "attn_k_norm.weight"), cfg.norm_eps)
        q, k, v = q.reshape(T, nh, hd), k.reshape(T, nkv, hd), v.reshape(T, nkv, hd)
        if cfg.qk_norm and not cfg.qk_norm_full:                              # per head, before RoPE
            q = rms_norm(q, self.vec(p + "attn_q_norm.weight"), cfg.norm_eps)
            k = rms_norm(k, self.vec(p + "attn_k_norm.weight"), cfg.norm_eps)
        window = cfg.layer_window(i)
        inv_freq, mscale = yarn_inv_freq(cfg) if cfg.yarn else (rope_inv_freq(cfg, local=window > 0), 1.0)
        rd = getattr(cfg, "rope_dims", 0) or hd                             # partial RoPE: the first rd dims
        q = np.concatenate([apply_rope(q[..., :rd], pos, inv_freq, cfg.rope_neox) * mscale, q[..., rd:]], axis=-1)
        k = np.concatenate([apply_rope(k[..., :rd], pos, inv_freq, cfg.rope_neox) * mscale, k[..., rd:]], axis=-1)
        if kv_dtype is not None:
            k = k.astype(kv_dtype).astype(np.float64)
            v = v.astype(kv_dtype).astype(np.float64)
        causal = pos[None, :] <= pos[:, None]                                 # (T query, T key)
        if window:                                  # the query sees the `window` keys ending at itself
            causal &= pos[:, None] - pos[None, :] < window
        attn = np.empty((T, nh, hd))
        sinks = self.vec(p + "attn_sinks.weight") if cfg.attn_sinks else None
        for j in range(nh):
            kv = j // group                                                   # GQA
            s = (q[:, j, :] @ k[:, kv, :].T) * cfg.query_scale                # (T, T)
            s = np.where(causal, s, -np.inf)
            m = s.max(axis=1, keepdims=True)
            if sinks is not None:                     # a logit in the denominator that weighs no value (gpt-oss)
                m = np.maximum(m, sinks[j])
            s = np.exp(s - m)
            denom = s.sum(axis=1, keepdims=True) + (np.exp(sinks[j] - m) if sinks is not None else 0.0)
            attn[:, j, :] = (s / denom) @ v[:, kv, :]
        if gate is not None:
            attn = attn / (1.0 + np.exp(-gate))
        o = self.mm(attn.reshape(T, nh * hd), p + "attn_output.weight", act_quant)
        if cfg.attn_out_bias:
            o = o + self.vec(p + "attn_output.bias")
        if cfg.sandwich_norms:
            o = rms_norm(o, self.vec(p + "post_attention_norm.weight"), cfg.norm_eps)
        x = x + o
        return x + self.ffn(p, x, act_quant), k, v

    def ffn(self, p: str, x: np.ndarray, act_quant: bool = False) -> np.ndarray:
        """The FFN block's output (before the residual add) for the residual stream x."""
        cfg = self.cfg
        h = rms_norm(x, self.vec(p + ARCHITECTURES[cfg.arch].ffn_norm_tensor), cfg.norm_eps)
        if cfg.n_experts:
            f = self.moe_ffn(p, h, act_quant)
        else:
            g = self.mm(h, p + "ffn_gate.weight", act_quant)
            u = self.mm(h, p + "ffn_up.weight", act_quant)
            act = gelu_tanh if cfg.ffn_act == "gelu_tanh" else silu
            f = self.mm(act(g) * u, p + "ffn_down.weight", act_quant)
        if cfg.sandwich_norms:
            f = rms_norm(f, self.vec(p + "post_ffw_norm.weight"), cfg.norm_eps)
        return f

    def gated_delta_net(self, p: str, h: np.ndarray, act_quant: bool = False) -> np.ndarray:
        """A Gated DeltaNet mixer (Qwen3-Next / Qwen3.5's linear attention) over one sequence from an empty state:
        (q|k|v, z) = (Wqkv h, Wgate h); q|k|v through the causal depthwise convolution (zeros before the first
        token) and SiLU; q, k L2-normed per head (x / sqrt(sum x^2 + eps)), q scaled by 1/sqrt(head_k); per value
        head (key head h % n_k_heads) and token: S = exp(g) S with g = a * softplus(alpha + dt_bias), kv = S^T k,
        S += k (beta (v - kv))^T with beta = sigmoid(Wbeta h), o = S^T q; then RMSNorm(o) * w * silu(z), and Wout."""
        cfg = self.cfg
        T = h.shape[0]
        nk, nv, dk, dv, K = cfg.ssm_k_heads, cfg.ssm_v_heads, cfg.ssm_head_k, cfg.ssm_head_v, cfg.ssm_conv_kernel
        r = nv // nk
        if p + "ssm_in.weight" in self.t:      # Qwen3-Next's older files: q|k|v|z per key head, in turn
            qkvz = self.mm(h, p + "ssm_in.weight", act_quant).reshape(T, nk, 2 * dk + 2 * r * dv)
            mixed = np.concatenate([qkvz[:, :, :dk].reshape(T, -1), qkvz[:, :, dk:2 * dk].reshape(T, -1),
                                    qkvz[:, :, 2 * dk:2 * dk + r * dv].reshape(T, -1)], axis=1)
            z = qkvz[:, :, 2 * dk + r * dv:].reshape(T, nv, dv)
        else:
            mixed = self.mm(h, p + "attn_qkv.weight", act_quant)              # (T, conv_dim)
            z = self.mm(h, p + "attn_gate.weight", act_quant).reshape(T, nv, dv)
        if p + "ssm_ba.weight" in self.t:      # Qwen3-Next: beta|alpha of each key head's value heads, in turn
            ba = self.mm(h, p + "ssm_ba.weight", act_quant).reshape(T, nk, 2 * r)
            b, a = ba[:, :, :r].reshape(T, nv), ba[:, :, r:].reshape(T, nv)
        else:
            b, a = self.mm(h, p + "ssm_beta.weight", act_quant), self.mm(h, p + "ssm_alpha.weight", act_quant)
        beta = 1.0 / (1.0 + np.exp(-b))                                         # (T, nv)
        alpha = a + self.vec(p + "ssm_dt.bias")
        g = self.vec(p + "ssm_a") * np.logaddexp(0.0, alpha)                   # a * softplus: log decay, (T, nv)
        taps = self.w(p + "ssm_conv1d.weight")                                 # (conv_dim, K), oldest first
        padded = np.concatenate([np.zeros((K - 1, mixed.shape[1])), mixed])
        conv = np.stack([(padded[t:t + K] * taps.T).sum(axis=0) for t in range(T)])
        conv = silu(conv)
        q = conv[:, :nk * dk].reshape(T, nk, dk)
        k = conv[:, nk * dk:2 * nk * dk].reshape(T, nk, dk)
        v = conv[:, 2 * nk * dk:].reshape(T, nv, dv)
        q = q / np.sqrt((q * q).sum(-1, keepdims=True) + cfg.norm_eps) / np.sqrt(dk)
        k = k / np.sqrt((k * k).sum(-1, keepdims=True) + cfg.norm_eps)
        out = np.empty((T, nv, dv))
        for head in range(nv):
            kh = head // r if cfg.ssm_grouped_heads else head % nk     # Qwen3-Next groups, Qwen3.5 tiles
            S = np.zeros((dk, dv))
            for t in range(T):
                S = S * np.exp(g[t, head])
                delta = (v[t, head] - S.T @ k[t, kh]) * beta[t, head]
                S = S + np.outer(k[t, kh], delta)
                out[t, head] = S.T @ q[t, kh]
        normed = rms_norm(out, self.vec(p + "ssm_norm.weight"), cfg.norm_eps) * silu(z)
        return self.mm(normed.reshape(T, nv * dv), p + "ssm_out.weight", act_quant)

    def gated_ffn(self, h: np.ndarray, gate: np.ndarray, up: np.ndarray, down: np.ndarray,
                  act_quant: bool = False, biases=None) -> np.ndarray:
        """biases: (gate, up, down) biases (gpt-oss's experts), or None."""
        bg, bu, bd = biases if biases is not None else (0.0, 0.0, 0.0)
        if self.cfg.ffn_act == "swiglu_oai":
            g = swiglu_oai(h @ gate.T + bg, h @ up.T + bu)
        else:
            act = gelu_tanh if self.cfg.ffn_act == "gelu_tanh" else silu
            g = act(h @ gate.T + bg) * (h @ up.T + bu)
        return (quantize_activations(g) if act_quant else g) @ down.T + bd

    def experts(self, name: str) -> np.ndarray:
        """(n_experts, rows, cols) of a 3-D expert tensor (held stacked by rows)."""
        w = self.w(name)
        return w.reshape(self.cfg.n_experts, -1, w.shape[1])

    def moe_ffn(self, p: str, h: np.ndarray, act_quant: bool = False) -> np.ndarray:
        """The mixture of experts as Hugging Face's Qwen2/Qwen3-MoE, OLMoE and Mixtral blocks define it: softmax of
        the router's logits, the top k (ties to the lower index), renormalized where the model says
        (norm_topk_prob; Mixtral's softmax over its top-k logits is the same), each token the weighted sum of its
        experts' gated FFNs; Qwen2-MoE adds sigmoid(shared gate . h) times its shared expert. act_quant: the router's
        and experts' inputs rounded as the engine's 8-bit activations (quantized weights only)."""
        cfg = self.cfg
        x = quantize_activations(h) if act_quant else h
        logits = h @ self.w(p + "ffn_gate_inp.weight").T
        biases = None
        if cfg.expert_bias:                      # gpt-oss: the router's bias and each expert's gate, up, down biases
            logits = logits + self.vec(p + "ffn_gate_inp.bias")
            biases = [self.w(p + f"ffn_{r}_exps.bias") for r in ("gate", "up", "down")]
        ranked = -np.sort(-logits, axis=1)
        if cfg.n_experts_used < cfg.n_experts:
            self.route_margins.append(ranked[:, cfg.n_experts_used - 1] - ranked[:, cfg.n_experts_used])
        probs = np.exp(logits - logits.max(axis=1, keepdims=True))
        probs /= probs.sum(axis=1, keepdims=True)
        gate, up, down = (self.experts(p + f"ffn_{r}_exps.weight") for r in ("gate", "up", "down"))
        out = np.zeros_like(h)
        for t in range(h.shape[0]):
            chosen = np.lexsort((np.arange(cfg.n_experts), -probs[t]))[:cfg.n_experts_used]
            w = probs[t, chosen]
            if cfg.expert_gating == "topk_softmax":        # the softmax over the k chosen logits alone
                w = np.exp(logits[t, chosen] - logits[t, chosen].max())
                w = w / w.sum()
            if cfg.expert_norm_topk:
                w = w / w.sum()
            w = w * cfg.expert_weights_scale
            for e, we in zip(chosen, w):
                b = None if biases is None else [bias[e] for bias in biases]
                out[t] += we * self.gated_ffn(x[t:t + 1], gate[e], up[e], down[e], act_quant, b)[0]
        if cfg.shared_expert_hidden_dim:
            shared = self.gated_ffn(x, *(self.w(p + f"ffn_{r}_shexp.weight") for r in ("gate", "up", "down")),
                                    act_quant)
            g = h @ self.vec(p + "ffn_gate_inp_shexp.weight")
            out += (1.0 / (1.0 + np.exp(-g)))[:, None] * shared
        return out

    def logits(self, x: np.ndarray, act_quant: bool = False) -> np.ndarray:
        """(rows, vocab) logits of final residual-stream rows x (rows, dim)."""
        cfg = self.cfg
        xn = rms_norm(x, self.vec("output_norm.weight"), cfg.norm_eps)
        out_t = self.t["token_embd.weight"] if cfg.tie_embeddings else self.t["output.weight"]
        if act_quant and out_t.type in FILE_QUANT_TYPES:
            xn = quantize_activations(xn)
        logits = np.empty((x.shape[0], cfg.vocab_size))
        for r0 in range(0, cfg.vocab_size, 8192):                              # bounded memory for big vocabs
            r1 = min(cfg.vocab_size, r0 + 8192)
            logits[:, r0:r1] = xn @ dequantize(out_t, slice(r0, r1)).T
        if cfg.logit_softcap:
            logits = cfg.logit_softcap * np.tanh(logits / cfg.logit_softcap)
        return logits


# ---------------------------------------------------------------------------------------------- tiny models
def random_model(*, arch: str = "llama", weight_type: str = "F32", embed_type: str | None = None,
                 output_type: str | None = None, vocab: int = 203, dim: int = 128, n_layers: int = 2,
                 n_heads: int = 2, n_kv_heads: int = 1, head_dim: int | None = None, hidden: int = 160,
                 rope_theta: float = 10000.0, rope_scaling: dict | None = None, rope_neox: bool | None = None,
                 qkv_bias: bool | None = None, tie: bool = True, context_length: int = 256,
                 norm_eps: float = 1e-5, seed: int = 0, mix: dict[str, str] | None = None,
                 experts: int = 0, experts_used: int = 2, expert_hidden: int = 64, shared_hidden: int = 0,
                 **switches) -> SimpleNamespace:
    """A random model as the loaders would hand it to Engine: `.config` (ModelConfig) and `.tensors`.

    Defaults are deliberately awkward: vocab 203 (not a multiple of the 8-row tile), hidden 160 (5 blocks).
    Weights ~ N(0, 1/cols) so activations stay O(1); norm weights and biases are F32 (the loaders convert
    vectors to F32). embed_type/output_type default to weight_type; `mix` overrides the type of layer tensors by
    short name, as llama.cpp's Q4_K_M does: {"attn_v": "Q6_K", "ffn_down": "Q6_K"}.
    arch "qwen3" turns QK-norm on; "gemma3" every Gemma 3 switch, with a sliding window of 24 on all layers but
    every third (so an 80-token test crosses it); `switches` are further ModelConfig fields (sliding_window=...).
    experts > 0: a mixture of `experts` experts of expert_hidden, experts_used per token, with a shared expert of
    shared_hidden when that is > 0; arch "qwen3moe" (QK-norm, renormalized top-k), "qwen2moe" (QKV bias),
    "olmoe" (QK-norm over all of q and k) or "llama" (Mixtral: renormalized)."""
    rng = np.random.default_rng(seed)
    head_dim = head_dim or dim // n_heads
    neox = (arch != "llama") if rope_neox is None else rope_neox
    bias = (arch in ("qwen2", "qwen2moe", "gpt-oss")) if qkv_bias is None else qkv_bias
    if experts:
        switches = {"n_experts": experts, "n_experts_used": experts_used, "expert_hidden_dim": expert_hidden,
                    "shared_expert_hidden_dim": shared_hidden, "expert_norm_topk": arch in ("qwen3moe", "llama"),
                    **switches}
    if arch in ("qwen3", "qwen3moe"):
        switches = {"qk_norm": True, **switches}
    elif arch == "olmoe":
        switches = {"qk_norm": True, "qk_norm_full": True, **switches}
    elif arch == "gpt-oss":
        switches = {"attn_sinks": True, "attn_out_bias": True, "expert_bias": True, "expert_gating": "topk_softmax",
                    "ffn_act": "swiglu_oai", "sliding_window": 16,
                    "local_layers": tuple(i for i in range(n_layers) if i % 2 == 0), **switches}
    elif arch == "gemma3":
        switches = {"qk_norm": True, "sandwich_norms": True, "ffn_act": "gelu_tanh", "embed_scale": math.sqrt(dim),
                    "attn_scale": 1.0 / math.sqrt(head_dim), "sliding_window": 24,
                    "local_layers": tuple(i for i in range(n_layers) if i % 3 != 2), "rope_theta_local": 10000.0,
                    **switches}
    cfg = ModelConfig(arch=arch, vocab_size=vocab, dim=dim, n_layers=n_layers, n_heads=n_heads,
                      n_kv_heads=n_kv_heads, head_dim=head_dim, hidden_dim=hidden, rope_theta=rope_theta,
                      rope_scaling=rope_scaling, rope_neox=neox, norm_eps=norm_eps, tie_embeddings=tie,
                      qkv_bias=bias, context_length=context_length, **switches)
    q_dim, kv_dim = n_heads * head_dim, n_kv_heads * head_dim

    def mat(rows, cols, gain=1.0):
        return (rng.standard_normal((rows, cols)) * (gain / math.sqrt(cols))).astype(np.float32)

    def norm_w(n):
        return (1.0 + 0.2 * rng.standard_normal(n)).astype(np.float32)

    ts = {}

    def add(name, values, type_name):
        short = name.split(".")[-2] if name.startswith("blk.") else ""
        ts[name] = make_tensor(name, values, (mix or {}).get(short, type_name) if type_name != "F32" else "F32")

    # Gemma's embeddings are ~1/sqrt(dim), brought back to O(1) by its embedding scale
    embd = rng.standard_normal((vocab, dim)) / (cfg.embed_scale if arch == "gemma3" else 1.0)
    add("token_embd.weight", embd.astype(np.float32), embed_type or weight_type)
    add("output_norm.weight", norm_w(dim), "F32")
    if not tie:
        add("output.weight", mat(vocab, dim, 2.0), output_type or weight_type)
    for i in range(n_layers):
        p = f"blk.{i}."
        add(p + "attn_norm.weight", norm_w(dim), "F32")
        add(p + ARCHITECTURES[arch].ffn_norm_tensor, norm_w(dim), "F32")
        add(p + "attn_q.weight", mat(q_dim, dim, 1.5), weight_type)   # > 1: attention that is not uniform
        add(p + "attn_k.weight", mat(kv_dim, dim, 1.5), weight_type)
        add(p + "attn_v.weight", mat(kv_dim, dim), weight_type)
        add(p + "attn_output.weight", mat(dim, q_dim), weight_type)
        if experts:   # the experts' 3-D tensors held stacked by rows, as the GGUF loader holds them
            add(p + "ffn_gate_inp.weight", mat(experts, dim, 3.0), "F32")
            add(p + "ffn_gate_exps.weight", mat(experts * expert_hidden, dim), weight_type)
            add(p + "ffn_up_exps.weight", mat(experts * expert_hidden, dim), weight_type)
            add(p + "ffn_down_exps.weight", mat(experts * dim, expert_hidden), weight_type)
            if cfg.expert_bias:
                add(p + "ffn_gate_inp.bias", 0.5 * rng.standard_normal(experts), "F32")
                for r, rows in (("gate", expert_hidden), ("up", expert_hidden), ("down", dim)):
                    add(p + f"ffn_{r}_exps.bias", 0.3 * rng.standard_normal((experts, rows)), "F32")
            if shared_hidden:
                add(p + "ffn_gate_inp_shexp.weight", mat(1, dim, 3.0), "F32")
                add(p + "ffn_gate_shexp.weight", mat(shared_hidden, dim), weight_type)
                add(p + "ffn_up_shexp.weight", mat(shared_hidden, dim), weight_type)
                add(p + "ffn_down_shexp.weight", mat(dim, shared_hidden), weight_type)
        else:
            add(p + "ffn_gate.weight", mat(hidden, dim), weight_type)
            add(p + "ffn_up.weight", mat(hidden, dim), weight_type)
            add(p + "ffn_down.weight", mat(dim, hidden), weight_type)
        if bias:
            add(p + "attn_q.bias", 0.5 * rng.standard_normal(q_dim), "F32")
            add(p + "attn_k.bias", 0.5 * rng.standard_normal(kv_dim), "F32")
            add(p + "attn_v.bias", 0.5 * rng.standard_normal(kv_dim), "F32")
        if cfg.attn_out_bias:
            add(p + "attn_output.bias", 0.3 * rng.standard_normal(dim), "F32")
        if cfg.attn_sinks:   # logits about the scores' size: some heads give the sink much of their weight
            add(p + "attn_sinks.weight", 1.0 + rng.standard_normal(n_heads), "F32")
        if cfg.qk_norm:
            add(p + "attn_q_norm.weight", norm_w(q_dim if cfg.qk_norm_full else head_dim), "F32")
            add(p + "attn_k_norm.weight", norm_w(kv_dim if cfg.qk_norm_full else head_dim), "F32")
        if cfg.sandwich_norms:
            add(p + "post_attention_norm.weight", norm_w(dim), "F32")
            add(p + "post_ffw_norm.weight", norm_w(dim), "F32")
    return SimpleNamespace(config=cfg, tensors=ts, path=None)
