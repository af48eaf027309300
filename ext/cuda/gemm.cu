/* Prefill GEMM: C (M, N) float = beta * C + X (M, K) bf16 @ W (N, K)^T bf16.
 *
 * The main path is cuBLAS (compiled in when build.py finds the nvidia-cublas wheel: INFERD_HAVE_CUBLAS); the
 * fallback is our own tensor-core kernel (mma.sync m16n8k16 bf16, f32 accumulators, 64x64 block tiles, 4 warps
 * of 32x32), which is also the tests' cross-check of the cuBLAS call's transposes. */
#include "common.cuh"
#ifdef INFERD_HAVE_CUBLAS
#include <cublas_v2.h>
#endif

namespace {

constexpr int BM = 64, BN = 64, BK = 32, KPAD = BK + 8;

__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__global__ void __launch_bounds__(128) gemm_bf16_kernel(const uint16_t *X, const uint16_t *W, float *C, int M, int N,
                                                        int K, float beta) {
    __shared__ __align__(16) uint16_t xs[BM * KPAD];
    __shared__ __align__(16) uint16_t ws[BN * KPAD];
    pdl_launch_dependents();
    pdl_wait();
    const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
    const int wm = (warp >> 1) * 32, wn = (warp & 1) * 32;
    float acc[2][4][4];
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.0f;

    for (int k0 = 0; k0 < K; k0 += BK) {
        __syncthreads();
        /* 64 rows x 32 columns of each operand: 256 chunks of 8 elements, 2 per thread */
        for (int c = tid; c < BM * BK / 8; c += 128) {
            const int r = c / (BK / 8), k8 = (c % (BK / 8)) * 8;
            uint4 xv = make_uint4(0, 0, 0, 0), wv = make_uint4(0, 0, 0, 0);
            if (m0 + r < M && k0 + k8 < K) xv = *reinterpret_cast<const uint4 *>(X + (size_t)(m0 + r) * K + k0 + k8);
            if (n0 + r < N && k0 + k8 < K) wv = *reinterpret_cast<const uint4 *>(W + (size_t)(n0 + r) * K + k0 + k8);
            *reinterpret_cast<uint4 *>(xs + r * KPAD + k8) = xv;
            *reinterpret_cast<uint4 *>(ws + r * KPAD + k8) = wv;
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < BK; kk += 16) {
            uint32_t af[2][4];
#pragma unroll
            for (int mt = 0; mt < 2; ++mt) {
                const uint16_t *p = xs + (wm + mt * 16 + g) * KPAD + kk + 2 * t4;
                af[mt][0] = *reinterpret_cast<const uint32_t *>(p);
                af[mt][1] = *reinterpret_cast<const uint32_t *>(p + 8 * KPAD);
                af[mt][2] = *reinterpret_cast<const uint32_t *>(p + 8);
                af[mt][3] = *reinterpret_cast<const uint32_t *>(p + 8 * KPAD + 8);
            }
#pragma unroll
            for (int nt = 0; nt < 4; ++nt) {
                const uint16_t *p = ws + (wn + nt * 8 + g) * KPAD + kk + 2 * t4;
                const uint32_t b0 = *reinterpret_cast<const uint32_t *>(p);
                const uint32_t b1 = *reinterpret_cast<const uint32_t *>(p + 8);
#pragma unroll
                for (int mt = 0; mt < 2; ++mt) mma_bf16(acc[mt][nt], af[mt], b0, b1);
            }
        }
    }
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int row = m0 + wm + mt * 16 + g + (e >= 2 ? 8 : 0);
                const int col = n0 + wn + nt * 8 + 2 * t4 + (e & 1);
                if (row < M && col < N) {
                    float *c = C + (size_t)row * N + col;
                    *c = beta == 0.0f ? acc[mt][nt][e] : fmaf(beta, *c, acc[mt][nt][e]);
                }
            }
}

#ifdef INFERD_HAVE_CUBLAS
cublasHandle_t g_test_handle = nullptr;
#endif

}  // namespace

int icu_cublas_create(void **handle, cudaStream_t stream, void *workspace, size_t workspace_bytes) {
#ifdef INFERD_HAVE_CUBLAS
    cublasHandle_t h;
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) return ICU_ERR_CUBLAS;
    if (cublasSetStream(h, stream) != CUBLAS_STATUS_SUCCESS) { cublasDestroy(h); return ICU_ERR_CUBLAS; }
    if (workspace && cublasSetWorkspace(h, workspace, workspace_bytes) != CUBLAS_STATUS_SUCCESS) {
        cublasDestroy(h);
        return ICU_ERR_CUBLAS;
    }
    *handle = (void *)h;
    return 0;
#else
    (void)stream; (void)workspace; (void)workspace_bytes;
    *handle = nullptr;
    return 0;
#endif
}

void icu_cublas_destroy(void *handle) {
#ifdef INFERD_HAVE_CUBLAS
    if (handle) cublasDestroy((cublasHandle_t)handle);
#else
    (void)handle;
#endif
}

int icu_gemm_bf16_launch(const Launch &L, void *cublas_handle, const void *X, const void *W, float *C, int M, int N,
                         int K, float beta, int kind) {
    if (M == 0 || N == 0) return 0;
    if (M < 0 || N < 0 || K <= 0 || K % 8) return ICU_ERR_SHAPE;
#ifdef INFERD_HAVE_CUBLAS
    if (kind == 0 && cublas_handle) {
        /* column-major view: C^T (N, M) = W (N, K) . X^T (K, M), i.e. op(A) = W^T stored (K, N) transposed */
        const float alpha = 1.0f;
        cublasStatus_t st = cublasGemmEx((cublasHandle_t)cublas_handle, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &alpha, W,
                                         CUDA_R_16BF, K, X, CUDA_R_16BF, K, &beta, C, CUDA_R_32F, N,
                                         CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        return st == CUBLAS_STATUS_SUCCESS ? 0 : ICU_ERR_CUBLAS;
    }
#else
    (void)cublas_handle;
#endif
    (void)kind;
    dim3 grid(ceil_div(N, BN), ceil_div(M, BM));
    return icu_launch(L, gemm_bf16_kernel, grid, dim3(128), 0, (const uint16_t *)X, (const uint16_t *)W, C, M, N, K,
                      beta);
}

extern "C" int icu_have_cublas(void) {
#ifdef INFERD_HAVE_CUBLAS
    return 1;
#else
    return 0;
#endif
}

extern "C" int icu_gemm_bf16(const void *X, const void *W, float *C, int M, int N, int K, float beta, int kind) {
    Launch L = {0, false};
    void *h = nullptr;
#ifdef INFERD_HAVE_CUBLAS
    if (kind == 0) {
        if (!g_test_handle && cublasCreate(&g_test_handle) != CUBLAS_STATUS_SUCCESS) return ICU_ERR_CUBLAS;
        h = (void *)g_test_handle;
    }
#endif
    ICU_TRY(icu_gemm_bf16_launch(L, h, X, W, C, M, N, K, beta, kind));
    ICU_CHECK(cudaGetLastError());
    ICU_CHECK(cudaDeviceSynchronize());
    return 0;
}
