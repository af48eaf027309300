/* The encoder's Q8_0 matmuls on AMX (Intel's tile unit: one TDPBSSD is a 16 x 8 x 32 int8 product), where the CPU
 * has AMX-INT8 and the kernel grants it; everything else goes to the decoder's tile kernels (matmul_tiles).
 *
 * The weights stay in the engine's Q8_0 tile layout (tile.h): a tile block's 256 value bytes, byte 32j + 4r + e =
 * value 4j + e of row r, are exactly the B operand of TDPBSSD for N = 8 rows and K = 32 (row j of B: four values
 * of each of the 8 rows), so B is one strided tile load and no second copy of the weights exists. The A operand is
 * 16 tokens' activation blocks (block_q8x.qs, strided by the token's blocks). The result is the exact int32 block
 * sum isum of every (token, row), the same integer the scalar kernel computes; the float steps that follow are the
 * scalar definition's, lane by lane: acc = fma(float(isum), dw * dx, acc) block after block from 0 (matmul.c). So
 * this path gives the bits of every other path, and a token's row does not depend on the other 15 rows of its tile.
 *
 * Tokens past ntok in the last 16-token tile read whatever lies after the activations (encoder_ctx_create pads
 * those buffers by 16 tokens); their rows are computed and dropped. */
#include <stdint.h>
#include <string.h>
#include "encoder.h"
#include "tile.h"
#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

/* Off by default: with Q8_0's scale per 32 values every TDPBSSD (16 tokens x 8 rows x 32) is followed by a tile
 * store and a float epilogue, and on MiniLM at 2 threads this path measured 1.2-1.3x slower than the int8 tile
 * kernels (batch of 256 short sentences: 1.40-1.83 s vs 1.15-1.46 s; 64 passages 4.9-7.7 s vs 3.9-5.9 s, interleaved,
 * shared machine). encoder_set_amx(1) turns it on (the bits are the same either way). */
static int amx_enabled = 0;

void encoder_set_amx(int on) { amx_enabled = on != 0; }

#if defined(__x86_64__) && defined(SYS_arch_prctl)
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

/* cpuid leaf 7: AVX-512F and DQ (ebx 16, 17), AMX-TILE (edx 24), AMX-INT8 (edx 25); then Linux must grant the tile state to
 * this process (once; the grant covers every thread) */
static int amx_probe(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
    if (!(b & (1u << 16)) || !(b & (1u << 17)) || !(d & (1u << 24)) || !(d & (1u << 25))) return 0;
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
}

int encoder_amx_available(void) {
    static int state = -1;
    int s = __atomic_load_n(&state, __ATOMIC_ACQUIRE);
    if (s < 0) {
        s = amx_probe();
        __atomic_store_n(&state, s, __ATOMIC_RELEASE);
    }
    return s;
}

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tilecfg_t;

#define AMX_ATTR __attribute__((target("avx2,fma,f16c,avx512f,avx512dq,avx512vl,amx-tile,amx-int8")))
#define TOK 16                 /* tokens per A tile */

/* tmm0: A, 16 tokens x 32 bytes; tmm1, tmm2: B of two weight tiles, 8 x 32 bytes; tmm3, tmm4: their C, 16 x 8 */
static void config(tilecfg_t *cfg) {
    memset(cfg, 0, sizeof(*cfg));
    cfg->palette = 1;
    cfg->rows[0] = TOK; cfg->colsb[0] = QK;
    cfg->rows[1] = cfg->rows[2] = QK / 4; cfg->colsb[1] = cfg->colsb[2] = TILE_ROWS * 4;
    cfg->rows[3] = cfg->rows[4] = TOK; cfg->colsb[3] = cfg->colsb[4] = TILE_ROWS * 4;
}

/* acc[p] (tokens 2p and 2p + 1, 8 rows each) = fma(float(c), dw * dx, acc[p]) */
AMX_ATTR static inline __attribute__((always_inline)) void epilogue(const int32_t *c, const uint8_t *blk, __m512 dx,
                                                                   const __m512i *pair_idx, __m512 *acc) {
    __m512 dw = _mm512_broadcast_f32x8(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)blk)));
    for (int p = 0; p < TOK / 2; p++) {
        __m512 prod = _mm512_mul_ps(dw, _mm512_permutexvar_ps(pair_idx[p], dx));
        acc[p] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(c + 16 * p)), prod, acc[p]);
    }
}

AMX_ATTR static void store(const __m512 *acc, int nt, float *y, int ldy, int nrows, int accumulate) {
    float tmp[2 * TILE_ROWS];
    for (int p = 0; p < TOK / 2 && 2 * p < nt; p++) {
        _mm512_storeu_ps(tmp, acc[p]);
        for (int h = 0; h < 2 && 2 * p + h < nt; h++) {
            float *o = y + (size_t)(2 * p + h) * ldy;
            for (int r = 0; r < nrows; r++) o[r] = accumulate ? o[r] + tmp[h * TILE_ROWS + r] : tmp[h * TILE_ROWS + r];
        }
    }
}

AMX_ATTR static void q8_0_amx(const weight_t *w, int tile_begin, int tile_end, int ntok, const block_q8x *xq,
                              float *y, int ldy, int accumulate) {
    const int nb = w->cols / QK;
    const size_t tstride = (size_t)nb * TB_Q8_0;       /* bytes per weight tile */
    tilecfg_t cfg;
    config(&cfg);
    _tile_loadconfig(&cfg);
    int32_t c[2][TOK * TILE_ROWS] __attribute__((aligned(64)));
    float dxt[BATCH_MAX_BLOCKS * TOK] __attribute__((aligned(64)));
    __m512i pair_idx[TOK / 2];
    for (int p = 0; p < TOK / 2; p++)
        pair_idx[p] = _mm512_set_epi32(2 * p + 1, 2 * p + 1, 2 * p + 1, 2 * p + 1, 2 * p + 1, 2 * p + 1, 2 * p + 1,
                                       2 * p + 1, 2 * p, 2 * p, 2 * p, 2 * p, 2 * p, 2 * p, 2 * p, 2 * p);
    for (int t0 = 0; t0 < ntok; t0 += TOK) {
        int nt = ntok - t0 < TOK ? ntok - t0 : TOK;
        const block_q8x *xt = xq + (size_t)t0 * nb;
        for (int b = 0; b < nb; b++)                    /* the 16 tokens' scales of each block side by side */
            for (int m = 0; m < TOK; m++) dxt[b * TOK + m] = xt[(size_t)m * nb + b].d;
        for (int tile = tile_begin; tile < tile_end; tile += 2) {
            int two = tile + 1 < tile_end;
            const uint8_t *w0 = w->data + w->seg[0].offset + (size_t)tile * tstride, *w1 = two ? w0 + tstride : w0;
            __m512 acc0[TOK / 2], acc1[TOK / 2];
            for (int p = 0; p < TOK / 2; p++) acc0[p] = acc1[p] = _mm512_setzero_ps();
            for (int b = 0; b < nb; b++) {
                const uint8_t *b0 = w0 + (size_t)b * TB_Q8_0, *b1 = w1 + (size_t)b * TB_Q8_0;
                _tile_loadd(0, xt[b].qs, nb * sizeof(block_q8x));
                _tile_loadd(1, b0 + 16, 32);
                _tile_zero(3);
                _tile_dpbssd(3, 0, 1);
                _tile_stored(3, c[0], TILE_ROWS * 4);
                if (two) {
                    _tile_loadd(2, b1 + 16, 32);
                    _tile_zero(4);
                    _tile_dpbssd(4, 0, 2);
                    _tile_stored(4, c[1], TILE_ROWS * 4);
                }
                __m512 dx = _mm512_load_ps(dxt + b * TOK);
                epilogue(c[0], b0, dx, pair_idx, acc0);
                if (two) epilogue(c[1], b1, dx, pair_idx, acc1);
            }
            float *yt = y + (size_t)t0 * ldy + (tile - tile_begin) * TILE_ROWS;
            int row0 = tile * TILE_ROWS;
            store(acc0, nt, yt, ldy, w->rows - row0 < TILE_ROWS ? w->rows - row0 : TILE_ROWS, accumulate);
            if (two)
                store(acc1, nt, yt + TILE_ROWS, ldy,
                      w->rows - row0 - TILE_ROWS < TILE_ROWS ? w->rows - row0 - TILE_ROWS : TILE_ROWS, accumulate);
        }
    }
    _tile_release();
}
#else
int encoder_amx_available(void) { return 0; }
#endif

int encoder_uses_amx(const weight_t *w) {
    int path = cpu_path();
    return amx_enabled && w->type == WT_Q8_0 && w->nseg == 1 && w->cols / QK <= BATCH_MAX_BLOCKS && (path == PATH_AVX512VNNI || path == PATH_AVXVNNI) &&
           encoder_amx_available();
}

void encoder_matmul_quant(const weight_t *w, int tile_begin, int tile_end, int ntok, const float *x,
                          const block_q8x *xq, float *y, int ldy, int accumulate) {
#if defined(__x86_64__) && defined(SYS_arch_prctl)
    if (encoder_uses_amx(w)) { q8_0_amx(w, tile_begin, tile_end, ntok, xq, y, ldy, accumulate); return; }
#endif
    matmul_tiles(w, tile_begin, tile_end, ntok, x, xq, y, ldy, accumulate);
}
