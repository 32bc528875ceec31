/* server.h - the OpenAI-compatible HTTP server (libmicrohttpd): /v1/chat/completions,
 * /v1/completions (streaming and not), /v1/models, /health, /metrics, /tokenize, /detokenize.
 *
 * One engine thread owns the model; HTTP connection threads validate requests, render and
 * tokenize prompts, and enqueue jobs into a bounded FIFO (full: 503 + Retry-After). Streaming
 * responses are written one SSE event per token the moment it exists; a client that goes away
 * cancels its generation at the next token. `strata serve` (cmd_serve in cli.h) is the CLI.
 *
 * Hardening (issue 24): no web page can drive it - the Host header must name this server
 * (DNS rebinding), only loopback origins, the server's own and --cors-origin ones get CORS
 * (others are refused), JSON routes need Content-Type: application/json (guard.h); idle sockets
 * cannot starve it - per-client and global connection caps under the fd limit, eviction of idle
 * connections, deadlines for headers and bodies (conns.h); ambiguous framing (Content-Length
 * given twice, or with Transfer-Encoding) is refused and the connection closed. */
#ifndef STRATA_SERVER_H
#define STRATA_SERVER_H

#include <stddef.h>

#include "model/model.h"
#include "util.h"

struct server_options {
    const char *model_dir;  /* required */
    const char *tokenizer_dir; /* tokenizer.json + chat template; NULL: model_dir */
    const char *host;       /* default 127.0.0.1 */
    int port;               /* default 8080; 0 picks a free port (see server_port) */
    const char *api_key;    /* NULL: no authentication; at most SERVER_API_KEY_MAX bytes */
    const char *model_name; /* NULL: the model directory's base name */
    struct model_options model;
    int queue_max;          /* requests waiting for the engine; default 64 */
    int parallel;           /* requests generated at once; 0: the prefix cache's sequences */
    size_t max_body_bytes;  /* default 8 MiB */
    int quiet;              /* no log lines */
    int log_json;           /* log lines as JSON objects, one a line (--log-format json) */
    int no_prefix_reuse;    /* every request prefills its whole prompt (see engine.h) */
    size_t cache_bytes;     /* the prefix cache's budget; 0: half the device memory left free */
    int allow_forced_output; /* accept "strata_forced_output" (tests only) */
    int no_http;            /* load only: no listener, no engine thread (server_run_inprocess) */
    /* browsers and names (guard.h) */
    const char *const *cors_origins; /* extra origins given CORS ("https://app.example", "*") */
    int n_cors_origins;
    const char *const *allowed_hosts; /* extra names the Host header may carry */
    int n_allowed_hosts;
    /* connections (conns.h); 0 takes the default */
    int max_connections;    /* 1000, clipped below the fd limit */
    int max_per_client;     /* 64 per client address */
    int header_timeout_s;   /* 10: a request's headers, and an idle keep-alive connection */
    int body_timeout_s;     /* 30: a request's body, from its headers on */
    int stream_timeout_s;   /* 600: a generation's connection, idle (no byte moving) at most */
};

#define SERVER_API_KEY_MAX 1024

struct server;

/* Loads the model, tokenizer and chat template, starts the engine thread and the listener. */
struct server *server_start(const struct server_options *o, struct error *err);
int server_port(const struct server *s);
const char *server_model_name(const struct server *s);
struct model *server_model(struct server *s);
/* A line in the server's log (text or JSON as the options say; rate-limited; none when quiet). */
void server_logf(struct server *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Cancels running and queued requests, closes every connection, frees everything. */
void server_stop(struct server *s);

/* In-process path for benchmarks (bench/http_latency.c): runs one request body through the same
 * validation, prompt rendering, generation and SSE framing as the HTTP path, on the calling
 * thread. The engine thread must be idle: no HTTP generation request may be in flight (or
 * start the server with no_http). Every SSE frame is passed to sink (NULL: built and dropped).
 * Returns the HTTP status the request would get. */
struct server_inprocess_stats {
    double ttft_ms;   /* from before parsing the body to the first token */
    int n_tokens;     /* generated */
    double decode_ms; /* engine predicted_ms */
    double emit_ms;   /* time inside the engine's emit callback (detok output onwards: chat
                         parser, SSE framing, the sink) summed over all tokens */
};
int server_run_inprocess(struct server *s, const char *body, size_t len,
                         int (*sink)(void *user, const char *frame, size_t n), void *user,
                         struct server_inprocess_stats *st);
/* The engine the server owns (for the benchmark's engine-only run). */
struct engine *server_engine(struct server *s);
struct tokenizer *server_tokenizer(struct server *s);

#endif
