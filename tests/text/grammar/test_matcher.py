"""inferd.text.grammar.matcher: walks under each step's mask satisfy the constraint on every vocabulary; mask bits
are what the matcher accepts; EOS ends an accepting grammar; matchers of one grammar are independent and a batch's
masks equal single ones; a lazy matcher is free until its trigger token, then constrained."""
from __future__ import annotations

import json
import re

import numpy as np
import pytest

from inferd.text.grammar import (LazyMatcher, choice_grammar, fill_masks, json_schema_grammar, lark_or_gbnf_grammar,
                                 regex_grammar)
from tests.text.grammar.walks import SCHEMA, VOCABS, walk


@pytest.mark.parametrize("vocab", VOCABS)
def test_regex_walks_match_the_regex(compilers, tokenizers, vocab):
    spec = regex_grammar(r"(yes|no|maybe)-[0-9]{2} [a-z]{1,4}", "guided_regex")
    for seed in range(8):
        text, m = walk(compilers[vocab], tokenizers[vocab], spec, seed)
        assert re.fullmatch(r"(yes|no|maybe)-[0-9]{2} [a-z]{1,4}", text), text
        assert m.accepts_eos() and not m.is_error


@pytest.mark.parametrize("vocab", VOCABS)
def test_json_schema_walks_give_valid_documents(compilers, tokenizers, vocab):
    spec = json_schema_grammar(SCHEMA, "response_format.json_schema.schema")
    for seed in range(6):
        text, m = walk(compilers[vocab], tokenizers[vocab], spec, seed, max_tokens=400)
        assert m.accepts_eos(), text
        doc = json.loads(text)
        assert set(doc) == {"color", "ok", "tags", "n"}
        assert doc["color"] in ("red", "green", "blue") and isinstance(doc["ok"], bool)
        assert len(doc["tags"]) <= 2 and all(isinstance(t, str) and len(t) <= 4 for t in doc["tags"])
        assert isinstance(doc["n"], int) and 0 <= doc["n"] <= 99


@pytest.mark.parametrize("vocab", VOCABS)
def test_choice_and_gbnf_walks(compilers, tokenizers, vocab):
    choices = ["alpha", "beta gamma", "δ"]
    for seed in range(4):
        text, _ = walk(compilers[vocab], tokenizers[vocab], choice_grammar(choices, "guided_choice"), seed)
        assert text in choices
        gbnf = 'root ::= "(" num ("," num)* ")"\nnum ::= [1-9] [0-9]?'
        text, _ = walk(compilers[vocab], tokenizers[vocab], lark_or_gbnf_grammar(gbnf, "grammar"), seed)
        assert re.fullmatch(r"\([1-9][0-9]?(,[1-9][0-9]?)*\)", text), text


def test_mask_bits_are_what_the_matcher_accepts(compilers, tokenizers):
    """llguidance's bit layout is the sampler's: every allowed token is consumable, every other one is not."""
    c, tok = compilers["smollm2"], tokenizers["smollm2"]
    compiled = c.compile_sync(regex_grammar(r"[0-9]+(\.[0-9]+)?", "guided_regex"))
    m = compiled.new_matcher()
    for t in tok.encode("12.", add_special=False):
        assert m.advance(t)
    row = np.zeros(c.mask_words(), np.uint32)
    m.fill_mask(row)
    bits = np.unpackbits(row.view(np.uint8), bitorder="little")[:c.vocab_size]
    allowed = set(np.nonzero(bits)[0].tolist())
    assert allowed and all(tok.decode([t]).isdigit() for t in allowed)
    for t in [tok.encode("7", add_special=False)[0], tok.encode("x", add_special=False)[0],
              tok.encode(".", add_special=False)[0]]:
        probe = m.llmatcher.deep_copy()
        assert bool(probe.consume_token(t)) == (t in allowed)


def test_tokenized_valid_text_is_accepted_and_invalid_text_rejected(compilers, tokenizers):
    c, tok = compilers["smollm2"], tokenizers["smollm2"]
    compiled = c.compile_sync(json_schema_grammar(SCHEMA, "guided_json"))
    good = {"color": "red", "ok": True, "tags": ["ab"], "n": 7}
    for text in (json.dumps(good), json.dumps(good, indent=2)):
        m = compiled.new_matcher()
        assert all(m.advance(t) for t in tok.encode(text, add_special=False)), m.error
        assert m.accepts_eos()
    m = compiled.new_matcher()
    results = [m.advance(t) for t in tok.encode('{"color": "pink"', add_special=False)]
    assert not all(results) and m.is_error and m.error
    m = compiled.new_matcher()   # unbounded whitespace is not allowed (a small model could emit it forever)
    assert not all(m.advance(t) for t in tok.encode("{" + "\n" * 3, add_special=False))


def test_eos_ends_an_accepting_grammar(compilers, tokenizers):
    c, tok = compilers["smollm2"], tokenizers["smollm2"]
    m = c.compile_sync(regex_grammar("ab+", "guided_regex")).new_matcher()
    row = np.zeros(c.mask_words(), np.uint32)
    m.fill_mask(row)
    eos = next(iter(tok.eos_ids))
    assert not (row[eos >> 5] >> (eos & 31)) & 1                       # not yet: nothing written
    for t in tok.encode("ab", add_special=False):
        assert m.advance(t)
    m.fill_mask(row)
    assert (row[eos >> 5] >> (eos & 31)) & 1 and m.accepts_eos() and not m.is_done
    assert m.advance(eos) and m.is_done and not m.is_error


def test_matchers_of_one_grammar_are_independent_and_batch_masks_equal_single(compilers, tokenizers):
    c, tok = compilers["smollm2"], tokenizers["smollm2"]
    compiled = c.compile_sync(choice_grammar(["cat", "dog", "cow"], "guided_choice"))
    a, b = compiled.new_matcher(), compiled.new_matcher()
    assert a.advance(tok.encode("d", add_special=False)[0])
    batch = np.zeros((3, c.mask_words()), np.int32)                      # llguidance's own dtype works too
    fill_masks(c.executor, [(a, 2), (b, 0)], batch)
    single = np.zeros((2, c.mask_words()), np.int32)
    a.fill_mask(single[0])
    b.fill_mask(single[1])
    np.testing.assert_array_equal(batch[2], single[0])
    np.testing.assert_array_equal(batch[0], single[1])
    assert not batch[1].any()
    assert not np.array_equal(batch[0], batch[2])


def test_a_lazy_matcher_is_free_until_its_trigger_then_follows_the_grammar(compilers, tokenizers):
    c, tok = compilers["smollm2"], tokenizers["smollm2"]
    trigger = tok.encode("@", add_special=False)[0]
    lazy = LazyMatcher(c.compile_sync(regex_grammar("@[0-9]{2}", "guided_regex")), trigger)
    row = np.full(c.mask_words(), 7, np.uint32)
    for t in tok.encode("any text", add_special=False):             # free: no mask, the row left alone
        assert not lazy.fill_mask(row) and lazy.advance(t)
        assert lazy.accepts_eos() and not lazy.is_done and not lazy.is_error and lazy.error == ""
    assert (row == 7).all()
    assert lazy.advance(trigger) and lazy.fill_mask(row)              # the trigger is the grammar's first token
    bits = np.unpackbits(row.view(np.uint8), bitorder="little")[:c.vocab_size]
    assert bits.sum() > 0 and all(tok.decode([t]).isdigit() for t in np.nonzero(bits)[0].tolist())
    assert not lazy.accepts_eos()
    for t in tok.encode("12", add_special=False):
        assert lazy.advance(t)
    assert lazy.accepts_eos()
    eos = next(iter(tok.eos_ids))
    assert lazy.advance(eos) and lazy.is_done and not lazy.is_error
    failed = LazyMatcher(lazy.compiled, trigger)
    assert failed.advance(trigger) and not failed.advance(tok.encode("x", add_special=False)[0])
    assert failed.is_error and failed.error and not failed.is_done
