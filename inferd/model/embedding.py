"""Embedding models from a sentence-transformers folder: the encoder's weights and everything around them.

What the folder says, read rather than hard-coded:
- modules.json: the pipeline. A Transformer (config.json + model.safetensors + tokenizer.json at the module's path),
  then Pooling (1_Pooling/config.json: mean, CLS or last token), any Dense layers (their config.json and
  model.safetensors: a linear map, Identity activation) and Normalize (L2).
- sentence_bert_config.json: max_seq_length, the longest input in tokens (special tokens included).
- config_sentence_transformers.json: prompts (EmbeddingGemma's "query" / "document" prefixes), default prompt.
- README.md front matter is not parsed; Matryoshka dimensions are declared in config_sentence_transformers.json
  by newer models ("matryoshka_dims"), and for EmbeddingGemma, whose card documents 512/256/128, by KNOWN_MATRYOSHKA.

Architectures: BERT (model_type "bert": absolute positions, post-LayerNorm, GELU) and Gemma 3 text with
bidirectional attention (model_type "gemma3_text" with use_bidirectional_attention). Their tensors are put into
the encoder's layout here: q, k, v fused into one matrix; Gemma's gate and up interleaved per 32 rows (the FFN
stage computes 32 hidden units from one item); Gemma's RMSNorm weights w become 1 + w.
"""

from __future__ import annotations

import json
import mmap
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer as HFTokenizer

from .errors import ModelLoadError
from .hf import DTYPES, _json, read_safetensors_header
from .quant import check_quantize_arg, convert_tensor, to_float32
from .tensor import Tensor

TRANSFORMER = "sentence_transformers.models.Transformer"
POOLING = "sentence_transformers.models.Pooling"
DENSE = "sentence_transformers.models.Dense"
NORMALIZE = "sentence_transformers.models.Normalize"
IDENTITY = ("torch.nn.modules.linear.Identity", "torch.nn.Identity")
# model cards that document Matryoshka truncation without saying so in a config file
KNOWN_MATRYOSHKA = {"gemma3_text": (768, 512, 256, 128)}


@dataclass
class EmbeddingModel:
    path: str
    name: str
    arch: str  # "bert" | "gemma3"
    config: dict[str, Any]  # for _cpu.EncoderModel
    tensors: dict[str, Any]  # for _cpu.EncoderModel: (type, rows, cols, data) specs and float arrays
    tokenizer: HFTokenizer  # no truncation, no padding
    truncating_tokenizer: HFTokenizer  # truncates to max_seq_length the way sentence-transformers does
    max_seq_length: int
    dimensions: int  # length of the output vector
    matryoshka_dims: tuple[int, ...]  # lengths it may be truncated to (and renormalized); () if none
    prompts: dict[str, str] = field(default_factory=dict)
    default_prompt: str | None = None
    normalize: bool = False
    pooling: str = "mean"


def is_embedding_folder(path: str | os.PathLike[str]) -> bool:
    """True for a sentence-transformers folder (modules.json with a Transformer module) or an encoder-only
    config.json (BERT, bidirectional Gemma 3)."""
    root = Path(path)
    if not root.is_dir():
        return False
    modules = root / "modules.json"
    if modules.is_file():
        try:
            mods = json.loads(modules.read_text(encoding="utf-8"))
            return isinstance(mods, list) and any(isinstance(m, dict) and m.get("type") == TRANSFORMER for m in mods)
        except (OSError, ValueError):
            return False
    cfg = root / "config.json"
    if not cfg.is_file():
        return False
    try:
        raw = _json(cfg)
    except ModelLoadError:
        return False
    return _arch_of(raw) is not None


def _arch_of(raw: dict) -> str | None:
    if raw.get("model_type") == "bert":
        return "bert"
    if raw.get("model_type") == "gemma3_text" and raw.get("use_bidirectional_attention") is True:
        return "gemma3"
    return None


def load_embedding_model(path: str | os.PathLike[str], quantize: str | None = None) -> EmbeddingModel:
    root = Path(path)
    try:
        quantize = check_quantize_arg(quantize)
    except ValueError as e:
        raise ModelLoadError(root, str(e)) from e
    if not root.is_dir():
        raise ModelLoadError(root, "an embedding model is a folder (sentence-transformers layout) or a GGUF file")
    modules = _modules(root)
    transformer = root / modules[TRANSFORMER][0] if TRANSFORMER in modules else root
    raw = _json(transformer / "config.json")
    arch = _arch_of(raw)
    if arch is None:
        raise ModelLoadError(
            transformer / "config.json",
            f"model_type {raw.get('model_type')!r} is not an encoder inferd runs (bert, or "
            "gemma3_text with use_bidirectional_attention)",
        )
    st_cfg = _optional_json(transformer / "sentence_bert_config.json")
    max_len = st_cfg.get("max_seq_length") or raw.get("max_position_embeddings")
    if not isinstance(max_len, int) or max_len < 2:
        raise ModelLoadError(transformer, f"max_seq_length {max_len!r} is not a usable length")
    max_len = min(max_len, int(raw.get("max_position_embeddings", max_len)))

    pooling, include_prompt = "mean", True
    if POOLING in modules:
        pooling, include_prompt = _pooling(root / modules[POOLING][0] / "config.json")
    if not include_prompt:
        raise ModelLoadError(root, "pooling that leaves the prompt out (include_prompt: false) is not supported")

    entries = _entries(transformer)
    hf = _Weights(transformer, entries)
    try:
        config, tensors = (_bert if arch == "bert" else _gemma3)(raw, hf, max_len, quantize)
    except (KeyError, ValueError, TypeError) as e:
        if isinstance(e, ModelLoadError):
            raise
        raise ModelLoadError(transformer, f"{type(e).__name__}: {e}") from e
    config["pooling"] = pooling
    config["normalize"] = NORMALIZE in modules

    out_dim = config["dim"]
    for j, dense_dir in enumerate(modules.get(DENSE, [])):
        out_dim = _dense(root / dense_dir, j, out_dim, tensors)

    st_main = _optional_json(root / "config_sentence_transformers.json")
    prompts = st_main.get("prompts") or {}
    if not isinstance(prompts, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in prompts.items()):
        raise ModelLoadError(root / "config_sentence_transformers.json", "prompts must map names to strings")
    dims = st_main.get("matryoshka_dims") or KNOWN_MATRYOSHKA.get(str(raw.get("model_type")), ()) or ()
    matryoshka = tuple(sorted({int(d) for d in dims if isinstance(d, int) and 0 < d <= out_dim}, reverse=True))

    tok_path = transformer / "tokenizer.json"
    if not tok_path.is_file():
        raise ModelLoadError(transformer, "no tokenizer.json")
    try:
        tokenizer = HFTokenizer.from_file(str(tok_path))
        truncating = HFTokenizer.from_file(str(tok_path))
    except Exception as e:  # tokenizers raises plain Exception for a malformed file
        raise ModelLoadError(tok_path, str(e)) from e
    tokenizer.no_padding()
    tokenizer.no_truncation()
    truncating.no_padding()
    truncating.enable_truncation(max_len)
    return EmbeddingModel(
        path=str(root),
        name=root.name.lower(),
        arch=arch,
        config=config,
        tensors=tensors,
        tokenizer=tokenizer,
        truncating_tokenizer=truncating,
        max_seq_length=max_len,
        dimensions=out_dim,
        matryoshka_dims=matryoshka,
        prompts=dict(prompts),
        default_prompt=st_main.get("default_prompt_name"),
        normalize=config["normalize"],
        pooling=pooling,
    )


# ---- the folder's small files ----


def _optional_json(path: Path) -> dict:
    return _json(path) if path.is_file() else {}


def _modules(root: Path) -> dict[str, list[str]]:
    """module type -> the folders of its modules, in pipeline order (no modules.json: a bare Transformer)"""
    path = root / "modules.json"
    if not path.is_file():
        return {TRANSFORMER: [""]}
    try:
        mods = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ModelLoadError(path, f"not valid JSON: {e}") from e
    if not isinstance(mods, list):
        raise ModelLoadError(path, "expected a list of modules")
    out: dict[str, list[str]] = {}
    known = (TRANSFORMER, POOLING, DENSE, NORMALIZE)
    for m in sorted((m for m in mods if isinstance(m, dict)), key=lambda m: m.get("idx", 0)):
        kind, sub = m.get("type"), m.get("path", "")
        if kind not in known:
            raise ModelLoadError(path, f"module {kind!r} is not supported (supported: {', '.join(known)})")
        if not isinstance(sub, str) or Path(sub).is_absolute() or ".." in Path(sub).parts:
            raise ModelLoadError(path, f"module path {sub!r} leaves the folder")
        out.setdefault(kind, []).append(sub)
    if len(out.get(TRANSFORMER, [])) != 1 or len(out.get(POOLING, [])) > 1:
        raise ModelLoadError(path, "expected one Transformer module and at most one Pooling module")
    return out


def _pooling(path: Path) -> tuple[str, bool]:
    cfg = _json(path)
    modes = [
        m
        for m, key in (
            ("mean", "pooling_mode_mean_tokens"),
            ("cls", "pooling_mode_cls_token"),
            ("last", "pooling_mode_lasttoken"),
        )
        if cfg.get(key)
    ]
    others = [
        k
        for k in ("pooling_mode_max_tokens", "pooling_mode_mean_sqrt_len_tokens", "pooling_mode_weightedmean_tokens")
        if cfg.get(k)
    ]
    if others or len(modes) != 1:
        raise ModelLoadError(
            path, f"exactly one of mean, CLS or last-token pooling is supported, got {modes + others or 'none'}"
        )
    return modes[0], bool(cfg.get("include_prompt", True))


# ---- tensors ----


class _Weights:
    """Named tensors of one safetensors folder as views over its mmap."""

    def __init__(self, folder: Path, entries: dict):
        self.folder, self.entries = folder, entries
        self.maps: dict[Path, mmap.mmap] = {}

    def has(self, name: str) -> bool:
        return name in self.entries

    def tensor(self, name: str) -> Tensor:
        if name not in self.entries:
            raise ModelLoadError(self.folder, f"tensor {name} is missing")
        file, e = self.entries[name]
        if e.dtype not in DTYPES:
            raise ModelLoadError(file, f"tensor {name} has dtype {e.dtype} (supported: {', '.join(DTYPES)})")
        if file not in self.maps:
            with open(file, "rb") as f:
                self.maps[file] = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        np_dtype, type_name = DTYPES[e.dtype]
        rows, cols = (1, e.shape[0]) if len(e.shape) == 1 else (e.shape[0], int(np.prod(e.shape[1:])))
        data = np.frombuffer(self.maps[file], dtype=np_dtype, count=rows * cols, offset=e.start).reshape(rows, cols)
        return Tensor(name, type_name, rows, cols, data)

    def spec(self, name: str, quantize: str | None) -> tuple:
        """The matrix `name` as the encoder takes it: (type, rows, cols, data), converted for `quantize`."""
        t = self.tensor(name)
        c = convert_tensor(t, quantize)
        if c is not t:
            self.drop_pages(name)
        return (c.type, c.rows, c.cols, c.data)

    def fused(self, name: str, part_names: list[str], quantize: str | None, interleave32: bool = False) -> tuple:
        """The rows of `part_names` stacked (fused q|k|v, or gate|up interleaved per 32 rows), as spec() gives."""
        parts = [self.tensor(n) for n in part_names]
        types = {p.type for p in parts}
        if len(types) != 1:
            raise ModelLoadError(parts[0].name, f"parts of {name} have different types {sorted(types)}")
        cols = {p.cols for p in parts}
        if len(cols) != 1:
            raise ModelLoadError(parts[0].name, f"parts of {name} have different widths {sorted(cols)}")
        if interleave32:
            width = parts[0].data.shape[1]  # values, or bytes for a quantized GGUF's rows
            g, u = (p.data.reshape(p.rows // 32, 32, width) for p in parts)
            data = np.stack([g, u], axis=1).reshape(-1, width)
        else:
            data = np.concatenate([p.data for p in parts])
        for n in part_names:  # copied: the file's pages of the parts are not read again
            self.drop_pages(n)
        c = convert_tensor(Tensor(name, parts[0].type, data.shape[0], parts[0].cols, data), quantize)
        return (c.type, c.rows, c.cols, c.data)

    def drop_pages(self, name: str) -> None:
        """Unmap the resident pages of a tensor that has been copied or converted: they stay in the page cache
        (a later read faults them back in), but no longer count in this process' RSS, so loading a model and
        quantizing it holds the result, not the result plus the whole file."""
        file, e = self.entries[name]
        m = self.maps.get(file)
        if m is None:
            return
        page = mmap.PAGESIZE
        start, end = e.start // page * page, min(-(-e.end // page) * page, len(m))
        m.madvise(mmap.MADV_DONTNEED, start, end - start)

    def floats(self, name: str) -> np.ndarray:
        t = self.tensor(name)
        return to_float32(t, 0, t.rows)

    def vector(self, name: str, n: int) -> np.ndarray:
        v = self.floats(name).reshape(-1)
        if v.shape[0] != n:
            raise ModelLoadError(self.folder, f"tensor {name} has {v.shape[0]} values, expected {n}")
        return v


def _entries(folder: Path) -> dict:
    files = sorted(folder.glob("*.safetensors"))
    if len(files) != 1:
        raise ModelLoadError(folder, f"expected one model.safetensors, found {len(files)} .safetensors files")
    found = {}
    for e in read_safetensors_header(files[0]).values():
        name = e.name.removeprefix("model.")
        name = name.removeprefix("bert.")
        found[name] = (files[0], e)
    return found


def _rope_table(theta: float, head_dim: int, positions: int) -> np.ndarray:
    """(positions, head_dim/2, 2) cos and sin, as rope.c's tables: angle p * theta^(-2i/head_dim)"""
    inv = theta ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    ang = np.arange(positions, dtype=np.float64)[:, None] * inv[None, :]
    return np.stack([np.cos(ang), np.sin(ang)], axis=-1).astype(np.float32)


def _bert(raw: dict, w: _Weights, max_len: int, quantize: str | None) -> tuple[dict, dict]:
    if raw.get("hidden_act", "gelu") != "gelu" or raw.get("position_embedding_type", "absolute") != "absolute":
        raise ModelLoadError(
            w.folder,
            f"BERT with hidden_act {raw.get('hidden_act')!r} and position embeddings "
            f"{raw.get('position_embedding_type')!r} is not supported (gelu, absolute)",
        )
    dim, heads, layers = int(raw["hidden_size"]), int(raw["num_attention_heads"]), int(raw["num_hidden_layers"])
    if dim % heads:
        raise ModelLoadError(w.folder, f"hidden_size {dim} is not a multiple of num_attention_heads {heads}")
    e = "embeddings."
    positions = int(raw["max_position_embeddings"])
    types = w.floats(e + "token_type_embeddings.weight") if w.has(e + "token_type_embeddings.weight") else None
    types = np.zeros((1, dim), np.float32) if types is None else types.reshape(-1, dim)
    cfg: dict[str, Any] = {
        "arch": "bert",
        "n_types": types.shape[0],
        "vocab": int(raw["vocab_size"]),
        "dim": dim,
        "n_layers": layers,
        "n_heads": heads,
        "n_kv_heads": heads,
        "head_dim": dim // heads,
        "hidden": int(raw["intermediate_size"]),
        "max_positions": positions,
        "norm_eps": float(raw.get("layer_norm_eps", 1e-12)),
        "attn_scale": float((dim // heads) ** -0.5),
    }
    t: dict[str, Any] = {
        "tok_embd": w.spec(e + "word_embeddings.weight", quantize),
        "pos_embd": w.floats(e + "position_embeddings.weight")[:positions],
        "type_embd": types,
        "embd_norm_w": w.vector(e + "LayerNorm.weight", dim),
        "embd_norm_b": w.vector(e + "LayerNorm.bias", dim),
    }
    for i in range(layers):
        p, o = f"encoder.layer.{i}.", f"blk.{i}."
        a = p + "attention.self."
        # Under --quantize Wq|Wk are quantized and Wv stays in float: 8-bit Wv (weights and activation blocks) takes
        # MiniLM's worst of 200 sentences from cosine 0.99918 (the rest in Q8_0) to 0.99832, its weights alone to
        # 0.99892; with Wq|Wk in Q8_0 the engine's worst is 0.99923 (Wv f32) or 0.99912 (Wv bf16, which the Embedder
        # picks where bf16 dot products are fast). Float panels run ~2.4x slower per row than int8 ones.
        qkv = [a + n + ".weight" for n in ("query", "key", "value")]
        if quantize is None:
            t[o + "wqkv"] = w.fused(o + "wqkv", qkv, None)
        else:
            t[o + "wqkv"] = w.fused(o + "wqk", qkv[:2], quantize)
            t[o + "wqkv_f"] = w.spec(qkv[2], None)
        t[o + "bqkv"] = np.concatenate([w.vector(a + n + ".bias", dim) for n in ("query", "key", "value")])
        t[o + "wo"] = w.spec(p + "attention.output.dense.weight", quantize)
        t[o + "bo"] = w.vector(p + "attention.output.dense.bias", dim)
        t[o + "norm1_w"] = w.vector(p + "attention.output.LayerNorm.weight", dim)
        t[o + "norm1_b"] = w.vector(p + "attention.output.LayerNorm.bias", dim)
        t[o + "wup"] = w.spec(p + "intermediate.dense.weight", quantize)
        t[o + "bup"] = w.vector(p + "intermediate.dense.bias", cfg["hidden"])
        t[o + "wdown"] = w.spec(p + "output.dense.weight", quantize)
        t[o + "bdown"] = w.vector(p + "output.dense.bias", dim)
        t[o + "norm2_w"] = w.vector(p + "output.LayerNorm.weight", dim)
        t[o + "norm2_b"] = w.vector(p + "output.LayerNorm.bias", dim)
    return cfg, t


def _gemma3(raw: dict, w: _Weights, max_len: int, quantize: str | None, norm_shift: float = 1.0) -> tuple[dict, dict]:
    """norm_shift: what Gemma's RMSNorm adds to its stored weights (a GGUF file stores them shifted already: 0)"""
    for key in ("attn_logit_softcapping", "final_logit_softcapping", "rope_scaling"):
        if raw.get(key) is not None:
            raise ModelLoadError(w.folder, f"{key} is set; inferd's Gemma 3 encoder does not support it")
    if raw.get("hidden_activation", "gelu_pytorch_tanh") != "gelu_pytorch_tanh":
        raise ModelLoadError(w.folder, f"hidden_activation {raw.get('hidden_activation')!r} is not supported")
    dim, layers = int(raw["hidden_size"]), int(raw["num_hidden_layers"])
    heads, kv_heads, hd = int(raw["num_attention_heads"]), int(raw["num_key_value_heads"]), int(raw["head_dim"])
    types = raw.get("layer_types") or ["sliding_attention"] * layers
    if len(types) != layers:
        raise ModelLoadError(w.folder, f"layer_types lists {len(types)} layers, num_hidden_layers is {layers}")
    positions = max_len
    cfg: dict[str, Any] = {
        "arch": "gemma3",
        "vocab": int(raw["vocab_size"]),
        "dim": dim,
        "n_layers": layers,
        "n_heads": heads,
        "n_kv_heads": kv_heads,
        "head_dim": hd,
        "hidden": int(raw["intermediate_size"]),
        "max_positions": positions,
        "norm_eps": float(raw.get("rms_norm_eps", 1e-6)),
        "attn_scale": float(raw.get("query_pre_attn_scalar", hd)) ** -0.5,
        "embed_scale": float(np.float32(dim**0.5)),
        # transformers' Gemma3TextConfig turns a bidirectional model's sliding_window W into W // 2 + 1 (keys within
        # W / 2 positions either side: EmbeddingGemma's 512 is 256 each way, as llama.cpp's symmetric window too)
        "sliding_window": int(raw.get("sliding_window") or 0) // 2 + 1 if raw.get("sliding_window") else 0,
        "sliding_layers": [i for i, k in enumerate(types) if k == "sliding_attention"],
    }
    t: dict[str, Any] = {
        "tok_embd": w.spec("embed_tokens.weight", quantize),
        "final_norm": norm_shift + w.vector("norm.weight", dim),
        "rope_global": _rope_table(float(raw.get("rope_theta", 1e6)), hd, positions),
        "rope_local": _rope_table(float(raw.get("rope_local_base_freq", 1e4)), hd, positions),
    }
    for i in range(layers):
        p, o = f"layers.{i}.", f"blk.{i}."
        a = p + "self_attn."
        t[o + "wqkv"] = w.fused(o + "wqkv", [a + n + "_proj.weight" for n in "qkv"], quantize)
        t[o + "wo"] = w.spec(a + "o_proj.weight", quantize)
        t[o + "wup"] = w.fused(o + "wup", [p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"], quantize, True)
        t[o + "wdown"] = w.spec(p + "mlp.down_proj.weight", quantize)
        for ours, theirs in (
            ("attn_norm", "input_layernorm"),
            ("post_attn_norm", "post_attention_layernorm"),
            ("ffn_norm", "pre_feedforward_layernorm"),
            ("post_ffn_norm", "post_feedforward_layernorm"),
        ):
            t[o + ours] = norm_shift + w.vector(p + theirs + ".weight", dim)
        t[o + "q_norm"] = norm_shift + w.vector(a + "q_norm.weight", hd)
        t[o + "k_norm"] = norm_shift + w.vector(a + "k_norm.weight", hd)
    return cfg, t


def _dense(folder: Path, j: int, in_dim: int, tensors: dict) -> int:
    """A sentence-transformers Dense module -> tensors['dense.{j}'] (+ '.bias'); returns its output size"""
    cfg = _json(folder / "config.json")
    act = cfg.get("activation_function", IDENTITY[0])
    if act not in IDENTITY:
        raise ModelLoadError(folder / "config.json", f"Dense activation {act!r} is not supported (Identity only)")
    if cfg.get("in_features") != in_dim:
        raise ModelLoadError(
            folder / "config.json",
            f"in_features {cfg.get('in_features')} does not follow the previous module's {in_dim} outputs",
        )
    w = _Weights(folder, _entries(folder))
    weight = w.tensor("linear.weight")
    if weight.cols != in_dim or weight.rows != cfg.get("out_features"):
        raise ModelLoadError(
            folder,
            f"linear.weight is ({weight.rows}, {weight.cols}), config says ({cfg.get('out_features')}, {in_dim})",
        )
    tensors[f"dense.{j}"] = (weight.type, weight.rows, weight.cols, weight.data)
    if cfg.get("bias", True) and w.has("linear.bias"):
        tensors[f"dense.{j}.bias"] = w.vector("linear.bias", int(weight.rows))
    return weight.rows
