/* The sampler: logit bias, penalties, temperature, top-k, top-p, min-p, then one draw whose random number
 * depends only on (seed, position), so a seeded request samples the same tokens in any batch. */
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

/* w[i] = exp((w[i] - m) * inv_t) over the vocabulary; returns their sum, accumulated in double in eight
 * lanes (lane l takes i % 8 == l, full groups of 8 only), lanes combined in a fixed order, then the tail. */
static double temperature_weights_scalar(float *w, int n, float m, float inv_t) {
    double lanes[8] = {0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) { w[i + l] = exp_scalar((w[i + l] - m) * inv_t); lanes[l] += w[i + l]; }
    double z = ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5])) + ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]));
    for (; i < n; i++) { w[i] = exp_scalar((w[i] - m) * inv_t); z += w[i]; }
    return z;
}

#if defined(__x86_64__)
__attribute__((target("avx2,fma,f16c")))
static double temperature_weights_avx2(float *w, int n, float m, float inv_t) {
    __m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd();       /* lanes 0-3 and 4-7 */
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 e = exp8(_mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(w + i), _mm256_set1_ps(m)), _mm256_set1_ps(inv_t)));
        _mm256_storeu_ps(w + i, e);
        lo = _mm256_add_pd(lo, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
        hi = _mm256_add_pd(hi, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
    }
    __m256d s = _mm256_add_pd(lo, hi);                                 /* (l0+l4), (l1+l5), (l2+l6), (l3+l7) */
    double q[4];
    _mm256_storeu_pd(q, s);
    double z = (q[0] + q[1]) + (q[2] + q[3]);
    for (; i < n; i++) { w[i] = exp_scalar((w[i] - m) * inv_t); z += w[i]; }
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

static void top_logprobs(const float *raw, int vocab, float lse, int k, sample_out_t *out) {
    cand_t best[MAX_TOP_LOGPROBS];
    int n = 0;
    for (int i = 0; i < vocab; i++) {
        cand_t c = {raw[i], i};
        if (n == k && !cand_before(c, best[k - 1])) continue;
        int j = n < k ? n++ : k - 1;
        while (j > 0 && cand_before(c, best[j - 1])) { best[j] = best[j - 1]; j--; }
        best[j] = c;
    }
    for (int i = 0; i < k; i++) { out->top_ids[i] = best[i].id; out->top_logprobs[i] = best[i].v - lse; }
}

void sample_row(float *logits, int vocab, const sample_params_t *sp, int position, const int32_t *history,
                const int32_t *bias_ids, const float *bias_values, void *scratch, sample_out_t *out) {
    float *raw = scratch;                                   /* (vocab) logits as the model gave them */
    cand_t *cand = (cand_t *)(raw + vocab);                 /* (vocab) */
    int32_t *count = (int32_t *)(cand + vocab);             /* (vocab), all zero between calls */
    float lse = 0.0f;
    if (sp->num_logprobs >= 0) {
        memcpy(raw, logits, (size_t)vocab * sizeof(float));
        float m = -INFINITY;
        for (int i = 0; i < vocab; i++) m = fmaxf(m, raw[i]);
        double s = 0.0;
        for (int i = 0; i < vocab; i++) s += exp((double)(raw[i] - m));
        lse = m + (float)log(s);
        int k = sp->num_logprobs < MAX_TOP_LOGPROBS ? sp->num_logprobs : MAX_TOP_LOGPROBS;
        if (k > vocab) k = vocab;
        if (k > 0) top_logprobs(raw, vocab, lse, k, out);
    }
    for (int i = 0; i < sp->bias_len; i++) {
        int id = bias_ids[sp->bias_offset + i];
        if (id >= 0 && id < vocab) logits[id] += bias_values[sp->bias_offset + i];
    }
    /* penalties: repetition over prompt and output (once per distinct token), presence and frequency over
     * the output only, as in vLLM */
    const int32_t *hist = history + sp->history_offset;
    if (sp->repetition_penalty != 1.0f || sp->presence_penalty != 0.0f || sp->frequency_penalty != 0.0f) {
        for (int i = 0; i < sp->history_len; i++) {
            int id = hist[i];
            if (id < 0 || id >= vocab) continue;
            if (count[id] == 0 && sp->repetition_penalty != 1.0f) {
                logits[id] = logits[id] > 0 ? logits[id] / sp->repetition_penalty : logits[id] * sp->repetition_penalty;
            }
            count[id] |= 1 << 30;                           /* seen: the repetition penalty is applied */
            if (i >= sp->num_prompt) count[id]++;
        }
        for (int i = 0; i < sp->history_len; i++) {
            int id = hist[i];
            if (id < 0 || id >= vocab || count[id] == 0) continue;
            int n = count[id] & ~(1 << 30);
            if (n > 0) logits[id] -= sp->presence_penalty + sp->frequency_penalty * (float)n;
            count[id] = 0;
        }
    }
    int chosen = 0;
    if (sp->temperature <= 0.0f) {                           /* greedy: first maximum */
        chosen = argmax(logits, vocab);
    } else {
        float m = -INFINITY;
        for (int i = 0; i < vocab; i++) m = fmaxf(m, logits[i]);
        float inv_t = 1.0f / sp->temperature;
        double z = 0.0;
#if defined(__x86_64__)
        z = cpu_path() != PATH_SCALAR ? temperature_weights_avx2(logits, vocab, m, inv_t)
                                      : temperature_weights_scalar(logits, vocab, m, inv_t);
#else
        z = temperature_weights_scalar(logits, vocab, m, inv_t);
#endif
        float u = (float)(rng_u64(sp->seed, (uint64_t)position) >> 40) * (1.0f / 16777216.0f);   /* [0, 1) */
        int filtered = (sp->top_k > 0 && sp->top_k < vocab) || sp->top_p < 1.0f || sp->min_p > 0.0f;
        if (!filtered) {
            double target = u * z, acc = 0.0;
            chosen = vocab - 1;
            for (int i = 0; i < vocab; i++) { acc += logits[i]; if (acc > target) { chosen = i; break; } }
        } else {
            /* weights are exp((l - max)/T), so the best token has weight 1 */
            /* Tokens that cannot survive may be dropped before sorting. With top-k, top-p is taken over the
             * top k's own mass, so min-p must wait until the end. */
            int top_k_on = sp->top_k > 0 && sp->top_k < vocab;
            float floor_w = sp->min_p > 0.0f && !top_k_on ? sp->min_p : 0.0f;
            if (sp->top_p < 1.0f && !top_k_on) {
                /* a token below (1 - top_p) / (vocab - 1) of the mass can never enter the nucleus */
                float lim = (float)((1.0 - sp->top_p) / (vocab - 1) * z);
                if (lim > floor_w) floor_w = lim;
            }
            if (floor_w > 1.0f) floor_w = 1.0f;             /* the best token always stays */
            int n = 0;
            for (int i = 0; i < vocab; i++) if (logits[i] >= floor_w) { cand[n].v = logits[i]; cand[n].id = i; n++; }
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
            chosen = cand[n - 1].id;
            for (int i = 0; i < n; i++) { acc += cand[i].v; if (acc > target) { chosen = cand[i].id; break; } }
        }
    }
    out->token = chosen;
    if (sp->num_logprobs >= 0) out->logprob = raw[chosen] - lse;
}
