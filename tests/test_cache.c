/* test_cache.c - the prefix cache (src/engine/cache.c) on the bundled demo model (CPU backend;
 * STRATA_DEMO_MODEL overrides). Each case runs requests through the cache and checks:
 *   - how much it resumed (exact counts: where the checkpoints are is part of the design), and
 *   - that the logits after the prompt are bit-identical to a fresh prefill of the same prompt
 *     on a second copy of the model (CPU: the same arithmetic per token whatever the split, so
 *     any difference is a bug in what was restored), and so are the greedy tokens after it.
 * Cases: identical re-send; a shared system prompt with other questions; the next turn of a
 * thinking conversation (the template drops the reasoning, so the prompts part inside the last
 * assistant turn); two clients alternating; a side request between agent steps; a miss; a
 * sequence cut back in place when the pool has one sequence; eviction under a tiny budget (never
 * more checkpoints than the pool); a checkpoint at the very end of the context; a feed cancelled
 * between pieces (what it fed is cached, nothing more); checkpoints every N tokens inside a long
 * prompt.
 * STRATA_TEST_BACKEND=cuda runs it on the GPU (scripts: bench/multiturn.sh): there a resumed
 * prompt is prefilled in other pieces than a fresh one, and cuBLAS rounds GEMMs of other shapes
 * differently, so the logits must agree within 0.25 (the demo's logits span ~30; CUDA against
 * the CPU differs by up to 0.16 on random 0.8B weights, run 130) and the greedy tokens exactly
 * (the demo model is trained: its top choices are far apart). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/cache.h"
#include "harness.h"
#include "model/model.h"
#include "text/tokenizer.h"

static struct tokenizer *tok;
static struct model *m, *ref;
static int V;
static int on_gpu;

/* A resume point against the one the design gives on the CPU: there exactly; on the GPU the
 * checkpoints inside a feed go back to a multiple of 64 tokens from its start (snap_align), so
 * up to 63 fewer. */
static int at_point(int got, int want) {
    return on_gpu ? got <= want && got > want - 64 : got == want;
}

struct prompt {
    int32_t *ids;
    int n;
};

static struct prompt enc(const char *text) {
    struct prompt p;
    struct error err;
    CHECK(tokenizer_encode(tok, text, strlen(text), &p.ids, &p.n, &err) == 0);
    return p;
}

/* s, `times` times over, as one prompt with no chat markup */
static struct prompt enc_repeat(const char *s, int times) {
    char big[8192] = "";
    for (int i = 0; i < times && strlen(big) + strlen(s) < sizeof big; i++) strcat(big, s);
    return enc(big);
}

/* a fresh cache on m: budget, checkpoints every `every` tokens (0: the default) */
static struct cache *new_cache(struct cache *old, size_t budget, int every, int32_t boundary) {
    cache_free(old);
    struct cache_params p = {budget, every, boundary};
    return cache_create(m, &p);
}

/* a prompt and tokens after it (a reply as the model state took it) */
static struct prompt cat(struct prompt a, const int32_t *b, int nb) {
    struct prompt p = {malloc((size_t)(a.n + nb) * sizeof(int32_t)), a.n + nb};
    memcpy(p.ids, a.ids, (size_t)a.n * sizeof(int32_t));
    memcpy(p.ids + a.n, b, (size_t)nb * sizeof(int32_t));
    return p;
}

/* The position of the k-th from last <|im_start|> of p (k = 1: the last). */
static int boundary_from_end(struct prompt p, int k) {
    const int32_t b = tokenizer_token_id(tok, "<|im_start|>");
    for (int q = p.n - 1; q >= 0; q--)
        if (p.ids[q] == b && --k == 0) return q;
    return -1;
}

static int common(struct prompt a, struct prompt b) {
    int i = 0;
    while (i < a.n && i < b.n && a.ids[i] == b.ids[i]) i++;
    return i;
}

/* Runs p through the cache (resume + feed) and n_gen greedy steps; returns what it resumed.
 * Checks the logits after the prompt and the greedy ids against a fresh prefill on ref. */
static int run(struct cache *c, struct prompt p, int n_gen, int32_t *gen, const char *what) {
    struct error err;
    const int r = cache_prepare(c, p.ids, p.n);
    EXPECT(r >= 0 && r <= p.n, "%s: resumed %d of %d", what, r, p.n);
    EXPECT(model_pos(m) == r, "%s: the sequence is at %d after resuming %d", what, model_pos(m), r);
    CHECK(cache_feed_prompt(c, p.ids, p.n, r, NULL, NULL, &err) == 0);
    float *a = malloc((size_t)V * sizeof *a), *b = malloc((size_t)V * sizeof *b);
    model_logits(m, a);
    model_reset(ref);
    CHECK(model_prefill(ref, p.ids, p.n, NULL, &err) == 0);
    model_logits(ref, b);
    float dmax = 0;
    for (int i = 0; i < V; i++) dmax = fabsf(a[i] - b[i]) > dmax ? fabsf(a[i] - b[i]) : dmax;
    EXPECT(on_gpu ? dmax <= 0.25f : memcmp(a, b, (size_t)V * sizeof *a) == 0,
           "%s: logits after resuming %d of %d tokens differ from a fresh prefill (max %g)", what,
           r, p.n, dmax);
    for (int i = 0; i < n_gen; i++) {
        const int32_t x = model_argmax(m), y = model_argmax(ref);
        EXPECT(x == y, "%s: token %d after the prompt: %d, fresh %d", what, i, x, y);
        if (gen) gen[i] = x;
        if (i + 1 < n_gen || gen) { /* the state takes every token (as the engine's loop) */
            CHECK(model_step(m, x) == 0 && model_step(ref, y) == 0);
            cache_push(c, x);
        }
    }
    free(a);
    free(b);
    return r;
}

static int stop_second(void *arg) { return ++*(int *)arg >= 2; }

int main(void) {
    const char *dir = getenv("STRATA_DEMO_MODEL") ? getenv("STRATA_DEMO_MODEL") : "demo";
    struct error err;
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    tok = tokenizer_load(path, &err);
    CHECK(tok);
    const char *want = getenv("STRATA_TEST_BACKEND");
    on_gpu = want && !strcmp(want, "cuda");
    struct model_options o = {.backend = on_gpu ? BACKEND_CUDA : BACKEND_CPU, .ctx = 1024,
                              .n_threads = 1, .quiet = 1};
    m = model_load(dir, &o, &err);
    ref = model_load(dir, &o, &err);
    CHECK(m && ref);
    V = model_config(m)->vocab_size;
    const int32_t im_start = tokenizer_token_id(tok, "<|im_start|>");

    const char *SYS = "<|im_start|>system\nYou are a careful assistant. Answer briefly, in plain "
                      "words, and say so when you do not know.<|im_end|>\n";
    char buf[4096];
    struct cache_params cp = {(size_t)256 << 20, 0, im_start};
    struct cache *c = cache_create(m, &cp);
    struct cache_stats st;
    cache_get_stats(c, &st);
    EXPECT(st.n_seqs >= 4 && st.n_ckpts >= 16, "a 256 MiB budget: %d sequences, %d checkpoints",
           st.n_seqs, st.n_ckpts);

    /* a miss, then the identical re-send: everything, from the end-of-prompt checkpoint */
    snprintf(buf, sizeof buf, "%s<|im_start|>user\nWhat is a prime number?<|im_end|>\n"
                              "<|im_start|>assistant\n<think>\n", SYS);
    struct prompt a1 = enc(buf);
    int32_t g[16];
    EXPECT(run(c, a1, 6, g, "first request") == 0, "first request: a miss");
    int r = run(c, a1, 6, NULL, "identical re-send");
    EXPECT(r == a1.n, "identical re-send: resumed %d, want all %d", r, a1.n);

    /* shared system prompt, another question: resumes at the end of the system prompt */
    snprintf(buf, sizeof buf, "%s<|im_start|>user\nName three rivers.<|im_end|>\n"
                              "<|im_start|>assistant\n<think>\n", SYS);
    struct prompt b1 = enc(buf);
    const int sys_end = boundary_from_end(b1, 2);
    r = run(c, b1, 6, NULL, "shared system prompt");
    EXPECT(at_point(r, sys_end) && common(a1, b1) >= sys_end,
           "shared system prompt: resumed %d, want %d (shared %d)", r, sys_end, common(a1, b1));

    /* the next turn of a1's thinking conversation: its reply as the model wrote it (reasoning
     * then answer), then the next prompt, in which the template dropped the reasoning */
    {
        struct prompt t1 = enc(buf); /* scratch */
        free(t1.ids);
        snprintf(buf, sizeof buf, "%s<|im_start|>user\nWhat is a prime number?<|im_end|>\n"
                                  "<|im_start|>assistant\nA number with two divisors.<|im_end|>\n"
                                  "<|im_start|>user\nAnd 7?<|im_end|>\n<|im_start|>assistant\n<think>\n",
                 SYS);
        struct prompt a2 = enc(buf);
        const int want = boundary_from_end(a1, 1); /* a1's last boundary: its assistant turn */
        const int shared = common(a1, a2);
        r = run(c, a2, 4, NULL, "thinking conversation, turn 2");
        EXPECT(at_point(r, want) && shared - want <= 3,
               "thinking turn 2: resumed %d, want %d (shares %d with turn 1)", r, want, shared);
        free(a2.ids);
    }

    /* two clients alternating: each next request extends what its sequence holds (prompt +
     * the tokens fed after it), which the other client's requests left alone */
    {
        snprintf(buf, sizeof buf, "<|im_start|>system\nClient A.<|im_end|>\n<|im_start|>user\n"
                                  "Count to three.<|im_end|>\n<|im_start|>assistant\n");
        struct prompt A = enc(buf);
        snprintf(buf, sizeof buf, "<|im_start|>system\nClient B.<|im_end|>\n<|im_start|>user\n"
                                  "Spell cat.<|im_end|>\n<|im_start|>assistant\n");
        struct prompt B = enc(buf);
        int32_t ga[8], gb[8];
        run(c, A, 8, ga, "client A 1");
        run(c, B, 8, gb, "client B 1");
        struct prompt tailp = enc("<|im_end|>\n<|im_start|>user\nAgain.<|im_end|>\n<|im_start|>assistant\n");
        struct prompt A2 = cat(cat(A, ga, 8), tailp.ids, tailp.n);
        struct prompt B2 = cat(cat(B, gb, 8), tailp.ids, tailp.n);
        r = run(c, A2, 4, NULL, "client A 2");
        EXPECT(r == A.n + 8, "alternating clients, A's 2nd: resumed %d, want %d", r, A.n + 8);
        r = run(c, B2, 4, NULL, "client B 2");
        EXPECT(r == B.n + 8, "alternating clients, B's 2nd: resumed %d, want %d", r, B.n + 8);

        /* a side request (another system prompt) between two agent steps */
        struct prompt side = enc("<|im_start|>system\nWrite a title.<|im_end|>\n<|im_start|>user\n"
                                 "Count to three.<|im_end|>\n<|im_start|>assistant\n");
        int32_t g2[6];
        run(c, A2, 6, g2, "agent step");
        EXPECT(run(c, side, 3, NULL, "side request") == 0, "side request: a miss");
        struct prompt A3 = cat(cat(A2, g2, 6), tailp.ids, tailp.n);
        r = run(c, A3, 3, NULL, "agent step after the side request");
        EXPECT(r == A2.n + 6, "side request between agent steps: resumed %d, want %d", r, A2.n + 6);
        free(A.ids), free(B.ids), free(A2.ids), free(B2.ids), free(A3.ids), free(side.ids);
        free(tailp.ids);
    }

    /* a miss stays a miss */
    {
        struct prompt z = enc("Completely unrelated text without any chat markup.");
        EXPECT(run(c, z, 2, NULL, "unrelated") == 0, "unrelated prompt: a miss");
        free(z.ids);
    }

    /* checkpoints every N tokens inside a long prompt (none of its boundaries near) */
    {
        c = new_cache(c, (size_t)256 << 20, 100, im_start);
        struct prompt L = enc_repeat("The quick brown fox jumps over the lazy dog. ", 40);
        CHECK(L.n > 300);
        run(c, L, 2, NULL, "long prompt");
        L.ids[250] = L.ids[250] == 11 ? 12 : 11; /* parts at 250: the checkpoint at 200 */
        r = run(c, L, 2, NULL, "long prompt, changed at 250");
        EXPECT(at_point(r, 200), "every 100 tokens: resumed %d, want 200", r);
        free(L.ids);
    }

    /* one sequence: a shorter resume point cuts it back in place */
    {
        c = new_cache(c, 4 * model_ckpt_bytes(m), 0, im_start);
        cache_get_stats(c, &st);
        EXPECT(st.n_seqs == 1 && st.n_ckpts == 4, "4 checkpoints' budget: %d seqs, %d ckpts",
               st.n_seqs, st.n_ckpts);
        run(c, a1, 3, NULL, "one sequence: a1");
        r = run(c, b1, 3, NULL, "one sequence: b1");
        EXPECT(at_point(r, sys_end), "one sequence: resumed %d, want %d", r, sys_end);
        r = run(c, a1, 3, NULL, "one sequence: a1 again");
        EXPECT(at_point(r, sys_end), "one sequence: a1 after b1 resumed %d, want %d (a1's own "
                             "checkpoints went with the cut)", r, sys_end);

        /* a tiny budget: one checkpoint; requests still exact, the pool never over its size */
        c = new_cache(c, model_ckpt_bytes(m), 0, im_start);
        for (int i = 0; i < 3; i++) {
            run(c, i % 2 ? b1 : a1, 2, NULL, "tiny budget");
            cache_get_stats(c, &st);
            EXPECT(st.n_ckpts == 1 && st.bytes_held <= st.budget_bytes,
                   "tiny budget: %d checkpoints, %zu bytes held of %zu", st.n_ckpts, st.bytes_held,
                   st.budget_bytes);
        }
        EXPECT(st.evictions > 0, "tiny budget: checkpoints were evicted (%ld)", st.evictions);
        r = run(c, a1, 2, NULL, "tiny budget: a1 re-sent");
        EXPECT(r == a1.n, "tiny budget: the last prompt's end checkpoint survives (%d of %d)", r, a1.n);
    }

    /* a checkpoint at the very end of the context */
    {
        c = new_cache(c, cp.budget_bytes, 0, im_start);
        const int ctx = model_ctx(m);
        struct prompt f = {malloc((size_t)(ctx - 1) * sizeof(int32_t)), ctx - 1};
        for (int i = 0; i < f.n; i++) f.ids[i] = 100 + (i * 7919) % 5000;
        run(c, f, 1, NULL, "context - 1 tokens");
        r = run(c, f, 1, NULL, "context - 1 tokens, re-sent");
        EXPECT(r == f.n, "end of the context: resumed %d of %d", r, f.n);
        EXPECT(model_step(m, model_argmax(m)) == 0 && model_pos(m) == ctx,
               "the last position still takes a token");
        free(f.ids);
    }

    /* a feed cancelled between pieces: the tokens fed are cached, nothing past them (the CPU's
     * checkpoints every 16 tokens make pieces of 8; the GPU's come every 64th: one piece) */
    if (!on_gpu) {
        c = new_cache(c, (size_t)256 << 20, 16, im_start);
        struct prompt L = enc_repeat("Pack my box with five dozen liquor jugs. ", 20);
        CHECK(L.n > 16 * (BACKEND_MAX_SNAPS + 1));
        int calls = 0;
        r = cache_prepare(c, L.ids, L.n);
        EXPECT(cache_feed_prompt(c, L.ids, L.n, r, stop_second, &calls, &err) == 1,
               "a cancel between pieces returns 1");
        const int32_t *held;
        const int n_held = cache_tokens(c, &held);
        EXPECT(n_held == 16 * BACKEND_MAX_SNAPS && n_held == model_pos(m),
               "cancelled feed: holds %d tokens (state at %d), want the first piece, %d", n_held,
               model_pos(m), 16 * BACKEND_MAX_SNAPS);
        r = run(c, L, 2, NULL, "after a cancelled feed");
        EXPECT(r == n_held, "after a cancelled feed: resumed %d, want %d (its live state)", r, n_held);
        free(L.ids);
    }

    /* Pinned sequences (requests running at once, engine.c): a sequence another request is
     * using is never taken for a miss, cut back or extended in place; a prompt that shares its
     * prefix is forked from it (its KV rows and a checkpoint copied), and what the pinned
     * sequence holds is untouched: its own next prompt still resumes all of it. cache_clear
     * leaves it. A feed in pieces (cache_feed_begin / some) gives what one feed gives. */
    {
        c = new_cache(c, (size_t)256 << 20, 16, im_start);
        struct prompt P = enc_repeat("The quick brown fox jumps over the lazy dog. ", 12);
        r = run(c, P, 0, NULL, "pinned: first feed");
        const int sP = cache_slot(c);
        cache_pin(c, sP, 1);
        const int32_t *held;
        const int n_before = cache_tokens(c, &held);
        /* the same prompt plus more, while P's sequence is pinned: forked, not extended */
        int32_t more[5] = {11, 12, 13, 14, 15};
        struct prompt Q = cat(P, more, 5);
        r = run(c, Q, 2, NULL, "pinned: an extension of a pinned prompt");
        EXPECT(cache_slot(c) != sP, "pinned: the extension runs on another sequence (slot %d)", cache_slot(c));
        EXPECT(r > 0 && r <= P.n, "pinned: the extension resumed %d (a checkpoint of the pinned one)", r);
        /* misses take other sequences too */
        struct prompt M = enc("Something else entirely, with no shared prefix.");
        for (int k = 0; k < 3; k++) {
            M.ids[0] = 100 + k; /* distinct first tokens: three misses */
            run(c, M, 0, NULL, "pinned: a miss");
            EXPECT(cache_slot(c) != sP, "pinned: miss %d took slot %d, the pinned one", k, cache_slot(c));
        }
        cache_clear(c);
        cache_use(c, sP);
        EXPECT(cache_tokens(c, &held) == n_before && model_pos(m) == n_before,
               "pinned: the pinned sequence holds %d tokens after the others and a clear (was %d, state %d)",
               cache_tokens(c, &held), n_before, model_pos(m));
        cache_pin(c, sP, 0);
        /* unpinned: its own extension now resumes all of it (the live state) */
        r = run(c, Q, 2, NULL, "unpinned: the extension");
        EXPECT(r == n_before, "unpinned: the extension resumed %d, want %d", r, n_before);
        /* a feed in pieces of 32 tokens (or the backend's snapshot alignment, when larger: 64 on
         * CUDA): the same logits as one feed (run checks a fresh prefill) */
        c = new_cache(c, (size_t)256 << 20, 16, im_start);
        r = cache_prepare(c, P.ids, P.n);
        cache_feed_begin(c, P.ids, P.n, r);
        const int piece = cache_align(c) > 32 ? cache_align(c) : 32;
        int pieces = 0, rc;
        while ((rc = cache_feed_some(c, 32, &err)) == 1) pieces++;
        EXPECT(rc == 0 && model_pos(m) == P.n && pieces >= (P.n + piece - 1) / piece - 1,
               "a feed in pieces of %d: rc %d, at %d of %d, %d pieces", piece, rc, model_pos(m),
               P.n, pieces);
        float *a = malloc((size_t)V * sizeof *a), *b = malloc((size_t)V * sizeof *b);
        model_logits(m, a);
        model_reset(ref);
        CHECK(model_prefill(ref, P.ids, P.n, NULL, &err) == 0);
        model_logits(ref, b);
        EXPECT(on_gpu || memcmp(a, b, (size_t)V * sizeof *a) == 0, "a feed in pieces: the logits of one feed");
        free(a), free(b);
        r = run(c, P, 0, NULL, "after a feed in pieces");
        EXPECT(r == P.n, "after a feed in pieces: the repeat resumes all %d (%d)", P.n, r);
        free(P.ids), free(Q.ids), free(M.ids);
    }

    cache_get_stats(c, &st);
    EXPECT(st.hits > 0 && st.tokens_fed > 0 && st.ckpts_taken > 0, "stats: %ld hits, %ld fed, %ld taken",
           st.hits, st.tokens_fed, st.ckpts_taken);
    cache_free(c);
    free(a1.ids);
    free(b1.ids);
    model_free(m);
    model_free(ref);
    tokenizer_free(tok);
    return TEST_DONE();
}
