"""Hugging Face folders: every tiny variant loads with the right names, types and values; tokenizer files and chat
templates are read; quantize-on-load; corrupt safetensors and folders give a ModelLoadError naming file and problem."""
from __future__ import annotations

import importlib.util
import json
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest

from inferd.model.errors import ModelLoadError
from inferd.model.hf import gguf_name, hf_name, read_safetensors_header
from inferd.model.loader import load_model
from tests.model.make_tiny import (CHATML, LLAMA2_TEMPLATE, TinySpec, make_variant, permute_for_gguf, tiny_weights,
                                   to_bf16_bits, variant_spec, write_safetensors, write_tiny_hf)
from tests.model.quant_ref import quantize_reference

HAVE_CPU = importlib.util.find_spec("inferd._cpu") is not None


def test_name_mapping_both_ways():
    assert gguf_name("model.layers.12.self_attn.q_proj.bias") == "blk.12.attn_q.bias"
    assert gguf_name("model.layers.0.mlp.down_proj.weight") == "blk.0.ffn_down.weight"
    assert gguf_name("lm_head.weight") == "output.weight"
    assert gguf_name("model.layers.0.mlp.experts.0.w1.weight") is None
    assert hf_name("blk.3.ffn_norm.weight") == "model.layers.3.post_attention_layernorm.weight"
    assert hf_name("token_embd.weight") == "model.embed_tokens.weight"


@pytest.mark.parametrize("name,types", [
    ("llama-hf-bf16", {"BF16", "F32"}), ("llama-hf-f16", {"F16", "F32"}), ("llama-hf-f32", {"F32"}),
    ("llama-hf-bf16-sharded", {"BF16", "F32"}), ("qwen2-hf-bf16", {"BF16", "F32"}),
    ("llama3rope-hf-bf16", {"BF16", "F32"}), ("mistral-hf-hd128", {"BF16", "F32"}),
    ("llama-hf-awkward", {"F16", "F32"}), ("llama-spm-hf-f32", {"F32"}),
])
def test_variants_load(tiny_dir, name, types):
    spec = variant_spec(name)
    m = load_model(make_variant(name, tiny_dir))
    c = m.config
    assert {t.type for t in m.tensors.values()} == types
    assert (c.arch, c.vocab_size, c.dim, c.n_layers, c.n_heads, c.n_kv_heads, c.head_dim, c.hidden_dim) == \
        (spec.arch, spec.vocab_size, spec.dim, spec.n_layers, spec.n_heads, spec.n_kv_heads, spec.head_dim,
         spec.hidden_dim)
    assert c.rope_neox and c.tie_embeddings == spec.tie_embeddings and c.qkv_bias == (spec.arch == "qwen2")
    assert c.rope_scaling == spec.rope_scaling
    assert ("output.weight" in m.tensors) == (not spec.tie_embeddings)
    assert m.model_name == name
    assert m.tokenizer.vocab_size == spec.vocab_size


def test_values_and_layouts(tiny_dir):
    w = tiny_weights(variant_spec("llama-hf-bf16"))
    bf = load_model(make_variant("llama-hf-bf16", tiny_dir)).tensors
    t = bf["blk.1.attn_output.weight"]
    assert (t.type, t.rows, t.cols, t.data.dtype) == ("BF16", 128, 128, np.uint16)
    np.testing.assert_array_equal(t.data, to_bf16_bits(w["blk.1.attn_output.weight"]))
    assert not t.data.flags.owndata  # a view over the mmap
    norm = bf["blk.0.ffn_norm.weight"]  # vectors become exact f32 copies of the bf16 values
    assert (norm.type, norm.data.shape) == ("F32", (1, 128))
    np.testing.assert_array_equal(to_bf16_bits(norm.data[0]), to_bf16_bits(w["blk.0.ffn_norm.weight"]))
    f16 = load_model(make_variant("llama-hf-f16", tiny_dir)).tensors["token_embd.weight"]
    np.testing.assert_array_equal(f16.data.view(np.float16), w["token_embd.weight"].astype(np.float16))
    q = load_model(make_variant("qwen2-hf-bf16", tiny_dir)).tensors
    wq = tiny_weights(variant_spec("qwen2-hf-bf16"))
    assert q["blk.1.attn_k.bias"].type == "F32" and q["blk.1.attn_k.bias"].data.shape == (1, 128)
    np.testing.assert_array_equal(to_bf16_bits(q["blk.1.attn_k.bias"].data[0]), to_bf16_bits(wq["blk.1.attn_k.bias"]))


def test_reader_agrees_with_the_safetensors_library(tmp_path):
    from safetensors.numpy import load_file, save_file

    rng = np.random.default_rng(0)
    arrays = {"a": rng.standard_normal((3, 32)).astype(np.float32), "b": rng.standard_normal(7).astype(np.float16),
              "c": np.zeros((0, 4), np.float32)}
    save_file(arrays, tmp_path / "x.safetensors", metadata={"format": "np"})
    header = read_safetensors_header(tmp_path / "x.safetensors")
    raw = (tmp_path / "x.safetensors").read_bytes()
    for name, arr in load_file(tmp_path / "x.safetensors").items():
        e = header[name]
        assert (e.dtype, e.shape) == ({"float32": "F32", "float16": "F16"}[arr.dtype.name], arr.shape)
        assert raw[e.start:e.end] == arr.tobytes()


def test_model_name_of_a_hub_snapshot(tmp_path):
    snap = tmp_path / "models--Org--Tiny-Model" / "snapshots" / "0123abcd"
    write_tiny_hf(snap, TinySpec(n_layers=1), "f32")
    assert load_model(snap).model_name == "Org/Tiny-Model"


def test_hf_and_gguf_of_one_spec_hold_the_same_model(tiny_dir):
    hf = load_model(make_variant("llama-hf-f32", tiny_dir))
    gg = load_model(make_variant("llama-gguf-f32", tiny_dir))
    assert hf.tensors.keys() == gg.tensors.keys()
    spec = variant_spec("llama-hf-f32")
    for name, t in hf.tensors.items():
        expected = t.data
        if name.endswith("attn_q.weight"):
            expected = permute_for_gguf(t.data, spec.n_heads)
        elif name.endswith("attn_k.weight"):
            expected = permute_for_gguf(t.data, spec.n_kv_heads)
        np.testing.assert_array_equal(gg.tensors[name].data, expected, err_msg=name)
    assert hf.config.rope_neox and not gg.config.rope_neox
    text = "the people said 42 things, café!"
    assert hf.tokenizer.encode(text) == gg.tokenizer.encode(text)


def test_tokenizer_files_and_chat_template(tiny_dir):
    m = load_model(make_variant("llama-hf-bf16", tiny_dir))
    tok = m.tokenizer
    assert (tok.bos_id, tok.eos_id, tok.add_bos) == (1, 2, False)
    assert tok.eos_ids == {0, 2}  # generation_config.json lists both
    assert m.chat_template == CHATML
    assert tok.encode("<|im_start|>user")[0] == 1
    spm = load_model(make_variant("llama-spm-hf-f32", tiny_dir))
    assert spm.tokenizer.add_bos and spm.tokenizer.encode("hi")[0] == 1
    assert spm.chat_template == LLAMA2_TEMPLATE
    assert spm.tokenizer.decode(spm.tokenizer.encode("the people said")) == "the people said"


def test_chat_template_from_other_files(tmp_path):
    folder = write_tiny_hf(tmp_path / "m", TinySpec(n_layers=1), "f32", chat_template=None)
    assert load_model(folder).chat_template is None
    (folder / "chat_template.jinja").write_text("{{ messages[0]['content'] }}")
    assert load_model(folder).chat_template == "{{ messages[0]['content'] }}"
    tcfg = json.loads((folder / "tokenizer_config.json").read_text())
    tcfg["chat_template"] = [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]
    (folder / "tokenizer_config.json").write_text(json.dumps(tcfg))
    assert load_model(folder).chat_template == "D"


@pytest.mark.skipif(not HAVE_CPU, reason="inferd._cpu is not built (it quantizes on load)")
def test_quantize_on_load(tiny_dir):
    path = make_variant("llama-hf-bf16-sharded", tiny_dir)
    w = load_model(path).tensors
    q8 = load_model(path, quantize="q8_0").tensors
    q4 = load_model(path, quantize="q4_0").tensors
    assert {n: t.type for n, t in q8.items() if t.rows > 1} == {n: "Q8_0" for n, t in w.items() if t.rows > 1}
    assert q4["token_embd.weight"].type == q4["output.weight"].type == "Q8_0"
    assert q4["blk.0.ffn_up.weight"].type == "Q4_0" and q4["blk.0.ffn_norm.weight"].type == "F32"
    src = (w["blk.1.ffn_down.weight"].data.astype(np.uint32) << 16).view(np.float32)
    np.testing.assert_array_equal(q4["blk.1.ffn_down.weight"].data, quantize_reference(src, "Q4_0"))
    np.testing.assert_array_equal(q8["blk.1.ffn_down.weight"].data, quantize_reference(src, "Q8_0"))
    with pytest.raises(ModelLoadError, match="quantize must be one of q8_0, q4_0"):
        load_model(path, quantize="int3")


# ---- corrupt files -------------------------------------------------------------------------------------------
def _expect(path: Path, message: str, file: Path | None = None) -> None:
    with pytest.raises(ModelLoadError) as e:
        load_model(path)
    assert str(file or path) in str(e.value) and message in str(e.value), str(e.value)


@pytest.fixture
def folder(tmp_path) -> Path:
    return write_tiny_hf(tmp_path / "model", TinySpec(n_layers=1), "f32")


def _rewrite_header(file: Path, change) -> None:
    raw = file.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    change(header)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    file.write_bytes(struct.pack("<Q", len(text)) + text + raw[8 + n:])


def test_safetensors_header_problems(folder):
    st = folder / "model.safetensors"
    good = st.read_bytes()
    name = "model.layers.0.mlp.up_proj.weight"

    st.write_bytes(struct.pack("<Q", 1 << 40) + good[8:])
    _expect(folder, f"header length {1 << 40} is impossible for a file of {len(good)} bytes", st)
    st.write_bytes(good[:5])
    _expect(folder, "file is too short to be safetensors (5 bytes)", st)
    st.write_bytes(struct.pack("<Q", 6) + b"{oops}" + good[14:])
    _expect(folder, "header is not valid JSON", st)

    cases = [
        (lambda h: h[name].update(data_offsets=[0, 1 << 30]), f"tensor {name} data_offsets [0, 1073741824) fall "
                                                             f"outside the data section"),
        (lambda h: h[name].update(shape=[192, 127]), f"tensor {name}: F32 [192, 127] needs 97536 bytes but "
                                                     f"data_offsets span 98304"),
        (lambda h: h[name].update(dtype="Q4"), f"tensor {name} has unknown dtype 'Q4'"),
        (lambda h: h[name].update(shape=[-1, 128]), f"tensor {name} has an invalid shape [-1, 128]"),
        (lambda h: h[name].update(data_offsets=[5]), f"tensor {name} has invalid data_offsets [5]"),
        (lambda h: h[name].update(dtype="I32"), f"tensor {name} has dtype I32, which is not supported"),
        (lambda h: h.update({"model.layers.0.mlp.up_proj.weight": h["model.layers.0.mlp.gate_proj.weight"]}),
         "overlap"),
    ]
    for change, message in cases:
        st.write_bytes(good)
        _rewrite_header(st, change)
        _expect(folder, message, st)


def test_folder_problems(folder, tmp_path):
    st = folder / "model.safetensors"
    # a tensor too few, one too many, one the wrong shape: named with HF names
    arrays = {}
    for n, e in read_safetensors_header(st).items():
        raw = np.frombuffer(st.read_bytes(), dtype=np.float32, count=(e.end - e.start) // 4, offset=e.start)
        arrays[n] = ("F32", raw.reshape(e.shape))
    keep = dict(arrays)
    del keep["model.layers.0.mlp.up_proj.weight"]
    write_safetensors(st, keep)
    _expect(folder, "missing tensor model.layers.0.mlp.up_proj.weight")
    write_safetensors(st, {**arrays, "model.layers.0.self_attn.rotary_emb.inv_freq": ("F32", np.ones(32, np.float32)),
                           "model.layers.0.mlp.experts.weight": ("F32", np.ones(32, np.float32))})
    _expect(folder, "unexpected tensor model.layers.0.mlp.experts.weight", st)
    write_safetensors(st, {**arrays, "model.norm.weight": ("F32", np.ones(96, np.float32))})
    _expect(folder, "tensor model.norm.weight has shape (rows, cols) (1, 96), the config implies (1, 128)")
    write_safetensors(st, arrays)
    assert load_model(folder).config.n_layers == 1  # and back to a good folder

    second = folder / "extra.safetensors"
    shutil.copy(st, second)
    _expect(folder, "2 .safetensors files but no model.safetensors.index.json")
    second.unlink()

    (folder / "tokenizer.json").rename(folder / "tok.bak")
    _expect(folder, "no tokenizer.json")
    (folder / "tok.bak").rename(folder / "tokenizer.json")

    cfg = folder / "config.json"
    good_cfg = cfg.read_text()
    cfg.write_text("{not json")
    _expect(folder, "not valid JSON", cfg)
    cfg.write_text(good_cfg.replace("LlamaForCausalLM", "FalconForCausalLM"))
    _expect(folder, "unsupported architectures ['FalconForCausalLM']", cfg)
    cfg.unlink()
    _expect(folder, "folder has no config.json and not exactly one .gguf file")

    _expect(st, "a lone .safetensors file is not a model")


def test_sharded_folder_problems(tmp_path):
    folder = write_tiny_hf(tmp_path / "sharded", TinySpec(n_layers=1), "bf16", shards=3)
    assert len(list(folder.glob("*.safetensors"))) == 3
    assert load_model(folder).config.n_layers == 1
    index = folder / "model.safetensors.index.json"
    good = index.read_text()
    (folder / "model-00002-of-00003.safetensors").rename(folder / "moved")
    _expect(folder, "shard model-00002-of-00003.safetensors is missing", index)
    (folder / "moved").rename(folder / "model-00002-of-00003.safetensors")
    data = json.loads(good)
    data["weight_map"]["model.norm.weight"] = "../elsewhere.safetensors"
    index.write_text(json.dumps(data))
    _expect(folder, "weight_map names a file outside the folder: '../elsewhere.safetensors'", index)
    index.write_text(json.dumps({"weight_map": {}}))
    _expect(folder, "weight_map is missing or empty", index)
    # the same tensor in two shards
    index.write_text(good)
    one, two = folder / "model-00001-of-00003.safetensors", folder / "model-00002-of-00003.safetensors"
    header_one = read_safetensors_header(one)
    name = next(iter(header_one))
    e = header_one[name]
    raw = np.frombuffer(one.read_bytes(), dtype=np.uint16, count=(e.end - e.start) // 2, offset=e.start)
    arrays = {}
    for n, f in read_safetensors_header(two).items():
        arrays[n] = ("BF16", np.frombuffer(two.read_bytes(), dtype=np.uint16, count=(f.end - f.start) // 2,
                                           offset=f.start).reshape(f.shape))
    write_safetensors(two, {**arrays, name: ("BF16", raw.reshape(e.shape))})
    _expect(folder, f"tensor {name} also appears in model-00001-of-00003.safetensors", two)
