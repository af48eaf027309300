"""Prefill (pp128/pp512) of inferd's prefill matmul kernels against tuned llama.cpp, interleaved in one run.

    python bench/prefill_kernels.py --bin ~/.cache/inferd-peers/llama.cpp-0.3.36/build/bin \
        [--models smollm2-q4_0,smollm2-q4_1,smollm2-q8_0] [--kernels tiles,amx] [--rounds 2] [-r 3]

Each round runs llama-bench (bench/vs_llamacpp.py's tuned flags: -fa 0,1 best, -lm none, huge-page malloc, no
OMP_NUM_THREADS; --repack 0, see run_llama_bench) and inferd once per prefill kernel kind
(_cpu.set_prefill_kernels: 'tiles' is the ymm kernel the VNNI paths had before the pair kernels), in ABBA order.
Prints medians, min-max spread and ratios to llama.cpp.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import vs_llamacpp as vs  # noqa: E402
from inferd import _cpu  # noqa: E402


def run_llama_bench(bin_dir: Path, path: Path, threads: int, repeats: int) -> dict[str, list[float]]:
    """bench/vs_llamacpp.py's tuned llama-bench run, plus --repack 0: its weight repacking dies with SIGILL on
    this AMX machine (the common notes' advice); samples of the better -fa setting per test, by median."""
    prompts = ",".join(str(n) for _, n, _ in vs.TESTS if n) or "0"
    cmd = [str(bin_dir / "llama-bench"), "-m", str(path), "-t", str(threads), "-p", prompts, "-n", "0",
           "-fa", "0,1", "-lm", "none", "--repack", "0", "-r", str(repeats), "-o", "json"]
    env = dict(os.environ, GLIBC_TUNABLES="glibc.malloc.hugetlb=1")
    rows = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout)
    out: dict[str, list[float]] = {}
    for r in rows:
        key = f"pp{r['n_prompt']}"
        samples = [float(v) for v in r.get("samples_ts") or [r["avg_ts"]]]
        if key not in out or statistics.median(samples) > statistics.median(out[key]):
            out[key] = samples
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-r", "--repeats", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--tests", default="pp128,pp512")
    ap.add_argument("--bin", type=Path, required=True, help="folder of llama.cpp's tools")
    ap.add_argument("--models", default="smollm2-q4_0,smollm2-q4_1,smollm2-q8_0")
    ap.add_argument("--kernels", default="tiles,amx", help="prefill kernel kinds to compare (_cpu.PREFILL_KERNELS)")
    ap.add_argument("--no-peer", action="store_true", help="inferd's kinds only")
    args = ap.parse_args()
    os.environ.pop("OMP_NUM_THREADS", None)          # llama-bench gets the environment a user's shell gives it
    vs.TESTS[:] = [t for t in vs.TESTS if t[0] in args.tests.split(",") and t[1]]   # prefill tests
    kinds = args.kernels.split(",")
    sides = ([] if args.no_peer else ["llama.cpp"]) + kinds
    print(f"# prefill kernels vs llama.cpp ({time.strftime('%Y-%m-%d %H:%M')}, {args.threads} threads, "
          f"{_cpu.get_path()} path, {args.rounds} ABBA rounds of {args.repeats} samples; medians [min-max])\n")
    print("| model | test | " + " | ".join(sides) + " | " + " | ".join(f"{k} / llama.cpp" for k in kinds
                                                                   if not args.no_peer) + " |")
    for name in args.models.split(","):
        path = vs.model_file(name, args.bin)
        engine = vs.make_engine(path, args.threads)
        samples: dict[str, dict[str, list[float]]] = {s: {} for s in sides}
        for r in range(args.rounds):
            for side in sides if r % 2 == 0 else sides[::-1]:
                if side == "llama.cpp":
                    got = run_llama_bench(args.bin, path, args.threads, args.repeats)
                else:
                    _cpu.set_prefill_kernels(side)
                    got = vs.run_inferd(engine, args.repeats)
                for test, values in got.items():
                    samples[side].setdefault(test, []).extend(values)
        _cpu.set_prefill_kernels("amx")
        for test, _, _ in vs.TESTS:
            med = {s: statistics.median(samples[s][test]) for s in sides}
            cells = [f"{med[s]:.0f} [{min(samples[s][test]):.0f}-{max(samples[s][test]):.0f}]" for s in sides]
            ratios = [] if args.no_peer else [f"{med[k] / med['llama.cpp']:.2f}x" for k in kinds]
            print(f"| {name} | {test} | " + " | ".join(cells + ratios) + " |", flush=True)
        del engine


if __name__ == "__main__":
    main()
