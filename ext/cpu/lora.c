/* LoRA adapters in the forward pass: after a matmul y = W x, each token whose sequence has an adapter gets
 * scale * B (A x) added to its row of y, A and B the adapter's f32 matrices for that layer and weight. The base
 * weights stay as they are (quantized, shared by every sequence); a token without an adapter is untouched.
 *
 * Two stages per adapted matmul: A x per token (rank values per target, into c->lora_ax), then the rows of
 * B (A x) added to y by items of (target, 32 output rows). The gated FFN adds its gate and up rows inside its own
 * gate|up stage (block_ffn.c), before the activation, from the A x of this file's first stage.
 *
 * Determinism: a token's sums read only its own input and its sequence's adapter, each in a fixed order (eight
 * partial sums, then their sum in lane order), so its output does not depend on the batch; the code is plain C,
 * the same for every kernel path. */
#include <stdlib.h>
#include "forward_stage.h"

#define LORA_ROWS 32   /* output rows per item of the B stage */

/* sum of a[i] * b[i] in a fixed order: eight running sums by i % 8, added in lane order, then the tail */
static float lora_dot(const float *a, const float *b, int n) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) acc[j] += a[i + j] * b[i + j];
    float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    for (; i < n; i++) s += a[i] * b[i];
    return s;
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

/* items = tokens: lora_ax[t][i] = A_i x_t for each of the job's targets */
static void lora_down_fn(void *arg, int64_t begin, int64_t end, int thread) {
    stage_t *s = arg;
    (void)thread;
    const lora_job_t *job = s->lora_job;
    int R = s->c->lora_rank;
    for (int64_t t = begin; t < end; t++) {
        const float *x = job->x + t * job->in_dim;
        for (int i = 0; i < job->n; i++) {
            float scale;
            const lora_matrix_t *m = token_lora(s, t, job->target[i], &scale);
            if (!m) continue;
            float *ax = s->c->lora_ax + ((size_t)t * 3 + i) * R;
            for (int r = 0; r < m->rank; r++) ax[r] = lora_dot(m->a + (size_t)r * job->in_dim, x, job->in_dim);
        }
    }
}

void lora_add_rows(const stage_t *s, const lora_job_t *job, int i, int row_begin, int row_end, float *y, int ldy) {
    int R = s->c->lora_rank;
    for (int64_t t = 0; t < s->ntok; t++) {
        float scale;
        const lora_matrix_t *m = token_lora(s, t, job->target[i], &scale);
        if (!m) continue;
        const float *ax = s->c->lora_ax + ((size_t)t * 3 + i) * R;
        float *yt = y + (size_t)t * ldy - row_begin;
        for (int row = row_begin; row < row_end; row++)
            yt[row] += scale * lora_dot(m->b + (size_t)row * m->rank, ax, m->rank);
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
    stage_run(c, STAGE_LORA, s->ntok, 1, lora_down_fn, s);
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
