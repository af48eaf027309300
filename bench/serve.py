"""Serving benchmark: `inferd serve` vs `llama-server` under closed-loop streaming clients, in one run.

    python bench/serve.py [-t 2] [--concurrency 1,4,8,16] [--rounds 4] [--repeats 3] [--quick] [--model smollm2-q4_0]

For each concurrency c, each server in turn runs as a subprocess on 127.0.0.1 (llama-server with -np c, a context
of c slots, the same GGUF and threads; inferd with the same threads), gets one warm-up request, then c clients each
send `rounds` streaming /v1/completions requests back to back (closed loop). The pair runs `repeats` times,
alternating (llama, inferd, llama, inferd, ...), and each server's repeats are pooled: on a machine whose speed
drifts from minute to minute (a shared VM moved single runs by 15%), both servers then see the same conditions.
Every request has its own prompt of about 100 tokens (different offsets into a long text, so no two share a prefix
block) and generates exactly 64 tokens (`ignore_eos`, greedy). Measured per server and c:
  throughput  output tokens / wall time of the whole level (first request sent -> last one finished)
  TTFT        request sent -> first text chunk (p50, p95)
  ITL         gap between consecutive text chunks (p50; a chunk is one token for both servers here)
Prints a markdown table with the inferd/llama ratios, and writes it with the raw numbers (JSON) and a PNG plot
under bench/results/, with each repeat's own throughput ratio. --quick: c = 1 and 4, 2 rounds, 1 repeat (checks
that the script works, numbers are noisy).
"""
from __future__ import annotations

import argparse
import asyncio
import atexit
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import msgspec

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

from vs_llamacpp import llama_bin, model_file

PROMPT_TOKENS = 100
OUTPUT_TOKENS = 64
TEXT = HERE / "data" / "gpl-3.txt"


# ---- prompts -------------------------------------------------------------------------------------------------

def make_prompts(model_path: Path, count: int) -> list[str]:
    """`count` distinct prompts of about PROMPT_TOKENS tokens: windows of the GPL text starting at different
    words (so no two prompts share a first block), cut to PROMPT_TOKENS tokens with the model's own tokenizer."""
    from inferd.model.loader import load_model
    tok = load_model(model_path).tokenizer
    words = TEXT.read_text(encoding="utf-8").split()
    prompts = []
    for i in range(count):
        start = (i * 97) % (len(words) - 400)
        ids = tok.encode(" ".join(words[start:start + 150]), add_special=False)[:PROMPT_TOKENS]
        prompts.append(tok.decode(ids))
    return prompts


# ---- servers -------------------------------------------------------------------------------------------------

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

    async def wait_ready(self, timeout: float = 180.0) -> None:
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


def inferd_server(path: Path, threads: int, concurrency: int, extra: list[str]) -> Server:
    port = free_port()
    cmd = [sys.executable, "-m", "inferd.cli", "serve", "--model", str(path), "--port", str(port),
           "--threads", str(threads), "--max-running", str(max(concurrency, 1)), "--no-measure-bandwidth",
           "--no-log-requests", "--log-level", "warning", *extra]
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    body = {"max_tokens": OUTPUT_TOKENS, "ignore_eos": True}
    return Server("inferd", cmd, port, body, env)


def llama_server(bin_dir: Path, path: Path, threads: int, concurrency: int) -> Server:
    port = free_port()
    per_slot = 2 * (PROMPT_TOKENS + OUTPUT_TOKENS + 32)        # room for tokenization differences
    cmd = [str(bin_dir / "llama-server"), "-m", str(path), "--host", "127.0.0.1", "--port", str(port),
           "-np", str(concurrency), "-c", str(per_slot * concurrency), "-t", str(threads), "-tb", str(threads)]
    body = {"max_tokens": OUTPUT_TOKENS, "n_predict": OUTPUT_TOKENS, "ignore_eos": True}
    return Server("llama-server", cmd, port, body)


# ---- clients -------------------------------------------------------------------------------------------------

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
    wall_s: float = 0.0
    ttfts: list[float] = field(default_factory=list)
    itls: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def throughput(self) -> float:
        return self.output_tokens / self.wall_s if self.wall_s else 0.0

    def ttft(self, q: float) -> float:
        return percentile(self.ttfts, q)

    def itl(self, q: float) -> float:
        return percentile(self.itls, q)

    def add(self, other: "LevelResult") -> None:
        """Pool another repeat of the same level: throughput becomes all tokens over all wall time."""
        self.requests += other.requests
        self.output_tokens += other.output_tokens
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


async def one_request(session: aiohttp.ClientSession, server: Server, prompt: str) -> RequestResult:
    body = {"prompt": prompt, "temperature": 0.0, "stream": True, **server.body}
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


async def run_level(server: Server, concurrency: int, prompts: list[str]) -> LevelResult:
    """`concurrency` closed-loop clients share `prompts` (each prompt used once)."""
    result = LevelResult(server.name, concurrency)
    queue = list(prompts)
    timeout = aiohttp.ClientTimeout(total=600)
    # a connection per request: llama-server closes a streamed response's connection, and the same rule for both
    connector = aiohttp.TCPConnector(limit=concurrency + 2, force_close=True)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        await one_request(session, server, "Hello, this is a warm-up request.")

        async def client():
            while queue:
                prompt = queue.pop()
                try:
                    r = await one_request(session, server, prompt)
                except Exception as e:   # counted and reported, never silently dropped
                    result.errors.append(repr(e))
                    continue
                if r.finish_reason != "length":
                    result.errors.append(f"finish_reason {r.finish_reason!r} after {r.chunks} chunks")
                result.requests += 1
                result.output_tokens += OUTPUT_TOKENS
                result.ttfts.append(r.ttft)
                result.itls.extend(r.itls)

        t0 = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(concurrency)))
        result.wall_s = time.perf_counter() - t0
    return result


async def bench_server(server: Server, concurrency: int, prompts: list[str], log_dir: Path) -> LevelResult:
    server.start(log_dir)
    try:
        await server.wait_ready()
        return await run_level(server, concurrency, prompts)
    finally:
        server.stop()


# ---- report --------------------------------------------------------------------------------------------------

def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b else "-"


def table(results: dict[int, dict[str, LevelResult]]) -> list[str]:
    head = ("| c | llama tok/s | inferd tok/s | ratio | llama TTFT p50 ms | inferd TTFT p50 ms | ratio | "
            "llama TTFT p95 ms | inferd TTFT p95 ms | ratio | llama ITL p50 ms | inferd ITL p50 ms | ratio |")
    lines = [head, "| ---: " * 13 + "|"]
    for c, pair in results.items():
        ll, us = pair["llama-server"], pair["inferd"]
        cells = [str(c), f"{ll.throughput:.1f}", f"{us.throughput:.1f}", ratio(us.throughput, ll.throughput)]
        for get in (lambda r: r.ttft(0.5), lambda r: r.ttft(0.95), lambda r: r.itl(0.5)):
            a, b = get(ll) * 1e3, get(us) * 1e3
            cells += [f"{a:.1f}", f"{b:.1f}", ratio(b, a)]
        lines.append("| " + " | ".join(cells) + " |")
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
            ax.plot(cs, [get(results[c][name]) for c in cs], style, label=name)
        ax.set_xlabel("concurrent streams")
        ax.set_ylabel(label)
        ax.set_xticks(cs)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


# ---- main ----------------------------------------------------------------------------------------------------

async def main_async(args) -> int:
    levels = [1, 4] if args.quick else [int(c) for c in args.concurrency.split(",")]
    rounds = 2 if args.quick else args.rounds
    repeats = 1 if args.quick else args.repeats
    bin_dir = llama_bin()
    path = model_file(args.model, bin_dir)
    per_server = sum(c * rounds for c in levels) * repeats
    prompts = make_prompts(path, 2 * per_server)
    log_dir = Path(tempfile.mkdtemp(prefix="inferd-bench-serve-"))   # the servers' output, for post-mortems
    extra = args.inferd_args.split() if args.inferd_args else []
    from inferd import _cpu
    title = (f"inferd vs llama-server, {path.name}, {args.threads} threads, {_cpu.get_path()} kernels, "
             f"{PROMPT_TOKENS} prompt + {OUTPUT_TOKENS} output tokens, {rounds} requests per client, "
             f"{repeats} alternating repeats pooled")
    print(title, flush=True)
    warning = busy_warning()
    if warning:
        print("WARNING: " + warning, flush=True)

    results: dict[int, dict[str, LevelResult]] = {}
    spread: dict[int, list[float]] = {}    # per-repeat throughput ratios
    used = 0
    for c in levels:
        results[c] = {}
        spread[c] = []
        # llama, inferd, llama, inferd, ...: a machine whose speed drifts (a shared VM) slows both alike
        for rep in range(repeats):
            this = {}
            for server in (llama_server(bin_dir, path, args.threads, c), inferd_server(path, args.threads, c, extra)):
                mine = prompts[used:used + c * rounds]
                used += c * rounds
                r = await bench_server(server, c, mine, log_dir)
                this[server.name] = r
                print(f"c={c:<3} {server.name:<13} {r.throughput:7.1f} tok/s  TTFT p50 {r.ttft(0.5) * 1e3:7.1f} ms  "
                      f"p95 {r.ttft(0.95) * 1e3:7.1f} ms  ITL p50 {r.itl(0.5) * 1e3:6.1f} ms  ({r.requests} requests, "
                      f"{r.wall_s:.1f} s{', ERRORS: ' + str(len(r.errors)) if r.errors else ''})", flush=True)
                for e in r.errors[:3]:
                    print(f"    {e}", flush=True)
                if server.name in results[c]:
                    results[c][server.name].add(r)
                else:
                    results[c][server.name] = r
            if this["llama-server"].throughput:
                spread[c].append(this["inferd"].throughput / this["llama-server"].throughput)

    stamp = time.strftime("%Y-%m-%d %H:%M")
    lines = [f"# {title} ({stamp})", ""] + table(results)
    if repeats > 1:
        lines += ["", "Throughput ratio of each repeat on its own: " + "; ".join(
            f"c={c}: " + ", ".join(f"{x:.2f}x" for x in xs) for c, xs in spread.items())]
    if warning:
        lines += ["", f"**Warning**: {warning}."]
    errors = sum(len(r.errors) for pair in results.values() for r in pair.values())
    if errors:
        lines += ["", f"**{errors} requests failed or ended early** (see the JSON and {log_dir})."]
    report = "\n".join(lines) + "\n"
    print("\n" + report)
    suffix = "-quick" if args.quick else ""
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / f"serve{suffix}.md").write_text(report)
    raw = {str(c): {name: {"requests": r.requests, "repeat_ratios": spread[c], "output_tokens": r.output_tokens,
                           "wall_s": r.wall_s,
                           "throughput": r.throughput, "ttft_p50": r.ttft(0.5), "ttft_p95": r.ttft(0.95),
                           "itl_p50": r.itl(0.5), "errors": r.errors}
                    for name, r in pair.items()} for c, pair in results.items()}
    (args.out_dir / f"serve{suffix}.json").write_text(json.dumps({"title": title, "date": stamp, "levels": raw},
                                                                 indent=1) + "\n")
    if plot(results, args.out_dir / f"serve{suffix}.png", title):
        print(f"wrote {args.out_dir / f'serve{suffix}.md'}, .json and .png")
    return 1 if errors else 0


def cpu_busy(seconds: float = 1.0) -> float:
    """Fraction of all cores busy over `seconds` (from /proc/stat; 0 where it cannot be read)."""
    def sample():
        with open("/proc/stat") as f:
            values = [int(x) for x in f.readline().split()[1:]]
        return sum(values), values[3] + values[4]   # total, idle + iowait
    try:
        t0, i0 = sample()
        time.sleep(seconds)
        t1, i1 = sample()
    except (OSError, ValueError, IndexError):
        return 0.0
    return 1.0 - (i1 - i0) / max(1, t1 - t0)


def busy_warning() -> str | None:
    """Both servers should get every core: another busy process makes the numbers meaningless (say so)."""
    busy = cpu_busy()
    if busy > 0.15:
        return (f"other processes kept {busy:.0%} of the cores busy just before the run; they compete with the "
                f"servers, so these numbers are unreliable")
    return None


def main() -> int:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))   # run the finally/atexit clean-ups on `timeout`
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--concurrency", default="1,4,8,16", help="comma-separated client counts")
    ap.add_argument("--rounds", type=int, default=4, help="requests per client at each concurrency")
    ap.add_argument("--repeats", type=int, default=3,
                    help="times each level runs per server, alternating the servers; the table pools them")
    ap.add_argument("--quick", action="store_true", help="c = 1 and 4, 2 rounds: check that it works")
    ap.add_argument("--model", default="smollm2-q4_0", help="smollm2-q4_0|q4_1|q8_0 (see vs_llamacpp.py)")
    ap.add_argument("--inferd-args", default="", help="extra `inferd serve` options, e.g. '--speculative'")
    ap.add_argument("--out-dir", type=Path, default=HERE / "results")
    args = ap.parse_args()
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
