"""The scheduling policy against FakeEngine (fake model output, real policy and KV manager), driven step by step
in the test's thread with a fake clock: no threads, no event loop, no sleeps."""

import pytest

from inferd.engine.loop import run_batch
from inferd.engine.request import FinishReason, Request, RequestOutput, RequestState
from inferd.engine.scheduler import Scheduler
from inferd.engine.types import RequestStatus
from tests.engine.fake_engine import EOS, FakeEngine, SamplingParams, run_alone

GREEDY = SamplingParams(temperature=0.0)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Harness:
    """A policy, a fake engine, and every output each request was told, by request id."""

    def __init__(self, engine: FakeEngine | None = None, **kw):
        kw.setdefault("max_model_len", 4096)
        self.engine = engine or FakeEngine()
        self.clock = FakeClock()
        self.sched = Scheduler(self.engine, clock=self.clock, **kw)
        self.outputs: dict[str, list[RequestOutput]] = {}

    def add(self, request: Request) -> RequestState:
        st = RequestState(request, arrival_time=self.clock())
        self.sched.add(st)
        self.collect()
        return st

    def step(self):
        batch = self.sched.schedule()
        stats = self.sched.postprocess(batch, run_batch(self.engine, batch)) if batch else None
        self.collect()
        return stats

    def run_until_idle(self, max_steps: int = 1000) -> None:
        for _ in range(max_steps):
            if not self.sched.has_work:
                return
            self.step()
        raise AssertionError("the scheduler did not finish")

    def expire(self) -> list[RequestState]:
        expired = self.sched.expire_timeouts()
        self.collect()
        return expired

    def abort(self, request_id: str) -> None:
        self.sched.abort(request_id)
        self.collect()

    def collect(self) -> None:
        for st, out in self.sched.take_outputs():
            self.outputs.setdefault(st.request.request_id, []).append(out)

    def tokens(self, rid: str) -> list[int]:
        return [t for o in self.outputs.get(rid, []) for t in o.token_ids]

    def last(self, rid: str) -> RequestOutput:
        return self.outputs[rid][-1]

    def prompt_logprobs(self, rid: str) -> list:
        return [e for o in self.outputs.get(rid, []) if o.prompt_logprobs for e in o.prompt_logprobs]


def req(rid, prompt, max_tokens=4, **kw):
    kw.setdefault("params", GREEDY)
    kw.setdefault("stop_token_ids", frozenset({EOS}))
    return Request(request_id=rid, prompt_ids=list(prompt), max_tokens=max_tokens, **kw)


def test_single_request_prefill_then_decode_until_length():
    h = Harness()
    st = h.add(req("a", range(100), max_tokens=3))
    assert st.status is RequestStatus.WAITING
    h.step()
    assert st.status is RequestStatus.DECODING
    h.step()
    h.step()
    outs = h.outputs["a"]
    assert h.engine.steps == [[(0, 100, 1)], [(100, 1, 1)], [(101, 1, 1)]]
    assert h.tokens("a") == run_alone(range(100), 3)
    assert [o.finish_reason for o in outs] == [None, None, FinishReason.LENGTH]
    assert (outs[-1].usage.prompt_tokens, outs[-1].usage.completion_tokens) == (100, 3)
    assert st.status is RequestStatus.FINISHED
    assert h.sched.kv.stats().num_used == 0 and not h.sched.running


def test_step_stats_count_prefill_decode_and_first_token_latency():
    h = Harness(FakeEngine(max_batch_tokens=64))
    h.add(req("a", range(100), max_tokens=2))
    h.clock.now += 0.25
    first = h.step()                                   # 64 of 100 prompt tokens
    assert (first.num_prefill_tokens, first.num_decode_tokens, first.prompt_tokens_done) == (64, 0, 0)
    h.clock.now += 0.25
    second = h.step()                                  # the other 36, and the first token
    assert (second.num_prefill_tokens, second.num_decode_tokens, second.prompt_tokens_done) == (36, 1, 100)
    assert second.ttfts == [pytest.approx(0.5)]
    h.clock.now += 0.1
    third = h.step()
    assert (third.num_prefill_tokens, third.num_decode_tokens) == (0, 1)
    assert third.itls == [pytest.approx(0.1)] and [s.request.request_id for s in third.finished] == ["a"]


def test_long_prompt_is_chunked_and_decodes_go_first():
    h = Harness(FakeEngine(max_batch_tokens=128), step_latency_factor=0)  # the step bound: test_step_cost.py
    h.add(req("short", range(10), max_tokens=10))
    h.step()                                   # short's prefill
    h.add(req("long", range(1000, 1300), max_tokens=1))
    for _ in range(3):
        h.step()
    # short decodes one token every step while long's 300-token prompt comes in 127 + 127 + 46
    assert h.engine.steps[1:] == [[(10, 1, 1), (0, 127, 0)], [(11, 1, 1), (127, 127, 0)],
                                  [(12, 1, 1), (254, 46, 1)]]


def test_prompt_tokens_beside_decodes_are_capped_so_streams_keep_their_cadence():
    h = Harness(FakeEngine(max_batch_tokens=128), max_prefill_while_decoding=32, step_latency_factor=0)
    h.add(req("long", range(1000, 1300), max_tokens=2))
    h.step()                                   # alone: nobody decodes, the prompt takes the whole budget
    h.add(req("short", range(10), max_tokens=10))
    h.step()                                   # long is still prefilling (no decodes yet): 128 between them
    assert h.engine.steps == [[(0, 128, 0)], [(128, 128, 0)]]
    h.step()                                   # the rest of long's prompt, then short's prompt begins
    assert h.engine.steps[2] == [(256, 44, 1), (0, 10, 1)]
    h.add(req("next", range(2000, 2070), max_tokens=1))
    for _ in range(3):
        h.step()
    # the running ones decode every step (long finishes after its second token); next's 70 prompt tokens come
    # 32 at a time beside them
    assert h.engine.steps[3:] == [[(300, 1, 1), (10, 1, 1), (0, 32, 0)], [(11, 1, 1), (32, 32, 0)],
                                  [(12, 1, 1), (64, 6, 1)]]
    assert h.last("long").finish_reason == FinishReason.LENGTH


def test_without_the_cap_a_prompt_chunk_takes_what_the_decodes_leave():
    h = Harness(FakeEngine(max_batch_tokens=128), max_prefill_while_decoding=0, step_latency_factor=0)
    h.add(req("short", range(10), max_tokens=10))
    h.step()
    h.add(req("long", range(1000, 1300), max_tokens=1))
    h.step()
    assert h.engine.steps[1] == [(10, 1, 1), (0, 127, 0)]


def test_running_cap_and_fcfs_admission():
    h = Harness(FakeEngine(max_seqs=2))
    for i in range(3):
        h.add(req(f"r{i}", [i] * 5, max_tokens=2))
    h.step()
    assert [st.request.request_id for st in h.sched.running] == ["r0", "r1"]
    assert [st.request.request_id for st in h.sched.waiting] == ["r2"]
    h.step()          # r0 and r1 finish (max_tokens=2)
    h.step()
    assert [st.request.request_id for st in h.sched.running] == ["r2"]
    assert not h.sched.waiting


def test_stop_token_finishes_with_stop():
    h = Harness(FakeEngine(eos_after={7: 3}))
    h.add(req("a", [7, 1, 2], max_tokens=10))
    for _ in range(3):
        h.step()
    assert h.tokens("a")[-1] == EOS and len(h.tokens("a")) == 3
    assert h.last("a").finish_reason == FinishReason.STOP
    assert h.last("a").usage.completion_tokens == 3


def test_prefix_cache_hit_reported_and_kv_contents_right():
    h = Harness()
    prompt = list(range(200))
    h.add(req("a", prompt, max_tokens=1))
    h.step()
    assert h.last("a").usage.cached_tokens == 0
    h.add(req("b", prompt[:150] + [7, 7, 7], max_tokens=2))
    h.step()
    h.step()
    assert h.last("b").usage.cached_tokens == 128              # two full blocks of 64
    assert h.engine.steps[1] == [(128, 25, 1)]                   # only the uncached tail ran
    assert h.tokens("b") == run_alone(prompt[:150] + [7, 7, 7], 2)   # FakeEngine checked the K/V
    st = h.sched.kv.stats()
    assert (st.prefix_queries, st.prefix_hits) == (353, 128)


def test_fully_cached_prompt_still_runs_its_last_block():
    h = Harness()
    prompt = list(range(128))
    for rid in ("a", "b"):
        h.add(req(rid, prompt, max_tokens=1))
        h.step()
    assert h.last("b").usage.cached_tokens == 64
    assert h.engine.steps[1] == [(64, 64, 1)]


def test_preemption_when_blocks_run_out_gives_same_tokens():
    # 4 blocks of 64: two sequences of 100 prompt + 60 generated each need 3 blocks; they cannot both fit
    h = Harness(FakeEngine(num_kv_blocks=4, max_batch_tokens=512), max_model_len=256)
    prompts = [list(range(i * 1000, i * 1000 + 100)) for i in range(2)]
    states = [h.add(req(f"r{i}", p, max_tokens=60)) for i, p in enumerate(prompts)]
    h.run_until_idle()
    for i, p in enumerate(prompts):
        assert h.tokens(f"r{i}") == run_alone(p, 60)
        assert h.last(f"r{i}").finish_reason == FinishReason.LENGTH
    assert states[1].num_preemptions >= 1 and h.sched.num_preemptions == states[1].num_preemptions
    assert states[0].num_preemptions == 0     # the earlier request keeps its blocks (FCFS)
    assert h.sched.kv.stats().num_used == 0


def test_a_preempted_decoding_request_waits_as_preempted_and_resumes_decoding():
    h = Harness(FakeEngine(num_kv_blocks=4, max_batch_tokens=512), max_model_len=256)
    h.add(req("r0", range(100), max_tokens=60))
    late = h.add(req("r1", range(1000, 1100), max_tokens=60))
    seen = set()
    while h.sched.has_work:
        h.step()
        seen.add(late.status)
    assert RequestStatus.PREEMPTED in seen and h.tokens("r1") == run_alone(range(1000, 1100), 60)


def test_request_beyond_context_fails_with_400():
    h = Harness(FakeEngine(num_kv_blocks=4), max_model_len=10_000)
    assert h.sched.max_model_len == 256                # capped to what the KV cache can hold
    h.add(req("a", range(200), max_tokens=100))
    out = h.last("a")
    assert (out.finish_reason, out.error_status) == (FinishReason.ERROR, 400)
    assert "maximum context length is 256 tokens" in out.error_message
    assert "200 prompt tokens + 100 max tokens = 300" in out.error_message
    assert not h.sched.waiting and not h.sched.requests


def test_preempted_echo_request_reports_each_prompt_position_once():
    # 3 blocks: the echo request (prompt 100) is preempted by the earlier one while its prompt runs in chunks
    h = Harness(FakeEngine(num_kv_blocks=3, max_batch_tokens=16), max_model_len=192)
    h.add(req("first", range(1000, 1060), max_tokens=120))
    h.step()
    echo = h.add(req("echo", range(100), max_tokens=1, prompt_logprobs=0))
    h.run_until_idle()
    assert echo.num_preemptions >= 1
    assert len(h.prompt_logprobs("echo")) == 99
    assert h.tokens("first") == run_alone(range(1000, 1060), 120)


def test_abort_frees_blocks_at_once():
    h = Harness()
    h.add(req("a", range(300), max_tokens=100))
    h.step()
    assert h.sched.kv.stats().num_used == 4          # 256 of 300 prompt tokens (the token budget)
    h.abort("a")
    assert h.sched.kv.stats().num_used == 0 and not h.sched.running
    assert h.last("a").finish_reason == FinishReason.ABORT
    h.abort("a")                                     # a second abort of a finished request is a no-op
    assert len(h.outputs["a"]) == 1


def test_timeout_fails_with_504_on_the_injected_clock():
    h = Harness()
    h.add(req("slow", range(5), max_tokens=1000, timeout_s=0.1))
    h.step()
    h.clock.now += 0.05
    assert h.expire() == []
    h.clock.now += 0.06
    (expired,) = h.expire()
    out = h.last("slow")
    assert expired.request.request_id == "slow"
    assert (out.finish_reason, out.error_status) == (FinishReason.ERROR, 504)
    assert "timed out after 0.1 s" in out.error_message
    assert h.sched.kv.stats().num_used == 0


def test_unseeded_sampling_gets_a_random_seed_greedy_and_seeded_untouched():
    h = Harness()
    h.add(req("a", [1], max_tokens=1, params=SamplingParams(temperature=0.8)))
    h.add(req("b", [2], max_tokens=1, params=SamplingParams(temperature=0.8)))
    h.add(req("c", [3], max_tokens=1, params=SamplingParams(temperature=0.8, seed=42)))
    h.add(req("d", [4], max_tokens=1, params=GREEDY))
    h.step()
    a, b, c, d = h.engine.seeds_seen
    assert isinstance(a, int) and isinstance(b, int) and a != b
    assert (c, d) == (42, None)


def test_cache_warm_prefills_full_blocks_only():
    h = Harness()
    prompt = list(range(150))
    h.add(Request("w", prompt, warm=True))
    h.step()
    out = h.last("w")
    assert out.finish_reason == FinishReason.STOP and out.token_ids == []
    assert h.engine.steps == [[(0, 128, 0)]]
    assert h.sched.kv.stats().num_cached == 2
    # warming the same text again computes nothing
    h.add(Request("w2", prompt + [1, 2], warm=True))
    h.step()
    assert h.last("w2").usage.cached_tokens == 128
    assert len(h.engine.steps) == 1
    # and the real request afterwards starts from the warmed blocks
    h.add(req("r", prompt + [5], max_tokens=1))
    h.step()
    assert h.last("r").usage.cached_tokens == 128
    assert h.engine.steps[-1] == [(128, 23, 1)]


def test_prompt_logprobs_cover_every_prompt_position():
    h = Harness(FakeEngine(max_batch_tokens=64))
    prompt = list(range(100))
    h.add(req("warm", prompt, max_tokens=1))      # put the prompt in the cache first
    h.step()
    h.add(req("a", prompt, max_tokens=1, prompt_logprobs=2))
    for _ in range(3):
        h.step()
    entries = h.prompt_logprobs("a")
    assert h.last("a").usage.cached_tokens == 0   # logits of cached positions do not exist: no hit
    assert len(entries) == 99                     # positions 1..99
    lp5, top = entries[4]                         # position 5 holds token 5, the fake's favourite
    assert top[0][0] == 5 and top[0][1] == pytest.approx(lp5)
    assert entries[0][0] < lp5


def test_prompt_logprob_chunks_respect_the_logits_row_limit():
    h = Harness(FakeEngine(max_batch_tokens=256, max_logits_rows=40), step_latency_factor=0)
    h.add(req("dec", range(5), max_tokens=10))
    h.step()
    h.add(req("echo", range(100), max_tokens=1, prompt_logprobs=0))
    for _ in range(4):
        h.step()
    # 1 row for the decode, the rest of the 40 for the echo chunk
    assert h.engine.steps[1:4] == [[(5, 1, 1), (0, 39, 0)], [(6, 1, 1), (39, 39, 0)], [(7, 1, 1), (78, 22, 1)]]
    assert len(h.prompt_logprobs("echo")) == 99


def test_echo_with_zero_max_tokens_only_scores_the_prompt():
    h = Harness()
    h.add(req("a", range(10), max_tokens=0, prompt_logprobs=0))
    h.step()
    assert h.engine.steps == [[(0, 10, 0)]]
    assert h.last("a").finish_reason == FinishReason.LENGTH and h.tokens("a") == []
    assert len(h.last("a").prompt_logprobs) == 9


def test_engine_error_fails_only_the_affected_request():
    h = Harness()
    h.add(req("good", range(30), max_tokens=20))
    h.add(req("bad", range(40), max_tokens=20))

    def explode(states):
        if any(st.request.request_id == "bad" for st in states):
            raise RuntimeError("injected fault")
    while h.sched.has_work:
        batch = h.sched.schedule()
        h.sched.postprocess(batch, run_batch(h.engine, batch, explode))
        h.collect()
    assert h.tokens("good") == run_alone(range(30), 20)
    bad = h.last("bad")
    assert (bad.finish_reason, bad.error_status) == (FinishReason.ERROR, 500)
    assert "injected fault" in bad.error_message
    assert h.sched.kv.stats().num_used == 0


def test_concurrent_requests_match_running_alone():
    h = Harness(FakeEngine(num_kv_blocks=16, max_batch_tokens=96, max_seqs=4))
    prompts = [list(range(i, i + 20 + 13 * i)) for i in range(10)]
    seeds = [None, 7] * 5
    for i, p in enumerate(prompts):
        h.add(req(f"r{i}", p, max_tokens=30, params=SamplingParams(temperature=0.0, seed=seeds[i])))
    h.run_until_idle()
    for i, (p, seed) in enumerate(zip(prompts, seeds)):
        assert h.tokens(f"r{i}") == run_alone(p, 30, seed)
    assert h.sched.kv.stats().num_used == 0
