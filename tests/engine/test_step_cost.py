"""engine/step_cost.py and the scheduler's latency bound: prompt chunks beside decodes are cut so that a step
ends within max_step_latency_s, from the costs of the steps that ran (a fake engine, timed by the test)."""

import pytest

from inferd.engine.loop import run_batch
from inferd.engine.step_cost import MIN_CHUNK_FOR_RATE, StepCost
from tests.engine.fake_engine import FakeEngine
from tests.engine.test_scheduler import Harness, req


def test_costs_are_learned_from_decode_only_steps_and_steps_with_a_chunk():
    cost = StepCost()
    assert cost.prompt_tokens_within(0.1, floor=16) is None  # nothing seen yet
    cost.observe(0.030, num_decode_rows=4, num_prompt_tokens=0)
    assert cost.decode_s == pytest.approx(0.030)
    cost.observe(0.030 + 128 * 0.002, num_decode_rows=4, num_prompt_tokens=128)
    assert cost.per_prompt_token_s == pytest.approx(0.002)
    # a step within 0.1 s holds (0.1 - 0.03) / 0.002 = 35 prompt tokens beside the decodes
    assert cost.prompt_tokens_within(0.1, floor=16) == 35
    assert cost.prompt_tokens_within(0.031, floor=16) == 16  # a prompt always progresses


def test_a_prefill_only_step_counts_wholly_as_prompt_cost_and_short_chunks_are_not_rates():
    cost = StepCost()
    cost.observe(0.5, num_decode_rows=0, num_prompt_tokens=250)
    assert cost.per_prompt_token_s == pytest.approx(0.002)
    cost.observe(9.0, num_decode_rows=1, num_prompt_tokens=MIN_CHUNK_FOR_RATE - 1)
    assert cost.per_prompt_token_s == pytest.approx(0.002)


def test_recent_steps_count_most():
    cost = StepCost()
    cost.observe(0.020, 1, 0)
    for _ in range(30):
        cost.observe(0.040, 1, 0)  # the machine slowed down
    assert cost.decode_s == pytest.approx(0.040, rel=1e-2)


def timed_step(h: Harness, duration_of) -> list[tuple[int, int, int]]:
    """One step whose run 'takes' duration_of(batch) seconds, told to the policy as the loop tells it."""
    batch = h.sched.schedule()
    h.sched.postprocess(batch, run_batch(h.engine, batch))
    h.sched.observe(batch, duration_of(batch))
    h.collect()
    return h.engine.steps[-1]


def test_the_latency_bound_cuts_chunks_beside_decodes_to_what_fits():
    decode_s, per_token_s = 0.030, 0.002

    def duration(batch):
        prompt = sum(s.num_new for s in batch.seqs if s.num_new != s.num_sampled)
        decodes = any(s.num_new == s.num_sampled for s in batch.seqs)
        return (decode_s if decodes else 0.0) + per_token_s * prompt

    h = Harness(FakeEngine(max_batch_tokens=512), max_prefill_while_decoding=256, max_step_latency_s=0.1)
    h.add(req("a", range(200), max_tokens=50))
    assert timed_step(h, duration) == [(0, 200, 1)]  # alone: the whole prompt (its cost per token is learned)
    assert timed_step(h, duration) == [(200, 1, 1)]  # a decode-only step: the decodes' cost
    h.add(req("b", range(1000, 1300), max_tokens=5))
    # beside a's decode, b's prompt comes (0.1 - 0.03) / 0.002 = 35 tokens a step, not the cap's 256
    assert timed_step(h, duration) == [(201, 1, 1), (0, 35, 0)]
    assert timed_step(h, duration) == [(202, 1, 1), (35, 35, 0)]


def test_without_the_bound_or_before_any_cost_is_known_the_cap_rules():
    h = Harness(FakeEngine(max_batch_tokens=512), max_prefill_while_decoding=64, max_step_latency_s=0.1)
    h.add(req("a", range(10), max_tokens=50))
    h.step()
    h.add(req("b", range(1000, 1300), max_tokens=5))
    h.step()  # no step was timed: the bound cannot be applied yet
    assert h.engine.steps[-1] == [(10, 1, 1), (0, 64, 0)]
