"""Time to a ready server and memory, `inferd serve` vs `llama-server`, on the same GGUF, context and threads.

    python bench/startup.py [--model qwen2.5-coder-1.5b-q4_k_m] [--ctx 4096] [-t 2] [--rounds 3] [--bin DIR]

Each round starts both servers one after the other in ABBA order (round 0: llama-server first, round 1: inferd
first, ...) with the page cache warm (the file is read once before the first round), and measures:
  ready     seconds from the process' start to the first /health that answers 200
  peak RSS  the largest resident set of the process while it loads (/proc/PID/status VmHWM at ready)
  RSS       resident set once ready
  TTFT      the first request's time to its first token, sent the moment /health says 200 (a streamed completion
            of a short prompt, greedy): what start-up work left for after ready must not make slower
The context is the same for both: llama-server `-c CTX` (one slot), inferd `--num-kv-blocks CTX/64 --max-model-len
CTX`. llama-server runs as its users run it (`-fa on`, quiet logs); inferd with its defaults otherwise. Prints a
markdown table of medians with the spread and writes it to bench/results/startup.md (keeping the file's "## Notes"
section: what start-up spends its time on).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from vs_llamacpp import llama_bin, model_file  # noqa: E402


NOTES = "## Notes"  # what follows this heading in the output file is kept across runs


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def status_kb(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field):
            return int(line.split()[1])
    return 0


def start_and_measure(
    cmd: list[str], port: int, env: dict[str, str], model: str, timeout: float = 300.0
) -> dict[str, float]:
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"{cmd[0]} exited with {proc.returncode}: {proc.stderr.read().decode()[-2000:]}")
            if time.perf_counter() - t0 > timeout:
                raise SystemExit(f"{cmd[0]} was not ready after {timeout:.0f} s")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            time.sleep(0.02)
        ready = time.perf_counter() - t0
        got = {"ready": ready, "peak": status_kb(proc.pid, "VmHWM:") / 1e6, "rss": status_kb(proc.pid, "VmRSS:") / 1e6}
        got["ttft"] = first_token_s(port, model)
        return got
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def first_token_s(port: int, model: str) -> float:
    """Seconds from sending a streamed completion to its first token event (both servers speak /v1/completions)."""
    body = {"model": model, "prompt": "def fibonacci(n):", "max_tokens": 8, "temperature": 0, "stream": True}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=120) as resp:
        for line in resp:
            if line.startswith(b"data: {"):
                return time.perf_counter() - t0
    raise SystemExit(f"no token came from port {port}")


def commands(bin_dir: Path, path: Path, ctx: int, threads: int, port: int) -> dict[str, list[str]]:
    return {
        "llama-server": [str(bin_dir / "llama-server"), "-m", str(path), "-t", str(threads), "-c", str(ctx),
                         "-np", "1", "-fa", "on", "-lv", "0", "--port", str(port)],
        "inferd": [sys.executable, "-m", "inferd.cli", "serve", "-m", str(path), "-t", str(threads),
                   "--num-kv-blocks", str(ctx // 64), "--max-model-len", str(ctx), "--port", str(port)],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b-q4_k_m", help="a model name of bench/vs_llamacpp.py")
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--bin", type=Path, help="folder of llama.cpp's tools (default: ../shared/peers/llama-cpp.sh)")
    ap.add_argument("--out", type=Path, default=HERE / "results" / "startup.md")
    args = ap.parse_args()
    bin_dir = llama_bin(args.bin)
    path = model_file(args.model, bin_dir)
    path.read_bytes()  # warm page cache for both
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    env["PYTHONPATH"] = str(HERE.parent)
    results: dict[str, list[dict[str, float]]] = {"llama-server": [], "inferd": []}
    shown = commands(bin_dir, path, args.ctx, args.threads, 0)
    for r in range(args.rounds):
        order = ["llama-server", "inferd"] if r % 2 == 0 else ["inferd", "llama-server"]
        for name in order:
            port = free_port()
            got = start_and_measure(commands(bin_dir, path, args.ctx, args.threads, port)[name], port, env, path.stem)
            results[name].append(got)
            print(f"round {r} {name}: ready {got['ready']:.2f} s, peak {got['peak']:.2f} GB, RSS {got['rss']:.2f} GB, "
                  f"first request TTFT {got['ttft']:.3f} s", flush=True)

    def cell(name: str, key: str, unit: str) -> str:
        v = [x[key] for x in results[name]]
        return f"{statistics.median(v):.2f} {unit} ({min(v):.2f}-{max(v):.2f})"

    lines = [f"# Time to ready and memory: {path.name}, context {args.ctx}, {args.threads} threads, "
             f"{args.rounds} ABBA rounds, page cache warm ({time.strftime('%Y-%m-%d %H:%M')})", "",
             "| server | ready (median, range) | peak RSS while loading | RSS when ready | first request TTFT |",
             "| --- | ---: | ---: | ---: | ---: |"]
    for name in results:
        cells = [cell(name, "ready", "s"), cell(name, "peak", "GB"), cell(name, "rss", "GB"), cell(name, "ttft", "s")]
        lines.append(f"| {name} | {' | '.join(cells)} |")
    ratio = statistics.median(x["ready"] for x in results["inferd"]) / statistics.median(
        x["ready"] for x in results["llama-server"])
    lines += ["", f"inferd / llama-server time to ready: {ratio:.2f}x", "", "Commands (port varies):", ""]
    lines += [f"    {' '.join(c).replace(str(Path.home()), '~')}" for c in shown.values()]
    report = "\n".join(lines) + "\n"
    print("\n" + report)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    notes = args.out.read_text().partition(NOTES)[2] if args.out.exists() else ""
    args.out.write_text(report + (f"\n{NOTES}{notes}" if notes else ""))


if __name__ == "__main__":
    main()
