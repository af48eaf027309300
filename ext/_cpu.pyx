# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""inferd._cpu: thin wrapper over the C engine in ext/cpu. Typed buffers in, `with nogil:` around every
C call; all validation that needs Python objects happens here, the C side checks the batch again."""
import numpy as np
cimport numpy as cnp
from libc.stdlib cimport calloc, free, malloc
from libc.math cimport sqrtf
from libc.string cimport memset
from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t, SIZE_MAX

from cinferd cimport *

cnp.import_array()

# the weight types by GGUF name, from the C engine's type-traits table (ext/cpu/type_traits.c), in WT_ order
WEIGHT_TYPES = {weight_type_name(t).decode(): t for t in range(NUM_WEIGHT_TYPES) if weight_type_name(t) != NULL}
FLOAT_WEIGHT_TYPES = tuple(name for name, t in WEIGHT_TYPES.items() if not weight_is_quantized(t))
# the C header's enums (through cinferd.pxd), by name
PATHS = {"scalar": PATH_SCALAR, "avx2": PATH_AVX2, "avx512vnni": PATH_AVX512VNNI, "avxvnni": PATH_AVXVNNI}
BLOCK_SIZE = KV_BLOCK
MAX_RUN_TOKENS = ATTN_MAX_TOKENS
SEGMENT_BLOCKS = ATTN_SEGMENT_BLOCKS
KV_DTYPES = {"f16": KV_F16, "bf16": KV_BF16, "q8_0": KV_Q8_0}   # the KV cache's formats (kv_cache_dtype)


def kv_bytes_per_value(str kv_dtype):
    """Bytes the cache spends per K or V value: 2 (f16, bf16), 34/32 (q8_0: an int8 and a share of an f16 scale)."""
    if kv_dtype not in KV_DTYPES:
        raise ValueError(f"kv_cache_dtype must be one of {', '.join(KV_DTYPES)}, got {kv_dtype!r}")
    return 34 / 32 if kv_dtype == "q8_0" else 2.0
MAX_LOGPROBS = MAX_TOP_LOGPROBS


def best_path():
    return cpu_path_name(cpu_best_path()).decode()


def get_path():
    return cpu_path_name(cpu_path()).decode()


def set_path(str name):
    """Force a kernel path ('scalar', 'avx2', 'avx512vnni', 'avxvnni', or 'vnni' for whichever VNNI the CPU has);
    ValueError if this CPU lacks it."""
    if name == "vnni":
        name = "avxvnni" if cpu_set_path(PATHS["avxvnni"]) == 0 else "avx512vnni"
    if name not in PATHS or cpu_set_path(PATHS[name]) != 0:
        raise ValueError(f"kernel path {name!r} is not available on this CPU")


include "kernel_config.pxi"


def measure_read_bandwidth(size_t nbytes=256 << 20, int threads=1, int repeats=3):
    """Streaming read bandwidth in bytes/s (best of `repeats` passes over `nbytes` with `threads` threads)."""
    cdef double bw
    with nogil:
        bw = read_bandwidth(nbytes, threads, repeats)
    if bw < 0:
        raise MemoryError(f"cannot allocate {nbytes} bytes to measure bandwidth")
    return bw


cdef extern from *:
    """
    #if defined(__GLIBC__)
    #include <malloc.h>
    static int inferd_set_mmap_threshold(int nbytes) { return mallopt(M_MMAP_THRESHOLD, nbytes); }
    static int inferd_release_free_memory(void) { return malloc_trim(0); }
    #else
    static int inferd_set_mmap_threshold(int nbytes) { (void)nbytes; return 0; }
    static int inferd_release_free_memory(void) { return 0; }
    #endif
    """
    int inferd_set_mmap_threshold(int nbytes)
    int inferd_release_free_memory() nogil


def set_mmap_threshold(int nbytes):
    """Fix glibc malloc's mmap threshold (blocks of nbytes and more are mmapped and returned to the kernel on
    free). False where the C library is not glibc or refused."""
    return bool(inferd_set_mmap_threshold(nbytes))


def release_free_memory():
    """Hand the heap's free pages back to the kernel (glibc keeps freed chunks below its mmap threshold, which
    grows as big buffers are freed: a dropped model's weights would stay in RSS). True if any were returned."""
    cdef int released
    with nogil:
        released = inferd_release_free_memory()
    return bool(released)


def row_bytes(str type_name, int cols):
    return gguf_row_bytes(WEIGHT_TYPES[type_name], cols)


def quantize(cnp.ndarray x, str type_name):
    """(rows, cols) float32 -> (rows, bytes_per_row) uint8 in GGUF block layout (Q4_0, Q4_1, Q8_0)."""
    if type_name not in ("Q4_0", "Q4_1", "Q8_0"):
        raise ValueError(f"cannot quantize to {type_name}")
    cdef const float[:, ::1] xv = np.ascontiguousarray(x, dtype=np.float32)
    cdef int rows = xv.shape[0], cols = xv.shape[1], t = WEIGHT_TYPES[type_name]
    if cols % 32:
        raise ValueError(f"cannot quantize rows of {cols} values: a multiple of 32 is needed")
    out = np.empty((rows, gguf_row_bytes(t, cols)), dtype=np.uint8)
    cdef uint8_t[:, ::1] ov = out
    if rows:
        with nogil:
            quantize_rows_gguf(&xv[0, 0], rows, cols, t, &ov[0, 0])
    return out


def quantize_activations(cnp.ndarray x):
    """(n,) float32, n % 32 == 0 -> (d (n/32,), isum (n/32,), qs (n/32, 32), hsum (n/32, 2)) with the active
    path."""
    cdef float[::1] xv = np.ascontiguousarray(x, dtype=np.float32)
    cdef int n = xv.shape[0], nb = n // 32, i
    if n % 32 or n == 0:
        raise ValueError("length must be a positive multiple of 32")
    cdef block_q8x *blocks = <block_q8x *>malloc(nb * sizeof(block_q8x))
    with nogil:
        quantize_act(&xv[0], n, blocks)
    d = np.empty(nb, np.float32); isum = np.empty(nb, np.int32); qs = np.empty((nb, 32), np.int8)
    hsum = np.empty((nb, 2), np.int32)
    for i in range(nb):
        d[i] = blocks[i].d
        isum[i] = blocks[i].isum
        qs[i] = [blocks[i].qs[j] for j in range(32)]
        hsum[i] = [blocks[i].hsum[0], blocks[i].hsum[1]]
    free(blocks)
    return d, isum, qs, hsum


cdef list spec_parts(tuple spec):
    """A weight spec is (type_name, rows, cols, data), or ("parts", [such tuples], interleave): the row-wise
    concatenation of the parts, or with interleave > 0 their groups of that many rows in turn (group 0 of every
    part, then group 1, ...). Returns the list of parts."""
    if spec[0] == "parts":
        return list(spec[1])
    return [spec]


cdef int spec_segments(tuple spec, int *types, int *rows) except -1:
    """The segments (types, rows) of the weight a spec builds; their number (0 for a bad spec)."""
    parts = spec_parts(spec)
    cdef int n = 0
    for part in parts:
        if part[0] not in WEIGHT_TYPES or part[2] != parts[0][2]:
            return 0
    interleave = spec[2] if spec[0] == "parts" else 0
    if interleave and any(part[0] != parts[0][0] for part in parts):
        return 0
    for part in parts:
        if n and types[n - 1] == WEIGHT_TYPES[part[0]]:
            rows[n - 1] += part[1]
            continue
        if n == MAX_SEGMENTS:
            return 0
        types[n] = WEIGHT_TYPES[part[0]]
        rows[n] = part[1]
        n += 1
    return n


cdef size_t layout_bytes(tuple spec) except? 0:
    """Bytes of the engine's layout of a spec, rounded up to 64; 0 if it is bad."""
    cdef int types[MAX_SEGMENTS]
    cdef int rows[MAX_SEGMENTS]
    cdef int n = spec_segments(spec, types, rows)
    if n == 0:
        return 0
    return (weight_layout_bytes_seg(n, types, rows, spec_parts(spec)[0][2]) + 63) & ~(<size_t>63)


cdef list weight_setup(weight_t *w, tuple spec, uint8_t *dst):
    """Lays out the weight of `spec` (see spec_parts) in dst: layout_bytes(spec) of memory (NULL: its own). Returns
    its parts' fills, each (source array, rows, first row, group, group stride, what it is), for init_weight or a
    Model's list of fill jobs."""
    cdef int types[MAX_SEGMENTS]
    cdef int rows[MAX_SEGMENTS]
    parts = spec_parts(spec)
    cdef int n = spec_segments(spec, types, rows), cols = parts[0][2], rc, row0 = 0, interleave = 0, i
    what = " + ".join(f"{p[0]} {p[1]}x{p[2]}" for p in parts)
    if n == 0:
        raise ValueError(f"weight {what} is not supported by the engine")
    rc = weight_init_seg(w, n, types, rows, cols, dst)  # quick, and with the GIL: see Model._fill_weights
    if rc == -2:
        raise MemoryError(f"out of memory for weight {what}")
    if rc:
        raise ValueError(f"bad weight shape {what}")
    if spec[0] == "parts":
        interleave = spec[2]
    fills = []
    cdef int prows
    for i, part in enumerate(parts):
        arr = np.ascontiguousarray(part[3])
        prows = part[1]
        if arr.nbytes != gguf_row_bytes(WEIGHT_TYPES[part[0]], cols) * prows:
            weight_free(w)
            raise ValueError(f"bad {part[0]} weight {prows}x{cols} ({arr.nbytes} bytes)")
        fills.append((arr, prows, (i * interleave) if interleave else row0, interleave if interleave else prows,
                      interleave * len(parts) if interleave else prows,
                      f"part {i} of weight {what} (interleave {interleave})"))
        row0 += prows
    return fills


cdef int init_weight(weight_t *w, tuple spec, uint8_t *dst=NULL, pool_t *pool=NULL) except -1:
    """Builds the weight of `spec` in dst (see weight_setup), repacking each part's GGUF rows straight from its
    array (a view over the mapped file) with the pool's threads."""
    cdef cnp.ndarray arr
    cdef int prows, row0, group, stride, rc
    for arr, prows, row0, group, stride, what in weight_setup(w, spec, dst):
        with nogil:
            rc = weight_fill(w, arr.data, prows, row0, group, stride, pool)
        if rc:
            weight_free(w)
            raise ValueError(f"cannot place {what}")
    return 0


cdef class Weight:
    """One weight matrix in the engine's tile layout, with kernel settings of its own (kernels); for kernel tests and
    benchmarks."""
    cdef weight_t w
    cdef kernel_config_t kc

    def __init__(self, str type_name, int rows, int cols, data, parts=None, int interleave=0):
        """A weight of one type; or with type_name "parts", the fused weight of `parts` ((type, rows, cols, data)
        tuples; see spec_parts)."""
        kernel_config_default(&self.kc)
        if type_name == "parts":
            init_weight(&self.w, ("parts", list(parts), interleave))
        else:
            init_weight(&self.w, (type_name, rows, cols, data))

    def __dealloc__(self):
        weight_free(&self.w)

    @property
    def nbytes(self):
        return self.w.nbytes

    @property
    def kernels(self):
        """The kernel settings matmul runs with (KernelConfig)."""
        return KernelConfig.of(&self.kc, self)

    def dequantize(self):
        out = np.empty((self.w.rows, self.w.cols), np.float32)
        cdef float[:, ::1] ov = out
        cdef int r
        with nogil:
            for r in range(self.w.rows):
                weight_dequant_row(&self.w, r, &ov[r, 0])
        return out

    def matmul(self, cnp.ndarray x, cnp.ndarray y=None):
        """y (ntok, rows) = x (ntok, cols) @ W.T with the active path's kernels (bound again when set_path changed it
        since), single-threaded; y += when given."""
        cdef float[:, ::1] xv = np.ascontiguousarray(x, dtype=np.float32)
        cdef int ntok = xv.shape[0], t, nb = self.w.cols // 32, acc = y is not None
        if xv.shape[1] != self.w.cols:
            raise ValueError(f"x has {xv.shape[1]} columns, the weight {self.w.cols}")
        if y is None:
            y = np.zeros((ntok, self.w.rows), np.float32)
        cdef float[:, ::1] yv = y
        cdef block_q8x *xq = <block_q8x *>malloc(max(1, ntok * nb) * sizeof(block_q8x))
        if self.w.path != cpu_path():
            weight_bind_kernels(&self.w, cpu_path())
        with nogil:
            if weight_is_quantized(self.w.type):
                for t in range(ntok):
                    quantize_act(&xv[t, 0], self.w.cols, xq + t * nb)
            matmul_tiles(&self.kc, &self.w, 0, matmul_num_tiles(&self.w), ntok, &xv[0, 0], xq, &yv[0, 0],
                         self.w.rows, acc)
        free(xq)
        return y


def rms_norm(cnp.ndarray x, cnp.ndarray gamma, float eps):
    cdef const float[::1] xv = np.ascontiguousarray(x, dtype=np.float32)
    cdef const float[::1] gv = np.ascontiguousarray(gamma, dtype=np.float32)
    out = np.empty_like(np.asarray(xv))
    cdef float[::1] ov = out
    with nogil:
        rmsnorm(&xv[0], &gv[0], xv.shape[0], eps, &ov[0])
    return out


def glu(cnp.ndarray g, cnp.ndarray u, str kind):
    """h = act(g) * u with the active path; kind 'swiglu' (silu) or 'geglu' (tanh GELU). Lengths: multiples of 8."""
    cdef const float[::1] gv = np.ascontiguousarray(g, dtype=np.float32)
    cdef const float[::1] uv = np.ascontiguousarray(u, dtype=np.float32)
    cdef int n = gv.shape[0], gelu = kind == "geglu"
    if kind not in ("swiglu", "geglu"):
        raise ValueError(f"unknown gated unit {kind!r}")
    if n % 8 or n == 0 or uv.shape[0] != n:
        raise ValueError("g and u must have the same positive length, a multiple of 8")
    out = np.empty(n, np.float32)
    cdef float[::1] ov = out
    with nogil:
        if gelu:
            geglu(&gv[0], &uv[0], &ov[0], n)
        else:
            swiglu(&gv[0], &uv[0], &ov[0], n)
    return out


def bf16_attention_native():
    """Whether the active path runs the bf16 KV cache's attention on AVX-512 BF16 (VDPBF16PS); elsewhere it runs as
    float fmas, slower than the f16 cache's."""
    return attention_bf16_native() != 0


def kv_bf16_roundtrip(cnp.ndarray x, bint is_k):
    """Rows of x (n, head_dim) stored into slots i % 64 of a bf16 cache's K (is_k) or V slice and read back (tests):
    each value rounded to bf16 as the cache keeps it."""
    cdef const float[:, ::1] xv = np.ascontiguousarray(x, dtype=np.float32)
    cdef int n = xv.shape[0], hd = xv.shape[1], i
    if hd % 2 or hd == 0:
        raise ValueError("head_dim must be even")
    slice_ = np.zeros(KV_BLOCK * hd, np.uint16)
    out = np.empty((n, hd), np.float32)
    cdef uint16_t[::1] sv = slice_
    cdef float[:, ::1] ov = out
    for i in range(n):
        if is_k:
            kv_store_key_bf16(&xv[i, 0], &sv[0], i % KV_BLOCK, hd)
        else:
            kv_store_value_bf16(&xv[i, 0], &sv[0], i % KV_BLOCK, hd)
        kv_load_bf16(&sv[0], hd, i % KV_BLOCK, is_k, &ov[i, 0])
    return out


cdef object pack_bf16_cache(cnp.ndarray cache, bint is_k):
    """(num_blocks, n_kv_heads, 64, head_dim) floats as the bf16 cache's slices, in the f16 cache's shape for K
    (num_blocks, n_kv_heads, head_dim, 64) or V (num_blocks, n_kv_heads, 64, head_dim), as uint16"""
    cdef const float[:, :, :, ::1] cv = np.ascontiguousarray(cache, dtype=np.float32)
    cdef int nb = cv.shape[0], nkv = cv.shape[1], hd = cv.shape[3], b, h, j
    out = np.zeros((nb, nkv, KV_BLOCK * hd), np.uint16)
    cdef uint16_t[:, :, ::1] ov = out
    for b in range(nb):
        for h in range(nkv):
            for j in range(KV_BLOCK):
                if is_k:
                    kv_store_key_bf16(&cv[b, h, j, 0], &ov[b, h, 0], j, hd)
                else:
                    kv_store_value_bf16(&cv[b, h, j, 0], &ov[b, h, 0], j, hd)
    if is_k:
        return out.reshape(nb, nkv, hd, KV_BLOCK)
    return out.reshape(nb, nkv, KV_BLOCK, hd)


def attention(cnp.ndarray q, cnp.ndarray k_cache, cnp.ndarray v_cache, cnp.ndarray block_table, int pos0,
              int seq_len=0, bint causal=True, int window=0, float scale=0.0, int run=ATTN_MAX_TOKENS,
              bint split=False, sinks=None, str kv_dtype="f16"):
    """The attention kernel on its own (tests): q (ntok, n_heads, head_dim) float32 of tokens at positions pos0,
    pos0 + 1, ...; k_cache/v_cache (num_blocks, n_kv_heads, 64, head_dim) float values, stored as the engine's cache
    holds them (kv_dtype "f16": keys transposed; "bf16": rounded into attention_bf16.c's pair layouts); block_table
    int32. Runs of up to `run` tokens (at most ATTN_MAX_TOKENS), all KV heads at once, the active path; split: each
    run as key segments computed apart (attention_segment) and merged (attention_merge), as a decode step split
    across threads does; sinks: (n_heads) attention sinks, or None. Returns (ntok, n_heads, head_dim)."""
    cdef const float[:, :, ::1] qv = np.ascontiguousarray(q, dtype=np.float32)
    if k_cache.ndim != 4 or v_cache.ndim != 4:
        raise ValueError("shapes: q (ntok, n_heads, hd), caches (blocks, n_kv_heads, 64, hd), hd % 64 == 0")
    if kv_dtype not in ("f16", "bf16"):
        raise ValueError(f"kv_dtype must be f16 or bf16, got {kv_dtype!r}")
    if kv_dtype == "bf16":
        kc = pack_bf16_cache(k_cache, True)
        vc = pack_bf16_cache(v_cache, False)
    else:
        kc = np.ascontiguousarray(np.swapaxes(k_cache, 2, 3), dtype=np.float16).view(np.uint16)
        vc = np.ascontiguousarray(v_cache, dtype=np.float16).view(np.uint16)
    cdef const uint16_t[:, :, :, ::1] kv = kc
    cdef const uint16_t[:, :, :, ::1] vv = vc
    cdef const int32_t[::1] bt = np.ascontiguousarray(block_table, dtype=np.int32)
    cdef int ntok = qv.shape[0], n_heads = qv.shape[1], hd = qv.shape[2]
    cdef int n_kv = kv.shape[1], nblocks = kv.shape[0], t, n, seg, nseg
    if np.shape(k_cache) != np.shape(v_cache) or vv.shape[2] != KV_BLOCK or vv.shape[3] != hd or hd % 64 or n_kv == 0 \
            or n_heads % n_kv or ntok == 0:
        raise ValueError("shapes: q (ntok, n_heads, hd), caches (blocks, n_kv_heads, 64, hd), hd % 64 == 0")
    if not 1 <= run <= ATTN_MAX_TOKENS:
        raise ValueError(f"run must be 1..{ATTN_MAX_TOKENS}")
    last = (pos0 + ntok) if causal else seq_len
    if pos0 < 0 or (not causal and seq_len < pos0 + ntok) or (last + KV_BLOCK - 1) // KV_BLOCK > bt.shape[0] \
            or any(not 0 <= b < nblocks for b in np.asarray(bt)[:(last + KV_BLOCK - 1) // KV_BLOCK]):
        raise ValueError("the block table does not cover the keys, or names a block that does not exist")
    cdef attn_span_t span
    span.seq_len = seq_len; span.causal = causal; span.window = window; span.bf16 = kv_dtype == "bf16"
    span.scale = scale if scale > 0 else 1.0 / np.sqrt(hd)
    sink_arr = None if sinks is None else np.ascontiguousarray(sinks, dtype=np.float32).reshape(-1)
    if sink_arr is not None and sink_arr.shape[0] != n_heads:
        raise ValueError(f"sinks: one per query head ({n_heads})")
    cdef float *sink_ptr = NULL
    if sink_arr is not None:
        sink_ptr = <float *>cnp.PyArray_DATA(sink_arr)
    span.sinks = sink_ptr
    out = np.zeros((ntok, n_heads, hd), np.float32)
    cdef float[:, :, ::1] ov = out
    cdef float *scratch = <float *>malloc(attention_scratch_floats(n_heads, hd) * sizeof(float))
    span.pos0 = pos0 + ntok - 1
    cdef int max_seg = attention_num_segments(&span, 1)
    cdef size_t part = attention_part_floats(run * n_heads, hd)
    cdef float *parts = <float *>malloc(max(1, max_seg) * part * sizeof(float)) if split else NULL
    with nogil:
        t = 0
        while t < ntok:
            n = ntok - t if ntok - t < run else run
            span.pos0 = pos0 + t
            if split:
                nseg = attention_num_segments(&span, n)
                for seg in range(nseg):
                    attention_segment(&qv[t, 0, 0], n_heads * hd, n, n_heads // n_kv, n_kv, n_kv, hd,
                                      &kv[0, 0, 0, 0], &vv[0, 0, 0, 0], &bt[0], &span, seg, parts + seg * part,
                                      scratch)
                attention_merge(parts, part, nseg, n, n_heads // n_kv, n_kv, hd, &ov[t, 0, 0], n_heads * hd,
                                sink_ptr)
            else:
                attention_tokens(&qv[t, 0, 0], n_heads * hd, n, n_heads // n_kv, n_kv, n_kv, hd, &kv[0, 0, 0, 0],
                                 &vv[0, 0, 0, 0], &bt[0], &span, &ov[t, 0, 0], n_heads * hd, scratch, NULL, NULL)
            t += n
    free(scratch)
    free(parts)
    return out


cdef int fill_model_config(model_config_t *c, dict config) except -1:
    """model_config_t from inferd.engine.weights.engine_config()'s dict."""
    c.vocab = config["vocab"]; c.dim = config["dim"]; c.n_layers = config["n_layers"]
    c.n_heads = config["n_heads"]; c.n_kv_heads = config["n_kv_heads"]; c.head_dim = config["head_dim"]
    c.hidden = config["hidden"]; c.context_length = config["context_length"]
    c.norm_eps = config["norm_eps"]; c.rope_theta = config["rope_theta"]
    c.rope_factor = config.get("rope_factor", 0.0)
    c.rope_low_freq_factor = config.get("rope_low_freq_factor", 1.0)
    c.rope_high_freq_factor = config.get("rope_high_freq_factor", 4.0)
    c.rope_original_ctx = config.get("rope_original_ctx", 8192)
    c.rope_freq_scale = config.get("rope_freq_scale", 0.0)
    c.rope_theta_local = config.get("rope_theta_local", 0.0)
    c.yarn_factor = config.get("yarn_factor", 0.0)
    c.yarn_ext_factor = config.get("yarn_ext_factor", 1.0)
    c.yarn_attn_factor = config.get("yarn_attn_factor", 1.0)
    c.yarn_beta_fast = config.get("yarn_beta_fast", 32.0)
    c.yarn_beta_slow = config.get("yarn_beta_slow", 1.0)
    c.yarn_original_ctx = config.get("yarn_original_ctx", 0)
    if c.yarn_factor > 0 and (c.yarn_original_ctx <= 0 or c.yarn_beta_fast <= 0 or c.yarn_beta_slow <= 0):
        raise ValueError("YaRN rope scaling needs its original context length and positive betas")
    c.embed_scale = config.get("embed_scale", 0.0)
    c.logit_softcap = config.get("logit_softcap", 0.0)
    c.rope_dims = config.get("rope_dims", 0)
    return 0


# the block kinds a layer can hold (inferd/model/arch.py names them), and those this build runs
BLOCK_KINDS = {"attention": BLOCK_ATTENTION, "ffn_gated": BLOCK_FFN_GATED, "ffn_moe": BLOCK_FFN_MOE,
               "recurrent": BLOCK_RECURRENT}
BUILT_BLOCK_KINDS = ("attention", "ffn_gated", "ffn_moe", "recurrent")
FFN_ACTS = {"silu": ACT_SILU, "gelu_tanh": ACT_GELU_TANH, "swiglu_oai": ACT_SWIGLU_OAI}
MOE_GATINGS = {"softmax": MOE_GATING_SOFTMAX, "topk_softmax": MOE_GATING_TOPK_SOFTMAX}


def rope_frequencies(dict config):
    """(head_dim/2) float64 RoPE frequencies of the global layers, llama3 scaling included: the CPU engine's own
    (rope.c), for the CUDA engine."""
    cdef model_config_t c
    memset(&c, 0, sizeof(c))
    fill_model_config(&c, config)
    if c.head_dim < 2 or c.head_dim > 512 or c.head_dim % 2:
        raise ValueError(f"head_dim {c.head_dim} is not an even number up to 512")
    out = np.empty(c.head_dim // 2, np.float64)
    cdef double[::1] ov = out
    rope_frequencies_c(&c, c.rope_theta, c.rope_factor > 0, &ov[0])
    return out


cdef double FILL_PROGRESS_S = 0.25  # how long a fill runs without the GIL before Model's progress callback

cdef class Model:
    """The weights in the engine's layout. `config` is a dict of model_config_t fields; `tensors` maps names to
    (type_name, rows, cols, data): 'tok_embd', 'output' (absent when tied), 'output_norm'. `layers`: per layer its
    blocks in order, each (kind, options, tensors) as inferd.engine.weights builds them from the architecture table:
    every block has tensors 'norm' and optionally 'post_norm'; "attention" has 'wqkv', 'wo', optionally 'qkv_bias',
    'o_bias', 'sinks' and 'q_norm' + 'k_norm', and options rope_neox, window (0: global), scale (0: 1/sqrt(head_dim)), qk_norm_full
    (q_norm and k_norm over all of q and k); "ffn_gated" has 'wgu', 'wdown' and option act ("silu" or "gelu_tanh");
    "ffn_moe" has 'router', 'experts_gu' and 'experts_down' (a spec per expert), optionally 'shared_gate' +
    'shared_gu' + 'shared_down' and the biases 'router_bias', 'gate_bias' + 'up_bias' + 'down_bias', and options act,
    n_used, norm_topk, weights_scale, gating (moe.pxi)."""
    cdef model_t m
    cdef list _keep
    cdef uint8_t *arena           # every weight, one after another, in huge pages where possible (hugemem.c)
    cdef size_t arena_bytes, arena_used
    cdef huge_collapser_t *collapser   # turns the arena into huge pages once built, beside whatever runs next
    cdef bint collapse_started
    cdef pool_t *load_pool        # repacks the rows of each weight while __init__ runs
    cdef object progress, file_pages
    cdef list _fills              # the weights' fills, laid out as the blocks are built, done together at the end

    def __init__(self, dict config, dict tensors, list layers, int threads=1, progress=None, file_pages=None,
                 bint huge_pages_now=True):
        """threads: repack with this many threads; progress(done_bytes, total_bytes) is called as the weights are
        filled (about every FILL_PROGRESS_S); file_pages(array) names the whole pages (address, bytes) of a file
        mapping a source array lies in, or None: they leave the resident set once their weight is built.
        huge_pages_now: the weights' move into 2 MB pages starts as the build ends; else at start_huge_pages()."""
        cdef model_config_t *c = &self.m.cfg
        fill_model_config(c, config)
        if c.head_dim % 8 or c.head_dim > 512 or c.n_heads % c.n_kv_heads:
            raise ValueError("unsupported head layout")
        if c.dim % 32 or c.hidden % 32:
            raise ValueError(f"dim {c.dim} and hidden {c.hidden} must be multiples of 32 (8-bit activation blocks)")
        if len(layers) != c.n_layers:
            raise ValueError(f"{len(layers)} layers described for a model of {c.n_layers}")
        for i, blocks in enumerate(layers):
            if not 0 < len(blocks) <= MAX_LAYER_BLOCKS:
                raise ValueError(f"layer {i}: {len(blocks)} blocks (1 to {MAX_LAYER_BLOCKS})")
            for kind, options, ts in blocks:
                if kind not in BLOCK_KINDS:
                    raise ValueError(f"layer {i}: unknown block kind {kind!r}")
                if kind not in BUILT_BLOCK_KINDS:
                    raise ValueError(f"layer {i}: {kind} blocks are not built yet")
                if kind == "ffn_moe":
                    moe_block_check(i, ts)
                if kind == "recurrent":
                    gdn_block_check(i, options, ts)
        self._keep = []
        self.m.layers = <layer_t *>calloc(c.n_layers, sizeof(layer_t))
        if self.m.layers == NULL:
            raise MemoryError()
        matrices = [tensors["tok_embd"]] + ([tensors["output"]] if "output" in tensors else [])
        for blocks in layers:
            for _, _, ts in blocks:
                matrices += [ts[n] for n in ("wqkv", "wo", "wgu", "wdown", "router", "shared_gu", "shared_down",
                                             "wgate", "win", "wba", "wout") if n in ts]
                matrices += ts.get("experts_gu", []) + ts.get("experts_down", [])
        self.arena_bytes = sum(layout_bytes(spec) for spec in matrices)
        self.arena = <uint8_t *>huge_alloc(self.arena_bytes)
        if self.arena == NULL:
            raise MemoryError(f"out of memory for {self.arena_bytes} bytes of weights")
        self.progress = progress
        self.file_pages = file_pages
        self._fills = []
        if threads > 1:
            self.load_pool = pool_create(threads)
        try:
            self._build(c, tensors, layers)
        finally:
            if self.load_pool != NULL:
                pool_destroy(self.load_pool)
                self.load_pool = NULL
            self.progress = self.file_pages = self._fills = None
        if huge_pages_now:
            self.start_huge_pages()

    def start_huge_pages(self):
        """Starts the weights' move into 2 MB pages on a low-priority thread of its own (once). A server starts it
        once ready: its compaction of memory beside a start's Python (the tokenizer's build, the warm-up) made
        their page faults wait on it wherever memory was fragmented."""
        if not self.collapse_started:
            self.collapse_started = True
            self.collapser = huge_collapse_start(self.arena, self.arena_bytes)

    cdef _build(self, model_config_t *c, dict tensors, list layers):
        self._init_weight(&self.m.tok_embd, tensors["tok_embd"])
        if "output" in tensors:
            self._init_weight(&self.m.output, tensors["output"])
        else:
            self.m.output = self.m.tok_embd
            self.m.output_tied = 1
        self.m.output_norm = self._floats(tensors["output_norm"], c.dim)
        cdef int i, j
        for i in range(c.n_layers):
            for j, block in enumerate(layers[i]):
                self.m.layers[i].n_blocks = j + 1     # first: a block that fails half-built is freed too
                self._block(c, &self.m.layers[i].blocks[j], i, block)
                if self.m.layers[i].blocks[j].kind == BLOCK_RECURRENT:
                    self.m.n_recurrent += 1
        if self.m.n_recurrent:                # every recurrent block alike: one slot holds them one after another
            sizes = {gdn_state_floats(&self.m.layers[i].blocks[j].gdn) for i in range(c.n_layers)
                     for j in range(self.m.layers[i].n_blocks) if self.m.layers[i].blocks[j].kind == BLOCK_RECURRENT}
            if len(sizes) != 1:
                raise ValueError("recurrent blocks of different shapes in one model are not supported")
            self.m.state_floats = self.m.n_recurrent * sizes.pop()
        self._fill_weights()
        if model_init_rope(&self.m):
            raise MemoryError()

    cdef _block(self, model_config_t *c, block_t *B, int layer, tuple block):
        kind, options, ts = block
        B.kind = BLOCK_KINDS[kind]
        B.norm = self._floats(ts["norm"], c.dim)
        if "post_norm" in ts:
            B.post_norm = self._floats(ts["post_norm"], c.dim)
        if B.kind == BLOCK_ATTENTION:
            if "qkv_bias" in ts:
                B.attn.qkv_bias = self._floats(ts["qkv_bias"], (c.n_heads + 2 * c.n_kv_heads) * c.head_dim)
            if "o_bias" in ts:
                B.attn.o_bias = self._floats(ts["o_bias"], c.dim)
            if "sinks" in ts:
                B.attn.sinks = self._floats(ts["sinks"], c.n_heads)
            if ("q_norm" in ts) != ("k_norm" in ts):
                raise ValueError(f"layer {layer}: QK-norm needs both q_norm and k_norm")
            B.attn.qk_norm_full = options.get("qk_norm_full", 0)
            if B.attn.qk_norm_full and "qkv_bias" in ts:
                raise ValueError(f"layer {layer}: a QK-norm over the whole of q and k with QKV biases is not built")
            if "q_norm" in ts:
                B.attn.q_norm = self._floats(ts["q_norm"], c.n_heads * c.head_dim if B.attn.qk_norm_full
                                             else c.head_dim)
                B.attn.k_norm = self._floats(ts["k_norm"], c.n_kv_heads * c.head_dim if B.attn.qk_norm_full
                                             else c.head_dim)
            if options["window"] < 0:
                raise ValueError(f"layer {layer}: sliding window {options['window']} (0: none)")
            B.attn.window = options["window"]
            B.attn.rope_neox = options["rope_neox"]
            # the model's own scale, else 1/sqrt(head_dim), in float32 (the block reads it as it is)
            B.attn.scale = options.get("scale", 0.0) or 1.0 / sqrtf(<float>c.head_dim)
            self._init_weight(&B.attn.wqkv, ts["wqkv"])
            self._init_weight(&B.attn.wo, ts["wo"])
            if "wgate" in ts:                 # the output gate: attention * sigmoid(Wgate xn) (Qwen3.5)
                self._init_weight(&B.attn.wgate, ts["wgate"])
                B.attn.gated = 1
        elif B.kind == BLOCK_FFN_MOE:
            moe_block_init(self, c, &B.moe, layer, options, ts)
        elif B.kind == BLOCK_RECURRENT:
            gdn_block_init(self, c, &B.gdn, layer, self.m.n_recurrent, options, ts)
        else:
            if options["act"] not in FFN_ACTS:
                raise ValueError(f"layer {layer}: FFN activation {options['act']!r} (one of {', '.join(FFN_ACTS)})")
            B.ffn.act = FFN_ACTS[options["act"]]
            self._init_weight(&B.ffn.wgu, ts["wgu"])
            self._init_weight(&B.ffn.wdown, ts["wdown"])

    cdef int _init_weight(self, weight_t *w, tuple spec) except -1:
        """Builds the weight in the next piece of the arena (a bad spec raises in init_weight)."""
        cdef size_t n = layout_bytes(spec)
        if self.arena_used + n > self.arena_bytes:
            raise ValueError("weights do not fit the arena they were counted for")
        fills = weight_setup(w, spec, self.arena + self.arena_used if n else NULL)
        self.arena_used += n
        for fill in fills:
            pages = self.file_pages(fill[0]) if self.file_pages is not None else None
            self._fills.append((<size_t>w, *fill, pages or (0, 0), self.arena_used))
        return 0

    cdef _fill_weights(self):
        """Every weight's rows, repacked in calls without the GIL of about FILL_PROGRESS_S each."""
        cdef size_t n = len(self._fills), done = 0, i
        cdef int failed = 0
        cdef weight_fill_job_t *jobs = <weight_fill_job_t *>calloc(n if n else 1, sizeof(weight_fill_job_t))
        cdef cnp.ndarray arr
        if jobs == NULL:
            raise MemoryError()
        try:
            for i, (w, arr, prows, row0, group, stride, what, pages, _) in enumerate(self._fills):
                jobs[i] = weight_fill_job_t(<weight_t *><size_t>w, arr.data, prows, row0, group, stride,
                                            <void *><size_t>pages[0], <size_t>pages[1])
            while done < n:
                with nogil:
                    done += weight_fill_jobs(jobs + done, n - done, self.load_pool, FILL_PROGRESS_S, &failed)
                if failed:
                    raise ValueError(f"cannot place {self._fills[done][6]}")
                if self.progress is not None and done:
                    self.progress(self._fills[done - 1][8], self.arena_bytes)
        finally:
            free(jobs)

    @property
    def weight_buffer(self):
        """(address, bytes) of the memory holding every weight (for the huge-page test)."""
        return <size_t>self.arena, self.arena_bytes

    @property
    def huge_pages(self):
        """Where the weights' move into 2 MB pages stands (hugemem.c): "waiting" (for start_huge_pages),
        "collapsing" (on a low-priority thread; meanwhile the weights work as before, on 4 KB pages), "all",
        "partly" (the kernel refused some pages: they stay on 4 KB pages, which khugepaged may still collapse) or
        "none" (a kernel without MADV_COLLAPSE, or THP off)."""
        if not self.collapse_started:
            return "waiting"
        return HUGE_PAGES_NAMES[huge_collapse_state(self.collapser)]

    def wait_huge_pages(self):
        """Blocks (without the GIL) until the weights' move into huge pages is done (started now if it was
        waiting); returns `huge_pages`."""
        self.start_huge_pages()
        with nogil:
            huge_collapse_wait(self.collapser)
        return self.huge_pages

    cdef float *_floats(self, tuple t, int n) except NULL:
        arr = np.ascontiguousarray(t[3], dtype=np.float32).reshape(-1)
        if arr.shape[0] != n:
            raise ValueError(f"expected {n} values, got {arr.shape[0]}")
        self._keep.append(arr)
        return <float *>cnp.PyArray_DATA(arr)

    cdef size_t _block_weights(self, int layer, bint free_them, bint per_token=False):
        """Bytes of layer's block matrices (per_token: those one token reads, its share of the experts), or
        (free_them) their release."""
        cdef size_t total = 0
        cdef block_t *B
        cdef int j
        for j in range(self.m.layers[layer].n_blocks):
            B = &self.m.layers[layer].blocks[j]
            if B.kind == BLOCK_ATTENTION:
                total += B.attn.wqkv.nbytes + B.attn.wo.nbytes + B.attn.wgate.nbytes
                if free_them:
                    weight_free(&B.attn.wqkv); weight_free(&B.attn.wo); weight_free(&B.attn.wgate)
            elif B.kind == BLOCK_RECURRENT:
                total += gdn_block_weights(&B.gdn, free_them)
            elif B.kind == BLOCK_FFN_GATED:
                total += B.ffn.wgu.nbytes + B.ffn.wdown.nbytes
                if free_them:
                    weight_free(&B.ffn.wgu); weight_free(&B.ffn.wdown)
            elif B.kind == BLOCK_FFN_MOE:
                total += moe_block_weights(&B.moe, free_them, per_token)
        return total

    def __dealloc__(self):
        cdef int i
        weight_free(&self.m.tok_embd)
        if not self.m.output_tied:
            weight_free(&self.m.output)
        if self.m.layers != NULL:
            for i in range(self.m.cfg.n_layers):
                self._block_weights(i, True)
            free(self.m.layers)
        free(self.m.rope_cos_sin)
        free(self.m.rope_cos_sin_local)
        with nogil:
            huge_collapse_end(self.collapser)     # stopped and joined before its memory goes
        huge_free(self.arena, self.arena_bytes)

    @property
    def weight_bytes(self):
        """Bytes of weights one token's step reads (all layers, of a mixture of experts the experts it uses, and the
        output matrix)."""
        cdef size_t total = self.m.output.nbytes
        cdef int i
        for i in range(self.m.cfg.n_layers):
            total += self._block_weights(i, False, True)
        return total

    @property
    def memory_bytes(self):
        cdef size_t total = self.m.output.nbytes + (0 if self.m.output_tied else self.m.tok_embd.nbytes)
        cdef int i
        for i in range(self.m.cfg.n_layers):
            total += self._block_weights(i, False)
        return total


HUGE_PAGES_NAMES = {HUGE_PAGES_COLLAPSING: "collapsing", HUGE_PAGES_ALL: "all", HUGE_PAGES_PARTLY: "partly",
                    HUGE_PAGES_NONE: "none"}


STAGE_NAMES = ("embed", "norm+quantize", "matmul qkv", "rope+kv write", "attention", "matmul wo",
               "matmul gate|up+swiglu", "matmul down", "matmul output", "sample", "moe route", "lora",
               "recurrent delta rule", "matmul recurrent in", "recurrent conv", "matmul recurrent out")


FORWARD_ERRORS = {
    FORWARD_BAD_SIZE: "more tokens or logits rows than the context was made for",
    FORWARD_BAD_TOKEN: "a token id outside the vocabulary",
    FORWARD_BAD_POSITION: "a position outside the context or its sequence's block table",
    FORWARD_BAD_SEQUENCE: "a token's sequence index outside the batch",
    FORWARD_BAD_BLOCK: "a KV block id outside the cache",
    FORWARD_BAD_OUT_ROW: "a logits row that is not a token of the batch",
    FORWARD_BAD_SAMPLE_PARAMS: "sampling parameters point outside the history or logit-bias arrays",
    FORWARD_BAD_MASK_ROW: "a row's mask_row outside token_masks",
    FORWARD_BAD_BLOCK_KIND: "a layer block of a kind this build does not run",
    FORWARD_BAD_LORA: "a sequence's adapter outside the step's adapters or of another model",
    FORWARD_BAD_STATE: "a sequence without a recurrent-state slot, or not continuing its slot's state",
}


def _sample_params_dtype():
    """sample_params_t as a numpy dtype: field offsets and the size are read off the C struct itself, so the
    records Python fills are exactly what the sampler reads."""
    cdef sample_params_t p
    memset(&p, 0, sizeof(p))    # only addresses are read; zeroed so the compiler sees no uninitialised use
    cdef char *base = <char *>&p
    fields = [("temperature", "<f4", <char *>&p.temperature - base), ("top_p", "<f4", <char *>&p.top_p - base),
              ("min_p", "<f4", <char *>&p.min_p - base), ("top_k", "<i4", <char *>&p.top_k - base),
              ("repetition_penalty", "<f4", <char *>&p.repetition_penalty - base),
              ("presence_penalty", "<f4", <char *>&p.presence_penalty - base),
              ("frequency_penalty", "<f4", <char *>&p.frequency_penalty - base),
              ("seed", "<u8", <char *>&p.seed - base), ("num_logprobs", "<i4", <char *>&p.num_logprobs - base),
              ("history_offset", "<i8", <char *>&p.history_offset - base),
              ("history_len", "<i4", <char *>&p.history_len - base),
              ("num_prompt", "<i4", <char *>&p.num_prompt - base),
              ("bias_offset", "<i8", <char *>&p.bias_offset - base), ("bias_len", "<i4", <char *>&p.bias_len - base),
              ("mask_row", "<i4", <char *>&p.mask_row - base)]
    return np.dtype({"names": [f[0] for f in fields], "formats": [f[1] for f in fields],
                     "offsets": [f[2] for f in fields], "itemsize": sizeof(sample_params_t)})


SAMPLE_PARAMS_DTYPE = _sample_params_dtype()


def _as_mask_words(a):
    """A packed mask as uint32 words: llguidance's int32 bitmasks are viewed, not converted."""
    a = np.ascontiguousarray(a)
    if a.dtype not in (np.int32, np.uint32):
        raise ValueError(f"token masks must be int32 or uint32 words, got {a.dtype}")
    return a.view(np.uint32)


def kvq8_pack(cnp.ndarray x, bint is_k):
    """Float rows (blocks, n_kv_heads, 64, head_dim) -> the q8_0 cache's bytes (blocks, n_kv_heads, slice) of K
    (is_k) or V, quantized by the engine's own writer (tests)."""
    cdef const float[:, :, :, ::1] xv = np.ascontiguousarray(x, dtype=np.float32)
    cdef int nb = xv.shape[0], nkv = xv.shape[1], hd = xv.shape[3], b, h, p
    if xv.shape[2] != KV_BLOCK or hd % QK or hd > 512:
        raise ValueError("x must be (blocks, n_kv_heads, 64, head_dim) with head_dim a multiple of 32, <= 512")
    cdef size_t sl = kvq8_slice_bytes(hd)
    out = np.zeros((nb, nkv, sl), np.uint8)
    cdef uint8_t[:, :, ::1] ov = out
    with nogil:
        for b in range(nb):
            for h in range(nkv):
                for p in range(KV_BLOCK):
                    kvq8_store(&xv[b, h, p, 0], hd, &ov[b, h, 0], p, is_k)
    return out


def kvq8_unpack(cnp.ndarray cache, int head_dim, bint is_k):
    """The q8_0 cache's bytes (blocks, n_kv_heads, slice) -> the values they hold, (blocks, n_kv_heads, 64,
    head_dim) float32."""
    cdef const uint8_t[:, :, ::1] cv = np.ascontiguousarray(cache, dtype=np.uint8)
    if head_dim % QK or head_dim > 512 or cv.shape[2] != <Py_ssize_t>kvq8_slice_bytes(head_dim):
        raise ValueError(f"slices of head_dim {head_dim} are {kvq8_slice_bytes(head_dim)} bytes")
    cdef int nb = cv.shape[0], nkv = cv.shape[1], b, h, p
    out = np.empty((nb, nkv, KV_BLOCK, head_dim), np.float32)
    cdef float[:, :, :, ::1] ov = out
    with nogil:
        for b in range(nb):
            for h in range(nkv):
                for p in range(KV_BLOCK):
                    kvq8_load(&cv[b, h, 0], head_dim, p, is_k, &ov[b, h, p, 0])
    return out


def attention_q8(cnp.ndarray q, cnp.ndarray k_cache, cnp.ndarray v_cache, cnp.ndarray block_table, int pos0,
                 int seq_len=0, bint causal=True, int window=0, float scale=0.0, int run=ATTN_MAX_TOKENS,
                 sinks=None):
    """The q8_0 attention kernel on its own (tests): as attention(), with k_cache/v_cache the q8_0 cache's bytes
    (num_blocks, n_kv_heads, slice) from kvq8_pack; runs of up to `run` tokens."""
    cdef const float[:, :, ::1] qv = np.ascontiguousarray(q, dtype=np.float32)
    cdef const uint8_t[:, :, ::1] kv = np.ascontiguousarray(k_cache, dtype=np.uint8)
    cdef const uint8_t[:, :, ::1] vv = np.ascontiguousarray(v_cache, dtype=np.uint8)
    cdef const int32_t[::1] bt = np.ascontiguousarray(block_table, dtype=np.int32)
    cdef int ntok = qv.shape[0], n_heads = qv.shape[1], hd = qv.shape[2]
    cdef int n_kv = kv.shape[1], nblocks = kv.shape[0], t, n
    if kv.shape[0] != vv.shape[0] or kv.shape[1] != vv.shape[1] or kv.shape[2] != vv.shape[2] or hd % QK or hd > 512 \
            or kv.shape[2] != <Py_ssize_t>kvq8_slice_bytes(hd) or n_kv == 0 \
            or n_heads % n_kv or ntok == 0 or not 1 <= run <= ATTN_MAX_TOKENS:
        raise ValueError("shapes: q (ntok, n_heads, hd), caches (blocks, n_kv_heads, kvq8 slice), hd % 32 == 0")
    last = (pos0 + ntok) if causal else seq_len
    if pos0 < 0 or (not causal and seq_len < pos0 + ntok) or (last + KV_BLOCK - 1) // KV_BLOCK > bt.shape[0] \
            or any(not 0 <= b < nblocks for b in np.asarray(bt)[:(last + KV_BLOCK - 1) // KV_BLOCK]):
        raise ValueError("the block table does not cover the keys, or names a block that does not exist")
    cdef attn_span_t span
    span.seq_len = seq_len; span.causal = causal; span.window = window; span.bf16 = 0
    span.scale = scale if scale > 0 else 1.0 / np.sqrt(hd)
    sink_arr = None if sinks is None else np.ascontiguousarray(sinks, dtype=np.float32).reshape(-1)
    if sink_arr is not None and sink_arr.shape[0] != n_heads:
        raise ValueError(f"sinks: one per query head ({n_heads})")
    span.sinks = NULL
    if sink_arr is not None:
        span.sinks = <float *>cnp.PyArray_DATA(sink_arr)
    out = np.zeros((ntok, n_heads, hd), np.float32)
    cdef float[:, :, ::1] ov = out
    cdef float *scratch = <float *>malloc(attention_q8_scratch_floats(n_heads, hd) * sizeof(float))
    if scratch == NULL:
        raise MemoryError()
    with nogil:
        t = 0
        while t < ntok:
            n = ntok - t if ntok - t < run else run
            span.pos0 = pos0 + t
            attention_tokens_q8(&qv[t, 0, 0], n_heads * hd, n, n_heads // n_kv, n_kv, n_kv, hd, &kv[0, 0, 0],
                                &vv[0, 0, 0], &bt[0], &span, &ov[t, 0, 0], n_heads * hd, scratch, NULL, NULL)
            t += n
    free(scratch)
    return out


def mask_words(int vocab):
    """uint32 words in one packed allowed-token bitmask row (bit i & 31 of word i >> 5 allows token i)."""
    return (vocab + 31) // 32


cdef class Context:
    """KV cache + scratch for one model; forward() runs one step (all layers, logits, sampling) in C."""
    cdef context_t *c
    cdef Model model
    cdef readonly int max_tokens, max_out, num_kv_blocks, vocab, n_layers, dim, num_state_slots
    cdef readonly str kv_dtype

    def __init__(self, Model model, int max_tokens, int max_out, int num_kv_blocks, int threads,
                 str kv_dtype="f16", int num_state_slots=0):
        """num_state_slots: sequences a model with recurrent blocks keeps a state for at once (0: one; ignored for
        a model without them)."""
        if max_tokens < 1 or max_out < 1 or num_kv_blocks < 1 or threads < 1:
            raise ValueError("max_tokens, max_out, num_kv_blocks and threads must be positive")
        if kv_dtype not in KV_DTYPES:
            raise ValueError(f"kv_cache_dtype must be one of {', '.join(KV_DTYPES)}, got {kv_dtype!r}")
        if kv_dtype == "q8_0" and model.m.cfg.head_dim % QK:
            raise ValueError(f"kv_cache_dtype q8_0 needs a head dimension that is a multiple of 32; this model's is "
                             f"{model.m.cfg.head_dim}")
        self.model = model
        self.kv_dtype = kv_dtype
        cdef int dtype = KV_DTYPES[kv_dtype]
        if num_state_slots < 0:
            raise ValueError("num_state_slots must be 0 or positive")
        num_state_slots = (num_state_slots or 1) if model.m.n_recurrent else 0
        with nogil:
            self.c = context_create_state(&model.m, max_tokens, max_out, num_kv_blocks, threads, dtype,
                                          num_state_slots)
        if self.c == NULL:
            raise MemoryError(f"cannot allocate the KV cache ({num_kv_blocks} blocks, {kv_dtype}), "
                              f"{num_state_slots} recurrent-state slots and scratch")
        self.num_state_slots = num_state_slots
        self.max_tokens = max_tokens
        self.max_out = min(max_out, max_tokens)
        self.num_kv_blocks = num_kv_blocks
        self.vocab = model.m.cfg.vocab
        self.n_layers = model.m.cfg.n_layers
        self.dim = model.m.cfg.dim

    def __dealloc__(self):
        if self.c != NULL:
            context_free(self.c)

    @property
    def kernels(self):
        """This context's matmul kernel settings (KernelConfig)."""
        return KernelConfig.of(&self.c.kernels, self)

    def forward(self, int32_t[::1] token_ids, int32_t[::1] positions, int32_t[::1] seq_of_token,
                int32_t[:, ::1] block_tables, int32_t[::1] out_rows, int32_t[::1] sample_mask,
                cnp.ndarray params, int32_t[::1] history, int32_t[::1] bias_ids, float[::1] bias_values,
                bint want_logits=False, bint want_hidden=False, token_masks=None, list loras=None,
                lora_of_seq=None, lora_scale_of_seq=None, state_slots=None):
        """Returns (samples, logits or None, hidden or None). `params`: num_out SAMPLE_PARAMS_DTYPE records, whose
        history and bias ranges must lie inside `history` and `bias_ids` (inferd/engine/engine.py builds them).
        token_masks: None or (num_masks, mask_words(vocab)) allowed-token bitmasks; a row whose record has
        mask_row >= 0 samples under that mask (token -1 when it allows nothing). loras: the LoraAdapters of this
        model the step uses, lora_of_seq each sequence's index into them (-1: none) and lora_scale_of_seq the
        scale it applies its adapter with. state_slots: (num_seqs) int32, each sequence's recurrent-state slot (a
        model with recurrent blocks needs them): a sequence whose first token is at position 0 starts its slot
        empty, any other continues it. samples is a dict of arrays: token, logprob, top_ids, top_logprobs (top
        entries past the number of allowed tokens are id -1)."""
        cdef int T = token_ids.shape[0], n_out = out_rows.shape[0], i, rc
        if positions.shape[0] != T or seq_of_token.shape[0] != T or sample_mask.shape[0] != n_out:
            raise ValueError("batch arrays disagree in length")
        if params.dtype != SAMPLE_PARAMS_DTYPE or params.ndim != 1 or params.shape[0] != n_out \
                or not params.flags.c_contiguous:
            raise ValueError(f"params must be {n_out} contiguous SAMPLE_PARAMS_DTYPE records")
        if block_tables.shape[0] < 1 or block_tables.shape[1] < 1:
            raise ValueError("empty block table")
        cdef batch_t b
        memset(&b, 0, sizeof(b))
        b.num_tokens = T
        b.num_seqs = block_tables.shape[0]
        b.token_ids = &token_ids[0]
        b.positions = &positions[0]
        b.seq_of_token = &seq_of_token[0]
        b.block_tables = &block_tables[0, 0]
        b.max_blocks_per_seq = block_tables.shape[1]
        b.num_out = n_out
        cdef const int32_t[::1] slots
        if state_slots is not None:
            slots = np.ascontiguousarray(state_slots, dtype=np.int32)
            if slots.shape[0] != b.num_seqs:
                raise ValueError(f"{slots.shape[0]} state slots for {b.num_seqs} sequences")
            b.state_slots = &slots[0]
        cdef int32_t zero_i = 0
        cdef float zero_f = 0
        b.history = &history[0] if history.shape[0] else &zero_i
        b.bias_ids = &bias_ids[0] if bias_ids.shape[0] else &zero_i
        b.bias_values = &bias_values[0] if bias_values.shape[0] else &zero_f
        b.num_history = history.shape[0]
        b.num_bias = bias_ids.shape[0]
        if bias_values.shape[0] != bias_ids.shape[0]:
            raise ValueError("bias_ids and bias_values disagree in length")
        cdef const uint32_t[:, ::1] masks
        if token_masks is not None:
            masks = _as_mask_words(token_masks)
            if masks.shape[1] != mask_words(self.vocab):
                raise ValueError(f"token_masks rows have {masks.shape[1]} words; the vocabulary of {self.vocab} "
                                 f"needs {mask_words(self.vocab)}")
            if masks.shape[0]:
                b.token_masks = &masks[0, 0]
                b.num_masks = masks.shape[0]
        cdef lora_adapter_t *lora_table = NULL
        cdef sample_out_t *so = <sample_out_t *>calloc(max(n_out, 1), sizeof(sample_out_t))
        if so == NULL:
            raise MemoryError("cannot allocate the step's sample records")
        logits = np.empty((n_out, self.vocab), np.float32) if want_logits and n_out else None
        hidden = np.empty((self.n_layers + 1, T, self.dim), np.float32) if want_hidden else None
        cdef float[:, ::1] lv
        cdef float[:, :, ::1] hv
        try:
            if loras:
                lora_of_seq = np.ascontiguousarray(lora_of_seq, dtype=np.int32)
                lora_scale_of_seq = np.ascontiguousarray(lora_scale_of_seq, dtype=np.float32)
                fill_batch_lora(&b, self.c, loras, lora_of_seq, lora_scale_of_seq, &lora_table)
            if n_out:
                b.out_rows = &out_rows[0]
                b.sample_mask = &sample_mask[0]
                b.params = <const sample_params_t *>cnp.PyArray_DATA(params)
            b.samples = so
            if logits is not None:
                lv = logits
                b.logits_out = &lv[0, 0]
            if hidden is not None:
                hv = hidden
                b.hidden_out = &hv[0, 0, 0]
            with nogil:
                rc = forward(self.c, &b)
            if rc != FORWARD_OK:
                raise ValueError(f"invalid batch: {FORWARD_ERRORS.get(rc, f'code {rc}')}")
            samples = {"token": np.empty(n_out, np.int32), "logprob": np.empty(n_out, np.float32),
                       "top_ids": np.empty((n_out, MAX_TOP_LOGPROBS), np.int32),
                       "top_logprobs": np.empty((n_out, MAX_TOP_LOGPROBS), np.float32)}
            self._read_samples(so, n_out, samples)
            return samples, logits, hidden
        finally:
            free(so)
            free(lora_table)

    def final_hidden(self, int32_t[::1] token_ids, int32_t[::1] positions, int32_t[::1] seq_of_token,
                     int32_t[:, ::1] block_tables):
        """A forward pass without logits or sampling (a chat model embedding its input): (num_tokens, dim), every
        row's hidden state after the final norm. Writes the batch's K/V into the blocks its tables name."""
        cdef int T = token_ids.shape[0], rc
        if positions.shape[0] != T or seq_of_token.shape[0] != T:
            raise ValueError("batch arrays disagree in length")
        if block_tables.shape[0] < 1 or block_tables.shape[1] < 1:
            raise ValueError("empty block table")
        out = np.empty((T, self.dim), np.float32)
        cdef float[:, ::1] ov = out
        cdef batch_t b
        memset(&b, 0, sizeof(b))
        b.num_tokens = T
        b.num_seqs = block_tables.shape[0]
        b.token_ids = &token_ids[0]
        b.positions = &positions[0]
        b.seq_of_token = &seq_of_token[0]
        b.block_tables = &block_tables[0, 0]
        b.max_blocks_per_seq = block_tables.shape[1]
        b.final_out = &ov[0, 0]
        with nogil:
            rc = forward(self.c, &b)
        if rc != FORWARD_OK:
            raise ValueError(f"invalid batch: {FORWARD_ERRORS.get(rc, f'code {rc}')}")
        return out

    @property
    def state_floats(self):
        """Floats of one sequence's recurrent state (0 for a model without recurrent blocks)."""
        return self.model.m.state_floats

    def read_state(self, int slot):
        """(a copy of slot's state, float32 (state_floats), the next position it expects)."""
        if not 0 <= slot < self.num_state_slots:
            raise ValueError(f"state slot {slot} is outside the {self.num_state_slots} slots")
        out = np.empty(self.model.m.state_floats, np.float32)
        cdef float[::1] ov = out
        cdef int32_t pos = 0
        state_slot_read(self.c, slot, &ov[0], &pos)
        return out, int(pos)

    def write_state(self, int slot, cnp.ndarray state, int next_pos):
        """Overwrite slot's state with one read_state gave (a snapshot restored)."""
        if not 0 <= slot < self.num_state_slots:
            raise ValueError(f"state slot {slot} is outside the {self.num_state_slots} slots")
        cdef const float[::1] sv = np.ascontiguousarray(state, dtype=np.float32).reshape(-1)
        if sv.shape[0] != <Py_ssize_t>self.model.m.state_floats:
            raise ValueError(f"a state of this model is {self.model.m.state_floats} floats, got {sv.shape[0]}")
        state_slot_write(self.c, slot, &sv[0], next_pos)

    @property
    def kv_block_bytes(self):
        """Bytes of one KV block's image: every layer's K slab then V slab, in the pool's format (kv_dtype)."""
        return kv_block_bytes(self.c)

    def read_kv_block(self, int block):
        """A copy of KV block `block`'s image (bytes of kv_block_bytes); ValueError for a block outside the cache."""
        if block < 0 or block >= self.num_kv_blocks:
            raise ValueError(f"KV block {block} is outside the cache of {self.num_kv_blocks} blocks")
        cdef size_t n = kv_block_bytes(self.c)
        out = bytearray(n)
        cdef uint8_t[::1] ov = out
        cdef int rc
        with nogil:
            rc = kv_block_read(self.c, block, &ov[0], n)
        if rc != KV_IO_OK:
            raise ValueError(f"cannot read KV block {block} (code {rc})")
        return bytes(out)

    def write_kv_block(self, int block, const uint8_t[::1] data):
        """Overwrite KV block `block` with an image read_kv_block made (of this model and kv_dtype); ValueError for
        a block outside the cache or an image of another length, and nothing is written then."""
        if block < 0 or block >= self.num_kv_blocks:
            raise ValueError(f"KV block {block} is outside the cache of {self.num_kv_blocks} blocks")
        cdef size_t n = data.shape[0]
        if n != kv_block_bytes(self.c):
            raise ValueError(f"a KV block image of this context is {kv_block_bytes(self.c)} bytes, got {n}")
        cdef int rc
        with nogil:
            rc = kv_block_write(self.c, block, &data[0], n)
        if rc != KV_IO_OK:
            raise ValueError(f"cannot write KV block {block} (code {rc})")

    def copy_kv_block(self, int src, int dst):
        """KV block `src`'s contents into block `dst`; ValueError for a block outside the cache."""
        cdef int rc
        with nogil:
            rc = kv_block_copy(self.c, src, dst)
        if rc != KV_IO_OK:
            raise ValueError(f"cannot copy KV block {src} to {dst}: the cache has {self.num_kv_blocks} blocks")

    cdef _read_samples(self, sample_out_t *so, int n, dict samples):
        cdef int32_t[::1] tok = samples["token"]
        cdef float[::1] lp = samples["logprob"]
        cdef int32_t[:, ::1] tid = samples["top_ids"]
        cdef float[:, ::1] tlp = samples["top_logprobs"]
        cdef int i, j
        for i in range(n):
            tok[i] = so[i].token
            lp[i] = so[i].logprob
            for j in range(MAX_TOP_LOGPROBS):
                tid[i, j] = so[i].top_ids[j]
                tlp[i, j] = so[i].top_logprobs[j]

    def set_profiling(self, bint on):
        """Start (and zero) or stop timing each stage of forward()."""
        cdef int i
        self.c.profile_on = on
        if on:
            for i in range(NUM_STAGES):
                self.c.profile[i] = 0.0

    def profile(self):
        """Seconds spent per stage since set_profiling(True)."""
        return {name: self.c.profile[i] for i, name in enumerate(STAGE_NAMES)}

    def kv_block(self, int layer, int block):
        """Copies of one KV block (k, v), each (n_kv_heads, 64, head_dim) float16, for tests; with a q8_0 or bf16 cache
        the values it holds, float32."""
        cfg = self.model.m.cfg
        cdef size_t sl, n, at
        cdef int h, j
        cdef size_t per_block = cfg.n_kv_heads * KV_BLOCK * cfg.head_dim
        cdef size_t off = (<size_t>layer * self.num_kv_blocks + block) * per_block
        if self.c.kv_dtype == KV_BF16:
            k = np.empty((cfg.n_kv_heads, KV_BLOCK, cfg.head_dim), np.float32)
            v = np.empty_like(k)
            for h in range(cfg.n_kv_heads):
                sl = off + <size_t>h * KV_BLOCK * cfg.head_dim
                for j in range(KV_BLOCK):
                    kv_load_bf16(self.c.k_cache + sl, cfg.head_dim, j, 1, <float *>cnp.PyArray_DATA(k[h, j]))
                    kv_load_bf16(self.c.v_cache + sl, cfg.head_dim, j, 0, <float *>cnp.PyArray_DATA(v[h, j]))
            return k, v
        if self.c.kv_dtype == KV_Q8_0:
            sl = kvq8_slice_bytes(cfg.head_dim)
            n = cfg.n_kv_heads * sl
            at = (<size_t>layer * self.num_kv_blocks + block) * n
            shape = (1, cfg.n_kv_heads, sl)
            k = np.asarray(<uint8_t[:n]>(self.c.k_q8 + at)).copy().reshape(shape)
            v = np.asarray(<uint8_t[:n]>(self.c.v_q8 + at)).copy().reshape(shape)
            return kvq8_unpack(k, cfg.head_dim, True)[0], kvq8_unpack(v, cfg.head_dim, False)[0]
        k = np.empty(per_block, np.uint16); v = np.empty(per_block, np.uint16)
        cdef uint16_t[::1] kv_ = k
        cdef uint16_t[::1] vv = v
        cdef size_t i
        for i in range(per_block):
            kv_[i] = self.c.k_cache[off + i]
            vv[i] = self.c.v_cache[off + i]
        shape = (cfg.n_kv_heads, KV_BLOCK, cfg.head_dim)
        k_t = k.view(np.float16).reshape(cfg.n_kv_heads, cfg.head_dim, KV_BLOCK)     # stored transposed
        return np.ascontiguousarray(k_t.swapaxes(1, 2)), v.view(np.float16).reshape(shape)


def sample(cnp.ndarray logits, dict params, int position, history=(), bias=None, allowed=None):
    """Samples one row with the C sampler (tests and tools). Returns (token, logprob, top_ids, top_logprobs).
    allowed: None, or a packed allowed-token bitmask (mask_words(vocab) uint32 words)."""
    cdef float[::1] lv = np.array(logits, dtype=np.float32)
    cdef int vocab = lv.shape[0]
    cdef const uint32_t[::1] av
    cdef const uint32_t *allowed_ptr = NULL
    if allowed is not None:
        av = _as_mask_words(allowed).reshape(-1)
        if av.shape[0] != mask_words(vocab):
            raise ValueError(f"the mask has {av.shape[0]} words; a vocabulary of {vocab} needs {mask_words(vocab)}")
        allowed_ptr = &av[0]
    cdef int32_t[::1] hist = np.ascontiguousarray(np.asarray(history, dtype=np.int32).reshape(-1))
    bias = bias or {}
    cdef int32_t[::1] bids = np.array(list(bias.keys()), dtype=np.int32).reshape(-1)
    cdef float[::1] bvals = np.array(list(bias.values()), dtype=np.float32).reshape(-1)
    cdef sample_params_t sp
    memset(&sp, 0, sizeof(sp))
    sp.temperature = params.get("temperature", 1.0); sp.top_p = params.get("top_p", 1.0)
    sp.min_p = params.get("min_p", 0.0); sp.top_k = params.get("top_k", 0)
    sp.repetition_penalty = params.get("repetition_penalty", 1.0)
    sp.presence_penalty = params.get("presence_penalty", 0.0)
    sp.frequency_penalty = params.get("frequency_penalty", 0.0)
    sp.seed = params.get("seed", 0); sp.num_logprobs = min(params.get("num_logprobs", -1), MAX_TOP_LOGPROBS)
    sp.history_len = hist.shape[0]; sp.num_prompt = params.get("num_prompt", 0); sp.bias_len = bids.shape[0]
    cdef sample_out_t out
    memset(&out, 0, sizeof(out))
    cdef void *scratch = calloc(vocab, 16)
    if scratch == NULL:
        raise MemoryError(f"cannot allocate the sampler's scratch for {vocab} tokens")
    cdef int32_t zero_i = 0
    cdef float zero_f = 0
    with nogil:
        sample_row(&lv[0], vocab, &sp, position, &hist[0] if hist.shape[0] else &zero_i,
                   &bids[0] if bids.shape[0] else &zero_i, &bvals[0] if bvals.shape[0] else &zero_f, allowed_ptr,
                   scratch, &out)
    free(scratch)
    k = min(max(sp.num_logprobs, 0), vocab)
    return (out.token, out.logprob, [out.top_ids[j] for j in range(k)], [out.top_logprobs[j] for j in range(k)])


include "encoder.pxi"
include "moe.pxi"
include "lora.pxi"
include "gdn.pxi"
