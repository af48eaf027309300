"""CUDA backend benchmark (needs a GPU; never part of the test pass).

    python bench/cuda.py [--out DIR] [--smollm2 PATH] [--quick]
    python bench/cuda.py trim-gguf SRC DST --layers N     (no GPU: a GGUF with only the first N layers)

Measures, in one run, and writes DIR/cuda_bench.json plus a table on stdout:
  - device-to-device copy bandwidth (the ceiling every decode number is a fraction of);
  - each decode GEMV of the Llama-3.2-1B shapes, per weight format, in GB/s and % of that ceiling (the weights
    rotate over enough copies to stay out of L2);
  - decode tokens/s of a Llama-3.2-1B-shaped random model at bf16 / int8 / int4 weights, batch 1/8/32, by replaying
    the captured decode graph, with the weight bytes per second that implies at batch 1 (target: bf16 >= 93%,
    int4 >= 80% of the copy bandwidth), and of SmolLM2 when a GGUF is given;
  - prefill tokens/s at 128 / 512 / 2048 tokens (bf16 weights), against the time the same bf16 GEMMs take alone
    through cuBLAS (target: >= 60%).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

LLAMA_1B = dict(vocab=128256, dim=2048, n_layers=16, n_heads=32, n_kv_heads=8, head_dim=64, hidden=8192)


# ---------------------------------------------------------------------------------------------- trim-gguf
def trim_gguf(src: str, dst: str, layers: int) -> None:
    """Copies src to dst keeping blocks 0..layers-1 (and every non-block tensor), block_count set to layers."""
    from gguf import GGUFReader, GGUFValueType, GGUFWriter

    r = GGUFReader(src)
    arch = r.fields["general.architecture"].contents()
    w = GGUFWriter(dst, arch)
    for field in r.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        vtype = field.types[0]
        value = field.contents()
        if field.name == f"{arch}.block_count":
            value = layers
        sub = field.types[-1] if vtype == GGUFValueType.ARRAY else None
        w.add_key_value(field.name, value, vtype, sub_type=sub)
    for t in r.tensors:
        if t.name.startswith("blk.") and int(t.name.split(".")[1]) >= layers:
            continue
        w.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


# ---------------------------------------------------------------------------------------------- helpers
def fmt_bytes_per_elem(fmt: int) -> float:
    return {0: 2.0, 1: 1.0, 2: 34 / 32, 3: 18 / 32, 4: 20 / 32}[fmt]


def random_model(cu, shape: dict, fmt: int, *, context: int, num_kv_blocks: int, max_batch_tokens: int = 2048,
                 graphs: bool = True, seed: int = 1):
    """A cu.Model of `shape` with uniform random weights made on the GPU (no host copies)."""
    config = dict(shape, context_length=context, norm_eps=1e-5, num_kv_blocks=num_kv_blocks, tie_embeddings=1,
                  rope_neox=0, max_batch_tokens=max_batch_tokens, max_seqs=32, max_logits_rows=32,
                  use_graphs=int(graphs))
    inv_freq = np.array([500000.0 ** (-2.0 * i / shape["head_dim"]) for i in range(shape["head_dim"] // 2)])
    m = cu.Model(config, inv_freq)
    d, h, L = shape["dim"], shape["hidden"], shape["n_layers"]
    qkv = (shape["n_heads"] + 2 * shape["n_kv_heads"]) * shape["head_dim"]
    ones = np.ones(d, np.float32)
    m.alloc_weight(cu.W_EMB, 0, fmt, shape["vocab"], d)
    m.random_weight(cu.W_EMB, 0, seed, 1.0)
    m.alloc_weight(cu.W_OUT_NORM, 0, 0, 1, d)
    m.load_weight(cu.W_OUT_NORM, 0, cu.SRC_F32, ones)
    for i in range(L):
        for which, rows, cols in ((cu.W_QKV, qkv, d), (cu.W_O, d, shape["n_heads"] * shape["head_dim"]),
                                  (cu.W_GU, 2 * h, d), (cu.W_DOWN, d, h)):
            m.alloc_weight(which, i, fmt, rows, cols)
            m.random_weight(which, i, seed + 7 * i + which, 1.0 / math.sqrt(cols))
        for which in (cu.W_ATTN_NORM, cu.W_FFN_NORM):
            m.alloc_weight(which, i, 0, 1, d)
            m.load_weight(which, i, cu.SRC_F32, ones)
    m.finish_load()
    return m


def decode_weight_bytes(shape: dict, fmt: int) -> float:
    """Bytes of weights one decode step reads (the tied embedding once, as the LM head)."""
    d, h, L = shape["dim"], shape["hidden"], shape["n_layers"]
    q = shape["n_heads"] * shape["head_dim"]
    per_layer = (q + 2 * shape["n_kv_heads"] * shape["head_dim"]) * d + d * q + 2 * h * d + d * h
    return (L * per_layer + shape["vocab"] * d) * fmt_bytes_per_elem(fmt)


def timed(fn, repeat=3):
    ts = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


# ---------------------------------------------------------------------------------------------- sections
def bench_bandwidth(cu, out):
    bw = cu.copy_bandwidth(1 << 30, 20)
    out["copy_bandwidth_GBps"] = bw / 1e9
    print(f"device-to-device copy: {bw / 1e9:.0f} GB/s (read + write)")
    return bw


def bench_gemv(cu, out, bw, quick):
    info = cu.device_info()
    d, h = LLAMA_1B["dim"], LLAMA_1B["hidden"]
    shapes = {"qkv": (3072, d, False), "o": (d, d, False), "gate_up+swiglu": (2 * h, d, True),
              "down": (d, h, False), "lm_head": (LLAMA_1B["vocab"], d, False)}
    fmts = {"bf16": 0, "int8": 1, "q8_0": 2, "int4": 3, "q4_1": 4}
    rows = []
    for fname, fmt in fmts.items():
        for sname, (N, K, sw) in shapes.items():
            nbytes = N * K * fmt_bytes_per_elem(fmt)
            copies = max(2, min(128, math.ceil(4 * info["l2_bytes"] / nbytes)))
            mats = []
            for c in range(copies):
                m = cu.Mat(fmt, N, K)
                if fmt == 4:   # Q4_1 only by exact copy: random bytes are valid Q4_1 blocks (f16 scales kept tame)
                    m.q.upload(np.random.default_rng(c).integers(0, 256, m.q.nbytes, dtype=np.uint8))
                    m.s.upload(np.full(m.s.nbytes // 2, 0x2000, np.uint16))
                else:
                    m.convert(cu.SRC_RANDOM, None, seed=c + 1, scale=0.05)
                mats.append(m)
            for B in ((1,) if quick else (1, 8)):
                sec = cu.bench_gemv(mats, B, sw, 200 if not quick else 50)
                moved = mats[0].nbytes + B * K * 4 + B * (N // 2 if sw else N) * 4
                gbps = moved / sec / 1e9
                rows.append(dict(format=fname, matrix=sname, N=N, K=K, batch=B, us=sec * 1e6, GBps=gbps,
                                 pct_of_copy=100 * moved / sec / bw))
            del mats
    out["gemv"] = rows
    print("\ndecode GEMV (Llama-3.2-1B shapes)")
    print(f"{'format':7} {'matrix':15} {'B':>3} {'us':>9} {'GB/s':>8} {'% copy':>7}")
    for r in rows:
        print(f"{r['format']:7} {r['matrix']:15} {r['batch']:>3} {r['us']:9.1f} {r['GBps']:8.0f} "
              f"{r['pct_of_copy']:7.1f}")


def bench_decode(cu, out, bw, quick):
    res = []
    contexts = (512,) if quick else (512, 4096)
    for fname, fmt in (("bf16", 0), ("int8", 1), ("int4", 3)):
        m = random_model(cu, LLAMA_1B, fmt, context=8192, num_kv_blocks=32 * (max(contexts) // 64 + 8))
        wbytes = decode_weight_bytes(LLAMA_1B, fmt)
        for ctx in contexts:
            for bs in ((1, 8) if quick else (1, 8, 32)):
                sec = m.time_decode(bs, ctx, 30 if quick else 100)
                r = dict(model="llama-3.2-1b-shape", weights=fname, batch=bs, context=ctx, ms_per_step=sec * 1e3,
                         tok_per_s=bs / sec, weight_GBps=wbytes / sec / 1e9, pct_of_copy=100 * wbytes / sec / bw)
                res.append(r)
        del m
    out["decode"] = res
    print("\ndecode (graph replay), Llama-3.2-1B-shaped random model")
    print(f"{'weights':7} {'ctx':>5} {'B':>3} {'ms/step':>8} {'tok/s':>9} {'wGB/s':>7} {'% copy':>7}")
    for r in res:
        print(f"{r['weights']:7} {r['context']:>5} {r['batch']:>3} {r['ms_per_step']:8.3f} {r['tok_per_s']:9.0f} "
              f"{r['weight_GBps']:7.0f} {r['pct_of_copy']:7.1f}")


def bench_smollm2(cu, out, path, bw):
    from inferd.engine.cuda_engine import CudaEngine
    from inferd.model.loader import load_model

    model = load_model(path)
    res = []
    for wd in ("auto", "bf16", "int8", "int4"):
        eng = CudaEngine(model, num_kv_blocks=64, max_batch_tokens=512, max_seqs=32, weight_dtype=wd)
        for bs in (1, 8, 32):
            sec = eng._m.time_decode(bs, 256, 100)
            res.append(dict(model="smollm2", layers=model.config.n_layers, weights=wd, batch=bs,
                            ms_per_step=sec * 1e3, tok_per_s=bs / sec,
                            weight_GBps=eng.weight_bytes / sec / 1e9))
        del eng
    out["smollm2_decode"] = res
    print(f"\ndecode, SmolLM2 ({path}, {model.config.n_layers} layers)")
    for r in res:
        print(f"{r['weights']:5} B={r['batch']:>2} {r['ms_per_step']:7.3f} ms/step {r['tok_per_s']:9.0f} tok/s "
              f"(~{r['weight_GBps']:.0f} GB/s of weights)")


def bench_prefill(cu, out, quick):
    shape = LLAMA_1B
    res = []
    m = random_model(cu, shape, 0, context=4096, num_kv_blocks=64)
    d, h, L = shape["dim"], shape["hidden"], shape["n_layers"]
    qkv = (shape["n_heads"] + 2 * shape["n_kv_heads"]) * shape["head_dim"]
    gemms = [(qkv, d), (d, shape["n_heads"] * shape["head_dim"]), (2 * h, d), (d, h)]
    W = {nk: cu.DeviceBuffer(nk[0] * nk[1] * 2) for nk in gemms}
    for buf in W.values():
        buf.fill(0x3C)
    for T in ((128, 512) if quick else (128, 512, 2048)):
        tokens = np.random.default_rng(T).integers(0, shape["vocab"], T).astype(np.int32)
        table = np.arange(-(-T // 64), dtype=np.int32)[None]
        params = np.zeros(1, cu.SAMPLE_PARAMS_DTYPE)
        params["top_p"] = 1
        params["repetition_penalty"] = 1

        def step(tokens=tokens, T=T, table=table, params=params):
            m.step(tokens, np.arange(T, dtype=np.int32), np.zeros(T, np.int32), table,
                   np.array([T - 1], np.int32), params, np.zeros(2, np.int32), np.zeros(0, cu.ADJ_DTYPE))

        step()
        sec = timed(step, 3 if quick else 5)
        X = cu.DeviceBuffer(T * max(d, h) * 2)
        X.fill(0x3C)
        C = cu.DeviceBuffer(T * 2 * h * 4)

        def gemms_only(X=X, C=C, T=T):
            for _ in range(L):
                for (N, K) in gemms:
                    cu.gemm_bf16(X, W[(N, K)], C, T, N, K, 0.0, 0)

        gemms_only()
        gsec = timed(gemms_only, 3)
        flops = 2.0 * T * L * sum(N * K for N, K in gemms)
        res.append(dict(tokens=T, ms=sec * 1e3, tok_per_s=T / sec, gemm_only_ms=gsec * 1e3,
                        pct_of_gemm=100 * gsec / sec, gemm_TFLOPs=flops / gsec / 1e12))
    out["prefill"] = res
    print("\nprefill, Llama-3.2-1B-shaped random model, bf16 weights")
    for r in res:
        print(f"T={r['tokens']:5} {r['ms']:8.2f} ms {r['tok_per_s']:9.0f} tok/s; the GEMMs alone (cuBLAS) "
              f"{r['gemm_only_ms']:.2f} ms = {r['pct_of_gemm']:.0f}% ({r['gemm_TFLOPs']:.0f} TFLOP/s)")


def main(argv=None):
    if argv is None:
        argv = sys.argv[1:]
    if argv and argv[0] == "trim-gguf":
        p = argparse.ArgumentParser(prog="cuda.py trim-gguf")
        p.add_argument("src")
        p.add_argument("dst")
        p.add_argument("--layers", type=int, required=True)
        a = p.parse_args(argv[1:])
        trim_gguf(a.src, a.dst, a.layers)
        print(f"wrote {a.dst} ({os.path.getsize(a.dst) / 1e6:.1f} MB, {a.layers} layers)")
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    p.add_argument("--smollm2", default=os.environ.get("INFERD_TEST_SMOLLM2"))
    p.add_argument("--quick", action="store_true")
    p.add_argument("--only", default="bandwidth,gemv,decode,smollm2,prefill")
    a = p.parse_args(argv)
    from inferd import _cuda as cu

    if cu.device_count() == 0:
        print("no CUDA device: nothing to measure")
        return 1
    info = cu.device_info()
    out = {"device": info, "cublas": cu.have_cublas(), "time": time.strftime("%Y-%m-%d %H:%M:%S")}
    print(f"{info['name']} (cc {info['cc'][0]}.{info['cc'][1]}, {info['sm_count']} SMs, "
          f"{info['total_mem'] / 2**30:.0f} GiB, L2 {info['l2_bytes'] / 2**20:.0f} MiB), cuBLAS: {cu.have_cublas()}")
    only = set(a.only.split(","))
    path = os.path.join(a.out, "cuda_bench.json")
    bw = bench_bandwidth(cu, out)
    sections = [("gemv", lambda: bench_gemv(cu, out, bw, a.quick)),
                ("decode", lambda: bench_decode(cu, out, bw, a.quick)),
                ("smollm2", lambda: bench_smollm2(cu, out, a.smollm2, bw) if a.smollm2 else None),
                ("prefill", lambda: bench_prefill(cu, out, a.quick))]
    for name, fn in sections:
        if name not in only:
            continue
        t0 = time.perf_counter()
        try:
            fn()
        except Exception as e:   # keep measuring the rest; the error goes into the results
            out.setdefault("errors", {})[name] = repr(e)
            print(f"{name}: FAILED {e!r}")
        out.setdefault("seconds", {})[name] = time.perf_counter() - t0
        with open(path, "w") as f:
            json.dump(out, f, indent=1, default=str)
    print(f"\nresults: {path}")
    return 0 if "errors" not in out else 2


if __name__ == "__main__":
    sys.exit(main())
