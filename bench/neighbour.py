"""Decode speed next to a CPU-bound neighbour: what each engine keeps of its quiet tg128 when another process
busy-loops on one of the machine's cores (with 2 threads on 2 cores, the ideal is half).

    python bench/neighbour.py --bin ~/.cache/inferd-peers/llama.cpp-0.3.36/build/bin      # ~4 min
    python bench/neighbour.py --bin DIR --quick                                              # smoke test

llama.cpp: llama-bench tg128 tuned as in vs_llamacpp.py (-fa 0 and 1, the better kept per condition by median;
-lm none with glibc's huge-page tunable; no OMP_* variables), one invocation per flash-attention setting:
    env -u OMP_NUM_THREADS GLIBC_TUNABLES=glibc.malloc.hugetlb=1 llama-bench -m FILE -t 2 -p 0 -n 128 -d 0
        -fa F -ub 512 -lm none -r R -o json [--repack 0]
inferd: vs_llamacpp.py's in-process decode loop (128 one-token Engine.step calls, threads=2).
The neighbour is `python -c "while True: pass"`: one core's worth, unpinned (the scheduler places it), started
half a second before a condition's runs and killed after them. Rounds run in ABBA order twice over: the
conditions (quiet, busy, then busy, quiet) and within each the engines. Writes bench/results/neighbour[-quick].md.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from contextlib import nullcontext
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from _common import (abba, best_config, busy_warning, command_line, fmt_range, llama_bin, median,  # noqa: E402
                     model_file, peer_env, peer_env_words, repack_works, test_sizes)
from vs_llamacpp import Peer, make_engine, run_inferd  # noqa: E402

BUSY_LOOP = [sys.executable, "-c", "while True: pass"]


class Neighbour:
    """A busy-looping process for the length of a `with` block."""

    def __enter__(self):
        self.proc = subprocess.Popen(BUSY_LOOP)
        time.sleep(0.5)          # running and scheduled before the first timed step
        return self

    def __exit__(self, *exc):
        self.proc.kill()
        self.proc.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-r", "--repeats", type=int, default=3, help="tg128 samples per engine, condition and round")
    ap.add_argument("--rounds", type=int, default=2, help="ABBA rounds")
    ap.add_argument("--test", default="tg128", help="the decode test, tgN")
    ap.add_argument("--model", default="smollm2-q4_0", help="a model name of vs_llamacpp.py")
    ap.add_argument("--bin", type=Path, help="folder of llama.cpp's tools (default: ../shared/peers/llama-cpp.sh)")
    ap.add_argument("--peer-lib", type=Path, help="folder put first on llama.cpp's LD_LIBRARY_PATH")
    ap.add_argument("--repack", choices=("auto", "on", "off"), default="auto",
                    help="llama.cpp's weight repacking; auto: on unless a short run dies with SIGILL")
    ap.add_argument("--quick", action="store_true", help="1 round of 1 sample: a smoke test")
    ap.add_argument("--out", type=Path, help="results file (default: bench/results/neighbour[-quick].md)")
    args = ap.parse_args()
    try:
        if test_sizes(args.test)[0]:
            raise ValueError("this bench measures decode, tgN")
    except ValueError as e:
        raise SystemExit(f"--test {args.test}: {e}") from None
    test = args.test
    if args.quick:
        args.repeats, args.rounds = 1, 1
    out = args.out or HERE / "results" / f"neighbour{'-quick' if args.quick else ''}.md"

    bin_dir = llama_bin(args.bin)
    path = model_file(args.model, bin_dir)
    env = peer_env(args.peer_lib)
    repack = args.repack == "on" or args.repack == "auto" and repack_works(bin_dir, path, args.threads, env)
    peer = Peer(bin_dir, env, args.threads, "f16", repack, ubatch="512")
    engine = make_engine(path, args.threads, 640, "f16")
    warning = busy_warning()
    if warning:
        print("WARNING: " + warning, flush=True)
    peer_cmds = peer.commands(path, [test], 0, args.repeats)
    started = time.monotonic()

    # samples[engine][condition] = one list per round (llama.cpp: {config: samples} per round)
    peer_samples: dict[str, list[dict[str, list[float]]]] = {"quiet": [], "busy": []}
    our_samples: dict[str, list[list[float]]] = {"quiet": [], "busy": []}
    for r in range(args.rounds):
        for ci, condition in enumerate(abba(r, ("quiet", "busy"))):
            with Neighbour() if condition == "busy" else nullcontext():
                for side in abba(r + ci, ("llama.cpp", "inferd")):
                    t0 = time.monotonic()
                    if side == "inferd":
                        got = run_inferd(engine, [test], 0, args.repeats)[(test, 0)]
                        our_samples[condition].append(got)
                    else:
                        configs: dict[str, list[float]] = {}
                        for cmd in peer_cmds:
                            configs.update(peer.run(cmd)[(test, 0)])
                        peer_samples[condition].append(configs)
                        got = configs[best_config(configs)]
                    print(f"round {r + 1}/{args.rounds} {condition:<5} {side:<9} {median(got):7.1f} tok/s "
                          f"({time.monotonic() - t0:.1f} s)", flush=True)

    rows = ["| engine | quiet tok/s (min-max) | with a busy neighbour tok/s (min-max) | kept | kept per round |",
            "| --- | ---: | ---: | ---: | ---: |"]
    notes = []
    for name in ("llama.cpp", "inferd"):
        per_round: dict[str, list[list[float]]] = {}
        for condition in ("quiet", "busy"):
            if name == "inferd":
                per_round[condition] = our_samples[condition]
            else:
                pooled: dict[str, list[float]] = {}
                for configs in peer_samples[condition]:
                    for config, samples in configs.items():
                        pooled.setdefault(config, []).extend(samples)
                config = best_config(pooled)
                notes.append(f"llama.cpp {condition}: best setting {config}")
                per_round[condition] = [configs[config] for configs in peer_samples[condition]]
        quiet = [x for xs in per_round["quiet"] for x in xs]
        busy = [x for xs in per_round["busy"] for x in xs]
        kept = [median(b) / median(q) for q, b in zip(per_round["quiet"], per_round["busy"])]
        rows.append(f"| {name} | {median(quiet):.1f} ({fmt_range(quiet)}) | {median(busy):.1f} ({fmt_range(busy)}) | "
                    f"{median(busy) / median(quiet):.2f} | {fmt_range(kept, 2) if len(kept) > 1 else '1 round'} |")
    lines = [f"# Decode ({test}) next to a busy neighbour ({time.strftime('%Y-%m-%d %H:%M')}, {path.name}, "
             f"{args.threads} threads on {os.cpu_count()} cores, {args.rounds} ABBA rounds of {args.repeats} samples, "
             f"medians)", "", *rows, "",
             "kept = median with the neighbour / median quiet (ideal with one of two cores taken: 0.50); kept per "
             "round: the same ratio within each round.", "", *notes,
             f"Run took {(time.monotonic() - started) / 60:.1f} min."]
    if not repack:
        lines.append("llama.cpp's weight repacking died with SIGILL on this CPU (AMX the VM does not grant), so "
                     "llama-bench ran with `--repack 0`.")
    if warning:
        lines.append(f"**Warning**: {warning}.")
    lines += ["", "Commands:", "", "```", f"python {command_line(sys.argv)}",
              *(f"{peer_env_words(env)} {command_line(c)}" for c in peer_cmds),
              f"# inferd: in-process Engine(..., max_batch_tokens=512, max_seqs=1, threads={args.threads}), "
              f"{test_sizes(test)[1]} one-token steps", f"# neighbour: {command_line(BUSY_LOOP)}", "```", ""]
    report = "\n".join(lines)
    print("\n" + report)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(report)
    print(f"wrote {out}")


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")   # for this process (numpy); llama.cpp's tools never see it
    main()
