"""What the benches against llama.cpp share: where its tools and our model files are, the environment its tools
run in, the ABBA order of interleaved rounds, the spread of a set of measurements, and the check that the machine
is quiet. Importing this module needs no compiled extension (tests/bench imports it in CI)."""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import TypeVar
from collections.abc import Sequence

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
T = TypeVar("T")

# ---- llama.cpp's tools and environment ------------------------------------------------------------------------

# llama.cpp's experts set none of these (llama-bench and llama-server take -t); this script sets
# OMP_NUM_THREADS=1 for itself (numpy), and that must not leak into the peer's process.
_DROPPED_PREFIXES = ("OMP_", "GOMP_", "KMP_")
HUGE_PAGES = "glibc.malloc.hugetlb=1"   # with -lm none the weights live in malloc: this puts them in huge pages


def llama_bin(given: Path | None = None) -> Path:
    """llama.cpp's tools: `given`, or the folder the team's peer script (../shared/peers/llama-cpp.sh, outside
    this repository) prints, building them once if needed (on a CPU with AMX it builds them without AMX, whose
    path in this llama.cpp release faults at its first `ldtilecfg`)."""
    if given is not None:
        if not (given / "llama-bench").exists():
            raise SystemExit(f"{given} has no llama-bench: pass the build's bin folder to --bin")
        return given
    script = ROOT.parent / "shared" / "peers" / "llama-cpp.sh"
    if not script.exists():
        raise SystemExit("pass --bin: the folder of llama.cpp's tools (llama-bench, llama-server)")
    out = subprocess.run(["bash", str(script)], check=True, capture_output=True, text=True).stdout
    return Path(out.strip().splitlines()[-1])


def peer_env(lib_dir: Path | None = None, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment llama.cpp's tools run in: ours without the OpenMP variables, with glibc's huge-page
    tunable, and `lib_dir` first on LD_LIBRARY_PATH when given (e.g. a libggml-cpu built without AMX)."""
    env = {k: v for k, v in (os.environ if base is None else base).items() if not k.startswith(_DROPPED_PREFIXES)}
    env["GLIBC_TUNABLES"] = HUGE_PAGES
    if lib_dir is not None:
        env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (str(lib_dir), env.get("LD_LIBRARY_PATH", "")) if p)
    return env


def peer_env_words(env: dict[str, str]) -> str:
    """The `env ...` prefix that gives a shell's command the environment `env` adds to and removes from ours."""
    dropped = sorted({"OMP_NUM_THREADS", *(k for k in os.environ if k.startswith(_DROPPED_PREFIXES))})
    words = [*(f"-u {k}" for k in dropped), f"GLIBC_TUNABLES={env['GLIBC_TUNABLES']}"]
    if "LD_LIBRARY_PATH" in env:
        words.append(f"LD_LIBRARY_PATH={env['LD_LIBRARY_PATH']}")
    return "env " + " ".join(words)


def command_line(argv: Sequence[str]) -> str:
    return shlex.join(str(a) for a in argv)


def repack_works(bin_dir: Path, model: Path, threads: int, env: dict[str, str]) -> bool:
    """Whether llama.cpp's weight repacking runs on this CPU. On a VM that reports AMX without granting its tile
    state, the repacked (AMX) path dies with SIGILL; the only way to know is to try a short run."""
    cmd = [str(bin_dir / "llama-bench"), "-m", str(model), "-t", str(threads), "-p", "64", "-n", "2", "-r", "1",
           "--no-warmup", "-o", "json"]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode in (-signal.SIGILL, 128 + signal.SIGILL):
        return False
    if r.returncode != 0:
        raise RuntimeError(f"llama-bench failed ({r.returncode}): {command_line(cmd)}\n{r.stderr[-2000:]}")
    return True


def test_sizes(name: str) -> tuple[int, int]:
    """llama-bench's test names: "pp512" -> (512 prompt tokens, 0 generated), "tg128" -> (0, 128)."""
    kind, digits = name[:2], name[2:]
    if kind not in ("pp", "tg") or not digits.isdigit() or int(digits) < 1:
        raise ValueError(f"a test is ppN (prefill N tokens) or tgN (decode N tokens), got {name!r}")
    return (int(digits), 0) if kind == "pp" else (0, int(digits))


def parse_llama_bench(text: str) -> dict[tuple[str, int], dict[str, list[float]]]:
    """llama-bench's JSON rows -> {(test, depth): {"fa1 ub512": samples tok/s}}."""
    out: dict[tuple[str, int], dict[str, list[float]]] = {}
    for row in json.loads(text):
        n_prompt, n_gen = row["n_prompt"], row["n_gen"]
        if n_prompt and n_gen or not (n_prompt or n_gen):
            raise ValueError(f"unexpected llama-bench row with n_prompt={n_prompt} n_gen={n_gen}")
        test = f"pp{n_prompt}" if n_prompt else f"tg{n_gen}"
        fa = row["flash_attn"]
        fa = int(fa) if isinstance(fa, (bool, int)) else {"enabled": 1, "disabled": 0}.get(str(fa), str(fa))
        config = f"fa{fa} ub{row['n_ubatch']}"
        if row.get("type_k", "f16") != "f16":           # a KV cache other than llama.cpp's default
            config += f" kv {row['type_k']}"
        samples = [float(v) for v in row.get("samples_ts") or [row["avg_ts"]]]
        out.setdefault((test, int(row.get("n_depth", 0))), {})[config] = samples
    return out


# ---- our model files ------------------------------------------------------------------------------------------

REAL_FILES = {"qwen2.5-coder-1.5b-q4_k_m": "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
              "gemma-3-270m-q4_k_m": "gemma-3-270m-q4_k_m.gguf"}
# Qwen2.5-Coder-1.5B re-quantized to the low-bit types by llama-quantize from the Q4_K_M file, made on first use into
# the same folder (tests/engine/test_qwen_low_bit.py reads them there): bench name -> (file, llama-quantize's type);
# the IQ mixes with an importance matrix from llama-imatrix over llama.cpp's own docs/build.md (four 512-token chunks)
LOW_BIT_FILES = {f"qwen2.5-coder-1.5b-{t.lower()}": (f"qwen2.5-coder-1.5b-instruct-{t.lower()}.gguf", t)
                 for t in ("Q2_K", "Q3_K_M", "IQ4_XS", "IQ3_M", "IQ2_M")}
# bench name -> (the script that writes it, its shape): random weights at a real model's shape, made on first use
# (never committed)
SHAPED_FILES = {"qwen3-30b-a3b-q4_k_m": ("make_moe_model.py", "qwen3-30b-a3b"),
                "gpt-oss-20b-mxfp4": ("make_moe_model.py", "gpt-oss-20b"),
                "qwen3.5-2b-q4_k_m": ("make_qwen35_model.py", "qwen3.5-2b")}


def real_file(name: str) -> Path:
    """One of the REAL_FILES, where ../shared/models/fetch.sh put it ($INFERD_TEST_MODELS or
    ~/.cache/inferd-test-models)."""
    folder = Path(os.environ.get("INFERD_TEST_MODELS", Path.home() / ".cache" / "inferd-test-models"))
    path = folder / REAL_FILES[name]
    if not path.exists():
        raise SystemExit(f"{path} is missing: run ../shared/models/fetch.sh first")
    return path


def decode_bench_args(ap: argparse.ArgumentParser) -> None:
    """-m MODEL and -t THREADS of the in-process decode benches (decode_kernels.py, batch_decode.py): MODEL a name of
    REAL_FILES (default: the Qwen2.5-Coder-1.5B Q4_K_M file) or a path or name `inferd pull` resolves"""
    ap.add_argument("-m", "--model", default="qwen2.5-coder-1.5b-q4_k_m")
    ap.add_argument("-t", "--threads", type=int, default=2)


def bench_model_path(spec: str) -> Path:
    """decode_bench_args' MODEL as a file"""
    from inferd.model.pull import resolve

    return real_file(spec) if spec in REAL_FILES else resolve(spec)


def model_file(name: str, bin_dir: Path) -> Path:
    """The GGUF a bench model name stands for, made on first use: smollm2-q4_1 is the PyPI download, its Q4_0/Q8_0
    are requantized from it with llama-quantize, tinyllama-<type> is random (make_random_model.py), the
    SHAPED_FILES random at a real model's shape (make_moe_model.py, make_qwen35_model.py; Qwen2.5's vocabulary);
    the REAL_FILES are downloads (../shared/models/fetch.sh, into $INFERD_TEST_MODELS or
    ~/.cache/inferd-test-models)."""
    from inferd.model.pull import DEFAULT_MODEL, cache_dir, resolve

    if name in REAL_FILES:
        return real_file(name)
    if name in LOW_BIT_FILES:
        return low_bit_file(name, bin_dir)
    folder = cache_dir() / "bench"
    folder.mkdir(parents=True, exist_ok=True)
    if name in SHAPED_FILES:
        out = folder / f"{name}-shape-random.gguf"
        if not out.exists():  # written beside, then renamed: a run cut short leaves no file that looks whole
            part = out.with_suffix(".part")
            script, shape = SHAPED_FILES[name]
            subprocess.run([sys.executable, str(HERE / script), str(part), "--shape", shape,
                            "--vocab-from", str(real_file("qwen2.5-coder-1.5b-q4_k_m"))], check=True,
                           stdout=subprocess.DEVNULL)
            part.rename(out)
        return out
    family, _, qtype = name.partition("-")
    if family not in ("smollm2", "tinyllama") or qtype not in ("q4_0", "q4_1", "q8_0"):
        raise SystemExit(f"unknown model {name!r}: smollm2-q4_0|q4_1|q8_0, tinyllama-q4_0|q4_1|q8_0, "
                         f"or one of {', '.join([*REAL_FILES, *LOW_BIT_FILES, *SHAPED_FILES])}")
    base = resolve(DEFAULT_MODEL, progress=False)
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


# ---- order and statistics -------------------------------------------------------------------------------------


def low_bit_file(name: str, bin_dir: Path) -> Path:
    """One of the LOW_BIT_FILES, re-quantized from the Qwen Q4_K_M file with llama-quantize --allow-requantize where
    it is absent, as tests/engine/test_qwen_low_bit.py makes them: the codebook mixes IQ3_M and IQ2_M with an
    importance matrix (llama-imatrix -c 512 --chunks 4 over llama.cpp's docs/build.md, from the source folder above
    bin_dir), the others without one."""
    file_name, qtype = LOW_BIT_FILES[name]
    base = real_file("qwen2.5-coder-1.5b-q4_k_m")
    out = base.parent / file_name
    if out.exists():
        return out
    extra: list[str] = []
    if qtype in ("IQ3_M", "IQ2_M"):
        imatrix = base.parent / "qwen2.5-coder-1.5b-instruct.imatrix.dat"
        if not imatrix.exists():
            text = next((d / "docs" / "build.md" for d in bin_dir.parents if (d / "docs" / "build.md").exists()), None)
            if text is None:
                raise SystemExit(f"no llama.cpp docs/build.md above {bin_dir} for the importance matrix")
            subprocess.run([str(bin_dir / "llama-imatrix"), "-m", str(base), "-f", str(text), "-c", "512", "--chunks",
                            "4", "-t", "2", "-o", str(imatrix)], check=True, capture_output=True)
        extra = ["--imatrix", str(imatrix)]
    part = out.with_suffix(".part")   # renamed when whole
    subprocess.run([str(bin_dir / "llama-quantize"), "--allow-requantize", *extra, str(base), str(part), qtype],
                   check=True, capture_output=True)
    part.rename(out)
    return out


def abba(round_index: int, pair: Sequence[T]) -> list[T]:
    """The order of a pair in round `round_index`: A B, then B A, ... so that over two rounds each side has run
    first and last once, and a machine that speeds up or slows down through a run favours neither."""
    if len(pair) != 2:
        raise ValueError(f"ABBA orders a pair, got {len(pair)} items")
    return list(pair) if round_index % 2 == 0 else list(pair)[::-1]


def spread(values: Sequence[float]) -> tuple[float, float]:
    """(min, max) of `values`; raises ValueError on none."""
    if not values:
        raise ValueError("no values to spread")
    return min(values), max(values)


def median(values: Sequence[float]) -> float:
    if not values:
        raise ValueError("no values for a median")
    return statistics.median(values)


def best_config(samples: dict[str, list[float]]) -> str:
    """The configuration whose samples have the highest median (ties: the first given)."""
    if not samples:
        raise ValueError("no configurations to choose from")
    return max(samples, key=lambda k: median(samples[k]))


def fmt_range(values: Sequence[float], digits: int = 1) -> str:
    lo, hi = spread(values)
    return f"{lo:.{digits}f}-{hi:.{digits}f}"


# ---- a quiet machine ------------------------------------------------------------------------------------------

def cpu_busy(seconds: float = 1.0) -> float:
    """Fraction of all cores busy over `seconds` (from /proc/stat; 0 where it cannot be read)."""
    def sample():
        with open("/proc/stat") as f:
            values = [int(x) for x in f.readline().split()[1:]]
        return sum(values), values[3] + values[4]   # total, idle + iowait
    try:
        t0, i0 = sample()
        time.sleep(seconds)
        t1, i1 = sample()
    except (OSError, ValueError, IndexError):
        return 0.0
    return 1.0 - (i1 - i0) / max(1, t1 - t0)


def busy_warning() -> str | None:
    """Both engines should get every core: another busy process makes the numbers meaningless (say so)."""
    busy = cpu_busy()
    if busy > 0.15:
        return (f"other processes kept {busy:.0%} of the cores busy just before the run; they compete with the "
                f"benchmarked engines, so these numbers are unreliable")
    return None


# ---- what a results file records ------------------------------------------------------------------------------

SIMD_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_int8")


def machine() -> dict[str, object]:
    """The machine a run measured: CPU model name, its SIMD flags that the kernels dispatch on, cores, memory."""
    model, flags = "unknown", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and model == "unknown":
                model = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = set(value.split())
        mem_kb = int(Path("/proc/meminfo").read_text().split()[1])
    except (OSError, ValueError, IndexError):
        mem_kb = 0
    return {"cpu": model, "simd": [f for f in SIMD_FLAGS if f in flags], "cores": os.cpu_count(),
            "memory_gib": round(mem_kb / 2**20, 1)}


def available_memory() -> int:
    """bytes the kernel says a new allocation can have (MemAvailable), 0 where /proc/meminfo cannot be read"""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def machine_line(m: dict[str, object]) -> str:
    simd = ", ".join(m["simd"]) or "no AVX2"   # type: ignore[arg-type]
    return f"Machine: {m['cpu']} ({simd}), {m['cores']} cores, {m['memory_gib']} GiB."


def peer_build(bin_dir: Path) -> str:
    """The llama.cpp build the peer's tools come from (its folder names the release and the AMX choice)."""
    return bin_dir.resolve().parent.parent.name if bin_dir.name == "bin" else str(bin_dir)


def write_results(md_path: Path, markdown: str, data: dict[str, object]) -> None:
    """A results file is written whole, with its data beside it as JSON (what bench/tables.py reads)."""
    md_path.parent.mkdir(parents=True, exist_ok=True)
    md_path.write_text(markdown)
    md_path.with_suffix(".json").write_text(json.dumps(data, indent=1) + "\n")


# ---- how a results file states its figures --------------------------------------------------------------------

MEDIANS = ("Each side's figure is the median of all its samples over the rounds; the ratio is the ratio of those "
           "medians, and its spread the range of the per-round ratios (each round's medians divided), so a median "
           "can lie outside the range of the rounds' ratios when rounds differ in speed.")


def publish_results(md_path: Path, markdown: str, data: dict[str, object], where_else: str = "") -> None:
    """Write a results file whole with its JSON, show it, and say where it went."""
    write_results(md_path, markdown, data)
    print("\n" + markdown)
    print(f"wrote {md_path} and {md_path.with_suffix('.json').name}{where_else}")


def results_head(title: str, stamp: str, host: dict[str, object], peer: str) -> list[str]:
    """The first lines of a results file: its title and date, the machine and the peer's build, and how its
    medians and ranges are computed (MEDIANS)."""
    return [f"# {title} ({stamp})", "", f"{machine_line(host)} {peer}.", "", MEDIANS]


def stats(values: Sequence[float]) -> dict[str, object]:
    """A side's figures as the JSON keeps them: median, range and every sample."""
    return {"median": median(values), "min": min(values), "max": max(values), "samples": list(values)}


def fmt_median(values: Sequence[float], spec: str = ".1f") -> str:
    """`median (min-max)` of `values`, each formatted with `spec`."""
    lo, hi = spread(values)
    return f"{median(values):{spec}} ({lo:{spec}}-{hi:{spec}})"


def ratio_of_medians(num: Sequence[Sequence[float]], den: Sequence[Sequence[float]]) -> tuple[float, list[float]]:
    """Two sides' samples, one list per round -> (the ratio of the medians of all their samples, the ratio of each
    round's medians), as MEDIANS states. Rounds missing on either side are left out of both."""
    n = min(len(num), len(den))
    if n == 0:
        raise ValueError("no rounds to compare")
    pooled_num = [x for r in num[:n] for x in r]
    pooled_den = [x for r in den[:n] for x in r]
    return median(pooled_num) / median(pooled_den), [median(a) / median(b) for a, b in zip(num[:n], den[:n])]


def fmt_ratio(ratio: float, per_round: Sequence[float]) -> str:
    """`1.23x (1.10-1.30)`: a ratio of medians and the range of its per-round ratios (or `1 round`)."""
    return f"{ratio:.2f}x ({fmt_range(per_round, 2) if len(per_round) > 1 else '1 round'})"


def stop_on_sigterm() -> None:
    """`timeout` ends a run with SIGTERM: raise SystemExit instead, so that clean-ups run and the finished part of
    the run is written, marked partial."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))


def stop_reason(error: BaseException) -> str:
    """What stopped a run early, in words for its results file."""
    if isinstance(error, KeyboardInterrupt):
        return "interrupted"
    if isinstance(error, asyncio.CancelledError):   # how a signal reaches a coroutine that asyncio.run ran
        return "interrupted, or stopped by SIGTERM (a timeout)"
    if isinstance(error, SystemExit) and error.code == 143:
        return "stopped by SIGTERM (a timeout)"
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text[:300]}" if text else type(error).__name__


def partial_note(done: int, planned: int, unit: str, reason: str) -> str:
    """The line a partial run's results file carries right below its head."""
    return (f"**Partial run**: {done} of {planned} {unit} finished before it stopped ({reason}); the figures are "
            f"those of the finished {unit} only.")
