"""Decode speed from the moment the weights are loaded: while they are still on 4 KB pages and being collapsed into
2 MB pages on their low-priority thread (ext/cpu/hugemem.c), and after. Single-token greedy decode steps in this
checkout's engine, one process, no server, timed in windows of `--window` steps.

    python bench/decode_huge_pages.py LABEL [--model qwen2.5-coder-1.5b-q4_k_m] [--window 16] [--after 8] [-t 2]

Prints one line per window (seconds since the load, the weights' huge-page state, median step, tok/s, and the median
CPU time of a step on the calling thread), then the medians of the windows run while collapsing and of the
`--after` windows once done. With `-t 1` the calling thread does all of a step, so its CPU time is the step's work
with its memory stalls, and a neighbour that takes the core away does not count in it: the figure to compare on a
shared machine. A checkout without the collapse (weights faulted straight into huge pages) reports its state as
"at load".
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from decode_steps import GreedyDecoder, add_arguments  # noqa: E402

MAX_WINDOWS = 400


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(ap)
    ap.add_argument("--window", type=int, default=16)
    ap.add_argument("--after", type=int, default=8, help="windows once the weights are in huge pages")
    args = ap.parse_args()
    decoder = GreedyDecoder(args.model, args.threads)
    t_load = time.perf_counter()

    def state() -> str:
        return getattr(decoder.engine, "huge_pages", "at load")

    during: list[tuple[float, float]] = []
    after: list[tuple[float, float]] = []
    done_at = None
    for _ in range(MAX_WINDOWS):
        before = state()
        times, cpu = [], []
        for _ in range(args.window):
            t0, c0 = time.perf_counter(), time.thread_time()
            decoder.step()
            times.append(time.perf_counter() - t0)
            cpu.append(time.thread_time() - c0)
        step, step_cpu, now = statistics.median(times), statistics.median(cpu), state()
        print(f"{args.label} {time.perf_counter() - t_load:6.2f} s  {before:>10} -> {now:<10} "
              f"step {step * 1e3:6.2f} ms  {1 / step:6.2f} tok/s  CPU {step_cpu * 1e3:6.2f} ms", flush=True)
        if now == "collapsing":
            during.append((1 / step, step_cpu))
        elif before == "collapsing":        # ended inside this window: neither figure
            done_at = time.perf_counter() - t_load
        else:
            after.append((1 / step, step_cpu))
            if len(after) >= args.after:
                break

    def med(xs: list[tuple[float, float]]) -> str:
        if not xs:
            return "no window"
        return (f"{statistics.median(x[0] for x in xs):.2f} tok/s, CPU {statistics.median(x[1] for x in xs) * 1e3:.2f}"
                f" ms a step ({len(xs)} windows)")

    ended = f", collapse done {done_at:.1f} s after the load" if done_at is not None else ""
    print(f"{args.label}: while collapsing {med(during)}; after ({state()}) {med(after)}{ended}")


if __name__ == "__main__":
    main()
