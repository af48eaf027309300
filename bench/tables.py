"""The results tables of README.md and docs/benchmarks.md, built from the JSON that the benchmarks write beside
their results files, so that no figure in the docs is typed by hand.

    python bench/tables.py            # print both tables
    python bench/tables.py --write    # replace the blocks between <!-- results:begin/end --> in README and docs

Each row is one benchmark's comparison on one model, with the spread of its per-round (or per-repeat) ratios
and, for served load, the tail latency beside the throughput; the link goes to the results file the row comes
from, where the commands of both engines, the machine and every sample are.
"""
from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"
HEADLINE_TESTS = ("pp512", "tg128")   # the README's rows; docs/benchmarks.md has every row
HEADLINE_LEVELS = ("8",)


def load(pattern: str) -> list[tuple[Path, dict[str, Any]]]:
    found = []
    for path in sorted(RESULTS.glob(pattern)):
        if path.stem.endswith("-quick"):
            continue   # smoke runs are not results
        found.append((path, json.loads(path.read_text())))
    return found


def ratio_cell(ratio: float, spread: list[float]) -> str:
    if len(spread) < 2:
        return f"{ratio:.2f}x (1 round)"
    return f"{ratio:.2f}x [{min(spread):.2f}-{max(spread):.2f}]"


def where(path: Path, data: dict[str, Any], link_base: str) -> str:
    """the run's date, CPU and kernel path (rows of one table may come from different machines), linked"""
    machine = data.get("machine") or {}
    cpu = f", {machine['cpu']}" if machine.get("cpu") else ""
    titled = re.search(r"(\w+) kernels", data.get("title", ""))
    kernels = data.get("kernels") or (titled.group(1) if titled else "")
    path_cell = f", {kernels}" if kernels else ""
    return f"[{data.get('date', '?')}{cpu}{path_cell}]({link_base}{path.name.replace('.json', '.md')})"


Row = tuple[tuple[str, str], str, list[str]]  # (what it measures, when, the cells)


def decode_rows(link_base: str, headline: bool) -> list[Row]:
    rows = []
    for path, data in load("vs_llamacpp*.json"):
        for r in data["rows"]:
            if headline and (r["test"] not in HEADLINE_TESTS or r["depth"] != 0):
                continue
            work = f"{r['test']}" + (f" at depth {r['depth']}" if r["depth"] else "")
            if data.get("kv_cache", "f16") != "f16":
                work += f", KV cache {data['kv_cache']}"
            rows.append(((r["model"], work), data.get("date", ""),
                         [r["model"], work, f"{r['inferd_tok_s']['median']:.1f}", f"{r['peer_tok_s']['median']:.1f}",
                          ratio_cell(r["ratio"], r["round_ratios"]), where(path, data, link_base)]))
    return rows


def serve_rows(link_base: str, headline: bool) -> list[Row]:
    rows = []
    for path, data in load("serve*.json"):
        model = data.get("model") or data["title"].split(", ")[1]
        workload = data.get("workload") or ("mixed" if "mixed" in path.stem else "uniform")
        for level, pair in data["levels"].items():
            if headline and level not in HEADLINE_LEVELS:
                continue
            ours, peer = pair["inferd"], pair["llama-server"]
            if not peer["throughput"]:
                continue
            lat = (f"TTFT p50 {ours['ttft_p50'] / peer['ttft_p50']:.2f}x, "
                   f"ITL p99 {ours['itl_p99'] / peer['itl_p99']:.2f}x")
            rows.append(((model, f"served, {workload}, c={level}"), data.get("date", ""),
                         [model, f"served, {workload}, c={level}: tok/s ({lat})", f"{ours['throughput']:.1f}",
                          f"{peer['throughput']:.1f}", ratio_cell(ours["throughput"] / peer["throughput"],
                                                                  ours["repeat_ratios"]),
                          where(path, data, link_base)]))
    return rows


def newest(rows: list[Row]) -> list[list[str]]:
    """One row per model and measurement: the newest run's (an earlier run stays in its results file), in the order
    the measurements first appear."""
    best: dict[tuple[str, str], tuple[str, list[str]]] = {}
    for key, date, cells in rows:
        if key not in best or date >= best[key][0]:
            best[key] = (date, cells)
    return [cells for _, cells in best.values()]


def table(link_base: str, headline: bool) -> str:
    head = ["model", "work", "inferd tok/s", "llama.cpp tok/s", "ratio [per-round range]", "run"]
    rows = newest(decode_rows(link_base, headline) + serve_rows(link_base, headline))
    lines = ["| " + " | ".join(head) + " |", "| --- | --- | ---: | ---: | ---: | --- |"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    lines += ["", "Latency ratios are inferd's over llama-server's (below 1: inferd answers sooner)."]
    return "\n".join(lines)


def replace_block(path: Path, body: str) -> None:
    text = path.read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{path} has no {BEGIN} ... {END} block")
    pattern = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.S)
    path.write_text(pattern.sub(lambda _: f"{BEGIN}\n{body}\n{END}", text, count=1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="write the tables into README.md and docs/benchmarks.md")
    args = ap.parse_args()
    readme, docs = table("bench/results/", headline=True), table("../bench/results/", headline=False)
    if args.write:
        replace_block(ROOT / "README.md", readme)
        replace_block(ROOT / "docs" / "benchmarks.md", docs)
    else:
        print(readme + "\n\n" + docs)


if __name__ == "__main__":
    main()
