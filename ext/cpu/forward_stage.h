/* What forward.c and the blocks it runs (block_attention.c, block_ffn.c) share: a stage's arguments, and the
 * helpers that run one parallel region over the thread pool. Private to the forward pass. */
#ifndef FORWARD_STAGE_H
#define FORWARD_STAGE_H

#include "inferd.h"

#define Q_DIM(c) ((c)->n_heads * (c)->head_dim)
#define KV_DIM(c) ((c)->n_kv_heads * (c)->head_dim)

/* An adapted matmul's LoRA work (lora.c): up to three targets (Wq|Wk|Wv's), each landing in rows
 * [row0, row0 + rows) of y */
typedef struct {
    int n;
    int target[3], row0[3], rows[3];
    int items_before[4];     /* the B stage's output rows before each target's, in whole items */
    const float *x;          /* (ntok, in_dim) the matmul's input in floats */
    int in_dim;
    float *y;                /* (ntok, ldy) its output */
    int ldy;
} lora_job_t;

/* A parallel stage's arguments: each stage is fn(arg, begin, end, thread) over items. */
typedef struct {
    context_t *c;
    const batch_t *b;
    int layer;               /* the layer being run */
    int kv_layer;            /* its slice of the KV cache: the attention layers before it (model_kv_layers) */
    const block_t *block;    /* the block being run */
    const weight_t *w;
    const float *in;         /* (ntok, in_dim) the matmul's input, or the norm's */
    const float *gamma;      /* rmsnorm weights (NULL: the matmul reads `in` itself) */
    const float *post_gamma; /* a block's post-norm weights */
    const float *bias;       /* the bias added to a block's output before its post-norm and residual add, or NULL */
    float *out;              /* (ntok, in_dim) normed copy, for a float weight (else NULL) */
    int ntok, in_dim;
    const block_q8x *xq;     /* the matmul's quantized input: (ntok, in_dim / 32) */
    float *y;                /* (ntok, ldy) */
    int ldy, accumulate;
    /* the step's attention plan (attention_plan), the same for every attention block */
    int n_runs;                          /* runs of consecutive tokens of one sequence (c->runs) */
    int heads_per_item, items_per_run;   /* attention: KV heads per item, items per run */
    int fused_rope;                      /* attention items do their tokens' RoPE and K/V writes too */
    int segments;                        /* attention: key segments per item of a split decode step, or 1 */
    int64_t attn_items, attn_chunk;      /* attention items, and how many a thread claims at once */
    int lora;                            /* some sequence of the batch has an adapter: the matmuls' inputs are
                                          * kept in floats for it */
    const lora_job_t *lora_job;          /* the adapted matmul being run */
} stage_t;

/* one parallel region over n items; with profiling on, its wall time is added to the stage's total */
void stage_run(context_t *c, int stage, int64_t n, int64_t chunk, pool_fn fn, stage_t *s);
/* y (+)= w s->in, from s->xq (and s->out or s->in for a float weight) */
void stage_matmul(context_t *c, int stage, stage_t *s, const weight_t *w, float *y, int accumulate);
/* the next matmul reads `in` (floats, for a float weight) and xq, quantized already */
void stage_set_input(stage_t *s, const float *in, int in_dim, const block_q8x *xq);
/* xq = quantize(rmsnorm(in)) for the matmul by `reader` (and xn = rmsnorm(in) if that weight is in floats) */
void stage_prepare_input(context_t *c, stage_t *s, const float *in, int in_dim, const float *gamma,
                         const weight_t *reader);
/* the same, with xn = rmsnorm(in) kept in floats whatever the readers (the MoE router and shared gate read them) */
void stage_prepare_input_floats(context_t *c, stage_t *s, const float *in, int in_dim, const float *gamma);
/* x += W in (+ bias), or, with a post-norm (sandwich norms), x += rmsnorm(W in (+ bias)); bias (w->rows) or NULL;
 * the adapters' `lora_target` product (of in, the floats) added to W in first when the batch has adapters (-1: none) */
void stage_matmul_residual(context_t *c, int stage, stage_t *s, const weight_t *w, const float *bias,
                           const float *post_norm, int lora_target);

/* LoRA (lora.c). A job is its input and output, then its targets added one by one. */
int batch_has_lora(const batch_t *b);
int lora_check_batch(const context_t *c, const batch_t *b);   /* FORWARD_OK or FORWARD_BAD_LORA */
void lora_job_init(lora_job_t *job, const float *x, int in_dim, float *y, int ldy);
void lora_job_add(lora_job_t *job, int target, int row0, int rows);
/* y += scale B (A x) for every adapted token: A x, then the B rows */
void stage_lora(context_t *c, stage_t *s, const lora_job_t *job);
/* A x only, for a stage that adds the rows itself with lora_add_rows (the gated FFN's gate|up) */
void stage_lora_down(context_t *c, stage_t *s, const lora_job_t *job);
/* rows [row_begin, row_end) (at most 32) of the job's target i, for every adapted token t, added to
 * y[t * ldy + row - row_begin] */
void lora_add_rows(const stage_t *s, const lora_job_t *job, int i, int row_begin, int row_end, float *y, int ldy);

/* the blocks a layer is made of: each x += block(x) over the batch's tokens (block_attention.c, block_ffn.c,
 * block_moe.c) */
void attention_plan(context_t *c, const batch_t *b, stage_t *s);   /* once per step, before the layers */
void attention_block(context_t *c, stage_t *s, const block_t *B);
void ffn_gated_block(context_t *c, stage_t *s, const block_t *B);
void ffn_moe_block(context_t *c, stage_t *s, const block_t *B);
void gdn_block(context_t *c, stage_t *s, const block_t *B);
/* the MoE blocks' buffers in c->moe, for the largest of the model's (none for a dense model): 0, or -1 out of memory */
int moe_scratch_create(context_t *c);
void moe_scratch_free(context_t *c);

#endif
