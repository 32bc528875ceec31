/* chat_parse.c - splits generated Qwen3.5 text into reasoning_content, content and OpenAI
 * tool_calls, incrementally (a push parser) or on a whole text (the same parser fed at once).
 *
 * The grammar is what the template teaches the model (see chat.h for the rules):
 *   [<think>] reasoning </think> content (<tool_call> <function=NAME> (<parameter=K> V
 *   </parameter>)* </function> </tool_call>)*
 * It mirrors the behaviour of vLLM's qwen3 reasoning parser and qwen3_coder tool parser (value
 * typing by the tool's JSON schema, a missing </parameter> tolerated), but streams string
 * values character by character instead of waiting for each parameter to close.
 *
 * It never fails: anything that does not fit the grammar before a tool call has been announced
 * goes back into content verbatim; after that, stray text inside the call is dropped and a
 * call cut off by the end of the text is closed so its arguments remain valid JSON. */
#include "chat.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <time.h>

enum state {
    ST_START,     /* content, at the very start: a <think> here opens reasoning */
    ST_REASONING, /* inside <think> ... </think> */
    ST_CONTENT,   /* plain content, watching for <tool_call> */
    ST_TC_OPEN,   /* after <tool_call>: expecting <function=NAME> */
    ST_FN_BODY,   /* inside <function=NAME>: expecting <parameter=K> or </function> */
    ST_PARAM,     /* inside a parameter value */
    ST_TC_CLOSE,  /* after </function>: expecting </tool_call> */
};

#define TAG_THINK "<think>"
#define TAG_THINK_END "</think>"
#define TAG_TC "<tool_call>"
#define TAG_TC_END "</tool_call>"
#define TAG_FN "<function="
#define TAG_FN_END "</function>"
#define TAG_PARAM "<parameter="
#define TAG_PARAM_END "</parameter>"
#define MAX_NAME 256 /* bytes; a longer "name" is not a tag */

struct chat_stream {
    enum state st;
    const json_t *tools; /* borrowed; NULL: names unchecked, values untyped */
    char id_prefix[64];
    chat_delta_fn fn;
    void *user;
    struct strbuf pend; /* text not yet consumed */
    int skip_nl;          /* drop newlines at the start of the next text */
    int saw_reasoning;
    struct strbuf raw; /* newlines + "<tool_call>" held while the call header is unproven */
    int n_calls, truncated;
    /* the call being parsed */
    const json_t *props; /* its parameters.properties, or NULL */
    int n_params;        /* parameters written to its arguments so far */
    /* the parameter being parsed */
    char *key;
    int param_string; /* streamed as a JSON string; else buffered in val and typed */
    int param_first;  /* the value's first newline is not yet dropped */
    struct strbuf val;
};

static void emit_text(struct chat_stream *s, enum chat_delta_kind kind, const char *t, size_t n) {
    if (!n) return;
    struct chat_delta d = {.kind = kind, .text = t, .len = n, .index = s->n_calls - 1};
    s->fn(s->user, &d);
}

static void emit_args(struct chat_stream *s, const char *t, size_t n) {
    emit_text(s, CHAT_DELTA_TOOL_ARGS, t, n);
}

/* JSON string escaping without the quotes (Python json.dumps, ensure_ascii=False). */
static void json_escape(struct strbuf *b, const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        char u[8];
        switch (c) {
        case '"': strbuf_adds(b, "\\\""); break;
        case '\\': strbuf_adds(b, "\\\\"); break;
        case '\n': strbuf_adds(b, "\\n"); break;
        case '\r': strbuf_adds(b, "\\r"); break;
        case '\t': strbuf_adds(b, "\\t"); break;
        case '\b': strbuf_adds(b, "\\b"); break;
        case '\f': strbuf_adds(b, "\\f"); break;
        default:
            if (c < 0x20) {
                snprintf(u, sizeof u, "\\u%04x", c);
                strbuf_adds(b, u);
            } else {
                strbuf_add(b, (const char *)&c, 1);
            }
        }
    }
}

static void emit_args_escaped(struct chat_stream *s, const char *t, size_t n) {
    struct strbuf b = {0};
    json_escape(&b, t, n);
    emit_args(s, b.s, b.len);
    free(b.s);
}

/* Length of the longest suffix of p[0..n) that is a proper prefix of tag. */
static size_t partial_tag(const char *p, size_t n, const char *tag) {
    size_t m = strlen(tag);
    for (size_t k = (n < m - 1 ? n : m - 1); k > 0; k--)
        if (memcmp(p + n - k, tag, k) == 0) return k;
    return 0;
}

/* 1 if p[0..n) is a prefix of tag (n <= strlen(tag)). */
static int is_prefix(const char *p, size_t n, const char *tag) {
    return n <= strlen(tag) && memcmp(p, tag, n) == 0;
}

static size_t skip_ws(const char *p, size_t n) {
    size_t q = 0;
    while (q < n && isspace((unsigned char)p[q])) q++;
    return q;
}

/* ---- the tools' schemas --------------------------------------------------------------- */

static const json_t *find_tool(const json_t *tools, const char *name, size_t n) {
    for (size_t i = 0; i < json_array_size(tools); i++) {
        const json_t *t = json_array_get(tools, i);
        const json_t *f = json_object_get(t, "function");
        if (!f) f = t;
        const json_t *nm = json_object_get(f, "name");
        if (json_is_string(nm) && json_string_length(nm) == n &&
            memcmp(json_string_value(nm), name, n) == 0)
            return f;
    }
    return NULL;
}

/* Adds the JSON-schema type names found in one schema (type: name or list; anyOf / oneOf). */
static void collect_types(const json_t *schema, const char **types, int *n, int depth) {
    if (!json_is_object(schema) || depth > 4) return;
    const json_t *ty = json_object_get(schema, "type");
    if (json_is_string(ty) && *n < 16) types[(*n)++] = json_string_value(ty);
    for (size_t i = 0; json_is_array(ty) && i < json_array_size(ty); i++)
        if (json_is_string(json_array_get(ty, i)) && *n < 16)
            types[(*n)++] = json_string_value(json_array_get(ty, i));
    static const char *const alts[] = {"anyOf", "oneOf"};
    for (int a = 0; a < 2; a++) {
        const json_t *l = json_object_get(schema, alts[a]);
        for (size_t i = 0; json_is_array(l) && i < json_array_size(l); i++)
            collect_types(json_array_get(l, i), types, n, depth + 1);
    }
}

static int has_type(const char **types, int n, const char *t) {
    for (int i = 0; i < n; i++)
        if (!strcmp(types[i], t)) return 1;
    return 0;
}

/* Whether the value of parameter key is a string (streamed raw) or a typed JSON value. */
static int param_is_string(const json_t *props, const char *key) {
    const char *types[16];
    int n = 0;
    collect_types(json_object_get(props, key), types, &n, 0);
    return n == 0 || has_type(types, n, "string");
}

/* A typed parameter's text -> its JSON text (malloc'd): the parsed value when it has one of
 * the schema's types, else the raw text as a JSON string. */
static char *typed_value(const json_t *props, const char *key, const char *v, size_t n) {
    const char *types[16];
    int nt = 0;
    collect_types(json_object_get(props, key), types, &nt, 0);
    json_t *j = json_loadb(v, n, JSON_DECODE_ANY, NULL);
    int ok = 0;
    if (j) {
        switch (json_typeof(j)) {
        case JSON_INTEGER: ok = has_type(types, nt, "integer") || has_type(types, nt, "number"); break;
        case JSON_REAL: ok = has_type(types, nt, "number"); break;
        case JSON_TRUE:
        case JSON_FALSE: ok = has_type(types, nt, "boolean"); break;
        case JSON_NULL: ok = has_type(types, nt, "null") || nt > 0; break;
        case JSON_OBJECT: ok = has_type(types, nt, "object"); break;
        case JSON_ARRAY: ok = has_type(types, nt, "array"); break;
        default: break;
        }
    } else if (has_type(types, nt, "boolean")) { /* Python-style True / False */
        size_t a = skip_ws(v, n), e = n;
        while (e > a && isspace((unsigned char)v[e - 1])) e--;
        if (e - a == 4 && !strncasecmp(v + a, "true", 4)) j = json_true(), ok = 1;
        if (e - a == 5 && !strncasecmp(v + a, "false", 5)) j = json_false(), ok = 1;
    }
    char *r;
    if (ok) {
        r = chat_tojson(j);
    } else {
        struct strbuf b = {0};
        strbuf_add(&b, "\"", 1);
        json_escape(&b, v, n);
        strbuf_add(&b, "\"", 1);
        r = strbuf_take(&b);
    }
    json_decref(j);
    return r;
}

/* ---- the machine ---------------------------------------------------------------------- */

static void start_call(struct chat_stream *s, const char *name, size_t n) {
    char id[96], nm[MAX_NAME + 1];
    memcpy(nm, name, n);
    nm[n] = 0;
    snprintf(id, sizeof id, "%s%d", s->id_prefix, s->n_calls);
    s->n_calls++;
    const json_t *f = json_is_array(s->tools) ? find_tool(s->tools, name, n) : NULL;
    s->props = json_object_get(json_object_get(f, "parameters"), "properties");
    s->n_params = 0;
    struct chat_delta d = {.kind = CHAT_DELTA_TOOL_START, .index = s->n_calls - 1, .id = id, .name = nm};
    s->fn(s->user, &d);
}

static void end_call(struct chat_stream *s, int truncated) {
    if (s->n_params == 0) emit_args(s, "{}", 2);
    else emit_args(s, "}", 1);
    if (truncated) s->truncated = 1;
}

static void start_param(struct chat_stream *s, const char *key, size_t n) {
    free(s->key);
    s->key = xmalloc(n + 1);
    memcpy(s->key, key, n);
    s->key[n] = 0;
    s->param_string = param_is_string(s->props, s->key);
    s->param_first = 1;
    s->val.len = 0;
    if (s->param_string) {
        struct strbuf b = {0};
        strbuf_adds(&b, s->n_params ? ", \"" : "{\"");
        json_escape(&b, key, n);
        strbuf_adds(&b, "\": \"");
        emit_args(s, b.s, b.len);
        free(b.s);
        s->n_params++;
    }
}

/* The value's last piece p[0..n) (its final newline already removed). */
static void end_param(struct chat_stream *s, const char *p, size_t n) {
    if (s->param_string) {
        emit_args_escaped(s, p, n);
        emit_args(s, "\"", 1);
        return;
    }
    strbuf_add(&s->val, p, n);
    char *v = typed_value(s->props, s->key, s->val.s ? s->val.s : "", s->val.len);
    struct strbuf b = {0};
    strbuf_adds(&b, s->n_params ? ", \"" : "{\"");
    json_escape(&b, s->key, strlen(s->key));
    strbuf_adds(&b, "\": ");
    strbuf_adds(&b, v);
    emit_args(s, b.s, b.len);
    free(b.s);
    free(v);
    s->n_params++;
}

/* Hands the held "<tool_call>" header back to content and rescans what follows as content. */
static void degrade(struct chat_stream *s) {
    emit_text(s, CHAT_DELTA_CONTENT, s->raw.s, s->raw.len);
    s->raw.len = 0;
    s->st = ST_CONTENT;
}

/* Consumes as much of pend as is certain; returns bytes consumed. final: no more text comes. */
static size_t step(struct chat_stream *s, const char *p, size_t n, int final) {
    size_t used = 0;
    for (;;) {
        const char *q = p + used;
        size_t m = n - used;
        if ((s->st == ST_REASONING || s->st == ST_CONTENT) && s->skip_nl) {
            while (m && *q == '\n') q++, m--, used++;
            if (!m) return used;
            s->skip_nl = 0;
        }
        switch (s->st) {
        case ST_START: {
            size_t w = skip_ws(q, m);
            if (m - w >= strlen(TAG_THINK)) {
                if (!memcmp(q + w, TAG_THINK, strlen(TAG_THINK))) {
                    used += w + strlen(TAG_THINK);
                    s->st = ST_REASONING;
                    s->saw_reasoning = 1;
                    s->skip_nl = 1;
                } else {
                    s->st = ST_CONTENT;
                }
            } else if (is_prefix(q + w, m - w, TAG_THINK) && !final) {
                return used;
            } else {
                s->st = ST_CONTENT;
            }
            break;
        }
        case ST_REASONING:
        case ST_CONTENT: {
            int reasoning = s->st == ST_REASONING;
            const char *tag = reasoning ? TAG_THINK_END : TAG_TC;
            enum chat_delta_kind kind = reasoning ? CHAT_DELTA_REASONING : CHAT_DELTA_CONTENT;
            const char *f = memmem(q, m, tag, strlen(tag));
            if (f) {
                size_t e = (size_t)(f - q), t = e;
                while (t > 0 && q[t - 1] == '\n') t--; /* the tag's leading newlines */
                emit_text(s, kind, q, t);
                used += e + strlen(tag);
                if (reasoning) {
                    s->st = ST_CONTENT;
                    s->skip_nl = 1;
                } else {
                    s->raw.len = 0;
                    strbuf_add(&s->raw, q + t, e - t);
                    strbuf_adds(&s->raw, TAG_TC);
                    s->st = ST_TC_OPEN;
                }
                break;
            }
            size_t hold = final ? 0 : partial_tag(q, m, tag);
            while (!final && hold < m && q[m - hold - 1] == '\n') hold++;
            emit_text(s, kind, q, m - hold);
            return used + m - hold;
        }
        case ST_TC_OPEN: {
            size_t w = skip_ws(q, m), fl = strlen(TAG_FN);
            if (m - w < fl) {
                if (is_prefix(q + w, m - w, TAG_FN) && !final) return used;
                degrade(s);
                break;
            }
            if (memcmp(q + w, TAG_FN, fl) != 0) {
                degrade(s);
                break;
            }
            const char *name = q + w + fl;
            size_t avail = m - w - fl;
            const char *gt = memchr(name, '>', avail < MAX_NAME + 1 ? avail : MAX_NAME + 1);
            size_t nl = gt ? (size_t)(gt - name) : avail;
            int bad = memchr(name, '\n', nl) || memchr(name, '<', nl) || nl > MAX_NAME;
            if (!gt && !bad && !final) return used;
            if (!gt || bad || nl == 0 ||
                (json_array_size(s->tools) > 0 && !find_tool(s->tools, name, nl))) {
                degrade(s);
                break;
            }
            start_call(s, name, nl);
            s->raw.len = 0;
            used += w + fl + nl + 1;
            s->st = ST_FN_BODY;
            break;
        }
        case ST_FN_BODY: {
            size_t w = skip_ws(q, m);
            used += w, q += w, m -= w;
            size_t pl = strlen(TAG_PARAM), fe = strlen(TAG_FN_END);
            if (m >= pl && !memcmp(q, TAG_PARAM, pl)) {
                const char *key = q + pl;
                const char *gt = memchr(key, '>', m - pl < MAX_NAME + 1 ? m - pl : MAX_NAME + 1);
                if (gt && memchr(key, '\n', (size_t)(gt - key))) gt = NULL;
                if (gt) {
                    start_param(s, key, (size_t)(gt - key));
                    used += pl + (size_t)(gt - key) + 1;
                    s->st = ST_PARAM;
                    break;
                }
                if (!final && m - pl <= MAX_NAME && !memchr(key, '\n', m - pl)) return used;
                used += 1; /* not a parameter tag: drop the '<' and go on */
                break;
            }
            if (m >= fe && !memcmp(q, TAG_FN_END, fe)) {
                end_call(s, 0);
                used += fe;
                s->st = ST_TC_CLOSE;
                break;
            }
            if (m == 0 || ((is_prefix(q, m, TAG_PARAM) || is_prefix(q, m, TAG_FN_END)) && !final)) {
                if (final) {
                    end_call(s, 1);
                    s->st = ST_CONTENT;
                }
                return used;
            }
            /* stray text inside the call: dropped up to the next '<' */
            const char *lt = memchr(q + 1, '<', m - 1);
            used += lt ? (size_t)(lt - q) : m;
            break;
        }
        case ST_PARAM: {
            if (s->param_first) {
                if (!m && !final) return used;
                if (m && *q == '\n') q++, m--, used++;
                s->param_first = 0;
            }
            static const char *const ends[] = {TAG_PARAM_END, TAG_PARAM, TAG_FN_END};
            const char *f = NULL;
            int which = -1;
            for (int k = 0; k < 3; k++) {
                const char *g = memmem(q, m, ends[k], strlen(ends[k]));
                if (g && (!f || g < f)) f = g, which = k;
            }
            if (f || final) {
                size_t e = f ? (size_t)(f - q) : m, v = e;
                if (v > 0 && q[v - 1] == '\n') v--;
                end_param(s, q, v);
                used += e + (which == 0 ? strlen(TAG_PARAM_END) : 0);
                s->st = ST_FN_BODY;
                break;
            }
            size_t hold = 0;
            for (int k = 0; k < 3; k++) {
                size_t h = partial_tag(q, m, ends[k]);
                if (h > hold) hold = h;
            }
            if (hold < m && q[m - hold - 1] == '\n') hold++;
            if (s->param_string) emit_args_escaped(s, q, m - hold);
            else strbuf_add(&s->val, q, m - hold);
            return used + m - hold;
        }
        case ST_TC_CLOSE: {
            size_t w = skip_ws(q, m), tl = strlen(TAG_TC_END);
            if (m - w >= tl && !memcmp(q + w, TAG_TC_END, tl)) {
                used += w + tl;
                s->st = ST_CONTENT;
                s->skip_nl = 1;
                break;
            }
            if (is_prefix(q + w, m - w, TAG_TC_END) && !final) return used + w;
            used += w; /* no </tool_call>: tolerated */
            s->st = ST_CONTENT;
            break;
        }
        }
    }
}

static void run(struct chat_stream *s, int final) {
    size_t used = step(s, s->pend.s ? s->pend.s : "", s->pend.len, final);
    CHECK(used <= s->pend.len);
    if (!s->pend.s) return;
    memmove(s->pend.s, s->pend.s + used, s->pend.len - used);
    s->pend.len -= used;
    s->pend.s[s->pend.len] = 0;
}

struct chat_stream *chat_stream_new(int in_thinking, const json_t *tools, const char *id_prefix,
                                    chat_delta_fn fn, void *user) {
    struct chat_stream *s = xcalloc(1, sizeof *s);
    s->st = in_thinking ? ST_REASONING : ST_START;
    s->saw_reasoning = in_thinking;
    s->tools = json_is_array(tools) ? tools : NULL;
    s->fn = fn;
    s->user = user;
    if (id_prefix) {
        snprintf(s->id_prefix, sizeof s->id_prefix, "%s", id_prefix);
    } else {
        unsigned long long r = 0;
        if (getrandom(&r, sizeof r, 0) != (ssize_t)sizeof r)
            r = (unsigned long long)time(NULL) * 6364136223846793005ull + (unsigned long long)(size_t)s;
        snprintf(s->id_prefix, sizeof s->id_prefix, "call_%016llx_", r);
    }
    return s;
}

void chat_stream_push(struct chat_stream *s, const char *text, size_t len) {
    strbuf_add(&s->pend, text, len);
    run(s, 0);
}

void chat_stream_finish(struct chat_stream *s) {
    run(s, 1);
    CHECK(s->pend.len == 0);
}

int chat_stream_n_tool_calls(const struct chat_stream *s) { return s->n_calls; }
int chat_stream_truncated(const struct chat_stream *s) { return s->truncated; }

void chat_stream_free(struct chat_stream *s) {
    if (!s) return;
    free(s->pend.s);
    free(s->raw.s);
    free(s->val.s);
    free(s->key);
    free(s);
}

/* ---- whole-text parsing --------------------------------------------------------------- */

struct collect {
    struct strbuf content, reasoning, args;
    struct chat_parsed *out;
};

static void collect_delta(void *user, const struct chat_delta *d) {
    struct collect *c = user;
    struct chat_parsed *p = c->out;
    switch (d->kind) {
    case CHAT_DELTA_CONTENT: strbuf_add(&c->content, d->text, d->len); break;
    case CHAT_DELTA_REASONING: strbuf_add(&c->reasoning, d->text, d->len); break;
    case CHAT_DELTA_TOOL_START:
        if (p->n_tool_calls) p->tool_calls[p->n_tool_calls - 1].arguments = strbuf_take(&c->args);
        p->tool_calls = xrealloc(p->tool_calls, (size_t)(p->n_tool_calls + 1) * sizeof *p->tool_calls);
        p->tool_calls[p->n_tool_calls].id = xstrdup(d->id);
        p->tool_calls[p->n_tool_calls].name = xstrdup(d->name);
        p->tool_calls[p->n_tool_calls].arguments = NULL;
        p->n_tool_calls++;
        break;
    case CHAT_DELTA_TOOL_ARGS:
        CHECK(d->index == p->n_tool_calls - 1);
        strbuf_add(&c->args, d->text, d->len);
        break;
    }
}

void chat_parse(const char *text, size_t len, int in_thinking, const json_t *tools,
                const char *id_prefix, struct chat_parsed *out) {
    memset(out, 0, sizeof *out);
    struct collect c = {.out = out};
    struct chat_stream *s = chat_stream_new(in_thinking, tools, id_prefix, collect_delta, &c);
    chat_stream_push(s, text, len);
    chat_stream_finish(s);
    if (out->n_tool_calls) out->tool_calls[out->n_tool_calls - 1].arguments = strbuf_take(&c.args);
    out->content_len = c.content.len;
    out->content = strbuf_take(&c.content);
    out->reasoning_len = s->saw_reasoning ? c.reasoning.len : 0;
    out->reasoning_content = s->saw_reasoning ? strbuf_take(&c.reasoning) : NULL;
    out->truncated = s->truncated;
    free(c.reasoning.s);
    free(c.args.s);
    chat_stream_free(s);
}

void chat_parsed_free(struct chat_parsed *p) {
    free(p->reasoning_content);
    free(p->content);
    for (int i = 0; i < p->n_tool_calls; i++) {
        free(p->tool_calls[i].id);
        free(p->tool_calls[i].name);
        free(p->tool_calls[i].arguments);
    }
    free(p->tool_calls);
    memset(p, 0, sizeof *p);
}

json_t *chat_parsed_tool_calls_json(const struct chat_parsed *p) {
    json_t *a = json_array();
    for (int i = 0; i < p->n_tool_calls; i++) {
        const struct chat_tool_call *t = &p->tool_calls[i];
        json_array_append_new(
            a, json_pack("{s:s, s:s, s:{s:s, s:s}}", "id", t->id, "type", "function", "function",
                         "name", t->name, "arguments", t->arguments));
    }
    return a;
}
