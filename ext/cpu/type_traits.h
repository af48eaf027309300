/* The weight types' traits: one row per type (type_traits.c) holding what the engine knows of it, in the spirit of
 * ggml's type_traits_cpu: its GGUF block, its tile block, how its GGUF rows become tiles and a row of tiles floats
 * again, and its matmul kernels on each SIMD path. A weight binds its segments' kernels from the row when it is
 * built (weight_bind_kernels): the matmul then calls what it holds instead of choosing per tile. */
#ifndef INFERD_TYPE_TRAITS_H
#define INFERD_TYPE_TRAITS_H

#include "inferd.h"
#include "tile.h"

#define NUM_PATHS (PATH_AVXVNNI + 1)

/* a repack job: `src_rows` GGUF rows (row i at src + i * gguf_row_bytes) into segment seg of w, as weight_fill says */
typedef struct {
    weight_t *w;
    const uint8_t *src;
    int src_rows, dst_row0, group, group_stride, seg;
} repack_t;
/* the weight row source row i goes to */
static inline int repack_dst_row(const repack_t *f, int64_t i) {
    return f->dst_row0 + (int)(i / f->group) * f->group_stride + (int)(i % f->group);
}

/* source rows [begin, end) of the job (repack.c) */
typedef void (*repack_fn)(const repack_t *job, int64_t begin, int64_t end);
/* row `row` of a segment whose layout starts at data, cols values, into out (repack.c) */
typedef void (*dequant_fn)(const uint8_t *data, int cols, int row, float *out);
/* the scalar path's kernel of a quantized type: ntok tokens against the tile at base (tile.h's qtile_fn arguments,
 * all tokens in one call; matmul.c) */
typedef void (*qscalar_fn)(const uint8_t *base, int nb, const block_q8x *xq, int nb32, int ntok, float *y, int ldy,
                           int ycol, int nrows, int accumulate);
/* one row of n floats into GGUF blocks (quant.c: the types the engine quantizes for tests and tools) */
typedef void (*quantize_row_fn)(const float *x, int n, uint8_t *out);
/* a float type's kernel: rows [row0, row0 + nrows) of w for ntok tokens into y[t * ldy + ycol + r] (matmul.c) */
typedef void (*float_rows_fn)(const weight_t *w, int row0, int nrows, int ntok, const float *x, float *y, int ldy,
                              int ycol, int accumulate);

typedef struct {
    const char *name;
    int quantized;               /* 0: kept row-major, rows as in the file */
    int block_cols;              /* values per GGUF block (== per tile block); float types: 1 */
    size_t gguf_block_bytes;     /* float types: bytes per value */
    size_t tile_block_bytes;     /* tile.h's TB_*; 0 for float types */
    repack_fn repack;
    dequant_fn dequant_row;
    quantize_row_fn quantize_row;   /* NULL: none */
    /* kernels per path (PATH_*): float types have float_rows, quantized ones scalar (PATH_SCALAR) and tiles (the SIMD
     * paths); pair and decode are the AVX-512 VNNI kernels the VNNI paths add where the CPU has that (NULL: none) */
    float_rows_fn float_rows[NUM_PATHS];
    qscalar_fn scalar;
    const qkernel_t *tiles[NUM_PATHS];
    qpair_fn pair;               /* prefill over pairs of tiles (qpair512.c) */
    qdecode_fn decode;           /* decode over pairs of tiles (qdecode512.c) */
} type_traits_t;

const type_traits_t *type_traits(int type);   /* NULL for a type outside the table */

/* What a weight segment of one type calls on one path of this CPU: the row's kernels for that path, the AVX-512 ones
 * only where the path is a VNNI one and the CPU has AVX-512 VNNI (those give the same bits as the ymm ones). */
struct weight_kernels {
    float_rows_fn float_rows;    /* float types */
    qscalar_fn scalar;           /* quantized types on the scalar path */
    const qkernel_t *tiles;      /* quantized types on a SIMD path */
    qpair_fn pair;
    qdecode_fn decode;
};
typedef struct weight_kernels weight_kernels_t;
const weight_kernels_t *weight_kernels_for(int type, int path);

/* whether `path` runs the AVX-512 VNNI kernels on this CPU (a VNNI path, and the CPU has AVX-512 F, BW, VL, VNNI) */
int path_has_zmm_vnni(int path);

#endif
