"""The model's vocabulary as llguidance sees it (token bytes, special tokens, EOS ids, padded to the logits'
width), and the packed mask row's size in words."""

from __future__ import annotations

import json
from typing import Any

import llguidance as llg
from tokenizers import Tokenizer as HFTokenizer

from inferd.text.tokenizer import Tokenizer


def mask_words(vocab_size: int) -> int:
    """uint32 words in one packed allowed-token bitmask row (the C sampler's and llguidance's layout)."""
    return (vocab_size + 31) // 32


class _VocabForLLG:
    """What llguidance.TokenizerWrapper reads: token bytes (special tokens as their text), their ids, the EOS id,
    and a tokenize callback (llguidance tokenizes forced text with it, so its tokens must spell the text exactly)."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int):
        n = tokenizer.vocab_size
        self.tokens = [tokenizer.token_bytes(i, skip_special=False) for i in range(n)] + [b""] * (vocab_size - n)
        self.special_token_ids = sorted(i for i in tokenizer.special_ids if i < vocab_size)
        self.eos_token_id = tokenizer.eos_id if tokenizer.eos_id is not None else min(tokenizer.eos_ids, default=0)
        self.bos_token_id = tokenizer.bos_id
        self._hf = _without_prefix_space(tokenizer.hf) if tokenizer.strip_first_space else tokenizer.hf

    def __call__(self, text: str | bytes) -> list[int]:
        if isinstance(text, bytes):
            text = text.decode("utf-8", errors="replace")
        return list(self._hf.encode(text, add_special_tokens=False).ids)


def _without_prefix_space(hf: HFTokenizer) -> HFTokenizer:
    """A copy of a SentencePiece-style tokenizer that does not put "▁" in front of the text: "s-" must become
    "s" "-" for llguidance, not "▁s" "-" (which spells " s-")."""
    spec = json.loads(hf.to_str())

    def strip(node: Any) -> Any:
        if isinstance(node, dict):
            if node.get("type") == "Prepend":
                return None
            if node.get("type") == "Metaspace":
                node = {**node, "prepend_scheme": "never", "add_prefix_space": False}
            return {k: (strip(v) if k in ("normalizers", "pretokenizers") else v) for k, v in node.items()}
        if isinstance(node, list):
            return [x for x in (strip(v) for v in node) if x is not None]
        return node

    for key in ("normalizer", "pre_tokenizer"):
        if spec.get(key) is not None:
            spec[key] = strip(spec[key])
    return HFTokenizer.from_str(json.dumps(spec))


def build_lltokenizer(tokenizer: Tokenizer, vocab_size: int | None = None) -> llg.LLTokenizer:
    """llguidance's view of the model's vocabulary; vocab_size: the model's (>= the tokenizer's) logits width."""
    vocab_size = vocab_size or tokenizer.vocab_size
    if vocab_size < tokenizer.vocab_size:
        raise ValueError(f"vocab_size {vocab_size} is smaller than the tokenizer's {tokenizer.vocab_size}")
    eos = sorted(i for i in tokenizer.eos_ids if i < vocab_size)
    wrapper = llg.TokenizerWrapper(_VocabForLLG(tokenizer, vocab_size))
    return llg.LLTokenizer(wrapper, n_vocab=vocab_size, eos_token=eos or None)
