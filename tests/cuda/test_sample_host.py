"""The numpy reference the GPU sampler is tested against (cuda_ref.cpu_sample) is the real CPU sampler
(ext/cpu/sample.c through _cpu.sample), token for token on every row (runs without a GPU): every combination of
temperature, top-k, top-p and min-p, including all three filters together (top-k, then top-p over the top k's mass,
then min-p last; the order both backends follow), rows with tied logits, and penalties with logit bias."""
import itertools

import numpy as np
import pytest

from inferd import _cpu
from tests.cuda.cuda_ref import cpu_sample, exp_cpu

FILTERS = [dict(temperature=t, top_k=k, top_p=p, min_p=m)
           for t, k, p, m in itertools.product((0.6, 1.4), (0, 1, 7, 60), (1.0, 0.9, 0.4), (0.0, 0.03, 0.3))]
FILTERS.append(dict(temperature=0.0, top_k=7, top_p=0.9, min_p=0.03))


def random_row(rng, V, ties):
    logits = rng.standard_normal(V) * rng.uniform(0.5, 6.0)
    if ties:                                  # equal weights at the top-k / top-p / min-p boundaries
        logits = np.round(logits * 2) / 2
    return logits.astype(np.float32)


def assert_same(logits, p, position, **extra):
    want, want_lp = cpu_sample(logits, p, position, **extra)
    hist = extra.get("history", ())
    tok, lp, _, _ = _cpu.sample(logits, {**p, "num_logprobs": 0, "num_prompt": extra.get("num_prompt", 0)},
                                position, history=hist, bias=extra.get("bias"))
    assert tok == want, f"the reference drew {want}, the CPU sampler {tok} ({p}, position {position})"
    assert abs(lp - want_lp) < 1e-4 * max(1.0, abs(want_lp))


@pytest.mark.parametrize("case", range(len(FILTERS)),
                         ids=["T{temperature}-k{top_k}-p{top_p}-m{min_p}".format(**f) for f in FILTERS])
def test_reference_is_the_cpu_sampler(case):
    rng = np.random.default_rng(1000 + case)
    for i in range(36):
        V = (3001, 1000, 257)[i % 3]
        p = dict(FILTERS[case], seed=int(rng.integers(1 << 63)))
        assert_same(random_row(rng, V, ties=i % 4 == 3), p, int(rng.integers(0, 1 << 20)))


def test_reference_is_the_cpu_sampler_with_penalties_and_bias():
    rng = np.random.default_rng(5)
    V = 2000
    for i in range(60):
        hist = rng.integers(0, 80, int(rng.integers(1, 60))).tolist()
        bias = {int(t): float(rng.uniform(-4, 4)) for t in rng.integers(0, V, 3)}
        p = dict(FILTERS[i % len(FILTERS)], seed=int(rng.integers(1 << 63)),
                 repetition_penalty=float(rng.uniform(0.8, 1.5)), presence_penalty=float(rng.uniform(-1, 1)),
                 frequency_penalty=float(rng.uniform(-1, 1)))
        assert_same(random_row(rng, V, ties=False), p, i, history=hist, num_prompt=int(rng.integers(0, len(hist) + 1)),
                    bias=bias)


def test_exp_port_is_close_to_exp_and_exact_where_it_must_be():
    x = np.linspace(-87, 0, 100001, dtype=np.float32)
    e = exp_cpu(x)
    assert np.all(np.abs(e / np.exp(x.astype(np.float64)) - 1) < 4e-7)
    assert exp_cpu(np.float32([0.0]))[0] == 1.0                      # the best token weighs exactly 1
    assert exp_cpu(np.float32([-1000.0]))[0] > 0                     # clamped: never 0 for an allowed token
