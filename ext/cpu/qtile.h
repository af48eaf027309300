/* The SIMD tile kernels, written once for every quantized type and included by matmul_simd.c once per path
 * inside a `#pragma GCC target` region, with:
 *   KSUFFIX        the path's name (the functions and each type's qkernel_t get it as a suffix)
 *   KVNNI          1 where DPBUSD(acc, w, x) (u8 x s8 -> s32, accumulating) exists, 0 for AVX2
 *   KNT(type)      the most tokens per call of the tile kernel of `type` (its qkernel_t's ntok)
 *   KNT_PAIR       (AVX2) tokens per call of the prefill kernel over two tiles (pair_tokens)
 *   KLANES_EXPORT  (the AVX-512 VNNI copy) also define lanes_<type>_<suffix>, the codebook types' unpacking for the
 *                  zmm pair kernels (tile.h's lanes_block_fn)
 *
 * One call: ntok tokens against one tile (8 rows; AVX2's prefill of some types: two, pair_tokens). For every 32-value
 * block, in column order:
 *   1. the block's 8 weight vectors wv[j] (lane r: values 4j..4j+3 of row r, unsigned; signed for Q8_0),
 *   2. for each token, its exact int32 block sum isum (tile.h and matmul.c's scalar kernel define it per type),
 *   3. acc = fma(float(isum), dw * dx, acc), and for the types with a min, acc = fma(mw, dx * sum x, acc),
 *      dw and mw being the rows' scale and min of the block (K-quants: d * sc and -(dmin * mn), exact in f32).
 * Integer sums are exact in any order, so the paths may use different instructions and chains; the float steps
 * are the same operations in the same order on every path and for every ntok: bit-identical results.
 * Every type has its kernels on every path here; the zmm kernels (qpair512.c, qdecode512.c) cover fewer types. */

#define KCAT_(a, b) a##_##b
#define KCAT(a, b) KCAT_(a, b)
#define KFN(name) KCAT(name, KSUFFIX)
#define KINLINE static inline __attribute__((always_inline))

KINLINE __m256i KFN(bcast4)(const void *p) { int32_t v; memcpy(&v, p, 4); return _mm256_set1_epi32(v); }
KINLINE __m256 KFN(load_f16x8)(const uint8_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }
/* MXFP4's 8 E8M0 bytes as mxfp4_scale's floats: (e - 1) << 23 from e = 2 on; below, 0x00400000 >> (1 - e), which a
 * signed max picks over the negative or zero (e - 1) << 23 (and which is 0 from e = 2 on: the count wraps past 31) */
KINLINE __m256 KFN(load_e8m0x8)(const uint8_t *p) {
    const __m256i em1 = _mm256_sub_epi32(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p)),
                                         _mm256_set1_epi32(1));
    const __m256i sub = _mm256_srlv_epi32(_mm256_set1_epi32(0x00400000), _mm256_sub_epi32(_mm256_setzero_si256(), em1));
    return _mm256_castsi256_ps(_mm256_max_epi32(_mm256_slli_epi32(em1, 23), sub));
}
/* row scales d of a tile block: f16, or MXFP4's exponents */
KINLINE __m256 KFN(load_d)(const int type, const uint8_t *blk) {
    return type == WT_MXFP4 ? KFN(load_e8m0x8)(blk) : _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)blk));
}
KINLINE __m256 KFN(load_u8x8_ps)(const uint8_t *p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}

/* wv[0..7] of block s of a tile block (tile.h's group, hbit and h2bit pieces put together) */
KINLINE void KFN(load_wv)(const int type, const uint8_t *blk, int s, __m256i wv[8]) {
    if (type == WT_Q8_0) {
        for (int j = 0; j < 8; j++) {
            wv[j] = _mm256_loadu_si256((const __m256i *)(blk + 16 + 32 * j));
            if (KVNNI) wv[j] = _mm256_xor_si256(wv[j], _mm256_set1_epi8((char)0x80));   /* w + 128: unsigned */
        }
        return;
    }
    if (type_is_2bit(type)) {   /* a q2group, and Q3_K's third bit from its hbit piece (bit j -> wv[j]'s bit 2) */
        const __m256i m2 = _mm256_set1_epi8(3);
        const uint8_t *g = blk + tile_group_off(type, s);
        for (int v = 0; v < 2; v++) {
            __m256i q = _mm256_loadu_si256((const __m256i *)(g + 32 * v));
            wv[4 * v] = _mm256_and_si256(q, m2);
            wv[4 * v + 1] = _mm256_and_si256(_mm256_srli_epi16(q, 2), m2);
            wv[4 * v + 2] = _mm256_and_si256(_mm256_srli_epi16(q, 4), m2);
            wv[4 * v + 3] = _mm256_and_si256(_mm256_srli_epi16(q, 6), m2);
        }
        if (type == WT_Q3_K) {
            const __m256i m = _mm256_set1_epi8(4);
            __m256i h = _mm256_loadu_si256((const __m256i *)(blk + tile_hbits_off(type, s)));
            wv[0] = _mm256_or_si256(wv[0], _mm256_and_si256(_mm256_slli_epi16(h, 2), m));
            wv[1] = _mm256_or_si256(wv[1], _mm256_and_si256(_mm256_slli_epi16(h, 1), m));
            wv[2] = _mm256_or_si256(wv[2], _mm256_and_si256(h, m));
            wv[3] = _mm256_or_si256(wv[3], _mm256_and_si256(_mm256_srli_epi16(h, 1), m));
            wv[4] = _mm256_or_si256(wv[4], _mm256_and_si256(_mm256_srli_epi16(h, 2), m));
            wv[5] = _mm256_or_si256(wv[5], _mm256_and_si256(_mm256_srli_epi16(h, 3), m));
            wv[6] = _mm256_or_si256(wv[6], _mm256_and_si256(_mm256_srli_epi16(h, 4), m));
            wv[7] = _mm256_or_si256(wv[7], _mm256_and_si256(_mm256_srli_epi16(h, 5), m));
        }
        return;
    }
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    const uint8_t *g = blk + tile_group_off(type, s);
    for (int p = 0; p < 4; p++) {
        __m256i v = _mm256_loadu_si256((const __m256i *)(g + 32 * p));
        wv[p] = _mm256_and_si256(v, m4);
        wv[4 + p] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
    }
    if (type_is_iq4(type)) {   /* codes -> their int8 values (MXFP4: plus its offset): one byte shuffle per 32 */
        const int8_t *values = type == WT_MXFP4 ? MXFP4_PLUS_OFFSET : code_values(type);
        __m256i book = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)values));
        if (KVNNI && type != WT_MXFP4) book = _mm256_xor_si256(book, _mm256_set1_epi8((char)0x80));   /* v + 128 */
        for (int j = 0; j < 8; j++) wv[j] = _mm256_shuffle_epi8(book, wv[j]);
        return;
    }
    /* the high bits move to bit 4 (5-bit) or bits 4-5 (Q6_K); 16-bit shifts carry bits across bytes only into
     * positions the mask clears */
    if (type == WT_Q5_0 || type == WT_Q5_1 || type == WT_Q5_K) {
        const __m256i m = _mm256_set1_epi8(0x10);
        __m256i h = _mm256_loadu_si256((const __m256i *)(blk + tile_hbits_off(type, s)));
        wv[0] = _mm256_or_si256(wv[0], _mm256_and_si256(_mm256_slli_epi16(h, 4), m));
        wv[1] = _mm256_or_si256(wv[1], _mm256_and_si256(_mm256_slli_epi16(h, 3), m));
        wv[2] = _mm256_or_si256(wv[2], _mm256_and_si256(_mm256_slli_epi16(h, 2), m));
        wv[3] = _mm256_or_si256(wv[3], _mm256_and_si256(_mm256_slli_epi16(h, 1), m));
        wv[4] = _mm256_or_si256(wv[4], _mm256_and_si256(h, m));
        wv[5] = _mm256_or_si256(wv[5], _mm256_and_si256(_mm256_srli_epi16(h, 1), m));
        wv[6] = _mm256_or_si256(wv[6], _mm256_and_si256(_mm256_srli_epi16(h, 2), m));
        wv[7] = _mm256_or_si256(wv[7], _mm256_and_si256(_mm256_srli_epi16(h, 3), m));
    } else if (type == WT_Q6_K) {
        const __m256i m = _mm256_set1_epi8(0x30);
        const uint8_t *hp = blk + tile_hbits_off(type, s);
        for (int half = 0; half < 2; half++) {
            __m256i h = _mm256_loadu_si256((const __m256i *)(hp + 32 * half));
            __m256i *w = wv + 4 * half;
            w[0] = _mm256_or_si256(w[0], _mm256_and_si256(_mm256_slli_epi16(h, 4), m));
            w[1] = _mm256_or_si256(w[1], _mm256_and_si256(_mm256_slli_epi16(h, 2), m));
            w[2] = _mm256_or_si256(w[2], _mm256_and_si256(h, m));
            w[3] = _mm256_or_si256(w[3], _mm256_and_si256(_mm256_srli_epi16(h, 2), m));
        }
    }
}

/* Q6_K's sub-block scales of block s: sc32[0..1] (int32 per lane, for the VNNI products), sc16[0..1] (int16 in
 * both halves of a lane, AVX2's madd), pair (lane r = the two scales as int16, for the -32 * hsum correction).
 * Q3_K's are the same; Q2_K's sc16 are its scales and its pair its mins; IQ4_XS has one scale, sc16[0]. */
typedef struct { __m256i sc32[2], sc16[2], pair; } KFN(q6scales);

KINLINE int KFN(has_int_scales)(const int type) {
    return type == WT_Q6_K || type == WT_Q3_K || type == WT_Q2_K || type == WT_IQ4_XS;
}

KINLINE void KFN(load_q6scales)(const int type, const uint8_t *sc, KFN(q6scales) *o) {
    __m128i a = _mm_loadl_epi64((const __m128i *)sc), b = _mm_loadl_epi64((const __m128i *)(sc + 8));
    if (type == WT_IQ4_XS) b = a;   /* one scale per row: the 8 bytes after it are the next sub-block's */
    if (type == WT_Q2_K) {          /* bytes sc | mn << 4 */
        const __m128i m4 = _mm_set1_epi8(0x0f);
        __m128i ma = _mm_and_si128(_mm_srli_epi16(a, 4), m4), mb = _mm_and_si128(_mm_srli_epi16(b, 4), m4);
        a = _mm_and_si128(a, m4);
        b = _mm_and_si128(b, m4);
        o->pair = _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(ma, mb));
    } else {
        o->pair = _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(a, b));
    }
    o->sc32[0] = _mm256_cvtepi8_epi32(a);
    o->sc32[1] = _mm256_cvtepi8_epi32(b);
    for (int i = 0; i < 2; i++)
        o->sc16[i] = _mm256_or_si256(_mm256_and_si256(o->sc32[i], _mm256_set1_epi32(0xffff)),
                                     _mm256_slli_epi32(o->sc32[i], 16));
}

/* an AVX2 block sum with its stored values' offsets taken off (tile.h's offset_corr; Q6_K's q + 32 and Q3_K's q + 4
 * times each half's scaled sum of x) */
KINLINE __m256i KFN(offsets_off)(const int type, __m256i sum, const KFN(q6scales) *q6, const block_q8x *xb) {
    if (type == WT_Q6_K || type == WT_Q3_K)
        return _mm256_sub_epi32(sum, _mm256_slli_epi32(_mm256_madd_epi16(q6->pair, KFN(bcast4)(xb->hsum)),
                                                       type == WT_Q6_K ? 5 : 2));
    const int32_t corr = offset_corr(type, xb);
    return corr ? _mm256_add_epi32(sum, _mm256_set1_epi32(corr)) : sum;
}

/* the exact int32 block sum of one token (xb) against wv, per lane */
KINLINE __m256i KFN(block_isum)(const int type, const int chains, const __m256i wv[8], const block_q8x *xb,
                                const KFN(q6scales) *q6) {
    __m256i x[8];
    for (int j = 0; j < 8; j++) x[j] = KFN(bcast4)(xb->qs + 4 * j);
#if KVNNI
    /* every value unsigned (load_wv, load_lanes), each chain started from its offset's correction (tile.h): by halves
     * of 16 values, each half's sum times its scale; else the block in one chain (two for a single token), IQ4_XS's
     * one scale after */
    if (type_by_halves(type)) {
        __m256i a = _mm256_set1_epi32(half_offset_corr(type, xb, 0));
        __m256i b = _mm256_set1_epi32(half_offset_corr(type, xb, 1));
        for (int j = 0; j < 4; j++) {
            a = DPBUSD(a, wv[j], x[j]);
            b = DPBUSD(b, wv[4 + j], x[4 + j]);
        }
        return _mm256_add_epi32(_mm256_mullo_epi32(a, q6->sc32[0]), _mm256_mullo_epi32(b, q6->sc32[1]));
    }
    __m256i a = _mm256_set1_epi32(offset_corr(type, xb)), b = _mm256_setzero_si256();
    for (int j = 0; j < 8; j++) {
        if (chains == 2 && (j & 1)) b = DPBUSD(b, wv[j], x[j]);
        else a = DPBUSD(a, wv[j], x[j]);
    }
    const __m256i sum = _mm256_add_epi32(a, b);
    return type == WT_IQ4_XS ? _mm256_mullo_epi32(sum, q6->sc32[0]) : sum;
#else
    const __m256i ones = _mm256_set1_epi16(1);
    if (type_keeps_blocks(type)) {
        /* signed values: |v| times x with v's sign; each half of 16 values times its scale in the madd. A maddubs
         * pair is at most 2 * 62 * 127 (IQ3's grids), so two of them add in int16 before the madd; the IQ1 and
         * ternary values (|v| <= 9) add all four of a half */
        const int four = type == WT_IQ1_S || type == WT_IQ1_M || type == WT_TQ1_0 || type == WT_TQ2_0;
        __m256i p[8], sum = _mm256_setzero_si256();
        for (int j = 0; j < 8; j++)
            p[j] = _mm256_maddubs_epi16(_mm256_sign_epi8(wv[j], wv[j]), _mm256_sign_epi8(x[j], wv[j]));
        for (int h = 0; h < 2; h++) {
            __m256i p01 = _mm256_add_epi16(p[4 * h], p[4 * h + 1]), p23 = _mm256_add_epi16(p[4 * h + 2], p[4 * h + 3]);
            if (four)
                sum = _mm256_add_epi32(sum, _mm256_madd_epi16(_mm256_add_epi16(p01, p23), q6->sc16[h]));
            else
                sum = _mm256_add_epi32(sum, _mm256_add_epi32(_mm256_madd_epi16(p01, q6->sc16[h]),
                                                             _mm256_madd_epi16(p23, q6->sc16[h])));
        }
        return sum;
    }
    if (type == WT_MXFP4) {
        /* values + 12 (MXFP4_OFFSET) in [0, 24], unsigned: four maddubs pairs stay below 4 * 2 * 24 * 127 < 2^15
         * in int16, and 12 sum(x) comes off after: sum (v + 12) x - 12 sum x = sum v x, exact */
        __m256i a = _mm256_setzero_si256(), b = _mm256_setzero_si256();
        for (int j = 0; j < 4; j++) {
            a = _mm256_add_epi16(a, _mm256_maddubs_epi16(wv[j], x[j]));
            b = _mm256_add_epi16(b, _mm256_maddubs_epi16(wv[4 + j], x[4 + j]));
        }
        return KFN(offsets_off)(type, _mm256_add_epi32(_mm256_madd_epi16(a, ones), _mm256_madd_epi16(b, ones)), q6,
                                xb);
    }
    if (type == WT_IQ4_NL || type == WT_IQ4_XS) {
        /* signed values (|v| <= 127): |v| times x with v's sign, Q8_0's way; IQ4_XS's scale joins in the madd
         * (|pair sum| * 32 < 2^31) */
        const __m256i sc = type == WT_IQ4_XS ? q6->sc16[0] : ones;
        __m256i a = _mm256_setzero_si256(), b = _mm256_setzero_si256();
        for (int j = 0; j < 8; j++) {
            __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(wv[j], wv[j]),
                                                               _mm256_sign_epi8(x[j], wv[j])), sc);
            if (chains == 2 && (j & 1)) b = _mm256_add_epi32(b, p);
            else a = _mm256_add_epi32(a, p);
        }
        return _mm256_add_epi32(a, b);
    }
    if (type_is_2bit(type)) {
        /* 4 maddubs of values <= 7 stay below 4 * 2 * 7 * 127 < 2^15 in int16; then each half times its scale */
        __m256i a = _mm256_setzero_si256(), b = _mm256_setzero_si256();
        for (int j = 0; j < 4; j++) {
            a = _mm256_add_epi16(a, _mm256_maddubs_epi16(wv[j], x[j]));
            b = _mm256_add_epi16(b, _mm256_maddubs_epi16(wv[4 + j], x[4 + j]));
        }
        /* Q3_K's values are stored as q + 4: 4 * (sc0 * sum(x[0..15]) + sc1 * ...) comes off */
        return KFN(offsets_off)(type, _mm256_add_epi32(_mm256_madd_epi16(a, q6->sc16[0]),
                                                       _mm256_madd_epi16(b, q6->sc16[1])), q6, xb);
    }
    if (type == WT_Q6_K) {
        /* a maddubs pair is at most 2 * 63 * 127, so two of them add in int16 (< 2^15) before the madd */
        __m256i a = _mm256_setzero_si256(), b = _mm256_setzero_si256();
        for (int j = 0; j < 4; j += 2) {
            a = _mm256_add_epi32(a, _mm256_madd_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(wv[j], x[j]),
                                                                       _mm256_maddubs_epi16(wv[j + 1], x[j + 1])),
                                                      q6->sc16[0]));
            b = _mm256_add_epi32(b, _mm256_madd_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(wv[4 + j], x[4 + j]),
                                                                       _mm256_maddubs_epi16(wv[5 + j], x[5 + j])),
                                                      q6->sc16[1]));
        }
        /* values are stored as q + 32: 32 * (sc0 * sum(x[0..15]) + sc1 * sum(x[16..31])) comes off */
        return KFN(offsets_off)(type, _mm256_add_epi32(a, b), q6, xb);
    }
    if (type == WT_Q8_0) {
        __m256i a = _mm256_setzero_si256(), b = _mm256_setzero_si256();
        for (int j = 0; j < 8; j++) {   /* |w| x sign(w): pairs of 128 * 127 would overflow int16 if added */
            __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(wv[j], wv[j]),
                                                               _mm256_sign_epi8(x[j], wv[j])), ones);
            if (chains == 2 && (j & 1)) b = _mm256_add_epi32(b, p);
            else a = _mm256_add_epi32(a, p);
        }
        return _mm256_add_epi32(a, b);
    }
    /* 4- and 5-bit unsigned values; Q4_0 and Q5_0 subtract 8 or 16 times sum(x) */
    const int five = type == WT_Q5_0 || type == WT_Q5_1 || type == WT_Q5_K;
    /* int16 partial sums: 8 maddubs of 4-bit values stay below 8 * 2 * 15 * 127 < 2^15; 5-bit values allow 4 */
    __m256i a = _mm256_setzero_si256(), b = _mm256_setzero_si256();
    for (int j = 0; j < 8; j++) {
        __m256i p = _mm256_maddubs_epi16(wv[j], x[j]);
        if (five ? j >= 4 : (chains == 2 && (j & 1))) b = _mm256_add_epi16(b, p);
        else a = _mm256_add_epi16(a, p);
    }
    __m256i sum = five ? _mm256_add_epi32(_mm256_madd_epi16(a, ones), _mm256_madd_epi16(b, ones))
                       : _mm256_madd_epi16(_mm256_add_epi16(a, b), ones);
    return KFN(offsets_off)(type, sum, q6, xb);
#endif
}

/* Each tile block fetches the same block PREFETCH_TILES tiles ahead into L2 when several tokens share the call
 * or the matrix is large (the hardware prefetcher alone falls behind there; see bench/results for the A/B). */
#define PREFETCH_TILES 8

/* the rows' scale dw and min mw of block s of a tile block (d, dmin: its super-block's, for the K-quants) */
KINLINE void KFN(block_scales)(const int type, const uint8_t *blk, int s, __m256 d, __m256 dmin, __m256 *dw,
                               __m256 *mw) {
    *dw = d;
    *mw = d;
    if (type == WT_Q4_K || type == WT_Q5_K) {
        const uint8_t *sm = blk + tile_scales_off(type, s);
        *dw = _mm256_mul_ps(d, KFN(load_u8x8_ps)(sm));
        *mw = _mm256_xor_ps(_mm256_mul_ps(dmin, KFN(load_u8x8_ps)(sm + 8)), _mm256_set1_ps(-0.0f));
    } else if (type == WT_Q4_1 || type == WT_Q5_1) {
        *mw = KFN(load_f16x8)(blk + 16);
    } else if (type == WT_Q2_K) {
        *mw = _mm256_xor_ps(dmin, _mm256_set1_ps(-0.0f));
    }
}

/* one token's block: acc = fma(float(isum), dw * dx, acc), then the min term */
KINLINE __m256 KFN(accumulate)(const int type, __m256 acc, __m256i isum, __m256 dw, __m256 mw, const block_q8x *xb) {
    const int has_min = type == WT_Q4_1 || type == WT_Q5_1 || type == WT_Q4_K || type == WT_Q5_K;
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(dw, _mm256_set1_ps(xb->d)), acc);
    if (type == WT_Q4_1 || type == WT_Q5_1)   /* Q4_1's order since its first kernel: sum x times (m * dx) */
        acc = _mm256_fmadd_ps(_mm256_set1_ps((float)xb->isum), _mm256_mul_ps(mw, _mm256_set1_ps(xb->d)), acc);
    else if (has_min)
        acc = _mm256_fmadd_ps(mw, _mm256_set1_ps(xb->dsum), acc);
    return acc;
}

/* one token's block sum, accumulated; Q2_K's mins after (matmul.c's order) */
KINLINE __m256 KFN(isum_acc)(const int type, __m256 acc, __m256i isum, __m256 dw, __m256 mw, const KFN(q6scales) *q6,
                             const block_q8x *xb) {
    acc = KFN(accumulate)(type, acc, isum, dw, mw, xb);
    if (type == WT_Q2_K) {
        __m256i imin = _mm256_madd_epi16(q6->pair, KFN(bcast4)(xb->hsum));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(imin), _mm256_mul_ps(mw, _mm256_set1_ps(xb->d)), acc);
    }
    return acc;
}

/* one token's block from its weight vectors */
KINLINE __m256 KFN(block_acc)(const int type, const int chains, __m256 acc, const __m256i wv[8], __m256 dw,
                              __m256 mw, const KFN(q6scales) *q6, const block_q8x *xb) {
    return KFN(isum_acc)(type, acc, KFN(block_isum)(type, chains, wv, xb, q6), dw, mw, q6, xb);
}

#include "qlanes.h"

/* The types that keep their GGUF blocks (iq_lanes.h): sub-block s of the 8 rows expanded to wv[0..7] (signed), its
 * halves' scales into q6->sc16, in registers (qlanes.h: lane by lane, or for TQ1_0 row by row and transposed); and
 * the rows' d * factor */
KINLINE void KFN(load_lanes)(const int type, const uint8_t *blk, int s, __m256i wv[8], KFN(q6scales) *q6) {
    if (type == WT_TQ1_0) KFN(tq1_lanes)(blk, s, wv, q6);
    else if (type == WT_TQ2_0) KFN(tq2_lanes)(blk, s, wv, q6);
    else KFN(gather_lanes)(type, blk, s, wv, q6);
    if (KVNNI)   /* unsigned for dpbusd (tile.h's half_offset_corr takes it back) */
        for (int j = 0; j < 8; j++) wv[j] = _mm256_add_epi8(wv[j], _mm256_set1_epi8(LANES_VNNI_OFFSET));
}

/* the rows' d (f16, converted as load_f16x8 converts: exactly) times the type's factor */
KINLINE __m256 KFN(lane_dw)(const int type, const uint8_t *blk) {
    const size_t lb = lane_bytes(type);
    const __m128i h = _mm_setr_epi16((short)lane_d_bits(type, blk), (short)lane_d_bits(type, blk + lb),
                                     (short)lane_d_bits(type, blk + 2 * lb), (short)lane_d_bits(type, blk + 3 * lb),
                                     (short)lane_d_bits(type, blk + 4 * lb), (short)lane_d_bits(type, blk + 5 * lb),
                                     (short)lane_d_bits(type, blk + 6 * lb), (short)lane_d_bits(type, blk + 7 * lb));
    return _mm256_mul_ps(_mm256_cvtph_ps(h), _mm256_set1_ps(lane_factor(type)));
}

/* One block of a tile (all its sub-blocks) against ntok tokens: acc[k] += the block's share of token k's rows.
 * xb0: the block's first activation block of token 0; token k's follow nb32 blocks later. */
KINLINE void KFN(block_tokens)(const int type, const uint8_t *blk, const int nsub, const int chains, const int ntok,
                               const block_q8x *xb0, int nb32, __m256 *acc) {
    if (type_keeps_blocks(type)) {
        const __m256 dw = KFN(lane_dw)(type, blk);
        for (int s = 0; s < nsub; s++) {
            __m256i wv[8];
            KFN(q6scales) q6;
            KFN(load_lanes)(type, blk, s, wv, &q6);
            for (int k = 0; k < ntok; k++)
                acc[k] = KFN(block_acc)(type, chains, acc[k], wv, dw, dw, &q6, xb0 + s + (size_t)k * nb32);
        }
        return;
    }
    __m256 d = KFN(load_d)(type, blk), dmin = d;
    if (type == WT_Q4_K || type == WT_Q5_K || type == WT_Q2_K) dmin = KFN(load_f16x8)(blk + 16);
    for (int s = 0; s < nsub; s++) {
        __m256i wv[8];
        KFN(load_wv)(type, blk, s, wv);
        __m256 dw, mw;
        KFN(block_scales)(type, blk, s, d, dmin, &dw, &mw);
        KFN(q6scales) q6;
        if (KFN(has_int_scales)(type)) KFN(load_q6scales)(type, blk + tile_scales_off(type, s), &q6);
        for (int k = 0; k < ntok; k++)
            acc[k] = KFN(block_acc)(type, chains, acc[k], wv, dw, mw, &q6, xb0 + s + (size_t)k * nb32);
    }
}

/* one token's 8 rows into y (taken by value, so that the accumulators can stay in registers) */
KINLINE void KFN(store)(__m256 acc, float *o, int nrows, int accumulate) {
    if (nrows == TILE_ROWS) {
        _mm256_storeu_ps(o, accumulate ? _mm256_add_ps(_mm256_loadu_ps(o), acc) : acc);
    } else {
        float tmp[8];
        _mm256_storeu_ps(tmp, acc);
        for (int r = 0; r < nrows; r++) o[r] = accumulate ? o[r] + tmp[r] : tmp[r];
    }
}

KINLINE void KFN(tile)(const int type, const int ntok, const uint8_t *base, int nb, const block_q8x *xq, int nb32,
                       float *y, int ldy, int ycol, int nrows, int accumulate, int prefetch) {
    const int nsub = type_is_k(type) ? 8 : 1, chains = ntok == 1 ? 2 : 1;
    const size_t bb = tile_block_bytes(type);
    __m256 acc[8];
    for (int k = 0; k < ntok; k++) acc[k] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = base + (size_t)b * bb;
        if (ntok > 1 || prefetch)
            for (size_t o = 0; o < bb; o += 64) __builtin_prefetch(blk + (size_t)PREFETCH_TILES * nb * bb + o, 0, 2);
        KFN(block_tokens)(type, blk, nsub, chains, ntok, xq + (size_t)b * nsub, nb32, acc);
    }
    for (int k = 0; k < ntok; k++) KFN(store)(acc[k], y + (size_t)k * ldy + ycol, nrows, accumulate);
}

/* MXFP4's decode group: tiles_one's work with each block's activation broadcasts shared by the group's tiles (the
 * kernel is bound by its vector instructions, not by memory: nibbles, a byte shuffle per 32 codes, then the products)
 * and each tile's codes unpacked four values at a time beside their products. Per tile, block_isum's MXFP4 sums (AVX2:
 * the same int16 chains, then offsets_off's correction; VNNI: dpbusd from the correction) and accumulate(): the same
 * bits. */
KINLINE void KFN(mxfp4_tiles_one)(const int ntiles, const uint8_t *base, size_t tile_bytes, int nb,
                                  const block_q8x *xq, float *y, int nrows_last, int accumulate, int prefetch) {
    const size_t bb = tile_block_bytes(WT_MXFP4);
    const __m256i m4 = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
    const __m256i book = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)MXFP4_PLUS_OFFSET));
    const decode_prefetch_t pf = decode_prefetch_plan(base, tile_bytes, ntiles, bb, prefetch);
    __m256 acc[QGROUP_TILES];
    for (int i = 0; i < ntiles; i++) acc[i] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk0 = base + (size_t)b * bb;
        const block_q8x *xb = xq + b;
        /* offsets_off's correction, broadcast once for the group's tiles (offsets_off per tile: 2-4% slower) */
        const __m256i corr = _mm256_set1_epi32(offset_corr(WT_MXFP4, xb));
        __m256i lo[QGROUP_TILES], hi[QGROUP_TILES];
        decode_prefetch_step(&pf, b, (int)((ntiles * bb + 63) / 64), (int)((bb + 63) / 64));
        for (int p = 0; p < 4; p++) {   /* values 4p..4p+3 (low nibbles) and 16 + 4p.. (high) of every row */
            const __m256i xl = KFN(bcast4)(xb->qs + 4 * p), xh = KFN(bcast4)(xb->qs + 16 + 4 * p);
            for (int i = 0; i < ntiles; i++) {
                const __m256i v = _mm256_loadu_si256((const __m256i *)(blk0 + i * tile_bytes + 8 + 32 * p));
                const __m256i wl = _mm256_shuffle_epi8(book, _mm256_and_si256(v, m4));
                const __m256i wh = _mm256_shuffle_epi8(book, _mm256_and_si256(_mm256_srli_epi16(v, 4), m4));
#if KVNNI
                lo[i] = DPBUSD(p ? lo[i] : corr, wl, xl);
                hi[i] = DPBUSD(p ? hi[i] : _mm256_setzero_si256(), wh, xh);
#else
                const __m256i pl = _mm256_maddubs_epi16(wl, xl), ph = _mm256_maddubs_epi16(wh, xh);
                lo[i] = p ? _mm256_add_epi16(lo[i], pl) : pl;
                hi[i] = p ? _mm256_add_epi16(hi[i], ph) : ph;
#endif
            }
        }
        for (int i = 0; i < ntiles; i++) {
#if KVNNI
            const __m256i sum = _mm256_add_epi32(lo[i], hi[i]);
            (void)ones;
#else
            const __m256i sum = _mm256_add_epi32(_mm256_add_epi32(_mm256_madd_epi16(lo[i], ones),
                                                                  _mm256_madd_epi16(hi[i], ones)), corr);
#endif
            const __m256 dw = KFN(load_d)(WT_MXFP4, blk0 + i * tile_bytes);
            acc[i] = KFN(accumulate)(WT_MXFP4, acc[i], sum, dw, dw, xb);
        }
    }
    for (int i = 0; i < ntiles; i++)
        KFN(store)(acc[i], y + TILE_ROWS * i, i == ntiles - 1 ? nrows_last : TILE_ROWS, accumulate);
}

/* One token (a decode step) against `ntiles` adjacent tiles of one segment, block by block in lockstep: each
 * thread then streams `ntiles` regions of the weight at once instead of one, which keeps more of them in flight for
 * the hardware prefetcher (a single stream reached half the read bandwidth: bench/results/decode_q4k.md), and the
 * tiles' independent accumulator chains overlap. Per row the operations are KFN(tile)'s: the same bits.
 * y: the first tile's row 0; tile i's rows follow at y + 8 i, the last tile's nrows_last of them. */
KINLINE void KFN(tiles_one)(const int type, const int ntiles, const uint8_t *base, size_t tile_bytes, int nb,
                            const block_q8x *xq, float *y, int nrows_last, int accumulate, int prefetch) {
    if (type == WT_MXFP4) {
        KFN(mxfp4_tiles_one)(ntiles, base, tile_bytes, nb, xq, y, nrows_last, accumulate, prefetch);
        return;
    }
    const int nsub = type_is_k(type) ? 8 : 1;
    const size_t bb = tile_block_bytes(type);
    __m256 acc[4];
    /* tile.h's decode prefetch, a step per block, each tile's piece beside its arithmetic (not all in one burst) */
    const decode_prefetch_t pf = decode_prefetch_plan(base, tile_bytes, ntiles, bb, prefetch);
    for (int i = 0; i < ntiles; i++) acc[i] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk0 = base + (size_t)b * bb;
        for (int i = 0; i < ntiles; i++) {
            decode_prefetch_tile(&pf, b, i, (int)((bb + 63) / 64));
            KFN(block_tokens)(type, blk0 + i * tile_bytes, nsub, 2, 1, xq + (size_t)b * nsub, 0, acc + i);
        }
    }
    for (int i = 0; i < ntiles; i++)
        KFN(store)(acc[i], y + TILE_ROWS * i, i == ntiles - 1 ? nrows_last : TILE_ROWS, accumulate);
}

/* Many tokens (a prefill) against one tile: the tile's blocks are unpacked once into `prepared` blocks (weight
 * vectors, scales) on the stack, then every group of tokens reads them: the unpacking (nibbles, high bits, the
 * K-quants' scale products) is no longer repeated for every group of KNT tokens. Same operations per token and
 * block as KFN(tile): the same bits. */
typedef struct { __m256i wv[8]; __m256 dw, mw; KFN(q6scales) q6; } KFN(prepared);

KINLINE void KFN(prepare_tile)(const int type, const uint8_t *base, int nb, KFN(prepared) *p) {
    const int nsub = type_is_k(type) ? 8 : 1;
    const size_t bb = tile_block_bytes(type);
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = base + (size_t)b * bb;
        if (type_keeps_blocks(type)) {
            const __m256 dw = KFN(lane_dw)(type, blk);
            for (int s = 0; s < nsub; s++, p++) {
                KFN(load_lanes)(type, blk, s, p->wv, &p->q6);
                p->dw = p->mw = dw;
            }
            continue;
        }
        __m256 d = KFN(load_d)(type, blk), dmin = d;
        if (type == WT_Q4_K || type == WT_Q5_K || type == WT_Q2_K) dmin = KFN(load_f16x8)(blk + 16);
        for (int s = 0; s < nsub; s++, p++) {
            KFN(load_wv)(type, blk, s, p->wv);
            KFN(block_scales)(type, blk, s, d, dmin, &p->dw, &p->mw);
            if (KFN(has_int_scales)(type)) KFN(load_q6scales)(type, blk + tile_scales_off(type, s), &p->q6);
        }
    }
}

KINLINE void KFN(prepared_tokens)(const int type, const int ntok, const KFN(prepared) *p, int nb32,
                                  const block_q8x *xq, float *y, int ldy, int ycol, int nrows, int accumulate,
                                  const batch_prefetch_t *pf) {
    const int chains = ntok == 1 ? 2 : 1;
    __m256 acc[8];
    for (int k = 0; k < ntok; k++) acc[k] = _mm256_setzero_ps();
    for (int b = 0; b < nb32; b++, p++) {
        batch_prefetch_step(pf, b);
        for (int k = 0; k < ntok; k++)
            acc[k] = KFN(block_acc)(type, chains, acc[k], p->wv, p->dw, p->mw, &p->q6, xq + (size_t)k * nb32 + b);
    }
    for (int k = 0; k < ntok; k++) KFN(store)(acc[k], y + (size_t)k * ldy + ycol, nrows, accumulate);
}

#if !KVNNI
/* Two adjacent tiles' prepared blocks against KNT_PAIR tokens at once, for the types whose block sum is a fold of
 * its 8 products maddubs(wv[j], x[j]) (KPAIR_TYPE): each 4 values' weight vectors of both tiles and each token's 4
 * activation bytes are loaded once for the 2 x KNT_PAIR products they meet (one tile alone reloads its weights every
 * KNT tokens and broadcasts each activation once per tile; bench/results/prefill_pairs_avx2.md counts both). Per tile
 * and token the block sum is block_isum's integer and the float steps are accumulate()'s: the same bits. y: tile a's
 * rows at ycol, tile b's 8 columns further. KPAIR_TYPE: the types that gain from it (the Q5 types, Q3_K and MXFP4,
 * in int32 per product or in int16 four at a time, were no faster: bench/results/prefill_pairs_avx2.md). */
#define KPAIR_TYPE(type) \
    ((type) == WT_Q4_0 || (type) == WT_Q4_1 || (type) == WT_Q4_K || (type) == WT_Q6_K || (type) == WT_Q2_K)
/* the 4-bit types' 8 products add up in int16 (8 * 2 * 15 * 127 < 2^15); Q6_K's go into int32 two at a time
 * (pair_step), times their half's scale; Q2_K's in int16 four at a time, then into int32 times the half's scale */
KINLINE int KFN(pair_int16)(const int type) { return type == WT_Q4_0 || type == WT_Q4_1 || type == WT_Q4_K; }
/* tokens a call: KNT_PAIR, or 2 for Q2_K, which keeps two running sums per tile and token */
KINLINE int KFN(pair_ntok)(const int type) { return type == WT_Q2_K ? 2 : KNT_PAIR; }

/* products a fold takes: Q6_K's two, added in int16 first (2 * 2 * 63 * 127 < 2^15) */
KINLINE int KFN(pair_step)(const int type) { return type == WT_Q6_K ? 2 : 1; }

/* product j (Q6_K: products j and j + 1 added) into the running sums (s16: int16, s32: int32) */
KINLINE void KFN(pair_fold)(const int type, __m256i *s16, __m256i *s32, __m256i p, int j, const KFN(prepared) *w) {
    if (KFN(pair_int16)(type)) {
        *s16 = _mm256_add_epi16(*s16, p);
    } else if (type == WT_Q6_K) {
        *s32 = _mm256_add_epi32(*s32, _mm256_madd_epi16(p, w->q6.sc16[j >> 2]));
    } else {
        *s16 = (j & 3) == 0 ? p : _mm256_add_epi16(*s16, p);
        if ((j & 3) == 3) *s32 = _mm256_add_epi32(*s32, _mm256_madd_epi16(*s16, w->q6.sc16[j >> 2]));
    }
}

/* the running sums as block_isum's, with its type's offsets taken off */
KINLINE __m256i KFN(pair_finish)(const int type, __m256i s16, __m256i sum, const KFN(prepared) *w,
                                 const block_q8x *xb) {
    if (KFN(pair_int16)(type)) sum = _mm256_madd_epi16(s16, _mm256_set1_epi16(1));
    return KFN(offsets_off)(type, sum, &w->q6, xb);
}

KINLINE void KFN(pair_tokens)(const int type, const int ntok, const KFN(prepared) *pa, const KFN(prepared) *pb,
                              int nb32, const block_q8x *xq, float *y, int ldy, int ycol, int nrows_b, int accumulate,
                              const batch_prefetch_t *pf) {
    const int step = KFN(pair_step)(type);
    __m256 acc_a[KNT_PAIR], acc_b[KNT_PAIR];
    for (int k = 0; k < ntok; k++) acc_a[k] = acc_b[k] = _mm256_setzero_ps();
    for (int b = 0; b < nb32; b++, pa++, pb++) {
        batch_prefetch_step(pf, b);
        __m256i a16[KNT_PAIR], b16[KNT_PAIR], a32[KNT_PAIR], b32[KNT_PAIR];
        for (int k = 0; k < ntok; k++) a16[k] = b16[k] = a32[k] = b32[k] = _mm256_setzero_si256();
        for (int j = 0; j < 8; j += step) {
            const __m256i wa = pa->wv[j], wb = pb->wv[j], wa2 = pa->wv[j + step - 1], wb2 = pb->wv[j + step - 1];
            for (int k = 0; k < ntok; k++) {
                const int8_t *xk = xq[(size_t)k * nb32 + b].qs + 4 * j;
                const __m256i x = KFN(bcast4)(xk);
                __m256i sa = _mm256_maddubs_epi16(wa, x), sb = _mm256_maddubs_epi16(wb, x);
                if (step == 2) {
                    const __m256i x2 = KFN(bcast4)(xk + 4);
                    sa = _mm256_add_epi16(sa, _mm256_maddubs_epi16(wa2, x2));
                    sb = _mm256_add_epi16(sb, _mm256_maddubs_epi16(wb2, x2));
                }
                KFN(pair_fold)(type, &a16[k], &a32[k], sa, j, pa);
                KFN(pair_fold)(type, &b16[k], &b32[k], sb, j, pb);
                /* keeps the sums in registers, added as they come: left to itself the compiler computes all the
                 * products first and spills them */
                if (KFN(pair_int16)(type)) __asm__("" : "+x"(a16[k]), "+x"(b16[k]));
                else __asm__("" : "+x"(a32[k]), "+x"(b32[k]));
            }
        }
        for (int k = 0; k < ntok; k++) {
            const block_q8x *xb = xq + (size_t)k * nb32 + b;
            acc_a[k] = KFN(isum_acc)(type, acc_a[k], KFN(pair_finish)(type, a16[k], a32[k], pa, xb), pa->dw, pa->mw,
                                     &pa->q6, xb);
            acc_b[k] = KFN(isum_acc)(type, acc_b[k], KFN(pair_finish)(type, b16[k], b32[k], pb, xb), pb->dw, pb->mw,
                                     &pb->q6, xb);
        }
    }
    for (int k = 0; k < ntok; k++) {
        KFN(store)(acc_a[k], y + (size_t)k * ldy + ycol, TILE_ROWS, accumulate);
        KFN(store)(acc_b[k], y + (size_t)k * ldy + ycol + TILE_ROWS, nrows_b, accumulate);
    }
}
#endif

/* all ntok tokens against one prepared tile of nrows rows: KNT(type) at a time, then one by one; pf: the first pass's
 * prefetch */
KINLINE void KFN(prepared_all)(const int type, const KFN(prepared) *p, int nb32, int ntok, const block_q8x *xq,
                               float *y, int ldy, int ycol, int nrows, int accumulate, const batch_prefetch_t *pf) {
    int t = 0;
    for (; t + KNT(type) <= ntok; t += KNT(type), pf = NULL)
        KFN(prepared_tokens)(type, KNT(type), p, nb32, xq + (size_t)t * nb32, y + (size_t)t * ldy, ldy, ycol, nrows,
                             accumulate, pf);
    for (; t < ntok; t++, pf = NULL)
        KFN(prepared_tokens)(type, 1, p, nb32, xq + (size_t)t * nb32, y + (size_t)t * ldy, ldy, ycol, nrows,
                             accumulate, pf);
}

/* the batch kernel (tile.h's qbatch_fn): on AVX2, KPAIR_TYPE's pairs of tiles KNT_PAIR tokens at a time; everything
 * else tile by tile (VNNI's dpbusd takes a product in one instruction: no broadcast to share). Each call prefetches the
 * two tiles after its own (the next call's, where the caller goes on in the segment). */
KINLINE void KFN(batch)(const int type, const uint8_t *ta, const uint8_t *tb, int nb, const block_q8x *xq, int nb32,
                        int ntok, float *y, int ldy, int ycol, int nrows, int accumulate) {
    const size_t tile_bytes = (size_t)nb * tile_block_bytes(type);
    const batch_prefetch_t next = batch_prefetch_plan((tb ? tb : ta) + tile_bytes, 2 * tile_bytes, nb32);
    KFN(prepared) p[nb32];
    KFN(prepare_tile)(type, ta, nb, p);
    if (!tb) {
        KFN(prepared_all)(type, p, nb32, ntok, xq, y, ldy, ycol, nrows, accumulate, &next);
        return;
    }
#if !KVNNI
    if (KPAIR_TYPE(type)) {
        const int n = KFN(pair_ntok)(type);
        KFN(prepared) q[nb32];
        KFN(prepare_tile)(type, tb, nb, q);
        for (int t = 0; t < ntok; t += n) {   /* n tokens a call, the last call the rest */
            const block_q8x *xt = xq + (size_t)t * nb32;
            float *yt = y + (size_t)t * ldy;
            const batch_prefetch_t *pf = t == 0 ? &next : NULL;
            switch (ntok - t < n ? ntok - t : n) {
            case 1: KFN(pair_tokens)(type, 1, p, q, nb32, xt, yt, ldy, ycol, nrows, accumulate, pf); break;
            case 2: KFN(pair_tokens)(type, 2, p, q, nb32, xt, yt, ldy, ycol, nrows, accumulate, pf); break;
            case 3: KFN(pair_tokens)(type, 3, p, q, nb32, xt, yt, ldy, ycol, nrows, accumulate, pf); break;
            default: KFN(pair_tokens)(type, KNT_PAIR, p, q, nb32, xt, yt, ldy, ycol, nrows, accumulate, pf);
            }
        }
        return;
    }
#endif
    const batch_prefetch_t second = batch_prefetch_plan(tb, tile_bytes, nb32);
    KFN(prepared_all)(type, p, nb32, ntok, xq, y, ldy, ycol, TILE_ROWS, accumulate, &second);
    KFN(prepare_tile)(type, tb, nb, p);
    KFN(prepared_all)(type, p, nb32, ntok, xq, y, ldy, ycol + TILE_ROWS, nrows, accumulate, &next);
}

/* the kernels of one type: up to KNT(type) tokens per call (fewer: three at a time, each token's operations the
 * same), the batch and the decode group. Each token count is a function of its own: inlined together into one, the
 * KNT-token pass lost its registers. */
#define KTOKENS(name, TYPE, SUFFIX, N)                                                                           \
    static __attribute__((noinline)) void KFN(name##_t##SUFFIX)(const uint8_t *base, int nb, const block_q8x *xq, \
                                                                int nb32, float *y, int ldy, int ycol, int nrows, \
                                                                int accumulate, int prefetch) {                   \
        KFN(tile)(TYPE, N, base, nb, xq, nb32, y, ldy, ycol, nrows, accumulate, prefetch);                      \
    }
#define KDEFINE(name, TYPE)                                                                                      \
    KTOKENS(name, TYPE, 1, 1)                                                                                    \
    KTOKENS(name, TYPE, 2, 2)                                                                                    \
    KTOKENS(name, TYPE, 3, 3)                                                                                    \
    KTOKENS(name, TYPE, all, KNT(TYPE))                                                                          \
    static void KFN(name##_n)(const uint8_t *base, int nb, const block_q8x *xq, int nb32, int ntok, float *y,    \
                              int ldy, int ycol, int nrows, int accumulate, int prefetch) {                      \
        if (ntok == KNT(TYPE)) {                                                                                 \
            KFN(name##_tall)(base, nb, xq, nb32, y, ldy, ycol, nrows, accumulate, prefetch);                     \
            return;                                                                                              \
        }                                                                                                        \
        for (int i = 0, n; i < ntok; i += n, xq += (size_t)n * nb32, y += (size_t)n * ldy) {                     \
            n = ntok - i < 3 ? ntok - i : 3;                                                                     \
            if (n == 1) KFN(name##_t1)(base, nb, xq, nb32, y, ldy, ycol, nrows, accumulate, prefetch);           \
            else if (n == 2) KFN(name##_t2)(base, nb, xq, nb32, y, ldy, ycol, nrows, accumulate, prefetch);      \
            else KFN(name##_t3)(base, nb, xq, nb32, y, ldy, ycol, nrows, accumulate, prefetch);                  \
        }                                                                                                        \
    }                                                                                                            \
    static void KFN(name##_g)(const uint8_t *base, size_t tile_bytes, int ntiles, int nb, const block_q8x *xq,   \
                              float *y, int nrows_last, int accumulate, int prefetch) {                         \
        switch (ntiles) {                                                                                        \
        case 4: KFN(tiles_one)(TYPE, 4, base, tile_bytes, nb, xq, y, nrows_last, accumulate, prefetch); break;   \
        case 3: KFN(tiles_one)(TYPE, 3, base, tile_bytes, nb, xq, y, nrows_last, accumulate, prefetch); break;   \
        case 2: KFN(tiles_one)(TYPE, 2, base, tile_bytes, nb, xq, y, nrows_last, accumulate, prefetch); break;   \
        default: KFN(tiles_one)(TYPE, 1, base, tile_bytes, nb, xq, y, nrows_last, accumulate, prefetch);         \
        }                                                                                                        \
    }                                                                                                            \
    static void KFN(name##_b)(const uint8_t *ta, const uint8_t *tb, int nb, const block_q8x *xq, int nb32,      \
                              int ntok, float *y, int ldy, int ycol, int nrows, int accumulate) {                \
        KFN(batch)(TYPE, ta, tb, nb, xq, nb32, ntok, y, ldy, ycol, nrows, accumulate);                           \
    }
KDEFINE(q4_0, WT_Q4_0)
KDEFINE(q4_1, WT_Q4_1)
KDEFINE(q5_0, WT_Q5_0)
KDEFINE(q5_1, WT_Q5_1)
KDEFINE(q8_0, WT_Q8_0)
KDEFINE(q4_k, WT_Q4_K)
KDEFINE(q5_k, WT_Q5_K)
KDEFINE(q6_k, WT_Q6_K)
KDEFINE(q3_k, WT_Q3_K)
KDEFINE(q2_k, WT_Q2_K)
KDEFINE(iq4_nl, WT_IQ4_NL)
KDEFINE(iq4_xs, WT_IQ4_XS)
KDEFINE(mxfp4, WT_MXFP4)
KDEFINE(iq2_xxs, WT_IQ2_XXS)
KDEFINE(iq2_xs, WT_IQ2_XS)
KDEFINE(iq2_s, WT_IQ2_S)
KDEFINE(iq3_xxs, WT_IQ3_XXS)
KDEFINE(iq3_s, WT_IQ3_S)
KDEFINE(iq1_s, WT_IQ1_S)
KDEFINE(iq1_m, WT_IQ1_M)
KDEFINE(tq1_0, WT_TQ1_0)
KDEFINE(tq2_0, WT_TQ2_0)
#undef KDEFINE

/* each type's kernels of this path, for its row of the type-traits table (type_traits.c): qtile_<type>_<path>.
 * KBATCH(type): whether the type's prefill unpacks each tile once (the types whose unpacking costs ALU work);
 * KBATCH_MIN(type): from how many tokens: two for AVX2's pairs of tiles, which take any count up to KNT_PAIR (a decode
 * step of a few sequences shares each tile's unpacking and its prefetch), else two full calls of the tile kernel */
#if KVNNI
#define KBATCH_MIN(type) (2 * KNT(type))
#else
#define KBATCH_MIN(type) (KPAIR_TYPE(type) ? KNT(type) + 1 : 2 * KNT(type))
#endif
#define KENTRY(name, TYPE) \
    const qkernel_t KCAT(qtile_##name, KSUFFIX) = \
        {KNT(TYPE), KFN(name##_n), KBATCH(TYPE) ? KFN(name##_b) : NULL, KFN(name##_g), \
         KBATCH_MIN(TYPE)};
KENTRY(q4_0, WT_Q4_0)
KENTRY(q4_1, WT_Q4_1)
KENTRY(q5_0, WT_Q5_0)
KENTRY(q5_1, WT_Q5_1)
KENTRY(q8_0, WT_Q8_0)
KENTRY(q4_k, WT_Q4_K)
KENTRY(q5_k, WT_Q5_K)
KENTRY(q6_k, WT_Q6_K)
KENTRY(q3_k, WT_Q3_K)
KENTRY(q2_k, WT_Q2_K)
KENTRY(iq4_nl, WT_IQ4_NL)
KENTRY(iq4_xs, WT_IQ4_XS)
KENTRY(mxfp4, WT_MXFP4)
KENTRY(iq2_xxs, WT_IQ2_XXS)
KENTRY(iq2_xs, WT_IQ2_XS)
KENTRY(iq2_s, WT_IQ2_S)
KENTRY(iq3_xxs, WT_IQ3_XXS)
KENTRY(iq3_s, WT_IQ3_S)
KENTRY(iq1_s, WT_IQ1_S)
KENTRY(iq1_m, WT_IQ1_M)
KENTRY(tq1_0, WT_TQ1_0)
KENTRY(tq2_0, WT_TQ2_0)
#undef KENTRY

#ifdef KLANES_EXPORT
/* the tile blocks of the types that keep their GGUF blocks, for the zmm pair kernels (tile.h's lanes_block_t): this
 * path's own unpacking, so the pair kernels' sums are the tile kernels' */
KINLINE void KFN(lanes_block_typed)(const int type, const uint8_t *blk, lanes_block_t *o) {
    _mm256_storeu_ps(o->dw, KFN(lane_dw)(type, blk));
    for (int s = 0; s < 8; s++) {
        __m256i wv[8];
        KFN(q6scales) q6;
        KFN(load_lanes)(type, blk, s, wv, &q6);
        for (int j = 0; j < 8; j++) _mm256_storeu_si256((__m256i *)o->wv[s][j], wv[j]);
        _mm256_storeu_si256((__m256i *)o->m[s][0], q6.sc32[0]);
        _mm256_storeu_si256((__m256i *)o->m[s][1], q6.sc32[1]);
    }
}
#define KLANES(name, TYPE) \
    void KCAT(lanes_##name, KSUFFIX)(const uint8_t *blk, lanes_block_t *o) { KFN(lanes_block_typed)(TYPE, blk, o); }
KLANES(iq2_xxs, WT_IQ2_XXS)
KLANES(iq2_xs, WT_IQ2_XS)
KLANES(iq2_s, WT_IQ2_S)
KLANES(iq3_xxs, WT_IQ3_XXS)
KLANES(iq3_s, WT_IQ3_S)
KLANES(iq1_s, WT_IQ1_S)
KLANES(iq1_m, WT_IQ1_M)
KLANES(tq1_0, WT_TQ1_0)
KLANES(tq2_0, WT_TQ2_0)
#undef KLANES
#endif
#undef KTOKENS
#undef KBATCH_MIN
#undef KPAIR_TYPE
