"""CudaEngine with grammar masks (SeqInput.allowed): the masks reach the sampler inside replayed decode graphs (the
fixed device buffer is refreshed before each replay), graph and eager runs agree, unconstrained sequences in the
same batch are unaffected, and top logprobs list allowed tokens only."""
import numpy as np
import pytest

from tests.cuda.cuda_ref import pack_mask, unpack_mask
from tests.cuda.test_engine import make_engine


@pytest.fixture(scope="module")
def engine_mod(cu):
    from inferd.engine import cuda_engine
    from inferd.engine.types import SamplingParams, SeqInput
    return cuda_engine, SamplingParams, SeqInput


@pytest.fixture(scope="module")
def model():
    ref = pytest.importorskip("tests.reference", reason="tests/reference.py (the random models) is not there")
    return ref.random_model(weight_type="Q8_0", n_heads=4, n_kv_heads=2, dim=256, seed=1234)


def _run(engine_mod, eng, prompts, masks_of, sp, steps=6):
    """Prefill then decode `steps` tokens; masks_of(step, i) -> packed mask or None for sequence i."""
    _, _, SeqInput = engine_mod
    seqs = [list(p) for p in prompts]
    tables = [list(range(4 * i, 4 * i + 4)) for i in range(len(prompts))]
    outs = eng.step([SeqInput(p, 0, t, 1, sp, allowed=masks_of(0, i)) for i, (p, t) in enumerate(zip(seqs, tables))])
    tops = [[o.top_logprobs] for o in outs]
    for s, o in zip(seqs, outs):
        s += o.tokens
    graphs = []
    for step in range(1, steps):
        outs = eng.step([SeqInput([s[-1]], len(s) - 1, t, 1, sp, allowed=masks_of(step, i))
                         for i, (s, t) in enumerate(zip(seqs, tables))])
        graphs.append(eng.last_step_used_graph)
        for s, o, top in zip(seqs, outs, tops):
            s += o.tokens
            top.append(o.top_logprobs)
    return [s[len(p):] for s, p in zip(seqs, prompts)], tops, graphs


def test_each_replay_follows_its_own_mask(engine_mod, model):
    """One allowed token per step, a different one every step: the replayed graph must read the fresh mask."""
    _, SamplingParams, _ = engine_mod
    V = model.config.vocab_size
    rng = np.random.default_rng(5)
    forced = rng.integers(0, V, (6, 3))

    def one(step, i):
        ok = np.zeros(V, bool)
        ok[forced[step, i]] = True
        return pack_mask(ok)

    for temperature in (0.0, 1.0):
        eng = make_engine(engine_mod, model, use_graphs=True)
        out, _, graphs = _run(engine_mod, eng, [[1, 2, 3], [4, 5] * 10, [7] * 40], one,
                              SamplingParams(temperature=temperature, seed=3))
        assert all(graphs)
        assert [list(o) for o in out] == forced.T.tolist()


def test_masked_graph_equals_eager_and_free_rows_are_unaffected(engine_mod, model):
    _, SamplingParams, _ = engine_mod
    V = model.config.vocab_size
    rng = np.random.default_rng(11)
    allowed = rng.random((6, 3, V)) < 0.2
    sp = SamplingParams(temperature=0.9, top_p=0.95, seed=21, logprobs=3)
    prompts = [[3, 1, 4, 1, 5], [9, 2, 6] * 7, [5, 3, 5, 8, 9, 7, 9]]

    def masks(step, i):
        return pack_mask(allowed[step, i]) if i != 1 else None      # sequence 1 is free

    a_out, a_top, graphs = _run(engine_mod, make_engine(engine_mod, model, use_graphs=True), prompts, masks, sp)
    b_out, b_top, _ = _run(engine_mod, make_engine(engine_mod, model, use_graphs=False), prompts, masks, sp)
    assert all(graphs) and a_out == b_out and a_top == b_top
    for step in range(6):
        for i in (0, 2):
            assert allowed[step, i, a_out[i][step]]
            listed = [t for t, _ in a_top[i][step][0]]
            assert listed and all(allowed[step, i, t] for t in listed)          # top logprobs: allowed tokens only
    free_out, _, _ = _run(engine_mod, make_engine(engine_mod, model, use_graphs=True), prompts,
                          lambda step, i: None, sp)
    assert a_out[1] == free_out[1]


def test_mask_bits_line_up_with_token_ids(engine_mod, model):
    """Greedy under a mask that allows the ids just around word boundaries (31, 32, 63, V-1)."""
    _, SamplingParams, _ = engine_mod
    V = model.config.vocab_size
    for ids in ([31], [32], [63, 64], [V - 1]):
        ok = np.zeros(V, bool)
        ok[ids] = True
        words = pack_mask(ok)
        assert np.array_equal(np.flatnonzero(unpack_mask(words, V)), ids)
        out, _, _ = _run(engine_mod, make_engine(engine_mod, model), [[1, 2, 3]], lambda s, i, words=words: words,
                         SamplingParams(temperature=0.0), steps=2)
        assert all(t in ids for t in out[0])
