/* test_engine.c - the engine's stop conditions and streaming text on the bundled demo model
 * (STRATA_DEMO_MODEL overrides), CPU backend, greedy unless stated:
 *   - engine_stop_scan on hand-made cases (exact);
 *   - the engine's greedy ids equal a hand-written prefill + argmax + step loop (exact: the same
 *     model calls in the same order, so any difference is an engine bug);
 *   - max_tokens, context full -> "length" with the exact token count, prompt too long -> error;
 *   - a stop string chosen to straddle a token boundary of the unconstrained output: the output
 *     ends exactly before it, it is never emitted, finish "stop" (exact string comparison);
 *   - cancellation from the callback (and what the state holds after it); same seed -> same
 *     ids, another seed -> other ids;
 *   - all of the above with the engine running ahead (engine_set_run_ahead) and without. */
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "harness.h"
#include "model/model.h"
#include "text/tokenizer.h"

struct capture {
    int32_t ids[512];
    int n;
    char text[8192];
    size_t len;
    int cancel_at; /* return 1 at this token count (0: never) */
    size_t piece_end[512]; /* text length after token i */
};

static int cap_emit(void *user, const struct engine_event *ev) {
    struct capture *c = user;
    if (c->len + ev->len < sizeof c->text) {
        memcpy(c->text + c->len, ev->text, ev->len);
        c->len += ev->len;
        c->text[c->len] = 0;
    }
    if (ev->id >= 0 && c->n < 512) {
        c->piece_end[c->n] = c->len;
        c->ids[c->n++] = ev->id;
    }
    return c->cancel_at && ev->n_generated >= c->cancel_at;
}

static void base_request(struct engine_request *r, const int32_t *ids, int n, struct capture *c) {
    memset(r, 0, sizeof *r);
    r->prompt = ids;
    r->n_prompt = n;
    sampler_params_default(&r->sampling);
    r->sampling.temperature = 0;
    r->ignore_eos = 1; /* a random demo model may hit EOS anywhere; counts must be exact */
    r->emit = cap_emit;
    r->user = c;
    memset(c, 0, sizeof *c);
}

static int utf8_start(unsigned char b) { return (b & 0xc0) != 0x80; }

/* Everything below on a fresh model, with the engine running ahead (each token's feeding step
 * queued before its text is handled, as on a device backend) or not: the same ids, text and
 * finish reasons either way. */
static void engine_checks(const char *dir, struct tokenizer *tok, int ahead) {
    struct error err;
    printf("engine checks, run ahead %s\n", ahead ? "on" : "off");
    struct model_options mo = {.backend = BACKEND_CPU, .quiet = 1, .ctx = 256, .n_threads = 1};
    struct model *m = tok ? model_load(dir, &mo, &err) : NULL;
    EXPECT(m != NULL, "demo model %s: %s", dir, m ? "" : err.msg);
    if (!m) return;
    struct engine *e = engine_create(m, tok);
    engine_set_run_ahead(e, ahead);

    int32_t *prompt;
    int n_prompt;
    const char *ptext = "<|im_start|>user\nTell me a story about a dog.<|im_end|>\n"
                        "<|im_start|>assistant\n";
    CHECK(tokenizer_encode(tok, ptext, strlen(ptext), &prompt, &n_prompt, &err) == 0);

    struct engine_request r;
    struct engine_result res;
    static struct capture c, c2;

    /* greedy ids == the plain model loop */
    base_request(&r, prompt, n_prompt, &c);
    r.max_tokens = 40;
    EXPECT(engine_generate(e, &r, &res, &err) == 0, "generate: %s", err.msg);
    EXPECT(res.finish == ENGINE_FINISH_LENGTH && res.n_generated == 40 && c.n == 40,
           "max_tokens 40: finish %s, %d generated, %d emitted", engine_finish_name(res.finish),
           res.n_generated, c.n);
    EXPECT(res.timings.prompt_n == n_prompt && res.timings.predicted_n == 40 &&
               res.timings.prompt_ms > 0 && res.timings.predicted_ms > 0,
           "timings filled");
    {
        model_reset(m);
        CHECK(model_prefill(m, prompt, n_prompt, NULL, &err) == 0);
        int same = 1;
        for (int i = 0; i < 40; i++) {
            int32_t id = model_argmax(m);
            if (id != c.ids[i]) same = 0;
            if (i < 39) CHECK(model_step(m, id) == 0);
        }
        EXPECT(same, "engine greedy ids differ from prefill + argmax + step");
        char *dec = tokenizer_decode(tok, c.ids, 40, NULL);
        (void)dec;
        free(dec);
    }
    const size_t full_len = c.len;
    char full[8192];
    memcpy(full, c.text, c.len + 1);
    size_t piece_end[512];
    memcpy(piece_end, c.piece_end, sizeof piece_end);

    /* stop string straddling a token boundary: from the middle of one token's text into the
     * next, cut at UTF-8 character starts */
    {
        int k = -1;
        size_t a = 0, b = 0;
        for (int i = 5; i < 38 && k < 0; i++) {
            size_t s0 = piece_end[i - 1], s1 = piece_end[i], s2 = piece_end[i + 1];
            if (s1 - s0 < 2 || s2 - s1 < 1) continue;
            a = s0 + 1;
            while (a < s1 && !utf8_start((unsigned char)full[a])) a++;
            b = s1 + 1;
            while (b < s2 && !utf8_start((unsigned char)full[b])) b++;
            if (a < s1) k = i;
        }
        EXPECT(k >= 0, "found no token boundary to straddle");
        if (k >= 0) {
            char stop[256];
            size_t sl = b - a < sizeof stop - 1 ? b - a : sizeof stop - 1;
            memcpy(stop, full + a, sl);
            stop[sl] = 0;
            const char *first = strstr(full, stop);
            size_t expect_len = (size_t)(first - full);
            base_request(&r, prompt, n_prompt, &c2);
            r.max_tokens = 40;
            r.stop[0] = stop;
            r.n_stop = 1;
            EXPECT(engine_generate(e, &r, &res, &err) == 0, "generate with stop");
            EXPECT(res.finish == ENGINE_FINISH_STOP && res.stop_index == 0,
                   "stop string: finish %s, index %d", engine_finish_name(res.finish),
                   res.stop_index);
            EXPECT(c2.len == expect_len && memcmp(c2.text, full, expect_len) == 0,
                   "text before the stop string: got %zu bytes, want %zu", c2.len, expect_len);
            EXPECT(strstr(c2.text, stop) == NULL, "the stop string was emitted");
        }
    }

    /* context full: ctx positions hold the prompt and ctx - n_prompt fed tokens */
    {
        struct model_options small = mo;
        small.ctx = n_prompt + 3;
        struct model *m2 = model_load(dir, &small, &err);
        CHECK(m2);
        struct engine *e2 = engine_create(m2, tok);
        engine_set_run_ahead(e2, ahead);
        base_request(&r, prompt, n_prompt, &c2);
        EXPECT(engine_generate(e2, &r, &res, &err) == 0, "generate to the context end");
        EXPECT(res.finish == ENGINE_FINISH_LENGTH && res.n_generated == 4,
               "context full: finish %s after %d tokens, want length after 4",
               engine_finish_name(res.finish), res.n_generated);
        EXPECT(memcmp(c2.ids, c.ids, 4 * sizeof *c.ids) == 0, "same first tokens");
        small.ctx = n_prompt;
        engine_free(e2);
        model_free(m2);
        m2 = model_load(dir, &small, &err);
        e2 = engine_create(m2, tok);
        engine_set_run_ahead(e2, ahead);
        base_request(&r, prompt, n_prompt, &c2);
        EXPECT(engine_generate(e2, &r, &res, &err) == -1 && strstr(err.msg, "does not fit"),
               "a prompt filling the context is refused (%s)", err.msg);
        engine_free(e2);
        model_free(m2);
    }

    /* cancellation at the 3rd token */
    base_request(&r, prompt, n_prompt, &c2);
    c2.cancel_at = 3;
    EXPECT(engine_generate(e, &r, &res, &err) == 0 && res.finish == ENGINE_FINISH_CANCELLED &&
               res.n_generated == 3,
           "cancel: finish %s after %d", engine_finish_name(res.finish), res.n_generated);
    {
        /* the state holds what was fed: run ahead, the 3rd token too; a prompt extending exactly
         * that is reused, and gives what a full prefill gives */
        const int held = model_pos(m) - n_prompt;
        EXPECT(held == (ahead ? 3 : 2), "cancelled at the 3rd token: the state holds %d of them, want %d",
               held, ahead ? 3 : 2);
        int32_t *tail;
        int n_tail;
        const char *more = "<|im_end|>\n<|im_start|>user\nAgain.<|im_end|>\n";
        CHECK(tokenizer_encode(tok, more, strlen(more), &tail, &n_tail, &err) == 0);
        const int n3 = n_prompt + held + n_tail;
        int32_t *p3 = malloc((size_t)n3 * sizeof *p3), kept[3];
        memcpy(kept, c2.ids, sizeof kept);
        memcpy(p3, prompt, (size_t)n_prompt * sizeof *p3);
        memcpy(p3 + n_prompt, kept, (size_t)held * sizeof *p3);
        memcpy(p3 + n_prompt + held, tail, (size_t)n_tail * sizeof *p3);
        int32_t got[8];
        base_request(&r, p3, n3, &c2);
        r.max_tokens = 8;
        CHECK(engine_generate(e, &r, &res, &err) == 0);
        EXPECT(res.timings.cache_n == n_prompt + held, "after a cancel: cache_n %d, want %d",
               res.timings.cache_n, n_prompt + held);
        memcpy(got, c2.ids, sizeof got);
        engine_set_prefix_reuse(e, 0);
        base_request(&r, p3, n3, &c2);
        r.max_tokens = 8;
        CHECK(engine_generate(e, &r, &res, &err) == 0);
        engine_set_prefix_reuse(e, 1);
        EXPECT(memcmp(got, c2.ids, sizeof got) == 0, "after a cancel: reuse differs from a full prefill");
        free(p3);
        free(tail);
    }
    atomic_int flag = 1;
    base_request(&r, prompt, n_prompt, &c2);
    r.cancel = &flag;
    EXPECT(engine_generate(e, &r, &res, &err) == 0 && res.finish == ENGINE_FINISH_CANCELLED &&
               res.n_generated == 0,
           "a request cancelled before it starts generates nothing");


    /* prefix reuse: a prompt extending (prompt + generated) prefills only its tail, and gives
     * exactly what a reset engine gives (CPU: prefill and steps are the same arithmetic) */
    {
        base_request(&r, prompt, n_prompt, &c2);
        r.max_tokens = 10;
        CHECK(engine_generate(e, &r, &res, &err) == 0);
        int32_t *tail;
        int n_tail;
        const char *more = "<|im_end|>\n<|im_start|>user\nMore.<|im_end|>\n";
        CHECK(tokenizer_encode(tok, more, strlen(more), &tail, &n_tail, &err) == 0);
        int n2 = n_prompt + 9 + n_tail;
        int32_t *p2 = malloc((size_t)n2 * sizeof *p2);
        memcpy(p2, prompt, (size_t)n_prompt * sizeof *p2);
        memcpy(p2 + n_prompt, c2.ids, 9 * sizeof *p2);
        memcpy(p2 + n_prompt + 9, tail, (size_t)n_tail * sizeof *p2);
        base_request(&r, p2, n2, &c2);
        r.max_tokens = 12;
        CHECK(engine_generate(e, &r, &res, &err) == 0);
        EXPECT(res.timings.cache_n == n_prompt + 9 && res.timings.prompt_n == n_tail,
               "prefix reuse: cache_n %d (want %d), prompt_n %d (want %d)", res.timings.cache_n,
               n_prompt + 9, res.timings.prompt_n, n_tail);
        int32_t reused[12];
        memcpy(reused, c2.ids, sizeof reused);
        engine_set_prefix_reuse(e, 0);
        base_request(&r, p2, n2, &c2);
        r.max_tokens = 12;
        CHECK(engine_generate(e, &r, &res, &err) == 0);
        EXPECT(res.timings.cache_n == 0 && res.timings.prompt_n == n2, "reuse off: full prefill");
        EXPECT(memcmp(reused, c2.ids, sizeof reused) == 0,
               "output after prefix reuse differs from a full prefill");
        engine_set_prefix_reuse(e, 1);
        /* the same prompt again resumes at the end-of-prompt checkpoint (with its logits):
         * nothing to prefill, the same tokens */
        base_request(&r, p2, n2, &c2);
        r.max_tokens = 12;
        CHECK(engine_generate(e, &r, &res, &err) == 0);
        EXPECT(res.timings.cache_n == n2 && res.timings.prompt_n == 0 &&
                   memcmp(reused, c2.ids, sizeof reused) == 0,
               "a repeated prompt: cache_n %d (want %d), same tokens %d", res.timings.cache_n, n2,
               memcmp(reused, c2.ids, sizeof reused) == 0);
        free(p2);
        free(tail);
    }

    /* seeds through the engine */
    {
        int32_t a[24], b2[24], d[24];
        uint64_t seeds[3] = {5, 5, 6};
        int32_t *outs[3] = {a, b2, d};
        for (int k = 0; k < 3; k++) {
            base_request(&r, prompt, n_prompt, &c2);
            r.sampling.temperature = 1.0f;
            r.sampling.seed = seeds[k];
            r.max_tokens = 24;
            CHECK(engine_generate(e, &r, &res, &err) == 0);
            memcpy(outs[k], c2.ids, sizeof a);
        }
        EXPECT(memcmp(a, b2, sizeof a) == 0, "same seed, same ids");
        EXPECT(memcmp(a, d, sizeof a) != 0, "another seed, other ids");
    }
    (void)full_len;

    free(prompt);
    engine_free(e);
    model_free(m);
}

/* Continuous batching: requests run together (engine_generate_many, batched steps, prompts fed
 * in pieces between them) give exactly the tokens and text each gives alone, on the CPU (its
 * matmul sums every row alike in any batch): greedy and sampled, penalties, a stop string, a
 * request cancelled partway, prompts that share a prefix (the cache forks from a sequence
 * another request is using), one longer than a prefill piece, more requests than may run at
 * once (the rest queued); the decoding rows ride the prompts' pieces (mixed steps). */
/* The demo model on the CPU backend at context ctx, and an engine over it running ahead or not,
 * its cache allocated, `parallel` requests at once (NULL if the model does not load). */
static struct engine *batch_engine(const char *dir, struct tokenizer *tok, int ctx, int ahead, int parallel,
                                   struct model **m) {
    struct error err;
    struct model_options mo = {.backend = BACKEND_CPU, .quiet = 1, .ctx = ctx, .n_threads = 1};
    *m = model_load(dir, &mo, &err);
    EXPECT(*m != NULL, "demo model: %s", *m ? "" : err.msg);
    if (!*m) return NULL;
    struct engine *e = engine_create(*m, tok);
    engine_set_run_ahead(e, ahead);
    engine_set_cache(e, 0);
    engine_set_parallel(e, parallel);
    return e;
}

#define N_BATCH 9
static void batch_checks(const char *dir, struct tokenizer *tok, int ahead) {
    struct error err;
    struct model *m;
    struct engine *e = batch_engine(dir, tok, 1024, ahead, 6, &m);
    if (!e) return;
    EXPECT(engine_parallel(e) == 6, "parallel 6: %d", engine_parallel(e));
    static const char *texts[N_BATCH] = {
        "<|im_start|>user\nTell me a story about a dog.<|im_end|>\n<|im_start|>assistant\n",
        "<|im_start|>user\nTell me a story about a cat.<|im_end|>\n<|im_start|>assistant\n",
        "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
        "Once upon a time",
        "<|im_start|>user\nTell me a story about a dog.<|im_end|>\n<|im_start|>assistant\n",
        "The quick brown fox jumps over the lazy dog. ",
        "<|im_start|>user\nList three colours.<|im_end|>\n<|im_start|>assistant\n",
        "1, 2, 3, 4,",
        "<|im_start|>user\nTell me a story about a dog.<|im_end|>\n<|im_start|>assistant\nOnce",
    };
    int32_t *ids[N_BATCH];
    int n_ids[N_BATCH];
    for (int i = 0; i < N_BATCH; i++) CHECK(tokenizer_encode(tok, texts[i], strlen(texts[i]), &ids[i], &n_ids[i], &err) == 0);
    /* prompt 5: long enough for several prefill pieces (the CPU's are 256 tokens) */
    {
        int n = 0;
        int32_t *longp = xmalloc(700 * sizeof *longp);
        while (n < 700) {
            int k = n_ids[5] < 700 - n ? n_ids[5] : 700 - n;
            memcpy(longp + n, ids[5], (size_t)k * sizeof *longp);
            n += k;
        }
        free(ids[5]);
        ids[5] = longp, n_ids[5] = 700;
    }
    static struct capture solo[N_BATCH], many[N_BATCH];
    struct engine_request rq[N_BATCH];
    struct engine_result res[N_BATCH], res1;
    struct error errs[N_BATCH];
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < N_BATCH; i++) {
            struct capture *c = pass ? &many[i] : &solo[i];
            base_request(&rq[i], ids[i], n_ids[i], c);
            rq[i].max_tokens = 20 + 7 * i;
            if (i % 3 == 1) { /* Qwen's sampling, with penalties */
                rq[i].sampling.temperature = 0.7f, rq[i].sampling.top_k = 20, rq[i].sampling.top_p = 0.8f;
                rq[i].sampling.presence_penalty = 1.5f, rq[i].sampling.seed = 100 + i;
            } else if (i % 3 == 2) { /* the host sampler's (top_p over the whole vocabulary) */
                rq[i].sampling.temperature = 1.0f, rq[i].sampling.top_p = 0.9f, rq[i].sampling.seed = 7;
            }
            if (i == 3) rq[i].stop[rq[i].n_stop++] = "e";
            if (i == 6) c->cancel_at = 9;
        }
        if (pass == 0) {
            for (int i = 0; i < N_BATCH; i++) {
                engine_set_prefix_reuse(e, 0); /* each alone from a fresh state */
                CHECK(engine_generate(e, &rq[i], &res[i], &err) == 0);
                engine_set_prefix_reuse(e, 1);
            }
        } else {
            const long mixed0 = model_n_mixed(m);
            EXPECT(engine_generate_many(e, rq, res, errs, N_BATCH) == N_BATCH, "all started");
            /* prompts admitted while others decode: their pieces carried the others' rows */
            EXPECT(model_n_mixed(m) > mixed0, "batched: no prefill piece carried decode rows");
        }
        if (pass == 0) memcpy(&res1, &res[3], sizeof res1);
    }
    for (int i = 0; i < N_BATCH; i++) {
        EXPECT(solo[i].n == many[i].n && memcmp(solo[i].ids, many[i].ids, (size_t)solo[i].n * 4) == 0 &&
                   solo[i].len == many[i].len && memcmp(solo[i].text, many[i].text, solo[i].len) == 0,
               "request %d: %d tokens alone, %d batched, %s", i, solo[i].n, many[i].n,
               solo[i].n == many[i].n ? "different tokens or text" : "different counts");
    }
    EXPECT(res[3].finish == ENGINE_FINISH_STOP && res[3].stop_index == 0, "batched: the stop string ends request 3");
    EXPECT(res[6].finish == ENGINE_FINISH_CANCELLED && many[6].n == 9, "batched: request 6 cancelled at 9 (%d)", many[6].n);
    EXPECT(res[2].n_generated == rq[2].max_tokens && res[2].finish == ENGINE_FINISH_LENGTH, "batched: max_tokens");
    /* a repeat of the whole batch: every prompt now hits the cache (two of them share a prefix
     * with others), the same tokens again */
    for (int i = 0; i < N_BATCH; i++) {
        base_request(&rq[i], ids[i], n_ids[i], &many[i]);
        rq[i].max_tokens = 12;
    }
    EXPECT(engine_generate_many(e, rq, res, errs, N_BATCH) == N_BATCH, "repeat started");
    int hits = 0;
    for (int i = 0; i < N_BATCH; i++) hits += res[i].timings.cache_n > 0;
    EXPECT(hits == N_BATCH, "repeat: %d of %d prompts resumed from the cache", hits, N_BATCH);
    for (int i = 0; i < N_BATCH; i++)
        EXPECT((many[i].n == 12 && memcmp(many[i].ids, solo[i].ids, 12 * 4) == 0) ||
                   i % 3 != 0 || i == 3 || i == 6,
               "repeat %d: greedy tokens after a cache hit differ", i);
    /* every row's token the device's choice or a forced one (greedy, sampled on the device with
     * penalties, teacher-forced, a stop string, a cancellation): running ahead, the rounds queue
     * the next batched step before handling their tokens, with the same tokens and text as each
     * request alone */
    {
        enum { N_AHEAD = 6 };
        static struct capture alone[N_AHEAD], together[N_AHEAD];
        static const int32_t forced[10] = {11, 220, 1000, 42, 7, 7, 7, 300, 5000, 12};
        struct engine_request aq[N_AHEAD];
        struct engine_result ares[N_AHEAD];
        struct engine_round_stats st0, st1;
        for (int pass = 0; pass < 2; pass++) {
            for (int i = 0; i < N_AHEAD; i++) {
                struct capture *c = pass ? &together[i] : &alone[i];
                base_request(&aq[i], ids[i], n_ids[i], c);
                aq[i].max_tokens = 24 + 6 * i;
                if (i == 1 || i == 4) { /* Qwen's sampling on the device, with penalties */
                    aq[i].sampling.temperature = 0.7f, aq[i].sampling.top_k = 20, aq[i].sampling.top_p = 0.8f;
                    aq[i].sampling.presence_penalty = 1.5f, aq[i].sampling.seed = 300 + i;
                }
                if (i == 2) aq[i].stop[aq[i].n_stop++] = "e";
                if (i == 3) aq[i].forced = forced, aq[i].n_forced = 10;
                if (i == 4) c->cancel_at = 9;
            }
            engine_round_stats(e, &st0);
            if (pass == 0) {
                for (int i = 0; i < N_AHEAD; i++) {
                    engine_set_prefix_reuse(e, 0);
                    CHECK(engine_generate(e, &aq[i], &ares[i], &err) == 0);
                    engine_set_prefix_reuse(e, 1);
                }
            } else {
                engine_set_prefix_reuse(e, 0);
                EXPECT(engine_generate_many(e, aq, ares, errs, N_AHEAD) == N_AHEAD, "device choices: all started");
                engine_set_prefix_reuse(e, 1);
            }
            engine_round_stats(e, &st1);
        }
        printf("device choices, run ahead %s: %lu of %lu batched rounds ran ahead\n", ahead ? "on" : "off",
               st1.ahead - st0.ahead, st1.rounds - st0.rounds);
        EXPECT(ahead ? st1.ahead > st0.ahead + 10 : st1.ahead == st0.ahead,
               "device choices, run ahead %s: %lu of %lu batched rounds ran ahead", ahead ? "on" : "off",
               st1.ahead - st0.ahead, st1.rounds - st0.rounds);
        for (int i = 0; i < N_AHEAD; i++)
            EXPECT(alone[i].n == together[i].n && memcmp(alone[i].ids, together[i].ids, (size_t)alone[i].n * 4) == 0 &&
                       alone[i].len == together[i].len && memcmp(alone[i].text, together[i].text, alone[i].len) == 0,
                   "device choices, request %d: %d tokens alone, %d batched, %s", i, alone[i].n, together[i].n,
                   alone[i].n == together[i].n ? "different tokens or text" : "different counts");
        EXPECT(ares[2].finish == ENGINE_FINISH_STOP && ares[4].finish == ENGINE_FINISH_CANCELLED &&
                   together[4].n == 9 && ares[5].finish == ENGINE_FINISH_LENGTH && together[5].n == aq[5].max_tokens &&
                   memcmp(together[3].ids, forced, sizeof forced) == 0,
               "device choices: stop %d, cancelled at %d, length %d (%d tokens), forced ids", (int)ares[2].finish,
               together[4].n, (int)ares[5].finish, together[5].n);
    }
    /* a prompt that does not fit is refused alone; the others run */
    {
        int32_t *big = xcalloc(2000, sizeof *big);
        base_request(&rq[1], big, 2000, &many[1]);
        EXPECT(engine_generate_many(e, rq, res, errs, 3) == 2 && strstr(errs[1].msg, "does not fit"),
               "one refused: %s", errs[1].msg);
        free(big);
    }
    (void)res1;
    for (int i = 0; i < N_BATCH; i++) free(ids[i]);
    engine_free(e);
    model_free(m);
}

/* Batched rounds at their edges, each request's tokens against the same request alone: with
 * room for 2, three requests, one cancelled at its 5th token so the third is admitted while the
 * others decode (run ahead: never over the rows of a step queued ahead); two prompts running
 * into the end of a 256-token context (the last position's token too); a prompt that extends
 * a cancelled request's prompt and tokens, resumed from that sequence's state (which, run
 * ahead, took the cancelled request's last token too) against a fresh state. */
static void batch_edge_checks(const char *dir, struct tokenizer *tok, int ahead) {
    static const char *texts[3] = {
        "<|im_start|>user\nTell me a story about a dog.<|im_end|>\n<|im_start|>assistant\n",
        "<|im_start|>user\nTell me a story about a cat.<|im_end|>\n<|im_start|>assistant\n",
        "Once upon a time",
    };
    struct error err;
    int32_t *ids[3];
    int n_ids[3];
    for (int i = 0; i < 3; i++) CHECK(tokenizer_encode(tok, texts[i], strlen(texts[i]), &ids[i], &n_ids[i], &err) == 0);
    for (int scen = 0; scen < 4; scen++) {
        const int ctx = scen == 2 ? 256 : 1024;
        struct model *m;
        struct engine *e = batch_engine(dir, tok, ctx, ahead, 2, &m);
        if (!e) return;
        static struct capture alone[3], together[3];
        const int32_t *prompt[3] = {ids[0], ids[1], ids[2]};
        int n_prompt[3] = {n_ids[0], n_ids[1], n_ids[2]}, max_tokens[3] = {30, 30, 10}, cancel[3] = {0, 0, 0};
        int32_t *longp[2] = {NULL, NULL};
        int N = 3;
        if (scen == 0 || scen == 3) cancel[0] = 5;
        if (scen == 1) cancel[1] = 5;
        if (scen == 2) { /* to the end of the context: no max_tokens */
            for (int i = 0; i < 2; i++) {
                longp[i] = xmalloc(240 * sizeof *longp[i]);
                for (int k = 0; k < 240; k++) longp[i][k] = ids[i][k % n_ids[i]];
                prompt[i] = longp[i], n_prompt[i] = 240 - i, max_tokens[i] = 0;
            }
            N = 2;
        }
        if (scen == 3) N = 2;
        struct engine_request rq[3];
        struct engine_result res[3];
        struct error errs[3];
        for (int pass = 0; pass < 2; pass++) {
            for (int i = 0; i < N; i++) {
                struct capture *c = pass ? &together[i] : &alone[i];
                base_request(&rq[i], prompt[i], n_prompt[i], c);
                rq[i].max_tokens = max_tokens[i];
                c->cancel_at = cancel[i];
            }
            engine_set_prefix_reuse(e, 0); /* each from a fresh state */
            if (pass == 0) {
                for (int i = 0; i < N; i++) CHECK(engine_generate(e, &rq[i], &res[i], &err) == 0);
            } else {
                EXPECT(engine_generate_many(e, rq, res, errs, N) == N, "edge %d: all started", scen);
            }
            engine_set_prefix_reuse(e, 1);
        }
        for (int i = 0; i < N; i++)
            EXPECT(alone[i].n == together[i].n && memcmp(alone[i].ids, together[i].ids, (size_t)alone[i].n * 4) == 0,
                   "edge %d, run ahead %s, request %d: %d tokens alone, %d together%s", scen, ahead ? "on" : "off", i,
                   alone[i].n, together[i].n, alone[i].n == together[i].n ? ", different ids" : "");
        if (scen == 2)
            EXPECT(together[0].n == ctx - 240 + 1 && together[1].n == ctx - 239 + 1,
                   "edge 2: to the context's end, %d and %d tokens", together[0].n, together[1].n);
        if (scen == 3) { /* request 0's prompt + its 5 tokens + more: resumed against fresh */
            int32_t *pc = xmalloc((size_t)(n_ids[0] + together[0].n + n_ids[2]) * sizeof *pc);
            int nc = 0;
            memcpy(pc, ids[0], (size_t)n_ids[0] * 4), nc += n_ids[0];
            memcpy(pc + nc, together[0].ids, (size_t)together[0].n * 4), nc += together[0].n;
            memcpy(pc + nc, ids[2], (size_t)n_ids[2] * 4), nc += n_ids[2];
            static struct capture resumed, fresh;
            struct engine_request r1;
            struct engine_result rr;
            base_request(&r1, pc, nc, &resumed);
            r1.max_tokens = 20;
            CHECK(engine_generate(e, &r1, &rr, &err) == 0);
            EXPECT(rr.timings.cache_n >= n_ids[0] + 4, "edge 3: resumed %d of %d tokens", rr.timings.cache_n, nc);
            base_request(&r1, pc, nc, &fresh);
            r1.max_tokens = 20;
            engine_set_prefix_reuse(e, 0);
            CHECK(engine_generate(e, &r1, &rr, &err) == 0);
            EXPECT(resumed.n == fresh.n && memcmp(resumed.ids, fresh.ids, (size_t)fresh.n * 4) == 0,
                   "edge 3: resumed after a cancelled request differs from fresh");
            free(pc);
        }
        free(longp[0]), free(longp[1]);
        engine_free(e);
        model_free(m);
    }
    for (int i = 0; i < 3; i++) free(ids[i]);
}

int main(void) {
    /* stop scan: exact cases */
    {
        const char *stops[2] = {"END", "<|x|>"};
        int hit;
        EXPECT(engine_stop_scan("hello", 5, stops, 2, &hit) == 5 && hit == -1, "no stop");
        EXPECT(engine_stop_scan("helloE", 6, stops, 2, &hit) == 5 && hit == -1, "hold 'E'");
        EXPECT(engine_stop_scan("helloEN", 7, stops, 2, &hit) == 5 && hit == -1, "hold 'EN'");
        EXPECT(engine_stop_scan("helloENX", 8, stops, 2, &hit) == 8 && hit == -1, "release ENX");
        EXPECT(engine_stop_scan("a<|x", 4, stops, 2, &hit) == 1 && hit == -1, "hold '<|x'");
        EXPECT(engine_stop_scan("aEND<|x|>", 9, stops, 2, &hit) == 1 && hit == 0, "first END");
        EXPECT(engine_stop_scan("a<|x|>END", 9, stops, 2, &hit) == 1 && hit == 1, "first <|x|>");
        EXPECT(engine_stop_scan("END", 3, stops, 2, &hit) == 0 && hit == 0, "stop at 0");
        EXPECT(engine_stop_scan("abc", 3, stops, 0, &hit) == 3 && hit == -1, "no stops");
    }

    const char *dir = getenv("STRATA_DEMO_MODEL") ? getenv("STRATA_DEMO_MODEL") : "demo";
    struct error err;
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    struct tokenizer *tok = tokenizer_load(path, &err);
    EXPECT(tok != NULL, "demo tokenizer %s: %s", path, tok ? "" : err.msg);
    for (int ahead = 0; ahead < 2; ahead++)
        if (tok) engine_checks(dir, tok, ahead);
    for (int ahead = 0; ahead < 2; ahead++)
        if (tok) batch_checks(dir, tok, ahead);
    for (int ahead = 0; ahead < 2; ahead++)
        if (tok) batch_edge_checks(dir, tok, ahead);
    tokenizer_free(tok);
    return TEST_DONE();
}
