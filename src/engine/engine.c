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
#include <pthread.h>
#include <stdio.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cache.h"
#include "text/grammar.h"
#include "text/tokenizer.h"

/* A request being run: its own sampler, detokenizer, pending text and place in the model. */
enum { SLOT_FREE, SLOT_PREFILL, SLOT_DECODE };
enum { AT_CUR, AT_ROW, AT_PENDING }; /* a decoding slot's logits: the model's current ones, a row
                                        of the last batched step, or a token still to be fed */
struct submission;
struct slot {
    int state;
    struct submission *sub;
    const struct engine_request *r;
    struct engine_result *res;
    int cslot;               /* the cache's slot (the sequence) */
    struct model_seq *seq;
    struct sampler *smp;
    struct detok dt;
    char *piece;             /* (detok_max_out,) detokenizer output of one token */
    char *pending;           /* text not yet released (possible stop-string prefix) */
    size_t pending_len, pending_cap;
    uint64_t *mask;          /* ((vocab_size + 63) / 64,) a grammar's allowed tokens */
    float chosen_lp;         /* logprobs of the step's raw logits */
    int32_t top_ids[ENGINE_MAX_TOP_LOGPROBS];
    float top_lp[ENGINE_MAX_TOP_LOGPROBS];
    int n_top;
    int greedy_plain, dev_sample, dev_ahead;
    int reuse, n_gen, at, row;
    int32_t pend;            /* AT_PENDING: the token to feed */
    enum engine_finish finish;
    double t0, t_prep, t_fed, t1;
    uint64_t order;          /* admission order: prefills go oldest first */
};

/* A request handed to the engine: by engine_generate's caller, waiting for done. */
struct submission {
    const struct engine_request *r;
    struct engine_result *res;
    int done;
    struct submission *next;
};

struct engine {
    struct model *m;
    struct tokenizer *tok;
    int vocab_size;
    int32_t eos[ENGINE_MAX_EOS];
    int n_eos;
    float *logits;  /* (vocab_size,) host copy for the sampler */
    size_t piece_cap;
    int prefix_reuse;
    int run_ahead;  /* queue the next step before handling a token's text (engine_set_run_ahead) */
    struct cache *cache; /* the prefix cache: which tokens each sequence holds */
    int32_t boundary_id; /* <|im_start|>, or -1: where the cache checkpoints a prompt */
    struct slot slots[MODEL_MAX_BATCH];
    int n_active, parallel, max_active;
    int prefill_chunk;   /* tokens of a prompt fed between two decode steps of others */
    uint64_t order;
    /* the submission queue (engine_generate from other threads while engine_run steps) */
    pthread_mutex_t mu;
    pthread_cond_t cv;      /* a submission queued, or engine_run asked to stop */
    pthread_cond_t done_cv; /* a submission done */
    struct submission *q_head, *q_tail;
    atomic_int queued;      /* submissions waiting: the solo loop yields to them */
    int serving;            /* engine_run is stepping on its thread */
    struct cache_stats stats; /* the cache's, as of the last request's end (mu) */
    struct engine_round_stats rstats; /* (mu) */
    double round_wait_ms; /* this round's wait in model_rows_wait */
    int round_rows;       /* this round's rows chosen (tokens_rows) */
    int round_ahead;      /* this round ran ahead (tokens_rows) */
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
    e->prefill_chunk = model_async(m) ? 1024 : 256;
    if (tok) e->piece_cap = detok_max_out(tok);
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    pthread_cond_init(&e->done_cv, NULL);
    /* until engine_set_cache: the model's one sequence and a few checkpoints */
    engine_set_cache(e, 4 * model_ckpt_bytes(m));
    return e;
}

void engine_free(struct engine *e) {
    if (!e) return;
    CHECK(e->n_active == 0);
    free(e->logits);
    for (int i = 0; i < MODEL_MAX_BATCH; i++) {
        free(e->slots[i].mask);
        free(e->slots[i].piece);
        free(e->slots[i].pending);
    }
    cache_free(e->cache);
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->cv);
    pthread_cond_destroy(&e->done_cv);
    free(e);
}

struct model *engine_model(struct engine *e) { return e->m; }

void engine_set_prefix_reuse(struct engine *e, int on) { e->prefix_reuse = on; }

static void update_max_active(struct engine *e) {
    int n = cache_n_slots(e->cache);
    if (n > MODEL_MAX_BATCH) n = MODEL_MAX_BATCH;
    if (e->parallel > 0 && e->parallel < n) n = e->parallel;
    e->max_active = n;
}

void engine_set_cache(struct engine *e, size_t budget_bytes) {
    CHECK(e->n_active == 0);
    cache_free(e->cache);
    struct cache_params p = {budget_bytes, 0, e->boundary_id};
    e->cache = cache_create(e->m, &p);
    cache_get_stats(e->cache, &e->stats);
    update_max_active(e);
}

void engine_set_parallel(struct engine *e, int n) {
    e->parallel = n;
    update_max_active(e);
}
int engine_parallel(const struct engine *e) { return e->max_active; }

void engine_cache_stats(struct engine *e, struct cache_stats *out) {
    pthread_mutex_lock(&e->mu);
    if (!e->serving) cache_get_stats(e->cache, &e->stats);
    *out = e->stats;
    pthread_mutex_unlock(&e->mu);
}
void engine_round_stats(struct engine *e, struct engine_round_stats *out) {
    pthread_mutex_lock(&e->mu);
    *out = e->rstats;
    pthread_mutex_unlock(&e->mu);
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
    struct engine_request rq[MODEL_MAX_BATCH];
    struct engine_result res[MODEL_MAX_BATCH];
    struct error err[MODEL_MAX_BATCH];
    memset(rq, 0, sizeof rq);
    for (int i = 0; i < MODEL_MAX_BATCH; i++) {
        rq[i].prompt = ids + i;
        rq[i].n_prompt = 9;
        rq[i].max_tokens = 3;
        rq[i].ignore_eos = 1;
        sampler_params_default(&rq[i].sampling);
        rq[i].sampling.temperature = 0.0f;
    }
    for (size_t k = 0; k < sizeof lens / sizeof *lens; k++) {
        if (lens[k] + 8 > ctx) continue;
        for (int smp = 0; smp < (lens[k] == 64 ? 2 : 1); smp++) {
            rq[0].n_prompt = lens[k];
            rq[0].sampling.temperature = smp ? 0.7f : 0.0f;
            rq[0].sampling.top_k = smp ? 20 : 0;
            (void)engine_generate_many(e, rq, res, err, 1);
        }
    }
    /* batched steps of every size up to the parallel limit (their GEMM shapes): requests that
     * end one step apart, half of them sampled */
    const int P = e->max_active;
    if (P > 1 && 16 + P + 8 <= ctx) {
        for (int i = 0; i < P; i++) {
            rq[i].prompt = ids + 3 * i;
            rq[i].n_prompt = 16;
            rq[i].max_tokens = 2 + P - i;
            rq[i].sampling.temperature = i % 2 ? 0.7f : 0.0f;
            rq[i].sampling.top_k = i % 2 ? 20 : 0;
        }
        (void)engine_generate_many(e, rq, res, err, P);
    }
    free(ids);
    model_warm(e->m); /* every prompt length's GEMM plans, for the shapes the above ran */
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

/* Makes slot s's sequence the model's (and the cache's) current one. */
static void use(struct engine *e, struct slot *s) {
    cache_use(e->cache, s->cslot);
}

/* Steps the model on a generated token of s (its sequence current) and records it in the
 * cache (the tokens the state holds). */
static int feed(struct engine *e, struct slot *s, int32_t id) {
    if (model_step(e->m, id) != 0) return -1;
    cache_push_to(e->cache, s->cslot, id);
    return 0;
}

/* Constrained decoding: the grammar's allowed tokens at this step (bit per id), or NULL for an
 * empty mask, which a correct grammar never gives (then nothing is masked rather than the
 * request ended); the tokens left (max_tokens, the context) are its budget. */
static const uint64_t *grammar_mask_of_step(struct engine *e, struct slot *s) {
    const struct engine_request *r = s->r;
    const int V = e->vocab_size;
    CHECK(grammar_matcher_n_tokens(r->grammar) == V);
    if (!s->mask) s->mask = xmalloc(((size_t)V + 63) / 64 * sizeof *s->mask);
    long left = r->max_tokens > 0 ? (long)r->max_tokens - s->n_gen : INT_MAX;
    long ctx_left = (long)model_ctx(e->m) - model_seq_pos(s->seq) + 1;
    if (ctx_left < left) left = ctx_left;
    return grammar_matcher_mask(r->grammar, s->mask, left > INT_MAX ? INT_MAX : (int)left) ? s->mask : NULL;
}

/* ... applied to the host's logits: -inf where not allowed */
static void grammar_mask_logits(struct engine *e, struct slot *s) {
    const int V = e->vocab_size;
    const uint64_t *mask = grammar_mask_of_step(e, s);
    for (int w = 0; mask && w * 64 < V; w++) {
        uint64_t b = mask[w];
        if (b == ~0ull) continue;
        for (int i = 0; i < 64 && w * 64 + i < V; i++)
            if (!(b >> i & 1)) e->logits[w * 64 + i] = -INFINITY;
    }
}

/* logprobs of the chosen token and the r->top_logprobs most likely ones, from the raw logits of
 * this step (before penalties, temperature and any mask), computed on the backend
 * (model_logprobs: the host reads 2 + 2k floats); row < 0: the current logits */
static void logprobs_of_step(struct engine *e, struct slot *s, int row, int32_t id) {
    const struct engine_request *r = s->r;
    const int k = r->top_logprobs < ENGINE_MAX_TOP_LOGPROBS ? r->top_logprobs : ENGINE_MAX_TOP_LOGPROBS;
    float lse = 0, chosen = 0;
    if (row < 0)
        CHECK(model_logprobs(e->m, k, id, &lse, &chosen, s->top_ids, s->top_lp) == 0);
    else
        CHECK(model_row_logprobs(e->m, row, k, id, &lse, &chosen, s->top_ids, s->top_lp) == 0);
    s->chosen_lp = chosen - lse;
    for (int i = 0; i < k; i++) s->top_lp[i] -= lse;
    s->n_top = k;
}

static int cancelled(const struct engine_request *r) {
    return r->cancel && atomic_load(r->cancel);
}

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

static void pending_append(struct slot *s, const char *p, size_t n) {
    if (s->pending_len + n + 1 > s->pending_cap) {
        s->pending_cap = (s->pending_len + n + 1) * 2;
        s->pending = xrealloc(s->pending, s->pending_cap);
    }
    memcpy(s->pending + s->pending_len, p, n);
    s->pending_len += n;
}

static void pending_consume(struct slot *s, size_t n) {
    memmove(s->pending, s->pending + n, s->pending_len - n);
    s->pending_len -= n;
}

/* Checks a request before it is queued: the caller's 400. */
static int validate(const struct engine *e, const struct engine_request *r, struct error *err) {
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
    return 0;
}

/* ---- a slot's life ------------------------------------------------------------------------ */

static void slot_finish(struct engine *e, struct slot *s);
static void prefill_some(struct engine *e, struct slot *s, int chunk);

/* The draw on the backend when it takes these parameters (model_sample_begin), a grammar's
 * mask with it (model_sample_mask); greedy with penalties, bias, a grammar or logprobs is its
 * top_k 1 (the argmax of the processed logits, lowest id on ties, as the sampler's). With s's
 * sequence current (after its prompt). */
static void sampling_begin(struct engine *e, struct slot *s) {
    const struct engine_request *r = s->r;
    s->dev_sample = 0;
    if (!s->greedy_plain) {
        const struct sampler_params *sp = &r->sampling;
        struct model_sampling ms = {sp->temperature, sp->top_p, sp->min_p,
                                    sp->presence_penalty, sp->frequency_penalty,
                                    sp->repetition_penalty, sp->top_k, sp->seed,
                                    sp->bias_ids, sp->bias_values, sp->n_bias};
        if (!(ms.temperature > 0.0f)) ms.temperature = 1.0f, ms.top_k = 1, ms.top_p = 1.0f, ms.min_p = 0.0f;
        s->dev_sample = model_sample_begin(e->m, &ms, r->prompt, r->n_prompt);
    }
    /* the device draws ahead of the host only when the host has nothing to give or take per step */
    s->dev_ahead = s->dev_sample && e->run_ahead && !r->grammar && !r->logprobs;
}

/* Takes a submission into a free slot: the cache's choice of sequence (pinned while the
 * request runs) and the plan of its prompt's feed. The slot is then SLOT_PREFILL, or finished
 * when cancelled before it started. */
static void slot_start(struct engine *e, struct submission *sub) {
    struct slot *s = NULL;
    for (int i = 0; i < MODEL_MAX_BATCH && !s; i++)
        if (e->slots[i].state == SLOT_FREE) s = &e->slots[i];
    CHECK(s);
    const struct engine_request *r = sub->r;
    struct engine_result *res = sub->res;
    memset(res, 0, sizeof *res);
    res->stop_token = -1;
    res->stop_index = -1;
    res->n_prompt = r->n_prompt;
    s->sub = sub, s->r = r, s->res = res;
    s->t0 = now_ms();
    s->n_gen = 0;
    s->pending_len = 0;
    s->n_top = 0;
    s->finish = ENGINE_FINISH_LENGTH;
    s->order = ++e->order;
    s->t1 = s->t_prep = s->t_fed = s->t0;
    s->reuse = 0;
    s->smp = NULL;
    e->n_active++;
    if (cancelled(r)) {
        s->state = SLOT_PREFILL; /* counted active until slot_finish */
        s->cslot = -1;
        s->finish = ENGINE_FINISH_CANCELLED;
        slot_finish(e, s);
        return;
    }
    s->smp = sampler_create(e->vocab_size, &r->sampling);
    sampler_add_prompt(s->smp, r->prompt, r->n_prompt);
    s->greedy_plain = sampler_is_greedy_plain(s->smp) && !r->grammar && !r->logprobs;
    if (e->tok) {
        if (!s->piece) s->piece = xmalloc(e->piece_cap);
        detok_init(&s->dt, e->tok);
        s->dt.skip_special = 1;
    }
    if (!e->prefix_reuse) cache_clear(e->cache);
    s->reuse = cache_prepare(e->cache, r->prompt, r->n_prompt);
    s->cslot = cache_slot(e->cache);
    s->seq = cache_seq(e->cache, s->cslot);
    cache_pin(e->cache, s->cslot, 1);
    s->t_prep = now_ms();
    cache_feed_begin(e->cache, r->prompt, r->n_prompt, s->reuse);
    s->state = SLOT_PREFILL;
    if (s->reuse == r->n_prompt) /* resumed with the prompt's logits, current only until the
                                    model's sequence changes: the first token now */
        prefill_some(e, s, 0);
}

/* Whether the token s chooses now is its last: max_tokens, or no position left to feed it. */
static int is_last(const struct engine *e, const struct slot *s) {
    return (s->r->max_tokens > 0 && s->n_gen + 1 >= s->r->max_tokens) ||
           model_seq_pos(s->seq) >= model_ctx(e->m);
}

/* A chosen token: the grammar and the sampler take it, then its text through the detokenizer,
 * the pending buffer and the stop scan to the emit callback. solo: s's sequence is current and
 * the token may be fed here (*fed: already fed; it is fed before its text is handled when
 * running ahead, after otherwise); else the next batched step feeds it. Returns 1 when the
 * request ended (s->finish set), else 0 with the token fed (solo) or pending (AT_PENDING). */
static int accept(struct engine *e, struct slot *s, int32_t id, int last, int solo, int fed) {
    const struct engine_request *r = s->r;
    struct engine_result *res = s->res;
    if (r->grammar) (void)grammar_matcher_accept(r->grammar, id); /* a forced id may not fit */
    sampler_accept(s->smp, id);
    s->n_gen++;
    if (s->n_gen == 1) {
        s->t1 = now_ms();
        res->ttft_ms = s->t1 - s->t0;
    }
    if (!r->ignore_eos && is_eos(e, id)) {
        s->finish = ENGINE_FINISH_STOP;
        res->stop_token = id;
        return 1;
    }
    /* run ahead: on a device backend, the step that feeds this token is queued now and runs
     * while the host detokenises, scans for stop strings and writes to the client. If those
     * then end the request, the state has taken the token too; the cache says so, and a later
     * prompt is reused only if it starts with it. The first token is sent first (TTFT). */
    if (solo && !fed && e->run_ahead && s->n_gen > 1 && !last) {
        if (feed(e, s, id) != 0) return 1;
        fed = 1;
    }

    /* text: detokenizer -> pending -> stop scan -> release */
    size_t release = 0;
    int hit = -1;
    if (e->tok) {
        size_t n = detok_push(&s->dt, id, s->piece, e->piece_cap);
        pending_append(s, s->piece, n);
        release = engine_stop_scan(s->pending, s->pending_len, (const char *const *)r->stop,
                                   r->n_stop, &hit);
    }
    struct engine_event ev = {id, s->pending, release, s->n_gen, 0, 0, NULL, NULL};
    if (r->logprobs) {
        ev.logprob = s->chosen_lp;
        ev.n_top = s->n_top, ev.top_ids = s->top_ids, ev.top_logprobs = s->top_lp;
    }
    int stop_cb = r->emit ? r->emit(r->user, &ev) : 0;
    if (hit >= 0) {
        s->pending_len = 0; /* the stop string and anything after it are dropped */
        s->finish = ENGINE_FINISH_STOP;
        res->stop_index = hit;
        return 1;
    }
    pending_consume(s, release);
    if (stop_cb || cancelled(r)) {
        s->finish = ENGINE_FINISH_CANCELLED;
        return 1;
    }
    if (last) return 1; /* max_tokens, or the context is full */
    if (solo) {
        if (!fed && feed(e, s, id) != 0) return 1;
        s->at = AT_CUR;
    } else {
        s->pend = id;
        s->at = AT_PENDING;
    }
    return 0;
}

/* One token of s from the model's current logits (s's sequence current): the choice, then
 * accept. solo: s runs alone (running ahead where it may, the token fed). */
static int token_cur(struct engine *e, struct slot *s, int solo) {
    const struct engine_request *r = s->r;
    const int last = is_last(e, s);
    int32_t id;
    int fed = 0;
    if (s->n_gen < r->n_forced) {
        /* the choice a sampler would make waits for the logits; so does a forced one, or a
         * device backend would run far behind the host and the timings would be fiction */
        (void)model_argmax(e->m);
        id = r->forced[s->n_gen];
    } else if (solo && s->greedy_plain && e->run_ahead && s->n_gen > 0 && !last) {
        /* run ahead on the device: the choice is fed to the next step there, before the host
         * reads it (model_step_greedy) */
        id = model_step_greedy(e->m);
        CHECK(id >= 0);
        cache_push_to(e->cache, s->cslot, id);
        fed = 1;
    } else if (s->greedy_plain) {
        id = model_argmax(e->m);
    } else if (solo && s->dev_ahead && s->n_gen > 0 && !last) {
        id = model_step_sample(e->m); /* as model_step_greedy, the draw on the device */
        CHECK(id >= 0);
        cache_push_to(e->cache, s->cslot, id);
        fed = 1;
    } else if (s->dev_sample) {
        if (r->grammar) model_sample_mask(e->m, grammar_mask_of_step(e, s));
        id = model_sample(e->m);
    } else {
        model_logits(e->m, e->logits);
        if (r->grammar) grammar_mask_logits(e, s);
        id = sampler_sample(s->smp, e->logits);
    }
    if (r->logprobs) logprobs_of_step(e, s, -1, id); /* the logits of this step are still there */
    return accept(e, s, id, last, solo, fed);
}

/* Whether the next batched step may be queued before the host handles the tokens of rs[0..n)
 * (run ahead, as a request alone does): each row's next token is the device's choice or a forced
 * one, none is its last, none needs the step's logits on the host afterwards (logprobs, a
 * grammar's mask, the host sampler); at least two rows (one alone goes back to the single-
 * sequence step); no other slot decoding (its token would need a step of its own) and nothing
 * waiting to be admitted or prefilled (that round is a mixed step, the rows riding the prompt's
 * piece). */
static int rows_can_run_ahead(struct engine *e, struct slot *const *rs, int n) {
    if (!e->run_ahead || n < 2 || (atomic_load(&e->queued) && e->n_active < e->max_active)) return 0;
    for (int i = 0; i < MODEL_MAX_BATCH; i++) { /* rs: every slot decoding, none prefilling */
        const struct slot *s = &e->slots[i];
        if (s->state == SLOT_PREFILL || (s->state == SLOT_DECODE && s->at != AT_ROW)) return 0;
    }
    for (int i = 0; i < n; i++) {
        const struct slot *s = rs[i];
        const struct engine_request *r = s->r;
        if (is_last(e, s) || r->logprobs || r->grammar) return 0;
        if (s->n_gen >= r->n_forced && !s->greedy_plain && !s->dev_sample) return 0;
    }
    return 1;
}

/* The tokens of the slots whose logits are rows of the last batched step: every device choice
 * queued and posted to the host; running ahead, the next batched step is queued behind them,
 * fed those choices on the device (rows in rs' order); then each token accepted in turn.
 * Returns whether it ran ahead (the slots still decoding hold rows of that step). */
static int tokens_rows(struct engine *e, struct slot **rs, int n) {
    int32_t ids[MODEL_MAX_BATCH];
    int B = 0;
    for (int i = 0; i < n; i++)
        if (rs[i]->row + 1 > B) B = rs[i]->row + 1;
    model_rows_argmax(e->m, B); /* every row's greedy choice; the sampled rows' drawn over it */
    for (int i = 0; i < n; i++) {
        struct slot *s = rs[i];
        const struct engine_request *r = s->r;
        if (s->n_gen < r->n_forced || s->greedy_plain) {
            continue;
        } else if (s->dev_sample) {
            if (r->grammar) model_seq_sample_mask(e->m, s->seq, grammar_mask_of_step(e, s));
            model_row_sample(e->m, s->row, s->seq);
        }
    }
    const int64_t post = model_rows_post(e->m, B);
    const int ahead = rows_can_run_ahead(e, rs, n);
    if (ahead) {
        struct model_seq *seqs[MODEL_MAX_BATCH];
        int32_t toks[MODEL_MAX_BATCH];
        int from[MODEL_MAX_BATCH];
        for (int i = 0; i < n; i++) {
            const struct slot *s = rs[i];
            const int forced = s->n_gen < s->r->n_forced;
            seqs[i] = s->seq;
            toks[i] = forced ? s->r->forced[s->n_gen] : 0;
            from[i] = forced ? -1 : s->row;
        }
        CHECK(model_step_rows_from(e->m, seqs, toks, from, n) == 0); /* no row at its last */
    }
    const double t_wait = now_ms();
    model_rows_wait(e->m, post, B, ids);
    e->round_wait_ms += now_ms() - t_wait;
    e->round_rows += n;
    e->round_ahead = ahead;
    for (int i = 0; i < n; i++) {
        struct slot *s = rs[i];
        const struct engine_request *r = s->r;
        const int last = !ahead && is_last(e, s); /* ahead: none was (its position has moved on) */
        int32_t id = ids[s->row];
        if (s->n_gen < r->n_forced) {
            id = r->forced[s->n_gen];
        } else if (!s->greedy_plain && !s->dev_sample) {
            model_row_logits(e->m, s->row, e->logits);
            if (r->grammar) grammar_mask_logits(e, s);
            id = sampler_sample(s->smp, e->logits);
        }
        if (ahead) cache_push_to(e->cache, s->cslot, id); /* fed by the step queued above: if
                                                             the token ends the request, the
                                                             state holds it and the cache says so */
        if (r->logprobs) logprobs_of_step(e, s, s->row, id);
        if (accept(e, s, id, last, 0, 0)) {
            slot_finish(e, s);
        } else if (ahead) {
            s->at = AT_ROW;
            s->row = i;
        }
    }
    return ahead;
}

static void slot_finish(struct engine *e, struct slot *s) {
    const struct engine_request *r = s->r;
    struct engine_result *res = s->res;
    const double t2 = now_ms();
    /* final flush: incomplete UTF-8 (as U+FFFD) and any held-back stop-string prefix */
    if (s->finish != ENGINE_FINISH_CANCELLED) {
        if (e->tok && res->stop_index < 0) {
            size_t n = detok_flush(&s->dt, s->piece, e->piece_cap);
            pending_append(s, s->piece, n);
        }
        struct engine_event ev = {-1, s->pending, s->pending_len, s->n_gen, 0, 0, NULL, NULL};
        if (r->emit) r->emit(r->user, &ev);
    }
    s->pending_len = 0;
    sampler_free(s->smp);
    s->smp = NULL;
    if (s->cslot >= 0) cache_pin(e->cache, s->cslot, 0);
    res->finish = s->finish;
    res->n_generated = s->n_gen;
    struct engine_timings *tm = &res->timings;
    tm->prompt_n = s->cslot >= 0 ? r->n_prompt - s->reuse : 0;
    tm->cache_n = s->reuse;
    if (s->n_gen > 0) {
        tm->prompt_ms = s->t1 - s->t0;
        tm->prepare_ms = s->t_prep - s->t0;
        tm->feed_ms = s->t_fed - s->t_prep;
        tm->prompt_per_second = tm->prompt_ms > 0 ? 1e3 * tm->prompt_n / tm->prompt_ms : 0;
        tm->predicted_ms = t2 - s->t1;
    }
    tm->predicted_n = s->n_gen;
    tm->predicted_per_second = tm->predicted_ms > 0 ? 1e3 * s->n_gen / tm->predicted_ms : 0;
    s->state = SLOT_FREE;
    e->n_active--;
    pthread_mutex_lock(&e->mu);
    cache_get_stats(e->cache, &e->stats);
    s->sub->done = 1;
    pthread_cond_broadcast(&e->done_cv);
    pthread_mutex_unlock(&e->mu);
}

/* One piece of s's prompt (at most `chunk` tokens; 0: the rest); when the prompt is in, its
 * first token. */
static void prefill_some(struct engine *e, struct slot *s, int chunk) {
    use(e, s);
    if (cancelled(s->r)) { /* between pieces of the prompt */
        cache_feed_abort(e->cache);
        s->finish = ENGINE_FINISH_CANCELLED;
        slot_finish(e, s);
        return;
    }
    struct error err = {{0}};
    const int rc = cache_feed_some(e->cache, chunk, &err);
    if (rc < 0) { /* validated before: a failure here is the backend's */
        fprintf(stderr, "strata: prefill failed: %s\n", err.msg);
        s->finish = ENGINE_FINISH_CANCELLED;
        slot_finish(e, s);
        return;
    }
    if (rc > 0) return;
    s->t_fed = now_ms();
    sampling_begin(e, s);
    s->state = SLOT_DECODE;
    s->at = AT_CUR;
    if (token_cur(e, s, 0)) slot_finish(e, s); /* its first token, now: TTFT */
}

/* ---- the scheduler ------------------------------------------------------------------------- */

static void admit(struct engine *e) {
    for (;;) {
        pthread_mutex_lock(&e->mu);
        struct submission *sub = e->n_active < e->max_active ? e->q_head : NULL;
        if (sub) {
            e->q_head = sub->next;
            if (!e->q_head) e->q_tail = NULL;
            atomic_fetch_sub(&e->queued, 1);
        }
        pthread_mutex_unlock(&e->mu);
        if (!sub) return;
        slot_start(e, sub);
    }
}

/* The pending tokens of ps[0..B) were fed (a batched step, or riding a prefill): row b's
 * logits are ps[b]'s. */
static void rows_stepped(struct engine *e, struct slot **ps, const int32_t *toks, int B) {
    for (int b = 0; b < B; b++) {
        cache_push_to(e->cache, ps[b]->cslot, toks[b]);
        ps[b]->at = AT_ROW;
        ps[b]->row = b;
    }
}

/* One round: every slot with logits chooses and emits its token; queued requests start; one
 * piece of the oldest prompt is fed, the pending tokens of the others riding its pass over the
 * weights (a mixed step); else one step feeds every pending token (a batched step, or with a
 * single request and nothing else to do, that request alone with run-ahead until another
 * arrives). Returns 1 when the round queued a batched step (run ahead, or at its end) and fed
 * no prompt piece. */
static int round_body(struct engine *e) {
    struct slot *rs[MODEL_MAX_BATCH];
    int n = 0;
    for (int i = 0; i < MODEL_MAX_BATCH; i++) {
        struct slot *s = &e->slots[i];
        if (s->state != SLOT_DECODE) continue;
        if (s->at == AT_ROW) rs[n++] = s;
        else if (s->at == AT_CUR) {
            use(e, s);
            if (token_cur(e, s, 0)) slot_finish(e, s);
        }
    }
    const int ahead = n ? tokens_rows(e, rs, n) : 0;
    /* a request admitted now could start a step of its own (its first token pending) over the
     * rows of the one queued ahead: after running ahead it waits for the next round, which then
     * does not run ahead (queued) */
    if (!ahead) admit(e);
    struct slot *pf = NULL;
    struct model_seq *seqs[MODEL_MAX_BATCH];
    int32_t toks[MODEL_MAX_BATCH];
    struct slot *ps[MODEL_MAX_BATCH];
    int n_dec = 0, B = 0;
    for (int i = 0; i < MODEL_MAX_BATCH; i++) {
        struct slot *s = &e->slots[i];
        if (s->state == SLOT_PREFILL && (!pf || s->order < pf->order)) pf = s;
        if (s->state == SLOT_DECODE) n_dec++;
        if (s->state == SLOT_DECODE && s->at == AT_PENDING) ps[B++] = s;
    }
    if (pf) {
        /* the pending tokens ride along the piece's pass over the weights (a mixed step); a
         * slot whose first token the piece gives waits for the next round's step */
        for (int b = 0; b < B; b++) seqs[b] = ps[b]->seq, toks[b] = ps[b]->pend;
        model_rows_ride(e->m, seqs, toks, B);
        prefill_some(e, pf, n_dec ? e->prefill_chunk : 0);
        if (model_rows_rode(e->m) == B && B > 0) {
            rows_stepped(e, ps, toks, B);
            return 0;
        }
    }
    int n_pf = 0;
    B = 0;
    for (int i = 0; i < MODEL_MAX_BATCH; i++) {
        struct slot *s = &e->slots[i];
        if (s->state == SLOT_PREFILL) n_pf++;
        if (s->state == SLOT_DECODE && s->at == AT_PENDING) ps[B++] = s;
    }
    if (B == 1 && n_pf == 0 && e->n_active == 1) {
        /* alone: the single-sequence step and its graph, running ahead, token by token until
         * the request ends or another is queued */
        struct slot *s = ps[0];
        use(e, s);
        if (feed(e, s, s->pend) != 0) {
            s->finish = ENGINE_FINISH_LENGTH;
            slot_finish(e, s);
            return 0;
        }
        s->at = AT_CUR;
        while (!(atomic_load(&e->queued) && e->n_active < e->max_active))
            if (token_cur(e, s, 1)) {
                slot_finish(e, s);
                return 0;
            }
        return 0;
    }
    if (B == 0) return ahead && !pf;
    for (int b = 0; b < B; b++) seqs[b] = ps[b]->seq, toks[b] = ps[b]->pend;
    CHECK(model_step_rows(e->m, seqs, toks, B) == 0); /* is_last kept every position in range */
    rows_stepped(e, ps, toks, B);
    return !pf; /* a plain batched round: no prompt piece ran in it */
}

/* One round (round_body), its time counted when it was a plain batched round that chose rows */
static void engine_round(struct engine *e) {
    const double t0 = now_ms();
    e->round_wait_ms = 0;
    e->round_rows = e->round_ahead = 0;
    if (round_body(e) && e->round_rows) {
        const double dt = now_ms() - t0;
        pthread_mutex_lock(&e->mu);
        e->rstats.rounds++;
        e->rstats.ahead += (unsigned long)e->round_ahead;
        e->rstats.rows += (unsigned long)e->round_rows;
        e->rstats.round_ms += dt;
        e->rstats.wait_ms += e->round_wait_ms;
        pthread_mutex_unlock(&e->mu);
    }
}

/* Queues sub (e->mu not held). */
static void submit(struct engine *e, struct submission *sub) {
    pthread_mutex_lock(&e->mu);
    sub->done = 0;
    sub->next = NULL;
    if (e->q_tail) e->q_tail->next = sub;
    else e->q_head = sub;
    e->q_tail = sub;
    atomic_fetch_add(&e->queued, 1);
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
}

int engine_generate_many(struct engine *e, const struct engine_request *r, struct engine_result *res,
                         struct error *err, int n) {
    struct submission sub[MODEL_MAX_BATCH];
    CHECK(n >= 1 && n <= MODEL_MAX_BATCH);
    int ok = 0;
    for (int i = 0; i < n; i++) {
        sub[i].done = 1;
        if (validate(e, &r[i], &err[i]) != 0) continue;
        err[i].msg[0] = 0;
        sub[i].r = &r[i];
        sub[i].res = &res[i];
        submit(e, &sub[i]);
        ok++;
    }
    pthread_mutex_lock(&e->mu);
    const int serving = e->serving;
    pthread_mutex_unlock(&e->mu);
    if (serving) { /* engine_run steps them: wait */
        pthread_mutex_lock(&e->mu);
        for (int i = 0; i < n; i++)
            while (!sub[i].done) pthread_cond_wait(&e->done_cv, &e->mu);
        pthread_mutex_unlock(&e->mu);
    } else {
        for (;;) {
            int left = 0;
            for (int i = 0; i < n; i++) left += !sub[i].done;
            if (!left) break;
            engine_round(e);
        }
    }
    return ok;
}

int engine_generate(struct engine *e, const struct engine_request *r, struct engine_result *res,
                    struct error *err) {
    if (engine_generate_many(e, r, res, err, 1) == 1) return 0;
    memset(res, 0, sizeof *res); /* not started: err says why */
    return -1;
}

void engine_serve(struct engine *e) {
    pthread_mutex_lock(&e->mu);
    e->serving = 1;
    pthread_mutex_unlock(&e->mu);
}

void engine_run(struct engine *e, const atomic_int *stop) {
    engine_serve(e);
    for (;;) {
        pthread_mutex_lock(&e->mu);
        while (e->n_active == 0 && !e->q_head && !atomic_load(stop)) pthread_cond_wait(&e->cv, &e->mu);
        const int quit = e->n_active == 0 && !e->q_head && atomic_load(stop);
        pthread_mutex_unlock(&e->mu);
        if (quit) break;
        engine_round(e);
    }
    pthread_mutex_lock(&e->mu);
    e->serving = 0;
    pthread_mutex_unlock(&e->mu);
}

void engine_wake(struct engine *e) {
    pthread_mutex_lock(&e->mu);
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
}
