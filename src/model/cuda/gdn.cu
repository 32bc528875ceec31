/* gdn.cu - the Gated DeltaNet mixer after its projections (qwen35-model.md 3.5, 4.1, 4.3), as
 * cpu.c's cpu_gdn: causal depthwise conv over the raw qkv channels with the cached window, SiLU,
 * L2-normalised q (times dk^-0.5) and k, beta = bf16(sigmoid(b)), g = -exp(A_log) softplus(a +
 * dt_bias), the fp32 delta rule on the (Hv, dk, dv) state, and the gated RMSNorm.
 *
 * The state's value columns are independent (u_j, delta_j and o_j only involve column j), so the
 * work splits over (value head, 16-column slice) blocks. Inside a block, each warp owns 4 columns
 * and 8 lanes share a column, each holding dk / 8 of its rows in registers: a step's two
 * reductions over dk are 3 shuffles each, with no block barrier.
 *
 * The conv state is a ring (backend.h): column q % 4 holds the raw input of position q.
 *
 * Decode: one kernel per layer whose blocks never wait for each other. Each block recomputes the
 * conv of its key head's q/k channels (cheap) and its own 16 value channels, and writes o as
 * bf16 and silu(z) as fp32; the gated RMSNorm is applied by the out_proj GEMV as it stages its
 * input. In a model's decode step the in_proj GEMV instead computes z last (and silu(z) with it)
 * and counts its other rows done: the step starts on that count, while z streams
 * (cuda_gemv_early).
 * Prefill: conv+norms+gates for every token in parallel, the conv state update, a scan over the
 * tokens per block with the state in registers, then the gated RMSNorm. */
#include "kernels.h"

#define GDN_COLS 16     /* value columns per block (prefill scan) */
#define GDN_THREADS 128 /* 4 warps x 4 columns x 8 lanes (scan); the step: 8 or 4 lanes */

#define GDN_CHUNK 32    /* tokens staged in shared memory per scan round */

static __device__ __forceinline__ float softplus_f(float u) { return u > 20.0f ? u : log1pf(expf(u)); }

/* two sums over the 128 threads at once (warp sums, then the 4 warps in order); red: 8 floats */
static __device__ __forceinline__ void block_sum128x2(float &a, float &b, float *red) {
    const int wid = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    a = warp_sum(a);
    b = warp_sum(b);
    __syncthreads();
    if (lane == 0) {
        red[wid] = a;
        red[4 + wid] = b;
    }
    __syncthreads();
    a = red[0] + red[1] + red[2] + red[3];
    b = red[4] + red[5] + red[6] + red[7];
}

/* One delta-rule step for this thread's column: S (NR rows held here, rows rg + LPC m) <- decayed
 * and updated; returns o_j (valid in every lane of the column's LPC-lane group). */
template <int NR, int LPC>
static __device__ __forceinline__ float delta_step(float (&S)[NR], const float *k, const float *q,
                                                   float dec, float beta, float vj, int rg) {
    float u = 0.0f;
#pragma unroll
    for (int m = 0; m < NR; m++) {
        S[m] *= dec;                   /* S <- exp(g) S */
        u += S[m] * k[rg + LPC * m];   /* u = S^T k */
    }
    u = group_sum(u, LPC);
    const float delta = beta * (vj - u);
    float o = 0.0f;
#pragma unroll
    for (int m = 0; m < NR; m++) {
        S[m] = S[m] + k[rg + LPC * m] * delta; /* S += k delta^T */
        o += S[m] * q[rg + LPC * m];           /* o = S^T q */
    }
    return group_sum(o, LPC);
}

/* ---- decode --------------------------------------------------------------------------------
 * No block waits for another: the conv state is a ring (column q % 4 holds position q), so the
 * one block that writes the q/k channels' new column (the key head's first) never touches the
 * columns the others read, and the gated RMSNorm runs in the out_proj GEMV's staging of its
 * input (cuda_gemv_gated), which reads this kernel's bf16 o and silu(z).
 * With cnt, the inputs are read once the in_proj's blocks have counted their early rows
 * (cnt[0] == target); the kernel then completes only after the in_proj (which writes silu(z)),
 * and its last block sets both counts back to zero (cnt[1] counts the blocks done: every block
 * is past its wait then, and the in_proj counts no more). The next step of this layer counts
 * only after that: its in_proj counts after its own wait, i.e. after this kernel completed.
 * The fp32 state is read and written with an L2 evict-last policy (load_keep / store_keep):
 * the weights stream through L2 marked evict-first, so the state (4B / 9B: 48 MiB, 0.8B: 18
 * MiB) tends to stay there from one step to the next instead of going to DRAM and back (runs
 * 118, 120: tg128 4B +1.7%, 9B +1.9%, 0.8B +0.5%).
 * Bytes: 8 Hv dk dv (state read + written; mostly L2) + ~2 (conv_dim + value_dim) * 5 (conv
 * window, x, o); FLOPs: ~6 Hv dk dv. */
template <int NR, int LPC>
static __global__ void __launch_bounds__(GDN_THREADS, LPC == 4 ? 5 : 1)
gdn_step_kernel(uint16_t *obuf, float *sz, const uint16_t *proj, uint16_t *conv_state,
                const uint16_t *conv_w, const float *A_log, const float *dt_bias, float *state,
                const int32_t *pos, int Hk, int Hv, int dv, int *cnt, int target,
                unsigned long long *tr) {
    constexpr int STEP_COLS = GDN_THREADS / LPC; /* value columns per block */
    const int dk = NR * LPC;
    __shared__ float sq[NR * LPC], sk[NR * LPC], sv[STEP_COLS], red[8];
    __shared__ float sbeta, sdec;
    const int v = blockIdx.x, col0 = blockIdx.y * STEP_COLS;
    const int r = Hv / Hk, kh = v / r;
    const int key_dim = Hk * dk, conv_dim = 2 * key_dim + Hv * dv, value_dim = Hv * dv;
    const int tid = threadIdx.x;

    /* 0. before the wait (programmatic dependent launch): everything that does not depend on
     * the in_proj GEMV before this kernel. This thread's state column, the conv taps over the
     * cached window (acc = w0 s1 + w1 s2 + w2 s3, the w3 x term added once x is there, so the
     * sum is formed in the same order as before), the gate constants. */
    grid_launch_dependents();
    ktrace_stamp(tr, 0);
    const int wid = tid / WARP_SIZE, lane = tid % WARP_SIZE, c = lane / LPC, rg = lane % LPC;
    const int cl = wid * (WARP_SIZE / LPC) + c, col = col0 + cl;
    float *Sg = state + (size_t)v * dk * dv + col;
    float S[NR];
#pragma unroll
    for (int m = 0; m < NR; m++) S[m] = load_keep(Sg + (size_t)(rg + LPC * m) * dv);
    const int p = *pos; /* uploaded before the step */
    const int c1 = (p + 1) & 3, c2 = (p + 2) & 3, c3 = (p + 3) & 3, cnew = p & 3; /* p-3, p-2, p-1, p */
    const bool qk_writer = v % r == 0 && blockIdx.y == 0;

    constexpr int QIT = (NR * LPC + GDN_THREADS - 1) / GDN_THREADS;
    float qy[QIT], ky[QIT], w3[2][QIT];
#pragma unroll
    for (int it = 0; it < QIT; it++) {
        int i = tid + it * GDN_THREADS;
        qy[it] = ky[it] = w3[0][it] = w3[1][it] = 0.0f;
        if (i >= dk) continue;
#pragma unroll
        for (int part = 0; part < 2; part++) {
            int ch = part * key_dim + kh * dk + i;
            const uint16_t *st = conv_state + (size_t)ch * 4;
            const uint16_t *w = conv_w + (size_t)ch * 4;
            float acc = 0.0f;
            acc += bf2f(w[0]) * bf2f(st[c1]);
            acc += bf2f(w[1]) * bf2f(st[c2]);
            acc += bf2f(w[2]) * bf2f(st[c3]);
            w3[part][it] = bf2f(w[3]);
            if (part == 0) qy[it] = acc; else ky[it] = acc;
        }
    }
    float vacc = 0.0f, vw3 = 0.0f;
    if (tid < STEP_COLS) {
        int ch = 2 * key_dim + v * dv + col0 + tid;
        const uint16_t *st = conv_state + (size_t)ch * 4;
        const uint16_t *w = conv_w + (size_t)ch * 4;
        vacc += bf2f(w[0]) * bf2f(st[c1]);
        vacc += bf2f(w[1]) * bf2f(st[c2]);
        vacc += bf2f(w[2]) * bf2f(st[c3]);
        vw3 = bf2f(w[3]);
    }
    const float gA = tid == 0 ? -expf(A_log[v]) : 0.0f, gdt = tid == 0 ? dt_bias[v] : 0.0f;
    {
        /* blocks that start only when the GEMV's blocks leave (more than fit beside them) find
         * their state and conv window in L2: each block asks for those of the block half a grid
         * away */
        const int nb = gridDim.x * gridDim.y, self = blockIdx.y * gridDim.x + blockIdx.x;
        const int other = (self + nb / 2) % nb, ov = other % gridDim.x, oc0 = other / gridDim.x * STEP_COLS;
        const int okh = ov / r, lines = dk / 16; /* 128-byte lines of dk channels' 4-tap rows */
        if (tid < dk) prefetch_l2(state + ((size_t)ov * dk + tid) * dv + oc0);
        constexpr int vlines = STEP_COLS * 8 / 128; /* the value channels' 4-tap rows */
        if (tid < 4 * lines) { /* q and k: window, weights */
            const int part = tid / lines % 2, ln = tid % lines;
            const uint16_t *base = tid < 2 * lines ? conv_state : conv_w;
            prefetch_l2(base + (size_t)(part * key_dim + okh * dk) * 4 + ln * 64);
        } else if (tid < 4 * lines + 2 * vlines) { /* the value channels: window, weights */
            const int j = tid - 4 * lines;
            const uint16_t *base = j < vlines ? conv_state : conv_w;
            prefetch_l2(base + (size_t)(2 * key_dim + ov * dv + oc0) * 4 + (j % vlines) * 64);
        }
    }
    if (cnt) { /* the in_proj's rows but z written (cuda_gemv_early) */
        if (tid == 0) wait_count(cnt, target);
        __syncthreads();
    } else {
        grid_dependency_wait();
    }
    ktrace_stamp(tr, 1);

    /* 1. every input from the in_proj GEMV at once: one L2 round trip. (Loaded where they are
     * used, they were four in a row: a load may not move above the conv ring's stores, which
     * could alias proj, nor across SiLU's division branch.) */
    uint16_t xqk[2][QIT];
#pragma unroll
    for (int it = 0; it < QIT; it++) {
        const int i = tid + it * GDN_THREADS;
#pragma unroll
        for (int part = 0; part < 2; part++)
            xqk[part][it] = i < dk ? load_coherent_u16(proj + part * key_dim + kh * dk + i) : 0;
    }
    const int vch = v * dv + col0 + tid; /* this thread's value channel (tid < STEP_COLS) */
    const uint16_t xv = tid < STEP_COLS ? load_coherent_u16(proj + 2 * key_dim + vch) : 0;
    const uint16_t xz = tid < STEP_COLS && !cnt ? load_coherent_u16(proj + conv_dim + vch) : 0;
    const uint16_t xb = tid == 0 ? load_coherent_u16(proj + conv_dim + value_dim + v) : 0;
    const uint16_t xa = tid == 0 ? load_coherent_u16(proj + conv_dim + value_dim + Hv + v) : 0;

    /* 2. conv + SiLU of the key head's q and k channels (window [s1 s2 s3 x]), L2 norms; the
     * key head's first block puts x in the ring */
    float ssq = 0.0f, ssk = 0.0f;
#pragma unroll
    for (int it = 0; it < QIT; it++) {
        int i = tid + it * GDN_THREADS;
        if (i >= dk) continue;
#pragma unroll
        for (int part = 0; part < 2; part++) {
            int ch = part * key_dim + kh * dk + i;
            float acc = part == 0 ? qy[it] : ky[it];
            const uint16_t x = xqk[part][it];
            if (qk_writer) conv_state[(size_t)ch * 4 + cnew] = x;
            acc += w3[part][it] * bf2f(x);
            float y = bfr(silu_f(bfr(acc)));
            if (part == 0) {
                qy[it] = y;
                ssq += y * y;
            } else {
                ky[it] = y;
                ssk += y * y;
            }
        }
    }
    /* 3. this block's value channels (owned by this block alone), and (unless the in_proj
     * wrote it: cnt) silu(z) of its columns for the gated norm in the out_proj GEMV */
    if (tid < STEP_COLS) {
        if (!cnt) sz[vch] = silu_f(bf2f(xz)); /* HF: silu(z) */
        conv_state[(size_t)(2 * key_dim + vch) * 4 + cnew] = xv;
        float acc = vacc;
        acc += vw3 * bf2f(xv);
        sv[tid] = bfr(silu_f(bfr(acc)));
    }
    /* 4. gates */
    if (tid == 0) {
        float b = bf2f(xb), a = bf2f(xa);
        sbeta = bfr(sigmoid_f(b)); /* HF: b.sigmoid() in bf16 */
        float g = gA * softplus_f(a + gdt);
        sdec = expf(g);
    }
    block_sum128x2(ssq, ssk, red); /* its barriers also publish sv and the gates */
    const float inv_q = 1.0f / sqrtf(ssq + 1e-6f), inv_k = 1.0f / sqrtf(ssk + 1e-6f);
    const float qscale = 1.0f / sqrtf((float)dk);
#pragma unroll
    for (int it = 0; it < QIT; it++) {
        int i = tid + it * GDN_THREADS;
        if (i < dk) {
            sq[i] = qy[it] * inv_q * qscale;
            sk[i] = ky[it] * inv_k;
        }
    }
    __syncthreads();
    ktrace_stamp(tr, 2);

    /* 5. the delta rule on this thread's column; o to the out_proj GEMV as bf16 (the norm
     * rounds it so), the state back */
    float o = delta_step<NR, LPC>(S, sk, sq, sdec, sbeta, sv[cl], rg);
    if (rg == 0) obuf[(size_t)v * dv + col] = f2bf(o);
    ktrace_stamp(tr, 3);
#pragma unroll
    for (int m = 0; m < NR; m++) store_keep(Sg + (size_t)(rg + LPC * m) * dv, S[m]);
    if (cnt) { /* complete only after the in_proj (its z rows), and leave both counts at zero */
        grid_dependency_wait();
        if (tid == 0 && atomicAdd(cnt + 1, 1) == (int)(gridDim.x * gridDim.y) - 1) cnt[0] = cnt[1] = 0;
    }
}

/* ---- prefill -------------------------------------------------------------------------------- */

/* Conv + SiLU for token t and one dk-wide head of channels (blockIdx.x < conv_dim / dk), then
 * for q/k heads the L2 norm; the extra block row blockIdx.x == conv_dim / dk computes beta and g.
 * Bytes: ~2 T conv_dim (x) * 4 (window) + 4 T (2 key_dim) + 2 T value_dim; FLOPs: ~12 T conv_dim. */
static __global__ void gdn_conv_kernel(uint16_t *ybuf, float *qk, float *bg, const uint16_t *proj,
                                       const uint16_t *conv_state, const uint16_t *conv_w,
                                       const float *A_log, const float *dt_bias, const int32_t *pos,
                                       int Hk, int Hv, int dk, int conv_dim, int value_dim) {
    __shared__ float red[32];
    const int t = blockIdx.y, hb = blockIdx.x, tid = threadIdx.x;
    const size_t row = (size_t)conv_dim + value_dim + 2 * Hv;
    const uint16_t *x = proj + t * row;
    if (hb == conv_dim / dk) {
        for (int v = tid; v < Hv; v += blockDim.x) {
            float b = bf2f(x[conv_dim + value_dim + v]), a = bf2f(x[conv_dim + value_dim + Hv + v]);
            bg[((size_t)t * Hv + v) * 2] = bfr(sigmoid_f(b));
            bg[((size_t)t * Hv + v) * 2 + 1] = -expf(A_log[v]) * softplus_f(a + dt_bias[v]);
        }
        return;
    }
    const int ch = hb * dk + tid; /* blockDim.x == dk */
    const uint16_t *w = conv_w + (size_t)ch * 4;
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        int s = t - 3 + j; /* sequence index of this tap's input; < 0: from the ring */
        float e = s >= 0 ? bf2f(proj[(size_t)s * row + ch]) : bf2f(conv_state[(size_t)ch * 4 + ((*pos + s) & 3)]);
        acc += bf2f(w[j]) * e;
    }
    const float y = bfr(silu_f(bfr(acc)));
    if (hb >= 2 * Hk) {
        ybuf[(size_t)t * conv_dim + ch] = f2bf(y);
        return;
    }
    float ss = warp_sum(y * y);
    const int wid = tid / WARP_SIZE, lane = tid % WARP_SIZE;
    if (lane == 0) red[wid] = ss;
    __syncthreads();
    ss = 0.0f;
    for (int i = 0; i < (int)(blockDim.x / WARP_SIZE); i++) ss += red[i];
    const float inv = 1.0f / sqrtf(ss + 1e-6f);
    const float scale = hb < Hk ? 1.0f / sqrtf((float)dk) : 1.0f;
    qk[((size_t)t * 2 * Hk + hb) * dk + tid] = y * inv * scale;
}

/* The ring after the prompt: the last (up to) 4 raw inputs into their columns. Bytes: ~4 conv_dim. */
static __global__ void gdn_conv_state_kernel(uint16_t *conv_state, const uint16_t *proj,
                                             const int32_t *pos, int T, int conv_dim, size_t row) {
    int ch = blockIdx.x * blockDim.x + threadIdx.x;
    if (ch >= conv_dim) return;
    uint16_t *st = conv_state + (size_t)ch * 4;
    for (int s = T > 4 ? T - 4 : 0; s < T; s++) st[(*pos + s) & 3] = proj[(size_t)s * row + ch];
}

/* The delta rule over T tokens: block (value head, 16-column slice), state in registers, tokens
 * staged GDN_CHUNK at a time. Bytes: 8 Hv dk dv + T (8 Hk dk (from L2, per block) + 2 value_dim);
 * FLOPs: ~6 T Hv dk dv. */
template <int NR>
static __global__ void __launch_bounds__(GDN_THREADS)
gdn_scan_kernel(uint16_t *o_out, float *state, const float *qk, const uint16_t *ybuf,
                const float *bg, int T, int Hk, int Hv, int dv, int conv_dim) {
    const int dk = NR * 8;
    __shared__ float sq[GDN_CHUNK][NR * 8], sk[GDN_CHUNK][NR * 8];
    __shared__ float sv[GDN_CHUNK][GDN_COLS], sb[GDN_CHUNK], sd[GDN_CHUNK];
    const int v = blockIdx.x, col0 = blockIdx.y * GDN_COLS, kh = v / (Hv / Hk);
    const int tid = threadIdx.x, wid = tid / WARP_SIZE, lane = tid % WARP_SIZE;
    const int c = lane / 8, rg = lane % 8, cl = wid * 4 + c, col = col0 + cl;
    const int key_dim = Hk * dk;
    float *Sg = state + (size_t)v * dk * dv + col;
    float S[NR];
#pragma unroll
    for (int m = 0; m < NR; m++) S[m] = Sg[(size_t)(rg + 8 * m) * dv];
    for (int t0 = 0; t0 < T; t0 += GDN_CHUNK) {
        const int n = min(GDN_CHUNK, T - t0);
        __syncthreads();
        for (int i = tid; i < n * dk; i += GDN_THREADS) {
            int tt = i / dk, d = i % dk;
            const float *base = qk + (size_t)(t0 + tt) * 2 * key_dim;
            sq[tt][d] = base[kh * dk + d];
            sk[tt][d] = base[key_dim + kh * dk + d];
        }
        for (int i = tid; i < n * GDN_COLS; i += GDN_THREADS) {
            int tt = i / GDN_COLS, j = i % GDN_COLS;
            sv[tt][j] = bf2f(ybuf[(size_t)(t0 + tt) * conv_dim + 2 * key_dim + (size_t)v * dv + col0 + j]);
        }
        for (int tt = tid; tt < n; tt += GDN_THREADS) {
            sb[tt] = bg[((size_t)(t0 + tt) * Hv + v) * 2];
            sd[tt] = expf(bg[((size_t)(t0 + tt) * Hv + v) * 2 + 1]);
        }
        __syncthreads();
        for (int tt = 0; tt < n; tt++) {
            float o = delta_step<NR, 8>(S, sk[tt], sq[tt], sd[tt], sb[tt], sv[tt][cl], rg);
            if (rg == 0) o_out[((size_t)(t0 + tt) * Hv + v) * dv + col] = f2bf(o);
        }
    }
#pragma unroll
    for (int m = 0; m < NR; m++) Sg[(size_t)(rg + 8 * m) * dv] = S[m];
}

/* Gated RMSNorm, a warp per (token, value head): out = bf16(bf16(w * bf16(o * rsqrt(mean(o^2) +
 * eps))) * silu(z)). Bytes: 6 T value_dim; FLOPs: ~10 T value_dim. */
static __global__ void gdn_norm_kernel(uint16_t *out, const uint16_t *o_in, const uint16_t *proj,
                                       const float *norm_w, int T, int Hv, int dv, int conv_dim,
                                       size_t row, float eps) {
    const int wid = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    const int item = blockIdx.x * (blockDim.x / WARP_SIZE) + wid;
    if (item >= T * Hv) return;
    const int t = item / Hv, v = item % Hv;
    const uint16_t *o = o_in + (size_t)item * dv;
    float ss = 0.0f;
    for (int j = lane; j < dv; j += WARP_SIZE) {
        float x = bf2f(o[j]);
        ss += x * x;
    }
    ss = warp_sum(ss);
    const float rr = 1.0f / sqrtf(ss / (float)dv + eps);
    for (int j = lane; j < dv; j += WARP_SIZE) {
        float n = bfr(bf2f(o[j]) * rr);
        float w = bfr(norm_w[j] * n);
        float z = bf2f(proj[(size_t)t * row + conv_dim + (size_t)v * dv + j]);
        out[(size_t)t * Hv * dv + (size_t)v * dv + j] = f2bf(w * silu_f(z));
    }
}

/* ---- launchers ------------------------------------------------------------------------------ */

template <int DK, int LPC>
static void launch_step(struct cuda *cu, const struct config *c, uint16_t *obuf, float *sz,
                        const uint16_t *proj, uint16_t *conv_state, const uint16_t *conv_w,
                        const float *A_log, const float *dt_bias, float *state, const int32_t *pos,
                        int *cnt, int target) {
    int Hv = c->linear_num_value_heads, dv = c->linear_value_head_dim;
    CHECK(dv % (GDN_THREADS / LPC) == 0);
    dim3 grid(Hv, dv / (GDN_THREADS / LPC));
    gpu_launch(cu->pdl, gdn_step_kernel<DK / LPC, LPC>, grid, dim3(GDN_THREADS), 0, cu->stream, obuf,
               sz, proj, conv_state, conv_w, A_log, dt_bias, state, pos, c->linear_num_key_heads, Hv,
               dv, cnt, target, cuda_ktrace_slot(cu, 0, (int)(grid.x * grid.y)));
    cu->n_launches++;
}

/* Lanes per state column: 8 (16 columns per block) while those blocks fit one per SM, else 4
 * (32 columns per block, half the blocks): blocks beyond one per SM start only as the in_proj
 * GEMV's blocks leave, and their late start was the step's critical path (run 4: the 4B step
 * 5.7 -> 2.2 us, tg128 +2.5%; the 0.8B, 128 blocks, lost 1.3% with 4). */
static int step_lpc(const struct cuda *cu, const struct config *c) {
    return (long)c->linear_num_value_heads * c->linear_value_head_dim / 16 <= cu->info.n_sm ? 8 : 4;
}
template <int DK>
static void launch_step_lpc(struct cuda *cu, const struct config *c, uint16_t *obuf, float *sz,
                            const uint16_t *proj, uint16_t *conv_state, const uint16_t *conv_w,
                            const float *A_log, const float *dt_bias, float *state,
                            const int32_t *pos, int *cnt, int target) {
    if (step_lpc(cu, c) == 4)
        launch_step<DK, 4>(cu, c, obuf, sz, proj, conv_state, conv_w, A_log, dt_bias, state, pos, cnt, target);
    else
        launch_step<DK, 8>(cu, c, obuf, sz, proj, conv_state, conv_w, A_log, dt_bias, state, pos, cnt, target);
}

/* The decode step kernel cuda_gdn_step launches for this model: registers per thread, threads. */
template <int DK>
static int step_regs(struct cuda *cu, const struct config *c) {
    return step_lpc(cu, c) == 4 ? gpu_kernel_regs(gdn_step_kernel<DK / 4, 4>)
                                : gpu_kernel_regs(gdn_step_kernel<DK / 8, 8>);
}
extern "C" int cuda_gdn_step_regs(struct cuda *cu, const struct config *c, int *threads) {
    *threads = GDN_THREADS;
    switch (c->linear_key_head_dim) {
    case 32: return step_regs<32>(cu, c);
    case 64: return step_regs<64>(cu, c);
    case 128: return step_regs<128>(cu, c);
    default: return 0;
    }
}

extern "C" void cuda_gdn_step(struct cuda *cu, const struct config *c, uint16_t *obuf, float *sz,
                              const uint16_t *proj, uint16_t *conv_state, const uint16_t *conv_w,
                              const float *A_log, const float *dt_bias, float *state,
                              const int32_t *pos, int *cnt, int target) {
    CHECK(c->linear_conv_kernel_dim == 4);
    switch (c->linear_key_head_dim) {
    case 32: launch_step_lpc<32>(cu, c, obuf, sz, proj, conv_state, conv_w, A_log, dt_bias, state, pos, cnt, target); break;
    case 64: launch_step_lpc<64>(cu, c, obuf, sz, proj, conv_state, conv_w, A_log, dt_bias, state, pos, cnt, target); break;
    case 128: launch_step_lpc<128>(cu, c, obuf, sz, proj, conv_state, conv_w, A_log, dt_bias, state, pos, cnt, target); break;
    default: CHECK(!"unsupported linear_key_head_dim");
    }
}

template <int NR>
static void launch_scan(struct cuda *cu, const struct config *c, float *state, int T) {
    int Hv = c->linear_num_value_heads, dv = c->linear_value_head_dim;
    gdn_scan_kernel<NR><<<dim3(Hv, dv / GDN_COLS), GDN_THREADS, 0, cu->stream>>>(
        cu->gdn_o, state, cu->gdn_qk, cu->gdn_y, cu->gdn_bg, T, c->linear_num_key_heads, Hv, dv,
        c->conv_dim);
    GPU_LAUNCHED();
}

extern "C" void cuda_gdn_prefill(struct cuda *cu, const struct config *c, uint16_t *out,
                                 const uint16_t *proj, uint16_t *conv_state, const uint16_t *conv_w,
                                 const float *A_log, const float *dt_bias, const float *norm_w,
                                 float *state, const int32_t *pos, int T) {
    int Hk = c->linear_num_key_heads, Hv = c->linear_num_value_heads;
    int dk = c->linear_key_head_dim, dv = c->linear_value_head_dim, conv_dim = c->conv_dim;
    size_t row = (size_t)conv_dim + c->value_dim + 2 * Hv;
    CHECK(dv % GDN_COLS == 0 && conv_dim % dk == 0 && dk <= 1024 && c->linear_conv_kernel_dim == 4);
    gdn_conv_kernel<<<dim3(conv_dim / dk + 1, T), dk, 0, cu->stream>>>(
        cu->gdn_y, cu->gdn_qk, cu->gdn_bg, proj, conv_state, conv_w, A_log, dt_bias, pos, Hk, Hv,
        dk, conv_dim, c->value_dim);
    GPU_LAUNCHED();
    gdn_conv_state_kernel<<<(conv_dim + 255) / 256, 256, 0, cu->stream>>>(conv_state, proj, pos, T,
                                                                          conv_dim, row);
    GPU_LAUNCHED();
    switch (dk) {
    case 32: launch_scan<4>(cu, c, state, T); break;
    case 64: launch_scan<8>(cu, c, state, T); break;
    case 128: launch_scan<16>(cu, c, state, T); break;
    default: CHECK(!"unsupported linear_key_head_dim");
    }
    cu->n_launches += 3;
    cuda_gdn_norm(cu, c, out, proj, norm_w, T);
}

extern "C" void cuda_gdn_norm(struct cuda *cu, const struct config *c, uint16_t *out,
                              const uint16_t *proj, const float *norm_w, int T) {
    int Hv = c->linear_num_value_heads, dv = c->linear_value_head_dim, conv_dim = c->conv_dim;
    size_t row = (size_t)conv_dim + c->value_dim + 2 * Hv;
    int items = T * Hv;
    gdn_norm_kernel<<<(items + 7) / 8, 256, 0, cu->stream>>>(out, cu->gdn_o, proj, norm_w, T, Hv, dv,
                                                             conv_dim, row, c->rms_norm_eps);
    GPU_LAUNCHED();
    cu->n_launches++;
}
