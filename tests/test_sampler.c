/* test_sampler.c - the sampler against exact expectations: greedy ties, seed determinism,
 * temperature / top_k / top_p / min_p against probabilities computed here, penalties by their
 * formulas, and the large-vocabulary top_p selection against a full sort. Frequency checks use
 * 40,000 draws: the binomial standard deviation is <= 0.0025, the tolerance 0.012 (~5 sd), so
 * a correct sampler fails with negligible probability and a wrong distribution (any error above
 * ~1.5 points) is caught. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "engine/sampler.h"

#define DRAWS 40000
#define TOL 0.012

static void freq(struct sampler_params *p, const float *logits, int V, double *f) {
    struct sampler *s = sampler_create(V, p);
    float *l = malloc((size_t)V * sizeof *l);
    for (int i = 0; i < V; i++) f[i] = 0;
    for (int d = 0; d < DRAWS; d++) {
        memcpy(l, logits, (size_t)V * sizeof *l);
        f[sampler_sample(s, l)] += 1.0 / DRAWS;
    }
    free(l);
    sampler_free(s);
}

static int cmp_desc(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

int main(void) {
    struct sampler_params p;
    const float lg3[3] = {logf(0.5f), logf(0.3f), logf(0.2f)};
    double f[3];

    /* greedy: argmax, lowest index on ties; the "plain" flag only without penalties */
    sampler_params_default(&p);
    p.temperature = 0;
    {
        struct sampler *s = sampler_create(4, &p);
        float l[4] = {1, 3, 3, 2};
        EXPECT(sampler_sample(s, l) == 1, "greedy tie must pick the lowest index");
        EXPECT(sampler_is_greedy_plain(s), "temperature 0 without penalties is plain greedy");
        sampler_free(s);
        p.presence_penalty = 0.5f;
        s = sampler_create(4, &p);
        EXPECT(!sampler_is_greedy_plain(s), "penalties need the logits on the host");
        sampler_free(s);
    }

    /* temperature 1: the softmax itself */
    sampler_params_default(&p);
    p.seed = 1;
    freq(&p, lg3, 3, f);
    EXPECT(fabs(f[0] - 0.5) < TOL && fabs(f[1] - 0.3) < TOL && fabs(f[2] - 0.2) < TOL,
           "T=1 frequencies %.4f %.4f %.4f, want 0.5 0.3 0.2", f[0], f[1], f[2]);

    /* temperature 0.5: p^2 renormalised */
    p.temperature = 0.5f;
    freq(&p, lg3, 3, f);
    EXPECT(fabs(f[0] - 0.25 / 0.38) < TOL && fabs(f[1] - 0.09 / 0.38) < TOL,
           "T=0.5 frequencies %.4f %.4f, want %.4f %.4f", f[0], f[1], 0.25 / 0.38, 0.09 / 0.38);

    /* top_p 0.6: the smallest prefix reaching 0.6 is {0, 1}, renormalised 5:3 */
    sampler_params_default(&p);
    p.top_p = 0.6f;
    freq(&p, lg3, 3, f);
    EXPECT(f[2] == 0 && fabs(f[0] - 0.625) < TOL, "top_p=0.6: %.4f %.4f %.4f, want .625 .375 0",
           f[0], f[1], f[2]);
    /* top_p 0.5 exactly reaches 0.5 with token 0 alone */
    p.top_p = 0.5f;
    freq(&p, lg3, 3, f);
    EXPECT(f[0] > 0.999, "top_p=0.5 keeps only the first token (got %.4f)", f[0]);

    /* top_k 2 */
    sampler_params_default(&p);
    p.top_k = 2;
    freq(&p, lg3, 3, f);
    EXPECT(f[2] == 0 && fabs(f[0] - 0.625) < TOL, "top_k=2: %.4f %.4f %.4f", f[0], f[1], f[2]);

    /* min_p 0.5: keep p >= 0.25 -> {0, 1} */
    sampler_params_default(&p);
    p.min_p = 0.5f;
    freq(&p, lg3, 3, f);
    EXPECT(f[2] == 0 && fabs(f[0] - 0.625) < TOL, "min_p=0.5: %.4f %.4f %.4f", f[0], f[1], f[2]);

    /* seeds: same seed, same sequence; another seed, another sequence */
    {
        const int V = 1000, N = 200;
        float *base = malloc(V * sizeof *base), *l = malloc(V * sizeof *l);
        for (int i = 0; i < V; i++) base[i] = (float)((i * 7919) % 101) / 50.0f;
        int32_t seq[3][200];
        uint64_t seeds[3] = {42, 42, 43};
        for (int k = 0; k < 3; k++) {
            sampler_params_default(&p);
            p.seed = seeds[k];
            p.top_p = 0.9f;
            p.top_k = 500;
            struct sampler *s = sampler_create(V, &p);
            for (int i = 0; i < N; i++) {
                memcpy(l, base, V * sizeof *l);
                seq[k][i] = sampler_sample(s, l);
                sampler_accept(s, seq[k][i]);
            }
            sampler_free(s);
        }
        EXPECT(memcmp(seq[0], seq[1], sizeof seq[0]) == 0, "same seed must give the same tokens");
        EXPECT(memcmp(seq[0], seq[2], sizeof seq[0]) != 0, "another seed must give other tokens");
        free(base);
        free(l);
    }

    /* penalties by formula */
    {
        sampler_params_default(&p);
        p.temperature = 0;
        p.repetition_penalty = 2.0f;
        struct sampler *s = sampler_create(4, &p);
        int32_t prompt[2] = {0, 1};
        sampler_add_prompt(s, prompt, 2);
        float l[4] = {3.0f, -1.0f, 1.6f, -3.0f};
        int32_t id = sampler_sample(s, l);
        EXPECT(l[0] == 1.5f && l[1] == -2.0f && l[2] == 1.6f && l[3] == -3.0f,
               "repetition penalty: got %g %g %g %g, want 1.5 -2 1.6 -3", l[0], l[1], l[2], l[3]);
        EXPECT(id == 2, "after the repetition penalty token 2 leads (got %d)", id);
        sampler_free(s);

        sampler_params_default(&p);
        p.temperature = 0;
        p.presence_penalty = 0.5f;
        p.frequency_penalty = 0.25f;
        s = sampler_create(4, &p);
        sampler_add_prompt(s, prompt, 2); /* the prompt does not count for these two */
        sampler_accept(s, 2);
        sampler_accept(s, 2);
        float l2[4] = {1.0f, 1.0f, 2.0f, 0.0f};
        id = sampler_sample(s, l2);
        EXPECT(l2[0] == 1.0f && l2[1] == 1.0f && l2[2] == 1.0f, "presence/frequency: got %g %g %g",
               l2[0], l2[1], l2[2]);
        EXPECT(id == 0, "ties after penalties go to the lowest id (got %d)", id);
        sampler_free(s);
    }

    /* logit_bias: +100 forces a token under sampling; -100 removes the leader under greedy */
    {
        int32_t ids[2] = {2, 0};
        float vals[2] = {100.0f, -100.0f};
        sampler_params_default(&p);
        p.bias_ids = ids;
        p.bias_values = vals;
        p.n_bias = 1;
        freq(&p, lg3, 3, f);
        EXPECT(f[2] > 0.999, "logit_bias +100 on token 2: frequency %.4f", f[2]);
        p.temperature = 0;
        p.bias_ids = ids + 1;
        p.bias_values = vals + 1;
        struct sampler *s = sampler_create(3, &p);
        float l[3] = {logf(0.5f), logf(0.3f), logf(0.2f)};
        EXPECT(!sampler_is_greedy_plain(s), "a bias needs the logits on the host");
        EXPECT(sampler_sample(s, l) == 1, "logit_bias -100 on the argmax");
        sampler_free(s);
    }

    /* a real-size vocabulary: every top_p draw lies inside the exact nucleus from a full sort */
    {
        const int V = 248320;
        float *base = malloc(V * sizeof *base), *l = malloc(V * sizeof *l),
              *sorted = malloc(V * sizeof *sorted);
        uint32_t x = 12345;
        for (int i = 0; i < V; i++) {
            x = x * 1664525u + 1013904223u;
            base[i] = (float)(x >> 8) / (float)(1 << 24) * 12.0f; /* spread: a wide nucleus */
        }
        memcpy(sorted, base, V * sizeof *sorted);
        qsort(sorted, V, sizeof *sorted, cmp_desc);
        double z = 0, cum = 0;
        for (int i = 0; i < V; i++) z += exp((double)(sorted[i] - sorted[0]));
        int k = 0;
        while (cum < 0.8 * z) cum += exp((double)(sorted[k++] - sorted[0]));
        float cutoff = sorted[k - 1]; /* nucleus = logits >= cutoff */
        sampler_params_default(&p);
        p.top_p = 0.8f;
        p.seed = 7;
        struct sampler *s = sampler_create(V, &p);
        int outside = 0;
        for (int d = 0; d < 100; d++) {
            memcpy(l, base, V * sizeof *l);
            int32_t id = sampler_sample(s, l);
            if (base[id] < cutoff) outside++;
        }
        EXPECT(k > 1000, "the test nucleus must be large enough to need growth (k=%d)", k);
        EXPECT(outside == 0, "%d of 100 top_p draws fell outside the exact nucleus of %d", outside,
               k);
        sampler_free(s);
        free(base);
        free(l);
        free(sorted);
    }
    return TEST_DONE();
}
