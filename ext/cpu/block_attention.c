/* The attention block: x += post_norm(Wo attention(q, k, v) (+ bias)), (q, k, v) = Wqkv rmsnorm(x) (+ bias), with
 * QK-norm, RoPE (or partial RoPE) and the K/V writes to the paged cache; sliding-window layers see only their
 * window of keys; attention sinks (gpt-oss) add a logit per head to each softmax's denominator; a gated block
 * multiplies the attention output by sigmoid(Wgate rmsnorm(x)) before Wo.
 * attention_plan sizes the step's attention items once; attention_block runs one layer's. */
#include <math.h>
#include <string.h>
#include "forward_stage.h"

/* QKV bias, QK-norm, RoPE on q and k, and k and v written to the cache at the token's position: for token t's KV
 * heads [h0, h0 + heads) and their query heads (each head's arithmetic is its own, so any split gives the same bits) */
static void rope_kv_token(context_t *c, const stage_t *s, int64_t t, int h0, int heads) {
    const model_config_t *cfg = &c->model->cfg;
    const attention_block_t *A = &s->block->attn;
    int hd = cfg->head_dim, group = cfg->n_heads / cfg->n_kv_heads, qkv_dim = Q_DIM(cfg) + 2 * KV_DIM(cfg);
    float *q = c->qkv + t * qkv_dim + (size_t)h0 * group * hd;
    float *k = c->qkv + t * qkv_dim + Q_DIM(cfg) + (size_t)h0 * hd, *v = k + KV_DIM(cfg);
    if (A->qkv_bias) {
        const float *bq = A->qkv_bias + (size_t)h0 * group * hd, *bk = A->qkv_bias + Q_DIM(cfg) + (size_t)h0 * hd;
        for (int i = 0; i < heads * group * hd; i++) q[i] += bq[i];
        for (int i = 0; i < heads * hd; i++) { k[i] += bk[i]; v[i] += bk[KV_DIM(cfg) + i]; }
    }
    if (A->q_norm && !A->qk_norm_full) {                 /* QK-norm: each head on its own, before RoPE */
        for (int h = 0; h < heads * group; h++) rmsnorm(q + h * hd, A->q_norm, hd, cfg->norm_eps, q + h * hd);
        for (int h = 0; h < heads; h++) rmsnorm(k + h * hd, A->k_norm, hd, cfg->norm_eps, k + h * hd);
    }
    int pos = s->b->positions[t], rd = cfg->rope_dims ? cfg->rope_dims : hd;
    const float *cs = A->rope_cos_sin + (size_t)pos * rd;
    if (rd == hd) {
        rope_apply(q, heads * group, hd, cs, A->rope_neox);
        rope_apply(k, heads, hd, cs, A->rope_neox);
    } else {                                             /* partial RoPE: each head's first rd dims */
        for (int h = 0; h < heads * group; h++) rope_apply(q + h * hd, 1, rd, cs, A->rope_neox);
        for (int h = 0; h < heads; h++) rope_apply(k + h * hd, 1, rd, cs, A->rope_neox);
    }
    const int32_t *bt = s->b->block_tables + (size_t)s->b->seq_of_token[t] * s->b->max_blocks_per_seq;
    if (c->kv_dtype == KV_Q8_0) {                        /* int8 KV: attention_q8.c's slices */
        size_t sl = kvq8_slice_bytes(hd);
        size_t at = (((size_t)s->kv_layer * c->num_kv_blocks + bt[pos / KV_BLOCK]) * cfg->n_kv_heads + h0) * sl;
        for (int h = 0; h < heads; h++) {
            kvq8_store(k + h * hd, hd, c->k_q8 + at + h * sl, pos % KV_BLOCK, 1);
            kvq8_store(v + h * hd, hd, c->v_q8 + at + h * sl, pos % KV_BLOCK, 0);
        }
        return;
    }
    size_t slot = ((size_t)s->kv_layer * c->num_kv_blocks + bt[pos / KV_BLOCK]) * KV_DIM(cfg) * KV_BLOCK;
    for (int h = 0; h < heads; h++) {
        size_t head = slot + (size_t)(h0 + h) * KV_BLOCK * hd;
        if (c->kv_dtype == KV_BF16) {                    /* bf16 pairs: attention_bf16.c's slices */
            kv_store_key_bf16(k + h * hd, c->k_cache + head, pos % KV_BLOCK, hd);
            kv_store_value_bf16(v + h * hd, c->v_cache + head, pos % KV_BLOCK, hd);
            continue;
        }
        kv_store_key(k + h * hd, c->k_cache + head, pos % KV_BLOCK, hd);
        store_f16(v + h * hd, c->v_cache + head + (size_t)(pos % KV_BLOCK) * hd, hd);
    }
}

/* QK-norm over the whole of a token's q and of its k (OLMoE), before the items that split it by heads */
static void qk_norm_full_fn(void *arg, int64_t begin, int64_t end, int thread) {
    stage_t *s = arg;
    (void)thread;
    const model_config_t *cfg = &s->c->model->cfg;
    const attention_block_t *A = &s->block->attn;
    int qkv_dim = Q_DIM(cfg) + 2 * KV_DIM(cfg);
    for (int64_t t = begin; t < end; t++) {
        float *q = s->c->qkv + t * qkv_dim, *k = q + Q_DIM(cfg);
        rmsnorm(q, A->q_norm, Q_DIM(cfg), cfg->norm_eps, q);
        rmsnorm(k, A->k_norm, KV_DIM(cfg), cfg->norm_eps, k);
    }
}

/* the output gate (Qwen3.5): token t's attention output for query heads [h0, h0 + n) times sigmoid(gate) */
static void output_gate(context_t *c, int64_t t, int h0, int n) {
    const model_config_t *cfg = &c->model->cfg;
    size_t first = (size_t)t * Q_DIM(cfg) + (size_t)h0 * cfg->head_dim;
    float *out = c->xn + first;
    const float *g = c->attn_gate + first;
    for (int i = 0; i < n * cfg->head_dim; i++) out[i] *= 1.0f / (1.0f + expf(-g[i]));
}

static void rope_kv_fn(void *arg, int64_t begin, int64_t end, int thread) {
    stage_t *s = arg;
    (void)thread;
    for (int64_t t = begin; t < end; t++) rope_kv_token(s->c, s, t, 0, s->c->model->cfg.n_kv_heads);
}

/* the first KV block a run starting at pos reads */
static int first_block(const attention_block_t *A, int pos) {
    return A->window && pos - A->window + 1 > 0 ? (pos - A->window + 1) / KV_BLOCK : 0;
}

/* one item = (run, kv heads [h0, h0 + heads_per_item)): a run is up to ATTN_MAX_TOKENS consecutive tokens of one
 * sequence (prefill), which share each KV block; the query heads of a KV head read it together; adjacent KV heads
 * are read block by block as one contiguous piece */
static void attention_fn(void *arg, int64_t begin, int64_t end, int thread) {
    stage_t *s = arg;
    context_t *c = s->c;
    const model_config_t *cfg = &c->model->cfg;
    const attention_block_t *A = &s->block->attn;
    int group = cfg->n_heads / cfg->n_kv_heads, qkv_dim = Q_DIM(cfg) + 2 * KV_DIM(cfg), hd = cfg->head_dim;
    size_t layer_off = (size_t)s->kv_layer * c->num_kv_blocks * KV_DIM(cfg) * KV_BLOCK;
    int q8 = c->kv_dtype == KV_Q8_0;                       /* int8 KV: attention_q8.c's slices */
    size_t q8_slice = q8 ? kvq8_slice_bytes(hd) : 0, q8_layer = (size_t)s->kv_layer * c->num_kv_blocks * cfg->n_kv_heads;
    float *scratch = c->attn_scratch + (size_t)thread * (q8 ? attention_q8_scratch_floats(cfg->n_heads, hd)
                                                            : attention_scratch_floats(cfg->n_heads, hd));
    for (int64_t item = begin; item < end; item++) {
        int run = (int)(item / s->items_per_run), h0 = (int)(item % s->items_per_run) * s->heads_per_item;
        int heads = cfg->n_kv_heads - h0 < s->heads_per_item ? cfg->n_kv_heads - h0 : s->heads_per_item;
        int t = c->runs[run], ntok = c->runs[run + 1] - t;
        const int32_t *bt = s->b->block_tables + (size_t)s->b->seq_of_token[t] * s->b->max_blocks_per_seq;
        size_t head_off = layer_off + (size_t)h0 * KV_BLOCK * hd;
        /* this thread's next item: its first KV block is fetched during this item's last block */
        const uint16_t *next_k = NULL, *next_v = NULL;
        const uint8_t *next_kq8 = NULL, *next_vq8 = NULL;
        if (item + 1 < end) {
            int nrun = (int)((item + 1) / s->items_per_run);
            int nh = (int)((item + 1) % s->items_per_run) * s->heads_per_item;
            int nseq = s->b->seq_of_token[c->runs[nrun]];
            int32_t blk = s->b->block_tables[(size_t)nseq * s->b->max_blocks_per_seq +
                                             first_block(A, s->b->positions[c->runs[nrun]])];
            size_t off = layer_off + ((size_t)blk * cfg->n_kv_heads + nh) * KV_BLOCK * hd;
            if (q8) {
                size_t at = (q8_layer + (size_t)blk * cfg->n_kv_heads + nh) * q8_slice;
                next_kq8 = c->k_q8 + at;
                next_vq8 = c->v_q8 + at;
            } else {
                next_k = c->k_cache + off;
                next_v = c->v_cache + off;
            }
        }
        if (s->fused_rope)
            for (int i = 0; i < ntok; i++) rope_kv_token(c, s, t + i, h0, heads);
        attn_span_t span = {.pos0 = s->b->positions[t], .seq_len = s->b->positions[t] + ntok, .causal = 1,
                            .window = A->window, .scale = A->scale,
                            .sinks = A->sinks ? A->sinks + (size_t)h0 * group : NULL,
                            .bf16 = c->kv_dtype == KV_BF16};
        if (q8)
            attention_tokens_q8(c->qkv + (size_t)t * qkv_dim + (size_t)h0 * group * hd, qkv_dim, ntok, group,
                                cfg->n_kv_heads, heads, hd, c->k_q8 + (q8_layer + h0) * q8_slice,
                                c->v_q8 + (q8_layer + h0) * q8_slice, bt, &span,
                                c->xn + (size_t)t * Q_DIM(cfg) + (size_t)h0 * group * hd, Q_DIM(cfg), scratch,
                                next_kq8, next_vq8);
        else
        attention_tokens(c->qkv + (size_t)t * qkv_dim + (size_t)h0 * group * hd, qkv_dim, ntok, group,
                         cfg->n_kv_heads, heads, hd, c->k_cache + head_off, c->v_cache + head_off, bt, &span,
                         c->xn + (size_t)t * Q_DIM(cfg) + (size_t)h0 * group * hd, Q_DIM(cfg), scratch, next_k,
                         next_v);
        for (int i = 0; i < ntok; i++) {                     /* Wo's input: blocks of 32 never straddle heads */
            size_t first = (size_t)h0 * group * hd;
            if (A->gated) output_gate(c, t + i, h0 * group, heads * group);
            quantize_act(c->xn + (size_t)(t + i) * Q_DIM(cfg) + first, heads * group * hd,
                         c->xq + (size_t)(t + i) * (Q_DIM(cfg) / QK) + first / QK);
        }
    }
}

/* A decode step with fewer runs than twice the threads (one long sequence, say) splits each (run, head) item further
 * by key segment: item = ((run, heads), segment). Each computes its segment's partial softmax state; the last of a
 * (run, heads) to finish merges them in segment order and quantizes the output for Wo. The merge is the very one
 * attention_tokens does between segments, so the bits match an unsplit step and a prefill of the same tokens,
 * with any number of threads. */
static void attention_split_fn(void *arg, int64_t begin, int64_t end, int thread) {
    stage_t *s = arg;
    context_t *c = s->c;
    const model_config_t *cfg = &c->model->cfg;
    const attention_block_t *A = &s->block->attn;
    int group = cfg->n_heads / cfg->n_kv_heads, qkv_dim = Q_DIM(cfg) + 2 * KV_DIM(cfg), hd = cfg->head_dim;
    size_t layer_off = (size_t)s->kv_layer * c->num_kv_blocks * KV_DIM(cfg) * KV_BLOCK;
    float *scratch = c->attn_scratch + (size_t)thread * attention_scratch_floats(cfg->n_heads, hd);
    size_t part = attention_part_floats(group * s->heads_per_item, hd);
    for (int64_t item = begin; item < end; item++) {
        int64_t pair = item / s->segments;
        int seg = (int)(item % s->segments);
        int run = (int)(pair / s->items_per_run), h0 = (int)(pair % s->items_per_run) * s->heads_per_item;
        int heads = cfg->n_kv_heads - h0 < s->heads_per_item ? cfg->n_kv_heads - h0 : s->heads_per_item;
        int t = c->runs[run];
        const int32_t *bt = s->b->block_tables + (size_t)s->b->seq_of_token[t] * s->b->max_blocks_per_seq;
        size_t head_off = layer_off + (size_t)h0 * KV_BLOCK * hd;
        attn_span_t span = {.pos0 = s->b->positions[t], .seq_len = s->b->positions[t] + 1, .causal = 1,
                            .window = A->window, .scale = A->scale, .bf16 = c->kv_dtype == KV_BF16};
        const float *q = c->qkv + (size_t)t * qkv_dim + (size_t)h0 * group * hd;
        float *parts = c->attn_parts + (size_t)pair * s->segments * part;
        attention_segment(q, qkv_dim, 1, group, cfg->n_kv_heads, heads, hd, c->k_cache + head_off,
                          c->v_cache + head_off, bt, &span, seg, parts + (size_t)seg * part, scratch);
        if (__atomic_sub_fetch(&c->attn_pending[pair], 1, __ATOMIC_ACQ_REL) != 0) continue;
        float *out = c->xn + (size_t)t * Q_DIM(cfg) + (size_t)h0 * group * hd;   /* the last one merges */
        attention_merge(parts, part, s->segments, 1, group, heads, hd, out, Q_DIM(cfg),
                        A->sinks ? A->sinks + (size_t)h0 * group : NULL);
        if (A->gated) output_gate(c, t, h0 * group, heads * group);
        quantize_act(out, heads * group * hd, c->xq + (size_t)t * (Q_DIM(cfg) / QK) + (size_t)h0 * group * hd / QK);
    }
}

/* splits the batch into runs of consecutive positions of one sequence, at most ATTN_MAX_TOKENS long: a stretch of
 * L such tokens into ceil(L / ATTN_MAX_TOKENS) runs of as equal lengths as can be, so that a chunk of 22 tokens makes
 * two items of 11 per KV head, which the pool's claims share evenly, not one of 16 and one of 6 (a run's bits do not
 * depend on which tokens share it) */
static int attention_runs(context_t *c, const batch_t *b) {
    int n = 0;
    for (int t = 0; t < b->num_tokens;) {
        int end = t + 1;
        while (end < b->num_tokens && b->seq_of_token[end] == b->seq_of_token[t] &&
               b->positions[end] == b->positions[end - 1] + 1)
            end++;
        int len = end - t, k = (len + ATTN_MAX_TOKENS - 1) / ATTN_MAX_TOKENS;
        for (int i = 0; i < k; i++) c->runs[n++] = t + (int)((int64_t)len * i / k);
        t = end;
    }
    c->runs[n] = b->num_tokens;
    return n;
}

void attention_plan(context_t *c, const batch_t *b, stage_t *s) {
    const model_config_t *cfg = &c->model->cfg;
    /* Attention items: a run with all its KV heads, or, when there are too few runs to keep every thread busy, with
     * a share of them. Claimed several at a time when there are enough, so that an item can fetch the next one's
     * first block. */
    int n_runs = attention_runs(c, b), threads = pool_size(c->pool);
    int splits = (2 * threads + n_runs - 1) / n_runs;
    splits = splits > cfg->n_kv_heads ? cfg->n_kv_heads : splits;
    s->n_runs = n_runs;
    s->heads_per_item = (cfg->n_kv_heads + splits - 1) / splits;
    s->items_per_run = (cfg->n_kv_heads + s->heads_per_item - 1) / s->heads_per_item;
    s->attn_items = (int64_t)n_runs * s->items_per_run;
    /* a decode step of few sequences, one of them long: its items split by key segment as well (the f16 kernels'
     * and bf16 kernels' segments; an int8 cache is read by attention_q8.c, whole) */
    s->segments = 1;
    if (c->kv_dtype != KV_Q8_0 && n_runs == b->num_tokens && n_runs < 2 * threads)
        for (int r = 0; r < n_runs; r++) {
            attn_span_t span = {.pos0 = b->positions[r], .causal = 1};
            int n = attention_num_segments(&span, 1);
            s->segments = n > s->segments && n <= c->attn_max_segments ? n : s->segments;
        }
    if (s->segments > 1) s->attn_items *= s->segments;
    s->attn_chunk = s->attn_items / (threads * 2);
    s->attn_chunk = s->attn_chunk < 1 ? 1 : s->attn_chunk > 8 ? 8 : s->attn_chunk;
    /* A run of many tokens is a long item (at depth, tens of milliseconds: its tokens against every key), so a
     * prefill's items are claimed one at a time: with several per claim, a thread that got the last claim (or lost
     * its core for a while to other work) keeps the others waiting for up to a quarter of the stage. */
    if (n_runs < b->num_tokens) s->attn_chunk = 1;
    /* Each attention item quantizes its heads' output for Wo itself. When every sequence has a single run, the item
     * also does its tokens' RoPE and K/V writes first: no other item reads them. A sequence with several runs (a
     * prefill chunk) needs a stage of its own for those, since its later runs read the K/V its earlier runs write.
     * Two parallel regions fewer per layer of a decode step. */
    s->fused_rope = n_runs == b->num_seqs && s->segments == 1;     /* segments of a run all read its K/V write */
}

void attention_block(context_t *c, stage_t *s, const block_t *B) {
    const model_config_t *cfg = &c->model->cfg;
    const attention_block_t *A = &B->attn;
    s->block = B;
    stage_prepare_input(c, s, c->x, cfg->dim, B->norm, &A->wqkv);                           /* rmsnorm(x) */
    stage_matmul(c, STAGE_QKV, s, &A->wqkv, c->qkv, 0);                                   /* qkv = Wqkv xn */
    if (s->lora) {                                               /* qkv += scale B (A xn) for the adapted tokens */
        lora_job_t job;
        lora_job_init(&job, c->xn, cfg->dim, c->qkv, Q_DIM(cfg) + 2 * KV_DIM(cfg));
        lora_job_add(&job, LORA_Q, 0, Q_DIM(cfg));
        lora_job_add(&job, LORA_K, Q_DIM(cfg), KV_DIM(cfg));
        lora_job_add(&job, LORA_V, Q_DIM(cfg) + KV_DIM(cfg), KV_DIM(cfg));
        stage_lora(c, s, &job);
    }
    if (A->gated) stage_matmul(c, STAGE_QKV, s, &A->wgate, c->attn_gate, 0);          /* gate = Wgate xn */
    if (A->qk_norm_full) stage_run(c, STAGE_ROPE_KV, s->ntok, 4, qk_norm_full_fn, s);     /* (no bias with it) */
    if (!s->fused_rope) stage_run(c, STAGE_ROPE_KV, s->ntok, 4, rope_kv_fn, s);         /* rope, cache k and v */
    if (s->segments > 1)
        for (int64_t i = 0; i < s->attn_items / s->segments; i++) c->attn_pending[i] = s->segments;
    stage_run(c, STAGE_ATTENTION, s->attn_items, s->attn_chunk, s->segments > 1 ? attention_split_fn : attention_fn,
              s);
    stage_set_input(s, c->xn, Q_DIM(cfg), c->xq);                          /* the attention items quantized it */
    stage_matmul_residual(c, STAGE_WO, s, &A->wo, A->o_bias, B->post_norm, LORA_O);               /* x += Wo attn */
}
