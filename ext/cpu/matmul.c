/* y = W x over 8-row weight tiles, for one token or many.
 *
 * Every path computes, for each row and each 32-value block, the block's integer dot product exactly in
 * int32, then accumulates fma(float(isum), d_w * d_x, acc) block after block (Q4_1 adds its min term with a
 * second fma). So the scalar, AVX2 (maddubs+madd) and VNNI (dpbusd) paths give bit-identical results, and
 * a token's row does not depend on which other tokens share the call. Float weights use 4 accumulators of
 * 8 lanes (group g into accumulator g % 4), combined (a0+a1)+(a2+a3), then summed in vecmath.h's hsum8_pairs order. */
#include <string.h>
#include "inferd.h"
#include "vecmath.h"
#if defined(__x86_64__)
#include <immintrin.h>
#endif


int matmul_num_tiles(const weight_t *w) { return (w->rows + TILE_ROWS - 1) / TILE_ROWS; }

static inline float load_w(const weight_t *w, const uint8_t *row, int i) {
    if (w->type == WT_F32) return ((const float *)row)[i];
    uint16_t h = ((const uint16_t *)row)[i];
    return w->type == WT_F16 ? f16_to_f32(h) : bf16_to_f32(h);
}

static void store_tile(float *y, int ldy, int t, int ycol, int nrows, const float acc[8], int accumulate) {
    float *o = y + (size_t)t * ldy + ycol;
    for (int r = 0; r < nrows; r++) o[r] = accumulate ? o[r] + acc[r] : acc[r];
}

/* ---------------- scalar ---------------- */
static void float_rows_scalar(const weight_t *w, int row0, int nrows, int ntok, const float *x, float *y,
                              int ldy, int ycol, int accumulate) {
    size_t rb = gguf_row_bytes(w->type, w->cols);
    for (int t = 0; t < ntok; t++) {
        float out[8];
        for (int r = 0; r < nrows; r++) {
            const uint8_t *row = w->data + (size_t)(row0 + r) * rb;
            const float *xt = x + (size_t)t * w->cols;
            float a[4][8] = {{0}};
            for (int g = 0; g < w->cols / 8; g++)
                for (int l = 0; l < 8; l++) a[g % 4][l] = __builtin_fmaf(load_w(w, row, 8 * g + l), xt[8 * g + l], a[g % 4][l]);
            float c[8];
            for (int l = 0; l < 8; l++) c[l] = (a[0][l] + a[1][l]) + (a[2][l] + a[3][l]);
            out[r] = hsum8_pairs_scalar(c);
        }
        store_tile(y, ldy, t, ycol, nrows, out, accumulate);
    }
}

static void quant_tile_scalar(const weight_t *w, int tile, int ntok, const block_q8x *xq, float *y, int ldy,
                              int ycol, int accumulate) {
    int nb = w->cols / QK, row0 = tile * TILE_ROWS;
    int nrows = w->rows - row0 < TILE_ROWS ? w->rows - row0 : TILE_ROWS;
    size_t bb = weight_tile_block_bytes(w->type);
    const uint8_t *base = w->data + (size_t)tile * nb * bb;
    for (int t = 0; t < ntok; t++) {
        float acc[8] = {0};
        for (int b = 0; b < nb; b++) {
            const uint8_t *blk = base + b * bb;
            const block_q8x *xb = xq + (size_t)t * nb + b;
            for (int r = 0; r < TILE_ROWS; r++) {
                uint16_t dh;
                memcpy(&dh, blk + 2 * r, 2);
                float dw = f16_to_f32(dh);
                int32_t isum = 0;
                if (w->type == WT_Q8_0) {
                    for (int j = 0; j < 8; j++)
                        for (int e = 0; e < 4; e++) isum += (int8_t)blk[16 + 32 * j + 4 * r + e] * xb->qs[4 * j + e];
                } else {
                    int qoff = w->type == WT_Q4_1 ? 32 : 16;
                    for (int p = 0; p < 4; p++)
                        for (int e = 0; e < 4; e++) {
                            uint8_t q = blk[qoff + 32 * p + 4 * r + e];
                            isum += (q & 15) * xb->qs[4 * p + e] + (q >> 4) * xb->qs[16 + 4 * p + e];
                        }
                    if (w->type == WT_Q4_0) isum -= 8 * xb->isum;
                }
                acc[r] = __builtin_fmaf((float)isum, dw * xb->d, acc[r]);
                if (w->type == WT_Q4_1) {
                    uint16_t mh;
                    memcpy(&mh, blk + 16 + 2 * r, 2);
                    acc[r] = __builtin_fmaf((float)xb->isum, f16_to_f32(mh) * xb->d, acc[r]);
                }
            }
        }
        store_tile(y, ldy, t, ycol, nrows, acc, accumulate);
    }
}

/* ---------------- AVX2 and VNNI ---------------- */
#if defined(__x86_64__)
#define SIMD_ATTR_AVX2 __attribute__((target("avx2,fma,f16c")))

SIMD_ATTR_AVX2 static inline void store_tile_v(float *y, int ldy, int t, int ycol, int nrows, __m256 acc,
                                               int accumulate) {
    float *o = y + (size_t)t * ldy + ycol;
    if (nrows == TILE_ROWS) {
        _mm256_storeu_ps(o, accumulate ? _mm256_add_ps(_mm256_loadu_ps(o), acc) : acc);
    } else {
        float tmp[8];
        _mm256_storeu_ps(tmp, acc);
        store_tile(y, ldy, t, ycol, nrows, tmp, accumulate);
    }
}

SIMD_ATTR_AVX2 static inline __m256 load_w8(int type, const uint8_t *row, int i) {
    if (type == WT_F32) return _mm256_loadu_ps((const float *)row + i);
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)row + i));
    if (type == WT_F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* Two tokens per pass share each converted weight vector; each token keeps its own 4 accumulators in the
 * scalar order (group g into accumulator g % 4). */
SIMD_ATTR_AVX2 static void float_rows_avx2(const weight_t *w, int row0, int nrows, int ntok, const float *x,
                                           float *y, int ldy, int ycol, int accumulate) {
    size_t rb = gguf_row_bytes(w->type, w->cols);
    int ng = w->cols / 8;
    for (int t = 0; t < ntok; t += 2) {
        int pair = t + 1 < ntok;
        float out0[8], out1[8];
        const float *x0 = x + (size_t)t * w->cols, *x1 = pair ? x0 + w->cols : x0;
        for (int r = 0; r < nrows; r++) {
            const uint8_t *row = w->data + (size_t)(row0 + r) * rb;
            __m256 a[4], b[4];
            for (int k = 0; k < 4; k++) a[k] = b[k] = _mm256_setzero_ps();
            int g = 0;
            if (pair) {
                for (; g + 4 <= ng; g += 4)
                    for (int k = 0; k < 4; k++) {
                        __m256 wv = load_w8(w->type, row, 8 * (g + k));
                        a[k] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x0 + 8 * (g + k)), a[k]);
                        b[k] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x1 + 8 * (g + k)), b[k]);
                    }
            } else {
                for (; g + 4 <= ng; g += 4)
                    for (int k = 0; k < 4; k++)
                        a[k] = _mm256_fmadd_ps(load_w8(w->type, row, 8 * (g + k)), _mm256_loadu_ps(x0 + 8 * (g + k)), a[k]);
            }
            for (; g < ng; g++) {
                __m256 wv = load_w8(w->type, row, 8 * g);
                a[g % 4] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x0 + 8 * g), a[g % 4]);
                b[g % 4] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x1 + 8 * g), b[g % 4]);
            }
            out0[r] = hsum8_pairs(_mm256_add_ps(_mm256_add_ps(a[0], a[1]), _mm256_add_ps(a[2], a[3])));
            out1[r] = hsum8_pairs(_mm256_add_ps(_mm256_add_ps(b[0], b[1]), _mm256_add_ps(b[2], b[3])));
        }
        store_tile(y, ldy, t, ycol, nrows, out0, accumulate);
        if (pair) store_tile(y, ldy, t + 1, ycol, nrows, out1, accumulate);
    }
}

/* The integer core. A block's 8 weight vectors wv[j] hold, in lane r, 4 values of row r (unsigned nibbles for
 * Q4; signed bytes for Q8, whose sign is moved onto x so the unsigned operand is |w|); each meets the broadcast
 * 4 bytes x[4j..4j+3] of the activation block. STEP adds one such product into an accumulator, COMBINE merges two
 * accumulators, FINISH widens to the int32 block sum. Integer sums are exact in any order, so the kernels may
 * use several accumulator chains (for latency) and stay bit-identical to the scalar path.
 *   AVX2, Q4: maddubs into int16 (|nibble * x| <= 15 * 127; eight pairs stay below 2^15), one madd at the end.
 *   AVX2, Q8: maddubs then madd into int32 at every step (pairs of 128 * 127 would overflow int16 if added).
 *   VNNI: dpbusd accumulates in int32 directly, starting from the block's correction (-8 * sum(x) for Q4, whose
 *   nibbles are unsigned; -128 * sum(x) for Q8, whose weights become unsigned in registers as w ^ 0x80 = w + 128,
 *   shared by all tokens of the call), broadcast from the activation block. */
#define ONES16 _mm256_set1_epi16(1)
#define AVX2_STEP(Q8, acc, w, x)                                                                              \
    ((Q8) ? _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(w, w),             \
                                                                         _mm256_sign_epi8(x, w)), ONES16))   \
          : _mm256_add_epi16(acc, _mm256_maddubs_epi16(w, x)))
#define AVX2_COMBINE(Q8, a, b) ((Q8) ? _mm256_add_epi32(a, b) : _mm256_add_epi16(a, b))
#define AVX2_FINISH(Q8, a) ((Q8) ? (a) : _mm256_madd_epi16(a, ONES16))
#define VNNI512_STEP(Q8, acc, w, x) _mm256_dpbusd_epi32(acc, w, x)
#define AVXVNNI_STEP(Q8, acc, w, x) _mm256_dpbusd_avx_epi32(acc, w, x)
#define VNNI_COMBINE(Q8, a, b) _mm256_add_epi32(a, b)
#define VNNI_FINISH(Q8, a) (a)

/* Each block fetches the same block PREFETCH_TILES tiles ahead into L2 when the hardware prefetcher alone falls
 * behind: with several tokens the arithmetic per byte is high enough for that on matrices that stream from memory
 * (decode steps of a batch, the 49152-row output matrix), and a single token's small matrices (a few hundred KB)
 * end before it has ramped up. A single token streaming a large matrix runs at the memory's pace and is best left to
 * the hardware. A/B medians: decode step of 8 sequences (SmolLM2 Q4_0, 2 threads) none 9.80 ms, 2 tiles into L1
 * 8.40, 8 tiles into L2 8.10 (4 to 24 tiles and the other hints within noise); single-token tg with 8 tiles vs
 * none: SmolLM2 229 vs 215 tok/s, TinyLlama-shaped 45 vs 48.6. */
#define SMALL_MATRIX_BYTES (2u << 20)
#define PREFETCH_TILES 8
static inline int32_t load_i32(const int8_t *p) { int32_t v; memcpy(&v, p, 4); return v; }

/* NTOK tokens (starting at xq, token stride nb blocks) against one tile of TYPE. With one token, two accumulator
 * chains split the 8 steps so the dependent dpbusd/add latency does not bound the block. */
#define DEFINE_TILE_KERNEL(NAME, ATTR, TYPE, NTOK, STEP, COMBINE, FINISH, VNNI)                              \
    ATTR static void NAME(const uint8_t *base, int nb, const block_q8x *xq, float *y, int ldy, int ycol,     \
                          int nrows, int accumulate, int prefetch) {                                         \
        enum { Q8 = (TYPE) == WT_Q8_0, CHAINS = (NTOK) == 1 ? 2 : 1 };                                     \
        const size_t bb = (TYPE) == WT_Q4_0 ? 144 : (TYPE) == WT_Q4_1 ? 160 : 272;                         \
        const int qoff = (TYPE) == WT_Q4_1 ? 32 : 16;                                                       \
        const __m256i m4 = _mm256_set1_epi8(0x0f);                                                          \
        __m256 acc[NTOK];                                                                                   \
        for (int k = 0; k < (NTOK); k++) acc[k] = _mm256_setzero_ps();                                      \
        for (int b = 0; b < nb; b++) {                                                                      \
            const uint8_t *blk = base + b * bb;                                                             \
            if ((NTOK) > 1 || prefetch)                                                                     \
                for (size_t o = 0; o < bb; o += 64) __builtin_prefetch(blk + PREFETCH_TILES * nb * bb + o, 0, 2); \
            __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)blk));                             \
            __m256i wv[8];                                                                                  \
            if (Q8) {                                                                                       \
                for (int j = 0; j < 8; j++) {                                                               \
                    wv[j] = _mm256_loadu_si256((const __m256i *)(blk + 16 + 32 * j));                       \
                    if (VNNI) wv[j] = _mm256_xor_si256(wv[j], _mm256_set1_epi8((char)0x80));                \
                }                                                                                           \
            } else {                                                                                        \
                for (int p = 0; p < 4; p++) {                                                               \
                    __m256i v = _mm256_loadu_si256((const __m256i *)(blk + qoff + 32 * p));                 \
                    wv[p] = _mm256_and_si256(v, m4);                                                        \
                    wv[4 + p] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);                              \
                }                                                                                           \
            }                                                                                               \
            __m256i is[(NTOK) * CHAINS];                                                                    \
            for (int k = 0; k < (NTOK) * CHAINS; k++) is[k] = _mm256_setzero_si256();                       \
            if (VNNI)   /* the block sum starts from its correction (integer sums: any order) */        \
                for (int k = 0; k < (NTOK); k++) {                                                          \
                    const block_q8x *xb = xq + (size_t)k * nb + b;                                          \
                    if ((TYPE) == WT_Q4_0) is[k * CHAINS] = _mm256_set1_epi32(xb->q4_corr);                 \
                    if (Q8) is[k * CHAINS] = _mm256_set1_epi32(xb->q8_corr);                                \
                }                                                                                           \
            for (int j = 0; j < 8; j++)                                                                     \
                for (int k = 0; k < (NTOK); k++) {                                                          \
                    __m256i xj = _mm256_set1_epi32(load_i32(xq[(size_t)k * nb + b].qs + 4 * j));            \
                    is[k * CHAINS + j % CHAINS] = STEP(Q8, is[k * CHAINS + j % CHAINS], wv[j], xj);         \
                }                                                                                           \
            for (int k = 0; k < (NTOK); k++) {                                                              \
                const block_q8x *xb = xq + (size_t)k * nb + b;                                              \
                __m256i sum = is[k * CHAINS];                                                               \
                if (CHAINS == 2) sum = COMBINE(Q8, sum, is[k * CHAINS + 1]);                                \
                sum = FINISH(Q8, sum);                                                                      \
                if ((TYPE) == WT_Q4_0 && !(VNNI)) sum = _mm256_add_epi32(sum, _mm256_set1_epi32(xb->q4_corr)); \
                __m256 dx = _mm256_set1_ps(xb->d);                                                          \
                acc[k] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_mul_ps(dw, dx), acc[k]);           \
                if ((TYPE) == WT_Q4_1) {                                                                    \
                    __m256 mw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + 16)));              \
                    acc[k] = _mm256_fmadd_ps(_mm256_set1_ps((float)xb->isum), _mm256_mul_ps(mw, dx), acc[k]); \
                }                                                                                           \
            }                                                                                               \
        }                                                                                                   \
        for (int k = 0; k < (NTOK); k++) store_tile_v(y, ldy, k, ycol, nrows, acc[k], accumulate);         \
    }

/* One path: kernels for each type with NT tokens at a time and with one, and the driver over a tile. */
#define DEFINE_PATH(PATH, ATTR, NT, STEP, COMBINE, FINISH, VNNI)                                               \
    DEFINE_TILE_KERNEL(PATH##_q4_0_n, ATTR, WT_Q4_0, NT, STEP, COMBINE, FINISH, VNNI)                         \
    DEFINE_TILE_KERNEL(PATH##_q4_0_1, ATTR, WT_Q4_0, 1, STEP, COMBINE, FINISH, VNNI)                          \
    DEFINE_TILE_KERNEL(PATH##_q4_1_n, ATTR, WT_Q4_1, NT, STEP, COMBINE, FINISH, VNNI)                         \
    DEFINE_TILE_KERNEL(PATH##_q4_1_1, ATTR, WT_Q4_1, 1, STEP, COMBINE, FINISH, VNNI)                          \
    DEFINE_TILE_KERNEL(PATH##_q8_0_n, ATTR, WT_Q8_0, NT, STEP, COMBINE, FINISH, VNNI)                         \
    DEFINE_TILE_KERNEL(PATH##_q8_0_1, ATTR, WT_Q8_0, 1, STEP, COMBINE, FINISH, VNNI)                          \
    static void PATH(const weight_t *w, int tile, int ntok, const block_q8x *xq, float *y, int ldy,          \
                     int ycol, int accumulate) {                                                             \
        int nb = w->cols / QK, row0 = tile * TILE_ROWS;                                                     \
        int nrows = w->rows - row0 < TILE_ROWS ? w->rows - row0 : TILE_ROWS;                                \
        const uint8_t *base = w->data + (size_t)tile * nb * weight_tile_block_bytes(w->type);              \
        int small = w->nbytes < SMALL_MATRIX_BYTES;                                                         \
        int t = 0;                                                                                          \
        for (; t + (NT) <= ntok; t += (NT)) {                                                               \
            const block_q8x *x = xq + (size_t)t * nb;                                                       \
            float *yt = y + (size_t)t * ldy;                                                                \
            if (w->type == WT_Q4_0) PATH##_q4_0_n(base, nb, x, yt, ldy, ycol, nrows, accumulate, small);          \
            else if (w->type == WT_Q4_1) PATH##_q4_1_n(base, nb, x, yt, ldy, ycol, nrows, accumulate, small);     \
            else PATH##_q8_0_n(base, nb, x, yt, ldy, ycol, nrows, accumulate, small);                             \
        }                                                                                                   \
        for (; t < ntok; t++) {                                                                             \
            const block_q8x *x = xq + (size_t)t * nb;                                                       \
            float *yt = y + (size_t)t * ldy;                                                                \
            if (w->type == WT_Q4_0) PATH##_q4_0_1(base, nb, x, yt, ldy, ycol, nrows, accumulate, small);          \
            else if (w->type == WT_Q4_1) PATH##_q4_1_1(base, nb, x, yt, ldy, ycol, nrows, accumulate, small);     \
            else PATH##_q8_0_1(base, nb, x, yt, ldy, ycol, nrows, accumulate, small);                             \
        }                                                                                                   \
    }

#define ATTR_512VNNI __attribute__((target("avx2,fma,f16c,avx512vl,avx512vnni")))
#define ATTR_AVXVNNI __attribute__((target("avx2,fma,f16c,avxvnni")))
/* AVX-512VL gives 32 vector registers: room for 8 tokens' accumulators; AVX2 and AVX-VNNI have 16. */
DEFINE_PATH(quant_tile_avx2, SIMD_ATTR_AVX2, 4, AVX2_STEP, AVX2_COMBINE, AVX2_FINISH, 0)
DEFINE_PATH(quant_tile_512vnni, ATTR_512VNNI, 8, VNNI512_STEP, VNNI_COMBINE, VNNI_FINISH, 1)
DEFINE_PATH(quant_tile_avxvnni, ATTR_AVXVNNI, 4, AVXVNNI_STEP, VNNI_COMBINE, VNNI_FINISH, 1)
#endif

void matmul_tiles(const weight_t *w, int tile_begin, int tile_end, int ntok, const float *x,
                  const block_q8x *xq, float *y, int ldy, int accumulate) {
    int path = cpu_path();
    for (int tile = tile_begin; tile < tile_end; tile++) {
        int ycol = (tile - tile_begin) * TILE_ROWS;        /* y's columns start at tile_begin's first row */
        if (!weight_is_quantized(w->type)) {
            int row0 = tile * TILE_ROWS, nrows = w->rows - row0 < TILE_ROWS ? w->rows - row0 : TILE_ROWS;
#if defined(__x86_64__)
            if (path != PATH_SCALAR) { float_rows_avx2(w, row0, nrows, ntok, x, y, ldy, ycol, accumulate); continue; }
#endif
            float_rows_scalar(w, row0, nrows, ntok, x, y, ldy, ycol, accumulate);
            continue;
        }
        switch (path) {
#if defined(__x86_64__)
        case PATH_AVX2: quant_tile_avx2(w, tile, ntok, xq, y, ldy, ycol, accumulate); break;
        case PATH_AVX512VNNI: quant_tile_512vnni(w, tile, ntok, xq, y, ldy, ycol, accumulate); break;
        case PATH_AVXVNNI: quant_tile_avxvnni(w, tile, ntok, xq, y, ldy, ycol, accumulate); break;
#endif
        default: quant_tile_scalar(w, tile, ntok, xq, y, ldy, ycol, accumulate);
        }
    }
}
