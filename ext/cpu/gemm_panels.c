/* y = W x for float weights and many tokens (an encoder's batch): W repacked at load into panels of 16 rows, the
 * panel's 16 values of input k side by side, so that a vector load gives 16 rows of one column and meets a
 * broadcast x[t][k] of several tokens at once (the outer-product GEMM form; matmul.c's float path is a dot product
 * per row and token, fine for a decode step, a third of the FMA rate for a batch).
 *
 * Every output is acc = fma(w[r][k], x[t][k], acc) for k = 0, 1, ... in order from 0, then y = acc or y + acc:
 * the scalar, AVX2 (16 rows x 6 tokens: 12 ymm accumulators) and AVX-512 (32 rows x 12 tokens in zmm) kernels do
 * exactly that, so all paths give the same bits and a token's row does not depend on the batch.
 *
 * F16 and BF16 weights keep their own 16-bit values in the panels (half the memory of f32 panels), widened to f32 in
 * registers as they are loaded: the same products and sums, the same bits. Where the CPU has AVX-512F their panels
 * are f32 instead, which the zmm kernel reads (panels_keep_16bit).
 *
 * The same in bfloat16, for an encoder's float projections under --quantize where bf16 dot products run faster than
 * f32 FMAs (AMD Zen 4: VDPBF16PS does 32 multiply-adds per instruction at the FMA's rate, 2.2x the f32 GEMM's rate on
 * BERT's shapes; on the Intel Xeons measured it ran at half the FMA's rate per multiply-add, so there the f32 panels
 * stay: encoder_bf16_preferred). Its panels hold each column pair (2j, 2j+1) of the 16 rows side by side, so a zmm
 * load gives [w[r][2j], w[r][2j+1]] for r = 0..15 and meets a token's broadcast pair [x[2j], x[2j+1]]. Weights and
 * activations are rounded to bf16 (to nearest even, subnormals flushed to zero, as VDPBF16PS reads its inputs), and
 * every output is, for j = 0, 1, ... in order,
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
#define NT 6                /* tokens per AVX2 pass: 12 accumulators + 2 weight vectors + 1 broadcast of 16 ymm */
#define NT512 12            /* tokens per AVX-512 pass: 24 accumulators of 32 zmm; a batch of up to 12 tokens (one
                             * short query) streams each weight once */

#if defined(__x86_64__)
static int has_avx512f(void);
#endif

/* the panels' values in f32: value k of panel row r at (panel * cols + k) * 16 + r */
static float *pack_panels_f32(const weight_t *w) {
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

int panels_keep_16bit(int type) {
#if defined(__x86_64__)
    if (has_avx512f()) return 0;
#endif
    return type == WT_F16 || type == WT_BF16;
}

void *pack_panels(const weight_t *w) {
    if (!panels_keep_16bit(w->type)) return pack_panels_f32(w);
    int panels = (w->rows + PR - 1) / PR;
    uint16_t *out = NULL;
    if (posix_memalign((void **)&out, 64, (size_t)panels * w->cols * PR * sizeof(uint16_t))) return NULL;
    const uint16_t *src = (const uint16_t *)w->data;   /* row-major, as in the file */
    for (int p = 0; p < panels; p++)
        for (int r = 0; r < PR; r++) {
            int row = p * PR + r;
            for (int k = 0; k < w->cols; k++)
                out[((size_t)p * w->cols + k) * PR + r] = row < w->rows ? src[(size_t)row * w->cols + k] : 0;
        }
    return out;
}

/* value i of panels of element type `type` (F32, or 16-bit F16/BF16: exact in f32) */
static inline __attribute__((always_inline)) float panel_value(const void *P, const int type, size_t i) {
    if (type == WT_F32) return ((const float *)P)[i];
    uint16_t h = ((const uint16_t *)P)[i];
    return type == WT_F16 ? f16_to_f32(h) : bf16_to_f32(h);
}

static inline void store_rows(float *y, const float *acc, int nrows, int accumulate) {
    for (int r = 0; r < nrows; r++) y[r] = accumulate ? y[r] + acc[r] : acc[r];
}

static inline __attribute__((always_inline)) void gemm_scalar_typed(const int type, const void *panels, int rows,
                                                                   int cols, int pb, int pe, int ntok, const float *x,
                                                                   float *y, int ldy, int accumulate) {
    const size_t esize = type == WT_F32 ? 4 : 2;
    for (int p = pb; p < pe; p++) {
        const void *P = (const uint8_t *)panels + (size_t)p * cols * PR * esize;
        int nrows = rows - p * PR < PR ? rows - p * PR : PR;
        for (int t = 0; t < ntok; t++) {
            float acc[PR];
            for (int r = 0; r < PR; r++) {
                float a = 0.0f;
                for (int k = 0; k < cols; k++)
                    a = __builtin_fmaf(panel_value(P, type, (size_t)k * PR + r), x[(size_t)t * cols + k], a);
                acc[r] = a;
            }
            store_rows(y + (size_t)t * ldy + (p - pb) * PR, acc, nrows, accumulate);
        }
    }
}

#if defined(__x86_64__)
#define ATTR_AVX2 __attribute__((target("avx2,fma,f16c")))
#define ATTR_AVX512 __attribute__((target("avx2,fma,avx512f")))

/* 8 values of panels of element type `type` from value i, widened in registers */
ATTR_AVX2 static inline __attribute__((always_inline)) __m256 load8(const void *P, const int type, size_t i) {
    if (type == WT_F32) return _mm256_load_ps((const float *)P + i);
    __m128i h = _mm_load_si128((const __m128i *)((const uint16_t *)P + i));
    if (type == WT_F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* n tokens (1..NT) of one panel; inlined with constant n and type */
ATTR_AVX2 static inline __attribute__((always_inline)) void panel_avx2(const void *P, const int type, int cols,
                                                                       const float *x, int n, float *acc_out) {
    __m256 a[NT][2];
    for (int i = 0; i < n; i++) a[i][0] = a[i][1] = _mm256_setzero_ps();
    for (int k = 0; k < cols; k++) {
        __m256 w0 = load8(P, type, (size_t)k * PR), w1 = load8(P, type, (size_t)k * PR + 8);
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

ATTR_AVX2 static inline __attribute__((always_inline)) void gemm_avx2_typed(const int type, const void *panels,
                                                                            int rows, int cols, int pb, int pe,
                                                                            int ntok, const float *x, float *y,
                                                                            int ldy, int accumulate) {
    float acc[NT * PR];
    const size_t esize = type == WT_F32 ? 4 : 2;
    for (int p = pb; p < pe; p++) {
        const void *P = (const uint8_t *)panels + (size_t)p * cols * PR * esize;
        int nrows = rows - p * PR < PR ? rows - p * PR : PR;
        for (int t = 0; t < ntok; t += NT) {
            int n = ntok - t < NT ? ntok - t : NT;
            const float *xt = x + (size_t)t * cols;
            switch (n) {
            case 6: panel_avx2(P, type, cols, xt, 6, acc); break;
            case 5: panel_avx2(P, type, cols, xt, 5, acc); break;
            case 4: panel_avx2(P, type, cols, xt, 4, acc); break;
            case 3: panel_avx2(P, type, cols, xt, 3, acc); break;
            case 2: panel_avx2(P, type, cols, xt, 2, acc); break;
            default: panel_avx2(P, type, cols, xt, 1, acc);
            }
            for (int i = 0; i < n; i++)
                store_rows(y + (size_t)(t + i) * ldy + (p - pb) * PR, acc + i * PR, nrows, accumulate);
        }
    }
}

#define GEMM_AVX2(name, TYPE)                                                                                     \
    ATTR_AVX2 static void name(const void *panels, int rows, int cols, int pb, int pe, int ntok, const float *x, \
                               float *y, int ldy, int accumulate) {                                              \
        gemm_avx2_typed(TYPE, panels, rows, cols, pb, pe, ntok, x, y, ldy, accumulate);                         \
    }
GEMM_AVX2(gemm_avx2_f32, WT_F32)
GEMM_AVX2(gemm_avx2_f16, WT_F16)
GEMM_AVX2(gemm_avx2_bf16, WT_BF16)
#undef GEMM_AVX2

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

/* The AVX-512 driver of both element types: pairs of panels, NT512 tokens per pass, KERNEL(P, cols, xt, n, np, acc)
 * inlined with a constant token count n and panel count np */
#define PASS_CASE(KERNEL, N)                                                                                \
    case N:                                                                                                 \
        if (np == 2) KERNEL(P, cols, xt, N, 2, acc);                                                        \
        else KERNEL(P, cols, xt, N, 1, acc);                                                                \
        break;
#define PANEL_DRIVER(NAME, ATTR, PT, XT, KERNEL)                                                            \
    ATTR static void NAME(const PT *panels, int rows, int cols, int pb, int pe, int ntok, const XT *x, float *y, \
                          int ldy, int accumulate) {                                                        \
        float acc[NT512 * 2 * PR];                                                                          \
        for (int p = pb; p < pe; p += 2) {                                                                  \
            int np = pe - p >= 2 ? 2 : 1;                                                                   \
            const PT *P = panels + (size_t)p * cols * PR;                                                   \
            for (int t = 0; t < ntok; t += NT512) {                                                         \
                int n = ntok - t < NT512 ? ntok - t : NT512;                                                \
                const XT *xt = x + (size_t)t * cols;                                                        \
                switch (n) {                                                                                \
                PASS_CASE(KERNEL, 12) PASS_CASE(KERNEL, 11) PASS_CASE(KERNEL, 10) PASS_CASE(KERNEL, 9)      \
                PASS_CASE(KERNEL, 8) PASS_CASE(KERNEL, 7) PASS_CASE(KERNEL, 6) PASS_CASE(KERNEL, 5)         \
                PASS_CASE(KERNEL, 4) PASS_CASE(KERNEL, 3) PASS_CASE(KERNEL, 2) PASS_CASE(KERNEL, 1)         \
                }                                                                                           \
                for (int i = 0; i < n; i++)                                                                 \
                    for (int k = 0; k < np; k++) {                                                          \
                        int row0 = (p + k) * PR, nrows = rows - row0 < PR ? rows - row0 : PR;               \
                        store_rows(y + (size_t)(t + i) * ldy + row0 - pb * PR, acc + (i * 2 + k) * PR, nrows, \
                                   accumulate);                                                             \
                    }                                                                                       \
            }                                                                                               \
        }                                                                                                   \
    }

PANEL_DRIVER(gemm_avx512, ATTR_AVX512, float, float, panels_avx512)

/* The zmm kernels run wherever the CPU has their features (an avxvnni path on such a CPU too: the bits are the same),
 * except when the scalar or AVX2 path is forced, so that tests compare every kernel */
static int zmm_path(int has_features) {
    int path = cpu_path();
    return has_features && path != PATH_SCALAR && path != PATH_AVX2;
}
static int has_avx512f(void) {
    static int has = -1;
    if (has < 0) has = __builtin_cpu_supports("avx512f");
    return has;
}
static int has_avx512bf16(void) {
    static int has = -1;
    if (has < 0)
        has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
              __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bf16");
    return has;
}
#endif

#define GEMM_SCALAR(name, TYPE)                                                                                   \
    static void name(const void *panels, int rows, int cols, int pb, int pe, int ntok, const float *x, float *y,    \
                     int ldy, int accumulate) {                                                                    \
        gemm_scalar_typed(TYPE, panels, rows, cols, pb, pe, ntok, x, y, ldy, accumulate);                         \
    }
GEMM_SCALAR(gemm_scalar_f32, WT_F32)
GEMM_SCALAR(gemm_scalar_f16, WT_F16)
GEMM_SCALAR(gemm_scalar_bf16, WT_BF16)
#undef GEMM_SCALAR

void gemm_panels(const void *panels, int type, int rows, int cols, int panel_begin, int panel_end, int ntok,
                 const float *x, float *y, int ldy, int accumulate) {
    const int elem = panels_keep_16bit(type) ? type : WT_F32;
#if defined(__x86_64__)
    if (elem == WT_F32 && zmm_path(has_avx512f())) {
        gemm_avx512(panels, rows, cols, panel_begin, panel_end, ntok, x, y, ldy, accumulate);
        return;
    }
    if (cpu_path() != PATH_SCALAR) {
        (elem == WT_F16 ? gemm_avx2_f16 : elem == WT_BF16 ? gemm_avx2_bf16 : gemm_avx2_f32)(
            panels, rows, cols, panel_begin, panel_end, ntok, x, y, ldy, accumulate);
        return;
    }
#endif
    (elem == WT_F16 ? gemm_scalar_f16 : elem == WT_BF16 ? gemm_scalar_bf16 : gemm_scalar_f32)(
        panels, rows, cols, panel_begin, panel_end, ntok, x, y, ldy, accumulate);
}

/* ---- bfloat16 panels ---- */

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

/* pack_panels' panels, rounded, with each column pair's two values side by side */
uint16_t *pack_panels_bf16(const weight_t *w) {
    if (w->cols % 2) return NULL;
    float *f = pack_panels_f32(w);               /* value k of panel row r at k * 16 + r; NULL for a quantized w */
    uint16_t *out = NULL;
    size_t n = (size_t)(w->rows + PR - 1) / PR * w->cols * PR;
    if (!f || posix_memalign((void **)&out, 64, n * sizeof(uint16_t))) { free(f); return NULL; }
    for (size_t i = 0; i < n; i++) {             /* i = (panel * cols + k) * 16 + r */
        size_t r = i % PR, k = i / PR % (size_t)w->cols, panel = i / PR / (size_t)w->cols;
        out[(panel * w->cols + k / 2 * 2) * PR + 2 * r + k % 2] = f32_to_bf16(f[i]);
    }
    free(f);
    return out;
}

static inline float add_ftz(float a, float b) {
    float s = a + b;
    return (f32_bits(s) & 0x7f800000u) == 0 ? bits_f32(f32_bits(s) & 0x80000000u) : s;
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

PANEL_DRIVER(gemm_bf16_avx512, ATTR_BF16, uint16_t, uint16_t, panels_bf16)

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
    /* VDPBF16PS where zmm_path allows it (the scalar and AVX2 paths forced by tests take the scalar kernel, whose
     * bits are the same) */
    if (zmm_path(has_avx512bf16())) {
        gemm_bf16_avx512(panels, rows, cols, panel_begin, panel_end, ntok, x, y, ldy, accumulate);
        return;
    }
#endif
    gemm_bf16_scalar(panels, rows, cols, panel_begin, panel_end, ntok, x, y, ldy, accumulate);
}
