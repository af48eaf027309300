"""Fill-in-the-middle prompts: the FIM tokens from GGUF metadata or the vocabulary's known texts, in
prefix-suffix-middle order; a clear error for a model without them. The real Qwen2.5-Coder vocabulary where the
file is present."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from inferd.text.fim import FimUnsupported, fim_prompt_ids, fim_token_ids
from inferd.text.tokenizer import Tokenizer

QWEN = Path(os.environ.get("INFERD_TEST_MODELS", Path.home() / ".cache/inferd-test-models")) / \
    "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"


def meta(**over):
    tokens = ["a", "b", "ab", " ", "<PRE>", "<SUF>", "<MID>", "<s>"]
    m = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "gpt-2", "tokenizer.ggml.tokens": tokens,
         "tokenizer.ggml.token_type": [1, 1, 1, 1, 3, 3, 3, 3], "tokenizer.ggml.merges": ["a b"],
         "tokenizer.ggml.bos_token_id": 7}
    m.update(over)
    return m


def test_metadata_ids_win_over_texts():
    tok = Tokenizer.from_gguf(meta(**{"tokenizer.ggml.fim_pre_token_id": 6, "tokenizer.ggml.fim_suf_token_id": 5,
                                      "tokenizer.ggml.fim_mid_token_id": 4}))
    assert fim_token_ids(tok) == (6, 5, 4)
    older = Tokenizer.from_gguf(meta(**{"tokenizer.ggml.prefix_token_id": 5, "tokenizer.ggml.suffix_token_id": 6,
                                        "tokenizer.ggml.middle_token_id": 4}))
    assert fim_token_ids(older) == (5, 6, 4)


def test_known_texts_and_prompt_order_with_bos():
    tok = Tokenizer.from_gguf(meta(**{"tokenizer.ggml.add_bos_token": True}))
    assert fim_token_ids(tok) == (4, 5, 6)
    assert fim_prompt_ids(tok, "ab", "ba") == [7, 4, 2, 5, 1, 0, 6]


def test_model_without_fim_tokens_is_refused_naming_suffix():
    tok = Tokenizer.from_gguf(meta(**{"tokenizer.ggml.tokens": ["a", "b", "ab", " ", "x", "y", "z", "<s>"]}))
    assert fim_token_ids(tok) is None
    with pytest.raises(FimUnsupported, match="no fill-in-the-middle tokens") as e:
        fim_prompt_ids(tok, "a", "b")
    assert e.value.param == "suffix"


@pytest.mark.skipif(not QWEN.is_file(), reason=f"{QWEN} not fetched (../shared/models/fetch.sh)")
def test_qwen_coder_fim_prompt():
    from inferd.model.gguf import validate_gguf

    tok = Tokenizer.from_gguf(validate_gguf(str(QWEN)).metadata)
    ids = fim_prompt_ids(tok, "def add(a, b):\n    ", "\n\nprint(add(1, 2))\n")
    assert tok.decode(ids, skip_special=False) == ("<|fim_prefix|>def add(a, b):\n    <|fim_suffix|>\n\n"
                                                   "print(add(1, 2))\n<|fim_middle|>")
    assert ids[0] == tok.hf.token_to_id("<|fim_prefix|>") and ids[-1] == tok.hf.token_to_id("<|fim_middle|>")
