# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""inferd._cpu: thin wrapper over the C engine in ext/cpu. Typed buffers in, `with nogil:` around every
C call; all validation that needs Python objects happens here, the C side checks the batch again."""
import numpy as np
cimport numpy as cnp
from libc.stdlib cimport calloc, free, malloc
from libc.string cimport memset
from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint64_t

from cinferd cimport *

cnp.import_array()

WEIGHT_TYPES = {"F32": 0, "F16": 1, "BF16": 2, "Q4_0": 3, "Q4_1": 4, "Q8_0": 5}
PATHS = {"scalar": 0, "avx2": 1, "avx512vnni": 2, "avxvnni": 3}
BLOCK_SIZE = KV_BLOCK
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
    #else
    static int inferd_set_mmap_threshold(int nbytes) { (void)nbytes; return 0; }
    #endif
    """
    int inferd_set_mmap_threshold(int nbytes)


def set_mmap_threshold(int nbytes):
    """Fix glibc malloc's mmap threshold (blocks of nbytes and more are mmapped and returned to the kernel on
    free). False where the C library is not glibc or refused."""
    return bool(inferd_set_mmap_threshold(nbytes))


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
    """(n,) float32, n % 32 == 0 -> (d (n/32,), isum (n/32,), qs (n/32, 32)) with the active path."""
    cdef float[::1] xv = np.ascontiguousarray(x, dtype=np.float32)
    cdef int n = xv.shape[0], nb = n // 32, i
    if n % 32 or n == 0:
        raise ValueError("length must be a positive multiple of 32")
    cdef block_q8x *blocks = <block_q8x *>malloc(nb * sizeof(block_q8x))
    with nogil:
        quantize_act(&xv[0], n, blocks)
    d = np.empty(nb, np.float32); isum = np.empty(nb, np.int32); qs = np.empty((nb, 32), np.int8)
    for i in range(nb):
        d[i] = blocks[i].d
        isum[i] = blocks[i].isum
        qs[i] = [blocks[i].qs[j] for j in range(32)]
    free(blocks)
    return d, isum, qs


cdef size_t layout_bytes(tuple spec):
    """Bytes of the engine's layout of spec (type_name, rows, cols, data), rounded up to 64; 0 if it is bad."""
    if spec[0] not in WEIGHT_TYPES:
        return 0
    return (weight_layout_bytes(WEIGHT_TYPES[spec[0]], spec[1], spec[2]) + 63) & ~(<size_t>63)


cdef int init_weight(weight_t *w, tuple spec, uint8_t *dst=NULL) except -1:
    """spec: (type_name, rows, cols, data); dst: layout_bytes(spec) of memory to build it in (NULL: its own)"""
    cdef str type_name = spec[0]
    cdef int rows = spec[1], cols = spec[2]
    data = spec[3]
    if type_name not in WEIGHT_TYPES:
        raise ValueError(f"weight type {type_name} is not supported by the engine")
    cdef cnp.ndarray arr = np.ascontiguousarray(data)
    cdef int rc = weight_init(w, WEIGHT_TYPES[type_name], rows, cols, <const void *>arr.data, arr.nbytes, dst)
    if rc == -2:
        raise MemoryError(f"out of memory for a {rows}x{cols} {type_name} weight")
    if rc:
        raise ValueError(f"bad {type_name} weight {rows}x{cols} ({arr.nbytes} bytes)")
    return 0


cdef class Weight:
    """One weight matrix in the engine's tile layout; for kernel tests and benchmarks."""
    cdef weight_t w

    def __init__(self, str type_name, int rows, int cols, data):
        init_weight(&self.w, (type_name, rows, cols, data))

    def __dealloc__(self):
        weight_free(&self.w)

    @property
    def nbytes(self):
        return self.w.nbytes

    def dequantize(self):
        out = np.empty((self.w.rows, self.w.cols), np.float32)
        cdef float[:, ::1] ov = out
        cdef int r
        with nogil:
            for r in range(self.w.rows):
                weight_dequant_row(&self.w, r, &ov[r, 0])
        return out

    def matmul(self, cnp.ndarray x, cnp.ndarray y=None):
        """y (ntok, rows) = x (ntok, cols) @ W.T with the active path, single-threaded; y += when given."""
        cdef float[:, ::1] xv = np.ascontiguousarray(x, dtype=np.float32)
        cdef int ntok = xv.shape[0], t, nb = self.w.cols // 32, acc = y is not None
        if xv.shape[1] != self.w.cols:
            raise ValueError(f"x has {xv.shape[1]} columns, the weight {self.w.cols}")
        if y is None:
            y = np.zeros((ntok, self.w.rows), np.float32)
        cdef float[:, ::1] yv = y
        cdef block_q8x *xq = <block_q8x *>malloc(max(1, ntok * nb) * sizeof(block_q8x))
        with nogil:
            if weight_is_quantized(self.w.type):
                for t in range(ntok):
                    quantize_act(&xv[t, 0], self.w.cols, xq + t * nb)
            matmul_tiles(&self.w, 0, matmul_num_tiles(&self.w), ntok, &xv[0, 0], xq, &yv[0, 0], self.w.rows, acc)
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


cdef class Model:
    """The weights in the engine's layout. `config` is a dict of model_config_t fields; `tensors` maps
    names to (type_name, rows, cols, data): 'tok_embd', 'output' (absent when tied), 'output_norm', and per
    layer 'blk.{i}.attn_norm', 'ffn_norm', 'qkv_bias' (optional), 'wqkv', 'wo', 'wgu', 'wdown'."""
    cdef model_t m
    cdef list _keep
    cdef int n_built
    cdef uint8_t *arena           # every weight, one after another, in huge pages where possible (hugemem.c)
    cdef size_t arena_bytes, arena_used

    def __init__(self, dict config, dict tensors):
        cdef model_config_t *c = &self.m.cfg
        c.vocab = config["vocab"]; c.dim = config["dim"]; c.n_layers = config["n_layers"]
        c.n_heads = config["n_heads"]; c.n_kv_heads = config["n_kv_heads"]; c.head_dim = config["head_dim"]
        c.hidden = config["hidden"]; c.context_length = config["context_length"]
        c.rope_neox = config["rope_neox"]; c.norm_eps = config["norm_eps"]; c.rope_theta = config["rope_theta"]
        c.rope_factor = config.get("rope_factor", 0.0)
        c.rope_low_freq_factor = config.get("rope_low_freq_factor", 1.0)
        c.rope_high_freq_factor = config.get("rope_high_freq_factor", 4.0)
        c.rope_original_ctx = config.get("rope_original_ctx", 8192)
        if c.head_dim % 8 or c.head_dim > 512 or c.n_heads % c.n_kv_heads:
            raise ValueError("unsupported head layout")
        if c.dim % 32 or c.hidden % 32:
            raise ValueError(f"dim {c.dim} and hidden {c.hidden} must be multiples of 32 (8-bit activation blocks)")
        self._keep = []
        self.m.layers = <layer_t *>calloc(c.n_layers, sizeof(layer_t))
        if self.m.layers == NULL:
            raise MemoryError()
        names = ["tok_embd"] + (["output"] if "output" in tensors else []) + [
            f"blk.{i}.{w}" for i in range(c.n_layers) for w in ("wqkv", "wo", "wgu", "wdown")]
        self.arena_bytes = sum(layout_bytes(tensors[n]) for n in names if n in tensors)
        self.arena = <uint8_t *>huge_alloc(self.arena_bytes)
        if self.arena == NULL:
            raise MemoryError(f"out of memory for {self.arena_bytes} bytes of weights")
        self._init_weight(&self.m.tok_embd, tensors["tok_embd"])
        if "output" in tensors:
            self._init_weight(&self.m.output, tensors["output"])
        else:
            self.m.output = self.m.tok_embd
            self.m.output_tied = 1
        self.m.output_norm = self._floats(tensors["output_norm"], c.dim)
        cdef int i
        cdef layer_t *L
        for i in range(c.n_layers):
            L = &self.m.layers[i]
            p = f"blk.{i}."
            L.attn_norm = self._floats(tensors[p + "attn_norm"], c.dim)
            L.ffn_norm = self._floats(tensors[p + "ffn_norm"], c.dim)
            if p + "qkv_bias" in tensors:
                L.qkv_bias = self._floats(tensors[p + "qkv_bias"], (c.n_heads + 2 * c.n_kv_heads) * c.head_dim)
            self._init_weight(&L.wqkv, tensors[p + "wqkv"])
            self._init_weight(&L.wo, tensors[p + "wo"])
            self._init_weight(&L.wgu, tensors[p + "wgu"])
            self._init_weight(&L.wdown, tensors[p + "wdown"])
            self.n_built = i + 1
        if model_init_rope(&self.m):
            raise MemoryError()

    cdef int _init_weight(self, weight_t *w, tuple spec) except -1:
        """Builds the weight in the next piece of the arena (a bad spec raises in init_weight)."""
        cdef size_t n = layout_bytes(spec)
        if self.arena_used + n > self.arena_bytes:
            raise ValueError("weights do not fit the arena they were counted for")
        init_weight(w, spec, self.arena + self.arena_used if n else NULL)
        self.arena_used += n
        return 0

    @property
    def weight_buffer(self):
        """(address, bytes) of the memory holding every weight (for the huge-page test)."""
        return <size_t>self.arena, self.arena_bytes

    cdef float *_floats(self, tuple t, int n) except NULL:
        arr = np.ascontiguousarray(t[3], dtype=np.float32).reshape(-1)
        if arr.shape[0] != n:
            raise ValueError(f"expected {n} values, got {arr.shape[0]}")
        self._keep.append(arr)
        return <float *>cnp.PyArray_DATA(arr)

    def __dealloc__(self):
        cdef int i
        weight_free(&self.m.tok_embd)
        if not self.m.output_tied:
            weight_free(&self.m.output)
        if self.m.layers != NULL:
            for i in range(self.m.cfg.n_layers):
                weight_free(&self.m.layers[i].wqkv); weight_free(&self.m.layers[i].wo)
                weight_free(&self.m.layers[i].wgu); weight_free(&self.m.layers[i].wdown)
            free(self.m.layers)
        free(self.m.rope_cos_sin)
        huge_free(self.arena, self.arena_bytes)

    @property
    def weight_bytes(self):
        """Bytes of weights one step reads (all layers and the output matrix)."""
        cdef size_t total = self.m.output.nbytes
        cdef int i
        for i in range(self.m.cfg.n_layers):
            L = &self.m.layers[i]
            total += L.wqkv.nbytes + L.wo.nbytes + L.wgu.nbytes + L.wdown.nbytes
        return total

    @property
    def memory_bytes(self):
        return self.weight_bytes + (0 if self.m.output_tied else self.m.tok_embd.nbytes)


STAGE_NAMES = ("embed", "norm+quantize", "matmul qkv", "rope+kv write", "attention", "matmul wo",
               "matmul gate|up+swiglu", "matmul down", "matmul output", "sample")


FORWARD_ERRORS = {
    FORWARD_BAD_SIZE: "more tokens or logits rows than the context was made for",
    FORWARD_BAD_TOKEN: "a token id outside the vocabulary",
    FORWARD_BAD_POSITION: "a position outside the context or its sequence's block table",
    FORWARD_BAD_SEQUENCE: "a token's sequence index outside the batch",
    FORWARD_BAD_BLOCK: "a KV block id outside the cache",
    FORWARD_BAD_OUT_ROW: "a logits row that is not a token of the batch",
    FORWARD_BAD_SAMPLE_PARAMS: "sampling parameters point outside the history or logit-bias arrays",
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
              ("bias_offset", "<i8", <char *>&p.bias_offset - base), ("bias_len", "<i4", <char *>&p.bias_len - base)]
    return np.dtype({"names": [f[0] for f in fields], "formats": [f[1] for f in fields],
                     "offsets": [f[2] for f in fields], "itemsize": sizeof(sample_params_t)})


SAMPLE_PARAMS_DTYPE = _sample_params_dtype()


cdef class Context:
    """KV cache + scratch for one model; forward() runs one step (all layers, logits, sampling) in C."""
    cdef context_t *c
    cdef Model model
    cdef readonly int max_tokens, max_out, num_kv_blocks, vocab, n_layers, dim

    def __init__(self, Model model, int max_tokens, int max_out, int num_kv_blocks, int threads):
        if max_tokens < 1 or max_out < 1 or num_kv_blocks < 1 or threads < 1:
            raise ValueError("max_tokens, max_out, num_kv_blocks and threads must be positive")
        self.model = model
        with nogil:
            self.c = context_create(&model.m, max_tokens, max_out, num_kv_blocks, threads)
        if self.c == NULL:
            raise MemoryError(f"cannot allocate the KV cache ({num_kv_blocks} blocks) and scratch")
        self.max_tokens = max_tokens
        self.max_out = min(max_out, max_tokens)
        self.num_kv_blocks = num_kv_blocks
        self.vocab = model.m.cfg.vocab
        self.n_layers = model.m.cfg.n_layers
        self.dim = model.m.cfg.dim

    def __dealloc__(self):
        if self.c != NULL:
            context_free(self.c)

    def forward(self, int32_t[::1] token_ids, int32_t[::1] positions, int32_t[::1] seq_of_token,
                int32_t[:, ::1] block_tables, int32_t[::1] out_rows, int32_t[::1] sample_mask,
                cnp.ndarray params, int32_t[::1] history, int32_t[::1] bias_ids, float[::1] bias_values,
                bint want_logits=False, bint want_hidden=False):
        """Returns (samples, logits or None, hidden or None). `params`: num_out SAMPLE_PARAMS_DTYPE records, whose
        history and bias ranges must lie inside `history` and `bias_ids` (inferd/engine/engine.py builds them).
        samples is a dict of arrays: token, logprob, top_ids, top_logprobs."""
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
        cdef int32_t zero_i = 0
        cdef float zero_f = 0
        b.history = &history[0] if history.shape[0] else &zero_i
        b.bias_ids = &bias_ids[0] if bias_ids.shape[0] else &zero_i
        b.bias_values = &bias_values[0] if bias_values.shape[0] else &zero_f
        b.num_history = history.shape[0]
        b.num_bias = bias_ids.shape[0]
        if bias_values.shape[0] != bias_ids.shape[0]:
            raise ValueError("bias_ids and bias_values disagree in length")
        cdef sample_out_t *so = <sample_out_t *>calloc(max(n_out, 1), sizeof(sample_out_t))
        if so == NULL:
            raise MemoryError("cannot allocate the step's sample records")
        logits = np.empty((n_out, self.vocab), np.float32) if want_logits and n_out else None
        hidden = np.empty((self.n_layers + 1, T, self.dim), np.float32) if want_hidden else None
        cdef float[:, ::1] lv
        cdef float[:, :, ::1] hv
        try:
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
        """Copies of one KV block (k, v), each (n_kv_heads, 64, head_dim) float16, for tests."""
        cfg = self.model.m.cfg
        cdef size_t per_block = cfg.n_kv_heads * KV_BLOCK * cfg.head_dim
        cdef size_t off = (<size_t>layer * self.num_kv_blocks + block) * per_block
        k = np.empty(per_block, np.uint16); v = np.empty(per_block, np.uint16)
        cdef uint16_t[::1] kv_ = k
        cdef uint16_t[::1] vv = v
        cdef size_t i
        for i in range(per_block):
            kv_[i] = self.c.k_cache[off + i]
            vv[i] = self.c.v_cache[off + i]
        shape = (cfg.n_kv_heads, KV_BLOCK, cfg.head_dim)
        return k.view(np.float16).reshape(shape), v.view(np.float16).reshape(shape)


def sample(cnp.ndarray logits, dict params, int position, history=(), bias=None):
    """Samples one row with the C sampler (tests and tools). Returns (token, logprob, top_ids, top_logprobs)."""
    cdef float[::1] lv = np.array(logits, dtype=np.float32)
    cdef int vocab = lv.shape[0]
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
    cdef int32_t zero_i = 0
    cdef float zero_f = 0
    with nogil:
        sample_row(&lv[0], vocab, &sp, position, &hist[0] if hist.shape[0] else &zero_i,
                   &bids[0] if bids.shape[0] else &zero_i, &bvals[0] if bvals.shape[0] else &zero_f, scratch, &out)
    free(scratch)
    k = min(max(sp.num_logprobs, 0), vocab)
    return (out.token, out.logprob, [out.top_ids[j] for j in range(k)], [out.top_logprobs[j] for j in range(k)])


include "encoder.pxi"
