"""inferd vs llama.cpp on the same GGUF files, same thread count, in one run.

    python bench/vs_llamacpp.py [-t 2] [-r 3] [--rounds 2]
        [--models smollm2-q4_0,smollm2-q4_1,smollm2-q8_0,tinyllama-q4_0,qwen2.5-coder-1.5b-q4_k_m]

For each model, `--rounds` rounds in ABBA order (llama.cpp then inferd, then inferd then llama.cpp, ...), so that
a shared machine's slow phases fall on both: llama-bench (pp128, pp512, tg128; -r repeats) tuned as its users
would (both -fa 0 and -fa 1, the better kept; -lm none: weights read into glibc malloc, which the tunable puts
in huge pages), then inferd's equivalent in this
process: ppN = N prompt tokens from an empty cache in one step; tg128 = 128 single-token decode steps after one
prompt token. Each side's figure is the median of all its samples (llama-bench's samples_ts). Also prints decode
GB/s (weight bytes read per token x tok/s) against the read bandwidth measured with the same thread count right
after that model's runs. The SmolLM2 Q4_0/Q8_0 files are requantized from the PyPI Q4_1 file with
llama-quantize; the TinyLlama-shaped file is random (bench/make_random_model.py); qwen2.5-coder-1.5b-q4_k_m and
gemma-3-270m-q4_k_m are the real downloads (../shared/models/fetch.sh, into $INFERD_TEST_MODELS or
~/.cache/inferd-test-models).
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
sys.path.insert(0, str(HERE.parent))

from inferd import _cpu  # noqa: E402
from inferd.engine.engine import Engine  # noqa: E402
from inferd.engine.types import SeqInput  # noqa: E402
from inferd.engine.runner import blocks_needed  # noqa: E402
from inferd.model.loader import load_model  # noqa: E402
from inferd.model.pull import DEFAULT_MODEL, cache_dir, resolve  # noqa: E402

TESTS = [("pp128", 128, 0), ("pp512", 512, 0), ("tg128", 0, 128)]


def llama_bin(given: Path | None = None) -> Path:
    """llama.cpp's tools: `given`, or the folder ../shared/peers/llama-cpp.sh prints (which builds them if needed)."""
    if given is not None:
        return given
    script = HERE.parent.parent / "shared" / "peers" / "llama-cpp.sh"
    out = subprocess.run(["bash", str(script)], check=True, capture_output=True, text=True).stdout
    return Path(out.strip().splitlines()[-1])


REAL_FILES = {"qwen2.5-coder-1.5b-q4_k_m": "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
              "gemma-3-270m-q4_k_m": "gemma-3-270m-q4_k_m.gguf"}


def model_file(name: str, bin_dir: Path) -> Path:
    if name in REAL_FILES:
        folder = Path(os.environ.get("INFERD_TEST_MODELS", Path.home() / ".cache" / "inferd-test-models"))
        path = folder / REAL_FILES[name]
        if not path.exists():
            raise SystemExit(f"{path} is missing: run ../shared/models/fetch.sh first")
        return path
    folder = cache_dir() / "bench"
    folder.mkdir(parents=True, exist_ok=True)
    base = resolve(DEFAULT_MODEL, progress=False)
    family, qtype = name.split("-")
    if family == "smollm2":
        if qtype == "q4_1":
            return base
        out = folder / f"SmolLM2-135M-Instruct.{qtype.upper()}.gguf"
        if not out.exists():
            subprocess.run([str(bin_dir / "llama-quantize"), "--allow-requantize", str(base), str(out),
                            qtype.upper()], check=True, capture_output=True)
        return out
    out = folder / f"tinyllama-shape-random.{qtype.upper()}.gguf"
    if not out.exists():
        subprocess.run([sys.executable, str(HERE / "make_random_model.py"), str(out), "--type", qtype.upper(),
                        "--vocab-from", str(base)], check=True)
    return out


def run_llama_bench(bin_dir: Path, path: Path, threads: int, repeats: int) -> dict[str, list[float]]:
    """Samples (tok/s) per test, of the better flash-attention setting per test (by median)."""
    prompts = ",".join(str(n) for _, n, _ in TESTS if n) or "0"
    gens = ",".join(str(n) for _, _, n in TESTS if n) or "0"
    cmd = [str(bin_dir / "llama-bench"), "-m", str(path), "-t", str(threads), "-p", prompts, "-n", gens,
           "-fa", "0,1", "-lm", "none", "-r", str(repeats), "-o", "json"]
    env = dict(os.environ, GLIBC_TUNABLES="glibc.malloc.hugetlb=1")
    rows = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout)
    out: dict[str, list[float]] = {}
    for r in rows:
        if r["n_prompt"] == 0 and r["n_gen"] == 0:
            continue
        key = f"pp{r['n_prompt']}" if r["n_gen"] == 0 else f"tg{r['n_gen']}"
        samples = [float(v) for v in r.get("samples_ts") or [r["avg_ts"]]]
        if key not in out or statistics.median(samples) > statistics.median(out[key]):
            out[key] = samples
    return out


def make_engine(path: Path, threads: int) -> Engine:
    return Engine(load_model(path), num_kv_blocks=blocks_needed(512 + 130), max_batch_tokens=512, max_seqs=1,
                  threads=threads)


def run_inferd(engine: Engine, repeats: int) -> dict[str, list[float]]:
    """Samples (tok/s) per test."""
    table = list(range(engine.num_kv_blocks))
    vocab = engine.vocab_size
    prompt = [(i * 7919 + 13) % (vocab - 100) + 50 for i in range(512)]
    engine.step([SeqInput(prompt[:32], 0, table, 1)])                # warm-up: pages, pool, caches
    results = {}
    for name, n_prompt, n_gen in TESTS:
        times: list[float] = []
        for _ in range(repeats):
            if n_prompt:
                t0 = time.perf_counter()
                engine.step([SeqInput(prompt[:n_prompt], 0, table, 1)])
                times.append(time.perf_counter() - t0)
            else:
                token = engine.step([SeqInput(prompt[:1], 0, table, 1)])[0].tokens[0]
                t0 = time.perf_counter()
                for pos in range(1, n_gen + 1):
                    token = engine.step([SeqInput([token], pos, table, 1)])[0].tokens[0]
                times.append(time.perf_counter() - t0)
        results[name] = [(n_prompt or n_gen) / t for t in times]
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-r", "--repeats", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2, help="interleaved rounds per model (ABBA order)")
    ap.add_argument("--tests", default="pp128,pp512,tg128", help="a subset of pp128,pp512,tg128")
    ap.add_argument("--bin", type=Path, help="folder of llama.cpp's tools (default: ../shared/peers/llama-cpp.sh)")
    ap.add_argument("--models", default="smollm2-q4_0,smollm2-q4_1,smollm2-q8_0,tinyllama-q4_0")
    ap.add_argument("--out", type=Path, default=HERE / "results" / "vs_llamacpp.md")
    args = ap.parse_args()
    TESTS[:] = [t for t in TESTS if t[0] in args.tests.split(",")]

    bin_dir = llama_bin(args.bin)
    lines = [f"# inferd vs llama.cpp ({time.strftime('%Y-%m-%d %H:%M')}, {args.threads} threads, "
             f"{_cpu.get_path()} kernels, {args.rounds} interleaved rounds of {args.repeats} samples, medians; "
             f"llama.cpp: best of -fa 0/1, malloc in huge pages)", "",
             "| model | test | llama.cpp tok/s | inferd tok/s | ratio |", "| --- | --- | ---: | ---: | ---: |"]
    notes = []
    for name in args.models.split(","):
        path = model_file(name, bin_dir)
        engine = make_engine(path, args.threads)
        peer_samples: dict[str, list[float]] = {}
        our_samples: dict[str, list[float]] = {}
        for r in range(args.rounds):
            sides = [("peer", peer_samples), ("ours", our_samples)]
            for side, into in sides if r % 2 == 0 else sides[::-1]:
                got = (run_llama_bench(bin_dir, path, args.threads, args.repeats) if side == "peer"
                       else run_inferd(engine, args.repeats))
                for test, values in got.items():
                    into.setdefault(test, []).extend(values)
        peer = {t: statistics.median(v) for t, v in peer_samples.items()}
        ours = {t: statistics.median(v) for t, v in our_samples.items()}
        for test, _, _ in TESTS:
            lines.append(f"| {name} | {test} | {peer[test]:.1f} | {ours[test]:.1f} | {ours[test] / peer[test]:.2f}x |")
        # measured right after the runs it is compared with: this VM's bandwidth drifts by 2x between phases
        bandwidth = _cpu.measure_read_bandwidth(512 << 20, args.threads, 5)
        gbs = engine.weight_bytes * ours.get("tg128", 0.0) / 1e9
        if gbs:
            notes.append(f"{name}: decode reads {engine.weight_bytes / 1e6:.0f} MB of weights per token -> "
                         f"{gbs:.1f} GB/s = {gbs * 1e9 / bandwidth:.0%} of the read bandwidth measured right "
                         f"after ({bandwidth / 1e9:.1f} GB/s, {args.threads} threads)")
        print("\n".join(lines[-len(TESTS):]), flush=True)
        del engine
    report = "\n".join(lines + [""] + notes) + "\n"
    print("\n" + report)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(report)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
