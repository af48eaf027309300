/* Big long-lived buffers in transparent huge pages where the kernel allows them: a model's weights (one mapping
 * for all of them) and the bandwidth probe's buffer, which should read the same kind of memory. A decode step
 * streams every weight byte, about 90 MB for SmolLM2 Q4_0: some 22k pages of 4 KB, far past what the TLB maps
 * (Zen 4: 3072 entries, 12 MB), so the stream keeps paying page walks, two-level ones under a hypervisor. In 2 MB
 * pages the same bytes take about 45 entries (what that gains: bench/results/design_measurements.md). The KV cache
 * stays on 4 KB pages (see context_create). The mapping is 2 MB aligned and advised MADV_HUGEPAGE (the kernel's
 * "madvise" mode needs both); where THP is off it is plain anonymous memory. */
#include <stdint.h>
#include <sys/mman.h>
#include "inferd.h"

#define HUGE_PAGE ((size_t)2 << 20)

static size_t mapped_len(size_t n) { return n ? (n + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1) : HUGE_PAGE; }

void *huge_alloc(size_t n) {
    size_t len = mapped_len(n);
    uint8_t *p = mmap(NULL, len + HUGE_PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
    uint8_t *a = (uint8_t *)(((uintptr_t)p + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1));
    if (a > p) munmap(p, (size_t)(a - p));                           /* the unaligned head */
    munmap(a + len, (size_t)(p + HUGE_PAGE - a));                     /* the rest past the end (a < p + 2 MB) */
#ifdef MADV_HUGEPAGE
    madvise(a, len, MADV_HUGEPAGE);                 /* advice: refused or unavailable means 4 KB pages */
#endif
    return a;
}

void huge_free(void *p, size_t n) {
    if (p) munmap(p, mapped_len(n));
}
