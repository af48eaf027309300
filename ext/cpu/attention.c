/* Causal attention of one query token over the paged f16 KV cache, for the query heads of one KV head.
 * Online softmax over 64-position blocks in a fixed order, so a token's output is the same whatever else
 * is in the batch. The dot and axpy helpers have scalar and F16C variants with the same operation order. */
#include <math.h>
#include <string.h>
#include "inferd.h"
#if defined(__x86_64__)
#include <immintrin.h>
#endif

static float dot_f16_scalar(const float *q, const uint16_t *k, int n) {
    float a[8] = {0};
    for (int g = 0; g < n / 8; g++)
        for (int l = 0; l < 8; l++) a[l] = __builtin_fmaf(q[8 * g + l], f16_to_f32(k[8 * g + l]), a[l]);
    return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
}

static void axpy_f16_scalar(float p, const uint16_t *v, float *out, int n) {
    for (int i = 0; i < n; i++) out[i] = __builtin_fmaf(p, f16_to_f32(v[i]), out[i]);
}

#if defined(__x86_64__)
__attribute__((target("avx2,fma,f16c"))) static float dot_f16_avx2(const float *q, const uint16_t *k, int n) {
    __m256 a = _mm256_setzero_ps();
    for (int g = 0; g < n / 8; g++)
        a = _mm256_fmadd_ps(_mm256_loadu_ps(q + 8 * g), _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(k + 8 * g))), a);
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

__attribute__((target("avx2,fma,f16c"))) static void axpy_f16_avx2(float p, const uint16_t *v, float *out, int n) {
    __m256 vp = _mm256_set1_ps(p);
    for (int i = 0; i < n; i += 8)
        _mm256_storeu_ps(out + i, _mm256_fmadd_ps(vp, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(v + i))),
                                                  _mm256_loadu_ps(out + i)));
}
#endif

/* q: (group, head_dim) query heads sharing this KV head; k_head/v_head: the cache of one layer, addressed
 * as (block, n_kv_heads, KV_BLOCK, head_dim) with this head's offset applied; out: (group, head_dim);
 * scratch: group * (KV_BLOCK + 2) floats. */
void attention_token(const float *q, int group, int n_kv_heads, int head_dim, const uint16_t *k_head,
                     const uint16_t *v_head, const int32_t *block_table, int ctx_len, float *out, float *scratch) {
    int simd = 0;
#if defined(__x86_64__)
    simd = cpu_path() != PATH_SCALAR;
#endif
    float scale = 1.0f / sqrtf((float)head_dim);
    float *scores = scratch, *mx = scratch + KV_BLOCK, *sum = mx + group;
    size_t block_stride = (size_t)n_kv_heads * KV_BLOCK * head_dim;
    for (int g = 0; g < group; g++) { mx[g] = -INFINITY; sum[g] = 0.0f; }
    memset(out, 0, (size_t)group * head_dim * sizeof(float));
    for (int blk = 0; blk * KV_BLOCK < ctx_len; blk++) {
        int n = ctx_len - blk * KV_BLOCK < KV_BLOCK ? ctx_len - blk * KV_BLOCK : KV_BLOCK;
        const uint16_t *kb = k_head + (size_t)block_table[blk] * block_stride;
        const uint16_t *vb = v_head + (size_t)block_table[blk] * block_stride;
        for (int g = 0; g < group; g++) {
            const float *qg = q + (size_t)g * head_dim;
            float *og = out + (size_t)g * head_dim;
            float m = -INFINITY;
            for (int j = 0; j < n; j++) {
                const uint16_t *kj = kb + (size_t)j * head_dim;
#if defined(__x86_64__)
                float d = simd ? dot_f16_avx2(qg, kj, head_dim) : dot_f16_scalar(qg, kj, head_dim);
#else
                float d = dot_f16_scalar(qg, kj, head_dim);
#endif
                scores[j] = d * scale;
                m = fmaxf(m, scores[j]);
            }
            if (m > mx[g]) {
                float corr = expf(mx[g] - m);
                sum[g] *= corr;
                for (int i = 0; i < head_dim; i++) og[i] *= corr;
                mx[g] = m;
            }
            for (int j = 0; j < n; j++) {
                float p = expf(scores[j] - mx[g]);
                sum[g] += p;
                const uint16_t *vj = vb + (size_t)j * head_dim;
#if defined(__x86_64__)
                if (simd) axpy_f16_avx2(p, vj, og, head_dim); else axpy_f16_scalar(p, vj, og, head_dim);
#else
                axpy_f16_scalar(p, vj, og, head_dim);
#endif
            }
        }
    }
    for (int g = 0; g < group; g++) {
        float inv = 1.0f / sum[g];
        for (int i = 0; i < head_dim; i++) out[(size_t)g * head_dim + i] *= inv;
    }
}
