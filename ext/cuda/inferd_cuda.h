/* inferd's CUDA backend: the C interface that ext/_cuda.pyx wraps.
 *
 * Two layers:
 *  - kernels one by one (icu_gemv, icu_rope_kv, icu_attn_decode, ...), over device pointers, on the default
 *    stream, synchronised before they return: the tests call these against float64 numpy references;
 *  - the model runner (icu_model_*): owns weights, the paged KV cache and all scratch, and runs one step of a
 *    flat batch in one call. A pure decode batch of up to 32 sequences runs as a CUDA graph captured once per
 *    padded batch size (1, 2, 4, 8, 16, 32) and replayed; anything else runs the same kernels eagerly, with
 *    tensor-core GEMMs (cuBLAS, or our own mma kernel) once a batch has more than a few tokens.
 *
 * Every function returns 0 or an error code; icu_error_string() names it. No function allocates device
 * memory on the hot path (icu_model_step): all of it is sized from the config in icu_model_create. */
#ifndef INFERD_CUDA_H
#define INFERD_CUDA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define ICU_BLOCK 64            /* KV positions per cache block (= the attention kernels' tile) */
#define ICU_MAX_GRAPH_BATCH 32  /* decode batches up to this size run as captured graphs */

/* device weight formats; all row-major (rows = output features), scales in a separate array */
enum {
    ICU_BF16 = 0,   /* q: bf16 (rows, cols) */
    ICU_I8 = 1,     /* q: int8 (rows, cols); s: float (rows) per-row scale */
    ICU_Q8 = 2,     /* GGUF Q8_0 split: q int8 (rows, cols); s: f16 (rows, cols/32) */
    ICU_Q4 = 3,     /* GGUF Q4_0 split (also our int4): q: (rows, cols/2) bytes, each 32-group 16 bytes with
                       element j in the low nibble of byte j and j+16 in the high nibble, value (nib-8)*d;
                       s: f16 (rows, cols/32) */
    ICU_Q41 = 4,    /* GGUF Q4_1 split: q as ICU_Q4, value nib*d + m; s: f16 pairs (d, m) (rows, cols/32) */
};

/* source encodings that icu_mat_convert reads (GGUF block layouts for the quantized ones) */
enum {
    ICU_SRC_F32 = 0, ICU_SRC_F16 = 1, ICU_SRC_BF16 = 2, ICU_SRC_Q8_0 = 3, ICU_SRC_Q4_0 = 4, ICU_SRC_Q4_1 = 5,
    ICU_SRC_RANDOM = 6,   /* no source: uniform values in [-scale, scale) from (seed, row, col) */
};

enum { ICU_KV_F16 = 0, ICU_KV_BF16 = 1 };

enum {  /* icu_model weights */
    ICU_W_EMB = 0, ICU_W_OUT = 1, ICU_W_OUT_NORM = 2, ICU_W_ATTN_NORM = 3, ICU_W_FFN_NORM = 4,
    ICU_W_QKV = 5, ICU_W_QKV_BIAS = 6, ICU_W_O = 7, ICU_W_GU = 8, ICU_W_DOWN = 9,
};

enum {  /* error codes besides CUDA's own (which are below 10000) */
    ICU_ERR_ARG = 10001, ICU_ERR_SHAPE = 10002, ICU_ERR_CAPACITY = 10003, ICU_ERR_UNSUPPORTED = 10004,
    ICU_ERR_CUBLAS = 10005, ICU_ERR_STATE = 10006,
};

typedef struct {
    int fmt, rows, cols;
    void *q;     /* device */
    void *s;     /* device, NULL for ICU_BF16 */
} icu_mat;

/* one logits row's sampling parameters (the same meaning as the CPU sampler's) */
typedef struct {
    float temperature;          /* <= 0: greedy (first maximum) */
    float top_p;                /* 1: off */
    float min_p;                /* 0: off */
    float repetition_penalty;   /* 1: off */
    float presence_penalty;
    float frequency_penalty;
    int32_t top_k;              /* 0: off */
    int32_t position;           /* the random number depends only on (seed, position) */
    uint64_t seed;
    int32_t has_mask;           /* 1: a grammar constrains the row (0, as zeroed params are: unconstrained) */
    int32_t mask_row;           /* then: the row's allowed-token bitmask in the masks array */
} icu_sample_params;

/* one token's logit adjustment in one row: bias, then the repetition penalty (when bit 0 of flags is set:
 * the token is in the history), then minus presence + frequency * count (count = flags >> 1, output tokens) */
typedef struct {
    int32_t token;
    int32_t flags;
    float bias;
    float saved;                /* scratch: the raw logit, restored after sampling */
} icu_adj;

const char *icu_error_string(int err);
int icu_device_count(int *count);
int icu_device_info(int dev, char *name, int name_len, int *cc_major, int *cc_minor, int *sm_count,
                    size_t *total_mem, size_t *l2_bytes);
int icu_set_device(int dev);
int icu_malloc(void **p, size_t nbytes);
int icu_free(void *p);
int icu_memcpy_h2d(void *dst, const void *src, size_t nbytes);
int icu_memcpy_d2h(void *dst, const void *src, size_t nbytes);
int icu_memset(void *p, int value, size_t nbytes);
int icu_synchronize(void);
/* device-to-device copy bandwidth: bytes read + written per second, median of `iters` copies of nbytes */
int icu_copy_bandwidth(size_t nbytes, int iters, double *bytes_per_s);

/* ---- weights ---- */
size_t icu_mat_q_bytes(int fmt, int rows, int cols);
size_t icu_mat_s_bytes(int fmt, int rows, int cols);
/* Writes rows [row0, row0 + nrows) of dst from `src` (device memory, nrows rows of src_row_bytes each, in
 * encoding src_type). Quantized targets quantize as ggml does (Q4: largest magnitude -> -8); Q8_0 -> ICU_Q8,
 * Q4_0 -> ICU_Q4 and Q4_1 -> ICU_Q41 copy the blocks exactly. */
int icu_mat_convert(const icu_mat *dst, int row0, int nrows, int src_type, const void *src, size_t src_row_bytes,
                    uint64_t seed, float scale);
/* dst (rows, cols) bf16 <- every row of m */
int icu_mat_dequant_bf16(const icu_mat *m, void *dst);

/* ---- kernels one by one (default stream, synchronised) ---- */
/* out[b, n] = (res[b, n] +) inv_rms_b * sum_k W[n, k] * gamma[k] * x[b, k]   for b < B, n < rows
 * gamma == NULL: no norm. swiglu: W has 2n rows (gate | up), out[b, j] = silu(gate_j) * up_j, j < rows/2. */
int icu_gemv(const icu_mat *w, const float *x, int ldx, const float *gamma, float eps, const float *res, int ldres,
             float *out, int ldo, int B, int swiglu);
/* x (T, dim) <- rows tokens[t] of the embedding matrix */
int icu_embed(const icu_mat *emb, const int32_t *tokens, int T, float *x);
/* out bf16 (T, dim) <- x (T, dim) normalised, times gamma */
int icu_rmsnorm_bf16(const float *x, const float *gamma, float eps, int T, int dim, void *out);
/* q|k|v rows (T, ldqkv) float: adds bias, rotates q in place, writes rotated k and v into the paged cache */
int icu_rope_kv(float *qkv, int ldqkv, const float *bias, const int32_t *positions, const int32_t *token_seq,
                const int32_t *block_tables, const int32_t *bt_width, const double *inv_freq, int n_heads, int n_kv,
                int head_dim, int neox, int kv_dtype, void *k_cache, void *v_cache, int T);
/* one query token per sequence b < B at position positions[b] (attends to [0, positions[b]]); a sequence of n
 * KV blocks is cut into splits of max(split_blocks, ceil(n / max_splits)) blocks */
int icu_attn_decode(const float *q, int ldq, const void *k_cache, const void *v_cache, int kv_dtype,
                    const int32_t *block_tables, const int32_t *bt_width, const int32_t *positions, int B,
                    int n_heads, int n_kv, int head_dim, float scale, int split_blocks, int max_splits,
                    float *part_o, float *part_ml, float *out, int ldo);
/* chunks: sequence s has query rows [seq_qstart[s], seq_qstart[s+1]) at positions seq_pos0[s] + i, causal */
int icu_attn_prefill(const float *q, int ldq, const void *k_cache, const void *v_cache, int kv_dtype,
                     const int32_t *block_tables, const int32_t *bt_width, const int32_t *seq_qstart,
                     const int32_t *seq_pos0, int S, int max_T, int n_heads, int n_kv, int head_dim, float scale,
                     float *out, int ldo);
/* rows r < R of logits (R, V): mask, adjust, sample, restore. masks: packed allowed-token bitmasks, row k at
 * masks + k * ((V + 31) / 32) (bit i & 31 of word i >> 5: token i allowed; the CPU sampler's layout), used by the
 * rows whose params.has_mask is set (NULL when none is). out_logprob = raw logit - logsumexp of the row's allowed
 * raw logits; a row with no allowed token gets token -1. */
int icu_sample(float *logits, int V, int R, const icu_sample_params *params, const int32_t *adj_offset,
               icu_adj *adj, const uint32_t *masks, int32_t *out_tokens, float *out_logprobs);
/* C (M, N) float = beta * C + X (M, K) bf16 @ W (N, K)^T bf16; kind 0: cuBLAS (when built in), 1: our mma */
int icu_gemm_bf16(const void *X, const void *W, float *C, int M, int N, int K, float beta, int kind);
int icu_have_cublas(void);

/* ---- the model runner ---- */
typedef struct icu_model icu_model;

typedef struct {
    int vocab, dim, n_layers, n_heads, n_kv_heads, head_dim, hidden, context_length;
    int qkv_bias, tie_embeddings, rope_neox;
    float norm_eps;
    int kv_dtype;
    int num_kv_blocks;          /* the scheduler's blocks; one more is kept for padded graph rows */
    int max_batch_tokens, max_seqs, max_logits_rows, max_adj;
    int split_blocks;           /* decode attention: shortest split in KV blocks (0: 2) */
    int max_splits;             /* decode attention: most splits per sequence (0: 32) */
    int use_graphs, use_pdl;    /* 0 or 1 */
    int gemm_kind;              /* 0: cuBLAS when built in, 1: our mma kernel */
    int gemv_max_tokens;        /* eager batches up to this many tokens use the GEMV kernels (0: 8) */
} icu_model_config;

typedef struct {
    int num_tokens, num_seqs, num_rows, bt_width, num_adj, num_masks;
    const int32_t *tokens, *positions, *seq_of_token;   /* (num_tokens); a sequence's tokens are contiguous */
    const int32_t *block_tables;                        /* (num_seqs, bt_width) */
    const int32_t *out_rows;                            /* (num_rows) token index of each logits row */
    const icu_sample_params *params;                    /* (num_rows) */
    const int32_t *adj_offset;                          /* (num_rows + 1) */
    const icu_adj *adj;                                 /* (num_adj) */
    const uint32_t *masks;                              /* (num_masks, (vocab + 31) / 32): params.mask_row */
    int32_t *out_tokens;                                /* (num_rows) */
    float *out_logprobs;                                /* (num_rows) */
    float *out_logits;                                  /* (num_rows, vocab) raw logits, or NULL */
    int used_graph;                                     /* out: 1 when the step replayed a graph */
} icu_batch;

int icu_model_create(const icu_model_config *cfg, const double *inv_freq, icu_model **out);
void icu_model_destroy(icu_model *m);
int icu_model_alloc_weight(icu_model *m, int which, int layer, int fmt, int rows, int cols);
/* host source rows -> weight rows [row0, row0 + nrows) (through a device staging buffer, in chunks) */
int icu_model_load_weight(icu_model *m, int which, int layer, int row0, int nrows, int src_type, const void *host,
                          size_t src_row_bytes);
int icu_model_random_weight(icu_model *m, int which, int layer, uint64_t seed, float scale);
int icu_model_finish_load(icu_model *m);
size_t icu_model_weight_bytes(const icu_model *m);
size_t icu_model_kv_bytes(const icu_model *m);
int icu_model_step(icu_model *m, icu_batch *b);
/* seconds per replay of the decode graph for batch size bs (captured if needed), every sequence at position
 * context - 1, for the benchmark (the KV cache holds whatever it holds) */
int icu_model_time_decode(icu_model *m, int bs, int context, int iters, double *seconds);
/* seconds per GEMV call, rotating over n_mats matrices (so that the weights do not sit in L2) */
int icu_bench_gemv(const icu_mat *mats, int n_mats, int B, int swiglu, int iters, double *seconds);

#ifdef __cplusplus
}
#endif
#endif
