/* Streaming read bandwidth: every thread sums its share of a large buffer with 32-byte loads, by two read loops,
 * and the faster one counts. The engine and the benches compare decode traffic (weights + KV bytes per step)
 * against this number, so it should be the most a plain read gets: on the Intel Xeon of 2026-12-03 the eight
 * streams read 33-34 GB/s, one stream with a software prefetch 4 KB ahead 36-37 (the hardware prefetcher alone
 * stays behind; bench/results/decode_linear.md). */
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "inferd.h"
#include "tile.h"
#if defined(__x86_64__)
#include <immintrin.h>
#endif

typedef struct { const uint8_t *buf; size_t chunk_bytes; int one_stream; uint64_t sums[256]; } membw_arg;

#if defined(__x86_64__)
/* eight streams an eighth of the chunk apart, read side by side: more misses in flight than one stream gives */
__attribute__((target("avx2"))) static uint64_t sum_avx2(const uint8_t *p, size_t n) {
    __m256i a[8];
    for (int k = 0; k < 8; k++) a[k] = _mm256_setzero_si256();
    size_t q = n / 8;
    for (size_t i = 0; i + 64 <= q; i += 64)
        for (int k = 0; k < 8; k++) {
            a[k] = _mm256_add_epi64(a[k], _mm256_load_si256((const __m256i *)(p + k * q + i)));
            a[k] = _mm256_add_epi64(a[k], _mm256_load_si256((const __m256i *)(p + k * q + i + 32)));
        }
    for (int k = 1; k < 8; k++) a[0] = _mm256_add_epi64(a[0], a[k]);
    uint64_t lanes[4];
    _mm256_storeu_si256((__m256i *)lanes, a[0]);
    return lanes[0] + lanes[1] + lanes[2] + lanes[3];
}

/* one stream, each line's prefetch PREFETCH_AHEAD bytes ahead (tile.h's prefetch_run, as the decode kernels': clamped
 * to the chunk's last line, no branch) */
#define PREFETCH_AHEAD 4096
__attribute__((target("avx2"))) static uint64_t sum_one_stream(const uint8_t *p, size_t n) {
    __m256i a = _mm256_setzero_si256(), b = a;
    const uint8_t *last = p + n - 64;
    for (size_t i = 0; i < n; i += 64) {
        prefetch_run(p + i + PREFETCH_AHEAD, 1, last);
        a = _mm256_add_epi64(a, _mm256_load_si256((const __m256i *)(p + i)));
        b = _mm256_add_epi64(b, _mm256_load_si256((const __m256i *)(p + i + 32)));
    }
    uint64_t lanes[4];
    _mm256_storeu_si256((__m256i *)lanes, _mm256_add_epi64(a, b));
    return lanes[0] + lanes[1] + lanes[2] + lanes[3];
}
#endif

static uint64_t sum_scalar(const uint8_t *p, size_t n) {
    const uint64_t *w = (const uint64_t *)p;
    uint64_t s = 0;
    for (size_t i = 0; i < n / 8; i++) s += w[i];
    return s;
}

static void membw_fn(void *varg, int64_t begin, int64_t end, int thread) {
    membw_arg *a = varg;
    for (int64_t c = begin; c < end; c++) {
        const uint8_t *p = a->buf + (size_t)c * a->chunk_bytes;
#if defined(__x86_64__)
        a->sums[thread & 255] += cpu_path() == PATH_SCALAR ? sum_scalar(p, a->chunk_bytes)
                                 : a->one_stream      ? sum_one_stream(p, a->chunk_bytes)
                                                      : sum_avx2(p, a->chunk_bytes);
#else
        a->sums[thread & 255] += sum_scalar(p, a->chunk_bytes);
#endif
    }
}

/* Best-of-`repeats` read bandwidth in bytes per second over `nbytes` with `threads` threads, each repeat timing
 * both read loops (the one stream in 4 MB chunks, the eight in 1 MB chunks claimed 4 at a time). */
double read_bandwidth(size_t nbytes, int threads, int repeats) {
    const size_t one_chunk = 4 << 20, eight_chunk = 1 << 20;
    nbytes = (nbytes + one_chunk - 1) / one_chunk * one_chunk;
    uint8_t *buf = huge_alloc(nbytes);            /* in the pages the engine's weights use */
    if (!buf) return -1.0;
    memset(buf, 1, nbytes);                       /* touch every page before timing */
    huge_collapse(buf, nbytes);                   /* then into huge pages, as the weights once loaded */
    pool_t *pool = pool_create(threads);
    double best = 0.0;
    for (int r = 0; r < repeats; r++)
        for (int one = 0; one < 2; one++) {
            membw_arg arg = {.buf = buf, .chunk_bytes = one ? one_chunk : eight_chunk, .one_stream = one};
            struct timespec t0, t1;
            clock_gettime(CLOCK_MONOTONIC, &t0);
            pool_run(pool, (int64_t)(nbytes / arg.chunk_bytes), one ? 1 : 4, membw_fn, &arg);
            clock_gettime(CLOCK_MONOTONIC, &t1);
            double dt = (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9;
            if (dt > 0 && nbytes / dt > best) best = nbytes / dt;
        }
    pool_destroy(pool);
    huge_free(buf, nbytes);
    return best;
}
