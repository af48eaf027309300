"""The kv_cache_dtype setting (f16 | q8_0): read like every setting, passed to the CPU engine, refused on CUDA, and
the pool it buys: q8_0 blocks take 34 bytes per 32 values instead of 64, so the same kv_cache_mib holds 32/17
(1.88x) the blocks. The engine writes each token's K and V into its q8_0 block at the right place (read back next
to an f16 engine's), and everything that works by block id (prefix caching, preemption) runs unchanged."""
from __future__ import annotations

import argparse

import numpy as np
import pytest

from inferd.config import ConfigError, Settings, add_arguments, load_settings
from inferd.engine.batch import EngineShape, kv_bytes_per_token
from inferd.engine.device import DeviceError, build_engine
from inferd.engine.engine import Engine
from inferd.engine.request import Request, RequestState
from inferd.engine.scheduler import Scheduler
from inferd.engine.loop import run_batch
from inferd.engine.types import SamplingParams, SeqInput
from tests.reference import random_model

GREEDY_TOP5 = SamplingParams(temperature=0.0, logprobs=5)


def parse(argv):
    p = argparse.ArgumentParser()
    add_arguments(p)
    return p.parse_args(argv)


def test_setting_from_file_env_and_flag(tmp_path):
    assert Settings().kv_cache_dtype == "f16"
    assert load_settings(parse([]), {"INFERD_KV_CACHE_DTYPE": "q8_0"}).kv_cache_dtype == "q8_0"
    assert load_settings(parse(["--kv-cache-dtype", "q8_0"]), {}).kv_cache_dtype == "q8_0"
    cfg = tmp_path / "inferd.toml"
    cfg.write_text('kv_cache_dtype = "q8_0"\n')
    assert load_settings(parse(["--config", str(cfg)]), {}).kv_cache_dtype == "q8_0"
    with pytest.raises(ConfigError, match="kv_cache_dtype must be one of f16, bf16, q8_0; got 'int8'"):
        load_settings(parse(["--kv-cache-dtype", "int8"]), {})


def test_q8_0_holds_32_17ths_the_blocks_in_the_same_memory():
    cfg = random_model().config                       # 2 layers, 1 KV head of 64
    assert kv_bytes_per_token(cfg) == 2 * 2 * 2 * 64
    assert kv_bytes_per_token(cfg, "q8_0") == 2 * 2 * 64 * 34 // 32
    mib = 64 << 20
    f16, q8 = EngineShape.kv_blocks_for_bytes(cfg, mib), EngineShape.kv_blocks_for_bytes(cfg, mib, "q8_0")
    assert f16 == mib // (512 * 64) and q8 == mib // (272 * 64)
    assert 1.87 < q8 / f16 < 1.89
    with pytest.raises(ValueError, match="kv_cache_dtype must be one of f16, bf16, q8_0"):
        kv_bytes_per_token(cfg, "q4_0")


def test_build_engine_sizes_the_pool_by_the_dtype():
    model = random_model(weight_type="Q8_0")
    engines = {kv: build_engine(model, Settings(kv_cache_mib=4, kv_cache_dtype=kv, threads=1), max_seqs=2)
               for kv in ("f16", "q8_0")}
    f16, q8 = engines["f16"], engines["q8_0"]
    assert (f16.kv_cache_dtype, q8.kv_cache_dtype) == ("f16", "q8_0")
    assert f16.num_kv_blocks == (4 << 20) // (512 * 64) == 128
    assert q8.num_kv_blocks == (4 << 20) // (272 * 64) == 240
    assert q8.kv_bytes_per_token * 2 < f16.kv_bytes_per_token * 1.07    # the bandwidth metric's bytes, too


def test_engine_rejects_what_it_cannot_hold():
    with pytest.raises(ValueError, match="kv_cache_dtype must be one of f16, bf16, q8_0, got 'q4_0'"):
        Engine(random_model(), num_kv_blocks=2, threads=1, kv_cache_dtype="q4_0")
    with pytest.raises(DeviceError, match="kv_cache_dtype q8_0 runs on the CPU engine only"):
        build_engine(random_model(), Settings(device="cuda", kv_cache_dtype="q8_0"))


def test_each_token_k_and_v_land_in_their_q8_0_block():
    """Prefill 70 tokens into blocks [3, 0]: every position of both blocks holds the f16 engine's K and V, in the
    first layer to within the 8-bit step of its 32 values (the f16 cache's own rounding aside), in later ones
    (whose input went through q8_0 attention) to within a few percent."""
    model = random_model(weight_type="Q8_0", n_heads=4, n_kv_heads=2, head_dim=64)
    prompt = np.random.default_rng(1).integers(0, model.config.vocab_size, 70).tolist()
    blocks = {}
    for kv in ("f16", "q8_0"):
        eng = Engine(model, num_kv_blocks=4, max_batch_tokens=128, max_seqs=1, threads=1, kv_cache_dtype=kv)
        eng.step([SeqInput(prompt, 0, [3, 0])])
        blocks[kv] = [[eng._ctx.kv_block(layer, b) for b in (3, 0)] for layer in range(model.config.n_layers)]
    for layer in range(model.config.n_layers):
        for i, n in ((0, 64), (1, 6)):
            for which in (0, 1):
                want = blocks["f16"][layer][i][which][:, :n].astype(np.float32)
                got = blocks["q8_0"][layer][i][which][:, :n]
                step = np.abs(want).reshape(*want.shape[:2], -1, 32).max(axis=3, keepdims=True) / 127
                err = np.abs(got - want).reshape(step.shape[:3] + (32,))
                if layer == 0:
                    assert np.all(err <= step * 0.51 + 2e-3 * np.abs(want).max()), (layer, i, which)
                else:
                    assert err.max() <= 0.05 * np.abs(want).max(), (layer, i, which)
                assert not np.array_equal(got, want)


def run_requests(engine, prompts, max_tokens, *, prefix_caching=True, max_running=8):
    """Greedy requests through the server's scheduler, driven here; returns the scheduler and, per request, its
    tokens, top-5 logprobs (a random model's greedy tokens repeat one id whatever the context; the runners-up's
    logprobs show every bit of it) and cached_tokens."""
    scheduler = Scheduler(engine, max_model_len=engine.context_length, max_running=max_running,
                          enable_prefix_caching=prefix_caching)
    for i, p in enumerate(prompts):
        req = Request(f"r{i}", p, GREEDY_TOP5, max_tokens, detokenize=False)
        scheduler.add(RequestState(req, arrival_time=float(i)))
    ids = [f"r{i}" for i in range(len(prompts))]
    tokens: dict[str, list] = {rid: [] for rid in ids}
    top: dict[str, list] = {rid: [] for rid in ids}
    cached: dict[str, int | None] = dict.fromkeys(ids)
    while scheduler.has_work:
        batch = scheduler.schedule()
        scheduler.postprocess(batch, run_batch(engine, batch))
        for st, out in scheduler.take_outputs():
            rid = st.request.request_id
            tokens[rid] += out.token_ids
            top[rid] += out.top_logprobs or []
            if out.usage:
                cached[rid] = out.usage.cached_tokens
    return [(tokens[rid], top[rid], cached[rid]) for rid in ids], scheduler


def test_prefix_cache_hits_and_preemption_on_q8_0_blocks():
    """Shared prefixes hit the q8_0 cache and give the same greedy tokens as without it; a pool too small for all
    requests preempts and recomputes, again with the same tokens as when each runs alone."""
    check_prefix_cache_and_preemption("q8_0")


def check_prefix_cache_and_preemption(kv_cache_dtype: str) -> None:
    """Four requests sharing a 140-token prefix, greedy, over a kv_cache_dtype pool: alone, together with prefix
    caching (at least two shared blocks hit), and in a pool too small for all (preempted and recomputed): the same
    tokens each time."""
    model = random_model(weight_type="Q4_0", context_length=512)
    rng = np.random.default_rng(5)
    shared = rng.integers(0, model.config.vocab_size, 140).tolist()
    prompts = [shared + rng.integers(0, model.config.vocab_size, 9).tolist() for _ in range(4)]

    def engine(blocks):
        return Engine(model, num_kv_blocks=blocks, max_batch_tokens=96, max_seqs=8, threads=1,
                      kv_cache_dtype=kv_cache_dtype)

    def outputs(results):  # tokens and top logprobs, not cached_tokens
        return [(tokens, top) for tokens, top, _ in results]

    alone = [outputs(run_requests(engine(16), [p], 40, prefix_caching=False)[0])[0] for p in prompts]
    cached, sched = run_requests(engine(32), prompts, 40)
    assert outputs(cached) == alone
    assert sched.kv.stats().prefix_hits >= 128          # at least one request reused both shared blocks
    tight, sched = run_requests(engine(8), prompts, 40, prefix_caching=False)   # 4 x 3 blocks wanted
    assert sched.num_preemptions > 0
    assert outputs(tight) == alone
