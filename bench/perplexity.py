"""`inferd perplexity` vs `llama-perplexity`: wall time and the perplexity each prints, same file, text, context
and threads, interleaved in ABBA order.

    python bench/perplexity.py [--models qwen2.5-coder-1.5b-q4_k_m,gemma-3-270m-q4_k_m] [-c 512] [--chunks N]
                               [-t 2] [--rounds 2] [--bin DIR]

Both commands are timed from start to exit, loading included (the page cache is warm: the file is read once
first), on bench/data/gpl-3.txt. llama-perplexity runs as its users run it: its defaults (a 2048-token batch,
so four 512-token chunks per step; flash attention `auto`) with the peer environment of every bench (no OMP_*,
huge-page malloc). Writes bench/results/perplexity.md whole after each model (every round's figures, the medians and
their ranges), its data beside it as JSON; a run cut short says so.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from _common import (  # noqa: E402
    ROOT, abba, busy_warning, command_line, fmt_median, fmt_ratio, llama_bin, machine, median, model_file,
    partial_note, peer_build, peer_env, peer_env_words, ratio_of_medians, results_head, stats, stop_on_sigterm,
    stop_reason, publish_results, write_results)

TEXT = HERE / "data" / "gpl-3.txt"
LLAMA_PPL = re.compile(r"Final estimate: PPL = ([0-9.]+)")
INFERD_PPL = re.compile(r"PPL = ([0-9.]+) \+/- [0-9.]+ \((\d+) chunks")
SIDES = ("llama.cpp", "inferd")


def commands(bin_dir: Path, model: Path, ctx: int, chunks: int | None, threads: int) -> dict[str, list[str]]:
    llama = [str(bin_dir / "llama-perplexity"), "-m", str(model), "-f", str(TEXT), "-c", str(ctx),
             "-t", str(threads), "-tb", str(threads)]
    inferd = [sys.executable, "-m", "inferd.cli", "perplexity", "-m", str(model), "-f", str(TEXT), "-c", str(ctx),
              "-t", str(threads)]
    if chunks:
        llama += ["--chunks", str(chunks)]
        inferd += ["--chunks", str(chunks)]
    return {"llama.cpp": llama, "inferd": inferd}


def run_one(cmd: list[str], env: dict[str, str] | None, pattern: re.Pattern[str]) -> tuple[float, float]:
    """(seconds from start to exit, the perplexity printed)."""
    t0 = time.perf_counter()
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if out.returncode != 0:
        raise SystemExit(f"{cmd[0]} failed ({out.returncode}): {out.stderr[-2000:]}")
    m = pattern.search(out.stdout + out.stderr)
    if not m:
        raise SystemExit(f"no perplexity in the output of {command_line(cmd)}:\n{(out.stdout + out.stderr)[-2000:]}")
    return seconds, float(m.group(1))


@dataclass
class ModelRounds:
    name: str
    # per round: {side: {"seconds": from start to exit, "ppl": the perplexity it printed}}
    rounds: list[dict[str, dict[str, float]]] = field(default_factory=list)

    def finished(self) -> list[dict[str, dict[str, float]]]:
        return [m for m in self.rounds if all(side in m for side in SIDES)]


@dataclass
class PerplexityRun:
    """What a run measured and how: everything its results file says."""
    stamp: str
    host: dict
    peer_build: str
    commands: list[str]
    planned: list[str]           # model names
    ctx: int
    chunks: int | None
    threads: int
    rounds: int                  # planned, per model
    warning: str | None = None
    stopped: str | None = None   # what cut the run short
    models: list[ModelRounds] = field(default_factory=list)

    def complete(self) -> bool:
        return (self.stopped is None and len(self.models) == len(self.planned)
                and all(len(m.finished()) == self.rounds for m in self.models))


def results(run: PerplexityRun) -> tuple[str, dict]:
    """The results file's markdown and its JSON data, from each model's per-round figures."""
    chunks = f"{run.chunks} chunk{'s' if run.chunks > 1 else ''}" if run.chunks else "the whole text"
    title = (f"Perplexity: `inferd perplexity` vs `llama-perplexity`: {TEXT.name}, {chunks} of {run.ctx}, "
             f"{run.threads} threads, {run.rounds} ABBA rounds")
    lines = results_head(title, run.stamp, run.host, f"llama.cpp: {run.peer_build}")
    if not run.complete():
        done = sum(len(m.finished()) == run.rounds for m in run.models)
        lines += ["", partial_note(done, len(run.planned), "models", run.stopped or "the file is rewritten after "
                                   "each model; the run had not finished when it was last written")]
    table = ["| model | llama.cpp s (min-max) | inferd s (min-max) | inferd / llama.cpp time (per round min-max) | "
             "llama.cpp PPL | inferd PPL | PPL difference |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    per_round = ["| model | round | first | llama.cpp s | inferd s | inferd / llama.cpp | llama.cpp PPL | inferd PPL |",
                 "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |"]
    summary = []
    for m in run.models:
        done = m.finished()
        if not done:
            continue
        seconds = {side: [r[side]["seconds"] for r in done] for side in SIDES}
        ppl = {side: median([r[side]["ppl"] for r in done]) for side in SIDES}
        ratio, ratios = ratio_of_medians([[s] for s in seconds["inferd"]], [[s] for s in seconds["llama.cpp"]])
        diff = (ppl["inferd"] - ppl["llama.cpp"]) / ppl["llama.cpp"] * 100
        table.append(f"| {m.name} | {fmt_median(seconds['llama.cpp'])} | {fmt_median(seconds['inferd'])} | "
                     f"{fmt_ratio(ratio, ratios)} | {ppl['llama.cpp']:.4f} | {ppl['inferd']:.4f} | {diff:+.2f}% |")
        for i, r in enumerate(done):
            per_round.append(f"| {m.name} | {i + 1} | {abba(i, SIDES)[0]} | {r['llama.cpp']['seconds']:.1f} | "
                             f"{r['inferd']['seconds']:.1f} | {r['inferd']['seconds'] / r['llama.cpp']['seconds']:.2f}x"
                             f" | {r['llama.cpp']['ppl']:.4f} | {r['inferd']['ppl']:.4f} |")
        summary.append({"model": m.name, "seconds": {side: stats(v) for side, v in seconds.items()}, "ppl": ppl,
                        "time_ratio": ratio, "round_ratios": ratios, "ppl_difference_pct": diff})
    lines += ["", *table, "", "Per round:", "", *per_round, "",
              "Times are from the command's start to its exit, loading included, page cache warm."]
    if run.warning:
        lines += ["", f"**Warning**: {run.warning}"]
    lines += ["", "Commands:", "", "```", *run.commands, "```", ""]
    data = {"kind": "perplexity", "date": run.stamp, "machine": run.host, "peer_build": run.peer_build,
            "commands": run.commands, "text": TEXT.name, "ctx": run.ctx, "chunks": run.chunks,
            "threads": run.threads, "rounds_planned": run.rounds, "models_planned": run.planned,
            "complete": run.complete(), "stopped": run.stopped, "warning": run.warning,
            "rounds": {m.name: m.rounds for m in run.models}, "models": summary}
    return "\n".join(lines), data


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="qwen2.5-coder-1.5b-q4_k_m,gemma-3-270m-q4_k_m")
    ap.add_argument("-c", "--ctx", type=int, default=512)
    ap.add_argument("--chunks", type=int, default=None, help="chunks to score (default: the whole text)")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2, help="ABBA rounds")
    ap.add_argument("--bin", type=Path, default=None, help="folder of llama.cpp's tools")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "perplexity.md")
    args = ap.parse_args()
    stop_on_sigterm()

    bin_dir = llama_bin(args.bin)
    env = peer_env()
    run = PerplexityRun(time.strftime("%Y-%m-%d %H:%M"), machine(), peer_build(bin_dir),
                        [command_line([sys.executable, *sys.argv])], args.models.split(","), args.ctx, args.chunks,
                        args.threads, args.rounds, busy_warning())
    try:
        for name in run.planned:
            model = model_file(name, bin_dir)
            model.read_bytes()                                   # page cache warm for both
            cmds = commands(bin_dir, model, args.ctx, args.chunks, args.threads)
            run.commands += [f"{peer_env_words(env)} {command_line(cmds['llama.cpp'])}", command_line(cmds["inferd"])]
            rounds = ModelRounds(name)
            run.models.append(rounds)
            for r in range(args.rounds):
                this: dict[str, dict[str, float]] = {}
                rounds.rounds.append(this)
                for side in abba(r, SIDES):
                    s, p = run_one(cmds[side], env if side == "llama.cpp" else None,
                                   LLAMA_PPL if side == "llama.cpp" else INFERD_PPL)
                    this[side] = {"seconds": s, "ppl": p}
                    print(f"{name} round {r + 1}/{args.rounds} {side:<9} {s:6.1f} s  PPL {p:.4f}", flush=True)
            write_results(args.out, *results(run))               # after every model: a cut run keeps its part
    except (Exception, KeyboardInterrupt, SystemExit) as e:
        run.stopped = stop_reason(e)
        if not any(m.finished() for m in run.models):
            raise
    report, data = results(run)
    publish_results(args.out, report, data)
    return 1 if run.stopped else 0


if __name__ == "__main__":
    sys.exit(main())
