/* bench.c - `strata bench --model DIR`: llama-bench style measurements of one model on one
 * backend. Prefill pp512 (tokens/s), decode tg128 (tokens/s, each step = one graph replay fed
 * the previous step's greedy choice on the device, the host reading each choice meanwhile, as
 * the server's greedy requests run), engine time-to-first-token for a 54-token prompt, decode
 * speed in 50-token windows up to 350 tokens and at 8k and 32k tokens of context, weight bytes
 * read per decode token against the measured copy bandwidth, kernel launches per decode step and
 * per prefill, and the per-op time of one decode step. Random token ids (seeded): speed does not
 * depend on what the tokens say. Prints a markdown table last. It does not measure through the
 * HTTP server. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "engine/engine.h"
#include "model/model.h"
#ifdef STRATA_CUDA
#include "model/cuda/cuda.h"
#endif

#define BENCH_GRAPH_STEP 1 /* model.c's key for the decode-step graph */

static uint64_t bench_rng = 0x2545f4914f6cdd1dull;
static void random_ids(int32_t *ids, int n, int vocab) {
    int lim = vocab < 248000 ? vocab : 248000;
    for (int i = 0; i < n; i++) {
        bench_rng = bench_rng * 6364136223846793005ull + 1442695040888963407ull;
        ids[i] = (int32_t)((bench_rng >> 33) % (uint64_t)lim);
    }
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}
static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static int __attribute__((unused)) is_cuda(struct model *m) { return strcmp(model_backend(m)->ops->name, "cuda") == 0; }
static long launches(struct model *m) {
#ifdef STRATA_CUDA
    if (is_cuda(m)) return backend_cuda_launches(model_backend(m));
#endif
    (void)m;
    return -1;
}

/* Prefills n random tokens from the current position (after a reset if `reset`); returns ms. */
static double time_prefill(struct model *m, int n, int reset, struct error *err) {
    int32_t *ids = xmalloc((size_t)n * sizeof *ids);
    random_ids(ids, n, model_config(m)->vocab_size);
    if (reset) model_reset(m);
    struct backend *be = model_backend(m);
    be->ops->sync(be);
    double t0 = now_ms();
    int rc = model_prefill(m, ids, n, NULL, err);
    be->ops->sync(be);
    double t = now_ms() - t0;
    free(ids);
    return rc == 0 ? t : -1;
}

/* n greedy decode steps from the current state, as the server runs them (model_step_greedy:
 * each step's choice fed to the next on the device, read by the host meanwhile); returns ms from
 * the first step's start to the last one's choice on the host. */
static double time_steps(struct model *m, int n) {
    model_argmax(m);
    double t0 = now_ms();
    for (int i = 0; i < n; i++)
        if (model_step_greedy(m) < 0) return -1;
    model_argmax(m);
    return now_ms() - t0;
}

/* A greedy request for the bench's engine measurements: n prompt ids, max_tokens, no EOS stop. */
static void bench_request(struct engine_request *rq, const int32_t *prompt, int n, int max_tokens) {
    memset(rq, 0, sizeof *rq);
    rq->prompt = prompt;
    rq->n_prompt = n;
    rq->max_tokens = max_tokens;
    sampler_params_default(&rq->sampling);
    rq->sampling.temperature = 0;
    rq->ignore_eos = 1;
}

/* n sampled steps (Qwen's settings: T 0.7, top_p 0.8, top_k 20, presence 1.5; the draw on the
 * backend), as time_steps */
static double time_steps_sampled(struct model *m, int n) {
    const struct model_sampling ms = {0.7f, 0.8f, 0.0f, 1.5f, 0.0f, 1.0f, 20, 1, NULL, NULL, 0};
    if (!model_sample_begin(m, &ms, NULL, 0)) return -1;
    model_sample(m);
    double t0 = now_ms();
    for (int i = 0; i < n; i++)
        if (model_step_sample(m) < 0) return -1;
    model_sample(m);
    return now_ms() - t0;
}

/* n greedy steps with the log-probabilities of each choice and the top 20 (model_logprobs), as a
 * request with logprobs runs them: the host reads each choice before the next step */
static double time_steps_logprobs(struct model *m, int n) {
    float lse, cl, top[BACKEND_LOGPROBS_KMAX];
    int32_t ids[BACKEND_LOGPROBS_KMAX];
    double t0 = now_ms();
    for (int i = 0; i < n; i++) {
        const int32_t id = model_argmax(m);
        if (model_logprobs(m, 20, id, &lse, &cl, ids, top) != 0 || model_step(m, id) != 0) return -1;
    }
    model_argmax(m);
    return now_ms() - t0;
}

#define MIXED_PROMPT 24 /* a short chat turn's prompt */

/* The mean ms of a mixed step as the engine's round runs one when a request joins B - 1 streams
 * (engine_round): seqs[0..B-1) with tok[] ride the prefill of a new MIXED_PROMPT-token prompt in
 * seqs[B - 1] (reset first), the prompt's first token is chosen, then the rows' (into tok).
 * 4 untimed rounds, then 16 (n_prof > 0: n_prof rounds, untimed, for the per-op profile). */
static double time_mixed(struct model *m, struct model_seq **seqs, int32_t *tok, int B, int n_prof) {
    const int V = model_config(m)->vocab_size;
    int32_t ids[MIXED_PROMPT];
    struct error err = {{0}};
    double t0 = 0;
    const int n = n_prof ? n_prof : 20, skip = n_prof ? 0 : 4;
    for (int r = 0; r < n; r++) {
        if (r == skip) t0 = now_ms();
        random_ids(ids, MIXED_PROMPT, V);
        model_seq_use(m, seqs[B - 1]);
        model_reset(m);
        model_rows_ride(m, seqs, tok, B - 1);
        if (model_prefill(m, ids, MIXED_PROMPT, NULL, &err) != 0) {
            fprintf(stderr, "strata bench: %s\n", err.msg);
            return -1;
        }
        (void)model_argmax(m);
        if (model_rows_rode(m) != B - 1) {
            fprintf(stderr, "strata bench: the rows did not ride the prefill\n");
            return -1;
        }
        model_rows_argmax(m, B - 1);
        model_row_choices(m, B - 1, tok);
    }
    return (now_ms() - t0) / (n - skip);
}

/* Batched decode (continuous batching, model_step_rows): for each B of the list, B sequences
 * each prefilled with 64 random tokens, then 32 batched steps, each row's greedy choice read by
 * the host and fed to the next step (as the engine runs them); the aggregate and per-sequence
 * tok/s. With CUDA, the per-op time of one step at the largest B. */
static int bench_batch(struct model *m, const char *list) {
    struct model_seq *seqs[MODEL_MAX_BATCH];
    int n_seqs = 1;
    seqs[0] = model_seq_default(m);
    struct backend *be = model_backend(m);
    const int V = model_config(m)->vocab_size;
    double one = 0, mixed_ms[MODEL_MAX_BATCH + 1] = {0}, step_ms[MODEL_MAX_BATCH + 1] = {0};
    printf("\n| batch B | aggregate tok/s | per sequence tok/s | ms / step | vs B = 1 |\n|---|---|---|---|---|\n");
    int last_B = 0;
    for (const char *q = list; *q;) {
        int B = 0, used = 0;
        if (sscanf(q, "%d%n", &B, &used) != 1 || B < 1 || B > MODEL_MAX_BATCH) {
            fprintf(stderr, "strata bench: --batch '%s': expected sizes 1..%d\n", q, MODEL_MAX_BATCH);
            return 2;
        }
        q += used;
        if (*q == ',') q++;
        while (n_seqs < B) {
            const size_t fr = be->ops->mem_free ? be->ops->mem_free(be) : 0;
            if (fr && fr < model_seq_bytes(m) + ((size_t)2 << 30)) break;
            struct model_seq *s = model_seq_create(m);
            if (!s) break;
            seqs[n_seqs++] = s;
        }
        if (n_seqs < B) {
            fprintf(stderr, "strata bench: --batch %d: only %d sequences fit\n", B, n_seqs);
            break;
        }
        struct error err = {{0}};
        int32_t tok[MODEL_MAX_BATCH], ids[64];
        for (int b = 0; b < B; b++) {
            model_seq_use(m, seqs[b]);
            model_reset(m);
            random_ids(ids, 64, V);
            if (model_prefill(m, ids, 64, NULL, &err) != 0) {
                fprintf(stderr, "strata bench: %s\n", err.msg);
                return 1;
            }
            tok[b] = model_argmax(m);
        }
        double t0 = 0;
        for (int st = 0; st < 36; st++) { /* 4 untimed: shapes, first use */
            if (st == 4) t0 = now_ms();
            if (model_step_rows(m, seqs, tok, B) != 0) return 1;
            model_rows_argmax(m, B);
            model_row_choices(m, B, tok);
        }
        const double ms = (now_ms() - t0) / 32;
        if (B == 1) one = 1000 / ms;
        printf("| %d | %.0f | %.1f | %.3f | %s%.2fx |\n", B, B * 1000 / ms, 1000 / ms, ms,
               one > 0 ? "" : "(no B = 1) ", one > 0 ? B * 1000 / ms / one : 0.0);
        if (B > 1) {
            const double mx = time_mixed(m, seqs, tok, B, 0);
            if (mx < 0) return 1;
            mixed_ms[B] = mx, step_ms[B] = ms;
        }
        last_B = B;
    }
    int any = 0;
    for (int B = 2; B <= MODEL_MAX_BATCH; B++)
        if (mixed_ms[B] > 0) {
            if (!any++)
                printf("\nmixed step (a server's round when a request joins): B - 1 rows riding the "
                       "prefill of a new %d-token prompt, its first token and the rows' chosen:\n\n"
                       "| batch B | ms / mixed step | ms / step | mixed / step |\n|---|---|---|---|\n",
                       MIXED_PROMPT);
            printf("| %d | %.3f | %.3f | %.2fx |\n", B, mixed_ms[B], step_ms[B], mixed_ms[B] / step_ms[B]);
        }
#ifdef STRATA_CUDA
    if (is_cuda(m) && last_B > 0) {
        int32_t tok[MODEL_MAX_BATCH] = {0};
        if (backend_cuda_trace_report(be, stdout)) printf("\n"); /* STRATA_TRACE=1: the last step */
        printf("\nper-op time of one batched step, B = %d:\n\n", last_B);
        backend_cuda_profile(be, 1);
        for (int st = 0; st < 3; st++) {
            model_step_rows(m, seqs, tok, last_B);
            model_rows_argmax(m, last_B);
            model_row_choices(m, last_B, tok);
        }
        backend_cuda_profile_report(be, stdout, 3);
        backend_cuda_profile(be, 0);
        if (last_B > 1) {
            printf("\nper-op time of one mixed step, %d rows riding a %d-token prompt:\n\n", last_B - 1,
                   MIXED_PROMPT);
            backend_cuda_profile(be, 1);
            if (time_mixed(m, seqs, tok, last_B, 3) < 0) return 1;
            backend_cuda_profile_report(be, stdout, 3);
            backend_cuda_profile(be, 0);
        }
    }
#endif
    (void)last_B;
    return 0;
}

/* An option's integer value in [lo, hi]: 0, or -1 with a message naming the option. */
int cmd_bench(int argc, char **argv) {
    const char *dir = NULL;
    struct model_options opt = {0};
    int long_ctx = 1, reps = 5, tg_only = 0, at = 0;
    const char *pp_at = NULL; /* "P:N,P:N": prefill N tokens after P (the prefix cache's resume) */
    const char *batch = NULL; /* "1,2,4": batched decode of that many sequences */
    opt.ctx = 33280; /* room for the 32k-context measurement */
    opt.backend = BACKEND_AUTO;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int *num = NULL, lo = 0; /* a numeric option */
        if (v && !strcmp(a, "--ctx")) num = &opt.ctx;
        else if (v && !strcmp(a, "--threads")) num = &opt.n_threads;
        else if (v && !strcmp(a, "--reps")) num = &reps, lo = 1;
        else if (v && !strcmp(a, "--at")) num = &at, lo = 2, long_ctx = 0;
        if (num) {
            if (cli_int("bench", a, v, lo, 1 << 24, num) != 0) return 2;
            i++;
        } else if (!strcmp(a, "--model") && v) dir = v, i++;
        else if (!strcmp(a, "--short")) long_ctx = 0;
        else if (!strcmp(a, "--tg-only")) tg_only = 1, long_ctx = 0;
        else if (!strcmp(a, "--pp-at") && v) pp_at = v, i++;
        else if (!strcmp(a, "--batch") && v) batch = v, i++;
        else if (!strcmp(a, "--backend") && v) {
            opt.backend = !strcmp(v, "cpu") ? BACKEND_CPU : !strcmp(v, "cuda") ? BACKEND_CUDA
                                                                               : BACKEND_AUTO;
            i++;
        } else {
            const int help = !strcmp(a, "-h") || !strcmp(a, "--help");
            fprintf(help ? stdout : stderr,
                    "usage: strata bench [--model DIR] [--backend cpu|cuda] [--ctx N] "
                    "[--reps N] [--short (no 8k/32k context runs)] [--tg-only (tg128 alone)] "
                    "[--at N (decode at a context of N tokens alone)] "
                    "[--pp-at P:N[,P:N...] (prefill of N tokens after P, first token chosen)] "
                    "[--batch B[,B...] (batched decode of B sequences alone; from B = 2 also "
                    "the mixed step of B - 1 rows riding a new prompt)]\n");
            return help ? 0 : 2;
        }
    }
    if (!dir) dir = cli_default_model_dir();
    if (reps < 1) reps = 1;
    if (reps > 32) reps = 32;
    struct error err = {{0}};
    struct model *m = model_load(dir, &opt, &err);
    if (!m && opt.ctx > 4096) { /* a small model: its context may be shorter */
        opt.ctx = 0;
        long_ctx = 0;
        m = model_load(dir, &opt, &err);
    }
    if (!m) {
        fprintf(stderr, "strata bench: %s\n", err.msg);
        return 1;
    }
    const struct config *c = model_config(m);
    struct backend *be = model_backend(m);
    int ctx = model_ctx(m);
    char dev[256] = "cpu";
    int n_sm = 0;
    double copy_bw = 0;
#ifdef STRATA_CUDA
    if (is_cuda(m)) {
        backend_cuda_info(be, dev, sizeof dev, &n_sm);
        copy_bw = backend_cuda_copy_bandwidth(be, (size_t)1 << 30);
    }
#endif
    /* bytes a decode step must read: every weight once; of an untied embedding only one row */
    double wbytes = (double)model_weight_bytes(m);
    if (!c->tie_word_embeddings) wbytes -= (double)c->vocab_size * c->hidden_size * 2;
    fprintf(stderr, "bench: %s on %s (%s), ctx %d, %.2f GB of weights read per token\n", dir,
            be->ops->name, dev, ctx, wbytes / 1e9);

    /* warm-up: module load, cuBLAS heuristics, graph capture */
    if (time_prefill(m, 64, 1, &err) < 0 || time_steps(m, 4) < 0) {
        fprintf(stderr, "strata bench: warm-up failed: %s\n", err.msg);
        model_free(m);
        return 1;
    }

    double v[32];
    if (batch) {
        const int rc = bench_batch(m, batch);
        model_free(m);
        return rc;
    }
    if (pp_at) { /* what a resumed prompt costs without the cache's part: N new tokens at P */
        for (const char *q = pp_at; *q;) {
            int P = -1, N = -1, used = 0;
            if (sscanf(q, "%d:%d%n", &P, &N, &used) != 2 || P < 0 || N < 1 || P + N >= ctx) {
                fprintf(stderr, "strata bench: --pp-at '%s': expected P:N pairs with P + N < %d\n", q, ctx);
                model_free(m);
                return 2;
            }
            for (int r = 0; r < reps; r++) {
                if (P > 0 && time_prefill(m, P, 1, &err) < 0) break;
                if (P == 0) model_reset(m);
                double t = time_prefill(m, N, 0, &err), t0 = now_ms();
                model_argmax(m); /* the first token's choice, as a request's TTFT counts it */
                v[r] = t + (now_ms() - t0);
            }
            double ms = median(v, reps);
            printf("prefill %d at %d %s: %.2f ms (%.0f tok/s)\n", N, P, dir, ms, N / ms * 1e3);
            /* the first of them: what a shape's first use costs (libraries load kernels lazily) */
            printf("  the first: %.2f ms\n", v[0]);
            /* the same after the device sat idle for 200 ms, as a server's request finds it
             * between a client's turns */
            double vi[32];
            for (int r = 0; r < reps; r++) {
                if (P > 0 && time_prefill(m, P, 1, &err) < 0) break;
                if (P == 0) model_reset(m);
                be->ops->sync(be);
                usleep(200 * 1000);
                double t = time_prefill(m, N, 0, &err), t0 = now_ms();
                model_argmax(m);
                vi[r] = t + (now_ms() - t0);
            }
            printf("  after 200 ms idle: %.2f ms\n", median(vi, reps));
            /* what the prefix cache adds: the same prefill with a checkpoint taken inside it,
             * at the backend's last snapshot point 5 or more tokens before its end (the start of
             * an assistant turn); a checkpoint restored and a sequence forked at P (the KV rows
             * before P copied) */
            struct model_ckpt *ck = model_ckpt_create(m), *ck2 = model_ckpt_create(m);
            struct model_seq *s0 = model_seq_current(m), *s1 = model_seq_create(m);
            double vs[32], vr[32], vf[32];
            int32_t *ids = xmalloc((size_t)N * sizeof *ids);
            random_ids(ids, N, c->vocab_size);
            const int A = be->snap_align > 0 ? be->snap_align : 1;
            const int at5 = N - 5 >= A ? (N - 5) / A * A : N;
            for (int r = 0; r < reps; r++) {
                if (P > 0 && time_prefill(m, P, 1, &err) < 0) break;
                if (P == 0) model_reset(m);
                model_ckpt_take(m, ck2, 0);
                be->ops->sync(be);
                double t0 = now_ms();
                if (model_prefill_ckpt(m, ids, N, &ck, &at5, 1, &err) != 0) break;
                model_argmax(m);
                vs[r] = now_ms() - t0;
                if (!s1) { vr[r] = vf[r] = 0; continue; }
                be->ops->sync(be);
                t0 = now_ms();
                model_ckpt_restore(m, ck2, 0);
                be->ops->sync(be);
                vr[r] = now_ms() - t0;
                t0 = now_ms();
                model_seq_use(m, s1);
                model_seq_fork(m, s1, s0, P);
                model_ckpt_restore(m, ck2, 0);
                be->ops->sync(be);
                vf[r] = now_ms() - t0;
                model_seq_use(m, s0);
            }
            printf("  with a checkpoint inside: %.2f ms; a restore: %.3f ms; a fork at %d + restore: %.3f ms\n",
                   median(vs, reps), median(vr, reps), P, median(vf, reps));
#ifdef STRATA_CUDA
            if (is_cuda(m) && (P == 0 || time_prefill(m, P, 1, &err) >= 0)) {
                /* where the time goes (ops one by one with events) */
                if (P == 0) model_reset(m);
                printf("\nper-op time of the %d tokens at %d:\n\n", N, P);
                backend_cuda_profile(be, 1);
                time_prefill(m, N, 0, &err);
                backend_cuda_profile_report(be, stdout, 1);
                backend_cuda_profile(be, 0);
            }
#endif
            free(ids);
            model_ckpt_free(m, ck);
            model_ckpt_free(m, ck2);
            q += used;
            if (*q == ',') q++;
        }
        model_free(m);
        return 0;
    }
    if (at > 0) { /* quick A/B of long-context decode: 48 steps after a prompt of N - 1 tokens */
        if (at + 50 > ctx) {
            fprintf(stderr, "strata bench: --at %d needs a context of %d (have %d)\n", at, at + 50,
                    ctx);
            model_free(m);
            return 2;
        }
        for (int r = 0; r < reps; r++) {
            if (time_prefill(m, at - 1, 1, &err) < 0) {
                fprintf(stderr, "strata bench: prefill: %s\n", err.msg);
                model_free(m);
                return 1;
            }
            time_steps(m, 2);
            v[r] = time_steps(m, 48) / 48;
        }
        double ms = median(v, reps);
#ifdef STRATA_CUDA
        if (is_cuda(m) && backend_cuda_trace_report(be, stdout)) printf("\n");
#endif
        printf("decode at %d %s: %.1f tok/s (%.3f ms/token)\n", at, dir, 1000 / ms, ms);
        model_free(m);
        return 0;
    }
    if (tg_only) { /* quick A/B of decode settings: tg128 alone */
        for (int r = 0; r < reps; r++) {
            time_prefill(m, 1, 1, &err);
            v[r] = time_steps(m, 128);
        }
        double tg = 128 / median(v, reps) * 1000;
#ifdef STRATA_CUDA
        if (is_cuda(m) && backend_cuda_trace_report(be, stdout)) printf("\n");
#endif
        printf("tg128 %s: %.1f tok/s (%.3f ms/token, %.0f%% of copy bandwidth)\n", dir, tg,
               1000 / tg, copy_bw > 0 ? 100 * wbytes * tg / copy_bw : 0.0);
        model_free(m);
        return 0;
    }
    /* pp512 */
    int pp = ctx >= 512 ? 512 : ctx / 2;
    for (int r = 0; r < reps; r++) v[r] = time_prefill(m, pp, 1, &err);
    double pp_ms = median(v, reps);
    /* launches per prefill */
    long l0 = launches(m);
    time_prefill(m, 54, 1, &err);
    long l54 = launches(m) - l0;
    long l4k = -1;
    if (ctx > 4000) {
        l0 = launches(m);
        time_prefill(m, 4000, 1, &err);
        l4k = launches(m) - l0;
    }
    /* engine TTFT, 54-token prompt, greedy, one token */
    struct engine *e = engine_create(m, NULL);
    engine_set_prefix_reuse(e, 0); /* each rep prefills: not a resumed prompt */
    int32_t prompt[54];
    random_ids(prompt, 54, c->vocab_size);
    for (int r = 0; r < reps; r++) {
        struct engine_request rq;
        bench_request(&rq, prompt, 54, 1);
        struct engine_result res;
        if (engine_generate(e, &rq, &res, &err) != 0) {
            fprintf(stderr, "strata bench: engine: %s\n", err.msg);
            v[r] = -1;
        } else {
            v[r] = res.ttft_ms;
        }
    }
    double ttft_ms = median(v, reps);
    /* engine decode of 128 tokens, greedy and sampled with Qwen's settings (T 0.7, top_p 0.8,
     * top_k 20, presence 1.5): issue 27's ratio, the engine's own tok/s */
    double eng_tg[2];
    for (int smp = 0; smp < 2; smp++) {
        for (int r = 0; r < 3; r++) {
            struct engine_request rq;
            bench_request(&rq, prompt, 54, 129);
            rq.sampling.temperature = smp ? 0.7f : 0.0f;
            rq.sampling.top_p = smp ? 0.8f : 1.0f;
            rq.sampling.top_k = smp ? 20 : 0;
            rq.sampling.presence_penalty = smp ? 1.5f : 0.0f;
            rq.sampling.seed = 1 + r;
            struct engine_result res;
            v[r] = engine_generate(e, &rq, &res, &err) == 0 ? res.timings.predicted_per_second : -1;
        }
        eng_tg[smp] = median(v, 3);
    }
    engine_free(e);

    /* tg128 from a 1-token prompt */
    for (int r = 0; r < reps && r < 3; r++) {
        time_prefill(m, 1, 1, &err);
        v[r] = time_steps(m, 128);
    }
    double tg_ms = median(v, reps < 3 ? reps : 3);
    for (int r = 0; r < reps && r < 3; r++) {
        time_prefill(m, 1, 1, &err);
        v[r] = time_steps_sampled(m, 128);
    }
    double tgs_ms = median(v, reps < 3 ? reps : 3);
    for (int r = 0; r < reps && r < 3; r++) {
        time_prefill(m, 1, 1, &err);
        v[r] = time_steps_logprobs(m, 128);
    }
    double tgl_ms = median(v, reps < 3 ? reps : 3);

    /* 50-token windows to 350 */
    double win[7];
    time_prefill(m, 1, 1, &err);
    for (int w = 0; w < 7; w++) win[w] = time_steps(m, 50);

    /* per-op breakdown of a decode step (ops run one by one with events, no graph) */
    char *breakdown = NULL;
    long step_nodes = -1;
#ifdef STRATA_CUDA
    size_t breakdown_len = 0;
    if (is_cuda(m)) {
        step_nodes = backend_cuda_graph_nodes(be, BENCH_GRAPH_STEP);
        FILE *f = open_memstream(&breakdown, &breakdown_len);
        backend_cuda_profile(be, 1);
        time_steps(m, 3);
        backend_cuda_profile_report(be, f, 3);
        backend_cuda_profile(be, 0);
        fprintf(f, "\nthe same, a sampled step (T 0.7, top_p 0.8, top_k 20, presence 1.5):\n\n");
        backend_cuda_profile(be, 1);
        time_steps_sampled(m, 3);
        backend_cuda_profile_report(be, f, 3);
        backend_cuda_profile(be, 0);
        fclose(f);
    }
#endif

    /* long contexts */
    double at512 = -1, at8k = -1, at32k = -1;
    int pos512 = 0, pos32k = 0; /* cache rows before each window's timed steps */
    /* long prompts (issue 26): prefill of 4k, 16k and 32k tokens from an empty context, and the
     * engine's TTFT of a 16k-token prompt */
    static const int long_pp[3] = {4096, 16384, 32768};
    double long_ms[3] = {-1, -1, -1}, ttft16k = -1;
    if (long_ctx)
        for (int k = 0; k < 3; k++) {
            if (long_pp[k] + 1 > ctx) continue;
            for (int r = 0; r < 2; r++) v[r] = time_prefill(m, long_pp[k], 1, &err);
            long_ms[k] = v[0] < v[1] ? v[0] : v[1];
        }
    /* per-op time of a 4,096- and a 16,384-token prefill (ops one by one with events) */
    char *pre_breakdown = NULL;
#ifdef STRATA_CUDA
    size_t pre_len = 0;
    if (long_ctx && is_cuda(m)) {
        FILE *f = open_memstream(&pre_breakdown, &pre_len);
        for (int k = 0; k < 2; k++) {
            if (long_pp[k] + 1 > ctx) continue;
            fprintf(f, "\nper-op time of a %d-token prefill:\n\n", long_pp[k]);
            backend_cuda_profile(be, 1);
            time_prefill(m, long_pp[k], 1, &err);
            backend_cuda_profile_report(be, f, 1);
            backend_cuda_profile(be, 0);
        }
        fclose(f);
    }
#endif
    if (long_ctx && ctx > 16384 + 1) {
        int32_t *ids = xmalloc(16384 * sizeof *ids);
        random_ids(ids, 16384, c->vocab_size);
        struct engine *e16 = engine_create(m, NULL);
        engine_set_prefix_reuse(e16, 0);
        for (int r = 0; r < 2; r++) {
            struct engine_request rq;
            bench_request(&rq, ids, 16384, 1);
            struct engine_result res;
            v[r] = engine_generate(e16, &rq, &res, &err) == 0 ? res.ttft_ms : -1;
        }
        ttft16k = v[0] < v[1] ? v[0] : v[1];
        engine_free(e16);
        free(ids);
    }

    if (long_ctx && ctx >= 8192 + 64) { /* issue 4's ratio: the speed at 32k over that at 512 */
        time_prefill(m, 512 - 1, 1, &err);
        time_steps(m, 2);
        pos512 = model_pos(m);
        at512 = 48 / time_steps(m, 48) * 1000;
        time_prefill(m, 8192 - 1, 1, &err);
        time_steps(m, 2);
        at8k = 48 / time_steps(m, 48) * 1000;
        if (ctx >= 32768 + 64) {
            time_prefill(m, 32768 - 1 - model_pos(m), 0, &err);
            time_steps(m, 2);
            pos32k = model_pos(m);
            at32k = 48 / time_steps(m, 48) * 1000;
        }
    }

    double tg = 128 / tg_ms * 1000;
    printf("\n### strata bench: %s\n\n", dir);
    const char *pdl = getenv("STRATA_PDL");
    printf("backend %s, device %s (%d SMs), context %d, max_T %d, STRATA_PDL=%s\n", be->ops->name,
           dev, n_sm, ctx, be->max_T, pdl ? pdl : "(unset: on)");
    if (breakdown) printf("\nper-op time of one decode step at ~350 tokens of context:\n\n%s\n", breakdown);
    if (pre_breakdown) printf("%s\n", pre_breakdown);
    free(pre_breakdown);
    printf("\n| measure | value |\n|---|---|\n");
    printf("| pp%d prefill | %.0f tok/s (%.2f ms) |\n", pp, pp / pp_ms * 1000, pp_ms);
    printf("| tg128 decode | %.1f tok/s (%.3f ms/token) |\n", tg, tg_ms / 128);
    if (tgs_ms > 0)
        printf("| tg128 sampled (T 0.7, top_p 0.8, top_k 20, presence 1.5) | %.1f tok/s (%.3f ms/token, %.1f%% of tg128) |\n",
               128 / tgs_ms * 1000, tgs_ms / 128, 100 * tg_ms / tgs_ms);
    if (tgl_ms > 0)
        printf("| tg128 with logprobs (top 20) | %.1f tok/s (%.3f ms/token, %.1f%% of tg128) |\n",
               128 / tgl_ms * 1000, tgl_ms / 128, 100 * tg_ms / tgl_ms);
    printf("| engine TTFT, 54-token prompt | %.2f ms |\n", ttft_ms);
    for (int k = 0; k < 3; k++)
        if (long_ms[k] > 0)
            printf("| prefill %d | %.0f tok/s (%.1f ms) |\n", long_pp[k], long_pp[k] / long_ms[k] * 1000, long_ms[k]);
    if (ttft16k > 0) printf("| engine TTFT, 16,384-token prompt | %.1f ms |\n", ttft16k);
    printf("| engine decode, 128 tokens: greedy / sampled (T 0.7, top_p 0.8, top_k 20, presence 1.5) "
           "| %.1f / %.1f tok/s (%.1f%%) |\n", eng_tg[0], eng_tg[1], eng_tg[0] > 0 ? 100 * eng_tg[1] / eng_tg[0] : 0.0);
    for (int w = 0; w < 7; w++)
        printf("| decode tokens %d-%d | %.1f tok/s |\n", 1 + 50 * w, 50 * (w + 1), 50 / win[w] * 1000);
    if (at512 > 0) printf("| decode at 512 context | %.1f tok/s |\n", at512);
    if (at8k > 0) printf("| decode at 8k context | %.1f tok/s |\n", at8k);
    if (at32k > 0)
        printf("| decode at 32k context | %.1f tok/s (%.0f%% of tg128, %.1f%% of the speed at "
               "512) |\n", at32k, 100 * at32k / tg, 100 * at32k / at512);
    if (at32k > 0 && copy_bw > 0) {
        /* The 32k steps attend to pos32k - pos512 more rows of the bf16 cache (K and V of every
         * full-attention layer) than the 512 steps. Reading those at the copy bandwidth bounds
         * the ratio from above for the measured 512 speed. */
        double kv = (double)(pos32k - pos512) * 2 * c->num_key_value_heads * c->head_dim * c->n_full_layers * 2;
        double added = 1 / at32k - 1 / at512, ideal = kv / copy_bw;
        printf("| KV cache read at 32k beyond 512 | %.3f GB a step: %.0f us added, %.0f us at "
               "copy bandwidth (%.0f%% of it) |\n",
               kv / 1e9, added * 1e6, ideal * 1e6, 100 * ideal / added);
        printf("| 32k / 512 ceiling for this 512 speed (that KV read at copy bandwidth) | %.1f%% "
               "|\n", 100 * (1 / at512) / (1 / at512 + ideal));
    }
    printf("| weights read per token | %.3f GB |\n", wbytes / 1e9);
    if (copy_bw > 0)
        printf("| bandwidth at tg128 | %.2f TB/s = %.0f%% of measured copy %.2f TB/s (roofline "
               "%.0f tok/s) |\n",
               wbytes * tg / 1e12, 100 * wbytes * tg / copy_bw, copy_bw / 1e12, copy_bw / wbytes);
    if (step_nodes >= 0) printf("| launches per decode step (graph nodes) | %ld |\n", step_nodes);
    if (l54 >= 0) printf("| launches per prefill, 54 tokens | %ld |\n", l54);
    if (l4k >= 0)
        printf("| launches per prefill, 4000 tokens (%d forward call%s of <= %d tokens) | %ld |\n",
               (4000 + be->max_T - 1) / be->max_T, 4000 > be->max_T ? "s" : "", be->max_T, l4k);
#ifdef STRATA_CUDA
    if (is_cuda(m)) {
        printf("| CUDA backend scratch (max_T %d, context %d) | %.1f MiB |\n", be->max_T, ctx,
               backend_cuda_scratch_bytes(be) / 1048576.0);
        char res[160];
        if (backend_cuda_residency(be, res, sizeof res))
            printf("| registers per SM: DeltaNet step block beside two GEMV blocks | %s |\n", res);
    }
#endif
    free(breakdown);
    model_free(m);
    return 0;
}
