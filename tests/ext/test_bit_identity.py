"""Bit identity, the engine's promise (DESIGN.md section 4): the scalar, AVX2 and VNNI paths give the same bits
for every kernel and type, and a sequence's logits do not depend on how it is batched: alone, as a prefill split
into chunks, or beside other sequences in mixed prefill + decode steps, with 1 or 2 threads. Comparisons are
bitwise (float32 bit patterns), never approximate."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from inferd import _cpu
from inferd.engine.engine import Engine
from inferd.engine.types import SamplingParams, SeqInput
from tests.ext.paths import PATHS
from tests.model.kquant_ref import random_blocks
from tests.reference import LANE_TYPES, make_tensor, random_model

TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "IQ4_NL", "MXFP4")
K_TYPES = ("Q4_K", "Q5_K", "Q6_K", "Q2_K", "Q3_K", "IQ4_XS", "IQ3_S", "IQ3_XXS", "IQ2_S", "IQ2_XS", "IQ2_XXS",
           "IQ1_M", "IQ1_S", "TQ2_0", "TQ1_0")     # rows of a multiple of 256


def test_simd_paths_are_available_here():
    """Without a second path every cross-path test below compares scalar with itself."""
    if len(PATHS) < 2:
        pytest.skip(f"only {PATHS} can run on this CPU")
    if "avxvnni" not in PATHS:
        pytest.skip("this CPU has no AVX-VNNI (VEX): that path is untested here")   # reported, not hidden


def bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, np.float32).view(np.uint32)


def assert_bitwise(a, b, msg=""):
    a, b = np.asarray(a), np.asarray(b)
    assert a.shape == b.shape, msg
    diff = np.nonzero(bits(a).ravel() != bits(b).ravel())[0]
    assert diff.size == 0, f"{msg}: {diff.size} values differ, first at flat index {diff[0]}: " \
                           f"{a.ravel()[diff[0]]!r} vs {b.ravel()[diff[0]]!r}"


# ---- kernels ---------------------------------------------------------------------------------------------------
def weight_of(type_name, rows, cols, seed):
    rng = np.random.default_rng(seed)
    if type_name in LANE_TYPES:   # random blocks with a scale of their own each (make_tensor's share one)
        return _cpu.Weight(type_name, rows, cols, random_blocks(type_name, rows, cols, rng, scale=1.0))
    t = make_tensor("w", rng.standard_normal((rows, cols)).astype(np.float32), type_name)
    return _cpu.Weight(type_name, rows, cols, t.data)


def probe_tokens(rng, ntok, cols, small, zeroed):
    """ntok random tokens: token `small` scaled by 1e-3 (tiny activation scales), token `zeroed`'s first block zero"""
    x = rng.standard_normal((ntok, cols)).astype(np.float32)
    x[small] *= 1e-3
    x[zeroed, :32] = 0
    return x


@pytest.mark.parametrize("type_name,rows,cols",
                         [(t, r, c) for t in TYPES for r, c in [(37, 96), (1003, 160), (64, 1024)]]
                         + [(t, r, c) for t in K_TYPES for r, c in [(37, 256), (203, 512), (64, 1536)]])
def test_matmul_identical_on_every_path(type_name, rows, cols):
    w = weight_of(type_name, rows, cols, rows + cols)
    x = probe_tokens(np.random.default_rng(1), 9, cols, small=3, zeroed=4)
    results = {}
    for p in PATHS:
        _cpu.set_path(p)
        results[p] = w.matmul(x)
    for p in PATHS[1:]:
        assert_bitwise(results[p], results[PATHS[0]], f"{type_name} {p} vs {PATHS[0]}")


# the pair-of-tiles prefill kernels: AVX-512's take every quantized type (Q6_K by halves of 16 values on AMX), AVX2's
# Q4_0, Q4_1, Q4_K, Q6_K and Q2_K (the others' AVX2 prefill goes tile by tile)
PAIR_SHAPES = [(t, r, c) for t in TYPES[3:] for r, c in [(37, 96), (1003, 160), (64, 1024)]] + \
              [(t, r, c) for t in K_TYPES for r, c in [(37, 256), (203, 512), (24, 1536)]]


@pytest.mark.parametrize("type_name,rows,cols", PAIR_SHAPES)
def test_prefill_pair_kernels_identical_to_tiles_and_scalar(type_name, rows, cols):
    """Prefill-sized and batched-decode batches (groups of 12, 4 and single tokens; pairs of tiles and a lone last
    tile, a last tile of fewer rows) give the scalar bits with the pair kernels on and off, writing and accumulating."""
    w = weight_of(type_name, rows, cols, rows * 3 + cols)
    rng = np.random.default_rng(7)
    x = probe_tokens(rng, 43, cols, small=5, zeroed=20)
    y0 = rng.standard_normal((43, rows)).astype(np.float32)
    _cpu.set_path("scalar")
    ref, ref_acc = w.matmul(x), w.matmul(x, y0.copy())
    for p in PATHS[1:]:
        _cpu.set_path(p)
        for kind in _cpu.PREFILL_KERNELS:
            w.kernels.set_prefill_kernels(kind)
            assert_bitwise(w.matmul(x), ref, f"{type_name} {p} {kind}")
            assert_bitwise(w.matmul(x, y0.copy()), ref_acc, f"{type_name} {p} {kind}, accumulating")
            for n in (2, 3, 4, 5, 6, 7, 19):   # the tile kernel's 1-3, the pairs' thresholds (4, 5), past 16
                assert_bitwise(w.matmul(x[:n]), ref[:n], f"{type_name} {p} {kind}, {n} tokens")


@pytest.mark.parametrize("type_name", TYPES + K_TYPES)
def test_matmul_row_independent_of_batch_size(type_name):
    """A token's row is the same in a batch of 1, of 8 (two groups of 4 tokens) and of 37."""
    cols = 512 if type_name in K_TYPES else 160
    w = weight_of(type_name, 45, cols, 5)
    x = np.random.default_rng(2).standard_normal((37, cols)).astype(np.float32)
    for p in PATHS:
        _cpu.set_path(p)
        full = w.matmul(x)
        eight = np.concatenate([w.matmul(x[i:i + 8]) for i in range(0, 37, 8)])
        single = np.concatenate([w.matmul(x[i:i + 1]) for i in range(37)])
        assert_bitwise(eight, full, f"{type_name} {p}: batch of 8 vs 37")
        assert_bitwise(single, full, f"{type_name} {p}: batch of 1 vs 37")


@pytest.mark.parametrize("rows", [8, 24, 45, 203])
def test_decode_tile_groups_identical_to_batch_and_scalar(rows):
    """A single token runs the decode kernel over groups of up to 4 tiles in lockstep, the ymm tile kernels or (on a CPU
    with AVX-512 VNNI) the zmm kernels over pairs of tiles, which also take 2 to 8 tokens at once and 9 to 16 in two
    passes, for every quantized type: groups of every size, pairs and lone tiles, cut at a fused weight's segment
    boundaries and at its last tile of fewer rows, writing and accumulating, give the scalar bits and the token's rows
    of a batch."""
    cols, rng = 512, np.random.default_rng(rows)
    specs = [("Q4_K", 24), ("Q4_K", 16), ("Q6_K", -(-rows // 8) * 8), ("Q8_0", 13)]   # tiles 3 | 2 | 1 to 26 | 2
    parts = [(t, r, cols, make_tensor("w", rng.standard_normal((r, cols)).astype(np.float32), t).data)
             for t, r in specs]
    fused = _cpu.Weight("parts", 0, 0, None, parts=parts)
    plain_types = ("Q4_K", "Q5_K", "Q6_K", "Q2_K", "Q3_K", "IQ4_XS", "IQ3_S", "IQ2_XXS", "IQ1_M", "TQ1_0") + TYPES[3:]
    plain_specs = [(t, cols) for t in plain_types]
    plain_specs += [("Q4_K", 1536)]
    plain = [weight_of(t, rows, c, rows + c) for t, c in plain_specs]
    for w in [fused] + plain:
        n, k = w.dequantize().shape
        x = probe_tokens(rng, 16, k, small=2, zeroed=11)
        y0 = rng.standard_normal((16, n)).astype(np.float32)
        _cpu.set_path("scalar")
        ref, ref_acc = w.matmul(x), w.matmul(x, y0.copy())
        for p, group, kernels, pf in itertools.product(PATHS, (1, 2, 3, 4), _cpu.DECODE_KERNELS, (None, 0)):
            _cpu.set_path(p)
            w.kernels.set_decode_group(group)
            w.kernels.set_decode_kernels(kernels)
            w.kernels.set_decode_prefetch(pf)
            batch = w.matmul(x)
            what = f"{p}, {kernels} groups of {group}, prefetch {pf}, {n} x {k}, 16 tokens"
            assert_bitwise(batch, ref, what)
            assert_bitwise(w.matmul(x, y0.copy()), ref_acc, f"{what}, accumulating")
            for m in (2, 3, 4, 5, 8, 9, 13):   # a few tokens share the decode kernels' unpacked tiles (zmm)
                what = f"{p}, {kernels} groups of {group}, prefetch {pf}, {n} x {k}, {m} tokens"
                assert_bitwise(w.matmul(x[:m]), ref[:m], what)
                assert_bitwise(w.matmul(x[:m], y0[:m].copy()), ref_acc[:m], f"{what}, accumulating")
            for t in range(8):
                what = f"{p}, {kernels} groups of {group}, prefetch {pf}, {n} x {k}, token {t}"
                assert_bitwise(w.matmul(x[t:t + 1])[0], ref[t], what)
                assert_bitwise(w.matmul(x[t:t + 1], y0[t:t + 1].copy())[0], ref_acc[t], f"{what}, accumulating")
    with pytest.raises(ValueError):
        _cpu.KernelConfig().set_decode_group(5)
    with pytest.raises(ValueError):
        _cpu.KernelConfig().set_decode_kernels("amx")


def test_decode_prefetch_default_follows_the_cpu_vendor():
    """Decode steps prefetch every tile, but on AMD only tiles of up to 16 KB (matmul.c says why)."""
    with open("/proc/cpuinfo") as f:
        amd = "AuthenticAMD" in f.read()
    assert _cpu.KernelConfig().decode_prefetch() == (16384 if amd else None)


def test_decode_zmm_kernels_in_use_where_the_cpu_has_them():
    """The identity test above reaches the zmm decode kernels only where they run: say so where they do not."""
    old, kernels = _cpu.get_path(), _cpu.KernelConfig()
    try:
        _cpu.set_path("scalar")
        assert kernels.decode_kernels() == "tiles"
        vnni = [p for p in PATHS if p in ("avxvnni", "avx512vnni")]
        if not vnni:
            pytest.skip("no VNNI path on this CPU: the zmm decode kernels are untested here")
        _cpu.set_path(vnni[0])
        if kernels.prefill_kernels() == "tiles":
            pytest.skip("this CPU has no AVX-512 VNNI: the zmm decode kernels are untested here")
        assert kernels.decode_kernels() == "avx512"
    finally:
        _cpu.set_path(old)


def test_activation_quantization_identical_on_every_path():
    x = np.random.default_rng(3).standard_normal(32 * 50).astype(np.float32) * 7
    x[:32] = np.r_[127.0, np.arange(31) + 0.5]                            # rounding midpoints
    results = {}
    for p in PATHS:
        _cpu.set_path(p)
        results[p] = _cpu.quantize_activations(x)
    for p in PATHS[1:]:
        for a, b in zip(results[p], results[PATHS[0]]):
            np.testing.assert_array_equal(a, b, err_msg=p)


def test_rms_norm_and_sampler_identical_on_every_path():
    rng = np.random.default_rng(4)
    x, g = rng.standard_normal(576).astype(np.float32), rng.standard_normal(576).astype(np.float32)
    logits = rng.standard_normal(1000).astype(np.float32)
    params = {"temperature": 0.9, "top_k": 50, "top_p": 0.9, "seed": 5, "num_logprobs": 5,
              "repetition_penalty": 1.3}
    results = {}
    for p in PATHS:
        _cpu.set_path(p)
        results[p] = (_cpu.rms_norm(x, g, 1e-5), [_cpu.sample(logits, params, pos, history=[1, 2, 3])
                                                   for pos in range(20)])
    for p in PATHS[1:]:
        assert_bitwise(results[p][0], results[PATHS[0]][0], p)
        assert results[p][1] == results[PATHS[0]][1], p


def test_gated_units_identical_on_every_path():
    rng = np.random.default_rng(13)
    g = np.concatenate([rng.standard_normal(992) * 4, np.linspace(-100, 100, 32)]).astype(np.float32)
    u = rng.standard_normal(g.size).astype(np.float32)
    results = {}
    for p in PATHS:
        _cpu.set_path(p)
        results[p] = [_cpu.glu(g, u, kind) for kind in ("swiglu", "geglu")]
    for p in PATHS[1:]:
        for a, b in zip(results[p], results[PATHS[0]]):
            assert_bitwise(a, b, p)


# ---- whole steps -----------------------------------------------------------------------------------------------
def mixed_step_inputs(vocab: int):
    """One step mixing a prefill (70 tokens, across a KV block boundary), a decode, and a second chunk."""
    rng = np.random.default_rng(6)
    p1 = rng.integers(0, vocab, 70).tolist()
    p2 = rng.integers(0, vocab, 9).tolist()
    return p1, p2


def run_mixed(model, threads=1, kv="f16"):
    """Step 1: seq 0 prefill 70 and seq 1 prefill 9. Step 2: seq 0 decodes, seq 1 prefills 9 more.
    Returns everything both steps produced."""
    p1, p2 = mixed_step_inputs(model.config.vocab_size)
    eng = Engine(model, num_kv_blocks=6, max_batch_tokens=96, max_seqs=4, threads=threads, max_logits_rows=96,
                 kv_cache_dtype=kv)
    seeded = SamplingParams(temperature=0.9, top_p=0.95, seed=42, logprobs=3)
    out1, h1 = eng.step([SeqInput(p1, 0, [4, 1], want_logits=True, params=seeded),
                         SeqInput(p2, 0, [0], num_sampled=0, want_logits=True)], want_hidden=True)
    out2, h2 = eng.step([SeqInput(p2[:4] + p2[5:], 9, [0], want_logits=True, params=seeded),
                         SeqInput([out1[0].tokens[0]], 70, [4, 1], want_logits=True)], want_hidden=True)
    return {"hidden1": h1, "hidden2": h2, "logits": [o.logits for o in out1 + out2],
            "tokens": [o.tokens for o in out1 + out2], "logprobs": [o.logprobs for o in out1 + out2],
            "top": [o.top_logprobs for o in out1 + out2]}


def assert_same_run(a, b, what):
    assert_bitwise(a["hidden1"], b["hidden1"], f"{what}: hidden states, step 1")
    assert_bitwise(a["hidden2"], b["hidden2"], f"{what}: hidden states, step 2")
    for i, (x, y) in enumerate(zip(a["logits"], b["logits"])):
        assert_bitwise(x, y, f"{what}: logits of output {i}")
    assert a["tokens"] == b["tokens"] and a["logprobs"] == b["logprobs"] and a["top"] == b["top"], what


MODELS = {t: dict(weight_type=t) for t in TYPES}
MODELS["qwen2-Q4_0-bias"] = dict(arch="qwen2", weight_type="Q4_0", embed_type="Q8_0")
MODELS["hd128-Q4_1-untied"] = dict(weight_type="Q4_1", n_heads=2, n_kv_heads=1, head_dim=128, tie=False,
                                   output_type="Q8_0")
# llama.cpp's Q4_K_M mix: Q4_K with a Q6_K V (a second segment of the fused QKV) and down projection and output
MODELS["qwen2-Q4_K_M"] = dict(arch="qwen2", weight_type="Q4_K", dim=256, hidden=512, n_heads=4, n_kv_heads=2,
                              tie=False, output_type="Q6_K", mix={"attn_v": "Q6_K", "ffn_down": "Q6_K"})
MODELS["Q5_K-Q5_0"] = dict(weight_type="Q5_K", dim=256, hidden=512, embed_type="Q5_0", mix={"ffn_down": "Q5_1"})
MODELS["qwen3-Q8_0-qk-norm"] = dict(arch="qwen3", weight_type="Q8_0", head_dim=128)
# sliding window 24 on layers 0 and 1 (random_model), crossed by the 70-token prefill and its chunks
MODELS["gemma3-Q4_0-window"] = dict(arch="gemma3", weight_type="Q4_0", embed_type="Q8_0", n_layers=3, head_dim=256)
# mixtures of experts: 8 experts, 2 or 3 used per token, so a step's experts have a few rows each (a decode, one), or
# none; Qwen2-MoE's shared expert in Q4_K_M's mix; OLMoE's float experts and its QK-norm over all of q and k
MODELS["qwen3moe-Q8_0"] = dict(arch="qwen3moe", weight_type="Q8_0", head_dim=128, experts=8, experts_used=2)
MODELS["qwen2moe-Q4_K_M-shared"] = dict(arch="qwen2moe", weight_type="Q4_K", dim=256, n_heads=4, n_kv_heads=2,
                                        tie=False, output_type="Q6_K", mix={"attn_v": "Q6_K", "ffn_down_exps": "Q6_K"},
                                        experts=8, experts_used=2, expert_hidden=256, shared_hidden=512)
MODELS["olmoe-F16"] = dict(arch="olmoe", weight_type="F16", n_kv_heads=2, experts=8, experts_used=3)
MODELS["mixtral-Q4_0"] = dict(arch="llama", weight_type="Q4_0", embed_type="Q8_0", experts=8, experts_used=2,
                              expert_hidden=96)
# gpt-oss: sinks, biases, MXFP4 experts with their biases, the clamped SwiGLU, a window on layer 0, YaRN
MODELS["gpt-oss-MXFP4"] = dict(arch="gpt-oss", weight_type="Q8_0", n_heads=4, n_kv_heads=2, head_dim=64, tie=False,
                               experts=8, experts_used=4, expert_hidden=64, rope_theta=150000.0,
                               mix={"ffn_gate_exps": "MXFP4", "ffn_up_exps": "MXFP4", "ffn_down_exps": "MXFP4"},
                               yarn={"factor": 32.0, "original_context": 4096, "ext_factor": 1.0,
                                     "attn_factor": 1.0, "beta_fast": 32.0, "beta_slow": 1.0})
MOE_MODELS = ["qwen3moe-Q8_0", "qwen2moe-Q4_K_M-shared", "olmoe-F16", "mixtral-Q4_0", "gpt-oss-MXFP4"]


# the int8 KV cache (kv_cache_dtype q8_0) under the same promises, with head sizes 64, 128 and 256, GQA and windows
KV_Q8_MODELS = ["Q4_1", "hd128-Q4_1-untied", "qwen2-Q4_K_M", "qwen3-Q8_0-qk-norm", "gemma3-Q4_0-window",
                "gpt-oss-MXFP4"]
KV_CASES = [(n, "f16") for n in MODELS] + [(n, "q8_0") for n in KV_Q8_MODELS]


@pytest.mark.parametrize("name,kv", KV_CASES)
def test_engine_step_identical_on_every_path(name, kv):
    model = random_model(**MODELS[name])
    runs = {}
    for p in PATHS:
        _cpu.set_path(p)
        runs[p] = run_mixed(model, kv=kv)
    for p in PATHS[1:]:
        assert_same_run(runs[p], runs[PATHS[0]], f"{name} ({kv} KV): {p} vs {PATHS[0]}")


def test_q8_kv_changes_the_result_a_little():
    """The q8_0 cache is used (its logits differ from f16's) and close (the same greedy tokens, logits within a
    few percent of their spread)."""
    model = random_model(**MODELS["Q4_1"])
    a, b = run_mixed(model, kv="f16"), run_mixed(model, kv="q8_0")
    for x, y in zip(a["logits"], b["logits"]):
        assert not np.array_equal(x, y)
        np.testing.assert_allclose(y, x, rtol=0, atol=0.05 * (x.max() - x.min()))


@pytest.mark.parametrize("name,kv", [("Q4_1", "f16"), ("BF16", "f16"), ("qwen2-Q4_K_M", "f16"), ("Q4_1", "q8_0")]
                         + [(n, "f16") for n in MOE_MODELS])
def test_engine_step_identical_with_more_threads(name, kv):
    model = random_model(**MODELS[name])
    assert_same_run(run_mixed(model, threads=2, kv=kv), run_mixed(model, threads=1, kv=kv),
                    f"{name} ({kv} KV): 2 threads vs 1")


# ---- a sequence alone, chunked, batched --------------------------------------------------------------------------
PROMPT_LEN = 75
DECODE = 4


def sequence_alone(eng, prompt, params):
    out = eng.step([SeqInput(prompt, 0, [1, 3], want_logits=True, params=params, history=prompt)])[0]
    logits, tokens = [out.logits], list(out.tokens)
    for _ in range(DECODE):
        hist = prompt + tokens
        out = eng.step([SeqInput([tokens[-1]], len(hist) - 1, [1, 3], want_logits=True, params=params,
                                 history=hist, num_prompt=len(prompt))])[0]
        logits.append(out.logits)
        tokens += out.tokens
    return np.concatenate(logits), tokens


def sequence_chunked(eng, prompt, params, chunks=(17, 30, 28)):
    logits, start = [], 0
    for n in chunks:
        last = start + n == len(prompt)
        out = eng.step([SeqInput(prompt[start:start + n], start, [1, 3], num_sampled=1 if last else 0,
                                 want_logits=True, params=params, history=prompt)])[0]
        logits.append(out.logits)
        start += n
    tokens = list(out.tokens)
    for _ in range(DECODE):
        hist = prompt + tokens
        out = eng.step([SeqInput([tokens[-1]], len(hist) - 1, [1, 3], want_logits=True, params=params,
                                 history=hist, num_prompt=len(prompt))])[0]
        logits.append(out.logits)
        tokens += out.tokens
    return np.concatenate(logits), tokens


def sequence_batched(eng, prompt, params, vocab):
    """The sequence's chunks (40, 35) and decodes share every step with other sequences: B decodes all along
    (after a 12-token prefill in the first step), C prefills in chunks of 20 and then decodes; A sits first,
    in the middle or last. Other sequences use greedy or other seeds."""
    rng = np.random.default_rng(9)
    pb, pc = rng.integers(0, vocab, 12).tolist(), rng.integers(0, vocab, 60).tolist()
    other = SamplingParams(temperature=1.0, seed=7)
    tb, pos_b, pos_c = [], 0, 0

    def b_input():
        nonlocal pos_b
        if pos_b == 0:
            s = SeqInput(pb, 0, [0], params=other)
        else:
            s = SeqInput([tb[-1]], pos_b, [0], params=other)
        return s

    def c_input():
        nonlocal pos_c
        n = min(20, len(pc) - pos_c) if pos_c < len(pc) else 1
        toks = pc[pos_c:pos_c + n] if pos_c < len(pc) else [int(rng.integers(0, vocab))]
        return SeqInput(toks, pos_c, [2, 5], num_sampled=1 if pos_c + n >= len(pc) else 0)

    def run(a_input, a_slot):
        nonlocal pos_b, pos_c
        b, c = b_input(), c_input()
        seqs = [b, c]
        seqs.insert(a_slot, a_input)
        outs = eng.step(seqs)
        ob = outs[seqs.index(b)]
        tb.extend(ob.tokens)
        pos_b += len(b.token_ids)
        pos_c += len(c.token_ids)
        return outs[a_slot]

    logits = []
    out = run(SeqInput(prompt[:40], 0, [1, 3], num_sampled=0, want_logits=True, params=params, history=prompt), 1)
    logits.append(out.logits)
    out = run(SeqInput(prompt[40:], 40, [1, 3], want_logits=True, params=params, history=prompt), 0)
    logits.append(out.logits)
    tokens = list(out.tokens)
    for k in range(DECODE):
        hist = prompt + tokens
        out = run(SeqInput([tokens[-1]], len(hist) - 1, [1, 3], want_logits=True, params=params, history=hist,
                           num_prompt=len(prompt)), [2, 1, 0, 2][k])
        logits.append(out.logits)
        tokens += out.tokens
    return np.concatenate(logits), tokens


def sequence_token_by_token(eng, prompt, params):
    """The prompt fed as decode steps, one token each: every position computed as a decode."""
    logits = []
    for i, t in enumerate(prompt):
        last = i == len(prompt) - 1
        out = eng.step([SeqInput([t], i, [1, 3], num_sampled=1 if last else 0, want_logits=True, params=params,
                                 history=prompt)])[0]
        logits.append(out.logits)
    tokens = list(out.tokens)
    for _ in range(DECODE):
        hist = prompt + tokens
        out = eng.step([SeqInput([tokens[-1]], len(hist) - 1, [1, 3], want_logits=True, params=params,
                                 history=hist, num_prompt=len(prompt))])[0]
        logits.append(out.logits)
        tokens += out.tokens
    return np.concatenate(logits), tokens


@pytest.mark.parametrize("name,kv", [("Q4_1", "f16"), ("BF16", "f16"), ("qwen2-Q4_0-bias", "f16"),
                                     ("qwen2-Q4_K_M", "f16"), ("gemma3-Q4_0-window", "f16"), ("Q4_1", "q8_0"),
                                     ("qwen2-Q4_K_M", "q8_0"), ("gemma3-Q4_0-window", "q8_0")]
                         + [(n, "f16") for n in MOE_MODELS])
def test_sequence_logits_do_not_depend_on_batching(name, kv):
    model = random_model(**MODELS[name])
    vocab = model.config.vocab_size
    prompt = np.random.default_rng(8).integers(0, vocab, PROMPT_LEN).tolist()
    params = SamplingParams(temperature=0.8, top_k=40, seed=1234, repetition_penalty=1.2, logprobs=2)

    def engine(threads=1):
        return Engine(model, num_kv_blocks=6, max_batch_tokens=128, max_seqs=4, threads=threads,
                      max_logits_rows=128, kv_cache_dtype=kv)

    alone_logits, alone_tokens = sequence_alone(engine(), prompt, params)
    assert alone_logits.shape == (PROMPT_LEN + DECODE, vocab)
    for what, (logits, tokens) in {
        "chunked prefill": sequence_chunked(engine(), prompt, params),
        "batched with others": sequence_batched(engine(), prompt, params, vocab),
        "batched, 2 threads": sequence_batched(engine(threads=2), prompt, params, vocab),
        "prefill as decodes": sequence_token_by_token(engine(), prompt, params),
    }.items():
        assert_bitwise(logits, alone_logits, f"{name}, {what}")
        assert tokens == alone_tokens, f"{name}, {what}: seeded samples differ"


# ---- decode at depth: a step of one long sequence splits its keys across threads -----------------------------------
@pytest.mark.parametrize("name", ["Q4_1", "gemma3-Q4_0-window"])
def test_decode_at_depth_matches_prefill(name):
    """Past 1024 positions a lone decode step splits each head's keys into segments for the threads and merges
    them in order (block_attention.c attention_split_fn): its logits equal, bit for bit, those of the same tokens
    inside a prefill chunk (not split), with 1 or 2 threads; and the sliding-window layers skip the segments they do
    not see."""
    model = random_model(**MODELS[name], context_length=2304)
    vocab = model.config.vocab_size
    tokens = np.random.default_rng(2).integers(0, vocab, 2200).tolist()
    prompt, tail = tokens[:2195], tokens[2195:]
    table = list(range(35))

    def prefill(eng, upto):
        for start in range(0, upto, 256):
            n = min(256, upto - start)
            eng.step([SeqInput(tokens[start:start + n], start, table, num_sampled=1 if start + n == upto else 0)])

    def engine(threads):
        return Engine(model, num_kv_blocks=36, max_batch_tokens=256, max_seqs=1, threads=threads,
                      max_logits_rows=256)

    ref = engine(1)
    prefill(ref, 2000)
    want = ref.step([SeqInput(tokens[2000:], 2000, table, want_logits=True)])[0].logits[-len(tail):]
    for threads in (1, 2):
        eng = engine(threads)
        prefill(eng, len(prompt))
        got = [eng.step([SeqInput([tok], len(prompt) + i, table, want_logits=True)])[0].logits[0]
               for i, tok in enumerate(tail)]
        assert_bitwise(np.stack(got), want, f"{name}: decode with {threads} threads vs prefill")
