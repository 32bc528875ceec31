/* responses.c - OpenAI's Responses API (POST /v1/responses) on the chat path (responses.h).
 *
 * Stateless: the conversation comes whole in `input` each time (store is accepted and means
 * nothing; previous_response_id and conversation are a 400). The request is turned into a chat
 * request - instructions and leading system / developer items -> the one system message (later
 * ones -> user turns, where they were said),
 * message items -> user / assistant messages, reasoning items -> the next assistant turn's
 * reasoning_content, function_call items -> its tool_calls, function_call_output items -> tool
 * messages, function tools {type, name, parameters} -> {type, function: {...}} - and run as a
 * chat job: the same template, tokenizer, engine and output parser as /v1/chat/completions.
 *
 * The parser's deltas become output items (reasoning with reasoning_text content, message with
 * output_text, function_call) and, when streaming, the documented events (response.created ...
 * response.completed / response.incomplete / response.failed, each with sequence_number), in
 * the shapes the openai SDK's ResponseStream accumulates. The non-streaming object is built by
 * the same code, fed the whole text at once. Not supported: hosted tools (web_search, ...: left
 * out of the prompt, so the model is not offered them), images and files, logprobs. */
#include "responses.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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

/* ---- request: Responses -> chat ------------------------------------------------------- */

/* The text of a content (a string, or parts input_text / output_text / text / refusal /
 * summary_text / reasoning_text) appended to out. */
static int content_text(const json_t *c, const char *where, size_t i, struct strbuf *out,
                        struct api_error *e) {
    if (json_is_string(c)) {
        strbuf_add(out, json_string_value(c), json_string_length(c));
        return 0;
    }
    if (!json_is_array(c))
        return bad(e, "input", "input[%zu].%s must be a string or an array of content parts", i,
                   where);
    for (size_t k = 0; k < json_array_size(c); k++) {
        const json_t *p = json_array_get(c, k);
        const char *type = json_string_value(json_object_get(p, "type"));
        if (!type)
            return bad(e, "input", "input[%zu].%s[%zu] must be an object with a 'type'", i, where,
                       k);
        if (strstr(type, "image") || strstr(type, "file") || strstr(type, "audio"))
            return bad(e, "input", "input[%zu].%s[%zu]: '%s' parts are not supported (strata "
                       "runs the text model only)", i, where, k, QUOTE(type));
        const char *field = !strcmp(type, "refusal") ? "refusal" : "text";
        const json_t *t = json_object_get(p, field);
        if (strcmp(type, "input_text") && strcmp(type, "output_text") && strcmp(type, "text") &&
            strcmp(type, "refusal") && strcmp(type, "summary_text") &&
            strcmp(type, "reasoning_text"))
            return bad(e, "input", "input[%zu].%s[%zu]: '%s' parts are not supported", i, where, k,
                       QUOTE(type));
        if (!json_is_string(t))
            return bad(e, "input", "input[%zu].%s[%zu].%s must be a string", i, where, k, field);
        strbuf_add(out, json_string_value(t), json_string_length(t));
    }
    return 0;
}

static json_t *new_assistant(json_t *msgs) {
    json_t *a = json_pack("{s:s,s:s}", "role", "assistant", "content", "");
    json_array_append_new(msgs, a);
    return a;
}

/* input (a string or items) + instructions -> chat messages. */
static json_t *input_messages(const json_t *rq, struct api_error *e) {
    const json_t *in = json_object_get(rq, "input");
    const json_t *ins = json_object_get(rq, "instructions");
    if (ins && !json_is_null(ins) && !json_is_string(ins)) {
        bad(e, "instructions", "'instructions' must be a string");
        return NULL;
    }
    if (!in || json_is_null(in)) {
        bad(e, "input", "'input' is required (a string or an array of input items)");
        return NULL;
    }
    json_t *msgs = json_array();
    struct strbuf sys = {0};
    if (json_is_string(ins) && json_string_length(ins))
        strbuf_add(&sys, json_string_value(ins), json_string_length(ins));
    if (json_is_string(in)) {
        json_array_append_new(msgs, json_pack("{s:s,s:O}", "role", "user", "content", in));
    } else if (!json_is_array(in) || json_array_size(in) == 0) {
        bad(e, "input", "'input' must be a string or a non-empty array of input items");
        goto fail;
    }
    json_t *asst = NULL; /* the assistant turn being built */
    for (size_t i = 0; json_is_array(in) && i < json_array_size(in); i++) {
        const json_t *it = json_array_get(in, i);
        if (!json_is_object(it)) {
            bad(e, "input", "input[%zu] must be an object", i);
            goto fail;
        }
        const char *type = json_string_value(json_object_get(it, "type"));
        const char *role = json_string_value(json_object_get(it, "role"));
        if (!type && role) type = "message";
        if (!type) {
            bad(e, "input", "input[%zu] must have a 'type' (message, function_call, "
                "function_call_output, reasoning)", i);
            goto fail;
        }
        struct strbuf t = {0};
        if (!strcmp(type, "message")) {
            if (!role || (strcmp(role, "user") && strcmp(role, "assistant") &&
                          strcmp(role, "system") && strcmp(role, "developer"))) {
                bad(e, "input", "input[%zu].role must be one of user, assistant, system, "
                    "developer", i);
                goto fail;
            }
            if (content_text(json_object_get(it, "content"), "content", i, &t, e) < 0) goto fail_t;
            const int sys_role = !strcmp(role, "system") || !strcmp(role, "developer");
            if (sys_role && json_array_size(msgs) == 0) {
                if (sys.len && t.len) strbuf_adds(&sys, "\n\n");
                strbuf_add(&sys, t.s ? t.s : "", t.len);
            } else if (sys_role || !strcmp(role, "user")) {
                /* a system or developer message after the conversation began (an agent may
                 * send one mid-conversation): the template takes one system message, first, so
                 * it is a user turn where it was said */
                asst = NULL;
                json_array_append_new(msgs, json_pack("{s:s,s:s%}", "role", "user", "content",
                                                      t.s ? t.s : "", t.len));
            } else {
                if (!asst || json_object_get(asst, "tool_calls") ||
                    json_string_length(json_object_get(asst, "content")))
                    asst = new_assistant(msgs);
                json_object_set_new(asst, "content", json_stringn(t.s ? t.s : "", t.len));
            }
        } else if (!strcmp(type, "reasoning")) {
            const json_t *c = json_object_get(it, "content");
            if (!c || json_is_null(c) || (json_is_array(c) && !json_array_size(c)))
                c = json_object_get(it, "summary");
            if (c && !json_is_null(c) && content_text(c, "content", i, &t, e) < 0) goto fail_t;
            asst = new_assistant(msgs);
            json_object_set_new(asst, "reasoning_content", json_stringn(t.s ? t.s : "", t.len));
        } else if (!strcmp(type, "function_call")) {
            const json_t *id = json_object_get(it, "call_id"), *name = json_object_get(it, "name");
            const json_t *args = json_object_get(it, "arguments");
            if (!json_is_string(id) || !json_is_string(name) || !json_is_string(args)) {
                bad(e, "input", "input[%zu]: a function_call item needs string 'call_id', 'name' "
                    "and 'arguments'", i);
                goto fail;
            }
            if (!asst) asst = new_assistant(msgs);
            json_t *tcs = json_object_get(asst, "tool_calls");
            if (!tcs) json_object_set_new(asst, "tool_calls", tcs = json_array());
            json_array_append_new(tcs, json_pack("{s:O,s:s,s:{s:O,s:O}}", "id", id, "type",
                                                 "function", "function", "name", name,
                                                 "arguments", args));
        } else if (!strcmp(type, "function_call_output")) {
            const json_t *id = json_object_get(it, "call_id");
            if (!json_is_string(id)) {
                bad(e, "input", "input[%zu]: a function_call_output item needs a string "
                    "'call_id'", i);
                goto fail;
            }
            if (content_text(json_object_get(it, "output"), "output", i, &t, e) < 0) goto fail_t;
            asst = NULL;
            json_array_append_new(msgs, json_pack("{s:s,s:O,s:s%}", "role", "tool", "tool_call_id",
                                                  id, "content", t.s ? t.s : "", t.len));
        } else if (!strcmp(type, "item_reference")) {
            bad(e, "input", "input[%zu]: item_reference needs stored responses; strata's Responses "
                "API is stateless (send the items themselves)", i);
            goto fail;
        } else {
            bad(e, "input", "input[%zu]: '%s' items are not supported (message, function_call, "
                "function_call_output and reasoning are)", i, QUOTE(type));
            goto fail;
        }
        free(t.s);
        continue;
    fail_t:
        free(t.s);
        goto fail;
    }
    if (sys.len) json_array_insert_new(msgs, 0, json_pack("{s:s,s:s%}", "role", "system",
                                                          "content", sys.s, sys.len));
    free(sys.s);
    return msgs;
fail:
    free(sys.s);
    json_decref(msgs);
    return NULL;
}

/* The Responses request as a chat request (a new reference), or NULL + e. */
static json_t *to_chat(const json_t *rq, struct api_error *e) {
    const json_t *v;
    if ((v = json_object_get(rq, "previous_response_id")) && !json_is_null(v)) {
        bad(e, "previous_response_id", "'previous_response_id' needs stored responses; strata's "
            "Responses API is stateless: send the whole conversation in 'input'");
        return NULL;
    }
    if ((v = json_object_get(rq, "conversation")) && !json_is_null(v)) {
        bad(e, "conversation", "'conversation' needs stored conversations; strata's Responses "
            "API is stateless: send the whole conversation in 'input'");
        return NULL;
    }
    if ((v = json_object_get(rq, "background")) && json_is_true(v)) {
        bad(e, "background", "'background' responses need stored responses; strata's Responses "
            "API is stateless");
        return NULL;
    }
    if ((v = json_object_get(rq, "top_logprobs")) && !json_is_null(v) &&
        !(json_is_integer(v) && json_integer_value(v) == 0)) {
        bad(e, "top_logprobs", "'top_logprobs' is not supported");
        return NULL;
    }
    if ((v = json_object_get(rq, "store")) && !json_is_null(v) && !json_is_boolean(v)) {
        bad(e, "store", "'store' must be a boolean");
        return NULL;
    }
    json_t *msgs = input_messages(rq, e);
    if (!msgs) return NULL;
    json_t *c = json_pack("{s:o}", "messages", msgs);
    /* the fields chat reads the same way (llama-server's extensions among them) */
    static const char *const same[] = {"model", "temperature", "top_p", "top_k", "min_p", "seed",
                                       "presence_penalty", "frequency_penalty",
                                       "repetition_penalty", "stream", "parallel_tool_calls",
                                       "chat_template_kwargs", "ignore_eos",
                                       "strata_forced_output"};
    for (size_t i = 0; i < sizeof same / sizeof same[0]; i++)
        if ((v = json_object_get(rq, same[i]))) json_object_set(c, same[i], (json_t *)v);
    if ((v = json_object_get(rq, "max_output_tokens")) && !json_is_null(v)) {
        if (!json_is_integer(v) || json_integer_value(v) < 1) {
            bad(e, "max_output_tokens", "'max_output_tokens' must be an integer >= 1");
            goto fail;
        }
        json_object_set(c, "max_tokens", (json_t *)v);
    }

    /* tools: function tools in the Responses flat shape, also inside a namespace (a named group
     * of them, as Codex sends); hosted tools (web_search, file_search, ...) that this server
     * cannot run are left out of the prompt, so the model does not call them */
    const json_t *tools = json_object_get(rq, "tools");
    if (tools && !json_is_null(tools)) {
        if (!json_is_array(tools)) {
            bad(e, "tools", "'tools' must be an array");
            goto fail;
        }
        json_t *ct = json_array();
        json_object_set_new(c, "tools", ct);
        for (size_t i = 0; i < json_array_size(tools); i++) {
            const json_t *t = json_array_get(tools, i);
            const char *type = json_string_value(json_object_get(t, "type"));
            if (!type) {
                bad(e, "tools", "tools[%zu] must be an object with a 'type'", i);
                goto fail;
            }
            const json_t *group = json_object_get(t, "tools");
            const int ns = !strcmp(type, "namespace");
            if (ns && !json_is_array(group)) {
                bad(e, "tools", "tools[%zu]: a namespace needs a 'tools' array", i);
                goto fail;
            }
            if (!ns && strcmp(type, "function") != 0) continue;
            for (size_t k = 0; k < (ns ? json_array_size(group) : 1); k++) {
                const json_t *f0 = ns ? json_array_get(group, k) : t;
                const char *ft = json_string_value(json_object_get(f0, "type"));
                if (ns && (!ft || strcmp(ft, "function"))) continue;
                const json_t *name = json_object_get(f0, "name");
                if (!json_is_string(name)) {
                    bad(e, "tools", "tools[%zu]%s must have a string 'name'", i,
                        ns ? ": a function in the namespace" : "");
                    goto fail;
                }
                json_t *f = json_pack("{s:O}", "name", name);
                if ((v = json_object_get(f0, "description")) && json_is_string(v))
                    json_object_set(f, "description", (json_t *)v);
                if ((v = json_object_get(f0, "parameters")) && !json_is_null(v))
                    json_object_set(f, "parameters", (json_t *)v);
                json_array_append_new(ct, json_pack("{s:s,s:o}", "type", "function", "function",
                                                    f));
            }
        }
        if (json_array_size(ct) == 0) json_object_del(c, "tools");
    }
    /* tool_choice: chat's shapes (the chat path decides what it supports) */
    if ((v = json_object_get(rq, "tool_choice")) && !json_is_null(v)) {
        if (json_is_string(v)) {
            json_object_set(c, "tool_choice", (json_t *)v);
        } else {
            const char *type = json_string_value(json_object_get(v, "type"));
            const json_t *name = json_object_get(v, "name");
            if (!type || strcmp(type, "function") || !json_is_string(name)) {
                bad(e, "tool_choice", "'tool_choice' must be \"auto\", \"none\", \"required\" or "
                    "{\"type\":\"function\",\"name\":...}");
                goto fail;
            }
            json_object_set_new(c, "tool_choice", json_pack("{s:s,s:{s:O}}", "type", "function",
                                                            "function", "name", name));
        }
    }
    /* text.format -> response_format (the chat path decides what it supports) */
    const json_t *fmt = json_object_get(json_object_get(rq, "text"), "format");
    if (fmt && !json_is_null(fmt)) {
        const char *type = json_string_value(json_object_get(fmt, "type"));
        if (!type) {
            bad(e, "text.format", "'text.format' must be an object with a 'type'");
            goto fail;
        }
        if (!strcmp(type, "json_schema")) {
            json_t *js = json_deep_copy(fmt);
            json_object_del(js, "type");
            json_object_set_new(c, "response_format", json_pack("{s:s,s:o}", "type",
                                                                "json_schema", "json_schema", js));
        } else if (strcmp(type, "text") != 0) {
            json_object_set_new(c, "response_format", json_pack("{s:s}", "type", type));
        }
    }
    /* reasoning.effort: none / minimal -> the template's thinking off, the others on; an
     * explicit chat_template_kwargs.enable_thinking wins */
    const json_t *effort = json_object_get(json_object_get(rq, "reasoning"), "effort");
    if (json_is_string(effort) && !json_object_get(json_object_get(c, "chat_template_kwargs"),
                                                   "enable_thinking")) {
        const char *ef = json_string_value(effort);
        int on = strcmp(ef, "none") && strcmp(ef, "minimal");
        json_t *kw = json_object_get(c, "chat_template_kwargs");
        if (!json_is_object(kw)) {
            kw = json_object();
            json_object_set_new(c, "chat_template_kwargs", kw);
        } else {
            kw = json_copy(kw);
            json_object_set_new(c, "chat_template_kwargs", kw);
        }
        json_object_set_new(kw, "enable_thinking", json_boolean(on));
    }
    return c;
fail:
    json_decref(c);
    return NULL;
}

/* ---- output: items and events ---------------------------------------------------------- */

enum item_kind { ITEM_NONE, ITEM_REASONING, ITEM_MESSAGE, ITEM_CALL };

struct resp_state {
    char id[64];      /* resp_<random> */
    json_t *rq;       /* the client's request, for the fields a response echoes */
    struct tokenizer *tok;
    long created;
    int seq;          /* the next event's sequence_number */
    int started;      /* response.created sent */
    json_t *output;   /* the items done */
    /* the item being written */
    enum item_kind kind;
    char item_id[96];
    struct strbuf text; /* its text (reasoning, message) or arguments (call) */
    char *call_id, *name;
    int n_calls;
    struct strbuf reasoning; /* all reasoning text (usage.reasoning_tokens) */
};

static void state_free(void *p) {
    struct resp_state *st = p;
    if (!st) return;
    json_decref(st->rq);
    json_decref(st->output);
    free(st->text.s);
    free(st->reasoning.s);
    free(st->call_id);
    free(st->name);
    free(st);
}

/* An event (taken over): its sequence_number added, framed as SSE into j->out. Streams only. */
static void event(struct job *j, struct resp_state *st, json_t *ev) {
    if (!j->stream) {
        json_decref(ev);
        return;
    }
    json_object_set_new(ev, "sequence_number", json_integer(st->seq++));
    char *s = json_dumps(ev, JSON_COMPACT);
    strbuf_printf(&j->out, "event: %s\ndata: %s\n\n",
                  json_string_value(json_object_get(ev, "type")), s ? s : "{}");
    free(s);
    json_decref(ev);
}

static json_t *echo(const json_t *rq, const char *k, json_t *dflt) {
    const json_t *v = json_object_get(rq, k);
    if (v && !json_is_null(v)) {
        json_decref(dflt);
        return json_deep_copy(v);
    }
    return dflt;
}

static json_t *usage_json(struct job *j, struct resp_state *st) {
    int reasoning = 0;
    if (st->reasoning.len) {
        int32_t *ids = NULL;
        struct error err;
        if (tokenizer_encode(st->tok, st->reasoning.s, st->reasoning.len, &ids, &reasoning, &err))
            reasoning = 0;
        free(ids);
        if (reasoning > j->res.n_generated) reasoning = j->res.n_generated;
    }
    return json_pack("{s:i,s:{s:i},s:i,s:{s:i},s:i}", "input_tokens", j->res.n_prompt,
                     "input_tokens_details", "cached_tokens", j->res.timings.cache_n,
                     "output_tokens", j->res.n_generated, "output_tokens_details",
                     "reasoning_tokens", reasoning, "total_tokens",
                     j->res.n_prompt + j->res.n_generated);
}

/* The response object; status "in_progress" (no usage yet), "completed", "incomplete" or
 * "failed" (error_msg). */
static json_t *response_object(struct job *j, struct resp_state *st, const char *status,
                               const char *error_msg) {
    const json_t *rq = st->rq;
    const int done = strcmp(status, "in_progress") != 0 && strcmp(status, "failed") != 0;
    json_t *r = json_pack("{s:s,s:s,s:I,s:s}", "id", st->id, "object", "response", "created_at",
                          (json_int_t)st->created, "status", status);
    json_object_set_new(r, "background", json_false());
    json_object_set_new(r, "error", error_msg ? json_pack("{s:s,s:s}", "code", "server_error",
                                                          "message", error_msg)
                                              : json_null());
    json_object_set_new(r, "incomplete_details",
                        !strcmp(status, "incomplete")
                            ? json_pack("{s:s}", "reason", "max_output_tokens") : json_null());
    json_object_set_new(r, "instructions", echo(rq, "instructions", json_null()));
    json_object_set_new(r, "max_output_tokens", echo(rq, "max_output_tokens", json_null()));
    json_object_set_new(r, "model", json_string(j->model_name));
    json_object_set_new(r, "output", strcmp(status, "in_progress") ? json_deep_copy(st->output)
                                                                   : json_array());
    json_object_set_new(r, "parallel_tool_calls", echo(rq, "parallel_tool_calls", json_true()));
    json_object_set_new(r, "previous_response_id", json_null());
    json_object_set_new(r, "reasoning",
                        echo(rq, "reasoning", json_pack("{s:n,s:n}", "effort", "summary")));
    json_object_set_new(r, "store", json_false());
    /* the sampler's floats as the decimals they were given (0.8, not 0.800000011920929) */
    json_object_set_new(r, "temperature",
                        json_real(round(j->req.sampling.temperature * 1e6) / 1e6));
    json_object_set_new(r, "text",
                        echo(rq, "text", json_pack("{s:{s:s}}", "format", "type", "text")));
    json_object_set_new(r, "tool_choice", echo(rq, "tool_choice", json_string("auto")));
    json_object_set_new(r, "tools", echo(rq, "tools", json_array()));
    json_object_set_new(r, "top_p", json_real(round(j->req.sampling.top_p * 1e6) / 1e6));
    json_object_set_new(r, "truncation", json_string("disabled"));
    json_object_set_new(r, "usage", done ? usage_json(j, st) : json_null());
    json_object_set_new(r, "user", echo(rq, "user", json_null()));
    json_object_set_new(r, "metadata", echo(rq, "metadata", json_object()));
    return r;
}

static void start(struct job *j, struct resp_state *st) {
    if (st->started) return;
    st->started = 1;
    event(j, st, json_pack("{s:s,s:o}", "type", "response.created", "response",
                           response_object(j, st, "in_progress", NULL)));
    event(j, st, json_pack("{s:s,s:o}", "type", "response.in_progress", "response",
                           response_object(j, st, "in_progress", NULL)));
}

/* The item being written as a JSON object; status "in_progress" (just opened) or
 * "completed" (its text whole). */
static json_t *item_json(struct resp_state *st, const char *status) {
    const int open = !strcmp(status, "in_progress");
    const char *text = st->text.s ? st->text.s : "";
    switch (st->kind) {
    case ITEM_REASONING:
        return json_pack("{s:s,s:s,s:[],s:o}", "id", st->item_id, "type", "reasoning", "summary",
                         "content", open ? json_array()
                                         : json_pack("[{s:s,s:s%}]", "type", "reasoning_text",
                                                     "text", text, st->text.len));
    case ITEM_MESSAGE:
        return json_pack("{s:s,s:s,s:s,s:s,s:o}", "id", st->item_id, "type", "message", "status",
                         status, "role", "assistant", "content",
                         open ? json_array()
                              : json_pack("[{s:s,s:s%,s:[],s:[]}]", "type", "output_text", "text",
                                          text, st->text.len, "annotations", "logprobs"));
    case ITEM_CALL:
        return json_pack("{s:s,s:s,s:s,s:s,s:s,s:s%}", "id", st->item_id, "type", "function_call",
                         "status", status, "call_id", st->call_id, "name", st->name, "arguments",
                         open ? "" : text, open ? (size_t)0 : st->text.len);
    case ITEM_NONE:
        break;
    }
    return NULL;
}

static void close_item(struct job *j, struct resp_state *st) {
    if (st->kind == ITEM_NONE) return;
    const int idx = (int)json_array_size(st->output);
    const char *text = st->text.s ? st->text.s : "";
    if (st->kind == ITEM_REASONING || st->kind == ITEM_MESSAGE) {
        const int msg = st->kind == ITEM_MESSAGE;
        json_t *done = json_pack("{s:s,s:s,s:i,s:i,s:s%}", "type",
                                 msg ? "response.output_text.done" : "response.reasoning_text.done",
                                 "item_id", st->item_id, "output_index", idx, "content_index", 0,
                                 "text", text, st->text.len);
        if (msg) json_object_set_new(done, "logprobs", json_array());
        event(j, st, done);
        json_t *part = msg ? json_pack("{s:s,s:s%,s:[],s:[]}", "type", "output_text", "text", text,
                                       st->text.len, "annotations", "logprobs")
                           : json_pack("{s:s,s:s%}", "type", "reasoning_text", "text", text,
                                       st->text.len);
        event(j, st, json_pack("{s:s,s:s,s:i,s:i,s:o}", "type", "response.content_part.done",
                               "item_id", st->item_id, "output_index", idx, "content_index", 0,
                               "part", part));
    } else {
        event(j, st, json_pack("{s:s,s:s,s:i,s:s,s:s%}", "type",
                               "response.function_call_arguments.done", "item_id", st->item_id,
                               "output_index", idx, "name", st->name, "arguments", text,
                               st->text.len));
    }
    json_t *item = item_json(st, "completed");
    event(j, st, json_pack("{s:s,s:i,s:O}", "type", "response.output_item.done", "output_index",
                           idx, "item", item));
    json_array_append_new(st->output, item);
    st->kind = ITEM_NONE;
    st->text.len = 0;
    if (st->text.s) st->text.s[0] = 0;
}

static void open_item(struct job *j, struct resp_state *st, enum item_kind kind,
                      const struct chat_delta *d) {
    close_item(j, st);
    const int idx = (int)json_array_size(st->output);
    static const char *const prefix[] = {"", "rs", "msg", "fc"};
    snprintf(st->item_id, sizeof st->item_id, "%s_%s_%d", prefix[kind], st->id + 5, idx);
    st->kind = kind;
    if (kind == ITEM_CALL) {
        free(st->call_id);
        free(st->name);
        st->call_id = xstrdup(d->id);
        st->name = xstrdup(d->name);
        st->n_calls++;
    }
    event(j, st, json_pack("{s:s,s:i,s:o}", "type", "response.output_item.added", "output_index",
                           idx, "item", item_json(st, "in_progress")));
    if (kind == ITEM_CALL) return;
    json_t *part = kind == ITEM_MESSAGE
                       ? json_pack("{s:s,s:s,s:[],s:[]}", "type", "output_text", "text", "",
                                   "annotations", "logprobs")
                       : json_pack("{s:s,s:s}", "type", "reasoning_text", "text", "");
    event(j, st, json_pack("{s:s,s:s,s:i,s:i,s:o}", "type", "response.content_part.added",
                           "item_id", st->item_id, "output_index", idx, "content_index", 0,
                           "part", part));
}

/* A delta event, formatted by hand: one per token. */
static void delta_event(struct job *j, struct resp_state *st, const char *type, int content_index,
                        const char *text, size_t len) {
    if (!j->stream) return;
    strbuf_printf(&j->out, "event: %s\ndata: {\"type\":\"%s\",\"sequence_number\":%d,\"item_id\":"
                  "\"%s\",\"output_index\":%d,", type, type, st->seq++, st->item_id,
                  (int)json_array_size(st->output));
    if (content_index >= 0) strbuf_printf(&j->out, "\"content_index\":%d,", content_index);
    strbuf_adds(&j->out, "\"delta\":");
    sbuf_json_str(&j->out, text, len);
    strbuf_adds(&j->out, st->kind == ITEM_MESSAGE ? ",\"logprobs\":[]}\n\n" : "}\n\n");
}

static void on_delta(struct job *j, const struct chat_delta *d) {
    struct resp_state *st = j->proto_state;
    start(j, st);
    switch (d->kind) {
    case CHAT_DELTA_REASONING:
    case CHAT_DELTA_CONTENT: {
        const enum item_kind k = d->kind == CHAT_DELTA_CONTENT ? ITEM_MESSAGE : ITEM_REASONING;
        if (!d->len) return;
        if (st->kind != k) open_item(j, st, k, d);
        strbuf_add(&st->text, d->text, d->len);
        if (k == ITEM_REASONING) strbuf_add(&st->reasoning, d->text, d->len);
        delta_event(j, st, k == ITEM_MESSAGE ? "response.output_text.delta"
                                             : "response.reasoning_text.delta", 0, d->text, d->len);
        break;
    }
    case CHAT_DELTA_TOOL_START:
        open_item(j, st, ITEM_CALL, d);
        break;
    case CHAT_DELTA_TOOL_ARGS:
        if (!d->len || st->kind != ITEM_CALL) return;
        strbuf_add(&st->text, d->text, d->len);
        delta_event(j, st, "response.function_call_arguments.delta", -1, d->text, d->len);
        break;
    }
}

static const char *final_status(struct job *j, struct resp_state *st, int truncated) {
    (void)st;
    return j->res.finish == ENGINE_FINISH_LENGTH || truncated ? "incomplete" : "completed";
}

static void on_finish(struct job *j) {
    struct resp_state *st = j->proto_state;
    start(j, st);
    close_item(j, st);
    const char *status = final_status(j, st, j->cs && chat_stream_truncated(j->cs));
    event(j, st, json_pack("{s:s,s:o}", "type", !strcmp(status, "completed")
                                                    ? "response.completed" : "response.incomplete",
                           "response", response_object(j, st, status, NULL)));
}

static void on_fail(struct job *j, int status, const char *msg) {
    struct resp_state *st = j->proto_state;
    (void)status;
    start(j, st);
    close_item(j, st);
    event(j, st, json_pack("{s:s,s:o}", "type", "response.failed", "response",
                           response_object(j, st, "failed", msg)));
}

static void feed_delta(void *user, const struct chat_delta *d) { on_delta(user, d); }

static json_t *on_response(struct job *j, int *status) {
    struct resp_state *st = j->proto_state;
    if (j->failed) {
        struct api_error e = {.status = j->fail_status,
                              .type = j->fail_status == 503 ? "unavailable_error" : "server_error"};
        snprintf(e.message, sizeof e.message, "%s", j->fail_msg);
        *status = j->fail_status;
        return api_error_json(&e);
    }
    /* the whole text through the parser that streams, so both give the same items */
    st->started = 1;
    struct chat_stream *cs = chat_stream_new(j->in_thinking, j->tools, NULL, feed_delta, j);
    chat_stream_push(cs, j->text.s ? j->text.s : "", j->text.len);
    chat_stream_finish(cs);
    const int truncated = chat_stream_truncated(cs);
    chat_stream_free(cs);
    close_item(j, st);
    *status = 200;
    return response_object(j, st, final_status(j, st, truncated), NULL);
}

static void on_text(struct job *j, const char *text, size_t len) { (void)j, (void)text, (void)len; }

static const struct api_proto responses_proto = {
    .content_type = "text/event-stream",
    .delta = on_delta,
    .text = on_text,
    .finish = on_finish,
    .fail = on_fail,
    .response = on_response,
    .free = state_free,
};

struct job *responses_job_new(struct model *m, struct tokenizer *tok,
                              const struct chat_template *tmpl, const char *model_name,
                              const char *body, size_t len, uint64_t *rng, pthread_mutex_t *rng_mu,
                              int allow_forced, struct api_error *e) {
    json_t *rq = api_parse_body(body, len, e);
    if (!rq) return NULL;
    json_t *chat = to_chat(rq, e);
    if (!chat) {
        json_decref(rq);
        return NULL;
    }
    struct job *j =
        api_job_new_json(m, tok, tmpl, model_name, 1, chat, rng, rng_mu, allow_forced, e);
    if (!j) {
        if (!strcmp(e->param, "messages")) snprintf(e->param, sizeof e->param, "input");
        if (!strcmp(e->param, "max_tokens"))
            snprintf(e->param, sizeof e->param, "max_output_tokens");
        json_decref(rq);
        return NULL;
    }
    struct resp_state *st = xcalloc(1, sizeof *st);
    const char *rnd = strchr(j->id, '-');
    snprintf(st->id, sizeof st->id, "resp_%s", rnd ? rnd + 1 : j->id);
    st->rq = rq;
    st->tok = tok;
    st->created = j->created;
    st->output = json_array();
    j->proto = &responses_proto;
    j->proto_state = st;
    return j;
}
