"""Per-stage profile of inferd's forward pass: where a prefill and a decode step spend their time.

    python bench/profile.py [-m MODEL] [-t THREADS] [--prompt 512] [--decode 128]

The stage times are wall-clock; the process' CPU time (all threads) is printed beside them: on a shared machine the
wall-clock figures grow with the other processes' load, the CPU time much less, so compare runs by CPU time there
(and by perf's per-symbol shares: `perf record -e cpu-clock -p PID` once the model has loaded).
"""
from __future__ import annotations

import argparse
import resource
import time

from inferd.engine.engine import Engine
from inferd.engine.types import SeqInput
from inferd.engine.runner import blocks_needed
from inferd.model.loader import load_model
from inferd.model.pull import resolve


def profile(engine: Engine, prompt_len: int, decode: int) -> None:
    table = list(range(blocks_needed(prompt_len + decode + 1)))
    tokens = [(i * 7919) % (engine.vocab_size - 10) + 5 for i in range(prompt_len)]
    engine.wait_huge_pages()                                                 # timed in 2 MB pages, as served
    engine.step([SeqInput(tokens[:16], 0, table, 1, state_slot=0)])        # warm up
    ctx = engine._ctx
    ctx.set_profiling(True)
    t0, c0 = time.perf_counter(), cpu_seconds()
    pos = 0
    while pos < prompt_len:
        chunk = tokens[pos:pos + engine.max_batch_tokens]
        out = engine.step([SeqInput(chunk, pos, table, 1, state_slot=0)])[0]
        pos += len(chunk)
    prefill, cpu = time.perf_counter() - t0, cpu_seconds() - c0
    report("prefill", prompt_len, prefill, cpu, ctx.profile())
    ctx.set_profiling(True)
    t0, c0 = time.perf_counter(), cpu_seconds()
    token = out.tokens[0]
    for _ in range(decode):
        token = engine.step([SeqInput([token], pos, table, 1, state_slot=0)])[0].tokens[0]
        pos += 1
    report("decode", decode, time.perf_counter() - t0, cpu_seconds() - c0, ctx.profile())
    ctx.set_profiling(False)


def cpu_seconds() -> float:
    """user + system time of every thread of this process so far"""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def report(name: str, tokens: int, seconds: float, cpu: float, stages: dict) -> None:
    inside = sum(stages.values())
    print(f"\n{name}: {tokens} tokens in {seconds * 1e3:.1f} ms = {tokens / seconds:.1f} tok/s "
          f"(C stages {inside / seconds:.1%} of wall time; CPU time {cpu * 1e3:.1f} ms, all threads)")
    for stage, t in sorted(stages.items(), key=lambda kv: -kv[1]):
        if t:
            print(f"  {stage:16s} {t * 1e3:9.2f} ms  {t / seconds:6.1%}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", default="smollm2-135m-instruct")
    ap.add_argument("-t", "--threads", type=int, default=None)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--decode", type=int, default=128)
    args = ap.parse_args()
    model = load_model(resolve(args.model))
    engine = Engine(model, num_kv_blocks=blocks_needed(args.prompt + args.decode + 1), max_batch_tokens=512,
                    max_seqs=1, threads=args.threads)
    print(f"{model.model_name}: {engine.threads} threads, {engine.kernel_path} kernels")
    profile(engine, args.prompt, args.decode)


if __name__ == "__main__":
    main()
