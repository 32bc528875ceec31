/* engine.h - one request -> tokens on one model: prefill, the decode loop, sampling, stop
 * conditions (EOS ids, stop strings matched across token boundaries and never emitted,
 * max_tokens, context full), streaming detokenization and timings with llama-server's names.
 *
 * The engine is not thread-safe: one thread owns it (the server's engine thread, or the CLI).
 * It knows nothing of HTTP or chat formats; the caller sees text through the emit callback. */
#ifndef STRATA_ENGINE_H
#define STRATA_ENGINE_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "model/model.h"
#include "sampler.h"
#include "util.h"

struct tokenizer;

#define ENGINE_MAX_EOS 16
#define ENGINE_MAX_STOP 16

enum engine_finish {
    ENGINE_FINISH_STOP = 0,   /* EOS token or stop string */
    ENGINE_FINISH_LENGTH,     /* max_tokens reached or context full */
    ENGINE_FINISH_CANCELLED,  /* the caller asked to stop */
};

const char *engine_finish_name(enum engine_finish f); /* "stop", "length", "cancelled" */

/* What the emit callback receives, once per generated token and once at the end. */
struct engine_event {
    int32_t id;       /* the token; -1 for the final flush after the last token */
    const char *text; /* bytes released now (may be empty: held back while a UTF-8 sequence
                         or a possible stop string is incomplete); not NUL-terminated */
    size_t len;
    int n_generated;  /* tokens generated so far, this one included */
    /* with engine_request.logprobs: the token's log-probability under the model (log-softmax of
     * the raw logits, before penalties, temperature and any grammar mask) and the n_top most
     * likely tokens, most likely first (arrays valid during the callback) */
    float logprob;
    int n_top;
    const int32_t *top_ids;
    const float *top_logprobs;
};

#define ENGINE_MAX_TOP_LOGPROBS 20

struct engine_request {
    const int32_t *prompt; /* (n_prompt,) token ids */
    int n_prompt;
    int max_tokens; /* <= 0: until EOS, a stop string or the end of the context */
    struct sampler_params sampling;
    const char *stop[ENGINE_MAX_STOP]; /* non-empty UTF-8 stop strings */
    int n_stop;
    int ignore_eos;
    /* Called on the engine's thread; returns non-zero to cancel (finish "cancelled"). */
    int (*emit)(void *user, const struct engine_event *ev);
    void *user;
    const atomic_int *cancel; /* optional: checked before prefill and after every token */
    /* Teacher forcing (tests, benchmarks): the first n_forced generated tokens are these ids
     * instead of the sampler's choice; the model still runs every step. */
    const int32_t *forced;
    int n_forced;
    /* Constrained decoding (optional, text/grammar.h): each step the tokens the matcher does not
     * allow get logit -inf before sampling (greedy too, so the logits come to the host), with the
     * tokens left (max_tokens, the context) as its budget; the chosen token is then fed to it.
     * Its vocabulary must have the model's vocab_size rows. */
    struct grammar_matcher *grammar;
    /* Log-probabilities for each emitted token (engine_event.logprob), and the top_logprobs
     * (0..ENGINE_MAX_TOP_LOGPROBS) most likely tokens; the logits then come to the host. */
    int logprobs, top_logprobs;
};

/* Names and meaning as llama-server's "timings" object. */
struct engine_timings {
    int prompt_n;                /* prompt tokens processed (the reused prefix excluded) */
    int cache_n;                 /* prompt tokens resumed from the prefix cache */
    double prompt_ms;            /* prefill + choosing the first token */
    double prepare_ms, feed_ms;  /* its parts on the host: the cache's choice and restore, and
                                    queueing the prefill (a device runs it meanwhile) */
    double prompt_per_second;
    int predicted_n;             /* tokens generated (the first and any EOS included) */
    double predicted_ms;         /* from the first token to the end */
    double predicted_per_second; /* predicted_n / predicted_ms, as llama-server */
};

struct engine_result {
    enum engine_finish finish;
    int32_t stop_token;        /* the EOS id that ended it, else -1 */
    int stop_index;            /* index of the stop string that matched, else -1 */
    int n_prompt, n_generated; /* usage */
    double ttft_ms;            /* engine_generate entry -> first token chosen */
    struct engine_timings timings;
};

struct engine;

/* tok may be NULL (id-level use: no text, no stop strings). EOS ids: config eos_token_id plus
 * the tokenizer's <|im_end|> and <|endoftext|> when present. */
struct engine *engine_create(struct model *m, struct tokenizer *tok);
void engine_free(struct engine *e);

struct model *engine_model(struct engine *e);

/* Prefix reuse (default on): a prompt resumes from the longest prefix the prefix cache holds
 * (engine_set_cache, cache.h): an earlier prompt and its reply, a shared system prompt, the turn
 * before in a thinking conversation; only the rest is prefilled. Off: every request starts from
 * a reset and the cache is emptied. */
void engine_set_prefix_reuse(struct engine *e, int on);

/* The prefix cache (cache.h): its memory budget in bytes (0: cache_default_budget, half of the
 * device memory free after the model), allocated now. engine_create starts with the model's one
 * sequence and four checkpoints (the CLI's use). */
void engine_set_cache(struct engine *e, size_t budget_bytes);
/* On a device backend, runs a few short requests (prompts of 1 to 2,048 tokens, greedy and
 * sampled steps) so that the first client's request does not pay for loading kernels and
 * recording graphs; leaves the model and the cache empty. Nothing on the CPU. */
void engine_warmup(struct engine *e);
struct cache_stats;
void engine_cache_stats(struct engine *e, struct cache_stats *out); /* any thread */
/* The plain batched rounds (a round that chooses the tokens of the last batched step's rows and
 * queues the next batched step, no prompt piece in it): how many, how many of them ran ahead
 * (queued the next step before handling the tokens), their rows, their wall time on the engine
 * thread and the part of it spent waiting for the device's choices (model_rows_wait). The rest
 * is host work (accepting the tokens: detokenizer, stop strings, the emit callbacks; admission;
 * queueing the next step), which the device overlaps only in the rounds that ran ahead. */
struct engine_round_stats {
    unsigned long rounds, ahead, rows;
    double round_ms, wait_ms;
};
void engine_round_stats(struct engine *e, struct engine_round_stats *out); /* any thread */
/* Run ahead (default: on where model_async, the GPU): each token's feeding step is queued
 * before its text is handled, so that host work overlaps the device's; greedy requests without
 * penalties feed each choice on the device before the host reads it (model_step_greedy). The
 * tokens and text are the same either way (test_engine runs both on the CPU); a request ended by
 * a stop string or the client (or, greedy, by an EOS token) leaves that last token in the state. */
void engine_set_run_ahead(struct engine *e, int on);
int engine_n_eos(const struct engine *e, const int32_t **ids);

/* sampler_params_default, then the checkpoint's generation_config.json (temperature, top_p,
 * top_k, min_p, repetition_penalty, presence_penalty; do_sample false: greedy): what a request
 * that names no sampling field gets. */
void engine_sampling_defaults(const struct model *m, struct sampler_params *sp);

/* Runs one request to its end. Returns 0 with res filled, or -1 with err when the request
 * cannot start (prompt empty or not fitting in the context: the caller's 400).
 *
 * Continuous batching: the engine runs up to engine_parallel requests at once. Each round,
 * every running request chooses and emits its next token, queued requests start (the prefix
 * cache's prepare, pinned sequences), one piece of the oldest unfed prompt is prefilled (at
 * most a chunk of 1,024 tokens on a device, 256 on the CPU, while others decode; the whole
 * prompt when none does), and one batched step (model_step_rows) feeds every request's token:
 * one pass over the weights for all of them. A request running alone takes the
 * single-sequence step (its graph, running ahead) until another is queued. A request's tokens
 * do not depend on the others (on the CPU bit for bit; test_engine checks it).
 *
 * Without engine_run, engine_generate runs the rounds itself on the caller's thread (the
 * CLI, tests); while engine_run steps on another thread, engine_generate (from any thread)
 * queues the request and waits for it, the emit callbacks then running on engine_run's
 * thread. engine_generate_many runs n requests together (the results in order; returns how
 * many started, err[i] set for the others). */
int engine_generate(struct engine *e, const struct engine_request *r, struct engine_result *res,
                    struct error *err);
int engine_generate_many(struct engine *e, const struct engine_request *r, struct engine_result *res,
                         struct error *err, int n);
/* Steps queued requests until *stop is set and nothing is queued or running (a running request
 * ends by its own means: its emit callback or cancel flag). engine_wake after setting *stop.
 * engine_serve marks the engine as run by engine_run from now on: call it before starting the
 * thread that runs it and any thread that calls engine_generate, so that none runs the rounds
 * itself meanwhile (engine_run calls it too). */
void engine_serve(struct engine *e);
void engine_run(struct engine *e, const atomic_int *stop);
void engine_wake(struct engine *e);
/* Requests run at once: at most n (<= 0: as many as the prefix cache has sequences, at most
 * MODEL_MAX_BATCH); engine_parallel says what it is now (engine_set_cache changes it). */
void engine_set_parallel(struct engine *e, int n);
int engine_parallel(const struct engine *e);

/* Stop-string scan over pending text (exposed for tests). Returns how many leading bytes of
 * text[0..len) may be released: if a stop string occurs, the bytes before its earliest
 * occurrence (and *hit = its index); otherwise everything except the longest suffix that is a
 * proper prefix of some stop string (*hit = -1). */
size_t engine_stop_scan(const char *text, size_t len, const char *const *stop, int n_stop,
                        int *hit);

#endif
