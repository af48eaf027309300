"""The output processor over the real scheduler and FakeEngine: text, stop strings (also inside accepted
speculative drafts), the held-back tail, and the scheduler told to end a sequence that hit a stop string.

The tokenizer maps each token to one letter (LoopyEngine generates tokens 100..111: 'a'..'l'), so stop strings
occur often and their expected cut can be computed from the plain token stream."""

import pytest

from inferd.engine.loop import run_batch
from inferd.engine.output import OutputProcessor
from inferd.engine.request import FinishReason, Request, RequestState
from inferd.engine.scheduler import Scheduler
from tests.engine.fake_engine import EOS, SamplingParams
from tests.engine.test_scheduler_speculative import LoopyEngine, assert_all_freed, prompt

GREEDY = SamplingParams(temperature=0.0, logprobs=0)


class LetterTokenizer:
    """Token t is the letter 'a' + (t - 100); EOS is special and has no text."""

    strip_first_space = False
    special_ids = frozenset({EOS})

    def token_bytes(self, token_id: int, skip_special: bool = True) -> bytes:
        if token_id == EOS:
            return b"" if skip_special else b"</s>"
        return bytes([ord("a") + (token_id - 100) % 26])


def text_of(tokens):
    return "".join(chr(ord("a") + (t - 100) % 26) for t in tokens if t != EOS)


def run(requests, speculative=False, engine=None):
    """Every request to its end through scheduler + output processor; ({id: outputs}, {id: state}, scheduler)."""
    engine = engine or LoopyEngine()
    s = Scheduler(engine, max_model_len=4096, speculative=speculative)
    processor = OutputProcessor(LetterTokenizer(), s)
    states = {r.request_id: RequestState(r, arrival_time=0.0) for r in requests}
    for st in states.values():
        s.add(st)
    outs: dict[str, list] = {r.request_id: [] for r in requests}
    for _ in range(5000):
        for st, out in processor.process(s.take_outputs()):
            outs[st.request.request_id].append(out)
        if not s.has_work:
            return outs, states, s
        batch = s.schedule()
        s.postprocess(batch, run_batch(engine, batch))
    raise AssertionError("requests did not finish")


def req(rid, n_prompt, max_tokens=60, **kw):
    kw.setdefault("params", GREEDY)
    kw.setdefault("stop_token_ids", frozenset({EOS}))
    return Request(request_id=rid, prompt_ids=prompt(n_prompt, seed=n_prompt), max_tokens=max_tokens, **kw)


def plain_tokens(rid, n_prompt, max_tokens):
    outs, _, _ = run([req(rid, n_prompt, max_tokens)])
    return [t for o in outs[rid] for t in o.token_ids]


def expected_cut(tokens, stop):
    """(tokens kept, text) where the first occurrence of `stop` in the text completes, or None."""
    for k in range(1, len(tokens) + 1):
        text = text_of(tokens[:k])
        i = text.find(stop)
        if i >= 0:
            return k, text[:i]
    return None


@pytest.mark.parametrize("speculative", [False, True])
def test_a_stop_string_cuts_the_text_the_tokens_and_the_usage_where_it_completes(speculative):
    n_prompt, max_tokens = 40, 80
    tokens = plain_tokens("p", n_prompt, max_tokens)
    text = text_of(tokens)
    # stops that complete at different places: a two-letter pair from the middle, one from near the end
    stops = [text[30:32], text[70:73]]
    for stop in stops:
        k, want = expected_cut(tokens, stop)
        outs, states, s = run([req("r", n_prompt, max_tokens, stop=["zzz", stop])], speculative)
        got = outs["r"]
        assert "".join(o.text for o in got) == want
        assert got[-1].stop_string == stop and all(o.stop_string is None for o in got[:-1])  # which stop ended it
        assert [t for o in got for t in o.token_ids] == tokens[:k]
        assert sum(len(o.logprobs) for o in got) == k  # logprobs cut with their tokens
        assert got[-1].finish_reason is FinishReason.STOP and got[-1].usage.completion_tokens == k
        st = states["r"]
        assert st.output_ids == tokens[:k] and st.finish_reason is FinishReason.STOP
        assert not s.running and not s.waiting
        assert_all_freed(s)


def test_speculation_really_drafts_here():
    # the equality above means something only if drafts were accepted across the cut
    engine = LoopyEngine()
    s = Scheduler(engine, max_model_len=4096, speculative=True)
    s.add(RequestState(req("r", 40, 80), arrival_time=0.0))
    accepted = 0
    while s.has_work:
        batch = s.schedule()
        accepted += s.postprocess(batch, run_batch(engine, batch)).num_accepted_tokens
    assert accepted > 10


def test_text_held_back_for_a_stop_string_that_never_comes_is_released_at_the_end():
    for max_tokens in (20, 37):
        tokens = plain_tokens("p", 40, max_tokens)
        stop = text_of(tokens)[-1] + "zz"  # its first letter ends the output: held back, then released
        outs, _, _ = run([req("r", 40, max_tokens, stop=[stop])])
        assert "".join(o.text for o in outs["r"]) == text_of(tokens)
        assert outs["r"][-1].finish_reason is FinishReason.LENGTH


def test_text_held_back_is_released_at_eos_too():
    tokens = plain_tokens("p", 40, 15)
    engine = LoopyEngine(eos_after={prompt(40, seed=40)[0]: 16})  # EOS as the 16th generated token
    stop = text_of(tokens)[-1] + "zz"
    outs, _, _ = run([req("r", 40, 50, stop=[stop])], engine=engine)
    got = outs["r"]
    assert [t for o in got for t in o.token_ids] == tokens + [EOS]
    assert "".join(o.text for o in got) == text_of(tokens)
    assert got[-1].finish_reason is FinishReason.STOP and got[-1].stop_string is None  # EOS, not a stop string


def test_requests_without_text_pass_through_untouched():
    tokens = plain_tokens("p", 40, 30)
    outs, _, _ = run([req("r", 40, 30, stop=[text_of(tokens)[5:7]], detokenize=False)])
    assert [t for o in outs["r"] for t in o.token_ids] == tokens  # no text: stop strings cannot apply
    assert all(o.text == "" for o in outs["r"])
