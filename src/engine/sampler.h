/* sampler.h - picks the next token from a logits vector: repetition / presence / frequency
 * penalties, temperature, top_k, top_p, min_p, and a seeded RNG (same seed, same output).
 *
 * Order follows Hugging Face generate's logits processors: repetition penalty (over prompt +
 * output, as HF and vLLM), presence/frequency penalties (over output only, as OpenAI/vLLM),
 * then temperature, top_k, top_p, min_p, then one draw from the renormalised distribution.
 * Temperature 0 is greedy; sampler_is_greedy_plain() tells the engine when it may skip the
 * logits download and use model_argmax on the backend instead. When the backend draws (the
 * engine's model_sample_begin: top_k up to BACKEND_SAMPLE_KMAX, or no filter), this sampler is
 * the statistical reference its draws are tested against (tests/test_sample.c) and keeps the
 * counts; its own draws serve the other parameters. Not thread-safe: one sampler per request. */
#ifndef STRATA_SAMPLER_H
#define STRATA_SAMPLER_H

#include <stdint.h>

struct sampler_params {
    float temperature;        /* 0: greedy. default 1 */
    int top_k;                /* <= 0: off */
    float top_p;              /* 1: off. (0, 1] */
    float min_p;              /* 0: off. [0, 1] */
    float presence_penalty;   /* [-2, 2], 0 off: logit -= p if the token occurred in the output */
    float frequency_penalty;  /* [-2, 2], 0 off: logit -= f * count in the output */
    float repetition_penalty; /* > 0, 1 off: HF rule (logit > 0 ? logit / r : logit * r) */
    uint64_t seed;            /* RNG seed */
    /* OpenAI logit_bias: logits[bias_ids[i]] += bias_values[i] before everything else.
     * Borrowed: the arrays must outlive the sampler. */
    const int32_t *bias_ids;
    const float *bias_values;
    int n_bias;
};

/* The defaults above (temperature 1, no filters, no penalties, no bias, seed 0). */
void sampler_params_default(struct sampler_params *p);

struct sampler;

struct sampler *sampler_create(int vocab_size, const struct sampler_params *p);
void sampler_free(struct sampler *s);

/* Greedy without penalties: the argmax of the raw logits is the answer. */
int sampler_is_greedy_plain(const struct sampler *s);

/* Records a prompt token (for the repetition penalty). */
void sampler_add_prompt(struct sampler *s, const int32_t *ids, int n);

/* Records a generated token (for all penalties). The engine calls it for every emitted id,
 * including ones chosen by model_argmax. */
void sampler_accept(struct sampler *s, int32_t id);

/* Chooses a token from logits (vocab_size,), which it modifies (penalties, temperature). */
int32_t sampler_sample(struct sampler *s, float *logits);

#endif
