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
conditions (quiet, busy, then busy, quiet) and within each the engines. Writes bench/results/neighbour[-quick].md
whole, its data beside it as JSON (a run cut short writes the rounds it finished, marked partial).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from _common import (abba, best_config, busy_warning, command_line, fmt_median, fmt_ratio, llama_bin,  # noqa: E402
                     machine, median, model_file, partial_note, peer_build, peer_env, peer_env_words, ratio_of_medians,
                     repack_works, results_head, stats, stop_on_sigterm, stop_reason, test_sizes, publish_results)

BUSY_LOOP = [sys.executable, "-c", "while True: pass"]
CONDITIONS = ("quiet", "busy")
ENGINES = ("llama.cpp", "inferd")


class Neighbour:
    """A busy-looping process for the length of a `with` block."""

    def __enter__(self):
        self.proc = subprocess.Popen(BUSY_LOOP)
        time.sleep(0.5)          # running and scheduled before the first timed step
        return self

    def __exit__(self, *exc):
        self.proc.kill()
        self.proc.wait()


def round_order(r: int) -> list[tuple[str, list[str]]]:
    """Round r's conditions in the order they run, each with its engines in the order they run."""
    return [(condition, abba(r + ci, ENGINES)) for ci, condition in enumerate(abba(r, CONDITIONS))]


@dataclass
class NeighbourRun:
    """What a run measured and how: everything its results file says."""
    stamp: str
    host: dict
    peer_build: str
    commands: list[str]
    model: str
    test: str
    threads: int
    cores: int
    rounds: int                  # planned
    repeats: int
    repack: bool = True
    warning: str | None = None
    minutes: float = 0.0
    stopped: str | None = None   # what cut the run short
    # per round: {"llama.cpp": {condition: {config: tok/s samples}}, "inferd": {condition: tok/s samples}}
    measured: list[dict] = field(default_factory=list)

    def finished(self) -> list[dict]:
        return [m for m in self.measured if all(c in m[e] for e in ENGINES for c in CONDITIONS)]


def results(run: NeighbourRun) -> tuple[str, dict]:
    """The results file's markdown and its JSON data, from the run's per-round samples."""
    done = run.finished()
    title = (f"Decode ({run.test}) next to a busy neighbour: {run.model}, {run.threads} threads on {run.cores} cores, "
             f"{run.rounds} ABBA rounds of {run.repeats} samples")
    lines = results_head(title, run.stamp, run.host, f"llama.cpp: {run.peer_build}")
    if run.stopped:
        lines += ["", partial_note(len(done), run.rounds, "rounds", run.stopped)]
    # per engine and condition: the samples of each finished round (llama.cpp: of its best setting over them all)
    per_round: dict[str, dict[str, list[list[float]]]] = {e: {} for e in ENGINES}
    best: dict[str, str] = {}
    for condition in CONDITIONS:
        pooled: dict[str, list[float]] = {}
        for m in done:
            for config, samples in m["llama.cpp"][condition].items():
                pooled.setdefault(config, []).extend(samples)
        if done:
            best[condition] = best_config(pooled)
        per_round["llama.cpp"][condition] = [m["llama.cpp"][condition][best.get(condition, "")] for m in done]
        per_round["inferd"][condition] = [m["inferd"][condition] for m in done]
    summary: dict[str, dict] = {}
    table = ["| engine | quiet tok/s (min-max) | with a busy neighbour tok/s (min-max) | kept (per round min-max) |",
             "| --- | ---: | ---: | ---: |"]
    for engine in ENGINES if done else ():
        quiet, busy = per_round[engine]["quiet"], per_round[engine]["busy"]
        kept, kept_rounds = ratio_of_medians(busy, quiet)
        summary[engine] = {"quiet": stats([x for r in quiet for x in r]), "busy": stats([x for r in busy for x in r]),
                           "kept": kept, "kept_per_round": kept_rounds}
        if engine == "llama.cpp":
            summary[engine]["best_config"] = best
        table.append(f"| {engine} | {fmt_median([x for r in quiet for x in r])} | "
                     f"{fmt_median([x for r in busy for x in r])} | {fmt_ratio(kept, kept_rounds)} |")
    lines += ["", *table, "", "kept = median with the neighbour / median quiet (ideal with one of two cores taken: "
              "0.50x); its range: the same ratio within each round."]
    if best:
        lines += ["", "llama.cpp's setting with the highest median over the rounds: "
                  + "; ".join(f"{c}: {config}" for c, config in best.items()) + "."]
    rows = ["| round | order | engine | quiet tok/s | busy tok/s | kept |", "| ---: | --- | --- | --- | --- | ---: |"]
    for r in range(len(done)):
        order = ", ".join(f"{c} ({' then '.join(engines)})" for c, engines in round_order(r))
        for engine in ENGINES:
            quiet, busy = per_round[engine]["quiet"][r], per_round[engine]["busy"][r]
            rows.append(f"| {r + 1} | {order} | {engine} | {', '.join(f'{x:.1f}' for x in quiet)} | "
                        f"{', '.join(f'{x:.1f}' for x in busy)} | {median(busy) / median(quiet):.2f}x |")
    lines += ["", "Per round (tok/s of every sample; llama.cpp: its best setting's):", "", *rows, "",
              f"Run took {run.minutes:.1f} min."]
    if not run.repack:
        lines.append("llama.cpp's weight repacking died with SIGILL on this CPU (AMX the VM does not grant), so "
                     "llama-bench ran with `--repack 0`.")
    if run.warning:
        lines.append(f"**Warning**: {run.warning}.")
    lines += ["", "Commands:", "", "```", *run.commands, "```", ""]
    data = {"kind": "neighbour", "date": run.stamp, "machine": run.host, "peer_build": run.peer_build,
            "commands": run.commands, "model": run.model, "test": run.test, "threads": run.threads,
            "cores": run.cores, "rounds_planned": run.rounds, "repeats": run.repeats, "complete": run.stopped is None,
            "stopped": run.stopped, "repack": run.repack, "warning": run.warning, "minutes": run.minutes,
            "rounds": run.measured, "engines": summary}
    return "\n".join(lines), data


def measure(run: NeighbourRun, peer, engine, path: Path, started: float) -> None:
    """Fill run.measured round by round, conditions and engines in ABBA order."""
    from vs_llamacpp import run_inferd

    peer_cmds = peer.commands(path, [run.test], 0, run.repeats)
    for r in range(run.rounds):
        this: dict = {"llama.cpp": {}, "inferd": {}}
        run.measured.append(this)
        for condition, engines in round_order(r):
            with Neighbour() if condition == "busy" else nullcontext():
                for side in engines:
                    t0 = time.monotonic()
                    if side == "inferd":
                        got = run_inferd(engine, [run.test], 0, run.repeats)[(run.test, 0)]
                        this["inferd"][condition] = got
                    else:
                        configs: dict[str, list[float]] = {}
                        for cmd in peer_cmds:
                            configs.update(peer.run(cmd)[(run.test, 0)])
                        this["llama.cpp"][condition] = configs
                        got = configs[best_config(configs)]
                    print(f"round {r + 1}/{run.rounds} {condition:<5} {side:<9} {median(got):7.1f} tok/s "
                          f"({time.monotonic() - t0:.1f} s)", flush=True)
        run.minutes = (time.monotonic() - started) / 60


def main() -> int:
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
    stop_on_sigterm()
    from vs_llamacpp import Peer, make_engine

    bin_dir = llama_bin(args.bin)
    path = model_file(args.model, bin_dir)
    env = peer_env(args.peer_lib)
    repack = args.repack == "on" or args.repack == "auto" and repack_works(bin_dir, path, args.threads, env)
    peer = Peer(bin_dir, env, args.threads, "f16", repack, ubatch="512")
    engine = make_engine(path, args.threads, 640, "f16")
    warning = busy_warning()
    if warning:
        print("WARNING: " + warning, flush=True)
    commands = [f"python {command_line(sys.argv)}",
                *(f"{peer_env_words(env)} {command_line(c)}" for c in peer.commands(path, [test], 0, args.repeats)),
                f"# inferd: in-process Engine(load_model(FILE), max_batch_tokens=512, max_seqs=1, "
                f"threads={args.threads}), {test_sizes(test)[1]} one-token steps", f"# FILE: {path}",
                f"# neighbour: {command_line(BUSY_LOOP)}"]
    run = NeighbourRun(time.strftime("%Y-%m-%d %H:%M"), machine(), peer_build(bin_dir), commands, path.name, test,
                       args.threads, os.cpu_count() or 0, args.rounds, args.repeats, repack, warning)
    started = time.monotonic()
    try:
        measure(run, peer, engine, path, started)
    except (Exception, KeyboardInterrupt, SystemExit) as e:
        run.stopped = stop_reason(e)
        if not run.finished():
            raise
    run.minutes = (time.monotonic() - started) / 60
    report, data = results(run)
    publish_results(out, report, data)
    return 1 if run.stopped else 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")   # for this process (numpy); llama.cpp's tools never see it
    sys.exit(main())
