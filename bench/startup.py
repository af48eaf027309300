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
CTX`. llama-server runs as its users run it (`-fa on`, quiet logs); inferd with its defaults otherwise. Both get
this process' environment without OMP_NUM_THREADS. Writes bench/results/startup.md whole (every round's figures,
the medians and their ranges), its data beside it as JSON; a run cut short writes the rounds it finished, marked
partial.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from _common import (abba, command_line, fmt_median, fmt_ratio, llama_bin, machine, model_file,  # noqa: E402
                     partial_note, peer_build, ratio_of_medians, results_head, stats, stop_on_sigterm, stop_reason,
                     publish_results)

SERVERS = ("llama-server", "inferd")
METRICS = (("ready", "ready", "s"), ("peak", "peak RSS while loading", "GB"), ("rss", "RSS when ready", "GB"),
           ("ttft", "first request TTFT", "s"))


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


def commands(bin_dir: Path, path: Path, ctx: int, threads: int, port: int | str) -> dict[str, list[str]]:
    return {
        "llama-server": [str(bin_dir / "llama-server"), "-m", str(path), "-t", str(threads), "-c", str(ctx),
                         "-np", "1", "-fa", "on", "-lv", "0", "--port", str(port)],
        "inferd": [sys.executable, "-m", "inferd.cli", "serve", "-m", str(path), "-t", str(threads),
                   "--num-kv-blocks", str(ctx // 64), "--max-model-len", str(ctx), "--port", str(port)],
    }


@dataclass
class StartupRun:
    """What a run measured and how: everything its results file says."""
    stamp: str
    host: dict
    peer_build: str
    commands: list[str]
    model: str
    ctx: int
    threads: int
    rounds: int                  # planned
    stopped: str | None = None   # what cut the run short
    # per round: {server: {"ready": s, "peak": GB, "rss": GB, "ttft": s}}
    measured: list[dict[str, dict[str, float]]] = field(default_factory=list)

    def finished(self) -> list[dict[str, dict[str, float]]]:
        return [m for m in self.measured if all(name in m for name in SERVERS)]


def results(run: StartupRun) -> tuple[str, dict]:
    """The results file's markdown and its JSON data, from the run's per-round figures."""
    done = run.finished()
    title = (f"Time to ready and memory: {run.model}, context {run.ctx}, {run.threads} threads, {run.rounds} ABBA "
             f"rounds, page cache warm")
    lines = results_head(title, run.stamp, run.host, f"llama.cpp: {run.peer_build}")
    if run.stopped:
        lines += ["", partial_note(len(done), run.rounds, "rounds", run.stopped)]
    lines += ["", "| server | " + " | ".join(f"{label} (min-max)" for _, label, _ in METRICS) + " |",
              "| --- |" + " ---: |" * len(METRICS)]
    summary: dict[str, dict] = {}
    for name in SERVERS:
        values = {key: [m[name][key] for m in done] for key, _, _ in METRICS}
        summary[name] = {key: stats(v) for key, v in values.items()}
        lines.append(f"| {name} | " + " | ".join(f"{fmt_median(values[key], '.2f')} {unit}" for key, _, unit in METRICS)
                     + " |")
    ratios = {key: ratio_of_medians([[m["inferd"][key]] for m in done], [[m["llama-server"][key]] for m in done])
              for key, _, _ in METRICS}
    summary["inferd / llama-server"] = {key: {"ratio": r, "per_round": per} for key, (r, per) in ratios.items()}
    lines.append("| inferd / llama-server | " + " | ".join(fmt_ratio(*ratios[key]) for key, _, _ in METRICS) + " |")
    lines += ["", "Per round:", "", "| round | server | " + " | ".join(label for _, label, _ in METRICS) + " |",
              "| ---: | --- |" + " ---: |" * len(METRICS)]
    for r, m in enumerate(done):
        for name in abba(r, SERVERS):
            lines.append(f"| {r + 1} | {name} | "
                         + " | ".join(f"{m[name][key]:.2f} {unit}" for key, _, unit in METRICS) + " |")
    lines += ["", "Each round starts both servers one after the other, in the order listed. ready: from the "
              "process' start to the first /health that answers 200; peak RSS: VmHWM at ready; TTFT: a streamed "
              "completion sent the moment /health says 200.", "", "Commands (PORT: a free port):", "", "```",
              *run.commands, "```", ""]
    data = {"kind": "startup", "date": run.stamp, "machine": run.host, "peer_build": run.peer_build,
            "commands": run.commands, "model": run.model, "ctx": run.ctx, "threads": run.threads,
            "rounds_planned": run.rounds, "complete": run.stopped is None, "stopped": run.stopped,
            "rounds": run.measured, "servers": summary}
    return "\n".join(lines), data


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b-q4_k_m", help="a model name of bench/vs_llamacpp.py")
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--bin", type=Path, help="folder of llama.cpp's tools (default: ../shared/peers/llama-cpp.sh)")
    ap.add_argument("--out", type=Path, default=HERE / "results" / "startup.md")
    args = ap.parse_args()
    stop_on_sigterm()
    bin_dir = llama_bin(args.bin)
    path = model_file(args.model, bin_dir)
    path.read_bytes()  # warm page cache for both
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    env["PYTHONPATH"] = str(HERE.parent)
    shown = commands(bin_dir, path, args.ctx, args.threads, "PORT")
    env_words = f"env -u OMP_NUM_THREADS PYTHONPATH={env['PYTHONPATH']}"
    run = StartupRun(time.strftime("%Y-%m-%d %H:%M"), machine(), peer_build(bin_dir),
                     [f"python {command_line(sys.argv)}", *(f"{env_words} {command_line(c)}" for c in shown.values())],
                     path.name, args.ctx, args.threads, args.rounds)
    try:
        for r in range(args.rounds):
            this: dict[str, dict[str, float]] = {}
            run.measured.append(this)
            for name in abba(r, SERVERS):
                port = free_port()
                got = start_and_measure(commands(bin_dir, path, args.ctx, args.threads, port)[name], port, env,
                                        path.stem)
                this[name] = got
                print(f"round {r} {name}: ready {got['ready']:.2f} s, peak {got['peak']:.2f} GB, RSS "
                      f"{got['rss']:.2f} GB, first request TTFT {got['ttft']:.3f} s", flush=True)
    except (Exception, KeyboardInterrupt, SystemExit) as e:
        run.stopped = stop_reason(e)
        if not run.finished():
            raise
    report, data = results(run)
    publish_results(args.out, report, data)
    return 1 if run.stopped else 0


if __name__ == "__main__":
    sys.exit(main())
