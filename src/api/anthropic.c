/* anthropic.c - Anthropic's Messages API on the chat path (anthropic.h).
 *
 * The request becomes a chat request: system (a string or text blocks) -> the system message;
 * user blocks: text -> a user message, tool_result -> a tool message each (before the user's
 * text, as the API orders them); assistant blocks: text -> content, thinking -> reasoning_content,
 * tool_use -> tool_calls; tools {name, input_schema} -> function tools; tool_choice auto / none /
 * any / tool -> chat's auto / none / required / named (the chat path decides what it supports);
 * thinking enabled / disabled -> the template's enable_thinking (absent: the template's default);
 * stop_sequences -> stop. It runs as a chat job: same template, engine and output parser as
 * /v1/chat/completions.
 *
 * The parser's deltas become content blocks (thinking, text, tool_use) and, when streaming,
 * the events message_start, ping, content_block_start / _delta (thinking_delta, signature_delta,
 * text_delta, input_json_delta) / _stop, message_delta (stop_reason, usage), message_stop, as the
 * Anthropic SDK's MessageStream accumulates them. usage: input_tokens are the prompt tokens not
 * resumed from the prefix cache, cache_read_input_tokens the resumed ones (Anthropic's split).
 * A last message from the assistant is a prefill: the reply continues it (chat's
 * continue_final_message). Errors: {"type":"error","error":{"type","message"}}. Not supported:
 * images, documents, server tools. */
#include "anthropic.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/tokenizer.h"

static int bad(struct api_error *e, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int bad(struct api_error *e, const char *param, const char *fmt, ...) {
    e->status = 400;
    e->type = "invalid_request_error";
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return -1;
}

#define QUOTE(s) api_quote((char[160]){0}, 160, (s), strlen(s), 40)

json_t *anthropic_error_json(const struct api_error *e) {
    const char *type;
    switch (e->status) {
    case 401: type = "authentication_error"; break;
    case 403: type = "permission_error"; break;
    case 404: type = "not_found_error"; break;
    case 413: type = "request_too_large"; break;
    case 429: type = "rate_limit_error"; break;
    case 503: type = "overloaded_error"; break;
    default: type = e->status >= 500 ? "api_error" : "invalid_request_error"; break;
    }
    /* the message through the OpenAI shaper, which makes it valid UTF-8 */
    json_t *o = api_error_json(e);
    json_t *msg = json_incref(json_object_get(json_object_get(o, "error"), "message"));
    json_decref(o);
    return json_pack("{s:s,s:{s:s,s:o}}", "type", "error", "error", "type", type, "message",
                     msg ? msg : json_string(""));
}

/* ---- request: Messages -> chat ---------------------------------------------------------- */

/* Text blocks (or a string) appended to out; where names them in errors. */
static int blocks_text(const json_t *c, const char *where, struct strbuf *out,
                       struct api_error *e) {
    if (!c || json_is_null(c)) return 0;
    if (json_is_string(c)) {
        strbuf_add(out, json_string_value(c), json_string_length(c));
        return 0;
    }
    if (!json_is_array(c))
        return bad(e, NULL, "%s must be a string or an array of text blocks", where);
    for (size_t k = 0; k < json_array_size(c); k++) {
        const json_t *b = json_array_get(c, k);
        const char *type = json_string_value(json_object_get(b, "type"));
        if (!type) return bad(e, NULL, "%s[%zu] must be an object with a 'type'", where, k);
        if (!strcmp(type, "image") || !strcmp(type, "document"))
            return bad(e, NULL, "%s[%zu]: %s blocks are not supported (strata runs the text model "
                       "only)", where, k, type);
        if (strcmp(type, "text") != 0)
            return bad(e, NULL, "%s[%zu]: '%s' blocks are not supported here (text blocks are)",
                       where, k, QUOTE(type));
        const json_t *t = json_object_get(b, "text");
        if (!json_is_string(t)) return bad(e, NULL, "%s[%zu].text must be a string", where, k);
        if (out->len && k > 0) strbuf_adds(out, "\n");
        strbuf_add(out, json_string_value(t), json_string_length(t));
    }
    return 0;
}

static int user_blocks(json_t *msgs, const json_t *c, size_t i, struct api_error *e) {
    struct strbuf text = {0};
    char where[64];
    int rc = -1;
    for (size_t k = 0; k < json_array_size(c); k++) {
        const json_t *b = json_array_get(c, k);
        const char *type = json_string_value(json_object_get(b, "type"));
        snprintf(where, sizeof where, "messages[%zu].content[%zu]", i, k);
        if (!type) {
            bad(e, NULL, "%s must be an object with a 'type'", where);
            goto out;
        }
        if (!strcmp(type, "text")) {
            const json_t *t = json_object_get(b, "text");
            if (!json_is_string(t)) {
                bad(e, NULL, "%s.text must be a string", where);
                goto out;
            }
            if (text.len) strbuf_adds(&text, "\n");
            strbuf_add(&text, json_string_value(t), json_string_length(t));
        } else if (!strcmp(type, "tool_result")) {
            const json_t *id = json_object_get(b, "tool_use_id");
            if (!json_is_string(id)) {
                bad(e, NULL, "%s: a tool_result block needs a string 'tool_use_id'", where);
                goto out;
            }
            struct strbuf r = {0};
            char w2[80];
            snprintf(w2, sizeof w2, "%s.content", where);
            if (blocks_text(json_object_get(b, "content"), w2, &r, e) < 0) {
                free(r.s);
                goto out;
            }
            json_array_append_new(msgs, json_pack("{s:s,s:O,s:s%}", "role", "tool", "tool_call_id",
                                                  id, "content", r.s ? r.s : "", r.len));
            free(r.s);
        } else if (!strcmp(type, "image") || !strcmp(type, "document")) {
            bad(e, NULL, "%s: %s blocks are not supported (strata runs the text model only)",
                where, type);
            goto out;
        } else {
            bad(e, NULL, "%s: '%s' blocks are not supported in a user message (text and "
                "tool_result are)", where, QUOTE(type));
            goto out;
        }
    }
    if (text.len || json_array_size(c) == 0)
        json_array_append_new(msgs, json_pack("{s:s,s:s%}", "role", "user", "content",
                                              text.s ? text.s : "", text.len));
    rc = 0;
out:
    free(text.s);
    return rc;
}

static int assistant_blocks(json_t *msgs, const json_t *c, size_t i, struct api_error *e) {
    struct strbuf text = {0}, think = {0};
    json_t *calls = json_array();
    char where[64];
    int rc = -1;
    for (size_t k = 0; k < json_array_size(c); k++) {
        const json_t *b = json_array_get(c, k);
        const char *type = json_string_value(json_object_get(b, "type"));
        snprintf(where, sizeof where, "messages[%zu].content[%zu]", i, k);
        if (!type) {
            bad(e, NULL, "%s must be an object with a 'type'", where);
            goto out;
        }
        if (!strcmp(type, "text") || !strcmp(type, "thinking")) {
            const json_t *t = json_object_get(b, type);
            if (!json_is_string(t)) {
                bad(e, NULL, "%s.%s must be a string", where, type);
                goto out;
            }
            struct strbuf *to = !strcmp(type, "text") ? &text : &think;
            strbuf_add(to, json_string_value(t), json_string_length(t));
        } else if (!strcmp(type, "redacted_thinking")) {
            continue; /* opaque to this server */
        } else if (!strcmp(type, "tool_use")) {
            const json_t *id = json_object_get(b, "id"), *name = json_object_get(b, "name");
            const json_t *input = json_object_get(b, "input");
            if (!json_is_string(id) || !json_is_string(name) || !json_is_object(input)) {
                bad(e, NULL, "%s: a tool_use block needs a string 'id' and 'name' and an object "
                    "'input'", where);
                goto out;
            }
            json_array_append_new(calls, json_pack("{s:O,s:s,s:{s:O,s:O}}", "id", id, "type",
                                                   "function", "function", "name", name,
                                                   "arguments", input));
        } else if (!strcmp(type, "image") || !strcmp(type, "document")) {
            bad(e, NULL, "%s: %s blocks are not supported (strata runs the text model only)",
                where, type);
            goto out;
        } else {
            bad(e, NULL, "%s: '%s' blocks are not supported in an assistant message (text, "
                "thinking and tool_use are)", where, QUOTE(type));
            goto out;
        }
    }
    json_t *m = json_pack("{s:s,s:s%}", "role", "assistant", "content", text.s ? text.s : "",
                          text.len);
    if (think.len) json_object_set_new(m, "reasoning_content", json_stringn(think.s, think.len));
    if (json_array_size(calls)) json_object_set(m, "tool_calls", calls);
    json_array_append_new(msgs, m);
    rc = 0;
out:
    free(text.s);
    free(think.s);
    json_decref(calls);
    return rc;
}

/* A system message's text: while the conversation holds nothing but the system prompt, it joins
 * that (the template takes one system message, first); later, it is a user turn of its own. */
static void system_text(json_t *msgs, const char *t, size_t n) {
    json_t *first = json_array_get(msgs, 0);
    const char *role = json_string_value(json_object_get(first, "role"));
    const size_t len = json_array_size(msgs);
    if (len == 1 && !strcmp(role, "system")) {
        struct strbuf joined = {0};
        const json_t *prev = json_object_get(first, "content");
        strbuf_add(&joined, json_string_value(prev), json_string_length(prev));
        if (joined.len && n) strbuf_adds(&joined, "\n\n");
        strbuf_add(&joined, t, n);
        json_object_set_new(first, "content", json_stringn(joined.s ? joined.s : "", joined.len));
        free(joined.s);
        return;
    }
    json_array_append_new(msgs, json_pack("{s:s,s:s%}", "role", len ? "user" : "system",
                                          "content", t, n));
}

/* The Messages request as a chat request (a new reference), or NULL + e. count: for
 * count_tokens (max_tokens not needed). */
static json_t *to_chat(const json_t *rq, int count, struct api_error *e) {
    const json_t *v;
    json_t *c = json_pack("{s:[]}", "messages");
    json_t *msgs = json_object_get(c, "messages");
    if (!count) {
        v = json_object_get(rq, "max_tokens");
        if (!v || json_is_null(v)) {
            bad(e, "max_tokens", "max_tokens: Field required");
            goto fail;
        }
        if (!json_is_integer(v) || json_integer_value(v) < 1) {
            bad(e, "max_tokens", "max_tokens: must be an integer >= 1");
            goto fail;
        }
        json_object_set(c, "max_tokens", (json_t *)v);
    }
    const json_t *ms = json_object_get(rq, "messages");
    if (!ms || json_is_null(ms)) {
        bad(e, "messages", "messages: Field required");
        goto fail;
    }
    if (!json_is_array(ms) || json_array_size(ms) == 0) {
        bad(e, "messages", "messages: must be a non-empty array");
        goto fail;
    }
    v = json_object_get(rq, "system");
    if (v && !json_is_null(v)) {
        struct strbuf s = {0};
        if (blocks_text(v, "system", &s, e) < 0) {
            free(s.s);
            goto fail;
        }
        json_array_append_new(msgs, json_pack("{s:s,s:s%}", "role", "system", "content",
                                              s.s ? s.s : "", s.len));
        free(s.s);
    }
    for (size_t i = 0; i < json_array_size(ms); i++) {
        const json_t *m = json_array_get(ms, i);
        const char *role = json_string_value(json_object_get(m, "role"));
        if (!json_is_object(m) || !role ||
            (strcmp(role, "user") && strcmp(role, "assistant") && strcmp(role, "system"))) {
            bad(e, "messages", "messages[%zu].role: must be \"user\", \"assistant\" or "
                "\"system\"", i);
            goto fail;
        }
        const json_t *content = json_object_get(m, "content");
        int user = !strcmp(role, "user");
        if (!strcmp(role, "system")) {
            /* a system message in the conversation (Claude Code sends them) */
            struct strbuf s = {0};
            char where[48];
            snprintf(where, sizeof where, "messages[%zu].content", i);
            if (blocks_text(content, where, &s, e) < 0) {
                free(s.s);
                goto fail;
            }
            system_text(msgs, s.s ? s.s : "", s.len);
            free(s.s);
            continue;
        }
        if (json_is_string(content)) {
            json_array_append_new(msgs, json_pack("{s:s,s:O}", "role", role, "content", content));
        } else if (!json_is_array(content)) {
            bad(e, "messages", "messages[%zu].content: must be a string or an array of content "
                "blocks", i);
            goto fail;
        } else if ((user ? user_blocks : assistant_blocks)(msgs, content, i, e) < 0) {
            goto fail;
        }
    }

    const json_t *tools = json_object_get(rq, "tools");
    if (tools && !json_is_null(tools)) {
        if (!json_is_array(tools)) {
            bad(e, "tools", "tools: must be an array");
            goto fail;
        }
        json_t *ct = json_array();
        json_object_set_new(c, "tools", ct);
        for (size_t i = 0; i < json_array_size(tools); i++) {
            const json_t *t = json_array_get(tools, i);
            const char *type = json_string_value(json_object_get(t, "type"));
            const json_t *name = json_object_get(t, "name");
            if (type && strcmp(type, "custom") != 0) {
                bad(e, "tools", "tools[%zu]: '%s' (a server tool) is not supported; client tools "
                    "{name, description, input_schema} are", i, QUOTE(type));
                goto fail;
            }
            if (!json_is_string(name)) {
                bad(e, "tools", "tools[%zu].name: Field required", i);
                goto fail;
            }
            json_t *f = json_pack("{s:O}", "name", name);
            if ((v = json_object_get(t, "description")) && json_is_string(v))
                json_object_set(f, "description", (json_t *)v);
            v = json_object_get(t, "input_schema");
            if (!json_is_object(v)) {
                bad(e, "tools", "tools[%zu].input_schema: must be a JSON Schema object", i);
                json_decref(f);
                goto fail;
            }
            json_object_set(f, "parameters", (json_t *)v);
            json_array_append_new(ct, json_pack("{s:s,s:o}", "type", "function", "function", f));
        }
    }
    v = json_object_get(rq, "tool_choice");
    if (v && !json_is_null(v)) {
        const char *type = json_string_value(json_object_get(v, "type"));
        if (!type) {
            bad(e, "tool_choice", "tool_choice: must be an object with a 'type' (auto, any, tool, "
                "none)");
            goto fail;
        }
        if (!strcmp(type, "auto") || !strcmp(type, "none")) {
            json_object_set_new(c, "tool_choice", json_string(type));
        } else if (!strcmp(type, "any")) {
            json_object_set_new(c, "tool_choice", json_string("required"));
        } else if (!strcmp(type, "tool") && json_is_string(json_object_get(v, "name"))) {
            json_object_set_new(c, "tool_choice",
                                json_pack("{s:s,s:{s:O}}", "type", "function", "function", "name",
                                          json_object_get(v, "name")));
        } else {
            bad(e, "tool_choice", "tool_choice: type must be auto, any, none, or tool with a "
                "'name'");
            goto fail;
        }
        const json_t *dp = json_object_get(v, "disable_parallel_tool_use");
        if (json_is_boolean(dp))
            json_object_set_new(c, "parallel_tool_calls", json_boolean(!json_is_true(dp)));
    }
    v = json_object_get(rq, "thinking");
    if (v && !json_is_null(v)) {
        const char *type = json_string_value(json_object_get(v, "type"));
        if (!type ||
            (strcmp(type, "enabled") && strcmp(type, "disabled") && strcmp(type, "adaptive"))) {
            bad(e, "thinking", "thinking.type: must be \"enabled\", \"disabled\" or \"adaptive\"");
            goto fail;
        }
        json_object_set_new(c, "chat_template_kwargs",
                            json_pack("{s:b}", "enable_thinking", strcmp(type, "disabled") != 0));
    }
    v = json_object_get(rq, "stop_sequences");
    if (v && !json_is_null(v)) {
        if (!json_is_array(v)) {
            bad(e, "stop_sequences", "stop_sequences: must be an array of strings");
            goto fail;
        }
        if (json_array_size(v)) json_object_set(c, "stop", (json_t *)v);
    }
    static const char *const same[] = {"model", "temperature", "top_p", "top_k", "stream", "seed",
                                       "ignore_eos", "strata_forced_output"};
    for (size_t i = 0; i < sizeof same / sizeof same[0]; i++)
        if ((v = json_object_get(rq, same[i]))) json_object_set(c, same[i], (json_t *)v);
    return c;
fail:
    json_decref(c);
    return NULL;
}

json_t *anthropic_count_tokens(struct tokenizer *tok, const struct chat_template *tmpl,
                               const char *body, size_t len, struct api_error *e) {
    json_t *rq = api_parse_body(body, len, e);
    if (!rq) return NULL;
    json_t *c = to_chat(rq, 1, e);
    json_decref(rq);
    if (!c) return NULL;
    const char *tc = json_string_value(json_object_get(c, "tool_choice"));
    if (tc && !strcmp(tc, "none")) json_object_del(c, "tools"); /* as the chat path does */
    char *prompt = NULL;
    struct error err;
    json_t *r = NULL;
    int32_t *ids = NULL;
    int n = 0;
    if (chat_render(tmpl, c, &prompt, &err) != 0)
        bad(e, "messages", "%s", err.msg);
    else if (tokenizer_encode(tok, prompt, strlen(prompt), &ids, &n, &err) != 0)
        bad(e, "messages", "%s", err.msg);
    else
        r = json_pack("{s:i}", "input_tokens", n);
    free(ids);
    free(prompt);
    json_decref(c);
    return r;
}

/* ---- output: content blocks and events --------------------------------------------------- */

enum block_kind { BLOCK_NONE, BLOCK_THINKING, BLOCK_TEXT, BLOCK_TOOL };

/* Thinking blocks carry a signature the API checks when they come back; this server checks
 * nothing, but clients expect one. */
#define SIGNATURE "strata"

struct msg_state {
    char id[64];       /* msg_<random> */
    int started;       /* message_start sent */
    json_t *content;   /* the blocks done */
    enum block_kind kind;
    struct strbuf text; /* the open block's text, or its input JSON */
    char *tool_id, *name;
    int n_calls;
};

static void state_free(void *p) {
    struct msg_state *st = p;
    if (!st) return;
    json_decref(st->content);
    free(st->text.s);
    free(st->tool_id);
    free(st->name);
    free(st);
}

static void event(struct job *j, json_t *ev) {
    if (!j->stream) {
        json_decref(ev);
        return;
    }
    char *s = json_dumps(ev, JSON_COMPACT);
    strbuf_printf(&j->out, "event: %s\ndata: %s\n\n",
                  json_string_value(json_object_get(ev, "type")), s ? s : "{}");
    free(s);
    json_decref(ev);
}

static json_t *usage_json(const struct job *j) {
    return json_pack("{s:i,s:i,s:i,s:i}", "input_tokens", j->res.n_prompt - j->res.timings.cache_n,
                     "output_tokens", j->res.n_generated, "cache_creation_input_tokens", 0,
                     "cache_read_input_tokens", j->res.timings.cache_n);
}

static void start(struct job *j, struct msg_state *st) {
    if (st->started) return;
    st->started = 1;
    /* the cache's share is known at the end: message_delta's usage has the split */
    event(j, json_pack("{s:s,s:{s:s,s:s,s:s,s:s,s:[],s:n,s:n,s:{s:i,s:i,s:i,s:i}}}", "type",
                       "message_start", "message", "id", st->id, "type", "message", "role",
                       "assistant", "model", j->model_name, "content", "stop_reason",
                       "stop_sequence", "usage", "input_tokens", j->n_ids, "output_tokens", 0,
                       "cache_creation_input_tokens", 0, "cache_read_input_tokens", 0));
    event(j, json_pack("{s:s}", "type", "ping"));
}

static json_t *block_json(struct msg_state *st) {
    const char *t = st->text.s ? st->text.s : "";
    switch (st->kind) {
    case BLOCK_THINKING:
        return json_pack("{s:s,s:s%,s:s}", "type", "thinking", "thinking", t, st->text.len,
                         "signature", SIGNATURE);
    case BLOCK_TEXT:
        return json_pack("{s:s,s:s%}", "type", "text", "text", t, st->text.len);
    case BLOCK_TOOL: {
        json_t *input = json_loadb(t, st->text.len, 0, NULL);
        if (!json_is_object(input)) { /* the parser closes what it opened; a bug otherwise */
            json_decref(input);
            input = json_object();
        }
        return json_pack("{s:s,s:s,s:s,s:o}", "type", "tool_use", "id", st->tool_id, "name",
                         st->name, "input", input);
    }
    case BLOCK_NONE:
        break;
    }
    return NULL;
}

static void close_block(struct job *j, struct msg_state *st) {
    if (st->kind == BLOCK_NONE) return;
    const int idx = (int)json_array_size(st->content);
    if (st->kind == BLOCK_THINKING)
        event(j, json_pack("{s:s,s:i,s:{s:s,s:s}}", "type", "content_block_delta", "index", idx,
                           "delta", "type", "signature_delta", "signature", SIGNATURE));
    event(j, json_pack("{s:s,s:i}", "type", "content_block_stop", "index", idx));
    json_array_append_new(st->content, block_json(st));
    st->kind = BLOCK_NONE;
    st->text.len = 0;
    if (st->text.s) st->text.s[0] = 0;
}

static void open_block(struct job *j, struct msg_state *st, enum block_kind kind,
                       const struct chat_delta *d) {
    close_block(j, st);
    const int idx = (int)json_array_size(st->content);
    st->kind = kind;
    json_t *b;
    if (kind == BLOCK_TOOL) {
        free(st->tool_id);
        free(st->name);
        /* the parser's call_<random>_<n> as Anthropic's toolu_<random>_<n> */
        st->tool_id = xmalloc(strlen(d->id) + 8);
        sprintf(st->tool_id, "toolu_%s", !strncmp(d->id, "call_", 5) ? d->id + 5 : d->id);
        st->name = xstrdup(d->name);
        st->n_calls++;
        b = json_pack("{s:s,s:s,s:s,s:{}}", "type", "tool_use", "id", st->tool_id, "name",
                      st->name, "input");
    } else if (kind == BLOCK_THINKING) {
        b = json_pack("{s:s,s:s,s:s}", "type", "thinking", "thinking", "", "signature", "");
    } else {
        b = json_pack("{s:s,s:s}", "type", "text", "text", "");
    }
    event(j, json_pack("{s:s,s:i,s:o}", "type", "content_block_start", "index", idx,
                       "content_block", b));
}

/* content_block_delta, formatted by hand: one per token. */
static void delta_event(struct job *j, struct msg_state *st, const char *type, const char *field,
                        const char *text, size_t len) {
    if (!j->stream) return;
    strbuf_printf(&j->out, "event: content_block_delta\ndata: {\"type\":\"content_block_delta\","
                  "\"index\":%d,\"delta\":{\"type\":\"%s\",\"%s\":",
                  (int)json_array_size(st->content), type, field);
    sbuf_json_str(&j->out, text, len);
    strbuf_adds(&j->out, "}}\n\n");
}

static void on_delta(struct job *j, const struct chat_delta *d) {
    struct msg_state *st = j->proto_state;
    start(j, st);
    switch (d->kind) {
    case CHAT_DELTA_REASONING:
    case CHAT_DELTA_CONTENT: {
        const enum block_kind k = d->kind == CHAT_DELTA_CONTENT ? BLOCK_TEXT : BLOCK_THINKING;
        if (!d->len) return;
        if (st->kind != k) open_block(j, st, k, d);
        strbuf_add(&st->text, d->text, d->len);
        if (k == BLOCK_TEXT) delta_event(j, st, "text_delta", "text", d->text, d->len);
        else delta_event(j, st, "thinking_delta", "thinking", d->text, d->len);
        break;
    }
    case CHAT_DELTA_TOOL_START:
        open_block(j, st, BLOCK_TOOL, d);
        break;
    case CHAT_DELTA_TOOL_ARGS:
        if (!d->len || st->kind != BLOCK_TOOL) return;
        strbuf_add(&st->text, d->text, d->len);
        delta_event(j, st, "input_json_delta", "partial_json", d->text, d->len);
        break;
    }
}

static const char *stop_reason(const struct job *j, const struct msg_state *st, int truncated) {
    if (j->res.finish == ENGINE_FINISH_LENGTH || truncated) return "max_tokens";
    if (st->n_calls) return "tool_use";
    if (j->res.stop_index >= 0) return "stop_sequence";
    return "end_turn";
}

static json_t *stop_sequence(const struct job *j, const char *reason) {
    if (strcmp(reason, "stop_sequence") || j->res.stop_index >= j->req.n_stop) return json_null();
    return json_string(j->req.stop[j->res.stop_index]);
}

static void on_finish(struct job *j) {
    struct msg_state *st = j->proto_state;
    start(j, st);
    close_block(j, st);
    const char *reason = stop_reason(j, st, j->cs && chat_stream_truncated(j->cs));
    event(j, json_pack("{s:s,s:{s:s,s:o},s:o}", "type", "message_delta", "delta", "stop_reason",
                       reason, "stop_sequence", stop_sequence(j, reason), "usage", usage_json(j)));
    event(j, json_pack("{s:s}", "type", "message_stop"));
}

static void on_fail(struct job *j, int status, const char *msg) {
    struct api_error e = {.status = status};
    snprintf(e.message, sizeof e.message, "%s", msg);
    event(j, anthropic_error_json(&e));
}

static void feed_delta(void *user, const struct chat_delta *d) { on_delta(user, d); }

static json_t *on_response(struct job *j, int *status) {
    struct msg_state *st = j->proto_state;
    if (j->failed) {
        struct api_error e = {.status = j->fail_status};
        snprintf(e.message, sizeof e.message, "%s", j->fail_msg);
        *status = j->fail_status;
        return anthropic_error_json(&e);
    }
    /* the whole text through the parser that streams, so both give the same blocks */
    st->started = 1;
    struct chat_stream *cs = chat_stream_new(j->in_thinking, j->tools, NULL, feed_delta, j);
    chat_stream_push(cs, j->text.s ? j->text.s : "", j->text.len);
    chat_stream_finish(cs);
    const int truncated = chat_stream_truncated(cs);
    chat_stream_free(cs);
    close_block(j, st);
    *status = 200;
    const char *reason = stop_reason(j, st, truncated);
    return json_pack("{s:s,s:s,s:s,s:s,s:O,s:s,s:o,s:o}", "id", st->id, "type", "message", "role",
                     "assistant", "model", j->model_name, "content", st->content, "stop_reason",
                     reason, "stop_sequence", stop_sequence(j, reason), "usage", usage_json(j));
}

static void on_text(struct job *j, const char *text, size_t len) { (void)j, (void)text, (void)len; }

static const struct api_proto anthropic_proto = {
    .content_type = "text/event-stream",
    .delta = on_delta,
    .text = on_text,
    .finish = on_finish,
    .fail = on_fail,
    .response = on_response,
    .free = state_free,
};

struct job *anthropic_job_new(struct model *m, struct tokenizer *tok,
                              const struct chat_template *tmpl, const char *model_name,
                              const char *body, size_t len, uint64_t *rng, pthread_mutex_t *rng_mu,
                              int allow_forced, struct api_error *e) {
    json_t *rq = api_parse_body(body, len, e);
    if (!rq) return NULL;
    json_t *chat = to_chat(rq, 0, e);
    json_decref(rq);
    if (!chat) return NULL;
    struct job *j =
        api_job_new_json(m, tok, tmpl, model_name, 1, chat, rng, rng_mu, allow_forced, e);
    if (!j) {
        if (!strcmp(e->param, "stop")) snprintf(e->param, sizeof e->param, "stop_sequences");
        return NULL;
    }
    struct msg_state *st = xcalloc(1, sizeof *st);
    const char *rnd = strchr(j->id, '-');
    snprintf(st->id, sizeof st->id, "msg_%s", rnd ? rnd + 1 : j->id);
    st->content = json_array();
    j->proto = &anthropic_proto;
    j->proto_state = st;
    return j;
}
