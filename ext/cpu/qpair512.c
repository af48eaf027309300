/* Prefill of the quantized types over pairs of tiles in AVX-512 registers (and, with the same pieces, the decode of
 * Q2_K, Q3_K and the IQ4 types: unpacked_decode below).
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

#define PINLINE static inline __attribute__((always_inline))
#define PAIR_NT 12   /* tokens per pass: 12 accumulators + 8 weight vectors + scales and temporaries of 32 zmm */

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

PINLINE __m512i bcast4(const int8_t *p) { int32_t v; memcpy(&v, p, 4); return _mm512_set1_epi32(v); }

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
            lo = _mm512_dpbusd_epi32(lo, p->wv[j], bcast4(xb->qs + 4 * j));
            hi = _mm512_dpbusd_epi32(hi, p->wv[4 + j], bcast4(xb->qs + 16 + 4 * j));
        }
        s = _mm512_add_epi32(_mm512_mullo_epi32(lo, bs[0]), _mm512_mullo_epi32(hi, bs[1]));
    } else {
        s = _mm512_set1_epi32(offset_corr(type, xb));
        for (int j = 0; j < 8; j++) s = _mm512_dpbusd_epi32(s, p->wv[j], bcast4(xb->qs + 4 * j));
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

/* Decode (1 to QDECODE_TOKENS tokens) of Q2_K, Q3_K and the IQ4 types, which qdecode512.c has no kernel of its own
 * for, laid out as its kernels: up to two pairs of tiles in lockstep with tile.h's decode prefetch, each pair's block
 * (or K-quant sub-block) unpacked by prepare_one into registers once for all the call's tokens, then block_token per
 * token: the arithmetic of the prefill kernels above, so the same bits. Not MXFP4, whose one-token group kernel on
 * the ymm tiles is faster, nor the codebook types (their lookups unpacked this way made one token slower). */
PINLINE void unpacked_decode(const int type, const int np, const int ntmax, int nt, const uint8_t *base,
                             size_t tile_bytes, int ntiles, int nb, const block_q8x *xq, int nb32, float *y, int ldy,
                             int nrows_last, int accumulate, int prefetch) {
    const size_t bb = tile_block_bytes(type);
    const int nsub = type_is_k(type) ? 8 : 1;
    const uint8_t *ta[2], *tb[2];
    __m512 acc[2][QDECODE_TOKENS];
    for (int i = 0; i < np; i++) {
        ta[i] = base + (size_t)(2 * i) * tile_bytes;
        tb[i] = 2 * i + 1 < ntiles ? ta[i] + tile_bytes : ta[i];
        for (int t = 0; t < ntmax; t++) acc[i][t] = _mm512_setzero_ps();
    }
    const size_t step_bytes = bb / (size_t)nsub;
    const int lines_group = (int)((2 * np * step_bytes + 63) / 64), lines_tile = (int)((step_bytes + 63) / 64);
    const decode_prefetch_t pf = decode_prefetch_plan(base, tile_bytes, ntiles, step_bytes, prefetch);
    for (int bk = 0; bk < nb; bk++) {
        const size_t off = (size_t)bk * bb;
#pragma GCC unroll 8   /* the sub-blocks' offsets as immediates */
        for (int sub = 0; sub < nsub; sub++) {
            decode_prefetch_step(&pf, bk * nsub + sub, lines_group, lines_tile);
            const block_q8x *xb = xq + (size_t)bk * nsub + sub;
            for (int i = 0; i < np; i++) {
                pair_block_t p;
                __m512i sc[3];
                prepare_one(type, 0, ta[i] + off, tb[i] + off, sub, &p, sc);
#pragma GCC unroll 8
                for (int t = 0; t < ntmax && t < nt; t++)
                    acc[i][t] = block_token(type, &p, sc, xb + (size_t)t * nb32, acc[i][t]);
            }
        }
    }
    for (int i = 0; i < np; i++) {
        int rows = 2 * i + 1 < ntiles ? TILE_ROWS + (2 * i + 2 == ntiles ? nrows_last : TILE_ROWS) : nrows_last;
        for (int t = 0; t < ntmax && t < nt; t++)
            store_rows16(acc[i][t], y + (size_t)t * ldy + (size_t)16 * i, (__mmask16)((1u << rows) - 1), accumulate);
    }
}

/* one instance per pair count for one token (every bound a constant), one for up to QDECODE_TOKENS */
#define UTOKENS(TYPE, NP)                                                                                         \
    if (ntok == 1) unpacked_decode(TYPE, NP, 1, 1, base, tile_bytes, ntiles, nb, xq, nb32, y, ldy, nrows_last,     \
                                   accumulate, prefetch);                                                          \
    else unpacked_decode(TYPE, NP, QDECODE_TOKENS, ntok, base, tile_bytes, ntiles, nb, xq, nb32, y, ldy,           \
                         nrows_last, accumulate, prefetch);
#define UDEFINE(name, TYPE)                                                                                       \
    void qdecode_##name(const uint8_t *base, size_t tile_bytes, int ntiles, int nb, const block_q8x *xq,         \
                        int nb32, int ntok, float *y, int ldy, int nrows_last, int accumulate, int prefetch) {   \
        if (ntiles > 2) { UTOKENS(TYPE, 2) } else { UTOKENS(TYPE, 1) }                                          \
    }
UDEFINE(q2_k, WT_Q2_K)
UDEFINE(q3_k, WT_Q3_K)
UDEFINE(iq4_nl, WT_IQ4_NL)
UDEFINE(iq4_xs, WT_IQ4_XS)
#undef UDEFINE
#undef UTOKENS

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
