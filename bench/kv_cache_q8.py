"""Decode at depth with the int8 KV cache: inferd (kv_cache_dtype f16 and q8_0) against llama-bench with a q8_0 KV
cache (`-d DEPTH -fa 1 -ctk q8_0 -ctv q8_0 -n 128 -p 0 -lm none`, GLIBC_TUNABLES=glibc.malloc.hugetlb=1 so its
weights get huge pages as inferd's do), interleaved ABBA rounds in one run so a shared machine's slow phases fall
on both; each figure is the median of its rounds, each ratio the median of the per-round ratios. On a VM that
advertises AMX but cannot run it, give --bin a ggml-cpu built without AMX (the standard build dies with SIGILL when
it repacks weights; -nr avoids that but disables llama.cpp's repacked kernels: the peer would look slower).

inferd's decode: the context filled with DEPTH tokens of text (chunks of 512), then 128 greedy decode steps, timed
together, as llama-bench's tg128 after its -d fill.

    python bench/kv_cache_q8.py --model ~/.cache/inferd/models/bench/SmolLM2-135M-Instruct.Q4_0.gguf \
        --bin ~/.cache/inferd-peers/llama.cpp-0.3.36-noamx/bin --depth 4096 --rounds 3
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # the checkout's inferd

from inferd.engine.engine import Engine  # noqa: E402
from inferd.engine.runner import blocks_needed  # noqa: E402
from inferd.engine.types import SeqInput  # noqa: E402
from inferd.model.loader import load_model  # noqa: E402

TEXT = Path(__file__).resolve().parent / "data" / "gpl-3.txt"
N_GEN = 128


def llama_decode(bin_dir: Path, model: Path, depth: int, threads: int, kv: str) -> float:
    cmd = [str(bin_dir / "llama-bench"), "-m", str(model), "-t", str(threads), "-d", str(depth), "-fa", "1",
           "-ctk", kv, "-ctv", kv, "-n", str(N_GEN), "-p", "0", "-lm", "none", "-r", "1", "-o", "json"]
    env = dict(os.environ, GLIBC_TUNABLES="glibc.malloc.hugetlb=1")
    env.pop("OMP_NUM_THREADS", None)
    rows = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout)
    row = next(r for r in rows if r["n_gen"] == N_GEN)
    return statistics.median(float(v) for v in row.get("samples_ts") or [row["avg_ts"]])


def inferd_decode(engine: Engine, tokens: list[int], depth: int) -> float:
    table = list(range(engine.num_kv_blocks))
    for pos in range(0, depth, 512):
        part = tokens[pos : min(pos + 512, depth)]
        out = engine.step([SeqInput(part, pos, table, 1 if pos + len(part) == depth else 0)])
    token = out[0].tokens[0]
    t0 = time.perf_counter()
    for pos in range(depth, depth + N_GEN):
        token = engine.step([SeqInput([token], pos, table, 1)])[0].tokens[0]
    return N_GEN / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--bin", type=Path, required=True, help="llama.cpp's build/bin")
    ap.add_argument("--depth", type=int, default=4096)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--llama-f16", action="store_true", help="also llama-bench with its f16 KV cache")
    args = ap.parse_args()
    model = load_model(args.model)
    text = model.tokenizer.encode(TEXT.read_text(encoding="utf-8"), add_special=False)
    tokens = (text * (args.depth // len(text) + 1))[: args.depth]
    engines = {kv: Engine(model, num_kv_blocks=blocks_needed(args.depth + N_GEN + 1), max_batch_tokens=512,
                          max_seqs=1, threads=args.threads, kv_cache_dtype=kv) for kv in ("f16", "q8_0")}
    for e in engines.values():
        e.step([SeqInput(tokens[:32], 0, [0], 1)])              # warm-up: pages, pool
    llama_kvs = ["q8_0"] + (["f16"] if args.llama_f16 else [])
    res: dict[str, list[float]] = {}

    def inferd_side():
        for kv, e in engines.items():
            res.setdefault(f"inferd {kv}", []).append(inferd_decode(e, tokens, args.depth))
            print(f"  inferd {kv}: {res[f'inferd {kv}'][-1]:.1f} tok/s", file=sys.stderr)

    def llama_side():
        for kv in llama_kvs:
            res.setdefault(f"llama.cpp {kv}", []).append(llama_decode(args.bin, args.model, args.depth,
                                                                     args.threads, kv))
            print(f"  llama.cpp {kv}: {res[f'llama.cpp {kv}'][-1]:.1f} tok/s", file=sys.stderr)

    for r in range(args.rounds):
        for side in ((inferd_side, llama_side) if r % 2 == 0 else (llama_side, inferd_side)):   # ABBA
            side()
        print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:.1f}" for k, v in res.items()), file=sys.stderr)
    print(f"decode tok/s at depth {args.depth}, {args.threads} threads, {args.model.name}, {args.rounds} ABBA rounds")
    for k, v in res.items():
        print(f"  {k:16s} median {statistics.median(v):7.1f}  (rounds: {', '.join(f'{x:.1f}' for x in v)})")
    for a, b in (("inferd q8_0", "llama.cpp q8_0"), ("inferd q8_0", "inferd f16"), ("inferd f16", "llama.cpp f16")):
        if a in res and b in res:
            ratios = [x / y for x, y in zip(res[a], res[b])]
            print(f"  {a} / {b}: median {statistics.median(ratios):.2f}x "
                  f"(rounds: {', '.join(f'{x:.2f}' for x in ratios)})")


if __name__ == "__main__":
    main()
