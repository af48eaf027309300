"""Writes a mixture-of-experts GGUF at a real model's shape with random weights, for the MoE benchmarks.

    python bench/make_moe_model.py OUT.gguf [--shape qwen3-30b-a3b|gpt-oss-20b] [--vocab-from QWEN2.5.gguf]
                                            [--layers N]

No MoE weights can be fetched here and an F16 file of this size (61 GB for Qwen3-30B-A3B) would not fit the disk
to quantize from, so the blocks are written directly in their format, one tensor at a time (memory stays at one
tensor). Qwen3-30B-A3B as a Q4_K_M file has most of its bytes: Q4_K for the attention, expert and embedding
matrices and Q6_K for the output matrix. gpt-oss-20b as its published MXFP4 file: the experts in MXFP4, the other
matrices in Q8_0 (its widths of 2880 are no multiple of a K-quant's 256). Norms 1; routers, biases and attention
sinks F32. The quantized blocks are random bytes under small block scales, so weights are of the order of 0.02.
Random routers route about uniformly, which is what a speed benchmark needs. The tokenizer, its merges and the chat
template are the `--vocab-from` file's (Qwen2.5's vocabulary is Qwen3's; any file's vocabulary serves gpt-oss's
speed). `--layers` cuts the depth for a quick check of the file.

Shapes (llama.cpp's GGUF names and metadata keys):
  qwen3-30b-a3b  qwen3moe: 48 layers, hidden 2048, 32 query / 4 KV heads of 128, QK-norm, 128 experts of 768
                 with 8 used (top-k weights renormalized), rope base 1e6, RMS eps 1e-6.
  gpt-oss-20b    gpt-oss: 24 layers, hidden 2880, 64 query / 8 KV heads of 64 with sinks and Q/K/V/O biases, every
                 other layer a sliding window of 128, 32 experts of 2880 with biases, 4 used, rope base 150000 with
                 YaRN (32 over 4096), RMS eps 1e-5.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFWriter, RopeScalingType

Q4_K, Q6_K = GGMLQuantizationType.Q4_K, GGMLQuantizationType.Q6_K
Q8_0, MXFP4 = GGMLQuantizationType.Q8_0, GGMLQuantizationType.MXFP4
# values and bytes per block
BLOCKS = {Q4_K: (256, 144), Q6_K: (256, 210), Q8_0: (32, 34), MXFP4: (32, 17)}

SHAPES = {
    "qwen3-30b-a3b": dict(arch="qwen3moe", n_layers=48, dim=2048, n_heads=32, n_kv_heads=4, head_dim=128,
                          n_experts=128, n_used=8, expert_ff=768, ctx=32768, rope_base=1e6, eps=1e-6),
    "gpt-oss-20b": dict(arch="gpt-oss", n_layers=24, dim=2880, n_heads=64, n_kv_heads=8, head_dim=64,
                        n_experts=32, n_used=4, expert_ff=2880, ctx=131072, rope_base=150000.0, eps=1e-5,
                        window=128, yarn=(32.0, 4096)),
}


def random_blocks(rng: np.random.Generator, qtype: GGMLQuantizationType, rows: int, cols: int) -> np.ndarray:
    """rows x cols weights as random blocks of `qtype`, with block scales that keep them near 0.02."""
    values, size = BLOCKS[qtype]
    n = rows * cols // values
    blocks = rng.integers(0, 256, size=(n, size), dtype=np.uint8)
    if qtype == MXFP4:  # e (E8M0) | 16 bytes of e2m1 codes: 2^(120 - 128) times values up to 12
        blocks[:, 0] = 120
        return blocks.reshape(rows, cols // values * size)
    scale = np.full(n, {Q4_K: 4e-5, Q6_K: 2e-3, Q8_0: 2e-4}[qtype], np.float16).view(np.uint8).reshape(n, 2)
    if qtype in (Q4_K, Q8_0):  # d (and Q4_K's dmin) first
        blocks[:, 0:2] = scale
        if qtype == Q4_K:
            blocks[:, 2:4] = scale
    else:  # Q6_K: ql, qh, int8 scales, then d
        blocks[:, 192:208] = rng.integers(1, 16, size=(n, 16), dtype=np.int8).view(np.uint8)
        blocks[:, 208:210] = scale
    return blocks.reshape(rows, cols // values * size)


class StreamingModel:
    """Tensor infos first (the header needs them all), then each tensor's bytes made and written in order."""

    def __init__(self, writer: GGUFWriter, rng: np.random.Generator):
        self.w, self.rng = writer, rng
        self.plan: list[tuple[str, tuple[int, ...], object]] = []

    def quantized(self, name: str, shape: tuple[int, ...], qtype: GGMLQuantizationType) -> None:
        values, size = BLOCKS[qtype]
        row_bytes = shape[-1] // values * size
        byte_shape = (*shape[:-1], row_bytes)  # the writer takes a quantized tensor's shape in bytes
        self.w.add_tensor_info(name, byte_shape, np.dtype(np.uint8), int(np.prod(shape[:-1])) * row_bytes, qtype)
        self.plan.append((name, shape, qtype))

    def float32(self, name: str, shape: tuple[int, ...], value: float | None, scale: float = 0.02) -> None:
        """value: every element's (norms), or None for random ones of `scale` (routers, biases, sinks)"""
        self.w.add_tensor_info(name, shape, np.dtype(np.float32), int(np.prod(shape)) * 4)
        self.plan.append((name, shape, value if value is not None else -scale))

    def write(self) -> None:
        self.w.write_header_to_file()
        self.w.write_kv_data_to_file()
        self.w.write_ti_data_to_file()
        for name, shape, kind in self.plan:
            if isinstance(kind, GGMLQuantizationType):
                rows = int(np.prod(shape[:-1]))
                data = random_blocks(self.rng, kind, rows, shape[-1])
            elif kind < 0:  # random, of that scale: a router's small logits, biases, sinks
                data = (self.rng.standard_normal(shape, dtype=np.float32) * -kind).astype(np.float32)
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


def write(out: Path, s: dict, vocab_source: str, layers: int | None, name: str = "") -> None:
    """The file of shape `s` (a SHAPES entry) at `out`, with `layers` layers if given."""
    n_layers = layers or s["n_layers"]
    arch = s["arch"]
    w = GGUFWriter(str(out), arch)
    w.add_name(f"{name or arch}-shape-random")
    vocab = copy_tokenizer(w, vocab_source)
    w.add_context_length(s["ctx"])
    w.add_embedding_length(s["dim"])
    w.add_block_count(n_layers)
    w.add_feed_forward_length(s["expert_ff"])
    w.add_head_count(s["n_heads"])
    w.add_head_count_kv(s["n_kv_heads"])
    w.add_key_length(s["head_dim"])
    w.add_value_length(s["head_dim"])
    w.add_rope_dimension_count(s["head_dim"])
    w.add_rope_freq_base(s["rope_base"])
    w.add_layer_norm_rms_eps(s["eps"])
    w.add_expert_count(s["n_experts"])
    w.add_expert_used_count(s["n_used"])
    w.add_uint32(f"{arch}.expert_feed_forward_length", s["expert_ff"])
    if "window" in s:
        w.add_sliding_window(s["window"])
    if "yarn" in s:
        w.add_rope_scaling_type(RopeScalingType.YARN)
        w.add_rope_scaling_factor(s["yarn"][0])
        w.add_rope_scaling_orig_ctx_len(s["yarn"][1])
    w.add_file_type(38 if arch == "gpt-oss" else 15)  # MOSTLY_MXFP4_MOE, MOSTLY_Q4_K_M
    m = StreamingModel(w, np.random.default_rng(0))
    (_gpt_oss_tensors if arch == "gpt-oss" else _qwen3moe_tensors)(m, s, vocab, n_layers)
    m.write()


def _qwen3moe_tensors(m: StreamingModel, s: dict, vocab: int, n_layers: int) -> None:
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


def _gpt_oss_tensors(m: StreamingModel, s: dict, vocab: int, n_layers: int) -> None:
    dim, hd, e, ff = s["dim"], s["head_dim"], s["n_experts"], s["expert_ff"]
    q, kv = s["n_heads"] * hd, s["n_kv_heads"] * hd
    m.quantized("token_embd.weight", (vocab, dim), Q8_0)
    m.float32("output_norm.weight", (dim,), 1.0)
    m.quantized("output.weight", (vocab, dim), Q8_0)
    for i in range(n_layers):
        p = f"blk.{i}."
        m.float32(p + "attn_norm.weight", (dim,), 1.0)
        m.float32(p + "post_attention_norm.weight", (dim,), 1.0)
        for role, rows, cols in (("attn_q", q, dim), ("attn_k", kv, dim), ("attn_v", kv, dim), ("attn_output", dim, q)):
            m.quantized(p + role + ".weight", (rows, cols), Q8_0)
            m.float32(p + role + ".bias", (rows,), None)
        m.float32(p + "attn_sinks.weight", (s["n_heads"],), None, 1.0)
        m.float32(p + "ffn_gate_inp.weight", (e, dim), None)
        m.float32(p + "ffn_gate_inp.bias", (e,), None)
        for role, rows, cols in (("gate", ff, dim), ("up", ff, dim), ("down", dim, ff)):
            m.quantized(p + f"ffn_{role}_exps.weight", (e, rows, cols), MXFP4)
            m.float32(p + f"ffn_{role}_exps.bias", (e, rows), None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--shape", default="qwen3-30b-a3b", choices=sorted(SHAPES))
    ap.add_argument("--vocab-from", required=True, help="a GGUF whose tokenizer and template to copy (Qwen2.5's)")
    ap.add_argument("--layers", type=int, default=None, help="fewer layers than the shape's, for a quick check")
    args = ap.parse_args()
    write(args.out, SHAPES[args.shape], args.vocab_from, args.layers, args.shape)
    print(args.out)


if __name__ == "__main__":
    main()
