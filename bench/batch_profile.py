"""Stage profile of decode steps of B sequences at once (one token each) at a given depth, in one process and without
a server: where a served step of B streams spends its time (`bench/profile.py` does a single sequence).

    python bench/batch_profile.py [-m MODEL] [-b 16] [--depth 100] [--steps 24] [-t 2]

(MODEL: _common.decode_bench_args', a name of the REAL_FILES or a path.) Each sequence is primed with a `--depth`-token
prompt and 4 decode steps (untimed), then `--steps` steps run with the stage profiler on; prints the median step and
each stage's milliseconds per step with its share of the steps' wall time.
"""

from __future__ import annotations

import argparse
import statistics

from _common import bench_model_path, decode_bench_args
from batch_decode import batch_engine, step_times

from inferd.model.loader import load_model

WARM_UP = 4


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    decode_bench_args(ap)
    ap.add_argument("-b", "--batch", type=int, default=16)
    ap.add_argument("--depth", type=int, default=100, help="prompt tokens of each sequence before the timed steps")
    ap.add_argument("--steps", type=int, default=24)
    a = ap.parse_args()
    if a.depth < 1 or a.batch < 1 or a.steps < 1:
        ap.error("--depth, --batch and --steps must be at least 1")
    engine = batch_engine(load_model(bench_model_path(a.model)), a.batch, a.depth, WARM_UP + a.steps, a.threads)
    engine.wait_huge_pages()
    times, _ = step_times(engine, a.batch, a.steps, a.depth, warm_up=WARM_UP, profile=True)
    stages = engine._ctx.profile()
    engine._ctx.set_profiling(False)
    total = sum(times)
    print(f"{a.batch} sequences at depth {a.depth}, {a.threads} threads: median step "
          f"{statistics.median(times) * 1e3:.1f} ms over {a.steps} steps")
    for stage, t in sorted(stages.items(), key=lambda kv: -kv[1]):
        if t:
            print(f"  {stage:24s} {t / a.steps * 1e3:8.2f} ms/step {t / total:6.1%}")


if __name__ == "__main__":
    main()
