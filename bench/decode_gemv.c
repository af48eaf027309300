/* Decode (one token) GEMV of the K-quants at Qwen2.5-1.5B's shapes: weight GB/s per kernel, next to the read
 * bandwidth probe (membw.c) in the same run. Each configuration streams ~400 MB of copies of one matrix (more than
 * the last-level cache: every byte comes from memory, as in a decode step) or, with HOT=1, one copy 20 times
 * (compute-bound), at shapes of at most 1.3 MB that stay in a core's 2 MB L2. The kernels alternate within each
 * round: a GROUP is the decode group size (kernel_config_t's decode_group: 1 = one tile per call, the kernel before the
 * groups) of the ymm tile kernels, or with a leading z of the zmm pair kernels (qdecode512.c,
 * decode_zmm), and a trailing p or n turns the software prefetch on or off for every tile
 * (decode_prefetch_bytes; default: the CPU's rule); a leading L only reads the bytes in the group kernels'
 * order (load_fn: the access pattern's ceiling), a leading S followed by a distance reads the same bytes as one
 * stream per thread (stream_fn: a plain read loop's ceiling); best of the rounds, since the machine may be shared.
 *
 *   gcc -O3 -std=gnu11 -ffp-contract=off -fno-math-errno -pthread -Iext/cpu bench/decode_gemv.c ext/cpu/weight.c \
 *       ext/cpu/type_traits.c ext/cpu/repack.c \
 *       ext/cpu/matmul.c ext/cpu/matmul_simd.c ext/cpu/qpair512.c ext/cpu/qdecode512.c ext/cpu/dispatch.c \
 *       ext/cpu/fp16.c ext/cpu/quant.c ext/cpu/pool.c ext/cpu/hugemem.c ext/cpu/membw.c ext/cpu/iq_grids.c -lm \
 *       -o /tmp/decode_gemv
 *   /tmp/decode_gemv THREADS ROUNDS GROUP...   e.g. /tmp/decode_gemv 2 5 4 z4 z4n L4 S1024
 *   HOT=1 /tmp/decode_gemv 1 10 4 z4
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <immintrin.h>
#include "inferd.h"
#include "tile.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static uint64_t rng_state = 88172645463325252ull;
static uint32_t rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)rng_state;
}

/* random GGUF blocks with sane f16 scales (random bits would give infinities and NaNs) */
static void *gguf_random(int type, int rows, int cols) {
    size_t n = gguf_row_bytes(type, cols) * rows;
    size_t bs = type == WT_Q4_K ? 144 : type == WT_Q6_K ? 210 : type == WT_Q8_0 ? 34 : 22;   /* Q5_0: 22 */
    uint8_t *p = malloc(n);
    for (size_t i = 0; i < n; i++) p[i] = (uint8_t)rnd();
    for (size_t o = 0; o < n; o += bs) {
        uint16_t d = (uint16_t)(0x1c00 + (rnd() & 0xff));
        if (type == WT_Q4_K) { memcpy(p + o, &d, 2); memcpy(p + o + 2, &d, 2); }
        else if (type == WT_Q6_K) memcpy(p + o + 208, &d, 2);
        else memcpy(p + o, &d, 2);
    }
    return p;
}

typedef struct { const weight_t *w; const block_q8x *xq; float *y; } job_t;
static kernel_config_t kernels;   /* the configuration being run */

static void matmul_fn(void *arg, int64_t begin, int64_t end, int thread) {   /* forward.c's items: pairs of tiles */
    const job_t *j = arg;
    (void)thread;
    int nt = matmul_num_tiles(j->w), t0 = 2 * (int)begin, t1 = 2 * (int)end < nt ? 2 * (int)end : nt;
    matmul_tiles(&kernels, j->w, t0, t1, 1, NULL, j->xq, j->y + (size_t)t0 * TILE_ROWS, j->w->rows, 0);
}

/* mode L: the access pattern alone. A thread's tiles are read as the group kernels read them (up to GROUP tiles in
 * lockstep, block after block, with tile.h's decode prefetch beside each tile's loads, on past the claim up to the
 * matrix's end as theirs), the bytes only xor-ed together: what the pattern gets from memory with next to no
 * arithmetic, the ceiling of the kernels that walk it. A trailing n: without the prefetch. */
static int load_group = 4, load_prefetch = 1;
__attribute__((target("avx512f"))) static void load_fn(void *arg, int64_t begin, int64_t end, int thread) {
    const job_t *j = arg;
    const weight_t *w = j->w;
    (void)thread;
    int nt = matmul_num_tiles(w), t0 = 2 * (int)begin, t1 = 2 * (int)end < nt ? 2 * (int)end : nt;
    int nb = w->cols / weight_block_cols(w->type);
    size_t bb = weight_tile_block_bytes(w->type), tb = (size_t)nb * bb;
    __m512i acc = _mm512_setzero_si512();
    for (int t = t0; t < t1; t += load_group) {
        int n = t1 - t < load_group ? t1 - t : load_group;
        const uint8_t *base = w->data + (size_t)t * tb;
        decode_prefetch_t pf = decode_prefetch_plan(base, tb, n, bb, load_prefetch ? nt - t : 0);
        for (int b = 0; b < nb; b++)
            for (int i = 0; i < n; i++) {
                decode_prefetch_tile(&pf, b, i, (int)((bb + 63) / 64));
                for (size_t o = 0; o + 64 <= bb; o += 64)
                    acc = _mm512_xor_si512(acc, _mm512_loadu_si512((const void *)(base + (size_t)i * tb + b * bb + o)));
            }
    }
    j->y[t0 * TILE_ROWS] = (float)_mm512_reduce_add_epi32(acc);
}

/* mode S (S followed by a distance in bytes, S0: none): a thread's tiles read as one sequential stream, each line
 * with a prefetch that distance ahead: a plain read loop's ceiling for the same bytes */
static size_t sdist;
__attribute__((target("avx512f"))) static void stream_fn(void *arg, int64_t begin, int64_t end, int thread) {
    const job_t *j = arg;
    const weight_t *w = j->w;
    (void)thread;
    int nt = matmul_num_tiles(w), t0 = 2 * (int)begin, t1 = 2 * (int)end < nt ? 2 * (int)end : nt;
    size_t tb = (size_t)(w->cols / weight_block_cols(w->type)) * weight_tile_block_bytes(w->type);
    const uint8_t *p = w->data + (size_t)t0 * tb, *e = w->data + (size_t)t1 * tb;
    __m512i acc = _mm512_setzero_si512();
    for (; p + 64 <= e; p += 64) {
        if (sdist && p + sdist < e) __builtin_prefetch(p + sdist, 0, 1);
        acc = _mm512_xor_si512(acc, _mm512_loadu_si512((const void *)p));
    }
    j->y[t0 * TILE_ROWS] = (float)_mm512_reduce_add_epi32(acc);
}

#define NSHAPES 6
static const int streamed_shapes[NSHAPES][3] = {   /* Qwen2.5-1.5B's: q/o, k/v, gate/up, down, down, output */
    {WT_Q4_K, 1536, 1536}, {WT_Q4_K, 256, 1536}, {WT_Q4_K, 8960, 1536}, {WT_Q4_K, 1536, 8960},
    {WT_Q6_K, 1536, 8960}, {WT_Q6_K, 151936, 1536},
};
static const int gemma_shapes[NSHAPES][3] = {     /* Gemma 3 270M's (GEMMA=1): output (tied, Q8_0), gate/up, down, q, o, k */
    {WT_Q8_0, 262144, 640}, {WT_Q5_0, 2048, 640}, {WT_Q4_K, 640, 2048},
    {WT_Q5_0, 1024, 640}, {WT_Q6_K, 640, 1024}, {WT_Q5_0, 256, 640},
};
static const int hot_shapes[NSHAPES][3] = {        /* the same widths, fewer rows: in L2 */
    {WT_Q4_K, 1536, 1536}, {WT_Q4_K, 256, 1536}, {WT_Q4_K, 128, 8960},
    {WT_Q6_K, 1024, 1536}, {WT_Q6_K, 256, 1536}, {WT_Q6_K, 128, 8960},
};

int main(int argc, char **argv) {
    if (argc < 4) { fprintf(stderr, "usage: %s THREADS ROUNDS GROUP...\n", argv[0]); return 2; }
    int threads = atoi(argv[1]), rounds = atoi(argv[2]), ng = argc - 3, hot = getenv("HOT") != NULL;
    enum { KERNEL, LOADS, STREAM };   /* what a configuration runs: matmul_fn, load_fn (mode L), stream_fn (mode S) */
    int groups[8], zmm[8], pf[8], load[8];
    size_t sdists[8] = {0};
    ng = ng < 8 ? ng : 8;
    for (int g = 0; g < ng; g++) {
        const char *a = argv[3 + g], *end = a + strlen(a) - 1;
        zmm[g] = a[0] == 'z';
        load[g] = a[0] == 'L' ? LOADS : a[0] == 'S' ? STREAM : KERNEL;
        if (load[g] == STREAM) sdists[g] = (size_t)atoi(a + 1);
        groups[g] = load[g] == STREAM ? 1 : atoi(a + (zmm[g] || load[g]));
        pf[g] = *end == 'p' ? 2 : *end == 'n' ? 0 : 1;
    }
    const int (*shapes)[3] = getenv("GEMMA") ? gemma_shapes : hot ? hot_shapes : streamed_shapes;
    kernel_config_default(&kernels);
    size_t dflt = kernels.decode_prefetch_bytes;
    pool_t *pool = pool_create(threads);
    float *x = malloc(8960 * sizeof(float)), *y = malloc((size_t)262144 * sizeof(float));
    for (int i = 0; i < 8960; i++) x[i] = (float)((int)(rnd() % 2001) - 1000) * 1e-3f;
    block_q8x *xq = malloc(8960 / QK * sizeof(block_q8x));
    quantize_act(x, 8960, xq);
    weight_t *ws[NSHAPES];
    int copies[NSHAPES], reps = hot ? 50 : 1;
    for (int s = 0; s < NSHAPES; s++) {
        int type = shapes[s][0], rows = shapes[s][1], cols = shapes[s][2];
        void *src = gguf_random(type, rows, cols);
        copies[s] = hot ? 1 : (int)(400e6 / weight_layout_bytes(type, rows, cols));
        copies[s] = copies[s] < 1 ? 1 : copies[s];
        ws[s] = malloc(sizeof(weight_t) * copies[s]);
        size_t lb = (weight_layout_bytes(type, rows, cols) + 63) & ~(size_t)63;
        uint8_t *mem = huge_alloc(lb * copies[s]);   /* in huge pages, as the engine's weights and the probe's buffer */
        for (int c = 0; c < copies[s]; c++)
            if (weight_init(&ws[s][c], type, rows, cols, src, gguf_row_bytes(type, cols) * rows, mem + lb * c))
                return 1;
        huge_collapse(mem, lb * copies[s]);
        free(src);
    }
    double best[8][NSHAPES], bw = 0;
    for (int g = 0; g < ng; g++)
        for (int s = 0; s < NSHAPES; s++) best[g][s] = 1e30;
    for (int r = 0; r < rounds; r++) {
        double b = read_bandwidth(256 << 20, threads, 1);
        bw = b > bw ? b : bw;
        for (int g = 0; g < ng; g++) {
            kernels.decode_group = groups[g];
            kernels.decode_zmm = zmm[g];
            kernels.decode_prefetch_bytes = pf[g] != 1 ? (pf[g] ? SIZE_MAX : 0) : dflt;
            for (int s = 0; s < NSHAPES; s++) {
                load_group = groups[g];   /* mode L's prefetch by matmul.c's rule: tile bytes <= the default */
                sdist = sdists[g];
                load_prefetch = pf[g] == 2 || (pf[g] == 1 && ws[s][0].nbytes / matmul_num_tiles(&ws[s][0]) <= dflt);
                double t0 = now();
                for (int k = 0; k < reps; k++)
                    for (int c = 0; c < copies[s]; c++) {
                        job_t j = {&ws[s][c], xq, y};
                        pool_run(pool, (matmul_num_tiles(&ws[s][c]) + 1) / 2, 1,
                                 load[g] == STREAM ? stream_fn : load[g] == LOADS ? load_fn : matmul_fn, &j);
                    }
                double t = now() - t0;
                best[g][s] = t < best[g][s] ? t : best[g][s];
            }
        }
    }
    /* every kernel's y must be the first one's, bit for bit (the tests check against scalar; this checks the build) */
    int same = 1;
    float *y0 = malloc((size_t)262144 * sizeof(float));
    for (int s = 0; s < NSHAPES; s++)
        for (int g = 0, first = 1; g < ng; g++) {
            if (load[g] != KERNEL) continue;
            kernels.decode_group = groups[g];
            kernels.decode_zmm = zmm[g];
            job_t j = {&ws[s][0], xq, first ? y0 : y};
            pool_run(pool, (matmul_num_tiles(&ws[s][0]) + 1) / 2, 1, matmul_fn, &j);
            if (!first && memcmp(y, y0, (size_t)shapes[s][1] * sizeof(float))) same = 0;
            first = 0;
        }
    if (!same) printf("THE KERNELS' RESULTS DIFFER\n");
    printf("%s path, %d threads, %s, best of %d rounds; read bandwidth probe: %.1f GB/s\n\n",
           cpu_path_name(cpu_path()), threads, hot ? "hot (one copy, cached)" : "streamed from memory", rounds,
           bw / 1e9);
    printf("| type | rows x cols |");
    for (int g = 0; g < ng; g++)
        if (load[g] == STREAM) printf(" one stream, prefetch %zu B ahead GB/s |", sdists[g]);
        else printf(" %s %d%s GB/s |", load[g] == LOADS ? "loads only" : zmm[g] ? "zmm" : "ymm", groups[g],
                    pf[g] == 2 ? " prefetch" : pf[g] ? "" : " no prefetch");
    printf("\n| --- | --- |");
    for (int g = 0; g < ng; g++) printf(" ---: |");
    printf("\n");
    for (int s = 0; s < NSHAPES; s++) {
        int t = shapes[s][0];
        printf("| %s | %d x %d |", t == WT_Q4_K ? "Q4_K" : t == WT_Q6_K ? "Q6_K" : t == WT_Q8_0 ? "Q8_0" : "Q5_0",
               shapes[s][1], shapes[s][2]);
        for (int g = 0; g < ng; g++) printf(" %.1f |", (double)ws[s][0].nbytes * copies[s] * reps / best[g][s] / 1e9);
        printf("\n");
    }
    return 0;
}
