# Included by _cpu.pyx: the encoder (embedding models), ext/cpu/encoder.c. One nogil call per batch.

cdef extern from "<stdlib.h>" nogil:
    void *aligned_alloc(size_t alignment, size_t size)

cdef extern from "encoder.h" nogil:
    enum:
        ENC_MAX_DENSE
        ENC_NUM_STAGES
    ctypedef struct encoder_config_t:
        int arch
        int vocab, dim, n_layers, n_heads, n_kv_heads, head_dim, hidden
        int max_positions, n_types, rotary, gated_ffn
        float norm_eps, attn_scale, embed_scale
        int sliding_window, pooling, normalize
    ctypedef struct enc_layer_t:
        weight_t wqkv, wo, wup, wdown
        float *bqkv
        float *bo
        float *bup
        float *bdown
        float *norm1_w
        float *norm1_b
        float *norm2_w
        float *norm2_b
        float *attn_norm
        float *post_attn_norm
        float *ffn_norm
        float *post_ffn_norm
        float *q_norm
        float *k_norm
        int sliding
        void *wqkv_p
        void *wo_p
        void *wup_p
        void *wdown_p
        weight_t wqkv_f
        void *wqkv_f_p
        uint16_t *wqkv_f_bf
    ctypedef struct encoder_t:
        encoder_config_t cfg
        weight_t tok_embd
        float *pos_embd
        float *type_embd
        float *embd_norm_w
        float *embd_norm_b
        float *final_norm
        float *rope_global
        float *rope_local
        enc_layer_t *layers
        int n_dense
        weight_t dense[4]
        float *dense_bias[4]
        void *dense_p[4]
        int dense_act[4]
        int out_dim
    ctypedef struct enc_batch_t:
        int num_tokens, num_seqs
        const int32_t *token_ids
        const int32_t *seq_start
        const int32_t *type_ids
        float *out
        float *hidden_out
    ctypedef struct encoder_ctx_t:
        int profile_on
        double profile[ENC_NUM_STAGES]
        kernel_config_t kernels
    encoder_ctx_t *encoder_ctx_create(const encoder_t *m, int max_tokens, int max_seqs, int threads)
    void encoder_ctx_free(encoder_ctx_t *c)
    int encoder_forward(encoder_ctx_t *c, const enc_batch_t *b)
    void *pack_panels(const weight_t *w)
    int panels_keep_16bit(int type)
    void gemm_panels(const void *panels, int type, int rows, int cols, int panel_begin, int panel_end, int ntok,
                     const float *x, float *y, int ldy, int accumulate)
    uint16_t *pack_panels_bf16(const weight_t *w)
    void f32_to_bf16_row(const float *x, int n, uint16_t *out)
    void gemm_panels_bf16(const uint16_t *panels, int rows, int cols, int panel_begin, int panel_end, int ntok,
                          const uint16_t *x, float *y, int ldy, int accumulate)
    int c_encoder_bf16_preferred "encoder_bf16_preferred"()
    enum:
        ENC_ATTN_QBLOCK
    void attention_bidir(const float *q, const float *k, const float *v, int q_stride, int kv_stride, int n, int hd,
                         float scale, int window, float *out, int out_stride, float *scores, float *kt)


ENCODER_ARCHS = {"bert": 0, "gemma3": 1}
POOLINGS = {"mean": 0, "cls": 1, "last": 2}
DENSE_ACTIVATIONS = {"identity": 0, "tanh": 1}
ENCODER_STAGE_NAMES = ("embed", "matmul qkv", "attention", "matmul wo", "norm", "ffn up+act", "matmul down",
                       "pool+dense")


cdef class EncoderModel:
    """An encoder's weights in the engine's layout. `config`: arch ('bert' | 'gemma3'), vocab, dim, n_layers,
    n_heads, n_kv_heads, head_dim, hidden, max_positions, norm_eps, attn_scale, embed_scale, sliding_window,
    pooling ('mean' | 'cls' | 'last'), normalize, for Gemma sliding_layers (a list of layer indices), for BERT n_types
    (rows of 'type_embd', default 1) and dense_activations ('identity' | 'tanh' per Dense layer, default identity).
    `tensors`: matrices as (type_name, rows, cols, data): 'tok_embd', 'blk.{i}.wqkv', 'wo', 'wup', 'wdown',
    'dense.{j}'; vectors and tables as float32 arrays: BERT 'pos_embd' (with config rotary: 'rope_global' instead),
    'type_embd' (n_types, dim), 'embd_norm_w', 'embd_norm_b', per layer 'bqkv', 'bo', 'bup', 'bdown' (not with config
    gated_ffn, whose 'wup' is gate and up as Gemma's), 'norm1_w', 'norm1_b', 'norm2_w', 'norm2_b'; Gemma 'final_norm',
    'rope_global', 'rope_local', per layer 'attn_norm', 'post_attn_norm', 'ffn_norm', 'post_ffn_norm', 'q_norm',
    'k_norm' (with Gemma's 1 + w already added); 'dense.{j}.bias' where a Dense layer has one; 'blk.{i}.wqkv_f'
    where Wqkv comes in two parts: 'wqkv' its first rows (quantized), 'wqkv_f' the rest (float; in bf16, weights
    and activations rounded, with config 'wqkv_f_bf16': see gemm_panels.c).
    The matrices are taken out of `tensors` as they are copied into the engine's layout, so that the loader's
    arrays and the copies are never all in memory at once (EmbeddingGemma in F32: 1 GB each)."""
    cdef encoder_t m
    cdef list _keep
    cdef int n_built
    cdef readonly int out_dim, max_positions
    cdef readonly bint table_in_place      # the token embedding is read from the loader's array, not copied

    def __init__(self, dict config, dict tensors):
        cdef encoder_config_t *c = &self.m.cfg
        arch, pooling = config["arch"], config.get("pooling", "mean")
        if arch not in ENCODER_ARCHS or pooling not in POOLINGS:
            raise ValueError(f"unsupported encoder {arch!r} or pooling {pooling!r}")
        c.arch = ENCODER_ARCHS[arch]; c.pooling = POOLINGS[pooling]
        c.vocab = config["vocab"]; c.dim = config["dim"]; c.n_layers = config["n_layers"]
        c.n_heads = config["n_heads"]; c.n_kv_heads = config["n_kv_heads"]; c.head_dim = config["head_dim"]
        c.hidden = config["hidden"]; c.max_positions = config["max_positions"]; c.norm_eps = config["norm_eps"]
        c.attn_scale = config["attn_scale"]; c.embed_scale = config.get("embed_scale", 1.0)
        c.sliding_window = config.get("sliding_window", 0); c.normalize = config.get("normalize", False)
        c.n_types = config.get("n_types", 1)
        c.rotary = config.get("rotary", False); c.gated_ffn = config.get("gated_ffn", False)
        activations = list(config.get("dense_activations", ()))
        if c.n_types < 1 or any(a not in DENSE_ACTIVATIONS for a in activations):
            raise ValueError(f"unsupported token types {c.n_types} or Dense activations {activations}")
        if c.dim % 32 or c.hidden % 32 or c.head_dim % 32 or c.n_heads < 1 or c.n_kv_heads < 1 \
                or c.n_heads % c.n_kv_heads or c.n_layers < 1 or c.max_positions < 1:
            raise ValueError("unsupported encoder shape: dim, hidden and head_dim must be multiples of 32, "
                             "heads a multiple of KV heads")
        self._keep = []
        cdef int q_dim = c.n_heads * c.head_dim, qkv_dim = q_dim + 2 * c.n_kv_heads * c.head_dim
        self.m.layers = <enc_layer_t *>calloc(c.n_layers, sizeof(enc_layer_t))
        if self.m.layers == NULL:
            raise MemoryError()
        self._lookup_table(&self.m.tok_embd, tensors.pop("tok_embd"))
        cdef int bert = c.arch == 0, i, j
        cdef enc_layer_t *L
        if bert and c.rotary:
            self.m.rope_global = self._floats(tensors["rope_global"], c.max_positions * c.head_dim)
        elif bert:
            self.m.pos_embd = self._floats(tensors["pos_embd"], c.max_positions * c.dim)
        if bert:
            self.m.type_embd = self._floats(tensors["type_embd"], c.n_types * c.dim)
            self.m.embd_norm_w = self._floats(tensors["embd_norm_w"], c.dim)
            self.m.embd_norm_b = self._floats(tensors["embd_norm_b"], c.dim)
        else:
            self.m.final_norm = self._floats(tensors["final_norm"], c.dim)
            self.m.rope_global = self._floats(tensors["rope_global"], c.max_positions * c.head_dim)
            self.m.rope_local = self._floats(tensors["rope_local"], c.max_positions * c.head_dim)
        sliding = set(config.get("sliding_layers", ()))
        for i in range(c.n_layers):
            L = &self.m.layers[i]
            p = f"blk.{i}."
            self.n_built = i + 1                     # its fields start zeroed: freeing a half-built layer is safe
            if p + "wqkv_f" in tensors:              # Wqkv in two parts: the first rows quantized, the rest float
                spec = tensors.pop(p + "wqkv_f")
                if spec[0] not in FLOAT_WEIGHT_TYPES or not 0 < spec[1] < qkv_dim or (qkv_dim - spec[1]) % 16:
                    raise ValueError(f"{p}wqkv_f: a float weight of fewer than {qkv_dim} rows that leaves a "
                                     f"multiple of 16 to wqkv is needed, got {spec[0]} with {spec[1]}")
                self._matrix(&L.wqkv_f, &L.wqkv_f_p, spec, spec[1], c.dim,
                             &L.wqkv_f_bf if config.get("wqkv_f_bf16") else NULL)
            self._matrix(&L.wqkv, &L.wqkv_p, tensors.pop(p + "wqkv"), qkv_dim - L.wqkv_f.rows, c.dim)
            self._matrix(&L.wo, &L.wo_p, tensors.pop(p + "wo"), c.dim, q_dim)
            self._matrix(&L.wup, &L.wup_p, tensors.pop(p + "wup"), c.hidden * (1 if bert and not c.gated_ffn else 2),
                         c.dim)
            self._matrix(&L.wdown, &L.wdown_p, tensors.pop(p + "wdown"), c.dim, c.hidden)
            if bert:
                if not c.gated_ffn:                  # nomic-bert's linear layers have no biases
                    L.bqkv = self._floats(tensors[p + "bqkv"], qkv_dim)
                    L.bo = self._floats(tensors[p + "bo"], c.dim)
                    L.bup = self._floats(tensors[p + "bup"], c.hidden)
                    L.bdown = self._floats(tensors[p + "bdown"], c.dim)
                L.norm1_w = self._floats(tensors[p + "norm1_w"], c.dim)
                L.norm1_b = self._floats(tensors[p + "norm1_b"], c.dim)
                L.norm2_w = self._floats(tensors[p + "norm2_w"], c.dim)
                L.norm2_b = self._floats(tensors[p + "norm2_b"], c.dim)
            else:
                L.attn_norm = self._floats(tensors[p + "attn_norm"], c.dim)
                L.post_attn_norm = self._floats(tensors[p + "post_attn_norm"], c.dim)
                L.ffn_norm = self._floats(tensors[p + "ffn_norm"], c.dim)
                L.post_ffn_norm = self._floats(tensors[p + "post_ffn_norm"], c.dim)
                L.q_norm = self._floats(tensors[p + "q_norm"], c.head_dim)
                L.k_norm = self._floats(tensors[p + "k_norm"], c.head_dim)
                L.sliding = i in sliding
        self.out_dim = c.dim
        j = 0
        while f"dense.{j}" in tensors:
            if j == ENC_MAX_DENSE:
                raise ValueError(f"at most {ENC_MAX_DENSE} Dense layers are supported")
            spec = tensors[f"dense.{j}"]
            if spec[0] not in ("F32", "F16", "BF16") or spec[2] != self.out_dim:
                raise ValueError(f"Dense layer {j}: a float weight of {self.out_dim} inputs is needed, got "
                                 f"{spec[0]} with {spec[2]}")
            self.m.n_dense = j + 1
            self.m.dense_act[j] = DENSE_ACTIVATIONS[activations[j]] if j < len(activations) else 0
            self._matrix(&self.m.dense[j], &self.m.dense_p[j], spec, spec[1], spec[2])
            if f"dense.{j}.bias" in tensors:
                self.m.dense_bias[j] = self._floats(tensors[f"dense.{j}.bias"], spec[1])
            self.out_dim = spec[1]
            j += 1
        self.m.out_dim = self.out_dim
        self.max_positions = c.max_positions

    cdef int _matrix(self, weight_t *w, void **panels, tuple spec, int rows, int cols,
                     uint16_t **bf16_panels=NULL) except -1:
        """Builds a matrix; a float one is repacked into panels for the encoder's GEMM (into bf16 panels instead where
        bf16_panels is given: gemm_panels.c) and its row-major copy freed (the weight_t keeps its type and shape)."""
        if spec[1] != rows or spec[2] != cols:
            raise ValueError(f"weight of shape ({spec[1]}, {spec[2]}) where ({rows}, {cols}) is needed")
        init_weight(w, spec)
        cdef void *packed
        if not weight_is_quantized(w.type):
            with nogil:
                if bf16_panels != NULL:
                    bf16_panels[0] = pack_panels_bf16(w)
                    packed = bf16_panels[0]
                else:
                    panels[0] = pack_panels(w)
                    packed = panels[0]
            if packed == NULL:
                raise MemoryError(f"out of memory repacking a {rows}x{cols} weight")
            weight_free(w)
        return 0

    cdef int _lookup_table(self, weight_t *w, tuple spec) except -1:
        """The token embedding, of which only rows are read: a float table is used in place (its array is a view
        of the mapped file, so only the rows of tokens seen become resident: EmbeddingGemma's is 805 MB in F32)
        instead of copied; a quantized one is built like the matrices."""
        if len(spec) != 4 or spec[0] not in FLOAT_WEIGHT_TYPES or callable(spec[3]):
            return init_weight(w, spec)
        arr = np.ascontiguousarray(spec[3])
        cdef int t = WEIGHT_TYPES[spec[0]], rows = spec[1], cols = spec[2]
        if arr.nbytes != gguf_row_bytes(t, cols) * rows:
            raise ValueError(f"bad {spec[0]} token embedding {rows}x{cols} ({arr.nbytes} bytes)")
        if weight_init_seg(w, 1, &t, &rows, cols, <uint8_t *>cnp.PyArray_DATA(arr)):
            raise ValueError(f"bad token embedding shape {rows}x{cols}")
        self._keep.append(arr)
        self.table_in_place = True
        return 0

    cdef float *_floats(self, object t, Py_ssize_t n) except NULL:
        arr = np.ascontiguousarray(t, dtype=np.float32).reshape(-1)
        if arr.shape[0] != n:
            raise ValueError(f"expected {n} values, got {arr.shape[0]}")
        self._keep.append(arr)
        return <float *>cnp.PyArray_DATA(arr)

    def __dealloc__(self):
        cdef int i
        weight_free(&self.m.tok_embd)
        if self.m.layers != NULL:
            for i in range(self.n_built):
                weight_free(&self.m.layers[i].wqkv); weight_free(&self.m.layers[i].wo)
                weight_free(&self.m.layers[i].wup); weight_free(&self.m.layers[i].wdown)
                free(self.m.layers[i].wqkv_p); free(self.m.layers[i].wo_p)
                free(self.m.layers[i].wup_p); free(self.m.layers[i].wdown_p)
                weight_free(&self.m.layers[i].wqkv_f); free(self.m.layers[i].wqkv_f_p)
                free(self.m.layers[i].wqkv_f_bf)
            free(self.m.layers)
        for i in range(self.m.n_dense):
            weight_free(&self.m.dense[i])
            free(self.m.dense_p[i])

    @property
    def weight_bytes(self):
        cdef size_t total = self.m.tok_embd.nbytes
        cdef int i
        for i in range(self.n_built):
            L = &self.m.layers[i]
            total += L.wqkv.nbytes + L.wqkv_f.nbytes + L.wo.nbytes + L.wup.nbytes + L.wdown.nbytes
        return total


cdef class Encoder:
    """Scratch for one EncoderModel; encode() runs the whole batch (all layers, pooling, Dense, normalization)
    in one nogil C call."""
    cdef encoder_ctx_t *c
    cdef EncoderModel model
    cdef readonly int max_tokens, max_seqs, out_dim, dim

    def __init__(self, EncoderModel model, int max_tokens, int max_seqs, int threads):
        if max_tokens < 1 or max_seqs < 1 or threads < 1:
            raise ValueError("max_tokens, max_seqs and threads must be positive")
        self.model = model
        with nogil:
            self.c = encoder_ctx_create(&model.m, max_tokens, max_seqs, threads)
        if self.c == NULL:
            raise MemoryError(f"cannot allocate the encoder's scratch for {max_tokens} tokens")
        self.max_tokens = max_tokens
        self.max_seqs = max_seqs
        self.out_dim = model.out_dim
        self.dim = model.m.cfg.dim

    def __dealloc__(self):
        if self.c != NULL:
            encoder_ctx_free(self.c)

    @property
    def kernels(self):
        """This encoder's matmul kernel settings (KernelConfig)."""
        return KernelConfig.of(&self.c.kernels, self)

    def encode(self, int32_t[::1] token_ids, int32_t[::1] seq_start, bint want_hidden=False,
               int32_t[::1] type_ids=None):
        """token_ids (num_tokens,): the sequences one after another; seq_start (num_seqs + 1,): where each begins,
        then num_tokens; type_ids (num_tokens,) BERT's token types (a cross-encoder's second text: 1), None: all 0.
        Returns (vectors (num_seqs, out_dim) float32, last hidden states (num_tokens, dim) or
        None)."""
        cdef int T = token_ids.shape[0], S = seq_start.shape[0] - 1, rc
        if S < 1 or T < 1:
            raise ValueError("an empty batch")
        if type_ids is not None and type_ids.shape[0] != T:
            raise ValueError(f"{type_ids.shape[0]} token types for {T} tokens")
        if T > self.max_tokens or S > self.max_seqs:
            raise ValueError(f"batch of {T} tokens in {S} sequences exceeds this encoder's "
                             f"{self.max_tokens} tokens / {self.max_seqs} sequences")
        out = np.empty((S, self.out_dim), np.float32)
        hidden = np.empty((T, self.dim), np.float32) if want_hidden else None
        cdef float[:, ::1] ov = out
        cdef float[:, ::1] hv
        cdef enc_batch_t b
        memset(&b, 0, sizeof(b))
        b.num_tokens = T
        b.num_seqs = S
        b.token_ids = &token_ids[0]
        b.seq_start = &seq_start[0]
        b.type_ids = &type_ids[0] if type_ids is not None else NULL
        b.out = &ov[0, 0]
        if hidden is not None:
            hv = hidden
            b.hidden_out = &hv[0, 0]
        with nogil:
            rc = encoder_forward(self.c, &b)
        if rc:
            raise ValueError(f"invalid encoder batch (code {rc}): token ids or types out of range, an empty "
                             "sequence, a sequence longer than the model's positions or starts that do not add up")
        return out, hidden

    def set_profiling(self, bint on):
        cdef int i
        self.c.profile_on = on
        if on:
            for i in range(ENC_NUM_STAGES):
                self.c.profile[i] = 0.0

    def profile(self):
        return {name: self.c.profile[i] for i, name in enumerate(ENCODER_STAGE_NAMES)}


def encoder_bf16_preferred():
    """Whether a quantized encoder's float parts run faster in bf16 here (AVX-512 BF16 on an AMD CPU; gemm_panels.c)."""
    return bool(c_encoder_bf16_preferred())


def float_panels_16bit(str type_name):
    """Whether an encoder's weights of this float type keep their 16-bit values in their panels on this CPU."""
    return bool(panels_keep_16bit(WEIGHT_TYPES[type_name]))


def gemm_float(str type_name, cnp.ndarray w, cnp.ndarray x):
    """y (ntok, rows) = x @ w.T with the float panel GEMM on the active path (for tests): w (rows, cols) as the
    weight's stored values (F32 float32, F16/BF16 their uint16 bits), x (ntok, cols) float32, cols a multiple of 8.
    Returns (y, whether the panels kept w's 16-bit values)."""
    cdef float[:, ::1] xv = np.ascontiguousarray(x, dtype=np.float32)
    cdef int t = WEIGHT_TYPES[type_name], rows = w.shape[0], cols = w.shape[1], ntok = xv.shape[0]
    if type_name not in FLOAT_WEIGHT_TYPES or xv.shape[1] != cols or cols % 8 or rows < 1 or ntok < 1:
        raise ValueError("a float type, w (rows, cols) and x (ntok, cols) with cols a multiple of 8 are needed")
    cdef weight_t wt
    init_weight(&wt, (type_name, rows, cols, np.ascontiguousarray(w)))
    cdef void *panels = pack_panels(&wt)
    weight_free(&wt)
    if panels == NULL:
        raise MemoryError()
    y = np.empty((ntok, rows), np.float32)
    cdef float[:, ::1] yv = y
    with nogil:
        gemm_panels(panels, t, rows, cols, 0, (rows + 15) // 16, ntok, &xv[0, 0], &yv[0, 0], rows, 0)
    free(panels)
    return y, bool(panels_keep_16bit(t))


def gemm_bf16(cnp.ndarray w, cnp.ndarray x):
    """y (ntok, rows) = bf16(x) @ bf16(w).T with the bf16 panel GEMM on the active path (for tests); w (rows, cols)
    and x (ntok, cols) float32, cols a multiple of 32 (as every encoder weight's)."""
    cdef float[:, ::1] wv = np.ascontiguousarray(w, dtype=np.float32)
    cdef float[:, ::1] xv = np.ascontiguousarray(x, dtype=np.float32)
    cdef int rows = wv.shape[0], cols = wv.shape[1], ntok = xv.shape[0]
    if xv.shape[1] != cols or cols % 32 or rows < 1 or ntok < 1:
        raise ValueError("w (rows, cols) and x (ntok, cols) with cols a multiple of 32 are needed")
    cdef weight_t wt
    init_weight(&wt, ("F32", rows, cols, np.asarray(wv)))
    cdef uint16_t *panels = pack_panels_bf16(&wt)
    weight_free(&wt)
    if panels == NULL:
        raise MemoryError()
    y = np.empty((ntok, rows), np.float32)
    cdef float[:, ::1] yv = y
    cdef uint16_t *xb = <uint16_t *>malloc(<size_t>ntok * cols * sizeof(uint16_t))
    if xb == NULL:
        free(panels)
        raise MemoryError()
    with nogil:
        f32_to_bf16_row(&xv[0, 0], ntok * cols, xb)
        gemm_panels_bf16(panels, rows, cols, 0, (rows + 15) // 16, ntok, xb, &yv[0, 0], rows, 0)
    free(xb)
    free(panels)
    return y


def encoder_attention(float[:, ::1] q, float[:, ::1] k, float[:, ::1] v, float scale, int window=0):
    """One head of the encoder's bidirectional attention on the active path (for tests): q, k, v (n, hd) float32;
    window > 0: keys within window - 1 positions either side. Returns (n, hd)."""
    cdef int n = q.shape[0], hd = q.shape[1]
    if n < 1 or hd % 8 or k.shape[0] != n or v.shape[0] != n or k.shape[1] != hd or v.shape[1] != hd:
        raise ValueError("q, k and v must all be (n, hd) with n >= 1 and hd a multiple of 8")
    cdef int ld = (n + 15) & ~15
    out = np.empty((n, hd), np.float32)
    cdef float[:, ::1] ov = out
    cdef float *scores = <float *>aligned_alloc(64, <size_t>ENC_ATTN_QBLOCK * ld * sizeof(float))
    cdef float *kt = <float *>aligned_alloc(64, <size_t>hd * ld * sizeof(float))
    try:
        if scores == NULL or kt == NULL:
            raise MemoryError()
        with nogil:
            attention_bidir(&q[0, 0], &k[0, 0], &v[0, 0], hd, hd, n, hd, scale, window, &ov[0, 0], hd, scores, kt)
    finally:
        free(scores)
        free(kt)
    return out
