"""Cross-encoder scoring (inferd/model/cross_encoder.py, inferd/engine/reranker.py) on tiny random CrossEncoder
folders: against the float64 reference (tests/encoder_reference.py) and, where sentence-transformers and torch are
installed, against sentence_transformers.CrossEncoder.predict on the same folder; token types, the pooler's tanh,
one label (sigmoid) and several (logits), truncation, batch invariance, Q8_0."""
from __future__ import annotations

import numpy as np
import pytest

from inferd.engine.reranker import Reranker
from inferd.model.cross_encoder import is_cross_encoder_folder, load_cross_encoder
from inferd.model.embedding import is_embedding_folder
from inferd.model.errors import ModelLoadError
from tests.encoder_reference import CrossEncoderReference
from tests.model.make_tiny_cross_encoder import write_tiny_cross_encoder

QUERY = "where did the fox run"
DOCS = ["The quick brown fox jumps over the lazy dog.", "hello", "a cat sat on the bank of the river",
        "stocks fell sharply and money rose in the city market", "the fox ran to the river", "red? blue! green."]
PAIRS = [(QUERY, d) for d in DOCS] + [("money", "the city market"), ("x", "the " * 10 + "end")]


@pytest.fixture(scope="module", params=[dict(), dict(pooler=False), dict(num_labels=3)],
                ids=["one-label", "no-pooler", "three-labels"])
def tiny(request, tmp_path_factory):
    folder = write_tiny_cross_encoder(tmp_path_factory.mktemp("ce"), **request.param)
    return folder, Reranker(load_cross_encoder(folder), threads=2)


def test_scores_match_float64_reference(tiny):
    folder, rr = tiny
    ref = CrossEncoderReference(folder)
    pairs = rr.tokenize_pairs(PAIRS)
    got = rr.embed(pairs)
    want = np.stack([ref.score(p, [int(i >= p.second) for i in range(len(p))]) for p in pairs])
    assert got.shape == (len(PAIRS), len(rr.model.labels))
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-5)
    assert np.ptp(got[:, 0]) > 0.05                          # random weights still tell the pairs apart
    types_ignored = np.stack([ref.score(p, [0] * len(p)) for p in pairs])
    assert np.abs(types_ignored - want).max() > 1e-3         # the second text's token type matters


def test_pairs_are_cls_query_sep_document_sep(tiny):
    _, rr = tiny
    vocab = rr.model.tokenizer.get_vocab()
    p = rr.tokenize_pairs([("the cat", "a dog")])[0]
    assert list(p) == [vocab[t] for t in ("[CLS]", "the", "cat", "[SEP]", "a", "dog", "[SEP]")] and p.second == 4


def test_a_pair_gets_the_same_bits_alone_and_in_any_batch(tiny):
    _, rr = tiny
    pairs = rr.tokenize_pairs(PAIRS)
    together = rr.embed(pairs)
    for i, p in enumerate(pairs):
        assert np.array_equal(rr.embed([p])[0], together[i])
    assert np.array_equal(rr.embed(pairs[::-1])[::-1], together)


def test_long_pairs_are_cut_longest_first(tmp_path):
    rr = Reranker(load_cross_encoder(write_tiny_cross_encoder(tmp_path / "c", max_length=16)), threads=1)
    p = rr.tokenize_pairs([("the cat sat", "the " * 40)])[0]
    assert len(p) == 16 and p.second == 5                     # the query kept whole, the document cut
    assert rr.embed([p]).shape == (1, 1)


def test_q8_0_stays_close(tmp_path):
    folder = write_tiny_cross_encoder(tmp_path / "q")
    exact = Reranker(load_cross_encoder(folder), threads=2)
    q8 = Reranker(load_cross_encoder(folder, quantize="q8_0"), threads=2)
    pairs = exact.tokenize_pairs(PAIRS)
    np.testing.assert_allclose(q8.embed(pairs), exact.embed(pairs), atol=0.03)   # 8-bit weights of a random net


def test_folder_detection_and_errors(tmp_path):
    folder = write_tiny_cross_encoder(tmp_path / "c")
    assert is_cross_encoder_folder(folder) and not is_cross_encoder_folder(tmp_path)
    assert not is_embedding_folder(folder) or is_cross_encoder_folder(folder)
    bad = write_tiny_cross_encoder(tmp_path / "bad", activation="torch.nn.modules.activation.Tanh")
    with pytest.raises(ModelLoadError, match="activation_fn"):
        load_cross_encoder(bad)
    (folder / "tokenizer.json").unlink()
    with pytest.raises(ModelLoadError, match="no tokenizer.json"):
        load_cross_encoder(folder)


@pytest.mark.parametrize("num_labels", [1, 3])
def test_scores_match_sentence_transformers_cross_encoder(tmp_path, num_labels):
    st = pytest.importorskip("sentence_transformers", reason="sentence-transformers (and torch) not installed")
    import torch

    torch.set_num_threads(2)
    folder = write_tiny_cross_encoder(tmp_path / "st", num_labels=num_labels)
    model = st.CrossEncoder(str(folder), device="cpu")
    with torch.inference_mode():
        want = np.asarray(model.predict(PAIRS, batch_size=4, convert_to_numpy=True), np.float64).reshape(len(PAIRS), -1)
    rr = Reranker(load_cross_encoder(folder), threads=2)
    np.testing.assert_allclose(rr.embed(rr.tokenize_pairs(PAIRS)), want, rtol=0, atol=2e-5)
