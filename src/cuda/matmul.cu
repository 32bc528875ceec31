/* matmul.cu - bf16 weight products. Decode (T = 1): a GEMV that streams each weight row once
 * with 16-byte loads and fp32 accumulation, the zero-centred RMSNorm of its input recomputed by
 * every block (cheaper than a launch), the residual add or gate+up+SiLU fused in the epilogue.
 * Prefill (T > 1): cuBLAS GEMMs (bf16 in/out, fp32 accumulation) plus small element-wise
 * kernels for the norm, the residual add and SwiGLU, so the rounding points stay those of
 * cpu.c's cpu_matmul / cpu_matmul_swiglu: bf16(xn W^T), then bf16(out + that). */
#include "kernels.h"

#define GEMV_THREADS 256

/* The two weight rows of row pair p: (2p, 2p + 1) for a plain GEMV (the second clamped to the
 * first and has1 false at an odd N), (p, p + N) for SwiGLU (gate row, up row). */
template <bool SWIGLU>
static __device__ __forceinline__ void gemv_rows(int p, int N, int &r0, int &r1, bool &has1) {
    r0 = SWIGLU ? p : 2 * p;
    r1 = SWIGLU ? p + N : 2 * p + 1;
    has1 = SWIGLU || r1 < N;
    if (!has1) r1 = r0;
}
/* 16-byte words k, k + TPR, k + 2 TPR, k + 3 TPR of both rows (zero past K8) */
template <int TPR>
static __device__ __forceinline__ void gemv_load4(const uint4 *w0, const uint4 *w1, int k, int K8,
                                                  uint4 (&A)[4], uint4 (&B)[4]) {
    const uint4 zero = make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const bool ok = k + j * TPR < K8;
        A[j] = ok ? load_stream(w0 + k + j * TPR) : zero;
        B[j] = ok ? load_stream(w1 + k + j * TPR) : zero;
    }
}

/* A group of TPR threads computes a row pair: 2 output rows (plain) or one SwiGLU output (a gate
 * row and its up row). A block holds 256 / TPR groups and walks row pairs with a grid stride
 * (persistent: the grid is sized to the resident blocks, so the prologue is paid once per
 * block). The block puts x (normalised when norm_w is set) into shared memory as bf16, exactly
 * the values cpu.c's rmsnorm_row produces.
 * Streaming: a group's work is a sequence of items (row pair, 4-step chunk of K: each thread
 * loads 16 bytes of both rows per step), software-pipelined across chunks and row pairs: the
 * loads of item t + 1 are issued before item t is computed and reduced, so each thread always
 * has a chunk in flight (a GEMV used to wait one memory round trip per chunk).
 * Programmatic dependent launch: weights do not depend on the previous kernel, so item 0 is
 * loaded and the rest of its rows requested into L2 before grid_dependency_wait(); the block
 * lets the next kernel start its blocks at once (they fill the SM slots of this one's tail).
 * Bytes: 2 N K weights (4 I K for SwiGLU) + 2 K x per block + 2 N out (x2 with accumulate);
 * FLOPs: 2 N K (+ ~4 K per block for the norm). */
template <int TPR, bool SWIGLU>
static __global__ void __launch_bounds__(GEMV_THREADS, 2)
gemv_kernel(uint16_t *out, const uint16_t *x, const uint16_t *norm_w, const uint16_t *W, int N,
            int K, float eps, int accumulate) {
    extern __shared__ uint4 xs[]; /* (K / 8,) */
    __shared__ float red[GEMV_THREADS / WARP_SIZE][2];
    __shared__ float rscale;
    const int K8 = K / 8;
    const uint4 *x4 = (const uint4 *)x;
    const int wid = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    const int GROUPS = GEMV_THREADS / TPR, STEP = 4 * TPR;
    const int g = threadIdx.x / TPR, l = threadIdx.x % TPR;
    const int n_pairs = SWIGLU ? N : (N + 1) / 2;
    const int nc = (K8 + STEP - 1) / STEP;            /* chunks per row pair */
    const int pstride = gridDim.x * GROUPS, pb = blockIdx.x * GROUPS;
    const int n_units = pb < n_pairs ? (n_pairs - pb + pstride - 1) / pstride : 0;
    const int n_items = n_units * nc;                 /* the same for every thread of the block */

    grid_launch_dependents();
    uint4 A[4], B[4];
    int p = pb + g, c = 0; /* the current item */
    {
        int r0, r1;
        bool has1;
        gemv_rows<SWIGLU>(p < n_pairs ? p : 0, N, r0, r1, has1);
        const uint4 *w0 = (const uint4 *)(W + (size_t)r0 * K), *w1 = (const uint4 *)(W + (size_t)r1 * K);
        if (n_items > 0 && p < n_pairs) {
            gemv_load4<TPR>(w0, w1, l, K8, A, B);
            const char *c0 = (const char *)w0, *c1 = (const char *)w1;
            for (int off = 64 * TPR + l * 128; off < K * 2; off += TPR * 128) {
                prefetch_l2(c0 + off);
                prefetch_l2(c1 + off);
            }
        }
    }
    grid_dependency_wait();

    if (norm_w) {
        float ss = 0.0f;
        for (int i = threadIdx.x; i < K8; i += GEMV_THREADS) {
            float f[8];
            unpack8(x4[i], f);
#pragma unroll
            for (int j = 0; j < 8; j++) ss += f[j] * f[j];
        }
        ss = warp_sum(ss);
        if (lane == 0) red[wid][0] = ss;
        __syncthreads();
        if (threadIdx.x == 0) {
            float s = 0.0f;
            for (int w = 0; w < GEMV_THREADS / WARP_SIZE; w++) s += red[w][0];
            rscale = 1.0f / sqrtf(s / (float)K + eps);
        }
        __syncthreads();
        const float r = rscale;
        const uint4 *w4 = (const uint4 *)norm_w;
        for (int i = threadIdx.x; i < K8; i += GEMV_THREADS) {
            float f[8], gg[8];
            unpack8(x4[i], f);
            unpack8(w4[i], gg);
            uint4 o;
            o.x = pack_bf(f[0] * r * (1.0f + gg[0]), f[1] * r * (1.0f + gg[1]));
            o.y = pack_bf(f[2] * r * (1.0f + gg[2]), f[3] * r * (1.0f + gg[3]));
            o.z = pack_bf(f[4] * r * (1.0f + gg[4]), f[5] * r * (1.0f + gg[5]));
            o.w = pack_bf(f[6] * r * (1.0f + gg[6]), f[7] * r * (1.0f + gg[7]));
            xs[i] = o;
        }
    } else {
        for (int i = threadIdx.x; i < K8; i += GEMV_THREADS) xs[i] = x4[i];
    }
    __syncthreads();

    float a0 = 0.0f, a1 = 0.0f;
    for (int t = 0; t < n_items; t++) {
        /* issue the next item's loads */
        int pn = p, cn = c + 1;
        if (cn == nc) {
            cn = 0;
            pn = p + pstride;
        }
        uint4 An[4], Bn[4];
        if (t + 1 < n_items && pn < n_pairs) {
            int r0, r1;
            bool has1;
            gemv_rows<SWIGLU>(pn, N, r0, r1, has1);
            gemv_load4<TPR>((const uint4 *)(W + (size_t)r0 * K), (const uint4 *)(W + (size_t)r1 * K),
                            l + cn * STEP, K8, An, Bn);
        } else {
#pragma unroll
            for (int j = 0; j < 4; j++) An[j] = Bn[j] = make_uint4(0, 0, 0, 0);
        }
        /* compute the current one */
        const bool active = p < n_pairs;
        if (active) {
            const int k = l + c * STEP;
#pragma unroll
            for (int j = 0; j < 4; j++)
                if (k + j * TPR < K8) {
                    const uint4 X = xs[k + j * TPR];
                    a0 += dot8(A[j], X);
                    a1 += dot8(B[j], X);
                }
        }
        if (c == nc - 1) { /* the row pair is done: reduce over the group and write */
            a0 = warp_sum(a0);
            a1 = warp_sum(a1);
            if (TPR > WARP_SIZE) {
                __syncthreads();
                if (lane == 0) {
                    red[wid][0] = a0;
                    red[wid][1] = a1;
                }
                __syncthreads();
                if (l == 0) {
                    const int w0 = g * (TPR / WARP_SIZE);
                    a0 = a1 = 0.0f;
                    for (int w = 0; w < TPR / WARP_SIZE; w++) {
                        a0 += red[w0 + w][0];
                        a1 += red[w0 + w][1];
                    }
                }
            }
            if (l == 0 && active) {
                int r0, r1;
                bool has1;
                gemv_rows<SWIGLU>(p, N, r0, r1, has1);
                if (SWIGLU) {
                    float gt = bfr(a0), up = bfr(a1);
                    out[p] = f2bf(bfr(silu_f(gt)) * up); /* HF: act_fn(gate_proj(x)) * up_proj(x) */
                } else if (accumulate) {
                    out[r0] = f2bf(bf2f(out[r0]) + bfr(a0)); /* HF: residual + linear(x) */
                    if (has1) out[r1] = f2bf(bf2f(out[r1]) + bfr(a1));
                } else {
                    out[r0] = f2bf(a0);
                    if (has1) out[r1] = f2bf(a1);
                }
            }
            a0 = a1 = 0.0f;
        }
#pragma unroll
        for (int j = 0; j < 4; j++) {
            A[j] = An[j];
            B[j] = Bn[j];
        }
        p = pn;
        c = cn;
    }
}

/* out = bf16(out + y), element-wise. Bytes: 6 n. */
static __global__ void add_kernel(uint16_t *out, const uint16_t *y, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = f2bf(bf2f(out[i]) + bf2f(y[i]));
}

/* out[t, i] = bf16(bf16(silu(gu[t, i])) * gu[t, I + i]). Bytes: 6 T I. */
static __global__ void swiglu_kernel(uint16_t *out, const uint16_t *gu, int T, int I) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)T * I) return;
    size_t t = idx / I, i = idx % I;
    float g = bf2f(gu[t * 2 * I + i]), u = bf2f(gu[t * 2 * I + I + i]);
    out[idx] = f2bf(bfr(silu_f(g)) * u);
}

template <int TPR, bool SWIGLU>
static void launch_gemv(struct cuda *cu, uint16_t *out, const uint16_t *x, const uint16_t *norm_w,
                        const uint16_t *W, int N, int K, float eps, int accumulate) {
    void (*kern)(uint16_t *, const uint16_t *, const uint16_t *, const uint16_t *, int, int, float,
                 int) = gemv_kernel<TPR, SWIGLU>;
    int groups = GEMV_THREADS / TPR;
    int pairs = SWIGLU ? N : (N + 1) / 2;
    size_t smem = (size_t)K / 8 * 16;
    if (smem > 48 * 1024) GPU_SMEM_OPTIN(kern, smem);
    int per_sm = gpu_occupancy(kern, GEMV_THREADS, smem);
    int blocks = (pairs + groups - 1) / groups;
    int cap = cu->info.n_sm * (per_sm > 0 ? per_sm : 1);
    if (cu->gemv_persist && blocks > cap) blocks = cap;
    gpu_launch(cu->pdl, kern, dim3(blocks), dim3(GEMV_THREADS), smem, cu->stream, out, x, norm_w, W,
               N, K, eps, accumulate);
    cu->n_launches++;
}

/* Resident blocks of the GEMV per SM at this K (every TPR / SWIGLU instance has about the same
 * register budget; launch_gemv asks again for the instance it launches). */
static int gemv_per_sm(int K) {
    size_t smem = (size_t)K / 8 * 16;
    void (*kern)(uint16_t *, const uint16_t *, const uint16_t *, const uint16_t *, int, int, float,
                 int) = gemv_kernel<32, false>;
    if (smem > 48 * 1024) GPU_SMEM_OPTIN(kern, smem);
    int n = gpu_occupancy(kern, GEMV_THREADS, smem);
    return n > 0 ? n : 1;
}

extern "C" void cuda_gemv(struct cuda *cu, uint16_t *out, const uint16_t *x,
                          const uint16_t *norm_w, const uint16_t *W, int N, int K, float eps,
                          int accumulate, int swiglu) {
    CHECK(K % 8 == 0 && (size_t)K * 2 <= (size_t)cu->info.smem_optin);
    /* threads per row pair: the one that minimises the largest share of a block (rounds of the
     * grid stride x row pairs per block) on the persistent grid, among those that still give
     * each thread at least 2 steps per row (K8 >= 2 TPR); ties go to the narrower group (fewer
     * reductions, more loads in flight per thread) */
    const long pairs = swiglu ? N : (N + 1) / 2, K8 = K / 8;
    const long cap = (long)cu->info.n_sm * gemv_per_sm(K);
    int tpr = 32;
    long best = -1;
    for (int t = 32; t <= 256; t *= 2) {
        if (t > 32 && K8 < 2L * t) break;
        long groups = GEMV_THREADS / t, units = (pairs + groups - 1) / groups;
        long rounds = (units + cap - 1) / cap, share = rounds * groups;
        if (best < 0 || share < best) {
            best = share;
            tpr = t;
        }
    }
    if (swiglu) {
        switch (tpr) {
        case 32: launch_gemv<32, true>(cu, out, x, norm_w, W, N, K, eps, 0); break;
        case 64: launch_gemv<64, true>(cu, out, x, norm_w, W, N, K, eps, 0); break;
        case 128: launch_gemv<128, true>(cu, out, x, norm_w, W, N, K, eps, 0); break;
        default: launch_gemv<256, true>(cu, out, x, norm_w, W, N, K, eps, 0); break;
        }
    } else {
        switch (tpr) {
        case 32: launch_gemv<32, false>(cu, out, x, norm_w, W, N, K, eps, accumulate); break;
        case 64: launch_gemv<64, false>(cu, out, x, norm_w, W, N, K, eps, accumulate); break;
        case 128: launch_gemv<128, false>(cu, out, x, norm_w, W, N, K, eps, accumulate); break;
        default: launch_gemv<256, false>(cu, out, x, norm_w, W, N, K, eps, accumulate); break;
        }
    }
}

extern "C" void cuda_add(struct cuda *cu, uint16_t *out, const uint16_t *y, size_t n) {
    add_kernel<<<(unsigned)((n + 255) / 256), 256, 0, cu->stream>>>(out, y, n);
    GPU_LAUNCHED();
    cu->n_launches++;
}

extern "C" void cuda_swiglu(struct cuda *cu, uint16_t *out, const uint16_t *gu, int T, int I) {
    size_t n = (size_t)T * I;
    swiglu_kernel<<<(unsigned)((n + 255) / 256), 256, 0, cu->stream>>>(out, gu, T, I);
    GPU_LAUNCHED();
    cu->n_launches++;
}

/* cuBLAS GEMM: out (T, N) = x (T, K) W^T, W (N, K). FLOPs: 2 T N K. */
extern "C" void cuda_gemm(struct cuda *cu, uint16_t *out, const uint16_t *x, const uint16_t *W,
                          int T, int N, int K) {
    gpu_gemm_bf16(cu->blas, out, x, W, T, N, K);
    cu->n_launches++;
}
