"""CudaEngine end to end: tiny random models of every variant against the float64 reference (tests/reference.py),
decode graphs against eager runs, batch invariance, and SmolLM2 against the CPU engine (logits, and greedy text
equal for the first 32 tokens).

Tolerances: the GPU keeps bf16 weights (F32/F16 files) or the file's blocks, f16 K/V, bf16 activations in the
prefill GEMMs and float32 elsewhere: ||logits - ref|| / ||ref|| < 2e-2 per row against the float64 reference with an
f16 cache. Against the CPU engine (8-bit activations for quantized weights) < 5e-2 per row."""
import os

import numpy as np
import pytest

from tests.cuda.cuda_ref import rel_err


def _reference():
    ref = pytest.importorskip("tests.reference", reason="tests/reference.py (the float64 model) is not there")
    return ref.Reference, ref.random_model

VARIANTS = {
    "f32": dict(weight_type="F32"),
    "f16_untied": dict(weight_type="F16", tie=False),
    "q8_0": dict(weight_type="Q8_0"),
    "q4_0": dict(weight_type="Q4_0"),
    "q4_1_q8_embed": dict(weight_type="Q4_1", embed_type="Q8_0"),
    "qwen2_bias_gqa": dict(arch="qwen2", weight_type="Q8_0", n_heads=4, n_kv_heads=2, dim=256),
    "llama3_rope": dict(weight_type="F32", rope_scaling={"factor": 8.0, "low_freq_factor": 1.0,
                                                         "high_freq_factor": 4.0,
                                                         "original_max_position_embeddings": 64},
                        rope_theta=500000.0, context_length=512),
    "hd128": dict(weight_type="Q8_0", dim=256, n_heads=2, n_kv_heads=2),
}


@pytest.fixture(scope="module")
def engine_mod(cu):
    from inferd.engine import cuda_engine
    from inferd.engine.types import SamplingParams, SeqInput
    return cuda_engine, SamplingParams, SeqInput


def greedy(SamplingParams):
    return SamplingParams(temperature=0.0)


def make_engine(engine_mod, model, **kw):
    cuda_engine, _, _ = engine_mod
    return cuda_engine.CudaEngine(model, num_kv_blocks=kw.pop("num_kv_blocks", 24), max_batch_tokens=256,
                                  max_seqs=8, max_logits_rows=256, **kw)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_prefill_and_decode_match_reference(engine_mod, rng, name):
    _, SamplingParams, SeqInput = engine_mod
    Reference, random_model = _reference()
    model = random_model(seed=int(rng.integers(1 << 30)), **VARIANTS[name])
    cfg = model.config
    eng = make_engine(engine_mod, model)
    ref = Reference(cfg, model.tensors)
    prompt = rng.integers(0, cfg.vocab_size, 70).tolist()       # > 64 positions: two KV blocks
    table = list(range(5, 5 + 8))
    out = eng.step([SeqInput(prompt, 0, table, 1, greedy(SamplingParams), want_logits=True)])[0]
    want = ref.forward(prompt, kv_dtype=np.float16).logits
    for r in range(len(prompt)):
        assert rel_err(out.logits[r], want[r]) < 2e-2, f"prefill row {r}"
    assert out.tokens == [int(np.argmax(out.logits[-1]))]
    seq = prompt + out.tokens
    for step in range(4):                                        # decode: graph replays
        o = eng.step([SeqInput([seq[-1]], len(seq) - 1, table, 1, greedy(SamplingParams), want_logits=True)])[0]
        want = ref.forward(seq, kv_dtype=np.float16, logit_rows=[len(seq) - 1]).logits[0]
        assert rel_err(o.logits[0], want) < 2e-2, f"decode step {step}"
        seq += o.tokens
    assert eng.last_step_used_graph


def test_small_prefill_uses_gemv_path(engine_mod, rng):
    """A prompt of <= 8 tokens runs the GEMV kernels eagerly; logits agree with the GEMM path's."""
    _, SamplingParams, SeqInput = engine_mod
    Reference, random_model = _reference()
    model = random_model(weight_type="Q8_0", seed=int(rng.integers(1 << 30)))
    eng = make_engine(engine_mod, model)
    ref = Reference(model.config, model.tensors)
    prompt = rng.integers(0, model.config.vocab_size, 6).tolist()
    out = eng.step([SeqInput(prompt, 0, [0], 1, greedy(SamplingParams), want_logits=True)])[0]
    want = ref.forward(prompt, kv_dtype=np.float16).logits
    for r in range(len(prompt)):
        assert rel_err(out.logits[r], want[r]) < 2e-2


def _decode_run(engine_mod, eng, prompts, steps):
    _, SamplingParams, SeqInput = engine_mod
    seqs = [list(p) for p in prompts]
    tables = [list(range(4 * i, 4 * i + 4)) for i in range(len(prompts))]
    outs = eng.step([SeqInput(p, 0, t, 1, greedy(SamplingParams)) for p, t in zip(seqs, tables)])
    for s, o in zip(seqs, outs):
        s += o.tokens
    logits = []
    for _ in range(steps):
        outs = eng.step([SeqInput([s[-1]], len(s) - 1, t, 1, greedy(SamplingParams), want_logits=True)
                         for s, t in zip(seqs, tables)])
        logits.append([o.logits[0] for o in outs])
        for s, o in zip(seqs, outs):
            s += o.tokens
    return seqs, logits


def test_graph_equals_eager_decode(engine_mod, rng):
    _, random_model = _reference()
    model = random_model(weight_type="Q4_0", n_heads=4, n_kv_heads=2, dim=256, seed=int(rng.integers(1 << 30)))
    prompts = [rng.integers(0, model.config.vocab_size, n).tolist() for n in (9, 30, 65)]
    a = _decode_run(engine_mod, make_engine(engine_mod, model, use_graphs=True), prompts, 5)
    b = _decode_run(engine_mod, make_engine(engine_mod, model, use_graphs=False), prompts, 5)
    assert a[0] == b[0]
    for la, lb in zip(a[1], b[1]):
        for x, y in zip(la, lb):
            assert np.array_equal(x, y)


def test_decode_batch_invariant(engine_mod, rng):
    """A sequence decodes to bit-identical logits alone or beside others (graph sizes 1 and 4)."""
    _, random_model = _reference()
    model = random_model(weight_type="Q8_0", seed=int(rng.integers(1 << 30)))
    prompts = [rng.integers(0, model.config.vocab_size, n).tolist() for n in (12, 40, 3)]
    together = _decode_run(engine_mod, make_engine(engine_mod, model), prompts, 4)
    for i, p in enumerate(prompts):
        alone = _decode_run(engine_mod, make_engine(engine_mod, model), [p], 4)
        assert alone[0][0] == together[0][i]
        for step in range(4):
            assert np.array_equal(alone[1][step][0], together[1][step][i])


def test_seeded_sampling_is_reproducible(engine_mod, rng):
    _, random_model = _reference()
    _, SamplingParams, SeqInput = engine_mod
    model = random_model(weight_type="Q8_0", seed=int(rng.integers(1 << 30)))
    eng = make_engine(engine_mod, model)
    sp = SamplingParams(temperature=0.9, top_p=0.9, top_k=40, seed=42, repetition_penalty=1.1, logprobs=3,
                        logit_bias={5: 2.0})
    prompt = rng.integers(0, model.config.vocab_size, 20).tolist()

    def run():
        seq = list(prompt)
        out = eng.step([SeqInput(seq, 0, [0, 1], 1, sp, history=seq, num_prompt=len(prompt))])[0]
        seq += out.tokens
        lps = [out.logprobs]
        for _ in range(6):
            out = eng.step([SeqInput([seq[-1]], len(seq) - 1, [0, 1], 1, sp, history=seq,
                                     num_prompt=len(prompt))])[0]
            assert len(out.top_logprobs[0]) == 3 and out.logprobs[0] <= 0
            seq += out.tokens
            lps.append(out.logprobs)
        return seq, lps

    assert run() == run()


# ---- SmolLM2 against the CPU engine ----

@pytest.fixture(scope="module")
def smollm2(request, cu):
    from inferd.model.loader import load_model
    path = os.environ.get("INFERD_TEST_SMOLLM2")
    if not path:
        try:
            path = request.getfixturevalue("smollm2_path")
        except Exception as e:   # no network, no cache
            pytest.skip(f"SmolLM2 is not available ({e})")
    return load_model(path)


def test_smollm2_logits_and_greedy_text_match_cpu(engine_mod, smollm2):
    cuda_engine, SamplingParams, SeqInput = engine_mod
    from inferd.engine.engine import Engine
    cpu = Engine(smollm2, num_kv_blocks=8, max_batch_tokens=256, max_seqs=1)
    gpu = cuda_engine.CudaEngine(smollm2, num_kv_blocks=8, max_batch_tokens=256, max_seqs=1, max_logits_rows=64)
    try:
        prompt = list(smollm2.tokenizer.encode("The capital of France is Paris. The capital of Germany is"))
    except Exception:
        prompt = [1, 504, 3575, 282, 4649, 314, 7042, 30, 378, 3575, 282, 6641, 314]
    table = list(range(8))
    sp = SamplingParams(temperature=0.0)
    c = cpu.step([SeqInput(prompt, 0, table, 1, sp, want_logits=True)])[0]
    g = gpu.step([SeqInput(prompt, 0, table, 1, sp, want_logits=True)])[0]
    for r in range(len(prompt)):
        assert rel_err(g.logits[r], c.logits[r]) < 5e-2, f"prompt row {r}"
    cpu_seq, gpu_seq = prompt + c.tokens, prompt + g.tokens
    worst = 0.0
    for _ in range(31):
        c = cpu.step([SeqInput([cpu_seq[-1]], len(cpu_seq) - 1, table, 1, sp, want_logits=True)])[0]
        g = gpu.step([SeqInput([gpu_seq[-1]], len(gpu_seq) - 1, table, 1, sp, want_logits=True)])[0]
        if cpu_seq == gpu_seq:
            worst = max(worst, rel_err(g.logits[0], c.logits[0]))
        cpu_seq += c.tokens
        gpu_seq += g.tokens
    print(f"SmolLM2: worst decode logits relative error vs CPU {worst:.2e}")
    assert gpu_seq[len(prompt):] == cpu_seq[len(prompt):], "greedy text differs within the first 32 tokens"
    assert worst < 5e-2


# ---- host-side batch building (no GPU needed) ----

def test_sampling_arrays_without_gpu():
    """CudaEngine's per-row parameters and logit adjustments, checked on the host: the RNG position is the sampled
    token's position, bias and penalties become one entry per distinct token, repetition over the whole history,
    counts over the output only."""
    try:
        from inferd import _cuda
        from inferd.engine import cuda_engine
        from inferd.engine.types import SamplingParams, SeqInput
    except ImportError as e:
        pytest.skip(f"inferd._cuda or the engine is not importable ({e})")
    eng = cuda_engine.CudaEngine.__new__(cuda_engine.CudaEngine)
    eng._cu = _cuda
    eng.vocab_size = 100
    eng.max_adj = 1000
    sp = SamplingParams(temperature=0.5, top_k=7, seed=99, repetition_penalty=1.3, frequency_penalty=0.5,
                        logit_bias={3: 1.5, 50: -2.0})
    s0 = SeqInput([7, 8], 10, [0], 2, sp, history=[1, 2, 2, 3] + list(range(4, 10)) + [7], num_prompt=3)
    s1 = SeqInput([4, 5, 6], 0, [1], 1, None, want_logits=True)
    positions = [10, 11, 0, 1, 2]
    out_rows = [0, 1, 2, 3, 4]
    rows_of_seq = [(0, 2, 0), (2, 3, 2)]
    params, offsets, adj, masks, need_logits = eng._sampling_arrays([s0, s1], rows_of_seq, positions, out_rows)
    assert not need_logits and masks is None and not params["has_mask"].any()
    assert list(params["position"]) == [11, 12, 0, 0, 3]
    assert list(params["top_k"]) == [7, 7, 0, 0, 0] and params["seed"][0] == 99
    assert offsets[0] == 0 and offsets[2] == offsets[-1] and offsets[2] > offsets[1] > 0
    row1 = adj[offsets[1]:offsets[2]]
    # row 1 samples after token 8 at position 11: the history known there is history[:12] plus token 8
    hist = [1, 2, 2, 3] + list(range(4, 10)) + [7, 8]
    assert sorted(row1["token"].tolist()) == sorted(set(hist) | {3, 50})
    by_tok = {int(e["token"]): e for e in row1}
    assert by_tok[50]["flags"] == 0 and by_tok[50]["bias"] == np.float32(-2.0)
    assert by_tok[3]["bias"] == np.float32(1.5) and by_tok[3]["flags"] == (1 | (1 << 1))   # in output once
    assert by_tok[2]["flags"] == 1                                                         # prompt only
    assert by_tok[8]["flags"] == (1 | (2 << 1))                                            # output twice
