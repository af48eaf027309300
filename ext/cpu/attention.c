/* Attention over the paged f16 KV cache for a run of consecutive tokens of one sequence and the query heads of
 * adjacent KV heads: causal or not, over all keys or a sliding window of them (attn_span_t). Online softmax over
 * 64-position blocks in a fixed order, so a token's output is the same whatever else is in the batch.
 *
 * The query rows (token, head) are taken three at a time: each key or value is converted from f16 once per row
 * set, straight from the cache into registers, and meets all three rows there (three rows by four keys of fma
 * chains fill AVX2's 16 registers). Per row the arithmetic is fixed: a score is eight lanes of fma chains over the
 * head dimension summed in hsum8_pairs' order, then scaled; the weights use vecmath's exp; the output adds
 * p[j] * v_j key after key. The scalar and AVX2 variants do exactly those operations, so both give the same bits,
 * and no row's result depends on which other rows share its set. */
#include <math.h>
#include <string.h>
#include "inferd.h"
#include "vecmath.h"

#define ROWS_PER_SET 3

/* Softmax weights below e^-64 of the largest are set to 0: they cannot change a float32 sum that holds a 1, and
 * their products with V would be denormals, which cost a hundred cycles each. */
#define SOFTMAX_CUTOFF -64.0f

static inline float softmax_weight(float x) { return x < SOFTMAX_CUTOFF ? 0.0f : exp_scalar(x); }

/* A row set: up to ROWS_PER_SET query rows, each with its query, its output and how many keys of the current
 * block it sees (n rises with the row index: later tokens of the run see more). */
typedef struct {
    int nr;
    const float *q[ROWS_PER_SET];
    float *out[ROWS_PER_SET];
    float *s[ROWS_PER_SET];           /* scores, then softmax weights, of the current block */
    int n[ROWS_PER_SET];
    int j0;                           /* keys of the block before j0 lie before every row's window: not read */
    const char *next_k, *next_v;      /* bytes [pf_begin, pf_end) of the K and V read after this set's, fetched */
    size_t pf_begin, pf_end;          /* while this set is scored */
} rowset_t;

/* ---------------- scalar ---------------- */

/* s[r][j] = scale * dot(q_r, k_j) for keys [j0, n) of a block (k: (n, hd)) */
static void scores_scalar(const rowset_t *rs, const uint16_t *k, int n, int hd, float scale) {
    for (int r = 0; r < rs->nr; r++)
        for (int j = rs->j0; j < n; j++) {
            float a[8] = {0};
            for (int g = 0; g < hd / 8; g++)
                for (int l = 0; l < 8; l++)
                    a[l] = __builtin_fmaf(rs->q[r][8 * g + l], f16_to_f32(k[(size_t)j * hd + 8 * g + l]), a[l]);
            rs->s[r][j] = hsum8_pairs_scalar(a) * scale;
        }
}

/* the largest of s[0..n), in a fixed order (lane l of full groups of 8 takes s[8i + l], lanes combined pairwise,
 * then the tail), written x > m ? x : m like maxps so both paths agree even on NaN */
static inline float max2(float a, float b) { return a > b ? a : b; }

static float max_scalar(const float *s, int n) {
    float m = -INFINITY;
    int j = 0;
    if (n >= 8) {
        float lanes[8];
        for (int l = 0; l < 8; l++) lanes[l] = s[l];
        for (j = 8; j + 8 <= n; j += 8)
            for (int l = 0; l < 8; l++) lanes[l] = max2(s[j + l], lanes[l]);
        m = max2(max2(max2(lanes[0], lanes[4]), max2(lanes[2], lanes[6])),
                 max2(max2(lanes[1], lanes[5]), max2(lanes[3], lanes[7])));
    }
    for (; j < n; j++) m = max2(s[j], m);
    return m;
}

/* s[j] = exp(s[j] - m); returns their sum, in a fixed order: lane l of full groups of 8 sums s[8i + l], the
 * lanes are combined by hsum8_pairs, then the tail is added in order. */
static float weights_scalar(float *s, int n, float m) {
    float lanes[8] = {0};
    int j = 0;
    for (; j + 8 <= n; j += 8)
        for (int l = 0; l < 8; l++) { s[j + l] = softmax_weight(s[j + l] - m); lanes[l] += s[j + l]; }
    float total = hsum8_pairs_scalar(lanes);
    for (; j < n; j++) { s[j] = softmax_weight(s[j] - m); total += s[j]; }
    return total;
}

/* out_r (hd) += sum_{j0 <= j < n_r} p_r[j] * v_j */
static void accumulate_v_scalar(const rowset_t *rs, const uint16_t *v, int hd) {
    for (int r = 0; r < rs->nr; r++)
        for (int j = rs->j0; j < rs->n[r]; j++)
            for (int i = 0; i < hd; i++)
                rs->out[r][i] = __builtin_fmaf(rs->s[r][j], f16_to_f32(v[(size_t)j * hd + i]), rs->out[r][i]);
}

/* ---------------- AVX2 ---------------- */
#if defined(__x86_64__)
#define ATTN_AVX2 __attribute__((target("avx2,fma,f16c")))

/* Fetch bytes [b0, b1) of the next K and V. The scoring loop spreads its share over its groups of four keys,
 * however few keys it has, so the fetches overlap the arithmetic instead of stalling on a full miss queue, as one
 * burst of a whole block's lines would. */
static inline void prefetch_span(const rowset_t *rs, size_t b0, size_t b1) {
    if (!rs->next_k) return;
    for (size_t b = b0 & ~(size_t)63; b < b1; b += 64) {
        __builtin_prefetch(rs->next_k + b, 0, 2);
        __builtin_prefetch(rs->next_v + b, 0, 2);
    }
}

/* the part of the set's span that group gi of `groups` fetches */
static inline void prefetch_group(const rowset_t *rs, int gi, int groups) {
    size_t len = rs->pf_end - rs->pf_begin;
    prefetch_span(rs, rs->pf_begin + len * gi / groups, rs->pf_begin + len * (gi + 1) / groups);
}

ATTN_AVX2 static inline __m256 load_h8(const uint16_t *h) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)h));
}

/* Four keys at a time against every row of the set: each converted key vector feeds NR fma chains. Inlined with
 * NR constant (1 to ROWS_PER_SET) so the chains live in registers. */
#define ATTN_AVX2_INLINE ATTN_AVX2 static inline __attribute__((always_inline))
ATTN_AVX2_INLINE void scores_nr(const rowset_t *rs, const uint16_t *k, int n, int hd, float scale, const int NR) {
    const __m256 vscale = _mm256_set1_ps(scale);
    int groups = (n - rs->j0) / 4, j = rs->j0;
    for (; j + 4 <= n; j += 4) {
        prefetch_group(rs, (j - rs->j0) / 4, groups);
        __m256 a[ROWS_PER_SET][4];
        for (int r = 0; r < NR; r++)
            for (int c = 0; c < 4; c++) a[r][c] = _mm256_setzero_ps();
        for (int g = 0; g < hd / 8; g++)
            for (int c = 0; c < 4; c++) {
                __m256 kc = load_h8(k + (size_t)(j + c) * hd + 8 * g);
                for (int r = 0; r < NR; r++) a[r][c] = _mm256_fmadd_ps(_mm256_loadu_ps(rs->q[r] + 8 * g), kc, a[r][c]);
            }
        for (int r = 0; r < NR; r++)
            _mm_storeu_ps(rs->s[r] + j, _mm_mul_ps(hsum4x8_pairs(a[r][0], a[r][1], a[r][2], a[r][3]),
                                                   _mm256_castps256_ps128(vscale)));
    }
    if (groups == 0) prefetch_group(rs, 0, 1);
    for (; j < n; j++)
        for (int r = 0; r < NR; r++) {
            __m256 a = _mm256_setzero_ps();
            for (int g = 0; g < hd / 8; g++)
                a = _mm256_fmadd_ps(_mm256_loadu_ps(rs->q[r] + 8 * g), load_h8(k + (size_t)j * hd + 8 * g), a);
            rs->s[r][j] = hsum8_pairs(a) * scale;
        }
}

ATTN_AVX2 static void scores_avx2(const rowset_t *rs, const uint16_t *k, int n, int hd, float scale) {
    switch (rs->nr) {
    case 1: scores_nr(rs, k, n, hd, scale, 1); break;
    case 2: scores_nr(rs, k, n, hd, scale, 2); break;
    default: scores_nr(rs, k, n, hd, scale, 3); break;
    }
}

ATTN_AVX2 static float max_avx2(const float *s, int n) {
    float m = -INFINITY;
    int j = 0;
    if (n >= 8) {
        __m256 lanes = _mm256_loadu_ps(s);
        for (j = 8; j + 8 <= n; j += 8) lanes = _mm256_max_ps(_mm256_loadu_ps(s + j), lanes);
        __m128 h = _mm_max_ps(_mm256_castps256_ps128(lanes), _mm256_extractf128_ps(lanes, 1));  /* l vs l + 4 */
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));                                                     /* 0|4 vs 2|6 */
        m = _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));                                       /* even vs odd */
    }
    for (; j < n; j++) m = max2(s[j], m);
    return m;
}

ATTN_AVX2 static float weights_avx2(float *s, int n, float m) {
    __m256 lanes = _mm256_setzero_ps();
    int j = 0;
    for (; j + 8 <= n; j += 8) {
        __m256 x = _mm256_sub_ps(_mm256_loadu_ps(s + j), _mm256_set1_ps(m));
        __m256 keep = _mm256_cmp_ps(x, _mm256_set1_ps(SOFTMAX_CUTOFF), _CMP_GE_OQ);
        __m256 w = _mm256_and_ps(exp8(x), keep);
        _mm256_storeu_ps(s + j, w);
        lanes = _mm256_add_ps(lanes, w);
    }
    float total = hsum8_pairs(lanes);
    for (; j < n; j++) { s[j] = softmax_weight(s[j] - m); total += s[j]; }
    return total;
}

/* 16 output values of every row at a time, kept in registers across the keys all rows see; the few keys only
 * the later rows see are added row by row afterwards (the same fma per element, in key order). */
ATTN_AVX2_INLINE void accumulate_v_nr(const rowset_t *rs, const uint16_t *v, int hd, const int NR) {
    int common = rs->n[0];
    for (int d = 0; d < hd; d += 16) {
        __m256 o[ROWS_PER_SET][2];
        for (int r = 0; r < NR; r++) {
            o[r][0] = _mm256_loadu_ps(rs->out[r] + d);
            o[r][1] = _mm256_loadu_ps(rs->out[r] + d + 8);
        }
        for (int j = rs->j0; j < common; j++) {
            __m256 v0 = load_h8(v + (size_t)j * hd + d), v1 = load_h8(v + (size_t)j * hd + d + 8);
            for (int r = 0; r < NR; r++) {
                __m256 p = _mm256_broadcast_ss(rs->s[r] + j);
                o[r][0] = _mm256_fmadd_ps(p, v0, o[r][0]);
                o[r][1] = _mm256_fmadd_ps(p, v1, o[r][1]);
            }
        }
        for (int r = 0; r < NR; r++) {
            _mm256_storeu_ps(rs->out[r] + d, o[r][0]);
            _mm256_storeu_ps(rs->out[r] + d + 8, o[r][1]);
        }
    }
    for (int r = 1; r < NR; r++)
        for (int j = common; j < rs->n[r]; j++) {
            __m256 p = _mm256_broadcast_ss(rs->s[r] + j);
            for (int d = 0; d < hd; d += 8)
                _mm256_storeu_ps(rs->out[r] + d, _mm256_fmadd_ps(p, load_h8(v + (size_t)j * hd + d),
                                                                 _mm256_loadu_ps(rs->out[r] + d)));
        }
}

ATTN_AVX2 static void accumulate_v_avx2(const rowset_t *rs, const uint16_t *v, int hd) {
    switch (rs->nr) {
    case 1: accumulate_v_nr(rs, v, hd, 1); break;
    case 2: accumulate_v_nr(rs, v, hd, 2); break;
    default: accumulate_v_nr(rs, v, hd, 3); break;
    }
}
#endif

/* ---------------- the run ---------------- */

size_t attention_scratch_floats(int n_heads) {
    return (size_t)ATTN_MAX_TOKENS * n_heads * (KV_BLOCK + 2);
}

/* The keys token t of a run sees: [span_lo, span_hi). Both rise with t, so the tokens that see any of a block are
 * consecutive: those before them see only later keys, those after them only earlier ones. */
static inline int span_hi(const attn_span_t *a, int t) {
    int p = a->pos0 + t;
    if (a->causal) return p + 1;
    return a->window && p + a->window < a->seq_len ? p + a->window : a->seq_len;
}

static inline int span_lo(const attn_span_t *a, int t) {
    int p = a->pos0 + t;
    return a->window && p - a->window + 1 > 0 ? p - a->window + 1 : 0;
}

/* A run of ntok consecutive tokens of one sequence, at positions span->pos0 onwards, each attending to the keys
 * span_lo..span_hi gives it; for the query heads of `kv_heads` adjacent KV heads. Every token and head goes through
 * the blocks in the same order, with the same operations, as it would alone: a row's scores are indexed by the key's
 * place in its block, keys before its window get weight exactly 0 (so sums run over the same lanes whoever shares
 * the row set), and blocks wholly outside a token's window are skipped for it.
 * The blocks are the outer loop: a block's K (then V) slices of adjacent KV heads lie side by side in the cache, so
 * each block is read as one contiguous piece, which streams at twice the rate of separate 8 KB slices.
 * q: rows of `q_stride` floats, the query heads of the first KV head at the start of each, the others after them;
 * out: the same with `out_stride`; k_head/v_head: one layer's cache addressed as (block, n_kv_heads, KV_BLOCK,
 * head_dim) with the first KV head's offset applied; scratch: attention_scratch_floats(n_heads);
 * next_k/next_v: where the caller reads next (the same span is fetched during this run's last block), or NULL.
 * head_dim is a multiple of 64; ntok <= ATTN_MAX_TOKENS. */
void attention_tokens(const float *q, int q_stride, int ntok, int group, int n_kv_heads, int kv_heads, int head_dim,
                      const uint16_t *k_head, const uint16_t *v_head, const int32_t *block_table,
                      const attn_span_t *span, float *out, int out_stride, float *scratch,
                      const uint16_t *next_k, const uint16_t *next_v) {
    void (*scores)(const rowset_t *, const uint16_t *, int, int, float) = scores_scalar;
    float (*max_of)(const float *, int) = max_scalar;
    float (*weights)(float *, int, float) = weights_scalar;
    void (*accumulate_v)(const rowset_t *, const uint16_t *, int) = accumulate_v_scalar;
#if defined(__x86_64__)
    if (cpu_path() != PATH_SCALAR) {
        scores = scores_avx2; max_of = max_avx2; weights = weights_avx2; accumulate_v = accumulate_v_avx2;
    }
#endif
    /* row r: KV head r / per_head, then token and query head: (r % per_head) / group and r % group */
    int per_head = ntok * group, rows = per_head * kv_heads;
    float scale = span->scale;
    float *s = scratch, *mx = s + (size_t)rows * KV_BLOCK, *sum = mx + rows;
    size_t block_stride = (size_t)n_kv_heads * KV_BLOCK * head_dim, slice = (size_t)KV_BLOCK * head_dim;
    size_t span_bytes = kv_heads * slice * sizeof(uint16_t);     /* bytes of a block's K (or V) for these heads */
    int lo[ATTN_MAX_TOKENS] = {0}, hi[ATTN_MAX_TOKENS] = {0};
    for (int t = 0; t < ntok; t++) { lo[t] = span_lo(span, t); hi[t] = span_hi(span, t); }
    int first_blk = lo[0] / KV_BLOCK, end_blk = (hi[ntok - 1] + KV_BLOCK - 1) / KV_BLOCK;
    for (int r = 0; r < rows; r++) { mx[r] = -INFINITY; sum[r] = 0.0f; }
    for (int t = 0; t < ntok; t++)
        memset(out + (size_t)t * out_stride, 0, (size_t)kv_heads * group * head_dim * sizeof(float));
    for (int blk = first_blk; blk < end_blk; blk++) {
        int base = blk * KV_BLOCK;
        const uint16_t *kb = k_head + (size_t)block_table[blk] * block_stride;
        const uint16_t *vb = v_head + (size_t)block_table[blk] * block_stride;
        const uint16_t *nk = next_k, *nv = next_v;
        if (blk + 1 < end_blk) {
            nk = k_head + (size_t)block_table[blk + 1] * block_stride;
            nv = v_head + (size_t)block_table[blk + 1] * block_stride;
        }
        /* the tokens [t0, t1) see some of this block */
        int t0 = 0, t1 = ntok;
        while (t0 < ntok && hi[t0] <= base) t0++;
        while (t1 > t0 && lo[t1 - 1] >= base + KV_BLOCK) t1--;
        if (t0 == t1) continue;
        int sets_per_head = ((t1 - t0) * group + ROWS_PER_SET - 1) / ROWS_PER_SET;
        int total_sets = sets_per_head * kv_heads, set = 0;
        for (int h = 0; h < kv_heads; h++) {
            int r_end = h * per_head + t1 * group;
            for (int r = h * per_head + t0 * group; r < r_end; r += ROWS_PER_SET, set++) {
                rowset_t rs = {.nr = r_end - r < ROWS_PER_SET ? r_end - r : ROWS_PER_SET,
                               .next_k = (const char *)nk, .next_v = (const char *)nv,
                               .pf_begin = span_bytes * set / total_sets,
                               .pf_end = span_bytes * (set + 1) / total_sets};
                int first[ROWS_PER_SET];                   /* each row's first key of this block */
                for (int i = 0; i < rs.nr; i++) {
                    int t = (r + i - h * per_head) / group, qh = h * group + (r + i) % group;
                    rs.q[i] = q + (size_t)t * q_stride + (size_t)qh * head_dim;
                    rs.out[i] = out + (size_t)t * out_stride + (size_t)qh * head_dim;
                    rs.s[i] = s + (size_t)(r + i) * KV_BLOCK;
                    rs.n[i] = hi[t] - base < KV_BLOCK ? hi[t] - base : KV_BLOCK;
                    first[i] = lo[t] > base ? lo[t] - base : 0;
                }
                rs.j0 = first[0];
                scores(&rs, kb + h * slice, rs.n[rs.nr - 1], head_dim, scale);
                for (int i = 0; i < rs.nr; i++) {
                    int n = rs.n[i];
                    float *si = rs.s[i];
                    for (int j = 0; j < first[i]; j++) si[j] = -INFINITY;    /* before the window: weight 0 */
                    float m = max_of(si, n);
                    if (m > mx[r + i]) {                   /* a new maximum: rescale what was summed so far */
                        float corr = mx[r + i] == -INFINITY ? 0.0f : softmax_weight(mx[r + i] - m);
                        sum[r + i] *= corr;
                        for (int d = 0; d < head_dim; d++) rs.out[i][d] *= corr;
                        mx[r + i] = m;
                    }
                    sum[r + i] += weights(si, n, mx[r + i]);
                }
                accumulate_v(&rs, vb + h * slice, head_dim);
            }
        }
    }
    for (int r = 0; r < rows; r++) {
        int t = (r % per_head) / group, qh = r / per_head * group + r % group;
        float inv = 1.0f / sum[r], *o = out + (size_t)t * out_stride + (size_t)qh * head_dim;
        for (int d = 0; d < head_dim; d++) o[d] *= inv;
    }
}
