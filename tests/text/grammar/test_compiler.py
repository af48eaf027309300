"""inferd.text.grammar.compiler: compiled grammars cached per grammar text, compile errors that name the problem and
the field, the size limit and the time budget, compilation off the event loop, and the vocabulary built once, in
the background or for the first compile."""
from __future__ import annotations

import asyncio
import re

import pytest

from inferd.text.grammar import GrammarCompiler, GrammarError, json_schema_grammar, lark_or_gbnf_grammar, regex_grammar
from tests.text.grammar.walks import walk


def test_compiled_grammars_are_cached_per_grammar_text(compilers):
    c = compilers["bpe-gguf"]
    one = c.compile_sync(json_schema_grammar({"type": "integer"}, "guided_json"))
    two = c.compile_sync(json_schema_grammar({"type": "integer"}, "guided_json"))
    other_field = c.compile_sync(json_schema_grammar({"type": "integer"}, "json_schema"))
    assert one is two
    assert other_field.spec.param == "json_schema" and other_field._pristine is one._pristine


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
