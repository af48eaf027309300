"""Embedding GGUFs (inferd/model/embedding_gguf.py) on tiny files written from tiny random folders: the same vectors
as the folder (bit for bit in F32, close in F16 and Q8_0), pooling from the file's metadata, BERT's WordPiece
tokenizer rebuilt from the vocabulary, and a clear ModelLoadError for what is not supported."""
from __future__ import annotations

import gguf
import numpy as np
import pytest

from inferd.engine.embedder import Embedder
from inferd.model.embedding import load_embedding_model
from inferd.model.embedding_gguf import load_embedding
from inferd.model.embedding_gguf import is_embedding_gguf
from inferd.model.errors import ModelLoadError
from tests.encoder_reference import Reference
from tests.model.make_tiny_embedding import write_tiny_embedding
from tests.model.make_tiny_embedding_gguf import write_tiny_embedding_gguf

SENTENCES = ["The quick brown fox jumps over the lazy dog.", "hello", "a cat sat on the bank of the river",
             "stocks fell sharply and money rose in the city market", "red? blue! green.", "x"]


def _cos(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)


@pytest.fixture(scope="module", params=[
    dict(arch="bert"),
    dict(arch="bert", pooling="cls"),
    dict(arch="gemma3", dense=[128, 64], dense_bias=False),
    dict(arch="gemma3", pooling="last", n_heads=3, n_kv_heads=1, n_layers=3),
], ids=["bert-mean", "bert-cls", "gemma-mean-dense", "gemma-last"])
def tiny(request, tmp_path_factory):
    folder = write_tiny_embedding(tmp_path_factory.mktemp("emb"), **request.param)
    return folder, Embedder(load_embedding_model(folder), threads=2)


@pytest.mark.parametrize("outtype, least_cos", [("F32", None), ("F16", 0.9999), ("BF16", 0.999), ("Q8_0", 0.999)])
def test_vectors_equal_the_folders(tiny, tmp_path, outtype, least_cos):
    folder, from_folder = tiny
    path = write_tiny_embedding_gguf(folder, tmp_path / "m.gguf", outtype)
    assert is_embedding_gguf(path)
    emb = Embedder(load_embedding(path), threads=2)
    m = emb.model
    assert (m.pooling, m.normalize, m.dimensions) == (from_folder.model.pooling, True, from_folder.dimensions)
    ids = from_folder.tokenize(SENTENCES)
    got, want = emb.embed(ids), from_folder.embed(ids)
    if least_cos is None:                        # the same weights into the same layout: the same bits
        assert np.array_equal(got, want)
    else:
        assert _cos(got, want).min() >= least_cos
        ref = Reference(folder)
        assert _cos(got, np.stack([ref.embed(s) for s in ids])).min() >= least_cos


def test_bert_wordpiece_from_the_vocabulary(tmp_path):
    folder = write_tiny_embedding(tmp_path / "b")
    a = Embedder(load_embedding_model(folder), threads=1)
    b = Embedder(load_embedding(write_tiny_embedding_gguf(folder, tmp_path / "b.gguf")), threads=1)
    texts = SENTENCES + ["Quickly!! UNKNOWNWORD zz", "the " * 20 + "end"]
    assert b.tokenize(texts) == a.tokenize(texts)
    assert b.max_seq_length == 64             # the file's context length (the folder says 40)
    long = ["the " * 70]
    assert len(b.tokenize(long, truncate=True)[0]) == 64 and b.tokenize(long, truncate=True)[0][-1] == 3


def test_gemma_wraps_inputs_in_bos_and_eos(tmp_path):
    folder = write_tiny_embedding(tmp_path / "g", arch="gemma3")
    emb = Embedder(load_embedding(write_tiny_embedding_gguf(folder, tmp_path / "g.gguf")), threads=1)
    tokens = emb.model.tokenizer.get_vocab()
    ids = emb.tokenize(["ab"])[0]              # the tiny vocabulary has no merges: single letters
    assert ids == [tokens["<bos>"], tokens["a"], tokens["b"], tokens["<eos>"]]
    cut = emb.tokenize(["a " * 200], truncate=True)[0]
    assert len(cut) == emb.max_seq_length and cut[0] == tokens["<bos>"] and cut[-1] == tokens["<eos>"]


def _rewrite(src, dst, drop_key: str | None = None, set_kv: tuple[str, int] | None = None, arch: str | None = None):
    """A copy of GGUF `src` with one metadata key dropped or set (an int) or another architecture name."""
    r = gguf.GGUFReader(str(src))
    old_arch = r.get_field("general.architecture").contents()
    w = gguf.GGUFWriter(str(dst), arch or old_arch)
    for field in r.fields.values():
        name = field.name
        if name.startswith("GGUF.") or name == "general.architecture" or name == drop_key:
            continue
        if set_kv and name == set_kv[0]:
            continue
        if arch:
            name = name.replace(f"{old_arch}.", f"{arch}.")
        vtype = field.types[0]
        if vtype == gguf.GGUFValueType.ARRAY:
            w.add_array(name, field.contents())
        else:
            w.add_key_value(name, field.contents(), vtype)
    if set_kv:
        w.add_uint32(set_kv[0], set_kv[1])
    for t in r.tensors:
        w.add_tensor(t.name, np.asarray(t.data), raw_shape=list(reversed([int(d) for d in t.shape])),
                     raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


@pytest.mark.parametrize("edit, message", [
    (dict(set_kv=("bert.pooling_type", 0)), "pooling_type 0 is not supported"),
    (dict(set_kv=("bert.pooling_type", 4)), "pooling_type 4 is not supported"),
    (dict(drop_key="bert.block_count"), "bert.block_count is missing"),
    (dict(arch="nomic-bert-moe"), "not an encoder"),
])
def test_unsupported_files_are_named(tmp_path, edit, message):
    good = write_tiny_embedding_gguf(write_tiny_embedding(tmp_path / "b"), tmp_path / "good.gguf")
    bad = _rewrite(good, tmp_path / "bad.gguf", **edit)
    with pytest.raises(ModelLoadError, match=message) as e:
        load_embedding(bad)
    assert "bad.gguf" in str(e.value)


def test_a_missing_tensor_is_named(tmp_path):
    good = write_tiny_embedding_gguf(write_tiny_embedding(tmp_path / "b"), tmp_path / "good.gguf")
    r = gguf.GGUFReader(str(good))
    w = gguf.GGUFWriter(str(tmp_path / "bad.gguf"), "bert")
    for field in r.fields.values():
        if not field.name.startswith("GGUF.") and field.name != "general.architecture":
            vtype = field.types[0]
            if vtype == gguf.GGUFValueType.ARRAY:
                w.add_array(field.name, field.contents())
            else:
                w.add_key_value(field.name, field.contents(), vtype)
    for t in r.tensors:
        if t.name != "blk.1.ffn_up.weight":
            w.add_tensor(t.name, np.asarray(t.data), raw_shape=list(reversed([int(d) for d in t.shape])),
                         raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ModelLoadError, match="blk.1.ffn_up.weight is missing"):
        load_embedding(tmp_path / "bad.gguf")
    assert not is_embedding_gguf(tmp_path / "nothing.gguf") and not is_embedding_gguf(tmp_path)


@pytest.mark.parametrize("outtype, quantize, least_cos", [("F32", None, 0.999999), ("F16", None, 0.9999),
                                                          ("Q8_0", None, 0.999), ("F32", "q8_0", 0.999)])
def test_nomic_bert_against_the_float64_reference(tmp_path, outtype, quantize, least_cos):
    """nomic-bert: rotary positions instead of a table, SwiGLU, no linear biases, q|k|v fused in the file"""
    folder = write_tiny_embedding(tmp_path / "n", arch="nomic", n_layers=2, hidden=96)
    emb = Embedder(load_embedding(write_tiny_embedding_gguf(folder, tmp_path / "n.gguf", outtype),
                                        quantize=quantize), threads=2)
    assert emb.model.config["rotary"] and emb.model.config["gated_ffn"]
    ref = Reference(folder)
    ids = emb.tokenize(SENTENCES + ["the " * 30 + "end"])
    got = emb.embed(ids)
    want = np.stack([ref.embed(s) for s in ids])
    assert _cos(got, want).min() >= least_cos
    if outtype == "F32" and quantize is None:
        np.testing.assert_allclose(got, want, rtol=0, atol=2e-5 * np.abs(want).max())
        ref.cfg["rotary_emb_base"] = 10000.0              # the rotation is there, with the file's base
        assert _cos(got, np.stack([ref.embed(s) for s in ids])).min() < 0.9999
    together = emb.embed(ids)
    assert all(np.array_equal(emb.embed([s])[0], together[i]) for i, s in enumerate(ids))
