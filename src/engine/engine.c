/* engine.c - a request -> tokens: reset, prefill, then choose / emit / step until a stop
 * condition. Text goes through the tokenizer's streaming detokenizer (which holds back
 * incomplete UTF-8) and then a pending buffer that holds back any suffix that could still
 * become a stop string, so a stop string is never emitted even when it spans tokens.
 *
 * Greedy requests without penalties take the token from the backend's argmax (only 4 bytes
 * cross to the host; running ahead, model_step_greedy feeds it to the next step on the device
 * before the host reads it); sampling the backend takes (model_sample_begin) draws there too,
 * run ahead the same way (model_step_sample) unless a grammar's mask or logprobs need the host
 * at each step; the rest (top_p or min_p over the whole vocabulary) downloads the logits and
 * runs the host sampler. logprobs come from the backend (model_logprobs).
 * Timings follow llama-server (server-context.cpp): prompt_ms covers prefill up to the first
 * token, predicted_ms the rest, predicted_n counts every generated token. */
#include "engine.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cache.h"
#include "text/grammar.h"
#include "text/tokenizer.h"

struct engine {
    struct model *m;
    struct tokenizer *tok;
    int vocab_size;
    int32_t eos[ENGINE_MAX_EOS];
    int n_eos;
    float *logits;  /* (vocab_size,) host copy for the sampler */
    char *piece;    /* (detok_max_out,) detokenizer output of one token */
    size_t piece_cap;
    char *pending;  /* text not yet released (possible stop-string prefix) */
    size_t pending_len, pending_cap;
    int prefix_reuse;
    int run_ahead;  /* queue the next step before handling a token's text (engine_set_run_ahead) */
    struct cache *cache; /* the prefix cache: which tokens each sequence holds */
    int32_t boundary_id; /* <|im_start|>, or -1: where the cache checkpoints a prompt */
    uint64_t *mask;      /* ((vocab_size + 63) / 64,) a grammar's allowed tokens, bit per id */
    /* logprobs of the step's raw logits: the chosen token's, the top tokens' */
    float chosen_lp;
    int32_t top_ids[ENGINE_MAX_TOP_LOGPROBS];
    float top_lp[ENGINE_MAX_TOP_LOGPROBS];
    int n_top;
};

const char *engine_finish_name(enum engine_finish f) {
    switch (f) {
    case ENGINE_FINISH_STOP: return "stop";
    case ENGINE_FINISH_LENGTH: return "length";
    case ENGINE_FINISH_CANCELLED: return "cancelled";
    }
    return "?";
}

static void add_eos(struct engine *e, int32_t id) {
    if (id < 0 || id >= e->vocab_size) return;
    for (int i = 0; i < e->n_eos; i++)
        if (e->eos[i] == id) return;
    if (e->n_eos < ENGINE_MAX_EOS) e->eos[e->n_eos++] = id;
}

struct engine *engine_create(struct model *m, struct tokenizer *tok) {
    struct engine *e = xcalloc(1, sizeof *e);
    const struct config *c = model_config(m);
    e->m = m;
    e->tok = tok;
    e->vocab_size = c->vocab_size;
    for (int i = 0; i < c->n_eos_token_id; i++) add_eos(e, c->eos_token_id[i]);
    if (tok) {
        add_eos(e, tokenizer_token_id(tok, "<|im_end|>"));
        add_eos(e, tokenizer_token_id(tok, "<|endoftext|>"));
    }
    e->logits = xmalloc((size_t)e->vocab_size * sizeof *e->logits);
    e->prefix_reuse = 1;
    e->run_ahead = model_async(m);
    e->boundary_id = tok ? tokenizer_token_id(tok, "<|im_start|>") : -1;
    /* until engine_set_cache: the model's one sequence and a few checkpoints */
    engine_set_cache(e, 4 * model_ckpt_bytes(m));
    if (tok) {
        e->piece_cap = detok_max_out(tok);
        e->piece = xmalloc(e->piece_cap);
    }
    return e;
}

void engine_free(struct engine *e) {
    if (!e) return;
    free(e->logits);
    free(e->mask);
    free(e->piece);
    cache_free(e->cache);
    free(e->pending);
    free(e);
}

struct model *engine_model(struct engine *e) { return e->m; }

void engine_set_prefix_reuse(struct engine *e, int on) { e->prefix_reuse = on; }

void engine_set_cache(struct engine *e, size_t budget_bytes) {
    cache_free(e->cache);
    struct cache_params p = {budget_bytes, 0, e->boundary_id};
    e->cache = cache_create(e->m, &p);
}

void engine_cache_stats(const struct engine *e, struct cache_stats *out) {
    cache_get_stats(e->cache, out);
}
void engine_set_run_ahead(struct engine *e, int on) { e->run_ahead = on; }

void engine_warmup(struct engine *e) {
    if (!model_async(e->m)) return; /* nothing loads lazily on the CPU */
    /* prompt lengths across the GEMM libraries' shape buckets (each loads its kernels on first
     * use), greedy, and the sampled step's graph once */
    static const int lens[] = {1, 9, 17, 33, 54, 64, 100, 128, 200, 256, 512, 1024, 2048};
    const int ctx = model_ctx(e->m);
    int32_t *ids = xmalloc(2048 * sizeof *ids);
    for (int i = 0; i < 2048; i++) ids[i] = (int32_t)((100 + 7919LL * i) % e->vocab_size);
    for (size_t k = 0; k < sizeof lens / sizeof *lens; k++) {
        if (lens[k] + 8 > ctx) continue;
        for (int smp = 0; smp < (lens[k] == 64 ? 2 : 1); smp++) {
            struct engine_request rq;
            memset(&rq, 0, sizeof rq);
            rq.prompt = ids;
            rq.n_prompt = lens[k];
            rq.max_tokens = 3;
            rq.ignore_eos = 1;
            sampler_params_default(&rq.sampling);
            rq.sampling.temperature = smp ? 0.7f : 0.0f;
            rq.sampling.top_k = smp ? 20 : 0;
            struct engine_result res;
            struct error err = {{0}};
            (void)engine_generate(e, &rq, &res, &err);
        }
    }
    free(ids);
    cache_clear(e->cache); /* the warm-up leaves nothing behind */
}

void engine_sampling_defaults(const struct model *m, struct sampler_params *sp) {
    sampler_params_default(sp);
    const struct gen_defaults *g = model_gen_defaults(m);
    if (!g->present) return;
    if (!g->do_sample) {
        sp->temperature = 0;
        return;
    }
    if (g->has_temperature) sp->temperature = g->temperature;
    if (g->has_top_p) sp->top_p = g->top_p > 0 ? g->top_p : 1;
    if (g->has_top_k) sp->top_k = g->top_k;
    if (g->has_min_p) sp->min_p = g->min_p;
    if (g->has_repetition_penalty) sp->repetition_penalty = g->repetition_penalty;
    if (g->has_presence_penalty) sp->presence_penalty = g->presence_penalty;
}

int engine_n_eos(const struct engine *e, const int32_t **ids) {
    if (ids) *ids = e->eos;
    return e->n_eos;
}

/* Steps the model on a generated token and records it in the cache (the tokens the state
 * holds). */
static int feed(struct engine *e, int32_t id) {
    if (model_step(e->m, id) != 0) return -1;
    cache_push(e->cache, id);
    return 0;
}

/* Constrained decoding: the grammar's allowed tokens at this step (bit per id), or NULL for an
 * empty mask, which a correct grammar never gives (then nothing is masked rather than the
 * request ended); the tokens left (max_tokens, the context) are its budget. */
static const uint64_t *grammar_mask_of_step(struct engine *e, const struct engine_request *r, int n_gen) {
    const int V = e->vocab_size;
    CHECK(grammar_matcher_n_tokens(r->grammar) == V);
    if (!e->mask) e->mask = xmalloc(((size_t)V + 63) / 64 * sizeof *e->mask);
    long left = r->max_tokens > 0 ? (long)r->max_tokens - n_gen : INT_MAX;
    long ctx_left = (long)model_ctx(e->m) - model_pos(e->m) + 1;
    if (ctx_left < left) left = ctx_left;
    return grammar_matcher_mask(r->grammar, e->mask, left > INT_MAX ? INT_MAX : (int)left) ? e->mask : NULL;
}

/* ... applied to the host's logits: -inf where not allowed */
static void grammar_mask_logits(struct engine *e, const struct engine_request *r, int n_gen) {
    const int V = e->vocab_size;
    const uint64_t *mask = grammar_mask_of_step(e, r, n_gen);
    for (int w = 0; mask && w * 64 < V; w++) {
        uint64_t b = mask[w];
        if (b == ~0ull) continue;
        for (int i = 0; i < 64 && w * 64 + i < V; i++)
            if (!(b >> i & 1)) e->logits[w * 64 + i] = -INFINITY;
    }
}

/* logprobs of the chosen token and the r->top_logprobs most likely ones, from the raw logits of
 * this step (before penalties, temperature and any mask), computed on the backend
 * (model_logprobs: the host reads 2 + 2k floats) */
static void logprobs_of_step(struct engine *e, const struct engine_request *r, int32_t id) {
    const int k = r->top_logprobs < ENGINE_MAX_TOP_LOGPROBS ? r->top_logprobs : ENGINE_MAX_TOP_LOGPROBS;
    float lse = 0, chosen = 0;
    CHECK(model_logprobs(e->m, k, id, &lse, &chosen, e->top_ids, e->top_lp) == 0);
    e->chosen_lp = chosen - lse;
    for (int i = 0; i < k; i++) e->top_lp[i] -= lse;
    e->n_top = k;
}

static int cancelled(const struct engine_request *r) {
    return r->cancel && atomic_load(r->cancel);
}
static int cancel_cb(void *arg) { return cancelled(arg); }

static int is_eos(const struct engine *e, int32_t id) {
    for (int i = 0; i < e->n_eos; i++)
        if (e->eos[i] == id) return 1;
    return 0;
}

size_t engine_stop_scan(const char *text, size_t len, const char *const *stop, int n_stop,
                        int *hit) {
    size_t first = len;
    *hit = -1;
    for (int s = 0; s < n_stop; s++) {
        size_t sl = strlen(stop[s]);
        if (sl == 0 || sl > len) continue;
        const char *p = memmem(text, len, stop[s], sl);
        if (p && (size_t)(p - text) < first) {
            first = (size_t)(p - text);
            *hit = s;
        }
    }
    if (*hit >= 0) return first;
    /* hold back the longest suffix that is a proper prefix of a stop string */
    size_t hold = 0;
    for (int s = 0; s < n_stop; s++) {
        size_t sl = strlen(stop[s]);
        size_t maxk = sl - 1 < len ? sl - 1 : len;
        for (size_t k = maxk; k > hold; k--)
            if (memcmp(text + len - k, stop[s], k) == 0) {
                hold = k;
                break;
            }
    }
    return len - hold;
}

static void pending_append(struct engine *e, const char *s, size_t n) {
    if (e->pending_len + n + 1 > e->pending_cap) {
        e->pending_cap = (e->pending_len + n + 1) * 2;
        e->pending = xrealloc(e->pending, e->pending_cap);
    }
    memcpy(e->pending + e->pending_len, s, n);
    e->pending_len += n;
}

static void pending_consume(struct engine *e, size_t n) {
    memmove(e->pending, e->pending + n, e->pending_len - n);
    e->pending_len -= n;
}


int engine_generate(struct engine *e, const struct engine_request *r, struct engine_result *res,
                    struct error *err) {
    memset(res, 0, sizeof *res);
    res->stop_token = -1;
    res->stop_index = -1;
    res->n_prompt = r->n_prompt;
    const int ctx = model_ctx(e->m);
    if (r->n_prompt <= 0) return error_set(err, "the prompt is empty");
    if (r->n_prompt >= ctx)
        return error_set(err,
                         "the prompt has %d tokens and does not fit in the context of %d tokens",
                         r->n_prompt, ctx);
    for (int i = 0; i < r->n_prompt; i++)
        if (r->prompt[i] < 0 || r->prompt[i] >= e->vocab_size)
            return error_set(err, "token id %d at prompt position %d is outside the vocabulary "
                             "(0..%d)", r->prompt[i], i, e->vocab_size - 1);
    CHECK(r->n_stop >= 0 && r->n_stop <= ENGINE_MAX_STOP);
    CHECK(r->n_stop == 0 || e->tok);

    double t0 = now_ms();
    if (cancelled(r)) {
        res->finish = ENGINE_FINISH_CANCELLED;
        return 0;
    }

    struct sampler *smp = sampler_create(e->vocab_size, &r->sampling);
    sampler_add_prompt(smp, r->prompt, r->n_prompt);
    const int greedy_plain = sampler_is_greedy_plain(smp) && !r->grammar && !r->logprobs;
    struct detok dt;
    if (e->tok) {
        detok_init(&dt, e->tok);
        dt.skip_special = 1;
    }
    e->pending_len = 0;

    if (!e->prefix_reuse) cache_clear(e->cache);
    const int reuse = cache_prepare(e->cache, r->prompt, r->n_prompt);
    const double t_prep = now_ms();
    const int fr = cache_feed_prompt(e->cache, r->prompt, r->n_prompt, reuse, cancel_cb,
                                     (void *)r, err);
    const double t_fed = now_ms();
    if (fr != 0) {
        sampler_free(smp);
        if (fr < 0) return -1;
        res->finish = ENGINE_FINISH_CANCELLED; /* between pieces of the prompt */
        res->timings.cache_n = reuse;
        return 0;
    }

    /* the draw on the backend when it takes these parameters (model_sample_begin), a grammar's
     * mask with it (model_sample_mask); greedy with penalties, bias, a grammar or logprobs is
     * its top_k 1 (the argmax of the processed logits, lowest id on ties, as the sampler's) */
    int dev_sample = 0;
    if (!greedy_plain) {
        const struct sampler_params *sp = &r->sampling;
        struct model_sampling ms = {sp->temperature, sp->top_p, sp->min_p,
                                    sp->presence_penalty, sp->frequency_penalty,
                                    sp->repetition_penalty, sp->top_k, sp->seed,
                                    sp->bias_ids, sp->bias_values, sp->n_bias};
        if (!(ms.temperature > 0.0f)) ms.temperature = 1.0f, ms.top_k = 1, ms.top_p = 1.0f, ms.min_p = 0.0f;
        dev_sample = model_sample_begin(e->m, &ms, r->prompt, r->n_prompt);
    }
    /* the device draws ahead of the host only when the host has nothing to give or take per step */
    const int dev_ahead = dev_sample && e->run_ahead && !r->grammar && !r->logprobs;

    double t1 = 0;
    int n_gen = 0;
    enum engine_finish finish = ENGINE_FINISH_LENGTH;
    for (;;) {
        /* the token chosen now is the last: max_tokens, or no position left to feed it */
        const int last = (r->max_tokens > 0 && n_gen + 1 >= r->max_tokens) || model_pos(e->m) >= ctx;
        int32_t id;
        int fed = 0;
        if (n_gen < r->n_forced) {
            /* the choice a sampler would make waits for the logits; so does a forced one, or a
             * device backend would run far behind the host and the timings would be fiction */
            (void)model_argmax(e->m);
            id = r->forced[n_gen];
        } else if (greedy_plain && e->run_ahead && n_gen > 0 && !last) {
            /* run ahead on the device: the choice is fed to the next step there, before the
             * host reads it (model_step_greedy) */
            id = model_step_greedy(e->m);
            CHECK(id >= 0);
            cache_push(e->cache, id);
            fed = 1;
        } else if (greedy_plain) {
            id = model_argmax(e->m);
        } else if (dev_ahead && n_gen > 0 && !last) {
            id = model_step_sample(e->m); /* as model_step_greedy, the draw on the device */
            CHECK(id >= 0);
            cache_push(e->cache, id);
            fed = 1;
        } else if (dev_sample) {
            if (r->grammar) model_sample_mask(e->m, grammar_mask_of_step(e, r, n_gen));
            id = model_sample(e->m);
        } else {
            model_logits(e->m, e->logits);
            if (r->grammar) grammar_mask_logits(e, r, n_gen);
            id = sampler_sample(smp, e->logits);
        }
        if (r->logprobs) logprobs_of_step(e, r, id); /* the logits of this step are still there */
        if (r->grammar) (void)grammar_matcher_accept(r->grammar, id); /* a forced id may not fit */
        sampler_accept(smp, id);
        n_gen++;
        if (n_gen == 1) {
            t1 = now_ms();
            res->ttft_ms = t1 - t0;
        }
        if (!r->ignore_eos && is_eos(e, id)) {
            finish = ENGINE_FINISH_STOP;
            res->stop_token = id;
            break;
        }
        /* run ahead: on a device backend, the step that feeds this token is queued now and runs
         * while the host detokenises, scans for stop strings and writes to the client. If those
         * then end the request, the state has taken the token too; the cache says so, and a later
         * prompt is reused only if it starts with it. The first token is sent first (TTFT). */
        if (!fed && e->run_ahead && n_gen > 1 && !last) {
            if (feed(e, id) != 0) break;
            fed = 1;
        }

        /* text: detokenizer -> pending -> stop scan -> release */
        size_t release = 0;
        int hit = -1;
        if (e->tok) {
            size_t n = detok_push(&dt, id, e->piece, e->piece_cap);
            pending_append(e, e->piece, n);
            release = engine_stop_scan(e->pending, e->pending_len,
                                       (const char *const *)r->stop, r->n_stop, &hit);
        }
        struct engine_event ev = {id, e->pending, release, n_gen, 0, 0, NULL, NULL};
        if (r->logprobs) {
            ev.logprob = e->chosen_lp;
            ev.n_top = e->n_top, ev.top_ids = e->top_ids, ev.top_logprobs = e->top_lp;
        }
        int stop_cb = r->emit ? r->emit(r->user, &ev) : 0;
        if (hit >= 0) {
            e->pending_len = 0; /* the stop string and anything after it are dropped */
            finish = ENGINE_FINISH_STOP;
            res->stop_index = hit;
            break;
        }
        pending_consume(e, release);
        if (stop_cb || cancelled(r)) {
            finish = ENGINE_FINISH_CANCELLED;
            break;
        }
        if (last) break; /* max_tokens, or the context is full */
        if (!fed && feed(e, id) != 0) break;
    }
    double t2 = now_ms();

    /* final flush: incomplete UTF-8 (as U+FFFD) and any held-back stop-string prefix */
    if (finish != ENGINE_FINISH_CANCELLED) {
        if (e->tok && res->stop_index < 0) {
            size_t n = detok_flush(&dt, e->piece, e->piece_cap);
            pending_append(e, e->piece, n);
        }
        struct engine_event ev = {-1, e->pending, e->pending_len, n_gen, 0, 0, NULL, NULL};
        if (r->emit) r->emit(r->user, &ev);
    }
    e->pending_len = 0;
    sampler_free(smp);

    res->finish = finish;
    res->n_generated = n_gen;
    struct engine_timings *tm = &res->timings;
    tm->prompt_n = r->n_prompt - reuse;
    tm->cache_n = reuse;
    tm->prompt_ms = t1 - t0;
    tm->prepare_ms = t_prep - t0;
    tm->feed_ms = t_fed - t_prep;
    tm->prompt_per_second = tm->prompt_ms > 0 ? 1e3 * tm->prompt_n / tm->prompt_ms : 0;
    tm->predicted_n = n_gen;
    tm->predicted_ms = t2 - t1;
    tm->predicted_per_second = tm->predicted_ms > 0 ? 1e3 * n_gen / tm->predicted_ms : 0;
    return 0;
}
