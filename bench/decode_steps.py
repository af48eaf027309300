"""Median time of single-token decode steps in this checkout's engine, in one process and without a server: the
figure to compare between two checkouts run alternately (ABBA), where a peer's own noise would blur a small
difference.

    python bench/decode_steps.py LABEL [--model qwen2.5-coder-1.5b-q4_k_m] [--steps 96] [-t 2]

Prints one line: LABEL, the median step time (after 16 warm-up steps) and its tok/s.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from _common import real_file  # noqa: E402

from inferd.engine.engine import Engine  # noqa: E402
from inferd.engine.types import SamplingParams, SeqInput  # noqa: E402
from inferd.model.loader import load_model  # noqa: E402

WARM_UP = 16
BLOCKS = 8


class GreedyDecoder:
    """This checkout's engine on `model` (a bench name or a path), primed with a 32-token prompt; step() runs one
    single-token greedy decode step, writing over the same few KV blocks when they are full."""

    def __init__(self, model: str, threads: int):
        path = real_file(model) if not Path(model).is_file() else Path(model)
        self.engine = Engine(load_model(path), num_kv_blocks=BLOCKS, max_batch_tokens=512, max_seqs=1,
                             threads=threads)
        self.blocks, self.prompt = list(range(BLOCKS)), list(range(100, 132))
        self.greedy = SamplingParams(temperature=0.0)
        self.token, self.pos = self._step(self.prompt, 0), len(self.prompt)

    def _step(self, tokens: list[int], pos: int) -> int:
        return self.engine.step([SeqInput(tokens, pos, self.blocks, 1, params=self.greedy)])[0].tokens[0]

    def step(self) -> None:
        self.token = self._step([self.token], self.pos)
        self.pos = self.pos + 1 if self.pos + 1 < BLOCKS * 64 else len(self.prompt)


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """The arguments every single-token decode bench takes: a label for its lines, the model, the threads."""
    ap.add_argument("label")
    ap.add_argument("--model", default="qwen2.5-coder-1.5b-q4_k_m")
    ap.add_argument("-t", "--threads", type=int, default=2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(ap)
    ap.add_argument("--steps", type=int, default=96)
    args = ap.parse_args()
    decoder = GreedyDecoder(args.model, args.threads)
    getattr(decoder.engine, "wait_huge_pages", lambda: None)()     # timed once the weights are in 2 MB pages
    times = []
    for _ in range(WARM_UP + args.steps):
        t0 = time.perf_counter()
        decoder.step()
        times.append(time.perf_counter() - t0)
    step = statistics.median(times[WARM_UP:])
    print(f"{args.label} median step {step * 1e3:.2f} ms  tok/s {1 / step:.2f}")


if __name__ == "__main__":
    main()
