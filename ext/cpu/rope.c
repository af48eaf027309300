/* RMSNorm and rotary embeddings. One implementation for every path (no SIMD variant), so they are
 * trivially identical across paths; they are a small share of a step. */
#include <math.h>
#include <stdlib.h>
#include "inferd.h"

void rmsnorm(const float *x, const float *gamma, int n, float eps, float *out) {
    double ss = 0.0;                       /* double: the mean of squares over thousands of values */
    for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
    float scale = 1.0f / sqrtf((float)(ss / n) + eps);
    for (int i = 0; i < n; i++) out[i] = (x[i] * scale) * gamma[i];
}

/* cos_sin: (head_dim/2, 2) for this position. neox pairs (i, i + head_dim/2) as Hugging Face does;
 * otherwise adjacent pairs (2i, 2i+1), the layout llama.cpp's converter gives llama GGUF files. */
void rope_apply(float *vec, int n_heads, int head_dim, const float *cos_sin, int neox) {
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

/* Per-position tables, computed once at load: (context_length, head_dim/2, 2). Llama 3 scaling stretches
 * the low frequencies by `factor` and blends the middle band, as in Meta's reference code. */
int model_init_rope(model_t *m) {
    const model_config_t *c = &m->cfg;
    int half = c->head_dim / 2;
    m->rope_cos_sin = malloc((size_t)c->context_length * half * 2 * sizeof(float));
    if (!m->rope_cos_sin) return -1;
    double freqs[256];
    for (int i = 0; i < half; i++) {
        double f = pow((double)c->rope_theta, -2.0 * i / c->head_dim);
        if (c->rope_factor > 0) {
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
    for (int p = 0; p < c->context_length; p++)
        for (int i = 0; i < half; i++) {
            double a = p * freqs[i];
            m->rope_cos_sin[((size_t)p * half + i) * 2] = (float)cos(a);
            m->rope_cos_sin[((size_t)p * half + i) * 2 + 1] = (float)sin(a);
        }
    return 0;
}
