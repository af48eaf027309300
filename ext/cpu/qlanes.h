/* The codebook types' weight vectors in ymm registers (included by qtile.h, once per path, with its KFN names):
 * wv[0..7] and the halves' scales exactly as iq_lanes.h's lane_unpack gives them (the scalar definition).
 * IQ3_S, IQ3_XXS, IQ2_S, IQ2_XS, IQ2_XXS, IQ1_S and IQ1_M go lane by lane (gather_lanes): the grid entries of the 8
 * rows' 32-value sub-block are looked up (iq_grids.c) one row at a time (lane r reads row r's GGUF block,
 * lane_bytes(type) further on): an IQ3 entry (4 values) straight into its lane, an IQ2 or IQ1 entry (8 values, a
 * 64-bit word) split into the lanes' low and high 4 values with two shuffles; the rows' sign and scale words are put
 * together lane by lane and their sign bits spread over the bytes they sign. TQ2_0 and TQ1_0, whose 32 values of a
 * row lie in one run of bytes, go row by row: a row's values in one vector, then the 8 rows transposed into the
 * lanes. */

/* AMD's cores run an 8-lane vpgatherdd slower than 8 scalar loads put together with inserts (bench/grid_lookup.c),
 * so the lanes below are filled from scalar loads, and the grid indices come from each row's own bytes with scalar
 * loads rather than from a vector of the 8 lanes' indices stored and read back (IQ3_S's too, whose ninth bit lies in
 * another byte: put together in a vector, a row's 8 at a time, they were slower). */
KINLINE __m256i KFN(set8)(uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t a4, uint32_t a5, uint32_t a6,
                          uint32_t a7) {
    __m128i lo = _mm_cvtsi32_si128((int)a0), hi = _mm_cvtsi32_si128((int)a4);
    lo = _mm_insert_epi32(lo, (int)a1, 1);
    hi = _mm_insert_epi32(hi, (int)a5, 1);
    lo = _mm_insert_epi32(lo, (int)a2, 2);
    hi = _mm_insert_epi32(hi, (int)a6, 2);
    lo = _mm_insert_epi32(lo, (int)a3, 3);
    hi = _mm_insert_epi32(hi, (int)a7, 3);
    return _mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1);
}

KINLINE uint32_t KFN(word_at)(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }

/* the 32-bit words at p + r * lane_bytes(type) for the 8 rows r (unaligned: byte offsets) */
KINLINE __m256i KFN(gather_rows)(const int type, const uint8_t *p) {
    const size_t lb = lane_bytes(type);
    return KFN(set8)(KFN(word_at)(p), KFN(word_at)(p + lb), KFN(word_at)(p + 2 * lb), KFN(word_at)(p + 3 * lb),
                     KFN(word_at)(p + 4 * lb), KFN(word_at)(p + 5 * lb), KFN(word_at)(p + 6 * lb),
                     KFN(word_at)(p + 7 * lb));
}

/* 8-byte words e0..e7 (lane r: e_r): their low words into *lo, their high words into *hi */
KINLINE void KFN(split64)(uint64_t e0, uint64_t e1, uint64_t e2, uint64_t e3, uint64_t e4, uint64_t e5, uint64_t e6,
                          uint64_t e7, __m256i *lo, __m256i *hi) {
    /* a: rows 0, 1 | 4, 5, b: rows 2, 3 | 6, 7; shuffle_ps takes words 0, 2 (or 1, 3) of a then b per 128-bit half:
     * rows 0..3 | 4..7 */
    const __m256 a = _mm256_castsi256_ps(_mm256_set_epi64x((long long)e5, (long long)e4, (long long)e1,
                                                           (long long)e0));
    const __m256 b = _mm256_castsi256_ps(_mm256_set_epi64x((long long)e7, (long long)e6, (long long)e3,
                                                           (long long)e2));
    *lo = _mm256_castps_si256(_mm256_shuffle_ps(a, b, 0x88));
    *hi = _mm256_castps_si256(_mm256_shuffle_ps(a, b, 0xdd));
}

/* byte b of each lane's word copied into all 4 bytes of the lane */
KINLINE __m256i KFN(spread_byte)(__m256i v, int b) {
    const __m256i ctrl = _mm256_add_epi8(_mm256_setr_epi8(0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8, 8, 12, 12, 12, 12,
                                                          0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8, 8, 12, 12, 12, 12),
                                         _mm256_set1_epi8((char)b));
    return _mm256_shuffle_epi8(v, ctrl);
}

/* mag negated in the bytes whose sign bit is set: byte e of a lane takes bit e (hi: bit 4 + e) of the lane's byte
 * in sb (all 4 bytes of the lane hold it) */
KINLINE __m256i KFN(apply_signs)(__m256i mag, __m256i sb, int hi) {
    const __m256i bit = _mm256_set1_epi32(hi ? (int)0x80402010 : 0x08040201);
#ifdef __AVX512BW__   /* the AVX-512 VNNI path: the sign bits as a mask, one masked subtraction */
    return _mm256_mask_sub_epi8(mag, _mm256_test_epi8_mask(sb, bit), _mm256_setzero_si256(), mag);
#else
    __m256i m = _mm256_cmpeq_epi8(_mm256_and_si256(sb, bit), bit);
    return _mm256_sub_epi8(_mm256_xor_si256(mag, m), m);
#endif
}

/* 7 stored sign bits (low bits of k) and the eighth that makes their count even */
KINLINE __m256i KFN(ksign)(__m256i k) {
    __m256i t = _mm256_xor_si256(k, _mm256_srli_epi32(k, 4));
    t = _mm256_xor_si256(t, _mm256_srli_epi32(t, 2));
    t = _mm256_xor_si256(t, _mm256_srli_epi32(t, 1));
    return _mm256_or_si256(k, _mm256_slli_epi32(_mm256_and_si256(t, _mm256_set1_epi32(1)), 7));
}

/* per-lane scales m0 (first 16 values) and m1 into the q6scales form block_isum reads */
KINLINE void KFN(lane_scales)(__m256i m0, __m256i m1, KFN(q6scales) *q6) {
    q6->sc32[0] = m0;
    q6->sc32[1] = m1;
    q6->sc16[0] = _mm256_or_si256(m0, _mm256_slli_epi32(m0, 16));
    q6->sc16[1] = _mm256_or_si256(m1, _mm256_slli_epi32(m1, 16));
    q6->pair = _mm256_setzero_si256();
}

/* the grid index of values 8l..8l+7 of sub-block s in the GGUF block p (iq_lanes.h's lane_unpack), for the types of
 * 8-byte grid entries */
KINLINE uint32_t KFN(index8)(const int type, const uint8_t *p, int s, int l) {
    if (type == WT_IQ2_XXS) return p[2 + 8 * s + l];
    if (type == WT_IQ2_XS) return (p[2 + 8 * s + 2 * l] | (uint32_t)p[3 + 8 * s + 2 * l] << 8) & 511;
    if (type == WT_IQ2_S) return p[2 + 4 * s + l] | (uint32_t)((p[66 + s] >> (2 * l)) & 3) << 8;
    if (type == WT_IQ1_S) return p[2 + 4 * s + l] | ((p[34 + 2 * s] | (uint32_t)p[35 + 2 * s] << 8) >> (3 * l) & 7) << 8;
    return p[4 * s + l] | (uint32_t)((p[32 + 2 * s + l / 2] >> (4 * (l % 2))) & 7) << 8;   /* IQ1_M */
}

/* the 8 rows' entries of values 8l..8l+7 (grid g of 8-byte entries): low words into *lo, high words into *hi */
KINLINE void KFN(grid_rows64)(const int type, const uint64_t *g, const uint8_t *blk, int s, int l, __m256i *lo,
                              __m256i *hi) {
    const size_t lb = lane_bytes(type);
    KFN(split64)(g[KFN(index8)(type, blk, s, l)], g[KFN(index8)(type, blk + lb, s, l)],
                 g[KFN(index8)(type, blk + 2 * lb, s, l)], g[KFN(index8)(type, blk + 3 * lb, s, l)],
                 g[KFN(index8)(type, blk + 4 * lb, s, l)], g[KFN(index8)(type, blk + 5 * lb, s, l)],
                 g[KFN(index8)(type, blk + 6 * lb, s, l)], g[KFN(index8)(type, blk + 7 * lb, s, l)], lo, hi);
}

KINLINE void KFN(gather_lanes)(const int type, const uint8_t *blk, int s, __m256i wv[8], KFN(q6scales) *q6) {
    const __m256i one = _mm256_set1_epi32(1), f15 = _mm256_set1_epi32(15);
    if (type == WT_IQ2_XXS || type == WT_IQ3_XXS) {
        const int iq3 = type == WT_IQ3_XXS;
        const __m256i a = KFN(gather_rows)(type, blk + (iq3 ? 66 + 4 * s : 6 + 8 * s));   /* signs, scale << 28 */
        const size_t lb = lane_bytes(type);
        const uint8_t *q = blk + 2 + 8 * s;   /* row r's indices at q + r lb */
#pragma GCC unroll 4
        for (int l = 0; l < 4; l++) {
            __m256i k = _mm256_and_si256(_mm256_srli_epi32(a, 7 * l), _mm256_set1_epi32(127));
            __m256i sb = KFN(spread_byte)(KFN(ksign)(k), 0);
            __m256i lo, hi;
            if (iq3) {   /* entries 2l, 2l + 1 (values 8l..8l+3, 8l+4..8l+7): each row's straight into its lane */
#define IQ3XXS_LANES(j) KFN(set8)(IQ3XXS_GRID[q[j]], IQ3XXS_GRID[q[lb + (j)]], IQ3XXS_GRID[q[2 * lb + (j)]],       \
                                  IQ3XXS_GRID[q[3 * lb + (j)]], IQ3XXS_GRID[q[4 * lb + (j)]],                      \
                                  IQ3XXS_GRID[q[5 * lb + (j)]], IQ3XXS_GRID[q[6 * lb + (j)]],                      \
                                  IQ3XXS_GRID[q[7 * lb + (j)]])
                lo = IQ3XXS_LANES(2 * l);
                hi = IQ3XXS_LANES(2 * l + 1);
#undef IQ3XXS_LANES
            } else {
                KFN(grid_rows64)(type, IQ2XXS_GRID, blk, s, l, &lo, &hi);
            }
            wv[2 * l] = KFN(apply_signs)(lo, sb, 0);
            wv[2 * l + 1] = KFN(apply_signs)(hi, sb, 1);
        }
        __m256i m = _mm256_or_si256(_mm256_slli_epi32(_mm256_srli_epi32(a, 28), 1), one);
        KFN(lane_scales)(m, m, q6);
    } else if (type == WT_IQ2_XS) {
        const __m256i q01 = KFN(gather_rows)(type, blk + 2 + 8 * s), q23 = KFN(gather_rows)(type, blk + 6 + 8 * s);
#pragma GCC unroll 4
        for (int l = 0; l < 4; l++) {
            __m256i q = _mm256_and_si256(_mm256_srli_epi32(l < 2 ? q01 : q23, 16 * (l % 2)),
                                         _mm256_set1_epi32(0xffff));
            __m256i sb = KFN(spread_byte)(KFN(ksign)(_mm256_srli_epi32(q, 9)), 0);
            __m256i lo, hi;
            KFN(grid_rows64)(type, IQ2XS_GRID, blk, s, l, &lo, &hi);
            wv[2 * l] = KFN(apply_signs)(lo, sb, 0);
            wv[2 * l + 1] = KFN(apply_signs)(hi, sb, 1);
        }
        __m256i sc = _mm256_srli_epi32(KFN(gather_rows)(type, blk + 63 + s), 24);   /* the byte at 66 + s */
        KFN(lane_scales)(_mm256_or_si256(_mm256_slli_epi32(_mm256_and_si256(sc, f15), 1), one),
                         _mm256_or_si256(_mm256_slli_epi32(_mm256_srli_epi32(sc, 4), 1), one), q6);
    } else if (type == WT_IQ2_S) {
        const __m256i sg = KFN(gather_rows)(type, blk + 34 + 4 * s);
        const __m256i sc = _mm256_srli_epi32(KFN(gather_rows)(type, blk + 71 + s), 24);   /* the byte at 74 + s */
#pragma GCC unroll 4
        for (int l = 0; l < 4; l++) {
            __m256i sb = KFN(spread_byte)(sg, l), lo, hi;
            KFN(grid_rows64)(type, IQ2S_GRID, blk, s, l, &lo, &hi);
            wv[2 * l] = KFN(apply_signs)(lo, sb, 0);
            wv[2 * l + 1] = KFN(apply_signs)(hi, sb, 1);
        }
        KFN(lane_scales)(_mm256_or_si256(_mm256_slli_epi32(_mm256_and_si256(sc, f15), 1), one),
                         _mm256_or_si256(_mm256_slli_epi32(_mm256_srli_epi32(sc, 4), 1), one), q6);
    } else if (type == WT_IQ3_S) {   /* row by row: index j = qs byte j | bit j of the qh byte << 8 */
        const size_t lb = lane_bytes(type);
        const __m256i sg = KFN(gather_rows)(type, blk + 74 + 4 * s);
#define IQ3S_INDEX(r, j) (blk[(r) * lb + 2 + 8 * s + (j)] | ((uint32_t)blk[(r) * lb + 66 + s] << (8 - (j)) & 256))
#define IQ3S_LANES(j) KFN(set8)(IQ3S_GRID[IQ3S_INDEX(0, j)], IQ3S_GRID[IQ3S_INDEX(1, j)],                         \
                                IQ3S_GRID[IQ3S_INDEX(2, j)], IQ3S_GRID[IQ3S_INDEX(3, j)],                         \
                                IQ3S_GRID[IQ3S_INDEX(4, j)], IQ3S_GRID[IQ3S_INDEX(5, j)],                         \
                                IQ3S_GRID[IQ3S_INDEX(6, j)], IQ3S_GRID[IQ3S_INDEX(7, j)])
#pragma GCC unroll 4
        for (int l = 0; l < 4; l++) {   /* entries 2l, 2l + 1: values 8l..8l+3, 8l+4..8l+7 */
            const __m256i sb = KFN(spread_byte)(sg, l);
            wv[2 * l] = KFN(apply_signs)(IQ3S_LANES(2 * l), sb, 0);
            wv[2 * l + 1] = KFN(apply_signs)(IQ3S_LANES(2 * l + 1), sb, 1);
        }
#undef IQ3S_LANES
#undef IQ3S_INDEX
        __m256i sc = _mm256_srli_epi32(KFN(gather_rows)(type, blk + 103 + s / 2), 24);   /* the byte at 106 + s/2 */
        __m256i m = _mm256_and_si256(_mm256_srli_epi32(sc, 4 * (s % 2)), f15);
        m = _mm256_or_si256(_mm256_slli_epi32(m, 1), one);
        KFN(lane_scales)(m, m, q6);
    } else if (type == WT_IQ1_S) {   /* values 8 g +- 1 */
        const __m256i h = _mm256_and_si256(KFN(gather_rows)(type, blk + 34 + 2 * s), _mm256_set1_epi32(0xffff));
        const __m256i delta = _mm256_or_si256(_mm256_set1_epi8(1),   /* -1 in every byte where bit 15 is set */
                                              _mm256_cmpeq_epi32(_mm256_and_si256(h, _mm256_set1_epi32(0x8000)),
                                                                 _mm256_set1_epi32(0x8000)));
#pragma GCC unroll 4
        for (int l = 0; l < 4; l++) {
            __m256i half[2];
            KFN(grid_rows64)(type, IQ1S_GRID, blk, s, l, &half[0], &half[1]);
#pragma GCC unroll 2
            for (int k = 0; k < 2; k++) {
                __m256i g = _mm256_and_si256(_mm256_slli_epi16(half[k], 3), _mm256_set1_epi8((char)0xf8));
                wv[2 * l + k] = _mm256_add_epi8(g, delta);
            }
        }
        __m256i m = _mm256_or_si256(_mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(h, 12), _mm256_set1_epi32(7)),
                                                      1), one);
        KFN(lane_scales)(m, m, q6);
    } else if (type == WT_IQ1_M) {   /* values 8 g +- 1, the sign of the delta per 8 values */
        const __m256i h = KFN(gather_rows)(type, blk + 32 + 2 * s);   /* a nibble per 8 values: index bits, sign */
#pragma GCC unroll 4
        for (int l = 0; l < 4; l++) {
            const __m256i nib = _mm256_srli_epi32(h, 4 * l);
            const __m256i eight = _mm256_set1_epi32(8);
            const __m256i delta = _mm256_or_si256(_mm256_set1_epi8(1),
                                                  _mm256_cmpeq_epi32(_mm256_and_si256(nib, eight), eight));
            __m256i half[2];
            KFN(grid_rows64)(type, IQ1S_GRID, blk, s, l, &half[0], &half[1]);
#pragma GCC unroll 2
            for (int k = 0; k < 2; k++)
                wv[2 * l + k] = _mm256_add_epi8(_mm256_and_si256(_mm256_slli_epi16(half[k], 3),
                                                                 _mm256_set1_epi8((char)0xf8)), delta);
        }
        /* 3-bit scales of the halves in the word at 48 + 2 (s / 2) (bits 6 (s % 2) on) */
        const __m256i sc = _mm256_srli_epi32(KFN(gather_rows)(type, blk + 48 + 2 * (s / 2)), 6 * (s % 2));
        const __m256i seven = _mm256_set1_epi32(7);
        KFN(lane_scales)(_mm256_or_si256(_mm256_slli_epi32(_mm256_and_si256(sc, seven), 1), one),
                         _mm256_or_si256(_mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(sc, 3), seven), 1), one),
                         q6);
    }
}

/* wv[j] = dword j of rows[r] in lane r (an 8x8 transpose of 32-bit words) */
KINLINE void KFN(transpose_rows)(const __m256i rows[8], __m256i wv[8]) {
    __m256i t[8], u[8];
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_epi32(rows[2 * i], rows[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_epi32(rows[2 * i], rows[2 * i + 1]);
    }
    for (int i = 0; i < 2; i++) {   /* rows 4i..4i+3: words 0 | 4, 1 | 5, 2 | 6, 3 | 7 */
        u[4 * i] = _mm256_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 1] = _mm256_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 2] = _mm256_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        u[4 * i + 3] = _mm256_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    for (int j = 0; j < 4; j++) {
        wv[j] = _mm256_permute2x128_si256(u[j], u[4 + j], 0x20);
        wv[4 + j] = _mm256_permute2x128_si256(u[j], u[4 + j], 0x31);
    }
}

/* TQ1_0's sub-block s of one row: value t is base-3 digit `digit` of a byte (iq_lanes.h: byte t digit s for s < 5;
 * bytes 32 + t % 16, digits 2 (s - 5) + t / 16 for s = 5, 6; for s = 7 byte 32 + t digit 4, then byte 48 + (t - 16) %
 * 4 digit (t - 16) / 4): digit k of q is ((q 3^k mod 256) 3) >> 8, minus 1 for the value */
KINLINE __m256i KFN(tq1_row)(const uint8_t *b, int s, __m256i mul) {
    __m256i src;
    if (s < 5) {
        src = _mm256_loadu_si256((const __m256i *)b);
    } else {
        const __m128i mid = _mm_loadu_si128((const __m128i *)(b + 32));
        __m128i hi = mid;
        if (s == 7) hi = _mm_shuffle_epi8(_mm_cvtsi32_si128((int)KFN(word_at)(b + 48)),
                                          _mm_setr_epi8(0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3));
        src = _mm256_inserti128_si256(_mm256_castsi128_si256(mid), hi, 1);
    }
    const __m256i lo8 = _mm256_set1_epi16(0xff);
    __m256i e = _mm256_and_si256(_mm256_mullo_epi16(_mm256_and_si256(src, lo8), mul), lo8);
    __m256i o = _mm256_and_si256(_mm256_mullo_epi16(_mm256_srli_epi16(src, 8), mul), lo8);
    e = _mm256_srli_epi16(_mm256_add_epi16(_mm256_slli_epi16(e, 1), e), 8);
    o = _mm256_srli_epi16(_mm256_add_epi16(_mm256_slli_epi16(o, 1), o), 8);
    return _mm256_sub_epi8(_mm256_or_si256(e, _mm256_slli_epi16(o, 8)), _mm256_set1_epi8(1));
}

KINLINE void KFN(tq1_lanes)(const uint8_t *blk, int s, __m256i wv[8], KFN(q6scales) *q6) {
    /* the power of 3 per value: one per 16-bit lane, which holds an even and an odd byte of the same digit */
    static const uint16_t pow3[8] = {1, 3, 9, 27, 81, 1, 1, 1};
    __m256i mul;
    if (s < 5) mul = _mm256_set1_epi16((short)pow3[s]);
    else if (s < 7) mul = _mm256_inserti128_si256(_mm256_set1_epi16((short)pow3[2 * (s - 5)]),
                                                  _mm_set1_epi16((short)pow3[2 * (s - 5) + 1]), 1);
    else mul = _mm256_setr_epi16(81, 81, 81, 81, 81, 81, 81, 81, 1, 1, 3, 3, 9, 9, 27, 27);
    __m256i rows[8];
    const __m256i one = _mm256_set1_epi32(1);
    for (int r = 0; r < TILE_ROWS; r++) rows[r] = KFN(tq1_row)(blk + (size_t)r * lane_bytes(WT_TQ1_0), s, mul);
    KFN(transpose_rows)(rows, wv);
    KFN(lane_scales)(one, one, q6);
}

KINLINE void KFN(tq2_lanes)(const uint8_t *blk, int s, __m256i wv[8], KFN(q6scales) *q6) {
    /* value 32 s + i: bits 2 (s % 4) of qs[32 (s / 4) + i], minus 1 */
    __m256i rows[8];
    const __m256i one = _mm256_set1_epi32(1);
    for (int r = 0; r < TILE_ROWS; r++) {
        __m256i q = _mm256_loadu_si256((const __m256i *)(blk + (size_t)r * lane_bytes(WT_TQ2_0) + 32 * (s / 4)));
        q = _mm256_and_si256(_mm256_srli_epi16(q, 2 * (s % 4)), _mm256_set1_epi8(3));
        rows[r] = _mm256_sub_epi8(q, _mm256_set1_epi8(1));
    }
    KFN(transpose_rows)(rows, wv);
    KFN(lane_scales)(one, one, q6);
}
