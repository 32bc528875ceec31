/* pool.c - see pool.h. One job at a time: the caller publishes it under a generation number,
 * workers take their range, the caller runs range 0 and waits for the count of finished workers.
 * Waiting is a short spin (decode issues its parallel loops back to back, so a worker often finds
 * the next job while spinning) and then a condition variable. */
#include "pool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#include "util.h"

/* Spin before sleeping: ~500 pause instructions, tens of microseconds. Longer spins lose the
 * core to the spinner when other programs are busy (measured: see bench/RESULTS.md). */
#define SPIN_ITERS 500

struct pool {
    int n;              /* threads, the caller included */
    pthread_t *threads; /* (n - 1,) */
    pthread_mutex_t mu;
    pthread_cond_t wake, done;
    atomic_int gen;      /* job number; bumped to publish a job */
    atomic_int finished; /* workers done with the current job */
    int stop;
    /* the job */
    void (*fn)(void *ctx, int lo, int hi, int thread);
    void *ctx;
    int count;
};

struct worker_arg {
    struct pool *p;
    int index;
};

static void run_range(struct pool *p, int t) {
    int lo = (int)((long)p->count * t / p->n), hi = (int)((long)p->count * (t + 1) / p->n);
    if (lo < hi) p->fn(p->ctx, lo, hi, t);
}

static void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static void *worker(void *arg) {
    struct worker_arg *wa = arg;
    struct pool *p = wa->p;
    int t = wa->index, seen = 0;
    free(wa);
    for (;;) {
        int g = atomic_load_explicit(&p->gen, memory_order_acquire);
        for (int i = 0; g == seen && i < SPIN_ITERS; i++) {
            cpu_relax();
            g = atomic_load_explicit(&p->gen, memory_order_acquire);
        }
        if (g == seen) {
            pthread_mutex_lock(&p->mu);
            while ((g = atomic_load_explicit(&p->gen, memory_order_acquire)) == seen && !p->stop)
                pthread_cond_wait(&p->wake, &p->mu);
            int stop = p->stop;
            pthread_mutex_unlock(&p->mu);
            if (stop) return NULL;
        }
        seen = g;
        run_range(p, t);
        if (atomic_fetch_add_explicit(&p->finished, 1, memory_order_acq_rel) == p->n - 2) {
            pthread_mutex_lock(&p->mu); /* the last worker: wake the caller if it sleeps */
            pthread_cond_signal(&p->done);
            pthread_mutex_unlock(&p->mu);
        }
    }
}

struct pool *pool_create(int n_threads) {
    if (n_threads <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = n > 0 ? (int)n : 1;
    }
    struct pool *p = xcalloc(1, sizeof *p);
    p->n = n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->wake, NULL);
    pthread_cond_init(&p->done, NULL);
    p->threads = xcalloc((size_t)n_threads, sizeof *p->threads);
    for (int t = 1; t < n_threads; t++) {
        struct worker_arg *wa = xmalloc(sizeof *wa);
        wa->p = p;
        wa->index = t;
        CHECK(pthread_create(&p->threads[t - 1], NULL, worker, wa) == 0);
    }
    return p;
}

void pool_free(struct pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    for (int t = 1; t < p->n; t++) pthread_join(p->threads[t - 1], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->wake);
    pthread_cond_destroy(&p->done);
    free(p->threads);
    free(p);
}

int pool_size(const struct pool *p) { return p->n; }

void pool_for(struct pool *p, int n, void (*fn)(void *ctx, int lo, int hi, int thread), void *ctx) {
    if (n <= 0) return;
    p->fn = fn;
    p->ctx = ctx;
    p->count = n;
    if (p->n == 1) {
        run_range(p, 0);
        return;
    }
    atomic_store_explicit(&p->finished, 0, memory_order_relaxed);
    pthread_mutex_lock(&p->mu); /* publish under the lock so a worker about to sleep sees it */
    atomic_fetch_add_explicit(&p->gen, 1, memory_order_acq_rel);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    run_range(p, 0);
    for (int i = 0; i < SPIN_ITERS; i++) {
        if (atomic_load_explicit(&p->finished, memory_order_acquire) == p->n - 1) return;
        cpu_relax();
    }
    pthread_mutex_lock(&p->mu);
    while (atomic_load_explicit(&p->finished, memory_order_acquire) != p->n - 1)
        pthread_cond_wait(&p->done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}
