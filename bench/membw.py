"""Streaming read bandwidth of this machine at 1..N threads (the ceiling for decode speed).

    python bench/membw.py [--max-threads N] [--mib 512]
"""
from __future__ import annotations

import argparse
import os

from inferd import _cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--mib", type=int, default=512)
    args = ap.parse_args()
    print("| threads | read GB/s |\n| ---: | ---: |")
    for t in range(1, args.max_threads + 1):
        print(f"| {t} | {_cpu.measure_read_bandwidth(args.mib << 20, t, 5) / 1e9:.1f} |", flush=True)


if __name__ == "__main__":
    main()
