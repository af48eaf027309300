"""Embedding models from GGUF files, as llama.cpp's convert_hf_to_gguf.py writes them and Ollama ships them:
architectures `bert` (MiniLM, BGE, ...), `nomic-bert` (nomic-embed-text v1 and v1.5) and `gemma-embedding`
(EmbeddingGemma).

The file's metadata becomes the config.json keys the folder loader reads and its tensor names the folder's, so the
weights go through the same code (embedding.py's _bert and _gemma3) into the same encoder layout: a GGUF and the
folder it was made from give the same vectors. nomic-bert, which inferd reads from GGUF only, is BERT with rotary
positions (no position table), q, k and v fused in the file, a SwiGLU FFN and no biases on its linear layers
(_nomic_bert). What the file says:
- `{arch}.pooling_type`: 1 mean, 2 CLS, 3 last token (llama.cpp's enum); absent: mean.
- normalization is not stored in GGUF; vectors are L2-normalized, as llama-server and Ollama return them.
- `{arch}.context_length` is the longest input (a folder's sentence_bert_config.json may say less).
- the tokenizer from the vocabulary: WordPiece for the BERTs (tokenizer.ggml.model "bert": word-initial tokens
  carry a leading "▁", continuations none), SentencePiece for Gemma ("llama"); the special tokens around an
  input from add_bos_token / add_eos_token.
- EmbeddingGemma's Dense layers when converted with --sentence-transformers-dense-modules (dense_2, dense_3).
Prompts (a folder's config_sentence_transformers.json) are not stored in GGUF: input_type adds no prefix.
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import AddedToken, models, normalizers, pre_tokenizers, processors
from tokenizers import Tokenizer as HFTokenizer

from ..text.tokenizer import CONTROL, Tokenizer
from .embedding import KNOWN_MATRYOSHKA, EmbeddingModel, _bert, _gemma3, _rope_table, _Weights, load_embedding_model
from .errors import ModelLoadError
from .gguf import TensorInfo, _tensor_data, _to_tensor, read_architecture, validate_gguf
from .quant import FLOAT_TYPES, check_quantize_arg, convert_tensor, to_float32
from .tensor import Tensor

ENCODER_ARCHS = ("bert", "nomic-bert", "gemma-embedding")
BERT_ARCHS = ("bert", "nomic-bert")
POOLING_TYPES = {1: "mean", 2: "cls", 3: "last"}  # llama.cpp's LLAMA_POOLING_TYPE_*
GEMMA_SWA_PATTERN = 6  # llama.cpp's default for gemma-embedding: five sliding layers, then a global one

# the folder's tensor names (embedding.py reads them) -> GGUF's; {i} is the layer
BERT_NAMES = {
    "embeddings.word_embeddings.weight": "token_embd.weight",
    "embeddings.position_embeddings.weight": "position_embd.weight",
    "embeddings.token_type_embeddings.weight": "token_types.weight",
    "embeddings.LayerNorm.weight": "token_embd_norm.weight",
    "embeddings.LayerNorm.bias": "token_embd_norm.bias",
}
BERT_LAYER_NAMES = {
    "attention.self.query": "attn_q",
    "attention.self.key": "attn_k",
    "attention.self.value": "attn_v",
    "attention.output.dense": "attn_output",
    "attention.output.LayerNorm": "attn_output_norm",
    "intermediate.dense": "ffn_up",
    "output.dense": "ffn_down",
    "output.LayerNorm": "layer_output_norm",
}
GEMMA_NAMES = {"embed_tokens.weight": "token_embd.weight", "norm.weight": "output_norm.weight"}
GEMMA_LAYER_NAMES = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "post_attention_norm",
    "pre_feedforward_layernorm": "ffn_norm",
    "post_feedforward_layernorm": "post_ffw_norm",
}


def gguf_architecture(path: str | os.PathLike[str]) -> str | None:
    """general.architecture of a readable GGUF file, else None."""
    p = Path(path)
    if not p.is_file() or p.suffix.lower() != ".gguf":
        return None
    try:
        arch = read_architecture(str(p))
    except ModelLoadError:
        return None
    return arch if isinstance(arch, str) else None


def is_embedding_gguf(path: str | os.PathLike[str]) -> bool:
    return gguf_architecture(path) in ENCODER_ARCHS


class _GGUFWeights(_Weights):
    """The file's tensors under the folder's names, as embedding.py's _Weights serves them."""

    def __init__(self, path: Path, infos: dict[str, TensorInfo], names: dict[str, str]):
        super().__init__(path, {})
        self.infos, self.names = infos, names
        with open(path, "rb") as f:
            self.map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)

    def has(self, name: str) -> bool:
        return self.names.get(name, name) in self.infos

    def tensor(self, name: str) -> Tensor:
        gguf_name = self.names.get(name, name)
        info = self.infos.get(gguf_name)
        if info is None:
            raise ModelLoadError(self.folder, f"tensor {gguf_name} is missing")
        if len(info.dims) > 2:
            raise ModelLoadError(self.folder, f"tensor {gguf_name} has {len(info.dims)} dimensions")
        return _to_tensor(gguf_name, _tensor_data(self.map, info), info)

    def drop_pages(self, name: str) -> None:
        info = self.infos.get(self.names.get(name, name))
        if info is None:
            return
        page = mmap.PAGESIZE
        start, end = info.offset // page * page, min(-(-(info.offset + info.nbytes) // page) * page, len(self.map))
        self.map.madvise(mmap.MADV_DONTNEED, start, end - start)


def _names(arch: str, n_layers: int) -> dict[str, str]:
    if arch == "nomic-bert":  # read under the file's own names
        return {}
    fixed, per_layer, prefix = (
        (BERT_NAMES, BERT_LAYER_NAMES, "encoder.layer.{i}.")
        if arch == "bert"
        else (GEMMA_NAMES, GEMMA_LAYER_NAMES, "layers.{i}.")
    )
    out = dict(fixed)
    for i in range(n_layers):
        for theirs, ours in per_layer.items():
            for kind in ("weight", "bias"):
                out[f"{prefix.format(i=i)}{theirs}.{kind}"] = f"blk.{i}.{ours}.{kind}"
    return out


def _config(arch: str, meta: dict[str, Any], vocab: int) -> dict[str, Any]:
    """The file's metadata as the config.json keys embedding.py reads."""
    key = arch

    def need(name: str) -> Any:
        value = meta.get(f"{key}.{name}")
        if value is None:
            raise KeyError(f"{key}.{name} is missing")
        return value

    layers = int(need("block_count"))
    raw: dict[str, Any] = {
        "hidden_size": int(need("embedding_length")),
        "num_hidden_layers": layers,
        "num_attention_heads": int(need("attention.head_count")),
        "intermediate_size": int(need("feed_forward_length")),
        "max_position_embeddings": int(need("context_length")),
        "vocab_size": vocab,
    }
    if arch in BERT_ARCHS:
        return raw | {
            "rope_theta": float(meta.get(f"{key}.rope.freq_base", 1000.0)),
            "model_type": "bert",
            "layer_norm_eps": float(need("attention.layer_norm_epsilon")),
            "hidden_act": "gelu",
            "position_embedding_type": "absolute",
        }
    head_dim = int(need("attention.key_length"))
    pattern = meta.get(f"{key}.attention.sliding_window_pattern", GEMMA_SWA_PATTERN)
    if isinstance(pattern, list):  # one flag per layer
        sliding = [bool(p) for p in pattern][:layers]
    else:
        sliding = [int(pattern) == 0 or i % int(pattern) < int(pattern) - 1 for i in range(layers)]
    scale = meta.get(f"{key}.attention.scale")
    return raw | {
        "model_type": "gemma3_text",
        "use_bidirectional_attention": True,
        "num_key_value_heads": int(meta.get(f"{key}.attention.head_count_kv", raw["num_attention_heads"])),
        "head_dim": head_dim,
        "rms_norm_eps": float(need("attention.layer_norm_rms_epsilon")),
        "query_pre_attn_scalar": float(scale) ** -2 if scale else head_dim,
        "rope_theta": float(meta.get(f"{key}.rope.freq_base", 1e6)),
        "rope_local_base_freq": float(meta.get(f"{key}.rope.freq_base_swa", 1e4)),
        "sliding_window": int(need("attention.sliding_window")),
        "layer_types": ["sliding_attention" if s else "full_attention" for s in sliding],
    }


def _wordpiece(meta: dict[str, Any]) -> HFTokenizer:
    """BERT's tokenizer from the vocabulary: llama.cpp's converter marks word-initial pieces with "▁" and strips
    "##" from continuations; this undoes that."""
    tokens, types = meta["tokenizer.ggml.tokens"], meta.get("tokenizer.ggml.token_type") or []
    vocab: dict[str, int] = {}
    for i, tok in enumerate(tokens):
        control = i < len(types) and types[i] == CONTROL
        piece = tok if control else tok[1:] if tok.startswith("\u2581") else "##" + tok
        vocab.setdefault(piece, i)
    unk_id = meta.get("tokenizer.ggml.unknown_token_id")
    unk = tokens[int(unk_id)] if isinstance(unk_id, int) and 0 <= unk_id < len(tokens) else "[UNK]"
    hf = HFTokenizer(models.WordPiece(vocab, unk_token=unk, max_input_chars_per_word=100))
    lowercase = bool(meta.get("tokenizer.ggml.normalizer.lowercase", True))
    strip = meta.get("tokenizer.ggml.normalizer.strip_accents")
    hf.normalizer = normalizers.BertNormalizer(
        clean_text=True,
        handle_chinese_chars=True,
        strip_accents=None if strip is None else bool(strip),
        lowercase=lowercase,
    )
    hf.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    specials = [t for t, ty in zip(tokens, types) if ty == CONTROL]
    hf.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    return hf


def _tokenizer(arch: str, meta: dict[str, Any]) -> HFTokenizer:
    tokens = meta.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, list) or not tokens:
        raise ValueError("tokenizer.ggml.tokens is missing or empty")
    kind = meta.get("tokenizer.ggml.model")
    if kind == "bert":
        hf = _wordpiece(meta)
    elif kind == "llama":
        hf = Tokenizer.from_gguf(meta).hf
    else:
        raise ValueError(f"tokenizer model {kind!r} is not supported for {arch} (supported: bert, llama)")

    def special(key: str) -> tuple[str, int] | None:
        i = meta.get(key)
        return (tokens[i], i) if isinstance(i, int) and 0 <= i < len(tokens) else None

    first = special("tokenizer.ggml.bos_token_id") if meta.get("tokenizer.ggml.add_bos_token", True) else None
    last = special("tokenizer.ggml.eos_token_id") if meta.get("tokenizer.ggml.add_eos_token", True) else None
    if arch in BERT_ARCHS:  # [CLS] text [SEP]: the converter writes them as bos and eos; sep where it says
        last = special("tokenizer.ggml.seperator_token_id") or last
    a = ([first[0]] if first else []) + ["$A"] + ([last[0]] if last else [])
    b = ["$B:1"] + ([f"{last[0]}:1"] if last else [])
    hf.post_processor = processors.TemplateProcessing(
        single=" ".join(a), pair=" ".join(a + b), special_tokens=[s for s in (first, last) if s]
    )
    return hf


def _nomic_bert(raw: dict[str, Any], w: _GGUFWeights, quantize: str | None) -> tuple[dict, dict]:
    dim, heads, layers = raw["hidden_size"], raw["num_attention_heads"], raw["num_hidden_layers"]
    if dim % heads:
        raise ValueError(f"embedding_length {dim} is not a multiple of head_count {heads}")
    hd, positions = dim // heads, raw["max_position_embeddings"]
    types = w.floats("token_types.weight").reshape(-1, dim) if w.has("token_types.weight") else None
    types = np.zeros((1, dim), np.float32) if types is None else types
    cfg: dict[str, Any] = {
        "arch": "bert",
        "vocab": raw["vocab_size"],
        "dim": dim,
        "n_layers": layers,
        "n_heads": heads,
        "n_kv_heads": heads,
        "head_dim": hd,
        "hidden": raw["intermediate_size"],
        "max_positions": positions,
        "norm_eps": raw["layer_norm_eps"],
        "attn_scale": float(hd**-0.5),
        "n_types": types.shape[0],
        "rotary": True,
        "gated_ffn": True,
    }
    t: dict[str, Any] = {
        "tok_embd": w.spec("token_embd.weight", quantize),
        "rope_global": _rope_table(raw["rope_theta"], hd, positions),
        "type_embd": types,
        "embd_norm_w": w.vector("token_embd_norm.weight", dim),
        "embd_norm_b": w.vector("token_embd_norm.bias", dim),
    }
    for i in range(layers):
        o = f"blk.{i}."
        qkv = w.tensor(o + "attn_qkv.weight")
        if qkv.rows != 3 * dim or qkv.cols != dim:
            raise ValueError(f"{o}attn_qkv.weight is ({qkv.rows}, {qkv.cols}), expected ({3 * dim}, {dim})")
        if quantize and qkv.type in FLOAT_TYPES:  # as embedding.py's BERT: Wq|Wk quantized, Wv kept in float
            qk = convert_tensor(Tensor(o + "wqk", qkv.type, 2 * dim, dim, qkv.data[: 2 * dim]), quantize)
            t[o + "wqkv"] = (qk.type, qk.rows, qk.cols, qk.data)
            t[o + "wqkv_f"] = (qkv.type, dim, dim, qkv.data[2 * dim :])
        else:
            t[o + "wqkv"] = w.spec(o + "attn_qkv.weight", quantize)
        t[o + "wo"] = w.spec(o + "attn_output.weight", quantize)
        t[o + "wup"] = w.fused(o + "wup", [o + "ffn_gate.weight", o + "ffn_up.weight"], quantize, interleave32=True)
        t[o + "wdown"] = w.spec(o + "ffn_down.weight", quantize)
        t[o + "norm1_w"] = w.vector(o + "attn_output_norm.weight", dim)
        t[o + "norm1_b"] = w.vector(o + "attn_output_norm.bias", dim)
        t[o + "norm2_w"] = w.vector(o + "layer_output_norm.weight", dim)
        t[o + "norm2_b"] = w.vector(o + "layer_output_norm.bias", dim)
    return cfg, t


def load_embedding(path: str | os.PathLike[str], quantize: str | None = None) -> EmbeddingModel:
    """An embedding model from a sentence-transformers folder or a GGUF file."""
    if Path(path).is_file() and Path(path).suffix.lower() == ".gguf":
        return load_embedding_gguf(path, quantize)
    return load_embedding_model(path, quantize)


def load_embedding_gguf(path: str | os.PathLike[str], quantize: str | None = None) -> EmbeddingModel:
    root = Path(path)
    try:
        quantize = check_quantize_arg(quantize)
    except ValueError as e:
        raise ModelLoadError(root, str(e)) from e
    header = validate_gguf(str(root))
    meta = header.metadata
    arch = meta.get("general.architecture")
    if arch not in ENCODER_ARCHS:
        raise ModelLoadError(root, f"architecture {arch!r} is not an encoder inferd runs ({', '.join(ENCODER_ARCHS)})")
    key = arch
    pooling_type = meta.get(f"{key}.pooling_type", 1)
    if pooling_type not in POOLING_TYPES:
        raise ModelLoadError(root, f"{key}.pooling_type {pooling_type} is not supported (1 mean, 2 CLS, 3 last token)")
    try:
        tokenizer = _tokenizer(arch, meta)
        truncating = HFTokenizer.from_str(tokenizer.to_str())
        raw = _config(arch, meta, len(meta["tokenizer.ggml.tokens"]))
        max_len = raw["max_position_embeddings"]
        infos = {t.name: t for t in header.tensors}
        w = _GGUFWeights(root, infos, _names(arch, raw["num_hidden_layers"]))
        if arch == "bert":
            config, tensors = _bert(raw, w, max_len, quantize)
        elif arch == "nomic-bert":
            config, tensors = _nomic_bert(raw, w, quantize)
        else:
            config, tensors = _gemma3(raw, w, max_len, quantize, norm_shift=0.0)  # stored as 1 + w already
        out_dim = config["dim"]
        for j, name in enumerate(n for n in ("dense_2.weight", "dense_3.weight") if n in infos):
            t = w.tensor(name)  # the Dense chain runs in float
            if t.cols != out_dim:
                raise ValueError(f"{name} takes {t.cols} inputs, the previous layer gives {out_dim}")
            tensors[f"dense.{j}"] = ("F32", t.rows, t.cols, to_float32(t, 0, t.rows))
            out_dim = t.rows
    except ModelLoadError:
        raise
    except (KeyError, ValueError, TypeError, ArithmeticError) as e:
        raise ModelLoadError(root, f"{type(e).__name__}: {e}") from e
    config["pooling"] = POOLING_TYPES[pooling_type]
    config["normalize"] = True
    dims = KNOWN_MATRYOSHKA.get(raw["model_type"], ())
    tokenizer.no_padding()
    tokenizer.no_truncation()
    truncating.no_padding()
    truncating.enable_truncation(max_len)
    return EmbeddingModel(
        path=str(root),
        name=root.stem.lower(),
        arch=config["arch"],
        config=config,
        tensors=tensors,
        tokenizer=tokenizer,
        truncating_tokenizer=truncating,
        max_seq_length=max_len,
        dimensions=out_dim,
        matryoshka_dims=tuple(d for d in dims if d <= out_dim),
        normalize=True,
        pooling=config["pooling"],
    )
