"""The mixture-of-experts block (ext/cpu/block_moe.c) on tiny GGUF files of every MoE architecture, read by the
real loader (3-D expert tensors), against tests/reference.py layer by layer; its router's ties; speculative decoding
on it. Bit identity across paths, threads and batches is in tests/ext/test_bit_identity.py (its MoE models), and
agreement with llama.cpp in tests/engine/test_llamacpp_moe.py.

Tolerances: F32 files are held to the dense files' 1e-3 (tests/engine/test_forward_reference.py; measured: at most
1.3e-4). Quantized files (Q8_0, Q4_K) are compared with the reference's activations rounded to 8 bits as the
engine's are (act_quant): without that, the ~1% rounding of a quantized matmul's input moves a router's logits enough
to flip a near tie between two experts, and a flipped token differs by the whole of an expert (measured: 0.24 on an
in-memory Mixtral). With it the engine follows the reference to 1e-7 until one activation at a rounding midpoint
rounds the other way in float32 and moves the later tokens of the sequence by a quantization step; the worst row is
held to the dense files' quantized tolerance, 5e-2 (measured: 2.0e-2). Either way the prompts are ones whose routing
the reference finds clear of ties (clear_routing): a near tie is a coin toss for float32 arithmetic."""
from __future__ import annotations

import numpy as np
import pytest

from inferd.engine.engine import Engine
from inferd.engine.request import Request
from inferd.engine.runner import GenerationStats, generate
from inferd.engine.types import SamplingParams, SeqInput
from tests.engine.test_forward_reference import FLOAT_TOL, QUANT_TOL, row_errors
from tests.model.make_tiny import MOE_SPECS
from tests.reference import Reference, make_tensor, random_model

SEQ_LEN = 70                      # crosses the 64-position KV block boundary
ROUTE_MARGIN = 1e-3               # router logits this close to a tie are left out (clear_routing)
CASES = [(arch, t) for arch in MOE_SPECS for t in ("f32", "q8_0", "q4_k")]



def clear_routing(model, act_quant: bool, margin: float = ROUTE_MARGIN, seeds: int = 29):
    """Tokens whose every routing decision is clear of a tie by `margin` in the reference, and the reference's
    pass over them: a near tie goes either way in float32 (the first of the seeds tried that has none)."""
    for seed in range(1, seeds + 1):
        toks = np.random.default_rng(seed).integers(3, model.config.vocab_size, SEQ_LEN)
        ref = Reference(model.config, model.tensors)
        out = ref.forward(toks, kv_dtype=np.float16, act_quant=act_quant)
        if np.min(ref.route_margins) > margin:
            return toks, out
    raise AssertionError(f"no prompt of the seeds tried routes clear of ties by {margin}")


def run_engine(model, tokens, threads=2):
    eng = Engine(model, num_kv_blocks=3, max_batch_tokens=128, max_seqs=4, threads=threads, max_logits_rows=128)
    outs, hidden = eng.step([SeqInput(list(map(int, tokens)), 0, [2, 0], want_logits=True)], want_hidden=True)
    return outs[0].logits, hidden


@pytest.mark.parametrize("arch,type_name", CASES)
def test_moe_file_matches_reference(load_variant, arch, type_name):
    model = load_variant(f"{arch}-gguf-{type_name}")
    cfg = model.config
    assert cfg.n_experts == MOE_SPECS[arch].n_experts and cfg.n_experts_used == MOE_SPECS[arch].n_experts_used
    assert (cfg.shared_expert_hidden_dim > 0) == (arch == "qwen2moe")
    quantized = type_name != "f32"
    toks, ref = clear_routing(model, quantized)
    logits, hidden = run_engine(model, toks)
    errors = np.concatenate([row_errors(hidden, ref.hidden), row_errors(logits, ref.logits)[None]])
    assert errors[0].max() == 0.0, "the embeddings are a table lookup"
    worst = errors.max(axis=1)
    tol = QUANT_TOL if quantized else FLOAT_TOL
    assert worst.max() <= tol, f"{arch} {type_name}: worst row error per layer, then logits: {worst}"


class FirstExperts(Reference):
    """The reference with every token's FFN fixed to experts 0..k-1, each weighted w: what a router that scores all
    experts alike must give when ties go to the lower index."""

    def __init__(self, config, tensors, weight):
        super().__init__(config, tensors)
        self.weight = weight

    def moe_ffn(self, p, h, act_quant=False):
        gate, up, down = (self.experts(p + f"ffn_{r}_exps.weight") for r in ("gate", "up", "down"))
        return sum(self.weight * self.gated_ffn(h, gate[e], up[e], down[e]) for e in range(self.cfg.n_experts_used))


@pytest.mark.parametrize("arch", ["qwen3moe", "olmoe"])
def test_router_ties_go_to_the_lower_expert(arch):
    """Routers of zeros score every expert alike: each token takes experts 0..k-1, weighted 1/n, or 1/k where the
    weights are renormalized (Qwen3-MoE; OLMoE keeps the softmax's)."""
    n, k = 6, 3
    model = random_model(arch=arch, weight_type="F32", experts=n, experts_used=k)
    for name in [t for t in model.tensors if t.endswith("ffn_gate_inp.weight")]:
        model.tensors[name] = make_tensor(name, np.zeros((n, model.config.dim)), "F32")
    toks = np.random.default_rng(2).integers(0, model.config.vocab_size, 20)
    logits, hidden = run_engine(model, toks)
    ref = FirstExperts(model.config, model.tensors, 1 / k if model.config.expert_norm_topk else 1 / n)
    out = ref.forward(toks, kv_dtype=np.float16)
    assert row_errors(hidden, out.hidden).max() <= FLOAT_TOL
    assert row_errors(logits, out.logits).max() <= FLOAT_TOL


def test_moe_speculative_equals_plain(load_variant):
    """Drafted tokens verified in one step give the tokens plain decoding gives: a token's experts and output do not
    depend on the tokens beside it in the step."""
    model = load_variant("qwen3moe-gguf-q8_0")
    engine = Engine(model, num_kv_blocks=4, max_batch_tokens=128, max_seqs=1, threads=2)
    prompt = (np.random.default_rng(5).integers(3, model.config.vocab_size, 12).tolist()) * 3
    params = SamplingParams(temperature=0.0)
    plain = [t for out in generate(engine, Request("plain", prompt, params, 40)) for t in out.token_ids]
    stats = GenerationStats()
    spec = [t for out in generate(engine, Request("spec", prompt, params, 40), stats=stats, speculative=True)
            for t in out.token_ids]
    assert spec == plain and len(plain) == 40
    assert stats.drafted_tokens > 0, "no draft was made: the test would compare plain decoding with itself"


def test_a_token_reads_its_share_of_the_experts(load_variant):
    """weight_bytes (what one token's step reads, for the bandwidth figures) counts n_used of the n experts;
    memory_bytes every one of them."""
    model = load_variant("mixtral-gguf-q8_0")
    cfg = model.config
    engine = Engine(model, num_kv_blocks=2, max_batch_tokens=16, max_seqs=1)
    expert_bytes = sum(model.tensors[f"blk.{i}.ffn_{r}_exps.weight"].nbytes
                       for i in range(cfg.n_layers) for r in ("gate", "up", "down"))
    unread = engine._model.memory_bytes - engine._model.weight_bytes - model.tensors["token_embd.weight"].nbytes
    assert unread == pytest.approx(expert_bytes * (cfg.n_experts - cfg.n_experts_used) / cfg.n_experts, rel=0.01)
