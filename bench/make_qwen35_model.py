"""Writes a Qwen3.5 (Gated DeltaNet hybrid) GGUF at a real model's shape with random weights, for the benchmarks.

    python bench/make_qwen35_model.py OUT.gguf [--shape qwen3.5-0.8b] --vocab-from QWEN2.5.gguf [--layers N]

No Qwen3.5 weights can be fetched here, so the blocks are written directly in their format, one tensor at a time, as
bench/make_moe_model.py does: Q4_K matrices (what a Q4_K_M file has most of), the token embedding tied to the output,
norms 1, the convolution's taps 0.25, the decay's rate -1 and its bias 0 (F32, as llama.cpp's converter keeps
them). The tokenizer and the chat template are the `--vocab-from` file's. `--layers` cuts the depth for a quick check.

Shapes (llama.cpp's GGUF names and metadata keys; every fourth layer gated attention, the others Gated DeltaNet):
  qwen3.5-0.8b  24 layers, hidden 1024, 8 query / 2 KV heads of 256 (RoPE on 64 of them), FFN 3584, Gated DeltaNet
                16 key and 16 value heads of 128, kernel 4 (the published 0.8B config's numbers)
  qwen3.5-2b    24 layers, hidden 2048, 8 query / 2 KV heads of 256, FFN 6144, the same Gated DeltaNet heads (an
                assumed shape: llama.cpp names it 2B when a 24-layer file is wider than 1024)
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from gguf import GGUFWriter

from make_moe_model import Q4_K, StreamingModel, copy_tokenizer

SHAPES = {
    "qwen3.5-0.8b": dict(n_layers=24, dim=1024, n_heads=8, n_kv_heads=2, head_dim=256, rope_dims=64, ff=3584,
                         k_heads=16, v_heads=16, ssm_head=128, conv=4, ctx=32768, rope_base=1e7, eps=1e-6),
    "qwen3.5-2b": dict(n_layers=24, dim=2048, n_heads=8, n_kv_heads=2, head_dim=256, rope_dims=64, ff=6144,
                       k_heads=16, v_heads=16, ssm_head=128, conv=4, ctx=32768, rope_base=1e7, eps=1e-6),
}
FULL_ATTENTION_INTERVAL = 4


def write(out: Path, shape_name: str, vocab_source: str, layers: int | None) -> None:
    s = SHAPES[shape_name]
    n_layers = layers or s["n_layers"]
    arch = "qwen35"
    w = GGUFWriter(str(out), arch)
    w.add_name(f"{shape_name}-shape-random-q4_k")
    vocab = copy_tokenizer(w, vocab_source)
    dim, hd, ff = s["dim"], s["head_dim"], s["ff"]
    q, kv = s["n_heads"] * hd, s["n_kv_heads"] * hd
    nk, nv, hs = s["k_heads"], s["v_heads"], s["ssm_head"]
    conv_dim, value_dim = 2 * nk * hs + nv * hs, nv * hs
    w.add_context_length(s["ctx"])
    w.add_embedding_length(dim)
    w.add_block_count(n_layers)
    w.add_feed_forward_length(ff)
    w.add_head_count(s["n_heads"])
    w.add_head_count_kv(s["n_kv_heads"])
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_rope_dimension_count(s["rope_dims"])
    pairs = s["rope_dims"] // 2
    w.add_array(f"{arch}.rope.dimension_sections", [pairs - 2 * (pairs // 3), pairs // 3, pairs // 3, 0])
    w.add_rope_freq_base(s["rope_base"])
    w.add_layer_norm_rms_eps(s["eps"])
    w.add_uint32(f"{arch}.ssm.conv_kernel", s["conv"])
    w.add_uint32(f"{arch}.ssm.state_size", hs)
    w.add_uint32(f"{arch}.ssm.group_count", nk)
    w.add_uint32(f"{arch}.ssm.time_step_rank", nv)
    w.add_uint32(f"{arch}.ssm.inner_size", value_dim)
    w.add_uint32(f"{arch}.full_attention_interval", FULL_ATTENTION_INTERVAL)
    w.add_file_type(15)  # MOSTLY_Q4_K_M
    m = StreamingModel(w, np.random.default_rng(0))
    m.quantized("token_embd.weight", (vocab, dim), Q4_K)
    m.float32("output_norm.weight", (dim,), 1.0)
    for i in range(n_layers):
        p = f"blk.{i}."
        m.float32(p + "attn_norm.weight", (dim,), 1.0)
        m.float32(p + "post_attention_norm.weight", (dim,), 1.0)
        if (i + 1) % FULL_ATTENTION_INTERVAL:  # Gated DeltaNet
            m.quantized(p + "attn_qkv.weight", (conv_dim, dim), Q4_K)
            m.quantized(p + "attn_gate.weight", (value_dim, dim), Q4_K)
            m.quantized(p + "ssm_beta.weight", (nv, dim), Q4_K)
            m.quantized(p + "ssm_alpha.weight", (nv, dim), Q4_K)
            m.float32(p + "ssm_conv1d.weight", (conv_dim, s["conv"]), 0.25)
            m.float32(p + "ssm_dt.bias", (nv,), 0.0)
            m.float32(p + "ssm_a", (nv,), -1.0)
            m.float32(p + "ssm_norm.weight", (hs,), 1.0)
            m.quantized(p + "ssm_out.weight", (dim, value_dim), Q4_K)
        else:  # gated attention: Wq holds each head's q rows, then its gate's
            m.quantized(p + "attn_q.weight", (2 * q, dim), Q4_K)
            m.quantized(p + "attn_k.weight", (kv, dim), Q4_K)
            m.quantized(p + "attn_v.weight", (kv, dim), Q4_K)
            m.quantized(p + "attn_output.weight", (dim, q), Q4_K)
            m.float32(p + "attn_q_norm.weight", (hd,), 1.0)
            m.float32(p + "attn_k_norm.weight", (hd,), 1.0)
        m.quantized(p + "ffn_gate.weight", (ff, dim), Q4_K)
        m.quantized(p + "ffn_up.weight", (ff, dim), Q4_K)
        m.quantized(p + "ffn_down.weight", (dim, ff), Q4_K)
    m.write()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--shape", default="qwen3.5-0.8b", choices=sorted(SHAPES))
    ap.add_argument("--vocab-from", required=True, help="a Qwen2.5 GGUF whose tokenizer and template to copy")
    ap.add_argument("--layers", type=int, default=None, help="fewer layers than the shape's, for a quick check")
    args = ap.parse_args()
    write(args.out, args.shape, args.vocab_from, args.layers)
    print(args.out)


if __name__ == "__main__":
    main()
