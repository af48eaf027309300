/* Quantization: activations to 8-bit blocks, float rows to GGUF blocks (the tiles are built in repack.c). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "inferd.h"
#include "type_traits.h"
#if defined(__x86_64__)
#include <immintrin.h>
#endif

/* ---- activations ---- */

/* the block's integer sum and the corrections the kernels start from (see block_q8x) */
static inline void set_sums(block_q8x *o, int32_t isum, int32_t lo16) {
    o->isum = isum;
    o->hsum[0] = (int16_t)lo16;
    o->hsum[1] = (int16_t)(isum - lo16);
    o->q6_corr[0] = -32 * lo16;
    o->q6_corr[1] = -32 * (isum - lo16);
    o->dsum = o->d * (float)isum;
    o->q4_corr = -8 * isum;
    o->q8_corr = -128 * isum;
}

/* q = nearbyint(x * (127 / amax)) in round-to-nearest-even, which is what cvtps2dq does, so the SIMD
 * routine below writes exactly these bytes. */
static void quantize_act_scalar(const float *x, int n, block_q8x *out, size_t stride) {
    for (int b = 0; b < n / QK; b++) {
        const float *xb = x + b * QK;
        block_q8x *o = out + (size_t)b * stride;
        float amax = 0.0f;
        for (int i = 0; i < QK; i++) amax = fmaxf(amax, fabsf(xb[i]));
        float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        int32_t isum = 0, lo16 = 0;
        for (int i = 0; i < QK; i++) {
            int q = (int)nearbyintf(xb[i] * id);
            o->qs[i] = (int8_t)q;
            isum += q;
            if (i == 15) lo16 = isum;
        }
        o->d = d;
        set_sums(o, isum, lo16);   /* after d: dsum = d * isum */
    }
}

#if defined(__x86_64__)
__attribute__((target("avx2,fma")))
static void quantize_act_avx2(const float *x, int n, block_q8x *out, size_t stride) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int b = 0; b < n / QK; b++) {
        const float *xb = x + b * QK;
        block_q8x *o = out + (size_t)b * stride;
        __m256 v0 = _mm256_loadu_ps(xb), v1 = _mm256_loadu_ps(xb + 8);
        __m256 v2 = _mm256_loadu_ps(xb + 16), v3 = _mm256_loadu_ps(xb + 24);
        __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v0), _mm256_andnot_ps(sign, v1)),
                                 _mm256_max_ps(_mm256_andnot_ps(sign, v2), _mm256_andnot_ps(sign, v3)));
        __m128 m4 = _mm_max_ps(_mm256_extractf128_ps(m, 1), _mm256_castps256_ps128(m));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        float amax = _mm_cvtss_f32(m4);
        float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        __m256 vid = _mm256_set1_ps(id);
        __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(v0, vid)), i1 = _mm256_cvtps_epi32(_mm256_mul_ps(v1, vid));
        __m256i i2 = _mm256_cvtps_epi32(_mm256_mul_ps(v2, vid)), i3 = _mm256_cvtps_epi32(_mm256_mul_ps(v3, vid));
        __m256i s = _mm256_add_epi32(i0, i1);                       /* values 0-15 */
        __m128i s4 = _mm_add_epi32(_mm256_extracti128_si256(s, 1), _mm256_castsi256_si128(s));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
        int32_t lo16 = _mm_cvtsi128_si32(s4);
        s = _mm256_add_epi32(i2, i3);                               /* values 16-31 */
        s4 = _mm_add_epi32(_mm256_extracti128_si256(s, 1), _mm256_castsi256_si128(s));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
        /* pack to int8 keeping order: packs works per 128-bit lane, so fix the order with a permute */
        __m256i p16a = _mm256_packs_epi32(i0, i1), p16b = _mm256_packs_epi32(i2, i3);
        __m256i p8 = _mm256_packs_epi16(p16a, p16b);
        p8 = _mm256_permutevar8x32_epi32(p8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256((__m256i *)o->qs, p8);
        o->d = d;
        set_sums(o, lo16 + _mm_cvtsi128_si32(s4), lo16);
    }
}
#endif

void quantize_act_strided(const float *x, int n, block_q8x *out, size_t stride) {
#if defined(__x86_64__)
    if (cpu_path() != PATH_SCALAR) { quantize_act_avx2(x, n, out, stride); return; }
#endif
    quantize_act_scalar(x, n, out, stride);
}

void quantize_act(const float *x, int n, block_q8x *out) { quantize_act_strided(x, n, out, 1); }

/* llama.cpp's reference quantizers of one row (n values) into GGUF blocks, for the type-traits table: Q8_0
 * round(x/d) with d = amax/127; Q4_0 maps the largest-magnitude value to -8; Q4_1 spans [min, max] in 15 steps. */
void quantize_row_q8_0(const float *x, int n, uint8_t *o) {
    for (int b = 0; b < n / QK; b++) {
        const float *xb = x + b * QK;
        float amax = 0.0f;
        for (int i = 0; i < QK; i++) amax = fmaxf(amax, fabsf(xb[i]));
        float d = amax / 127.0f, id = d ? 1.0f / d : 0.0f;
        uint16_t dh = f32_to_f16(d);
        memcpy(o + b * 34, &dh, 2);
        for (int i = 0; i < QK; i++) o[b * 34 + 2 + i] = (uint8_t)(int8_t)roundf(xb[i] * id);
    }
}

void quantize_row_q4_0(const float *x, int n, uint8_t *o) {
    for (int b = 0; b < n / QK; b++) {
        const float *xb = x + b * QK;
        float amax = 0.0f, max = 0.0f;
        for (int i = 0; i < QK; i++)
            if (fabsf(xb[i]) > amax) { amax = fabsf(xb[i]); max = xb[i]; }
        float d = max / -8.0f, id = d ? 1.0f / d : 0.0f;
        uint16_t dh = f32_to_f16(d);
        memcpy(o + b * 18, &dh, 2);
        for (int i = 0; i < QK / 2; i++) {
            int q0 = (int)(xb[i] * id + 8.5f), q1 = (int)(xb[i + 16] * id + 8.5f);
            q0 = q0 > 15 ? 15 : q0; q1 = q1 > 15 ? 15 : q1;
            o[b * 18 + 2 + i] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}

void quantize_row_q4_1(const float *x, int n, uint8_t *o) {
    for (int b = 0; b < n / QK; b++) {
        const float *xb = x + b * QK;
        float mn = xb[0], mx = xb[0];
        for (int i = 1; i < QK; i++) { mn = fminf(mn, xb[i]); mx = fmaxf(mx, xb[i]); }
        float d = (mx - mn) / 15.0f, id = d ? 1.0f / d : 0.0f;
        uint16_t dh = f32_to_f16(d), mh = f32_to_f16(mn);
        memcpy(o + b * 20, &dh, 2);
        memcpy(o + b * 20 + 2, &mh, 2);
        for (int i = 0; i < QK / 2; i++) {
            int q0 = (int)((xb[i] - mn) * id + 0.5f), q1 = (int)((xb[i + 16] - mn) * id + 0.5f);
            q0 = q0 > 15 ? 15 : q0; q1 = q1 > 15 ? 15 : q1;
            o[b * 20 + 4 + i] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}

/* the types whose row of the table has a quantizer; -1 for the others */
int quantize_rows_gguf(const float *x, int rows, int cols, int type, uint8_t *out) {
    const type_traits_t *tt = type_traits(type);
    if (cols % QK || !tt || !tt->quantize_row) return -1;
    size_t rb = gguf_row_bytes(type, cols);
    for (int r = 0; r < rows; r++) tt->quantize_row(x + (size_t)r * cols, cols, out + (size_t)r * rb);
    return 0;
}
