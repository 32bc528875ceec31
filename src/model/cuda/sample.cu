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

extern "C" void cuda_sample(struct cuda *cu, int32_t *out, const uint16_t *x, int n,
                            const struct backend_sample_state *st, int32_t *pos, int host_pos) {
    CHECK(n >= 1 && n <= BACKEND_SAMPLE_VMAX);
    const int blocks = (n + SAMPLE_SLICE - 1) / SAMPLE_SLICE;
    gpu_launch(cu->pdl, sample_kernel, dim3(blocks), dim3(SAMPLE_THREADS), 0, cu->stream, out, x, n,
               *st, cu->sample_part, cu->counters + 1, pos, host_pos, cu->n_posts, cu->mail_dev);
    cu->n_launches++;
}
