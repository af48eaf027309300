"""A chat model as a reranker (the `rerank_prompt` setting, Qwen3-Reranker's prompt): P(yes) against P(no) from the
C forward pass's logits after each pair's prompt, against tests/reference.py's float64 forward pass of the same
random models; the prompt's layout and length limit; a score does not depend on its batch."""
from __future__ import annotations

import zlib

import numpy as np
import pytest

from inferd.engine.engine import Engine
from inferd.engine.llm_reranker import QWEN3_PREFIX, QWEN3_SUFFIX, LLMReranker
from tests.reference import Reference, random_model


class WordTokenizer:
    """Each whitespace-separated word one token (a hash of it): the random models have no tokenizer."""

    def __init__(self, vocab: int):
        self.vocab = vocab

    def encode(self, text: str, add_special: bool = True) -> list[int]:
        return [zlib.crc32(w.encode()) % self.vocab for w in text.split()]


def make(model, **kw) -> LLMReranker:
    eng = Engine(model, num_kv_blocks=4, max_batch_tokens=64, max_seqs=4, threads=2)
    return LLMReranker(eng, WordTokenizer(model.config.vocab_size), name="tiny", threads=2, **kw)


PAIRS = [("where is the fox", "the fox ran to the river"), ("money", "stocks fell sharply"),
         ("a", "b " * 40), ("what", "nothing at all")]


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_yes_no_probability_matches_reference(arch):
    model = random_model(arch=arch, context_length=256)
    rr = make(model, max_batch_tokens=256, max_batch_seqs=4)
    prompts = rr.tokenize_pairs(PAIRS)
    got = rr.embed(prompts)
    assert got.shape == (len(PAIRS), 1) and got.dtype == np.float32
    ref = Reference(model.config, model.tensors)
    for score, ids in zip(got[:, 0], prompts):
        logits = ref.forward(ids, logit_rows=[len(ids) - 1], kv_dtype=np.float16).logits[0]
        want = 1 / (1 + np.exp(logits[rr.no] - logits[rr.yes]))
        assert score == pytest.approx(want, abs=2e-3)
    assert np.ptp(got) > 1e-3 and rr.yes != rr.no


def test_the_prompt_is_the_model_cards():
    model = random_model(context_length=256)
    tok = WordTokenizer(model.config.vocab_size)
    rr = make(model, max_batch_tokens=64)
    ids = rr.tokenize_pairs([("q", "d")])[0]
    middle = tok.encode("<Instruct>: Given a web search query, retrieve relevant passages that answer the query\n"
                        "<Query>: q\n<Document>: d")
    assert ids == tok.encode(QWEN3_PREFIX) + middle + tok.encode(QWEN3_SUFFIX)
    long = rr.tokenize_pairs([("q", "d " * 500)])[0]
    assert len(long) == 64 and long[-len(rr.suffix):] == rr.suffix     # the document cut, the answer cue kept


def test_a_score_does_not_depend_on_its_batch():
    model = random_model(context_length=256)
    rr = make(model, max_batch_tokens=160, max_batch_seqs=2)
    prompts = rr.tokenize_pairs(PAIRS)
    together = rr.embed(prompts)
    for i, p in enumerate(prompts):
        assert np.array_equal(rr.embed([p])[0], together[i])
