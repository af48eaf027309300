"""ModelConfig: the numbers that define a llama-family transformer, read from GGUF metadata or HF config.json.

Everything the engine sizes its buffers from lives here, and is checked here, so that a model the engine cannot
run is refused at load time with a sentence instead of failing (or silently computing garbage) later.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Collection, Mapping

import numpy as np

ARCHS = ("llama", "mistral", "qwen2")
HF_ARCHS = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral", "Qwen2ForCausalLM": "qwen2"}
HEAD_DIMS = (64, 128)  # the attention kernel's tiles are specialised for these
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

    def __post_init__(self) -> None:
        if self.arch not in ARCHS:
            raise ValueError(f"unsupported architecture {self.arch!r} (supported: {', '.join(ARCHS)})")
        for name in ("vocab_size", "dim", "n_layers", "n_heads", "n_kv_heads", "head_dim", "hidden_dim",
                     "context_length"):
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

    @classmethod
    def from_hf(cls, cfg: Mapping[str, Any]) -> "ModelConfig":
        """From a Hugging Face config.json dict (Llama/Mistral/Qwen2ForCausalLM)."""
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
        scaling = cfg.get("rope_scaling") or (rope_params if rope_params.get("rope_type") not in (None, "default")
                                              else None)
        context = _int(cfg, "max_position_embeddings")
        window = cfg.get("sliding_window")
        use_window = cfg.get("use_sliding_window", arch == "mistral")  # Qwen2 ships a window it does not use
        if use_window and isinstance(window, int) and 0 < window < context:
            # Full attention equals sliding-window attention up to the window, so capping the context keeps
            # results exact instead of silently attending further than the model was trained to.
            context = window
        return cls(
            arch=arch, vocab_size=_int(cfg, "vocab_size"), dim=dim, n_layers=_int(cfg, "num_hidden_layers"),
            n_heads=n_heads, n_kv_heads=int(cfg.get("num_key_value_heads") or n_heads), head_dim=int(head_dim),
            hidden_dim=_int(cfg, "intermediate_size"), rope_theta=float(rope_theta),
            rope_scaling=_hf_rope_scaling(scaling),
            rope_neox=True,  # HF checkpoints keep q/k unpermuted: rotate-half pairs (i, i + head_dim/2)
            norm_eps=float(cfg.get("rms_norm_eps", 1e-6)), tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            qkv_bias=arch == "qwen2", context_length=context)

    @classmethod
    def from_gguf(cls, fields: Mapping[str, Any], tensor_names: Collection[str] = (),
                  rope_freqs: np.ndarray | None = None) -> "ModelConfig":
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
            raise ValueError(f"partial rotary embeddings (rope.dimension_count {key('rope.dimension_count')} "
                             f"< head_dim {head_dim}) are not supported")
        scaling_type = key("rope.scaling.type", "none")
        if scaling_type not in ("none", "") or float(key("rope.scale_linear", 1.0)) != 1.0:
            raise ValueError(f"rope scaling type {scaling_type!r} is not supported (only llama3 via rope_freqs)")
        vocab = key("vocab_size", None)
        if vocab is None:
            vocab = len(_meta(fields, "tokenizer.ggml.tokens", []))
        theta = float(key("rope.freq_base", 10000.0))
        names = set(tensor_names)
        scaling = None
        if rope_freqs is not None:
            scaling = llama3_from_factors(np.asarray(rope_freqs, dtype=np.float64).ravel(), head_dim, theta,
                                          key("rope.scaling.original_context_length", None))
        return cls(
            arch=arch, vocab_size=int(vocab), dim=dim, n_layers=int(key("block_count")), n_heads=n_heads,
            n_kv_heads=int(key("attention.head_count_kv", n_heads)), head_dim=head_dim,
            hidden_dim=int(key("feed_forward_length")), rope_theta=theta, rope_scaling=scaling,
            # llama.cpp's converter permutes Wq/Wk of llama models so rope pairs are adjacent (2i, 2i+1);
            # it leaves qwen2 alone, which therefore keeps HF's rotate-half pairing.
            rope_neox=arch == "qwen2",
            norm_eps=float(key("attention.layer_norm_rms_epsilon")),
            tie_embeddings="output.weight" not in names,
            qkv_bias=arch == "qwen2" or "blk.0.attn_q.bias" in names,
            context_length=int(key("context_length")))

    @property
    def q_dim(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim


def expected_shapes(cfg: ModelConfig) -> dict[str, tuple[int, int]]:
    """Every tensor the engine needs, GGUF-named, as (rows = out features, cols = in features)."""
    shapes = {"token_embd.weight": (cfg.vocab_size, cfg.dim), "output_norm.weight": (1, cfg.dim)}
    if not cfg.tie_embeddings:
        shapes["output.weight"] = (cfg.vocab_size, cfg.dim)
    for i in range(cfg.n_layers):
        b = f"blk.{i}."
        shapes.update({
            b + "attn_norm.weight": (1, cfg.dim), b + "attn_q.weight": (cfg.q_dim, cfg.dim),
            b + "attn_k.weight": (cfg.kv_dim, cfg.dim), b + "attn_v.weight": (cfg.kv_dim, cfg.dim),
            b + "attn_output.weight": (cfg.dim, cfg.q_dim), b + "ffn_norm.weight": (1, cfg.dim),
            b + "ffn_gate.weight": (cfg.hidden_dim, cfg.dim), b + "ffn_up.weight": (cfg.hidden_dim, cfg.dim),
            b + "ffn_down.weight": (cfg.dim, cfg.hidden_dim)})
        if cfg.qkv_bias:
            shapes.update({b + "attn_q.bias": (1, cfg.q_dim), b + "attn_k.bias": (1, cfg.kv_dim),
                           b + "attn_v.bias": (1, cfg.kv_dim)})
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
    scaling = {"factor": factor, "low_freq_factor": float(low), "high_freq_factor": float(high),
               "original_max_position_embeddings": int(round(orig))}
    if not np.allclose(llama3_freq_factors(head_dim, theta, scaling), factors, rtol=1e-3, atol=1e-4):
        raise ValueError("rope_freqs.weight does not follow llama3 rope scaling; this rope variant is not supported")
    return scaling


def _check_llama3(s: Mapping[str, Any]) -> None:
    missing = [k for k in LLAMA3_KEYS if k not in s]
    if missing:
        raise ValueError(f"llama3 rope_scaling lacks {', '.join(missing)}")
    if not (s["factor"] >= 1 and 0 < s["low_freq_factor"] < s["high_freq_factor"]
            and s["original_max_position_embeddings"] > 0):
        raise ValueError(f"llama3 rope_scaling values are inconsistent: {dict(s)}")


def _hf_rope_scaling(scaling: Mapping[str, Any] | None) -> dict | None:
    if not scaling:
        return None
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind in (None, "default"):
        return None
    if kind != "llama3":
        raise ValueError(f"rope scaling type {kind!r} is not supported (only llama3)")
    out = {k: scaling.get(k) for k in LLAMA3_KEYS}
    _check_llama3({k: v for k, v in out.items() if v is not None})
    return {"factor": float(out["factor"]), "low_freq_factor": float(out["low_freq_factor"]),
            "high_freq_factor": float(out["high_freq_factor"]),
            "original_max_position_embeddings": int(out["original_max_position_embeddings"])}


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
        raise ValueError(f"unexpected tensor {extra[0]} (not part of a {cfg.arch} model with this config; "
                         f"{len(extra)} unexpected in all)")
    for name, want in expected.items():
        if tuple(shapes[name]) != want:
            raise ValueError(f"tensor {name} has shape (rows, cols) {tuple(shapes[name])}, the config implies {want}")
