/* The Gated DeltaNet block (inferd.h's gdn_block_t): x += Wout gated_norm(delta_rule(silu(conv(Wqkv xn)))), a
 * linear-attention mixer whose memory of a sequence is a fixed-size state in the sequence's slot rather than KV
 * blocks. A step runs it as: the norm; the two input matmuls; one parallel stage of items (sequence, 32 channels)
 * for the causal convolution and its SiLU, reading and updating the slot's last inputs; one of items (sequence,
 * value head) for the delta rule over the sequence's tokens in order, each token's gated RMSNorm, and the output
 * projection's input quantization; then x += Wout out.
 *
 * Every token is one update of the state, in the order of its sequence, whatever the step holds: a prompt
 * chunked any way, or decoded token by token, gives the same bits (the recurrence reads only the state and the
 * token's own inputs; the matmuls give a row the same bits in any batch). The per-row arithmetic is written
 * three times, scalar, AVX2 and AVX-512, with the same fused multiply-adds in 8-lane groups and the same horizontal
 * sums, so the paths agree to the bit as the other kernels do. */
#include <math.h>
#include <string.h>
#include "forward_stage.h"
#include "type_traits.h"
#include "vecmath.h"

size_t gdn_state_floats(const gdn_block_t *G) {
    return (size_t)(G->conv_kernel - 1) * GDN_CONV_DIM(G) + (size_t)G->n_v_heads * G->head_v * G->head_k;
}

/* this block's state in a slot: (conv_kernel - 1, conv_dim) last inputs, oldest first; then (n_v_heads, head_v,
 * head_k) matrices */
static float *block_state(const context_t *c, const gdn_block_t *G, int slot) {
    return c->state + (size_t)slot * c->model->state_floats + (size_t)G->index * gdn_state_floats(G);
}

/* One sequence's tokens through the depthwise causal convolution of 32 channels: each token's output is the sum of
 * the channel's last K inputs times its taps (oldest first, summed in that order), then SiLU, written over the
 * token's input in place; last holds the K - 1 inputs before the first token and is left holding the K - 1 last
 * ones. The taps are held transposed, (tap, channel), so that each tap is one multiply and one add across the 32
 * channels; inlined with K a constant for the kernels files have (4), the tap loops unroll. */
static inline __attribute__((always_inline)) void conv_tokens(float *in, size_t stride, int n, const float *conv,
                                                              int K, float last[9][QK]) {
    static const float ones[QK] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
                                   1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
    float taps[9][QK];
    for (int j = 0; j < K; j++)
        for (int ch = 0; ch < QK; ch++) taps[j][ch] = conv[(size_t)ch * K + j];
    for (int t = 0; t < n; t++, in += stride) {
        float y[QK];
        memcpy(last[K - 1], in, QK * sizeof(float));
        for (int ch = 0; ch < QK; ch++) y[ch] = 0.0f;
        for (int j = 0; j < K; j++)
            for (int ch = 0; ch < QK; ch++) y[ch] += last[j][ch] * taps[j][ch];
        memmove(last[0], last[1], (size_t)(K - 1) * QK * sizeof(float));
        swiglu(y, ones, in, QK);                                 /* silu(y) * 1, on the active path */
    }
}

/* one item = (sequence, 32 channels of q|k|v): the sequence's tokens in order through the convolution and its
 * SiLU (conv_tokens), from and back to the slot's last conv_kernel - 1 raw inputs */
static void conv_fn(void *arg, int64_t begin, int64_t end, int thread) {
    stage_t *s = arg;
    context_t *c = s->c;
    const gdn_block_t *G = &s->block->gdn;
    int conv_dim = GDN_CONV_DIM(G), width = conv_dim + GDN_VALUE_DIM(G), K = G->conv_kernel;
    int chunks = conv_dim / QK;
    (void)thread;
    for (int64_t item = begin; item < end; item++) {
        int seq = (int)(item / chunks), c0 = (int)(item % chunks) * QK;
        int first = c->seq_first[seq], n = c->seq_first[seq + 1] - first;
        float *window = block_state(c, G, s->b->state_slots[seq]) + c0;       /* (K - 1, conv_dim), row stride */
        float *in = c->gdn_in + (size_t)first * width + c0, last[9][QK];      /* K <= 9: checked at build */
        const float *conv = G->conv + (size_t)c0 * K;
        for (int j = 0; j < K - 1; j++) memcpy(last[j], window + (size_t)j * conv_dim, QK * sizeof(float));
        if (K == 4) conv_tokens(in, (size_t)width, n, conv, 4, last);
        else conv_tokens(in, (size_t)width, n, conv, K, last);
        for (int j = 0; j < K - 1; j++) memcpy(window + (size_t)j * conv_dim, last[j], QK * sizeof(float));
    }
}

/* x / sqrt(sum x^2 + eps) (llama.cpp's l2 norm of the delta net's q and k), the sum in a fixed order */
static void l2_normalize(const float *x, int n, float eps, float scale, float *out) {
    double sum = 0.0;
    for (int i = 0; i < n; i++) sum += (double)x[i] * x[i];
    float inv = (float)(1.0 / sqrt(sum + eps)) * scale;
    for (int i = 0; i < n; i++) out[i] = x[i] * inv;
}

/* One token's update of a value head's state, row by row (row j of M is column j of S: the keys' weights for
 * value j): M[j] *= decay; d = beta (v[j] - M[j].k); M[j] += d k; o[j] = M[j].q. The dot products keep the float
 * kernels' order: 8-wide group g into accumulator g mod 4, combined (a0+a1)+(a2+a3), then summed in 8 lanes
 * pairwise (head_k % 32 == 0). */
static void delta_rows_scalar(float *M, int head_v, int head_k, const float *q, const float *k, const float *v,
                              float decay, float beta, float *o) {
    for (int j = 0; j < head_v; j++) {
        float *m = M + (size_t)j * head_k, a[4][8] = {{0}}, b[4][8] = {{0}}, sa[8], sb[8];
        for (int i = 0; i < head_k; i += 8)
            for (int l = 0; l < 8; l++) {
                m[i + l] *= decay;
                a[(i / 8) & 3][l] = __builtin_fmaf(m[i + l], k[i + l], a[(i / 8) & 3][l]);
            }
        for (int l = 0; l < 8; l++) sa[l] = (a[0][l] + a[1][l]) + (a[2][l] + a[3][l]);
        float d = (v[j] - hsum8_pairs_scalar(sa)) * beta;
        for (int i = 0; i < head_k; i += 8)
            for (int l = 0; l < 8; l++) {
                m[i + l] = __builtin_fmaf(k[i + l], d, m[i + l]);
                b[(i / 8) & 3][l] = __builtin_fmaf(m[i + l], q[i + l], b[(i / 8) & 3][l]);
            }
        for (int l = 0; l < 8; l++) sb[l] = (b[0][l] + b[1][l]) + (b[2][l] + b[3][l]);
        o[j] = hsum8_pairs_scalar(sb);
    }
}

#if defined(__x86_64__)
__attribute__((target("avx2,fma,f16c")))
static void delta_rows_avx2(float *M, int head_v, int head_k, const float *q, const float *k, const float *v,
                            float decay, float beta, float *o) {
    __m256 g = _mm256_set1_ps(decay);
    for (int j = 0; j < head_v; j++) {
        float *m = M + (size_t)j * head_k;
        __m256 a[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
        __m256 b[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
        for (int i = 0; i < head_k; i += 32)
            for (int u = 0; u < 4; u++) {
                __m256 mv = _mm256_mul_ps(_mm256_loadu_ps(m + i + 8 * u), g);
                _mm256_storeu_ps(m + i + 8 * u, mv);
                a[u] = _mm256_fmadd_ps(mv, _mm256_loadu_ps(k + i + 8 * u), a[u]);
            }
        __m256 sa = _mm256_add_ps(_mm256_add_ps(a[0], a[1]), _mm256_add_ps(a[2], a[3]));
        __m256 d = _mm256_set1_ps((v[j] - hsum8_pairs(sa)) * beta);
        for (int i = 0; i < head_k; i += 32)
            for (int u = 0; u < 4; u++) {
                __m256 mv = _mm256_fmadd_ps(_mm256_loadu_ps(k + i + 8 * u), d, _mm256_loadu_ps(m + i + 8 * u));
                _mm256_storeu_ps(m + i + 8 * u, mv);
                b[u] = _mm256_fmadd_ps(mv, _mm256_loadu_ps(q + i + 8 * u), b[u]);
            }
        __m256 sb = _mm256_add_ps(_mm256_add_ps(b[0], b[1]), _mm256_add_ps(b[2], b[3]));
        o[j] = hsum8_pairs(sb);
    }
}

/* AVX-512: a row of M (up to 128 floats) stays in registers between its two passes, and q and k for all rows, so a
 * row costs one load and one store of itself instead of each pass re-reading it and k. Zmm vector i holds the 8-wide
 * groups 2i and 2i + 1: A accumulates the even vectors (lanes 0-7 are accumulator 0's groups, 8-15 accumulator 1's),
 * B the odd ones (2 and 3), each in group order; their halves are combined as (a0 + a1) + (a2 + a3). The same
 * operations in the same order as delta_rows_avx2, so the same bits. */
#define DELTA512 __attribute__((target("avx512f,avx2,fma,f16c")))
DELTA512 static inline __attribute__((always_inline)) __m256 upper8(__m512 v) {
    return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
}
DELTA512 static inline __attribute__((always_inline)) float row_sum(__m512 A, __m512 B) {
    __m256 a01 = _mm256_add_ps(_mm512_castps512_ps256(A), upper8(A));
    __m256 a23 = _mm256_add_ps(_mm512_castps512_ps256(B), upper8(B));
    return hsum8_pairs(_mm256_add_ps(a01, a23));
}

DELTA512 static inline __attribute__((always_inline)) void delta_rows_zmm(float *M, int head_v, const float *q,
                                                                           const float *k, const float *v,
                                                                           float decay, float beta, float *o,
                                                                           const int NV) {
    __m512 g = _mm512_set1_ps(decay), kv[8], qv[8];
    for (int i = 0; i < NV; i++) { kv[i] = _mm512_loadu_ps(k + 16 * i); qv[i] = _mm512_loadu_ps(q + 16 * i); }
    for (int j = 0; j < head_v; j++) {
        float *m = M + (size_t)j * 16 * NV;
        __m512 mv[8], A = _mm512_setzero_ps(), B = _mm512_setzero_ps();
        for (int i = 0; i < NV; i++) {
            mv[i] = _mm512_mul_ps(_mm512_loadu_ps(m + 16 * i), g);
            if (i & 1) B = _mm512_fmadd_ps(mv[i], kv[i], B);
            else A = _mm512_fmadd_ps(mv[i], kv[i], A);
        }
        __m512 d = _mm512_set1_ps((v[j] - row_sum(A, B)) * beta);
        A = _mm512_setzero_ps();
        B = _mm512_setzero_ps();
        for (int i = 0; i < NV; i++) {
            mv[i] = _mm512_fmadd_ps(kv[i], d, mv[i]);
            _mm512_storeu_ps(m + 16 * i, mv[i]);
            if (i & 1) B = _mm512_fmadd_ps(mv[i], qv[i], B);
            else A = _mm512_fmadd_ps(mv[i], qv[i], A);
        }
        o[j] = row_sum(A, B);
    }
}

/* head_k of 32, 64, 96 or 128 (returns 0 for others: the AVX2 rows then) */
DELTA512 static int delta_rows_avx512(float *M, int head_v, int head_k, const float *q, const float *k,
                                      const float *v, float decay, float beta, float *o) {
    switch (head_k) {
    case 32: delta_rows_zmm(M, head_v, q, k, v, decay, beta, o, 2); return 1;
    case 64: delta_rows_zmm(M, head_v, q, k, v, decay, beta, o, 4); return 1;
    case 96: delta_rows_zmm(M, head_v, q, k, v, decay, beta, o, 6); return 1;
    case 128: delta_rows_zmm(M, head_v, q, k, v, decay, beta, o, 8); return 1;
    default: return 0;
    }
}
#endif

/* which delta_rows kernel runs: 0 scalar, 1 AVX2, 2 AVX-512 (the paths that run the zmm matmul kernels) */
static int delta_path(void) {
    return path_has_zmm_vnni(cpu_path()) ? 2 : cpu_path() != PATH_SCALAR;
}

static void delta_rows(int path, float *M, int head_v, int head_k, const float *q, const float *k, const float *v,
                       float decay, float beta, float *o) {
#if defined(__x86_64__)
    if (path == 2 && delta_rows_avx512(M, head_v, head_k, q, k, v, decay, beta, o)) return;
    if (path >= 1) {
        delta_rows_avx2(M, head_v, head_k, q, k, v, decay, beta, o);
        return;
    }
#endif
    (void)path;
    delta_rows_scalar(M, head_v, head_k, q, k, v, decay, beta, o);
}

static float softplus1(float x) { return x > 20.0f ? x : logf(1.0f + expf(x)); }

/* one item = (sequence, value head): its tokens in order through the delta rule, each token's output through the
 * gated RMSNorm and quantized as its blocks of Wout's input (head_v % 32 == 0: a block never straddles heads) */
static void delta_fn(void *arg, int64_t begin, int64_t end, int thread) {
    stage_t *s = arg;
    context_t *c = s->c;
    const gdn_block_t *G = &s->block->gdn;
    int H = G->n_v_heads, hk = G->head_k, hv = G->head_v, kd = G->n_k_heads * hk;
    int conv_dim = GDN_CONV_DIM(G), vdim = GDN_VALUE_DIM(G), width = conv_dim + vdim;
    float eps = c->model->cfg.norm_eps, scale = 1.0f / sqrtf((float)hk);
    float *qn = c->gdn_scratch + (size_t)thread * (2 * hk + 2 * hv), *kn = qn + hk, *o = kn + hk, *on = o + hv;
    const int path = delta_path();
    for (int64_t item = begin; item < end; item++) {
        int seq = (int)(item / H), h = (int)(item % H);
        int kh = G->grouped_heads ? h / (H / G->n_k_heads) : h % G->n_k_heads;
        float *M = block_state(c, G, s->b->state_slots[seq]) + (size_t)(G->conv_kernel - 1) * conv_dim +
                   (size_t)h * hv * hk;
        for (int t = c->seq_first[seq]; t < c->seq_first[seq + 1]; t++) {
            const float *in = c->gdn_in + (size_t)t * width, *ba = c->gdn_ba + (size_t)t * 2 * H;
            l2_normalize(in + (size_t)kh * hk, hk, eps, scale, qn);              /* q / |q| / sqrt(head_k) */
            l2_normalize(in + kd + (size_t)kh * hk, hk, eps, 1.0f, kn);
            const float *v = in + 2 * kd + (size_t)h * hv, *z = in + conv_dim + (size_t)h * hv;
            float beta = 1.0f / (1.0f + expf(-ba[h]));
            float decay = expf(softplus1(ba[H + h] + G->dt_bias[h]) * G->a_log[h]);
            delta_rows(path, M, hv, hk, qn, kn, v, decay, beta, o);
            rmsnorm(o, G->norm_out, hv, eps, on);                                   /* gated RMSNorm */
            float *out = c->gdn_out + (size_t)t * vdim + (size_t)h * hv;
            swiglu(z, on, out, hv);                                                 /* * silu(z) */
            quantize_act(out, hv, c->gdn_xq + (size_t)t * (vdim / QK) + (size_t)h * hv / QK);
        }
    }
}

void gdn_block(context_t *c, stage_t *s, const block_t *B) {
    const model_config_t *cfg = &c->model->cfg;
    const gdn_block_t *G = &B->gdn;
    s->block = B;
    if (weight_is_quantized(G->win.type) && weight_is_quantized(G->wba.type))
        stage_prepare_input(c, s, c->x, cfg->dim, B->norm, &G->win);                     /* rmsnorm(x) */
    else
        stage_prepare_input_floats(c, s, c->x, cfg->dim, B->norm);
    stage_matmul(c, STAGE_RECURRENT_IN, s, &G->win, c->gdn_in, 0);                      /* qkv | z */
    stage_matmul(c, STAGE_RECURRENT_IN, s, &G->wba, c->gdn_ba, 0);                      /* beta | alpha */
    stage_run(c, STAGE_RECURRENT_CONV, (int64_t)s->b->num_seqs * (GDN_CONV_DIM(G) / QK), 1, conv_fn, s);
    stage_run(c, STAGE_RECURRENT, (int64_t)s->b->num_seqs * G->n_v_heads, 1, delta_fn, s);
    stage_set_input(s, c->gdn_out, GDN_VALUE_DIM(G), c->gdn_xq);
    stage_matmul_residual(c, STAGE_RECURRENT_OUT, s, &G->wout, NULL, B->post_norm, -1);       /* x += Wout out */
}
