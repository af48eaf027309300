"""ModelConfig (inferd.model.model_config) from HF config.json dicts and GGUF metadata; llama3 rope scaling; refusals of
unsupported models; the tensors a config implies (inferd.model.layers)."""
from __future__ import annotations

import math
import re

import numpy as np
import pytest

from inferd.model.layers import check_tensors, expected_shapes
from inferd.model.model_config import ModelConfig
from inferd.model.rope_scaling import llama3_freq_factors, llama3_from_factors

SMOLLM2_HF = {  # HuggingFaceTB/SmolLM2-135M-Instruct config.json
    "architectures": ["LlamaForCausalLM"], "hidden_size": 576, "intermediate_size": 1536,
    "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3, "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-05, "rope_theta": 100000, "tie_word_embeddings": True, "vocab_size": 49152,
    "hidden_act": "silu", "rope_scaling": None, "attention_bias": False, "mlp_bias": False,
}
LLAMA32_1B = {  # meta-llama/Llama-3.2-1B config.json
    "architectures": ["LlamaForCausalLM"], "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64, "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-05, "rope_theta": 500000.0, "tie_word_embeddings": True, "vocab_size": 128256,
    "hidden_act": "silu", "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                                           "original_max_position_embeddings": 8192, "rope_type": "llama3"},
}
QWEN25_05B = {  # Qwen/Qwen2.5-0.5B-Instruct config.json
    "architectures": ["Qwen2ForCausalLM"], "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
    "num_attention_heads": 14, "num_key_value_heads": 2, "max_position_embeddings": 32768, "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0, "tie_word_embeddings": True, "vocab_size": 151936, "hidden_act": "silu",
    "sliding_window": 32768, "use_sliding_window": False,
}
MISTRAL_7B_V01 = {  # mistralai/Mistral-7B-v0.1 config.json
    "architectures": ["MistralForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "sliding_window": 4096, "tie_word_embeddings": False,
    "vocab_size": 32000, "hidden_act": "silu",
}


def test_from_hf_smollm2():
    c = ModelConfig.from_hf(SMOLLM2_HF)
    assert c == ModelConfig(arch="llama", vocab_size=49152, dim=576, n_layers=30, n_heads=9, n_kv_heads=3,
                            head_dim=64, hidden_dim=1536, rope_theta=100000.0, rope_scaling=None, rope_neox=True,
                            norm_eps=1e-5, tie_embeddings=True, qkv_bias=False, context_length=8192)
    assert (c.q_dim, c.kv_dim) == (576, 192)


def test_from_hf_llama3_scaling_and_head_dim():
    c = ModelConfig.from_hf(LLAMA32_1B)
    assert (c.head_dim, c.n_kv_heads, c.rope_theta, c.context_length) == (64, 8, 500000.0, 131072)
    assert c.rope_scaling == {"factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                              "original_max_position_embeddings": 8192}
    # transformers >= 5 spelling: rope settings under rope_parameters
    v5 = {k: v for k, v in LLAMA32_1B.items() if k not in ("rope_scaling", "rope_theta")}
    v5["rope_parameters"] = {**LLAMA32_1B["rope_scaling"], "rope_theta": 500000.0}
    assert ModelConfig.from_hf(v5) == c


def test_from_hf_qwen2_has_biases_and_ignores_unused_window():
    c = ModelConfig.from_hf(QWEN25_05B)
    assert (c.arch, c.qkv_bias, c.rope_neox, c.head_dim, c.context_length, c.norm_eps) == \
        ("qwen2", True, True, 64, 32768, 1e-6)


def test_from_hf_qwen3_has_qk_norm_and_no_biases():
    qwen3_06b = {  # Qwen/Qwen3-0.6B config.json
        "architectures": ["Qwen3ForCausalLM"], "hidden_size": 1024, "intermediate_size": 3072,
        "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
        "max_position_embeddings": 40960, "rms_norm_eps": 1e-06, "rope_theta": 1000000, "tie_word_embeddings": True,
        "vocab_size": 151936, "hidden_act": "silu", "attention_bias": False, "use_sliding_window": False,
        "sliding_window": None, "rope_scaling": None}
    c = ModelConfig.from_hf(qwen3_06b)
    assert (c.arch, c.qk_norm, c.qkv_bias, c.head_dim, c.q_dim, c.rope_neox, c.context_length) == \
        ("qwen3", True, False, 128, 2048, True, 40960)


def test_from_hf_mistral_sliding_window_caps_context():
    c = ModelConfig.from_hf(MISTRAL_7B_V01)
    assert (c.arch, c.head_dim, c.context_length, c.tie_embeddings) == ("mistral", 128, 4096, False)
    assert ModelConfig.from_hf({**MISTRAL_7B_V01, "sliding_window": None}).context_length == 32768


@pytest.mark.parametrize("change,message", [
    ({"architectures": ["GemmaForCausalLM"]}, "unsupported architectures ['GemmaForCausalLM']"),
    ({"architectures": None}, "unsupported architectures []"),
    ({"num_attention_heads": 6}, "head_dim 96 is not supported"),
    ({"intermediate_size": 1540}, "hidden_dim 1540 is not a multiple of 32"),
    ({"hidden_size": 560, "head_dim": 64, "num_attention_heads": 9}, "dim 560 is not a multiple of 32"),
    ({"num_key_value_heads": 4}, "n_heads 9 is not a multiple of n_kv_heads 4"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope scaling type 'yarn' is not supported"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "llama3 rope_scaling lacks low_freq_factor"),
    ({"quantization_config": {"quant_method": "awq"}}, "pre-quantized checkpoints (awq) are not supported"),
    ({"hidden_act": "gelu"}, "hidden_act 'gelu' is not supported"),
    ({"attention_bias": True}, "attention_bias/mlp_bias are not supported"),
    ({"vocab_size": "49152"}, "vocab_size must be an integer"),
    ({"rms_norm_eps": -1.0}, "norm_eps must be a positive number"),
    ({"num_hidden_layers": 0}, "n_layers must be a positive integer"),
])
def test_from_hf_refusals(change, message):
    with pytest.raises(ValueError) as e:
        ModelConfig.from_hf({**SMOLLM2_HF, **change})
    assert message in str(e.value)


GGUF_SMOLLM2 = {
    "general.architecture": "llama", "llama.block_count": 30, "llama.context_length": 8192,
    "llama.embedding_length": 576, "llama.feed_forward_length": 1536, "llama.attention.head_count": 9,
    "llama.attention.head_count_kv": 3, "llama.rope.freq_base": 100000.0,
    "llama.attention.layer_norm_rms_epsilon": 1e-5, "llama.vocab_size": 49152, "llama.rope.dimension_count": 64,
}


def test_from_gguf_llama_and_qwen2():
    names = ["token_embd.weight", "blk.0.attn_q.weight"]
    c = ModelConfig.from_gguf(GGUF_SMOLLM2, names)
    assert (c.arch, c.dim, c.n_heads, c.n_kv_heads, c.head_dim, c.rope_neox, c.tie_embeddings, c.qkv_bias) == \
        ("llama", 576, 9, 3, 64, False, True, False)
    assert not ModelConfig.from_gguf(GGUF_SMOLLM2, names + ["output.weight"]).tie_embeddings
    qwen = {k.replace("llama.", "qwen2."): v for k, v in GGUF_SMOLLM2.items()}
    qwen["general.architecture"] = "qwen2"
    c = ModelConfig.from_gguf(qwen, names)
    assert (c.arch, c.rope_neox, c.qkv_bias) == ("qwen2", True, True)
    # vocab size from the token list when the arch key is absent
    no_vocab = {k: v for k, v in GGUF_SMOLLM2.items() if k != "llama.vocab_size"}
    assert ModelConfig.from_gguf({**no_vocab, "tokenizer.ggml.tokens": ["a"] * 64}, names).vocab_size == 64
    # linear rope scaling, also when only the factor is written (older files)
    assert ModelConfig.from_gguf({**GGUF_SMOLLM2, "llama.rope.scale_linear": 4.0}, names).rope_linear_factor == 4.0
    assert ModelConfig.from_gguf({**GGUF_SMOLLM2, "llama.rope.scaling.type": "linear",
                                  "llama.rope.scaling.factor": 2.0}, names).rope_linear_factor == 2.0


GGUF_GEMMA3_270M = {  # the metadata of gemma-3-270m's GGUF (llama.cpp's converter)
    "general.architecture": "gemma3", "gemma3.context_length": 32768, "gemma3.embedding_length": 640,
    "gemma3.block_count": 18, "gemma3.feed_forward_length": 2048, "gemma3.attention.head_count": 4,
    "gemma3.attention.layer_norm_rms_epsilon": 1e-6, "gemma3.attention.key_length": 256,
    "gemma3.attention.value_length": 256, "gemma3.rope.freq_base": 1e6, "gemma3.attention.sliding_window": 512,
    "gemma3.attention.head_count_kv": 1, "tokenizer.ggml.tokens": ["a"] * 262144,
}


def test_from_gguf_gemma3_as_llama_cpp_reads_it():
    c = ModelConfig.from_gguf(GGUF_GEMMA3_270M, ["token_embd.weight"])
    assert (c.arch, c.vocab_size, c.head_dim, c.q_dim, c.rope_neox, c.tie_embeddings, c.qkv_bias) == \
        ("gemma3", 262144, 256, 1024, True, True, False)
    assert (c.qk_norm, c.sandwich_norms, c.ffn_act, c.logit_softcap) == (True, True, "gelu_tanh", 0.0)
    assert c.embed_scale == pytest.approx(math.sqrt(640)) and c.query_scale == 1 / 16     # query_pre_attn_scalar 256
    assert (c.sliding_window, c.rope_theta, c.rope_theta_local, c.rope_linear_factor) == (512, 1e6, 10000.0, 1.0)
    assert c.local_layers == tuple(i for i in range(18) if i not in (5, 11, 17))         # every 6th layer global
    assert [c.layer_window(i) for i in (4, 5, 6)] == [512, 0, 512]
    shapes = expected_shapes(c)
    assert shapes["blk.3.attn_q_norm.weight"] == (1, 256) and shapes["blk.3.post_ffw_norm.weight"] == (1, 640)
    assert c.switches() == ["QK-norm", "sandwich norms", "GeGLU", "an embedding scale", "its own attention scale",
                            "sliding-window layers"]
    assert ModelConfig.from_gguf(GGUF_SMOLLM2, []).switches() == []


def test_from_gguf_gemma3_variants():
    g = GGUF_GEMMA3_270M
    # the 27B's query_pre_attn_scalar is dim / n_heads (168), not head_dim (128)
    c = ModelConfig.from_gguf({**g, "gemma3.block_count": 62, "gemma3.embedding_length": 5376,
                               "gemma3.attention.head_count": 32, "gemma3.attention.key_length": 128,
                               "gemma3.attention.value_length": 128}, [])
    assert c.query_scale == pytest.approx(168 ** -0.5)
    # 4B and up: linear RoPE scaling of the global layers, a soft-cap, a pattern given as flags
    c = ModelConfig.from_gguf({**g, "gemma3.rope.scaling.type": "linear", "gemma3.rope.scaling.factor": 8.0,
                               "gemma3.final_logit_softcapping": 30.0, "gemma3.rope.freq_base_swa": 20000.0,
                               "gemma3.attention.sliding_window_pattern": [True, False] * 9}, [])
    assert (c.rope_linear_factor, c.logit_softcap, c.rope_theta_local) == (8.0, 30.0, 20000.0)
    assert c.local_layers == tuple(range(0, 18, 2))
    assert ModelConfig.from_gguf({**g, "gemma3.attention.sliding_window_pattern": 3}, []).local_layers == \
        tuple(i for i in range(18) if i % 3 != 2)
    # no window: every layer global
    no_window = {k: v for k, v in g.items() if k != "gemma3.attention.sliding_window"}
    assert ModelConfig.from_gguf(no_window, []).local_layers == ()
    with pytest.raises(ValueError, match="3 entries for 18 layers"):
        ModelConfig.from_gguf({**g, "gemma3.attention.sliding_window_pattern": [True] * 3}, [])


def test_from_gguf_qwen3():
    qwen3 = {k.replace("llama.", "qwen3."): v for k, v in GGUF_SMOLLM2.items()}
    qwen3.update({"general.architecture": "qwen3", "qwen3.attention.key_length": 128,
                  "qwen3.attention.value_length": 128, "qwen3.rope.dimension_count": 128})
    c = ModelConfig.from_gguf(qwen3, ["output.weight"])
    assert (c.arch, c.qk_norm, c.qkv_bias, c.rope_neox, c.head_dim, c.sandwich_norms, c.ffn_act) == \
        ("qwen3", True, False, True, 128, False, "silu")
    assert expected_shapes(c)["blk.0.attn_k_norm.weight"] == (1, 128)


@pytest.mark.parametrize("change,message", [
    ({"general.architecture": "phi3"}, "unsupported architecture 'phi3'"),
    ({"llama.rope.dimension_count": 32}, "partial rotary embeddings"),
    ({"llama.rope.scaling.type": "longrope"}, "rope scaling type 'longrope' is not supported"),
    ({"llama.rope.scaling.type": "yarn", "llama.rope.scaling.factor": 4.0}, "YaRN rope scaling values"),
    ({"llama.rope.scaling.type": "yarn", "llama.rope.scaling.factor": 4.0,
      "llama.rope.scaling.original_context_length": 4096, "llama.rope.scaling.yarn_log_multiplier": 0.1},
     "yarn_log_multiplier"),
    ({"llama.attention.head_count_kv": [3, 3]}, "llama.attention.head_count_kv varies per layer"),
    ({"llama.block_count": None}, "must be a positive integer"),
])
def test_from_gguf_refusals(change, message):
    meta = {k: v for k, v in {**GGUF_SMOLLM2, **change}.items() if v is not None}
    with pytest.raises(ValueError) as e:
        ModelConfig.from_gguf(meta, [])
    assert message in str(e.value) or "missing metadata key llama.block_count" in str(e.value)


def test_from_gguf_reads_yarn_as_llama_cpp():
    """rope.scaling.type yarn: its factor and original context; ext factor 1 unless the file sets one (a negative one
    is unset), betas 32 and 1, attn_factor 1; the factor is then not a linear one."""
    meta = {**GGUF_SMOLLM2, "llama.rope.scaling.type": "yarn", "llama.rope.scaling.factor": 32.0,
            "llama.rope.scaling.original_context_length": 4096}
    c = ModelConfig.from_gguf(meta, [])
    assert c.yarn == {"factor": 32.0, "original_context": 4096, "ext_factor": 1.0, "attn_factor": 1.0,
                      "beta_fast": 32.0, "beta_slow": 1.0}
    assert c.rope_linear_factor == 1.0 and "YaRN rope scaling" in c.switches()
    meta.update({"llama.rope.scaling.yarn_ext_factor": 0.5, "llama.rope.scaling.yarn_beta_fast": 16.0,
                 "llama.rope.scaling.attn_factor": 0.9})
    c = ModelConfig.from_gguf(meta, [])
    assert (c.yarn["ext_factor"], c.yarn["beta_fast"], c.yarn["attn_factor"]) == (0.5, 16.0, 0.9)


def test_llama3_freq_factors_known_values():
    s = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    f = llama3_freq_factors(128, 500000.0, s)
    assert f.shape == (64,) and f[0] == 1.0 and f[-1] == 8.0
    # a frequency in the smooth band, computed by hand from the formula
    i = 30
    inv = 500000.0 ** (-2 * i / 128)
    smooth = (8192 / (2 * math.pi / inv) - 1.0) / (4.0 - 1.0)
    assert 0 < smooth < 1
    assert f[i] == pytest.approx(1 / ((1 - smooth) / 8.0 + smooth))
    assert np.count_nonzero(f == 1.0) + np.count_nonzero(f == 8.0) + np.count_nonzero((f > 1) & (f < 8)) == 64


def test_llama3_parameters_recovered_from_factors():
    s = {"factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    f = llama3_freq_factors(64, 500000.0, s).astype(np.float32)
    got = llama3_from_factors(f.astype(np.float64), 64, 500000.0, 8192)
    assert got["factor"] == 32.0 and got["original_max_position_embeddings"] == 8192
    assert got["low_freq_factor"] == pytest.approx(1.0, rel=1e-3)
    assert got["high_freq_factor"] == pytest.approx(4.0, rel=1e-3)
    assert llama3_from_factors(np.ones(32), 64, 500000.0) is None
    with pytest.raises(ValueError, match="does not follow llama3 rope scaling"):
        llama3_from_factors(np.linspace(1, 3, 32)[::-1].copy(), 64, 500000.0)
    with pytest.raises(ValueError, match="has 31 values, expected head_dim/2 = 32"):
        llama3_from_factors(np.ones(31), 64, 500000.0)


def test_expected_shapes_and_check_tensors():
    c = ModelConfig.from_hf(QWEN25_05B)
    shapes = expected_shapes(c)
    assert len(shapes) == 2 + 24 * 12  # tied: no output.weight; 9 weights + 3 biases per layer
    assert shapes["blk.3.attn_k.bias"] == (1, 128) and shapes["blk.0.ffn_down.weight"] == (896, 4864)
    assert shapes["token_embd.weight"] == (151936, 896)
    check_tensors(c, shapes)
    with pytest.raises(ValueError, match=r"missing tensors output_norm.weight, blk.0.attn_norm.weight, "
                                         r"blk.0.attn_q.weight \(and 286 more\)"):
        check_tensors(c, {"token_embd.weight": (151936, 896)})
    with pytest.raises(ValueError, match="unexpected tensor blk.0.attn_output.bias"):
        check_tensors(c, {**shapes, "blk.0.attn_output.bias": (1, 896)})
    with pytest.raises(ValueError, match=r"tensor blk.2.ffn_up.weight has shape \(rows, cols\) \(4864, 895\)"):
        check_tensors(c, {**shapes, "blk.2.ffn_up.weight": (4864, 895)})


def moe_metadata(arch: str, **extra) -> dict:
    meta = {k.replace("llama.", f"{arch}."): v for k, v in GGUF_SMOLLM2.items()}
    meta.update({"general.architecture": arch, f"{arch}.expert_count": 128, f"{arch}.expert_used_count": 8,
                 f"{arch}.feed_forward_length": 6144})
    meta.update({f"{arch}.{k}": v for k, v in extra.items()})
    return meta


def test_from_gguf_mixtures_of_experts():
    """Qwen3-30B-A3B's keys: 128 experts of 768, 8 used, renormalized; its dense feed_forward_length is unused."""
    c = ModelConfig.from_gguf(moe_metadata("qwen3moe", expert_feed_forward_length=768), ["output.weight"])
    assert (c.n_experts, c.n_experts_used, c.expert_hidden_dim, c.shared_expert_hidden_dim) == (128, 8, 768, 0)
    assert c.expert_norm_topk and c.qk_norm and not c.qk_norm_full and c.expert_weights_scale == 1.0
    shapes = expected_shapes(c)
    assert shapes["blk.0.ffn_gate_exps.weight"] == (128, 768, c.dim)
    assert shapes["blk.0.ffn_down_exps.weight"] == (128, c.dim, 768)
    assert shapes["blk.0.ffn_gate_inp.weight"] == (128, c.dim) and "blk.0.ffn_gate.weight" not in shapes
    # Qwen2-MoE: a shared expert; without the expert widths llama.cpp's defaults (6144 / 8 and 6144)
    c = ModelConfig.from_gguf(moe_metadata("qwen2moe"), ["output.weight"])
    assert (c.expert_hidden_dim, c.shared_expert_hidden_dim, c.expert_norm_topk, c.qkv_bias) == (768, 6144, False,
                                                                                                 True)
    assert expected_shapes(c)["blk.1.ffn_gate_inp_shexp.weight"] == (1, c.dim)
    # OLMoE: QK-norm over all of q and of k, weights as the softmax gives them
    c = ModelConfig.from_gguf(moe_metadata("olmoe", feed_forward_length=1024), ["output.weight"])
    assert (c.expert_hidden_dim, c.expert_norm_topk, c.qk_norm_full) == (1024, False, True)
    assert expected_shapes(c)["blk.0.attn_q_norm.weight"] == (1, c.q_dim)
    # Mixtral: a llama file with experts; a scale of the router weights when the file has one
    c = ModelConfig.from_gguf(moe_metadata("llama", expert_count=8, expert_used_count=2, feed_forward_length=14336,
                                           expert_weights_scale=2.5), [])
    assert (c.n_experts, c.expert_hidden_dim, c.expert_norm_topk, c.expert_weights_scale) == (8, 14336, True, 2.5)
    assert c.switches() == ["experts"]


@pytest.mark.parametrize("meta,message", [
    ({**moe_metadata("qwen3moe"), "qwen3moe.expert_count": 0}, "qwen3moe files need qwen3moe.expert_count"),
    ({k: v for k, v in moe_metadata("olmoe").items() if k != "olmoe.expert_used_count"},
     "olmoe.expert_used_count is missing or 0 for 128 experts"),
    ({**moe_metadata("qwen3moe"), "qwen3moe.expert_used_count": 200}, "expert_used_count 200 must be 1 to 32"),
    ({**moe_metadata("qwen3moe"), "qwen3moe.expert_count": 512}, "expert_count 512 is not supported (1 to 256)"),
    (moe_metadata("qwen3moe", expert_feed_forward_length=100), "expert_hidden_dim 100 is not a positive multiple"),
])
def test_from_gguf_expert_refusals(meta, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        ModelConfig.from_gguf(meta, [])
