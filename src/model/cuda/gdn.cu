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
 * delta rule (below: the in-chunk WY / UT products for every chunk at once, a pass over the
 * chunks per block of state columns, the outputs of every chunk at once), then the gated
 * RMSNorm. */
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
 * ROWS (a batched step's rows: B states, past L2's size from B = 2 at 4B): plain loads and
 * stores, and 4 blocks an SM rather than 5, which takes the 4-lane kernel's spills away (run
 * 204, 4B: a step of 8 3.300 -> 3.249 ms, of 16 4.258 -> 4.227; evict-last and streaming alike
 * at 5 blocks, within 1%). Not kept (runs 212-219): each block prefetching its slice of the next
 * DeltaNet layer's state into L2 (no change), and a persistent kernel taking its next items'
 * states by cp.async into a double buffer (0.1 ms slower a step at B 1-8, 0.03 faster at 16):
 * the rows are not waiting on DRAM latency (run 217: 1,235 instructions a warp, stalls spread
 * over the loads, the block sums' barriers and issue).
 * DVC: the value head dimension as a constant (every Qwen3.5 size: 128; 0 takes dv_in), so the
 * state's NR row offsets are immediates of one address instead of NR address computations: the
 * single-sequence kernel's 44 bytes of spills went, 4B tg128 +1.2% (run 221). The ROWS kernel
 * keeps the runtime dv: there it changed nothing (runs 218, 220).
 * Bytes: 8 Hv dk dv (state read + written; mostly L2) + ~2 (conv_dim + value_dim) * 5 (conv
 * window, x, o); FLOPs: ~6 Hv dk dv. */
template <int NR, int LPC, bool ROWS, int DVC>
static __global__ void __launch_bounds__(GDN_THREADS, LPC == 4 ? (ROWS ? 4 : 5) : 1)
gdn_step_kernel(uint16_t *obuf, float *sz, const uint16_t *proj, uint16_t *conv_state,
                const uint16_t *conv_w, const float *A_log, const float *dt_bias, float *state,
                const int32_t *pos, int Hk, int Hv, int dv_in, int *cnt, int target,
                unsigned long long *tr, struct cuda_gdn_rows rows) {
    const int dv = DVC ? DVC : dv_in; /* DVC: the state's row offsets are immediates */
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
    for (int m = 0; m < NR; m++) {
        const float *sp = Sg + (size_t)(rg + LPC * m) * dv;
        S[m] = ROWS ? *sp : load_keep(sp);
    }
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
    for (int m = 0; m < NR; m++) {
        float *sp = Sg + (size_t)(rg + LPC * m) * dv;
        if (ROWS) *sp = S[m];
        else store_keep(sp, S[m]);
    }
    if (cnt) { /* complete only after the in_proj (its z rows), and leave both counts at zero */
        grid_dependency_wait();
        if (tid == 0 && atomicAdd(cnt + 1, 1) == (int)(gridDim.x * gridDim.y) - 1) cnt[0] = cnt[1] = 0;
    }
}

/* ---- prefill -------------------------------------------------------------------------------- */

/* SiLU with the fast exponential and division (a few ulp of fp32 before the bf16 rounding that
 * follows it; the accurate pair was most of the conv kernel's instructions) */
static __device__ __forceinline__ float silu_fast(float x) { return __fdividef(x, 1.0f + __expf(-x)); }

/* Conv + SiLU, then for q/k heads each token's L2 norm: a warp per (dk-wide head, GDN_CONV_TT
 * tokens), lane l taking the CPT = dk / 32 adjacent channels from CPT l (one 2/4/8-byte load a
 * token, all GDN_CONV_TT + 3 of them in flight at once), the token's sum of squares a warp
 * butterfly; GDN_CONV_WARPS warps a block take consecutive spans of one head, and the extra block
 * row blockIdx.x == conv_dim / dk computes beta and g. Bytes: ~2 T conv_dim (x, once) + 4 T
 * (2 key_dim) + 2 T value_dim; FLOPs: ~12 T conv_dim. (Before run 237: a thread per 2 channels, 16
 * tokens held for a block-wide norm, the accurate expf / division / sqrt: 25.6 us for a 512-token
 * 4B layer on an H100, ~60 instructions an element, IPC 1.6 at 8% of DRAM's bandwidth under Nsight
 * Compute (run 236). This kernel, runs 237-241 (H100): 12.6 us at 16 tokens a warp, 11.4 at 8,
 * and the same chunk prep after it 44.3 us after the first, 37.5 after the second (traced; its
 * blocks start sooner after a grid of shorter ones); 4 tokens no better.) */
#define GDN_CONV_TT 8
#define GDN_CONV_WARPS 4
template <int CPT>
static __global__ void __launch_bounds__(GDN_CONV_WARPS *WARP_SIZE)
gdn_conv_kernel(uint16_t *ybuf, float *qk, float *bg, const uint16_t *proj, const uint16_t *conv_state,
                const uint16_t *conv_w, const float *A_log, const float *dt_bias, const int32_t *pos, int T,
                int Hk, int Hv, int dk, int conv_dim, int value_dim) {
    static_assert(CPT == 1 || CPT == 2 || CPT == 4, "channels a lane: 1, 2 or 4");
    constexpr int TT = GDN_CONV_TT, NWD = (CPT + 1) / 2; /* 4-byte words a token */
    grid_launch_dependents();
    const int hb = blockIdx.x, lane = threadIdx.x % WARP_SIZE, wid = threadIdx.x / WARP_SIZE;
    const int nh = conv_dim / dk, ch = hb * dk + lane * CPT; /* dk == 32 CPT */
    const size_t row = (size_t)conv_dim + value_dim + 2 * Hv;
    float w[CPT][4]; /* the conv's weights (not the previous kernel's output): before the wait */
    if (hb < nh)
#pragma unroll
        for (int c = 0; c < CPT; c++)
#pragma unroll
            for (int j = 0; j < 4; j++) w[c][j] = bf2f(conv_w[(size_t)(ch + c) * 4 + j]);
    grid_dependency_wait();
    if (hb == nh) {
        const int b0 = blockIdx.y * TT * GDN_CONV_WARPS, nb = min(TT * GDN_CONV_WARPS, T - b0);
        for (int idx = threadIdx.x; idx < nb * Hv; idx += blockDim.x) {
            const int t = b0 + idx / Hv, v = idx % Hv;
            const uint16_t *x = proj + t * row;
            float b = bf2f(x[conv_dim + value_dim + v]), a = bf2f(x[conv_dim + value_dim + Hv + v]);
            bg[((size_t)t * Hv + v) * 2] = bfr(sigmoid_f(b));
            bg[((size_t)t * Hv + v) * 2 + 1] = -expf(A_log[v]) * softplus_f(a + dt_bias[v]);
        }
        return;
    }
    const int t0 = (blockIdx.y * GDN_CONV_WARPS + wid) * TT;
    if (t0 >= T) return;
    const int p0 = *pos;
    uint32_t r[TT + 3][NWD]; /* inputs of tokens t0 - 3 .. t0 + TT - 1 as bf16; < 0: from the ring */
#pragma unroll
    for (int j = 0; j < TT + 3; j++) {
        const int s = t0 - 3 + j;
        if (s >= T) {
#pragma unroll
            for (int q = 0; q < NWD; q++) r[j][q] = 0;
        } else if (s >= 0) {
            const uint16_t *src = proj + (size_t)s * row + ch;
            if (CPT == 4) {
                const uint2 v = *(const uint2 *)src;
                r[j][0] = v.x, r[j][NWD - 1] = v.y;
            } else if (CPT == 2) {
                r[j][0] = *(const uint32_t *)src;
            } else {
                r[j][0] = src[0];
            }
        } else {
            uint32_t h[CPT];
#pragma unroll
            for (int c = 0; c < CPT; c++) h[c] = conv_state[(size_t)(ch + c) * 4 + ((p0 + s) & 3)];
#pragma unroll
            for (int q = 0; q < NWD; q++) r[j][q] = CPT == 1 ? h[0] : h[2 * q] | h[(2 * q + 1) % CPT] << 16;
        }
    }
    const bool norm = hb < 2 * Hk;
    const float scale = hb < Hk ? rsqrtf((float)dk) : 1.0f;
#pragma unroll
    for (int i = 0; i < TT; i++) {
        if (t0 + i >= T) break;
        float y[CPT], ss = 0.0f;
#pragma unroll
        for (int c = 0; c < CPT; c++) {
            float acc = 0.0f;
#pragma unroll
            for (int j = 0; j < 4; j++) acc += w[c][j] * (c % 2 ? hi_bf(r[i + j][c / 2]) : lo_bf(r[i + j][c / 2]));
            y[c] = bfr(silu_fast(bfr(acc)));
            ss += y[c] * y[c];
        }
        if (!norm) {
            uint16_t *dst = ybuf + (size_t)(t0 + i) * conv_dim + ch;
            if (CPT == 4)
                *(uint2 *)dst = make_uint2(pack_bf(y[0], y[1 % CPT]), pack_bf(y[2 % CPT], y[3 % CPT]));
            else if (CPT == 2)
                *(uint32_t *)dst = pack_bf(y[0], y[1 % CPT]);
            else
                dst[0] = f2bf(y[0]);
            continue;
        }
        const float inv = rsqrtf(warp_sum(ss) + 1e-6f);
        float *dst = qk + ((size_t)(t0 + i) * 2 * Hk + hb) * dk + lane * CPT;
        if (CPT == 4)
            *(float4 *)dst = make_float4(y[0] * inv * scale, y[1 % CPT] * inv * scale,
                                         y[2 % CPT] * inv * scale, y[3 % CPT] * inv * scale);
        else if (CPT == 2)
            *(float2 *)dst = make_float2(y[0] * inv * scale, y[1 % CPT] * inv * scale);
        else
            dst[0] = y[0] * inv * scale;
    }
}

/* The rings of the checkpoints inside the call (blockIdx.y: which), from the old ring and the
 * call's inputs, before gdn_norm_kernel moves the ring on: after t tokens, column
 * (pos + s) & 3 holds the input of s = t - 4 .. t - 1. Bytes: ~8 conv_dim a checkpoint. */
static __global__ void gdn_conv_snap_kernel(struct backend_snap snap, const uint16_t *conv_state,
                                            const uint16_t *proj, const int32_t *pos, int conv_dim,
                                            size_t row) {
    grid_launch_dependents(); /* programmatic dependent launch: nothing before the wait */
    grid_dependency_wait();
    const int ch = blockIdx.x * blockDim.x + threadIdx.x, i = blockIdx.y;
    if (ch >= conv_dim) return;
    const int p = *pos, t = snap.t[i];
    for (int s = t - 4; s < t; s++)
        snap.conv[i][(size_t)ch * 4 + ((p + s) & 3)] =
            s >= 0 ? proj[(size_t)s * row + ch] : conv_state[(size_t)ch * 4 + ((p + s) & 3)];
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
 * gdn_chunk_prep_kernel does the first part for every (chunk, head) at once (fp32 on CUDA cores:
 * the forward substitution carries every rounding into W and U). gdn_chunk_h_kernel runs the
 * chunks in order per block of state columns (each column of S, v_new and o depends only on its
 * own column) and does only what needs the state: v_new and the state update, on tensor cores
 * with split bf16 operands (~2^-16 a product, fp32 accumulation: within ~1e-5 of the recurrent
 * fp32 scan cpu.c runs); it stores each chunk's starting state and v_new, and
 * gdn_chunk_o_kernel forms the outputs of every chunk at once (runs 179-181: the state pass,
 * output included, 24.9 -> 8.7 ms of a 4,096-token 4B prefill). */
/* An fp32 pair as two bf16 pairs, hi = bf16(x) and lo = bf16(x - hi): hi + lo carries ~16 bits
 * of x's 24 (the split the flash kernel uses for P). */
static __device__ __forceinline__ void split_bf(float x0, float x1, uint32_t &hi, uint32_t &lo) {
    hi = pack_bf(x0, x1);
    lo = pack_bf(x0 - lo_bf(hi), x1 - hi_bf(hi));
}
/* d += a b on tensor cores with both operands split: al bh + ah bl + ah bh (the al bl term, ~2^-16
 * of the product, dropped; the small terms first). Each product good to ~2^-16 relative, with
 * fp32 accumulation: the chunked pass stays at fp32-like error on the state it carries forward. */
static __device__ __forceinline__ void mma_split(float (&d)[4], const uint32_t (&ah)[4],
                                                 const uint32_t (&al)[4], uint32_t bh0, uint32_t bh1,
                                                 uint32_t bl0, uint32_t bl1) {
    mma_bf16(d, al, bh0, bh1);
    mma_bf16(d, ah, bl0, bl1);
    mma_bf16(d, ah, bh0, bh1);
}

/* An A fragment (16 x 16 at k0) split from fp32 rows in shared memory: r0 points at row g, column
 * k0 + 2 t of the tile, r1 at row g + 8; the rows scaled by s0, s1 first. */
static __device__ __forceinline__ void split_a(uint32_t (&ah)[4], uint32_t (&al)[4], const float *r0,
                                               const float *r1, float s0 = 1.0f, float s1 = 1.0f) {
    float2 x = *(const float2 *)r0;
    split_bf(x.x * s0, x.y * s0, ah[0], al[0]);
    x = *(const float2 *)r1;
    split_bf(x.x * s1, x.y * s1, ah[1], al[1]);
    x = *(const float2 *)(r0 + 8);
    split_bf(x.x * s0, x.y * s0, ah[2], al[2]);
    x = *(const float2 *)(r1 + 8);
    split_bf(x.x * s1, x.y * s1, ah[3], al[3]);
}

#define GDN_C 64        /* tokens per chunk */
#define GDN_CT 256      /* threads of the chunk kernels: 8 warps */
#define GDN_PAD 8       /* floats of padding per shared row of the prep (16-byte rows; the
                         * fragments' 8-byte loads bank-conflict free) */

/* The prep's A_kk / A_qk tiles by warp: {m-tile, first 8-key tile, count} (20 tiles on or below
 * the diagonal of 4 m-tiles by 8 key tiles; at most 3 a warp) */
__constant__ const int gdn_a_tiles[8][3] = {{3, 0, 3}, {3, 3, 3}, {3, 6, 2}, {2, 0, 3},
                                            {2, 3, 3}, {1, 0, 2}, {1, 2, 2}, {0, 0, 2}};

/* Block (chunk, value head). Writes W and k exp(gamma_last - gamma)^T (bf16 hi / lo planes, per
 * chunk and value head), U (T, Hv, dv), A_qk (T, Hv, GDN_C) (zero above the diagonal) for the
 * chunk's rows, and replaces bg's g of those rows by gamma. A_kk and A_qk on tensor cores
 * (mma_split), the substitution below. Shared: k, q (GDN_C, DK + pad), A_kk (GDN_C, GDN_C +
 * pad), gamma, beta, exp(gamma), exp(gamma_last - gamma); then [W | U] over k and q.
 * Bytes: ~T Hv (8 dk (q, k from L2) + 2 dv + 4 (2 dk + dv + GDN_C)); FLOPs: ~T Hv (4 GDN_C dk +
 * GDN_C (dk + dv)), the first half issued 3 times. */
template <int DK, int DV>
static __global__ void __launch_bounds__(GDN_CT, 1)
gdn_chunk_prep_kernel(uint16_t *w_out, uint16_t *kd_out, float *u_out, float *a_out, float *bg,
                      const float *qk, const uint16_t *ybuf, int T, int Hk, int Hv, int conv_dim) {
    grid_launch_dependents(); /* programmatic dependent launch: nothing before the wait */
    grid_dependency_wait();
    extern __shared__ float4 cp_sm[];
    constexpr int RS = DK + GDN_PAD, AS = GDN_C + GDN_PAD;
    float *ks = (float *)cp_sm, *qs = ks + GDN_C * RS, *As = qs + GDN_C * RS;
    float *gam = As + GDN_C * AS, *bet = gam + GDN_C, *eg = bet + GDN_C, *egl = eg + GDN_C;
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
    if (tid == 0) { /* HF: g = g.cumsum(dim=-1), in order (in registers: one shared round trip) */
        float r[GDN_C], acc = 0.0f;
#pragma unroll
        for (int i = 0; i < GDN_C; i++) r[i] = gam[i];
#pragma unroll
        for (int i = 0; i < GDN_C; i++) r[i] = acc += r[i];
#pragma unroll
        for (int i = 0; i < GDN_C; i++) gam[i] = r[i];
    }
    __syncthreads();
    if (tid < L) bg[((size_t)(t0 + tid) * Hv + v) * 2 + 1] = gam[tid];
    if (tid < GDN_C) { /* the decays of W's and the state update's k, once a row (read after the
                        * barrier that ends the A_kk / A_qk part) */
        eg[tid] = expf(gam[tid]);
        egl[tid] = expf(gam[L - 1] - gam[tid]);
    }

    /* A_kk and A_qk on tensor cores (mma_split, operands split from the fp32 tiles): the 20 8-key
     * tiles on or below the diagonal (m-tile mt: key tiles 0 .. 2 mt + 1), 2 or 3 a warp, one
     * m-tile each (gdn_a_tiles: the busiest warp had 4, two had none); A_qk's tiles above them
     * zero (A_kk's are never read) */
    static_assert(GDN_C == 64 && GDN_CT == 256, "gdn_a_tiles: 4 m-tiles, 8 warps");
    {
        const int wid = tid / WARP_SIZE, lane = tid % WARP_SIZE, g = lane / 4, t4 = lane % 4;
        const int mt = gdn_a_tiles[wid][0], nb = gdn_a_tiles[wid][1], cnt = gdn_a_tiles[wid][2];
        const int i0 = 16 * mt + g;
        float kk[3][4], qq[3][4];
#pragma unroll
        for (int n = 0; n < 3; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) kk[n][e] = qq[n][e] = 0.0f;
        const float *k0 = ks + i0 * RS + 2 * t4, *k1 = k0 + 8 * RS, *q0 = qs + i0 * RS + 2 * t4, *q1 = q0 + 8 * RS;
#pragma unroll 2
        for (int d = 0; d < DK; d += 16) {
            uint32_t kh[4], kl[4], qh[4], ql[4];
            float2 x;
            split_a(kh, kl, k0 + d, k1 + d);
            split_a(qh, ql, q0 + d, q1 + d);
#pragma unroll
            for (int n = 0; n < 3; n++) {
                if (n >= cnt) continue; /* warp-uniform */
                const float *kj = ks + (8 * (nb + n) + g) * RS + d + 2 * t4;
                uint32_t bh0, bl0, bh1, bl1;
                x = *(const float2 *)kj, split_bf(x.x, x.y, bh0, bl0);
                x = *(const float2 *)(kj + 8), split_bf(x.x, x.y, bh1, bl1);
                mma_split(kk[n], kh, kl, bh0, bh1, bl0, bl1);
                mma_split(qq[n], qh, ql, bh0, bh1, bl0, bl1);
            }
        }
#pragma unroll
        for (int n = 0; n < 3; n++) {
            if (n >= cnt) continue;
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int i = i0 + 8 * h, j = 8 * (nb + n) + 2 * t4;
                const float bi = bet[i], gi = gam[i];
                const float dec0 = j <= i ? expf(gi - gam[j]) : 0.0f; /* HF: decay_mask */
                const float dec1 = j + 1 <= i ? expf(gi - gam[j + 1]) : 0.0f;
                As[i * AS + j] = j < i ? bi * kk[n][2 * h] * dec0 : 0.0f;
                As[i * AS + j + 1] = j + 1 < i ? bi * kk[n][2 * h + 1] * dec1 : 0.0f;
                if (i < L)
                    *(float2 *)(a_out + ((size_t)(t0 + i) * Hv + v) * GDN_C + j) =
                        make_float2(qq[n][2 * h] * dec0, qq[n][2 * h + 1] * dec1);
            }
        }
        for (int idx = tid; idx < GDN_C * GDN_C / 4; idx += GDN_CT) { /* A_qk past the m-tile's keys */
            const int i = idx / (GDN_C / 4), j = idx % (GDN_C / 4) * 4;
            if (i < L && j >= 16 * (i / 16) + 16)
                *(float4 *)(a_out + ((size_t)(t0 + i) * Hv + v) * GDN_C + j) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
    }
    __syncthreads();

    /* [W | U] = (I + A_kk)^-1 [beta k exp(gamma) | beta v] in 16-row blocks: X_b = solve(I + A_bb,
     * B_b - A_b,<b X_<b), the products between blocks on tensor cores (mma_split), each diagonal
     * block by substitution, a column per thread (run 180: a whole column's 64-step substitution
     * per thread, before, was latency-bound). X in shared memory over the k / q tiles (XS = DK +
     * DV + 4: the fragment loads conflict free). Also k exp(gamma_last - gamma) for the state
     * update, transposed. W and that k go out as bf16 hi / lo planes, the chunk pass's operands
     * as it loads them: (chunk, value head, plane, row, k); U as fp32 (T, Hv, dv). */
    constexpr int NCOL = DK + DV, XS = NCOL + 4, NTW = NCOL / 64;
    static_assert(NCOL <= GDN_CT && NCOL % 64 == 0 && GDN_C * XS <= 2 * GDN_C * RS, "blocked substitution");
    float *X = ks;
    const int col = tid;
    uint16_t *wp = w_out + ((size_t)c * Hv + v) * 2 * GDN_C * DK;
    {
        float x[GDN_C];
        static_assert(DK == DV, "the decayed k's rows split between the k and the v columns");
        if (col < DK) {
#pragma unroll
            for (int i = 0; i < GDN_C; i++) x[i] = bet[i] * ks[i * RS + col] * eg[i];
        } else if (col < NCOL) {
            const uint16_t *vp = ybuf + 2 * (size_t)key_dim + (size_t)v * DV + (col - DK);
#pragma unroll
            for (int i = 0; i < GDN_C; i++) x[i] = i < L ? bet[i] * bf2f(vp[(size_t)(t0 + i) * conv_dim]) : 0.0f;
        }
        if (col < NCOL) { /* k exp(gamma_last - gamma): its rows 0 .. 31 by the k columns, 32 .. 63
                           * by the v columns (the v columns' own part is the lighter; their loads first) */
            const int kc = col < DK ? col : col - DK, r0 = col < DK ? 0 : GDN_C / 2;
            uint16_t *kp = kd_out + ((size_t)c * Hv + v) * 2 * DK * GDN_C + (size_t)kc * GDN_C + r0;
#pragma unroll
            for (int i8 = 0; i8 < GDN_C / 2; i8 += 8) {
                uint32_t h[4], l[4];
#pragma unroll
                for (int q = 0; q < 4; q++) {
                    const int i = r0 + i8 + 2 * q;
                    split_bf(ks[i * RS + kc] * egl[i], ks[(i + 1) * RS + kc] * egl[i + 1], h[q], l[q]);
                }
                *(uint4 *)(kp + i8) = make_uint4(h[0], h[1], h[2], h[3]);
                *(uint4 *)(kp + (size_t)DK * GDN_C + i8) = make_uint4(l[0], l[1], l[2], l[3]);
            }
        }
        __syncthreads(); /* every read of k done: X goes over it */
        if (col < NCOL)
#pragma unroll
            for (int i = 0; i < GDN_C; i++) X[i * XS + col] = x[i];
        __syncthreads();
    }
    const int wid = tid / WARP_SIZE, lane = tid % WARP_SIZE, g = lane / 4, t4 = lane % 4;
#pragma unroll 1
    for (int b = 0; b < GDN_C / 16; b++) {
        if (b > 0) { /* X_b -= A_b,<b X_<b: warp w the n-tiles NTW w .. */
            float acc[NTW][4];
#pragma unroll
            for (int n = 0; n < NTW; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
            const float *a0 = As + (16 * b + g) * AS + 2 * t4, *a1 = a0 + 8 * AS;
            for (int k0 = 0; k0 < 16 * b; k0 += 16) {
                uint32_t ah[4], al[4];
                split_a(ah, al, a0 + k0, a1 + k0);
#pragma unroll
                for (int n = 0; n < NTW; n++) {
                    const float *xc = X + (k0 + 2 * t4) * XS + 8 * (NTW * wid + n) + g;
                    uint32_t bh0, bl0, bh1, bl1;
                    split_bf(xc[0], xc[XS], bh0, bl0);
                    split_bf(xc[8 * XS], xc[9 * XS], bh1, bl1);
                    mma_split(acc[n], ah, al, bh0, bh1, bl0, bl1);
                }
            }
#pragma unroll
            for (int n = 0; n < NTW; n++) {
                float *xo = X + (16 * b + g) * XS + 8 * (NTW * wid + n) + 2 * t4;
                xo[0] -= acc[n][0], xo[1] -= acc[n][1];
                xo[8 * XS] -= acc[n][2], xo[8 * XS + 1] -= acc[n][3];
            }
            __syncthreads();
        }
        if (col < NCOL) { /* the diagonal block by substitution, a column per thread */
            float y[16];
#pragma unroll
            for (int i = 0; i < 16; i++) y[i] = X[(16 * b + i) * XS + col];
#pragma unroll
            for (int i = 1; i < 16; i++) {
                float a[16], acc = y[i]; /* the row's coefficients: 16-byte (broadcast) loads */
#pragma unroll
                for (int q = 0; q < 4; q++)
                    if (4 * q < i) *(float4 *)(a + 4 * q) = *(const float4 *)(As + (16 * b + i) * AS + 16 * b + 4 * q);
#pragma unroll
                for (int j = 0; j < i; j++) acc -= a[j] * y[j];
                y[i] = acc;
            }
#pragma unroll
            for (int i = 0; i < 16; i++) {
                const int r = 16 * b + i;
                X[r * XS + col] = y[i];
                if (col < DK) { /* every row: rows past L are zero (their beta is) */
                    const uint16_t h = f2bf(y[i]);
                    wp[(size_t)r * DK + col] = h;
                    wp[(size_t)(GDN_C + r) * DK + col] = f2bf(y[i] - bf2f(h));
                } else if (r < L) {
                    u_out[((size_t)(t0 + r) * Hv + v) * DV + col - DK] = y[i];
                }
            }
        }
        __syncthreads();
    }
}

/* Fragments from shared bf16 matrices by ldmatrix (rows of 16-byte chunks; the strides used
 * here, 4 words mod 32 a row, keep them conflict free). A: the 16 x 16 tile at (m0, k0) of a
 * row-major [m][k] matrix. B: CNT n-tiles from n0, k0 .. k0 + 15, of a [n][k] matrix. */
static __device__ __forceinline__ void ldsm_a(uint32_t (&a)[4], const uint16_t *base, int stride, int m0, int k0) {
    const int lane = threadIdx.x % WARP_SIZE, mat = lane / 8, mr = lane % 8;
    ldmatrix_x4(a, smem_addr(base + (m0 + mr + (mat & 1) * 8) * stride + k0 + (mat >> 1) * 8));
}
template <int CNT>
static __device__ __forceinline__ void ldsm_b(uint32_t (&b)[CNT][2], const uint16_t *base, int stride, int n0, int k0) {
    const int lane = threadIdx.x % WARP_SIZE, mat = lane / 8, mr = lane % 8;
#pragma unroll
    for (int p = 0; p < CNT / 2; p++) {
        uint32_t r[4];
        ldmatrix_x4(r, smem_addr(base + (n0 + 16 * p + mr + (mat >> 1) * 8) * stride + k0 + (mat & 1) * 8));
        b[2 * p][0] = r[0], b[2 * p][1] = r[1], b[2 * p + 1][0] = r[2], b[2 * p + 1][1] = r[3];
    }
    if (CNT % 2) {
        uint32_t r[2];
        ldmatrix_x2(r, smem_addr(base + (n0 + 16 * (CNT / 2) + mr) * stride + k0 + (mat & 1) * 8));
        b[CNT - 1][0] = r[0], b[CNT - 1][1] = r[1];
    }
}

/* One k-step of 16 of acc += A B with both operands as bf16 hi / lo planes in shared memory: the
 * hi-hi products into acc, the two cross terms into acs. A: rows m0 .. m0 + 15 of a [m][k] pair
 * (stride as); B: CNT n-tiles from n0 of a [n][k] pair (stride bs). */
template <int CNT>
static __device__ __forceinline__ void mma_split_step(float (&acc)[CNT][4], float (&acs)[CNT][4],
                                                      const uint16_t *Ah, const uint16_t *Al, int as, int m0,
                                                      const uint16_t *Bh, const uint16_t *Bl, int bs, int n0,
                                                      int k0) {
    uint32_t ah[4], al[4], bh[CNT][2], bl[CNT][2];
    ldsm_a(ah, Ah, as, m0, k0);
    ldsm_a(al, Al, as, m0, k0);
    ldsm_b<CNT>(bh, Bh, bs, n0, k0);
    ldsm_b<CNT>(bl, Bl, bs, n0, k0);
#pragma unroll
    for (int n = 0; n < CNT; n++) {
        mma_bf16(acs[n], al, bh[n][0], bh[n][1]);
        mma_bf16(acs[n], ah, bl[n][0], bl[n][1]);
        mma_bf16(acc[n], ah, bh[n][0], bh[n][1]);
    }
}

/* The pass over the chunks: block (value head, NC state columns), 8 warps, sequential in chunks,
 * on tensor cores (mma m16n8k16; every operand as bf16 hi + lo, the hi-hi products in one
 * accumulator and the two cross terms in another). Per chunk:
 *   v_new = U - W S          (64 x NC, k = DK)
 *   S <- exp(gamma_last) S + (k exp(gamma_last - gamma))^T v_new   (DK x NC, k = 64)
 * W and the decayed k^T come split from the prep; the state lives in the warps' accumulator
 * tiles (fp32, exact between chunks) and, as the B operand of the next W S, in shared memory
 * transposed as hi / lo planes, which are also what the output pass needs: each chunk's
 * starting state goes to h_out and its v_new to vn_out (both (chunk, value head, plane, column,
 * k)), so q S and A_qk v_new, half the work, run in gdn_chunk_o_kernel with every chunk in
 * parallel. The next chunk's tiles load by cp.async while this chunk computes (two buffers).
 * Shared: W (2 x 2 x 64 x DK + pad, bf16), k^T (2 x 2 x DK x 64 + pad), U (2 x 64 x NC + pad,
 * fp32), S^T and v_new^T (hi / lo), gamma_last.
 * Bytes: T Hv (dv / NC) (8 DK + 4 NC) in (W, k, U from L2 per block), T Hv dv 4 (DK / 64 + 1)
 * out (S per chunk, v_new); FLOPs (issued): 3 x 4 T Hv dv DK. */
template <int DK, int NC>
static __global__ void __launch_bounds__(GDN_CT, 1)
gdn_chunk_h_kernel(uint16_t *h_out, uint16_t *vn_out, float *state, const uint16_t *w_in,
                   const uint16_t *kd_in, const float *u_in, const float *bg, int T, int Hv, int dv,
                   struct backend_snap snap) {
    grid_launch_dependents(); /* programmatic dependent launch: nothing before the wait */
    grid_dependency_wait();
    constexpr int WS = DK + 8, KS = GDN_C + 8, US = NC + 8, SS = DK + 8, VS = GDN_C + 8;
    constexpr int NT = NC / 8;                                      /* n-tiles */
    constexpr int TV = 4 * NT, TPV = TV >= 8 ? TV / 8 : 1;          /* v_new tiles, per warp */
    constexpr int TU = DK / 16 * NT, TPU = TU >= 8 ? TU / 8 : 1;    /* state tiles, per warp */
    constexpr int WTILE = 2 * GDN_C * WS, KTILE = 2 * DK * KS;      /* bf16 per buffer */
    static_assert(DK % 16 == 0 && NC % 8 == 0 && NT % TPV == 0 && NT % TPU == 0, "tiling");
    extern __shared__ float4 ch_sm[];
    float *Us = (float *)ch_sm, *gl = Us + 2 * GDN_C * US;
    uint16_t *Ws = (uint16_t *)(gl + 4), *Ks = Ws + 2 * WTILE;
    uint16_t *Sth = Ks + 2 * KTILE, *Stl = Sth + NC * SS, *Vth = Stl + NC * SS, *Vtl = Vth + NC * VS;
    const int v = blockIdx.x, col0 = blockIdx.y * NC, tid = threadIdx.x;
    const int wid = tid / WARP_SIZE, lane = tid % WARP_SIZE, g = lane / 4, t4 = lane % 4;
    const int nch = (T + GDN_C - 1) / GDN_C;

    auto load = [&](int c, int b) { /* chunk c's tiles into buffer b; U rows past T zero */
        const int t0 = c * GDN_C;
        const uint16_t *wsrc = w_in + ((size_t)c * Hv + v) * 2 * GDN_C * DK;
        const uint16_t *ksrc = kd_in + ((size_t)c * Hv + v) * 2 * DK * GDN_C;
        for (int idx = tid; idx < 2 * GDN_C * DK / 8; idx += GDN_CT) {
            const int r = idx / (DK / 8), q = idx % (DK / 8) * 8; /* r: plane * 64 + row */
            cp_async16(smem_addr(Ws + b * WTILE + r * WS + q), wsrc + (size_t)r * DK + q, 16);
        }
        for (int idx = tid; idx < 2 * DK * GDN_C / 8; idx += GDN_CT) {
            const int r = idx / (GDN_C / 8), q = idx % (GDN_C / 8) * 8; /* r: plane * DK + d */
            cp_async16(smem_addr(Ks + b * KTILE + r * KS + q), ksrc + (size_t)r * GDN_C + q, 16);
        }
        for (int idx = tid; idx < GDN_C * NC / 4; idx += GDN_CT) {
            const int i = idx / (NC / 4), q = idx % (NC / 4) * 4;
            const bool ok = t0 + i < T;
            cp_async16(smem_addr(Us + (b * GDN_C + i) * US + q),
                       u_in + ((size_t)(ok ? t0 + i : 0) * Hv + v) * dv + col0 + q, ok ? 16 : 0);
        }
        if (tid == 0)
            cp_async4(smem_addr(gl + b), bg + ((size_t)(min(t0 + GDN_C, T) - 1) * Hv + v) * 2 + 1, 4);
    };
    load(0, 0);
    cp_async_commit();

    /* this warp's state tiles: m-tile um (rows d0, d0 + 8), n-tiles un0 .. un0 + TPU - 1 */
    const int ut0 = wid * TPU, um = ut0 / NT, un0 = ut0 % NT, d0 = 16 * um + g;
    const bool owns_u = ut0 < TU;
    float S[TPU][4];
    float *Sg = state + (size_t)v * DK * dv + col0;
    auto put_S = [&]() { /* S -> S^T hi / lo in shared memory */
#pragma unroll
        for (int n = 0; n < TPU; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int col = 8 * (un0 + n) + 2 * t4 + (e & 1), d = d0 + 8 * (e >> 1);
                const uint16_t h = f2bf(S[n][e]);
                Sth[col * SS + d] = h;
                Stl[col * SS + d] = f2bf(S[n][e] - bf2f(h));
            }
    };
    auto store_S = [&](float *dst) { /* S -> a (Hv, DK, dv) state's columns of this block */
#pragma unroll
        for (int n = 0; n < TPU; n++) {
            const int col = 8 * (un0 + n) + 2 * t4;
            *(float2 *)(dst + (size_t)d0 * dv + col) = make_float2(S[n][0], S[n][1]);
            *(float2 *)(dst + (size_t)(d0 + 8) * dv + col) = make_float2(S[n][2], S[n][3]);
        }
    };
    if (owns_u) {
#pragma unroll
        for (int n = 0; n < TPU; n++) {
            const int col = 8 * (un0 + n) + 2 * t4;
            const float2 a = *(const float2 *)(Sg + (size_t)d0 * dv + col);
            const float2 b = *(const float2 *)(Sg + (size_t)(d0 + 8) * dv + col);
            S[n][0] = a.x, S[n][1] = a.y, S[n][2] = b.x, S[n][3] = b.y;
        }
        put_S();
    }
    /* this warp's v_new tiles: m-tile vm, n-tiles vn0 .. */
    const int vt0 = wid * TPV, vm = vt0 / NT, vn0 = vt0 % NT, i0 = 16 * vm + g;
    const bool owns_v = vt0 < TV;

    for (int c = 0; c < nch; c++) {
        const int b = c & 1, t0 = c * GDN_C, L = min(GDN_C, T - t0);
        cp_async_wait_all();
        __syncthreads(); /* chunk c's tiles and S^T in; every warp done with buffer b ^ 1 */
        if (c + 1 < nch) load(c + 1, b ^ 1);
        cp_async_commit();
        const uint16_t *Wh = Ws + b * WTILE, *Wl = Wh + GDN_C * WS, *Kh = Ks + b * KTILE, *Kl = Kh + DK * KS;
        const float *Ub = Us + b * GDN_C * US;
        const float el = expf(gl[b]);
        { /* the chunk's starting state for the output pass */
            constexpr int RW = DK / 8; /* 16-byte words a row */
            for (int idx = tid; idx < 2 * NC * RW; idx += GDN_CT) {
                const int p = idx / (NC * RW), r = idx / RW % NC, q = idx % RW;
                const uint16_t *src = (p ? Stl : Sth) + r * SS + 8 * q;
                *(uint4 *)(h_out + ((((size_t)c * Hv + v) * 2 + p) * dv + col0 + r) * DK + 8 * q) = *(const uint4 *)src;
            }
        }
        if (owns_v) { /* v_new = U - W S */
            float acc[TPV][4], acs[TPV][4];
#pragma unroll
            for (int n = 0; n < TPV; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) acc[n][e] = acs[n][e] = 0.0f;
#pragma unroll 4
            for (int k0 = 0; k0 < DK; k0 += 16)
                mma_split_step<TPV>(acc, acs, Wh, Wl, WS, 16 * vm, Sth, Stl, SS, 8 * vn0, k0);
#pragma unroll
            for (int n = 0; n < TPV; n++) {
                const int col = 8 * (vn0 + n) + 2 * t4;
                const float2 u0 = *(const float2 *)(Ub + i0 * US + col);
                const float2 u1 = *(const float2 *)(Ub + (i0 + 8) * US + col);
                const float x[4] = {u0.x - (acc[n][0] + acs[n][0]), u0.y - (acc[n][1] + acs[n][1]),
                                    u1.x - (acc[n][2] + acs[n][2]), u1.y - (acc[n][3] + acs[n][3])};
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int o = (col + (e & 1)) * VS + i0 + 8 * (e >> 1);
                    const uint16_t h = f2bf(x[e]);
                    Vth[o] = h;
                    Vtl[o] = f2bf(x[e] - bf2f(h));
                }
            }
        }
        __syncthreads(); /* v_new^T complete; S^T read by all */
        {
            constexpr int RW = GDN_C / 8;
            for (int idx = tid; idx < 2 * NC * RW; idx += GDN_CT) {
                const int p = idx / (NC * RW), r = idx / RW % NC, q = idx % RW;
                const uint16_t *src = (p ? Vtl : Vth) + r * VS + 8 * q;
                *(uint4 *)(vn_out + ((((size_t)c * Hv + v) * 2 + p) * dv + col0 + r) * GDN_C + 8 * q) = *(const uint4 *)src;
            }
        }
        if (owns_u) { /* S <- exp(gamma_last) S + (k exp(gamma_last - gamma))^T v_new */
            float Ss[TPU][4];
#pragma unroll
            for (int n = 0; n < TPU; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) S[n][e] *= el, Ss[n][e] = 0.0f;
#pragma unroll
            for (int j0 = 0; j0 < GDN_C; j0 += 16)
                mma_split_step<TPU>(S, Ss, Kh, Kl, KS, 16 * um, Vth, Vtl, VS, 8 * un0, j0);
#pragma unroll
            for (int n = 0; n < TPU; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) S[n][e] += Ss[n][e];
            put_S(); /* every read of the old S^T was before the barrier above */
            for (int i = 0; i < snap.n; i++) /* a checkpoint after this chunk (block-uniform) */
                if (snap.t[i] == t0 + L) store_S(snap.state[i] + (size_t)v * DK * dv + col0);
        }
    }
    if (owns_u) store_S(Sg);
}

/* The output of every chunk at once: block (chunk, value head, NO columns), 8 warps,
 *   o = (q exp(gamma)) S_chunk + A_qk v_new   (64 x NO; k = DK, then the causal 64)
 * on tensor cores (mma_split: q and A_qk split from their fp32 tiles, S and v_new as the chunk
 * pass stored them), o to bf16. Shared: q (64 x DK + pad, fp32), gamma, A_qk (64 x 64 + pad),
 * S^T and v_new^T (hi / lo bf16). Bytes: per block 4 (64 (DK + 64) + NO (DK + 64)) in, 2 x 64 NO
 * out; FLOPs (issued): 3 x 2 T Hv dv (DK + 32). */
template <int DK, int NO>
static __global__ void __launch_bounds__(GDN_CT, 2)
gdn_chunk_o_kernel(uint16_t *o_out, const uint16_t *h_in, const uint16_t *vn_in, const float *a_in,
                   const float *bg, const float *qk, int T, int Hk, int Hv, int dv) {
    grid_launch_dependents(); /* programmatic dependent launch: nothing before the wait */
    grid_dependency_wait();
    constexpr int QS = DK + 8, AS = GDN_C + 8, SS = DK + 8, VS = GDN_C + 8;
    constexpr int NT = NO / 8, TT = 4 * NT, TPW = TT >= 8 ? TT / 8 : 1;
    static_assert(DK % 16 == 0 && NO % 8 == 0 && NT % TPW == 0, "tiling");
    extern __shared__ float4 co_sm[];
    float *Qs = (float *)co_sm, *As = Qs + GDN_C * QS, *gm = As + GDN_C * AS;
    uint16_t *Hth = (uint16_t *)(gm + GDN_C), *Htl = Hth + NO * SS, *Vth = Htl + NO * SS, *Vtl = Vth + NO * VS;
    const int c = blockIdx.x, v = blockIdx.y, col0 = blockIdx.z * NO, kh = v / (Hv / Hk);
    const int tid = threadIdx.x, wid = tid / WARP_SIZE, lane = tid % WARP_SIZE, g = lane / 4, t4 = lane % 4;
    const int key_dim = Hk * DK, t0 = c * GDN_C, L = min(GDN_C, T - t0);
    for (int idx = tid; idx < GDN_C * (DK + GDN_C) / 4; idx += GDN_CT) {
        const int i = idx / ((DK + GDN_C) / 4), q = idx % ((DK + GDN_C) / 4) * 4;
        const bool ok = i < L;
        const size_t r = (size_t)t0 + (ok ? i : 0);
        if (q < DK)
            cp_async16(smem_addr(Qs + i * QS + q), qk + r * 2 * key_dim + kh * DK + q, ok ? 16 : 0);
        else
            cp_async16(smem_addr(As + i * AS + q - DK), a_in + (r * Hv + v) * GDN_C + q - DK, ok ? 16 : 0);
    }
    for (int idx = tid; idx < 2 * NO * (DK + GDN_C) / 8; idx += GDN_CT) {
        const int p = idx / (NO * (DK + GDN_C) / 8), rest = idx % (NO * (DK + GDN_C) / 8);
        const int r = rest / ((DK + GDN_C) / 8), q = rest % ((DK + GDN_C) / 8) * 8;
        const size_t base = (((size_t)c * Hv + v) * 2 + p) * dv + col0 + r;
        if (q < DK)
            cp_async16(smem_addr((p ? Htl : Hth) + r * SS + q), h_in + base * DK + q, 16);
        else
            cp_async16(smem_addr((p ? Vtl : Vth) + r * VS + q - DK), vn_in + base * GDN_C + q - DK, 16);
    }
    if (tid < GDN_C) {
        const bool ok = tid < L;
        cp_async4(smem_addr(gm + tid), bg + ((size_t)(t0 + (ok ? tid : 0)) * Hv + v) * 2 + 1, ok ? 4 : 0);
    }
    cp_async_commit();
    cp_async_wait_all();
    __syncthreads();

    const int tt0 = wid * TPW, mt = tt0 / NT, nt0 = tt0 % NT, i0 = 16 * mt + g;
    if (tt0 >= TT) return;
    const float eq0 = expf(gm[i0]), eq1 = expf(gm[i0 + 8]);
    float acc[TPW][4];
#pragma unroll
    for (int n = 0; n < TPW; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
    const float *q0 = Qs + i0 * QS + 2 * t4, *q1 = q0 + 8 * QS;
#pragma unroll 4
    for (int k0 = 0; k0 < DK; k0 += 16) { /* (q exp(gamma)) S */
        uint32_t ah[4], al[4];
        split_a(ah, al, q0 + k0, q1 + k0, eq0, eq1);
        uint32_t bh[TPW][2], bl[TPW][2];
        ldsm_b<TPW>(bh, Hth, SS, 8 * nt0, k0);
        ldsm_b<TPW>(bl, Htl, SS, 8 * nt0, k0);
#pragma unroll
        for (int n = 0; n < TPW; n++) mma_split(acc[n], ah, al, bh[n][0], bh[n][1], bl[n][0], bl[n][1]);
    }
    const float *a0 = As + i0 * AS + 2 * t4, *a1 = a0 + 8 * AS;
    for (int k0 = 0; k0 <= 16 * mt; k0 += 16) { /* + A_qk v_new (zero above the diagonal) */
        uint32_t ah[4], al[4];
        split_a(ah, al, a0 + k0, a1 + k0);
        uint32_t bh[TPW][2], bl[TPW][2];
        ldsm_b<TPW>(bh, Vth, VS, 8 * nt0, k0);
        ldsm_b<TPW>(bl, Vtl, VS, 8 * nt0, k0);
#pragma unroll
        for (int n = 0; n < TPW; n++) mma_split(acc[n], ah, al, bh[n][0], bh[n][1], bl[n][0], bl[n][1]);
    }
#pragma unroll
    for (int n = 0; n < TPW; n++) {
        const int col = col0 + 8 * (nt0 + n) + 2 * t4;
        if (i0 < L) *(uint32_t *)(o_out + ((size_t)(t0 + i0) * Hv + v) * dv + col) = pack_bf(acc[n][0], acc[n][1]);
        if (i0 + 8 < L) *(uint32_t *)(o_out + ((size_t)(t0 + i0 + 8) * Hv + v) * dv + col) = pack_bf(acc[n][2], acc[n][3]);
    }
}

/* Gated RMSNorm, a warp per (token, value head): out = bf16(bf16(w * bf16(o * rsqrt(mean(o^2) +
 * eps))) * silu(z)) (silu_fast). Bytes: 6 T value_dim; FLOPs: ~10 T value_dim. With conv_state (a prefill
 * call), the blocks before the norm's move the conv ring on: the last (up to) 4 raw inputs into their
 * columns (~4 conv_dim bytes), after every kernel that read the old ring (the conv, the
 * checkpoints' rings). */
static __global__ void gdn_norm_kernel(uint16_t *out, const uint16_t *o_in, const uint16_t *proj,
                                       const float *norm_w, int T, int Hv, int dv, int conv_dim,
                                       size_t row, float eps, uint16_t *conv_state, const int32_t *pos) {
    /* programmatic dependent launch: nothing to do before the wait; the next kernel (the
     * out_proj) may start its weight loads at once */
    grid_launch_dependents();
    grid_dependency_wait();
    const int wid = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    const int ring_blocks = conv_state ? (conv_dim + blockDim.x - 1) / blockDim.x : 0; /* first: */
    if ((int)blockIdx.x < ring_blocks) { /* their dependent loads then hide behind the norm's */
        const int ch = blockIdx.x * blockDim.x + threadIdx.x;
        if (ch >= conv_dim) return;
        uint16_t *st = conv_state + (size_t)ch * 4;
        for (int s = T > 4 ? T - 4 : 0; s < T; s++) st[(*pos + s) & 3] = proj[(size_t)s * row + ch];
        return;
    }
    const int item = (blockIdx.x - ring_blocks) * (blockDim.x / WARP_SIZE) + wid;
    if (item >= T * Hv) return;
    const int t = item / Hv, v = item % Hv;
    const uint16_t *o = o_in + (size_t)item * dv, *zp = proj + (size_t)t * row + conv_dim + (size_t)v * dv;
    uint16_t *op = out + (size_t)t * Hv * dv + (size_t)v * dv;
    constexpr int NJ = 2; /* 4-element words a lane (dv <= 256, dv % 4 == 0: cuda_gdn_norm) */
    uint2 ow[NJ], zw[NJ];
    float ss = 0.0f;
#pragma unroll
    for (int m = 0; m < NJ; m++) {
        const int j = 4 * (lane + WARP_SIZE * m);
        if (j < dv) {
            ow[m] = *(const uint2 *)(o + j), zw[m] = *(const uint2 *)(zp + j);
            const float x[4] = {lo_bf(ow[m].x), hi_bf(ow[m].x), lo_bf(ow[m].y), hi_bf(ow[m].y)};
            ss += x[0] * x[0] + x[1] * x[1] + x[2] * x[2] + x[3] * x[3];
        }
    }
    ss = warp_sum(ss);
    const float rr = 1.0f / sqrtf(ss / (float)dv + eps);
#pragma unroll
    for (int m = 0; m < NJ; m++) {
        const int j = 4 * (lane + WARP_SIZE * m);
        if (j < dv) {
            const float x[4] = {lo_bf(ow[m].x), hi_bf(ow[m].x), lo_bf(ow[m].y), hi_bf(ow[m].y)};
            const float z[4] = {lo_bf(zw[m].x), hi_bf(zw[m].x), lo_bf(zw[m].y), hi_bf(zw[m].y)};
            float r[4];
#pragma unroll
            for (int e = 0; e < 4; e++) r[e] = bfr(norm_w[j + e] * bfr(x[e] * rr)) * silu_fast(z[e]);
            *(uint2 *)(op + j) = make_uint2(pack_bf(r[0], r[1]), pack_bf(r[2], r[3]));
        }
    }
}

/* ---- prefill: a short prompt's delta rule in its recurrent form -----------------------------
 * For T <= GDN_SCAN_MAX tokens the chunked form's three kernels (prep, state pass, outputs) cost
 * more than the recurrence itself: one kernel whose blocks each keep a 16-column slice of one
 * value head's fp32 state in registers (the decode step's thread layout, delta_step) and walk
 * the tokens in order, every token's inputs staged in shared memory first (q, k from the conv
 * kernel's normalised fp32 qk, v from its bf16 output, beta and g from bg). This is cpu.c's
 * recurrence (the chunked form equals it up to fp32 rounding, qwen35-model.md 4.2). A checkpoint
 * inside such a call can only be after all T tokens (they fall on multiples of GDN_C): it takes
 * the final state (run 211, 4B, ops one by one: 418 us a 20-token prompt against 1,151 for the
 * chunked form's three kernels; 531 us at 32 tokens, so the crossover lies past 32, where the
 * 48 KiB of staging without an opt-in also ends near 44). Bytes: 8 Hv dk dv (state read +
 * written) + 4 T (2 key_dim + value_dim) (L2); FLOPs: ~6 T Hv dk dv. */
#define GDN_SCAN_MAX 32
template <int NR, int LPC>
static __global__ void __launch_bounds__(GDN_THREADS)
gdn_scan_kernel(uint16_t *o_out, float *state, const float *qk, const uint16_t *ybuf, const float *bg,
                int T, int Hk, int Hv, int dv, int conv_dim, struct backend_snap snap) {
    grid_launch_dependents(); /* programmatic dependent launch: nothing before the wait */
    grid_dependency_wait();
    constexpr int COLS = GDN_THREADS / LPC, DK = NR * LPC;
    extern __shared__ float sm[]; /* (T, 2, DK) q and k, (T, COLS) v, (T, 2) beta and g */
    float *sqk = sm, *sv = sm + (size_t)T * 2 * DK, *sbg = sv + (size_t)T * COLS;
    const int v = blockIdx.x, col0 = blockIdx.y * COLS, kh = v / (Hv / Hk), tid = threadIdx.x;
    for (int i = tid; i < T * 2 * DK; i += GDN_THREADS) { /* token t: q then k */
        const int t = i / (2 * DK), part = i / DK % 2, d = i % DK;
        sqk[i] = qk[((size_t)t * 2 * Hk + part * Hk + kh) * DK + d];
    }
    for (int i = tid; i < T * COLS; i += GDN_THREADS) {
        const int t = i / COLS;
        sv[i] = bf2f(ybuf[(size_t)t * conv_dim + 2 * Hk * DK + (size_t)v * dv + col0 + i % COLS]);
    }
    for (int i = tid; i < 2 * T; i += GDN_THREADS) sbg[i] = bg[((size_t)(i / 2) * Hv + v) * 2 + i % 2];
    const int wid = tid / WARP_SIZE, lane = tid % WARP_SIZE, c = lane / LPC, rg = lane % LPC;
    const int cl = wid * (WARP_SIZE / LPC) + c, col = col0 + cl;
    float *Sg = state + (size_t)v * DK * dv + col;
    float S[NR];
#pragma unroll
    for (int m = 0; m < NR; m++) S[m] = Sg[(size_t)(rg + LPC * m) * dv];
    __syncthreads();
    for (int t = 0; t < T; t++) {
        const float *q = sqk + (size_t)t * 2 * DK, *k = q + DK;
        const float o = delta_step<NR, LPC>(S, k, q, expf(sbg[2 * t + 1]), sbg[2 * t], sv[t * COLS + cl], rg);
        if (rg == 0) o_out[((size_t)t * Hv + v) * dv + col] = f2bf(o);
    }
#pragma unroll
    for (int m = 0; m < NR; m++) Sg[(size_t)(rg + LPC * m) * dv] = S[m];
    for (int i = 0; i < snap.n; i++) /* checkpoints after the call's T tokens (gdn_scan_ok) */
#pragma unroll
        for (int m = 0; m < NR; m++) snap.state[i][(size_t)v * DK * dv + col + (size_t)(rg + LPC * m) * dv] = S[m];
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
    auto kern = rows.blocks ? gdn_step_kernel<DK / LPC, LPC, true, 0>
                : dv == 128 ? gdn_step_kernel<DK / LPC, LPC, false, 128> : gdn_step_kernel<DK / LPC, LPC, false, 0>;
    gpu_launch(cu->pdl, kern, grid, dim3(GDN_THREADS), 0, cu->stream, obuf,
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
    if (c->linear_value_head_dim == 128)
        return step_lpc(cu, c) == 4 ? gpu_kernel_regs(gdn_step_kernel<DK / 4, 4, false, 128>)
                                    : gpu_kernel_regs(gdn_step_kernel<DK / 8, 8, false, 128>);
    return step_lpc(cu, c) == 4 ? gpu_kernel_regs(gdn_step_kernel<DK / 4, 4, false, 0>)
                                : gpu_kernel_regs(gdn_step_kernel<DK / 8, 8, false, 0>);
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
    cuda_gdn_norm(cu, c, out, proj, norm_w, B, NULL, NULL);
}

/* State columns per block of the chunk pass: 32 where that still gives ~an SM's worth of blocks
 * (4B / 9B: 128 blocks), else 16 (0.8B / 2B: 128 blocks instead of 64). (A block of 16 does half
 * a block of 32's arithmetic per chunk but loads the same W and k tiles.) */
template <int DK>
static int chunk_cols(const struct cuda *cu, const struct config *c) {
    const int dv = c->linear_value_head_dim, Hv = c->linear_num_value_heads;
    if (dv % 32) return 16;
    return (long)Hv * (dv / 32) * 4 >= (long)cu->info.n_sm * 3 ? 32 : 16;
}

template <int DK, int NC>
static void launch_chunk_h(struct cuda *cu, const struct config *c, float *state, int T,
                           const struct backend_snap &snap) {
    const int Hv = c->linear_num_value_heads, dv = c->linear_value_head_dim;
    CHECK(dv % NC == 0);
    const size_t smem = ((size_t)2 * GDN_C * (NC + 8) + 4) * sizeof(float) +
                        ((size_t)2 * (2 * GDN_C * (DK + 8) + 2 * DK * (GDN_C + 8)) +
                         2 * NC * ((DK + 8) + (GDN_C + 8))) * sizeof(uint16_t);
    static int opted;
    if (!opted && smem > 48 * 1024) GPU_SMEM_OPTIN((gdn_chunk_h_kernel<DK, NC>), smem);
    opted = 1;
    gpu_launch(cu->pdl, gdn_chunk_h_kernel<DK, NC>, dim3(Hv, dv / NC), dim3(GDN_CT), smem, cu->stream,
               cu->gdn_h, cu->gdn_vn, state, cu->gdn_w, cu->gdn_kd, cu->gdn_u, cu->gdn_bg, T, Hv, dv, snap);
}

template <int DK, int NO>
static void launch_chunk_o(struct cuda *cu, const struct config *c, int T) {
    const int Hv = c->linear_num_value_heads, dv = c->linear_value_head_dim;
    CHECK(dv % NO == 0);
    const size_t smem = (size_t)GDN_C * ((DK + 8) + (GDN_C + 8) + 1) * sizeof(float) +
                        (size_t)2 * NO * ((DK + 8) + (GDN_C + 8)) * sizeof(uint16_t);
    static int opted;
    if (!opted && smem > 48 * 1024) GPU_SMEM_OPTIN((gdn_chunk_o_kernel<DK, NO>), smem);
    opted = 1;
    gpu_launch(cu->pdl, gdn_chunk_o_kernel<DK, NO>, dim3((T + GDN_C - 1) / GDN_C, Hv, dv / NO), dim3(GDN_CT),
               smem, cu->stream, cu->gdn_o, cu->gdn_h, cu->gdn_vn, cu->gdn_a, cu->gdn_bg, cu->gdn_qk, T,
               c->linear_num_key_heads, Hv, dv);
}

template <int DK>
static void launch_chunked(struct cuda *cu, const struct config *c, float *state, int T,
                           const struct backend_snap &snap) {
    const int Hv = c->linear_num_value_heads;
    CHECK(c->linear_value_head_dim == DK); /* dk == dv (backend_cuda_create) */
    const size_t smem = ((size_t)2 * GDN_C * (DK + GDN_PAD) + GDN_C * (GDN_C + GDN_PAD) + 4 * GDN_C) *
                        sizeof(float);
    static int opted;
    if (!opted && smem > 48 * 1024) GPU_SMEM_OPTIN((gdn_chunk_prep_kernel<DK, DK>), smem);
    opted = 1;
    gpu_launch(cu->pdl, gdn_chunk_prep_kernel<DK, DK>, dim3((T + GDN_C - 1) / GDN_C, Hv), dim3(GDN_CT), smem,
               cu->stream, cu->gdn_w, cu->gdn_kd, cu->gdn_u, cu->gdn_a, cu->gdn_bg, cu->gdn_qk, cu->gdn_y, T,
               c->linear_num_key_heads, Hv, c->conv_dim);
    cuda_prof_split(cu, "gdn chunk state pass (prefill)");
    if (chunk_cols<DK>(cu, c) == 32)
        launch_chunk_h<DK, 32>(cu, c, state, T, snap);
    else
        launch_chunk_h<DK, 16>(cu, c, state, T, snap);
    cuda_prof_split(cu, "gdn chunk output (prefill)");
    if (c->linear_value_head_dim % 64 == 0)
        launch_chunk_o<DK, 64>(cu, c, T);
    else
        launch_chunk_o<DK, 32>(cu, c, T);
}

/* The recurrent form for a short call (gdn_scan_kernel): shared memory for its T tokens' inputs,
 * or 0 when the chunked form takes the call (longer, or past 48 KiB). */
static size_t gdn_scan_smem(const struct config *c, int T) {
    const int dk = c->linear_key_head_dim, dv = c->linear_value_head_dim, cols = GDN_THREADS / 8;
    if (T > GDN_SCAN_MAX || dk % 8 || dv % cols) return 0;
    const size_t smem = (size_t)T * (2 * dk + cols + 2) * sizeof(float);
    return smem <= 48 * 1024 ? smem : 0;
}
template <int DK>
static void launch_scan(struct cuda *cu, const struct config *c, float *state, int T,
                        const struct backend_snap &snap, size_t smem) {
    const int Hv = c->linear_num_value_heads, dv = c->linear_value_head_dim;
    gpu_launch(cu->pdl, gdn_scan_kernel<DK / 8, 8>, dim3(Hv, dv / (GDN_THREADS / 8)), dim3(GDN_THREADS), smem,
               cu->stream, cu->gdn_o, state, (const float *)cu->gdn_qk, (const uint16_t *)cu->gdn_y,
               (const float *)cu->gdn_bg, T, c->linear_num_key_heads, Hv, dv, c->conv_dim, snap);
    cu->n_launches++;
}

static void launch_conv(struct cuda *cu, const struct config *c, const uint16_t *proj, const uint16_t *conv_state,
                        const uint16_t *conv_w, const float *A_log, const float *dt_bias, const int32_t *pos,
                        int T) {
    const int Hk = c->linear_num_key_heads, Hv = c->linear_num_value_heads, dk = c->linear_key_head_dim;
    const int conv_dim = c->conv_dim, span = GDN_CONV_TT * GDN_CONV_WARPS;
    const dim3 grid(conv_dim / dk + 1, (T + span - 1) / span), block(GDN_CONV_WARPS * WARP_SIZE);
    switch (dk) {
    case 32:
        gpu_launch(cu->pdl, gdn_conv_kernel<1>, grid, block, 0, cu->stream, cu->gdn_y, cu->gdn_qk, cu->gdn_bg,
                   proj, conv_state, conv_w, A_log, dt_bias, pos, T, Hk, Hv, dk, conv_dim, c->value_dim);
        break;
    case 64:
        gpu_launch(cu->pdl, gdn_conv_kernel<2>, grid, block, 0, cu->stream, cu->gdn_y, cu->gdn_qk, cu->gdn_bg,
                   proj, conv_state, conv_w, A_log, dt_bias, pos, T, Hk, Hv, dk, conv_dim, c->value_dim);
        break;
    case 128:
        gpu_launch(cu->pdl, gdn_conv_kernel<4>, grid, block, 0, cu->stream, cu->gdn_y, cu->gdn_qk, cu->gdn_bg,
                   proj, conv_state, conv_w, A_log, dt_bias, pos, T, Hk, Hv, dk, conv_dim, c->value_dim);
        break;
    default: CHECK(!"unsupported linear_key_head_dim");
    }
}

extern "C" void cuda_gdn_prefill(struct cuda *cu, const struct config *c, uint16_t *out,
                                 const uint16_t *proj, uint16_t *conv_state, const uint16_t *conv_w,
                                 const float *A_log, const float *dt_bias, const float *norm_w,
                                 float *state, const int32_t *pos, int T,
                                 const struct backend_snap *snap_p) {
    int Hv = c->linear_num_value_heads, dk = c->linear_key_head_dim, conv_dim = c->conv_dim;
    size_t row = (size_t)conv_dim + c->value_dim + 2 * Hv;
    CHECK(conv_dim % dk == 0 && c->linear_conv_kernel_dim == 4);
    struct backend_snap snap = {};
    if (snap_p) snap = *snap_p;
    CHECK(snap.n >= 0 && snap.n <= BACKEND_MAX_SNAPS);
    for (int i = 0; i < snap.n; i++)
        CHECK(snap.t[i] > (i ? snap.t[i - 1] : 0) && snap.t[i] <= T && (snap.t[i] % GDN_C == 0 || snap.t[i] == T));
    launch_conv(cu, c, proj, conv_state, conv_w, A_log, dt_bias, pos, T);
    if (snap.n) {
        gpu_launch(cu->pdl, gdn_conv_snap_kernel, dim3((conv_dim + 255) / 256, snap.n), dim3(256), 0,
                   cu->stream, snap, (const uint16_t *)conv_state, proj, pos, conv_dim, row);
        cu->n_launches++;
    }
    const size_t scan_smem = gdn_scan_smem(c, T);
    if (scan_smem) {
        cuda_prof_split(cu, "gdn scan (prefill, short)");
        for (int i = 0; i < snap.n; i++) CHECK(snap.t[i] == T); /* T < GDN_C */
        switch (dk) {
        case 32: launch_scan<32>(cu, c, state, T, snap, scan_smem); break;
        case 64: launch_scan<64>(cu, c, state, T, snap, scan_smem); break;
        case 128: launch_scan<128>(cu, c, state, T, snap, scan_smem); break;
        default: CHECK(!"unsupported linear_key_head_dim");
        }
        cu->n_launches += 1; /* the conv (launch_scan counts its own) */
    } else {
        cuda_prof_split(cu, "gdn chunk prep (prefill)");
        switch (dk) {
        case 32: launch_chunked<32>(cu, c, state, T, snap); break;
        case 64: launch_chunked<64>(cu, c, state, T, snap); break;
        case 128: launch_chunked<128>(cu, c, state, T, snap); break;
        default: CHECK(!"unsupported linear_key_head_dim");
        }
        cu->n_launches += 4; /* the conv, prep, state pass, outputs */
    }
    cuda_prof_split(cu, "gdn norm (prefill)");
    cuda_gdn_norm(cu, c, out, proj, norm_w, T, conv_state, pos);
}

extern "C" void cuda_gdn_norm(struct cuda *cu, const struct config *c, uint16_t *out,
                              const uint16_t *proj, const float *norm_w, int T, uint16_t *conv_state,
                              const int32_t *pos) {
    int Hv = c->linear_num_value_heads, dv = c->linear_value_head_dim, conv_dim = c->conv_dim;
    size_t row = (size_t)conv_dim + c->value_dim + 2 * Hv;
    CHECK(dv % 4 == 0 && dv <= 256 && row % 4 == 0); /* the kernel's 8-byte words */
    const int blocks = (T * Hv + 7) / 8 + (conv_state ? (conv_dim + 255) / 256 : 0);
    gpu_launch(cu->pdl, gdn_norm_kernel, dim3(blocks), dim3(256), 0, cu->stream, out,
               (const uint16_t *)cu->gdn_o, proj, norm_w, T, Hv, dv, conv_dim, row, c->rms_norm_eps,
               conv_state, pos);
    GPU_LAUNCHED();
    cu->n_launches++;
}

extern "C" int cuda_gdn_chunk(void) { return GDN_C; }
