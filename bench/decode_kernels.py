"""Whole decode steps with the ymm tile kernels vs the zmm pair kernels for Q4_K/Q6_K, or with --prefetch the decode
kernels' software prefetch always / never / as the CPU's default / for tiles up to 16 KB, set on the engine's
context (its KernelConfig: set_decode_kernels, set_decode_prefetch), alternating in one process (ABC CBA ...), next
to the read-bandwidth probe of the same run. All give the same bits: the generated tokens are checked equal.

    python bench/decode_kernels.py [-m MODEL] [-t 2] [--decode 64] [--rounds 3] [--prefetch]
(MODEL: qwen2.5-coder-1.5b-q4_k_m (the default) or gemma-3-270m-q4_k_m of ../shared/models/fetch.sh, or a path)
"""

from __future__ import annotations

import argparse
import statistics
import time

from _common import bench_model_path, decode_bench_args
from inferd import _cpu
from inferd.engine.engine import Engine
from inferd.engine.runner import blocks_needed
from inferd.engine.types import SeqInput
from inferd.model.loader import load_model


def decode(engine: Engine, prompt: list[int], n: int) -> tuple[float, float, list[int]]:
    """tokens per second of wall time and of the process's CPU time (with 1 thread, the latter does not count the
    time the scheduler gave to other processes of a shared machine), and the tokens"""
    table = list(range(blocks_needed(len(prompt) + n + 1)))
    token = engine.step([SeqInput(prompt, 0, table, 1)])[0].tokens[0]
    pos, out = len(prompt), []
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(n):
        token = engine.step([SeqInput([token], pos, table, 1)])[0].tokens[0]
        out.append(token)
        pos += 1
    return n / (time.perf_counter() - t0), n / (time.process_time() - c0), out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    decode_bench_args(ap)
    ap.add_argument("--decode", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prefetch", action="store_true", help="compare the software prefetch settings instead")
    args = ap.parse_args()
    model = load_model(bench_model_path(args.model))
    engine = Engine(
        model, num_kv_blocks=blocks_needed(args.decode + 32), max_batch_tokens=64, max_seqs=1, threads=args.threads
    )
    prompt = [(i * 7919) % (engine.vocab_size - 10) + 5 for i in range(16)]
    print(f"{model.model_name}: {engine.threads} threads, {engine.kernel_path} path")
    kernels = engine._ctx.kernels  # the context's kernel settings
    default_prefetch = kernels.decode_prefetch()
    if args.prefetch:
        default_name = "every tile" if default_prefetch is None else f"tiles <= {default_prefetch} B"
        settings = {
            "prefetch always": lambda: kernels.set_decode_prefetch(None),
            "prefetch never": lambda: kernels.set_decode_prefetch(0),
            f"prefetch default ({default_name})": lambda: kernels.set_decode_prefetch(default_prefetch),
        }
        if default_prefetch != 16 << 10:  # AMD's rule, where it is not the default
            settings["prefetch tiles <= 16384 B"] = lambda: kernels.set_decode_prefetch(16 << 10)
    else:
        settings = {k: (lambda k=k: kernels.set_decode_kernels(k)) for k in _cpu.DECODE_KERNELS}
    rates: dict[str, list[float]] = {k: [] for k in settings}
    cpu_rates: dict[str, list[float]] = {k: [] for k in settings}
    tokens: dict[str, list[int]] = {}
    probes = []
    decode(engine, prompt, 4)  # warm up
    for r in range(args.rounds):
        probes.append(_cpu.measure_read_bandwidth(256 << 20, args.threads) / 1e9)
        for name in list(settings) if r % 2 == 0 else list(settings)[::-1]:
            settings[name]()
            rate, cpu_rate, out = decode(engine, prompt, args.decode)
            rates[name].append(rate)
            cpu_rates[name].append(cpu_rate)
            assert tokens.setdefault(name, out) == out, f"{name} gave other tokens"
    assert len({tuple(t) for t in tokens.values()}) == 1, "the settings gave different tokens"
    print(f"read bandwidth probe ({args.threads} threads): " + " ".join(f"{b:.1f}" for b in probes) + " GB/s")
    first = next(iter(settings))
    for what, table in (("wall", rates), ("CPU time", cpu_rates)):
        for name, r in table.items():
            print(
                f"{name:40s} tok/s of {what}: "
                + " ".join(f"{x:.1f}" for x in r)
                + f"   median {statistics.median(r):.1f}   / {first}: "
                + f"{statistics.median(r) / statistics.median(table[first]):.2f}"
            )


if __name__ == "__main__":
    main()
