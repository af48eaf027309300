"""Long-context attention: inferd builds against tuned llama.cpp in one interleaved run, with the attention share.

    python bench/attention_depth.py --bin ~/.cache/inferd-peers/llama.cpp-0.3.36/build/bin \
        [--model FILE] [-t 2] [-r 2] [--rounds 2] [--inferd NAME=PYTHONPATH ...]

Tests: pp2048 (2048 prompt tokens from an empty cache, in steps of 512 tokens as llama.cpp's micro-batches) and
tg64@d4096 (64 single-token decode steps after a 4096-token context). llama-bench runs tuned as its experts run it
(`-fa 0,1 -lm none`, GLIBC_TUNABLES=glibc.malloc.hugetlb=1, the better -fa per test by median of samples_ts), with
`--repack 0`: on this AMX CPU llama.cpp's repacked Q4_0 path dies with SIGILL.
Each `--inferd NAME=DIR` is a build of the package imported from DIR (e.g. the code before and after a change),
run in a subprocess of its own; the rounds go builds then llama.cpp, then llama.cpp then the builds reversed, so
that a shared machine's slow phases fall on every side; each side's samples are logged to stderr as they come.
Each inferd run also reports the forward pass's attention stage share (ctx.set_profiling) for the prefill and the
decode.
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
DEFAULT_MODEL = Path.home() / ".cache" / "inferd" / "models" / "bench" / "SmolLM2-135M-Instruct.Q4_0.gguf"
PROMPT, DEPTH, GEN, CHUNK = 2048, 4096, 64, 512


def worker(model: str, threads: int, repeats: int) -> None:
    """In the subprocess: inferd's samples (tok/s) and attention shares as JSON on stdout."""
    from inferd.engine.engine import Engine
    from inferd.engine.runner import blocks_needed
    from inferd.engine.types import SeqInput
    from inferd.model.loader import load_model

    eng = Engine(load_model(Path(model)), num_kv_blocks=blocks_needed(DEPTH + GEN + 1), max_batch_tokens=CHUNK,
                 max_seqs=1, threads=threads)
    table = list(range(eng.num_kv_blocks))
    vocab = eng.vocab_size
    prompt = [(i * 7919 + 13) % (vocab - 100) + 50 for i in range(DEPTH)]
    ctx = eng._ctx

    def prefill(n: int) -> int:
        out = None
        for pos in range(0, n, CHUNK):
            out = eng.step([SeqInput(prompt[pos:pos + CHUNK], pos, table, 1 if pos + CHUNK >= n else 0)])[0]
        return out.tokens[0]

    prefill(64)                                                       # warm-up: pages, pool, caches
    res: dict = {"pp2048": [], "tg64@d4096": [], "attn_share": {}}
    for r in range(repeats):
        ctx.set_profiling(r == 0)
        t0 = time.perf_counter()
        prefill(PROMPT)
        dt = time.perf_counter() - t0
        res["pp2048"].append(PROMPT / dt)
        if r == 0:
            res["attn_share"]["pp2048"] = ctx.profile()["attention"] / dt
    for r in range(repeats):
        token = prefill(DEPTH)
        ctx.set_profiling(r == 0)
        t0 = time.perf_counter()
        for pos in range(DEPTH, DEPTH + GEN):
            token = eng.step([SeqInput([token], pos, table, 1)])[0].tokens[0]
        dt = time.perf_counter() - t0
        res["tg64@d4096"].append(GEN / dt)
        if r == 0:
            res["attn_share"]["tg64@d4096"] = ctx.profile()["attention"] / dt
    ctx.set_profiling(False)
    print(json.dumps(res))


def run_inferd(pkg: str, model: Path, threads: int, repeats: int) -> dict:
    env = dict(os.environ, PYTHONPATH=pkg)
    env.pop("OMP_NUM_THREADS", None)
    out = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--worker", "--model", str(model),
                          "-t", str(threads), "-r", str(repeats)], check=True, capture_output=True, text=True,
                         env=env, cwd="/")
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_llama(bin_dir: Path, model: Path, threads: int, repeats: int) -> dict:
    env = dict(os.environ, GLIBC_TUNABLES="glibc.malloc.hugetlb=1")
    env.pop("OMP_NUM_THREADS", None)
    res: dict = {}
    for key, extra in (("pp2048", ["-p", str(PROMPT), "-n", "0"]),
                       ("tg64@d4096", ["-d", str(DEPTH), "-p", "0", "-n", str(GEN)])):
        cmd = [str(bin_dir / "llama-bench"), "-m", str(model), "-t", str(threads), *extra, "-fa", "0,1",
               "-lm", "none", "--repack", "0", "-r", str(repeats), "-o", "json"]
        rows = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout)
        best: list[float] = []
        for row in rows:
            samples = [float(v) for v in row.get("samples_ts") or [row["avg_ts"]]]
            if not best or statistics.median(samples) > statistics.median(best):
                best = samples
        res[key] = best
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model", default=str(DEFAULT_MODEL))
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-r", "--repeats", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--bin", type=Path)
    ap.add_argument("--inferd", action="append", default=[], help="NAME=DIR: a build of inferd importable from DIR")
    args = ap.parse_args()
    if args.worker:
        worker(args.model, args.threads, args.repeats)
        return
    builds = dict(b.split("=", 1) for b in args.inferd) or {"inferd": str(HERE.parent)}
    model = Path(args.model)
    samples: dict[str, dict[str, list[float]]] = {name: {} for name in ["llama.cpp", *builds]}
    shares: dict[str, list[dict]] = {name: [] for name in builds}
    for rnd in range(args.rounds):
        order = [*builds, "llama.cpp"]
        for side in order if rnd % 2 == 0 else order[::-1]:
            print(f"round {rnd + 1}: {side}", file=sys.stderr, flush=True)
            if side == "llama.cpp":
                got = run_llama(args.bin, model, args.threads, args.repeats)
            else:
                got = run_inferd(builds[side], model, args.threads, args.repeats)
                shares[side].append(got.pop("attn_share"))
            print(f"round {rnd + 1}: {side}: {json.dumps(got)}", file=sys.stderr, flush=True)
            for key, vals in got.items():
                samples[side].setdefault(key, []).extend(vals)
    print(f"model {model.name}, {args.threads} threads, {args.rounds} interleaved rounds x {args.repeats} repeats")
    print("| test | llama.cpp tok/s | " + " | ".join(f"{b} tok/s | {b} ratio | {b} attention share"
                                                      for b in builds) + " |")
    print("|---|---:|" + "---:|---:|---:|" * len(builds))
    for key in ("pp2048", "tg64@d4096"):
        ref = samples["llama.cpp"][key]
        cells = [f"{statistics.median(ref):.1f} ({min(ref):.0f}-{max(ref):.0f})"]
        for b in builds:
            s = samples[b][key]
            share = statistics.median(x[key] for x in shares[b])
            cells += [f"{statistics.median(s):.1f} ({min(s):.0f}-{max(s):.0f})",
                      f"{statistics.median(s) / statistics.median(ref):.2f}x "
                      f"({min(s) / max(ref):.2f}-{max(s) / min(ref):.2f})", f"{share:.0%}"]
        print(f"| {key} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
