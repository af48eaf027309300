"""Do running streams keep their cadence while long prompts arrive? ITL p50/p99 under a mixed load, per server
configuration, interleaved.

    python bench/itl_mixed.py --config cap0="--max-prefill-while-decoding 0" --config cap256="" [-c 32]
                              [--requests 64] [--repeats 2] [--workload mixed|uniform] [--tree .] [--model PATH]

Each configuration runs `inferd serve` (extra options as given; 2 threads) as a subprocess; this process is the
client: c closed-loop streaming /v1/completions clients over a fixed list of requests (the same list for every
configuration): prompt lengths uniform in 50..2000 tokens, outputs uniform in 16..256 (`ignore_eos`, greedy), and a
quarter of the prompts starting with the same 1000-token "system prompt" (prefix-cache hits). Prompts are token
ids cut from the GPL text, tokenized once by the server's /tokenize. The configurations take turns (A B .. B A).
Reported per configuration (all repeats pooled): output tok/s, TTFT p50/p95, ITL p50/p99 (gaps between a stream's
text chunks) and their ratio. This is a small tuning load for the scheduler; bench/serve.py's mixed workload is the
comparison with llama-server.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import msgspec

HERE = Path(__file__).resolve().parent
TEXT = HERE / "data" / "gpl-3.txt"
DEFAULT_MODEL = Path.home() / ".cache" / "inferd" / "models" / "bench" / "SmolLM2-135M-Instruct.Q4_0.gguf"
SYSTEM_TOKENS = 1000


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Stats:
    tokens: int = 0
    wall_s: float = 0.0
    ttfts: list[float] = field(default_factory=list)
    itls: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * (len(xs) - 1) + 0.5))]


async def tokenize(url: str) -> list[int]:
    async with aiohttp.ClientSession() as s:
        async with s.post(url + "/tokenize", json={"prompt": TEXT.read_text(encoding="utf-8"),
                                                   "add_special_tokens": False}) as r:
            return (await r.json())["tokens"]


def workload(ids: list[int], n: int, seed: int, kind: str = "mixed") -> list[tuple[list[int], int]]:
    """(prompt token ids, max_tokens) per request."""
    rng = random.Random(seed)
    if kind == "uniform":  # bench/serve.py's: distinct 100-token prompts, 64 tokens out
        return [(ids[(i * 97) % (len(ids) - 100):][:100], 64) for i in range(n)]
    system = ids[:SYSTEM_TOKENS]
    out = []
    for i in range(n):
        length = rng.randint(50, 2000)
        start = rng.randrange(SYSTEM_TOKENS, len(ids) - 2000)
        if i % 4 == 0 and length > SYSTEM_TOKENS + 16:  # a quarter share the system prompt
            prompt = system + ids[start:start + length - SYSTEM_TOKENS]
        else:
            prompt = ids[start:start + length]
        out.append((prompt, rng.randint(16, 256)))
    return out


async def one(session, url, prompt, max_tokens, st: Stats) -> None:
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    last = None
    usage = None
    async with session.post(url + "/v1/completions", json=body) as r:
        if r.status != 200:
            st.errors.append(f"HTTP {r.status}: {(await r.text())[:200]}")
            return
        async for line in r.content:
            if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                continue
            ev = msgspec.json.decode(line[6:])
            if ev.get("usage"):
                usage = ev["usage"]
            ch = ev.get("choices") or []
            if ch and ch[0].get("text"):
                now = time.perf_counter()
                if last is None:
                    st.ttfts.append(now - t0)
                else:
                    st.itls.append(now - last)
                last = now
    if usage is None or usage["completion_tokens"] != max_tokens:
        st.errors.append(f"usage {usage}")
        return
    st.tokens += max_tokens


async def run(tree: Path, model: Path, extra: list[str], c: int, n: int, seed: int, threads: int,
              kind: str) -> Stats:
    port = free_port()
    cmd = [sys.executable, "-m", "inferd.cli", "serve", "--model", str(model), "--port", str(port),
           "--threads", str(threads), "--max-running", str(c), "--no-measure-bandwidth", "--no-log-requests",
           "--log-level", "warning", *extra]
    log = open(f"/tmp/itl_mixed-{port}.log", "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=tree, env={**os.environ,
                                                                                      "PYTHONPATH": str(tree)})
    url = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as s:
            for _ in range(900):
                if proc.poll() is not None:
                    raise RuntimeError(f"server exited; see {log.name}")
                try:
                    async with s.get(url + "/health") as r:
                        if r.status == 200:
                            break
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.2)
        jobs = workload(await tokenize(url), n, seed, kind)
        st = Stats()
        conn = aiohttp.TCPConnector(limit=c + 2, force_close=True)
        async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=1800)) as session:
            await one(session, url, jobs[0][0][:20], 4, Stats())  # warm-up
            queue = list(reversed(jobs))

            async def client():
                while queue:
                    p, m = queue.pop()
                    await one(session, url, p, m, st)

            t0 = time.perf_counter()
            await asyncio.gather(*(client() for _ in range(c)))
            st.wall_s = time.perf_counter() - t0
        return st
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


async def main_async(args) -> None:
    configs = [(c.split("=", 1)[0], c.split("=", 1)[1].split()) for c in args.config]
    pooled = {name: Stats() for name, _ in configs}
    for rep in range(args.repeats):
        for name, extra in (configs if rep % 2 == 0 else configs[::-1]):
            st = await run(args.tree.resolve(), args.model, extra, args.concurrency, args.requests, args.seed + rep,
                           args.threads, args.workload)
            p = pooled[name]
            p.tokens += st.tokens
            p.wall_s += st.wall_s
            p.ttfts += st.ttfts
            p.itls += st.itls
            p.errors += st.errors
            print(f"{name:<10} {st.tokens / st.wall_s:6.1f} tok/s  TTFT p50 {pct(st.ttfts, .5):6.2f} s  "
                  f"p95 {pct(st.ttfts, .95):6.2f} s  ITL p50 {pct(st.itls, .5) * 1e3:6.1f} ms  "
                  f"p99 {pct(st.itls, .99) * 1e3:6.1f} ms  ({pct(st.itls, .99) / pct(st.itls, .5):.1f}x)"
                  f"{'  ERRORS ' + str(st.errors[:2]) if st.errors else ''}", flush=True)
    print(f"\n{args.workload} load, c={args.concurrency}, {args.requests} requests x {args.repeats} repeats, "
          "pooled\n")
    print("| config | tok/s | TTFT p50 s | TTFT p95 s | ITL p50 ms | ITL p99 ms | p99/p50 |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, p in pooled.items():
        print(f"| {name} | {p.tokens / p.wall_s:.1f} | {pct(p.ttfts, .5):.2f} | {pct(p.ttfts, .95):.2f} | "
              f"{pct(p.itls, .5) * 1e3:.1f} | {pct(p.itls, .99) * 1e3:.1f} | "
              f"{pct(p.itls, .99) / pct(p.itls, .5):.1f}x |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", action="append", required=True, help='NAME="extra inferd serve options"')
    ap.add_argument("-c", "--concurrency", type=int, default=32)
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--workload", choices=("mixed", "uniform"), default="mixed",
                    help="uniform: 100-token prompts, 64 tokens out (bench/serve.py's load)")
    ap.add_argument("--tree", type=Path, default=HERE.parent)
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    ap.add_argument("-t", "--threads", type=int, default=2)
    asyncio.run(main_async(ap.parse_args()))


if __name__ == "__main__":
    main()
