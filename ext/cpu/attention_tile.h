/* What attention.c's run over the cache and the tile kernels of each cache format (attention.c's f16,
 * attention_bf16.c's bf16) share: a tile of query rows meeting one block's keys, and a path's kernels for it. */
#ifndef INFERD_ATTENTION_TILE_H
#define INFERD_ATTENTION_TILE_H
#include <stdint.h>

#define ROW_TILE 6                /* query rows per register tile */

/* A tile: up to ROW_TILE rows of one KV head, each with its query, its scores row (KV_BLOCK floats, indexed by the
 * key's place in the block) and its segment output. Keys [j0, j1) of the block are computed for all of them, from
 * k (hd, KV_BLOCK) and v (KV_BLOCK, hd): the f32 tiles, or, when f16 is set (a head with a single tile in the block,
 * as in decode), the cache's f16 slices themselves, converted as they are loaded (the same values: f16 -> f32 is
 * exact). pf_k/pf_v: the next block's slices, fetched on the way (f16 tiles only), or NULL. Over the bf16 cache,
 * k and v are its slices in their pair layouts and qp the rows' queries rounded into pairs (attention_bf16.c). */
typedef struct {
    int nr, j0, j1, f16;
    const float *q[ROW_TILE];
    const uint32_t *qp[ROW_TILE];
    float *s[ROW_TILE];
    float *o[ROW_TILE];
    const void *k, *v;
    const uint16_t *pf_k, *pf_v;
} tile_t;

typedef struct {
    void (*convert_k)(const uint16_t *, float *, int, int, int, const uint16_t *);
    void (*convert_v)(const uint16_t *, float *, int, int, int, const uint16_t *);
    void (*scores)(const tile_t *, int, float);
    void (*accumulate_v)(const tile_t *, int);
    float (*max_of)(const float *, int);
    float (*weights)(float *, int, float);
    void (*merge_cols)(float *, const float *, float, float, int);
    int direct;                       /* the tile kernels read f16 (scalar: always the f32 tiles) */
} kernels_t;

/* the bf16 cache's scores and accumulate_v for the active path, in place of k's (attention_bf16.c) */
void attention_bf16_kernels(kernels_t *k);
/* a query row rounded into the pairs the bf16 kernels take: qp[i] = (bf16 q[2i], bf16 q[2i + 1]) */
void attention_bf16_pairs(const float *q, uint32_t *qp, int head_dim);
/* after a segment's output o was scaled down: values too small for the bf16 kernels' exact arithmetic become 0 */
void attention_bf16_flush(float *o, int head_dim);
#endif
