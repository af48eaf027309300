"""CudaEngine: the Engine interface on an NVIDIA GPU (selected by `--device cuda`).

The same contract as inferd.engine.engine.Engine: step(list[SeqInput]) -> list[SeqOutput], one call per
scheduler step, blocks of 64 KV positions. Inside, one C call (inferd._cuda.Model.step, without the GIL) runs the
whole forward pass and the sampler on the GPU: a pure decode batch of up to 32 sequences replays a captured CUDA
graph; everything else runs the same kernels eagerly with tensor-core GEMMs for the projections.

Weights keep their file's format on the GPU when a kernel reads it directly (Q8_0, Q4_0, Q4_1; F16/BF16/F32
become bf16), or are converted on the GPU when weight_dtype asks for bf16, int8 (per-row scale) or int4 (groups
of 32, Q4_0's rule). The KV cache is f16 (as the CPU engine's) or bf16.

Constrained decoding: a sequence's grammar mask (SeqInput.allowed, packed uint32 bits) goes into the same step
call; the GPU sampler gives every token outside it probability 0 before bias, penalties and the draw, as the CPU
sampler does, and top logprobs are taken over the allowed tokens.

Settings (inferd/config.py): cuda_weights (auto|bf16|int8|int4|q8_0), cuda_kv (f16|bf16), cuda_graphs, cuda_pdl,
cuda_gemm (cublas|own: our mma kernel instead of cuBLAS), cuda_device; engine/device.py passes them in.
"""

from __future__ import annotations

import copy
import math

import numpy as np

from inferd._cpu import rope_frequencies
from inferd.engine.batch import EngineShape
from inferd.engine.host_plan import kv_format, penalty_history, sampled_rows, sampling_records, seq_output, step_masks
from inferd.engine.types import MAX_LOGPROBS
from inferd.engine.weights import engine_config
from inferd.model.arch import ATTENTION, FFN_GATED, MODEL_TENSORS
from inferd.model.layers import layer_plan

# most precise first; a fused matrix takes the most precise format among its parts
_PRECISION = ("bf16", "q8_0", "int8", "q4_1", "int4")
_AUTO = {"F32": "bf16", "F16": "bf16", "BF16": "bf16", "Q8_0": "q8_0", "Q4_0": "int4", "Q4_1": "q4_1"}


def _with_cuda_types(model):
    """The model with its matrices of types the CUDA kernels lack (the K-quants, Q5_0/Q5_1, which the CPU engine
    computes natively) re-quantized to Q8_0, one tensor at a time."""
    from inferd.model.quant import requantize

    if all(t.type in _AUTO or t.rows == 1 for t in model.tensors.values()):
        return model
    model = copy.copy(model)
    model.tensors = {n: requantize(t) if t.rows > 1 and t.type not in _AUTO else t for n, t in model.tensors.items()}
    return model


def _cuda():
    try:
        from inferd import _cuda
    except ImportError as e:
        raise RuntimeError(
            "inferd was built without its CUDA backend (inferd._cuda is missing: build with nvcc "
            "on PATH, or INFERD_CUDA=1 to make that an error)"
        ) from e
    return _cuda


def cuda_available() -> bool:
    try:
        return _cuda().device_count() > 0
    except RuntimeError:
        return False


def _vector(t) -> np.ndarray:
    if t.type == "F32":
        return np.ascontiguousarray(t.data, np.float32).reshape(-1)
    if t.type == "F16":
        return t.data.view(np.float16).astype(np.float32).reshape(-1)
    if t.type == "BF16":
        return (t.data.astype(np.uint32) << 16).view(np.float32).reshape(-1)
    raise ValueError(f"{t.name}: a {t.type} vector is not supported by the CUDA engine")


class CudaEngine(EngineShape):
    supports_token_masks = True  # SeqInput.allowed: the GPU sampler applies a grammar's mask

    def __init__(
        self,
        model,
        *,
        num_kv_blocks: int,
        max_batch_tokens: int = 512,
        max_seqs: int = 64,
        threads: int | None = None,
        max_logits_rows: int | None = None,
        weight_dtype: str = "auto",
        kv_dtype: str = "f16",
        device: int = 0,
        use_graphs: bool = True,
        use_pdl: bool = True,
        gemm: str = "cublas",
        kv_cache_dtype: str = "f16",
    ):
        kv = kv_format("cuda", kv_cache_dtype, kv_dtype)
        if model.config.switches():
            raise ValueError(
                f"the CUDA backend does not run {model.config.arch} models yet (they need "
                f"{', '.join(model.config.switches())}); use --device cpu"
            )
        cu = _cuda()
        if cu.device_count() == 0:
            raise RuntimeError("no CUDA device is visible")
        self._cu = cu
        super().__init__(
            model,
            num_kv_blocks=num_kv_blocks,
            max_batch_tokens=max_batch_tokens,
            max_seqs=max_seqs,
            max_logits_rows=max_logits_rows,
        )
        cfg = model.config
        self.threads = threads or 1
        self.weight_dtype = weight_dtype.lower()
        if self.weight_dtype not in ("auto", "bf16", "int8", "int4", "q8_0"):
            raise ValueError(f"weight_dtype must be auto, bf16, int8, int4 or q8_0, not {self.weight_dtype!r}")
        self.kv_dtype = kv
        cu.set_device(device)
        self.device_info = cu.device_info(device)
        self.kernel_path = f"cuda:{self.device_info['name']}"
        graphs, pdl = use_graphs, use_pdl
        gemm_kind = 1 if gemm == "own" else 0
        self.max_adj = max(1 << 16, self.max_logits_rows * 1024)
        model_config = engine_config(cfg)  # the CPU engine's, and its RoPE frequencies (rope.c) below
        config = {
            **{k: v for k, v in model_config.items() if k in cu.CONFIG_FIELDS},  # those the runner reads
            "qkv_bias": int(cfg.qkv_bias),
            "norm_eps": float(cfg.norm_eps),
            "tie_embeddings": int(cfg.tie_embeddings or "output.weight" not in model.tensors),
            "kv_dtype": cu.KV_F16 if kv == "f16" else cu.KV_BF16,
            "num_kv_blocks": num_kv_blocks,
            "max_batch_tokens": max_batch_tokens,
            "max_seqs": max_seqs,
            "max_logits_rows": self.max_logits_rows,
            "max_adj": self.max_adj,
            "use_graphs": int(graphs),
            "use_pdl": int(pdl),
            "gemm_kind": gemm_kind,
        }
        self._m = cu.Model(config, rope_frequencies(model_config))
        self._load(_with_cuda_types(model))
        self.weight_bytes = self._m.weight_bytes
        self.last_step_used_graph = False

    # ---- weights ----

    def _format(self, parts) -> int:
        if self.weight_dtype != "auto":
            name = self.weight_dtype
        else:
            names = []
            for p in parts:
                if p.type not in _AUTO:
                    raise ValueError(f"{p.name}: tensor type {p.type} is not supported by the CUDA engine")
                names.append(_AUTO[p.type])
            name = min(names, key=_PRECISION.index)
            if name == "q4_1" and any(p.type != "Q4_1" for p in parts):
                name = "q8_0"
        return self._cu.FORMATS[name]

    def _matrix(self, which: int, layer: int, parts) -> None:
        cu = self._cu
        rows = sum(p.rows for p in parts)
        cols = parts[0].cols
        if any(p.cols != cols for p in parts):
            raise ValueError(f"cannot fuse {[p.name for p in parts]}: their input widths differ")
        self._m.alloc_weight(which, layer, self._format(parts), rows, cols)
        row0 = 0
        for p in parts:
            self._m.load_weight(which, layer, cu.SRC_TYPES[p.type], p.data, row0)
            row0 += p.rows

    def _load(self, model) -> None:
        cu, cfg, ts = self._cu, self.config, model.tensors
        self._matrix(cu.W_EMB, 0, [ts[MODEL_TENSORS["embedding"]]])
        if MODEL_TENSORS["output"] in ts and not cfg.tie_embeddings:
            self._matrix(cu.W_OUT, 0, [ts[MODEL_TENSORS["output"]]])
        self._vec(cu.W_OUT_NORM, 0, _vector(ts[MODEL_TENSORS["output_norm"]]))
        for i, blocks in enumerate(layer_plan(cfg)):
            for block in blocks:
                t = {role: ts[name] for role, name in block.tensors.items()}
                if block.kind == ATTENTION:
                    self._vec(cu.W_ATTN_NORM, i, _vector(t["norm"]))
                    self._matrix(cu.W_QKV, i, [t["q"], t["k"], t["v"]])
                    if "q_bias" in t:
                        self._vec(cu.W_QKV_BIAS, i, np.concatenate([_vector(t[f"{x}_bias"]) for x in "qkv"]))
                    self._matrix(cu.W_O, i, [t["o"]])
                elif block.kind == FFN_GATED:
                    self._vec(cu.W_FFN_NORM, i, _vector(t["norm"]))
                    self._matrix(cu.W_GU, i, [t["gate"], t["up"]])
                    self._matrix(cu.W_DOWN, i, [t["down"]])
                else:
                    raise ValueError(f"the CUDA engine has no {block.kind} block")
        self._m.finish_load()

    def _vec(self, which: int, layer: int, v: np.ndarray) -> None:
        v = np.ascontiguousarray(v, np.float32)
        self._m.alloc_weight(which, layer, 0, 1, v.size)
        self._m.load_weight(which, layer, self._cu.SRC_F32, v)

    # ---- steps ----

    def step(self, seqs: list, *, want_hidden: bool = False):
        """Runs one forward pass over all sequences and samples. Raises ValueError on a bad batch."""
        if want_hidden:
            raise NotImplementedError("the CUDA engine does not return hidden states")
        if not seqs:
            return []
        b = self.flatten(seqs)
        params, adj_offset, adj, masks, need_logits = self._sampling_arrays(
            seqs, b.rows_of_seq, b.positions, b.out_rows
        )
        out_tok, out_lp, logits, used_graph = self._m.step(
            b.tokens,
            b.positions,
            b.seq_of_token,
            b.block_tables,
            b.out_rows,
            params,
            adj_offset,
            adj,
            need_logits or any(s.want_logits for s in seqs),
            masks=masks,
        )
        self.last_step_used_graph = used_graph

        def top_logprobs(s, r: int, k: int) -> list[tuple[int, float]]:
            k = min(k, MAX_LOGPROBS)
            return _top_logprobs(_masked(logits[r], s.allowed), k) if k > 0 else []

        return [
            seq_output(s, rows, out_tok, out_lp, top_logprobs, logits, copy_logits=True)
            for s, rows in zip(seqs, b.rows_of_seq)
        ]

    def _sampling_arrays(self, seqs, rows_of_seq, positions, out_rows):
        """The GPU sampler's records (cu.SAMPLE_PARAMS_DTYPE), each row's logit adjustments (adj[adj_offset[r]:
        adj_offset[r + 1]], cu.ADJ_DTYPE), the grammars' masks, and whether the step needs the logits back (the top
        logprobs are taken from them on the host)."""
        rows = list(sampled_rows(seqs, rows_of_seq, self.vocab_size))
        params = sampling_records(self._cu.SAMPLE_PARAMS_DTYPE, len(out_rows), rows)
        adj_count = np.zeros(len(out_rows), np.int32)
        entries: list[np.ndarray] = []
        bias_of: dict[int, tuple[np.ndarray | None, np.ndarray | None]] = {}  # per sequence: its logit bias
        for row in rows:
            s, sp, p = row.seq, row.params, params[row.row]
            p["position"] = positions[out_rows[row.row]] + 1
            if row.mask_row >= 0:
                p["has_mask"], p["mask_row"] = 1, row.mask_row
            if id(s) not in bias_of:
                bias = sp.logit_bias or {}
                ids = np.array([int(t) for t in bias], np.int64) if bias else None
                values = np.array([float(v) for v in bias.values()], np.float32) if bias else None
                bias_of[id(s)] = (ids, values)
            e = self._adjustments(s, sp, row.k, *bias_of[id(s)])
            if e is not None and len(e):
                entries.append(e)
                adj_count[row.row] = len(e)
        adj_offset = np.zeros(len(out_rows) + 1, np.int32)
        adj_offset[1:] = np.cumsum(adj_count)
        n_adj = int(adj_offset[-1])
        if n_adj > self.max_adj:
            raise ValueError(f"{n_adj} penalised or biased tokens in one step; the engine takes at most {self.max_adj}")
        adj = np.concatenate(entries) if entries else np.zeros(0, self._cu.ADJ_DTYPE)
        need_logits = any(s.params is not None and (s.params.logprobs or 0) > 0 for s in seqs)
        return params, adj_offset, adj, step_masks(rows), need_logits

    def _adjustments(self, s, sp, k, bias_ids, bias_vals):
        """This row's logit adjustments: one entry per distinct biased or penalised token."""
        hist_ids = out_ids = out_counts = None
        if sp.has_penalties:
            hist = np.asarray(penalty_history(s, k), np.int64)
            hist = hist[(hist >= 0) & (hist < self.vocab_size)]
            hist_ids = np.unique(hist)
            out = hist[s.num_prompt :] if s.num_prompt < len(hist) else hist[:0]
            out_ids, out_counts = np.unique(out, return_counts=True)
        if bias_ids is None and hist_ids is None:
            return None
        ids = np.unique(np.concatenate([x for x in (bias_ids, hist_ids) if x is not None]))
        e = np.zeros(len(ids), self._cu.ADJ_DTYPE)
        e["token"] = ids
        if bias_ids is not None:
            b = np.zeros(len(ids), np.float32)
            np.add.at(b, np.searchsorted(ids, bias_ids), bias_vals)  # a repeated id adds up, as on the CPU
            e["bias"] = b
        if hist_ids is not None:
            flags = np.isin(ids, hist_ids).astype(np.int32)
            cnt = np.zeros(len(ids), np.int32)
            assert out_ids is not None and out_counts is not None  # made with hist_ids
            cnt[np.searchsorted(ids, out_ids)] = out_counts
            e["flags"] = flags | (cnt << 1)
        return e


def _masked(row: np.ndarray, allowed: np.ndarray | None) -> np.ndarray:
    """The logits row as the sampler saw it: -inf outside the grammar's packed allowed-token bits."""
    if allowed is None:
        return row
    bits = np.unpackbits(np.ascontiguousarray(allowed, "<u4").view(np.uint8), bitorder="little")[: row.size]
    return np.where(bits.astype(bool), row, np.float32(-np.inf))


def _top_logprobs(row: np.ndarray, k: int) -> list[tuple[int, float]]:
    """The k best tokens and their logprobs; tokens a mask removed (-inf) are never listed, so fewer may come."""
    m = float(row.max())
    lse = m + math.log(float(np.exp((row - m).astype(np.float64)).sum()))
    idx = np.argpartition(-row, k - 1)[:k] if k < row.size else np.arange(row.size)
    order = sorted((i for i in idx.tolist() if row[i] != -np.inf), key=lambda i: (-row[i], i))
    return [(int(i), float(row[i]) - lse) for i in order]
