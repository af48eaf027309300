"""Scheduler tests against FakeEngine (fake model output, real scheduler and KV manager).

Step-level tests drive `step()` by hand in the test's thread; the others run the real scheduler thread.
"""

import asyncio
import time

import pytest

from inferd.engine.request import FinishReason, Request
from inferd.engine.scheduler import QueueFull, Scheduler
from tests.engine.fake_engine import EOS, FakeEngine, SamplingParams, run_alone

GREEDY = SamplingParams(temperature=0.0)


def make_scheduler(engine=None, **kw):
    kw.setdefault("max_model_len", 4096)
    return Scheduler(engine or FakeEngine(), **kw)


def req(rid, prompt, max_tokens=4, **kw):
    kw.setdefault("params", GREEDY)
    kw.setdefault("stop_token_ids", frozenset({EOS}))
    return Request(request_id=rid, prompt_ids=list(prompt), max_tokens=max_tokens, **kw)


def drain(handle):
    """Every output delivered so far (step-level tests run the loop's callbacks by yielding)."""
    outs = []
    while not handle.state.queue.empty():
        outs.append(handle.state.queue.get_nowait())
    return outs


async def settle():
    await asyncio.sleep(0)   # let the LoopWaker see its byte and deliver
    await asyncio.sleep(0)


async def collect(handle, timeout=10):
    async def go():
        return [o async for o in handle]
    return await asyncio.wait_for(go(), timeout)


def tokens_of(outs):
    return [t for o in outs for t in o.token_ids]


@pytest.fixture
async def running():
    started = []

    def start(engine=None, **kw):
        s = make_scheduler(engine, **kw)
        s.start()
        started.append(s)
        return s
    yield start
    for s in started:
        s.stop()


# ---- step-level behaviour ------------------------------------------------------------------------------

@pytest.mark.asyncio
async def test_single_request_prefill_then_decode_until_length():
    eng = FakeEngine()
    s = make_scheduler(eng)
    h = s.submit(req("a", range(100), max_tokens=3))
    s._drain_inbox()
    for _ in range(3):
        s.step()
    await settle()
    outs = drain(h)
    assert eng.steps == [[(0, 100, 1)], [(100, 1, 1)], [(101, 1, 1)]]
    assert tokens_of(outs) == run_alone(range(100), 3)
    assert [o.finish_reason for o in outs] == [None, None, FinishReason.LENGTH]
    assert (outs[-1].usage.prompt_tokens, outs[-1].usage.completion_tokens) == (100, 3)
    assert s.kv.stats().num_used == 0 and s.num_running == 0


@pytest.mark.asyncio
async def test_long_prompt_is_chunked_and_decodes_go_first():
    eng = FakeEngine(max_batch_tokens=128)
    s = make_scheduler(eng)
    s.submit(req("short", range(10), max_tokens=10))
    s._drain_inbox()
    s.step()                                   # short's prefill
    s.submit(req("long", range(1000, 1300), max_tokens=1))
    s._drain_inbox()
    for _ in range(3):
        s.step()
    # short decodes one token every step while long's 300-token prompt comes in 127 + 127 + 46
    assert eng.steps[1:] == [[(10, 1, 1), (0, 127, 0)], [(11, 1, 1), (127, 127, 0)], [(12, 1, 1), (254, 46, 1)]]


@pytest.mark.asyncio
async def test_running_cap_and_fcfs_admission():
    eng = FakeEngine(max_seqs=2)
    s = make_scheduler(eng)
    for i in range(3):
        s.submit(req(f"r{i}", [i] * 5, max_tokens=2))
    s._drain_inbox()
    s.step()
    assert [st.request.request_id for st in s.running] == ["r0", "r1"]
    assert [st.request.request_id for st in s.waiting] == ["r2"]
    assert s.num_waiting == 1
    s.step()          # r0 and r1 finish (max_tokens=2)
    s.step()
    assert [st.request.request_id for st in s.running] == ["r2"]
    assert s.num_waiting == 0


@pytest.mark.asyncio
async def test_stop_token_finishes_with_stop():
    eng = FakeEngine(eos_after={7: 3})
    s = make_scheduler(eng)
    h = s.submit(req("a", [7, 1, 2], max_tokens=10))
    s._drain_inbox()
    for _ in range(3):
        s.step()
    await settle()
    outs = drain(h)
    assert tokens_of(outs)[-1] == EOS and len(tokens_of(outs)) == 3
    assert outs[-1].finish_reason == FinishReason.STOP
    assert outs[-1].usage.completion_tokens == 3


@pytest.mark.asyncio
async def test_prefix_cache_hit_reported_and_kv_contents_right():
    eng = FakeEngine()
    s = make_scheduler(eng)
    prompt = list(range(200))
    h1 = s.submit(req("a", prompt, max_tokens=1))
    s._drain_inbox()
    s.step()
    await settle()
    assert drain(h1)[-1].usage.cached_tokens == 0
    h2 = s.submit(req("b", prompt[:150] + [7, 7, 7], max_tokens=2))
    s._drain_inbox()
    s.step()
    s.step()
    await settle()
    outs = drain(h2)
    assert outs[-1].usage.cached_tokens == 128              # two full blocks of 64
    assert eng.steps[1] == [(128, 25, 1)]                   # only the uncached tail ran
    assert tokens_of(outs) == run_alone(prompt[:150] + [7, 7, 7], 2)   # FakeEngine checked the K/V
    st = s.kv.stats()
    assert (st.prefix_queries, st.prefix_hits) == (353, 128)


@pytest.mark.asyncio
async def test_fully_cached_prompt_still_runs_its_last_block():
    eng = FakeEngine()
    s = make_scheduler(eng)
    prompt = list(range(128))
    for rid in ("a", "b"):
        h = s.submit(req(rid, prompt, max_tokens=1))
        s._drain_inbox()
        s.step()
    await settle()
    assert drain(h)[-1].usage.cached_tokens == 64
    assert eng.steps[1] == [(64, 64, 1)]


@pytest.mark.asyncio
async def test_preemption_when_blocks_run_out_gives_same_tokens():
    # 4 blocks of 64: two sequences of 100 prompt + 60 generated each need 3 blocks; they cannot both fit
    eng = FakeEngine(num_kv_blocks=4, max_batch_tokens=512)
    s = make_scheduler(eng, max_model_len=256)
    prompts = [list(range(i * 1000, i * 1000 + 100)) for i in range(2)]
    hs = [s.submit(req(f"r{i}", p, max_tokens=60)) for i, p in enumerate(prompts)]
    s._drain_inbox()
    for _ in range(400):
        if not s.running and not s.waiting:
            break
        s.step()
    await settle()
    for h, p in zip(hs, prompts):
        outs = drain(h)
        assert tokens_of(outs) == run_alone(p, 60)
        assert outs[-1].finish_reason == FinishReason.LENGTH
    assert sum(h.state.num_preemptions for h in hs) >= 1
    assert hs[0].state.num_preemptions == 0     # the earlier request keeps its blocks (FCFS)
    assert s.kv.stats().num_used == 0


@pytest.mark.asyncio
async def test_request_beyond_context_fails_with_400():
    s = make_scheduler(FakeEngine(num_kv_blocks=4), max_model_len=10_000)
    assert s.max_model_len == 256                # capped to what the KV cache can hold
    h = s.submit(req("a", range(200), max_tokens=100))
    s._drain_inbox()
    await settle()
    out = drain(h)[-1]
    assert (out.finish_reason, out.error_status) == (FinishReason.ERROR, 400)
    assert "maximum context length is 256 tokens" in out.error_message
    assert "200 prompt tokens + 100 max tokens = 300" in out.error_message


@pytest.mark.asyncio
async def test_rejected_requests_do_not_count_against_the_queue_limit():
    s = make_scheduler(FakeEngine(num_kv_blocks=4), max_waiting=2)
    for i in range(5):
        s.submit(req(f"big{i}", range(300), max_tokens=10))
        s._drain_inbox()
    assert s.num_waiting == 0
    s.submit(req("a", [1]))
    s.submit(req("b", [1]))
    assert s.num_waiting == 2


@pytest.mark.asyncio
async def test_preempted_echo_request_reports_each_prompt_position_once():
    # 3 blocks: the echo request (prompt 100) is preempted by the earlier one while its prompt runs in chunks
    eng = FakeEngine(num_kv_blocks=3, max_batch_tokens=16)
    s = make_scheduler(eng, max_model_len=192)
    first = s.submit(req("first", range(1000, 1060), max_tokens=120))
    s._drain_inbox()
    s.step()
    echo = s.submit(req("echo", range(100), max_tokens=1, prompt_logprobs=0))
    s._drain_inbox()
    for _ in range(400):
        if not s.running and not s.waiting:
            break
        s.step()
    await settle()
    outs = drain(echo)
    assert echo.state.num_preemptions >= 1
    entries = [e for o in outs if o.prompt_logprobs for e in o.prompt_logprobs]
    assert len(entries) == 99
    assert tokens_of(drain(first)) == run_alone(range(1000, 1060), 120)


@pytest.mark.asyncio
async def test_abort_frees_blocks_at_next_step():
    s = make_scheduler(FakeEngine())
    h = s.submit(req("a", range(300), max_tokens=100))
    s._drain_inbox()
    s.step()
    assert s.kv.stats().num_used == 4          # 256 of 300 prompt tokens (the token budget)
    h.abort()
    s._drain_inbox()
    assert s.kv.stats().num_used == 0 and s.num_running == 0
    await settle()
    assert drain(h)[-1].finish_reason == FinishReason.ABORT


@pytest.mark.asyncio
async def test_queue_limit_raises_queue_full():
    s = make_scheduler(FakeEngine(), max_waiting=2)
    s.submit(req("a", [1]))
    s.submit(req("b", [1]))
    with pytest.raises(QueueFull, match="2 requests are already waiting"):
        s.submit(req("c", [1]))


@pytest.mark.asyncio
async def test_unseeded_sampling_gets_a_random_seed_greedy_and_seeded_untouched():
    eng = FakeEngine()
    s = make_scheduler(eng)
    s.submit(req("a", [1], max_tokens=1, params=SamplingParams(temperature=0.8)))
    s.submit(req("b", [2], max_tokens=1, params=SamplingParams(temperature=0.8)))
    s.submit(req("c", [3], max_tokens=1, params=SamplingParams(temperature=0.8, seed=42)))
    s.submit(req("d", [4], max_tokens=1, params=GREEDY))
    s._drain_inbox()
    s.step()
    a, b, c, d = eng.seeds_seen
    assert isinstance(a, int) and isinstance(b, int) and a != b
    assert (c, d) == (42, None)


@pytest.mark.asyncio
async def test_cache_warm_prefills_full_blocks_only():
    eng = FakeEngine()
    s = make_scheduler(eng)
    prompt = list(range(150))
    h = s.submit(Request("w", prompt, warm=True))
    s._drain_inbox()
    s.step()
    await settle()
    out = drain(h)[-1]
    assert out.finish_reason == FinishReason.STOP and out.token_ids == []
    assert eng.steps == [[(0, 128, 0)]]
    assert s.kv.stats().num_cached == 2
    # warming the same text again computes nothing
    h = s.submit(Request("w2", prompt + [1, 2], warm=True))
    s._drain_inbox()
    s.step()
    await settle()
    assert drain(h)[-1].usage.cached_tokens == 128
    assert len(eng.steps) == 1
    # and the real request afterwards starts from the warmed blocks
    h = s.submit(req("r", prompt + [5], max_tokens=1))
    s._drain_inbox()
    s.step()
    await settle()
    assert drain(h)[-1].usage.cached_tokens == 128
    assert eng.steps[-1] == [(128, 23, 1)]


@pytest.mark.asyncio
async def test_prompt_logprobs_cover_every_prompt_position():
    s = make_scheduler(FakeEngine(max_batch_tokens=64))
    prompt = list(range(100))
    s.submit(req("warm", prompt, max_tokens=1))      # put the prompt in the cache first
    s._drain_inbox()
    s.step()
    h = s.submit(req("a", prompt, max_tokens=1, prompt_logprobs=2))
    s._drain_inbox()
    for _ in range(3):
        s.step()
    await settle()
    outs = drain(h)
    entries = [e for o in outs if o.prompt_logprobs for e in o.prompt_logprobs]
    assert outs[-1].usage.cached_tokens == 0      # logits of cached positions do not exist: no hit
    assert len(entries) == 99                     # positions 1..99
    lp5, top = entries[4]                         # position 5 holds token 5, the fake's favourite
    assert top[0][0] == 5 and top[0][1] == pytest.approx(lp5)
    assert entries[0][0] < lp5


@pytest.mark.asyncio
async def test_prompt_logprob_chunks_respect_the_logits_row_limit():
    eng = FakeEngine(max_batch_tokens=256, max_logits_rows=40)
    s = make_scheduler(eng)
    s.submit(req("dec", range(5), max_tokens=10))
    s._drain_inbox()
    s.step()
    h = s.submit(req("echo", range(100), max_tokens=1, prompt_logprobs=0))
    s._drain_inbox()
    for _ in range(4):
        s.step()
    await settle()
    # 1 row for the decode, the rest of the 40 for the echo chunk
    assert [st for st in eng.steps[1:4]] == [[(5, 1, 1), (0, 39, 0)], [(6, 1, 1), (39, 39, 0)],
                                             [(7, 1, 1), (78, 22, 1)]]
    assert len([e for o in drain(h) if o.prompt_logprobs for e in o.prompt_logprobs]) == 99


@pytest.mark.asyncio
async def test_echo_with_zero_max_tokens_only_scores_the_prompt():
    eng = FakeEngine()
    s = make_scheduler(eng)
    h = s.submit(req("a", range(10), max_tokens=0, prompt_logprobs=0))
    s._drain_inbox()
    s.step()
    await settle()
    outs = drain(h)
    assert eng.steps == [[(0, 10, 0)]]
    assert outs[-1].finish_reason == FinishReason.LENGTH and tokens_of(outs) == []
    assert len(outs[-1].prompt_logprobs) == 9


# ---- the real thread -----------------------------------------------------------------------------------

@pytest.mark.asyncio
async def test_concurrent_requests_match_running_alone(running):
    s = running(FakeEngine(num_kv_blocks=16, max_batch_tokens=96, max_seqs=4))
    prompts = [list(range(i, i + 20 + 13 * i)) for i in range(10)]
    seeds = [None, 7] * 5
    hs = [s.submit(req(f"r{i}", p, max_tokens=30, params=SamplingParams(temperature=0.0, seed=seeds[i])))
          for i, p in enumerate(prompts)]
    results = await asyncio.gather(*(collect(h) for h in hs))
    for outs, p, seed in zip(results, prompts, seeds):
        assert tokens_of(outs) == run_alone(p, 30, seed)
    assert s.kv.stats().num_used == 0


@pytest.mark.asyncio
async def test_engine_error_fails_only_the_affected_request(running):
    s = running(FakeEngine())

    def explode(states):
        if any(st.request.request_id == "bad" for st in states):
            raise RuntimeError("injected fault")
    s.before_step = explode
    good = s.submit(req("good", range(30), max_tokens=20))
    bad = s.submit(req("bad", range(40), max_tokens=20))
    good_outs, bad_outs = await asyncio.gather(collect(good), collect(bad))
    assert tokens_of(good_outs) == run_alone(range(30), 20)
    assert (bad_outs[-1].finish_reason, bad_outs[-1].error_status) == (FinishReason.ERROR, 500)
    assert "injected fault" in bad_outs[-1].error_message
    after = await collect(s.submit(req("after", range(5), max_tokens=2)))
    assert after[-1].finish_reason == FinishReason.LENGTH
    assert s.kv.stats().num_used == 0


@pytest.mark.asyncio
async def test_timeout_fails_with_504(running):
    s = running(FakeEngine())
    s.before_step = lambda states: time.sleep(0.02)
    outs = await collect(s.submit(req("slow", range(5), max_tokens=1000, timeout_s=0.1)))
    assert (outs[-1].finish_reason, outs[-1].error_status) == (FinishReason.ERROR, 504)
    assert "timed out after 0.1 s" in outs[-1].error_message
    assert s.kv.stats().num_used == 0


@pytest.mark.asyncio
async def test_watchdog_fed_while_idle_and_busy(running):
    beats = []
    s = running(FakeEngine(), watchdog=lambda: beats.append(time.monotonic()), idle_wait_s=0.05)
    await asyncio.sleep(0.3)
    assert len(beats) >= 3                     # idle: once per idle wait
    n = len(beats)
    await collect(s.submit(req("a", range(5), max_tokens=20)))
    assert len(beats) >= n + 20                # busy: once per step


@pytest.mark.asyncio
async def test_stop_aborts_everything_in_flight(running):
    s = running(FakeEngine())
    s.before_step = lambda states: time.sleep(0.01)
    h = s.submit(req("a", range(5), max_tokens=1000))
    await asyncio.sleep(0.05)
    s.stop()
    outs = await collect(h)
    assert outs[-1].finish_reason == FinishReason.ABORT
    assert s.kv.stats().num_used == 0


def test_a_closed_loop_is_forgotten_and_a_new_one_served():
    s = make_scheduler(FakeEngine())
    s.start()
    try:
        async def submit_only():
            return s.submit(req("a", range(5), max_tokens=1000))

        loop = asyncio.new_event_loop()
        waker = loop.run_until_complete(submit_only()).state.waker
        loop.close()            # "a" goes on generating for a loop that is gone
        deadline = time.monotonic() + 10
        while not waker.closed and time.monotonic() < deadline:
            time.sleep(0.01)
        assert waker.closed and loop not in s._wakers

        async def fresh():
            return await collect(s.submit(req("b", range(5), max_tokens=3)))

        outs = asyncio.run(fresh())
        assert len(tokens_of(outs)) == 3 and outs[-1].finish_reason == FinishReason.LENGTH
    finally:
        s.stop()
