/* Weights in the engine's layout: sizes, building one (its memory, its rows repacked by its type's row of the
 * type-traits table, its kernels bound), one row back to floats (the embedding lookup, tests). The work that differs
 * by type lies in the table (type_traits.c) and the files it names (repack.c, the kernels). */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include "inferd.h"
#include "type_traits.h"

/* ---- sizes ---- */
size_t weight_layout_bytes(int type, int rows, int cols) {
    const type_traits_t *tt = type_traits(type);
    if (rows <= 0 || cols <= 0 || !tt) return 0;
    if (tt->quantized ? cols % tt->block_cols : cols % 8) return 0;
    if (!tt->quantized) return gguf_row_bytes(type, cols) * (size_t)rows;
    return (size_t)((rows + TILE_ROWS - 1) / TILE_ROWS) * (cols / tt->block_cols) * tt->tile_block_bytes;
}

size_t weight_layout_bytes_seg(int nseg, const int *types, const int *rows, int cols) {
    if (nseg < 1 || nseg > MAX_SEGMENTS) return 0;
    if (nseg == 1) return weight_layout_bytes(types[0], rows[0], cols);
    size_t total = 0;
    for (int i = 0; i < nseg; i++) {
        size_t n = weight_layout_bytes(types[i], rows[i], cols);
        if (!n || !weight_is_quantized(types[i]) || (i < nseg - 1 && rows[i] % TILE_ROWS)) return 0;
        total += n;
    }
    return total;
}

void weight_bind_kernels(weight_t *w, int path) {
    w->path = path;
    for (int i = 0; i < w->nseg; i++) w->seg[i].kernels = weight_kernels_for(w->seg[i].type, path);
}

/* ---- building weights ---- */
static int weight_setup(weight_t *w, int nseg, const int *types, const int *rows, int cols, uint8_t *dst) {
    memset(w, 0, sizeof *w);
    size_t nbytes = weight_layout_bytes_seg(nseg, types, rows, cols);
    if (!nbytes) return -1;
    w->type = types[0]; w->cols = cols; w->nbytes = nbytes; w->nseg = nseg;
    size_t off = 0;
    for (int i = 0; i < nseg; i++) {
        w->seg[i].type = types[i]; w->seg[i].row0 = w->rows; w->seg[i].offset = off;
        w->rows += rows[i];
        off += weight_layout_bytes(types[i], rows[i], cols);
    }
    weight_bind_kernels(w, cpu_path());
    w->padded_rows = weight_is_quantized(w->type) ? (w->rows + TILE_ROWS - 1) / TILE_ROWS * TILE_ROWS : w->rows;
    w->owned = dst == NULL;
    w->data = dst ? dst : aligned_alloc(64, (nbytes + 63) & ~(size_t)63);
    if (!w->data) return -2;
    /* padding rows get zero scales, so they compute 0: only a segment's last tile has them (all of the memory is
     * written by weight_fill otherwise, and zeroing it first would touch every page twice) */
    for (int i = 0; i < nseg && weight_is_quantized(types[i]); i++)
        if (rows[i] % TILE_ROWS) {
            size_t tile = (size_t)(cols / weight_block_cols(types[i])) * weight_tile_block_bytes(types[i]);
            memset(w->data + w->seg[i].offset + weight_layout_bytes(types[i], rows[i], cols) - tile, 0, tile);
        }
    return 0;
}

int weight_init_seg(weight_t *w, int nseg, const int *types, const int *rows, int cols, uint8_t *dst) {
    return weight_setup(w, nseg, types, rows, cols, dst);
}

#if defined(__linux__) && !defined(MADV_POPULATE_WRITE)
#define MADV_POPULATE_WRITE 23    /* older C headers than kernels: a kernel before 5.14 refuses it, and that is all */
#endif

/* the pages of the segment's rows [first, last] */
static void populate_rows(const weight_t *w, int seg, int first, int last) {
#if defined(__linux__)
    const int type = w->seg[seg].type, quantized = weight_is_quantized(type);
    const size_t row_bytes = quantized ? weight_layout_bytes(type, TILE_ROWS, w->cols) / TILE_ROWS
                                       : gguf_row_bytes(type, w->cols);
    if (quantized) first -= first % TILE_ROWS, last += TILE_ROWS - 1 - last % TILE_ROWS;
    uintptr_t lo = (uintptr_t)(w->data + w->seg[seg].offset) + (size_t)(first - w->seg[seg].row0) * row_bytes;
    uintptr_t hi = lo + (size_t)(last - first + 1) * row_bytes, page = (uintptr_t)sysconf(_SC_PAGESIZE);
    lo &= ~(page - 1);
    madvise((void *)lo, hi - lo, MADV_POPULATE_WRITE);
#else
    (void)w; (void)seg; (void)first; (void)last;
#endif
}

static void fill_rows(void *arg, int64_t begin, int64_t end, int thread) {
    const repack_t *f = arg;
    (void)thread;
    /* the destination's pages in one call before the rows are written, rather than a fault (a trap into the
     * kernel) at each page's first store */
    populate_rows(f->w, f->seg, repack_dst_row(f, begin), repack_dst_row(f, end - 1));
    type_traits(f->w->seg[f->seg].type)->repack(f, begin, end);
}

int weight_fill(weight_t *w, const void *src, int src_rows, int dst_row0, int group, int group_stride,
                struct pool *pool) {
    if (src_rows < 1 || group < 1 || src_rows % group || dst_row0 < 0) return -1;
    int first = dst_row0, last = dst_row0 + (src_rows / group - 1) * group_stride + group - 1;
    if (last >= w->rows) return -1;
    int seg = 0;
    while (seg + 1 < w->nseg && w->seg[seg + 1].row0 <= first) seg++;
    if (seg + 1 < w->nseg && last >= w->seg[seg + 1].row0) return -1;
    repack_t f = {w, src, src_rows, dst_row0, group, group_stride, seg};
    if (pool) pool_run(pool, src_rows, 64, fill_rows, &f);
    else fill_rows(&f, 0, src_rows, 0);
    return 0;
}

size_t weight_fill_jobs(const weight_fill_job_t *jobs, size_t n, struct pool *pool, double seconds, int *failed) {
    const double start = now_seconds();
    *failed = 0;
    for (size_t i = 0; i < n; i++) {
        const weight_fill_job_t *j = &jobs[i];
        if (weight_fill(j->w, j->src, j->src_rows, j->dst_row0, j->group, j->group_stride, pool)) {
            *failed = 1;
            return i;
        }
        if (j->drop) madvise(j->drop, j->drop_bytes, MADV_DONTNEED);
        if (seconds > 0 && now_seconds() - start >= seconds) return i + 1;
    }
    return n;
}

int weight_init(weight_t *w, int type, int rows, int cols, const void *src, size_t src_bytes, uint8_t *dst) {
    if (rows <= 0 || src_bytes != gguf_row_bytes(type, cols) * (size_t)rows) { memset(w, 0, sizeof *w); return -1; }
    int rc = weight_setup(w, 1, &type, &rows, cols, dst);
    if (rc) return rc;
    return weight_fill(w, src, rows, 0, rows, rows, NULL);
}

void weight_free(weight_t *w) {
    if (w->owned) free(w->data);
    w->data = NULL;
}

/* ---- one row back to floats ---- */
void weight_dequant_row(const weight_t *w, int row, float *out) {
    int seg = 0;
    while (seg + 1 < w->nseg && w->seg[seg + 1].row0 <= row) seg++;
    type_traits(w->seg[seg].type)->dequant_row(w->data + w->seg[seg].offset, w->cols, row - w->seg[seg].row0, out);
}
