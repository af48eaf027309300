"""inferd vs llama.cpp (llama-bench, tuned as its experts run it) on the same GGUF files and threads, in one run.

    python bench/vs_llamacpp.py --bin ~/.cache/inferd-peers/llama.cpp-0.3.36/build/bin    # all five, ~24 min
    python bench/vs_llamacpp.py --bin DIR --kv-cache q8_0 --models smollm2-q4_0,qwen2.5-coder-1.5b-q4_k_m
    python bench/vs_llamacpp.py --bin DIR --quick                                          # smoke, ~1 min

Tests: ppN = N prompt tokens (any N: --tests pp2048 works), tgN = N single-token decode steps, each at depth d:
the first d positions of the KV cache already filled (untimed), as llama-bench's `-d d` does. Defaults per model
(PLANS; -r, --rounds, --tests and --depths override them for every model), with estimated times:

    smollm2-q4_0               pp128 pp512 tg128   depths 0, 2048, 4096   -r 3   2 rounds   ~4.5 min
    smollm2-q4_1               pp128 pp512 tg128   depth 0                -r 3   2 rounds   ~2 min
    smollm2-q8_0               pp128 pp512 tg128   depth 0                -r 3   2 rounds   ~1 min
    tinyllama-q4_0 (random)    pp512 tg128         depth 0 (ctx 2048)     -r 2   2 rounds   ~3.5 min
    qwen2.5-coder-1.5b-q4_k_m  pp512 tg128         depths 0, 4096         -r 1   2 rounds   ~13 min
                                                                                  all five: ~24 min
    qwen3-30b-a3b-q4_k_m       pp512 tg128         depth 0                -r 1   2 rounds   (--models only: a
                               Qwen3-30B-A3B-shaped file of random Q4_K/Q6_K blocks, 17 GB, made by make_moe_model.py)
    gpt-oss-20b-mxfp4          pp512 tg128         depth 0                -r 1   2 rounds   (--models only: a
                               gpt-oss-20b-shaped file, MXFP4 experts and Q8_0 elsewhere, made by make_moe_model.py)
    qwen2.5-coder-1.5b-q2_k, -q3_k_m, -iq4_xs, -iq3_m, -iq2_m
                               pp512 tg128         depth 0                -r 1   2 rounds   (--models only: the Q4_K_M
                               file re-quantized by llama-quantize, made on first use: bench/_common.low_bit_file)
    qwen3.5-2b-q4_k_m          pp512 tg128         depth 0                -r 2   3 rounds   (--models only: a
                               Qwen3.5-2B-shaped hybrid of random Q4_K blocks, 1 GB, made by make_qwen35_model.py)

The times are a cost model's (llama-bench's warm-up, depth fills and 4 settings per test; speeds from
bench/results/vs_llamacpp.md, llama.cpp's prefill at 60% for `--repack 0`) for an unshared 2-core machine:
llama.cpp's runs at depth 4096 on the 1.5B model dominate (each flash-attention setting fills 4096 tokens once
per round). Depths past a model's context are skipped for both engines. The script prints the real time per model
and writes it into the results, with the data as JSON beside them (bench/tables.py builds the docs' tables from it).

llama.cpp's side, per model, round and depth, one invocation per flash-attention setting (so the depth fill is
done once and restored for the other tests, as llama-bench does within one invocation):
    env -u OMP_NUM_THREADS GLIBC_TUNABLES=glibc.malloc.hugetlb=1 llama-bench -m FILE -t 2 -p 128,512 -n 128 -d D
        -fa F -ub 256,512 -lm none -r R -o json [--repack 0] [-ctk T -ctv T]
with F in 0, 1 (1 only with a KV cache of type T other than f16: q8_0 needs flash attention), and T each of
--peer-kv-cache (default: --kv-cache, both engines' cache alike). For each test the (fa, ub) setting with
the highest median over all rounds is kept and named in the table. -lm none reads the weights into malloc, and
the tunable puts malloc in huge pages as inferd's loader does. On a CPU with AMX the tools are built with every SIMD
extension but AMX (whose path in this llama.cpp release faults), so llama.cpp keeps its repacked kernels;
`--repack 0` only where a given build's repacking still dies (probed per model), and the results say so.
inferd's side runs in this process:
Engine(load_model(FILE), num_kv_blocks=<depth + longest test>, max_batch_tokens=512, max_seqs=1, threads=2
[, kv_cache_dtype="q8_0"]); the depth filled in 512-token steps (untimed), one untimed warm-up prompt, then
ppN = N tokens at positions d..d+N-1 in steps of 512 (as llama.cpp's ubatches) and tgN = N one-token steps at
d..d+N-1, R times each.
Rounds alternate in ABBA order (llama.cpp first, then inferd first, ...). Each side's figure is the median of its
samples (llama-bench's samples_ts); the ratio is the ratio of medians, and its spread is the range of the
per-round ratios. Also prints decode GB/s against the read bandwidth probed right before and after each round's
inferd runs (their mean: the phase that round decoded in), the median and range over the rounds.
"""
from __future__ import annotations

import argparse
import gc
import inspect
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from _common import (LOW_BIT_FILES, MEDIANS, abba, available_memory, best_config, busy_warning,  # noqa: E402
                     command_line, fmt_range, llama_bin,
                     machine, machine_line, median, model_file, parse_llama_bench, peer_build, peer_env, peer_env_words,
                     repack_works, test_sizes, write_results)
from inferd import _cpu  # noqa: E402
from inferd.engine.engine import Engine  # noqa: E402
from inferd.engine.runner import blocks_needed  # noqa: E402
from inferd.engine.types import SeqInput  # noqa: E402
from inferd.model.loader import load_model  # noqa: E402

FILL_STEP = 512   # tokens per untimed step while filling the depth (inferd's max_batch_tokens)


@dataclass(frozen=True)
class Plan:
    tests: tuple[str, ...]
    depths: tuple[int, ...]
    repeats: int
    rounds: int


PLANS = {
    "smollm2-q4_0": Plan(("pp128", "pp512", "tg128"), (0, 2048, 4096), 3, 2),
    "smollm2-q4_1": Plan(("pp128", "pp512", "tg128"), (0,), 3, 2),
    "smollm2-q8_0": Plan(("pp128", "pp512", "tg128"), (0,), 3, 2),
    "tinyllama-q4_0": Plan(("pp512", "tg128"), (0,), 2, 2),
    "qwen2.5-coder-1.5b-q4_k_m": Plan(("pp512", "tg128"), (0, 4096), 1, 2),
}
# named with --models only: random weights at a real model's shape (_common.SHAPED_FILES, made on first use)
SHAPED_PLANS = {
    "qwen3-30b-a3b-q4_k_m": Plan(("pp512", "tg128"), (0,), 1, 2),
    "gpt-oss-20b-mxfp4": Plan(("pp512", "tg128"), (0,), 1, 2),
    "qwen3.5-2b-q4_k_m": Plan(("pp512", "tg128"), (0,), 2, 3),
}
# named with --models only: Qwen2.5-Coder-1.5B in the low-bit types (_common.LOW_BIT_FILES, made on first use)
LOW_BIT_PLANS = {name: Plan(("pp512", "tg128"), (0,), 1, 2) for name in LOW_BIT_FILES}
QUICK = Plan(("pp128", "tg128"), (0,), 1, 1)

Samples = dict[tuple[str, int], list[float]]          # (test, depth) -> tok/s samples


# ---- llama.cpp ------------------------------------------------------------------------------------------------

@dataclass
class Peer:
    bin_dir: Path
    env: dict[str, str]
    threads: int
    kv_caches: tuple[str, ...]   # swept like the other settings: each test keeps its best
    repack: bool = True
    ubatch: str = "256,512"      # swept: each test keeps its best
    flash_attn: tuple[str, ...] = ("0", "1")   # one invocation each (a cache other than f16: 1 only)

    def commands(self, path: Path, tests: list[str], depth: int, repeats: int) -> list[list[str]]:
        """One llama-bench invocation per KV cache type and flash-attention setting at this depth."""
        sizes = [test_sizes(t) for t in tests]
        prompts = ",".join(str(p) for p, _ in sizes if p) or "0"
        gens = ",".join(str(g) for _, g in sizes if g) or "0"
        repack = [] if self.repack else ["--repack", "0"]
        return [[str(self.bin_dir / "llama-bench"), "-m", str(path), "-t", str(self.threads), "-p", prompts,
                 "-n", gens, "-d", str(depth), "-fa", fa, "-ub", self.ubatch, "-lm", "none", "-r", str(repeats),
                 "-o", "json", *repack, *(["-ctk", kv, "-ctv", kv] if kv != "f16" else [])]
                for kv in self.kv_caches for fa in (("1",) if kv != "f16" else self.flash_attn)]

    def run(self, cmd: list[str]) -> dict[tuple[str, int], dict[str, list[float]]]:
        r = subprocess.run(cmd, capture_output=True, text=True, env=self.env)
        if r.returncode != 0:
            raise RuntimeError(f"llama-bench failed ({r.returncode}): {command_line(cmd)}\n{r.stderr[-2000:]}")
        return parse_llama_bench(r.stdout)


# ---- inferd ---------------------------------------------------------------------------------------------------

def check_kv_cache(kv_cache: str) -> None:
    """Fail before any run when this checkout's Engine cannot store the KV cache as asked."""
    if kv_cache != "f16" and "kv_cache_dtype" not in inspect.signature(Engine).parameters:
        raise SystemExit(f"--kv-cache {kv_cache}: this checkout's Engine has no kv_cache_dtype keyword yet "
                         f"(this build has no int8 KV cache); run with --kv-cache f16")


def make_engine(path: Path, threads: int, positions: int, kv_cache: str) -> Engine:
    extra = {} if kv_cache == "f16" else {"kv_cache_dtype": kv_cache}
    engine = Engine(load_model(path), num_kv_blocks=blocks_needed(positions), max_batch_tokens=FILL_STEP,
                    max_seqs=1, threads=threads, **extra)
    getattr(engine, "wait_huge_pages", lambda: None)()     # timed once the weights are in 2 MB pages
    return engine


def run_inferd(engine: Engine, tests: list[str], depth: int, repeats: int) -> Samples:
    """tok/s samples per test at `depth`, timed as llama-bench times them (see the module's docstring)."""
    table = list(range(engine.num_kv_blocks))
    longest = max(max(test_sizes(t)) for t in tests)
    vocab = engine.vocab_size
    tokens = [(i * 7919 + 13) % (vocab - 100) + 50 for i in range(depth + longest)]
    for start in range(0, depth, FILL_STEP):                       # the context, filled untimed
        engine.step([SeqInput(tokens[start:min(start + FILL_STEP, depth)], start, table, 0, state_slot=0)])
    n_warm = min(max(test_sizes(t)[0] for t in tests), FILL_STEP) or 32
    engine.step([SeqInput(tokens[depth:depth + n_warm], depth, table, 1, state_slot=0)])  # llama-bench's warm-up
    out: Samples = {}
    for test in tests:
        n_prompt, n_gen = test_sizes(test)
        times = []
        for _ in range(repeats):
            if n_prompt:   # in steps of max_batch_tokens, as llama.cpp splits a batch into ubatches
                t0 = time.perf_counter()
                for start in range(0, n_prompt, FILL_STEP):
                    end = min(start + FILL_STEP, n_prompt)
                    engine.step([SeqInput(tokens[depth + start:depth + end], depth + start, table,
                                          1 if end == n_prompt else 0, state_slot=0)])
                times.append(time.perf_counter() - t0)
            else:
                token = tokens[depth]
                t0 = time.perf_counter()
                for pos in range(depth, depth + n_gen):
                    token = engine.step([SeqInput([token], pos, table, 1, state_slot=0)])[0].tokens[0]
                times.append(time.perf_counter() - t0)
        out[(test, depth)] = [(n_prompt or n_gen) / t for t in times]
    return out


# ---- one model ------------------------------------------------------------------------------------------------

@dataclass
class Row:
    model: str
    test: str
    depth: int
    peer_config: str
    peer: list[float]            # the kept configuration's samples, all rounds
    ours: list[float]
    round_ratios: list[float]

    def data(self) -> dict[str, object]:
        peer, ours = median(self.peer), median(self.ours)
        return {"model": self.model, "test": self.test, "depth": self.depth, "peer_config": self.peer_config,
                "peer_tok_s": {"median": peer, "min": min(self.peer), "max": max(self.peer), "samples": self.peer},
                "inferd_tok_s": {"median": ours, "min": min(self.ours), "max": max(self.ours), "samples": self.ours},
                "ratio": ours / peer, "round_ratios": self.round_ratios}

    def cells(self) -> list[str]:
        peer, ours = median(self.peer), median(self.ours)
        spread = fmt_range(self.round_ratios, 2) if len(self.round_ratios) > 1 else "1 round"
        return [self.model, self.test, str(self.depth), f"{peer:.1f} ({fmt_range(self.peer)})", self.peer_config,
                f"{ours:.1f} ({fmt_range(self.ours)})", f"{ours / peer:.2f}x", spread]


HEADER = ["model", "test", "depth", "llama.cpp tok/s (min-max)", "llama.cpp best", "inferd tok/s (min-max)",
          "ratio", "ratio per round (min-max)"]


def bench_model(name: str, plan: Plan, peer: Peer, threads: int, kv_cache: str, commands: list[str]):
    """Rows of the summary for one model, and its decode-bandwidth note."""
    path = model_file(name, peer.bin_dir)
    longest = max(max(test_sizes(t)) for t in plan.tests)
    engine: Engine | None = make_engine(path, threads, max(plan.depths) + longest, kv_cache)
    assert engine is not None
    weight_bytes = engine.weight_bytes
    # a model that cannot sit in memory beside llama.cpp's copy of its weights is loaded again (untimed) for each
    # of inferd's turns and dropped before each of llama.cpp's
    reload = 2 * path.stat().st_size > available_memory()
    depths = [d for d in plan.depths if d + longest <= engine.context_length]
    if len(depths) < len(plan.depths):
        print(f"  {name}: depths {sorted(set(plan.depths) - set(depths))} skipped: past its context of "
              f"{engine.context_length}", flush=True)
    tests = list(plan.tests)
    # per round: {(test, depth): {config: samples}} for llama.cpp, {(test, depth): samples} for inferd
    peer_rounds: list[dict[tuple[str, int], dict[str, list[float]]]] = []
    our_rounds: list[Samples] = []
    probes: list[float] = []   # per round: read bandwidth around inferd's depth-0 runs
    for r in range(plan.rounds):
        peer_round: dict[tuple[str, int], dict[str, list[float]]] = {}
        ours_round: Samples = {}
        for side in abba(r, ("llama.cpp", "inferd")):
            if reload and side == "llama.cpp" and engine is not None:
                engine = None
                gc.collect()
            elif side == "inferd" and engine is None:
                engine = make_engine(path, threads, max(plan.depths) + longest, kv_cache)
            for depth in depths:
                t0 = time.monotonic()
                if side == "inferd":
                    probe = depth == 0 and any(t.startswith("tg") for t in tests)
                    if probe:
                        before = _cpu.measure_read_bandwidth(512 << 20, threads, 5)
                    assert engine is not None
                    ours_round.update(run_inferd(engine, tests, depth, plan.repeats))
                    if probe:   # the bandwidth of the phase the decode ran in: the mean of a probe on each side
                        probes.append((before + _cpu.measure_read_bandwidth(512 << 20, threads, 5)) / 2)
                else:
                    for cmd in peer.commands(path, tests, depth, plan.repeats):
                        if r == 0:
                            commands.append(f"{peer_env_words(peer.env)} {command_line(cmd)}")
                        for key, configs in peer.run(cmd).items():
                            peer_round.setdefault(key, {}).update(configs)
                print(f"  {name} round {r + 1}/{plan.rounds} {side:<9} depth {depth:>5}: "
                      f"{time.monotonic() - t0:6.1f} s", flush=True)
        peer_rounds.append(peer_round)
        our_rounds.append(ours_round)

    rows = []
    for depth in depths:
        for test in tests:
            key = (test, depth)
            pooled: dict[str, list[float]] = {}
            for pr in peer_rounds:
                for config, samples in pr[key].items():
                    pooled.setdefault(config, []).extend(samples)
            config = best_config(pooled)
            ratios = [median(o[key]) / median(p[key][config]) for o, p in zip(our_rounds, peer_rounds)]
            rows.append(Row(name, test, depth, config, pooled[config], [x for o in our_rounds for x in o[key]],
                            ratios))
    note = ""
    tg = [row for row in rows if row.test.startswith("tg") and row.depth == 0]
    if tg:
        # a shared VM's bandwidth drifts between phases: each round's decode is compared with probes taken right
        # before and after it (best of 5 reads of 512 MB each, with the same threads)
        key = (tg[0].test, 0)
        gbs = [weight_bytes * median(o[key]) for o in our_rounds]
        shares = [g / b for g, b in zip(gbs, probes)]
        probed = fmt_range([b / 1e9 for b in probes])
        note = (f"{name}: decode reads {weight_bytes / 1e6:.0f} MB of weights per token -> "
                f"{median(gbs) / 1e9:.1f} GB/s = {median(shares):.0%} ({min(shares):.0%}-{max(shares):.0%} per "
                f"round) of the read bandwidth probed around each round's decode ({probed} GB/s, {threads} threads)")
    return rows, note


# ---- main -----------------------------------------------------------------------------------------------------

def report(rows: list[Row], notes: list[str], commands: list[str], header: list[str]) -> str:
    table = ["| " + " | ".join(HEADER) + " |", "| --- | --- | ---: | ---: | --- | ---: | ---: | ---: |"]
    table += ["| " + " | ".join(row.cells()) + " |" for row in rows]
    return "\n".join(header + [""] + table + [""] + notes + ["", "Commands:", "", "```"] + commands + ["```", ""])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-r", "--repeats", type=int, help="samples per test per round (default: per model, PLANS)")
    ap.add_argument("--rounds", type=int, help="interleaved rounds per model, ABBA order (default: per model)")
    ap.add_argument("--tests", help="comma-separated ppN (prefill N tokens) and tgN (decode N tokens), e.g. "
                    "pp512,pp2048,tg128 (default: per model)")
    ap.add_argument("--depths", help="comma-separated context depths, e.g. 0,2048,4096 (default: per model)")
    ap.add_argument("--models", default=",".join(PLANS))
    ap.add_argument("--kv-cache", choices=("f16", "bf16", "q8_0"), default="f16",
                    help="KV cache type of both engines (q8_0, bf16: llama.cpp -ctk/-ctv T with -fa 1)")
    ap.add_argument("--peer-kv-cache", help="llama.cpp's KV cache types swept, comma-separated, each test keeping "
                    "its best (default: --kv-cache); e.g. f16,bf16 against inferd's bf16")
    ap.add_argument("--peer-fa", choices=("0,1", "0", "1"), default="0,1",
                    help="llama.cpp's flash-attention settings swept (each fills the depth again: at depth 8192 "
                    "and more, 1 alone halves llama.cpp's time; it is the faster one at depth)")
    ap.add_argument("--peer-ub", default="256,512", help="llama.cpp's micro-batch sizes swept (-ub)")
    ap.add_argument("--bin", type=Path, help="folder of llama.cpp's tools (default: ../shared/peers/llama-cpp.sh)")
    ap.add_argument("--peer-lib", type=Path, help="folder put first on llama.cpp's LD_LIBRARY_PATH")
    ap.add_argument("--repack", choices=("auto", "on", "off"), default="auto",
                    help="llama.cpp's weight repacking; auto: on unless a short run dies with SIGILL")
    ap.add_argument("--quick", action="store_true", help="smollm2-q4_0, pp128 + tg128, 1 round of 1: a smoke test")
    ap.add_argument("--out", type=Path, help="results file (default: bench/results/vs_llamacpp[_kv...][-quick].md)")
    args = ap.parse_args()
    check_kv_cache(args.kv_cache)
    if args.quick and args.models == ap.get_default("models"):
        args.models = "smollm2-q4_0"
    try:
        for test in (args.tests or "").split(","):
            if test:
                test_sizes(test)
    except ValueError as e:
        raise SystemExit(f"--tests: {e}") from None
    names = args.models.split(",")
    suffix = ("" if args.kv_cache == "f16" else f"_kv{args.kv_cache}") + ("-quick" if args.quick else "")
    out = args.out or HERE / "results" / f"vs_llamacpp{suffix}.md"

    peer = Peer(llama_bin(args.bin), peer_env(args.peer_lib), args.threads,
                tuple((args.peer_kv_cache or args.kv_cache).split(",")), ubatch=args.peer_ub,
                flash_attn=tuple(args.peer_fa.split(",")))
    started = time.monotonic()
    stamp, host = time.strftime("%Y-%m-%d %H:%M"), machine()
    warning = busy_warning()
    if warning:
        print("WARNING: " + warning, flush=True)
    commands = [f"python {command_line(sys.argv)}", "",
                f"# inferd, in this process per model: Engine(load_model(FILE), num_kv_blocks=<depth + longest test>, "
                f"max_batch_tokens={FILL_STEP}, max_seqs=1, threads={args.threads}"
                + (f", kv_cache_dtype={args.kv_cache!r}" if args.kv_cache != "f16" else "") + ");",
                f"# depth d filled in {FILL_STEP}-token steps untimed, one untimed warm-up prompt; ppN: N tokens at "
                f"d..d+N-1 in {FILL_STEP}-token steps; tgN: N one-token steps at d..d+N-1", "",
                "# llama.cpp, per model, round and depth:"]
    rows: list[Row] = []
    notes: list[str] = []
    for name in names:
        base = QUICK if args.quick else {**PLANS, **SHAPED_PLANS, **LOW_BIT_PLANS}.get(name, PLANS["smollm2-q4_1"])
        plan = Plan(tuple(args.tests.split(",")) if args.tests else base.tests,
                    tuple(int(d) for d in args.depths.split(",")) if args.depths else base.depths,
                    args.repeats or base.repeats, args.rounds or base.rounds)
        t0 = time.monotonic()
        if args.repack != "auto":
            peer.repack = args.repack == "on"
        else:
            peer.repack = repack_works(peer.bin_dir, model_file(name, peer.bin_dir), args.threads, peer.env)
        if not peer.repack:
            notes.append(f"{name}: llama.cpp's weight repacking died with SIGILL on this CPU (AMX the VM does not "
                         f"grant), so llama-bench ran with `--repack 0`; its prefill is slower than with repacking.")
            print("  " + notes[-1], flush=True)
        print(f"{name}: {', '.join(plan.tests)} at depths {', '.join(map(str, plan.depths))}, -r {plan.repeats}, "
              f"{plan.rounds} rounds", flush=True)
        model_rows, note = bench_model(name, plan, peer, args.threads, args.kv_cache, commands)
        rows += model_rows
        notes += [note] if note else []
        notes.append(f"{name}: {(time.monotonic() - t0) / 60:.1f} min")
        for row in model_rows:
            print("  | " + " | ".join(row.cells()) + " |", flush=True)
        swept = "" if peer.kv_caches == (args.kv_cache,) else f" (llama.cpp's {', '.join(peer.kv_caches)}" + (
            ", the best per test)" if len(peer.kv_caches) > 1 else ")")
        header = [f"# inferd vs llama.cpp ({stamp}, {args.threads} threads, "
                  f"{_cpu.get_path()} kernels, KV cache {args.kv_cache}{swept}, medians of all samples over ABBA "
                  f"rounds)",
                  "", f"Run took {(time.monotonic() - started) / 60:.1f} min" + (" so far." if name != names[-1]
                                                                                 else ".")]
        header += ["", machine_line(host) + f" llama.cpp: {peer_build(peer.bin_dir)}.", "", MEDIANS]
        if warning:
            header.append(f"**Warning**: {warning}.")
        data = {"kind": "vs_llamacpp", "date": stamp, "machine": host, "peer_build": peer_build(peer.bin_dir),
                "threads": args.threads, "kernels": _cpu.get_path(), "kv_cache": args.kv_cache,
                "complete": name == names[-1], "rows": [row.data() for row in rows], "notes": notes,
                "commands": commands, "warning": warning}
        write_results(out, report(rows, notes, commands, header), data)   # after every model: a cut run keeps its part
    print("\n" + out.read_text())
    print(f"wrote {out}")


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")   # for this process (numpy); llama.cpp's tools never see it
    main()
