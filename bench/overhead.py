"""Python's share of a decode step at batch 1: the C forward call alone vs the same step through Engine.step
(building the batch, sampling arrays, outputs) vs `inferd generate`'s loop (runner.generate: the scheduler and its
detokenizer).

    python bench/overhead.py [-m MODEL] [-t THREADS] [-n 128]
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from inferd import _cpu
from inferd.engine.engine import Engine
from inferd.engine.types import SamplingParams, SeqInput
from inferd.engine.request import Request
from inferd.engine.runner import blocks_needed, generate
from inferd.model.loader import load_model
from inferd.model.pull import resolve


def c_only(engine: Engine, n: int) -> float:
    """Seconds per decode step calling Context.forward directly with arrays built once."""
    ctx = engine._ctx
    table = np.arange(engine.num_kv_blocks, dtype=np.int32).reshape(1, -1)
    params = {name: np.zeros(1) for name in _cpu.SAMPLE_FIELDS}
    params.update(top_p=np.ones(1), repetition_penalty=np.ones(1), num_logprobs=-np.ones(1),
                  seed=np.zeros(1, np.uint64))
    empty_i, empty_f = np.zeros(0, np.int32), np.zeros(0, np.float32)
    one = np.zeros(1, np.int32)
    token = np.array([100], np.int32)
    t0 = time.perf_counter()
    for pos in range(1, n + 1):
        samples, _, _ = ctx.forward(token, np.array([pos], np.int32), one, table, one, np.ones(1, np.int32), params,
                                    empty_i, empty_i, empty_f)
        token[0] = samples["token"][0]
    return (time.perf_counter() - t0) / n


def via_engine(engine: Engine, n: int) -> float:
    table = list(range(engine.num_kv_blocks))
    token = 100
    t0 = time.perf_counter()
    for pos in range(1, n + 1):
        token = engine.step([SeqInput([token], pos, table, 1)])[0].tokens[0]
    return (time.perf_counter() - t0) / n


def via_generate(engine: Engine, model, n: int) -> float:
    t0 = None
    count = 0
    request = Request("bench", [100], SamplingParams(temperature=0.0), n + 1)
    for out in generate(engine, request, tokenizer=model.tokenizer):
        if t0 is None:
            t0 = time.perf_counter()     # after the prefill step
        count += len(out.token_ids)
    return (time.perf_counter() - t0) / max(1, count - 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", default="smollm2-135m-instruct")
    ap.add_argument("-t", "--threads", type=int, default=None)
    ap.add_argument("-n", type=int, default=128)
    args = ap.parse_args()
    model = load_model(resolve(args.model))
    engine = Engine(model, num_kv_blocks=blocks_needed(args.n + 2), max_seqs=1, threads=args.threads)
    via_engine(engine, 16)
    runs = {"C forward only": [], "Engine.step": [], "inferd generate loop": []}
    for _ in range(3):
        runs["C forward only"].append(c_only(engine, args.n))
        runs["Engine.step"].append(via_engine(engine, args.n))
        runs["inferd generate loop"].append(via_generate(engine, model, args.n))
    base = statistics.median(runs["C forward only"])
    print("| path | ms/token | Python overhead |\n| --- | ---: | ---: |")
    for name, ts in runs.items():
        t = statistics.median(ts)
        print(f"| {name} | {t * 1e3:.3f} | {(t - base) / t:.1%} |")


if __name__ == "__main__":
    main()
