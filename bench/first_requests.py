"""Token gaps of the first requests a fresh server answers, beside the moment its weights' move into 2 MB pages ended.

    python bench/first_requests.py [-m MODEL] [-t THREADS] [--requests 8] [--tokens 64]

MODEL: a name of _common.REAL_FILES (default: the Qwen2.5-Coder-1.5B Q4_K_M file) or a path or name `inferd pull`
resolves.

Starts `inferd serve` as bench/serve.py does (one sequence at a time, info log), waits for /health, then streams
--requests greedy completions one after another (a closed loop of one client, as bench/serve.py's c=1 level) and
prints each request's median and largest gap between tokens and when it ran (seconds since ready), then when the
server logged "weights in 2 MB pages" (the move runs on a thread of its own after the warm-up,
ext/cpu/hugemem.c). bench/serve.py's lowest levels run right after a server starts, so their tails include whatever
this shows.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import tempfile
import time
from datetime import datetime
from pathlib import Path

import aiohttp
from _common import bench_model_path, decode_bench_args
from serve import inferd_server, one_request

MOVED = re.compile(r"^(\S+ \S+) INFO inferd\.server: weights in 2 MB pages: (\w+)", re.M)
PROMPT = "the quick brown fox jumps over the lazy dog " * 10


async def run(args) -> None:
    server = inferd_server(bench_model_path(args.model), args.threads, 1, 512, ["--log-level", "info"])
    server.start(Path(tempfile.mkdtemp(prefix="inferd-first-requests-")))
    try:
        await server.wait_ready()
        ready = time.time()
        print(f"{args.model}, {args.threads} threads: {args.requests} requests of {args.tokens} tokens, one at a time")
        async with aiohttp.ClientSession() as session:
            for i in range(args.requests):
                start = time.time() - ready
                gaps = sorted((await one_request(session, server, f"Request {i}: {PROMPT}", args.tokens)).itls)
                print(f"  request {i}: {start:5.1f}-{time.time() - ready:5.1f} s after ready, gap median "
                      f"{1e3 * gaps[len(gaps) // 2]:6.1f} ms, largest {1e3 * gaps[-1]:6.1f} ms")
    finally:
        server.stop()
    found = MOVED.search(server.log_path.read_text())
    if found:
        at = datetime.strptime(found.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
        print(f"weights in 2 MB pages: {found.group(2)}, {at - ready:.1f} s after ready")
    else:
        print("weights in 2 MB pages: not logged (THP off, or the move did not end)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    decode_bench_args(ap)
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=64)
    asyncio.run(run(ap.parse_args()))


if __name__ == "__main__":
    main()
