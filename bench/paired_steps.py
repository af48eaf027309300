"""Two builds' engine steps, paired: each build's engine in its own process, one step each in turn, so that the
machine's drift (other tenants, memory-bandwidth phases: +-10% between runs a minute apart) hits both alike and the
per-step ratio shows what a whole-run comparison cannot.

    python bench/paired_steps.py --tree A=/tmp/before --tree B=/tmp/after [-m MODEL] [-b 8,9,12,16] [--steps 200]
    python bench/paired_steps.py --tree A=/tmp/before --tree B=/tmp/after [-m MODEL] --prefill 512 [--steps 10]

(a tree: a checkout with its built extension; MODEL: _common.decode_bench_args', a name of the REAL_FILES or a path.)
Decode: for each batch size B, both processes load the model and prefill B sequences of a 100-token prompt; then
round k runs one decode step of all B sequences in A then B (B then A in odd rounds). Prefill: round k runs one step
of an N-token prompt at position 0 of one sequence in each. Steps are 5 ms apart so that the other engine's pool has
gone to sleep (pool.c's workers spin about 1 ms), and the first 4 rounds (prefill: 1) are not counted; an odd
--steps is rounded up, so that each build goes first as often as second. Prints each side's median and lower-quartile
step and the median and quartiles of the per-round ratio A / B (above 1: B is faster).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _common import decode_bench_args

WARM_UP = 4
PROMPT = 100

# what each side runs in its tree: its prompts, then one step (decode or prompt) per line read, its seconds written back
CHILD = r"""
import sys, time
sys.path.insert(0, "bench")
from _common import bench_model_path
from batch_decode import batch_engine, decoder, prompt_ids
from inferd.engine.runner import blocks_needed
from inferd.engine.types import SeqInput
from inferd.model.loader import load_model

model, (batch, rounds, prompt, threads, prefill) = sys.argv[1], map(int, sys.argv[2:7])
if prefill:   # the same prompt step at position 0 of one sequence, over and over
    engine = batch_engine(load_model(bench_model_path(model)), 1, prefill, 0, threads)
    one = SeqInput(prompt_ids(engine, 0, prefill), 0, list(range(blocks_needed(prefill + 1))), 1,
                   state_slot=0 if engine.num_state_slots else -1)
    step = lambda: engine.step([one])
else:
    engine = batch_engine(load_model(bench_model_path(model)), batch, prompt, rounds, threads)
    step = decoder(engine, batch, rounds, prompt)
engine.wait_huge_pages()
print("ready", flush=True)
for _ in range(rounds):
    sys.stdin.readline()
    t0 = time.perf_counter()
    step()
    print(time.perf_counter() - t0, flush=True)
"""


def side(tree: Path, model: str, batch: int, rounds: int, threads: int, prefill: int) -> subprocess.Popen[str]:
    args = [model, batch, rounds, PROMPT, threads, prefill]
    p = subprocess.Popen([sys.executable, "-c", CHILD, *map(str, args)], cwd=tree,
                         env={**os.environ, "PYTHONPATH": str(tree)}, text=True, stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE)
    assert p.stdout is not None
    if p.stdout.readline().strip() != "ready":
        raise SystemExit(f"{tree}: the engine did not start (its output is above)")
    return p


def one_step(p: subprocess.Popen[str]) -> float:
    assert p.stdin is not None and p.stdout is not None
    time.sleep(0.005)
    p.stdin.write("go\n")
    p.stdin.flush()
    return float(p.stdout.readline()) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    decode_bench_args(ap)
    ap.add_argument("--tree", action="append", required=True, help="NAME=PATH, twice")
    ap.add_argument("-b", "--batches", default="8,9,12,16")
    ap.add_argument("--steps", type=int, default=200, help="rounds counted")
    ap.add_argument("--prefill", type=int, default=0, help="time N-token prompt steps instead of decode steps")
    a = ap.parse_args()
    trees = [t.split("=", 1) for t in a.tree]
    if len(trees) != 2 or any(len(t) != 2 for t in trees):
        ap.error("--tree NAME=PATH, exactly twice")
    (na, ta), (nb, tb) = trees
    warm_up = 1 if a.prefill else WARM_UP
    counted = a.steps + a.steps % 2
    for b in [1] if a.prefill else [int(x) for x in a.batches.split(",")]:
        procs = [side(Path(t), a.model, b, counted + warm_up, a.threads, a.prefill) for t in (ta, tb)]
        times: list[list[float]] = [[], []]
        for k in range(counted + warm_up):
            for i in ((0, 1) if (k - warm_up) % 2 == 0 else (1, 0)):
                ms = one_step(procs[i])
                if k >= warm_up:
                    times[i].append(ms)
        for p in procs:
            assert p.stdin is not None
            p.stdin.close()
            p.wait()
        ratios = [x / y for x, y in zip(*times)]
        q = [statistics.quantiles(v, n=4) for v in (*times, ratios)]
        what = f"{a.prefill}-token prompt" if a.prefill else f"{b} sequences"
        print(f"{what}: {na} median {statistics.median(times[0]):.2f} ms (p25 {q[0][0]:.2f}), {nb} median "
              f"{statistics.median(times[1]):.2f} ms (p25 {q[1][0]:.2f}); {na} / {nb} per round: median "
              f"{statistics.median(ratios):.3f}, quartiles {q[2][0]:.3f}-{q[2][2]:.3f}", flush=True)


if __name__ == "__main__":
    main()
