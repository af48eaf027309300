"""Records sentence-transformers' vectors (torch, float32) for test_embedding_real's 200 sentences into
tests/engine/embedding_refs/<model>.npz, so the fast suite checks inferd against them without importing torch:

    python tests/engine/make_embedding_refs.py [all-MiniLM-L6-v2 embeddinggemma-300m]

Stored: the token ids sentence-transformers' tokenizer gives (flat, with offsets), the vectors as float16 (the
rounding moves a cosine by about 1e-7, far below the 1e-4 the test allows), the prompt name used, and the
versions that made them. test_embedding_real.py's slow test recomputes them live and checks they still agree."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.engine.test_embedding_real import MODELS, REFS, reference_vectors  # noqa: E402


def main(names: list[str]) -> None:
    import sentence_transformers
    import torch

    REFS.mkdir(exist_ok=True)
    for name in names:
        prompt, ref, tokens = reference_vectors(MODELS / name)
        offsets = np.cumsum([0] + [len(t) for t in tokens]).astype(np.int64)
        np.savez_compressed(REFS / f"{name}.npz", vectors=ref.astype(np.float16), ids=np.concatenate(tokens),
                            offsets=offsets, prompt=np.array(prompt or ""),
                            made_by=np.array(f"sentence-transformers {sentence_transformers.__version__}, "
                                             f"torch {torch.__version__}"))
        print(f"{name}: {len(tokens)} vectors of {ref.shape[1]} -> {REFS / (name + '.npz')}")


if __name__ == "__main__":
    main(sys.argv[1:] or ["all-MiniLM-L6-v2", "embeddinggemma-300m"])
