/* strata_logits.c - the strata side of tools/compare_transformers.py: runs a model on a list of
 * token ids and writes what the comparison needs as raw little-endian arrays. Built on the GPU
 * machine by scripts/gpu-run.sh against build-gpu/libstrata.a; not part of the strata binary.
 *
 *   strata_logits DIR BACKEND IDS OUT all          teacher-forced logits, float32 (n, vocab)
 *   strata_logits DIR BACKEND IDS OUT greedy N     prefill IDS, N greedy ids, int32 (N,)
 *   strata_logits DIR BACKEND IDS OUT steps P      prefill IDS[0..P) then step the rest, against
 *                                                  step-only from IDS[0]: prints the max |diff|
 *                                                  and argmax agreement over positions P-1..n-1;
 *                                                  OUT gets float32 (2, n-P+1, vocab)
 *   strata_logits DIR BACKEND IDS OUT rows P       batched decode (4 sequences) against
 *                                                  single-sequence steps of the same ids
 *   strata_logits DIR BACKEND IDS OUT ahead P      batched greedy decode run ahead (choices fed
 *                                                  on the device) against fed by the host
 * IDS is a file of int32 token ids. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"

static int32_t *read_ids(const char *path, int *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    int32_t *ids = xmalloc((size_t)sz + 4);
    *n = (int)(fread(ids, 4, (size_t)sz / 4, f));
    fclose(f);
    return ids;
}

/* ahead mode: the token forcing sequence 3 after step st */
static int32_t forced_tok(const int32_t *ids, int n, int st) { return ids[(7 * st + 1) % n]; }

static int argmax_f(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

int main(int argc, char **argv) {
    if (argc < 6) {
        fprintf(stderr, "usage: strata_logits DIR cpu|cuda IDS OUT all|greedy N|steps P|rows P|ride P|ahead P\n");
        return 2;
    }
    struct model_options opt = {0};
    opt.backend = !strcmp(argv[2], "cpu") ? BACKEND_CPU : BACKEND_CUDA;
    opt.ctx = 8192; /* --long prompts of compare_transformers.py up to 8,191 tokens */
    opt.quiet = 1;
    int n;
    int32_t *ids = read_ids(argv[3], &n);
    if (!ids || n < 1) {
        fprintf(stderr, "strata_logits: cannot read ids from %s\n", argv[3]);
        return 1;
    }
    struct error err = {{0}};
    struct model *m = model_load(argv[1], &opt, &err);
    if (!m) {
        fprintf(stderr, "strata_logits: %s\n", err.msg);
        return 1;
    }
    int V = model_config(m)->vocab_size;
    FILE *out = fopen(argv[4], "wb");
    if (!out) {
        fprintf(stderr, "strata_logits: cannot write %s\n", argv[4]);
        return 1;
    }
    const char *mode = argv[5];
    int rc = 0;
    if (!strcmp(mode, "all")) {
        float *lg = xmalloc((size_t)n * V * sizeof(float));
        if (model_prefill(m, ids, n, lg, &err) < 0) {
            fprintf(stderr, "strata_logits: %s\n", err.msg);
            rc = 1;
        } else {
            fwrite(lg, sizeof(float), (size_t)n * V, out);
        }
        free(lg);
    } else if (!strcmp(mode, "greedy") && argc > 6) {
        int N = atoi(argv[6]);
        int32_t *gen = xmalloc((size_t)(N > 0 ? N : 1) * 4);
        if (model_prefill(m, ids, n, NULL, &err) < 0) {
            fprintf(stderr, "strata_logits: %s\n", err.msg);
            rc = 1;
        } else {
            /* as the server's greedy requests: each token fed on the device, read after */
            for (int i = 0; i < N; i++) {
                gen[i] = i + 1 < N ? model_step_greedy(m) : model_argmax(m);
                if (gen[i] < 0) {
                    fprintf(stderr, "strata_logits: context full\n");
                    rc = 1;
                    break;
                }
            }
            fwrite(gen, 4, (size_t)N, out);
        }
        free(gen);
    } else if (!strcmp(mode, "steps") && argc > 6) {
        int P = atoi(argv[6]);
        if (P < 1 || P > n) P = n;
        int rows = n - P + 1;
        float *a = xmalloc((size_t)rows * V * sizeof(float)), *b = xmalloc((size_t)rows * V * sizeof(float));
        /* prefill P, then steps */
        if (model_prefill(m, ids, P, NULL, &err) < 0) {
            fprintf(stderr, "strata_logits: %s\n", err.msg);
            return 1;
        }
        model_logits(m, a);
        for (int i = P; i < n; i++) {
            model_step(m, ids[i]);
            model_logits(m, a + (size_t)(i - P + 1) * V);
        }
        /* step-only */
        model_reset(m);
        if (model_prefill(m, ids, 1, NULL, &err) < 0) return 1;
        if (P == 1) model_logits(m, b);
        for (int i = 1; i < n; i++) {
            model_step(m, ids[i]);
            if (i >= P - 1) model_logits(m, b + (size_t)(i - P + 1) * V);
        }
        double maxd = 0;
        int agree = 0;
        for (int r = 0; r < rows; r++) {
            const float *x = a + (size_t)r * V, *y = b + (size_t)r * V;
            for (int i = 0; i < V; i++) {
                double d = x[i] > y[i] ? x[i] - y[i] : y[i] - x[i];
                if (d > maxd) maxd = d;
            }
            agree += argmax_f(x, V) == argmax_f(y, V);
        }
        printf("prefill %d + steps vs step-only: max |logit diff| %.5f, argmax agree %d/%d\n", P,
               maxd, agree, rows);
        fwrite(a, sizeof(float), (size_t)rows * V, out);
        fwrite(b, sizeof(float), (size_t)rows * V, out);
        free(a);
        free(b);
    } else if ((!strcmp(mode, "rows") || !strcmp(mode, "ride")) && argc > 6) {
        /* batched decode against single-sequence decode: sequence b (of B) prefilled with
         * IDS[0..P - b), all then stepped together (model_step_rows), each teacher-forced on
         * IDS from its own position on; row 0's logits against those of the plain steps of the
         * same ids (prints max |diff| and argmax agreement over every row's steps, each row
         * against its own single run); OUT gets row 0's float32 (n-P, vocab) then the plain ones.
         * "ride": every other step rides the prefill of a fifth sequence (IDS[0..17 + step),
         * model_rows_ride: a mixed step) instead of a batched step of its own. */
        const int B = 4, P = atoi(argv[6]), ride = !strcmp(mode, "ride");
        if (P < B + 1 || P >= n) {
            fprintf(stderr, "strata_logits: rows: P in %d..%d\n", B + 1, n - 1);
            return 2;
        }
        struct model_seq *seqs[5];
        seqs[0] = model_seq_default(m);
        for (int b = 1; b < 5; b++) seqs[b] = model_seq_create(m);
        const int steps = n - P;
        float *bat = xmalloc((size_t)B * steps * V * sizeof(float));
        float *one = xmalloc((size_t)steps * V * sizeof(float));
        for (int b = 0; b < B; b++) {
            model_seq_use(m, seqs[b]);
            model_reset(m);
            if (model_prefill(m, ids, P - b, NULL, &err) < 0) return 1;
        }
        for (int st = 0; st < steps; st++) {
            int32_t tok[4];
            for (int b = 0; b < B; b++) tok[b] = ids[P - b + st];
            if (ride && st % 2 == 0) {
                model_seq_use(m, seqs[4]);
                model_reset(m);
                model_rows_ride(m, seqs, tok, B);
                if (model_prefill(m, ids, 17 + st < n ? 17 + st : n, NULL, &err) < 0 ||
                    model_rows_rode(m) != B)
                    return 1;
            } else if (model_step_rows(m, seqs, tok, B) != 0) {
                return 1;
            }
            for (int b = 0; b < B; b++) model_row_logits(m, b, bat + ((size_t)b * steps + st) * V);
        }
        double maxd = 0;
        int agree = 0;
        for (int b = 0; b < B; b++) {
            model_seq_use(m, seqs[0]);
            model_reset(m);
            if (model_prefill(m, ids, P - b, NULL, &err) < 0) return 1;
            for (int st = 0; st < steps; st++) {
                model_step(m, ids[P - b + st]);
                model_logits(m, one + (size_t)st * V);
            }
            for (int st = 0; st < steps; st++) {
                const float *x = bat + ((size_t)b * steps + st) * V, *y = one + (size_t)st * V;
                for (int i = 0; i < V; i++) {
                    double d = x[i] > y[i] ? x[i] - y[i] : y[i] - x[i];
                    if (d > maxd) maxd = d;
                }
                agree += argmax_f(x, V) == argmax_f(y, V);
            }
            if (b == 0) {
                fwrite(bat, sizeof(float), (size_t)steps * V, out);
                fwrite(one, sizeof(float), (size_t)steps * V, out);
            }
        }
        printf("batched (B %d%s) vs single-sequence steps: max |logit diff| %.5f, argmax agree %d/%d\n",
               B, ride ? ", every other step riding a prefill" : "", maxd, agree, B * steps);
        free(bat);
        free(one);
    } else if (!strcmp(mode, "ahead") && argc > 6) {
        /* greedy batched decode run ahead (the engine's form on a device: each step's choices
         * fed to the next step on the device, model_rows_post / model_step_rows_from / model_rows_wait)
         * against the host feeding them (model_row_choices / model_step_rows): 4 sequences
         * prefilled with IDS[0..P - b), 16 steps, row 1 leaving after the 8th (the rest fed from
         * rows 0, 2, 3), sequence 3 fed a token of IDS instead of its choice every third step (a
         * forced row, from the host); every token must be the same. OUT gets both runs' int32
         * tokens. */
        enum { B = 4, STEPS = 16 };
        const int P = atoi(argv[6]);
        if (P < B + 1 || P > n) {
            fprintf(stderr, "strata_logits: ahead: P in %d..%d\n", B + 1, n);
            return 2;
        }
        struct model_seq *seqs[B];
        seqs[0] = model_seq_default(m);
        for (int b = 1; b < B; b++) seqs[b] = model_seq_create(m);
        int32_t got[2][STEPS][B];
        memset(got, 0xff, sizeof got);
        for (int run = 0; run < 2; run++) {
            int32_t tok[B];
            for (int b = 0; b < B; b++) {
                model_seq_use(m, seqs[b]);
                model_reset(m);
                if (model_prefill(m, ids, P - b, NULL, &err) < 0) return 1;
                tok[b] = model_argmax(m);
            }
            struct model_seq *live[B] = {seqs[0], seqs[1], seqs[2], seqs[3]};
            int rows[B] = {0, 1, 2, 3}, nl = B; /* live sequence i: which of the 4 it is */
            if (model_step_rows(m, live, tok, B) != 0) return 1;
            for (int st = 0; st < STEPS; st++) {
                int32_t ch[B];
                model_rows_argmax(m, nl);
                if (run == 0) {
                    model_row_choices(m, nl, ch);
                } else {
                    const int64_t post = model_rows_post(m, nl);
                    if (st + 1 < STEPS) { /* the next step, queued before the choices are read */
                        int from[B], keep = 0;
                        struct model_seq *next[B];
                        for (int i = 0; i < nl; i++)
                            if (!(st == 7 && rows[i] == 1)) {
                                next[keep] = live[i];
                                from[keep] = rows[i] == 3 && st % 3 == 0 ? -1 : i; /* forced: the host's */
                                tok[keep++] = forced_tok(ids, n, st);
                            }
                        if (model_step_rows_from(m, next, tok, from, keep) != 0) return 1;
                    }
                    model_rows_wait(m, post, nl, ch);
                }
                for (int i = 0; i < nl; i++) got[run][st][rows[i]] = ch[i];
                if (st + 1 == STEPS) break;
                int keep = 0;
                for (int i = 0; i < nl; i++)
                    if (!(st == 7 && rows[i] == 1)) live[keep] = live[i], rows[keep] = rows[i], tok[keep++] = ch[i];
                for (int i = 0; i < keep; i++) /* sequence 3 teacher-forced every third step */
                    if (rows[i] == 3 && st % 3 == 0) tok[i] = forced_tok(ids, n, st);
                nl = keep;
                if (run == 0 && model_step_rows(m, live, tok, nl) != 0) return 1;
            }
        }
        int same = 0, total = 0, differ = 0; /* differ: steps whose rows chose unlike tokens */
        for (int st = 0; st < STEPS; st++) {
            int unlike = 0;
            for (int b = 0; b < B; b++) {
                if (b == 1 && st > 7) continue;
                total++;
                same += got[0][st][b] == got[1][st][b];
                unlike |= got[0][st][b] != got[0][st][0];
            }
            differ += unlike;
        }
        printf("run ahead (choices fed on the device, sequence 3 teacher-forced every third step) vs fed "
               "by the host: %d/%d tokens identical (the rows' tokens unlike at %d of %d steps)\n",
               same, total, differ, STEPS);
        fwrite(got, sizeof got, 1, out);
        if (same != total) rc = 1;
    } else {
        fprintf(stderr, "strata_logits: unknown mode %s\n", mode);
        rc = 2;
    }
    fclose(out);
    model_free(m);
    free(ids);
    return rc;
}
