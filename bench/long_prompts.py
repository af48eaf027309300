"""Prefill at depth: one chunk's speed and the attention stage's share of it, after a context of d tokens.

    python bench/long_prompts.py [-m MODEL] [--depths 0,4096,8192,16384] [--chunk 512] [--repeats 1] [-t 2] \
        [--kv-cache f16|bf16|q8_0]

The context is not prefilled token by token (16k tokens take minutes): the first chunk runs for real, then its KV
blocks' images are copied into the cache's later blocks until it holds d positions (real keys and values, their
positions repeated; the time attention takes does not depend on the values). Then `--repeats` chunks of `--chunk`
tokens run at positions d.., each with the forward pass's stage profile (ctx.set_profiling). Per depth it prints the
chunk's tok/s by wall time and by the process' CPU time (all threads; on a shared machine compare CPU time), and the
attention stage's share of the wall time.
"""
from __future__ import annotations

import argparse
import resource
import time

from inferd.engine.engine import Engine
from inferd.engine.runner import blocks_needed
from inferd.engine.types import SeqInput
from inferd.model.loader import load_model
from inferd.model.pull import resolve

BLOCK = 64


def cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", default="qwen2.5-coder-1.5b-instruct-q4_k_m")
    ap.add_argument("--depths", default="0,4096,8192,16384")
    ap.add_argument("--chunk", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--kv-cache", default="f16", help="the KV cache's format (kv_cache_dtype)")
    args = ap.parse_args()
    depths = [int(d) for d in args.depths.split(",")]
    model = load_model(resolve(args.model))
    positions = max(depths) + args.chunk * args.repeats + 1
    first = max(args.chunk, BLOCK)  # the real first chunk fills at least one block
    eng = Engine(model, num_kv_blocks=blocks_needed(max(positions, 2 * first)), max_batch_tokens=first,
                 max_seqs=1, threads=args.threads, kv_cache_dtype=args.kv_cache)
    ctx = eng._ctx
    table = list(range(eng.num_kv_blocks))
    prompt = [(i * 7919 + 13) % (eng.vocab_size - 100) + 50 for i in range(first)]
    eng.step([SeqInput(prompt, 0, table, 0)])                  # the real first chunk (and the warm-up)
    prompt = prompt[: args.chunk]
    images = [ctx.read_kv_block(b) for b in range(first // BLOCK)]
    for b in range(first // BLOCK, eng.num_kv_blocks):        # every block, so no page of the cache is untouched
        ctx.write_kv_block(b, images[b % len(images)])
    print(f"{model.model_name}: {eng.threads} threads, {eng.kernel_path} kernels, chunk {args.chunk}, "
          f"KV cache {args.kv_cache}")
    print("| depth | tok/s (wall) | tok/s (CPU time / threads) | attention share | attention ms/chunk |")
    print("|---:|---:|---:|---:|---:|")
    for d in depths:
        walls, cpus, shares, attn = [], [], [], []
        for r in range(args.repeats):
            pos = d + r * args.chunk
            ctx.set_profiling(True)
            t0, c0 = time.perf_counter(), cpu_seconds()
            eng.step([SeqInput(prompt, pos, table, 0)])
            wall, cpu = time.perf_counter() - t0, cpu_seconds() - c0
            prof = ctx.profile()
            ctx.set_profiling(False)
            walls.append(wall)
            cpus.append(cpu)
            shares.append(prof["attention"] / wall)
            attn.append(prof["attention"])
        w, c = min(walls), min(cpus)
        print(f"| {d} | {args.chunk / w:.1f} | {args.chunk * eng.threads / c:.1f} | {max(shares):.0%} | "
              f"{min(attn) * 1e3:.0f} |", flush=True)


if __name__ == "__main__":
    main()
