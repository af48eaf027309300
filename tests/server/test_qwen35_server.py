"""A Qwen3.5 hybrid served: kv_cache_mib pays for every running sequence's recurrent state (and as many snapshots
for prefix caching) before the KV blocks, running fewer sequences than max_running when their states would take
more than half of it,
/metrics shows the state slots and snapshots, the prompt cache on disk is off (its block images would lack the
state), and concurrent greedy requests give what each gives alone."""
from __future__ import annotations

import concurrent.futures

import openai
import pytest

from inferd.model.loader import load_model
from tests.model.make_tiny import make_variant
from tests.server.conftest import ServerThread, make_settings


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory):
    return load_model(make_variant("qwen35-gguf-q8_0", tmp_path_factory.mktemp("qwen35")))


def test_hybrid_server_budget_metrics_and_batching(hybrid):
    cfg = hybrid.config
    # 64 running sequences' states (and as many prefix snapshots) would take more than half of 1 MiB: fewer run
    per_seq = 2 * 4 * cfg.state_floats                   # float32 state and its snapshot
    slots = (1 << 19) // per_seq
    assert slots == 6
    srv = ServerThread(make_settings(num_kv_blocks=0, kv_cache_mib=1, max_running=64), hybrid).start()
    try:
        kv_block = 64 * 2 * 2 * cfg.n_kv_heads * cfg.head_dim * 2   # f16 K and V of the 2 attention layers
        assert srv.metric("inferd:kv_cache_blocks") == ((1 << 20) - slots * per_seq) // kv_block
        assert srv.metric("inferd:recurrent_state_slots") == slots and srv.state.engine.max_seqs == slots
        assert srv.metric("inferd:recurrent_state_slots_used") == 0
        assert srv.state.engine_loop.scheduler.snapshot_states and srv.state.prompt_cache is None

        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)
        model = srv.state.served_model_name
        prompts = [f"the {w} of a river and a tree" for w in ("sound", "water", "light", "story")]

        def complete(p):
            r = client.completions.create(model=model, prompt=p, max_tokens=12, temperature=0,
                                          extra_body={"ignore_eos": True})
            return r.choices[0].text

        alone = [complete(p) for p in prompts]
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            together = list(pool.map(complete, prompts))
        assert together == alone
        srv.wait_idle()
        assert srv.metric("inferd:recurrent_state_slots_used") == 0
        assert srv.metric("inferd:prefix_cache_hits_total") == 0       # prompts shorter than a block
        assert srv.metric("inferd:recurrent_state_snapshots") == 0
    finally:
        srv.stop()
