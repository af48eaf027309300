"""The GPU sampler under a grammar's allowed-token mask (packed uint32 rows, the CPU sampler's layout), against the
numpy port of the CPU sampler with the same mask (cuda_ref.cpu_sample(allowed=...)).

Checked exactly, on every row: a masked token is never drawn (temperature alone, top-k, top-p, min-p, their mixes,
and with a huge logit bias on masked tokens); greedy picks the best allowed token; rows without a mask give the same
tokens and logprobs bit for bit whether or not other rows of the batch have one; a row with nothing allowed gets
token -1. Against the reference, as in test_sample.py: at most 1 row in 100 may draw another allowed token (fixed
point vs double sums at a boundary), logprobs (over the allowed tokens) agree to 1e-4."""
import numpy as np
import pytest

from tests.cuda.cuda_ref import cpu_sample, pack_mask, unpack_mask
from tests.cuda.test_sample import CASES, run_sampler

DENSITIES = (1, 3, 0.01, 0.3, 0.9, 1.0)   # an int: that many allowed tokens; a float: that share of the vocabulary


def random_masks(rng, R, V, every=1):
    """{row: packed words} for rows r % every == 0, cycling through DENSITIES."""
    masks = {}
    for r in range(0, R, every):
        d = DENSITIES[(r // every) % len(DENSITIES)]
        ok = np.zeros(V, bool)
        if isinstance(d, int):
            ok[rng.choice(V, d, replace=False)] = True
        else:
            ok = rng.random(V) < d
            ok[rng.integers(V)] = True
        masks[r] = pack_mask(ok)
    return masks


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("V", [1000, 49155, 151936])
def test_masked_rows_match_cpu_and_never_draw_a_masked_token(cu, rng, case, V):
    R = 64 if V < 100000 else 16
    logits = (rng.standard_normal((R, V)) * rng.uniform(0.5, 6.0, (R, 1))).astype(np.float32)
    params = [dict(CASES[case], seed=int(rng.integers(0, 2 ** 63)), position=int(rng.integers(0, 5000)))
              for _ in range(R)]
    masks = random_masks(rng, R, V, every=2)
    tok, lp = run_sampler(cu, logits, params, masks=masks)
    mismatches = 0
    for r in range(R):
        allowed = masks.get(r)
        if allowed is not None:
            assert unpack_mask(allowed, V)[tok[r]], f"row {r} drew masked token {tok[r]}"
        want, want_lp = cpu_sample(logits[r], params[r], params[r]["position"], allowed=allowed)
        if tok[r] != want:
            mismatches += 1
        else:
            assert abs(lp[r] - want_lp) < 1e-4 * max(1.0, abs(want_lp))
    allowed_mismatches = 0 if case == "greedy" else max(1, R // 100)
    assert mismatches <= allowed_mismatches, f"{mismatches} of {R} rows chose another token than the CPU sampler"


def test_greedy_picks_the_best_allowed_token_even_against_bias(cu, rng):
    V, R = 32000, 32
    logits = (rng.standard_normal((R, V)) * 3).astype(np.float32)
    masks, adj_rows, params = {}, {}, []
    for r in range(R):
        ok = rng.random(V) < 0.05
        masks[r] = pack_mask(ok)
        banned = np.flatnonzero(~ok)[:4]                 # masked tokens pushed far above everything
        e = np.zeros(len(banned), cu.ADJ_DTYPE)
        e["token"], e["bias"] = banned, 1000.0
        adj_rows[r] = e
        params.append(dict(temperature=0.0 if r % 2 == 0 else 1.5, seed=int(rng.integers(0, 2 ** 63)),
                           position=r))
    tok, lp = run_sampler(cu, logits, params, adj_rows, masks)
    for r in range(R):
        ok = unpack_mask(masks[r], V)
        assert ok[tok[r]]
        if r % 2 == 0:
            assert tok[r] == int(np.flatnonzero(ok)[np.argmax(logits[r][ok])])
        x = np.where(ok, logits[r], -np.inf).astype(np.float64)
        lse = x.max() + np.log(np.exp(x - x.max()).sum())
        assert abs(lp[r] - (logits[r][tok[r]] - lse)) < 1e-4 * max(1.0, abs(lse))   # logprobs of the masked row


def test_unmasked_rows_are_unaffected_by_masked_neighbours(cu, rng):
    V, R = 49152, 32
    logits = (rng.standard_normal((R, V)) * 2).astype(np.float32)
    params = [dict(temperature=1.0, top_p=0.9, top_k=40, seed=int(rng.integers(0, 2 ** 63)), position=r)
              for r in range(R)]
    free_tok, free_lp = run_sampler(cu, logits, params)
    tok, lp = run_sampler(cu, logits, params, masks=random_masks(rng, R, V, every=2))
    odd = np.arange(1, R, 2)
    assert np.array_equal(tok[odd], free_tok[odd]) and np.array_equal(lp[odd], free_lp[odd])


def test_a_row_with_nothing_allowed_gets_no_token(cu, rng):
    V, R = 5000, 3
    logits = rng.standard_normal((R, V)).astype(np.float32)
    params = [dict(temperature=t, seed=1, position=1) for t in (0.0, 1.0, 1.0)]
    masks = {1: pack_mask(np.zeros(V, bool))}
    tok, lp = run_sampler(cu, logits, params, masks=masks)
    assert tok[1] == -1 and lp[1] == -np.inf
    assert tok[0] == int(np.argmax(logits[0])) and 0 <= tok[2] < V
