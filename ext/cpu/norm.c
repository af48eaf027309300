/* Row-wise operations around the matmuls: RMSNorm, SwiGLU, GeGLU and gpt-oss's clamped SwiGLU. Scalar and AVX2
 * variants use the same operations in the same order (8 lanes, hsum8_pairs, vecmath's exp), so the paths give the same bits. */
#include <math.h>
#include "inferd.h"
#include "vecmath.h"

static void rmsnorm_scalar(const float *x, const float *gamma, int n, float eps, float *out) {
    float a[8] = {0};
    for (int i = 0; i < n; i += 8)
        for (int l = 0; l < 8; l++) a[l] = __builtin_fmaf(x[i + l], x[i + l], a[l]);
    float scale = 1.0f / sqrtf(hsum8_pairs_scalar(a) / (float)n + eps);
    for (int i = 0; i < n; i++) out[i] = (x[i] * scale) * gamma[i];
}

static void swiglu_scalar(const float *g, const float *u, float *h, int n) {
    for (int i = 0; i < n; i++) h[i] = g[i] / (1.0f + exp_scalar(-g[i])) * u[i];
}

/* tanh GELU as x * sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3): 0.5 (1 + tanh(u)) == 1 / (1 + exp(-2u)), so the
 * one exp of SwiGLU serves (exp(-2u) saturates to inf for very negative x, where the result is the right -0) */
#define GELU_C0 1.5957691216057308f          /* 2 sqrt(2/pi) */
#define GELU_C1 0.0713548162726009f          /* 2 sqrt(2/pi) 0.044715 */

static void geglu_scalar(const float *g, const float *u, float *h, int n) {
    for (int i = 0; i < n; i++) {
        float x = g[i], z = x * __builtin_fmaf(x * x, GELU_C1, GELU_C0);
        h[i] = x / (1.0f + exp_scalar(-z)) * u[i];
    }
}

/* gpt-oss's clamped SwiGLU, with llama.cpp's constants */
#define OAI_ALPHA 1.702f
#define OAI_LIMIT 7.0f

static void swiglu_oai_scalar(const float *g, const float *u, float *h, int n) {
    for (int i = 0; i < n; i++) {
        float x = fminf(g[i], OAI_LIMIT), y = fminf(fmaxf(u[i], -OAI_LIMIT), OAI_LIMIT);
        h[i] = x / (1.0f + exp_scalar(-(OAI_ALPHA * x))) * (y + 1.0f);
    }
}

#if defined(__x86_64__)
__attribute__((target("avx2,fma,f16c")))
static void swiglu_oai_avx2(const float *g, const float *u, float *h, int n) {
    const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps(), alpha = _mm256_set1_ps(OAI_ALPHA);
    const __m256 hi = _mm256_set1_ps(OAI_LIMIT), lo = _mm256_set1_ps(-OAI_LIMIT);
    for (int i = 0; i < n; i += 8) {
        /* min/max with the operand order of fminf/fmaxf on ordinary values (a NaN input is not defined here) */
        __m256 x = _mm256_min_ps(_mm256_loadu_ps(g + i), hi);
        __m256 y = _mm256_min_ps(_mm256_max_ps(_mm256_loadu_ps(u + i), lo), hi);
        __m256 e = exp8(_mm256_sub_ps(zero, _mm256_mul_ps(alpha, x)));
        _mm256_storeu_ps(h + i, _mm256_mul_ps(_mm256_div_ps(x, _mm256_add_ps(one, e)), _mm256_add_ps(y, one)));
    }
}

__attribute__((target("avx2,fma,f16c")))
static void geglu_avx2(const float *g, const float *u, float *h, int n) {
    const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
    const __m256 c0 = _mm256_set1_ps(GELU_C0), c1 = _mm256_set1_ps(GELU_C1);
    for (int i = 0; i < n; i += 8) {
        __m256 x = _mm256_loadu_ps(g + i);
        __m256 z = _mm256_mul_ps(x, _mm256_fmadd_ps(_mm256_mul_ps(x, x), c1, c0));
        __m256 e = exp8(_mm256_sub_ps(zero, z));
        _mm256_storeu_ps(h + i, _mm256_mul_ps(_mm256_div_ps(x, _mm256_add_ps(one, e)), _mm256_loadu_ps(u + i)));
    }
}

__attribute__((target("avx2,fma,f16c")))
static void rmsnorm_avx2(const float *x, const float *gamma, int n, float eps, float *out) {
    __m256 a = _mm256_setzero_ps();
    for (int i = 0; i < n; i += 8) { __m256 v = _mm256_loadu_ps(x + i); a = _mm256_fmadd_ps(v, v, a); }
    float scale = 1.0f / sqrtf(hsum8_pairs(a) / (float)n + eps);
    __m256 vs = _mm256_set1_ps(scale);
    for (int i = 0; i < n; i += 8)
        _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), vs), _mm256_loadu_ps(gamma + i)));
}

__attribute__((target("avx2,fma,f16c")))
static void swiglu_avx2(const float *g, const float *u, float *h, int n) {
    const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
    for (int i = 0; i < n; i += 8) {
        __m256 gv = _mm256_loadu_ps(g + i);
        __m256 e = exp8(_mm256_sub_ps(zero, gv));
        _mm256_storeu_ps(h + i, _mm256_mul_ps(_mm256_div_ps(gv, _mm256_add_ps(one, e)), _mm256_loadu_ps(u + i)));
    }
}
#endif

/* n is a multiple of 8 (model dimensions are multiples of 32) */
void rmsnorm(const float *x, const float *gamma, int n, float eps, float *out) {
#if defined(__x86_64__)
    if (cpu_path() != PATH_SCALAR) { rmsnorm_avx2(x, gamma, n, eps, out); return; }
#endif
    rmsnorm_scalar(x, gamma, n, eps, out);
}

void swiglu(const float *g, const float *u, float *h, int n) {
#if defined(__x86_64__)
    if (cpu_path() != PATH_SCALAR) { swiglu_avx2(g, u, h, n); return; }
#endif
    swiglu_scalar(g, u, h, n);
}

void swiglu_oai(const float *g, const float *u, float *h, int n) {
#if defined(__x86_64__)
    if (cpu_path() != PATH_SCALAR) { swiglu_oai_avx2(g, u, h, n); return; }
#endif
    swiglu_oai_scalar(g, u, h, n);
}

void geglu(const float *g, const float *u, float *h, int n) {
#if defined(__x86_64__)
    if (cpu_path() != PATH_SCALAR) { geglu_avx2(g, u, h, n); return; }
#endif
    geglu_scalar(g, u, h, n);
}
