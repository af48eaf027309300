"""The real Qwen2.5-Coder-1.5B-Instruct Q4_K_M file (../shared/models/fetch.sh qwen2.5-coder-1.5b): computed in its
own types (Q4_K with Q6_K V, down projections and output), and its perplexity close to llama.cpp's.

llama.cpp 0.3.36 on the same text: `llama-perplexity -m qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
-f bench/data/gpl-3.txt -c 512 -t 2` prints [1]1.5781 [2]1.5713 [3]1.6915 [4]1.7782 for its first four chunks and
"Final estimate: PPL = 1.7606 +/- 0.03704" for all 14; `inferd perplexity` gives 1.7537 +/- 0.03691 (0.4% lower;
its first four chunks 1.5693 1.5494 1.6674 1.7593, about 1% lower): llama.cpp quantizes a K-quant matmul's
activations to 8 bits per 256 values (one scale per super-block), inferd per 32, so inferd's products are the more
exact ones."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from inferd.engine.engine import Engine
from inferd.engine.runner import blocks_needed, perplexity
from inferd.model.loader import load_model

FILE = Path(os.environ.get("INFERD_TEST_MODELS", Path.home() / ".cache" / "inferd-test-models")) / \
    "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
TEXT = Path(__file__).resolve().parents[2] / "bench" / "data" / "gpl-3.txt"
LLAMA_CPP_PPL_4_CHUNKS = 1.7782

pytestmark = pytest.mark.skipif(not FILE.exists(), reason=f"{FILE} is absent: run ../shared/models/fetch.sh "
                                                         "qwen2.5-coder-1.5b")


@pytest.fixture(scope="module")
def qwen():
    return load_model(FILE)


def test_file_is_computed_in_its_own_types(qwen):
    types = {t.type for t in qwen.tensors.values() if t.rows > 1}
    assert types == {"Q4_K", "Q6_K"}
    engine = Engine(qwen, num_kv_blocks=2, max_seqs=1, threads=2)
    matrices = sum(t.data.nbytes for name, t in qwen.tensors.items() if t.rows > 1)
    # the tiles hold the file's bytes plus unpacked Q4_K scales (2.8% of those blocks), nothing widened to 8 bits
    assert matrices <= engine._model.memory_bytes <= 1.03 * matrices


def test_perplexity_is_close_to_llama_cpp(qwen):
    tokens = qwen.tokenizer.encode(TEXT.read_text(encoding="utf-8"), add_special=False)[:4 * 512]
    engine = Engine(qwen, num_kv_blocks=blocks_needed(512), max_batch_tokens=512, max_seqs=1, threads=2,
                    max_logits_rows=512)
    r = perplexity(engine, tokens, 512)
    assert r.chunks == 4
    assert abs(r.ppl - LLAMA_CPP_PPL_4_CHUNKS) / LLAMA_CPP_PPL_4_CHUNKS < 0.015
