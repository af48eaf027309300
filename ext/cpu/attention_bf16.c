/* The tile kernels over the bf16 KV cache (kv_cache_dtype = "bf16"): K and V are rounded to bf16 when stored, in
 * layouts of pairs that AVX-512 BF16's VDPBF16PS takes as they lie, so one instruction makes two products per lane
 * where an f32 fma makes one, and no block is converted before use. attention.c's run drives them (the same blocks,
 * segments, online softmax and merges as over the f16 cache).
 *
 * A (block, KV head) slice has the f16 cache's size. K: (head_dim / 2, KV_BLOCK) 32-bit pairs, pair i of key j =
 * (bf16 k_j[2i], bf16 k_j[2i + 1]), the even value in the low half: keys in lanes. V: (KV_BLOCK / 2, head_dim) pairs,
 * pair m of dimension d = (bf16 v_2m[d], bf16 v_2m+1[d]).
 *
 * Fixed arithmetic, VDPBF16PS's: per lane, the odd element's exact product added to the sum, rounded, then the even
 * one's, rounded:
 *   - bf16 rounding (K, V, the queries and the softmax weights): to nearest even; magnitudes below BF16_FLOOR become 0;
 *   - a score: one chain from 0 over the pairs i in order, acc = fma(k[2i + 1], q[2i + 1], acc) then
 *     acc = fma(k[2i], q[2i], acc); then times the scale;
 *   - an output element: over the key pairs m in order, o = fma(p[2m + 1], v_2m+1, o) then o = fma(p[2m], v_2m, o),
 *     the weights p rounded to bf16 (their sum, as over the f16 cache, adds the unrounded ones); keys a row does not
 *     see carry weight 0, and the value paired with a block's last computed key, past it, is taken as 0.
 * Why the floor: VDPBF16PS treats denormal inputs as 0 and flushes denormal results, where an fma keeps them. With
 * every operand 0 or at least 2^-40 in magnitude (and a segment's output flushed the same way when a new maximum
 * scales it down, attention_bf16_flush), a product is 0 or at least 2^-80 and a multiple of 2^-94, and so is any
 * partial sum: no denormal ever arises, and the scalar and AVX2 kernels (two fmas per pair) give VDPBF16PS's bits. */
#include <string.h>
#include "inferd.h"
#include "attention_tile.h"

#define BF16_FLOOR 0x2B800000u     /* 2^-40 as f32 bits */

static inline uint32_t bits_of(float x) { uint32_t u; memcpy(&u, &x, 4); return u; }
static inline float float_of(uint32_t u) { float x; memcpy(&x, &u, 4); return x; }

/* x rounded to bf16, as the f32 bits of the result (low half 0) */
static inline uint32_t bf16_bits(float x) {
    uint32_t u = bits_of(x);
    if ((u & 0x7FFFFFFFu) < BF16_FLOOR) return 0;
    return (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;
}

static inline uint32_t bf16_pair(float even, float odd) { return bf16_bits(even) >> 16 | bf16_bits(odd); }

/* ---------------- the cache's layouts ---------------- */

void kv_store_key_bf16(const float *k, uint16_t *slice, int slot, int head_dim) {
    uint32_t *pairs = (uint32_t *)slice;
    for (int i = 0; i < head_dim / 2; i++) pairs[(size_t)i * KV_BLOCK + slot] = bf16_pair(k[2 * i], k[2 * i + 1]);
}

void kv_store_value_bf16(const float *v, uint16_t *slice, int slot, int head_dim) {
    uint16_t *row = slice + (size_t)(slot / 2) * head_dim * 2 + slot % 2;
    for (int d = 0; d < head_dim; d++) row[2 * d] = (uint16_t)(bf16_bits(v[d]) >> 16);
}

void kv_load_bf16(const uint16_t *slice, int head_dim, int slot, int is_k, float *out) {
    for (int d = 0; d < head_dim; d++) {
        size_t at = is_k ? ((size_t)(d / 2) * KV_BLOCK + slot) * 2 + d % 2
                         : ((size_t)(slot / 2) * head_dim + d) * 2 + slot % 2;
        out[d] = float_of((uint32_t)slice[at] << 16);
    }
}

void attention_bf16_pairs(const float *q, uint32_t *qp, int head_dim) {
    for (int i = 0; i < head_dim / 2; i++) qp[i] = bf16_pair(q[2 * i], q[2 * i + 1]);
}

void attention_bf16_flush(float *o, int head_dim) {
    for (int d = 0; d < head_dim; d++)
        if ((bits_of(o[d]) & 0x7FFFFFFFu) < BF16_FLOOR) o[d] = 0.0f;
}

static inline float hi_of(uint32_t pair) { return float_of(pair & 0xFFFF0000u); }
static inline float lo_of(uint32_t pair) { return float_of(pair << 16); }

/* the tile's weights rounded in place for keys [j0, j1) rounded out to whole pairs; the value paired with key j1 - 1
 * past the tile's keys weighs 0 */
static void round_weights(const tile_t *t) {
    for (int r = 0; r < t->nr; r++) {
        if (t->j1 % 2) t->s[r][t->j1] = 0.0f;
        for (int j = t->j0 & ~1; j < t->j1; j++) t->s[r][j] = float_of(bf16_bits(t->s[r][j]));
    }
}

/* ---------------- scalar ---------------- */

static void scores_scalar(const tile_t *t, int hd, float scale) {
    const uint32_t *k = t->k;
    for (int r = 0; r < t->nr; r++)
        for (int j = t->j0; j < t->j1; j++) {
            float a = 0.0f;
            for (int i = 0; i < hd / 2; i++) {
                uint32_t kp = k[(size_t)i * KV_BLOCK + j], qp = t->qp[r][i];
                a = __builtin_fmaf(hi_of(kp), hi_of(qp), a);
                a = __builtin_fmaf(lo_of(kp), lo_of(qp), a);
            }
            t->s[r][j] = a * scale;
        }
}

/* the value pair (m, d), its odd half dropped when it lies past the tile's keys */
static inline uint32_t value_pair(const tile_t *t, int hd, int m, int d) {
    uint32_t vp = ((const uint32_t *)t->v)[(size_t)m * hd + d];
    return 2 * m + 1 < t->j1 ? vp : vp & 0xFFFFu;
}

static void accumulate_v_scalar(const tile_t *t, int hd) {
    round_weights(t);
    for (int r = 0; r < t->nr; r++)
        for (int d = 0; d < hd; d++) {
            float o = t->o[r][d];
            for (int m = t->j0 / 2; 2 * m < t->j1; m++) {
                uint32_t vp = value_pair(t, hd, m, d);
                o = __builtin_fmaf(hi_of(vp), t->s[r][2 * m + 1], o);
                o = __builtin_fmaf(lo_of(vp), t->s[r][2 * m], o);
            }
            t->o[r][d] = o;
        }
}

#if defined(__x86_64__)
#include <immintrin.h>

/* ---------------- AVX2: VDPBF16PS as two fmas per pair ---------------- */
#define BF_AVX2 __attribute__((target("avx2,fma")))
#define BF_AVX2_INLINE BF_AVX2 static inline __attribute__((always_inline))

BF_AVX2_INLINE __m256 hi8(__m256i p) { return _mm256_castsi256_ps(_mm256_and_si256(p, _mm256_set1_epi32(-65536))); }
BF_AVX2_INLINE __m256 lo8(__m256i p) { return _mm256_castsi256_ps(_mm256_slli_epi32(p, 16)); }

/* NR rows x 16 keys at j */
BF_AVX2_INLINE void score_block_avx2(const tile_t *t, int hd, int j, float scale, const int NR) {
    __m256 a[ROW_TILE][2];
    for (int r = 0; r < NR; r++) a[r][0] = a[r][1] = _mm256_setzero_ps();
    const uint32_t *k = (const uint32_t *)t->k + j;
    for (int i = 0; i < hd / 2; i++) {
        __m256i k0 = _mm256_loadu_si256((const __m256i *)(k + (size_t)i * KV_BLOCK));
        __m256i k1 = _mm256_loadu_si256((const __m256i *)(k + (size_t)i * KV_BLOCK + 8));
        __m256 h0 = hi8(k0), l0 = lo8(k0), h1 = hi8(k1), l1 = lo8(k1);
        for (int r = 0; r < NR; r++) {
            __m256 qh = _mm256_set1_ps(hi_of(t->qp[r][i])), ql = _mm256_set1_ps(lo_of(t->qp[r][i]));
            a[r][0] = _mm256_fmadd_ps(ql, l0, _mm256_fmadd_ps(qh, h0, a[r][0]));
            a[r][1] = _mm256_fmadd_ps(ql, l1, _mm256_fmadd_ps(qh, h1, a[r][1]));
        }
    }
    __m256 vs = _mm256_set1_ps(scale);
    for (int r = 0; r < NR; r++) {
        _mm256_storeu_ps(t->s[r] + j, _mm256_mul_ps(a[r][0], vs));
        _mm256_storeu_ps(t->s[r] + j + 8, _mm256_mul_ps(a[r][1], vs));
    }
}

BF_AVX2_INLINE void scores_avx2_nr(const tile_t *t, int hd, float scale, const int NR) {
    for (int j = t->j0 & ~15; j < t->j1; j += 16) score_block_avx2(t, hd, j, scale, NR);
}

/* NR rows x 16 output values at d */
BF_AVX2_INLINE void accumulate_avx2_pass(const tile_t *t, int hd, int d, const int NR) {
    __m256 o[ROW_TILE][2];
    for (int r = 0; r < NR; r++) {
        o[r][0] = _mm256_loadu_ps(t->o[r] + d);
        o[r][1] = _mm256_loadu_ps(t->o[r] + d + 8);
    }
    const __m256i keep_even = _mm256_set1_epi32(0xFFFF);
    for (int m = t->j0 / 2; 2 * m < t->j1; m++) {
        const uint32_t *v = (const uint32_t *)t->v + (size_t)m * hd + d;
        __m256i v0 = _mm256_loadu_si256((const __m256i *)v), v1 = _mm256_loadu_si256((const __m256i *)(v + 8));
        if (2 * m + 1 >= t->j1) { v0 = _mm256_and_si256(v0, keep_even); v1 = _mm256_and_si256(v1, keep_even); }
        __m256 h0 = hi8(v0), l0 = lo8(v0), h1 = hi8(v1), l1 = lo8(v1);
        for (int r = 0; r < NR; r++) {
            __m256 ph = _mm256_set1_ps(t->s[r][2 * m + 1]), pl = _mm256_set1_ps(t->s[r][2 * m]);
            o[r][0] = _mm256_fmadd_ps(pl, l0, _mm256_fmadd_ps(ph, h0, o[r][0]));
            o[r][1] = _mm256_fmadd_ps(pl, l1, _mm256_fmadd_ps(ph, h1, o[r][1]));
        }
    }
    for (int r = 0; r < NR; r++) {
        _mm256_storeu_ps(t->o[r] + d, o[r][0]);
        _mm256_storeu_ps(t->o[r] + d + 8, o[r][1]);
    }
}

BF_AVX2_INLINE void accumulate_avx2_nr(const tile_t *t, int hd, const int NR) {
    for (int d = 0; d < hd; d += 16) accumulate_avx2_pass(t, hd, d, NR);
}

/* fn(..., NR) for the tile's row count */
#define BY_ROW_COUNT(fn, t, ...)                                                                                   \
    do {                                                                                                           \
        switch ((t)->nr) {                                                                                         \
        case 1: fn(__VA_ARGS__, 1); break;  case 2: fn(__VA_ARGS__, 2); break;                                     \
        case 3: fn(__VA_ARGS__, 3); break;  case 4: fn(__VA_ARGS__, 4); break;                                     \
        case 5: fn(__VA_ARGS__, 5); break;  default: fn(__VA_ARGS__, 6); break;                                    \
        }                                                                                                          \
    } while (0)

BF_AVX2 static void scores_avx2(const tile_t *t, int hd, float scale) { BY_ROW_COUNT(scores_avx2_nr, t, t, hd, scale); }

BF_AVX2 static void accumulate_v_avx2(const tile_t *t, int hd) {
    round_weights(t);
    BY_ROW_COUNT(accumulate_avx2_nr, t, t, hd);
}

/* ---------------- AVX-512 BF16: VDPBF16PS on the pairs as they lie ---------------- */
#define BF_512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma")))
#define BF_512_INLINE BF_512 static inline __attribute__((always_inline))

BF_512_INLINE __m512 dot_pairs(__m512 acc, __m512i a, __m512i b) {
    return _mm512_dpbf16_ps(acc, (__m512bh)a, (__m512bh)b);
}

/* NR rows x NC vectors of 16 keys at j; the next block's K fetched on the way (its 64 keys: 4 lines a pair) */
BF_512_INLINE void score_block16(const tile_t *t, int hd, int j, float scale, const int NR, const int NC) {
    __m512 a[ROW_TILE][4];
    for (int r = 0; r < NR; r++)
        for (int c = 0; c < NC; c++) a[r][c] = _mm512_setzero_ps();
    const uint32_t *k = (const uint32_t *)t->k + j;
    const uint32_t *pf = (const uint32_t *)t->pf_k;
    for (int i = 0; i < hd / 2; i++) {
        if (pf)
            for (int l = 0; l < KV_BLOCK; l += 16)
                _mm_prefetch((const char *)(pf + (size_t)i * KV_BLOCK + l), _MM_HINT_T1);
        __m512i kv[4];
        for (int c = 0; c < NC; c++) kv[c] = _mm512_loadu_si512(k + (size_t)i * KV_BLOCK + 16 * c);
        for (int r = 0; r < NR; r++) {
            __m512i q = _mm512_set1_epi32((int)t->qp[r][i]);
            for (int c = 0; c < NC; c++) a[r][c] = dot_pairs(a[r][c], kv[c], q);
        }
    }
    __m512 vs = _mm512_set1_ps(scale);
    for (int r = 0; r < NR; r++)
        for (int c = 0; c < NC; c++) _mm512_storeu_ps(t->s[r] + j + 16 * c, _mm512_mul_ps(a[r][c], vs));
}

BF_512_INLINE void scores512_nr(const tile_t *t, int hd, float scale, const int NR) {
    int j = t->j0 & ~15;
    switch ((((t->j1 + 15) & ~15) - j) / 16) {
    case 1: score_block16(t, hd, j, scale, NR, 1); break;
    case 2: score_block16(t, hd, j, scale, NR, 2); break;
    case 3: score_block16(t, hd, j, scale, NR, 3); break;
    case 4: score_block16(t, hd, j, scale, NR, 4); break;
    default: break;
    }
}

BF_512 static void scores_avx512(const tile_t *t, int hd, float scale) { BY_ROW_COUNT(scores512_nr, t, t, hd, scale); }

/* each row's weights as pairs: floored, then rounded by VCVTNE2PS2BF16 (to nearest even, as bf16_bits) */
BF_512_INLINE void weight_pairs(const tile_t *t, int r, uint32_t *pp) {
    const __m512 floor = _mm512_castsi512_ps(_mm512_set1_epi32(BF16_FLOOR));
    float *s = t->s[r];
    if (t->j1 % 2) s[t->j1] = 0.0f;
    for (int j = 0; j < KV_BLOCK; j += 32) {
        __m512 a = _mm512_loadu_ps(s + j), b = _mm512_loadu_ps(s + j + 16);
        a = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(_mm512_abs_ps(a), floor, _CMP_GE_OQ), a);
        b = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(_mm512_abs_ps(b), floor, _CMP_GE_OQ), b);
        _mm512_storeu_si512(pp + j / 2, (__m512i)_mm512_cvtne2ps_pbh(b, a));
    }
}

/* 64 output values of every row at a time, in registers across the tile's key pairs; the next block's V fetched
 * during the first pass */
BF_512_INLINE void accumulate512_nr(const tile_t *t, int hd, const int NR) {
    uint32_t pp[ROW_TILE][KV_BLOCK / 2];
    for (int r = 0; r < NR; r++) weight_pairs(t, r, pp[r]);
    const __m512i keep_even = _mm512_set1_epi32(0xFFFF);
    const uint32_t *pf = (const uint32_t *)t->pf_v;
    for (int d = 0; d < hd; d += 64) {
        __m512 o[ROW_TILE][4];
        for (int r = 0; r < NR; r++)
            for (int c = 0; c < 4; c++) o[r][c] = _mm512_loadu_ps(t->o[r] + d + 16 * c);
        for (int m = t->j0 / 2; 2 * m < t->j1; m++) {
            const uint32_t *v = (const uint32_t *)t->v + (size_t)m * hd + d;
            if (pf && d == 0)
                for (int l = 0; l < hd; l += 16) _mm_prefetch((const char *)(pf + (size_t)m * hd + l), _MM_HINT_T1);
            __m512i vv[4];
            for (int c = 0; c < 4; c++) vv[c] = _mm512_loadu_si512(v + 16 * c);
            if (2 * m + 1 >= t->j1)
                for (int c = 0; c < 4; c++) vv[c] = _mm512_and_si512(vv[c], keep_even);
            for (int r = 0; r < NR; r++) {
                __m512i p = _mm512_set1_epi32((int)pp[r][m]);
                for (int c = 0; c < 4; c++) o[r][c] = dot_pairs(o[r][c], vv[c], p);
            }
        }
        for (int r = 0; r < NR; r++)
            for (int c = 0; c < 4; c++) _mm512_storeu_ps(t->o[r] + d + 16 * c, o[r][c]);
    }
}

BF_512 static void accumulate_v_avx512(const tile_t *t, int hd) { BY_ROW_COUNT(accumulate512_nr, t, t, hd); }
#endif

int attention_bf16_native(void) {
#if defined(__x86_64__)
    return cpu_path() >= PATH_AVX512VNNI && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bf16");
#else
    return 0;
#endif
}

void attention_bf16_kernels(kernels_t *k) {
    k->scores = scores_scalar;
    k->accumulate_v = accumulate_v_scalar;
#if defined(__x86_64__)
    if (cpu_path() != PATH_SCALAR) {
        k->scores = scores_avx2;
        k->accumulate_v = accumulate_v_avx2;
    }
    if (attention_bf16_native()) {
        k->scores = scores_avx512;
        k->accumulate_v = accumulate_v_avx512;
    }
#endif
}
