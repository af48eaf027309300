"""Median time of decode steps of B sequences at once (one token each) in this checkout's engine, in one process and
without a server, for several B: the figures to compare between two checkouts run alternately (ABBA), as
decode_steps.py does for single sequences.

    python bench/batch_steps.py LABEL [-m MODEL] [--batches 1,2,3,4,6,8,16] [--steps 16] [--prompt 24] [-t 2]

(MODEL: as batch_decode.py's, a name of the REAL_FILES or a path.)

Each batch size gets its own sequences, primed with a `--prompt`-token prompt each (untimed); prints one JSON line:
the label and, per batch size, the median step in ms.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from _common import bench_model_path, decode_bench_args

from inferd.engine.engine import Engine
from inferd.engine.runner import blocks_needed
from inferd.engine.types import SeqInput
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
    model = load_model(bench_model_path(args.model))
    per_seq, most = blocks_needed(args.prompt + args.steps + 1), max(batches)
    engine = Engine(model, num_kv_blocks=most * per_seq, max_batch_tokens=512, max_seqs=most, threads=args.threads)
    getattr(engine, "wait_huge_pages", lambda: None)()     # timed once the weights are in 2 MB pages
    recurrent = model.config.is_recurrent
    tables = [list(range(i * per_seq, (i + 1) * per_seq)) for i in range(most)]

    def seq(tokens: list[int], pos: int, i: int) -> SeqInput:
        return SeqInput(tokens, pos, tables[i], 1, state_slot=i if recurrent else -1)

    medians = {}
    for batch in batches:
        prompts = [[(j * 7919 + 31 * i) % 5000 + 50 for j in range(args.prompt)] for i in range(batch)]
        last = [engine.step([seq(prompts[i], 0, i)])[0].tokens[0] for i in range(batch)]
        times = []
        for k in range(args.steps):
            t0 = time.perf_counter()
            out = engine.step([seq([last[i]], args.prompt + k, i) for i in range(batch)])
            times.append(time.perf_counter() - t0)
            last = [o.tokens[0] for o in out]
        medians[batch] = round(statistics.median(times) * 1e3, 2)
    print(json.dumps({"label": args.label, "ms": medians}), flush=True)


if __name__ == "__main__":
    main()
