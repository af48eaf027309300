/* Decode (one token, or up to QDECODE_TOKENS) of the quantized types over pairs of tiles in AVX-512 registers: the
 * K-quants Q4_K, Q5_K and Q6_K (what the Q4_K_M files people download are made of), Q4_0, Q4_1, Q5_0, Q5_1, and Q2_K,
 * Q3_K, IQ4_NL and IQ4_XS, whose blocks are unpacked and summed by the prefill pair kernels' own pieces (qpair512.h:
 * prepare_one, block_token). Q8_0 stays on the ymm tiles, and so do MXFP4 (its ymm group kernel shares each block's
 * activation broadcasts across four tiles: faster at one token) and the codebook types (bound by their lookups).
 *
 * Why: a decode step reads every weight byte once, and with the matrix in cache one thread of the ymm tile kernel
 * (qtile.h's tiles_one) computed 14-23 GB/s of Q4_K/Q6_K, barely above its share of the read bandwidth
 * (bench/results/decode_q4k.md). Here a zmm holds the 16 rows of two adjacent tiles (lane 8i + r: tile i of the
 * pair, row r), as the prefill pair kernels do (qpair512.c): each nibble mask, dpbusd, conversion and fma does the
 * work of two ymm ones, the activation's 4 bytes come as dpbusd's embedded broadcast (32-value types) or one
 * broadcast load (K-quants: dot_halves says why), and the sub-block scales of both tiles become one vector of scales
 * and one of mins with a single multiply each. Other instructions per byte:
 *   - 4-bit high nibbles are not shifted down: dpbusd multiplies (v & 0xf0) = 16 q and the chain's sum is shifted
 *     right by 4 once per sub-block (the exact int32 sum, as 16 * sum is a multiple of 16);
 *   - mw = -(dmin * mn) is computed as (-dmin) * mn (IEEE multiplication is sign-symmetric: the same bits), the
 *     super-block's d and dmin converted together;
 *   - the fifth bit (Q5_K, Q5_0, Q5_1) and Q6_K's two high bits are merged with one ternary-logic instruction per
 *     vector.
 * Up to QGROUP_TILES tiles (two pairs) go in lockstep: several streams in flight per thread, with tile.h's decode
 * prefetch (as tiles_one) a piece per block, or per sub-block of a K-quant block, beside the arithmetic.
 *
 * A decode step of a few sequences (or a speculative draft) has 2 to 8 tokens: each sub-block's weights are unpacked
 * once into 8 vectors and every token's dpbusd and float steps read them, so a step of 4 sequences costs about what
 * 1.2 of one do while the weights stream (bench/results/batch_decode.md). 9 to 16 tokens go in two calls (matmul.c),
 * and the pair kernels take over from 17.
 *
 * Bits: per row the operations are the scalar kernel's (matmul.c): each 32-value block's int32 sum exactly (any order
 * of exact integer additions gives the same int32), then acc = fma(float(isum), dw * dx, acc) and, with a min,
 * acc = fma(mw, dsum, acc) (Q4_1, Q5_1: fma(float(sum x), m * dx, acc)), block after block in column order;
 * dw = d * sc, mw = -(dmin * mn) for Q4_K and Q5_K, dw = d for Q6_K (whose int32 sum carries the scales) and the
 * 32-value types. So the results equal every other path's. */
#include <string.h>
#include "inferd.h"
#include "tile.h"

#if defined(__x86_64__)
#include <immintrin.h>

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")

#include "qpair512.h"   /* join256, join_f16, bcast4, store_rows16; prepare_one and block_token */
/* lanes 0-7 of a and 0-7 of b; lanes 8-15 of a and 8-15 of b */
PINLINE __m512 low_halves(__m512 a, __m512 b) { return _mm512_shuffle_f32x4(a, b, 0x44); }
PINLINE __m512 high_halves(__m512 a, __m512 b) { return _mm512_shuffle_f32x4(a, b, 0xee); }
/* v's 16-bit lanes shifted left by n (right by -n); n is a constant of an unrolled loop */
PINLINE __m512i shift16(__m512i v, int n) {
    return n > 0 ? _mm512_slli_epi16(v, (unsigned)n) : n < 0 ? _mm512_srli_epi16(v, (unsigned)-n) : v;
}
PINLINE __m512i low_halves_i(__m512i a, __m512i b) { return _mm512_shuffle_i32x4(a, b, 0x44); }
PINLINE __m512i high_halves_i(__m512i a, __m512i b) { return _mm512_shuffle_i32x4(a, b, 0xee); }

/* ---- Q4_K, Q5_K: d | dmin | 8 x (sc[8] | mn[8]) | 8 x group or 8 x (hbit | group) (tile.h) ---- */

/* [d | -dmin] of one tile's super-block: its first 32 bytes, converted at once */
PINLINE __m512 q45k_dmins(const uint8_t *blk) {
    const __m512i sign_high = _mm512_set_epi32(INT32_MIN, INT32_MIN, INT32_MIN, INT32_MIN, INT32_MIN, INT32_MIN,
                                               INT32_MIN, INT32_MIN, 0, 0, 0, 0, 0, 0, 0, 0);
    __m512 v = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)blk));
    return _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(v), sign_high));
}

/* A pair's 32 values stored as a group of nibbles (tile.h) as 8 vectors of bytes, w[p] values 4p..4p+3 and w[4 + p]
 * values 16+4p..: 4-bit values, or 5-bit ones whose fifth bits are the hbit piece h (byte 4r + e: bit p -> value
 * 4p+e, bit 4+p -> value 16+4p+e). Unpacked once for all the tokens of a call. */
PINLINE void nibble_vectors(const int five, const uint8_t *ga, const uint8_t *gb, __m512i h, __m512i w[8]) {
    const __m512i m4 = _mm512_set1_epi8(0x0f), m10 = _mm512_set1_epi8(0x10);
#pragma GCC unroll 4
    for (int p = 0; p < 4; p++) {
        __m512i v = join256(ga + 32 * p, gb + 32 * p);
        if (!five) {   /* the high nibbles in place: 16 q, the chain's sum shifted back once (nibble_dot) */
            w[p] = _mm512_and_si512(v, m4);
            w[4 + p] = _mm512_andnot_si512(m4, v);
            continue;
        }
        /* the fifth bits to bit 4 (16-bit shifts: what crosses bytes is masked off) */
        __m512i hl = shift16(h, 4 - p), hh = shift16(h, -p);
        w[p] = _mm512_ternarylogic_epi32(_mm512_and_si512(v, m4), hl, m10, 0xf8);   /* A | (B & C) */
        w[4 + p] = _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srli_epi16(v, 4), m4), hh, m10, 0xf8);
    }
}

/* 8 unpacked vectors times one token's 32 activation bytes x: values 0-15 added to *lo, 16-31 to *hi; embedded:
 * the bytes read by dpbusd's embedded broadcast, else by a broadcast load each (the first is faster for the 32-value
 * types, the second for the K-quants: bench/results/dpbusd_broadcast.md) */
PINLINE void dot_halves(const int embedded, const __m512i w[8], const int8_t *x, __m512i *lo, __m512i *hi) {
#pragma GCC unroll 4
    for (int p = 0; p < 4; p++) {
        if (embedded) {
            *lo = dpbusd_bcast(*lo, w[p], x + 4 * p);
            *hi = dpbusd_bcast(*hi, w[4 + p], x + 16 + 4 * p);
        } else {
            *lo = _mm512_dpbusd_epi32(*lo, w[p], bcast4(x + 4 * p));
            *hi = _mm512_dpbusd_epi32(*hi, w[4 + p], bcast4(x + 16 + 4 * p));
        }
    }
}

/* the int32 sum of nibble_vectors' values times one token's 32 activation bytes x, starting from lo */
PINLINE __m512i nibble_dot(const int embedded, const int five, const __m512i w[8], const int8_t *x, __m512i lo) {
    __m512i hi = _mm512_setzero_si512();
    dot_halves(embedded, w, x, &lo, &hi);
    return _mm512_add_epi32(lo, five ? hi : _mm512_srai_epi32(hi, 4));
}

/* sub-block s of a pair (Q4_K, or Q5_K) for nt tokens (token t's activation blocks xb + t * nb32):
 * acc[t] = fma(float(isum), dw * dx, acc[t]), acc[t] = fma(mw, dsum, acc[t]) */
PINLINE void q45k_sub(const int type, const int ntmax, int nt, const uint8_t *a, const uint8_t *b, __m512 dmA,
                      __m512 dmB, int s, const block_q8x *xb, int nb32, __m512 *acc) {
    const size_t g = tile_group_off(type, s), so = tile_scales_off(type, s), ho = tile_hbits_off(type, s);
    const int five = type == WT_Q5_K;
    __m512i w[8];
    nibble_vectors(five, a + g, b + g, five ? join256(a + ho, b + ho) : _mm512_setzero_si512(), w);
    /* [sc | mn] of each tile as floats, times [d | -dmin]: [dw | mw] per tile, then regrouped by pair lanes */
    __m512 fa = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(a + so)))),
                              dmA);
    __m512 fb = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(b + so)))),
                              dmB);
    __m512 dw = low_halves(fa, fb), mw = high_halves(fa, fb);
#pragma GCC unroll 8
    for (int t = 0; t < ntmax && t < nt; t++) {
        const block_q8x *x = xb + (size_t)t * nb32;
        __m512i isum = nibble_dot(0, five, w, x->qs, _mm512_setzero_si512());
        acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(dw, _mm512_set1_ps(x->d)), acc[t]);
        acc[t] = _mm512_fmadd_ps(mw, _mm512_set1_ps(x->dsum), acc[t]);
    }
}

/* ---- the 32-value types: Q4_0 d | group, Q4_1 d | m | group, Q5_0 d | hbit | group, Q5_1 d | m | hbit | group
 * (tile.h; not Q8_0, whose ymm kernel only loads its vectors: the pair's inserts made it no faster). One block of a
 * pair: acc = fma(float(isum), d * dx, acc) (+ fma(float(sum x), m * dx, acc) for Q4_1 and Q5_1), the sum starting
 * from the activation's correction of the types stored with an offset ---- */
PINLINE void small_block(const int type, const int ntmax, int nt, const uint8_t *a, const uint8_t *b,
                         const block_q8x *xb, int nb32, __m512 *acc) {
    const int five = type == WT_Q5_0 || type == WT_Q5_1;
    const size_t g = tile_group_off(type, 0), ho = tile_hbits_off(type, 0);
    __m512i w[8];
    nibble_vectors(five, a + g, b + g, five ? join256(a + ho, b + ho) : _mm512_setzero_si512(), w);
    __m512 d = join_f16(a, b), m = type == WT_Q4_1 || type == WT_Q5_1 ? join_f16(a + 16, b + 16) : d;
#pragma GCC unroll 8
    for (int t = 0; t < ntmax && t < nt; t++) {
        const block_q8x *x = xb + (size_t)t * nb32;
        const int32_t start = type == WT_Q4_0 ? x->q4_corr : type == WT_Q5_0 ? -16 * x->isum : 0;
        __m512i isum = nibble_dot(1, five, w, x->qs, _mm512_set1_epi32(start));
        __m512 dx = _mm512_set1_ps(x->d);
        acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(d, dx), acc[t]);
        if (type == WT_Q4_1 || type == WT_Q5_1)
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_set1_epi32(x->isum)), _mm512_mul_ps(m, dx), acc[t]);
    }
}

/* ---- Q6_K: d | 16 x sc[8] (int8) | 8 x (h2bit | group) (tile.h) ---- */

/* sub-block s of a pair for nt tokens: acc[t] = fma(float(isum), d * dx, acc[t]) with isum = sc0 (sum_0..15 q x -
 * 32 hsum0) + sc1 (sum_16..31 q x - 32 hsum1), the values unpacked once */
PINLINE void q6k_sub(const int ntmax, int nt, const uint8_t *a, const uint8_t *b, __m512 d, int s,
                     const block_q8x *xb, int nb32, __m512 *acc) {
    const __m512i m4 = _mm512_set1_epi8(0x0f), m30 = _mm512_set1_epi8(0x30);
    const size_t g = tile_group_off(WT_Q6_K, s), h = tile_hbits_off(WT_Q6_K, s), so = tile_scales_off(WT_Q6_K, s);
    const __m512i hl = join256(a + h, b + h), hh = join256(a + h + 32, b + h + 32);
    __m512i w[8];
#pragma GCC unroll 4
    for (int p = 0; p < 4; p++) {
        /* bits 2p..2p+1 of the h2bit bytes become bits 4-5 (16-bit shifts: what crosses bytes is masked off) */
        __m512i sl = shift16(hl, 4 - 2 * p), sh = shift16(hh, 4 - 2 * p);
        __m512i v = join256(a + g + 32 * p, b + g + 32 * p);
        w[p] = _mm512_ternarylogic_epi32(_mm512_and_si512(v, m4), sl, m30, 0xf8);   /* A | (B & C) */
        w[4 + p] = _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srli_epi16(v, 4), m4), sh, m30, 0xf8);
    }
    __m512i sa = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(a + so)));   /* [sc0 | sc1] of tile a */
    __m512i sb = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(b + so)));
    __m512i sc0 = low_halves_i(sa, sb), sc1 = high_halves_i(sa, sb);
#pragma GCC unroll 8
    for (int t = 0; t < ntmax && t < nt; t++) {
        const block_q8x *x = xb + (size_t)t * nb32;
        __m512i lo = _mm512_set1_epi32(x->q6_corr[0]), hi = _mm512_set1_epi32(x->q6_corr[1]);
        dot_halves(0, w, x->qs, &lo, &hi);
        __m512i isum = _mm512_add_epi32(_mm512_mullo_epi32(lo, sc0), _mm512_mullo_epi32(hi, sc1));
        acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(d, _mm512_set1_ps(x->d)), acc[t]);
    }
}

/* ---- the group: np pairs (the last possibly a lone tile paired with itself) in lockstep, for nt <= ntmax tokens
 * (token t's activation blocks at xq + t * nb32, its rows at y + t * ldy; ntmax a constant, the per-token loops'
 * unroll bound, so that the accumulators stay in registers) ---- */
PINLINE void decode_pairs(const int type, const int np, const int ntmax, int nt, const uint8_t *base,
                          size_t tile_bytes, int ntiles, int nb, const block_q8x *xq, int nb32, float *y, int ldy,
                          int nrows_last, int accumulate, int prefetch) {
    const size_t bb = tile_block_bytes(type);
    const uint8_t *ta[2], *tb[2];
    __m512 acc[2][QDECODE_TOKENS];
    for (int i = 0; i < np; i++) {
        ta[i] = base + (size_t)(2 * i) * tile_bytes;
        tb[i] = 2 * i + 1 < ntiles ? ta[i] + tile_bytes : ta[i];
        for (int t = 0; t < ntmax; t++) acc[i][t] = _mm512_setzero_ps();
    }
    /* a step per block, or per K-quant sub-block: its lines of the pairs' tiles (linear; a group of 3 fetches a 4th
     * tile's share more, within the limit), of one tile (near) */
    const int nsub = type_is_k(type) ? 8 : 1;
    const size_t step_bytes = bb / (size_t)nsub;
    const int lines_group = (int)((2 * np * step_bytes + 63) / 64), lines_tile = (int)((step_bytes + 63) / 64);
    const decode_prefetch_t pf = decode_prefetch_plan(base, tile_bytes, ntiles, step_bytes, prefetch);
    for (int bk = 0; bk < nb; bk++) {
        const size_t off = (size_t)bk * bb;
        if (type_is_2bit(type) || type_is_iq4(type)) {   /* the prefill pair kernels' unpacking and sums */
#pragma GCC unroll 8   /* the sub-blocks' offsets as immediates */
            for (int s = 0; s < nsub; s++) {
                decode_prefetch_step(&pf, bk * nsub + s, lines_group, lines_tile);
                const block_q8x *xb = xq + (size_t)bk * nsub + s;
                for (int i = 0; i < np; i++) {
                    pair_block_t p;
                    __m512i sc[3];
                    prepare_one(type, 0, ta[i] + off, tb[i] + off, s, &p, sc);
#pragma GCC unroll 8
                    for (int t = 0; t < ntmax && t < nt; t++)
                        acc[i][t] = block_token(type, &p, sc, xb + (size_t)t * nb32, acc[i][t]);
                }
            }
            continue;
        }
        if (!type_is_k(type)) {
            decode_prefetch_step(&pf, bk, lines_group, lines_tile);
            for (int i = 0; i < np; i++)
                small_block(type, ntmax, nt, ta[i] + off, tb[i] + off, xq + bk, nb32, acc[i]);
            continue;
        }
        const block_q8x *xb = xq + (size_t)bk * 8;
        if (type == WT_Q4_K || type == WT_Q5_K) {
            __m512 dmA[2], dmB[2];
            for (int i = 0; i < np; i++) { dmA[i] = q45k_dmins(ta[i] + off); dmB[i] = q45k_dmins(tb[i] + off); }
#pragma GCC unroll 8   /* unrolled: every sub-block's offsets immediates (bench/results/decode_q4k.md) */
            for (int s = 0; s < 8; s++) {
                decode_prefetch_step(&pf, bk * 8 + s, lines_group, lines_tile);
                for (int i = 0; i < np; i++)
                    q45k_sub(type, ntmax, nt, ta[i] + off, tb[i] + off, dmA[i], dmB[i], s, xb + s, nb32, acc[i]);
            }
        } else {
            __m512 d[2];
            for (int i = 0; i < np; i++) d[i] = join_f16(ta[i] + off, tb[i] + off);
#pragma GCC unroll 8
            for (int s = 0; s < 8; s++) {
                decode_prefetch_step(&pf, bk * 8 + s, lines_group, lines_tile);
                for (int i = 0; i < np; i++)
                    q6k_sub(ntmax, nt, ta[i] + off, tb[i] + off, d[i], s, xb + s, nb32, acc[i]);
            }
        }
    }
    for (int i = 0; i < np; i++) {
        int rows = 2 * i + 1 < ntiles ? TILE_ROWS + (2 * i + 2 == ntiles ? nrows_last : TILE_ROWS)
                                      : nrows_last;
        for (int t = 0; t < ntmax && t < nt; t++)
            store_rows16(acc[i][t], y + (size_t)t * ldy + (size_t)16 * i, (__mmask16)((1u << rows) - 1), accumulate);
    }
}

/* two instances per pair count: one token (a decode step's hot path, every bound a constant) and up to
 * QDECODE_TOKENS (loops unrolled to that bound, cut at ntok: the accumulators stay in registers) */
#define DTOKENS(TYPE, NP)                                                                                         \
    if (ntok == 1) decode_pairs(TYPE, NP, 1, 1, base, tile_bytes, ntiles, nb, xq, nb32, y, ldy, nrows_last,        \
                                accumulate, prefetch);                                                             \
    else decode_pairs(TYPE, NP, QDECODE_TOKENS, ntok, base, tile_bytes, ntiles, nb, xq, nb32, y, ldy, nrows_last,  \
                      accumulate, prefetch);
#define DDEFINE(name, TYPE)                                                                                       \
    void qdecode_##name(const uint8_t *base, size_t tile_bytes, int ntiles, int nb, const block_q8x *xq,         \
                        int nb32, int ntok, float *y, int ldy, int nrows_last, int accumulate, int prefetch) {   \
        if (ntiles > 2) { DTOKENS(TYPE, 2) } else { DTOKENS(TYPE, 1) }                                          \
    }
DDEFINE(q4_0, WT_Q4_0)
DDEFINE(q4_1, WT_Q4_1)
DDEFINE(q5_0, WT_Q5_0)
DDEFINE(q5_1, WT_Q5_1)
DDEFINE(q4_k, WT_Q4_K)
DDEFINE(q5_k, WT_Q5_K)
DDEFINE(q6_k, WT_Q6_K)
DDEFINE(q2_k, WT_Q2_K)
DDEFINE(q3_k, WT_Q3_K)
DDEFINE(iq4_nl, WT_IQ4_NL)
DDEFINE(iq4_xs, WT_IQ4_XS)
#undef DDEFINE
#undef DTOKENS

#pragma GCC pop_options
#endif
