"""engine/step_cost.py and the scheduler's step bound: prompt chunks beside decodes are cut so that a step takes
at most step_latency_factor times a step of the decodes alone (or ends within max_step_latency_s), from the costs
of the steps that ran (a fake engine, its steps 'timed' by a cost model the test chooses)."""

import pytest

from inferd.config import Settings
from inferd.engine.loop import run_batch
from inferd.engine.scheduler import DEFAULT_STEP_LATENCY_FACTOR, MIN_PREFILL_BESIDE_DECODES, PACE_STEPS
from inferd.engine.step_cost import MIN_STEPS, StepCost
from tests.engine.fake_engine import FakeEngine
from tests.engine.test_scheduler import Harness, req


def cost_model(fixed: float, per_row: float, per_token: float):
    """Seconds a step of `rows` decode rows and `tokens` prompt tokens takes."""
    return lambda rows, tokens: fixed + per_row * rows + per_token * tokens


def test_the_fit_recovers_a_steps_parts_from_prefill_decode_and_mixed_steps():
    step = cost_model(0.100, 0.008, 0.006)  # a 1.5B model's shape: the weights' stream dominates a decode step
    cost = StepCost()
    assert cost.decode_s(8) is None and cost.prompt_tokens_within(1.0, 8, floor=16) is None  # nothing seen yet
    for rows, tokens in [(0, 512), (0, 300), (4, 0), (8, 0), (8, 64), (7, 16), (8, 0)]:
        cost.observe(step(rows, tokens), rows, tokens)
    assert cost.decode_s(8) == pytest.approx(0.164, rel=1e-3)
    assert cost.decode_s(1) == pytest.approx(0.108, rel=1e-3)
    assert cost.per_prompt_token_s == pytest.approx(0.006, rel=1e-3)
    # beside 8 decodes a step within twice theirs (0.328 s) holds 0.164 / 0.006 = 27 prompt tokens
    assert cost.prompt_tokens_within(0.328, 8, floor=16) == 27
    assert cost.prompt_tokens_within(0.170, 8, floor=16) == 16  # a prompt always progresses


def test_too_few_steps_or_no_positive_token_cost_is_no_fit():
    cost = StepCost()
    for _ in range(MIN_STEPS - 1):
        cost.observe(0.05, 4, 32)
    assert cost.decode_s(4) is None
    cost = StepCost()
    for tokens, seconds in [(0, 0.05), (32, 0.05), (64, 0.04), (16, 0.05)]:  # prompt tokens made steps faster
        cost.observe(seconds, 4, tokens)
    assert cost.per_prompt_token_s is None and cost.decode_s(4) is None


def test_steps_that_contradict_the_costs_leave_the_last_ones_standing():
    step = cost_model(0.010, 0.002, 0.001)
    cost = StepCost()
    for rows, tokens in [(0, 128), (4, 0), (4, 32), (8, 0)]:
        cost.observe(step(rows, tokens), rows, tokens)
    known = cost.decode_s(4), cost.per_prompt_token_s
    for tokens, seconds in [(32, 0.5), (256, 0.01)] * 3:  # more prompt tokens, faster steps: noise
        cost.observe(seconds, 4, tokens)
    assert (cost.decode_s(4), cost.per_prompt_token_s) == known


def test_a_part_fitted_below_zero_is_refitted_without_it_not_clamped():
    # A closed-loop load of 8 streams: decode steps of 8 rows, and of 7 beside a new request's prompt chunks, the
    # 7-row ones a little slower (the new request's own work shares the cores). Fitted freely, a decode row costs
    # less than nothing and the fixed part twice a decode step; clamping the row's cost to zero would keep that
    # fixed part, predict decode steps twice too slow, and let chunks in that make steps twice too long.
    cost = StepCost()
    for _ in range(10):
        for rows, tokens, ms in [(8, 0, 8.0), (8, 0, 8.0), (7, 0, 9.0), (7, 70, 37.0), (7, 30, 21.0), (8, 0, 8.0)]:
            cost.observe(ms / 1e3, rows, tokens)
    assert 8.0e-3 <= cost.decode_s(7) <= 9.0e-3 and 8.0e-3 <= cost.decode_s(8) <= 9.0e-3
    assert cost.per_prompt_token_s == pytest.approx(0.4e-3, rel=0.05)
    # beside 7 decodes, a step within three of theirs holds about (3 - 1) x 8.6 / 0.4 = 43 prompt tokens
    assert 38 <= cost.prompt_tokens_within(3 * cost.decode_s(7), 7, floor=16) <= 48


def test_one_shape_seen_over_and_over_is_predicted_for_that_shape():
    step = cost_model(0.010, 0.002, 0.001)
    cost = StepCost()
    for _ in range(20):
        cost.observe(step(8, 0), 8, 0)
        cost.observe(step(8, 32), 8, 32)
    assert cost.decode_s(8) == pytest.approx(step(8, 0), rel=1e-3)
    assert cost.per_prompt_token_s == pytest.approx(0.001, rel=1e-3)


def test_recent_steps_count_most():
    cost = StepCost()
    slow = cost_model(0.040, 0.004, 0.002)
    for rows, tokens in [(0, 128), (2, 0), (4, 32)] * 2:
        cost.observe(cost_model(0.020, 0.002, 0.001)(rows, tokens), rows, tokens)
    for _ in range(40):  # the machine slowed down to half its speed
        for rows, tokens in [(0, 128), (2, 0), (4, 32)]:
            cost.observe(slow(rows, tokens), rows, tokens)
    assert cost.decode_s(4) == pytest.approx(slow(4, 0), rel=1e-2)
    assert cost.per_prompt_token_s == pytest.approx(0.002, rel=1e-2)


# ---- the scheduler's policy ------------------------------------------------------------------------------------


def timed_step(h: Harness, step) -> list[tuple[int, int, int]]:
    """One step whose run 'takes' step(decode rows, prompt tokens) seconds, told to the policy as the loop tells
    it; the engine's (num_computed, num_new, num_sampled) per sequence."""
    batch = h.sched.schedule()
    rows = sum(s.num_new for s in batch.seqs if s.num_new == s.num_sampled)
    tokens = sum(s.num_new for s in batch.seqs if s.num_new != s.num_sampled)
    h.sched.postprocess(batch, run_batch(h.engine, batch))
    h.sched.observe(batch, step(rows, tokens))
    h.collect()
    return h.engine.steps[-1]


def warmed(step, num_decoding: int = 1, **kw) -> Harness:
    """A policy (K = 2 unless given) that has timed a prefill-only step and two decode steps of `num_decoding`
    sequences."""
    kw.setdefault("step_latency_factor", 2.0)
    h = Harness(FakeEngine(max_batch_tokens=512), **kw)
    for i in range(num_decoding):
        h.add(req(f"d{i}", range(100 * i, 100 * i + 20), max_tokens=200))
    timed_step(h, step)  # the prompts alone: the whole budget
    timed_step(h, step)
    timed_step(h, step)
    assert h.sched.step_cost.decode_s(num_decoding) == pytest.approx(step(num_decoding, 0), rel=1e-3)
    return h


def test_the_bound_is_on_by_default_at_three_decode_steps():
    assert DEFAULT_STEP_LATENCY_FACTOR == 3.0
    assert Harness(FakeEngine()).sched.step_latency_factor == DEFAULT_STEP_LATENCY_FACTOR
    assert Settings().step_latency_factor == DEFAULT_STEP_LATENCY_FACTOR


def test_a_chunk_beside_decodes_keeps_the_step_within_k_times_theirs():
    step = cost_model(0.030, 0.001, 0.001)
    h = warmed(step, num_decoding=1)
    h.add(req("b", range(1000, 1100), max_tokens=5))
    # beside d0's decode (0.031 s alone) a step of 0.062 s holds 31 prompt tokens, not the cap's 256
    assert timed_step(h, step) == [(22, 1, 1), (0, 31, 0)]
    assert timed_step(h, step) == [(23, 1, 1), (31, 31, 0)]


def test_the_chunk_grows_with_the_decode_step_it_rides_along():
    step = cost_model(0.030, 0.001, 0.001)
    h = warmed(step, num_decoding=4)
    h.add(req("b", range(1000, 1100), max_tokens=5))
    # 4 decodes take 0.034 s: the chunk beside them is 34 tokens
    assert timed_step(h, step)[-1] == (0, 34, 0)


def test_a_larger_factor_allows_larger_chunks():
    step = cost_model(0.030, 0.001, 0.001)
    h = warmed(step, num_decoding=1, step_latency_factor=3.0)
    h.add(req("b", range(1000, 1100), max_tokens=5))
    assert timed_step(h, step)[-1] == (0, 62, 0)  # (3 - 1) * 0.031 / 0.001


def test_prompts_admitted_in_one_step_share_the_bound():
    step = cost_model(0.030, 0.001, 0.001)
    h = warmed(step, num_decoding=1)
    h.add(req("b", range(1000, 1020), max_tokens=5))
    h.add(req("c", range(2000, 2100), max_tokens=5))
    # b's whole 20-token prompt and 11 of c's: 31 prompt tokens in all
    assert timed_step(h, step) == [(22, 1, 1), (0, 20, 1), (0, 11, 0)]


def test_an_absolute_bound_replaces_the_factor():
    step = cost_model(0.030, 0.001, 0.001)
    h = warmed(step, num_decoding=1, max_step_latency_s=0.1)
    h.add(req("b", range(1000, 1300), max_tokens=5))
    assert timed_step(h, step)[-1] == (0, 69, 0)  # (0.1 - 0.031) / 0.001


def test_a_slow_step_never_stops_a_prompt():
    step = cost_model(0.100, 0.008, 0.020)  # prompt tokens so dear that even twice a decode step holds 5
    h = warmed(step, num_decoding=1)
    h.add(req("b", range(1000, 1100), max_tokens=5))
    assert timed_step(h, step)[-1] == (0, MIN_PREFILL_BESIDE_DECODES, 0)


def test_before_any_cost_is_known_a_chunk_beside_decodes_is_the_smallest():
    h = Harness(FakeEngine(max_batch_tokens=512), max_prefill_while_decoding=256)
    h.add(req("a", range(10), max_tokens=50))
    h.step()
    h.add(req("b", range(1000, 1300), max_tokens=5))
    h.step()  # no step was timed
    assert h.engine.steps[-1] == [(10, 1, 1), (0, MIN_PREFILL_BESIDE_DECODES, 0)]


def test_the_cap_still_bounds_the_chunk_and_both_bounds_off_leave_only_the_cap():
    step = cost_model(0.030, 0.001, 0.001)
    h = warmed(step, num_decoding=1, max_prefill_while_decoding=24)
    h.add(req("b", range(1000, 1300), max_tokens=5))
    assert timed_step(h, step)[-1] == (0, 24, 0)  # the bound would allow 31
    h = warmed(step, num_decoding=1, max_prefill_while_decoding=64, step_latency_factor=0)
    h.add(req("b", range(1000, 1300), max_tokens=5))
    assert timed_step(h, step)[-1] == (0, 64, 0)


def test_a_step_without_decodes_takes_the_whole_budget():
    step = cost_model(0.030, 0.001, 0.001)
    h = warmed(step, num_decoding=1)
    h.sched.abort("d0")
    h.add(req("b", range(1000, 1600), max_tokens=5))
    assert timed_step(h, step) == [(0, 512, 0)]


def test_prompts_arriving_faster_than_the_bound_lets_in_are_paced_over_the_steps():
    step = cost_model(0.030, 0.001, 0.001)
    h = warmed(step, num_decoding=1)
    for i in range(3):
        h.add(req(f"p{i}", range(1000 * (i + 1), 1000 * (i + 1) + 640), max_tokens=5))
    # 1920 prompt tokens pending: 60 a step (1920 / 32), more than the bound's 31
    assert PACE_STEPS == 32
    assert timed_step(h, step) == [(22, 1, 1), (0, 60, 0)]
    # then 1860 pending: 59 a step
    assert timed_step(h, step) == [(23, 1, 1), (60, 59, 0)]


def test_waiting_requests_that_cannot_start_are_not_pending():
    step = cost_model(0.030, 0.001, 0.001)
    h = warmed(step, num_decoding=1, max_running=2)
    for i in range(3):
        h.add(req(f"p{i}", range(1000 * (i + 1), 1000 * (i + 1) + 1280), max_tokens=5))
    # one free slot: only p0's 1280 tokens count, 40 a step
    assert timed_step(h, step) == [(22, 1, 1), (0, 40, 0)]
