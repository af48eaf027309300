"""Token gaps of the first requests a fresh server answers, beside the moment its weights' move into 2 MB pages ended.

    python bench/first_requests.py [-m MODEL] [-t THREADS] [--requests 8] [--tokens 64]

MODEL: a name of _common.REAL_FILES (default: the Qwen2.5-Coder-1.5B Q4_K_M file) or a path or name `inferd pull`
resolves.

Starts `inferd serve` (one sequence at a time, disk prompt cache off, info log), waits for /health, then streams
--requests greedy completions one after another (a closed loop of one client, as bench/serve.py's c=1 level) and
prints each request's median and largest gap between tokens and when it ran (seconds since ready), then when the
server logged "weights in 2 MB pages" (the move runs on a thread of its own after the warm-up,
ext/cpu/hugemem.c). bench/serve.py's lowest levels run right after a server starts, so their tails include whatever
this shows.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from _common import bench_model_path, decode_bench_args
from serve import free_port

MOVED = re.compile(r"^(\S+ \S+) INFO inferd\.server: weights in 2 MB pages: (\w+)", re.M)


def gaps_ms(port: int, prompt: str, tokens: int) -> list[float]:
    body = {"prompt": prompt, "max_tokens": tokens, "stream": True, "ignore_eos": True, "top_k": 1}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    stamps = []
    with urllib.request.urlopen(req, timeout=600) as r:
        for line in r:
            if line.startswith(b"data: ") and not line.startswith(b"data: [DONE]"):
                stamps.append(time.perf_counter())
    return [1000 * (b - a) for a, b in zip(stamps, stamps[1:])]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    decode_bench_args(ap)
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=64)
    args = ap.parse_args()
    port = free_port()
    log = Path(tempfile.mkstemp(prefix="inferd-first-requests-", suffix=".log")[1])
    model = bench_model_path(args.model)
    cmd = [sys.executable, "-m", "inferd.cli", "serve", "--model", str(model), "--port", str(port), "--threads",
           str(args.threads), "--max-running", "1", "--no-measure-bandwidth", "--no-log-requests",
           "--prompt-cache-disk-mib", "0", "--log-level", "info"]
    with log.open("w") as out:
        server = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).close()
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    sys.exit(f"the server did not become ready; its log: {log}")
                time.sleep(0.1)
        ready = time.time()
        print(f"{args.model}, {args.threads} threads: {args.requests} requests of {args.tokens} tokens, one at a time")
        for i in range(args.requests):
            start = time.time() - ready
            gaps = sorted(gaps_ms(port, f"Request {i}: " + "the quick brown fox jumps over the lazy dog " * 10,
                                  args.tokens))
            print(f"  request {i}: {start:5.1f}-{time.time() - ready:5.1f} s after ready, gap median "
                  f"{gaps[len(gaps) // 2]:6.1f} ms, largest {gaps[-1]:6.1f} ms")
        found = MOVED.search(log.read_text())
        if found:
            at = time.mktime(time.strptime(found.group(1)[:19], "%Y-%m-%d %H:%M:%S")) + float("0." + found[1][20:])
            print(f"weights in 2 MB pages: {found.group(2)}, {at - ready:.1f} s after ready")
        else:
            print("weights in 2 MB pages: not logged (THP off, or the move did not end)")
    finally:
        server.terminate()
        server.wait(timeout=30)


if __name__ == "__main__":
    main()
