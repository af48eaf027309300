"""Writes a GGUF with TinyLlama-1.1B's shape and random weights, for benchmarks in the bandwidth regime.

    python bench/make_random_model.py OUT.gguf [--type Q4_0|Q4_1|Q8_0|F16] [--vocab-from SMOLLM2.gguf]

Shape: dim 2048, 22 layers, 32 heads, 4 KV heads (head_dim 64), FFN 5632, vocab 32000, context 2048, untied
output. The tokenizer is SmolLM2's byte-level BPE cut to the first 32000 tokens (with the merges that stay inside
them), so both llama.cpp and inferd can load the file. Weights are N(0, 0.02), norms 1.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFWriter

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from inferd import _cpu  # noqa: E402

SHAPE = dict(dim=2048, n_layers=22, n_heads=32, n_kv_heads=4, hidden=5632, vocab=32000, ctx=2048)


def tokenizer_fields(source: str, vocab: int) -> dict:
    r = GGUFReader(source)
    tokens = r.fields["tokenizer.ggml.tokens"].contents()[:vocab]
    types = r.fields["tokenizer.ggml.token_type"].contents()[:vocab]
    known = set(tokens)
    merges = [m for m in r.fields["tokenizer.ggml.merges"].contents()
              if all(p in known for p in m.split(" ")) and m.replace(" ", "") in known]
    return {"tokens": tokens, "types": types, "merges": merges,
            "pre": r.fields["tokenizer.ggml.pre"].contents()}


def weight(rng, rows: int, cols: int, type_name: str):
    x = (rng.standard_normal((rows, cols), dtype=np.float32) * 0.02).astype(np.float32)
    if type_name == "F16":
        return x.astype(np.float16), GGMLQuantizationType.F16
    return _cpu.quantize(x, type_name), GGMLQuantizationType[type_name]


def write(out: Path, type_name: str, vocab_source: str) -> None:
    s = SHAPE
    tok = tokenizer_fields(vocab_source, s["vocab"])
    w = GGUFWriter(str(out), "llama")
    w.add_name(f"tinyllama-shape-random-{type_name.lower()}")
    w.add_context_length(s["ctx"])
    w.add_embedding_length(s["dim"])
    w.add_block_count(s["n_layers"])
    w.add_feed_forward_length(s["hidden"])
    w.add_head_count(s["n_heads"])
    w.add_head_count_kv(s["n_kv_heads"])
    w.add_rope_dimension_count(s["dim"] // s["n_heads"])
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(s["vocab"])
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(tok["pre"])
    w.add_token_list(tok["tokens"])
    w.add_token_types(tok["types"])
    w.add_token_merges(tok["merges"])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(False)
    rng = np.random.default_rng(0)
    kv = s["dim"] // s["n_heads"] * s["n_kv_heads"]

    def matrix(name, rows, cols):
        data, t = weight(rng, rows, cols, type_name)
        w.add_tensor(name, data, raw_dtype=t)

    matrix("token_embd.weight", s["vocab"], s["dim"])
    w.add_tensor("output_norm.weight", np.ones(s["dim"], np.float32))
    matrix("output.weight", s["vocab"], s["dim"])
    for i in range(s["n_layers"]):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", np.ones(s["dim"], np.float32))
        w.add_tensor(p + "ffn_norm.weight", np.ones(s["dim"], np.float32))
        matrix(p + "attn_q.weight", s["dim"], s["dim"])
        matrix(p + "attn_k.weight", kv, s["dim"])
        matrix(p + "attn_v.weight", kv, s["dim"])
        matrix(p + "attn_output.weight", s["dim"], s["dim"])
        matrix(p + "ffn_gate.weight", s["hidden"], s["dim"])
        matrix(p + "ffn_up.weight", s["hidden"], s["dim"])
        matrix(p + "ffn_down.weight", s["dim"], s["hidden"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main() -> None:
    from inferd.model.pull import DEFAULT_MODEL, resolve

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--type", default="Q4_0", choices=["Q4_0", "Q4_1", "Q8_0", "F16"])
    ap.add_argument("--vocab-from", default=None, help="GGUF whose tokenizer to borrow (default: SmolLM2)")
    args = ap.parse_args()
    write(args.out, args.type, args.vocab_from or str(resolve(DEFAULT_MODEL, progress=False)))
    print(args.out)


if __name__ == "__main__":
    main()
