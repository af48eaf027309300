"""The C encoder on tiny random BERT and Gemma 3 folders against the float64 reference (tests/encoder_reference.py):
vectors and last hidden states, every pooling mode, Dense layers with and without bias, sliding windows shorter
than the input, Q8_0 (BERT's Wv in f32 or bf16), batch invariance (bit for bit), scalar == AVX2 == the best path,
every prefill kernel (AMX too) the same."""
from __future__ import annotations

import numpy as np
import pytest

from inferd import _cpu
from inferd.engine.embedder import Embedder, InputTooLong, truncate_dimensions
from inferd.model.embedding import load_embedding_model
from tests.encoder_reference import Reference
from tests.model.make_tiny_embedding import write_tiny_embedding

SENTENCES = ["The quick brown fox jumps over the lazy dog.", "hello", "a cat sat on the bank of the river",
             "stocks fell sharply and money rose in the city market", "red? blue! green.",
             "the " * 30 + "end", "x"]


def _cos(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)


@pytest.fixture(scope="module", params=[
    dict(arch="bert"),
    dict(arch="bert", pooling="cls", dense=[48, 40], normalize=False),
    dict(arch="gemma3"),
    dict(arch="gemma3", pooling="last", dense=[128, 64], dense_bias=False, n_heads=3, n_kv_heads=1),
], ids=["bert-mean", "bert-cls-dense", "gemma-mean", "gemma-last-dense"])
def tiny(request, tmp_path_factory):
    folder = write_tiny_embedding(tmp_path_factory.mktemp("emb"), **request.param)
    return folder, Reference(folder)


def test_vectors_match_float64_reference(tiny):
    folder, ref = tiny
    emb = Embedder(load_embedding_model(folder), threads=2)
    assert emb.weights.table_in_place        # a float token embedding is read from the mapped file, not copied
    ids = emb.tokenize(SENTENCES)
    got = emb.embed(ids)
    want = np.stack([ref.embed(s) for s in ids])
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-5 * np.abs(want).max())
    assert _cos(got, want).min() > 0.999999


def test_hidden_states_match_reference(tiny):
    folder, ref = tiny
    emb = Embedder(load_embedding_model(folder), threads=2)
    ids = emb.tokenize(SENTENCES[:3])
    flat = np.array([t for s in ids for t in s], np.int32)
    starts = np.cumsum([0] + [len(s) for s in ids]).astype(np.int32)
    _, hidden = emb.encoder.encode(flat, starts, want_hidden=True)
    want = np.concatenate([ref.hidden(s) for s in ids])
    np.testing.assert_allclose(hidden, want, rtol=0, atol=1e-4 * np.abs(want).max())


def test_a_sequence_gets_the_same_bits_alone_and_in_any_batch(tiny):
    folder, _ = tiny
    emb = Embedder(load_embedding_model(folder), threads=2)
    ids = emb.tokenize(SENTENCES)
    together = emb.embed(ids)
    for i, s in enumerate(ids):
        assert np.array_equal(emb.embed([s])[0], together[i])
    assert np.array_equal(emb.embed(ids[::-1])[::-1], together)


@pytest.mark.parametrize("bf16", [False, True], ids=["wv-f32", "wv-bf16"])
def test_q8_0_stays_close(tiny, bf16):
    folder, ref = tiny
    emb = Embedder(load_embedding_model(folder, quantize="q8_0"), threads=2, float_parts_bf16=bf16)
    assert not emb.weights.table_in_place    # a quantized one is built in the encoder's own memory
    assert emb.float_parts_bf16 == (bf16 and emb.model.config["arch"] == "bert")   # only BERT keeps a float Wv
    ids = emb.tokenize(SENTENCES)
    got = emb.embed(ids)
    assert _cos(got, np.stack([ref.embed(s) for s in ids])).min() > 0.999
    together = emb.embed(ids)                 # and bits independent of the batch, with Wv in bf16 too
    assert all(np.array_equal(emb.embed([s])[0], together[i]) for i, s in enumerate(ids))


def test_bf16_float_parts_by_default_where_the_cpu_prefers_them(tmp_path):
    folder = write_tiny_embedding(tmp_path / "b")
    assert Embedder(load_embedding_model(folder, quantize="q8_0"), threads=1).float_parts_bf16 == \
        _cpu.encoder_bf16_preferred()
    assert not Embedder(load_embedding_model(folder), threads=1, float_parts_bf16=True).float_parts_bf16


def test_scalar_and_simd_paths_give_the_same_bits(tiny):
    folder, _ = tiny
    results = {}
    best = _cpu.get_path()
    try:
        for path in ["scalar", "avx2", best] if best != "scalar" else ["scalar"]:
            _cpu.set_path(path)
            for q, bf16 in ((None, False), ("q8_0", False), ("q8_0", True)):
                emb = Embedder(load_embedding_model(folder, quantize=q), threads=2, float_parts_bf16=bf16)
                results[path, q, bf16] = emb.embed(emb.tokenize(SENTENCES))
    finally:
        _cpu.set_path(best)
    for (path, q, bf16), got in results.items():
        assert np.array_equal(results["scalar", q, bf16], got), (path, q, bf16)


def test_every_prefill_kernel_gives_the_same_bits(tiny):
    """Q8_0 matmuls through each of the decoder's prefill kernels the CPU has (8-row tiles; zmm pairs of tiles; AMX
    for each 16 tokens): same bits, with a partial last group of 16 tokens and one short input alone."""
    folder, _ = tiny
    emb = Embedder(load_embedding_model(folder, quantize="q8_0"), threads=2)
    ids = emb.tokenize(SENTENCES * 3)
    assert sum(map(len, ids)) % 16 != 0
    kernels = emb.encoder.kernels
    best = kernels.prefill_kernels()
    kinds = _cpu.PREFILL_KERNELS[: _cpu.PREFILL_KERNELS.index(best) + 1]
    results = {}
    for kind in kinds:
        kernels.set_prefill_kernels(kind)
        results[kind] = emb.embed(ids), emb.embed(ids[1:2])
    for kind, (batch, alone) in results.items():
        assert np.array_equal(batch, results["tiles"][0]) and np.array_equal(alone, results["tiles"][1]), kind
        assert np.array_equal(alone[0], batch[1])


def test_sliding_window_shorter_than_the_input_matters_and_matches():
    """window 6 over a 30-token input: the reference's |i - j| < 6 mask, not full attention"""
    import tempfile
    from pathlib import Path
    with tempfile.TemporaryDirectory() as d:
        folder = write_tiny_embedding(Path(d) / "g", arch="gemma3", sliding_window=4, n_layers=3)
        ref = Reference(folder)
        emb = Embedder(load_embedding_model(folder), threads=2)
        ids = emb.tokenize(["the cat sat on the bank of the river and the dog ran over the bridge to the city"])
        got = emb.embed(ids)[0]
        np.testing.assert_allclose(got, ref.embed(ids[0]), atol=2e-6)
        ref.cfg["sliding_window"] = 10_000
        assert _cos(got, ref.embed(ids[0])) < 0.99999


def test_batches_split_by_tokens_and_sequences(tmp_path):
    emb = Embedder(load_embedding_model(write_tiny_embedding(tmp_path / "b")), threads=1, max_batch_tokens=40,
                   max_batch_seqs=3)
    assert emb.batches([10, 10, 10, 10, 39, 1, 1]) == [(0, 3), (3, 4), (4, 6), (6, 7)]
    ids = emb.tokenize(SENTENCES[:5])
    ref = Embedder(load_embedding_model(tmp_path / "b"), threads=1)
    assert np.array_equal(emb.embed(ids), ref.embed(ids))


def test_limits_prompts_and_token_inputs(tmp_path):
    folder = write_tiny_embedding(tmp_path / "p", max_seq_length=8, prompts={"query": "query: ", "document": "text: "})
    emb = Embedder(load_embedding_model(folder), threads=1)
    with pytest.raises(InputTooLong) as e:
        emb.tokenize(["hello", "the cat sat on the bank of the river"])
    assert e.value.index == 1 and e.value.limit == 8
    cut = emb.tokenize(["the cat sat on the bank of the river"], truncate=True)[0]
    assert len(cut) == 8 and cut[0] == 2 and cut[-1] == 3          # [CLS] ... [SEP] kept, as sentence-transformers
    plain, query = emb.tokenize(["hello"])[0], emb.tokenize(["hello"], input_type="query")[0]
    assert query == emb.tokenize(["query: hello"])[0] and query != plain
    with pytest.raises(ValueError, match="not one of this model's prompts"):
        emb.tokenize(["hello"], input_type="passage")
    bare = Embedder(load_embedding_model(write_tiny_embedding(tmp_path / "bare")), threads=1)
    assert bare.tokenize(["hello"], input_type="query") == bare.tokenize(["hello"], input_type="document") == \
        bare.tokenize(["hello"])
    with pytest.raises(ValueError, match="outside this model's vocabulary"):
        emb.check_ids([[1, 2], [5, 10**6]])
    with pytest.raises(InputTooLong):
        emb.check_ids([list(range(10))])
    assert emb.check_ids([list(range(10))], truncate=True) == [list(range(8))]


def test_matryoshka_truncation_renormalizes():
    v = np.array([[3.0, 4.0, 12.0]], np.float32) / 13
    np.testing.assert_allclose(truncate_dimensions(v, 2, True), [[0.6, 0.8]], rtol=1e-6)
    np.testing.assert_allclose(truncate_dimensions(v, 2, False), v[:, :2])


def test_bad_batches_are_refused(tmp_path):
    emb = Embedder(load_embedding_model(write_tiny_embedding(tmp_path / "x")), threads=1)
    enc = emb.encoder
    with pytest.raises(ValueError, match="invalid encoder batch"):
        enc.encode(np.array([1, 2, 3], np.int32), np.array([0, 2, 2, 3], np.int32))     # an empty sequence
    with pytest.raises(ValueError, match="invalid encoder batch"):
        enc.encode(np.array([1, 2, 10**6], np.int32), np.array([0, 3], np.int32))
    with pytest.raises(ValueError, match="invalid encoder batch"):
        enc.encode(np.array([1, 2, 3], np.int32), np.array([0, 2], np.int32))
    with pytest.raises(ValueError, match="invalid encoder batch"):
        enc.encode(np.ones(65, np.int32), np.array([0, 65], np.int32))                 # longer than positions


def test_a_two_part_wqkv_is_checked(tmp_path):
    """'wqkv_f' (the float rows after a quantized 'wqkv') must be float and leave wqkv a multiple of 16 rows."""
    folder = write_tiny_embedding(tmp_path / "x")
    for bad, message in ((lambda s: ("Q8_0",) + s[1:], "float weight"), (lambda s: (s[0], 120) + s[2:], "multiple")):
        m = load_embedding_model(folder, quantize="q8_0")
        m.tensors["blk.0.wqkv_f"] = bad(m.tensors["blk.0.wqkv_f"])
        with pytest.raises(ValueError, match=message):
            _cpu.EncoderModel(m.config, m.tensors)
