/* The sampler on the GPU: one block of 1024 threads per logits row.
 *
 * It follows the CPU sampler (ext/cpu/sample.c) step for step: logit bias, then penalties, then greedy (first
 * maximum) or temperature with top-k / top-p / min-p, and one uniform draw u from (seed, position) with the same
 * generator; the filters in the CPU's order: top-k, top-p over the top k's mass, min-p last. The weights are w_i =
 * expf((l_i - max) / T), as on the CPU; sums run over w_i in 32.32 fixed point (64-bit integers), so they are exact,
 * independent of the order of addition, and the choice is deterministic. The sorted-order steps of the CPU sampler
 * (top-k, the nucleus, the draw among the kept tokens) become radix selections over the bit patterns of w
 * (non-negative floats order as their bits): 4 passes of 8 bits, histograms of counts or of fixed-point weight.
 * Without filters the draw walks the tokens in index order, as the CPU does. Known difference: tokens with exactly
 * equal weights at a top-k or top-p boundary are all kept here (the CPU keeps the lower ids first).
 *
 * A grammar's mask (a row with params.has_mask) comes first, as on the CPU: every read of a logit goes through
 * Logits::at, which gives -inf for a token outside the mask, so a masked token has weight exactly 0 (expf(-inf))
 * under every setting, never wins the greedy argmax, and the logsumexp runs over the allowed tokens only. The row
 * itself is not written for the mask: nothing to restore, and an unconstrained row reads no mask bits at all.
 *
 * logprob = raw logit of the chosen token - logsumexp of the raw (masked) row, as on the CPU. The adjusted logits
 * are put back to their raw values before the kernel ends, so a later copy of the row returns the model's logits. */
#include <math.h>
#include "common.cuh"

namespace {

constexpr int ST = 1024;
constexpr int SW = ST / 32;
constexpr float FIX_ONE = 4294967296.0f;   /* 2^32: w = 1 (the best token) is 2^32 */

struct SampleArgs {
    float *logits;
    int V;
    const icu_sample_params *params;
    const int32_t *adj_offset;
    icu_adj *adj;
    const uint32_t *masks;     /* (rows, (V + 31) / 32) packed allowed-token bits, or NULL */
    int32_t *out_tokens;
    float *out_logprobs;
    int32_t *next_tokens;      /* graph replay: the sampled token becomes the next step's input (or NULL) */
    int32_t *next_positions;
};

struct Shared {
    unsigned long long hist[256];
    unsigned long long red_u[SW];
    float red_f[SW];
    int red_i[SW];
    unsigned long long sel_above;
    int sel_digit;
};

__device__ __forceinline__ unsigned long long fixed_w(float w) { return __float2ull_rn(w * FIX_ONE); }

/* One row's logits as the sampler sees them: -inf outside the grammar's mask (allowed == NULL: no mask) */
struct Logits {
    const float *l;
    const uint32_t *allowed;
    __device__ __forceinline__ bool ok(int i) const { return !allowed || ((allowed[i >> 5] >> (i & 31)) & 1u); }
    __device__ __forceinline__ float at(int i) const { return ok(i) ? l[i] : -INFINITY; }
};

/* (value, index) maximum, first index on ties */
__device__ __forceinline__ void better(float &v, int &i, float v2, int i2) {
    if (v2 > v || (v2 == v && i2 < i) || (v != v && v2 == v2)) { v = v2; i = i2; }
}

__device__ void block_argmax(Shared &sh, const Logits &x, int V, float &vmax, int &imax) {
    float v = -INFINITY;
    int idx = 0x7fffffff;
    for (int i = threadIdx.x; i < V; i += ST) better(v, idx, x.at(i), i);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float v2 = __shfl_xor_sync(0xffffffffu, v, o);
        const int i2 = __shfl_xor_sync(0xffffffffu, idx, o);
        better(v, idx, v2, i2);
    }
    __syncthreads();
    if ((threadIdx.x & 31) == 0) { sh.red_f[threadIdx.x >> 5] = v; sh.red_i[threadIdx.x >> 5] = idx; }
    __syncthreads();
    v = sh.red_f[0];
    idx = sh.red_i[0];
    for (int w = 1; w < SW; ++w) better(v, idx, sh.red_f[w], sh.red_i[w]);
    vmax = v;
    imax = idx;
}

__device__ unsigned long long block_sum_u64(Shared &sh, unsigned long long v) {
    v = warp_sum_u64(v);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) sh.red_u[threadIdx.x >> 5] = v;
    __syncthreads();
    unsigned long long t = 0;
    for (int w = 0; w < SW; ++w) t += sh.red_u[w];
    return t;
}

/* Weights of the temperature-scaled row: w = expf((l - m) * inv_t); key = bits of w */
struct Row {
    Logits l;
    float m, inv_t;
    __device__ __forceinline__ float w(int i) const { return expf((l.at(i) - m) * inv_t); }   /* masked: 0 */
};

/* Among tokens with key >= key_lo, in descending key order, the key at which the running total (counts when
 * by_mass is false, fixed-point weights otherwise) first reaches target (> target when strict). above: the
 * total of the tokens with a larger key. Returns false when the total never gets there. */
__device__ bool radix_select(Shared &sh, const Row &row, int V, uint32_t key_lo, bool by_mass, bool strict,
                             unsigned long long target, uint32_t &key_out, unsigned long long &above_out) {
    uint32_t prefix = 0;
    unsigned long long above = 0;
    for (int shift = 24; shift >= 0; shift -= 8) {
        __syncthreads();
        for (int i = threadIdx.x; i < 256; i += ST) sh.hist[i] = 0;
        __syncthreads();
        const uint32_t hi_mask = shift == 24 ? 0u : (0xffffffffu << (shift + 8));
        for (int i = threadIdx.x; i < V; i += ST) {
            const float w = row.w(i);
            const uint32_t key = __float_as_uint(w);
            if (key < key_lo || (key & hi_mask) != (prefix & hi_mask)) continue;
            atomicAdd(&sh.hist[(key >> shift) & 255u], by_mass ? fixed_w(w) : 1ull);
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            unsigned long long cum = above;
            int sel = -1;
            for (int d = 255; d >= 0; --d) {
                const unsigned long long nc = cum + sh.hist[d];
                if (strict ? nc > target : nc >= target) { sel = d; break; }
                cum = nc;
            }
            sh.sel_digit = sel;
            sh.sel_above = cum;
        }
        __syncthreads();
        const int sel = sh.sel_digit;
        if (sel < 0) return false;
        prefix |= (uint32_t)sel << shift;
        above = sh.sel_above;
    }
    key_out = prefix;
    above_out = above;
    return true;
}

/* The first index i, in index order, at which the running total of weight(i) exceeds target; -1 if none.
 * Each thread owns a contiguous stretch; an exclusive scan over the threads finds the stretch. */
template <class Weight>
__device__ int index_select(Shared &sh, int V, Weight weight, unsigned long long target) {
    const int seg = (V + ST - 1) / ST;
    const int lo = threadIdx.x * seg, hi = min(V, lo + seg);
    unsigned long long mine = 0;
    for (int i = lo; i < hi; ++i) mine += weight(i);
    /* inclusive scan within the warp, then over warp totals */
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    unsigned long long incl = mine;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const unsigned long long n = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += n;
    }
    __syncthreads();
    if (lane == 31) sh.red_u[wid] = incl;
    if (threadIdx.x == 0) sh.red_i[0] = -1;
    __syncthreads();
    unsigned long long before = 0;
    for (int w = 0; w < wid; ++w) before += sh.red_u[w];
    const unsigned long long excl = before + incl - mine;
    if (excl <= target && target < excl + mine) {     /* exactly one thread */
        unsigned long long acc = excl;
        for (int i = lo; i < hi; ++i) {
            acc += weight(i);
            if (acc > target) { sh.red_i[0] = i; break; }
        }
    }
    __syncthreads();
    return sh.red_i[0];
}

__global__ void __launch_bounds__(ST) sample_kernel(const SampleArgs a) {
    __shared__ Shared sh;
    pdl_launch_dependents();
    pdl_wait();
    const int r = blockIdx.x;
    const int V = a.V;
    float *L = a.logits + (size_t)r * V;
    const icu_sample_params P = a.params[r];
    const Logits X = {L, (a.masks && P.has_mask) ? a.masks + (size_t)P.mask_row * ((V + 31) / 32) : nullptr};

    /* the raw (masked) row: max and logsumexp, for the logprob */
    float m_raw;
    int arg_raw;
    block_argmax(sh, X, V, m_raw, arg_raw);
    if (m_raw == -INFINITY && X.allowed) {   /* nothing allowed (a bad mask; a grammar never gets here) */
        if (threadIdx.x == 0) {
            a.out_tokens[r] = -1;
            a.out_logprobs[r] = -INFINITY;
            if (a.next_tokens) a.next_tokens[r] = 0;
            if (a.next_positions) a.next_positions[r] += 1;
        }
        return;
    }
    unsigned long long z_raw = 0;
    for (int i = threadIdx.x; i < V; i += ST) z_raw += fixed_w(expf(X.at(i) - m_raw));
    z_raw = block_sum_u64(sh, z_raw);
    const float lse = m_raw + (float)log((double)z_raw / 4294967296.0);

    /* bias, then penalties (repetition: history; presence/frequency: output count) */
    const int e0 = a.adj_offset[r], e1 = a.adj_offset[r + 1];
    for (int e = e0 + threadIdx.x; e < e1; e += ST) {
        icu_adj &d = a.adj[e];
        float l = L[d.token];
        d.saved = l;
        l += d.bias;
        if ((d.flags & 1) && P.repetition_penalty != 1.0f)
            l = l > 0.0f ? l / P.repetition_penalty : l * P.repetition_penalty;
        const int n = d.flags >> 1;
        if (n > 0) l -= P.presence_penalty + P.frequency_penalty * (float)n;
        L[d.token] = l;
    }
    __syncthreads();
    float m = m_raw;
    int chosen = arg_raw;
    if (e1 > e0) block_argmax(sh, X, V, m, chosen);

    if (P.temperature > 0.0f) {
        const Row row = {X, m, 1.0f / P.temperature};
        const float u = (float)(icu_rng_u64(P.seed, (uint64_t)(int64_t)P.position) >> 40) * (1.0f / 16777216.0f);
        const bool topk = P.top_k > 0 && P.top_k < V;
        const bool filtered = topk || P.top_p < 1.0f || P.min_p > 0.0f;
        int pick = -1;
        if (!filtered) {
            unsigned long long z = 0;
            for (int i = threadIdx.x; i < V; i += ST) z += fixed_w(row.w(i));
            z = block_sum_u64(sh, z);
            const unsigned long long target = (unsigned long long)((double)u * (double)z);
            pick = index_select(sh, V, [&](int i) { return fixed_w(row.w(i)); }, target);
        } else {
            /* The CPU sampler's order, the one definition: the top k, then top-p over the top k's mass (the whole
             * row's without top-k), then min-p relative to the best token (weight 1) last. Every step keeps the
             * tokens whose key (the bits of w) reaches a bound, so the survivors are always key >= key_lo. Without
             * top-k the min-p floor may cut first, as on the CPU: the nucleus mass is the whole row's then, and
             * dropping tokens below the floor changes no running total above it (a nucleus reaching below the
             * floor ends at the floor either way). */
            const uint32_t min_p_lo = P.min_p > 0.0f ? __float_as_uint(fminf(P.min_p, 1.0f)) : 0u;
            uint32_t key_lo = topk ? 0u : min_p_lo;
            uint32_t key;
            unsigned long long above;
            if (topk && radix_select(sh, row, V, 0u, false, false, (unsigned long long)P.top_k, key, above))
                key_lo = key;
            if (P.top_p < 1.0f) {
                unsigned long long zp = 0;
                for (int i = threadIdx.x; i < V; i += ST) {
                    const float w = row.w(i);
                    if (!topk || __float_as_uint(w) >= key_lo) zp += fixed_w(w);
                }
                zp = block_sum_u64(sh, zp);
                unsigned long long target = (unsigned long long)ceil((double)P.top_p * (double)zp);
                if (target == 0) target = 1;
                if (radix_select(sh, row, V, key_lo, true, false, target, key, above)) key_lo = max(key_lo, key);
            }
            key_lo = max(key_lo, min_p_lo);
            unsigned long long total = 0;
            for (int i = threadIdx.x; i < V; i += ST) {
                const float w = row.w(i);
                if (__float_as_uint(w) >= key_lo) total += fixed_w(w);
            }
            total = block_sum_u64(sh, total);
            const unsigned long long target = (unsigned long long)((double)u * (double)total);
            if (radix_select(sh, row, V, key_lo, true, true, target, key, above)) {
                /* the drawn weight class: the j-th of its tokens in index order */
                const unsigned long long wk = fixed_w(__uint_as_float(key));
                const unsigned long long j = wk ? (target - above) / wk : 0;
                pick = index_select(sh, V, [&](int i) { return __float_as_uint(row.w(i)) == key ? 1ull : 0ull; }, j);
            }
        }
        if (pick >= 0) chosen = pick;
    }

    /* put the raw logits back */
    __syncthreads();
    for (int e = e0 + threadIdx.x; e < e1; e += ST) L[a.adj[e].token] = a.adj[e].saved;
    __syncthreads();
    if (threadIdx.x == 0) {
        a.out_tokens[r] = chosen;
        a.out_logprobs[r] = L[chosen] - lse;
        if (a.next_tokens) a.next_tokens[r] = chosen;
        if (a.next_positions) a.next_positions[r] += 1;
    }
}

}  // namespace

int icu_sample_launch(const Launch &L, float *logits, int V, int R, const icu_sample_params *params,
                      const int32_t *adj_offset, icu_adj *adj, const uint32_t *masks, int32_t *out_tokens,
                      float *out_logprobs, int32_t *next_tokens, int32_t *next_positions) {
    if (R == 0) return 0;
    if (R < 0 || V <= 0) return ICU_ERR_ARG;
    SampleArgs a = {logits, V, params, adj_offset, adj, masks, out_tokens, out_logprobs, next_tokens, next_positions};
    return icu_launch(L, sample_kernel, dim3(R), dim3(ST), 0, a);
}

extern "C" int icu_sample(float *logits, int V, int R, const icu_sample_params *params, const int32_t *adj_offset,
                          icu_adj *adj, const uint32_t *masks, int32_t *out_tokens, float *out_logprobs) {
    Launch L = {0, false};
    ICU_TRY(icu_sample_launch(L, logits, V, R, params, adj_offset, adj, masks, out_tokens, out_logprobs, nullptr,
                              nullptr));
    ICU_CHECK(cudaGetLastError());
    ICU_CHECK(cudaDeviceSynchronize());
    return 0;
}
