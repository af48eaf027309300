/* A block of a pair of tiles in AVX-512 registers, for the kernels over pairs of tiles (qpair512.c's prefill,
 * qdecode512.c's decode of the types without an unpacking of their own there): the two tiles' pieces joined into
 * 16 lanes (prepare_one), and one token's block against them (block_token), the scalar kernel's arithmetic (matmul.c).
 * Included by those files under their AVX-512 VNNI target. */
#ifndef INFERD_QPAIR512_H
#define INFERD_QPAIR512_H
#include <string.h>
#include <immintrin.h>
#include "inferd.h"
#include "tile.h"

#define PINLINE static inline __attribute__((always_inline))

/* one 32-value block of 16 rows, unpacked: lane 8i + r (i: tile of the pair, r: its row) of wv[j] holds values
 * 4j..4j+3 of that row as dpbusd's unsigned bytes; dw the rows' scales, mw their mins (Q4_1, Q5_1) */
typedef struct { __m512i wv[8]; __m512 dw, mw; } pair_block_t;

PINLINE __m512i join256(const uint8_t *a, const uint8_t *b) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)a)),
                              _mm256_loadu_si256((const __m256i *)b), 1);
}
PINLINE __m512 join_f16(const uint8_t *a, const uint8_t *b) {
    __m256i h = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)a)),
                                        _mm_loadu_si128((const __m128i *)b), 1);
    return _mm512_cvtph_ps(h);
}

/* tile.h's pieces of the two tiles' blocks put together (the same bit moves as qtile.h's load_wv) */
/* signed: the values as dpbssd's signed bytes (q - 8 for Q4_0, q - 16 for Q5_0, Q8_0's own), for the AMX kernel;
 * else as dpbusd's unsigned bytes (Q8_0 + 128), the activation's correction taking the offset back */
PINLINE __m128i join_bytes(const uint8_t *a, const uint8_t *b) {   /* 8 bytes of each tile */
    return _mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)a), _mm_loadl_epi64((const __m128i *)b));
}
PINLINE __m512 join_u8(const uint8_t *a, const uint8_t *b) {   /* 8 bytes of each tile as 16 floats */
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(join_bytes(a, b)));
}

PINLINE __m512 negated(__m512 v) {   /* -v exactly: the sign bit flipped */
    return _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(v), _mm512_set1_epi32(INT32_MIN)));
}

/* MXFP4's 16 E8M0 bytes as floats: qtile.h's load_e8m0x8 on 16 lanes */
PINLINE __m512 join_e8m0(const uint8_t *a, const uint8_t *b) {
    const __m512i em1 = _mm512_sub_epi32(_mm512_cvtepu8_epi32(join_bytes(a, b)), _mm512_set1_epi32(1));
    const __m512i sub = _mm512_srlv_epi32(_mm512_set1_epi32(0x00400000), _mm512_sub_epi32(_mm512_setzero_si512(), em1));
    return _mm512_castsi512_ps(_mm512_max_epi32(_mm512_slli_epi32(em1, 23), sub));
}
/* the int scales kept beside the panel, per 32-value block: a by-halves type's two (values 0-15, 16-31), IQ4_XS's
 * one; after Q2_K's, its two mins as int16 in each lane (for one madd with the activation's hsum) */
PINLINE int int_scales(const int type) {
    return type == WT_Q2_K ? 3 : type_by_halves(type) ? 2 : type == WT_IQ4_XS ? 1 : 0;
}

/* Q6_K: bits 2p..2p+1 of the h2bit bytes become bits 4-5 of the values (16-bit shifts: what crosses bytes is masked) */
PINLINE __m512i q6_high(__m512i h, int p) {
    return p == 0 ? _mm512_slli_epi16(h, 4) : p == 1 ? _mm512_slli_epi16(h, 2) : p == 2 ? h : _mm512_srli_epi16(h, 2);
}

/* sub-block sub (a K-quant's 32 values sub, else 0) of the pair's blocks a and c (types other than the codebook and
 * ternary ones): its values into p, its int_scales(type) vectors of int scales as int32 (lane 8i + r) into sc */
PINLINE void prepare_one(const int type, const int sign, const uint8_t *a, const uint8_t *c, int sub, pair_block_t *p,
                         __m512i *sc) {
    const __m512i m4 = _mm512_set1_epi8(0x0f), m5 = _mm512_set1_epi8(0x10);
    p->dw = type == WT_MXFP4 ? join_e8m0(a, c) : join_f16(a, c);
    p->mw = type == WT_Q4_1 || type == WT_Q5_1 ? join_f16(a + 16, c + 16) : _mm512_setzero_ps();
    if (type == WT_Q4_K || type == WT_Q5_K) {   /* dw = d * sc, mw = -(dmin * mn): matmul.c's order */
        const size_t so = tile_scales_off(type, sub);
        p->dw = _mm512_mul_ps(p->dw, join_u8(a + so, c + so));
        __m512 m = _mm512_mul_ps(join_f16(a + 16, c + 16), join_u8(a + so + 8, c + so + 8));
        p->mw = negated(m);
    }
    if (type == WT_Q6_K) {   /* the decode kernel's unpacking (qdecode512.c): values q + 32, unsigned */
        const size_t g = tile_group_off(type, sub), h = tile_hbits_off(type, sub), so = tile_scales_off(type, sub);
        const __m512i hl = join256(a + h, c + h), hh = join256(a + h + 32, c + h + 32);
        const __m512i m30 = _mm512_set1_epi8(0x30);
        for (int q = 0; q < 4; q++) {
            __m512i v = join256(a + g + 32 * q, c + g + 32 * q);
            p->wv[q] = _mm512_ternarylogic_epi32(_mm512_and_si512(v, m4), q6_high(hl, q), m30, 0xf8);
            p->wv[4 + q] = _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srli_epi16(v, 4), m4), q6_high(hh, q),
                                                     m30, 0xf8);   /* A | (B & C) */
        }
        __m512i sa = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(a + so)));   /* [sc0 | sc1] */
        __m512i sb = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(c + so)));
        sc[0] = _mm512_shuffle_i32x4(sa, sb, 0x44);
        sc[1] = _mm512_shuffle_i32x4(sa, sb, 0xee);
        if (sign)   /* q - 32 for dpbssd: each half's sum is then sum (q - 32) x directly */
            for (int j = 0; j < 8; j++) p->wv[j] = _mm512_sub_epi8(p->wv[j], _mm512_set1_epi8(32));
        return;
    }
    if (type_is_2bit(type)) {   /* qtile.h's load_wv: a q2group, Q3_K's third bit from its hbit piece */
        const size_t g = tile_group_off(type, sub), so = tile_scales_off(type, sub);
        const __m512i m2 = _mm512_set1_epi8(3);
        for (int v = 0; v < 2; v++) {
            const __m512i q = join256(a + g + 32 * v, c + g + 32 * v);
            for (int k = 0; k < 4; k++) p->wv[4 * v + k] = _mm512_and_si512(_mm512_srli_epi16(q, 2 * k), m2);
        }
        if (type == WT_Q3_K) {   /* bit j of the hbit bytes -> bit 2 of wv[j]; values q + 4 */
            const size_t ho = tile_hbits_off(type, sub);
            const __m512i h = join256(a + ho, c + ho), m = _mm512_set1_epi8(4);
            p->wv[0] = _mm512_or_si512(p->wv[0], _mm512_and_si512(_mm512_slli_epi16(h, 2), m));
            p->wv[1] = _mm512_or_si512(p->wv[1], _mm512_and_si512(_mm512_slli_epi16(h, 1), m));
            for (int j = 2; j < 8; j++)
                p->wv[j] = _mm512_or_si512(p->wv[j], _mm512_and_si512(_mm512_srli_epi16(h, j - 2), m));
            sc[0] = _mm512_cvtepi8_epi32(join_bytes(a + so, c + so));
            sc[1] = _mm512_cvtepi8_epi32(join_bytes(a + so + 8, c + so + 8));
        } else {   /* Q2_K: bytes sc | mn << 4; mw = -dmin */
            const __m512i m4i = _mm512_set1_epi32(15);
            const __m512i h0 = _mm512_cvtepu8_epi32(join_bytes(a + so, c + so));
            const __m512i h1 = _mm512_cvtepu8_epi32(join_bytes(a + so + 8, c + so + 8));
            sc[0] = _mm512_and_si512(h0, m4i);
            sc[1] = _mm512_and_si512(h1, m4i);
            sc[2] = _mm512_or_si512(_mm512_srli_epi32(h0, 4), _mm512_slli_epi32(_mm512_srli_epi32(h1, 4), 16));
            p->mw = negated(join_f16(a + 16, c + 16));
        }
        return;
    }
    if (type == WT_Q8_0) {   /* w + 128: unsigned; the activation's q8_corr takes the 128 sum(x) back */
        const __m512i flip = _mm512_set1_epi8(sign ? 0 : (char)0x80);
        for (int j = 0; j < 8; j++) p->wv[j] = _mm512_xor_si512(join256(a + 16 + 32 * j, c + 16 + 32 * j), flip);
        return;
    }
    const size_t g = tile_group_off(type, sub);
    for (int q = 0; q < 4; q++) {
        __m512i v = join256(a + g + 32 * q, c + g + 32 * q);
        p->wv[q] = _mm512_and_si512(v, m4);
        p->wv[4 + q] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
    }
    if (type == WT_Q5_0 || type == WT_Q5_1 || type == WT_Q5_K) {   /* hbit bit p -> 4p+e's bit 4, 4+p -> 16+4p+e's */
        const size_t ho = tile_hbits_off(type, sub);
        __m512i h = join256(a + ho, c + ho);
        p->wv[0] = _mm512_or_si512(p->wv[0], _mm512_and_si512(_mm512_slli_epi16(h, 4), m5));
        p->wv[1] = _mm512_or_si512(p->wv[1], _mm512_and_si512(_mm512_slli_epi16(h, 3), m5));
        p->wv[2] = _mm512_or_si512(p->wv[2], _mm512_and_si512(_mm512_slli_epi16(h, 2), m5));
        p->wv[3] = _mm512_or_si512(p->wv[3], _mm512_and_si512(_mm512_slli_epi16(h, 1), m5));
        p->wv[4] = _mm512_or_si512(p->wv[4], _mm512_and_si512(h, m5));
        p->wv[5] = _mm512_or_si512(p->wv[5], _mm512_and_si512(_mm512_srli_epi16(h, 1), m5));
        p->wv[6] = _mm512_or_si512(p->wv[6], _mm512_and_si512(_mm512_srli_epi16(h, 2), m5));
        p->wv[7] = _mm512_or_si512(p->wv[7], _mm512_and_si512(_mm512_srli_epi16(h, 3), m5));
    }
    if (type_is_iq4(type)) {   /* codes -> values: signed, or dpbusd's unsigned v + 128 (MXFP4: v + 12) */
        const int8_t *values = type == WT_MXFP4 && !sign ? MXFP4_PLUS_OFFSET : code_values(type);
        __m512i book = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)values));
        if (!sign && type != WT_MXFP4) book = _mm512_xor_si512(book, _mm512_set1_epi8((char)0x80));
        for (int j = 0; j < 8; j++) p->wv[j] = _mm512_shuffle_epi8(book, p->wv[j]);
        if (type == WT_IQ4_XS) {
            const size_t so = tile_scales_off(type, sub);
            sc[0] = _mm512_cvtepi8_epi32(join_bytes(a + so, c + so));
        }
    }
    if (sign && (type == WT_Q4_0 || type == WT_Q5_0)) {
        const __m512i off = _mm512_set1_epi8(type == WT_Q4_0 ? 8 : 16);
        for (int j = 0; j < 8; j++) p->wv[j] = _mm512_sub_epi8(p->wv[j], off);
    }
}

PINLINE __m512i bcast4(const int8_t *p) { int32_t v; memcpy(&v, p, 4); return _mm512_set1_epi32(v); }
/* acc + dpbusd(w, p's 4 bytes in every lane), the bytes read by the instruction's embedded broadcast: compilers emit a
 * broadcast load of its own before each dpbusd, which cost the pair kernels 4% of a prefill on AMD Zen 4
 * (bench/results/dpbusd_broadcast.md) */
typedef int32_t __attribute__((may_alias, aligned(1))) unaligned_i32;
PINLINE __m512i dpbusd_bcast(__m512i acc, __m512i w, const int8_t *p) {
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*(const unaligned_i32 *)p));
    return acc;
}

PINLINE void store_rows16(__m512 acc, float *o, __mmask16 rows, int accumulate) {
    _mm512_mask_storeu_ps(o, rows, accumulate ? _mm512_add_ps(_mm512_maskz_loadu_ps(rows, o), acc) : acc);
}

/* acc + one token's block xb against an unpacked block p with its int scales bs: the block's int32 sum (by halves
 * for the types that go so), then the float steps */
PINLINE __m512 block_token(const int type, const pair_block_t *p, const __m512i *bs, const block_q8x *xb, __m512 acc) {
    __m512i s;
    if (type_by_halves(type)) {   /* sc0 (sum_0..15 q x - offset sum x) + sc1 (the same over 16..31) */
        __m512i lo = _mm512_set1_epi32(half_offset_corr(type, xb, 0));
        __m512i hi = _mm512_set1_epi32(half_offset_corr(type, xb, 1));
        for (int j = 0; j < 4; j++) {
            lo = dpbusd_bcast(lo, p->wv[j], xb->qs + 4 * j);
            hi = dpbusd_bcast(hi, p->wv[4 + j], xb->qs + 16 + 4 * j);
        }
        s = _mm512_add_epi32(_mm512_mullo_epi32(lo, bs[0]), _mm512_mullo_epi32(hi, bs[1]));
    } else {
        s = _mm512_set1_epi32(offset_corr(type, xb));
        for (int j = 0; j < 8; j++) s = dpbusd_bcast(s, p->wv[j], xb->qs + 4 * j);
        if (type == WT_IQ4_XS) s = _mm512_mullo_epi32(s, bs[0]);
    }
    __m512 dx = _mm512_set1_ps(xb->d);
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(p->dw, dx), acc);
    if (type == WT_Q4_1 || type == WT_Q5_1)
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_set1_epi32(xb->isum)), _mm512_mul_ps(p->mw, dx), acc);
    else if (type == WT_Q4_K || type == WT_Q5_K)
        acc = _mm512_fmadd_ps(p->mw, _mm512_set1_ps(xb->dsum), acc);
    else if (type == WT_Q2_K) {   /* mn0 sum_0..15 x + mn1 sum_16..31 x, times -dmin dx */
        const __m512i imin = _mm512_madd_epi16(bs[2], bcast4((const int8_t *)xb->hsum));
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(imin), _mm512_mul_ps(p->mw, dx), acc);
    }
    return acc;
}

#endif
