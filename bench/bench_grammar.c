/* bench_grammar.c - the grammar engine's costs on a real vocabulary: the token table (trie) build,
 * a schema's compile time, and the mask per decoding step over random walks (a random allowed
 * token each step, as test_grammar's walks), cold (a fresh process: every state's token classes
 * computed on first use) and warm (the same schema again: classes cached, as for a repeated
 * schema in the server). Prints a table: mean, p50, p99 and max ms per mask.
 *
 *   bench_grammar [--tokenizer FILE] [--rows N] [--walks N] [--steps N]
 *   (defaults: data/qwen3-tokenizer/tokenizer.json, the tokenizer's size rounded up to 128,
 *    8 walks, 200 steps)
 *
 * Build: make bench. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/grammar.h"
#include "text/tokenizer.h"

static const char *const schemas[][2] = {
    {"flat 4 fields", "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"age\":{\"type\":\"integer\"},"
                      "\"ok\":{\"type\":\"boolean\"},\"score\":{\"type\":\"number\"}},\"required\":[\"name\",\"age\",\"ok\",\"score\"],"
                      "\"additionalProperties\":false}"},
    {"nested ~20 fields",
     "{\"type\":\"object\",\"properties\":{\"id\":{\"type\":\"integer\"},\"name\":{\"type\":\"string\"},\"email\":{\"type\":\"string\"},"
     "\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"}},\"address\":{\"type\":\"object\",\"properties\":{\"street\":"
     "{\"type\":\"string\"},\"city\":{\"type\":\"string\"},\"zip\":{\"type\":\"string\"},\"country\":{\"enum\":[\"US\",\"FR\",\"DE\","
     "\"JP\"]}},\"required\":[\"street\",\"city\",\"zip\",\"country\"],\"additionalProperties\":false},\"orders\":{\"type\":\"array\","
     "\"items\":{\"type\":\"object\",\"properties\":{\"sku\":{\"type\":\"string\"},\"qty\":{\"type\":\"integer\",\"minimum\":1},"
     "\"price\":{\"type\":\"number\"},\"gift\":{\"type\":\"boolean\"}},\"required\":[\"sku\",\"qty\",\"price\",\"gift\"],"
     "\"additionalProperties\":false},\"maxItems\":3},\"active\":{\"type\":\"boolean\"},\"score\":{\"type\":\"number\"},"
     "\"level\":{\"enum\":[\"low\",\"mid\",\"high\"]},\"note\":{\"type\":[\"string\",\"null\"]},\"created\":{\"type\":\"string\"},"
     "\"parent\":{\"type\":[\"integer\",\"null\"]}},\"required\":[\"id\",\"name\",\"email\",\"tags\",\"address\",\"orders\",\"active\","
     "\"score\",\"level\",\"note\",\"created\",\"parent\"],\"additionalProperties\":false}"},
    {"any JSON object", NULL},
};

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static uint64_t rng = 0x853c49e6748fea9bull;
static uint64_t rnd(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return rng;
}

/* Runs walks, filling ms[] with each mask's time; returns the count. */
static int run(struct grammar *g, struct grammar_vocab *v, int n_rows, int32_t stop, int walks,
               int steps, double *ms) {
    uint64_t *bits = malloc(grammar_mask_words(v) * sizeof *bits);
    int32_t *allowed = malloc((size_t)n_rows * sizeof *allowed);
    int n = 0;
    for (int w = 0; w < walks; w++) {
        struct grammar_matcher *m = grammar_matcher_new(g, v, NULL);
        for (int s = 0; s < steps; s++) {
            double t0 = now_ms();
            int c = grammar_matcher_mask(m, bits, steps - s);
            ms[n++] = now_ms() - t0;
            if (c == 0) break;
            int na = 0, stop_ok = 0;
            for (int t = 0; t < n_rows; t++)
                if (bits[t / 64] >> (t % 64) & 1) {
                    allowed[na++] = t;
                    stop_ok |= t == stop;
                }
            int32_t t = stop_ok && rnd() % 3 == 0 ? stop : allowed[rnd() % (uint64_t)na];
            if (t == stop || grammar_matcher_accept(m, t) != 0) break;
        }
        grammar_matcher_free(m);
    }
    free(bits);
    free(allowed);
    return n;
}

static void row(const char *name, const char *kind, double *ms, int n) {
    double sum = 0;
    for (int i = 0; i < n; i++) sum += ms[i];
    qsort(ms, (size_t)n, sizeof *ms, cmp_d);
    printf("| %-18s | %-4s | %6d | %8.3f | %8.3f | %8.3f | %8.2f |\n", name, kind, n, n ? sum / n : 0,
           n ? ms[n / 2] : 0, n ? ms[(int)(n * 0.99)] : 0, n ? ms[n - 1] : 0);
}

int main(int argc, char **argv) {
    const char *tok_path = "data/qwen3-tokenizer/tokenizer.json";
    int rows = 0, walks = 8, steps = 200;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--tokenizer") && i + 1 < argc) tok_path = argv[++i];
        else if (!strcmp(argv[i], "--rows") && i + 1 < argc) rows = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--walks") && i + 1 < argc) walks = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--steps") && i + 1 < argc) steps = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: bench_grammar [--tokenizer FILE] [--rows N] [--walks N] [--steps N]\n");
            return 2;
        }
    }
    struct error err = {{0}};
    struct tokenizer *tok = tokenizer_load(tok_path, &err);
    if (!tok) {
        fprintf(stderr, "bench_grammar: %s\n", err.msg);
        return 1;
    }
    const int nt = tokenizer_vocab_size(tok);
    if (rows < nt) rows = (nt + 127) / 128 * 128;
    const char **bytes = calloc((size_t)rows, sizeof *bytes);
    size_t *len = calloc((size_t)rows, sizeof *len);
    for (int i = 0; i < nt; i++)
        if (!tokenizer_is_special(tok, i)) bytes[i] = tokenizer_token_bytes(tok, i, &len[i]);
    int32_t stop = tokenizer_token_id(tok, "<|im_end|>");
    double t0 = now_ms();
    struct grammar_vocab *v = grammar_vocab_new(rows, bytes, len, &stop, 1);
    printf("vocabulary: %d rows (%d tokens), trie built in %.1f ms\n\n", rows, nt, now_ms() - t0);
    printf("| schema             | run  | masks  | mean ms  | p50 ms   | p99 ms   | max ms   |\n");
    printf("|---|---|---|---|---|---|---|\n");
    double *ms = malloc((size_t)walks * (size_t)steps * sizeof *ms);
    for (size_t k = 0; k < sizeof schemas / sizeof schemas[0]; k++) {
        json_t *s = schemas[k][1] ? json_loads(schemas[k][1], 0, NULL) : NULL;
        struct grammar_spec sp = {.schema = s, .json_object = !s};
        t0 = now_ms();
        struct grammar *g = grammar_compile(&sp, &err);
        double compile_ms = now_ms() - t0;
        if (!g) {
            fprintf(stderr, "bench_grammar: %s\n", err.msg);
            return 1;
        }
        char name[64];
        snprintf(name, sizeof name, "%s", schemas[k][0]);
        int n = run(g, v, rows, stop, walks, steps, ms);
        row(name, "cold", ms, n);
        n = run(g, v, rows, stop, walks, steps, ms);
        row(name, "warm", ms, n);
        printf("|   compile %.2f ms, %d states |||||||\n", compile_ms, grammar_n_states(g));
        grammar_unref(g);
        json_decref(s);
    }
    free(ms);
    grammar_vocab_free(v);
    free(bytes);
    free(len);
    tokenizer_free(tok);
    return 0;
}
