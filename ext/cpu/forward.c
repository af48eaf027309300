/* One step of the model over a flat batch: every token of every sequence in the batch, prefill chunks and
 * decode tokens mixed, through each layer's blocks (the model's table of them: inferd.h's layer_t), then logits
 * for the rows that need them, then sampling. Read it top to bottom in forward(); each stage is one parallel
 * region over the thread pool. The blocks' stages are in block_attention.c, block_ffn.c, block_moe.c and
 * block_gdn.c. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "forward_stage.h"

/* ---- the stages of the step's own: embedding, the norms that feed a matmul, sampling ---- */

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

/* x += rmsnorm(y + bias) for each token: a block's output with its bias (gpt-oss's Wo) and sandwich norm (Gemma),
 * each where the block has it, then the residual add */
static void post_norm_add_fn(void *arg, int64_t begin, int64_t end, int thread) {
    stage_t *s = arg;
    (void)thread;
    int dim = s->c->model->cfg.dim;
    for (int64_t t = begin; t < end; t++) {
        float *y = s->c->y + t * dim, *x = s->c->x + t * dim;
        if (s->bias)
            for (int i = 0; i < dim; i++) y[i] += s->bias[i];
        if (s->post_gamma) rmsnorm(y, s->post_gamma, dim, s->c->model->cfg.norm_eps, y);
        for (int i = 0; i < dim; i++) x[i] += y[i];
    }
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

void stage_run(context_t *c, int stage, int64_t n, int64_t chunk, pool_fn fn, stage_t *s) {
    if (!c->profile_on) { pool_run(c->pool, n, chunk, fn, s); return; }
    double t0 = now_seconds();
    pool_run(c->pool, n, chunk, fn, s);
    c->profile[stage] += now_seconds() - t0;
}

void stage_matmul(context_t *c, int stage, stage_t *s, const weight_t *w, float *y, int accumulate) {
    s->w = w; s->y = y; s->ldy = w->rows; s->accumulate = accumulate;
    stage_run(c, stage, (matmul_num_tiles(w) + 1) / 2, 1, matmul_fn, s);
}

void stage_set_input(stage_t *s, const float *in, int in_dim, const block_q8x *xq) {
    s->in = in; s->in_dim = in_dim; s->gamma = NULL; s->out = NULL; s->xq = xq;
}

void stage_prepare_input(context_t *c, stage_t *s, const float *in, int in_dim, const float *gamma,
                         const weight_t *reader) {
    s->in = in; s->in_dim = in_dim; s->gamma = gamma; s->xq = c->xq;
    s->out = weight_is_quantized(reader->type) && !s->lora ? NULL : c->xn;   /* adapters read the floats */
    stage_run(c, STAGE_NORM_QUANT, s->ntok, 4, norm_quant_fn, s);
}

void stage_prepare_input_floats(context_t *c, stage_t *s, const float *in, int in_dim, const float *gamma) {
    s->in = in; s->in_dim = in_dim; s->gamma = gamma; s->xq = c->xq; s->out = c->xn;
    stage_run(c, STAGE_NORM_QUANT, s->ntok, 4, norm_quant_fn, s);
}

void stage_matmul_residual(context_t *c, int stage, stage_t *s, const weight_t *w, const float *bias,
                           const float *post_norm, int lora_target) {
    float *y = post_norm || bias ? c->y : c->x;
    stage_matmul(c, stage, s, w, y, y == c->x);
    if (s->lora && lora_target >= 0) {                         /* y += scale B (A in) for the adapted tokens */
        lora_job_t job;
        lora_job_init(&job, s->in, s->in_dim, y, w->rows);
        lora_job_add(&job, lora_target, 0, w->rows);
        stage_lora(c, s, &job);
    }
    if (y == c->x) return;
    s->post_gamma = post_norm;
    s->bias = bias;
    stage_run(c, STAGE_NORM_QUANT, s->ntok, 4, post_norm_add_fn, s);
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
    if (c->model->n_recurrent) {                 /* each sequence continues its slot's state, or starts it */
        if (!b->state_slots || b->num_seqs > c->max_tokens) return FORWARD_BAD_STATE;   /* seq_first's size */
        for (int t = 0; t < b->num_tokens; t++) {
            int seq = b->seq_of_token[t], first = t == 0 || seq != b->seq_of_token[t - 1];
            if (first) {
                int slot = b->state_slots[seq];
                if ((t > 0 && seq < b->seq_of_token[t - 1]) || slot < 0 || slot >= c->num_state_slots ||
                    (b->positions[t] != 0 && b->positions[t] != c->state_pos[slot]))
                    return FORWARD_BAD_STATE;
                for (int j = 0; j < seq; j++)            /* two sequences of the step never share a slot */
                    if (b->state_slots[j] == slot) return FORWARD_BAD_STATE;
            } else if (b->positions[t] != b->positions[t - 1] + 1) {
                return FORWARD_BAD_STATE;
            }
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
    return lora_check_batch(c, b);
}

/* the step's first token of each sequence (its tokens are consecutive, sequences in order: check_batch), and an
 * empty state for every sequence that starts at position 0 (a new one, or one recomputed after preemption) */
static void state_plan(context_t *c, const batch_t *b) {
    for (int i = 0, t = 0; i <= b->num_seqs; i++) {
        while (t < b->num_tokens && b->seq_of_token[t] < i) t++;
        c->seq_first[i] = t;
    }
    for (int i = 0; i < b->num_seqs; i++)
        if (c->seq_first[i + 1] > c->seq_first[i] && b->positions[c->seq_first[i]] == 0) {
            memset(c->state + (size_t)b->state_slots[i] * c->model->state_floats, 0,
                   c->model->state_floats * sizeof(float));
            c->state_pos[b->state_slots[i]] = 0;
        }
}

int state_slot_read(const context_t *c, int slot, float *out, int32_t *next_pos) {
    if (slot < 0 || slot >= c->num_state_slots) return -1;
    memcpy(out, c->state + (size_t)slot * c->model->state_floats, c->model->state_floats * sizeof(float));
    *next_pos = c->state_pos[slot];
    return 0;
}

int state_slot_write(context_t *c, int slot, const float *in, int32_t next_pos) {
    if (slot < 0 || slot >= c->num_state_slots) return -1;
    memcpy(c->state + (size_t)slot * c->model->state_floats, in, c->model->state_floats * sizeof(float));
    c->state_pos[slot] = next_pos;
    return 0;
}

static int layer_has_kv(const layer_t *L) {
    for (int i = 0; i < L->n_blocks; i++)
        if (L->blocks[i].kind == BLOCK_ATTENTION) return 1;
    return 0;
}

/* the layers with a slice of the KV cache (an attention block): all of them but a hybrid's recurrent ones */
int model_kv_layers(const model_t *m) {
    int n = 0;
    for (int l = 0; l < m->cfg.n_layers; l++) n += layer_has_kv(&m->layers[l]);
    return n;
}

/* one layer: its blocks in order, each x += block(x) */
static int layer_forward(context_t *c, stage_t *s, const layer_t *L) {
    for (int i = 0; i < L->n_blocks; i++) {
        const block_t *B = &L->blocks[i];
        switch (B->kind) {
        case BLOCK_ATTENTION: attention_block(c, s, B); break;           /* x += attention(rmsnorm(x)) */
        case BLOCK_FFN_GATED: ffn_gated_block(c, s, B); break;           /* x += down(act(gate) * up) */
        case BLOCK_FFN_MOE: ffn_moe_block(c, s, B); break;               /* x += the chosen experts, weighted */
        case BLOCK_RECURRENT: gdn_block(c, s, B); break;                 /* x += Gated DeltaNet, state per slot */
        default: return FORWARD_BAD_BLOCK_KIND;
        }
    }
    return FORWARD_OK;
}

int forward(context_t *c, const batch_t *b) {
    const model_t *m = c->model;
    const model_config_t *cfg = &m->cfg;
    int rc = check_batch(c, b);
    if (rc) return rc;
    int T = b->num_tokens, dim = cfg->dim;
    stage_t s = {.c = c, .b = b, .ntok = T, .lora = batch_has_lora(b)};
    attention_plan(c, b, &s);                            /* the step's attention items, for every layer */
    if (m->n_recurrent) state_plan(c, b);                /* each sequence's tokens; a slot starting over is zeroed */

    stage_run(c, STAGE_EMBED, T, 16, embed_fn, &s);                                 /* x = embed(tokens) */
    if (b->hidden_out) memcpy(b->hidden_out, c->x, (size_t)T * dim * sizeof(float));
    for (int l = 0; l < cfg->n_layers; l++) {
        s.layer = l;
        if ((rc = layer_forward(c, &s, &m->layers[l]))) return rc;                  /* x = layer(x) */
        s.kv_layer += layer_has_kv(&m->layers[l]);
        if (b->hidden_out) memcpy(b->hidden_out + (size_t)(l + 1) * T * dim, c->x, (size_t)T * dim * sizeof(float));
    }
    if (m->n_recurrent)
        for (int i = 0; i < b->num_seqs; i++)
            if (c->seq_first[i + 1] > c->seq_first[i])
                c->state_pos[b->state_slots[i]] = b->positions[c->seq_first[i + 1] - 1] + 1;
    if (b->final_out)
        for (int t = 0; t < T; t++)
            rmsnorm(c->x + (size_t)t * dim, m->output_norm, dim, cfg->norm_eps, b->final_out + (size_t)t * dim);
    if (b->num_out == 0) return 0;
    /* logits only for the rows that need them: gather them to the front of x (out_rows ascend) */
    for (int i = 0; i < b->num_out; i++)
        if (b->out_rows[i] != i) memmove(c->x + (size_t)i * dim, c->x + (size_t)b->out_rows[i] * dim, dim * sizeof(float));
    s.ntok = b->num_out;
    stage_prepare_input(c, &s, c->x, dim, m->output_norm, &m->output);                   /* rmsnorm(x) */
    stage_matmul(c, STAGE_OUTPUT, &s, &m->output, c->logits, 0);                          /* logits */
    stage_run(c, STAGE_SAMPLE, b->num_out, 1, sample_fn, &s);
    return 0;
}

/* ---- context ---- */

context_t *context_create(const model_t *m, int max_tokens, int max_out, int num_kv_blocks, int threads) {
    return context_create_kv(m, max_tokens, max_out, num_kv_blocks, threads, KV_F16);
}

context_t *context_create_kv(const model_t *m, int max_tokens, int max_out, int num_kv_blocks, int threads,
                             int kv_dtype) {
    return context_create_state(m, max_tokens, max_out, num_kv_blocks, threads, kv_dtype, m->n_recurrent ? 1 : 0);
}

/* the recurrent blocks' buffers: the slots' states, and the step's scratch for the largest block */
static int state_create(context_t *c, int num_state_slots) {
    const model_t *m = c->model;
    if (!m->n_recurrent) return 0;
    if (num_state_slots < 1) return -1;
    int width = 0, vdim = 0, scratch = 0, heads = 0;
    for (int l = 0; l < m->cfg.n_layers; l++)
        for (int i = 0; i < m->layers[l].n_blocks; i++) {
            const block_t *B = &m->layers[l].blocks[i];
            if (B->kind != BLOCK_RECURRENT) continue;
            const gdn_block_t *G = &B->gdn;
            int w = GDN_CONV_DIM(G) + GDN_VALUE_DIM(G), sc = 2 * G->head_k + 2 * G->head_v;
            width = w > width ? w : width;
            vdim = GDN_VALUE_DIM(G) > vdim ? GDN_VALUE_DIM(G) : vdim;
            scratch = sc > scratch ? sc : scratch;
            heads = G->n_v_heads > heads ? G->n_v_heads : heads;
        }
    c->num_state_slots = num_state_slots;
    c->state = calloc((size_t)num_state_slots * m->state_floats, sizeof(float));
    c->state_pos = calloc(num_state_slots, sizeof(int32_t));
    c->seq_first = malloc((size_t)(c->max_tokens + 1) * sizeof(int32_t));
    c->gdn_in = malloc((size_t)c->max_tokens * width * sizeof(float));
    c->gdn_ba = malloc((size_t)c->max_tokens * 2 * heads * sizeof(float));
    c->gdn_out = malloc((size_t)c->max_tokens * vdim * sizeof(float));
    c->gdn_xq = malloc((size_t)c->max_tokens * (vdim / QK) * sizeof(block_q8x));
    c->gdn_scratch = malloc((size_t)pool_size(c->pool) * scratch * sizeof(float));
    return c->state && c->state_pos && c->seq_first && c->gdn_in && c->gdn_ba && c->gdn_out && c->gdn_xq &&
           c->gdn_scratch ? 0 : -1;
}

context_t *context_create_state(const model_t *m, int max_tokens, int max_out, int num_kv_blocks, int threads,
                                int kv_dtype, int num_state_slots) {
    const model_config_t *cfg = &m->cfg;
    int known = kv_dtype == KV_F16 || kv_dtype == KV_BF16 || kv_dtype == KV_Q8_0;
    if (!known || (kv_dtype == KV_Q8_0 && cfg->head_dim % QK)) return NULL;
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
    int kv_layers = model_kv_layers(m) > 0 ? model_kv_layers(m) : 1;
    size_t kv = (size_t)kv_layers * num_kv_blocks * KV_DIM(cfg) * KV_BLOCK;
    /* 4 KB pages, faulted as blocks are first used: a 2 MB page's fault would land on the first requests'
     * prefill, and huge pages gain decode far less on the KV cache than on the weights
     * (bench/results/design_measurements.md). */
    if (kv_dtype == KV_Q8_0) {
        size_t q8 = (size_t)kv_layers * num_kv_blocks * cfg->n_kv_heads * kvq8_slice_bytes(cfg->head_dim);
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
    int post_norms = 0;                  /* a block's output goes through c->y: a post-norm, or Wo's bias */
    for (int l = 0; l < cfg->n_layers; l++)
        for (int i = 0; i < m->layers[l].n_blocks; i++) {
            const block_t *B = &m->layers[l].blocks[i];
            post_norms |= B->post_norm != NULL || (B->kind == BLOCK_ATTENTION && B->attn.o_bias != NULL);
        }
    c->y = post_norms ? malloc((size_t)max_tokens * cfg->dim * sizeof(float)) : NULL;
    int gated = 0;
    for (int l = 0; l < cfg->n_layers; l++)
        for (int i = 0; i < m->layers[l].n_blocks; i++)
            gated |= m->layers[l].blocks[i].kind == BLOCK_ATTENTION && m->layers[l].blocks[i].attn.gated;
    c->attn_gate = gated ? malloc((size_t)max_tokens * Q_DIM(cfg) * sizeof(float)) : NULL;
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
        (post_norms && !c->y) || (gated && !c->attn_gate) || moe_scratch_create(c) ||
        state_create(c, num_state_slots)) {
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
    moe_scratch_free(c);
    free(c->lora_ax);
    free(c->attn_gate);
    free(c->state); free(c->state_pos); free(c->seq_first); free(c->gdn_in); free(c->gdn_ba); free(c->gdn_out);
    free(c->gdn_xq); free(c->gdn_scratch);
    free(c);
}
