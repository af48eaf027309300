"""What the grammar tests share: a schema with every kind of constraint, the vocabularies they walk, and a walk
(tokens drawn with the C sampler under each step's mask, random logits, fixed seeds)."""
from __future__ import annotations

import numpy as np

from inferd import _cpu
from inferd.text.grammar import GrammarCompiler, GrammarSpec
from inferd.text.tokenizer import Tokenizer

VOCABS = ["bpe-gguf", "spm-gguf", "hf-json", "smollm2"]

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["color", "ok", "tags", "n"],
          "properties": {"color": {"enum": ["red", "green", "blue"]}, "ok": {"type": "boolean"},
                         "tags": {"type": "array", "items": {"type": "string", "maxLength": 4}, "maxItems": 2},
                         "n": {"type": "integer", "minimum": 0, "maximum": 99}}}


def walk(compiler: GrammarCompiler, tokenizer: Tokenizer, spec: GrammarSpec, seed: int, max_tokens: int = 200,
         temperature: float = 1.0):
    """Samples a whole output under the grammar with the C sampler on random logits; returns (text, matcher)."""
    rng = np.random.default_rng(seed)
    m = compiler.compile_sync(spec).new_matcher()
    row = np.zeros(compiler.mask_words(), np.uint32)
    tokens = []
    for pos in range(max_tokens):
        m.fill_mask(row)
        logits = rng.standard_normal(compiler.vocab_size).astype(np.float32) * 4
        tok = _cpu.sample(logits, {"temperature": temperature, "seed": seed}, pos, allowed=row)[0]
        assert tok >= 0, "the mask allowed nothing"
        assert m.advance(tok), m.error
        if tok in tokenizer.eos_ids:
            break
        tokens.append(tok)
        if m.is_done:
            break
    return tokenizer.decode(tokens), m
