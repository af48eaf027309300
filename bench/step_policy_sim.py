"""The scheduler's step bound under a step-cost model: the real policy, an engine that only counts, a virtual clock.

    python bench/step_policy_sim.py [--costs smollm2|qwen1.5b|qwen1.5b-amd|F,ROW,TOKEN] [--workload uniform|mixed]
                                    [-c 8,16] [--rounds 8] [--noise 0.1]

A step of d decode rows and C prompt tokens 'takes' F + ROW * d + TOKEN * C milliseconds (times a seeded
log-normal noise factor, --noise its sigma), what bench/step_mix.py measures on a real engine; the policy
(inferd/engine/scheduler.py, its cost fit included) sees those times. c closed-loop clients each send --rounds
requests back to back (bench/serve.py's workloads: uniform 100 prompt + 64 output tokens; mixed 50-2000 / 16-256,
every fourth after a shared 1000-token system prompt, which the prefix cache then holds). Per configuration
(step_latency_factor K and the scheduler's pace_steps; off): output tok/s, TTFT p50/p95, ITL p50/p99 and p99/p50 on the
virtual clock. Deterministic and quick (no model runs): for choosing defaults; the real engine's numbers come
from bench/serve.py.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from inferd.engine.loop import run_batch  # noqa: E402
from inferd.engine.request import Request, RequestState  # noqa: E402
from inferd.engine.scheduler import Scheduler  # noqa: E402
from inferd.engine.types import SamplingParams  # noqa: E402

# (fixed, per decode row, per prompt token) ms at 2 threads: SmolLM2 Q4_0 and Qwen2.5-Coder-1.5B Q4_K_M on an
# AVX-VNNI machine (decode steps from the ITL medians of bench/results/serve*.md at c = 4/8/16, prompt tokens from
# pp512 in bench/results/vs_llamacpp.md; Qwen's prompt token a guess near its decode row), and Qwen on a Zen 3
# (AVX2) machine (tg128 and pp512 of bench/results/vs_llamacpp_real.md, its c = 8 decode step in
# bench/results/step_latency/)
COSTS = {"smollm2": (2.0, 1.3, 0.5), "qwen1.5b": (31.0, 4.25, 4.0), "qwen1.5b-amd": (40.0, 15.0, 12.6)}
GREEDY = SamplingParams(temperature=0.0)


@dataclass
class Out:
    tokens: list
    logprobs: list
    top_logprobs: list
    logits: object = None
    state: object = None


class CountingEngine:
    """What the policy needs of an engine; a step returns token 7 for each sampled row."""

    block_size = 64
    max_batch_tokens = 512
    max_logits_rows = 512

    def __init__(self, num_kv_blocks: int, max_seqs: int):
        self.num_kv_blocks = num_kv_blocks
        self.max_seqs = max_seqs

    def step(self, seqs):
        return [Out([7] * s.num_sampled, [0.0] * s.num_sampled, []) for s in seqs]


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def requests(kind: str, c: int, rounds: int, seed: int) -> list[list[tuple[list[int], int]]]:
    rng = random.Random(seed)
    system = [rng.randrange(1, 999) for _ in range(1000)]
    out = []
    for client in range(c):
        mine = []
        for j in range(rounds):
            if kind == "uniform":
                mine.append(([rng.randrange(1, 999) for _ in range(100)], 64))
                continue
            shared = (client * rounds + j) % 4 == 0
            n = rng.randint(1050 if shared else 50, 2000)
            own = [rng.randrange(1, 999) for _ in range(n - (1000 if shared else 0))]
            mine.append(((system if shared else []) + own, rng.randint(16, 256)))
        out.append(mine)
    return out


def simulate(costs, kind: str, c: int, rounds: int, factor: float, pace: int, noise: float, seed: int):
    fixed, per_row, per_token = (x / 1000 for x in costs)
    engine = CountingEngine(num_kv_blocks=c * 40, max_seqs=c)
    clock = Clock()
    sched = Scheduler(engine, max_model_len=2560, max_running=c, max_prefill_while_decoding=256,
                      step_latency_factor=factor or None, clock=clock)
    sched.pace_steps = pace or 1 << 30
    todo = requests(kind, c, rounds, seed)
    owner: dict[str, int] = {}
    rng = random.Random(seed + 1)
    tokens, ttfts, itls = 0, [], []

    def submit(client: int) -> None:
        if todo[client]:
            prompt, max_tokens = todo[client].pop(0)
            rid = f"{client}/{len(todo[client])}"
            owner[rid] = client
            sched.add(RequestState(Request(rid, prompt, params=GREEDY, max_tokens=max_tokens), arrival_time=clock()))

    for client in range(c):
        submit(client)
    while sched.has_work:
        batch = sched.schedule()
        rows = sum(s.num_new for s in batch.seqs if s.num_sampled and s.num_new == s.num_sampled)
        prompt = sum(s.num_new for s in batch.seqs if s.num_new != s.num_sampled)
        seconds = (fixed + per_row * rows + per_token * prompt) * math.exp(rng.gauss(0.0, noise))
        outputs = run_batch(engine, batch)
        clock.now += seconds
        stats = sched.postprocess(batch, outputs)
        sched.observe(batch, seconds)
        sched.take_outputs()
        tokens += stats.num_decode_tokens
        ttfts += stats.ttfts
        itls += stats.itls
        for st in stats.finished:
            submit(owner[st.request.request_id])
    return tokens / clock.now, ttfts, itls


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * (len(xs) - 1) + 0.5))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--costs", default="smollm2", help=f"{', '.join(COSTS)} or F,ROW,TOKEN in ms")
    ap.add_argument("--workload", choices=("uniform", "mixed"), default="uniform")
    ap.add_argument("-c", "--concurrency", default="8,16")
    ap.add_argument("--rounds", type=int, default=8, help="requests per client")
    ap.add_argument("--factors", default="0,1.5,2,3,4", help="step_latency_factor values (0: off)")
    ap.add_argument("--pace", default="32", help="pace_steps values (0: no pacing)")
    ap.add_argument("--noise", type=float, default=0.1, help="sigma of the log-normal noise on each step's time")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    costs = COSTS.get(args.costs) or tuple(float(x) for x in args.costs.split(","))
    print(f"costs {args.costs} (fixed, per decode row, per prompt token: {costs} ms), {args.workload} load, "
          f"{args.rounds} requests per client, noise {args.noise}\n")
    print("| c | policy | tok/s | TTFT p50 ms | TTFT p95 ms | ITL p50 ms | ITL p99 ms | p99/p50 |")
    print("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for c in (int(x) for x in args.concurrency.split(",")):
        for factor in (float(x) for x in args.factors.split(",")):
            for pace in [int(x) for x in args.pace.split(",")] if factor else [0]:
                rate, ttfts, itls = simulate(costs, args.workload, c, args.rounds, factor, pace, args.noise,
                                             args.seed)
                name = f"K={factor:g}" + (f", pace {pace}" if pace else ", no pacing") if factor else "off (cap 256)"
                print(f"| {c} | {name} | {rate:.1f} | {pct(ttfts, .5) * 1e3:.0f} | {pct(ttfts, .95) * 1e3:.0f} | "
                      f"{pct(itls, .5) * 1e3:.1f} | {pct(itls, .99) * 1e3:.1f} | "
                      f"{pct(itls, .99) / pct(itls, .5):.2f} |", flush=True)


if __name__ == "__main__":
    main()
