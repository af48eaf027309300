"""The architecture table (inferd/model/arch.py): its rows, tensor names and the metadata a row reads itself."""
from __future__ import annotations

import math

import pytest

from inferd.model.arch import (ARCHITECTURES, ARCHS, BLOCK_TENSORS, BUILT_KINDS, HF_ARCHS, HF_BLOCK_TENSORS,
                               HF_MODEL_TENSORS, MODEL_TENSORS, gemma3_options, gpt_oss_options)


def test_every_row_is_made_of_built_blocks():
    assert ARCHS == ("llama", "mistral", "qwen2", "qwen3", "gemma3", "qwen2moe", "qwen3moe", "olmoe", "qwen35",
                     "qwen3next", "qwen35moe", "gpt-oss")
    assert BUILT_KINDS == ("attention", "ffn_gated", "ffn_moe", "recurrent")
    for row in ARCHITECTURES.values():
        moe = row.name.endswith("moe") or row.name in ("qwen3next", "gpt-oss")
        assert (row.mixer, row.ffn) == ("attention", "ffn_moe" if moe else "ffn_gated")
        assert row.mixer in BUILT_KINDS and row.ffn in BUILT_KINDS
    assert HF_ARCHS == {"LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral", "Qwen2ForCausalLM": "qwen2",
                        "Qwen3ForCausalLM": "qwen3"}


def test_rows_say_what_each_architecture_is():
    on = {name: (r.qkv_bias, r.qk_norm, r.sandwich_norms, r.ffn_act, r.gguf_rope_neox)
          for name, r in ARCHITECTURES.items()}
    assert on == {"llama": (False, False, False, "silu", False), "mistral": (False, False, False, "silu", False),
                  "qwen2": (True, False, False, "silu", True), "qwen3": (False, True, False, "silu", True),
                  "gemma3": (False, True, True, "gelu_tanh", True), "qwen2moe": (True, False, False, "silu", True),
                  "qwen3moe": (False, True, False, "silu", True), "olmoe": (False, True, False, "silu", True),
                  "qwen35": (False, True, False, "silu", True), "qwen3next": (False, True, False, "silu", True),
                  "qwen35moe": (False, True, False, "silu", True),
                  "gpt-oss": (True, False, False, "swiglu_oai", True)}
    assert [n for n, r in ARCHITECTURES.items() if r.hf_sliding_window] == ["mistral"]
    # the mixtures of experts as llama.cpp runs them: top-k weights renormalized (Qwen3-MoE, and Mixtral as a llama
    # file with experts), Qwen2-MoE's shared expert, OLMoE's QK-norm over all of q and k
    assert [n for n, r in ARCHITECTURES.items() if r.moe_norm_topk] == ["llama", "qwen3moe", "qwen3next", "qwen35moe"]
    assert [n for n, r in ARCHITECTURES.items() if r.shared_expert] == ["qwen2moe", "qwen3next", "qwen35moe"]
    # the hybrids: Gated DeltaNet layers beside gated attention, the layer pattern read from the file; Qwen3-Next's
    # value heads grouped per key head
    assert [n for n, r in ARCHITECTURES.items() if r.hybrid_gdn] == ["qwen35", "qwen3next", "qwen35moe"]
    assert [n for n, r in ARCHITECTURES.items() if r.gdn_grouped_heads] == ["qwen3next"]
    assert [n for n, r in ARCHITECTURES.items() if r.qk_norm_full] == ["olmoe"]
    # gpt-oss: top k on the logits and the softmax over those k, biases, sinks, its FFN norm's own name
    oss = ARCHITECTURES["gpt-oss"]
    assert (oss.moe_gating, oss.expert_bias, oss.attn_sinks, oss.attn_out_bias) == ("topk_softmax", True, True, True)
    assert oss.ffn_norm_tensor == "post_attention_norm.weight"
    assert [n for n, r in ARCHITECTURES.items() if r.moe_gating != "softmax" or r.attn_sinks] == ["gpt-oss"]


def test_tensor_names_are_llama_cpp_s_and_never_shared():
    # the two FFN kinds (a layer has one) share their input norm's name, as llama.cpp's files do
    moe_own = {r: n for r, n in BLOCK_TENSORS["ffn_moe"].items() if r != "norm"}
    assert BLOCK_TENSORS["ffn_moe"]["norm"] == BLOCK_TENSORS["ffn_gated"]["norm"]
    kinds = [BLOCK_TENSORS["attention"], BLOCK_TENSORS["ffn_gated"], moe_own]
    names = [n for roles in kinds for n in roles.values()] + list(MODEL_TENSORS.values())
    assert len(names) == len(set(names)) == 33
    assert BLOCK_TENSORS["ffn_moe"]["gate_exps"] == "ffn_gate_exps.weight"
    assert BLOCK_TENSORS["ffn_moe"]["shared_gate"] == "ffn_gate_inp_shexp.weight"
    assert BLOCK_TENSORS["attention"]["o"] == "attn_output.weight"
    assert BLOCK_TENSORS["ffn_gated"]["post_norm"] == "post_ffw_norm.weight"
    recurrent = set(BLOCK_TENSORS["recurrent"].values()) - {BLOCK_TENSORS["attention"]["norm"]}
    assert not recurrent & set(names) and len(recurrent) == len(BLOCK_TENSORS["recurrent"]) - 1 == 11
    assert BLOCK_TENSORS["recurrent"]["a"] == "ssm_a" and BLOCK_TENSORS["recurrent"]["dt_bias"] == "ssm_dt.bias"


def test_hugging_face_names_are_of_the_same_roles():
    for kind, roles in HF_BLOCK_TENSORS.items():
        assert set(roles) <= set(BLOCK_TENSORS[kind])
    # no HF Gemma, no HF gpt-oss
    assert set(HF_BLOCK_TENSORS["attention"]) == set(BLOCK_TENSORS["attention"]) - {"post_norm", "o_bias", "sinks"}
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


def qwen35_metadata(**fields):
    base = {"general.architecture": "qwen35", "qwen35.ssm.time_step_rank": 16, "qwen35.ssm.inner_size": 2048,
            "qwen35.ssm.conv_kernel": 4, "qwen35.ssm.state_size": 128, "qwen35.ssm.group_count": 16}
    return metadata(**{**base, **fields})


def test_qwen35_layer_pattern_as_llama_cpp_reads_it():
    from inferd.model.arch import qwen35_options

    opts = qwen35_options(qwen35_metadata(), 8, 2048, 8, 256)        # every 4th layer attention by default
    assert opts["recurrent_layers"] == (0, 1, 2, 4, 5, 6)
    assert (opts["ssm_head_k"], opts["ssm_head_v"], opts["ssm_k_heads"], opts["ssm_v_heads"]) == (128, 128, 16, 16)
    opts = qwen35_options(qwen35_metadata(**{"qwen35.full_attention_interval": 2}), 4, 2048, 8, 256)
    assert opts["recurrent_layers"] == (0, 2)
    flags = [True, False, False, True]                              # per layer, when the file lists them
    opts = qwen35_options(qwen35_metadata(**{"qwen35.attention.recurrent_layers": flags}), 4, 2048, 8, 256)
    assert opts["recurrent_layers"] == (0, 3)
    with pytest.raises(ValueError, match="inner_size"):
        qwen35_options(qwen35_metadata(**{"qwen35.ssm.inner_size": 100}), 4, 2048, 8, 256)


def test_gpt_oss_reads_its_window_and_its_layers():
    """Every other layer a sliding window, the even ones (llama.cpp's pattern 2), unless the file lists them."""
    got = gpt_oss_options(metadata(**{"gpt-oss.attention.sliding_window": 128}), 24, 2880, 64, 64)
    assert got == {"sliding_window": 128, "local_layers": tuple(range(0, 24, 2))}
    got = gpt_oss_options(metadata(**{"gpt-oss.attention.sliding_window": 128,
                                      "gpt-oss.attention.sliding_window_pattern": [False, True, True]}), 3, 64, 1, 64)
    assert got["local_layers"] == (1, 2)
    assert gpt_oss_options(metadata(), 24, 2880, 64, 64) == {"sliding_window": 0, "local_layers": ()}
