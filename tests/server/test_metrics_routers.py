"""The `vllm:` names routing layers read by default (Gateway API Inference Extension, llm-d, vLLM's production
stack, KEDA triggers): present with vLLM's labels, and moving with the scheduler's state like the `inferd:` ones."""

import threading
import time

import openai
import pytest

SYSTEM = ("You are a librarian. Recommend one book per question, give its author and year, and explain the pick "
          "in a single sentence without spoilers. ") * 6


def client(srv):
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)


def test_idle_server_exports_the_router_names_with_vllm_labels(make_server):
    srv = make_server()
    m, name = srv.metrics(), srv.state.served_model_name
    for gauge in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc", "gpu_cache_usage_perc"):
        assert m[(f"vllm:{gauge}", (("model_name", name),))] == 0.0
    for counter in ("prefix_cache_hits", "prefix_cache_queries", "gpu_prefix_cache_hits", "gpu_prefix_cache_queries"):
        assert m[(f"vllm:{counter}_total", (("model_name", name),))] == 0.0
    info = {labels: v for (n, labels), v in m.items() if n == "vllm:cache_config_info"}
    assert list(info.values()) == [1.0]
    labels = dict(next(iter(info)))
    assert labels == {"block_size": "64", "cache_dtype": "f16", "enable_prefix_caching": "True",
                      "num_gpu_blocks": "128", "num_cpu_blocks": "0", "engine": "0", "model_name": name}
    lora = {labels: v for (n, labels), v in m.items() if n == "vllm:lora_requests_info"}
    assert len(lora) == 1
    (lora_labels, stamp), = lora.items()
    assert dict(lora_labels) == {"max_lora": "0", "running_lora_adapters": "", "waiting_lora_adapters": "",
                                 "model_name": name}
    assert abs(stamp - time.time()) < 60


def test_running_waiting_and_usage_move_with_the_scheduler(make_server):
    srv = make_server(max_running=1)
    seen = {}

    def scrape_while_busy():
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            loop = srv.state.engine_loop
            if loop.num_running == 1 and loop.num_waiting == 1:
                m, key = srv.metrics(), (("model_name", srv.state.served_model_name),)
                seen.update({n: m[(f"vllm:{n}", key)] for n in
                             ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc",
                              "gpu_cache_usage_perc")})
                seen["inferd_usage"] = m[("inferd:kv_cache_usage_perc", key)]
                return
            time.sleep(0.005)

    t = threading.Thread(target=scrape_while_busy)
    t.start()
    c = client(srv)
    threads = [threading.Thread(target=lambda: c.completions.create(
        model=srv.state.served_model_name, prompt="Tell me about the sea.", max_tokens=40,
        extra_body={"ignore_eos": True})) for _ in range(2)]
    for th in threads:
        th.start()
    for th in threads + [t]:
        th.join()
    assert seen["num_requests_running"] == 1 and seen["num_requests_waiting"] == 1
    assert 0 < seen["kv_cache_usage_perc"] == seen["gpu_cache_usage_perc"] <= 2 / 128
    srv.wait_idle()
    after = srv.metrics()
    key = (("model_name", srv.state.served_model_name),)
    assert after[("vllm:num_requests_running", key)] == after[("vllm:num_requests_waiting", key)] == 0
    assert after[("vllm:kv_cache_usage_perc", key)] == 0


def test_prefix_cache_counters_count_tokens_like_vllm(make_server):
    srv = make_server()
    c = client(srv)
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Something about whales?"}]
    rs = [c.chat.completions.create(model=srv.state.served_model_name, messages=msgs, max_tokens=2) for _ in range(2)]
    hits = sum(r.usage.prompt_tokens_details.cached_tokens for r in rs)
    queries = sum(r.usage.prompt_tokens for r in rs)
    assert hits >= 128
    srv.wait_idle()
    for prefix in ("vllm:", "vllm:gpu_", "inferd:"):
        assert srv.metric(f"{prefix}prefix_cache_hits_total") == hits
        assert srv.metric(f"{prefix}prefix_cache_queries_total") == queries
    assert srv.metric("vllm:gpu_prefix_cache_hit_rate") == pytest.approx(hits / queries)
