"""The architecture table (inferd/model/arch.py): its rows, tensor names and the metadata a row reads itself."""
from __future__ import annotations

import math

import pytest

from inferd.model.arch import (ARCHITECTURES, ARCHS, BLOCK_TENSORS, BUILT_KINDS, HF_ARCHS, HF_BLOCK_TENSORS,
                               HF_MODEL_TENSORS, MODEL_TENSORS, gemma3_options)


def test_every_row_is_made_of_built_blocks():
    assert ARCHS == ("llama", "mistral", "qwen2", "qwen3", "gemma3")
    for row in ARCHITECTURES.values():
        assert (row.mixer, row.ffn) == ("attention", "ffn_gated")
        assert row.mixer in BUILT_KINDS and row.ffn in BUILT_KINDS
    assert HF_ARCHS == {"LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral", "Qwen2ForCausalLM": "qwen2",
                        "Qwen3ForCausalLM": "qwen3"}


def test_rows_say_what_each_architecture_is():
    on = {name: (r.qkv_bias, r.qk_norm, r.sandwich_norms, r.ffn_act, r.gguf_rope_neox)
          for name, r in ARCHITECTURES.items()}
    assert on == {"llama": (False, False, False, "silu", False), "mistral": (False, False, False, "silu", False),
                  "qwen2": (True, False, False, "silu", True), "qwen3": (False, True, False, "silu", True),
                  "gemma3": (False, True, True, "gelu_tanh", True)}
    assert [n for n, r in ARCHITECTURES.items() if r.hf_sliding_window] == ["mistral"]


def test_tensor_names_are_llama_cpp_s_and_never_shared():
    names = [n for roles in BLOCK_TENSORS.values() for n in roles.values()] + list(MODEL_TENSORS.values())
    assert len(names) == len(set(names)) == 19
    assert BLOCK_TENSORS["attention"]["o"] == "attn_output.weight"
    assert BLOCK_TENSORS["ffn_gated"]["post_norm"] == "post_ffw_norm.weight"


def test_hugging_face_names_are_of_the_same_roles():
    for kind, roles in HF_BLOCK_TENSORS.items():
        assert set(roles) <= set(BLOCK_TENSORS[kind])
    assert set(HF_BLOCK_TENSORS["attention"]) == set(BLOCK_TENSORS["attention"]) - {"post_norm"}   # no HF Gemma
    assert HF_BLOCK_TENSORS["ffn_gated"]["norm"] == "post_attention_layernorm.weight"
    assert set(HF_MODEL_TENSORS) == set(MODEL_TENSORS)


def metadata(**fields):
    def key(name, default=KeyError):
        if name not in fields:
            if default is KeyError:
                raise ValueError(f"missing metadata key {name}")
            return default
        return fields[name]
    return key


def test_gemma3_reads_its_own_keys():
    got = gemma3_options(metadata(**{"gemma3.attention.sliding_window": 512, "gemma3.final_logit_softcapping": 30.0}),
                         n_layers=8, dim=640, n_heads=4, head_dim=256)
    assert got == {"embed_scale": math.sqrt(640), "attn_scale": 256 ** -0.5, "logit_softcap": 30.0,
                   "sliding_window": 512, "local_layers": (0, 1, 2, 3, 4, 6, 7), "rope_theta_local": 10000.0}
    flags = [True, False, True]
    got = gemma3_options(metadata(**{"gemma3.attention.sliding_window": 4,
                                     "gemma3.attention.sliding_window_pattern": flags}), 3, 640, 4, 256)
    assert got["local_layers"] == (0, 2)
    assert gemma3_options(metadata(), 62, 5376, 32, 128)["attn_scale"] == (5376 // 32) ** -0.5   # the 27B's
    with pytest.raises(ValueError, match="has 3 entries for 4 layers"):
        gemma3_options(metadata(**{"gemma3.attention.sliding_window": 4,
                                   "gemma3.attention.sliding_window_pattern": flags}), 4, 640, 4, 256)
