/* Attention over the paged f16 KV cache for a run of consecutive tokens of one sequence and the query heads of
 * adjacent KV heads: causal or not, over all keys or a sliding window of them (attn_span_t), as small GEMMs.
 *
 * The cache keeps each block's keys transposed, (head_dim, 64) per KV head: a vector load takes eight keys' values
 * of one dimension. Per block and KV head, the needed keys and values are converted from f16 once into f32 tiles,
 * then every query row of the run (token x query head of that KV head) meets them in register tiles of up to six
 * rows: Q.K^T as rows x 16 keys of fma chains over the head dimension (keys in lanes, no horizontal sums), P.V as
 * rows x 16 dimensions of fma chains over the keys. Online softmax per 64-key block as before.
 *
 * Fixed arithmetic, whoever shares the tile and whichever path runs it:
 *   - a score is one fma chain over d = 0..head_dim-1 from 0, then times the scale;
 *   - a row's block max and exp-sum run over its own keys in max_of/weights' lane order;
 *   - an output element adds p[j] * v[j] key after key (keys other rows of the tile see, but not this one, carry
 *     weight exactly 0 and leave it unchanged);
 *   - keys are taken in segments of ATTN_SEGMENT_BLOCKS blocks, each with a softmax state of its own from scratch,
 *     merged into the total in segment order (attention_merge_rows). A decode step can thus split one long
 *     sequence's keys across threads (attention_segment, then attention_merge) and get the very bits a prefill of
 *     the same tokens gets.
 * The scalar, AVX2 and AVX-512 variants do exactly those operations, so all give the same bits.
 * Over the bf16 cache (span->bf16) the run, its blocks, segments and softmax are these, and the tiles' scores and
 * weighted sums attention_bf16.c's, on its slices as they lie. */
#include <math.h>
#include <string.h>
#include "inferd.h"
#include "vecmath.h"
#include "softmax.h"
#include "attention_tile.h"

static inline float kv_at(const tile_t *t, const void *p, size_t i) {
    return t->f16 ? f16_to_f32(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

/* ---------------- scalar ---------------- */

/* kt (hd, KV_BLOCK) f32 <- the cache's (hd, KV_BLOCK) f16 keys, columns [c0, c1) */
static void convert_k_scalar(const uint16_t *k, float *kt, int hd, int c0, int c1) {
    for (int d = 0; d < hd; d++)
        for (int j = c0; j < c1; j++) kt[d * KV_BLOCK + j] = f16_to_f32(k[d * KV_BLOCK + j]);
}

/* vf (KV_BLOCK, hd) f32 <- rows [r0, r1) of the cache's (KV_BLOCK, hd) f16 values */
static void convert_v_scalar(const uint16_t *v, float *vf, int hd, int r0, int r1) {
    for (size_t i = (size_t)r0 * hd; i < (size_t)r1 * hd; i++) vf[i] = f16_to_f32(v[i]);
}

/* s[r][j] = scale * (fma chain over d of q_r[d] * k_j[d]) for keys [j0, j1) */
static void scores_scalar(const tile_t *t, int hd, float scale) {
    for (int r = 0; r < t->nr; r++)
        for (int j = t->j0; j < t->j1; j++) {
            float a = 0.0f;
            for (int d = 0; d < hd; d++) a = __builtin_fmaf(t->q[r][d], kv_at(t, t->k, d * KV_BLOCK + j), a);
            t->s[r][j] = a * scale;
        }
}

/* o_r[d] += p_r[j] * v_j[d], key after key over [j0, j1) */
static void accumulate_v_scalar(const tile_t *t, int hd) {
    for (int r = 0; r < t->nr; r++)
        for (int d = 0; d < hd; d++) {
            float o = t->o[r][d];
            for (int j = t->j0; j < t->j1; j++) o = __builtin_fmaf(t->s[r][j], kv_at(t, t->v, (size_t)j * hd + d), o);
            t->o[r][d] = o;
        }
}

/* ---------------- AVX2 ---------------- */
#if defined(__x86_64__)
#define ATTN_AVX2 __attribute__((target("avx2,fma,f16c")))
#define ATTN_AVX2_INLINE ATTN_AVX2 static inline __attribute__((always_inline))

/* Both converters fetch the same lines of the next block (`next`, or NULL) as they go: the cache is read block
 * after block through the block table, which the hardware prefetcher cannot follow. */
ATTN_AVX2 static void convert_k_avx2(const uint16_t *k, float *kt, int hd, int c0, int c1, const uint16_t *next) {
    for (int d = 0; d < hd; d++) {
        if (next) {                                   /* a dimension's 64 keys: two lines */
            __builtin_prefetch(next + d * KV_BLOCK, 0, 2);
            __builtin_prefetch(next + d * KV_BLOCK + 32, 0, 2);
        }
        for (int j = c0; j < c1; j += 8)
            _mm256_storeu_ps(kt + d * KV_BLOCK + j,
                             _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(k + d * KV_BLOCK + j))));
    }
}

ATTN_AVX2 static void convert_v_avx2(const uint16_t *v, float *vf, int hd, int r0, int r1, const uint16_t *next) {
    for (size_t i = (size_t)r0 * hd; i < (size_t)r1 * hd; i += 8) {
        if (next && i % 32 == 0) __builtin_prefetch(next + i, 0, 2);
        _mm256_storeu_ps(vf + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(v + i))));
    }
}

/* NR rows x NC vectors of 8 keys at j: each key vector loaded once per dimension meets every row's broadcast
 * query value; 12 accumulators at most, so everything stays in AVX2's 16 registers. */
ATTN_AVX2_INLINE __m256 load8(const void *p, size_t i, const int F16) {
    if (F16) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + i)));
    return _mm256_loadu_ps((const float *)p + i);
}

/* the next block's dimension d of K (64 keys: two lines), or its value row j */
static inline void fetch_k_row(const tile_t *t, int d) {
    if (t->pf_k) { __builtin_prefetch(t->pf_k + d * KV_BLOCK, 0, 2); __builtin_prefetch(t->pf_k + d * KV_BLOCK + 32, 0, 2); }
}

static inline void fetch_v_row(const tile_t *t, int j, int hd) {
    if (t->pf_v)
        for (int i = 0; i < hd; i += 32) __builtin_prefetch(t->pf_v + (size_t)j * hd + i, 0, 2);
}

ATTN_AVX2_INLINE void score_block(const tile_t *t, int hd, int j, __m256 scale, const int NR, const int NC,
                                  const int F16) {
    __m256 a[ROW_TILE][4];
    for (int r = 0; r < NR; r++)
        for (int c = 0; c < NC; c++) a[r][c] = _mm256_setzero_ps();
    for (int d = 0; d < hd; d++) {
        if (F16 && j < 8) fetch_k_row(t, d);
        __m256 k[4];
        for (int c = 0; c < NC; c++) k[c] = load8(t->k, d * KV_BLOCK + j + 8 * c, F16);
        for (int r = 0; r < NR; r++) {
            __m256 qd = _mm256_broadcast_ss(t->q[r] + d);
            for (int c = 0; c < NC; c++) a[r][c] = _mm256_fmadd_ps(qd, k[c], a[r][c]);
        }
    }
    for (int r = 0; r < NR; r++)
        for (int c = 0; c < NC; c++) _mm256_storeu_ps(t->s[r] + j + 8 * c, _mm256_mul_ps(a[r][c], scale));
}

/* Vectors of 8 keys a score block of NR rows carries, and of 8 dimensions a value pass does: as many as leave the
 * NR x that accumulators and the registers beside them within AVX2's 16. A decode step's rows are its query heads of
 * one KV head (a few), whose fma chains would otherwise wait on each other's latency. 4-6 rows keep 2 (12 chains):
 * 24 keys for 4 rows measured no faster, and hoisted broadcasts for them spill (bench/results/attention_gemm.md). */
#define SCORE_VECTORS(NR) ((NR) <= 2 ? 4 : (NR) == 3 ? 3 : 2)
#define VALUE_VECTORS(NR) ((NR) <= 3 ? 4 : 2)

/* Keys [j0, j1) rounded out to whole vectors of 8 (16 for AVX-512): the extra scores are never read (max_of and
 * weights stop at each row's own count; the f32 tile holds the keys [j0, j1) rounded out to 16). */
ATTN_AVX2_INLINE void scores_nr(const tile_t *t, int hd, float scale, const int NR, const int F16) {
    __m256 vs = _mm256_set1_ps(scale);
    const int NC = SCORE_VECTORS(NR);
    int j = t->j0 & ~7, end = (t->j1 + 7) & ~7;
    for (; j + 8 * NC <= end; j += 8 * NC) score_block(t, hd, j, vs, NR, NC, F16);
    for (; j + 16 <= end; j += 16) score_block(t, hd, j, vs, NR, 2, F16);
    if (j < end) score_block(t, hd, j, vs, NR, 1, F16);
}

/* fn(..., NR, F16) for the tile's row count and source */
#define BY_ROWS(fn, t, ...)                                                                                        \
    do {                                                                                                           \
        if ((t)->f16) switch ((t)->nr) {                                                                           \
            case 1: fn(__VA_ARGS__, 1, 1); break;  case 2: fn(__VA_ARGS__, 2, 1); break;                           \
            case 3: fn(__VA_ARGS__, 3, 1); break;  case 4: fn(__VA_ARGS__, 4, 1); break;                           \
            case 5: fn(__VA_ARGS__, 5, 1); break;  default: fn(__VA_ARGS__, 6, 1); break;                          \
            }                                                                                                      \
        else switch ((t)->nr) {                                                                                    \
            case 1: fn(__VA_ARGS__, 1, 0); break;  case 2: fn(__VA_ARGS__, 2, 0); break;                           \
            case 3: fn(__VA_ARGS__, 3, 0); break;  case 4: fn(__VA_ARGS__, 4, 0); break;                           \
            case 5: fn(__VA_ARGS__, 5, 0); break;  default: fn(__VA_ARGS__, 6, 0); break;                          \
            }                                                                                                      \
    } while (0)

ATTN_AVX2 static void scores_avx2(const tile_t *t, int hd, float scale) { BY_ROWS(scores_nr, t, t, hd, scale); }

/* NV x 8 output values of every row at a time, kept in registers across the tile's keys */
ATTN_AVX2_INLINE void accumulate_v_pass(const tile_t *t, int hd, int d, const int NR, const int NV, const int F16) {
    __m256 o[ROW_TILE][4];
    for (int r = 0; r < NR; r++)
        for (int c = 0; c < NV; c++) o[r][c] = _mm256_loadu_ps(t->o[r] + d + 8 * c);
    for (int j = t->j0; j < t->j1; j++) {
        if (F16 && d == 0) fetch_v_row(t, j, hd);
        if (NV == 2) {   /* up to 6 rows: both value vectors, then each row's weight (12 + 2 + 1 registers) */
            __m256 v0 = load8(t->v, (size_t)j * hd + d, F16), v1 = load8(t->v, (size_t)j * hd + d + 8, F16);
            for (int r = 0; r < NR; r++) {
                __m256 p = _mm256_broadcast_ss(t->s[r] + j);
                o[r][0] = _mm256_fmadd_ps(p, v0, o[r][0]);
                o[r][1] = _mm256_fmadd_ps(p, v1, o[r][1]);
            }
        } else {         /* up to 3 rows: their weights, then the value vectors one at a time (12 + 3 + 1) */
            __m256 p[ROW_TILE];
            for (int r = 0; r < NR; r++) p[r] = _mm256_broadcast_ss(t->s[r] + j);
            for (int c = 0; c < NV; c++) {
                __m256 v = load8(t->v, (size_t)j * hd + d + 8 * c, F16);
                for (int r = 0; r < NR; r++) o[r][c] = _mm256_fmadd_ps(p[r], v, o[r][c]);
            }
        }
    }
    for (int r = 0; r < NR; r++)
        for (int c = 0; c < NV; c++) _mm256_storeu_ps(t->o[r] + d + 8 * c, o[r][c]);
}

ATTN_AVX2_INLINE void accumulate_v_nr(const tile_t *t, int hd, const int NR, const int F16) {
    const int NV = VALUE_VECTORS(NR);
    int d = 0;
    for (; d + 8 * NV <= hd; d += 8 * NV) accumulate_v_pass(t, hd, d, NR, NV, F16);
    for (; d < hd; d += 16) accumulate_v_pass(t, hd, d, NR, 2, F16);
}

ATTN_AVX2 static void accumulate_v_avx2(const tile_t *t, int hd) { BY_ROWS(accumulate_v_nr, t, t, hd); }

#endif

/* ---------------- AVX-512: the same tiles with 16 lanes ---------------- */
#if defined(__x86_64__)
#define ATTN_AVX512 __attribute__((target("avx512f,avx512vl,avx512dq,avx2,fma,f16c")))
#define ATTN_AVX512_INLINE ATTN_AVX512 static inline __attribute__((always_inline))

/* NR rows x NC vectors of 16 keys at j: 24 accumulators at most of the 32 registers */
ATTN_AVX512_INLINE __m512 load16(const void *p, size_t i, const int F16) {
    if (F16) return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)p + i)));
    return _mm512_loadu_ps((const float *)p + i);
}

ATTN_AVX512_INLINE void score_block16(const tile_t *t, int hd, int j, __m512 scale, const int NR, const int NC,
                                      const int F16) {
    __m512 a[ROW_TILE][4];
    for (int r = 0; r < NR; r++)
        for (int c = 0; c < NC; c++) a[r][c] = _mm512_setzero_ps();
    for (int d = 0; d < hd; d++) {
        __m512 k[4];
        if (F16) fetch_k_row(t, d);
        for (int c = 0; c < NC; c++) k[c] = load16(t->k, d * KV_BLOCK + j + 16 * c, F16);
        for (int r = 0; r < NR; r++) {
            __m512 qd = _mm512_set1_ps(t->q[r][d]);
            for (int c = 0; c < NC; c++) a[r][c] = _mm512_fmadd_ps(qd, k[c], a[r][c]);
        }
    }
    for (int r = 0; r < NR; r++)
        for (int c = 0; c < NC; c++) _mm512_storeu_ps(t->s[r] + j + 16 * c, _mm512_mul_ps(a[r][c], scale));
}

ATTN_AVX512_INLINE void scores16_nr(const tile_t *t, int hd, float scale, const int NR, const int F16) {
    __m512 vs = _mm512_set1_ps(scale);
    int j = t->j0 & ~15, vectors = (((t->j1 + 15) & ~15) - j) / 16;
    switch (vectors) {
    case 1: score_block16(t, hd, j, vs, NR, 1, F16); break;
    case 2: score_block16(t, hd, j, vs, NR, 2, F16); break;
    case 3: score_block16(t, hd, j, vs, NR, 3, F16); break;
    case 4: score_block16(t, hd, j, vs, NR, 4, F16); break;
    default: break;
    }
}

ATTN_AVX512 static void scores_avx512(const tile_t *t, int hd, float scale) { BY_ROWS(scores16_nr, t, t, hd, scale); }

/* 64 output values of every row at a time (a whole head of 64), in registers across the tile's keys */
ATTN_AVX512_INLINE void accumulate16_nr(const tile_t *t, int hd, const int NR, const int F16) {
    for (int d = 0; d < hd; d += 64) {
        __m512 o[ROW_TILE][4];
        for (int r = 0; r < NR; r++)
            for (int c = 0; c < 4; c++) o[r][c] = _mm512_loadu_ps(t->o[r] + d + 16 * c);
        for (int j = t->j0; j < t->j1; j++) {
            __m512 v[4];
            if (F16 && d == 0) fetch_v_row(t, j, hd);
            for (int c = 0; c < 4; c++) v[c] = load16(t->v, (size_t)j * hd + d + 16 * c, F16);
            for (int r = 0; r < NR; r++) {
                __m512 p = _mm512_set1_ps(t->s[r][j]);
                for (int c = 0; c < 4; c++) o[r][c] = _mm512_fmadd_ps(p, v[c], o[r][c]);
            }
        }
        for (int r = 0; r < NR; r++)
            for (int c = 0; c < 4; c++) _mm512_storeu_ps(t->o[r] + d + 16 * c, o[r][c]);
    }
}

ATTN_AVX512 static void accumulate_v_avx512(const tile_t *t, int hd) { BY_ROWS(accumulate16_nr, t, t, hd); }
#endif

/* ---------------- merging a segment's output into the total ---------------- */

/* O[d] = fma(o[d], b, O[d] * a): the same two roundings per element on every path */
static void merge_cols_scalar(float *O, const float *o, float a, float b, int hd) {
    for (int d = 0; d < hd; d++) O[d] = __builtin_fmaf(o[d], b, O[d] * a);
}

#if defined(__x86_64__)
ATTN_AVX2 static void merge_cols_avx2(float *O, const float *o, float a, float b, int hd) {
    __m256 va = _mm256_set1_ps(a), vb = _mm256_set1_ps(b);
    int d = 0;
    for (; d + 8 <= hd; d += 8) {
        __m256 kept = _mm256_mul_ps(_mm256_loadu_ps(O + d), va);
        _mm256_storeu_ps(O + d, _mm256_fmadd_ps(_mm256_loadu_ps(o + d), vb, kept));
    }
    for (; d < hd; d++) O[d] = __builtin_fmaf(o[d], b, O[d] * a);
}
#endif

/* ---------------- the kernels of the active path ---------------- */

static void convert_k_plain(const uint16_t *k, float *kt, int hd, int c0, int c1, const uint16_t *next) {
    (void)next;
    convert_k_scalar(k, kt, hd, c0, c1);
}

static void convert_v_plain(const uint16_t *v, float *vf, int hd, int r0, int r1, const uint16_t *next) {
    (void)next;
    convert_v_scalar(v, vf, hd, r0, r1);
}

static kernels_t active_kernels(int bf16) {
    kernels_t k = {convert_k_plain, convert_v_plain, scores_scalar, accumulate_v_scalar, max_scalar,
                   weights_scalar, merge_cols_scalar, 0};
#if defined(__x86_64__)
    if (cpu_path() != PATH_SCALAR)
        k = (kernels_t){convert_k_avx2, convert_v_avx2, scores_avx2, accumulate_v_avx2, max_avx2, weights_avx2,
                        merge_cols_avx2, 1};
    /* the VNNI paths' CPUs with AVX-512F: tiles of 16 lanes (two FMA units of 512 bits on server parts) */
    if (cpu_path() >= PATH_AVX512VNNI && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq")) {
        k.scores = scores_avx512;
        k.accumulate_v = accumulate_v_avx512;
        k.weights = weights_avx512;
    }
#endif
    if (bf16) attention_bf16_kernels(&k);
    return k;
}

/* ---------------- the cache's key layout ---------------- */

/* converted in one go (store_f16's SIMD conversion, the same bits), then scattered down the slot's column */
void kv_store_key(const float *k, uint16_t *block_slice, int slot, int head_dim) {
    uint16_t h[512];   /* head_dim <= 512 (model_init_rope checks it) */
    store_f16(k, h, head_dim);
    for (int d = 0; d < head_dim; d++) block_slice[(size_t)d * KV_BLOCK + slot] = h[d];
}

/* ---------------- the run ---------------- */

/* rows of a run: at most ATTN_MAX_TOKENS * n_heads; per row a scores row, a segment's max and sum, the running
 * total's max and sum, and a segment output; then one KV head's f32 K and V tiles; then (bf16 cache) each row's
 * query in bf16 pairs */
size_t attention_scratch_floats(int n_heads, int head_dim) {
    size_t rows = (size_t)ATTN_MAX_TOKENS * n_heads;
    return rows * (KV_BLOCK + 4 + head_dim + head_dim / 2) + 2 * (size_t)KV_BLOCK * head_dim;
}

int attention_num_segments(const attn_span_t *span, int ntok) {
    int hi = span_hi(span, ntok - 1);
    return (hi + ATTN_SEGMENT_BLOCKS * KV_BLOCK - 1) / (ATTN_SEGMENT_BLOCKS * KV_BLOCK);
}

/* What one call works on. Row r: KV head r / per_head, then token (r % per_head) / group, query head r % group. */
typedef struct {
    const float *q;
    int q_stride, ntok, group, kv_heads, head_dim, per_head, rows;
    const uint16_t *k_head, *v_head;
    const int32_t *block_table;
    const attn_span_t *span;
    size_t block_stride;
    float *s, *kt, *vf;                     /* scratch: scores (rows, KV_BLOCK); K and V f32 tiles of one head */
    uint32_t *qp;                           /* bf16 cache: the rows' queries in pairs (rows, head_dim / 2) */
    int lo[ATTN_MAX_TOKENS], hi[ATTN_MAX_TOKENS];
    kernels_t kern;
} run_t;

static void run_init(run_t *a, const float *q, int q_stride, int ntok, int group, int n_kv_heads, int kv_heads,
                     int head_dim, const uint16_t *k_head, const uint16_t *v_head, const int32_t *block_table,
                     const attn_span_t *span, float *scratch) {
    memset(a, 0, sizeof *a);
    a->q = q; a->q_stride = q_stride; a->ntok = ntok; a->group = group; a->kv_heads = kv_heads;
    a->head_dim = head_dim; a->per_head = ntok * group; a->rows = a->per_head * kv_heads;
    a->k_head = k_head; a->v_head = v_head; a->block_table = block_table; a->span = span;
    a->block_stride = (size_t)n_kv_heads * KV_BLOCK * head_dim;
    size_t rows_max = (size_t)ATTN_MAX_TOKENS * group * kv_heads;
    a->s = scratch;
    a->kt = scratch + rows_max * (KV_BLOCK + 4 + head_dim);
    a->vf = a->kt + (size_t)KV_BLOCK * head_dim;
    for (int t = 0; t < ntok; t++) { a->lo[t] = span_lo(span, t); a->hi[t] = span_hi(span, t); }
    a->kern = active_kernels(span->bf16);
    if (span->bf16) {
        a->qp = (uint32_t *)(a->vf + (size_t)KV_BLOCK * head_dim);
        for (int r = 0; r < a->rows; r++) {
            int t = (r % a->per_head) / group, qh = r / a->per_head * group + r % group;
            attention_bf16_pairs(q + (size_t)t * q_stride + (size_t)qh * head_dim, a->qp + (size_t)r * (head_dim / 2),
                                 head_dim);
        }
    }
}

/* One segment's softmax state for every row, from scratch: over the blocks [b0, b1) (those of the segment that
 * the run sees), row r's maximum mx[r], weight sum sm[r] and unnormalized output o + r * head_dim.
 * The blocks are the outer loop: a block's K (then V) slices of adjacent KV heads lie side by side in the cache,
 * so each block is read as one contiguous piece. next_k/next_v: fetched during the last block, or NULL. */
static void attend_segment(run_t *a, int b0, int b1, float *o, float *mx, float *sm, const uint16_t *next_k,
                           const uint16_t *next_v) {
    int hd = a->head_dim;
    size_t slice = (size_t)KV_BLOCK * hd;
    for (int r = 0; r < a->rows; r++) { mx[r] = -INFINITY; sm[r] = 0.0f; }
    memset(o, 0, (size_t)a->rows * hd * sizeof(float));
    for (int blk = b0; blk < b1; blk++) {
        int base = blk * KV_BLOCK;
        const uint16_t *kb = a->k_head + (size_t)a->block_table[blk] * a->block_stride;
        const uint16_t *vb = a->v_head + (size_t)a->block_table[blk] * a->block_stride;
        const uint16_t *nk = next_k, *nv = next_v;
        if (blk + 1 < b1) {
            nk = a->k_head + (size_t)a->block_table[blk + 1] * a->block_stride;
            nv = a->v_head + (size_t)a->block_table[blk + 1] * a->block_stride;
        }
        /* the tokens [t0, t1) see some of this block: keys [first of t0, n of t1 - 1) */
        int t0 = 0, t1 = a->ntok;
        while (t0 < a->ntok && a->hi[t0] <= base) t0++;
        while (t1 > t0 && a->lo[t1 - 1] >= base + KV_BLOCK) t1--;
        if (t0 == t1) continue;
        int j_lo = a->lo[t0] > base ? a->lo[t0] - base : 0;
        int j_hi = a->hi[t1 - 1] - base < KV_BLOCK ? a->hi[t1 - 1] - base : KV_BLOCK;
        /* a head of one tile (decode) reads the cache directly; several convert K and V once for all tiles (the
         * bf16 cache's tiles are its slices as they lie) */
        int direct = a->qp || ((t1 - t0) * a->group <= ROW_TILE && a->kern.direct);
        for (int h = 0; h < a->kv_heads; h++) {
            const uint16_t *kh = kb + h * slice, *vh = vb + h * slice;
            if (!direct) {
                a->kern.convert_k(kh, a->kt, hd, j_lo & ~15, (j_hi + 15) & ~15, nk ? nk + h * slice : NULL);
                a->kern.convert_v(vh, a->vf, hd, j_lo, j_hi, nv ? nv + h * slice : NULL);
            }
            int r_first = h * a->per_head + t0 * a->group, r_end = h * a->per_head + t1 * a->group;
            for (int r0 = r_first; r0 < r_end; r0 += ROW_TILE) {
                int fetch = direct && r0 == r_first;   /* the next block, by the head's first tile */
                tile_t tile = {.nr = r_end - r0 < ROW_TILE ? r_end - r0 : ROW_TILE, .f16 = direct,
                               .k = direct ? (const void *)kh : a->kt, .v = direct ? (const void *)vh : a->vf,
                               .pf_k = fetch && nk ? nk + h * slice : NULL,
                               .pf_v = fetch && nv ? nv + h * slice : NULL};
                int first[ROW_TILE], n[ROW_TILE];
                for (int i = 0; i < tile.nr; i++) {
                    int r = r0 + i, t = (r - h * a->per_head) / a->group, qh = h * a->group + r % a->group;
                    tile.q[i] = a->q + (size_t)t * a->q_stride + (size_t)qh * hd;
                    tile.qp[i] = a->qp ? a->qp + (size_t)r * (hd / 2) : NULL;
                    tile.s[i] = a->s + (size_t)r * KV_BLOCK;
                    tile.o[i] = o + (size_t)r * hd;
                    n[i] = a->hi[t] - base < KV_BLOCK ? a->hi[t] - base : KV_BLOCK;
                    first[i] = a->lo[t] > base ? a->lo[t] - base : 0;
                }
                tile.j0 = first[0];
                tile.j1 = n[tile.nr - 1];
                a->kern.scores(&tile, hd, a->span->scale);
                for (int i = 0; i < tile.nr; i++) {
                    int r = r0 + i;
                    float *si = tile.s[i];
                    for (int j = 0; j < first[i]; j++) si[j] = -INFINITY;   /* before the window: weight 0 */
                    float m = a->kern.max_of(si, n[i]);
                    if (m > mx[r]) {                       /* a new maximum: rescale what was summed so far */
                        float corr = mx[r] == -INFINITY ? 0.0f : softmax_weight(mx[r] - m);
                        sm[r] *= corr;
                        for (int d = 0; d < hd; d++) tile.o[i][d] *= corr;
                        if (a->qp) attention_bf16_flush(tile.o[i], hd);
                        mx[r] = m;
                    }
                    sm[r] += a->kern.weights(si, n[i], mx[r]);
                    for (int j = n[i]; j < tile.j1; j++) si[j] = 0.0f;       /* keys later rows see: weight 0 */
                }
                a->kern.accumulate_v(&tile, hd);
            }
        }
    }
}

/* the blocks of segment seg that the run sees: [*b0, *b1), empty when none */
static void segment_blocks(const run_t *a, int seg, int *b0, int *b1) {
    int first = a->lo[0] / KV_BLOCK, end = (a->hi[a->ntok - 1] + KV_BLOCK - 1) / KV_BLOCK;
    int s0 = seg * ATTN_SEGMENT_BLOCKS, s1 = s0 + ATTN_SEGMENT_BLOCKS;
    *b0 = first > s0 ? first : s0;
    *b1 = end < s1 ? end : s1;
}

/* total (M, S, O) <- the merge of the total so far with a segment's (m, s, o), for one row. The first segment the
 * row sees becomes the total as it is. The outputs through the path's merge_cols, the same bits on every path. */
static void merge_row(const kernels_t *k, float *M, float *S, float *O, float m, float s, const float *o, int hd) {
    if (m == -INFINITY) return;                                  /* the row saw nothing of this segment */
    if (*M == -INFINITY) {
        *M = m; *S = s;
        memcpy(O, o, (size_t)hd * sizeof(float));
        return;
    }
    float top = m > *M ? m : *M, a = softmax_weight(*M - top), b = softmax_weight(m - top);
    *S = __builtin_fmaf(s, b, *S * a);
    k->merge_cols(O, o, a, b, hd);
    *M = top;
}

/* the query head of row r (token t, query head qh), and its out row */
static inline int row_head(int per_head, int group, int r) { return r / per_head * group + r % group; }
static inline float *out_row(float *out, int out_stride, int per_head, int group, int hd, int r) {
    int t = (r % per_head) / group, qh = row_head(per_head, group, r);
    return out + (size_t)t * out_stride + (size_t)qh * hd;
}

void attention_tokens(const float *q, int q_stride, int ntok, int group, int n_kv_heads, int kv_heads, int head_dim,
                      const uint16_t *k_head, const uint16_t *v_head, const int32_t *block_table,
                      const attn_span_t *span, float *out, int out_stride, float *scratch,
                      const uint16_t *next_k, const uint16_t *next_v) {
    run_t a;
    run_init(&a, q, q_stride, ntok, group, n_kv_heads, kv_heads, head_dim, k_head, v_head, block_table, span,
             scratch);
    int rows = a.rows, hd = head_dim, nseg = attention_num_segments(span, ntok);
    size_t rows_max = (size_t)ATTN_MAX_TOKENS * group * kv_heads;
    float *mx = a.s + rows_max * KV_BLOCK, *sm = mx + rows_max, *M = sm + rows_max, *S = M + rows_max;
    float *o = S + rows_max;
    for (int r = 0; r < rows; r++) { M[r] = -INFINITY; S[r] = 0.0f; }
    for (int seg = 0; seg < nseg; seg++) {
        int b0, b1;
        segment_blocks(&a, seg, &b0, &b1);
        if (b0 >= b1) continue;
        attend_segment(&a, b0, b1, o, mx, sm, seg + 1 == nseg ? next_k : NULL, seg + 1 == nseg ? next_v : NULL);
        for (int r = 0; r < rows; r++)
            merge_row(&a.kern, &M[r], &S[r], out_row(out, out_stride, a.per_head, group, hd, r), mx[r], sm[r],
                      o + (size_t)r * hd, hd);
    }
    for (int r = 0; r < rows; r++) {
        float inv = softmax_norm(M[r], S[r], span->sinks, row_head(a.per_head, group, r));
        float *dst = out_row(out, out_stride, a.per_head, group, hd, r);
        for (int d = 0; d < hd; d++) dst[d] *= inv;
    }
}

size_t attention_part_floats(int rows, int head_dim) { return (size_t)rows * (head_dim + 2); }

int attention_segment(const float *q, int q_stride, int ntok, int group, int n_kv_heads, int kv_heads, int head_dim,
                      const uint16_t *k_head, const uint16_t *v_head, const int32_t *block_table,
                      const attn_span_t *span, int seg, float *part, float *scratch) {
    run_t a;
    run_init(&a, q, q_stride, ntok, group, n_kv_heads, kv_heads, head_dim, k_head, v_head, block_table, span,
             scratch);
    float *mx = part + (size_t)a.rows * head_dim, *sm = mx + a.rows;
    int b0, b1;
    segment_blocks(&a, seg, &b0, &b1);
    if (b0 >= b1) {
        for (int r = 0; r < a.rows; r++) { mx[r] = -INFINITY; sm[r] = 0.0f; }
        return 0;
    }
    attend_segment(&a, b0, b1, part, mx, sm, NULL, NULL);
    return 1;
}

void attention_merge(const float *parts, size_t part_stride, int nseg, int ntok, int group, int kv_heads,
                     int head_dim, float *out, int out_stride, const float *sinks) {
    int per_head = ntok * group, rows = per_head * kv_heads;
    kernels_t kern = active_kernels(0);   /* the merge is the same over either cache */
    for (int r = 0; r < rows; r++) {
        float M = -INFINITY, S = 0.0f, *dst = out_row(out, out_stride, per_head, group, head_dim, r);
        for (int seg = 0; seg < nseg; seg++) {
            const float *p = parts + seg * part_stride, *mx = p + (size_t)rows * head_dim, *sm = mx + rows;
            merge_row(&kern, &M, &S, dst, mx[r], sm[r], p + (size_t)r * head_dim, head_dim);
        }
        float inv = softmax_norm(M, S, sinks, row_head(per_head, group, r));
        for (int d = 0; d < head_dim; d++) dst[d] *= inv;
    }
}
