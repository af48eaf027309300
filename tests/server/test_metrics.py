"""/metrics parsed with prometheus-client's parser: vLLM-compatible names, values that match the traffic."""

import time
import urllib.request

import openai

VLLM_NAMES = ["num_requests_running", "num_requests_waiting", "kv_cache_usage_perc", "prompt_tokens_total",
              "generation_tokens_total", "request_success_total", "prefix_cache_queries_total",
              "prefix_cache_hits_total", "http_requests_client_disconnected_total", "num_preemptions_total"]
HISTOGRAMS = ["time_to_first_token_seconds", "inter_token_latency_seconds", "e2e_request_latency_seconds",
              "request_queue_time_seconds"]
OURS = ["decode_tokens_per_second", "prefill_tokens_per_second", "memory_bandwidth_bytes_per_second",
        "memory_bandwidth_ratio", "measured_read_bandwidth_bytes_per_second"]


def test_metrics_match_one_request(make_server):
    srv = make_server(measure_bandwidth=True)
    model = srv.state.served_model_name
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)
    secret = "PROMPT-TEXT-MUST-NOT-LEAK-7731"
    r = client.completions.create(model=model, prompt=f"{secret} Once upon a time", max_tokens=5,
                                  temperature=0, extra_body={"ignore_eos": True})
    srv.wait_idle()

    with urllib.request.urlopen(srv.url + "/metrics") as resp:
        assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = resp.read().decode()
    assert secret not in text and "Once upon" not in text

    m = srv.metrics()
    names = {name for name, _ in m}
    for n in VLLM_NAMES + OURS:
        assert "inferd:" + n in names, n
    for h in HISTOGRAMS:
        assert {f"inferd:{h}_bucket", f"inferd:{h}_count", f"inferd:{h}_sum"} <= names, h
    assert all(dict(labels).get("model_name") == model for _, labels in m)

    assert srv.metric("inferd:prompt_tokens_total") == r.usage.prompt_tokens
    assert srv.metric("inferd:generation_tokens_total") == 5
    assert srv.metric("inferd:request_success_total", finished_reason="length") == 1
    assert srv.metric("inferd:request_success_total", finished_reason="stop") == 0
    assert srv.metric("inferd:time_to_first_token_seconds_count") == 1
    assert srv.metric("inferd:inter_token_latency_seconds_count") == 4
    assert srv.metric("inferd:e2e_request_latency_seconds_count") == 1
    assert srv.metric("inferd:request_queue_time_seconds_count") == 1
    ttft = srv.metric("inferd:time_to_first_token_seconds_sum")
    e2e = srv.metric("inferd:e2e_request_latency_seconds_sum")
    assert 0 < ttft <= e2e
    assert srv.metric("inferd:time_to_first_token_seconds_bucket", le="+Inf") == 1
    assert srv.metric("inferd:num_requests_running") == 0 and srv.metric("inferd:num_requests_waiting") == 0
    assert srv.metric("inferd:kv_cache_usage_perc") == 0
    assert srv.metric("inferd:prefix_cache_queries_total") == r.usage.prompt_tokens

    # rates over the last 10 s: 5 tokens decoded, the prompt prefilled, bytes moved
    assert srv.metric("inferd:decode_tokens_per_second") > 0
    assert srv.metric("inferd:prefill_tokens_per_second") > 0
    # the probe runs once the server has been idle for a moment after ready (app.after_ready)
    deadline = time.monotonic() + 60
    while not srv.metric("inferd:measured_read_bandwidth_bytes_per_second") and time.monotonic() < deadline:
        time.sleep(0.05)
    measured = srv.metric("inferd:measured_read_bandwidth_bytes_per_second")
    used = srv.metric("inferd:memory_bandwidth_bytes_per_second")
    assert measured > 1e9                     # any machine that runs this reads more than 1 GB/s
    assert used > srv.state.engine.weight_bytes   # at least the weights once per second of step time
    assert abs(srv.metric("inferd:memory_bandwidth_ratio") - used / measured) < 1e-6
    # the weights' move into huge pages ended before the probe began (its state is logged then)
    assert srv.state.engine.huge_pages in ("all", "partly", "none")


def test_metrics_while_busy_show_running_and_usage(server):
    import threading
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    seen = {}

    def scrape_while_running():
        import time
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if server.state.engine_loop.num_running:
                seen["running"] = server.metric("inferd:num_requests_running")
                seen["usage"] = server.metric("inferd:kv_cache_usage_perc")
                return
            time.sleep(0.005)
    t = threading.Thread(target=scrape_while_running)
    t.start()
    client.completions.create(model=server.state.served_model_name, prompt="Tell me about the moon.",
                              max_tokens=60, extra_body={"ignore_eos": True})
    t.join()
    assert seen["running"] == 1
    assert 0 < seen["usage"] <= 2 / 128   # a short prompt + 60 tokens fit in one or two of 128 blocks
