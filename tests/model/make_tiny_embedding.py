"""Tiny random embedding models as sentence-transformers folders (BERT and bidirectional Gemma 3; nomic-bert in BERT's
names, as the source of tiny nomic-bert GGUFs), each with a small WordPiece tokenizer, for tests that must run
without the real files.

    folder = write_tiny_embedding(tmp_path / "bert", arch="bert", dense=[48], normalize=True)

Weights are drawn from a generator seeded by (seed, name); values are scaled so that activations stay in the
range real models have (a random LayerNorm'd network with unit-variance weights would saturate everything).
"""
from __future__ import annotations

import json
import zlib
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

WORDS = ("the a an of to in on and or is was are be it this that with for as at by from cat dog fox sat ran "
         "quick brown lazy jumps over under river bank money city market stocks fell rose sharply query "
         "document search result text title none task hello world good bad red blue green").split()
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "<bos>", "<eos>"]


def _rand(seed: int, name: str, shape: tuple[int, ...], scale: float) -> np.ndarray:
    rng = np.random.default_rng(zlib.crc32(f"{seed}:{name}".encode()))
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def write_tokenizer(path: Path, arch: str) -> int:
    """A WordPiece tokenizer over WORDS (lower-cased, BERT pre-tokenization); BERT wraps inputs in [CLS] .. [SEP],
    Gemma in <bos> .. <eos>. Returns the vocabulary size."""
    tokens = (SPECIALS + list(WORDS) + [f"##{c}" for c in "abcdefghijklmnopqrstuvwxyz"]
              + list("abcdefghijklmnopqrstuvwxyz.,?!"))
    vocab = {t: i for i, t in enumerate(dict.fromkeys(tokens))}
    tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    first, last = ("[CLS]", "[SEP]") if arch in ("bert", "nomic") else ("<bos>", "<eos>")
    tok.post_processor = processors.TemplateProcessing(single=f"{first} $A {last}", pair=f"{first} $A {last} $B {last}",
                                                       special_tokens=[(first, vocab[first]), (last, vocab[last])])
    tok.save(str(path))
    return len(vocab)


def write_tiny_embedding(folder: Path, arch: str = "bert", *, dim: int = 64, n_layers: int = 2, n_heads: int = 2,
                         n_kv_heads: int = 1, head_dim: int = 32, hidden: int = 96, max_seq_length: int = 40,
                         pooling: str = "mean", dense: list[int] | None = None, dense_bias: bool = True,
                         normalize: bool = True, sliding_window: int = 6, seed: int = 0,
                         prompts: dict[str, str] | None = None, matryoshka_dims: list[int] | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    vocab = write_tokenizer(folder / "tokenizer.json", arch)
    t: dict[str, np.ndarray] = {}
    s = 1.0 / np.sqrt(dim)
    if arch in ("bert", "nomic"):
        n_kv_heads, head_dim = n_heads, dim // n_heads
        config = {"architectures": ["BertModel"], "model_type": "bert", "hidden_size": dim,
                  "num_hidden_layers": n_layers, "num_attention_heads": n_heads, "intermediate_size": hidden,
                  "hidden_act": "gelu",
                  "max_position_embeddings": 64, "type_vocab_size": 2, "vocab_size": vocab, "layer_norm_eps": 1e-12,
                  "position_embedding_type": "absolute"}
        t["embeddings.word_embeddings.weight"] = _rand(seed, "word", (vocab, dim), 0.5)
        t["embeddings.position_embeddings.weight"] = _rand(seed, "pos", (64, dim), 0.2)
        t["embeddings.token_type_embeddings.weight"] = _rand(seed, "type", (2, dim), 0.2)
        t["embeddings.LayerNorm.weight"] = 1 + _rand(seed, "lnw", (dim,), 0.1)
        t["embeddings.LayerNorm.bias"] = _rand(seed, "lnb", (dim,), 0.1)
        if arch == "nomic":
            # nomic-bert in BERT's names (test-only: its own folders use other names and custom code): rotary
            # positions, no position table, a gate beside the up projection, linear layers without biases
            config |= {"model_type": "nomic_bert", "rotary_emb_base": 1000.0, "activation_function": "swiglu"}
            del t["embeddings.position_embeddings.weight"]
        for i in range(n_layers):
            p = f"encoder.layer.{i}."
            if arch == "nomic":
                t[p + "intermediate.gate.weight"] = _rand(seed, p + "gate", (hidden, dim), s)
            for n in ("query", "key", "value"):
                t[p + f"attention.self.{n}.weight"] = _rand(seed, p + n, (dim, dim), s)
                t[p + f"attention.self.{n}.bias"] = _rand(seed, p + n + "b", (dim,), 0.1)
            t[p + "attention.output.dense.weight"] = _rand(seed, p + "o", (dim, dim), s)
            t[p + "attention.output.dense.bias"] = _rand(seed, p + "ob", (dim,), 0.1)
            t[p + "intermediate.dense.weight"] = _rand(seed, p + "up", (hidden, dim), s)
            t[p + "intermediate.dense.bias"] = _rand(seed, p + "upb", (hidden,), 0.1)
            t[p + "output.dense.weight"] = _rand(seed, p + "down", (dim, hidden), 1 / np.sqrt(hidden))
            t[p + "output.dense.bias"] = _rand(seed, p + "downb", (dim,), 0.1)
            for n in ("attention.output.LayerNorm", "output.LayerNorm"):
                t[p + n + ".weight"] = 1 + _rand(seed, p + n + "w", (dim,), 0.1)
                t[p + n + ".bias"] = _rand(seed, p + n + "b", (dim,), 0.1)
        if arch == "nomic":
            for name in [n for n in t if n.startswith("encoder.") and n.endswith(".bias") and "LayerNorm" not in n]:
                del t[name]
    else:
        types = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n_layers)]
        config = {"architectures": ["Gemma3TextModel"], "model_type": "gemma3_text", "hidden_size": dim,
                  "num_hidden_layers": n_layers, "num_attention_heads": n_heads, "num_key_value_heads": n_kv_heads,
                  "head_dim": head_dim, "intermediate_size": hidden, "hidden_activation": "gelu_pytorch_tanh",
                  "max_position_embeddings": 128, "vocab_size": vocab, "rms_norm_eps": 1e-6,
                  "query_pre_attn_scalar": head_dim, "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
                  "sliding_window": sliding_window, "layer_types": types, "use_bidirectional_attention": True,
                  "attn_logit_softcapping": None, "final_logit_softcapping": None, "rope_scaling": None}
        t["embed_tokens.weight"] = _rand(seed, "word", (vocab, dim), 0.1)
        t["norm.weight"] = _rand(seed, "norm", (dim,), 0.1)
        for i in range(n_layers):
            p = f"layers.{i}."
            t[p + "self_attn.q_proj.weight"] = _rand(seed, p + "q", (n_heads * head_dim, dim), s)
            t[p + "self_attn.k_proj.weight"] = _rand(seed, p + "k", (n_kv_heads * head_dim, dim), s)
            t[p + "self_attn.v_proj.weight"] = _rand(seed, p + "v", (n_kv_heads * head_dim, dim), s)
            t[p + "self_attn.o_proj.weight"] = _rand(seed, p + "o", (dim, n_heads * head_dim),
                                                     1 / np.sqrt(n_heads * head_dim))
            t[p + "self_attn.q_norm.weight"] = _rand(seed, p + "qn", (head_dim,), 0.1)
            t[p + "self_attn.k_norm.weight"] = _rand(seed, p + "kn", (head_dim,), 0.1)
            t[p + "mlp.gate_proj.weight"] = _rand(seed, p + "gate", (hidden, dim), s)
            t[p + "mlp.up_proj.weight"] = _rand(seed, p + "up", (hidden, dim), s)
            t[p + "mlp.down_proj.weight"] = _rand(seed, p + "down", (dim, hidden), 1 / np.sqrt(hidden))
            for n in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                      "post_feedforward_layernorm"):
                t[p + n + ".weight"] = _rand(seed, p + n, (dim,), 0.1)
    save_file(t, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": max_seq_length}))
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    (folder / "1_Pooling").mkdir(exist_ok=True)
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({
        "word_embedding_dimension": dim, "pooling_mode_mean_tokens": pooling == "mean",
        "pooling_mode_cls_token": pooling == "cls", "pooling_mode_lasttoken": pooling == "last"}))
    in_dim = dim
    for j, out in enumerate(dense or []):
        sub = f"{j + 2}_Dense"
        (folder / sub).mkdir(exist_ok=True)
        (folder / sub / "config.json").write_text(json.dumps({
            "in_features": in_dim, "out_features": out, "bias": dense_bias,
            "activation_function": "torch.nn.modules.linear.Identity"}))
        d = {"linear.weight": _rand(seed, sub, (out, in_dim), 1 / np.sqrt(in_dim))}
        if dense_bias:
            d["linear.bias"] = _rand(seed, sub + "b", (out,), 0.1)
        save_file(d, str(folder / sub / "model.safetensors"))
        modules.append({"idx": j + 2, "name": str(j + 2), "path": sub, "type": "sentence_transformers.models.Dense"})
        in_dim = out
    if normalize:
        modules.append({"idx": len(modules), "name": str(len(modules)), "path": f"{len(modules)}_Normalize",
                        "type": "sentence_transformers.models.Normalize"})
    (folder / "modules.json").write_text(json.dumps(modules))
    st: dict = {"prompts": prompts or {}, "default_prompt_name": None}
    if matryoshka_dims:
        st["matryoshka_dims"] = matryoshka_dims
    (folder / "config_sentence_transformers.json").write_text(json.dumps(st))
    return folder
