"""Single-thread matmul time of the low-bit weight types (Q2_K, Q3_K, IQ4_XS and the codebook and ternary types, with
Q4_K beside them) at Qwen2.5-1.5B's shapes, for a decode step (1 token) and prefill chunks (64, 512 tokens).

    python bench/lowbit_kernels.py [--types Q4_K,IQ3_S,...] [--shapes 1536x1536,8960x1536,1536x8960]
        [--tokens 1,64,512] [--path avx2] [--repeats 5] [--json out.json] [--before before.json] [--note TEXT]

Weights are random valid blocks (tests/model/kquant_ref.py): a codebook kernel's work does not depend on which
entries the indices pick. Each cell is the best of `repeats` timings of at least 0.1 s of the thread's CPU time
each (CPU time leaves out the time a shared machine gives to other processes; the best is the least disturbed);
prints ms per call, GB/s of the weight's bytes and GOP/s; with --before (the --json of another build's run), that
run's ms and the speed-up beside each cell.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.append(str(Path(__file__).resolve().parent.parent))  # tests/ (after an installed or PYTHONPATH inferd)
from tests.model.kquant_ref import random_blocks  # noqa: E402

from inferd import _cpu  # noqa: E402

TYPES = ("Q4_K", "Q2_K", "Q3_K", "IQ4_XS", "IQ3_S", "IQ3_XXS", "IQ2_S", "IQ2_XS", "IQ2_XXS", "IQ1_S", "IQ1_M",
         "TQ1_0", "TQ2_0")


def best_time(w: _cpu.Weight, x: np.ndarray, repeats: int, min_seconds: float = 0.1) -> float:
    w.matmul(x)
    best = float("inf")
    for _ in range(repeats):
        n, t0 = 0, time.thread_time()
        while n == 0 or time.thread_time() - t0 < min_seconds:
            w.matmul(x)
            n += 1
        best = min(best, (time.thread_time() - t0) / n)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--types", default=",".join(TYPES))
    ap.add_argument("--shapes", default="1536x1536,8960x1536,1536x8960", help="ROWSxCOLS (outputs x inputs)")
    ap.add_argument("--tokens", default="1,64,512")
    ap.add_argument("--path", default=None, help="kernel path (default: this CPU's best)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", type=Path, help="also write the cells here")
    ap.add_argument("--before", type=Path, help="another build's --json: its ms and the speed-up beside each cell")
    ap.add_argument("--note", default="", help="a line about the machine, printed under the title")
    args = ap.parse_args()
    before = {}
    if args.before:
        before = {(c["type"], c["rows"], c["cols"], c["tokens"]): c["ms"] for c in json.loads(args.before.read_text())}
    _cpu.set_path(args.path or _cpu.best_path())
    rng = np.random.default_rng(0)
    cells = []
    print(f"# low-bit matmul kernels, 1 thread, {_cpu.get_path()} path (best of {args.repeats})\n")
    if args.note:
        print(args.note + "\n")
    extra = " before ms | speed-up |" if before else ""
    print(f"| type | rows x cols | tokens | ms | weight GB/s | GOP/s |{extra}\n"
          f"| --- | --- | ---: | ---: | ---: | ---: |{' ---: | ---: |' if before else ''}")
    for type_name in args.types.split(","):
        for shape in args.shapes.split(","):
            rows, cols = map(int, shape.split("x"))
            w = _cpu.Weight(type_name, rows, cols, random_blocks(type_name, rows, cols, rng))
            for ntok in map(int, args.tokens.split(",")):
                x = rng.standard_normal((ntok, cols)).astype(np.float32)
                dt = best_time(w, x, args.repeats)
                cell = {"type": type_name, "rows": rows, "cols": cols, "tokens": ntok, "ms": dt * 1e3,
                        "weight_gbps": w.nbytes / dt / 1e9, "gops": 2 * rows * cols * ntok / dt / 1e9}
                cells.append(cell)
                was = before.get((type_name, rows, cols, ntok))
                extra = f" {was:.3f} | {was / cell['ms']:.2f}x |" if was else (" | |" if before else "")
                print(f"| {type_name} | {rows}x{cols} | {ntok} | {cell['ms']:.3f} | {cell['weight_gbps']:.1f} | "
                      f"{cell['gops']:.1f} |{extra}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(cells, indent=1) + "\n")


if __name__ == "__main__":
    main()
