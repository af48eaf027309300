"""ModelConfig: the numbers that define a llama-family transformer, read from GGUF metadata or HF config.json.

Gemma 3 and Qwen3 are llama-family models with a few switches: QK-norm (both), and for Gemma 3 sandwich norms,
GeGLU, an embedding scale, interleaved sliding-window layers with a RoPE base of their own and its own attention
scale. Each switch is a field here and a small branch in the engine's one forward pass.

Everything the engine sizes its buffers from lives here, and is checked here, so that a model the engine cannot
run is refused at load time with a sentence instead of failing (or silently computing garbage) later.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any
from collections.abc import Collection, Mapping

import numpy as np

ARCHS = ("llama", "mistral", "qwen2", "qwen3", "gemma3")
HF_ARCHS = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}
HEAD_DIMS = (64, 128, 256)  # multiples of the attention kernel's 64-wide tiles that models use
FFN_ACTS = ("silu", "gelu_tanh")
# Gemma 3 as llama.cpp reads it: every 6th layer global, the others a sliding window with a RoPE base of 10000
GEMMA3_SWA_PATTERN = 6
GEMMA3_LOCAL_ROPE_BASE = 10000.0
LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
# Weight rows are split into 32-value blocks (Q8_0/Q4_0/Q4_1), so every matmul input width must be a multiple.
DIM_MULTIPLE = 32


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
    ffn_act: str = "silu"  # the gate's activation: silu (SwiGLU) or gelu_tanh (GeGLU)
    embed_scale: float = 1.0  # the embeddings are multiplied by it (Gemma: sqrt(dim))
    attn_scale: float | None = None  # of q.k; None: 1/sqrt(head_dim)
    logit_softcap: float = 0.0  # logits = cap * tanh(logits / cap); 0: none
    sliding_window: int = 0  # keys a local layer's query sees, itself included
    local_layers: tuple[int, ...] = ()  # the layers that use the sliding window
    rope_theta_local: float | None = None  # RoPE base of the local layers (None: rope_theta)
    rope_linear_factor: float = 1.0  # linear RoPE scaling of the global layers: positions / factor

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
            _check_llama3(self.rope_scaling)
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
        if any(not 0 <= i < self.n_layers for i in self.local_layers) or list(self.local_layers) != sorted(
            set(self.local_layers)
        ):
            raise ValueError(f"local_layers must be distinct ascending layer indices, got {self.local_layers}")

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
        if cfg.get("quantization_config"):
            method = cfg["quantization_config"].get("quant_method", "?")
            raise ValueError(f"pre-quantized checkpoints ({method}) are not supported; use the float weights")
        if cfg.get("hidden_act", "silu") != "silu":
            raise ValueError(f"hidden_act {cfg['hidden_act']!r} is not supported (only silu)")
        if arch != "qwen2" and (cfg.get("attention_bias") or cfg.get("mlp_bias")):
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
        use_window = cfg.get("use_sliding_window", arch == "mistral")  # Qwen2 ships a window it does not use
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
            rope_scaling=_hf_rope_scaling(scaling),
            rope_neox=True,  # HF checkpoints keep q/k unpermuted: rotate-half pairs (i, i + head_dim/2)
            norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            qkv_bias=arch == "qwen2",
            context_length=context,
            qk_norm=arch == "qwen3",
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

        def key(name: str, default: Any = KeyError) -> Any:
            value = _meta(fields, f"{arch}.{name}", default)
            if isinstance(value, list):
                raise ValueError(f"{arch}.{name} varies per layer, which is not supported")
            return value

        dim = int(key("embedding_length"))
        n_heads = int(key("attention.head_count"))
        head_dim = int(key("attention.key_length", dim // n_heads if n_heads else 0))
        if int(key("attention.value_length", head_dim)) != head_dim:
            raise ValueError("attention.value_length differs from key_length, which is not supported")
        if int(key("rope.dimension_count", head_dim)) != head_dim:
            raise ValueError(
                f"partial rotary embeddings (rope.dimension_count {key('rope.dimension_count')} "
                f"< head_dim {head_dim}) are not supported"
            )
        scaling_type = key("rope.scaling.type", "none")
        # a factor without a type is linear, as llama.cpp reads it (older files wrote only rope.scale_linear)
        linear = float(key("rope.scaling.factor", key("rope.scale_linear", 1.0)) or 1.0)
        if scaling_type not in ("none", "", "linear"):
            raise ValueError(
                f"rope scaling type {scaling_type!r} is not supported (only linear, and llama3 via rope_freqs)"
            )
        vocab = key("vocab_size", None)
        if vocab is None:
            vocab = len(_meta(fields, "tokenizer.ggml.tokens", []))
        theta = float(key("rope.freq_base", 10000.0))
        names = set(tensor_names)
        scaling = None
        if rope_freqs is not None:
            scaling = llama3_from_factors(
                np.asarray(rope_freqs, dtype=np.float64).ravel(),
                head_dim,
                theta,
                key("rope.scaling.original_context_length", None),
            )
        n_layers = int(key("block_count"))
        extra: dict[str, Any] = {}
        if arch == "qwen3":
            extra = {"qk_norm": True}
        elif arch == "gemma3":
            extra = _gemma3_gguf(fields, n_layers, dim, n_heads, head_dim)
        return cls(
            arch=arch,
            vocab_size=int(vocab),
            dim=dim,
            n_layers=n_layers,
            n_heads=n_heads,
            n_kv_heads=int(key("attention.head_count_kv", n_heads)),
            head_dim=head_dim,
            hidden_dim=int(key("feed_forward_length")),
            rope_theta=theta,
            rope_scaling=scaling,
            # llama.cpp's converter permutes Wq/Wk of llama models so rope pairs are adjacent (2i, 2i+1);
            # it leaves qwen2, qwen3 and gemma3 alone, which therefore keep HF's rotate-half pairing.
            rope_neox=arch in ("qwen2", "qwen3", "gemma3"),
            norm_eps=float(key("attention.layer_norm_rms_epsilon")),
            tie_embeddings="output.weight" not in names,
            qkv_bias=arch == "qwen2" or "blk.0.attn_q.bias" in names,
            context_length=int(key("context_length")),
            rope_linear_factor=linear,
            **extra,
        )

    @property
    def q_dim(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim


def _gemma3_gguf(fields: Mapping[str, Any], n_layers: int, dim: int, n_heads: int, head_dim: int) -> dict[str, Any]:
    """Gemma 3's switches from its GGUF metadata, read as llama.cpp reads them.

    The converter stores the norms' weights as 1 + w (Gemma's RMSNorm scales by 1 + w), so they are used as stored.
    The file has no query_pre_attn_scalar: it is head_dim for every size but the 27B (62 layers), whose is
    dim / n_heads, as in Google's reference config and llama.cpp."""
    window = int(_meta(fields, "gemma3.attention.sliding_window", 0) or 0)
    local: tuple[int, ...] = ()
    if window > 0:
        pattern = _meta(fields, "gemma3.attention.sliding_window_pattern", GEMMA3_SWA_PATTERN)
        if isinstance(pattern, list):  # one flag per layer: true = sliding window
            if len(pattern) != n_layers:
                raise ValueError(
                    f"gemma3.attention.sliding_window_pattern has {len(pattern)} entries for {n_layers} layers"
                )
            local = tuple(i for i, is_local in enumerate(pattern) if is_local)
        else:  # every n-th layer is global, the others local
            n = int(pattern)
            local = tuple(i for i in range(n_layers) if n == 0 or i % n < n - 1)
    query_pre_attn_scalar = dim // n_heads if n_layers == 62 else head_dim
    return {
        "qk_norm": True,
        "sandwich_norms": True,
        "ffn_act": "gelu_tanh",
        "embed_scale": math.sqrt(dim),
        "attn_scale": query_pre_attn_scalar**-0.5,
        "logit_softcap": float(_meta(fields, "gemma3.final_logit_softcapping", 0.0) or 0.0),
        "sliding_window": window,
        "local_layers": local,
        "rope_theta_local": float(_meta(fields, "gemma3.rope.freq_base_swa", GEMMA3_LOCAL_ROPE_BASE)),
    }


def expected_shapes(cfg: ModelConfig) -> dict[str, tuple[int, int]]:
    """Every tensor the engine needs, GGUF-named, as (rows = out features, cols = in features)."""
    shapes = {"token_embd.weight": (cfg.vocab_size, cfg.dim), "output_norm.weight": (1, cfg.dim)}
    if not cfg.tie_embeddings:
        shapes["output.weight"] = (cfg.vocab_size, cfg.dim)
    for i in range(cfg.n_layers):
        b = f"blk.{i}."
        shapes.update(
            {
                b + "attn_norm.weight": (1, cfg.dim),
                b + "attn_q.weight": (cfg.q_dim, cfg.dim),
                b + "attn_k.weight": (cfg.kv_dim, cfg.dim),
                b + "attn_v.weight": (cfg.kv_dim, cfg.dim),
                b + "attn_output.weight": (cfg.dim, cfg.q_dim),
                b + "ffn_norm.weight": (1, cfg.dim),
                b + "ffn_gate.weight": (cfg.hidden_dim, cfg.dim),
                b + "ffn_up.weight": (cfg.hidden_dim, cfg.dim),
                b + "ffn_down.weight": (cfg.dim, cfg.hidden_dim),
            }
        )
        if cfg.qkv_bias:
            shapes.update(
                {
                    b + "attn_q.bias": (1, cfg.q_dim),
                    b + "attn_k.bias": (1, cfg.kv_dim),
                    b + "attn_v.bias": (1, cfg.kv_dim),
                }
            )
        if cfg.qk_norm:
            shapes.update({b + "attn_q_norm.weight": (1, cfg.head_dim), b + "attn_k_norm.weight": (1, cfg.head_dim)})
        if cfg.sandwich_norms:
            shapes.update({b + "post_attention_norm.weight": (1, cfg.dim), b + "post_ffw_norm.weight": (1, cfg.dim)})
    return shapes


def llama3_freq_factors(head_dim: int, theta: float, scaling: Mapping[str, float]) -> np.ndarray:
    """Per-frequency divisors of the rope angle for llama3 scaling, (head_dim/2,) float64.

    Same formula as HF's _compute_llama3_parameters and llama.cpp's rope_freqs tensor: high frequencies are
    kept, low ones divided by `factor`, the band between interpolated smoothly.
    """
    inv_freq = theta ** -(np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    wavelen = 2 * math.pi / inv_freq
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    orig = scaling["original_max_position_embeddings"]
    smooth = (orig / wavelen - low) / (high - low)
    mid = 1.0 / ((1 - smooth) / factor + smooth)
    return np.where(wavelen < orig / high, 1.0, np.where(wavelen > orig / low, factor, mid))


def llama3_from_factors(factors: np.ndarray, head_dim: int, theta: float, orig_hint: Any = None) -> dict | None:
    """Recover llama3 rope_scaling parameters from llama.cpp's rope_freqs tensor, checking the fit.

    Only the ratios orig/low and orig/high matter to the factors, so `orig` is taken from the file's
    original_context_length when present (else llama 3.1's 8192) and low/high are solved for.
    """
    if factors.shape != (head_dim // 2,):
        raise ValueError(f"rope_freqs.weight has {factors.size} values, expected head_dim/2 = {head_dim // 2}")
    if not np.all(np.isfinite(factors)) or factors.min() <= 0:
        raise ValueError("rope_freqs.weight holds non-positive or non-finite values")
    if np.allclose(factors, 1.0):
        return None
    factor = float(factors.max())
    orig = float(orig_hint or 8192)
    inv_freq = theta ** -(np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    wavelen = 2 * math.pi / inv_freq
    mid = (factors > 1 + 1e-4) & (factors < factor * (1 - 1e-4))
    low, high = 1.0, 4.0  # llama 3.1/3.2's values, used when the tensor has no smooth band to solve from
    if mid.sum() >= 2:
        smooth = (1 / factors[mid] - 1 / factor) / (1 - 1 / factor)
        slope, icept = np.polyfit(1 / wavelen[mid], smooth, 1)  # smooth = orig/(high-low)/wavelen - low/(high-low)
        if slope > 0:
            low = -icept * orig / slope
            high = low + orig / slope
    scaling = {
        "factor": factor,
        "low_freq_factor": float(low),
        "high_freq_factor": float(high),
        "original_max_position_embeddings": int(round(orig)),
    }
    if not np.allclose(llama3_freq_factors(head_dim, theta, scaling), factors, rtol=1e-3, atol=1e-4):
        raise ValueError("rope_freqs.weight does not follow llama3 rope scaling; this rope variant is not supported")
    return scaling


def _check_llama3(s: Mapping[str, Any]) -> None:
    missing = [k for k in LLAMA3_KEYS if k not in s]
    if missing:
        raise ValueError(f"llama3 rope_scaling lacks {', '.join(missing)}")
    if not (
        s["factor"] >= 1
        and 0 < s["low_freq_factor"] < s["high_freq_factor"]
        and s["original_max_position_embeddings"] > 0
    ):
        raise ValueError(f"llama3 rope_scaling values are inconsistent: {dict(s)}")


def _hf_rope_scaling(scaling: Mapping[str, Any] | None) -> dict | None:
    if not scaling:
        return None
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind in (None, "default"):
        return None
    if kind != "llama3":
        raise ValueError(f"rope scaling type {kind!r} is not supported (only llama3)")
    out: dict[str, Any] = {k: scaling.get(k) for k in LLAMA3_KEYS}
    _check_llama3({k: v for k, v in out.items() if v is not None})  # raises if any is missing
    return {
        "factor": float(out["factor"]),
        "low_freq_factor": float(out["low_freq_factor"]),
        "high_freq_factor": float(out["high_freq_factor"]),
        "original_max_position_embeddings": int(out["original_max_position_embeddings"]),
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


def check_tensors(cfg: ModelConfig, shapes: Mapping[str, tuple[int, int]]) -> None:
    """Raise ValueError naming any missing, unexpected or mis-shaped tensor (shapes: name -> (rows, cols)).

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
