"""A LoadedModel's tensors -> the C engine's Model: Wq|Wk|Wv and Wgate|Wup fused into one matrix each (one
parallel region per fused matmul), then repacked by C into 8-row tiles. The fused parts must share a type;
when a file mixes types (say Q4_K attention with a Q6_K V), the parts are brought to the most precise one."""
from __future__ import annotations

import numpy as np

from inferd import _cpu

# most precise first
PRECISION = ("F32", "F16", "BF16", "Q8_0", "Q4_1", "Q4_0")


def _to_f32(t) -> np.ndarray:
    if t.type == "F32":
        return np.asarray(t.data, np.float32)
    return _cpu.Weight(t.type, t.rows, t.cols, t.data).dequantize()


def _convert(t, target: str) -> np.ndarray:
    """t's data in `target`'s raw layout."""
    if t.type == target:
        return t.data
    x = _to_f32(t)
    if target == "F32":
        return x
    if target == "F16":
        return x.astype(np.float16).view(np.uint16)
    if target == "BF16":  # round to nearest even
        u = x.view(np.uint32).astype(np.uint64)
        return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return _cpu.quantize(x, target)


def fuse(parts, interleave: int = 0) -> tuple:
    """(type, rows, cols, data) of the row-wise concatenation of `parts`; with `interleave`, of their groups of that
    many rows in turn (group 0 of every part, then group 1, ...), so that one stretch of rows holds the same units
    of every part."""
    target = min((p.type for p in parts), key=PRECISION.index)
    cols = parts[0].cols
    if any(p.cols != cols for p in parts):
        raise ValueError(f"cannot fuse {[p.name for p in parts]}: their input widths differ")
    datas = [np.asarray(_convert(p, target)) for p in parts]
    if interleave:
        if any(p.rows != parts[0].rows or p.rows % interleave for p in parts):
            raise ValueError(f"cannot interleave {[p.name for p in parts]} by {interleave} rows")
        groups = [d.reshape(parts[0].rows // interleave, interleave, -1) for d in datas]
        data = np.stack(groups, axis=1).reshape(len(parts) * parts[0].rows, -1)
    else:
        data = np.concatenate(datas, axis=0)
    return (target, sum(p.rows for p in parts), cols, data)


def _spec(t) -> tuple:
    return (t.type, t.rows, t.cols, t.data)


def _vector(t) -> tuple:
    return ("F32", 1, t.rows * t.cols, _to_f32(t).reshape(-1))


def build_cpu_model(model) -> _cpu.Model:
    cfg = model.config
    ts = model.tensors
    rope = cfg.rope_scaling or {}
    config = {
        "vocab": cfg.vocab_size, "dim": cfg.dim, "n_layers": cfg.n_layers, "n_heads": cfg.n_heads,
        "n_kv_heads": cfg.n_kv_heads, "head_dim": cfg.head_dim, "hidden": cfg.hidden_dim,
        "context_length": cfg.context_length, "rope_neox": int(cfg.rope_neox), "norm_eps": cfg.norm_eps,
        "rope_theta": cfg.rope_theta,
        "rope_factor": float(rope.get("factor", 0.0)),
        "rope_low_freq_factor": float(rope.get("low_freq_factor", 1.0)),
        "rope_high_freq_factor": float(rope.get("high_freq_factor", 4.0)),
        "rope_original_ctx": int(rope.get("original_max_position_embeddings", 8192)),
        "rope_freq_scale": 1.0 / cfg.rope_linear_factor,
        "rope_theta_local": float(cfg.rope_theta_local or 0.0),
        "embed_scale": float(cfg.embed_scale) if cfg.embed_scale != 1.0 else 0.0,
        "attn_scale": float(cfg.query_scale),
        "logit_softcap": float(cfg.logit_softcap),
        "ffn_gelu": int(cfg.ffn_act == "gelu_tanh"),
        "windows": [cfg.layer_window(i) for i in range(cfg.n_layers)],
    }
    tensors = {"tok_embd": _spec(ts["token_embd.weight"]), "output_norm": _vector(ts["output_norm.weight"])}
    if "output.weight" in ts and not cfg.tie_embeddings:
        tensors["output"] = _spec(ts["output.weight"])
    for i in range(cfg.n_layers):
        p = f"blk.{i}."
        tensors[p + "attn_norm"] = _vector(ts[p + "attn_norm.weight"])
        tensors[p + "ffn_norm"] = _vector(ts[p + "ffn_norm.weight"])
        tensors[p + "wqkv"] = fuse([ts[p + "attn_q.weight"], ts[p + "attn_k.weight"], ts[p + "attn_v.weight"]])
        if cfg.qkv_bias:
            bias = np.concatenate([_to_f32(ts[p + f"attn_{x}.bias"]).reshape(-1) for x in "qkv"])
            tensors[p + "qkv_bias"] = ("F32", 1, bias.size, bias)
        if cfg.qk_norm:
            tensors[p + "q_norm"] = _vector(ts[p + "attn_q_norm.weight"])
            tensors[p + "k_norm"] = _vector(ts[p + "attn_k_norm.weight"])
        if cfg.sandwich_norms:
            tensors[p + "post_attn_norm"] = _vector(ts[p + "post_attention_norm.weight"])
            tensors[p + "post_ffn_norm"] = _vector(ts[p + "post_ffw_norm.weight"])
        tensors[p + "wo"] = _spec(ts[p + "attn_output.weight"])
        # per 32 hidden units, their gate rows then their up rows: the engine computes both, applies SwiGLU and
        # quantizes the 32 results as one block of the down projection's input, in one pass (forward.c)
        tensors[p + "wgu"] = fuse([ts[p + "ffn_gate.weight"], ts[p + "ffn_up.weight"]], interleave=32)
        tensors[p + "wdown"] = _spec(ts[p + "ffn_down.weight"])
    return _cpu.Model(config, tensors)
