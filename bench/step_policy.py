"""The scheduler's step bound on the real engine, without HTTP: c closed-loop streams per configuration.

    python bench/step_policy.py [-m MODEL] [-c 8] [--requests 32] [--workload uniform|mixed] [--repeats 2]
                                [--config off=0 --config K2=2 --config ms150=ms:150 ...]

Each configuration (NAME=K: step_latency_factor K, 0 for off; NAME=ms:X: max_step_latency_ms X) drives a Scheduler
over one Engine in this process: c requests at once, and a new one the moment one finishes, until --requests have
run (uniform: 100 random prompt tokens, 64 out; mixed: prompts 50-2000, outputs 16-256, every fourth after a
shared 1000-token system prompt, as bench/serve.py). The configurations take turns (A B .. B A), each with a fresh
scheduler on the same engine. Reported (repeats pooled): output tok/s, TTFT p50/p95 and ITL p50/p99 on the
scheduler's clock (no client, no HTTP: what the policy alone does), and the steps: the share that carried prompt
tokens beside decodes, their mean prompt tokens, and the longest such step over the median decode-only step.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from pathlib import Path

from inferd.engine.engine import Engine
from inferd.engine.loop import run_batch
from inferd.engine.request import Request, RequestState
from inferd.engine.runner import blocks_needed
from inferd.engine.scheduler import Scheduler
from inferd.engine.types import SamplingParams
from inferd.model.loader import load_model

DEFAULT_MODEL = Path.home() / ".cache" / "inferd" / "models" / "bench" / "SmolLM2-135M-Instruct.Q4_0.gguf"
GREEDY = SamplingParams(temperature=0.0)
VOCAB = 2000  # prompt ids drawn below this: valid in every model


def workload(kind: str, n: int, seed: int) -> list[tuple[list[int], int]]:
    rng = random.Random(seed)
    if kind == "uniform":
        return [([rng.randrange(1, VOCAB) for _ in range(100)], 64) for _ in range(n)]
    system = [rng.randrange(1, VOCAB) for _ in range(1000)]
    out = []
    for i in range(n):
        shared = i % 4 == 0
        length = rng.randint(1050 if shared else 50, 2000)
        own = [rng.randrange(1, VOCAB) for _ in range(length - (1000 if shared else 0))]
        out.append(((system if shared else []) + own, rng.randint(16, 256)))
    return out


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * (len(xs) - 1) + 0.5))] if xs else float("nan")


class Result:
    def __init__(self) -> None:
        self.tokens = 0
        self.wall_s = 0.0
        self.ttfts: list[float] = []
        self.itls: list[float] = []
        self.decode_only: list[float] = []  # seconds of steps with decodes and no prompt tokens
        self.mixed: list[tuple[float, int]] = []  # (seconds, prompt tokens) of steps with both
        self.steps = 0


def run(engine: Engine, config: str, jobs: list[tuple[list[int], int]], c: int, res: Result) -> None:
    factor, ms = (0.0, float(config[3:])) if config.startswith("ms:") else (float(config), 0.0)
    sched = Scheduler(engine, max_model_len=4096, max_running=c, max_prefill_while_decoding=256,
                      max_step_latency_s=ms / 1000 or None, step_latency_factor=factor or None)
    queue = list(reversed(jobs))

    def submit() -> None:
        prompt, max_tokens = queue.pop()
        request = Request(f"r{len(queue)}", prompt, params=GREEDY, max_tokens=max_tokens, detokenize=False)
        sched.add(RequestState(request, arrival_time=time.monotonic()))

    for _ in range(min(c, len(queue))):
        submit()
    t0 = time.perf_counter()
    while sched.has_work:
        batch = sched.schedule()
        s0 = time.perf_counter()
        outputs = run_batch(engine, batch)
        dt = time.perf_counter() - s0
        stats = sched.postprocess(batch, outputs)
        sched.observe(batch, dt)
        sched.take_outputs()
        res.steps += 1
        res.tokens += stats.num_decode_tokens
        res.ttfts += stats.ttfts
        res.itls += stats.itls
        decodes = any(s.num_sampled and s.num_new == s.num_sampled for s in batch.seqs)
        prompt = sum(s.num_new for s in batch.seqs if s.num_new != s.num_sampled)
        if decodes:
            (res.mixed.append((dt, prompt)) if prompt else res.decode_only.append(dt))
        for _ in stats.finished:
            if queue:
                submit()
    res.wall_s += time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", type=Path, default=DEFAULT_MODEL)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-c", "--concurrency", type=int, default=8)
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--workload", choices=("uniform", "mixed"), default="uniform")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--config", action="append", help="NAME=K (step_latency_factor, 0: off) or NAME=ms:X")
    args = ap.parse_args()
    configs = [tuple(c.split("=", 1)) for c in (args.config or ["off=0", "K2=2", "K3=3"])]
    model = load_model(args.model)
    per_seq = blocks_needed(2000 + 256 + 64)
    engine = Engine(model, num_kv_blocks=args.concurrency * per_seq, max_batch_tokens=512,
                    max_seqs=args.concurrency, threads=args.threads)
    jobs = workload(args.workload, args.requests, args.seed)
    pooled = {name: Result() for name, _ in configs}
    for rep in range(args.repeats):
        for name, config in configs if rep % 2 == 0 else configs[::-1]:
            one = Result()
            run(engine, config, jobs, args.concurrency, one)
            p = pooled[name]
            for key in ("tokens", "wall_s", "steps"):
                setattr(p, key, getattr(p, key) + getattr(one, key))
            for key in ("ttfts", "itls", "decode_only", "mixed"):
                getattr(p, key).extend(getattr(one, key))
            print(f"{name:<8} {one.tokens / one.wall_s:7.1f} tok/s  ITL p50 {pct(one.itls, .5) * 1e3:7.1f} "
                  f"p99 {pct(one.itls, .99) * 1e3:7.1f} ms", flush=True)
    print(f"\n{args.model.name}, {args.threads} threads, {args.workload} load, c={args.concurrency}, "
          f"{args.requests} requests x {args.repeats} repeats, in-process (scheduler clock)\n")
    print("| config | tok/s | TTFT p50 ms | TTFT p95 ms | ITL p50 ms | ITL p99 ms | p99/p50 | steps with a chunk "
          "| mean chunk | longest / decode step |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, p in pooled.items():
        base = statistics.median(p.decode_only) if p.decode_only else float("nan")
        longest = max((t for t, _ in p.mixed), default=float("nan"))
        share = len(p.mixed) / max(1, len(p.mixed) + len(p.decode_only))
        chunk = statistics.mean(n for _, n in p.mixed) if p.mixed else 0.0
        print(f"| {name} | {p.tokens / p.wall_s:.1f} | {pct(p.ttfts, .5) * 1e3:.0f} | {pct(p.ttfts, .95) * 1e3:.0f} | "
              f"{pct(p.itls, .5) * 1e3:.1f} | {pct(p.itls, .99) * 1e3:.1f} | "
              f"{pct(p.itls, .99) / pct(p.itls, .5):.2f} | {share:.0%} | {chunk:.0f} | {longest / base:.1f}x |")


if __name__ == "__main__":
    main()
