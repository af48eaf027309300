"""Writes a mixture-of-experts GGUF at a real model's shape with random weights, for the MoE benchmarks.

    python bench/make_moe_model.py OUT.gguf [--shape qwen3-30b-a3b] [--vocab-from QWEN2.5.gguf] [--layers N]

No MoE weights can be fetched here and an F16 file of this size (61 GB for Qwen3-30B-A3B) would not fit the disk
to quantize from, so the blocks are written directly in their format, one tensor at a time (memory stays at one
tensor): Q4_K for the attention, expert and embedding matrices and Q6_K for the output matrix, as a Q4_K_M file
has most of its bytes; norms 1 and the router F32. The quantized blocks are random bytes under small block
scales, so weights are of the order of 0.02. Random routers route about uniformly, which is what a speed
benchmark needs. The tokenizer, its merges and the chat template are the `--vocab-from` file's (Qwen2.5's
vocabulary is Qwen3's). `--layers` cuts the depth for a quick check of the file.

Shapes (llama.cpp's GGUF names and metadata keys):
  qwen3-30b-a3b  qwen3moe: 48 layers, hidden 2048, 32 query / 4 KV heads of 128, QK-norm, 128 experts of 768
                 with 8 used (top-k weights renormalized), rope base 1e6, RMS eps 1e-6.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFWriter

Q4_K, Q6_K = GGMLQuantizationType.Q4_K, GGMLQuantizationType.Q6_K
QK_K = 256
BLOCK_BYTES = {Q4_K: 144, Q6_K: 210}

SHAPES = {
    "qwen3-30b-a3b": dict(arch="qwen3moe", n_layers=48, dim=2048, n_heads=32, n_kv_heads=4, head_dim=128,
                          n_experts=128, n_used=8, expert_ff=768, ctx=32768, rope_base=1e6, eps=1e-6),
}


def random_blocks(rng: np.random.Generator, qtype: GGMLQuantizationType, rows: int, cols: int) -> np.ndarray:
    """rows x cols weights as random blocks of `qtype`, with block scales that keep them near 0.02."""
    n = rows * cols // QK_K
    blocks = rng.integers(0, 256, size=(n, BLOCK_BYTES[qtype]), dtype=np.uint8)
    scale = np.full(n, 4e-5 if qtype == Q4_K else 2e-3, np.float16).view(np.uint8).reshape(n, 2)
    if qtype == Q4_K:  # d, dmin first
        blocks[:, 0:2] = scale
        blocks[:, 2:4] = scale
    else:  # Q6_K: ql, qh, int8 scales, then d
        blocks[:, 192:208] = rng.integers(1, 16, size=(n, 16), dtype=np.int8).view(np.uint8)
        blocks[:, 208:210] = scale
    return blocks.reshape(rows, cols // QK_K * BLOCK_BYTES[qtype])


class StreamingModel:
    """Tensor infos first (the header needs them all), then each tensor's bytes made and written in order."""

    def __init__(self, writer: GGUFWriter, rng: np.random.Generator):
        self.w, self.rng = writer, rng
        self.plan: list[tuple[str, tuple[int, ...], object]] = []

    def quantized(self, name: str, shape: tuple[int, ...], qtype: GGMLQuantizationType) -> None:
        row_bytes = shape[-1] // QK_K * BLOCK_BYTES[qtype]
        byte_shape = (*shape[:-1], row_bytes)  # the writer takes a quantized tensor's shape in bytes
        self.w.add_tensor_info(name, byte_shape, np.dtype(np.uint8), int(np.prod(shape[:-1])) * row_bytes, qtype)
        self.plan.append((name, shape, qtype))

    def float32(self, name: str, shape: tuple[int, ...], value: float | None) -> None:
        self.w.add_tensor_info(name, shape, np.dtype(np.float32), int(np.prod(shape)) * 4)
        self.plan.append((name, shape, value))

    def write(self) -> None:
        self.w.write_header_to_file()
        self.w.write_kv_data_to_file()
        self.w.write_ti_data_to_file()
        for name, shape, kind in self.plan:
            if isinstance(kind, GGMLQuantizationType):
                rows = int(np.prod(shape[:-1]))
                data = random_blocks(self.rng, kind, rows, shape[-1])
            elif kind is None:  # a router: small random logits
                data = (self.rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float32)
            else:
                data = np.full(shape, kind, np.float32)
            self.w.write_tensor_data(data)
            print(f"  {name} {shape}", flush=True)
        self.w.close()


def copy_tokenizer(w: GGUFWriter, source: str) -> int:
    r = GGUFReader(source)
    f = r.fields
    tokens = f["tokenizer.ggml.tokens"].contents()
    w.add_tokenizer_model(f["tokenizer.ggml.model"].contents())
    w.add_tokenizer_pre(f["tokenizer.ggml.pre"].contents())
    w.add_token_list(tokens)
    w.add_token_types(f["tokenizer.ggml.token_type"].contents())
    w.add_token_merges(f["tokenizer.ggml.merges"].contents())
    for key, add in (("bos_token_id", w.add_bos_token_id), ("eos_token_id", w.add_eos_token_id),
                     ("padding_token_id", w.add_pad_token_id)):
        if f"tokenizer.ggml.{key}" in f:
            add(int(f[f"tokenizer.ggml.{key}"].contents()))
    w.add_add_bos_token(False)
    if "tokenizer.chat_template" in f:
        w.add_chat_template(f["tokenizer.chat_template"].contents())
    return len(tokens)


def write(out: Path, shape_name: str, vocab_source: str, layers: int | None) -> None:
    s = SHAPES[shape_name]
    n_layers = layers or s["n_layers"]
    w = GGUFWriter(str(out), s["arch"])
    w.add_name(f"{shape_name}-shape-random-q4_k")
    vocab = copy_tokenizer(w, vocab_source)
    arch = s["arch"]
    w.add_context_length(s["ctx"])
    w.add_embedding_length(s["dim"])
    w.add_block_count(n_layers)
    w.add_feed_forward_length(s["expert_ff"])
    w.add_head_count(s["n_heads"])
    w.add_head_count_kv(s["n_kv_heads"])
    w.add_key_length(s["head_dim"])
    w.add_value_length(s["head_dim"])
    w.add_rope_freq_base(s["rope_base"])
    w.add_layer_norm_rms_eps(s["eps"])
    w.add_expert_count(s["n_experts"])
    w.add_expert_used_count(s["n_used"])
    w.add_uint32(f"{arch}.expert_feed_forward_length", s["expert_ff"])
    w.add_file_type(15)  # MOSTLY_Q4_K_M
    m = StreamingModel(w, np.random.default_rng(0))
    dim, hd, e, ff = s["dim"], s["head_dim"], s["n_experts"], s["expert_ff"]
    m.quantized("token_embd.weight", (vocab, dim), Q4_K)
    m.float32("output_norm.weight", (dim,), 1.0)
    m.quantized("output.weight", (vocab, dim), Q6_K)
    for i in range(n_layers):
        p = f"blk.{i}."
        m.float32(p + "attn_norm.weight", (dim,), 1.0)
        m.float32(p + "ffn_norm.weight", (dim,), 1.0)
        m.float32(p + "attn_q_norm.weight", (hd,), 1.0)
        m.float32(p + "attn_k_norm.weight", (hd,), 1.0)
        m.quantized(p + "attn_q.weight", (s["n_heads"] * hd, dim), Q4_K)
        m.quantized(p + "attn_k.weight", (s["n_kv_heads"] * hd, dim), Q4_K)
        m.quantized(p + "attn_v.weight", (s["n_kv_heads"] * hd, dim), Q4_K)
        m.quantized(p + "attn_output.weight", (dim, s["n_heads"] * hd), Q4_K)
        m.float32(p + "ffn_gate_inp.weight", (e, dim), None)
        m.quantized(p + "ffn_gate_exps.weight", (e, ff, dim), Q4_K)
        m.quantized(p + "ffn_up_exps.weight", (e, ff, dim), Q4_K)
        m.quantized(p + "ffn_down_exps.weight", (e, dim, ff), Q4_K)
    m.write()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--shape", default="qwen3-30b-a3b", choices=sorted(SHAPES))
    ap.add_argument("--vocab-from", required=True, help="a Qwen2.5 GGUF whose tokenizer and template to copy")
    ap.add_argument("--layers", type=int, default=None, help="fewer layers than the shape's, for a quick check")
    args = ap.parse_args()
    write(args.out, args.shape, args.vocab_from, args.layers)
    print(args.out)


if __name__ == "__main__":
    main()
