"""Tiny random cross-encoders as sentence-transformers CrossEncoder folders (a Hugging Face
BertForSequenceClassification: `bert.*` weights, BERT's pooler, a classifier), with the tiny WordPiece tokenizer
of make_tiny_embedding.py, whose pair template gives the second text token type 1.

    folder = write_tiny_cross_encoder(tmp_path / "ce", num_labels=1)
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file, save_file
from tokenizers import Tokenizer, processors

from tests.model.make_tiny_embedding import _rand, write_tiny_embedding


def write_tiny_cross_encoder(folder: Path, *, num_labels: int = 1, pooler: bool = True, seed: int = 0,
                             activation: str | None = None, max_length: int | None = None, **bert) -> Path:
    write_tiny_embedding(folder, arch="bert", seed=seed, **bert)
    for extra in ("modules.json", "sentence_bert_config.json", "config_sentence_transformers.json"):
        (folder / extra).unlink()
    for sub in folder.iterdir():
        if sub.is_dir():
            for f in sub.iterdir():
                f.unlink()
            sub.rmdir()
    cfg = json.loads((folder / "config.json").read_text())
    dim = cfg["hidden_size"]
    t = {"bert." + k: v for k, v in load_file(str(folder / "model.safetensors")).items()}
    if pooler:
        t["bert.pooler.dense.weight"] = _rand(seed, "pooler", (dim, dim), 1 / np.sqrt(dim))
        t["bert.pooler.dense.bias"] = _rand(seed, "poolerb", (dim,), 0.1)
    t["classifier.weight"] = _rand(seed, "cls", (num_labels, dim), 2 / np.sqrt(dim))
    t["classifier.bias"] = _rand(seed, "clsb", (num_labels,), 0.3)
    save_file(t, str(folder / "model.safetensors"))
    cfg |= {"architectures": ["BertForSequenceClassification"], "pad_token_id": 0,
            "id2label": {str(i): f"LABEL_{i}" for i in range(num_labels)},
            "label2id": {f"LABEL_{i}": i for i in range(num_labels)}}
    if activation:
        cfg["sentence_transformers"] = {"activation_fn": activation}
    (folder / "config.json").write_text(json.dumps(cfg))
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    vocab = tok.get_vocab()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])])
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "BertTokenizerFast", "do_lower_case": True, "model_max_length": max_length or 64,
        "cls_token": "[CLS]", "sep_token": "[SEP]", "pad_token": "[PAD]", "unk_token": "[UNK]",
        "mask_token": "[UNK]"}))
    (folder / "special_tokens_map.json").write_text(json.dumps({
        "cls_token": "[CLS]", "sep_token": "[SEP]", "pad_token": "[PAD]", "unk_token": "[UNK]"}))
    return folder
