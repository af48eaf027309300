/* Small kernels: embedding rows, RMSNorm to bf16 and SwiGLU for the GEMM path, weight conversion and
 * quantization at load time, dequantization to bf16 for prefill GEMMs; and the device utilities. */
#include <math.h>
#include <string.h>
#include <algorithm>
#include <vector>
#include "common.cuh"

namespace {

/* element (row, k) of a device weight matrix, as float */
__device__ __forceinline__ float mat_elem(int fmt, const void *q, const void *s, int K, size_t row, int k) {
    const size_t i = row * K + k;
    switch (fmt) {
        case ICU_BF16: return bf16_bits_to_float(((const uint16_t *)q)[i]);
        case ICU_I8: return (float)((const int8_t *)q)[i] * ((const float *)s)[row];
        case ICU_Q8: return (float)((const int8_t *)q)[i] * __half2float(((const __half *)s)[i / 32]);
        default: {
            const uint8_t byte = ((const uint8_t *)q)[(i / 32) * 16 + (k % 32) % 16];
            const int nib = (k % 32) < 16 ? (byte & 15) : (byte >> 4);
            if (fmt == ICU_Q4) return (float)(nib - 8) * __half2float(((const __half *)s)[i / 32]);
            const __half2 dm = ((const __half2 *)s)[i / 32];
            return (float)nib * __low2float(dm) + __high2float(dm);
        }
    }
}

__global__ void embed_kernel(int fmt, const void *q, const void *s, int rows, int K, const int32_t *tokens, float *x) {
    pdl_launch_dependents();
    pdl_wait();
    const int t = blockIdx.x;
    int tok = tokens[t];
    tok = tok < 0 ? 0 : (tok >= rows ? rows - 1 : tok);
    for (int k = threadIdx.x; k < K; k += blockDim.x) x[(size_t)t * K + k] = mat_elem(fmt, q, s, K, (size_t)tok, k);
}

__device__ float block_sum_256(float v, float *red) {
    v = warp_sum(v);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
    __syncthreads();
    float t = 0.0f;
    for (int w = 0; w < (int)(blockDim.x >> 5); ++w) t += red[w];
    return t;
}

__global__ void rmsnorm_bf16_kernel(const float *x, const float *gamma, float eps, int dim, uint16_t *out) {
    __shared__ float red[32];
    pdl_launch_dependents();
    pdl_wait();
    const float *xr = x + (size_t)blockIdx.x * dim;
    float ss = 0.0f;
    for (int k = threadIdx.x; k < dim; k += blockDim.x) ss = fmaf(xr[k], xr[k], ss);
    const float inv = 1.0f / sqrtf(block_sum_256(ss, red) / (float)dim + eps);
    for (int k = threadIdx.x; k < dim; k += blockDim.x)
        out[(size_t)blockIdx.x * dim + k] = float_to_bf16_bits(xr[k] * inv * gamma[k]);
}

__global__ void swiglu_bf16_kernel(const float *gu, int T, int H, uint16_t *out) {
    pdl_launch_dependents();
    pdl_wait();
    const size_t n = (size_t)T * H;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const size_t t = i / H, j = i % H;
        const float g = gu[t * 2 * H + j], u = gu[t * 2 * H + H + j];
        out[i] = float_to_bf16_bits(g / (1.0f + expf(-g)) * u);
    }
}

__global__ void cast_bf16_kernel(const float *x, size_t n, uint16_t *out) {
    pdl_launch_dependents();
    pdl_wait();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        out[i] = float_to_bf16_bits(x[i]);
}

__global__ void gather_rows_kernel(const float *x, int ld, const int32_t *rows, float *out) {
    pdl_launch_dependents();
    pdl_wait();
    const float *src = x + (size_t)rows[blockIdx.x] * ld;
    for (int k = threadIdx.x; k < ld; k += blockDim.x) out[(size_t)blockIdx.x * ld + k] = src[k];
}

__global__ void dequant_bf16_kernel(int fmt, const void *q, const void *s, int rows, int K, uint16_t *out) {
    const size_t n = (size_t)rows * K;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const size_t row = i / K;
        const int k = (int)(i % K);
        out[i] = fmt == ICU_BF16 ? ((const uint16_t *)q)[i] : float_to_bf16_bits(mat_elem(fmt, q, s, K, row, k));
    }
}

/* ---- load-time conversion: one block per row; the row is decoded to float in shared memory, then encoded */

__device__ __forceinline__ uint16_t rd16(const uint8_t *p) { return (uint16_t)p[0] | ((uint16_t)p[1] << 8); }

__device__ float src_elem(int src, const uint8_t *srow, uint64_t seed, float scale, size_t row, int K, int k) {
    switch (src) {
        case ICU_SRC_F32: return ((const float *)srow)[k];
        case ICU_SRC_F16: return f16_bits_to_float(((const uint16_t *)srow)[k]);
        case ICU_SRC_BF16: return bf16_bits_to_float(((const uint16_t *)srow)[k]);
        case ICU_SRC_Q8_0: {
            const uint8_t *blk = srow + (k / 32) * 34;
            return (float)(int8_t)blk[2 + k % 32] * f16_bits_to_float(rd16(blk));
        }
        case ICU_SRC_Q4_0: {
            const uint8_t *blk = srow + (k / 32) * 18;
            const uint8_t b = blk[2 + (k % 32) % 16];
            const int nib = (k % 32) < 16 ? (b & 15) : (b >> 4);
            return (float)(nib - 8) * f16_bits_to_float(rd16(blk));
        }
        case ICU_SRC_Q4_1: {
            const uint8_t *blk = srow + (k / 32) * 20;
            const uint8_t b = blk[4 + (k % 32) % 16];
            const int nib = (k % 32) < 16 ? (b & 15) : (b >> 4);
            return (float)nib * f16_bits_to_float(rd16(blk)) + f16_bits_to_float(rd16(blk + 2));
        }
        default: {
            const uint64_t r = icu_rng_u64(seed, ((uint64_t)row << 32) | (uint32_t)k);
            return scale * ((float)(r >> 40) * (2.0f / 16777216.0f) - 1.0f);
        }
    }
}

struct ConvertArgs {
    int fmt, K, row0;
    void *q, *s;
    int src;
    const uint8_t *srcp;
    size_t src_row_bytes;
    uint64_t seed;
    float scale;
};

__global__ void __launch_bounds__(256) convert_kernel(const ConvertArgs a) {
    extern __shared__ float conv_x[];
    __shared__ float red[32];
    const int K = a.K;
    const size_t row = (size_t)a.row0 + blockIdx.x;
    const uint8_t *srow = a.srcp ? a.srcp + blockIdx.x * a.src_row_bytes : nullptr;
    const int ng = K / 32;
    /* exact block copies */
    if (a.src == ICU_SRC_Q8_0 && a.fmt == ICU_Q8) {
        for (int k = threadIdx.x; k < K; k += blockDim.x) ((int8_t *)a.q)[row * K + k] = (int8_t)srow[(k / 32) * 34 + 2 + k % 32];
        for (int g = threadIdx.x; g < ng; g += blockDim.x) ((uint16_t *)a.s)[row * ng + g] = rd16(srow + g * 34);
        return;
    }
    if ((a.src == ICU_SRC_Q4_0 && a.fmt == ICU_Q4) || (a.src == ICU_SRC_Q4_1 && a.fmt == ICU_Q41)) {
        const int bs = a.src == ICU_SRC_Q4_0 ? 18 : 20, hdr = bs - 16;
        for (int i = threadIdx.x; i < K / 2; i += blockDim.x)
            ((uint8_t *)a.q)[row * (K / 2) + i] = srow[(i / 16) * bs + hdr + i % 16];
        for (int g = threadIdx.x; g < ng; g += blockDim.x) {
            ((uint16_t *)a.s)[(row * ng + g) * (hdr / 2)] = rd16(srow + g * bs);
            if (hdr == 4) ((uint16_t *)a.s)[(row * ng + g) * 2 + 1] = rd16(srow + g * bs + 2);
        }
        return;
    }
    for (int k = threadIdx.x; k < K; k += blockDim.x) conv_x[k] = src_elem(a.src, srow, a.seed, a.scale, row, K, k);
    __syncthreads();
    switch (a.fmt) {
        case ICU_BF16:
            for (int k = threadIdx.x; k < K; k += blockDim.x) ((uint16_t *)a.q)[row * K + k] = float_to_bf16_bits(conv_x[k]);
            break;
        case ICU_I8: {
            float amax = 0.0f;
            for (int k = threadIdx.x; k < K; k += blockDim.x) amax = fmaxf(amax, fabsf(conv_x[k]));
            amax = warp_max(amax);
            if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = amax;
            __syncthreads();
            amax = 0.0f;
            for (int w = 0; w < (int)(blockDim.x >> 5); ++w) amax = fmaxf(amax, red[w]);
            const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
            for (int k = threadIdx.x; k < K; k += blockDim.x) ((int8_t *)a.q)[row * K + k] = (int8_t)roundf(__fmul_rn(conv_x[k], id));
            if (threadIdx.x == 0) ((float *)a.s)[row] = d;
            break;
        }
        case ICU_Q8:
            for (int g = threadIdx.x; g < ng; g += blockDim.x) {
                const float *x = conv_x + g * 32;
                float amax = 0.0f;
                for (int j = 0; j < 32; ++j) amax = fmaxf(amax, fabsf(x[j]));
                const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
                for (int j = 0; j < 32; ++j) ((int8_t *)a.q)[row * K + g * 32 + j] = (int8_t)roundf(__fmul_rn(x[j], id));
                ((uint16_t *)a.s)[row * ng + g] = float_to_f16_bits(d);
            }
            break;
        case ICU_Q4:   /* ggml's quantize_row_q4_0_ref: the value of largest magnitude maps to -8 */
            for (int g = threadIdx.x; g < ng; g += blockDim.x) {
                const float *x = conv_x + g * 32;
                float amax = 0.0f, mx = 0.0f;
                for (int j = 0; j < 32; ++j)
                    if (amax < fabsf(x[j])) { amax = fabsf(x[j]); mx = x[j]; }
                const float d = mx / -8.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
                for (int j = 0; j < 16; ++j) {
                    /* __fmul_rn: no fused multiply-add, so the codes equal ggml's (and numpy's) bit for bit */
                    const int x0 = min(15, (int)(int8_t)(__fmul_rn(x[j], id) + 8.5f));
                    const int x1 = min(15, (int)(int8_t)(__fmul_rn(x[16 + j], id) + 8.5f));
                    ((uint8_t *)a.q)[row * (K / 2) + g * 16 + j] = (uint8_t)(x0 | (x1 << 4));
                }
                ((uint16_t *)a.s)[row * ng + g] = float_to_f16_bits(d);
            }
            break;
        case ICU_Q41:  /* ggml's quantize_row_q4_1_ref */
            for (int g = threadIdx.x; g < ng; g += blockDim.x) {
                const float *x = conv_x + g * 32;
                float mn = INFINITY, mx = -INFINITY;
                for (int j = 0; j < 32; ++j) { mn = fminf(mn, x[j]); mx = fmaxf(mx, x[j]); }
                const float d = (mx - mn) / 15.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
                for (int j = 0; j < 16; ++j) {
                    const int x0 = min(15, (int)(int8_t)(__fmul_rn(x[j] - mn, id) + 0.5f));
                    const int x1 = min(15, (int)(int8_t)(__fmul_rn(x[16 + j] - mn, id) + 0.5f));
                    ((uint8_t *)a.q)[row * (K / 2) + g * 16 + j] = (uint8_t)(x0 | (x1 << 4));
                }
                ((uint16_t *)a.s)[(row * ng + g) * 2] = float_to_f16_bits(d);
                ((uint16_t *)a.s)[(row * ng + g) * 2 + 1] = float_to_f16_bits(mn);
            }
            break;
    }
}

__global__ void copy_kernel(const uint4 *src, uint4 *dst, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = src[i];
}

int grid_for(size_t n, int threads) {
    size_t b = (n + threads - 1) / threads;
    return (int)std::min<size_t>(std::max<size_t>(b, 1), 65535 * 8);
}

}  // namespace

/* ---- launchers ---- */

int icu_embed_launch(const Launch &L, const icu_mat *emb, const int32_t *tokens, int T, float *x) {
    if (T == 0) return 0;
    return icu_launch(L, embed_kernel, dim3(T), dim3(256), 0, emb->fmt, (const void *)emb->q, (const void *)emb->s,
                      emb->rows, emb->cols, tokens, x);
}

int icu_rmsnorm_bf16_launch(const Launch &L, const float *x, const float *gamma, float eps, int T, int dim, void *out) {
    if (T == 0) return 0;
    return icu_launch(L, rmsnorm_bf16_kernel, dim3(T), dim3(256), 0, x, gamma, eps, dim, (uint16_t *)out);
}

int icu_swiglu_bf16_launch(const Launch &L, const float *gu, int T, int hidden, void *out) {
    if (T == 0) return 0;
    return icu_launch(L, swiglu_bf16_kernel, dim3(grid_for((size_t)T * hidden, 256)), dim3(256), 0, gu, T, hidden,
                      (uint16_t *)out);
}

int icu_cast_bf16_launch(const Launch &L, const float *x, int n, void *out) {
    if (n == 0) return 0;
    return icu_launch(L, cast_bf16_kernel, dim3(grid_for((size_t)n, 256)), dim3(256), 0, x, (size_t)n, (uint16_t *)out);
}

int icu_gather_rows_launch(const Launch &L, const float *x, int ld, const int32_t *rows, int R, float *out) {
    if (R == 0) return 0;
    return icu_launch(L, gather_rows_kernel, dim3(R), dim3(256), 0, x, ld, rows, out);
}

int icu_mat_dequant_bf16_launch(const Launch &L, const icu_mat *m, void *dst) {
    const size_t n = (size_t)m->rows * m->cols;
    if (n == 0) return 0;
    return icu_launch(L, dequant_bf16_kernel, dim3(grid_for(n, 256)), dim3(256), 0, m->fmt, (const void *)m->q,
                      (const void *)m->s, m->rows, m->cols, (uint16_t *)dst);
}

int icu_mat_convert_launch(const Launch &L, const icu_mat *dst, int row0, int nrows, int src_type, const void *src,
                           size_t src_row_bytes, uint64_t seed, float scale) {
    if (nrows == 0) return 0;
    if (row0 < 0 || nrows < 0 || row0 + nrows > dst->rows) return ICU_ERR_SHAPE;
    if (dst->fmt != ICU_BF16 && dst->cols % 32) return ICU_ERR_SHAPE;
    if (src_type != ICU_SRC_RANDOM && !src) return ICU_ERR_ARG;
    if (src_type < ICU_SRC_F32 || src_type > ICU_SRC_RANDOM || dst->fmt < ICU_BF16 || dst->fmt > ICU_Q41)
        return ICU_ERR_UNSUPPORTED;
    if (dst->fmt == ICU_Q41 && src_type != ICU_SRC_Q4_1) return ICU_ERR_UNSUPPORTED;  /* only exact copies */
    if ((src_type == ICU_SRC_Q8_0 || src_type == ICU_SRC_Q4_0 || src_type == ICU_SRC_Q4_1) && dst->cols % 32)
        return ICU_ERR_SHAPE;
    const size_t smem = (size_t)dst->cols * sizeof(float);
    static size_t smem_set = 0;
    if (smem > 48 * 1024 && smem > smem_set) {
        ICU_CHECK(cudaFuncSetAttribute(convert_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        smem_set = smem;
    }
    ConvertArgs a = {dst->fmt, dst->cols, row0, dst->q, dst->s, src_type, (const uint8_t *)src, src_row_bytes, seed,
                     scale};
    return icu_launch(L, convert_kernel, dim3(nrows), dim3(256), smem, a);
}

/* ---- C API: utilities and single kernels ---- */

extern "C" const char *icu_error_string(int err) {
    switch (err) {
        case 0: return "no error";
        case ICU_ERR_ARG: return "bad argument";
        case ICU_ERR_SHAPE: return "unsupported or inconsistent shape";
        case ICU_ERR_CAPACITY: return "batch exceeds the capacity the engine was created with";
        case ICU_ERR_UNSUPPORTED: return "unsupported format, head size or type";
        case ICU_ERR_CUBLAS: return "cuBLAS call failed";
        case ICU_ERR_STATE: return "operation not valid in this state";
    }
    return cudaGetErrorString((cudaError_t)err);
}

extern "C" int icu_device_count(int *count) {
    *count = 0;
    cudaError_t e = cudaGetDeviceCount(count);
    if (e != cudaSuccess) { *count = 0; cudaGetLastError(); return (int)e; }
    return 0;
}

extern "C" int icu_device_info(int dev, char *name, int name_len, int *cc_major, int *cc_minor, int *sm_count,
                               size_t *total_mem, size_t *l2_bytes) {
    cudaDeviceProp p;
    ICU_CHECK(cudaGetDeviceProperties(&p, dev));
    if (name && name_len > 0) { strncpy(name, p.name, name_len - 1); name[name_len - 1] = 0; }
    *cc_major = p.major;
    *cc_minor = p.minor;
    *sm_count = p.multiProcessorCount;
    *total_mem = p.totalGlobalMem;
    *l2_bytes = (size_t)p.l2CacheSize;
    return 0;
}

extern "C" int icu_set_device(int dev) { ICU_CHECK(cudaSetDevice(dev)); return 0; }
extern "C" int icu_malloc(void **p, size_t nbytes) { ICU_CHECK(cudaMalloc(p, nbytes ? nbytes : 16)); return 0; }
extern "C" int icu_free(void *p) { ICU_CHECK(cudaFree(p)); return 0; }
extern "C" int icu_memcpy_h2d(void *dst, const void *src, size_t n) {
    ICU_CHECK(cudaMemcpy(dst, src, n, cudaMemcpyHostToDevice));
    return 0;
}
extern "C" int icu_memcpy_d2h(void *dst, const void *src, size_t n) {
    ICU_CHECK(cudaMemcpy(dst, src, n, cudaMemcpyDeviceToHost));
    return 0;
}
extern "C" int icu_memset(void *p, int value, size_t n) { ICU_CHECK(cudaMemset(p, value, n)); return 0; }
extern "C" int icu_synchronize(void) { ICU_CHECK(cudaDeviceSynchronize()); return 0; }

extern "C" int icu_copy_bandwidth(size_t nbytes, int iters, double *bytes_per_s) {
    nbytes &= ~(size_t)15;
    if (nbytes == 0 || iters <= 0) return ICU_ERR_ARG;
    void *a = nullptr, *b = nullptr;
    ICU_CHECK(cudaMalloc(&a, nbytes));
    cudaError_t e = cudaMalloc(&b, nbytes);
    if (e != cudaSuccess) { cudaFree(a); return (int)e; }
    cudaMemset(a, 1, nbytes);
    cudaEvent_t t0, t1;
    cudaEventCreate(&t0);
    cudaEventCreate(&t1);
    const size_t n = nbytes / 16;
    std::vector<float> ms;
    for (int i = 0; i < iters + 2; ++i) {
        cudaEventRecord(t0);
        copy_kernel<<<grid_for(n, 256) < 132 * 32 ? grid_for(n, 256) : 132 * 32, 256>>>((const uint4 *)a, (uint4 *)b, n);
        cudaEventRecord(t1);
        cudaEventSynchronize(t1);
        float t = 0.0f;
        cudaEventElapsedTime(&t, t0, t1);
        if (i >= 2) ms.push_back(t);   /* two warm-ups */
    }
    e = cudaGetLastError();
    cudaEventDestroy(t0);
    cudaEventDestroy(t1);
    cudaFree(a);
    cudaFree(b);
    if (e != cudaSuccess) return (int)e;
    std::sort(ms.begin(), ms.end());
    *bytes_per_s = 2.0 * (double)nbytes / (ms[ms.size() / 2] * 1e-3);
    return 0;
}

extern "C" size_t icu_mat_q_bytes(int fmt, int rows, int cols) {
    const size_t n = (size_t)rows * cols;
    switch (fmt) {
        case ICU_BF16: return 2 * n;
        case ICU_I8: case ICU_Q8: return n;
        default: return n / 2;
    }
}

extern "C" size_t icu_mat_s_bytes(int fmt, int rows, int cols) {
    switch (fmt) {
        case ICU_BF16: return 0;
        case ICU_I8: return (size_t)rows * 4;
        case ICU_Q41: return (size_t)rows * (cols / 32) * 4;
        default: return (size_t)rows * (cols / 32) * 2;
    }
}

extern "C" int icu_mat_convert(const icu_mat *dst, int row0, int nrows, int src_type, const void *src,
                               size_t src_row_bytes, uint64_t seed, float scale) {
    Launch L = {0, false};
    ICU_TRY(icu_mat_convert_launch(L, dst, row0, nrows, src_type, src, src_row_bytes, seed, scale));
    ICU_CHECK(cudaGetLastError());
    ICU_CHECK(cudaDeviceSynchronize());
    return 0;
}

extern "C" int icu_mat_dequant_bf16(const icu_mat *m, void *dst) {
    Launch L = {0, false};
    ICU_TRY(icu_mat_dequant_bf16_launch(L, m, dst));
    ICU_CHECK(cudaGetLastError());
    ICU_CHECK(cudaDeviceSynchronize());
    return 0;
}

extern "C" int icu_embed(const icu_mat *emb, const int32_t *tokens, int T, float *x) {
    Launch L = {0, false};
    ICU_TRY(icu_embed_launch(L, emb, tokens, T, x));
    ICU_CHECK(cudaGetLastError());
    ICU_CHECK(cudaDeviceSynchronize());
    return 0;
}

extern "C" int icu_rmsnorm_bf16(const float *x, const float *gamma, float eps, int T, int dim, void *out) {
    Launch L = {0, false};
    ICU_TRY(icu_rmsnorm_bf16_launch(L, x, gamma, eps, T, dim, out));
    ICU_CHECK(cudaGetLastError());
    ICU_CHECK(cudaDeviceSynchronize());
    return 0;
}
