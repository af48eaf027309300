/* One step of the model over a flat batch: every token of every sequence in the batch, prefill chunks and
 * decode tokens mixed, then logits for the rows that need them, then sampling. Read it top to bottom in
 * forward(); each stage is one parallel region over the thread pool. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "inferd.h"

#define Q_DIM(c) ((c)->n_heads * (c)->head_dim)
#define KV_DIM(c) ((c)->n_kv_heads * (c)->head_dim)

/* ---- parallel stages: each is fn(arg, begin, end, thread) over items ---- */

typedef struct {
    context_t *c;
    const batch_t *b;
    int layer;
    const weight_t *w;
    const float *in;         /* (ntok, in_dim) the matmul's input, or the norm's */
    const float *gamma;      /* rmsnorm weights (NULL: the matmul reads `in` itself) */
    const float *post_gamma; /* a sublayer's post-norm weights */
    float *out;              /* (ntok, in_dim) normed copy, for a float weight (else NULL) */
    int ntok, in_dim;
    const block_q8x *xq;     /* the matmul's quantized input: (ntok, in_dim / 32) */
    float *y;                /* (ntok, ldy) */
    int ldy, accumulate;
    int heads_per_item, items_per_run;   /* attention: KV heads per item, items per run */
    int fused_rope;                      /* attention items do their tokens' RoPE and K/V writes too */
    int segments;                        /* attention: key segments per item of a split decode step, or 1 */
} stage_t;

static void embed_fn(void *arg, int64_t begin, int64_t end, int thread) {
    stage_t *s = arg;
    (void)thread;
    const model_config_t *cfg = &s->c->model->cfg;
    for (int64_t t = begin; t < end; t++) {
        float *x = s->c->x + t * cfg->dim;
        weight_dequant_row(&s->c->model->tok_embd, s->b->token_ids[t], x);
        if (cfg->embed_scale > 0)                 /* Gemma: sqrt(dim), in float32 as llama.cpp does */
            for (int i = 0; i < cfg->dim; i++) x[i] *= cfg->embed_scale;
    }
}

/* rmsnorm and 8-bit quantization of each token's input row. The normed row is stored in `out` only when a float
 * weight will read it; for a quantized weight it stays in this thread's row in L1: no (tokens, dim) buffer written
 * and read back per norm (measured: bench/results/design_measurements.md). */
static void norm_quant_fn(void *arg, int64_t begin, int64_t end, int thread) {
    stage_t *s = arg;
    for (int64_t t = begin; t < end; t++) {
        float *normed = s->out ? s->out + t * s->in_dim : s->c->norm_rows + (size_t)thread * s->in_dim;
        rmsnorm(s->in + t * s->in_dim, s->gamma, s->in_dim, s->c->model->cfg.norm_eps, normed);
        quantize_act(normed, s->in_dim, s->c->xq + t * (s->in_dim / QK));
    }
}

/* items are pairs of tiles: the prefill kernels work on two tiles at a time (qpair512.c) */
static void matmul_fn(void *arg, int64_t begin, int64_t end, int thread) {
    stage_t *s = arg;
    (void)thread;
    const float *x = s->gamma ? s->out : s->in;
    int ntiles = matmul_num_tiles(s->w), t0 = 2 * (int)begin, t1 = 2 * (int)end < ntiles ? 2 * (int)end : ntiles;
    matmul_tiles(&s->c->kernels, s->w, t0, t1, s->ntok, x, s->xq, s->y + (size_t)t0 * TILE_ROWS, s->ldy,
                 s->accumulate);
}

/* One item = 32 hidden units: the 8 tiles of Wgu holding their gate rows then their up rows (weights.py orders
 * them so) give gate and up for every token; h = silu(gate) * up is then quantized as the down projection's
 * input block right away, while it is in cache, instead of in a pass of its own over the whole (tokens, 2 hidden)
 * result. h is copied out in floats only for a float-weight down projection, the one reader of c->h. */
static void gate_up_swiglu_fn(void *arg, int64_t begin, int64_t end, int thread) {
    stage_t *s = arg;
    context_t *c = s->c;
    int hidden = c->model->cfg.hidden, nb = hidden / QK, half = QK / TILE_ROWS, T = s->ntok;
    int float_down = !weight_is_quantized(c->model->layers[s->layer].wdown.type);
    float *g = c->gu + (size_t)thread * c->max_tokens * 2 * QK, *u = g + (size_t)c->max_tokens * QK;  /* (T, 32) */
    for (int64_t j = begin; j < end; j++) {
        int tile = (int)j * 2 * half;
        matmul_tiles(&c->kernels, s->w, tile, tile + half, T, s->out, s->xq, g, QK, 0);
        matmul_tiles(&c->kernels, s->w, tile + half, tile + 2 * half, T, s->out, s->xq, u, QK, 0);
        if (c->model->cfg.ffn_gelu) geglu(g, u, g, T * QK);                  /* h, in place of gate */
        else swiglu(g, u, g, T * QK);
        quantize_act_strided(g, T * QK, c->xq_h + j, nb);                     /* token t's block j */
        if (float_down)
            for (int t = 0; t < T; t++)
                memcpy(c->h + (size_t)t * hidden + j * QK, g + (size_t)t * QK, QK * sizeof(float));
    }
}

/* x += rmsnorm(y) for each token: a sandwich norm of a sublayer's output (Gemma), then the residual add */
static void post_norm_add_fn(void *arg, int64_t begin, int64_t end, int thread) {
    stage_t *s = arg;
    (void)thread;
    int dim = s->c->model->cfg.dim;
    for (int64_t t = begin; t < end; t++) {
        float *y = s->c->y + t * dim, *x = s->c->x + t * dim;
        rmsnorm(y, s->post_gamma, dim, s->c->model->cfg.norm_eps, y);
        for (int i = 0; i < dim; i++) x[i] += y[i];
    }
}

/* QKV bias, QK-norm, RoPE on q and k, and k and v written to the cache at the token's position: for token t's KV
 * heads [h0, h0 + heads) and their query heads (each head's arithmetic is its own, so any split gives the same bits) */
static void rope_kv_token(context_t *c, const stage_t *s, int64_t t, int h0, int heads) {
    const model_config_t *cfg = &c->model->cfg;
    const layer_t *L = &c->model->layers[s->layer];
    int hd = cfg->head_dim, group = cfg->n_heads / cfg->n_kv_heads, qkv_dim = Q_DIM(cfg) + 2 * KV_DIM(cfg);
    float *q = c->qkv + t * qkv_dim + (size_t)h0 * group * hd;
    float *k = c->qkv + t * qkv_dim + Q_DIM(cfg) + (size_t)h0 * hd, *v = k + KV_DIM(cfg);
    if (L->qkv_bias) {
        const float *bq = L->qkv_bias + (size_t)h0 * group * hd, *bk = L->qkv_bias + Q_DIM(cfg) + (size_t)h0 * hd;
        for (int i = 0; i < heads * group * hd; i++) q[i] += bq[i];
        for (int i = 0; i < heads * hd; i++) { k[i] += bk[i]; v[i] += bk[KV_DIM(cfg) + i]; }
    }
    if (L->q_norm) {                                     /* QK-norm: each head on its own, before RoPE */
        for (int h = 0; h < heads * group; h++) rmsnorm(q + h * hd, L->q_norm, hd, cfg->norm_eps, q + h * hd);
        for (int h = 0; h < heads; h++) rmsnorm(k + h * hd, L->k_norm, hd, cfg->norm_eps, k + h * hd);
    }
    int pos = s->b->positions[t];
    const float *cs = L->rope_cos_sin + (size_t)pos * hd;
    rope_apply(q, heads * group, hd, cs, cfg->rope_neox);
    rope_apply(k, heads, hd, cs, cfg->rope_neox);
    const int32_t *bt = s->b->block_tables + (size_t)s->b->seq_of_token[t] * s->b->max_blocks_per_seq;
    if (c->kv_dtype == KV_Q8_0) {                        /* int8 KV: attention_q8.c's slices */
        size_t sl = kvq8_slice_bytes(hd);
        size_t at = (((size_t)s->layer * c->num_kv_blocks + bt[pos / KV_BLOCK]) * cfg->n_kv_heads + h0) * sl;
        for (int h = 0; h < heads; h++) {
            kvq8_store(k + h * hd, hd, c->k_q8 + at + h * sl, pos % KV_BLOCK, 1);
            kvq8_store(v + h * hd, hd, c->v_q8 + at + h * sl, pos % KV_BLOCK, 0);
        }
        return;
    }
    size_t slot = ((size_t)s->layer * c->num_kv_blocks + bt[pos / KV_BLOCK]) * KV_DIM(cfg) * KV_BLOCK;
    for (int h = 0; h < heads; h++) {
        size_t off = slot + ((size_t)(h0 + h) * KV_BLOCK + pos % KV_BLOCK) * hd;
        kv_store_key(k + h * hd, c->k_cache + off - pos % KV_BLOCK * hd, pos % KV_BLOCK, hd);
        store_f16(v + h * hd, c->v_cache + off, hd);
    }
}

static void rope_kv_fn(void *arg, int64_t begin, int64_t end, int thread) {
    stage_t *s = arg;
    (void)thread;
    for (int64_t t = begin; t < end; t++) rope_kv_token(s->c, s, t, 0, s->c->model->cfg.n_kv_heads);
}

/* the first KV block a run starting at pos reads in layer L */
static int first_block(const layer_t *L, int pos) {
    return L->window && pos - L->window + 1 > 0 ? (pos - L->window + 1) / KV_BLOCK : 0;
}

/* one item = (run, kv heads [h0, h0 + heads_per_item)): a run is up to ATTN_MAX_TOKENS consecutive tokens of one
 * sequence (prefill), which share each KV block; the query heads of a KV head read it together; adjacent KV heads
 * are read block by block as one contiguous piece */
static void attention_fn(void *arg, int64_t begin, int64_t end, int thread) {
    stage_t *s = arg;
    context_t *c = s->c;
    const model_config_t *cfg = &c->model->cfg;
    const layer_t *L = &c->model->layers[s->layer];
    int group = cfg->n_heads / cfg->n_kv_heads, qkv_dim = Q_DIM(cfg) + 2 * KV_DIM(cfg), hd = cfg->head_dim;
    float scale = cfg->attn_scale > 0 ? cfg->attn_scale : 1.0f / sqrtf((float)hd);
    size_t layer_off = (size_t)s->layer * c->num_kv_blocks * KV_DIM(cfg) * KV_BLOCK;
    int q8 = c->kv_dtype == KV_Q8_0;                       /* int8 KV: attention_q8.c's slices */
    size_t q8_slice = q8 ? kvq8_slice_bytes(hd) : 0, q8_layer = (size_t)s->layer * c->num_kv_blocks * cfg->n_kv_heads;
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
                                             first_block(L, s->b->positions[c->runs[nrun]])];
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
                            .window = L->window, .scale = scale};
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
    const layer_t *L = &c->model->layers[s->layer];
    int group = cfg->n_heads / cfg->n_kv_heads, qkv_dim = Q_DIM(cfg) + 2 * KV_DIM(cfg), hd = cfg->head_dim;
    float scale = cfg->attn_scale > 0 ? cfg->attn_scale : 1.0f / sqrtf((float)hd);
    size_t layer_off = (size_t)s->layer * c->num_kv_blocks * KV_DIM(cfg) * KV_BLOCK;
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
                            .window = L->window, .scale = scale};
        const float *q = c->qkv + (size_t)t * qkv_dim + (size_t)h0 * group * hd;
        float *parts = c->attn_parts + (size_t)pair * s->segments * part;
        attention_segment(q, qkv_dim, 1, group, cfg->n_kv_heads, heads, hd, c->k_cache + head_off,
                          c->v_cache + head_off, bt, &span, seg, parts + (size_t)seg * part, scratch);
        if (__atomic_sub_fetch(&c->attn_pending[pair], 1, __ATOMIC_ACQ_REL) != 0) continue;
        float *out = c->xn + (size_t)t * Q_DIM(cfg) + (size_t)h0 * group * hd;   /* the last one merges */
        attention_merge(parts, part, s->segments, 1, group, heads, hd, out, Q_DIM(cfg));
        quantize_act(out, heads * group * hd, c->xq + (size_t)t * (Q_DIM(cfg) / QK) + (size_t)h0 * group * hd / QK);
    }
}

/* splits the batch into runs of consecutive positions of one sequence, at most ATTN_MAX_TOKENS long */
static int attention_runs(context_t *c, const batch_t *b) {
    int n = 0;
    for (int t = 0; t < b->num_tokens; t++) {
        int start = c->runs[n > 0 ? n - 1 : 0];
        if (n == 0 || t - start == ATTN_MAX_TOKENS || b->seq_of_token[t] != b->seq_of_token[t - 1] ||
            b->positions[t] != b->positions[t - 1] + 1)
            c->runs[n++] = t;
    }
    c->runs[n] = b->num_tokens;
    return n;
}

static void sample_fn(void *arg, int64_t begin, int64_t end, int thread) {
    stage_t *s = arg;
    context_t *c = s->c;
    const batch_t *b = s->b;
    int vocab = c->model->cfg.vocab;
    void *scratch = (char *)c->sample_scratch + (size_t)thread * vocab * 16;
    float cap = c->model->cfg.logit_softcap;
    for (int64_t i = begin; i < end; i++) {
        float *row = c->logits + i * vocab;
        if (cap > 0)                            /* cap * tanh(x / cap), scaled by the reciprocal as llama.cpp does */
            for (int j = 0; j < vocab; j++) row[j] = cap * tanhf(row[j] * (1.0f / cap));
        if (b->logits_out) memcpy(b->logits_out + i * vocab, row, (size_t)vocab * sizeof(float));
        const sample_params_t *sp = &b->params[i];
        const uint32_t *allowed = b->token_masks && sp->mask_row >= 0
                                  ? b->token_masks + (size_t)sp->mask_row * ((vocab + 31) / 32) : NULL;
        if (b->sample_mask[i])
            sample_row(row, vocab, sp, b->positions[b->out_rows[i]] + 1, b->history, b->bias_ids, b->bias_values,
                       allowed, scratch, &b->samples[i]);
    }
}

/* ---- the step ---- */

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* one parallel region; with profiling on, its wall time is added to the stage's total */
static void run(context_t *c, int stage, int64_t n, int64_t chunk, pool_fn fn, stage_t *s) {
    if (!c->profile_on) { pool_run(c->pool, n, chunk, fn, s); return; }
    double t0 = now_seconds();
    pool_run(c->pool, n, chunk, fn, s);
    c->profile[stage] += now_seconds() - t0;
}

static void matmul(context_t *c, int stage, stage_t *s, const weight_t *w, float *y, int accumulate) {
    s->w = w; s->y = y; s->ldy = w->rows; s->accumulate = accumulate;
    run(c, stage, (matmul_num_tiles(w) + 1) / 2, 1, matmul_fn, s);
}

/* the next matmul reads `in` (floats, for a float weight) and xq, quantized already */
static void set_input(stage_t *s, const float *in, int in_dim, const block_q8x *xq) {
    s->in = in; s->in_dim = in_dim; s->gamma = NULL; s->out = NULL; s->xq = xq;
}

/* xq = quantize(rmsnorm(in)) for the matmul by `reader` (and xn = rmsnorm(in) if that weight is in floats) */
static void prepare_input(context_t *c, stage_t *s, const float *in, int in_dim, const float *gamma,
                          const weight_t *reader) {
    s->in = in; s->in_dim = in_dim; s->gamma = gamma; s->xq = c->xq;
    s->out = weight_is_quantized(reader->type) ? NULL : c->xn;
    run(c, STAGE_NORM_QUANT, s->ntok, 4, norm_quant_fn, s);
}

/* x += W in, or, with a post-norm (Gemma's sandwich norms), x += rmsnorm(W in) */
static void matmul_residual(context_t *c, int stage, stage_t *s, const weight_t *w, const float *post_norm) {
    if (!post_norm) { matmul(c, stage, s, w, c->x, 1); return; }
    matmul(c, stage, s, w, c->y, 0);
    s->post_gamma = post_norm;
    run(c, STAGE_NORM_QUANT, s->ntok, 4, post_norm_add_fn, s);
}

static int check_batch(const context_t *c, const batch_t *b) {
    const model_config_t *cfg = &c->model->cfg;
    if (b->num_tokens < 1 || b->num_tokens > c->max_tokens || b->num_out < 0 || b->num_out > c->max_out)
        return FORWARD_BAD_SIZE;
    for (int t = 0; t < b->num_tokens; t++) {
        int pos = b->positions[t], seq = b->seq_of_token[t];
        if (b->token_ids[t] < 0 || b->token_ids[t] >= cfg->vocab) return FORWARD_BAD_TOKEN;
        if (pos < 0 || pos >= cfg->context_length || pos / KV_BLOCK >= b->max_blocks_per_seq) return FORWARD_BAD_POSITION;
        if (seq < 0 || seq >= b->num_seqs) return FORWARD_BAD_SEQUENCE;
        /* every block the token attends to must exist */
        for (int blk = 0; blk <= pos / KV_BLOCK; blk++) {
            int id = b->block_tables[(size_t)seq * b->max_blocks_per_seq + blk];
            if (id < 0 || id >= c->num_kv_blocks) return FORWARD_BAD_BLOCK;
        }
    }
    for (int i = 0; i < b->num_out; i++) {
        const sample_params_t *p = &b->params[i];
        if (b->out_rows[i] < 0 || b->out_rows[i] >= b->num_tokens) return FORWARD_BAD_OUT_ROW;
        if (p->history_offset < 0 || p->history_len < 0 || p->history_offset + p->history_len > b->num_history ||
            p->bias_offset < 0 || p->bias_len < 0 || p->bias_offset + p->bias_len > b->num_bias ||
            p->num_logprobs > MAX_TOP_LOGPROBS)
            return FORWARD_BAD_SAMPLE_PARAMS;
        if (b->token_masks && b->sample_mask[i] && p->mask_row >= b->num_masks) return FORWARD_BAD_MASK_ROW;
    }
    return FORWARD_OK;
}

int forward(context_t *c, const batch_t *b) {
    const model_t *m = c->model;
    const model_config_t *cfg = &m->cfg;
    int rc = check_batch(c, b);
    if (rc) return rc;
    int T = b->num_tokens, dim = cfg->dim;
    stage_t s = {.c = c, .b = b, .ntok = T};
    /* Attention items: a run with all its KV heads, or, when there are too few runs to keep every thread busy, with
     * a share of them. Claimed several at a time when there are enough, so that an item can fetch the next one's
     * first block. */
    int n_runs = attention_runs(c, b), threads = pool_size(c->pool);
    int splits = (2 * threads + n_runs - 1) / n_runs;
    splits = splits > cfg->n_kv_heads ? cfg->n_kv_heads : splits;
    s.heads_per_item = (cfg->n_kv_heads + splits - 1) / splits;
    s.items_per_run = (cfg->n_kv_heads + s.heads_per_item - 1) / s.heads_per_item;
    int64_t attn_items = (int64_t)n_runs * s.items_per_run;
    /* a decode step of few sequences, one of them long: its items split by key segment as well (the f16 kernels'
     * segments; an int8 cache is read by attention_q8.c, whole) */
    s.segments = 1;
    if (c->kv_dtype == KV_F16 && n_runs == T && n_runs < 2 * threads)
        for (int r = 0; r < n_runs; r++) {
            attn_span_t span = {.pos0 = b->positions[r], .causal = 1};
            int n = attention_num_segments(&span, 1);
            s.segments = n > s.segments && n <= c->attn_max_segments ? n : s.segments;
        }
    if (s.segments > 1) attn_items *= s.segments;
    int64_t attn_chunk = attn_items / (threads * 2);
    attn_chunk = attn_chunk < 1 ? 1 : attn_chunk > 8 ? 8 : attn_chunk;

    /* Each attention item quantizes its heads' output for Wo itself. When every sequence has a single run, the item
     * also does its tokens' RoPE and K/V writes first: no other item reads them. A sequence with several runs (a
     * prefill chunk) needs a stage of its own for those, since its later runs read the K/V its earlier runs write.
     * Two parallel regions fewer per layer of a decode step: 1% of its time (interleaved A/B, 8 sequences). */
    s.fused_rope = n_runs == b->num_seqs && s.segments == 1;     /* segments of a run all read its K/V write */

    run(c, STAGE_EMBED, T, 16, embed_fn, &s);                                      /* x = embed(tokens) */
    if (b->hidden_out) memcpy(b->hidden_out, c->x, (size_t)T * dim * sizeof(float));
    for (int l = 0; l < cfg->n_layers; l++) {
        const layer_t *L = &m->layers[l];
        s.layer = l;
        prepare_input(c, &s, c->x, dim, L->attn_norm, &L->wqkv);                 /* rmsnorm(x) */
        matmul(c, STAGE_QKV, &s, &L->wqkv, c->qkv, 0);                         /* qkv = Wqkv xn */
        if (!s.fused_rope) run(c, STAGE_ROPE_KV, T, 4, rope_kv_fn, &s);           /* rope, cache k and v */
        if (s.segments > 1)
            for (int64_t i = 0; i < attn_items / s.segments; i++) c->attn_pending[i] = s.segments;
        run(c, STAGE_ATTENTION, attn_items, attn_chunk, s.segments > 1 ? attention_split_fn : attention_fn, &s);
        set_input(&s, c->xn, Q_DIM(cfg), c->xq);                    /* the attention items quantized it */
        matmul_residual(c, STAGE_WO, &s, &L->wo, L->post_attn_norm);          /* x += Wo attn */
        prepare_input(c, &s, c->x, dim, L->ffn_norm, &L->wgu);                   /* rmsnorm(x) */
        s.w = &L->wgu;                                             /* h = silu(Wgate xn) * (Wup xn) */
        run(c, STAGE_GATE_UP_SWIGLU, cfg->hidden / QK, 1, gate_up_swiglu_fn, &s);
        set_input(&s, c->h, cfg->hidden, c->xq_h);                  /* gate|up quantized h into xq_h */
        matmul_residual(c, STAGE_DOWN, &s, &L->wdown, L->post_ffn_norm);        /* x += Wdown h */
        if (b->hidden_out) memcpy(b->hidden_out + (size_t)(l + 1) * T * dim, c->x, (size_t)T * dim * sizeof(float));
    }
    if (b->final_out)
        for (int t = 0; t < T; t++)
            rmsnorm(c->x + (size_t)t * dim, m->output_norm, dim, cfg->norm_eps, b->final_out + (size_t)t * dim);
    if (b->num_out == 0) return 0;
    /* logits only for the rows that need them: gather them to the front of x (out_rows ascend) */
    for (int i = 0; i < b->num_out; i++)
        if (b->out_rows[i] != i) memmove(c->x + (size_t)i * dim, c->x + (size_t)b->out_rows[i] * dim, dim * sizeof(float));
    s.ntok = b->num_out;
    prepare_input(c, &s, c->x, dim, m->output_norm, &m->output);
    matmul(c, STAGE_OUTPUT, &s, &m->output, c->logits, 0);
    run(c, STAGE_SAMPLE, b->num_out, 1, sample_fn, &s);
    return 0;
}

/* ---- context ---- */

context_t *context_create(const model_t *m, int max_tokens, int max_out, int num_kv_blocks, int threads) {
    return context_create_kv(m, max_tokens, max_out, num_kv_blocks, threads, KV_F16);
}

context_t *context_create_kv(const model_t *m, int max_tokens, int max_out, int num_kv_blocks, int threads,
                             int kv_dtype) {
    const model_config_t *cfg = &m->cfg;
    if ((kv_dtype != KV_F16 && kv_dtype != KV_Q8_0) || (kv_dtype == KV_Q8_0 && cfg->head_dim % QK)) return NULL;
    context_t *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->kv_dtype = kv_dtype;
    c->model = m;
    kernel_config_default(&c->kernels);
    c->max_tokens = max_tokens;
    c->max_out = max_out < max_tokens ? max_out : max_tokens;
    c->num_kv_blocks = num_kv_blocks;
    c->pool = pool_create(threads);
    int nt = pool_size(c->pool);
    int qkv_dim = Q_DIM(cfg) + 2 * KV_DIM(cfg);
    int wide = cfg->dim > Q_DIM(cfg) ? cfg->dim : Q_DIM(cfg);
    size_t kv = (size_t)cfg->n_layers * num_kv_blocks * KV_DIM(cfg) * KV_BLOCK;
    /* 4 KB pages, faulted as blocks are first used: a 2 MB page's fault would land on the first requests'
     * prefill, and huge pages gain decode far less on the KV cache than on the weights
     * (bench/results/design_measurements.md). */
    if (kv_dtype == KV_Q8_0) {
        size_t q8 = (size_t)cfg->n_layers * num_kv_blocks * cfg->n_kv_heads * kvq8_slice_bytes(cfg->head_dim);
        c->k_q8 = calloc(q8, 1);
        c->v_q8 = calloc(q8, 1);
    } else {
        c->k_cache = calloc(kv, sizeof(uint16_t));
        c->v_cache = calloc(kv, sizeof(uint16_t));
    }
    size_t attn_scratch = attention_scratch_floats(cfg->n_heads, cfg->head_dim);
    if (kv_dtype == KV_Q8_0) attn_scratch = attention_q8_scratch_floats(cfg->n_heads, cfg->head_dim);
    c->x = malloc((size_t)max_tokens * cfg->dim * sizeof(float));
    c->xn = malloc((size_t)max_tokens * wide * sizeof(float));
    c->norm_rows = malloc((size_t)nt * cfg->dim * sizeof(float));
    c->qkv = malloc((size_t)max_tokens * qkv_dim * sizeof(float));
    c->gu = malloc((size_t)nt * max_tokens * 2 * QK * sizeof(float));
    c->h = malloc((size_t)max_tokens * cfg->hidden * sizeof(float));
    int post_norms = 0;
    for (int l = 0; l < cfg->n_layers; l++) post_norms |= m->layers[l].post_attn_norm || m->layers[l].post_ffn_norm;
    c->y = post_norms ? malloc((size_t)max_tokens * cfg->dim * sizeof(float)) : NULL;
    c->runs = malloc((size_t)(max_tokens + 1) * sizeof(int32_t));
    c->xq = malloc((size_t)max_tokens * (wide / QK) * sizeof(block_q8x));
    c->xq_h = malloc((size_t)max_tokens * (cfg->hidden / QK) * sizeof(block_q8x));
    c->logits = malloc((size_t)c->max_out * cfg->vocab * sizeof(float));
    c->attn_scratch = malloc((size_t)nt * attn_scratch * sizeof(float));
    c->attn_max_segments = (cfg->context_length + ATTN_SEGMENT_BLOCKS * KV_BLOCK - 1) / (ATTN_SEGMENT_BLOCKS * KV_BLOCK);
    size_t split_pairs = (size_t)2 * nt * cfg->n_kv_heads;     /* (run, heads) pairs: fewer than 2 nt runs */
    c->attn_parts = malloc(2 * split_pairs * c->attn_max_segments *   /* (a pair's heads: under 2 n_kv / pairs) */
                           attention_part_floats(cfg->n_heads / cfg->n_kv_heads, cfg->head_dim) * sizeof(float));
    c->attn_pending = malloc(split_pairs * sizeof(int));
    c->sample_scratch = calloc((size_t)nt * cfg->vocab, 16);
    int kv_ok = kv_dtype == KV_Q8_0 ? c->k_q8 && c->v_q8 : c->k_cache && c->v_cache;
    if (!c->pool || !kv_ok || !c->x || !c->xn || !c->norm_rows || !c->qkv || !c->gu || !c->h ||
        !c->xq || !c->xq_h || !c->logits || !c->attn_scratch || !c->sample_scratch || !c->runs ||
        !c->attn_parts || !c->attn_pending ||
        (post_norms && !c->y)) {
        context_free(c);
        return NULL;
    }
    return c;
}

void context_free(context_t *c) {
    if (!c) return;
    pool_destroy(c->pool);
    free(c->k_cache); free(c->v_cache); free(c->k_q8); free(c->v_q8);
    free(c->x); free(c->xn); free(c->norm_rows); free(c->qkv); free(c->gu);
    free(c->h); free(c->y); free(c->xq); free(c->xq_h); free(c->runs); free(c->logits); free(c->attn_scratch);
    free(c->attn_parts); free(c->attn_pending);
    free(c->sample_scratch);
    free(c);
}
