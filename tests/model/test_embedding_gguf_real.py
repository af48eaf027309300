"""GGUFs that llama.cpp's convert_hf_to_gguf.py makes from the real all-MiniLM-L6-v2 and EmbeddingGemma-300M folders
embed like the folders: the same tokens from the GGUF's vocabulary, cosine >= 0.9999 to the folder's vectors in
F32 and F16 (F32: the same bits), >= 0.998 in Q8_0 (the converter quantizes BERT's Wv too, which inferd's own
--quantize keeps in float for accuracy: MiniLM's worst sentence is at 0.9983 either way), and as close to
sentence-transformers' recorded vectors as the folder is. The tiny files of test_embedding_gguf.py follow the
converter's names and keys: checked here too.

Skipped with a reason when a folder is absent, or the converter or torch is (tests/model/make_embedding_gguf.py).
EmbeddingGemma's conversions take minutes and gigabytes: `-m slow`."""
from __future__ import annotations

import re

import numpy as np
import pytest

from inferd.engine.embedder import Embedder
from inferd.model.embedding import load_embedding_model
from inferd.model.embedding_gguf import load_embedding
from inferd.model.gguf import validate_gguf
from tests.engine.test_embedding_real import FAST_COUNT, model_folder, recorded_vectors, sentences
from tests.model import make_embedding_gguf
from tests.model.make_tiny_embedding import write_tiny_embedding
from tests.model.make_tiny_embedding_gguf import write_tiny_embedding_gguf


def _cos(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    reason = make_embedding_gguf.why_not()
    if reason:
        pytest.skip(reason)
    made: dict = {}
    out = tmp_path_factory.mktemp("gguf")

    def get(name: str, outtype: str):
        if (name, outtype) not in made:
            made[name, outtype] = make_embedding_gguf.convert(model_folder(name), out / f"{name}-{outtype}.gguf",
                                                              outtype)
        return made[name, outtype]

    return get


def check(converted, name: str, outtype: str, floor: float, count: int):
    folder = model_folder(name)
    path = converted(name, outtype)
    texts = sentences()[:count]
    from_folder = Embedder(load_embedding_model(folder), threads=2)
    from_file = Embedder(load_embedding(path), threads=2)
    prompt, recorded, _ = recorded_vectors(name)
    # the file has no prompts: the folder's prompt goes in front of the text by hand
    prefix = from_folder.prompt(prompt)
    ids = from_folder.tokenize(texts, input_type=prompt, truncate=True)
    assert from_file.tokenize([prefix + t for t in texts], truncate=True) == ids
    got, want = from_file.embed(ids), from_folder.embed(ids)
    if outtype == "f32":
        assert np.array_equal(got, want)
    cos = _cos(got, want)
    assert cos.min() >= floor, f"cosine {cos.min():.6f} on {texts[int(np.argmin(cos))]!r}"
    assert _cos(got, recorded[:count]).min() >= (0.9999 if outtype != "q8_0" else floor)
    assert (from_file.model.pooling, from_file.dimensions) == (from_folder.model.pooling, from_folder.dimensions)


@pytest.mark.parametrize("outtype, floor", [("f32", 0.9999), ("f16", 0.9999), ("q8_0", 0.998)])
def test_minilm_gguf_embeds_like_its_folder(converted, outtype, floor):
    check(converted, "all-MiniLM-L6-v2", outtype, floor, FAST_COUNT["all-MiniLM-L6-v2"])


@pytest.mark.slow
@pytest.mark.parametrize("outtype, floor", [("f32", 0.9999), ("f16", 0.9999), ("q8_0", 0.999)])
def test_embeddinggemma_gguf_embeds_like_its_folder(converted, outtype, floor):
    check(converted, "embeddinggemma-300m", outtype, floor, FAST_COUNT["embeddinggemma-300m"])


def _shape_of(path) -> tuple[set, set]:
    """(tensor names with the layer number dropped, with their types' kind and rank; metadata keys read)"""
    h = validate_gguf(str(path))
    tensors = {(re.sub(r"blk\.\d+\.", "blk.N.", t.name), len(t.dims)) for t in h.tensors}
    return tensors, set(h.metadata)


def test_the_tiny_writer_follows_the_converter(converted, tmp_path):
    real_tensors, real_keys = _shape_of(converted("all-MiniLM-L6-v2", "f32"))
    tiny_tensors, tiny_keys = _shape_of(write_tiny_embedding_gguf(write_tiny_embedding(tmp_path / "b"),
                                                                  tmp_path / "b.gguf"))
    assert tiny_tensors == real_tensors
    assert tiny_keys - real_keys <= {"bert.causal_attention"}
