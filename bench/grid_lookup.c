/* How to fill vectors with codebook entries (qlanes.h): a 512-entry table of 32-bit entries (IQ3_S's grid), indices
 * from a byte array, 16 entries at a time three ways: one zmm vpgatherdd, two ymm vpgatherdd, or 16 scalar loads
 * put together with inserts (what qlanes.h's set8 does). Prints ns per 16 entries, three rounds, thread CPU time.
 *
 *   gcc -O2 -march=native bench/grid_lookup.c -o /tmp/grid_lookup && /tmp/grid_lookup
 *
 * Needs AVX-512F (the zmm gather); the other two ways run on AVX2. */
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

#define INDEX_BYTES (1 << 20)
#define PASSES 50

static uint32_t grid[512];
static uint8_t indices[INDEX_BYTES];

static double cpu_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* the 8 entries of 8 indices, the ninth index bit set on some (as IQ3_S's qh bits do) */
static inline __m256i scalar8(const uint8_t *q) {
    __m128i lo = _mm_cvtsi32_si128((int)grid[q[0]]), hi = _mm_cvtsi32_si128((int)grid[q[4] | 256]);
    lo = _mm_insert_epi32(lo, (int)grid[q[1]], 1);
    hi = _mm_insert_epi32(hi, (int)grid[q[5]], 1);
    lo = _mm_insert_epi32(lo, (int)grid[q[2] | 256], 2);
    hi = _mm_insert_epi32(hi, (int)grid[q[6]], 2);
    lo = _mm_insert_epi32(lo, (int)grid[q[3]], 3);
    hi = _mm_insert_epi32(hi, (int)grid[q[7] | 256], 3);
    return _mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1);
}

int main(void) {
    for (int i = 0; i < 512; i++) grid[i] = (uint32_t)i * 2654435761u;
    for (int i = 0; i < INDEX_BYTES; i++) indices[i] = (uint8_t)(i * 131 + 7);
    const double entries = (double)PASSES * INDEX_BYTES;
    __m512i acc16 = _mm512_setzero_si512();
    __m256i acc8 = _mm256_setzero_si256();
    for (int round = 0; round < 3; round++) {
        double t = cpu_seconds();
        for (int pass = 0; pass < PASSES; pass++)
            for (int i = 0; i < INDEX_BYTES; i += 16) {
                __m512i idx = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(indices + i)));
                idx = _mm512_or_si512(idx, _mm512_set1_epi32(i & 16 ? 256 : 0));
                acc16 = _mm512_add_epi32(acc16, _mm512_i32gather_epi32(idx, grid, 4));
            }
        const double zmm = cpu_seconds() - t;
        t = cpu_seconds();
        for (int pass = 0; pass < PASSES; pass++)
            for (int i = 0; i < INDEX_BYTES; i += 8) {
                __m256i idx = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(indices + i)));
                acc8 = _mm256_add_epi32(acc8, _mm256_i32gather_epi32((const int *)grid, idx, 4));
            }
        const double ymm = cpu_seconds() - t;
        t = cpu_seconds();
        for (int pass = 0; pass < PASSES; pass++)
            for (int i = 0; i < INDEX_BYTES; i += 8) acc8 = _mm256_add_epi32(acc8, scalar8(indices + i));
        const double scalar = cpu_seconds() - t;
        printf("ns per 16 entries: zmm gather %.2f, two ymm gathers %.2f, 16 scalar loads + inserts %.2f\n",
               zmm / entries * 16e9, ymm / entries * 16e9, scalar / entries * 16e9);
    }
    int32_t sink[16];
    _mm512_storeu_si512(sink, _mm512_add_epi32(acc16, _mm512_zextsi256_si512(acc8)));
    return sink[0] == 12345;   /* keeps the sums alive */
}
