"""ModelConfig: the numbers that define one model, read from GGUF metadata or HF config.json through the
architecture table (inferd.model.arch): the row gives what the architecture always is (QK-norm, sandwich norms,
GeGLU, ...), the file the sizes and the options it may set (sliding windows, scales, RoPE scaling).

Everything the engine sizes its buffers from lives here, and is checked here, so that a model the engine cannot
run is refused at load time with a sentence instead of failing (or silently computing garbage) later.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any
from collections.abc import Collection, Mapping

import numpy as np

from inferd.model.arch import ARCHITECTURES, ARCHS, FFN_MOE, GGUF_KEYS, HF_ARCHS
from inferd.model.rope_scaling import check_llama3, hf_rope_scaling, llama3_from_factors

HEAD_DIMS = (64, 128, 256)  # multiples of the attention kernel's 64-wide tiles that models use
FFN_ACTS = ("silu", "gelu_tanh", "swiglu_oai")
MOE_GATINGS = ("softmax", "topk_softmax")
YARN_KEYS = ("factor", "original_context", "ext_factor", "attn_factor", "beta_fast", "beta_slow")
# Weight rows are split into 32-value blocks (Q8_0/Q4_0/Q4_1), so every matmul input width must be a multiple.
DIM_MULTIPLE = 32
# experts per layer and experts per token the CPU engine's router holds (ext/cpu/inferd.h MOE_MAX_*)
MAX_EXPERTS = 256
MAX_EXPERTS_USED = 32


@dataclass(frozen=True)
class ModelConfig:
    arch: str
    vocab_size: int
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    hidden_dim: int
    rope_theta: float
    rope_scaling: dict | None
    rope_neox: bool
    norm_eps: float
    tie_embeddings: bool
    qkv_bias: bool
    context_length: int
    qk_norm: bool = False  # RMSNorm of every q and k head before RoPE (attn_q_norm / attn_k_norm)
    sandwich_norms: bool = False  # RMSNorm of the attention and FFN outputs before the residual add
    ffn_act: str = "silu"  # the gate's activation: silu (SwiGLU), gelu_tanh (GeGLU), swiglu_oai (gpt-oss)
    embed_scale: float = 1.0  # the embeddings are multiplied by it (Gemma: sqrt(dim))
    attn_scale: float | None = None  # of q.k; None: 1/sqrt(head_dim)
    logit_softcap: float = 0.0  # logits = cap * tanh(logits / cap); 0: none
    sliding_window: int = 0  # keys a local layer's query sees, itself included
    local_layers: tuple[int, ...] = ()  # the layers that use the sliding window
    rope_theta_local: float | None = None  # RoPE base of the local layers (None: rope_theta)
    rope_linear_factor: float = 1.0  # linear RoPE scaling of the global layers: positions / factor
    qk_norm_full: bool = False  # the QK-norm is over all of q and all of k rather than per head (OLMoE)
    # a mixture of experts (n_experts > 0): each token's FFN is the weighted sum of the n_experts_used experts its
    # router scores highest (each a gated FFN of expert_hidden_dim), plus a shared expert of shared_expert_hidden_dim
    # with a sigmoid gate when that is > 0
    n_experts: int = 0
    n_experts_used: int = 0
    expert_hidden_dim: int = 0
    shared_expert_hidden_dim: int = 0
    expert_norm_topk: bool = False  # the k router weights renormalized to sum to 1
    expert_weights_scale: float = 1.0  # the router weights times this
    # Qwen3.5's hybrid: the layers whose mixer is Gated DeltaNet (recurrent_layers; the others are attention with an
    # output gate, attn_output_gate), its convolution's kernel, its key and value heads and their sizes
    rope_dims: int = 0  # RoPE on each head's first rope_dims values, the rest passed through; 0: all of head_dim
    attn_output_gate: bool = False  # attention * sigmoid(gate) before Wo, the gate's rows beside q's in Wq
    recurrent_layers: tuple[int, ...] = ()
    ssm_conv_kernel: int = 0
    ssm_head_k: int = 0
    ssm_head_v: int = 0
    ssm_k_heads: int = 0
    ssm_v_heads: int = 0
    ssm_grouped_heads: bool = False  # Qwen3-Next: value head h reads key head h // (v_heads / k_heads); ssm_ba fused
    ssm_fused_in: bool = False  # Qwen3-Next's older files: q|k|v|z as one matrix (ssm_in), grouped per key head
    expert_gating: str = "softmax"  # softmax over all experts, or (topk_softmax) over the k chosen by their logits
    expert_bias: bool = False  # biases on the router's logits and on each expert's gate, up and down rows (gpt-oss)
    attn_sinks: bool = False  # a learned logit per head in each softmax's denominator (gpt-oss)
    attn_out_bias: bool = False  # Wo's bias (gpt-oss)
    # YaRN rope scaling of every layer, as llama.cpp runs it: factor, original_context, ext_factor, attn_factor,
    # beta_fast, beta_slow; None: none
    yarn: dict | None = None

    def __post_init__(self) -> None:
        if self.arch not in ARCHS:
            raise ValueError(f"unsupported architecture {self.arch!r} (supported: {', '.join(ARCHS)})")
        for name in (
            "vocab_size",
            "dim",
            "n_layers",
            "n_heads",
            "n_kv_heads",
            "head_dim",
            "hidden_dim",
            "context_length",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.head_dim not in HEAD_DIMS:
            raise ValueError(f"head_dim {self.head_dim} is not supported (supported: {HEAD_DIMS})")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads {self.n_heads} is not a multiple of n_kv_heads {self.n_kv_heads}")
        for name in ("dim", "hidden_dim"):
            if getattr(self, name) % DIM_MULTIPLE:
                raise ValueError(f"{name} {getattr(self, name)} is not a multiple of {DIM_MULTIPLE}")
        for name in ("rope_theta", "norm_eps"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise ValueError(f"{name} must be a positive number, got {value!r}")
        if self.rope_scaling is not None:
            check_llama3(self.rope_scaling)
        if self.ffn_act not in FFN_ACTS:
            raise ValueError(f"ffn_act must be one of {FFN_ACTS}, got {self.ffn_act!r}")
        for name in ("embed_scale", "rope_linear_factor"):
            value = getattr(self, name)
            if not math.isfinite(value) or value <= 0:
                raise ValueError(f"{name} must be a positive number, got {value!r}")
        for name in ("attn_scale", "rope_theta_local"):
            value = getattr(self, name)
            if value is not None and (not math.isfinite(value) or value <= 0):
                raise ValueError(f"{name} must be a positive number or None, got {value!r}")
        if not math.isfinite(self.logit_softcap) or self.logit_softcap < 0:
            raise ValueError(f"logit_softcap must be 0 (none) or positive, got {self.logit_softcap!r}")
        if self.sliding_window < 0:
            raise ValueError(f"sliding_window must be 0 (none) or positive, got {self.sliding_window}")
        if self.local_layers and self.sliding_window == 0:
            raise ValueError("local (sliding-window) layers need a sliding_window")
        self._check_experts()
        self._check_recurrent()
        self._check_yarn()
        if any(not 0 <= i < self.n_layers for i in self.local_layers) or list(self.local_layers) != sorted(
            set(self.local_layers)
        ):
            raise ValueError(f"local_layers must be distinct ascending layer indices, got {self.local_layers}")

    def _check_experts(self) -> None:
        if self.n_experts == 0:
            if self.n_experts_used or self.shared_expert_hidden_dim:
                raise ValueError("experts used or a shared expert without experts (expert_count 0)")
            return
        if not 1 <= self.n_experts <= MAX_EXPERTS:
            raise ValueError(f"expert_count {self.n_experts} is not supported (1 to {MAX_EXPERTS})")
        if not 1 <= self.n_experts_used <= min(self.n_experts, MAX_EXPERTS_USED):
            raise ValueError(
                f"expert_used_count {self.n_experts_used} must be 1 to {min(self.n_experts, MAX_EXPERTS_USED)} "
                f"for {self.n_experts} experts"
            )
        for name in ("expert_hidden_dim", "shared_expert_hidden_dim"):
            value = getattr(self, name)
            if value < 0 or value % DIM_MULTIPLE or (name == "expert_hidden_dim" and value == 0):
                raise ValueError(f"{name} {value} is not a positive multiple of {DIM_MULTIPLE}")
        if not math.isfinite(self.expert_weights_scale) or self.expert_weights_scale <= 0:
            raise ValueError(f"expert_weights_scale must be a positive number, got {self.expert_weights_scale!r}")
        if self.expert_gating not in MOE_GATINGS:
            raise ValueError(f"expert_gating must be one of {MOE_GATINGS}, got {self.expert_gating!r}")

    def _check_yarn(self) -> None:
        if self.yarn is None:
            return
        missing = [k for k in YARN_KEYS if k not in self.yarn]
        if missing:
            raise ValueError(f"YaRN rope scaling lacks {', '.join(missing)}")
        y = self.yarn
        if not (y["factor"] > 1 and y["original_context"] > 0 and y["beta_fast"] > 0 and y["beta_slow"] > 0):
            raise ValueError(f"YaRN rope scaling values are inconsistent: {dict(y)}")
        if self.rope_scaling is not None or self.rope_linear_factor != 1.0:
            raise ValueError("YaRN rope scaling with another rope scaling")

    def _check_recurrent(self) -> None:
        if self.rope_dims < 0 or self.rope_dims % 2 or self.rope_dims > self.head_dim:
            raise ValueError(f"rope dimension count {self.rope_dims} must be even and at most head_dim {self.head_dim}")
        if not self.recurrent_layers:
            return
        if any(not 0 <= i < self.n_layers for i in self.recurrent_layers) or list(self.recurrent_layers) != sorted(
            set(self.recurrent_layers)
        ):
            raise ValueError(f"recurrent_layers must be distinct ascending layer indices, got {self.recurrent_layers}")
        for name in ("ssm_head_k", "ssm_head_v"):
            value = getattr(self, name)
            if value <= 0 or value % DIM_MULTIPLE or value > 512:
                raise ValueError(f"Gated DeltaNet {name} {value} must be a multiple of {DIM_MULTIPLE} up to 512")
        if self.ssm_head_k != self.ssm_head_v:
            raise ValueError(
                f"Gated DeltaNet key and value heads of different sizes ({self.ssm_head_k}, "
                f"{self.ssm_head_v}) are not supported"
            )
        if self.ssm_k_heads <= 0 or self.ssm_v_heads <= 0 or self.ssm_v_heads % self.ssm_k_heads:
            raise ValueError(
                f"Gated DeltaNet value heads {self.ssm_v_heads} must be a multiple of key heads {self.ssm_k_heads}"
            )
        if not 1 <= self.ssm_conv_kernel <= 9:
            raise ValueError(f"Gated DeltaNet convolution kernel {self.ssm_conv_kernel} is not supported (1 to 9)")

    @property
    def is_recurrent(self) -> bool:
        """Some layers keep a recurrent state per sequence rather than KV for every position."""
        return bool(self.recurrent_layers)

    @property
    def ssm_conv_dim(self) -> int:
        return 2 * self.ssm_k_heads * self.ssm_head_k + self.ssm_v_heads * self.ssm_head_v

    @property
    def ssm_value_dim(self) -> int:
        return self.ssm_v_heads * self.ssm_head_v

    @property
    def state_floats(self) -> int:
        """Floats of one sequence's recurrent state: per recurrent layer, the convolution's last inputs and one
        key x value matrix per value head."""
        per_layer = (
            self.ssm_conv_kernel - 1
        ) * self.ssm_conv_dim + self.ssm_v_heads * self.ssm_head_v * self.ssm_head_k
        return len(self.recurrent_layers) * per_layer

    @property
    def is_moe(self) -> bool:
        return self.n_experts > 0

    def layer_window(self, i: int) -> int:
        """Layer i's sliding window (keys per query, itself included), or 0 for a global layer."""
        return self.sliding_window if i in self.local_layers else 0

    def switches(self) -> list[str]:
        """The Qwen3/Gemma 3 switches this model turns on, named for a message (empty for llama/mistral/qwen2)."""
        on = [
            ("QK-norm", self.qk_norm),
            ("sandwich norms", self.sandwich_norms),
            ("GeGLU", self.ffn_act != "silu"),
            ("an embedding scale", self.embed_scale != 1.0),
            ("its own attention scale", self.attn_scale is not None),
            ("logit soft-capping", self.logit_softcap > 0),
            ("sliding-window layers", bool(self.local_layers)),
            ("linear RoPE scaling", self.rope_linear_factor != 1.0),
            ("experts", self.is_moe),
            ("recurrent layers", self.is_recurrent),
            ("an attention output gate", self.attn_output_gate),
            ("partial RoPE", 0 < self.rope_dims < self.head_dim),
            ("attention sinks", self.attn_sinks),
            ("YaRN rope scaling", self.yarn is not None),
            ("the clamped SwiGLU", self.ffn_act == "swiglu_oai"),
        ]
        return [name for name, is_on in on if is_on]

    @property
    def query_scale(self) -> float:
        return self.attn_scale if self.attn_scale is not None else 1.0 / math.sqrt(self.head_dim)

    @classmethod
    def from_hf(cls, cfg: Mapping[str, Any]) -> ModelConfig:
        """From a Hugging Face config.json dict (Llama/Mistral/Qwen2/Qwen3ForCausalLM)."""
        archs = cfg.get("architectures") or []
        known = [HF_ARCHS[a] for a in archs if a in HF_ARCHS]
        if not known:
            raise ValueError(f"unsupported architectures {archs!r} (supported: {', '.join(HF_ARCHS)})")
        arch = known[0]
        row = ARCHITECTURES[arch]
        if cfg.get("quantization_config"):
            method = cfg["quantization_config"].get("quant_method", "?")
            raise ValueError(f"pre-quantized checkpoints ({method}) are not supported; use the float weights")
        if cfg.get("hidden_act", "silu") != "silu":
            raise ValueError(f"hidden_act {cfg['hidden_act']!r} is not supported (only silu)")
        if not row.qkv_bias and (cfg.get("attention_bias") or cfg.get("mlp_bias")):
            raise ValueError("attention_bias/mlp_bias are not supported for llama/mistral")
        dim = _int(cfg, "hidden_size")
        n_heads = _int(cfg, "num_attention_heads")
        head_dim = cfg.get("head_dim")
        if head_dim is None:
            if dim % n_heads:
                raise ValueError(f"hidden_size {dim} is not divisible by num_attention_heads {n_heads}")
            head_dim = dim // n_heads
        rope_params = cfg.get("rope_parameters") or {}  # transformers >= 5 moves rope settings here
        rope_theta = cfg.get("rope_theta", rope_params.get("rope_theta", 10000.0))
        scaling = cfg.get("rope_scaling") or (
            rope_params if rope_params.get("rope_type") not in (None, "default") else None
        )
        context = _int(cfg, "max_position_embeddings")
        window = cfg.get("sliding_window")
        use_window = cfg.get("use_sliding_window", row.hf_sliding_window)  # Qwen2 ships a window it does not use
        if use_window and isinstance(window, int) and 0 < window < context:
            # Full attention equals sliding-window attention up to the window, so capping the context keeps
            # results exact instead of silently attending further than the model was trained to.
            context = window
        return cls(
            arch=arch,
            vocab_size=_int(cfg, "vocab_size"),
            dim=dim,
            n_layers=_int(cfg, "num_hidden_layers"),
            n_heads=n_heads,
            n_kv_heads=int(cfg.get("num_key_value_heads") or n_heads),
            head_dim=int(head_dim),
            hidden_dim=_int(cfg, "intermediate_size"),
            rope_theta=float(rope_theta),
            rope_scaling=hf_rope_scaling(scaling),
            rope_neox=True,  # HF checkpoints keep q/k unpermuted: rotate-half pairs (i, i + head_dim/2)
            norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            qkv_bias=row.qkv_bias,
            context_length=context,
            qk_norm=row.qk_norm,
            sandwich_norms=row.sandwich_norms,
            ffn_act=row.ffn_act,
        )

    @classmethod
    def from_gguf(
        cls, fields: Mapping[str, Any], tensor_names: Collection[str] = (), rope_freqs: np.ndarray | None = None
    ) -> ModelConfig:
        """From GGUF metadata (decoded values, or GGUFReader fields) plus the names of the file's tensors.

        rope_freqs: the values of `rope_freqs.weight` when the file has it (llama.cpp stores llama3 rope
        scaling as that precomputed tensor rather than as metadata); turned back into the llama3 parameters.
        """
        arch = _meta(fields, "general.architecture")
        if arch not in ARCHS:
            raise ValueError(f"unsupported architecture {arch!r} (supported: {', '.join(ARCHS)})")
        row = ARCHITECTURES[arch]

        def key(name: str, default: Any = KeyError) -> Any:
            value = _meta(fields, f"{arch}.{GGUF_KEYS[name]}", default)
            if isinstance(value, list):
                raise ValueError(f"{arch}.{GGUF_KEYS[name]} varies per layer, which is not supported")
            return value

        dim = int(key("dim"))
        n_heads = int(key("n_heads"))
        head_dim = int(key("head_dim", dim // n_heads if n_heads else 0))
        if int(key("value_dim", head_dim)) != head_dim:
            raise ValueError("attention.value_length differs from key_length, which is not supported")
        rope_dims = int(key("rope_dims", head_dim))
        if rope_dims != head_dim and not row.hybrid_gdn:
            raise ValueError(
                f"partial rotary embeddings (rope.dimension_count {key('rope_dims')} "
                f"< head_dim {head_dim}) are not supported"
            )
        scaling_type = key("rope_scaling_type", "none")
        # a factor without a type is linear, as llama.cpp reads it (older files wrote only rope.scale_linear)
        linear = float(key("rope_scaling_factor", key("rope_scale_linear", 1.0)) or 1.0)
        yarn = None
        if scaling_type == "yarn":
            yarn = _gguf_yarn(key, linear)
            linear = 1.0
        elif scaling_type not in ("none", "", "linear"):
            raise ValueError(
                f"rope scaling type {scaling_type!r} is not supported (only linear, yarn, and llama3 via rope_freqs)"
            )
        vocab = key("vocab_size", None)
        if vocab is None:
            vocab = len(_meta(fields, "tokenizer.ggml.tokens", []))
        theta = float(key("rope_theta", 10000.0))
        names = set(tensor_names)
        scaling = None
        if rope_freqs is not None:
            scaling = llama3_from_factors(
                np.asarray(rope_freqs, dtype=np.float64).ravel(),
                head_dim,
                theta,
                key("rope_original_context", None),
            )
        n_layers = int(key("n_layers"))
        if row.hybrid_gdn:  # multi-token prediction layers follow the trunk's; they are not run
            n_layers -= int(_meta(fields, f"{arch}.nextn_predict_layers", 0) or 0)
            options_hybrid: dict[str, Any] = {"rope_dims": 0 if rope_dims == head_dim else rope_dims}
            options_hybrid["attn_output_gate"] = True
            options_hybrid["ssm_grouped_heads"] = row.gdn_grouped_heads
            options_hybrid["ssm_fused_in"] = any(n.endswith(".ssm_in.weight") for n in names)
        else:
            options_hybrid = {}
        options: dict[str, Any] = {}
        if row.gguf_options is not None:

            def own_key(name: str, default: Any = KeyError) -> Any:
                return _meta(fields, name, default)

            options = row.gguf_options(own_key, n_layers, dim, n_heads, head_dim)
        hidden = int(key("hidden_dim", 0) or 0)
        options.update(_gguf_experts(key, arch, hidden))
        if not hidden and options.get("expert_hidden_dim"):  # a mixture without a dense width (Qwen3.5-MoE)
            hidden = options["expert_hidden_dim"]
        options.update(options_hybrid)
        return cls(
            arch=arch,
            vocab_size=int(vocab),
            dim=dim,
            n_layers=n_layers,
            n_heads=n_heads,
            n_kv_heads=int(key("n_kv_heads", n_heads)),
            head_dim=head_dim,
            hidden_dim=hidden or int(key("hidden_dim")),
            rope_theta=theta,
            rope_scaling=scaling,
            rope_neox=row.gguf_rope_neox,
            norm_eps=float(key("norm_eps")),
            tie_embeddings="output.weight" not in names,
            qkv_bias=row.qkv_bias or "blk.0.attn_q.bias" in names,
            context_length=int(key("context_length")),
            rope_linear_factor=linear,
            qk_norm=row.qk_norm,
            qk_norm_full=row.qk_norm_full,
            sandwich_norms=row.sandwich_norms,
            ffn_act=row.ffn_act,
            attn_sinks=row.attn_sinks,
            attn_out_bias=row.attn_out_bias,
            yarn=yarn,
            **options,
        )

    @property
    def q_dim(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim


def _gguf_experts(key, arch: str, hidden: int) -> dict[str, Any]:
    """A file's mixture-of-experts fields, read as llama.cpp reads them: an expert's width is
    expert_feed_forward_length, else feed_forward_length (Qwen2-MoE: that over the experts used); the shared expert's
    is expert_shared_feed_forward_length, else feed_forward_length. Empty for a dense file."""
    row = ARCHITECTURES[arch]
    n_experts = int(key("n_experts", 0) or 0)
    if n_experts == 0:
        if row.ffn == FFN_MOE:
            raise ValueError(f"{arch} files need {arch}.{GGUF_KEYS['n_experts']} (a mixture of experts)")
        return {}
    used = int(key("n_experts_used", 0) or 0)
    if used == 0:
        raise ValueError(f"{arch}.{GGUF_KEYS['n_experts_used']} is missing or 0 for {n_experts} experts")
    default = hidden // used if row.shared_expert else hidden
    return {
        "n_experts": n_experts,
        "n_experts_used": used,
        "expert_hidden_dim": int(key("expert_hidden_dim", 0) or default),
        "shared_expert_hidden_dim": int(key("shared_expert_hidden_dim", 0) or hidden) if row.shared_expert else 0,
        "expert_norm_topk": row.moe_norm_topk,
        "expert_weights_scale": float(key("expert_weights_scale", 0.0) or 1.0),
        "expert_gating": row.moe_gating,
        "expert_bias": row.expert_bias,
    }


def _gguf_yarn(key, factor: float) -> dict[str, Any]:
    """YaRN's parameters as llama.cpp reads them: the ext factor 1 unless the file says (a negative one: unset), betas
    32 and 1, the file's attn_factor (1 unless set); a yarn_log_multiplier (DeepSeek's mscale) is not built."""
    if float(key("yarn_log_multiplier", 0.0) or 0.0) != 0.0:
        raise ValueError("YaRN with rope.scaling.yarn_log_multiplier is not supported")
    ext = float(key("yarn_ext_factor", -1.0))
    return {
        "factor": factor,
        "original_context": int(key("rope_original_context", 0) or 0),
        "ext_factor": 1.0 if ext < 0 else ext,
        "attn_factor": float(key("rope_attn_factor", 1.0) or 1.0),
        "beta_fast": float(key("yarn_beta_fast", 32.0)),
        "beta_slow": float(key("yarn_beta_slow", 1.0)),
    }


def _int(cfg: Mapping[str, Any], key: str) -> int:
    value = cfg.get(key)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"config.json: {key} must be an integer, got {value!r}")
    return value


def _meta(fields: Mapping[str, Any], key: str, default: Any = KeyError) -> Any:
    if key not in fields:
        if default is KeyError:
            raise ValueError(f"missing metadata key {key}")
        return default
    value = fields[key]
    return value.contents() if hasattr(value, "contents") else value  # GGUFReader ReaderField
