"""config/prometheus: the rules read only metrics that /metrics exports, recorded names follow
level:metric:operations, every alert has a promtool unit test that makes it fire and clear, and promtool accepts
the rules, their tests and the scrape example."""

from __future__ import annotations

import re
import subprocess

import yaml

from tests.ops.conftest import require
from tests.ops.promql import (
    ROOT,
    RULES,
    SYNTHETIC,
    exported_names,
    metric_names,
    recorded_names,
    rendered_metrics,
    rules,
)

PROM = ROOT / "config" / "prometheus"
RULE_TESTS = PROM / "tests" / "inferd-rules-test.yml"


def test_rules_read_only_metrics_that_inferd_exports():
    exported = exported_names(rendered_metrics())
    for rule in rules():
        unknown = metric_names(rule["expr"]) - exported - recorded_names() - SYNTHETIC
        assert not unknown, (f"{rule.get('record') or rule['alert']} reads {sorted(unknown)}, "
                             "which /metrics does not export")


def test_recorded_names_follow_level_metric_operations():
    for name in recorded_names():
        level, metric, operations = name.split(":")
        assert re.fullmatch(r"[a-z_]+", level) and re.fullmatch(r"[a-z_0-9]+", operations), name
        assert metric.startswith("inferd_"), name
        # the level names exactly the labels the rule aggregates to
        rule = next(r for r in rules() if r.get("record") == name)
        if level == "model_name":
            assert "sum by (model_name" in rule["expr"], name


def test_alerts_have_severity_duration_and_text():
    alerts = [r for r in rules() if "alert" in r]
    assert {a["alert"] for a in alerts} == {
        "InferdTargetDown", "InferdTimeToFirstTokenHigh", "InferdQueueGrowing", "InferdKVCacheNearFull",
        "InferdErrorRatioHigh", "InferdNoTokensWhileRequestsWait", "InferdMemoryBandwidthCollapsed"}
    for a in alerts:
        assert a["labels"]["severity"] in ("warning", "critical"), a["alert"]
        assert re.fullmatch(r"\d+m", a["for"]), a["alert"]
        assert a["annotations"]["summary"] and a["annotations"]["description"], a["alert"]


def test_every_alert_has_a_unit_test_that_fires_and_clears():
    alerts = {r["alert"] for r in rules() if "alert" in r}
    cases: dict[str, list[tuple[int, bool]]] = {}
    for test in yaml.safe_load(RULE_TESTS.read_text())["tests"]:
        for case in test.get("alert_rule_test", []):
            minutes = int(case["eval_time"].rstrip("m"))
            cases.setdefault(case["alertname"], []).append((minutes, bool(case["exp_alerts"])))
    assert set(cases) == alerts
    for name, checks in cases.items():
        checks.sort()
        first_fire = next((t for t, fires in checks if fires), None)
        assert first_fire is not None, f"{name} never fires in its test"
        assert any(not fires for t, fires in checks if t < first_fire), f"{name} has no quiet check before it fires"
        assert any(not fires for t, fires in checks if t > first_fire), f"{name} never clears in its test"


def run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(argv, check=False, capture_output=True, text=True, timeout=120, cwd=PROM)


def test_promtool_checks_the_rules_and_the_scrape_example():
    promtool = require("promtool")
    r = run(promtool, "check", "rules", str(RULES))
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"SUCCESS: {len(rules())} rules found" in r.stdout
    r = run(promtool, "check", "config", "prometheus.yml")
    assert r.returncode == 0, r.stdout + r.stderr


def test_promtool_unit_tests_pass():
    promtool = require("promtool")
    r = run(promtool, "test", "rules", str(RULE_TESTS))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout
