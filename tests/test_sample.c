/* test_sample.c - the backend's sample op (backend.h, struct backend_sampling) on the CPU
 * backend, its specification, against the host sampler (engine/sampler.c): for fixed logits the
 * op's draws over many positions and the sampler's draws follow the same distribution (a
 * two-sample chi-square test, bins of fewer than 10 draws merged, at p = 1e-5: a correct pair
 * fails with negligible probability; the test shows it rejects a wrong temperature), for each
 * filter and their combinations with penalties, bias and a grammar's mask; the same seed and position give the
 * same token; the op counts its choice; the logprobs op against a direct computation. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/sampler.h"
#include "harness.h"
#include "model/backend.h"
#include "util.h"

#define V 1000
#define DRAWS 20000

static struct backend *be;
static uint16_t x[V];
static float xf[V], bias[V];
static int32_t count0[V], count[V];
static uint8_t inp[V];
static int32_t prompt[40], accepted[30], bias_ids[3];
static uint64_t mask[(V + 63) / 64];

static void op_hist(const struct backend_sampling *sp, int *h) {
    struct backend_sampling p = *sp;
    struct backend_sample_state st = {&p, bias, count, inp, mask};
    memset(h, 0, V * sizeof *h);
    for (int d = 0; d < DRAWS; d++) {
        memcpy(count, count0, sizeof count);
        int32_t out = -1;
        be->ops->sample(be, &out, x, V, &st, NULL, 1000 + d);
        if (out >= 0 && out < V) h[out]++;
    }
}

static void host_hist(const struct sampler_params *sp, int penalties, int masked, int *h) {
    struct sampler *s = sampler_create(V, sp);
    if (penalties) {
        sampler_add_prompt(s, prompt, 40);
        for (int i = 0; i < 30; i++) sampler_accept(s, accepted[i]);
    }
    float *l = malloc(V * sizeof *l);
    memset(h, 0, V * sizeof *h);
    for (int d = 0; d < DRAWS; d++) {
        memcpy(l, xf, sizeof xf);
        for (int i = 0; masked && i < V; i++) /* as the engine masks the host logits */
            if (!(mask[i / 64] >> (i % 64) & 1)) l[i] = -INFINITY;
        h[sampler_sample(s, l)]++;
    }
    free(l);
    sampler_free(s);
}

/* two equal-size samples: sum (a - b)^2 / (a + b) over bins (small ones merged), against the
 * chi-square quantile at p = 1e-5 (Wilson-Hilferty) */
static int same_dist(const int *a, const int *b, double *chi, int *dfo) {
    double c = 0;
    int bins = 0, ra = 0, rb = 0;
    for (int i = 0; i < V; i++) {
        if (a[i] + b[i] < 10) {
            ra += a[i], rb += b[i];
            continue;
        }
        c += (double)(a[i] - b[i]) * (a[i] - b[i]) / (a[i] + b[i]);
        bins++;
    }
    if (ra + rb > 0) c += (double)(ra - rb) * (ra - rb) / (ra + rb), bins++;
    const int df = bins > 1 ? bins - 1 : 1;
    const double z = 4.265, t = 2.0 / (9.0 * df), crit = df * pow(1 - t + z * sqrt(t), 3);
    *chi = c, *dfo = df;
    return c < crit;
}

static void check(const char *what, float temp, int top_k, float top_p, float min_p, float pres,
                  float freq, float rep, int use_bias, int use_mask) {
    struct sampler_params hp;
    sampler_params_default(&hp);
    hp.temperature = temp, hp.top_k = top_k, hp.top_p = top_p, hp.min_p = min_p;
    hp.presence_penalty = pres, hp.frequency_penalty = freq, hp.repetition_penalty = rep;
    hp.seed = 7;
    float bias_vals[3] = {-100.0f, 3.0f, 1.5f}; /* the best token banned, two others raised */
    if (use_bias) hp.bias_ids = bias_ids, hp.bias_values = bias_vals, hp.n_bias = 3;
    memset(bias, 0, sizeof bias);
    for (int i = 0; i < (use_bias ? 3 : 0); i++) bias[bias_ids[i]] += bias_vals[i];
    const int pen = pres != 0 || freq != 0 || rep != 1;
    memset(count0, 0, sizeof count0);
    memset(inp, 0, sizeof inp);
    if (pen) {
        for (int i = 0; i < 30; i++) count0[accepted[i]]++;
        for (int i = 0; i < 40; i++) inp[prompt[i]] = 1;
    }
    struct backend_sampling sp = {temp, top_p, min_p, pres, freq, rep, top_k, 0, 99};
    sp.flags = (use_bias ? BACKEND_SAMPLE_BIAS : 0) | (pen ? BACKEND_SAMPLE_PENALTIES : 0) |
               (use_mask ? BACKEND_SAMPLE_MASK : 0);
    static int a[V], b[V];
    op_hist(&sp, a);
    host_hist(&hp, pen, use_mask, b);
    double chi;
    int df;
    EXPECT(same_dist(a, b, &chi, &df), "%s: op vs host sampler chi-square %.1f on %d df", what, chi, df);
    printf("  %-44s chi-square %7.1f on %3d df\n", what, chi, df);
}

int main(void) {
    struct config c;
    memset(&c, 0, sizeof c);
    c.vocab_size = V;
    be = backend_cpu_create(&c, 16, 1, 1);
    uint64_t r = 12345;
    for (int i = 0; i < V; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        const float u = (float)((r >> 40) + 0.5) / 16777216.0f;
        x[i] = f32_to_bf16(0.8f * logf(u / (1 - u))); /* logistic: some hundred likely tokens */
        xf[i] = bf16_to_f32(x[i]);
    }
    for (int i = 0; i < 40; i++) prompt[i] = (i * 37) % V;
    int rank[V]; /* bias: the best token, the 50th and the 200th */
    for (int i = 0; i < V; i++) rank[i] = i;
    for (int i = 0; i < 200; i++)
        for (int j = i + 1; j < V; j++)
            if (xf[rank[j]] > xf[rank[i]]) {
                const int t = rank[i];
                rank[i] = rank[j], rank[j] = t;
            }
    bias_ids[0] = rank[0], bias_ids[1] = rank[49], bias_ids[2] = rank[199];
    for (int i = 0; i < 30; i++) accepted[i] = (i * 53) % 60; /* repeats: counts above 1 */

    check("top_k 20, T 0.7", 0.7f, 20, 1, 0, 0, 0, 1, 0, 0);
    check("top_k 20, top_p 0.8, T 0.7, presence 1.5", 0.7f, 20, 0.8f, 0, 1.5f, 0, 1, 0, 0);
    check("top_k 64, min_p 0.05", 1.0f, 64, 1, 0.05f, 0, 0, 1, 0, 0);
    check("top_k 40, top_p 0.9, min_p 0.02, T 1.3", 1.3f, 40, 0.9f, 0.02f, 0, 0, 1, 0, 0);
    check("top_k 1 (greedy by draw)", 1.0f, 1, 1, 0, 0, 0, 1, 0, 0);
    check("top_k 30, frequency 0.5, repetition 1.3", 0.9f, 30, 1, 0, 0, 0.5f, 1.3f, 0, 0);
    check("top_k 20, logit_bias", 0.7f, 20, 1, 0, 0, 0, 1, 1, 0);
    check("no filter (Gumbel), T 1", 1.0f, 0, 1, 0, 0, 0, 1, 0, 0);
    check("no filter (Gumbel), T 0.5, presence, bias", 0.5f, 0, 1, 0, 1.0f, 0, 1, 1, 0);

    /* a grammar's mask: every third token allowed */
    for (int i = 0; i < V; i++)
        if (i % 3 == 0) mask[i / 64] |= 1ull << (i % 64);
    check("top_k 20, mask", 0.7f, 20, 1, 0, 0, 0, 1, 0, 1);
    check("top_k 1 (greedy), mask", 1.0f, 1, 1, 0, 0, 0, 1, 0, 1);
    check("no filter (Gumbel), mask, presence", 1.0f, 0, 1, 0, 1.0f, 0, 1, 0, 1);
    {
        struct backend_sampling sp = {1.0f, 1, 0, 0, 0, 1, 64, BACKEND_SAMPLE_MASK, 11};
        struct backend_sample_state st = {&sp, bias, count, inp, mask};
        int ok = 1;
        for (int d = 0; d < 500; d++) {
            int32_t o;
            be->ops->sample(be, &o, x, V, &st, NULL, d);
            ok &= o % 3 == 0;
        }
        EXPECT(ok, "a masked token was drawn");
    }

    /* the test rejects a wrong distribution: the op at T 0.7 against the sampler at T 1 */
    {
        struct sampler_params hp;
        sampler_params_default(&hp);
        hp.top_k = 20, hp.seed = 3;
        struct backend_sampling sp = {0.7f, 1, 0, 0, 0, 1, 20, 0, 5};
        memset(count0, 0, sizeof count0);
        static int a[V], b[V];
        op_hist(&sp, a);
        host_hist(&hp, 0, 0, b);
        double chi;
        int df;
        EXPECT(!same_dist(a, b, &chi, &df), "a temperature of 0.7 against 1.0 passed (chi %.1f, %d df)", chi, df);
    }

    /* replay: the same seed and position give the same token, and the op counts its choice */
    {
        struct backend_sampling sp = {0.8f, 1, 0, 0, 0, 1, 20, 0, 42};
        memset(count, 0, sizeof count);
        struct backend_sample_state st = {&sp, bias, count, inp, mask};
        int same = 1, differ = 0;
        int32_t first[64];
        for (int d = 0; d < 64; d++) be->ops->sample(be, &first[d], x, V, &st, NULL, d);
        for (int d = 0; d < 64; d++) {
            int32_t o;
            be->ops->sample(be, &o, x, V, &st, NULL, d);
            same &= o == first[d];
            differ += o != first[0];
        }
        EXPECT(same, "the same seed and position drew different tokens");
        EXPECT(differ > 10, "64 positions drew almost one token (%d differ)", differ);
        int total = 0;
        for (int i = 0; i < V; i++) total += count[i];
        EXPECT(total == 128 && count[first[0]] >= 2, "the op's counts: %d of 128", total);
        sp.seed = 43;
        int diff_seed = 0;
        for (int d = 0; d < 64; d++) {
            int32_t o;
            be->ops->sample(be, &o, x, V, &st, NULL, d);
            diff_seed += o != first[d];
        }
        EXPECT(diff_seed > 10, "another seed drew the same tokens (%d of 64 differ)", diff_seed);
        /* a decode step's form: pos given, the token chosen at *pos + 1, then *pos advanced */
        int32_t p = 9, o1, o2;
        sp.seed = 42;
        be->ops->sample(be, &o1, x, V, &st, &p, 0);
        be->ops->sample(be, &o2, x, V, &st, NULL, 10);
        EXPECT(p == 10 && o1 == o2, "step form: pos %d, %d vs %d", p, o1, o2);
    }
    /* the logprobs op: log sum exp, the chosen token's logit and the top k, against a direct
     * computation in double */
    {
        double mx = -INFINITY, z = 0;
        for (int i = 0; i < V; i++) mx = xf[i] > mx ? xf[i] : mx;
        for (int i = 0; i < V; i++) z += exp(xf[i] - mx);
        const double lse = mx + log(z);
        float out[2 + 2 * BACKEND_LOGPROBS_KMAX];
        int32_t chosen = 321;
        be->ops->logprobs(be, out, x, V, 20, &chosen);
        EXPECT(fabs(out[0] - lse) < 1e-4, "logprobs: lse %.6f, want %.6f", out[0], lse);
        EXPECT(out[1] == xf[chosen], "logprobs: the chosen logit %g, want %g", out[1], xf[chosen]);
        int ok = 1;
        for (int j = 0; j < 20; j++) {
            int32_t id;
            memcpy(&id, &out[22 + j], sizeof id);
            ok &= id == rank[j] && out[2 + j] == xf[rank[j]];
        }
        EXPECT(ok, "logprobs: the top 20 are not the 20 largest logits in order");
    }
    be->ops->destroy(be);
    return TEST_DONE();
}
