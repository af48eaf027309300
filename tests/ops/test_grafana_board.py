"""config/grafana/inferd.json: an importable board (DS_PROMETHEUS input, model_name variable) whose every panel
query returns data from a real Prometheus (the shipped scrape example and rules, scraping every second) that
scrapes a real `inferd serve` under a short streaming load; and every metric name on the board is one that
/metrics exports."""

from __future__ import annotations

import asyncio
import math
import time
import urllib.request

import pytest
import yaml

from tests.ops.conftest import require
from tests.ops.load import run_load
from tests.ops.procs import ROOT, Prometheus, Replica, free_port, wait_for
from tests.ops.promql import (
    RULES,
    SYNTHETIC,
    board,
    board_expressions,
    board_panels,
    exported_names,
    metric_names,
    recorded_names,
    rendered_metrics,
)

RATE_INTERVAL = "30s"   # what Grafana puts in $__rate_interval: longer than the load, so rates cover all of it


def test_board_is_importable_with_a_datasource_input_and_a_model_variable():
    b = board()
    assert ([(i["name"], i["type"], i["pluginId"]) for i in b["__inputs"]]
            == [("DS_PROMETHEUS", "datasource", "prometheus")])
    variables = {v["name"]: v for v in b["templating"]["list"]}
    assert variables["model_name"]["type"] == "query"
    assert "label_values(inferd:num_requests_running, model_name)" == variables["model_name"]["definition"]
    ids = [p["id"] for p in b["panels"]]
    assert len(ids) == len(set(ids))
    for panel in board_panels():
        assert panel["datasource"] == {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}, panel["title"]
        for t in panel["targets"]:
            if metric_names(t["expr"]) - SYNTHETIC:   # every inferd series is filtered by the variables
                assert 'model_name=~"$model_name"' in t["expr"] and 'instance=~"$instance"' in t["expr"], t["expr"]


def test_board_covers_what_operators_watch():
    used = set().union(*(metric_names(e) for e in board_expressions()))
    for name in ("inferd:generation_tokens_total", "inferd:prompt_tokens_total",
                 "inferd:time_to_first_token_seconds_bucket", "inferd:inter_token_latency_seconds_bucket",
                 "inferd:num_requests_running", "inferd:num_requests_waiting", "inferd:kv_cache_usage_perc",
                 "inferd:prefix_cache_hits_total", "inferd:prefix_cache_queries_total",
                 "inferd:memory_bandwidth_bytes_per_second", "inferd:measured_read_bandwidth_bytes_per_second",
                 "inferd:request_success_total", "inferd:http_requests_client_disconnected_total"):
        assert name in used, name


def test_board_reads_only_metrics_that_inferd_exports():
    exported = exported_names(rendered_metrics())
    for expr in board_expressions():
        assert metric_names(expr) <= exported | SYNTHETIC, expr


@pytest.fixture(scope="module")
def monitored(tiny_model, tmp_path_factory):
    """A real `inferd serve` (bandwidth measured) and a real Prometheus scraping it every second with the shipped
    scrape config and rules."""
    require("prometheus")
    work = tmp_path_factory.mktemp("prometheus")
    replica = Replica(str(tiny_model), free_port(), work, "--served-model-name", "tiny", "--threads", "1",
                      "--num-kv-blocks", "64", "--no-log-requests", name="inferd")
    config = yaml.safe_load((ROOT / "config" / "prometheus" / "prometheus.yml").read_text())
    config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
    config["rule_files"] = [str(RULES)]
    config["scrape_configs"][0]["static_configs"] = [{"targets": [f"127.0.0.1:{replica.port}"]}]
    prometheus = Prometheus(yaml.safe_dump(config), work, free_port())
    try:
        replica.start()
        replica.wait_ready()
        prometheus.start()
        wait_for(lambda: [r["value"][1] for r in prometheus.query('up{job="inferd"}')] == ["1"], 30, "first scrape")
        stop = asyncio.Event()
        asyncio.run(short_load(replica.url, stop))
        time.sleep(2.5)   # two more scrapes and rule evaluations after the last token
        yield replica, prometheus
    finally:
        prometheus.stop()
        replica.stop()


async def short_load(url: str, stop: asyncio.Event) -> None:
    async def stop_later():
        await asyncio.sleep(5)
        stop.set()
    # 3 users over 4 clients: repeated prompts, so the prefix cache has hits
    _, result = await asyncio.gather(stop_later(), run_load(url, stop, concurrency=4, max_tokens=24, users=3,
                                                            deadline_s=20))
    assert result.streams and not result.failed and not result.truncated


def fill(expr: str) -> str:
    return (expr.replace("$__rate_interval", RATE_INTERVAL).replace('"$model_name"', '"tiny"')
            .replace('"$instance"', '".*"'))


def test_every_panel_query_returns_data_from_a_real_prometheus(monitored):
    _, prometheus = monitored
    empty, not_finite = [], []
    for panel in board_panels():
        for t in panel["targets"]:
            result = prometheus.query(fill(t["expr"]))
            values = [float(r["value"][1]) for r in result]
            if not values:
                empty.append((panel["title"], t["expr"]))
            elif not any(math.isfinite(v) for v in values):
                not_finite.append((panel["title"], t["expr"], values))
    assert empty == [] and not_finite == []
    # the load moved the counters the board plots
    generated = prometheus.query(
        fill('sum(rate(inferd:generation_tokens_total{model_name=~"$model_name"}[$__rate_interval]))'))
    assert float(generated[0]["value"][1]) > 0
    hit_ratio = prometheus.query(fill(next(t["expr"] for p in board_panels() if p["title"] == "Prefix cache hit ratio"
                                           for t in p["targets"])))
    assert 0 < float(hit_ratio[0]["value"][1]) <= 1


def test_variable_queries_find_the_model_and_replica(monitored):
    replica, prometheus = monitored
    names = prometheus.api("label/model_name/values", **{"match[]": "inferd:num_requests_running"})
    assert names == ["tiny"]
    instances = prometheus.api("label/instance/values",
                               **{"match[]": 'inferd:num_requests_running{model_name=~"tiny"}'})
    assert instances == [f"127.0.0.1:{replica.port}"]


def test_rules_evaluate_cleanly_and_recordings_have_data(monitored):
    _, prometheus = monitored
    groups = prometheus.api("rules")["groups"]
    loaded = [r for g in groups for r in g["rules"]]
    assert len(loaded) == len(yaml.safe_load(RULES.read_text())["groups"][0]["rules"]) + \
        len(yaml.safe_load(RULES.read_text())["groups"][1]["rules"])
    assert [(r["name"], r.get("lastError")) for r in loaded if r["health"] != "ok"] == []
    for name in recorded_names():
        assert prometheus.query(name), f"recording rule {name} has no data"
    # nothing is wrong with an idle, healthy replica: no alert is pending or firing
    assert [r["name"] for r in loaded if r.get("state") not in (None, "inactive")] == []


def test_every_name_the_board_and_rules_use_is_exported_by_the_live_server(monitored):
    replica, _ = monitored
    with urllib.request.urlopen(replica.url + "/metrics", timeout=10) as r:
        live = exported_names(r.read().decode())
    assert live == exported_names(rendered_metrics())   # the static checks read the same names
    used = set().union(*(metric_names(e) for e in board_expressions()))
    used |= set().union(*(metric_names(r["expr"])
                          for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]))
    assert used - live - recorded_names() - SYNTHETIC == set()
