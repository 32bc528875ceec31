/* attention.cu - gated full attention after the projections (qwen35-model.md 3.3-3.4), as
 * cpu.c's cpu_attention: per-head zero-centred q/k RMSNorm, partial NeoX RoPE with bf16 cos/sin
 * (tables built at creation exactly as the CPU computes them), K/V appended to the bf16 cache at
 * *pos, causal GQA softmax attention in fp32, then bf16(o) * bf16(sigmoid(gate)).
 *
 * Decode uses split-KV (flash-decoding): a fixed grid of (nKV, splits) blocks whose chunk size
 * follows *pos on the device, so one captured graph serves every position and any context;
 * a second kernel merges the partial softmaxes. Prefill gives each (token, KV head) a warp that
 * walks its keys with an online softmax for the G query heads sharing that KV head. The
 * softmax is online (rescaled running sums) rather than cpu.c's two passes: equal up to fp32
 * rounding. */
#include "kernels.h"

#define ATTN_WARPS 8

/* q/k norm + RoPE + cache append; one warp per (token, head) for nH query heads then nKV key
 * heads. Bytes: ~2 T (nH + 2 nKV) hd * 2 (read + write); FLOPs: ~10 T (nH + nKV) hd. */
static __global__ void attn_prep_kernel(uint16_t *q_out, const uint16_t *qkv, const uint16_t *q_norm,
                                        const uint16_t *k_norm, uint16_t *k_cache,
                                        uint16_t *v_cache, const uint16_t *rope_cos,
                                        const uint16_t *rope_sin, const int32_t *pos, int T,
                                        int nH, int nKV, int hd, int rot, int max_ctx, float eps) {
    __shared__ float s[ATTN_WARPS][512];
    grid_launch_dependents();
    grid_dependency_wait(); /* qkv comes from the GEMV before */
    const int wid = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    const int item = blockIdx.x * ATTN_WARPS + wid;
    const int heads = nH + nKV;
    if (item >= T * heads) return;
    const int t = item / heads, h = item % heads;
    const int p = *pos + t;
    if (p >= max_ctx) return; /* model.c stops at a full context; never write past the cache */
    const size_t row = (size_t)2 * nH * hd + (size_t)2 * nKV * hd;
    const uint16_t *src, *w;
    uint16_t *dst;
    if (h < nH) {
        src = qkv + t * row + (size_t)h * 2 * hd;
        w = q_norm;
        dst = q_out + ((size_t)t * nH + h) * hd;
    } else {
        int kh = h - nH;
        src = qkv + t * row + (size_t)2 * nH * hd + (size_t)kh * hd;
        w = k_norm;
        dst = k_cache + ((size_t)kh * max_ctx + p) * hd;
        const uint16_t *vsrc = src + (size_t)nKV * hd;
        uint16_t *vdst = v_cache + ((size_t)kh * max_ctx + p) * hd;
        for (int d = lane; d < hd; d += WARP_SIZE) vdst[d] = vsrc[d];
    }
    float ss = 0.0f;
    for (int d = lane; d < hd; d += WARP_SIZE) {
        float v = bf2f(src[d]);
        ss += v * v;
    }
    ss = warp_sum(ss);
    const float r = 1.0f / sqrtf(ss / (float)hd + eps);
    for (int d = lane; d < hd; d += WARP_SIZE)
        s[wid][d] = bfr(bf2f(src[d]) * r * (1.0f + bf2f(w[d]))); /* HF: q_norm / k_norm */
    __syncwarp();
    const int half = rot / 2;
    for (int d = lane; d < hd; d += WARP_SIZE) {
        float v = s[wid][d];
        if (d < rot) {
            int j = d < half ? d : d - half;
            float c = bf2f(rope_cos[(size_t)p * half + j]), sn = bf2f(rope_sin[(size_t)p * half + j]);
            if (d < half)
                v = bfr(bfr(v * c) + bfr(-s[wid][d + half] * sn));
            else
                v = bfr(bfr(v * c) + bfr(s[wid][d - half] * sn));
        }
        dst[d] = f2bf(v);
    }
}

/* Online-softmax attention of G query heads (values in qv, 8 dims per lane) over keys [a, b)
 * of one KV head; keys four at a time so their loads are in flight together. */
template <int G>
static __device__ __forceinline__ void attend_range(const float (&qv)[G][8], const uint16_t *kc,
                                                    const uint16_t *vc, int hd, int a, int b,
                                                    float scale, float (&m)[G], float (&l)[G],
                                                    float (&acc)[G][8]) {
    const int lane = threadIdx.x % WARP_SIZE;
    const bool on = lane * 8 < hd;
    const uint4 zero = make_uint4(0, 0, 0, 0);
    for (int j = a; j < b; j += 4) {
        uint4 kk[4], vv[4];
#pragma unroll
        for (int u = 0; u < 4; u++) {
            bool ok = on && j + u < b;
            kk[u] = ok ? *(const uint4 *)(kc + (size_t)(j + u) * hd + lane * 8) : zero;
            vv[u] = ok ? *(const uint4 *)(vc + (size_t)(j + u) * hd + lane * 8) : zero;
        }
#pragma unroll
        for (int u = 0; u < 4; u++) {
            if (j + u >= b) break; /* warp-uniform */
            float kf[8], vf[8];
            unpack8(kk[u], kf);
            unpack8(vv[u], vf);
#pragma unroll
            for (int gi = 0; gi < G; gi++) {
                float d = 0.0f;
#pragma unroll
                for (int e = 0; e < 8; e++) d += qv[gi][e] * kf[e];
                float sc = warp_sum(d) * scale;
                float mn = fmaxf(m[gi], sc);
                float corr = expf(m[gi] - mn), pr = expf(sc - mn);
                l[gi] = l[gi] * corr + pr;
#pragma unroll
                for (int e = 0; e < 8; e++) acc[gi][e] = acc[gi][e] * corr + pr * vf[e];
                m[gi] = mn;
            }
        }
    }
}

/* Split-KV decode: block (kv head, split) covers a chunk of the positions 0 .. *pos; its 8 warps
 * take contiguous sub-chunks and merge in shared memory; the block writes (acc, max, sum) per
 * query head. Bytes: 4 nKV (pos + 1) hd (K and V read once); FLOPs: 4 nH (pos + 1) hd. */
template <int G>
static __global__ void __launch_bounds__(ATTN_WARPS *WARP_SIZE)
attn_decode_kernel(float *part, const uint16_t *q, const uint16_t *k_cache,
                   const uint16_t *v_cache, const int32_t *pos, int nsplit, int hd, int max_ctx,
                   float scale) {
    extern __shared__ float sm[]; /* (ATTN_WARPS, G, hd + 2) */
    const int kvh = blockIdx.x, split = blockIdx.y;
    const int wid = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    int n = *pos + 1;
    if (n > max_ctx) n = max_ctx;
    int chunk = (n + nsplit - 1) / nsplit;
    if (chunk < 32) chunk = 32;
    const int start = split * chunk, end = min(n, start + chunk);
    const int nH = gridDim.x * G;
    /* before the wait (programmatic dependent launch): the positions before *pos were written
     * by earlier steps; ask L2 for this block's share of them (the newest row is written by the
     * prep kernel of this step: not touched here) */
    grid_launch_dependents();
    {
        const int pend = min(end, n - 1);
        const size_t row_b = (size_t)hd * 2, base = (size_t)kvh * max_ctx * hd;
        const char *kb = (const char *)(k_cache + base), *vb = (const char *)(v_cache + base);
        for (size_t off = (size_t)start * row_b + threadIdx.x * 128; off < (size_t)max(pend, start) * row_b;
             off += (size_t)blockDim.x * 128) {
            prefetch_l2(kb + off);
            prefetch_l2(vb + off);
        }
    }
    grid_dependency_wait();
    float qv[G][8], m[G], l[G], acc[G][8];
#pragma unroll
    for (int gi = 0; gi < G; gi++) {
        int h = kvh * G + gi;
        m[gi] = -INFINITY;
        l[gi] = 0.0f;
#pragma unroll
        for (int e = 0; e < 8; e++) {
            acc[gi][e] = 0.0f;
            qv[gi][e] = lane * 8 < hd ? bf2f(q[(size_t)h * hd + lane * 8 + e]) : 0.0f;
        }
    }
    if (start < end) {
        int sub = (end - start + ATTN_WARPS - 1) / ATTN_WARPS;
        int a = start + wid * sub, b = min(end, a + sub);
        const uint16_t *kc = k_cache + (size_t)kvh * max_ctx * hd;
        const uint16_t *vc = v_cache + (size_t)kvh * max_ctx * hd;
        if (a < b) attend_range<G>(qv, kc, vc, hd, a, b, scale, m, l, acc);
    }
    const int stride = hd + 2;
#pragma unroll
    for (int gi = 0; gi < G; gi++) {
        float *w = sm + ((size_t)wid * G + gi) * stride;
        if (lane * 8 < hd)
#pragma unroll
            for (int e = 0; e < 8; e++) w[lane * 8 + e] = acc[gi][e];
        if (lane == 0) {
            w[hd] = m[gi];
            w[hd + 1] = l[gi];
        }
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < G * hd; idx += blockDim.x) {
        int gi = idx / hd, d = idx % hd;
        float M = -INFINITY;
        for (int w = 0; w < ATTN_WARPS; w++) M = fmaxf(M, sm[((size_t)w * G + gi) * stride + hd]);
        float A = 0.0f, L = 0.0f;
        if (M != -INFINITY)
            for (int w = 0; w < ATTN_WARPS; w++) {
                const float *ws = sm + ((size_t)w * G + gi) * stride;
                if (ws[hd] == -INFINITY) continue;
                float f = expf(ws[hd] - M);
                A += ws[d] * f;
                L += ws[hd + 1] * f;
            }
        int h = kvh * G + gi;
        float *pp = part + ((size_t)h * nsplit + split) * stride;
        pp[d] = A;
        if (d == 0) {
            pp[hd] = M;
            pp[hd + 1] = L;
        }
    }
    (void)nH;
}

/* Merges the splits of each query head and applies the output gate. One block per query head.
 * Only the splits that hold keys are read (the decode kernel's chunking, from *pos): at short
 * contexts a few of the nsplit. Bytes: 4 nH active (hd + 2) + 4 nH hd; FLOPs: ~3 nH active hd. */
static __global__ void attn_combine_kernel(uint16_t *out, const float *part, const uint16_t *qkv,
                                           const int32_t *pos, int nsplit, int hd, int max_ctx) {
    const int h = blockIdx.x, stride = hd + 2;
    grid_launch_dependents();
    int n = *pos + 1; /* uploaded before the step: readable before the wait */
    if (n > max_ctx) n = max_ctx;
    int chunk = (n + nsplit - 1) / nsplit;
    if (chunk < 32) chunk = 32;
    const int nact = min(nsplit, (n + chunk - 1) / chunk);
    grid_dependency_wait(); /* the partials of the kernel before */
    const float *ph = part + (size_t)h * nsplit * stride;
    float M = -INFINITY;
    for (int s = 0; s < nact; s++)
        if (ph[(size_t)s * stride + hd + 1] > 0.0f) M = fmaxf(M, ph[(size_t)s * stride + hd]);
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float A = 0.0f, L = 0.0f;
        for (int s = 0; s < nact; s++) {
            const float *ps = ph + (size_t)s * stride;
            if (ps[hd + 1] <= 0.0f) continue;
            float f = expf(ps[hd] - M);
            A += ps[d] * f;
            L += ps[hd + 1] * f;
        }
        float o = L > 0.0f ? A / L : 0.0f;
        float gate = bf2f(qkv[(size_t)h * 2 * hd + hd + d]);
        out[(size_t)h * hd + d] = f2bf(bfr(o) * bfr(sigmoid_f(gate))); /* HF: * sigmoid(gate) */
    }
}

/* Causal prefill: a warp per (token, KV head) walks keys 0 .. *pos + t for its G query heads.
 * Bytes: ~4 T nKV (pos + T/2) hd from L2 (K/V read per token); FLOPs: 4 nH T (pos + T/2) hd. */
template <int G>
static __global__ void __launch_bounds__(ATTN_WARPS *WARP_SIZE)
attn_prefill_kernel(uint16_t *out, const uint16_t *q, const uint16_t *qkv, const uint16_t *k_cache,
                    const uint16_t *v_cache, const int32_t *pos, int T, int nKV, int hd,
                    int max_ctx, float scale) {
    const int wid = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    const int item = blockIdx.x * ATTN_WARPS + wid;
    if (item >= T * nKV) return;
    /* long queries first: later tokens have more keys */
    const int t = T - 1 - item / nKV, kvh = item % nKV;
    const int nH = nKV * G;
    int n = *pos + t + 1;
    if (n > max_ctx) return;
    float qv[G][8], m[G], l[G], acc[G][8];
#pragma unroll
    for (int gi = 0; gi < G; gi++) {
        int h = kvh * G + gi;
        m[gi] = -INFINITY;
        l[gi] = 0.0f;
#pragma unroll
        for (int e = 0; e < 8; e++) {
            acc[gi][e] = 0.0f;
            qv[gi][e] = lane * 8 < hd ? bf2f(q[((size_t)t * nH + h) * hd + lane * 8 + e]) : 0.0f;
        }
    }
    attend_range<G>(qv, k_cache + (size_t)kvh * max_ctx * hd, v_cache + (size_t)kvh * max_ctx * hd,
                    hd, 0, n, scale, m, l, acc);
    if (lane * 8 >= hd) return;
    const size_t row = (size_t)2 * nH * hd + (size_t)2 * nKV * hd;
#pragma unroll
    for (int gi = 0; gi < G; gi++) {
        int h = kvh * G + gi;
        const uint16_t *gate = qkv + t * row + (size_t)h * 2 * hd + hd + lane * 8;
        uint16_t *o = out + ((size_t)t * nH + h) * hd + lane * 8;
#pragma unroll
        for (int e = 0; e < 8; e++)
            o[e] = f2bf(bfr(acc[gi][e] / l[gi]) * bfr(sigmoid_f(bf2f(gate[e]))));
    }
}

extern "C" void cuda_attn_prep(struct cuda *cu, const struct config *c, int max_ctx,
                               uint16_t *q_out, const uint16_t *qkv, const uint16_t *q_norm,
                               const uint16_t *k_norm, uint16_t *k_cache, uint16_t *v_cache,
                               const int32_t *pos, int T) {
    int nH = c->num_attention_heads, nKV = c->num_key_value_heads;
    int items = T * (nH + nKV);
    /* decode: programmatic dependent launch like every decode kernel; prefill: plain */
    gpu_launch(T == 1 ? cu->pdl : 0, attn_prep_kernel, dim3((items + ATTN_WARPS - 1) / ATTN_WARPS),
               dim3(ATTN_WARPS * WARP_SIZE), 0, cu->stream, q_out, qkv, q_norm, k_norm, k_cache,
               v_cache, (const uint16_t *)cu->rope_cos, (const uint16_t *)cu->rope_sin, pos, T, nH,
               nKV, c->head_dim, c->rotary_dim, max_ctx, c->rms_norm_eps);
    cu->n_launches++;
}

template <int G>
static void launch_decode(struct cuda *cu, const struct config *c, int max_ctx, uint16_t *out,
                          const uint16_t *q, const uint16_t *qkv, const uint16_t *k_cache,
                          const uint16_t *v_cache, const int32_t *pos) {
    int nKV = c->num_key_value_heads, hd = c->head_dim, ns = cu->attn_splits;
    size_t smem = (size_t)ATTN_WARPS * G * (hd + 2) * sizeof(float);
    if (smem > 48 * 1024) {
        void (*kern)(float *, const uint16_t *, const uint16_t *, const uint16_t *, const int32_t *,
                     int, int, int, float) = attn_decode_kernel<G>;
        GPU_SMEM_OPTIN(kern, smem);
    }
    gpu_launch(cu->pdl, attn_decode_kernel<G>, dim3(nKV, ns), dim3(ATTN_WARPS * WARP_SIZE), smem,
               cu->stream, cu->attn_part, q, k_cache, v_cache, pos, ns, hd, max_ctx,
               1.0f / sqrtf((float)hd));
    gpu_launch(cu->pdl, attn_combine_kernel, dim3(nKV * G), dim3(256), 0, cu->stream, out,
               (const float *)cu->attn_part, qkv, pos, ns, hd, max_ctx);
    cu->n_launches += 2;
}

extern "C" void cuda_attn_decode(struct cuda *cu, const struct config *c, int max_ctx,
                                 uint16_t *out, const uint16_t *q, const uint16_t *qkv,
                                 const uint16_t *k_cache, const uint16_t *v_cache,
                                 const int32_t *pos) {
    switch (c->num_attention_heads / c->num_key_value_heads) {
    case 1: launch_decode<1>(cu, c, max_ctx, out, q, qkv, k_cache, v_cache, pos); break;
    case 2: launch_decode<2>(cu, c, max_ctx, out, q, qkv, k_cache, v_cache, pos); break;
    case 4: launch_decode<4>(cu, c, max_ctx, out, q, qkv, k_cache, v_cache, pos); break;
    case 8: launch_decode<8>(cu, c, max_ctx, out, q, qkv, k_cache, v_cache, pos); break;
    default: CHECK(!"unsupported GQA group size");
    }
}

template <int G>
static void launch_prefill(struct cuda *cu, const struct config *c, int max_ctx, uint16_t *out,
                           const uint16_t *q, const uint16_t *qkv, const uint16_t *k_cache,
                           const uint16_t *v_cache, const int32_t *pos, int T) {
    int nKV = c->num_key_value_heads, hd = c->head_dim;
    int items = T * nKV;
    attn_prefill_kernel<G><<<(items + ATTN_WARPS - 1) / ATTN_WARPS, ATTN_WARPS * WARP_SIZE, 0,
                             cu->stream>>>(out, q, qkv, k_cache, v_cache, pos, T, nKV, hd, max_ctx,
                                           1.0f / sqrtf((float)hd));
    GPU_LAUNCHED();
    cu->n_launches++;
}

extern "C" void cuda_attn_prefill(struct cuda *cu, const struct config *c, int max_ctx,
                                  uint16_t *out, const uint16_t *q, const uint16_t *qkv,
                                  const uint16_t *k_cache, const uint16_t *v_cache,
                                  const int32_t *pos, int T) {
    switch (c->num_attention_heads / c->num_key_value_heads) {
    case 1: launch_prefill<1>(cu, c, max_ctx, out, q, qkv, k_cache, v_cache, pos, T); break;
    case 2: launch_prefill<2>(cu, c, max_ctx, out, q, qkv, k_cache, v_cache, pos, T); break;
    case 4: launch_prefill<4>(cu, c, max_ctx, out, q, qkv, k_cache, v_cache, pos, T); break;
    case 8: launch_prefill<8>(cu, c, max_ctx, out, q, qkv, k_cache, v_cache, pos, T); break;
    default: CHECK(!"unsupported GQA group size");
    }
}
