"""inferd.text.grammar: request fields -> llguidance grammars, the model's vocabulary for llguidance, compilation
off the event loop under limits and a time budget, and per-sequence matchers whose masks the C sampler applies.

Vocabularies: the tiny byte-level BPE and SentencePiece GGUFs and an HF tokenizer.json from tests.model.make_tiny,
and the real SmolLM2 file. Walks draw tokens with the C sampler under each step's mask (random logits, fixed
seeds) and check that the decoded text satisfies the constraint.
"""
from __future__ import annotations

import asyncio
import json
import re

import llguidance as llg
import numpy as np
import pytest

from inferd import _cpu
from inferd.text.grammar import (GrammarCompiler, GrammarError, GrammarSpec, choice_grammar, fill_masks,
                                 grammar_from_request, json_schema_grammar, lark_or_gbnf_grammar, mask_words,
                                 regex_grammar)
from inferd.model.gguf import validate_gguf
from inferd.text.tokenizer import Tokenizer
from tests.model.make_tiny import make_variant, tokenizer_json, variant_spec


# ---- vocabularies -------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tokenizers(tiny_dir, smollm2_path):
    bpe = Tokenizer.from_gguf(validate_gguf(str(make_variant("llama-gguf-q8_0", tiny_dir))).metadata)
    spm = Tokenizer.from_gguf(validate_gguf(str(make_variant("llama-spm-gguf-q8_0", tiny_dir))).metadata)
    folder = tiny_dir / "grammar-hf-tok"
    folder.mkdir(exist_ok=True)
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer_json(variant_spec("llama-gguf-q8_0"))))
    hf = Tokenizer.from_hf_files(folder / "tokenizer.json", extra_eos_ids=[2])
    smol = Tokenizer.from_gguf(validate_gguf(str(smollm2_path)).metadata)
    return {"bpe-gguf": bpe, "spm-gguf": spm, "hf-json": hf, "smollm2": smol}


@pytest.fixture(scope="module")
def compilers(tokenizers):
    out = {name: GrammarCompiler(tok, tok.vocab_size + 40) for name, tok in tokenizers.items()}  # padded vocab
    yield out
    for c in out.values():
        c.close()


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


VOCABS = ["bpe-gguf", "spm-gguf", "hf-json", "smollm2"]


@pytest.mark.parametrize("vocab", VOCABS)
def test_regex_walks_match_the_regex(compilers, tokenizers, vocab):
    spec = regex_grammar(r"(yes|no|maybe)-[0-9]{2} [a-z]{1,4}", "guided_regex")
    for seed in range(8):
        text, m = walk(compilers[vocab], tokenizers[vocab], spec, seed)
        assert re.fullmatch(r"(yes|no|maybe)-[0-9]{2} [a-z]{1,4}", text), text
        assert m.accepts_eos() and not m.is_error


SCHEMA = {"type": "object", "additionalProperties": False, "required": ["color", "ok", "tags", "n"],
          "properties": {"color": {"enum": ["red", "green", "blue"]}, "ok": {"type": "boolean"},
                         "tags": {"type": "array", "items": {"type": "string", "maxLength": 4}, "maxItems": 2},
                         "n": {"type": "integer", "minimum": 0, "maximum": 99}}}


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


def test_compiled_grammars_are_cached_per_grammar_text(compilers):
    c = compilers["bpe-gguf"]
    one = c.compile_sync(json_schema_grammar({"type": "integer"}, "guided_json"))
    two = c.compile_sync(json_schema_grammar({"type": "integer"}, "guided_json"))
    other_field = c.compile_sync(json_schema_grammar({"type": "integer"}, "json_schema"))
    assert one is two
    assert other_field.spec.param == "json_schema" and other_field._pristine is one._pristine


# ---- request fields ----------------------------------------------------------------------------------------------
def test_no_constraint_and_text_format_give_none():
    assert grammar_from_request({}) is None
    assert grammar_from_request({"response_format": {"type": "text"}, "guided_json": None}) is None


@pytest.mark.parametrize("fields,kind,param", [
    ({"response_format": {"type": "json_object"}}, "json_object", "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA, "strict": True}}},
     "json_schema", "response_format.json_schema.schema"),
    ({"response_format": {"type": "json_schema", "name": "x", "schema": SCHEMA}}, "json_schema",
     "response_format.schema"),                                          # the Responses API's flat text.format
    ({"guided_json": SCHEMA}, "json_schema", "guided_json"),
    ({"guided_json": json.dumps(SCHEMA)}, "json_schema", "guided_json"),
    ({"guided_regex": "a+"}, "regex", "guided_regex"),
    ({"guided_choice": ["a", "b"]}, "choice", "guided_choice"),
    ({"guided_grammar": 'start: "a"+'}, "grammar", "guided_grammar"),
    ({"grammar": 'root ::= "a"+'}, "grammar", "grammar"),
    ({"json_schema": SCHEMA}, "json_schema", "json_schema"),
    ({"structured_outputs": {"json": SCHEMA}}, "json_schema", "structured_outputs.json"),
    ({"structured_outputs": {"regex": "a+"}}, "regex", "structured_outputs.regex"),
    ({"structured_outputs": {"choice": ["x"]}}, "choice", "structured_outputs.choice"),
    ({"structured_outputs": {"grammar": 'root ::= "a"'}}, "grammar", "structured_outputs.grammar"),
    ({"structured_outputs": {"json_object": True}}, "json_object", "structured_outputs.json_object"),
])
def test_every_request_form_gives_a_grammar(fields, kind, param):
    spec = grammar_from_request(fields)
    assert spec is not None and spec.kind == kind and spec.param == param
    assert llg.LLMatcher.validate_grammar(spec.grammar) == ""


@pytest.mark.parametrize("fields,param,message", [
    ({"response_format": {"type": "json_object"}, "guided_regex": "a"}, "guided_regex", "send only one"),
    ({"response_format": {"type": "xml"}}, "response_format.type", "not supported"),
    ({"response_format": "json"}, "response_format", "must be an object"),
    ({"response_format": {"type": "json_schema"}}, "response_format", "name and a schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": {}}}},
     "response_format.json_schema.name", "name must be"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "a b", "schema": {}}}},
     "response_format.json_schema.name", "name must be"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": [1]}}},
     "response_format.json_schema.schema", "must be a JSON schema"),
    ({"guided_json": "{not json"}, "guided_json", "not valid JSON"),
    ({"guided_regex": ""}, "guided_regex", "non-empty"),
    ({"guided_choice": []}, "guided_choice", "non-empty list"),
    ({"guided_choice": "ab"}, "guided_choice", "non-empty list"),
    ({"guided_grammar": 'root ::= "a" | b'}, "guided_grammar", "invalid grammar"),
    ({"structured_outputs": {"json": {}, "regex": "a"}}, "structured_outputs", "exactly one"),
    ({"structured_outputs": {"structural_tag": "x"}}, "structured_outputs.structural_tag", "not supported"),
    ({"guided_json": {}, "guided_whitespace_pattern": 5}, "guided_whitespace_pattern", "string"),
    ({"guided_json": json.loads('{"type":"array","items":' * 300 + "{}" + "}" * 300)}, "guided_json",
     "nested past the limits"),
])
def test_bad_request_forms_name_the_field(fields, param, message):
    with pytest.raises(GrammarError, match=message) as e:
        grammar_from_request(fields)
    assert e.value.param == param


@pytest.mark.parametrize("spec,message", [
    (json_schema_grammar({"type": "strin"}, "guided_json"), "invalid or unsupported JSON schema: Invalid type"),
    (json_schema_grammar({"type": "object", "not": {"type": "string"}}, "guided_json"),
     "cannot be enforced: Unimplemented keys"),
    (json_schema_grammar({"$ref": "#/$defs/missing"}, "guided_json"), "does not exist"),
    (json_schema_grammar({"type": "string", "minLength": 5, "maxLength": 2}, "guided_json"), "Unsatisfiable"),
    (json_schema_grammar({"type": "string", "pattern": "(a"}, "guided_json"), "unclosed group"),
    (regex_grammar("(ab", "guided_regex"), "invalid regular expression"),
    (lark_or_gbnf_grammar("start: foo", "guided_grammar"), "unknown name"),
])
def test_compile_errors_name_the_problem_and_the_field(compilers, spec, message):
    with pytest.raises(GrammarError, match=message) as e:
        compilers["bpe-gguf"].compile_sync(spec)
    assert e.value.param == spec.param


def test_grammar_text_past_the_size_limit_is_refused_before_compiling(tokenizers):
    c = GrammarCompiler(tokenizers["bpe-gguf"], max_grammar_bytes=10_000)
    try:
        lark = "start: " + " | ".join(f'"w{i}"' for i in range(3000))
        with pytest.raises(GrammarError, match="size limit") as e:
            c.compile_sync(lark_or_gbnf_grammar(lark, "guided_grammar"))
        assert e.value.param == "guided_grammar"
    finally:
        c.close()


# a schema whose lexer takes a good fraction of a second to build: 30 x 30 distinct string patterns
HEAVY = {"anyOf": [{"type": "object", "properties": {
    f"p{i}_{j}": {"type": "string", "pattern": f"^[a-z]{{{i}}}x{{{j}}}$"} for j in range(30)}} for i in range(30)]}


def test_a_heavy_compile_past_the_budget_is_a_400_not_a_wait(tokenizers):
    c = GrammarCompiler(tokenizers["smollm2"], compile_timeout=0.001)
    try:
        c.wait_ready()                                                    # the vocabulary is not what is timed
        with pytest.raises(GrammarError, match="did not compile within") as e:
            c.compile_sync(json_schema_grammar(HEAVY, "guided_json"))
        assert e.value.param == "guided_json"
    finally:
        c.close()


def test_compiling_does_not_block_the_event_loop(tokenizers):
    """While a heavy grammar compiles (in the pool, GIL released), the loop keeps running other work."""
    c = GrammarCompiler(tokenizers["smollm2"], compile_timeout=60)
    c.wait_ready()

    async def main():
        task = asyncio.ensure_future(c.compile(json_schema_grammar(HEAVY, "guided_json")))
        ticks_while_compiling = 0
        while not task.done():
            await asyncio.sleep(0.001)
            ticks_while_compiling += 0 if task.done() else 1
        compiled = await task
        return ticks_while_compiling, compiled

    try:
        ticks, compiled = asyncio.run(main())
        assert ticks >= 1
        assert not compiled.new_matcher().is_error
    finally:
        c.close()


def test_async_compile_maps_errors(compilers):
    with pytest.raises(GrammarError, match="invalid regular expression"):
        asyncio.run(compilers["bpe-gguf"].compile(regex_grammar("[", "guided_regex")))


@pytest.mark.parametrize("concurrent", [1, 3])
def test_a_compiler_built_lazily_builds_its_vocabulary_for_the_first_compile(tokenizers, concurrent):
    """build_now=False (the server's start-up): nothing is built until start() or the first compile, which then
    waits for the vocabulary (queued ahead of it on the pool, even when more compiles than workers come at once)
    and gives the same grammar as an eager compiler."""
    tok = tokenizers["bpe-gguf"]
    lazy = GrammarCompiler(tok, tok.vocab_size + 40, build_now=False, threads=2)
    try:
        assert not lazy.started
        specs = [regex_grammar(rf"(yes|no|maybe)-[0-9]{{{i + 1}}}", "guided_regex") for i in range(concurrent)]

        async def compile_all():
            return await asyncio.gather(*(lazy.compile(s) for s in specs))

        compiled = asyncio.run(compile_all())
        assert lazy.started and [c.spec for c in compiled] == specs
        for i, spec in enumerate(specs):
            for seed in range(3):
                text, m = walk(lazy, tok, spec, seed)
                assert re.fullmatch(rf"(yes|no|maybe)-[0-9]{{{i + 1}}}", text), text
                assert m.accepts_eos() and not m.is_error
    finally:
        lazy.close()


def test_start_builds_the_vocabulary_once(tokenizers):
    c = GrammarCompiler(tokenizers["bpe-gguf"], build_now=False)
    try:
        first = c.start()
        assert c.start() is first and c.started
        c.wait_ready(60)
        assert c.lltokenizer is first.result()
    finally:
        c.close()
