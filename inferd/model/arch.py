"""The architecture table: per architecture (GGUF's general.architecture) the blocks its layers are made of with
their options, the names of their tensors, and the metadata keys its files carry. The loaders read a model's
config through it (inferd.model.model_config), and both engines build their weights from the layer plan made of
it (inferd.model.layers). docs/design/architectures.md says how to add a row or a block kind.

A layer is a short list of blocks run in order, each adding its output to the residual stream: the token mixer
(attention), then the FFN (dense gated, or a mixture of experts). A block kind names the C block that runs it
(ext/cpu/inferd.h's block_kind_t); the kinds without a builder yet have their names here so that a row can say what
it needs."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

# block kinds
ATTENTION = "attention"  # causal self-attention over the KV cache, with the row's options
FFN_GATED = "ffn_gated"  # down(act(gate x) * up x), dense
FFN_MOE = "ffn_moe"  # a router choosing k of n gated experts per token (and a shared expert beside them)
RECURRENT = "recurrent"  # a mixer with a recurrent state per sequence: Gated DeltaNet
BUILT_KINDS = (ATTENTION, FFN_GATED, FFN_MOE, RECURRENT)

# Each block kind's tensors: role -> GGUF name inside layer i (after "blk.{i}."). Optional roles are present when
# the model's options turn them on (ModelConfig.qkv_bias, qk_norm, sandwich_norms).
BLOCK_TENSORS: dict[str, dict[str, str]] = {
    ATTENTION: {
        "norm": "attn_norm.weight",
        "q": "attn_q.weight",
        "k": "attn_k.weight",
        "v": "attn_v.weight",
        "o": "attn_output.weight",
        "q_bias": "attn_q.bias",
        "k_bias": "attn_k.bias",
        "v_bias": "attn_v.bias",
        "q_norm": "attn_q_norm.weight",
        "k_norm": "attn_k_norm.weight",
        "post_norm": "post_attention_norm.weight",
        "o_bias": "attn_output.bias",
        "sinks": "attn_sinks.weight",  # gpt-oss: a logit per head in its softmax's denominator
    },
    FFN_GATED: {
        "norm": "ffn_norm.weight",
        "gate": "ffn_gate.weight",
        "up": "ffn_up.weight",
        "down": "ffn_down.weight",
        "post_norm": "post_ffw_norm.weight",
    },
    # the experts' matrices are 3-D in the file, (n_experts, rows, cols); shared_* is Qwen2-MoE's shared expert,
    # shared_gate its sigmoid gate (one row of dim)
    FFN_MOE: {
        "norm": "ffn_norm.weight",
        "router": "ffn_gate_inp.weight",
        "gate_exps": "ffn_gate_exps.weight",
        "up_exps": "ffn_up_exps.weight",
        "down_exps": "ffn_down_exps.weight",
        "shared_gate": "ffn_gate_inp_shexp.weight",
        "gate_shexp": "ffn_gate_shexp.weight",
        "up_shexp": "ffn_up_shexp.weight",
        "down_shexp": "ffn_down_shexp.weight",
        # gpt-oss's biases: the router's (n_experts), the experts' (n_experts, rows)
        "router_bias": "ffn_gate_inp.bias",
        "gate_exps_bias": "ffn_gate_exps.bias",
        "up_exps_bias": "ffn_up_exps.bias",
        "down_exps_bias": "ffn_down_exps.bias",
    },
    # Gated DeltaNet (Qwen3.5, Qwen3-Next): qkv are the convolved q|k|v channels, gate the output gate z, beta and
    # alpha the update's and the decay's logits per value head, conv the causal convolution's taps (conv_dim rows of
    # kernel), dt_bias and a the decay's bias and rate, norm_out the gated RMSNorm's weights, out the projection
    RECURRENT: {
        "norm": "attn_norm.weight",
        "qkv": "attn_qkv.weight",
        "gate": "attn_gate.weight",
        "beta": "ssm_beta.weight",
        "alpha": "ssm_alpha.weight",
        "conv": "ssm_conv1d.weight",
        "dt_bias": "ssm_dt.bias",
        "a": "ssm_a",
        "norm_out": "ssm_norm.weight",
        "out": "ssm_out.weight",
        # Qwen3-Next's files: beta|alpha as one matrix, grouped per key head ([beta, alpha] of the group's value
        # heads in turn), and in older ones q|k|v|z as one (ssm_in), grouped per key head the same way
        "ba": "ssm_ba.weight",
        "in": "ssm_in.weight",
    },
}
# the model's own tensors, outside the layers: role -> GGUF name ("output" is absent when tied to the embedding)
MODEL_TENSORS = {"embedding": "token_embd.weight", "output_norm": "output_norm.weight", "output": "output.weight"}
# The same in a Hugging Face checkpoint of the rows that have one (llama-family names: layer i's tensors after
# "model.layers.{i}."); its post_attention_layernorm is the FFN's input norm.
HF_BLOCK_TENSORS: dict[str, dict[str, str]] = {
    ATTENTION: {
        "norm": "input_layernorm.weight",
        "q": "self_attn.q_proj.weight",
        "k": "self_attn.k_proj.weight",
        "v": "self_attn.v_proj.weight",
        "o": "self_attn.o_proj.weight",
        "q_bias": "self_attn.q_proj.bias",
        "k_bias": "self_attn.k_proj.bias",
        "v_bias": "self_attn.v_proj.bias",
        "q_norm": "self_attn.q_norm.weight",
        "k_norm": "self_attn.k_norm.weight",
    },
    FFN_GATED: {
        "norm": "post_attention_layernorm.weight",
        "gate": "mlp.gate_proj.weight",
        "up": "mlp.up_proj.weight",
        "down": "mlp.down_proj.weight",
    },
}
HF_MODEL_TENSORS = {
    "embedding": "model.embed_tokens.weight",
    "output_norm": "model.norm.weight",
    "output": "lm_head.weight",
}

# GGUF metadata every architecture has, under "{arch}.": what it means -> key
GGUF_KEYS = {
    "vocab_size": "vocab_size",
    "dim": "embedding_length",
    "n_layers": "block_count",
    "n_heads": "attention.head_count",
    "n_kv_heads": "attention.head_count_kv",
    "head_dim": "attention.key_length",
    "value_dim": "attention.value_length",
    "rope_dims": "rope.dimension_count",
    "hidden_dim": "feed_forward_length",
    "context_length": "context_length",
    "norm_eps": "attention.layer_norm_rms_epsilon",
    "rope_theta": "rope.freq_base",
    "rope_scaling_type": "rope.scaling.type",
    "rope_scaling_factor": "rope.scaling.factor",
    "rope_scale_linear": "rope.scale_linear",
    "rope_original_context": "rope.scaling.original_context_length",
    # mixtures of experts (absent in dense files)
    "n_experts": "expert_count",
    "n_experts_used": "expert_used_count",
    "expert_hidden_dim": "expert_feed_forward_length",
    "shared_expert_hidden_dim": "expert_shared_feed_forward_length",
    "expert_weights_scale": "expert_weights_scale",
    # YaRN rope scaling (rope_scaling_type "yarn")
    "yarn_ext_factor": "rope.scaling.yarn_ext_factor",
    "yarn_beta_fast": "rope.scaling.yarn_beta_fast",
    "yarn_beta_slow": "rope.scaling.yarn_beta_slow",
    "yarn_log_multiplier": "rope.scaling.yarn_log_multiplier",
    "rope_attn_factor": "rope.scaling.attn_factor",
}

# reads a metadata key of the file: key(name, default) (a missing key without a default raises ValueError)
MetadataReader = Callable[..., Any]


@dataclass(frozen=True)
class Architecture:
    """One row: what a GGUF general.architecture (or a Hugging Face class) means to the loaders and engines."""

    name: str
    hf_class: str | None = None  # config.json's `architectures` entry read as this architecture
    mixer: str = ATTENTION  # the block kind of a layer's token mixer
    ffn: str = FFN_GATED  # the block kind of its feed-forward part
    qkv_bias: bool = False  # attn_q/k/v.bias in every layer (a file of another row may still carry them)
    qk_norm: bool = False  # RMSNorm of every q and k head before RoPE
    qk_norm_full: bool = False  # the QK-norm is over all of q and all of k (every head together: OLMoE)
    sandwich_norms: bool = False  # RMSNorm of the mixer's and the FFN's outputs before the residual add
    ffn_act: str = "silu"  # the gate's activation: silu (SwiGLU), gelu_tanh (GeGLU), swiglu_oai (gpt-oss's clamped)
    # llama.cpp's converter permutes llama-family Wq/Wk so that RoPE pairs are adjacent (2i, 2i+1); the others
    # keep Hugging Face's rotate-half pairs (i, i + head_dim/2), as every HF checkpoint does
    gguf_rope_neox: bool = True
    hf_sliding_window: bool = False  # config.json's sliding_window applies unless use_sliding_window says not
    # mixtures of experts, as llama.cpp runs each: the top-k router weights renormalized to sum to 1 (Qwen3-MoE,
    # Mixtral: its softmax over the k chosen logits is the same weights), and a shared expert beside the routed
    # ones with a sigmoid gate of its own (Qwen2-MoE). A row whose ffn is FFN_GATED runs as a mixture when its file
    # has experts (llama with ffn_gate_inp: Mixtral).
    moe_norm_topk: bool = False
    shared_expert: bool = False
    # a hybrid of Gated DeltaNet and gated attention (Qwen3.5): the attention's Wq holds each head's q then its output
    # gate, RoPE may cover part of a head (its FFN's input norm is post_attention_norm: ffn_norm_tensor)
    hybrid_gdn: bool = False
    # Qwen3-Next's Gated DeltaNet: value head h reads key head h // (n_v_heads / n_k_heads) (Qwen3.5's files order
    # the value heads so that it reads h % n_k_heads), and its beta|alpha rows come fused, grouped per key head
    gdn_grouped_heads: bool = False
    # gpt-oss: the router's top k on its logits, then the softmax over those k alone ("topk_softmax"; "softmax": over
    # all experts first); biases on the router and on every expert's gate, up and down rows; attention sinks; Wo's
    # bias; and the FFN's input norm under the name llama.cpp gives it there
    moe_gating: str = "softmax"
    expert_bias: bool = False
    attn_sinks: bool = False
    attn_out_bias: bool = False
    ffn_norm_tensor: str = "ffn_norm.weight"
    # the row's own metadata (sliding windows, scales): ModelConfig fields read from the file by this function
    gguf_options: Callable[[MetadataReader, int, int, int, int], dict[str, Any]] | None = field(
        default=None, compare=False
    )


# Gemma 3 as llama.cpp reads it: every 6th layer global, the others a sliding window with a RoPE base of 10000
GEMMA3_SWA_PATTERN = 6
GEMMA3_LOCAL_ROPE_BASE = 10000.0


def sliding_layers(key: MetadataReader, arch: str, n_layers: int, default_pattern: int) -> tuple[int, ...]:
    """The sliding-window layers as llama.cpp reads {arch}.attention.sliding_window_pattern: one flag per layer
    (true = sliding window), or every n-th layer global and the others local (n = 0: all local), n defaulting to the
    architecture's."""
    pattern = key(f"{arch}.attention.sliding_window_pattern", default_pattern)
    if isinstance(pattern, list):
        if len(pattern) != n_layers:
            raise ValueError(
                f"{arch}.attention.sliding_window_pattern has {len(pattern)} entries for {n_layers} layers"
            )
        return tuple(i for i, is_local in enumerate(pattern) if is_local)
    n = int(pattern)
    return tuple(i for i in range(n_layers) if n == 0 or i % n < n - 1)


def gemma3_options(key: MetadataReader, n_layers: int, dim: int, n_heads: int, head_dim: int) -> dict[str, Any]:
    """Gemma 3's options from its GGUF metadata, read as llama.cpp reads them.

    The converter stores the norms' weights as 1 + w (Gemma's RMSNorm scales by 1 + w), so they are used as stored.
    The file has no query_pre_attn_scalar: it is head_dim for every size but the 27B (62 layers), whose is
    dim / n_heads, as in Google's reference config and llama.cpp."""
    window = int(key("gemma3.attention.sliding_window", 0) or 0)
    local = sliding_layers(key, "gemma3", n_layers, GEMMA3_SWA_PATTERN) if window > 0 else ()
    query_pre_attn_scalar = dim // n_heads if n_layers == 62 else head_dim
    return {
        "embed_scale": math.sqrt(dim),
        "attn_scale": query_pre_attn_scalar**-0.5,
        "logit_softcap": float(key("gemma3.final_logit_softcapping", 0.0) or 0.0),
        "sliding_window": window,
        "local_layers": local,
        "rope_theta_local": float(key("gemma3.rope.freq_base_swa", GEMMA3_LOCAL_ROPE_BASE)),
    }


def qwen35_options(key: MetadataReader, n_layers: int, dim: int, n_heads: int, head_dim: int) -> dict[str, Any]:
    """Qwen3.5's Gated DeltaNet metadata, read as llama.cpp reads it: the recurrent layers are listed per layer
    (attention.recurrent_layers) or every layer but each full_attention_interval-th (default 4). n_layers counts the
    trunk only (ModelConfig.from_gguf leaves out the multi-token prediction layers, which are not run)."""
    arch, n_trunk = key("general.architecture"), n_layers
    flags = key(f"{arch}.attention.recurrent_layers", None)
    if isinstance(flags, list):
        if len(flags) < n_trunk:
            raise ValueError(f"{arch}.attention.recurrent_layers has {len(flags)} entries for {n_trunk} layers")
        recurrent = tuple(i for i in range(n_trunk) if flags[i])
    else:
        interval = int(key(f"{arch}.full_attention_interval", 4))
        if interval < 1:
            raise ValueError(f"{arch}.full_attention_interval must be positive, got {interval}")
        recurrent = tuple(i for i in range(n_trunk) if (i + 1) % interval)
    v_heads = int(key(f"{arch}.ssm.time_step_rank"))
    inner = int(key(f"{arch}.ssm.inner_size"))
    if v_heads <= 0 or inner % v_heads:
        raise ValueError(f"{arch}.ssm.inner_size {inner} is not a multiple of ssm.time_step_rank {v_heads}")
    return {
        "recurrent_layers": recurrent,
        "ssm_conv_kernel": int(key(f"{arch}.ssm.conv_kernel")),
        "ssm_head_k": int(key(f"{arch}.ssm.state_size")),
        "ssm_head_v": inner // v_heads,
        "ssm_k_heads": int(key(f"{arch}.ssm.group_count")),
        "ssm_v_heads": v_heads,
    }


# gpt-oss as llama.cpp reads it: every other layer (the even ones) a sliding window, RoPE's base the same in both
GPT_OSS_SWA_PATTERN = 2


def gpt_oss_options(key: MetadataReader, n_layers: int, dim: int, n_heads: int, head_dim: int) -> dict[str, Any]:
    """gpt-oss's sliding window and its layers; q.k scaled by 1/sqrt(head_dim) as everywhere."""
    window = int(key("gpt-oss.attention.sliding_window", 0) or 0)
    local = sliding_layers(key, "gpt-oss", n_layers, GPT_OSS_SWA_PATTERN) if window > 0 else ()
    return {"sliding_window": window, "local_layers": local}


ARCHITECTURES: dict[str, Architecture] = {
    row.name: row
    for row in (
        Architecture("llama", "LlamaForCausalLM", gguf_rope_neox=False, moe_norm_topk=True),
        Architecture("mistral", "MistralForCausalLM", gguf_rope_neox=False, hf_sliding_window=True),
        Architecture("qwen2", "Qwen2ForCausalLM", qkv_bias=True),
        Architecture("qwen3", "Qwen3ForCausalLM", qk_norm=True),
        Architecture("gemma3", qk_norm=True, sandwich_norms=True, ffn_act="gelu_tanh", gguf_options=gemma3_options),
        Architecture("qwen2moe", qkv_bias=True, ffn=FFN_MOE, shared_expert=True),
        Architecture("qwen3moe", qk_norm=True, ffn=FFN_MOE, moe_norm_topk=True),
        Architecture("olmoe", qk_norm=True, qk_norm_full=True, ffn=FFN_MOE),
        Architecture(
            "qwen35",
            qk_norm=True,
            hybrid_gdn=True,
            gguf_options=qwen35_options,
            ffn_norm_tensor="post_attention_norm.weight",
        ),
        Architecture(
            "qwen3next",
            qk_norm=True,
            hybrid_gdn=True,
            gdn_grouped_heads=True,
            ffn=FFN_MOE,
            moe_norm_topk=True,
            shared_expert=True,
            gguf_options=qwen35_options,
            ffn_norm_tensor="post_attention_norm.weight",
        ),
        Architecture(
            "qwen35moe",
            qk_norm=True,
            hybrid_gdn=True,
            ffn=FFN_MOE,
            moe_norm_topk=True,
            shared_expert=True,
            gguf_options=qwen35_options,
            ffn_norm_tensor="post_attention_norm.weight",
        ),
        Architecture(
            "gpt-oss",
            qkv_bias=True,
            ffn=FFN_MOE,
            ffn_act="swiglu_oai",
            moe_gating="topk_softmax",
            expert_bias=True,
            attn_sinks=True,
            attn_out_bias=True,
            ffn_norm_tensor="post_attention_norm.weight",
            gguf_options=gpt_oss_options,
        ),
    )
}
ARCHS = tuple(ARCHITECTURES)
HF_ARCHS = {row.hf_class: row.name for row in ARCHITECTURES.values() if row.hf_class}
