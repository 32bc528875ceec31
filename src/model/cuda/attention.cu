/* attention.cu - gated full attention after the projections (qwen35-model.md 3.3-3.4), as
 * cpu.c's cpu_attention: per-head zero-centred q/k RMSNorm, partial NeoX RoPE with bf16 cos/sin
 * (tables built at creation exactly as the CPU computes them), K/V appended to the bf16 cache at
 * *pos, causal GQA softmax attention in fp32, then bf16(o) * bf16(sigmoid(gate)).
 *
 * Decode is two kernels per layer, each idle at the other's positions (both read *pos on the
 * device, so one captured graph serves every position and any context): up to cu->attn_short
 * keys (default 512, run 40) a block per query head walks every key; beyond, split-KV
 * (flash-decoding) over a fixed grid of (nKV, splits) blocks whose chunk size follows *pos, the
 * partial softmaxes merged in its last blocks (last-block counters). The q/k norm, RoPE and K/V
 * append run in both. Prefill: the prep kernel, then causal flash attention on tensor cores
 * (attn_flash_kernel; for head dims that are not a multiple of 64, a warp per (token, KV head)
 * walking its keys for the G query heads sharing that KV head). The softmax is online (rescaled
 * running sums) rather than cpu.c's two passes: equal up to fp32 rounding. */
#include "kernels.h"

#define ATTN_WARPS 8

/* q/k norm + RoPE + cache append (prefill); one warp per (token, head) for nH query heads then nKV
 * key heads, 8 dims a lane in 16-byte words (a 512-token 4B layer: 9.8 us on an H100 with a
 * 2-byte element a lane at a time, before run 242). Bytes: ~2 T (nH + 2 nKV) hd * 2 (read +
 * write); FLOPs: ~10 T (nH + nKV) hd. */
static __global__ void attn_prep_kernel(uint16_t *q_out, const uint16_t *qkv, const uint16_t *q_norm,
                                        const uint16_t *k_norm, uint16_t *k_cache,
                                        uint16_t *v_cache, const uint16_t *rope_cos,
                                        const uint16_t *rope_sin, const int32_t *pos, int T,
                                        int nH, int nKV, int hd, int rot, int max_ctx, float eps) {
    __shared__ float s[ATTN_WARPS][256];
    grid_launch_dependents();
    const int wid = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    const int item = blockIdx.x * ATTN_WARPS + wid;
    const int heads = nH + nKV;
    if (item >= T * heads) return;
    const int t = item / heads, h = item % heads, d0 = lane * 8; /* this lane's 8 dims */
    const bool on = d0 < hd;                                   /* hd % 8 == 0, hd <= 256 */
    const uint16_t *w = h < nH ? q_norm : k_norm;
    const uint4 zero = make_uint4(0, 0, 0, 0);
    const uint4 wv = on ? *(const uint4 *)(w + d0) : zero; /* not the GEMM's output: before the wait */
    grid_dependency_wait(); /* qkv comes from the GEMM before */
    const int p = *pos + t;
    if (p >= max_ctx) return; /* model.c stops at a full context; never write past the cache */
    const size_t row = (size_t)2 * nH * hd + (size_t)2 * nKV * hd;
    const uint16_t *src;
    uint16_t *dst;
    if (h < nH) {
        src = qkv + t * row + (size_t)h * 2 * hd;
        dst = q_out + ((size_t)t * nH + h) * hd;
    } else {
        int kh = h - nH;
        src = qkv + t * row + (size_t)2 * nH * hd + (size_t)kh * hd;
        dst = k_cache + ((size_t)kh * max_ctx + p) * hd;
        if (on)
            *(uint4 *)(v_cache + ((size_t)kh * max_ctx + p) * hd + d0) = *(const uint4 *)(src + (size_t)nKV * hd + d0);
    }
    float x[8], wf[8], ss = 0.0f;
    unpack8(on ? *(const uint4 *)(src + d0) : zero, x);
    unpack8(wv, wf);
#pragma unroll
    for (int e = 0; e < 8; e++) ss += x[e] * x[e];
    ss = warp_sum(ss);
    const float r = 1.0f / sqrtf(ss / (float)hd + eps);
#pragma unroll
    for (int e = 0; e < 8; e++) x[e] = bfr(x[e] * r * (1.0f + wf[e])); /* HF: q_norm / k_norm */
    if (on)
#pragma unroll
        for (int e = 0; e < 8; e++) s[wid][d0 + e] = x[e];
    __syncwarp();
    const int half = rot / 2; /* rot % 16 == 0: a lane's 8 dims on one side of half */
    if (on && d0 < rot) {
        const int j = d0 < half ? d0 : d0 - half;
        float c[8], sn[8];
        unpack8(*(const uint4 *)(rope_cos + (size_t)p * half + j), c);
        unpack8(*(const uint4 *)(rope_sin + (size_t)p * half + j), sn);
#pragma unroll
        for (int e = 0; e < 8; e++)
            x[e] = d0 < half ? bfr(bfr(x[e] * c[e]) + bfr(-s[wid][d0 + e + half] * sn[e]))
                             : bfr(bfr(x[e] * c[e]) + bfr(s[wid][d0 + e - half] * sn[e]));
    }
    if (on)
        *(uint4 *)(dst + d0) = make_uint4(pack_bf(x[0], x[1]), pack_bf(x[2], x[3]), pack_bf(x[4], x[5]),
                                          pack_bf(x[6], x[7]));
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

/* ---- decode: one kernel per layer ---------------------------------------------------------
 * Block (kv head, split) of a fixed (nKV, nsplit) grid; the chunk of positions a split covers
 * follows *pos on the device (no context ceiling; one graph serves every position).
 *  1. before griddepcontrol.wait: the first group of keys of each warp (rows < *pos, written by
 *     earlier steps) is loaded into registers; the q/k norm weights and the RoPE row of *pos
 *     are loaded (no L2 prefetch of the rows ahead: run 47 at 32k, none 358.7 tok/s against
 *     354.5 for 8 rows ahead, 342.8 for 16);
 *  2. after it, the prep, a warp per head in registers (one 16-byte load per lane): q/k RMSNorm +
 *     RoPE of the G query heads sharing this KV head (every block, from qkv), and in the block
 *     whose chunk holds *pos the new K/V row to the cache;
 *  3. each warp walks its sub-chunk DEC_U keys at a time for all G query heads (K/V read once
 *     per KV head), the next group's K loads issued before the current group's softmax and its
 *     V loads before the next group's scores (software pipelined, no extra registers); scores,
 *     maxima and sums in base 2, the group's scores summed by one reduce-scatter, the max moved
 *     lazily (run 43: the walk at 32k went from ~65 to ~38 us per layer, 3.5 TB/s); the block's
 *     8 warps merge in shared memory into a partial (acc, max, sum);
 *     A split holds at least DEC_MIN_CHUNK keys: short contexts run in one block per KV head,
 *     which writes the gated output itself (no partials, no counter);
 *  4. the partials merge in a two-level tree through last-block counters (always left at zero):
 *     the last block of each group of DEC_GROUP splits merges that group into its first slot;
 *     the last group merges the groups and applies the output gate.
 * Bytes: 4 nKV (pos + 1) hd of K/V + ~8 nH nact hd of partials; FLOPs: ~4 nH (pos + 1) hd. */
#define DEC_U 2               /* keys per group (more spills at 2 blocks/SM) */
#define DEC_GROUP 16          /* splits per first-level merge; nsplit <= DEC_GROUP^2 */
#define DEC_MIN_CHUNK 32      /* keys per split at least (64 or 128: no change at 32k, run 42) */
#define DEC_TH 8.0f           /* lazy max: rescale when a score passes the max by this (base 2) */
#define LOG2E_F 1.4426950408889634f
#define DEC_COUNTERS 64       /* this file's last-block counters: cu->counters[64 ..) */
#define DEC_CNT_PER_KV (DEC_GROUP + 1)

/* A partial slot: acc (hd), max, sum (base 2), two floats of padding: slots start 16-byte
 * aligned, so merge_slots reads them as float4. */
#define DEC_SLOT(hd) ((hd) + 4)

/* Merges `cnt` partial slots (slot i at ph + i * sstride floats, DEC_SLOT layout) of each of the
 * G heads (head gi's slots start at part_h + gi * hstride); with out == NULL the result goes
 * back into slot 0 as a partial, else it is normalised, gated and written as bf16. Each thread
 * loads its quad of every slot before summing any, so the cnt loads are in flight together (one
 * L2 round trip, not cnt: run 42 measured ~10 us per level at 16 slots with a load per use). */
template <int G>
static __device__ void merge_slots(const float *part_h, size_t hstride, size_t sstride, int cnt,
                                   int hd, float *fw, float *MLs, float *slot0_w, uint16_t *out,
                                   const uint16_t *gate_h, int h0) {
    const int tid = threadIdx.x, wid = tid / WARP_SIZE, lane = tid % WARP_SIZE;
    for (int gi = wid; gi < G; gi += ATTN_WARPS) {
        const float *ph = part_h + gi * hstride;
        float ms = -INFINITY, ls = 0.0f;
        if (lane < cnt) {
            ms = load_coherent(ph + (size_t)lane * sstride + hd);
            ls = load_coherent(ph + (size_t)lane * sstride + hd + 1);
        }
        const float M = warp_max(ls > 0.0f ? ms : -INFINITY);
        const float f = ls > 0.0f && M != -INFINITY ? exp2f(ms - M) : 0.0f;
        if (lane < DEC_GROUP) fw[gi * DEC_GROUP + lane] = f; /* 0 past cnt */
        const float L = warp_sum(f * ls);
        if (lane == 0) MLs[2 * gi] = M, MLs[2 * gi + 1] = L;
    }
    __syncthreads();
    for (int qi = tid; qi < G * hd / 4; qi += ATTN_WARPS * WARP_SIZE) { /* hd % 8 == 0 */
        const int gi = qi * 4 / hd, d = qi * 4 % hd;
        const float *src = part_h + gi * hstride + d;
        float4 v[DEC_GROUP];
#pragma unroll
        for (int i = 0; i < DEC_GROUP; i++)
            v[i] = i < cnt ? load_coherent4(src + (size_t)i * sstride) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        float A[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int i = 0; i < DEC_GROUP; i++) { /* slot order */
            const float f = fw[gi * DEC_GROUP + i];
            A[0] += v[i].x * f;
            A[1] += v[i].y * f;
            A[2] += v[i].z * f;
            A[3] += v[i].w * f;
        }
        const float L = MLs[2 * gi + 1];
        if (out) {
            const int h = h0 + gi;
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const float o = L > 0.0f ? A[e] / L : 0.0f;
                const float gt = bf2f(gate_h[(size_t)h * 2 * hd + hd + d + e]);
                out[(size_t)h * hd + d + e] = f2bf(bfr(o) * bfr(sigmoid_f(gt))); /* HF: * sigmoid(gate) */
            }
        } else {
            float *pw = slot0_w + gi * hstride;
            *(float4 *)(pw + d) = make_float4(A[0], A[1], A[2], A[3]);
            if (d == 0) pw[hd] = MLs[2 * gi], pw[hd + 1] = L;
        }
    }
}

/* zero-centred RMSNorm of one head (HF q_norm / k_norm) then NeoX RoPE on its first rot dims, in
 * registers: lane i holds dims 8i .. 8i + 7 (x, zero past hd), with the norm weights w and the
 * cos / sin of its dims at this position (cw, sw; loaded before the wait) as bf16 words; each
 * rotated dim's partner (d +- rot / 2) comes from the lane rot / 16 away. One warp. */
static __device__ __forceinline__ uint4 norm_rope_lane(uint4 x, uint4 w, uint4 cw, uint4 sw, int hd,
                                                       int rot, float eps) {
    const int lane = threadIdx.x % WARP_SIZE, d0 = lane * 8, half = rot / 2;
    float f[8], g[8], v[8];
    unpack8(x, f);
    unpack8(w, g);
    float ss = 0.0f;
#pragma unroll
    for (int e = 0; e < 8; e++) ss += f[e] * f[e];
    ss = warp_sum(ss);
    const float r = 1.0f / sqrtf(ss / (float)hd + eps);
#pragma unroll
    for (int e = 0; e < 8; e++) v[e] = bfr(f[e] * r * (1.0f + g[e]));
    const bool rotated = d0 < rot, first = d0 < half;
    const int partner = rotated ? (first ? lane + half / 8 : lane - half / 8) : lane;
    float c[8], sn[8];
    unpack8(cw, c);
    unpack8(sw, sn);
#pragma unroll
    for (int e = 0; e < 8; e++) {
        const float other = __shfl_sync(FULL_MASK, v[e], partner);
        if (rotated)
            v[e] = first ? bfr(bfr(v[e] * c[e]) + bfr(-other * sn[e]))
                         : bfr(bfr(v[e] * c[e]) + bfr(other * sn[e]));
    }
    return make_uint4(pack_bf(v[0], v[1]), pack_bf(v[2], v[3]), pack_bf(v[4], v[5]), pack_bf(v[6], v[7]));
}

/* Asks L2 for the K and V rows [r0, r1) (128-byte lines spread over the warp's lanes): the loads
 * that follow some rows later find them there, so more bytes are in flight than registers hold. */
static __device__ __forceinline__ void prefetch_rows(const uint16_t *kc, const uint16_t *vc, int hd,
                                                     int r0, int r1) {
    const int lane = threadIdx.x % WARP_SIZE, bytes = (r1 - r0) * hd * 2; /* rows are contiguous */
    const char *kb = (const char *)(kc + (size_t)r0 * hd), *vb = (const char *)(vc + (size_t)r0 * hd);
    for (int off = lane * 128; off < bytes; off += WARP_SIZE * 128) {
        prefetch_l2(kb + off);
        prefetch_l2(vb + off);
    }
}

/* Before the wait: this lane's words of the first U rows of [a, b) that earlier steps wrote
 * (rows < p; zero elsewhere). */
template <int U>
static __device__ __forceinline__ void load_first_rows(const uint16_t *kc, const uint16_t *vc, int hd,
                                                       int a, int b, int p, bool on, uint4 (&kk)[U],
                                                       uint4 (&vv)[U]) {
    const int lane = threadIdx.x % WARP_SIZE;
    const uint4 zero = make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int u = 0; u < U; u++) {
        const int j = a + u;
        const bool ok = on && j < b && j < p;
        kk[u] = ok ? *(const uint4 *)(kc + (size_t)j * hd + lane * 8) : zero;
        vv[u] = ok ? *(const uint4 *)(vc + (size_t)j * hd + lane * 8) : zero;
    }
}

/* Before the wait: this lane's words of the q / k norm weights (k only where need_k) and of the
 * RoPE cos / sin row pr, as norm_rope_lane takes them. */
struct prep_words {
    uint4 qw, kw, cw, sw;
};
static __device__ __forceinline__ prep_words load_prep_words(const uint16_t *q_norm,
                                                             const uint16_t *k_norm,
                                                             const uint16_t *rope_cos,
                                                             const uint16_t *rope_sin, int pr,
                                                             int rot, bool on, bool need_k) {
    const int lane = threadIdx.x % WARP_SIZE;
    const int half = rot / 2, j0 = lane * 8 < half ? lane * 8 : lane * 8 - half;
    const uint4 zero = make_uint4(0, 0, 0, 0);
    const bool rotated = lane * 8 < rot;
    prep_words w;
    w.qw = on ? *(const uint4 *)(q_norm + lane * 8) : zero;
    w.kw = on && need_k ? *(const uint4 *)(k_norm + lane * 8) : zero;
    w.cw = rotated ? *(const uint4 *)(rope_cos + (size_t)pr * half + j0) : zero;
    w.sw = rotated ? *(const uint4 *)(rope_sin + (size_t)pr * half + j0) : zero;
    return w;
}

template <int G>
static __global__ void __launch_bounds__(ATTN_WARPS *WARP_SIZE, 2)
attn_decode_kernel(uint16_t *out, float *part, int *counters, const uint16_t *qkv,
                   const uint16_t *q_norm, const uint16_t *k_norm, uint16_t *k_cache,
                   uint16_t *v_cache, const uint16_t *rope_cos, const uint16_t *rope_sin,
                   const int32_t *pos, int nsplit, int short_max, int hd, int rot,
                   int max_ctx, float scale, float eps, unsigned long long *tr,
                   struct cuda_attn_rows rows) {
    if (rows.kv) { /* a batched step's row rows.row (a launch per row) */
        const int row = rows.row;
        k_cache = (uint16_t *)(rows.kv[row] + rows.k_off);
        v_cache = (uint16_t *)(rows.kv[row] + rows.v_off);
        qkv += (size_t)row * rows.qkv_row;
        out += (size_t)row * rows.out_row;
        pos += row;
    }
    extern __shared__ float sm[];
    float *wsm = sm;                                   /* (ATTN_WARPS, G, hd + 2) warp partials */
    uint4 *qs = (uint4 *)(wsm + (size_t)ATTN_WARPS * G * (hd + 2)); /* (G, 32) q, packed bf16 */
    float *fw = (float *)(qs + G * WARP_SIZE);         /* (G, DEC_GROUP) merge weights */
    float *MLs = fw + G * DEC_GROUP;                   /* (G, 2) merged max, sum */
    __shared__ int s_last;
    const int kvh = blockIdx.x, split = blockIdx.y, nKV = gridDim.x, nH = nKV * G;
    const int tid = threadIdx.x, wid = tid / WARP_SIZE, lane = tid % WARP_SIZE;
    grid_launch_dependents();
    ktrace_stamp(tr, 0);
    const int p = *pos; /* uploaded before the step: readable before the wait */
    int n = p + 1;
    if (n > max_ctx) n = max_ctx;
    if (n <= short_max) { /* attn_short_kernel's positions */
        grid_dependency_wait();
        return;
    }
    int chunk = (n + nsplit - 1) / nsplit;
    if (chunk < DEC_MIN_CHUNK) chunk = DEC_MIN_CHUNK;
    const int nact = (n + chunk - 1) / chunk;
    if (split >= nact) return; /* whole block: no keys here at this position */
    const int start = split * chunk, end = min(n, start + chunk);
    const int sub = (end - start + ATTN_WARPS - 1) / ATTN_WARPS;
    const int a = start + wid * sub, b = min(end, a + sub);
    const size_t kvbase = (size_t)kvh * max_ctx * hd;
    const uint16_t *kc = k_cache + kvbase, *vc = v_cache + kvbase;
    const bool on = lane * 8 < hd;
    const uint4 zero = make_uint4(0, 0, 0, 0);

    /* 1. before the wait: rows < p were written by earlier steps (row p is written below); the
     * norm weights and this position's RoPE row */
    uint4 kk[DEC_U], vv[DEC_U];
    load_first_rows<DEC_U>(kc, vc, hd, a, b, p, on, kk, vv);
    const bool owner = p < max_ctx && split == p / chunk; /* model.c stops at a full context */
    const int pr = min(p, max_ctx - 1);                   /* RoPE row (never past the table) */
    const prep_words pw = load_prep_words(q_norm, k_norm, rope_cos, rope_sin, pr, rot, on, owner);
    const uint4 qw = pw.qw, kw = pw.kw, cw = pw.cw, sw = pw.sw;
    grid_dependency_wait(); /* qkv comes from the GEMV before */
    ktrace_stamp(tr, 1);

    /* 2. prep: the G query heads of this KV head; the new K/V row in the block that holds p */
    const size_t kv_off = (size_t)2 * nH * hd + (size_t)kvh * hd;
    for (int item = wid; item < G + (owner ? 1 : 0); item += ATTN_WARPS) {
        const uint16_t *src = item < G ? qkv + (size_t)(kvh * G + item) * 2 * hd : qkv + kv_off;
        const uint4 x = on ? *(const uint4 *)(src + lane * 8) : zero;
        if (item < G) {
            const uint4 y = norm_rope_lane(x, qw, cw, sw, hd, rot, eps);
            if (on) qs[item * WARP_SIZE + lane] = y;
        } else {
            const uint4 vx = on ? *(const uint4 *)(qkv + kv_off + (size_t)nKV * hd + lane * 8) : zero;
            const uint4 y = norm_rope_lane(x, kw, cw, sw, hd, rot, eps);
            if (on) {
                *(uint4 *)(k_cache + kvbase + (size_t)p * hd + lane * 8) = y;
                *(uint4 *)(v_cache + kvbase + (size_t)p * hd + lane * 8) = vx;
            }
        }
    }
    __syncthreads(); /* q in shared memory; row p in the cache, visible to this block */
    ktrace_stamp(tr, 2);
#pragma unroll
    for (int u = 0; u < DEC_U; u++)
        if (on && a + u == p && a + u < b) {
            kk[u] = *(const uint4 *)(kc + (size_t)p * hd + lane * 8);
            vv[u] = *(const uint4 *)(vc + (size_t)p * hd + lane * 8);
        }

    /* 3. the keys [a, b) of this warp for the G heads, in base 2 (q carries scale * log2 e, so
     * the weights are exp2 of score - max, one ex2 each). Per group of DEC_U keys: the NV = DEC_U G
     * partial scores are summed by one reduce-scatter (NV - 1 + log2(32 / NV) shuffles, against
     * 5 NV for a warp_sum each), after which each lane holds one score (key vu, head vg) and keeps
     * the running max mh and sum lh of that (key slot, head); the weights are broadcast for the
     * V update. The max moves lazily: only when a score passes it by DEC_TH (weights stay below
     * 2^DEC_TH, far from fp32 overflow), so acc is rarely rescaled; the result is the same
     * softmax up to fp32 rounding. */
    constexpr int GP = pow2_ceil(G); /* the scatter's head slots (6 -> 8: the extra ones sum 0) */
    constexpr int NV = DEC_U * GP, REP = WARP_SIZE / NV;
    static_assert(NV <= WARP_SIZE, "DEC_U * GP keys x heads per warp");
    const int vu = lane / REP / GP; /* this lane holds key vu, head (lane / REP) % GP after the sum */
    float q[G][8], acc[G][8];
    const float qscale = scale * LOG2E_F;
#pragma unroll
    for (int gi = 0; gi < G; gi++) {
        float f[8];
        unpack8(on ? qs[gi * WARP_SIZE + lane] : zero, f);
#pragma unroll
        for (int e = 0; e < 8; e++) {
            q[gi][e] = f[e] * qscale;
            acc[gi][e] = 0.0f;
        }
    }
    float mh = -INFINITY, lh = 0.0f;
    for (int j = a; j < b; j += DEC_U) {
        float sc[NV];
#pragma unroll
        for (int u = 0; u < DEC_U; u++) {
            float kf[8];
            unpack8(kk[u], kf);
#pragma unroll
            for (int gi = 0; gi < GP; gi++) {
                float d = 0.0f;
                if (gi < G) {
                    d = q[gi][0] * kf[0];
#pragma unroll
                    for (int e = 1; e < 8; e++) d = fmaf(q[gi][e], kf[e], d);
                }
                sc[u * GP + gi] = d;
            }
        }
        const int jn = j + DEC_U;
#pragma unroll
        for (int u = 0; u < DEC_U; u++) { /* next group's keys while these scores reduce */
            const bool ok = on && jn + u < b;
            kk[u] = ok ? *(const uint4 *)(kc + (size_t)(jn + u) * hd + lane * 8) : zero;
        }
        float s = warp_sum_scatter<NV>(sc);
        if (j + vu >= b) s = -INFINITY; /* past the warp's keys */
        float mx = s; /* the group's max for head vg: over the lanes of the other keys */
#pragma unroll
        for (int o = WARP_SIZE / 2; o >= REP * GP; o /= 2) mx = fmaxf(mx, shfl_xor(mx, o));
        if (warp_any(mx > mh + DEC_TH)) { /* key j exists: mx is finite */
            const float mn = fmaxf(mh, mx), corr = exp2f(mh - mn); /* 0 the first time */
            lh *= corr;
            mh = mn;
#pragma unroll
            for (int gi = 0; gi < G; gi++) {
                const float c = shfl_from(corr, gi * REP);
#pragma unroll
                for (int e = 0; e < 8; e++) acc[gi][e] *= c;
            }
        }
        const float w = exp2f(s - mh); /* 0 past the keys */
        lh += w;
#pragma unroll
        for (int u = 0; u < DEC_U; u++) {
            float vf[8];
            unpack8(vv[u], vf);
#pragma unroll
            for (int gi = 0; gi < G; gi++) {
                const float wu = shfl_from(w, (u * GP + gi) * REP);
#pragma unroll
                for (int e = 0; e < 8; e++) acc[gi][e] = fmaf(wu, vf[e], acc[gi][e]);
            }
        }
#pragma unroll
        for (int u = 0; u < DEC_U; u++) {
            const bool ok = on && jn + u < b;
            vv[u] = ok ? *(const uint4 *)(vc + (size_t)(jn + u) * hd + lane * 8) : zero;
        }
    }
#pragma unroll
    for (int o = WARP_SIZE / 2; o >= REP * GP; o /= 2) lh += shfl_xor(lh, o); /* over the keys */

    /* the block's 8 warps -> one partial per query head (or, when this block holds every key,
     * the output: the merge of one partial is that partial) */
    ktrace_stamp(tr, 3);
    const int wstride = hd + 2, stride = DEC_SLOT(hd);
#pragma unroll
    for (int gi = 0; gi < G; gi++) {
        float *w = wsm + ((size_t)wid * G + gi) * wstride;
        if (on)
#pragma unroll
            for (int e = 0; e < 8; e++) w[lane * 8 + e] = acc[gi][e];
        if (lane == gi * REP) { /* the lane holding head gi's max and sum */
            w[hd] = mh;
            w[hd + 1] = lh;
        }
    }
    __syncthreads();
    for (int idx = tid; idx < G * hd; idx += blockDim.x) {
        int gi = idx / hd, d = idx % hd;
        float M = -INFINITY;
        for (int w = 0; w < ATTN_WARPS; w++) M = fmaxf(M, wsm[((size_t)w * G + gi) * wstride + hd]);
        float A = 0.0f, L = 0.0f;
        if (M != -INFINITY)
            for (int w = 0; w < ATTN_WARPS; w++) {
                const float *ws = wsm + ((size_t)w * G + gi) * wstride;
                if (ws[hd] == -INFINITY) continue;
                float f = exp2f(ws[hd] - M);
                A += ws[d] * f;
                L += ws[hd + 1] * f;
            }
        if (nact == 1) {
            const int h = kvh * G + gi;
            float o = L > 0.0f ? A / L : 0.0f;
            float gate = bf2f(qkv[(size_t)h * 2 * hd + hd + d]);
            out[(size_t)h * hd + d] = f2bf(bfr(o) * bfr(sigmoid_f(gate))); /* HF: * sigmoid(gate) */
            continue;
        }
        float *pp = part + ((size_t)(kvh * G + gi) * nsplit + split) * stride;
        pp[d] = A;
        if (d == 0) {
            pp[hd] = M;
            pp[hd + 1] = L;
        }
    }
    if (nact == 1) {
        ktrace_stamp(tr, 4);
        return;
    }

    /* 4. two-level merge through last-block counters */
    int *cnt = counters + (size_t)kvh * DEC_CNT_PER_KV;
    const int g = split / DEC_GROUP, ng = (nact + DEC_GROUP - 1) / DEC_GROUP;
    const int g0 = g * DEC_GROUP, gcnt = min(DEC_GROUP, nact - g0);
    const size_t hstride = (size_t)nsplit * stride;
    float *part_kv = part + (size_t)kvh * G * hstride;
    fence_device();
    __syncthreads();
    if (tid == 0) s_last = atomicAdd(&cnt[g], 1) == gcnt - 1;
    __syncthreads();
    ktrace_stamp(tr, 4);
    if (!s_last) return;
    fence_device();
    if (tid == 0) cnt[g] = 0;
    if (ng == 1) { /* one group: merge it into the output */
        merge_slots<G>(part_kv, hstride, stride, gcnt, hd, fw, MLs, NULL, out, qkv, kvh * G);
        ktrace_stamp(tr, 5);
        return;
    }
    merge_slots<G>(part_kv + (size_t)g0 * stride, hstride, stride, gcnt, hd, fw, MLs,
                   part_kv + (size_t)g0 * stride, NULL, qkv, kvh * G);
    fence_device();
    __syncthreads();
    if (tid == 0) s_last = atomicAdd(&cnt[DEC_GROUP], 1) == ng - 1;
    __syncthreads();
    if (!s_last) return;
    fence_device();
    if (tid == 0) cnt[DEC_GROUP] = 0;
    merge_slots<G>(part_kv, hstride, (size_t)DEC_GROUP * stride, ng, hd, fw, MLs, NULL, out, qkv,
                   kvh * G);
    ktrace_stamp(tr, 5);
}

/* ---- decode, short contexts: one block per query head ---------------------------------------
 * While n = *pos + 1 <= short_max (cu->attn_short), the split kernel's chain after the keys
 * (partials, fence, counter, merge: several dependent L2 round trips) costs more than the keys.
 * Here a block per query head walks every key with SHORT_WARPS warps, SHORT_U keys per group
 * (the first group loaded before the wait, the next group's K issued before this group's
 * softmax, its V before the next scores); each warp normalises and rotates q itself in
 * registers (no barrier), the warp holding *pos also the new key (block gi == 0 of a KV head
 * appends it to the cache), and the warps merge in shared memory into the gated output. K/V are read by the G blocks of a
 * KV head (L2 after the first). The split kernel launched next does nothing at these positions
 * and this one nothing past them; both wait for their predecessor before leaving, so each
 * kernel still completes after the one before it.
 * Bytes: 4 nH n hd of K/V (mostly L2); FLOPs: ~4 nH n hd. */
#define SHORT_WARPS 16
#define SHORT_U 4

static __global__ void __launch_bounds__(SHORT_WARPS *WARP_SIZE, 1)
attn_short_kernel(uint16_t *out, const uint16_t *qkv, const uint16_t *q_norm,
                  const uint16_t *k_norm, uint16_t *k_cache, uint16_t *v_cache,
                  const uint16_t *rope_cos, const uint16_t *rope_sin, const int32_t *pos, int G,
                  int short_max, int hd, int rot, int max_ctx, float scale, float eps, int *cnt,
                  int target, unsigned long long *tr, struct cuda_attn_rows rows) {
    if (rows.kv) { /* a batched step: row blockIdx.y */
        const int row = blockIdx.y;
        k_cache = (uint16_t *)(rows.kv[row] + rows.k_off);
        v_cache = (uint16_t *)(rows.kv[row] + rows.v_off);
        qkv += (size_t)row * rows.qkv_row;
        out += (size_t)row * rows.out_row;
        pos += row;
    }
    __shared__ float wsm[SHORT_WARPS][256 + 2]; /* per warp: acc (hd), max, sum */
    const int h = blockIdx.x, nH = gridDim.x, nKV = nH / G, kvh = h / G, gi = h % G;
    const int wid = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    grid_launch_dependents();
    ktrace_stamp(tr, 0);
    const int p = *pos; /* uploaded before the step: readable before the wait */
    const int n = min(p + 1, max_ctx);
    if (n > short_max) { /* the split kernel's positions */
        grid_dependency_wait();
        if (cnt && threadIdx.x == 0 && atomicAdd(cnt + 1, 1) == (int)gridDim.x - 1) cnt[0] = cnt[1] = 0;
        return;
    }
    const int sub = (n + SHORT_WARPS - 1) / SHORT_WARPS, a = wid * sub, b = min(n, a + sub);
    const size_t kvbase = (size_t)kvh * max_ctx * hd;
    const uint16_t *kc = k_cache + kvbase, *vc = v_cache + kvbase;
    const bool on = lane * 8 < hd;
    const uint4 zero = make_uint4(0, 0, 0, 0);

    /* 1. before the wait: this warp's first keys (rows < p, written by earlier steps), the rest
     * of its rows towards L2, the norm weights and this position's RoPE row */
    uint4 kk[SHORT_U], vv[SHORT_U];
    load_first_rows<SHORT_U>(kc, vc, hd, a, b, p, on, kk, vv);
    prefetch_rows(kc, vc, hd, a + SHORT_U, min(b, p));
    const bool has_p = p < max_ctx && a <= p && p < b; /* warp-uniform */
    const int pr = min(p, max_ctx - 1);
    const prep_words pw = load_prep_words(q_norm, k_norm, rope_cos, rope_sin, pr, rot, on, has_p);
    const uint4 qw = pw.qw, kw = pw.kw, cw = pw.cw, sw = pw.sw;
    if (cnt) { /* the qkv GEMV's rows but the gates written (cuda_gemv_early) */
        if (threadIdx.x == 0) wait_count(cnt, target);
        __syncthreads();
    } else {
        grid_dependency_wait(); /* qkv comes from the GEMV before */
    }
    ktrace_stamp(tr, 1);

    /* 2. q (and, in the warp holding p, the new K/V row) in registers; this thread's gate. All
     * loaded before any is used: one L2 round trip (the gate's conversion, placed at its load,
     * made the new row's loads a second one) */
    const uint16_t *qsrc = qkv + (size_t)h * 2 * hd; /* q, then the output gate */
    const size_t kv_off = (size_t)2 * nH * hd + (size_t)kvh * hd;
    const bool new_row = has_p && on;
    const uint4 xq = on ? load_coherent_u4(qsrc + lane * 8) : zero;
    const uint4 xk = new_row ? load_coherent_u4(qkv + kv_off + lane * 8) : zero;
    const uint4 vp = new_row ? load_coherent_u4(qkv + kv_off + (size_t)nKV * hd + lane * 8) : zero;
    uint16_t gate_raw = !cnt && (int)threadIdx.x < hd ? qsrc[hd + threadIdx.x] : 0; /* with cnt: below */
    uint4 kp = zero;
    if (has_p) {
        kp = norm_rope_lane(xk, kw, cw, sw, hd, rot, eps);
        if (gi == 0 && on) {
            *(uint4 *)(k_cache + kvbase + (size_t)p * hd + lane * 8) = kp;
            *(uint4 *)(v_cache + kvbase + (size_t)p * hd + lane * 8) = vp;
        }
    }
    const uint4 qp = norm_rope_lane(xq, qw, cw, sw, hd, rot, eps);
#pragma unroll
    for (int u = 0; u < SHORT_U; u++)
        if (a + u == p && a + u < b) kk[u] = kp, vv[u] = vp;
    ktrace_stamp(tr, 2);

    /* 3. the keys [a, b) */
    float m = -INFINITY, l = 0.0f, acc[8];
#pragma unroll
    for (int e = 0; e < 8; e++) acc[e] = 0.0f;
    for (int j = a; j < b; j += SHORT_U) {
        float sc[SHORT_U];
#pragma unroll
        for (int u = 0; u < SHORT_U; u++) sc[u] = dot8(qp, kk[u]);
        const int jn = j + SHORT_U;
#pragma unroll
        for (int u = 0; u < SHORT_U; u++) { /* next group's keys while these scores reduce */
            const bool ok = on && jn + u < b;
            kk[u] = !ok ? zero : jn + u == p ? kp : *(const uint4 *)(kc + (size_t)(jn + u) * hd + lane * 8);
        }
#pragma unroll
        for (int u = 0; u < SHORT_U; u++) sc[u] = j + u < b ? warp_sum(sc[u]) * scale : -INFINITY;
        float mn = m;
#pragma unroll
        for (int u = 0; u < SHORT_U; u++) mn = fmaxf(mn, sc[u]); /* finite: key j exists */
        const float corr = expf(m - mn);
        float pu[SHORT_U], ps = 0.0f;
#pragma unroll
        for (int u = 0; u < SHORT_U; u++) ps += (pu[u] = expf(sc[u] - mn));
        l = l * corr + ps;
#pragma unroll
        for (int e = 0; e < 8; e++) acc[e] *= corr;
#pragma unroll
        for (int u = 0; u < SHORT_U; u++) {
            float vf[8];
            unpack8(vv[u], vf);
#pragma unroll
            for (int e = 0; e < 8; e++) acc[e] = fmaf(pu[u], vf[e], acc[e]);
        }
        m = mn;
#pragma unroll
        for (int u = 0; u < SHORT_U; u++) {
            const bool ok = on && jn + u < b;
            vv[u] = !ok ? zero : jn + u == p ? vp : *(const uint4 *)(vc + (size_t)(jn + u) * hd + lane * 8);
        }
    }

    /* 4. the warps' partials -> the gated output of head h */
    ktrace_stamp(tr, 3);
    if (on)
#pragma unroll
        for (int e = 0; e < 8; e++) wsm[wid][lane * 8 + e] = acc[e];
    if (lane == 0) wsm[wid][hd] = m, wsm[wid][hd + 1] = l;
    __syncthreads();
    const int d = threadIdx.x;
    if (cnt) { /* the gates (the GEMV's last rows): once it has completed; then zero the counts */
        grid_dependency_wait();
        if (d < hd) gate_raw = qsrc[hd + d];
        if (d == 0 && atomicAdd(cnt + 1, 1) == (int)gridDim.x - 1) cnt[0] = cnt[1] = 0;
    }
    if (d >= hd) return;
    float M = -INFINITY;
    for (int w = 0; w < SHORT_WARPS; w++) M = fmaxf(M, wsm[w][hd]);
    float A = 0.0f, L = 0.0f;
    for (int w = 0; w < SHORT_WARPS; w++) {
        if (wsm[w][hd] == -INFINITY) continue; /* a warp with no keys */
        const float f = expf(wsm[w][hd] - M);
        A += wsm[w][d] * f;
        L += wsm[w][hd + 1] * f;
    }
    const float o = L > 0.0f ? A / L : 0.0f;
    out[(size_t)h * hd + d] = f2bf(bfr(o) * bfr(sigmoid_f(bf2f(gate_raw)))); /* HF: * sigmoid(gate) */
    ktrace_stamp(tr, 5);
}

/* Causal prefill: a warp per (token, KV head) walks keys 0 .. *pos + t for its G query heads.
 * Bytes: ~4 T nKV (pos + T/2) hd from L2 (K/V read per token); FLOPs: 4 nH T (pos + T/2) hd. */
template <int G>
static __global__ void __launch_bounds__(ATTN_WARPS *WARP_SIZE)
attn_prefill_kernel(uint16_t *out, const uint16_t *q, const uint16_t *qkv, const uint16_t *k_cache,
                    const uint16_t *v_cache, const int32_t *pos, int T, int nKV, int hd,
                    int max_ctx, float scale) {
    grid_launch_dependents(); /* programmatic dependent launch: nothing before the wait */
    grid_dependency_wait();
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

/* ---- prefill on tensor cores: causal flash attention ---------------------------------------
 * Block (query tile, KV head): FA_BM = 128 query rows, each a (token, query head of the group)
 * pair, row r = token t0 + r / G, head kvh G + r % G (FA_BM / G tokens per tile, any G <= 128;
 * rows past the tile's tokens compute a clamped token's values and are not stored), so the G
 * query heads of a KV head share every K/V tile. 8 warps x 16 rows, one block an SM (hd 256:
 * 255 registers a thread). Keys in tiles of FA_BN = 64
 * from 0 to *pos + the tile's last token (a prompt that continues a cached prefix attends to the
 * cached keys; the causal mask only in the tiles that reach past the tile's first token).
 * S = Q K^T and O += P V with mma.sync m16n8k16 (bf16 operands, fp32 accumulation), fragments
 * from shared memory through ldmatrix (K rows as they are, V transposed), rows of 16-byte chunks
 * XOR-swizzled by row (no bank conflicts); K / V tiles double as a two-stage pipeline by cp.async
 * (V of tile j loads while S of tile j is formed, K of tile j + 1 while P V runs), as
 * FlashAttention-2 does. Online softmax in fp32, base 2. P enters the P V product as two bf16
 * operands, bf16(P) and bf16(P - bf16(P)) (FA_PSPLIT): weights good to ~2^-17 like cpu.c's fp32
 * ones. With bf16(P) alone (as flash kernels and SDPA do for a bf16 model) the error is ~2^-9 of
 * each weight, and where a few keys share the weight and their values cancel (early tokens of a
 * prompt) it reached 6% of an output against cpu.c (run 131: rel L2 2.2-2.6e-3, per-element
 * failures at T = 1,000); the split costs 2.8% at 16k (run 132). Then
 * out = bf16(bf16(o / l) * bf16(sigmoid(gate))). Keys past *pos + T are zero-filled (never read
 * past the cache rows that exist; their V is 0, so masked P = 0 times them stays 0).
 * Portable to any mma.sync GPU (sm_80 +); no wgmma / TMA.
 * Bytes: Q and out 4 T nH hd, K / V 4 hd (pos + T) per query tile from L2 (~4 nKV hd T (pos +
 * T / 2) / (FA_BM / G) in all); FLOPs: 4 nH hd T (pos + T / 2) (causal, both products). */
#define FA_BM 128 /* run 183: against 64 (two blocks of 4 warps an SM) 16k 372.2 -> 366.8 ms, 32k
                   * 896.8 -> 875.4, 512 and 4k the same */
#define FA_BN 64
#define FA_WARPS 8
#ifndef FA_PSPLIT
#define FA_PSPLIT 1 /* P V as (bf16(P) + bf16(P - bf16(P))) V: ~fp32 weights (see above) */
#endif

/* element offset of 16-byte chunk c of row r in a swizzled tile of HD-wide rows (HD >= 64) */
template <int HD>
static __device__ __forceinline__ int fa_swz(int r, int c) {
    return r * HD + ((c ^ (r & 7)) << 3);
}
/* rows [0, FA_BN) of a K or V tile: rows r0 + i of src (row stride HD), zero where r0 + i >= n */
template <int HD>
static __device__ __forceinline__ void fa_load_tile(uint16_t *dst, const uint16_t *src, int r0, int n) {
    constexpr int CPR = HD / 8;
    for (int idx = threadIdx.x; idx < FA_BN * CPR; idx += blockDim.x) {
        const int r = idx / CPR, c = idx % CPR;
        const bool ok = r0 + r < n;
        cp_async16(smem_addr(dst + fa_swz<HD>(r, c)), ok ? src + (size_t)(r0 + r) * HD + c * 8 : src,
                   ok ? 16 : 0);
    }
}

/* the last key of the thread's two rows r0 and r0 + 8 (rows past the tile's tokens: a clamped
 * token's) */
static __device__ __forceinline__ void fa_row_limits(int (&lim)[2], int r0, int p0, int t0, int TQ, int T, int G) {
#pragma unroll
    for (int hr = 0; hr < 2; hr++) lim[hr] = p0 + min(t0 + min((r0 + 8 * hr) / G, TQ - 1), T - 1);
}
/* The warp's S tile (16 rows x FA_BN keys, mma / wgmma accumulator layout) from scores to
 * weights: scaled to base 2, keys past each row's last masked (only in tiles that reach past
 * the tile's first token), the running max m and sum l of the thread's two rows updated, corr the
 * factor each row's o is rescaled by. */
static __device__ __forceinline__ void fa_softmax(float (&s)[FA_BN / 8][4], float (&m)[2], float (&l)[2],
                                                  float (&corr)[2], const int (&lim)[2], int j0,
                                                  bool need_mask, float scale_log2, int t4) {
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
        float mx = -INFINITY;
#pragma unroll
        for (int n = 0; n < FA_BN / 8; n++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                float x = s[n][2 * hr + e] * scale_log2;
                if (need_mask && j0 + 8 * n + 2 * t4 + e > lim[hr]) x = -INFINITY;
                s[n][2 * hr + e] = x;
                mx = fmaxf(mx, x);
            }
        mx = fmaxf(mx, shfl_xor(mx, 1));
        mx = fmaxf(mx, shfl_xor(mx, 2));
        const float mn = fmaxf(m[hr], mx);
        const float base = mn == -INFINITY ? 0.0f : mn;
        corr[hr] = exp2f(m[hr] - base);
        float ps = 0.0f;
#pragma unroll
        for (int n = 0; n < FA_BN / 8; n++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const float pr = exp2f(s[n][2 * hr + e] - base);
                s[n][2 * hr + e] = pr;
                ps += pr;
            }
        l[hr] = l[hr] * corr[hr] + ps;
        m[hr] = mn;
    }
}
template <int HD>
static __device__ __forceinline__ void fa_rescale(float (&o)[HD / 8][4], const float (&corr)[2]) {
#pragma unroll
    for (int n = 0; n < HD / 8; n++) {
        o[n][0] *= corr[0];
        o[n][1] *= corr[0];
        o[n][2] *= corr[1];
        o[n][3] *= corr[1];
    }
}
/* keys 16 kk .. 16 kk + 15 of the weights as the A fragments of P V: bf16(P) and, with
 * FA_PSPLIT, what it leaves out, bf16(P - bf16(P)) */
static __device__ __forceinline__ void fa_pack_p(const float (&s)[FA_BN / 8][4], int kk, uint32_t (&a)[4],
                                                 uint32_t (&lo)[4]) {
    const float *e0 = s[2 * kk], *e1 = s[2 * kk + 1];
    a[0] = pack_bf(e0[0], e0[1]);
    a[1] = pack_bf(e0[2], e0[3]);
    a[2] = pack_bf(e1[0], e1[1]);
    a[3] = pack_bf(e1[2], e1[3]);
    if (FA_PSPLIT) {
        lo[0] = pack_bf(e0[0] - lo_bf(a[0]), e0[1] - hi_bf(a[0]));
        lo[1] = pack_bf(e0[2] - lo_bf(a[1]), e0[3] - hi_bf(a[1]));
        lo[2] = pack_bf(e1[0] - lo_bf(a[2]), e1[1] - hi_bf(a[2]));
        lo[3] = pack_bf(e1[2] - lo_bf(a[3]), e1[3] - hi_bf(a[3]));
    }
}
/* the thread's two rows (r0 = its warp's first + g, and r0 + 8): sums over the 4 lanes of each
 * row, then out = bf16(bf16(o / l) * bf16(sigmoid(gate))) for rows inside the tile's tokens */
template <int HD>
static __device__ __forceinline__ void fa_store(uint16_t *out, const uint16_t *qkv, const float (&o)[HD / 8][4],
                                                const float (&l)[2], int r0, int t0, int TQ, int T, int G,
                                                int kvh, int nKV, int t4) {
    const int nH = nKV * G;
    const size_t row = (size_t)2 * nH * HD + (size_t)2 * nKV * HD;
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
        float lt = l[hr];
        lt += shfl_xor(lt, 1);
        lt += shfl_xor(lt, 2);
        const int r = r0 + 8 * hr, tl = r / G;
        if (tl >= TQ || t0 + tl >= T) continue;
        const int t = t0 + tl, h = kvh * G + r % G;
        const float inv = 1.0f / lt;
        const uint16_t *gate = qkv + (size_t)t * row + (size_t)h * 2 * HD + HD;
        uint16_t *op = out + ((size_t)t * nH + h) * HD;
#pragma unroll
        for (int n = 0; n < HD / 8; n++) {
            const int d = 8 * n + 2 * t4;
            const uint32_t gw = *(const uint32_t *)(gate + d);
            const float v0 = bfr(o[n][2 * hr] * inv) * bfr(sigmoid_f(lo_bf(gw)));
            const float v1 = bfr(o[n][2 * hr + 1] * inv) * bfr(sigmoid_f(hi_bf(gw)));
            *(uint32_t *)(op + d) = pack_bf(v0, v1); /* HF: attn_output * sigmoid(gate) */
        }
    }
}

template <int HD>
static __global__ void __launch_bounds__(FA_WARPS *WARP_SIZE, 1)
attn_flash_kernel(uint16_t *out, const uint16_t *q, const uint16_t *qkv, const uint16_t *k_cache,
                  const uint16_t *v_cache, const int32_t *pos, int t_base, int T, int G, int nKV, int max_ctx,
                  float scale_log2) {
    grid_launch_dependents(); /* programmatic dependent launch: nothing before the wait */
    grid_dependency_wait();
    static_assert(HD % 64 == 0, "head_dim: a multiple of 64");
    constexpr int KS = HD / 16;  /* k-steps of Q K^T; n-tile pairs of P V */
    constexpr int NT = FA_BN / 8; /* n-tiles of S */
    extern __shared__ uint4 fa_sm[];
    uint16_t *Qs = (uint16_t *)fa_sm, *Ks = Qs + FA_BM * HD, *Vs = Ks + FA_BN * HD;
    const int tid = threadIdx.x, wid = tid / WARP_SIZE, lane = tid % WARP_SIZE;
    const int g8 = lane / 4, t4 = lane % 4; /* mma fragment coordinates */
    const int TQ = FA_BM / G, nH = nKV * G;
    const int qt = gridDim.x - 1 - blockIdx.x, kvh = blockIdx.y; /* long tiles first */
    const int t0 = qt * TQ, t_last = min(t0 + TQ, T) - 1;
    const int p0 = *pos + t_base; /* the position of query row 0 */
    const int n_keys = min(p0 + t_last + 1, max_ctx);
    const uint16_t *kc = k_cache + (size_t)kvh * max_ctx * HD, *vc = v_cache + (size_t)kvh * max_ctx * HD;

    /* Q rows and K tile 0 */
    {
        constexpr int CPR = HD / 8;
        for (int idx = tid; idx < FA_BM * CPR; idx += FA_WARPS * WARP_SIZE) {
            const int r = idx / CPR, c = idx % CPR;
            const int t = min(t0 + min(r / G, TQ - 1), T - 1), h = kvh * G + r % G;
            cp_async16(smem_addr(Qs + fa_swz<HD>(r, c)), q + ((size_t)t * nH + h) * HD + c * 8, 16);
        }
    }
    fa_load_tile<HD>(Ks, kc, 0, n_keys);
    cp_async_commit();

    int lim[2];
    fa_row_limits(lim, wid * 16 + g8, p0, t0, TQ, T, G);
    float o[2 * KS][4];
#pragma unroll
    for (int n = 0; n < 2 * KS; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};

    const int n_tiles = (n_keys + FA_BN - 1) / FA_BN;
    for (int kt = 0; kt < n_tiles; kt++) {
        cp_async_wait_all();
        __syncthreads(); /* K tile kt (and Q) in; every warp done with V tile kt - 1 */
        fa_load_tile<HD>(Vs, vc, kt * FA_BN, n_keys);
        cp_async_commit();

        /* S = Q K^T: the warp's 16 rows x FA_BN keys */
        float s[NT][4];
#pragma unroll
        for (int n = 0; n < NT; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
        const int mat = lane / 8, mr = lane % 8;
#pragma unroll
        for (int ks = 0; ks < KS; ks++) {
            uint32_t a[4];
            ldmatrix_x4(a, smem_addr(Qs + fa_swz<HD>(wid * 16 + mr + (mat & 1) * 8, 2 * ks + (mat >> 1))));
#pragma unroll
            for (int p = 0; p < NT / 2; p++) {
                uint32_t b[4];
                ldmatrix_x4(b, smem_addr(Ks + fa_swz<HD>(16 * p + mr + (mat >> 1) * 8, 2 * ks + (mat & 1))));
                mma_bf16(s[2 * p], a, b[0], b[1]);
                mma_bf16(s[2 * p + 1], a, b[2], b[3]);
            }
        }

        float corr[2];
        fa_softmax(s, m, l, corr, lim, kt * FA_BN, kt * FA_BN + FA_BN - 1 > p0 + t0, scale_log2, t4);
        fa_rescale<HD>(o, corr);

        cp_async_wait_all();
        __syncthreads(); /* V tile kt in; every warp done with K tile kt */
        if (kt + 1 < n_tiles) {
            fa_load_tile<HD>(Ks, kc, (kt + 1) * FA_BN, n_keys);
            cp_async_commit();
        }

        /* O += P V */
#pragma unroll
        for (int kk = 0; kk < FA_BN / 16; kk++) {
            uint32_t a[4], lo[4];
            fa_pack_p(s, kk, a, lo);
#pragma unroll
            for (int p = 0; p < KS; p++) {
                uint32_t b[4];
                ldmatrix_x4_trans(b, smem_addr(Vs + fa_swz<HD>(16 * kk + mr + (mat & 1) * 8, 2 * p + (mat >> 1))));
                mma_bf16(o[2 * p], a, b[0], b[1]);
                mma_bf16(o[2 * p + 1], a, b[2], b[3]);
                if (FA_PSPLIT) {
                    mma_bf16(o[2 * p], lo, b[0], b[1]);
                    mma_bf16(o[2 * p + 1], lo, b[2], b[3]);
                }
            }
        }
    }

    fa_store<HD>(out, qkv, o, l, wid * 16 + g8, t0, TQ, T, G, kvh, nKV, t4);
}

/* The same on Hopper's warpgroup MMA (sm_90a; attn_flash_kernel elsewhere, and where the tests
 * force it): the block's 8 warps are 2 warpgroups of 64 rows (warp w still owns rows 16 w ..
 * 16 w + 15, so the softmax, masks and output are the code above), S = Q K^T by wgmma with Q
 * and K from shared memory, O += P V with P from registers and V from shared memory as an
 * N-major operand; no ldmatrix, and each K / V element read from shared memory once per
 * warpgroup rather than once per warp (a quarter of the traffic). Tiles are kept as 64-wide
 * column blocks of 128-byte rows, 128-byte swizzled (gpu.h, wg_desc), which is what cp.async
 * fills. K and V tiles have two buffers each, and a warpgroup overlaps its softmax with its own
 * P V: at step j it issues S of tile j + 1 and P V of tile j, takes the softmax of tile j + 1
 * as soon as its S is done while the P V still runs, and rescales O after (FlashAttention-3's
 * intra-warpgroup pipelining); a rescale by factors that are all 1 (no row's max moved, most
 * tiles of a long prompt) is skipped. Same rounding as attn_flash_kernel: the products are the
 * same bf16 x bf16 in fp32. */
#define FA_WG_SMEM(HD) ((size_t)(FA_BM + 4 * FA_BN) * (HD) * sizeof(uint16_t) + 1024)
/* Where a prompt's query tiles are fewer blocks than multiprocessors (a short prompt, or a
 * continuation of a long cached prefix: 671 tokens at 9,088 fill 84 of 132), the keys are
 * split among up to FA_MAX_SPLITS blocks (grid z) of at least FA_SPLIT_MIN tiles each, whose
 * partials attn_flash_merge_kernel merges (flash-decoding's split-KV). */
#define FA_MAX_SPLITS 8
#define FA_SPLIT_MIN 4

/* element offset of 16-byte chunk c of row r in a tile of ROWS rows in 64-wide blocks */
template <int ROWS>
static __device__ __forceinline__ int fa_wsw(int r, int c) {
    return (c >> 3) * ROWS * 64 + r * 64 + (((c & 7) ^ (r & 7)) << 3);
}
/* rows j0 .. j0 + FA_BN - 1 of a K or V cache head (zero past n) into a wgmma tile */
template <int HD>
static __device__ __forceinline__ void fa_wg_load(uint16_t *dst, const uint16_t *src, int j0, int n) {
    constexpr int CPR = HD / 8;
    for (int idx = threadIdx.x; idx < FA_BN * CPR; idx += blockDim.x) {
        const int r = idx / CPR, c = idx % CPR, j = j0 + r;
        cp_async16(smem_addr(dst + fa_wsw<FA_BN>(r, c)), j < n ? src + (size_t)j * HD + c * 8 : src, j < n ? 16 : 0);
    }
}

template <int HD>
static __global__ void __launch_bounds__(FA_WARPS *WARP_SIZE, 1)
attn_flash_wg_kernel(uint16_t *out, float *part, const uint16_t *q, const uint16_t *qkv,
                     const uint16_t *k_cache, const uint16_t *v_cache, const int32_t *pos, int t_base, int T, int G,
                     int nKV, int max_ctx, float scale_log2) {
    grid_launch_dependents(); /* programmatic dependent launch: nothing before the wait */
    grid_dependency_wait();
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    static_assert(HD % 64 == 0, "head_dim: a multiple of 64");
    constexpr int KS = HD / 16, KB = HD / 64, CPR = HD / 8, PK = FA_BN / 16;
    constexpr uint32_t TILE = FA_BN * HD * 2; /* bytes of a K or V tile */
    extern __shared__ uint4 fa_sm[];
    const uint32_t sm_raw = smem_addr(fa_sm), sm_base = (sm_raw + 1023) & ~1023u; /* atoms: 1 KB */
    uint16_t *Qs = (uint16_t *)((char *)fa_sm + (sm_base - sm_raw)), *Ks = Qs + FA_BM * HD, *Vs = Ks + 2 * FA_BN * HD;
    const uint32_t qa = sm_base, ka = qa + FA_BM * HD * 2, va = ka + 2 * TILE;
    const int tid = threadIdx.x, wid = tid / WARP_SIZE, lane = tid % WARP_SIZE, wg = wid / 4;
    const int g8 = lane / 4, t4 = lane % 4;
    const int TQ = FA_BM / G, nH = nKV * G;
    const int qt = gridDim.x - 1 - blockIdx.x, kvh = blockIdx.y; /* long tiles first */
    const int t0 = qt * TQ, t_last = min(t0 + TQ, T) - 1;
    const int p0 = *pos + t_base; /* the position of query row 0 */
    const int n_keys = min(p0 + t_last + 1, max_ctx);
    /* the key tiles of this split: kb0 .. kb0 + n_tiles - 1 */
    int kb0 = 0, n_tiles = (n_keys + FA_BN - 1) / FA_BN;
    if (gridDim.z > 1) {
        const int per = max((n_tiles + (int)gridDim.z - 1) / (int)gridDim.z, FA_SPLIT_MIN);
        kb0 = blockIdx.z * per;
        n_tiles = min(n_tiles - kb0, per);
    }
    if (n_tiles <= 0) { /* no keys: an empty partial (l 0) that the merge skips */
        if (t4 == 0)
#pragma unroll
            for (int hr = 0; hr < 2; hr++) {
                const int r = wid * 16 + g8 + 8 * hr, tl = r / G;
                if (tl >= TQ || t0 + tl >= T) continue;
                float *pp = part + (((size_t)blockIdx.z * T + t0 + tl) * nH + kvh * G + r % G) * (HD + 2);
                pp[HD] = -INFINITY, pp[HD + 1] = 0.0f;
            }
        return;
    }
    const uint16_t *kc = k_cache + (size_t)kvh * max_ctx * HD, *vc = v_cache + (size_t)kvh * max_ctx * HD;

    /* groups: Q with K tile kb0, then K tile kb0 + 1 with V tile kb0 */
    for (int idx = tid; idx < FA_BM * CPR; idx += FA_WARPS * WARP_SIZE) {
        const int r = idx / CPR, c = idx % CPR;
        const int t = min(t0 + min(r / G, TQ - 1), T - 1), h = kvh * G + r % G;
        cp_async16(smem_addr(Qs + fa_wsw<FA_BM>(r, c)), q + ((size_t)t * nH + h) * HD + c * 8, 16);
    }
    fa_wg_load<HD>(Ks, kc, kb0 * FA_BN, n_keys);
    cp_async_commit();
    if (n_tiles > 1) fa_wg_load<HD>(Ks + FA_BN * HD, kc, (kb0 + 1) * FA_BN, n_keys);
    fa_wg_load<HD>(Vs, vc, kb0 * FA_BN, n_keys);
    cp_async_commit();

    int lim[2];
    fa_row_limits(lim, wid * 16 + g8, p0, t0, TQ, T, G);
    float o[2 * KS][4];
#pragma unroll
    for (int n = 0; n < 2 * KS; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}, corr[2];
    float s[FA_BN / 8][4];
    /* S of the split's key tile j (in buffer j % 2) into s, issued and committed */
    auto issue_s = [&](int j) {
        const uint32_t kb = ka + (j & 1) * TILE;
#pragma unroll
        for (int ks = 0; ks < KS; ks++) {
            const uint32_t k16 = (ks & 3) * 32; /* the step inside block ks / 4's 128-byte rows */
            wgmma_ss(s, wg_desc(qa + (ks >> 2) * FA_BM * 128 + wg * 64 * 128 + k16, 16, 1024),
                     wg_desc(kb + (ks >> 2) * FA_BN * 128 + k16, 16, 1024), ks > 0);
        }
        wg_commit();
    };

    cp_async_wait_group<1>();
    fence_proxy_async();
    __syncthreads(); /* Q and K tile 0 in */
    wg_fence();
    issue_s(0);
    wg_wait<0>();
    wg_hold(s);
    fa_softmax(s, m, l, corr, lim, kb0 * FA_BN, (kb0 + 1) * FA_BN - 1 > p0 + t0, scale_log2, t4);

    /* O += P V of the split's key tile j (V in buffer j % 2) with P from s, issued and committed; P's
     * registers in pa / pl until the wait */
    uint32_t pa[PK][4], pl[PK][4];
    auto issue_pv = [&](int j) {
        const uint32_t vb = va + (j & 1) * TILE;
#pragma unroll
        for (int kk = 0; kk < PK; kk++)
#pragma unroll
            for (int b = 0; b < KB; b++) { /* each 64-wide block of HD, the keys 16 at a time */
                const uint64_t db = wg_desc(vb + b * FA_BN * 128 + kk * 16 * 128, FA_BN * 128, 1024);
                wgmma_rs_t(reinterpret_cast<float(&)[8][4]>(o[8 * b]), pa[kk], db);
                if (FA_PSPLIT) wgmma_rs_t(reinterpret_cast<float(&)[8][4]>(o[8 * b]), pl[kk], db);
            }
        wg_commit();
    };
    auto hold_pv = [&]() {
#pragma unroll
        for (int b = 0; b < KB; b++) wg_hold(reinterpret_cast<float(&)[8][4]>(o[8 * b]));
#pragma unroll
        for (int kk = 0; kk < PK; kk++) {
            wg_hold(pa[kk]);
            wg_hold(pl[kk]);
        }
    };
    /* a step: S of tile kt + 1 and P V of tile kt in flight, the softmax of kt + 1 under the P V
     * (run 188: issuing the next tiles' loads after the wgmmas instead of before was slower,
     * 32k 249.0 -> 265.6 ms) */
    for (int kt = 0; kt + 1 < n_tiles; kt++) {
        cp_async_wait_all();
        fence_proxy_async();
        __syncthreads(); /* V tile kt and K tile kt + 1 in; every warpgroup done with S of kt, P V of kt - 1 */
        if (kt + 2 < n_tiles) fa_wg_load<HD>(Ks + (kt & 1) * FA_BN * HD, kc, (kb0 + kt + 2) * FA_BN, n_keys);
        fa_wg_load<HD>(Vs + ((kt + 1) & 1) * FA_BN * HD, vc, (kb0 + kt + 1) * FA_BN, n_keys);
        cp_async_commit();
#pragma unroll
        for (int kk = 0; kk < PK; kk++) fa_pack_p(s, kk, pa[kk], pl[kk]);
        wg_fence();
        issue_s(kt + 1);
        issue_pv(kt);
        wg_wait<1>(); /* S of kt + 1 (the older group) */
        wg_hold(s);
        const int j0 = (kb0 + kt + 1) * FA_BN;
        fa_softmax(s, m, l, corr, lim, j0, j0 + FA_BN - 1 > p0 + t0, scale_log2, t4);
        wg_wait<0>();
        hold_pv();
        if (__any_sync(FULL_MASK, corr[0] != 1.0f || corr[1] != 1.0f)) fa_rescale<HD>(o, corr);
    }
    cp_async_wait_all();
    fence_proxy_async();
    __syncthreads(); /* the last V tile in */
#pragma unroll
    for (int kk = 0; kk < PK; kk++) fa_pack_p(s, kk, pa[kk], pl[kk]);
    wg_fence();
    issue_pv(n_tiles - 1);
    wg_wait<0>();
    hold_pv();

    if (gridDim.z == 1) {
        fa_store<HD>(out, qkv, o, l, wid * 16 + g8, t0, TQ, T, G, kvh, nKV, t4);
        return;
    }
    /* a split: O unnormalised, the row's max (base 2) and sum, for attn_flash_merge_kernel */
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
        float lt = l[hr];
        lt += shfl_xor(lt, 1);
        lt += shfl_xor(lt, 2);
        const int r = wid * 16 + g8 + 8 * hr, tl = r / G;
        if (tl >= TQ || t0 + tl >= T) continue;
        float *pp = part + (((size_t)blockIdx.z * T + t0 + tl) * nH + kvh * G + r % G) * (HD + 2);
#pragma unroll
        for (int n = 0; n < HD / 8; n++)
            *(float2 *)(pp + 8 * n + 2 * t4) = make_float2(o[n][2 * hr], o[n][2 * hr + 1]);
        if (t4 == 0) pp[HD] = m[hr], pp[HD + 1] = lt;
    }
#endif
}

/* The splits' partials of each (token, query head) merged (a warp per row):
 * weights 2^(m_i - max m), out = bf16(bf16(sum w_i O_i / sum w_i l_i) * bf16(sigmoid(gate))),
 * as fa_store rounds it (HD / 32 channels a lane). Bytes: S T nH (hd + 2) 4 in, 2 T nH hd (gate) in, 2 T nH hd out. */
template <int HD>
static __global__ void attn_flash_merge_kernel(uint16_t *out, const float *part, const uint16_t *qkv,
                                               int S, int T, int nH, int nKV) {
    grid_launch_dependents(); /* programmatic dependent launch: nothing before the wait */
    grid_dependency_wait();
    const int item = blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    if (item >= T * nH) return;
    const int t = item / nH, h = item % nH;
    constexpr int E = HD / WARP_SIZE; /* channels a lane: lane * E .. */
    float mx = -INFINITY;
    for (int i = 0; i < S; i++) {
        const float *pp = part + ((size_t)i * T * nH + item) * (HD + 2);
        if (pp[HD + 1] > 0.0f) mx = fmaxf(mx, pp[HD]);
    }
    float acc[E] = {}, L = 0.0f;
    for (int i = 0; i < S; i++) {
        const float *pp = part + ((size_t)i * T * nH + item) * (HD + 2);
        const float li = pp[HD + 1];
        if (!(li > 0.0f)) continue;
        const float w = exp2f(pp[HD] - mx);
        L += w * li;
#pragma unroll
        for (int e = 0; e < E; e += 2) {
            const float2 v = *(const float2 *)(pp + lane * E + e);
            acc[e] += w * v.x, acc[e + 1] += w * v.y;
        }
    }
    const float inv = 1.0f / L;
    const size_t row = (size_t)2 * nH * HD + (size_t)2 * nKV * HD;
    const uint16_t *gate = qkv + (size_t)t * row + (size_t)h * 2 * HD + HD;
    uint16_t *op = out + ((size_t)t * nH + h) * HD;
#pragma unroll
    for (int e = 0; e < E; e += 2) {
        const int d = lane * E + e;
        const uint32_t gw = *(const uint32_t *)(gate + d);
        const float v0 = bfr(acc[e] * inv) * bfr(sigmoid_f(lo_bf(gw)));
        const float v1 = bfr(acc[e + 1] * inv) * bfr(sigmoid_f(hi_bf(gw)));
        *(uint32_t *)(op + d) = pack_bf(v0, v1);
    }
}

extern "C" void cuda_attn_prep(struct cuda *cu, const struct config *c, int max_ctx,
                               uint16_t *q_out, const uint16_t *qkv, const uint16_t *q_norm,
                               const uint16_t *k_norm, uint16_t *k_cache, uint16_t *v_cache,
                               const int32_t *pos, int T) {
    if (T == 1) { /* decode: folded into the split kernel, which cuda_attn_decode launches next */
        cu->attn_q_norm = q_norm;
        cu->attn_k_norm = k_norm;
        return;
    }
    int nH = c->num_attention_heads, nKV = c->num_key_value_heads;
    int items = T * (nH + nKV);
    gpu_launch(cu->pdl, attn_prep_kernel, dim3((items + ATTN_WARPS - 1) / ATTN_WARPS),
               dim3(ATTN_WARPS * WARP_SIZE), 0, cu->stream, q_out, qkv, q_norm, k_norm, k_cache,
               v_cache, (const uint16_t *)cu->rope_cos, (const uint16_t *)cu->rope_sin, pos, T, nH,
               nKV, c->head_dim, c->rotary_dim, max_ctx, c->rms_norm_eps);
    cu->n_launches++;
}

template <int G>
static void launch_decode(struct cuda *cu, const struct config *c, int max_ctx, uint16_t *out,
                          const uint16_t *qkv, uint16_t *k_cache, uint16_t *v_cache,
                          const int32_t *pos, struct cuda_attn_rows rows = cuda_attn_rows(),
                          int B = 1) {
    int nKV = c->num_key_value_heads, hd = c->head_dim;
    CHECK(hd % 8 == 0 && hd <= 8 * WARP_SIZE && c->rotary_dim <= hd && c->rotary_dim % 16 == 0);
    CHECK(nKV * DEC_CNT_PER_KV <= 256 - DEC_COUNTERS);
    size_t smem = ((size_t)ATTN_WARPS * G * (hd + 2) + (size_t)G * WARP_SIZE * 4 + G * DEC_GROUP + 2 * G) *
                  sizeof(float);
    void (*kern)(uint16_t *, float *, int *, const uint16_t *, const uint16_t *, const uint16_t *,
                 uint16_t *, uint16_t *, const uint16_t *, const uint16_t *, const int32_t *, int,
                 int, int, int, int, float, float, unsigned long long *, struct cuda_attn_rows) = attn_decode_kernel<G>;
    if (smem > 48 * 1024) GPU_SMEM_OPTIN(kern, smem);
    /* splits: as many as the resident blocks fill (every split of every KV head in one wave),
     * at most the partial buffer's attn_splits and DEC_GROUP^2 (the merge tree's reach) */
    int occ = gpu_occupancy(kern, ATTN_WARPS * WARP_SIZE, smem);
    int ns = occ > 0 ? occ * cu->info.n_sm / nKV : 1;
    if (ns > cu->attn_splits) ns = cu->attn_splits;
    if (ns > DEC_GROUP * DEC_GROUP) ns = DEC_GROUP * DEC_GROUP;
    if (ns < 1) ns = 1;
    const float scale = 1.0f / sqrtf((float)hd);
    if (cu->attn_short > 0 && cu->attn_mode != 1) {
        gpu_launch(cu->pdl, attn_short_kernel, dim3(nKV * G, B), dim3(SHORT_WARPS * WARP_SIZE), 0,
                   cu->stream, out, qkv, cu->attn_q_norm, cu->attn_k_norm, k_cache, v_cache,
                   (const uint16_t *)cu->rope_cos, (const uint16_t *)cu->rope_sin, pos, G,
                   cu->attn_short, hd, c->rotary_dim, max_ctx, scale, c->rms_norm_eps,
                   rows.kv ? NULL : cu->attn_cnt, cu->attn_target,
                   rows.kv ? NULL : cuda_ktrace_slot(cu, 1, nKV * G), rows);
        cu->n_launches++;
        if (cu->attn_mode == 0) return;
    }
    for (int r = 0; r < B; r++) { /* the split kernel: a launch per row */
        rows.row = r;
        gpu_launch(cu->pdl, kern, dim3(nKV, ns), dim3(ATTN_WARPS * WARP_SIZE), smem, cu->stream, out,
                   cu->attn_part, cu->counters + DEC_COUNTERS, qkv, cu->attn_q_norm, cu->attn_k_norm,
                   k_cache, v_cache, (const uint16_t *)cu->rope_cos, (const uint16_t *)cu->rope_sin,
                   pos, ns, cu->attn_short, hd, c->rotary_dim, max_ctx, scale, c->rms_norm_eps,
                   rows.kv ? NULL : cuda_ktrace_slot(cu, 1, nKV * ns), rows);
        cu->n_launches++;
    }
}

/* The batched step's attention rows (cuda_attn_prep(T = 1) recorded the norms first): the short
 * kernel over every row in one launch (grid y), then (unless every row's context is within it:
 * cu->attn_mode 0) the split kernel row by row; each row's caches through rows->kv. */
extern "C" void cuda_attn_decode_rows(struct cuda *cu, const struct config *c, int max_ctx,
                                      uint16_t *out, const uint16_t *qkv,
                                      const struct cuda_attn_rows *rows, const int32_t *pos, int B) {
    CHECK(cu->attn_q_norm && cu->attn_k_norm && rows->kv && B >= 1);
    switch (c->num_attention_heads / c->num_key_value_heads) {
    case 1: launch_decode<1>(cu, c, max_ctx, out, qkv, NULL, NULL, pos, *rows, B); break;
    case 2: launch_decode<2>(cu, c, max_ctx, out, qkv, NULL, NULL, pos, *rows, B); break;
    case 3: launch_decode<3>(cu, c, max_ctx, out, qkv, NULL, NULL, pos, *rows, B); break;
    case 4: launch_decode<4>(cu, c, max_ctx, out, qkv, NULL, NULL, pos, *rows, B); break;
    case 5: launch_decode<5>(cu, c, max_ctx, out, qkv, NULL, NULL, pos, *rows, B); break;
    case 6: launch_decode<6>(cu, c, max_ctx, out, qkv, NULL, NULL, pos, *rows, B); break;
    case 7: launch_decode<7>(cu, c, max_ctx, out, qkv, NULL, NULL, pos, *rows, B); break;
    case 8: launch_decode<8>(cu, c, max_ctx, out, qkv, NULL, NULL, pos, *rows, B); break;
    default: CHECK(!"GQA group size (query heads / KV heads) above 8");
    }
    cu->attn_q_norm = cu->attn_k_norm = NULL;
    cu->attn_cnt = NULL;
}

/* q: unused (the decode kernel normalises and rotates q itself); the caches are written at *pos
 * (the K/V append of the prep folded in), with the q/k norm weights cuda_attn_prep recorded. */
extern "C" void cuda_attn_decode(struct cuda *cu, const struct config *c, int max_ctx,
                                 uint16_t *out, const uint16_t *q, const uint16_t *qkv,
                                 const uint16_t *k_cache, const uint16_t *v_cache,
                                 const int32_t *pos) {
    (void)q;
    CHECK(cu->attn_q_norm && cu->attn_k_norm); /* cuda_attn_prep(T = 1) comes first */
    uint16_t *kc = (uint16_t *)k_cache, *vc = (uint16_t *)v_cache;
    switch (c->num_attention_heads / c->num_key_value_heads) {
    case 1: launch_decode<1>(cu, c, max_ctx, out, qkv, kc, vc, pos); break;
    case 2: launch_decode<2>(cu, c, max_ctx, out, qkv, kc, vc, pos); break;
    case 3: launch_decode<3>(cu, c, max_ctx, out, qkv, kc, vc, pos); break;
    case 4: launch_decode<4>(cu, c, max_ctx, out, qkv, kc, vc, pos); break;
    case 5: launch_decode<5>(cu, c, max_ctx, out, qkv, kc, vc, pos); break;
    case 6: launch_decode<6>(cu, c, max_ctx, out, qkv, kc, vc, pos); break;
    case 7: launch_decode<7>(cu, c, max_ctx, out, qkv, kc, vc, pos); break;
    case 8: launch_decode<8>(cu, c, max_ctx, out, qkv, kc, vc, pos); break;
    default: CHECK(!"GQA group size (query heads / KV heads) above 8");
    }
    cu->attn_q_norm = cu->attn_k_norm = NULL;
    cu->attn_cnt = NULL;
}

template <int G>
static void launch_prefill(struct cuda *cu, const struct config *c, int max_ctx, uint16_t *out,
                           const uint16_t *q, const uint16_t *qkv, const uint16_t *k_cache,
                           const uint16_t *v_cache, const int32_t *pos, int T) {
    int nKV = c->num_key_value_heads, hd = c->head_dim;
    int items = T * nKV;
    gpu_launch(cu->pdl, attn_prefill_kernel<G>, dim3((items + ATTN_WARPS - 1) / ATTN_WARPS),
               dim3(ATTN_WARPS * WARP_SIZE), 0, cu->stream, out, q, qkv, k_cache, v_cache, pos, T, nKV, hd,
               max_ctx, 1.0f / sqrtf((float)hd));
    cu->n_launches++;
}

template <int HD>
static void launch_flash(struct cuda *cu, const struct config *c, int max_ctx, uint16_t *out,
                         const uint16_t *q, const uint16_t *qkv, const uint16_t *k_cache,
                         const uint16_t *v_cache, const int32_t *pos, int T, int q_from) {
    const int G = c->num_attention_heads / c->num_key_value_heads, TQ = FA_BM / G;
    { /* the queries from row q_from: their rows of q, qkv (the gates) and out */
        const int nH = c->num_attention_heads, nKV = c->num_key_value_heads;
        out += (size_t)q_from * nH * HD, q += (size_t)q_from * nH * HD;
        qkv += (size_t)q_from * (2 * nH + 2 * nKV) * HD;
        T -= q_from;
    }
    const float scale_log2 = 1.4426950408889634f / sqrtf((float)HD);
    const dim3 grid((T + TQ - 1) / TQ, c->num_key_value_heads);
    static int opted[2]; /* per template instance: the attribute is the kernel's, not the call's */
    if (cu->flash_wg) {
        const size_t smem = FA_WG_SMEM(HD);
        if (!opted[1]) GPU_SMEM_OPTIN(attn_flash_wg_kernel<HD>, smem);
        opted[1] = 1;
        const int blocks = grid.x * grid.y, nH = c->num_attention_heads;
        int S = blocks < cu->info.n_sm ? 2 * cu->info.n_sm / blocks : 1;
        if (S > FA_MAX_SPLITS) S = FA_MAX_SPLITS;
        while (S > 1 && (size_t)S * T * nH * (HD + 2) * sizeof(float) > cu->flash_part_bytes) S--;
        gpu_launch(cu->pdl, attn_flash_wg_kernel<HD>, dim3(grid.x, grid.y, S), dim3(FA_WARPS * WARP_SIZE), smem,
                   cu->stream, out, cu->flash_part, q, qkv, k_cache, v_cache, pos, q_from, T, G,
                   c->num_key_value_heads, max_ctx, scale_log2);
        if (S > 1) {
            cu->n_launches++;
            gpu_launch(cu->pdl, attn_flash_merge_kernel<HD>, dim3((T * nH + 7) / 8), dim3(8 * WARP_SIZE), 0,
                       cu->stream, out, (const float *)cu->flash_part, qkv, S, T, nH, c->num_key_value_heads);
        }
    } else {
        const size_t smem = (size_t)(FA_BM + 2 * FA_BN) * HD * sizeof(uint16_t);
        if (!opted[0] && smem > 48 * 1024) GPU_SMEM_OPTIN(attn_flash_kernel<HD>, smem);
        opted[0] = 1;
        gpu_launch(cu->pdl, attn_flash_kernel<HD>, grid, dim3(FA_WARPS * WARP_SIZE), smem, cu->stream, out, q, qkv,
                   k_cache, v_cache, pos, q_from, T, G, c->num_key_value_heads, max_ctx, scale_log2);
    }
    cu->n_launches++;
}

/* Bytes of the split-KV partials the wgmma flash kernel may write (launch_flash): up to
 * 2 n_sm blocks of FA_BM rows each, hd + 2 floats a row; 0 where it does not run. */
extern "C" size_t cuda_flash_part_bytes(const struct cuda *cu, const struct config *c) {
    if (!cu->flash_wg || c->head_dim % 64 || c->num_attention_heads / c->num_key_value_heads > FA_BM) return 0;
    return (size_t)2 * cu->info.n_sm * FA_BM * (c->head_dim + 2) * sizeof(float);
}

/* The flash kernel for head dims of 64, 128 and 256 (every Qwen3.5 size: 256; the demo model:
 * 64) and any GQA group up to FA_BM, over the queries from row q_from; the warp-per-token kernel
 * for other head dims, over all T. */
extern "C" void cuda_attn_prefill(struct cuda *cu, const struct config *c, int max_ctx,
                                  uint16_t *out, const uint16_t *q, const uint16_t *qkv,
                                  const uint16_t *k_cache, const uint16_t *v_cache,
                                  const int32_t *pos, int T, int q_from) {
    const int G = c->num_attention_heads / c->num_key_value_heads;
    cuda_prof_split(cu, "attention flash (prefill)");
    if (G <= FA_BM) {
        switch (c->head_dim) {
        case 256: launch_flash<256>(cu, c, max_ctx, out, q, qkv, k_cache, v_cache, pos, T, q_from); return;
        case 128: launch_flash<128>(cu, c, max_ctx, out, q, qkv, k_cache, v_cache, pos, T, q_from); return;
        case 64: launch_flash<64>(cu, c, max_ctx, out, q, qkv, k_cache, v_cache, pos, T, q_from); return;
        default: break;
        }
    }
    switch (G) {
    case 1: launch_prefill<1>(cu, c, max_ctx, out, q, qkv, k_cache, v_cache, pos, T); break;
    case 2: launch_prefill<2>(cu, c, max_ctx, out, q, qkv, k_cache, v_cache, pos, T); break;
    case 3: launch_prefill<3>(cu, c, max_ctx, out, q, qkv, k_cache, v_cache, pos, T); break;
    case 4: launch_prefill<4>(cu, c, max_ctx, out, q, qkv, k_cache, v_cache, pos, T); break;
    case 5: launch_prefill<5>(cu, c, max_ctx, out, q, qkv, k_cache, v_cache, pos, T); break;
    case 6: launch_prefill<6>(cu, c, max_ctx, out, q, qkv, k_cache, v_cache, pos, T); break;
    case 7: launch_prefill<7>(cu, c, max_ctx, out, q, qkv, k_cache, v_cache, pos, T); break;
    case 8: launch_prefill<8>(cu, c, max_ctx, out, q, qkv, k_cache, v_cache, pos, T); break;
    default: CHECK(!"GQA group size (query heads / KV heads) above 8");
    }
}
