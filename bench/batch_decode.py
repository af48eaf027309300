"""Batched decode steps (B sequences, one token each) on the default kernels vs the ymm tile kernels, alternating in
one process (ABAB ...). By default up to 16 tokens run the zmm decode kernels (qdecode512.c, tiles unpacked once
for up to QDECODE_TOKENS (8) of them, 9 to 16 in two passes; Q8_0 has none) and more the pair kernels; "ymm
tiles" turns both off (the engine context's KernelConfig: set_prefill_kernels, set_decode_kernels), which is what
every batch under 16 tokens ran before. Both give the same bits: the generated tokens are checked equal.

    python bench/batch_decode.py [-m MODEL] [-t 2] [--batches 1,2,3,4,5,6,8,12] [--steps 24] [--rounds 3]
(MODEL: qwen2.5-coder-1.5b-q4_k_m (the default) or gemma-3-270m-q4_k_m of ../shared/models/fetch.sh, or a path)
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

from _common import bench_model_path, decode_bench_args
from inferd.engine.engine import Engine
from inferd.engine.runner import blocks_needed
from inferd.engine.types import SeqInput
from inferd.model.loader import load_model

PROMPT = 100


def batch_engine(model, most: int, prompt: int, steps: int, threads: int) -> Engine:
    """An engine with room for `most` sequences of step_times' `prompt` and `steps`"""
    return Engine(model, num_kv_blocks=most * blocks_needed(prompt + steps + 1), max_batch_tokens=512,
                  max_seqs=most, threads=threads)


def prompt_ids(engine: Engine, s: int, prompt: int) -> list[int]:
    """Sequence `s`'s `prompt` token ids: distinct per sequence, within the vocabulary"""
    return [(i * 7919 + 31 * s) % (engine.vocab_size - 10) + 5 for i in range(prompt)]


def decoder(engine: Engine, batch: int, n: int, prompt: int = PROMPT) -> Callable[[], list[int]]:
    """Prefills `batch` sequences of a `prompt`-token prompt each (in the engine's largest steps; recurrent models: a
    state slot each) and returns what runs the next of `n` decode steps of all of them, returning their tokens."""
    per_seq = blocks_needed(prompt + n + 1)
    tables = [list(range(i * per_seq, (i + 1) * per_seq)) for i in range(batch)]

    def seq(tokens: list[int], pos: int, s: int) -> SeqInput:
        return SeqInput(tokens, pos, tables[s], 1, state_slot=s if engine.num_state_slots else -1)

    last = []
    for s in range(batch):
        ids = prompt_ids(engine, s, prompt)
        for pos in range(0, prompt, engine.max_batch_tokens):
            res = engine.step([seq(ids[pos:pos + engine.max_batch_tokens], pos, s)])
        last.append(res[0].tokens[0])
    pos = prompt

    def step() -> list[int]:
        nonlocal last, pos
        res = engine.step([seq([last[s]], pos, s) for s in range(batch)])
        last, pos = [r.tokens[0] for r in res], pos + 1
        return last

    return step


def step_times(engine: Engine, batch: int, n: int, prompt: int = PROMPT, warm_up: int = 0,
               profile: bool = False) -> tuple[list[float], list[list[int]]]:
    """Seconds of each of `n` decode steps of `batch` sequences after a `prompt`-token prompt each (decoder) and
    `warm_up` untimed steps, and their tokens; with `profile`, the stage profiler is on for the timed steps (the
    engine context's profile() reads it)."""
    step = decoder(engine, batch, warm_up + n, prompt)
    out: list[list[int]] = [[] for _ in range(batch)]
    times = []
    for k in range(warm_up + n):
        if profile and k == warm_up:
            engine._ctx.set_profiling(True)
        t0 = time.perf_counter()
        last = step()
        if k >= warm_up:
            times.append(time.perf_counter() - t0)
        for s in range(batch):
            out[s].append(last[s])
    return times, out


def steps(engine: Engine, batch: int, n: int) -> tuple[float, list[list[int]]]:
    """ms per step of `n` decode steps of `batch` sequences after a PROMPT-token prompt each, and their tokens"""
    times, out = step_times(engine, batch, n)
    return sum(times) / n * 1e3, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    decode_bench_args(ap)
    ap.add_argument("--batches", default="1,2,3,4,5,6,8,12")
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    model = load_model(bench_model_path(args.model))
    engine = batch_engine(model, max(batches), PROMPT, args.steps, args.threads)
    kernels = engine._ctx.kernels  # the context's kernel settings
    default = (kernels.prefill_kernels(), kernels.decode_kernels())
    kinds = {"default": default, "ymm tiles": ("tiles", "tiles")}
    print(
        f"{model.model_name}: {engine.threads} threads, {engine.kernel_path} path, prefill / decode kernels {default}"
    )
    print("\n| sequences | default ms/step | ymm tiles ms/step | tiles / default |\n| ---: | ---: | ---: | ---: |")
    try:
        for b in batches:
            times: dict[str, list[float]] = {k: [] for k in kinds}
            tokens: dict[str, list[list[int]]] = {}
            for r in range(args.rounds):
                for name in list(kinds) if r % 2 == 0 else list(kinds)[::-1]:
                    kernels.set_prefill_kernels(kinds[name][0])
                    kernels.set_decode_kernels(kinds[name][1])
                    ms, out = steps(engine, b, args.steps)
                    times[name].append(ms)
                    assert tokens.setdefault(name, out) == out, f"{name} gave other tokens"
            assert tokens["default"] == tokens["ymm tiles"], "the kernels gave different tokens"
            ours, tiles = (statistics.median(times[k]) for k in kinds)
            print(f"| {b} | {ours:.1f} | {tiles:.1f} | {tiles / ours:.2f} |", flush=True)
    finally:
        kernels.set_prefill_kernels(default[0])
        kernels.set_decode_kernels(default[1])


if __name__ == "__main__":
    main()
