/* The engine's 8-row tile layouts of the quantized types, shared by weight.c (repacking, dequantizing) and the
 * kernels (matmul.c, qtile.h).
 *
 * A tile holds 8 rows (lane r = row 8t + r); along the columns it is a sequence of tile blocks of 32 columns
 * (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) or of 256 columns (the K-quants). The pieces:
 *   group   128 bytes, 32 values of 8 rows, 4 or 5 or 6-bit values' low nibbles: byte 32p + 4r + e holds value 4p+e
 *           of row r in its low half and value 16+4p+e in its high half (p, e < 4). Loaded as 4 vectors, each
 *           split into its low and high nibbles, it gives the 8 vectors wv[0..7] whose lane r holds values
 *           4j..4j+3 of row r: the activation's bytes 4j..4j+3 broadcast meet them in one dpbusd/maddubs.
 *   hbit     32 bytes, the 5th bit of a group's values: byte 4r + e, bit p = value 4p+e, bit 4+p = value 16+4p+e.
 *   h2bit    64 bytes, bits 4-5 of a group's values: byte 4r + e, bits 2p..2p+1 = value 4p+e; then byte 32+4r+e
 *           the same for value 16+4p+e.
 *   f16[8]   16 bytes, one f16 per row.
 *   q2group   64 bytes, 32 values of 8 rows, their low 2 bits: byte 32v + 4r + e, bits 2k..2k+1 = value 4j+e of
 *           row r, j = 4v + k. Loaded as 2 vectors, each shifted by 0, 2, 4, 6 and masked, it gives wv[0..7].
 *   Q3_K's third bit lies in an hbit piece (bit j of byte 4r + e = value 4j+e, as for the 5-bit types).
 * Tile blocks:
 *   Q4_0  d | group                                   value = d * (q - 8)
 *   Q4_1  d | m | group                               value = d * q + m
 *   Q5_0  d | hbit | group                            value = d * (q - 16)
 *   Q5_1  d | m | hbit | group                        value = d * q + m
 *   Q8_0  d | qs[256] (byte 32j + 4r + e = value 4j+e of row r, int8)
 *   Q4_K  d | dmin | 8 x (sc[8] | mn[8]) | 8 x group               sub-block s (values 32s..32s+31):
 *   Q5_K  d | dmin | 8 x (sc[8] | mn[8]) | 8 x (hbit | group)      value = d*sc[s] * q - dmin*mn[s]
 *   Q6_K  d | 16 x sc[8] (int8) | 8 x (h2bit | group)              value = d * sc[k] * (q - 32), k = value / 16
 *   Q3_K  d | 16 x sc[8] (int8) | 8 x (hbit | q2group)            value = d * sc[k] * (q - 4), k = value / 16
 *   Q2_K  d | dmin | 8 x scm[16] | 8 x q2group                     value = d * sc[k] * q - dmin * mn[k]; scm byte
 *           r (8 + r) holds row r's sc | mn << 4 of the sub-block's first (second) 16 values, as GGUF packs them
 *   IQ4_NL  d | group                                 value = d * IQ4_VALUES[q]
 *   IQ4_XS  d | 8 x sc[8] (int8) | 8 x group          value = d * sc[s] * IQ4_VALUES[q]
 *   MXFP4   e[8] | group                              value = 2^(e - 128) * MXFP4_VALUES[q]
 *           e: one E8M0 byte per row (GGUF's, as it is); MXFP4_VALUES are e2m1's values doubled (integers)
 *   IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M, TQ1_0, TQ2_0: the 8 rows' GGUF blocks of 256 values one
 *           after another (lane r's at r * its GGUF block bytes), the file's bytes unchanged: their codebook indices,
 *           sign bits and base-3 digits are expanded by the kernels (iq_lanes.h has the formulas)
 * The 6-bit scales and mins of Q4_K/Q5_K are unpacked into bytes at load, so the kernels never decode them; so are
 * Q3_K's and IQ4_XS's 6-bit scales (into int8, their offset 32 taken off).
 * The sizes are the GGUF sizes (Q6_K, Q2_K, MXFP4, 32-value types) or a few bytes per 8 rows more (Q4_K, Q5_K: 32 bytes,
 * 1.6%/2.2%; Q3_K: 32 bytes, 3.6%; IQ4_XS: 16 bytes, 1.5%); the types that keep their blocks, exactly the GGUF sizes. */
#ifndef INFERD_TILE_H
#define INFERD_TILE_H

#include <string.h>
#include "inferd.h"
#include "iq_lanes.h"

enum { TB_Q4_0 = 144, TB_Q4_1 = 160, TB_Q5_0 = 176, TB_Q5_1 = 192, TB_Q8_0 = 272,
       TB_Q4_K = 32 + 8 * 16 + 8 * 128, TB_Q5_K = 32 + 8 * 16 + 8 * 160, TB_Q6_K = 16 + 16 * 8 + 8 * 192,
       TB_Q3_K = 16 + 16 * 8 + 8 * 96, TB_Q2_K = 32 + 8 * 16 + 8 * 64, TB_IQ4_NL = 144, TB_IQ4_XS = 16 + 8 * 8 + 8 * 128,
       TB_MXFP4 = 8 + 128,
       /* 8 GGUF blocks (iq_lanes.h) */
       TB_IQ2_XXS = 8 * 66, TB_IQ2_XS = 8 * 74, TB_IQ2_S = 8 * 82, TB_IQ3_XXS = 8 * 98, TB_IQ3_S = 8 * 110,
       TB_IQ1_S = 8 * 50, TB_IQ1_M = 8 * 56, TB_TQ1_0 = 8 * 54, TB_TQ2_0 = 8 * 66 };

/* the 16 values of IQ4_NL's and IQ4_XS's 4-bit codes (GGUF's non-linear grid): one byte shuffle maps 32 codes */
static const int8_t IQ4_VALUES[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
/* MXFP4's 4-bit codes: e2m1 (sign, 2-bit exponent, 1-bit mantissa) times two, so that they are integers; the
 * block's scale is halved to match (mxfp4_scale) */
static const int8_t MXFP4_VALUES[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
/* the same values plus MXFP4_OFFSET, all >= 0: the AVX2 kernel's unsigned maddubs operand (it subtracts
 * MXFP4_OFFSET * sum(x) after) */
#define MXFP4_OFFSET 12
static const int8_t MXFP4_PLUS_OFFSET[16] = {12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0};

/* Where a tile block's pieces lie, per quantized type (the drawing above as numbers): bytes of the tile block;
 * 32-value blocks in it (1, or 8 for the K-quants); block s's group at group + s * group_step, its hbit or h2bit piece
 * at hbits + s * hbits_step (0: none); the K-quants' scales of block s at scales + s * scales_step (the group or
 * q2group is the type's; its 2-bit types have a q2group). The kernels read it with their type a constant, so that
 * every offset folds into an immediate. */
typedef struct { uint16_t bytes, nsub, group, group_step, hbits, hbits_step, scales, scales_step; } tile_layout_t;
static const tile_layout_t TILE_LAYOUT[NUM_WEIGHT_TYPES] = {
    /*             bytes      nsub  group  step  hbits  step  scales  step */
    [WT_Q4_0] =   {TB_Q4_0,   1,    16,    0,    0,     0,    0,      0},
    [WT_Q4_1] =   {TB_Q4_1,   1,    32,    0,    0,     0,    0,      0},
    [WT_Q5_0] =   {TB_Q5_0,   1,    48,    0,    16,    0,    0,      0},
    [WT_Q5_1] =   {TB_Q5_1,   1,    64,    0,    32,    0,    0,      0},
    [WT_Q8_0] =   {TB_Q8_0,   1,    0,     0,    0,     0,    0,      0},    /* d | qs: no pieces */
    [WT_Q4_K] =   {TB_Q4_K,   8,    160,   128,  0,     0,    32,     16},
    [WT_Q5_K] =   {TB_Q5_K,   8,    192,   160,  160,   160,  32,     16},
    [WT_Q6_K] =   {TB_Q6_K,   8,    208,   192,  144,   192,  16,     16},
    [WT_Q3_K] =   {TB_Q3_K,   8,    176,   96,   144,   96,   16,     16},
    [WT_Q2_K] =   {TB_Q2_K,   8,    160,   64,   0,     0,    32,     16},
    [WT_IQ4_NL] = {TB_IQ4_NL, 1,    16,    0,    0,     0,    0,      0},
    [WT_IQ4_XS] = {TB_IQ4_XS, 8,    80,    128,  0,     0,    16,     8},
    [WT_MXFP4] =  {TB_MXFP4,  1,    8,     0,    0,     0,    0,      0},
    /* each row's GGUF block whole (iq_lanes.h): no pieces */
    [WT_IQ2_XXS] = {TB_IQ2_XXS, 8,  0,     0,    0,     0,    0,      0},
    [WT_IQ2_XS] = {TB_IQ2_XS,   8,  0,     0,    0,     0,    0,      0},
    [WT_IQ2_S] =  {TB_IQ2_S,    8,  0,     0,    0,     0,    0,      0},
    [WT_IQ3_XXS] = {TB_IQ3_XXS, 8,  0,     0,    0,     0,    0,      0},
    [WT_IQ3_S] =  {TB_IQ3_S,    8,  0,     0,    0,     0,    0,      0},
    [WT_IQ1_S] =  {TB_IQ1_S,    8,  0,     0,    0,     0,    0,      0},
    [WT_IQ1_M] =  {TB_IQ1_M,    8,  0,     0,    0,     0,    0,      0},
    [WT_TQ1_0] =  {TB_TQ1_0,    8,  0,     0,    0,     0,    0,      0},
    [WT_TQ2_0] =  {TB_TQ2_0,    8,  0,     0,    0,     0,    0,      0},
};

/* the types whose 4-bit codes index a table of 16 signed values (one byte shuffle maps 32 codes) */
static inline int type_is_iq4(int type) { return type == WT_IQ4_NL || type == WT_IQ4_XS || type == WT_MXFP4; }
static inline const int8_t *code_values(int type) { return type == WT_MXFP4 ? MXFP4_VALUES : IQ4_VALUES; }
static inline int type_is_2bit(int type) { return type == WT_Q2_K || type == WT_Q3_K; }   /* values in a q2group */
/* the types whose block sum goes by halves of 16 values, each half's sum times its own integer scale */
static inline int type_by_halves(int type) { return type == WT_Q6_K || type_is_2bit(type) || type_keeps_blocks(type); }

/* Unsigned operands (maddubs, dpbusd) take values stored with an offset (Q4_0's q + 8, Q5_0's q + 16, MXFP4's
 * v + MXFP4_OFFSET, Q6_K's q + 32, Q3_K's q + 4) or shifted by one for the VNNI kernels (Q8_0's and IQ4's v + 128,
 * the codebook types' v + LANES_VNNI_OFFSET: qtile.h's load_lanes); a block sum then takes off the offset times the
 * activation's sum. These are the int32 values to add (or to start a dpbusd chain from): of a whole 32-value block
 * (offset_corr; 0 for the types without an offset), and of half h of a type_by_halves block (half_offset_corr). */
#define LANES_VNNI_OFFSET 64   /* every codebook grid value has |v| <= 62 */
static inline int32_t offset_corr(int type, const block_q8x *xb) {
    return type == WT_Q4_0 ? xb->q4_corr : type == WT_Q5_0 ? -16 * xb->isum
           : type == WT_Q8_0 || type == WT_IQ4_NL || type == WT_IQ4_XS ? xb->q8_corr
           : type == WT_MXFP4 ? -MXFP4_OFFSET * xb->isum : 0;
}
static inline int32_t half_offset_corr(int type, const block_q8x *xb, int h) {
    return type == WT_Q6_K ? xb->q6_corr[h] : type == WT_Q3_K ? -4 * xb->hsum[h]
           : type_keeps_blocks(type) ? -LANES_VNNI_OFFSET * xb->hsum[h] : 0;
}

static inline int type_is_k(int type) { return TILE_LAYOUT[type].nsub == 8; }

static inline size_t tile_block_bytes(int type) { return TILE_LAYOUT[type].bytes; }

/* A quantized tile kernel: ntok tokens (xq, token stride nb32 blocks; 1 <= ntok <= its qkernel_t's ntok) against the
 * tile at `base` of nb tile blocks; writes (or adds to) y[k * ldy + ycol + r] for its nrows rows. A type's qkernel_t
 * on a path (its row of the type-traits table) gives the most tokens a call takes (its block of accumulators). */
typedef void (*qtile_fn)(const uint8_t *base, int nb, const block_q8x *xq, int nb32, int ntok, float *y, int ldy,
                         int ycol, int nrows, int accumulate, int prefetch);
/* batch: all ntok tokens against one tile, or two adjacent ones (tb: the next tile, or NULL), unpacking each tile's
 * blocks once (NULL where that does not pay); nrows: the last tile's rows, the first's being whole when tb is given;
 * tile b's rows go 8 columns after tile a's */
typedef void (*qbatch_fn)(const uint8_t *ta, const uint8_t *tb, int nb, const block_q8x *xq, int nb32, int ntok,
                          float *y, int ldy, int ycol, int nrows, int accumulate);
/* group: one token against ntiles (1..QGROUP_TILES) adjacent tiles of one segment, tile_bytes apart, in lockstep;
 * y points at the first tile's row 0, the last tile stores nrows_last rows; prefetch: the first `prefetch` tiles from
 * base are the rest of the segment, which the decode prefetch below stays within (0 = none) */
typedef void (*qgroup_fn)(const uint8_t *base, size_t tile_bytes, int ntiles, int nb, const block_q8x *xq, float *y,
                          int nrows_last, int accumulate, int prefetch);
#define QGROUP_TILES 4

/* A decode group's software prefetch, issued one piece per step of its walk (a block, or a K-quant block's
 * sub-block), only within `limit` tiles from base (the rest of the segment; 0 = none). Which bytes:
 *   - short tiles (a row of 1536 Q4_K values is 6.9 KB): the next group's bytes in memory order, an equal piece per
 *     step, so that the prefetches walk memory as one stream a group ahead, which the memory system serves better
 *     than four streams (each tile's block of the next group);
 *   - long tiles (the 8960-wide down projection, 40 KB and more, where a group ahead is too far to stay in cache):
 *     each tile's own bytes DECODE_NEAR_BYTES ahead, going on into the tile a group further at its end.
 * The lines of a piece are a constant count (lines_group, lines_tile: constants where the kernel inlines this),
 * their addresses clamped to the limit's last line: no branch per line, which leaves the compiler's layout of the
 * kernel around it alone. The thresholds and distances, and the alternatives swept, are in
 * bench/results/decode_linear.md. */
#define DECODE_LINEAR_TILE_BYTES (16u << 10)
#define DECODE_NEAR_BYTES 2048u
typedef struct {
    const uint8_t *base, *last;   /* the group's first tile; the limit's last line (nothing is fetched past it) */
    size_t tile_bytes, piece;     /* piece: a step's bytes of one tile (its block, or a K-quant sub-block's share) */
    int ntiles, linear, on;
} decode_prefetch_t;

static inline decode_prefetch_t decode_prefetch_plan(const uint8_t *base, size_t tile_bytes, int ntiles,
                                                     size_t step_bytes, int limit) {
    decode_prefetch_t p = {base, limit > 0 ? base + (size_t)limit * tile_bytes - 64 : base, tile_bytes, step_bytes,
                           ntiles, tile_bytes <= DECODE_LINEAR_TILE_BYTES, limit > 0};
    return p;
}

/* n lines from a (n a constant where inlined: unrolled, no branches); a run that would pass last starts earlier, so
 * that it ends at last: one clamp per run, not one per line */
static inline __attribute__((always_inline)) void prefetch_run(const uint8_t *a, const int n, const uint8_t *last) {
    const uintptr_t latest = (uintptr_t)last - 64u * (uintptr_t)(n - 1);
    const uint8_t *q = (uintptr_t)a < latest ? a : (const uint8_t *)latest;
#pragma GCC unroll 32
    for (int k = 0; k < n; k++) __builtin_prefetch(q + 64 * k, 0, 1);
}

/* tile i's piece of step in the next group's bytes, in memory order (a step's pieces of the group follow each other) */
static inline const uint8_t *prefetch_linear_at(const decode_prefetch_t *p, int step, int i) {
    return p->base + (size_t)p->ntiles * p->tile_bytes + ((size_t)step * p->ntiles + i) * p->piece;
}

/* tile i's own bytes DECODE_NEAR_BYTES past step's, or past its end those of the tile a group further */
static inline const uint8_t *prefetch_near_at(const decode_prefetch_t *p, int step, int i) {
    const size_t at = (size_t)step * p->piece + DECODE_NEAR_BYTES;
    return p->base + (size_t)i * p->tile_bytes + at +
           (at < p->tile_bytes ? 0 : (size_t)(p->ntiles - 1) * p->tile_bytes);
}

/* one step's pieces of all the group's tiles: lines_group lines (linear), lines_tile per tile (near) */
static inline __attribute__((always_inline)) void decode_prefetch_step(const decode_prefetch_t *p, int step,
                                                                       const int lines_group,
                                                                       const int lines_tile) {
    if (!p->on) return;
    if (p->linear) {
        prefetch_run(prefetch_linear_at(p, step, 0), lines_group, p->last);
        return;
    }
    for (int i = 0; i < p->ntiles; i++) prefetch_run(prefetch_near_at(p, step, i), lines_tile, p->last);
}

/* one step's piece of tile i alone (a kernel that spreads a step over its tiles) */
static inline __attribute__((always_inline)) void decode_prefetch_tile(const decode_prefetch_t *p, int step, int i,
                                                                       const int lines_tile) {
    if (!p->on) return;
    prefetch_run(p->linear ? prefetch_linear_at(p, step, i) : prefetch_near_at(p, step, i), lines_tile, p->last);
}

/* A prefill (batch) kernel computes for a long time on the tiles it has unpacked and reads no memory meanwhile, so
 * the hardware prefetcher idles and the next call's unpacking waits on memory: each call spreads prefetches of the
 * bytes it will read next over its first pass of blocks (`per_block` lines at each block), into L2 like the decode
 * prefetch. */
typedef struct { const uint8_t *at, *end; size_t per_block; } batch_prefetch_t;

static inline batch_prefetch_t batch_prefetch_plan(const uint8_t *at, size_t bytes, int nb32) {
    const size_t lines = (bytes + 63) / 64;
    batch_prefetch_t p = {at, at + bytes, (lines + (size_t)nb32 - 1) / (size_t)nb32};
    return p;
}

static inline __attribute__((always_inline)) void batch_prefetch_step(const batch_prefetch_t *p, int b) {
    if (!p) return;
    for (const uint8_t *q = p->at + 64 * p->per_block * (size_t)b, *e = q + 64 * p->per_block; q < e && q < p->end;
         q += 64)
        __builtin_prefetch(q, 0, 1);
}

/* one type's ymm tile kernels on one SIMD path (qtile.h): up to ntok tokens per call of `tokens`; batch from
 * batch_min tokens up */
typedef struct { int ntok; qtile_fn tokens; qbatch_fn batch; qgroup_fn group; int batch_min; } qkernel_t;
#define BATCH_MAX_BLOCKS 512   /* batch kernels unpack up to this many 32-value blocks per row (on the stack) */
/* prefill over a pair of adjacent tiles (ta, tb: 16 rows) in AVX-512 registers (qpair512.c), all quantized types:
 * ntok tokens into y[k * ldy + r], r < nrows (a lone tile: tb = ta, nrows <= 8); amx: groups of 16 tokens may go to
 * the AMX unit (the caller has checked amx_usable) */
typedef void (*qpair_fn)(const uint8_t *ta, const uint8_t *tb, int nb, const block_q8x *xq, int ntok, float *y,
                         int ldy, int nrows, int accumulate, int amx);
#define PAIR_MAX_BLOCKS 512    /* the pair kernels unpack up to this many blocks on the stack (640 bytes, Q6_K 768) */
/* A tile block of a type that keeps its GGUF blocks (iq_lanes.h), unpacked for the pair kernels as the VNNI tile
 * kernels unpack it (lanes_<type>_avx512vnni: matmul_simd.c, qtile.h's load_lanes): wv[s][j] lane r (4 bytes) holds
 * values 4j..4j+3 of row r's sub-block s plus LANES_VNNI_OFFSET, m[s][h][r] the integer scale of its half h, dw[r]
 * the row's d times the type's factor */
typedef struct { uint8_t wv[8][8][32]; int32_t m[8][2][8]; float dw[8]; } lanes_block_t;
typedef void (*lanes_block_fn)(const uint8_t *blk, lanes_block_t *out);
/* decode over pairs of tiles in AVX-512 registers (qdecode512.c; NULL for Q8_0, MXFP4 and the codebook and ternary
 * types): the group kernel's work for ntok (1..QDECODE_TOKENS) tokens, token t's activation blocks at
 * xq + t * nb32 and its rows at y + t * ldy: the tiles are unpacked once for all of them (a decode step of a few
 * sequences, speculative drafts) */
#define QDECODE_TOKENS 8
typedef void (*qdecode_fn)(const uint8_t *base, size_t tile_bytes, int ntiles, int nb, const block_q8x *xq, int nb32,
                           int ntok, float *y, int ldy, int nrows_last, int accumulate, int prefetch);
/* whether the CPU has AMX-INT8 and the OS grants this process its tile state (qpair512.c) */
int amx_usable(void);

/* byte offsets inside a tile block: the group of 32-value block s (s < 8 for K-quants, 0 otherwise), its hbit or
 * h2bit piece, and (K-quants) its scales: Q4_K/Q5_K sc[8] then mn[8]; Q6_K sc[2 x 8] */
static inline size_t tile_group_off(int type, int s) {
    return TILE_LAYOUT[type].group + (size_t)TILE_LAYOUT[type].group_step * s;
}
static inline size_t tile_hbits_off(int type, int s) {
    return TILE_LAYOUT[type].hbits + (size_t)TILE_LAYOUT[type].hbits_step * s;
}
static inline size_t tile_scales_off(int type, int s) {
    return TILE_LAYOUT[type].scales + (size_t)TILE_LAYOUT[type].scales_step * s;
}

static inline float tile_f16(const uint8_t *p, int r) {
    uint16_t h;
    memcpy(&h, p + 2 * r, 2);
    return f16_to_f32(h);
}

/* an E8M0 scale, halved for MXFP4_VALUES' doubling: 2^(e - 128), exact for every e (e < 2 gives a subnormal) */
static inline float mxfp4_scale(uint8_t e) {
    uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* row r's scale d of a tile block (f16 for every type but MXFP4) */
static inline float tile_row_scale(int type, const uint8_t *blk, int r) {
    return type == WT_MXFP4 ? mxfp4_scale(blk[r]) : tile_f16(blk, r);
}

/* the 32 values of block s, lane r, as stored: unsigned (2-6 bits) or, for Q8_0, signed; IQ4's codes mapped to
 * their values */
static inline void tile_lane_values(int type, const uint8_t *blk, int s, int r, int q[32]) {
    if (type == WT_Q8_0) {
        for (int j = 0; j < 8; j++)
            for (int e = 0; e < 4; e++) q[4 * j + e] = (int8_t)blk[16 + 32 * j + 4 * r + e];
        return;
    }
    const uint8_t *g = blk + tile_group_off(type, s), *h = blk + tile_hbits_off(type, s);
    if (type_is_2bit(type)) {
        for (int j = 0; j < 8; j++)
            for (int e = 0; e < 4; e++) {
                int v = (g[32 * (j / 4) + 4 * r + e] >> (2 * (j % 4))) & 3;
                if (type == WT_Q3_K) v |= ((h[4 * r + e] >> j) & 1) << 2;
                q[4 * j + e] = v;
            }
        return;
    }
    int five = type == WT_Q5_0 || type == WT_Q5_1 || type == WT_Q5_K;
    for (int p = 0; p < 4; p++)
        for (int e = 0; e < 4; e++) {
            uint8_t b = g[32 * p + 4 * r + e];
            int lo = b & 15, hi = b >> 4;
            if (five) {
                lo |= ((h[4 * r + e] >> p) & 1) << 4;
                hi |= ((h[4 * r + e] >> (4 + p)) & 1) << 4;
            } else if (type == WT_Q6_K) {
                lo |= ((h[4 * r + e] >> (2 * p)) & 3) << 4;
                hi |= ((h[32 + 4 * r + e] >> (2 * p)) & 3) << 4;
            }
            q[4 * p + e] = type_is_iq4(type) ? code_values(type)[lo] : lo;
            q[16 + 4 * p + e] = type_is_iq4(type) ? code_values(type)[hi] : hi;
        }
}

#endif
