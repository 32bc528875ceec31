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
 * Prefill: conv+norms+gates for every token in parallel, the conv state update, the chunked
 * delta rule (below: the in-chunk WY / UT products for every chunk at once, then a pass over the
 * chunks per block of state columns), then the gated RMSNorm. */
#include "kernels.h"

#define GDN_THREADS 128 /* the step: 4 warps x 4 columns x 8 or 4 lanes */

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
                unsigned long long *tr, struct cuda_gdn_rows rows) {
    if (rows.blocks) { /* a batched step: row blockIdx.z's sequence (no sz: the norm reads z) */
        const int row = blockIdx.z;
        char *blk = rows.blocks[row];
        state = (float *)(blk + rows.state_off);
        conv_state = (uint16_t *)(blk + rows.conv_off);
        proj += (size_t)row * rows.proj_row;
        obuf += (size_t)row * Hv * dv;
        pos += row;
        sz = nullptr;
    }
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
    const uint16_t xz = tid < STEP_COLS && !cnt && sz ? load_coherent_u16(proj + conv_dim + vch) : 0;
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
        if (!cnt && sz) sz[vch] = silu_f(bf2f(xz)); /* HF: silu(z) */
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

/* The rings of the checkpoints inside the call (blockIdx.y: which), from the old ring and the
 * call's inputs, before gdn_conv_state_kernel moves the ring on: after t tokens, column
 * (pos + s) & 3 holds the input of s = t - 4 .. t - 1. Bytes: ~8 conv_dim a checkpoint. */
static __global__ void gdn_conv_snap_kernel(struct backend_snap snap, const uint16_t *conv_state,
                                            const uint16_t *proj, const int32_t *pos, int conv_dim,
                                            size_t row) {
    const int ch = blockIdx.x * blockDim.x + threadIdx.x, i = blockIdx.y;
    if (ch >= conv_dim) return;
    const int p = *pos, t = snap.t[i];
    for (int s = t - 4; s < t; s++)
        snap.conv[i][(size_t)ch * 4 + ((p + s) & 3)] =
            s >= 0 ? proj[(size_t)s * row + ch] : conv_state[(size_t)ch * 4 + ((p + s) & 3)];
}

/* The ring after the prompt: the last (up to) 4 raw inputs into their columns. Bytes: ~4 conv_dim. */
static __global__ void gdn_conv_state_kernel(uint16_t *conv_state, const uint16_t *proj,
                                             const int32_t *pos, int T, int conv_dim, size_t row) {
    int ch = blockIdx.x * blockDim.x + threadIdx.x;
    if (ch >= conv_dim) return;
    uint16_t *st = conv_state + (size_t)ch * 4;
    for (int s = T > 4 ? T - 4 : 0; s < T; s++) st[(*pos + s) & 3] = proj[(size_t)s * row + ch];
}

/* ---- prefill: the chunked gated delta rule (qwen35-model.md 4.2) ----------------------------
 * The tokens of the call in chunks of GDN_C = 64 (the last one short: its missing rows act as
 * zero-padded steps, k = v = beta = g = 0, which change nothing), per value head v (key head
 * kh = v / r), with gamma_i = sum_{s <= i} g_s inside the chunk:
 *   A_kk[i][j] = beta_i (k_i . k_j) exp(gamma_i - gamma_j)  (j < i),   A_qk[i][j] = (q_i . k_j)
 *   exp(gamma_i - gamma_j) (j <= i); W = (I + A_kk)^-1 (beta k exp(gamma)), U = (I + A_kk)^-1
 *   (beta v) by forward substitution (the UT / WY form of flash-linear-attention's chunk.py and
 *   transformers' torch_chunk_gated_delta_rule);
 * then over the chunks in order, on the fp32 state S (dk, dv):
 *   v_new = U - W S;  o = (q exp(gamma)) S + A_qk v_new;  S <- exp(gamma_last) S +
 *   (k exp(gamma_last - gamma))^T v_new.
 * gdn_chunk_prep_kernel does the first part for every (chunk, head) at once; the second part
 * (gdn_chunk_state_kernel) is sequential in chunks but splits the state's value columns over
 * blocks (each column of S, v_new and o depends only on its own column). All fp32 on CUDA cores
 * (the recurrent form cpu.c runs is fp32, and the state carries every rounding forward): the
 * same function as the scan it replaces up to fp32 rounding (~1e-6 relative). */
#define GDN_C 64        /* tokens per chunk */
#define GDN_CT 256      /* threads of both chunk kernels */
#define GDN_PAD 4       /* floats of padding per shared row (16-byte rows, banks spread) */

/* Block (chunk, value head). Writes W (T, Hv, dk), U (T, Hv, dv), A_qk (T, Hv, GDN_C) (zero
 * above the diagonal) for the chunk's rows, and replaces bg's g of those rows by gamma.
 * Shared: k, q (GDN_C, DK + pad), A_kk (GDN_C, GDN_C + pad), gamma, beta.
 * Bytes: ~T Hv (8 dk (q, k from L2) + 2 dv + 4 (dk + dv + GDN_C)); FLOPs: ~T Hv (4 GDN_C dk + GDN_C
 * (dk + dv)) */
template <int DK, int DV>
static __global__ void __launch_bounds__(GDN_CT, 1)
gdn_chunk_prep_kernel(float *w_out, float *u_out, float *a_out, float *bg, const float *qk,
                      const uint16_t *ybuf, int T, int Hk, int Hv, int conv_dim) {
    extern __shared__ float4 cp_sm[];
    constexpr int RS = DK + GDN_PAD, AS = GDN_C + GDN_PAD;
    float *ks = (float *)cp_sm, *qs = ks + GDN_C * RS, *As = qs + GDN_C * RS;
    float *gam = As + GDN_C * AS, *bet = gam + GDN_C;
    const int c = blockIdx.x, v = blockIdx.y, kh = v / (Hv / Hk), tid = threadIdx.x;
    const int t0 = c * GDN_C, L = min(GDN_C, T - t0), key_dim = Hk * DK;

    for (int idx = tid; idx < GDN_C * DK / 4; idx += GDN_CT) {
        const int i = idx / (DK / 4), d = idx % (DK / 4) * 4;
        float4 kv = make_float4(0.0f, 0.0f, 0.0f, 0.0f), qv = kv;
        if (i < L) {
            const float *base = qk + (size_t)(t0 + i) * 2 * key_dim + kh * DK + d;
            qv = *(const float4 *)base;
            kv = *(const float4 *)(base + key_dim);
        }
        *(float4 *)(ks + i * RS + d) = kv;
        *(float4 *)(qs + i * RS + d) = qv;
    }
    if (tid < GDN_C) {
        const bool ok = tid < L;
        bet[tid] = ok ? bg[((size_t)(t0 + tid) * Hv + v) * 2] : 0.0f;
        gam[tid] = ok ? bg[((size_t)(t0 + tid) * Hv + v) * 2 + 1] : 0.0f;
    }
    __syncthreads();
    if (tid == 0) { /* HF: g = g.cumsum(dim=-1), in order */
        float acc = 0.0f;
        for (int i = 0; i < GDN_C; i++) gam[i] = acc += gam[i];
    }
    __syncthreads();
    if (tid < L) bg[((size_t)(t0 + tid) * Hv + v) * 2 + 1] = gam[tid];

    /* A_kk and A_qk: thread (i, j = j4 + 4 m) */
    {
        const int i = tid / 4, j4 = tid % 4;
        float kk[GDN_C / 4], qq[GDN_C / 4];
#pragma unroll
        for (int m = 0; m < GDN_C / 4; m++) kk[m] = qq[m] = 0.0f;
        for (int d = 0; d < DK; d += 4) {
            const float4 ki = *(const float4 *)(ks + i * RS + d), qi = *(const float4 *)(qs + i * RS + d);
#pragma unroll
            for (int m = 0; m < GDN_C / 4; m++) {
                const float4 kj = *(const float4 *)(ks + (j4 + 4 * m) * RS + d);
                kk[m] += ki.x * kj.x + ki.y * kj.y + ki.z * kj.z + ki.w * kj.w;
                qq[m] += qi.x * kj.x + qi.y * kj.y + qi.z * kj.z + qi.w * kj.w;
            }
        }
        const float bi = bet[i], gi = gam[i];
#pragma unroll
        for (int m = 0; m < GDN_C / 4; m++) {
            const int j = j4 + 4 * m;
            const float dec = j <= i ? expf(gi - gam[j]) : 0.0f; /* HF: decay_mask */
            As[i * AS + j] = j < i ? bi * kk[m] * dec : 0.0f;
            if (i < L) a_out[((size_t)(t0 + i) * Hv + v) * GDN_C + j] = qq[m] * dec;
        }
    }
    __syncthreads();

    /* forward substitution, a column of [W | U] per thread: x_i = b_i - sum_{j<i} A_kk[i][j] x_j */
    for (int col = tid; col < DK + DV; col += GDN_CT) {
        float x[GDN_C];
        if (col < DK) {
#pragma unroll
            for (int i = 0; i < GDN_C; i++) x[i] = bet[i] * ks[i * RS + col] * expf(gam[i]);
        } else {
            const uint16_t *vp = ybuf + 2 * (size_t)key_dim + (size_t)v * DV + (col - DK);
#pragma unroll
            for (int i = 0; i < GDN_C; i++) x[i] = i < L ? bet[i] * bf2f(vp[(size_t)(t0 + i) * conv_dim]) : 0.0f;
        }
#pragma unroll
        for (int i = 1; i < GDN_C; i++) {
            float acc = x[i];
#pragma unroll
            for (int j = 0; j < i; j++) acc -= As[i * AS + j] * x[j];
            x[i] = acc;
        }
        float *dst = col < DK ? w_out + (size_t)v * DK + col : u_out + (size_t)v * DV + (col - DK);
        const int stride = col < DK ? Hv * DK : Hv * DV;
#pragma unroll
        for (int i = 0; i < GDN_C; i++)
            if (i < L) dst[(size_t)(t0 + i) * stride] = x[i];
    }
}

/* Block (value head, NC state columns), sequential over the chunks; the state slice in
 * registers (SR rows x 2 columns per thread) and in shared memory for the products. Register
 * tiles (v_new and o: RT rows x 4 columns per thread; the state update: SR rows x 2 columns)
 * so that each shared-memory load feeds several multiply-adds (run 132: one row-column per
 * thread was bound by shared-memory loads, 27 us per chunk at 4B).
 * Shared: S (DK, NC), W, q exp(gamma), k exp(gamma_last - gamma) (GDN_C, DK + pad), A_qk
 * (GDN_C, GDN_C + pad), U, v_new (GDN_C, NC).
 * Bytes: 8 Hv dk dv (state) + T Hv (dv / NC) 4 (3 dk + GDN_C) (W, q, k, A_qk from L2 per block) +
 * 4 T Hv dv (U) + 2 T Hv dv (o); FLOPs: ~2 T Hv dv (3 dk + GDN_C). */
template <int DK, int NC>
static __global__ void __launch_bounds__(GDN_CT, 1)
gdn_chunk_state_kernel(uint16_t *o_out, float *state, const float *w_in, const float *u_in,
                       const float *a_in, const float *bg, const float *qk, int T, int Hk, int Hv,
                       int dv, struct backend_snap snap) {
    extern __shared__ float4 cs_sm[];
    constexpr int RS = DK + GDN_PAD, AS = GDN_C + GDN_PAD;
    constexpr int CG = NC / 4, RGN = GDN_CT / CG, RT = GDN_C / RGN; /* v_new / o tiles */
    constexpr int CP = NC / 2, DG = GDN_CT / CP, SR = DK / DG;      /* state tiles */
    static_assert(NC % 4 == 0 && GDN_CT % CG == 0 && GDN_C % RGN == 0 && RT >= 1, "o tiling");
    static_assert(GDN_CT % CP == 0 && DK % DG == 0 && SR >= 1, "state tiling");
    float *Ss = (float *)cs_sm, *Ws = Ss + DK * NC, *Qs = Ws + GDN_C * RS, *Kd = Qs + GDN_C * RS;
    float *As = Kd + GDN_C * RS, *Us = As + GDN_C * AS, *Vn = Us + GDN_C * NC;
    const int v = blockIdx.x, col0 = blockIdx.y * NC, kh = v / (Hv / Hk), tid = threadIdx.x;
    const int key_dim = Hk * DK;
    const int cg = tid % CG, rgn = tid / CG; /* o: rows rgn + RGN m, columns 4 cg .. 4 cg + 3 */
    const int cp = tid % CP, dg = tid / CP;  /* state: rows SR dg .., columns 2 cp, 2 cp + 1 */
    float *Sg = state + (size_t)v * DK * dv + col0 + 2 * cp;
    float S[SR][2];
#pragma unroll
    for (int e = 0; e < SR; e++) {
        const int d = SR * dg + e;
        S[e][0] = Sg[(size_t)d * dv];
        S[e][1] = Sg[(size_t)d * dv + 1];
        *(float2 *)(Ss + d * NC + 2 * cp) = make_float2(S[e][0], S[e][1]);
    }
    for (int t0 = 0; t0 < T; t0 += GDN_C) {
        const int L = min(GDN_C, T - t0);
        const float glast = bg[((size_t)(t0 + L - 1) * Hv + v) * 2 + 1];
        for (int idx = tid; idx < GDN_C * DK / 4; idx += GDN_CT) {
            const int i = idx / (DK / 4), d = idx % (DK / 4) * 4;
            float4 w = make_float4(0.0f, 0.0f, 0.0f, 0.0f), qv = w, kv = w;
            if (i < L) {
                const size_t r = (size_t)(t0 + i);
                const float gi = bg[(r * Hv + v) * 2 + 1], eq = expf(gi), ek = expf(glast - gi);
                w = *(const float4 *)(w_in + (r * Hv + v) * DK + d);
                qv = *(const float4 *)(qk + r * 2 * key_dim + kh * DK + d);
                kv = *(const float4 *)(qk + r * 2 * key_dim + key_dim + kh * DK + d);
                qv.x *= eq, qv.y *= eq, qv.z *= eq, qv.w *= eq;
                kv.x *= ek, kv.y *= ek, kv.z *= ek, kv.w *= ek;
            }
            *(float4 *)(Ws + i * RS + d) = w;
            *(float4 *)(Qs + i * RS + d) = qv;
            *(float4 *)(Kd + i * RS + d) = kv;
        }
        for (int idx = tid; idx < GDN_C * GDN_C / 4; idx += GDN_CT) {
            const int i = idx / (GDN_C / 4), j = idx % (GDN_C / 4) * 4;
            *(float4 *)(As + i * AS + j) = i < L ? *(const float4 *)(a_in + ((size_t)(t0 + i) * Hv + v) * GDN_C + j)
                                                 : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
        for (int idx = tid; idx < GDN_C * NC / 4; idx += GDN_CT) {
            const int i = idx / (NC / 4), j = idx % (NC / 4) * 4;
            *(float4 *)(Us + i * NC + j) = i < L ? *(const float4 *)(u_in + ((size_t)(t0 + i) * Hv + v) * dv + col0 + j)
                                                 : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
        __syncthreads();

        /* v_new = U - W S (HF: v_new = v_i - k_cumdecay[:, :, i] @ last_recurrent_state) */
        {
            float acc[RT][4];
#pragma unroll
            for (int m = 0; m < RT; m++) acc[m][0] = acc[m][1] = acc[m][2] = acc[m][3] = 0.0f;
            for (int d = 0; d < DK; d += 4) {
                float4 s4[4];
#pragma unroll
                for (int e = 0; e < 4; e++) s4[e] = *(const float4 *)(Ss + (d + e) * NC + 4 * cg);
#pragma unroll
                for (int m = 0; m < RT; m++) {
                    const float4 w = *(const float4 *)(Ws + (rgn + RGN * m) * RS + d);
                    const float wv[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        acc[m][0] += wv[e] * s4[e].x;
                        acc[m][1] += wv[e] * s4[e].y;
                        acc[m][2] += wv[e] * s4[e].z;
                        acc[m][3] += wv[e] * s4[e].w;
                    }
                }
            }
#pragma unroll
            for (int m = 0; m < RT; m++) {
                const int i = rgn + RGN * m;
                const float4 u = *(const float4 *)(Us + i * NC + 4 * cg);
                *(float4 *)(Vn + i * NC + 4 * cg) =
                    make_float4(u.x - acc[m][0], u.y - acc[m][1], u.z - acc[m][2], u.w - acc[m][3]);
            }
        }
        __syncthreads();

        /* o = (q exp(gamma)) S + A_qk v_new (HF: attn_inter + attn @ v_new); A_qk is zero above
         * its diagonal, so each row's sum runs to the end of its quad of columns */
        {
            float acc[RT][4];
#pragma unroll
            for (int m = 0; m < RT; m++) acc[m][0] = acc[m][1] = acc[m][2] = acc[m][3] = 0.0f;
            for (int d = 0; d < DK; d += 4) {
                float4 s4[4];
#pragma unroll
                for (int e = 0; e < 4; e++) s4[e] = *(const float4 *)(Ss + (d + e) * NC + 4 * cg);
#pragma unroll
                for (int m = 0; m < RT; m++) {
                    const float4 q = *(const float4 *)(Qs + (rgn + RGN * m) * RS + d);
                    const float qv[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        acc[m][0] += qv[e] * s4[e].x;
                        acc[m][1] += qv[e] * s4[e].y;
                        acc[m][2] += qv[e] * s4[e].z;
                        acc[m][3] += qv[e] * s4[e].w;
                    }
                }
            }
#pragma unroll
            for (int m = 0; m < RT; m++) {
                const int i = rgn + RGN * m;
                float b[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                for (int j = 0; j <= i; j += 4) {
                    const float4 a = *(const float4 *)(As + i * AS + j);
                    const float av[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const float4 vn = *(const float4 *)(Vn + (j + e) * NC + 4 * cg);
                        b[0] += av[e] * vn.x;
                        b[1] += av[e] * vn.y;
                        b[2] += av[e] * vn.z;
                        b[3] += av[e] * vn.w;
                    }
                }
                if (i < L) {
                    uint16_t *op = o_out + ((size_t)(t0 + i) * Hv + v) * dv + col0 + 4 * cg;
                    *(uint2 *)op = make_uint2(pack_bf(acc[m][0] + b[0], acc[m][1] + b[1]),
                                              pack_bf(acc[m][2] + b[2], acc[m][3] + b[3]));
                }
            }
        }

        /* S <- exp(gamma_last) S + (k exp(gamma_last - gamma))^T v_new */
        {
            const float el = expf(glast);
            float acc[SR][2];
#pragma unroll
            for (int e = 0; e < SR; e++) acc[e][0] = acc[e][1] = 0.0f;
            for (int j = 0; j < L; j++) {
                const float2 vn = *(const float2 *)(Vn + j * NC + 2 * cp);
                const float *kd = Kd + j * RS + SR * dg;
                if constexpr (SR % 4 == 0) {
#pragma unroll
                    for (int e = 0; e < SR; e += 4) {
                        const float4 k4 = *(const float4 *)(kd + e);
                        acc[e][0] += k4.x * vn.x, acc[e][1] += k4.x * vn.y;
                        acc[e + 1][0] += k4.y * vn.x, acc[e + 1][1] += k4.y * vn.y;
                        acc[e + 2][0] += k4.z * vn.x, acc[e + 2][1] += k4.z * vn.y;
                        acc[e + 3][0] += k4.w * vn.x, acc[e + 3][1] += k4.w * vn.y;
                    }
                } else {
#pragma unroll
                    for (int e = 0; e < SR; e++) {
                        acc[e][0] += kd[e] * vn.x;
                        acc[e][1] += kd[e] * vn.y;
                    }
                }
            }
#pragma unroll
            for (int e = 0; e < SR; e++) {
                S[e][0] = el * S[e][0] + acc[e][0];
                S[e][1] = el * S[e][1] + acc[e][1];
            }
        }
        __syncthreads(); /* every product read the old S and this chunk's tiles */
#pragma unroll
        for (int e = 0; e < SR; e++)
            *(float2 *)(Ss + (SR * dg + e) * NC + 2 * cp) = make_float2(S[e][0], S[e][1]);
        for (int i = 0; i < snap.n; i++) /* a checkpoint after this chunk (block-uniform) */
            if (snap.t[i] == t0 + L) {
                float *Sn = snap.state[i] + (size_t)v * DK * dv + col0 + 2 * cp;
#pragma unroll
                for (int e = 0; e < SR; e++)
                    *(float2 *)(Sn + (size_t)(SR * dg + e) * dv) = make_float2(S[e][0], S[e][1]);
            }
    }
#pragma unroll
    for (int e = 0; e < SR; e++) {
        Sg[(size_t)(SR * dg + e) * dv] = S[e][0];
        Sg[(size_t)(SR * dg + e) * dv + 1] = S[e][1];
    }
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
                        int *cnt, int target, const struct cuda_gdn_rows &rows, int B) {
    int Hv = c->linear_num_value_heads, dv = c->linear_value_head_dim;
    CHECK(dv % (GDN_THREADS / LPC) == 0);
    dim3 grid(Hv, dv / (GDN_THREADS / LPC), B);
    gpu_launch(cu->pdl, gdn_step_kernel<DK / LPC, LPC>, grid, dim3(GDN_THREADS), 0, cu->stream, obuf,
               sz, proj, conv_state, conv_w, A_log, dt_bias, state, pos, c->linear_num_key_heads, Hv,
               dv, cnt, target, rows.blocks ? nullptr : cuda_ktrace_slot(cu, 0, (int)(grid.x * grid.y)),
               rows);
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
                            const int32_t *pos, int *cnt, int target,
                            const struct cuda_gdn_rows &rows = cuda_gdn_rows(), int B = 1) {
    if (step_lpc(cu, c) == 4)
        launch_step<DK, 4>(cu, c, obuf, sz, proj, conv_state, conv_w, A_log, dt_bias, state, pos, cnt, target, rows, B);
    else
        launch_step<DK, 8>(cu, c, obuf, sz, proj, conv_state, conv_w, A_log, dt_bias, state, pos, cnt, target, rows, B);
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

/* The batched step's rows: B sequences' steps in one launch (grid z), their states found through
 * rows->blocks; o to cu->gdn_o rows, then the gated norm of all rows into out. */
extern "C" void cuda_gdn_step_rows(struct cuda *cu, const struct config *c, uint16_t *out,
                                   const uint16_t *proj, const uint16_t *conv_w, const float *A_log,
                                   const float *dt_bias, const float *norm_w,
                                   const struct cuda_gdn_rows *rows, const int32_t *pos, int B) {
    CHECK(c->linear_conv_kernel_dim == 4 && rows->blocks && B >= 1);
    switch (c->linear_key_head_dim) {
    case 32: launch_step_lpc<32>(cu, c, cu->gdn_o, NULL, proj, NULL, conv_w, A_log, dt_bias, NULL, pos, NULL, 0, *rows, B); break;
    case 64: launch_step_lpc<64>(cu, c, cu->gdn_o, NULL, proj, NULL, conv_w, A_log, dt_bias, NULL, pos, NULL, 0, *rows, B); break;
    case 128: launch_step_lpc<128>(cu, c, cu->gdn_o, NULL, proj, NULL, conv_w, A_log, dt_bias, NULL, pos, NULL, 0, *rows, B); break;
    default: CHECK(!"unsupported linear_key_head_dim");
    }
    cuda_gdn_norm(cu, c, out, proj, norm_w, B);
}

/* State columns per block of the chunked pass: 32 where that still gives ~an SM's worth of
 * blocks (4B / 9B: 128 blocks), else 16 (0.8B / 2B: 128 blocks instead of 64). (A block of 16
 * does half a block of 32's arithmetic per chunk but loads the same W, q, k, A_qk tiles.) */
template <int DK>
static int chunk_cols(const struct cuda *cu, const struct config *c) {
    const int dv = c->linear_value_head_dim, Hv = c->linear_num_value_heads;
    if (dv % 32) return 16;
    return (long)Hv * (dv / 32) * 4 >= (long)cu->info.n_sm * 3 ? 32 : 16;
}

template <int DK, int NC>
static void launch_chunk_state(struct cuda *cu, const struct config *c, float *state, int T,
                               const struct backend_snap &snap) {
    const int Hv = c->linear_num_value_heads, dv = c->linear_value_head_dim;
    CHECK(dv % NC == 0);
    const size_t smem = ((size_t)DK * NC + 3 * GDN_C * (DK + GDN_PAD) + GDN_C * (GDN_C + GDN_PAD) +
                         2 * GDN_C * NC) * sizeof(float);
    static int opted;
    if (!opted && smem > 48 * 1024) GPU_SMEM_OPTIN((gdn_chunk_state_kernel<DK, NC>), smem);
    opted = 1;
    gdn_chunk_state_kernel<DK, NC><<<dim3(Hv, dv / NC), GDN_CT, smem, cu->stream>>>(
        cu->gdn_o, state, cu->gdn_w, cu->gdn_u, cu->gdn_a, cu->gdn_bg, cu->gdn_qk, T,
        c->linear_num_key_heads, Hv, dv, snap);
    GPU_LAUNCHED();
}

template <int DK>
static void launch_chunked(struct cuda *cu, const struct config *c, float *state, int T,
                           const struct backend_snap &snap) {
    const int Hv = c->linear_num_value_heads;
    CHECK(c->linear_value_head_dim == DK); /* dk == dv (backend_cuda_create) */
    const size_t smem = ((size_t)2 * GDN_C * (DK + GDN_PAD) + GDN_C * (GDN_C + GDN_PAD) + 2 * GDN_C) *
                        sizeof(float);
    static int opted;
    if (!opted && smem > 48 * 1024) GPU_SMEM_OPTIN((gdn_chunk_prep_kernel<DK, DK>), smem);
    opted = 1;
    gdn_chunk_prep_kernel<DK, DK><<<dim3((T + GDN_C - 1) / GDN_C, Hv), GDN_CT, smem, cu->stream>>>(
        cu->gdn_w, cu->gdn_u, cu->gdn_a, cu->gdn_bg, cu->gdn_qk, cu->gdn_y, T,
        c->linear_num_key_heads, Hv, c->conv_dim);
    GPU_LAUNCHED();
    cuda_prof_split(cu, "gdn chunk state pass (prefill)");
    if (chunk_cols<DK>(cu, c) == 32)
        launch_chunk_state<DK, 32>(cu, c, state, T, snap);
    else
        launch_chunk_state<DK, 16>(cu, c, state, T, snap);
}

extern "C" void cuda_gdn_prefill(struct cuda *cu, const struct config *c, uint16_t *out,
                                 const uint16_t *proj, uint16_t *conv_state, const uint16_t *conv_w,
                                 const float *A_log, const float *dt_bias, const float *norm_w,
                                 float *state, const int32_t *pos, int T,
                                 const struct backend_snap *snap_p) {
    int Hk = c->linear_num_key_heads, Hv = c->linear_num_value_heads;
    int dk = c->linear_key_head_dim, conv_dim = c->conv_dim;
    size_t row = (size_t)conv_dim + c->value_dim + 2 * Hv;
    CHECK(conv_dim % dk == 0 && dk <= 1024 && c->linear_conv_kernel_dim == 4);
    struct backend_snap snap = {};
    if (snap_p) snap = *snap_p;
    CHECK(snap.n >= 0 && snap.n <= BACKEND_MAX_SNAPS);
    for (int i = 0; i < snap.n; i++)
        CHECK(snap.t[i] > (i ? snap.t[i - 1] : 0) && snap.t[i] <= T && (snap.t[i] % GDN_C == 0 || snap.t[i] == T));
    gdn_conv_kernel<<<dim3(conv_dim / dk + 1, T), dk, 0, cu->stream>>>(
        cu->gdn_y, cu->gdn_qk, cu->gdn_bg, proj, conv_state, conv_w, A_log, dt_bias, pos, Hk, Hv,
        dk, conv_dim, c->value_dim);
    GPU_LAUNCHED();
    if (snap.n) {
        gdn_conv_snap_kernel<<<dim3((conv_dim + 255) / 256, snap.n), 256, 0, cu->stream>>>(
            snap, conv_state, proj, pos, conv_dim, row);
        GPU_LAUNCHED();
        cu->n_launches++;
    }
    gdn_conv_state_kernel<<<(conv_dim + 255) / 256, 256, 0, cu->stream>>>(conv_state, proj, pos, T,
                                                                          conv_dim, row);
    GPU_LAUNCHED();
    cuda_prof_split(cu, "gdn chunk prep (prefill)");
    switch (dk) {
    case 32: launch_chunked<32>(cu, c, state, T, snap); break;
    case 64: launch_chunked<64>(cu, c, state, T, snap); break;
    case 128: launch_chunked<128>(cu, c, state, T, snap); break;
    default: CHECK(!"unsupported linear_key_head_dim");
    }
    cu->n_launches += 4;
    cuda_prof_split(cu, "gdn norm (prefill)");
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

extern "C" int cuda_gdn_chunk(void) { return GDN_C; }
