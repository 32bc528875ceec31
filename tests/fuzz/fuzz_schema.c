/* fuzz_schema.c - the grammar compiler (text/grammar.c) on arbitrary JSON schemas and tools,
 * and a walk of the matcher over what compiles. Byte 0: bit 0 the rest is an OpenAI tools array
 * (tool_choice "required", parallel) instead of a schema; bit 1 after_think (a "</think>"
 * prefix is fed first); bit 2 the rest is a GBNF grammar (text, NUL-free) instead; bits 3-7 seed
 * the walk. The rest: JSON text (non-JSON is skipped) or the GBNF text.
 * Properties: a refusal has a message; a compiled grammar's masks are never empty before the
 * stop, every masked token is accepted, the budget holds (the walk ends with a stop token once
 * the shortest completion fits), and a schema walk's output parses as JSON. */
#include "fuzz.h"

#include <jansson.h>

#include "text/grammar.h"

#define N_EXTRA 24
static struct grammar_vocab *vocab;
static const char *tok[256 + N_EXTRA + 1];
static size_t tok_len[256 + N_EXTRA + 1];
static int n_tok;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    static char single[256];
    static const char *const extra[N_EXTRA] = {
        "{\"", "\":", "\",\"", "\"}", "true", "false", "null", "}}", "[{\"", "12", "\n  ", "\": \"",
        "<tool_call>", "</tool_call>", "<function=", "<parameter=", "</parameter>", "</function>",
        ">\n", "\n</", "</think>", "\\u00", "é", "\xe6\x97"};
    for (int i = 0; i < 256; i++) single[i] = (char)i, tok[n_tok] = &single[i], tok_len[n_tok++] = 1;
    for (int i = 0; i < N_EXTRA; i++) tok[n_tok] = extra[i], tok_len[n_tok++] = strlen(extra[i]);
    int32_t stop = n_tok;
    tok[n_tok] = NULL, tok_len[n_tok++] = 0;
    vocab = grammar_vocab_new(n_tok, tok, tok_len, &stop, 1);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const int tools_mode = data[0] & 1, think = (data[0] >> 1) & 1, gbnf = (data[0] >> 2) & 1;
    uint64_t rng = 0x9e3779b97f4a7c15ull * (uint64_t)(data[0] >> 3 | 1);
    char *text = NULL;
    json_t *v = NULL;
    struct grammar_spec sp = {.after_think = think};
    if (gbnf) {
        if (memchr(data + 1, 0, size - 1)) return 0;
        text = malloc(size);
        memcpy(text, data + 1, size - 1);
        text[size - 1] = 0;
        sp.gbnf = text;
    } else {
        v = json_loadb((const char *)data + 1, size - 1, JSON_DECODE_ANY, NULL);
        if (!v) return 0;
        if (tools_mode) sp.tools = v, sp.tools_required = 1, sp.parallel = 1;
        else sp.schema = v;
    }
    struct error err = {{0}};
    struct grammar *g = grammar_compile(&sp, &err);
    if (!g) {
        FUZZ_CHECK(err.msg[0], "a refusal without a message");
        json_decref(v);
        free(text);
        return 0;
    }
    struct grammar_matcher *m = grammar_matcher_new(g, vocab, think ? "</think>" : NULL);
    if (think) FUZZ_CHECK(grammar_matcher_accept_bytes(m, "</think>", 8) == 0, "</think> refused");
    const int shortest = grammar_matcher_shortest(m, NULL, 0);
    FUZZ_CHECK(shortest >= 0, "a compiled grammar without a completion");
    const int budget = shortest < 200 ? shortest + 1 + (int)(rng % 40) : 64;
    uint64_t *bits = malloc(grammar_mask_words(vocab) * sizeof *bits);
    struct strbuf out = {0};
    strbuf_add(&out, "", 0);
    int stopped = 0;
    for (int step = 0; step < budget && !stopped; step++) {
        int n = grammar_matcher_mask(m, bits, budget - step);
        FUZZ_CHECK(n > 0, "an empty mask at step %d after '%s'", step, out.s);
        rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
        int pick = (int)(rng % (uint64_t)n), t = 0;
        for (; t < n_tok; t++)
            if ((bits[t / 64] >> (t % 64) & 1) && pick-- == 0) break;
        FUZZ_CHECK(t < n_tok, "the mask count is wrong");
        FUZZ_CHECK(grammar_matcher_accept(m, t) == 0, "masked token %d refused after '%s'", t, out.s);
        if (t == n_tok - 1) stopped = 1;
        else strbuf_add(&out, tok[t], tok_len[t]);
    }
    if (shortest < 200) FUZZ_CHECK(stopped, "the budget %d did not hold: '%s'", budget, out.s);
    if (stopped && !tools_mode && !gbnf) {
        json_t *j = json_loads(out.s, JSON_DECODE_ANY, NULL);
        FUZZ_CHECK(j, "the output does not parse: '%s'", out.s);
        json_decref(j);
    }
    free(out.s);
    free(bits);
    grammar_matcher_free(m);
    grammar_unref(g);
    json_decref(v);
    free(text);
    return 0;
}
