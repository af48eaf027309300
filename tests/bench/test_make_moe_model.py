"""bench/make_moe_model.py's writer on a small shape of each architecture: the file it streams tensor by tensor in
block format is what inferd's loader reads (metadata, names, shapes, types), its blocks decode as gguf decodes them,
and the engine runs it."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType
from gguf import quants as gguf_quants

from inferd import _cpu
from inferd.engine.engine import Engine, SeqInput
from inferd.model.loader import load_model
from tests.model.make_tiny import TinySpec, write_tiny_gguf

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import make_moe_model  # noqa: E402

SMALL = {
    "gpt-oss-20b": dict(n_layers=2, dim=256, n_heads=4, n_kv_heads=2, n_experts=4, n_used=2, expert_ff=64, ctx=512),
    "qwen3-30b-a3b": dict(n_layers=2, dim=256, n_heads=4, n_kv_heads=2, n_experts=4, n_used=2, expert_ff=256,
                          ctx=512),
}


def write_small(tmp_path, shape_name):
    vocab = write_tiny_gguf(tmp_path / "vocab.gguf", TinySpec())
    out = tmp_path / f"{shape_name}.gguf"
    shape = {**make_moe_model.SHAPES[shape_name], **SMALL[shape_name]}
    make_moe_model.write(out, shape, str(vocab), None, shape_name)
    return out


def test_gpt_oss_shape_loads_and_runs(tmp_path):
    model = load_model(write_small(tmp_path, "gpt-oss-20b"))
    cfg = model.config
    assert (cfg.arch, cfg.n_layers, cfg.dim, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim) == ("gpt-oss", 2, 256, 4, 2, 64)
    assert (cfg.n_experts, cfg.n_experts_used, cfg.expert_hidden_dim) == (4, 2, 64)
    assert (cfg.sliding_window, cfg.local_layers, cfg.yarn["factor"], cfg.yarn["original_context"]) == \
        (128, (0,), 32.0, 4096)
    t = model.tensors
    assert t["blk.1.ffn_down_exps.weight"].type == "MXFP4" and t["blk.1.attn_q.weight"].type == "Q8_0"
    assert t["blk.0.attn_sinks.weight"].type == "F32" and t["blk.0.ffn_up_exps.bias"].rows == 4
    down = t["blk.0.ffn_down_exps.weight"]                       # (4 experts x 256 rows, 64)
    want = gguf_quants.dequantize(np.ascontiguousarray(down.data), GGMLQuantizationType.MXFP4).reshape(-1, 64)
    assert np.abs(want).max() == 12 * 2.0 ** -8                  # the writer's scale: 2^(120 - 128)
    np.testing.assert_array_equal(_cpu.Weight("MXFP4", down.rows, 64, down.data).dequantize(), want)
    eng = Engine(model, num_kv_blocks=2, max_batch_tokens=32, max_seqs=1, threads=2, max_logits_rows=32)
    logits = eng.step([SeqInput(list(range(3, 23)), 0, [0, 1], want_logits=True)])[0].logits
    assert logits.shape == (20, cfg.vocab_size) and np.isfinite(logits).all() and logits.std() > 0


def test_qwen3moe_shape_loads(tmp_path):
    model = load_model(write_small(tmp_path, "qwen3-30b-a3b"))
    assert model.config.arch == "qwen3moe" and model.tensors["blk.0.ffn_gate_exps.weight"].type == "Q4_K"
    assert model.tensors["output.weight"].type == "Q6_K"
