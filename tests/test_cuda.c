/* test_cuda.c - every CUDA op against the CPU backend (the executable specification) on random,
 * non-zero data at the real 0.8B / 4B / 9B dimensions and the bundled demo model's (far smaller:
 * the paths for small shapes), both the decode (T = 1) and the batched
 * (T > 1) paths, split-KV attention deep into the context (4,000 and the last slot of a 32k
 * cache), a graph replayed at new positions, and argmax ties. Output buffers are poisoned with NaN before every op so an unwritten element
 * fails. Without a usable GPU it prints "skipped: <reason>" and "0 passed, 0 failed".
 *
 * Tolerances: both backends round to bf16 at the same points and accumulate in fp32, but in a
 * different order (tree vs sequential sums, online vs two-pass softmax), so a value that lands
 * near a bf16 rounding boundary may round the other way: one bf16 ulp (2^-8 .. 2^-7 relative),
 * and a flip early in a chain (GDN: o -> norm -> weight) can move a later value by another ulp.
 * bf16 outputs must therefore agree within 2^-6 relative (2^-5 for SwiGLU's product of two
 * rounded factors) + 2^-8 of the output's RMS (2^-7 for attention, whose softmax weights all
 * move with a flipped q or k) at every element, and within 5e-3 in relative L2; the fp32 recurrent state within 1e-3 relative
 * L2 (its inputs are identical bf16 values; only summation order and rare conv/SiLU rounding
 * flips differ). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/backend.h"
#include "model/config.h"
#include "model/cuda/cuda.h"
#include "harness.h"
#include "util.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rng_next(void) {
    uint64_t x = rng_state;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    rng_state = x;
    return x * 0x2545f4914f6cdd1dull;
}
/* uniform in [-a, a], never exactly zero after bf16 rounding for the scales used here */
static float rnd(float a) {
    float u = (float)((rng_next() >> 40) & 0xffffff) / 16777216.0f; /* [0, 1) */
    float v = (2.0f * u - 1.0f) * a;
    return v == 0.0f ? a * 0.5f : v;
}
static uint16_t *rand_bf16(size_t n, float a) {
    uint16_t *p = xmalloc(n * 2);
    /* one stream per 1M-element chunk, seeded from the chunk's index: fast fill of multi-GB
     * tables in parallel, the same values whatever the thread count or schedule */
    const size_t CH = (size_t)1 << 20, nch = (n + CH - 1) / CH;
    const uint64_t base = rng_next();
#pragma omp parallel for schedule(static)
    for (size_t ch = 0; ch < nch; ch++) {
        uint64_t s = base ^ (0x9e3779b97f4a7c15ull * (uint64_t)(ch + 1));
        if (!s) s = 1;
        for (size_t i = ch * CH; i < n && i < (ch + 1) * CH; i++) {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            float u = (float)((s >> 40) & 0xffffff) / 16777216.0f;
            float v = (2.0f * u - 1.0f) * a;
            p[i] = f32_to_bf16(v == 0.0f ? a * 0.5f : v);
        }
    }
    return p;
}
static float *rand_f32(size_t n, float a) {
    float *p = xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) p[i] = rnd(a);
    return p;
}

/* ---- configs of the real sizes (qwen35-model.md 1.3) and of the bundled demo model ----------- */

static struct config make_config(const char *size) {
    struct config c;
    memset(&c, 0, sizeof c);
    snprintf(c.architecture, sizeof c.architecture, "Qwen3_5ForConditionalGeneration");
    c.vocab_size = 248320;
    c.linear_conv_kernel_dim = 4;
    c.linear_key_head_dim = c.linear_value_head_dim = 128;
    c.linear_num_key_heads = 16;
    c.head_dim = 256;
    c.rms_norm_eps = 1e-6f;
    c.rope_theta = 1e7;
    c.partial_rotary_factor = 0.25f;
    c.max_position_embeddings = 262144;
    if (!strcmp(size, "0.8B")) {
        c.hidden_size = 1024, c.intermediate_size = 3584, c.num_hidden_layers = 24;
        c.num_attention_heads = 8, c.num_key_value_heads = 2, c.linear_num_value_heads = 16;
        c.tie_word_embeddings = 1;
    } else if (!strcmp(size, "4B")) {
        c.hidden_size = 2560, c.intermediate_size = 9216, c.num_hidden_layers = 32;
        c.num_attention_heads = 16, c.num_key_value_heads = 4, c.linear_num_value_heads = 32;
        c.tie_word_embeddings = 1;
    } else if (!strcmp(size, "demo")) { /* demo/config.json: shapes far below the real ones */
        c.vocab_size = 151936;
        c.hidden_size = 64, c.intermediate_size = 256, c.num_hidden_layers = 8;
        c.num_attention_heads = 4, c.num_key_value_heads = 2, c.head_dim = 64;
        c.linear_key_head_dim = c.linear_value_head_dim = 32;
        c.linear_num_key_heads = 2, c.linear_num_value_heads = 2;
        c.max_position_embeddings = 32768;
        c.tie_word_embeddings = 1;
    } else if (!strcmp(size, "27B")) { /* GQA group 6; 3 DeltaNet value heads per key head */
        c.hidden_size = 5120, c.intermediate_size = 17408, c.num_hidden_layers = 64;
        c.num_attention_heads = 24, c.num_key_value_heads = 4, c.linear_num_value_heads = 48;
    } else {
        c.hidden_size = 4096, c.intermediate_size = 12288, c.num_hidden_layers = 32;
        c.num_attention_heads = 16, c.num_key_value_heads = 4, c.linear_num_value_heads = 32;
    }
    for (int l = 0; l < c.num_hidden_layers; l++)
        c.layer_types[l] = (l + 1) % 4 == 0 ? LAYER_FULL_ATTENTION : LAYER_LINEAR_ATTENTION;
    c.rotary_dim = (int)(c.head_dim * c.partial_rotary_factor);
    c.key_dim = c.linear_num_key_heads * c.linear_key_head_dim;
    c.value_dim = c.linear_num_value_heads * c.linear_value_head_dim;
    c.conv_dim = 2 * c.key_dim + c.value_dim;
    c.n_full_layers = c.num_hidden_layers / 4;
    c.n_linear_layers = c.num_hidden_layers - c.n_full_layers;
    return c;
}

/* ---- device helpers -------------------------------------------------------------------------- */

struct pair {
    struct backend *cpu, *gpu;
};

static void *up(struct backend *be, const void *src, size_t bytes) {
    void *d = be->ops->alloc(be, bytes);
    be->ops->upload(be, d, src, bytes);
    return d;
}
static void *down(struct backend *be, const void *d, size_t bytes) {
    void *h = xmalloc(bytes);
    be->ops->download(be, h, d, bytes);
    return h;
}
static void poison(struct backend *be, void *d, size_t bytes) {
    uint8_t *h = xmalloc(bytes);
    memset(h, 0xff, bytes); /* bf16 0xffff and fp32 0xffffffff are NaN */
    be->ops->upload(be, d, h, bytes);
    free(h);
}

/* Compares n bf16 values; returns 1 when within the tolerance stated at the top. */
static int close_bf16_tol3(const char *what, const uint16_t *got, const uint16_t *ref, size_t n,
                           double rel_tol, double rms_frac, double l2_tol) {
    double ss = 0, se = 0;
    for (size_t i = 0; i < n; i++) {
        double r = bf16_to_f32(ref[i]);
        ss += r * r;
    }
    double rms = sqrt(ss / (double)(n ? n : 1));
    size_t bad = 0, worst = 0;
    double worst_e = 0;
    for (size_t i = 0; i < n; i++) {
        double r = bf16_to_f32(ref[i]), g = bf16_to_f32(got[i]);
        double e = fabs(g - r), tol = fabs(r) * rel_tol + rms * rms_frac;
        if (!(e <= tol)) {
            if (bad == 0 || !(e <= worst_e)) worst = i, worst_e = e;
            bad++;
        }
        se += isnan(e) ? 1e30 : e * e;
    }
    double rel = ss > 0 ? sqrt(se / ss) : sqrt(se);
    int ok = bad == 0 && rel < l2_tol;
    printf("  %-44s n=%-9zu rel_l2=%.2e bad=%zu%s\n", what, n, rel, bad, ok ? "" : "  <-- FAIL");
    if (!ok && bad)
        printf("    worst at %zu: got %g want %g\n", worst, bf16_to_f32(got[worst]),
               bf16_to_f32(ref[worst]));
    return ok;
}
static int close_bf16_tol(const char *what, const uint16_t *got, const uint16_t *ref, size_t n,
                          double rel_tol) {
    return close_bf16_tol3(what, got, ref, n, rel_tol, 1.0 / 256, 5e-3);
}
static int close_bf16(const char *what, const uint16_t *got, const uint16_t *ref, size_t n) {
    return close_bf16_tol(what, got, ref, n, 1.0 / 64);
}
static int close_f32(const char *what, const float *got, const float *ref, size_t n) {
    double ss = 0, se = 0;
    for (size_t i = 0; i < n; i++) {
        ss += (double)ref[i] * ref[i];
        double e = (double)got[i] - ref[i];
        se += isnan(e) ? 1e30 : e * e;
    }
    double rel = ss > 0 ? sqrt(se / ss) : sqrt(se);
    int ok = rel < 1e-3;
    printf("  %-44s n=%-9zu rel_l2=%.2e%s\n", what, n, rel, ok ? "" : "  <-- FAIL");
    return ok;
}

/* ---- op checks ------------------------------------------------------------------------------- */

static void check_matmul(struct pair *p, const char *tag, int T, int N, int K, int norm, int acc) {
    size_t nx = (size_t)T * K, nw = (size_t)N * K, no = (size_t)T * N;
    uint16_t *x = rand_bf16(nx, 2.0f), *w = rand_bf16(nw, 0.05f), *nw_ = rand_bf16(K, 0.5f);
    uint16_t *o0 = rand_bf16(no, 1.0f);
    uint16_t *res[2];
    struct backend *bes[2] = {p->cpu, p->gpu};
    for (int b = 0; b < 2; b++) {
        struct backend *be = bes[b];
        void *dx = up(be, x, nx * 2), *dw = up(be, w, nw * 2), *dn = up(be, nw_, (size_t)K * 2);
        void *dout = be->ops->alloc(be, no * 2);
        if (acc) be->ops->upload(be, dout, o0, no * 2);
        else if (b == 1) poison(be, dout, no * 2);
        be->ops->matmul(be, dout, dx, norm ? dn : NULL, dw, T, N, K, acc);
        res[b] = down(be, dout, no * 2);
        be->ops->free(be, dx), be->ops->free(be, dw), be->ops->free(be, dn), be->ops->free(be, dout);
    }
    char what[128];
    snprintf(what, sizeof what, "%s matmul T=%d N=%d K=%d%s%s", tag, T, N, K, norm ? " norm" : "",
             acc ? " +res" : "");
    /* with the residual: where it and the product nearly cancel, one ulp of the bf16 product
     * (~2^-8 of the RMS here) stays whole in the sum, so the absolute term is 2^-7 of the RMS, as
     * check_gdn's (seen: the demo's shape-4 GEMV, one element of 64 over 2^-8 once the random
     * stream moved) */
    EXPECT(acc ? close_bf16_tol3(what, res[1], res[0], no, 1.0 / 64, 1.0 / 128, 5e-3)
               : close_bf16(what, res[1], res[0], no), "%s", what);
    free(x), free(w), free(nw_), free(o0), free(res[0]), free(res[1]);
}

static void check_swiglu(struct pair *p, const char *tag, int T, int I, int K) {
    size_t nx = (size_t)T * K, nw = (size_t)2 * I * K, no = (size_t)T * I;
    uint16_t *x = rand_bf16(nx, 2.0f), *w = rand_bf16(nw, 0.05f), *nw_ = rand_bf16(K, 0.5f);
    uint16_t *res[2];
    struct backend *bes[2] = {p->cpu, p->gpu};
    for (int b = 0; b < 2; b++) {
        struct backend *be = bes[b];
        void *dx = up(be, x, nx * 2), *dw = up(be, w, nw * 2), *dn = up(be, nw_, (size_t)K * 2);
        void *dout = be->ops->alloc(be, no * 2);
        if (b == 1) poison(be, dout, no * 2);
        be->ops->matmul_swiglu(be, dout, dx, dn, dw, T, I, K);
        res[b] = down(be, dout, no * 2);
        be->ops->free(be, dx), be->ops->free(be, dw), be->ops->free(be, dn), be->ops->free(be, dout);
    }
    char what[128];
    snprintf(what, sizeof what, "%s swiglu T=%d I=%d K=%d", tag, T, I, K);
    /* the product of two independently rounded bf16 values (silu(gate), up): each may flip one
     * ulp (<= 2^-7 relative), so 2^-5 per element here; the L2 criterion is unchanged */
    EXPECT(close_bf16_tol(what, res[1], res[0], no, 1.0 / 32), "%s", what);
    free(x), free(w), free(nw_), free(res[0]), free(res[1]);
}

/* The GEMVs between two mixers of a decode step (T = 1; T > 1: a batched step's rows GEMMs), as
 * model.c issues them (out_proj + residual, norm + gate/up + SwiGLU, down + residual, the next
 * layer's norm + input projection), each reading what the one before wrote (with programmatic
 * dependent launch, starting before it ends): after one pass against the CPU backend (tolerance
 * as above), then recorded as a graph and replayed twice more (the residual keeps accumulating),
 * and the CUDA result of those three passes must equal three plain passes bit for bit. */
static void check_chain(struct pair *p, const struct config *c, const char *tag, int T) {
    int H = c->hidden_size, I = c->intermediate_size, V = c->value_dim;
    int R = c->conv_dim + c->value_dim + 2 * c->linear_num_value_heads;
    uint16_t *h = rand_bf16((size_t)T * H, 2.0f), *mix = rand_bf16((size_t)T * V, 2.0f);
    uint16_t *wo = rand_bf16((size_t)H * V, 0.05f), *wgu = rand_bf16((size_t)2 * I * H, 0.05f);
    uint16_t *wd = rand_bf16((size_t)H * I, 0.05f), *wi = rand_bf16((size_t)R * H, 0.05f);
    uint16_t *n1 = rand_bf16(H, 0.5f), *n2 = rand_bf16(H, 0.5f);
    uint16_t *res_h[3], *res_p[3], *res3_h[3], *res3_p[3];
    struct backend *bes[3] = {p->cpu, p->gpu, p->gpu};
    for (int b = 0; b < 3; b++) {
        struct backend *be = bes[b];
        const struct backend_ops *op = be->ops;
        uint16_t *dh = up(be, h, (size_t)T * H * 2), *dmix = up(be, mix, (size_t)T * V * 2);
        uint16_t *dwo = up(be, wo, (size_t)H * V * 2);
        uint16_t *dwgu = up(be, wgu, (size_t)2 * I * H * 2), *dwd = up(be, wd, (size_t)H * I * 2);
        uint16_t *dwi = up(be, wi, (size_t)R * H * 2), *dn1 = up(be, n1, H * 2), *dn2 = up(be, n2, H * 2);
        uint16_t *dmlp = op->alloc(be, (size_t)T * I * 2), *dproj = op->alloc(be, (size_t)T * R * 2);
        if (b > 0) poison(be, dmlp, (size_t)T * I * 2), poison(be, dproj, (size_t)T * R * 2);
        int graph = b == 1; /* b == 2: the same backend, ops run directly */
        for (int r = 0; r < 3; r++) {
            if (r == 1) {
                res_h[b] = down(be, dh, (size_t)T * H * 2);
                res_p[b] = down(be, dproj, (size_t)T * R * 2);
            }
            const int key = 7 + b + 10 * T;
            if (graph && r > 1 && op->graph_replay(be, key)) continue;
            if (graph && r > 0) op->graph_begin(be, key);
            op->matmul(be, dh, dmix, NULL, dwo, T, H, V, 1);
            op->matmul_swiglu(be, dmlp, dh, dn1, dwgu, T, I, H);
            op->matmul(be, dh, dmlp, NULL, dwd, T, H, I, 1);
            op->matmul(be, dproj, dh, dn2, dwi, T, R, H, 0);
            if (graph && r > 0) op->graph_end(be, key);
        }
        res3_h[b] = down(be, dh, (size_t)T * H * 2);
        res3_p[b] = down(be, dproj, (size_t)T * R * 2);
        void *bufs[] = {dh, dmix, dwo, dwgu, dwd, dwi, dn1, dn2, dmlp, dproj};
        for (int i = 0; i < 10; i++) op->free(be, bufs[i]);
    }
    char what[128];
    /* four dependent roundings deep, two of them through an RMSNorm: a SwiGLU output one ulp
     * apart moves every element of h and then of the projection a little, and an output that
     * nearly cancels keeps that absolute error: 2^-5 relative + 2^-6 of the RMS per element,
     * 1e-2 relative L2 (seen: <= 3.4e-3) */
    snprintf(what, sizeof what, "%s 4 dependent GEMVs T=%d, residual", tag, T);
    EXPECT(close_bf16_tol3(what, res_h[1], res_h[0], (size_t)T * H, 1.0 / 32, 1.0 / 64, 1e-2), "%s", what);
    snprintf(what, sizeof what, "%s 4 dependent GEMVs T=%d, next input proj", tag, T);
    EXPECT(close_bf16_tol3(what, res_p[1], res_p[0], (size_t)T * R, 1.0 / 32, 1.0 / 64, 1e-2), "%s", what);
    int same = !memcmp(res3_h[1], res3_h[2], (size_t)T * H * 2) &&
               !memcmp(res3_p[1], res3_p[2], (size_t)T * R * 2);
    snprintf(what, sizeof what, "x3 as a graph vs x3 direct, T=%d", T);
    printf("  %-44s %s\n", what, same ? "bit-identical" : "DIFFER  <-- FAIL");
    EXPECT(same, "%s GEMVs (T = %d) replayed as a graph differ from direct runs", tag, T);
    free(h), free(mix), free(wo), free(wgu), free(wd), free(wi), free(n1), free(n2);
    for (int b = 0; b < 3; b++) free(res_h[b]), free(res_p[b]), free(res3_h[b]), free(res3_p[b]);
}

/* Attention of T tokens at position pos0 with the cache already holding pos0 random entries.
 * With graph_steps > 0 (T = 1): the op is captured once and replayed at pos0+1, pos0+2, ... */
/* Attention of T tokens at pos0 against a random cache (graph_steps > 0: a graph recorded once and
 * replayed at pos0 .. pos0 + graph_steps - 1). With spread > 0 cache row j's keys are scaled by
 * 1 + spread * h(j) / 16 (h: a hash of j, 0..15), so scores range widely and a later key often
 * passes the running max by far: the decode walk's lazy rescale (attention.cu, DEC_TH) and the
 * merge of partials with very different maxima are exercised, not only the first group's. */
static void check_attention_k(struct pair *p, const struct config *c, const char *tag, int max_ctx,
                              int pos0, int T, int graph_steps, float spread, int with_in, int q_from) {
    int nH = c->num_attention_heads, nKV = c->num_key_value_heads, hd = c->head_dim, H = c->hidden_size;
    size_t row = (size_t)2 * nH * hd + 2 * nKV * hd;
    int steps = graph_steps > 0 ? graph_steps : 1;
    /* a graph records this call's buffers: one key per starting position, never replayed by a
     * later call whose buffers differ */
    const int gkey = (with_in ? 2000 : 1000) + pos0;
    /* with_in: the GPU computes qkv itself from h (the model's path; in decode the short kernel
     * then starts before the qkv GEMV has finished), and the CPU attends over that qkv; the
     * projection is compared on its own */
    uint16_t *hs = with_in ? rand_bf16((size_t)steps * T * H, 1.0f) : NULL;
    uint16_t *win = with_in ? rand_bf16(row * H, 0.05f) : NULL, *inw = with_in ? rand_bf16(H, 0.5f) : NULL;
    uint16_t *gqkv[8] = {NULL};
    size_t nqkv = (size_t)T * row * steps, nout = (size_t)T * nH * hd;
    size_t ncache = (size_t)nKV * max_ctx * hd;
    uint16_t *qkv = rand_bf16(nqkv, 2.0f), *qn = rand_bf16(hd, 0.5f), *kn = rand_bf16(hd, 0.5f);
    uint16_t *kc = rand_bf16(ncache, 1.0f), *vc = rand_bf16(ncache, 1.0f);
    if (spread > 0.0f)
        for (size_t r = 0; r < (size_t)nKV * max_ctx; r++) {
            const uint32_t j = (uint32_t)(r % (size_t)max_ctx), h = (j * 2654435761u) >> 28;
            const float f = 1.0f + spread * (float)h / 16.0f;
            for (int d = 0; d < hd; d++) kc[r * hd + d] = f32_to_bf16(bf16_to_f32(kc[r * hd + d]) * f);
        }
    uint16_t *res[2][8], *kres[2], *vres[2];
    struct backend *bes[2] = {p->cpu, p->gpu};
    CHECK(steps <= 8);
    for (int bi = 0; bi < 2; bi++) {
        const int b = with_in ? 1 - bi : bi, own_in = with_in && b == 1;
        struct backend *be = bes[b];
        void *dqkv = up(be, qkv, nqkv * 2), *dqn = up(be, qn, hd * 2), *dkn = up(be, kn, hd * 2);
        void *dh = own_in ? be->ops->alloc(be, (size_t)T * H * 2) : NULL;
        void *dwin = own_in ? up(be, win, row * H * 2) : NULL, *dinw = own_in ? up(be, inw, H * 2) : NULL;
        void *dk = up(be, kc, ncache * 2), *dv = up(be, vc, ncache * 2);
        void *dout = be->ops->alloc(be, nout * 2);
        int32_t *dpos = be->ops->alloc(be, 4);
        void *dstep = be->ops->alloc(be, (size_t)T * row * 2); /* the graph reads a fixed buffer */
        for (int s = 0; s < steps; s++) {
            int32_t pos = pos0 + s;
            be->ops->upload(be, dpos, &pos, 4);
            if (own_in)
                be->ops->upload(be, dh, hs + (size_t)s * T * H, (size_t)T * H * 2);
            else
                be->ops->upload(be, dstep, with_in ? gqkv[s] : qkv + (size_t)s * T * row, (size_t)T * row * 2);
            if (b == 1) poison(be, dout, nout * 2);
            if (graph_steps > 0) {
                if (!be->ops->graph_replay(be, gkey)) {
                    be->ops->graph_begin(be, gkey);
                    be->ops->attention(be, dout, dstep, dh, dinw, dwin, dqn, dkn, dk, dv, dpos, T, q_from);
                    be->ops->graph_end(be, gkey);
                }
            } else {
                be->ops->attention(be, dout, dstep, dh, dinw, dwin, dqn, dkn, dk, dv, dpos, T, q_from);
            }
            res[b][s] = down(be, dout, nout * 2);
            if (own_in) gqkv[s] = down(be, dstep, (size_t)T * row * 2);
        }
        kres[b] = down(be, dk, ncache * 2);
        vres[b] = down(be, dv, ncache * 2);
        void *bufs[] = {dqkv, dqn, dkn, dk, dv, dout, dpos, dstep, dh, dwin, dinw};
        for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
            if (bufs[i]) be->ops->free(be, bufs[i]);
    }
    char what[160];
    if (with_in) { /* each step's GPU qkv against the CPU's projection of the same h */
        struct backend *be = p->cpu;
        void *dh = be->ops->alloc(be, (size_t)T * H * 2), *dout = be->ops->alloc(be, (size_t)T * row * 2);
        void *dinw = up(be, inw, H * 2), *dwin = up(be, win, row * H * 2);
        for (int s = 0; s < steps; s++) {
            be->ops->upload(be, dh, hs + (size_t)s * T * H, (size_t)T * H * 2);
            be->ops->matmul(be, dout, dh, dinw, dwin, T, (int)row, H, 0);
            uint16_t *cq = down(be, dout, (size_t)T * row * 2);
            snprintf(what, sizeof what, "%s attention qkv T=%d pos=%d%s", tag, T, pos0 + s, graph_steps ? " (graph)" : "");
            EXPECT(close_bf16(what, gqkv[s], cq, (size_t)T * row), "%s", what);
            free(cq), free(gqkv[s]);
        }
        void *bufs[] = {dh, dout, dinw, dwin};
        for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) be->ops->free(be, bufs[i]);
    }
    for (int s = 0; s < steps; s++) {
        char from[32] = "";
        if (q_from) snprintf(from, sizeof from, " (queries from %d)", q_from);
        snprintf(what, sizeof what, "%s attention%s T=%d pos=%d%s%s%s", tag, with_in ? " +qkv" : "", T,
                 pos0 + s, graph_steps ? " (graph)" : "", spread > 0.0f ? " (spread keys)" : "", from);
        /* a k or q value one bf16 ulp apart after its norm and RoPE (summation order) moves a
         * score by ~2^-8 of itself and every softmax weight with it: an output that is a small
         * difference of values gets an absolute error of ~2^-8 of their scale, so the absolute
         * term here is 2^-7 of the RMS (seen: 0.0018 at an RMS of ~0.3 on a 9B prompt) */
        /* prefill over spread keys: near-tied large scores; the rare one-ulp flips of q and k
         * between the backends' own norms (k cache check below) move such a score by up to
         * ~2^-8 * 2 * 7.6 / 16 and shift weight between the tied keys (seen: 0.0020 for 0.0001,
         * 9B T = 300 at 700, alike with bf16 and split P): 2^-6 of the RMS there */
        const double abs_frac = spread > 0.0f && T > 1 ? 1.0 / 64 : 1.0 / 128;
        const size_t o0 = (size_t)q_from * nH * hd; /* rows before q_from: unspecified */
        EXPECT(close_bf16_tol3(what, res[1][s] + o0, res[0][s] + o0, nout - o0, 1.0 / 64, abs_frac, 5e-3), "%s",
               what);
        free(res[0][s]), free(res[1][s]);
    }
    snprintf(what, sizeof what, "%s k cache after pos=%d T=%d", tag, pos0, T);
    /* a normed k value one bf16 ulp apart (its sum of squares in another order) enters RoPE's
     * two rounded products; where they nearly cancel, the key moves by an ulp of the products,
     * several of its own (seen: 0.539 for 0.555 in a 0.8B prefill at an RMS of ~1), so the
     * absolute term is 2^-5 of the RMS: a wrong position, rotation or head is still off by ~1 */
    EXPECT(close_bf16_tol3(what, kres[1], kres[0], ncache, 1.0 / 64, 1.0 / 32, 5e-3), "%s", what);
    snprintf(what, sizeof what, "%s v cache after pos=%d T=%d", tag, pos0, T);
    EXPECT(close_bf16(what, vres[1], vres[0], ncache), "%s", what);
    free(qkv), free(qn), free(kn), free(kc), free(vc);
    free(kres[0]), free(kres[1]), free(vres[0]), free(vres[1]);
    free(hs), free(win), free(inw);
}

static void check_attention(struct pair *p, const struct config *c, const char *tag, int max_ctx,
                            int pos0, int T, int graph_steps) {
    check_attention_k(p, c, tag, max_ctx, pos0, T, graph_steps, 0.0f, 0, 0);
}

/* GDN (the mixer, out_proj and its residual add) over `calls` consecutive calls of T tokens
 * each from a random state at position pos0 (the conv ring's columns then rotate). The residual
 * is reset before every call: summed over calls, a one-ulp difference of a large partial sum
 * becomes many ulps of a smaller total (seen: 8 ulps at 0.39 after two 45-token calls). */
static void check_gdn_as(struct pair *p, const struct config *c, const char *tag, int T, int calls,
                         int graph, int pos0, int with_in, int mixer_only) {
    int Hv = c->linear_num_value_heads, dk = c->linear_key_head_dim, dv = c->linear_value_head_dim;
    /* mixer_only: W_out NULL, the op stops before out_proj and "h" is its output (T, value_dim) */
    int K = c->linear_conv_kernel_dim, H = mixer_only ? c->value_dim : c->hidden_size;
    size_t row = (size_t)c->conv_dim + c->value_dim + 2 * Hv;
    size_t nproj = (size_t)T * row, nh = (size_t)T * H, nwo = (size_t)H * c->value_dim;
    size_t nconv = (size_t)c->conv_dim * K, nst = (size_t)Hv * dk * dv;
    uint16_t *proj = rand_bf16(nproj * calls, 3.0f), *cw = rand_bf16(nconv, 0.5f);
    uint16_t *cs = rand_bf16(nconv, 3.0f), *wo = rand_bf16(nwo, 0.05f), *h0 = rand_bf16(nh, 0.1f);
    float *A_log = rand_f32(Hv, 1.0f), *dt_bias = rand_f32(Hv, 1.0f), *nw = rand_f32(dv, 1.0f);
    float *st = rand_f32(nst, 0.5f);
    /* with_in: the GPU computes proj itself from h (the model's path; in decode the step then
     * starts before the in_proj GEMV has finished), and the CPU runs the mixer on that proj (the
     * two in_projs may round differently, which the mixer amplifies); the in_proj is compared
     * on its own */
    uint16_t *win = with_in ? rand_bf16(row * H, 0.05f) : NULL, *inw = with_in ? rand_bf16(H, 0.5f) : NULL;
    for (int i = 0; i < Hv; i++) A_log[i] = bf16r(A_log[i]), dt_bias[i] = bf16r(dt_bias[i]);
    for (int i = 0; i < dv; i++) nw[i] = bf16r(1.0f + 0.5f * nw[i]);
    uint16_t *res[2][8], *cres[2];
    float *sres[2];
    struct backend *bes[2] = {p->cpu, p->gpu};
    uint16_t *gproj[8] = {NULL};
    CHECK(calls <= 8);
    for (int bi = 0; bi < 2; bi++) {
        const int b = with_in ? 1 - bi : bi, own_in = with_in && b == 1;
        struct backend *be = bes[b];
        void *dproj = be->ops->alloc(be, nproj * 2), *dcw = up(be, cw, nconv * 2);
        void *dcs = up(be, cs, nconv * 2), *dwo = mixer_only ? NULL : up(be, wo, nwo * 2);
        void *dh = up(be, h0, nh * 2);
        void *dA = up(be, A_log, Hv * 4), *ddt = up(be, dt_bias, Hv * 4), *dnw = up(be, nw, dv * 4);
        void *dst = up(be, st, nst * 4), *dpos = be->ops->alloc(be, sizeof(int32_t));
        void *dwin = own_in ? up(be, win, row * H * 2) : NULL, *dinw = own_in ? up(be, inw, H * 2) : NULL;
        for (int s = 0; s < calls; s++) {
            int32_t pos = pos0 + s * T;
            be->ops->upload(be, dpos, &pos, sizeof pos);
            if (!own_in) be->ops->upload(be, dproj, with_in ? gproj[s] : proj + (size_t)s * nproj, nproj * 2);
            be->ops->upload(be, dh, h0, nh * 2); /* a fresh residual: no cancellation across calls */
            if (graph) {
                const int key = with_in ? 13 : 12;
                if (!be->ops->graph_replay(be, key)) {
                    be->ops->graph_begin(be, key);
                    be->ops->gdn(be, dh, dproj, dinw, dwin, dcs, dcw, dA, ddt, dnw, dst, dwo, dpos, T, NULL);
                    be->ops->graph_end(be, key);
                }
            } else {
                be->ops->gdn(be, dh, dproj, dinw, dwin, dcs, dcw, dA, ddt, dnw, dst, dwo, dpos, T, NULL);
            }
            res[b][s] = down(be, dh, nh * 2);
            if (own_in) gproj[s] = down(be, dproj, nproj * 2);
        }
        cres[b] = down(be, dcs, nconv * 2);
        sres[b] = down(be, dst, nst * 4);
        void *bufs[] = {dproj, dcw, dcs, dwo, dh, dA, ddt, dnw, dst, dpos, dwin, dinw};
        for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
            if (bufs[i]) be->ops->free(be, bufs[i]);
    }
    char what[160];
    if (with_in) { /* the GPU's in_proj (every call's: h is the same) against the CPU's */
        struct backend *be = p->cpu;
        void *dh = up(be, h0, nh * 2), *dinw = up(be, inw, H * 2), *dwin = up(be, win, row * H * 2);
        void *dout = be->ops->alloc(be, nproj * 2);
        be->ops->matmul(be, dout, dh, dinw, dwin, T, (int)row, H, 0);
        uint16_t *cp = down(be, dout, nproj * 2);
        for (int s = 0; s < calls; s++) {
            snprintf(what, sizeof what, "%s gdn in_proj T=%d call %d%s", tag, T, s, graph ? " (graph)" : "");
            EXPECT(close_bf16(what, gproj[s], cp, nproj), "%s", what);
            free(gproj[s]);
        }
        free(cp);
        void *bufs[] = {dh, dinw, dwin, dout};
        for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) be->ops->free(be, bufs[i]);
    }
    for (int s = 0; s < calls; s++) {
        snprintf(what, sizeof what, "%s gdn%s%s T=%d pos %d call %d%s", tag, with_in ? " +in_proj" : "",
                 mixer_only ? " (no out_proj)" : "", T, pos0, s, graph ? " (graph)" : "");
        /* the residual plus the projection: where they nearly cancel, an ulp or two of either
         * (the state after a call differs by fp32 rounding) is many of the sum (seen: 0.0303 for
         * 0.0288 in the demo's second 45-token call), so the absolute term is 2^-7 of the RMS */
        EXPECT(close_bf16_tol3(what, res[1][s], res[0][s], nh, 1.0 / 64, 1.0 / 128, 5e-3), "%s", what);
        free(res[0][s]), free(res[1][s]);
    }
    snprintf(what, sizeof what, "%s gdn conv state T=%d pos %d x%d", tag, T, pos0, calls);
    EXPECT(close_bf16(what, cres[1], cres[0], nconv), "%s", what);
    snprintf(what, sizeof what, "%s gdn recurrent state T=%d pos %d x%d", tag, T, pos0, calls);
    EXPECT(close_f32(what, sres[1], sres[0], nst), "%s", what);
    free(proj), free(cw), free(cs), free(wo), free(h0), free(A_log), free(dt_bias), free(nw);
    free(win), free(inw);
    free(st), free(cres[0]), free(cres[1]), free(sres[0]), free(sres[1]);
}

static void check_gdn(struct pair *p, const struct config *c, const char *tag, int T, int calls,
                      int graph, int pos0, int with_in) {
    check_gdn_as(p, c, tag, T, calls, graph, pos0, with_in, 0);
}

/* A batched step's mixers (attention_rows, gdn_rows): B sequences at different positions, each
 * with its own caches / states, against the CPU's rows (which are the T = 1 ops, one by one). */
static void check_rows(struct pair *p, const struct config *c, const char *tag, int max_ctx, int B) {
    const int nH = c->num_attention_heads, nKV = c->num_key_value_heads, hd = c->head_dim;
    const int Hv = c->linear_num_value_heads, dk = c->linear_key_head_dim, dv = c->linear_value_head_dim;
    const int K = c->linear_conv_kernel_dim;
    const size_t arow = (size_t)2 * nH * hd + 2 * nKV * hd, grow = (size_t)c->conv_dim + c->value_dim + 2 * Hv;
    const size_t ncache = (size_t)nKV * max_ctx * hd, nconv = (size_t)c->conv_dim * K, nst = (size_t)Hv * dk * dv;
    CHECK(B <= 8);
    int32_t pos[8];
    for (int b = 0; b < B; b++) pos[b] = (int32_t)((b * 1237 + 3) % (max_ctx - 1));
    uint16_t *qkv = rand_bf16((size_t)B * arow, 2.0f), *qn = rand_bf16(hd, 0.5f), *kn = rand_bf16(hd, 0.5f);
    uint16_t *proj = rand_bf16((size_t)B * grow, 3.0f), *cw = rand_bf16(nconv, 0.5f);
    float *A_log = rand_f32(Hv, 1.0f), *dt_bias = rand_f32(Hv, 1.0f), *nw = rand_f32(dv, 1.0f);
    for (int i = 0; i < Hv; i++) A_log[i] = bf16r(A_log[i]), dt_bias[i] = bf16r(dt_bias[i]);
    for (int i = 0; i < dv; i++) nw[i] = bf16r(1.0f + 0.5f * nw[i]);
    uint16_t *kc[8], *vc[8], *cs[8];
    float *st[8];
    for (int b = 0; b < B; b++) {
        kc[b] = rand_bf16(ncache, 1.0f), vc[b] = rand_bf16(ncache, 1.0f);
        cs[b] = rand_bf16(nconv, 3.0f), st[b] = rand_f32(nst, 0.5f);
    }
    struct backend *bes[2] = {p->cpu, p->gpu};
    uint16_t *aout[2], *gout[2], *kres[2][8], *cres[2][8];
    float *sres[2][8];
    /* each row's blocks as a sequence holds them: a KV block with another layer's caches first
     * (so the offsets matter), a DeltaNet block with its state then its conv ring */
    const size_t k_off = 2 * ncache * 2, v_off = k_off + ncache * 2;
    const size_t state_off = 256, conv_off = state_off + nst * 4 + 512;
    for (int i = 0; i < 2; i++) {
        struct backend *be = bes[i];
        char *kvb[8], *gb[8];
        for (int b = 0; b < B; b++) {
            kvb[b] = be->ops->alloc(be, v_off + ncache * 2);
            gb[b] = be->ops->alloc(be, conv_off + nconv * 2);
            be->ops->upload(be, kvb[b] + k_off, kc[b], ncache * 2);
            be->ops->upload(be, kvb[b] + v_off, vc[b], ncache * 2);
            be->ops->upload(be, gb[b] + state_off, st[b], nst * 4);
            be->ops->upload(be, gb[b] + conv_off, cs[b], nconv * 2);
        }
        void *dqkv = up(be, qkv, (size_t)B * arow * 2), *dqn = up(be, qn, hd * 2), *dkn = up(be, kn, hd * 2);
        void *dproj = up(be, proj, (size_t)B * grow * 2), *dcw = up(be, cw, nconv * 2);
        void *dA = up(be, A_log, Hv * 4), *ddt = up(be, dt_bias, Hv * 4), *dnw = up(be, nw, dv * 4);
        void *dpos = up(be, pos, (size_t)B * 4), *dkvt = up(be, kvb, sizeof kvb), *dgt = up(be, gb, sizeof gb);
        void *daout = be->ops->alloc(be, (size_t)B * nH * hd * 2), *dgout = be->ops->alloc(be, (size_t)B * c->value_dim * 2);
        const struct backend_rows rows = {dpos, dkvt, dgt};
        be->ops->attention_rows(be, daout, dqkv, dqn, dkn, &rows, k_off, v_off, B);
        be->ops->gdn_rows(be, dgout, dproj, dcw, dA, ddt, dnw, &rows, state_off, conv_off, B);
        aout[i] = down(be, daout, (size_t)B * nH * hd * 2);
        gout[i] = down(be, dgout, (size_t)B * c->value_dim * 2);
        for (int b = 0; b < B; b++) {
            kres[i][b] = down(be, kvb[b] + k_off, ncache * 2);
            cres[i][b] = down(be, gb[b] + conv_off, nconv * 2);
            sres[i][b] = down(be, gb[b] + state_off, nst * 4);
            be->ops->free(be, kvb[b]), be->ops->free(be, gb[b]);
        }
        void *bufs[] = {dqkv, dqn, dkn, dproj, dcw, dA, ddt, dnw, dpos, dkvt, dgt, daout, dgout};
        for (size_t j = 0; j < sizeof bufs / sizeof *bufs; j++) be->ops->free(be, bufs[j]);
    }
    char what[160];
    snprintf(what, sizeof what, "%s attention rows B=%d", tag, B);
    EXPECT(close_bf16(what, aout[1], aout[0], (size_t)B * nH * hd), "%s", what);
    snprintf(what, sizeof what, "%s gdn rows B=%d", tag, B);
    EXPECT(close_bf16(what, gout[1], gout[0], (size_t)B * c->value_dim), "%s", what);
    for (int b = 0; b < B; b++) {
        snprintf(what, sizeof what, "%s rows: row %d's k cache (pos %d)", tag, b, pos[b]);
        EXPECT(close_bf16(what, kres[1][b], kres[0][b], ncache), "%s", what);
        snprintf(what, sizeof what, "%s rows: row %d's conv state", tag, b);
        EXPECT(close_bf16(what, cres[1][b], cres[0][b], nconv), "%s", what);
        snprintf(what, sizeof what, "%s rows: row %d's recurrent state", tag, b);
        EXPECT(close_f32(what, sres[1][b], sres[0][b], nst), "%s", what);
        for (int i = 0; i < 2; i++) free(kres[i][b]), free(cres[i][b]), free(sres[i][b]);
        free(kc[b]), free(vc[b]), free(cs[b]), free(st[b]);
    }
    for (int i = 0; i < 2; i++) free(aout[i]), free(gout[i]);
    free(qkv), free(qn), free(kn), free(proj), free(cw), free(A_log), free(dt_bias), free(nw);
    { /* the rows' greedy choices at once (argmax_rows), a tie in row 1 (lowest index wins) */
        const int V = c->vocab_size;
        uint16_t *lg = rand_bf16((size_t)B * V, 3.0f);
        if (B > 1) lg[(size_t)V + 7] = lg[(size_t)V + V - 3] = f32_to_bf16(100.0f);
        int32_t got[2][8];
        for (int i = 0; i < 2; i++) {
            struct backend *be = bes[i];
            void *dl = up(be, lg, (size_t)B * V * 2), *dout = be->ops->alloc(be, 8 * sizeof(int32_t));
            be->ops->argmax_rows(be, dout, dl, V, B);
            be->ops->download(be, got[i], dout, (size_t)B * sizeof(int32_t));
            be->ops->free(be, dl), be->ops->free(be, dout);
        }
        snprintf(what, sizeof what, "%s argmax rows B=%d", tag, B);
        EXPECT(memcmp(got[0], got[1], (size_t)B * sizeof(int32_t)) == 0 && (B < 2 || got[1][1] == 7), "%s", what);
        printf("  %-44s %s\n", what, memcmp(got[0], got[1], (size_t)B * sizeof(int32_t)) == 0 ? "same" : "<-- FAIL");
        free(lg);
    }
}

static void check_embed_argmax(struct pair *p, const struct config *c, const char *tag,
                               const uint16_t *table) {
    int H = c->hidden_size, V = c->vocab_size, T = 6;
    int32_t ids[6] = {0, V - 1, 12345, 7, V / 2, 12345};
    uint16_t *res[2];
    struct backend *bes[2] = {p->cpu, p->gpu};
    for (int b = 0; b < 2; b++) {
        struct backend *be = bes[b];
        void *dt = up(be, table, (size_t)V * H * 2), *di = up(be, ids, sizeof ids);
        void *dout = be->ops->alloc(be, (size_t)T * H * 2);
        if (b == 1) poison(be, dout, (size_t)T * H * 2);
        be->ops->embed(be, dout, dt, di, T);
        res[b] = down(be, dout, (size_t)T * H * 2);
        be->ops->free(be, dt), be->ops->free(be, di), be->ops->free(be, dout);
    }
    char what[128];
    snprintf(what, sizeof what, "%s embed", tag);
    EXPECT(memcmp(res[0], res[1], (size_t)T * H * 2) == 0, "%s differs", what);
    free(res[0]), free(res[1]);

    /* argmax: random logits, then a planted tie at two indices (lowest must win); trials 1 and
     * 2 as a decode step's (the position advanced, the choice posted as posts 1 and 2) */
    uint16_t *x = rand_bf16((size_t)V, 8.0f);
    for (int trial = 0; trial < 3; trial++) {
        if (trial == 1) x[200001] = x[77777] = f32_to_bf16(100.0f);
        if (trial == 2) x[5] = f32_to_bf16(100.0f), x[V - 1] = f32_to_bf16(100.0f);
        int32_t got[2], posted[2] = {-1, -1}, pos[2] = {-1, -1};
        for (int b = 0; b < 2; b++) {
            struct backend *be = bes[b];
            void *dx = up(be, x, (size_t)V * 2);
            int32_t *dout = be->ops->alloc(be, 4), *dpos = NULL;
            if (trial > 0) dpos = up(be, &(int32_t){40 + trial}, 4);
            be->ops->argmax(be, dout, dx, V, dpos);
            if (dpos) posted[b] = be->ops->choice_wait(be, trial);
            be->ops->download(be, &got[b], dout, 4);
            if (dpos) be->ops->download(be, &pos[b], dpos, 4), be->ops->free(be, dpos);
            be->ops->free(be, dx), be->ops->free(be, dout);
        }
        EXPECT(got[0] == got[1], "%s argmax trial %d: cuda %d cpu %d", tag, trial, got[1], got[0]);
        if (trial > 0)
            EXPECT(posted[0] == got[0] && posted[1] == got[1] && pos[0] == 41 + trial &&
                       pos[1] == 41 + trial,
                   "%s argmax trial %d as a step's: posted cuda %d cpu %d (chose %d), position "
                   "cuda %d cpu %d (want %d)", tag, trial, posted[1], posted[0], got[0], pos[1],
                   pos[0], 41 + trial);
    }
    free(x);
}

/* The gdn op's snapshots (checkpoints taken inside a prefill call): after 64 and 128 tokens
 * where T passes them (the CUDA backend's snap_align is its chunk) and after T, the recurrent
 * state and conv ring, CUDA (written by the chunk pass, or by the short scan at its end, and the
 * ring kernel) against the CPU (copied inside its token loop); the output as in check_gdn. */
static void check_gdn_snaps(const struct config *c, const char *tag, int T, int pos0) {
    struct error err = {{0}};
    struct pair pp = {backend_cpu_create(c, 4096, 256, 0), backend_cuda_create(c, 4096, 256, &err)};
    struct pair *p = &pp;
    CHECK(pp.gpu);
    const int Hv = c->linear_num_value_heads, H = c->hidden_size;
    const size_t row = (size_t)c->conv_dim + c->value_dim + 2 * Hv, nproj = (size_t)T * row;
    const size_t nh = (size_t)T * H, nwo = (size_t)H * c->value_dim;
    const size_t nconv = (size_t)c->conv_dim * c->linear_conv_kernel_dim;
    const size_t nst = (size_t)Hv * c->linear_key_head_dim * c->linear_value_head_dim;
    uint16_t *proj = rand_bf16(nproj, 3.0f), *cw = rand_bf16(nconv, 0.5f), *cs = rand_bf16(nconv, 3.0f);
    uint16_t *wo = rand_bf16(nwo, 0.05f), *h0 = rand_bf16(nh, 0.1f);
    float *A_log = rand_f32(Hv, 1.0f), *dt_bias = rand_f32(Hv, 1.0f), *nw = rand_f32(c->linear_value_head_dim, 1.0f);
    float *st = rand_f32(nst, 0.5f);
    for (int i = 0; i < Hv; i++) A_log[i] = bf16r(A_log[i]), dt_bias[i] = bf16r(dt_bias[i]);
    for (int i = 0; i < c->linear_value_head_dim; i++) nw[i] = bf16r(1.0f + 0.5f * nw[i]);
    CHECK(p->gpu->snap_align == 64);
    int ts[3], n_ts = 0;
    for (int t = 64; t < T && t <= 128; t += 64) ts[n_ts++] = t;
    ts[n_ts++] = T;
    uint16_t *out[2], *conv[2][3];
    float *state[2][3];
    struct backend *bes[2] = {p->cpu, p->gpu};
    for (int b = 0; b < 2; b++) {
        struct backend *be = bes[b];
        void *dproj = up(be, proj, nproj * 2), *dcw = up(be, cw, nconv * 2), *dcs = up(be, cs, nconv * 2);
        void *dwo = up(be, wo, nwo * 2), *dh = up(be, h0, nh * 2), *dA = up(be, A_log, Hv * 4);
        void *ddt = up(be, dt_bias, Hv * 4), *dnw = up(be, nw, c->linear_value_head_dim * 4);
        void *dst = up(be, st, nst * 4), *dpos = up(be, &pos0, sizeof pos0);
        struct backend_snap sn = {n_ts, {0}, {NULL}, {NULL}};
        for (int i = 0; i < n_ts; i++) {
            sn.t[i] = ts[i];
            sn.state[i] = be->ops->alloc(be, nst * 4);
            sn.conv[i] = be->ops->alloc(be, nconv * 2);
        }
        be->ops->gdn(be, dh, dproj, NULL, NULL, dcs, dcw, dA, ddt, dnw, dst, dwo, dpos, T, &sn);
        out[b] = down(be, dh, nh * 2);
        for (int i = 0; i < n_ts; i++) {
            state[b][i] = down(be, sn.state[i], nst * 4);
            conv[b][i] = down(be, sn.conv[i], nconv * 2);
            be->ops->free(be, sn.state[i]);
            be->ops->free(be, sn.conv[i]);
        }
        void *bufs[] = {dproj, dcw, dcs, dwo, dh, dA, ddt, dnw, dst, dpos};
        for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) be->ops->free(be, bufs[i]);
    }
    char what[160];
    snprintf(what, sizeof what, "%s gdn with snapshots T=%d pos %d", tag, T, pos0);
    EXPECT(close_bf16_tol3(what, out[1], out[0], nh, 1.0 / 64, 1.0 / 128, 5e-3), "%s", what);
    for (int i = 0; i < n_ts; i++) {
        snprintf(what, sizeof what, "%s gdn snapshot after %d of %d: state", tag, ts[i], T);
        EXPECT(close_f32(what, state[1][i], state[0][i], nst), "%s", what);
        snprintf(what, sizeof what, "%s gdn snapshot after %d of %d: conv ring", tag, ts[i], T);
        EXPECT(close_bf16(what, conv[1][i], conv[0][i], nconv), "%s", what);
        free(state[0][i]), free(state[1][i]), free(conv[0][i]), free(conv[1][i]);
    }
    free(out[0]), free(out[1]), free(proj), free(cw), free(cs), free(wo), free(h0);
    free(A_log), free(dt_bias), free(nw), free(st);
    pp.gpu->ops->destroy(pp.gpu);
    pp.cpu->ops->destroy(pp.cpu);
}

/* The GEMM plans (cuda_gemm): after ops->warm, a prompt length never seen before asks the
 * library nothing (the hit cost of issue 25: ~0.3 ms per new length and shape, several ms per
 * kernel loaded, before); a length's result does not depend on whether the warm-up ran; a
 * T whose pointers are less aligned gets its own plan and is still right. */
static void check_gemm_plans(const char *size) {
    struct config c = make_config(size);
    const int max_T = 1024, H = c.hidden_size, I = c.intermediate_size;
    struct error err = {{0}};
    struct pair p = {backend_cpu_create(&c, 2048, max_T, 0), backend_cuda_create(&c, 2048, max_T, &err)};
    CHECK(p.gpu);
    struct backend *g = p.gpu;
    const size_t nx = (size_t)max_T * I + 8, nw = (size_t)H * I, no = (size_t)max_T * H;
    uint16_t *x = rand_bf16(nx, 2.0f), *w = rand_bf16(nw, 0.05f);
    void *dx = up(g, x, nx * 2), *dw = up(g, w, nw * 2), *dout = g->ops->alloc(g, no * 2);
    g->ops->matmul(g, dout, dx, NULL, dw, 300, H, I, 0);
    uint16_t *before = down(g, dout, (size_t)300 * H * 2);
    g->ops->warm(g);
    const long picks = backend_cuda_gemm_picks(g);
    char what[128];
    snprintf(what, sizeof what, "%s gemm plans: warm-up made plans", size);
    EXPECT(picks > 20, "%s (%ld)", what, picks);
    static const int Ts[] = {700, 1000, 257, 17, 300};
    for (size_t i = 0; i < sizeof Ts / sizeof *Ts; i++) g->ops->matmul(g, dout, dx, NULL, dw, Ts[i], H, I, 0);
    snprintf(what, sizeof what, "%s gemm plans: new lengths after the warm-up ask nothing", size);
    EXPECT(backend_cuda_gemm_picks(g) == picks, "%s (%ld more)", what, backend_cuda_gemm_picks(g) - picks);
    uint16_t *after = down(g, dout, (size_t)300 * H * 2);
    snprintf(what, sizeof what, "%s gemm plans: T 300 identical before and after the warm-up", size);
    EXPECT(!memcmp(before, after, (size_t)300 * H * 2), "%s", what);
    free(before), free(after);
    /* against the CPU: T 700 (a bucket's plan, aligned), and x 16 / 8 bytes in (other alignment
     * classes) at a bucket's top (352) and inside it (333) */
    static const int Tc[][2] = {{700, 0}, {352, 8}, {333, 8}, {352, 4}, {333, 4}};
    for (int k = 0; k < 5; k++) {
        const int T = Tc[k][0], off = Tc[k][1];
        uint16_t *res[2];
        struct backend *bes[2] = {p.cpu, p.gpu};
        for (int b = 0; b < 2; b++) {
            struct backend *be = bes[b];
            void *bx = b ? dx : up(be, x, nx * 2), *bw = b ? dw : up(be, w, nw * 2);
            void *bo = b ? dout : be->ops->alloc(be, no * 2);
            be->ops->matmul(be, bo, (uint16_t *)bx + off, NULL, bw, T, H, I, 0);
            res[b] = down(be, bo, (size_t)T * H * 2);
            if (!b) be->ops->free(be, bx), be->ops->free(be, bw), be->ops->free(be, bo);
        }
        snprintf(what, sizeof what, "%s gemm plans: T %d, x at +%d bytes", size, T, 2 * off);
        EXPECT(close_bf16(what, res[1], res[0], (size_t)T * H), "%s", what);
        free(res[0]), free(res[1]);
    }
    g->ops->free(g, dx), g->ops->free(g, dw), g->ops->free(g, dout);
    free(x), free(w);
    p.gpu->ops->destroy(p.gpu);
    p.cpu->ops->destroy(p.cpu);
}

static void check_size(const char *size) {
    struct config c = make_config(size);
    int max_ctx = 4096, max_T = 64;
    struct error err = {{0}};
    struct pair p;
    p.cpu = backend_cpu_create(&c, max_ctx, max_T, 0);
    p.gpu = backend_cuda_create(&c, max_ctx, max_T, &err);
    CHECK(p.gpu);
    printf("%s (H %d, I %d, nH %d, nKV %d, Hv %d):\n", size, c.hidden_size, c.intermediate_size,
           c.num_attention_heads, c.num_key_value_heads, c.linear_num_value_heads);
    int H = c.hidden_size, I = c.intermediate_size, nH = c.num_attention_heads;
    int nKV = c.num_key_value_heads, hd = c.head_dim;
    int gdn_rows = c.conv_dim + c.value_dim + 2 * c.linear_num_value_heads;
    int attn_rows = 2 * nH * hd + 2 * nKV * hd;
    /* the GEMV (1), the rows GEMM (2..8: one n tile, partly filled; sm_90: 2..16 by the copy
     * engine, 12 and 16 with x normed apart), cuBLAS (past those) */
    static const int Ts[] = {1, 2, 3, 7, 12, 16, 17, 32, 33};
    for (size_t ti = 0; ti < sizeof Ts / sizeof *Ts; ti++) {
        const int T = Ts[ti];
        check_matmul(&p, size, T, gdn_rows, H, 1, 0);
        check_matmul(&p, size, T, attn_rows, H, 1, 0);
        check_matmul(&p, size, T, H, c.value_dim, 0, 1);
        check_matmul(&p, size, T, H, nH * hd, 0, 1);
        check_matmul(&p, size, T, H, I, 0, 1);
        check_swiglu(&p, size, T, I, H);
    }
    check_matmul(&p, size, 1, 1000, H, 0, 0); /* odd row count */
    check_matmul(&p, size, 5, 1000, H, 1, 1); /* rows: a partly filled last tile */
    check_matmul(&p, size, 8, 1001, H, 0, 0);
    check_swiglu(&p, size, 6, 1001, H);
    check_chain(&p, &c, size, 1);
    check_chain(&p, &c, size, 2);
    check_chain(&p, &c, size, 5);
    check_chain(&p, &c, size, 12); /* the prefill GEMMs: the residual add in the next norm's pass */
    check_chain(&p, &c, size, 33);
    { /* a performance invariant, not a result: the decode DeltaNet step's block starts beside the
       * in_proj GEMV's two (runs 50, 52: 4B lost 2-4% when a GEMV change broke this) */
        char res[160];
        if (backend_cuda_residency(p.gpu, res, sizeof res)) {
            printf("  %-44s %s\n", "DeltaNet step beside two GEMV blocks", res);
            EXPECT(!strncmp(res, "fits", 4), "%s: the DeltaNet step no longer fits beside the GEMV (%s)", size, res);
        }
    }
    /* every GEMV shape (threads per row, loads per item, pipeline depth) on the decode shapes,
     * whichever the launcher would pick */
    for (int shape = 0; shape < CUDA_GEMV_SHAPES; shape++) {
        char t[32];
        struct pair q = {p.cpu, backend_cuda_create(&c, max_ctx, max_T, &err)};
        CHECK(q.gpu);
        struct cuda_test_knobs k = CUDA_TEST_KNOBS_DEFAULT;
        k.gemv_shape = shape;
        backend_cuda_test_knobs(q.gpu, &k);
        snprintf(t, sizeof t, "%s shape %d", size, shape);
        check_matmul(&q, t, 1, gdn_rows, H, 1, 0);
        check_matmul(&q, t, 1, H, c.value_dim, 0, 1);
        check_matmul(&q, t, 1, H, I, 0, 1);
        check_matmul(&q, t, 1, 1001, H, 0, 0);
        check_swiglu(&q, t, 1, I, H);
        check_gdn(&q, &c, t, 1, 1, 0, 5, 0); /* out_proj with the gated norm staged */
        q.gpu->ops->destroy(q.gpu);
    }
    uint16_t *table = rand_bf16((size_t)c.vocab_size * H, 1.0f);
    check_embed_argmax(&p, &c, size, table);
    free(table);
    check_matmul(&p, size, 1, c.vocab_size, H, 1, 0); /* lm_head */
    /* the dynamic tail (launch_gemv; the default, R = 4 from 8 rounds, ran the lm_head above):
     * R = 2 and 1 from any GEMV of R + 2 rounds (4B's in_proj and qkv at R = 1), twice on one
     * backend, so a counter not put back to zero shows as rows left poisoned */
    for (int v = 0; v < 2; v++) {
        struct pair q = {p.cpu, backend_cuda_create(&c, max_ctx, max_T, &err)};
        CHECK(q.gpu);
        struct cuda_test_knobs k = CUDA_TEST_KNOBS_DEFAULT;
        k.gemv_tail = v == 0 ? 2 : 1;
        k.gemv_tail_min = 1;
        backend_cuda_test_knobs(q.gpu, &k);
        char t[48];
        snprintf(t, sizeof t, "%s tail %d", size, v == 0 ? 2 : 1);
        for (int r = 0; r < 2; r++) {
            check_matmul(&q, t, 1, c.vocab_size, H, 1, 0);
            check_matmul(&q, t, 1, gdn_rows, H, 1, 0);
            check_matmul(&q, t, 1, attn_rows, H, 0, 0);
            check_matmul(&q, t, 1, 3 * 1001, H, 0, 0);
        }
        q.gpu->ops->destroy(q.gpu);
    }
    if (!strcmp(size, "0.8B")) check_matmul(&p, size, 16, c.vocab_size, H, 1, 0);

    check_attention(&p, &c, size, max_ctx, 0, 1, 0);
    check_attention(&p, &c, size, max_ctx, 1, 1, 0);
    check_attention(&p, &c, size, max_ctx, 300, 1, 0);
    check_attention(&p, &c, size, max_ctx, 4000, 1, 0);
    check_attention(&p, &c, size, max_ctx, 40, 1, 5);   /* graph replayed at 41..44 */
    check_attention(&p, &c, size, max_ctx, 0, 37, 0);   /* prompt */
    check_attention(&p, &c, size, max_ctx, 100, 64, 0); /* continuation chunk */
    check_attention(&p, &c, size, max_ctx, 508, 1, 8);  /* one graph across the short kernel's end */
    check_attention_k(&p, &c, size, max_ctx, 4000, 1, 0, 7.0f, 0, 0); /* lazy rescales, split walk */
    check_attention_k(&p, &c, size, max_ctx, 300, 1, 2, 7.0f, 0, 0);  /* the same keys, short kernel */
    /* the short kernel started by the qkv GEMV's count */
    check_attention_k(&p, &c, size, max_ctx, 2, 1, 0, 0.0f, 1, 0);
    check_attention_k(&p, &c, size, max_ctx, 40, 1, 5, 0.0f, 1, 0);
    check_attention_k(&p, &c, size, max_ctx, 508, 1, 8, 0.0f, 1, 0); /* and past its end */
    check_attention_k(&p, &c, size, max_ctx, 0, 7, 0, 0.0f, 1, 0);
    /* the queries from a row on (a prefill's last layer: the last token's alone) */
    check_attention_k(&p, &c, size, max_ctx, 0, 37, 0, 0.0f, 0, 36);
    check_attention_k(&p, &c, size, max_ctx, 100, 64, 0, 0.0f, 0, 20);
    check_attention_k(&p, &c, size, max_ctx, 0, 7, 0, 0.0f, 1, 6);
    /* the split kernel at short contexts too; the block-per-head kernel over 1,024 keys */
    for (int v = 0; v < 2; v++) {
        struct pair q = {p.cpu, backend_cuda_create(&c, max_ctx, max_T, &err)};
        CHECK(q.gpu);
        struct cuda_test_knobs k = CUDA_TEST_KNOBS_DEFAULT;
        k.attn_short = v == 0 ? 0 : 1024;
        backend_cuda_test_knobs(q.gpu, &k);
        char t[48];
        snprintf(t, sizeof t, "%s %s", size, v == 0 ? "split only" : "short to 1024");
        if (v == 0) {
            check_attention(&q, &c, t, max_ctx, 1, 1, 0);
            check_attention(&q, &c, t, max_ctx, 40, 1, 5);
        } else {
            check_attention(&q, &c, t, max_ctx, 700, 1, 0);
            check_attention(&q, &c, t, max_ctx, 1020, 1, 8); /* one graph across its end */
        }
        q.gpu->ops->destroy(q.gpu);
    }

    check_gdn(&p, &c, size, 1, 4, 0, 0, 0);
    check_gdn(&p, &c, size, 1, 5, 0, 7, 0);
    check_gdn(&p, &c, size, 1, 3, 1, 2, 0);
    check_gdn(&p, &c, size, 2, 1, 0, 0, 0);
    check_gdn(&p, &c, size, 2, 2, 0, 9, 0);
    check_gdn(&p, &c, size, 45, 2, 0, 3, 0);
    check_gdn(&p, &c, size, 1, 3, 0, 4, 1); /* the step started by the in_proj's count */
    check_gdn(&p, &c, size, 1, 3, 1, 6, 1);
    check_gdn(&p, &c, size, 3, 2, 0, 1, 1);
    { /* a mixed step's prompt: no out_proj; on random data of its own, so that the cases after
       * it keep theirs (in the 4B size the stream moved by these put one of 4,096,000 prefill
       * attention outputs, 0.00083 for 0.00159, past its tolerance: run 250) */
        const uint64_t saved = rng_state;
        rng_state = 0x0dd5eed0f0a7ull;
        check_gdn_as(&p, &c, size, 1, 2, 0, 5, 0, 1);
        check_gdn_as(&p, &c, size, 45, 2, 0, 3, 0, 1);
        rng_state = saved;
    }
    check_rows(&p, &c, size, max_ctx, 3);
    check_rows(&p, &c, size, max_ctx, 8);
    check_gdn_snaps(&c, size, 200, 0); /* on backends of max_T 256 */
    check_gdn_snaps(&c, size, 130, 70);
    { /* the short scan (calls of up to 32 tokens; the chunked form from 33), on random data of
       * its own so that the cases after it keep theirs (the demo's 200-token snapshot cases put
       * 3-5 of 12,800 outputs past their per-element tolerance on other data, run 211) */
        const uint64_t saved = rng_state;
        rng_state = 0x5ca11ab1e5eed5ull;
        check_gdn(&p, &c, size, 20, 2, 0, 70, 0);
        check_gdn(&p, &c, size, 32, 2, 0, 5, 0);
        check_gdn(&p, &c, size, 33, 1, 0, 0, 0);
        check_gdn_snaps(&c, size, 20, 70); /* its state at its end */
        rng_state = saved;
    }
    p.gpu->ops->destroy(p.gpu);
    p.cpu->ops->destroy(p.cpu);
}

/* The prefill kernels (flash attention on tensor cores, the chunked delta rule) on prompts of up
 * to 1,000 tokens: from position 0 and continuing a cached prefix (pos 100, 3,000), lengths that
 * are and are not multiples of their tiles (64 queries / keys, 64-token chunks), with a random
 * state carried in (check_gdn starts from one) and a second call continuing the first. The
 * tolerances are check_attention's and check_gdn's: the flash kernel rounds the softmax weights
 * to bf16 for the P V product (a relative error of ~2^-9 per weight, ~1e-3 of the output's RMS
 * where cpu.c keeps fp32 weights: far inside the 2^-7 RMS term), and the chunked delta rule is
 * the recurrent one regrouped, fp32 throughout (qwen35-model.md 4.2: ~1e-6 relative). With
 * `wide` (issue 30's shapes, 27B-like): 6 query heads per KV head and 3 value heads per key
 * head, which the decode kernels do not take yet, so prefill only (T > 1). */
static void check_prefill(const char *size, int wide) {
    struct config c = make_config(size);
    if (wide) {
        c.num_attention_heads = 24, c.linear_num_value_heads = 48;
        c.value_dim = c.linear_num_value_heads * c.linear_value_head_dim;
        c.conv_dim = 2 * c.key_dim + c.value_dim;
    }
    const int max_ctx = 4096, max_T = 1024;
    struct error err = {{0}};
    struct pair p;
    p.cpu = backend_cpu_create(&c, max_ctx, max_T, 0);
    p.gpu = backend_cuda_create(&c, max_ctx, max_T, &err);
    CHECK(p.gpu);
    char tag[48];
    snprintf(tag, sizeof tag, "%s%s prefill", size, wide ? " G6 r3" : "");
    printf("%s (nH %d, nKV %d, Hk %d, Hv %d), max_T %d:\n", tag, c.num_attention_heads,
           c.num_key_value_heads, c.linear_num_key_heads, c.linear_num_value_heads, max_T);
    check_attention(&p, &c, tag, max_ctx, 0, 2, 0);
    check_attention(&p, &c, tag, max_ctx, 0, 64, 0);
    check_attention(&p, &c, tag, max_ctx, 0, 65, 0);
    check_attention(&p, &c, tag, max_ctx, 100, 200, 0);
    check_attention(&p, &c, tag, max_ctx, 3000, 129, 0);
    if (!wide) {
        check_attention(&p, &c, tag, max_ctx, 0, 1000, 0);
        check_attention(&p, &c, tag, max_ctx, 3000, 1000, 0);
        check_attention_k(&p, &c, tag, max_ctx, 700, 300, 0, 7.0f, 0, 0); /* scores spread widely */
        check_attention_k(&p, &c, tag, max_ctx, 3000, 1000, 0, 0.0f, 0, 999); /* the last query: split keys */
    }
    check_attention_k(&p, &c, tag, max_ctx, 100, 200, 0, 0.0f, 0, 131);
    { /* the portable (mma.sync) flash kernel, which builds for sm_90a on compute capability 9.0
       * do not run otherwise */
        struct pair q = {p.cpu, backend_cuda_create(&c, max_ctx, max_T, &err)};
        CHECK(q.gpu);
        struct cuda_test_knobs k = CUDA_TEST_KNOBS_DEFAULT;
        k.flash_portable = 1;
        backend_cuda_test_knobs(q.gpu, &k);
        char t[64];
        snprintf(t, sizeof t, "%s mma.sync", tag);
        check_attention(&q, &c, t, max_ctx, 0, 65, 0);
        check_attention(&q, &c, t, max_ctx, 3000, 129, 0);
        if (!wide) check_attention(&q, &c, t, max_ctx, 0, 1000, 0);
        check_attention_k(&q, &c, t, max_ctx, 3000, 129, 0, 0.0f, 0, 128);
        q.gpu->ops->destroy(q.gpu);
    }
    for (int T = 2; T <= 7; T++) check_gdn(&p, &c, tag, T, 1, 0, T == 7 ? 300 : 0, 0);
    check_gdn(&p, &c, tag, 64, 2, 0, 0, 0);
    check_gdn(&p, &c, tag, 65, 2, 0, 130, 0);
    check_gdn(&p, &c, tag, 200, 1, 0, 0, 0);
    check_gdn(&p, &c, tag, 1000, 1, 0, wide ? 0 : 2000, 0);
    check_gdn_snaps(&c, tag, 200, 64);
    p.gpu->ops->destroy(p.gpu);
    p.cpu->ops->destroy(p.cpu);
}

/* Decode at the end of a 32,768-token cache: every split full (the two-level merge of 132 / 66
 * partials), the K/V append at the very last slot, and a graph replayed up to it. Same
 * tolerance as above: only summation order differs (over 32k keys the softmax weights are tiny
 * and fp32-summed in both backends). */
static void check_long(const char *size) {
    struct config c = make_config(size);
    int max_ctx = 32768;
    struct error err = {{0}};
    struct pair p;
    p.cpu = backend_cpu_create(&c, max_ctx, 1, 0);
    p.gpu = backend_cuda_create(&c, max_ctx, 1, &err);
    CHECK(p.gpu);
    printf("%s, context %d:\n", size, max_ctx);
    check_attention(&p, &c, size, max_ctx, max_ctx - 1, 1, 0);
    check_attention(&p, &c, size, max_ctx, max_ctx - 5, 1, 5); /* graph replayed to the last slot */
    check_attention_k(&p, &c, size, max_ctx, max_ctx - 1, 1, 0, 7.0f, 0, 0); /* scores spread widely */
    p.gpu->ops->destroy(p.gpu);
    p.cpu->ops->destroy(p.cpu);
}

/* The sample op, CUDA against the CPU (its specification) at the real vocabulary: the same
 * logits, parameters and positions draw the same tokens (only expf / logf rounding differs, which
 * moves a draw only when it lands within ~1e-7 of a boundary), and both count their choices;
 * the decode step's form (pos on the device, the choice posted) too. */
static void check_sample(void) {
    struct config c = make_config("4B");
    struct error err = {{0}};
    struct backend *bes[2] = {backend_cpu_create(&c, 64, 1, 0), backend_cuda_create(&c, 64, 1, &err)};
    CHECK(bes[1]);
    const int V = c.vocab_size, N = 200;
    uint16_t *x = rand_bf16((size_t)V, 3.0f);
    float *bias = calloc((size_t)V, sizeof *bias);
    int32_t *count0 = calloc((size_t)V, sizeof *count0);
    uint8_t *inp = calloc((size_t)V, 1);
    for (int i = 0; i < 500; i++) count0[(i * 7919) % V] += 1 + i % 3, inp[(i * 104729) % V] = 1;
    bias[11] = 5.0f, bias[12345] = -1e9f, bias[248000] = 4.0f;
    const struct backend_sampling cases[] = {
        {0.7f, 0.8f, 0.0f, 1.5f, 0.0f, 1.0f, 20, BACKEND_SAMPLE_PENALTIES, 1}, /* Qwen's */
        {1.0f, 1.0f, 0.0f, 0.0f, 0.0f, 1.0f, 64, 0, 2},
        {0.6f, 0.95f, 0.05f, 0.0f, 0.3f, 1.2f, 40, BACKEND_SAMPLE_PENALTIES | BACKEND_SAMPLE_BIAS, 3},
        {1.0f, 1.0f, 0.0f, 0.0f, 0.0f, 1.0f, 0, 0, 4},                        /* Gumbel */
        {0.8f, 1.0f, 0.0f, 0.5f, 0.0f, 1.0f, 0, BACKEND_SAMPLE_PENALTIES | BACKEND_SAMPLE_BIAS, 5},
        {1.0f, 1.0f, 0.0f, 0.0f, 0.0f, 1.0f, 1, 0, 6},
        {0.7f, 1.0f, 0.0f, 1.5f, 0.0f, 1.0f, 20, BACKEND_SAMPLE_PENALTIES | BACKEND_SAMPLE_MASK, 7},
        {1.0f, 1.0f, 0.0f, 0.0f, 0.0f, 1.0f, 0, BACKEND_SAMPLE_MASK, 8},
    };
    uint64_t *mask = calloc(((size_t)V + 63) / 64, 8); /* a grammar's: every third token */
    for (int i = 0; i < V; i += 3) mask[i / 64] |= 1ull << (i % 64);
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        int32_t ids[2][200], *cnt[2];
        for (int b = 0; b < 2; b++) {
            struct backend *be = bes[b];
            struct backend_sample_state st = {(struct backend_sampling *)up(be, &cases[k], sizeof cases[k]),
                                              (float *)up(be, bias, (size_t)V * 4),
                                              (int32_t *)up(be, count0, (size_t)V * 4),
                                              (uint8_t *)up(be, inp, (size_t)V),
                                              (uint64_t *)up(be, mask, ((size_t)V + 63) / 64 * 8)};
            void *dx = up(be, x, (size_t)V * 2);
            int32_t *dout = (int32_t *)be->ops->alloc(be, 4 * N), *dpos = (int32_t *)up(be, &(int32_t){99}, 4);
            for (int d = 0; d < N; d++) /* half as a decode step's form, from position 100 on */
                be->ops->sample(be, dout + d, (const uint16_t *)dx, V, &st, d % 2 ? dpos : NULL, 100 + d);
            int32_t *o = (int32_t *)down(be, dout, 4 * N);
            memcpy(ids[b], o, 4 * N);
            free(o);
            cnt[b] = (int32_t *)down(be, st.count, (size_t)V * 4);
            int32_t *pend = (int32_t *)down(be, dpos, 4);
            EXPECT(*pend == 99 + N / 2, "sample case %zu: pos advanced to %d", k, *pend);
            free(pend);
            void *bufs[] = {st.params, st.bias, st.count, st.in_prompt, st.mask, dx, dout, dpos};
            for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) be->ops->free(be, bufs[i]);
        }
        /* the step form draws at *pos + 1: 99 + (d + 1) / 2 + 1 for odd d, not 100 + d: the
         * positions differ from the host form's, the same on both backends */
        int agree = 0, cnt_ok = 1, distinct = 0;
        int masked_ok = 1;
        for (int d = 0; d < N; d++) {
            agree += ids[0][d] == ids[1][d];
            distinct += d > 0 && ids[1][d] != ids[1][0];
            masked_ok &= !(cases[k].flags & BACKEND_SAMPLE_MASK) || ids[1][d] % 3 == 0;
        }
        EXPECT(masked_ok, "sample case %zu: CUDA drew a masked token", k);
        for (int i = 0; i < V; i++) cnt_ok &= cnt[0][i] == cnt[1][i] || agree < N;
        EXPECT(agree >= N - 2, "sample case %zu: CUDA and CPU drew the same token %d of %d times", k, agree, N);
        EXPECT(cnt_ok, "sample case %zu: counts differ", k);
        EXPECT(cases[k].top_k == 1 || distinct > 5, "sample case %zu: %d distinct draws", k, distinct);
        printf("  sample case %zu (top_k %d, top_p %.2f, min_p %.2f, T %.1f, flags %d): %d / %d draws agree\n", k,
               cases[k].top_k, cases[k].top_p, cases[k].min_p, cases[k].temperature, cases[k].flags, agree, N);
        free(cnt[0]), free(cnt[1]);
    }
    /* the logprobs op: log sum exp (fp32 sums in another order: 1e-4 relative), the chosen
     * token's logit and the top 20 exact */
    for (int k = 0; k <= 20; k += 20) {
        float outs[2][2 + 2 * BACKEND_LOGPROBS_KMAX];
        for (int b = 0; b < 2; b++) {
            struct backend *be = bes[b];
            void *dx = up(be, x, (size_t)V * 2);
            int32_t ch = 12345;
            int32_t *dch = (int32_t *)up(be, &ch, 4);
            float *dout = (float *)be->ops->alloc(be, sizeof outs[b]);
            be->ops->logprobs(be, dout, (const uint16_t *)dx, V, k, dch);
            float *o = (float *)down(be, dout, sizeof outs[b]);
            memcpy(outs[b], o, sizeof outs[b]);
            free(o);
            be->ops->free(be, dx), be->ops->free(be, dch), be->ops->free(be, dout);
        }
        EXPECT(fabsf(outs[1][0] - outs[0][0]) <= 1e-4f * fabsf(outs[0][0]) + 1e-4f,
               "logprobs k %d: lse %.6f vs CPU %.6f", k, outs[1][0], outs[0][0]);
        EXPECT(outs[1][1] == outs[0][1], "logprobs k %d: the chosen logit", k);
        EXPECT(memcmp(outs[1] + 2, outs[0] + 2, (size_t)2 * k * 4) == 0, "logprobs k %d: the top k differ", k);
        printf("  logprobs k %d: lse %.6f (CPU %.6f)\n", k, outs[1][0], outs[0][0]);
    }
    free(x), free(bias), free(count0), free(inp), free(mask);
    bes[1]->ops->destroy(bes[1]);
    bes[0]->ops->destroy(bes[0]);
}

/* rows_post / rows_wait: each post reads its rows as they were when it was queued (a later
 * upload over them does not show), and any of the last BACKEND_POSTS posts can be waited for, in
 * any order. (That a wait does not wait for work queued after the post shows in the timings:
 * strata_logits ahead, the concurrency bench.) */
static void check_rows_post(void) {
    struct config c = make_config("demo");
    struct error err = {{0}};
    struct backend *be = backend_cuda_create(&c, 64, 1, &err);
    CHECK(be && be->ops->rows_post && be->ops->rows_wait);
    int32_t *dev = be->ops->alloc(be, BACKEND_ROWS_MAX * sizeof(int32_t));
    int32_t want[3][BACKEND_ROWS_MAX], got[BACKEND_ROWS_MAX];
    const int Bs[3] = {5, BACKEND_ROWS_MAX, 1};
    int64_t n[3];
    for (int k = 0; k < 3; k++) {
        for (int i = 0; i < BACKEND_ROWS_MAX; i++) want[k][i] = 1000 * (k + 1) + i * 7;
        be->ops->upload(be, dev, want[k], sizeof want[k]);
        n[k] = be->ops->rows_post(be, dev, Bs[k]);
    }
    int ok = n[1] == n[0] + 1 && n[2] == n[1] + 1;
    for (int k = 2; k >= 0; k--) {
        be->ops->rows_wait(be, n[k], got, Bs[k]);
        ok &= !memcmp(got, want[k], (size_t)Bs[k] * sizeof *got);
    }
    EXPECT(ok, "rows_post: the rows as posted, waited for newest first");
    be->ops->free(be, dev);
    be->ops->destroy(be);
    printf("rows_post / rows_wait: %s\n", ok ? "ok" : "FAIL");
}

int main(int argc, char **argv) {
    struct config c = make_config("0.8B");
    struct error err = {{0}};
    struct backend *probe = backend_cuda_create(&c, 64, 1, &err);
    if (!probe) {
        printf("skipped: %s\n", err.msg);
        return TEST_DONE();
    }
    probe->ops->destroy(probe);
    if (argc <= 1 || !strcmp(argv[1], "sample")) check_sample();
    if (argc <= 1 || !strcmp(argv[1], "demo")) check_rows_post();
    const char *sizes[] = {"0.8B", "4B", "9B", "demo", "27B"};
    for (int i = 0; i < 5; i++) {
        if (argc > 1 && strcmp(argv[1], sizes[i]) != 0) continue;
        check_size(sizes[i]);
        if (i < 3) check_gemm_plans(sizes[i]);
        check_prefill(sizes[i], 0);
        if (i == 2) check_prefill(sizes[i], 1);
        if (i < 2) check_long(sizes[i]);
    }
    return TEST_DONE();
}
