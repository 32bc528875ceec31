/* pool.h - the CPU backend's thread pool: a parallel for over [0, n) split into one contiguous
 * range per thread (the caller's thread runs the first). Workers wait for work by spinning
 * briefly, then sleeping on a condition variable, so a machine whose cores are busy with other
 * programs does not lose its time slices to spinning threads (OpenMP's default active wait cost
 * the 0.8B decode 70% with one of two cores busy; bench/RESULTS.md). */
#ifndef STRATA_CPU_POOL_H
#define STRATA_CPU_POOL_H

struct pool;

/* n_threads <= 0: one per online core. */
struct pool *pool_create(int n_threads);
void pool_free(struct pool *p);
int pool_size(const struct pool *p);

/* Calls fn(ctx, lo, hi, thread) for disjoint ranges covering [0, n), thread in [0, pool_size),
 * and returns when all are done. Not reentrant: one pool_for at a time per pool. */
void pool_for(struct pool *p, int n, void (*fn)(void *ctx, int lo, int hi, int thread), void *ctx);

#endif
