/* Big long-lived buffers in transparent huge pages where the kernel allows them: a model's weights (one mapping
 * for all of them) and the bandwidth probe's buffer, which should read the same kind of memory. A decode step
 * streams every weight byte, about 90 MB for SmolLM2 Q4_0: some 22k pages of 4 KB, far past what the TLB maps
 * (Zen 4: 3072 entries, 12 MB), so the stream keeps paying page walks, two-level ones under a hypervisor. In 2 MB
 * pages the same bytes take about 45 entries (what that gains: bench/results/design_measurements.md). The KV cache
 * stays on 4 KB pages (see context_create).
 *
 * The mapping is 2 MB aligned but first written on 4 KB pages: a huge page's first touch is the slow one (the
 * kernel zeroes 2 MB at once, and with THP's usual "madvise" defrag setting it compacts memory on the spot when
 * no free 2 MB page is at hand), and the weights' repack is the path to a ready server. Once the bytes are in
 * place, huge_collapse advises MADV_HUGEPAGE and asks for MADV_COLLAPSE (Linux 6.1 on) one 2 MB page at a time:
 * the kernel copies each into a huge page, so memory grows by at most one page while it runs. huge_collapse_start
 * does that on a thread of its own at the lowest priority, after the load, off the path to ready; a kernel
 * without MADV_COLLAPSE, or a page it refuses, leaves 4 KB pages, which khugepaged may still collapse in its own
 * time (the advice stays). With THP off, it is plain anonymous memory throughout. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>
#include "inferd.h"

#define HUGE_PAGE ((size_t)2 << 20)
#if defined(__linux__) && !defined(MADV_COLLAPSE)
#define MADV_COLLAPSE 25          /* older C headers than kernels: the kernel says at run time if it knows it */
#endif

static size_t mapped_len(size_t n) { return n ? (n + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1) : HUGE_PAGE; }

void *huge_alloc(size_t n) {
    size_t len = mapped_len(n);
    uint8_t *p = mmap(NULL, len + HUGE_PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
    uint8_t *a = (uint8_t *)(((uintptr_t)p + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1));
    if (a > p) munmap(p, (size_t)(a - p));                           /* the unaligned head */
    munmap(a + len, (size_t)(p + HUGE_PAGE - a));                     /* the rest past the end (a < p + 2 MB) */
    return a;
}

void huge_free(void *p, size_t n) {
    if (p) munmap(p, mapped_len(n));
}

static int thp_off(void) {
    char mode[128] = "";
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    if (!f) return 1;
    size_t got = fread(mode, 1, sizeof(mode) - 1, f);
    fclose(f);
    mode[got] = 0;
    return strstr(mode, "[never]") != NULL;
}

static int collapse_pages(void *p, size_t n, atomic_int *stop) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    if (!p || thp_off()) return HUGE_PAGES_NONE;
    uint8_t *a = p;
    size_t len = mapped_len(n), refused = 0;
    madvise(a, len, MADV_HUGEPAGE);               /* for khugepaged, where a page is refused below */
    for (size_t off = 0; off < len; off += HUGE_PAGE) {
        if (stop && atomic_load(stop)) return HUGE_PAGES_PARTLY;          /* stopped: nobody asks after this */
        int r = madvise(a + off, HUGE_PAGE, MADV_COLLAPSE);
        if (r && errno == EAGAIN) r = madvise(a + off, HUGE_PAGE, MADV_COLLAPSE);   /* a page busy for a moment */
        if (r && errno == EINVAL) return HUGE_PAGES_NONE;                        /* a kernel before 6.1 */
        refused += r != 0;
    }
    return refused ? HUGE_PAGES_PARTLY : HUGE_PAGES_ALL;
#else
    (void)p; (void)n; (void)stop;
    return HUGE_PAGES_NONE;
#endif
}

int huge_collapse(void *p, size_t n) { return collapse_pages(p, n, NULL); }

struct huge_collapser {
    void *p;
    size_t n;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t done;
    atomic_int stop, state;
};

static void *collapse_thread(void *arg) {
    huge_collapser_t *c = arg;
    setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), 19);   /* this thread only: requests come first */
    int state = collapse_pages(c->p, c->n, &c->stop);
    pthread_mutex_lock(&c->mu);
    atomic_store(&c->state, state);
    pthread_cond_broadcast(&c->done);
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

huge_collapser_t *huge_collapse_start(void *p, size_t n) {
    huge_collapser_t *c = calloc(1, sizeof(*c));
    if (!c) return NULL;
    c->p = p;
    c->n = n;
    atomic_init(&c->stop, 0);
    atomic_init(&c->state, HUGE_PAGES_COLLAPSING);
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->done, NULL);
    if (pthread_create(&c->thread, NULL, collapse_thread, c)) {
        pthread_cond_destroy(&c->done);
        pthread_mutex_destroy(&c->mu);
        free(c);
        return NULL;
    }
    return c;
}

int huge_collapse_state(huge_collapser_t *c) {
    return c ? atomic_load(&c->state) : HUGE_PAGES_NONE;
}

int huge_collapse_wait(huge_collapser_t *c) {
    if (!c) return HUGE_PAGES_NONE;
    pthread_mutex_lock(&c->mu);
    while (atomic_load(&c->state) == HUGE_PAGES_COLLAPSING) pthread_cond_wait(&c->done, &c->mu);
    pthread_mutex_unlock(&c->mu);
    return atomic_load(&c->state);
}

void huge_collapse_end(huge_collapser_t *c) {
    if (!c) return;
    atomic_store(&c->stop, 1);                    /* the thread stops before its next 2 MB page */
    pthread_join(c->thread, NULL);
    pthread_cond_destroy(&c->done);
    pthread_mutex_destroy(&c->mu);
    free(c);
}
