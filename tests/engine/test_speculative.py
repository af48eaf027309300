"""Prompt-lookup speculative decoding: proposals, acceptance, the gate, and output identical to plain decoding."""
from __future__ import annotations

import pytest

from inferd.engine.engine import Engine
from inferd.engine.types import SamplingParams
from inferd.engine.request import Request
from inferd.engine.runner import GenerationStats, generate
from inferd.engine.speculative import AcceptanceGate, PromptLookup, accept
from inferd.text.chat import render_chat


def test_lookup_proposes_what_followed_the_latest_match():
    lookup = PromptLookup([5, 6, 7, 8, 9, 5, 6, 1, 2, 5, 6])
    assert lookup.propose() == [1, 2, 5, 6]            # latest earlier "5 6" is at index 5, followed by 1 2 5 6
    lookup.extend([1])
    assert lookup.propose() == [2, 5, 6, 1]            # the 3-gram "5 6 1" wins over the 2-gram "6 1"


def test_lookup_prefers_longer_ngrams_and_needs_two_tokens():
    lookup = PromptLookup([1, 2, 3, 9, 2, 3, 4, 1, 2, 3])
    assert lookup.propose() == [9, 2, 3, 4]            # "1 2 3" matches at 0 (followed by 9), not "2 3" at 4
    assert PromptLookup([4, 7, 1, 7]).propose() == []  # a single repeated token is no match
    assert PromptLookup([]).propose() == []


def test_lookup_caps_the_draft():
    lookup = PromptLookup(list(range(10)) + [0, 1], max_draft=2)
    assert lookup.propose() == [2, 3]


def test_accept_keeps_drafts_until_the_first_disagreement():
    assert accept([3, 4, 9], [3, 4, 5, 6]) == [3, 4, 5]
    assert accept([3, 4], [3, 4, 5]) == [3, 4, 5]      # all accepted: the extra sampled token comes too
    assert accept([8, 4], [3, 4, 5]) == [3]
    assert accept([], [7]) == [7]


def test_gate_pauses_on_low_acceptance_and_doubles_up_to_80():
    gate = AcceptanceGate()
    pauses = []
    for _ in range(6):
        for _ in range(10):
            assert gate.allow()
            gate.record(4, 1)                           # 25% < 30%
        n = 0
        while not gate.allow():
            n += 1
        pauses.append(n)
    assert pauses == [10, 20, 40, 80, 80, 80]


def test_gate_keeps_speculating_and_resets_when_acceptance_is_good():
    gate = AcceptanceGate()
    for _ in range(10):
        gate.record(4, 0)
    assert not gate.allow()
    while not gate.allow():
        pass
    for _ in range(30):
        gate.record(4, 2)                               # 50%
        assert gate.allow()
    assert gate.next_pause == 10 and gate.acceptance_rate == 0.5


def token_ids(outputs) -> list[int]:
    return [t for out in outputs for t in out.token_ids]


@pytest.fixture(scope="module")
def smollm2(smollm2_model):
    model = smollm2_model
    return model, Engine(model, num_kv_blocks=4, max_batch_tokens=128, max_seqs=1)


@pytest.mark.parametrize("params", [SamplingParams(temperature=0.0),
                                    SamplingParams(temperature=0.8, top_p=0.95, seed=11),
                                    SamplingParams(temperature=0.0, repetition_penalty=1.1)],
                         ids=["greedy", "seeded", "penalty"])
def test_speculative_output_equals_plain_decoding(smollm2, params):
    model, engine = smollm2
    text = render_chat(model.chat_template, [{"role": "user", "content": "What is the capital of France?"}],
                       model.tokenizer, add_generation_prompt=True)
    prompt = model.tokenizer.encode(text, add_special=False)
    plain = token_ids(generate(engine, Request("plain", prompt, params, 48)))
    stats = GenerationStats()
    spec = token_ids(generate(engine, Request("spec", prompt, params, 48), stats=stats, speculative=True))
    assert spec == plain
    assert len(plain) == 48
    if params.temperature == 0.0 and params.repetition_penalty == 1.0:
        # this answer loops ("la femme, la femme, ..."), so drafts are made and most are right
        assert stats.drafted_tokens > 10 and stats.accepted_tokens > stats.drafted_tokens // 2
