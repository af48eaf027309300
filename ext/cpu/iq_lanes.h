/* The weight types whose tiles keep each row's GGUF block whole (tile.h): IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S,
 * IQ1_S, IQ1_M, TQ1_0 and TQ2_0. Their values come out of codebooks (iq_grids.c), sign bits and base-3 digits, which
 * no fixed shuffle of a repacked layout gives, so the kernels expand them from the file's bytes, one 32-value
 * sub-block of one row at a time:
 *   lane_unpack(type, b, s, w, m)  sub-block s of the GGUF block at b: its values as int8, 8 to a word (value 8g + j
 *                                  in byte j of w[g]), and the integer scales m[0], m[1] of its halves of 16 values
 *   lane_d(type, b)                the block's f16 scale as a float
 *   LANE_FACTOR(type)              a power of two
 * With them, value i = ((d * m[i / 16]) * factor) * v[i], the float gguf's dequantization gives, and the dot product's
 * block sum is isum = m[0] sum_0..15 v x + m[1] sum_16..31 v x, exact in int32, weighted by d * factor (matmul.c).
 *   IQ2_XXS, IQ2_XS, IQ2_S  v = +-grid value (8, 25, 43), m = 2 ls + 1 (per 32 values, or per 16), factor 1/8
 *   IQ3_XXS                 v = +-grid value (4..62),      m = 2 ls + 1 (per 32),                  factor 1/4
 *   IQ3_S                   v = +-grid value (4..62),      m = 2 ls + 1 (per 32),                  factor 1
 *   IQ1_S, IQ1_M            v = 8 g +- 1 (g in -1, 0, 1: gguf's g +- 1/8 times 8), m = 2 ls + 1,   factor 1/8
 *   TQ1_0, TQ2_0            v = q - 1 (ternary), m = 1,                                            factor 1 */
#ifndef INFERD_IQ_LANES_H
#define INFERD_IQ_LANES_H

#include <string.h>
#include "inferd.h"
#include "iq_grids.h"

static inline int type_keeps_blocks(int type) {
    return type == WT_IQ2_XXS || type == WT_IQ2_XS || type == WT_IQ2_S || type == WT_IQ3_XXS || type == WT_IQ3_S ||
           type == WT_IQ1_S || type == WT_IQ1_M || type == WT_TQ1_0 || type == WT_TQ2_0;
}

/* GGUF bytes of one block of 256 values: one lane's share of a tile block */
static inline size_t lane_bytes(int type) {
    return type == WT_IQ2_XXS ? 66 : type == WT_IQ2_XS ? 74 : type == WT_IQ2_S ? 82 : type == WT_IQ3_XXS ? 98
         : type == WT_IQ3_S ? 110 : type == WT_IQ1_S ? 50 : type == WT_IQ1_M ? 56 : type == WT_TQ1_0 ? 54
         : type == WT_TQ2_0 ? 66 : 0;
}

static inline float lane_factor(int type) {
    if (type == WT_IQ3_XXS) return 0.25f;
    if (type == WT_IQ3_S || type == WT_TQ1_0 || type == WT_TQ2_0) return 1.0f;
    return 0.125f;
}

/* the block's f16 scale, its bits */
static inline uint16_t lane_d_bits(int type, const uint8_t *b) {
    uint16_t h;
    if (type == WT_IQ1_M) {   /* the f16 spread over the top nibbles of its four scale words */
        uint16_t sc[4];
        memcpy(sc, b + 48, 8);
        h = (uint16_t)((sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) | (sc[3] & 0xf000));
    } else {
        memcpy(&h, b + (type == WT_TQ2_0 ? 64 : type == WT_TQ1_0 ? 52 : 0), 2);
    }
    return h;
}

static inline float lane_d(int type, const uint8_t *b) { return f16_to_f32(lane_d_bits(type, b)); }

#define LANE_BYTES_01 0x0101010101010101ull

/* bytewise a + b, no carries between bytes */
static inline uint64_t lane_add8(uint64_t a, uint64_t b) {
    const uint64_t lo7 = 0x7f7f7f7f7f7f7f7full;
    return ((a & lo7) + (b & lo7)) ^ ((a ^ b) & ~lo7);
}

/* magnitudes mag (bytes) negated where bit j of `bits` is set */
static inline uint64_t lane_signed(uint64_t mag, unsigned bits) {
    uint64_t m = ((bits * LANE_BYTES_01) & 0x8040201008040201ull) + 0x7f7f7f7f7f7f7f7full;
    m = ((m >> 7) & LANE_BYTES_01) * 0xff;   /* 0xff in byte j where bit j is set */
    return lane_add8(mag ^ m, m & LANE_BYTES_01);
}

/* IQ2_XXS's and IQ3_XXS's 7 stored sign bits: the eighth makes their count even */
static inline unsigned lane_ksign(unsigned k) { return k | (unsigned)(__builtin_popcount(k) & 1) << 7; }

/* IQ1's values 8 g +- 1 from a grid entry g (int8 -1, 0, 1) */
static inline uint64_t lane_iq1(uint64_t g, int negative) {
    return lane_add8((g << 3) & 0xf8f8f8f8f8f8f8f8ull, negative ? ~0ull : LANE_BYTES_01);
}

static inline __attribute__((always_inline)) void lane_unpack(const int type, const uint8_t *b, int s, uint64_t w[4],
                                                              int m[2]) {
    if (type == WT_IQ2_XXS) {   /* d | 8 x (4 grid indices | u32: 4 x 7 sign bits, scale << 28) */
        const uint8_t *q = b + 2 + 8 * s;
        uint32_t a;
        memcpy(&a, q + 4, 4);
        for (int l = 0; l < 4; l++) w[l] = lane_signed(IQ2XXS_GRID[q[l]], lane_ksign((a >> (7 * l)) & 127));
        m[0] = m[1] = 2 * (int)(a >> 28) + 1;
    } else if (type == WT_IQ2_XS) {   /* d | 32 x u16 (9-bit index | 7 sign bits << 9) | scales[8] (two nibbles) */
        for (int l = 0; l < 4; l++) {
            uint16_t q;
            memcpy(&q, b + 2 + 8 * s + 2 * l, 2);
            w[l] = lane_signed(IQ2XS_GRID[q & 511], lane_ksign(q >> 9));
        }
        m[0] = 2 * (b[66 + s] & 15) + 1;
        m[1] = 2 * (b[66 + s] >> 4) + 1;
    } else if (type == WT_IQ2_S) {   /* d | qs[32] | signs[32] | qh[8] (2 index bits each) | scales[8] */
        for (int l = 0; l < 4; l++)
            w[l] = lane_signed(IQ2S_GRID[b[2 + 4 * s + l] | ((b[66 + s] >> (2 * l)) & 3) << 8], b[34 + 4 * s + l]);
        m[0] = 2 * (b[74 + s] & 15) + 1;
        m[1] = 2 * (b[74 + s] >> 4) + 1;
    } else if (type == WT_IQ3_XXS) {   /* d | qs[64] (8 indices per 32) | 8 x u32 (4 x 7 sign bits, scale << 28) */
        const uint8_t *q = b + 2 + 8 * s;
        uint32_t a;
        memcpy(&a, b + 66 + 4 * s, 4);
        for (int l = 0; l < 4; l++)
            w[l] = lane_signed(IQ3XXS_GRID[q[2 * l]] | (uint64_t)IQ3XXS_GRID[q[2 * l + 1]] << 32,
                               lane_ksign((a >> (7 * l)) & 127));
        m[0] = m[1] = 2 * (int)(a >> 28) + 1;
    } else if (type == WT_IQ3_S) {   /* d | qs[64] | qh[8] (index bit 8) | signs[32] | scales[4] (two nibbles) */
        const uint8_t *q = b + 2 + 8 * s;
        const int h = b[66 + s];
        for (int l = 0; l < 4; l++) {
            uint32_t lo = IQ3S_GRID[q[2 * l] | ((h >> (2 * l)) & 1) << 8];
            uint32_t hi = IQ3S_GRID[q[2 * l + 1] | ((h >> (2 * l + 1)) & 1) << 8];
            w[l] = lane_signed(lo | (uint64_t)hi << 32, b[74 + 4 * s + l]);
        }
        m[0] = m[1] = 2 * ((b[106 + s / 2] >> (4 * (s % 2))) & 15) + 1;
    } else if (type == WT_IQ1_S) {   /* d | qs[32] | 8 x u16 (4 x 3 index bits, scale << 12, delta's sign << 15) */
        uint16_t h;
        memcpy(&h, b + 34 + 2 * s, 2);
        for (int l = 0; l < 4; l++) w[l] = lane_iq1(IQ1S_GRID[b[2 + 4 * s + l] | ((h >> (3 * l)) & 7) << 8], h >> 15);
        m[0] = m[1] = 2 * ((h >> 12) & 7) + 1;
    } else if (type == WT_IQ1_M) {   /* qs[32] | qh[16] (per 8 values a nibble: 3 index bits, delta's sign) |
                                      * 4 x u16 (per 16 values a 3-bit scale; d in the top nibbles) */
        uint16_t sc;
        memcpy(&sc, b + 48 + 2 * (s / 2), 2);
        for (int l = 0; l < 4; l++) {
            int nib = (b[32 + 2 * s + l / 2] >> (4 * (l % 2))) & 15;
            w[l] = lane_iq1(IQ1S_GRID[b[4 * s + l] | (nib & 7) << 8], nib & 8);
        }
        m[0] = 2 * ((sc >> (6 * (s % 2))) & 7) + 1;
        m[1] = 2 * ((sc >> (6 * (s % 2) + 3)) & 7) + 1;
    } else if (type == WT_TQ2_0) {   /* qs[64] | d: value 128j + 32l + i at bits 2l of qs[32j + i] */
        for (int l = 0; l < 4; l++) {
            uint64_t q;
            memcpy(&q, b + 32 * (s / 4) + 8 * l, 8);
            w[l] = lane_add8((q >> (2 * (s % 4))) & (3 * LANE_BYTES_01), ~0ull);
        }
        m[0] = m[1] = 1;
    } else if (type == WT_TQ1_0) {   /* qs[48] | qh[4] | d: base-3 digits, five to a byte (four in qh) */
        static const uint8_t pow3[5] = {1, 3, 9, 27, 81};
        uint8_t v[32];
        for (int t = 0; t < 32; t++) {
            int i = 32 * s + t, byte, digit;
            if (i < 160) byte = i % 32, digit = i / 32;
            else if (i < 240) byte = 32 + (i - 160) % 16, digit = (i - 160) / 16;
            else byte = 48 + (i - 240) % 4, digit = (i - 240) / 4;
            uint8_t q = (uint8_t)(b[byte] * pow3[digit]);
            v[t] = (uint8_t)(((q * 3) >> 8) - 1);
        }
        memcpy(w, v, 32);
        m[0] = m[1] = 1;
    }
}

/* sub-block s's values as ints (the scalar kernel and dequantization) */
static inline __attribute__((always_inline)) void lane_values(const int type, const uint8_t *b, int s, int q[32],
                                                              int m[2]) {
    uint64_t w[4];
    int8_t v[32];
    lane_unpack(type, b, s, w, m);
    memcpy(v, w, 32);
    for (int i = 0; i < 32; i++) q[i] = v[i];
}

#endif
