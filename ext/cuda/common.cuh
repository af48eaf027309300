/* Device helpers shared by the .cu files: error plumbing, bf16/f16 conversion, warp reductions, PDL, launches. */
#pragma once
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>
#include "inferd_cuda.h"

#define ICU_CHECK(call)                                  \
    do {                                                 \
        cudaError_t icu_e_ = (call);                     \
        if (icu_e_ != cudaSuccess) return (int)icu_e_;   \
    } while (0)

#define ICU_TRY(call)                      \
    do {                                   \
        int icu_r_ = (call);               \
        if (icu_r_ != 0) return icu_r_;    \
    } while (0)

/* the last launch's error, as an int */
static inline int icu_launch_status(void) { return (int)cudaGetLastError(); }

/* Launch settings passed down from the runner: which stream, and whether a kernel may begin while its
 * predecessor finishes (programmatic dependent launch, sm_90). Every kernel calls pdl_wait() before it reads
 * anything an earlier kernel wrote and before it writes anything, so overlap is safe; only reads of constant
 * weights come earlier. */
struct Launch {
    cudaStream_t stream;
    bool pdl;
};

template <typename... KArgs, typename... Args>
static inline int icu_launch(const Launch &L, void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem,
                             Args... args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = L.stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = L.pdl ? 1 : 0;
    return (int)cudaLaunchKernelEx(&cfg, kernel, static_cast<KArgs>(args)...);
}

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ __forceinline__ float bf16_lo(uint32_t u) { return __uint_as_float(u << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t u) { return __uint_as_float(u & 0xffff0000u); }
__device__ __forceinline__ float bf16_bits_to_float(uint16_t u) { return __uint_as_float((uint32_t)u << 16); }
__device__ __forceinline__ float f16_bits_to_float(uint16_t u) { return __half2float(__ushort_as_half(u)); }

__device__ __forceinline__ uint16_t float_to_bf16_bits(float f) {
    return __bfloat16_as_ushort(__float2bfloat16_rn(f));
}
__device__ __forceinline__ uint16_t float_to_f16_bits(float f) { return __half_as_ushort(__float2half_rn(f)); }

/* the KV cache element type: f16 or bf16, stored as raw 16-bit patterns */
template <int KV> __device__ __forceinline__ float kv_to_float(uint16_t u) {
    return KV == ICU_KV_F16 ? f16_bits_to_float(u) : bf16_bits_to_float(u);
}
template <int KV> __device__ __forceinline__ uint16_t float_to_kv(float f) {
    return KV == ICU_KV_F16 ? float_to_f16_bits(f) : float_to_bf16_bits(f);
}
/* two floats -> one 32-bit register of two KV elements, the first in the low half */
template <int KV> __device__ __forceinline__ uint32_t pack2_kv(float lo, float hi) {
    return (uint32_t)float_to_kv<KV>(lo) | ((uint32_t)float_to_kv<KV>(hi) << 16);
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
__device__ __forceinline__ unsigned long long warp_sum_u64(unsigned long long v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* 16-byte load of weights, read once per step: bypass L1 */
__device__ __forceinline__ uint4 ld_weight16(const void *p) {
    uint4 r;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
    return r;
}

/* splitmix64, as the CPU sampler: the draw for (seed, position) is rng_u64(seed, position) >> 40 over 2^24 */
__host__ __device__ __forceinline__ uint64_t icu_splitmix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}
__host__ __device__ __forceinline__ uint64_t icu_rng_u64(uint64_t seed, uint64_t position) {
    return icu_splitmix64(seed ^ icu_splitmix64(position));
}

static inline int ceil_div(int a, int b) { return (a + b - 1) / b; }

/* internal entry points shared between the .cu files (the runner calls these with its stream) */
int icu_gemv_launch(const Launch &L, const icu_mat *w, const float *x, int ldx, const float *gamma, float eps,
                    const float *res, int ldres, float *out, int ldo, int B, int swiglu);
int icu_embed_launch(const Launch &L, const icu_mat *emb, const int32_t *tokens, int T, float *x);
int icu_rmsnorm_bf16_launch(const Launch &L, const float *x, const float *gamma, float eps, int T, int dim, void *out);
int icu_swiglu_bf16_launch(const Launch &L, const float *gu, int T, int hidden, void *out);
int icu_cast_bf16_launch(const Launch &L, const float *x, int n, void *out);
int icu_gather_rows_launch(const Launch &L, const float *x, int ld, const int32_t *rows, int R, float *out);
int icu_mat_dequant_bf16_launch(const Launch &L, const icu_mat *m, void *dst);
int icu_mat_convert_launch(const Launch &L, const icu_mat *dst, int row0, int nrows, int src_type, const void *src,
                           size_t src_row_bytes, uint64_t seed, float scale);
int icu_rope_kv_launch(const Launch &L, float *qkv, int ldqkv, const float *bias, const int32_t *positions,
                       const int32_t *token_seq, const int32_t *block_tables, const int32_t *bt_width,
                       const double *inv_freq, int n_heads, int n_kv, int head_dim, int neox, int kv_dtype,
                       void *k_cache, void *v_cache, int T);
int icu_attn_decode_launch(const Launch &L, const float *q, int ldq, const void *k_cache, const void *v_cache,
                           int kv_dtype, const int32_t *block_tables, const int32_t *bt_width,
                           const int32_t *positions, int B, int n_heads, int n_kv, int head_dim, float scale,
                           int split_blocks, int max_splits, float *part_o, float *part_ml, float *out, int ldo);
int icu_attn_prefill_launch(const Launch &L, const float *q, int ldq, const void *k_cache, const void *v_cache,
                            int kv_dtype, const int32_t *block_tables, const int32_t *bt_width,
                            const int32_t *seq_qstart, const int32_t *seq_pos0, int S, int max_T, int n_heads,
                            int n_kv, int head_dim, float scale, float *out, int ldo);
int icu_sample_launch(const Launch &L, float *logits, int V, int R, const icu_sample_params *params,
                      const int32_t *adj_offset, icu_adj *adj, const uint32_t *masks, int32_t *out_tokens,
                      float *out_logprobs, int32_t *next_tokens, int32_t *next_positions);
int icu_gemm_bf16_launch(const Launch &L, void *cublas_handle, const void *X, const void *W, float *C, int M, int N,
                         int K, float beta, int kind);
int icu_cublas_create(void **handle, cudaStream_t stream, void *workspace, size_t workspace_bytes);
void icu_cublas_destroy(void *handle);
