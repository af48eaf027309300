"""The scheduling policy with prefix hits within a block (kv_cache.py), over a fake engine that copies KV blocks:
its step() fails on any position whose K/V is not the sequence's own token, so every hit checks what was copied."""

from inferd.engine.request import FinishReason, Request
from tests.engine.fake_engine import CopyingFakeEngine, FakeEngine, run_alone
from tests.engine.test_scheduler import Harness, req
from tests.engine.test_scheduler_speculative import LoopyEngine
from tests.engine.test_scheduler_speculative import prompt as spec_prompt


def test_the_cache_granule_is_a_position_only_where_blocks_can_be_copied():
    assert Harness(CopyingFakeEngine()).sched.cache_granule == 1
    assert Harness(FakeEngine()).sched.cache_granule == 64
    assert Harness(CopyingFakeEngine(), enable_prefix_caching=False).sched.cache_granule == 64
    recurrent = CopyingFakeEngine()
    recurrent.num_state_slots = 2  # a model with recurrent layers: its state exists only at block boundaries
    assert Harness(recurrent).sched.cache_granule == 64


def test_a_warm_computes_every_token_and_the_request_only_what_follows():
    h = Harness(CopyingFakeEngine())
    prompt = list(range(150))
    h.add(Request("w", prompt, warm=True))
    h.step()
    assert h.last("w").finish_reason == FinishReason.STOP
    assert h.engine.steps == [[(0, 150, 0)]]
    h.add(Request("w2", prompt, warm=True))  # warming the same text again computes nothing
    h.step()
    assert h.last("w2").usage.cached_tokens == 150 and len(h.engine.steps) == 1
    h.add(req("r", prompt + [5, 6], max_tokens=3))
    h.run_until_idle()
    assert h.last("r").usage.cached_tokens == 150
    assert h.engine.steps[1] == [(150, 2, 1)]
    assert h.tokens("r") == run_alone(prompt + [5, 6], 3)


def test_a_conversations_next_turn_computes_only_its_new_tokens():
    h = Harness(CopyingFakeEngine())
    turn1 = list(range(1000, 1100))
    h.add(req("t1", turn1, max_tokens=20))
    h.run_until_idle()
    answer = h.tokens("t1")
    assert answer == run_alone(turn1, 20)
    turn2 = turn1 + answer + list(range(50, 60))  # the last answer token's K/V was never computed
    h.add(req("t2", turn2, max_tokens=5))
    h.run_until_idle()
    assert h.last("t2").usage.cached_tokens == 119
    assert h.engine.steps[-5][0][:2] == (119, 11)
    assert h.tokens("t2") == run_alone(turn2, 5)


def test_requests_sharing_prefixes_under_preemption_give_their_own_tokens():
    # 6 blocks for requests of 3 blocks each: preemptions, tails kept and evicted, copies from tails and full blocks
    h = Harness(CopyingFakeEngine(num_kv_blocks=6, max_batch_tokens=96), max_model_len=192)
    base = list(range(2000, 2090))
    prompts = [base[: 70 + 7 * i] + list(range(i * 10, i * 10 + 3 * i + 1)) for i in range(6)]
    for i, p in enumerate(prompts):
        h.add(req(f"r{i}", p, max_tokens=60))
    h.run_until_idle()
    for i, p in enumerate(prompts):
        assert h.tokens(f"r{i}") == run_alone(p, 60)
    assert h.sched.num_preemptions > 0
    assert h.sched.kv.stats().prefix_hits > 0



class LoopyCopyingEngine(CopyingFakeEngine):
    """test_scheduler_speculative's LoopyEngine (its generations cycle: drafts accepted and rejected), copying."""

    next_token = LoopyEngine.next_token


def test_a_conversation_with_speculative_decoding_over_tails_gives_plain_decodings_tokens():
    def conversation(speculative):
        h = Harness(LoopyCopyingEngine(max_batch_tokens=512), speculative=speculative)
        history, answers, cached, lengths = spec_prompt(70), [], [], []
        drafted = accepted = 0
        for i in range(4):  # each turn: the one before, its answer and a new question
            h.add(req(f"t{i}", history, max_tokens=40))
            while h.sched.has_work:
                stats = h.step()
                drafted, accepted = drafted + stats.num_draft_tokens, accepted + stats.num_accepted_tokens
            answers.append(h.tokens(f"t{i}"))
            cached.append(h.last(f"t{i}").usage.cached_tokens)
            lengths.append(len(history))
            history = history + answers[-1] + spec_prompt(9, seed=i + 1)
        return answers, cached, lengths, (drafted, accepted)

    plain, cached, lengths, _ = conversation(False)
    drafted, cached_drafted, _, (n_draft, n_accepted) = conversation(True)
    assert drafted == plain
    assert 0 < n_accepted < n_draft  # drafts were both accepted and rejected
    # every turn after the first: the turn before's prompt and all of its answer but the last token
    assert cached == cached_drafted == [0] + [n + 39 for n in lengths[:-1]]
