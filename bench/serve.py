"""Serving benchmark: `inferd serve` vs a tuned `llama-server` under closed-loop streaming clients, in one run.

    python bench/serve.py --bin DIR                   # uniform: c = 1,4,8,16, 4 requests per client, 3 repeats, ~4 min
    python bench/serve.py --bin DIR --workload mixed  # mixed: c = 8,32, 2 requests per client, 2 repeats, ~10 min
    python bench/serve.py --bin DIR --quick [--workload mixed]   # smoke test: c = 1,4 (mixed: 4), 1 request, 1 repeat
    python bench/serve.py --inferd-only [--inferd-args '...']   # inferd alone (a quick look; no ratios)
(times: estimates for SmolLM2 Q4_0 on an unshared 2-core machine, from the speeds in bench/results/serve.md)

Workloads (--workload):
  uniform  every request has its own prompt of about 100 tokens (windows of a long text at different words, so no
           two share a first block) and generates exactly 64 tokens
  mixed    prompt lengths drawn uniformly from 50 to 2000 tokens, outputs from 16 to 256; every fourth request
           starts with the same 1000-token system prompt (its total length drawn from 1050 to 2000); the draws
           are seeded (--seed) per level and client, so both servers get the same requests in the same order
Every request is streamed from /v1/completions, greedy (`temperature: 0, top_k: 1`: llama-server's fast path),
`ignore_eos`, so it generates exactly max_tokens. For each concurrency c, each server runs as a fresh subprocess
on 127.0.0.1 with the same GGUF and threads, gets one warm-up request, then c clients each send their requests
back to back. The pair runs --repeats times in ABBA order (llama, inferd, inferd, llama, ...) and each server's
repeats are pooled. The servers (the results file repeats the exact command lines):
  llama-server -m FILE -t T -tb T -np c -c c*S -fa on -cram 0 -lv 0 --threads-http 2 [-nr]
               with env -u OMP_NUM_THREADS GLIBC_TUNABLES=glibc.malloc.hugetlb=1
  inferd serve --model FILE --threads T --max-running c --num-kv-blocks ceil(c*S/64) --log-level warning
               --no-log-requests --no-measure-bandwidth --prompt-cache-disk-mib 0
               (no prefix cache carried over from the last run on disk: each run starts cold, as llama-server does)
where S, the context per slot, holds the workload's longest prompt and output (both get the same KV capacity).
-nr only where llama.cpp's repacking dies with SIGILL (probed; the results say so). Measured per server and c:
  throughput  output tokens / wall time of the level (first request sent -> last one finished)
  TTFT        request sent -> first text chunk (p50, p95)
  ITL         gap between consecutive text chunks (p50, p99). A chunk that carries several tokens counts once,
              so the table gives the tokens per chunk: at 1.00 (one token per chunk) ITL is per token.
  ITL p99/p50 the tail against the stream's usual cadence
With --inferd-only llama-server does not run (its column is empty): for a quick look at one inferd configuration.
Writes bench/results/serve[-mixed][-quick].md (table, per-repeat throughput ratios, commands), .json and .png.
"""
from __future__ import annotations

import argparse
import asyncio
import atexit
import math
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Callable

import aiohttp
import msgspec

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

from _common import (abba, busy_warning, command_line, fmt_range, llama_bin, machine, machine_line,  # noqa: E402
                     model_file, peer_build, peer_env, peer_env_words, repack_works, write_results)

TEXT = HERE / "data" / "gpl-3.txt"
UNIFORM_PROMPT, UNIFORM_OUTPUT = 100, 64
MIXED_PROMPT = (50, 2000)
MIXED_OUTPUT = (16, 256)
SYSTEM_TOKENS = 1000          # the shared system prompt of every fourth mixed request
LEVELS = {"uniform": "1,4,8,16", "mixed": "8,32"}
ROUNDS = {"uniform": 4, "mixed": 2}
REPEATS = {"uniform": 3, "mixed": 2}


# ---- workloads ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Shape:
    prompt_tokens: int
    output_tokens: int
    shared: bool = False       # starts with the shared system prompt


def uniform_shapes(concurrency: int, rounds: int) -> list[list[Shape]]:
    return [[Shape(UNIFORM_PROMPT, UNIFORM_OUTPUT)] * rounds for _ in range(concurrency)]


def mixed_shapes(concurrency: int, rounds: int, seed: int) -> list[list[Shape]]:
    """Per client, its requests in order, drawn from generators seeded by (seed, level[, client]): each client
    sends the same requests to both servers whatever the timing. Exactly a quarter of the level's requests (at
    places drawn once per level) start with the shared system prompt."""
    total = concurrency * rounds
    shared = set(random.Random(f"{seed}/{concurrency}").sample(range(total), total // 4))
    out = []
    for client in range(concurrency):
        rng = random.Random(f"{seed}/{concurrency}/{client}")
        mine = []
        for j in range(rounds):
            is_shared = client * rounds + j in shared
            low = SYSTEM_TOKENS + MIXED_PROMPT[0] if is_shared else MIXED_PROMPT[0]
            mine.append(Shape(rng.randint(low, MIXED_PROMPT[1]), rng.randint(*MIXED_OUTPUT), is_shared))
        out.append(mine)
    return out


@dataclass(frozen=True)
class Request:
    prompt: str
    max_tokens: int


def render(shapes: list[list[Shape]], text_ids: list[int], decode, seed: int) -> list[list[Request]]:
    """Prompts for the shapes: windows of the text's tokens (read round the end) that start at distinct places,
    none at the system prompt's start, so that only the shared requests share a prefix; the shared ones are the
    system prompt followed by their own window."""
    count = sum(len(client) for client in shapes)
    longest = max(s.prompt_tokens for client in shapes for s in client)
    if longest > len(text_ids) or count >= len(text_ids):
        raise ValueError(f"the text has {len(text_ids)} tokens: too few for {count} windows of up to {longest}")
    system = text_ids[:SYSTEM_TOKENS]
    wrapped = text_ids + text_ids
    starts = iter(random.Random(seed).sample(range(1, len(text_ids)), count))
    out = []
    for client in shapes:
        mine = []
        for s in client:
            start = next(starts)
            own = wrapped[start:start + s.prompt_tokens - (SYSTEM_TOKENS if s.shared else 0)]
            mine.append(Request(decode((system if s.shared else []) + own), s.output_tokens))
        out.append(mine)
    return out


def text_token_ids(model_path: Path) -> tuple[list[int], Callable[[list[int]], str]]:
    """The benchmark text as the model's tokens, and the model's decoder."""
    from inferd.model.loader import load_model
    tok = load_model(model_path).tokenizer
    return tok.encode(TEXT.read_text(encoding="utf-8"), add_special=False), tok.decode


def context_per_slot(shapes: list[list[Shape]]) -> int:
    """Positions one slot needs: the longest prompt plus the longest output, 10% and 64 for tokenization
    differences (a decoded window need not re-encode to the same count), in whole 256s."""
    need = max(s.prompt_tokens for c in shapes for s in c) * 1.1 + max(s.output_tokens for c in shapes for s in c)
    return int(math.ceil((need + 64) / 256) * 256)


# ---- servers --------------------------------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    name: str
    cmd: list[str]
    port: int
    body: dict
    env: dict | None = None
    shown: str = ""               # the command line as the results file shows it
    proc: subprocess.Popen | None = None
    log_path: Path | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, log_dir: Path) -> None:
        self.log_path = log_dir / f"{self.name}.log"
        with open(self.log_path, "w") as log:   # the child keeps its own copy of the descriptor
            self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT, env=self.env, cwd=ROOT)
        atexit.register(self.stop)   # an interrupted run must not leave a server behind

    async def wait_ready(self, timeout: float = 300.0) -> None:
        deadline = time.monotonic() + timeout
        async with aiohttp.ClientSession() as session:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"{self.name} exited with {self.proc.returncode}; see {self.log_path}")
                try:
                    async with session.get(self.url + "/health") as r:
                        if r.status == 200:
                            return
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.2)
        raise RuntimeError(f"{self.name} was not ready after {timeout:.0f} s; see {self.log_path}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


GREEDY = {"temperature": 0.0, "top_k": 1, "ignore_eos": True}


def inferd_server(path: Path, threads: int, concurrency: int, per_slot: int, extra: list[str]) -> Server:
    port = free_port()
    blocks = -(-concurrency * per_slot // 64)
    cmd = [sys.executable, "-m", "inferd.cli", "serve", "--model", str(path), "--port", str(port),
           "--threads", str(threads), "--max-running", str(concurrency), "--num-kv-blocks", str(blocks),
           "--no-measure-bandwidth", "--no-log-requests", "--prompt-cache-disk-mib", "0", "--log-level", "warning",
           *extra]
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    shown = command_line(["python", *cmd[1:]]).replace(f"--port {port}", "--port PORT")
    return Server("inferd", cmd, port, dict(GREEDY), env, shown)


def llama_server(bin_dir: Path, path: Path, threads: int, concurrency: int, per_slot: int, env: dict,
                 repack: bool) -> Server:
    port = free_port()
    cmd = [str(bin_dir / "llama-server"), "-m", str(path), "--host", "127.0.0.1", "--port", str(port),
           "-np", str(concurrency), "-c", str(per_slot * concurrency), "-t", str(threads), "-tb", str(threads),
           "-fa", "on", "-cram", "0", "-lv", "0", "--threads-http", "2", *([] if repack else ["-nr"])]
    shown = f"{peer_env_words(env)} {command_line(cmd)}".replace(f"--port {port}", "--port PORT")
    return Server("llama-server", cmd, port, dict(GREEDY), env, shown)


# ---- clients --------------------------------------------------------------------------------------------------

@dataclass
class RequestResult:
    ttft: float
    itls: list[float]
    chunks: int
    finish_reason: str | None


@dataclass
class LevelResult:
    server: str
    concurrency: int
    requests: int = 0
    output_tokens: int = 0
    chunks: int = 0
    wall_s: float = 0.0
    ttfts: list[float] = field(default_factory=list)
    itls: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def throughput(self) -> float:
        return self.output_tokens / self.wall_s if self.wall_s else 0.0

    @property
    def tokens_per_chunk(self) -> float:
        return self.output_tokens / self.chunks if self.chunks else float("nan")

    def ttft(self, q: float) -> float:
        return percentile(self.ttfts, q)

    def itl(self, q: float) -> float:
        return percentile(self.itls, q)

    def add(self, other: LevelResult) -> None:
        """Pool another repeat of the same level: throughput becomes all tokens over all wall time."""
        self.requests += other.requests
        self.output_tokens += other.output_tokens
        self.chunks += other.chunks
        self.wall_s += other.wall_s
        self.ttfts += other.ttfts
        self.itls += other.itls
        self.errors += other.errors


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    xs = sorted(values)
    k = (len(xs) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


async def one_request(session: aiohttp.ClientSession, server: Server, prompt: str, max_tokens: int) -> RequestResult:
    body = {"prompt": prompt, "stream": True, "max_tokens": max_tokens, **server.body}
    t0 = time.perf_counter()
    first = last = None
    itls: list[float] = []
    chunks = 0
    finish = None
    async with session.post(server.url + "/v1/completions", json=body) as r:
        if r.status != 200:
            raise RuntimeError(f"HTTP {r.status}: {(await r.text())[:300]}")
        async for line in r.content:
            if not line.startswith(b"data: "):
                continue
            data = line[6:].strip()
            if data == b"[DONE]":
                break
            event = msgspec.json.decode(data)   # the client shares the servers' cores: parse cheaply
            if "error" in event:
                raise RuntimeError(f"stream error: {event['error']}")
            choices = event.get("choices") or []
            if not choices:
                continue
            now = time.perf_counter()
            if choices[0].get("text"):
                chunks += 1
                if first is None:
                    first = now
                else:
                    itls.append(now - last)
                last = now
            finish = choices[0].get("finish_reason") or finish
    if first is None:
        raise RuntimeError("the stream had no text")
    return RequestResult(first - t0, itls, chunks, finish)


async def run_level(server: Server, requests: list[list[Request]]) -> LevelResult:
    """One closed-loop client per list of requests, each sending its own in order."""
    result = LevelResult(server.name, len(requests))
    timeout = aiohttp.ClientTimeout(total=1800)
    # a connection per request: llama-server closes a streamed response's connection, and the same rule for both
    connector = aiohttp.TCPConnector(limit=len(requests) + 2, force_close=True)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        await one_request(session, server, "Hello, this is a warm-up request.", 8)

        async def client(mine: list[Request]):
            for req in mine:
                try:
                    r = await one_request(session, server, req.prompt, req.max_tokens)
                except Exception as e:   # counted and reported, never silently dropped
                    result.errors.append(repr(e))
                    continue
                if r.finish_reason != "length":
                    result.errors.append(f"finish_reason {r.finish_reason!r} after {r.chunks} chunks")
                result.requests += 1
                result.output_tokens += req.max_tokens      # ignore_eos + finish_reason "length": exactly these
                result.chunks += r.chunks
                result.ttfts.append(r.ttft)
                result.itls.extend(r.itls)

        t0 = time.perf_counter()
        await asyncio.gather(*(client(mine) for mine in requests))
        result.wall_s = time.perf_counter() - t0
    return result


async def bench_server(server: Server, requests: list[list[Request]], log_dir: Path) -> LevelResult:
    server.start(log_dir)
    try:
        await server.wait_ready()
        return await run_level(server, requests)
    finally:
        server.stop()


# ---- report ---------------------------------------------------------------------------------------------------

def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b else "-"


METRICS = [("output tok/s", lambda r: r.throughput), ("TTFT p50 ms", lambda r: r.ttft(0.5) * 1e3),
           ("TTFT p95 ms", lambda r: r.ttft(0.95) * 1e3), ("ITL p50 ms", lambda r: r.itl(0.5) * 1e3),
           ("ITL p99 ms", lambda r: r.itl(0.99) * 1e3), ("ITL p99/p50", lambda r: r.itl(0.99) / r.itl(0.5)),
           ("tokens per chunk", lambda r: r.tokens_per_chunk)]


def table(results: dict[int, dict[str, LevelResult]]) -> list[str]:
    """One row per level and metric: llama-server, inferd, inferd / llama-server."""
    lines = ["| c | metric | llama-server | inferd | inferd / llama |", "| ---: | --- | ---: | ---: | ---: |"]
    for c, pair in results.items():
        ll, us = pair.get("llama-server"), pair["inferd"]
        for label, get in METRICS:
            digits = 1 if label.endswith(("tok/s", "ms")) else 2
            b = get(us)
            if ll is None:
                lines.append(f"| {c} | {label} | - | {b:.{digits}f} | - |")
                continue
            a = get(ll)
            lines.append(f"| {c} | {label} | {a:.{digits}f} | {b:.{digits}f} | {ratio(b, a)} |")
    return lines


def plot(results: dict[int, dict[str, LevelResult]], path: Path, title: str) -> bool:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install 'inferd[bench]'); no plot", file=sys.stderr)
        return False
    cs = list(results)
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    panels = [("output tokens/s", lambda r: r.throughput), ("TTFT p50 (ms)", lambda r: r.ttft(0.5) * 1e3),
              ("ITL p50 (ms)", lambda r: r.itl(0.5) * 1e3)]
    for ax, (label, get) in zip(axes, panels):
        for name, style in (("inferd", "o-"), ("llama-server", "s--")):
            if name not in results[cs[0]]:
                continue
            ax.plot(cs, [get(results[c][name]) for c in cs], style, label=name)
        ax.set_xlabel("concurrent streams")
        ax.set_ylabel(label)
        ax.set_xticks(cs)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


# ---- main -----------------------------------------------------------------------------------------------------

async def main_async(args) -> int:
    quick = args.quick
    levels = [int(c) for c in (args.concurrency or ("1,4" if quick and args.workload == "uniform" else
                                                     "4" if quick else LEVELS[args.workload])).split(",")]
    rounds = args.rounds or (1 if quick else ROUNDS[args.workload])
    repeats = args.repeats or (1 if quick else REPEATS[args.workload])
    bin_dir = llama_bin(args.bin)
    path = model_file(args.model, bin_dir)
    env = peer_env(args.peer_lib)
    peer = not args.inferd_only
    repack = (not peer or args.repack == "on"
              or args.repack == "auto" and repack_works(bin_dir, path, args.threads, env))
    text_ids, decode = text_token_ids(path)
    log_dir = Path(tempfile.mkdtemp(prefix="inferd-bench-serve-"))   # the servers' output, for post-mortems
    extra = args.inferd_args.split() if args.inferd_args else []
    from inferd import _cpu
    what = (f"{UNIFORM_PROMPT} prompt + {UNIFORM_OUTPUT} output tokens" if args.workload == "uniform" else
            f"mixed: prompts {MIXED_PROMPT[0]}-{MIXED_PROMPT[1]}, outputs {MIXED_OUTPUT[0]}-{MIXED_OUTPUT[1]} "
            f"tokens, every 4th after a shared {SYSTEM_TOKENS}-token system prompt, seed {args.seed}")
    who = "inferd vs llama-server" if peer else "inferd alone"
    title = (f"{who}, {path.name}, {args.threads} threads, {_cpu.get_path()} kernels, {what}, "
             f"{rounds} requests per client, {repeats} ABBA repeats pooled")
    print(title, flush=True)
    warning = busy_warning()
    if warning:
        print("WARNING: " + warning, flush=True)

    results: dict[int, dict[str, LevelResult]] = {}
    spread: dict[int, list[float]] = {}    # per-repeat throughput ratios
    commands: list[str] = [f"python {command_line(sys.argv)}", ""]
    for c in levels:
        shapes = uniform_shapes(c, rounds) if args.workload == "uniform" else mixed_shapes(c, rounds, args.seed)
        requests = render(shapes, text_ids, decode, args.seed + c)
        per_slot = context_per_slot(shapes)
        results[c] = {}
        spread[c] = []
        for rep in range(repeats):
            this = {}
            pair = (llama_server(bin_dir, path, args.threads, c, per_slot, env, repack),
                    inferd_server(path, args.threads, c, per_slot, extra))
            order = abba(rep, pair) if peer else pair[1:]
            if rep == 0:
                commands += [s.shown for s in pair if s in order]
            for server in order:
                r = await bench_server(server, requests, log_dir)
                this[server.name] = r
                print(f"c={c:<3} {server.name:<13} {r.throughput:7.1f} tok/s  TTFT p50 {r.ttft(0.5) * 1e3:7.1f} ms  "
                      f"p95 {r.ttft(0.95) * 1e3:7.1f} ms  ITL p50 {r.itl(0.5) * 1e3:6.1f} p99 "
                      f"{r.itl(0.99) * 1e3:6.1f} ms  {r.tokens_per_chunk:.2f} tok/chunk  ({r.requests} requests, "
                      f"{r.wall_s:.1f} s{', ERRORS: ' + str(len(r.errors)) if r.errors else ''})", flush=True)
                for e in r.errors[:3]:
                    print(f"    {e}", flush=True)
                if server.name in results[c]:
                    results[c][server.name].add(r)
                else:
                    results[c][server.name] = r
            if peer and this["llama-server"].throughput:
                spread[c].append(this["inferd"].throughput / this["llama-server"].throughput)

    stamp = time.strftime("%Y-%m-%d %H:%M")
    host = machine()
    lines = [f"# {title} ({stamp})", "", machine_line(host) + f" llama.cpp: {peer_build(bin_dir)}.", ""]
    lines += table(results)
    lines += [] if not peer else ["", "Throughput ratio of each repeat (min-max): " + "; ".join(
        f"c={c}: " + (fmt_range(xs, 2) if len(xs) > 1 else f"{xs[0]:.2f}x (1 repeat)") for c, xs in spread.items()
        if xs)]
    lines += ["", "ITL is the gap between text chunks; tokens per chunk 1.00 means one token per chunk."]
    if not repack:
        lines += ["", "llama.cpp's weight repacking died with SIGILL on this CPU (AMX the VM does not grant), so "
                      "llama-server ran with `-nr`."]
    if warning:
        lines += ["", f"**Warning**: {warning}."]
    errors = sum(len(r.errors) for pair in results.values() for r in pair.values())
    if errors:
        lines += ["", f"**{errors} requests failed or ended early** (see the JSON and {log_dir})."]
    lines += ["", "Commands (PORT: a free port; the first level's, the others differ in -np/-c and "
                  "--max-running/--num-kv-blocks):", "", "```", *commands, "```"]
    report = "\n".join(lines) + "\n"
    print("\n" + report)
    name = ("serve" + ("" if args.model == "smollm2-q4_0" else f"_{args.model}")
            + ("-mixed" if args.workload == "mixed" else "") + ("-quick" if quick else "")
            + ("" if peer else "-inferd"))
    raw = {str(c): {n: {"requests": r.requests, "repeat_ratios": spread[c], "output_tokens": r.output_tokens,
                        "chunks": r.chunks, "wall_s": r.wall_s, "throughput": r.throughput,
                        "ttft_p50": r.ttft(0.5), "ttft_p95": r.ttft(0.95), "itl_p50": r.itl(0.5),
                        "itl_p99": r.itl(0.99), "itl_p99_over_p50": r.itl(0.99) / r.itl(0.5) if r.itls else None,
                        "errors": r.errors}
                    for n, r in pair.items()} for c, pair in results.items()}
    write_results(args.out_dir / f"{name}.md", report,
                  {"kind": "serve", "title": title, "date": stamp, "machine": host, "peer_build": peer_build(bin_dir),
                   "model": args.model, "workload": args.workload, "commands": commands, "levels": raw})
    if plot(results, args.out_dir / f"{name}.png", title):
        print(f"wrote {args.out_dir / f'{name}.md'}, .json and .png")
    return 1 if errors else 0


def main() -> int:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))   # run the finally/atexit clean-ups on `timeout`
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--workload", choices=("uniform", "mixed"), default="uniform")
    ap.add_argument("--concurrency", help="comma-separated client counts (default: uniform 1,4,8,16; mixed 8,32)")
    ap.add_argument("--rounds", type=int, help="requests per client at each level (default: uniform 4, mixed 2)")
    ap.add_argument("--repeats", type=int, help="ABBA repeats of each level, pooled (default: uniform 3, mixed 2)")
    ap.add_argument("--seed", type=int, default=1, help="seed of the mixed workload's draws and prompt windows")
    ap.add_argument("--quick", action="store_true", help="a smoke test: small levels, 1 request per client, 1 repeat")
    ap.add_argument("--model", default="smollm2-q4_0", help="a model name of vs_llamacpp.py")
    ap.add_argument("--bin", type=Path, help="folder of llama.cpp's tools (default: ../shared/peers/llama-cpp.sh)")
    ap.add_argument("--peer-lib", type=Path, help="folder put first on llama-server's LD_LIBRARY_PATH")
    ap.add_argument("--repack", choices=("auto", "on", "off"), default="auto",
                    help="llama.cpp's weight repacking; auto: on unless a short llama-bench run dies with SIGILL")
    ap.add_argument("--inferd-only", action="store_true",
                    help="run inferd alone (no llama-server, no ratios): a quick look at one configuration")
    ap.add_argument("--inferd-args", default="", help="extra `inferd serve` options, e.g. '--speculative'")
    ap.add_argument("--out-dir", type=Path, default=HERE / "results")
    args = ap.parse_args()
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
