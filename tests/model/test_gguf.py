"""GGUF loading: the real SmolLM2 file, every tiny GGUF variant, and corrupt files (each must give a
ModelLoadError naming the file and the problem, quickly, without allocating what the file merely claims)."""
from __future__ import annotations

import struct
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFWriter
from gguf import quants as gguf_quants

from inferd.model.errors import ModelLoadError
from inferd.model.gguf import load_gguf, read_architecture, validate_gguf
from inferd.model.loader import load_model
from tests.model.make_tiny import (TinySpec, make_variant, permute_for_gguf, tiny_weights, variant_spec,
                                   write_tiny_gguf)


# ---- the real model ------------------------------------------------------------------------------------------
def test_smollm2_loads_with_expected_config_and_tensors(smollm2_path):
    m = load_gguf(smollm2_path)
    c = m.config
    assert (c.arch, c.vocab_size, c.dim, c.n_layers, c.n_heads, c.n_kv_heads, c.head_dim, c.hidden_dim) == \
        ("llama", 49152, 576, 30, 9, 3, 64, 1536)
    assert (c.rope_theta, c.rope_scaling, c.rope_neox, c.tie_embeddings, c.qkv_bias, c.context_length) == \
        (100000.0, None, False, True, False, 8192)
    assert c.norm_eps == pytest.approx(1e-5)
    assert m.version == 3 and m.metadata["tokenizer.ggml.pre"] == "smollm"
    assert len(m.tensors) == 2 + 30 * 9 and "output.weight" not in m.tensors
    embd, q, norm = m.tensors["token_embd.weight"], m.tensors["blk.0.attn_q.weight"], m.tensors["output_norm.weight"]
    assert (embd.type, embd.rows, embd.cols, embd.data.shape, embd.data.dtype) == ("Q8_0", 49152, 576, (49152, 612),
                                                                                  np.uint8)
    assert (q.type, q.rows, q.cols, q.data.shape) == ("Q4_1", 576, 576, (576, 360))
    assert (m.tensors["blk.0.attn_k.weight"].rows, m.tensors["blk.0.ffn_down.weight"].cols) == (192, 1536)
    assert (norm.type, norm.data.shape, norm.data.dtype) == ("F32", (1, 576), np.float32)
    # values read straight from the file (recorded once with gguf's GGUFReader)
    assert m.tensors["blk.0.attn_norm.weight"].data[0, :4].tolist() == \
        [0.01397705078125, 0.0238037109375, -0.019775390625, -0.0302734375]
    assert norm.data[0, :4].tolist() == [1.7578125, 1.8203125, 1.78125, 1.6015625]
    assert embd.data[0, :6].tolist() == [50, 25, 214, 13, 19, 247]
    assert q.data[0, :6].tolist() == [15, 48, 216, 185, 69, 135]


def test_smollm2_load_model_passes_native_types_through_as_views(smollm2_model):
    m = smollm2_model
    assert m.model_name == "SmolLM2-135M-Instruct.Q4_1"
    assert {t.type for t in m.tensors.values()} == {"Q8_0", "Q4_1", "F32"}
    assert not m.tensors["blk.3.ffn_up.weight"].data.flags.owndata  # an mmap view, not a copy
    assert m.chat_template.startswith("{% for message in messages %}")
    assert m.tokenizer.encode("Hello world") == [19556, 905]


# ---- tiny variants ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name,types", [
    ("llama-gguf-f32", {"F32"}), ("llama-gguf-f16", {"F16", "F32"}), ("llama-gguf-q8_0", {"Q8_0", "F32"}),
    ("llama-gguf-q4_0", {"Q4_0", "F32"}), ("llama-gguf-q4_1", {"Q4_1", "F32"}),
    ("qwen2-gguf-q8_0", {"Q8_0", "F32"}), ("llama-spm-gguf-q8_0", {"Q8_0", "F32"}),
    ("llama-gguf-bf16", {"BF16", "F32"}), ("llama-gguf-q5_0", {"Q5_0", "F32"}),
    ("llama-gguf-q4_k", {"Q4_K", "Q8_0", "F32"}), ("llama-gguf-q6_k", {"Q6_K", "Q8_0", "F32"}),
])
def test_tiny_variants_load_with_file_types(tiny_dir, name, types):
    m = load_gguf(make_variant(name, tiny_dir))
    spec = variant_spec(name)
    assert {t.type for t in m.tensors.values()} == types
    assert (m.config.dim, m.config.n_layers, m.config.vocab_size) == (spec.dim, spec.n_layers, spec.vocab_size)
    assert m.config.tie_embeddings == spec.tie_embeddings
    assert m.config.qkv_bias == (spec.arch == "qwen2") and m.config.rope_neox == (spec.arch == "qwen2")


def test_tiny_values_round_trip_exactly(tiny_dir):
    spec = variant_spec("llama-gguf-f32")
    w = tiny_weights(spec)
    f32 = load_gguf(make_variant("llama-gguf-f32", tiny_dir)).tensors
    np.testing.assert_array_equal(f32["blk.1.ffn_down.weight"].data, w["blk.1.ffn_down.weight"])
    np.testing.assert_array_equal(f32["output_norm.weight"].data[0], w["output_norm.weight"])
    # llama GGUFs hold Wq/Wk permuted the way llama.cpp's converter does it
    np.testing.assert_array_equal(f32["blk.0.attn_q.weight"].data,
                                  permute_for_gguf(w["blk.0.attn_q.weight"], spec.n_heads))
    np.testing.assert_array_equal(f32["blk.0.attn_k.weight"].data,
                                  permute_for_gguf(w["blk.0.attn_k.weight"], spec.n_kv_heads))
    f16 = load_gguf(make_variant("llama-gguf-f16", tiny_dir)).tensors["blk.0.ffn_up.weight"]
    assert f16.data.dtype == np.uint16
    np.testing.assert_array_equal(f16.data.view(np.float16), w["blk.0.ffn_up.weight"].astype(np.float16))
    q8 = load_gguf(make_variant("llama-gguf-q8_0", tiny_dir)).tensors["blk.0.ffn_gate.weight"]
    np.testing.assert_array_equal(q8.data, gguf_quants.quantize(w["blk.0.ffn_gate.weight"],
                                                                GGMLQuantizationType.Q8_0))


@pytest.mark.parametrize("name", ["llama-gguf-q4_k", "llama-gguf-q6_k", "llama-gguf-q5_0"])
def test_native_quant_variants_load_untouched(tiny_dir, name):
    """K-quants and Q5_0 are computed in their own types: load_model hands over the file's bytes as they are."""
    path = make_variant(name, tiny_dir)
    raw = load_gguf(path).tensors
    m = load_model(path)
    for key, t in m.tensors.items():
        if t.rows > 1:
            assert t.type == raw[key].type
            np.testing.assert_array_equal(t.data, raw[key].data)


@pytest.mark.parametrize("weight_type", ["IQ3_S", "IQ3_XXS", "IQ2_S", "IQ2_XS", "IQ2_XXS", "IQ1_M", "IQ1_S", "TQ2_0",
                                         "TQ1_0"])
def test_codebook_and_ternary_files_load_in_their_types(tmp_path, weight_type):
    """A tiny GGUF file of each codebook and ternary type: its matrices reach the engine as views of the file in
    their type, and the engine's weights built from them dequantize to gguf's values exactly."""
    from inferd import _cpu

    path = write_tiny_gguf(tmp_path / "t.gguf", TinySpec(n_layers=1, dim=256, hidden_dim=512, head_dim=64,
                                                         n_heads=4, n_kv_heads=2), weight_type)
    model = load_model(path)
    layer = {n: t for n, t in model.tensors.items() if n.startswith("blk.") and t.rows > 1}
    assert {t.type for t in layer.values()} == {weight_type}
    for t in layer.values():
        assert not t.data.flags.owndata                                  # a view of the mapped file
        want = gguf_quants.dequantize(np.asarray(t.data), GGMLQuantizationType[weight_type]).reshape(t.rows, t.cols)
        np.testing.assert_array_equal(_cpu.Weight(t.type, t.rows, t.cols, t.data).dequantize(), want)


def test_permutation_matches_llama_cpp_pairing():
    # after the permutation, adjacent rows (2i, 2i+1) of a head hold HF's rotate-half rows (i, i + head_dim/2)
    w = np.arange(8 * 3, dtype=np.float32).reshape(8, 3)  # 2 heads of head_dim 4
    p = permute_for_gguf(w, 2)
    assert p[:, 0].tolist() == [0, 6, 3, 9, 12, 18, 15, 21]


def test_llama3_rope_freqs_tensor_becomes_rope_scaling(tiny_dir):
    m = load_gguf(make_variant("llama3rope-gguf-f32", tiny_dir))
    s = m.config.rope_scaling
    assert "rope_freqs.weight" not in m.tensors
    assert s["factor"] == pytest.approx(8.0) and s["original_max_position_embeddings"] == 8192
    # only orig/low and orig/high matter: the recovered ratios equal the written ones (64/1 and 64/4)
    assert s["original_max_position_embeddings"] / s["low_freq_factor"] == pytest.approx(64.0, rel=1e-3)
    assert s["original_max_position_embeddings"] / s["high_freq_factor"] == pytest.approx(16.0, rel=1e-3)


def test_load_model_accepts_a_folder_with_one_gguf(tmp_path):
    path = write_tiny_gguf(tmp_path / "only.gguf", TinySpec(), "Q8_0")
    assert load_model(tmp_path).path == str(path)


def test_load_model_missing_path(tmp_path):
    with pytest.raises(ModelLoadError, match="no such file or folder") as e:
        load_model(tmp_path / "nope.gguf")
    assert str(tmp_path / "nope.gguf") in str(e.value)


# ---- corrupt files ---------------------------------------------------------------------------------------------
def _expect(path: Path, message: str) -> ModelLoadError:
    with pytest.raises(ModelLoadError) as e:
        load_model(path)
    assert str(path) in str(e.value) and message in str(e.value), str(e.value)
    return e.value


@pytest.fixture
def tiny(tmp_path) -> Path:
    return write_tiny_gguf(tmp_path / "tiny.gguf", TinySpec(n_layers=1), "Q8_0")


def test_truncated_file(tiny, tmp_path):
    data = tiny.read_bytes()
    bad = tmp_path / "truncated.gguf"
    bad.write_bytes(data[: len(data) - 1000])
    _expect(bad, "lies past the end of the file")
    bad.write_bytes(data[:200])  # cut inside the metadata
    _expect(bad, "file truncated or corrupt")
    bad.write_bytes(data[:10])
    _expect(bad, "too short to be GGUF")


def test_bad_magic_and_version(tiny, tmp_path):
    data = bytearray(tiny.read_bytes())
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGML" + data[4:])
    _expect(bad, "not a GGUF file (magic b'GGML'")
    data[4:8] = struct.pack("<I", 1)
    bad.write_bytes(bytes(data))
    _expect(bad, "unsupported GGUF version 1")
    data[4:8] = struct.pack(">I", 3)
    bad.write_bytes(bytes(data))
    _expect(bad, "big-endian GGUF files are not supported")


def _raw_gguf(path: Path, kv: list[bytes], tensors: list[bytes], n_tensors: int | None = None,
              n_kv: int | None = None, data: bytes = b"") -> Path:
    """Hand-assembled GGUF v3 (for corruptions GGUFWriter refuses to write)."""
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors) if n_tensors is None else n_tensors,
                                 len(kv) if n_kv is None else n_kv)
    body = head + b"".join(kv) + b"".join(tensors)
    body += b"\0" * (-len(body) % 32)
    path.write_bytes(body + data)
    return path


def _s(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<Q", len(raw)) + raw


def _kv_u32(key: str, value: int) -> bytes:
    return _s(key) + struct.pack("<II", 4, value)


def _tensor(name: str, dims: tuple[int, ...], type_id: int, offset: int) -> bytes:
    return _s(name) + struct.pack("<I", len(dims)) + struct.pack(f"<{len(dims)}Q", *dims) + \
        struct.pack("<IQ", type_id, offset)


def test_absurd_counts_and_lengths_fail_without_allocating(tmp_path):
    cases = [
        (_raw_gguf(tmp_path / "a.gguf", [], [], n_tensors=1 << 40), "claims 1099511627776 tensors"),
        (_raw_gguf(tmp_path / "b.gguf", [], [], n_kv=1 << 50), "metadata entries, more than the file (32 bytes)"),
        (_raw_gguf(tmp_path / "c.gguf", [struct.pack("<Q", 1 << 60) + b"key"], []), "metadata key #0"),
        (_raw_gguf(tmp_path / "d.gguf", [_s("big") + struct.pack("<IIQ", 9, 4, (1 << 24) - 1)], []),
         "needs 67108860 bytes"),
        (_raw_gguf(tmp_path / "e.gguf", [_s("big") + struct.pack("<IIQ", 9, 8, 1 << 23)], []),
         "(8388608 strings)"),
        (_raw_gguf(tmp_path / "f.gguf", [_s("big") + struct.pack("<IIQ", 9, 4, 1 << 40)], []),
         "claims 1099511627776 items"),
        (_raw_gguf(tmp_path / "g.gguf", [_s("s") + struct.pack("<IQ", 8, 1 << 62)], []), "metadata 's'"),
    ]
    for path, message in cases:
        tracemalloc.start()
        err = _expect(path, message)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert peak < 4 << 20, f"{path.name}: {peak} bytes allocated for {err}"


def _strings_kv(key: str, items: list[bytes], count: int | None = None) -> bytes:
    """A string array as written (each item a u64 length and its bytes), `count` as its length field."""
    return _s(key) + struct.pack("<IIQ", 9, 8, len(items) if count is None else count) + b"".join(items)


def test_string_arrays_are_read_whole_and_their_faults_named(tmp_path):
    ok = ["", "a", "Ġthe", "\u4f60\u597d", "x" * 300]
    header = validate_gguf(str(_raw_gguf(tmp_path / "ok.gguf", [_strings_kv("v", [_s(t) for t in ok])], [])))
    assert header.metadata["v"] == ok
    bad_utf8 = struct.pack("<Q", 2) + b"\xc3\x28"
    cases = [
        ([_s("a" * 16), _s("b" * 16)], 3, "length of metadata 'v'[2] at byte"),  # the file ends after two
        ([_s("a"), struct.pack("<Q", 1000) + b"abc"], 2, "metadata 'v'[1] at byte"),
        ([_s("a"), _s("b"), bad_utf8], 3, "metadata 'v'[2] is not valid UTF-8"),
    ]
    for i, (items, count, message) in enumerate(cases):
        path = tmp_path / f"bad{i}.gguf"
        path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + _strings_kv("v", items, count))
        _expect(path, message)
    numbers = _s("tokenizer.ggml.tokens") + struct.pack("<IIQ3I", 9, 4, 3, 1, 2, 3)  # u32 items
    _expect(_raw_gguf(tmp_path / "ints.gguf", [numbers], []), "tokenizer.ggml.tokens is not a list of strings")


@pytest.mark.parametrize("tensor,message", [
    (_tensor("w", (32, 4), 0, 1 << 20), "tensor w data [1048672, 1049184) lies past the end of the file (608 bytes)"),
    (_tensor("w", (32, 4), 0, 3), "offset 3 is not aligned to 32"),
    (_tensor("w", (32, 4), 99, 0), "tensor w has unknown type id 99"),
    (_tensor("w", (30, 4), 8, 0), "row length 30 is not a multiple of the Q8_0 block size 32"),
    (_tensor("w", (32, 0), 0, 0), "has an empty dimension"),
    (_tensor("w", (2,) * 5, 0, 0), "has 5 dimensions"),
    (_tensor("w", (1 << 40, 1 << 20), 0, 0), "more than the whole file"),
], ids=["past-eof", "misaligned", "unknown-type", "partial-block", "empty-dim", "5-dims", "huge"])
def test_bad_tensor_infos(tmp_path, tensor, message):
    _expect(_raw_gguf(tmp_path / "t.gguf", [], [tensor], data=b"\0" * 512), message)


def test_duplicate_and_overlapping_tensors(tmp_path):
    t = _tensor("w", (32,), 0, 0)
    _expect(_raw_gguf(tmp_path / "d.gguf", [], [t, t], data=b"\0" * 256), "duplicate tensor name 'w'")
    u = _tensor("u", (32,), 0, 64)
    v = _tensor("v", (64,), 0, 0)
    _expect(_raw_gguf(tmp_path / "o.gguf", [], [u, v], data=b"\0" * 512), "tensors v and u overlap")
    _expect(_raw_gguf(tmp_path / "k.gguf", [_kv_u32("a", 1), _kv_u32("a", 2)], []), "duplicate metadata key 'a'")
    _expect(_raw_gguf(tmp_path / "al.gguf", [_kv_u32("general.alignment", 24)], []), "not a power of two")


def _rewrite(src: Path, dst: Path, drop: str | None = None, replace: dict | None = None,
             extra: dict | None = None) -> Path:
    """Copy a GGUF through GGUFReader/GGUFWriter, dropping/replacing/adding tensors."""
    from gguf import GGUFReader, GGUFValueType

    r = GGUFReader(str(src))
    w = GGUFWriter(str(dst), r.fields["general.architecture"].contents())
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        value = f.contents()
        if f.types[0] == GGUFValueType.ARRAY:
            w.add_key_value(name, value, f.types[0], sub_type=f.types[-1])
        else:
            w.add_key_value(name, value, f.types[0])
    for t in r.tensors:
        if t.name == drop:
            continue
        if replace and t.name in replace:
            arr, qtype = replace[t.name]
            w.add_tensor(t.name, arr, raw_dtype=qtype)
            continue
        w.add_tensor(t.name, np.array(t.data), raw_dtype=t.tensor_type)
    for name, arr in (extra or {}).items():
        w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def test_missing_unexpected_and_unsupported_tensors(tiny, tmp_path):
    _expect(_rewrite(tiny, tmp_path / "m.gguf", drop="blk.0.ffn_up.weight"), "missing tensor blk.0.ffn_up.weight")
    _expect(_rewrite(tiny, tmp_path / "u.gguf", extra={"blk.0.ffn_up.bias": np.zeros(192, np.float32)}),
            "unexpected tensor blk.0.ffn_up.bias")
    q8_1 = np.zeros((64, 128 // 32 * 40), np.uint8)  # Q8_1: 32 values in 40 bytes, valid layout, no kernel
    _expect(_rewrite(tiny, tmp_path / "q.gguf", replace={"blk.0.attn_k.weight": (q8_1, GGMLQuantizationType.Q8_1)}),
            "tensor blk.0.attn_k.weight has type Q8_1, which is not supported")


def test_shape_mismatch_is_named(tiny, tmp_path):
    wrong = gguf_quants.quantize(np.zeros((32, 128), np.float32), GGMLQuantizationType.Q8_0)
    _expect(_rewrite(tiny, tmp_path / "s.gguf", replace={"blk.0.attn_k.weight": (wrong, GGMLQuantizationType.Q8_0)}),
            "tensor blk.0.attn_k.weight has shape (rows, cols) (32, 128), the config implies (64, 128)")


def test_unsupported_architecture_and_head_dim(tmp_path):
    spec = TinySpec(n_layers=1)
    w = GGUFWriter(str(tmp_path / "arch.gguf"), "gemma")
    w.add_block_count(1)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    _expect(tmp_path / "arch.gguf", "unsupported architecture 'gemma'")
    bad = write_tiny_gguf(tmp_path / "hd.gguf", TinySpec(n_layers=1, dim=96, n_heads=3, head_dim=32), "F32")
    _expect(bad, "head_dim 32 is not supported")
    assert spec.n_layers == 1


def test_validate_gguf_reports_layout(tiny):
    header = validate_gguf(str(tiny))
    assert header.version == 3 and header.alignment == 32 and header.data_offset % 32 == 0
    names = [t.name for t in header.tensors]
    assert "token_embd.weight" in names and len(names) == 2 + 9
    embd = next(t for t in header.tensors if t.name == "token_embd.weight")
    assert (embd.dims, embd.type, embd.nbytes) == ((128, 512), "Q8_0", 512 * 4 * 34)


def test_the_loaders_type_table_is_the_gguf_packages():
    from inferd.model.ggml_types import GGML_TYPES

    assert GGML_TYPES == {t.value: (t.name, *GGML_QUANT_SIZES[t]) for t in GGMLQuantizationType}


def test_reading_a_header_imports_neither_the_gguf_package_nor_jinja2():
    """The start's load begins with these imports: they stay small (gguf's writer and YAML, jinja2 come later)."""
    import subprocess
    import sys

    code = ("import sys, inferd.model.loader, inferd.model.embedding_gguf\n"
            "print(sorted(m for m in ('gguf', 'yaml', 'jinja2', 'aiohttp') if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       cwd=Path(__file__).resolve().parents[2])
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


def test_read_architecture_stops_at_its_key(tiny, tmp_path):
    assert read_architecture(str(tiny)) == validate_gguf(str(tiny)).metadata["general.architecture"] == "llama"
    # the key comes first: a file cut right after it still names its architecture (the full walk would refuse it)
    data = tiny.read_bytes()
    cut = data.index(b"general.architecture") + len(b"general.architecture") + 4 + 8 + len(b"llama")
    bad = tmp_path / "cut.gguf"
    bad.write_bytes(data[:cut])
    assert read_architecture(str(bad)) == "llama"
    bad.write_bytes(data[: cut - 2])  # inside the value: the error says what broke off
    with pytest.raises(ModelLoadError, match="needs 5 bytes but only 3 remain"):
        read_architecture(str(bad))
    bad.write_bytes(b"GGML" + data[4:])
    with pytest.raises(ModelLoadError, match="not a GGUF file"):
        read_architecture(str(bad))


def test_read_architecture_of_a_file_without_the_key(tmp_path):
    path = tmp_path / "bare.gguf"
    writer = GGUFWriter(str(path), arch="llama")
    writer.kv_data[0].pop("general.architecture")
    writer.add_string("general.name", "no architecture")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    assert read_architecture(str(path)) is None


def test_expert_tensors_load_as_views_of_their_matrices(tmp_path):
    """A 3-D expert tensor (n_experts, rows, cols) is held as its matrices stacked by rows, a view of the mapped file
    (the engine repacks each expert from it: no copy of the experts besides that)."""
    spec = variant_spec("qwen3moe-gguf-q8_0")
    model = load_model(make_variant("qwen3moe-gguf-q8_0", tmp_path))
    t = model.tensors["blk.1.ffn_down_exps.weight"]
    assert (t.type, t.rows, t.cols) == ("Q8_0", spec.n_experts * spec.dim, spec.hidden_dim)
    assert not t.data.flags.owndata and not t.data.flags.writeable
    values = gguf_quants.dequantize(np.asarray(t.data), GGMLQuantizationType.Q8_0)
    want = tiny_weights(spec)["blk.1.ffn_down_exps.weight"]                # (n_experts, dim, hidden)
    np.testing.assert_allclose(values.reshape(want.shape), want, rtol=0, atol=0.01 * np.abs(want).max())
    assert model.tensors["blk.1.ffn_gate_inp.weight"].type == "F32"


def test_mis_shaped_experts_are_named(tmp_path):
    src = make_variant("qwen3moe-gguf-f32", tmp_path)
    split_wrong = np.zeros((4, 512, 256), np.float32)      # the same values as 4 experts of 512
    _expect(_rewrite(src, tmp_path / "e.gguf",
                     replace={"blk.0.ffn_gate_exps.weight": (split_wrong, GGMLQuantizationType.F32)}),
            "tensor blk.0.ffn_gate_exps.weight has shape (rows, cols) (4, 512, 256), the config implies (8, 256, 256)")
    four_d = np.zeros((2, 4, 256, 256), np.float32)
    _expect(_rewrite(src, tmp_path / "d.gguf",
                     replace={"blk.0.ffn_up_exps.weight": (four_d, GGMLQuantizationType.F32)}),
            "tensor blk.0.ffn_up_exps.weight has 4 dimensions; only 1-D to 3-D weights are supported")
