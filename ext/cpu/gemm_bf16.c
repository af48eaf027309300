/* y = W x in bfloat16 for an encoder's float projections under --quantize where bf16 dot products run faster than f32
 * FMAs (AMD Zen 4: VDPBF16PS does 32 multiply-adds per instruction at the FMA's rate, 2.2x the f32 GEMM's rate on
 * BERT's shapes; on the Intel Xeons measured it ran at half the FMA's rate per multiply-add, so there the f32
 * panels stay: encoder_bf16_preferred).
 *
 * Layout: panels of 16 rows as gemm_panels.c's, each column pair (2j, 2j+1) of the 16 rows side by side, so a zmm
 * load gives [w[r][2j], w[r][2j+1]] for r = 0..15 and meets a token's broadcast pair [x[2j], x[2j+1]].
 *
 * Numerics, the same bits on every path: weights and activations are rounded to bf16 (to nearest even, subnormals
 * flushed to zero, as VDPBF16PS reads its inputs), and every output is, for j = 0, 1, ... in order,
 *     acc = acc + w[2j+1] x[2j+1];  acc = acc + w[2j] x[2j]
 * each product exact in f32 (8-bit by 8-bit significands) and each addition rounded to nearest even with a subnormal
 * sum flushed to zero: VDPBF16PS's definition, which the scalar kernel follows step by step
 * (tests/ext/test_gemm_bf16.py checks both against a numpy emulation). */
#include <stdlib.h>
#include <string.h>
#include "encoder.h"
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#define PR PANEL_ROWS
#define NT512 12                     /* tokens per AVX-512 pass: 24 accumulators, as gemm_panels.c's */

static inline uint32_t f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

uint16_t f32_to_bf16(float f) {
    uint32_t u = f32_bits(f);
    if ((u & 0x7f800000u) == 0) return (uint16_t)((u >> 16) & 0x8000u);          /* zero, subnormal: signed zero */
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);   /* NaN stays a (quiet) NaN */
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);                    /* nearest, ties to even */
}

void f32_to_bf16_row(const float *x, int n, uint16_t *out) {
    for (int i = 0; i < n; i++) out[i] = f32_to_bf16(x[i]);
}

static inline float bf16_f32(uint16_t h) { return bits_f32((uint32_t)h << 16); }

uint16_t *pack_panels_bf16(const weight_t *w) {
    if (weight_is_quantized(w->type) || w->cols % 2) return NULL;
    int panels = (w->rows + PR - 1) / PR;
    uint16_t *out = NULL;
    if (posix_memalign((void **)&out, 64, (size_t)panels * w->cols * PR * sizeof(uint16_t))) return NULL;
    float *row = malloc((size_t)w->cols * sizeof(float));
    if (!row) { free(out); return NULL; }
    for (int p = 0; p < panels; p++)
        for (int r = 0; r < PR; r++) {
            int src = p * PR + r;
            if (src < w->rows) weight_dequant_row(w, src, row);
            else memset(row, 0, (size_t)w->cols * sizeof(float));
            for (int k = 0; k < w->cols; k++)   /* pair k / 2 of row r: [k even, k odd] */
                out[(size_t)p * w->cols * PR + (size_t)(k / 2) * 2 * PR + 2 * r + (k & 1)] = f32_to_bf16(row[k]);
        }
    free(row);
    return out;
}

static inline float add_ftz(float a, float b) {
    float s = a + b;
    return (f32_bits(s) & 0x7f800000u) == 0 ? bits_f32(f32_bits(s) & 0x80000000u) : s;
}

static inline void store_rows(float *y, const float *acc, int nrows, int accumulate) {
    for (int r = 0; r < nrows; r++) y[r] = accumulate ? y[r] + acc[r] : acc[r];
}

static void gemm_bf16_scalar(const uint16_t *panels, int rows, int cols, int pb, int pe, int ntok, const uint16_t *x,
                             float *y, int ldy, int accumulate) {
    for (int p = pb; p < pe; p++) {
        const uint16_t *P = panels + (size_t)p * cols * PR;
        int nrows = rows - p * PR < PR ? rows - p * PR : PR;
        for (int t = 0; t < ntok; t++) {
            const uint16_t *xt = x + (size_t)t * cols;
            float acc[PR];
            for (int r = 0; r < PR; r++) {
                float a = 0.0f;
                for (int j = 0; j < cols / 2; j++) {
                    const uint16_t *wp = P + (size_t)j * 2 * PR + 2 * r;
                    a = add_ftz(a, bf16_f32(wp[1]) * bf16_f32(xt[2 * j + 1]));
                    a = add_ftz(a, bf16_f32(wp[0]) * bf16_f32(xt[2 * j]));
                }
                acc[r] = a;
            }
            store_rows(y + (size_t)t * ldy + (p - pb) * PR, acc, nrows, accumulate);
        }
    }
}

#if defined(__x86_64__)
#define ATTR_BF16 __attribute__((target("avx2,fma,avx512f,avx512bw,avx512vl,avx512bf16")))

/* n tokens of np (1 or 2) adjacent panels, one zmm per panel */
ATTR_BF16 static inline __attribute__((always_inline)) void panels_bf16(const uint16_t *P, int cols, const uint16_t *x,
                                                                       int n, int np, float *acc_out) {
    __m512 a[NT512][2];
    const uint16_t *P1 = P + (size_t)cols * PR;
    for (int i = 0; i < n; i++) a[i][0] = a[i][1] = _mm512_setzero_ps();
    for (int j = 0; j < cols / 2; j++) {
        __m512bh w0 = (__m512bh)_mm512_load_si512(P + (size_t)j * 2 * PR);
        __m512bh w1 = np == 2 ? (__m512bh)_mm512_load_si512(P1 + (size_t)j * 2 * PR) : w0;
        for (int i = 0; i < n; i++) {
            int32_t pair;
            memcpy(&pair, x + (size_t)i * cols + 2 * j, 4);
            __m512bh xb = (__m512bh)_mm512_set1_epi32(pair);
            a[i][0] = _mm512_dpbf16_ps(a[i][0], w0, xb);
            if (np == 2) a[i][1] = _mm512_dpbf16_ps(a[i][1], w1, xb);
        }
    }
    for (int i = 0; i < n; i++) {
        _mm512_storeu_ps(acc_out + (i * 2) * PR, a[i][0]);
        if (np == 2) _mm512_storeu_ps(acc_out + (i * 2 + 1) * PR, a[i][1]);
    }
}

#define CASE_BF16(N)                                                                                        \
    case N:                                                                                                 \
        if (np == 2) panels_bf16(P, cols, xt, N, 2, acc);                                                   \
        else panels_bf16(P, cols, xt, N, 1, acc);                                                           \
        break;

ATTR_BF16 static void gemm_bf16_avx512(const uint16_t *panels, int rows, int cols, int pb, int pe, int ntok,
                                       const uint16_t *x, float *y, int ldy, int accumulate) {
    float acc[NT512 * 2 * PR];
    for (int p = pb; p < pe; p += 2) {
        int np = pe - p >= 2 ? 2 : 1;
        const uint16_t *P = panels + (size_t)p * cols * PR;
        for (int t = 0; t < ntok; t += NT512) {
            int n = ntok - t < NT512 ? ntok - t : NT512;
            const uint16_t *xt = x + (size_t)t * cols;
            switch (n) {
            CASE_BF16(12) CASE_BF16(11) CASE_BF16(10) CASE_BF16(9) CASE_BF16(8) CASE_BF16(7)
            CASE_BF16(6) CASE_BF16(5) CASE_BF16(4) CASE_BF16(3) CASE_BF16(2) CASE_BF16(1)
            }
            for (int i = 0; i < n; i++)
                for (int k = 0; k < np; k++) {
                    int row0 = (p + k) * PR, nrows = rows - row0 < PR ? rows - row0 : PR;
                    store_rows(y + (size_t)(t + i) * ldy + row0 - pb * PR, acc + (i * 2 + k) * PR, nrows, accumulate);
                }
        }
    }
}

static int has_avx512bf16(void) {
    static int has = -1;
    if (has < 0)
        has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
              __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bf16");
    return has;
}
#endif

int encoder_bf16_preferred(void) {
#if defined(__x86_64__)
    __builtin_cpu_init();
    return has_avx512bf16() && __builtin_cpu_is("amd");
#else
    return 0;
#endif
}

void gemm_panels_bf16(const uint16_t *panels, int rows, int cols, int panel_begin, int panel_end, int ntok,
                      const uint16_t *x, float *y, int ldy, int accumulate) {
#if defined(__x86_64__)
    /* VDPBF16PS on the VNNI paths of a CPU that has it (as gemm_panels.c's zmm kernel: the scalar and AVX2 paths
     * forced by tests take the scalar kernel, whose bits are the same) */
    int path = cpu_path();
    if (has_avx512bf16() && path != PATH_SCALAR && path != PATH_AVX2) {
        gemm_bf16_avx512(panels, rows, cols, panel_begin, panel_end, ntok, x, y, ldy, accumulate);
        return;
    }
#endif
    gemm_bf16_scalar(panels, rows, cols, panel_begin, panel_end, ntok, x, y, ldy, accumulate);
}
