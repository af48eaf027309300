"""kv_cache_dtype = "bf16": K and V kept in bf16 (the f16 cache's size), attention in bf16 products with float sums
(ext/cpu/attention_bf16.c). Read like every setting, refused on CUDA, the pool the same size as f16's; each token's K
and V land in their block, rounded to bf16; a prompt's logits are the same bits whether it is prefilled at once or
decoded token by token; prefix caching and preemption run unchanged; and on the real SmolLM2 file its perplexity is
within 0.5% of the f16 cache's."""
from __future__ import annotations

import logging

import numpy as np
import pytest

from inferd import _cpu
from inferd.config import Settings, load_settings
from inferd.engine.batch import EngineShape, kv_bytes_per_token
from inferd.engine.device import DeviceError, build_engine
from inferd.engine.engine import Engine
from inferd.engine.runner import blocks_needed, perplexity
from inferd.engine.types import SeqInput
from tests.engine.test_kv_cache_q8 import check_prefix_cache_and_preemption, parse
from tests.engine.test_kv_cache_q8_real import TEXT
from tests.reference import random_model


def test_setting_and_pool():
    assert load_settings(parse(["--kv-cache-dtype", "bf16"]), {}).kv_cache_dtype == "bf16"
    assert load_settings(parse([]), {"INFERD_KV_CACHE_DTYPE": "bf16"}).kv_cache_dtype == "bf16"
    cfg = random_model().config
    assert kv_bytes_per_token(cfg, "bf16") == kv_bytes_per_token(cfg, "f16")
    assert EngineShape.kv_blocks_for_bytes(cfg, 64 << 20, "bf16") == EngineShape.kv_blocks_for_bytes(cfg, 64 << 20)
    engine = build_engine(random_model(weight_type="Q8_0"), Settings(kv_cache_mib=4, kv_cache_dtype="bf16", threads=1))
    assert engine.kv_cache_dtype == "bf16" and engine.num_kv_blocks == 128
    assert engine.kv_layout()["kv_cache_dtype"] == "bf16"      # a prompt cache file of f16 blocks does not match
    with pytest.raises(DeviceError, match="kv_cache_dtype bf16 runs on the CPU engine only"):
        build_engine(random_model(), Settings(device="cuda", kv_cache_dtype="bf16"))


def test_a_cpu_without_avx512_bf16_is_told_f16_is_better(caplog):
    """Without VDPBF16PS the bf16 cache's attention runs as float fmas on bf16 values: slower than over f16, and less
    precise. The engine says so when it is built that way, and only then."""
    model = random_model()
    old = _cpu.get_path()
    try:
        _cpu.set_path("scalar")
        assert not _cpu.bf16_attention_native()
        with caplog.at_level(logging.WARNING, logger="inferd.engine"):
            Engine(model, num_kv_blocks=2, threads=1, kv_cache_dtype="bf16")
        assert "has no AVX-512 BF16" in caplog.text and "f16 is the better choice" in caplog.text
    finally:
        _cpu.set_path(old)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="inferd.engine"):
        Engine(model, num_kv_blocks=2, threads=1)
        if _cpu.bf16_attention_native():
            Engine(model, num_kv_blocks=2, threads=1, kv_cache_dtype="bf16")
    assert "AVX-512 BF16" not in caplog.text


def test_each_token_k_and_v_land_in_their_bf16_block():
    """Prefill 70 tokens into blocks [3, 0]: in the first layer every position holds the f16 engine's K and V to
    within bf16's rounding (the same float32 values rounded to 8 significant bits instead of 11)."""
    model = random_model(weight_type="Q8_0", n_heads=4, n_kv_heads=2, head_dim=64)
    prompt = np.random.default_rng(1).integers(0, model.config.vocab_size, 70).tolist()
    blocks = {}
    for kv in ("f16", "bf16"):
        eng = Engine(model, num_kv_blocks=4, max_batch_tokens=128, max_seqs=1, threads=1, kv_cache_dtype=kv)
        eng.step([SeqInput(prompt, 0, [3, 0])])
        blocks[kv] = [eng._ctx.kv_block(0, b) for b in (3, 0)]
    for i, n in ((0, 64), (1, 6)):
        for which in (0, 1):
            want = blocks["f16"][i][which][:, :n].astype(np.float32)
            got = blocks["bf16"][i][which][:, :n]
            assert np.all(np.abs(got - want) <= np.abs(want) * 2.0 ** -8 + 1e-30), (i, which)
            assert not np.array_equal(got, want)
            assert np.all(got.view(np.uint32) & 0xFFFF == 0)                  # bf16 values
            assert not np.any(blocks["bf16"][i][which][:, n:])                # the slots past them untouched


def test_prefill_and_token_by_token_decode_give_the_same_bits():
    """The promise speculative decoding and batching rest on, over the bf16 cache: a prompt's logits are the same
    whether its tokens come in one prefill, in chunks, or one decode step each (GQA, 130 positions: three blocks)."""
    model = random_model(weight_type="Q4_0", n_heads=4, n_kv_heads=2, head_dim=64, context_length=512)
    prompt = np.random.default_rng(2).integers(0, model.config.vocab_size, 130).tolist()

    def engine():
        return Engine(model, num_kv_blocks=4, max_batch_tokens=160, max_seqs=1, max_logits_rows=160, threads=2,
                      kv_cache_dtype="bf16")

    whole = engine().step([SeqInput(prompt, 0, [2, 0, 3], num_sampled=0, want_logits=True)])[0].logits
    eng = engine()
    chunks = [eng.step([SeqInput(prompt[a:b], a, [2, 0, 3], num_sampled=0, want_logits=True)])[0].logits
              for a, b in ((0, 50), (50, 64), (64, 130))]
    np.testing.assert_array_equal(np.concatenate(chunks).view(np.uint32), whole.view(np.uint32))
    eng = engine()
    steps = [eng.step([SeqInput([tok], pos, [2, 0, 3], num_sampled=0, want_logits=True)])[0].logits[0]
             for pos, tok in enumerate(prompt)]
    np.testing.assert_array_equal(np.stack(steps).view(np.uint32), whole.view(np.uint32))
    f16 = Engine(model, num_kv_blocks=4, max_batch_tokens=160, max_seqs=1, max_logits_rows=160, threads=2)
    f16_logits = f16.step([SeqInput(prompt, 0, [2, 0, 3], num_sampled=0, want_logits=True)])[0].logits
    assert 0 < np.abs(f16_logits - whole).max() < 0.05 * np.abs(f16_logits).max()


def test_prefix_cache_hits_and_preemption_on_bf16_blocks():
    """Shared prefixes hit the bf16 cache and give the same greedy tokens as without it; a pool too small for all
    requests preempts and recomputes, again with the same tokens as when each runs alone."""
    check_prefix_cache_and_preemption("bf16")


def test_bf16_perplexity_within_half_a_percent_of_f16(smollm2_model):
    """The real SmolLM2 file over bench/data/gpl-3.txt, two chunks of 1024 tokens."""
    tokens = smollm2_model.tokenizer.encode(TEXT.read_text(encoding="utf-8"), add_special=False)[:2048]
    bos = smollm2_model.tokenizer.bos_id if smollm2_model.tokenizer.add_bos else None
    ppl = {}
    for kv in ("f16", "bf16"):
        engine = Engine(smollm2_model, num_kv_blocks=blocks_needed(1024), max_batch_tokens=512, max_seqs=1,
                        max_logits_rows=512, kv_cache_dtype=kv)
        ppl[kv] = perplexity(engine, tokens, 1024, bos).ppl
    assert ppl["f16"] != ppl["bf16"]
    assert abs(ppl["bf16"] - ppl["f16"]) / ppl["f16"] < 0.005, ppl
