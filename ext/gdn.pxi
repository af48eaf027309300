# Included by _cpu.pyx: building a Gated DeltaNet block (ext/cpu/block_gdn.c runs it) from the specs that
# inferd.engine.weights makes: Win (q|k|v channels then the gate z), Wba (beta's rows then the decay's), Wout, the
# convolution's taps, and the per-head vectors.

GDN_MAX_CONV_KERNEL = 9     # block_gdn.c keeps a channel's last kernel - 1 inputs on the stack


cdef gdn_block_check(int layer, dict options, dict ts):
    """Before anything is built: the tensors and shapes a recurrent block cannot do without."""
    if any(name not in ts for name in ("norm", "win", "wba", "wout", "conv", "dt_bias", "a_log", "norm_out")):
        raise ValueError(f"layer {layer}: a recurrent block needs win, wba, wout, conv, dt_bias, a_log, norm_out")
    hk, hv, nk, nv, K = (options[k] for k in ("head_k", "head_v", "n_k_heads", "n_v_heads", "conv_kernel"))
    if hk % 32 or hv % 32 or hk > 512 or hv > 512 or nk < 1 or nv < 1 or nv % nk or not 1 <= K <= GDN_MAX_CONV_KERNEL:
        raise ValueError(f"layer {layer}: Gated DeltaNet heads {nk}x{hk} keys, {nv}x{hv} values, kernel {K} "
                         f"(head sizes multiples of 32 up to 512, value heads a multiple of key heads, kernel 1 to "
                         f"{GDN_MAX_CONV_KERNEL})")


cdef int gdn_block_init(Model model, model_config_t *c, gdn_block_t *G, int layer, int index, dict options,
                        dict ts) except -1:
    G.head_k, G.head_v = options["head_k"], options["head_v"]
    G.n_k_heads, G.n_v_heads = options["n_k_heads"], options["n_v_heads"]
    G.conv_kernel = options["conv_kernel"]
    G.index = index
    G.grouped_heads = options.get("grouped_heads", 0)
    cdef int conv_dim = 2 * G.n_k_heads * G.head_k + G.n_v_heads * G.head_v, vdim = G.n_v_heads * G.head_v
    win, wba, wout = ts["win"], ts["wba"], ts["wout"]
    if spec_rows(win) != conv_dim + vdim or spec_rows(wba) != 2 * G.n_v_heads or wout[1] != c.dim or wout[2] != vdim:
        raise ValueError(f"layer {layer}: Gated DeltaNet matrices of bad shapes")
    G.conv = model._floats(ts["conv"], conv_dim * G.conv_kernel)
    G.dt_bias = model._floats(ts["dt_bias"], G.n_v_heads)
    G.a_log = model._floats(ts["a_log"], G.n_v_heads)
    G.norm_out = model._floats(ts["norm_out"], G.head_v)
    model._init_weight(&G.win, win)
    model._init_weight(&G.wba, wba)
    model._init_weight(&G.wout, wout)
    return 0


cdef int spec_rows(tuple spec):
    return sum(part[1] for part in spec_parts(spec))


cdef size_t gdn_block_weights(gdn_block_t *G, bint free_them):
    cdef size_t total = G.win.nbytes + G.wba.nbytes + G.wout.nbytes
    if free_them:
        weight_free(&G.win); weight_free(&G.wba); weight_free(&G.wout)
    return total
