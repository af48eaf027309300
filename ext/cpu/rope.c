/* Rotary embeddings: per-position tables computed once at load, applied to q and k of each token. The AVX2
 * variant does the same IEEE operations per element (two products, then their difference or sum), so the paths
 * give the same bits. */
#include <math.h>
#include <stdlib.h>
#include "inferd.h"
#if defined(__x86_64__)
#include <immintrin.h>
#endif

/* cos_sin: (head_dim/2, 2) for this position. neox pairs (i, i + head_dim/2) as Hugging Face does;
 * otherwise adjacent pairs (2i, 2i+1), the layout llama.cpp's converter gives llama GGUF files. */
static void rope_scalar(float *vec, int n_heads, int head_dim, const float *cos_sin, int neox) {
    int half = head_dim / 2;
    for (int h = 0; h < n_heads; h++) {
        float *v = vec + h * head_dim;
        for (int i = 0; i < half; i++) {
            float c = cos_sin[2 * i], s = cos_sin[2 * i + 1];
            int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
            float x0 = v[a], x1 = v[b];
            v[a] = x0 * c - x1 * s;
            v[b] = x0 * s + x1 * c;
        }
    }
}

#if defined(__x86_64__)
/* head_dim is a multiple of 16 here, so every group of 8 is whole */
__attribute__((target("avx2,fma,f16c")))
static void rope_avx2(float *vec, int n_heads, int head_dim, const float *cos_sin, int neox) {
    int half = head_dim / 2;
    for (int h = 0; h < n_heads; h++) {
        float *v = vec + h * head_dim;
        if (neox) {
            for (int i = 0; i < half; i += 8) {
                __m256 p = _mm256_loadu_ps(cos_sin + 2 * i), q = _mm256_loadu_ps(cos_sin + 2 * i + 8);
                __m256 c = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(p, q, 0x88)), 0xD8));
                __m256 s = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(p, q, 0xDD)), 0xD8));
                __m256 x0 = _mm256_loadu_ps(v + i), x1 = _mm256_loadu_ps(v + i + half);
                _mm256_storeu_ps(v + i, _mm256_sub_ps(_mm256_mul_ps(x0, c), _mm256_mul_ps(x1, s)));
                _mm256_storeu_ps(v + i + half, _mm256_add_ps(_mm256_mul_ps(x0, s), _mm256_mul_ps(x1, c)));
            }
        } else {
            /* lanes hold pairs (x0, x1): even lanes x0*c - x1*s, odd lanes x1*c + x0*s (the scalar x0*s + x1*c:
             * a sum of the same two products) */
            for (int i = 0; i < head_dim; i += 8) {
                __m256 cs = _mm256_loadu_ps(cos_sin + i), x = _mm256_loadu_ps(v + i);
                __m256 a = _mm256_mul_ps(x, _mm256_moveldup_ps(cs));
                __m256 b = _mm256_mul_ps(_mm256_permute_ps(x, 0xB1), _mm256_movehdup_ps(cs));
                _mm256_storeu_ps(v + i, _mm256_addsub_ps(a, b));
            }
        }
    }
}
#endif

void rope_apply(float *vec, int n_heads, int head_dim, const float *cos_sin, int neox) {
#if defined(__x86_64__)
    if (cpu_path() != PATH_SCALAR && head_dim % 16 == 0) { rope_avx2(vec, n_heads, head_dim, cos_sin, neox); return; }
#endif
    rope_scalar(vec, n_heads, head_dim, cos_sin, neox);
}

/* YaRN's correction dimension of a rotation count (llama.cpp's ggml_rope_yarn_corr_dim) */
static double yarn_corr_dim(const model_config_t *c, int n_dims, double theta, double rotations) {
    return n_dims * log(c->yarn_original_ctx / (rotations * 2 * M_PI)) / (2 * log(theta));
}

/* freqs: (head_dim/2) theta^(-2i/head_dim); Llama 3 scaling stretches the low frequencies by `factor` and blends
 * the middle band, as in Meta's reference code; YaRN (c->yarn_factor > 0) interpolates the frequencies below its
 * correction band by 1/factor, keeps those above it and ramps between (ext_factor weighs the ramp), as llama.cpp's
 * rope_yarn does. Both engines' RoPE comes from here (the CUDA engine gets them through _cpu.rope_frequencies). */
void rope_frequencies(const model_config_t *c, double theta, int llama3, double *freqs) {
    int rd = c->rope_dims ? c->rope_dims : c->head_dim;   /* the rotated dimensions (partial RoPE: fewer) */
    double low = 0, high = 0;
    if (c->yarn_factor > 0) {
        low = floor(yarn_corr_dim(c, rd, theta, c->yarn_beta_fast));
        high = ceil(yarn_corr_dim(c, rd, theta, c->yarn_beta_slow));
        low = low > 0 ? low : 0;
        high = high < rd - 1 ? high : rd - 1;
    }
    for (int i = 0; i < rd / 2; i++) {
        double f = pow(theta, -2.0 * i / rd);
        if (c->yarn_factor > 0) {
            double y = (i - low) / (high - low > 0.001 ? high - low : 0.001);
            double mix = (1 - (y < 0 ? 0 : y > 1 ? 1 : y)) * c->yarn_ext_factor;
            f = f / c->yarn_factor * (1 - mix) + f * mix;
        }
        if (llama3) {
            double low_wl = c->rope_original_ctx / (double)c->rope_low_freq_factor;
            double high_wl = c->rope_original_ctx / (double)c->rope_high_freq_factor;
            double wl = 2.0 * M_PI / f;
            if (wl > low_wl) f /= c->rope_factor;
            else if (wl >= high_wl) {
                double smooth = (c->rope_original_ctx / wl - c->rope_low_freq_factor) /
                                (c->rope_high_freq_factor - c->rope_low_freq_factor);
                f = (1.0 - smooth) * f / c->rope_factor + smooth * f;
            }
        }
        freqs[i] = f;
    }
}

/* YaRN's magnitude on cos and sin (so on q.k twice): attn_factor (1 + 0.1 ln factor) where the ramp is on, as
 * llama.cpp's rope_yarn multiplies it (its context cancels a factor of its own before: the file's attn_factor stays) */
static double yarn_mscale(const model_config_t *c) {
    if (c->yarn_factor <= 0) return 1.0;
    double a = c->yarn_attn_factor > 0 ? c->yarn_attn_factor : 1.0;
    return c->yarn_ext_factor != 0 ? a * (1.0 + 0.1 * log(c->yarn_factor)) : a;
}

/* (context_length, head_dim/2, 2) cos and sin of position * freq_i * pos_scale, times YaRN's magnitude */
static float *rope_table(const model_config_t *c, double theta, double pos_scale, int llama3) {
    int half = (c->rope_dims ? c->rope_dims : c->head_dim) / 2;
    double mscale = yarn_mscale(c);
    float *table = malloc((size_t)c->context_length * half * 2 * sizeof(float));
    if (!table) return NULL;
    double freqs[256];                 /* head_dim <= 512, checked by model_init_rope */
    rope_frequencies(c, theta, llama3, freqs);
    for (int p = 0; p < c->context_length; p++)
        for (int i = 0; i < half; i++) {
            double a = p * pos_scale * freqs[i];
            table[((size_t)p * half + i) * 2] = (float)(cos(a) * mscale);
            table[((size_t)p * half + i) * 2 + 1] = (float)(sin(a) * mscale);
        }
    return table;
}

/* Tables computed once at load: the global layers' (with llama3 or linear scaling), and, when sliding-window layers
 * have a base of their own (Gemma 3: 10000 against the global 1e6), theirs, unscaled as in the reference. Every
 * attention block then points at its own. */
int model_init_rope(model_t *m) {
    const model_config_t *c = &m->cfg;
    if (c->head_dim > 512 || c->rope_dims < 0 || c->rope_dims > c->head_dim || c->rope_dims % 2) return -1;
    m->rope_cos_sin = rope_table(c, c->rope_theta, c->rope_freq_scale > 0 ? c->rope_freq_scale : 1.0,
                                 c->rope_factor > 0);
    if (!m->rope_cos_sin) return -1;
    int local = 0;
    for (int l = 0; l < c->n_layers; l++)
        for (int i = 0; i < m->layers[l].n_blocks; i++)
            local |= m->layers[l].blocks[i].kind == BLOCK_ATTENTION && m->layers[l].blocks[i].attn.window > 0;
    if (local && c->rope_theta_local > 0) {
        m->rope_cos_sin_local = rope_table(c, c->rope_theta_local, 1.0, 0);
        if (!m->rope_cos_sin_local) return -1;
    }
    for (int l = 0; l < c->n_layers; l++)
        for (int i = 0; i < m->layers[l].n_blocks; i++) {
            attention_block_t *A = &m->layers[l].blocks[i].attn;
            if (m->layers[l].blocks[i].kind == BLOCK_ATTENTION)
                A->rope_cos_sin = A->window > 0 && m->rope_cos_sin_local ? m->rope_cos_sin_local : m->rope_cos_sin;
        }
    return 0;
}

/* out: (n) f16, rounded to nearest even; F16C's conversion and f32_to_f16 give the same bits */
#if defined(__x86_64__)
__attribute__((target("avx2,f16c"))) static void store_f16_avx2(const float *x, uint16_t *out, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(out + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) out[i] = f32_to_f16(x[i]);
}
#endif

void store_f16(const float *x, uint16_t *out, int n) {
#if defined(__x86_64__)
    if (cpu_path() != PATH_SCALAR) { store_f16_avx2(x, out, n); return; }
#endif
    for (int i = 0; i < n; i++) out[i] = f32_to_f16(x[i]);
}
