# cython: boundscheck=False, wraparound=False
"""inferd._cuda: a thin wrapper over ext/cuda/inferd_cuda.h.

Device memory is held by DeviceBuffer and Mat objects; kernels take them (or None for a NULL pointer). Every C
call runs without the GIL. Errors raise CudaError with the C side's message."""
from libc.stdint cimport int32_t, uint32_t, uint64_t, uintptr_t
from libc.stdlib cimport malloc, free

import numpy as np

cdef extern from "inferd_cuda.h" nogil:
    int ICU_BLOCK_C "ICU_BLOCK"
    ctypedef struct icu_mat:
        int fmt, rows, cols
        void *q
        void *s
    ctypedef struct icu_sample_params:
        pass
    ctypedef struct icu_adj:
        pass
    ctypedef struct icu_model:
        pass
    ctypedef struct icu_model_config:
        int vocab, dim, n_layers, n_heads, n_kv_heads, head_dim, hidden, context_length
        int qkv_bias, tie_embeddings, rope_neox
        float norm_eps
        int kv_dtype
        int num_kv_blocks
        int max_batch_tokens, max_seqs, max_logits_rows, max_adj
        int split_blocks, max_splits
        int use_graphs, use_pdl
        int gemm_kind
        int gemv_max_tokens
    ctypedef struct icu_batch:
        int num_tokens, num_seqs, num_rows, bt_width, num_adj, num_masks
        const int32_t *tokens
        const int32_t *positions
        const int32_t *seq_of_token
        const int32_t *block_tables
        const int32_t *out_rows
        const icu_sample_params *params
        const int32_t *adj_offset
        const icu_adj *adj
        const uint32_t *masks
        int32_t *out_tokens
        float *out_logprobs
        float *out_logits
        int used_graph

    const char *icu_error_string(int err)
    int icu_device_count(int *count)
    int icu_device_info(int dev, char *name, int name_len, int *cc_major, int *cc_minor, int *sm_count,
                        size_t *total_mem, size_t *l2_bytes)
    int icu_set_device(int dev)
    int icu_malloc(void **p, size_t nbytes)
    int icu_free(void *p)
    int icu_memcpy_h2d(void *dst, const void *src, size_t nbytes)
    int icu_memcpy_d2h(void *dst, const void *src, size_t nbytes)
    int icu_memset(void *p, int value, size_t nbytes)
    int icu_synchronize()
    int icu_copy_bandwidth(size_t nbytes, int iters, double *bytes_per_s)
    size_t icu_mat_q_bytes(int fmt, int rows, int cols)
    size_t icu_mat_s_bytes(int fmt, int rows, int cols)
    int icu_mat_convert(const icu_mat *dst, int row0, int nrows, int src_type, const void *src, size_t src_row_bytes,
                        uint64_t seed, float scale)
    int icu_mat_dequant_bf16(const icu_mat *m, void *dst)
    int icu_gemv(const icu_mat *w, const float *x, int ldx, const float *gamma, float eps, const float *res,
                 int ldres, float *out, int ldo, int B, int swiglu)
    int icu_embed(const icu_mat *emb, const int32_t *tokens, int T, float *x)
    int icu_rmsnorm_bf16(const float *x, const float *gamma, float eps, int T, int dim, void *out)
    int icu_rope_kv(float *qkv, int ldqkv, const float *bias, const int32_t *positions, const int32_t *token_seq,
                    const int32_t *block_tables, const int32_t *bt_width, const double *inv_freq, int n_heads,
                    int n_kv, int head_dim, int neox, int kv_dtype, void *k_cache, void *v_cache, int T)
    int icu_attn_decode(const float *q, int ldq, const void *k_cache, const void *v_cache, int kv_dtype,
                        const int32_t *block_tables, const int32_t *bt_width, const int32_t *positions, int B,
                        int n_heads, int n_kv, int head_dim, float scale, int split_blocks, int max_splits,
                        float *part_o, float *part_ml, float *out, int ldo)
    int icu_attn_prefill(const float *q, int ldq, const void *k_cache, const void *v_cache, int kv_dtype,
                         const int32_t *block_tables, const int32_t *bt_width, const int32_t *seq_qstart,
                         const int32_t *seq_pos0, int S, int max_T, int n_heads, int n_kv, int head_dim, float scale,
                         float *out, int ldo)
    int icu_sample(float *logits, int V, int R, const icu_sample_params *params, const int32_t *adj_offset,
                   icu_adj *adj, const uint32_t *masks, int32_t *out_tokens, float *out_logprobs)
    int icu_gemm_bf16(const void *X, const void *W, float *C, int M, int N, int K, float beta, int kind)
    int icu_have_cublas()
    int icu_model_create(const icu_model_config *cfg, const double *inv_freq, icu_model **out)
    void icu_model_destroy(icu_model *m)
    int icu_model_alloc_weight(icu_model *m, int which, int layer, int fmt, int rows, int cols)
    int icu_model_load_weight(icu_model *m, int which, int layer, int row0, int nrows, int src_type,
                              const void *host, size_t src_row_bytes)
    int icu_model_random_weight(icu_model *m, int which, int layer, uint64_t seed, float scale)
    int icu_model_finish_load(icu_model *m)
    size_t icu_model_weight_bytes(const icu_model *m)
    size_t icu_model_kv_bytes(const icu_model *m)
    int icu_model_step(icu_model *m, icu_batch *b)
    int icu_model_time_decode(icu_model *m, int bs, int context, int iters, double *seconds)
    int icu_bench_gemv(const icu_mat *mats, int n_mats, int B, int swiglu, int iters, double *seconds)

BLOCK_SIZE = ICU_BLOCK_C
BF16, I8, Q8, Q4, Q41 = 0, 1, 2, 3, 4
FORMATS = {"bf16": BF16, "int8": I8, "q8_0": Q8, "int4": Q4, "q4_0": Q4, "q4_1": Q41}
SRC_F32, SRC_F16, SRC_BF16, SRC_Q8_0, SRC_Q4_0, SRC_Q4_1, SRC_RANDOM = 0, 1, 2, 3, 4, 5, 6
SRC_TYPES = {"F32": SRC_F32, "F16": SRC_F16, "BF16": SRC_BF16, "Q8_0": SRC_Q8_0, "Q4_0": SRC_Q4_0, "Q4_1": SRC_Q4_1}
KV_F16, KV_BF16 = 0, 1
W_EMB, W_OUT, W_OUT_NORM, W_ATTN_NORM, W_FFN_NORM, W_QKV, W_QKV_BIAS, W_O, W_GU, W_DOWN = range(10)
MAX_GRAPH_BATCH = 32

# the C structs, as numpy dtypes (the same field order and sizes)
SAMPLE_PARAMS_DTYPE = np.dtype([("temperature", "<f4"), ("top_p", "<f4"), ("min_p", "<f4"),
                                ("repetition_penalty", "<f4"), ("presence_penalty", "<f4"),
                                ("frequency_penalty", "<f4"), ("top_k", "<i4"), ("position", "<i4"),
                                ("seed", "<u8"), ("has_mask", "<i4"), ("mask_row", "<i4")])
ADJ_DTYPE = np.dtype([("token", "<i4"), ("flags", "<i4"), ("bias", "<f4"), ("saved", "<f4")])


class CudaError(RuntimeError):
    def __init__(self, code, what=""):
        self.code = code
        super().__init__(f"{what}: {icu_error_string(code).decode()} ({code})" if what else
                         f"{icu_error_string(code).decode()} ({code})")


cdef inline int _check(int err, what) except -1:
    if err != 0:
        raise CudaError(err, what)
    return 0


cdef const void *_host(arr) except? NULL:
    """The data pointer of a C-contiguous numpy array (kept alive by the caller)."""
    if arr is None or arr.size == 0:
        return NULL
    if not arr.flags["C_CONTIGUOUS"]:
        raise ValueError("array must be C-contiguous")
    cdef const unsigned char[::1] v = arr.reshape(-1).view(np.uint8)
    return <const void *>&v[0]


def device_count():
    cdef int n = 0
    cdef int err
    with nogil:
        err = icu_device_count(&n)
    return n if err == 0 else 0


def device_info(int dev=0):
    cdef char name[256]
    cdef int major = 0, minor = 0, sms = 0
    cdef size_t mem = 0, l2 = 0
    cdef int err
    with nogil:
        err = icu_device_info(dev, name, 256, &major, &minor, &sms, &mem, &l2)
    _check(err, "device_info")
    return {"name": name.decode(errors="replace"), "cc": (major, minor), "sm_count": sms, "total_mem": mem,
            "l2_bytes": l2}


def set_device(int dev):
    cdef int err
    with nogil:
        err = icu_set_device(dev)
    _check(err, "set_device")


def have_cublas():
    return bool(icu_have_cublas())


def synchronize():
    cdef int err
    with nogil:
        err = icu_synchronize()
    _check(err, "synchronize")


def copy_bandwidth(size_t nbytes, int iters=20):
    """Device-to-device copy: bytes read + written per second (median)."""
    cdef double bw = 0
    cdef int err
    with nogil:
        err = icu_copy_bandwidth(nbytes, iters, &bw)
    _check(err, "copy_bandwidth")
    return bw


cdef class DeviceBuffer:
    """nbytes of device memory."""
    cdef void *ptr
    cdef readonly size_t nbytes

    def __cinit__(self, size_t nbytes):
        cdef int err
        self.ptr = NULL
        self.nbytes = nbytes
        with nogil:
            err = icu_malloc(&self.ptr, nbytes)
        _check(err, f"cudaMalloc({nbytes})")

    def __dealloc__(self):
        if self.ptr != NULL:
            icu_free(self.ptr)
            self.ptr = NULL

    @property
    def address(self):
        return <uintptr_t>self.ptr

    @classmethod
    def from_array(cls, arr):
        arr = np.ascontiguousarray(arr)
        buf = cls(max(arr.nbytes, 1))
        buf.upload(arr)
        return buf

    def upload(self, arr, size_t offset=0):
        arr = np.ascontiguousarray(arr)
        cdef size_t n = arr.nbytes
        if offset + n > self.nbytes:
            raise ValueError(f"{n} bytes at {offset} do not fit in a buffer of {self.nbytes}")
        cdef const void *src = _host(arr)
        cdef int err = 0
        if n:
            with nogil:
                err = icu_memcpy_h2d(<char *>self.ptr + offset, src, n)
        _check(err, "upload")

    def download(self, dtype, shape, size_t offset=0):
        out = np.empty(shape, dtype)
        cdef size_t n = out.nbytes
        if offset + n > self.nbytes:
            raise ValueError(f"{n} bytes at {offset} exceed a buffer of {self.nbytes}")
        cdef void *dst = <void *>_host(out)
        cdef int err = 0
        if n:
            with nogil:
                err = icu_memcpy_d2h(dst, <char *>self.ptr + offset, n)
        _check(err, "download")
        return out

    def fill(self, int byte):
        """Every byte set to `byte` (0xFF poisons float buffers with NaN)."""
        cdef int err
        with nogil:
            err = icu_memset(self.ptr, byte, self.nbytes)
        _check(err, "memset")


cdef inline void *_dev(obj) except? NULL:
    if obj is None:
        return NULL
    if isinstance(obj, DeviceBuffer):
        return (<DeviceBuffer>obj).ptr
    raise TypeError(f"expected a DeviceBuffer or None, got {type(obj).__name__}")


cdef class Mat:
    """A weight matrix in a device format (BF16, I8, Q8, Q4, Q41): data q and scales s."""
    cdef icu_mat m
    cdef readonly DeviceBuffer q
    cdef readonly DeviceBuffer s

    def __cinit__(self, int fmt, int rows, int cols):
        if fmt < 0 or fmt > 4:
            raise ValueError(f"unknown format {fmt}")
        self.m.fmt = fmt
        self.m.rows = rows
        self.m.cols = cols
        self.q = DeviceBuffer(icu_mat_q_bytes(fmt, rows, cols))
        sb = icu_mat_s_bytes(fmt, rows, cols)
        self.s = DeviceBuffer(sb) if sb else None
        self.m.q = self.q.ptr
        self.m.s = self.s.ptr if self.s is not None else NULL

    @property
    def fmt(self):
        return self.m.fmt

    @property
    def shape(self):
        return (self.m.rows, self.m.cols)

    @property
    def nbytes(self):
        return self.q.nbytes + (self.s.nbytes if self.s is not None else 0)

    def upload_raw(self, q, s=None):
        self.q.upload(q)
        if s is not None:
            self.s.upload(s)

    def convert(self, int src_type, src=None, int row0=0, nrows=None, size_t src_row_bytes=0, uint64_t seed=0,
                float scale=1.0):
        """Rows [row0, row0 + nrows) from device buffer `src` in encoding src_type (or random values)."""
        cdef int n = self.m.rows - row0 if nrows is None else nrows
        cdef void *p = _dev(src)
        cdef int err
        with nogil:
            err = icu_mat_convert(&self.m, row0, n, src_type, p, src_row_bytes, seed, scale)
        _check(err, "mat_convert")

    def dequant_bf16(self, DeviceBuffer out):
        cdef int err
        if out.nbytes < <size_t>self.m.rows * self.m.cols * 2:
            raise ValueError("output buffer too small")
        with nogil:
            err = icu_mat_dequant_bf16(&self.m, out.ptr)
        _check(err, "dequant_bf16")


def gemv(Mat w, x, int ldx, gamma, float eps, res, int ldres, out, int ldo, int B, bint swiglu=False):
    cdef void *px = _dev(x)
    cdef void *pg = _dev(gamma)
    cdef void *pr = _dev(res)
    cdef void *po = _dev(out)
    cdef int err
    with nogil:
        err = icu_gemv(&w.m, <float *>px, ldx, <float *>pg, eps, <float *>pr, ldres, <float *>po, ldo, B, swiglu)
    _check(err, "gemv")


def bench_gemv(mats, int B, bint swiglu=False, int iters=100):
    """Seconds per GEMV call, rotating over `mats` (all of one shape and format)."""
    cdef int n = len(mats)
    cdef icu_mat *arr = <icu_mat *>malloc(n * sizeof(icu_mat))
    cdef double sec = 0
    cdef int err
    cdef int i
    for i in range(n):
        arr[i] = (<Mat>mats[i]).m
    with nogil:
        err = icu_bench_gemv(arr, n, B, swiglu, iters, &sec)
    free(arr)
    _check(err, "bench_gemv")
    return sec


def embed(Mat emb, tokens, int T, x):
    cdef void *pt = _dev(tokens)
    cdef void *px = _dev(x)
    cdef int err
    with nogil:
        err = icu_embed(&emb.m, <int32_t *>pt, T, <float *>px)
    _check(err, "embed")


def rmsnorm_bf16(x, gamma, float eps, int T, int dim, out):
    cdef void *px = _dev(x)
    cdef void *pg = _dev(gamma)
    cdef void *po = _dev(out)
    cdef int err
    with nogil:
        err = icu_rmsnorm_bf16(<float *>px, <float *>pg, eps, T, dim, po)
    _check(err, "rmsnorm_bf16")


def rope_kv(qkv, int ldqkv, bias, positions, token_seq, block_tables, bt_width, inv_freq, int n_heads, int n_kv,
            int head_dim, bint neox, int kv_dtype, k_cache, v_cache, int T):
    cdef void *p[10]
    p[0] = _dev(qkv); p[1] = _dev(bias); p[2] = _dev(positions); p[3] = _dev(token_seq)
    p[4] = _dev(block_tables); p[5] = _dev(bt_width); p[6] = _dev(inv_freq); p[7] = _dev(k_cache)
    p[8] = _dev(v_cache)
    cdef int err
    with nogil:
        err = icu_rope_kv(<float *>p[0], ldqkv, <float *>p[1], <int32_t *>p[2], <int32_t *>p[3], <int32_t *>p[4],
                          <int32_t *>p[5], <double *>p[6], n_heads, n_kv, head_dim, neox, kv_dtype, p[7], p[8], T)
    _check(err, "rope_kv")


def attn_decode(q, int ldq, k_cache, v_cache, int kv_dtype, block_tables, bt_width, positions, int B, int n_heads,
                int n_kv, int head_dim, float scale, int split_blocks, int max_splits, part_o, part_ml, out, int ldo):
    cdef void *p[9]
    p[0] = _dev(q); p[1] = _dev(k_cache); p[2] = _dev(v_cache); p[3] = _dev(block_tables); p[4] = _dev(bt_width)
    p[5] = _dev(positions); p[6] = _dev(part_o); p[7] = _dev(part_ml); p[8] = _dev(out)
    cdef int err
    with nogil:
        err = icu_attn_decode(<float *>p[0], ldq, p[1], p[2], kv_dtype, <int32_t *>p[3], <int32_t *>p[4],
                              <int32_t *>p[5], B, n_heads, n_kv, head_dim, scale, split_blocks, max_splits,
                              <float *>p[6], <float *>p[7], <float *>p[8], ldo)
    _check(err, "attn_decode")


def attn_prefill(q, int ldq, k_cache, v_cache, int kv_dtype, block_tables, bt_width, seq_qstart, seq_pos0, int S,
                 int max_T, int n_heads, int n_kv, int head_dim, float scale, out, int ldo):
    cdef void *p[8]
    p[0] = _dev(q); p[1] = _dev(k_cache); p[2] = _dev(v_cache); p[3] = _dev(block_tables); p[4] = _dev(bt_width)
    p[5] = _dev(seq_qstart); p[6] = _dev(seq_pos0); p[7] = _dev(out)
    cdef int err
    with nogil:
        err = icu_attn_prefill(<float *>p[0], ldq, p[1], p[2], kv_dtype, <int32_t *>p[3], <int32_t *>p[4],
                               <int32_t *>p[5], <int32_t *>p[6], S, max_T, n_heads, n_kv, head_dim, scale,
                               <float *>p[7], ldo)
    _check(err, "attn_prefill")


def sample(logits, int V, int R, params, adj_offset, adj, out_tokens, out_logprobs, masks=None):
    """masks: a device buffer of packed allowed-token rows ((V + 31) // 32 uint32 words each) for the rows whose
    params have has_mask set (their mask_row), or None."""
    cdef void *p[7]
    p[0] = _dev(logits); p[1] = _dev(params); p[2] = _dev(adj_offset); p[3] = _dev(adj); p[4] = _dev(out_tokens)
    p[5] = _dev(out_logprobs)
    p[6] = _dev(masks) if masks is not None else NULL
    cdef int err
    with nogil:
        err = icu_sample(<float *>p[0], V, R, <icu_sample_params *>p[1], <int32_t *>p[2], <icu_adj *>p[3],
                         <const uint32_t *>p[6], <int32_t *>p[4], <float *>p[5])
    _check(err, "sample")


def gemm_bf16(X, W, C, int M, int N, int K, float beta=0.0, int kind=0):
    """C (M, N) float = beta C + X (M, K) bf16 @ W (N, K)^T bf16. kind 0: cuBLAS when built in, 1: our kernel."""
    cdef void *px = _dev(X)
    cdef void *pw = _dev(W)
    cdef void *pc = _dev(C)
    cdef int err
    with nogil:
        err = icu_gemm_bf16(px, pw, <float *>pc, M, N, K, beta, kind)
    _check(err, "gemm_bf16")


CONFIG_FIELDS = ("vocab", "dim", "n_layers", "n_heads", "n_kv_heads", "head_dim", "hidden", "context_length",
                 "qkv_bias", "tie_embeddings", "rope_neox", "norm_eps", "kv_dtype", "num_kv_blocks",
                 "max_batch_tokens", "max_seqs", "max_logits_rows", "max_adj", "split_blocks", "max_splits",
                 "use_graphs", "use_pdl", "gemm_kind", "gemv_max_tokens")


cdef class Model:
    """The C model runner: weights, KV cache, scratch, decode graphs."""
    cdef icu_model *m
    cdef readonly int vocab
    cdef readonly int max_rows

    def __cinit__(self, dict config, inv_freq):
        self.m = NULL
        unknown = set(config) - set(CONFIG_FIELDS)
        if unknown:
            raise ValueError(f"unknown config fields {sorted(unknown)}")
        cdef icu_model_config c
        c.vocab = config["vocab"]; c.dim = config["dim"]; c.n_layers = config["n_layers"]
        c.n_heads = config["n_heads"]; c.n_kv_heads = config["n_kv_heads"]; c.head_dim = config["head_dim"]
        c.hidden = config["hidden"]; c.context_length = config["context_length"]
        c.qkv_bias = config.get("qkv_bias", 0); c.tie_embeddings = config.get("tie_embeddings", 0)
        c.rope_neox = config.get("rope_neox", 0); c.norm_eps = config["norm_eps"]
        c.kv_dtype = config.get("kv_dtype", KV_F16); c.num_kv_blocks = config["num_kv_blocks"]
        c.max_batch_tokens = config.get("max_batch_tokens", 512); c.max_seqs = config.get("max_seqs", 64)
        c.max_logits_rows = config.get("max_logits_rows", 64); c.max_adj = config.get("max_adj", 0)
        c.split_blocks = config.get("split_blocks", 0); c.max_splits = config.get("max_splits", 0)
        c.use_graphs = config.get("use_graphs", 1); c.use_pdl = config.get("use_pdl", 1)
        c.gemm_kind = config.get("gemm_kind", 0); c.gemv_max_tokens = config.get("gemv_max_tokens", 0)
        freq = np.ascontiguousarray(inv_freq, dtype=np.float64)
        if freq.size != c.head_dim // 2:
            raise ValueError(f"inv_freq needs {c.head_dim // 2} values, got {freq.size}")
        cdef const double *pf = <const double *>_host(freq)
        cdef int err
        with nogil:
            err = icu_model_create(&c, pf, &self.m)
        _check(err, "model_create")
        self.vocab = c.vocab
        self.max_rows = max(c.max_logits_rows, MAX_GRAPH_BATCH)

    def __dealloc__(self):
        if self.m != NULL:
            with nogil:
                icu_model_destroy(self.m)
            self.m = NULL

    def alloc_weight(self, int which, int layer, int fmt, int rows, int cols):
        cdef int err
        with nogil:
            err = icu_model_alloc_weight(self.m, which, layer, fmt, rows, cols)
        _check(err, f"alloc_weight({which}, {layer})")

    def load_weight(self, int which, int layer, int src_type, data, int row0=0):
        """data: (rows, bytes per row) uint8, or (rows, cols) float32/uint16, C-contiguous; a 1-D float32 vector
        for norms and biases."""
        data = np.ascontiguousarray(data)
        if data.ndim == 1:
            data = data.reshape(1, -1)
        cdef int nrows = data.shape[0]
        cdef size_t row_bytes = data.nbytes // max(nrows, 1)
        cdef const void *p = _host(data)
        cdef int err
        with nogil:
            err = icu_model_load_weight(self.m, which, layer, row0, nrows, src_type, p, row_bytes)
        _check(err, f"load_weight({which}, {layer})")

    def random_weight(self, int which, int layer, uint64_t seed, float scale):
        cdef int err
        with nogil:
            err = icu_model_random_weight(self.m, which, layer, seed, scale)
        _check(err, f"random_weight({which}, {layer})")

    def finish_load(self):
        cdef int err
        with nogil:
            err = icu_model_finish_load(self.m)
        _check(err, "finish_load")

    @property
    def weight_bytes(self):
        return icu_model_weight_bytes(self.m)

    @property
    def kv_bytes(self):
        return icu_model_kv_bytes(self.m)

    def step(self, tokens, positions, seq_of_token, block_tables, out_rows, params, adj_offset, adj,
             bint want_logits=False, masks=None):
        """One forward pass + sampling. Returns (tokens, logprobs, logits or None, used_graph). masks: (n,
        (vocab + 31) // 32) uint32 allowed-token rows, row params[r]["mask_row"] for each r with has_mask set."""
        tokens = np.ascontiguousarray(tokens, np.int32)
        positions = np.ascontiguousarray(positions, np.int32)
        seq_of_token = np.ascontiguousarray(seq_of_token, np.int32)
        block_tables = np.ascontiguousarray(block_tables, np.int32)
        out_rows = np.ascontiguousarray(out_rows, np.int32)
        adj_offset = np.ascontiguousarray(adj_offset, np.int32)
        if params.dtype != SAMPLE_PARAMS_DTYPE or adj.dtype != ADJ_DTYPE:
            raise TypeError("params and adj must use SAMPLE_PARAMS_DTYPE and ADJ_DTYPE")
        params = np.ascontiguousarray(params)
        adj = np.ascontiguousarray(adj)
        if block_tables.ndim != 2:
            raise ValueError("block_tables must be 2-D")
        cdef int R = out_rows.shape[0]
        if params.shape[0] != R or adj_offset.shape[0] != R + 1:
            raise ValueError("params and adj_offset must have one entry per logits row (+1)")
        if len(positions) != len(tokens) or len(seq_of_token) != len(tokens):
            raise ValueError("tokens, positions and seq_of_token differ in length")
        if masks is not None:
            masks = np.ascontiguousarray(masks, np.uint32)
            if masks.ndim != 2 or masks.shape[1] != (self.vocab + 31) // 32:
                raise ValueError(f"masks must be (n, {(self.vocab + 31) // 32}) uint32 words")
        cdef int num_masks = 0 if masks is None else masks.shape[0]
        marked = params["has_mask"] != 0
        if marked.any() and (num_masks == 0 or params["mask_row"][marked].min() < 0
                             or params["mask_row"][marked].max() >= num_masks):
            raise ValueError("a row with has_mask needs a mask_row among the masks")
        out_tokens = np.zeros(R, np.int32)
        out_logprobs = np.zeros(R, np.float32)
        logits = np.empty((R, self.vocab), np.float32) if want_logits else None
        cdef icu_batch b
        b.num_tokens = tokens.shape[0]
        b.num_seqs = block_tables.shape[0]
        b.num_rows = R
        b.bt_width = block_tables.shape[1]
        b.num_adj = adj.shape[0]
        b.tokens = <const int32_t *>_host(tokens)
        b.positions = <const int32_t *>_host(positions)
        b.seq_of_token = <const int32_t *>_host(seq_of_token)
        b.block_tables = <const int32_t *>_host(block_tables)
        b.out_rows = <const int32_t *>_host(out_rows)
        b.params = <const icu_sample_params *>_host(params)
        b.adj_offset = <const int32_t *>_host(adj_offset)
        b.adj = <const icu_adj *>_host(adj)
        b.num_masks = num_masks
        b.masks = <const uint32_t *>_host(masks) if num_masks else NULL
        b.out_tokens = <int32_t *>_host(out_tokens)
        b.out_logprobs = <float *>_host(out_logprobs)
        b.out_logits = <float *>_host(logits) if want_logits else NULL
        b.used_graph = 0
        cdef int err
        with nogil:
            err = icu_model_step(self.m, &b)
        _check(err, "model_step")
        return out_tokens, out_logprobs, logits, bool(b.used_graph)

    def time_decode(self, int bs, int context, int iters=50):
        """Seconds per decode step of bs sequences at position context - 1 (graph replay when graphs are on)."""
        cdef double sec = 0
        cdef int err
        with nogil:
            err = icu_model_time_decode(self.m, bs, context, iters, &sec)
        _check(err, "time_decode")
        return sec
