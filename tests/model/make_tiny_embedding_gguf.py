"""Tiny embedding GGUFs written straight from a tiny random folder (make_tiny_embedding.py) with the `gguf` writer,
under the names, shapes and metadata llama.cpp's convert_hf_to_gguf.py writes for `bert` and `gemma-embedding`
(checked against its output on the real MiniLM and EmbeddingGemma in tests/model/test_embedding_gguf_real.py), so
the CI tests need neither torch nor the converter.

    path = write_tiny_embedding_gguf(folder, tmp_path / "tiny.gguf", outtype="F16")

Gemma's GGUF carries a SentencePiece-style vocabulary over the folder's words (the tiny folder's own tokenizer is
WordPiece): compare the two by token ids there.
"""
from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
from gguf.quants import quantize
from safetensors.numpy import load_file

from tests.model.make_tiny_embedding import SPECIALS

BERT = {"embeddings.word_embeddings.weight": "token_embd.weight",
        "embeddings.position_embeddings.weight": "position_embd.weight",
        "embeddings.token_type_embeddings.weight": "token_types.weight",
        "embeddings.LayerNorm.weight": "token_embd_norm.weight", "embeddings.LayerNorm.bias": "token_embd_norm.bias"}
BERT_LAYER = {"attention.self.query": "attn_q", "attention.self.key": "attn_k", "attention.self.value": "attn_v",
              "attention.output.dense": "attn_output", "attention.output.LayerNorm": "attn_output_norm",
              "intermediate.dense": "ffn_up", "output.dense": "ffn_down", "output.LayerNorm": "layer_output_norm"}
GEMMA = {"embed_tokens.weight": "token_embd.weight", "norm.weight": "output_norm.weight"}
GEMMA_LAYER = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
               "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
               "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
               "input_layernorm": "attn_norm", "post_attention_layernorm": "post_attention_norm",
               "pre_feedforward_layernorm": "ffn_norm", "post_feedforward_layernorm": "post_ffw_norm"}
POOLING = {"mean": 1, "cls": 2, "last": 3}


def _gguf_name(name: str, arch: str) -> str:
    fixed, per_layer, prefix = (BERT, BERT_LAYER, "encoder.layer.") if arch == "bert" else \
        (GEMMA, GEMMA_LAYER, "layers.")
    if name in fixed:
        return fixed[name]
    rest = name.removeprefix(prefix)
    layer, _, tail = rest.partition(".")
    module, _, kind = tail.rpartition(".")
    return f"blk.{layer}.{per_layer[module]}.{kind}"


def _add(writer: gguf.GGUFWriter, name: str, data: np.ndarray, outtype: str) -> None:
    """2-D weights in `outtype` (the converter's rule: 1-D tensors and norms stay F32)."""
    data = np.ascontiguousarray(data, np.float32)
    if data.ndim == 1 or outtype == "F32":
        writer.add_tensor(name, data)
    elif outtype == "F16":
        writer.add_tensor(name, data.astype(np.float16))
    else:
        qtype = gguf.GGMLQuantizationType[outtype]
        writer.add_tensor(name, quantize(data, qtype), raw_dtype=qtype)


def _nomic_tensors(t: dict[str, np.ndarray], n_layers: int) -> dict[str, np.ndarray]:
    """nomic-bert's GGUF names: q, k, v fused into attn_qkv, the gate as ffn_gate"""
    out = {BERT[n]: v for n, v in t.items() if n in BERT}
    for i in range(n_layers):
        p, o = f"encoder.layer.{i}.", f"blk.{i}."
        out[o + "attn_qkv.weight"] = np.concatenate([t[p + f"attention.self.{n}.weight"]
                                                     for n in ("query", "key", "value")])
        out[o + "ffn_gate.weight"] = t[p + "intermediate.gate.weight"]
        for theirs, ours in BERT_LAYER.items():
            for kind in ("weight", "bias"):
                if f"{p}{theirs}.{kind}" in t and not theirs.startswith("attention.self"):
                    out[f"{o}{ours}.{kind}"] = t[f"{p}{theirs}.{kind}"]
    return out


def write_tiny_embedding_gguf(folder: Path, out: Path, outtype: str = "F32") -> Path:
    cfg = json.loads((folder / "config.json").read_text())
    arch = {"bert": "bert", "nomic_bert": "nomic-bert"}.get(cfg["model_type"], "gemma-embedding")
    tok = json.loads((folder / "tokenizer.json").read_text())["model"]["vocab"]
    tokens = [t for t, _ in sorted(tok.items(), key=lambda kv: kv[1])]
    pool = json.loads((folder / "1_Pooling" / "config.json").read_text())
    pooling = next(k for k, key in (("mean", "pooling_mode_mean_tokens"), ("cls", "pooling_mode_cls_token"),
                                    ("last", "pooling_mode_lasttoken")) if pool.get(key))
    w = gguf.GGUFWriter(str(out), arch)
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_pooling_type(gguf.PoolingType(POOLING[pooling]))
    w.add_causal_attention(False)
    types = [gguf.TokenType.CONTROL if t in SPECIALS else gguf.TokenType.NORMAL for t in tokens]
    if arch in ("bert", "nomic-bert"):
        if arch == "nomic-bert":
            w.add_rope_freq_base(cfg["rotary_emb_base"])
        w.add_layer_norm_eps(cfg["layer_norm_eps"])
        w.add_token_type_count(cfg["type_vocab_size"])
        w.add_tokenizer_model("bert")
        w.add_token_list([t if t in SPECIALS else t[2:] if t.startswith("##") else "\u2581" + t for t in tokens])
        w.add_bos_token_id(tokens.index("[CLS]"))
        w.add_eos_token_id(tokens.index("[SEP]"))
        w.add_sep_token_id(tokens.index("[SEP]"))
        w.add_unk_token_id(tokens.index("[UNK]"))
    else:
        w.add_head_count_kv(cfg["num_key_value_heads"])
        w.add_key_length(cfg["head_dim"])
        w.add_value_length(cfg["head_dim"])
        w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
        w.add_rope_freq_base(cfg["rope_theta"])
        w.add_rope_freq_base_swa(cfg["rope_local_base_freq"])
        w.add_sliding_window(cfg["sliding_window"])
        # the tiny folder alternates sliding and global layers: say so (llama.cpp's default is five to one)
        w.add_sliding_window_pattern([t == "sliding_attention" for t in cfg["layer_types"]])
        w.add_tokenizer_model("llama")
        # words after a space carry SentencePiece's "▁"; single letters stay bare, so any text has its pieces
        w.add_token_list([t if t in SPECIALS or len(t) == 1 else "\u2581" + t for t in tokens])
        w.add_token_scores([0.0 if t in SPECIALS else -float(i) for i, t in enumerate(tokens)])
        w.add_bos_token_id(tokens.index("<bos>"))
        w.add_eos_token_id(tokens.index("<eos>"))
        w.add_unk_token_id(tokens.index("[UNK]"))
        w.add_add_space_prefix(False)
    w.add_token_types(types)
    w.add_add_bos_token(True)
    w.add_add_eos_token(True)
    weights = load_file(str(folder / "model.safetensors"))
    if arch == "nomic-bert":
        for name, data in _nomic_tensors(weights, cfg["num_hidden_layers"]).items():
            _add(w, name, data, outtype)
        weights = {}
    for name, data in weights.items():
        if arch != "bert" and name.endswith("norm.weight"):
            data = data + np.float32(1.0)     # the converter stores Gemma's 1 + w
        _add(w, _gguf_name(name, "bert" if arch == "bert" else "gemma"), data, outtype)
    modules = json.loads((folder / "modules.json").read_text())
    dense = [m["path"] for m in modules if m["type"].endswith("Dense")]
    for j, sub in enumerate(dense):
        d = load_file(str(folder / sub / "model.safetensors"))
        name = f"dense_{j + 2}"
        w.add_dense_features_dims(name, d["linear.weight"].shape[1], d["linear.weight"].shape[0])
        _add(w, f"{name}.weight", d["linear.weight"], outtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out
