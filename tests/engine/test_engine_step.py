"""Engine: input validation (a bad batch is a ValueError naming the problem, never a crash, and leaves the engine
and its KV cache untouched), the KV cache contents against the float64 reference, and the shapes of what a
step returns."""
from __future__ import annotations

import numpy as np
import pytest

from inferd.engine.engine import Engine
from inferd.engine.types import SamplingParams, SeqInput
from tests.reference import Reference, random_model

VOCAB = 203
CTX = 256


@pytest.fixture(scope="module")
def model():
    return random_model(weight_type="F32", vocab=VOCAB, context_length=CTX, n_heads=4, n_kv_heads=2, dim=256)


@pytest.fixture
def engine(model):
    return Engine(model, num_kv_blocks=4, max_batch_tokens=96, max_seqs=3, threads=1, max_logits_rows=64)


def kv_snapshot(eng):
    return [[eng._ctx.kv_block(layer, b) for b in range(eng.num_kv_blocks)] for layer in range(eng.config.n_layers)]


def same_snapshot(a, b):
    return all(np.array_equal(x[0], y[0]) and np.array_equal(x[1], y[1])
               for la, lb in zip(a, b) for x, y in zip(la, lb))


# ---- validation --------------------------------------------------------------------------------------------------
BAD_STEPS = {
    "token id = vocab": ([SeqInput([1, VOCAB], 0, [0])], "token id"),
    "negative token id": ([SeqInput([-1], 0, [0])], "token id"),
    "negative position": ([SeqInput([1, 2], -1, [0])], "outside the context"),
    "positions past the context": ([SeqInput([1, 2, 3], CTX - 2, [0, 1, 2, 3])], "outside the context"),
    "too few blocks": ([SeqInput(list(range(70)), 0, [0])], "cannot hold"),
    "block id past the cache": ([SeqInput([1, 2], 0, [4])], "KV block"),
    "negative block id": ([SeqInput([1, 2], 0, [-1])], "KV block"),
    "too many tokens": ([SeqInput([1] * 60, 0, [0]), SeqInput([1] * 40, 0, [1])], "tokens in one step"),
    "too many sequences": ([SeqInput([1], 0, [i]) for i in range(4)], "sequences in one step"),
    "too many logits rows": ([SeqInput([1] * 60, 0, [0], want_logits=True),
                              SeqInput([1] * 6, 0, [2], num_sampled=6)], "logits rows"),
    "no tokens": ([SeqInput([], 0, [0])], "no tokens"),
    "num_sampled > tokens": ([SeqInput([1, 2], 0, [0], num_sampled=3)], "num_sampled"),
    "negative num_sampled": ([SeqInput([1, 2], 0, [0], num_sampled=-1)], "num_sampled"),
    "logit_bias outside the vocabulary": ([SeqInput([1], 0, [0], params=SamplingParams(logit_bias={VOCAB: 1.0}))],
                                          "logit_bias"),
    "more than 20 logprobs": ([SeqInput([1], 0, [0], params=SamplingParams(logprobs=21))], None),
}


@pytest.mark.parametrize("what", list(BAD_STEPS))
def test_bad_step_is_a_value_error_and_changes_nothing(engine, what):
    seqs, message = BAD_STEPS[what]
    good = [SeqInput([5, 6, 7], 0, [3], want_logits=True)]
    before = engine.step(good)[0].logits
    snap = kv_snapshot(engine)
    with pytest.raises(ValueError, match=message):
        engine.step(seqs)
    assert same_snapshot(snap, kv_snapshot(engine)), "a rejected step wrote into the KV cache"
    np.testing.assert_array_equal(engine.step(good)[0].logits, before)


def test_bad_step_message_names_the_sequence(engine):
    with pytest.raises(ValueError, match="sequence 1"):
        engine.step([SeqInput([1], 0, [0]), SeqInput([1] * 70, 0, [1])])


def test_edges_that_are_valid(engine, model):
    assert engine.step([]) == []
    # the last position of the context, with exactly enough blocks (positions 192..255 in the 4th block)
    eng = Engine(model, num_kv_blocks=4, max_batch_tokens=96, max_seqs=3, threads=1)
    out = eng.step([SeqInput([1, 2], CTX - 2, [0, 1, 2, 3])])
    assert len(out[0].tokens) == 1
    # the largest token id; max_batch_tokens tokens; max_seqs sequences
    assert len(engine.step([SeqInput([VOCAB - 1], 0, [0])])[0].tokens) == 1
    outs = engine.step([SeqInput([3] * 32, 0, [i]) for i in range(3)])
    assert [len(o.tokens) for o in outs] == [1, 1, 1]


# ---- KV cache --------------------------------------------------------------------------------------------------
def cache_rows(eng, layer, table, n):
    """(n, n_kv_heads, head_dim) float64 keys and values of positions 0..n-1 through the block table."""
    ks, vs = [], []
    for b, block in enumerate(table):
        k, v = eng._ctx.kv_block(layer, block)
        take = min(64, n - 64 * b)
        if take <= 0:
            break
        ks.append(k[:, :take].transpose(1, 0, 2))
        vs.append(v[:, :take].transpose(1, 0, 2))
    return np.concatenate(ks).astype(np.float64), np.concatenate(vs).astype(np.float64)


def assert_f16_close(got, want, what):
    """Equal f16 values, except where float32 vs float64 rounding lands on the other side of an f16 midpoint:
    then one f16 step apart (or float32 noise, 1e-5 of the head's largest value, for values near zero)."""
    same = got == want
    assert same.mean() > 0.99, f"{what}: only {same.mean():.4f} of the values are equal"
    step = np.spacing(np.abs(want).astype(np.float16)).astype(np.float64)     # one f16 step at each value
    scale = np.abs(want).max(axis=-1, keepdims=True)                          # float32 rounding of the head
    far = np.abs(got - want) > np.maximum(step, 1e-5 * scale)
    assert not far.any(), f"{what}: {far.sum()} values differ by more than one f16 step, e.g. " \
                          f"{got[far][:3]} vs {want[far][:3]}"


@pytest.mark.parametrize("variant", [dict(weight_type="F32", n_heads=4, n_kv_heads=2, dim=256),
                                     dict(arch="qwen2", weight_type="BF16"),
                                     dict(weight_type="F16", n_heads=2, n_kv_heads=1, head_dim=128)])
def test_kv_cache_holds_the_reference_keys_and_values(variant):
    """Each layer's cached K (after RoPE) and V equal the reference's, computed from the engine's own input to
    that layer, rounded to f16; blocks outside the block tables stay untouched."""
    m = random_model(**variant)
    eng = Engine(m, num_kv_blocks=5, max_batch_tokens=96, max_seqs=3, threads=1)
    rng = np.random.default_rng(0)
    a = rng.integers(0, m.config.vocab_size, 81).tolist()
    b = rng.integers(0, m.config.vocab_size, 10).tolist()
    table_a, table_b = [3, 1], [4]
    # a: 50 tokens beside b's 10, then 30 more, then one decode token (position 80)
    _, h1 = eng.step([SeqInput(a[:50], 0, table_a, num_sampled=0), SeqInput(b, 0, table_b)], want_hidden=True)
    _, h2 = eng.step([SeqInput(a[50:80], 50, table_a)], want_hidden=True)
    _, h3 = eng.step([SeqInput(a[80:], 80, table_a)], want_hidden=True)
    hidden = {"a": np.concatenate([h1[:, :50], h2, h3], axis=1).astype(np.float64),
              "b": h1[:, 50:].astype(np.float64)}
    ref = Reference(m.config, m.tensors)
    for name, seq, table in (("a", a, table_a), ("b", b, table_b)):
        for layer in range(m.config.n_layers):
            _, k_ref, v_ref = ref.layer(layer, hidden[name][layer], np.arange(len(seq)), kv_dtype=np.float16)
            k, v = cache_rows(eng, layer, table, len(seq))
            assert_f16_close(k, k_ref, f"sequence {name}, layer {layer} keys")
            assert_f16_close(v, v_ref, f"sequence {name}, layer {layer} values")
    for layer in range(m.config.n_layers):
        for block in (0, 2):                                  # never in a block table: never written
            k, v = eng._ctx.kv_block(layer, block)
            assert not k.any() and not v.any(), f"block {block} of layer {layer} was written"
        k, v = eng._ctx.kv_block(layer, 1)                    # a's second block: positions 64..80 only
        assert k[:, :17].any(axis=-1).all() and not k[:, 17:].any() and not v[:, 17:].any()
        k, _ = eng._ctx.kv_block(layer, 4)                    # b: positions 0..9
        assert k[:, :10].any(axis=-1).all() and not k[:, 10:].any()


def test_kv_block_shape(engine, model):
    k, v = engine._ctx.kv_block(0, 0)
    assert k.shape == v.shape == (model.config.n_kv_heads, 64, model.config.head_dim)
    assert k.dtype == np.float16


# ---- what a step returns -----------------------------------------------------------------------------------------
def test_want_logits_shapes_and_rows(engine, model):
    greedy = None
    a, b, c = [1, 2, 3, 4, 5], [9, 8, 7], [11, 12, 13, 14]
    outs, hidden = engine.step([SeqInput(a, 0, [0], want_logits=True, params=greedy),
                                SeqInput(b, 0, [1]),
                                SeqInput(c, 0, [2], num_sampled=2, want_logits=True)], want_hidden=True)
    oa, ob, oc = outs
    assert oa.logits.shape == (5, VOCAB) and oa.logits.dtype == np.float32
    assert ob.logits is None
    assert oc.logits.shape == (4, VOCAB)
    assert len(oa.tokens) == 1 and len(ob.tokens) == 1 and len(oc.tokens) == 2
    assert oa.tokens == [int(np.argmax(oa.logits[-1]))]
    assert oc.tokens == np.argmax(oc.logits[-2:], axis=1).tolist()
    assert oa.logprobs == [] and oa.top_logprobs == []           # not asked for
    assert hidden.shape == (model.config.n_layers + 1, 12, model.config.dim) and hidden.dtype == np.float32
    # each sequence's rows are its own: the same as running it alone
    alone = Engine(model, num_kv_blocks=4, max_batch_tokens=96, max_seqs=3, threads=1)
    np.testing.assert_array_equal(alone.step([SeqInput(c, 0, [0], want_logits=True)])[0].logits, oc.logits)
    _, h_alone = alone.step([SeqInput(b, 0, [1])], want_hidden=True)
    np.testing.assert_array_equal(h_alone, hidden[:, 5:8])


def test_non_final_prefill_chunk_samples_nothing(engine):
    out = engine.step([SeqInput([1, 2, 3], 0, [0], num_sampled=0, want_logits=True)])[0]
    assert out.tokens == [] and out.logits.shape == (3, VOCAB)
    out = engine.step([SeqInput([1, 2, 3], 0, [0], num_sampled=0)])[0]
    assert out.tokens == [] and out.logits is None


def test_logprobs_outputs(engine):
    sp = SamplingParams(temperature=0.0, logprobs=3)
    out = engine.step([SeqInput([4, 5, 6], 0, [0], params=sp, num_sampled=2, want_logits=True)])[0]
    assert len(out.tokens) == len(out.logprobs) == len(out.top_logprobs) == 2
    for row, tok, lp, top in zip(out.logits[-2:], out.tokens, out.logprobs, out.top_logprobs):
        lsm = row.astype(np.float64) - row.max() - np.log(np.exp(row.astype(np.float64) - row.max()).sum())
        assert lp == pytest.approx(lsm[tok], abs=1e-5)
        assert [i for i, _ in top] == np.argsort(-row, kind="stable")[:3].tolist()
        assert top[0][0] == tok                                 # greedy: the chosen token is the top one
        assert [v for _, v in top] == sorted((v for _, v in top), reverse=True)
    out = engine.step([SeqInput([4], 0, [0], params=SamplingParams(temperature=0.0, logprobs=0))])[0]
    assert len(out.logprobs) == 1 and out.top_logprobs == [[]]


def test_the_c_guard_names_what_is_out_of_range(engine):
    """Context.forward (below the validation in batch.flatten) refuses records that point outside their arrays,
    with the guard's own message, and changes nothing."""
    b = engine.flatten([SeqInput([5, 6, 7], 0, [3], params=SamplingParams(repetition_penalty=1.2))])
    params, history, bias_ids, bias_values, _ = engine._sampling_arrays([SeqInput([5, 6, 7], 0, [3])],
                                                                        b.rows_of_seq, len(b.out_rows))
    snap = kv_snapshot(engine)
    args = (b.tokens, b.positions, b.seq_of_token, b.block_tables, b.out_rows, b.sample_mask)
    bad = params.copy()
    bad["history_len"] = 5                  # 5 history tokens, but the history array is empty
    with pytest.raises(ValueError, match="invalid batch: sampling parameters point outside"):
        engine._ctx.forward(*args, bad, history, bias_ids, bias_values)
    tokens = b.tokens.copy()
    tokens[1] = VOCAB
    with pytest.raises(ValueError, match="invalid batch: a token id outside the vocabulary"):
        engine._ctx.forward(tokens, *args[1:], params, history, bias_ids, bias_values)
    with pytest.raises(ValueError, match="SAMPLE_PARAMS_DTYPE records"):
        engine._ctx.forward(*args, np.zeros(len(params), [("temperature", "<f4")]), history, bias_ids, bias_values)
    assert same_snapshot(snap, kv_snapshot(engine))
