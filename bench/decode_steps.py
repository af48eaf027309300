"""Median time of single-token decode steps in this checkout's engine, in one process and without a server: the
figure to compare between two checkouts run alternately (ABBA), where a peer's own noise would blur a small
difference.

    python bench/decode_steps.py LABEL [--model qwen2.5-coder-1.5b-q4_k_m] [--steps 96] [-t 2]

Prints one line: LABEL, the median step time (after 16 warm-up steps) and its tok/s.
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

from _common import real_file  # noqa: E402

WARM_UP = 16


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("label")
    ap.add_argument("--model", default="qwen2.5-coder-1.5b-q4_k_m")
    ap.add_argument("--steps", type=int, default=96)
    ap.add_argument("-t", "--threads", type=int, default=2)
    args = ap.parse_args()
    from inferd.engine.engine import Engine, SeqInput
    from inferd.engine.types import SamplingParams
    from inferd.model.loader import load_model

    path = real_file(args.model) if not Path(args.model).is_file() else Path(args.model)
    engine = Engine(load_model(path), num_kv_blocks=8, max_batch_tokens=512, max_seqs=1, threads=args.threads)
    getattr(engine, "wait_huge_pages", lambda: None)()     # timed once the weights are in 2 MB pages
    blocks, prompt, greedy = list(range(8)), list(range(100, 132)), SamplingParams(temperature=0.0)
    token, pos = engine.step([SeqInput(prompt, 0, blocks, 1, params=greedy)])[0].tokens[0], len(prompt)
    times = []
    for _ in range(WARM_UP + args.steps):
        t0 = time.perf_counter()
        token = engine.step([SeqInput([token], pos, blocks, 1, params=greedy)])[0].tokens[0]
        times.append(time.perf_counter() - t0)
        pos += 1
    step = statistics.median(times[WARM_UP:])
    print(f"{args.label} median step {step * 1e3:.2f} ms  tok/s {1 / step:.2f}")


if __name__ == "__main__":
    main()
