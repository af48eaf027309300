/* The q8_0 attention's score kernel, included by attention_q8.c once per path inside a `#pragma GCC target`
 * region, with QSUFFIX (the path's name, a suffix of the functions) and QVNNI (1 where DPBUSD(acc, u8, s8)
 * exists). Scores 8 keys (one 32-byte K load = 4 values of each) against up to Q8_ROWS_PER_SET rows at a time:
 *   VNNI: dpbusd(k + 128, q) per row, the row's -128 * sum(q) (block_q8x.q8_corr) as the sum's start;
 *   AVX2: maddubs(|k|, q * sign(k)) then madd with ones (|k| <= 127 and |q| <= 127: no int16 saturation).
 * Both leave key i's exact int32 block sum in lane i; the float steps are attention_q8.c's scalar ones. */

#define QCAT_(a, b) a##_##b
#define QCAT(a, b) QCAT_(a, b)
#define QFN(name) QCAT(name, QSUFFIX)
#define QINLINE static inline __attribute__((always_inline))

QINLINE __m256i QFN(bcast4)(const int8_t *p) { int32_t v; memcpy(&v, p, 4); return _mm256_set1_epi32(v); }

QINLINE void QFN(scores_nr)(const q8rows_t *rs, const uint8_t *k, int n, int hd, float scale, const int NR) {
    const uint16_t *ks = (const uint16_t *)(k + (size_t)KV_BLOCK * hd);
    const __m256 vscale = _mm256_set1_ps(scale);
#if !QVNNI
    const __m256i ones = _mm256_set1_epi16(1);
#endif
    int g0 = rs->j0 / 8, g1 = (n + 7) / 8;
    for (int g = g0; g < g1; g++) {
        prefetch_group(rs, g - g0, g1 - g0);
        const uint8_t *kg = k + (size_t)g * (hd / 4) * 32;
        __m256 acc[Q8_ROWS_PER_SET];
        for (int r = 0; r < NR; r++) acc[r] = _mm256_setzero_ps();
        for (int b = 0; b < hd / QK; b++) {
            __m256i isum[Q8_ROWS_PER_SET];
            for (int r = 0; r < NR; r++)
                isum[r] = QVNNI ? _mm256_set1_epi32(rs->q[r][b].q8_corr) : _mm256_setzero_si256();
            for (int c = 0; c < 8; c++) {
                __m256i kv = _mm256_loadu_si256((const __m256i *)(kg + (size_t)(b * 8 + c) * 32));
#if QVNNI
                __m256i ku = _mm256_xor_si256(kv, _mm256_set1_epi8((char)0x80));          /* k + 128 */
                for (int r = 0; r < NR; r++) isum[r] = DPBUSD(isum[r], ku, QFN(bcast4)(rs->q[r][b].qs + 4 * c));
#else
                __m256i ka = _mm256_abs_epi8(kv);
                for (int r = 0; r < NR; r++) {
                    __m256i qs = _mm256_sign_epi8(QFN(bcast4)(rs->q[r][b].qs + 4 * c), kv);
                    isum[r] = _mm256_add_epi32(isum[r], _mm256_madd_epi16(_mm256_maddubs_epi16(ka, qs), ones));
                }
#endif
            }
            __m256 dk = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(ks + b * KV_BLOCK + g * 8)));
            for (int r = 0; r < NR; r++)
                acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r]), _mm256_mul_ps(_mm256_set1_ps(rs->q[r][b].d), dk),
                                         acc[r]);
        }
        for (int r = 0; r < NR; r++) _mm256_storeu_ps(rs->s[r] + g * 8, _mm256_mul_ps(acc[r], vscale));
    }
}

static void QFN(scores)(const q8rows_t *rs, const uint8_t *k, int n, int hd, float scale) {
    switch (rs->nr) {
    case 1: QFN(scores_nr)(rs, k, n, hd, scale, 1); break;
    case 2: QFN(scores_nr)(rs, k, n, hd, scale, 2); break;
    case 3: QFN(scores_nr)(rs, k, n, hd, scale, 3); break;
    default: QFN(scores_nr)(rs, k, n, hd, scale, 4); break;
    }
}
