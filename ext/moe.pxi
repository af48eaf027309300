# Included by _cpu.pyx: building a mixture-of-experts block (ext/cpu/block_moe.c runs it) from the specs that
# inferd.engine.weights makes: the router, one weight per expert (each repacked from its rows of the file's 3-D
# tensors into the model's arena, as the dense weights are), and Qwen2-MoE's shared expert and its gate.


cdef moe_block_check(int layer, dict ts):
    """Before anything is built: the tensors an ffn_moe block cannot do without."""
    if any(name not in ts for name in ("norm", "router", "experts_gu", "experts_down")):
        raise ValueError(f"layer {layer}: an ffn_moe block needs router, experts_gu and experts_down")


cdef int moe_block_init(Model model, model_config_t *c, ffn_moe_block_t *M, int layer, dict options,
                        dict ts) except -1:
    gu, down = ts["experts_gu"], ts["experts_down"]
    n, k = len(gu), options["n_used"]
    if not 1 <= n <= MOE_MAX_EXPERTS or len(down) != n:
        raise ValueError(f"layer {layer}: {n} experts with {len(down)} down projections (1 to {MOE_MAX_EXPERTS})")
    if not 1 <= k <= min(n, MOE_MAX_USED):
        raise ValueError(f"layer {layer}: {k} experts used of {n} (1 to {min(n, MOE_MAX_USED)})")
    if options["act"] not in FFN_ACTS:
        raise ValueError(f"layer {layer}: FFN activation {options['act']!r} (one of {', '.join(FFN_ACTS)})")
    hidden = spec_parts(gu[0])[0][1]
    if hidden % 32 or any(spec_parts(g)[0][1] != hidden for g in gu) or any(d[1] != c.dim for d in down):
        raise ValueError(f"layer {layer}: experts of different or bad shapes")
    M.n_experts, M.n_used, M.hidden = n, k, hidden
    M.norm_topk = options["norm_topk"]
    M.weights_scale = options["weights_scale"]
    gating = options.get("gating", "softmax")
    if gating not in MOE_GATINGS:
        raise ValueError(f"layer {layer}: router gating {gating!r} (one of {', '.join(MOE_GATINGS)})")
    M.gating = MOE_GATINGS[gating]
    M.act = FFN_ACTS[options["act"]]
    if ts["router"][1] != n or ts["router"][2] != c.dim:
        raise ValueError(f"layer {layer}: router of {ts['router'][1]}x{ts['router'][2]} for {n} experts of {c.dim}")
    M.wgu = <weight_t *>calloc(n, sizeof(weight_t))
    M.wdown = <weight_t *>calloc(n, sizeof(weight_t))
    if M.wgu == NULL or M.wdown == NULL:
        raise MemoryError()
    model._init_weight(&M.router, ts["router"])
    if "router_bias" in ts:
        M.router_bias = model._floats(ts["router_bias"], n)
    biases = [name in ts for name in ("gate_bias", "up_bias", "down_bias")]
    if any(biases) and not all(biases):
        raise ValueError(f"layer {layer}: the experts' biases come as gate, up and down together")
    if all(biases):
        M.gate_bias = model._floats(ts["gate_bias"], n * hidden)
        M.up_bias = model._floats(ts["up_bias"], n * hidden)
        M.down_bias = model._floats(ts["down_bias"], n * c.dim)
    cdef int e
    for e in range(n):
        model._init_weight(&M.wgu[e], gu[e])
        model._init_weight(&M.wdown[e], down[e])
    if "shared_gate" in ts:
        shared = spec_parts(ts["shared_gu"])[0][1]
        if shared % 32 or ts["shared_down"][1] != c.dim:
            raise ValueError(f"layer {layer}: a shared expert of bad shape")
        M.shared_hidden = shared
        M.shared_gate = model._floats(ts["shared_gate"], c.dim)
        model._init_weight(&M.shared_gu, ts["shared_gu"])
        model._init_weight(&M.shared_down, ts["shared_down"])
    return 0


cdef size_t moe_block_weights(ffn_moe_block_t *M, bint free_them, bint per_token):
    """Bytes of the block's matrices (per_token: those a token reads, n_used of the n experts' average), or
    (free_them) their release."""
    cdef size_t total = M.router.nbytes + M.shared_gu.nbytes + M.shared_down.nbytes, experts = 0
    cdef int e
    if M.wgu != NULL and M.wdown != NULL:
        for e in range(M.n_experts):
            experts += M.wgu[e].nbytes + M.wdown[e].nbytes
            if free_them:
                weight_free(&M.wgu[e]); weight_free(&M.wdown[e])
    total += experts * M.n_used // M.n_experts if per_token and M.n_experts else experts
    if free_them:
        weight_free(&M.router); weight_free(&M.shared_gu); weight_free(&M.shared_down)
        free(M.wgu); free(M.wdown)
        M.wgu = M.wdown = NULL
    return total
