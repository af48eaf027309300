"""`inferd perplexity` vs `llama-perplexity`: wall time and the perplexity each prints, same file, text, context
and threads, interleaved in ABBA order.

    python bench/perplexity.py [--models qwen2.5-coder-1.5b-q4_k_m,gemma-3-270m-q4_k_m] [-c 512] [--chunks N]
                               [-t 2] [--rounds 2] [--bin DIR]

Both commands are timed from start to exit, loading included (the page cache is warm: the file is read once
first), on bench/data/gpl-3.txt. llama-perplexity runs as its users run it: its defaults (a 2048-token batch,
so four 512-token chunks per step; flash attention `auto`) with the peer environment of every bench (no OMP_*,
huge-page malloc). Writes a markdown table to bench/results/perplexity.md.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from _common import (  # noqa: E402
    ROOT, abba, busy_warning, command_line, fmt_range, llama_bin, median, model_file, peer_env, peer_env_words)

TEXT = HERE / "data" / "gpl-3.txt"
LLAMA_PPL = re.compile(r"Final estimate: PPL = ([0-9.]+)")
INFERD_PPL = re.compile(r"PPL = ([0-9.]+) \+/- [0-9.]+ \((\d+) chunks")


def commands(bin_dir: Path, model: Path, ctx: int, chunks: int | None, threads: int) -> dict[str, list[str]]:
    llama = [str(bin_dir / "llama-perplexity"), "-m", str(model), "-f", str(TEXT), "-c", str(ctx),
             "-t", str(threads), "-tb", str(threads)]
    inferd = [sys.executable, "-m", "inferd.cli", "perplexity", "-m", str(model), "-f", str(TEXT), "-c", str(ctx),
              "-t", str(threads)]
    if chunks:
        llama += ["--chunks", str(chunks)]
        inferd += ["--chunks", str(chunks)]
    return {"llama.cpp": llama, "inferd": inferd}


def run(cmd: list[str], env: dict[str, str] | None, pattern: re.Pattern[str]) -> tuple[float, float]:
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="qwen2.5-coder-1.5b-q4_k_m,gemma-3-270m-q4_k_m")
    ap.add_argument("-c", "--ctx", type=int, default=512)
    ap.add_argument("--chunks", type=int, default=None, help="chunks to score (default: the whole text)")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2, help="ABBA rounds")
    ap.add_argument("--bin", type=Path, default=None, help="folder of llama.cpp's tools")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "perplexity.md")
    args = ap.parse_args()

    bin_dir = llama_bin(args.bin)
    env = peer_env()
    warning = busy_warning()
    rows, shown = [], []
    for name in args.models.split(","):
        model = model_file(name, bin_dir)
        model.read_bytes()                                   # page cache warm for both
        cmds = commands(bin_dir, model, args.ctx, args.chunks, args.threads)
        shown += [f"{peer_env_words(env)} {command_line(cmds['llama.cpp'])}", command_line(cmds["inferd"])]
        seconds: dict[str, list[float]] = {"llama.cpp": [], "inferd": []}
        ppl: dict[str, float] = {}
        for r in range(args.rounds):
            for side in abba(r, ["llama.cpp", "inferd"]):
                s, p = run(cmds[side], env if side == "llama.cpp" else None,
                           LLAMA_PPL if side == "llama.cpp" else INFERD_PPL)
                seconds[side].append(s)
                ppl[side] = p
                print(f"{name} round {r + 1}/{args.rounds} {side:<9} {s:6.1f} s  PPL {p:.4f}", flush=True)
        ratio = median(seconds["inferd"]) / median(seconds["llama.cpp"])
        per_round = [i / ll for i, ll in zip(seconds["inferd"], seconds["llama.cpp"])]
        diff = (ppl["inferd"] - ppl["llama.cpp"]) / ppl["llama.cpp"] * 100
        rows.append(f"| {name} | {median(seconds['llama.cpp']):.1f} ({fmt_range(seconds['llama.cpp'])}) | "
                    f"{median(seconds['inferd']):.1f} ({fmt_range(seconds['inferd'])}) | {ratio:.2f}x | "
                    f"{min(per_round):.2f}-{max(per_round):.2f} | {ppl['llama.cpp']:.4f} | {ppl['inferd']:.4f} | "
                    f"{diff:+.2f}% |")

    chunks = f"{args.chunks} chunks" if args.chunks else "the whole text"
    lines = [f"# Perplexity: `inferd perplexity` vs `llama-perplexity` ({time.strftime('%Y-%m-%d %H:%M')}, "
             f"{TEXT.name}, {chunks} of {args.ctx}, {args.threads} threads, {args.rounds} ABBA rounds)", "",
             "| model | llama.cpp s (min-max) | inferd s (min-max) | inferd / llama.cpp time | per round | "
             "llama.cpp PPL | inferd PPL | PPL difference |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |", *rows, "",
             "Times are from the command's start to its exit, loading included, page cache warm."]
    if warning:
        lines += ["", f"**Warning**: {warning}"]
    lines += ["", "Commands:", "", "```", f"{command_line([sys.executable, *sys.argv])}", *shown, "```", ""]
    args.out.write_text("\n".join(lines))
    print("\n".join(lines))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
