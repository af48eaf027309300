/* Kernels that only encoders need: LayerNorm, GELU (erf form) and bidirectional attention over a
 * sequence's own tokens (no KV cache: an encoder sees its whole input at once).
 *
 * As everywhere in the engine, the scalar and AVX2 variants do the same IEEE operations in the same order, so the
 * paths give the same bits: dot products are eight lanes of fma chains over the head dimension summed in
 * hsum8_pairs' order, exp is vecmath's, sums run lane by lane over groups of 8 then over the tail in order. */
#include <math.h>
#include "encoder.h"
#include "vecmath.h"

/* Softmax weights below e^-64 of the largest are 0 (as in attention.c: they cannot change the sum, and their
 * products with V would be slow denormals). */
#define SOFTMAX_CUTOFF -64.0f

/* ---------------- LayerNorm: one version; plain adds and multiplies over 8 lanes (the compiler vectorizes it) */

void layernorm(const float *x, const float *w, const float *b, int n, float eps, float *out) {
    float a[8] = {0};
    for (int i = 0; i < n; i += 8)
        for (int l = 0; l < 8; l++) a[l] += x[i + l];
    float mean = hsum8_pairs_scalar(a) / (float)n;
    for (int l = 0; l < 8; l++) a[l] = 0.0f;
    for (int i = 0; i < n; i += 8)
        for (int l = 0; l < 8; l++) { float d = x[i + l] - mean; a[l] += d * d; }
    float inv = 1.0f / sqrtf(hsum8_pairs_scalar(a) / (float)n + eps);
    for (int i = 0; i < n; i++) out[i] = (x[i] - mean) * inv * w[i] + b[i];
}

/* ---------------- GELU (erf form; Gemma's tanh form is norm.c's geglu) ----------------
 * erf by a rational approximation on [-4, 4] (odd polynomial of degree 13 over an even one of degree 8, the form
 * Eigen and XLA use; |error| < 5e-7 against libm's erf), with separate multiplies and adds so that the scalar
 * variant is the same arithmetic as the vector one. */
static const float ERF_P[7] = {-2.72614225801306e-10f, 2.77068142495902e-08f, -2.10102402082508e-06f,
                               -5.69250639462346e-05f, -7.34990630326855e-04f, -2.95459980854025e-03f,
                               -1.60960333262415e-02f};
static const float ERF_Q[5] = {-1.45660718464996e-05f, -2.13374055278905e-04f, -1.68282697438203e-03f,
                               -7.37332916720468e-03f, -1.42647390514189e-02f};
#define SQRT1_2 0.70710678118654752f

static inline float erf_scalar(float x) {
    x = fminf(fmaxf(x, -4.0f), 4.0f);
    float x2 = x * x, p = ERF_P[0], q = ERF_Q[0];
    for (int i = 1; i < 7; i++) p = p * x2 + ERF_P[i];
    for (int i = 1; i < 5; i++) q = q * x2 + ERF_Q[i];
    return x * p / q;
}

static void gelu_erf_scalar(float *x, int n) {
    for (int i = 0; i < n; i++) x[i] = 0.5f * x[i] * (1.0f + erf_scalar(x[i] * SQRT1_2));
}

/* ---------------- bidirectional attention, scalar ---------------- */

static void scores_scalar(const float *q, const float *k, int stride, int lo, int hi, int hd, float scale,
                          float *s) {
    for (int j = lo; j < hi; j++) {
        float a[8] = {0};
        const float *kj = k + (size_t)j * stride;
        for (int g = 0; g < hd; g += 8)
            for (int l = 0; l < 8; l++) a[l] = __builtin_fmaf(q[g + l], kj[g + l], a[l]);
        s[j - lo] = hsum8_pairs_scalar(a) * scale;
    }
}

/* s[j] = exp(s[j] - m) (0 below the cutoff); returns their sum: lane l of full groups of 8 sums s[8i + l], the
 * lanes combined by hsum8_pairs, then the tail in order */
static float softmax_weights_scalar(float *s, int n, float m) {
    float lanes[8] = {0};
    int j = 0;
    for (; j + 8 <= n; j += 8)
        for (int l = 0; l < 8; l++) {
            float d = s[j + l] - m;
            s[j + l] = d < SOFTMAX_CUTOFF ? 0.0f : exp_scalar(d);
            lanes[l] += s[j + l];
        }
    float total = hsum8_pairs_scalar(lanes);
    for (; j < n; j++) { float d = s[j] - m; s[j] = d < SOFTMAX_CUTOFF ? 0.0f : exp_scalar(d); total += s[j]; }
    return total;
}

static void weighted_sum_scalar(const float *s, const float *v, int stride, int lo, int hi, int hd, float inv,
                                float *out) {
    for (int d = 0; d < hd; d++) out[d] = 0.0f;
    for (int j = lo; j < hi; j++) {
        const float *vj = v + (size_t)j * stride;
        for (int d = 0; d < hd; d++) out[d] = __builtin_fmaf(s[j - lo], vj[d], out[d]);
    }
    for (int d = 0; d < hd; d++) out[d] *= inv;
}

/* the largest score (a maximum is exact, so the AVX2 variant's lane order gives the same value) */
static float max_scores(const float *s, int n) {
    float m = -INFINITY;
    for (int j = 0; j < n; j++) m = s[j] > m ? s[j] : m;
    return m;
}

/* ---------------- AVX2 ---------------- */
#if defined(__x86_64__)
#define ENC_AVX2 __attribute__((target("avx2,fma,f16c")))

ENC_AVX2 static void gelu_erf_avx2(float *x, int n) {
    const __m256 half = _mm256_set1_ps(0.5f), one = _mm256_set1_ps(1.0f), r2 = _mm256_set1_ps(SQRT1_2);
    const __m256 lo = _mm256_set1_ps(-4.0f), hi = _mm256_set1_ps(4.0f);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        __m256 z = _mm256_min_ps(_mm256_max_ps(_mm256_mul_ps(v, r2), lo), hi);
        __m256 z2 = _mm256_mul_ps(z, z), p = _mm256_set1_ps(ERF_P[0]), q = _mm256_set1_ps(ERF_Q[0]);
        for (int k = 1; k < 7; k++) p = _mm256_add_ps(_mm256_mul_ps(p, z2), _mm256_set1_ps(ERF_P[k]));
        for (int k = 1; k < 5; k++) q = _mm256_add_ps(_mm256_mul_ps(q, z2), _mm256_set1_ps(ERF_Q[k]));
        __m256 e = _mm256_div_ps(_mm256_mul_ps(z, p), q);
        _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_mul_ps(half, v), _mm256_add_ps(one, e)));
    }
    gelu_erf_scalar(x + i, n - i);
}

/* four keys at a time: each key's eight lanes of fma chains, then the four sums in hsum8_pairs' order */
ENC_AVX2 static void scores_avx2(const float *q, const float *k, int stride, int lo, int hi, int hd, float scale,
                                 float *s) {
    int j = lo;
    for (; j + 4 <= hi; j += 4) {
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        const float *k0 = k + (size_t)j * stride, *k1 = k0 + stride, *k2 = k1 + stride, *k3 = k2 + stride;
        for (int g = 0; g < hd; g += 8) {
            __m256 qv = _mm256_loadu_ps(q + g);
            a0 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + g), a0);
            a1 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k1 + g), a1);
            a2 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k2 + g), a2);
            a3 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k3 + g), a3);
        }
        _mm_storeu_ps(s + j - lo, _mm_mul_ps(hsum4x8_pairs(a0, a1, a2, a3), _mm_set1_ps(scale)));
    }
    for (; j < hi; j++) {
        __m256 a = _mm256_setzero_ps();
        const float *kj = k + (size_t)j * stride;
        for (int g = 0; g < hd; g += 8) a = _mm256_fmadd_ps(_mm256_loadu_ps(q + g), _mm256_loadu_ps(kj + g), a);
        s[j - lo] = hsum8_pairs(a) * scale;
    }
}

ENC_AVX2 static float max_scores_avx2(const float *s, int n) {
    __m256 m = _mm256_set1_ps(-INFINITY);
    int j = 0;
    for (; j + 8 <= n; j += 8) m = _mm256_max_ps(_mm256_loadu_ps(s + j), m);
    float lanes[8], out = -INFINITY;
    _mm256_storeu_ps(lanes, m);
    for (int l = 0; l < 8; l++) out = lanes[l] > out ? lanes[l] : out;
    for (; j < n; j++) out = s[j] > out ? s[j] : out;
    return out;
}

ENC_AVX2 static float softmax_weights_avx2(float *s, int n, float m) {
    const __m256 mv = _mm256_set1_ps(m), cut = _mm256_set1_ps(SOFTMAX_CUTOFF);
    __m256 lanes = _mm256_setzero_ps();
    int j = 0;
    for (; j + 8 <= n; j += 8) {
        __m256 d = _mm256_sub_ps(_mm256_loadu_ps(s + j), mv);
        __m256 e = _mm256_andnot_ps(_mm256_cmp_ps(d, cut, _CMP_LT_OQ), exp8(d));
        _mm256_storeu_ps(s + j, e);
        lanes = _mm256_add_ps(lanes, e);
    }
    float total = hsum8_pairs(lanes);
    for (; j < n; j++) { float d = s[j] - m; s[j] = d < SOFTMAX_CUTOFF ? 0.0f : exp_scalar(d); total += s[j]; }
    return total;
}

/* Four queries of a sequence at once (every query of a layer without a window sees all n keys): each key and value
 * row is read once for the four, which quarters the K/V traffic from L2 that bounds one query at a time; per
 * output the arithmetic is the single query's (scores: eight fma lanes, hsum8_pairs order; weighted sum: one fma
 * chain over the keys from 0), so a query's bits do not depend on whether it was in a block. */
#define QBLOCK 4

ENC_AVX2 static void scores4_avx2(const float *q, int q_stride, const float *k, int stride, int n, int hd,
                                  float scale, float *s) {
    const float *q0 = q, *q1 = q + q_stride, *q2 = q1 + q_stride, *q3 = q2 + q_stride;
    for (int j = 0; j < n; j++) {
        const float *kj = k + (size_t)j * stride;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int g = 0; g < hd; g += 8) {
            __m256 kv = _mm256_loadu_ps(kj + g);
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q0 + g), kv, a0);
            a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q1 + g), kv, a1);
            a2 = _mm256_fmadd_ps(_mm256_loadu_ps(q2 + g), kv, a2);
            a3 = _mm256_fmadd_ps(_mm256_loadu_ps(q3 + g), kv, a3);
        }
        float r[4];
        _mm_storeu_ps(r, _mm_mul_ps(hsum4x8_pairs(a0, a1, a2, a3), _mm_set1_ps(scale)));
        for (int i = 0; i < QBLOCK; i++) s[(size_t)i * n + j] = r[i];
    }
}

/* out row i = inv[i] * sum_j p[i][j] v_j for four queries, 16 lanes per pass over the keys (8 accumulators) */
ENC_AVX2 static void weighted_sum4_avx2(const float *p, const float *v, int stride, int n, int hd, const float *inv,
                                        float *out, int out_stride) {
    for (int d0 = 0; d0 < hd; d0 += 16) {
        __m256 a[QBLOCK][2];
        for (int i = 0; i < QBLOCK; i++) a[i][0] = a[i][1] = _mm256_setzero_ps();
        for (int j = 0; j < n; j++) {
            const float *vj = v + (size_t)j * stride + d0;
            __m256 v0 = _mm256_loadu_ps(vj), v1 = _mm256_loadu_ps(vj + 8);
            for (int i = 0; i < QBLOCK; i++) {
                __m256 w = _mm256_set1_ps(p[(size_t)i * n + j]);
                a[i][0] = _mm256_fmadd_ps(w, v0, a[i][0]);
                a[i][1] = _mm256_fmadd_ps(w, v1, a[i][1]);
            }
        }
        for (int i = 0; i < QBLOCK; i++) {
            __m256 sc = _mm256_set1_ps(inv[i]);
            _mm256_storeu_ps(out + (size_t)i * out_stride + d0, _mm256_mul_ps(a[i][0], sc));
            _mm256_storeu_ps(out + (size_t)i * out_stride + d0 + 8, _mm256_mul_ps(a[i][1], sc));
        }
    }
}

/* hd is a multiple of 8; up to 32 lanes of output stay in registers per pass over the keys */
ENC_AVX2 static void weighted_sum_avx2(const float *s, const float *v, int stride, int lo, int hi, int hd,
                                       float inv, float *out) {
    for (int d0 = 0; d0 < hd; d0 += 32) {
        int nv = hd - d0 >= 32 ? 4 : (hd - d0) / 8;
        __m256 o[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
        for (int j = lo; j < hi; j++) {
            __m256 p = _mm256_set1_ps(s[j - lo]);
            const float *vj = v + (size_t)j * stride + d0;
            for (int r = 0; r < nv; r++) o[r] = _mm256_fmadd_ps(p, _mm256_loadu_ps(vj + 8 * r), o[r]);
        }
        for (int r = 0; r < nv; r++) _mm256_storeu_ps(out + d0 + 8 * r, _mm256_mul_ps(o[r], _mm256_set1_ps(inv)));
    }
}
#endif

/* ---------------- entry points ---------------- */

void gelu_erf(float *x, int n) {
#if defined(__x86_64__)
    if (cpu_path() != PATH_SCALAR) { gelu_erf_avx2(x, n); return; }
#endif
    gelu_erf_scalar(x, n);
}

void attention_bidir(const float *q, const float *k, const float *v, int q_stride, int kv_stride, int n, int hd,
                     float scale, int window, float *out, int out_stride, float *scores) {
    int simd = 0;
#if defined(__x86_64__)
    simd = cpu_path() != PATH_SCALAR;
#endif
    int i = 0;
#if defined(__x86_64__)
    if (simd && (window <= 0 || window >= n) && hd % 16 == 0)     /* every query sees all n keys */
        for (; i + QBLOCK <= n; i += QBLOCK) {
            float inv[QBLOCK];
            scores4_avx2(q + (size_t)i * q_stride, q_stride, k, kv_stride, n, hd, scale, scores);
            for (int b = 0; b < QBLOCK; b++) {
                float *sb = scores + (size_t)b * n;
                inv[b] = 1.0f / softmax_weights_avx2(sb, n, max_scores_avx2(sb, n));
            }
            weighted_sum4_avx2(scores, v, kv_stride, n, hd, inv, out + (size_t)i * out_stride, out_stride);
        }
#endif
    for (; i < n; i++) {
        int lo = 0, hi = n;
        if (window > 0) {                      /* keys within window - 1 positions on either side */
            lo = i - window + 1 > 0 ? i - window + 1 : 0;
            hi = i + window < n ? i + window : n;
        }
        const float *qi = q + (size_t)i * q_stride;
        float *oi = out + (size_t)i * out_stride;
#if defined(__x86_64__)
        if (simd) {
            scores_avx2(qi, k, kv_stride, lo, hi, hd, scale, scores);
            float total = softmax_weights_avx2(scores, hi - lo, max_scores_avx2(scores, hi - lo));
            weighted_sum_avx2(scores, v, kv_stride, lo, hi, hd, 1.0f / total, oi);
            continue;
        }
#endif
        (void)simd;
        scores_scalar(qi, k, kv_stride, lo, hi, hd, scale, scores);
        float total = softmax_weights_scalar(scores, hi - lo, max_scores(scores, hi - lo));
        weighted_sum_scalar(scores, v, kv_stride, lo, hi, hd, 1.0f / total, oi);
    }
}
