"""Prefill (pp128/pp512) of inferd's prefill matmul kernels against tuned llama.cpp, interleaved in one run.

    python bench/prefill_kernels.py [--bin DIR] [--models smollm2-q4_0,smollm2-q4_1,smollm2-q8_0]
        [--kernels tiles,amx] [--rounds 2] [-r 3]

Each round runs llama-bench (bench/vs_llamacpp.py's tuned flags and peer: -fa 0,1 x -ub 256,512, the best per
test, -lm none, huge-page malloc, no OMP_* variables) and inferd once per prefill kernel kind (the engine
context's KernelConfig.set_prefill_kernels: 'tiles' is the ymm kernel the VNNI paths had before the pair kernels),
in ABBA order.
Prints medians, min-max spread and ratios to llama.cpp.
"""
from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import vs_llamacpp as vs
from _common import best_config, llama_bin, median, model_file, peer_env, test_sizes

from inferd import _cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-r", "--repeats", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--tests", default="pp128,pp512")
    ap.add_argument("--bin", type=Path, help="folder of llama.cpp's tools (default: see bench/_common.llama_bin)")
    ap.add_argument("--models", default="smollm2-q4_0,smollm2-q4_1,smollm2-q8_0")
    ap.add_argument("--kernels", default="tiles,amx", help="prefill kernel kinds to compare (_cpu.PREFILL_KERNELS)")
    ap.add_argument("--no-peer", action="store_true", help="inferd's kinds only")
    args = ap.parse_args()
    tests = args.tests.split(",")
    kinds = args.kernels.split(",")
    sides = ([] if args.no_peer else ["llama.cpp"]) + kinds
    bin_dir = llama_bin(args.bin)
    peer = vs.Peer(bin_dir, peer_env(), args.threads, "f16")
    print(f"# prefill kernels vs llama.cpp ({time.strftime('%Y-%m-%d %H:%M')}, {args.threads} threads, "
          f"{_cpu.get_path()} path, {args.rounds} ABBA rounds of {args.repeats} samples; medians [min-max])\n")
    print("| model | test | " + " | ".join(sides) + " | " + " | ".join(f"{k} / llama.cpp" for k in kinds
                                                                   if not args.no_peer) + " |")
    for name in args.models.split(","):
        path = model_file(name, bin_dir)
        engine = vs.make_engine(path, args.threads, max(test_sizes(t)[0] for t in tests) + 64, "f16")
        samples: dict[str, dict[str, list[float]]] = {s: {} for s in sides}
        peer_runs: dict[str, dict[str, list[float]]] = {}
        for r in range(args.rounds):
            for side in sides if r % 2 == 0 else sides[::-1]:
                if side == "llama.cpp":
                    for cmd in peer.commands(path, tests, 0, args.repeats):
                        for (test, _), by_config in peer.run(cmd).items():
                            for config, values in by_config.items():
                                peer_runs.setdefault(test, {}).setdefault(config, []).extend(values)
                else:
                    engine._ctx.kernels.set_prefill_kernels(side)
                    for (test, _), values in vs.run_inferd(engine, tests, 0, args.repeats).items():
                        samples[side].setdefault(test, []).extend(values)
        for test, by_config in peer_runs.items():
            samples["llama.cpp"][test] = by_config[best_config(by_config)]
        engine._ctx.kernels.set_prefill_kernels("amx")
        for test in tests:
            med = {s: median(samples[s][test]) for s in sides}
            cells = [f"{med[s]:.0f} [{min(samples[s][test]):.0f}-{max(samples[s][test]):.0f}]" for s in sides]
            ratios = [] if args.no_peer else [f"{med[k] / med['llama.cpp']:.2f}x" for k in kinds]
            print(f"| {name} | {test} | " + " | ".join(cells + ratios) + " |", flush=True)
        del engine

if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
