"""Reading sentence-transformers folders (inferd/model/embedding.py): what is taken from which file, and a clear
ModelLoadError naming the file for what is not supported."""
from __future__ import annotations

import json

import numpy as np
import pytest

from inferd.model.embedding import is_embedding_folder, load_embedding_model
from inferd.model.errors import ModelLoadError
from tests.model.make_tiny_embedding import write_tiny_embedding


def test_folder_contents_become_the_config(tmp_path):
    folder = write_tiny_embedding(tmp_path / "m", arch="gemma3", pooling="last", dense=[96, 48], max_seq_length=20,
                                  prompts={"query": "q: "})
    m = load_embedding_model(folder)
    assert (m.arch, m.pooling, m.normalize, m.dimensions, m.max_seq_length) == ("gemma3", "last", True, 48, 20)
    assert m.prompts == {"query": "q: "} and m.matryoshka_dims == ()     # EmbeddingGemma's 768/512/... exceed 48
    assert m.config["sliding_layers"] == [0] and m.config["attn_scale"] == pytest.approx(32 ** -0.5)
    assert [m.tensors[f"dense.{j}"][1:3] for j in (0, 1)] == [(96, 64), (48, 96)]
    # gate and up interleaved per 32 rows, q|k|v fused
    assert m.tensors["blk.0.wup"][1:3] == (192, 64) and m.tensors["blk.0.wqkv"][1:3] == (2 * 32 + 2 * 32, 64)
    assert is_embedding_folder(folder) and not is_embedding_folder(tmp_path)


def test_bert_quantized_keeps_wv_in_float(tmp_path):
    m = load_embedding_model(write_tiny_embedding(tmp_path / "b"), quantize="q8_0")
    assert m.tensors["blk.0.wqkv"][:3] == ("Q8_0", 128, 64)          # Wq | Wk
    assert m.tensors["blk.0.wqkv_f"][:3] == ("F32", 64, 64)          # Wv
    assert {m.tensors[f"blk.0.{w}"][0] for w in ("wo", "wup", "wdown")} == {"Q8_0"}
    np.testing.assert_array_equal(m.tensors["blk.0.bqkv"].shape, (3 * 64,))
    assert "blk.0.wqkv_f" not in load_embedding_model(write_tiny_embedding(tmp_path / "f")).tensors


@pytest.mark.parametrize("edit, message", [
    (lambda f: (f / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_max_tokens": True})),
     "exactly one of mean, CLS or last-token"),
    (lambda f: (f / "modules.json").write_text(json.dumps([{"idx": 0, "path": "", "type": "x.Unknown"}])),
     "not supported"),
    (lambda f: (f / "modules.json").write_text(json.dumps([{"idx": 0, "path": "../up", "type":
                                                           "sentence_transformers.models.Transformer"}])),
     "leaves the folder"),
    (lambda f: (f / "config.json").write_text(json.dumps({"model_type": "llama"})), "not an encoder"),
    (lambda f: (f / "2_Dense" / "config.json").write_text(json.dumps({
        "in_features": 64, "out_features": 48, "activation_function": "torch.nn.modules.activation.Tanh"})),
     "Identity only"),
    (lambda f: (f / "tokenizer.json").unlink(), "no tokenizer.json"),
])
def test_unsupported_folders_are_named(tmp_path, edit, message):
    folder = write_tiny_embedding(tmp_path / "bad", dense=[48])
    edit(folder)
    with pytest.raises(ModelLoadError, match=message) as e:
        load_embedding_model(folder)
    assert str(folder) in str(e.value)
