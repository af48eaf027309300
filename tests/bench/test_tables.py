"""bench/tables.py: the docs' results tables come from the benchmarks' JSON, figures computed, not typed."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import _common  # noqa: E402
import tables  # noqa: E402


def decode_row(test: str, depth: int, ours: float, peer: float, rounds: list[float]) -> dict:
    return {"model": "m-q4_0", "test": test, "depth": depth, "peer_config": "fa1 ub512",
            "peer_tok_s": {"median": peer, "min": peer, "max": peer, "samples": [peer]},
            "inferd_tok_s": {"median": ours, "min": ours, "max": ours, "samples": [ours]},
            "ratio": ours / peer, "round_ratios": rounds}


def side(throughput: float, ttft: float, itl99: float, ratios: list[float]) -> dict:
    return {"throughput": throughput, "ttft_p50": ttft, "ttft_p95": ttft, "itl_p50": itl99 / 2, "itl_p99": itl99,
            "repeat_ratios": ratios}


@pytest.fixture
def results(tmp_path, monkeypatch):
    monkeypatch.setattr(tables, "RESULTS", tmp_path)
    machine = {"cpu": "Test CPU", "simd": ["avx2"], "cores": 2, "memory_gib": 8.0}
    _common.write_results(tmp_path / "vs_llamacpp.md", "# decode\n", {
        "kind": "vs_llamacpp", "date": "2026-01-02 03:04", "machine": machine, "kv_cache": "f16",
        "rows": [decode_row("pp512", 0, 300.0, 100.0, [2.9, 3.1]), decode_row("tg128", 4096, 30.0, 20.0, [1.5])]})
    _common.write_results(tmp_path / "serve.md", "# serve\n", {
        "kind": "serve", "date": "2026-01-02 05:06", "machine": machine, "model": "m-q4_0", "workload": "uniform",
        "levels": {"8": {"inferd": side(400.0, 0.1, 0.06, [2.5, 2.9]), "llama-server": side(150.0, 0.5, 0.03, [])},
                   "16": {"inferd": side(420.0, 0.2, 0.07, [2.4]), "llama-server": side(160.0, 0.8, 0.04, [])}}})
    (tmp_path / "serve-quick.json").write_text(json.dumps({"levels": {}}))   # smoke runs are left out
    return tmp_path


def test_every_row_is_computed_from_the_json(results):
    text = tables.table("r/", headline=False)
    row = "| m-q4_0 | pp512 | 300.0 | 100.0 | 3.00x [2.90-3.10] | [2026-01-02 03:04, Test CPU](r/vs_llamacpp.md) |"
    assert row in text
    assert "| m-q4_0 | tg128 at depth 4096 | 30.0 | 20.0 | 1.50x (1 round) |" in text
    # tail latency beside throughput: inferd's ITL p99 over the peer's
    assert "served, uniform, c=8: tok/s (TTFT p50 0.20x, ITL p99 2.00x) | 400.0 | 150.0 | 2.67x [2.50-2.90]" in text
    assert "c=16" in text


def test_a_row_names_its_kernel_path(results):
    """rows of one table come from different machines: each names the kernel path its run used (the decode JSON's
    `kernels`, the served run's title)"""
    machine = {"cpu": "Test CPU", "simd": ["avx512_vnni"], "cores": 2, "memory_gib": 8.0}
    _common.write_results(results / "vs_llamacpp_vnni.md", "# vnni\n", {
        "kind": "vs_llamacpp", "date": "2026-01-03 00:00", "machine": machine, "kv_cache": "f16",
        "kernels": "avx512vnni", "rows": [decode_row("pp512", 0, 500.0, 100.0, [4.9, 5.1])]})
    _common.write_results(results / "serve_vnni.md", "# serve\n", {
        "kind": "serve", "date": "2026-01-03 01:00", "machine": machine, "model": "m-q4_0", "workload": "uniform",
        "title": "inferd vs llama-server, m.gguf, 2 threads, avx512vnni kernels, 100 prompt + 64 output tokens",
        "levels": {"8": {"inferd": side(400.0, 0.1, 0.06, [2.5]), "llama-server": side(150.0, 0.5, 0.03, [])}}})
    text = tables.table("r/", headline=True)
    assert "| 5.00x [4.90-5.10] | [2026-01-03 00:00, Test CPU, avx512vnni](r/vs_llamacpp_vnni.md) |" in text
    assert "[2026-01-03 01:00, Test CPU, avx512vnni](r/serve_vnni.md)" in text


def test_the_headline_keeps_depth_0_and_c_8(results):
    text = tables.table("r/", headline=True)
    assert "pp512" in text and "depth 4096" not in text
    assert "c=8" in text and "c=16" not in text


def test_a_newer_run_of_the_same_measurement_replaces_the_older_row(results):
    machine = {"cpu": "Test CPU", "simd": ["avx2"], "cores": 2, "memory_gib": 8.0}
    _common.write_results(results / "vs_llamacpp_again.md", "# again\n", {
        "kind": "vs_llamacpp", "date": "2026-01-03 00:00", "machine": machine, "kv_cache": "f16",
        "rows": [decode_row("pp512", 0, 500.0, 100.0, [4.9, 5.1])]})
    text = tables.table("r/", headline=True)
    assert "| m-q4_0 | pp512 | 500.0 | 100.0 | 5.00x [4.90-5.10] |" in text
    assert "| m-q4_0 | pp512 | 300.0 |" not in text and text.count("| m-q4_0 | pp512 |") == 1
    # the older file's other row (tg128 at depth 4096, no headline row) stays, in the full table
    assert "| m-q4_0 | tg128 at depth 4096 | 30.0 |" in tables.table("r/", headline=False)


def test_write_replaces_only_the_marked_block(results, tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text(f"before\n{tables.BEGIN}\nold table\n{tables.END}\nafter\n")
    tables.replace_block(doc, "new table")
    assert doc.read_text() == f"before\n{tables.BEGIN}\nnew table\n{tables.END}\nafter\n"
    (tmp_path / "plain.md").write_text("no block")
    with pytest.raises(SystemExit, match="no <!-- results:begin -->"):
        tables.replace_block(tmp_path / "plain.md", "x")


def test_results_are_written_whole_with_their_json(tmp_path):
    _common.write_results(tmp_path / "x.md", "# x\n", {"a": 1})
    assert (tmp_path / "x.md").read_text() == "# x\n"
    assert json.loads((tmp_path / "x.json").read_text()) == {"a": 1}
    line = _common.machine_line({"cpu": "CPU", "simd": ["avx2", "avx512f"], "cores": 2, "memory_gib": 8.0})
    assert line == "Machine: CPU (avx2, avx512f), 2 cores, 8.0 GiB."
