"""inferd.text.grammar.vocabulary: the mask covers the model's logits, and ids past the tokenizer are never allowed."""
from __future__ import annotations

import numpy as np

from inferd.text.grammar import json_schema_grammar, mask_words


def test_padded_vocabulary_rows_are_never_allowed(compilers, tokenizers):
    """The mask covers the model's logits (tokenizer size + 40 here); ids past the tokenizer are empty tokens."""
    c, tok = compilers["bpe-gguf"], tokenizers["bpe-gguf"]
    assert c.mask_words() == mask_words(tok.vocab_size + 40)
    m = c.compile_sync(json_schema_grammar({"type": "string"}, "guided_json")).new_matcher()
    row = np.zeros(c.mask_words(), np.uint32)
    m.fill_mask(row)
    bits = np.unpackbits(row.view(np.uint8), bitorder="little")[:c.vocab_size]
    assert bits[tok.vocab_size:].sum() == 0
    assert bits[:tok.vocab_size].sum() > 0
