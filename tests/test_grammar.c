/* test_grammar.c - the grammar engine (src/text/grammar.c) against references written here:
 *   - the schema corpus (tests/fixtures/schemas/corpus.json): every "valid" instance is accepted
 *     byte by byte and complete, every "invalid" one is rejected or incomplete; the valid ones
 *     tokenized by the real Qwen3 tokenizer pass the mask token by token;
 *   - masks equal a brute-force reference (every token's bytes tried from the current state,
 *     grammar_matcher_allows_bytes, which uses neither the trie nor the per-state classes) at
 *     every step of random walks on a small vocabulary built from the corpus, and at the first
 *     steps of walks on the real 151,936-row vocabulary;
 *   - random walks on the real vocabulary (a random allowed token each step, a token budget)
 *     end in a stop token, and their output parses with jansson and validates against the schema
 *     with the small validator below (the OpenAI subset);
 *   - tool calls (required, named, single) parse with chat_parse into calls whose arguments
 *     validate against each tool's parameters; thinking is free until </think>;
 *   - the schemas in tests/fixtures/schemas/bad.json are refused with the message each names.
 * Prints the mean mask time per step on the real vocabulary. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "text/chat.h"
#include "text/grammar.h"
#include "text/tokenizer.h"

/* ---- a validator for the subset ------------------------------------------------------- */

static const json_t *resolve(const json_t *root, const char *ref) {
    if (ref[0] != '#') return NULL;
    const json_t *cur = root;
    const char *p = ref + 1;
    while (*p == '/' && cur) {
        p++;
        char tok[256];
        size_t n = 0;
        while (*p && *p != '/' && n + 1 < sizeof tok) tok[n++] = *p++;
        tok[n] = 0;
        cur = json_object_get(cur, tok);
    }
    return cur;
}

static int is_type(const json_t *v, const char *t) {
    if (!strcmp(t, "string")) return json_is_string(v);
    if (!strcmp(t, "integer"))
        return json_is_integer(v) || (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)));
    if (!strcmp(t, "number")) return json_is_number(v);
    if (!strcmp(t, "boolean")) return json_is_boolean(v);
    if (!strcmp(t, "null")) return json_is_null(v);
    if (!strcmp(t, "object")) return json_is_object(v);
    if (!strcmp(t, "array")) return json_is_array(v);
    return 0;
}

/* jansson's json_equal treats 1 and 1.0 as different; JSON Schema does not */
static int same_value(const json_t *a, const json_t *b) {
    if (json_is_number(a) && json_is_number(b)) return json_number_value(a) == json_number_value(b);
    return json_equal(a, b);
}

static int valid(const json_t *v, const json_t *s, const json_t *root, int depth) {
    if (depth > 200) return 0;
    if (json_is_true(s)) return 1;
    if (!json_is_object(s)) return 0;
    const json_t *ref = json_object_get(s, "$ref");
    if (ref) return valid(v, resolve(root, json_string_value(ref)), root, depth + 1);
    const json_t *en = json_object_get(s, "enum");
    if (en) {
        int any = 0;
        for (size_t i = 0; i < json_array_size(en); i++) any |= same_value(v, json_array_get(en, i));
        if (!any) return 0;
    }
    const json_t *cn = json_object_get(s, "const");
    if (cn && !same_value(v, cn)) return 0;
    const json_t *any = json_object_get(s, "anyOf");
    if (any) {
        int ok = 0;
        for (size_t i = 0; i < json_array_size(any); i++) ok |= valid(v, json_array_get(any, i), root, depth + 1);
        if (!ok) return 0;
    }
    const json_t *one = json_object_get(s, "oneOf");
    if (one) {
        int n = 0;
        for (size_t i = 0; i < json_array_size(one); i++) n += valid(v, json_array_get(one, i), root, depth + 1);
        if (n != 1) return 0;
    }
    const json_t *ty = json_object_get(s, "type");
    if (json_is_string(ty) && !is_type(v, json_string_value(ty))) return 0;
    if (json_is_array(ty)) {
        int ok = 0;
        for (size_t i = 0; i < json_array_size(ty); i++) ok |= is_type(v, json_string_value(json_array_get(ty, i)));
        if (!ok) return 0;
    }
    if (json_is_string(v)) { /* lengths in code points */
        size_t n = 0;
        for (size_t i = 0; i < json_string_length(v); i++) n += ((unsigned char)json_string_value(v)[i] & 0xC0) != 0x80;
        const json_t *b;
        if ((b = json_object_get(s, "minLength")) && (json_int_t)n < json_integer_value(b)) return 0;
        if ((b = json_object_get(s, "maxLength")) && (json_int_t)n > json_integer_value(b)) return 0;
    }
    if (json_is_number(v)) {
        double x = json_number_value(v);
        const json_t *b;
        if ((b = json_object_get(s, "minimum")) && x < json_number_value(b)) return 0;
        if ((b = json_object_get(s, "maximum")) && x > json_number_value(b)) return 0;
        if ((b = json_object_get(s, "exclusiveMinimum")) && x <= json_number_value(b)) return 0;
        if ((b = json_object_get(s, "exclusiveMaximum")) && x >= json_number_value(b)) return 0;
    }
    if (json_is_object(v)) {
        const json_t *props = json_object_get(s, "properties"), *addl = json_object_get(s, "additionalProperties");
        const json_t *req = json_object_get(s, "required");
        for (size_t i = 0; i < json_array_size(req); i++)
            if (!json_object_get(v, json_string_value(json_array_get(req, i)))) return 0;
        const char *k;
        const json_t *x;
        json_object_foreach((json_t *)v, k, x) {
            const json_t *ps = json_object_get(props, k);
            if (ps) {
                if (!valid(x, ps, root, depth + 1)) return 0;
            } else if (json_is_false(addl)) {
                return 0;
            } else if (json_is_object(addl) && !valid(x, addl, root, depth + 1)) {
                return 0;
            }
        }
    }
    if (json_is_array(v)) {
        const json_t *items = json_object_get(s, "items");
        const json_t *mn = json_object_get(s, "minItems"), *mx = json_object_get(s, "maxItems");
        if (mn && (json_int_t)json_array_size(v) < json_integer_value(mn)) return 0;
        if (mx && (json_int_t)json_array_size(v) > json_integer_value(mx)) return 0;
        for (size_t i = 0; items && i < json_array_size(v); i++)
            if (!valid(json_array_get(v, i), items, root, depth + 1)) return 0;
    }
    return 1;
}

/* ---- helpers -------------------------------------------------------------------------- */

static uint64_t rng_state = 0x2545F4914F6CDD1Dull;
static uint64_t rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static int bit(const uint64_t *b, int i) { return (int)(b[i / 64] >> (i % 64) & 1); }

struct vocab_src {
    int n;
    const char **bytes;
    size_t *len;
    int32_t stop[2];
    int n_stop;
};

static json_t *load_json(const char *path) {
    json_error_t je;
    json_t *v = json_load_file(path, 0, &je);
    if (!v) fprintf(stderr, "%s: %s (line %d)\n", path, je.text, je.line);
    return v;
}

/* Brute force: the mask must be exactly the tokens whose bytes keep a valid prefix, plus the
 * stop tokens when complete. Returns the number of differences (reported once). */
static int check_mask(struct grammar_matcher *m, const struct vocab_src *vs, const uint64_t *bits,
                      const char *what) {
    int diffs = 0, first = -1;
    const int complete = grammar_matcher_is_complete(m);
    for (int t = 0; t < vs->n; t++) {
        int want;
        int is_stop = t == vs->stop[0] || (vs->n_stop > 1 && t == vs->stop[1]);
        if (is_stop) want = complete;
        else if (!vs->bytes[t] || !vs->len[t]) want = 0;
        else want = grammar_matcher_allows_bytes(m, vs->bytes[t], vs->len[t]);
        if (want != bit(bits, t)) {
            if (first < 0) first = t;
            diffs++;
        }
    }
    EXPECT(diffs == 0, "%s: mask differs from brute force on %d tokens (first: %d '%.*s')", what,
           diffs, first, first >= 0 && vs->bytes[first] ? (int)vs->len[first] : 0,
           first >= 0 && vs->bytes[first] ? vs->bytes[first] : "");
    return diffs;
}

static double mask_ms_total;
static long mask_steps;
static double mask_ms_max;

/* A random walk: each step a random allowed token (a stop token with probability 1/3 when
 * allowed). brute_steps: check the first that many masks against brute force. Returns the
 * output (malloc'd); *stopped says whether it ended with a stop token. */
static char *walk(struct grammar *g, struct grammar_vocab *v, const struct vocab_src *vs,
                  int budget, int brute_steps, const char *free_until, const char *prefix,
                  int *stopped, const char *what) {
    struct grammar_matcher *m = grammar_matcher_new(g, v, free_until);
    uint64_t *bits = xmalloc(grammar_mask_words(v) * sizeof *bits);
    uint64_t *full = xmalloc(grammar_mask_words(v) * sizeof *full);
    int32_t *allowed = xmalloc((size_t)vs->n * sizeof *allowed);
    struct strbuf out = {0};
    strbuf_add(&out, "", 0);
    if (prefix) {
        EXPECT(grammar_matcher_accept_bytes(m, prefix, strlen(prefix)) == 0, "%s: prefix refused", what);
        strbuf_adds(&out, prefix);
    }
    *stopped = 0;
    for (int step = 0; step < budget; step++) {
        double t0 = now_ms();
        int n = grammar_matcher_mask(m, bits, budget - step);
        double dt = now_ms() - t0;
        mask_ms_total += dt;
        mask_steps++;
        if (dt > mask_ms_max) mask_ms_max = dt;
        /* the unlimited mask is exact; the budgeted one a subset (the first brute_steps steps,
         * then every 16th: inside strings, nested values, near the budget's end) */
        if (step < brute_steps || (brute_steps > 0 && step % 16 == 0)) {
            grammar_matcher_mask(m, full, 0);
            check_mask(m, vs, full, what);
            int extra = 0;
            for (size_t w = 0; w < grammar_mask_words(v); w++) extra += __builtin_popcountll(bits[w] & ~full[w]);
            EXPECT(extra == 0, "%s: %d tokens in the budgeted mask but not the full one", what, extra);
        }
        if (n == 0) {
            EXPECT(0, "%s: empty mask at step %d after '%s'", what, step, out.s);
            break;
        }
        int na = 0, stop_ok = -1;
        for (int t = 0; t < vs->n; t++)
            if (bit(bits, t)) {
                allowed[na++] = t;
                if (t == vs->stop[0]) stop_ok = t;
            }
        EXPECT(na == n, "%s: mask count %d but %d bits set", what, n, na);
        int32_t tok = (stop_ok >= 0 && rnd() % 3 == 0) ? stop_ok : allowed[rnd() % (uint64_t)na];
        int r = grammar_matcher_accept(m, tok);
        EXPECT(r == 0, "%s: an allowed token %d was not accepted", what, tok);
        if (r) break;
        if (tok == vs->stop[0] || (vs->n_stop > 1 && tok == vs->stop[1])) {
            *stopped = 1;
            break;
        }
        strbuf_add(&out, vs->bytes[tok], vs->len[tok]);
        int sh = grammar_matcher_shortest(m, NULL, 0);
        EXPECT(sh <= budget - step - 2, "%s: after step %d the shortest completion is %d bytes, "
               "with %d tokens left", what, step, sh, budget - step - 1);
    }
    free(full);
    free(bits);
    free(allowed);
    grammar_matcher_free(m);
    return strbuf_take(&out);
}

static int shortest_len(struct grammar *g, struct grammar_vocab *v) {
    struct grammar_matcher *m = grammar_matcher_new(g, v, NULL);
    int n = grammar_matcher_shortest(m, NULL, 0);
    grammar_matcher_free(m);
    return n;
}

static struct grammar *compile_schema(const json_t *schema, struct error *err) {
    struct grammar_spec sp = {.schema = schema};
    return grammar_compile(&sp, err);
}

/* ---- tests ---------------------------------------------------------------------------- */

static void test_corpus_bytes(const json_t *corpus) {
    for (size_t i = 0; i < json_array_size(corpus); i++) {
        const json_t *c = json_array_get(corpus, i);
        const char *name = json_string_value(json_object_get(c, "name"));
        struct error err;
        struct grammar *g = compile_schema(json_object_get(c, "schema"), &err);
        EXPECT(g, "corpus '%s' does not compile: %s", name, err.msg);
        if (!g) continue;
        /* the vocabulary does not matter for byte-level acceptance */
        const char *one = "x";
        size_t one_len = 1;
        struct grammar_vocab *v = grammar_vocab_new(1, &one, &one_len, NULL, 0);
        const json_t *ok = json_object_get(c, "valid"), *ko = json_object_get(c, "invalid");
        for (size_t k = 0; k < json_array_size(ok); k++) {
            const char *s = json_string_value(json_array_get(ok, k));
            struct grammar_matcher *m = grammar_matcher_new(g, v, NULL);
            int r = grammar_matcher_accept_bytes(m, s, strlen(s));
            EXPECT(r == 0 && grammar_matcher_is_complete(m), "'%s': valid %s is %s", name, s,
                   r ? "rejected" : "incomplete");
            json_t *j = json_loads(s, JSON_DECODE_ANY, NULL);
            EXPECT(j && valid(j, json_object_get(c, "schema"), json_object_get(c, "schema"), 0),
                   "'%s': the test's validator refuses valid %s", name, s);
            json_decref(j);
            grammar_matcher_free(m);
        }
        for (size_t k = 0; k < json_array_size(ko); k++) {
            const char *s = json_string_value(json_array_get(ko, k));
            struct grammar_matcher *m = grammar_matcher_new(g, v, NULL);
            int r = grammar_matcher_accept_bytes(m, s, strlen(s));
            EXPECT(r != 0 || !grammar_matcher_is_complete(m), "'%s': invalid %s is accepted", name, s);
            grammar_matcher_free(m);
        }
        grammar_vocab_free(v);
        grammar_unref(g);
    }
}

static void test_bad(const json_t *bad) {
    for (size_t i = 0; i < json_array_size(bad); i++) {
        const json_t *c = json_array_get(bad, i);
        const char *want = json_string_value(json_object_get(c, "error"));
        struct error err = {{0}};
        struct grammar *g = compile_schema(json_object_get(c, "schema"), &err);
        EXPECT(!g && strstr(err.msg, want), "bad schema %zu: want an error with '%s', got %s", i,
               want, g ? "a grammar" : err.msg);
        grammar_unref(g);
    }
    /* a named function that does not exist; tools required without tools */
    json_t *tools = json_loads("[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}]", 0, NULL);
    struct grammar_spec sp = {.tools = tools, .tool_name = "g", .tools_required = 1};
    struct error err;
    struct grammar *g = grammar_compile(&sp, &err);
    EXPECT(!g && strstr(err.msg, "no function named 'g'"), "unknown named tool: %s", g ? "compiled" : err.msg);
    json_decref(tools);
    tools = json_loads("[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":"
                       "\"object\",\"properties\":{\"d\":{\"type\":\"string\",\"format\":\"date\"}}}}}]",
                       0, NULL);
    sp = (struct grammar_spec){.tools = tools, .tools_required = 1};
    g = grammar_compile(&sp, &err);
    EXPECT(!g && strstr(err.msg, "tools[0].function.parameters.properties.d: 'format'"),
           "tool parameter format: %s", g ? "compiled" : err.msg);
    json_decref(tools);
}

/* A small vocabulary: the 256 bytes, then substrings (2..6 bytes) of the corpus's valid
 * instances, then one stop token. */
static void small_vocab(const json_t *corpus, struct vocab_src *vs) {
    int cap = 256 + 4000 + 1;
    vs->bytes = xcalloc((size_t)cap, sizeof *vs->bytes);
    vs->len = xcalloc((size_t)cap, sizeof *vs->len);
    static char single[256];
    int n = 0;
    for (int i = 0; i < 256; i++) single[i] = (char)i, vs->bytes[n] = &single[i], vs->len[n++] = 1;
    for (size_t i = 0; i < json_array_size(corpus) && n < cap - 1; i++) {
        const json_t *ok = json_object_get(json_array_get(corpus, i), "valid");
        for (size_t k = 0; k < json_array_size(ok) && n < cap - 1; k++) {
            const char *s = json_string_value(json_array_get(ok, k));
            size_t L = strlen(s);
            for (size_t a = 0; a < L && n < cap - 1; a += 1 + rnd() % 3) {
                size_t l = 2 + rnd() % 5;
                if (a + l > L) continue;
                int dup = 0;
                for (int q = 256; q < n && !dup; q++) dup = vs->len[q] == l && !memcmp(vs->bytes[q], s + a, l);
                if (dup) continue;
                vs->bytes[n] = s + a;
                vs->len[n++] = l;
            }
        }
    }
    vs->stop[0] = n;
    vs->n_stop = 1;
    vs->bytes[n] = NULL;
    vs->len[n++] = 0;
    vs->n = n;
}

static void test_small_vocab_brute(const json_t *corpus) {
    struct vocab_src vs;
    small_vocab(corpus, &vs);
    struct grammar_vocab *v = grammar_vocab_new(vs.n, vs.bytes, vs.len, vs.stop, vs.n_stop);
    int walks = 0, stopped_n = 0;
    for (size_t i = 0; i < json_array_size(corpus); i++) {
        const json_t *c = json_array_get(corpus, i);
        const json_t *schema = json_object_get(c, "schema");
        struct error err;
        struct grammar *g = compile_schema(schema, &err);
        if (!g) continue;
        for (int w = 0; w < 4; w++) {
            char what[128];
            snprintf(what, sizeof what, "small vocab '%s' walk %d", json_string_value(json_object_get(c, "name")), w);
            int stopped;
            char *out = walk(g, v, &vs, shortest_len(g, v) + 1 + 40 * w, 1000, NULL, NULL, &stopped, what);
            json_t *j = json_loads(out, JSON_DECODE_ANY, NULL);
            EXPECT(stopped && j && valid(j, schema, schema, 0), "%s: output %s %s", what, out,
                   !stopped ? "did not stop" : !j ? "does not parse" : "does not validate");
            walks++;
            stopped_n += stopped;
            json_decref(j);
            free(out);
        }
        grammar_unref(g);
    }
    printf("small vocabulary (%d tokens): %d walks, %d stopped, masks checked by brute force at every step\n",
           vs.n, walks, stopped_n);
    grammar_vocab_free(v);
    free(vs.bytes);
    free(vs.len);
}

static struct grammar_vocab *real_vocab(struct tokenizer *tok, struct vocab_src *vs) {
    const int n = 151936; /* the demo model's rows; ids past the tokenizer's are never allowed */
    vs->n = n;
    vs->bytes = xcalloc((size_t)n, sizeof *vs->bytes);
    vs->len = xcalloc((size_t)n, sizeof *vs->len);
    for (int i = 0; i < tokenizer_vocab_size(tok) && i < n; i++) {
        if (tokenizer_is_special(tok, i)) continue;
        vs->bytes[i] = tokenizer_token_bytes(tok, i, &vs->len[i]);
    }
    vs->stop[0] = tokenizer_token_id(tok, "<|im_end|>");
    vs->stop[1] = tokenizer_token_id(tok, "<|endoftext|>");
    vs->n_stop = 2;
    double t0 = now_ms();
    struct grammar_vocab *v = grammar_vocab_new(n, vs->bytes, vs->len, vs->stop, 2);
    printf("real vocabulary: %d rows, trie built in %.1f ms\n", n, now_ms() - t0);
    return v;
}

static void test_real_vocab(const json_t *corpus, struct tokenizer *tok, struct grammar_vocab *v,
                            const struct vocab_src *vs) {
    uint64_t *bits = xmalloc(grammar_mask_words(v) * sizeof *bits);
    int walks = 0;
    for (size_t i = 0; i < json_array_size(corpus); i++) {
        const json_t *c = json_array_get(corpus, i);
        const char *name = json_string_value(json_object_get(c, "name"));
        const json_t *schema = json_object_get(c, "schema");
        struct error err;
        struct grammar *g = compile_schema(schema, &err);
        if (!g) continue;
        /* the valid instances as the tokenizer splits them pass the mask token by token */
        const json_t *ok = json_object_get(c, "valid");
        for (size_t k = 0; k < json_array_size(ok); k++) {
            const char *s = json_string_value(json_array_get(ok, k));
            int32_t *ids = NULL;
            int n = 0;
            struct error e2;
            if (tokenizer_encode(tok, s, strlen(s), &ids, &n, &e2) != 0) continue;
            struct grammar_matcher *m = grammar_matcher_new(g, v, NULL);
            int bad = -1;
            for (int q = 0; q < n && bad < 0; q++) {
                grammar_matcher_mask(m, bits, 0);
                if (!bit(bits, ids[q]) || grammar_matcher_accept(m, ids[q]) != 0) bad = q;
            }
            if (bad < 0) {
                grammar_matcher_mask(m, bits, 0);
                if (!bit(bits, vs->stop[0])) bad = n;
            }
            EXPECT(bad < 0, "'%s': %s tokenized is refused at token %d", name, s, bad);
            grammar_matcher_free(m);
            free(ids);
        }
        for (int w = 0; w < 3; w++) {
            char what[128];
            snprintf(what, sizeof what, "real vocab '%s' walk %d", name, w);
            int stopped;
            /* brute force on the first steps of a few schemas only: it costs 151,936 tries */
            int brute = (i % 8 == 0 && w == 0) ? 3 : 0;
            char *out = walk(g, v, vs, shortest_len(g, v) + 1 + 60 * w, brute, NULL, NULL, &stopped, what);
            json_t *j = json_loads(out, JSON_DECODE_ANY, NULL);
            EXPECT(stopped && j && valid(j, schema, schema, 0), "%s: output %s %s", what, out,
                   !stopped ? "did not stop" : !j ? "does not parse" : "does not validate");
            json_decref(j);
            free(out);
            walks++;
        }
        grammar_unref(g);
    }
    printf("real vocabulary: %d walks over %zu schemas\n", walks, json_array_size(corpus));
    free(bits);
}

static const char *tools_json =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\","
    "\"properties\":{\"city\":{\"type\":\"string\",\"minLength\":1,\"maxLength\":24},\"unit\":{\"type\":\"string\",\"enum\":[\"celsius\","
    "\"fahrenheit\"]},\"days\":{\"type\":\"integer\"}},\"required\":[\"city\"]}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"search\",\"parameters\":{\"type\":\"object\","
    "\"properties\":{\"query\":{\"type\":\"string\"},\"filters\":{\"type\":\"object\",\"properties\":"
    "{\"site\":{\"type\":[\"string\",\"null\"]},\"max\":{\"type\":\"integer\"}},\"required\":[\"site\","
    "\"max\"],\"additionalProperties\":false},\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"}}},"
    "\"required\":[\"query\",\"filters\"]}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"noargs\"}}]";

static const json_t *tool_params(const json_t *tools, const char *name) {
    for (size_t i = 0; i < json_array_size(tools); i++) {
        const json_t *f = json_object_get(json_array_get(tools, i), "function");
        if (!strcmp(json_string_value(json_object_get(f, "name")), name)) return json_object_get(f, "parameters");
    }
    return NULL;
}

static void test_tools(struct grammar_vocab *v, const struct vocab_src *vs) {
    json_t *tools = json_loads(tools_json, 0, NULL);
    CHECK(tools);
    const struct {
        const char *name;
        int parallel;
        int think;
    } cases[] = {{NULL, 1, 0}, {NULL, 0, 0}, {"search", 1, 0}, {"get_weather", 0, 1}, {"noargs", 0, 0}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        struct grammar_spec sp = {.tools = tools, .tool_name = cases[c].name, .tools_required = 1,
                                  .parallel = cases[c].parallel, .after_think = cases[c].think};
        struct error err;
        struct grammar *g = grammar_compile(&sp, &err);
        EXPECT(g, "tools case %zu: %s", c, err.msg);
        if (!g) continue;
        for (int w = 0; w < 6; w++) {
            char what[96];
            snprintf(what, sizeof what, "tools case %zu walk %d", c, w);
            int stopped;
            const char *free_until = cases[c].think ? "</think>" : NULL;
            const char *prefix = cases[c].think ? "Let me think.</think>\n\n" : NULL;
            char *out = walk(g, v, vs, 200, w == 0 ? 2 : 0, free_until, prefix, &stopped, what);
            struct chat_parsed p;
            chat_parse(out, strlen(out), 0, tools, "call_", &p);
            int ok = stopped && p.n_tool_calls >= 1 && !p.truncated &&
                     (cases[c].parallel || p.n_tool_calls == 1);
            for (int k = 0; k < p.n_tool_calls; k++) {
                json_t *args = json_loads(p.tool_calls[k].arguments, 0, NULL);
                const json_t *params = tool_params(tools, p.tool_calls[k].name);
                if (cases[c].name && strcmp(cases[c].name, p.tool_calls[k].name)) ok = 0;
                if (!args || (params && !valid(args, params, params, 0))) ok = 0;
                if (!ok) fprintf(stderr, "  call %d %s(%s)\n", k, p.tool_calls[k].name, p.tool_calls[k].arguments);
                json_decref(args);
            }
            EXPECT(ok, "%s: %d calls, stopped %d, output:\n%s", what, p.n_tool_calls, stopped, out);
            chat_parsed_free(&p);
            free(out);
        }
        grammar_unref(g);
    }
    /* auto with a JSON response: either tool calls or the JSON object */
    json_t *schema = json_loads("{\"type\":\"object\",\"properties\":{\"answer\":{\"type\":\"string\"}},"
                                "\"required\":[\"answer\"],\"additionalProperties\":false}", 0, NULL);
    struct grammar_spec sp = {.tools = tools, .schema = schema, .parallel = 1};
    struct error err;
    struct grammar *g = grammar_compile(&sp, &err);
    EXPECT(g, "auto + schema: %s", err.msg);
    int n_calls = 0, n_json = 0;
    for (int w = 0; g && w < 12; w++) {
        int stopped;
        char *out = walk(g, v, vs, 150, 0, NULL, NULL, &stopped, "auto + schema");
        json_t *j = json_loads(out, 0, NULL);
        struct chat_parsed p;
        chat_parse(out, strlen(out), 0, tools, "call_", &p);
        if (j && valid(j, schema, schema, 0)) n_json++;
        else if (p.n_tool_calls > 0 && !p.truncated) n_calls++;
        else EXPECT(0, "auto + schema: neither JSON nor calls: %s", out);
        EXPECT(stopped, "auto + schema: did not stop: %s", out);
        json_decref(j);
        chat_parsed_free(&p);
        free(out);
    }
    printf("tools: auto + schema gave %d JSON answers and %d tool-call answers\n", n_json, n_calls);
    grammar_unref(g);
    json_decref(schema);
    json_decref(tools);
}

static void test_think_and_object(struct grammar_vocab *v, const struct vocab_src *vs) {
    struct grammar_spec sp = {.json_object = 1, .after_think = 1};
    struct error err;
    struct grammar *g = grammar_compile(&sp, &err);
    CHECK(g);
    uint64_t *bits = xmalloc(grammar_mask_words(v) * sizeof *bits);
    struct grammar_matcher *m = grammar_matcher_new(g, v, "</think>");
    int n = grammar_matcher_mask(m, bits, 0);
    EXPECT(n > 100000 && !bit(bits, vs->stop[0]), "thinking: everything but a stop is allowed (%d)", n);
    EXPECT(grammar_matcher_accept_bytes(m, "I wonder </thi", 14) == 0, "thinking text");
    EXPECT(grammar_matcher_accept_bytes(m, "nk>\n\n{\"a\"", 9) == 0, "</think> across pieces, then JSON");
    EXPECT(!grammar_matcher_allows_bytes(m, "x", 1), "after </think> the grammar holds");
    EXPECT(grammar_matcher_accept_bytes(m, ": 1}", 4) == 0 && grammar_matcher_is_complete(m), "object done");
    grammar_matcher_free(m);
    /* a token completing </think> with bytes the grammar refuses is masked */
    m = grammar_matcher_new(g, v, "</think>");
    grammar_matcher_accept_bytes(m, "hmm </think", 11);
    grammar_matcher_mask(m, bits, 0);
    int32_t *ids = NULL;
    int ni = 0;
    (void)ids, (void)ni;
    int gt = -1, gtx = -1;
    for (int t = 0; t < vs->n; t++) {
        if (vs->len[t] == 1 && vs->bytes[t][0] == '>') gt = t;
        if (vs->len[t] == 2 && !memcmp(vs->bytes[t], ">x", 2)) gtx = t;
    }
    EXPECT(gt >= 0 && bit(bits, gt), "'>' completes </think>");
    EXPECT(gtx < 0 || !bit(bits, gtx), "'>x' completes </think> into a non-object and is masked");
    grammar_matcher_free(m);
    /* random thinking runs into the budget: </think> is written in time, then the object */
    for (int w = 0; w < 6; w++) {
        int stopped;
        char *out = walk(g, v, vs, 40 + 10 * w, 0, "</think>", NULL, &stopped, "thinking walk");
        const char *end = strstr(out, "</think>");
        json_t *j = end ? json_loads(end + 8, 0, NULL) : NULL;
        EXPECT(stopped && j && json_is_object(j), "thinking walk %d: %s", w, out);
        json_decref(j);
        free(out);
    }
    free(bits);
    grammar_unref(g);
}

/* Budget: with the tokens left close to the shortest completion, the output still completes. */
static void test_budget(const json_t *corpus, struct grammar_vocab *v, const struct vocab_src *vs) {
    int n_ok = 0, n = 0;
    for (size_t i = 0; i < json_array_size(corpus); i++) {
        const json_t *schema = json_object_get(json_array_get(corpus, i), "schema");
        struct error err;
        struct grammar *g = compile_schema(schema, &err);
        if (!g) continue;
        struct grammar_matcher *m = grammar_matcher_new(g, v, NULL);
        char buf[4096];
        int len = grammar_matcher_shortest(m, buf, sizeof buf);
        json_t *j = json_loads(buf, JSON_DECODE_ANY, NULL);
        EXPECT(len >= 0 && j && valid(j, schema, schema, 0), "shortest completion '%s' of schema %zu", buf, i);
        json_decref(j);
        grammar_matcher_free(m);
        int stopped;
        /* budget: the shortest completion in bytes + the margin + a stop */
        char *out = walk(g, v, vs, len + 1, 0, NULL, NULL, &stopped, "budget");
        j = json_loads(out, JSON_DECODE_ANY, NULL);
        n++;
        if (j && valid(j, schema, schema, 0)) n_ok++;
        else fprintf(stderr, "  budget %d, schema %zu: %s\n", len + 1, i, out);
        json_decref(j);
        free(out);
        grammar_unref(g);
    }
    EXPECT(n_ok == n, "budget walks: %d of %d complete", n_ok, n);
}

/* GBNF: acceptance, refusals, and walks on the real vocabulary whose output parses. */
static const char *json_gbnf =
    "# llama.cpp's grammars/json.gbnf, as written there\n"
    "root   ::= object\n"
    "value  ::= object | array | string | number | (\"true\" | \"false\" | \"null\") ws\n"
    "object ::=\n"
    "  \"{\" ws (\n"
    "            string \":\" ws value\n"
    "    (\",\" ws string \":\" ws value)*\n"
    "  )? \"}\" ws\n"
    "array  ::=\n"
    "  \"[\" ws (\n"
    "            value\n"
    "    (\",\" ws value)*\n"
    "  )? \"]\" ws\n"
    "string ::=\n"
    "  \"\\\"\" (\n"
    "    [^\"\\\\\\x7F\\x00-\\x1F] |\n"
    "    \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4})\n"
    "  )* \"\\\"\" ws\n"
    "number ::= (\"-\"? ([0-9] | [1-9] [0-9]{0,15})) (\".\" [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws\n"
    "ws ::= | \" \" | \"\\n\" [ \\t]{0,20}\n";

static void test_gbnf(struct grammar_vocab *v, const struct vocab_src *vs) {
    static const struct {
        const char *g, *ok[4], *ko[4];
    } cases[] = {
        {"root ::= \"yes\" | \"no\"", {"yes", "no"}, {"ye!", "maybe"}},
        {"root ::= [a-z]+ (\",\" [a-z]+)* # a list\n", {"abc", "a,bc,d"}, {"abc,", "ABC", ","}},
        {"root ::= item{2,3}\nitem ::= [0-9] \" \"?", {"12", "1 2 3", "1 23"}, {"1", "1234"}},
        {"root ::= \"\\\"\" ( [^\"\\\\] | \"\\\\\" [\"nt] )* \"\\\"\"", {"\"ab\"", "\"a\\\"b\"", "\"\xc3\xa9\xe6\x97\xa5\""}, {"\"a", "\"\\x\""}},
        {"root ::= (\"a\"\n   | \"b\") . [\\u00e9-\\u00ff]?", {"ac", "b\xe6\x97\xa5", "aa\xc3\xa9"}, {"c", "aa\xc3\xa8"}},
        {"root ::= [^a-z]", {"A", "\xf0\x9f\x98\x80"}, {"q", "\xed\xa0\x80"}},
    };
    const char *one = "x";
    size_t one_len = 1;
    struct grammar_vocab *v1 = grammar_vocab_new(1, &one, &one_len, NULL, 0);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        struct grammar_spec sp = {.gbnf = cases[c].g};
        struct error err;
        struct grammar *g = grammar_compile(&sp, &err);
        EXPECT(g, "gbnf %zu: %s", c, err.msg);
        if (!g) continue;
        for (int k = 0; k < 4; k++) {
            const char *s;
            if ((s = cases[c].ok[k])) {
                struct grammar_matcher *m = grammar_matcher_new(g, v1, NULL);
                EXPECT(grammar_matcher_accept_bytes(m, s, strlen(s)) == 0 && grammar_matcher_is_complete(m),
                       "gbnf %zu: '%s' must be accepted", c, s);
                grammar_matcher_free(m);
            }
            if ((s = cases[c].ko[k])) {
                struct grammar_matcher *m = grammar_matcher_new(g, v1, NULL);
                int r = grammar_matcher_accept_bytes(m, s, strlen(s));
                EXPECT(r != 0 || !grammar_matcher_is_complete(m), "gbnf %zu: '%s' must be refused", c, s);
                grammar_matcher_free(m);
            }
        }
        grammar_unref(g);
    }
    grammar_vocab_free(v1);
    static const struct {
        const char *g, *msg;
    } bad[] = {
        {"root ::= \"a\" (", "grammar: line 1: "},
        {"x ::= \"a\"", "no rule 'root'"},
        {"root ::= a\nroot ::= \"b\"", "line 2: a rule defined twice"},
        {"root ::= undefined-rule", "the rule 'undefined-rule' is not defined"},
        {"root ::= x\nx ::= x \"a\" | \"b\"", "refers to itself without consuming input"},
        {"root ::= [z-a]", "a reversed range"},
        {"root ::= \"\\q\"", "an unknown escape"},
        {"root ::= \"a\"{3,1}", "a bad {m,n}"},
        {"root ::= \"unterminated", "an unterminated literal"},
    };
    for (size_t c = 0; c < sizeof bad / sizeof bad[0]; c++) {
        struct grammar_spec sp = {.gbnf = bad[c].g};
        struct error err = {{0}};
        struct grammar *g = grammar_compile(&sp, &err);
        EXPECT(!g && strstr(err.msg, bad[c].msg), "bad gbnf %zu: want '%s', got %s", c, bad[c].msg, g ? "a grammar" : err.msg);
        grammar_unref(g);
    }
    /* llama.cpp's JSON grammar on the real vocabulary: walks end in JSON objects */
    struct grammar_spec sp = {.gbnf = json_gbnf};
    struct error err;
    struct grammar *g = grammar_compile(&sp, &err);
    EXPECT(g, "json.gbnf: %s", err.msg);
    for (int w = 0; g && w < 6; w++) {
        int stopped;
        char *out = walk(g, v, vs, 120, w == 0 ? 4 : 0, NULL, NULL, &stopped, "json.gbnf walk");
        json_t *j = json_loads(out, 0, NULL);
        EXPECT(stopped && j && json_is_object(j), "json.gbnf walk %d: %s", w, out);
        json_decref(j);
        free(out);
    }
    grammar_unref(g);
}

int main(void) {
    json_t *corpus = load_json("tests/fixtures/schemas/corpus.json");
    json_t *bad = load_json("tests/fixtures/schemas/bad.json");
    CHECK(corpus && bad);
    EXPECT(json_array_size(corpus) >= 50, "the corpus has %zu schemas", json_array_size(corpus));
    test_corpus_bytes(corpus);
    test_bad(bad);
    test_small_vocab_brute(corpus);

    struct error err;
    struct tokenizer *tok = tokenizer_load("demo/tokenizer.json", &err);
    CHECK(tok);
    struct vocab_src vs;
    struct grammar_vocab *v = real_vocab(tok, &vs);
    mask_ms_total = 0, mask_steps = 0, mask_ms_max = 0;
    test_real_vocab(corpus, tok, v, &vs);
    test_tools(v, &vs);
    test_think_and_object(v, &vs);
    test_gbnf(v, &vs);
    test_budget(corpus, v, &vs);
    printf("mask time on the real vocabulary: %.3f ms mean over %ld steps (max %.1f ms, the first "
           "use of a state included)\n", mask_steps ? mask_ms_total / mask_steps : 0, mask_steps, mask_ms_max);
    grammar_vocab_free(v);
    free(vs.bytes);
    free(vs.len);
    tokenizer_free(tok);
    json_decref(corpus);
    json_decref(bad);
    return TEST_DONE();
}
