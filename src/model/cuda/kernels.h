/* kernels.h - the CUDA backend's internal interface: its state (stream, cuBLAS, scratch sized at
 * creation) and the launchers of every kernel file. Launchers own the grid arithmetic; they
 * never allocate and never synchronise, so every one of them can be captured into a graph. */
#ifndef STRATA_CUDA_KERNELS_H
#define STRATA_CUDA_KERNELS_H

#include "gpu.h"

#ifdef __cplusplus
extern "C" {
#endif
#include "model/backend.h"
#include "model/config.h"
#include "util.h"
#include "cuda.h"

#define CUDA_MAX_GRAPHS 400 /* two decode-step variants, argmax or sample, for each of up to 64 sequences; two batched-step variants for each row count up to 64; spare */
#define CUDA_ARGMAX_BLOCKS 264
#define CUDA_STAGE_BYTES (1u << 20) /* pinned staging buffer for small copies */

struct cuda_graph_slot {
    int key;
    gpu_graph graph;
    gpu_graph_exec exec;
};

/* One decode GEMV: cuda_gemv's arguments and the chosen threads per row pair, as a kernel
 * argument. */
#define CUDA_TRACE_JOBS 256
#define CUDA_TRACE_STRIDE (4 * 132 * 4) /* timestamps per job: 4 per block, <= 4 blocks per SM */
/* A decode GEMV whose rows other kernels may start on before it ends (cuda_gemv_early): the
 * order of its row pairs, which of them count, and where. */
struct cuda_early {
    int rot;       /* order: pair (p + rot) % pairs, or with hp_log2 > 0, an attention qkv's: */
    int hp_log2;   /* k and v, then each head's q, then each head's gate (2^hp_log2 = hd / 2) */
    int nh, kvp;   /* query heads; k and v pairs (nKV hd) */
    int early;     /* each block counts once its pairs among the first `early` are written */
    int *cnt;
    float *sz;     /* or NULL: silu(z) (fp32) of rows z0 .. z0 + nz - 1, for the DeltaNet out_proj */
    int z0, nz;
};

struct cuda_gemv_job {
    uint16_t *out;
    const uint16_t *x, *norm_w, *W;
    int N, K, accumulate, swiglu, tpr;
    struct cuda_early early;   /* cuda_gemv_early's order and count (early.cnt NULL: none) */
    const float *gsz;          /* gated DeltaNet norm of x (cuda_gemv_gated): silu(z), or NULL */
    const float *gnorm_w;      /* its weights (dv,) */
    int gdv;                   /* its head size */
    int *tail_ctr;             /* or NULL: the dynamic tail (gemv_tail_kernel): pairs tail_start..
                                  taken from tail_ctr[0] (tail_ctr[1]: blocks done; both left 0) */
    int tail_start;
    unsigned long long *trace; /* NULL, or (blocks, 4) timestamps: entry, inputs ready, x staged,
                                  rows done (STRATA_TRACE=1) */
};

/* STRATA_TRACE=1 also stamps the blocks of the decode step's DeltaNet and attention kernels:
 * entry, inputs ready (past the wait), prep done, main loop done, partial published (counter),
 * last block done; a stamp left 0 was not reached (a block with no work, or not the last). */
#define CUDA_KTRACE_JOBS 64
#define CUDA_EARLY_SLOTS 128 /* mixer layers with a counter pair (cuda_gemv_early) */
#define CUDA_KTRACE_BLOCKS 1024
#define CUDA_KTRACE_STAMPS 6
#define CUDA_KTRACE_STRIDE (CUDA_KTRACE_BLOCKS * CUDA_KTRACE_STAMPS)

/* Kernel timing for the benchmark: when `profile` is set, each op records an event pair. */
#define CUDA_PROF_MAX 2048
struct cuda_prof {
    int on, n;
    const char *name[CUDA_PROF_MAX];
    gpu_event ev[CUDA_PROF_MAX + 1];
};

/* The GEMM library's algorithm for a shape: per (N, K, pointer alignment) and row bucket
 * (cuda_gemm_bucket: T rounded up, so a new prompt length finds its plan made), or exact T (m < 0)
 * where a bucket's algorithm does not take that T. */
#define CUDA_GEMM_PLANS 4096
struct cuda_gemm_plan {
    int N, K, m;              /* m: the bucket, or -T */
    unsigned align;
    int state;                /* 0 empty, 1 algo, 2 the library offered none */
    gpu_gemm_algo algo;
};
/* The shapes cuda_gemm has run, for cuda_gemm_warm: the weights of one call, the largest T. */
#define CUDA_GEMM_SHAPES 64
struct cuda_gemm_shape {
    int N, K, max_T;
    unsigned align;
    const void *W;
};

struct cuda {
    struct gpu_info info;
    gpu_stream stream;
    gpu_blas blas;
    void *blas_ws;            /* cuBLAS workspace */
    size_t blas_ws_bytes;
    struct cuda_gemm_plan *gemm_plans; /* (CUDA_GEMM_PLANS,) open addressing */
    int n_gemm_plans;
    long gemm_picks;          /* the library's heuristic asked (tests: none after cuda_gemm_warm) */
    struct cuda_gemm_shape gemm_shapes[CUDA_GEMM_SHAPES];
    int n_gemm_shapes;
    struct cuda_graph_slot graphs[CUDA_MAX_GRAPHS];
    int n_graphs;
    int capturing;            /* key being captured, 0 if none */
    uint8_t *stage;           /* (CUDA_STAGE_BYTES,) pinned host staging */
    size_t stage_off;
    long n_launches;          /* kernels + cuBLAS calls issued (counts what a graph records) */
    int pdl;                  /* decode kernels use programmatic dependent launch (STRATA_PDL=0: off) */
    struct cuda_prof prof;
    /* paths the tests force (backend_cuda_test_knobs; defaults in backend_cuda_create) */
    int gemv_shape;           /* forces GEMV shape i (-1: chosen per GEMV, gemv_pick) */
    int gemv_tail;            /* the last R rounds of a long plain GEMV taken from a counter (4) */
    int gemv_tail_min;        /* ... from this many rounds (8) (launch_gemv) */
    int gemv_wide;            /* the shape of the GEMVs with many rows (cuda_gemv_wide_shape) */
    unsigned long long *trace; /* STRATA_TRACE=1: GEMV timestamps of the last decode step */
    int trace_n;               /* GEMV jobs traced since the last reset */
    int trace_blocks[CUDA_TRACE_JOBS], trace_N[CUDA_TRACE_JOBS], trace_K[CUDA_TRACE_JOBS];
    int trace_flags[CUDA_TRACE_JOBS]; /* 1 norm, 2 accumulate, 4 swiglu, threads per row << 4 */
    unsigned long long *ktrace; /* STRATA_TRACE=1: (CUDA_KTRACE_JOBS, CUDA_KTRACE_STRIDE) stamps */
    int ktrace_n;               /* mixer kernels traced since the last reset */
    int ktrace_kind[CUDA_KTRACE_JOBS];  /* 0 DeltaNet step, 1 attention */
    int ktrace_gemv[CUDA_KTRACE_JOBS];  /* the traced GEMV before it (-1: none) */
    int ktrace_blocks[CUDA_KTRACE_JOBS];
    int bulk;                 /* sm_90: a batched step's rows GEMM (2..16 rows) by the copy engine */
    int skip;                 /* STRATA_SKIP_DECODE (timing experiments only, wrong results):
                                 bit 0 drops the DeltaNet step kernels, bit 1 the attention */

    /* constants */
    uint16_t *rope_cos, *rope_sin; /* (max_ctx, rotary_dim / 2) bf16, as torch rounds them */

    /* scratch, sized from the config, max_ctx and max_T */
    uint16_t *xn;      /* (max_T, max_K) normalised matmul inputs */
    uint16_t *y;       /* (max_T, max_N) matmul outputs before the residual add / SwiGLU */
    size_t xn_elems, y_elems;
    uint16_t *add_x;   /* a prefill residual add not launched yet: add_x += y over add_n elements,
                          done in the pass of the RMSNorm that reads add_x next (op_matmul), or by
                          cuda_of before any other op (cuda_add_flush) */
    size_t add_n;
    uint16_t *attn_q;  /* (max_T, nH, hd) normalised, rotated queries */
    float *attn_part;  /* (nH, attn_splits, hd + 2) split-KV partials: acc, max, sum */
    int attn_splits;
    int attn_short;     /* decode: a block per query head up to this many keys (512, run 40;
                           0: split-KV always; backend_cuda_test_knobs) */
    int flash_wg;       /* prefill attention by attn_flash_wg_kernel (wgmma): built for sm_90a and
                           running on compute capability 9.0; 0: attn_flash_kernel (mma.sync) */
    float *flash_part;  /* its split-KV partials (cuda_flash_part_bytes) */
    size_t flash_part_bytes;
    int attn_mode;      /* decode attention kernels to launch: 0 short, 1 split, -1 both
                           (op_graph_variant sets it for one step) */
    const uint16_t *attn_q_norm, *attn_k_norm; /* decode: recorded by cuda_attn_prep(T = 1) for
                                                 cuda_attn_decode, which folds the prep in */
    int *attn_cnt, attn_target; /* decode: the short kernel starts on the qkv GEMV's count
                                   (cuda_gemv_early) instead of its end; NULL: not */
    uint16_t *gdn_y;   /* (max_T, conv_dim) conv + SiLU outputs */
    float *gdn_qk;     /* (max_T, 2, Hk, dk) L2-normalised q (scaled) and k */
    float *gdn_bg;     /* (max_T, Hv, 2) beta, g */
    uint16_t *gdn_o;   /* (max_T, Hv, dv) delta-rule outputs */
    uint16_t *gdn_w, *gdn_kd; /* per 64-token chunk: the chunked prefill's W and decayed k^T, bf16 hi / lo */
    float *gdn_u;          /* (max_T, Hv, dv) its U */
    float *gdn_a;      /* (max_T, Hv, 64) its in-chunk q k^T with decay (gdn.cu GDN_C) */
    uint16_t *gdn_h, *gdn_vn; /* per 64-token chunk: its starting state and v_new, bf16 hi / lo (gdn.cu) */
    float *gdn_sz;     /* (Hv, dv) decode: silu(z), from the step or (early) the in_proj */
    int *early_cnt;    /* (2 CUDA_EARLY_SLOTS,) decode: per mixer layer, the count of the early
                          GEMV's blocks with their early pairs written and the mixer's of its
                          blocks done (cuda_gemv_early; both back at zero after each step) */
    const void *early_key[CUDA_EARLY_SLOTS]; /* the layer of each pair: its input projection
                                                (the weights: every sequence shares them) */
    int *counters;     /* (256,) last-block counters, always left at zero: [0] argmax, [1] sample, [2] logprobs, [8, 9]
                          the GEMV tail (cuda_gemv_job.tail_ctr), [64 ..) attention decode */
    size_t scratch_bytes; /* device bytes of everything above, allocated at creation */
    float *argmax_part; /* (CUDA_ARGMAX_BLOCKS, 2) value, index */
    float *sample_part; /* (64 blocks, BACKEND_SAMPLE_KMAX, 2) key, id, then (64, 2) max, sum:
                           sample.cu */
    unsigned *n_posts;  /* (1,) argmax choices posted so far (device) */
    unsigned long long *mail, *mail_dev; /* (BACKEND_POSTS,) pinned, mapped: post n at n %
                                            BACKEND_POSTS as n << 32 | choice */
    int32_t *rows_mail; /* (BACKEND_POSTS, BACKEND_ROWS_MAX) pinned: rows post n at n % BACKEND_POSTS */
    gpu_event rows_ev[BACKEND_POSTS]; /* each rows post's copy done */
    int64_t n_rows_posts;
};

/* The backend's state, any pending residual add left as it is (the ops that may fuse it). */
static inline struct cuda *cuda_peek(struct backend *be) { return (struct cuda *)be->impl; }
void cuda_add_flush(struct cuda *cu); /* launches the pending add, if any */
/* The backend's state, with every op before this one launched. */
static inline struct cuda *cuda_of(struct backend *be) {
    struct cuda *cu = cuda_peek(be);
    if (cu->add_x) cuda_add_flush(cu);
    return cu;
}

/* Tracing: stamp slots for a mixer kernel of `blocks` blocks being recorded (NULL when off). */
static inline unsigned long long *cuda_ktrace_slot(struct cuda *cu, int kind, int blocks) {
    if (!cu->ktrace || !cu->capturing || cu->ktrace_n >= CUDA_KTRACE_JOBS || blocks > CUDA_KTRACE_BLOCKS)
        return NULL;
    int n = cu->ktrace_n++;
    cu->ktrace_kind[n] = kind;
    cu->ktrace_gemv[n] = cu->trace_n - 1;
    cu->ktrace_blocks[n] = blocks;
    return cu->ktrace + (size_t)n * CUDA_KTRACE_STRIDE;
}
#ifdef __CUDACC__
/* Stamp i of this block (thread 0; tr NULL: tracing off). */
static __device__ __forceinline__ void ktrace_stamp(unsigned long long *tr, int i) {
    if (tr && threadIdx.x == 0)
        tr[(size_t)(blockIdx.x + gridDim.x * blockIdx.y) * CUDA_KTRACE_STAMPS + i] = gpu_time_ns();
}
#endif

/* Profiling hooks around each op (no-ops unless prof.on). */
void cuda_prof_begin(struct cuda *cu, const char *name);
void cuda_prof_end(struct cuda *cu);
/* Inside an op's cuda_prof_begin / end: ends the part recorded so far and begins one named
 * `name` (the op's time split between its kernels in the profile). */
static inline void cuda_prof_split(struct cuda *cu, const char *name) {
    cuda_prof_end(cu);
    cuda_prof_begin(cu, name);
}

/* misc.cu */
void cuda_embed(struct cuda *cu, uint16_t *out, const uint16_t *table, const int32_t *ids, int T,
                int H, int V);
void cuda_argmax(struct cuda *cu, int32_t *out, const uint16_t *x, int n, int32_t *pos);
void cuda_sample(struct cuda *cu, int32_t *out, const uint16_t *x, int n,
                 const struct backend_sample_state *st, int32_t *pos, int host_pos);
void cuda_logprobs(struct cuda *cu, float *out, const uint16_t *x, int n, int k, const int32_t *chosen);
void cuda_rmsnorm(struct cuda *cu, uint16_t *out, const uint16_t *x, const uint16_t *w, int T,
                  int K, float eps);
/* x = bf16(x + y), then out = cuda_rmsnorm's of x, in one pass */
void cuda_add_rmsnorm(struct cuda *cu, uint16_t *out, uint16_t *x, const uint16_t *y,
                      const uint16_t *w, int T, int K, float eps);

/* matmul.cu */
void cuda_gemv(struct cuda *cu, uint16_t *out, const uint16_t *x, const uint16_t *norm_w,
               const uint16_t *W, int N, int K, float eps, int accumulate, int swiglu);
/* out (N,) = bf16(out + bf16(x W^T)) where x = the DeltaNet gated RMSNorm of o (K,) bf16, per
 * head of dv values: bf16(bf16(norm_w * bf16(o * rsqrt(mean(o^2) + eps))) * sz), sz = silu(z). */
int cuda_gemv_gated_ok(int K, int dv); /* the shapes cuda_gemv_gated takes */
int cuda_gemv_wide_shape(int hidden); /* see matmul.cu gemv_pick */
int cuda_gemv_regs(int shape, int *threads); /* registers per thread of its plain kernel */
void cuda_gemv_gated(struct cuda *cu, uint16_t *out, const uint16_t *o, const float *sz,
                     const float *norm_w, int dv, const uint16_t *W, int N, int K, float eps);
int cuda_gemv_early(struct cuda *cu, uint16_t *out, const uint16_t *x, const uint16_t *norm_w,
                    const uint16_t *W, int N, int K, float eps, const struct cuda_early *e);
long cuda_gemv_groups(struct cuda *cu, int N, int K, int norm);
/* A batched decode step's rows (2..8) on tensor cores: out (T, N) = bf16(xn W^T), xn =
 * norm_w ? rmsnorm(x) : x (accumulate: bf16(out + that); swiglu: W (2N, K) = [gate; up], out
 * (T, N) the SwiGLU), where cuda_gemm_rows_ok. */
int cuda_gemm_rows_ok(const struct cuda *cu, int T, int K);
void cuda_gemm_rows(struct cuda *cu, uint16_t *out, const uint16_t *x, const uint16_t *norm_w,
                    const uint16_t *W, int T, int N, int K, float eps, int accumulate, int swiglu);
void cuda_add(struct cuda *cu, uint16_t *out, const uint16_t *y, size_t n);
void cuda_argmax_rows(struct cuda *cu, int32_t *out, const uint16_t *x, int n, int B);
void cuda_swiglu(struct cuda *cu, uint16_t *out, const uint16_t *gu, int T, int I);
void cuda_gemm(struct cuda *cu, uint16_t *out, const uint16_t *x, const uint16_t *W, int T, int N,
               int K);
int cuda_gemm_bucket(int T);
/* Makes (and runs once, loading its kernel) the plan of every row bucket up to max_T of every
 * shape run so far (up to the largest T it ran, for shapes only ever run on a few rows). It runs
 * them with the weights of each shape's first call: those must still be allocated (the model's). */
void cuda_gemm_warm(struct cuda *cu, int max_T);

/* attention.cu. Decode (T = 1): cuda_attn_prep only records the norm weights and
 * cuda_attn_decode launches one kernel doing prep, split-KV attention, merge and gate; prefill:
 * prep kernel then the causal kernel. */
void cuda_attn_prep(struct cuda *cu, const struct config *c, int max_ctx, uint16_t *q_out,
                    const uint16_t *qkv, const uint16_t *q_norm, const uint16_t *k_norm,
                    uint16_t *k_cache, uint16_t *v_cache, const int32_t *pos, int T);
void cuda_attn_decode(struct cuda *cu, const struct config *c, int max_ctx, uint16_t *out,
                      const uint16_t *q, const uint16_t *qkv, const uint16_t *k_cache,
                      const uint16_t *v_cache, const int32_t *pos);
/* A batched step's attention rows: row b's KV block rows.kv[b] (a device array), its k and v
 * caches at these byte offsets; qkv and out rows qkv_row / out_row elements apart; row: the row
 * of a per-row launch (set by the launcher). */
struct cuda_attn_rows {
    char *const *kv;
    size_t k_off, v_off, qkv_row, out_row;
    int row;
};
void cuda_attn_decode_rows(struct cuda *cu, const struct config *c, int max_ctx, uint16_t *out,
                           const uint16_t *qkv, const struct cuda_attn_rows *rows,
                           const int32_t *pos, int B);
size_t cuda_flash_part_bytes(const struct cuda *cu, const struct config *c);
void cuda_attn_prefill(struct cuda *cu, const struct config *c, int max_ctx, uint16_t *out,
                       const uint16_t *q, const uint16_t *qkv, const uint16_t *k_cache,
                       const uint16_t *v_cache, const int32_t *pos, int T, int q_from);

/* gdn.cu. Decode: obuf (value_dim,) gets the delta rule's o as bf16 and sz (value_dim,) silu(z),
 * for the gated norm cuda_gemv_gated applies; prefill: out (T, value_dim) is the gated norm's
 * output. With cnt (decode), the step reads proj once cnt[0] >= target (cuda_gemv_early, which
 * also writes sz) instead of after the whole previous kernel, and leaves cnt[0], cnt[1] zero. */
int cuda_gdn_step_regs(struct cuda *cu, const struct config *c, int *threads); /* its kernel's */
void cuda_gdn_step(struct cuda *cu, const struct config *c, uint16_t *obuf, float *sz, const uint16_t *proj,
                   uint16_t *conv_state, const uint16_t *conv_w, const float *A_log,
                   const float *dt_bias, float *state, const int32_t *pos, int *cnt, int target);
/* A batched step's DeltaNet rows: row b's states in blocks[b] (a device array) at these byte
 * offsets, its proj row proj_row elements after the one before. */
struct cuda_gdn_rows {
    char *const *blocks;
    size_t state_off, conv_off, proj_row;
};
void cuda_gdn_step_rows(struct cuda *cu, const struct config *c, uint16_t *out, const uint16_t *proj,
                        const uint16_t *conv_w, const float *A_log, const float *dt_bias,
                        const float *norm_w, const struct cuda_gdn_rows *rows, const int32_t *pos,
                        int B);
/* out (T, value_dim) = the gated RMSNorm of cu->gdn_o (the step's or the scan's o) with z; with
 * conv_state (a prefill call's ring, NULL otherwise), the ring moved on past the call's T inputs. */
void cuda_gdn_norm(struct cuda *cu, const struct config *c, uint16_t *out, const uint16_t *proj,
                   const float *norm_w, int T, uint16_t *conv_state, const int32_t *pos);
/* snap (or NULL): the states after snap->t[i] tokens (multiples of cuda_gdn_chunk() or T), as
 * the gdn op's (backend.h), written by the chunk pass as it goes. */
void cuda_gdn_prefill(struct cuda *cu, const struct config *c, uint16_t *out, const uint16_t *proj,
                      uint16_t *conv_state, const uint16_t *conv_w, const float *A_log,
                      const float *dt_bias, const float *norm_w, float *state, const int32_t *pos,
                      int T, const struct backend_snap *snap);
int cuda_gdn_chunk(void); /* tokens per chunk of the prefill's delta rule */

#ifdef __cplusplus
}
#endif
#endif
