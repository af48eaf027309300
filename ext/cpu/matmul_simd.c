/* The quantized tile kernels of the SIMD paths: qtile.h compiled once per path, each copy in its own target
 * region, giving each type's kernels per path (qtile_q4_0_avx2, qtile_q4_0_avx512vnni, ...: type_traits.c's rows).
 *
 * KNT is each (path, type)'s tokens per call: AVX-512VL has 32 vector registers, room for 8 tokens'
 * accumulators; AVX2 and AVX-VNNI have 16, so 4. KNT_PAIR: AVX2's tokens per call of the two-tile prefill
 * kernel (qtile.h's pair_tokens; Q2_K's takes 2). */
#include <string.h>
#include "inferd.h"
#include "tile.h"
#if defined(__x86_64__)
#include <immintrin.h>

/* the types whose prefill unpacks each tile once (tile.h's qbatch_fn): all but Q8_0, whose vectors are a load away,
 * and on the VNNI paths Q4_0, a load and a mask away (on AVX2 it goes by pairs of tiles: qtile.h's pair_tokens) */
#define KBATCH(type) ((type) != WT_Q8_0 && ((type) != WT_Q4_0 || !KVNNI))

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#define KSUFFIX avx2
#define KVNNI 0
#define KNT(type) 4
#define KNT_PAIR 4
#include "qtile.h"
#undef KSUFFIX
#undef KVNNI
#undef KNT
#undef KNT_PAIR
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512vl,avx512bw,avx512vnni")
#define KSUFFIX avx512vnni
#define KVNNI 1
#define DPBUSD(acc, w, x) _mm256_dpbusd_epi32(acc, w, x)
#define KNT(type) 8
#define KLANES_EXPORT   /* lanes_<type>_avx512vnni, for the pair kernels of the same CPUs */
#include "qtile.h"
#undef KLANES_EXPORT
#undef KSUFFIX
#undef KVNNI
#undef KNT
#undef DPBUSD
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avxvnni")
#define KSUFFIX avxvnni
#define KVNNI 1
#define DPBUSD(acc, w, x) _mm256_dpbusd_avx_epi32(acc, w, x)
#define KNT(type) 4
#include "qtile.h"
#undef KSUFFIX
#undef KVNNI
#undef KNT
#undef DPBUSD
#pragma GCC pop_options
#endif
