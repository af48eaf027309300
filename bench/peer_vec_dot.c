/* llama.cpp's own one-row dot kernels (ggml-cpu's vec_dot, what its decode runs for the types it does not repack)
 * on one thread, at the shapes and in the units of bench/lowbit_kernels.py: a decode step's matmul of ROWS x COLS
 * against one token, best of 5 timings of at least 0.1 s of the thread's CPU time. Weights are random bytes with
 * every block's scales set to a small normal f16 (random scales could be NaN or subnormal and time something else);
 * the token is random floats quantized by the type's own from_float. Build and run against llama.cpp's build:
 *   L=~/.cache/inferd-peers/llama.cpp-0.3.36
 *   gcc -O2 -march=native bench/peer_vec_dot.c -I$L/ggml/include -L$L/build/bin -lggml-cpu -lggml-base \
 *       -Wl,-rpath,$L/build/bin -o /tmp/peer_vec_dot && /tmp/peer_vec_dot [ROWS COLS] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "ggml.h"
#include "ggml-cpu.h"

static double cpu(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* where each type's f16 scales sit in its block (d, and dmin where it has one); MXFP4's is an E8M0 exponent byte */
static void sane_scales(enum ggml_type t, unsigned char *w, size_t nblocks) {
    const size_t bs = ggml_type_size(t);
    if (t == GGML_TYPE_MXFP4) {
        for (size_t b = 0; b < nblocks; b++) w[b * bs] = 120;
        return;
    }
    const size_t off = t == GGML_TYPE_Q2_K ? 80 : t == GGML_TYPE_Q3_K ? 108 : 0;
    const int two = t == GGML_TYPE_Q2_K || t == GGML_TYPE_Q4_K;
    const unsigned short h = 0x2000;
    for (size_t b = 0; b < nblocks; b++) {
        memcpy(w + b * bs + off, &h, 2);
        if (two) memcpy(w + b * bs + off + 2, &h, 2);
    }
}

int main(int argc, char **argv) {
    const int rows = argc > 2 ? atoi(argv[1]) : 8960, cols = argc > 2 ? atoi(argv[2]) : 1536;
    const enum ggml_type types[] = {GGML_TYPE_Q8_0, GGML_TYPE_MXFP4, GGML_TYPE_Q4_K, GGML_TYPE_Q2_K,
                                    GGML_TYPE_Q3_K, GGML_TYPE_IQ4_XS, GGML_TYPE_IQ3_S, GGML_TYPE_IQ3_XXS,
                                    GGML_TYPE_IQ2_S, GGML_TYPE_IQ2_XS, GGML_TYPE_IQ2_XXS};
    ggml_cpu_init();
    srand(1);
    float *xf = malloc(sizeof(float) * (size_t)cols), *out = malloc(sizeof(float) * (size_t)rows);
    for (int i = 0; i < cols; i++) xf[i] = (float)rand() / RAND_MAX * 2.0f - 1.0f;
    printf("| type | rows x cols | tokens | ms | weight GB/s | GOP/s |\n| --- | --- | ---: | ---: | ---: | ---: |\n");
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        const enum ggml_type t = types[ti];
        const struct ggml_type_traits_cpu *tr = ggml_get_type_traits_cpu(t);
        const size_t rb = ggml_row_size(t, cols);
        unsigned char *w = malloc(rb * (size_t)rows), *y = malloc(ggml_row_size(tr->vec_dot_type, cols));
        for (size_t i = 0; i < rb * (size_t)rows; i++) w[i] = (unsigned char)rand();
        sane_scales(t, w, rb * (size_t)rows / ggml_type_size(t));
        ggml_get_type_traits_cpu(tr->vec_dot_type)->from_float(xf, y, cols);
        double best = 1e9;
        for (int rep = 0; rep < 5; rep++) {
            const double t0 = cpu();
            int n = 0;
            while (n == 0 || cpu() - t0 < 0.1) {
                for (int r = 0; r < rows; r++) tr->vec_dot(cols, out + r, 0, w + rb * (size_t)r, 0, y, 0, 1);
                n++;
            }
            const double dt = (cpu() - t0) / n;
            if (dt < best) best = dt;
        }
        printf("| %s | %dx%d | 1 | %.3f | %.1f | %.1f |\n", ggml_type_name(t), rows, cols, best * 1e3,
               (double)rb * rows / best / 1e9, 2.0 * rows * cols / best / 1e9);
        free(w);
        free(y);
    }
    free(xf);
    free(out);
    return 0;
}
