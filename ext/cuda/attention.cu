/* Attention over the paged KV cache, and RoPE fused with the cache write.
 *
 * Cache layout per layer: K and V each (blocks, n_kv, 64, head_dim) in f16 or bf16; a sequence's block table
 * maps its position p to block table[p / 64], row p % 64. A block table row is bt_width entries long; the width
 * is read from device memory so that a captured graph serves every step.
 *
 * Decode (one query per sequence): grid (n_kv, splits, B). A block owns one KV head and the G = n_heads / n_kv
 * query heads that share it, so each K/V tile is read once for all of them; it walks its split's 64-position
 * tiles with an online softmax and writes an unnormalised partial (o, m, l); the merge kernel combines the
 * splits. The split length depends on the sequence's own length only, so its result does not depend on the batch.
 *
 * Prefill (chunks of queries, causal): a flash-attention kernel on tensor cores (mma.sync m16n8k16, f32
 * accumulators): 64 queries of one head per block, 16 per warp, Q in registers, K/V tiles of 64 positions in
 * shared memory, online softmax in registers. */
#include <math.h>
#include "common.cuh"

namespace {

/* ------------------------------------------------------------------------------------------------------ */
/* RoPE + KV write                                                                                         */

struct RopeArgs {
    float *qkv;                /* (T, ldqkv): q (n_heads * hd) | k (n_kv * hd) | v (n_kv * hd) */
    int ldqkv;
    const float *bias;         /* (q_dim + 2 kv_dim) or NULL */
    const int32_t *positions;  /* (T) */
    const int32_t *token_seq;  /* (T) block table row of each token */
    const int32_t *block_tables;
    const int32_t *bt_width;
    const double *inv_freq;    /* (hd / 2) */
    int n_heads, n_kv, hd, neox;
    uint16_t *k_cache, *v_cache;
};

template <int KV>
__global__ void __launch_bounds__(128) rope_kv_kernel(const RopeArgs a) {
    pdl_launch_dependents();
    pdl_wait();
    const int t = blockIdx.x;
    const int pos = a.positions[t];
    const int seq = a.token_seq[t];
    const int width = *a.bt_width;
    const int hd = a.hd, half = hd / 2;
    const int q_dim = a.n_heads * hd, kv_dim = a.n_kv * hd;
    float *row = a.qkv + (size_t)t * a.ldqkv;
    const size_t phys = (size_t)a.block_tables[(size_t)seq * width + pos / ICU_BLOCK];
    const int off = pos % ICU_BLOCK;

    for (int p = threadIdx.x; p < (a.n_heads + a.n_kv) * half; p += blockDim.x) {
        const int head = p / half, i = p % half;
        const int base = head < a.n_heads ? head * hd : q_dim + (head - a.n_heads) * hd;
        const int i0 = a.neox ? i : 2 * i, i1 = a.neox ? i + half : 2 * i + 1;
        float x0 = row[base + i0], x1 = row[base + i1];
        if (a.bias) { x0 += a.bias[base + i0]; x1 += a.bias[base + i1]; }
        double sd, cd;
        sincos((double)pos * a.inv_freq[i], &sd, &cd);
        const float c = (float)cd, s = (float)sd;
        const float y0 = x0 * c - x1 * s, y1 = x0 * s + x1 * c;
        if (head < a.n_heads) {
            row[base + i0] = y0;
            row[base + i1] = y1;
        } else {
            uint16_t *dst = a.k_cache + ((phys * a.n_kv + (head - a.n_heads)) * ICU_BLOCK + off) * hd;
            dst[i0] = float_to_kv<KV>(y0);
            dst[i1] = float_to_kv<KV>(y1);
        }
    }
    for (int e = threadIdx.x; e < kv_dim; e += blockDim.x) {
        float v = row[q_dim + kv_dim + e];
        if (a.bias) v += a.bias[q_dim + kv_dim + e];
        const int h = e / hd, d = e % hd;
        a.v_cache[((phys * a.n_kv + h) * ICU_BLOCK + off) * hd + d] = float_to_kv<KV>(v);
    }
}

/* ------------------------------------------------------------------------------------------------------ */
/* decode: split-KV with GQA, then merge                                                                   */

constexpr int DEC_THREADS = 128;

/* KV blocks per split for a sequence of nblk blocks: at least min_blocks, and few enough for max_splits splits.
 * It depends on the sequence alone, so its result does not depend on the batch it runs in. */
__device__ __forceinline__ int split_len(int nblk, int min_blocks, int max_splits) {
    return max(min_blocks, (nblk + max_splits - 1) / max_splits);
}
constexpr int MAX_GROUP = 16;   /* query heads per KV head */

struct DecodeArgs {
    const float *q;            /* (B, ldq), heads contiguous */
    int ldq;
    const uint16_t *k_cache, *v_cache;
    const int32_t *block_tables;
    const int32_t *bt_width;
    const int32_t *positions;  /* (B): the query's position; it attends to [0, position] */
    int n_heads, n_kv;
    float scale_log2;          /* softmax scale * log2(e) */
    int split_blocks, max_splits;   /* shortest split (KV blocks), most splits */
    float *part_o;             /* (B, n_heads, max_splits, hd) */
    float *part_ml;            /* (B, n_heads, max_splits, 2) */
};

template <int KV, int HD>
__global__ void __launch_bounds__(DEC_THREADS) attn_decode_kernel(const DecodeArgs a) {
    constexpr int KP = HD + 8;                 /* padded K row: a lane per row reads without bank conflicts */
    constexpr int NJ = MAX_GROUP * HD / DEC_THREADS;
    extern __shared__ float4 dec_smem[];
    const int G = a.n_heads / a.n_kv;
    float *q_s = reinterpret_cast<float *>(dec_smem);          /* (G, HD) scaled queries */
    float *s_s = q_s + G * HD;                                 /* (G, 64) scores, then probabilities */
    float *m_s = s_s + G * ICU_BLOCK;                          /* (G) running max (log2 units) */
    float *l_s = m_s + MAX_GROUP;                              /* (G) running sum */
    float *alpha_s = l_s + MAX_GROUP;                          /* (G) rescale of this tile */
    uint16_t *k_s = reinterpret_cast<uint16_t *>(alpha_s + MAX_GROUP);   /* (64, KP) */
    uint16_t *v_s = k_s + ICU_BLOCK * KP;                                 /* (64, HD) */

    pdl_launch_dependents();
    const int kvh = blockIdx.x, split = blockIdx.y, b = blockIdx.z;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    pdl_wait();
    const int len = a.positions[b] + 1;
    const int nblk = (len + ICU_BLOCK - 1) / ICU_BLOCK;
    const int sb = split_len(nblk, a.split_blocks, a.max_splits);
    const int blk0 = split * sb, blk1 = min(nblk, blk0 + sb);
    if (blk0 >= blk1) return;                                  /* the merge reads only splits with work */
    const int width = *a.bt_width;

    const float *qb = a.q + (size_t)b * a.ldq + (size_t)kvh * G * HD;
    for (int i = tid; i < G * HD; i += DEC_THREADS) q_s[i] = qb[i] * a.scale_log2;
    if (tid < G) { m_s[tid] = -INFINITY; l_s[tid] = 0.0f; }
    float o[NJ];
#pragma unroll
    for (int j = 0; j < NJ; ++j) o[j] = 0.0f;

    for (int blk = blk0; blk < blk1; ++blk) {
        __syncthreads();                                       /* q_s/m_s ready; last tile's readers done */
        const size_t phys = (size_t)a.block_tables[(size_t)b * width + blk];
        const size_t tile = (phys * a.n_kv + kvh) * ICU_BLOCK * HD;
        for (int c = tid; c < ICU_BLOCK * HD / 8; c += DEC_THREADS) {
            const int p = c / (HD / 8), d8 = (c % (HD / 8)) * 8;
            uint4 kk = make_uint4(0, 0, 0, 0), vv = make_uint4(0, 0, 0, 0);
            if (blk * ICU_BLOCK + p < len) {                   /* past the end: zeros, never stale values */
                kk = *reinterpret_cast<const uint4 *>(a.k_cache + tile + (size_t)p * HD + d8);
                vv = *reinterpret_cast<const uint4 *>(a.v_cache + tile + (size_t)p * HD + d8);
            }
            *reinterpret_cast<uint4 *>(k_s + p * KP + d8) = kk;
            *reinterpret_cast<uint4 *>(v_s + p * HD + d8) = vv;
        }
        __syncthreads();
        /* scores: item (g, p) */
        for (int it = tid; it < G * ICU_BLOCK; it += DEC_THREADS) {
            const int g = it / ICU_BLOCK, p = it % ICU_BLOCK;
            const float *qg = q_s + g * HD;
            float acc = 0.0f;
#pragma unroll
            for (int d8 = 0; d8 < HD; d8 += 8) {
                const uint4 kk = *reinterpret_cast<const uint4 *>(k_s + p * KP + d8);
                const uint32_t w[4] = {kk.x, kk.y, kk.z, kk.w};
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    acc = fmaf(qg[d8 + 2 * j], kv_to_float<KV>((uint16_t)(w[j] & 0xffffu)), acc);
                    acc = fmaf(qg[d8 + 2 * j + 1], kv_to_float<KV>((uint16_t)(w[j] >> 16)), acc);
                }
            }
            s_s[it] = blk * ICU_BLOCK + p < len ? acc : -INFINITY;
        }
        __syncthreads();
        /* online softmax per query head */
        for (int g = warp; g < G; g += DEC_THREADS / 32) {
            const float s0 = s_s[g * ICU_BLOCK + lane], s1 = s_s[g * ICU_BLOCK + lane + 32];
            const float tmax = warp_max(fmaxf(s0, s1));        /* finite: the tile has a valid position */
            const float m_old = m_s[g];
            const float m_new = fmaxf(m_old, tmax);
            const float p0 = exp2f(s0 - m_new), p1 = exp2f(s1 - m_new);
            const float psum = warp_sum(p0 + p1);
            const float alpha = exp2f(m_old - m_new);
            s_s[g * ICU_BLOCK + lane] = p0;
            s_s[g * ICU_BLOCK + lane + 32] = p1;
            __syncwarp();
            if (lane == 0) {
                l_s[g] = l_s[g] * alpha + psum;
                m_s[g] = m_new;
                alpha_s[g] = alpha;
            }
        }
        __syncthreads();
        /* o(g, d) = o * alpha + sum_p P(g, p) V(p, d) */
#pragma unroll
        for (int j = 0; j < NJ; ++j) {
            const int i = tid + j * DEC_THREADS;
            if (i < G * HD) {
                const int g = i / HD, d = i % HD;
                float acc = o[j] * alpha_s[g];
                const float *pg = s_s + g * ICU_BLOCK;
#pragma unroll 8
                for (int p = 0; p < ICU_BLOCK; ++p) acc = fmaf(pg[p], kv_to_float<KV>(v_s[p * HD + d]), acc);
                o[j] = acc;
            }
        }
    }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < NJ; ++j) {
        const int i = tid + j * DEC_THREADS;
        if (i < G * HD) {
            const int g = i / HD, d = i % HD;
            const size_t h = (size_t)kvh * G + g;
            a.part_o[(((size_t)b * a.n_heads + h) * a.max_splits + split) * HD + d] = o[j];
        }
    }
    if (tid < G) {
        const size_t h = (size_t)kvh * G + tid;
        float *ml = a.part_ml + (((size_t)b * a.n_heads + h) * a.max_splits + split) * 2;
        ml[0] = m_s[tid];
        ml[1] = l_s[tid];
    }
}

struct MergeArgs {
    const float *part_o, *part_ml;
    const int32_t *positions;
    int n_heads, hd, split_blocks, max_splits;
    float *out;                /* (B, ldo) */
    int ldo;
};

__global__ void attn_merge_kernel(const MergeArgs a) {
    pdl_launch_dependents();
    pdl_wait();
    const int h = blockIdx.x, b = blockIdx.y;
    const int len = a.positions[b] + 1;
    const int nblk = (len + ICU_BLOCK - 1) / ICU_BLOCK;
    const int sb = split_len(nblk, a.split_blocks, a.max_splits);
    const int nsplit = (nblk + sb - 1) / sb;
    const size_t base = ((size_t)b * a.n_heads + h) * a.max_splits;
    float M = -INFINITY;
    for (int s = 0; s < nsplit; ++s) M = fmaxf(M, a.part_ml[(base + s) * 2]);
    for (int d = threadIdx.x; d < a.hd; d += blockDim.x) {
        float L = 0.0f, acc = 0.0f;
        for (int s = 0; s < nsplit; ++s) {
            const float w = exp2f(a.part_ml[(base + s) * 2] - M);
            L = fmaf(w, a.part_ml[(base + s) * 2 + 1], L);
            acc = fmaf(w, a.part_o[(base + s) * a.hd + d], acc);
        }
        a.out[(size_t)b * a.ldo + (size_t)h * a.hd + d] = acc / L;
    }
}

/* ------------------------------------------------------------------------------------------------------ */
/* prefill: flash attention on tensor cores                                                                */

struct PrefillArgs {
    const float *q;            /* (rows, ldq) rotated queries */
    int ldq;
    const uint16_t *k_cache, *v_cache;
    const int32_t *block_tables;
    const int32_t *bt_width;
    const int32_t *seq_qstart; /* (S + 1) */
    const int32_t *seq_pos0;   /* (S) */
    int n_heads, n_kv;
    float scale_log2;
    float *out;                /* (rows, ldo) */
    int ldo;
};

/* D = A (16x16, row) * B (16x8, col) + D, f32 accumulators. Fragments (g = lane / 4, t = lane % 4):
 * a0 (g, 2t..2t+1), a1 (g+8, 2t..), a2 (g, 2t+8..), a3 (g+8, 2t+8..); b0 (k 2t..2t+1, n g), b1 (k 2t+8.., n g);
 * d0,d1 (g, 2t..2t+1), d2,d3 (g+8, 2t..2t+1). The lower k index sits in the low 16 bits. */
template <int KV>
__device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    if (KV == ICU_KV_F16) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    } else {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
}

constexpr int PF_THREADS = 128;   /* 4 warps x 16 query rows */
constexpr int PF_ROWS = 64;

template <int KV, int HD>
__global__ void __launch_bounds__(PF_THREADS) attn_prefill_kernel(const PrefillArgs a) {
    constexpr int KP = HD + 8;    /* padded rows: fragment loads hit 32 distinct banks */
    __shared__ __align__(16) uint16_t k_s[ICU_BLOCK * KP];
    __shared__ __align__(16) uint16_t v_s[ICU_BLOCK * KP];

    pdl_launch_dependents();
    pdl_wait();
    const int s = blockIdx.z, h = blockIdx.y;
    const int q0 = a.seq_qstart[s], T = a.seq_qstart[s + 1] - q0, pos0 = a.seq_pos0[s];
    const int r0 = blockIdx.x * PF_ROWS;
    if (r0 >= T) return;
    const int G = a.n_heads / a.n_kv, kvh = h / G;
    const int width = *a.bt_width;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
    const int rA = r0 + warp * 16 + g, rB = rA + 8;          /* this thread's two query rows (chunk-relative) */
    const int posA = pos0 + rA, posB = pos0 + rB;

    uint32_t qf[HD / 16][4];
    {
        const float *qa = rA < T ? a.q + (size_t)(q0 + rA) * a.ldq + (size_t)h * HD : nullptr;
        const float *qb = rB < T ? a.q + (size_t)(q0 + rB) * a.ldq + (size_t)h * HD : nullptr;
#pragma unroll
        for (int j = 0; j < HD / 16; ++j) {
            const int c = 16 * j + 2 * t4;
            qf[j][0] = qa ? pack2_kv<KV>(qa[c], qa[c + 1]) : 0u;
            qf[j][1] = qb ? pack2_kv<KV>(qb[c], qb[c + 1]) : 0u;
            qf[j][2] = qa ? pack2_kv<KV>(qa[c + 8], qa[c + 9]) : 0u;
            qf[j][3] = qb ? pack2_kv<KV>(qb[c + 8], qb[c + 9]) : 0u;
        }
    }
    float o[HD / 8][4];
#pragma unroll
    for (int n = 0; n < HD / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};

    const int len = pos0 + T;                                  /* positions in the cache after this chunk */
    const int last_pos = pos0 + min(r0 + PF_ROWS, T) - 1;
    const int n_tiles = last_pos / ICU_BLOCK + 1;
    for (int tile = 0; tile < n_tiles; ++tile) {
        __syncthreads();
        const size_t phys = (size_t)a.block_tables[(size_t)s * width + tile];
        const size_t base = (phys * a.n_kv + kvh) * ICU_BLOCK * HD;
        for (int c = tid; c < ICU_BLOCK * HD / 8; c += PF_THREADS) {
            const int p = c / (HD / 8), d8 = (c % (HD / 8)) * 8;
            uint4 kk = make_uint4(0, 0, 0, 0), vv = make_uint4(0, 0, 0, 0);
            if (tile * ICU_BLOCK + p < len) {
                kk = *reinterpret_cast<const uint4 *>(a.k_cache + base + (size_t)p * HD + d8);
                vv = *reinterpret_cast<const uint4 *>(a.v_cache + base + (size_t)p * HD + d8);
            }
            *reinterpret_cast<uint4 *>(k_s + p * KP + d8) = kk;
            *reinterpret_cast<uint4 *>(v_s + p * KP + d8) = vv;
        }
        __syncthreads();
        /* S = Q K^T: 16 rows x 64 positions per warp, as 8 n-tiles of 8 */
        float sc[8][4];
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) {
            sc[nt][0] = sc[nt][1] = sc[nt][2] = sc[nt][3] = 0.0f;
            const uint16_t *krow = k_s + (nt * 8 + g) * KP + 2 * t4;
#pragma unroll
            for (int j = 0; j < HD / 16; ++j) {
                const uint32_t b0 = *reinterpret_cast<const uint32_t *>(krow + 16 * j);
                const uint32_t b1 = *reinterpret_cast<const uint32_t *>(krow + 16 * j + 8);
                mma16816<KV>(sc[nt], qf[j], b0, b1);
            }
        }
        /* scale, causal mask, row max */
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int nt = 0; nt < 8; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int col = tile * ICU_BLOCK + nt * 8 + 2 * t4 + (e & 1);
                const int rpos = e < 2 ? posA : posB;
                const float v = col <= rpos ? sc[nt][e] * a.scale_log2 : -INFINITY;
                sc[nt][e] = v;
                mx[e >> 1] = fmaxf(mx[e >> 1], v);
            }
        float alpha[2], mb[2];
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
            mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
            const float m_new = fmaxf(m[i], mx[i]);
            mb[i] = m_new == -INFINITY ? 0.0f : m_new;         /* a row with nothing visible yet */
            alpha[i] = exp2f(m[i] - mb[i]);
            m[i] = m_new;
        }
        float ls[2] = {0.0f, 0.0f};
#pragma unroll
        for (int nt = 0; nt < 8; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const float p = exp2f(sc[nt][e] - mb[e >> 1]);
                sc[nt][e] = p;
                ls[e >> 1] += p;
            }
#pragma unroll
        for (int i = 0; i < 2; ++i) l[i] = l[i] * alpha[i] + ls[i];   /* per-thread part; summed over the quad */
#pragma unroll
        for (int n = 0; n < HD / 8; ++n) {
            o[n][0] *= alpha[0]; o[n][1] *= alpha[0];
            o[n][2] *= alpha[1]; o[n][3] *= alpha[1];
        }
        /* O += P V: P's accumulator layout is the A fragment layout of the next product */
#pragma unroll
        for (int j = 0; j < ICU_BLOCK / 16; ++j) {
            uint32_t pa[4];
            pa[0] = pack2_kv<KV>(sc[2 * j][0], sc[2 * j][1]);
            pa[1] = pack2_kv<KV>(sc[2 * j][2], sc[2 * j][3]);
            pa[2] = pack2_kv<KV>(sc[2 * j + 1][0], sc[2 * j + 1][1]);
            pa[3] = pack2_kv<KV>(sc[2 * j + 1][2], sc[2 * j + 1][3]);
            const int kr = 16 * j + 2 * t4;
#pragma unroll
            for (int n = 0; n < HD / 8; ++n) {
                const int col = n * 8 + g;
                const uint32_t b0 = (uint32_t)v_s[kr * KP + col] | ((uint32_t)v_s[(kr + 1) * KP + col] << 16);
                const uint32_t b1 = (uint32_t)v_s[(kr + 8) * KP + col] | ((uint32_t)v_s[(kr + 9) * KP + col] << 16);
                mma16816<KV>(o[n], pa, b0, b1);
            }
        }
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
        l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
    }
    const float ia = 1.0f / l[0], ib = 1.0f / l[1];
#pragma unroll
    for (int n = 0; n < HD / 8; ++n) {
        const int col = h * HD + n * 8 + 2 * t4;
        if (rA < T) {
            float *dst = a.out + (size_t)(q0 + rA) * a.ldo + col;
            dst[0] = o[n][0] * ia;
            dst[1] = o[n][1] * ia;
        }
        if (rB < T) {
            float *dst = a.out + (size_t)(q0 + rB) * a.ldo + col;
            dst[0] = o[n][2] * ib;
            dst[1] = o[n][3] * ib;
        }
    }
}

/* ------------------------------------------------------------------------------------------------------ */

template <int KV, int HD>
int launch_decode(const Launch &L, const DecodeArgs &a, int B) {
    const int G = a.n_heads / a.n_kv;
    const size_t smem = (size_t)(G * HD + G * ICU_BLOCK + 3 * MAX_GROUP) * sizeof(float) +
                        (size_t)ICU_BLOCK * (HD + 8) * 2 + (size_t)ICU_BLOCK * HD * 2;
    auto kernel = attn_decode_kernel<KV, HD>;
    static bool attr_set = false;
    if (!attr_set) {
        const size_t most = (size_t)(MAX_GROUP * HD + MAX_GROUP * ICU_BLOCK + 3 * MAX_GROUP) * sizeof(float) +
                            (size_t)ICU_BLOCK * (HD + 8) * 2 + (size_t)ICU_BLOCK * HD * 2;
        ICU_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)most));
        attr_set = true;
    }
    return icu_launch(L, kernel, dim3(a.n_kv, a.max_splits, B), dim3(DEC_THREADS), smem, a);
}

template <int HD>
int launch_decode_kv(const Launch &L, int kv_dtype, const DecodeArgs &a, int B) {
    return kv_dtype == ICU_KV_F16 ? launch_decode<ICU_KV_F16, HD>(L, a, B) : launch_decode<ICU_KV_BF16, HD>(L, a, B);
}

template <int HD>
int launch_prefill_kv(const Launch &L, int kv_dtype, const PrefillArgs &a, dim3 grid) {
    if (kv_dtype == ICU_KV_F16)
        return icu_launch(L, attn_prefill_kernel<ICU_KV_F16, HD>, grid, dim3(PF_THREADS), 0, a);
    return icu_launch(L, attn_prefill_kernel<ICU_KV_BF16, HD>, grid, dim3(PF_THREADS), 0, a);
}

bool head_dim_ok(int hd) { return hd == 64 || hd == 96 || hd == 128; }

}  // namespace

int icu_rope_kv_launch(const Launch &L, float *qkv, int ldqkv, const float *bias, const int32_t *positions,
                       const int32_t *token_seq, const int32_t *block_tables, const int32_t *bt_width,
                       const double *inv_freq, int n_heads, int n_kv, int head_dim, int neox, int kv_dtype,
                       void *k_cache, void *v_cache, int T) {
    if (T == 0) return 0;
    if (T < 0 || n_heads <= 0 || n_kv <= 0 || head_dim <= 0 || head_dim % 2) return ICU_ERR_SHAPE;
    if (ldqkv < (n_heads + 2 * n_kv) * head_dim) return ICU_ERR_SHAPE;
    RopeArgs a = {qkv, ldqkv, bias, positions, token_seq, block_tables, bt_width, inv_freq, n_heads, n_kv,
                  head_dim, neox, (uint16_t *)k_cache, (uint16_t *)v_cache};
    if (kv_dtype == ICU_KV_F16) return icu_launch(L, rope_kv_kernel<ICU_KV_F16>, dim3(T), dim3(128), 0, a);
    if (kv_dtype == ICU_KV_BF16) return icu_launch(L, rope_kv_kernel<ICU_KV_BF16>, dim3(T), dim3(128), 0, a);
    return ICU_ERR_UNSUPPORTED;
}

int icu_attn_decode_launch(const Launch &L, const float *q, int ldq, const void *k_cache, const void *v_cache,
                           int kv_dtype, const int32_t *block_tables, const int32_t *bt_width,
                           const int32_t *positions, int B, int n_heads, int n_kv, int head_dim, float scale,
                           int split_blocks, int max_splits, float *part_o, float *part_ml, float *out, int ldo) {
    if (B == 0) return 0;
    if (B < 0 || n_kv <= 0 || n_heads % n_kv || n_heads / n_kv > MAX_GROUP) return ICU_ERR_SHAPE;
    if (!head_dim_ok(head_dim)) return ICU_ERR_UNSUPPORTED;
    if (split_blocks <= 0 || max_splits <= 0 || ldq < n_heads * head_dim || ldo < n_heads * head_dim)
        return ICU_ERR_ARG;
    if (kv_dtype != ICU_KV_F16 && kv_dtype != ICU_KV_BF16) return ICU_ERR_UNSUPPORTED;
    DecodeArgs a = {q, ldq, (const uint16_t *)k_cache, (const uint16_t *)v_cache, block_tables, bt_width, positions,
                    n_heads, n_kv, scale * 1.4426950408889634f, split_blocks, max_splits, part_o, part_ml};
    int r;
    switch (head_dim) {
        case 64: r = launch_decode_kv<64>(L, kv_dtype, a, B); break;
        case 96: r = launch_decode_kv<96>(L, kv_dtype, a, B); break;
        default: r = launch_decode_kv<128>(L, kv_dtype, a, B); break;
    }
    if (r) return r;
    MergeArgs ma = {part_o, part_ml, positions, n_heads, head_dim, split_blocks, max_splits, out, ldo};
    return icu_launch(L, attn_merge_kernel, dim3(n_heads, B), dim3(head_dim), 0, ma);
}

int icu_attn_prefill_launch(const Launch &L, const float *q, int ldq, const void *k_cache, const void *v_cache,
                            int kv_dtype, const int32_t *block_tables, const int32_t *bt_width,
                            const int32_t *seq_qstart, const int32_t *seq_pos0, int S, int max_T, int n_heads,
                            int n_kv, int head_dim, float scale, float *out, int ldo) {
    if (S == 0 || max_T == 0) return 0;
    if (S < 0 || max_T < 0 || n_kv <= 0 || n_heads % n_kv) return ICU_ERR_SHAPE;
    if (!head_dim_ok(head_dim)) return ICU_ERR_UNSUPPORTED;
    if (kv_dtype != ICU_KV_F16 && kv_dtype != ICU_KV_BF16) return ICU_ERR_UNSUPPORTED;
    if (ldq < n_heads * head_dim || ldo < n_heads * head_dim) return ICU_ERR_ARG;
    PrefillArgs a = {q, ldq, (const uint16_t *)k_cache, (const uint16_t *)v_cache, block_tables, bt_width,
                     seq_qstart, seq_pos0, n_heads, n_kv, scale * 1.4426950408889634f, out, ldo};
    dim3 grid(ceil_div(max_T, PF_ROWS), n_heads, S);
    switch (head_dim) {
        case 64: return launch_prefill_kv<64>(L, kv_dtype, a, grid);
        case 96: return launch_prefill_kv<96>(L, kv_dtype, a, grid);
        default: return launch_prefill_kv<128>(L, kv_dtype, a, grid);
    }
}

extern "C" int icu_rope_kv(float *qkv, int ldqkv, const float *bias, const int32_t *positions,
                           const int32_t *token_seq, const int32_t *block_tables, const int32_t *bt_width,
                           const double *inv_freq, int n_heads, int n_kv, int head_dim, int neox, int kv_dtype,
                           void *k_cache, void *v_cache, int T) {
    Launch L = {0, false};
    ICU_TRY(icu_rope_kv_launch(L, qkv, ldqkv, bias, positions, token_seq, block_tables, bt_width, inv_freq, n_heads,
                               n_kv, head_dim, neox, kv_dtype, k_cache, v_cache, T));
    ICU_CHECK(cudaGetLastError());
    ICU_CHECK(cudaDeviceSynchronize());
    return 0;
}

extern "C" int icu_attn_decode(const float *q, int ldq, const void *k_cache, const void *v_cache, int kv_dtype,
                               const int32_t *block_tables, const int32_t *bt_width, const int32_t *positions, int B,
                               int n_heads, int n_kv, int head_dim, float scale, int split_blocks, int max_splits,
                               float *part_o, float *part_ml, float *out, int ldo) {
    Launch L = {0, false};
    ICU_TRY(icu_attn_decode_launch(L, q, ldq, k_cache, v_cache, kv_dtype, block_tables, bt_width, positions, B,
                                   n_heads, n_kv, head_dim, scale, split_blocks, max_splits, part_o, part_ml, out,
                                   ldo));
    ICU_CHECK(cudaGetLastError());
    ICU_CHECK(cudaDeviceSynchronize());
    return 0;
}

extern "C" int icu_attn_prefill(const float *q, int ldq, const void *k_cache, const void *v_cache, int kv_dtype,
                                const int32_t *block_tables, const int32_t *bt_width, const int32_t *seq_qstart,
                                const int32_t *seq_pos0, int S, int max_T, int n_heads, int n_kv, int head_dim,
                                float scale, float *out, int ldo) {
    Launch L = {0, false};
    ICU_TRY(icu_attn_prefill_launch(L, q, ldq, k_cache, v_cache, kv_dtype, block_tables, bt_width, seq_qstart,
                                    seq_pos0, S, max_T, n_heads, n_kv, head_dim, scale, out, ldo));
    ICU_CHECK(cudaGetLastError());
    ICU_CHECK(cudaDeviceSynchronize());
    return 0;
}
