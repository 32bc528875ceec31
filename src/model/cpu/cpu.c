/* cpu.c - the reference backend: every op of backend.h in plain C11 + OpenMP, fp32 math with the
 * bf16 rounding points of Hugging Face transformers' bf16 forward (qwen35-model.md §3, trap T2).
 * This file is the executable specification the CUDA backend is checked against; clarity first,
 * then enough speed (AVX2 dot products, threads over output rows / heads through pool.h) to
 * decode a 0.8B-shaped model on two cores.
 *
 * Mirrors: transformers models/qwen3_5/modeling_qwen3_5.py (Qwen3_5RMSNorm, Qwen3_5Attention,
 * Qwen3_5GatedDeltaNet with torch_causal_conv1d_update / torch_recurrent_gated_delta_rule,
 * Qwen3_5RMSNormGated, Qwen3_5MLP). The delta rule runs in its recurrent form for every T; the
 * chunked form transformers uses for T > 1 is the same function up to fp32 rounding (§4.2). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#ifdef __AVX2__
#include <immintrin.h>
#endif

#include "model/backend.h"
#include "pool.h"

struct cpu {
    struct pool *pool;
    float *inv_freq; /* (rotary_dim / 2,) RoPE frequencies, fp32 as torch computes them */
    int64_t n_posts;               /* argmax choices posted so far */
    int32_t posts[BACKEND_POSTS]; /* post n at n % BACKEND_POSTS */
};

static struct cpu *cpu_of(struct backend *be) { return be->impl; }

/* ---------------------------------------------------------------------------------------------
 * helpers */

static float silu(float x) { return x / (1.0f + expf(-x)); }
static float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

/* out[j] = sum_i w[i] * x[j][i] for NX rows x[j] (1 <= NX <= 4): w bf16, x fp32, fp32
 * accumulation. Each weight vector is loaded and widened once for all rows (the prefill case);
 * every row is summed in exactly the same order whatever NX is, so a token gives bit-identical
 * results alone (decode) or in a batch (prefill). */
#define DOT_MAX_ROWS 4
static void dot_bf16_f32(const uint16_t *w, const float *const *x, int nx, int n, float *out) {
    int i = 0;
    float sum[DOT_MAX_ROWS] = {0};
#ifdef __AVX2__
    __m256 acc0[DOT_MAX_ROWS], acc1[DOT_MAX_ROWS];
    for (int j = 0; j < DOT_MAX_ROWS; j++) acc0[j] = acc1[j] = _mm256_setzero_ps();
    for (; i + 16 <= n; i += 16) {
        __m256i w0 = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(w + i)));
        __m256i w1 = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(w + i + 8)));
        __m256 f0 = _mm256_castsi256_ps(_mm256_slli_epi32(w0, 16));
        __m256 f1 = _mm256_castsi256_ps(_mm256_slli_epi32(w1, 16));
        for (int j = 0; j < nx; j++) {
            acc0[j] = _mm256_fmadd_ps(f0, _mm256_loadu_ps(x[j] + i), acc0[j]);
            acc1[j] = _mm256_fmadd_ps(f1, _mm256_loadu_ps(x[j] + i + 8), acc1[j]);
        }
    }
    for (int j = 0; j < nx; j++) {
        __m256 acc = _mm256_add_ps(acc0[j], acc1[j]);
        __m128 h = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
        h = _mm_add_ps(h, _mm_movehl_ps(h, h));
        h = _mm_add_ss(h, _mm_shuffle_ps(h, h, 1));
        sum[j] = _mm_cvtss_f32(h);
    }
#endif
    for (; i < n; i++) {
        float wi = bf16_to_f32(w[i]);
        for (int j = 0; j < nx; j++) sum[j] += wi * x[j][i];
    }
    for (int j = 0; j < nx; j++) out[j] = sum[j];
}

/* dot_bf16_f32 of one weight row against every row of xf (T, K), DOT_MAX_ROWS at a time. */
static void dot_rows(const uint16_t *w, const float *xf, int T, int K, float *out) {
    for (int t0 = 0; t0 < T; t0 += DOT_MAX_ROWS) {
        const float *x[DOT_MAX_ROWS];
        int nx = T - t0 < DOT_MAX_ROWS ? T - t0 : DOT_MAX_ROWS;
        for (int j = 0; j < nx; j++) x[j] = xf + (size_t)(t0 + j) * K;
        dot_bf16_f32(w, x, nx, K, out + t0);
    }
}

/* Zero-centred RMSNorm of one row into fp32 values that are exactly bf16 (the rounded output):
 * y = bf16(x * rsqrt(mean(x^2) + eps) * (1 + w)). */
static void rmsnorm_row(float *y, const uint16_t *x, const uint16_t *w, int n, float eps) {
    float ss = 0.0f;
    for (int i = 0; i < n; i++) {
        float v = bf16_to_f32(x[i]);
        ss += v * v;
    }
    float r = 1.0f / sqrtf(ss / (float)n + eps);
    for (int i = 0; i < n; i++) y[i] = bf16r(bf16_to_f32(x[i]) * r * (1.0f + bf16_to_f32(w[i])));
}

/* The bf16 input rows of a matmul as fp32 (normalised first when norm_w is given). */
static float *matmul_input(struct backend *be, const uint16_t *x, const uint16_t *norm_w, int T,
                           int K) {
    float *xf = xmalloc((size_t)T * K * sizeof(float));
    for (int t = 0; t < T; t++) {
        if (norm_w)
            rmsnorm_row(xf + (size_t)t * K, x + (size_t)t * K, norm_w, K, be->config->rms_norm_eps);
        else
            for (int k = 0; k < K; k++) xf[(size_t)t * K + k] = bf16_to_f32(x[(size_t)t * K + k]);
    }
    return xf;
}

/* ---------------------------------------------------------------------------------------------
 * memory and graphs */

static void *cpu_alloc(struct backend *be, size_t bytes) {
    (void)be;
    return xcalloc(1, bytes);
}
static void cpu_free(struct backend *be, void *p) {
    (void)be;
    free(p);
}
static void cpu_copy(struct backend *be, void *dst, const void *src, size_t bytes) {
    (void)be;
    memcpy(dst, src, bytes);
}
static void cpu_zero(struct backend *be, void *dst, size_t bytes) {
    (void)be;
    memset(dst, 0, bytes);
}
static void cpu_copy_2d(struct backend *be, void *dst, size_t dst_pitch, const void *src,
                        size_t src_pitch, size_t width, size_t rows) {
    (void)be;
    for (size_t r = 0; r < rows; r++)
        memcpy((char *)dst + r * dst_pitch, (const char *)src + r * src_pitch, width);
}
static void cpu_sync(struct backend *be) { (void)be; }
/* no graphs on the CPU: ops always run directly */
static int cpu_graph_replay(struct backend *be, int key) {
    (void)be, (void)key;
    return 0;
}
static void cpu_graph_mark(struct backend *be, int key) { (void)be, (void)key; }

/* ---------------------------------------------------------------------------------------------
 * ops */

static void cpu_embed(struct backend *be, uint16_t *out, const uint16_t *table, const int32_t *ids,
                      int T) {
    int H = be->config->hidden_size;
    for (int t = 0; t < T; t++) {
        CHECK(ids[t] >= 0 && ids[t] < be->config->vocab_size);
        memcpy(out + (size_t)t * H, table + (size_t)ids[t] * H, (size_t)H * sizeof(uint16_t));
    }
}

/* Rows [lo, hi) of a matmul (plain or SwiGLU); y holds DOT_MAX_ROWS.. scratch per thread. */
struct matmul_job {
    uint16_t *out;
    const float *xf; /* (T, K) normalised inputs */
    const uint16_t *W;
    int T, N, K, accumulate, swiglu;
    float *scratch; /* (threads, 2 T) */
};

static void matmul_rows(void *ctx, int lo, int hi, int thread) {
    const struct matmul_job *j = ctx;
    int T = j->T, N = j->N, K = j->K;
    float *y = j->scratch + (size_t)thread * 2 * T, *u = y + T; /* (T,) each */
    for (int n = lo; n < hi; n++) {
        dot_rows(j->W + (size_t)n * K, j->xf, T, K, y); /* HF: the bf16 linear output (gate_proj) */
        if (j->swiglu) {
            dot_rows(j->W + (size_t)(N + n) * K, j->xf, T, K, u); /* HF: up_proj(x) */
            for (int t = 0; t < T; t++) /* HF: act_fn(gate_proj(x)) * up_proj(x), bf16 each op */
                j->out[(size_t)t * N + n] = f32_to_bf16(bf16r(silu(bf16r(y[t]))) * bf16r(u[t]));
            continue;
        }
        for (int t = 0; t < T; t++) {
            float m = bf16r(y[t]);
            uint16_t *o = j->out + (size_t)t * N + n;
            *o = f32_to_bf16(j->accumulate ? bf16_to_f32(*o) + m : m); /* HF: residual + m */
        }
    }
}

static void run_matmul(struct backend *be, uint16_t *out, const uint16_t *x, const uint16_t *norm_w,
                       const uint16_t *W, int T, int N, int K, int accumulate, int swiglu) {
    struct pool *pool = cpu_of(be)->pool;
    float *xf = matmul_input(be, x, norm_w, T, K);
    struct matmul_job j = {out, xf, W, T, N, K, accumulate, swiglu,
                           xmalloc((size_t)pool_size(pool) * 2 * T * sizeof(float))};
    pool_for(pool, N, matmul_rows, &j);
    free(j.scratch);
    free(xf);
}

static void cpu_matmul(struct backend *be, uint16_t *out, const uint16_t *x, const uint16_t *norm_w,
                       const uint16_t *W, int T, int N, int K, int accumulate) {
    run_matmul(be, out, x, norm_w, W, T, N, K, accumulate, 0);
}

/* W_gu = [gate_proj; up_proj]: output i is silu(gate row i) * up row I + i */
static void cpu_matmul_swiglu(struct backend *be, uint16_t *out, const uint16_t *x,
                              const uint16_t *norm_w, const uint16_t *W_gu, int T, int I, int K) {
    run_matmul(be, out, x, norm_w, W_gu, T, I, K, 0, 1);
}

/* Partial NeoX RoPE on the first rotary_dim values of one bf16-valued head (qwen35-model.md 3.4):
 * out = bf16(bf16(x * cos) + bf16(rotate_half(x) * sin)) with cos/sin rounded to bf16. */
static void rope_head(float *x, const float *inv_freq, int rotary_dim, int pos) {
    int half = rotary_dim / 2;
    float tmp[512];
    CHECK(rotary_dim <= 512);
    memcpy(tmp, x, (size_t)rotary_dim * sizeof(float));
    for (int j = 0; j < half; j++) {
        float angle = (float)pos * inv_freq[j];
        float c = bf16r(cosf(angle)), s = bf16r(sinf(angle));
        x[j] = bf16r(bf16r(tmp[j] * c) + bf16r(-tmp[j + half] * s));
        x[j + half] = bf16r(bf16r(tmp[j + half] * c) + bf16r(tmp[j] * s));
    }
}

/* (token, query head) pairs [lo, hi) of the attention: softmax over positions 0 .. pos0 + t. */
struct attn_job {
    uint16_t *out;
    const uint16_t *qkv;
    const float *q; /* (T, nH, hd) normalised, rotated */
    const uint16_t *k_cache, *v_cache;
    int nH, group, hd, max_ctx, pos0, t0; /* the pairs' tokens from t0 */
    size_t row;
    float scale;
};

static void attn_heads(void *ctx, int lo, int hi, int thread) {
    (void)thread;
    const struct attn_job *j = ctx;
    int hd = j->hd;
    float *acc = xmalloc((size_t)hd * sizeof(float));
    float *s = xmalloc((size_t)(j->pos0 + j->t0 + (hi - 1) / j->nH + 1) * sizeof(float));
    for (int th = lo; th < hi; th++) {
        int t = j->t0 + th / j->nH, h = th % j->nH;
        int n_ctx = j->pos0 + t + 1, kvh = h / j->group;
        const float *qh = j->q + ((size_t)t * j->nH + h) * hd;
        float mx = -INFINITY;
        for (int p = 0; p < n_ctx; p++) {
            const uint16_t *kp = j->k_cache + ((size_t)kvh * j->max_ctx + p) * hd;
            float d = 0.0f;
            for (int i = 0; i < hd; i++) d += qh[i] * bf16_to_f32(kp[i]);
            s[p] = d * j->scale;
            if (s[p] > mx) mx = s[p];
        }
        float sum = 0.0f;
        for (int p = 0; p < n_ctx; p++) sum += (s[p] = expf(s[p] - mx));
        for (int i = 0; i < hd; i++) acc[i] = 0.0f;
        for (int p = 0; p < n_ctx; p++) {
            const uint16_t *vp = j->v_cache + ((size_t)kvh * j->max_ctx + p) * hd;
            float w = s[p] / sum;
            for (int i = 0; i < hd; i++) acc[i] += w * bf16_to_f32(vp[i]);
        }
        const uint16_t *gate = j->qkv + (size_t)t * j->row + (size_t)h * 2 * hd + hd;
        uint16_t *o = j->out + ((size_t)t * j->nH + h) * hd;
        for (int i = 0; i < hd; i++) /* HF: attn_output * torch.sigmoid(gate) */
            o[i] = f32_to_bf16(bf16r(acc[i]) * bf16r(sigmoid(bf16_to_f32(gate[i]))));
    }
    free(s);
    free(acc);
}

static void cpu_attention(struct backend *be, uint16_t *out, uint16_t *qkv, const uint16_t *h,
                          const uint16_t *in_norm, const uint16_t *W_in, const uint16_t *q_norm,
                          const uint16_t *k_norm, uint16_t *k_cache, uint16_t *v_cache,
                          const int32_t *pos_p, int T, int q_from) {
    const struct config *c = be->config;
    struct cpu *cpu = cpu_of(be);
    CHECK(q_from >= 0 && q_from < T);
    int nH = c->num_attention_heads, nKV = c->num_key_value_heads, hd = c->head_dim;
    int group = nH / nKV, max_ctx = be->max_ctx, pos0 = *pos_p;
    size_t row = (size_t)2 * nH * hd + (size_t)2 * nKV * hd;
    if (W_in) /* HF: q_proj / k_proj / v_proj of input_layernorm(h) */
        cpu_matmul(be, qkv, h, in_norm, W_in, T, (int)row, c->hidden_size, 0);
    float scale = 1.0f / sqrtf((float)hd);
    CHECK(pos0 >= 0 && pos0 + T <= max_ctx);

    /* 1. normalise + rotate q (kept as fp32 holding bf16 values), k; append k, v to the cache */
    float *q = xmalloc((size_t)T * nH * hd * sizeof(float));
    for (int t = 0; t < T; t++) {
        const uint16_t *r = qkv + (size_t)t * row;
        for (int h = 0; h < nH; h++) {
            float *qh = q + ((size_t)t * nH + h) * hd;
            rmsnorm_row(qh, r + (size_t)h * 2 * hd, q_norm, hd, c->rms_norm_eps); /* HF: q_norm */
            rope_head(qh, cpu->inv_freq, c->rotary_dim, pos0 + t);
        }
        for (int h = 0; h < nKV; h++) {
            float kh[1024];
            CHECK(hd <= 1024);
            const uint16_t *kr = r + (size_t)2 * nH * hd + (size_t)h * hd;
            const uint16_t *vr = r + (size_t)2 * nH * hd + (size_t)nKV * hd + (size_t)h * hd;
            rmsnorm_row(kh, kr, k_norm, hd, c->rms_norm_eps); /* HF: k_norm */
            rope_head(kh, cpu->inv_freq, c->rotary_dim, pos0 + t);
            uint16_t *kc = k_cache + ((size_t)h * max_ctx + pos0 + t) * hd;
            uint16_t *vc = v_cache + ((size_t)h * max_ctx + pos0 + t) * hd;
            for (int i = 0; i < hd; i++) kc[i] = f32_to_bf16(kh[i]);
            memcpy(vc, vr, (size_t)hd * sizeof(uint16_t));
        }
    }

    /* 2. causal GQA softmax attention, fp32, then the sigmoid output gate (tokens >= q_from) */
    struct attn_job j = {out, qkv, q, k_cache, v_cache, nH, group, hd, max_ctx, pos0, q_from, row, scale};
    pool_for(cpu->pool, (T - q_from) * nH, attn_heads, &j);
    free(q);
}

/* Value heads [lo, hi) of one token's DeltaNet step: gates, the delta rule on the fp32 state,
 * the gated RMSNorm. */
struct gdn_job {
    const struct config *c;
    uint16_t *out;               /* (value_dim,) this token's output */
    const float *y, *qn, *kn;    /* conv + SiLU output; normalised q (scaled), k */
    const uint16_t *z, *b, *a;   /* this token's z (value_dim), b (Hv), a (Hv) */
    const float *A_log, *dt_bias, *norm_w;
    float *state;                /* (Hv, dk, dv) */
};

static void gdn_heads(void *ctx, int lo, int hi, int thread) {
    (void)thread;
    const struct gdn_job *jb = ctx;
    const struct config *c = jb->c;
    int dk = c->linear_key_head_dim, dv = c->linear_value_head_dim;
    int r = c->linear_num_value_heads / c->linear_num_key_heads;
    float delta[1024], o[1024];
    CHECK(dv <= 1024);
    for (int v = lo; v < hi; v++) {
        const float *q = jb->qn + (size_t)(v / r) * dk, *k = jb->kn + (size_t)(v / r) * dk;
        const float *vv = jb->y + 2 * (size_t)c->key_dim + (size_t)v * dv;
        float beta = bf16r(sigmoid(bf16_to_f32(jb->b[v]))); /* HF: b.sigmoid() in bf16 */
        float u = bf16_to_f32(jb->a[v]) + jb->dt_bias[v];
        float softplus = u > 20.0f ? u : log1pf(expf(u));
        float g = -expf(jb->A_log[v]) * softplus; /* HF: -A_log.float().exp() * softplus(a + dt_bias) */
        float decay = expf(g);
        float *S = jb->state + (size_t)v * dk * dv; /* (dk, dv) */
        for (int j = 0; j < dv; j++) delta[j] = 0.0f;
        for (int i = 0; i < dk; i++)
            for (int j = 0; j < dv; j++) {
                S[(size_t)i * dv + j] *= decay;           /* S <- exp(g) S */
                delta[j] += S[(size_t)i * dv + j] * k[i]; /* u = S^T k */
            }
        for (int j = 0; j < dv; j++) delta[j] = beta * (vv[j] - delta[j]); /* beta (v - u) */
        for (int j = 0; j < dv; j++) o[j] = 0.0f;
        for (int i = 0; i < dk; i++)
            for (int j = 0; j < dv; j++) {
                float s = S[(size_t)i * dv + j] + k[i] * delta[j]; /* S += k delta^T */
                S[(size_t)i * dv + j] = s;
                o[j] += s * q[i];                                  /* o = S^T q */
            }
        /* HF Qwen3_5RMSNormGated: weight * bf16(norm(o)), times silu(z) in fp32 */
        float ss = 0.0f;
        for (int j = 0; j < dv; j++) {
            o[j] = bf16r(o[j]);
            ss += o[j] * o[j];
        }
        float rr = 1.0f / sqrtf(ss / (float)dv + c->rms_norm_eps);
        for (int j = 0; j < dv; j++) {
            float n = bf16r(o[j] * rr);
            float w = bf16r(jb->norm_w[j] * n);
            jb->out[(size_t)v * dv + j] = f32_to_bf16(w * silu(bf16_to_f32(jb->z[(size_t)v * dv + j])));
        }
    }
}

/* The DeltaNet mixer of T tokens at positions pos0.. up to out_proj: out (T, value_dim). */
static void gdn_mix(struct backend *be, uint16_t *out, const uint16_t *proj, uint16_t *conv_state,
                    const uint16_t *conv_w, const float *A_log, const float *dt_bias,
                    const float *norm_w, float *state, int pos0, int T,
                    const struct backend_snap *snap) {
    const struct config *c = be->config;
    int Hk = c->linear_num_key_heads, Hv = c->linear_num_value_heads;
    int dk = c->linear_key_head_dim, K = c->linear_conv_kernel_dim;
    int conv_dim = c->conv_dim, key_dim = c->key_dim, value_dim = c->value_dim;
    size_t row = (size_t)conv_dim + value_dim + 2 * Hv;
    CHECK(pos0 >= 0 && K <= 8);
    CHECK(!snap || (snap->n >= 0 && snap->n <= BACKEND_MAX_SNAPS));
    float *y = xmalloc((size_t)conv_dim * sizeof(float)); /* (conv_dim,) conv + SiLU output */
    float *qn = xmalloc((size_t)key_dim * sizeof(float)); /* (Hk, dk) normalised, scaled q */
    float *kn = xmalloc((size_t)key_dim * sizeof(float)); /* (Hk, dk) normalised k */

    for (int t = 0; t < T; t++) {
        const uint16_t *x = proj + (size_t)t * row;
        const uint16_t *z = x + conv_dim, *b = z + value_dim, *a = b + Hv;

        /* 1. causal depthwise conv over the raw qkv channels; tap j multiplies the input of
         *    position p - (K-1) + j, kept in ring column (p - (K-1) + j) % K (tap K-1: this
         *    token, which then takes column p % K). HF: silu(conv1d(x)), bf16 each.
         *    (A few ten thousand multiply-adds: not worth waking the pool.) */
        const int p = pos0 + t;
        int col[8];
        for (int j = 0; j < K; j++) col[j] = (p + 1 + j) % K; /* (p - (K - 1) + j) mod K */
        for (int ch = 0; ch < conv_dim; ch++) {
            uint16_t *st = conv_state + (size_t)ch * K;
            st[col[K - 1]] = x[ch];
            float acc = 0.0f;
            for (int j = 0; j < K; j++)
                acc += bf16_to_f32(conv_w[(size_t)ch * K + j]) * bf16_to_f32(st[col[j]]);
            y[ch] = bf16r(silu(bf16r(acc)));
        }

        /* 2. L2-normalise q and k per key head in fp32 (eps on the sum of squares), q * dk^-0.5 */
        for (int h = 0; h < 2 * Hk; h++) {
            const float *src = y + (size_t)h * dk;
            float ss = 0.0f;
            for (int i = 0; i < dk; i++) ss += src[i] * src[i];
            float inv = 1.0f / sqrtf(ss + 1e-6f);
            float *dst = h < Hk ? qn + (size_t)h * dk : kn + (size_t)(h - Hk) * dk;
            float scale = h < Hk ? 1.0f / sqrtf((float)dk) : 1.0f;
            for (int i = 0; i < dk; i++) dst[i] = src[i] * inv * scale;
        }

        /* 3. per value head: gates, delta rule on the fp32 state, gated RMSNorm */
        struct gdn_job jb = {c, out + (size_t)t * value_dim, y, qn, kn, z, b, a,
                             A_log, dt_bias, norm_w, state};
        pool_for(cpu_of(be)->pool, Hv, gdn_heads, &jb);
        for (int i = 0; snap && i < snap->n; i++)
            if (snap->t[i] == t + 1) {
                memcpy(snap->state[i], state, (size_t)Hv * dk * c->linear_value_head_dim * sizeof(float));
                memcpy(snap->conv[i], conv_state, (size_t)conv_dim * K * sizeof(uint16_t));
            }
    }
    free(y);
    free(qn);
    free(kn);
}

static void cpu_gdn(struct backend *be, uint16_t *h, uint16_t *proj, const uint16_t *in_norm,
                    const uint16_t *W_in, uint16_t *conv_state, const uint16_t *conv_w,
                    const float *A_log, const float *dt_bias, const float *norm_w, float *state,
                    const uint16_t *W_out, const int32_t *pos_p, int T,
                    const struct backend_snap *snap) {
    const struct config *c = be->config;
    const int value_dim = c->value_dim;
    const size_t row = (size_t)c->conv_dim + value_dim + 2 * c->linear_num_value_heads;
    if (W_in) /* HF: in_proj_qkv / in_proj_z / in_proj_b / in_proj_a of input_layernorm(h) */
        cpu_matmul(be, proj, h, in_norm, W_in, T, (int)row, c->hidden_size, 0);
    if (!W_out) { /* the mixer's output is the caller's */
        gdn_mix(be, h, proj, conv_state, conv_w, A_log, dt_bias, norm_w, state, *pos_p, T, snap);
        return;
    }
    uint16_t *out = xmalloc((size_t)T * value_dim * sizeof(uint16_t)); /* the mixer's output */
    gdn_mix(be, out, proj, conv_state, conv_w, A_log, dt_bias, norm_w, state, *pos_p, T, snap);
    run_matmul(be, h, out, NULL, W_out, T, c->hidden_size, value_dim, 1, 0); /* HF: h + out_proj */
    free(out);
}

/* A batched step's rows: each sequence's token alone, as attention / gdn with T = 1. */
static void cpu_attention_rows(struct backend *be, uint16_t *out, uint16_t *qkv,
                               const uint16_t *q_norm, const uint16_t *k_norm,
                               const struct backend_rows *rows, size_t k_off, size_t v_off, int B) {
    const struct config *c = be->config;
    const int nH = c->num_attention_heads, nKV = c->num_key_value_heads, hd = c->head_dim;
    const size_t row = (size_t)2 * nH * hd + (size_t)2 * nKV * hd;
    for (int b = 0; b < B; b++)
        cpu_attention(be, out + (size_t)b * nH * hd, qkv + (size_t)b * row, NULL, NULL, NULL,
                      q_norm, k_norm, (uint16_t *)(rows->kv[b] + k_off),
                      (uint16_t *)(rows->kv[b] + v_off), rows->pos + b, 1, 0);
}

static void cpu_gdn_rows(struct backend *be, uint16_t *out, uint16_t *proj, const uint16_t *conv_w,
                         const float *A_log, const float *dt_bias, const float *norm_w,
                         const struct backend_rows *rows, size_t state_off, size_t conv_off, int B) {
    const struct config *c = be->config;
    const size_t row = (size_t)c->conv_dim + c->value_dim + 2 * c->linear_num_value_heads;
    for (int b = 0; b < B; b++)
        gdn_mix(be, out + (size_t)b * c->value_dim, proj + (size_t)b * row,
                (uint16_t *)(rows->gdn[b] + conv_off), conv_w, A_log, dt_bias, norm_w,
                (float *)(rows->gdn[b] + state_off), rows->pos[b], 1, NULL);
}

static void cpu_argmax(struct backend *be, int32_t *out, const uint16_t *x, int n, int32_t *pos) {
    int best = 0;
    float bv = bf16_to_f32(x[0]);
    for (int i = 1; i < n; i++) {
        float v = bf16_to_f32(x[i]);
        if (v > bv) bv = v, best = i;
    }
    *out = best;
    if (pos) {
        struct cpu *cpu = cpu_of(be);
        ++*pos;
        cpu->posts[++cpu->n_posts % BACKEND_POSTS] = best;
    }
}

static void cpu_argmax_rows(struct backend *be, int32_t *out, const uint16_t *x, int n, int B) {
    for (int b = 0; b < B; b++) cpu_argmax(be, out + b, x + (size_t)b * n, n, NULL);
}

/* The sample op (backend.h, struct backend_sampling): the processed logit of each token, the
 * k best by it (ties: lower id) or the best by l / T plus Gumbel noise, then the filters and the
 * draw over those candidates in order, in float as the CUDA kernel computes them. */
struct scand {
    float key, l;
    int32_t id;
};
static int scand_before(const struct scand *a, const struct scand *b) { /* ids ascend */
    return a->key > b->key || (a->key == b->key && a->id < b->id);
}

static void cpu_sample(struct backend *be, int32_t *out, const uint16_t *x, int n,
                       const struct backend_sample_state *st, int32_t *pos, int host_pos) {
    const struct backend_sampling sp = *st->params;
    const int at = pos ? *pos + 1 : host_pos, k = sp.top_k > 0 ? sp.top_k : 1;
    CHECK(sp.top_k >= 0 && sp.top_k <= BACKEND_SAMPLE_KMAX && n >= 1 && n <= BACKEND_SAMPLE_VMAX);
    struct scand c[BACKEND_SAMPLE_KMAX] = {{0}}; /* the best k so far, in order */
    int nc = 0;
    for (int i = 0; i < n; i++) {
        const float l = backend_sample_logit(&sp, st, bf16_to_f32(x[i]), i);
        const struct scand v = {backend_sample_key(&sp, l, at, i), l, i};
        if (nc == k && !scand_before(&v, &c[k - 1])) continue;
        int j = nc < k ? nc++ : k - 1;
        for (; j > 0 && scand_before(&v, &c[j - 1]); j--) c[j] = c[j - 1];
        c[j] = v;
    }
    int32_t choice = c[0].id;
    if (sp.top_k > 0) {
        float l[BACKEND_SAMPLE_KMAX];
        for (int i = 0; i < nc; i++) l[i] = c[i].l;
        choice = c[backend_sample_draw(&sp, l, nc, backend_sample_u(sp.seed, at, n))].id;
    }
    *out = choice;
    st->count[choice]++;
    if (pos) {
        struct cpu *cpu = cpu_of(be);
        ++*pos;
        cpu->posts[++cpu->n_posts % BACKEND_POSTS] = choice;
    }
}

static void cpu_logprobs(struct backend *be, float *out, const uint16_t *x, int n, int k,
                         const int32_t *chosen) {
    (void)be;
    CHECK(k >= 0 && k <= BACKEND_LOGPROBS_KMAX && n >= 1);
    struct scand c[BACKEND_LOGPROBS_KMAX + 1] = {{0}};
    int nc = 0;
    float mx = -INFINITY;
    for (int i = 0; i < n; i++) {
        const float l = bf16_to_f32(x[i]);
        if (l == l && l > mx) mx = l;
    }
    double z = 0;
    for (int i = 0; i < n; i++) {
        float l = bf16_to_f32(x[i]);
        if (l != l) l = -INFINITY;
        z += exp((double)l - mx);
        const struct scand v = {l, l, i};
        if (k == 0 || (nc == k && !scand_before(&v, &c[k - 1]))) continue;
        int j = nc < k ? nc++ : k - 1;
        for (; j > 0 && scand_before(&v, &c[j - 1]); j--) c[j] = c[j - 1];
        c[j] = v;
    }
    out[0] = (float)(mx + log(z));
    out[1] = bf16_to_f32(x[*chosen]);
    for (int j = 0; j < k; j++) {
        int32_t id = j < nc ? c[j].id : 0;
        out[2 + j] = j < nc ? c[j].l : -INFINITY;
        memcpy(&out[2 + k + j], &id, sizeof id);
    }
}

static int32_t cpu_choice_wait(struct backend *be, int64_t n) {
    struct cpu *cpu = cpu_of(be);
    CHECK(n >= 1 && n <= cpu->n_posts && n > cpu->n_posts - BACKEND_POSTS);
    return cpu->posts[n % BACKEND_POSTS];
}

static void cpu_destroy(struct backend *be) {
    pool_free(cpu_of(be)->pool);
    free(cpu_of(be)->inv_freq);
    free(be->impl);
    free(be);
}

static const struct backend_ops cpu_ops = {
    .name = "cpu",
    .destroy = cpu_destroy,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .upload = cpu_copy,
    .download = cpu_copy,
    .zero = cpu_zero,
    .copy = cpu_copy_2d,
    .sync = cpu_sync,
    .graph_replay = cpu_graph_replay,
    .graph_begin = cpu_graph_mark,
    .graph_end = cpu_graph_mark,
    .embed = cpu_embed,
    .matmul = cpu_matmul,
    .matmul_swiglu = cpu_matmul_swiglu,
    .attention = cpu_attention,
    .gdn = cpu_gdn,
    .attention_rows = cpu_attention_rows,
    .gdn_rows = cpu_gdn_rows,
    .argmax = cpu_argmax,
    .argmax_rows = cpu_argmax_rows,
    .choice_wait = cpu_choice_wait,
    .sample = cpu_sample,
    .logprobs = cpu_logprobs,
};

struct backend *backend_cpu_create(const struct config *c, int max_ctx, int max_T, int n_threads) {
    struct backend *be = xcalloc(1, sizeof *be);
    struct cpu *cpu = xcalloc(1, sizeof *cpu);
    cpu->pool = pool_create(n_threads);
    /* HF: inv_freq = 1 / base ** (arange(0, dim, 2) / dim), fp32 */
    int half = c->rotary_dim / 2;
    cpu->inv_freq = xmalloc((size_t)(half > 0 ? half : 1) * sizeof(float));
    for (int j = 0; j < half; j++)
        cpu->inv_freq[j] =
            1.0f / powf((float)c->rope_theta, (float)(2 * j) / (float)c->rotary_dim);
    be->ops = &cpu_ops;
    be->config = c;
    be->max_ctx = max_ctx;
    be->max_T = max_T;
    be->snap_align = 1;
    be->impl = cpu;
    return be;
}
