/* The sampler, one row at a time, in the order of sample_row() at the bottom of this file:
 *   mask (the grammar's allowed tokens) -> logprobs -> logit bias -> penalties -> draw
 * where the draw is greedy, or temperature then top-k, top-p, min-p and one random number that depends only on
 * (seed, position), so a seeded request samples the same tokens in any batch.
 * The mask comes first: a masked token's logit is -inf, which every later step keeps (bias and penalties add to
 * or scale it, a temperature weight of -inf is exactly 0), so it has probability exactly 0 under any setting,
 * and logprobs are those of the masked distribution. */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "inferd.h"
#include "vecmath.h"

typedef struct { float v; int32_t id; } cand_t;

static uint64_t splitmix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

uint64_t rng_u64(uint64_t seed, uint64_t position) { return splitmix64(seed ^ splitmix64(position)); }

/* the weight of one logit: exp((x - m) * inv_t), and exactly 0 for a masked (-inf) logit, where the clamped exp
 * would give 1e-38 */
static inline float weight_scalar(float x, float m, float inv_t) {
    return x == -INFINITY ? 0.0f : exp_scalar((x - m) * inv_t);
}

/* w[i] = weight(w[i]) over the vocabulary; returns their sum, accumulated in double in eight lanes (lane l takes
 * i % 8 == l, full groups of 8 only), lanes combined in a fixed order, then the tail. */
static double temperature_weights_scalar(float *w, int n, float m, float inv_t) {
    double lanes[8] = {0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) { w[i + l] = weight_scalar(w[i + l], m, inv_t); lanes[l] += w[i + l]; }
    double z = ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5])) + ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]));
    for (; i < n; i++) { w[i] = weight_scalar(w[i], m, inv_t); z += w[i]; }
    return z;
}

#if defined(__x86_64__)
__attribute__((target("avx2,fma,f16c")))
static double temperature_weights_avx2(float *w, int n, float m, float inv_t) {
    __m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd();       /* lanes 0-3 and 4-7 */
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 x = _mm256_loadu_ps(w + i);
        __m256 e = exp8(_mm256_mul_ps(_mm256_sub_ps(x, _mm256_set1_ps(m)), _mm256_set1_ps(inv_t)));
        e = _mm256_andnot_ps(_mm256_cmp_ps(x, _mm256_set1_ps(-INFINITY), _CMP_EQ_OQ), e);   /* masked: 0 */
        _mm256_storeu_ps(w + i, e);
        lo = _mm256_add_pd(lo, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
        hi = _mm256_add_pd(hi, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
    }
    __m256d s = _mm256_add_pd(lo, hi);                                 /* (l0+l4), (l1+l5), (l2+l6), (l3+l7) */
    double q[4];
    _mm256_storeu_pd(q, s);
    double z = (q[0] + q[1]) + (q[2] + q[3]);
    for (; i < n; i++) { w[i] = weight_scalar(w[i], m, inv_t); z += w[i]; }
    return z;
}
#endif

/* the first index of the largest value, NaNs skipped (a NaN at index 0 wins, as in a scan with `>`) */
static int argmax_scalar(const float *x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++) if (x[i] > x[best]) best = i;
    return best;
}

#if defined(__x86_64__)
/* the same answer: the largest value over eight lanes (max_ps keeps the running value against a NaN), then the
 * first index holding it */
__attribute__((target("avx2,fma,f16c")))
static int argmax_avx2(const float *x, int n) {
    if (n < 16 || x[0] != x[0]) return argmax_scalar(x, n);
    __m256 m = _mm256_set1_ps(x[0]);
    int i = 0;
    for (; i + 8 <= n; i += 8) m = _mm256_max_ps(_mm256_loadu_ps(x + i), m);
    float lanes[8], best;
    _mm256_storeu_ps(lanes, m);
    best = lanes[0];
    for (int l = 1; l < 8; l++) if (lanes[l] > best) best = lanes[l];
    for (; i < n; i++) if (x[i] > best) best = x[i];
    __m256 b = _mm256_set1_ps(best);
    for (i = 0; i + 8 <= n; i += 8) {
        int hit = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), b, _CMP_EQ_OQ));
        if (hit) return i + __builtin_ctz(hit);
    }
    for (; i < n; i++) if (x[i] == best) return i;
    return 0;
}
#endif

static int argmax(const float *x, int n) {
#if defined(__x86_64__)
    if (cpu_path() != PATH_SCALAR) return argmax_avx2(x, n);
#endif
    return argmax_scalar(x, n);
}

/* larger value first; equal values by smaller id, so ties resolve the same way everywhere */
static int cand_cmp(const void *a, const void *b) {
    const cand_t *x = a, *y = b;
    if (x->v != y->v) return x->v > y->v ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

static inline int cand_before(cand_t a, cand_t b) { return a.v > b.v || (a.v == b.v && a.id < b.id); }

/* Moves the k best candidates to the front (quickselect), then sorts them. */
static void select_top(cand_t *c, int n, int k) {
    int lo = 0, hi = n - 1;
    while (lo < hi) {
        cand_t pivot = c[(lo + hi) / 2];
        int i = lo, j = hi;
        while (i <= j) {
            while (cand_before(c[i], pivot)) i++;
            while (cand_before(pivot, c[j])) j--;
            if (i <= j) { cand_t t = c[i]; c[i] = c[j]; c[j] = t; i++; j--; }
        }
        if (k - 1 <= j) hi = j; else if (k - 1 >= i) lo = i; else break;
    }
    qsort(c, k, sizeof(cand_t), cand_cmp);
}

/* ---- the steps of sample_row, in order ---- */

/* 1. The grammar's mask: bit (i & 31) of allowed[i >> 5] set means token i may be sampled; every other token's
 * logit becomes -inf. Returns how many tokens stay allowed. Plain scalar code: the same bits on every path. */
static int apply_mask(float *logits, int vocab, const uint32_t *allowed) {
    int n_allowed = 0;
    for (int w = 0; w * 32 < vocab; w++) {
        uint32_t bits = allowed[w];
        int end = vocab - w * 32 < 32 ? vocab - w * 32 : 32;
        float *x = logits + (size_t)w * 32;
        if (bits == 0xFFFFFFFFu && end == 32) { n_allowed += 32; continue; }
        for (int j = 0; j < end; j++) {
            if (bits >> j & 1) n_allowed++;
            else x[j] = -INFINITY;
        }
    }
    return n_allowed;
}

/* 2. Logprobs of the (masked) logits, before bias and penalties: the chosen token's is read at the end from
 * `raw`, a copy taken here; the top k are found now. Returns log-sum-exp. Masked tokens never enter the top k;
 * when fewer than k tokens are allowed, the remaining entries are id -1 with logprob -inf. */
static float logprobs_prepare(const float *logits, int vocab, int num_logprobs, float *raw, sample_out_t *out) {
    memcpy(raw, logits, (size_t)vocab * sizeof(float));
    float m = -INFINITY;
    for (int i = 0; i < vocab; i++) m = fmaxf(m, raw[i]);
    double s = 0.0;
    for (int i = 0; i < vocab; i++) s += exp((double)(raw[i] - m));
    float lse = m + (float)log(s);
    int k = num_logprobs < MAX_TOP_LOGPROBS ? num_logprobs : MAX_TOP_LOGPROBS;
    if (k > vocab) k = vocab;
    cand_t best[MAX_TOP_LOGPROBS];
    int n = 0;
    for (int i = 0; i < vocab && k > 0; i++) {
        cand_t c = {raw[i], i};
        if (c.v == -INFINITY || (n == k && !cand_before(c, best[k - 1]))) continue;
        int j = n < k ? n++ : k - 1;
        while (j > 0 && cand_before(c, best[j - 1])) { best[j] = best[j - 1]; j--; }
        best[j] = c;
    }
    for (int i = 0; i < k; i++) {
        out->top_ids[i] = i < n ? best[i].id : -1;
        out->top_logprobs[i] = i < n ? best[i].v - lse : -INFINITY;
    }
    return lse;
}

/* 3. logit_bias: added to the named tokens' logits */
static void apply_bias(float *logits, int vocab, const int32_t *ids, const float *values, int n) {
    for (int i = 0; i < n; i++)
        if (ids[i] >= 0 && ids[i] < vocab) logits[ids[i]] += values[i];
}

/* 4. Penalties: repetition over prompt and output (once per distinct token), presence and frequency over the
 * output only, as in vLLM. count: (vocab) zero on entry, zero again on return. */
static void apply_penalties(float *logits, int vocab, const sample_params_t *sp, const int32_t *hist,
                            int32_t *count) {
    for (int i = 0; i < sp->history_len; i++) {
        int id = hist[i];
        if (id < 0 || id >= vocab) continue;
        if (count[id] == 0 && sp->repetition_penalty != 1.0f) {
            /* a penalty near 0 (or one that underflowed to 0 as a float) would make the logit infinite, which the
             * truncations downstream cannot rank: keep it finite, the largest a float holds */
            float v = logits[id] > 0 ? logits[id] / sp->repetition_penalty : logits[id] * sp->repetition_penalty;
            logits[id] = fminf(fmaxf(v, -FLT_MAX), FLT_MAX);
        }
        count[id] |= 1 << 30;                               /* seen: the repetition penalty is applied */
        if (i >= sp->num_prompt) count[id]++;
    }
    for (int i = 0; i < sp->history_len; i++) {
        int id = hist[i];
        if (id < 0 || id >= vocab || count[id] == 0) continue;
        int n = count[id] & ~(1 << 30);
        if (n > 0) logits[id] = fmaxf(logits[id] - (sp->presence_penalty + sp->frequency_penalty * (float)n), -FLT_MAX);
        count[id] = 0;
    }
}

/* 5a. Draw from the whole vocabulary: the first token whose running weight passes u * z. Masked tokens weigh 0,
 * so they never pass first; rounding that leaves the target unmet falls back to the last token with weight. */
static int draw_full(const float *w, int vocab, double z, float u) {
    double target = u * z, acc = 0.0;
    int last = 0;
    for (int i = 0; i < vocab; i++) {
        if (w[i] <= 0.0f) continue;
        acc += w[i];
        last = i;
        if (acc > target) return i;
    }
    return last;
}

/* 5b. Draw after top-k, top-p and min-p. w: weights exp((l - max)/T), so the best token has weight 1; z their
 * sum. Tokens that cannot survive may be dropped before sorting. With top-k, top-p is taken over the top k's own
 * mass, so min-p must wait until the end. Zero weights (masked tokens) are never candidates. */
static int draw_filtered(const float *w, int vocab, double z, float u, const sample_params_t *sp, cand_t *cand) {
    int top_k_on = sp->top_k > 0 && sp->top_k < vocab;
    float floor_w = sp->min_p > 0.0f && !top_k_on ? sp->min_p : 0.0f;
    if (sp->top_p < 1.0f && !top_k_on) {
        /* a token below (1 - top_p) / (vocab - 1) of the mass can never enter the nucleus */
        float lim = (float)((1.0 - sp->top_p) / (vocab - 1) * z);
        if (lim > floor_w) floor_w = lim;
    }
    if (floor_w > 1.0f) floor_w = 1.0f;                 /* the best token always stays */
    int n = 0;
    for (int i = 0; i < vocab; i++)
        if (w[i] > 0.0f && w[i] >= floor_w) { cand[n].v = w[i]; cand[n].id = i; n++; }
    int k = sp->top_k > 0 && sp->top_k < n ? sp->top_k : n;
    select_top(cand, n, k);
    n = k;
    if (sp->top_p < 1.0f) {
        double zk = 0.0, acc = 0.0;
        if (top_k_on) for (int i = 0; i < n; i++) zk += cand[i].v;
        else zk = z;
        int keep = n;
        for (int i = 0; i < n; i++) { acc += cand[i].v; if (acc >= sp->top_p * zk) { keep = i + 1; break; } }
        n = keep;
    }
    if (sp->min_p > 0.0f) { int keep = 1; while (keep < n && cand[keep].v >= sp->min_p) keep++; n = keep; }
    double total = 0.0, acc = 0.0;
    for (int i = 0; i < n; i++) total += cand[i].v;
    double target = u * total;
    for (int i = 0; i < n; i++) { acc += cand[i].v; if (acc > target) return cand[i].id; }
    return cand[n - 1].id;
}

/* 5. The draw: greedy (first maximum), or temperature weights and one random number from (seed, position) */
static int draw(float *logits, int vocab, const sample_params_t *sp, int position, cand_t *cand) {
    if (sp->temperature <= 0.0f) return argmax(logits, vocab);
    float m = -INFINITY;
    for (int i = 0; i < vocab; i++) m = fmaxf(m, logits[i]);
    float inv_t = 1.0f / sp->temperature;
    double z;
#if defined(__x86_64__)
    z = cpu_path() != PATH_SCALAR ? temperature_weights_avx2(logits, vocab, m, inv_t)
                                  : temperature_weights_scalar(logits, vocab, m, inv_t);
#else
    z = temperature_weights_scalar(logits, vocab, m, inv_t);
#endif
    float u = (float)(rng_u64(sp->seed, (uint64_t)position) >> 40) * (1.0f / 16777216.0f);   /* [0, 1) */
    int filtered = (sp->top_k > 0 && sp->top_k < vocab) || sp->top_p < 1.0f || sp->min_p > 0.0f;
    return filtered ? draw_filtered(logits, vocab, z, u, sp, cand) : draw_full(logits, vocab, z, u);
}

void sample_row(float *logits, int vocab, const sample_params_t *sp, int position, const int32_t *history,
                const int32_t *bias_ids, const float *bias_values, const uint32_t *allowed, void *scratch,
                sample_out_t *out) {
    float *raw = scratch;                                   /* (vocab) logits as the model gave them, masked */
    cand_t *cand = (cand_t *)(raw + vocab);                 /* (vocab) */
    int32_t *count = (int32_t *)(cand + vocab);             /* (vocab), all zero between calls */
    if (allowed && apply_mask(logits, vocab, allowed) == 0) {
        /* nothing allowed: the caller ends the sequence (a grammar never gets here; a bad mask could) */
        out->token = -1;
        out->logprob = -INFINITY;
        for (int i = 0; i < MAX_TOP_LOGPROBS; i++) { out->top_ids[i] = -1; out->top_logprobs[i] = -INFINITY; }
        return;
    }
    float lse = 0.0f;
    if (sp->num_logprobs >= 0) lse = logprobs_prepare(logits, vocab, sp->num_logprobs, raw, out);
    apply_bias(logits, vocab, bias_ids + sp->bias_offset, bias_values + sp->bias_offset, sp->bias_len);
    if (sp->repetition_penalty != 1.0f || sp->presence_penalty != 0.0f || sp->frequency_penalty != 0.0f)
        apply_penalties(logits, vocab, sp, history + sp->history_offset, count);
    out->token = draw(logits, vocab, sp, position, cand);
    if (sp->num_logprobs >= 0) out->logprob = raw[out->token] - lse;
}
