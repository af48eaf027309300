"""Speculative decoding in the scheduler, against FakeEngine (which checks block tables, the token budget, the
logits rows and that every position a sequence attends to holds its own history).

LoopyEngine's "model" picks the next token from the last two tokens only, so its generations fall into cycles
that prompt lookup predicts well, while the prompts (random tokens) can still mislead it: drafts are both
accepted and rejected. The scheduler's output must be the same token for token with and without speculation.
"""

import random

import pytest

from inferd.engine.loop import run_batch
from inferd.engine.request import FinishReason, Request, RequestState
from inferd.engine.scheduler import Scheduler
from tests.engine.fake_engine import EOS, FakeEngine, SamplingParams, fake_next_token

GREEDY = SamplingParams(temperature=0.0)


class LoopyEngine(FakeEngine):
    def next_token(self, history, seed=None) -> int:
        return 100 + fake_next_token(history[-2:], seed) % 12   # a random map over 144 (a, b) states


def prompt(n, seed=0):
    rng = random.Random(seed)
    return [rng.randrange(100, 120) for _ in range(n)]


def req(rid, prompt_ids, max_tokens=40, **kw):
    kw.setdefault("params", GREEDY)
    kw.setdefault("stop_token_ids", frozenset({EOS}))
    return Request(request_id=rid, prompt_ids=list(prompt_ids), max_tokens=max_tokens, **kw)


def run_all(engine, requests, **kw):
    """Every request to its end, step by step in this thread; (scheduler, {id: outputs}, step stats)."""
    kw.setdefault("max_model_len", 4096)
    s = Scheduler(engine, **kw)
    for r in requests:
        s.add(RequestState(r, arrival_time=0.0))
    stats = []
    outs: dict[str, list] = {r.request_id: [] for r in requests}
    for _ in range(5000):
        for st, out in s.take_outputs():
            outs[st.request.request_id].append(out)
        if not s.has_work:
            break
        batch = s.schedule()
        stats.append(s.postprocess(batch, run_batch(engine, batch)))
    else:
        raise AssertionError("requests did not finish")
    return s, outs, stats


def tokens(outs):
    return {rid: [t for o in os_ for t in o.token_ids] for rid, os_ in outs.items()}


def finish(outs):
    return {rid: os_[-1].finish_reason for rid, os_ in outs.items()}


def drafted(stats):
    return sum(x.num_draft_tokens for x in stats), sum(x.num_accepted_tokens for x in stats)


def assert_all_freed(s):
    kv = s.kv.stats()
    assert kv.num_used == 0 and kv.num_free == kv.num_blocks
    assert all(c == 0 for c in s.kv.ref_counts)


def make_requests(speculative=None, n=6, max_tokens=120, seeded=False):
    # prompt lengths around the block size, so drafts straddle block boundaries
    return [req(f"r{i}", prompt(40 + 9 * i, seed=i), max_tokens=max_tokens + i,
                params=SamplingParams(temperature=0.8, seed=100 + i) if seeded else GREEDY,
                speculative=speculative) for i in range(n)]


@pytest.mark.parametrize("seeded", [False, True])
def test_same_tokens_with_and_without_speculation(seeded):
    _, plain, plain_stats = run_all(LoopyEngine(), make_requests(seeded=seeded))
    s, spec, spec_stats = run_all(LoopyEngine(), make_requests(seeded=seeded), speculative=True)
    assert tokens(spec) == tokens(plain)
    assert finish(spec) == finish(plain) == {f"r{i}": FinishReason.LENGTH for i in range(6)}
    assert [len(t) for t in tokens(spec).values()] == [120 + i for i in range(6)]
    num_drafted, num_accepted = drafted(spec_stats)
    assert num_accepted > 0 and num_drafted > num_accepted   # drafts made, most kept, some rejected
    assert drafted(plain_stats) == (0, 0)
    assert len(spec_stats) < len(plain_stats)                 # fewer steps for the same tokens
    # generation-token counts (the metric) are the tokens delivered, not the rows sampled
    assert sum(x.num_decode_tokens for x in spec_stats) == sum(len(t) for t in tokens(spec).values())
    assert_all_freed(s)


def test_per_request_override():
    # server default off, request on
    _, _, stats = run_all(LoopyEngine(), make_requests(speculative=True, n=2))
    assert drafted(stats)[0] > 0
    # server default on, request off
    _, _, stats = run_all(LoopyEngine(), make_requests(speculative=False, n=2), speculative=True)
    assert drafted(stats) == (0, 0)


def test_drafts_never_exceed_max_tokens_or_context():
    eng = LoopyEngine()
    s, outs, stats = run_all(eng, [req("a", prompt(30), max_tokens=37, speculative=True)])
    assert len(tokens(outs)["a"]) == 37 and finish(outs)["a"] == FinishReason.LENGTH
    assert drafted(stats)[1] > 0
    generated = 0
    for step, out in zip(eng.steps, outs["a"]):   # one step, one delivery (the prompt is one chunk)
        (_, _, sampled), = step
        assert sampled <= 37 - generated          # no row sampled past max_tokens
        generated += len(out.token_ids)
    # the context (max_model_len) bounds the positions drafts are written to
    eng = LoopyEngine()
    s, outs, _ = run_all(eng, [req("b", prompt(30), max_tokens=60, speculative=True)], max_model_len=90)
    assert len(tokens(outs)["b"]) == 60
    assert max(start + n for step in eng.steps for start, n, _ in step) <= 90
    assert_all_freed(s)


def test_stop_token_inside_accepted_drafts_discards_the_rest():
    # A prompt that already holds the model's cycle, so drafts are right from the start; the stop token is the
    # one whose first appearance in the continuation comes last.
    _, plain, _ = run_all(LoopyEngine(), [req("a", prompt(50), max_tokens=200)])
    out = tokens(plain)["a"]
    second = prompt(50) + out[:100]
    first_at = {}
    for i, t in enumerate(out[100:]):
        first_at.setdefault(t, i)
    stop = max(first_at, key=first_at.get)
    stop_ids = frozenset({EOS, stop})
    _, plain, _ = run_all(LoopyEngine(), [req("a", second, max_tokens=100, stop_token_ids=stop_ids)])
    s, spec, stats = run_all(LoopyEngine(), [req("a", second, max_tokens=100, stop_token_ids=stop_ids,
                                                       speculative=True)])
    assert tokens(spec) == tokens(plain) == {"a": out[100:100 + first_at[stop] + 1]}
    assert finish(spec)["a"] == FinishReason.STOP
    # the last step accepted drafts beyond the stop token; they were dropped, not delivered
    assert stats[-1].num_accepted_tokens + 1 > len(spec["a"][-1].token_ids)
    assert_all_freed(s)


def test_token_budget_and_logits_rows_are_respected():
    # FakeEngine asserts both limits on every step; tight limits force drafts to be cut
    reqs = make_requests(n=6, max_tokens=80)
    _, plain, _ = run_all(LoopyEngine(max_batch_tokens=16, max_logits_rows=9), make_requests(n=6, max_tokens=80))
    eng = LoopyEngine(max_batch_tokens=16, max_logits_rows=9)
    s, spec, stats = run_all(eng, reqs, speculative=True)
    assert tokens(spec) == tokens(plain)
    assert drafted(stats)[1] > 0
    assert max(sum(n for _, n, _ in step) for step in eng.steps) <= 16
    assert_all_freed(s)


def test_preemption_with_speculation():
    # a cache this small preempts sequences; drafts must never preempt anyone by themselves
    _, plain, _ = run_all(LoopyEngine(num_kv_blocks=8), make_requests(n=6, max_tokens=150))
    s, spec, stats = run_all(LoopyEngine(num_kv_blocks=8), make_requests(n=6, max_tokens=150),
                                   speculative=True)
    assert tokens(spec) == tokens(plain)
    # nobody failed: waiting sequences' prefix hits are released before a lone runner is declared too big
    assert finish(spec) == finish(plain) == {f"r{i}": FinishReason.LENGTH for i in range(6)}
    assert s.num_preemptions > 0 and drafted(stats)[1] > 0
    assert_all_freed(s)


def test_prefix_cache_holds_only_accepted_tokens():
    # A second turn that starts with the first request's prompt + output hits the blocks cached during the
    # speculative run; FakeEngine asserts that each hit block holds exactly those tokens (no rejected draft).
    eng = LoopyEngine()
    first = prompt(50)
    s, outs, stats = run_all(eng, [req("a", first, max_tokens=300, speculative=True)])
    out = tokens(outs)["a"]
    assert len(out) == 300 and drafted(stats)[0] > drafted(stats)[1] > 0
    seq, bs = first + out, eng.block_size
    cached = [b for b, h in enumerate(s.kv.block_hash) if h is not None]
    assert len(cached) == (len(seq) - 1) // bs    # full blocks of computed positions (the last token has no K/V)
    for b in cached:
        assert any(list(eng.kv[b]) == seq[i:i + bs] for i in range(0, len(seq) - bs + 1, bs))
    second = seq + prompt(10, seed=9)
    st = RequestState(req("b", second, max_tokens=20), arrival_time=0.0)
    s.add(st)
    while s.has_work:
        batch = s.schedule()
        s.postprocess(batch, run_batch(eng, batch))
    assert st.num_cached_tokens == len(cached) * bs
    assert_all_freed(s)
