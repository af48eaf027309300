"""The vocabularies the grammar tests compile against: the tiny byte-level BPE and SentencePiece GGUFs and an HF
tokenizer.json from tests.model.make_tiny, and the real SmolLM2 file; each compiler's mask covers 40 padded ids
past its tokenizer (a model's logits may be wider than its vocabulary)."""
from __future__ import annotations

import json

import pytest

from inferd.model.gguf import validate_gguf
from inferd.text.grammar import GrammarCompiler
from inferd.text.tokenizer import Tokenizer
from tests.model.make_tiny import make_variant, tokenizer_json, variant_spec


@pytest.fixture(scope="session")
def tokenizers(tiny_dir, smollm2_path):
    bpe = Tokenizer.from_gguf(validate_gguf(str(make_variant("llama-gguf-q8_0", tiny_dir))).metadata)
    spm = Tokenizer.from_gguf(validate_gguf(str(make_variant("llama-spm-gguf-q8_0", tiny_dir))).metadata)
    folder = tiny_dir / "grammar-hf-tok"
    folder.mkdir(exist_ok=True)
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer_json(variant_spec("llama-gguf-q8_0"))))
    hf = Tokenizer.from_hf_files(folder / "tokenizer.json", extra_eos_ids=[2])
    smol = Tokenizer.from_gguf(validate_gguf(str(smollm2_path)).metadata)
    return {"bpe-gguf": bpe, "spm-gguf": spm, "hf-json": hf, "smollm2": smol}


@pytest.fixture(scope="session")
def compilers(tokenizers):
    out = {name: GrammarCompiler(tok, tok.vocab_size + 40) for name, tok in tokenizers.items()}  # padded vocab
    yield out
    for c in out.values():
        c.close()
