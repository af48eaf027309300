/* Attention over the int8 (q8_0) paged KV cache: the same runs, spans and online softmax over 64-position blocks
 * as attention.c's f16 kernel, with K and V stored as GGUF's Q8_0 (int8 values, an f16 scale per 32), which halves
 * the bytes a decode step reads at depth. Layouts: inferd.h (kvq8_slice_bytes).
 *
 * Scores are exact int8 dot products: each query row is quantized to 8 bits per 32 values (quantize_act, as the
 * matmuls' activations, and as llama.cpp does for a q8_0 K), and K is stored with keys in lanes, so a 32-byte load
 * holds 4 values of 8 keys and one dpbusd (VNNI) or sign + maddubs + madd (AVX2) per row adds them into the int32
 * lane of each key: no horizontal sums. Per key and row the float arithmetic is fixed:
 *     acc = fma(float(isum_b), d_q[b] * d_k[b], acc)  for the 32-value blocks b in order, score = acc * scale,
 * and the output adds (p_j * d_v[j, b]) * v_j[d] in key order. The integer sums are exact in any order, so the
 * scalar, AVX2 and VNNI paths give the same bits, and no row's result depends on the other rows of its set.
 * Why int8 scores rather than f32 dots of dequantized keys: a 32-value block of one key and one row costs a
 * quarter of a dpbusd (VNNI) against four conversions and four fmas (bench/results/kv_cache_q8.md). */
#include <math.h>
#include <string.h>
#include "inferd.h"
#include "vecmath.h"
#include "softmax.h"

#define Q8_ROWS_PER_SET 4

/* ---------------- the cache's slices ---------------- */

size_t kvq8_slice_bytes(int head_dim) { return (size_t)KV_BLOCK * head_dim + (size_t)KV_BLOCK * (head_dim / QK) * 2; }

static inline size_t k_byte(int head_dim, int pos, int i) {   /* value i of key pos in a K slice */
    return ((size_t)(pos / 8) * (head_dim / 4) + i / 4) * 32 + (pos % 8) * 4 + i % 4;
}

static inline uint16_t *slice_scales(uint8_t *slice, int head_dim) {
    return (uint16_t *)(slice + (size_t)KV_BLOCK * head_dim);
}

/* Q8_0 of each 32 values: d = amax / 127 kept in f16, q = round(x / d) with the f16 d (so d * q is the nearest the
 * stored scale allows), clamped to [-127, 127]: the AVX2 kernel's abs/sign trick never meets -128. */
void kvq8_store(const float *x, int head_dim, uint8_t *slice, int pos, int is_k) {
    uint16_t *scales = slice_scales(slice, head_dim);
    for (int b = 0; b < head_dim / QK; b++) {
        const float *xb = x + b * QK;
        float amax = 0.0f;
        for (int i = 0; i < QK; i++) amax = fmaxf(amax, fabsf(xb[i]));
        float d = fminf(amax / 127.0f, 65504.0f);
        uint16_t dh = f32_to_f16(d);
        float dq = f16_to_f32(dh), id = dq != 0.0f ? 1.0f / dq : 0.0f;
        for (int i = 0; i < QK; i++) {
            float r = nearbyintf(xb[i] * id);
            int8_t q = (int8_t)(r > 127.0f ? 127 : r < -127.0f ? -127 : (int)r);
            if (is_k) slice[k_byte(head_dim, pos, b * QK + i)] = (uint8_t)q;
            else slice[(size_t)pos * head_dim + b * QK + i] = (uint8_t)q;
        }
        if (is_k) scales[b * KV_BLOCK + pos] = dh;
        else scales[pos * (head_dim / QK) + b] = dh;
    }
}

void kvq8_load(const uint8_t *slice, int head_dim, int pos, int is_k, float *out) {
    const uint16_t *scales = slice_scales((uint8_t *)slice, head_dim);
    for (int i = 0; i < head_dim; i++) {
        int b = i / QK;
        float d = f16_to_f32(is_k ? scales[b * KV_BLOCK + pos] : scales[pos * (head_dim / QK) + b]);
        int8_t q = (int8_t)(is_k ? slice[k_byte(head_dim, pos, i)] : slice[(size_t)pos * head_dim + i]);
        out[i] = d * (float)q;
    }
}

/* ---------------- a row set ---------------- */

/* up to Q8_ROWS_PER_SET query rows of one KV head: each with its quantized query, output, scores of the current
 * block and how many of its keys it sees (n rises with the row index) */
typedef struct {
    int nr;
    const block_q8x *q[Q8_ROWS_PER_SET];   /* (head_dim / 32) */
    float *out[Q8_ROWS_PER_SET];
    float *s[Q8_ROWS_PER_SET];             /* (KV_BLOCK) */
    int n[Q8_ROWS_PER_SET];
    int j0;                                /* keys before j0 lie before every row's window: not read */
    const char *next_k, *next_v;           /* bytes [pf_begin, pf_end) of the K and V read next, fetched while */
    size_t pf_begin, pf_end;               /* this set is scored */
} q8rows_t;

/* the part of the set's prefetch span that key group gi of `groups` fetches (spread, not one burst) */
static inline void prefetch_group(const q8rows_t *rs, int gi, int groups) {
    if (!rs->next_k) return;
    size_t len = rs->pf_end - rs->pf_begin;
    size_t b0 = rs->pf_begin + len * gi / groups, b1 = rs->pf_begin + len * (gi + 1) / groups;
    for (size_t b = b0 & ~(size_t)63; b < b1; b += 64) {
        __builtin_prefetch(rs->next_k + b, 0, 2);
        __builtin_prefetch(rs->next_v + b, 0, 2);
    }
}

/* ---------------- scalar ---------------- */

static void scores_scalar(const q8rows_t *rs, const uint8_t *k, int n, int hd, float scale) {
    const uint16_t *ks = slice_scales((uint8_t *)k, hd);
    for (int r = 0; r < rs->nr; r++)
        for (int j = rs->j0; j < n; j++) {
            float acc = 0.0f;
            for (int b = 0; b < hd / QK; b++) {
                const block_q8x *qb = &rs->q[r][b];
                int32_t isum = 0;
                for (int i = 0; i < QK; i++) isum += qb->qs[i] * (int8_t)k[k_byte(hd, j, b * QK + i)];
                acc = __builtin_fmaf((float)isum, qb->d * f16_to_f32(ks[b * KV_BLOCK + j]), acc);
            }
            rs->s[r][j] = acc * scale;
        }
}

/* the V scales of keys [j0, n) as floats: dv[j * (hd / 32) + b] */
static void v_scales_scalar(const uint8_t *v, int hd, int j0, int n, float *dv) {
    const uint16_t *vs = slice_scales((uint8_t *)v, hd);
    for (int i = j0 * (hd / QK); i < n * (hd / QK); i++) dv[i] = f16_to_f32(vs[i]);
}

/* out_r[d] += (p_r[j] * dv[j, d / 32]) * v_j[d], key after key */
static void accumulate_v_scalar(const q8rows_t *rs, const uint8_t *v, int hd, const float *dv) {
    const int8_t *vq = (const int8_t *)v;
    for (int r = 0; r < rs->nr; r++)
        for (int j = rs->j0; j < rs->n[r]; j++)
            for (int b = 0; b < hd / QK; b++) {
                float w = rs->s[r][j] * dv[j * (hd / QK) + b];
                for (int i = b * QK; i < (b + 1) * QK; i++)
                    rs->out[r][i] = __builtin_fmaf(w, (float)vq[(size_t)j * hd + i], rs->out[r][i]);
            }
}

/* ---------------- SIMD ---------------- */
#if defined(__x86_64__)
#include <immintrin.h>

/* the score kernels, once per path (attention_q8_simd.h) */
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#define QSUFFIX avx2
#define QVNNI 0
#include "attention_q8_simd.h"
#undef QSUFFIX
#undef QVNNI
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512vl,avx512vnni")
#define QSUFFIX avx512vnni
#define QVNNI 1
#define DPBUSD(acc, u, s) _mm256_dpbusd_epi32(acc, u, s)
#include "attention_q8_simd.h"
#undef QSUFFIX
#undef QVNNI
#undef DPBUSD
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avxvnni")
#define QSUFFIX avxvnni
#define QVNNI 1
#define DPBUSD(acc, u, s) _mm256_dpbusd_avx_epi32(acc, u, s)
#include "attention_q8_simd.h"
#undef QSUFFIX
#undef QVNNI
#undef DPBUSD
#pragma GCC pop_options

#define AVX2_Q8 __attribute__((target("avx2,fma,f16c")))
#define AVX2_Q8_INLINE AVX2_Q8 static inline __attribute__((always_inline))

AVX2_Q8 static void v_scales_avx2(const uint8_t *v, int hd, int j0, int n, float *dv) {
    const uint16_t *vs = slice_scales((uint8_t *)v, hd);
    int i = j0 * (hd / QK), end = n * (hd / QK);
    for (; i + 8 <= end; i += 8) _mm256_storeu_ps(dv + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(vs + i))));
    for (; i < end; i++) dv[i] = f16_to_f32(vs[i]);
}

AVX2_Q8_INLINE __m256 load_i8x8_ps(const int8_t *p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}

/* 16 output values of every row at a time, in registers across the keys all rows see; the keys only later rows
 * see are added row by row afterwards (the same operations per element, in key order) */
AVX2_Q8_INLINE void accumulate_v_nr(const q8rows_t *rs, const uint8_t *v, int hd, const float *dv, const int NR) {
    const int8_t *vq = (const int8_t *)v;
    int common = rs->n[0], nb = hd / QK;
    for (int d = 0; d < hd; d += 16) {
        const float *dvb = dv + d / QK;
        __m256 o[Q8_ROWS_PER_SET][2];
        for (int r = 0; r < NR; r++) {
            o[r][0] = _mm256_loadu_ps(rs->out[r] + d);
            o[r][1] = _mm256_loadu_ps(rs->out[r] + d + 8);
        }
        for (int j = rs->j0; j < common; j++) {
            __m256 v0 = load_i8x8_ps(vq + (size_t)j * hd + d), v1 = load_i8x8_ps(vq + (size_t)j * hd + d + 8);
            __m256 scale = _mm256_broadcast_ss(dvb + j * nb);
            for (int r = 0; r < NR; r++) {
                __m256 w = _mm256_mul_ps(_mm256_broadcast_ss(rs->s[r] + j), scale);
                o[r][0] = _mm256_fmadd_ps(w, v0, o[r][0]);
                o[r][1] = _mm256_fmadd_ps(w, v1, o[r][1]);
            }
        }
        for (int r = 0; r < NR; r++) {
            _mm256_storeu_ps(rs->out[r] + d, o[r][0]);
            _mm256_storeu_ps(rs->out[r] + d + 8, o[r][1]);
        }
    }
    for (int r = 1; r < NR; r++)
        for (int j = common; j < rs->n[r]; j++)
            for (int d = 0; d < hd; d += 8) {
                __m256 w = _mm256_mul_ps(_mm256_broadcast_ss(rs->s[r] + j), _mm256_broadcast_ss(dv + j * nb + d / QK));
                _mm256_storeu_ps(rs->out[r] + d, _mm256_fmadd_ps(w, load_i8x8_ps(vq + (size_t)j * hd + d),
                                                                 _mm256_loadu_ps(rs->out[r] + d)));
            }
}

AVX2_Q8 static void accumulate_v_avx2(const q8rows_t *rs, const uint8_t *v, int hd, const float *dv) {
    switch (rs->nr) {
    case 1: accumulate_v_nr(rs, v, hd, dv, 1); break;
    case 2: accumulate_v_nr(rs, v, hd, dv, 2); break;
    case 3: accumulate_v_nr(rs, v, hd, dv, 3); break;
    default: accumulate_v_nr(rs, v, hd, dv, 4); break;
    }
}
#endif

/* ---------------- the run ---------------- */

size_t attention_q8_scratch_floats(int n_heads, int head_dim) {
    size_t rows = (size_t)ATTN_MAX_TOKENS * n_heads;
    return rows * (KV_BLOCK + 2) + rows * (head_dim / QK) * (sizeof(block_q8x) / sizeof(float));
}

/* attention_tokens (attention.c) over the q8_0 cache: the same blocks in the same order for every token and head */
void attention_tokens_q8(const float *q, int q_stride, int ntok, int group, int n_kv_heads, int kv_heads,
                         int head_dim, const uint8_t *k_head, const uint8_t *v_head, const int32_t *block_table,
                         const attn_span_t *span, float *out, int out_stride, float *scratch,
                         const uint8_t *next_k, const uint8_t *next_v) {
    void (*scores)(const q8rows_t *, const uint8_t *, int, int, float) = scores_scalar;
    float (*max_of)(const float *, int) = max_scalar;
    float (*weights)(float *, int, float) = weights_scalar;
    void (*v_scales)(const uint8_t *, int, int, int, float *) = v_scales_scalar;
    void (*accumulate_v)(const q8rows_t *, const uint8_t *, int, const float *) = accumulate_v_scalar;
#if defined(__x86_64__)
    int path = cpu_path();
    if (path != PATH_SCALAR) {
        scores = path == PATH_AVXVNNI ? scores_avxvnni : path == PATH_AVX512VNNI ? scores_avx512vnni : scores_avx2;
        max_of = max_avx2; weights = weights_avx2; v_scales = v_scales_avx2; accumulate_v = accumulate_v_avx2;
    }
#endif
    /* row r: KV head r / per_head, then token and query head: (r % per_head) / group and r % group */
    int per_head = ntok * group, rows = per_head * kv_heads, nb = head_dim / QK;
    float scale = span->scale;
    float *s = scratch, *mx = s + (size_t)rows * KV_BLOCK, *sum = mx + rows;
    block_q8x *qq = (block_q8x *)(sum + rows);                  /* (rows, nb) the queries in 8 bits */
    size_t slice = kvq8_slice_bytes(head_dim), block_stride = (size_t)n_kv_heads * slice;
    size_t span_bytes = kv_heads * slice;
    float dv[KV_BLOCK * (512 / QK)];                            /* a block's V scales as floats (head_dim <= 512) */
    int lo[ATTN_MAX_TOKENS] = {0}, hi[ATTN_MAX_TOKENS] = {0};
    for (int t = 0; t < ntok; t++) { lo[t] = span_lo(span, t); hi[t] = span_hi(span, t); }
    int first_blk = lo[0] / KV_BLOCK, end_blk = (hi[ntok - 1] + KV_BLOCK - 1) / KV_BLOCK;
    for (int r = 0; r < rows; r++) {
        int t = (r % per_head) / group, qh = r / per_head * group + r % group;
        mx[r] = -INFINITY;
        sum[r] = 0.0f;
        quantize_act(q + (size_t)t * q_stride + (size_t)qh * head_dim, head_dim, qq + (size_t)r * nb);
    }
    for (int t = 0; t < ntok; t++)
        memset(out + (size_t)t * out_stride, 0, (size_t)kv_heads * group * head_dim * sizeof(float));
    for (int blk = first_blk; blk < end_blk; blk++) {
        int base = blk * KV_BLOCK;
        const uint8_t *kb = k_head + (size_t)block_table[blk] * block_stride;
        const uint8_t *vb = v_head + (size_t)block_table[blk] * block_stride;
        const uint8_t *nk = next_k, *nv = next_v;
        if (blk + 1 < end_blk) {
            nk = k_head + (size_t)block_table[blk + 1] * block_stride;
            nv = v_head + (size_t)block_table[blk + 1] * block_stride;
        }
        int t0 = 0, t1 = ntok;                                  /* the tokens [t0, t1) see some of this block */
        while (t0 < ntok && hi[t0] <= base) t0++;
        while (t1 > t0 && lo[t1 - 1] >= base + KV_BLOCK) t1--;
        if (t0 == t1) continue;
        int sets_per_head = ((t1 - t0) * group + Q8_ROWS_PER_SET - 1) / Q8_ROWS_PER_SET;
        int total_sets = sets_per_head * kv_heads, set = 0;
        for (int h = 0; h < kv_heads; h++) {
            const uint8_t *kh = kb + h * slice, *vh = vb + h * slice;
            int r_end = h * per_head + t1 * group;
            for (int r = h * per_head + t0 * group; r < r_end; r += Q8_ROWS_PER_SET, set++) {
                q8rows_t rs = {.nr = r_end - r < Q8_ROWS_PER_SET ? r_end - r : Q8_ROWS_PER_SET,
                               .next_k = (const char *)nk, .next_v = (const char *)nv,
                               .pf_begin = span_bytes * set / total_sets,
                               .pf_end = span_bytes * (set + 1) / total_sets};
                int first[Q8_ROWS_PER_SET];                     /* each row's first key of this block */
                for (int i = 0; i < rs.nr; i++) {
                    int t = (r + i - h * per_head) / group, qh = h * group + (r + i) % group;
                    rs.q[i] = qq + (size_t)(r + i) * nb;
                    rs.out[i] = out + (size_t)t * out_stride + (size_t)qh * head_dim;
                    rs.s[i] = s + (size_t)(r + i) * KV_BLOCK;
                    rs.n[i] = hi[t] - base < KV_BLOCK ? hi[t] - base : KV_BLOCK;
                    first[i] = lo[t] > base ? lo[t] - base : 0;
                }
                rs.j0 = first[0];
                int n_last = rs.n[rs.nr - 1];
                scores(&rs, kh, n_last, head_dim, scale);
                for (int i = 0; i < rs.nr; i++) {
                    int n = rs.n[i];
                    float *si = rs.s[i];
                    for (int j = 0; j < first[i]; j++) si[j] = -INFINITY;    /* before the window: weight 0 */
                    float m = max_of(si, n);
                    if (m > mx[r + i]) {                        /* a new maximum: rescale what was summed so far */
                        float corr = mx[r + i] == -INFINITY ? 0.0f : softmax_weight(mx[r + i] - m);
                        sum[r + i] *= corr;
                        for (int d = 0; d < head_dim; d++) rs.out[i][d] *= corr;
                        mx[r + i] = m;
                    }
                    sum[r + i] += weights(si, n, mx[r + i]);
                }
                v_scales(vh, head_dim, rs.j0, n_last, dv);
                accumulate_v(&rs, vh, head_dim, dv);
            }
        }
    }
    for (int r = 0; r < rows; r++) {
        int t = (r % per_head) / group, qh = r / per_head * group + r % group;
        float inv = softmax_norm(mx[r], sum[r], span->sinks, qh);
        float *o = out + (size_t)t * out_stride + (size_t)qh * head_dim;
        for (int d = 0; d < head_dim; d++) o[d] *= inv;
    }
}
