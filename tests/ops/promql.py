"""Metric names: those a PromQL expression reads, and those inferd's /metrics exports (parsed with
prometheus_client's own parser), so rules, the board and the Kubernetes manifests can be checked against the
code. No PromQL parser ships for Python; the expressions here are plain enough for a careful tokenizer that
drops strings, label matchers, ranges and grouping clauses, then keeps identifiers that are not functions or
keywords."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "config" / "prometheus" / "inferd-rules.yml"
BOARD = ROOT / "config" / "grafana" / "inferd.json"

KEYWORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right", "bool",
            "offset", "inf", "nan"}
# series Prometheus itself makes for every target
SYNTHETIC = {"up", "scrape_duration_seconds", "scrape_samples_scraped"}


def metric_names(expr: str) -> set[str]:
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)                     # string literals
    text = re.sub(r"\{[^}]*\}", " ", text)                              # label matchers
    text = re.sub(r"\[[^\]]*\]", " ", text)                             # ranges and subqueries
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    names = set()
    for m in re.finditer(r"(?<![\w:.$])([a-zA-Z_:][a-zA-Z0-9_:]*)(\s*\()?", text):
        word, call = m.group(1), m.group(2)
        if call or word.lower() in KEYWORDS:
            continue
        names.add(word)
    return names


def exported_names(metrics_text: str) -> set[str]:
    """Every sample name in a /metrics body (counters with _total, histograms' _bucket/_sum/_count)."""
    return {s.name for family in text_string_to_metric_families(metrics_text) for s in family.samples}


def rendered_metrics() -> str:
    """What /metrics serves, rendered by the same Metrics object the handler uses (no model needed)."""
    from inferd.server.metrics import Metrics
    return Metrics("m", read_bandwidth=1.0).render().decode()


def rules() -> list[dict]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def recorded_names() -> set[str]:
    return {rule["record"] for rule in rules() if "record" in rule}


def board() -> dict:
    return json.loads(BOARD.read_text())


def board_panels() -> list[dict]:
    """Every panel with queries, rows' nested panels included."""
    out = []
    for panel in board()["panels"]:
        out += [p for p in [panel, *panel.get("panels", [])] if p.get("targets")]
    return out


def board_expressions() -> list[str]:
    return [t["expr"] for p in board_panels() for t in p["targets"]]
