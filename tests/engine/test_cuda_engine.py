"""What the CUDA engine does before it touches a GPU (runs without one): it refuses models with switches it lacks,
and builds its weights from the layer plan."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from tests.reference import random_model


@pytest.mark.parametrize("arch,needs", [("gemma3", "sliding-window layers"), ("qwen3", "QK-norm")])
def test_cuda_engine_refuses_what_it_cannot_run(arch, needs):
    from inferd.engine.cuda_engine import CudaEngine

    with pytest.raises(ValueError, match=f"does not run {arch} models yet .*{needs}.*--device cpu"):
        CudaEngine(random_model(arch=arch), num_kv_blocks=1)


class RecordingRunner:
    """Stands in for inferd._cuda.Model: records what CudaEngine._load hands it."""

    def __init__(self):
        self.weights = {}        # (which, layer) -> [format, rows, cols, [(src, values, row0)...]]

    def alloc_weight(self, which, layer, fmt, rows, cols):
        assert (which, layer) not in self.weights
        self.weights[which, layer] = [fmt, rows, cols, []]

    def load_weight(self, which, layer, src, data, row0=0):
        self.weights[which, layer][3].append((src, np.asarray(data), row0))

    def finish_load(self):
        self.finished = True


def stand_in_cuda():
    names = ("W_EMB", "W_OUT", "W_OUT_NORM", "W_ATTN_NORM", "W_FFN_NORM", "W_QKV", "W_QKV_BIAS", "W_O", "W_GU",
             "W_DOWN")   # ext/_cuda.pyx's weight ids
    return SimpleNamespace(**dict(zip(names, range(10))), FORMATS={"bf16": 0, "q8_0": 2}, SRC_F32=0,
                           SRC_TYPES={"F32": 0, "Q8_0": 3})


@pytest.mark.parametrize("weight_type", ["F32", "Q8_0"])
def test_cuda_load_takes_every_tensor_of_the_layer_plan(weight_type):
    """Without a GPU: the weights CudaEngine._load builds are the layer plan's tensors, fused as the runner expects
    (Wq|Wk|Wv and Wgate|Wup by rows, the QKV bias concatenated), each once."""
    from inferd.engine.cuda_engine import CudaEngine

    model = random_model(arch="qwen2", weight_type=weight_type, n_layers=2, tie=False)
    cu = stand_in_cuda()
    eng = CudaEngine.__new__(CudaEngine)
    eng._cu, eng.config, eng.weight_dtype, eng._m = cu, model.config, "auto", RecordingRunner()
    eng._load(model)
    w, ts, c = eng._m.weights, model.tensors, model.config
    assert eng._m.finished and len(w) == 3 + 2 * 7
    fmt, rows, cols, parts = w[cu.W_QKV, 1]
    assert (fmt, rows, cols) == (0 if weight_type == "F32" else 2, c.q_dim + 2 * c.kv_dim, c.dim)
    assert [p[2] for p in parts] == [0, c.q_dim, c.q_dim + c.kv_dim]
    assert all(np.array_equal(p[1], ts[f"blk.1.attn_{x}.weight"].data) for p, x in zip(parts, "qkv"))
    bias = w[cu.W_QKV_BIAS, 1][3][0][1]
    assert np.array_equal(bias, np.concatenate([ts[f"blk.1.attn_{x}.bias"].data.ravel() for x in "qkv"]))
    assert [p[2] for p in w[cu.W_GU, 0][3]] == [0, c.hidden_dim] and w[cu.W_DOWN, 0][1:3] == [c.dim, c.hidden_dim]
    assert np.array_equal(w[cu.W_FFN_NORM, 1][3][0][1], ts["blk.1.ffn_norm.weight"].data.ravel())
    assert w[cu.W_OUT, 0][1:3] == [c.vocab_size, c.dim]
