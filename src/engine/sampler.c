/* sampler.c - penalties, temperature, top_k / top_p / min_p filtering and a seeded draw (see
 * sampler.h for the order, which is Hugging Face's). Costs O(vocab) per token and never sorts
 * the vocabulary: one vectorised pass computes exp(logit - max); top_k keeps a k-element heap;
 * top_p gathers the tokens of the probability buckets the nucleus reaches (nucleus_gather) and
 * sorts only those, which is exact because the nucleus is a prefix of the descending order:
 * once the gathered tokens hold the top_p mass, no token outside them can be in the nucleus. */
#include "sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

struct cand {
    float p; /* exp((logit - max) / temperature): 1 for the best token */
    int32_t id;
};

struct sampler {
    struct sampler_params p;
    int vocab_size;
    int32_t *count;    /* (vocab_size,) occurrences in the output */
    uint8_t *in_prompt; /* (vocab_size,) 1 if the token occurs in the prompt */
    int32_t *touched;  /* distinct ids with count > 0 or in_prompt */
    int n_touched, cap_touched;
    struct cand *cand; /* (vocab_size,) scratch: the candidate set */
    float *prob;       /* (vocab_size,) exp((logit - max) / temperature) */
    uint64_t rng[4];   /* xoshiro256** state */
};

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t rng_next(uint64_t s[4]) {
    uint64_t r = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return r;
}

/* uniform in [0, 1) with 53 random bits */
static double rng_uniform(uint64_t s[4]) { return (double)(rng_next(s) >> 11) * 0x1.0p-53; }

void sampler_params_default(struct sampler_params *p) {
    p->temperature = 1.0f;
    p->top_k = 0;
    p->top_p = 1.0f;
    p->min_p = 0.0f;
    p->presence_penalty = 0.0f;
    p->frequency_penalty = 0.0f;
    p->repetition_penalty = 1.0f;
    p->seed = 0;
    p->bias_ids = NULL;
    p->bias_values = NULL;
    p->n_bias = 0;
}

struct sampler *sampler_create(int vocab_size, const struct sampler_params *p) {
    CHECK(vocab_size > 0);
    struct sampler *s = xcalloc(1, sizeof *s);
    s->p = *p;
    s->vocab_size = vocab_size;
    s->count = xcalloc((size_t)vocab_size, sizeof *s->count);
    s->in_prompt = xcalloc((size_t)vocab_size, 1);
    s->cand = xmalloc((size_t)vocab_size * sizeof *s->cand);
    s->prob = xmalloc((size_t)vocab_size * sizeof *s->prob);
    uint64_t x = p->seed;
    for (int i = 0; i < 4; i++) s->rng[i] = splitmix64(&x);
    return s;
}

void sampler_free(struct sampler *s) {
    if (!s) return;
    free(s->count);
    free(s->in_prompt);
    free(s->touched);
    free(s->cand);
    free(s->prob);
    free(s);
}

static int has_penalties(const struct sampler *s) {
    return s->p.presence_penalty != 0.0f || s->p.frequency_penalty != 0.0f ||
           s->p.repetition_penalty != 1.0f;
}

int sampler_is_greedy_plain(const struct sampler *s) {
    return s->p.temperature <= 0.0f && !has_penalties(s) && s->p.n_bias == 0;
}

static void touch(struct sampler *s, int32_t id) {
    if (s->count[id] || s->in_prompt[id]) return;
    if (s->n_touched == s->cap_touched) {
        s->cap_touched = s->cap_touched ? 2 * s->cap_touched : 256;
        s->touched = xrealloc(s->touched, (size_t)s->cap_touched * sizeof *s->touched);
    }
    s->touched[s->n_touched++] = id;
}

void sampler_add_prompt(struct sampler *s, const int32_t *ids, int n) {
    if (!has_penalties(s)) return; /* the bookkeeping only serves penalties */
    for (int i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= s->vocab_size) continue;
        touch(s, ids[i]);
        s->in_prompt[ids[i]] = 1;
    }
}

void sampler_accept(struct sampler *s, int32_t id) {
    if (!has_penalties(s) || id < 0 || id >= s->vocab_size) return;
    touch(s, id);
    s->count[id]++;
}

static void apply_penalties(struct sampler *s, float *logits) {
    const float rp = s->p.repetition_penalty;
    for (int i = 0; i < s->n_touched; i++) {
        int32_t id = s->touched[i];
        float l = logits[id];
        if (rp != 1.0f) l = l > 0 ? l / rp : l * rp; /* HF RepetitionPenaltyLogitsProcessor */
        if (s->count[id] > 0)                         /* OpenAI: output tokens only */
            l -= s->p.presence_penalty + s->p.frequency_penalty * (float)s->count[id];
        logits[id] = l;
    }
}

/* Descending by probability, ties by lower id. */
static int cand_before(const struct cand *a, const struct cand *b) {
    return a->p > b->p || (a->p == b->p && a->id < b->id);
}

static int cand_cmp(const void *pa, const void *pb) {
    const struct cand *a = pa, *b = pb;
    return cand_before(a, b) ? -1 : cand_before(b, a) ? 1 : 0;
}

/* prob[i] = exp((x[i] - m) * inv_t) for n values whose argument is <= 0, relative error ~2e-7.
 * Eight lanes at a time with GCC/Clang vector extensions (AVX2 under -march=x86-64-v3; libm's
 * expf does not vectorise without -ffast-math). Arguments below -87 (and NaN) give 0: such a
 * token is e^87 times less likely than the best one and is never drawn. */
typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));

static inline float exp_nonpos1(float x) {
    if (!(x >= -87.0f)) return 0.0f;
    float t = x * 1.44269504088896341f, fl = floorf(t), f = t - fl;
    float poly = 1.0f + f * (0.693147182f + f * (0.240226507f + f * (0.0555041087f +
                 f * (0.00961812911f + f * (0.00133335581f + f * 0.000154035304f)))));
    return ldexpf(poly, (int)fl);
}

static void exp_rows(float *prob, const float *x, int n, float m, float inv_t) {
    const v8f vm = {m, m, m, m, m, m, m, m}, vit = {inv_t, inv_t, inv_t, inv_t, inv_t, inv_t, inv_t, inv_t};
    const v8f lo = {-87, -87, -87, -87, -87, -87, -87, -87};
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        v8f v;
        memcpy(&v, x + i, sizeof v);
        v = (v - vm) * vit;
        v8i ok = v >= lo; /* -1 where kept */
        v8f xc = (v8f)(((v8i)v & ok) | ((v8i)lo & ~ok));
        v8f t = xc * 1.44269504088896341f;
        v8i ti = __builtin_convertvector(t, v8i); /* trunc, then floor for negative t */
        ti += (v8i)(t < __builtin_convertvector(ti, v8f));
        v8f f = t - __builtin_convertvector(ti, v8f);
        v8f poly = 1.0f + f * (0.693147182f + f * (0.240226507f + f * (0.0555041087f +
                   f * (0.00961812911f + f * (0.00133335581f + f * 0.000154035304f)))));
        v8f r = poly * (v8f)((ti + 127) << 23);
        r = (v8f)((v8i)r & ok);
        memcpy(prob + i, &r, sizeof r);
    }
    for (; i < n; i++) prob[i] = exp_nonpos1((x[i] - m) * inv_t);
}

/* Sum of v[0..n) in eight float lanes (vectorises; the order is fixed, so it is deterministic). */
static double sum8(const float *v, int n) {
    float acc[8] = {0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) acc[j] += v[i + j];
    double z = 0;
    for (int j = 0; j < 8; j++) z += acc[j];
    for (; i < n; i++) z += v[i];
    return z;
}

/* Index of the largest of x[0..n), the lowest on ties (the max by a vectorisable reduction,
 * then a scan for its first position). */
static int32_t argmax(const float *x, int n) {
    float mx[8];
    for (int j = 0; j < 8; j++) mx[j] = -INFINITY;
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) mx[j] = x[i + j] > mx[j] ? x[i + j] : mx[j];
    float m = -INFINITY;
    for (int j = 0; j < 8; j++) m = mx[j] > m ? mx[j] : m;
    for (; i < n; i++) m = x[i] > m ? x[i] : m;
    for (i = 0; i < n; i++)
        if (x[i] == m) return i;
    return 0; /* all NaN */
}

/* The k most probable tokens of prob[0..V) into c[0..k), sorted (a min-heap on the way). */
static int top_k_select(const float *prob, int V, int k, struct cand *c) {
    int n = 0;
    for (int i = 0; i < V; i++) {
        struct cand x = {prob[i], i};
        if (n < k) { /* sift up */
            int j = n++;
            while (j > 0 && cand_before(&c[(j - 1) / 2], &x)) {
                c[j] = c[(j - 1) / 2];
                j = (j - 1) / 2;
            }
            c[j] = x;
        } else if (cand_before(&x, &c[0])) { /* replace the root (the worst kept), sift down */
            int j = 0;
            for (;;) {
                int l = 2 * j + 1, r = l + 1, w = j;
                const struct cand *wc = &x;
                if (l < n && cand_before(wc, &c[l])) w = l, wc = &c[l];
                if (r < n && cand_before(wc, &c[r])) w = r, wc = &c[r];
                if (w == j) break;
                c[j] = c[w];
                j = w;
            }
            c[j] = x;
        }
    }
    qsort(c, (size_t)n, sizeof *c, cand_cmp);
    return n;
}

/* The nucleus of prob[0..V) (the smallest prefix of the descending order, ties by lower id,
 * whose mass reaches target) into c, without sorting the vocabulary: a histogram of the
 * probabilities by their float bits (positive floats order as their bits: the exponent and 4
 * mantissa bits, 2,048 buckets) finds the bucket where the prefix reaches target; the tokens of
 * the buckets above it are all in (gathered in id order), and only that bucket's tokens are
 * sorted to find the cut. O(V) plus a sort of one bucket (a flat distribution's nucleus of
 * ~10^5 tokens was sorted whole before). Returns the count. */
#define NUCLEUS_BUCKETS 2048
static int nucleus_bucket(float p) {
    uint32_t b;
    memcpy(&b, &p, sizeof b);
    return (int)(b >> 19) & (NUCLEUS_BUCKETS - 1); /* p in (0, 1]: bits up to 0x3f800000 */
}
static int nucleus_gather(const float *prob, int V, double target, struct cand *c) {
    double mass[NUCLEUS_BUCKETS] = {0};
    for (int i = 0; i < V; i++)
        if (prob[i] > 0) mass[nucleus_bucket(prob[i])] += prob[i];
    int lo = NUCLEUS_BUCKETS - 1;
    double above = 0;
    while (lo > 0 && above + mass[lo] < target) above += mass[lo--];
    int n = 0;
    double cum = 0;
    for (int i = 0; i < V; i++)
        if (prob[i] > 0 && nucleus_bucket(prob[i]) > lo) c[n].p = prob[i], c[n++].id = i, cum += prob[i];
    int nb = n;
    for (int i = 0; i < V; i++)
        if (prob[i] > 0 && nucleus_bucket(prob[i]) == lo) c[nb].p = prob[i], c[nb++].id = i;
    qsort(c + n, (size_t)(nb - n), sizeof *c, cand_cmp);
    while (n < nb && cum < target) cum += c[n++].p; /* HF: up to the token that reaches it */
    return n > 0 ? n : nb;
}

int32_t sampler_sample(struct sampler *s, float *logits) {
    const int V = s->vocab_size;
    for (int i = 0; i < s->p.n_bias; i++)
        if (s->p.bias_ids[i] >= 0 && s->p.bias_ids[i] < V) logits[s->p.bias_ids[i]] += s->p.bias_values[i];
    if (has_penalties(s)) apply_penalties(s, logits);

    const int32_t best = argmax(logits, V);
    if (s->p.temperature <= 0.0f) return best;

    /* probabilities relative to the best token (NaN logits come out 0) */
    const float inv_t = 1.0f / s->p.temperature, m = logits[best];
    float *prob = s->prob;
    exp_rows(prob, logits, V, m, inv_t);

    /* candidates: c[0..n) sorted descending, or (all == 1) the whole vocabulary in id order */
    struct cand *c = s->cand;
    int n = V, all = 1;
    if (s->p.top_k > 0 && s->p.top_k < V) {
        n = top_k_select(prob, V, s->p.top_k, c);
        all = 0;
    }
    if (s->p.top_p < 1.0f) {
        double z = 0;
        if (all) {
            z = sum8(prob, V);
        } else {
            for (int i = 0; i < n; i++) z += c[i].p;
        }
        const double target = (double)s->p.top_p * z;
        if (all) { /* the nucleus without sorting the vocabulary (nucleus_gather) */
            n = nucleus_gather(prob, V, target, c);
            all = 0;
        } else {
            double cum = 0;
            for (int i = 0; i < n; i++) {
                cum += c[i].p;
                /* HF TopPLogitsProcessor keeps the smallest prefix whose mass reaches top_p */
                if (cum >= target) {
                    n = i + 1;
                    break;
                }
            }
        }
    }
    if (s->p.min_p > 0.0f) { /* p_i >= min_p * p_max, and p_max = 1 here */
        const float thr = s->p.min_p;
        if (all) {
            n = 0;
            for (int i = 0; i < V; i++)
                if (prob[i] >= thr) c[n].p = prob[i], c[n++].id = i;
            all = 0;
        } else {
            int w = 0;
            for (int i = 0; i < n; i++)
                if (c[i].p >= thr) c[w++] = c[i];
            n = w;
        }
    }

    /* one draw from the renormalised candidates, walked in a fixed order */
    double z = 0;
    if (all) {
        z = sum8(prob, V);
    } else {
        for (int i = 0; i < n; i++) z += c[i].p;
    }
    const double r = rng_uniform(s->rng) * z;
    double cum = 0;
    int32_t last = best;
    if (all) {
        for (int i = 0; i < V; i++) {
            if (prob[i] <= 0) continue;
            cum += prob[i];
            last = i;
            if (r < cum) return i;
        }
    } else {
        for (int i = 0; i < n; i++) {
            cum += c[i].p;
            last = c[i].id;
            if (r < cum) return c[i].id;
        }
    }
    return last; /* rounding left r at the very end */
}
