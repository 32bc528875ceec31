/* ollama.c - Ollama's native API (see ollama.h), after Ollama's docs/api.md: the request
 * fields of /api/chat and /api/generate, the NDJSON chunks ({"model","created_at","message" or
 * "response","done":false}) and the final object (done_reason and the durations, in
 * nanoseconds), tool calls whose arguments are an object, the thinking field, and the model
 * listings (/api/tags, /api/show, /api/ps).
 *
 * A request becomes an OpenAI chat request (messages, tools, chat_template_kwargs, sampling
 * fields from options) that api_job_new validates and renders exactly as /v1/chat/completions;
 * /api/generate with raw becomes a completion of the prompt text. What is not here: model
 * management (pull, push, create, copy, delete: one checkpoint is served), embeddings, images,
 * the Go template override and the `context` token list of old /api/generate clients.
 * `format` is constrained decoding (ollama_format). */
#include "ollama.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/engine.h"
#include "model/config.h"
#include "model/model.h"
#include "text/tokenizer.h"

static int refuse(struct api_error *e, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int refuse(struct api_error *e, int status, const char *fmt, ...) {
    e->status = status;
    e->type = "invalid_request_error";
    e->ollama = 1;
    e->param[0] = 0;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return -1;
}

/* Ollama's timestamps: RFC 3339 in UTC with nanoseconds, "2026-12-01T23:52:19.385406455Z". */
static void now_rfc3339(char *buf, size_t cap) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    char day[32];
    strftime(day, sizeof day, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(buf, cap, "%s.%09ldZ", day, ts.tv_nsec);
}

static void unix_rfc3339(long t, char *buf, size_t cap) {
    time_t tt = (time_t)t;
    struct tm tm;
    gmtime_r(&tt, &tm);
    strftime(buf, cap, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

/* ---- the request, as an OpenAI chat request ------------------------------------------- */

/* options -> the OpenAI request's sampling fields. Options Ollama has that do not apply here
 * (num_gpu, num_thread, mirostat, ...) are accepted and ignored, as Ollama ignores the ones a
 * runner lacks. */
static const struct { const char *ollama, *openai; } option_map[] = {
    {"temperature", "temperature"},
    {"top_k", "top_k"},
    {"top_p", "top_p"},
    {"min_p", "min_p"},
    {"repeat_penalty", "repetition_penalty"},
    {"presence_penalty", "presence_penalty"},
    {"frequency_penalty", "frequency_penalty"},
    {"seed", "seed"},
    {"stop", "stop"},
    {"num_predict", "n_predict"},
};
#define N_OPTION_MAP (sizeof option_map / sizeof option_map[0])

/* format: "json" or a JSON schema: constrained decoding, as the OpenAI request's
 * response_format ({"type":"json_object"} or {"type":"json_schema","json_schema":{...}}); the
 * chat path compiles the grammar and refuses what it does not support. */
static int ollama_format(const json_t *v, json_t *out, struct api_error *e) {
    if (!v || json_is_null(v) || (json_is_string(v) && json_string_length(v) == 0)) return 0;
    if (json_is_string(v) && !strcmp(json_string_value(v), "json")) {
        json_object_set_new(out, "response_format", json_pack("{s:s}", "type", "json_object"));
        return 0;
    }
    if (!json_is_object(v)) return refuse(e, 400, "'format' must be \"json\" or a JSON schema object");
    json_object_set_new(out, "response_format",
                        json_pack("{s:s,s:{s:s,s:O,s:b}}", "type", "json_schema", "json_schema", "name",
                                  "format", "schema", v, "strict", 1));
    return 0;
}

/* One Ollama message -> the OpenAI message the chat template reads. */
static json_t *convert_message(const json_t *m, size_t i, struct api_error *e) {
    if (!json_is_object(m)) {
        refuse(e, 400, "messages[%zu] must be an object", i);
        return NULL;
    }
    const json_t *images = json_object_get(m, "images");
    if (json_is_array(images) && json_array_size(images) > 0) {
        refuse(e, 400, "messages[%zu].images: images are not supported (strata runs the text "
               "model only)", i);
        return NULL;
    }
    const json_t *content = json_object_get(m, "content");
    if (content && !json_is_null(content) && !json_is_string(content)) {
        refuse(e, 400, "messages[%zu].content must be a string", i);
        return NULL;
    }
    json_t *o = json_object();
    const json_t *role = json_object_get(m, "role");
    if (role) json_object_set(o, "role", (json_t *)role);
    json_object_set_new(o, "content", content && json_is_string(content) ? json_copy((json_t *)content)
                                                                          : json_string(""));
    const json_t *thinking = json_object_get(m, "thinking");
    if (json_is_string(thinking) && json_string_length(thinking))
        json_object_set(o, "reasoning_content", (json_t *)thinking);
    const json_t *calls = json_object_get(m, "tool_calls");
    if (calls && !json_is_null(calls)) {
        if (!json_is_array(calls)) {
            json_decref(o);
            refuse(e, 400, "messages[%zu].tool_calls must be an array", i);
            return NULL;
        }
        json_t *oc = json_array();
        for (size_t k = 0; k < json_array_size(calls); k++) {
            const json_t *f = json_object_get(json_array_get(calls, k), "function");
            const json_t *name = json_object_get(f, "name"), *args = json_object_get(f, "arguments");
            if (!json_is_string(name) || (args && !json_is_object(args) && !json_is_null(args))) {
                json_decref(oc);
                json_decref(o);
                refuse(e, 400, "messages[%zu].tool_calls[%zu] must be {\"function\":{\"name\":"
                       "string,\"arguments\":object}}", i, k);
                return NULL;
            }
            json_array_append_new(oc, json_pack("{s:s,s:{s:O,s:o}}", "type", "function", "function",
                                                "name", name, "arguments",
                                                json_is_object(args) ? json_copy((json_t *)args)
                                                                     : json_object()));
        }
        json_object_set_new(o, "tool_calls", oc);
    }
    return o;
}

/* Builds the OpenAI request; *raw for /api/generate with raw: true (a completion). 1 when the
 * request only loads the model (no prompt, no messages), 0 to run it, -1 refused. */
static int to_openai(const json_t *rq, int is_generate, json_t *out, int *raw, int *num_ctx,
                     char (*from_options)[64], int *n_from_options, struct api_error *e) {
    const json_t *v;
    *raw = 0;
    *num_ctx = 0;
    *n_from_options = 0;
    if ((v = json_object_get(rq, "model")) && !json_is_null(v) && !json_is_string(v))
        return refuse(e, 400, "'model' must be a string");
    v = json_object_get(rq, "stream");
    if (v && !json_is_null(v) && !json_is_boolean(v)) return refuse(e, 400, "'stream' must be a boolean");
    json_object_set_new(out, "stream", json_boolean(!v || json_is_null(v) || json_is_true(v)));
    v = json_object_get(rq, "keep_alive"); /* the model stays loaded: accepted, nothing to do */
    if (v && !json_is_null(v) && !json_is_string(v) && !json_is_number(v))
        return refuse(e, 400, "'keep_alive' must be a duration string (\"5m\") or a number of seconds");
    if (ollama_format(json_object_get(rq, "format"), out, e)) return -1;

    v = json_object_get(rq, "think");
    if (v && !json_is_null(v)) {
        const char *lvl = json_string_value(v);
        int on;
        if (json_is_boolean(v)) on = json_is_true(v);
        else if (lvl && (!strcmp(lvl, "high") || !strcmp(lvl, "medium") || !strcmp(lvl, "low"))) on = 1;
        else return refuse(e, 400, "'think' must be true, false, or \"high\", \"medium\", \"low\"");
        json_object_set_new(out, "chat_template_kwargs", json_pack("{s:b}", "enable_thinking", on));
    }

    json_object_set_new(out, "n_predict", json_integer(-1)); /* Ollama: no limit by default */
    v = json_object_get(rq, "options");
    if (v && !json_is_null(v)) {
        if (!json_is_object(v)) return refuse(e, 400, "'options' must be an object");
        for (size_t i = 0; i < N_OPTION_MAP; i++) {
            const json_t *x = json_object_get(v, option_map[i].ollama);
            if (!x || json_is_null(x)) continue;
            if (!strcmp(option_map[i].ollama, "num_predict") && json_is_integer(x) &&
                json_integer_value(x) < 0)
                x = json_integer(-1); /* -1 unlimited, -2 fill the context: the same here */
            else
                json_incref((json_t *)x);
            json_object_set_new(out, option_map[i].openai, (json_t *)x);
            snprintf(from_options[(*n_from_options)++], 64, "%s", option_map[i].openai);
        }
        const json_t *nc = json_object_get(v, "num_ctx");
        if (nc && !json_is_null(nc)) {
            if (!json_is_integer(nc) || json_integer_value(nc) < 1 || json_integer_value(nc) > 1 << 30)
                return refuse(e, 400, "'options.num_ctx' must be a positive integer");
            *num_ctx = (int)json_integer_value(nc);
        }
    }
    v = json_object_get(rq, "tools");
    if (v && !json_is_null(v)) json_object_set(out, "tools", (json_t *)v);
    if ((v = json_object_get(rq, "strata_forced_output"))) json_object_set(out, "strata_forced_output", (json_t *)v);

    json_t *msgs = json_array();
    json_object_set_new(out, "messages", msgs);
    if (!is_generate) {
        v = json_object_get(rq, "messages");
        if (!v || json_is_null(v) || (json_is_array(v) && json_array_size(v) == 0)) return 1;
        if (!json_is_array(v)) return refuse(e, 400, "'messages' must be an array");
        for (size_t i = 0; i < json_array_size(v); i++) {
            json_t *m = convert_message(json_array_get(v, i), i, e);
            if (!m) return -1;
            json_array_append_new(msgs, m);
        }
        return 0;
    }

    static const char *const no_generate[] = {"context", "images"};
    for (size_t i = 0; i < 2; i++) {
        v = json_object_get(rq, no_generate[i]);
        if (json_is_array(v) && json_array_size(v) > 0)
            return refuse(e, 400, "'%s' is not supported (%s)", no_generate[i],
                          i == 0 ? "send the conversation to /api/chat instead of the token list "
                                   "of an earlier reply"
                                 : "strata runs the text model only");
    }
    v = json_object_get(rq, "suffix");
    if (v && !json_is_null(v) && !(json_is_string(v) && json_string_length(v) == 0))
        return refuse(e, 400, "'suffix' (fill-in-the-middle) is not supported: the Qwen3.5 chat "
                      "template has no fill-in-the-middle form");
    v = json_object_get(rq, "template");
    if (v && !json_is_null(v) && !(json_is_string(v) && json_string_length(v) == 0))
        return refuse(e, 400, "'template' cannot be overridden: strata renders the checkpoint's "
                      "own Qwen3.5 chat template (use raw: true with a prompt you formatted)");
    v = json_object_get(rq, "raw");
    if (v && !json_is_null(v) && !json_is_boolean(v)) return refuse(e, 400, "'raw' must be a boolean");
    *raw = json_is_true(v);
    const json_t *prompt = json_object_get(rq, "prompt");
    if (prompt && !json_is_null(prompt) && !json_is_string(prompt))
        return refuse(e, 400, "'prompt' must be a string");
    const json_t *system = json_object_get(rq, "system");
    if (system && !json_is_null(system) && !json_is_string(system))
        return refuse(e, 400, "'system' must be a string");
    if (!prompt || json_is_null(prompt) || json_string_length(prompt) == 0) return 1;
    if (*raw) {
        if (json_is_string(system) && json_string_length(system))
            return refuse(e, 400, "'system' has no place in a raw prompt (put it in the prompt)");
        json_object_del(out, "messages");
        json_object_del(out, "tools");
        json_object_del(out, "chat_template_kwargs");
        json_object_set(out, "prompt", (json_t *)prompt);
        return 0;
    }
    if (json_is_string(system) && json_string_length(system))
        json_array_append_new(msgs, json_pack("{s:s,s:O}", "role", "system", "content", system));
    json_array_append_new(msgs, json_pack("{s:s,s:O}", "role", "user", "content", prompt));
    return 0;
}

/* ---- framing ---------------------------------------------------------------------------- */

struct ollama_call {
    char *id, *name;
    struct strbuf args; /* the JSON object text, as the parser streams it */
};

struct ollama_job {
    int generate;     /* "response" (and top-level "thinking") instead of "message" */
    char model[256];  /* echoed as the request named it */
    double t0;        /* now_ms() when the request arrived */
    struct ollama_call *calls;
    int n_calls;
};

static void ollama_job_free(void *p) {
    struct ollama_job *o = p;
    if (!o) return;
    for (int i = 0; i < o->n_calls; i++) {
        free(o->calls[i].id);
        free(o->calls[i].name);
        free(o->calls[i].args.s);
    }
    free(o->calls);
    free(o);
}

/* `{"model":...,"created_at":...,` */
static void chunk_head(struct strbuf *b, const struct ollama_job *o) {
    char ts[64];
    now_rfc3339(ts, sizeof ts);
    strbuf_adds(b, "{\"model\":");
    sbuf_json_str(b, o->model, strlen(o->model));
    strbuf_printf(b, ",\"created_at\":\"%s\",", ts);
}

/* One piece of content or thinking as its own NDJSON line. */
static void chunk_text(struct job *j, int thinking, const char *text, size_t len) {
    struct ollama_job *o = j->proto_state;
    chunk_head(&j->out, o);
    if (o->generate) {
        strbuf_adds(&j->out, "\"response\":");
        sbuf_json_str(&j->out, thinking ? "" : text, thinking ? 0 : len);
        if (thinking) {
            strbuf_adds(&j->out, ",\"thinking\":");
            sbuf_json_str(&j->out, text, len);
        }
    } else {
        strbuf_adds(&j->out, "\"message\":{\"role\":\"assistant\",\"content\":");
        sbuf_json_str(&j->out, thinking ? "" : text, thinking ? 0 : len);
        if (thinking) {
            strbuf_adds(&j->out, ",\"thinking\":");
            sbuf_json_str(&j->out, text, len);
        }
        strbuf_adds(&j->out, "}");
    }
    strbuf_adds(&j->out, ",\"done\":false}\n");
}

static void on_delta(struct job *j, const struct chat_delta *d) {
    struct ollama_job *o = j->proto_state;
    switch (d->kind) {
    case CHAT_DELTA_CONTENT:
    case CHAT_DELTA_REASONING:
        if (d->len) chunk_text(j, d->kind == CHAT_DELTA_REASONING, d->text, d->len);
        break;
    case CHAT_DELTA_TOOL_START: /* Ollama sends a call whole, its arguments an object: held */
        o->calls = xrealloc(o->calls, (size_t)(o->n_calls + 1) * sizeof *o->calls);
        o->calls[o->n_calls] = (struct ollama_call){xstrdup(d->id), xstrdup(d->name), {0}};
        o->n_calls++;
        break;
    case CHAT_DELTA_TOOL_ARGS:
        if (d->index < o->n_calls) strbuf_add(&o->calls[d->index].args, d->text, d->len);
        break;
    }
}

static void on_text(struct job *j, const char *text, size_t len) { chunk_text(j, 0, text, len); }

/* A call's arguments text -> an object (the parser always closes it; {} if it could not). */
static json_t *args_object(const char *text, size_t len) {
    json_t *v = text ? json_loadb(text, len, 0, NULL) : NULL;
    if (json_is_object(v)) return v;
    json_decref(v);
    return json_object();
}

static json_t *tool_call_json(int index, const char *id, const char *name, json_t *args) {
    return json_pack("{s:s,s:{s:i,s:s,s:o}}", "id", id, "function", "index", index, "name", name,
                     "arguments", args);
}

static const char *done_reason(const struct job *j, int truncated) {
    return j->res.finish == ENGINE_FINISH_LENGTH || truncated ? "length" : "stop";
}

/* The final fields: done, done_reason and the counts and durations (nanoseconds). */
static void stats_set(json_t *r, const struct job *j, const struct ollama_job *o, int truncated) {
    const struct engine_timings *t = &j->res.timings;
    json_object_set_new(r, "done", json_true());
    json_object_set_new(r, "done_reason", json_string(done_reason(j, truncated)));
    json_object_set_new(r, "total_duration", json_integer((json_int_t)((now_ms() - o->t0) * 1e6)));
    json_object_set_new(r, "load_duration", json_integer(0)); /* the model is always resident */
    json_object_set_new(r, "prompt_eval_count", json_integer(j->res.n_prompt));
    json_object_set_new(r, "prompt_eval_duration", json_integer((json_int_t)(t->prompt_ms * 1e6)));
    json_object_set_new(r, "eval_count", json_integer(j->res.n_generated));
    json_object_set_new(r, "eval_duration", json_integer((json_int_t)(t->predicted_ms * 1e6)));
}

static json_t *base_object(const struct ollama_job *o) {
    char ts[64];
    now_rfc3339(ts, sizeof ts);
    return json_pack("{s:s,s:s}", "model", o->model, "created_at", ts);
}

static void append_line(struct strbuf *b, json_t *v) {
    char *s = json_dumps(v, JSON_COMPACT);
    json_decref(v);
    if (!s) s = xstrdup("{\"error\":\"internal error: could not encode a chunk\"}");
    strbuf_adds(b, s);
    strbuf_adds(b, "\n");
    free(s);
}

static void on_finish(struct job *j) {
    struct ollama_job *o = j->proto_state;
    if (o->n_calls) {
        json_t *calls = json_array();
        for (int i = 0; i < o->n_calls; i++)
            json_array_append_new(calls, tool_call_json(i, o->calls[i].id, o->calls[i].name,
                                                        args_object(o->calls[i].args.s,
                                                                    o->calls[i].args.len)));
        json_t *c = base_object(o);
        json_object_set_new(c, "message", json_pack("{s:s,s:s,s:o}", "role", "assistant",
                                                    "content", "", "tool_calls", calls));
        json_object_set_new(c, "done", json_false());
        append_line(&j->out, c);
    }
    json_t *r = base_object(o);
    if (o->generate) json_object_set_new(r, "response", json_string(""));
    else json_object_set_new(r, "message", json_pack("{s:s,s:s}", "role", "assistant", "content", ""));
    stats_set(r, j, o, j->cs && chat_stream_truncated(j->cs));
    append_line(&j->out, r);
}

static void on_fail(struct job *j, int status, const char *msg) {
    struct api_error e = {.status = status, .ollama = 1};
    snprintf(e.message, sizeof e.message, "%s", msg);
    append_line(&j->out, api_error_json(&e));
}

static json_t *on_response(struct job *j, int *status) {
    struct ollama_job *o = j->proto_state;
    if (j->failed) {
        struct api_error e = {.status = j->fail_status, .ollama = 1};
        snprintf(e.message, sizeof e.message, "%s", j->fail_msg);
        *status = j->fail_status;
        return api_error_json(&e);
    }
    *status = 200;
    json_t *r = base_object(o);
    const char *text = j->text.s ? j->text.s : "";
    int truncated = 0;
    if (!j->is_chat) { /* raw generate */
        json_object_set_new(r, "response", json_stringn(text, j->text.len));
    } else {
        struct chat_parsed p;
        chat_parse(text, j->text.len, j->in_thinking, j->tools, NULL, &p);
        truncated = p.truncated;
        json_t *content = json_stringn(p.content, p.content_len);
        json_t *thinking = p.reasoning_content && p.reasoning_len
                               ? json_stringn(p.reasoning_content, p.reasoning_len) : NULL;
        if (o->generate) {
            json_object_set_new(r, "response", content);
            if (thinking) json_object_set_new(r, "thinking", thinking);
        } else {
            json_t *msg = json_pack("{s:s,s:o}", "role", "assistant", "content", content);
            if (thinking) json_object_set_new(msg, "thinking", thinking);
            if (p.n_tool_calls) {
                json_t *calls = json_array();
                for (int i = 0; i < p.n_tool_calls; i++) {
                    const struct chat_tool_call *c = &p.tool_calls[i];
                    json_array_append_new(calls, tool_call_json(i, c->id, c->name,
                                                                args_object(c->arguments,
                                                                            strlen(c->arguments))));
                }
                json_object_set_new(msg, "tool_calls", calls);
            }
            json_object_set_new(r, "message", msg);
        }
        chat_parsed_free(&p);
    }
    stats_set(r, j, o, truncated);
    return r;
}

static const struct api_proto ollama_proto = {
    .content_type = "application/x-ndjson",
    .delta = on_delta,
    .text = on_text,
    .finish = on_finish,
    .fail = on_fail,
    .response = on_response,
    .free = ollama_job_free,
};

/* ---- /api/chat, /api/generate ----------------------------------------------------------- */

struct job *ollama_job_new(const struct ollama_model *om, struct tokenizer *tok,
                           const struct chat_template *tmpl, int is_generate, const char *body,
                           size_t len, uint64_t *rng, pthread_mutex_t *rng_mu, int allow_forced,
                           json_t **immediate, char *note, size_t note_cap, struct api_error *e) {
    const double t0 = now_ms();
    *immediate = NULL;
    note[0] = 0;
    json_error_t je;
    json_t *rq = body && len ? json_loadb(body, len, JSON_REJECT_DUPLICATES, &je) : NULL;
    if (!rq || !json_is_object(rq)) {
        if (rq) refuse(e, 400, "the request body must be a JSON object");
        else if (!body || !len) refuse(e, 400, "the request body is empty; expected a JSON object");
        else refuse(e, 400, "invalid JSON at line %d, column %d: %s", je.line, je.column, je.text);
        json_decref(rq);
        return NULL;
    }
    struct ollama_job *o = xcalloc(1, sizeof *o);
    o->generate = is_generate;
    o->t0 = t0;
    const char *name = json_string_value(json_object_get(rq, "model"));
    snprintf(o->model, sizeof o->model, "%s", name && *name ? name : om->name);
    if (utf8_validate(o->model, strlen(o->model), NULL) < 0) snprintf(o->model, sizeof o->model, "%s", om->name);

    json_t *orq = json_object();
    char from_options[N_OPTION_MAP][64];
    int raw, num_ctx, n_from_options;
    int rc = to_openai(rq, is_generate, orq, &raw, &num_ctx, from_options, &n_from_options, e);
    json_decref(rq);
    struct job *j = NULL;
    if (rc == 1) { /* load only: the model is always loaded */
        json_t *r = base_object(o);
        if (is_generate) json_object_set_new(r, "response", json_string(""));
        else json_object_set_new(r, "message", json_pack("{s:s,s:s}", "role", "assistant", "content", ""));
        json_object_set_new(r, "done", json_true());
        json_object_set_new(r, "done_reason", json_string("load"));
        *immediate = r;
    }
    if (rc != 0) goto out;

    char *obody = json_dumps(orq, JSON_COMPACT);
    if (!obody) {
        refuse(e, 400, "the request holds a string that is not valid UTF-8");
        goto out;
    }
    j = api_job_new(om->model, tok, tmpl, om->name, !raw, obody, strlen(obody), rng, rng_mu,
                    allow_forced, e);
    free(obody);
    if (!j) {
        e->ollama = 1;
        for (int i = 0; i < n_from_options; i++) /* name the field as the client wrote it */
            if (!strcmp(e->param, from_options[i])) {
                char msg[sizeof e->message];
                snprintf(msg, sizeof msg, "%s", e->message);
                for (size_t k = 0; k < N_OPTION_MAP; k++)
                    if (!strcmp(option_map[k].openai, e->param))
                        snprintf(e->message, sizeof e->message, "options.%s: %.400s",
                                 option_map[k].ollama, msg);
            }
        goto out;
    }
    if (num_ctx) {
        const int ctx = model_ctx(om->model);
        if (num_ctx > ctx) {
            snprintf(note, note_cap, "options.num_ctx %d is more than the server's context of "
                     "%d tokens; using %d (start the server with --ctx to change it)",
                     num_ctx, ctx, ctx);
            num_ctx = ctx;
        }
        if (j->n_ids >= num_ctx) {
            refuse(e, 400, "the prompt has %d tokens but options.num_ctx is %d (prompt + at least "
                   "1 generated token must fit)", j->n_ids, num_ctx);
            api_job_free(j);
            j = NULL;
            goto out;
        }
        const int room = num_ctx - j->n_ids;
        if (j->req.max_tokens == 0 || j->req.max_tokens > room) j->req.max_tokens = room;
    }
    j->proto = &ollama_proto;
    j->proto_state = o;
    o = NULL;
out:
    json_decref(orq);
    ollama_job_free(o);
    return j;
}

/* ---- the model listings ----------------------------------------------------------------- */

static void tag_name(const struct ollama_model *om, char *buf, size_t cap) {
    snprintf(buf, cap, "%s%s", om->name, strchr(om->name, ':') ? "" : ":latest");
}

/* "0.8B", "25.31M": Ollama's parameter_size. */
static void param_size(int64_t n, char *buf, size_t cap) {
    if (n >= 1000000000) snprintf(buf, cap, "%.1fB", n / 1e9);
    else snprintf(buf, cap, "%.2fM", n / 1e6);
}

/* An identifier for the listings' "digest": FNV-1a over the directory, the parameter count and
 * the weight bytes, as 64 hex digits. Not a content hash of the weights (strata does not hash
 * gigabytes at start); it changes when the checkpoint does. */
static void digest(const struct ollama_model *om, char out[65]) {
    uint64_t h[4] = {0xcbf29ce484222325ull, 0x84222325cbf29ce4ull, 0x9e3779b97f4a7c15ull,
                     0xbf58476d1ce4e5b9ull};
    char key[4400];
    snprintf(key, sizeof key, "%s|%lld|%zu", om->dir, (long long)model_n_params(om->model),
             model_weight_bytes(om->model));
    for (int k = 0; k < 4; k++)
        for (const char *p = key; *p; p++) h[k] = (h[k] ^ (unsigned char)*p) * 0x100000001b3ull;
    snprintf(out, 65, "%016llx%016llx%016llx%016llx", (unsigned long long)h[0],
             (unsigned long long)h[1], (unsigned long long)h[2], (unsigned long long)h[3]);
}

static json_t *details_json(const struct ollama_model *om) {
    char ps[32];
    param_size(model_n_params(om->model), ps, sizeof ps);
    return json_pack("{s:s,s:s,s:s,s:[s],s:s,s:s}", "parent_model", "", "format", "safetensors",
                     "family", "qwen35", "families", "qwen35", "parameter_size", ps,
                     "quantization_level", "BF16");
}

static json_t *model_entry(const struct ollama_model *om) {
    char name[300], when[64], dg[65];
    tag_name(om, name, sizeof name);
    unix_rfc3339(om->created, when, sizeof when);
    digest(om, dg);
    return json_pack("{s:s,s:s,s:s,s:I,s:s,s:o}", "name", name, "model", name, "modified_at", when,
                     "size", (json_int_t)model_weight_bytes(om->model), "digest", dg, "details",
                     details_json(om));
}

json_t *ollama_tags(const struct ollama_model *om) {
    return json_pack("{s:[o]}", "models", model_entry(om));
}

json_t *ollama_ps(const struct ollama_model *om) {
    json_t *m = model_entry(om);
    json_object_del(m, "modified_at");
    /* loaded for the server's lifetime, whatever keep_alive says: Ollama's far-future expiry */
    json_object_set_new(m, "expires_at", json_string("9999-12-31T23:59:59Z"));
    const int on_device = strcmp(model_backend(om->model)->ops->name, "cpu") != 0;
    json_object_set_new(m, "size_vram", json_integer(on_device ? (json_int_t)model_weight_bytes(om->model) : 0));
    json_object_set_new(m, "context_length", json_integer(model_ctx(om->model)));
    return json_pack("{s:[o]}", "models", m);
}

json_t *ollama_version(void) { return json_pack("{s:s}", "version", OLLAMA_API_VERSION); }

/* The chat template text, as chat_template_load finds it (for /api/show; "" if unreadable). */
static json_t *template_text(const char *dir) {
    char path[4096];
    struct error err;
    snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
    size_t n;
    char *text = read_file(path, &n, &err);
    if (text) {
        json_t *v = json_stringn(text, n);
        free(text);
        if (v) return v;
    }
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    json_t *cfg = json_load_file(path, 0, NULL);
    const json_t *ct = json_object_get(cfg, "chat_template");
    json_t *v = NULL;
    if (json_is_string(ct)) v = json_copy((json_t *)ct);
    for (size_t i = 0; json_is_array(ct) && i < json_array_size(ct); i++) {
        const json_t *t = json_array_get(ct, i);
        const char *nm = json_string_value(json_object_get(t, "name"));
        if (nm && !strcmp(nm, "default") && json_is_string(json_object_get(t, "template")))
            v = json_copy(json_object_get(t, "template"));
    }
    json_decref(cfg);
    return v ? v : json_string("");
}

json_t *ollama_show(const struct ollama_model *om, const char *body, size_t len,
                    struct api_error *e) {
    json_t *rq = body && len ? json_loadb(body, len, 0, NULL) : NULL;
    if (!json_is_object(rq)) {
        json_decref(rq);
        refuse(e, 400, "the body must be a JSON object such as {\"model\": \"%s\"}", om->name);
        return NULL;
    }
    const char *want = json_string_value(json_object_get(rq, "model"));
    if (!want) want = json_string_value(json_object_get(rq, "name")); /* older clients */
    char name[300];
    tag_name(om, name, sizeof name);
    if (!want || (strcmp(want, om->name) && strcmp(want, name))) {
        if (want) refuse(e, 404, "model '%s' not found (this server has '%s')",
                         api_quote((char[256]){0}, 256, want, strlen(want), 64), name);
        else refuse(e, 400, "'model' (a string) is required");
        json_decref(rq);
        return NULL;
    }
    json_decref(rq);
    const struct config *c = model_config(om->model);
    struct sampler_params sp;
    engine_sampling_defaults(om->model, &sp);
    struct strbuf params = {0};
    strbuf_printf(&params, "temperature                    %g\n", sp.temperature);
    if (sp.top_k > 0) strbuf_printf(&params, "top_k                          %d\n", sp.top_k);
    if (sp.top_p < 1) strbuf_printf(&params, "top_p                          %g\n", sp.top_p);
    if (sp.min_p > 0) strbuf_printf(&params, "min_p                          %g\n", sp.min_p);
    if (sp.presence_penalty != 0)
        strbuf_printf(&params, "presence_penalty               %g\n", sp.presence_penalty);
    if (sp.repetition_penalty != 1)
        strbuf_printf(&params, "repeat_penalty                 %g\n", sp.repetition_penalty);
    strbuf_adds(&params, "stop                           \"<|im_end|>\"");
    json_t *info = json_pack("{s:s,s:I,s:i,s:i,s:i,s:i,s:i,s:i,s:i}", "general.architecture",
                             "qwen35", "general.parameter_count",
                             (json_int_t)model_n_params(om->model), "qwen35.context_length",
                             model_ctx(om->model), "qwen35.embedding_length", c->hidden_size,
                             "qwen35.block_count", c->num_hidden_layers,
                             "qwen35.feed_forward_length", c->intermediate_size,
                             "qwen35.attention.head_count", c->num_attention_heads,
                             "qwen35.attention.head_count_kv", c->num_key_value_heads,
                             "qwen35.vocab_size", c->vocab_size);
    json_object_set_new(info, "qwen35.max_position_embeddings", json_integer(c->max_position_embeddings));
    char when[64];
    unix_rfc3339(om->created, when, sizeof when);
    json_t *r = json_pack("{s:s,s:s%,s:o,s:o,s:o,s:[s,s,s],s:s}", "modelfile", "",
                          "parameters", params.s, params.len, "template",
                          template_text(om->tokenizer_dir ? om->tokenizer_dir : om->dir),
                          "details", details_json(om), "model_info", info, "capabilities",
                          "completion", "tools", "thinking", "modified_at", when);
    free(params.s);
    return r;
}

void ollama_unsupported(const char *url, struct api_error *e) {
    static const struct { const char *path, *what; } known[] = {
        {"/api/embed", "embeddings (the checkpoint is a chat model)"},
        {"/api/embeddings", "embeddings (the checkpoint is a chat model)"},
        {"/api/pull", "pulling models (strata serves the checkpoint it was started with)"},
        {"/api/push", "pushing models"},
        {"/api/create", "creating models"},
        {"/api/copy", "copying models"},
        {"/api/delete", "deleting models"},
        {"/api/blobs/", "model blobs"},
    };
    char q[256];
    api_quote(q, sizeof q, url, strlen(url), 100);
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) {
        size_t n = strlen(known[i].path);
        if (!strncmp(url, known[i].path, n) && (url[n] == 0 || known[i].path[n - 1] == '/')) {
            refuse(e, 501, "%s: strata does not implement %s", q, known[i].what);
            return;
        }
    }
    refuse(e, 404, "%s: no such route (strata's Ollama API: /api/chat, /api/generate, /api/tags, "
           "/api/show, /api/ps, /api/version)", q);
}
