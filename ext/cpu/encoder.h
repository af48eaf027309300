/* Encoders (embedding models): BERT (nomic-bert too: rotary positions, SwiGLU) and bidirectional Gemma 3. Types and the entry points the Cython wrapper
 * calls; the forward pass is encoder.c, its own kernels encoder_kernels.c. Shapes in comments as in inferd.h. */
#ifndef INFERD_ENCODER_H
#define INFERD_ENCODER_H

#include "inferd.h"

enum { ENC_BERT = 0, ENC_GEMMA3 = 1 };                  /* values are stable, the Python side uses them */
enum { POOL_MEAN = 0, POOL_CLS = 1, POOL_LAST = 2 };
enum { ENC_ACT_IDENTITY = 0, ENC_ACT_TANH = 1 };        /* after a Dense layer (a cross-encoder's pooler: tanh) */
#define ENC_MAX_DENSE 4

typedef struct {
    int arch;
    int vocab, dim, n_layers, n_heads, n_kv_heads, head_dim, hidden;
    int max_positions;         /* BERT: rows of the position table; Gemma: rows of the RoPE tables */
    int n_types;               /* BERT: rows of the token-type table (a cross-encoder's pair uses 0 and 1) */
    int rotary;                /* BERT: rotary positions on q and k (nomic-bert) instead of a position table */
    int gated_ffn;             /* BERT: a SwiGLU FFN, down(silu(gate x) * up x) without biases (nomic-bert) */
    float norm_eps;
    float attn_scale;          /* multiplies q.k: 1/sqrt(head_dim), Gemma query_pre_attn_scalar^-1/2 */
    float embed_scale;         /* Gemma: sqrt(dim); BERT: 1 */
    int sliding_window;        /* Gemma's sliding layers: keys within window - 1 positions either side; 0 none */
    int pooling;               /* POOL_* */
    int normalize;             /* L2-normalize the output vector */
} encoder_config_t;

typedef struct {
    weight_t wqkv;  float *bqkv;      /* (q_dim + 2 kv_dim, dim); bias (q_dim + 2 kv_dim) or NULL */
    weight_t wo;    float *bo;        /* (dim, q_dim); (dim) or NULL */
    weight_t wup;   float *bup;       /* BERT (hidden, dim) + (hidden); Gemma and gated BERT (2 hidden, dim): per
                                       * 32 hidden units their 32 gate rows then their 32 up rows, no bias */
    weight_t wdown; float *bdown;     /* (dim, hidden); (dim) or NULL */
    /* BERT, post-norm: norm1 after attention, norm2 after the FFN, LayerNorm weight and bias (dim) */
    float *norm1_w, *norm1_b, *norm2_w, *norm2_b;
    /* Gemma: RMSNorm weights with Gemma's 1 + w folded in at load: before/after attention and FFN (dim), q and k
     * per head (head_dim) */
    float *attn_norm, *post_attn_norm, *ffn_norm, *post_ffn_norm, *q_norm, *k_norm;
    int sliding;                      /* Gemma: a sliding-window layer (local RoPE table too) */
    /* float weights as 16-row panels (gemm_panels.c: f32, or an F16/BF16 weight's own values), else NULL: the
     * weight_t then keeps only its type and shape, which say the panels' element type */
    void *wqkv_p, *wo_p, *wup_p, *wdown_p;
    /* Wqkv in two parts (BERT under --quantize): wqkv holds its first rows quantized (those of q and k), wqkv_f the
     * rest (v, whose 8-bit rounding costs too much accuracy) as float panels; wqkv_f_p and wqkv_f_bf NULL: wqkv is
     * all of it */
    weight_t wqkv_f; void *wqkv_f_p;
    uint16_t *wqkv_f_bf;              /* wqkv_f as bf16 panels instead of wqkv_f_p (gemm_panels.c), or NULL */
} enc_layer_t;

typedef struct {
    encoder_config_t cfg;
    weight_t tok_embd;                /* (vocab, dim) */
    float *pos_embd;                  /* BERT: (max_positions, dim), NULL when rotary */
    float *type_embd;                 /* BERT: (n_types, dim) */
    float *embd_norm_w, *embd_norm_b; /* BERT: (dim) */
    float *final_norm;                /* Gemma: (dim), 1 + w */
    float *rope_global, *rope_local;  /* Gemma, rotary BERT (global only): (max_positions, head_dim/2, 2) cos, sin */
    enc_layer_t *layers;              /* (n_layers) */
    int n_dense;                      /* sentence-transformers Dense modules after pooling, float weights */
    weight_t dense[ENC_MAX_DENSE];    /* (out, in) */
    float *dense_bias[ENC_MAX_DENSE]; /* (out) or NULL */
    void *dense_p[ENC_MAX_DENSE];     /* panels of dense[i] */
    int dense_act[ENC_MAX_DENSE];     /* ENC_ACT_* applied to dense[i]'s output */
    int out_dim;                      /* the vector's length: dim, or the last Dense's out */
} encoder_t;

/* A flat batch of whole sequences, one after another. */
typedef struct {
    int num_tokens, num_seqs;
    const int32_t *token_ids;         /* (num_tokens) */
    const int32_t *seq_start;         /* (num_seqs + 1) first token of each sequence, then num_tokens */
    const int32_t *type_ids;          /* (num_tokens) BERT token types, or NULL: all 0 */
    float *out;                       /* (num_seqs, out_dim) the embeddings */
    float *hidden_out;                /* (num_tokens, dim) or NULL: last hidden states before pooling, for tests */
} enc_batch_t;

enum { ESTAGE_EMBED, ESTAGE_QKV, ESTAGE_ATTENTION, ESTAGE_WO, ESTAGE_NORM, ESTAGE_UP, ESTAGE_DOWN, ESTAGE_POOL,
       ENC_NUM_STAGES };

typedef struct {
    const encoder_t *model;
    pool_t *pool;
    int max_tokens, max_seqs;
    int profile_on;
    double profile[ENC_NUM_STAGES];
    /* scratch, allocated once */
    float *x;                         /* (max_tokens, dim) residual stream */
    float *xn;                        /* (max_tokens, dim) normed input of a float weight; Wo/down output (Gemma) */
    float *qkv;                       /* (max_tokens, q_dim + 2 kv_dim) */
    float *attn;                      /* (max_tokens, q_dim) attention output */
    float *h;                         /* (max_tokens, hidden) FFN activation, for a float down projection */
    block_q8x *xq;                    /* (max_tokens, max(dim, q_dim) / 32) quantized input of a matmul */
    block_q8x *xq_h;                  /* (max_tokens, hidden / 32) */
    uint16_t *xbf;                    /* (max_tokens, dim) a bf16 weight's input, where a layer has one; else NULL */
    float *gu;                        /* (threads, ENC_CHUNK, 64) an FFN item's gate and up */
    float *scores;                    /* (threads, ENC_ATTN_QBLOCK, ENC_PAD(max_tokens)) scores of a block of queries */
    float *kt;                        /* (threads, head_dim, ENC_PAD(max_tokens)) a sequence's keys of one head,
                                       * transposed */
    int32_t *seq_of;                  /* (max_tokens) sequence of each token */
    float *pooled;                    /* (max_seqs, max(dim, dense outs)) two buffers for the dense chain */
    float *pooled2;
    kernel_config_t kernels;          /* this context's matmul kernel settings */
} encoder_ctx_t;

encoder_ctx_t *encoder_ctx_create(const encoder_t *m, int max_tokens, int max_seqs, int threads);
void encoder_ctx_free(encoder_ctx_t *c);
int encoder_forward(encoder_ctx_t *c, const enc_batch_t *b);   /* 0 ok; <0 invalid batch */

/* float GEMM over 16-row panels (gemm_panels.c): y[t, r - 16 panel_begin] (+)= W x[t] for the rows of panels
 * [panel_begin, panel_end); x (ntok, cols); type: the weight's type (its panels' element type follows from it) */
#define PANEL_ROWS 16
void *pack_panels(const weight_t *w);         /* (ceil(rows / 16), cols, 16); NULL for a quantized w or no memory */
int panels_keep_16bit(int type);              /* whether an F16/BF16 weight's panels hold its 16-bit values here */
void gemm_panels(const void *panels, int type, int rows, int cols, int panel_begin, int panel_end, int ntok,
                 const float *x, float *y, int ldy, int accumulate);

/* bfloat16 GEMM over panels of column pairs (gemm_panels.c), for the float parts of a quantized encoder where
 * encoder_bf16_preferred(): weights and activations rounded to bf16, VDPBF16PS's sums (the file says how) */
uint16_t f32_to_bf16(float f);
void f32_to_bf16_row(const float *x, int n, uint16_t *out);
uint16_t *pack_panels_bf16(const weight_t *w);   /* (ceil(rows / 16), cols / 2, 16, 2); NULL: quantized, odd cols */
void gemm_panels_bf16(const uint16_t *panels, int rows, int cols, int panel_begin, int panel_end, int ntok,
                      const uint16_t *x, float *y, int ldy, int accumulate);
int encoder_bf16_preferred(void);

/* kernels (encoder_kernels.c) */
void layernorm(const float *x, const float *w, const float *b, int n, float eps, float *out);   /* n % 8 == 0 */
void gelu_erf(float *x, int n);                                       /* in place: x * Phi(x) */
/* in place: x = gelu_erf(x + bias[i % nb]) (bias NULL: no bias), the bits of an add then gelu_erf */
void bias_gelu_erf(float *x, const float *bias, int nb, int n);
void add_bias(float *y, int ldy, int nt, const float *bias, int n);  /* y[t * ldy + r] += bias[r], t < nt, r < n */
/* one query head over a sequence of n tokens: rows i of q, k, v at i * stride; out (n, out_stride); scratch, 64-byte
 * aligned: scores (ENC_ATTN_QBLOCK ENC_PAD(n)), kt (hd ENC_PAD(n)) */
#define ENC_ATTN_QBLOCK 8
#define ENC_PAD(n) (((n) + 15) & ~15)
void attention_bidir(const float *q, const float *k, const float *v, int q_stride, int kv_stride, int n, int hd,
                     float scale, int window, float *out, int out_stride, float *scores, float *kt);

#endif
