/* One KV block's bytes out of the cache and back in: the prompt cache on disk (inferd/engine/prompt_cache_disk.py)
 * saves prefix blocks across restarts; and one block into another: a prefix hit within a block (kv_cache.py). A
 * block's image is, for each layer in order, its K slab then its V slab, each (n_kv_heads, slice) in the pool's own
 * format (f16 with K transposed, bf16 pairs, or q8_0 with its scales), so a copy in and out is a plain memcpy and the
 * image is only meaningful to a context of the same model and kv_dtype. */
#include <string.h>

#include "inferd.h"

/* bytes of one (layer, block) slab of K, or of V */
static size_t kv_slab_bytes(const context_t *c) {
    const model_config_t *cfg = &c->model->cfg;
    if (c->kv_dtype == KV_Q8_0) return (size_t)cfg->n_kv_heads * kvq8_slice_bytes(cfg->head_dim);
    return (size_t)cfg->n_kv_heads * cfg->head_dim * KV_BLOCK * sizeof(uint16_t);
}

size_t kv_block_bytes(const context_t *c) { return 2 * (size_t)model_kv_layers(c->model) * kv_slab_bytes(c); }

/* the start of (layer, block)'s K (is_k) or V slab */
static uint8_t *kv_slab(const context_t *c, int layer, int block, int is_k) {
    size_t slab = kv_slab_bytes(c), at = ((size_t)layer * c->num_kv_blocks + block) * slab;
    if (c->kv_dtype == KV_Q8_0) return (is_k ? c->k_q8 : c->v_q8) + at;
    return (uint8_t *)(is_k ? c->k_cache : c->v_cache) + at;
}

int kv_block_read(const context_t *c, int block, uint8_t *out, size_t out_len) {
    if (block < 0 || block >= c->num_kv_blocks) return KV_IO_BAD_BLOCK;
    if (out_len != kv_block_bytes(c)) return KV_IO_BAD_LENGTH;
    size_t slab = kv_slab_bytes(c);
    for (int l = 0; l < model_kv_layers(c->model); l++) {
        memcpy(out, kv_slab(c, l, block, 1), slab);
        memcpy(out + slab, kv_slab(c, l, block, 0), slab);
        out += 2 * slab;
    }
    return KV_IO_OK;
}

int kv_block_write(context_t *c, int block, const uint8_t *in, size_t in_len) {
    if (block < 0 || block >= c->num_kv_blocks) return KV_IO_BAD_BLOCK;
    if (in_len != kv_block_bytes(c)) return KV_IO_BAD_LENGTH;
    size_t slab = kv_slab_bytes(c);
    for (int l = 0; l < model_kv_layers(c->model); l++) {
        memcpy(kv_slab(c, l, block, 1), in, slab);
        memcpy(kv_slab(c, l, block, 0), in + slab, slab);
        in += 2 * slab;
    }
    return KV_IO_OK;
}

int kv_block_copy(context_t *c, int src, int dst) {
    if (src < 0 || src >= c->num_kv_blocks || dst < 0 || dst >= c->num_kv_blocks) return KV_IO_BAD_BLOCK;
    if (src == dst) return KV_IO_OK;
    size_t slab = kv_slab_bytes(c);
    for (int l = 0; l < model_kv_layers(c->model); l++) {
        memcpy(kv_slab(c, l, dst, 1), kv_slab(c, l, src, 1), slab);
        memcpy(kv_slab(c, l, dst, 0), kv_slab(c, l, src, 0), slab);
    }
    return KV_IO_OK;
}
