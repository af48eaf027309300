"""Whole decode steps with the ymm tile kernels vs the zmm pair kernels for Q4_K/Q6_K (_cpu.set_decode_kernels),
alternating in one process (ABAB...), next to the read-bandwidth probe of the same run. Both give the same bits: the
generated tokens are checked equal.

    python bench/decode_kernels.py [-m MODEL] [-t 2] [--decode 64] [--rounds 3]
(MODEL: a path or name; default the Qwen2.5-Coder-1.5B Q4_K_M file of ../shared/models/fetch.sh)
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from inferd import _cpu
from inferd.engine.engine import Engine
from inferd.engine.runner import blocks_needed
from inferd.engine.types import SeqInput
from inferd.model.loader import load_model
from inferd.model.pull import resolve


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
    ap.add_argument(
        "-m",
        "--model",
        default=os.path.expanduser("~/.cache/inferd-test-models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"),
    )
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--decode", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    model = load_model(resolve(args.model))
    engine = Engine(
        model, num_kv_blocks=blocks_needed(args.decode + 32), max_batch_tokens=64, max_seqs=1, threads=args.threads
    )
    prompt = [(i * 7919) % (engine.vocab_size - 10) + 5 for i in range(16)]
    print(f"{model.model_name}: {engine.threads} threads, {engine.kernel_path} path")
    rates: dict[str, list[float]] = {k: [] for k in _cpu.DECODE_KERNELS}
    cpu_rates: dict[str, list[float]] = {k: [] for k in _cpu.DECODE_KERNELS}
    tokens: dict[str, list[int]] = {}
    probes = []
    decode(engine, prompt, 4)  # warm up
    for _ in range(args.rounds):
        probes.append(_cpu.measure_read_bandwidth(256 << 20, args.threads) / 1e9)
        for kernels in _cpu.DECODE_KERNELS:
            _cpu.set_decode_kernels(kernels)
            rate, cpu_rate, out = decode(engine, prompt, args.decode)
            rates[kernels].append(rate)
            cpu_rates[kernels].append(cpu_rate)
            assert tokens.setdefault(kernels, out) == out
    _cpu.set_decode_kernels("avx512")
    assert tokens["tiles"] == tokens["avx512"], "the decode kernels gave different tokens"
    print(f"read bandwidth probe ({args.threads} threads): " + " ".join(f"{b:.1f}" for b in probes) + " GB/s")
    for what, table in (("wall", rates), ("CPU time", cpu_rates)):
        for kernels, r in table.items():
            print(
                f"{kernels:8s} tok/s of {what}: "
                + " ".join(f"{x:.1f}" for x in r)
                + f"   median {statistics.median(r):.1f}"
            )
        print(
            f"ratio avx512 / tiles ({what}, medians): "
            f"{statistics.median(table['avx512']) / statistics.median(table['tiles']):.2f}"
        )


if __name__ == "__main__":
    main()
