/* cuda.h - what the CUDA backend offers beyond backend.h, for the benchmark and the tests:
 * launch counts, per-op timing, device facts and a copy-bandwidth probe. Plain C, no CUDA
 * headers, so C files compiled without nvcc's include path can use it. */
#ifndef STRATA_CUDA_CUDA_H
#define STRATA_CUDA_CUDA_H

#include <stddef.h>
#include <stdio.h>

#include "model/backend.h"

/* Decode GEMV shapes (threads per row pair, words per item, pipeline depth) in matmul.cu's
 * table, from which the launcher picks per GEMV (test_cuda forces and checks each). */
#define CUDA_GEMV_SHAPES 12

/* Paths the tests force that the launchers would pick only for other shapes or positions. Set
 * right after backend_cuda_create, before any op; a field < -1 leaves the default. */
struct cuda_test_knobs {
    int gemv_shape;     /* 0 .. CUDA_GEMV_SHAPES-1: every decode GEMV in that shape; -1: picked */
    int gemv_tail;      /* the dynamic tail's rounds R (default 4; 0: off) ... */
    int gemv_tail_min;  /* ... in plain GEMVs of at least this many rounds (default 8) */
    int attn_short;     /* decode attention by a block per query head up to this many keys
                           (default 512; 0: split-KV always) */
    int flash_portable; /* 1: prefill attention by the mma.sync kernel even where the wgmma one
                           runs (sm_90a builds on compute capability 9.0) */
};
#define CUDA_TEST_KNOBS_DEFAULT {-2, -2, -2, -2, -2}
void backend_cuda_test_knobs(struct backend *be, const struct cuda_test_knobs *k);

/* Kernels and cuBLAS calls issued so far (a graph replay counts once per captured node). */
long backend_cuda_launches(struct backend *be);
/* Times the GEMM library's heuristic was asked for an algorithm (a plan made, cuda_gemm). */
long backend_cuda_gemm_picks(struct backend *be);
/* Nodes of the graph recorded under key (0 if none). */
long backend_cuda_graph_nodes(struct backend *be, int key);
/* While on, graphs are neither replayed nor recorded and every op is timed with events. */
void backend_cuda_profile(struct backend *be, int on);
/* Prints the per-op time recorded since profiling was switched on, divided by n_steps. */
void backend_cuda_profile_report(struct backend *be, FILE *f, int n_steps);
/* STRATA_TRACE=1: prints the GEMV timeline of the last decode step; 0 when not tracing. */
int backend_cuda_trace_report(struct backend *be, FILE *f);
/* Device bytes of the backend's own scratch (sized from the config, max_ctx and max_T: RoPE
 * tables, matmul / attention / DeltaNet scratch, cuBLAS workspace). */
size_t backend_cuda_scratch_bytes(struct backend *be);
/* Whether a block of the decode DeltaNet step fits on a multiprocessor beside the two blocks of
 * the GEMV before it (its state is then loaded while that GEMV streams): the registers of the
 * three against the multiprocessor's, as "fits: ..." or "does not fit: ..." in buf. 0 when the
 * model has no DeltaNet layers. */
int backend_cuda_residency(struct backend *be, char *buf, size_t cap);
/* Device name and multiprocessor count. */
void backend_cuda_info(struct backend *be, char *name, size_t name_cap, int *n_sm);
/* Device-to-device copy bandwidth in bytes (read + written) per second over `bytes`. */
double backend_cuda_copy_bandwidth(struct backend *be, size_t bytes);

#endif
