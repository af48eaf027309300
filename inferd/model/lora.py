"""LoRA adapters read from disk: a GGUF as llama.cpp's convert_lora_to_gguf.py writes it (general.type "adapter",
adapter.type "lora", adapter.lora.alpha; tensors `<base tensor name>.lora_a` (rank, in) and `.lora_b` (out, rank))
or a PEFT folder (adapter_config.json + adapter_model.safetensors). Either becomes the same thing: per (layer,
target) the matrices A and B in float32 and the adapter's scale, alpha / rank as llama.cpp and PEFT apply it
(alpha / sqrt(rank) for PEFT's rsLoRA), checked against the base model's shapes. The engine adds
scale * B (A x) to the target's output for the sequences that use the adapter; the base weights are untouched."""

from __future__ import annotations

import hashlib
import json
import math
import mmap
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from inferd.model.arch import ARCHITECTURES
from inferd.model.errors import ModelLoadError
from inferd.model.gguf import _tensor_data, validate_gguf
from inferd.model.hf import read_safetensors_header
from inferd.model.model_config import ModelConfig

TARGETS = ("q", "k", "v", "o", "gate", "up", "down")  # the engine's adaptable weights (ext/lora.pxi's order)
# the base tensor of each target, GGUF-named (blk.{i}.<name>.weight)
GGUF_TARGETS = {
    "attn_q": "q",
    "attn_k": "k",
    "attn_v": "v",
    "attn_output": "o",
    "ffn_gate": "gate",
    "ffn_up": "up",
    "ffn_down": "down",
}
# PEFT's module names (Llama, Qwen, Mistral, Gemma, ...: model.layers.{i}.self_attn.q_proj) -> target
PEFT_MODULES = {
    "q_proj": "q",
    "k_proj": "k",
    "v_proj": "v",
    "o_proj": "o",
    "gate_proj": "gate",
    "up_proj": "up",
    "down_proj": "down",
}
PEFT_DTYPES: dict[str, type] = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16}
_GGUF_NAME = re.compile(r"^blk\.(\d+)\.([a-z_]+)\.weight\.lora_([ab])$")
_PEFT_NAME = re.compile(
    r"^(?:base_model\.model\.)?(?:model\.)?layers\.(\d+)\.(?:self_attn|mlp)\.([a-z_]+)\.lora_([AB])\.weight$"
)


@dataclass
class Adapter:
    """One adapter's matrices for one base model."""

    path: str
    format: str  # "gguf" or "peft"
    alpha: float  # 0: none given (llama.cpp then applies the request's scale alone)
    # (layer, target) -> (A (rank, in), B (out, rank), scale), float32
    matrices: dict[tuple[int, str], tuple[np.ndarray, np.ndarray, float]] = field(default_factory=dict)

    @property
    def rank(self) -> int:
        return max((a.shape[0] for a, _, _ in self.matrices.values()), default=0)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes + b.nbytes for a, b, _ in self.matrices.values())

    def fingerprint(self) -> str:
        """A digest of the matrices and scales: the prefix cache's K/V of an adapter stays valid only for these
        values (a file replaced under the same name and path is another adapter)."""
        h = hashlib.blake2b(digest_size=16)
        for (layer, target), (a, b, scale) in sorted(self.matrices.items()):
            h.update(f"{layer}.{target}:{scale!r}:{a.shape}".encode())
            h.update(np.ascontiguousarray(a).tobytes())
            h.update(np.ascontiguousarray(b).tobytes())
        return h.hexdigest()

    @property
    def targets(self) -> list[str]:
        return [t for t in TARGETS if any(k[1] == t for k in self.matrices)]


def load_adapter(path: str | os.PathLike[str], config: ModelConfig) -> Adapter:
    """Reads the GGUF file or PEFT folder at `path` and checks it against the base model's `config`; raises
    ModelLoadError naming the file and the problem."""
    p = Path(path)
    if p.is_dir():
        adapter = _load_peft(p, config)
    elif p.is_file():
        adapter = _load_gguf(p, config)
    else:
        raise ModelLoadError(p, "no such adapter file or folder")
    if not adapter.matrices:
        raise ModelLoadError(p, "the adapter has no LoRA matrices")
    for (layer, target), (a, b, _) in adapter.matrices.items():
        _check_shape(p, config, layer, target, a, b)
    return adapter


def target_shape(config: ModelConfig, target: str) -> tuple[int, int]:
    """(out, in) of a target's base weight."""
    dim, q, kv, hidden = config.dim, config.q_dim, config.kv_dim, config.hidden_dim
    return {"q": (q, dim), "k": (kv, dim), "v": (kv, dim), "o": (dim, q), "gate": (hidden, dim),
            "up": (hidden, dim), "down": (dim, hidden)}[target]  # fmt: skip


def _check_shape(path: Path, config: ModelConfig, layer: int, target: str, a: np.ndarray, b: np.ndarray) -> None:
    if not 0 <= layer < config.n_layers:
        raise ModelLoadError(
            path, f"layer {layer}'s {target} matrices, but the base model has {config.n_layers} layers"
        )
    if target in ("gate", "up", "down") and config.is_moe:
        raise ModelLoadError(path, f"layer {layer}: adapters of a mixture of experts' FFN are not supported")
    if config.recurrent_layers:  # its attention layers have gated queries, its other layers no q/k/v/o at all
        raise ModelLoadError(path, "adapters of a hybrid recurrent model (Qwen3.5, Qwen3-Next) are not supported")
    out, inp = target_shape(config, target)
    if a.ndim != 2 or b.ndim != 2 or a.shape[0] != b.shape[1] or a.shape[0] < 1:
        raise ModelLoadError(path, f"layer {layer} {target}: A {a.shape} and B {b.shape} are not a rank-r pair")
    if a.shape[1] != inp or b.shape[0] != out:
        raise ModelLoadError(
            path,
            f"layer {layer} {target}: A {a.shape} and B {b.shape} do not fit the base weight (out, in) = "
            f"({out}, {inp}) (an adapter of another base model?)",
        )


def _permuted_rows(b: np.ndarray, n_heads: int) -> np.ndarray:
    """llama.cpp's converter's permutation of llama-family Wq/Wk rows (rotate-half pairs -> adjacent pairs)."""
    return b.reshape(n_heads, 2, b.shape[0] // n_heads // 2, b.shape[1]).swapaxes(1, 2).reshape(b.shape)


def _unpermuted_rows(b: np.ndarray, n_heads: int) -> np.ndarray:
    return b.reshape(n_heads, b.shape[0] // n_heads // 2, 2, b.shape[1]).swapaxes(1, 2).reshape(b.shape)


def _to_base_rows(b: np.ndarray, target: str, config: ModelConfig, adjacent: bool) -> np.ndarray:
    """B's rows in the base model's order: Wq and Wk rows are permuted in a GGUF of a llama-family model
    (adjacent RoPE pairs) and not in a Hugging Face checkpoint; `adjacent` says which the adapter has."""
    if target not in ("q", "k") or adjacent == (not config.rope_neox):
        return b
    heads = config.n_heads if target == "q" else config.n_kv_heads
    return _unpermuted_rows(b, heads) if adjacent else _permuted_rows(b, heads)


# ---- GGUF (convert_lora_to_gguf.py) -------------------------------------------------------------------------


def _load_gguf(path: Path, config: ModelConfig) -> Adapter:
    header = validate_gguf(str(path))
    meta = header.metadata
    if meta.get("general.type") != "adapter" or meta.get("adapter.type") != "lora":
        raise ModelLoadError(
            path,
            f"not a LoRA adapter (general.type {meta.get('general.type')!r}, adapter.type "
            f"{meta.get('adapter.type')!r}; llama.cpp's convert_lora_to_gguf.py writes 'adapter' and 'lora')",
        )
    arch = meta.get("general.architecture")
    if arch != config.arch:
        raise ModelLoadError(path, f"an adapter for a {arch} model; the base model is {config.arch}")
    if meta.get("adapter.alora.invocation_tokens") is not None:
        raise ModelLoadError(path, "activated LoRA (aLoRA) adapters are not supported")
    alpha = float(meta.get("adapter.lora.alpha", 0.0) or 0.0)
    # llama.cpp's converter permutes a llama-family model's q/k rows (its B's rows) as it does the base model's
    adjacent = not ARCHITECTURES[arch].gguf_rope_neox if arch in ARCHITECTURES else not config.rope_neox
    with open(path, "rb") as f:
        file_map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    pairs: dict[tuple[int, str], dict[str, np.ndarray]] = {}
    for info in header.tensors:
        m = _GGUF_NAME.match(info.name)
        if not m or m.group(2) not in GGUF_TARGETS:
            raise ModelLoadError(
                path,
                f"tensor {info.name}: only the LoRA matrices of {', '.join(GGUF_TARGETS)} are supported",
            )
        if len(info.dims) != 2:
            raise ModelLoadError(path, f"tensor {info.name} has {len(info.dims)} dimensions, a LoRA matrix 2")
        cols, rows = info.dims
        values = _gguf_floats(path, info.name, info.type, _tensor_data(file_map, info), rows, cols)
        pairs.setdefault((int(m.group(1)), GGUF_TARGETS[m.group(2)]), {})[m.group(3)] = values
    adapter = Adapter(str(path), "gguf", alpha)
    for (layer, target), ab in sorted(pairs.items()):
        if set(ab) != {"a", "b"}:
            raise ModelLoadError(path, f"layer {layer} {target}: lora_{'a' if 'a' not in ab else 'b'} is missing")
        a, b = ab["a"], ab["b"]
        # llama.cpp's scale: alpha / rank, rank from B's row length (the request's scale multiplies it)
        scale = alpha / b.shape[1] if alpha else 1.0
        _check_shape(path, config, layer, target, a, b)
        adapter.matrices[(layer, target)] = (a, _to_base_rows(b, target, config, adjacent), scale)
    return adapter


def _gguf_floats(path: Path, name: str, type_name: str, data: np.ndarray, rows: int, cols: int) -> np.ndarray:
    if type_name == "F32":
        return np.array(data, np.float32).reshape(rows, cols)
    if type_name == "F16":
        return data.view(np.float16).astype(np.float32).reshape(rows, cols)
    if type_name == "BF16":
        return (data.astype(np.uint32) << 16).view(np.float32).reshape(rows, cols)
    if type_name == "Q8_0" and cols % 32 == 0:
        from inferd import _cpu  # the kernels' own Q8_0 decoding

        return _cpu.Weight("Q8_0", rows, cols, np.asarray(data).reshape(rows, -1)).dequantize()
    raise ModelLoadError(path, f"tensor {name} has type {type_name}; LoRA matrices may be F32, F16, BF16 or Q8_0")


# ---- PEFT (adapter_config.json + adapter_model.safetensors) -------------------------------------------------


def _load_peft(path: Path, config: ModelConfig) -> Adapter:
    cfg_path, st_path = path / "adapter_config.json", path / "adapter_model.safetensors"
    if not cfg_path.is_file():
        raise ModelLoadError(path, "a PEFT adapter folder needs adapter_config.json")
    if not st_path.is_file():
        raise ModelLoadError(
            path,
            "a PEFT adapter folder needs adapter_model.safetensors"
            + (" (adapter_model.bin, a pickle, is not read)" if (path / "adapter_model.bin").exists() else ""),
        )
    try:
        lcfg = json.loads(cfg_path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelLoadError(cfg_path, f"cannot read the adapter's config: {e}") from e
    if not isinstance(lcfg, dict):
        raise ModelLoadError(cfg_path, "not a JSON object")
    if str(lcfg.get("peft_type", "LORA")).upper() != "LORA":
        raise ModelLoadError(cfg_path, f"peft_type {lcfg.get('peft_type')!r}: only LORA adapters are supported")
    for flag, what in (("use_dora", "DoRA"), ("fan_in_fan_out", "fan_in_fan_out (Conv1D) weights")):
        if lcfg.get(flag):
            raise ModelLoadError(cfg_path, f"{what} adapters are not supported")
    if lcfg.get("modules_to_save"):
        raise ModelLoadError(
            cfg_path, f"modules_to_save {lcfg['modules_to_save']} (trained copies of base weights) are not supported"
        )
    try:
        alpha = float(lcfg.get("lora_alpha", 8) or 0)  # PEFT's default when a config leaves it out
        rslora = bool(lcfg.get("use_rslora", False))
        alpha_pattern = {str(k): float(v) for k, v in (lcfg.get("alpha_pattern") or {}).items()}
    except (TypeError, ValueError) as err:
        raise ModelLoadError(cfg_path, f"bad lora_alpha or alpha_pattern: {err}") from err
    entries = read_safetensors_header(st_path)
    with open(st_path, "rb") as f:
        file_map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    pairs: dict[tuple[int, str], dict[str, np.ndarray]] = {}
    modules: dict[tuple[int, str], str] = {}
    for name, entry in entries.items():
        m = _PEFT_NAME.match(name)
        if not m or m.group(2) not in PEFT_MODULES:
            raise ModelLoadError(
                st_path,
                f"tensor {name}: only the LoRA matrices of {', '.join(PEFT_MODULES)} in the decoder layers are "
                f"supported",
            )
        if entry.dtype not in PEFT_DTYPES or len(entry.shape) != 2:
            raise ModelLoadError(
                st_path, f"tensor {name} is {entry.dtype} {list(entry.shape)}; a 2-D F32/F16/BF16 matrix is needed"
            )
        dtype: np.dtype = np.dtype(PEFT_DTYPES[entry.dtype])
        raw = np.frombuffer(
            file_map, dtype, count=(entry.end - entry.start) // dtype.itemsize, offset=entry.start
        ).reshape(entry.shape)
        values = (raw.astype(np.uint32) << 16).view(np.float32) if entry.dtype == "BF16" else raw.astype(np.float32)
        key = (int(m.group(1)), PEFT_MODULES[m.group(2)])
        pairs.setdefault(key, {})[m.group(3)] = values
        modules[key] = name.split(".lora_")[0]
    adapter = Adapter(str(path), "peft", alpha)
    for (layer, target), ab in sorted(pairs.items()):
        if set(ab) != {"A", "B"}:
            raise ModelLoadError(st_path, f"layer {layer} {target}: lora_{'A' if 'A' not in ab else 'B'} is missing")
        a, b = ab["A"], ab["B"]
        _check_shape(path, config, layer, target, a, b)
        module_alpha = _pattern_value(alpha_pattern, modules[(layer, target)], alpha)
        rank = a.shape[0]
        scale = module_alpha / (math.sqrt(rank) if rslora else rank)
        adapter.matrices[(layer, target)] = (a, _to_base_rows(b, target, config, adjacent=False), scale)
    return adapter


def _pattern_value(patterns: dict[str, float], module: str, default: float) -> float:
    """PEFT's alpha_pattern: the value of the first key that the module's name ends with (as a dotted suffix) or
    matches as a regular expression."""
    for key, value in patterns.items():
        if module == key or module.endswith("." + key) or re.fullmatch(key, module):
            return value
    return default
