"""A LoadedModel's tensors -> the C engine's Model: Wq|Wk|Wv and Wgate|Wup fused into one matrix each (one
parallel region per fused matmul), repacked by C into 8-row tiles straight from the file's mapped rows. A fused
matrix keeps each part's quantized type (Q4_K_M files give Q4_K Q and K with a Q6_K V: one matrix of two
segments). Parts are converted only where segments cannot hold them: float parts beside quantized ones, or
interleaved parts (gate|up) of different types; then they are brought to the most precise of their types."""

from __future__ import annotations

import mmap
from typing import Any

import numpy as np

from inferd import _cpu
from inferd.model.arch import ATTENTION, FFN_GATED, FFN_MOE, MODEL_TENSORS, RECURRENT
from inferd.model.layers import Block, layer_plan
from inferd.model.tensor import Tensor

# most precise first
PRECISION = (
    "F32",
    "F16",
    "BF16",
    "Q8_0",
    "Q6_K",
    "Q5_K",
    "Q5_1",
    "Q5_0",
    "Q4_K",
    "Q4_1",
    "Q4_0",
    "IQ4_NL",
    "IQ4_XS",
    "MXFP4",
    "Q3_K",
    "IQ3_S",
    "IQ3_XXS",
    "Q2_K",
    "TQ2_0",
    "IQ2_S",
    "IQ2_XS",
    "IQ2_XXS",
    "TQ1_0",
    "IQ1_M",
    "IQ1_S",
)
FLOATS = ("F32", "F16", "BF16")
QUANTIZABLE = FLOATS + ("Q8_0", "Q4_1", "Q4_0")  # the types _cpu.quantize writes
MAX_SEGMENTS = 3


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


def _segments(types: list[str]) -> int:
    return sum(1 for i, t in enumerate(types) if i == 0 or t != types[i - 1])


def fuse(parts, interleave: int = 0) -> tuple:
    """The engine's spec ("parts", [(type, rows, cols, data)...], interleave) of the row-wise concatenation of
    `parts`; with `interleave`, of their groups of that many rows in turn (group 0 of every part, then group 1,
    ...), so that one stretch of rows holds the same units of every part. The C side repacks every part from its
    own array (no concatenated copy)."""
    cols = parts[0].cols
    if any(p.cols != cols for p in parts):
        raise ValueError(f"cannot fuse {[p.name for p in parts]}: their input widths differ")
    if interleave and any(p.rows != parts[0].rows or p.rows % interleave for p in parts):
        raise ValueError(f"cannot interleave {[p.name for p in parts]} by {interleave} rows")
    types = [p.type for p in parts]
    quantized = not any(t in FLOATS for t in types)
    if len(set(types)) == 1 or (
        quantized and not interleave and _segments(types) <= MAX_SEGMENTS and all(p.rows % 8 == 0 for p in parts[:-1])
    ):
        return ("parts", [_spec(p) for p in parts], interleave)
    target = min(types, key=PRECISION.index)
    if target not in QUANTIZABLE:
        target = "Q8_0"
    return (
        "parts",
        [_spec(p) if p.type == target else (target, p.rows, cols, np.asarray(_convert(p, target))) for p in parts],
        interleave,
    )


def _spec(t) -> tuple:
    return (t.type, t.rows, t.cols, t.data)


def _vector(t) -> tuple:
    return ("F32", 1, t.rows * t.cols, _to_f32(t).reshape(-1))


def file_pages(data: np.ndarray) -> tuple[int, int] | None:
    """(address, bytes) of the whole pages of the mapped file an array is a view of, or None (not a file's view, or
    within one page). _cpu.Model drops them from this process's resident set once their weight is built: they stay
    in the page cache (and fault back in if read again), but the process does not hold the file's bytes beside
    their repacked copy, so loading peaks at the weights' size rather than twice it."""
    base: object = data
    while base is not None and not isinstance(base, mmap.mmap):
        base = base.obj if isinstance(base, memoryview) else getattr(base, "base", None)
    if base is None or data.nbytes == 0:
        return None
    address = data.ctypes.data
    lo = -(-address // mmap.PAGESIZE) * mmap.PAGESIZE
    hi = (address + data.nbytes) // mmap.PAGESIZE * mmap.PAGESIZE
    return (lo, hi - lo) if hi > lo else None


def engine_config(cfg) -> dict:
    """A ModelConfig's model-wide numbers as the C engines read them (model_config_t, and the CUDA runner's config),
    built here once; what each block reads comes with it from the layer plan."""
    rope = cfg.rope_scaling or {}
    return {
        "vocab": cfg.vocab_size,
        "dim": cfg.dim,
        "n_layers": cfg.n_layers,
        "n_heads": cfg.n_heads,
        "n_kv_heads": cfg.n_kv_heads,
        "head_dim": cfg.head_dim,
        "hidden": cfg.hidden_dim,
        "context_length": cfg.context_length,
        "rope_neox": int(cfg.rope_neox),  # the CUDA runner's; the CPU's attention blocks carry their own
        "norm_eps": cfg.norm_eps,
        "rope_theta": cfg.rope_theta,
        "rope_factor": float(rope.get("factor", 0.0)),
        "rope_low_freq_factor": float(rope.get("low_freq_factor", 1.0)),
        "rope_high_freq_factor": float(rope.get("high_freq_factor", 4.0)),
        "rope_original_ctx": int(rope.get("original_max_position_embeddings", 8192)),
        "rope_freq_scale": 1.0 / cfg.rope_linear_factor,
        "rope_theta_local": float(cfg.rope_theta_local or 0.0),
        **_yarn_config(cfg.yarn),
        "embed_scale": float(cfg.embed_scale) if cfg.embed_scale != 1.0 else 0.0,
        "logit_softcap": float(cfg.logit_softcap),
        "rope_dims": int(cfg.rope_dims),
    }


def _yarn_config(yarn: dict | None) -> dict:
    if yarn is None:
        return {}
    return {
        "yarn_factor": float(yarn["factor"]),
        "yarn_original_ctx": int(yarn["original_context"]),
        "yarn_ext_factor": float(yarn["ext_factor"]),
        "yarn_attn_factor": float(yarn["attn_factor"]),
        "yarn_beta_fast": float(yarn["beta_fast"]),
        "yarn_beta_slow": float(yarn["beta_slow"]),
    }


def build_cpu_model(model, threads: int = 1, progress=None, huge_pages_now: bool = True) -> _cpu.Model:
    """threads: repack with this many threads; progress(done_bytes, total_bytes) as the weights fill (see
    inferd.engine.load_progress); huge_pages_now: see _cpu.Model. The heap's free pages go back to the kernel
    before (what an earlier model freed would otherwise sit under this one's peak) and after (the repack's
    temporaries)."""
    _cpu.release_free_memory()
    built = _build_cpu_model(model, threads, progress, huge_pages_now)
    _cpu.release_free_memory()
    return built


def _build_cpu_model(model, threads: int, progress, huge_pages_now: bool) -> _cpu.Model:
    config, tensors, layers = cpu_model_parts(model)
    return _cpu.Model(config, tensors, layers, threads, progress, file_pages, huge_pages_now)


def cpu_model_parts(model) -> tuple[dict, dict, list]:
    """_cpu.Model's arguments for a LoadedModel: the config, the model's own tensors, per layer its blocks."""
    cfg = model.config
    ts = model.tensors
    tensors = {
        "tok_embd": _spec(ts[MODEL_TENSORS["embedding"]]),
        "output_norm": _vector(ts[MODEL_TENSORS["output_norm"]]),
    }
    if MODEL_TENSORS["output"] in ts and not cfg.tie_embeddings:
        tensors["output"] = _spec(ts[MODEL_TENSORS["output"]])
    layers = [[_cpu_block(block, ts) for block in blocks] for blocks in layer_plan(cfg)]
    return engine_config(cfg), tensors, layers


def _cpu_block(block: Block, ts) -> tuple:
    """A block as _cpu.Model takes it: (kind, options, the engine's tensors)."""
    t = {role: ts[name] for role, name in block.tensors.items()}
    out: dict[str, Any] = {"norm": _vector(t["norm"])}
    if "post_norm" in t:
        out["post_norm"] = _vector(t["post_norm"])
    if block.kind == ATTENTION and block.options.get("gated"):
        # Wq holds per head its q rows then its output gate's: the q rows go into Wqkv beside k and v, the gate's
        # into a matrix of their own (views of the file's rows, one part per head)
        head_dim = t["k_norm"].cols
        q_parts, gate_parts = split_heads(t["q"], head_dim)
        out["wqkv"] = fuse([*q_parts, t["k"], t["v"]])
        out["wgate"] = fuse(gate_parts)
        out["q_norm"], out["k_norm"] = _vector(t["q_norm"]), _vector(t["k_norm"])
        out["wo"] = _spec(t["o"])
    elif block.kind == ATTENTION:
        out["wqkv"] = fuse([t["q"], t["k"], t["v"]])
        if "q_bias" in t:
            bias = np.concatenate([_to_f32(t[f"{x}_bias"]).reshape(-1) for x in "qkv"])
            out["qkv_bias"] = ("F32", 1, bias.size, bias)
        if "q_norm" in t:
            out["q_norm"], out["k_norm"] = _vector(t["q_norm"]), _vector(t["k_norm"])
        for role in ("o_bias", "sinks"):
            if role in t:
                out[role] = _vector(t[role])
        out["wo"] = _spec(t["o"])
    elif block.kind == FFN_GATED:
        # per 32 hidden units, their gate rows then their up rows: the engine computes both, applies the
        # activation and quantizes the 32 results as one block of the down projection's input, in one pass
        # (block_ffn.c)
        out["wgu"] = fuse([t["gate"], t["up"]], interleave=32)
        out["wdown"] = _spec(t["down"])
    elif block.kind == FFN_MOE:
        # the router, then each expert as a weight of its own made from its rows of the file's 3-D tensors (views:
        # the repack is the one copy), gate|up interleaved by 32 as the dense FFN's
        out["router"] = _spec(t["router"])
        n = block.shapes["gate_exps"][0]
        gates, ups, downs = (experts(t[role], n) for role in ("gate_exps", "up_exps", "down_exps"))
        out["experts_gu"] = [fuse([g, u], interleave=32) for g, u in zip(gates, ups)]
        out["experts_down"] = [_spec(d) for d in downs]
        if "router_bias" in t:  # gpt-oss: the router's and every expert's biases, (n_experts, rows) in floats
            out["router_bias"] = _vector(t["router_bias"])
            for role in ("gate", "up", "down"):
                out[f"{role}_bias"] = _vector(t[f"{role}_exps_bias"])
        if "shared_gate" in t:
            out["shared_gate"] = _vector(t["shared_gate"])
            out["shared_gu"] = fuse([t["gate_shexp"], t["up_shexp"]], interleave=32)
            out["shared_down"] = _spec(t["down_shexp"])
    elif block.kind == RECURRENT:
        o = block.options
        if "in" in t:  # Qwen3-Next's q|k|v|z grouped per key head: its rows regrouped as the engine's q, k, v, z
            out["win"] = fuse(
                grouped_rows(
                    t["in"],
                    o["n_k_heads"],
                    [o["head_k"], o["head_k"], *[o["head_v"]] * 2],
                    o["n_v_heads"] // o["n_k_heads"],
                )
            )
        else:
            out["win"] = fuse([t["qkv"], t["gate"]])  # the convolved channels, then the output gate z
        if "ba" in t:  # beta|alpha grouped per key head
            out["wba"] = fuse(grouped_rows(t["ba"], o["n_k_heads"], [1, 1], o["n_v_heads"] // o["n_k_heads"]))
        else:
            out["wba"] = fuse([t["beta"], t["alpha"]])
        out["wout"] = _spec(t["out"])
        out["conv"] = _vector(t["conv"])  # (conv_dim, kernel) row-major: each channel's taps, oldest first
        for role, name in (("dt_bias", "dt_bias"), ("a", "a_log"), ("norm_out", "norm_out")):
            out[name] = _vector(t[role])
    else:
        raise ValueError(f"the CPU engine has no {block.kind} block")
    return (block.kind, block.options, out)


def split_heads(t: Tensor, head_dim: int) -> tuple[list[Tensor], list[Tensor]]:
    """A gated attention's Wq (n_heads * 2 head_dim rows: per head its q rows, then its gate's) as views of each
    head's q rows and of its gate rows."""
    n = t.rows // (2 * head_dim)
    q = [
        Tensor(f"{t.name}[q{h}]", t.type, head_dim, t.cols, t.data[2 * h * head_dim : (2 * h + 1) * head_dim])
        for h in range(n)
    ]
    g = [
        Tensor(f"{t.name}[g{h}]", t.type, head_dim, t.cols, t.data[(2 * h + 1) * head_dim : (2 * h + 2) * head_dim])
        for h in range(n)
    ]
    return q, g


def grouped_rows(t: Tensor, groups: int, sizes: list[int], repeats: int) -> list[Tensor]:
    """Views of a matrix whose rows come in `groups` groups, each holding parts of `sizes` rows (the value-sized
    ones `repeats` times over: one per value head of the group), regrouped part by part: every group's part 0, then
    every group's part 1, ... (Qwen3-Next's fused in-projections, grouped per key head)."""
    widths = [s * repeats for s in sizes]
    if len(sizes) == 4:  # q and k: one key head's; v and z: its value heads'
        widths[:2] = sizes[:2]
    stride = sum(widths)
    if stride * groups != t.rows:
        raise ValueError(f"{t.name}: {t.rows} rows are not {groups} groups of {stride}")
    views = []
    for part, width in enumerate(widths):
        first = sum(widths[:part])
        for g in range(groups):
            row = g * stride + first
            views.append(Tensor(f"{t.name}[{g}.{part}]", t.type, width, t.cols, t.data[row : row + width]))
    return views


def experts(t: Tensor, n: int) -> list[Tensor]:
    """The n matrices of a 3-D tensor held stacked by rows (inferd.model.gguf), each a view of its rows."""
    rows = t.rows // n
    return [Tensor(f"{t.name}[{e}]", t.type, rows, t.cols, t.data[e * rows : (e + 1) * rows]) for e in range(n)]
