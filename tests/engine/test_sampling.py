"""The C sampler (inferd._cpu.sample, the function every Engine row goes through) and SamplingParams.

- greedy = argmax (first maximum on ties);
- temperature / top-k / top-p / min-p: allowed tokens only, with the distribution expected from the logits
  (a chi-square test over 20000 fixed (seed, position) draws: a fixed outcome, no flakiness; the bound is the
  chi-square 1e-4 upper quantile, so a correct sampler passes with a wide margin and a wrong distribution, such
  as an ignored temperature, fails by orders of magnitude);
- seeded draws depend only on (seed, position);
- penalties and logit bias change the logits exactly as specified, measured one token at a time with a probe
  token (greedy picks the token iff its processed logit >= the probe's bias; bisection over float32 values finds
  the processed logit to the last bit);
- logprobs are log_softmax of the raw logits (before bias, penalties and temperature); top logprobs sorted.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from inferd import _cpu
from inferd.engine.engine import Engine
from inferd.engine.types import SamplingParams, SeqInput
from tests.reference import random_model

N_DRAWS = 20000


def sample(logits, pos=0, history=(), bias=None, **params):
    return _cpu.sample(np.asarray(logits, np.float32), params, pos, history=list(history), bias=bias)


def log_softmax(x):
    x = np.asarray(x, np.float64)
    m = x.max()
    return x - m - math.log(np.exp(x - m).sum())


def softmax(x):
    return np.exp(log_softmax(x))


def draws(logits, n=N_DRAWS, seed=12345, **params):
    return np.array([sample(logits, pos, seed=seed, **params)[0] for pos in range(n)])


def chi2_upper(df: int, z: float = 3.719) -> float:
    """Wilson-Hilferty approximation of the chi-square quantile at normal deviate z (3.719: p = 1e-4)."""
    a = 2.0 / (9.0 * df)
    return df * (1 - a + z * math.sqrt(a)) ** 3


def assert_distribution(tokens, expected):
    """tokens drawn from `expected` (probabilities over the vocabulary; zero = never allowed)."""
    expected = np.asarray(expected, np.float64)
    counts = np.bincount(tokens, minlength=len(expected))
    forbidden = np.nonzero((expected == 0) & (counts > 0))[0]
    assert forbidden.size == 0, f"drew tokens that are not allowed: {forbidden.tolist()}"
    allowed = expected > 0
    e = expected[allowed] / expected[allowed].sum() * len(tokens)
    chi2 = float(((counts[allowed] - e) ** 2 / e).sum())
    df = max(1, int(allowed.sum()) - 1)
    assert chi2 < chi2_upper(df), f"chi-square {chi2:.1f} > {chi2_upper(df):.1f} (df {df}); counts " \
                                  f"{counts[allowed].tolist()} expected {np.round(e).tolist()}"


LOGITS = np.array([2.0, 1.5, 1.4, 0.3, -0.5, -1.0, -3.0, 0.9], np.float32)


# ---- greedy and logprobs ---------------------------------------------------------------------------------------
def test_greedy_is_argmax_first_on_ties():
    rng = np.random.default_rng(0)
    for _ in range(50):
        x = rng.standard_normal(3000).astype(np.float32)
        assert sample(x, temperature=0.0)[0] == int(np.argmax(x))
    x = np.array([1.0, 3.0, 0.0, 3.0, 3.0], np.float32)
    assert sample(x, temperature=0.0)[0] == 1
    # greedy ignores the filters, the seed and the position
    assert {sample(x, pos, temperature=0.0, top_k=1, top_p=0.1, seed=pos)[0] for pos in range(20)} == {1}


GREEDY_CASES = [
    ("ties keep the first", [1.0, 3.0, 0.0, 3.0] * 10 + [3.0]),
    ("maximum in the tail after the last group of 8", [0.0] * 37 + [5.0, 1.0]),
    ("maximum in the first lane", [9.0] + [1.0] * 40),
    ("NaNs are skipped", [1.0, float("nan"), 2.0] * 9 + [float("nan"), 0.5]),
    ("a NaN at index 0 wins, as in a scan", [float("nan")] + [1.0] * 30),
    ("-0.0 and 0.0 tie: the first wins", [-1.0] * 9 + [-0.0, 0.0, -0.0] + [-2.0] * 20),
    ("all -inf", [float("-inf")] * 33),
    ("shorter than a vector", [0.1, 0.7, 0.7]),
]


@pytest.mark.parametrize("name,logits", GREEDY_CASES, ids=[c[0] for c in GREEDY_CASES])
def test_greedy_pick_is_the_same_on_every_path(name, logits):
    def scan(x):   # the definition: the first index whose value beats every earlier one
        best = 0
        for i in range(1, len(x)):
            if x[i] > x[best]:
                best = i
        return best
    expected = scan(logits)
    old = _cpu.get_path()
    try:
        for path in ("scalar", "avx2", "avx512vnni", "avxvnni"):
            try:
                _cpu.set_path(path)
            except ValueError:
                continue   # not on this CPU
            assert sample(logits, temperature=0.0)[0] == expected, (name, path)
    finally:
        _cpu.set_path(old)


def test_top_k_1_and_tiny_top_p_are_greedy():
    rng = np.random.default_rng(1)
    x = rng.standard_normal(500).astype(np.float32)
    best = int(np.argmax(x))
    assert {sample(x, pos, temperature=1.5, top_k=1, seed=3)[0] for pos in range(200)} == {best}
    assert {sample(x, pos, temperature=1.5, top_p=1e-6, seed=3)[0] for pos in range(200)} == {best}
    assert {sample(x, pos, temperature=1.5, min_p=1.0, seed=3)[0] for pos in range(200)} == {best}


@pytest.mark.parametrize("params", [dict(temperature=0.0), dict(temperature=0.7, top_k=10, seed=1),
                                    dict(temperature=1.3, repetition_penalty=1.5, presence_penalty=1.0, seed=2)])
def test_logprobs_are_log_softmax_of_raw_logits(params):
    rng = np.random.default_rng(2)
    x = (rng.standard_normal(5000) * 3).astype(np.float32)
    want = log_softmax(x)
    for pos in range(5):
        tok, lp, top_ids, top_lps = sample(x, pos, history=[int(np.argmax(x)), 7, 7],
                                           bias={3: 5.0, 11: -2.0}, num_logprobs=5, **params)
        assert abs(lp - want[tok]) < 1e-5
        order = np.argsort(-x, kind="stable")[:5]
        assert top_ids == order.tolist()
        np.testing.assert_allclose(top_lps, want[order], atol=1e-5)
        assert top_lps == sorted(top_lps, reverse=True)


def test_top_logprobs_sorted_ties_by_id_and_counts():
    x = np.array([0.0, 2.0, 1.0, 2.0, 1.0, -1.0] * 5, np.float32)
    want = log_softmax(x)
    tok, lp, ids, lps = sample(x, num_logprobs=20, temperature=0.0)
    assert len(ids) == 20 and len(set(ids)) == 20
    assert ids[:5] == [1, 3, 7, 9, 13]                       # equal values: smaller id first
    assert lps == sorted(lps, reverse=True)
    np.testing.assert_allclose(lps, want[ids], atol=1e-5)
    assert sample(x, num_logprobs=0)[2:] == ([], [])
    assert len(sample(x, num_logprobs=3)[2]) == 3


def test_top_logprobs_with_fewer_tokens_than_asked():
    """A vocabulary smaller than num_logprobs gives all of it, sorted (regression: the entries past the vocabulary
    used to be uninitialized stack memory, ids like 21984; fixed in 0c95926)."""
    x = np.array([1.0, 2.0, 3.0, 0.5, 0.1], np.float32)
    _, _, ids, lps = sample(x, num_logprobs=8, temperature=0.0)
    assert ids == [2, 1, 0, 3, 4]
    np.testing.assert_allclose(lps, log_softmax(x)[ids], atol=1e-6)


def test_engine_top_logprobs_with_fewer_tokens_than_asked():
    eng = Engine(random_model(weight_type="F32", vocab=12), num_kv_blocks=1, max_batch_tokens=8, max_seqs=1,
                 threads=1)
    out = eng.step([SeqInput([1, 2], 0, [0], params=SamplingParams(temperature=0.0, logprobs=20),
                             want_logits=True)])[0]
    assert [i for i, _ in out.top_logprobs[0]] == np.argsort(-out.logits[-1], kind="stable").tolist()


# ---- distributions ---------------------------------------------------------------------------------------------
def test_temperature_distribution():
    for t in (0.5, 1.0, 2.0):
        assert_distribution(draws(LOGITS, temperature=t), softmax(LOGITS / t))


def test_ignored_temperature_would_fail():
    """The chi-square bound has power: draws at T=1 are rejected as draws at T=0.7."""
    with pytest.raises(AssertionError, match="chi-square"):
        assert_distribution(draws(LOGITS, n=5000, temperature=1.0), softmax(LOGITS / 0.7))


def nucleus(p: np.ndarray, top_p: float) -> np.ndarray:
    """Mask of the smallest set of most likely tokens whose mass reaches top_p."""
    order = np.argsort(-p, kind="stable")
    cum = np.cumsum(p[order])
    keep = np.zeros(len(p), bool)
    keep[order[:int(np.searchsorted(cum, top_p * cum[-1] * (1 - 1e-9))) + 1]] = True
    return keep


@pytest.mark.parametrize("top_k", [1, 3, 5])
def test_top_k_distribution(top_k):
    p = softmax(LOGITS / 0.8)
    keep = np.zeros(len(p), bool)
    keep[np.argsort(-p, kind="stable")[:top_k]] = True
    assert_distribution(draws(LOGITS, temperature=0.8, top_k=top_k), np.where(keep, p, 0))


@pytest.mark.parametrize("top_p", [0.5, 0.8, 0.95])
def test_top_p_distribution(top_p):
    p = softmax(LOGITS)
    keep = nucleus(p, top_p)
    assert_distribution(draws(LOGITS, temperature=1.0, top_p=top_p), np.where(keep, p, 0))


@pytest.mark.parametrize("min_p", [0.1, 0.3, 0.6])
def test_min_p_distribution(min_p):
    p = softmax(LOGITS / 1.2)
    keep = p >= min_p * p.max()
    assert_distribution(draws(LOGITS, temperature=1.2, min_p=min_p), np.where(keep, p, 0))


COMBO_LOGITS = np.array([3.0, 2.8, 2.5, 2.4, 2.2, 2.0, 1.0, 0.5, 0.0, -1.0], np.float32)


def test_top_k_then_top_p():
    """top-p over the renormalized top-k mass (sample.c's order: top-k, top-p, min-p; as vLLM)."""
    p = softmax(COMBO_LOGITS)
    keep = np.zeros(len(p), bool)
    keep[:6] = True                                          # top_k = 6
    keep &= nucleus(np.where(keep, p, 0), 0.7)
    assert keep.sum() == 4
    assert_distribution(draws(COMBO_LOGITS, temperature=1.0, top_k=6, top_p=0.7), np.where(keep, p, 0))


def test_top_p_then_min_p():
    p = softmax(COMBO_LOGITS)
    keep = nucleus(p, 0.7) & (p >= 0.6 * p.max())
    assert keep.sum() == 3
    assert_distribution(draws(COMBO_LOGITS, temperature=1.0, top_p=0.7, min_p=0.6), np.where(keep, p, 0))


def test_top_k_then_top_p_then_min_p():
    """Regression (fixed in 0c95926): with top_k set, top-p's normalizer was taken over the candidates that
    survived the min-p floor instead of over the top k, so min-p shrank the nucleus and token 2 (0.61 of the
    best, above min_p 0.6, inside the 70% nucleus of the top 6) was never drawn."""
    p = softmax(COMBO_LOGITS)
    keep = np.zeros(len(p), bool)
    keep[:6] = True
    keep &= nucleus(np.where(keep, p, 0), 0.7)
    keep &= p >= 0.6 * p.max()
    assert keep.sum() == 3
    assert_distribution(draws(COMBO_LOGITS, temperature=1.0, top_k=6, top_p=0.7, min_p=0.6),
                        np.where(keep, p, 0))


def test_top_p_on_a_large_vocabulary_keeps_only_the_nucleus():
    rng = np.random.default_rng(3)
    x = (rng.standard_normal(20000) * 2.5).astype(np.float32)
    keep = nucleus(softmax(x), 0.9)
    got = draws(x, n=600, temperature=1.0, top_p=0.9)
    assert keep[got].all(), "a token outside the nucleus was drawn"
    assert len(set(got.tolist())) > 100                      # and it is not collapsing onto a few tokens


# ---- seeds ---------------------------------------------------------------------------------------------------
def test_seeded_draws_depend_only_on_seed_and_position():
    rng = np.random.default_rng(4)
    x = rng.standard_normal(1000).astype(np.float32)
    first = [sample(x, pos, seed=99, temperature=1.0)[0] for pos in range(300)]
    # other draws in between, other orders, other rows: the same tokens
    for pos in reversed(range(300)):
        sample(x * 0.5, pos + 7, seed=98, temperature=1.0)
        assert sample(x, pos, seed=99, temperature=1.0)[0] == first[pos]
    other_seed = [sample(x, pos, seed=100, temperature=1.0)[0] for pos in range(300)]
    assert sum(a != b for a, b in zip(first, other_seed)) > 250
    assert len(set(first)) > 150                             # positions give different draws


def test_uniform_draws_are_uniform():
    assert_distribution(draws(np.zeros(16, np.float32), temperature=1.0, seed=2024), np.ones(16))
    assert_distribution(draws(np.zeros(2, np.float32), temperature=1.0, seed=7), np.ones(2))


# ---- penalties and logit bias, measured exactly --------------------------------------------------------------
def _ordered(f: float) -> int:
    i = int(np.float32(f).view(np.int32))
    return i if i >= 0 else -(i & 0x7FFFFFFF)


def _from_ordered(i: int) -> np.float32:
    return np.int32(i if i >= 0 else (-i) | -0x80000000).view(np.float32)


def processed_logit(logits, token, history=(), bias=None, **params) -> np.float32:
    """The logit of `token` after bias and penalties, to the last bit. Every other token is pushed to -1e30;
    a probe token (id = vocab, raw logit 0, not in the history) gets bias b; greedy picks `token` iff its
    processed logit >= b (ties go to the smaller id), so bisection over float32 values finds it."""
    base = np.full(len(logits) + 1, -1e30, np.float32)
    base[token] = logits[token]
    base[-1] = 0.0
    probe = len(logits)
    user_bias = dict(bias or {})

    def picks_token(b):
        return sample(base, history=history, bias={**user_bias, probe: float(b)}, temperature=0.0,
                      **params)[0] == token

    lo, hi = _ordered(-1e6), _ordered(1e6)                   # picks at lo, not at hi
    assert picks_token(_from_ordered(lo)) and not picks_token(_from_ordered(hi))
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if picks_token(_from_ordered(mid)):
            lo = mid
        else:
            hi = mid
    return _from_ordered(lo)


def f32(x):
    return np.float32(x)


def test_logit_bias_adds():
    x = np.array([1.5, -2.0, 0.25, 3.0], np.float32)
    bias = {0: 2.5, 1: -7.25, 3: -100.0}
    for t in range(4):
        assert processed_logit(x, t, bias=bias) == f32(x[t]) + f32(bias.get(t, 0.0))
    assert sample(x, bias=bias, temperature=0.0)[0] == 0
    # a large negative bias bans a token under sampling too
    assert 3 not in draws(x, n=2000, bias={3: -100.0}, temperature=1.0).tolist()


def test_repetition_penalty_divides_positive_multiplies_negative_once_per_token():
    x = np.array([2.0, -1.5, 0.75, -0.25, 1.0, 0.0], np.float32)
    hist = [0, 1, 1, 1, 2, 3, 0, 9999, -5]                  # repeats count once; out-of-vocab ids are ignored
    r = f32(1.3)
    for num_prompt in (0, 4, len(hist)):                     # prompt and output tokens alike
        got = [processed_logit(x, t, history=hist, repetition_penalty=1.3, num_prompt=num_prompt)
               for t in range(6)]
        want = [x[0] / r, x[1] * r, x[2] / r, x[3] * r, x[4], x[5]]
        assert got == want, (num_prompt, got, want)


def test_presence_and_frequency_penalties_count_output_tokens_only():
    x = np.array([2.0, -1.5, 0.75, -0.25, 1.0], np.float32)
    prompt = [0, 0, 1, 4]
    output = [1, 1, 1, 2, 0]
    pres, freq = f32(0.5), f32(0.3)
    got = [processed_logit(x, t, history=prompt + output, num_prompt=len(prompt), presence_penalty=0.5,
                           frequency_penalty=0.3) for t in range(5)]
    counts = {0: 1, 1: 3, 2: 1}                              # in the output; token 4 is only in the prompt
    want = [x[t] - (pres + freq * f32(counts[t])) if t in counts else x[t] for t in range(5)]
    assert got == want, (got, want)
    # negative penalties reward repetition
    assert processed_logit(x, 1, history=output, presence_penalty=-1.0) == x[1] + f32(1.0)


def test_bias_then_repetition_then_presence_frequency():
    """sample.c applies the logit bias first, then the repetition penalty (on the biased logit's sign), then
    presence and frequency."""
    x = np.array([1.0, -0.5, 0.2], np.float32)
    hist = [0, 1, 1, 2]
    bias = {0: -3.0, 1: 2.0}
    got = [processed_logit(x, t, history=hist, bias=bias, num_prompt=1, repetition_penalty=2.0,
                           presence_penalty=0.25, frequency_penalty=0.125) for t in range(3)]
    b0, b1, b2 = f32(1.0) + f32(-3.0), f32(-0.5) + f32(2.0), f32(0.2)
    want = [b0 * f32(2.0), b1 / f32(2.0) - (f32(0.25) + f32(0.125) * 2), b2 / f32(2.0) - (f32(0.25) + f32(0.125))]
    assert got == want, (got, want)


def test_penalties_do_not_leak_between_calls():
    """The sampler keeps per-token counts in scratch memory that must be clean again after every row."""
    x = np.array([2.0, 1.9, 0.0], np.float32)
    assert sample(x, history=[0, 0, 0], num_prompt=0, frequency_penalty=2.0, temperature=0.0)[0] == 1
    assert sample(x, temperature=0.0)[0] == 0
    eng_rows = [processed_logit(x, 0, history=[1], presence_penalty=1.0) for _ in range(3)]
    assert eng_rows == [x[0]] * 3


# ---- through the Engine --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_engine():
    model = random_model(weight_type="Q8_0", vocab=300, tie=False)     # untied: spread-out logits
    return Engine(model, num_kv_blocks=4, max_batch_tokens=64, max_seqs=4, threads=1)


def test_engine_samples_the_next_position_with_the_c_sampler(tiny_engine):
    """A row's draw is the sampler's draw on that row's raw logits at the position of the token being chosen
    (the last input position + 1), with the sequence's history for penalties."""
    prompt = [5, 17, 42, 7, 99, 5, 17]
    sp = SamplingParams(temperature=0.9, top_k=50, top_p=0.9, min_p=0.02, repetition_penalty=1.2,
                        presence_penalty=0.3, frequency_penalty=0.2, logit_bias={7: 1.5, 8: -2.0}, seed=777,
                        logprobs=4)
    out = tiny_engine.step([SeqInput(prompt, 0, [0], params=sp, history=prompt, num_prompt=5, want_logits=True)])[0]
    row = out.logits[-1]
    want = sample(row, len(prompt), history=prompt, bias=sp.logit_bias, temperature=0.9, top_k=50, top_p=0.9,
                  min_p=0.02, repetition_penalty=1.2, presence_penalty=0.3, frequency_penalty=0.2, seed=777,
                  num_prompt=5, num_logprobs=4)
    assert out.tokens == [want[0]]
    assert out.logprobs == [pytest.approx(want[1], abs=0)]
    assert out.top_logprobs == [list(zip(want[2], want[3]))]
    lsm = log_softmax(row)
    assert out.logprobs[0] == pytest.approx(lsm[out.tokens[0]], abs=1e-5)
    assert [i for i, _ in out.top_logprobs[0]] == np.argsort(-row, kind="stable")[:4].tolist()


def test_engine_unseeded_requests_differ(tiny_engine):
    sp = SamplingParams(temperature=1.0)
    runs = set()
    for _ in range(4):
        outs = tiny_engine.step([SeqInput([1, 2, 3], 0, [0], params=sp, num_sampled=3)])
        runs.add(tuple(outs[0].tokens))
    assert len(runs) > 1, "seed=None must draw a fresh seed per request"


@pytest.mark.parametrize("field,value", [("temperature", -0.1), ("temperature", 101.0), ("top_k", -1),
                                         ("top_p", 0.0), ("top_p", 1.5), ("min_p", -0.1), ("min_p", 1.1),
                                         ("repetition_penalty", 0.0), ("presence_penalty", 2.5),
                                         ("frequency_penalty", -2.5), ("logprobs", 21), ("logprobs", -1)])
def test_sampling_params_validate_names_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value}).validate()


def test_default_sampling_params_are_valid():
    SamplingParams().validate()
    SamplingParams(temperature=0.0, top_k=1, top_p=1.0, min_p=1.0, logprobs=20, seed=0).validate()
