"""The C model's layers are lists of blocks (ext/cpu/inferd.h's layer_t, run by forward.c's layer_forward): the
builder refuses kinds that are not built, and a step runs whatever list each layer holds, so a layer without its
FFN computes bit for bit what a layer whose FFN adds zero does."""
from __future__ import annotations

import numpy as np
import pytest

from inferd import _cpu
from inferd.engine.weights import cpu_model_parts
from inferd.model import arch
from inferd.model.model_config import FFN_ACTS
from tests.reference import random_model


def logits_of(config, tensors, layers, tokens):
    model = _cpu.Model(config, tensors, layers)
    ctx = _cpu.Context(model, len(tokens), len(tokens), 2, 1, "f16")
    n = len(tokens)
    params = np.zeros(n, _cpu.SAMPLE_PARAMS_DTYPE)
    params["num_logprobs"], params["mask_row"], params["top_p"], params["repetition_penalty"] = -1, -1, 1.0, 1.0
    _, logits, _ = ctx.forward(np.asarray(tokens, np.int32), np.arange(n, dtype=np.int32), np.zeros(n, np.int32),
                               np.array([[0, 1]], np.int32), np.arange(n, dtype=np.int32), np.zeros(n, np.int32),
                               params, np.zeros(0, np.int32), np.zeros(0, np.int32), np.zeros(0, np.float32), True,
                               False)
    return logits


def zeroed(spec):
    kind, rows, cols, data = spec
    return (kind, rows, cols, np.zeros_like(data))


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_a_layer_runs_the_blocks_it_holds(arch):
    config, tensors, layers = cpu_model_parts(random_model(arch=arch, weight_type="F32", n_layers=3))
    tokens = [5, 17, 3, 99, 42]
    full = logits_of(config, tensors, layers, tokens)
    kind, options, ffn = layers[1][1]
    assert kind == "ffn_gated"
    silent = [list(b) for b in layers]
    silent[1][1] = (kind, options, {**ffn, "wdown": zeroed(ffn["wdown"])})   # (Gemma's post-norm of 0 is 0)
    without = [list(b) for b in layers]
    without[1] = without[1][:1]                       # layer 1: attention only
    a, b = logits_of(config, tensors, silent, tokens), logits_of(config, tensors, without, tokens)
    assert np.array_equal(a.view(np.uint32), b.view(np.uint32))
    assert not np.allclose(a, full, atol=1e-3)       # the FFN it lost did something


def test_the_builder_refuses_blocks_it_cannot_run():
    config, tensors, layers = cpu_model_parts(random_model())
    for kind, message in (("ffn_moe", "layer 0: an ffn_moe block needs router, experts_gu and experts_down"),
                          ("recurrent", "layer 0: a recurrent block needs win, wba, wout, conv"),
                          ("mamba", "layer 0: unknown block kind 'mamba'")):
        bad = [list(b) for b in layers]
        bad[0][1] = (kind, {}, {})
        with pytest.raises(ValueError, match=message):
            _cpu.Model(config, tensors, bad)
    with pytest.raises(ValueError, match="layer 1: 0 blocks"):
        _cpu.Model(config, tensors, [layers[0], []])
    with pytest.raises(ValueError, match="1 layers described for a model of 2"):
        _cpu.Model(config, tensors, layers[:1])


def test_the_c_block_kinds_are_the_table_s():
    assert set(_cpu.BLOCK_KINDS) == {arch.ATTENTION, arch.FFN_GATED, arch.FFN_MOE, arch.RECURRENT}
    assert _cpu.BUILT_BLOCK_KINDS == arch.BUILT_KINDS
    assert set(_cpu.FFN_ACTS) == set(FFN_ACTS)
