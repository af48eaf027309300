/* Decode GEMV: out (B, N) = x (B, K) @ W (N, K)^T for a few tokens (B <= 8 per launch row of blocks).
 *
 * Memory-bound: every weight byte is read once per step with 16-byte loads, coalesced across the warp (lane l
 * reads bytes [16 l, 16 l + 16) of each 512-byte stretch of a row), and a warp keeps all of its loads for one
 * 2048-wide chunk of its rows in flight before it touches the first. The weight loads are issued before
 * pdl_wait(), so under programmatic dependent launch they overlap the previous kernel's tail.
 *
 * The input is staged per chunk in shared memory as float, multiplied by the RMSNorm weight on the way in; the
 * sum of squares is gathered in the same pass and the 1/rms factor applied to the finished dot products (a per-
 * token scalar commutes out of the sum). Epilogues: plain store, residual add (out may alias res), SwiGLU
 * (the warp owns gate row j and up row j + N and writes silu(gate) * up).
 *
 * Determinism: a lane's accumulation order depends only on K and the lane, never on B or the block's token
 * group, and the cross-lane sums are fixed xor trees, so a token's output is bit-identical in any batch. */
#include "common.cuh"

namespace {

constexpr int GEMV_THREADS = 256;
constexpr int GEMV_WARPS = GEMV_THREADS / 32;
constexpr int GEMV_KC = 2048;   /* input elements staged per chunk: fixed, so the summation order never varies */

template <int FMT> struct Fmt;
/* EPL: weight elements per 16-byte load; RPW: rows per warp (enough loads in flight per warp) */
template <> struct Fmt<ICU_BF16> { static constexpr int EPL = 8;  static constexpr int RPW = 2; };
template <> struct Fmt<ICU_I8>   { static constexpr int EPL = 16; static constexpr int RPW = 2; };
template <> struct Fmt<ICU_Q8>   { static constexpr int EPL = 16; static constexpr int RPW = 2; };
template <> struct Fmt<ICU_Q4>   { static constexpr int EPL = 32; static constexpr int RPW = 4; };
template <> struct Fmt<ICU_Q41>  { static constexpr int EPL = 32; static constexpr int RPW = 4; };

struct GemvArgs {
    const void *wq;      /* weight data (format FMT) */
    const void *ws;      /* scales */
    int N;               /* output units: rows, or rows / 2 for SwiGLU */
    int K;
    const float *x;      /* (B, ldx) */
    int ldx;
    const float *gamma;  /* (K) RMSNorm weight, or NULL: no norm */
    float eps;
    const float *res;    /* (B, ldres) added to the result, or NULL; may alias out */
    int ldres;
    float *out;          /* (B, ldo) */
    int ldo;
    int B;
};

template <int FMT>
__device__ __forceinline__ const void *weight_at(const void *q, size_t row, int K, int k) {
    if (FMT == ICU_BF16) return (const uint16_t *)q + row * K + k;
    if (FMT == ICU_I8 || FMT == ICU_Q8) return (const int8_t *)q + row * K + k;
    return (const uint8_t *)q + (row * K + k) / 2;
}

__device__ __forceinline__ float s8(uint32_t u, int j) { return (float)(int)(int8_t)((u >> (8 * j)) & 0xffu); }

/* the 8 weights of sub-slice s (elements [8 s, 8 s + 8) of the load); for Q4 minus the -8 offset, for Q41
 * the raw nibble (the caller adds m * sum(x)) */
template <int FMT>
__device__ __forceinline__ void decode8(const uint4 &w, int s, float (&f)[8]) {
    if (FMT == ICU_BF16) {
        f[0] = bf16_lo(w.x); f[1] = bf16_hi(w.x); f[2] = bf16_lo(w.y); f[3] = bf16_hi(w.y);
        f[4] = bf16_lo(w.z); f[5] = bf16_hi(w.z); f[6] = bf16_lo(w.w); f[7] = bf16_hi(w.w);
    } else if (FMT == ICU_I8 || FMT == ICU_Q8) {
        const uint32_t a = s == 0 ? w.x : w.z, b = s == 0 ? w.y : w.w;
#pragma unroll
        for (int j = 0; j < 4; ++j) { f[j] = s8(a, j); f[4 + j] = s8(b, j); }
    } else {
        /* elements 0..15 are the low nibbles of bytes 0..15, elements 16..31 the high nibbles */
        const uint32_t a = (s & 1) == 0 ? w.x : w.z, b = (s & 1) == 0 ? w.y : w.w;
        const int sh = s >= 2 ? 4 : 0;
        const float off = FMT == ICU_Q4 ? 8.0f : 0.0f;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            f[j] = (float)((a >> (8 * j + sh)) & 0xfu) - off;
            f[4 + j] = (float)((b >> (8 * j + sh)) & 0xfu) - off;
        }
    }
}

template <int FMT, int NB, bool SWIGLU>
__global__ void __launch_bounds__(GEMV_THREADS) gemv_kernel(const GemvArgs a) {
    constexpr int EPL = Fmt<FMT>::EPL;
    constexpr int RPW = SWIGLU ? (Fmt<FMT>::RPW > 1 ? Fmt<FMT>::RPW / 2 : 1) : Fmt<FMT>::RPW;  /* units/warp */
    constexpr int NR = SWIGLU ? 2 * RPW : RPW;                  /* weight rows per warp */
    constexpr int ITERS = GEMV_KC / (32 * EPL);                 /* 16-byte loads per lane per row per chunk */
    constexpr bool GROUPED = FMT == ICU_Q8 || FMT == ICU_Q4 || FMT == ICU_Q41;

    extern __shared__ float4 gemv_smem[];
    float *xs = reinterpret_cast<float *>(gemv_smem);           /* (NB, GEMV_KC) staged input */
    __shared__ float red[GEMV_WARPS][NB];

    pdl_launch_dependents();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int b0 = blockIdx.y * NB;
    const int nb = min(NB, a.B - b0);
    const int K = a.K;
    const int unit0 = (blockIdx.x * GEMV_WARPS + warp) * RPW;

    size_t rows[NR];
#pragma unroll
    for (int r = 0; r < RPW; ++r) {
        const int u = min(unit0 + r, a.N - 1);                  /* units past N compute row N-1, never stored */
        rows[r] = (size_t)u;
        if (SWIGLU) rows[RPW + r] = (size_t)u + a.N;
    }
    float row_scale[NR];
#pragma unroll
    for (int r = 0; r < NR; ++r) row_scale[r] = FMT == ICU_I8 ? ((const float *)a.ws)[rows[r]] : 1.0f;

    float acc[NR][NB];
#pragma unroll
    for (int r = 0; r < NR; ++r)
#pragma unroll
        for (int b = 0; b < NB; ++b) acc[r][b] = 0.0f;
    float ss[NB];
#pragma unroll
    for (int b = 0; b < NB; ++b) ss[b] = 0.0f;

    for (int kc = 0; kc < K; kc += GEMV_KC) {
        const int kl = min(GEMV_KC, K - kc);
        /* 1. this chunk's weights (and group scales) into registers: they depend on nothing computed */
        uint4 w[NR][ITERS];
        float gd[NR][ITERS], gm[NR][ITERS];
#pragma unroll
        for (int r = 0; r < NR; ++r)
#pragma unroll
            for (int it = 0; it < ITERS; ++it) {
                const int k = lane * EPL + it * 32 * EPL;
                w[r][it] = make_uint4(0, 0, 0, 0);
                gd[r][it] = 0.0f;
                gm[r][it] = 0.0f;
                if (k < kl) {
                    w[r][it] = ld_weight16(weight_at<FMT>(a.wq, rows[r], K, kc + k));
                    if (GROUPED) {
                        const size_t g = (rows[r] * K + kc + k) / 32;
                        if (FMT == ICU_Q41) {
                            const __half2 dm = ((const __half2 *)a.ws)[g];
                            gd[r][it] = __low2float(dm);
                            gm[r][it] = __high2float(dm);
                        } else {
                            gd[r][it] = __half2float(((const __half *)a.ws)[g]);
                        }
                    }
                }
            }
        /* 2. stage the input chunk (x * gamma) and gather the sum of squares */
        if (kc == 0) pdl_wait();
        __syncthreads();                                        /* the previous chunk's readers are done */
#pragma unroll
        for (int b = 0; b < NB; ++b) {
            const float *xr = a.x + (size_t)(b0 + min(b, nb - 1)) * a.ldx + kc;   /* pad rows repeat the last */
            for (int i = threadIdx.x; i < kl / 4; i += GEMV_THREADS) {
                float4 v = *reinterpret_cast<const float4 *>(xr + 4 * i);
                float t = v.x * v.x;
                t = fmaf(v.y, v.y, t);
                t = fmaf(v.z, v.z, t);
                t = fmaf(v.w, v.w, t);
                ss[b] += t;
                if (a.gamma) {
                    const float4 g = *reinterpret_cast<const float4 *>(a.gamma + kc + 4 * i);
                    v.x *= g.x; v.y *= g.y; v.z *= g.z; v.w *= g.w;
                }
                *reinterpret_cast<float4 *>(xs + b * GEMV_KC + 4 * i) = v;
            }
        }
        __syncthreads();
        /* 3. dot products */
#pragma unroll
        for (int it = 0; it < ITERS; ++it) {
            const int k = lane * EPL + it * 32 * EPL;
            if (k < kl) {
                float part[NR][NB];
                float sx[NB];
#pragma unroll
                for (int r = 0; r < NR; ++r)
#pragma unroll
                    for (int b = 0; b < NB; ++b) part[r][b] = 0.0f;
#pragma unroll
                for (int b = 0; b < NB; ++b) sx[b] = 0.0f;
#pragma unroll
                for (int s = 0; s < EPL / 8; ++s) {
                    float xv[NB][8];
#pragma unroll
                    for (int b = 0; b < NB; ++b) {
                        const float4 lo = *reinterpret_cast<const float4 *>(xs + b * GEMV_KC + k + 8 * s);
                        const float4 hi = *reinterpret_cast<const float4 *>(xs + b * GEMV_KC + k + 8 * s + 4);
                        xv[b][0] = lo.x; xv[b][1] = lo.y; xv[b][2] = lo.z; xv[b][3] = lo.w;
                        xv[b][4] = hi.x; xv[b][5] = hi.y; xv[b][6] = hi.z; xv[b][7] = hi.w;
                        if (FMT == ICU_Q41) {
                            float t = xv[b][0];
#pragma unroll
                            for (int j = 1; j < 8; ++j) t += xv[b][j];
                            sx[b] += t;
                        }
                    }
#pragma unroll
                    for (int r = 0; r < NR; ++r) {
                        float f[8];
                        decode8<FMT>(w[r][it], s, f);
#pragma unroll
                        for (int b = 0; b < NB; ++b) {
                            float d = f[0] * xv[b][0];
#pragma unroll
                            for (int j = 1; j < 8; ++j) d = fmaf(f[j], xv[b][j], d);
                            part[r][b] += d;
                        }
                    }
                }
#pragma unroll
                for (int r = 0; r < NR; ++r)
#pragma unroll
                    for (int b = 0; b < NB; ++b) {
                        if (FMT == ICU_Q41)
                            acc[r][b] += fmaf(gd[r][it], part[r][b], gm[r][it] * sx[b]);
                        else if (GROUPED)
                            acc[r][b] = fmaf(gd[r][it], part[r][b], acc[r][b]);
                        else
                            acc[r][b] += part[r][b];
                    }
            }
        }
    }

    /* 1/rms per token, from the block's sum of squares (fixed order) */
#pragma unroll
    for (int b = 0; b < NB; ++b) {
        const float v = warp_sum(ss[b]);
        if (lane == 0) red[warp][b] = v;
    }
    __syncthreads();
    float inv[NB];
#pragma unroll
    for (int b = 0; b < NB; ++b) {
        float t = 0.0f;
#pragma unroll
        for (int i = 0; i < GEMV_WARPS; ++i) t += red[i][b];
        inv[b] = a.gamma ? 1.0f / sqrtf(t / (float)K + a.eps) : 1.0f;
    }

#pragma unroll
    for (int r = 0; r < RPW; ++r) {
        const int unit = unit0 + r;
#pragma unroll
        for (int b = 0; b < NB; ++b) {
            float v = warp_sum(acc[r][b]) * row_scale[r] * inv[b];
            if (SWIGLU) {
                const float up = warp_sum(acc[RPW + r][b]) * row_scale[RPW + r] * inv[b];
                v = v / (1.0f + expf(-v)) * up;
            }
            if (lane == b && b < nb && unit < a.N) {
                const size_t t = (size_t)(b0 + b);
                if (a.res) v += a.res[t * a.ldres + unit];
                a.out[t * a.ldo + unit] = v;
            }
        }
    }
}

template <int FMT, int NB, bool SWIGLU>
int launch_gemv(const Launch &L, const GemvArgs &a) {
    constexpr int RPW = SWIGLU ? (Fmt<FMT>::RPW > 1 ? Fmt<FMT>::RPW / 2 : 1) : Fmt<FMT>::RPW;
    auto kernel = gemv_kernel<FMT, NB, SWIGLU>;
    const size_t smem = (size_t)NB * GEMV_KC * sizeof(float);
    static bool attr_set = false;   /* set once per kernel, before any graph capture (the runner warms up) */
    if (!attr_set) {
        ICU_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        attr_set = true;
    }
    dim3 grid(ceil_div(a.N, GEMV_WARPS * RPW), ceil_div(a.B, NB));
    return icu_launch(L, kernel, grid, dim3(GEMV_THREADS), smem, a);
}

template <int FMT, bool SWIGLU>
int launch_nb(const Launch &L, const GemvArgs &a) {
    if (a.B == 1) return launch_gemv<FMT, 1, SWIGLU>(L, a);
    if (a.B == 2) return launch_gemv<FMT, 2, SWIGLU>(L, a);
    if (a.B <= 4) return launch_gemv<FMT, 4, SWIGLU>(L, a);
    return launch_gemv<FMT, 8, SWIGLU>(L, a);
}

template <bool SWIGLU>
int launch_fmt(const Launch &L, int fmt, const GemvArgs &a) {
    switch (fmt) {
        case ICU_BF16: return launch_nb<ICU_BF16, SWIGLU>(L, a);
        case ICU_I8: return launch_nb<ICU_I8, SWIGLU>(L, a);
        case ICU_Q8: return launch_nb<ICU_Q8, SWIGLU>(L, a);
        case ICU_Q4: return launch_nb<ICU_Q4, SWIGLU>(L, a);
        case ICU_Q41: return launch_nb<ICU_Q41, SWIGLU>(L, a);
    }
    return ICU_ERR_UNSUPPORTED;
}

bool aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

}  // namespace

int icu_gemv_launch(const Launch &L, const icu_mat *w, const float *x, int ldx, const float *gamma, float eps,
                    const float *res, int ldres, float *out, int ldo, int B, int swiglu) {
    if (!w || !x || !out || B < 0) return ICU_ERR_ARG;
    if (B == 0) return 0;
    const int K = w->cols;
    const int N = swiglu ? w->rows / 2 : w->rows;
    if (N <= 0 || K <= 0 || (swiglu && w->rows % 2)) return ICU_ERR_SHAPE;
    if (K % (w->fmt == ICU_BF16 ? 8 : 32)) return ICU_ERR_SHAPE;
    if (ldx % 4 || ldx < K || ldo < N || (res && ldres < N)) return ICU_ERR_SHAPE;
    if (!aligned16(x) || (gamma && !aligned16(gamma)) || !aligned16(w->q)) return ICU_ERR_ARG;
    GemvArgs a;
    a.wq = w->q; a.ws = w->s; a.N = N; a.K = K; a.x = x; a.ldx = ldx; a.gamma = gamma; a.eps = eps;
    a.res = res; a.ldres = ldres; a.out = out; a.ldo = ldo; a.B = B;
    return swiglu ? launch_fmt<true>(L, w->fmt, a) : launch_fmt<false>(L, w->fmt, a);
}

extern "C" int icu_gemv(const icu_mat *w, const float *x, int ldx, const float *gamma, float eps, const float *res,
                        int ldres, float *out, int ldo, int B, int swiglu) {
    Launch L = {0, false};
    ICU_TRY(icu_gemv_launch(L, w, x, ldx, gamma, eps, res, ldres, out, ldo, B, swiglu));
    ICU_CHECK(cudaGetLastError());
    ICU_CHECK(cudaDeviceSynchronize());
    return 0;
}
