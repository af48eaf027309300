"""inferd's encoder vs sentence-transformers (torch CPU), same machine, same threads, in one run.

    python bench/embeddings.py [-t 2] [-r 3] [--models all-MiniLM-L6-v2,embeddinggemma-300m] [--out FILE]

Workloads: sentences/s for a batch of 1 (one short sentence per call, 32 calls), 32 and 256 short sentences
(~16 tokens), and 64 passages of ~256 tokens; plus the latency of one short query (median of 50 calls). Each
workload runs inferd (weights as stored, and --quantize q8_0) and sentence-transformers (torch.set_num_threads(t),
inference_mode, its own length-sorted batching with batch_size = the workload's size) alternately, -r repeats,
median. Tokenization is included on both sides. Models come from ~/.cache/inferd-test-models
(../shared/models/fetch.sh all-minilm-l6-v2 embeddinggemma-300m).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
# bench/profile.py would shadow the standard library's profile module that torch imports
sys.path = [p for p in sys.path if Path(p or ".").resolve() != HERE]
sys.path.insert(0, str(HERE.parent))

from inferd.engine.embedder import Embedder  # noqa: E402
from inferd.model.embedding import load_embedding_model  # noqa: E402

MODELS = Path(os.environ.get("INFERD_TEST_MODELS", Path.home() / ".cache" / "inferd-test-models"))
WORDS = ("river bank money city market doctor patient music guitar quickly slowly never always because although "
         "computer network protein energy climate forest ocean mountain history language science the a of and to in "
         "is was with for on at by from that this it they we you he she").split()


def texts(n: int, words: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, words)).capitalize() + "." for _ in range(n)]


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-r", "--repeats", type=int, default=3)
    ap.add_argument("--models", default="all-MiniLM-L6-v2,embeddinggemma-300m")
    ap.add_argument("--out", default=str(HERE / "results" / "embeddings.md"))
    args = ap.parse_args()

    import torch
    from sentence_transformers import SentenceTransformer
    torch.set_num_threads(args.threads)

    short = texts(256, 13, 1)
    passages = texts(64, 220, 2)
    workloads = [("batch 1", short[:32], 1), ("batch 32", short[:32], 32), ("batch 256", short, 256),
                 ("64 passages x ~256 tok", passages, 64)]
    lines = [f"threads {args.threads}, repeats {args.repeats} (median), torch {torch.__version__}, "
             f"machine shared with other jobs: compare ratios, not absolute numbers", "",
             "| model | workload | tokens/input | inferd f32 sent/s | inferd q8_0 sent/s | sentence-transformers sent/s "
             "| f32 / st | q8_0 / st |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    latency_lines = []
    for name in args.models.split(","):
        folder = MODELS / name
        st = SentenceTransformer(str(folder), device="cpu")
        ours = {q: Embedder(load_embedding_model(folder, quantize=q), threads=args.threads) for q in (None, "q8_0")}
        for label, batch, size in workloads:
            ntok = statistics.mean(len(x) for x in ours[None].tokenize(batch, truncate=True))

            def run_ours(e: Embedder, batch=batch, size=size) -> None:
                for i in range(0, len(batch), size):
                    e.embed(e.tokenize(batch[i:i + size], truncate=True))

            def run_st(batch=batch, size=size) -> None:
                with torch.inference_mode():
                    for i in range(0, len(batch), size):
                        st.encode(batch[i:i + size], batch_size=size)

            run_ours(ours[None]); run_ours(ours["q8_0"]); run_st()          # warm-up
            reps = 1 if "passages" in label and "gemma" in name else args.repeats
            times: dict[str, list[float]] = {"f32": [], "q8_0": [], "st": []}
            for _ in range(reps):
                times["f32"].append(timed(lambda: run_ours(ours[None])))
                times["q8_0"].append(timed(lambda: run_ours(ours["q8_0"])))
                times["st"].append(timed(run_st))
            rate = {k: len(batch) / statistics.median(v) for k, v in times.items()}
            lines.append(f"| {name} | {label} | {ntok:.0f} | {rate['f32']:.0f} | {rate['q8_0']:.0f} | {rate['st']:.0f} "
                         f"| {rate['f32'] / rate['st']:.2f}x | {rate['q8_0'] / rate['st']:.2f}x |")
            print(lines[-1], flush=True)
        if "MiniLM" in name:
            query = "How do I reset my password?"
            lat = {}
            for key, fn in (("f32", lambda: ours[None].embed(ours[None].tokenize([query]))),
                            ("q8_0", lambda: ours["q8_0"].embed(ours["q8_0"].tokenize([query]))),
                            ("st", lambda: st.encode([query]))):
                for _ in range(5):
                    fn()
                with torch.inference_mode():
                    lat[key] = statistics.median(timed(fn) for _ in range(50)) * 1e3
            latency_lines.append(f"single short query on {name} (median of 50): inferd f32 {lat['f32']:.2f} ms, "
                                 f"q8_0 {lat['q8_0']:.2f} ms, sentence-transformers {lat['st']:.2f} ms")
            print(latency_lines[-1], flush=True)
    text = "# /v1/embeddings encoder vs sentence-transformers\n\n" + "\n".join(lines + [""] + latency_lines) + "\n"
    Path(args.out).write_text(text)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
