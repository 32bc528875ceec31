/* misc.cu - the small kernels: embedding lookup, the zero-centred RMSNorm of the batched
 * (prefill) path, and the on-device argmax. Mirrors cpu.c's cpu_embed, rmsnorm_row and
 * cpu_argmax. */
#include "kernels.h"

/* out[t] = table[ids[t]]. Bytes: 2 * T * H read + written; no FLOPs. */
static __global__ void embed_kernel(uint16_t *out, const uint16_t *table, const int32_t *ids,
                                    int H, int V) {
    grid_launch_dependents(); /* programmatic dependent launch: nothing before the wait */
    grid_dependency_wait();
    int t = blockIdx.x;
    int id = ids[t];
    id = id < 0 ? 0 : id >= V ? V - 1 : id; /* model.c validates ids; never read out of bounds */
    const uint4 *src = (const uint4 *)(table + (size_t)id * H);
    uint4 *dst = (uint4 *)(out + (size_t)t * H);
    for (int i = threadIdx.x; i < H / 8; i += blockDim.x) dst[i] = src[i];
}

/* Zero-centred RMSNorm, one block per row: out = bf16(x * rsqrt(mean(x^2) + eps) * (1 + w)).
 * Bytes: 4 * T * K (x read, out written) + 2 K; FLOPs: ~5 T K. */
static __global__ void rmsnorm_kernel(uint16_t *out, const uint16_t *x, const uint16_t *w, int K,
                                      float eps) {
    __shared__ float red[32];
    grid_launch_dependents(); /* programmatic dependent launch: nothing before the wait */
    grid_dependency_wait();
    const uint16_t *xr = x + (size_t)blockIdx.x * K;
    uint16_t *o = out + (size_t)blockIdx.x * K;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < K; i += blockDim.x) {
        float v = bf2f(xr[i]);
        ss += v * v;
    }
    ss = warp_sum(ss);
    int wid = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    if (lane == 0) red[wid] = ss;
    __syncthreads();
    if (wid == 0) {
        ss = lane < (int)(blockDim.x / WARP_SIZE) ? red[lane] : 0.0f;
        ss = warp_sum(ss);
        if (lane == 0) red[0] = ss;
    }
    __syncthreads();
    float r = 1.0f / sqrtf(red[0] / (float)K + eps);
    for (int i = threadIdx.x; i < K; i += blockDim.x)
        o[i] = f2bf(bf2f(xr[i]) * r * (1.0f + bf2f(w[i])));
}

/* The same, a warp per row (RMS_ROWS rows a block): each lane holds its up to NW 16-byte words of
 * the row in registers, so x is read once, with every load in flight together; the sum of squares
 * is the lane's (its words in order) then the warp's butterfly; the weights are loaded before the
 * wait for the previous kernel (runs 233-235, H200, a 512-token 4B prefill's norm in the pipeline:
 * 6.6 us for the block-a-row kernel, 6.3 for this one with the weights read after the sum, 2.4
 * with them read before the wait). With ADD, the residual add before the norm in the same pass:
 * x = bf16(x + y) written back (add_kernel's rounding), then normalised. K % 8 == 0, 16-byte
 * aligned rows, K / 8 <= 32 NW (NW <= 20 without spills). Bytes: 4 T K + 2 K (ADD: 8 T K). */
#define RMS_ROWS 4
template <int NW, bool ADD>
static __global__ void __launch_bounds__(RMS_ROWS * WARP_SIZE)
rmsnorm_rows_kernel(uint16_t *out, uint16_t *x, const uint16_t *y, const uint16_t *w, int T, int K, float eps) {
    grid_launch_dependents();
    const int row = blockIdx.x * RMS_ROWS + threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    const int K8 = K / 8;
    uint4 wv[NW]; /* the norm's weights (not the previous kernel's output): before the wait */
#pragma unroll
    for (int j = 0; j < NW; j++)
        if (lane + j * WARP_SIZE < K8) wv[j] = ((const uint4 *)w)[lane + j * WARP_SIZE];
    grid_dependency_wait();
    if (row >= T) return;
    uint4 *xr = (uint4 *)(x + (size_t)row * K);
    uint4 v[NW];
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < NW; j++)
        if (lane + j * WARP_SIZE < K8) v[j] = xr[lane + j * WARP_SIZE];
    if (ADD) {
        const uint4 *yr = (const uint4 *)(y + (size_t)row * K);
        uint4 u[NW];
#pragma unroll
        for (int j = 0; j < NW; j++)
            if (lane + j * WARP_SIZE < K8) u[j] = yr[lane + j * WARP_SIZE];
#pragma unroll
        for (int j = 0; j < NW; j++)
            if (lane + j * WARP_SIZE < K8) {
                float a[8], b[8];
                unpack8(v[j], a);
                unpack8(u[j], b);
                v[j] = make_uint4(pack_bf(a[0] + b[0], a[1] + b[1]), pack_bf(a[2] + b[2], a[3] + b[3]),
                                  pack_bf(a[4] + b[4], a[5] + b[5]), pack_bf(a[6] + b[6], a[7] + b[7]));
                xr[lane + j * WARP_SIZE] = v[j];
            }
    }
#pragma unroll
    for (int j = 0; j < NW; j++)
        if (lane + j * WARP_SIZE < K8) {
            float f[8];
            unpack8(v[j], f);
#pragma unroll
            for (int e = 0; e < 8; e++) ss += f[e] * f[e];
        }
    const float r = 1.0f / sqrtf(warp_sum(ss) / (float)K + eps);
    uint4 *o = (uint4 *)(out + (size_t)row * K);
#pragma unroll
    for (int j = 0; j < NW; j++)
        if (lane + j * WARP_SIZE < K8) o[lane + j * WARP_SIZE] = rmsnorm8(v[j], wv[j], r);
}

/* Argmax over n bf16 values, lowest index on ties. Each block reduces a slice to (value, index);
 * the last block to finish reduces the block results and re-arms the counter. Bytes: 2 n. With
 * pos, that block also advances *pos and posts the choice to the host's mailbox (mapped pinned
 * memory: one 8-byte store, post number and choice together). */
static __device__ __forceinline__ void better(float &v, int &i, float v2, int i2) {
    if (v2 > v || (v2 == v && i2 < i)) {
        v = v2;
        i = i2;
    }
}
static __global__ void argmax_kernel(int32_t *out, const uint16_t *x, int n, float *part,
                                     int *counter, int32_t *pos, unsigned *n_posts,
                                     unsigned long long *mail) {
    __shared__ float sv[32];
    __shared__ int si[32];
    __shared__ int last;
    grid_launch_dependents();
    grid_dependency_wait(); /* x: the lm_head GEMV before */
    float bv = -INFINITY;
    int bi = 0x7fffffff;
    int per = (n + gridDim.x - 1) / gridDim.x;
    per = (per + 7) & ~7;
    int lo = blockIdx.x * per, hi = min(n, lo + per);
    if (lo < hi) {
        int n8 = (hi - lo) / 8;
        const uint4 *x8 = (const uint4 *)(x + lo); /* lo is a multiple of 8 */
        for (int k = threadIdx.x; k < n8; k += blockDim.x) {
            float f[8];
            unpack8(x8[k], f);
#pragma unroll
            for (int j = 0; j < 8; j++) better(bv, bi, f[j], lo + 8 * k + j);
        }
        for (int k = lo + 8 * n8 + threadIdx.x; k < hi; k += blockDim.x) better(bv, bi, bf2f(x[k]), k);
    }
    for (int o = WARP_SIZE / 2; o > 0; o >>= 1) {
        float v2 = shfl_xor(bv, o);
        int i2 = shfl_xor_int(bi, o);
        better(bv, bi, v2, i2);
    }
    int wid = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    if (lane == 0) {
        sv[wid] = bv;
        si[wid] = bi;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < (int)(blockDim.x / WARP_SIZE); w++) better(bv, bi, sv[w], si[w]);
        part[2 * blockIdx.x] = bv;
        part[2 * blockIdx.x + 1] = __int_as_float(bi);
        fence_device();
        last = atomicAdd(counter, 1) == (int)gridDim.x - 1;
    }
    __syncthreads();
    if (!last) return;
    fence_device();
    bv = -INFINITY;
    bi = 0x7fffffff;
    for (int b = threadIdx.x; b < (int)gridDim.x; b += blockDim.x)
        better(bv, bi, load_coherent(part + 2 * b), __float_as_int(load_coherent(part + 2 * b + 1)));
    for (int o = WARP_SIZE / 2; o > 0; o >>= 1) {
        float v2 = shfl_xor(bv, o);
        int i2 = shfl_xor_int(bi, o);
        better(bv, bi, v2, i2);
    }
    __syncthreads();
    if (lane == 0) {
        sv[wid] = bv;
        si[wid] = bi;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < (int)(blockDim.x / WARP_SIZE); w++) better(bv, bi, sv[w], si[w]);
        const int choice = bi == 0x7fffffff ? 0 : bi; /* all NaN: 0 */
        *out = choice;
        *counter = 0;
        if (pos) {
            *pos += 1;
            const unsigned post = *n_posts + 1;
            *n_posts = post;
            *(volatile unsigned long long *)(mail + post % BACKEND_POSTS) =
                (unsigned long long)post << 32 | (unsigned)choice;
        }
    }
}

/* The argmax of each of B rows (a batched step's logits, rows n apart): a block per row, lowest
 * index on ties. Bytes: 2 B n. */
static __global__ void argmax_rows_kernel(int32_t *out, const uint16_t *x, int n) {
    __shared__ float sv[32];
    __shared__ int si[32];
    grid_launch_dependents(); /* programmatic dependent launch: nothing before the wait */
    grid_dependency_wait();
    const uint16_t *xr = x + (size_t)blockIdx.x * n;
    float bv = -INFINITY;
    int bi = 0x7fffffff;
    const int n8 = n / 8;
    const uint4 *x8 = (const uint4 *)xr; /* n is a multiple of 8 (checked by the launcher) */
    for (int k = threadIdx.x; k < n8; k += blockDim.x) {
        float f[8];
        unpack8(x8[k], f);
#pragma unroll
        for (int j = 0; j < 8; j++) better(bv, bi, f[j], 8 * k + j);
    }
    for (int o = WARP_SIZE / 2; o > 0; o >>= 1) {
        float v2 = shfl_xor(bv, o);
        int i2 = shfl_xor_int(bi, o);
        better(bv, bi, v2, i2);
    }
    const int wid = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    if (lane == 0) sv[wid] = bv, si[wid] = bi;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < (int)(blockDim.x / WARP_SIZE); w++) better(bv, bi, sv[w], si[w]);
        out[blockIdx.x] = bi == 0x7fffffff ? 0 : bi; /* all NaN: 0 */
    }
}

extern "C" void cuda_argmax_rows(struct cuda *cu, int32_t *out, const uint16_t *x, int n, int B) {
    CHECK(n % 8 == 0 && B >= 1);
    gpu_launch(cu->pdl, argmax_rows_kernel, dim3(B), dim3(1024), 0, cu->stream, out, x, n);
    cu->n_launches++;
}

extern "C" void cuda_embed(struct cuda *cu, uint16_t *out, const uint16_t *table,
                           const int32_t *ids, int T, int H, int V) {
    gpu_launch(cu->pdl, embed_kernel, dim3(T), dim3(128), 0, cu->stream, out, table, ids, H, V);
    cu->n_launches++;
}

template <int NW>
static void launch_rmsnorm_rows(struct cuda *cu, uint16_t *out, uint16_t *x, const uint16_t *y,
                                const uint16_t *w, int T, int K, float eps) {
    const dim3 grid((unsigned)((T + RMS_ROWS - 1) / RMS_ROWS)), block(RMS_ROWS * WARP_SIZE);
    if (y)
        gpu_launch(cu->pdl, rmsnorm_rows_kernel<NW, true>, grid, block, 0, cu->stream, out, x, y, w, T, K, eps);
    else
        gpu_launch(cu->pdl, rmsnorm_rows_kernel<NW, false>, grid, block, 0, cu->stream, out, x, y, w, T, K, eps);
}

/* out = norm(x), or with y: x = bf16(x + y), then out = norm(x) (one pass, the warp-a-row kernel;
 * past 27B's hidden size the add and the block-a-row norm as two kernels) */
static void rmsnorm_with(struct cuda *cu, uint16_t *out, uint16_t *x, const uint16_t *y,
                         const uint16_t *w, int T, int K, float eps) {
    const int per_lane = (K / 8 + WARP_SIZE - 1) / WARP_SIZE; /* 16-byte words a lane */
    CHECK(K % 8 == 0 && !(((uintptr_t)out | (uintptr_t)x | (uintptr_t)y | (uintptr_t)w) & 15)); /* 16-byte words */
    if (per_lane > 20) { /* past 27B's 5,120 */
        if (y) cuda_add(cu, x, y, (size_t)T * K);
        gpu_launch(cu->pdl, rmsnorm_kernel, dim3(T), dim3(256), 0, cu->stream, out, x, w, K, eps);
    } else if (per_lane <= 4) /* (K 1,024: 0.8B) */
        launch_rmsnorm_rows<4>(cu, out, x, y, w, T, K, eps);
    else if (per_lane <= 8) /* (2,048: 2B) */
        launch_rmsnorm_rows<8>(cu, out, x, y, w, T, K, eps);
    else if (per_lane <= 12) /* (2,560: 4B) */
        launch_rmsnorm_rows<12>(cu, out, x, y, w, T, K, eps);
    else if (per_lane <= 16) /* (4,096: 9B) */
        launch_rmsnorm_rows<16>(cu, out, x, y, w, T, K, eps);
    else /* (5,120: 27B) */
        launch_rmsnorm_rows<20>(cu, out, x, y, w, T, K, eps);
    cu->n_launches++;
}

extern "C" void cuda_rmsnorm(struct cuda *cu, uint16_t *out, const uint16_t *x, const uint16_t *w,
                             int T, int K, float eps) {
    rmsnorm_with(cu, out, (uint16_t *)x, NULL, w, T, K, eps);
}

extern "C" void cuda_add_rmsnorm(struct cuda *cu, uint16_t *out, uint16_t *x, const uint16_t *y,
                                 const uint16_t *w, int T, int K, float eps) {
    rmsnorm_with(cu, out, x, y, w, T, K, eps);
}

extern "C" void cuda_argmax(struct cuda *cu, int32_t *out, const uint16_t *x, int n, int32_t *pos) {
    int blocks = (n + 2047) / 2048;
    if (blocks > CUDA_ARGMAX_BLOCKS) blocks = CUDA_ARGMAX_BLOCKS;
    if (blocks < 1) blocks = 1;
    gpu_launch(cu->pdl, argmax_kernel, dim3(blocks), dim3(256), 0, cu->stream, out, x, n,
               cu->argmax_part, cu->counters + 0, pos, cu->n_posts, cu->mail_dev);
    cu->n_launches++;
}
