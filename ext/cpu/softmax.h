/* What the attention kernels (attention.c over the f16 cache, attention_q8.c over the int8 one, the encoder's)
 * share: the keys a token of a run sees, and the softmax steps in the fixed orders every SIMD variant reproduces. */
#ifndef INFERD_SOFTMAX_H
#define INFERD_SOFTMAX_H

#include <math.h>
#include "inferd.h"
#include "vecmath.h"

/* Softmax weights below e^-64 of the largest are set to 0: they cannot change a float32 sum that holds a 1, and
 * their products with V would be denormals, which cost a hundred cycles each. */
#define SOFTMAX_CUTOFF -64.0f

static inline float softmax_weight(float x) { return x < SOFTMAX_CUTOFF ? 0.0f : exp_scalar(x); }

/* The factor that normalizes a row's output, from its softmax state (max m, weight sum s): 1 / s, or with an attention
 * sink (a logit whose value is zero) e^(m - top) / (s e^(m - top) + e^(sink - top)), top the larger of m and the
 * sink, so that neither exponent overflows. sinks: per query head, or NULL. */
static inline float softmax_norm(float m, float s, const float *sinks, int qh) {
    if (!sinks) return 1.0f / s;
    float sink = sinks[qh], top = m > sink ? m : sink, a = softmax_weight(m - top);
    return a / __builtin_fmaf(s, a, softmax_weight(sink - top));
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

/* the largest of s[0..n), in a fixed order (lane l of full groups of 8 takes s[8i + l], lanes combined pairwise,
 * then the tail), written x > m ? x : m like maxps so both paths agree even on NaN */
static inline float max2(float a, float b) { return a > b ? a : b; }

static inline float max_scalar(const float *s, int n) {
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
static inline float weights_scalar(float *s, int n, float m) {
    float lanes[8] = {0};
    int j = 0;
    for (; j + 8 <= n; j += 8)
        for (int l = 0; l < 8; l++) { s[j + l] = softmax_weight(s[j + l] - m); lanes[l] += s[j + l]; }
    float total = hsum8_pairs_scalar(lanes);
    for (; j < n; j++) { s[j] = softmax_weight(s[j] - m); total += s[j]; }
    return total;
}

#if defined(__x86_64__)
#include <immintrin.h>
#define SOFTMAX_AVX2 __attribute__((target("avx2,fma,f16c"), unused))

/* the same steps eight lanes at a time, in the same orders (the scalar ones are their definition) */
SOFTMAX_AVX2 static float max_avx2(const float *s, int n) {
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

/* the weights of s[j..n), 8 at a time then one by one, their sum continuing the 8 lane sums `lanes` */
SOFTMAX_AVX2 static inline float weights_avx2_from(float *s, int j, int n, float m, __m256 lanes) {
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
SOFTMAX_AVX2 static float weights_avx2(float *s, int n, float m) {
    return weights_avx2_from(s, 0, n, m, _mm256_setzero_ps());
}
/* exp8's operations lane for lane, on 16 lanes (AVX-512F only, so every AVX-512 CPU runs it) */
#define SOFTMAX_AVX512 __attribute__((target("avx512f,avx2,fma,f16c"), unused))

SOFTMAX_AVX512 static inline __m512 exp16(__m512 x) {
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(EXP_LO)), _mm512_set1_ps(EXP_HI));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(-0.693359375f), x);
    r = _mm512_fmadd_ps(n, _mm512_set1_ps(2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    __m512 y = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
    __m512i bits = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_mul_ps(y, _mm512_castsi512_ps(bits));
}

/* weights_avx2 with the exps 16 at a time: the low then the high 8 go into the same 8 lane sums, so the sum still
 * takes s[8i + l] into lane l, in order */
SOFTMAX_AVX512 static float weights_avx512(float *s, int n, float m) {
    __m256 lanes = _mm256_setzero_ps();
    int j = 0;
    for (; j + 16 <= n; j += 16) {
        __m512 x = _mm512_sub_ps(_mm512_loadu_ps(s + j), _mm512_set1_ps(m));
        __mmask16 keep = _mm512_cmp_ps_mask(x, _mm512_set1_ps(SOFTMAX_CUTOFF), _CMP_GE_OQ);
        __m512 w = _mm512_maskz_mov_ps(keep, exp16(x));
        _mm512_storeu_ps(s + j, w);
        lanes = _mm256_add_ps(lanes, _mm512_castps512_ps256(w));
        lanes = _mm256_add_ps(lanes, _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(w), 1)));
    }
    return weights_avx2_from(s, j, n, m, lanes);
}
#endif

#endif
