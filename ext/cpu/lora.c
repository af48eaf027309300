/* LoRA adapters in the forward pass: after a matmul y = W x, each token whose sequence has an adapter gets
 * scale * B (A x) added to its row of y, A and B the adapter's f32 matrices for that layer and weight. The base
 * weights stay as they are (quantized, shared by every sequence); a token without an adapter is untouched.
 *
 * Two stages per adapted matmul: A x (rank values per token and target, into c->lora_ax) by items of (4 tokens,
 * target), then the rows of B (A x) added to y by items of (target, 32 output rows). The gated FFN adds its gate and up rows inside its own
 * gate|up stage (block_ffn.c), before the activation, from the A x of this file's first stage.
 *
 * Determinism: a token's sums read only its own input and its sequence's adapter, each in a fixed order, so its
 * output does not depend on the batch; the code is plain C, the same for every kernel path. A x: each value is eight
 * partial sums along the input (i % 8), added in lane order, then the tail; tokens of one adapter go four at a time
 * (A's row read once for them), each with exactly the arithmetic it has alone. B (A x): B is held transposed,
 * (rank, out), and each output is summed over r = 0..rank-1 in order, 32 outputs side by side (a loop the compiler
 * vectorizes without reordering a sum). */
#include <stdlib.h>
#include "forward_stage.h"

#define LORA_ROWS 32   /* output rows per item of the B stage */

/* the sum of a[i] * x[i] in a fixed order: eight running sums by i % 8, added in lane order, then the tail */
static inline float lora_sum8(const float *acc, const float *a, const float *x, int i, int n) {
    float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    for (; i < n; i++) s += a[i] * x[i];
    return s;
}

static float lora_dot(const float *a, const float *x, int n) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) acc[j] += a[i + j] * x[i + j];
    return lora_sum8(acc, a, x, i, n);
}

/* out[k] = lora_dot(a, x[k], n) for k < nx (1 to 4); four at once read a once, each with the bits it has alone */
static void lora_dots(const float *a, const float *const *x, int nx, int n, float *out) {
    if (nx != 4) {
        for (int k = 0; k < nx; k++) out[k] = lora_dot(a, x[k], n);
        return;
    }
    float acc[4][8] = {{0}};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 4; k++)
            for (int j = 0; j < 8; j++) acc[k][j] += a[i + j] * x[k][i + j];
    for (int k = 0; k < 4; k++) out[k] = lora_sum8(acc[k], a, x[k], i, n);
}

/* token t's adapter matrix for `target` in the stage's layer, with the scale its product takes; NULL when the
 * token's sequence has no adapter or its adapter leaves this weight alone */
static const lora_matrix_t *token_lora(const stage_t *s, int64_t t, int target, float *scale) {
    const batch_t *b = s->b;
    int seq = b->seq_of_token[t], i = b->lora_of_seq[seq];
    if (i < 0) return NULL;
    const lora_matrix_t *m = &b->loras[i].m[(size_t)s->layer * LORA_TARGETS + target];
    if (!m->a) return NULL;
    *scale = b->lora_scale_of_seq[seq] * m->scale;
    return m;
}

int batch_has_lora(const batch_t *b) {
    if (!b->lora_of_seq) return 0;
    for (int i = 0; i < b->num_seqs; i++)
        if (b->lora_of_seq[i] >= 0) return 1;
    return 0;
}

int lora_check_batch(const context_t *c, const batch_t *b) {
    if (!b->lora_of_seq) return FORWARD_OK;
    for (int i = 0; i < b->num_seqs; i++) {
        int k = b->lora_of_seq[i];
        if (k < -1 || k >= b->num_loras) return FORWARD_BAD_LORA;
        if (k >= 0 && (b->loras[k].n_layers != c->model->cfg.n_layers || b->loras[k].max_rank > c->lora_rank ||
                       !b->lora_scale_of_seq))
            return FORWARD_BAD_LORA;
    }
    return FORWARD_OK;
}

/* items = (group of 4 tokens, target i): lora_ax[t][i] = A_i x_t; the tokens of a group that share an adapter
 * matrix (one sequence's prefill) go together */
static void lora_down_fn(void *arg, int64_t begin, int64_t end, int thread) {
    stage_t *s = arg;
    (void)thread;
    const lora_job_t *job = s->lora_job;
    int R = s->c->lora_rank, in = job->in_dim;
    for (int64_t item = begin; item < end; item++) {
        int i = (int)(item % job->n);
        int64_t t0 = item / job->n * 4, t1 = t0 + 4 < s->ntok ? t0 + 4 : s->ntok;
        const lora_matrix_t *m[4];
        float scale;
        for (int64_t t = t0; t < t1; t++) m[t - t0] = token_lora(s, t, job->target[i], &scale);
        for (int64_t t = t0; t < t1;) {
            const lora_matrix_t *mt = m[t - t0];
            if (!mt) { t++; continue; }
            const float *x[4];
            int nx = 0;
            while (t + nx < t1 && m[t + nx - t0] == mt) { x[nx] = job->x + (t + nx) * in; nx++; }
            float v[4];
            for (int r = 0; r < mt->rank; r++) {
                lora_dots(mt->a + (size_t)r * in, x, nx, in, v);
                for (int k = 0; k < nx; k++) s->c->lora_ax[((size_t)(t + k) * 3 + i) * R + r] = v[k];
            }
            t += nx;
        }
    }
}

void lora_add_rows(const stage_t *s, const lora_job_t *job, int i, int row_begin, int row_end, float *y, int ldy) {
    int R = s->c->lora_rank, n = row_end - row_begin;
    for (int64_t t = 0; t < s->ntok; t++) {
        float scale;
        const lora_matrix_t *m = token_lora(s, t, job->target[i], &scale);
        if (!m) continue;
        const float *ax = s->c->lora_ax + ((size_t)t * 3 + i) * R;
        float acc[LORA_ROWS] = {0};
        for (int r = 0; r < m->rank; r++) {
            const float *bt = m->bt + (size_t)r * m->out + row_begin, v = ax[r];
            for (int j = 0; j < n; j++) acc[j] += bt[j] * v;
        }
        float *yt = y + (size_t)t * ldy;
        for (int j = 0; j < n; j++) yt[j] += scale * acc[j];
    }
}

/* items = (target, LORA_ROWS output rows) */
static void lora_up_fn(void *arg, int64_t begin, int64_t end, int thread) {
    stage_t *s = arg;
    (void)thread;
    const lora_job_t *job = s->lora_job;
    for (int64_t item = begin; item < end; item++) {
        int i = 0, first = (int)item * LORA_ROWS;
        while (first >= job->items_before[i + 1]) i++;
        int r0 = (first - job->items_before[i]), r1 = r0 + LORA_ROWS < job->rows[i] ? r0 + LORA_ROWS : job->rows[i];
        lora_add_rows(s, job, i, r0, r1, job->y + job->row0[i] + r0, job->ldy);
    }
}

void lora_job_init(lora_job_t *job, const float *x, int in_dim, float *y, int ldy) {
    job->n = 0; job->x = x; job->in_dim = in_dim; job->y = y; job->ldy = ldy;
    job->items_before[0] = 0;
}

void lora_job_add(lora_job_t *job, int target, int row0, int rows) {
    int i = job->n++;
    job->target[i] = target; job->row0[i] = row0; job->rows[i] = rows;
    /* in rows rounded up to whole items, so that an item never spans two targets */
    job->items_before[i + 1] = job->items_before[i] + (rows + LORA_ROWS - 1) / LORA_ROWS * LORA_ROWS;
}

void stage_lora_down(context_t *c, stage_t *s, const lora_job_t *job) {
    s->lora_job = job;
    stage_run(c, STAGE_LORA, (int64_t)(s->ntok + 3) / 4 * job->n, 1, lora_down_fn, s);
}

void stage_lora(context_t *c, stage_t *s, const lora_job_t *job) {
    stage_lora_down(c, s, job);
    stage_run(c, STAGE_LORA, job->items_before[job->n] / LORA_ROWS, 1, lora_up_fn, s);
    s->lora_job = NULL;
}

int context_reserve_lora(context_t *c, int max_rank) {
    if (max_rank <= c->lora_rank) return 0;
    float *ax = malloc((size_t)c->max_tokens * 3 * max_rank * sizeof(float));
    if (!ax) return -1;
    free(c->lora_ax);
    c->lora_ax = ax;
    c->lora_rank = max_rank;
    return 0;
}
