"""inferd.engine.constraints: the step's mask rows for a mix of unconstrained, lazy (not yet started, started) and
full matchers, and what advancing with a sampled token reports (ok, done, error)."""
from __future__ import annotations

import json
import re

import numpy as np
import pytest

from inferd import _cpu
from inferd.engine.constraints import Constraint, StepMasks
from inferd.model.gguf import validate_gguf
from inferd.text.grammar import GrammarCompiler, json_schema_grammar, regex_grammar
from inferd.text.tokenizer import Tokenizer
from inferd.text.tools import HERMES, LazyMatcher, parse_tool_calls, parse_tools, tool_call_grammar

advance = Constraint.advance


@pytest.fixture(scope="module")
def smol(smollm2_path):
    tok = Tokenizer.from_gguf(validate_gguf(str(smollm2_path)).metadata)
    compiler = GrammarCompiler(tok)
    yield tok, compiler
    compiler.close()


def test_masks_for_a_mixed_batch_and_a_full_run(smol):
    tok, compiler = smol
    regex = Constraint(compiler.compile_sync(regex_grammar("[0-9]{3}-[a-z]{2}", "guided_regex")))
    schema = Constraint(compiler.compile_sync(json_schema_grammar(
        {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
         "additionalProperties": False}, "guided_json")))
    matchers = [None, regex.new_matcher(), schema.new_matcher(), regex.new_matcher()]
    masks = StepMasks(compiler.vocab_size, max_rows=2)            # grows past 2 rows
    out: list[list[int]] = [[] for _ in matchers]
    done = [False] * len(matchers)
    rng = np.random.default_rng(0)
    for pos in range(60):
        live = [m if not done[i] else None for i, m in enumerate(matchers)]
        token_masks, rows = masks.build(live)
        assert rows[0] == -1 and all(r >= 0 for i, r in enumerate(rows[1:], 1) if not done[i])
        for i, m in enumerate(matchers):
            if done[i] or (m is None and pos >= 5):
                continue
            logits = rng.standard_normal(compiler.vocab_size).astype(np.float32) * 3
            allowed = token_masks[rows[i]] if rows[i] >= 0 else None
            tok_id = _cpu.sample(logits, {"temperature": 1.0, "seed": i}, pos, allowed=allowed)[0]
            if m is None:
                out[i].append(tok_id)
                continue
            result = advance(m, tok_id, frozenset(tok.eos_ids))
            assert result.ok, result.error
            if tok_id not in tok.eos_ids:
                out[i].append(tok_id)
            done[i] = result.done or tok_id in tok.eos_ids
    assert all(done[1:])
    assert re.fullmatch("[0-9]{3}-[a-z]{2}", tok.decode(out[1]))
    assert re.fullmatch("[0-9]{3}-[a-z]{2}", tok.decode(out[3]))
    assert isinstance(json.loads(tok.decode(out[2]))["ok"], bool)


def test_a_lazy_matcher_has_no_row_until_its_trigger(smol):
    tok, compiler = smol
    trigger = tok.encode("<", add_special=False)[0]          # SmolLM2 has no <tool_call> token; any token will do
    grammar = compiler.compile_sync(tool_call_grammar(parse_tools([{"type": "function", "function": {
        "name": "f", "parameters": {"type": "object", "properties": {"x": {"type": "integer"}},
                                    "required": ["x"], "additionalProperties": False}}}]), HERMES,
        parallel=False))
    lazy = Constraint(grammar, trigger_token=trigger).new_matcher()
    assert isinstance(lazy, LazyMatcher)
    masks = StepMasks(compiler.vocab_size, max_rows=4)
    token_masks, rows = masks.build([lazy])
    assert token_masks is None and rows == [-1]
    eos = frozenset(tok.eos_ids)
    for t in tok.encode("Let me see. ", add_special=False):
        r = advance(lazy, t, eos)
        assert r.ok and not r.done and lazy.active is None
    assert advance(lazy, trigger, eos).ok and lazy.active is not None
    token_masks, rows = masks.build([lazy])
    assert rows == [0] and token_masks is not None
    text = "<"
    rng = np.random.default_rng(1)
    for pos in range(200):
        token_masks, rows = masks.build([lazy])
        t = _cpu.sample(rng.standard_normal(compiler.vocab_size).astype(np.float32), {"temperature": 1.0, "seed": 3},
                        pos, allowed=token_masks[0])[0]
        r = advance(lazy, t, eos)
        assert r.ok, r.error
        if t in tok.eos_ids:
            break
        text += tok.decode([t], skip_special=False)
        if r.done:
            break
    _, calls = parse_tool_calls(text, HERMES)
    assert [c.name for c in calls] == ["f"] and isinstance(json.loads(calls[0].arguments)["x"], int)


def test_advance_reports_errors_and_eos_before_a_lazy_start(smol):
    tok, compiler = smol
    eos = frozenset(tok.eos_ids)
    m = Constraint(compiler.compile_sync(regex_grammar("ab", "guided_regex"))).new_matcher()
    r = advance(m, tok.encode("x", add_special=False)[0], eos)
    assert not r.ok and not r.done and r.error
    assert advance(m, -1, eos).error == "the grammar allows no token here"
    m = Constraint(compiler.compile_sync(regex_grammar("ab", "guided_regex"))).new_matcher()
    ids = tok.encode("ab", add_special=False)
    results = [advance(m, t, eos) for t in ids]
    assert all(r.ok for r in results) and results[-1].done and not any(r.done for r in results[:-1])
    lazy = Constraint(compiler.compile_sync(regex_grammar("<x", "r")), trigger_token=0).new_matcher()
    r = advance(lazy, next(iter(eos)), eos)
    assert r.ok and r.done


def test_the_policy_gives_each_choice_a_matcher_and_ends_one_its_token_breaks(smol):
    """Through the scheduling policy with the fake engine, which ignores masks: its first token is outside the
    grammar, so the choice ends with an error naming the grammar (not a crash), and the request did not speculate
    though it asked to."""
    from inferd.engine.request import FinishReason, Request
    from tests.engine.fake_engine import VOCAB, FakeEngine, fake_next_token
    from tests.engine.test_scheduler import Harness
    tok, _ = smol
    compiler = GrammarCompiler(tok, max(VOCAB, tok.vocab_size))
    try:
        constraint = Constraint(compiler.compile_sync(regex_grammar("[0-9]{3}", "guided_regex")))
        prompt = [5, 6, 7]
        first = fake_next_token(prompt)
        assert not tok.decode([first]).isdigit()          # the fake model's first token breaks the grammar
        h = Harness(FakeEngine(), speculative=True)
        st = h.add(Request("r1", prompt, max_tokens=10, constraint=constraint))
        assert st.matcher is not None and st.mask is not None and not st.speculative
        h.run_until_idle()
        last = h.outputs["r1"][-1]
        assert last.finish_reason == FinishReason.ERROR and "grammar" in last.error_message
        assert st.output_ids == []                          # the breaking token is not part of the output
    finally:
        compiler.close()
