/* Prefill of the quantized types over pairs of tiles in AVX-512 registers (the pieces per block in qpair512.h).
 *
 * Why: the ymm tile kernels (qtile.h) give each dpbusd 8 rows x 1 token, and pay the nibble unpacking once per
 * group of 4 tokens. Here a zmm holds the 16 rows of two adjacent tiles: one dpbusd does twice the work, the
 * activation's 4 bytes come as the instruction's embedded broadcast, and the two tiles are unpacked once per call
 * into a panel of int8 vectors (on the stack, L1/L2-resident) that every group of tokens then reads: the inner loop
 * is the same for Q4_0 as for Q8_0 (a profile of the ymm path: bench/results/prefill_q4.md).
 *
 * Bits: per row and token the operations are the scalar kernel's (matmul.c): the block's int32 sum exactly (any
 * order of exact integer additions gives the same int32), then acc = fma(float(isum), dw * dx, acc) and, for Q4_1 and
 * Q5_1, acc = fma(float(sum x), mw * dx, acc), block after block in column order. So the results equal the scalar,
 * AVX2 and ymm-VNNI paths' and do not depend on how many tokens share a call. Q6_K's int32 sum carries its scales of
 * 16 values: two chains (values 0-15 and 16-31, each from the activation's -32 sum x) times the rows' two scales,
 * kept beside the panel; on AMX each half is a tile product of its own (K = 16). Q3_K and Q2_K go by halves the same
 * way (Q3_K's from -4 sum x, its values being q + 4), Q2_K then adds its mins' term as qtile.h's isum_acc does;
 * IQ4_XS's int32 sum is the block's times its rows' one scale. The int scales (and Q2_K's mins) lie beside the panel.
 * The codebook and ternary types (iq_lanes.h) are unpacked by the VNNI tile kernels' own code (qlanes.h, through
 * lanes_<type>_avx512vnni), the grid lookups paid once per call rather than once per group of tokens, and go by halves
 * like Q3_K, from -LANES_VNNI_OFFSET sum x. Q2_K, Q3_K, the IQ4 types, MXFP4 and the codebook and ternary types run
 * these zmm kernels only, not AMX. */
#include <string.h>
#include "inferd.h"
#include "tile.h"

#if defined(__x86_64__)
#include <immintrin.h>
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#pragma GCC push_options
/* amx: the AMX kernel below only runs where amx_usable() says so (compilers emit no tile instructions unasked) */
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,amx-tile,amx-int8")

#include "qpair512.h"

#define PAIR_NT 12   /* tokens per pass: 12 accumulators + 8 weight vectors + scales and temporaries of 32 zmm */

/* sc: per block, int_scales(type) vectors of the rows' int scales as int32 (lane 8i + r) */
PINLINE void prepare_pair(const int type, const int sign, const uint8_t *ta, const uint8_t *tb, int nb,
                          pair_block_t *p, __m512i *sc, const lanes_block_fn lanes) {
    const size_t bb = tile_block_bytes(type);
    const int nsub = type_is_k(type) ? 8 : 1;
    /* a codebook type's two tile blocks, unpacked by `lanes` (the VNNI tile kernels' code): a lone tile once */
    lanes_block_t la, lc;
    const lanes_block_t *lt = tb == ta ? &la : &lc;
    for (int i = 0; i < nb * nsub; i++, p++) {
        const int b = i / nsub, sub = i % nsub;
        const uint8_t *a = ta + (size_t)b * bb, *c = tb + (size_t)b * bb;
        if (type_keeps_blocks(type)) {   /* by halves, no min; the values already + LANES_VNNI_OFFSET */
            if (sub == 0) {
                lanes(a, &la);
                if (lt == &lc) lanes(c, &lc);
            }
            for (int j = 0; j < 8; j++) p->wv[j] = join256(la.wv[sub][j], lt->wv[sub][j]);
            p->dw = _mm512_castsi512_ps(join256((const uint8_t *)la.dw, (const uint8_t *)lt->dw));
            p->mw = _mm512_setzero_ps();
            sc[2 * i] = join256((const uint8_t *)la.m[sub][0], (const uint8_t *)lt->m[sub][0]);
            sc[2 * i + 1] = join256((const uint8_t *)la.m[sub][1], (const uint8_t *)lt->m[sub][1]);
            continue;
        }
        prepare_one(type, sign, a, c, sub, p, sc + int_scales(type) * i);
    }
}

/* n tokens (token stride nb32 blocks) against the prepared pair: y[k * ldy + r] for the rows in `rows`; pf: this
 * pass's prefetch (tile.h), or NULL */
PINLINE void pair_tokens(const int type, const int n, const pair_block_t *p, const __m512i *sc, int nb32,
                         const block_q8x *xq, float *y, int ldy, __mmask16 rows, int accumulate,
                         const batch_prefetch_t *pf) {
    __m512 acc[PAIR_NT];
    for (int k = 0; k < n; k++) acc[k] = _mm512_setzero_ps();
    for (int b = 0; b < nb32; b++, p++) {
        const block_q8x *xb = xq + b;
        batch_prefetch_step(pf, b);
        const __m512i *bs = sc + int_scales(type) * b;
        if (type_by_halves(type))   /* two chains and their scales a token: unrolled, they spill (Q3_K 5% slower) */
            for (int k = 0; k < n; k++, xb += nb32) acc[k] = block_token(type, p, bs, xb, acc[k]);
        else {
#pragma GCC unroll 12   /* PAIR_NT: the accumulators stay in registers */
            for (int k = 0; k < n; k++, xb += nb32) acc[k] = block_token(type, p, bs, xb, acc[k]);
        }
    }
    for (int k = 0; k < n; k++) store_rows16(acc[k], y + (size_t)k * ldy, rows, accumulate);
}

/* AMX: the CPU has AMX-INT8 (cpuid 7.0 edx bit 25) and Linux grants this process the tile data state (asked once;
 * the grant covers every thread); a context's kernel settings can keep the pair kernels off it */
#define AMX_MIN_TOKENS 32
static int amx_state = -1;
int amx_usable(void) {
    if (amx_state < 0) {
        unsigned a, b, c, d;
        __cpuid_count(7, 0, a, b, c, d);
        (void)a; (void)b; (void)c;
        amx_state = (d >> 25) & 1 && (d >> 24) & 1 && syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */,
                                                               18 /* XFEATURE_XTILEDATA */) == 0;
    }
    return amx_state;
}

/* 16 tokens against the signed pair panel on the AMX unit: per block, C (16 tokens x 16 rows, int32) = A (the tokens'
 * 32 activation bytes, read in place with the token stride) x B (the block's 8 x 64 panel bytes, the dpbssd layout
 * the zmm kernels use): each C element is the block's exact int32 sum, then the float steps as in pair_tokens.
 * Software-pipelined by groups of 4 blocks: the unit multiplies group g (A and B alternating in tiles 0-1 and 2-3,
 * C in tiles 4-7, stored to one half of a ring) while the vector ports scale group g - 1 from the other half; the
 * stored sums are read a whole group after their stores (reading them right away stalled on each store: profile in
 * bench/results/prefill_q4.md). The float steps still go block after block in column order. */
#define AMX_TOKENS 16
#ifndef AMX_DEPTH
#define AMX_DEPTH 2   /* blocks in flight: the sums of block b are read after block b + 1's are issued */
#endif
PINLINE void amx_block_floats(const int type, const int32_t *c, const pair_block_t *p, const block_q8x *xb, int nb32,
                              __m512 acc[AMX_TOKENS]) {
    for (int k = 0; k < AMX_TOKENS; k++, xb += nb32) {
        __m512 dx = _mm512_set1_ps(xb->d);
        acc[k] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(c + 16 * k)), _mm512_mul_ps(p->dw, dx), acc[k]);
        if (type == WT_Q4_1 || type == WT_Q5_1)
            acc[k] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_set1_epi32(xb->isum)), _mm512_mul_ps(p->mw, dx), acc[k]);
        else if (type == WT_Q4_K || type == WT_Q5_K)
            acc[k] = _mm512_fmadd_ps(p->mw, _mm512_set1_ps(xb->dsum), acc[k]);
    }
}

/* block b's sums into c (tiles 0, 2, 4 for even blocks, 1, 3, 5 for odd ones) */
PINLINE void amx_block(const pair_block_t *p, const block_q8x *xq, int b, size_t xstride, int32_t *c) {
    if (b & 1) {
        _tile_loadd(1, xq[b].qs, xstride);
        _tile_loadd(3, p[b].wv, 64);
        _tile_zero(5);
        _tile_dpbssd(5, 1, 3);
        _tile_stored(5, c, 64);
    } else {
        _tile_loadd(0, xq[b].qs, xstride);
        _tile_loadd(2, p[b].wv, 64);
        _tile_zero(4);
        _tile_dpbssd(4, 0, 2);
        _tile_stored(4, c, 64);
    }
}

PINLINE void amx_tokens(const int type, const pair_block_t *p, int nb32, const block_q8x *xq, float *y, int ldy,
                        __mmask16 rows, int accumulate) {
    _Alignas(64) int32_t c[AMX_DEPTH][256];
    const size_t xstride = (size_t)nb32 * sizeof(block_q8x);
    __m512 acc[AMX_TOKENS];
    for (int k = 0; k < AMX_TOKENS; k++) acc[k] = _mm512_setzero_ps();
    for (int b = 0; b < nb32 + AMX_DEPTH - 1; b++) {
        if (b < nb32) amx_block(p, xq, b, xstride, c[b % AMX_DEPTH]);
        int f = b - (AMX_DEPTH - 1);   /* the block whose sums were stored AMX_DEPTH - 1 blocks ago */
        if (f >= 0) amx_block_floats(type, c[f % AMX_DEPTH], p + f, xq + f, nb32, acc);
    }
    for (int k = 0; k < AMX_TOKENS; k++) store_rows16(acc[k], y + (size_t)k * ldy, rows, accumulate);
}

/* palette 1: tiles 0-1 A (16 token rows of a_bytes activation bytes), 2-3 B (b_rows rows of 64 bytes), 4 up to
 * 4 + c_tiles C (16 rows of 64 bytes) */
static void amx_configure_tiles(int a_bytes, int b_rows, int c_tiles) {
    struct { uint8_t palette, start_row, reserved[14]; uint16_t colsb[16]; uint8_t rows[16]; } cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int i = 0; i < 2; i++) {
        cfg.rows[i] = AMX_TOKENS; cfg.colsb[i] = (uint16_t)a_bytes;
        cfg.rows[2 + i] = (uint8_t)b_rows; cfg.colsb[2 + i] = 64;
    }
    for (int i = 4; i < 4 + c_tiles; i++) { cfg.rows[i] = AMX_TOKENS; cfg.colsb[i] = 64; }
    _tile_loadconfig(&cfg);
}
/* A 32 activation bytes (a block), B 8 rows of 64 bytes, C tiles 4-5 */
static void amx_configure(void) { amx_configure_tiles(32, 8, 2); }
static void amx_release(void) { _tile_release(); }

/* Q6_K on AMX: a block's two halves of 16 values (scales of their own) in tiles of K = 16: A (16 tokens x 16
 * activation bytes) tiles 0-1, B (wv[0..3] and wv[4..7] of the signed panel: 4 rows of 64 bytes) tiles 2-3, C tiles
 * 4-5 (even blocks) and 6-7 (odd ones). Each C element is the exact sum (q - 32) x over its half; the floats then take
 * sc0 C0 + sc1 C1 (int32) as pair_tokens does. */
static void amx_configure_q6(void) { amx_configure_tiles(16, 4, 4); }

/* block b's two half sums into c[0..255] and c[256..511] */
PINLINE void amx_block_q6(const pair_block_t *p, const block_q8x *xq, int b, size_t xstride, int32_t *c) {
    _tile_loadd(0, xq[b].qs, xstride);
    _tile_loadd(1, xq[b].qs + 16, xstride);
    _tile_loadd(2, p[b].wv, 64);
    _tile_loadd(3, p[b].wv + 4, 64);
    if (b & 1) {
        _tile_zero(6);
        _tile_zero(7);
        _tile_dpbssd(6, 0, 2);
        _tile_dpbssd(7, 1, 3);
        _tile_stored(6, c, 64);
        _tile_stored(7, c + 256, 64);
    } else {
        _tile_zero(4);
        _tile_zero(5);
        _tile_dpbssd(4, 0, 2);
        _tile_dpbssd(5, 1, 3);
        _tile_stored(4, c, 64);
        _tile_stored(5, c + 256, 64);
    }
}

PINLINE void amx_block_floats_q6(const int32_t *c, const pair_block_t *p, const __m512i *sc, const block_q8x *xb,
                                 int nb32, __m512 acc[AMX_TOKENS]) {
    for (int k = 0; k < AMX_TOKENS; k++, xb += nb32) {
        __m512i s = _mm512_add_epi32(_mm512_mullo_epi32(_mm512_load_si512(c + 16 * k), sc[0]),
                                     _mm512_mullo_epi32(_mm512_load_si512(c + 256 + 16 * k), sc[1]));
        acc[k] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(p->dw, _mm512_set1_ps(xb->d)), acc[k]);
    }
}

PINLINE void amx_tokens_q6(const pair_block_t *p, const __m512i *sc6, int nb32, const block_q8x *xq, float *y, int ldy,
                           __mmask16 rows, int accumulate) {
    _Alignas(64) int32_t c[AMX_DEPTH][512];
    const size_t xstride = (size_t)nb32 * sizeof(block_q8x);
    __m512 acc[AMX_TOKENS];
    for (int k = 0; k < AMX_TOKENS; k++) acc[k] = _mm512_setzero_ps();
    for (int b = 0; b < nb32 + AMX_DEPTH - 1; b++) {
        if (b < nb32) amx_block_q6(p, xq, b, xstride, c[b % AMX_DEPTH]);
        int f = b - (AMX_DEPTH - 1);
        if (f >= 0) amx_block_floats_q6(c[f % AMX_DEPTH], p + f, sc6 + 2 * f, xq + f, nb32, acc);
    }
    for (int k = 0; k < AMX_TOKENS; k++) store_rows16(acc[k], y + (size_t)k * ldy, rows, accumulate);
}

/* Like qtile.h's batch kernel, each call prefetches the two tiles after its own over its first pass of tokens: with
 * few tokens (a decode step of many sequences) a pair's work is too short for the hardware prefetcher to hide the
 * next pair's misses. */
PINLINE void pair_kernel(const int type, const uint8_t *ta, const uint8_t *tb, int nb, const block_q8x *xq, int ntok,
                         float *y, int ldy, int nrows, int accumulate, int amx, const lanes_block_fn lanes) {
    const int nb32 = nb * (type_is_k(type) ? 8 : 1);
    pair_block_t p[nb32];   /* nb32 <= PAIR_MAX_BLOCKS: 320 KB at most */
    __m512i sc[int_scales(type) ? int_scales(type) * nb32 : 1];
    __mmask16 rows = (__mmask16)((1u << nrows) - 1);
    const size_t tile_bytes = (size_t)nb * tile_block_bytes(type);
    const batch_prefetch_t next = batch_prefetch_plan(tb + tile_bytes, 2 * tile_bytes, nb32);
    const batch_prefetch_t *pf = &next;
    int t = 0;
    if (ntok >= AMX_MIN_TOKENS && amx && !type_is_iq4(type) && !type_is_2bit(type) && !type_keeps_blocks(type)) {
        prepare_pair(type, 1, ta, tb, nb, p, sc, lanes);
        if (type == WT_Q6_K) {
            amx_configure_q6();
            for (; t + AMX_TOKENS <= ntok; t += AMX_TOKENS)
                amx_tokens_q6(p, sc, nb32, xq + (size_t)t * nb32, y + (size_t)t * ldy, ldy, rows, accumulate);
        } else {
            amx_configure();
            for (; t + AMX_TOKENS <= ntok; t += AMX_TOKENS)
                amx_tokens(type, p, nb32, xq + (size_t)t * nb32, y + (size_t)t * ldy, ldy, rows, accumulate);
        }
        amx_release();
        if (t == ntok) return;
        pf = NULL;   /* AMX's groups are long enough for the hardware prefetcher */
    }
    prepare_pair(type, 0, ta, tb, nb, p, sc, lanes);
    for (; t + PAIR_NT <= ntok; t += PAIR_NT, pf = NULL)
        pair_tokens(type, PAIR_NT, p, sc, nb32, xq + (size_t)t * nb32, y + (size_t)t * ldy, ldy, rows, accumulate, pf);
    for (; t + 4 <= ntok; t += 4, pf = NULL)
        pair_tokens(type, 4, p, sc, nb32, xq + (size_t)t * nb32, y + (size_t)t * ldy, ldy, rows, accumulate, pf);
    for (; t < ntok; t++, pf = NULL)
        pair_tokens(type, 1, p, sc, nb32, xq + (size_t)t * nb32, y + (size_t)t * ldy, ldy, rows, accumulate, pf);
}

/* each type's kernel, for its row of the type-traits table (type_traits.c); the codebook and ternary types' with
 * their unpacking */
#define PDEFINE_WITH(name, TYPE, LANES)                                                                           \
    void qpair_##name(const uint8_t *ta, const uint8_t *tb, int nb, const block_q8x *xq, int ntok, float *y,      \
                      int ldy, int nrows, int accumulate, int amx) {                                             \
        pair_kernel(TYPE, ta, tb, nb, xq, ntok, y, ldy, nrows, accumulate, amx, LANES);                          \
    }
#define PDEFINE(name, TYPE) PDEFINE_WITH(name, TYPE, NULL)
#define PDEFINE_LANES(name, TYPE)                                                                                 \
    void lanes_##name##_avx512vnni(const uint8_t *blk, lanes_block_t *out);   /* matmul_simd.c */                 \
    PDEFINE_WITH(name, TYPE, lanes_##name##_avx512vnni)
PDEFINE(q4_0, WT_Q4_0)
PDEFINE(q4_1, WT_Q4_1)
PDEFINE(q5_0, WT_Q5_0)
PDEFINE(q5_1, WT_Q5_1)
PDEFINE(q8_0, WT_Q8_0)
PDEFINE(q4_k, WT_Q4_K)
PDEFINE(q5_k, WT_Q5_K)
PDEFINE(q6_k, WT_Q6_K)
PDEFINE(q3_k, WT_Q3_K)
PDEFINE(q2_k, WT_Q2_K)
PDEFINE(iq4_nl, WT_IQ4_NL)
PDEFINE(iq4_xs, WT_IQ4_XS)
PDEFINE(mxfp4, WT_MXFP4)
PDEFINE_LANES(iq2_xxs, WT_IQ2_XXS)
PDEFINE_LANES(iq2_xs, WT_IQ2_XS)
PDEFINE_LANES(iq2_s, WT_IQ2_S)
PDEFINE_LANES(iq3_xxs, WT_IQ3_XXS)
PDEFINE_LANES(iq3_s, WT_IQ3_S)
PDEFINE_LANES(iq1_s, WT_IQ1_S)
PDEFINE_LANES(iq1_m, WT_IQ1_M)
PDEFINE_LANES(tq1_0, WT_TQ1_0)
PDEFINE_LANES(tq2_0, WT_TQ2_0)
#undef PDEFINE_LANES
#undef PDEFINE
#undef PDEFINE_WITH

#pragma GCC pop_options
#endif
