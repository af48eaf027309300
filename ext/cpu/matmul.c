/* y = W x over 8-row weight tiles, for one token or many: the float kernels, the scalar quantized kernel (the
 * definition every SIMD path reproduces bit for bit) and the dispatch over a weight's kernels, bound at load from the
 * type-traits table (type_traits.c), under a context's kernel settings (kernel_config_t).
 *
 * Every quantized path computes, for each row and each 32-value block, the block's integer dot product exactly in
 * int32, then accumulates fma(float(isum), d_w * d_x, acc) block after block (types with a min add
 * fma(m_w, d_x * sum x, acc) right after). So the scalar, AVX2 (maddubs+madd) and VNNI (dpbusd) paths give
 * bit-identical results, and a token's row does not depend on which other tokens share the call. Float weights use
 * 4 accumulators of 8 lanes (group g into accumulator g % 4), combined (a0+a1)+(a2+a3), then summed in vecmath.h's
 * hsum8_pairs order. */
#include <string.h>
#include "inferd.h"
#include "vecmath.h"
#include "tile.h"
#include "type_traits.h"
#if defined(__x86_64__)
#include <immintrin.h>
#endif


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
void float_rows_scalar(const weight_t *w, int row0, int nrows, int ntok, const float *x, float *y, int ldy, int ycol,
                       int accumulate) {
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

/* The definition of every quantized type's block sum (tile.h has the layouts). For row r and token t, block b:
 *   Q8_0          isum = sum q x                                         dw = d
 *   Q4_0, Q5_0    isum = sum q x - 8 (16) sum x                          dw = d
 *   Q4_1, Q5_1    isum = sum q x                                         dw = d,        mw = m
 *   Q4_K, Q5_K    isum = sum q x          (sub-block s of super-block)   dw = d * sc[s], mw = -(dmin * mn[s])
 *   Q6_K          isum = sc[2s] (sum_0..15 q x - 32 sum_0..15 x) + sc[2s+1] (sum_16..31 q x - 32 sum_16..31 x),
 *                                                                        dw = d
 *   Q3_K          isum = sc[2s] (sum_0..15 q x - 4 sum_0..15 x) + sc[2s+1] (sum_16..31 q x - 4 sum_16..31 x),
 *                                                                        dw = d
 *   Q2_K          isum = sc[2s] sum_0..15 q x + sc[2s+1] sum_16..31 q x, dw = d,
 *                 imin = mn[2s] sum_0..15 x + mn[2s+1] sum_16..31 x,     mw = -dmin
 *   IQ4_NL        isum = sum v x   (v = IQ4_VALUES[q])                   dw = d
 *   IQ4_XS        isum = sc[s] sum v x                                   dw = d
 *   MXFP4         isum = sum v x   (v = MXFP4_VALUES[q])                 dw = 2^(e - 128)
 *   IQ2_*, IQ3_*, IQ1_*, TQ*_0 (iq_lanes.h)
 *                 isum = m[0] sum_0..15 v x + m[1] sum_16..31 v x        dw = d * factor
 * then acc = fma(float(isum), dw * dx, acc) and, with a min, acc = fma(mw, dsum, acc), dsum = dx * float(sum x) being
 * computed once per activation block (Q4_1 and Q5_1: acc = fma(float(sum x), mw * dx, acc), Q4_1's order from
 * before the K-quants, which SmolLM2's greedy agreement with llama.cpp was recorded with); Q2_K's mins weigh the two
 * halves apart: acc = fma(float(imin), mw * dx, acc). */
static inline __attribute__((always_inline)) void quant_tile_scalar(const int type, const uint8_t *base, int nb,
                                                                    const block_q8x *xq, int nb32, int ntok, float *y,
                                                                    int ldy, int ycol, int nrows, int accumulate) {
    const int nsub = type_is_k(type) ? 8 : 1;
    const size_t bb = tile_block_bytes(type);
    int q[32];
    for (int t = 0; t < ntok; t++) {
        float acc[8] = {0};
        for (int b = 0; b < nb; b++) {
            const uint8_t *blk = base + (size_t)b * bb;
            for (int s = 0; s < nsub; s++) {
                const block_q8x *xb = xq + (size_t)t * nb32 + (size_t)b * nsub + s;
                for (int r = 0; r < TILE_ROWS; r++) {
                    if (type_keeps_blocks(type)) {
                        const uint8_t *lb = blk + (size_t)r * lane_bytes(type);
                        int m[2];
                        lane_values(type, lb, s, q, m);
                        int32_t lo = 0, hi = 0;
                        for (int i = 0; i < 16; i++) { lo += q[i] * xb->qs[i]; hi += q[16 + i] * xb->qs[16 + i]; }
                        const float dw = lane_d(type, lb) * lane_factor(type);
                        acc[r] = __builtin_fmaf((float)(m[0] * lo + m[1] * hi), dw * xb->d, acc[r]);
                        continue;
                    }
                    tile_lane_values(type, blk, s, r, q);
                    int32_t lo = 0, hi = 0;
                    for (int i = 0; i < 16; i++) { lo += q[i] * xb->qs[i]; hi += q[16 + i] * xb->qs[16 + i]; }
                    int32_t isum = lo + hi;
                    float dw = tile_row_scale(type, blk, r), mw = 0.0f;
                    int has_min = 0;
                    if (type == WT_Q4_0) {
                        isum -= 8 * xb->isum;
                    } else if (type == WT_Q5_0) {
                        isum -= 16 * xb->isum;
                    } else if (type == WT_Q4_1 || type == WT_Q5_1) {
                        mw = tile_f16(blk + 16, r);
                        has_min = 1;
                    } else if (type == WT_Q4_K || type == WT_Q5_K) {
                        const uint8_t *sm = blk + tile_scales_off(type, s);
                        dw = dw * (float)sm[r];
                        mw = -(tile_f16(blk + 16, r) * (float)sm[8 + r]);
                        has_min = 1;
                    } else if (type == WT_Q6_K) {
                        const int8_t *sc = (const int8_t *)blk + tile_scales_off(type, s);
                        isum = sc[r] * (lo - 32 * xb->hsum[0]) + sc[8 + r] * (hi - 32 * xb->hsum[1]);
                    } else if (type == WT_Q3_K) {
                        const int8_t *sc = (const int8_t *)blk + tile_scales_off(type, s);
                        isum = sc[r] * (lo - 4 * xb->hsum[0]) + sc[8 + r] * (hi - 4 * xb->hsum[1]);
                    } else if (type == WT_Q2_K) {
                        const uint8_t *scm = blk + tile_scales_off(type, s);
                        isum = (scm[r] & 15) * lo + (scm[8 + r] & 15) * hi;
                        int32_t imin = (scm[r] >> 4) * xb->hsum[0] + (scm[8 + r] >> 4) * xb->hsum[1];
                        mw = -tile_f16(blk + 16, r);
                        acc[r] = __builtin_fmaf((float)isum, dw * xb->d, acc[r]);
                        acc[r] = __builtin_fmaf((float)imin, mw * xb->d, acc[r]);
                        continue;
                    } else if (type == WT_IQ4_XS) {
                        isum *= ((const int8_t *)blk + tile_scales_off(type, s))[r];
                    }
                    acc[r] = __builtin_fmaf((float)isum, dw * xb->d, acc[r]);
                    if (type == WT_Q4_1 || type == WT_Q5_1)
                        acc[r] = __builtin_fmaf((float)xb->isum, mw * xb->d, acc[r]);
                    else if (has_min) acc[r] = __builtin_fmaf(mw, xb->dsum, acc[r]);
                }
            }
        }
        store_tile(y, ldy, t, ycol, nrows, acc, accumulate);
    }
}

/* each type's scalar kernel, for its row of the type-traits table (type_traits.c) */
#define SCALAR_DEFINE(name, TYPE)                                                                                 \
    void qscalar_##name(const uint8_t *base, int nb, const block_q8x *xq, int nb32, int ntok, float *y, int ldy,   \
                        int ycol, int nrows, int accumulate) {                                                   \
        quant_tile_scalar(TYPE, base, nb, xq, nb32, ntok, y, ldy, ycol, nrows, accumulate);                      \
    }
SCALAR_DEFINE(q4_0, WT_Q4_0)
SCALAR_DEFINE(q4_1, WT_Q4_1)
SCALAR_DEFINE(q5_0, WT_Q5_0)
SCALAR_DEFINE(q5_1, WT_Q5_1)
SCALAR_DEFINE(q8_0, WT_Q8_0)
SCALAR_DEFINE(q4_k, WT_Q4_K)
SCALAR_DEFINE(q5_k, WT_Q5_K)
SCALAR_DEFINE(q6_k, WT_Q6_K)
SCALAR_DEFINE(q3_k, WT_Q3_K)
SCALAR_DEFINE(q2_k, WT_Q2_K)
SCALAR_DEFINE(iq4_nl, WT_IQ4_NL)
SCALAR_DEFINE(iq4_xs, WT_IQ4_XS)
SCALAR_DEFINE(mxfp4, WT_MXFP4)
SCALAR_DEFINE(iq2_xxs, WT_IQ2_XXS)
SCALAR_DEFINE(iq2_xs, WT_IQ2_XS)
SCALAR_DEFINE(iq2_s, WT_IQ2_S)
SCALAR_DEFINE(iq3_xxs, WT_IQ3_XXS)
SCALAR_DEFINE(iq3_s, WT_IQ3_S)
SCALAR_DEFINE(iq1_s, WT_IQ1_S)
SCALAR_DEFINE(iq1_m, WT_IQ1_M)
SCALAR_DEFINE(tq1_0, WT_TQ1_0)
SCALAR_DEFINE(tq2_0, WT_TQ2_0)
#undef SCALAR_DEFINE

/* ---------------- AVX2 float kernels (the quantized SIMD kernels: matmul_simd.c) ---------------- */
#if defined(__x86_64__)
#define SIMD_ATTR_AVX2 __attribute__((target("avx2,fma,f16c")))

SIMD_ATTR_AVX2 static inline __m256 load_w8(int type, const uint8_t *row, int i) {
    if (type == WT_F32) return _mm256_loadu_ps((const float *)row + i);
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)row + i));
    if (type == WT_F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* Two tokens per pass share each converted weight vector; each token keeps its own 4 accumulators in the
 * scalar order (group g into accumulator g % 4). */
SIMD_ATTR_AVX2 void float_rows_avx2(const weight_t *w, int row0, int nrows, int ntok, const float *x, float *y,
                                    int ldy, int ycol, int accumulate) {
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

#endif

/* ---------------- the dispatch over a weight's bound kernels ---------------- */
/* Matrices smaller than this (a few hundred KB) end before the hardware prefetcher has ramped up: the tile kernels
 * prefetch for them (and always when several tokens share a call; the batch kernels always). A decode step's kernels
 * prefetch as the context's decode_prefetch_bytes says. */
#define SMALL_MATRIX_BYTES (2u << 20)

/* The pair kernels (qpair512.c: zmm, and AMX for groups of 16 tokens) serve the prefills of the VNNI paths wherever
 * the CPU has AVX-512 VNNI (the bits are the same) from PAIR_MIN_TOKENS tokens up; up to DECODE_PASS_TOKENS (a
 * decode step of a few sequences) the zmm decode kernels come first where the type has one, as they unpack each block
 * once for all the tokens where the pair kernels' panel pays only for more (bench/results/batch_decode.md). They take
 * QDECODE_TOKENS a call: 9 to 16 tokens go in two passes over each group of tiles, the second finding the tiles in
 * cache, which costs less than the pair kernels up to there (bench/results/decode_passes.md). The types whose
 * tiles unpack (those with a batch kernel) go to the pair kernels from 4 tokens: their ymm tile kernels take up to 3
 * tokens a call below their full KNT, so 4 tokens unpack each tile twice, which costs the codebook types most
 * (bench/results/lowbit_codebook_pair_vnni.md); Q8_0's tiles are a load away and stay faster at 4. */
#define PAIR_MIN_TOKENS 5
#define PAIR_MIN_TOKENS_UNPACKING 4
#define DECODE_PASS_TOKENS (2 * QDECODE_TOKENS)   /* two passes */

/* Software prefetch in a decode step's kernels helps every tile on Intel, while on AMD Zen 4 the L2 stream
 * prefetcher does better alone on long tiles (an 8960-wide Q4_K tile is 40 KB, past the reach of a group's four
 * streams): there only tiles of up to 16 KB prefetch (bench/results/decode_prefetch.md, decode_spread.md). */
void kernel_config_default(kernel_config_t *kc) {
    kc->prefill = PREFILL_AMX;
    kc->decode_group = QGROUP_TILES;
    kc->decode_zmm = 1;
#if defined(__x86_64__)
    __builtin_cpu_init();
    kc->decode_prefetch_bytes = __builtin_cpu_is("amd") ? 16u << 10 : SIZE_MAX;
#else
    kc->decode_prefetch_bytes = SIZE_MAX;
#endif
}

static int amx_on(const kernel_config_t *kc) {
#if defined(__x86_64__)
    return kc->prefill == PREFILL_AMX && amx_usable();
#else
    (void)kc;
    return 0;
#endif
}

int matmul_prefill_kernels(const kernel_config_t *kc) {
    if (!path_has_zmm_vnni(cpu_path()) || kc->prefill == PREFILL_TILES) return PREFILL_TILES;
    return amx_on(kc) ? PREFILL_AMX : PREFILL_AVX512;
}

int matmul_decode_kernels(const kernel_config_t *kc) { return path_has_zmm_vnni(cpu_path()) && kc->decode_zmm; }

int matmul_num_tiles(const weight_t *w) { return (w->rows + TILE_ROWS - 1) / TILE_ROWS; }

static inline int rows_of(const weight_t *w, int tile) {
    int n = w->rows - tile * TILE_ROWS;
    return n < TILE_ROWS ? n : TILE_ROWS;
}

/* tiles [t0, t1) of segment seg (seg_end: its end), y + ycol0 at t0's first row; which kernel runs depends on ntok
 * and the settings, once per call */
static void segment_tiles(const kernel_config_t *kc, const weight_t *w, int seg, int t0, int t1, int seg_end,
                          int ntok, const block_q8x *xq, float *y, int ldy, int ycol0, int accumulate) {
    const weight_kernels_t *k = w->seg[seg].kernels;
    const int type = w->seg[seg].type, nb = w->cols / (TILE_LAYOUT[type].nsub * QK), nb32 = w->cols / QK;
    const size_t tile_bytes = (size_t)nb * tile_block_bytes(type);
    const uint8_t *base = w->data + w->seg[seg].offset + (size_t)(t0 - w->seg[seg].row0 / TILE_ROWS) * tile_bytes;
    if (k->scalar) {
        for (int t = t0; t < t1; t++, base += tile_bytes)
            k->scalar(base, nb, xq, nb32, ntok, y, ldy, ycol0 + (t - t0) * TILE_ROWS, rows_of(w, t), accumulate);
        return;
    }
    const qdecode_fn zmm = kc->decode_zmm && ntok <= DECODE_PASS_TOKENS ? k->decode : NULL;
    if (zmm || (ntok == 1 && kc->decode_group > 1)) {   /* a decode step: tiles in lockstep */
        const int group = kc->decode_group < 1 ? 1 : kc->decode_group > QGROUP_TILES ? QGROUP_TILES : kc->decode_group;
        const int prefetch_on = tile_bytes <= kc->decode_prefetch_bytes;
        for (int t = t0, n; t < t1; t += n, base += (size_t)n * tile_bytes) {
            n = t1 - t < group ? t1 - t : group;
            /* the prefetch runs on past t1 to the segment's end: a thread's last group fetches the start of its next
             * claim (the pool hands them out in order), so that the claim's first group does not wait on memory
             * (bench/results/decode_claims.md) */
            int prefetch = prefetch_on ? seg_end - t : 0, last = rows_of(w, t + n - 1);
            float *yt = y + ycol0 + (t - t0) * TILE_ROWS;
            if (zmm) {   /* passes of nearly equal sizes (13 tokens: 7 + 6) while the group's tiles are in cache */
                const int passes = (ntok + QDECODE_TOKENS - 1) / QDECODE_TOKENS;
                for (int i = 0, done = 0, m; i < passes; i++, done += m) {
                    m = (ntok - done) / (passes - i);
                    zmm(base, tile_bytes, n, nb, xq + (size_t)done * nb32, nb32, m, yt + (size_t)done * ldy, ldy, last,
                        accumulate, i ? 0 : prefetch);
                }
            } else k->tiles->group(base, tile_bytes, n, nb, xq, yt, last, accumulate, prefetch);
        }
        return;
    }
    /* two tiles: rows 8t .. 8t + 15, the second tile's possibly fewer; a lone tile (the end of a thread's claim or of
     * a segment) goes through the same kernel as the pair (t, t) with the copy's rows left unstored: half its work is
     * wasted, and still it beats the ymm kernel */
    const int pair_min = k->tiles->batch ? PAIR_MIN_TOKENS_UNPACKING : PAIR_MIN_TOKENS;
    const qpair_fn pair = kc->prefill != PREFILL_TILES && ntok >= pair_min && nb32 <= PAIR_MAX_BLOCKS ? k->pair : NULL;
    if (pair) {
        const int amx = amx_on(kc);
        for (int t = t0; t < t1; t += 2, base += 2 * tile_bytes) {
            int two = t + 1 < t1, rows = two ? TILE_ROWS + rows_of(w, t + 1) : rows_of(w, t);
            pair(base, two ? base + tile_bytes : base, nb, xq, ntok, y + ycol0 + (t - t0) * TILE_ROWS, ldy, rows,
                 accumulate, amx);
        }
        return;
    }
    const qkernel_t *q = k->tiles;
    const int batch = q->batch && ntok >= q->batch_min && nb32 <= BATCH_MAX_BLOCKS;
    if (batch) {   /* two tiles a call while two are left */
        for (int t = t0; t < t1; t += 2, base += 2 * tile_bytes) {
            int two = t + 1 < t1;
            q->batch(base, two ? base + tile_bytes : NULL, nb, xq, nb32, ntok, y, ldy, ycol0 + (t - t0) * TILE_ROWS,
                     rows_of(w, two ? t + 1 : t), accumulate);
        }
        return;
    }
    const int small = w->nbytes < SMALL_MATRIX_BYTES;
    for (int t = t0; t < t1; t++, base += tile_bytes) {
        int ycol = ycol0 + (t - t0) * TILE_ROWS, nrows = rows_of(w, t);
        for (int i = 0, n; i < ntok; i += n) {
            n = ntok - i < q->ntok ? ntok - i : q->ntok;
            q->tokens(base, nb, xq + (size_t)i * nb32, nb32, n, y + (size_t)i * ldy, ldy, ycol, nrows, accumulate,
                      small);
        }
    }
}

void matmul_tiles(const kernel_config_t *kc, const weight_t *w, int tile_begin, int tile_end, int ntok,
                  const float *x, const block_q8x *xq, float *y, int ldy, int accumulate) {
    const weight_kernels_t *k = w->seg[0].kernels;
    if (k->float_rows) {   /* a float weight: one segment, rows as they are */
        for (int tile = tile_begin; tile < tile_end; tile++)
            k->float_rows(w, tile * TILE_ROWS, rows_of(w, tile), ntok, x, y, ldy, (tile - tile_begin) * TILE_ROWS,
                          accumulate);
        return;
    }
    for (int seg = 0; seg < w->nseg; seg++) {
        int first = w->seg[seg].row0 / TILE_ROWS;
        int end = seg + 1 < w->nseg ? w->seg[seg + 1].row0 / TILE_ROWS : matmul_num_tiles(w);
        int t0 = first > tile_begin ? first : tile_begin, t1 = end < tile_end ? end : tile_end;
        if (t0 < t1)
            segment_tiles(kc, w, seg, t0, t1, end, ntok, xq, y, ldy, (t0 - tile_begin) * TILE_ROWS, accumulate);
    }
}
