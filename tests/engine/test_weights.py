"""Fusing a layer's matrices for the C engine (inferd/engine/weights.py): plain concatenation (Wq|Wk|Wv) and the
interleaved Wgate|Wup layout that lets block_ffn.c finish SwiGLU 32 hidden units at a time."""
from __future__ import annotations

import os

import numpy as np
import pytest

from inferd import _cpu
from inferd.engine.weights import cpu_model_parts, fuse
from tests.reference import dequantize, make_tensor, random_model


def rows_tagged(name: str, rows: int, cols: int, base: float, type_name: str = "F32"):
    """A tensor whose row r holds the value base + r everywhere, so a row can be recognised after fusing."""
    return make_tensor(name, np.repeat((base + np.arange(rows, dtype=np.float32))[:, None], cols, axis=1), type_name)


def built(spec) -> np.ndarray:
    """The fused weight as the engine builds it (C repacking), back in floats."""
    assert spec[0] == "parts"
    return _cpu.Weight("parts", 0, 0, None, parts=spec[1], interleave=spec[2]).dequantize()


def test_concatenation_keeps_part_order():
    q, k = rows_tagged("q", 8, 32, 0.0), rows_tagged("k", 2, 32, 100.0)
    spec = fuse([q, k])
    assert [p[0] for p in spec[1]] == ["F32", "F32"] and spec[2] == 0
    assert built(spec)[:, 0].tolist() == list(range(8)) + [100, 101]


def test_interleave_puts_each_group_of_every_part_in_turn():
    gate, up = rows_tagged("gate", 96, 32, 0.0), rows_tagged("up", 96, 32, 1000.0)
    first = built(fuse([gate, up], interleave=32))[:, 0]
    expected = []
    for j in range(3):
        expected += list(range(32 * j, 32 * j + 32)) + list(range(1000 + 32 * j, 1000 + 32 * j + 32))
    assert first.tolist() == expected


@pytest.mark.parametrize("type_name", ["Q4_0", "Q8_0", "F16", "Q4_K", "Q6_K", "Q5_0"])
def test_interleave_moves_whole_encoded_rows(type_name):
    rng = np.random.default_rng(3)
    cols = 256 if type_name.endswith("_K") else 64
    gate = make_tensor("gate", rng.standard_normal((64, cols)).astype(np.float32), type_name)
    up = make_tensor("up", rng.standard_normal((64, cols)).astype(np.float32), type_name)
    spec = fuse([gate, up], interleave=32)
    assert all(p[3] is t.data for p, t in zip(spec[1], [gate, up]))      # no copy: repacked from the file's rows
    g, u = dequantize(gate), dequantize(up)
    np.testing.assert_array_equal(built(spec), np.concatenate([g[:32], u[:32], g[32:], u[32:]]).astype(np.float32))


def test_quantized_parts_keep_their_types():
    """Q4_K_M's Q4_K Q and K with a Q6_K V: one weight of two segments, nothing converted."""
    rng = np.random.default_rng(4)
    parts = [make_tensor(n, rng.standard_normal((r, 256)).astype(np.float32), t)
             for n, r, t in [("q", 64, "Q4_K"), ("k", 16, "Q4_K"), ("v", 16, "Q6_K")]]
    spec = fuse(parts)
    assert [p[0] for p in spec[1]] == ["Q4_K", "Q4_K", "Q6_K"]
    np.testing.assert_array_equal(built(spec), np.concatenate([dequantize(p) for p in parts]).astype(np.float32))


def test_mixed_types_take_the_most_precise():
    a, b = rows_tagged("a", 32, 32, 0.0, "Q4_0"), rows_tagged("b", 32, 32, 0.0, "Q8_0")
    assert [p[0] for p in fuse([a, b], interleave=32)[1]] == ["Q8_0", "Q8_0"]     # interleaved: one type
    f = rows_tagged("f", 32, 32, 0.0, "F16")
    assert [p[0] for p in fuse([a, f])[1]] == ["F16", "F16"]                       # floats beside quantized
    assert [p[0] for p in fuse([a, b])[1]] == ["Q4_0", "Q8_0"]                     # segments


def test_interleave_refuses_parts_it_cannot_split():
    with pytest.raises(ValueError, match="cannot interleave"):
        fuse([rows_tagged("gate", 48, 32, 0.0), rows_tagged("up", 48, 32, 0.0)], interleave=32)
    with pytest.raises(ValueError, match="cannot interleave"):
        fuse([rows_tagged("gate", 64, 32, 0.0), rows_tagged("up", 32, 32, 0.0)], interleave=32)
    with pytest.raises(ValueError, match="input widths differ"):
        fuse([rows_tagged("gate", 32, 32, 0.0), rows_tagged("up", 32, 64, 0.0)])


def test_cuda_engine_gets_k_quants_as_q8_0():
    """The CUDA kernels have no K-quant formats: its engine re-quantizes those matrices to Q8_0 (the CPU engine
    computes them natively); vectors and supported types are handed over untouched."""
    from inferd.engine.cuda_engine import _AUTO, _with_cuda_types
    from inferd.model.quant import requantize

    model = random_model(weight_type="Q4_K", dim=256, hidden=512, mix={"attn_v": "Q6_K"})
    converted = _with_cuda_types(model)
    assert {t.type for t in model.tensors.values()} == {"Q4_K", "Q6_K", "F32"}      # the loaded model is not changed
    for name, t in converted.tensors.items():
        assert t.type in _AUTO
        original = model.tensors[name]
        if original.type == "F32":
            assert t is original
        else:
            np.testing.assert_array_equal(t.data, requantize(original).data)
    q8 = random_model(weight_type="Q8_0")
    assert _with_cuda_types(q8) is q8


def test_low_bit_types_reach_the_engine_in_their_own_width():
    """A Q3_K/Q2_K/IQ4_XS/IQ4_NL or IQ3/IQ2/IQ1/TQ matrix is neither converted at load nor widened when its weight is
    built: each weight holds its own tiles, within 4% of the file's bytes (the codebook and ternary types: the file's
    bytes exactly; tests/engine/test_forward_reference.py checks such models' logits)."""
    from inferd.model.quant import convert_all
    from inferd.model.tensor import Tensor
    from tests.model.make_tiny import random_kquant

    model = random_model(weight_type="Q8_0", dim=256, hidden=256)
    kinds = [("blk.0.ffn_down.weight", "Q3_K"), ("blk.1.attn_v.weight", "Q2_K"), ("blk.1.ffn_up.weight", "IQ4_XS"),
             ("blk.0.attn_output.weight", "IQ4_NL"), ("blk.0.ffn_up.weight", "IQ3_S"), ("blk.0.ffn_gate.weight",
             "IQ3_XXS"), ("blk.0.attn_q.weight", "IQ2_XXS"), ("blk.0.attn_k.weight", "IQ2_XS"),
             ("blk.0.attn_v.weight", "IQ2_S"), ("blk.1.ffn_down.weight", "IQ1_S"), ("blk.1.ffn_gate.weight", "IQ1_M"),
             ("blk.1.attn_q.weight", "TQ1_0"), ("blk.1.attn_output.weight", "TQ2_0")]
    for i, (name, kind) in enumerate(kinds):
        t = model.tensors[name]
        model.tensors[name] = Tensor(name, kind, t.rows, t.cols, random_kquant(t.rows, t.cols, kind, seed=i))
    converted = convert_all(model.tensors.values())
    for name, kind in kinds:
        t = converted[name]
        assert t is model.tensors[name]
        w = _cpu.Weight(kind, t.rows, t.cols, t.data)
        assert t.data.nbytes <= w.nbytes <= 1.04 * t.data.nbytes, name
        if kind.startswith(("IQ1", "IQ2", "IQ3", "TQ")):
            assert w.nbytes == t.data.nbytes, name
    ts = model.tensors
    spec = fuse([ts[f"blk.1.attn_{x}.weight"] for x in "qkv"])
    assert [p[0] for p in spec[1]] == ["TQ1_0", "Q8_0", "Q2_K"]     # each part stays in its type: three segments


def test_experts_are_views_of_their_rows(tmp_path):
    """Each expert's parts are its rows of the file's 3-D tensors, not copies: the repack into the engine's arena is
    the one copy of the experts, as of a dense weight."""
    from inferd.model.loader import load_model
    from tests.model.make_tiny import make_variant

    model = load_model(make_variant("qwen2moe-gguf-q4_k", tmp_path))
    _, _, layers = cpu_model_parts(model)
    kind, options, ts = layers[1][1]
    assert kind == "ffn_moe" and options["n_used"] == 2 and options["norm_topk"] == 0
    n, hidden = model.config.n_experts, model.config.expert_hidden_dim
    assert len(ts["experts_gu"]) == len(ts["experts_down"]) == n
    gate = model.tensors["blk.1.ffn_gate_exps.weight"].data
    down = model.tensors["blk.1.ffn_down_exps.weight"].data
    for e in range(n):
        (_, g_rows, _, g), (_, u_rows, _, _) = ts["experts_gu"][e][1]
        assert g_rows == u_rows == hidden and ts["experts_gu"][e][2] == 32
        assert np.shares_memory(g, gate) and g.ctypes.data == gate[e * hidden].ctypes.data
        d = ts["experts_down"][e][3]
        assert np.shares_memory(d, down) and d.ctypes.data == down[e * model.config.dim].ctypes.data
    assert ts["shared_gate"][2] == model.config.dim
    assert ts["shared_gu"][1][0][1] == model.config.shared_expert_hidden_dim


def _mapped_rss_kb(path) -> int:
    """Resident KB of this process's mappings of `path` (/proc/self/smaps)."""
    total, inside = 0, False
    for line in open("/proc/self/smaps"):
        if "-" in line.split(" ", 1)[0]:
            inside = line.rstrip().endswith(str(path))
        elif inside and line.startswith("Rss:"):
            total += int(line.split()[1])
    return total


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="needs /proc/self/smaps")
def test_building_drops_the_files_pages_and_reports_progress(tmp_path):
    """The repack reads each weight's rows from the mapped file once: its whole pages then leave the resident set
    (the load peaks at the weights' size, not twice it), and progress reaches the arena's size."""
    from inferd.engine.weights import build_cpu_model, file_pages
    from inferd.model.loader import load_model
    from tests.model.make_tiny import TinySpec, write_tiny_gguf

    path = write_tiny_gguf(tmp_path / "m.gguf", TinySpec(dim=256, hidden_dim=1024, n_layers=2, vocab_size=2048))
    model = load_model(path)
    weights = sum(t.data.nbytes for t in model.tensors.values() if t.type == "Q8_0")
    for t in model.tensors.values():  # everything resident, as a read leaves it
        np.asarray(t.data).sum()
    assert _mapped_rss_kb(path) * 1024 > weights
    seen: list[tuple[int, int]] = []
    built = build_cpu_model(model, threads=2, progress=lambda done, total: seen.append((done, total)))
    assert _mapped_rss_kb(path) * 1024 < weights / 8  # the header and the small float tensors stay
    assert seen and seen[-1][0] == seen[-1][1] == built.weight_buffer[1]
    assert file_pages(np.zeros(8192, np.uint8)) is None  # not a file's: never dropped (that would zero it)
