/* Kernels that only encoders need: LayerNorm, GELU (erf form) and bidirectional attention over a
 * sequence's own tokens (no KV cache: an encoder sees its whole input at once).
 *
 * As everywhere in the engine, the scalar, AVX2 and AVX-512 variants do the same IEEE operations in the same order,
 * so the paths give the same bits: a score is one fma chain over the head dimension from 0 (the keys transposed
 * once per sequence and head, so that a vector holds consecutive keys and a block of queries shares every load),
 * exp is vecmath's, softmax sums run lane by lane over groups of 8 then over the tail in order, and an output is
 * one fma chain over the keys from 0. */
#include <math.h>
#include "encoder.h"
#include "vecmath.h"
#include "softmax.h"

/* ---------------- LayerNorm: sums lane by lane over groups of 8, the lanes combined by hsum8_pairs; then
 * out = (x - mean) * inv * w + b, three separate roundings per value (the AVX2 variant does the same operations) */

static void layernorm_scalar(const float *x, const float *w, const float *b, int n, float eps, float *out) {
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

/* y[t * ldy + r] += bias[r] for t < nt, r < n */
static void add_bias_scalar(float *y, int ldy, int nt, const float *bias, int n) {
    for (int t = 0; t < nt; t++)
        for (int r = 0; r < n; r++) y[(size_t)t * ldy + r] += bias[r];
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

/* s[j - lo] = scale * (one fma chain over the head dimension from 0) for keys [lo, hi); kt: the keys transposed,
 * value d of key j at kt[d * n + j], so that the SIMD variants hold consecutive keys in their lanes */
static void scores_scalar(const float *q, const float *kt, int n, int lo, int hi, int hd, float scale, float *s) {
    for (int j = lo; j < hi; j++) {
        float a = 0.0f;
        for (int d = 0; d < hd; d++) a = __builtin_fmaf(q[d], kt[(size_t)d * n + j], a);
        s[j - lo] = a * scale;
    }
}

/* kt (hd, n) = the n keys (rows at stride) transposed */
static void transpose_keys(const float *k, int stride, int n, int hd, float *kt) {
    for (int j = 0; j < n; j++)
        for (int d = 0; d < hd; d++) kt[(size_t)d * n + j] = k[(size_t)j * stride + d];
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

ENC_AVX2 static void layernorm_avx2(const float *x, const float *w, const float *b, int n, float eps, float *out) {
    __m256 a = _mm256_setzero_ps();
    for (int i = 0; i < n; i += 8) a = _mm256_add_ps(a, _mm256_loadu_ps(x + i));
    float mean = hsum8_pairs(a) / (float)n;
    const __m256 mv = _mm256_set1_ps(mean);
    a = _mm256_setzero_ps();
    for (int i = 0; i < n; i += 8) {
        __m256 d = _mm256_sub_ps(_mm256_loadu_ps(x + i), mv);
        a = _mm256_add_ps(a, _mm256_mul_ps(d, d));
    }
    float inv = 1.0f / sqrtf(hsum8_pairs(a) / (float)n + eps);
    const __m256 iv = _mm256_set1_ps(inv);
    for (int i = 0; i < n; i += 8) {
        __m256 d = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), mv), iv);
        _mm256_storeu_ps(out + i, _mm256_add_ps(_mm256_mul_ps(d, _mm256_loadu_ps(w + i)), _mm256_loadu_ps(b + i)));
    }
}

ENC_AVX2 static void add_bias_avx2(float *y, int ldy, int nt, const float *bias, int n) {
    for (int t = 0; t < nt; t++) {
        float *row = y + (size_t)t * ldy;
        int r = 0;
        for (; r + 8 <= n; r += 8) _mm256_storeu_ps(row + r, _mm256_add_ps(_mm256_loadu_ps(row + r), _mm256_loadu_ps(bias + r)));
        for (; r < n; r++) row[r] += bias[r];
    }
}

/* one query, eight keys per vector: lane l is key j + l's fma chain over d (scores_scalar's arithmetic) */
ENC_AVX2 static void scores_avx2(const float *q, const float *kt, int n, int lo, int hi, int hd, float scale,
                                 float *s) {
    int j = lo;
    for (; j + 8 <= hi; j += 8) {
        __m256 a = _mm256_setzero_ps();
        for (int d = 0; d < hd; d++) a = _mm256_fmadd_ps(_mm256_set1_ps(q[d]), _mm256_loadu_ps(kt + (size_t)d * n + j), a);
        _mm256_storeu_ps(s + j - lo, _mm256_mul_ps(a, _mm256_set1_ps(scale)));
    }
    scores_scalar(q, kt, n, j, hi, hd, scale, s + j - lo);
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

/* Four queries of a sequence at once (every query of a layer without a window sees all n keys): each key and value
 * row is read once for the four; per output the arithmetic is the single query's (scores: one fma chain over d;
 * weighted sum: one fma chain over the keys from 0), so a query's bits do not depend on whether it was in a block. */
#define QBLOCK 4

/* s[i * n + j] for queries i < 4 (rows of q at q_stride) and all n keys, 16 keys per pass */
ENC_AVX2 static void scores4_avx2(const float *q, int q_stride, const float *kt, int n, int hd, float scale,
                                  float *s) {
    int j = 0;
    for (; j + 16 <= n; j += 16) {
        __m256 a[QBLOCK][2];
        for (int i = 0; i < QBLOCK; i++) a[i][0] = a[i][1] = _mm256_setzero_ps();
        for (int d = 0; d < hd; d++) {
            __m256 k0 = _mm256_loadu_ps(kt + (size_t)d * n + j), k1 = _mm256_loadu_ps(kt + (size_t)d * n + j + 8);
            for (int i = 0; i < QBLOCK; i++) {
                __m256 qb = _mm256_set1_ps(q[(size_t)i * q_stride + d]);
                a[i][0] = _mm256_fmadd_ps(qb, k0, a[i][0]);
                a[i][1] = _mm256_fmadd_ps(qb, k1, a[i][1]);
            }
        }
        for (int i = 0; i < QBLOCK; i++) {
            _mm256_storeu_ps(s + (size_t)i * n + j, _mm256_mul_ps(a[i][0], _mm256_set1_ps(scale)));
            _mm256_storeu_ps(s + (size_t)i * n + j + 8, _mm256_mul_ps(a[i][1], _mm256_set1_ps(scale)));
        }
    }
    for (int i = 0; i < QBLOCK; i++) scores_avx2(q + (size_t)i * q_stride, kt, n, j, n, hd, scale, s + (size_t)i * n + j);
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

/* ---------------- AVX-512: eight queries at once, 32 keys (scores) or 16 head lanes (weighted sum) per vector pair,
 * the same per-lane arithmetic as above */
#define ENC_AVX512 __attribute__((target("avx2,fma,f16c,avx512f")))
#define QBLOCK8 8

/* zmm wherever the CPU has AVX-512F, except when the AVX2 path is forced (so that tests compare the ymm kernels) */
static int has_avx512(void) {
    static int state = -1;
    if (state < 0) state = __builtin_cpu_supports("avx512f");
    return state && cpu_path() != PATH_AVX2 && cpu_path() != PATH_SCALAR;
}

/* x = gelu(x + bias[i % nb]) over n values (nb, the bias length, a multiple of 16; bias may be NULL), lane by lane
 * gelu_erf_avx2's operations */
ENC_AVX512 static void bias_gelu_erf_avx512(float *x, const float *bias, int nb, int n) {
    const __m512 half = _mm512_set1_ps(0.5f), one = _mm512_set1_ps(1.0f), r2 = _mm512_set1_ps(SQRT1_2);
    const __m512 lo = _mm512_set1_ps(-4.0f), hi = _mm512_set1_ps(4.0f);
    for (int i = 0; i < n; i += 16) {
        __m512 v = _mm512_loadu_ps(x + i);
        if (bias) v = _mm512_add_ps(v, _mm512_loadu_ps(bias + i % nb));
        __m512 z = _mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(v, r2), lo), hi);
        __m512 z2 = _mm512_mul_ps(z, z), p = _mm512_set1_ps(ERF_P[0]), q = _mm512_set1_ps(ERF_Q[0]);
        for (int k = 1; k < 7; k++) p = _mm512_add_ps(_mm512_mul_ps(p, z2), _mm512_set1_ps(ERF_P[k]));
        for (int k = 1; k < 5; k++) q = _mm512_add_ps(_mm512_mul_ps(q, z2), _mm512_set1_ps(ERF_Q[k]));
        __m512 e = _mm512_div_ps(_mm512_mul_ps(z, p), q);
        _mm512_storeu_ps(x + i, _mm512_mul_ps(_mm512_mul_ps(half, v), _mm512_add_ps(one, e)));
    }
}

/* keys [j, j + 16 two + 16) masked by m0, m1 (two: a second vector of keys; inlined with it constant) */
ENC_AVX512 static inline __attribute__((always_inline)) void scores8_keys(const float *q, int q_stride,
                                                                          const float *kt, int ld, int hd, __m512 sc,
                                                                          int j, __mmask16 m0, __mmask16 m1, int two,
                                                                          float *s, __m512 *mx) {
    __m512 a[QBLOCK8][2];
    for (int i = 0; i < QBLOCK8; i++) a[i][0] = a[i][1] = _mm512_setzero_ps();
    for (int d = 0; d < hd; d++) {
        const float *row = kt + (size_t)d * ld + j;
        __m512 k0 = _mm512_load_ps(row), k1 = two ? _mm512_load_ps(row + 16) : k0;
        for (int i = 0; i < QBLOCK8; i++) {
            __m512 qb = _mm512_set1_ps(q[(size_t)i * q_stride + d]);
            a[i][0] = _mm512_fmadd_ps(qb, k0, a[i][0]);
            if (two) a[i][1] = _mm512_fmadd_ps(qb, k1, a[i][1]);
        }
    }
    for (int i = 0; i < QBLOCK8; i++) {
        __m512 s0 = _mm512_mul_ps(a[i][0], sc);
        _mm512_store_ps(s + (size_t)i * ld + j, s0);
        mx[i] = _mm512_mask_max_ps(mx[i], m0, s0, mx[i]);
        if (two) {
            __m512 s1 = _mm512_mul_ps(a[i][1], sc);
            _mm512_store_ps(s + (size_t)i * ld + j + 16, s1);
            mx[i] = _mm512_mask_max_ps(mx[i], m1, s1, mx[i]);
        }
    }
}

/* s[i * ld + j] for queries i < 8 and keys j < ld (past n: 0, the keys' padding); m[i] = the largest of query
 * i's n scores (a maximum is exact: max_scores' value, taken here while the scores are in registers) */
ENC_AVX512 static void scores8_avx512(const float *q, int q_stride, const float *kt, int ld, int n, int hd,
                                      float scale, float *s, float *m) {
    const __m512 sc = _mm512_set1_ps(scale);
    __m512 mx[QBLOCK8];
    for (int i = 0; i < QBLOCK8; i++) mx[i] = _mm512_set1_ps(-INFINITY);
    for (int j = 0; j < n; j += 32) {
        int left = n - j;
        __mmask16 m0 = left >= 16 ? 0xffff : (__mmask16)((1u << left) - 1);
        __mmask16 m1 = left >= 32 ? 0xffff : left > 16 ? (__mmask16)((1u << (left - 16)) - 1) : 0;
        if (left > 16) scores8_keys(q, q_stride, kt, ld, hd, sc, j, m0, m1, 1, s, mx);
        else scores8_keys(q, q_stride, kt, ld, hd, sc, j, m0, 0, 0, s, mx);
    }
    for (int i = 0; i < QBLOCK8; i++) {
        float lanes[16], out = -INFINITY;
        _mm512_storeu_ps(lanes, mx[i]);
        for (int l = 0; l < 16; l++) out = lanes[l] > out ? lanes[l] : out;
        m[i] = out;
    }
}

/* weights_avx512 for the eight queries of a block, their steps interleaved (each query's lane sums are one chain
 * of dependent adds; eight chains side by side keep the adders busy): per query the same operations in the same
 * order, so the same bits. inv[i] = 1 / query i's sum. */
ENC_AVX512 static void weights8_avx512(float *s, int ld, int n, const float *m, float *inv) {
    __m256 lanes[QBLOCK8];
    __m512 mv[QBLOCK8];
    for (int i = 0; i < QBLOCK8; i++) { lanes[i] = _mm256_setzero_ps(); mv[i] = _mm512_set1_ps(m[i]); }
    int j = 0;
    for (; j + 16 <= n; j += 16)
        for (int i = 0; i < QBLOCK8; i++) {
            float *si = s + (size_t)i * ld + j;
            __m512 x = _mm512_sub_ps(_mm512_load_ps(si), mv[i]);
            __mmask16 keep = _mm512_cmp_ps_mask(x, _mm512_set1_ps(SOFTMAX_CUTOFF), _CMP_GE_OQ);
            __m512 w = _mm512_maskz_mov_ps(keep, exp16(x));
            _mm512_store_ps(si, w);
            lanes[i] = _mm256_add_ps(lanes[i], _mm512_castps512_ps256(w));
            lanes[i] = _mm256_add_ps(lanes[i], _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(w), 1)));
        }
    /* the last n - j < 16 weights in one masked exp16 (each weight is the same value whichever exp computes it),
     * then summed as weights_avx512 sums them: a group of 8 into the lanes, the lanes combined, the rest in order */
    int rem = n - j;
    __mmask16 tail = (__mmask16)((1u << rem) - 1);
    for (int i = 0; i < QBLOCK8; i++) {
        float *si = s + (size_t)i * ld;
        __m256 l8 = lanes[i];
        int k = j;
        if (rem) {                                             /* the row's padding is there to be read */
            __m512 x = _mm512_sub_ps(_mm512_load_ps(si + j), mv[i]);
            __mmask16 keep = _mm512_cmp_ps_mask(x, _mm512_set1_ps(SOFTMAX_CUTOFF), _CMP_GE_OQ) & tail;
            __m512 w = _mm512_maskz_mov_ps(keep, exp16(x));
            _mm512_store_ps(si + j, w);
            if (rem >= 8) { l8 = _mm256_add_ps(l8, _mm512_castps512_ps256(w)); k += 8; }
        }
        float total = hsum8_pairs(l8);
        for (; k < n; k++) total += si[k];
        inv[i] = 1.0f / total;
    }
}

/* out row i = inv[i] * (fma chain over the keys from 0 of p[i][j] v_j), 16 lanes of the head per vector */
ENC_AVX512 static void weighted_sum8_avx512(const float *p, int ld, const float *v, int stride, int n, int hd,
                                            const float *inv, float *out, int out_stride) {
    for (int d0 = 0; d0 < hd; d0 += 32) {
        int two = hd - d0 >= 32;
        __m512 a[QBLOCK8][2];
        for (int i = 0; i < QBLOCK8; i++) a[i][0] = a[i][1] = _mm512_setzero_ps();
        for (int j = 0; j < n; j++) {
            const float *vj = v + (size_t)j * stride + d0;
            __m512 v0 = _mm512_loadu_ps(vj), v1 = two ? _mm512_loadu_ps(vj + 16) : v0;
            for (int i = 0; i < QBLOCK8; i++) {
                __m512 w = _mm512_set1_ps(p[(size_t)i * ld + j]);
                a[i][0] = _mm512_fmadd_ps(w, v0, a[i][0]);
                if (two) a[i][1] = _mm512_fmadd_ps(w, v1, a[i][1]);
            }
        }
        for (int i = 0; i < QBLOCK8; i++) {
            __m512 sc = _mm512_set1_ps(inv[i]);
            _mm512_storeu_ps(out + (size_t)i * out_stride + d0, _mm512_mul_ps(a[i][0], sc));
            if (two) _mm512_storeu_ps(out + (size_t)i * out_stride + d0 + 16, _mm512_mul_ps(a[i][1], sc));
        }
    }
}

/* transpose_keys into rows of ld (a multiple of 16 >= n) floats, zeros past n, 16 keys at a time: value d of 16
 * keys by one gather (a copy: the same values). Full rows let every later access be a whole aligned vector (a
 * masked store read back by a load is not forwarded and stalls). */
ENC_AVX512 static void transpose_keys_avx512(const float *k, int stride, int n, int hd, int ld, float *kt) {
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    for (int j = 0; j < n; j += 16) {
        __mmask16 m = n - j >= 16 ? 0xffff : (__mmask16)((1u << (n - j)) - 1);
        __m512i idx = _mm512_mullo_epi32(_mm512_add_epi32(lane, _mm512_set1_epi32(j)), _mm512_set1_epi32(stride));
        for (int d = 0; d < hd; d++)
            _mm512_store_ps(kt + (size_t)d * ld + j, _mm512_mask_i32gather_ps(_mm512_setzero_ps(), m, idx, k + d, 4));
    }
}

/* all n >= 8 queries of the sequence, every one seeing all n keys, in blocks of eight (the last block ends at n,
 * overlapping the one before: its queries get the same bits again); kt and the scores in rows of ENC_PAD(n) */
static void attention_block8_avx512(const float *q, const float *k, const float *v, int q_stride, int kv_stride,
                                    int n, int hd, float scale, float *out, int out_stride, float *scores, float *kt) {
    int ld = ENC_PAD(n);
    transpose_keys_avx512(k, kv_stride, n, hd, ld, kt);
    for (int i = 0; i < n; i += QBLOCK8) {
        if (i + QBLOCK8 > n) i = n - QBLOCK8;
        float m[QBLOCK8], inv[QBLOCK8];
        scores8_avx512(q + (size_t)i * q_stride, q_stride, kt, ld, n, hd, scale, scores, m);
        weights8_avx512(scores, ld, n, m, inv);
        weighted_sum8_avx512(scores, ld, v, kv_stride, n, hd, inv, out + (size_t)i * out_stride, out_stride);
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

void bias_gelu_erf(float *x, const float *bias, int nb, int n) {
#if defined(__x86_64__)
    if (nb % 16 == 0 && n % nb == 0 && has_avx512()) { bias_gelu_erf_avx512(x, bias, nb, n); return; }
#endif
    if (bias) {
        for (int i = 0; i < n; i += nb) add_bias(x + i, nb, 1, bias, nb);
    }
    gelu_erf(x, n);
}

void layernorm(const float *x, const float *w, const float *b, int n, float eps, float *out) {
#if defined(__x86_64__)
    if (cpu_path() != PATH_SCALAR) { layernorm_avx2(x, w, b, n, eps, out); return; }
#endif
    layernorm_scalar(x, w, b, n, eps, out);
}

void add_bias(float *y, int ldy, int nt, const float *bias, int n) {
#if defined(__x86_64__)
    if (cpu_path() != PATH_SCALAR) { add_bias_avx2(y, ldy, nt, bias, n); return; }
#endif
    add_bias_scalar(y, ldy, nt, bias, n);
}

void attention_bidir(const float *q, const float *k, const float *v, int q_stride, int kv_stride, int n, int hd,
                     float scale, int window, float *out, int out_stride, float *scores, float *kt) {
    int simd = 0, all_keys = window <= 0 || window >= n;       /* every query sees all n keys */
#if defined(__x86_64__)
    simd = cpu_path() != PATH_SCALAR;
    if (simd && all_keys && hd % 16 == 0 && n >= QBLOCK8 && has_avx512()) {
        attention_block8_avx512(q, k, v, q_stride, kv_stride, n, hd, scale, out, out_stride, scores, kt);
        return;
    }
#endif
    transpose_keys(k, kv_stride, n, hd, kt);
    int i = 0;
#if defined(__x86_64__)
    if (simd && all_keys && hd % 16 == 0) {
        for (; i + QBLOCK <= n; i += QBLOCK) {
            float inv[QBLOCK];
            scores4_avx2(q + (size_t)i * q_stride, q_stride, kt, n, hd, scale, scores);
            for (int b = 0; b < QBLOCK; b++) {
                float *sb = scores + (size_t)b * n;
                inv[b] = 1.0f / weights_avx2(sb, n, max_scores_avx2(sb, n));
            }
            weighted_sum4_avx2(scores, v, kv_stride, n, hd, inv, out + (size_t)i * out_stride, out_stride);
        }
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
            scores_avx2(qi, kt, n, lo, hi, hd, scale, scores);
            float total = weights_avx2(scores, hi - lo, max_scores_avx2(scores, hi - lo));
            weighted_sum_avx2(scores, v, kv_stride, lo, hi, hd, 1.0f / total, oi);
            continue;
        }
#endif
        (void)simd;
        scores_scalar(qi, kt, n, lo, hi, hd, scale, scores);
        float total = softmax_weights_scalar(scores, hi - lo, max_scores(scores, hi - lo));
        weighted_sum_scalar(scores, v, kv_stride, lo, hi, hd, 1.0f / total, oi);
    }
}
