"""Prefix hits within a block on a real engine: a prompt that leaves the cached chain mid-block takes the cached
positions it shares out of a copied block (kv_cache.py, kv_block_io.c's kv_block_copy), for every KV cache format,
and produces the same tokens and the same logprobs, bit for bit, as when computed alone."""

import numpy as np
import pytest

from inferd.engine.engine import Engine
from tests.engine.test_kv_cache_q8 import run_requests
from tests.reference import random_model


@pytest.fixture(scope="module")
def model():
    return random_model(weight_type="Q4_0", context_length=512)


@pytest.mark.parametrize("kv_cache_dtype", ["f16", "q8_0", "bf16"])
def test_hits_within_a_block_give_the_bits_of_a_cold_run(model, kv_cache_dtype):
    rng = np.random.default_rng(11)
    vocab = model.config.vocab_size
    shared = rng.integers(0, vocab, 100).tolist()
    prompts = [
        shared + rng.integers(0, vocab, 20).tolist(),  # 120 + 10 generated: its block 1 (64-127) fills, hashed
        shared + rng.integers(0, vocab, 7).tolist(),  # leaves the chain at 64, shares 36 more with that block
        shared[:70],  # 5 of its 6 past 64 out of that block; 70 + 10 generated, 79 computed: a tail (64-78)
    ]

    def engine():
        return Engine(model, num_kv_blocks=16, max_batch_tokens=64, max_seqs=4, threads=1,
                      kv_cache_dtype=kv_cache_dtype)

    def alone(prompt):
        return run_requests(engine(), [prompt], 10, prefix_caching=False)[0][0]

    # the next turn of a conversation: the third prompt, its answer's computed tokens, a new question
    prompts.append(shared[:70] + alone(prompts[2])[0][:9] + rng.integers(0, vocab, 30).tolist())
    served, scheduler = run_requests(engine(), prompts, 10, max_running=1)  # one after another
    assert [cached for _, _, cached in served] == [0, 100, 69, 79]
    for (tokens, top, _), prompt in zip(served, prompts):
        tokens_alone, top_alone, _ = alone(prompt)
        assert tokens == tokens_alone
        assert top == top_alone  # same bits: the copied positions are the ones computed before
    assert len(scheduler.kv.tails) >= 1


def test_the_copy_moves_every_layers_k_and_v(model):
    engine = Engine(model, num_kv_blocks=4, max_batch_tokens=64, max_seqs=1, threads=1)
    rng = np.random.default_rng(2)
    image = rng.integers(0, 256, engine.kv_layout()["block_bytes"], dtype=np.uint8).tobytes()
    engine.write_kv_block(1, image)
    before = engine.read_kv_block(3)
    engine.copy_kv_block(1, 2)
    assert engine.read_kv_block(2) == image and engine.read_kv_block(3) == before
    with pytest.raises(ValueError, match="cannot copy KV block 1 to 4: the cache has 4 blocks"):
        engine.copy_kv_block(1, 4)
    with pytest.raises(ValueError):
        engine.copy_kv_block(-1, 0)
