"""gpt-oss (llama.cpp's `gpt-oss`, its openai-moe graph) on the CPU engine against tests/reference.py: attention
sinks, Q/K/V/O biases, the router's bias with its top k taken on the logits and the softmax over those k, the experts'
biases, the clamped SwiGLU, alternating sliding-window and full layers, YaRN RoPE; on in-memory models (F32, and
MXFP4 experts) and on tiny GGUF files read by the real loader (F32, and MXFP4 experts beside Q8_0 matrices). The
kernels' pieces on their own: the attention kernel's sinks, YaRN's frequencies. Agreement with llama.cpp on the same
files is in tests/engine/test_llamacpp_moe.py; bit identity across paths and batches in test_bit_identity.py.

Tolerances are test_moe.py's (the same reasons): F32 at the dense files' 1e-3, quantized files against the
reference with its activations rounded to 8 bits as the engine's are, at the quantized 5e-2, on prompts whose
routing is clear of ties. Measured: F32 at most 2.7e-4 (in memory) and 1.2e-4 (file), MXFP4 1.7e-2 and 1.5e-2."""
from __future__ import annotations

import math

import numpy as np
import pytest

from inferd import _cpu
from inferd.engine.engine import Engine
from inferd.engine.runner import generate
from inferd.engine.request import Request
from inferd.engine.types import SamplingParams, SeqInput
from inferd.engine.weights import engine_config
from tests.engine.test_forward_reference import FLOAT_TOL, QUANT_TOL, row_errors
from tests.engine.test_moe import clear_routing, run_engine
from tests.reference import Reference, random_model, yarn_inv_freq

YARN = {"factor": 32.0, "original_context": 4096, "ext_factor": 1.0, "attn_factor": 1.0, "beta_fast": 32.0,
        "beta_slow": 1.0}
MXFP4_EXPERTS = {"ffn_gate_exps": "MXFP4", "ffn_up_exps": "MXFP4", "ffn_down_exps": "MXFP4"}


def gptoss_model(weight_type="F32", mix=None, seed=0):
    """4 layers (0 and 2 a sliding window of 16), 8 experts of 64, 4 used, YaRN as gpt-oss-20b has it."""
    return random_model(arch="gpt-oss", weight_type=weight_type, mix=mix, dim=128, n_layers=4, n_heads=4,
                        n_kv_heads=2, head_dim=64, hidden=128, experts=8, experts_used=4, expert_hidden=64, tie=False,
                        rope_theta=150000.0, yarn=YARN, seed=seed)


@pytest.mark.parametrize("weight_type,mix", [("F32", None), ("Q8_0", MXFP4_EXPERTS)], ids=["f32", "mxfp4"])
def test_gptoss_matches_reference(weight_type, mix):
    model = gptoss_model(weight_type, mix)
    cfg = model.config
    assert cfg.local_layers == (0, 2) and cfg.attn_sinks and cfg.expert_gating == "topk_softmax"
    if mix:
        assert model.tensors["blk.0.ffn_down_exps.weight"].type == "MXFP4"
    quantized = weight_type != "F32"
    toks, ref = clear_routing(model, quantized)
    logits, hidden = run_engine(model, toks)
    errors = np.concatenate([row_errors(hidden, ref.hidden), row_errors(logits, ref.logits)[None]])
    worst = errors.max(axis=1)
    assert worst.max() <= (QUANT_TOL if quantized else FLOAT_TOL), f"worst row error per layer, then logits: {worst}"


def test_each_gptoss_switch_changes_the_output():
    """The reference's switches are each live in the engine: turning one off moves the logits (so the agreement above
    is not that of a switch both sides ignore)."""
    base = gptoss_model()
    toks, _ = clear_routing(base, False)
    want, _ = run_engine(base, toks)
    for change in ({"attn_sinks": False}, {"yarn": None}, {"local_layers": ()}, {"expert_gating": "softmax"},
                   {"ffn_act": "silu"}):
        m = gptoss_model()
        cfg = m.config.__class__(**{**m.config.__dict__, **change})
        tensors = dict(m.tensors)
        if change.get("attn_sinks") is False:
            tensors = {k: v for k, v in tensors.items() if "attn_sinks" not in k}
        m.config, m.tensors = cfg, tensors
        got, _ = run_engine(m, toks)
        ref = Reference(cfg, tensors).forward(toks, kv_dtype=np.float16)
        assert np.abs(got - want).max() > 1e-2, change
        assert row_errors(got, ref.logits).max() <= FLOAT_TOL, change


def test_attention_sinks_in_the_kernel():
    """The attention kernel's sinks against numpy: each head's softmax with its sink in the denominator, over the f16
    cache whole, split into key segments, and over the int8 cache (whose keys and values are rounded to 8 bits)."""
    rng = np.random.default_rng(3)
    ntok, n_heads, n_kv, hd, pos0 = 5, 4, 2, 64, 1100          # 1105 keys: two segments of 16 blocks
    n = pos0 + ntok
    blocks = (n + 63) // 64
    q = rng.standard_normal((ntok, n_heads, hd)).astype(np.float32)
    k = rng.standard_normal((blocks, n_kv, 64, hd)).astype(np.float16)
    v = rng.standard_normal((blocks, n_kv, 64, hd)).astype(np.float16)
    bt = np.arange(blocks, dtype=np.int32)
    sinks = np.array([-50.0, 0.0, 3.0, 8.0], np.float32)        # none, some, much, nearly all of the weight
    kf = k.astype(np.float64).transpose(1, 0, 2, 3).reshape(n_kv, -1, hd)[:, :n]
    vf = v.astype(np.float64).transpose(1, 0, 2, 3).reshape(n_kv, -1, hd)[:, :n]
    want = np.empty((ntok, n_heads, hd))
    for t in range(ntok):
        for h in range(n_heads):
            s = kf[h // 2, :pos0 + t + 1] @ q[t, h] / math.sqrt(hd)
            m = max(s.max(), sinks[h])
            e = np.exp(s - m)
            want[t, h] = e @ vf[h // 2, :pos0 + t + 1] / (e.sum() + math.exp(sinks[h] - m))
    for split in (False, True):
        got = _cpu.attention(q, k, v, bt, pos0, run=1 if split else 16, split=split, sinks=sinks)
        np.testing.assert_allclose(got, want, atol=2e-5, rtol=1e-4)
    plain = _cpu.attention(q, k, v, bt, pos0)
    assert np.abs(plain - want).max() > 1e-2                     # the sinks took weight away
    kq, vq = _cpu.kvq8_pack(k, True), _cpu.kvq8_pack(v, False)
    got = _cpu.attention_q8(q, kq, vq, bt, pos0, sinks=sinks)
    np.testing.assert_allclose(got, want, atol=3e-2)


def test_yarn_frequencies_and_magnitude():
    """The engine's YaRN frequencies equal the reference's (llama.cpp's rope_yarn: interpolated below the correction
    band, kept above it, a ramp between), and its RoPE table carries YaRN's magnitude 1 + 0.1 ln 32 on cos and sin."""
    cfg = gptoss_model().config
    inv, mscale = yarn_inv_freq(cfg)
    got = _cpu.rope_frequencies(engine_config(cfg))
    np.testing.assert_allclose(got, inv, rtol=1e-12)
    plain = 150000.0 ** (-np.arange(0, 64, 2) / 64)
    assert got[0] == plain[0] and np.allclose(got[-1], plain[-1] / 32)   # fast pairs kept, slow ones interpolated
    assert mscale == pytest.approx(1 + 0.1 * math.log(32))


def test_gptoss_greedy_decode_is_its_prefill():
    """A greedy decode of 24 tokens on the MXFP4 model: each token is the argmax of the logits a prefill of the
    sequence so far gives (decode steps of one token, across the window of 16 and a KV block, equal a prefill)."""
    model = gptoss_model("Q8_0", MXFP4_EXPERTS, seed=2)
    prompt = list(map(int, np.random.default_rng(5).integers(3, model.config.vocab_size, 50)))
    eng = Engine(model, num_kv_blocks=8, max_batch_tokens=128, max_seqs=2, threads=2, max_logits_rows=128)
    out = [t for o in generate(eng, Request("r", prompt, SamplingParams(temperature=0.0), 24)) for t in o.token_ids]
    assert len(out) == 24
    seq = list(prompt)
    fresh = Engine(model, num_kv_blocks=8, max_batch_tokens=128, max_seqs=2, threads=1, max_logits_rows=128)
    for tok in out:
        outs = fresh.step([SeqInput(seq, 0, list(range(8)), want_logits=True)])
        assert int(np.argmax(outs[0].logits[-1])) == tok
        seq.append(tok)



@pytest.mark.parametrize("type_name", ["f32", "mxfp4"])
def test_gptoss_file_matches_reference(load_variant, type_name):
    """The tiny files as the real loader reads them: gpt-oss's metadata (window, YaRN, experts) and tensors."""
    model = load_variant(f"gpt-oss-gguf-{type_name}")
    cfg = model.config
    assert (cfg.arch, cfg.sliding_window, cfg.local_layers, cfg.yarn["factor"]) == ("gpt-oss", 16, (0, 2), 32.0)
    assert (cfg.n_experts, cfg.n_experts_used, cfg.expert_gating, cfg.ffn_act) == (8, 4, "topk_softmax", "swiglu_oai")
    assert model.tensors["blk.1.ffn_gate_exps.weight"].type == ("MXFP4" if type_name == "mxfp4" else "F32")
    quantized = type_name != "f32"
    # the tiny gpt-oss routers are three times as sharp as test_moe's: the 8-bit activations' rounding (the engine's
    # against the reference's) moves their logits three times as far, so a quantized model needs a wider margin
    toks, ref = clear_routing(model, True, margin=0.01, seeds=59) if quantized else clear_routing(model, False)
    logits, hidden = run_engine(model, toks)
    errors = np.concatenate([row_errors(hidden, ref.hidden), row_errors(logits, ref.logits)[None]])
    worst = errors.max(axis=1)
    assert worst.max() <= (QUANT_TOL if quantized else FLOAT_TOL), f"worst row error per layer, then logits: {worst}"


def test_gptoss_chat_template_renders_harmony(load_variant):
    """The file's chat template (harmony) renders the prompt, whose markers are single control tokens."""
    from inferd.text.chat import render_chat

    model = load_variant("gpt-oss-gguf-mxfp4")
    prompt = render_chat(model.chat_template, [{"role": "user", "content": "Hi there"}], add_generation_prompt=True)
    assert prompt.endswith("<|start|>user<|message|>Hi there<|end|><|start|>assistant")
    ids = model.tokenizer.encode(prompt, add_special=False)
    markers = [i for i in ids if model.tokenizer.is_special(i)]
    want = ["<|start|>", "<|message|>", "<|end|>", "<|start|>"]        # ...user<|message|>Hi there<|end|>, assistant
    assert [model.tokenizer.token_text(i) for i in markers[-4:]] == want
