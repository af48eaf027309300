"""CPU the server's event loop spends per streamed token, for one or more source trees, interleaved.

    python bench/http_path.py --tree before=/tmp/base --tree after=. [-c 8,16] [--rounds 3] [--repeats 3]
                              [--endpoint chat|completions] [--model PATH] [--profile DIR]

Each tree (a checkout with its extension built in place) runs `inferd serve` as a subprocess (2 threads by
default); this process is the client: c closed-loop streaming clients, each sending `rounds` requests of about
100 prompt tokens (distinct prompts) that generate exactly `--tokens` tokens (`ignore_eos`, greedy). The trees take
turns (A, B, A, B, ...) `repeats` times at each c, so a drifting machine slows both alike.

Measured for each run, from /proc/<pid>/task/<tid>/schedstat (nanoseconds of CPU, not ticks):
  loop us/token   CPU of the server's main thread (the asyncio event loop: HTTP parsing, SSE writes, the wake-ups)
                  over the tokens streamed. It includes the per-request work (parsing, tokenizing, the response
                  head) spread over `--tokens` tokens; `--tokens 1` runs show that part alone.
  sched us/token  CPU of the scheduler thread (kernels it runs itself included) over the same tokens.
  tok/s, ITL p50/p99 of the client's view (a chunk may carry several tokens; the ITL is per chunk).
--profile DIR: also record the event loop with py-spy (one run per tree, after the timed ones; py-spy slows what it
samples) into DIR/<tree>-c<c>.txt as collapsed stacks, plus a top-of-stack summary.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import msgspec

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
TEXT = HERE / "data" / "gpl-3.txt"
DEFAULT_MODEL = Path.home() / ".cache" / "inferd" / "models" / "bench" / "SmolLM2-135M-Instruct.Q4_0.gguf"


def make_prompts(count: int, words_per_prompt: int = 75) -> list[str]:
    """Distinct prompts of about 100 tokens: windows of the GPL text at different word offsets."""
    words = TEXT.read_text(encoding="utf-8").split()
    return [" ".join(words[(i * 97) % (len(words) - 200) :][:words_per_prompt]) for i in range(count)]


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def thread_cpu_ns(pid: int) -> dict[str, int]:
    """CPU nanoseconds of the server's main thread ('loop'), scheduler thread ('sched') and all threads."""
    out = {"loop": 0, "sched": 0, "all": 0}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                ns = int(f.read().split()[0])
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                name = f.read().strip()
        except OSError:
            continue
        out["all"] += ns
        if int(tid) == pid:
            out["loop"] += ns
        elif name.startswith("inferd-schedul"):
            out["sched"] += ns
    return out


@dataclass
class Run:
    tree: str
    c: int
    tokens: int = 0
    requests: int = 0
    wall_s: float = 0.0
    cpu: dict[str, int] = field(default_factory=dict)
    itls: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def per_token_us(self, key: str) -> float:
        return self.cpu[key] / 1e3 / max(1, self.tokens)


class Server:
    def __init__(self, tree: Path, model: Path, threads: int, max_running: int, extra: list[str]):
        self.port = free_port()
        cmd = [sys.executable, "-m", "inferd.cli", "serve", "--model", str(model), "--port", str(self.port),
               "--threads", str(threads), "--max-running", str(max_running), "--no-measure-bandwidth",
               "--no-log-requests", "--log-level", "warning", *extra]
        env = {**os.environ, "PYTHONPATH": str(tree)}
        self.log = open(f"/tmp/http_path-{self.port}.log", "w")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env, cwd=tree)
        self.url = f"http://127.0.0.1:{self.port}"

    async def ready(self) -> None:
        async with aiohttp.ClientSession() as s:
            for _ in range(900):
                if self.proc.poll() is not None:
                    raise RuntimeError(f"the server exited; see {self.log.name}")
                try:
                    async with s.get(self.url + "/health") as r:
                        if r.status == 200:
                            return
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.2)
        raise RuntimeError("the server did not become ready")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


async def one(session: aiohttp.ClientSession, url: str, endpoint: str, prompt: str, n: int, run: Run) -> None:
    if endpoint == "chat":
        body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": n}
        path, key = "/v1/chat/completions", "delta"
    else:
        body = {"prompt": prompt, "max_tokens": n}
        path, key = "/v1/completions", "text"
    body.update(stream=True, temperature=0.0, ignore_eos=True, stream_options={"include_usage": True})
    last = None
    usage = None
    async with session.post(url + path, json=body) as r:
        if r.status != 200:
            run.errors.append(f"HTTP {r.status}")
            return
        async for line in r.content:
            if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                continue
            ev = msgspec.json.decode(line[6:])
            if ev.get("usage"):
                usage = ev["usage"]
            ch = ev.get("choices") or []
            if not ch:
                continue
            has_text = ch[0]["delta"].get("content") if key == "delta" else ch[0].get("text")
            if has_text:
                now = time.perf_counter()
                if last is not None:
                    run.itls.append(now - last)
                last = now
    if usage is None or usage["completion_tokens"] != n:
        run.errors.append(f"usage {usage}")
        return
    run.tokens += n
    run.requests += 1


async def load(server: Server, run: Run, prompts: list[str], endpoint: str, n: int) -> None:
    queue = list(prompts)
    conn = aiohttp.TCPConnector(limit=run.c + 2, force_close=True)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=600)) as session:
        await one(session, server.url, endpoint, "warm up", 4, Run("", 0))

        async def client():
            while queue:
                await one(session, server.url, endpoint, queue.pop(), n, run)

        before = thread_cpu_ns(server.proc.pid)
        t0 = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(run.c)))
        run.wall_s = time.perf_counter() - t0
        after = thread_cpu_ns(server.proc.pid)
    run.cpu = {k: after[k] - before[k] for k in after}


def profile(server: Server, out: Path, seconds: int) -> subprocess.Popen:
    return subprocess.Popen(["py-spy", "record", "-p", str(server.proc.pid), "-r", "1000", "-d", str(seconds),
                             "-f", "raw", "-o", str(out), "--nonblocking"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)


def summarize_profile(path: Path, top: int = 30) -> str:
    """Self and inclusive sample counts per function, event loop only (py-spy's raw format: one stack a line,
    `frame;frame... count`)."""
    self_counts: collections.Counter[str] = collections.Counter()
    incl: collections.Counter[str] = collections.Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        # the event loop's stacks, without its idle time in select()
        if not any(f.startswith("BaseEventLoop._run_once") for f in frames) or "select (selectors.py" in frames[-1]:
            continue
        n = int(count)
        total += n
        fs = [f.split(" (")[0] + " " + f.rsplit("/", 1)[-1].rstrip(")") for f in frames]
        if fs:
            self_counts[fs[-1]] += n
        for f in set(fs):
            incl[f] += n
    lines = [f"event-loop samples (busy): {total}", "", "self:"]
    lines += [f"  {n / total:6.1%}  {f}" for f, n in self_counts.most_common(top)]
    lines += ["", "inclusive:"]
    lines += [f"  {n / total:6.1%}  {f}" for f, n in incl.most_common(top)]
    return "\n".join(lines)


async def main_async(args) -> None:
    trees = [(t.split("=", 1)[0], Path(t.split("=", 1)[1]).resolve()) for t in args.tree]
    levels = [int(c) for c in args.concurrency.split(",")]
    extra = args.inferd_args.split() if args.inferd_args else []
    results: dict[tuple[str, int], list[Run]] = collections.defaultdict(list)
    prompts = make_prompts(4096)
    used = 0
    for c in levels:
        for rep in range(args.repeats):
            order = trees if rep % 2 == 0 else trees[::-1]  # ABBA
            for name, tree in order:
                server = Server(tree, args.model, args.threads, c, extra)
                try:
                    await server.ready()
                    run = Run(name, c)
                    mine = prompts[used % 4000 :][: c * args.rounds]
                    used += c * args.rounds
                    await load(server, run, mine, args.endpoint, args.tokens)
                    if args.profile and rep == args.repeats - 1:
                        args.profile.mkdir(parents=True, exist_ok=True)
                        raw = args.profile / f"{name}-c{c}.txt"
                        spy = profile(server, raw, args.profile_s)
                        prof = Run(name, c)
                        await asyncio.sleep(0.5)
                        while spy.poll() is None:
                            await load(server, prof, prompts[:c * 2], args.endpoint, args.tokens)
                        if raw.exists():
                            (args.profile / f"{name}-c{c}-summary.txt").write_text(summarize_profile(raw))
                finally:
                    server.stop()
                results[(name, c)].append(run)
                print(f"c={c:<3} {name:<8} loop {run.per_token_us('loop'):6.1f} us/tok  sched "
                      f"{run.per_token_us('sched'):7.1f} us/tok  all {run.per_token_us('all'):7.1f} us/tok  "
                      f"{run.tokens / run.wall_s:6.1f} tok/s  ITL p50 {pct(run.itls, .5) * 1e3:5.1f} ms  "
                      f"p99 {pct(run.itls, .99) * 1e3:6.1f} ms"
                      f"{'  ERRORS ' + str(run.errors[:3]) if run.errors else ''}",
                      flush=True)
    print()
    print("| c | tree | loop µs/token (median, runs) | process CPU µs/token | tok/s | ITL p50 ms | ITL p99 ms |")
    print("| ---: | --- | --- | ---: | ---: | ---: | ---: |")
    for (name, c), runs in results.items():
        loops = [r.per_token_us("loop") for r in runs]
        itls = [x for r in runs for x in r.itls]
        print(f"| {c} | {name} | {statistics.median(loops):.1f} ({', '.join(f'{x:.1f}' for x in loops)}) | "
              f"{statistics.median(r.per_token_us('all') for r in runs):.0f} | "
              f"{statistics.median(r.tokens / r.wall_s for r in runs):.0f} | {pct(itls, .5) * 1e3:.1f} | "
              f"{pct(itls, .99) * 1e3:.1f} |")


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * (len(xs) - 1) + 0.5))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree", action="append", required=True, help="NAME=PATH of a checkout built in place")
    ap.add_argument("-c", "--concurrency", default="8,16")
    ap.add_argument("--rounds", type=int, default=3, help="requests per client per run")
    ap.add_argument("--repeats", type=int, default=3, help="runs per tree and c, alternating the trees")
    ap.add_argument("--tokens", type=int, default=128, help="tokens each request generates")
    ap.add_argument("--endpoint", choices=("chat", "completions"), default="chat")
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--inferd-args", default="")
    ap.add_argument("--profile", type=Path, default=None, help="folder for py-spy profiles of the event loop")
    ap.add_argument("--profile-s", type=int, default=20)
    args = ap.parse_args()
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
