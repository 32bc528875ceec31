/* backend.h - the operations the Qwen3.5 forward pass needs, as a table of function pointers.
 *
 * model.c is written once against this table; cpu/ implements it as the executable
 * specification and cuda/ must match it op by op. Pointers passed to ops are "device"
 * pointers obtained from ops->alloc (plain host memory on the CPU backend).
 *
 * Conventions
 *   - Activations are bf16 stored as uint16_t, row-major, T rows (tokens) per call.
 *   - Weights are bf16 [out_features, in_features] as in the checkpoint (y = x W^T), accumulated
 *     in fp32, the output rounded once to bf16 (as torch does for a bf16 matmul).
 *   - Small per-layer GDN vectors (A_log, dt_bias, linear_attn.norm.weight) are fp32 arrays
 *     holding bf16-rounded values (transformers loads them as bf16; qwen35-model.md T3).
 *   - `pos` points to ONE device int32: the position of the first of the T tokens. Reading it
 *     on the device (not passing it by value) lets a captured decode graph be replayed as is.
 *   - A backend is created for one config, a maximum context and a maximum T per call; it may
 *     keep internal scratch sized from those and never allocates inside an op.
 */
#ifndef STRATA_BACKEND_H
#define STRATA_BACKEND_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h"

struct backend;

/* DeltaNet states copied out partway through a prefill call (the gdn op's snap). */
#define BACKEND_MAX_SNAPS 8
struct backend_snap {
    int n;
    int t[BACKEND_MAX_SNAPS];             /* tokens of the call fed before the copy */
    float *state[BACKEND_MAX_SNAPS];      /* (Hv, dk, dv) */
    uint16_t *conv[BACKEND_MAX_SNAPS];    /* (conv_dim, K) */
};

/* A batched step's sequences, in backend memory (written by the caller before the step, so a
 * graph recorded for B rows serves any B sequences): row b's position, and the bases of its
 * sequence's KV block (every attention layer's k and v caches) and DeltaNet block. */
struct backend_rows {
    const int32_t *pos; /* (B,) */
    char *const *kv;    /* (B,) */
    char *const *gdn;   /* (B,) */
};

#define BACKEND_POSTS 16 /* argmax choices posted to the host that a backend keeps */
#define BACKEND_ROWS_MAX 64 /* rows of one rows_post */

/* Sampling on the backend (the sample op). The state lives in backend memory, written by the
 * host before a request (model_sample_begin): these parameters, and per token of the vocabulary
 * a logit bias, the count of the token in the output and whether it is in the prompt. Each
 * token's logit l (bf16 -> fp32) becomes l + bias (flag BIAS), then the repetition penalty
 * (prompt or output: l > 0 ? l / r : l * r) and presence + frequency * count (output: flag
 * PENALTIES), all as sampler.c does; with flag MASK (a grammar's allowed tokens, bit i % 64 of
 * word i / 64), -inf for the tokens not allowed. Then:
 *   top_k in 1..BACKEND_SAMPLE_KMAX: the k best by l (ties: lower id), p_i = exp((l_i - l_0) / T),
 *     top_p over their mass (the smallest prefix reaching top_p of it), min_p (p_i >= min_p),
 *     one draw r = u * sum(kept p) walked in that order, u = backend_sample_u(seed, pos, V);
 *   top_k 0 (no filter: top_p 1 and min_p 0): the Gumbel-max draw, argmax of l / T - log(-log
 *     u_i), u_i = backend_sample_u(seed, pos, i): exactly one draw from softmax(l / T).
 * pos is the position of the token chosen (the same seed and logits give the same token on
 * replay). Other filter combinations stay with the host sampler. */
#define BACKEND_SAMPLE_KMAX 64
#define BACKEND_LOGPROBS_KMAX 20 /* OpenAI's top_logprobs at most */
#define BACKEND_SAMPLE_VMAX 262144 /* 64 blocks of 4096 tokens on CUDA */
enum { BACKEND_SAMPLE_BIAS = 1, BACKEND_SAMPLE_PENALTIES = 2, BACKEND_SAMPLE_MASK = 4 };
struct backend_sampling {
    float temperature; /* > 0 */
    float top_p, min_p;
    float presence, frequency, repetition;
    int32_t top_k;     /* 0 or 1..BACKEND_SAMPLE_KMAX */
    int32_t flags;     /* BACKEND_SAMPLE_* */
    uint64_t seed;
};
struct backend_sample_state {  /* backend memory */
    struct backend_sampling *params;
    float *bias;                /* (V,) added to the logits (flag BIAS) */
    int32_t *count;             /* (V,) occurrences in the output: the op adds its choice */
    uint8_t *in_prompt;         /* (V,) 1 for the prompt's tokens (repetition penalty) */
    uint64_t *mask;             /* ((V + 63) / 64,) allowed tokens (flag MASK) */
};

/* The sample op's arithmetic, shared by the backends so that they draw alike (cuda/sample.cu
 * compiles these for the device too). */
#ifdef __CUDACC__
#define BACKEND_HD __host__ __device__ __forceinline__
#else
#define BACKEND_HD inline
#endif

/* A uniform in (0, 1) from 24 bits of a hash of (seed, pos, i): the sample op's randomness. */
static BACKEND_HD uint64_t backend_mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static BACKEND_HD float backend_sample_u(uint64_t seed, int pos, int i) {
    const uint64_t h = backend_mix64(seed ^ backend_mix64(((uint64_t)(uint32_t)pos << 32 | (uint32_t)i) +
                                                          0x9e3779b97f4a7c15ull));
    return ((float)(h >> 40) + 0.5f) * (1.0f / 16777216.0f);
}

/* Token i's processed logit from its raw logit l: bias, penalties, mask (NaN: -inf). */
static BACKEND_HD float backend_sample_logit(const struct backend_sampling *sp,
                                             const struct backend_sample_state *st, float l, int i) {
    if (sp->flags & BACKEND_SAMPLE_BIAS) l += st->bias[i];
    if (sp->flags & BACKEND_SAMPLE_PENALTIES) {
        const int cnt = st->count[i];
        if (sp->repetition != 1.0f && (cnt > 0 || st->in_prompt[i]))
            l = l > 0 ? l / sp->repetition : l * sp->repetition;
        if (cnt > 0) l -= sp->presence + sp->frequency * (float)cnt;
    }
    if ((sp->flags & BACKEND_SAMPLE_MASK) && !(st->mask[i / 64] >> (i % 64) & 1)) l = -INFINITY;
    return l != l ? -INFINITY : l;
}

/* Its sort key: the processed logit, or with top_k 0 the Gumbel-perturbed l / T of position pos. */
static BACKEND_HD float backend_sample_key(const struct backend_sampling *sp, float l, int pos, int i) {
    return sp->top_k == 0 ? l / sp->temperature - logf(-logf(backend_sample_u(sp->seed, pos, i))) : l;
}

/* The draw among the best kk (<= BACKEND_SAMPLE_KMAX) processed logits l[0..kk), descending:
 * top_p over their mass, min_p, then r = u * (kept mass) walked in order; the index drawn. */
static BACKEND_HD int backend_sample_draw(const struct backend_sampling *sp, const float *l, int kk, float u) {
    if (kk < 1 || !(l[0] > -INFINITY)) return 0;
    float p[BACKEND_SAMPLE_KMAX], z = 0.0f;
    for (int i = 0; i < kk; i++) z += p[i] = expf((l[i] - l[0]) / sp->temperature);
    int m = kk;
    if (sp->top_p < 1.0f) {
        float cum = 0.0f;
        for (int i = 0; i < kk; i++)
            if ((cum += p[i]) >= sp->top_p * z) {
                m = i + 1;
                break;
            }
    }
    if (sp->min_p > 0.0f) {
        int w = 0;
        while (w < m && p[w] >= sp->min_p) w++;
        m = w > 0 ? w : 1;
    }
    float zk = 0.0f, cum = 0.0f;
    for (int i = 0; i < m; i++) zk += p[i];
    const float r = u * zk;
    for (int i = 0; i < m; i++)
        if (r < (cum += p[i])) return i;
    return m - 1; /* rounding left r at the very end */
}

struct backend_ops {
    const char *name;
    void (*destroy)(struct backend *be);

    /* memory */
    void *(*alloc)(struct backend *be, size_t bytes); /* zero-filled; aborts if out of memory */
    void (*free)(struct backend *be, void *p);
    void (*upload)(struct backend *be, void *dst, const void *src, size_t bytes);
    void (*download)(struct backend *be, void *dst, const void *src, size_t bytes);
    void (*zero)(struct backend *be, void *dst, size_t bytes);
    /* Device to device, queued in order with the ops: `rows` rows of `width` bytes, the rows
     * dst_pitch / src_pitch bytes apart (rows = 1: one contiguous copy). Sequences are forked and
     * checkpoints taken and restored with it. */
    void (*copy)(struct backend *be, void *dst, size_t dst_pitch, const void *src,
                 size_t src_pitch, size_t width, size_t rows);
    void (*sync)(struct backend *be);
    /* Bytes of device memory still free for allocations, or 0 when unknown (host memory). May be
     * NULL. model_load compares it with what the model needs before allocating. */
    size_t (*mem_free)(struct backend *be);

    /* Graphs. graph_replay returns 1 if a graph recorded under `key` was run (the caller skips
     * its ops), else 0: the caller then brackets its ops with graph_begin/graph_end, which
     * record them (where supported) and run them once. Backends without graphs run ops
     * directly and return 0 from graph_replay. */
    int (*graph_replay)(struct backend *be, int key);
    void (*graph_begin)(struct backend *be, int key);
    void (*graph_end)(struct backend *be, int key);
    /* The variant of the decode step's graph at position pos (0 or 1: the ops a backend records
     * may differ between short and long contexts). model_step keys the step's graph by it and
     * calls it before graph_replay, so the ops it records are the variant's. May be NULL. */
    int (*graph_variant)(struct backend *be, int pos);

    /* out[t, :] = table[ids[t], :]                                 out (T, H), table (V, H) */
    void (*embed)(struct backend *be, uint16_t *out, const uint16_t *table, const int32_t *ids,
                  int T);

    /* out = [out +] bf16(xn W^T), xn = norm_w ? rmsnorm(x) : x                x (T, K), W (N, K)
     * rmsnorm is Qwen3.5's zero-centred one: bf16(x * rsqrt(mean(x^2) + eps) * (1 + w)), fp32
     * inside. With accumulate, out = bf16(out + bf16(xn W^T)) (the residual add).   out (T, N) */
    void (*matmul)(struct backend *be, uint16_t *out, const uint16_t *x, const uint16_t *norm_w,
                   const uint16_t *W, int T, int N, int K, int accumulate);

    /* SwiGLU MLP input half: gu = xn W_gu^T with W_gu = [gate_proj; up_proj] (2I, K);
     * out = bf16(bf16(silu(gate)) * up), xn as in matmul.                       out (T, I) */
    void (*matmul_swiglu)(struct backend *be, uint16_t *out, const uint16_t *x,
                          const uint16_t *norm_w, const uint16_t *W_gu, int T, int I, int K);

    /* Gated full attention (qwen35-model.md 3.3-3.4): qkv (T, 2*nH*hd + 2*nKV*hd) = [q_proj out
     * (per-head query|gate interleaved) | k | v], computed here as rmsnorm(h; in_norm) W_in^T
     * when W_in is given (the layer's input projections: a backend may then overlap them with
     * the attention), else as the caller wrote it;
     * q/k zero-centred RMSNorm per head, partial NeoX RoPE at positions *pos + t, k/v appended
     * to the caches (nKV, max_ctx, hd) at *pos, causal GQA softmax attention over positions
     * 0 .. *pos + t, times bf16(sigmoid(gate)), for the tokens t >= q_from (0 <= q_from < T;
     * every token's k, v still reach the caches; out's rows before q_from are unspecified: a
     * backend may compute them too).                                     out (T, nH*hd) */
    void (*attention)(struct backend *be, uint16_t *out, uint16_t *qkv, const uint16_t *h,
                      const uint16_t *in_norm, const uint16_t *W_in, const uint16_t *q_norm,
                      const uint16_t *k_norm, uint16_t *k_cache, uint16_t *v_cache,
                      const int32_t *pos, int T, int q_from);

    /* Gated DeltaNet mixer, out_proj and its residual add included (qwen35-model.md 3.5, 4):
     * proj (T, conv_dim + value_dim + 2*Hv) = [in_proj_qkv | in_proj_z | in_proj_b | in_proj_a],
     * computed here as rmsnorm(h; in_norm) W_in^T when W_in (conv_dim + value_dim + 2*Hv, H) is
     * given (the layer's input projections: a backend may then overlap them with the step), else
     * as the caller wrote it; causal conv1d over the qkv channels,
     * SiLU, L2-normalised q/k, beta/g gates, fp32 delta rule on state (Hv, dk, dv), gated
     * RMSNorm with SiLU(z), then h = bf16(h + bf16(mix W_out^T)), W_out (H, value_dim); with
     * W_out NULL it stops before out_proj: h is then the mixer's output (T, value_dim), which
     * the caller projects (a mixed step: one out_proj GEMM over the rows and the prompt).
     * conv_state (conv_dim, K) bf16 is a ring of the raw inputs: column q % K holds the input of
     * position q (the last K positions before *pos; zero before position 0), so a step writes
     * one column and reads the others.                                     h (T, H)
     * snap (or NULL; T > 1 only): copies of the states partway, for checkpoints: after the
     * call's first snap->t[i] tokens (0 < t[i] <= T, increasing; each a multiple of
     * be->snap_align or T), state to snap->state[i] and the ring (as it then is) to
     * snap->conv[i]. */
    void (*gdn)(struct backend *be, uint16_t *h, uint16_t *proj, const uint16_t *in_norm,
                const uint16_t *W_in, uint16_t *conv_state, const uint16_t *conv_w,
                const float *A_log, const float *dt_bias, const float *norm_w, float *state,
                const uint16_t *W_out, const int32_t *pos, int T, const struct backend_snap *snap);

    /* Decode over B sequences at once (a batched step; the projections before and after are
     * the caller's matmuls over all B rows): row b of qkv / proj is the token of sequence b, at
     * position rows->pos[b], its caches in that sequence's blocks (struct backend_rows). Each
     * row computes exactly what attention / gdn compute for that sequence alone with T = 1 and
     * W_in NULL, the DeltaNet rows stopping before out_proj: out row b = the gated RMSNorm's
     * output (value_dim); the attention rows' out row b as attention's (nH*hd). The layer's
     * pieces of a block lie at byte offsets: its k and v caches (nKV, max_ctx, hd) at k_off /
     * v_off of the KV block, its recurrent state (Hv, dk, dv) and conv ring (conv_dim, K) at
     * state_off / conv_off of the DeltaNet block. */
    void (*attention_rows)(struct backend *be, uint16_t *out, uint16_t *qkv, const uint16_t *q_norm,
                           const uint16_t *k_norm, const struct backend_rows *rows, size_t k_off,
                           size_t v_off, int B);
    void (*gdn_rows)(struct backend *be, uint16_t *out, uint16_t *proj, const uint16_t *conv_w,
                     const float *A_log, const float *dt_bias, const float *norm_w,
                     const struct backend_rows *rows, size_t state_off, size_t conv_off, int B);

    /* *out = index of the largest of x[0..n) (lowest index on ties, as torch.argmax). With pos
     * (a decode step whose choice is fed to the next step on the device): then *pos += 1, and
     * the choice is posted to the host as the backend's next post (numbered 1, 2, ... from its
     * creation), so that the next step can be queued before the host has read this one. */
    void (*argmax)(struct backend *be, int32_t *out, const uint16_t *x, int n, int32_t *pos);
    /* out[b] = argmax of row b of x (B rows of n, a batched step's logits), as argmax without
     * pos. */
    void (*argmax_rows)(struct backend *be, int32_t *out, const uint16_t *x, int n, int B);
    /* The choice of post number n, waiting for it but not for the work queued after it. The
     * backend keeps the last BACKEND_POSTS posts: n must not be older. */
    int32_t (*choice_wait)(struct backend *be, int64_t n);
    /* *out = a token drawn from x[0..n) under st (see struct backend_sampling), its count in
     * st->count incremented. pos as for argmax (a decode step: the token chosen is at *pos + 1,
     * then *pos += 1 and the choice is posted); without pos, at host_pos. NULL: not offered. */
    void (*sample)(struct backend *be, int32_t *out, const uint16_t *x, int n,
                   const struct backend_sample_state *st, int32_t *pos, int host_pos);
    /* Log-probabilities of the raw logits x[0..n) (bf16): out[0] = log sum exp x, out[1] =
     * x[*chosen] (chosen: a device int, the token drawn), then the k (<= BACKEND_LOGPROBS_KMAX)
     * largest x descending (ties: lower id) in out[2 ..), their ids (int bits) in out[2 + k ..).
     * NULL: not offered. */
    void (*logprobs)(struct backend *be, float *out, const uint16_t *x, int n, int k,
                     const int32_t *chosen);
    /* Does now what the backend would otherwise do on the first use of a shape (the GEMM
     * library's plans for every row count of the shapes run so far, their kernels loaded), so
     * that no request pays it; called after a warm-up that ran every op. May be NULL. */
    void (*warm)(struct backend *be);
    /* A batched step's choices on their way to the host: rows_post queues a copy of src[0..B)
     * (B <= BACKEND_ROWS_MAX) and returns its number (1, 2, ...); rows_wait waits for copy n (the
     * backend keeps the last BACKEND_POSTS), not for the work queued after it (the next step,
     * run ahead), and reads it to out. May be NULL (the caller downloads). */
    int64_t (*rows_post)(struct backend *be, const int32_t *src, int B);
    void (*rows_wait)(struct backend *be, int64_t n, int32_t *out, int B);
};

struct backend {
    const struct backend_ops *ops;
    const struct config *config;
    int max_ctx; /* positions the KV cache holds */
    int max_T;   /* tokens per call */
    int async;   /* ops are queued on a device and run later: only download waits for them */
    int snap_align; /* the gdn op's snapshots come at multiples of this many tokens of a call
                       (the CUDA prefill's chunk: the states it computes anyway; CPU: any) */
    void *impl;
};

/* The reference backend. n_threads <= 0 picks the OpenMP default. */
struct backend *backend_cpu_create(const struct config *c, int max_ctx, int max_T, int n_threads);

/* The CUDA backend (NULL with err filled when built without CUDA or no device is usable). */
struct backend *backend_cuda_create(const struct config *c, int max_ctx, int max_T,
                                    struct error *err);

#endif
