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
 * Decode: one fused kernel per layer. Each block recomputes the conv of its key head's q/k
 * channels (cheap) and its own 16 value channels; the last block of a key head's group to finish
 * (an atomic counter, re-armed by that block) writes the q/k conv state, which the others have
 * read by then, and applies the gated RMSNorm for the group's value heads.
 * Prefill: conv+norms+gates for every token in parallel, the conv state update, a scan over the
 * tokens per block with the state in registers, then the gated RMSNorm. */
#include "kernels.h"

#define GDN_COLS 16     /* value columns per block */
#define GDN_THREADS 128 /* 4 warps x 4 columns x 8 lanes */
#define GDN_CHUNK 32    /* tokens staged in shared memory per scan round */

static __device__ __forceinline__ float softplus_f(float u) { return u > 20.0f ? u : log1pf(expf(u)); }

/* two sums over the 128 threads at once (each in block_sum128's order); red: 8 floats */
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

static __device__ __forceinline__ float block_sum128(float v, float *red) {
    /* sum over the 128 threads of a block; red: 4 floats of shared memory */
    const int wid = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) red[wid] = v;
    __syncthreads();
    return red[0] + red[1] + red[2] + red[3];
}

/* One delta-rule step for this thread's column: S (NR rows held here, rows rg + 8 m) <- decayed
 * and updated; returns o_j (valid in every lane of the column's 8-lane group). */
template <int NR>
static __device__ __forceinline__ float delta_step(float (&S)[NR], const float *k, const float *q,
                                                   float dec, float beta, float vj, int rg) {
    float u = 0.0f;
#pragma unroll
    for (int m = 0; m < NR; m++) {
        S[m] *= dec;                 /* S <- exp(g) S */
        u += S[m] * k[rg + 8 * m];   /* u = S^T k */
    }
    u = group_sum(u, 8);
    const float delta = beta * (vj - u);
    float o = 0.0f;
#pragma unroll
    for (int m = 0; m < NR; m++) {
        S[m] = S[m] + k[rg + 8 * m] * delta; /* S += k delta^T */
        o += S[m] * q[rg + 8 * m];           /* o = S^T q */
    }
    return group_sum(o, 8);
}

/* The q/k channels' conv state after the step: [s1 s2 s3 x], from the window each block of the
 * key head's group holds in registers (the last block to finish writes it: every block has
 * read the old state by then). */
template <int QIT>
static __device__ __forceinline__ void conv_shift_qk(uint16_t *conv_state,
                                                     const uint16_t (&win)[2][QIT][4], int tid,
                                                     int dk, int key_dim, int kh) {
#pragma unroll
    for (int it = 0; it < QIT; it++) {
        int i = tid + it * GDN_THREADS;
        if (i >= dk) continue;
#pragma unroll
        for (int part = 0; part < 2; part++) {
            uint2 v;
            v.x = (uint32_t)win[part][it][0] | (uint32_t)win[part][it][1] << 16;
            v.y = (uint32_t)win[part][it][2] | (uint32_t)win[part][it][3] << 16;
            *(uint2 *)(conv_state + (size_t)(part * key_dim + kh * dk + i) * 4) = v;
        }
    }
}

/* ---- decode --------------------------------------------------------------------------------
 * Bytes: 8 Hv dk dv (state read + written) + ~2 (conv_dim + value_dim) * 5 (conv window, x, z);
 * FLOPs: ~6 Hv dk dv. */
template <int NR>
static __global__ void __launch_bounds__(GDN_THREADS)
gdn_step_kernel(uint16_t *out, const uint16_t *proj, uint16_t *conv_state, const uint16_t *conv_w,
                const float *A_log, const float *dt_bias, const float *norm_w, float *state,
                float *ostep, int *counters, int Hk, int Hv, int dv, float eps) {
    const int dk = NR * 8;
    __shared__ float sq[NR * 8], sk[NR * 8], sv[GDN_COLS], red[8];
    __shared__ float sbeta, sdec;
    __shared__ int last;
    const int v = blockIdx.x, col0 = blockIdx.y * GDN_COLS, nsplit = gridDim.y;
    const int r = Hv / Hk, kh = v / r;
    const int key_dim = Hk * dk, conv_dim = 2 * key_dim + Hv * dv, value_dim = Hv * dv;
    const int tid = threadIdx.x;

    /* 0. before the wait (programmatic dependent launch): everything that does not depend on
     * the in_proj GEMV before this kernel. This thread's state column, the conv taps over the
     * cached window (acc = w0 s1 + w1 s2 + w2 s3, the w3 x term added once x is there, so the
     * sum is formed in the same order as before), the gate constants. */
    grid_launch_dependents();
    const int wid = tid / WARP_SIZE, lane = tid % WARP_SIZE, c = lane / 8, rg = lane % 8;
    const int cl = wid * 4 + c, col = col0 + cl;
    float *Sg = state + (size_t)v * dk * dv + col;
    float S[NR];
#pragma unroll
    for (int m = 0; m < NR; m++) S[m] = Sg[(size_t)(rg + 8 * m) * dv];

    constexpr int QIT = (NR * 8 + GDN_THREADS - 1) / GDN_THREADS;
    float qy[QIT], ky[QIT], w3[2][QIT];
    uint16_t win[2][QIT][4]; /* the q/k conv window: s1 s2 s3 (x once it is there) */
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
            win[part][it][0] = st[1];
            win[part][it][1] = st[2];
            win[part][it][2] = st[3];
            float acc = 0.0f;
            acc += bf2f(w[0]) * bf2f(win[part][it][0]);
            acc += bf2f(w[1]) * bf2f(win[part][it][1]);
            acc += bf2f(w[2]) * bf2f(win[part][it][2]);
            w3[part][it] = bf2f(w[3]);
            if (part == 0) qy[it] = acc; else ky[it] = acc;
        }
    }
    uint16_t vs1 = 0, vs2 = 0, vs3 = 0;
    float vacc = 0.0f, vw3 = 0.0f;
    if (tid < GDN_COLS) {
        int ch = 2 * key_dim + v * dv + col0 + tid;
        const uint16_t *st = conv_state + (size_t)ch * 4;
        const uint16_t *w = conv_w + (size_t)ch * 4;
        vs1 = st[1];
        vs2 = st[2];
        vs3 = st[3];
        vacc += bf2f(w[0]) * bf2f(vs1);
        vacc += bf2f(w[1]) * bf2f(vs2);
        vacc += bf2f(w[2]) * bf2f(vs3);
        vw3 = bf2f(w[3]);
    }
    const float gA = tid == 0 ? -expf(A_log[v]) : 0.0f, gdt = tid == 0 ? dt_bias[v] : 0.0f;
    const bool fast_norm = dv == GDN_THREADS && r <= 4;
    const float nw = fast_norm ? norm_w[tid] : 0.0f;
    grid_dependency_wait();
    /* z of the group's value heads, for the block that will apply the gated norm: loaded now,
     * off the path the last block takes */
    float zz[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (fast_norm)
#pragma unroll
        for (int i = 0; i < 4; i++)
            if (i < r) zz[i] = bf2f(proj[conv_dim + (size_t)(kh * r + i) * dv + tid]);

    /* 1. conv + SiLU of the key head's q and k channels, L2 norms (window [s1 s2 s3 x]) */
    float ssq = 0.0f, ssk = 0.0f;
#pragma unroll
    for (int it = 0; it < QIT; it++) {
        int i = tid + it * GDN_THREADS;
        if (i >= dk) continue;
#pragma unroll
        for (int part = 0; part < 2; part++) {
            int ch = part * key_dim + kh * dk + i;
            float acc = part == 0 ? qy[it] : ky[it];
            win[part][it][3] = proj[ch];
            acc += w3[part][it] * bf2f(win[part][it][3]);
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
    block_sum128x2(ssq, ssk, red);
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
    /* 2. this block's value channels (owned by this block alone: update their conv state) */
    if (tid < GDN_COLS) {
        int ch = 2 * key_dim + v * dv + col0 + tid;
        uint16_t *st = conv_state + (size_t)ch * 4;
        uint16_t x = proj[ch];
        float acc = vacc;
        acc += vw3 * bf2f(x);
        sv[tid] = bfr(silu_f(bfr(acc)));
        st[0] = vs1;
        st[1] = vs2;
        st[2] = vs3;
        st[3] = x;
    }
    /* 3. gates */
    if (tid == 0) {
        float b = bf2f(proj[conv_dim + value_dim + v]), a = bf2f(proj[conv_dim + value_dim + Hv + v]);
        sbeta = bfr(sigmoid_f(b)); /* HF: b.sigmoid() in bf16 */
        float g = gA * softplus_f(a + gdt);
        sdec = expf(g);
    }
    __syncthreads();

    /* 4. the delta rule on this thread's column */
    float o = delta_step<NR>(S, sk, sq, sdec, sbeta, sv[cl], rg);
    if (rg == 0) ostep[(size_t)v * dv + col] = o;

    /* 5. the last block of this key head's group: q/k conv state, gated RMSNorm. The fence
     * before the counter covers only o; the state goes back after it (by kernel end) */
    fence_device();
    __syncthreads();
    if (tid == 0) last = atomicAdd(&counters[kh], 1) == r * nsplit - 1;
    __syncthreads();
#pragma unroll
    for (int m = 0; m < NR; m++) Sg[(size_t)(rg + 8 * m) * dv] = S[m];
    if (!last) return;
    fence_device();
    if (fast_norm) {
        /* thread j owns column j of every head of the group: all loads issued before the sums */
        float ob[4];
        const float w = nw;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            if (i >= r) break;
            ob[i] = bfr(load_coherent(ostep + (size_t)(kh * r + i) * dv + tid));
        }
        conv_shift_qk(conv_state, win, tid, dk, key_dim, kh);
        float ss[4];
#pragma unroll
        for (int i = 0; i < 4; i += 2) { /* the heads' sums of squares two at a time */
            if (i >= r) break;
            ss[i] = ob[i] * ob[i];
            ss[i + 1] = i + 1 < r ? ob[i + 1] * ob[i + 1] : 0.0f;
            block_sum128x2(ss[i], ss[i + 1], red);
        }
#pragma unroll
        for (int i = 0; i < 4; i++) {
            if (i >= r) break;
            const float rr = 1.0f / sqrtf(ss[i] / (float)dv + eps);
            float n = bfr(ob[i] * rr);
            float wn = bfr(w * n);
            out[(size_t)(kh * r + i) * dv + tid] = f2bf(wn * silu_f(zz[i])); /* HF: norm(o, z) */
        }
        if (tid == 0) counters[kh] = 0;
        return;
    }
    conv_shift_qk(conv_state, win, tid, dk, key_dim, kh);
    for (int vv = kh * r; vv < kh * r + r; vv++) {
        float ss = 0.0f;
        for (int j = tid; j < dv; j += GDN_THREADS) {
            float ob = bfr(load_coherent(ostep + (size_t)vv * dv + j));
            ss += ob * ob;
        }
        ss = block_sum128(ss, red);
        const float rr = 1.0f / sqrtf(ss / (float)dv + eps);
        for (int j = tid; j < dv; j += GDN_THREADS) {
            float ob = bfr(load_coherent(ostep + (size_t)vv * dv + j));
            float n = bfr(ob * rr);
            float w = bfr(norm_w[j] * n);
            float z = bf2f(proj[conv_dim + (size_t)vv * dv + j]);
            out[(size_t)vv * dv + j] = f2bf(w * silu_f(z)); /* HF: norm(core_attn_out, z) */
        }
    }
    if (tid == 0) counters[kh] = 0;
}

/* ---- prefill -------------------------------------------------------------------------------- */

/* Conv + SiLU for token t and one dk-wide head of channels (blockIdx.x < conv_dim / dk), then
 * for q/k heads the L2 norm; the extra block row blockIdx.x == conv_dim / dk computes beta and g.
 * Bytes: ~2 T conv_dim (x) * 4 (window) + 4 T (2 key_dim) + 2 T value_dim; FLOPs: ~12 T conv_dim. */
static __global__ void gdn_conv_kernel(uint16_t *ybuf, float *qk, float *bg, const uint16_t *proj,
                                       const uint16_t *conv_state, const uint16_t *conv_w,
                                       const float *A_log, const float *dt_bias, int Hk, int Hv,
                                       int dk, int conv_dim, int value_dim) {
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
        int s = t - 3 + j; /* sequence index of this tap's input; < 0: from the cached window */
        float e = s >= 0 ? bf2f(proj[(size_t)s * row + ch]) : bf2f(conv_state[(size_t)ch * 4 + 4 + s]);
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

/* New conv state: the last 4 raw inputs of [old state, x_0 .. x_{T-1}]. Bytes: ~16 conv_dim. */
static __global__ void gdn_conv_state_kernel(uint16_t *conv_state, const uint16_t *proj, int T,
                                             int conv_dim, size_t row) {
    int ch = blockIdx.x * blockDim.x + threadIdx.x;
    if (ch >= conv_dim) return;
    uint16_t *st = conv_state + (size_t)ch * 4;
    uint16_t e[4];
#pragma unroll
    for (int j = 0; j < 4; j++) {
        int s = T - 4 + j;
        e[j] = s >= 0 ? proj[(size_t)s * row + ch] : st[4 + s];
    }
#pragma unroll
    for (int j = 0; j < 4; j++) st[j] = e[j];
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
            float o = delta_step<NR>(S, sk[tt], sq[tt], sd[tt], sb[tt], sv[tt][cl], rg);
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

template <int NR>
static void launch_step(struct cuda *cu, const struct config *c, uint16_t *out, const uint16_t *proj,
                        uint16_t *conv_state, const uint16_t *conv_w, const float *A_log,
                        const float *dt_bias, const float *norm_w, float *state) {
    int Hv = c->linear_num_value_heads, dv = c->linear_value_head_dim;
    gpu_launch(cu->pdl, gdn_step_kernel<NR>, dim3(Hv, dv / GDN_COLS), dim3(GDN_THREADS), 0,
               cu->stream, out, proj, conv_state, conv_w, A_log, dt_bias, norm_w, state,
               cu->gdn_ostep, cu->counters + 8, c->linear_num_key_heads, Hv, dv, c->rms_norm_eps);
    cu->n_launches++;
}

extern "C" void cuda_gdn_step(struct cuda *cu, const struct config *c, uint16_t *out,
                              const uint16_t *proj, uint16_t *conv_state, const uint16_t *conv_w,
                              const float *A_log, const float *dt_bias, const float *norm_w,
                              float *state) {
    CHECK(c->linear_value_head_dim % GDN_COLS == 0 && c->linear_num_key_heads <= 240);
    switch (c->linear_key_head_dim) {
    case 32: launch_step<4>(cu, c, out, proj, conv_state, conv_w, A_log, dt_bias, norm_w, state); break;
    case 64: launch_step<8>(cu, c, out, proj, conv_state, conv_w, A_log, dt_bias, norm_w, state); break;
    case 128: launch_step<16>(cu, c, out, proj, conv_state, conv_w, A_log, dt_bias, norm_w, state); break;
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
                                 float *state, int T) {
    int Hk = c->linear_num_key_heads, Hv = c->linear_num_value_heads;
    int dk = c->linear_key_head_dim, dv = c->linear_value_head_dim, conv_dim = c->conv_dim;
    size_t row = (size_t)conv_dim + c->value_dim + 2 * Hv;
    CHECK(dv % GDN_COLS == 0 && conv_dim % dk == 0 && dk <= 1024);
    gdn_conv_kernel<<<dim3(conv_dim / dk + 1, T), dk, 0, cu->stream>>>(
        cu->gdn_y, cu->gdn_qk, cu->gdn_bg, proj, conv_state, conv_w, A_log, dt_bias, Hk, Hv, dk,
        conv_dim, c->value_dim);
    GPU_LAUNCHED();
    gdn_conv_state_kernel<<<(conv_dim + 255) / 256, 256, 0, cu->stream>>>(conv_state, proj, T,
                                                                          conv_dim, row);
    GPU_LAUNCHED();
    switch (dk) {
    case 32: launch_scan<4>(cu, c, state, T); break;
    case 64: launch_scan<8>(cu, c, state, T); break;
    case 128: launch_scan<16>(cu, c, state, T); break;
    default: CHECK(!"unsupported linear_key_head_dim");
    }
    int items = T * Hv;
    gdn_norm_kernel<<<(items + 7) / 8, 256, 0, cu->stream>>>(out, cu->gdn_o, proj, norm_w, T, Hv, dv,
                                                             conv_dim, row, c->rms_norm_eps);
    GPU_LAUNCHED();
    cu->n_launches += 4;
}
