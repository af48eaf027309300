# LoRA adapters for the CPU engine (ext/cpu/lora.c): an adapter's A and B matrices held in f32, per (layer,
# target), in the layout forward() reads; included by _cpu.pyx.

LORA_TARGET_NAMES = ("q", "k", "v", "o", "gate", "up", "down")   # in LORA_Q.. order


cdef class LoraAdapter:
    """One adapter for one Model: `matrices` maps (layer, target) to (A (rank, in), B (out, rank), scale), target
    one of LORA_TARGET_NAMES and scale the adapter's own (alpha / rank); the product scale * B (A x) is added to
    that weight's output for the sequences that use the adapter. Shapes are checked against the model; the
    gated FFN's targets need a dense FFN layer (not a mixture of experts)."""
    cdef lora_adapter_t a
    cdef lora_matrix_t *mats
    cdef list _keep
    cdef readonly int n_layers, max_rank
    cdef readonly size_t nbytes

    def __init__(self, Model model, dict matrices):
        cfg = model.m.cfg
        cdef int q = cfg.n_heads * cfg.head_dim, kv = cfg.n_kv_heads * cfg.head_dim, dim = cfg.dim
        cdef int hidden = cfg.hidden, i, layer, t, j
        shapes = {"q": (q, dim), "k": (kv, dim), "v": (kv, dim), "o": (dim, q), "gate": (hidden, dim),
                  "up": (hidden, dim), "down": (dim, hidden)}
        self.n_layers = cfg.n_layers
        self.mats = <lora_matrix_t *>calloc(max(1, cfg.n_layers * LORA_TARGETS), sizeof(lora_matrix_t))
        if self.mats == NULL:
            raise MemoryError("cannot allocate an adapter's table")
        self._keep = []
        self.max_rank = 0
        self.nbytes = 0
        cdef const float[:, ::1] av
        cdef const float[:, ::1] bv
        for (layer, target), (a, b, scale) in matrices.items():
            if not 0 <= layer < cfg.n_layers:
                raise ValueError(f"adapter matrix for layer {layer}: the model has {cfg.n_layers} layers")
            if target not in shapes:
                raise ValueError(f"adapter target {target!r} (one of {', '.join(LORA_TARGET_NAMES)})")
            if target in ("gate", "up", "down") and not any(
                    model.m.layers[layer].blocks[j].kind == BLOCK_FFN_GATED
                    for j in range(model.m.layers[layer].n_blocks)):
                raise ValueError(f"layer {layer}'s FFN is a mixture of experts: adapters of its {target} weights are "
                                 f"not supported")
            a = np.ascontiguousarray(a, dtype=np.float32)
            b = np.ascontiguousarray(b, dtype=np.float32)
            rows, cols = shapes[target]
            if a.ndim != 2 or b.ndim != 2 or a.shape[1] != cols or b.shape[0] != rows or b.shape[1] != a.shape[0] \
                    or a.shape[0] < 1:
                raise ValueError(f"layer {layer} {target}: A {a.shape} and B {b.shape} do not fit a weight of "
                                 f"(out, in) ({rows}, {cols}): A must be (rank, {cols}), B ({rows}, rank)")
            t = LORA_TARGET_NAMES.index(target)
            b = np.ascontiguousarray(b.T)            # (rank, out): the B stage runs along a row of outputs
            av = a
            bv = b
            i = layer * LORA_TARGETS + t
            self.mats[i].a = &av[0, 0]
            self.mats[i].bt = &bv[0, 0]
            self.mats[i].rank = a.shape[0]
            self.mats[i].out = rows
            self.mats[i].scale = scale
            self.max_rank = max(self.max_rank, a.shape[0])
            self.nbytes += a.nbytes + b.nbytes
            self._keep += [a, b]
        self.a.n_layers = cfg.n_layers
        self.a.max_rank = self.max_rank
        self.a.m = self.mats

    def __dealloc__(self):
        free(self.mats)


cdef int fill_batch_lora(batch_t *b, context_t *c, list loras, cnp.ndarray lora_of_seq,
                         cnp.ndarray lora_scale_of_seq, lora_adapter_t **table) except -1:
    """Points the batch at the adapters and each sequence's choice (int32 and float32 arrays the caller keeps
    alive); *table is malloc'ed (the caller frees it)."""
    cdef int n = len(loras), i, max_rank = 0
    cdef LoraAdapter ad
    cdef const int32_t[::1] ls = lora_of_seq
    cdef const float[::1] ss = lora_scale_of_seq
    if ls.shape[0] != b.num_seqs or ss.shape[0] != b.num_seqs:
        raise ValueError(f"lora_of_seq and lora_scale_of_seq need one entry per sequence ({b.num_seqs})")
    table[0] = <lora_adapter_t *>malloc(n * sizeof(lora_adapter_t))
    if table[0] == NULL:
        raise MemoryError("cannot allocate the step's adapter table")
    for i in range(n):
        ad = loras[i]
        table[0][i] = ad.a
        max_rank = max(max_rank, ad.max_rank)
    if context_reserve_lora(c, max_rank):
        raise MemoryError(f"cannot allocate the adapters' scratch (rank {max_rank})")
    b.loras = table[0]
    b.num_loras = n
    b.lora_of_seq = &ls[0]
    b.lora_scale_of_seq = &ss[0]
    return 0
