/* y = W x for float weights and many tokens (an encoder's batch): W repacked at load into panels of 16 rows, the
 * panel's 16 values of input k side by side, so that a vector load gives 16 rows of one column and meets a
 * broadcast x[t][k] of several tokens at once (the outer-product GEMM form; matmul.c's float path is a dot product
 * per row and token, fine for a decode step, a third of the FMA rate for a batch).
 *
 * Every output is acc = fma(w[r][k], x[t][k], acc) for k = 0, 1, ... in order from 0, then y = acc or y + acc:
 * the scalar, AVX2 (16 rows x 6 tokens: 12 ymm accumulators) and AVX-512 (32 rows x 12 tokens in zmm) kernels do
 * exactly that, so all paths give the same bits and a token's row does not depend on the batch. */
#include <stdlib.h>
#include <string.h>
#include "encoder.h"
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#define PR PANEL_ROWS
#define NT 6                /* tokens per AVX2 pass: 12 accumulators + 2 weight vectors + 1 broadcast of 16 ymm */
#define NT512 12            /* tokens per AVX-512 pass: 24 accumulators of 32 zmm; a batch of up to 12 tokens (one
                             * short query) streams each weight once */

float *pack_panels(const weight_t *w) {
    if (weight_is_quantized(w->type)) return NULL;
    int panels = (w->rows + PR - 1) / PR;
    float *out = NULL;
    if (posix_memalign((void **)&out, 64, (size_t)panels * w->cols * PR * sizeof(float))) return NULL;
    float *row = malloc((size_t)w->cols * sizeof(float));
    if (!row) { free(out); return NULL; }
    for (int p = 0; p < panels; p++)
        for (int r = 0; r < PR; r++) {
            int src = p * PR + r;
            if (src < w->rows) weight_dequant_row(w, src, row);        /* f16/bf16 -> f32 is exact */
            else memset(row, 0, (size_t)w->cols * sizeof(float));
            for (int k = 0; k < w->cols; k++) out[((size_t)p * w->cols + k) * PR + r] = row[k];
        }
    free(row);
    return out;
}

static inline void store_rows(float *y, const float *acc, int nrows, int accumulate) {
    for (int r = 0; r < nrows; r++) y[r] = accumulate ? y[r] + acc[r] : acc[r];
}

static void gemm_scalar(const float *panels, int rows, int cols, int pb, int pe, int ntok, const float *x, float *y,
                        int ldy, int accumulate) {
    for (int p = pb; p < pe; p++) {
        const float *P = panels + (size_t)p * cols * PR;
        int nrows = rows - p * PR < PR ? rows - p * PR : PR;
        for (int t = 0; t < ntok; t++) {
            float acc[PR];
            for (int r = 0; r < PR; r++) {
                float a = 0.0f;
                for (int k = 0; k < cols; k++) a = __builtin_fmaf(P[(size_t)k * PR + r], x[(size_t)t * cols + k], a);
                acc[r] = a;
            }
            store_rows(y + (size_t)t * ldy + (p - pb) * PR, acc, nrows, accumulate);
        }
    }
}

#if defined(__x86_64__)
#define ATTR_AVX2 __attribute__((target("avx2,fma")))
#define ATTR_AVX512 __attribute__((target("avx2,fma,avx512f")))

/* n tokens (1..NT) of one panel; inlined with constant n */
ATTR_AVX2 static inline __attribute__((always_inline)) void panel_avx2(const float *P, int cols, const float *x,
                                                                       int n, float *acc_out) {
    __m256 a[NT][2];
    for (int i = 0; i < n; i++) a[i][0] = a[i][1] = _mm256_setzero_ps();
    for (int k = 0; k < cols; k++) {
        __m256 w0 = _mm256_load_ps(P + (size_t)k * PR), w1 = _mm256_load_ps(P + (size_t)k * PR + 8);
        for (int i = 0; i < n; i++) {
            __m256 xb = _mm256_broadcast_ss(x + (size_t)i * cols + k);
            a[i][0] = _mm256_fmadd_ps(w0, xb, a[i][0]);
            a[i][1] = _mm256_fmadd_ps(w1, xb, a[i][1]);
        }
    }
    for (int i = 0; i < n; i++) {
        _mm256_storeu_ps(acc_out + i * PR, a[i][0]);
        _mm256_storeu_ps(acc_out + i * PR + 8, a[i][1]);
    }
}

ATTR_AVX2 static void gemm_avx2(const float *panels, int rows, int cols, int pb, int pe, int ntok, const float *x,
                                float *y, int ldy, int accumulate) {
    float acc[NT * PR];
    for (int p = pb; p < pe; p++) {
        const float *P = panels + (size_t)p * cols * PR;
        int nrows = rows - p * PR < PR ? rows - p * PR : PR;
        for (int t = 0; t < ntok; t += NT) {
            int n = ntok - t < NT ? ntok - t : NT;
            const float *xt = x + (size_t)t * cols;
            switch (n) {
            case 6: panel_avx2(P, cols, xt, 6, acc); break;
            case 5: panel_avx2(P, cols, xt, 5, acc); break;
            case 4: panel_avx2(P, cols, xt, 4, acc); break;
            case 3: panel_avx2(P, cols, xt, 3, acc); break;
            case 2: panel_avx2(P, cols, xt, 2, acc); break;
            default: panel_avx2(P, cols, xt, 1, acc);
            }
            for (int i = 0; i < n; i++)
                store_rows(y + (size_t)(t + i) * ldy + (p - pb) * PR, acc + i * PR, nrows, accumulate);
        }
    }
}

/* n tokens of np (1 or 2) adjacent panels, one zmm per panel */
ATTR_AVX512 static inline __attribute__((always_inline)) void panels_avx512(const float *P, int cols, const float *x,
                                                                           int n, int np, float *acc_out) {
    __m512 a[NT512][2];
    const float *P1 = P + (size_t)cols * PR;
    for (int i = 0; i < n; i++) a[i][0] = a[i][1] = _mm512_setzero_ps();
    for (int k = 0; k < cols; k++) {
        __m512 w0 = _mm512_load_ps(P + (size_t)k * PR);
        __m512 w1 = np == 2 ? _mm512_load_ps(P1 + (size_t)k * PR) : w0;
        for (int i = 0; i < n; i++) {
            __m512 xb = _mm512_set1_ps(x[(size_t)i * cols + k]);
            a[i][0] = _mm512_fmadd_ps(w0, xb, a[i][0]);
            if (np == 2) a[i][1] = _mm512_fmadd_ps(w1, xb, a[i][1]);
        }
    }
    for (int i = 0; i < n; i++) {
        _mm512_storeu_ps(acc_out + (i * 2) * PR, a[i][0]);
        if (np == 2) _mm512_storeu_ps(acc_out + (i * 2 + 1) * PR, a[i][1]);
    }
}

#define CASE512(N)                                                                                          \
    case N:                                                                                                 \
        if (np == 2) panels_avx512(P, cols, xt, N, 2, acc);                                                 \
        else panels_avx512(P, cols, xt, N, 1, acc);                                                         \
        break;

ATTR_AVX512 static void gemm_avx512(const float *panels, int rows, int cols, int pb, int pe, int ntok,
                                    const float *x, float *y, int ldy, int accumulate) {
    float acc[NT512 * 2 * PR];
    for (int p = pb; p < pe; p += 2) {
        int np = pe - p >= 2 ? 2 : 1;
        const float *P = panels + (size_t)p * cols * PR;
        for (int t = 0; t < ntok; t += NT512) {
            int n = ntok - t < NT512 ? ntok - t : NT512;
            const float *xt = x + (size_t)t * cols;
            switch (n) {
            CASE512(12) CASE512(11) CASE512(10) CASE512(9) CASE512(8) CASE512(7)
            CASE512(6) CASE512(5) CASE512(4) CASE512(3) CASE512(2) CASE512(1)
            }
            for (int i = 0; i < n; i++)
                for (int j = 0; j < np; j++) {
                    int row0 = (p + j) * PR, nrows = rows - row0 < PR ? rows - row0 : PR;
                    store_rows(y + (size_t)(t + i) * ldy + row0 - pb * PR, acc + (i * 2 + j) * PR, nrows, accumulate);
                }
        }
    }
}
#endif

void gemm_panels(const float *panels, int rows, int cols, int panel_begin, int panel_end, int ntok, const float *x,
                 float *y, int ldy, int accumulate) {
#if defined(__x86_64__)
    /* zmm wherever the CPU has AVX-512F (an avxvnni path on such a CPU too: the bits are the same), except when the
     * AVX2 path is forced, so that tests can compare the ymm kernel too */
    static int has_avx512 = -1;
    if (has_avx512 < 0) has_avx512 = __builtin_cpu_supports("avx512f");
    int path = cpu_path();
    if (has_avx512 && path != PATH_SCALAR && path != PATH_AVX2) { gemm_avx512(panels, rows, cols, panel_begin, panel_end, ntok, x, y, ldy, accumulate); return; }
    if (path != PATH_SCALAR) { gemm_avx2(panels, rows, cols, panel_begin, panel_end, ntok, x, y, ldy, accumulate); return; }
#endif
    gemm_scalar(panels, rows, cols, panel_begin, panel_end, ntok, x, y, ldy, accumulate);
}
