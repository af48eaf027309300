"""A model's layer plan: per layer its blocks in order (kind, options, tensor names by role), made from the
architecture table and the model's config. Both engines build their weights from it and the loaders check a file's
tensors against it, so that a tensor name or a block option is spelled in one place (inferd.model.arch)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from collections.abc import Mapping

from inferd.model.arch import (
    ARCHITECTURES,
    ATTENTION,
    BLOCK_TENSORS,
    BUILT_KINDS,
    FFN_GATED,
    FFN_MOE,
    MODEL_TENSORS,
    RECURRENT,
)
from inferd.model.model_config import ModelConfig


@dataclass(frozen=True)
class Block:
    """One block of one layer as the engines build it."""

    kind: str  # inferd.model.arch's block kinds
    options: dict[str, Any]  # what the C block reads besides its tensors
    tensors: dict[str, str]  # role -> the GGUF name of this layer's tensor (the roles this model has)
    # role -> (rows = out features, cols = in features); the experts' (n_experts, rows, cols)
    shapes: dict[str, tuple[int, ...]]


def _attention(cfg: ModelConfig, layer: int) -> Block:
    dim, q, kv = cfg.dim, cfg.q_dim, cfg.kv_dim
    shapes: dict[str, tuple[int, ...]] = {
        "norm": (1, dim),
        "q": (2 * q if cfg.attn_output_gate else q, dim),  # gated: each head's q rows, then its gate's
        "k": (kv, dim),
        "v": (kv, dim),
        "o": (dim, q),
    }
    if cfg.qkv_bias:
        shapes.update({"q_bias": (1, q), "k_bias": (1, kv), "v_bias": (1, kv)})
    if cfg.attn_out_bias:
        shapes["o_bias"] = (1, dim)
    if cfg.attn_sinks:
        shapes["sinks"] = (1, cfg.n_heads)
    if cfg.qk_norm:  # per head, or (OLMoE) over the whole of q and of k
        shapes.update(
            {"q_norm": (1, q), "k_norm": (1, kv)}
            if cfg.qk_norm_full
            else {"q_norm": (1, cfg.head_dim), "k_norm": (1, cfg.head_dim)}
        )
    if cfg.sandwich_norms:
        shapes["post_norm"] = (1, dim)
    options = {"rope_neox": int(cfg.rope_neox), "window": cfg.layer_window(layer), "scale": float(cfg.query_scale)}
    if cfg.qk_norm_full:
        options["qk_norm_full"] = 1
    if cfg.attn_output_gate:
        options["gated"] = 1
    return _block(ATTENTION, layer, options, shapes)


def _recurrent(cfg: ModelConfig, layer: int) -> Block:
    dim, conv, value, heads = cfg.dim, cfg.ssm_conv_dim, cfg.ssm_value_dim, cfg.ssm_v_heads
    shapes: dict[str, tuple[int, ...]] = {"norm": (1, dim)}
    if cfg.ssm_fused_in:  # q|k|v|z grouped per key head (Qwen3-Next's older files)
        shapes["in"] = (conv + value, dim)
    else:
        shapes.update({"qkv": (conv, dim), "gate": (value, dim)})
    if cfg.ssm_grouped_heads:  # beta|alpha grouped per key head (Qwen3-Next)
        shapes["ba"] = (2 * heads, dim)
    else:
        shapes.update({"beta": (heads, dim), "alpha": (heads, dim)})
    shapes.update(
        {
            "conv": (conv, cfg.ssm_conv_kernel),
            "dt_bias": (1, heads),
            "a": (1, heads),
            "norm_out": (1, cfg.ssm_head_v),
            "out": (dim, value),
        }
    )
    options = {
        "n_k_heads": cfg.ssm_k_heads,
        "n_v_heads": heads,
        "head_k": cfg.ssm_head_k,
        "head_v": cfg.ssm_head_v,
        "conv_kernel": cfg.ssm_conv_kernel,
        "grouped_heads": int(cfg.ssm_grouped_heads),
    }
    return _block(RECURRENT, layer, options, shapes)


def _ffn_gated(cfg: ModelConfig, layer: int) -> Block:
    dim, hidden = cfg.dim, cfg.hidden_dim
    shapes: dict[str, tuple[int, ...]] = {
        "norm": (1, dim),
        "gate": (hidden, dim),
        "up": (hidden, dim),
        "down": (dim, hidden),
    }
    if cfg.sandwich_norms:
        shapes["post_norm"] = (1, dim)
    return _block(FFN_GATED, layer, {"act": cfg.ffn_act}, shapes, ARCHITECTURES[cfg.arch].ffn_norm_tensor)


def _ffn_moe(cfg: ModelConfig, layer: int) -> Block:
    dim, n, hidden, shared = cfg.dim, cfg.n_experts, cfg.expert_hidden_dim, cfg.shared_expert_hidden_dim
    shapes: dict[str, tuple[int, ...]] = {
        "norm": (1, dim),
        "router": (n, dim),
        "gate_exps": (n, hidden, dim),
        "up_exps": (n, hidden, dim),
        "down_exps": (n, dim, hidden),
    }
    if shared:
        shapes.update(
            {
                "shared_gate": (1, dim),
                "gate_shexp": (shared, dim),
                "up_shexp": (shared, dim),
                "down_shexp": (dim, shared),
            }
        )
    if cfg.expert_bias:
        shapes.update(
            {
                "router_bias": (1, n),
                "gate_exps_bias": (n, hidden),
                "up_exps_bias": (n, hidden),
                "down_exps_bias": (n, dim),
            }
        )
    if cfg.sandwich_norms:
        shapes["post_norm"] = (1, dim)
    options = {
        "act": cfg.ffn_act,
        "n_used": cfg.n_experts_used,
        "norm_topk": int(cfg.expert_norm_topk),
        "weights_scale": float(cfg.expert_weights_scale),
        "gating": cfg.expert_gating,
    }
    return _block(FFN_MOE, layer, options, shapes, ARCHITECTURES[cfg.arch].ffn_norm_tensor)


def _block(
    kind: str, layer: int, options: dict[str, Any], shapes: dict[str, tuple[int, ...]], norm: str | None = None
) -> Block:
    """norm: the input norm's tensor name when the architecture's differs from the kind's (gpt-oss's FFN)"""
    names = {role: f"blk.{layer}.{BLOCK_TENSORS[kind][role]}" for role in shapes}
    if norm is not None:
        names["norm"] = f"blk.{layer}.{norm}"
    return Block(kind, options, names, shapes)


# the block kinds the engines build, each from the config; a kind of arch.py without one is refused at load
BUILDERS = {ATTENTION: _attention, FFN_GATED: _ffn_gated, FFN_MOE: _ffn_moe, RECURRENT: _recurrent}
assert tuple(BUILDERS) == BUILT_KINDS


def layer_blocks(cfg: ModelConfig, layer: int) -> list[Block]:
    """Layer `layer`'s blocks in the order they run: the architecture's mixer, then its FFN (a mixture of experts
    whenever the model has experts: a llama file with them is Mixtral)."""
    row = ARCHITECTURES[cfg.arch]
    mixer = RECURRENT if layer in cfg.recurrent_layers else row.mixer
    kinds = (mixer, FFN_MOE if cfg.is_moe else row.ffn)
    missing = [k for k in kinds if k not in BUILDERS]
    if missing:
        raise ValueError(f"{cfg.arch} layers need {' and '.join(missing)} blocks, which are not built yet")
    return [BUILDERS[k](cfg, layer) for k in kinds]


def layer_plan(cfg: ModelConfig) -> list[list[Block]]:
    return [layer_blocks(cfg, i) for i in range(cfg.n_layers)]


def model_tensor_shapes(cfg: ModelConfig) -> dict[str, tuple[int, int]]:
    """The tensors outside the layers, GGUF-named: the embedding, the final norm, the output (unless tied)."""
    shapes = {MODEL_TENSORS["embedding"]: (cfg.vocab_size, cfg.dim), MODEL_TENSORS["output_norm"]: (1, cfg.dim)}
    if not cfg.tie_embeddings:
        shapes[MODEL_TENSORS["output"]] = (cfg.vocab_size, cfg.dim)
    return shapes


def expected_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor the engine needs, GGUF-named, as (rows = out features, cols = in features), the experts'
    as (n_experts, rows, cols)."""
    shapes: dict[str, tuple[int, ...]] = dict(model_tensor_shapes(cfg))
    for blocks in layer_plan(cfg):
        for block in blocks:
            shapes.update({block.tensors[role]: shape for role, shape in block.shapes.items()})
    return shapes


def check_tensors(cfg: ModelConfig, shapes: Mapping[str, tuple[int, ...]]) -> None:
    """Raise ValueError naming any missing, unexpected or mis-shaped tensor (shapes: name -> (rows, cols), or
    (n_experts, rows, cols) for a 3-D one).

    Unknown tensors are refused rather than ignored: a weight the engine would skip means a different model.
    """
    expected = expected_shapes(cfg)
    missing = [n for n in expected if n not in shapes]
    if missing:
        more = f" (and {len(missing) - 3} more)" if len(missing) > 3 else ""
        raise ValueError(f"missing tensor{'s' if len(missing) > 1 else ''} {', '.join(missing[:3])}{more}")
    extra = [n for n in shapes if n not in expected]
    if extra:
        raise ValueError(
            f"unexpected tensor {extra[0]} (not part of a {cfg.arch} model with this config; "
            f"{len(extra)} unexpected in all)"
        )
    for name, want in expected.items():
        if tuple(shapes[name]) != want:
            raise ValueError(f"tensor {name} has shape (rows, cols) {tuple(shapes[name])}, the config implies {want}")
