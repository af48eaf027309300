/* inferd CPU engine: shared types and the entry points the Cython wrapper calls.
 *
 * Conventions: a weight has `rows` outputs and `cols` inputs (y = W x). Activations are row-major
 * (token, features). Every buffer comment gives its shape. */
#ifndef INFERD_H
#define INFERD_H

#include <stddef.h>
#include <stdint.h>

#define QK 32            /* values per quantized block (GGUF's QK4_0 == QK8_0 == 32) */
#define QK_K 256         /* values per K-quant super-block */
#define TILE_ROWS 8      /* rows interleaved in one weight tile: accumulator lane r <-> row r */
#define KV_BLOCK 64      /* positions per KV-cache block == attention tile */
#define MAX_TOP_LOGPROBS 20

/* Weight types: values are stable, the Python side uses them. */
enum { WT_F32 = 0, WT_F16 = 1, WT_BF16 = 2, WT_Q4_0 = 3, WT_Q4_1 = 4, WT_Q8_0 = 5, WT_Q4_K = 6, WT_Q5_K = 7,
       WT_Q6_K = 8, WT_Q5_0 = 9, WT_Q5_1 = 10, WT_Q2_K = 11, WT_Q3_K = 12, WT_IQ4_NL = 13, WT_IQ4_XS = 14,
       WT_MXFP4 = 15, WT_IQ2_XXS = 16, WT_IQ2_XS = 17, WT_IQ2_S = 18, WT_IQ3_XXS = 19, WT_IQ3_S = 20, WT_IQ1_S = 21,
       WT_IQ1_M = 22, WT_TQ1_0 = 23, WT_TQ2_0 = 24, NUM_WEIGHT_TYPES };

/* Kernel paths, best last. */
enum { PATH_SCALAR = 0, PATH_AVX2 = 1, PATH_AVX512VNNI = 2, PATH_AVXVNNI = 3 };

/* An activation row quantized to 8 bits: one block per 32 values, 64 bytes. `isum` is sum(qs), kept exact so
 * Q4 weights stored unsigned (w + 8) can subtract 8 * isum and Q4_1 can add its min term; the corrections
 * -8 * isum (unsigned Q4) and -128 * isum (Q8 made unsigned for dpbusd) are stored too, so the kernels
 * start a block's integer sum from a broadcast load instead of computing them for every tile. dsum = d * isum is
 * the min term's factor (types with a min add dsum * m_w). Q6_K's sub-blocks of 16 need the sums of the two halves
 * (values 0-15 and 16-31): hsum, and q6_corr = -32 * hsum (its values are stored as q + 32). */
typedef struct {
    float d;
    int32_t isum;
    int32_t q4_corr, q8_corr;
    float dsum;
    int32_t q6_corr[2];
    int16_t hsum[2];
    int8_t qs[QK];
} block_q8x;

/* A weight matrix in the engine's layout (weight.c has the tile layouts of every quantized type).
 * Quantized types: rows padded to a multiple of 8; tile t holds rows 8t..8t+7 as one "tile block" after another
 * along the columns (32 columns, or 256 for the K-quants), laid out so that lane r of every 32-byte vector belongs
 * to row r and one f16->f32 conversion serves 8 rows. Float types: plain row-major (rows, cols).
 * A fused matrix (Wq|Wk|Wv) may hold segments of different quantized types, one after another by rows: each
 * segment but the last has a multiple of 8 rows, so a tile never straddles two. */
#define MAX_SEGMENTS 3
typedef struct {
    int type;            /* segment 0's type (all segments' when there is one) */
    int rows, cols;
    int padded_rows;     /* rows rounded up to TILE_ROWS for quantized types, == rows otherwise */
    size_t nbytes;
    uint8_t *data;       /* 64-byte aligned */
    int owned;           /* data was allocated by weight_init (else it lies in the caller's buffer) */
    int nseg;            /* 1, or the number of segments */
    /* first row, byte offset into data, and the segment's kernels: bound when the weight is built, from its type's
     * row of the type-traits table (type_traits.c) and the kernel path then active (weight_bind_kernels) */
    struct { int type, row0; size_t offset; const struct weight_kernels *kernels; } seg[MAX_SEGMENTS];
    int path;            /* the kernel path the segments' kernels were bound for */
} weight_t;

const char *weight_type_name(int type);   /* GGUF's name of a type ("Q4_K"), NULL for none */
size_t weight_tile_block_bytes(int type);
int weight_block_cols(int type);          /* columns per tile block: 32, or 256 for the K-quants */
int weight_is_quantized(int type);
/* bytes of the engine's layout of a (rows, cols) weight of `type` (0 for a bad shape or type) */
size_t weight_layout_bytes(int type, int rows, int cols);
/* dst: weight_layout_bytes of 64-byte aligned memory to build it in, or NULL to allocate it */
int weight_init(weight_t *w, int type, int rows, int cols, const void *src, size_t src_bytes, uint8_t *dst);
/* A weight of segments (types[i], rows[i]) whose rows are then filled by weight_fill; 0, or -1 for a bad shape,
 * -2 out of memory. */
size_t weight_layout_bytes_seg(int nseg, const int *types, const int *rows, int cols);
int weight_init_seg(weight_t *w, int nseg, const int *types, const int *rows, int cols, uint8_t *dst);
/* Repacks `src_rows` GGUF rows of the segment's type (row i at src + i * gguf_row_bytes) into the weight's rows
 * dst_row0 + (i / group) * group_stride + i % group (group == src_rows: consecutive rows). Rows are split among
 * the pool's threads when pool is not NULL. 0, or -1 when a row falls outside the weight or crosses segments. */
struct pool;
int weight_fill(weight_t *w, const void *src, int src_rows, int dst_row0, int group, int group_stride,
                struct pool *pool);
/* A model's weights are filled as a list of these in one call without the GIL: between weights filled one call
 * each, every return to Python waited for the GIL on whatever Python ran beside the load (the tokenizer's build,
 * the server's imports), with the pool idle. `drop`: whole pages of a file mapping the source lies in, dropped
 * from the process' resident set once filled (they stay in the page cache), so a load's peak is the weights' size
 * rather than twice it; NULL for none. */
typedef struct {
    weight_t *w;
    const void *src;
    int src_rows, dst_row0, group, group_stride;
    void *drop;
    size_t drop_bytes;
} weight_fill_job_t;
/* Fills jobs in order until all are done or `seconds` have passed since the call (0: no limit; at least one job
 * is done): returns how many were done, and *failed = 1 when the job after them failed (see weight_fill). */
size_t weight_fill_jobs(const weight_fill_job_t *jobs, size_t n, struct pool *pool, double seconds, int *failed);
void weight_free(weight_t *w);
/* binds the segments' kernels for `path` again (a built weight has those of the path active when it was built; kernel
 * tests that compare paths on one weight rebind it) */
void weight_bind_kernels(weight_t *w, int path);
void weight_dequant_row(const weight_t *w, int row, float *out);           /* out: (cols) */
size_t gguf_row_bytes(int type, int cols);
int quantize_rows_gguf(const float *x, int rows, int cols, int type, uint8_t *out);

/* ---- fp16/bf16 ---- */
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);
static inline float bf16_to_f32(uint16_t h) {
    union { uint32_t u; float f; } v; v.u = (uint32_t)h << 16; return v.f;
}

/* ---- runtime dispatch ---- */
int cpu_best_path(void);
int cpu_path(void);                 /* the active path */
int cpu_set_path(int path);         /* returns 0, or -1 when this CPU cannot run it */
const char *cpu_path_name(int path);

/* ---- thread pool ---- */
typedef void (*pool_fn)(void *arg, int64_t begin, int64_t end, int thread);
typedef struct pool pool_t;   /* struct pool: see pool.c */
pool_t *pool_create(int nthreads);
void pool_destroy(pool_t *p);
int pool_size(const pool_t *p);
/* Runs fn over [0, n) in claims from an atomic counter, each 1/nthreads of what is left but at least `chunk` items
 * (the smallest piece worth a call); the caller works too. */
void pool_run(pool_t *p, int64_t n, int64_t chunk, pool_fn fn, void *arg);
double now_seconds(void);   /* a monotonic clock (the stage profiles, the weights' fill), in seconds */

double read_bandwidth(size_t nbytes, int threads, int repeats);   /* bytes per second */

/* zeroed memory for big long-lived buffers, 2 MB aligned, first faulted on 4 KB pages and turned into transparent
 * huge pages by huge_collapse once written (hugemem.c); NULL when out of memory. huge_free takes the size given to
 * huge_alloc. */
void *huge_alloc(size_t n);
void huge_free(void *p, size_t n);
/* how much of a buffer huge_collapse turned into huge pages */
enum { HUGE_PAGES_COLLAPSING, HUGE_PAGES_ALL, HUGE_PAGES_PARTLY, HUGE_PAGES_NONE };
int huge_collapse(void *p, size_t n);            /* now, on this thread; a HUGE_PAGES_ state */
/* the same on a thread of its own at the lowest priority (NULL: no thread, the buffer stays as it is);
 * huge_collapse_wait blocks until it is done, huge_collapse_end stops it between two pages, joins it and frees it:
 * call it before the buffer is freed */
typedef struct huge_collapser huge_collapser_t;
huge_collapser_t *huge_collapse_start(void *p, size_t n);
int huge_collapse_state(huge_collapser_t *c);
int huge_collapse_wait(huge_collapser_t *c);
void huge_collapse_end(huge_collapser_t *c);

/* ---- kernels (pure functions over typed buffers) ---- */
void quantize_act(const float *x, int n, block_q8x *out);                 /* x: (n), out: (n/32) */
void quantize_act_strided(const float *x, int n, block_q8x *out, size_t stride);   /* block b to out[b * stride] */
/* Which of a path's matmul kernels may run, held per context (a chat model's context and the embedding context that
 * shares its weights set their own): every setting gives the same bits, tests force each.
 *   prefill: the best prefill kernels the VNNI paths may use: 8-row ymm tiles, pairs of tiles in zmm, or those with AMX
 *            for 16 tokens at a time (where the CPU has AVX-512 VNNI, and AMX that the OS grants)
 *   decode_group: a decode step's (one token's) tiles per kernel call, 1..QGROUP_TILES
 *   decode_zmm: a decode step's quantized kernels (Q8_0 aside) on pairs of tiles in zmm where the CPU has AVX-512 VNNI
 *            (1), or the ymm group kernels (0)
 *   decode_prefetch_bytes: software prefetch in a decode step's kernels for tiles of at most this size (0: never,
 *            SIZE_MAX: always); the default is the CPU's (matmul.c says why) */
enum { PREFILL_TILES = 0, PREFILL_AVX512 = 1, PREFILL_AMX = 2 };
typedef struct {
    int prefill;
    int decode_group;
    int decode_zmm;
    size_t decode_prefetch_bytes;
} kernel_config_t;
void kernel_config_default(kernel_config_t *kc);     /* the defaults on this CPU */
/* the kernels a context's settings run with the active path on this CPU: PREFILL_*, and 1 for the zmm decode ones */
int matmul_prefill_kernels(const kernel_config_t *kc);
int matmul_decode_kernels(const kernel_config_t *kc);
/* y[t, rows - 8 * tile_begin] (+)= W x[t] for the rows of tiles [tile_begin, tile_end) with the weight's bound kernels
 * and kc's settings; x: (ntok, cols) f32, xq: (ntok, cols/32); y's first column is tile_begin's first row (matmul.c) */
void matmul_tiles(const kernel_config_t *kc, const weight_t *w, int tile_begin, int tile_end, int ntok,
                  const float *x, const block_q8x *xq, float *y, int ldy, int accumulate);
int matmul_num_tiles(const weight_t *w);
void rmsnorm(const float *x, const float *gamma, int n, float eps, float *out);   /* n % 8 == 0 */
void swiglu(const float *g, const float *u, float *h, int n);                      /* h = silu(g) * u */
void geglu(const float *g, const float *u, float *h, int n);                       /* h = gelu_tanh(g) * u */
/* gpt-oss's clamped SwiGLU (llama.cpp's swiglu_oai): x = min(g, 7), h = x sigmoid(1.702 x) (clamp(u, -7, 7) + 1) */
void swiglu_oai(const float *g, const float *u, float *h, int n);
void store_f16(const float *x, uint16_t *out, int n);
void rope_apply(float *vec, int n_heads, int head_dim, const float *cos_sin, int neox);
#define ATTN_MAX_TOKENS 16  /* consecutive tokens of a sequence attended together, sharing each KV block's reads */
#define ATTN_SEGMENT_BLOCKS 16   /* KV blocks per softmax segment: the unit a decode step splits across threads */
size_t attention_scratch_floats(int n_heads, int head_dim);
/* A key of head_dim values into the slot (0..KV_BLOCK-1) of one KV head's block slice: the cache keeps each
 * block's keys transposed, (head_dim, KV_BLOCK) per KV head; values stay (KV_BLOCK, head_dim). */
void kv_store_key(const float *k, uint16_t *block_slice, int slot, int head_dim);
/* The same over the bf16 cache (kv_cache_dtype = "bf16"; attention_bf16.c): a key or a value rounded to bf16 into its
 * slice's pair layout (the f16 slice's size), and one read back as floats (tests, and the float64 references). */
void kv_store_key_bf16(const float *k, uint16_t *slice, int slot, int head_dim);
void kv_store_value_bf16(const float *v, uint16_t *slice, int slot, int head_dim);
void kv_load_bf16(const uint16_t *slice, int head_dim, int slot, int is_k, float *out);
/* 1 when the active path runs them with VDPBF16PS (AVX-512 BF16); else two fmas per pair, slower than over f16 */
int attention_bf16_native(void);
/* Which keys the tokens of a run see, and the scores' scale. The query at position p sees, when causal, the keys
 * [p - window + 1, p] (all of [0, p] when window is 0); when not causal (an encoder), [p - window + 1, p + window - 1]
 * cut to [0, seq_len) (all of [0, seq_len) when window is 0). */
typedef struct {
    int pos0;          /* position of the run's first token; the others follow it */
    int seq_len;       /* keys in the cache (read when not causal) */
    int causal;
    int window;        /* sliding window: keys within window - 1 positions of the query; 0: no limit */
    float scale;       /* of q.k: 1/sqrt(head_dim), or the model's own */
    const float *sinks;   /* per query head of the call (its first KV head's first): a logit in every softmax's
                           * denominator that weighs no value (gpt-oss's attention sinks), or NULL for none */
    int bf16;          /* the cache holds bf16 pairs (attention_bf16.c), not f16 */
} attn_span_t;
void attention_tokens(const float *q, int q_stride, int ntok, int group, int n_kv_heads, int kv_heads, int head_dim,
                      const uint16_t *k_head, const uint16_t *v_head, const int32_t *block_table,
                      const attn_span_t *span, float *out, int out_stride, float *scratch,
                      const uint16_t *next_k, const uint16_t *next_v);
/* attention_tokens' work split by key segments (ATTN_SEGMENT_BLOCKS blocks each) for threads to share: the run
 * needs attention_num_segments; attention_segment computes segment seg's softmax state of every row into part
 * (attention_part_floats(ntok * group * kv_heads, head_dim) floats; returns 0 when the run sees none of it), and
 * attention_merge combines parts 0..nseg-1 (part_stride floats apart) in order into out: the same bits as
 * attention_tokens. */
int attention_num_segments(const attn_span_t *span, int ntok);
size_t attention_part_floats(int rows, int head_dim);
int attention_segment(const float *q, int q_stride, int ntok, int group, int n_kv_heads, int kv_heads, int head_dim,
                      const uint16_t *k_head, const uint16_t *v_head, const int32_t *block_table,
                      const attn_span_t *span, int seg, float *part, float *scratch);
void attention_merge(const float *parts, size_t part_stride, int nseg, int ntok, int group, int kv_heads,
                     int head_dim, float *out, int out_stride, const float *sinks);

/* ---- the int8 KV cache (kv_cache_dtype = "q8_0"; attention_q8.c) ---- */
enum { KV_F16 = 0, KV_Q8_0 = 1, KV_BF16 = 2 };
/* A (block, KV head) slice of the q8_0 cache, of K or of V: KV_BLOCK positions of head_dim int8 values q and one f16
 * scale d per 32 values of a position (value = d * q, GGUF's Q8_0), kvq8_slice_bytes(hd) = KV_BLOCK * hd * 17 / 16.
 * K keeps keys in lanes, like the int8 weight tiles: values 4c..4c+3 of position p lie at byte
 * ((p / 8) * (hd / 4) + c) * 32 + (p % 8) * 4, so one 32-byte load holds 4 values of 8 keys and an int8 dot
 * product leaves key i's sum in lane i; its scales follow as (hd / 32, KV_BLOCK): scale b of position p at
 * [b * KV_BLOCK + p], 8 keys' scales of a block side by side. V is row-major (KV_BLOCK, hd), then its scales
 * (KV_BLOCK, hd / 32). A layer's cache is (num_kv_blocks, n_kv_heads, slice). head_dim % 32 == 0. */
size_t kvq8_slice_bytes(int head_dim);
/* quantizes x (head_dim) into position pos of a K (is_k) or V slice */
void kvq8_store(const float *x, int head_dim, uint8_t *slice, int pos, int is_k);
/* position pos of a K or V slice, dequantized (tests, and the float64 references) */
void kvq8_load(const uint8_t *slice, int head_dim, int pos, int is_k, float *out);
size_t attention_q8_scratch_floats(int n_heads, int head_dim);
/* attention_tokens over the q8_0 cache: the same arguments, k_head/v_head addressed as (block, n_kv_heads, slice)
 * bytes with the first KV head's slice offset applied; scratch: attention_q8_scratch_floats. q is quantized to
 * 8 bits per 32 values (as the matmuls' activations) and each score is an exact int8 dot product per 32 values. */
void attention_tokens_q8(const float *q, int q_stride, int ntok, int group, int n_kv_heads, int kv_heads,
                         int head_dim, const uint8_t *k_head, const uint8_t *v_head, const int32_t *block_table,
                         const attn_span_t *span, float *out, int out_stride, float *scratch,
                         const uint8_t *next_k, const uint8_t *next_v);

/* ---- sampling ---- */
typedef struct {
    float temperature, top_p, min_p;
    int top_k;
    float repetition_penalty, presence_penalty, frequency_penalty;
    uint64_t seed;
    int num_logprobs;            /* -1 none, 0 chosen only, k: chosen + top k */
    int64_t history_offset;      /* into batch->history */
    int history_len, num_prompt;
    int64_t bias_offset;         /* into batch->bias_ids / bias_values */
    int bias_len;
    int mask_row;                /* row of batch->token_masks to apply; -1 (or no token_masks): unconstrained */
} sample_params_t;

typedef struct {
    int32_t token;
    float logprob;
    int32_t top_ids[MAX_TOP_LOGPROBS];
    float top_logprobs[MAX_TOP_LOGPROBS];
} sample_out_t;

/* logits: (vocab), modified in place; allowed: ((vocab + 31) / 32) packed allowed-token bits, or NULL for
 * none; scratch: vocab floats + vocab cand_t + vocab ints. out->token is -1 when the mask allows nothing. */
void sample_row(float *logits, int vocab, const sample_params_t *sp, int position,
                const int32_t *history, const int32_t *bias_ids, const float *bias_values,
                const uint32_t *allowed, void *scratch, sample_out_t *out);
uint64_t rng_u64(uint64_t seed, uint64_t position);

/* ---- the model and one forward step ---- */
typedef struct {
    int vocab, dim, n_layers, n_heads, n_kv_heads, head_dim, hidden;
    int context_length;
    float norm_eps;
    float rope_theta;
    /* llama3 rope scaling; factor == 0 means none */
    float rope_factor, rope_low_freq_factor, rope_high_freq_factor;
    int rope_original_ctx;
    float rope_freq_scale;             /* linear rope scaling of global layers: position * scale; 0: 1 */
    float rope_theta_local;            /* RoPE base of sliding-window layers; 0: rope_theta */
    /* YaRN rope scaling (llama.cpp's rope_yarn) of every layer; yarn_factor == 0 means none */
    float yarn_factor, yarn_ext_factor, yarn_attn_factor, yarn_beta_fast, yarn_beta_slow;
    int yarn_original_ctx;
    float embed_scale;                 /* x = embedding * embed_scale (Gemma: sqrt(dim)); 0: 1 */
    float logit_softcap;               /* logits = cap * tanh(logits / cap); 0: none */
    int rope_dims;                     /* RoPE on the first rope_dims of each head, the rest passed through; 0: all */
} model_config_t;

/* A layer is a short list of blocks, run in order, each adding its output to the residual stream x:
 * x += post_norm(block(rmsnorm(x, norm))). inferd/model/arch.py's table chooses every layer's list; forward()
 * dispatches on the kind. Values are stable, the Python side uses them. */
typedef enum {
    BLOCK_ATTENTION = 1,     /* the mixer: causal self-attention over the paged KV cache (attention_block_t) */
    BLOCK_FFN_GATED = 2,     /* the FFN: down(act(gate xn) * up xn), dense (ffn_gated_block_t) */
    BLOCK_FFN_MOE = 3,       /* the FFN as a router and k of n gated experts per token (ffn_moe_block_t) */
    BLOCK_RECURRENT = 4,     /* a mixer with a recurrent state per sequence in place of the KV cache: Gated DeltaNet
                              * (gdn_block_t) */
} block_kind_t;

/* a gated FFN's activation: SwiGLU, GeGLU (tanh GELU), gpt-oss's clamped SwiGLU (swiglu_oai) */
enum { ACT_SILU = 0, ACT_GELU_TANH = 1, ACT_SWIGLU_OAI = 2 };

typedef struct {
    weight_t wqkv;                     /* (q_dim + 2 kv_dim, dim) fused */
    weight_t wo;                       /* (dim, q_dim) */
    float *qkv_bias;                   /* (q_dim + 2 kv_dim) or NULL */
    float *o_bias;                     /* (dim) Wo's bias, or NULL */
    float *sinks;                      /* (n_heads) attention sinks: a logit per head in its softmax's denominator, or
                                        * NULL */
    float *q_norm, *k_norm;            /* (head_dim) QK-norm: RMSNorm of every q and k head before RoPE, or NULL */
    int qk_norm_full;                  /* the QK-norm is over all of q and all of k: q_norm (q_dim), k_norm (kv_dim) */
    int rope_neox;                     /* RoPE pairs (i, i + head_dim/2) (rotate-half); else (2i, 2i+1) */
    int window;                        /* sliding window (keys per query, itself included); 0: global attention */
    float scale;                       /* of q.k: the model's own, else 1/sqrt(head_dim) */
    const float *rope_cos_sin;         /* this block's table: the model's global or local one (model_init_rope) */
    weight_t wgate;                    /* (q_dim, dim) the output gate: attn * sigmoid(Wgate xn) before Wo (Qwen3.5) */
    int gated;                         /* wgate is there */
} attention_block_t;

typedef struct {
    weight_t wgu;                      /* (2 hidden, dim): per 32 hidden units, their 32 gate rows then 32 up rows */
    weight_t wdown;                    /* (dim, hidden) */
    int act;                           /* ACT_SILU or ACT_GELU_TANH */
} ffn_gated_block_t;

/* A mixture of experts (block_moe.c): per token, the router's n_experts logits (plus its bias) choose the n_used
 * highest (ties to the lower index), weighted by the softmax over all of them (MOE_GATING_SOFTMAX) or over the n_used
 * chosen (MOE_GATING_TOPK_SOFTMAX: gpt-oss); the token's output is the sum over them, by rank, of weight *
 * expert(xn), each expert a gated FFN of `hidden` units (with biases: gpt-oss), plus, with a shared expert,
 * sigmoid(shared_gate . xn) * shared(xn). */
#define MOE_MAX_EXPERTS 256
#define MOE_MAX_USED 32
enum { MOE_GATING_SOFTMAX = 0, MOE_GATING_TOPK_SOFTMAX = 1 };
typedef struct {
    weight_t router;                   /* (n_experts, dim) */
    weight_t *wgu;                     /* (n_experts) each (2 hidden, dim), gate|up interleaved by 32 as the dense FFN's */
    weight_t *wdown;                   /* (n_experts) each (dim, hidden) */
    int n_experts, n_used, hidden;
    int norm_topk;                     /* the n_used weights renormalized to sum to 1 */
    int gating;                        /* MOE_GATING_* */
    float *router_bias;                /* (n_experts) or NULL */
    float *gate_bias, *up_bias;        /* (n_experts, hidden) the experts' biases, or NULL */
    float *down_bias;                  /* (n_experts, dim) or NULL */
    float weights_scale;               /* the weights times this; 0: 1 */
    int act;                           /* ACT_SILU or ACT_GELU_TANH */
    float *shared_gate;                /* (dim) the shared expert's gate, or NULL for none */
    weight_t shared_gu, shared_down;   /* (2 shared_hidden, dim), (dim, shared_hidden) */
    int shared_hidden;
} ffn_moe_block_t;

/* Gated DeltaNet (block_gdn.c), a linear-attention mixer with a recurrent state per sequence. Per token:
 * (qkv, z) = Win xn, (b, a) = Wba xn; qkv goes through a causal depthwise convolution over the channel's last
 * conv_kernel inputs (the state keeps conv_kernel - 1 of them), then SiLU; q and k are L2-normed per key head;
 * per value head h (reading key head h % n_k_heads, or h / (n_v_heads / n_k_heads) with grouped_heads): beta = sigmoid(b_h), decay = exp(softplus(a_h + dt_bias_h) *
 * a_log_h), S = decay S, S += k (beta (v - S^T k))^T, o = S^T q / sqrt(head_k); out = rmsnorm(o, norm_out) *
 * silu(z_h); x += Wout out. S is (head_k, head_v) per value head, kept as (head_v, head_k): row j holds S[:, j]. */
typedef struct {
    weight_t win;                      /* (conv_dim + value_dim, dim): the q, k, v channels, then the gate z */
    weight_t wba;                      /* (2 n_v_heads, dim): beta's logits, then the decay's */
    weight_t wout;                     /* (dim, value_dim) */
    float *conv;                       /* (conv_dim, conv_kernel) taps, oldest input first */
    float *dt_bias;                    /* (n_v_heads) */
    float *a_log;                      /* (n_v_heads) the decay's rate, -exp(A_log) as the file stores it */
    float *norm_out;                   /* (head_v) the gated RMSNorm's weights */
    int n_k_heads, n_v_heads, head_k, head_v, conv_kernel;
    int index;                         /* this block's place among the model's recurrent blocks: its state slice */
    int grouped_heads;                 /* value heads grouped by key head (Qwen3-Next) rather than tiled (Qwen3.5) */
} gdn_block_t;
#define GDN_CONV_DIM(G) (2 * (G)->n_k_heads * (G)->head_k + (G)->n_v_heads * (G)->head_v)
#define GDN_VALUE_DIM(G) ((G)->n_v_heads * (G)->head_v)

typedef struct {
    int kind;                          /* block_kind_t */
    float *norm;                       /* (dim) RMSNorm of the block's input */
    float *post_norm;                  /* (dim) RMSNorm of its output before the residual add (sandwich), or NULL */
    union {
        attention_block_t attn;        /* BLOCK_ATTENTION */
        ffn_gated_block_t ffn;         /* BLOCK_FFN_GATED */
        ffn_moe_block_t moe;           /* BLOCK_FFN_MOE */
        gdn_block_t gdn;               /* BLOCK_RECURRENT */
    };
} block_t;

#define MAX_LAYER_BLOCKS 4
typedef struct {
    int n_blocks;
    block_t blocks[MAX_LAYER_BLOCKS];
} layer_t;

typedef struct {
    model_config_t cfg;
    weight_t tok_embd;                 /* (vocab, dim) */
    weight_t output;                   /* (vocab, dim); shares tok_embd's data when tied */
    int output_tied;
    float *output_norm;                /* (dim) */
    layer_t *layers;                   /* (n_layers) */
    float *rope_cos_sin;               /* (context_length, head_dim/2, 2) */
    float *rope_cos_sin_local;         /* the same for sliding-window layers with a base of their own, or NULL */
    int n_recurrent;                   /* recurrent blocks (their index runs 0..n_recurrent-1 in layer order) */
    size_t state_floats;               /* one sequence's recurrent state, every recurrent block's (gdn_state_floats) */
} model_t;

int model_init_rope(model_t *m);
int model_kv_layers(const model_t *m);     /* layers with a slice of the KV cache (an attention block) */
void rope_frequencies(const model_config_t *c, double theta, int llama3, double *freqs);   /* (head_dim/2) */

/* ---- LoRA adapters (lora.c) ----
 * An adapter adds scale * B (A x) to the output of some of a layer's matmuls, for the tokens of the sequences
 * that use it: A (rank, in) and B (out, rank) in f32, beside the base weights, never merged into them. Its
 * matrices by (layer, target); a target the adapter leaves alone has a = NULL. */
enum { LORA_Q, LORA_K, LORA_V, LORA_O, LORA_GATE, LORA_UP, LORA_DOWN, LORA_TARGETS };
typedef struct {
    const float *a;                    /* A (rank, in), or NULL */
    const float *bt;                   /* B transposed: (rank, out) */
    int rank, out;
    float scale;                       /* the adapter's own: alpha / rank */
} lora_matrix_t;
typedef struct {
    int n_layers;
    int max_rank;                      /* the largest rank of its matrices */
    const lora_matrix_t *m;            /* (n_layers, LORA_TARGETS) */
} lora_adapter_t;

/* A flat batch: tokens of several sequences, prefill chunks and decode tokens mixed. */
typedef struct {
    int num_tokens, num_seqs;
    const int32_t *token_ids;          /* (num_tokens) */
    const int32_t *positions;          /* (num_tokens) */
    const int32_t *seq_of_token;       /* (num_tokens) -> sequence index */
    const int32_t *block_tables;       /* (num_seqs, max_blocks_per_seq) */
    int max_blocks_per_seq;
    int num_out;                       /* rows that produce logits */
    const int32_t *out_rows;           /* (num_out) token index of each logits row, ascending */
    const int32_t *sample_mask;        /* (num_out) 1: sample this row */
    const sample_params_t *params;     /* (num_out) */
    const int32_t *history;            /* (num_history) flat token history for penalties */
    const int32_t *bias_ids;           /* (num_bias) flat logit-bias entries */
    const float *bias_values;          /* (num_bias) */
    int64_t num_history, num_bias;
    const uint32_t *token_masks;       /* (num_masks, (vocab + 31) / 32) allowed-token bitmasks, or NULL */
    int num_masks;
    float *logits_out;                 /* (num_out, vocab) or NULL: raw logits copied here */
    sample_out_t *samples;             /* (num_out) */
    float *hidden_out;                 /* (n_layers + 1, num_tokens, dim) or NULL: for tests */
    float *final_out;                  /* (num_tokens, dim) or NULL: every row after the final norm (a chat
                                        * model's embeddings: pooled by the caller) */
    /* LoRA: each sequence's adapter (an index into loras, -1 for none) and the request's scale of it; NULL
     * lora_of_seq: no sequence has one */
    const lora_adapter_t *loras;       /* (num_loras) */
    int num_loras;
    const int32_t *lora_of_seq;        /* (num_seqs) */
    const float *lora_scale_of_seq;    /* (num_seqs) */
    const int32_t *state_slots;        /* (num_seqs) each sequence's recurrent-state slot; NULL for a model without
                                        * recurrent blocks. A sequence's tokens in the batch are consecutive
                                        * positions; its first is 0 (the slot starts empty) or the slot's next. */
} batch_t;

/* stages of a step, for the optional profile (a recurrent block's matmuls apart from attention's) */
enum { STAGE_EMBED, STAGE_NORM_QUANT, STAGE_QKV, STAGE_ROPE_KV, STAGE_ATTENTION, STAGE_WO, STAGE_GATE_UP_SWIGLU,
       STAGE_DOWN, STAGE_OUTPUT, STAGE_SAMPLE, STAGE_ROUTE, STAGE_LORA, STAGE_RECURRENT, STAGE_RECURRENT_IN,
       STAGE_RECURRENT_CONV, STAGE_RECURRENT_OUT, NUM_STAGES };

typedef struct {
    const model_t *model;
    pool_t *pool;
    int profile_on;
    double profile[NUM_STAGES];        /* seconds per stage, summed over steps while profile_on */
    int max_tokens, max_out;
    int num_kv_blocks;
    uint16_t *k_cache, *v_cache;       /* (model_kv_layers, num_kv_blocks, n_kv_heads, KV_BLOCK, head_dim) f16; K's last two
                                        * axes transposed (kv_store_key) */
    int kv_dtype;                      /* KV_F16, KV_BF16: k_cache/v_cache; KV_Q8_0: k_q8/v_q8 (the others NULL) */
    uint8_t *k_q8, *v_q8;              /* (model_kv_layers, num_kv_blocks, n_kv_heads, kvq8_slice_bytes(head_dim)) */
    /* scratch, allocated once */
    float *x;                          /* (max_tokens, dim) residual stream */
    float *xn;                         /* (max_tokens, max(dim, q_dim)) attention output; normed input of float weights */
    float *norm_rows;                  /* (threads, dim) a token's normed row on its way to quantization */
    float *qkv;                        /* (max_tokens, q_dim + 2 kv_dim) */
    float *gu;                         /* (threads, max_tokens, 64): gate and up of 32 hidden units */
    float *h;                          /* (max_tokens, hidden) */
    float *y;                          /* (max_tokens, dim) a sublayer's output before its post-norm, or NULL */
    block_q8x *xq;                     /* (max_tokens, max(dim, q_dim) / 32) the matmuls' quantized input */
    block_q8x *xq_h;                   /* (max_tokens, hidden / 32) h quantized, for the down projection */
    float *logits;                     /* (max_out, vocab) */
    float *attn_scratch;               /* (threads, attention_scratch_floats) */
    float *attn_parts;                 /* (4 threads, n_kv_heads, attn_max_segments) parts of a decode step split by
                                        * key segments, each attention_part_floats(group, head_dim) */
    int *attn_pending;                 /* (2 threads, n_kv_heads) segments of a (run, head) not yet done */
    int attn_max_segments;
    int32_t *runs;                     /* (max_tokens + 1) first token of each attention run, then num_tokens */
    void *sample_scratch;              /* (threads, vocab * 8 bytes) */
    kernel_config_t kernels;           /* this context's matmul kernel settings */
    struct moe_scratch *moe;           /* the mixtures of experts' buffers (block_moe.c), or NULL for a dense model */
    float *lora_ax;                    /* (max_tokens, 3 lora_rank) A x of up to three adapter matrices per token */
    int lora_rank;                     /* the largest adapter rank lora_ax holds (context_reserve_lora) */
    float *attn_gate;                  /* (max_tokens, q_dim) the attention output gate's logits, or NULL */
    /* recurrent blocks (block_gdn.c), NULL without them */
    int num_state_slots;
    float *state;                      /* (num_state_slots, model->state_floats) each sequence's state */
    int32_t *state_pos;                /* (num_state_slots) the next position each slot expects */
    int32_t *seq_first;                /* (max_tokens + 1) the step's first token of each sequence, then num_tokens */
    float *gdn_in;                     /* (max_tokens, conv_dim + value_dim) Win xn, its qkv part convolved in place */
    float *gdn_ba;                     /* (max_tokens, 2 n_v_heads) */
    float *gdn_out;                    /* (max_tokens, value_dim) the gated norm's output, Wout's input */
    block_q8x *gdn_xq;                 /* (max_tokens, value_dim / 32) the same quantized */
    float *gdn_scratch;                /* (threads, 2 head_k + 2 head_v) a head's normed q and k, o, normed o */
} context_t;

context_t *context_create(const model_t *m, int max_tokens, int max_out, int num_kv_blocks, int threads);
/* the same with the KV cache in kv_dtype (KV_F16, KV_BF16 or KV_Q8_0); NULL also for a q8_0 cache of
 * head_dim % 32 != 0 */
context_t *context_create_kv(const model_t *m, int max_tokens, int max_out, int num_kv_blocks, int threads,
                             int kv_dtype);
/* the same with num_state_slots recurrent-state slots (a model with recurrent blocks needs at least one) */
context_t *context_create_state(const model_t *m, int max_tokens, int max_out, int num_kv_blocks, int threads,
                                int kv_dtype, int num_state_slots);
void context_free(context_t *c);
/* room for adapters of rank up to max_rank in the context's scratch: 0, or -1 out of memory */
int context_reserve_lora(context_t *c, int max_rank);
/* floats of one recurrent block's state per sequence: the convolution's last inputs and the delta-rule matrices */
size_t gdn_state_floats(const gdn_block_t *G);
/* copies a slot's whole state out of (read) or into (write) the context, with its next position (tests, snapshots) */
int state_slot_read(const context_t *c, int slot, float *out, int32_t *next_pos);
int state_slot_write(context_t *c, int slot, const float *in, int32_t next_pos);
/* forward()'s result: FORWARD_OK, or the first thing its guard found out of range in the batch. The guard keeps
 * memory safe for any caller; inferd/engine/batch.py validates a step's inputs with messages before this. */
typedef enum {
    FORWARD_OK = 0,
    FORWARD_BAD_SIZE = -1,          /* num_tokens or num_out outside what the context was made for */
    FORWARD_BAD_TOKEN = -2,         /* a token id outside the vocabulary */
    FORWARD_BAD_POSITION = -3,      /* a position outside the context or the sequence's block table */
    FORWARD_BAD_SEQUENCE = -4,      /* a sequence index outside num_seqs */
    FORWARD_BAD_BLOCK = -5,         /* a KV block id outside the cache */
    FORWARD_BAD_OUT_ROW = -6,       /* a logits row that is not a token of the batch */
    FORWARD_BAD_SAMPLE_PARAMS = -7, /* a history or logit-bias range outside its array, or too many top logprobs */
    FORWARD_BAD_MASK_ROW = -8,      /* a sampled row's mask_row past num_masks (token_masks given) */
    FORWARD_BAD_BLOCK_KIND = -9,    /* a layer holds a block kind this build does not run */
    FORWARD_BAD_LORA = -10,         /* a sequence's adapter outside loras, of another model, or of a rank not reserved */
    FORWARD_BAD_STATE = -11,        /* a recurrent model's sequence without a slot, or not continuing its slot */
} forward_status_t;
int forward(context_t *c, const batch_t *b);

/* One KV block's image (every layer's K slab, then V slab, in the pool's format: kv_block_io.c) copied out of the
 * cache or into it; a block id outside the cache or a buffer of another length is refused, nothing copied. */
enum { KV_IO_OK = 0, KV_IO_BAD_BLOCK = -1, KV_IO_BAD_LENGTH = -2 };
size_t kv_block_bytes(const context_t *c);
int kv_block_read(const context_t *c, int block, uint8_t *out, size_t out_len);
int kv_block_write(context_t *c, int block, const uint8_t *in, size_t in_len);
int kv_block_copy(context_t *c, int src, int dst);

#endif
