/* Causal attention of one query token over the paged f16 KV cache, for the query heads of one KV head.
 * Online softmax over 64-position blocks in a fixed order, so a token's output is the same whatever else is
 * in the batch. Each block's keys and values are converted to f32 once and shared by the query heads of the
 * group. The helpers have scalar and AVX2 variants with the same operations in the same order (dot products
 * summed in hsum8_pairs' order, vecmath's exp), so both paths give the same bits. */
#include <math.h>
#include <string.h>
#include "inferd.h"
#include "vecmath.h"

/* Softmax weights below e^-64 of the largest are set to 0: they cannot change a float32 sum that holds a 1, and
 * their products with V would be denormals, which cost a hundred cycles each. */
#define SOFTMAX_CUTOFF -64.0f

static inline float softmax_weight(float x) { return x < SOFTMAX_CUTOFF ? 0.0f : exp_scalar(x); }

static void to_f32_scalar(const uint16_t *h, float *f, int n) {
    for (int i = 0; i < n; i++) f[i] = f16_to_f32(h[i]);
}

/* s[j] = scale * dot(q, k_j) for the n keys (n, hd) of a block */
static void scores_scalar(const float *q, const float *k, int n, int hd, float scale, float *s) {
    for (int j = 0; j < n; j++) {
        float a[8] = {0};
        for (int g = 0; g < hd / 8; g++)
            for (int l = 0; l < 8; l++) a[l] = __builtin_fmaf(q[8 * g + l], k[(size_t)j * hd + 8 * g + l], a[l]);
        s[j] = hsum8_pairs_scalar(a) * scale;
    }
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

/* out (hd) += sum_j p[j] * v_j */
static void accumulate_v_scalar(const float *p, const float *v, int n, int hd, float *out) {
    for (int j = 0; j < n; j++)
        for (int i = 0; i < hd; i++) out[i] = __builtin_fmaf(p[j], v[(size_t)j * hd + i], out[i]);
}

#if defined(__x86_64__)
__attribute__((target("avx2,fma,f16c")))
static void to_f32_avx2(const uint16_t *h, float *f, int n) {
    for (int i = 0; i < n; i += 8) _mm256_storeu_ps(f + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i))));
}

/* Eight keys scored side by side: eight independent fma chains instead of one long one; each key still sums
 * its products in the scalar order. */
__attribute__((target("avx2,fma,f16c")))
static void scores_avx2(const float *q, const float *k, int n, int hd, float scale, float *s) {
    int j = 0;
    for (; j + 8 <= n; j += 8) {
        __m256 part[8];
        for (int c = 0; c < 8; c++) part[c] = _mm256_setzero_ps();
        for (int g = 0; g < hd / 8; g++) {
            __m256 qg = _mm256_loadu_ps(q + 8 * g);
            for (int c = 0; c < 8; c++)
                part[c] = _mm256_fmadd_ps(qg, _mm256_loadu_ps(k + (size_t)(j + c) * hd + 8 * g), part[c]);
        }
        _mm256_storeu_ps(s + j, _mm256_mul_ps(hsum8x8_pairs(part), _mm256_set1_ps(scale)));
    }
    for (; j < n; j++) {
        __m256 a = _mm256_setzero_ps();
        for (int g = 0; g < hd / 8; g++)
            a = _mm256_fmadd_ps(_mm256_loadu_ps(q + 8 * g), _mm256_loadu_ps(k + (size_t)j * hd + 8 * g), a);
        s[j] = hsum8_pairs(a) * scale;
    }
}

__attribute__((target("avx2,fma,f16c")))
static float weights_avx2(float *s, int n, float m) {
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

/* 64 output values at a time, kept in eight registers across the block's keys */
__attribute__((target("avx2,fma,f16c")))
static void accumulate_v_avx2(const float *p, const float *v, int n, int hd, float *out) {
    for (int d = 0; d < hd; d += 64) {
        __m256 o[8];
        for (int i = 0; i < 8; i++) o[i] = _mm256_loadu_ps(out + d + 8 * i);
        for (int j = 0; j < n; j++) {
            __m256 pj = _mm256_set1_ps(p[j]);
            const float *vj = v + (size_t)j * hd + d;
            for (int i = 0; i < 8; i++) o[i] = _mm256_fmadd_ps(pj, _mm256_loadu_ps(vj + 8 * i), o[i]);
        }
        for (int i = 0; i < 8; i++) _mm256_storeu_ps(out + d + 8 * i, o[i]);
    }
}
#endif

size_t attention_scratch_floats(int n_heads, int head_dim) {
    return KV_BLOCK + 2 * ATTN_MAX_TOKENS * n_heads + 2 * KV_BLOCK * head_dim;
}

/* A run of ntok consecutive tokens of one sequence, the first attending to positions [0, ctx_len), the next to
 * one more, and so on; for the query heads of one KV head. Each KV block is converted to f32 once for the whole
 * run; every token and head still goes through the blocks in the same order as it would alone.
 * q: rows of `q_stride` floats, (group, head_dim) at the start of each; out: rows of `out_stride` floats;
 * k_head/v_head: one layer's cache addressed as (block, n_kv_heads, KV_BLOCK, head_dim) with this head's offset
 * applied; scratch: attention_scratch_floats(group, head_dim). head_dim is a multiple of 64. */
void attention_tokens(const float *q, int q_stride, int ntok, int group, int n_kv_heads, int head_dim,
                      const uint16_t *k_head, const uint16_t *v_head, const int32_t *block_table, int ctx_len,
                      float *out, int out_stride, float *scratch) {
    void (*to_f32)(const uint16_t *, float *, int) = to_f32_scalar;
    void (*scores)(const float *, const float *, int, int, float, float *) = scores_scalar;
    float (*weights)(float *, int, float) = weights_scalar;
    void (*accumulate_v)(const float *, const float *, int, int, float *) = accumulate_v_scalar;
#if defined(__x86_64__)
    if (cpu_path() != PATH_SCALAR) {
        to_f32 = to_f32_avx2; scores = scores_avx2; weights = weights_avx2; accumulate_v = accumulate_v_avx2;
    }
#endif
    float scale = 1.0f / sqrtf((float)head_dim);
    float *s = scratch, *mx = s + KV_BLOCK, *sum = mx + ntok * group;     /* (ntok, group) each */
    float *kf = sum + ntok * group, *vf = kf + KV_BLOCK * head_dim;      /* (KV_BLOCK, head_dim) each */
    size_t block_stride = (size_t)n_kv_heads * KV_BLOCK * head_dim;
    int last_ctx = ctx_len + ntok - 1;
    for (int i = 0; i < ntok * group; i++) { mx[i] = -INFINITY; sum[i] = 0.0f; }
    for (int t = 0; t < ntok; t++) memset(out + (size_t)t * out_stride, 0, (size_t)group * head_dim * sizeof(float));
    for (int blk = 0; blk * KV_BLOCK < last_ctx; blk++) {
        int n_max = last_ctx - blk * KV_BLOCK < KV_BLOCK ? last_ctx - blk * KV_BLOCK : KV_BLOCK;
        if ((blk + 1) * KV_BLOCK < last_ctx) {        /* the next block is elsewhere in memory: fetch it early */
            const char *nk = (const char *)(k_head + (size_t)block_table[blk + 1] * block_stride);
            const char *nv = (const char *)(v_head + (size_t)block_table[blk + 1] * block_stride);
            for (size_t off = 0; off < (size_t)KV_BLOCK * head_dim * 2; off += 64) {
                __builtin_prefetch(nk + off);
                __builtin_prefetch(nv + off);
            }
        }
        to_f32(k_head + (size_t)block_table[blk] * block_stride, kf, n_max * head_dim);
        to_f32(v_head + (size_t)block_table[blk] * block_stride, vf, n_max * head_dim);
        for (int t = 0; t < ntok; t++) {
            int n = ctx_len + t - blk * KV_BLOCK;
            if (n <= 0) continue;
            if (n > KV_BLOCK) n = KV_BLOCK;
            for (int g = 0; g < group; g++) {
                int i = t * group + g;
                float *og = out + (size_t)t * out_stride + (size_t)g * head_dim;
                scores(q + (size_t)t * q_stride + (size_t)g * head_dim, kf, n, head_dim, scale, s);
                float m = s[0];
                for (int j = 1; j < n; j++) m = fmaxf(m, s[j]);
                if (m > mx[i]) {                       /* a new maximum: rescale what was summed so far */
                    float corr = mx[i] == -INFINITY ? 0.0f : softmax_weight(mx[i] - m);
                    sum[i] *= corr;
                    for (int d = 0; d < head_dim; d++) og[d] *= corr;
                    mx[i] = m;
                }
                sum[i] += weights(s, n, mx[i]);
                accumulate_v(s, vf, n, head_dim, og);
            }
        }
    }
    for (int t = 0; t < ntok; t++)
        for (int g = 0; g < group; g++) {
            float inv = 1.0f / sum[t * group + g], *og = out + (size_t)t * out_stride + (size_t)g * head_dim;
            for (int d = 0; d < head_dim; d++) og[d] *= inv;
        }
}
