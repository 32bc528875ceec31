/* gpu.h - the only file that names the CUDA runtime and cuBLAS: types, checked calls and the
 * small device helpers every kernel file shares (warp reductions, bf16 <-> fp32, 16-byte loads).
 * A HIP port replaces this file (hip* / hipblas* names, warp size 64 where it applies) and leaves
 * the kernels alone. Nothing here knows the model. */
#ifndef STRATA_CUDA_GPU_H
#define STRATA_CUDA_GPU_H

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define WARP_SIZE 32
#define FULL_MASK 0xffffffffu

typedef cudaStream_t gpu_stream;
typedef cudaEvent_t gpu_event;
typedef cudaGraph_t gpu_graph;
typedef cudaGraphExec_t gpu_graph_exec;
typedef cublasLtHandle_t gpu_blas;
typedef cublasLtMatmulAlgo_t gpu_gemm_algo;

/* A failed runtime call is a bug or a dead device: name the call, file, line and the error. */
#define GPU_CHECK(call)                                                                        \
    do {                                                                                       \
        cudaError_t e_ = (call);                                                               \
        if (e_ != cudaSuccess) {                                                               \
            fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #call,               \
                    cudaGetErrorString(e_));                                                   \
            abort();                                                                           \
        }                                                                                      \
    } while (0)
#define BLAS_CHECK(call)                                                                       \
    do {                                                                                       \
        cublasStatus_t s_ = (call);                                                            \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                     \
            fprintf(stderr, "%s:%d: %s failed: cublas status %d\n", __FILE__, __LINE__, #call, \
                    (int)s_);                                                                  \
            abort();                                                                           \
        }                                                                                      \
    } while (0)
/* After a launch: configuration errors always; execution errors only with STRATA_GPU_DEBUG. */
#ifdef STRATA_GPU_DEBUG
#define GPU_LAUNCHED() GPU_CHECK(cudaDeviceSynchronize())
#else
#define GPU_LAUNCHED() GPU_CHECK(cudaPeekAtLastError())
#endif

/* ---- host side wrappers ---------------------------------------------------------------- */

struct gpu_info {
    char name[256];
    int n_sm;
    int l2_bytes;
    int smem_optin;      /* max dynamic shared memory per block after opting in */
    int regs_per_sm;     /* 32-bit registers per multiprocessor */
    int cc;              /* compute capability, major * 10 + minor */
    size_t free_bytes, total_bytes;
};

static inline int gpu_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n;
}
static inline const char *gpu_last_error_string(void) {
    return cudaGetErrorString(cudaGetLastError());
}
static inline void gpu_get_info(struct gpu_info *gi) {
    cudaDeviceProp p;
    GPU_CHECK(cudaGetDeviceProperties(&p, 0));
    snprintf(gi->name, sizeof gi->name, "%s", p.name);
    gi->n_sm = p.multiProcessorCount;
    gi->l2_bytes = p.l2CacheSize;
    gi->smem_optin = (int)p.sharedMemPerBlockOptin;
    gi->regs_per_sm = p.regsPerMultiprocessor;
    gi->cc = p.major * 10 + p.minor;
    GPU_CHECK(cudaMemGetInfo(&gi->free_bytes, &gi->total_bytes));
}
static inline int gpu_try_malloc(void **p, size_t bytes) {
    if (cudaMalloc(p, bytes ? bytes : 16) != cudaSuccess) {
        cudaGetLastError();
        return -1;
    }
    return 0;
}
static inline void gpu_mem_free_total(size_t *free_b, size_t *total_b) {
    GPU_CHECK(cudaMemGetInfo(free_b, total_b));
}
static inline void gpu_free(void *p) { GPU_CHECK(cudaFree(p)); }
static inline void *gpu_host_alloc(size_t bytes) {
    void *p = NULL;
    GPU_CHECK(cudaMallocHost(&p, bytes));
    return p;
}
/* Pinned host memory the device writes to directly; *dev: its address in kernels. */
static inline void *gpu_host_alloc_mapped(size_t bytes, void **dev) {
    void *p = NULL;
    GPU_CHECK(cudaHostAlloc(&p, bytes, cudaHostAllocMapped));
    GPU_CHECK(cudaHostGetDevicePointer(dev, p, 0));
    return p;
}
static inline void gpu_host_free(void *p) { GPU_CHECK(cudaFreeHost(p)); }
static inline void gpu_stream_create(gpu_stream *s) {
    GPU_CHECK(cudaStreamCreateWithFlags(s, cudaStreamNonBlocking));
}
static inline void gpu_stream_destroy(gpu_stream s) { GPU_CHECK(cudaStreamDestroy(s)); }
static inline void gpu_stream_sync(gpu_stream s) { GPU_CHECK(cudaStreamSynchronize(s)); }
/* 1 when everything queued on s has run, 0 while not; a device error aborts as GPU_CHECK. */
static inline int gpu_stream_done(gpu_stream s) {
    cudaError_t e = cudaStreamQuery(s);
    if (e == cudaErrorNotReady) return 0;
    GPU_CHECK(e);
    return 1;
}
static inline void gpu_memcpy_h2d(void *dst, const void *src, size_t n, gpu_stream s) {
    GPU_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, s));
}
static inline void gpu_memcpy_d2h(void *dst, const void *src, size_t n, gpu_stream s) {
    GPU_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, s));
}
static inline void gpu_memcpy_d2d(void *dst, const void *src, size_t n, gpu_stream s) {
    GPU_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, s));
}
/* height rows of width bytes, rows dpitch / spitch bytes apart */
static inline void gpu_memcpy_d2d_2d(void *dst, size_t dpitch, const void *src, size_t spitch,
                                     size_t width, size_t height, gpu_stream s) {
    GPU_CHECK(cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, height, cudaMemcpyDeviceToDevice, s));
}
static inline void gpu_memset(void *dst, int v, size_t n, gpu_stream s) {
    GPU_CHECK(cudaMemsetAsync(dst, v, n, s));
}
static inline void gpu_capture_begin(gpu_stream s) {
    GPU_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
}
static inline void gpu_capture_end(gpu_stream s, gpu_graph *g) {
    GPU_CHECK(cudaStreamEndCapture(s, g));
}
static inline void gpu_graph_instantiate(gpu_graph_exec *e, gpu_graph g) {
    GPU_CHECK(cudaGraphInstantiate(e, g, 0));
}
static inline size_t gpu_graph_n_nodes(gpu_graph g) {
    size_t n = 0;
    GPU_CHECK(cudaGraphGetNodes(g, NULL, &n));
    return n;
}
static inline void gpu_graph_launch(gpu_graph_exec e, gpu_stream s) {
    GPU_CHECK(cudaGraphLaunch(e, s));
}
static inline void gpu_graph_destroy(gpu_graph g, gpu_graph_exec e) {
    if (e) GPU_CHECK(cudaGraphExecDestroy(e));
    if (g) GPU_CHECK(cudaGraphDestroy(g));
}
static inline void gpu_event_create(gpu_event *e) { GPU_CHECK(cudaEventCreate(e)); }
static inline void gpu_event_create_sync(gpu_event *e) { /* waited on only, never timed */
    GPU_CHECK(cudaEventCreateWithFlags(e, cudaEventDisableTiming));
}
static inline void gpu_event_sync(gpu_event e) { GPU_CHECK(cudaEventSynchronize(e)); }
static inline void gpu_event_destroy(gpu_event e) { GPU_CHECK(cudaEventDestroy(e)); }
static inline void gpu_event_record(gpu_event e, gpu_stream s) { GPU_CHECK(cudaEventRecord(e, s)); }
static inline float gpu_event_ms(gpu_event a, gpu_event b) {
    float ms = 0;
    GPU_CHECK(cudaEventSynchronize(b));
    GPU_CHECK(cudaEventElapsedTime(&ms, a, b));
    return ms;
}
/* Resident blocks of `kernel` per multiprocessor at this block size and dynamic shared memory. */
#ifdef __cplusplus
template <typename F>
static inline int gpu_occupancy(F kernel, int threads, size_t smem) {
    int n = 0;
    GPU_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, threads, smem));
    return n;
}
/* Registers per thread the compiler gave `kernel`. */
template <typename F>
static inline int gpu_kernel_regs(F kernel) {
    cudaFuncAttributes a;
    GPU_CHECK(cudaFuncGetAttributes(&a, (const void *)kernel));
    return a.numRegs;
}
/* Static shared memory of `kernel` (bytes), beside the dynamic size a launch asks for. */
template <typename F>
static inline size_t gpu_kernel_static_smem(F kernel) {
    cudaFuncAttributes a;
    GPU_CHECK(cudaFuncGetAttributes(&a, (const void *)kernel));
    return a.sharedSizeBytes;
}
#endif
/* Launch with programmatic dependent launch allowed (pdl != 0): the kernel may start while the
 * previous kernel of the stream finishes; it must call grid_dependency_wait() before touching
 * anything that kernel wrote (or reads). Every kernel of the backend is launched this way; one
 * with nothing to do before the wait calls grid_launch_dependents() and the wait first thing,
 * which still hides its launch behind the kernel before and lets the next one start early (runs
 * 207-209, 4B: the DeltaNet rows' gated norm so, a batched step of 4 3.06 -> 2.96 ms; every
 * other plain launch so, a step of 16 on cuBLAS 4.27 -> 4.15, pp512 +2.7%, a 20-token prefill
 * 5.21 -> 4.99 ms). Since every kernel lets the next one start at its top, a kernel's work
 * before its wait may run beside the two kernels before it (more, where those have room to sit
 * resident at once): it may read only what none of them writes. The work before the waits is:
 * weights and norm weights (never written), the DeltaNet state and conv ring of its own layer
 * (written by its own kernel a step earlier, or by a prefill call's kernels for that layer, a
 * whole layer stack earlier), positions and row tables (uploaded by the host, or advanced by the
 * argmax / sample kernel that ends a graph: graph launches are ordered in full). */
template <typename... Exp, typename... Act>
static inline void gpu_launch(int pdl, void (*kernel)(Exp...), dim3 grid, dim3 block, size_t smem,
                              gpu_stream s, Act... args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = s;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = pdl ? 1 : 0;
    GPU_CHECK(cudaLaunchKernelEx(&cfg, kernel, args...));
}
/* A kernel's register cap per thread (not combinable with __launch_bounds__). A HIP port may
 * define it empty or as an equivalent launch bound. */
#define GPU_MAXNREG(n) __maxnreg__(n)
/* Lets a kernel use more than 48 KiB of dynamic shared memory. */
#define GPU_SMEM_OPTIN(kernel, bytes)                                                          \
    GPU_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)(bytes)))

/* cuBLASLt: C (row-major, T x N) = A (row-major, T x K) * W^T (W row-major N x K), bf16 in and
 * out, fp32 accumulation, the output rounded once (as torch's bf16 matmul). The algorithm is the
 * caller's (gpu_gemm_pick once per shape, then gpu_gemm_run): the library's own choice per call
 * costs ~0.3 ms of host time for every new T, and its first use of a kernel several ms more. */
static inline void gpu_blas_create(gpu_blas *h) { BLAS_CHECK(cublasLtCreate(h)); }
static inline void gpu_blas_destroy(gpu_blas h) { BLAS_CHECK(cublasLtDestroy(h)); }
/* the column-major view: C^T (N x T) = op_T(W as K x N) * A^T (K x T) */
struct gpu_gemm_desc {
    cublasLtMatmulDescOpaque_t d;
    cublasLtMatrixLayoutOpaque_t w, a, c;
};
static inline void gpu_gemm_desc_init(struct gpu_gemm_desc *g, int T, int N, int K) {
    const cublasOperation_t t = CUBLAS_OP_T, n = CUBLAS_OP_N;
    BLAS_CHECK(cublasLtMatmulDescInit((cublasLtMatmulDesc_t)&g->d, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    BLAS_CHECK(cublasLtMatmulDescSetAttribute((cublasLtMatmulDesc_t)&g->d, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t));
    BLAS_CHECK(cublasLtMatmulDescSetAttribute((cublasLtMatmulDesc_t)&g->d, CUBLASLT_MATMUL_DESC_TRANSB, &n, sizeof n));
    BLAS_CHECK(cublasLtMatrixLayoutInit((cublasLtMatrixLayout_t)&g->w, CUDA_R_16BF, K, N, K));
    BLAS_CHECK(cublasLtMatrixLayoutInit((cublasLtMatrixLayout_t)&g->a, CUDA_R_16BF, K, T, K));
    BLAS_CHECK(cublasLtMatrixLayoutInit((cublasLtMatrixLayout_t)&g->c, CUDA_R_16BF, N, T, N));
}
/* The library's first choice for (T, N, K) with every pointer aligned to `align` bytes and at
 * most ws_bytes of workspace: 1, or 0 when it offers none. */
static inline int gpu_gemm_pick(gpu_blas h, gpu_gemm_algo *algo, int T, int N, int K,
                                unsigned align, size_t ws_bytes) {
    struct gpu_gemm_desc g;
    gpu_gemm_desc_init(&g, T, N, K);
    cublasLtMatmulPreference_t pref;
    BLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    const uint64_t ws = ws_bytes;
    BLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    const cublasLtMatmulPreferenceAttributes_t al[] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    const uint32_t a32 = align;
    for (int i = 0; i < 4; i++) BLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, al[i], &a32, sizeof a32));
    /* split-K partials summed in fp32 only (not in place in the bf16 output, nor in its type):
     * the output rounded once */
    const uint32_t red = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
    BLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &red, sizeof red));
    cublasLtMatmulHeuristicResult_t r;
    int n = 0;
    const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(
        h, (cublasLtMatmulDesc_t)&g.d, (cublasLtMatrixLayout_t)&g.w, (cublasLtMatrixLayout_t)&g.a,
        (cublasLtMatrixLayout_t)&g.c, (cublasLtMatrixLayout_t)&g.c, pref, 1, &r, &n);
    BLAS_CHECK(cublasLtMatmulPreferenceDestroy(pref));
    if (st != CUBLAS_STATUS_SUCCESS || n < 1) return 0;
    *algo = r.algo;
    return 1;
}
/* C = A W^T with `algo`: 0, or -1 when the algorithm does not take this problem. */
static inline int gpu_gemm_run(gpu_blas h, const gpu_gemm_algo *algo, void *C, const void *A,
                               const void *W, int T, int N, int K, void *ws, size_t ws_bytes,
                               gpu_stream s) {
    struct gpu_gemm_desc g;
    gpu_gemm_desc_init(&g, T, N, K);
    const float one = 1.0f, zero = 0.0f;
    const cublasStatus_t st = cublasLtMatmul(
        h, (cublasLtMatmulDesc_t)&g.d, &one, W, (cublasLtMatrixLayout_t)&g.w, A,
        (cublasLtMatrixLayout_t)&g.a, &zero, C, (cublasLtMatrixLayout_t)&g.c, C,
        (cublasLtMatrixLayout_t)&g.c, algo, ws, ws_bytes, s);
    if (st == CUBLAS_STATUS_NOT_SUPPORTED || st == CUBLAS_STATUS_INVALID_VALUE) return -1;
    BLAS_CHECK(st);
    return 0;
}

/* ---- device helpers -------------------------------------------------------------------- */
#ifdef __CUDACC__

static __device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = WARP_SIZE / 2; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    return v;
}
static __device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = WARP_SIZE / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, o));
    return v;
}
/* sum over aligned groups of `width` lanes (width a power of two <= WARP_SIZE) */
static __device__ __forceinline__ float group_sum(float v, int width) {
    for (int o = width / 2; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    return v;
}
static __device__ __forceinline__ float shfl_xor(float v, int o) {
    return __shfl_xor_sync(FULL_MASK, v, o);
}
static __device__ __forceinline__ int shfl_xor_int(int v, int o) {
    return __shfl_xor_sync(FULL_MASK, v, o);
}
/* lane src's v, every lane */
static __device__ __forceinline__ float shfl_from(float v, int src) {
    return __shfl_sync(FULL_MASK, v, src);
}
static __device__ __forceinline__ int shfl_from(int v, int src) {
    return __shfl_sync(FULL_MASK, v, src);
}
/* whether c holds in any lane of the warp */
static __device__ __forceinline__ bool warp_any(bool c) { return __any_sync(FULL_MASK, c); }
/* the smallest power of two >= n (n >= 1): compile-time layouts padded to one */
static constexpr int pow2_ceil(int n) { return n <= 1 ? 1 : 2 * pow2_ceil((n + 1) / 2); }

/* Sums each of the NV values (NV a power of two <= WARP_SIZE) over the warp, a reduce-scatter:
 * returns in lane L the sum of value L / (WARP_SIZE / NV) (each sum in WARP_SIZE / NV lanes).
 * NV - 1 + log2(WARP_SIZE / NV) shuffles where NV warp_sums take NV log2(WARP_SIZE). */
template <int NV>
static __device__ __forceinline__ float warp_sum_scatter(float (&v)[NV]) {
    static_assert(NV >= 1 && NV <= WARP_SIZE && (NV & (NV - 1)) == 0, "NV: a power of two");
    const int lane = threadIdx.x % WARP_SIZE;
#pragma unroll
    for (int half = NV / 2, o = WARP_SIZE / 2; half >= 1; half /= 2, o /= 2) {
        const bool upper = lane & o; /* keeps the upper half of the values, sends the lower */
#pragma unroll
        for (int i = 0; i < half; i++) {
            const float send = upper ? v[i] : v[i + half], keep = upper ? v[i + half] : v[i];
            v[i] = keep + __shfl_xor_sync(FULL_MASK, send, o);
        }
    }
    float s = v[0];
#pragma unroll
    for (int o = WARP_SIZE / NV / 2; o > 0; o /= 2) s += __shfl_xor_sync(FULL_MASK, s, o);
    return s;
}

/* bf16 bits <-> fp32; rounding is round-to-nearest-even (as util.h) */
static __device__ __forceinline__ float bf2f(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }
static __device__ __forceinline__ uint16_t f2bf(float f) {
    /* the hardware conversion (one instruction; NaN comes out as the canonical 0x7fff, not
     * util.h's quieted payload) */
    return __bfloat16_as_ushort(__float2bfloat16_rn(f));
}
static __device__ __forceinline__ float bfr(float f) { return bf2f(f2bf(f)); }
static __device__ __forceinline__ float lo_bf(uint32_t w) { return __uint_as_float(w << 16); }
static __device__ __forceinline__ float hi_bf(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }
static __device__ __forceinline__ uint32_t pack_bf(float lo, float hi) {
    const __nv_bfloat162 v = __float22bfloat162_rn(make_float2(lo, hi)); /* .x: the low half */
    return (uint32_t)__bfloat16_as_ushort(v.x) | ((uint32_t)__bfloat16_as_ushort(v.y) << 16);
}
/* 8 bf16 in a 16-byte word -> fp32 */
static __device__ __forceinline__ void unpack8(uint4 v, float *f) {
    f[0] = lo_bf(v.x); f[1] = hi_bf(v.x); f[2] = lo_bf(v.y); f[3] = hi_bf(v.y);
    f[4] = lo_bf(v.z); f[5] = hi_bf(v.z); f[6] = lo_bf(v.w); f[7] = hi_bf(v.w);
}
/* 8 elements of the zero-centred RMSNorm: bf16(x * r * (1 + w)), r = rsqrt(mean(x^2) + eps) of
 * the row (cpu.c's rmsnorm_row). */
static __device__ __forceinline__ uint4 rmsnorm8(uint4 x, uint4 w, float r) {
    float f[8], g[8];
    unpack8(x, f);
    unpack8(w, g);
    return make_uint4(pack_bf(f[0] * r * (1.0f + g[0]), f[1] * r * (1.0f + g[1])),
                      pack_bf(f[2] * r * (1.0f + g[2]), f[3] * r * (1.0f + g[3])),
                      pack_bf(f[4] * r * (1.0f + g[4]), f[5] * r * (1.0f + g[5])),
                      pack_bf(f[6] * r * (1.0f + g[6]), f[7] * r * (1.0f + g[7])));
}

static __device__ __forceinline__ float dot8(uint4 a, uint4 b) {
    float s = lo_bf(a.x) * lo_bf(b.x);
    s = fmaf(hi_bf(a.x), hi_bf(b.x), s);
    s = fmaf(lo_bf(a.y), lo_bf(b.y), s);
    s = fmaf(hi_bf(a.y), hi_bf(b.y), s);
    s = fmaf(lo_bf(a.z), lo_bf(b.z), s);
    s = fmaf(hi_bf(a.z), hi_bf(b.z), s);
    s = fmaf(lo_bf(a.w), lo_bf(b.w), s);
    s = fmaf(hi_bf(a.w), hi_bf(b.w), s);
    return s;
}
/* d (16x8 fp32) += a (16x16 bf16, row) * b (16x8 bf16, col): tensor cores (sm_80 +). Fragments:
 * lane = 4 g + t; a[0] row g cols 2t, 2t+1; a[1] row g + 8, the same cols; a[2], a[3] those rows,
 * cols + 8; b0 rows (k) 2t, 2t+1 of col g, b1 rows + 8; d[0], d[1] row g cols 2t, 2t+1, d[2], d[3]
 * row g + 8. (A HIP port: the matrix-core intrinsics, or the callers' CUDA-core paths.) */
static __device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                                uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
static __device__ __forceinline__ uint32_t smem_addr(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}
/* 16 (4) bytes global -> shared, asynchronously (sm_80 +); src_bytes 0 zero-fills. Groups: commit
 * closes the group of the copies issued since the last one; wait_group<N> waits until at most N
 * groups are in flight. */
static __device__ __forceinline__ void cp_async16(uint32_t dst, const void *src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
static __device__ __forceinline__ void cp_async4(uint32_t dst, const void *src, int src_bytes) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
static __device__ __forceinline__ void cp_async_commit(void) { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
static __device__ __forceinline__ void cp_async_wait_group(void) {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
static __device__ __forceinline__ void cp_async_wait_all(void) { cp_async_wait_group<0>(); }
/* 8x8 b16 matrices from shared memory into mma fragments (sm_75 +): lane l gives the address of
 * row l % 8 of matrix l / 8 */
static __device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
static __device__ __forceinline__ void ldmatrix_x2(uint32_t (&r)[2], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(addr));
}
static __device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
/* ---- wgmma (sm_90a only: the callers keep an mma.sync path beside) ----
 * A warpgroup (4 consecutive warps from a warp index divisible by 4) computes D (64 x 64 fp32)
 * += A (64 x 16 bf16) B (16 x 64 bf16), asynchronously: fence, the wgmmas, commit, then wait
 * before D (or a register A) is touched again. D's layout per warp (16 rows of the 64) is
 * mma_bf16's per 8 columns: d[n][0..3] rows g, g, g + 8, g + 8, cols 8 n + 2 t, + 1; a register
 * A is mma_bf16's a. Shared operands are tiles of 128-byte rows (64 bf16) in 1,024-byte atoms of
 * 8 rows, 16-byte chunk c of row r at chunk c ^ (r % 8) (the 128-byte swizzle), described by
 * wg_desc: its start (+32 bytes a 16-wide k step inside the row, for K-major operands), the
 * leading byte offset (MN-major: between 64-wide blocks) and the stride byte offset (1,024: the
 * next 8 rows). */
static __device__ __forceinline__ uint64_t wg_desc(uint32_t saddr, uint32_t lbo, uint32_t sbo) {
    return (uint64_t)((saddr & 0x3FFFF) >> 4) | ((uint64_t)(lbo >> 4) << 16) |
           ((uint64_t)(sbo >> 4) << 32) | (1ull << 62);
}
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define WG_D32 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}"
#define WG_R4(d, i) "+f"(d[i][0]), "+f"(d[i][1]), "+f"(d[i][2]), "+f"(d[i][3])
#define WG_OUT(d) WG_R4(d, 0), WG_R4(d, 1), WG_R4(d, 2), WG_R4(d, 3), WG_R4(d, 4), WG_R4(d, 5), WG_R4(d, 6), WG_R4(d, 7)
static __device__ __forceinline__ void wg_fence(void) { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
static __device__ __forceinline__ void wg_commit(void) { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
static __device__ __forceinline__ void wg_wait(void) {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
/* the compiler may neither read d nor reuse its registers across this point (in flight) */
static __device__ __forceinline__ void wg_hold(float (&d)[8][4]) {
#pragma unroll
    for (int i = 0; i < 8; i++) asm volatile("" : "+f"(d[i][0]), "+f"(d[i][1]), "+f"(d[i][2]), "+f"(d[i][3])::"memory");
}
static __device__ __forceinline__ void wg_hold(uint32_t (&a)[4]) {
    asm volatile("" : "+r"(a[0]), "+r"(a[1]), "+r"(a[2]), "+r"(a[3])::"memory");
}
/* d += A B (d = A B where accumulate is 0), A (K-major) and B (K-major: row n of the tile is
 * column n of B) in shared memory */
static __device__ __forceinline__ void wgmma_ss(float (&d)[8][4], uint64_t da, uint64_t db, int accumulate = 1) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " WG_D32 ", %32, %33, p, 1, 1, 0, 0;\n}\n"
                 : WG_OUT(d) : "l"(da), "l"(db), "r"(accumulate));
}
/* d += A B, A in registers, B MN-major in shared memory (row k of the tile is row k of B) */
static __device__ __forceinline__ void wgmma_rs_t(float (&d)[8][4], const uint32_t (&a)[4], uint64_t db) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " WG_D32
                 ", {%32,%33,%34,%35}, %36, p, 1, 1, 1;\n}\n"
                 : WG_OUT(d) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}
#undef WG_OUT
#undef WG_R4
#undef WG_D32
/* ---- the copy engine's bulk copies into shared memory, with transaction barriers (sm_90) ----
 * A barrier's phase completes when its pending arrivals reach zero and the bytes announced by
 * mbar_expect have landed; mbar_wait(b, p) returns once the phase of parity p has completed. */
static __device__ __forceinline__ void mbar_init(uint64_t *b, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(b)), "r"(count) : "memory");
}
static __device__ __forceinline__ void mbar_init_fence(void) {
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
static __device__ __forceinline__ void mbar_arrive(uint64_t *b) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(b)) : "memory");
}
/* arrives, and announces bytes that bulk copies will complete */
static __device__ __forceinline__ void mbar_expect(uint64_t *b, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(b)), "r"(bytes)
                 : "memory");
}
static __device__ __forceinline__ void mbar_wait(uint64_t *b, uint32_t parity) {
    uint32_t done;
    do {
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                     "selp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done) : "r"(smem_addr(b)), "r"(parity) : "memory");
    } while (!done);
}
/* bytes (a multiple of 16, both ends 16-byte aligned) global -> shared by the copy engine,
 * completing on bar; marked evict-first in L2 (streamed weights) */
static __device__ __forceinline__ void bulk_load_stream(void *dst, const void *src, uint32_t bytes, uint64_t *bar) {
    unsigned long long pol;
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
                 " [%0], [%1], %2, [%3], %4;\n"
                 ::"r"(smem_addr(dst)), "l"(src), "r"(bytes), "r"(smem_addr(bar)), "l"(pol) : "memory");
}
/* a barrier of the given threads (warps) of the block, id 1..15 (0 is __syncthreads') */
static __device__ __forceinline__ void named_sync(int id, int threads) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
/* ordinary (and cp.async) shared-memory writes made visible to the tensor cores' reads */
static __device__ __forceinline__ void fence_proxy_async(void) {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
#endif
/* Weights are read once per token: stream them past L1 and mark them evict-first in L2. */
static __device__ __forceinline__ uint4 load_stream(const uint4 *p) { return __ldcs(p); }
/* Data another block of the same launch wrote (after a fence): bypass the non-coherent L1. */
static __device__ __forceinline__ float load_coherent(const float *p) { return __ldcg(p); }
static __device__ __forceinline__ float4 load_coherent4(const float *p) { return __ldcg((const float4 *)p); }
static __device__ __forceinline__ uint16_t load_coherent_u16(const uint16_t *p) { return __ldcg(p); }
static __device__ __forceinline__ uint4 load_coherent_u4(const uint16_t *p) { return __ldcg((const uint4 *)p); }
static __device__ __forceinline__ void fence_device(void) { __threadfence(); }
/* fp32 data read again next step (the DeltaNet state): loads and stores with an L2 evict-last
 * cache policy, so the streamed weights (evict-first, load_stream) leave it in L2 (HIP: plain
 * accesses, or the target's cache-policy bits) */
static __device__ __forceinline__ unsigned long long keep_policy(void) {
    unsigned long long pol;
    asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(pol));
    return pol;
}
static __device__ __forceinline__ float load_keep(const float *p) {
    float v;
    asm volatile("ld.global.L2::cache_hint.f32 %0, [%1], %2;" : "=f"(v) : "l"(p), "l"(keep_policy()) : "memory");
    return v;
}
static __device__ __forceinline__ void store_keep(float *p, float v) {
    asm volatile("st.global.L2::cache_hint.f32 [%0], %1, %2;" ::"l"(p), "f"(v), "l"(keep_policy()) : "memory");
}
/* Spins until *p >= target (a count other blocks raise with fence_device + atomicAdd), then
 * fences: what they wrote before counting is then visible to load_coherent reads. */
static __device__ __forceinline__ void wait_count(const int *p, int target) {
    while (*(const volatile int *)p < target) {
    }
    __threadfence();
}
/* Programmatic dependent launch: wait until the previous kernel of the stream has completed and
 * its writes are visible (a no-op when launched without the attribute). */
static __device__ __forceinline__ void grid_dependency_wait(void) {
    asm volatile("griddepcontrol.wait;" ::: "memory");
}
/* Programmatic dependent launch: let the next kernel of the stream start its blocks (once every
 * block of this one has executed this) while this one still runs. The next kernel may then run
 * the part before its grid_dependency_wait() concurrently with this kernel and the one before
 * it: that part may read only what no kernel of the current graph replay writes (weights,
 * recurrent state and caches of earlier steps, the position uploaded before the replay).
 * A no-op when the next kernel is launched without the attribute. */
static __device__ __forceinline__ void grid_launch_dependents(void) {
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}
/* Nanoseconds of the device-wide timer (tracing only). */
static __device__ __forceinline__ unsigned long long gpu_time_ns(void) {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
/* Hint: bring the 128-byte line holding p into L2. */
static __device__ __forceinline__ void prefetch_l2(const void *p) {
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

static __device__ __forceinline__ float silu_f(float x) { return x / (1.0f + expf(-x)); }
static __device__ __forceinline__ float sigmoid_f(float x) { return 1.0f / (1.0f + expf(-x)); }

#endif /* __CUDACC__ */
#endif
