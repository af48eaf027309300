/* The codebook types' weight vectors in ymm registers (included by qtile.h, once per path, with its KFN names): the
 * 8 rows' bytes of a 32-value sub-block are gathered lane by lane (lane r reads row r's GGUF block, lane_bytes(type)
 * further on), their grid entries gathered from iq_grids.c, and their sign bits spread over the bytes they sign:
 * wv[0..7] and the halves' scales exactly as iq_lanes.h's lane_unpack gives them (the scalar definition), without a
 * pass through memory. IQ3_S, IQ3_XXS, IQ2_S, IQ2_XS, IQ2_XXS, IQ1_S and TQ2_0; IQ1_M and TQ1_0 go through the
 * buffer of KFN(load_lanes). */

KINLINE int KFN(lanes_gathered)(const int type) {
    return type == WT_IQ3_S || type == WT_IQ3_XXS || type == WT_IQ2_S || type == WT_IQ2_XS || type == WT_IQ2_XXS ||
           type == WT_IQ1_S || type == WT_TQ2_0;
}

/* the 32-bit words at p + r * lane_bytes(type) for the 8 rows r (unaligned: byte offsets) */
KINLINE __m256i KFN(gather_rows)(const int type, const uint8_t *p) {
    const int lb = (int)lane_bytes(type);
    const __m256i off = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(lb));
    return _mm256_i32gather_epi32((const int *)(const void *)p, off, 1);
}

/* the 32-bit words idx of grid g (8-byte entries are two words: 2 i and 2 i + 1) */
KINLINE __m256i KFN(gather_grid)(const uint32_t *g, __m256i idx) {
    return _mm256_i32gather_epi32((const int *)g, idx, 4);
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
    __m256i m = _mm256_cmpeq_epi8(_mm256_and_si256(sb, bit), bit);
    return _mm256_sub_epi8(_mm256_xor_si256(mag, m), m);
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

KINLINE void KFN(gather_lanes)(const int type, const uint8_t *blk, int s, __m256i wv[8], KFN(q6scales) *q6) {
    const __m256i b8 = _mm256_set1_epi32(0xff), one = _mm256_set1_epi32(1), f15 = _mm256_set1_epi32(15);
    if (type == WT_IQ2_XXS || type == WT_IQ3_XXS) {
        const int iq3 = type == WT_IQ3_XXS;
        const __m256i a = KFN(gather_rows)(type, blk + (iq3 ? 66 + 4 * s : 6 + 8 * s));   /* signs, scale << 28 */
        const __m256i q0 = KFN(gather_rows)(type, blk + 2 + 8 * s);
        const __m256i q1 = iq3 ? KFN(gather_rows)(type, blk + 6 + 8 * s) : q0;
        for (int l = 0; l < 4; l++) {
            __m256i k = _mm256_and_si256(_mm256_srli_epi32(a, 7 * l), _mm256_set1_epi32(127));
            __m256i sb = KFN(spread_byte)(KFN(ksign)(k), 0);
            __m256i lo, hi;
            if (iq3) {   /* indices 2l, 2l + 1: bytes of q0 (l < 2) or q1 */
                __m256i q = l < 2 ? q0 : q1;
                lo = KFN(gather_grid)(IQ3XXS_GRID, _mm256_and_si256(_mm256_srli_epi32(q, 16 * (l % 2)), b8));
                hi = KFN(gather_grid)(IQ3XXS_GRID, _mm256_and_si256(_mm256_srli_epi32(q, 16 * (l % 2) + 8), b8));
            } else {
                __m256i i2 = _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(q0, 8 * l), b8), 1);
                lo = KFN(gather_grid)((const uint32_t *)IQ2XXS_GRID, i2);
                hi = KFN(gather_grid)((const uint32_t *)IQ2XXS_GRID, _mm256_add_epi32(i2, one));
            }
            wv[2 * l] = KFN(apply_signs)(lo, sb, 0);
            wv[2 * l + 1] = KFN(apply_signs)(hi, sb, 1);
        }
        __m256i m = _mm256_or_si256(_mm256_slli_epi32(_mm256_srli_epi32(a, 28), 1), one);
        KFN(lane_scales)(m, m, q6);
    } else if (type == WT_IQ2_XS) {
        const __m256i q01 = KFN(gather_rows)(type, blk + 2 + 8 * s), q23 = KFN(gather_rows)(type, blk + 6 + 8 * s);
        for (int l = 0; l < 4; l++) {
            __m256i q = _mm256_and_si256(_mm256_srli_epi32(l < 2 ? q01 : q23, 16 * (l % 2)),
                                         _mm256_set1_epi32(0xffff));
            __m256i sb = KFN(spread_byte)(KFN(ksign)(_mm256_srli_epi32(q, 9)), 0);
            __m256i i2 = _mm256_slli_epi32(_mm256_and_si256(q, _mm256_set1_epi32(511)), 1);
            wv[2 * l] = KFN(apply_signs)(KFN(gather_grid)((const uint32_t *)IQ2XS_GRID, i2), sb, 0);
            wv[2 * l + 1] = KFN(apply_signs)(KFN(gather_grid)((const uint32_t *)IQ2XS_GRID, _mm256_add_epi32(i2, one)),
                                             sb, 1);
        }
        __m256i sc = _mm256_srli_epi32(KFN(gather_rows)(type, blk + 63 + s), 24);   /* the byte at 66 + s */
        KFN(lane_scales)(_mm256_or_si256(_mm256_slli_epi32(_mm256_and_si256(sc, f15), 1), one),
                         _mm256_or_si256(_mm256_slli_epi32(_mm256_srli_epi32(sc, 4), 1), one), q6);
    } else if (type == WT_IQ2_S) {
        const __m256i q = KFN(gather_rows)(type, blk + 2 + 4 * s), sg = KFN(gather_rows)(type, blk + 34 + 4 * s);
        const __m256i qh = KFN(gather_rows)(type, blk + 66 + s);
        const __m256i sc = _mm256_srli_epi32(KFN(gather_rows)(type, blk + 71 + s), 24);   /* the byte at 74 + s */
        for (int l = 0; l < 4; l++) {
            __m256i idx = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(q, 8 * l), b8),
                                          _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(qh, 2 * l),
                                                                             _mm256_set1_epi32(3)), 8));
            __m256i i2 = _mm256_slli_epi32(idx, 1), sb = KFN(spread_byte)(sg, l);
            wv[2 * l] = KFN(apply_signs)(KFN(gather_grid)((const uint32_t *)IQ2S_GRID, i2), sb, 0);
            wv[2 * l + 1] = KFN(apply_signs)(KFN(gather_grid)((const uint32_t *)IQ2S_GRID, _mm256_add_epi32(i2, one)),
                                             sb, 1);
        }
        KFN(lane_scales)(_mm256_or_si256(_mm256_slli_epi32(_mm256_and_si256(sc, f15), 1), one),
                         _mm256_or_si256(_mm256_slli_epi32(_mm256_srli_epi32(sc, 4), 1), one), q6);
    } else if (type == WT_IQ3_S) {
        const __m256i q0 = KFN(gather_rows)(type, blk + 2 + 8 * s), q1 = KFN(gather_rows)(type, blk + 6 + 8 * s);
        const __m256i qh = KFN(gather_rows)(type, blk + 66 + s), sg = KFN(gather_rows)(type, blk + 74 + 4 * s);
        for (int j = 0; j < 8; j++) {
            __m256i idx = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(j < 4 ? q0 : q1, 8 * (j % 4)), b8),
                                          _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(qh, j), one), 8));
            wv[j] = KFN(apply_signs)(KFN(gather_grid)(IQ3S_GRID, idx), KFN(spread_byte)(sg, j / 2), j % 2);
        }
        __m256i sc = _mm256_srli_epi32(KFN(gather_rows)(type, blk + 103 + s / 2), 24);   /* the byte at 106 + s/2 */
        __m256i m = _mm256_and_si256(_mm256_srli_epi32(sc, 4 * (s % 2)), f15);
        m = _mm256_or_si256(_mm256_slli_epi32(m, 1), one);
        KFN(lane_scales)(m, m, q6);
    } else if (type == WT_IQ1_S) {   /* values 8 g +- 1 */
        const __m256i q = KFN(gather_rows)(type, blk + 2 + 4 * s);
        const __m256i h = _mm256_and_si256(KFN(gather_rows)(type, blk + 34 + 2 * s), _mm256_set1_epi32(0xffff));
        const __m256i delta = _mm256_or_si256(_mm256_set1_epi8(1),   /* -1 in every byte where bit 15 is set */
                                              _mm256_cmpeq_epi32(_mm256_and_si256(h, _mm256_set1_epi32(0x8000)),
                                                                 _mm256_set1_epi32(0x8000)));
        for (int l = 0; l < 4; l++) {
            __m256i idx = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(q, 8 * l), b8),
                                          _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(h, 3 * l),
                                                                             _mm256_set1_epi32(7)), 8));
            __m256i i2 = _mm256_slli_epi32(idx, 1);
            for (int k = 0; k < 2; k++) {
                __m256i g = KFN(gather_grid)((const uint32_t *)IQ1S_GRID, k ? _mm256_add_epi32(i2, one) : i2);
                g = _mm256_and_si256(_mm256_slli_epi16(g, 3), _mm256_set1_epi8((char)0xf8));
                wv[2 * l + k] = _mm256_add_epi8(g, delta);
            }
        }
        __m256i m = _mm256_or_si256(_mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(h, 12), _mm256_set1_epi32(7)),
                                                      1), one);
        KFN(lane_scales)(m, m, q6);
    } else if (type == WT_TQ2_0) {   /* value 32 s + i: bits 2 (s % 4) of qs[32 (s / 4) + i], minus 1 */
        for (int j = 0; j < 8; j++) {
            __m256i q = KFN(gather_rows)(type, blk + 32 * (s / 4) + 4 * j);
            q = _mm256_and_si256(_mm256_srli_epi32(q, 2 * (s % 4)), _mm256_set1_epi8(3));
            wv[j] = _mm256_sub_epi8(q, _mm256_set1_epi8(1));
        }
        KFN(lane_scales)(one, one, q6);
    }
}
