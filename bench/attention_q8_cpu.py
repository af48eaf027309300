"""The attention kernels alone, f16 vs q8_0 KV, for one decode token of SmolLM2's shape at depth 4096: 30 layers of
distinct caches (9 query heads, 3 KV heads of 64; 94 MB f16, 50 MB q8_0), one thread, rounds interleaved (ABBA),
median thread CPU time per token (a shared machine steals wall time; its caches and memory stay shared).

    python bench/attention_q8_cpu.py
"""
from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # the checkout's inferd
from inferd import _cpu  # noqa: E402

DEPTH, N_KV, N_HEADS, HD, LAYERS = 4096, 3, 9, 64, 30


def main() -> None:
    rng = np.random.default_rng(0)
    nb = DEPTH // _cpu.BLOCK_SIZE
    caches = []
    for _ in range(LAYERS):
        k = (rng.standard_normal((nb, N_KV, _cpu.BLOCK_SIZE, HD)) * 0.6).astype(np.float32)
        v = rng.standard_normal((nb, N_KV, _cpu.BLOCK_SIZE, HD)).astype(np.float32)
        caches.append({"f16": (k.astype(np.float16), v.astype(np.float16), _cpu.attention),
                       "q8_0": (_cpu.kvq8_pack(k, True), _cpu.kvq8_pack(v, False), _cpu.attention_q8)})
    table = np.arange(nb, dtype=np.int32)
    q = rng.standard_normal((1, N_HEADS, HD)).astype(np.float32)
    res: dict[str, list[float]] = {"f16": [], "q8_0": []}
    for r in range(9):
        for kv in ("f16", "q8_0") if r % 2 == 0 else ("q8_0", "f16"):
            t0 = time.thread_time()
            for layer in caches:
                k, v, fn = layer[kv]
                fn(q, k, v, table, DEPTH - 1)
            res[kv].append((time.thread_time() - t0) * 1e3)
    for kv, t in res.items():
        print(f"{_cpu.get_path()} {kv:5s} {statistics.median(t):6.2f} ms CPU per token "
              f"(rounds {', '.join(f'{x:.1f}' for x in t)})")
    print(f"q8_0 / f16 time: {statistics.median(a / b for a, b in zip(res['q8_0'], res['f16'])):.2f}")


if __name__ == "__main__":
    main()
