"""Small LoRA adapters for the tests: random low-rank matrices for a model's config, written as a PEFT folder
(adapter_config.json + adapter_model.safetensors, Hugging Face's row order) or as a GGUF the way llama.cpp's
convert_lora_to_gguf.py writes one (general.type "adapter", adapter.type "lora", adapter.lora.alpha, tensors
`<base tensor>.lora_a` / `.lora_b`, a llama-family model's q/k rows permuted as its base model's are)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter

from tests.model.make_tiny import permute_for_gguf, to_bf16_bits, write_safetensors

TARGETS = ("q", "k", "v", "o", "gate", "up", "down")
PEFT_MODULE = {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj", "o": "self_attn.o_proj",
               "gate": "mlp.gate_proj", "up": "mlp.up_proj", "down": "mlp.down_proj"}
GGUF_TENSOR = {"q": "attn_q", "k": "attn_k", "v": "attn_v", "o": "attn_output", "gate": "ffn_gate", "up": "ffn_up",
               "down": "ffn_down"}


def target_shape(cfg, target: str) -> tuple[int, int]:
    dim, q, kv, hidden = cfg.dim, cfg.q_dim, cfg.kv_dim, cfg.hidden_dim
    return {"q": (q, dim), "k": (kv, dim), "v": (kv, dim), "o": (dim, q), "gate": (hidden, dim),
            "up": (hidden, dim), "down": (dim, hidden)}[target]


def random_lora(cfg, rank: int = 4, targets=TARGETS, seed: int = 0, gain: float = 1.0,
                layers=None) -> dict[tuple[int, str], tuple[np.ndarray, np.ndarray]]:
    """(layer, target) -> (A (rank, in), B (out, rank)) float32, in Hugging Face's row order. B A x is ~gain times
    the size of x's entries (A ~ N(0, 1/in), B ~ N(0, gain^2/rank)): an adapter that moves the logits visibly."""
    rng = np.random.default_rng(seed)
    out = {}
    for layer in range(cfg.n_layers) if layers is None else layers:
        for t in targets:
            rows, cols = target_shape(cfg, t)
            a = (rng.standard_normal((rank, cols)) / math.sqrt(cols)).astype(np.float32)
            b = (rng.standard_normal((rows, rank)) * gain / math.sqrt(rank)).astype(np.float32)
            out[(layer, t)] = (a, b)
    return out


def to_gguf_rows(cfg, target: str, b: np.ndarray) -> np.ndarray:
    """B's rows as a GGUF of cfg's architecture orders them (llama.cpp permutes a llama-family model's q and k)."""
    if target not in ("q", "k") or cfg.rope_neox:
        return b
    return permute_for_gguf(b, cfg.n_heads if target == "q" else cfg.n_kv_heads)


def merged_tensors(model, matrices, scale: float) -> dict:
    """The model's tensors with W + scale * B @ A for every adapted weight, F32, in the model's row order
    (for tests/reference.py's float64 forward pass)."""
    from tests.reference import dequantize, make_tensor

    cfg = model.config
    ts = dict(model.tensors)
    for (layer, target), (a, b) in matrices.items():
        name = f"blk.{layer}.{GGUF_TENSOR[target]}.weight"
        w = dequantize(ts[name]).astype(np.float64)
        w = w + scale * (to_gguf_rows(cfg, target, b).astype(np.float64) @ a.astype(np.float64))
        ts[name] = make_tensor(name, w.astype(np.float32), "F32")
    return ts


def write_peft(folder: str | Path, matrices, *, alpha: float, rank: int, dtype: str = "F32",
               extra_config: dict | None = None) -> Path:
    """A PEFT adapter folder as `peft` saves one (adapter names stripped from the tensor names)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    targets = sorted({PEFT_MODULE[t].split(".")[1] for _, t in matrices})
    config = {"peft_type": "LORA", "r": rank, "lora_alpha": alpha, "target_modules": targets, "lora_dropout": 0.0,
              "bias": "none", "task_type": "CAUSAL_LM", "fan_in_fan_out": False, "use_rslora": False,
              **(extra_config or {})}
    (folder / "adapter_config.json").write_text(json.dumps(config))
    tensors = {}
    for (layer, target), (a, b) in matrices.items():
        prefix = f"base_model.model.model.layers.{layer}.{PEFT_MODULE[target]}"
        for suffix, m in (("lora_A", a), ("lora_B", b)):
            if dtype == "F16":
                value = ("F16", m.astype(np.float16).view(np.uint16))
            elif dtype == "BF16":
                value = ("BF16", to_bf16_bits(m))
            else:
                value = ("F32", m.astype(np.float32))
            tensors[f"{prefix}.{suffix}.weight"] = value
    write_safetensors(folder / "adapter_model.safetensors", tensors)
    return folder


def write_gguf_lora(path: str | Path, cfg, matrices, *, alpha: float, dtype: str = "F32") -> Path:
    """A GGUF adapter as convert_lora_to_gguf.py writes it: its metadata, then per adapted weight
    `blk.{i}.<tensor>.weight.lora_a` (rank, in) and `.lora_b` (out, rank), B's q/k rows permuted for a
    llama-family model."""
    path = Path(path)
    w = GGUFWriter(str(path), cfg.arch)
    w.add_type("adapter")
    w.add_string("adapter.type", "lora")
    w.add_float32("adapter.lora.alpha", alpha)
    for (layer, target), (a, b) in sorted(matrices.items()):
        name = f"blk.{layer}.{GGUF_TENSOR[target]}.weight"
        for suffix, m in (("lora_a", a), ("lora_b", to_gguf_rows(cfg, target, b))):
            m = np.ascontiguousarray(m, np.float32)
            if dtype == "F16":
                w.add_tensor(f"{name}.{suffix}", m.astype(np.float16))
            elif dtype == "BF16":
                bits = to_bf16_bits(m)
                w.add_tensor(f"{name}.{suffix}", bits, raw_shape=m.shape, raw_dtype=GGMLQuantizationType.BF16)
            else:
                w.add_tensor(f"{name}.{suffix}", m)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
