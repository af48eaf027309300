/* y = W x over 8-row weight tiles, for one token or many: the float kernels, the scalar quantized kernel (the
 * definition every SIMD path reproduces bit for bit) and the dispatch over the kernel table (tile.h).
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

/* The definition of every quantized type's block sum (tile.h has the layouts). For row r and token t, block b:
 *   Q8_0          isum = sum q x                                         dw = d
 *   Q4_0, Q5_0    isum = sum q x - 8 (16) sum x                          dw = d
 *   Q4_1, Q5_1    isum = sum q x                                         dw = d,        mw = m
 *   Q4_K, Q5_K    isum = sum q x          (sub-block s of super-block)   dw = d * sc[s], mw = -(dmin * mn[s])
 *   Q6_K          isum = sc[2s] (sum_0..15 q x - 32 sum_0..15 x) + sc[2s+1] (sum_16..31 q x - 32 sum_16..31 x),
 *                                                                        dw = d
 * then acc = fma(float(isum), dw * dx, acc) and, with a min, acc = fma(mw, dsum, acc), dsum = dx * float(sum x) being
 * computed once per activation block (Q4_1 and Q5_1: acc = fma(float(sum x), mw * dx, acc), Q4_1's order from
 * before the K-quants, which SmolLM2's greedy agreement with llama.cpp was recorded with). */
static void quant_tile_scalar(int type, const uint8_t *base, int nb, const block_q8x *xq, int nb32, int ntok,
                              float *y, int ldy, int ycol, int nrows, int accumulate) {
    int nsub = type_is_k(type) ? 8 : 1, q[32];
    size_t bb = tile_block_bytes(type);
    for (int t = 0; t < ntok; t++) {
        float acc[8] = {0};
        for (int b = 0; b < nb; b++) {
            const uint8_t *blk = base + (size_t)b * bb;
            for (int s = 0; s < nsub; s++) {
                const block_q8x *xb = xq + (size_t)t * nb32 + (size_t)b * nsub + s;
                for (int r = 0; r < TILE_ROWS; r++) {
                    tile_lane_values(type, blk, s, r, q);
                    int32_t lo = 0, hi = 0;
                    for (int i = 0; i < 16; i++) { lo += q[i] * xb->qs[i]; hi += q[16 + i] * xb->qs[16 + i]; }
                    int32_t isum = lo + hi;
                    float dw = tile_f16(blk, r), mw = 0.0f;
                    int has_min = 0;
                    switch (type) {
                    case WT_Q4_0: isum -= 8 * xb->isum; break;
                    case WT_Q5_0: isum -= 16 * xb->isum; break;
                    case WT_Q4_1: case WT_Q5_1: mw = tile_f16(blk + 16, r); has_min = 1; break;
                    case WT_Q4_K: case WT_Q5_K: {
                        const uint8_t *sm = blk + tile_scales_off(type, s);
                        dw = dw * (float)sm[r];
                        mw = -(tile_f16(blk + 16, r) * (float)sm[8 + r]);
                        has_min = 1;
                        break;
                    }
                    case WT_Q6_K: {
                        const int8_t *sc = (const int8_t *)blk + tile_scales_off(type, s);
                        isum = sc[r] * (lo - 32 * xb->hsum[0]) + sc[8 + r] * (hi - 32 * xb->hsum[1]);
                        break;
                    }
                    }
                    acc[r] = __builtin_fmaf((float)isum, dw * xb->d, acc[r]);
                    if (type == WT_Q4_1 || type == WT_Q5_1) acc[r] = __builtin_fmaf((float)xb->isum, mw * xb->d, acc[r]);
                    else if (has_min) acc[r] = __builtin_fmaf(mw, xb->dsum, acc[r]);
                }
            }
        }
        store_tile(y, ldy, t, ycol, nrows, acc, accumulate);
    }
}

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

#endif

/* Matrices smaller than this (a few hundred KB) end before the hardware prefetcher has ramped up: the many-token
 * kernels prefetch for them (and always when several tokens share a call). A decode step's group kernel prefetches
 * as matmul_decode_prefetch says. */
#define SMALL_MATRIX_BYTES (2u << 20)

static const qkernel_t *kernel_table(int path) {
#if defined(__x86_64__)
    switch (path) {
    case PATH_AVX2: return qkernels_avx2;
    case PATH_AVX512VNNI: return qkernels_avx512vnni;
    case PATH_AVXVNNI: return qkernels_avxvnni;
    }
#endif
    (void)path;
    return NULL;
}

/* The pair kernels (qpair512.c: zmm, and AMX for groups of 16 tokens) serve the prefills of the VNNI paths wherever
 * the CPU has AVX-512 VNNI (the bits are the same) from 5 tokens up, but up to 8 tokens (a decode step of a few
 * sequences) the zmm decode kernels come first where they have the type: they unpack each block once for all the
 * tokens. On the Xeon, Qwen 1.5B Q4_K_M steps of 5 / 8 / 12 sequences took 78 / 109 / 145 ms on the ymm tile kernels
 * (the default below 16 tokens before), 73 / 86 / 112 ms on the pairs and 48 / 62 ms on the decode kernels
 * (bench/results/batch_decode.md). matmul_set_prefill_kernels turns them off (PREFILL_TILES) or AMX off
 * (PREFILL_AVX512) so that tests reach every kernel. */
#define PAIR_MIN_TOKENS 5
static int pair_kernels_on = 1;
void matmul_set_prefill_kernels(int kind) {
    pair_kernels_on = kind != PREFILL_TILES;
#if defined(__x86_64__)
    qpair_allow_amx(kind == PREFILL_AMX);
#endif
}
/* whether the active path is a VNNI one on a CPU with AVX-512 VNNI: the zmm kernels (prefill and decode) run there */
static int zmm_vnni(void) {
#if defined(__x86_64__)
    static int has = -1;
    if (has < 0)
        has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
              __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
    int path = cpu_path();
    return has && (path == PATH_AVX512VNNI || path == PATH_AVXVNNI);
#else
    return 0;
#endif
}
int matmul_prefill_kernels(void) {
#if defined(__x86_64__)
    if (zmm_vnni() && pair_kernels_on) return amx_usable() ? PREFILL_AMX : PREFILL_AVX512;
#endif
    return PREFILL_TILES;
}

static int decode_group = QGROUP_TILES;
void matmul_set_decode_group(int tiles) { decode_group = tiles < 1 ? 1 : tiles > QGROUP_TILES ? QGROUP_TILES : tiles; }

/* A decode step's quantized tiles (Q8_0 aside) go to the zmm pair kernels (qdecode512.c) on the CPUs whose VNNI paths have the
 * prefill pair kernels (the same AVX-512 features; the bits are the same); matmul_set_decode_kernels turns them off
 * so that tests and bench/decode_gemv.c reach the ymm group kernels too. */
static int decode_zmm_on = 1;
void matmul_set_decode_kernels(int zmm) { decode_zmm_on = zmm; }
int matmul_decode_kernels(void) { return zmm_vnni() && decode_zmm_on; }

/* Software prefetch in a decode step's group kernels (ymm tiles and zmm pairs alike; the bits do not change), for
 * tiles of at most decode_prefetch_bytes. On the Intel Xeons of earlier sessions it beat the hardware prefetcher
 * alone at every shape (bench/results/decode_q4k.md). On AMD Zen 4 it still helps short tiles (a 1536-wide Q4_K tile
 * is 7 KB: each of a group's four streams ends before the hardware has ramped up), but on long ones (an 8960-wide
 * tile is 40 KB) the L2 stream prefetcher does better alone: with prefetch those ran 15-20% slower
 * (bench/results/decode_prefetch.md). Both measured when the kernels prefetched 8 tiles ahead in one burst per
 * block; spread over their arithmetic, 4 tiles ahead, the Xeon's decode went up 17% (decode_spread.md), and on this
 * Xeon prefetching only short tiles was then within noise of prefetching all. Since then the long tiles prefetch
 * their own bytes 2 KB ahead (tile.h), +20-30% on the Xeon's down projections; not measured on AMD. */
static size_t decode_prefetch_bytes = 0;
static int decode_prefetch_set = 0;
void matmul_set_decode_prefetch(size_t max_tile_bytes) { decode_prefetch_bytes = max_tile_bytes; decode_prefetch_set = 1; }
size_t matmul_decode_prefetch(void) {
    if (!decode_prefetch_set) {
#if defined(__x86_64__)
        __builtin_cpu_init();
        decode_prefetch_bytes = __builtin_cpu_is("amd") ? 16u << 10 : SIZE_MAX;
#else
        decode_prefetch_bytes = SIZE_MAX;
#endif
        decode_prefetch_set = 1;
    }
    return decode_prefetch_bytes;
}

static const qpair_fn *pair_table(void) {
#if defined(__x86_64__)
    if (matmul_prefill_kernels() != PREFILL_TILES) return qpair_kernels_avx512;
#endif
    return NULL;
}

void matmul_tiles(const weight_t *w, int tile_begin, int tile_end, int ntok, const float *x,
                  const block_q8x *xq, float *y, int ldy, int accumulate) {
    int path = cpu_path(), nb32 = w->cols / QK, seg = 0;
    const qkernel_t *table = kernel_table(path);
    const qpair_fn *pairs = ntok >= PAIR_MIN_TOKENS && nb32 <= PAIR_MAX_BLOCKS ? pair_table() : NULL;
    const qdecode_fn *decode_zmm = NULL;
#if defined(__x86_64__)
    if (ntok <= QDECODE_TOKENS && matmul_decode_kernels()) decode_zmm = qdecode_kernels_avx512;
#endif
    int small = w->nbytes < SMALL_MATRIX_BYTES;
    for (int tile = tile_begin; tile < tile_end; tile++) {
        int ycol = (tile - tile_begin) * TILE_ROWS;        /* y's columns start at tile_begin's first row */
        int row0 = tile * TILE_ROWS, nrows = w->rows - row0 < TILE_ROWS ? w->rows - row0 : TILE_ROWS;
        if (!weight_is_quantized(w->type)) {
#if defined(__x86_64__)
            if (path != PATH_SCALAR) { float_rows_avx2(w, row0, nrows, ntok, x, y, ldy, ycol, accumulate); continue; }
#endif
            float_rows_scalar(w, row0, nrows, ntok, x, y, ldy, ycol, accumulate);
            continue;
        }
        while (seg + 1 < w->nseg && w->seg[seg + 1].row0 <= row0) seg++;
        int type = w->seg[seg].type, nb = w->cols / weight_block_cols(type);
        const uint8_t *base = w->data + w->seg[seg].offset +
                              (size_t)(tile - w->seg[seg].row0 / TILE_ROWS) * nb * tile_block_bytes(type);
        if (!table) {
            quant_tile_scalar(type, base, nb, xq, nb32, ntok, y, ldy, ycol, nrows, accumulate);
            continue;
        }
        const qkernel_t *k = &table[type];
        qdecode_fn zmm = decode_zmm ? decode_zmm[type] : NULL;
        if (zmm || (ntok == 1 && decode_group > 1)) {   /* a decode step (1 to 8 tokens): 4 tiles in lockstep */
            int seg_end = seg + 1 < w->nseg ? w->seg[seg + 1].row0 / TILE_ROWS : matmul_num_tiles(w);
            int n = (tile_end < seg_end ? tile_end : seg_end) - tile;
            n = n < decode_group ? n : decode_group;
            int last = w->rows - (row0 + (n - 1) * TILE_ROWS);
            size_t tile_bytes = (size_t)nb * tile_block_bytes(type);
            /* the prefetch runs on past tile_end to the segment's end: a claim's last group fetches the start of
             * the next claim (the pool hands them out in order), so that a claim's first group does not wait on
             * memory. Against stopping at tile_end: +1-8% on matrices of 256 and 1536 rows, the same on longer ones
             * (bench/results/decode_claims.md) */
            int prefetch = tile_bytes <= matmul_decode_prefetch() ? seg_end - tile : 0;
            last = last < TILE_ROWS ? last : TILE_ROWS;
            if (zmm) zmm(base, tile_bytes, n, nb, xq, nb32, ntok, y + ycol, ldy, last, accumulate, prefetch);
            else k->group(base, tile_bytes, n, nb, xq, y + ycol, last, accumulate, prefetch);
            tile += n - 1;
            continue;
        }
        /* two tiles of one segment: rows 8 * tile .. 8 * tile + 15, the second tile's possibly fewer; a lone tile
         * (the end of a thread's claim or of a segment) goes through the same kernel as the pair (tile, tile) with
         * the copy's rows left unstored: half its work is wasted, and still it beats the ymm kernel */
        if (pairs && pairs[type]) {
            int pair = tile + 1 < tile_end && (seg + 1 >= w->nseg || w->seg[seg + 1].row0 > row0 + TILE_ROWS);
            int rows = pair ? TILE_ROWS + (w->rows - row0 - TILE_ROWS < TILE_ROWS ? w->rows - row0 - TILE_ROWS
                                                                                  : TILE_ROWS)
                            : nrows;
            pairs[type](base, pair ? base + (size_t)nb * tile_block_bytes(type) : base, nb, xq, ntok, y + ycol, ldy,
                        rows, accumulate);
            tile += pair;
            continue;
        }
        if (k->batch && ntok >= 2 * k->ntok && nb32 <= BATCH_MAX_BLOCKS) {
            k->batch(base, nb, xq, nb32, ntok, y, ldy, ycol, nrows, accumulate);
            continue;
        }
        int t = 0;
        for (; t + k->ntok <= ntok; t += k->ntok)
            k->many(base, nb, xq + (size_t)t * nb32, nb32, y + (size_t)t * ldy, ldy, ycol, nrows, accumulate, small);
        for (; t < ntok; t++)
            k->one(base, nb, xq + (size_t)t * nb32, nb32, y + (size_t)t * ldy, ldy, ycol, nrows, accumulate, small);
    }
}
