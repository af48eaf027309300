"""GFLOP/s and GB/s of the matmul kernels per weight type, shape, token count and path (single thread).

    python bench/kernels.py [--shapes 576x576,1536x576,576x1536,2048x5632]
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from inferd import _cpu

TYPES = ("Q4_0", "Q4_1", "Q8_0", "F16")
PATHS = ("scalar", "avx2", "avx512vnni", "avxvnni")


def weight(rng, type_name: str, rows: int, cols: int) -> _cpu.Weight:
    x = (rng.standard_normal((rows, cols)) * 0.02).astype(np.float32)
    raw = x.astype(np.float16).view(np.uint16) if type_name == "F16" else _cpu.quantize(x, type_name)
    return _cpu.Weight(type_name, rows, cols, raw)


def time_matmul(w: _cpu.Weight, x: np.ndarray, min_seconds: float = 0.2) -> float:
    w.matmul(x)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < min_seconds:
        w.matmul(x)
        n += 1
    return (time.perf_counter() - t0) / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="576x576,1536x576,576x1536,5632x2048",
                    help="ROWSxCOLS (outputs x inputs), comma-separated")
    ap.add_argument("--tokens", default="1,16,128")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    best = _cpu.best_path()
    paths = [p for p in PATHS if p == "scalar" or PATHS.index(p) <= PATHS.index(best) or p == best]
    print("| type | rows x cols | tokens | path | GFLOP/s | weight GB/s |\n| --- | --- | ---: | --- | ---: | ---: |")
    for shape in args.shapes.split(","):
        rows, cols = map(int, shape.split("x"))
        for t in TYPES:
            w = weight(rng, t, rows, cols)
            for ntok in map(int, args.tokens.split(",")):
                x = rng.standard_normal((ntok, cols)).astype(np.float32)
                for p in paths:
                    try:
                        _cpu.set_path(p)
                    except ValueError:
                        continue
                    if p == "scalar" and ntok > 1:
                        continue
                    dt = time_matmul(w, x)
                    print(f"| {t} | {rows}x{cols} | {ntok} | {p} | {2 * rows * cols * ntok / dt / 1e9:.1f} | "
                          f"{w.nbytes / dt / 1e9:.1f} |", flush=True)
    _cpu.set_path(best)


if __name__ == "__main__":
    main()
