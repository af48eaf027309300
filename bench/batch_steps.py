"""Median time of decode steps of B sequences at once (one token each) in this checkout's engine, in one process and
without a server, for several B: the figures to compare between two checkouts run alternately (ABBA), as
decode_steps.py does for single sequences.

    python bench/batch_steps.py LABEL [-m MODEL] [--batches 1,2,3,4,6,8,16] [--steps 16] [--prompt 24] [-t 2]

(MODEL: as batch_decode.py's, a name of the REAL_FILES or a path.)

Each batch size gets its own sequences, primed with a `--prompt`-token prompt each (untimed; batch_decode.py's
step_times); prints one JSON line: the label and, per batch size, the median step in ms.
"""

from __future__ import annotations

import argparse
import json
import statistics

from _common import bench_model_path, decode_bench_args
from batch_decode import batch_engine, step_times

from inferd.model.loader import load_model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("label")
    decode_bench_args(ap)
    ap.add_argument("--batches", default="1,2,3,4,6,8,16")
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--prompt", type=int, default=24)
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    engine = batch_engine(load_model(bench_model_path(args.model)), max(batches), args.prompt, args.steps, args.threads)
    getattr(engine, "wait_huge_pages", lambda: None)()     # timed once the weights are in 2 MB pages
    medians = {}
    for batch in batches:
        times, _ = step_times(engine, batch, args.steps, args.prompt)
        medians[batch] = round(statistics.median(times) * 1e3, 2)
    print(json.dumps({"label": args.label, "ms": medians}), flush=True)


if __name__ == "__main__":
    main()
