"""A chat model as an embedding model (the `pooling` setting): the C forward pass's final-normed hidden states,
pooled (last token or mean) and L2-normalized, against tests/reference.py's float64 forward pass of the same
random models; batching (inputs of a batch, several batches, long inputs over KV block boundaries) does not change
a vector; SmolLM2 when it is at hand."""
from __future__ import annotations

import numpy as np
import pytest

from inferd.engine.chat_embedder import ChatEmbedder
from inferd.engine.embedder import InputTooLong
from inferd.engine.engine import Engine
from tests.reference import Reference, random_model, rms_norm


class IdTokenizer:
    """Texts of space-separated token ids (the random models have no tokenizer)."""

    def encode(self, text: str) -> list[int]:
        return [int(t) for t in text.split()]


def reference_vector(model, ids: list[int], pooling: str) -> np.ndarray:
    ref = Reference(model.config, model.tensors)
    x, positions = ref.embed(ids), np.arange(len(ids))
    for i in range(model.config.n_layers):   # layer by layer, each layer's float64 weights freed after it (no logits)
        x, _, _ = ref.layer(i, x, positions, kv_dtype=np.float16)
        ref.release()
    final = rms_norm(x, ref.vec("output_norm.weight"), model.config.norm_eps)
    v = final[-1] if pooling == "last" else final.mean(axis=0)
    return v / np.linalg.norm(v)


def make(model, pooling: str, **kw) -> ChatEmbedder:
    eng = Engine(model, num_kv_blocks=4, max_batch_tokens=64, max_seqs=4, threads=2)
    return ChatEmbedder(eng, IdTokenizer(), pooling, name="tiny", threads=2, **kw)


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
@pytest.mark.parametrize("pooling", ["last", "mean"])
def test_pooled_final_hidden_state_matches_reference(arch, pooling):
    model = random_model(arch=arch, context_length=256)
    emb = make(model, pooling, max_batch_tokens=200, max_batch_seqs=8)
    rng = np.random.default_rng(3)
    inputs = [list(map(int, rng.integers(0, model.config.vocab_size, n))) for n in (1, 7, 70, 130)]
    got = emb.embed(inputs)
    assert got.shape == (4, model.config.dim) and got.dtype == np.float32
    for v, ids in zip(got, inputs):
        want = reference_vector(model, ids, pooling)
        assert float(np.dot(v, want)) > 0.99999
        np.testing.assert_allclose(v, want, atol=2e-3 * np.abs(want).max())
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, rtol=1e-6)


def test_a_vector_does_not_depend_on_its_batch():
    model = random_model(context_length=256)
    emb = make(model, "mean", max_batch_tokens=100, max_batch_seqs=3)
    rng = np.random.default_rng(4)
    inputs = [list(map(int, rng.integers(0, model.config.vocab_size, n))) for n in (5, 66, 12, 40, 3)]
    together = emb.embed(inputs)                                  # two forward passes: 5+66+12 and 40+3
    for i, ids in enumerate(inputs):
        assert np.array_equal(emb.embed([ids])[0], together[i])
    assert np.array_equal(emb.embed(inputs[::-1])[::-1], together)


def test_limits_and_bad_inputs():
    model = random_model(context_length=256)
    emb = make(model, "last", max_batch_tokens=50)
    assert emb.max_seq_length == 50
    with pytest.raises(InputTooLong, match="input 1 has 51 tokens"):
        emb.tokenize(["1 2", " ".join(["3"] * 51)])
    assert len(emb.tokenize([" ".join(["3"] * 51)], truncate=True)[0]) == 50
    with pytest.raises(ValueError, match="outside this model's vocabulary"):
        emb.check_ids([[1, 999999]])
    with pytest.raises(ValueError, match="input 0 is empty"):
        emb.check_ids([[]])
    with pytest.raises(ValueError, match="not one of this model's prompts"):
        emb.tokenize(["1"], input_type="code")
    with pytest.raises(ValueError, match="'last' or 'mean'"):
        make(model, "none")


def test_smollm2_embeds_similar_texts_closer(smollm2_model):
    eng = Engine(smollm2_model, num_kv_blocks=8, max_batch_tokens=128, max_seqs=4, threads=2)
    emb = ChatEmbedder(eng, smollm2_model.tokenizer, "mean", name="smollm2", threads=2)
    texts = ["The cat sat on the mat.", "A cat was sitting on the mat.", "Stock markets fell sharply today."]
    ids = emb.tokenize(texts)
    v = emb.embed(ids)
    assert v[0] @ v[1] > v[0] @ v[2]
    # against the reference on the engine's own weights, first input (float64, the Q4_1 weights dequantized; the
    # engine rounds every matmul's input to 8 bits, which costs a 135M model's final state about 1e-3: 0.9988
    # measured)
    want = reference_vector(smollm2_model, ids[0], "mean")
    assert float(v[0] @ want) > 0.998
