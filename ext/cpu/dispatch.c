/* Runtime ISA dispatch: the best path is picked once from cpuid; cpu_set_path forces one (the cpu_path setting,
 * and tests that compare paths on one machine). The library itself is built for baseline x86-64. */
#include "inferd.h"

static int active_path = -1;

static int can_run(int path) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    switch (path) {
    case PATH_SCALAR: return 1;
    case PATH_AVX2: return avx2;
    case PATH_AVX512VNNI:
        return avx2 && __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl") &&
               __builtin_cpu_supports("avx512bw");
    case PATH_AVXVNNI: return avx2 && __builtin_cpu_supports("avxvnni");
    }
    return 0;
#else
    return path == PATH_SCALAR;
#endif
}

int cpu_best_path(void) {
    if (can_run(PATH_AVXVNNI)) return PATH_AVXVNNI;
    if (can_run(PATH_AVX512VNNI)) return PATH_AVX512VNNI;
    if (can_run(PATH_AVX2)) return PATH_AVX2;
    return PATH_SCALAR;
}

const char *cpu_path_name(int path) {
    switch (path) {
    case PATH_SCALAR: return "scalar";
    case PATH_AVX2: return "avx2";
    case PATH_AVX512VNNI: return "avx512vnni";
    case PATH_AVXVNNI: return "avxvnni";
    }
    return "?";
}

int cpu_set_path(int path) {
    if (path < PATH_SCALAR || path > PATH_AVXVNNI || !can_run(path)) return -1;
    active_path = path;
    return 0;
}

int cpu_path(void) {
    if (active_path < 0) active_path = cpu_best_path();   /* the cpu_path setting forces one through cpu_set_path */
    return active_path;
}
