/* openai.c - OpenAI request validation, prompt preparation, SSE framing and responses
 * (see openai.h). Shapes follow the OpenAI API reference for chat.completion(.chunk) and
 * text_completion, with llama-server's extensions: a "timings" object, top_k, min_p,
 * repetition_penalty, ignore_eos, /tokenize and /detokenize.
 *
 * SSE frames are formatted by hand (a fixed head per job + an escaped delta) rather than
 * through jansson: they are written once per token and must cost microseconds. */
#include "openai.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "text/grammar.h"
#include "text/tokenizer.h"

/* ---- JSON string escaping ------------------------------------------------------------ */

void sbuf_json_str(struct strbuf *b, const char *s, size_t n) {
    static const char hex[] = "0123456789abcdef";
    strbuf_add(b, "\"", 1);
    size_t run = 0; /* start of the pending run of bytes that need no escape */
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c != '"' && c != '\\') continue;
        strbuf_add(b, s + run, i - run);
        run = i + 1;
        char esc[7] = {'\\', 0};
        switch (c) {
        case '"': esc[1] = '"'; break;
        case '\\': esc[1] = '\\'; break;
        case '\n': esc[1] = 'n'; break;
        case '\r': esc[1] = 'r'; break;
        case '\t': esc[1] = 't'; break;
        case '\b': esc[1] = 'b'; break;
        case '\f': esc[1] = 'f'; break;
        default:
            esc[1] = 'u', esc[2] = '0', esc[3] = '0', esc[4] = hex[c >> 4], esc[5] = hex[c & 15];
            strbuf_add(b, esc, 6);
            continue;
        }
        strbuf_add(b, esc, 2);
    }
    strbuf_add(b, s + run, n - run);
    strbuf_add(b, "\"", 1);
}

/* ---- errors --------------------------------------------------------------------------- */

/* The copy of api_quote; escape_ctl 0 keeps control characters (JSON escapes them) for
 * whole messages, whose newlines are meant. */
static const char *quote_text(char *dst, size_t cap, const char *src, size_t n, size_t max_chars,
                              int escape_ctl) {
    static const char hex[] = "0123456789abcdef";
    CHECK(cap >= 8);
    size_t o = 0, i = 0, chars = 0;
    while (i < n) {
        unsigned char c = (unsigned char)src[i];
        int k = utf8_char_len(src + i, n - i);
        size_t need = k > 0 ? (size_t)k : 4; /* a bad byte takes "\xNN" */
        int esc = k <= 0 || (escape_ctl && (c < 0x20 || c == 0x7f));
        if (esc) need = 4;
        if (chars == max_chars || o + need + 4 > cap) { /* room for "..." and the NUL */
            memcpy(dst + o, "...", 3);
            o += 3;
            break;
        }
        if (esc) {
            dst[o++] = '\\', dst[o++] = 'x', dst[o++] = hex[c >> 4], dst[o++] = hex[c & 15];
            i++;
        } else {
            memcpy(dst + o, src + i, need);
            o += need;
            i += need;
        }
        chars++;
    }
    dst[o] = 0;
    return dst;
}

const char *api_quote(char *dst, size_t cap, const char *src, size_t n, size_t max_chars) {
    return quote_text(dst, cap, src ? src : "", src ? n : 0, max_chars, 1);
}

json_t *api_error_json(const struct api_error *e) {
    char clean[3 * sizeof e->message];
    const char *msg = e->message;
    size_t ml = strnlen(e->message, sizeof e->message);
    if (utf8_validate(msg, ml, NULL) < 0) msg = quote_text(clean, sizeof clean, msg, ml, (size_t)-1, 0);
    if (e->ollama) return json_pack("{s:s}", "error", msg);
    return json_pack("{s:{s:s,s:s,s:o,s:o}}", "error", "message", msg, "type",
                     e->type ? e->type : "invalid_request_error", "param",
                     e->param[0] ? json_string(e->param) : json_null(), "code",
                     e->code ? json_string(e->code) : json_null());
}

/* A client string quoted in a message: at most 64 characters, escaped (a compound literal
 * buffer, alive to the end of the enclosing block). */
#define QUOTE(s) api_quote((char[256]){0}, 256, (s), strlen(s), 64)

static int bad(struct api_error *e, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int bad(struct api_error *e, const char *param, const char *fmt, ...) {
    e->status = 400;
    e->type = "invalid_request_error";
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    if (n >= (int)sizeof e->message) { /* cut: drop a character the cut went through */
        size_t len = sizeof e->message - 1, k = len;
        while (k > 0 && len - k < 4 && ((unsigned char)e->message[k - 1] & 0xC0) == 0x80) k--;
        if (k > 0 && (unsigned char)e->message[k - 1] >= 0xC0 &&
            utf8_char_len(e->message + k - 1, len - (k - 1)) < 0)
            e->message[k - 1] = 0;
    }
    return -1;
}

static json_t *parse_body(const char *body, size_t len, struct api_error *e) {
    if (!body || len == 0) {
        bad(e, NULL, "the request body is empty; expected a JSON object");
        return NULL;
    }
    json_error_t je;
    json_t *v = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
    if (!v) {
        char q[2 * JSON_ERROR_TEXT_LENGTH];
        bad(e, NULL, "invalid JSON at line %d, column %d (byte %d): %s", je.line, je.column,
            je.position, api_quote(q, sizeof q, je.text, strlen(je.text), sizeof q));
        return NULL;
    }
    if (!json_is_object(v)) {
        json_decref(v);
        bad(e, NULL, "the request body must be a JSON object");
        return NULL;
    }
    return v;
}

/* Optional fields: 0 absent or null, 1 present (out set), -1 bad (e set). */
static int get_number(const json_t *rq, const char *k, double lo, double hi, int lo_open,
                      double *out, struct api_error *e) {
    const json_t *v = json_object_get(rq, k);
    if (!v || json_is_null(v)) return 0;
    double x = json_number_value(v);
    if (!json_is_number(v) || !isfinite(x) || x > hi || (lo_open ? x <= lo : x < lo))
        return bad(e, k, "'%s' must be a number %s %g and <= %g", k, lo_open ? ">" : ">=", lo, hi);
    *out = x;
    return 1;
}

static int get_int(const json_t *rq, const char *k, long long lo, long long hi, long long *out,
                   struct api_error *e) {
    const json_t *v = json_object_get(rq, k);
    if (!v || json_is_null(v)) return 0;
    long long x;
    if (json_is_integer(v)) x = json_integer_value(v);
    else if (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)) &&
             fabs(json_real_value(v)) < 9e15)
        x = (long long)json_real_value(v);
    else return bad(e, k, "'%s' must be an integer", k);
    if (x < lo || x > hi) return bad(e, k, "'%s' must be between %lld and %lld", k, lo, hi);
    *out = x;
    return 1;
}

static int get_bool(const json_t *rq, const char *k, int *out, struct api_error *e) {
    const json_t *v = json_object_get(rq, k);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_boolean(v)) return bad(e, k, "'%s' must be a boolean", k);
    *out = json_is_true(v);
    return 1;
}

static uint64_t next_rand(uint64_t *rng, pthread_mutex_t *mu) {
    pthread_mutex_lock(mu);
    uint64_t z = (*rng += 0x9e3779b97f4a7c15ull);
    pthread_mutex_unlock(mu);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* ---- constrained decoding: response_format, json_schema, grammar, tool_choice ----------- */

/* response_format {type: text | json_object | json_schema {name, schema, strict}}, and
 * llama-server's json_schema (a schema) and grammar (GBNF: refused) fields. */
static int parse_response_format(struct job *j, const json_t *rq, struct api_error *e) {
    const json_t *v = json_object_get(rq, "response_format");
    if (v && !json_is_null(v)) {
        const char *t = json_string_value(json_object_get(v, "type"));
        if (!json_is_object(v) || !t)
            return bad(e, "response_format", "'response_format' must be an object with a 'type'");
        j->rf_param = "response_format";
        if (!strcmp(t, "json_object")) {
            j->rf_json_object = 1;
        } else if (!strcmp(t, "json_schema")) {
            const json_t *js = json_object_get(v, "json_schema");
            if (!json_is_object(js))
                return bad(e, "response_format", "response_format type 'json_schema' needs a "
                           "'json_schema' object ({\"name\", \"schema\", \"strict\"})");
            const json_t *st = json_object_get(js, "strict");
            if (st && !json_is_null(st) && !json_is_boolean(st))
                return bad(e, "response_format", "'response_format.json_schema.strict' must be a boolean");
            j->rf_schema = json_object_get(js, "schema");
            if (!j->rf_schema || json_is_null(j->rf_schema))
                return bad(e, "response_format", "'response_format.json_schema.schema' is required");
        } else if (strcmp(t, "text") != 0) {
            return bad(e, "response_format", "response_format type '%s' is not one of text, "
                       "json_object, json_schema", QUOTE(t));
        }
    }
    v = json_object_get(rq, "json_schema"); /* llama-server */
    if (v && !json_is_null(v)) {
        if (j->rf_schema || j->rf_json_object)
            return bad(e, "json_schema", "give either 'json_schema' or 'response_format', not both");
        j->rf_schema = v;
        j->rf_param = "json_schema";
    }
    v = json_object_get(rq, "grammar"); /* llama-server: GBNF */
    if (v && !json_is_null(v) && !(json_is_string(v) && json_string_length(v) == 0)) {
        if (!json_is_string(v)) return bad(e, "grammar", "'grammar' must be a string (GBNF)");
        if (j->rf_schema || j->rf_json_object)
            return bad(e, "grammar", "give either 'grammar' or 'response_format' / 'json_schema', not both");
        if (strlen(json_string_value(v)) != json_string_length(v))
            return bad(e, "grammar", "'grammar' holds a NUL byte");
        j->rf_gbnf = json_string_value(v);
        j->rf_param = "grammar";
    }
    return 0;
}

/* tool_choice "auto" | "none" | "required" | {"type":"function","function":{"name"}} and
 * parallel_tool_calls; *drop_tools for "none". */
static int parse_tool_choice(struct job *j, const json_t *rq, int *drop_tools, struct api_error *e) {
    const json_t *tc = json_object_get(rq, "tool_choice");
    j->parallel_calls = 1;
    if (get_bool(rq, "parallel_tool_calls", &j->parallel_calls, e) < 0) return -1;
    if (!tc || json_is_null(tc)) return 0;
    const char *s = json_string_value(tc);
    if (s && !strcmp(s, "none")) {
        *drop_tools = 1;
        return 0;
    }
    if (s && !strcmp(s, "auto")) return 0;
    if (s && !strcmp(s, "required")) {
        j->tools_required = 1;
    } else if (json_is_object(tc)) {
        const char *name = json_string_value(json_object_get(json_object_get(tc, "function"), "name"));
        if (!name)
            return bad(e, "tool_choice", "'tool_choice' as an object must be {\"type\": \"function\", "
                       "\"function\": {\"name\": ...}}");
        int found = 0;
        for (size_t i = 0; j->tools && i < json_array_size(j->tools); i++) {
            const char *n = json_string_value(json_object_get(json_object_get(json_array_get(j->tools, i), "function"), "name"));
            if (n && !strcmp(n, name)) found = 1;
        }
        if (!found)
            return bad(e, "tool_choice", "'tool_choice' names the function '%s', which is not in "
                       "'tools'", QUOTE(name));
        j->tool_name = name;
    } else {
        return bad(e, "tool_choice", "'tool_choice' must be \"auto\", \"none\", \"required\" or "
                   "{\"type\": \"function\", \"function\": {\"name\": ...}}");
    }
    if (!j->tools)
        return bad(e, "tool_choice", "'tool_choice' asks for a tool call but 'tools' is empty");
    return 0;
}

/* The token table of a tokenizer (every non-special token's bytes) with the model's vocab_size
 * rows, made once per tokenizer: the trie and the built-in rules' classes live in it. */
static struct grammar_vocab *vocab_for(const struct tokenizer *tok, const struct model *m) {
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    static struct {
        const struct tokenizer *tok;
        int n;
        struct grammar_vocab *v;
    } slot[4];
    const struct config *c = model_config(m);
    const int n = c->vocab_size;
    pthread_mutex_lock(&mu);
    for (int i = 0; i < 4; i++)
        if (slot[i].v && slot[i].tok == tok && slot[i].n == n) {
            pthread_mutex_unlock(&mu);
            return slot[i].v;
        }
    const char **bytes = xcalloc((size_t)n, sizeof *bytes);
    size_t *len = xcalloc((size_t)n, sizeof *len);
    for (int i = 0; i < n && i < tokenizer_vocab_size(tok); i++)
        if (!tokenizer_is_special(tok, i)) bytes[i] = tokenizer_token_bytes(tok, i, &len[i]);
    int32_t stop[ENGINE_MAX_EOS + 2];
    int n_stop = 0;
    for (int i = 0; i < c->n_eos_token_id && n_stop < ENGINE_MAX_EOS; i++) stop[n_stop++] = c->eos_token_id[i];
    stop[n_stop++] = tokenizer_token_id(tok, "<|im_end|>");
    stop[n_stop++] = tokenizer_token_id(tok, "<|endoftext|>");
    struct grammar_vocab *v = grammar_vocab_new(n, bytes, len, stop, n_stop);
    free(bytes);
    free(len);
    int k = 0;
    for (int i = 0; i < 4; i++)
        if (!slot[i].v) k = i;
    /* a fifth tokenizer (tests only) replaces a slot; the vocabulary it held is kept (a job may
     * still use it) */
    slot[k].tok = tok, slot[k].n = n, slot[k].v = v;
    pthread_mutex_unlock(&mu);
    return v;
}

/* Compiled grammars by their spec, so that a repeated schema keeps its per-state caches. */
#define GRAMMAR_CACHE 16
static struct grammar *grammar_cached(const struct grammar_spec *sp, struct error *err) {
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    static char *keys[GRAMMAR_CACHE];
    static struct grammar *gs[GRAMMAR_CACHE];
    static int next;
    json_t *k = json_pack("{s:O?,s:i,s:s?,s:O?,s:s?,s:i,s:i,s:i}", "schema", sp->schema,
                          "json_object", sp->json_object, "gbnf", sp->gbnf, "tools", sp->tools,
                          "tool_name", sp->tool_name, "required", sp->tools_required, "parallel",
                          sp->parallel, "think", sp->after_think);
    char *key = k ? json_dumps(k, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
    json_decref(k);
    pthread_mutex_lock(&mu);
    for (int i = 0; key && i < GRAMMAR_CACHE; i++)
        if (keys[i] && !strcmp(keys[i], key)) {
            grammar_ref(gs[i]);
            pthread_mutex_unlock(&mu);
            free(key);
            return gs[i];
        }
    pthread_mutex_unlock(&mu);
    struct grammar *g = grammar_compile(sp, err);
    if (!g || !key) {
        free(key);
        return g;
    }
    pthread_mutex_lock(&mu);
    int i = next++ % GRAMMAR_CACHE;
    free(keys[i]);
    grammar_unref(gs[i]);
    keys[i] = key;
    gs[i] = g;
    grammar_ref(g);
    pthread_mutex_unlock(&mu);
    return g;
}

/* The matcher of a request that asks for structured output or a tool call; 0 when none does. */
static int setup_grammar(struct job *j, const struct model *m, const struct tokenizer *tok,
                         struct api_error *e) {
    const int content = j->rf_schema || j->rf_json_object || j->rf_gbnf;
    const int calls = j->is_chat && j->tools && (j->tools_required || j->tool_name);
    if (!content && !calls) return 0;
    struct grammar_spec sp = {
        .schema = j->rf_schema,
        .json_object = j->rf_json_object,
        .gbnf = j->rf_gbnf,
        .tools = j->is_chat ? j->tools : NULL, /* with tool_choice auto: a call or the content */
        .tool_name = j->tool_name,
        .tools_required = j->tools_required,
        .parallel = j->parallel_calls,
        .after_think = j->in_thinking,
    };
    struct error err;
    struct grammar *g = grammar_cached(&sp, &err);
    if (!g && !calls && sp.tools && !strncmp(err.msg, "tools", 5)) { /* auto: content alone then */
        sp.tools = NULL;
        g = grammar_cached(&sp, &err);
    }
    if (!g) {
        const int tool_err = !strncmp(err.msg, "tools", 5);
        return bad(e, tool_err ? "tools" : j->rf_param, "%s%s", tool_err || j->rf_gbnf ? "" :
                   !strcmp(j->rf_param, "json_schema") ? "json_schema: " : "response_format.json_schema.",
                   err.msg);
    }
    j->grammar = g;
    j->gvocab = vocab_for(tok, m);
    j->matcher = grammar_matcher_new(g, j->gvocab, j->in_thinking ? "</think>" : NULL);
    j->req.grammar = j->matcher;
    return 0;
}

void api_grammar_warmup(const struct model *m, const struct tokenizer *tok) {
    /* the token table and trie, and the built-in rules' per-state classes (strings, numbers,
     * whitespace, the literals) along one instance */
    struct grammar_vocab *v = vocab_for(tok, m);
    json_t *schema = json_loads("{\"type\":\"object\",\"properties\":{\"s\":{\"type\":\"string\"},"
                                "\"n\":{\"type\":\"number\"},\"i\":{\"type\":\"integer\"},"
                                "\"b\":{\"type\":\"boolean\"},\"a\":{\"type\":\"array\","
                                "\"items\":{\"type\":[\"string\",\"null\"]}}},"
                                "\"required\":[\"s\",\"n\",\"i\",\"b\",\"a\"]}", 0, NULL);
    struct grammar_spec sp = {.schema = schema};
    struct error err;
    struct grammar *g = schema ? grammar_compile(&sp, &err) : NULL;
    if (g) {
        static const char inst[] = "{\"s\": \"a b\\n\", \"n\": -1.5e3, \"i\": 42, \"b\": true, \"a\": [\"x\", null]}";
        struct grammar_matcher *mt = grammar_matcher_new(g, v, NULL);
        uint64_t *bits = xmalloc(grammar_mask_words(v) * sizeof *bits);
        for (size_t k = 0; k < sizeof inst - 1; k++) {
            (void)grammar_matcher_mask(mt, bits, 0);
            if (grammar_matcher_accept_bytes(mt, inst + k, 1) != 0) break;
        }
        free(bits);
        grammar_matcher_free(mt);
        grammar_unref(g);
    }
    json_decref(schema);
}

/* ---- logprobs ------------------------------------------------------------------------- */

/* chat: logprobs (boolean) + top_logprobs (0..20); completions: logprobs (0..20, the number of
 * alternatives). */
static int parse_logprobs(struct job *j, const json_t *rq, struct api_error *e) {
    long long n = 0;
    int r;
    if (j->is_chat) {
        int on = 0;
        if (get_bool(rq, "logprobs", &on, e) < 0) return -1;
        if ((r = get_int(rq, "top_logprobs", 0, ENGINE_MAX_TOP_LOGPROBS, &n, e)) < 0) return -1;
        if (r && !on) return bad(e, "top_logprobs", "'top_logprobs' needs 'logprobs': true");
        j->req.logprobs = on;
        j->req.top_logprobs = (int)n;
        return 0;
    }
    const json_t *v = json_object_get(rq, "logprobs");
    if (json_is_boolean(v)) /* llama-server style: true = the chosen tokens only */
        return j->req.logprobs = json_is_true(v), 0;
    if ((r = get_int(rq, "logprobs", 0, ENGINE_MAX_TOP_LOGPROBS, &n, e)) < 0) return -1;
    j->req.logprobs = r;
    j->req.top_logprobs = (int)n;
    return 0;
}

/* A token's bytes as text (invalid UTF-8 as U+FFFD) and as OpenAI's "bytes" list. */
static json_t *token_text(const struct tokenizer *tok, int32_t id, json_t **bytes_out) {
    size_t n;
    const char *b = tokenizer_token_bytes(tok, id, &n);
    if (!b) n = 0;
    struct strbuf s = {0};
    strbuf_add(&s, "", 0);
    json_t *bytes = json_array();
    for (size_t i = 0; i < n;) {
        int k = utf8_char_len(b + i, n - i);
        if (k > 0) strbuf_add(&s, b + i, (size_t)k);
        else strbuf_adds(&s, "\xEF\xBF\xBD"), k = 1;
        for (int q = 0; q < k; q++) json_array_append_new(bytes, json_integer((unsigned char)b[i + q]));
        i += (size_t)k;
    }
    json_t *t = json_stringn(s.s, s.len);
    free(s.s);
    if (bytes_out) *bytes_out = bytes;
    else json_decref(bytes);
    return t;
}

/* chat: {"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]} */
static json_t *chat_lp_entry(const struct job *j, const struct engine_event *ev) {
    json_t *bytes, *tops = json_array();
    json_t *t = token_text(j->tok, ev->id, &bytes);
    for (int i = 0; i < ev->n_top && i < j->req.top_logprobs; i++) {
        json_t *tb, *tt = token_text(j->tok, ev->top_ids[i], &tb);
        json_array_append_new(tops, json_pack("{s:o,s:f,s:o}", "token", tt, "logprob",
                                              (double)ev->top_logprobs[i], "bytes", tb));
    }
    return json_pack("{s:o,s:f,s:o,s:o}", "token", t, "logprob", (double)ev->logprob, "bytes", bytes,
                     "top_logprobs", tops);
}

/* completions: appends one token to {"tokens", "token_logprobs", "top_logprobs", "text_offset"} */
static void cmpl_lp_add(const struct job *j, json_t *lp, const struct engine_event *ev, size_t offset) {
    json_array_append_new(json_object_get(lp, "tokens"), token_text(j->tok, ev->id, NULL));
    json_array_append_new(json_object_get(lp, "token_logprobs"), json_real(ev->logprob));
    json_t *tops = json_object();
    for (int i = 0; i < ev->n_top && i < j->req.top_logprobs; i++) {
        json_t *tt = token_text(j->tok, ev->top_ids[i], NULL);
        if (!json_object_get(tops, json_string_value(tt)))
            json_object_set_new(tops, json_string_value(tt), json_real(ev->top_logprobs[i]));
        json_decref(tt);
    }
    json_array_append_new(json_object_get(lp, "top_logprobs"), tops);
    json_array_append_new(json_object_get(lp, "text_offset"), json_integer((json_int_t)offset));
}

static json_t *cmpl_lp_new(void) {
    return json_pack("{s:[],s:[],s:[],s:[]}", "tokens", "token_logprobs", "top_logprobs", "text_offset");
}

/* Sampling (over the checkpoint's generation_config.json defaults), limits, stop strings,
 * stream flags: the fields both endpoints share. */
static int parse_common(struct job *j, const json_t *rq, const struct model *m, int ctx, int vocab,
                        uint64_t *rng, pthread_mutex_t *rng_mu, struct api_error *e) {
    struct sampler_params *sp = &j->req.sampling;
    engine_sampling_defaults(m, sp);
    double x = 0;
    long long n = 0;
    int b, r;
    if ((r = get_number(rq, "temperature", 0, 2, 0, &x, e)) < 0) return -1;
    if (r) sp->temperature = (float)x;
    if ((r = get_number(rq, "top_p", 0, 1, 1, &x, e)) < 0) return -1;
    if (r) sp->top_p = (float)x;
    if ((r = get_number(rq, "min_p", 0, 1, 0, &x, e)) < 0) return -1;
    if (r) sp->min_p = (float)x;
    if ((r = get_int(rq, "top_k", -1, 1 << 30, &n, e)) < 0) return -1;
    if (r) sp->top_k = n < 0 ? 0 : (int)n;
    if ((r = get_number(rq, "presence_penalty", -2, 2, 0, &x, e)) < 0) return -1;
    if (r) sp->presence_penalty = (float)x;
    if ((r = get_number(rq, "frequency_penalty", -2, 2, 0, &x, e)) < 0) return -1;
    if (r) sp->frequency_penalty = (float)x;
    if ((r = get_number(rq, "repetition_penalty", 0, 10, 1, &x, e)) < 0) return -1;
    if (r) sp->repetition_penalty = (float)x;
    if ((r = get_int(rq, "seed", INT64_MIN, INT64_MAX, &n, e)) < 0) return -1;
    sp->seed = r ? (uint64_t)n : next_rand(rng, rng_mu);

    j->req.max_tokens = j->is_chat ? 0 : 16; /* OpenAI: chat unlimited, completions 16 */
    if ((r = get_int(rq, "max_tokens", 1, 1 << 30, &n, e)) < 0) return -1;
    if (r) j->req.max_tokens = (int)n;
    if ((r = get_int(rq, "max_completion_tokens", 1, 1 << 30, &n, e)) < 0) return -1;
    if (r) j->req.max_tokens = (int)n;
    if ((r = get_int(rq, "n_predict", -1, 1 << 30, &n, e)) < 0) return -1; /* llama-server */
    if (r) j->req.max_tokens = n < 0 ? 0 : (int)n;
    (void)ctx;

    j->n_choices = 1;
    if ((r = get_int(rq, "n", 1, 16, &n, e)) < 0) return -1;
    if (r) j->n_choices = (int)n;
    (void)b;
    const json_t *v;
    if (parse_logprobs(j, rq, e)) return -1;
    if (parse_response_format(j, rq, e)) return -1;
    if (get_bool(rq, "ignore_eos", &j->req.ignore_eos, e) < 0) return -1;
    v = json_object_get(rq, "logit_bias");
    if (v && !json_is_null(v)) {
        if (!json_is_object(v))
            return bad(e, "logit_bias", "'logit_bias' must be an object of token id -> bias");
        size_t nb = json_object_size(v);
        j->bias_ids = xmalloc((nb ? nb : 1) * sizeof *j->bias_ids);
        j->bias_values = xmalloc((nb ? nb : 1) * sizeof *j->bias_values);
        const char *k;
        json_t *bv;
        int nbias = 0;
        json_object_foreach((json_t *)v, k, bv) {
            char *end;
            long id = strtol(k, &end, 10);
            if (*k == 0 || *end || id < 0 || id >= vocab)
                return bad(e, "logit_bias", "logit_bias key '%s' is not a token id in 0..%d",
                           QUOTE(k), vocab - 1);
            if (!json_is_number(bv) || json_number_value(bv) < -100 || json_number_value(bv) > 100)
                return bad(e, "logit_bias", "logit_bias values must be numbers in [-100, 100]");
            j->bias_ids[nbias] = (int32_t)id;
            j->bias_values[nbias++] = (float)json_number_value(bv);
        }
        sp->bias_ids = j->bias_ids;
        sp->bias_values = j->bias_values;
        sp->n_bias = nbias;
    }

    if (get_bool(rq, "stream", &j->stream, e) < 0) return -1;
    v = json_object_get(rq, "stream_options");
    if (v && !json_is_null(v)) {
        if (!json_is_object(v))
            return bad(e, "stream_options", "'stream_options' must be an object");
        const json_t *iu = json_object_get(v, "include_usage");
        if (iu && !json_is_null(iu)) {
            if (!json_is_boolean(iu))
                return bad(e, "stream_options.include_usage",
                           "'stream_options.include_usage' must be a boolean");
            j->include_usage = json_is_true(iu);
        }
    }

    v = json_object_get(rq, "stop");
    if (v && !json_is_null(v)) {
        const json_t *one[1] = {v};
        size_t count = json_is_array(v) ? json_array_size(v) : 1;
        if (!json_is_array(v) && !json_is_string(v))
            return bad(e, "stop", "'stop' must be a string or an array of strings");
        if (count > ENGINE_MAX_STOP)
            return bad(e, "stop", "'stop' may hold at most %d strings", ENGINE_MAX_STOP);
        for (size_t i = 0; i < count; i++) {
            const json_t *s = json_is_array(v) ? json_array_get(v, i) : one[0];
            if (!json_is_string(s) || json_string_length(s) == 0)
                return bad(e, "stop", "'stop' entries must be non-empty strings");
            if (json_string_length(s) > 256)
                return bad(e, "stop", "'stop' strings may be at most 256 bytes");
            j->stops[j->req.n_stop] = xstrdup(json_string_value(s));
            j->req.stop[j->req.n_stop] = j->stops[j->req.n_stop];
            j->req.n_stop++;
        }
    }
    return 0;
}

/* OpenAI's developer role is a system-level instruction: in a copy of rq, a first message of
 * that role becomes the template's system message. NULL when there is none (use rq). */
static json_t *developer_as_system(const json_t *rq) {
    const json_t *m0 = json_array_get(json_object_get(rq, "messages"), 0);
    const char *role = json_string_value(json_object_get(m0, "role"));
    if (!role || strcmp(role, "developer") != 0) return NULL;
    json_t *copy = json_deep_copy(rq);
    json_object_set_new(json_array_get(json_object_get(copy, "messages"), 0), "role", json_string("system"));
    return copy;
}

static int check_model_name(const json_t *rq, struct api_error *e) {
    const json_t *v = json_object_get(rq, "model");
    if (v && !json_is_null(v) && !json_is_string(v))
        return bad(e, "model", "'model' must be a string");
    return 0;
}

/* Chat: messages + tools through the chat template. *prompt is malloc'd. */
static int prepare_chat(struct job *j, const struct chat_template *tmpl, char **prompt,
                        struct api_error *e) {
    json_t *rq = j->request;
    const json_t *msgs = json_object_get(rq, "messages");
    if (!msgs || json_is_null(msgs)) return bad(e, "messages", "'messages' is required");
    if (!json_is_array(msgs) || json_array_size(msgs) == 0)
        return bad(e, "messages", "'messages' must be a non-empty array");
    for (size_t i = 0; i < json_array_size(msgs); i++) {
        const json_t *m = json_array_get(msgs, i);
        const char *role = json_string_value(json_object_get(m, "role"));
        if (!json_is_object(m) || !role)
            return bad(e, "messages", "messages[%zu] must be an object with a string 'role'", i);
        if (strcmp(role, "system") && strcmp(role, "user") && strcmp(role, "assistant") &&
            strcmp(role, "tool") && strcmp(role, "developer"))
            return bad(e, "messages", "messages[%zu].role '%s' is not one of system, developer, "
                       "user, assistant, tool", i, QUOTE(role));
        if (i > 0 && (!strcmp(role, "system") || !strcmp(role, "developer")))
            return bad(e, "messages", "messages[%zu] is a %s message: System message must be at "
                       "the beginning (the Qwen3.5 chat template takes one system or developer "
                       "message, the first)", i, role);

        const json_t *c = json_object_get(m, "content");
        if (c && !json_is_null(c) && !json_is_string(c) && !json_is_array(c))
            return bad(e, "messages", "messages[%zu].content must be a string, an array of parts "
                       "or null", i);
        for (size_t k = 0; json_is_array(c) && k < json_array_size(c); k++) {
            const char *type = json_string_value(json_object_get(json_array_get(c, k), "type"));
            if (!type)
                return bad(e, "messages", "messages[%zu].content[%zu] must be an object with a "
                           "'type'", i, k);
            if (strcmp(type, "text") != 0)
                return bad(e, "messages", "messages[%zu].content[%zu]: '%s' parts are not "
                           "supported (strata runs the text model only)", i, k, QUOTE(type));
        }
    }
    const json_t *tools = json_object_get(rq, "tools");
    if (tools && !json_is_null(tools)) {
        if (!json_is_array(tools)) return bad(e, "tools", "'tools' must be an array");
        for (size_t i = 0; i < json_array_size(tools); i++) {
            const json_t *t = json_array_get(tools, i);
            const json_t *f = json_object_get(t, "function");
            if (!json_is_object(t) || !json_is_object(f) ||
                !json_is_string(json_object_get(f, "name")))
                return bad(e, "tools", "tools[%zu] must be {\"type\":\"function\",\"function\":"
                           "{\"name\":...}}", i);
        }
        if (json_array_size(tools) > 0) j->tools = tools;
    }
    int drop_tools = 0;
    if (parse_tool_choice(j, rq, &drop_tools, e)) return -1;
    const json_t *kw = json_object_get(rq, "chat_template_kwargs");
    if (kw && !json_is_null(kw)) {
        if (!json_is_object(kw))
            return bad(e, "chat_template_kwargs", "'chat_template_kwargs' must be an object");
        const json_t *et = json_object_get(kw, "enable_thinking");
        if (et && !json_is_boolean(et))
            return bad(e, "chat_template_kwargs.enable_thinking",
                       "'chat_template_kwargs.enable_thinking' must be a boolean");
    }
    json_t *render_rq = developer_as_system(rq);
    if (!render_rq) render_rq = rq;
    if (drop_tools) {
        if (render_rq == rq) render_rq = json_copy(rq);
        json_object_del(render_rq, "tools");
        j->tools = NULL;
    }
    struct error err;
    int rc = chat_continues_final(render_rq) ? chat_render_continued(tmpl, render_rq, prompt, &err)
                                             : chat_render(tmpl, render_rq, prompt, &err);
    if (render_rq != rq) json_decref(render_rq);
    if (rc != 0) return bad(e, "messages", "%s", err.msg);
    j->in_thinking = chat_prompt_opens_thinking(*prompt);
    return 0;
}

/* Completions: prompt as a string, [string], [ids] or [[ids]]. */
static int prepare_completion(struct job *j, struct tokenizer *tok, int vocab,
                              struct api_error *e) {
    int echo = 0;
    long long best_of = 1;
    if (get_bool(j->request, "echo", &echo, e) < 0) return -1;
    if (echo) return bad(e, "echo", "'echo' is not supported");
    if (get_int(j->request, "best_of", 1, 1 << 20, &best_of, e) < 0) return -1;
    if (best_of != 1) return bad(e, "best_of", "'best_of' must be 1");
    const json_t *sfx = json_object_get(j->request, "suffix");
    if (sfx && !json_is_null(sfx) && !(json_is_string(sfx) && json_string_length(sfx) == 0))
        return bad(e, "suffix", "'suffix' (fill-in-the-middle) is not supported");
    const json_t *p = json_object_get(j->request, "prompt");
    if (!p || json_is_null(p)) return bad(e, "prompt", "'prompt' is required");
    if (json_is_array(p) && json_array_size(p) == 1 &&
        (json_is_string(json_array_get(p, 0)) || json_is_array(json_array_get(p, 0))))
        p = json_array_get(p, 0);
    else if (json_is_array(p) && json_array_size(p) > 0 && !json_is_integer(json_array_get(p, 0)))
        return bad(e, "prompt", "one prompt per request is supported");
    if (json_is_string(p)) {
        struct error err;
        if (tokenizer_encode(tok, json_string_value(p), json_string_length(p), &j->ids, &j->n_ids,
                             &err) != 0)
            return bad(e, "prompt", "%s", err.msg);
        return 0;
    }
    if (!json_is_array(p))
        return bad(e, "prompt", "'prompt' must be a string or an array of token ids");
    j->n_ids = (int)json_array_size(p);
    j->ids = xmalloc((size_t)(j->n_ids ? j->n_ids : 1) * sizeof *j->ids);
    for (int i = 0; i < j->n_ids; i++) {
        const json_t *v = json_array_get(p, (size_t)i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= vocab)
            return bad(e, "prompt", "prompt[%d] must be a token id in 0..%d", i, vocab - 1);
        j->ids[i] = (int32_t)json_integer_value(v);
    }
    return 0;
}

struct job *api_job_new(struct model *m, struct tokenizer *tok, const struct chat_template *tmpl,
                        const char *model_name, int is_chat, const char *body, size_t len,
                        uint64_t *rng, pthread_mutex_t *rng_mu, int allow_forced,
                        struct api_error *e) {
    json_t *rq = parse_body(body, len, e);
    if (!rq) return NULL;
    return api_job_new_json(m, tok, tmpl, model_name, is_chat, rq, rng, rng_mu, allow_forced, e);
}

json_t *api_parse_body(const char *body, size_t len, struct api_error *e) {
    return parse_body(body, len, e);
}

struct job *api_job_new_json(struct model *m, struct tokenizer *tok,
                             const struct chat_template *tmpl, const char *model_name,
                             int is_chat, json_t *rq, uint64_t *rng, pthread_mutex_t *rng_mu,
                             int allow_forced, struct api_error *e) {
    struct job *j = xcalloc(1, sizeof *j);
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    j->refs = 1;
    j->fd = -1;
    j->is_chat = is_chat;
    j->request = rq;
    j->tok = tok;
    snprintf(j->model_name, sizeof j->model_name, "%s", model_name);
    const int ctx = model_ctx(m);
    if (check_model_name(rq, e) || parse_common(j, rq, m, ctx, model_config(m)->vocab_size, rng, rng_mu, e)) goto fail;
    if (is_chat) {
        char *prompt = NULL;
        if (prepare_chat(j, tmpl, &prompt, e)) {
            free(prompt);
            goto fail;
        }
        struct error err;
        int rc = tokenizer_encode(tok, prompt, strlen(prompt), &j->ids, &j->n_ids, &err);
        free(prompt);
        if (rc != 0) {
            bad(e, "messages", "%s", err.msg);
            goto fail;
        }
    } else if (prepare_completion(j, tok, model_config(m)->vocab_size, e)) {
        goto fail;
    }
    if (j->n_ids == 0) {
        bad(e, is_chat ? "messages" : "prompt", "the prompt is empty");
        goto fail;
    }
    if (j->n_ids >= ctx) {
        bad(e, is_chat ? "messages" : "prompt",
            "the prompt has %d tokens but the context holds %d (prompt + at least 1 generated "
            "token must fit)", j->n_ids, ctx);
        e->code = "context_length_exceeded";
        goto fail;
    }
    j->req.prompt = j->ids;
    j->req.n_prompt = j->n_ids;
    if (setup_grammar(j, m, tok, e)) goto fail;
    const json_t *fo = json_object_get(rq, "strata_forced_output");
    if (fo && !json_is_null(fo)) {
        struct error err;
        int nf = 0;
        if (!allow_forced) {
            bad(e, "strata_forced_output", "'strata_forced_output' needs a server started with "
                "--test-forced-output");
            goto fail;
        }
        if (!json_is_string(fo)) {
            bad(e, "strata_forced_output", "'strata_forced_output' must be a string");
            goto fail;
        }
        if (tokenizer_encode(tok, json_string_value(fo), json_string_length(fo), &j->forced, &nf,
                             &err) != 0) {
            bad(e, "strata_forced_output", "%s", err.msg);
            goto fail;
        }
        j->forced = xrealloc(j->forced, (size_t)(nf + 1) * sizeof *j->forced);
        j->forced[nf++] = tokenizer_token_id(tok, "<|im_end|>");
        j->req.forced = j->forced;
        j->req.n_forced = nf;
    }

    static const char alnum[] = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
    uint64_t r1 = next_rand(rng, rng_mu), r2 = next_rand(rng, rng_mu);
    char rnd[25];
    for (int i = 0; i < 24; i++) {
        uint64_t *r = i < 12 ? &r1 : &r2;
        rnd[i] = alnum[*r % 62];
        *r /= 62;
    }
    rnd[24] = 0;
    snprintf(j->id, sizeof j->id, "%s-%s", is_chat ? "chatcmpl" : "cmpl", rnd);
    j->created = (long)time(NULL);
    struct strbuf h = {0};
    strbuf_printf(&h, "data: {\"id\":\"%s\",\"object\":\"%s\",\"created\":%ld,\"model\":", j->id,
                is_chat ? "chat.completion.chunk" : "text_completion", j->created);
    sbuf_json_str(&h, j->model_name, strlen(j->model_name));
    strbuf_adds(&h, ",\"system_fingerprint\":\"strata\",\"choices\":[{\"index\":");
    j->chunk_base_len = h.len;
    strbuf_adds(&h, "0,               "); /* room for any choice's index (set_choice_head) */
    h.s[j->chunk_base_len + 2] = 0;
    j->chunk_head = h.s;
    return j;
fail:
    api_job_free(j);
    return NULL;
}

void api_job_free(struct job *j) {
    if (!j) return;
    grammar_matcher_free(j->matcher);
    grammar_unref(j->grammar);
    for (int i = 0; i < j->n_done; i++) {
        free(j->choices[i].text);
        json_decref(j->choices[i].lp);
    }
    free(j->choices);
    json_decref(j->lp);
    json_decref(j->request);
    free(j->ids);
    free(j->forced);
    free(j->bias_ids);
    free(j->bias_values);
    for (int i = 0; i < j->req.n_stop; i++) free(j->stops[i]);
    free(j->chunk_head);
    free(j->out.s);
    free(j->text.s);
    if (j->cs) chat_stream_free(j->cs);
    if (j->proto && j->proto->free) j->proto->free(j->proto_state);
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->cv);
    free(j);
}

/* ---- SSE framing (engine thread, j->mu held) ------------------------------------------ */

static void frame_end(struct job *j) { strbuf_adds(&j->out, "},\"logprobs\":null,\"finish_reason\":null}]}\n\n"); }

static void frame_chat_start(struct job *j) {
    strbuf_adds(&j->out, j->chunk_head);
    strbuf_adds(&j->out, "\"delta\":{");
    if (!j->sent_first) {
        strbuf_adds(&j->out, "\"role\":\"assistant\",");
        j->sent_first = 1;
    }
}

static void on_chat_delta(void *user, const struct chat_delta *d) {
    struct job *j = user;
    if (j->proto) {
        j->proto->delta(j, d);
        return;
    }
    switch (d->kind) {
    case CHAT_DELTA_CONTENT:
    case CHAT_DELTA_REASONING:
        if (d->len == 0) return;
        frame_chat_start(j);
        strbuf_adds(&j->out, d->kind == CHAT_DELTA_CONTENT ? "\"content\":" : "\"reasoning_content\":");
        sbuf_json_str(&j->out, d->text, d->len);
        break;
    case CHAT_DELTA_TOOL_START:
        frame_chat_start(j);
        strbuf_printf(&j->out, "\"tool_calls\":[{\"index\":%d,\"id\":", d->index);
        sbuf_json_str(&j->out, d->id, strlen(d->id));
        strbuf_adds(&j->out, ",\"type\":\"function\",\"function\":{\"name\":");
        sbuf_json_str(&j->out, d->name, strlen(d->name));
        strbuf_adds(&j->out, ",\"arguments\":\"\"}}]");
        if (d->index + 1 > j->n_tool_calls) j->n_tool_calls = d->index + 1;
        break;
    case CHAT_DELTA_TOOL_ARGS:
        if (d->len == 0) return;
        frame_chat_start(j);
        strbuf_printf(&j->out, "\"tool_calls\":[{\"index\":%d,\"function\":{\"arguments\":", d->index);
        sbuf_json_str(&j->out, d->text, d->len);
        strbuf_adds(&j->out, "}}]");
        break;
    }
    frame_end(j);
}

static void frame_completion_text(struct job *j, const char *text, size_t len) {
    strbuf_adds(&j->out, j->chunk_head);
    strbuf_adds(&j->out, "\"text\":");
    sbuf_json_str(&j->out, text, len);
    strbuf_adds(&j->out, ",\"logprobs\":null,\"finish_reason\":null}]}\n\n");
}

static void flush_out(struct job *j) {
    if (j->sink && j->out.len) {
        j->sink(j->sink_user, j->out.s, j->out.len);
        j->out.len = 0;
    }
    pthread_cond_signal(&j->cv);
}

static int job_emit(void *user, const struct engine_event *ev) {
    struct job *j = user;
    const double t_in = now_ms();
    if (ev->id >= 0 && ev->n_generated == 1) j->t_first = t_in;
    pthread_mutex_lock(&j->mu);
    const size_t offset = j->text.len;
    if (ev->len) strbuf_add(&j->text, ev->text, ev->len);
    const int lp = j->req.logprobs && ev->id >= 0;
    if (lp && !j->stream) { /* kept for the response */
        if (!j->lp) j->lp = j->is_chat ? json_array() : cmpl_lp_new();
        if (j->is_chat) json_array_append_new(j->lp, chat_lp_entry(j, ev));
        else cmpl_lp_add(j, j->lp, ev, offset);
    }
    if (j->stream) {
        size_t before = j->out.len;
        if (j->is_chat) {
            chat_stream_push(j->cs, ev->text, ev->len);
            if (ev->id >= 0 && !j->sent_first && !j->proto) { /* the first event leaves with the first token */
                frame_chat_start(j);
                strbuf_adds(&j->out, "\"content\":\"\"");
                frame_end(j);
            }
            if (lp) { /* the token's logprobs in a chunk of their own */
                json_t *en = chat_lp_entry(j, ev);
                char *s = json_dumps(en, JSON_COMPACT);
                json_decref(en);
                strbuf_adds(&j->out, j->chunk_head);
                strbuf_adds(&j->out, "\"delta\":{},\"logprobs\":{\"content\":[");
                strbuf_adds(&j->out, s);
                strbuf_adds(&j->out, "]},\"finish_reason\":null}]}\n\n");
                free(s);
            }
        } else if (j->proto) {
            if (ev->len) j->proto->text(j, ev->text, ev->len);
        } else if (lp) {
            json_t *o = cmpl_lp_new();
            cmpl_lp_add(j, o, ev, offset);
            char *s = json_dumps(o, JSON_COMPACT);
            json_decref(o);
            strbuf_adds(&j->out, j->chunk_head);
            strbuf_adds(&j->out, "\"text\":");
            sbuf_json_str(&j->out, ev->text, ev->len);
            strbuf_adds(&j->out, ",\"logprobs\":");
            strbuf_adds(&j->out, s);
            strbuf_adds(&j->out, ",\"finish_reason\":null}]}\n\n");
            free(s);
        } else if (ev->len || (ev->id >= 0 && ev->n_generated == 1)) {
            frame_completion_text(j, ev->text, ev->len);
        }
        if (j->out.len != before) flush_out(j);
    }
    pthread_mutex_unlock(&j->mu);
    j->emit_ms += now_ms() - t_in;
    return atomic_load(&j->cancel) || (j->stopping && atomic_load(j->stopping));
}

static const char *finish_reason(enum engine_finish f, int n_tool_calls, int truncated) {
    if (f == ENGINE_FINISH_LENGTH || truncated) return "length";
    if (n_tool_calls > 0) return "tool_calls";
    return "stop"; /* also for "cancelled": nobody reads it */
}

static void timings_append(struct strbuf *b, const struct engine_timings *t) {
    strbuf_printf(b, "\"timings\":{\"cache_n\":%d,\"prompt_n\":%d,\"prompt_ms\":%.3f,\"prompt_per_token_ms\":%.3f,"
                   "\"prompt_per_second\":%.3f,\"predicted_n\":%d,\"predicted_ms\":%.3f,"
                   "\"predicted_per_token_ms\":%.3f,\"predicted_per_second\":%.3f,"
                   "\"prompt_prepare_ms\":%.3f,\"prompt_feed_ms\":%.3f}",
                t->cache_n, t->prompt_n, t->prompt_ms, t->prompt_n ? t->prompt_ms / t->prompt_n : 0,
                t->prompt_per_second, t->predicted_n, t->predicted_ms,
                t->predicted_n ? t->predicted_ms / t->predicted_n : 0, t->predicted_per_second,
                t->prepare_ms, t->feed_ms);
}

static json_t *timings_json(const struct engine_timings *t) {
    return json_pack("{s:i,s:i,s:f,s:f,s:f,s:i,s:f,s:f,s:f,s:f,s:f}", "cache_n", t->cache_n, "prompt_n",
                     t->prompt_n, "prompt_ms",
                     t->prompt_ms, "prompt_per_token_ms",
                     t->prompt_n ? t->prompt_ms / t->prompt_n : 0.0, "prompt_per_second",
                     t->prompt_per_second, "predicted_n", t->predicted_n, "predicted_ms",
                     t->predicted_ms, "predicted_per_token_ms",
                     t->predicted_n ? t->predicted_ms / t->predicted_n : 0.0,
                     "predicted_per_second", t->predicted_per_second, "prompt_prepare_ms",
                     t->prepare_ms, "prompt_feed_ms", t->feed_ms);
}

/* Chunks from now on are of choice c. */
static void set_choice_head(struct job *j, int c) {
    snprintf(j->chunk_head + j->chunk_base_len, 16, "%d,", c);
}

/* n > 1: the finished choice is kept, and the job made ready for the next (j->mu held). */
static void next_choice(struct job *j) {
    j->choices = xrealloc(j->choices, (size_t)(j->n_done + 1) * sizeof *j->choices);
    struct job_choice *c = &j->choices[j->n_done++];
    c->len = j->text.len;
    c->text = strbuf_take(&j->text);
    c->lp = j->lp;
    c->finish = j->res.finish;
    c->n_generated = j->res.n_generated;
    j->lp = NULL;
    j->sent_first = 0;
    j->n_tool_calls = 0;
}

void api_job_run(struct job *j, struct engine *eng) {
    j->req.emit = job_emit;
    j->req.user = j;
    j->req.cancel = &j->cancel;
    const uint64_t seed0 = j->req.sampling.seed;
    j->total_generated = 0;
    for (int c = 0; c < j->n_choices; c++) {
        pthread_mutex_lock(&j->mu);
        if (c > 0) {
            next_choice(j);
            j->req.sampling.seed = seed0 + (uint64_t)c;
            if (j->grammar) {
                grammar_matcher_free(j->matcher);
                j->matcher = grammar_matcher_new(j->grammar, j->gvocab, j->in_thinking ? "</think>" : NULL);
                j->req.grammar = j->matcher;
            }
        }
        set_choice_head(j, c);
        if (j->cs) chat_stream_free(j->cs);
        j->cs = j->is_chat && j->stream ? chat_stream_new(j->in_thinking, j->tools, NULL, on_chat_delta, j) : NULL;
        pthread_mutex_unlock(&j->mu);
        struct error err;
        if (engine_generate(eng, &j->req, &j->res, &err) != 0) {
            api_job_fail(j, 500, err.msg);
            return;
        }
        j->total_generated += j->res.n_generated;
        /* stopped by the server's shutdown, not by its client: say so (an error event ends the
         * stream; a waiting non-streaming client gets 503) rather than end without a word */
        if (j->res.finish == ENGINE_FINISH_CANCELLED && !atomic_load(&j->cancel) && j->stopping &&
            atomic_load(j->stopping)) {
            api_job_fail(j, 503, "the server is shutting down; the generation was stopped");
            return;
        }
        if (j->res.finish == ENGINE_FINISH_CANCELLED) break;
        if (!j->stream) continue;
        pthread_mutex_lock(&j->mu);
        int truncated = 0;
        if (j->cs) {
            chat_stream_finish(j->cs);
            truncated = chat_stream_truncated(j->cs);
        }
        if (j->proto) { /* its own closing events (one choice) */
            j->proto->finish(j);
            goto done;
        }
        strbuf_adds(&j->out, j->chunk_head);
        if (j->is_chat) strbuf_adds(&j->out, "\"delta\":{},");
        else strbuf_adds(&j->out, "\"text\":\"\",");
        strbuf_printf(&j->out, "\"logprobs\":null,\"finish_reason\":\"%s\"}],",
                    finish_reason(j->res.finish, j->n_tool_calls, truncated));
        timings_append(&j->out, &j->res.timings);
        strbuf_adds(&j->out, "}\n\n");
        flush_out(j);
        pthread_mutex_unlock(&j->mu);
    }
    pthread_mutex_lock(&j->mu);
    if (j->n_choices > 1 && j->res.finish != ENGINE_FINISH_CANCELLED) next_choice(j);
    if (j->stream && j->res.finish != ENGINE_FINISH_CANCELLED) {
        const int usage_tokens = j->total_generated;
        if (j->include_usage) {
            set_choice_head(j, 0);
            strbuf_adds(&j->out, j->chunk_head);
            /* the head opened choices with an element; usage chunks carry an empty list */
            j->out.len -= strlen("{\"index\":0,");
            strbuf_printf(&j->out, "],\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":%d,"
                                 "\"total_tokens\":%d,\"prompt_tokens_details\":{\"cached_tokens\":%d}}}\n\n",
                        j->res.n_prompt, usage_tokens, j->res.n_prompt + usage_tokens,
                        j->res.timings.cache_n);
        }
        strbuf_adds(&j->out, "data: [DONE]\n\n");
    }
done:
    j->done = 1;
    flush_out(j);
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
}

void api_job_fail(struct job *j, int status, const char *msg) {
    pthread_mutex_lock(&j->mu);
    j->failed = 1;
    j->fail_status = status;
    snprintf(j->fail_msg, sizeof j->fail_msg, "%s", msg);
    if (j->stream && j->proto) {
        j->proto->fail(j, status, msg);
    } else if (j->stream) {
        struct api_error e = {.status = status,
                              .type = status == 503 ? "unavailable_error" : "server_error"};
        snprintf(e.message, sizeof e.message, "%s", msg);
        json_t *v = api_error_json(&e);
        char *s = json_dumps(v, JSON_COMPACT);
        json_decref(v);
        strbuf_adds(&j->out, "data: ");
        strbuf_adds(&j->out, s);
        strbuf_adds(&j->out, "\n\n");
        free(s);
    }
    j->done = 1;
    flush_out(j);
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
}

/* One element of a response's choices: the parsed message (chat) or the text. */
static json_t *choice_json(const struct job *j, int index, const char *text, size_t len,
                           json_t *lp_kept, enum engine_finish finish) {
    if (j->is_chat) {
        struct chat_parsed p;
        chat_parse(text, len, j->in_thinking, j->tools, NULL, &p);
        json_t *msg = json_pack("{s:s}", "role", "assistant");
        /* with lengths: a NUL the model wrote is text (the stream carries it as \u0000) */
        json_object_set_new(msg, "content", p.n_tool_calls && !p.content_len
                                                ? json_null()
                                                : json_stringn(p.content, p.content_len));
        if (p.reasoning_content && p.reasoning_len)
            json_object_set_new(msg, "reasoning_content",
                                json_stringn(p.reasoning_content, p.reasoning_len));
        if (p.n_tool_calls) json_object_set_new(msg, "tool_calls", chat_parsed_tool_calls_json(&p));
        json_t *lp = j->req.logprobs
                         ? json_pack("{s:o}", "content", lp_kept ? json_incref(lp_kept) : json_array())
                         : json_null();
        json_t *choice = json_pack("{s:i,s:o,s:o,s:s}", "index", index, "message", msg, "logprobs", lp,
                                   "finish_reason", finish_reason(finish, p.n_tool_calls, p.truncated));
        chat_parsed_free(&p);
        return choice;
    }
    json_t *lp = !j->req.logprobs ? json_null() : lp_kept ? json_incref(lp_kept) : cmpl_lp_new();
    return json_pack("{s:s%,s:i,s:o,s:s}", "text", text, len, "index", index, "logprobs", lp,
                     "finish_reason", finish_reason(finish, 0, 0));
}

json_t *api_job_response(struct job *j, int *status) {
    if (j->proto) return j->proto->response(j, status);
    if (j->failed) {
        struct api_error e = {.status = j->fail_status,
                              .type = j->fail_status == 503 ? "unavailable_error" : "server_error"};
        snprintf(e.message, sizeof e.message, "%s", j->fail_msg);
        *status = j->fail_status;
        return api_error_json(&e);
    }
    *status = 200;
    json_t *choices = json_array();
    if (j->n_choices > 1) {
        for (int i = 0; i < j->n_done; i++)
            json_array_append_new(choices, choice_json(j, i, j->choices[i].text, j->choices[i].len,
                                                       j->choices[i].lp, j->choices[i].finish));
    } else {
        json_array_append_new(choices, choice_json(j, 0, j->text.s ? j->text.s : "", j->text.len,
                                                   j->lp, j->res.finish));
    }
    const int n_gen = j->total_generated;
    return json_pack("{s:s,s:s,s:I,s:s,s:s,s:o,s:{s:i,s:i,s:i,s:{s:i}},s:o}", "id", j->id, "object",
                     j->is_chat ? "chat.completion" : "text_completion", "created",
                     (json_int_t)j->created, "model", j->model_name, "system_fingerprint",
                     "strata", "choices", choices, "usage", "prompt_tokens", j->res.n_prompt,
                     "completion_tokens", n_gen, "total_tokens", j->res.n_prompt + n_gen,
                     "prompt_tokens_details", "cached_tokens", j->res.timings.cache_n,
                     "timings", timings_json(&j->res.timings));
}

/* ---- small endpoints ------------------------------------------------------------------ */

json_t *api_models_json(const char *model_name, long created, struct model *m) {
    const struct config *c = model_config(m);
    return json_pack("{s:s,s:[{s:s,s:s,s:I,s:s,s:{s:i,s:i,s:I}}]}", "object", "list", "data",
                     "id", model_name, "object", "model", "created", (json_int_t)created,
                     "owned_by", "strata", "meta", "n_ctx", model_ctx(m), "n_vocab",
                     c->vocab_size, "n_params", (json_int_t)model_n_params(m));
}

/* Valid UTF-8 for any ids: the streaming detokenizer's lossy output. */
static char *lossy_text(struct tokenizer *tok, const int32_t *ids, int n, size_t *len) {
    struct detok d;
    detok_init(&d, tok);
    size_t cap = detok_max_out(tok);
    char *piece = xmalloc(cap);
    struct strbuf b = {0};
    strbuf_add(&b, "", 0);
    for (int i = 0; i < n; i++) strbuf_add(&b, piece, detok_push(&d, ids[i], piece, cap));
    strbuf_add(&b, piece, detok_flush(&d, piece, cap));
    free(piece);
    *len = b.len;
    return b.s;
}

json_t *api_tokenize(struct tokenizer *tok, const char *body, size_t len, struct api_error *e) {
    json_t *rq = parse_body(body, len, e);
    if (!rq) return NULL;
    const json_t *c = json_object_get(rq, "content");
    int pieces = 0;
    if (!json_is_string(c)) {
        bad(e, "content", "'content' (a string) is required");
        goto fail;
    }
    if (get_bool(rq, "with_pieces", &pieces, e) < 0) goto fail;
    int32_t *ids = NULL;
    int n = 0;
    struct error err;
    if (tokenizer_encode(tok, json_string_value(c), json_string_length(c), &ids, &n, &err) != 0) {
        bad(e, "content", "%s", err.msg);
        free(ids);
        goto fail;
    }
    json_t *arr = json_array();
    for (int i = 0; i < n; i++) {
        if (!pieces) {
            json_array_append_new(arr, json_integer(ids[i]));
            continue;
        }
        size_t bl;
        const char *bytes = tokenizer_token_bytes(tok, ids[i], &bl);
        size_t bad_at;
        json_t *piece;
        if (utf8_validate(bytes, bl, &bad_at) == 0) {
            piece = json_stringn(bytes, bl);
        } else { /* a partial UTF-8 sequence: the bytes, as llama-server does */
            piece = json_array();
            for (size_t k = 0; k < bl; k++)
                json_array_append_new(piece, json_integer((unsigned char)bytes[k]));
        }
        json_array_append_new(arr, json_pack("{s:i,s:o}", "id", ids[i], "piece", piece));
    }
    free(ids);
    json_decref(rq);
    return json_pack("{s:o}", "tokens", arr);
fail:
    json_decref(rq);
    return NULL;
}

json_t *api_apply_template(const struct chat_template *tmpl, const char *body, size_t len,
                           struct api_error *e) {
    json_t *rq = parse_body(body, len, e);
    if (!rq) return NULL;
    if (!json_is_array(json_object_get(rq, "messages"))) {
        bad(e, "messages", "'messages' (an array) is required");
        json_decref(rq);
        return NULL;
    }
    char *prompt = NULL;
    struct error err;
    json_t *r = NULL, *dev = developer_as_system(rq);
    if (dev) {
        json_decref(rq);
        rq = dev;
    }
    if ((chat_continues_final(rq) ? chat_render_continued(tmpl, rq, &prompt, &err)
                                  : chat_render(tmpl, rq, &prompt, &err)) != 0)
        bad(e, "messages", "%s", err.msg);
    else
        r = json_pack("{s:s}", "prompt", prompt);
    free(prompt);
    json_decref(rq);
    return r;
}

json_t *api_detokenize(struct tokenizer *tok, const char *body, size_t len, struct api_error *e) {
    json_t *rq = parse_body(body, len, e);
    if (!rq) return NULL;
    const json_t *t = json_object_get(rq, "tokens");
    if (!json_is_array(t)) {
        bad(e, "tokens", "'tokens' (an array of token ids) is required");
        json_decref(rq);
        return NULL;
    }
    int n = (int)json_array_size(t), vocab = tokenizer_vocab_size(tok);
    int32_t *ids = xmalloc((size_t)(n ? n : 1) * sizeof *ids);
    for (int i = 0; i < n; i++) {
        const json_t *v = json_array_get(t, (size_t)i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= vocab) {
            bad(e, "tokens", "tokens[%d] must be a token id in 0..%d", i, vocab - 1);
            free(ids);
            json_decref(rq);
            return NULL;
        }
        ids[i] = (int32_t)json_integer_value(v);
    }
    size_t tl;
    char *text = lossy_text(tok, ids, n, &tl);
    free(ids);
    json_decref(rq);
    json_t *r = json_pack("{s:s%}", "content", text, tl);
    free(text);
    return r;
}
