"""How much a prefill chunk beside the decodes stretches a step: the streams' inter-token latency while a long prompt
is chunked in, measured on engine steps in one process (no HTTP, no client).

    python bench/step_mix.py [-m MODEL] [-t 2] [--decodes 8,32] [--depth 1000] [--chunks 0,32,64,128,256,512]
                             [--chunk-depth 1000]

For each decode batch size d: d sequences are prefilled to `depth` positions; then steps alternate, in rounds,
between d decodes alone and d decodes plus a C-token prefill chunk of another sequence (at --chunk-depth of its own
prompt: 1000, the middle of a long prompt; 50, a short prompt's). Each step's wall time is measured; per (d, C)
the median (or --stat min) over rounds.
Reported: step ms, the ratio to the decode-only step (what a running stream's ITL becomes in a step that carries
the chunk), and the chunk's prompt tokens per second net of the decode step. An ITL p99 within 3x its p50 needs
that ratio below 3 for the cap the scheduler applies while sequences decode (`max_prefill_while_decoding`).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from inferd.engine.engine import Engine
from inferd.engine.runner import blocks_needed
from inferd.engine.types import SamplingParams, SeqInput
from inferd.model.loader import load_model

DEFAULT_MODEL = Path.home() / ".cache" / "inferd" / "models" / "bench" / "SmolLM2-135M-Instruct.Q4_0.gguf"
GREEDY = SamplingParams(temperature=0.0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", type=Path, default=DEFAULT_MODEL)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--decodes", default="8,32")
    ap.add_argument("--depth", type=int, default=1000, help="context of each decoding sequence")
    ap.add_argument("--chunks", default="0,32,64,128,256,512")
    ap.add_argument("--chunk-depth", type=int, default=1000, help="where the chunk starts in its own prompt")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--stat", choices=("median", "min"), default="median",
                    help="per (d, C) over the rounds; min: the least disturbed step, on a busy machine")
    args = ap.parse_args()
    decodes = [int(x) for x in args.decodes.split(",")]
    chunks = [int(x) for x in args.chunks.split(",")]
    model = load_model(args.model)
    per_seq = blocks_needed(args.depth + args.rounds * len(chunks) * 2 + 8)
    cd = args.chunk_depth
    prompt_blocks = blocks_needed(cd + max(chunks))
    engine = Engine(model, num_kv_blocks=max(decodes) * per_seq + prompt_blocks,
                    max_batch_tokens=max(*chunks, 512) + 64, max_seqs=max(decodes) + 1, threads=args.threads)
    tables = [list(range(i * per_seq, (i + 1) * per_seq)) for i in range(max(decodes))]
    long_table = list(range(max(decodes) * per_seq, max(decodes) * per_seq + prompt_blocks))
    vocab = 1000
    print(f"{args.model.name}, {args.threads} threads, decoding sequences at depth {args.depth}, chunk at depth {cd}")
    print("| decodes | chunk tokens | step ms | x decode-only | chunk tok/s |")
    print("| ---: | ---: | ---: | ---: | ---: |")
    # the long prompt's first positions, once (its chunks below rewrite positions cd.. each time)
    for pos in range(0, cd, 500):
        n = min(500, cd - pos)
        engine.step([SeqInput([(7 * i) % vocab + 1 for i in range(pos, pos + n)], pos, long_table, 0, GREEDY)])
    for d in decodes:
        positions = []
        for i in range(d):  # prefill each decoding sequence to `depth`
            pos = 0
            while pos < args.depth:
                n = min(512, args.depth - pos)
                engine.step([SeqInput([(13 * i + j) % vocab + 1 for j in range(pos, pos + n)], pos, tables[i], 1,
                                      GREEDY)])
                pos += n
            positions.append(pos)
        times: dict[int, list[float]] = {c: [] for c in chunks}
        for _ in range(args.rounds):
            for c in chunks:
                seqs = [SeqInput([5], positions[i], tables[i], 1, GREEDY) for i in range(d)]
                if c:
                    seqs.append(SeqInput([(3 * j) % vocab + 1 for j in range(c)], cd, long_table, 0, GREEDY))
                t0 = time.perf_counter()
                engine.step(seqs)
                times[c].append(time.perf_counter() - t0)
                for i in range(d):
                    positions[i] += 1
        stat = min if args.stat == "min" else statistics.median
        base = stat(times[0])
        for c in chunks:
            t = stat(times[c])
            rate = f"{c / (t - base):.0f}" if c and t > base else "-"
            print(f"| {d} | {c} | {t * 1e3:.1f} | {t / base:.2f} | {rate} |", flush=True)


if __name__ == "__main__":
    main()
