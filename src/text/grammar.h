/* grammar.h - constrained decoding: a JSON Schema (OpenAI structured outputs' subset), "any
 * JSON object", or Qwen3.5 XML tool calls whose parameters follow each tool's schema, compiled
 * into a pushdown automaton over bytes, and per decoding step the mask of the vocabulary's
 * tokens that keep the output a valid prefix (a token's bytes may span several grammar symbols).
 * Knows neither the model nor HTTP: the caller gives each token's bytes and the stop ids.
 *
 * What the grammar allows (the "language"):
 *   - JSON in a bounded layout: one optional whitespace run between tokens ("" | " " | "\n"
 *     followed by up to 20 spaces/tabs), none before the value or after it; once the value is
 *     complete only a stop token is allowed (the model cannot loop on whitespace).
 *   - Object properties in the schema's order; optional ones may be left out; additional
 *     properties only where the schema has no "properties" (then any key).
 *   - Strings: minLength / maxLength up to 32 characters (code points; a counted character is
 *     never '<', which JSON writes \u003c).
 *   - Numbers with at most 15 integer digits, 16 fraction digits and 2 exponent digits;
 *     integer minimum / maximum (exclusive too) exactly, number ones when they are integers and
 *     the minimum >= 0. String
 *     escapes \" \\ \/ \b \f \n \r \t and \uXXXX outside the surrogates and \u0000; raw bytes
 *     valid UTF-8 without control characters. JSON strings of chat content never hold the raw
 *     text "<tool_call>", and those of tool parameters never "</parameter>", "<parameter=" or
 *     "</function>" (the output parser would cut there; "\/" writes them).
 *   - Tool calls exactly as the Qwen3.5 template writes them: "<tool_call>\n<function=NAME>\n"
 *     then, for each parameter in the schema's order, "<parameter=K>\nV\n</parameter>\n", then
 *     "</function>\n</tool_call>", several calls joined by "\n" when parallel. V is raw text for
 *     a string parameter (as chat_parse types it) and JSON for any other.
 *   - Or a GBNF grammar (llama.cpp's format: rules "name ::= ...", literals with \n \t \xHH
 *     \uHHHH escapes, [classes] and [^negated] over code points, groups, * + ? {m} {m,} {m,n},
 *     '.' any character, # comments); its characters are written as UTF-8.
 * Budget: given the tokens left, a token is allowed only if the shortest completion after it
 * (in bytes: at worst one token each) and a stop token still fit, so the output closes its
 * structures in time: any budget of at least the shortest instance's bytes + 1 ends in a complete
 * value and a stop. A smaller budget is not limited (the output stays a valid prefix and is cut).
 *
 * Speed (the design of xgrammar, written anew): the vocabulary is a byte trie; for each
 * automaton state a walk of the trie from that state alone sorts every token into accepted,
 * rejected, or context-dependent (it pops the state's rule with bytes left, and those bytes are
 * checked against the real stack at run time). The walk is cached per state (and for the
 * built-in rules - strings, numbers, whitespace, any JSON - once per vocabulary, shared by every
 * grammar), masks per matcher configuration. */
#ifndef STRATA_GRAMMAR_H
#define STRATA_GRAMMAR_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "util.h"

/* ---- the vocabulary ------------------------------------------------------------------- */

struct grammar_vocab;

/* n_tokens: the mask width (the model's vocabulary). bytes[i] (len[i] bytes) is what token i
 * writes; NULL or len 0 leaves it out of every mask (special tokens, unused rows). stop: the ids
 * allowed exactly when the output is complete (EOS, <|im_end|>). Copies everything. */
struct grammar_vocab *grammar_vocab_new(int n_tokens, const char *const *bytes, const size_t *len,
                                        const int32_t *stop, int n_stop);
void grammar_vocab_free(struct grammar_vocab *v);
int grammar_vocab_n_tokens(const struct grammar_vocab *v);

/* ---- compiling ------------------------------------------------------------------------ */

struct grammar_spec {
    const json_t *schema;   /* JSON content following this schema, or NULL */
    int json_object;        /* JSON content: any object (response_format json_object) */
    const char *gbnf;       /* content following a GBNF grammar (llama.cpp's; rule "root") */
    const json_t *tools;    /* OpenAI tools array: tool calls are allowed, or NULL */
    const char *tool_name;  /* only this function may be called, or NULL */
    int tools_required;     /* only tool calls (no content) */
    int parallel;           /* one or more calls (else exactly one) */
    int after_think;        /* the output starts after "</think>": up to 2 newlines first */
};

struct grammar;

/* NULL + err naming the problem (an unsupported keyword and where it is, e.g.
 * "schema.properties.date: 'format' is not supported") on a spec that cannot be compiled. */
struct grammar *grammar_compile(const struct grammar_spec *spec, struct error *err);
void grammar_ref(struct grammar *g);
void grammar_unref(struct grammar *g); /* frees at the last reference */
int grammar_n_states(const struct grammar *g);

/* ---- matching ------------------------------------------------------------------------- */

struct grammar_matcher;

/* free_until: a text after which the grammar starts (e.g. "</think>"): before it every token is
 * allowed except the stop tokens, until the budget only just holds free_until and the grammar's
 * shortest completion: then free_until is written. NULL: the grammar starts at once. The grammar and vocabulary
 * must outlive the matcher. A matcher belongs to one thread. */
struct grammar_matcher *grammar_matcher_new(struct grammar *g, const struct grammar_vocab *v,
                                            const char *free_until);
void grammar_matcher_free(struct grammar_matcher *m);

/* The mask width: the vocabulary's n_tokens. */
int grammar_matcher_n_tokens(const struct grammar_matcher *m);

/* The mask words: (n_tokens + 63) / 64. */
size_t grammar_mask_words(const struct grammar_vocab *v);

/* Fills bits (grammar_mask_words) with the tokens allowed next: bit i of word i/64. budget: the
 * tokens left including this one (<= 0: unlimited). Returns the number of allowed tokens (0 when
 * the matcher is dead, which a masked sampler never causes). */
int grammar_matcher_mask(struct grammar_matcher *m, uint64_t *bits, int budget);

/* Advances by a token. Returns 0, or -1 (state unchanged) if the token is not allowed. */
int grammar_matcher_accept(struct grammar_matcher *m, int32_t token);

/* Advances by raw bytes (tests). Returns 0 or -1 (state unchanged). */
int grammar_matcher_accept_bytes(struct grammar_matcher *m, const char *s, size_t n);

/* 1 if the bytes, appended, keep the output a valid prefix (no state change; a reference for
 * tests, independent of the trie and the per-state classes). */
int grammar_matcher_allows_bytes(struct grammar_matcher *m, const char *s, size_t n);

/* 1 when the output so far is a complete value (a stop token is allowed). */
int grammar_matcher_is_complete(const struct grammar_matcher *m);
/* 1 once a stop token was accepted. */
int grammar_matcher_is_stopped(const struct grammar_matcher *m);

/* The bytes of a shortest completion from here (at most cap - 1, NUL-terminated); returns its
 * full length, or -1 while before free_until. */
int grammar_matcher_shortest(struct grammar_matcher *m, char *out, size_t cap);

#endif
