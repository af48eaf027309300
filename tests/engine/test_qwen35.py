"""Qwen3.5's hybrid (ext/cpu/block_gdn.c's Gated DeltaNet layers beside gated attention with partial RoPE) on tiny
GGUF files read by the real loader, against tests/reference.py layer by layer; and the recurrent state's contracts:
a prompt chunked any way, or decoded token by token, gives the same bits; sequences batched together each keep
their own state; a sequence continues only its own slot's state. Agreement with llama.cpp is in
tests/engine/test_llamacpp_qwen35.py.

Tolerances are the dense files' (tests/engine/test_forward_reference.py): F32 files 1e-3 (the reference's K and V
rounded to f16 as the cache is); Q8_0 files 5e-2 with the reference's matmul inputs rounded to 8 bits as the
engine's are (act_quant)."""
from __future__ import annotations

import numpy as np
import pytest

from inferd.engine.engine import Engine
from inferd.engine.request import Request
from inferd.engine.runner import generate
from inferd.engine.scheduler import Scheduler
from inferd.engine.types import SamplingParams, SeqInput
from tests.engine.test_forward_reference import FLOAT_TOL, QUANT_TOL, row_errors
from tests.reference import Reference

SEQ_LEN = 70                      # crosses the 64-position KV block boundary
# Router margins the MoE prompts keep. Wider than test_moe.py's 1e-3: in a quantized file one activation at a rounding
# midpoint may round the other way in float32 and move the later tokens a little, and the recurrent state carries
# that to every later token of the sequence, where a router within 1e-3 of a tie may then flip (measured: 1.7e-3
# flipped one on a Q8_0 Qwen3-Next file, 0.13 apart; prompts clear by 3e-3 stay within 1e-2)
ROUTE_MARGIN = 3e-3



def engine(model, max_seqs=4, threads=2, num_kv_blocks=8):
    return Engine(model, num_kv_blocks=num_kv_blocks, max_batch_tokens=128, max_seqs=max_seqs, threads=threads,
                  max_logits_rows=128)


def tokens(model, n=SEQ_LEN, seed=1):
    return np.random.default_rng(seed).integers(3, model.config.vocab_size, n).tolist()


def test_config_reads_the_hybrid(load_variant):
    cfg = load_variant("qwen35-gguf-f32").config
    assert cfg.recurrent_layers == (0, 2) and cfg.attn_output_gate and cfg.rope_dims == 32
    assert (cfg.ssm_k_heads, cfg.ssm_v_heads, cfg.ssm_head_k, cfg.ssm_head_v, cfg.ssm_conv_kernel) == (2, 4, 32, 32, 4)
    # per recurrent layer: 3 last inputs of 256 channels, 4 value heads of 32 x 32
    assert cfg.state_floats == 2 * (3 * 256 + 4 * 32 * 32)


@pytest.mark.parametrize("type_name", ["f32", "q8_0"])
def test_qwen35_file_matches_reference(load_variant, type_name):
    model = load_variant(f"qwen35-gguf-{type_name}")
    toks = tokens(model)
    quantized = type_name != "f32"
    ref = Reference(model.config, model.tensors).forward(toks, kv_dtype=np.float16, act_quant=quantized)
    eng = engine(model)
    outs, hidden = eng.step([SeqInput(toks, 0, [3, 1], want_logits=True, state_slot=2)], want_hidden=True)
    errors = np.concatenate([row_errors(hidden, ref.hidden), row_errors(outs[0].logits, ref.logits)[None]])
    worst = errors.max(axis=1)
    tol = QUANT_TOL if quantized else FLOAT_TOL
    assert worst.max() <= tol, f"qwen35 {type_name}: worst row error per layer, then logits: {worst}"


def test_other_convolution_kernel(load_variant):
    """A convolution kernel other than 4 (the width block_gdn.c's convolution is unrolled for) takes the general
    loop: the reference's values, and the same bits one token per step as in one step."""
    model = load_variant("qwen35-conv3-gguf-f32")
    assert model.config.ssm_conv_kernel == 3
    toks = tokens(model)
    ref = Reference(model.config, model.tensors).forward(toks, kv_dtype=np.float16)
    whole = run_chunks(engine(model), toks, [SEQ_LEN])
    assert row_errors(whole, ref.logits).max() <= FLOAT_TOL
    assert np.array_equal(whole, run_chunks(engine(model), toks, [3, 1, 40, 26]))


MOE_CASES = [("qwen35moe", "f32"), ("qwen35moe", "q8_0"), ("qwen3next", "f32"), ("qwen3next", "q8_0"),
             ("qwen3next-ssm_in", "f32")]


@pytest.mark.parametrize("name,type_name", MOE_CASES)
def test_hybrid_moe_file_matches_reference(load_variant, name, type_name):
    """Qwen3.5-MoE and Qwen3-Next: the same hybrid with a mixture of experts and a gated shared expert as its FFN
    (Qwen3-Next: its value heads grouped per key head, beta|alpha fused, and in older files q|k|v|z fused), on a
    prompt whose routing the reference finds clear of ties (a near tie is a coin toss for float32: test_moe.py)."""
    model = load_variant(f"{name}-gguf-{type_name}")
    cfg = model.config
    assert cfg.is_moe and cfg.expert_norm_topk and cfg.shared_expert_hidden_dim == 96 and cfg.recurrent_layers
    assert cfg.ssm_grouped_heads == name.startswith("qwen3next") and cfg.ssm_fused_in == name.endswith("ssm_in")
    quantized = type_name != "f32"
    for seed in range(1, 40):
        toks = tokens(model, SEQ_LEN, seed)
        ref_model = Reference(cfg, model.tensors)
        ref = ref_model.forward(toks, kv_dtype=np.float16, act_quant=quantized)
        if np.min(ref_model.route_margins) > ROUTE_MARGIN:
            break
    else:
        raise AssertionError("no prompt of the seeds tried routes clear of ties")
    eng = engine(model)
    outs, hidden = eng.step([SeqInput(toks, 0, [3, 1], want_logits=True, state_slot=0)], want_hidden=True)
    errors = np.concatenate([row_errors(hidden, ref.hidden), row_errors(outs[0].logits, ref.logits)[None]])
    worst = errors.max(axis=1)
    tol = QUANT_TOL if quantized else FLOAT_TOL
    assert worst.max() <= tol, f"{name} {type_name}: worst row error per layer, then logits: {worst}"


def run_chunks(eng, toks, sizes, slot=0, table=(0, 1)):
    """The logits of every token of toks, run as consecutive chunks of `sizes`."""
    rows, start = [], 0
    for n in sizes:
        chunk = toks[start:start + n]
        out = eng.step([SeqInput(chunk, start, list(table), 0, want_logits=True, state_slot=slot)])[0]
        rows.append(out.logits)
        start += n
    assert start == len(toks)
    return np.concatenate(rows)


@pytest.mark.parametrize("threads", [1, 2])
def test_chunked_prefill_equals_token_by_token(load_variant, threads):
    """A token's output does not depend on how its prompt was cut: one chunk, uneven chunks and one token per step
    give the same bits (each token is one update of the state, in order, whatever the step holds)."""
    model = load_variant("qwen35-gguf-q8_0")
    eng = engine(model, threads=threads)
    toks = tokens(model)
    whole = run_chunks(eng, toks, [SEQ_LEN])
    uneven = run_chunks(eng, toks, [5, 17, 1, 33, 14])
    single = run_chunks(eng, toks, [1] * SEQ_LEN)
    assert np.array_equal(whole, uneven) and np.array_equal(whole, single)


def test_identical_on_every_path(load_variant):
    """The scalar and SIMD paths give the same bits (block_gdn.c's delta rule is written for both)."""
    from inferd import _cpu
    from tests.ext.paths import PATHS

    model = load_variant("qwen35-gguf-q8_0")
    toks = tokens(model)
    runs, old = {}, _cpu.get_path()
    try:
        for p in PATHS:
            _cpu.set_path(p)
            runs[p] = run_chunks(engine(model), toks, [5, 30, 35])
    finally:
        _cpu.set_path(old)
    for p in PATHS[1:]:
        assert np.array_equal(runs[p].view(np.uint32), runs[PATHS[0]].view(np.uint32)), f"{p} vs {PATHS[0]}"


def test_batched_sequences_keep_their_own_states(load_variant):
    """Three sequences in one step (a prefill beside two decodes), each in its own slot, give the bits each gives
    alone."""
    model = load_variant("qwen35-gguf-q8_0")
    eng = engine(model)
    a, b, c = tokens(model, 40, 1), tokens(model, 30, 2), tokens(model, 20, 3)
    alone = [run_chunks(eng, t, [len(t) - 1, 1], slot=0)[-1] for t in (a, b, c)]
    eng.step([SeqInput(a[:-1], 0, [0], 0, state_slot=1), SeqInput(b[:-1], 0, [1], 0, state_slot=3)])
    outs = eng.step([SeqInput(a[-1:], len(a) - 1, [0], 1, want_logits=True, state_slot=1),
                     SeqInput(b[-1:], len(b) - 1, [1], 1, want_logits=True, state_slot=3),
                     SeqInput(c, 0, [2], 1, want_logits=True, state_slot=0)])
    for out, want in zip(outs, alone):
        assert np.array_equal(out.logits[-1], want)


def test_a_sequence_must_continue_its_slot(load_variant):
    model = load_variant("qwen35-gguf-q8_0")
    eng = engine(model)
    toks = tokens(model, 10)
    eng.step([SeqInput(toks[:6], 0, [0], 0, state_slot=1)])
    with pytest.raises(ValueError, match="recurrent-state slot"):
        eng.step([SeqInput(toks[6:], 7, [0], 1, state_slot=1)])          # a gap: position 6 was never run
    with pytest.raises(ValueError, match="recurrent-state slot"):
        eng.step([SeqInput(toks[6:], 6, [0], 1, state_slot=0)])          # another slot: not this sequence's state
    with pytest.raises(ValueError, match="recurrent-state slot"):
        eng.step([SeqInput(toks[6:], 6, [0], 1)])                        # no slot at all
    eng.step([SeqInput(toks[6:], 6, [0], 1, state_slot=1)])              # its own slot, where it left off


def test_state_read_and_restored_continues_the_same(load_variant):
    """A slot's state copied out and written back (into another slot) continues exactly as the original."""
    model = load_variant("qwen35-gguf-q8_0")
    eng = engine(model)
    toks = tokens(model, 20)
    want = run_chunks(eng, toks, [12, 8], slot=0)[12:]
    run_chunks(eng, toks[:12], [12], slot=1)
    state, pos = eng._ctx.read_state(1)
    assert pos == 12 and state.size == model.config.state_floats and np.abs(state).max() > 0
    eng._ctx.write_state(3, state, pos)
    got = eng.step([SeqInput(toks[12:], 12, [0], 0, want_logits=True, state_slot=3)])[0].logits
    assert np.array_equal(got, want)


def test_scheduler_runs_hybrid_requests(load_variant):
    """Through the scheduler: greedy generation beside other requests equals generation alone, two prompts in one
    step and a prompt beside decodes in one step; speculative decoding is off for the hybrid; each running sequence
    holds a state slot, freed when it ends."""
    model = load_variant("qwen35-gguf-q8_0")
    eng = engine(model, max_seqs=3, num_kv_blocks=12)
    greedy = SamplingParams(temperature=0.0)
    prompts = [tokens(model, n, seed) for n, seed in ((30, 1), (45, 2), (9, 3))]
    alone = [[t for out in generate(eng, Request(f"a{i}", p, greedy, 12)) for t in out.token_ids]
             for i, p in enumerate(prompts)]
    sched = Scheduler(eng, max_model_len=512, enable_prefix_caching=True, speculative=True)
    assert sched.snapshot_states and not sched.allow_drafts
    from inferd.engine.request import RequestState
    for i, p in enumerate(prompts[:2]):
        sched.add(RequestState(Request(f"b{i}", p, greedy, 12), 0.0))
    got: dict[str, list[int]] = {f"b{i}": [] for i in range(3)}
    max_used, steps = 0, []
    while sched.has_work:
        batch = sched.schedule()
        max_used = max(max_used, sched.kv.stats().num_state_slots_used)
        steps.append(sorted(len(s.token_ids) for s in batch.inputs))
        sched.postprocess(batch, eng.step(batch.inputs))
        for st, out in sched.take_outputs():
            got[st.request.request_id] += out.token_ids
        if len(steps) == 2:  # the third arrives while the first two decode
            sched.add(RequestState(Request("b2", prompts[2], greedy, 12), 0.0))
    assert [got[f"b{i}"] for i in range(3)] == alone
    assert max_used == 3 and sched.kv.stats().num_state_slots_used == 0
    # one forward call per step: the first two prompts together, then the third's beside the others' decodes
    assert steps[0] == [30, 45] and steps[2] == [1, 1, 9]


def test_preempted_sequence_recomputes_its_state(load_variant):
    """With room for one sequence's KV at a time, the later request is preempted and recomputed from position 0: its
    state starts over, and its tokens equal a run alone."""
    model = load_variant("qwen35-gguf-q8_0")
    eng = engine(model, max_seqs=2, num_kv_blocks=3)
    greedy = SamplingParams(temperature=0.0)
    prompts = [tokens(model, 60, 4), tokens(model, 60, 5)]
    alone = [[t for out in generate(eng, Request(f"a{i}", p, greedy, 40)) for t in out.token_ids]
             for i, p in enumerate(prompts)]
    from inferd.engine.request import RequestState
    sched = Scheduler(eng, max_model_len=192)
    for i, p in enumerate(prompts):
        sched.add(RequestState(Request(f"b{i}", p, greedy, 40), 0.0))
    got: dict[str, list[int]] = {"b0": [], "b1": []}
    preemptions = 0
    while sched.has_work:
        before = {st.request.request_id for st in sched.running}
        batch = sched.schedule()
        preemptions += len(before - {st.request.request_id for st in sched.running})
        sched.postprocess(batch, eng.step(batch.inputs))
        for st, out in sched.take_outputs():
            got[st.request.request_id] += out.token_ids
    assert preemptions > 0, "nothing was preempted: the test would not test recomputation"
    assert [got["b0"], got["b1"]] == alone


def run_scheduler(sched, eng, requests):
    """Each request's (tokens, logprobs) through the scheduler, all added at once."""
    from inferd.engine.request import RequestState
    for r in requests:
        sched.add(RequestState(r, 0.0))
    got = {r.request_id: ([], []) for r in requests}
    while sched.has_work:
        batch = sched.schedule()
        sched.postprocess(batch, eng.step(batch.inputs))
        for st, out in sched.take_outputs():
            got[st.request.request_id][0].extend(out.token_ids)
            got[st.request.request_id][1].extend(out.logprobs or [])
    return [got[r.request_id] for r in requests]


def test_prefix_cache_hit_restores_the_state(load_variant):
    """A request sharing 150 prompt tokens with an earlier one starts from the cached blocks and the state snapshot
    at the last block boundary of the shared part (128), and gives the bits of a cold run: the same tokens and
    log-probabilities. A prefill chunk that crosses a block boundary stops at its last one, where the state is
    snapshot."""
    model = load_variant("qwen35-gguf-q8_0")
    greedy = SamplingParams(temperature=0.0, logprobs=0)
    shared = tokens(model, 150, 7)
    first = shared + tokens(model, 10, 8)
    second = shared + tokens(model, 25, 9)
    eng = engine(model, max_seqs=2, num_kv_blocks=12)
    cold = run_scheduler(Scheduler(eng, max_model_len=512, enable_prefix_caching=False), eng,
                         [Request("cold", second, greedy, 10)])[0]
    sched = Scheduler(eng, max_model_len=512)
    run_scheduler(sched, eng, [Request("first", first, greedy, 4)])
    # one snapshot, at 128: the engine's 128-token steps end there (then 32 more prompt tokens, 4 decoded)
    assert sched.kv.stats().num_state_snapshots == 1
    hits = sched.kv.prefix_hits
    warm = run_scheduler(sched, eng, [Request("second", second, greedy, 10)])[0]
    assert sched.kv.prefix_hits - hits == 128
    assert warm == cold and len(cold[0]) == 10


def test_snapshots_are_bounded_and_go_with_their_blocks(load_variant):
    """At most one snapshot per state slot is kept (the oldest dropped first); a hit needs a snapshot, so a prefix
    whose snapshots were dropped is recomputed, and still gives a cold run's bits."""
    model = load_variant("qwen35-gguf-q8_0")
    greedy = SamplingParams(temperature=0.0, logprobs=0)
    eng = engine(model, max_seqs=2, num_kv_blocks=12)
    sched = Scheduler(eng, max_model_len=512)
    prompts = [tokens(model, 140, seed) for seed in (11, 12, 13)]
    for i, p in enumerate(prompts):
        run_scheduler(sched, eng, [Request(f"p{i}", p, greedy, 2)])
        assert sched.kv.stats().num_state_snapshots <= 2
    hits = sched.kv.prefix_hits
    again = run_scheduler(sched, eng, [Request("again", prompts[0], greedy, 6)])[0]   # its snapshots are gone
    assert sched.kv.prefix_hits == hits
    cold = run_scheduler(Scheduler(eng, max_model_len=512, enable_prefix_caching=False), eng,
                         [Request("cold", prompts[0], greedy, 6)])[0]
    assert again == cold


def test_embeddings_from_a_hybrid_are_refused_at_start(load_variant):
    from inferd.engine.chat_embedder import ChatEmbedder

    model = load_variant("qwen35-gguf-q8_0")
    with pytest.raises(ValueError, match="recurrent layers"):
        ChatEmbedder(engine(model), model.tokenizer, "last", name="hybrid", threads=1)


def test_multi_token_prediction_layers_are_skipped(load_variant):
    """A file with Qwen3.5's multi-token prediction layer after the trunk loads as the trunk alone: the same logits
    as the file without it (the layer is not run)."""
    with_mtp, plain = load_variant("qwen35-mtp-gguf-q8_0"), load_variant("qwen35-gguf-q8_0")
    assert with_mtp.config.n_layers == plain.config.n_layers == 4
    assert not any(name.startswith("blk.4.") for name in with_mtp.tensors)
    toks = tokens(plain, 20)
    got = [engine(m).step([SeqInput(toks, 0, [0], want_logits=True, state_slot=0)])[0].logits
           for m in (with_mtp, plain)]
    assert np.array_equal(got[0], got[1])


def test_int8_kv_cache_on_the_attention_layers(load_variant):
    """kv_cache_dtype q8_0: the attention layers' slices of the int8 cache (only they have one) keep the chunking
    contract, and the logits stay near the f16 cache's."""
    model = load_variant("qwen35-gguf-q8_0")
    toks = tokens(model)
    q8 = Engine(model, num_kv_blocks=8, max_batch_tokens=128, max_seqs=2, threads=2, max_logits_rows=128,
                kv_cache_dtype="q8_0")
    whole, chunked = run_chunks(q8, toks, [SEQ_LEN]), run_chunks(q8, toks, [9, 50, 11])
    assert np.array_equal(whole, chunked)
    f16 = run_chunks(engine(model), toks, [SEQ_LEN])
    assert row_errors(whole, f16).max() < QUANT_TOL and not np.array_equal(whole, f16)


def test_perplexity_runs_on_a_hybrid(load_variant):
    """`inferd perplexity`'s loop (each chunk from position 0 in slot 0) scores a hybrid as one step over the whole
    chunk does."""
    from inferd.engine.runner import perplexity

    model = load_variant("qwen35-gguf-q8_0")
    eng = engine(model)
    toks = tokens(model, 256, 3)
    got = perplexity(eng, toks, 128)
    nll = []
    for c in range(2):
        chunk = toks[c * 128:(c + 1) * 128]
        logits = eng.step([SeqInput(chunk, 0, [0, 1], 0, want_logits=True, state_slot=1)])[0].logits.astype(np.float64)
        peak = logits.max(1, keepdims=True)
        logp = logits - (peak + np.log(np.exp(logits - peak).sum(1, keepdims=True)))
        nll += [-logp[i, chunk[i + 1]] for i in range(64, 127)]
    assert got.scored_tokens == len(nll) and abs(got.ppl - np.exp(np.mean(nll))) < 1e-6 * got.ppl


def test_quantized_at_load(tmp_path):
    """--quantize q8_0 on an F32 file: the matrices become Q8_0, the convolution's taps (4 to a row) stay F32, and
    the result follows the reference as a Q8_0 file does."""
    from inferd.model.loader import load_model
    from tests.model.make_tiny import make_variant

    model = load_model(make_variant("qwen35-gguf-f32", tmp_path), quantize="q8_0")
    assert model.tensors["blk.0.attn_qkv.weight"].type == "Q8_0"
    assert model.tensors["blk.0.ssm_conv1d.weight"].type == "F32"
    toks = tokens(model)
    ref = Reference(model.config, model.tensors).forward(toks, kv_dtype=np.float16, act_quant=True)
    logits = engine(model).step([SeqInput(toks, 0, [0, 1], want_logits=True, state_slot=0)])[0].logits
    assert row_errors(logits, ref.logits).max() <= QUANT_TOL
