"""The layer plan (inferd/model/layers.py): each layer's blocks, their options and tensor names, from the table."""
from __future__ import annotations

import dataclasses

import pytest

from inferd.model import arch
from inferd.model.layers import expected_shapes, layer_blocks, layer_plan, model_tensor_shapes
from tests.reference import random_model


def test_a_qwen2_layer_is_biased_attention_then_swiglu():
    cfg = random_model(arch="qwen2").config
    attn, ffn = layer_blocks(cfg, 1)
    assert attn.kind == "attention" and ffn.kind == "ffn_gated"
    assert attn.options == {"rope_neox": 1, "window": 0, "scale": 1 / 8}
    assert attn.tensors == {"norm": "blk.1.attn_norm.weight", "q": "blk.1.attn_q.weight", "k": "blk.1.attn_k.weight",
                            "v": "blk.1.attn_v.weight", "o": "blk.1.attn_output.weight",
                            "q_bias": "blk.1.attn_q.bias", "k_bias": "blk.1.attn_k.bias", "v_bias": "blk.1.attn_v.bias"}
    assert attn.shapes["k"] == (64, 128) and attn.shapes["q_bias"] == (1, 128)
    assert ffn.options == {"act": "silu"}
    assert ffn.shapes == {"norm": (1, 128), "gate": (160, 128), "up": (160, 128), "down": (128, 160)}


def test_gemma3_layers_carry_their_window_norms_and_gelu():
    cfg = random_model(arch="gemma3", n_layers=3).config
    plan = layer_plan(cfg)
    assert [blocks[0].options["window"] for blocks in plan] == [24, 24, 0]
    attn, ffn = plan[2]
    assert attn.tensors["post_norm"] == "blk.2.post_attention_norm.weight"
    assert attn.tensors["q_norm"] == "blk.2.attn_q_norm.weight" and attn.shapes["k_norm"] == (1, 64)
    assert ffn.tensors["post_norm"] == "blk.2.post_ffw_norm.weight" and ffn.options == {"act": "gelu_tanh"}
    assert attn.options["scale"] == cfg.query_scale and attn.options["rope_neox"] == 1


def test_expected_shapes_are_the_plan_s_tensors():
    cfg = random_model(arch="qwen3", tie=False).config
    shapes = expected_shapes(cfg)
    assert list(model_tensor_shapes(cfg)) == ["token_embd.weight", "output_norm.weight", "output.weight"]
    assert len(shapes) == 3 + 2 * (5 + 2 + 4)
    for blocks in layer_plan(cfg):
        for b in blocks:
            assert all(shapes[b.tensors[role]] == shape for role, shape in b.shapes.items())


def test_an_architecture_needing_a_block_not_built_is_refused(monkeypatch):
    from inferd.model import layers

    recurrent = dataclasses.replace(arch.ARCHITECTURES["qwen3"], mixer=arch.RECURRENT)
    monkeypatch.setitem(arch.ARCHITECTURES, "qwen3", recurrent)
    monkeypatch.delitem(layers.BUILDERS, arch.RECURRENT)
    with pytest.raises(ValueError, match="qwen3 layers need recurrent blocks, which are not built yet"):
        layer_blocks(random_model(arch="qwen3").config, 0)


def test_qwen35_plan_mixes_recurrent_and_gated_attention_layers(tmp_path):
    from inferd.model.gguf import load_gguf
    from tests.model.make_tiny import make_variant

    cfg = load_gguf(make_variant("qwen35-gguf-f32", tmp_path)).config
    plan = layer_plan(cfg)
    assert [blocks[0].kind for blocks in plan] == ["recurrent", "attention", "recurrent", "attention"]
    gdn, attn = plan[0][0], plan[1][0]
    assert gdn.tensors["qkv"] == "blk.0.attn_qkv.weight" and gdn.shapes["qkv"] == (256, 128)
    assert gdn.shapes["conv"] == (256, 4) and gdn.tensors["a"] == "blk.0.ssm_a"
    assert gdn.options == {"n_k_heads": 2, "n_v_heads": 4, "head_k": 32, "head_v": 32, "conv_kernel": 4,
                           "grouped_heads": 0}
    assert attn.shapes["q"] == (2 * 2 * 64, 128) and attn.options["gated"] == 1   # q and the gate, per head
    assert all(blocks[1].tensors["norm"] == f"blk.{i}.post_attention_norm.weight" for i, blocks in enumerate(plan))
