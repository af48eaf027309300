"""The C sampler's allowed-token mask (a grammar's packed bitmask, applied before anything else).

- a masked token is never drawn under any setting: greedy, temperature, top-k, top-p, min-p, penalties, a
  logit_bias that would otherwise make it certain, logprobs on;
- among the allowed tokens the distribution is the model's, renormalised (chi-square over fixed draws);
- ties resolve to the first allowed maximum; all-but-one masked always gives that one (logprob exactly 0);
- nothing allowed gives token -1;
- logprobs (the chosen token's and the top k) are log_softmax over the allowed tokens only; past the number of
  allowed tokens the top entries are id -1;
- the same draws on every kernel path; through Context.forward() with a mask row per sampled row.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from inferd import _cpu
from inferd.engine.weights import build_cpu_model
from tests.ext.test_bit_identity import PATHS
from tests.reference import random_model

N_DRAWS = 6000


def pack(allowed_ids, vocab: int) -> np.ndarray:
    words = np.zeros(_cpu.mask_words(vocab), np.uint32)
    for i in allowed_ids:
        words[i >> 5] |= np.uint32(1 << (i & 31))
    return words


def sample(logits, pos=0, allowed=None, history=(), bias=None, **params):
    return _cpu.sample(np.asarray(logits, np.float32), params, pos, history=list(history), bias=bias,
                       allowed=allowed)


def masked_log_softmax(x, allowed_ids):
    x = np.asarray(x, np.float64)
    out = np.full(x.shape, -np.inf)
    a = sorted(allowed_ids)
    m = x[a].max()
    out[a] = x[a] - m - math.log(np.exp(x[a] - m).sum())
    return out


def test_pack_layout():
    """bit (i & 31) of word (i >> 5): the layout llguidance writes (checked in tests/text/test_grammar.py)."""
    words = pack([0, 31, 32, 70], 100)
    assert words.tolist() == [1 | (1 << 31), 1, 1 << 6, 0]


SETTINGS = [
    {"temperature": 0.0},
    {"temperature": 1.0},
    {"temperature": 2.5},
    {"temperature": 0.7, "top_k": 5},
    {"temperature": 0.7, "top_k": 500},                    # k past the number of allowed tokens
    {"temperature": 1.0, "top_p": 0.9},
    {"temperature": 1.0, "top_p": 0.05},
    {"temperature": 1.0, "min_p": 0.2},
    {"temperature": 1.0, "top_k": 20, "top_p": 0.8, "min_p": 0.05},
    {"temperature": 1.0, "repetition_penalty": 0.1, "presence_penalty": -2.0, "frequency_penalty": -2.0},
    {"temperature": 0.0, "repetition_penalty": 0.1, "presence_penalty": -2.0, "frequency_penalty": -2.0},
    {"temperature": 1.0, "num_logprobs": 20},
]


@pytest.mark.parametrize("params", SETTINGS, ids=lambda p: ",".join(f"{k}={v}" for k, v in p.items()))
def test_masked_tokens_are_never_drawn(params):
    rng = np.random.default_rng(1)
    vocab = 300
    logits = rng.standard_normal(vocab).astype(np.float32) * 3
    allowed = set(rng.choice(vocab, 40, replace=False).tolist())
    forbidden = sorted(set(range(vocab)) - allowed)
    best_forbidden = forbidden[int(np.argmax(logits[forbidden]))]
    # every pressure towards a forbidden token: a huge bias, and penalties that favour repeated forbidden tokens
    bias = {best_forbidden: 90.0, forbidden[0]: 50.0}
    history = forbidden[:30] * 2
    mask = pack(allowed, vocab)
    drawn = {sample(logits, pos, mask, history=history, bias=bias, seed=3, num_prompt=10, **params)[0]
             for pos in range(400)}
    assert drawn <= allowed, f"drew masked tokens {sorted(drawn - allowed)}"


def test_masked_distribution_is_the_renormalised_model_distribution():
    rng = np.random.default_rng(2)
    vocab = 64
    logits = rng.standard_normal(vocab).astype(np.float32)
    allowed = [1, 5, 9, 33, 40, 63]
    mask = pack(allowed, vocab)
    tokens = np.array([sample(logits, pos, mask, temperature=1.0, seed=99)[0] for pos in range(N_DRAWS)])
    expected = np.exp(masked_log_softmax(logits, allowed))
    counts = np.bincount(tokens, minlength=vocab)
    assert counts[[i for i in range(vocab) if i not in allowed]].sum() == 0
    e = expected[allowed] * N_DRAWS
    chi2 = float(((counts[allowed] - e) ** 2 / e).sum())
    assert chi2 < 27.9, chi2            # chi-square(5) upper 1e-4 quantile ~ 25.7; a uniform draw gives ~1000s


def test_greedy_ties_take_the_first_allowed_maximum():
    x = np.array([5.0, 5.0, 5.0, 1.0, 5.0], np.float32)
    assert sample(x, 0, pack([1, 2, 3, 4], 5), temperature=0.0)[0] == 1
    assert sample(x, 0, pack([3, 4], 5), temperature=0.0)[0] == 4
    assert sample(x, 0, pack([3], 5), temperature=0.0)[0] == 3     # the only one, though far below the rest


@pytest.mark.parametrize("params", SETTINGS, ids=lambda p: ",".join(f"{k}={v}" for k, v in p.items()))
def test_all_but_one_masked_always_gives_that_one(params):
    rng = np.random.default_rng(3)
    vocab = 257                                          # a partial last word
    logits = rng.standard_normal(vocab).astype(np.float32)
    only = int(np.argmin(logits))                        # the least likely token
    for pos in range(50):
        tok, lp, top_ids, top_lps = sample(logits, pos, pack([only], vocab), history=[1, 2, 3] * 4,
                                           bias={int(np.argmax(logits)): 100.0}, seed=7,
                                           **{"num_logprobs": 3, **params})
        assert tok == only
        assert lp == 0.0                                 # log(1), exactly
        assert top_ids[0] == only and top_lps[0] == 0.0
        assert all(i == -1 for i in top_ids[1:]) and all(v == -math.inf for v in top_lps[1:])


def test_last_token_of_a_partial_word_can_be_the_allowed_one():
    vocab = 257
    logits = np.zeros(vocab, np.float32)
    assert sample(logits, 0, pack([256], vocab), temperature=0.0)[0] == 256
    assert sample(logits, 0, pack([256], vocab), temperature=1.0, seed=1)[0] == 256


def test_nothing_allowed_gives_token_minus_one():
    logits = np.arange(40, dtype=np.float32)
    for params in ({"temperature": 0.0}, {"temperature": 1.0, "top_k": 3, "num_logprobs": 2}):
        tok, lp, top_ids, _ = sample(logits, 0, pack([], 40), **params)
        assert tok == -1 and lp == -math.inf
        assert all(i == -1 for i in top_ids)


def test_logprobs_are_reported_after_masking():
    rng = np.random.default_rng(4)
    vocab = 500
    logits = rng.standard_normal(vocab).astype(np.float32) * 2
    allowed = sorted(rng.choice(vocab, 12, replace=False).tolist())
    want = masked_log_softmax(logits, allowed)
    order = sorted(allowed, key=lambda i: (-logits[i], i))
    for pos in range(20):
        tok, lp, top_ids, top_lps = sample(logits, pos, pack(allowed, vocab), temperature=1.0, seed=5,
                                           num_logprobs=20, bias={allowed[0]: 3.0})
        assert tok in allowed
        assert lp == pytest.approx(want[tok], abs=1e-5)
        assert top_ids[:12] == order                          # only allowed tokens, best first
        np.testing.assert_allclose(top_lps[:12], want[order], atol=1e-5)
        assert top_ids[12:] == [-1] * 8 and top_lps[12:] == [-math.inf] * 8


def test_an_all_ones_mask_changes_nothing():
    rng = np.random.default_rng(5)
    vocab = 333
    logits = rng.standard_normal(vocab).astype(np.float32)
    ones = np.full(_cpu.mask_words(vocab), 0xFFFFFFFF, np.uint32)
    for params in SETTINGS:
        for pos in range(10):
            kw = dict(history=[3, 4, 4], bias={7: 1.0}, seed=11, **params)
            assert sample(logits, pos, ones, **kw) == sample(logits, pos, None, **kw)


def test_mask_accepts_llguidance_int32_words_and_checks_the_length():
    logits = np.zeros(40, np.float32)
    as_int32 = pack([39], 40).view(np.int32)
    assert sample(logits, 0, as_int32, temperature=0.0)[0] == 39
    with pytest.raises(ValueError, match="words"):
        sample(logits, 0, np.zeros(1, np.uint32))
    with pytest.raises(ValueError, match="int32 or uint32"):
        sample(logits, 0, np.zeros(2, np.int64))


def test_masked_draws_identical_on_every_path():
    rng = np.random.default_rng(6)
    vocab = 1000
    logits = rng.standard_normal(vocab).astype(np.float32)
    mask = pack(rng.choice(vocab, 300, replace=False).tolist(), vocab)
    results = {}
    try:
        for p in PATHS:
            _cpu.set_path(p)
            results[p] = [sample(logits, pos, mask, history=[1, 2, 3], seed=5, **{"num_logprobs": 5, **params})
                          for params in SETTINGS for pos in range(10)]
    finally:
        _cpu.set_path(PATHS[-1])
    for p in PATHS[1:]:
        assert results[p] == results[PATHS[0]], p


# ---- through Context.forward ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def ctx():
    model = random_model(weight_type="Q8_0", vocab=300, tie=False)
    return _cpu.Context(build_cpu_model(model), 16, 4, 2, 1), model.config.vocab_size


def run_forward(ctx, masks=None, mask_row=None, temperature=0.0):
    context, _ = ctx
    tokens = np.array([5, 17, 42, 9, 11, 12], np.int32)              # two sequences of three tokens
    params = np.zeros(2, _cpu.SAMPLE_PARAMS_DTYPE)
    params["temperature"], params["top_p"], params["repetition_penalty"] = temperature, 1.0, 1.0
    params["num_logprobs"], params["seed"] = 2, [1, 2]
    params["mask_row"] = -1 if mask_row is None else mask_row
    samples, logits, _ = context.forward(
        tokens, np.array([0, 1, 2, 0, 1, 2], np.int32), np.array([0, 0, 0, 1, 1, 1], np.int32),
        np.array([[0], [1]], np.int32), np.array([2, 5], np.int32), np.ones(2, np.int32), params,
        np.zeros(0, np.int32), np.zeros(0, np.int32), np.zeros(0, np.float32), want_logits=True, token_masks=masks)
    return samples, logits


def test_forward_applies_each_rows_mask_row(ctx):
    vocab = ctx[1]
    free, logits = run_forward(ctx)
    # row 0 may only take its 3rd-best token; row 1 is unconstrained though masks are present
    third = int(np.argsort(-logits[0], kind="stable")[2])
    masks = np.stack([pack([int(np.argmax(logits[1]))], vocab), pack([third], vocab)])
    s, _ = run_forward(ctx, masks, mask_row=[1, -1])
    assert s["token"].tolist() == [third, free["token"][1]]
    assert s["logprob"][0] == 0.0 and s["logprob"][1] == free["logprob"][1]
    for temperature in (0.0, 1.0):
        s, _ = run_forward(ctx, masks, mask_row=[0, 0], temperature=temperature)
        assert s["token"].tolist() == [int(np.argmax(logits[1]))] * 2


def test_forward_without_mask_rows_ignores_masks(ctx):
    vocab = ctx[1]
    free, _ = run_forward(ctx)
    s, _ = run_forward(ctx, np.zeros((1, _cpu.mask_words(vocab)), np.uint32))   # mask_row -1: unconstrained
    assert s["token"].tolist() == free["token"].tolist()
    s, _ = run_forward(ctx, None, mask_row=[0, 0])                              # no masks: mask_row is ignored
    assert s["token"].tolist() == free["token"].tolist()


def test_forward_rejects_bad_masks(ctx):
    vocab = ctx[1]
    with pytest.raises(ValueError, match="words"):
        run_forward(ctx, np.zeros((1, 3), np.uint32), mask_row=[0, 0])
    with pytest.raises(ValueError, match="mask_row outside token_masks"):
        run_forward(ctx, np.zeros((1, _cpu.mask_words(vocab)), np.uint32), mask_row=[0, 1])


@pytest.mark.parametrize("penalty", [1e-323, 1e-40, 1e-30])
def test_a_vanishing_repetition_penalty_never_lets_a_masked_token_through(penalty):
    """A penalty that underflows (or nearly) would make the repeated token's logit infinite; the truncations must
    still rank the allowed tokens and never draw a masked one."""
    for seed in range(20):
        kw = dict(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, seed=seed, repetition_penalty=penalty)
        token, *_ = sample([1.0, 2.0, 0.5], allowed=pack([1, 2], 3), history=[1], **kw)
        assert token in (1, 2)
