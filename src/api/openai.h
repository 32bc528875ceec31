/* openai.h - the OpenAI API surface of the server, apart from HTTP: request validation
 * (OpenAI-shaped errors naming the field), prompt rendering and tokenization, the job a
 * generation request becomes, its SSE framing while the engine runs, and the JSON responses.
 * server.c owns the sockets, threads and queue; this file owns the formats. Internal to the
 * server (server.c, openai.c, and the tests that drive them). */
#ifndef STRATA_API_OPENAI_H
#define STRATA_API_OPENAI_H

#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>

#include "text/chat.h"
#include "engine/engine.h"

/* A growable byte string. */
/* Appends s as a quoted JSON string (s must be valid UTF-8). */
void sbuf_json_str(struct strbuf *b, const char *s, size_t n);

/* An OpenAI-shaped error: {"error":{"message","type","param","code"}} with an HTTP status. */
struct api_error {
    int status;
    const char *type; /* "invalid_request_error", "server_error", ... */
    const char *code; /* NULL -> null */
    char param[64];   /* "" -> null */
    char message[512];
    int ollama;       /* Ollama's shape instead: {"error":"message"} */
};
/* Never NULL: a message that is not valid UTF-8 (client bytes quoted raw, or cut inside a
 * character by a fixed-size buffer) has its bad bytes written as \xNN. */
json_t *api_error_json(const struct api_error *e);

/* Client bytes quoted in an error message: valid UTF-8 is kept; invalid bytes and control
 * characters are written as \xNN; past max_chars characters, or when dst (cap bytes) is full,
 * the text is cut on a character boundary and "..." ends it. Returns dst (NUL-terminated). */
const char *api_quote(char *dst, size_t cap, const char *src, size_t n, size_t max_chars);

struct server;
struct job;

/* Another protocol's framing of a job (ollama.c): a job whose proto is NULL speaks OpenAI's SSE
 * and JSON. The stream callbacks run on the engine thread with j->mu held and append to j->out;
 * response runs on the connection thread once the job is done; free releases proto_state. */
struct api_proto {
    const char *content_type; /* of a streamed response */
    void (*delta)(struct job *j, const struct chat_delta *d);     /* chat: a parsed piece */
    void (*text)(struct job *j, const char *text, size_t len);    /* completion: raw text */
    void (*finish)(struct job *j);                          /* a stream ran to its end */
    void (*fail)(struct job *j, int status, const char *msg); /* a stream's error event */
    json_t *(*response)(struct job *j, int *status);        /* the non-streaming body */
    void (*free)(void *state);
};

/* One generation request, shared by its connection thread and the engine thread (refs). */
struct job {
    struct server *server;
    struct job *next; /* queue link */
    int is_chat, stream, include_usage;
    json_t *request;      /* the parsed body (owned) */
    const json_t *tools;  /* borrowed from request: tools for the output parser, or NULL */
    int in_thinking;      /* the rendered prompt opened <think> */
    int32_t *ids;         /* (n_ids,) prompt tokens */
    int n_ids;
    int32_t *bias_ids;    /* (req.sampling.n_bias,) logit_bias */
    float *bias_values;
    int32_t *forced;      /* (req.n_forced,) strata_forced_output tokens + <|im_end|>, or NULL */
    struct engine_request req;
    /* constrained decoding (response_format, json_schema, tool_choice): what the request asks
     * for (borrowed from request), and the matcher the engine runs (owned) */
    const json_t *rf_schema;
    int rf_json_object;
    const char *rf_gbnf;   /* llama-server's "grammar" */
    const char *rf_param;  /* the field that asked: "response_format" or "json_schema" */
    const char *tool_name; /* tool_choice naming a function */
    int tools_required, parallel_calls;
    struct grammar_matcher *matcher;
    struct grammar *grammar;             /* each choice's matcher comes from it */
    const struct grammar_vocab *gvocab;
    /* n > 1: the choices, generated one after the other (the prompt's prefill is resumed from
     * the prefix cache), seeds seed, seed + 1, ...; each finished one is kept here */
    int n_choices;
    struct job_choice {
        char *text;
        size_t len;
        json_t *lp;
        enum engine_finish finish;
        int n_generated;
    } *choices;
    int n_done, total_generated;
    size_t chunk_base_len; /* chunk_head up to the choice's index */
    /* logprobs: each emitted token's entry, non-streaming (chat: the "content" array;
     * completions: the legacy object of parallel arrays) */
    const struct tokenizer *tok;
    json_t *lp;
    char *stops[ENGINE_MAX_STOP];
    char id[48];
    long created;
    char model_name[256];
    char *chunk_head; /* `data: {"id":...,"choices":[{"index":0,` */

    pthread_mutex_t mu; /* everything below */
    pthread_cond_t cv;
    struct strbuf out;    /* SSE bytes not yet taken by the connection */
    size_t out_pos;
    struct strbuf text;   /* every released byte of generated text */
    struct chat_stream *cs;
    int sent_first;
    int n_tool_calls;
    int done, refs, failed, fail_status;
    char fail_msg[512];
    atomic_int cancel;
    const atomic_int *stopping; /* the server's shutdown flag: cancels too (may be NULL) */
    struct engine_result res;
    double t_enqueue, t_first; /* now_ms() */
    double emit_ms;            /* engine-thread time inside the emit callback */
    int fd;                    /* the client's socket (peer-gone checks), -1 if none */
    int (*sink)(void *user, const char *frame, size_t n); /* in-process: frames go here */
    void *sink_user;
    const struct api_proto *proto; /* NULL: OpenAI */
    void *proto_state;
};

/* Parses and validates a /v1/chat/completions (is_chat) or /v1/completions body, renders and
 * tokenizes the prompt. NULL + e (status 400 naming the field) on a bad request. rng_mu guards
 * *rng (ids and default seeds). refs = 1 (the caller's). allow_forced: accept the test field
 * "strata_forced_output" (a text the engine emits by teacher forcing, then <|im_end|>), which
 * lets tests drive tool-call and reasoning output through a model that would not write it. */
struct job *api_job_new(struct model *m, struct tokenizer *tok, const struct chat_template *tmpl,
                        const char *model_name, int is_chat, const char *body, size_t len,
                        uint64_t *rng, pthread_mutex_t *rng_mu, int allow_forced,
                        struct api_error *e);
/* The same from a parsed chat request (rq is taken over, also on failure): how the other
 * protocols run on the chat path, once they have turned their request into chat messages. */
struct job *api_job_new_json(struct model *m, struct tokenizer *tok,
                             const struct chat_template *tmpl, const char *model_name,
                             int is_chat, json_t *rq, uint64_t *rng, pthread_mutex_t *rng_mu,
                             int allow_forced, struct api_error *e);
/* A request body as a JSON object; NULL + e (400, the line and column) otherwise. */
json_t *api_parse_body(const char *body, size_t len, struct api_error *e);

/* Builds what constrained decoding shares across requests (the vocabulary's trie, the built-in
 * rules' token classes) so that the first request with a schema pays only for its own grammar. */
void api_grammar_warmup(const struct model *m, const struct tokenizer *tok);
void api_job_free(struct job *j);
/* Runs the job on the engine (engine thread), framing SSE as tokens come; sets done. */
void api_job_run(struct job *j, struct engine *eng);
/* Ends a job without running it (or after a failure): error event when streaming; sets done. */
void api_job_fail(struct job *j, int status, const char *msg);
/* The non-streaming response body (a new reference) and its status, once done. */
json_t *api_job_response(struct job *j, int *status);

json_t *api_models_json(const char *model_name, long created, struct model *m);
json_t *api_tokenize(struct tokenizer *tok, const char *body, size_t len, struct api_error *e);
json_t *api_detokenize(struct tokenizer *tok, const char *body, size_t len, struct api_error *e);
/* POST /apply-template (llama-server's): a chat request's messages (tools, template kwargs) ->
 * {"prompt": the exact text the model would be given}. */
json_t *api_apply_template(const struct chat_template *tmpl, const char *body, size_t len,
                           struct api_error *e);

#endif
