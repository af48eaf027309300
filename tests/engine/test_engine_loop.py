"""The engine loop: the real scheduler thread over FakeEngine, the inbox, the queue limit, the watchdog,
shutdown, and delivery to event loops. States are awaited through events or outputs, never by sleeping."""

import asyncio
import threading
import time

import pytest

from inferd.engine.loop import EngineLoop, QueueFull, SchedulerStopped
from inferd.engine.request import FinishReason, Request
from inferd.engine.scheduler import Scheduler
from tests.engine.fake_engine import EOS, FakeEngine, SamplingParams, run_alone

GREEDY = SamplingParams(temperature=0.0)


def req(rid, prompt, max_tokens=4, **kw):
    kw.setdefault("params", GREEDY)
    kw.setdefault("stop_token_ids", frozenset({EOS}))
    return Request(request_id=rid, prompt_ids=list(prompt), max_tokens=max_tokens, **kw)


def make_loop(engine=None, max_waiting=256, **kw):
    engine = engine or FakeEngine()
    return EngineLoop(engine, Scheduler(engine, max_model_len=4096), max_waiting=max_waiting, **kw)


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
        loop = make_loop(engine, **kw)
        loop.start()
        started.append(loop)
        return loop

    yield start
    for loop in started:
        loop.stop()


async def test_concurrent_requests_through_the_thread_match_running_alone(running):
    s = running(FakeEngine(num_kv_blocks=16, max_batch_tokens=96, max_seqs=4))
    prompts = [list(range(i, i + 20 + 13 * i)) for i in range(10)]
    hs = [s.submit(req(f"r{i}", p, max_tokens=30)) for i, p in enumerate(prompts)]
    results = await asyncio.gather(*(collect(h) for h in hs))
    for outs, p in zip(results, prompts):
        assert tokens_of(outs) == run_alone(p, 30)
    assert s.scheduler.kv.stats().num_used == 0 and s.num_running == 0


async def test_engine_error_is_retried_alone_and_fails_only_its_request(running):
    s = running(FakeEngine())
    batch_sizes = []

    def explode(states):
        batch_sizes.append(len(states))
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
    assert s.scheduler.kv.stats().num_used == 0


async def test_queue_limit_counts_the_inbox_and_rejected_requests_free_their_place():
    s = make_loop(FakeEngine(num_kv_blocks=4), max_waiting=2)  # not started: the inbox fills up
    s.submit(req("big", range(300), max_tokens=10))
    s.submit(req("b", [1]))
    with pytest.raises(QueueFull, match="2 requests are already waiting"):
        s.submit(req("c", [1]))
    assert not s.admit_pending()
    assert s.num_waiting == 1  # "big" can never fit: failed at admission, not queued
    s.submit(req("c", [1]))
    assert s.num_waiting == 2


async def test_abort_from_the_handle_reaches_the_policy_and_frees_blocks():
    s = make_loop()
    h = s.submit(req("a", range(300), max_tokens=100))
    s.admit_pending()
    s.step()
    assert s.scheduler.kv.stats().num_used == 4
    h.abort()
    s.admit_pending()
    assert s.scheduler.kv.stats().num_used == 0 and s.num_running == 0


async def test_watchdog_fed_while_idle_and_once_per_step_while_busy(running):
    beats = 0
    enough = threading.Event()

    def watchdog():
        nonlocal beats
        beats += 1
        if beats >= 3:
            enough.set()

    s = running(FakeEngine(), watchdog=watchdog, idle_wait_s=0.01)
    assert await asyncio.to_thread(enough.wait, 10)  # idle: once per idle wait
    before, steps_before = beats, s.num_steps
    await collect(s.submit(req("a", range(5), max_tokens=20)))
    assert beats - before >= s.num_steps - steps_before >= 20  # busy: once per step


async def test_stop_aborts_everything_in_flight_and_refuses_new_requests(running):
    s = running(FakeEngine())
    s.before_step = lambda states: time.sleep(0.001)  # 4000 tokens would take seconds: it is still running
    h = s.submit(req("a", range(5), max_tokens=4000))
    first = await h.get(10)
    assert first is not None and first.finish_reason is None  # running
    await asyncio.to_thread(s.stop)
    outs = await collect(h)
    assert outs[-1].finish_reason == FinishReason.ABORT
    assert s.scheduler.kv.stats().num_used == 0
    with pytest.raises(SchedulerStopped):
        s.submit(req("b", [1]))


def test_a_closed_event_loop_is_forgotten_and_a_new_one_served():
    s = make_loop()

    async def submit_only():
        return s.submit(req("a", range(5), max_tokens=1000))

    old = asyncio.new_event_loop()
    old.run_until_complete(submit_only())
    old.close()  # "a" goes on generating for a loop that is gone
    s.admit_pending()
    s.step()  # its output finds the loop closed: the waker is dropped
    assert old not in s.event_loops

    async def fresh():
        h = s.submit(req("b", range(5), max_tokens=3))
        s.admit_pending()
        for _ in range(3):
            s.step()
        return await collect(h)

    outs = asyncio.run(fresh())
    assert len(tokens_of(outs)) == 3 and outs[-1].finish_reason == FinishReason.LENGTH


async def test_a_broken_policy_still_fails_every_request_instead_of_hanging_it(running):
    s = running(FakeEngine())

    def broken(*args, **kwargs):
        raise RuntimeError("policy bug")

    s.scheduler.schedule = broken  # the step crashes the loop ...
    s.scheduler.abort_all = broken  # ... and failing the requests through the policy crashes too
    outs = await collect(s.submit(req("a", range(5), max_tokens=3)))
    assert (outs[-1].finish_reason, outs[-1].error_status) == (FinishReason.ERROR, 500)
    assert "policy bug" in outs[-1].error_message and s.dead is not None
    with pytest.raises(SchedulerStopped):
        s.submit(req("b", [1]))


async def test_get_all_takes_what_arrived_together_and_ends_at_the_finish(running):
    s = running(FakeEngine())
    release = threading.Event()
    s.before_step = lambda states: release.wait(10)
    h = s.submit(req("a", range(5), max_tokens=6))
    assert await h.get_all(0.05) == []  # nothing yet: the keep-alive silence, still running
    assert not h.done
    release.set()

    def until_finished():  # in the scheduler, before this loop looks at the mailbox
        while s.num_running or s.num_waiting:
            time.sleep(0.005)

    await asyncio.wait_for(asyncio.to_thread(until_finished), 10)
    outs = await h.get_all(1.0)  # every step's output, at once, in order
    assert len(outs) == 6 and outs[-1].finish_reason == FinishReason.LENGTH and h.done
    assert tokens_of(outs) == run_alone(list(range(5)), 6)


async def test_a_stop_string_ends_the_request_and_the_observer_is_told(running):
    from tests.engine.test_output import LetterTokenizer, text_of

    class Seen:
        def __init__(self):
            self.finished = []

        def on_step(self, stats):
            pass

        def on_finished(self, states):
            self.finished += [st.request.request_id for st in states]

    seen = Seen()
    engine = FakeEngine()
    s = EngineLoop(engine, Scheduler(engine, max_model_len=4096), tokenizer=LetterTokenizer(), observer=seen)
    s.start()
    try:
        p = list(range(100, 120))
        tokens = run_alone(p, 40)
        stop = text_of(tokens)[10:12]
        text = text_of(tokens)
        outs = await collect(s.submit(req("r", p, max_tokens=40, stop=[stop])))
        assert "".join(o.text for o in outs) == text[: text.find(stop)]
        assert outs[-1].finish_reason is FinishReason.STOP and len(tokens_of(outs)) < 40
        assert seen.finished == ["r"] and s.scheduler.kv.stats().num_used == 0
    finally:
        s.stop()


async def test_the_loop_tells_the_policy_how_long_each_step_took(running):
    s = running(FakeEngine(max_batch_tokens=64))
    outs = await collect(s.submit(req("a", range(100), max_tokens=5)))
    assert tokens_of(outs)
    # prefill-only steps of 64 and 36 tokens, then 4 decode steps: each one's time went into the fit (whose
    # values are those of a fake engine's timing noise)
    assert s.scheduler.step_cost.num_steps == 6
