/* Persistent worker pool. Workers spin on an epoch counter for about a millisecond after each job (decode
 * steps come back-to-back, and a condition-variable wake costs tens of microseconds), then sleep. Work is
 * claimed from an atomic counter in shrinking (guided) claims so cores of different speed finish together;
 * the caller works too, so a pool of n threads has n-1 workers. A thread that has spun for 50 us calls
 * sched_yield between polls: on a core shared with other work (another process, the server's own Python
 * threads) it hands the core over instead of burning the time slice the working thread needs; back-to-back
 * regions of one step never wait that long, so the quiet case keeps its pure spin.
 *
 * A worker joins a job by taking a seat at its gate, and the caller closes the gate once it has drained the
 * work, then waits only for the workers that joined. A worker whose core is taken by another process (it has
 * not even seen the job yet) therefore costs nothing: the caller does its share and moves on, instead of
 * waiting a whole time slice for it to check in at every one of the hundreds of regions of a step. */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>
#include "inferd.h"

#define SPIN_NS 1000000LL
#define YIELD_AFTER_NS 50000LL
#define SEAT_BITS 16
#define SEATS_MASK ((1ULL << SEAT_BITS) - 1)

struct pool {
    int nthreads;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t wake, done;
    _Atomic uint64_t epoch;      /* bumped per job; idle workers watch it */
    _Atomic uint64_t gate;       /* (job epoch << SEAT_BITS) | seats still free */
    _Atomic int finished;        /* workers that joined the current job and are done with it */
    _Atomic int caller_sleeping; /* the caller waits on `done`: finishing workers must signal */
    _Atomic int64_t next;        /* next unclaimed item */
    int64_t n, chunk;
    pool_fn fn;
    void *arg;
    int stop;
    int sleepers;
};

typedef struct { pool_t *p; int id; } worker_arg;

static uint64_t gate_of(uint64_t epoch, uint64_t seats) { return (epoch << SEAT_BITS) | seats; }

/* Take a seat in job `epoch`; 0 when it is over or every seat is taken (the caller closed the gate). */
static int join(pool_t *p, uint64_t epoch) {
    uint64_t g = atomic_load_explicit(&p->gate, memory_order_acquire);
    while (g >> SEAT_BITS == (epoch & (UINT64_MAX >> SEAT_BITS)) && (g & SEATS_MASK) > 0)
        if (atomic_compare_exchange_weak_explicit(&p->gate, &g, g - 1, memory_order_acquire, memory_order_acquire))
            return 1;
    return 0;
}

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* Guided claims: each takes 1/nthreads of what is left, never less than `chunk`. The threads start on long
 * contiguous stretches (a matmul's weights stream in long runs) and the claims shrink towards the end, so they
 * finish within one small claim of each other; fixed claims left one thread waiting at the end of each matmul
 * region (bench/results/design_measurements.md). */
static void drain(pool_t *p, int thread) {
    int64_t begin = atomic_load_explicit(&p->next, memory_order_relaxed);
    while (begin < p->n) {
        int64_t size = (p->n - begin) / p->nthreads;
        if (size < p->chunk) size = p->chunk;
        if (!atomic_compare_exchange_weak_explicit(&p->next, &begin, begin + size, memory_order_relaxed,
                                                   memory_order_relaxed))
            continue;                                  /* another thread claimed first: begin is reloaded */
        p->fn(p->arg, begin, begin + size < p->n ? begin + size : p->n, thread);
        begin = atomic_load_explicit(&p->next, memory_order_relaxed);
    }
}

static void *worker(void *varg) {
    worker_arg *wa = varg;
    pool_t *p = wa->p;
    int id = wa->id;
    free(wa);
    uint64_t seen = 0;
    for (;;) {
        int64_t start = now_ns(), spin_until = start + SPIN_NS;
        uint64_t e;
        int spins = 0, yielding = 0;
        while ((e = atomic_load_explicit(&p->epoch, memory_order_acquire)) == seen) {
            if (yielding) sched_yield();
            if (++spins % 256 == 0) {
                int64_t t = now_ns();
                yielding = t - start > YIELD_AFTER_NS;
                if (t <= spin_until) continue;
                pthread_mutex_lock(&p->mu);
                p->sleepers++;
                while ((e = atomic_load(&p->epoch)) == seen && !p->stop) pthread_cond_wait(&p->wake, &p->mu);
                p->sleepers--;
                pthread_mutex_unlock(&p->mu);
                break;
            }
#if defined(__x86_64__)
            __builtin_ia32_pause();
#endif
        }
        if (p->stop) return NULL;
        seen = e;
        if (!join(p, e)) continue;                     /* the job went on without this worker */
        drain(p, id);
        atomic_fetch_add(&p->finished, 1);
        if (atomic_load(&p->caller_sleeping)) {
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->done);
            pthread_mutex_unlock(&p->mu);
        }
    }
}

pool_t *pool_create(int nthreads) {
    if (nthreads < 1) nthreads = 1;
    pool_t *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->nthreads = nthreads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->wake, NULL);
    pthread_cond_init(&p->done, NULL);
    p->threads = calloc(nthreads, sizeof(pthread_t));
    if (!p->threads) {
        pthread_mutex_destroy(&p->mu);
        pthread_cond_destroy(&p->wake);
        pthread_cond_destroy(&p->done);
        free(p);
        return NULL;
    }
    for (int i = 1; i < nthreads; i++) {   /* a worker that cannot start leaves a smaller pool, not a failure */
        worker_arg *wa = malloc(sizeof *wa);
        if (!wa) { p->nthreads = i; break; }
        wa->p = p; wa->id = i;
        if (pthread_create(&p->threads[i], NULL, worker, wa) != 0) { free(wa); p->nthreads = i; break; }
    }
    return p;
}

void pool_destroy(pool_t *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    atomic_fetch_add(&p->epoch, 1);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->nthreads; i++) pthread_join(p->threads[i], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->wake);
    pthread_cond_destroy(&p->done);
    free(p->threads);
    free(p);
}

int pool_size(const pool_t *p) { return p ? p->nthreads : 1; }

double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

void pool_run(pool_t *p, int64_t n, int64_t chunk, pool_fn fn, void *arg) {
    if (n <= 0) return;
    if (chunk < 1) chunk = 1;
    if (!p || p->nthreads == 1 || n <= chunk) { fn(arg, 0, n, 0); return; }
    p->n = n; p->chunk = chunk; p->fn = fn; p->arg = arg;
    atomic_store(&p->next, 0);
    atomic_store(&p->finished, 0);
    uint64_t e = atomic_load(&p->epoch) + 1;
    atomic_store_explicit(&p->gate, gate_of(e, (uint64_t)(p->nthreads - 1)), memory_order_release);
    pthread_mutex_lock(&p->mu);
    atomic_store_explicit(&p->epoch, e, memory_order_release);
    if (p->sleepers) pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    drain(p, 0);
    int joined = p->nthreads - 1 - (int)(atomic_exchange(&p->gate, gate_of(e, 0)) & SEATS_MASK);
    /* Wait for the workers that joined: spin first (they are usually a few microseconds behind), yield after
     * 50 us, sleep after many polls. */
    int64_t start = now_ns();
    int yielding = 0;
    for (int spins = 0; atomic_load_explicit(&p->finished, memory_order_acquire) < joined; spins++) {
        if (yielding) sched_yield();
        else if (spins % 256 == 255) yielding = now_ns() - start > YIELD_AFTER_NS;
        if (spins > 100000) {
            pthread_mutex_lock(&p->mu);
            atomic_store(&p->caller_sleeping, 1);
            while (atomic_load(&p->finished) < joined) pthread_cond_wait(&p->done, &p->mu);
            atomic_store(&p->caller_sleeping, 0);
            pthread_mutex_unlock(&p->mu);
            break;
        }
#if defined(__x86_64__)
        __builtin_ia32_pause();
#endif
    }
}
