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
/* A group of TPR threads computes a row pair: 2 output rows (plain) or one SwiGLU output (a gate
 * row and its up row). A block holds 256 / TPR groups and walks row pairs with a grid stride
 * (persistent: the grid is sized to the resident blocks, so the prologue is paid once per
 * block). The block puts x (normalised when norm_w is set; in the GATED mode, through the
 * DeltaNet gated RMSNorm, so the DeltaNet step needs no second phase) into shared memory as
 * bf16, exactly the values cpu.c's rmsnorm_row (gdn_heads) produces.
 * Streaming: a group's work is a sequence of items (row pair, chunk of K: each thread loads U
 * 16-byte words of both rows), software-pipelined D items deep: the loads of item t + D are
 * issued before item t is computed and reduced (a ring of D + 1 register sets), so each thread
 * keeps D items in flight. Time goes by items per block (each costs about one memory round
 * trip / D unless the bytes in flight already fill the SM's share of DRAM bandwidth), which the
 * launcher minimises over (TPR, U, D): few long rows want the whole block on one row pair and
 * U sized so that a row is one item.
 * The residual rows of an accumulating GEMV are read when the loads of their last chunk are
 * issued, not in the epilogue, so that read is off the critical path.
 * Programmatic dependent launch: weights do not depend on the previous kernel, so items
 * 0 .. D-1 are loaded and the next item of those rows requested into L2 before
 * grid_dependency_wait() (whole rows flood L2 and delay the reads of x behind them when a
 * block has one long row pair: run 15, 9B +5%; none instead of one item changed nothing, run
 * 35); the block lets the next kernel start its blocks at once. After the wait, item D goes out
 * as soon as x has arrived (see pre_issue), so the staging's arithmetic and barriers do not
 * leave the block without loads in flight.
 * Bytes: 2 N K weights (4 I K for SwiGLU) + 2 K x per block + 2 N out (x2 with accumulate);
 * FLOPs: 2 N K (+ ~4 K per block for the norm). */
/* the kernel's mode (GATED: cuda_gemv_gated; EARLY: plain, for cuda_gemv_early) */
enum { GEMV_PLAIN, GEMV_SWIGLU, GEMV_GATED, GEMV_EARLY };

/* TAIL (gemv_tail_kernel): the row pairs below job.tail_start (whole rounds,
 * at least two) go by the grid stride as above, the rest one at a time from a counter, so the
 * warps that stream faster take more of the last rounds (the last-block tails: 4B's lm_head's
 * last block ended 13 us after the mean one, run 83). Lane 0 asks for the next pair when its
 * group starts the one before (its last static pair, or a counted one), so the atomic's round
 * trip hides behind that pair's loads; a grab past the end ends the group, which then counts
 * itself done in its block (s_done), the block in tail_ctr[1], and the last block puts both
 * counters back to zero. Grabs only after the wait: the counter is the previous GEMV's until
 * that one completes. Warp groups, D = 1, plain (no residual) only. */
template <int TPR, int U, int D, int MODE, bool TAIL = false>
static __device__ __forceinline__ void gemv_run(const struct cuda_gemv_job &job, float eps,
                                                uint4 *xs, float (*red)[2], int *s_done = nullptr) {
    static_assert(!TAIL || (TPR == WARP_SIZE && D == 1 && MODE == GEMV_PLAIN), "tail: warp groups, D = 1");
    constexpr bool SWIGLU = MODE == GEMV_SWIGLU, GATED = MODE == GEMV_GATED, EARLY = MODE == GEMV_EARLY;
    uint16_t *out = job.out;
    const uint16_t *norm_w = job.norm_w, *W = job.W;
    const int N = job.N, K = job.K, accumulate = job.accumulate;
    const int K8 = K / 8;
    const uint4 *x4 = (const uint4 *)job.x;
    const int wid = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    const int GROUPS = GEMV_THREADS / TPR, STEP = U * TPR;
    const int g = threadIdx.x / TPR, l = threadIdx.x % TPR;
    const int n_pairs = SWIGLU ? N : (N + 1) / 2;
    const int nc = (K8 + STEP - 1) / STEP;            /* chunks per row pair */
    const int pstride = gridDim.x * GROUPS, pb = blockIdx.x * GROUPS;
    const int S = TAIL ? job.tail_start : n_pairs;    /* pairs by the grid stride */
    const int n_units = pb < S ? (S - pb + pstride - 1) / pstride : 0;
    /* the same for every thread of the block (TAIL: the cursor ends the loop) */
    const int n_items = TAIL ? 0x7fffffff : n_units * nc;
    unsigned long long *tr = job.trace && threadIdx.x == 0 ? job.trace + 4 * blockIdx.x : NULL;
    if (tr) tr[0] = gpu_time_ns();
    auto rows_of = [&](int p, int &r0, int &r1, bool &has1) { /* p < n_pairs */
        int q = p;
        if (EARLY) { /* cuda_early's order */
            const struct cuda_early &e = job.early;
            const int sh = e.hp_log2, qp = e.nh << sh;
            if (sh == 0) {
                q = p + e.rot;
                if (q >= n_pairs) q -= n_pairs;
            } else if (p < e.kvp) {
                q = 2 * qp + p;
            } else { /* head j >> sh's q (first qp) or gate pairs: 2 hp pairs a head */
                const int j = p - e.kvp < qp ? p - e.kvp : p - e.kvp - qp;
                q = ((j >> sh) << (sh + 1)) + (p - e.kvp < qp ? 0 : 1 << sh) + (j & ((1 << sh) - 1));
            }
        }
        gemv_rows<SWIGLU>(q, N, r0, r1, has1);
    };

    uint4 A[D + 1][U], B[D + 1][U]; /* ring of in-flight items */
    float R0[D + 1], R1[D + 1];     /* residual rows of an item that ends its row pair */
    /* cursors: an item is (row pair p, chunk c); items advance c, then p by the grid stride */
    auto advance = [&](int &p, int &c) {
        if (++c == nc) {
            c = 0;
            p += pstride;
        }
    };
    int pend = 0; /* TAIL, lane 0: the pair its grab returned (in flight until read) */
    bool grab_due = false, waited = false;
    auto grab = [&]() {
        if (!waited)
            grab_due = true;
        else if (l == 0)
            pend = S + atomicAdd(job.tail_ctr, 1);
    };
    auto advance_tail = [&](int &p, int &c) { /* TAIL: the issue cursor's advance */
        if (p >= n_pairs || ++c < nc) return;
        c = 0;
        int q = p + pstride;
        if (q < S) {
            if (q + pstride >= S) grab(); /* its last static pair: ask for the next one now */
        } else {
            q = shfl_from(pend, 0);
            if (q < n_pairs) {
                grab();
            } else { /* the group's last grab: count it done, the last block resets */
                q = n_pairs;
                if (l == 0 && atomicAdd(s_done, 1) == GROUPS - 1 &&
                    atomicAdd(job.tail_ctr + 1, 1) == (int)gridDim.x - 1) {
                    fence_device();
                    atomicExch(job.tail_ctr, 0);
                    atomicExch(job.tail_ctr + 1, 0);
                }
            }
        }
        p = q;
    };
    auto issue = [&](bool valid, int p, int c, uint4 (&a)[U], uint4 (&b)[U], float &res0,
                     float &res1, bool ready) {
        const uint4 zero = make_uint4(0, 0, 0, 0);
        if (valid && p < n_pairs) {
            int r0, r1;
            bool has1;
            rows_of(p, r0, r1, has1);
            const uint4 *w0 = (const uint4 *)(W + (size_t)r0 * K), *w1 = (const uint4 *)(W + (size_t)r1 * K);
            const int k = l + c * STEP;
#pragma unroll
            for (int j = 0; j < U; j++) {
                const bool ok = k + j * TPR < K8;
                a[j] = ok ? load_stream(w0 + k + j * TPR) : zero;
                b[j] = ok ? load_stream(w1 + k + j * TPR) : zero;
            }
            if (ready && !SWIGLU && accumulate && l == 0 && c == nc - 1) {
                res0 = bf2f(out[r0]);
                res1 = has1 ? bf2f(out[r1]) : 0.0f;
            }
        } else {
#pragma unroll
            for (int j = 0; j < U; j++) a[j] = b[j] = zero;
        }
    };

    int ip = pb + g, ic = 0; /* next item to issue */
#pragma unroll
    for (int s = 0; s < D; s++) {
        issue(s < n_items, ip, ic, A[s], B[s], R0[s], R1[s], false);
        if (TAIL)
            advance_tail(ip, ic);
        else
            advance(ip, ic);
    }
    if (n_items > 0 && pb + g < n_pairs) { /* the next items of the first rows, towards L2 */
        int r0, r1;
        bool has1;
        rows_of(pb + g, r0, r1, has1);
        const char *c0 = (const char *)(W + (size_t)r0 * K), *c1 = (const char *)(W + (size_t)r1 * K);
        const int lim = min(K * 2, 16 * (D + 1) * STEP);
        for (int off = 16 * D * STEP + l * 128; off < lim; off += TPR * 128) {
            prefetch_l2(c0 + off);
            prefetch_l2(c1 + off);
        }
    }
    if (GATED) /* the gated norm's weights, behind x in shared memory */
        for (int i = threadIdx.x; i < job.gdv / 4; i += GEMV_THREADS)
            ((float4 *)(xs + K8))[i] = ((const float4 *)job.gnorm_w)[i];
    /* the RMSNorm's weights (the first two words of each thread) into registers: they do not
     * depend on the previous kernel, and streaming evicts them from L2, so after the wait they
     * would be a DRAM round trip beside x's L2 one (run 51: 4B +0.6%, 0.8B +2.4%) */
    uint4 Wpre[2] = {};
    const bool nw_pre = !GATED && norm_w;
    if (nw_pre)
#pragma unroll
        for (int q = 0; q < 2; q++)
            if (threadIdx.x + q * GEMV_THREADS < K8) Wpre[q] = ((const uint4 *)norm_w)[threadIdx.x + q * GEMV_THREADS];
    /* Item D (the ring's last slot) is issued during staging, once x's loads have returned (by a
     * normalising GEMV after the norm's first pass, by the others before the staging barrier)
     * instead of in the main loop's first iteration, so its round trip overlaps the norm's
     * arithmetic and the barriers. Issued before x's loads, it delayed them (run 52: -4%); after
     * them, run 99: 4B +2.3%, 0.8B +4.5%. TAIL: this cannot be
     * a group's last grab (at least two rounds are static), so s_done is not touched before the
     * staging barrier. */
    bool pre = false;
    int pre_ip = 0, pre_ic = 0;
    auto pre_issue = [&]() {
        pre = true;
        pre_ip = ip, pre_ic = ic;
        issue(D < n_items, ip, ic, A[D], B[D], R0[D], R1[D], true);
        if (TAIL)
            advance_tail(ip, ic);
        else
            advance(ip, ic);
    };
    if (TAIL && threadIdx.x == 0) *s_done = 0; /* read after the staging barrier */
    grid_dependency_wait();
    if (TAIL) {
        waited = true;
        if (grab_due) grab();
    }
    if (GATED) __syncthreads();
    if (tr) tr[1] = gpu_time_ns();
    if (!SWIGLU && accumulate && l == 0) { /* residuals of the items issued before the wait */
        int p = pb + g, c = 0;
#pragma unroll
        for (int s = 0; s < D; s++) {
            if (s < n_items && p < n_pairs && c == nc - 1) {
                int r0, r1;
                bool has1;
                rows_of(p, r0, r1, has1);
                R0[s] = bf2f(out[r0]);
                R1[s] = has1 ? bf2f(out[r1]) : 0.0f;
            }
            advance(p, c);
        }
    }

    if (!GATED && norm_w) {
        /* one pass over x and the norm weights (both into shared memory), one barrier for the
         * sum of squares, then normalise in place */
        uint4 *ws = xs + K8;
        const uint4 *w4 = (const uint4 *)norm_w;
        float ss = 0.0f;
        for (int i0 = threadIdx.x; i0 < K8; i0 += 2 * GEMV_THREADS) {
            uint4 X[2], Wn[2]; /* both loads of a pair in flight at once */
#pragma unroll
            for (int q = 0; q < 2; q++) {
                const int i = i0 + q * GEMV_THREADS;
                if (i < K8) {
                    X[q] = x4[i];
                    Wn[q] = nw_pre && i0 == (int)threadIdx.x ? Wpre[q] : w4[i];
                }
            }
#pragma unroll
            for (int q = 0; q < 2; q++) {
                const int i = i0 + q * GEMV_THREADS;
                if (i < K8) {
                    ws[i] = Wn[q];
                    xs[i] = X[q];
                    float f[8];
                    unpack8(X[q], f);
#pragma unroll
                    for (int j = 0; j < 8; j++) ss += f[j] * f[j];
                }
            }
        }
        pre_issue();
        ss = warp_sum(ss);
        if (lane == 0) red[wid][0] = ss;
        __syncthreads();
        float tot = 0.0f;
#pragma unroll
        for (int w = 0; w < GEMV_THREADS / WARP_SIZE; w++) tot += red[w][0];
        const float r = 1.0f / sqrtf(tot / (float)K + eps);
        for (int i = threadIdx.x; i < K8; i += GEMV_THREADS) xs[i] = rmsnorm8(xs[i], ws[i], r);
    } else if (GATED) {
        /* the DeltaNet gated RMSNorm of x, per head of gdv values (gdv / 8 lanes, aligned):
         * bf16(bf16(w * bf16(o * rsqrt(mean(o^2) + eps))) * silu(z)), as cpu.c's gdn_heads,
         * silu(z) in fp32 from the DeltaNet step or the in_proj GEMV; K8 is a multiple of the
         * warp size, so every lane takes part in the group sums */
        const float4 *sz4 = (const float4 *)job.gsz, *nw4 = (const float4 *)(xs + K8);
        const int gw = job.gdv / 8;
        for (int i0 = threadIdx.x; i0 < K8; i0 += 2 * GEMV_THREADS) {
            uint4 X[2];
            float4 Sa[2], Sb[2];
#pragma unroll
            for (int q = 0; q < 2; q++) { /* both words' loads in flight at once */
                const int i = i0 + q * GEMV_THREADS;
                if (i < K8) {
                    X[q] = x4[i];
                    Sa[q] = sz4[2 * i];
                    Sb[q] = sz4[2 * i + 1];
                }
            }
#pragma unroll
            for (int q = 0; q < 2; q++) {
                const int i = i0 + q * GEMV_THREADS;
                if (i >= K8) break; /* warp-uniform */
                float f[8];
                unpack8(X[q], f);
                const float4 Wa = nw4[2 * (i % gw)], Wb = nw4[2 * (i % gw) + 1];
                const float w[8] = {Wa.x, Wa.y, Wa.z, Wa.w, Wb.x, Wb.y, Wb.z, Wb.w};
                const float z[8] = {Sa[q].x, Sa[q].y, Sa[q].z, Sa[q].w, Sb[q].x, Sb[q].y, Sb[q].z, Sb[q].w};
                float ss = 0.0f;
#pragma unroll
                for (int j = 0; j < 8; j++) ss += f[j] * f[j];
                ss = group_sum(ss, gw);
                const float rr = 1.0f / sqrtf(ss / (float)job.gdv + eps);
                float y[8];
#pragma unroll
                for (int j = 0; j < 8; j++) y[j] = bfr(w[j] * bfr(f[j] * rr)) * z[j];
                xs[i] = make_uint4(pack_bf(y[0], y[1]), pack_bf(y[2], y[3]), pack_bf(y[4], y[5]),
                                   pack_bf(y[6], y[7])); /* HF: norm(core_attn_out, z) */
            }
        }
    } else {
        for (int i0 = threadIdx.x; i0 < K8; i0 += 4 * GEMV_THREADS) { /* 4 loads in flight */
            uint4 X[4];
#pragma unroll
            for (int q = 0; q < 4; q++)
                if (i0 + q * GEMV_THREADS < K8) X[q] = x4[i0 + q * GEMV_THREADS];
#pragma unroll
            for (int q = 0; q < 4; q++)
                if (i0 + q * GEMV_THREADS < K8) xs[i0 + q * GEMV_THREADS] = X[q];
        }
    }
    if (!pre) pre_issue();
    __syncthreads();
    if (tr) tr[2] = gpu_time_ns();

    float a0 = 0.0f, a1 = 0.0f;
    /* EARLY: the item after which every group of the block has written its early pairs (those
     * of rounds 0 .. (early - 1 - pb) / pstride); -1: none of its pairs is early */
    const int t_sig = EARLY && pb < job.early.early ? ((job.early.early - 1 - pb) / pstride + 1) * nc - 1 : -1;
    int p = pb + g, c = 0; /* the item being computed */
    for (int t0 = 0; t0 < n_items && (!TAIL || p < n_pairs); t0 += D + 1) {
#pragma unroll
        for (int s = 0; s <= D; s++) {
            const int t = t0 + s;
            if (t >= n_items || (TAIL && p >= n_pairs)) break;
            /* issue item t + D into the slot item t - 1 used */
            const int sn = (s + D) % (D + 1);
            int ip1 = pre_ip, ic1 = pre_ic; /* TAIL (D = 1): item t + 1, the next to compute */
            if (!pre || t > 0) {
                issue(t + D < n_items, ip, ic, A[sn], B[sn], R0[sn], R1[sn], true);
                ip1 = ip, ic1 = ic;
                if (TAIL)
                    advance_tail(ip, ic);
                else
                    advance(ip, ic);
            }
            /* compute item t */
            const bool active = p < n_pairs;
            if (active) {
                const int k = l + c * STEP;
#pragma unroll
                for (int j = 0; j < U; j++)
                    if (k + j * TPR < K8) {
                        const uint4 X = xs[k + j * TPR];
                        a0 += dot8(A[s][j], X);
                        a1 += dot8(B[s][j], X);
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
                    rows_of(p, r0, r1, has1);
                    if (SWIGLU) {
                        float gt = bfr(a0), up = bfr(a1);
                        out[p] = f2bf(bfr(silu_f(gt)) * up); /* HF: act_fn(gate_proj(x)) * up_proj(x) */
                    } else if (accumulate) {
                        out[r0] = f2bf(R0[s] + bfr(a0)); /* HF: residual + linear(x) */
                        if (has1) out[r1] = f2bf(R1[s] + bfr(a1));
                    } else {
                        out[r0] = f2bf(a0);
                        if (has1) out[r1] = f2bf(a1);
                    }
                    if (EARLY && job.early.sz)
                        for (int k = 0; k < 2; k++) { /* silu(z) of its z rows, for the out_proj */
                            const int r = k ? r1 : r0, z = r - job.early.z0;
                            if ((k == 0 || has1) && z >= 0 && z < job.early.nz) job.early.sz[z] = silu_f(bfr(k ? a1 : a0));
                        }
                }
                a0 = a1 = 0.0f;
            }
            if (TAIL)
                p = ip1, c = ic1;
            else
                advance(p, c);
            if (EARLY && t == t_sig) {
                /* the block's early pairs are written: one thread counts the block (the barrier
                 * orders the other warps' writes before its fence, as a CUTLASS semaphore
                 * does), so one warp waits on the fence instead of every one */
                __syncthreads();
                if (threadIdx.x == 0) {
                    fence_device();
                    atomicAdd(job.early.cnt, 1);
                }
            }
        }
    }
    if (tr) tr[3] = gpu_time_ns();
}

template <int TPR, int U, int D, int MODE>
static __global__ void __launch_bounds__(GEMV_THREADS, 2)
gemv_kernel(struct cuda_gemv_job job, float eps) {
    extern __shared__ uint4 xs[]; /* (K / 8,) x, then (K / 8,) norm weights when normalising */
    __shared__ float red[GEMV_THREADS / WARP_SIZE][2];
    grid_launch_dependents();
    gemv_run<TPR, U, D, MODE>(job, eps, xs, red);
}

/* The plain and EARLY modes held to 104 registers where the ring (U (D + 1) 16-byte words of
 * two rows) is at most 8 words: the DeltaNet step's block (128 x 96) must fit beside two blocks
 * of the wide shape (backend_cuda_residency; it follows the EARLY in_proj, or a plain one where
 * the step does not start early). Uncapped, the pre-issue took the plain mode from 104 to 106 registers;
 * capped, 96. */
template <int TPR, int U, int D, int MODE>
static __global__ void GPU_MAXNREG(U *(D + 1) <= 8 ? 104 : 128)
gemv_capped_kernel(struct cuda_gemv_job job, float eps) {
    extern __shared__ uint4 xs[];
    __shared__ float red[GEMV_THREADS / WARP_SIZE][2];
    grid_launch_dependents();
    gemv_run<TPR, U, D, MODE>(job, eps, xs, red);
}

template <int TPR, int U, int D>
static __global__ void __launch_bounds__(GEMV_THREADS, 2)
gemv_tail_kernel(struct cuda_gemv_job job, float eps) {
    extern __shared__ uint4 xs[];
    __shared__ float red[GEMV_THREADS / WARP_SIZE][2];
    __shared__ int s_done; /* warp groups of this block past their last pair */
    grid_launch_dependents();
    gemv_run<TPR, U, D, GEMV_PLAIN, true>(job, eps, xs, red, &s_done);
}

/* out = bf16(out + y), element-wise, 8 elements a thread (16-byte words: n % 8 == 0, both
 * arrays 16-byte aligned; one 2-byte element a thread took 6.9 us for a 512 x 2,560 add, now
 * 2.6: runs 233 / 235, H200). Bytes: 6 n. */
static __global__ void add_kernel(uint16_t *out, const uint16_t *y, size_t n) {
    grid_launch_dependents(); /* programmatic dependent launch: nothing before the wait */
    grid_dependency_wait();
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n / 8) return;
    float a[8], b[8];
    unpack8(((const uint4 *)out)[i], a);
    unpack8(((const uint4 *)y)[i], b);
    ((uint4 *)out)[i] = make_uint4(pack_bf(a[0] + b[0], a[1] + b[1]), pack_bf(a[2] + b[2], a[3] + b[3]),
                                   pack_bf(a[4] + b[4], a[5] + b[5]), pack_bf(a[6] + b[6], a[7] + b[7]));
}

/* out[t, i] = bf16(bf16(silu(gu[t, i])) * gu[t, I + i]), 8 outputs a thread (16-byte words:
 * I % 8 == 0, both arrays 16-byte aligned; 512 x 9,216: 23.6 -> 9.1 us, ~3.1 TB/s, runs 233 /
 * 235). Bytes: 6 T I. */
static __global__ void swiglu_kernel(uint16_t *out, const uint16_t *gu, int T, int I) {
    grid_launch_dependents(); /* programmatic dependent launch: nothing before the wait */
    grid_dependency_wait();
    const size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int I8 = I / 8;
    if (idx >= (size_t)T * I8) return;
    const size_t t = idx / I8, i = idx % I8;
    const uint4 *g4 = (const uint4 *)gu + t * 2 * I8;
    float g[8], u[8];
    unpack8(g4[i], g);
    unpack8(g4[I8 + i], u);
#pragma unroll
    for (int e = 0; e < 8; e++) g[e] = bfr(silu_f(g[e])) * u[e];
    ((uint4 *)out)[idx] = make_uint4(pack_bf(g[0], g[1]), pack_bf(g[2], g[3]), pack_bf(g[4], g[5]),
                                     pack_bf(g[6], g[7]));
}

typedef void (*gemv_fn)(struct cuda_gemv_job, float);

/* The instantiated (TPR, U, D) shapes (U (D + 1) <= 10 keeps every one within 128 registers);
 * U = 5 fits K = 2560 rows (320 words) in one item of 64 threads or two of 32. */
struct gemv_shape {
    int tpr, u, d;
    gemv_fn plain, swiglu, gated, early;
};
#define GEMV_SHAPE(T, U, D)                                                                     \
    {T, U, D, gemv_capped_kernel<T, U, D, GEMV_PLAIN>, gemv_kernel<T, U, D, GEMV_SWIGLU>,       \
     gemv_kernel<T, U, D, GEMV_GATED>, gemv_capped_kernel<T, U, D, GEMV_EARLY>}
static const struct gemv_shape gemv_shapes[] = {
    GEMV_SHAPE(32, 4, 1),  GEMV_SHAPE(64, 4, 1),  GEMV_SHAPE(128, 4, 1), GEMV_SHAPE(256, 4, 1),
    GEMV_SHAPE(128, 2, 2), GEMV_SHAPE(256, 2, 2), GEMV_SHAPE(256, 1, 3), GEMV_SHAPE(128, 1, 3),
    GEMV_SHAPE(64, 5, 1),  GEMV_SHAPE(32, 5, 1),  GEMV_SHAPE(64, 2, 1), GEMV_SHAPE(32, 2, 1),
};
#define N_GEMV_SHAPES (int)(sizeof gemv_shapes / sizeof gemv_shapes[0])
#define GEMV_NARROW 10 /* (64, 2, 1): the lean shape of launch_gemv (run 61) */
static_assert(sizeof gemv_shapes / sizeof gemv_shapes[0] == CUDA_GEMV_SHAPES, "cuda.h's count");

/* Resident blocks per SM of a GEMV kernel with this much dynamic shared memory. */
static int resident(gemv_fn kern, size_t smem) {
    if (smem > 48 * 1024) GPU_SMEM_OPTIN(kern, smem);
    int n = gpu_occupancy(kern, GEMV_THREADS, smem);
    return n > 0 ? n : 1;
}

/* Estimated time of a GEMV shape on a persistent grid of `cap` blocks, in units of one memory
 * round trip: the slowest block's items, each costing a round trip / D or the time its bytes
 * take at the block's share of bandwidth, whichever is longer (a round trip moves ~40 KiB per SM
 * at full bandwidth: 20 KiB per block at 2 blocks per SM). */
static double gemv_cost_rounds(const struct gemv_shape *sh, long pairs, long K8, long cap) {
    long groups = GEMV_THREADS / sh->tpr, units = (pairs + groups - 1) / groups;
    long rounds = (units + cap - 1) / cap, step = (long)sh->u * sh->tpr;
    long nc = (K8 + step - 1) / step;
    if (sh->tpr > WARP_SIZE && K8 < 2L * sh->tpr) return 1e30; /* most of the group idle */
    double item_bytes = 32.0 * groups * (double)K8 / (double)nc; /* both rows, mean chunk */
    double per_item = 1.0 / sh->d;
    double by_bw = item_bytes / (20.0 * 1024);
    return (double)rounds * (double)nc * (per_item > by_bw ? per_item : by_bw);
}

/* The shape for a GEMV of `pairs` row pairs and K8 16-byte words per row. Measured on the H200
 * (bench/RESULTS.md, runs 35-38, per GEMV class: active time + the gap to the next kernel):
 * with at least half a round of warp groups per block (pairs >= 4 cap), groups of one or two
 * warps with U = 4, D = 1 stream fastest (no block-wide reduction per item; whole-block groups
 * were 5-15% slower on the 4B / 9B projections and the 9B lm_head), and one shape for all of a
 * model's such GEMVs beat a choice per GEMV (switching kernels lengthened the gaps between
 * them; run 38 against the round model over every shape: 0.8B +1.9%, 4B +0.6%, 9B +0.5%):
 * cu->gemv_wide, see cuda_gemv_wide_shape. With fewer rows, warp groups would leave warps idle:
 * groups of 128-256 threads split K instead, by the round model (every shape when none of those
 * applies). cu->gemv_shape >= 0 (the tests) forces a shape. */
static int gemv_pick(struct cuda *cu, long pairs, long K8, long cap) {
    if (cu->gemv_shape >= 0 && cu->gemv_shape < N_GEMV_SHAPES) return cu->gemv_shape;
    if (pairs >= (long)(GEMV_THREADS / WARP_SIZE / 2) * cap) return cu->gemv_wide;
    int best = -1;
    double best_c = 1e29;
    for (int pass = 0; pass < 2 && best < 0; pass++)
        for (int i = 0; i < N_GEMV_SHAPES; i++) { /* pass 1: every shape (rows too short) */
            if (pass == 0 && gemv_shapes[i].tpr < 4 * WARP_SIZE) continue;
            double c = gemv_cost_rounds(&gemv_shapes[i], pairs, K8, cap);
            if (c < best_c - 1e-9) best_c = c, best = i;
        }
    return best >= 0 ? best : 0;
}

/* The warp-group shape of a model's wide GEMVs: the widest group of at most two warps (U = 4)
 * whose chunk divides the hidden row (K8 = hidden / 8 words), so the rows with K = hidden (the
 * input projections, gate/up, lm_head) end in no partly idle chunk: 9B (K8 = 512) two warps,
 * 4B (320) and 0.8B (128) one. */
static int gemv_warp_shape(int tpr) { /* the shape (tpr, 4, 1) */
    for (int i = 0; i < N_GEMV_SHAPES; i++)
        if (gemv_shapes[i].tpr == tpr && gemv_shapes[i].u == 4 && gemv_shapes[i].d == 1) return i;
    return 0;
}
extern "C" int cuda_gemv_wide_shape(int hidden) {
    return gemv_warp_shape((hidden / 8) % (4 * 2 * WARP_SIZE) == 0 ? 2 * WARP_SIZE : WARP_SIZE);
}

/* Registers per thread of a shape's plain (normalising, non-gated) kernel, or of its EARLY mode
 * (cuda_gemv_early) where that takes more; threads per block. */
extern "C" int cuda_gemv_regs(int shape, int *threads) {
    *threads = GEMV_THREADS;
    const int a = gpu_kernel_regs(gemv_shapes[shape].plain), b = gpu_kernel_regs(gemv_shapes[shape].early);
    return a > b ? a : b;
}

/* Tracing: the job's timestamp slots (NULL when tracing is off or the buffer is full). */
static unsigned long long *trace_job(struct cuda *cu, int N, int K, int flags, int blocks) {
    if (!cu->trace || !cu->capturing || cu->trace_n >= CUDA_TRACE_JOBS || blocks * 4 > CUDA_TRACE_STRIDE) return NULL;
    int n = cu->trace_n++;
    cu->trace_blocks[n] = blocks;
    cu->trace_N[n] = N;
    cu->trace_K[n] = K;
    cu->trace_flags[n] = flags;
    return cu->trace + (size_t)n * CUDA_TRACE_STRIDE;
}
static unsigned long long *trace_slot(struct cuda *cu, const struct cuda_gemv_job *j, int blocks) {
    return trace_job(cu, j->N, j->K, (j->norm_w || j->gnorm_w ? 1 : 0) | (j->accumulate ? 2 : 0) | (j->swiglu ? 4 : 0) | (j->tpr << 4), blocks);
}

/* Launches a decode GEMV job on the persistent grid with the shape the cost model picks (dry:
 * only sizes that grid); returns its warp groups, the grid stride in row pairs. */
static long launch_gemv(struct cuda *cu, struct cuda_gemv_job job, float eps, int dry = 0,
                        int *tpr = NULL) {
    const int N = job.N, K = job.K;
    CHECK(K % 8 == 0 && (size_t)K * 4 <= (size_t)cu->info.smem_optin);
    /* x, and the norm weights (bf16 (K,) or the gated norm's fp32 (gdv,)) */
    size_t smem = (size_t)K * 2 * (job.norm_w ? 2 : 1) + (job.gnorm_w ? (size_t)job.gdv * 4 : 0);
    const long pairs = job.swiglu ? N : (N + 1) / 2;
    /* the persistent grid: 2 blocks per SM (what shape 3 keeps resident; every shape fits 2),
     * also for the leaner shapes, whose spare registers then let the next kernel start early */
    long cap = (long)cu->info.n_sm * resident(gemv_shapes[3].plain, smem);
    const struct gemv_shape *sh = &gemv_shapes[gemv_pick(cu, pairs, K / 8, cap)];
    /* The dynamic tail (gemv_run's TAIL; cu->gemv_tail = R, 4): a plain GEMV of at least
     * cu->gemv_tail_min rounds of one-warp groups (8: the lm_head, ~59)
     * runs that shape (U = 4, D = 1) with its last R rounds from the counter. Run 84: the 4B
     * lm_head's last block ended 6 us after the mean one instead of 16 (R = 2); run 85, tg128:
     * 4B +0.45%, 0.8B +0.4% (R = 4; 2 and 8 gained less), 9B +0.3% (whose two-warp lm_head
     * this replaces; the shape alone +0.1%); run 90: 2B +0.5%. */
    bool tail = false;
    long tail_start = 0;
    if (cu->gemv_tail > 0 && cu->gemv_shape < 0 && !job.swiglu && !job.gnorm_w && !job.early.cnt &&
        !job.accumulate) {
        const long g0 = GEMV_THREADS / WARP_SIZE, stride = min(cap, (pairs + g0 - 1) / g0) * g0;
        const long rounds = (pairs + stride - 1) / stride;
        if (rounds >= cu->gemv_tail_min && rounds >= cu->gemv_tail + 2) {
            sh = &gemv_shapes[gemv_warp_shape(WARP_SIZE)];
            tail = true;
            tail_start = (rounds - cu->gemv_tail) * stride;
        }
    }
    /* The lean U = 2 shape (GEMV_NARROW = (64, 2, 1): 74 registers plain, 64 SwiGLU, so 3 or 4
     * blocks per SM) on a grid of what it keeps resident, in place of the wide shape, where run
     * 61 measured it faster:
     * - the plain GEMVs whose pairs fit one round of its grid's groups (4B's down and o_proj:
     *   4B +1.6%; 9B's, 1.3 of its rounds against 1.9 of the wide shape's, lost 3.7%);
     * - the SwiGLU GEMVs whose rows are longer than one of its items (K > 1024: 4B's and 9B's
     *   gate/up, +1.3% and +1.1%; 0.8B's K = 1024, one item a row, -0.9%).
     * Not the wider plain GEMVs (in_proj, qkv, lm_head: 4B -1.7%) nor the gated out_proj
     * (108 registers in that mode; bounded to 3 blocks per SM, 79 and spilling: run 62, -1.8%). */
    const long round = (long)(GEMV_THREADS / WARP_SIZE) * cap;
    if (!tail && cu->gemv_shape < 0 && !job.gnorm_w && pairs >= round / 2) {
        const struct gemv_shape *nw = &gemv_shapes[GEMV_NARROW];
        const long ncap = (long)cu->info.n_sm * resident(job.swiglu ? nw->swiglu : nw->plain, smem);
        const bool lean = job.swiglu ? K > nw->tpr * nw->u * 8 : pairs <= ncap * (GEMV_THREADS / nw->tpr);
        if (lean) sh = nw, cap = ncap;
    }
    gemv_fn kern = job.swiglu ? sh->swiglu : job.gnorm_w ? sh->gated : job.early.cnt ? sh->early : sh->plain;
    if (tail) {
        kern = gemv_tail_kernel<WARP_SIZE, 4, 1>;
        job.tail_ctr = cu->counters + 8;
        job.tail_start = (int)tail_start;
    }
    if (tpr) *tpr = sh->tpr;
    long groups = GEMV_THREADS / sh->tpr, blocks = (pairs + groups - 1) / groups;
    if (blocks > cap) blocks = cap; /* persistent (run 4: one row group per block, 0.8B -3%, 4B -6%) */
    if (dry) return blocks * groups;
    job.tpr = sh->tpr;
    job.trace = trace_slot(cu, &job, (int)blocks);
    if (smem > 48 * 1024) GPU_SMEM_OPTIN(kern, smem);
    gpu_launch(cu->pdl, kern, dim3((unsigned)blocks), dim3(GEMV_THREADS), smem, cu->stream, job, eps);
    cu->n_launches++;
    return blocks * groups;
}

extern "C" void cuda_gemv(struct cuda *cu, uint16_t *out, const uint16_t *x,
                          const uint16_t *norm_w, const uint16_t *W, int N, int K, float eps,
                          int accumulate, int swiglu) {
    struct cuda_gemv_job job = {};
    job.out = out, job.x = x, job.norm_w = norm_w, job.W = W;
    job.N = N, job.K = K, job.accumulate = accumulate, job.swiglu = swiglu;
    launch_gemv(cu, job, eps);
}

/* A head's words are an aligned group of lanes, and whole warps stage (every lane takes part in
 * the group sums): dv / 8 a power of two up to the warp, K a multiple of 8 warp-widths. */
extern "C" int cuda_gemv_gated_ok(int K, int dv) {
    return dv % 8 == 0 && dv / 8 <= WARP_SIZE && (dv / 8 & (dv / 8 - 1)) == 0 && K % dv == 0 &&
           K % (8 * WARP_SIZE) == 0;
}

extern "C" void cuda_gemv_gated(struct cuda *cu, uint16_t *out, const uint16_t *o, const float *sz,
                                const float *norm_w, int dv, const uint16_t *W, int N, int K,
                                float eps) {
    CHECK(cuda_gemv_gated_ok(K, dv));
    struct cuda_gemv_job job = {};
    job.out = out, job.x = o, job.W = W, job.N = N, job.K = K, job.accumulate = 1;
    job.gsz = sz, job.gnorm_w = norm_w, job.gdv = dv;
    launch_gemv(cu, job, eps);
}

/* A plain GEMV whose row pairs run in e's order, each block counting *e->cnt up once its pairs
 * among the first e->early of that order are written (after a barrier, one thread: fence, then
 * the count), and writing silu(z) of e's z rows; returns the count all blocks reach. The
 * DeltaNet in_proj puts b, a, q, k, v first and z last, so the step can start while z streams
 * (cuda_gdn_step); an attention qkv puts the gates last (cuda_attn_decode). */
extern "C" int cuda_gemv_early(struct cuda *cu, uint16_t *out, const uint16_t *x,
                               const uint16_t *norm_w, const uint16_t *W, int N, int K, float eps,
                               const struct cuda_early *e) {
    struct cuda_gemv_job job = {};
    job.out = out, job.x = x, job.norm_w = norm_w, job.W = W, job.N = N, job.K = K;
    job.early = *e;
    int tpr = 0;
    const long groups = launch_gemv(cu, job, eps, 0, &tpr), per_block = GEMV_THREADS / tpr;
    const long blocks = groups / per_block, counting = (e->early + per_block - 1) / per_block;
    return (int)(counting < blocks ? counting : blocks);
}

/* The warp groups cuda_gemv_early's grid would have (0: none, a GEMV it does not take). */
extern "C" long cuda_gemv_groups(struct cuda *cu, int N, int K, int norm) {
    struct cuda_gemv_job job = {};
    job.N = N, job.K = K, job.norm_w = norm ? (const uint16_t *)1 : NULL;
    return launch_gemv(cu, job, 0.0f, 1);
}

static bool aligned16(const void *a, const void *b) { return (((uintptr_t)a | (uintptr_t)b) & 15) == 0; }

extern "C" void cuda_add(struct cuda *cu, uint16_t *out, const uint16_t *y, size_t n) {
    CHECK(n % 8 == 0 && aligned16(out, y));
    gpu_launch(cu->pdl, add_kernel, dim3((unsigned)((n / 8 + 255) / 256)), dim3(256), 0, cu->stream, out, y, n);
    cu->n_launches++;
}

extern "C" void cuda_swiglu(struct cuda *cu, uint16_t *out, const uint16_t *gu, int T, int I) {
    CHECK(I % 8 == 0 && aligned16(out, gu));
    const size_t threads = (size_t)T * (I / 8);
    gpu_launch(cu->pdl, swiglu_kernel, dim3((unsigned)((threads + 255) / 256)), dim3(256), 0, cu->stream,
               out, gu, T, I);
    cu->n_launches++;
}

/* A batched decode step's few rows (2..8) on tensor cores, the weights streamed once: mma
 * m16n8k16 with 16 weight rows as the A operand (SwiGLU: 8 gate rows and their 8 up rows, so a
 * thread holds a gate and its up value) and the rows of x as the 8-wide B operand (rows past T
 * zeros).
 * The k order inside a 64-wide chunk is permuted alike for both operands so that each thread
 * loads 16-byte words: thread t of a fragment row holds words t and t + 4 of the chunk (a row's
 * 128 bytes in two whole 64-byte halves), and the fragment pairs of the chunk's 4 k-steps are
 * those words' halves.
 * Work: a unit is (16-row tile, slice of K); S warps of a block take the S slices of one tile,
 * the block's 8 / S tiles advance by the grid stride (a persistent grid of the resident
 * blocks). A warp's items (its units' 64-wide chunks, in order) are software-pipelined D deep
 * across units, so the loads of the next tile are in flight while a tile ends: at a unit's last
 * chunk the S partials meet in shared memory (double-buffered, one barrier) and the tile's first
 * warp writes bf16(y) (bf16(out + bf16(y)) accumulating; bf16(bf16(silu(bf16(gate))) * bf16(up))
 * SwiGLU): cpu.c's rounding points.
 * x: STAGED (a GEMM with an RMSNorm before it, K the hidden size): each block puts the rows of x
 * into shared memory normalised (a warp per row, cuda_rmsnorm's arithmetic; rows past T zero),
 * 64 bytes of padding a row so that a fragment's two rows use different banks, and the
 * fragments are read from there; the norm's own launch is gone. Otherwise x's words are loaded
 * from global memory (L2) beside the weight words in the pipeline (x read at the compute step
 * waited on L2 each chunk: runs 169-170, 5-28% slower).
 * Programmatic dependent launch, as the GEMV: the weights do not depend on the previous kernel,
 * so the first D items' weight words (and the norm's weights, into shared memory) are requested
 * before grid_dependency_wait(), and the block lets the next kernel start its blocks at once.
 * Bytes: 2 N K (4 I K SwiGLU) + 2 T K per unit (L2; STAGED: per block) + 2 T N (x2
 * accumulating); FLOPs 16 N K on the tensor cores (rows past T are zeros). */
/* A warp copies row xrow of x (K8 16-byte words, 4 loads in flight) to shared xd; returns the
 * lane's part of its sum of squares (the staged rows GEMMs' RMSNorm) */
static __device__ __forceinline__ float stage_row(uint4 *xd, const uint4 *xrow, int K8, int lane) {
    float ss = 0.0f;
    for (int i0 = lane; i0 < K8; i0 += 4 * WARP_SIZE) {
        uint4 X[4];
#pragma unroll
        for (int q = 0; q < 4; q++)
            if (i0 + q * WARP_SIZE < K8) X[q] = xrow[i0 + q * WARP_SIZE];
#pragma unroll
        for (int q = 0; q < 4; q++)
            if (i0 + q * WARP_SIZE < K8) {
                xd[i0 + q * WARP_SIZE] = X[q];
                float f[8];
                unpack8(X[q], f);
#pragma unroll
                for (int e = 0; e < 8; e++) ss += f[e] * f[e];
            }
    }
    return ss;
}

#define SK_WARPS 8
#define SK_XPAD 4 /* 16-byte words of padding after each staged row of x */
struct skinny_args {
    uint16_t *out;
    const uint16_t *x, *norm_w, *W;
    int N, K, T, accumulate, swiglu, S;
    float eps;
    unsigned long long *trace; /* NULL, or (blocks, 4) stamps as the GEMV's (STRATA_TRACE=1) */
};
template <int D, bool STAGED>
static __global__ void __launch_bounds__(SK_WARPS * WARP_SIZE, 2)
gemm_skinny_kernel(const struct skinny_args a) {
    extern __shared__ uint4 xs[]; /* STAGED: (8, K / 8 + SK_XPAD) x, then (K / 8,) norm weights */
    __shared__ float red[2][SK_WARPS][4][WARP_SIZE];
    grid_launch_dependents();
    unsigned long long *tr = a.trace && threadIdx.x == 0 ? a.trace + 4 * blockIdx.x : NULL;
    if (tr) tr[0] = gpu_time_ns();
    uint16_t *out = a.out;
    const int N = a.N, K = a.K, T = a.T, accumulate = a.accumulate, swiglu = a.swiglu, S = a.S;
    const int wid = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    const int g = lane >> 2, t = lane & 3;
    const int G = SK_WARPS / S, s = wid % S, slot = wid / S;
    const int n_tiles = swiglu ? (N + 7) / 8 : (N + 15) / 16;
    const int n_groups = (n_tiles + G - 1) / G;
    const int K8 = K / 8, XS = K8 + SK_XPAD, per = K / 64 / S, c0 = s * per;
    const int n_iter = (int)blockIdx.x < n_groups ? (n_groups - (int)blockIdx.x + (int)gridDim.x - 1) / (int)gridDim.x : 0;
    const int n_items = n_iter * per; /* the same for every warp of the block */
    const uint4 *W4 = (const uint4 *)a.W, *x4 = (const uint4 *)a.x;
    const uint4 zero = make_uint4(0, 0, 0, 0);
    /* this thread's fragment row of x: global (row g) or staged */
    const bool xok = STAGED || g < T;
    const uint4 *xr = STAGED ? xs + (size_t)g * XS : x4 + (size_t)(g < T ? g : 0) * K8;
    /* the fragment rows g and g + 8 of iteration i's tile: their weight rows and validity */
    auto rows_of = [&](int i, int &rA, int &rB, bool &okA, bool &okB) {
        const int tile = ((int)blockIdx.x + i * (int)gridDim.x) * G + slot;
        if (swiglu) {
            rA = tile * 8 + g;
            okA = okB = tile < n_tiles && rA < N;
            rB = N + rA;
        } else {
            rA = tile * 16 + g;
            rB = rA + 8;
            okA = tile < n_tiles && rA < N;
            okB = tile < n_tiles && rB < N;
        }
    };
    uint4 ring[D + 1][4], xring[D + 1][2]; /* an item's weight words and (global x) x words */
    int ii = 0, ic = 0; /* the issue cursor: iteration, chunk of the slice */
    auto issue_w = [&](uint4 (&r)[4]) {
        if (ii < n_iter) {
            int rA, rB;
            bool okA, okB;
            rows_of(ii, rA, rB, okA, okB);
            const size_t o = (size_t)(c0 + ic) * 8 + t;
            const uint4 *wa = W4 + (size_t)(okA ? rA : 0) * K8 + o, *wb = W4 + (size_t)(okB ? rB : 0) * K8 + o;
            r[0] = okA ? load_stream(wa) : zero;
            r[1] = okA ? load_stream(wa + 4) : zero;
            r[2] = okB ? load_stream(wb) : zero;
            r[3] = okB ? load_stream(wb + 4) : zero;
        }
    };
    auto issue_x = [&](uint4 (&xw)[2], int c) { /* global x: the words of chunk c of the slice */
        if (STAGED) return;
        const size_t o = (size_t)(c0 + c) * 8 + t;
        xw[0] = xok ? __ldg(xr + o) : zero;
        xw[1] = xok ? __ldg(xr + o + 4) : zero;
    };
    auto advance = [&]() {
        if (++ic == per) ic = 0, ii++;
    };
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    int ci = 0, cc = 0; /* the compute cursor */
    auto epilogue = [&](const float (&v)[4]) {
        int rA, rB;
        bool okA, okB;
        rows_of(ci, rA, rB, okA, okB);
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int n = 2 * t + h;
            if (n >= T) continue;
            uint16_t *o = out + (size_t)n * N;
            if (swiglu) {
                if (okA) o[rA] = f2bf(bfr(silu_f(bfr(v[h]))) * bfr(v[2 + h]));
            } else {
                const float m0 = bfr(v[h]), m1 = bfr(v[2 + h]);
                if (okA) o[rA] = f2bf(accumulate ? bf2f(o[rA]) + m0 : m0);
                if (okB) o[rB] = f2bf(accumulate ? bf2f(o[rB]) + m1 : m1);
            }
        }
    };
    auto compute = [&](const uint4 (&r)[4], const uint4 (&xg)[2]) {
        const uint32_t a0[4] = {r[0].x, r[2].x, r[0].y, r[2].y}, a1[4] = {r[0].z, r[2].z, r[0].w, r[2].w};
        const uint32_t a2[4] = {r[1].x, r[3].x, r[1].y, r[3].y}, a3[4] = {r[1].z, r[3].z, r[1].w, r[3].w};
        const size_t o = (size_t)(c0 + cc) * 8 + t;
        const uint4 xa = STAGED ? xr[o] : xg[0], xb = STAGED ? xr[o + 4] : xg[1];
        mma_bf16(acc, a0, xa.x, xa.y);
        mma_bf16(acc, a1, xa.z, xa.w);
        mma_bf16(acc, a2, xb.x, xb.y);
        mma_bf16(acc, a3, xb.z, xb.w);
        if (++cc < per) return;
        /* the unit's last chunk (at the same item in every warp of the block) */
        if (S > 1) {
            const int buf = ci & 1;
#pragma unroll
            for (int e = 0; e < 4; e++) red[buf][wid][e][lane] = acc[e];
            __syncthreads();
            if (s == 0) {
                float v[4];
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    float sum = 0.0f;
                    for (int w = 0; w < S; w++) sum += red[buf][wid + w][e][lane];
                    v[e] = sum;
                }
                epilogue(v);
            }
        } else {
            epilogue(acc);
        }
        acc[0] = acc[1] = acc[2] = acc[3] = 0.0f;
        cc = 0;
        ci++;
    };
    /* before the wait: the first D items' weight words, the norm's weights */
    int cpre[D];
#pragma unroll
    for (int d = 0; d < D; d++) {
        cpre[d] = ic;
        issue_w(ring[d]);
        advance();
    }
    uint4 *nws = xs + (size_t)8 * XS;
    if (STAGED && a.norm_w) {
        for (int i = threadIdx.x; i < K8; i += SK_WARPS * WARP_SIZE)
            cp_async16(smem_addr(nws + i), (const uint4 *)a.norm_w + i, 16);
        cp_async_commit();
    }
    grid_dependency_wait();
    if (tr) tr[1] = gpu_time_ns();
    if (STAGED) {
        /* warp w stages row w: raw, with its sum of squares, then normalised in place (the
         * norm's weights are every thread's copies: after the barrier) */
        float rr;
        {
            uint4 *xd = xs + (size_t)wid * XS;
            float ss = 0.0f;
            if (wid < T) {
                ss = stage_row(xd, x4 + (size_t)wid * K8, K8, lane);
            } else {
                for (int i = lane; i < K8; i += WARP_SIZE) xd[i] = zero;
            }
            rr = 1.0f / sqrtf(warp_sum(ss) / (float)K + a.eps);
        }
        if (a.norm_w) {
            cp_async_wait_all();
            __syncthreads();
            if (wid < T) {
                uint4 *xd = xs + (size_t)wid * XS;
                for (int i = lane; i < K8; i += WARP_SIZE) xd[i] = rmsnorm8(xd[i], nws[i], rr);
            }
        }
        __syncthreads();
    } else {
#pragma unroll
        for (int d = 0; d < D; d++) issue_x(xring[d], cpre[d]);
    }
    if (tr) tr[2] = gpu_time_ns();
    for (int base = 0; base < n_items; base += D + 1) {
#pragma unroll
        for (int r = 0; r <= D; r++) {
            if (base + r >= n_items) break;
            const int nx = (r + D) % (D + 1);
            const int c_next = ic; /* the chunk of item base + r + D */
            issue_w(ring[nx]);
            if (ii < n_iter) issue_x(xring[nx], c_next);
            advance();
            compute(ring[r], xring[r]);
        }
    }
    if (tr) tr[3] = gpu_time_ns();
}

/* sm_90 (cu->bulk; gemm_skinny_kernel is the portable path): a batched step's rows GEMM (2..16 rows) with the
 * weights brought into a shared-memory ring by the copy engine (cp.async.bulk, sm_90), so no
 * register holds a weight word in flight and each request is a row's 1 KiB run rather than 8
 * rows' 64 bytes. A producer warp fills the ring: a stage is 16 weight rows (SwiGLU: 8 gate rows
 * and their 8 up rows) x 512 k, a row's slice one bulk copy, the stages of a tile in k order,
 * the block's tiles by the grid stride; the ring's first R stages are requested before the
 * grid dependency wait (the weights do not depend on the previous kernel). The 8 consumer
 * warps take a stage's 8 64-wide chunks, one each, with the weights as the mma's B operand (two
 * n tiles of 8 rows) and the rows of x as A (m 16: T up to 16 in one mma; rows past T zero), in
 * skinny's permuted k order; at a tile's last stage the 8 warps' partials meet in shared memory
 * and warp 0 writes the tile with skinny's rounding. x: STAGED as skinny's (normalised, in
 * shared memory, a warp per row; up to 8 rows), else read from global a stage ahead (9..16
 * rows: normalised by cuda_rmsnorm first; staged, 16 rows leave room for one block an SM).
 * Run 247 (H100, 4B, ms a step against skinny / cuBLAS): B 2 3.667 -> 3.493, 4 3.739 -> 3.580,
 * 8 4.033 -> 3.933, 12 4.639 -> 4.214, 16 4.825 -> 4.490; ring depth 4 or 3 rather than the
 * most that fits: no better (run 248). */
#define BK_CW 8                 /* consumer warps */
#define BK_SK 512               /* k a stage: a row's 1 KiB */
#define BK_ROWS 16              /* weight rows a stage */
#define BK_RS (BK_SK * 2 + 64)  /* a staged row's bytes: the padding puts rows g, g + 1 4 words apart (no bank conflict) */
#define BK_STAGE (BK_ROWS * BK_RS)
#define BK_RMAX 8
template <bool T16, bool STAGED>
static __global__ void __launch_bounds__((BK_CW + 1) * WARP_SIZE, 2)
gemm_bulk_kernel(const struct skinny_args a, int R) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ __align__(128) unsigned char bsm[]; /* R stages, then STAGED: (T, K / 8 + SK_XPAD) x, (K / 8) norm weights */
    static_assert(!(T16 && STAGED), "x staged: up to 8 rows");
    constexpr int NE = T16 ? 4 : 2; /* accumulators a tile kept: rows g (and g + 8) */
    __shared__ float red[2][BK_CW][2 * NE][WARP_SIZE];
    __shared__ uint64_t full[BK_RMAX], empty[BK_RMAX];
    grid_launch_dependents();
    const int wid = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    const int N = a.N, K = a.K, T = a.T, swiglu = a.swiglu;
    const int n_tiles = swiglu ? (N + 7) / 8 : (N + 15) / 16;
    const int n_ks = (K + BK_SK - 1) / BK_SK;
    const int n_mine = (int)blockIdx.x < n_tiles ? (n_tiles - (int)blockIdx.x + (int)gridDim.x - 1) / (int)gridDim.x : 0;
    const int n_stages = n_mine * n_ks;
    if (threadIdx.x == 0) {
        for (int i = 0; i < R; i++) mbar_init(&full[i], 1), mbar_init(&empty[i], BK_CW);
        mbar_init_fence();
    }
    __syncthreads();
    if (wid == BK_CW) { /* the producer: lane r < 16 copies the stage's row r */
        for (int s = 0; s < n_stages; s++) {
            const int slot = s % R;
            if (s >= R) mbar_wait(&empty[slot], (s / R - 1) & 1);
            const int tile = (int)blockIdx.x + s / n_ks * (int)gridDim.x, k0 = s % n_ks * BK_SK;
            const int len = min(BK_SK, K - k0);
            int row;
            bool ok;
            if (swiglu) {
                const int j = tile * 8 + (lane & 7);
                ok = lane < BK_ROWS && j < N;
                row = lane < 8 ? j : N + j;
            } else {
                row = tile * 16 + lane;
                ok = lane < BK_ROWS && row < N;
            }
            const unsigned n_ok = __popc(__ballot_sync(FULL_MASK, ok));
            if (lane == 0) mbar_expect(&full[slot], n_ok * (unsigned)len * 2);
            __syncwarp();
            if (ok)
                bulk_load_stream(bsm + (size_t)slot * BK_STAGE + (size_t)lane * BK_RS, a.W + (size_t)row * K + k0,
                                 (uint32_t)len * 2, &full[slot]);
        }
        return;
    }
    const int g = lane >> 2, t = lane & 3;
    const int K8 = K / 8, XS = K8 + SK_XPAD;
    uint4 *xs = (uint4 *)(bsm + (size_t)R * BK_STAGE), *nws = xs + (size_t)T * XS;
    const uint4 *x4 = (const uint4 *)a.x;
    const uint4 zero = make_uint4(0, 0, 0, 0);
    unsigned long long *tr = a.trace && threadIdx.x == 0 ? a.trace + 4 * blockIdx.x : NULL;
    if (tr) tr[0] = gpu_time_ns();
    if (STAGED && a.norm_w) {
        for (int i = threadIdx.x; i < K8; i += BK_CW * WARP_SIZE)
            cp_async16(smem_addr(nws + i), (const uint4 *)a.norm_w + i, 16);
        cp_async_commit();
    }
    grid_dependency_wait();
    if (tr) tr[1] = gpu_time_ns();
    if (STAGED) { /* warp w stages row w (< T), as skinny's */
        uint4 *xd = xs + (size_t)wid * XS;
        const float ss = wid < T ? stage_row(xd, x4 + (size_t)wid * K8, K8, lane) : 0.0f;
        const float rr = 1.0f / sqrtf(warp_sum(ss) / (float)K + a.eps);
        if (a.norm_w) {
            cp_async_wait_all();
            named_sync(1, BK_CW * WARP_SIZE);
            if (wid < T)
                for (int i = lane; i < K8; i += WARP_SIZE) xd[i] = rmsnorm8(xd[i], nws[i], rr);
        }
        named_sync(1, BK_CW * WARP_SIZE);
    }
    if (tr) tr[2] = gpu_time_ns();
    /* x's words of global chunk c: rows g (xw[0..1]) and g + 8 (xw[2..3]), words t, t + 4 */
    auto x_words = [&](int c, uint4 (&xw)[4]) {
        const size_t o = (size_t)c * 8 + t;
        if (STAGED) {
            const bool ok0 = g < T, ok1 = T16 && g + 8 < T;
            xw[0] = ok0 ? xs[(size_t)g * XS + o] : zero;
            xw[1] = ok0 ? xs[(size_t)g * XS + o + 4] : zero;
            xw[2] = ok1 ? xs[(size_t)(g + 8) * XS + o] : zero;
            xw[3] = ok1 ? xs[(size_t)(g + 8) * XS + o + 4] : zero;
        } else {
            const bool ok0 = g < T, ok1 = T16 && g + 8 < T;
            xw[0] = ok0 ? __ldg(x4 + (size_t)g * K8 + o) : zero;
            xw[1] = ok0 ? __ldg(x4 + (size_t)g * K8 + o + 4) : zero;
            xw[2] = ok1 ? __ldg(x4 + (size_t)(g + 8) * K8 + o) : zero;
            xw[3] = ok1 ? __ldg(x4 + (size_t)(g + 8) * K8 + o + 4) : zero;
        }
    };
    float acc[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
    uint4 xn[4] = {zero, zero, zero, zero};
    if (!STAGED && n_stages > 0 && wid * 64 < min(BK_SK, K)) x_words(wid, xn);
    for (int s = 0; s < n_stages; s++) {
        const int slot = s % R, ks = s % n_ks, k0 = ks * BK_SK, len = min(BK_SK, K - k0);
        const bool mine = wid * 64 < len;
        uint4 xw[4];
        if (STAGED) {
            if (mine) x_words(k0 / 64 + wid, xw);
        } else {
#pragma unroll
            for (int q = 0; q < 4; q++) xw[q] = xn[q];
            if (s + 1 < n_stages) {
                const int k1 = (s + 1) % n_ks * BK_SK;
                if (wid * 64 < min(BK_SK, K - k1)) x_words(k1 / 64 + wid, xn);
            }
        }
        mbar_wait(&full[slot], (s / R) & 1);
        if (mine) {
            const unsigned char *st = bsm + (size_t)slot * BK_STAGE + wid * 128 + t * 16;
#pragma unroll
            for (int j = 0; j < 2; j++) {
                const uint4 w0 = *(const uint4 *)(st + (size_t)(j * 8 + g) * BK_RS);
                const uint4 w1 = *(const uint4 *)(st + (size_t)(j * 8 + g) * BK_RS + 64);
                const uint32_t a0[4] = {xw[0].x, xw[2].x, xw[0].y, xw[2].y}, a1[4] = {xw[0].z, xw[2].z, xw[0].w, xw[2].w};
                const uint32_t a2[4] = {xw[1].x, xw[3].x, xw[1].y, xw[3].y}, a3[4] = {xw[1].z, xw[3].z, xw[1].w, xw[3].w};
                mma_bf16(acc[j], a0, w0.x, w0.y);
                mma_bf16(acc[j], a1, w0.z, w0.w);
                mma_bf16(acc[j], a2, w1.x, w1.y);
                mma_bf16(acc[j], a3, w1.z, w1.w);
            }
        }
        __syncwarp();
        if (lane == 0) mbar_arrive(&empty[slot]);
        if (ks < n_ks - 1) continue;
        /* the tile's last stage: the partials meet, warp 0 writes */
        const int buf = s / n_ks & 1, tile = (int)blockIdx.x + s / n_ks * (int)gridDim.x;
#pragma unroll
        for (int j = 0; j < 2; j++)
#pragma unroll
            for (int e = 0; e < NE; e++) red[buf][wid][j * NE + e][lane] = acc[j][e];
        named_sync(1, BK_CW * WARP_SIZE);
        if (wid == 0) {
            float v[2][4];
#pragma unroll
            for (int j = 0; j < 2; j++)
#pragma unroll
                for (int e = 0; e < NE; e++) {
                    float sum = 0.0f;
#pragma unroll
                    for (int w = 0; w < BK_CW; w++) sum += red[buf][w][j * NE + e][lane];
                    v[j][e] = sum;
                }
#pragma unroll
            for (int h = 0; h < (T16 ? 2 : 1); h++) {
                const int n = g + 8 * h;
                if (n >= T) continue;
                uint16_t *o = a.out + (size_t)n * N;
#pragma unroll
                for (int q = 0; q < 2; q++) {
                    if (swiglu) {
                        const int r = tile * 8 + 2 * t + q;
                        if (r < N) o[r] = f2bf(bfr(silu_f(bfr(v[0][2 * h + q]))) * bfr(v[1][2 * h + q]));
                    } else {
#pragma unroll
                        for (int j = 0; j < 2; j++) {
                            const int r = tile * 16 + j * 8 + 2 * t + q;
                            const float m = bfr(v[j][2 * h + q]);
                            if (r < N) o[r] = f2bf(a.accumulate ? bf2f(o[r]) + m : m);
                        }
                    }
                }
            }
        }
#pragma unroll
        for (int j = 0; j < 2; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
    }
    if (tr) tr[3] = gpu_time_ns();
#else
    (void)a, (void)R;
    __trap();
#endif
}

/* Runs 168-172 (4B, cuBLAS with the norm as its own kernel, no programmatic dependent launch):
 * each GEMM alone (weights past L2), at 3..8 rows this kernel beat cuBLAS + the add / SwiGLU
 * kernels at every shape (N 2,560: 10-17 us against 23-25; in_proj, gate_up, lm_head by 3-8%).
 * Twenty-fourth session (bench/RESULTS.md): programmatic dependent launch took a step of 4 from
 * 3.423 to 3.300 ms, the norm staged in the kernel to 3.056; two rows here rather than a two-row
 * GEMV on CUDA cores, 2.97 against 3.21 ms. Not kept: 9..16 rows as two n tiles (a step of 16
 * 5.10 ms against cuBLAS's 4.27; runs 222-223, x staged by cp.async, 2 blocks an SM: 5.04 against
 * 4.16, and 4.55 against 4.17 for the normed GEMMs alone), x staged by cp.async at 2..8 rows (run
 * 212: no change), 3 or 4 items in flight (3.09 / 3.28 ms), and a stream-K split
 * of the steps over all blocks (3.32 ms). Nor other loads of the weights (runs 230-231, H100, a
 * step of 4 3.79 ms): each instruction 4 whole 128-byte rows, remapped to the fragments by
 * shuffles (3.92), .cg (3.88), .lu (3.84), .nc with L1::no_allocate (3.84), an L2 prefetch 2 / 4
 * / 8 items ahead (3.80 / 3.96 / 4.12); nor .L2::256B (run 229, H200, 2.95 -> 3.08). Nor (runs
 * 233 / 235, H200) the partials handed over by named barriers with a rotating reducer instead of
 * the block barrier (3.14 -> 3.29), S = 4 (3.48) or 1 (5.64), or the first unit's next 3 / 8
 * chunks requested into L2 before the wait (2.951 -> 2.952 / 3.006). */
extern "C" int cuda_gemm_rows_ok(const struct cuda *cu, int T, int K) {
    return T >= 2 && T <= (cu->bulk ? 16 : 8) && K % 64 == 0;
}

/* the staged kernel's shared memory: 8 rows of x with their padding, the norm's weights */
static size_t skinny_smem(int K) { return ((size_t)8 * (K / 8 + SK_XPAD) + K / 8) * 16; }
#define SK_STAGED_MAX (96 * 1024) /* two blocks an SM (27B's hidden size 5,120: 92 KiB) */

template <bool STAGED>
static void launch_skinny(struct cuda *cu, const struct skinny_args &a) {
    auto kern = gemm_skinny_kernel<2, STAGED>;
    const size_t smem = STAGED ? skinny_smem(a.K) : 0;
    static size_t opted, occ_smem; /* per instance: the largest size asked for; occ's size */
    static int occ;
    if (smem && opted < smem) { /* with the static partials' buffer, past 48 KiB from ~40 KiB */
        GPU_SMEM_OPTIN(kern, smem);
        opted = smem;
    }
    if (!occ || occ_smem != smem) {
        occ = gpu_occupancy(kern, SK_WARPS * WARP_SIZE, smem);
        if (occ < 1) occ = 1;
        occ_smem = smem;
    }
    const long n_tiles = a.swiglu ? (a.N + 7) / 8 : (a.N + 15) / 16, slots = (long)occ * cu->info.n_sm;
    const long groups = (n_tiles + SK_WARPS / a.S - 1) / (SK_WARPS / a.S);
    const long blocks = groups < slots ? groups : slots;
    struct skinny_args at = a; /* traced: flags 8 (a rows GEMM), its rows in place of the GEMV's threads */
    at.trace = trace_job(cu, a.N, a.K, (STAGED || a.norm_w ? 1 : 0) | (a.accumulate ? 2 : 0) |
                                           (a.swiglu ? 4 : 0) | 8 | (a.T << 4), (int)blocks);
    gpu_launch(cu->pdl, kern, dim3((unsigned)blocks), dim3(SK_WARPS * WARP_SIZE), smem, cu->stream, at);
    GPU_LAUNCHED();
    cu->n_launches++;
}

/* the bulk kernel's staged x: T rows with their padding, the norm's weights */
static size_t bulk_x_smem(int T, int K) { return ((size_t)T * (K / 8 + SK_XPAD) + K / 8) * 16; }
#define BK_X_MAX (96 * 1024)

template <bool T16, bool STAGED>
static void launch_bulk(struct cuda *cu, const struct skinny_args &a) {
    auto kern = gemm_bulk_kernel<T16, STAGED>;
    const size_t xb = STAGED ? bulk_x_smem(a.T, a.K) : 0;
    static size_t opted;
    static size_t last_xb = (size_t)-1;
    static int last_R, last_occ;
    if (last_xb != xb) { /* the ring: the most stages with 2 blocks an SM, at least 3; else 1 block */
        int R = 0, occ = 0;
        const size_t fixed = gpu_kernel_static_smem(kern);
        for (int want = 2; want >= 1 && !R; want--) /* 2 blocks: at least 3 stages */
            for (int r = BK_RMAX; r >= (want == 2 ? 3 : 2) && !R; r--) {
                const size_t smem = (size_t)r * BK_STAGE + xb;
                if (smem + fixed > (size_t)cu->info.smem_optin) continue;
                if (opted < smem) {
                    GPU_SMEM_OPTIN(kern, smem);
                    opted = smem;
                }
                if (gpu_occupancy(kern, (BK_CW + 1) * WARP_SIZE, smem) >= want) R = r, occ = want;
            }
        CHECK(R);
        last_xb = xb, last_R = R, last_occ = occ;
    }
    const int R = last_R;
    const size_t smem = (size_t)R * BK_STAGE + xb;
    const long n_tiles = a.swiglu ? (a.N + 7) / 8 : (a.N + 15) / 16, slots = (long)last_occ * cu->info.n_sm;
    const long blocks = n_tiles < slots ? n_tiles : slots;
    struct skinny_args at = a;
    at.trace = trace_job(cu, a.N, a.K, (STAGED || a.norm_w ? 1 : 0) | (a.accumulate ? 2 : 0) |
                                           (a.swiglu ? 4 : 0) | 8 | (a.T << 4), (int)blocks);
    gpu_launch(cu->pdl, kern, dim3((unsigned)blocks), dim3((BK_CW + 1) * WARP_SIZE), smem, cu->stream, at, R);
    GPU_LAUNCHED();
    cu->n_launches++;
}

extern "C" void cuda_gemm_rows(struct cuda *cu, uint16_t *out, const uint16_t *x, const uint16_t *norm_w,
                               const uint16_t *W, int T, int N, int K, float eps, int accumulate, int swiglu) {
    CHECK(cuda_gemm_rows_ok(cu, T, K));
    if (cu->bulk) {
        struct skinny_args b = {out, x, norm_w, W, N, K, T, accumulate, swiglu, 1, eps, NULL};
        const bool staged = norm_w && T <= 8 && bulk_x_smem(T, K) <= BK_X_MAX;
        if (norm_w && !staged) {
            CHECK((size_t)T * K <= cu->xn_elems);
            cuda_rmsnorm(cu, cu->xn, x, norm_w, T, K, eps);
            b.x = cu->xn;
            b.norm_w = NULL;
        }
        if (T > 8) launch_bulk<true, false>(cu, b);
        else staged ? launch_bulk<false, true>(cu, b) : launch_bulk<false, false>(cu, b);
        return;
    }
    int S = SK_WARPS; /* the largest split (run 170: S = 8 as fast or faster at every 4B shape) */
    while ((K / 64) % S) S /= 2;
    struct skinny_args a = {out, x, norm_w, W, N, K, T, accumulate, swiglu, S, eps, NULL};
    if (norm_w && skinny_smem(K) <= SK_STAGED_MAX) {
        launch_skinny<true>(cu, a);
        return;
    }
    if (norm_w) { /* x normalised by its own kernel (a hidden size past ~5,800) */
        CHECK((size_t)T * K <= cu->xn_elems);
        cuda_rmsnorm(cu, cu->xn, x, norm_w, T, K, eps);
        a.x = cu->xn;
        a.norm_w = NULL;
    }
    launch_skinny<false>(cu, a);
}

/* Row buckets: T itself up to 16 (a batched step's rows), then 16 buckets or fewer per doubling,
 * so an algorithm chosen for the bucket's top is at most ~1/16 off the T it runs. */
extern "C" int cuda_gemm_bucket(int T) {
    if (T <= 16) return T;
    const int step = T <= 256 ? 16 : T <= 512 ? 32 : T <= 1024 ? 64 : T <= 2048 ? 128
                   : T <= 4096 ? 256 : 512;
    return (T + step - 1) / step * step;
}

static unsigned ptr_align(const void *a, const void *b, const void *c) {
    const uintptr_t bits = (uintptr_t)a | (uintptr_t)b | (uintptr_t)c | 256;
    return (unsigned)(bits & (~bits + 1));
}

/* The plan of (N, K, m, align), made on first use; NULL when the table is full. */
static struct cuda_gemm_plan *gemm_plan(struct cuda *cu, int N, int K, int m, unsigned align) {
    if (!cu->gemm_plans)
        cu->gemm_plans = (struct cuda_gemm_plan *)xcalloc(CUDA_GEMM_PLANS, sizeof *cu->gemm_plans);
    unsigned h = (unsigned)N * 2654435761u ^ (unsigned)K * 40503u ^ (unsigned)m * 2246822519u ^ align;
    for (int probe = 0; probe < CUDA_GEMM_PLANS; probe++) {
        struct cuda_gemm_plan *p = &cu->gemm_plans[(h + (unsigned)probe) % CUDA_GEMM_PLANS];
        if (p->state && p->N == N && p->K == K && p->m == m && p->align == align) return p;
        if (p->state) continue;
        if (4 * (cu->n_gemm_plans + 1) > 3 * CUDA_GEMM_PLANS) return NULL; /* keep probes short */
        p->N = N, p->K = K, p->m = m, p->align = align;
        p->state = gpu_gemm_pick(cu->blas, &p->algo, m > 0 ? m : -m, N, K, align, cu->blas_ws_bytes) ? 1 : 2;
        cu->gemm_picks++;
        cu->n_gemm_plans++;
        return p;
    }
    return NULL;
}

static int gemm_with(struct cuda *cu, const struct cuda_gemm_plan *p, uint16_t *out,
                     const uint16_t *x, const uint16_t *W, int T, int N, int K) {
    return p && p->state == 1 ? gpu_gemm_run(cu->blas, &p->algo, out, x, W, T, N, K, cu->blas_ws,
                                             cu->blas_ws_bytes, cu->stream)
                              : -1;
}

/* cuBLAS GEMM: out (T, N) = x (T, K) W^T, W (N, K). FLOPs: 2 T N K. */
extern "C" void cuda_gemm(struct cuda *cu, uint16_t *out, const uint16_t *x, const uint16_t *W,
                          int T, int N, int K) {
    const unsigned align = ptr_align(out, x, W);
    int i = 0;
    while (i < cu->n_gemm_shapes && !(cu->gemm_shapes[i].N == N && cu->gemm_shapes[i].K == K &&
                                      cu->gemm_shapes[i].align == align))
        i++;
    if (i == cu->n_gemm_shapes && i < CUDA_GEMM_SHAPES)
        cu->gemm_shapes[cu->n_gemm_shapes++] = (struct cuda_gemm_shape){N, K, T, align, W};
    else if (i < cu->n_gemm_shapes && T > cu->gemm_shapes[i].max_T)
        cu->gemm_shapes[i].max_T = T;
    if (gemm_with(cu, gemm_plan(cu, N, K, cuda_gemm_bucket(T), align), out, x, W, T, N, K) != 0) {
        /* the bucket's algorithm does not take this T (or the table is full): T's own */
        struct cuda_gemm_plan *p = gemm_plan(cu, N, K, -T, align), fresh;
        if (!p) {
            fresh.state = gpu_gemm_pick(cu->blas, &fresh.algo, T, N, K, align, cu->blas_ws_bytes) ? 1 : 2;
            cu->gemm_picks++;
            p = &fresh;
        }
        CHECK(gemm_with(cu, p, out, x, W, T, N, K) == 0);
    }
    cu->n_launches++;
}

extern "C" void cuda_gemm_warm(struct cuda *cu, int max_T) {
    CHECK(!cu->capturing);
    for (int i = 0; i < cu->n_gemm_shapes; i++) {
        const struct cuda_gemm_shape *sh = &cu->gemm_shapes[i];
        const int top = sh->max_T > 16 ? max_T : sh->max_T;
        for (int m = 1; m <= top; m = cuda_gemm_bucket(m + 1)) {
            if ((size_t)m * sh->N > cu->y_elems || (size_t)m * sh->K > cu->xn_elems) break;
            /* on the scratch (its contents do not matter), with these weights: loads the kernel */
            (void)gemm_with(cu, gemm_plan(cu, sh->N, sh->K, m, sh->align), cu->y, cu->xn,
                            (const uint16_t *)sh->W, m, sh->N, sh->K);
        }
    }
    gpu_stream_sync(cu->stream);
}
