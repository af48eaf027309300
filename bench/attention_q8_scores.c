/* Which score kernel for the q8_0 KV cache: int8 dot products (attention_q8.c: the query quantized per 32, keys in
 * lanes, dpbusd or maddubs) or float dot products of dequantized keys (row-major int8 K, converted to f32 and
 * scaled per 32 values, then the f16 kernel's fma chains and horizontal sums)? Times the scores of one decode token
 * of SmolLM2's shape at depth 4096 (30 layers x 3 KV heads x 3 query rows x 4096 keys, 25 MB of K: streamed from
 * memory as in a real step), rounds interleaved, median per kernel, in thread CPU time (a shared machine steals
 * wall time, not CPU time; its caches are still shared).
 *
 *   gcc -O3 -std=gnu11 -ffp-contract=off -fno-math-errno -Iext/cpu bench/attention_q8_scores.c ext/cpu/quant.c \
 *       ext/cpu/fp16.c ext/cpu/dispatch.c ext/cpu/weight.c ext/cpu/pool.c -pthread -lm -o /tmp/q8scores && /tmp/q8scores
 */
#include "../ext/cpu/attention_q8.c"
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define LAYERS 30
#define HEADS 3
#define GROUP 3
#define HD 64
#define DEPTH 4096
#define NBLK (DEPTH / KV_BLOCK)

/* the alternative: K row-major int8 (KV_BLOCK, HD) then scales (KV_BLOCK, HD / 32); four keys at a time against
 * NR rows, each key's 8 values converted and scaled once for all rows */
__attribute__((target("avx2,fma,f16c"))) static void scores_f32_dequant(const float *const *q, int nr,
                                                                         const uint8_t *k, float *const *s) {
    const int8_t *kq = (const int8_t *)k;
    const uint16_t *ks = (const uint16_t *)(k + KV_BLOCK * HD);
    float dk[KV_BLOCK * HD / 32];                     /* the block's scales as floats, converted 8 at a time */
    for (int i = 0; i < KV_BLOCK * HD / 32; i += 8)
        _mm256_storeu_ps(dk + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(ks + i))));
    for (int j = 0; j < KV_BLOCK; j += 4) {
        __m256 a[GROUP][4];
        for (int r = 0; r < nr; r++)
            for (int c = 0; c < 4; c++) a[r][c] = _mm256_setzero_ps();
        for (int g = 0; g < HD / 8; g++)
            for (int c = 0; c < 4; c++) {
                const int8_t *p = kq + (size_t)(j + c) * HD + 8 * g;
                __m256 d = _mm256_broadcast_ss(dk + (j + c) * (HD / 32) + g / 4);
                __m256 kv = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p))), d);
                for (int r = 0; r < nr; r++) a[r][c] = _mm256_fmadd_ps(_mm256_loadu_ps(q[r] + 8 * g), kv, a[r][c]);
            }
        for (int r = 0; r < nr; r++)
            _mm_storeu_ps(s[r] + j, hsum4x8_pairs(a[r][0], a[r][1], a[r][2], a[r][3]));
    }
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);   /* CPU time: the machine may be shared */
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static int cmp(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return (x > y) - (x < y); }

int main(void) {
    size_t sl = kvq8_slice_bytes(HD), n = (size_t)LAYERS * NBLK * HEADS;
    uint8_t *lanes = aligned_alloc(64, n * sl), *rows = aligned_alloc(64, n * sl);
    float x[HD], q[GROUP][HD], s[GROUP][KV_BLOCK];
    srand(1);
    for (size_t i = 0; i < n; i++)
        for (int p = 0; p < KV_BLOCK; p++) {
            for (int d = 0; d < HD; d++) x[d] = (float)rand() / RAND_MAX - 0.5f;
            kvq8_store(x, HD, lanes + i * sl, p, 1);
            kvq8_store(x, HD, rows + i * sl, p, 0);          /* V's layout is the row-major one */
        }
    block_q8x qq[GROUP][HD / 32];
    for (int r = 0; r < GROUP; r++) {
        for (int d = 0; d < HD; d++) q[r][d] = (float)rand() / RAND_MAX - 0.5f;
        quantize_act(q[r], HD, qq[r]);
    }
    const char *names[3] = {"int8 dot, AVX-VNNI (dpbusd)", "int8 dot, AVX2 (maddubs)", "f32 dot of dequantized K (AVX2)"};
    double t[3][15];
    int path = cpu_best_path();
    for (int round = 0; round < 15; round++)
        for (int v = 0; v < 3; v++) {
            double t0 = now();
            for (size_t i = 0; i < n; i++) {
                q8rows_t rs = {.nr = GROUP, .j0 = 0};
                for (int r = 0; r < GROUP; r++) { rs.q[r] = qq[r]; rs.s[r] = s[r]; rs.n[r] = KV_BLOCK; }
                const float *qp[GROUP] = {q[0], q[1], q[2]};
                float *sp[GROUP] = {s[0], s[1], s[2]};
                if (v == 0 && path == PATH_AVXVNNI) scores_avxvnni(&rs, lanes + i * sl, KV_BLOCK, HD, 0.125f);
                else if (v == 0) scores_avx512vnni(&rs, lanes + i * sl, KV_BLOCK, HD, 0.125f);
                else if (v == 1) scores_avx2(&rs, lanes + i * sl, KV_BLOCK, HD, 0.125f);
                else scores_f32_dequant(qp, GROUP, rows + i * sl, sp);
            }
            t[v][round] = now() - t0;
        }
    for (int v = 0; v < 3; v++) {
        qsort(t[v], 15, sizeof(double), cmp);
        printf("%-34s %.3f ms per token (median of 15; min %.3f)\n", names[v], t[v][7] * 1e3, t[v][0] * 1e3);
    }
    return 0;
}
