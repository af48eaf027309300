/* Repacking GGUF rows into the engine's 8-row tiles (tile.h has the layouts), and one row of a tile back to floats:
 * each quantized type's repack_<type> and dequant_<type> for its row of the type-traits table (type_traits.c), and
 * the float types' plain rows.
 *
 * Repacking reads the GGUF rows where they lie (a view over the mapped file) and writes each row's lane of its
 * tiles directly: no intermediate copy of a tensor, so loading needs the final weights and nothing more. Each
 * GGUF block is first unpacked into plain values and scales (gguf_unpack), then stored in the tile's pieces; the
 * functions below take the type as a constant, so each type's copy keeps only its own steps. */
#include <string.h>
#include "inferd.h"
#include "tile.h"
#include "type_traits.h"

/* ---- GGUF blocks -> values and scales ---- */
typedef struct {
    uint16_t d, m;           /* f16: d and (Q4_1/Q5_1) m, or (Q4_K/Q5_K/Q2_K) dmin */
    uint8_t sc[16], mn[8];   /* K-quants: sub-block scales (Q6_K, Q3_K, IQ4_XS: int8; Q2_K: sc | mn << 4) and mins */
    int8_t q8[32];           /* Q8_0's values */
    uint8_t q[QK_K];         /* the other types' unsigned values */
} unpacked_t;

static void k4_scale_min(const uint8_t *s, int j, uint8_t *sc, uint8_t *mn) {   /* GGUF's 12-byte 6-bit packing */
    if (j < 4) {
        *sc = s[j] & 63;
        *mn = s[j + 4] & 63;
    } else {
        *sc = (uint8_t)((s[j + 4] & 15) | ((s[j - 4] >> 6) << 4));
        *mn = (uint8_t)((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
    }
}

static inline __attribute__((always_inline)) void gguf_unpack(const int type, const uint8_t *b, unpacked_t *u) {
    memcpy(&u->d, b, 2);
    if (type == WT_Q8_0) {
        memcpy(u->q8, b + 2, 32);
    } else if (type == WT_Q4_0 || type == WT_Q4_1) {
        const uint8_t *qs = b + (type == WT_Q4_1 ? 4 : 2);
        if (type == WT_Q4_1) memcpy(&u->m, b + 2, 2);
        for (int j = 0; j < 16; j++) { u->q[j] = qs[j] & 15; u->q[j + 16] = qs[j] >> 4; }
    } else if (type == WT_Q5_0 || type == WT_Q5_1) {
        int off = type == WT_Q5_1 ? 4 : 2;
        if (type == WT_Q5_1) memcpy(&u->m, b + 2, 2);
        uint32_t qh;
        memcpy(&qh, b + off, 4);
        const uint8_t *qs = b + off + 4;
        for (int j = 0; j < 16; j++) {
            u->q[j] = (uint8_t)((qs[j] & 15) | ((qh >> j) & 1) << 4);
            u->q[j + 16] = (uint8_t)((qs[j] >> 4) | ((qh >> (j + 16)) & 1) << 4);
        }
    } else if (type == WT_Q4_K || type == WT_Q5_K) {
        memcpy(&u->m, b + 2, 2);
        for (int j = 0; j < 8; j++) k4_scale_min(b + 4, j, &u->sc[j], &u->mn[j]);
        const uint8_t *qh = b + 16, *qs = b + (type == WT_Q5_K ? 48 : 16);
        for (int c = 0; c < 4; c++)
            for (int l = 0; l < 32; l++) {
                uint8_t lo = qs[32 * c + l] & 15, hi = qs[32 * c + l] >> 4;
                if (type == WT_Q5_K) {
                    lo |= ((qh[l] >> (2 * c)) & 1) << 4;
                    hi |= ((qh[l] >> (2 * c + 1)) & 1) << 4;
                }
                u->q[64 * c + l] = lo;
                u->q[64 * c + 32 + l] = hi;
            }
    } else if (type == WT_Q2_K) {   /* scales[16] | qs[64] | d | dmin; value 128n + 32k + l: qs[32n + l] bits 2k */
        memcpy(u->sc, b, 16);
        memcpy(&u->d, b + 80, 2);
        memcpy(&u->m, b + 82, 2);
        for (int i = 0; i < QK_K; i++) u->q[i] = (b[16 + 32 * (i / 128) + i % 32] >> (2 * (i / 32 % 4))) & 3;
    } else if (type == WT_Q3_K) {   /* hmask[32] | qs[64] | scales[12] | d; the high bit of value 32i + l: hmask[l]
                                     * bit i, set where the value is not offset by -4 */
        const uint8_t *hm = b, *qs = b + 32, *s = b + 96;
        memcpy(&u->d, b + 108, 2);
        for (int i = 0; i < 16; i++) {
            int lo = (i < 8 ? s[i] : s[i - 8] >> 4) & 15, hi = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
            u->sc[i] = (uint8_t)(int8_t)((lo | hi << 4) - 32);
        }
        for (int i = 0; i < QK_K; i++)
            u->q[i] = (uint8_t)(((qs[32 * (i / 128) + i % 32] >> (2 * (i / 32 % 4))) & 3) |
                                ((hm[i % 32] >> (i / 32)) & 1) << 2);
    } else if (type == WT_IQ4_NL) {
        for (int j = 0; j < 16; j++) { u->q[j] = b[2 + j] & 15; u->q[j + 16] = b[2 + j] >> 4; }
    } else if (type == WT_MXFP4) {   /* e (E8M0) | qs[16]: the exponent byte stays as it is, in d's low byte */
        u->d = b[0];
        for (int j = 0; j < 16; j++) { u->q[j] = b[1 + j] & 15; u->q[j + 16] = b[1 + j] >> 4; }
    } else if (type == WT_IQ4_XS) {   /* d | scales_h (u16) | scales_l[4] | qs[128]: 16 bytes per 32 values */
        uint16_t sh;
        memcpy(&sh, b + 2, 2);
        for (int s = 0; s < 8; s++) {
            int ls = ((b[4 + s / 2] >> (4 * (s % 2))) & 15) | ((sh >> (2 * s)) & 3) << 4;
            u->sc[s] = (uint8_t)(int8_t)(ls - 32);
            for (int j = 0; j < 16; j++) {
                u->q[32 * s + j] = b[8 + 16 * s + j] & 15;
                u->q[32 * s + 16 + j] = b[8 + 16 * s + j] >> 4;
            }
        }
    } else if (type == WT_Q6_K) {
        const uint8_t *ql = b, *qh = b + 128;
        memcpy(&u->d, b + 208, 2);
        memcpy(u->sc, b + 192, 16);
        for (int n = 0; n < 2; n++)
            for (int l = 0; l < 32; l++) {
                const uint8_t *L = ql + 64 * n, *H = qh + 32 * n;
                uint8_t *q = u->q + 128 * n;
                q[l] = (uint8_t)((L[l] & 15) | ((H[l] >> 0) & 3) << 4);
                q[l + 32] = (uint8_t)((L[l + 32] & 15) | ((H[l] >> 2) & 3) << 4);
                q[l + 64] = (uint8_t)((L[l] >> 4) | ((H[l] >> 4) & 3) << 4);
                q[l + 96] = (uint8_t)((L[l + 32] >> 4) | ((H[l] >> 6) & 3) << 4);
            }
    }
}

/* ---- values and scales -> lane r of a tile block ---- */
static void put_group(uint8_t *g, int r, const uint8_t *q) {
    for (int p = 0; p < 4; p++)
        for (int e = 0; e < 4; e++) g[32 * p + 4 * r + e] = (uint8_t)((q[4 * p + e] & 15) | (q[16 + 4 * p + e] & 15) << 4);
}

/* bit `bit` of each value (the 5-bit types' bit 4, Q3_K's bit 2) */
static void put_hbit(uint8_t *h, int r, const uint8_t *q, int bit) {
    for (int e = 0; e < 4; e++) {
        uint8_t v = 0;
        for (int p = 0; p < 4; p++)
            v |= (uint8_t)(((q[4 * p + e] >> bit) & 1) << p | ((q[16 + 4 * p + e] >> bit) & 1) << (4 + p));
        h[4 * r + e] = v;
    }
}

static void put_q2group(uint8_t *g, int r, const uint8_t *q) {
    for (int v = 0; v < 2; v++)
        for (int e = 0; e < 4; e++) {
            uint8_t b = 0;
            for (int k = 0; k < 4; k++) b |= (uint8_t)((q[4 * (4 * v + k) + e] & 3) << (2 * k));
            g[32 * v + 4 * r + e] = b;
        }
}

static void put_h2bit(uint8_t *h, int r, const uint8_t *q) {
    for (int e = 0; e < 4; e++) {
        uint8_t lo = 0, hi = 0;
        for (int p = 0; p < 4; p++) {
            lo |= (uint8_t)(((q[4 * p + e] >> 4) & 3) << (2 * p));
            hi |= (uint8_t)(((q[16 + 4 * p + e] >> 4) & 3) << (2 * p));
        }
        h[4 * r + e] = lo;
        h[32 + 4 * r + e] = hi;
    }
}

static inline __attribute__((always_inline)) void put_lane(const int type, uint8_t *blk, int r, const unpacked_t *u) {
    if (type == WT_MXFP4) blk[r] = (uint8_t)u->d;
    else memcpy(blk + 2 * r, &u->d, 2);
    if (type == WT_Q8_0) {
        for (int j = 0; j < 8; j++) memcpy(blk + 16 + 32 * j + 4 * r, u->q8 + 4 * j, 4);
        return;
    }
    if (type == WT_Q4_1 || type == WT_Q5_1 || type == WT_Q4_K || type == WT_Q5_K || type == WT_Q2_K)
        memcpy(blk + 16 + 2 * r, &u->m, 2);
    int nsub = type_is_k(type) ? 8 : 1;
    for (int s = 0; s < nsub; s++) {
        const uint8_t *q = u->q + 32 * s;
        if (type_is_2bit(type)) put_q2group(blk + tile_group_off(type, s), r, q);
        else put_group(blk + tile_group_off(type, s), r, q);
        if (type == WT_Q5_0 || type == WT_Q5_1 || type == WT_Q5_K) put_hbit(blk + tile_hbits_off(type, s), r, q, 4);
        if (type == WT_Q3_K) put_hbit(blk + tile_hbits_off(type, s), r, q, 2);
        if (type == WT_IQ4_XS) {
            blk[tile_scales_off(type, s) + r] = u->sc[s];
        } else if (type == WT_Q6_K || type == WT_Q3_K || type == WT_Q2_K) {
            if (type == WT_Q6_K) put_h2bit(blk + tile_hbits_off(type, s), r, q);
            blk[tile_scales_off(type, s) + r] = u->sc[2 * s];
            blk[tile_scales_off(type, s) + 8 + r] = u->sc[2 * s + 1];
        } else if (type == WT_Q4_K || type == WT_Q5_K) {
            blk[tile_scales_off(type, s) + r] = u->sc[s];
            blk[tile_scales_off(type, s) + 8 + r] = u->mn[s];
        }
    }
}

/* ---- the formats of real files, straight from GGUF bytes to a lane (no unpacked values in between) ----
 * Q4_K_M files are Q4_K and Q6_K: the two most of a load's time goes to. Each writes exactly what put_lane writes
 * after gguf_unpack, in 16-byte runs the compiler vectorizes; tile group byte i (of 16) holds the values i and
 * 16 + i of its 32-value sub-block in its low and high nibbles. */
static inline void put_lane_q4_k(uint8_t *blk, int r, const uint8_t *b) {
    memcpy(blk + 2 * r, b, 2);                     /* d */
    memcpy(blk + 16 + 2 * r, b + 2, 2);            /* dmin */
    for (int s = 0; s < 8; s++) {
        uint8_t *sm = blk + tile_scales_off(WT_Q4_K, s);
        k4_scale_min(b + 4, s, &sm[r], &sm[8 + r]);
    }
    for (int c = 0; c < 4; c++) {                  /* qs[32c..32c+31]: sub-block 2c low nibbles, 2c + 1 high */
        const uint8_t *a = b + 16 + 32 * c, *h = a + 16;
        uint8_t lo[16], hi[16];
        for (int i = 0; i < 16; i++) {
            lo[i] = (uint8_t)((a[i] & 15) | (h[i] << 4));
            hi[i] = (uint8_t)((a[i] >> 4) | (h[i] & 0xF0));
        }
        uint8_t *g0 = blk + tile_group_off(WT_Q4_K, 2 * c) + 4 * r, *g1 = blk + tile_group_off(WT_Q4_K, 2 * c + 1) + 4 * r;
        for (int p = 0; p < 4; p++) {
            memcpy(g0 + 32 * p, lo + 4 * p, 4);
            memcpy(g1 + 32 * p, hi + 4 * p, 4);
        }
    }
}

/* sub-block s (a constant in each call below: the shifts then are immediates and the 16-byte loop vectorizes, where
 * a loop over s left it scalar byte by byte, ten times slower than Q4_K's) */
static inline __attribute__((always_inline)) void put_q6_k_sub(uint8_t *blk, int r, const uint8_t *b, const int s) {
    /* sub-block s = 4n + k: low 4 bits from ql[64n + 32(k & 1) + j] (its high nibble when k >= 2), the top 2 bits
     * from qh[32n + j] at bit 2k */
    const int n = s / 4, k = s % 4, ls = 4 * (k >> 1), hs = 2 * k;
    const uint8_t *L = b + 64 * n + 32 * (k & 1), *H = b + 128 + 32 * n;
    uint8_t g[16];
    for (int i = 0; i < 16; i++) g[i] = (uint8_t)(((L[i] >> ls) & 15) | ((L[16 + i] >> ls) & 15) << 4);
    uint8_t *gp = blk + tile_group_off(WT_Q6_K, s) + 4 * r, *hp = blk + tile_hbits_off(WT_Q6_K, s) + 4 * r;
    for (int p = 0; p < 4; p++) memcpy(gp + 32 * p, g + 4 * p, 4);
    /* tile byte e of the lane's 4 holds at bits 2p the top bits of value 4p + e (16 + 4p + e in the second half):
     * four source bytes at once in a 32-bit word (little-endian), whose byte lanes never carry into each other (a
     * 2-bit field moved by at most 6) */
    uint32_t lo = 0, hi = 0;
    for (int p = 0; p < 4; p++) {
        uint32_t a, c;
        memcpy(&a, H + 4 * p, 4);
        memcpy(&c, H + 16 + 4 * p, 4);
        lo |= ((a >> hs) & 0x03030303u) << (2 * p);
        hi |= ((c >> hs) & 0x03030303u) << (2 * p);
    }
    memcpy(hp, &lo, 4);
    memcpy(hp + 32, &hi, 4);
    uint8_t *sc = blk + tile_scales_off(WT_Q6_K, s);
    sc[r] = b[192 + 2 * s];
    sc[8 + r] = b[192 + 2 * s + 1];
}

static inline void put_lane_q6_k(uint8_t *blk, int r, const uint8_t *b) {
    memcpy(blk + 2 * r, b + 208, 2); /* d */
    put_q6_k_sub(blk, r, b, 0);
    put_q6_k_sub(blk, r, b, 1);
    put_q6_k_sub(blk, r, b, 2);
    put_q6_k_sub(blk, r, b, 3);
    put_q6_k_sub(blk, r, b, 4);
    put_q6_k_sub(blk, r, b, 5);
    put_q6_k_sub(blk, r, b, 6);
    put_q6_k_sub(blk, r, b, 7);
}

/* one GGUF block -> lane `lane` of a tile block */
static inline __attribute__((always_inline)) void put_block(const int type, uint8_t *blk, int lane, const uint8_t *b) {
    if (type_keeps_blocks(type)) {
        memcpy(blk + (size_t)lane * lane_bytes(type), b, lane_bytes(type));
    } else if (type == WT_Q4_K) {
        put_lane_q4_k(blk, lane, b);
    } else if (type == WT_Q6_K) {
        put_lane_q6_k(blk, lane, b);
    } else {
        unpacked_t u;
        gguf_unpack(type, b, &u);
        put_lane(type, blk, lane, &u);
    }
}

/* rows [begin, end) of the source, for one (constant) quantized type: the unpacking and packing specialize.
 * Eight source rows that make one whole tile go block by block, all eight lanes of a tile block at a time: the
 * tile is then written front to back, a stream the hardware prefetches, where a row at a time would write 4
 * bytes into every tile block in turn (half of a load's time went to those stores' cache misses). */
static inline __attribute__((always_inline)) void repack_typed(const repack_t *f, int64_t begin, int64_t end,
                                                               const int type) {
    weight_t *w = f->w;
    const size_t bb = tile_block_bytes(type), gb = type_traits(type)->gguf_block_bytes;
    const int nb = w->cols / (TILE_LAYOUT[type].nsub * QK);
    const size_t rb = (size_t)nb * gb;
    uint8_t *data = w->data + w->seg[f->seg].offset;
    for (int64_t i = begin; i < end;) {
        int row = repack_dst_row(f, i) - w->seg[f->seg].row0;
        int t = row / TILE_ROWS, lane = row % TILE_ROWS;
        const uint8_t *src = f->src + (size_t)i * rb;
        uint8_t *dst = data + (size_t)t * nb * bb;
        if (lane == 0 && end - i >= TILE_ROWS && i % f->group + TILE_ROWS <= f->group) {   /* a whole tile */
            for (int b = 0; b < nb; b++)
                for (int r = 0; r < TILE_ROWS; r++) put_block(type, dst + (size_t)b * bb, r, src + r * rb + (size_t)b * gb);
            i += TILE_ROWS;
        } else {
            for (int b = 0; b < nb; b++) put_block(type, dst + (size_t)b * bb, lane, src + (size_t)b * gb);
            i++;
        }
    }
}

/* row `row` of a quantized segment (its tiles at data) back to floats: value = the tile.h formula of the type */
static inline __attribute__((always_inline)) void dequant_typed(const int type, const uint8_t *data, int cols, int row,
                                                                float *out) {
    const int nsub = TILE_LAYOUT[type].nsub, nb = cols / (nsub * QK), t = row / TILE_ROWS, r = row % TILE_ROWS;
    const size_t bb = tile_block_bytes(type);
    if (type_keeps_blocks(type)) {   /* iq_lanes.h's formula: gguf's floats */
        for (int b = 0; b < nb; b++) {
            const uint8_t *lb = data + ((size_t)t * nb + b) * bb + (size_t)r * lane_bytes(type);
            const float d = lane_d(type, lb), f = lane_factor(type);
            for (int s = 0; s < nsub; s++) {
                int q[32], m[2];
                lane_values(type, lb, s, q, m);
                const float ds[2] = {(d * (float)m[0]) * f, (d * (float)m[1]) * f};
                for (int i = 0; i < 32; i++) out[(size_t)(b * nsub + s) * QK + i] = ds[i / 16] * (float)q[i];
            }
        }
        return;
    }
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = data + ((size_t)t * nb + b) * bb;
        float d = tile_row_scale(type, blk, r);
        int q[32];
        for (int s = 0; s < nsub; s++) {
            float *o = out + (size_t)(b * nsub + s) * QK;
            tile_lane_values(type, blk, s, r, q);
            if (type == WT_Q8_0 || type == WT_IQ4_NL || type == WT_MXFP4) {
                for (int i = 0; i < 32; i++) o[i] = d * (float)q[i];
            } else if (type == WT_IQ4_XS) {
                float dw = d * (float)((const int8_t *)blk + tile_scales_off(type, s))[r];
                for (int i = 0; i < 32; i++) o[i] = dw * (float)q[i];
            } else if (type == WT_Q3_K) {
                const int8_t *sc = (const int8_t *)blk + tile_scales_off(type, s);
                for (int i = 0; i < 32; i++) o[i] = d * (float)sc[8 * (i / 16) + r] * (float)(q[i] - 4);
            } else if (type == WT_Q2_K) {
                const uint8_t *scm = blk + tile_scales_off(type, s);
                float dmin = tile_f16(blk + 16, r);
                for (int i = 0; i < 32; i++) {
                    uint8_t m = scm[8 * (i / 16) + r];
                    o[i] = d * (float)(m & 15) * (float)q[i] - dmin * (float)(m >> 4);
                }
            } else if (type == WT_Q4_0) {
                for (int i = 0; i < 32; i++) o[i] = d * (float)(q[i] - 8);
            } else if (type == WT_Q5_0) {
                for (int i = 0; i < 32; i++) o[i] = d * (float)(q[i] - 16);
            } else if (type == WT_Q4_1 || type == WT_Q5_1) {
                float m = tile_f16(blk + 16, r);
                for (int i = 0; i < 32; i++) o[i] = d * (float)q[i] + m;
            } else if (type == WT_Q4_K || type == WT_Q5_K) {
                const uint8_t *sm = blk + tile_scales_off(type, s);
                float dw = d * (float)sm[r], mw = tile_f16(blk + 16, r) * (float)sm[8 + r];
                for (int i = 0; i < 32; i++) o[i] = dw * (float)q[i] - mw;
            } else if (type == WT_Q6_K) {
                const int8_t *sc = (const int8_t *)blk + tile_scales_off(type, s);
                for (int i = 0; i < 32; i++) o[i] = d * (float)sc[8 * (i / 16) + r] * (float)(q[i] - 32);
            }
        }
    }
}

#define QUANT_DEFINE(name, TYPE)                                                                                 \
    void repack_##name(const repack_t *f, int64_t begin, int64_t end) { repack_typed(f, begin, end, TYPE); }     \
    void dequant_##name(const uint8_t *data, int cols, int row, float *out) {                                    \
        dequant_typed(TYPE, data, cols, row, out);                                                               \
    }
QUANT_DEFINE(q4_0, WT_Q4_0)
QUANT_DEFINE(q4_1, WT_Q4_1)
QUANT_DEFINE(q5_0, WT_Q5_0)
QUANT_DEFINE(q5_1, WT_Q5_1)
QUANT_DEFINE(q8_0, WT_Q8_0)
QUANT_DEFINE(q4_k, WT_Q4_K)
QUANT_DEFINE(q5_k, WT_Q5_K)
QUANT_DEFINE(q6_k, WT_Q6_K)
QUANT_DEFINE(q3_k, WT_Q3_K)
QUANT_DEFINE(q2_k, WT_Q2_K)
QUANT_DEFINE(iq4_nl, WT_IQ4_NL)
QUANT_DEFINE(iq4_xs, WT_IQ4_XS)
QUANT_DEFINE(mxfp4, WT_MXFP4)
QUANT_DEFINE(iq2_xxs, WT_IQ2_XXS)
QUANT_DEFINE(iq2_xs, WT_IQ2_XS)
QUANT_DEFINE(iq2_s, WT_IQ2_S)
QUANT_DEFINE(iq3_xxs, WT_IQ3_XXS)
QUANT_DEFINE(iq3_s, WT_IQ3_S)
QUANT_DEFINE(iq1_s, WT_IQ1_S)
QUANT_DEFINE(iq1_m, WT_IQ1_M)
QUANT_DEFINE(tq1_0, WT_TQ1_0)
QUANT_DEFINE(tq2_0, WT_TQ2_0)
#undef QUANT_DEFINE

/* ---- float types: rows as they are ---- */
void repack_rows(const repack_t *f, int64_t begin, int64_t end) {
    weight_t *w = f->w;
    size_t rb = gguf_row_bytes(w->seg[f->seg].type, w->cols);
    for (int64_t i = begin; i < end; i++) {
        int row = repack_dst_row(f, i);
        memcpy(w->data + (size_t)row * rb, f->src + (size_t)i * rb, rb);
    }
}

void dequant_f32(const uint8_t *data, int cols, int row, float *out) {
    memcpy(out, (const float *)data + (size_t)row * cols, (size_t)cols * 4);
}
void dequant_f16(const uint8_t *data, int cols, int row, float *out) {
    const uint16_t *s = (const uint16_t *)data + (size_t)row * cols;
    for (int i = 0; i < cols; i++) out[i] = f16_to_f32(s[i]);
}
void dequant_bf16(const uint8_t *data, int cols, int row, float *out) {
    const uint16_t *s = (const uint16_t *)data + (size_t)row * cols;
    for (int i = 0; i < cols; i++) out[i] = bf16_to_f32(s[i]);
}
