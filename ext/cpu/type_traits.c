/* The weight types' table (type_traits.h says what a row holds) and the binding of a weight's kernels from it.
 *
 * Adding a weight type: its WT_ value (inferd.h, and the name in ext/_cpu.pyx's WEIGHT_TYPES), its layout in tile.h
 * when its tile is made of tile.h's pieces, its kernel file (or its cases in the kernel templates: qtile.h,
 * qpair512.c, qdecode512.c, matmul.c's scalar kernel, repack.c), then one QUANT_KERNELS line and one row below.
 * Nothing else in the engine looks at a weight's type: sizes, repacking, dequantizing and the matmul's kernels all
 * come from here (docs/design/weight-types.md). */
#include <pthread.h>
#include <stddef.h>
#include "type_traits.h"

/* ---- what each type's files define (repack.c, matmul.c, matmul_simd.c, qpair512.c, qdecode512.c) ---- */
#if defined(__x86_64__)
#define SIMD_KERNELS(name)                                                                                        \
    extern const qkernel_t qtile_##name##_avx2, qtile_##name##_avx512vnni, qtile_##name##_avxvnni;              \
    void qpair_##name(const uint8_t *ta, const uint8_t *tb, int nb, const block_q8x *xq, int ntok, float *y,     \
                      int ldy, int nrows, int accumulate, int amx);
#define DECODE_KERNEL(name)                                                                                       \
    void qdecode_##name(const uint8_t *base, size_t tile_bytes, int ntiles, int nb, const block_q8x *xq,         \
                        int nb32, int ntok, float *y, int ldy, int nrows_last, int accumulate, int prefetch);
#define TILES(name) {[PATH_AVX2] = &qtile_##name##_avx2, [PATH_AVX512VNNI] = &qtile_##name##_avx512vnni,         \
                     [PATH_AVXVNNI] = &qtile_##name##_avxvnni}
#define PAIR(name) qpair_##name
#define DECODE(name) qdecode_##name
#define FLOAT_ROWS {float_rows_scalar, float_rows_avx2, float_rows_avx2, float_rows_avx2}
#else
#define SIMD_KERNELS(name)
#define DECODE_KERNEL(name)
#define TILES(name) {NULL}
#define PAIR(name) NULL
#define DECODE(name) NULL
#define FLOAT_ROWS {float_rows_scalar}
#endif
#define BASE_KERNELS(name)                                                                                        \
    void repack_##name(const repack_t *f, int64_t begin, int64_t end);                                           \
    void dequant_##name(const uint8_t *data, int cols, int row, float *out);                                     \
    void qscalar_##name(const uint8_t *base, int nb, const block_q8x *xq, int nb32, int ntok, float *y, int ldy, \
                        int ycol, int nrows, int accumulate);
#define QUANT_KERNELS(name) BASE_KERNELS(name) SIMD_KERNELS(name)

void repack_rows(const repack_t *f, int64_t begin, int64_t end);
void quantize_row_q8_0(const float *x, int n, uint8_t *out);
void quantize_row_q4_0(const float *x, int n, uint8_t *out);
void quantize_row_q4_1(const float *x, int n, uint8_t *out);
void dequant_f32(const uint8_t *data, int cols, int row, float *out);
void dequant_f16(const uint8_t *data, int cols, int row, float *out);
void dequant_bf16(const uint8_t *data, int cols, int row, float *out);
void float_rows_scalar(const weight_t *w, int row0, int nrows, int ntok, const float *x, float *y, int ldy, int ycol,
                       int accumulate);
void float_rows_avx2(const weight_t *w, int row0, int nrows, int ntok, const float *x, float *y, int ldy, int ycol,
                     int accumulate);
QUANT_KERNELS(q4_0) DECODE_KERNEL(q4_0)
QUANT_KERNELS(q4_1) DECODE_KERNEL(q4_1)
QUANT_KERNELS(q5_0) DECODE_KERNEL(q5_0)
QUANT_KERNELS(q5_1) DECODE_KERNEL(q5_1)
QUANT_KERNELS(q8_0)
QUANT_KERNELS(q4_k) DECODE_KERNEL(q4_k)
QUANT_KERNELS(q5_k) DECODE_KERNEL(q5_k)
QUANT_KERNELS(q6_k) DECODE_KERNEL(q6_k)
QUANT_KERNELS(q3_k) DECODE_KERNEL(q3_k)
QUANT_KERNELS(q2_k) DECODE_KERNEL(q2_k)
QUANT_KERNELS(iq4_nl) DECODE_KERNEL(iq4_nl)
QUANT_KERNELS(iq4_xs) DECODE_KERNEL(iq4_xs)
QUANT_KERNELS(mxfp4)
QUANT_KERNELS(iq2_xxs)
QUANT_KERNELS(iq2_xs)
QUANT_KERNELS(iq2_s)
QUANT_KERNELS(iq3_xxs)
QUANT_KERNELS(iq3_s)
QUANT_KERNELS(iq1_s)
QUANT_KERNELS(iq1_m)
QUANT_KERNELS(tq1_0)
QUANT_KERNELS(tq2_0)

/* ---- the table: one row per type ---- */
#define FLOAT_ROW(NAME, BYTES, DEQUANT)                                                                            \
    {NAME, 0, 1, BYTES, 0, repack_rows, DEQUANT, NULL, FLOAT_ROWS, NULL, {NULL}, NULL, NULL}
#define QUANT_ROW(NAME, name, COLS, GGUF_BYTES, TILE_BYTES, QUANTIZE_FN, DECODE_FN)                               \
    {NAME, 1, COLS, GGUF_BYTES, TILE_BYTES, repack_##name, dequant_##name, QUANTIZE_FN, {NULL}, qscalar_##name,    \
     TILES(name), PAIR(name), DECODE_FN}
static const type_traits_t TYPE_TRAITS[NUM_WEIGHT_TYPES] = {
    /* FLOAT_ROW(name, bytes per value, dequantize); QUANT_ROW(name, its functions' suffix, values per block, GGUF
     * block bytes, tile block bytes, its quantizer or NULL, its zmm decode kernel or NULL) */
    [WT_F32] = FLOAT_ROW("F32", 4, dequant_f32),
    [WT_F16] = FLOAT_ROW("F16", 2, dequant_f16),
    [WT_BF16] = FLOAT_ROW("BF16", 2, dequant_bf16),
    [WT_Q4_0] = QUANT_ROW("Q4_0", q4_0, QK, 18, TB_Q4_0, quantize_row_q4_0, DECODE(q4_0)),
    [WT_Q4_1] = QUANT_ROW("Q4_1", q4_1, QK, 20, TB_Q4_1, quantize_row_q4_1, DECODE(q4_1)),
    [WT_Q5_0] = QUANT_ROW("Q5_0", q5_0, QK, 22, TB_Q5_0, NULL, DECODE(q5_0)),
    [WT_Q5_1] = QUANT_ROW("Q5_1", q5_1, QK, 24, TB_Q5_1, NULL, DECODE(q5_1)),
    [WT_Q8_0] = QUANT_ROW("Q8_0", q8_0, QK, 34, TB_Q8_0, quantize_row_q8_0, NULL),   /* decodes on the ymm tiles */
    [WT_Q4_K] = QUANT_ROW("Q4_K", q4_k, QK_K, 144, TB_Q4_K, NULL, DECODE(q4_k)),
    [WT_Q5_K] = QUANT_ROW("Q5_K", q5_k, QK_K, 176, TB_Q5_K, NULL, DECODE(q5_k)),
    [WT_Q6_K] = QUANT_ROW("Q6_K", q6_k, QK_K, 210, TB_Q6_K, NULL, DECODE(q6_k)),
    [WT_Q2_K] = QUANT_ROW("Q2_K", q2_k, QK_K, 84, TB_Q2_K, NULL, DECODE(q2_k)),
    [WT_Q3_K] = QUANT_ROW("Q3_K", q3_k, QK_K, 110, TB_Q3_K, NULL, DECODE(q3_k)),
    [WT_IQ4_NL] = QUANT_ROW("IQ4_NL", iq4_nl, QK, 18, TB_IQ4_NL, NULL, DECODE(iq4_nl)),
    [WT_IQ4_XS] = QUANT_ROW("IQ4_XS", iq4_xs, QK_K, 136, TB_IQ4_XS, NULL, DECODE(iq4_xs)),
    [WT_MXFP4] = QUANT_ROW("MXFP4", mxfp4, QK, 17, TB_MXFP4, NULL, NULL),
    [WT_IQ2_XXS] = QUANT_ROW("IQ2_XXS", iq2_xxs, QK_K, 66, TB_IQ2_XXS, NULL, NULL),
    [WT_IQ2_XS] = QUANT_ROW("IQ2_XS", iq2_xs, QK_K, 74, TB_IQ2_XS, NULL, NULL),
    [WT_IQ2_S] = QUANT_ROW("IQ2_S", iq2_s, QK_K, 82, TB_IQ2_S, NULL, NULL),
    [WT_IQ3_XXS] = QUANT_ROW("IQ3_XXS", iq3_xxs, QK_K, 98, TB_IQ3_XXS, NULL, NULL),
    [WT_IQ3_S] = QUANT_ROW("IQ3_S", iq3_s, QK_K, 110, TB_IQ3_S, NULL, NULL),
    [WT_IQ1_S] = QUANT_ROW("IQ1_S", iq1_s, QK_K, 50, TB_IQ1_S, NULL, NULL),
    [WT_IQ1_M] = QUANT_ROW("IQ1_M", iq1_m, QK_K, 56, TB_IQ1_M, NULL, NULL),
    [WT_TQ1_0] = QUANT_ROW("TQ1_0", tq1_0, QK_K, 54, TB_TQ1_0, NULL, NULL),
    [WT_TQ2_0] = QUANT_ROW("TQ2_0", tq2_0, QK_K, 66, TB_TQ2_0, NULL, NULL),
};

const type_traits_t *type_traits(int type) {
    return type >= 0 && type < NUM_WEIGHT_TYPES && TYPE_TRAITS[type].name ? &TYPE_TRAITS[type] : NULL;
}

/* ---- the questions about a type, answered from its row ---- */
const char *weight_type_name(int type) {
    const type_traits_t *tt = type_traits(type);
    return tt ? tt->name : NULL;
}

int weight_is_quantized(int type) {
    const type_traits_t *tt = type_traits(type);
    return tt && tt->quantized;
}

int weight_block_cols(int type) {
    const type_traits_t *tt = type_traits(type);
    return tt && tt->quantized ? tt->block_cols : QK;
}

size_t weight_tile_block_bytes(int type) {
    const type_traits_t *tt = type_traits(type);
    return tt ? tt->tile_block_bytes : 0;
}

size_t gguf_row_bytes(int type, int cols) {
    const type_traits_t *tt = type_traits(type);
    return tt ? (size_t)(cols / tt->block_cols) * tt->gguf_block_bytes : 0;
}

/* ---- binding ---- */
int path_has_zmm_vnni(int path) {
#if defined(__x86_64__)
    static int has = -1;
    if (has < 0) {
        __builtin_cpu_init();
        has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
              __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
    }
    return has && (path == PATH_AVX512VNNI || path == PATH_AVXVNNI);
#else
    (void)path;
    return 0;
#endif
}

static weight_kernels_t bound[NUM_WEIGHT_TYPES][NUM_PATHS];
static pthread_once_t bound_once = PTHREAD_ONCE_INIT;

static void bind_all(void) {
    for (int type = 0; type < NUM_WEIGHT_TYPES; type++)
        for (int path = 0; path < NUM_PATHS; path++) {
            const type_traits_t *tt = type_traits(type);
            weight_kernels_t *k = &bound[type][path];
            if (!tt) continue;
            if (!tt->quantized) {
                k->float_rows = tt->float_rows[path] ? tt->float_rows[path] : tt->float_rows[PATH_SCALAR];
                continue;
            }
            k->tiles = tt->tiles[path];
            k->scalar = k->tiles ? NULL : tt->scalar;
            k->pair = path_has_zmm_vnni(path) ? tt->pair : NULL;
            k->decode = path_has_zmm_vnni(path) ? tt->decode : NULL;
        }
}

const weight_kernels_t *weight_kernels_for(int type, int path) {
    pthread_once(&bound_once, bind_all);
    if (type < 0 || type >= NUM_WEIGHT_TYPES || path < 0 || path >= NUM_PATHS) return NULL;
    return &bound[type][path];
}
