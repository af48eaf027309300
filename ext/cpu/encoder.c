/* One forward pass of an encoder over a flat batch of whole sequences (many short inputs at once), then pooling,
 * the sentence-transformers Dense layers and L2 normalization: one call, each stage one parallel region.
 *
 *   BERT (post-norm):  x = LN(word + position + type)
 *                      per layer: x = LN1(x + Wo attn(Wqkv x + b) + b);  x = LN2(x + Wdown gelu(Wup x + b) + b)
 *                      nomic-bert: no position table but rope(q, k); the FFN Wdown (silu(Wgate x) * Wup x)
 *   Gemma 3 (pre-norm with sandwich norms, bidirectional):  x = word * sqrt(dim)
 *                      per layer: q, k = rope(rmsnorm per head(Wqkv rms(x)));  x += rms(Wo attn);
 *                                 x += rms(Wdown (gelu_tanh(Wgate rms(x)) * Wup rms(x)));   then rms(x)
 *
 * Matmuls run in items of (up to ENC_CHUNK tokens, 32 output rows), so a chunk's activations stay in L2 while a
 * matrix streams past: quantized weights through the decoder's int8 kernels (matmul_tiles, 8-bit activations: on
 * a CPU with AVX-512 VNNI its pairs of tiles, with AMX for each 16 tokens where the CPU has it), float weights
 * through an outer-product GEMM over 16-row panels (gemm_panels.c). Attention needs no cache: each (sequence, query head) item reads the sequence's own keys and values.
 * Every reduction has a fixed order, so a sequence's vector does not depend on what else is in the batch. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "encoder.h"

#define ENC_CHUNK 64             /* tokens per matmul item */
#define TILES_PER_ITEM 4         /* 32 output rows per matmul item */

#define Q_DIM(c) ((c)->n_heads * (c)->head_dim)
#define KV_DIM(c) ((c)->n_kv_heads * (c)->head_dim)
#define QKV_DIM(c) (Q_DIM(c) + 2 * KV_DIM(c))

typedef struct {
    encoder_ctx_t *c;
    const enc_batch_t *b;
    int layer;
    int ntok;
    int32_t *seq_of;            /* (num_tokens) sequence of each token */
    /* a chunked matmul: y (ntok, ldy) (+)= W in + bias */
    const weight_t *w;
    const void *panels;         /* w's panels when it is a float weight (gemm_panels.c) */
    const uint16_t *panels_bf;  /* or its bf16 panels, which read xbf */
    const float *in;
    const block_q8x *xq;
    float *y;
    int ldy, accumulate, n_groups;
    const float *bias;
    int second;                 /* residual_norm_fn: after the FFN (1) or after attention (0) */
    const float *pool_in;       /* (num_seqs, dim) what the pooling reads */
} estage_t;

static int is_quant(const weight_t *w) { return weight_is_quantized(w->type); }

/* ---- stages: fn(arg, begin, end, thread) over items ---- */

static void matmul_chunk_fn(void *arg, int64_t begin, int64_t end, int thread) {
    estage_t *s = arg;
    (void)thread;
    int tiles = matmul_num_tiles(s->w), nb = s->w->cols / QK;
    for (int64_t item = begin; item < end; item++) {
        int t0 = (int)(item / s->n_groups) * ENC_CHUNK, g = (int)(item % s->n_groups);
        int nt = s->ntok - t0 < ENC_CHUNK ? s->ntok - t0 : ENC_CHUNK;
        int tile0 = g * TILES_PER_ITEM, tile1 = tile0 + TILES_PER_ITEM < tiles ? tile0 + TILES_PER_ITEM : tiles;
        float *y = s->y + (size_t)t0 * s->ldy;
        if (s->panels || s->panels_bf) {
            int per = TILES_PER_ITEM * TILE_ROWS / PANEL_ROWS, np = (s->w->rows + PANEL_ROWS - 1) / PANEL_ROWS;
            int p0 = g * per, p1 = (g + 1) * per < np ? (g + 1) * per : np;
            if (s->panels_bf)
                gemm_panels_bf16(s->panels_bf, s->w->rows, s->w->cols, p0, p1, nt,
                                 s->c->xbf + (size_t)t0 * s->w->cols, y + p0 * PANEL_ROWS, s->ldy, s->accumulate);
            else
                gemm_panels(s->panels, s->w->type, s->w->rows, s->w->cols, p0, p1, nt,
                            s->in + (size_t)t0 * s->w->cols, y + p0 * PANEL_ROWS, s->ldy, s->accumulate);
        } else {
            matmul_tiles(&s->c->kernels, s->w, tile0, tile1, nt, s->in + (size_t)t0 * s->w->cols,
                         s->xq + (size_t)t0 * nb, y + tile0 * TILE_ROWS, s->ldy, s->accumulate);
        }
        if (s->bias) {
            int r1 = tile1 * TILE_ROWS < s->w->rows ? tile1 * TILE_ROWS : s->w->rows;
            add_bias(y + tile0 * TILE_ROWS, s->ldy, nt, s->bias + tile0 * TILE_ROWS, r1 - tile0 * TILE_ROWS);
        }
    }
}

/* xbf = bf16(in) for a weight in bf16 panels */
static void to_bf16_fn(void *arg, int64_t begin, int64_t end, int thread) {
    estage_t *s = arg;
    int dim = s->c->model->cfg.dim;
    (void)thread;
    for (int64_t t = begin; t < end; t++) f32_to_bf16_row(s->in + t * dim, dim, s->c->xbf + t * dim);
}

/* quantizes row t of `in` (n values) as the input of `reader` when that weight is quantized */
static void quantize_for(const weight_t *reader, const float *in, int n, block_q8x *xq) {
    if (reader && is_quant(reader)) quantize_act(in, n, xq);
}

static const weight_t *first_reader(const encoder_t *m, int layer) {
    return layer < m->cfg.n_layers ? &m->layers[layer].wqkv : NULL;
}

static void embed_fn(void *arg, int64_t begin, int64_t end, int thread) {
    estage_t *s = arg;
    const encoder_t *m = s->c->model;
    const encoder_config_t *cfg = &m->cfg;
    int dim = cfg->dim;
    (void)thread;
    for (int64_t t = begin; t < end; t++) {
        float *x = s->c->x + t * dim;
        weight_dequant_row(&m->tok_embd, s->b->token_ids[t], x);
        if (cfg->arch == ENC_BERT) {
            int pos = (int)t - s->b->seq_start[s->seq_of[t]];
            const float *pe = cfg->rotary ? NULL : m->pos_embd + (size_t)pos * dim;
            const float *te = m->type_embd + (size_t)(s->b->type_ids ? s->b->type_ids[t] : 0) * dim;
            if (cfg->rotary)
                for (int i = 0; i < dim; i++) x[i] = x[i] + te[i];
            else
                for (int i = 0; i < dim; i++) x[i] = x[i] + pe[i] + te[i];
            layernorm(x, m->embd_norm_w, m->embd_norm_b, dim, cfg->norm_eps, x);
            quantize_for(first_reader(m, 0), x, dim, s->c->xq + t * (dim / QK));
        } else {
            for (int i = 0; i < dim; i++) x[i] *= cfg->embed_scale;
            float *xn = s->c->xn + t * dim;
            rmsnorm(x, m->layers[0].attn_norm, dim, cfg->norm_eps, xn);
            quantize_for(first_reader(m, 0), xn, dim, s->c->xq + t * (dim / QK));
        }
    }
}

/* Gemma: q and k of each head RMS-normed, then rotated (the local table on sliding layers); rotary BERT: rotated */
static void qk_prep_fn(void *arg, int64_t begin, int64_t end, int thread) {
    estage_t *s = arg;
    const encoder_t *m = s->c->model;
    const encoder_config_t *cfg = &m->cfg;
    const enc_layer_t *L = &m->layers[s->layer];
    int hd = cfg->head_dim;
    (void)thread;
    for (int64_t t = begin; t < end; t++) {
        float *q = s->c->qkv + t * QKV_DIM(cfg), *k = q + Q_DIM(cfg);
        if (cfg->arch != ENC_BERT) {
            for (int h = 0; h < cfg->n_heads; h++) rmsnorm(q + h * hd, L->q_norm, hd, cfg->norm_eps, q + h * hd);
            for (int h = 0; h < cfg->n_kv_heads; h++) rmsnorm(k + h * hd, L->k_norm, hd, cfg->norm_eps, k + h * hd);
        }
        int pos = (int)t - s->b->seq_start[s->seq_of[t]];
        const float *cs = (L->sliding ? m->rope_local : m->rope_global) + (size_t)pos * hd;
        rope_apply(q, cfg->n_heads, hd, cs, 1);
        rope_apply(k, cfg->n_kv_heads, hd, cs, 1);
    }
}

/* one item = (sequence, query head); the head's output is quantized for Wo right here (blocks of 32 never
 * straddle heads: head_dim % 32 == 0) */
static void attention_fn(void *arg, int64_t begin, int64_t end, int thread) {
    estage_t *s = arg;
    encoder_ctx_t *c = s->c;
    const encoder_config_t *cfg = &c->model->cfg;
    const enc_layer_t *L = &c->model->layers[s->layer];
    int hd = cfg->head_dim, qd = Q_DIM(cfg), stride = QKV_DIM(cfg), group = cfg->n_heads / cfg->n_kv_heads;
    int window = L->sliding ? cfg->sliding_window : 0;
    float *scores = c->scores + (size_t)thread * ENC_ATTN_QBLOCK * ENC_PAD(c->max_tokens);
    float *kt = c->kt + (size_t)thread * hd * ENC_PAD(c->max_tokens);
    for (int64_t item = begin; item < end; item++) {
        int seq = (int)(item / cfg->n_heads), h = (int)(item % cfg->n_heads);
        int t0 = s->b->seq_start[seq], n = s->b->seq_start[seq + 1] - t0;
        const float *q = c->qkv + (size_t)t0 * stride + (size_t)h * hd;
        const float *k = c->qkv + (size_t)t0 * stride + qd + (size_t)(h / group) * hd, *v = k + KV_DIM(cfg);
        float *out = c->attn + (size_t)t0 * qd + (size_t)h * hd;
        attention_bidir(q, k, v, stride, stride, n, hd, cfg->attn_scale, window, out, qd, scores, kt);
        if (is_quant(&L->wo))
            for (int i = 0; i < n; i++)
                quantize_act(out + (size_t)i * qd, hd, c->xq + (size_t)(t0 + i) * (qd / QK) + h * hd / QK);
    }
}

/* after Wo (second = 0) or the down projection (second = 1), per token:
 *   BERT:  x = LN(x) (the matmul added its output and bias into x), quantized for the next matmul
 *   Gemma: x += rms(out); xn = rms(x) with the next norm (the FFN's, the next layer's or the final one) */
static void residual_norm_fn(void *arg, int64_t begin, int64_t end, int thread) {
    estage_t *s = arg;
    encoder_ctx_t *c = s->c;
    const encoder_t *m = c->model;
    const encoder_config_t *cfg = &m->cfg;
    const enc_layer_t *L = &m->layers[s->layer];
    int dim = cfg->dim, second = s->second;
    const enc_layer_t *next = s->layer + 1 < cfg->n_layers ? &m->layers[s->layer + 1] : NULL;
    const weight_t *reader = second ? (next ? &next->wqkv : NULL) : &L->wup;
    (void)thread;
    for (int64_t t = begin; t < end; t++) {
        float *x = c->x + t * dim, *xn = c->xn + t * dim;
        block_q8x *xq = c->xq + t * (dim / QK);
        if (cfg->arch == ENC_BERT) {
            layernorm(x, second ? L->norm2_w : L->norm1_w, second ? L->norm2_b : L->norm1_b, dim, cfg->norm_eps, x);
            quantize_for(reader, x, dim, xq);
        } else {
            rmsnorm(xn, second ? L->post_ffn_norm : L->post_attn_norm, dim, cfg->norm_eps, xn);
            for (int i = 0; i < dim; i++) x[i] += xn[i];
            const float *gamma = !second ? L->ffn_norm : next ? next->attn_norm : m->final_norm;
            rmsnorm(x, gamma, dim, cfg->norm_eps, xn);
            quantize_for(reader, xn, dim, xq);
        }
    }
}

/* rows [32 j, 32 j + 32) of the FFN's up matrix for nt tokens into y (nt, 32) */
static void up_rows(const encoder_ctx_t *c, const enc_layer_t *L, int j, int nt, const float *in,
                    const block_q8x *xq, float *y) {
    if (L->wup_p) gemm_panels(L->wup_p, L->wup.type, L->wup.rows, L->wup.cols, 2 * j, 2 * j + 2, nt, in, y, QK, 0);
    else matmul_tiles(&c->kernels, &L->wup, j * (QK / TILE_ROWS), (j + 1) * (QK / TILE_ROWS), nt, in, xq, y, QK,
                      0);
}

/* One item = (token chunk, 32 hidden units j): their up rows (BERT: + bias, GELU) or gate and up rows (Gemma:
 * gelu_tanh(gate) * up), quantized at once as block j of the down projection's input while in cache; copied out
 * in floats only for a float down projection. */
static void ffn_up_fn(void *arg, int64_t begin, int64_t end, int thread) {
    estage_t *s = arg;
    encoder_ctx_t *c = s->c;
    const encoder_config_t *cfg = &c->model->cfg;
    const enc_layer_t *L = &c->model->layers[s->layer];
    int hidden = cfg->hidden, nbh = hidden / QK, nb = cfg->dim / QK;
    float *g = c->gu + (size_t)thread * ENC_CHUNK * 2 * QK, *u = g + ENC_CHUNK * QK;   /* (chunk, 32) each */
    for (int64_t item = begin; item < end; item++) {
        int t0 = (int)(item / s->n_groups) * ENC_CHUNK, j = (int)(item % s->n_groups);
        int nt = s->ntok - t0 < ENC_CHUNK ? s->ntok - t0 : ENC_CHUNK;
        const float *in = s->in + (size_t)t0 * cfg->dim;
        const block_q8x *xq = c->xq + (size_t)t0 * nb;
        if (cfg->arch == ENC_BERT && !cfg->gated_ffn) {
            up_rows(c, L, j, nt, in, xq, g);
            bias_gelu_erf(g, L->bup + j * QK, QK, nt * QK);
        } else {
            up_rows(c, L, 2 * j, nt, in, xq, g);          /* gate and up rows alternate in blocks of 32 */
            up_rows(c, L, 2 * j + 1, nt, in, xq, u);
            if (cfg->arch == ENC_BERT) swiglu(g, u, g, nt * QK);   /* the decoder's SwiGLU and GeGLU (norm.c) */
            else geglu(g, u, g, nt * QK);
        }
        if (is_quant(&L->wdown))
            quantize_act_strided(g, nt * QK, c->xq_h + (size_t)t0 * nbh + j, nbh);
        else
            for (int t = 0; t < nt; t++)
                memcpy(c->h + (size_t)(t0 + t) * hidden + j * QK, g + t * QK, QK * sizeof(float));
    }
}

static void pooling_fn(void *arg, int64_t begin, int64_t end, int thread) {
    estage_t *s = arg;
    const encoder_config_t *cfg = &s->c->model->cfg;
    int dim = cfg->dim;
    (void)thread;
    for (int64_t seq = begin; seq < end; seq++) {
        int t0 = s->b->seq_start[seq], t1 = s->b->seq_start[seq + 1];
        float *out = s->c->pooled + seq * dim;
        if (cfg->pooling == POOL_CLS || cfg->pooling == POOL_LAST) {
            memcpy(out, s->pool_in + (size_t)(cfg->pooling == POOL_CLS ? t0 : t1 - 1) * dim, dim * sizeof(float));
            continue;
        }
        memset(out, 0, dim * sizeof(float));
        for (int t = t0; t < t1; t++)
            for (int i = 0; i < dim; i++) out[i] += s->pool_in[(size_t)t * dim + i];
        float inv = 1.0f / (float)(t1 - t0);
        for (int i = 0; i < dim; i++) out[i] *= inv;
    }
}

/* the vector to the caller, L2-normalized when configured (as torch's F.normalize: divided by max(norm, 1e-12)) */
static void finish_fn(void *arg, int64_t begin, int64_t end, int thread) {
    estage_t *s = arg;
    int n = s->c->model->out_dim;
    (void)thread;
    for (int64_t seq = begin; seq < end; seq++) {
        const float *v = s->pool_in + seq * n;
        float *out = s->b->out + seq * n;
        float scale = 1.0f;
        if (s->c->model->cfg.normalize) {
            double ss = 0.0;
            for (int i = 0; i < n; i++) ss += (double)v[i] * v[i];
            float norm = (float)sqrt(ss);
            scale = 1.0f / (norm > 1e-12f ? norm : 1e-12f);
        }
        for (int i = 0; i < n; i++) out[i] = v[i] * scale;
    }
}

/* ---- the pass ---- */

/* Every stage goes through the pool, even for one short query: on a quiet machine the threads halve its time
 * (MiniLM q8_0 2.5 -> 1.6 ms, EmbeddingGemma F32 55 -> 28 ms), and beside a busy neighbour the pool's gate lets a
 * descheduled worker miss a region instead of holding it up (the same time as the calling thread alone). */
static void run(encoder_ctx_t *c, int stage, int64_t n, int64_t chunk, pool_fn fn, estage_t *s) {
    if (!c->profile_on) { pool_run(c->pool, n, chunk, fn, s); return; }
    double t0 = now_seconds();
    pool_run(c->pool, n, chunk, fn, s);
    c->profile[stage] += now_seconds() - t0;
}

/* y (ntok, ldy) (+)= w in + bias; w in float panels, bf16 panels (in is then rounded to bf16 first) or quantized */
static void matmul_any(encoder_ctx_t *c, int stage, estage_t *s, const weight_t *w, const void *panels,
                       const uint16_t *panels_bf, const float *in, const block_q8x *xq, float *y, int ldy,
                       int accumulate, const float *bias) {
    s->w = w; s->panels = panels; s->panels_bf = panels_bf; s->in = in; s->xq = xq; s->y = y; s->ldy = ldy;
    s->accumulate = accumulate; s->bias = bias;
    if (panels_bf) run(c, stage, s->ntok, 8, to_bf16_fn, s);
    s->n_groups = (matmul_num_tiles(w) + TILES_PER_ITEM - 1) / TILES_PER_ITEM;
    int64_t chunks = (s->ntok + ENC_CHUNK - 1) / ENC_CHUNK;
    run(c, stage, chunks * s->n_groups, 1, matmul_chunk_fn, s);
}

static void matmul(encoder_ctx_t *c, int stage, estage_t *s, const weight_t *w, const void *panels,
                   const float *in, const block_q8x *xq, float *y, int ldy, int accumulate, const float *bias) {
    matmul_any(c, stage, s, w, panels, NULL, in, xq, y, ldy, accumulate, bias);
}

static int check_batch(const encoder_ctx_t *c, const enc_batch_t *b) {
    const encoder_config_t *cfg = &c->model->cfg;
    if (b->num_tokens < 1 || b->num_tokens > c->max_tokens || b->num_seqs < 1 || b->num_seqs > c->max_seqs)
        return -1;
    if (b->seq_start[0] != 0 || b->seq_start[b->num_seqs] != b->num_tokens) return -2;
    for (int i = 0; i < b->num_seqs; i++) {
        int n = b->seq_start[i + 1] - b->seq_start[i];
        if (n < 1 || n > cfg->max_positions) return -3;
    }
    for (int t = 0; t < b->num_tokens; t++)
        if (b->token_ids[t] < 0 || b->token_ids[t] >= cfg->vocab) return -4;
    if (b->type_ids) {
        if (cfg->arch != ENC_BERT) return -5;
        for (int t = 0; t < b->num_tokens; t++)
            if (b->type_ids[t] < 0 || b->type_ids[t] >= cfg->n_types) return -5;
    }
    return 0;
}

int encoder_forward(encoder_ctx_t *c, const enc_batch_t *b) {
    int rc = check_batch(c, b);
    if (rc) return rc;
    const encoder_t *m = c->model;
    const encoder_config_t *cfg = &m->cfg;
    int T = b->num_tokens, dim = cfg->dim, bert = cfg->arch == ENC_BERT;
    int32_t *seq_of = c->seq_of;
    for (int seq = 0; seq < b->num_seqs; seq++)
        for (int t = b->seq_start[seq]; t < b->seq_start[seq + 1]; t++) seq_of[t] = seq;
    estage_t s = {.c = c, .b = b, .ntok = T, .seq_of = seq_of};

    run(c, ESTAGE_EMBED, T, 8, embed_fn, &s);          /* x = embed; xq = quantize(x or rms(x)) */
    const float *in = bert ? c->x : c->xn;             /* a float weight's input: the normed stream */
    for (int l = 0; l < cfg->n_layers; l++) {
        const enc_layer_t *L = &m->layers[l];
        s.layer = l;
        int qkv_dim = QKV_DIM(cfg), r0 = L->wqkv.rows;                    /* qkv = Wqkv xn + b, in one or two parts */
        matmul(c, ESTAGE_QKV, &s, &L->wqkv, L->wqkv_p, in, c->xq, c->qkv, qkv_dim, 0, L->bqkv);
        if (L->wqkv_f_p || L->wqkv_f_bf)
            matmul_any(c, ESTAGE_QKV, &s, &L->wqkv_f, L->wqkv_f_p, L->wqkv_f_bf, in, c->xq, c->qkv + r0, qkv_dim, 0,
                       L->bqkv ? L->bqkv + r0 : NULL);
        if (!bert || cfg->rotary) run(c, ESTAGE_ATTENTION, T, 4, qk_prep_fn, &s);  /* qk norm, rope */
        run(c, ESTAGE_ATTENTION, (int64_t)b->num_seqs * cfg->n_heads, 1, attention_fn, &s);
        /* BERT: x += Wo attn + b; Gemma: xn = Wo attn */
        matmul(c, ESTAGE_WO, &s, &L->wo, L->wo_p, c->attn, c->xq, bert ? c->x : c->xn, dim, bert, L->bo);
        s.second = 0;
        run(c, ESTAGE_NORM, T, 4, residual_norm_fn, &s);
        s.in = in;
        s.n_groups = cfg->hidden / QK;
        run(c, ESTAGE_UP, (int64_t)((T + ENC_CHUNK - 1) / ENC_CHUNK) * s.n_groups, 1, ffn_up_fn, &s);
        matmul(c, ESTAGE_DOWN, &s, &L->wdown, L->wdown_p, c->h, c->xq_h, bert ? c->x : c->xn, dim, bert, L->bdown);
        s.second = 1;
        run(c, ESTAGE_NORM, T, 4, residual_norm_fn, &s);
    }
    if (b->hidden_out) memcpy(b->hidden_out, in, (size_t)T * dim * sizeof(float));

    s.pool_in = in;
    run(c, ESTAGE_POOL, b->num_seqs, 4, pooling_fn, &s);
    float *cur = c->pooled, *other = c->pooled2;
    s.ntok = b->num_seqs;
    for (int i = 0; i < m->n_dense; i++) {                 /* the Dense chain, float weights */
        matmul(c, ESTAGE_POOL, &s, &m->dense[i], m->dense_p[i], cur, c->xq, other, m->dense[i].rows, 0, m->dense_bias[i]);
        if (m->dense_act[i] == ENC_ACT_TANH)              /* a few hundred values per sequence: no region */
            for (size_t k = 0; k < (size_t)b->num_seqs * m->dense[i].rows; k++) other[k] = tanhf(other[k]);
        float *tmp = cur; cur = other; other = tmp;
    }
    s.pool_in = cur;
    run(c, ESTAGE_POOL, b->num_seqs, 4, finish_fn, &s);
    return 0;
}

/* ---- context ---- */

static void *zalloc(size_t n) {
    void *p = NULL;
    if (posix_memalign(&p, 64, n ? n : 64)) return NULL;
    memset(p, 0, n ? n : 64);
    return p;
}

encoder_ctx_t *encoder_ctx_create(const encoder_t *m, int max_tokens, int max_seqs, int threads) {
    const encoder_config_t *cfg = &m->cfg;
    if (max_tokens < 1 || max_seqs < 1 || threads < 1 || cfg->dim % QK || cfg->hidden % QK ||
        cfg->head_dim % QK || cfg->n_heads % cfg->n_kv_heads || m->n_dense > ENC_MAX_DENSE)
        return NULL;
    encoder_ctx_t *c = calloc(1, sizeof(*c));
    if (!c) return NULL;
    c->model = m;
    kernel_config_default(&c->kernels);
    c->max_tokens = max_tokens;
    c->max_seqs = max_seqs;
    c->pool = pool_create(threads);
    size_t T = (size_t)max_tokens, qd = Q_DIM(cfg), wide = qd > (size_t)cfg->dim ? qd : (size_t)cfg->dim;
    size_t pooled = (size_t)cfg->dim;
    for (int i = 0; i < m->n_dense; i++) {
        if ((size_t)m->dense[i].rows > pooled) pooled = m->dense[i].rows;
        if ((size_t)m->dense[i].cols > pooled) pooled = m->dense[i].cols;
    }
    size_t gu = (size_t)threads * ENC_CHUNK * 2 * QK;
    c->x = zalloc(T * cfg->dim * sizeof(float));
    c->xn = zalloc(T * cfg->dim * sizeof(float));
    c->qkv = zalloc(T * QKV_DIM(cfg) * sizeof(float));
    c->attn = zalloc(T * qd * sizeof(float));
    c->h = zalloc(T * cfg->hidden * sizeof(float));
    c->xq = zalloc(T * (wide / QK) * sizeof(block_q8x));
    c->xq_h = zalloc(T * (cfg->hidden / QK) * sizeof(block_q8x));
    c->gu = zalloc(gu * sizeof(float));
    c->seq_of = zalloc(T * sizeof(int32_t));
    c->scores = zalloc((size_t)threads * ENC_ATTN_QBLOCK * ENC_PAD(T) * sizeof(float));
    c->kt = zalloc((size_t)threads * cfg->head_dim * ENC_PAD(T) * sizeof(float));
    c->pooled = zalloc((size_t)max_seqs * pooled * sizeof(float));
    c->pooled2 = zalloc((size_t)max_seqs * pooled * sizeof(float));
    int bf16 = 0;
    for (int l = 0; l < cfg->n_layers; l++) bf16 |= m->layers[l].wqkv_f_bf != NULL;
    c->xbf = bf16 ? zalloc(T * cfg->dim * sizeof(uint16_t)) : NULL;
    if ((bf16 && !c->xbf) || !c->pool || !c->x || !c->xn || !c->qkv || !c->attn || !c->h || !c->xq || !c->xq_h || !c->gu || !c->seq_of || !c->scores || !c->kt ||
        !c->pooled || !c->pooled2) {
        encoder_ctx_free(c);
        return NULL;
    }
    return c;
}

void encoder_ctx_free(encoder_ctx_t *c) {
    if (!c) return;
    if (c->pool) pool_destroy(c->pool);
    free(c->x); free(c->xn); free(c->qkv); free(c->attn); free(c->h); free(c->xq); free(c->xq_h); free(c->gu); free(c->seq_of);
    free(c->scores); free(c->kt); free(c->pooled); free(c->pooled2); free(c->xbf);
    free(c);
}
