/* The mixture-of-experts FFN block: x += post_norm(sum over the token's chosen experts, by rank, of
 * weight * Wdown_e act(Wgate_e xn) * (Wup_e xn)  [+ sigmoid(g . xn) * the shared expert's FFN of xn]), xn = rmsnorm(x);
 * gpt-oss adds biases to the router's logits and to each expert's gate, up and down rows.
 *
 * A step runs it in six stages, each one parallel region (or a short serial pass):
 *   1. xn = rmsnorm(x), kept in floats (the router and the shared gate read them) and quantized;
 *   2. router logits = Wrouter xn, (tokens, n_experts);
 *   3. per token: softmax, the n_used highest (ties to the lower expert index), their weights (renormalized where the
 *      architecture says), the shared expert's gate; then, serially, a counting sort of the (token, rank) pairs by
 *      expert: expert e's rows are the tokens routed to it in token order, one block of rows per expert;
 *   4. each row's quantized (and, for float experts, float) input gathered next to its expert's other rows;
 *   5. gate|up of every (expert, 32 hidden units) over that expert's rows, the activation and the down projection's
 *      input quantization in one item (as the dense FFN does), the shared expert's units over all tokens beside them;
 *   6. the down projection of every (expert, group of output tiles) over its rows; then per token the weighted sum.
 * An expert's weights are read once per step for all the tokens routed to it: a decode step of 8 sequences streams
 * each chosen expert once, with the batched decode kernels over its 1-8 rows.
 *
 * Determinism: a token's routing reads only its own logits; every matmul kernel gives a row the same bits whatever
 * the other rows of its call (matmul.c); and a token's output adds its experts' rows in its own rank order (highest
 * weight first, as llama.cpp's graph adds them), never in the order the batch happened to group them. So a token's
 * output does not depend on the batch it is in, and the scalar and SIMD paths agree as their kernels do. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "forward_stage.h"

/* a step's routing and the experts' rows; sized for the model's largest MoE block and the context's max_tokens */
struct moe_scratch {
    float *logits;                 /* (max_tokens, n_experts) router logits, then probabilities */
    int32_t *chosen;               /* (max_tokens, n_used) each token's experts by rank */
    float *weight;                 /* (max_tokens, n_used) their weights */
    int32_t *slot;                 /* (max_tokens, n_used) the row of each (token, rank) among the experts' rows */
    float *shared_weight;          /* (max_tokens) sigmoid of the shared expert's gate */
    int32_t *row_token;            /* (max_rows) the token of each row */
    int32_t *first_row;            /* (n_experts + 1) expert e's rows are [first_row[e], first_row[e + 1]) */
    int32_t *active;               /* (n_experts) the experts with rows, ascending */
    block_q8x *xq;                 /* (max_rows, dim / 32) each row's quantized input */
    float *xn;                     /* (max_rows, dim) each row's input in floats, for float experts (else NULL) */
    block_q8x *xq_h;               /* routed rows (max_rows, hidden / 32), then shared ones (max_tokens, shared / 32) */
    float *h;                      /* the same in floats, for float down projections (else NULL) */
    float *y;                      /* routed rows (max_rows, dim), then shared ones (max_tokens, dim) */
    int n_active;
    int down_tiles;                /* output tiles per item of the down projection (down_tiles_per_item) */
    size_t shared_h_off, shared_y_off;   /* where the shared expert's rows begin in xq_h (blocks), h, y (floats) */
};

/* ---- the context's buffers ---- */

static int any_float(const weight_t *w, int n) {
    for (int i = 0; i < n; i++)
        if (w[i].rows && !weight_is_quantized(w[i].type)) return 1;
    return 0;
}

int moe_scratch_create(context_t *c) {
    const model_t *m = c->model;
    int n_experts = 0, n_used = 0, hidden = 0, shared = 0, floats = 0, T = c->max_tokens, dim = m->cfg.dim;
    for (int l = 0; l < m->cfg.n_layers; l++)
        for (int i = 0; i < m->layers[l].n_blocks; i++) {
            const block_t *B = &m->layers[l].blocks[i];
            if (B->kind != BLOCK_FFN_MOE) continue;
            const ffn_moe_block_t *M = &B->moe;
            n_experts = M->n_experts > n_experts ? M->n_experts : n_experts;
            n_used = M->n_used > n_used ? M->n_used : n_used;
            hidden = M->hidden > hidden ? M->hidden : hidden;
            shared = M->shared_hidden > shared ? M->shared_hidden : shared;
            floats |= any_float(M->wgu, M->n_experts) || any_float(M->wdown, M->n_experts) ||
                      any_float(&M->shared_gu, 1) || any_float(&M->shared_down, 1);
        }
    if (n_experts == 0) return 0;
    struct moe_scratch *s = calloc(1, sizeof *s);
    if (!s) return -1;
    c->moe = s;
    size_t rows = (size_t)T * n_used, pairs = rows;
    s->shared_h_off = rows * (hidden / QK);
    s->shared_y_off = rows * dim;
    size_t h_blocks = s->shared_h_off + (size_t)T * (shared / QK);
    s->logits = malloc((size_t)T * n_experts * sizeof(float));
    s->chosen = malloc(pairs * sizeof(int32_t));
    s->weight = malloc(pairs * sizeof(float));
    s->slot = malloc(pairs * sizeof(int32_t));
    s->shared_weight = malloc((size_t)T * sizeof(float));
    s->row_token = malloc(rows * sizeof(int32_t));
    s->first_row = malloc((size_t)(n_experts + 1) * sizeof(int32_t));
    s->active = malloc((size_t)n_experts * sizeof(int32_t));
    s->xq = malloc(rows * (dim / QK) * sizeof(block_q8x));
    s->xq_h = malloc(h_blocks * sizeof(block_q8x));
    s->y = malloc((s->shared_y_off + (shared ? (size_t)T * dim : 0)) * sizeof(float));
    if (floats) {
        s->xn = malloc(rows * dim * sizeof(float));
        s->h = malloc(h_blocks * QK * sizeof(float));
    }
    if (!s->logits || !s->chosen || !s->weight || !s->slot || !s->shared_weight || !s->row_token || !s->first_row ||
        !s->active || !s->xq || !s->xq_h || !s->y || (floats && (!s->xn || !s->h)))
        return -1;
    return 0;
}

void moe_scratch_free(context_t *c) {
    struct moe_scratch *s = c->moe;
    if (!s) return;
    free(s->logits); free(s->chosen); free(s->weight); free(s->slot); free(s->shared_weight); free(s->row_token);
    free(s->first_row); free(s->active); free(s->xq); free(s->xn); free(s->xq_h); free(s->h); free(s->y);
    free(s);
    c->moe = NULL;
}

/* ---- routing ---- */

/* the n_used largest of p[0..n) by rank into chosen (a strict > keeps the lower index on a tie) */
static void top_k(const float *p, int n, int k, int32_t *chosen) {
    unsigned char taken[MOE_MAX_EXPERTS] = {0};
    for (int r = 0; r < k; r++) {
        int best = -1;
        for (int e = 0; e < n; e++)
            if (!taken[e] && (best < 0 || p[e] > p[best])) best = e;
        taken[best] = 1;
        chosen[r] = best;
    }
}

/* token t's experts and weights from its logits (plus the router's bias): softmax (the sum in double, scaled by its
 * reciprocal), the n_used largest probabilities, renormalized by their sum (held off zero as llama.cpp does) where
 * the architecture says; or (MOE_GATING_TOPK_SOFTMAX) the n_used largest logits and the softmax over those alone;
 * times the file's scale; and the shared expert's sigmoid gate */
static void route_fn(void *arg, int64_t begin, int64_t end, int thread) {
    stage_t *s = arg;
    (void)thread;
    context_t *c = s->c;
    struct moe_scratch *S = c->moe;
    const ffn_moe_block_t *M = &s->block->moe;
    int n = M->n_experts, k = M->n_used, dim = c->model->cfg.dim;
    for (int64_t t = begin; t < end; t++) {
        float *p = S->logits + t * n;
        int32_t *chosen = S->chosen + t * k;
        float *w = S->weight + t * k, wsum = 0.0f;
        if (M->router_bias)
            for (int e = 0; e < n; e++) p[e] += M->router_bias[e];
        if (M->gating == MOE_GATING_TOPK_SOFTMAX) {
            top_k(p, n, k, chosen);
            double sum = 0.0;
            for (int r = 0; r < k; r++) { w[r] = expf(p[chosen[r]] - p[chosen[0]]); sum += w[r]; }
            float inv = (float)(1.0 / sum);
            for (int r = 0; r < k; r++) w[r] *= inv;
        } else {
            float mx = p[0];
            for (int e = 1; e < n; e++) mx = p[e] > mx ? p[e] : mx;
            double sum = 0.0;
            for (int e = 0; e < n; e++) { p[e] = expf(p[e] - mx); sum += p[e]; }
            float inv = (float)(1.0 / sum);
            for (int e = 0; e < n; e++) p[e] *= inv;
            top_k(p, n, k, chosen);
            for (int r = 0; r < k; r++) { w[r] = p[chosen[r]]; wsum += w[r]; }
        }
        if (M->norm_topk) {
            wsum = wsum < 6.103515625e-5f ? 6.103515625e-5f : wsum;
            for (int r = 0; r < k; r++) w[r] /= wsum;
        }
        if (M->weights_scale > 0 && M->weights_scale != 1.0f)
            for (int r = 0; r < k; r++) w[r] *= M->weights_scale;
        if (M->shared_gate) {
            const float *xn = c->xn + t * dim;
            float dot = 0.0f;
            for (int i = 0; i < dim; i++) dot += xn[i] * M->shared_gate[i];
            S->shared_weight[t] = 1.0f / (1.0f + expf(-dot));
        }
    }
}

/* the (token, rank) pairs sorted by expert, tokens ascending within an expert: a counting sort */
static void group_rows(struct moe_scratch *S, const ffn_moe_block_t *M, int T) {
    int n = M->n_experts, k = M->n_used;
    memset(S->first_row, 0, (size_t)(n + 1) * sizeof(int32_t));
    for (int i = 0; i < T * k; i++) S->first_row[S->chosen[i] + 1]++;
    S->n_active = 0;
    for (int e = 0; e < n; e++) {
        if (S->first_row[e + 1]) S->active[S->n_active++] = e;
        S->first_row[e + 1] += S->first_row[e];
    }
    int32_t cursor[MOE_MAX_EXPERTS];
    memcpy(cursor, S->first_row, (size_t)n * sizeof(int32_t));
    for (int t = 0; t < T; t++)
        for (int r = 0; r < k; r++) {
            int row = cursor[S->chosen[t * k + r]]++;
            S->row_token[row] = t;
            S->slot[t * k + r] = row;
        }
}

static void gather_fn(void *arg, int64_t begin, int64_t end, int thread) {
    stage_t *s = arg;
    (void)thread;
    context_t *c = s->c;
    struct moe_scratch *S = c->moe;
    int dim = c->model->cfg.dim, nb = dim / QK;
    for (int64_t row = begin; row < end; row++) {
        int t = S->row_token[row];
        memcpy(S->xq + row * nb, c->xq + (size_t)t * nb, nb * sizeof(block_q8x));
        if (S->xn) memcpy(S->xn + row * dim, c->xn + (size_t)t * dim, dim * sizeof(float));
    }
}

/* ---- the experts ---- */

/* what one expert (or the shared one) computes over in a stage: its weights, rows and their buffers */
typedef struct {
    const weight_t *gu, *down;
    const float *gate_b, *up_b, *down_b;   /* its biases (hidden, hidden, dim), or NULL */
    int rows, hidden;
    const float *x;              /* (rows, dim) float input, for float weights */
    const block_q8x *xq;         /* (rows, dim / 32) */
    block_q8x *xq_h;             /* (rows, hidden / 32) */
    float *h;                    /* (rows, hidden) or NULL */
    float *y;                    /* (rows, dim) */
} expert_rows_t;

/* item j of a stage with `per_expert` items per routed expert, the shared expert's after all the routed ones' */
static expert_rows_t expert_of_item(const stage_t *s, int64_t j, int per_expert, int *within) {
    const context_t *c = s->c;
    const struct moe_scratch *S = c->moe;
    const ffn_moe_block_t *M = &s->block->moe;
    int dim = c->model->cfg.dim, routed = S->n_active * per_expert;
    expert_rows_t E;
    if (j < routed) {
        int e = S->active[j / per_expert], row0 = S->first_row[e];
        *within = (int)(j % per_expert);
        E = (expert_rows_t){&M->wgu[e], &M->wdown[e],
                            M->gate_bias ? M->gate_bias + (size_t)e * M->hidden : NULL,
                            M->up_bias ? M->up_bias + (size_t)e * M->hidden : NULL,
                            M->down_bias ? M->down_bias + (size_t)e * dim : NULL,
                            S->first_row[e + 1] - row0, M->hidden,
                            S->xn ? S->xn + (size_t)row0 * dim : NULL, S->xq + (size_t)row0 * (dim / QK),
                            S->xq_h + (size_t)row0 * (M->hidden / QK),
                            S->h ? S->h + (size_t)row0 * M->hidden : NULL, S->y + (size_t)row0 * dim};
    } else {
        *within = (int)(j - routed);
        E = (expert_rows_t){&M->shared_gu, &M->shared_down, NULL, NULL, NULL, s->ntok, M->shared_hidden, c->xn,
                            c->xq, S->xq_h + S->shared_h_off, S->h ? S->h + S->shared_h_off * QK : NULL,
                            S->y + S->shared_y_off};
    }
    return E;
}

/* one item = one expert's 32 hidden units over its rows: gate and up, the activation, and h quantized as the down
 * projection's input (block_ffn.c's gate_up_act_fn, over an expert's rows) */
static void experts_gate_up_fn(void *arg, int64_t begin, int64_t end, int thread) {
    stage_t *s = arg;
    context_t *c = s->c;
    const ffn_moe_block_t *M = &s->block->moe;
    int half = QK / TILE_ROWS, per_expert = M->hidden / QK;
    float *g = c->gu + (size_t)thread * c->max_tokens * 2 * QK, *u = g + (size_t)c->max_tokens * QK;
    for (int64_t j = begin; j < end; j++) {
        int unit;
        expert_rows_t E = expert_of_item(s, j, per_expert, &unit);
        int tile = unit * 2 * half, nbh = E.hidden / QK, n = E.rows;
        matmul_tiles(&c->kernels, E.gu, tile, tile + half, n, E.x, E.xq, g, QK, 0);
        matmul_tiles(&c->kernels, E.gu, tile + half, tile + 2 * half, n, E.x, E.xq, u, QK, 0);
        if (E.gate_b)                                   /* gpt-oss: the expert's biases of these 32 units */
            for (int r = 0; r < n; r++)
                for (int i = 0; i < QK; i++) {
                    g[r * QK + i] += E.gate_b[unit * QK + i];
                    u[r * QK + i] += E.up_b[unit * QK + i];
                }
        if (M->act == ACT_GELU_TANH) geglu(g, u, g, n * QK);
        else if (M->act == ACT_SWIGLU_OAI) swiglu_oai(g, u, g, n * QK);
        else swiglu(g, u, g, n * QK);
        quantize_act_strided(g, n * QK, E.xq_h + unit, nbh);
        if (!weight_is_quantized(E.down->type))
            for (int r = 0; r < n; r++)
                memcpy(E.h + (size_t)r * E.hidden + unit * QK, g + (size_t)r * QK, QK * sizeof(float));
    }
}

/* Output tiles per item of the down projection: a pair while some expert has many rows (a prefill, where a pair is
 * a long kernel call already), eight when every expert has a few (a decode step, where a pair of a 768-wide expert's
 * tiles is a few KB of weights per claimed item, and a decode group streams four tiles at once) */
#define DOWN_FEW_ROWS 8
static int down_tiles_per_item(const struct moe_scratch *S, int shared_rows) {
    int most = shared_rows;
    for (int i = 0; i < S->n_active; i++) {
        int e = S->active[i], rows = S->first_row[e + 1] - S->first_row[e];
        most = rows > most ? rows : most;
    }
    return most <= DOWN_FEW_ROWS ? 8 : 2;
}

/* one item = one expert's down_tiles output tiles (8 of dim's rows each) over its rows */
static void experts_down_fn(void *arg, int64_t begin, int64_t end, int thread) {
    stage_t *s = arg;
    (void)thread;
    context_t *c = s->c;
    const int per = c->moe->down_tiles;
    int dim = c->model->cfg.dim, ntiles = (dim + TILE_ROWS - 1) / TILE_ROWS, items = (ntiles + per - 1) / per;
    for (int64_t j = begin; j < end; j++) {
        int k;
        expert_rows_t E = expert_of_item(s, j, items, &k);
        int t0 = per * k, t1 = t0 + per < ntiles ? t0 + per : ntiles;
        matmul_tiles(&c->kernels, E.down, t0, t1, E.rows, E.h, E.xq_h, E.y + (size_t)t0 * TILE_ROWS, dim, 0);
        if (E.down_b) {                                 /* gpt-oss: the expert's bias of these rows */
            int i0 = t0 * TILE_ROWS, i1 = t1 * TILE_ROWS < dim ? t1 * TILE_ROWS : dim;
            for (int r = 0; r < E.rows; r++)
                for (int i = i0; i < i1; i++) E.y[(size_t)r * dim + i] += E.down_b[i];
        }
    }
}

/* x[t] += post_norm(sum by rank of weight * the expert's row [+ shared gate * the shared row]) */
static void combine_fn(void *arg, int64_t begin, int64_t end, int thread) {
    stage_t *s = arg;
    context_t *c = s->c;
    const struct moe_scratch *S = c->moe;
    const ffn_moe_block_t *M = &s->block->moe;
    int dim = c->model->cfg.dim, k = M->n_used;
    float *out = c->norm_rows + (size_t)thread * dim;
    for (int64_t t = begin; t < end; t++) {
        memset(out, 0, dim * sizeof(float));
        for (int r = 0; r < k; r++) {
            const float *y = S->y + (size_t)S->slot[t * k + r] * dim;
            float w = S->weight[t * k + r];
            for (int i = 0; i < dim; i++) out[i] += w * y[i];
        }
        if (M->shared_gate) {
            const float *y = S->y + S->shared_y_off + t * dim;
            float w = S->shared_weight[t];
            for (int i = 0; i < dim; i++) out[i] += w * y[i];
        }
        if (s->block->post_norm) rmsnorm(out, s->block->post_norm, dim, c->model->cfg.norm_eps, out);
        float *x = c->x + t * dim;
        for (int i = 0; i < dim; i++) x[i] += out[i];
    }
}

void ffn_moe_block(context_t *c, stage_t *s, const block_t *B) {
    const model_config_t *cfg = &c->model->cfg;
    const ffn_moe_block_t *M = &B->moe;
    struct moe_scratch *S = c->moe;
    int T = s->ntok, dim = cfg->dim, ntiles = (dim + TILE_ROWS - 1) / TILE_ROWS;
    s->block = B;
    stage_prepare_input_floats(c, s, c->x, dim, B->norm);                       /* xn = rmsnorm(x), and quantized */
    stage_matmul(c, STAGE_ROUTE, s, &M->router, S->logits, 0);                  /* logits = Wrouter xn */
    stage_run(c, STAGE_ROUTE, T, 4, route_fn, s);                               /* experts, weights by token */
    group_rows(S, M, T);                                                        /* rows grouped by expert */
    stage_run(c, STAGE_ROUTE, (int64_t)T * M->n_used, 16, gather_fn, s);        /* each row's input */
    int shared = M->shared_gate != NULL;
    int64_t gu_items = (int64_t)S->n_active * (M->hidden / QK) + (shared ? M->shared_hidden / QK : 0);
    stage_run(c, STAGE_GATE_UP_SWIGLU, gu_items, 1, experts_gate_up_fn, s);     /* h = act(gate) * up */
    S->down_tiles = down_tiles_per_item(S, shared ? T : 0);
    int64_t down_items = ((int64_t)S->n_active + shared) * ((ntiles + S->down_tiles - 1) / S->down_tiles);
    stage_run(c, STAGE_DOWN, down_items, 1, experts_down_fn, s);                /* y = Wdown h */
    stage_run(c, STAGE_DOWN, T, 4, combine_fn, s);                              /* x += weighted y */
}
