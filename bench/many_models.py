"""Two models of one daemon busy at once vs one alone: how the cores are shared.

One `inferd serve` with two [models.NAME] tables (by default two copies of SmolLM2-135M-Instruct Q4_1, each with its
own engine and scheduler thread), both loaded up front (pinned). Each round sends `--requests` completions of
`--max-tokens` tokens (ignore_eos) to model `a` alone, then to `a` and `b` at the same time, and records each
model's decode throughput (completion tokens / wall time of its request). Run once with the threads split between
the models (the default: the physical cores divided by the number of models that fit in the memory budget at
once, here both) and once with every model on every core (`threads` = the cores in each table), so the
oversubscribed case is measured too.

    python bench/many_models.py [--model PATH] [--rounds 3] [--max-tokens 64]

Writes bench/results/many_models.md (and .json). The machine should be quiet; the script says when it was not.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import busy_warning, machine, machine_line, median, write_results  # noqa: E402
from tests.ops.procs import ROOT, Process, free_port, http_get, wait_for  # noqa: E402

DEFAULT_MODEL = Path.home() / ".cache" / "inferd-test-models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
PROMPT = "The history of the lighthouse begins"


def start_daemon(workdir: Path, model: Path, threads: int) -> tuple[Process, str]:
    port = free_port()
    tables = "".join(
        f'\n[models.{name}]\npath = "{model}"\npinned = true\n' + (f"threads = {threads}\n" if threads else "")
        for name in ("a", "b")
    )
    cfg = workdir / f"many-{threads}.toml"
    cfg.write_text("kv_cache_mib = 64\nprompt_cache_disk_mib = 0\nmeasure_bandwidth = false\n" + tables)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "INFERD_CONFIG": str(cfg)}
    argv = [sys.executable, "-m", "inferd.cli", "serve", "--host", "127.0.0.1", "--port", str(port)]
    proc = Process(argv, workdir / f"many-{threads}.log", env)
    proc.start()
    url = f"http://127.0.0.1:{port}"
    wait_for(lambda: (http_get(url + "/health") or (0,))[0] == 200, 300, "daemon ready", proc)
    return proc, url


def decode_tps(url: str, model: str, max_tokens: int) -> float:
    body = {"model": model, "prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    headers = {"Content-Type": "application/json"}
    req = urllib.request.Request(url + "/v1/completions", json.dumps(body).encode(), headers)
    started = time.perf_counter()
    with urllib.request.urlopen(req, timeout=600) as r:
        usage = json.loads(r.read())["usage"]
    return usage["completion_tokens"] / (time.perf_counter() - started)


def measure(url: str, rounds: int, max_tokens: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"alone": [], "together_a": [], "together_b": []}
    decode_tps(url, "a", 8)  # first touch of both
    decode_tps(url, "b", 8)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        for _ in range(rounds):
            out["alone"].append(decode_tps(url, "a", max_tokens))
            fa = pool.submit(decode_tps, url, "a", max_tokens)
            fb = pool.submit(decode_tps, url, "b", max_tokens)
            out["together_a"].append(fa.result())
            out["together_b"].append(fb.result())
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "many_models.md")
    args = ap.parse_args()
    from inferd.engine.engine import physical_cores

    cores = physical_cores()
    warning = busy_warning()
    rows, data = [], {"machine": machine(), "cores": cores, "model": str(args.model), "runs": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for label, threads in (("split (default)", 0), ("every core each", cores)):
            proc, url = start_daemon(Path(tmp), args.model, threads)
            try:
                result = measure(url, args.rounds, args.max_tokens)
            finally:
                proc.stop()
            per_model = max(1, cores // 2) if threads == 0 else threads
            data["runs"][label] = {"threads_per_model": per_model, **result}  # type: ignore[index]
            alone, ta, tb = median(result["alone"]), median(result["together_a"]), median(result["together_b"])
            both = ta + tb
            cells = [label, str(per_model)] + [f"{v:.1f}" for v in (alone, ta, tb, both)] + [f"{both / alone:.2f}"]
            rows.append("| " + " | ".join(cells) + " |")
    md = [
        "# Two models of one daemon busy at once",
        "",
        f"`python bench/many_models.py --rounds {args.rounds} --max-tokens {args.max_tokens}` on "
        f"{time.strftime('%Y-%m-%d')}. {machine_line(data['machine'])}",  # type: ignore[arg-type]
        "",
        f"One `inferd serve` with two pinned models, `a` and `b`, both `{args.model.name}` (each its own engine "
        f"and scheduler thread). Decode tokens/s of one {args.max_tokens}-token completion (`ignore_eos`, "
        f"temperature 0), median of {args.rounds} rounds: `a` alone, then `a` and `b` at the same time.",
        "",
        "| threads | per model | a alone | a (both busy) | b (both busy) | both together | together / alone |",
        "| --- | --- | --- | --- | --- | --- | --- |",
        *rows,
        "",
    ]
    if warning:
        md += [f"The machine was not quiet: {warning}", ""]
    write_results(args.out, "\n".join(md), data)
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
