/* sample.cu - the sample op on the device (backend.h, struct backend_sampling), mirroring
 * cpu.c's cpu_sample. One kernel of SAMPLE_BLOCKS blocks: each block turns its slice of 4096
 * logits into processed logits (the keys; plus the Gumbel noise when top_k is 0), gathers the
 * few that can be among its best k (sample_kernel) and sorts those in shared memory (bitonic,
 * descending by key, ties by lower id); the last block to finish does the same over the blocks'
 * lists and draws over the best k as the CPU does: one thread walks at most 64 candidates.
 * Bytes per call: 2 V of logits (+ 4 V bias, 5 V counts and prompt flags when used), ~1.6 MB at
 * V = 248,320: under 1 us of bandwidth. */
#include "kernels.h"

#define SAMPLE_BLOCKS 64
#define SAMPLE_SLICE 4096 /* SAMPLE_BLOCKS x SAMPLE_SLICE == BACKEND_SAMPLE_VMAX */
#define SAMPLE_THREADS 512

static __device__ __forceinline__ bool before(float ka, int ia, float kb, int ib) {
    return ka > kb || (ka == kb && ia < ib);
}

/* Sorts the first S (a power of two) (key, id) pairs in shared memory, descending (bitonic). */
static __device__ void bitonic(float *key, int *id, int S) {
    for (int k = 2; k <= S; k <<= 1)
        for (int j = k >> 1; j > 0; j >>= 1) {
            for (int i = threadIdx.x; i < S; i += blockDim.x) {
                const int o = i ^ j;
                if (o <= i) continue;
                const bool desc = (i & k) == 0; /* this pair's run sorts descending */
                const bool swap = desc ? before(key[o], id[o], key[i], id[i])
                                       : before(key[i], id[i], key[o], id[o]);
                if (swap) {
                    const float t = key[i]; key[i] = key[o]; key[o] = t;
                    const int u = id[i]; id[i] = id[o]; id[o] = u;
                }
            }
            __syncthreads();
        }
}

/* Sorts SAMPLE_THREADS floats descending, one per thread (bitonic in shared memory). */
static __device__ void bitonic_keys(float *v) {
    const int i = threadIdx.x;
    for (int k = 2; k <= SAMPLE_THREADS; k <<= 1)
        for (int j = k >> 1; j > 0; j >>= 1) {
            const int o = i ^ j;
            if (o > i) {
                const bool desc = (i & k) == 0;
                if (desc ? v[o] > v[i] : v[i] > v[o]) {
                    const float t = v[i]; v[i] = v[o]; v[o] = t;
                }
            }
            __syncthreads();
        }
}

static __device__ __forceinline__ int pow2_at_least(int c) {
    int S = 2;
    while (S < c) S <<= 1;
    return S;
}

/* Pads [c, max(S, k)) with entries that sort last (the best k are read after) and sorts the
 * first S. */
static __device__ void sort_cands(float *key, int *id, int c, int k) {
    const int S = pow2_at_least(c);
    for (int s = c + threadIdx.x; s < (S > k ? S : k); s += blockDim.x) key[s] = -INFINITY, id[s] = 0x7fffffff;
    __syncthreads();
    bitonic(key, id, S);
}

/* Per block, the best k of its slice without sorting the slice: each thread's best of its 8
 * keys; the k-th largest of those 512 bounds the slice's k-th key from below (k threads hold a
 * key at least that large), so only the keys at or above it (about k of them) are gathered and
 * sorted. The last block does the same over the blocks' sorted lists (the largest of their k-th
 * keys bounds the k-th overall from below). */
static __global__ void __launch_bounds__(SAMPLE_THREADS)
sample_kernel(int32_t *out, const uint16_t *x, int n, struct backend_sample_state st, float *part,
              int *counter, int32_t *pos, int host_pos, unsigned *n_posts, unsigned long long *mail) {
    constexpr int PER = SAMPLE_SLICE / SAMPLE_THREADS;
    __shared__ float key[SAMPLE_SLICE]; /* top_k > 0: the processed logit itself */
    __shared__ int id[SAMPLE_SLICE];
    __shared__ float tmax[SAMPLE_THREADS];
    __shared__ int last, nc;
    grid_launch_dependents();
    const struct backend_sampling sp = *st.params; /* written before the step */
    const int k = sp.top_k > 0 ? sp.top_k : 1;
    grid_dependency_wait(); /* x: the lm_head GEMV before; *pos: the step before */
    const int at = pos ? *pos + 1 : host_pos; /* pos: advanced by this kernel's last block only */
    const int lo = blockIdx.x * SAMPLE_SLICE;
    float kv[PER], tm = -INFINITY;
#pragma unroll
    for (int t = 0; t < PER; t++) {
        const int i = lo + threadIdx.x + t * SAMPLE_THREADS;
        float kk = -INFINITY;
        if (i < n) kk = backend_sample_key(&sp, backend_sample_logit(&sp, &st, bf2f(x[i]), i), at, i);
        kv[t] = kk;
        tm = fmaxf(tm, kk);
    }
    tmax[threadIdx.x] = tm;
    if (threadIdx.x == 0) nc = 0;
    __syncthreads();
    bitonic_keys(tmax);
    const float thr = tmax[k - 1];
#pragma unroll
    for (int t = 0; t < PER; t++) {
        const int i = lo + threadIdx.x + t * SAMPLE_THREADS;
        if (i < n && kv[t] >= thr) {
            const int slot = atomicAdd(&nc, 1);
            key[slot] = kv[t], id[slot] = i;
        }
    }
    __syncthreads();
    sort_cands(key, id, nc, k);
    float *pk = part + (size_t)blockIdx.x * BACKEND_SAMPLE_KMAX * 2;
    for (int j = threadIdx.x; j < k; j += blockDim.x) { /* past nc: the padding, sorted last */
        pk[2 * j] = key[j];
        pk[2 * j + 1] = __int_as_float(id[j]);
    }
    fence_device();
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(counter, 1) == (int)gridDim.x - 1;
    __syncthreads();
    if (!last) return;
    fence_device();
    /* the blocks' best k: the largest of their k-th keys bounds the k-th overall from below */
    const int nb = gridDim.x;
    float m2 = -INFINITY;
    for (int b = threadIdx.x; b < nb; b += blockDim.x)
        m2 = fmaxf(m2, load_coherent(part + ((size_t)b * BACKEND_SAMPLE_KMAX + k - 1) * 2));
    tmax[threadIdx.x] = m2;
    if (threadIdx.x == 0) nc = 0;
    __syncthreads();
    for (int w = SAMPLE_THREADS / 2; w > 0; w >>= 1) {
        if (threadIdx.x < w) tmax[threadIdx.x] = fmaxf(tmax[threadIdx.x], tmax[threadIdx.x + w]);
        __syncthreads();
    }
    const float thr2 = tmax[0];
    for (int s = threadIdx.x; s < nb * k; s += blockDim.x) {
        const float *q = part + ((size_t)(s / k) * BACKEND_SAMPLE_KMAX + s % k) * 2;
        const float kk = load_coherent(q);
        const int ii = __float_as_int(load_coherent(q + 1));
        if (kk >= thr2 && ii != 0x7fffffff) {
            const int slot = atomicAdd(&nc, 1);
            key[slot] = kk, id[slot] = ii;
        }
    }
    __syncthreads();
    sort_cands(key, id, nc, k);
    if (threadIdx.x != 0) return;
    int choice = id[0];
    if (sp.top_k > 0) { /* as cpu_sample */
        int kk = 0;
        while (kk < k && id[kk] != 0x7fffffff) kk++;
        choice = id[backend_sample_draw(&sp, key, kk, backend_sample_u(sp.seed, at, n))];
    }
    if (choice == 0x7fffffff) choice = 0;
    *out = choice;
    st.count[choice] += 1;
    *counter = 0;
    if (pos) {
        *pos += 1;
        const unsigned post = *n_posts + 1;
        *n_posts = post;
        *(volatile unsigned long long *)(mail + post % BACKEND_POSTS) =
            (unsigned long long)post << 32 | (unsigned)choice;
    }
}

/* Block reductions over SAMPLE_THREADS values (the result in every thread). */
static __device__ float block_max(float v, float *red) {
    for (int o = WARP_SIZE / 2; o > 0; o >>= 1) v = fmaxf(v, shfl_xor(v, o));
    __syncthreads();
    if (threadIdx.x % WARP_SIZE == 0) red[threadIdx.x / WARP_SIZE] = v;
    __syncthreads();
    v = -INFINITY;
    for (int w = 0; w < SAMPLE_THREADS / WARP_SIZE; w++) v = fmaxf(v, red[w]);
    return v;
}
static __device__ float block_sum(float v, float *red) {
    for (int o = WARP_SIZE / 2; o > 0; o >>= 1) v += shfl_xor(v, o);
    __syncthreads();
    if (threadIdx.x % WARP_SIZE == 0) red[threadIdx.x / WARP_SIZE] = v;
    __syncthreads();
    v = 0.0f;
    for (int w = 0; w < SAMPLE_THREADS / WARP_SIZE; w++) v += red[w];
    return v;
}

/* The logprobs op (backend.h) as sample_kernel's selection with k <= 20 over the raw logits,
 * plus each block's (max, sum of exp(l - max)) merged by the last block into log sum exp. */
static __global__ void __launch_bounds__(SAMPLE_THREADS)
logprobs_kernel(float *out, const uint16_t *x, int n, int k, const int32_t *chosen, float *part,
                float *part_lse, int *counter) {
    constexpr int PER = SAMPLE_SLICE / SAMPLE_THREADS;
    __shared__ float key[SAMPLE_SLICE];
    __shared__ int id[SAMPLE_SLICE];
    __shared__ float tmax[SAMPLE_THREADS], red[SAMPLE_THREADS / WARP_SIZE];
    __shared__ int last, nc;
    grid_launch_dependents();
    grid_dependency_wait(); /* x: the lm_head GEMV before; *chosen: the sample op before */
    const int lo = blockIdx.x * SAMPLE_SLICE;
    float kv[PER], tm = -INFINITY;
#pragma unroll
    for (int t = 0; t < PER; t++) {
        const int i = lo + threadIdx.x + t * SAMPLE_THREADS;
        float l = i < n ? bf2f(x[i]) : -INFINITY;
        kv[t] = l != l ? -INFINITY : l;
        tm = fmaxf(tm, kv[t]);
    }
    const float bm = block_max(tm, red);
    float se = 0.0f;
#pragma unroll
    for (int t = 0; t < PER; t++) se += bm > -INFINITY ? expf(kv[t] - bm) : 0.0f;
    se = block_sum(se, red);
    if (threadIdx.x == 0) part_lse[2 * blockIdx.x] = bm, part_lse[2 * blockIdx.x + 1] = se, nc = 0;
    tmax[threadIdx.x] = tm;
    __syncthreads();
    const int kk = k > 0 ? k : 1;
    bitonic_keys(tmax);
    const float thr = tmax[kk - 1];
#pragma unroll
    for (int t = 0; t < PER; t++) {
        const int i = lo + threadIdx.x + t * SAMPLE_THREADS;
        if (i < n && kv[t] >= thr) {
            const int slot = atomicAdd(&nc, 1);
            key[slot] = kv[t], id[slot] = i;
        }
    }
    __syncthreads();
    sort_cands(key, id, nc, kk);
    float *pk = part + (size_t)blockIdx.x * BACKEND_SAMPLE_KMAX * 2;
    for (int j = threadIdx.x; j < kk; j += blockDim.x) pk[2 * j] = key[j], pk[2 * j + 1] = __int_as_float(id[j]);
    fence_device();
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(counter, 1) == (int)gridDim.x - 1;
    __syncthreads();
    if (!last) return;
    fence_device();
    const int nb = gridDim.x;
    float m2 = -INFINITY, kth = -INFINITY;
    for (int b = threadIdx.x; b < nb; b += blockDim.x) {
        m2 = fmaxf(m2, load_coherent(part_lse + 2 * b));
        kth = fmaxf(kth, load_coherent(part + ((size_t)b * BACKEND_SAMPLE_KMAX + kk - 1) * 2));
    }
    const float M = block_max(m2, red), thr2 = block_max(kth, red);
    float sum = 0.0f;
    for (int b = threadIdx.x; b < nb; b += blockDim.x) {
        const float mb = load_coherent(part_lse + 2 * b);
        if (mb > -INFINITY) sum += load_coherent(part_lse + 2 * b + 1) * expf(mb - M);
    }
    sum = block_sum(sum, red);
    if (threadIdx.x == 0) nc = 0;
    __syncthreads();
    for (int q = threadIdx.x; q < nb * kk; q += blockDim.x) {
        const float *e = part + ((size_t)(q / kk) * BACKEND_SAMPLE_KMAX + q % kk) * 2;
        const float v = load_coherent(e);
        const int ii = __float_as_int(load_coherent(e + 1));
        if (v >= thr2 && ii != 0x7fffffff) {
            const int slot = atomicAdd(&nc, 1);
            key[slot] = v, id[slot] = ii;
        }
    }
    __syncthreads();
    sort_cands(key, id, nc, kk);
    if (threadIdx.x == 0) {
        out[0] = M + logf(sum);
        out[1] = bf2f(x[*chosen]);
        *counter = 0;
    }
    for (int j = threadIdx.x; j < k; j += blockDim.x) {
        out[2 + j] = key[j];
        out[2 + k + j] = __int_as_float(id[j] == 0x7fffffff ? 0 : id[j]);
    }
}

extern "C" void cuda_logprobs(struct cuda *cu, float *out, const uint16_t *x, int n, int k,
                              const int32_t *chosen) {
    CHECK(n >= 1 && n <= BACKEND_SAMPLE_VMAX && k >= 0 && k <= BACKEND_LOGPROBS_KMAX);
    const int blocks = (n + SAMPLE_SLICE - 1) / SAMPLE_SLICE;
    gpu_launch(cu->pdl, logprobs_kernel, dim3(blocks), dim3(SAMPLE_THREADS), 0, cu->stream, out, x,
               n, k, chosen, cu->sample_part, cu->sample_part + (size_t)64 * BACKEND_SAMPLE_KMAX * 2,
               cu->counters + 2);
    cu->n_launches++;
}

extern "C" void cuda_sample(struct cuda *cu, int32_t *out, const uint16_t *x, int n,
                            const struct backend_sample_state *st, int32_t *pos, int host_pos) {
    CHECK(n >= 1 && n <= BACKEND_SAMPLE_VMAX);
    const int blocks = (n + SAMPLE_SLICE - 1) / SAMPLE_SLICE;
    gpu_launch(cu->pdl, sample_kernel, dim3(blocks), dim3(SAMPLE_THREADS), 0, cu->stream, out, x, n,
               *st, cu->sample_part, cu->counters + 1, pos, host_pos, cu->n_posts, cu->mail_dev);
    cu->n_launches++;
}
