/* server.c - the OpenAI-compatible HTTP server on libmicrohttpd, and `strata serve`.
 *
 * Threads: MHD runs one thread per connection; the engine thread owns the model. A generation
 * request is validated, rendered (chat template) and tokenized on its connection thread, then
 * queued (bounded FIFO) as a job. The engine thread runs jobs one at a time; its emit callback
 * turns each token into SSE bytes in the job's output buffer and signals the connection thread,
 * which is blocked in MHD's content-reader callback and returns the bytes at once, so MHD
 * writes them as one HTTP chunk while the engine computes the next token. TCP_NODELAY is set on
 * every connection so no chunk waits for Nagle. A waiting connection thread polls its socket
 * every 100 ms: a client that went away cancels the job (queued: skipped; running: stopped at
 * the next token).
 *
 * Mirrors the request/response shapes of the OpenAI API and llama-server's extensions
 * (timings, /tokenize, /detokenize, /health, top_k/min_p/repetition_penalty). Request parsing
 * and response shaping live in openai.c. */
#include "server.h"

#include <errno.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "anthropic.h"
#include "conns.h"
#include "engine/cache.h"
#include "engine/engine.h"
#include "guard.h"
#include "model/config.h"
#include "ollama.h"
#include "openai.h"
#include "page.h"
#include "responses.h"
#include "text/chat.h"
#include "text/tokenizer.h"

enum route {
    ROUTE_NONE = 0,
    ROUTE_CHAT,
    ROUTE_COMPLETIONS,
    ROUTE_MODELS,
    ROUTE_MODEL, /* GET /v1/models/{id} */
    ROUTE_HEALTH,
    ROUTE_METRICS,
    ROUTE_TOKENIZE,
    ROUTE_DETOKENIZE,
    ROUTE_APPLY_TEMPLATE,
    ROUTE_OPTIONS,
    ROUTE_RESPONSES,          /* OpenAI's Responses API (responses.c) */
    ROUTE_MESSAGES,           /* Anthropic's Messages API (anthropic.c) */
    ROUTE_MESSAGES_COUNT,     /* its count_tokens */
    ROUTE_OLLAMA_CHAT,
    ROUTE_OLLAMA_GENERATE,
    ROUTE_OLLAMA_TAGS,
    ROUTE_OLLAMA_SHOW,
    ROUTE_OLLAMA_PS,
    ROUTE_OLLAMA_VERSION,
    ROUTE_PAGE,
};

static const struct {
    const char *path;
    enum route route;
    const char *method;
    int public; /* no API key needed */
} routes[] = {
    {"/v1/chat/completions", ROUTE_CHAT, "POST", 0},
    {"/chat/completions", ROUTE_CHAT, "POST", 0},
    {"/v1/completions", ROUTE_COMPLETIONS, "POST", 0},
    {"/completions", ROUTE_COMPLETIONS, "POST", 0},
    {"/v1/models", ROUTE_MODELS, "GET", 0},
    {"/models", ROUTE_MODELS, "GET", 0},
    {"/health", ROUTE_HEALTH, "GET", 1},
    {"/v1/health", ROUTE_HEALTH, "GET", 1},
    {"/metrics", ROUTE_METRICS, "GET", 0},
    {"/tokenize", ROUTE_TOKENIZE, "POST", 0},
    {"/detokenize", ROUTE_DETOKENIZE, "POST", 0},
    {"/apply-template", ROUTE_APPLY_TEMPLATE, "POST", 0},
    {"/v1/responses", ROUTE_RESPONSES, "POST", 0},
    {"/responses", ROUTE_RESPONSES, "POST", 0},
    {"/v1/messages", ROUTE_MESSAGES, "POST", 0},
    {"/v1/messages/count_tokens", ROUTE_MESSAGES_COUNT, "POST", 0},
    {"/api/chat", ROUTE_OLLAMA_CHAT, "POST", 0}, /* Ollama's native API (ollama.c) */
    {"/api/generate", ROUTE_OLLAMA_GENERATE, "POST", 0},
    {"/api/tags", ROUTE_OLLAMA_TAGS, "GET", 0},
    {"/api/show", ROUTE_OLLAMA_SHOW, "POST", 0},
    {"/api/ps", ROUTE_OLLAMA_PS, "GET", 0},
    {"/api/version", ROUTE_OLLAMA_VERSION, "GET", 1},
    {"/", ROUTE_PAGE, "GET", 1}, /* the chat page (page.html); its requests need the key */
};

static const double ttft_buckets_s[] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};
#define N_TTFT_BUCKETS (int)(sizeof ttft_buckets_s / sizeof ttft_buckets_s[0])

struct metrics {
    unsigned long requests, errors, generations, cancelled;
    unsigned long prompt_tokens, generated_tokens, cached_tokens;
    double prompt_seconds, decode_seconds, emit_seconds;
    double last_prompt_tps, last_decode_tps;
    unsigned long ttft_bucket[N_TTFT_BUCKETS + 1]; /* cumulative at render time */
    double ttft_sum_s;
    unsigned long ttft_count;
    struct cache_stats cache; /* the engine's, as of its last request */
};

struct server {
    struct server_options opt;
    char model_name[256];
    long created;
    struct model *model;
    struct tokenizer *tok;
    struct engine *engine;
    struct chat_template tmpl;
    struct MHD_Daemon *daemon;
    struct conns *conns;
    int port;
    unsigned char api_key[SERVER_API_KEY_MAX]; /* zero-padded (constant-time comparison) */
    size_t api_key_len;
    int n_streams; /* SSE responses MHD still holds (mu): shutdown waits for them to drain */
    /* log lines: at most LOG_BURST at once, then one a second; the rest counted */
    pthread_mutex_t log_mu;
    double log_t;
    int log_tokens;
    unsigned long log_dropped;

    pthread_t engine_thread; /* engine_run: the batched rounds */
    int engine_started;
    atomic_int engine_stop;
    pthread_t *workers;      /* each takes a job from the queue and waits on the engine for it */
    int n_workers;
    pthread_mutex_t mu; /* queue, metrics, id generator */
    pthread_cond_t cv;
    struct job *q_head, *q_tail;
    int q_len, running;
    atomic_int stopping;
    struct metrics met;
    uint64_t rng;
};

/* Per-HTTP-request state (MHD's con_cls). */
struct conn {
    enum route route;
    int status;       /* non-zero: an error decided before the body was read */
    const char *err_type, *err_code; /* with status; NULL: invalid_request_error, null */
    int close_after;  /* the framing cannot be trusted: close the connection after answering */
    char err_msg[512];
    struct strbuf body;
    int too_large;
    int fd;
    int ollama;       /* an /api/ route: errors in Ollama's shape */
    /* the access log line (on_completed) */
    double t0;        /* now_ms() at the headers */
    char method[24], url[160]; /* quoted (client bytes) */
    struct job *job;  /* a generation's job (a reference), for its counts */
};

/* ---- jobs ----------------------------------------------------------------------------- */

static void job_release(struct job *j) {
    pthread_mutex_lock(&j->mu);
    int left = --j->refs;
    pthread_mutex_unlock(&j->mu);
    if (left == 0) api_job_free(j);
}

static int peer_gone(int fd) {
    if (fd < 0) return 0;
    struct pollfd p = {.fd = fd, .events = POLLRDHUP};
    return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
}

/* Waits up to 100 ms on the job's condition variable (j->mu held). */
static void job_wait(struct job *j) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += 100 * 1000000L;
    if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
    pthread_cond_timedwait(&j->cv, &j->mu, &ts);
}

static void metrics_record(struct server *s, const struct job *j) {
    struct metrics *m = &s->met;
    const struct engine_result *r = &j->res;
    if (j->failed) return;
    if (r->finish == ENGINE_FINISH_CANCELLED) m->cancelled++;
    m->generations++;
    m->prompt_tokens += (unsigned long)r->timings.prompt_n; /* prefilled: no reused prefix */
    m->cached_tokens += (unsigned long)r->timings.cache_n;
    engine_cache_stats(s->engine, &m->cache);
    m->generated_tokens += (unsigned long)r->n_generated;
    m->prompt_seconds += r->timings.prompt_ms / 1e3;
    m->decode_seconds += r->timings.predicted_ms / 1e3;
    m->emit_seconds += j->emit_ms / 1e3;
    m->last_prompt_tps = r->timings.prompt_per_second;
    m->last_decode_tps = r->timings.predicted_per_second;
    if (j->t_first > 0) {
        double ttft_s = (j->t_first - j->t_enqueue) / 1e3;
        int b = 0;
        while (b < N_TTFT_BUCKETS && ttft_s > ttft_buckets_s[b]) b++;
        m->ttft_bucket[b]++;
        m->ttft_sum_s += ttft_s;
        m->ttft_count++;
    }
}

static void *engine_main(void *arg) {
    struct server *s = arg;
    engine_run(s->engine, &s->engine_stop);
    return NULL;
}

static void *worker_main(void *arg) {
    struct server *s = arg;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        while (!s->q_head && !atomic_load(&s->stopping)) pthread_cond_wait(&s->cv, &s->mu);
        struct job *j = s->q_head;
        if (atomic_load(&s->stopping)) {
            /* fail everything still queued */
            s->q_head = s->q_tail = NULL;
            s->q_len = 0;
            pthread_mutex_unlock(&s->mu);
            while (j) {
                struct job *next = j->next;
                api_job_fail(j, 503, "the server is shutting down");
                job_release(j);
                j = next;
            }
            return NULL;
        }
        s->q_head = j->next;
        if (!s->q_head) s->q_tail = NULL;
        s->q_len--;
        s->running++;
        pthread_mutex_unlock(&s->mu);

        if (peer_gone(j->fd)) atomic_store(&j->cancel, 1);
        api_job_run(j, s->engine);

        pthread_mutex_lock(&s->mu);
        s->running--;
        metrics_record(s, j);
        pthread_mutex_unlock(&s->mu);
        job_release(j);
    }
}

/* Queues a job for the engine; 0, or -1 when the queue is full or the server is stopping. */
static int enqueue(struct server *s, struct job *j) {
    pthread_mutex_lock(&s->mu);
    if (atomic_load(&s->stopping) || s->q_len >= s->opt.queue_max) {
        pthread_mutex_unlock(&s->mu);
        return -1;
    }
    j->refs++; /* the engine's reference (no other thread sees j yet) */
    j->next = NULL;
    if (s->q_tail) s->q_tail->next = j;
    else s->q_head = j;
    s->q_tail = j;
    s->q_len++;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return 0;
}

/* ---- responses ------------------------------------------------------------------------ */

/* CORS headers for an allowed Origin (a refused one never gets this far, see classify). */
static void add_cors(struct server *s, struct MHD_Connection *c, struct MHD_Response *r) {
    const char *origin = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin");
    MHD_add_response_header(r, "Vary", "Origin");
    if (!origin) return;
    const char *host = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Host");
    if (guard_host_ok(host, s->opt.allowed_hosts, s->opt.n_allowed_hosts) &&
        guard_origin_ok(origin, host, s->opt.cors_origins, s->opt.n_cors_origins))
        MHD_add_response_header(r, "Access-Control-Allow-Origin", origin);
}

static enum MHD_Result respond(struct server *s, struct MHD_Connection *c, int status,
                               const char *type, const char *body, size_t len, int close) {
    struct MHD_Response *r =
        MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", type);
    add_cors(s, c, r);
    if (status == 503) MHD_add_response_header(r, "Retry-After", "1");
    if (status == 405) MHD_add_response_header(r, "Allow", "GET, POST");
    if (status == 401) MHD_add_response_header(r, "WWW-Authenticate", "Bearer");
    if (close) MHD_add_response_header(r, "Connection", "close");
    enum MHD_Result ret = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result respond_json_c(struct server *s, struct MHD_Connection *c, int status,
                                      json_t *v, int close) {
    char *b = v ? json_dumps(v, JSON_COMPACT) : NULL;
    json_decref(v);
    if (!b) { /* a bug (a NULL or non-UTF-8 string packed): answer rather than crash */
        static const char oops[] = "{\"error\":{\"message\":\"internal error: could not encode "
                                   "the response\",\"type\":\"server_error\",\"param\":null,"
                                   "\"code\":null}}";
        return respond(s, c, 500, "application/json", oops, sizeof oops - 1, close);
    }
    enum MHD_Result ret = respond(s, c, status, "application/json", b, strlen(b), close);
    free(b);
    return ret;
}

static enum MHD_Result respond_json(struct server *s, struct MHD_Connection *c, int status,
                                    json_t *v) {
    return respond_json_c(s, c, status, v, 0);
}

static enum MHD_Result respond_error_c(struct server *s, struct MHD_Connection *c,
                                       const struct api_error *e, int close) {
    pthread_mutex_lock(&s->mu);
    s->met.errors++;
    pthread_mutex_unlock(&s->mu);
    return respond_json_c(s, c, e->status, api_error_json(e), close);
}

static enum MHD_Result respond_error(struct server *s, struct MHD_Connection *c,
                                     const struct api_error *e) {
    return respond_error_c(s, c, e, 0);
}

/* An error in the shape of the route's protocol (Anthropic's for /v1/messages). */
static enum MHD_Result respond_route_error(struct server *s, struct MHD_Connection *c,
                                           enum route route, const struct api_error *e, int close) {
    if (route != ROUTE_MESSAGES && route != ROUTE_MESSAGES_COUNT)
        return respond_error_c(s, c, e, close);
    pthread_mutex_lock(&s->mu);
    s->met.errors++;
    pthread_mutex_unlock(&s->mu);
    return respond_json_c(s, c, e->status, anthropic_error_json(e), close);
}

/* How long a stream waits at shutdown for the engine to write its last event. */
#define SHUTDOWN_EVENT_WAIT_MS 5000

static ssize_t sse_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    struct job *j = cls;
    struct server *s = j->server;
    (void)pos;
    double t_stop = 0;
    pthread_mutex_lock(&j->mu);
    for (;;) {
        if (j->out_pos < j->out.len) {
            size_t n = j->out.len - j->out_pos;
            if (n > max) n = max;
            memcpy(buf, j->out.s + j->out_pos, n);
            j->out_pos += n;
            if (j->out_pos == j->out.len) j->out_pos = j->out.len = 0;
            pthread_mutex_unlock(&j->mu);
            return (ssize_t)n;
        }
        if (j->done) {
            pthread_mutex_unlock(&j->mu);
            return MHD_CONTENT_READER_END_OF_STREAM;
        }
        job_wait(j);
        if (j->out_pos < j->out.len || j->done) continue;
        /* a client gone: cancel. Shutting down: the engine stops the job at its next token
         * and writes the final event (an error event); wait for it, within a bound. */
        int give_up = peer_gone(j->fd);
        if (!give_up && atomic_load(&s->stopping)) {
            if (t_stop == 0) t_stop = now_ms();
            give_up = now_ms() - t_stop > SHUTDOWN_EVENT_WAIT_MS;
        }
        if (give_up) {
            atomic_store(&j->cancel, 1);
            pthread_mutex_unlock(&j->mu);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
    }
}

static void sse_free(void *cls) {
    struct job *j = cls;
    struct server *s = j->server;
    atomic_store(&j->cancel, 1); /* no-op when the job is done; else the client is gone */
    job_release(j);
    pthread_mutex_lock(&s->mu);
    s->n_streams--;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

/* Runs a generation request: stream (SSE response that the engine feeds) or wait for the end. */
static struct ollama_model ollama_model_of(struct server *s) {
    return (struct ollama_model){s->model_name, s->opt.model_dir, s->opt.tokenizer_dir, s->model,
                                 s->created};
}

static enum MHD_Result serve_generation(struct server *s, struct MHD_Connection *c,
                                        struct conn *cn) {
    struct api_error e = {0};
    struct job *j;
    if (cn->route == ROUTE_RESPONSES) {
        j = responses_job_new(s->model, s->tok, &s->tmpl, s->model_name, cn->body.s, cn->body.len,
                              &s->rng, &s->mu, s->opt.allow_forced_output, &e);
    } else if (cn->route == ROUTE_MESSAGES) {
        j = anthropic_job_new(s->model, s->tok, &s->tmpl, s->model_name, cn->body.s, cn->body.len,
                              &s->rng, &s->mu, s->opt.allow_forced_output, &e);
    } else if (cn->route == ROUTE_OLLAMA_CHAT || cn->route == ROUTE_OLLAMA_GENERATE) {
        struct ollama_model om = ollama_model_of(s);
        json_t *now = NULL;
        char note[256];
        j = ollama_job_new(&om, s->tok, &s->tmpl, cn->route == ROUTE_OLLAMA_GENERATE, cn->body.s,
                           cn->body.len, &s->rng, &s->mu, s->opt.allow_forced_output, &now, note,
                           sizeof note, &e);
        if (note[0]) server_logf(s, "%s\n", note);
        if (!j && now) return respond_json(s, c, 200, now);
    } else {
        j = api_job_new(s->model, s->tok, &s->tmpl, s->model_name, cn->route == ROUTE_CHAT,
                        cn->body.s, cn->body.len, &s->rng, &s->mu, s->opt.allow_forced_output, &e);
    }
    if (!j) return respond_route_error(s, c, cn->route, &e, 0);
    j->server = s;
    j->stopping = &s->stopping;
    j->fd = cn->fd;
    j->t_enqueue = now_ms();
    if (enqueue(s, j) != 0) {
        api_job_free(j);
        struct api_error busy = {.status = 503, .type = "unavailable_error", .ollama = cn->ollama};
        snprintf(busy.message, sizeof busy.message,
                 atomic_load(&s->stopping) ? "the server is shutting down"
                                           : "the request queue is full; retry later");
        return respond_route_error(s, c, cn->route, &busy, 0);
    }
    /* from here the connection lives as long as the generation: no header/body deadline, and
     * MHD's inactivity timeout is the stream's (a queued request may wait long for a token) */
    if (s->conns) conns_request_generating(s->conns, c);
    pthread_mutex_lock(&j->mu);
    j->refs++; /* the access log's, released in on_completed */
    pthread_mutex_unlock(&j->mu);
    cn->job = j;
    MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, (unsigned)s->opt.stream_timeout_s);
    if (j->stream) {
        pthread_mutex_lock(&s->mu);
        s->n_streams++;
        pthread_mutex_unlock(&s->mu);
        struct MHD_Response *r =
            MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, sse_reader, j, sse_free);
        if (!r) {
            sse_free(j);
            return MHD_NO;
        }
        MHD_add_response_header(r, "Content-Type", j->proto && j->proto->content_type
                                                       ? j->proto->content_type : "text/event-stream");
        MHD_add_response_header(r, "Cache-Control", "no-cache");
        MHD_add_response_header(r, "X-Accel-Buffering", "no");
        add_cors(s, c, r);
        enum MHD_Result ret = MHD_queue_response(c, 200, r);
        MHD_destroy_response(r);
        return ret;
    }
    pthread_mutex_lock(&j->mu);
    while (!j->done) {
        job_wait(j);
        if (!j->done && peer_gone(j->fd)) atomic_store(&j->cancel, 1);
    }
    pthread_mutex_unlock(&j->mu);
    int status = 200;
    json_t *body = api_job_response(j, &status);
    job_release(j);
    if (status != 200) {
        pthread_mutex_lock(&s->mu);
        s->met.errors++;
        pthread_mutex_unlock(&s->mu);
    }
    return respond_json(s, c, status, body);
}

static enum MHD_Result serve_metrics(struct server *s, struct MHD_Connection *c) {
    struct strbuf b = {0};
    pthread_mutex_lock(&s->mu);
    struct metrics m = s->met;
    int q = s->q_len, running = s->running;
    pthread_mutex_unlock(&s->mu);
    strbuf_printf(&b, "# HELP strata_requests_total HTTP requests received.\n"
                    "# TYPE strata_requests_total counter\nstrata_requests_total %lu\n",
                m.requests);
    strbuf_printf(&b, "# HELP strata_requests_errors_total HTTP requests answered with an error.\n"
                    "# TYPE strata_requests_errors_total counter\nstrata_requests_errors_total %lu\n",
                m.errors);
    strbuf_printf(&b, "# HELP strata_generations_total Generation requests run by the engine.\n"
                    "# TYPE strata_generations_total counter\nstrata_generations_total %lu\n",
                m.generations);
    strbuf_printf(&b, "# HELP strata_generations_cancelled_total Generations cancelled by a client "
                    "disconnect.\n# TYPE strata_generations_cancelled_total counter\n"
                    "strata_generations_cancelled_total %lu\n",
                m.cancelled);
    strbuf_printf(&b, "# HELP strata_prompt_tokens_total Prompt tokens prefilled.\n"
                    "# TYPE strata_prompt_tokens_total counter\nstrata_prompt_tokens_total %lu\n",
                m.prompt_tokens);
    strbuf_printf(&b, "# HELP strata_tokens_generated_total Tokens generated.\n"
                    "# TYPE strata_tokens_generated_total counter\n"
                    "strata_tokens_generated_total %lu\n",
                m.generated_tokens);
    strbuf_printf(&b, "# HELP strata_prompt_seconds_total Time spent in prefill.\n"
                    "# TYPE strata_prompt_seconds_total counter\nstrata_prompt_seconds_total %.6f\n",
                m.prompt_seconds);
    strbuf_printf(&b, "# HELP strata_decode_seconds_total Time spent decoding.\n"
                    "# TYPE strata_decode_seconds_total counter\nstrata_decode_seconds_total %.6f\n",
                m.decode_seconds);
    strbuf_printf(&b, "# HELP strata_stream_emit_seconds_total Engine-thread time spent turning tokens "
                    "into response bytes (chat parser, SSE framing, waking the connection).\n"
                    "# TYPE strata_stream_emit_seconds_total counter\n"
                    "strata_stream_emit_seconds_total %.6f\n",
                m.emit_seconds);
    struct engine_round_stats rs;
    engine_round_stats(s->engine, &rs);
    strbuf_printf(&b, "# HELP strata_batched_rounds_total Engine rounds that chose the tokens of a batched "
                    "step's rows and launched the next batched step (no prompt piece in them).\n"
                    "# TYPE strata_batched_rounds_total counter\nstrata_batched_rounds_total %lu\n",
                rs.rounds);
    strbuf_printf(&b, "# HELP strata_batched_rounds_ahead_total Those of them that queued the next step "
                    "before handling their tokens (run ahead).\n"
                    "# TYPE strata_batched_rounds_ahead_total counter\nstrata_batched_rounds_ahead_total %lu\n",
                rs.ahead);
    strbuf_printf(&b, "# HELP strata_batched_round_rows_total Rows chosen in those rounds.\n"
                    "# TYPE strata_batched_round_rows_total counter\nstrata_batched_round_rows_total %lu\n",
                rs.rows);
    strbuf_printf(&b, "# HELP strata_batched_round_seconds_total Engine-thread time of those rounds.\n"
                    "# TYPE strata_batched_round_seconds_total counter\n"
                    "strata_batched_round_seconds_total %.6f\n",
                rs.round_ms / 1e3);
    strbuf_printf(&b, "# HELP strata_batched_round_wait_seconds_total Time of those rounds spent waiting "
                    "for the device's choices; the rest is host work, which the device overlaps only "
                    "in the rounds that ran ahead.\n"
                    "# TYPE strata_batched_round_wait_seconds_total counter\n"
                    "strata_batched_round_wait_seconds_total %.6f\n",
                rs.wait_ms / 1e3);
    strbuf_printf(&b, "# HELP strata_prompt_tokens_per_second Prefill speed of the last request.\n"
                    "# TYPE strata_prompt_tokens_per_second gauge\n"
                    "strata_prompt_tokens_per_second %.3f\n",
                m.last_prompt_tps);
    strbuf_printf(&b, "# HELP strata_decode_tokens_per_second Decode speed of the last request.\n"
                    "# TYPE strata_decode_tokens_per_second gauge\n"
                    "strata_decode_tokens_per_second %.3f\n",
                m.last_decode_tps);
    strbuf_printf(&b, "# HELP strata_ttft_seconds Time from request queued to first token.\n"
                    "# TYPE strata_ttft_seconds histogram\n");
    unsigned long cum = 0;
    for (int i = 0; i < N_TTFT_BUCKETS; i++) {
        cum += m.ttft_bucket[i];
        strbuf_printf(&b, "strata_ttft_seconds_bucket{le=\"%g\"} %lu\n", ttft_buckets_s[i], cum);
    }
    cum += m.ttft_bucket[N_TTFT_BUCKETS];
    strbuf_printf(&b, "strata_ttft_seconds_bucket{le=\"+Inf\"} %lu\n", cum);
    strbuf_printf(&b, "strata_ttft_seconds_sum %.6f\nstrata_ttft_seconds_count %lu\n", m.ttft_sum_s,
                m.ttft_count);
    strbuf_printf(&b, "# HELP strata_prompt_tokens_cached_total Prompt tokens resumed from the prefix "
                    "cache.\n# TYPE strata_prompt_tokens_cached_total counter\n"
                    "strata_prompt_tokens_cached_total %lu\n", m.cached_tokens);
    strbuf_printf(&b, "# HELP strata_cache_hits_total Requests that resumed a cached prefix.\n"
                    "# TYPE strata_cache_hits_total counter\nstrata_cache_hits_total %ld\n"
                    "# HELP strata_cache_misses_total Requests with no cached prefix.\n"
                    "# TYPE strata_cache_misses_total counter\nstrata_cache_misses_total %ld\n"
                    "# HELP strata_cache_evictions_total Cached sequences and checkpoints reused for "
                    "other prefixes.\n# TYPE strata_cache_evictions_total counter\n"
                    "strata_cache_evictions_total %ld\n"
                    "# HELP strata_cache_checkpoints_total DeltaNet state checkpoints taken.\n"
                    "# TYPE strata_cache_checkpoints_total counter\nstrata_cache_checkpoints_total %ld\n",
                m.cache.hits, m.cache.misses, m.cache.evictions, m.cache.ckpts_taken);
    strbuf_printf(&b, "# HELP strata_cache_bytes Device memory of the cache entries that hold a prefix.\n"
                    "# TYPE strata_cache_bytes gauge\nstrata_cache_bytes %zu\n"
                    "# HELP strata_cache_budget_bytes Device memory of the prefix cache.\n"
                    "# TYPE strata_cache_budget_bytes gauge\nstrata_cache_budget_bytes %zu\n",
                m.cache.bytes_held, m.cache.budget_bytes);
    strbuf_printf(&b, "# HELP strata_queue_depth Requests waiting for the engine.\n"
                    "# TYPE strata_queue_depth gauge\nstrata_queue_depth %d\n",
                q);
    strbuf_printf(&b, "# HELP strata_requests_running Requests the engine is generating.\n"
                    "# TYPE strata_requests_running gauge\nstrata_requests_running %d\n",
                running);
    if (s->conns) {
        int live;
        unsigned long evicted, refused;
        conns_counts(s->conns, &live, &evicted, &refused);
        strbuf_printf(&b, "# HELP strata_connections Open client connections.\n"
                        "# TYPE strata_connections gauge\nstrata_connections %d\n"
                        "# HELP strata_connections_closed_total Connections closed for a newcomer or "
                        "a header/body deadline.\n# TYPE strata_connections_closed_total counter\n"
                        "strata_connections_closed_total %lu\n"
                        "# HELP strata_connections_refused_total Newcomers refused (every connection "
                        "busy).\n# TYPE strata_connections_refused_total counter\n"
                        "strata_connections_refused_total %lu\n",
                    live, evicted, refused);
    }
    enum MHD_Result ret =
        respond(s, c, 200, "text/plain; version=0.0.4; charset=utf-8", b.s ? b.s : "", b.len, 0);
    free(b.s);
    return ret;
}

/* Constant time in the key: the client's key is copied into a zeroed buffer as long as the
 * longest key accepted and the whole buffer is compared, so neither the key's bytes nor its
 * length show in the time taken (the client's own length is the client's to know). */
static int api_key_ok(struct server *s, struct MHD_Connection *c) {
    if (!s->opt.api_key) return 1;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    const char *key = NULL;
    if (h && strncasecmp(h, "Bearer ", 7) == 0) key = h + 7;
    if (!key) key = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "x-api-key");
    if (!key) return 0;
    size_t n = strnlen(key, SERVER_API_KEY_MAX + 1);
    if (n > SERVER_API_KEY_MAX) return 0;
    unsigned char got[SERVER_API_KEY_MAX] = {0};
    memcpy(got, key, n);
    volatile unsigned char diff = (unsigned char)(n != s->api_key_len);
    for (size_t i = 0; i < SERVER_API_KEY_MAX; i++) diff |= (unsigned char)(got[i] ^ s->api_key[i]);
    return diff == 0;
}

struct header_count {
    int content_length, transfer_encoding;
};

static enum MHD_Result count_header(void *cls, enum MHD_ValueKind kind, const char *key,
                                    const char *value) {
    struct header_count *hc = cls;
    (void)kind, (void)value;
    if (!strcasecmp(key, "Content-Length")) hc->content_length++;
    if (!strcasecmp(key, "Transfer-Encoding")) hc->transfer_encoding++;
    return MHD_YES;
}

static void refuse(struct conn *cn, int status, const char *type, const char *code,
                   const char *fmt, ...) __attribute__((format(printf, 5, 6)));
static void refuse(struct conn *cn, int status, const char *type, const char *code,
                   const char *fmt, ...) {
    cn->status = status;
    cn->err_type = type;
    cn->err_code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cn->err_msg, sizeof cn->err_msg, fmt, ap);
    va_end(ap);
}

/* Decides route, method, Host, Origin, authentication, Content-Type and framing before any
 * body is read. */
static void classify(struct server *s, struct MHD_Connection *c, struct conn *cn, const char *url,
                     const char *method) {
    int path_known = 0, is_public = 0, json_body = 0;
    cn->ollama = !strncmp(url, "/api/", 5);
    if (!strcmp(method, "OPTIONS")) { /* CORS preflight from browser clients */
        for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++)
            if (!strcmp(url, routes[i].path)) cn->route = ROUTE_OPTIONS;
        if (!strncmp(url, "/v1/models/", 11) || !strncmp(url, "/models/", 8)) cn->route = ROUTE_OPTIONS;
    }
    for (size_t i = 0; cn->route == ROUTE_NONE && i < sizeof routes / sizeof routes[0]; i++) {
        if (strcmp(url, routes[i].path) != 0) continue;
        path_known = 1;
        if (strcmp(method, routes[i].method) != 0 &&
            !(!strcmp(method, "HEAD") && !strcmp(routes[i].method, "GET"))) /* MHD drops the body */
            continue;
        cn->route = routes[i].route;
        is_public = routes[i].public;
        json_body = !strcmp(routes[i].method, "POST");
    }
    if (!path_known && cn->route == ROUTE_NONE &&
        (!strncmp(url, "/v1/models/", 11) || !strncmp(url, "/models/", 8))) {
        path_known = 1;
        if (!strcmp(method, "GET")) cn->route = ROUTE_MODEL;
    }
    if (cn->route == ROUTE_NONE && cn->ollama && !path_known) {
        struct api_error e = {0};
        ollama_unsupported(url, &e);
        refuse(cn, e.status, NULL, NULL, "%s", e.message);
        return;
    }
    if (cn->route == ROUTE_NONE) {
        char qm[64], qu[160];
        refuse(cn, path_known ? 405 : 404, NULL, NULL, "%s %s: %s",
               api_quote(qm, sizeof qm, method, strlen(method), 16),
               api_quote(qu, sizeof qu, url, strlen(url), 100),
               path_known ? "method not allowed" : "no such route");
        return;
    }

    /* a page that reached us through DNS rebinding names its own domain */
    const char *host = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Host");
    if (!guard_host_ok(host, s->opt.allowed_hosts, s->opt.n_allowed_hosts)) {
        char q[160];
        refuse(cn, 403, "permission_error", "host_not_allowed",
               "the Host header '%s' does not name this server (an IP address, localhost, or a "
               "name given with --allowed-host)", api_quote(q, sizeof q, host, strlen(host), 100));
        return;
    }
    /* a web page of another origin: refused, preflight or not */
    const char *origin = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin");
    if (origin && !guard_origin_ok(origin, host, s->opt.cors_origins, s->opt.n_cors_origins)) {
        char q[160];
        refuse(cn, 403, "permission_error", "origin_not_allowed",
               "requests from the web origin '%s' are not allowed (loopback origins and this "
               "server's own are; others with --cors-origin)",
               api_quote(q, sizeof q, origin, strlen(origin), 100));
        return;
    }
    if (cn->route == ROUTE_OPTIONS) return;
    if (!is_public && !api_key_ok(s, c)) {
        refuse(cn, 401, NULL, "invalid_api_key",
               "invalid or missing API key (send Authorization: Bearer KEY)");
        return;
    }

    /* the body's framing: a second Content-Length, or one beside Transfer-Encoding, is how
     * requests are smuggled past a proxy; refuse and close the connection after answering */
    struct header_count hc = {0};
    MHD_get_connection_values(c, MHD_HEADER_KIND, count_header, &hc);
    if (hc.content_length > 1 || (hc.content_length && hc.transfer_encoding) || hc.transfer_encoding > 1) {
        refuse(cn, 400, NULL, NULL, "%s", hc.content_length > 1
                                              ? "Content-Length is given more than once"
                                              : hc.transfer_encoding > 1
                                                    ? "Transfer-Encoding is given more than once"
                                                    : "Content-Length and Transfer-Encoding are "
                                                      "both given");
        cn->close_after = 1;
        return;
    }
    const char *ct = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Type");
    if (json_body && !guard_json_type(ct)) {
        char q[160];
        refuse(cn, 415, NULL, "unsupported_media_type",
               "the body must be JSON, sent with Content-Type: application/json (got %s%s%s)",
               ct ? "'" : "", ct ? api_quote(q, sizeof q, ct, strlen(ct), 100) : "none", ct ? "'" : "");
        cn->close_after = 1; /* its body is not read */
        return;
    }
    const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
    if (cl && strtoull(cl, NULL, 10) > s->opt.max_body_bytes) cn->too_large = 1;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version,
                                  const char *upload_data, size_t *upload_data_size,
                                  void **con_cls) {
    struct server *s = cls;
    struct conn *cn = *con_cls;
    (void)version;
    if (!cn) {
        cn = xcalloc(1, sizeof *cn);
        *con_cls = cn;
        if (s->conns) conns_request_started(s->conns, c);
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        cn->fd = ci ? ci->connect_fd : -1;
        if (cn->fd >= 0) {
            int one = 1;
            setsockopt(cn->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        }
        pthread_mutex_lock(&s->mu);
        s->met.requests++;
        pthread_mutex_unlock(&s->mu);
        cn->t0 = now_ms();
        api_quote(cn->method, sizeof cn->method, method, strlen(method), 16);
        api_quote(cn->url, sizeof cn->url, url, strlen(url), 120);
        classify(s, c, cn, url, method);
        if (cn->status && cn->close_after) { /* answer now; the body is not read */
            struct api_error e = {.status = cn->status, .type = cn->err_type, .code = cn->err_code,
                                  .ollama = cn->ollama};
            snprintf(e.message, sizeof e.message, "%s", cn->err_msg);
            return respond_route_error(s, c, cn->route, &e, 1);
        }
        if (cn->too_large && !cn->status) {
            /* answer before reading a body we will not accept */
            struct api_error e = {.status = 413, .type = "invalid_request_error", .ollama = cn->ollama};
            snprintf(e.message, sizeof e.message, "request body exceeds the limit of %zu bytes",
                     s->opt.max_body_bytes);
            return respond_route_error(s, c, cn->route, &e, 1);
        }
        return MHD_YES;
    }
    if (*upload_data_size) {
        if (!cn->status && !cn->too_large) {
            if (cn->body.len + *upload_data_size > s->opt.max_body_bytes) {
                cn->too_large = 1;
                free(cn->body.s);
                memset(&cn->body, 0, sizeof cn->body);
            } else {
                strbuf_add(&cn->body, upload_data, *upload_data_size);
            }
        }
        *upload_data_size = 0;
        return MHD_YES;
    }
    if (cn->status) {
        struct api_error e = {.status = cn->status, .type = cn->err_type, .code = cn->err_code,
                              .ollama = cn->ollama};
        snprintf(e.message, sizeof e.message, "%s", cn->err_msg);
        return respond_route_error(s, c, cn->route, &e, 0);
    }
    if (cn->too_large) {
        struct api_error e = {.status = 413, .type = "invalid_request_error", .ollama = cn->ollama};
        snprintf(e.message, sizeof e.message, "request body exceeds the limit of %zu bytes",
                 s->opt.max_body_bytes);
        return respond_route_error(s, c, cn->route, &e, 0);
    }
    switch (cn->route) {
    case ROUTE_HEALTH:
        return respond(s, c, 200, "application/json", "{\"status\":\"ok\"}", 15, 0);
    case ROUTE_MODELS:
        return respond_json(s, c, 200, api_models_json(s->model_name, s->created, s->model));
    case ROUTE_MODEL: {
        const char *id = url + (!strncmp(url, "/v1/", 4) ? strlen("/v1/models/") : strlen("/models/"));
        if (strcmp(id, s->model_name) != 0) {
            struct api_error e = {.status = 404, .type = "invalid_request_error",
                                  .code = "model_not_found"};
            char q[320];
            snprintf(e.message, sizeof e.message, "the model '%s' does not exist (this server "
                     "has '%s')", api_quote(q, sizeof q, id, strlen(id), 100), s->model_name);
            return respond_error(s, c, &e);
        }
        json_t *list = api_models_json(s->model_name, s->created, s->model);
        json_t *one = json_incref(json_array_get(json_object_get(list, "data"), 0));
        json_decref(list);
        return respond_json(s, c, 200, one);
    }
    case ROUTE_METRICS:
        return serve_metrics(s, c);
    case ROUTE_TOKENIZE:
    case ROUTE_DETOKENIZE: {
        struct api_error e = {0};
        json_t *r = cn->route == ROUTE_TOKENIZE ? api_tokenize(s->tok, cn->body.s, cn->body.len, &e)
                                                : api_detokenize(s->tok, cn->body.s, cn->body.len, &e);
        return r ? respond_json(s, c, 200, r) : respond_error(s, c, &e);
    }
    case ROUTE_APPLY_TEMPLATE: {
        struct api_error e = {0};
        json_t *r = api_apply_template(&s->tmpl, cn->body.s, cn->body.len, &e);
        return r ? respond_json(s, c, 200, r) : respond_error(s, c, &e);
    }
    case ROUTE_MESSAGES_COUNT: {
        struct api_error e = {0};
        json_t *r = anthropic_count_tokens(s->tok, &s->tmpl, cn->body.s, cn->body.len, &e);
        return r ? respond_json(s, c, 200, r) : respond_route_error(s, c, cn->route, &e, 0);
    }
    case ROUTE_CHAT:
    case ROUTE_COMPLETIONS:
    case ROUTE_RESPONSES:
    case ROUTE_MESSAGES:
    case ROUTE_OLLAMA_CHAT:
    case ROUTE_OLLAMA_GENERATE:
        return serve_generation(s, c, cn);
    case ROUTE_OLLAMA_TAGS:
    case ROUTE_OLLAMA_PS: {
        struct ollama_model om = ollama_model_of(s);
        return respond_json(s, c, 200, cn->route == ROUTE_OLLAMA_TAGS ? ollama_tags(&om) : ollama_ps(&om));
    }
    case ROUTE_PAGE: {
        size_t n;
        const char *html = page_html(&n);
        struct MHD_Response *r =
            MHD_create_response_from_buffer(n, (void *)html, MHD_RESPMEM_PERSISTENT);
        if (!r) return MHD_NO;
        MHD_add_response_header(r, "Content-Type", "text/html; charset=utf-8");
        MHD_add_response_header(r, "Cache-Control", "no-cache");
        /* its own origin only: no other site may frame it, it loads and calls nothing else */
        MHD_add_response_header(r, "Content-Security-Policy",
                                "default-src 'none'; script-src 'unsafe-inline'; style-src "
                                "'unsafe-inline'; connect-src 'self'; frame-ancestors 'none'");
        MHD_add_response_header(r, "X-Frame-Options", "DENY");
        MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
        add_cors(s, c, r);
        enum MHD_Result ret = MHD_queue_response(c, 200, r);
        MHD_destroy_response(r);
        return ret;
    }
    case ROUTE_OLLAMA_VERSION:
        return respond_json(s, c, 200, ollama_version());
    case ROUTE_OLLAMA_SHOW: {
        struct ollama_model om = ollama_model_of(s);
        struct api_error e = {0};
        json_t *r = ollama_show(&om, cn->body.s, cn->body.len, &e);
        return r ? respond_json(s, c, 200, r) : respond_error(s, c, &e);
    }
    case ROUTE_OPTIONS: {
        struct MHD_Response *r = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
        add_cors(s, c, r);
        MHD_add_response_header(r, "Access-Control-Allow-Methods", "GET, POST, OPTIONS");
        /* the origin is an allowed one (classify refused the rest): admit the headers its
         * browser asks for (SDKs add their own, such as the openai SDK's x-stainless-*) */
        const char *want = MHD_lookup_connection_value(c, MHD_HEADER_KIND,
                                                       "Access-Control-Request-Headers");
        MHD_add_response_header(r, "Access-Control-Allow-Headers",
                                guard_header_list_ok(want) ? want
                                                           : "Authorization, Content-Type, X-Api-Key");
        MHD_add_response_header(r, "Vary", "Access-Control-Request-Headers");
        MHD_add_response_header(r, "Access-Control-Max-Age", "86400");
        enum MHD_Result ret = MHD_queue_response(c, 204, r);
        MHD_destroy_response(r);
        return ret;
    }
    case ROUTE_NONE:
        break;
    }
    return MHD_NO;
}

/* ---- the log ------------------------------------------------------------------------- */

/* Log lines go to stderr whole (one write under log_mu), as text ("strata serve: ...") or, with
 * --log-format json, one JSON object per line. The server's own lines are rate-limited: a
 * burst of LOG_BURST, then one a second; what is dropped is counted and reported with the next
 * line let through (a flood of bad clients must not turn into a flood of log). Access lines
 * are rate-limited the same way when their status is a 4xx (a client's fault, which a hostile
 * client repeats at will); every other request gets its line. */
#define LOG_BURST 20

static void utc_now(char *buf, size_t cap) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    char day[32];
    strftime(day, sizeof day, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(buf, cap, "%.20s.%03dZ", day, (int)(ts.tv_nsec / 1000000));
}

/* log_mu held: 1 when a limited line may be written now. */
static int log_take(struct server *s) {
    double now = now_ms();
    if (now - s->log_t >= 1000) {
        s->log_tokens += (int)((now - s->log_t) / 1000);
        if (s->log_tokens > LOG_BURST) s->log_tokens = LOG_BURST;
        s->log_t = now;
    }
    if (s->log_tokens <= 0) {
        s->log_dropped++;
        return 0;
    }
    s->log_tokens--;
    return 1;
}

/* log_mu held. text: the line after "strata serve: " (no newline); json: the object's fields
 * after {"time":...,  ending without "}" (NULL: {"msg": text}). */
static void log_write(struct server *s, const char *text, const char *json) {
    struct strbuf b = {0};
    char t[64];
    if (s->log_dropped) {
        if (s->opt.log_json) {
            utc_now(t, sizeof t);
            strbuf_printf(&b, "{\"time\":\"%s\",\"level\":\"warn\",\"msg\":\"%lu log lines dropped\"}\n", t,
                          s->log_dropped);
        } else {
            strbuf_printf(&b, "strata serve: (%lu log lines dropped)\n", s->log_dropped);
        }
        s->log_dropped = 0;
    }
    if (s->opt.log_json) {
        utc_now(t, sizeof t);
        strbuf_printf(&b, "{\"time\":\"%s\",", t);
        if (json) {
            strbuf_adds(&b, json);
        } else {
            char q[1200];
            size_t n = strlen(text);
            while (n && text[n - 1] == '\n') n--;
            api_quote(q, sizeof q, text, n, 1000);
            strbuf_adds(&b, "\"level\":\"info\",\"msg\":");
            sbuf_json_str(&b, q, strlen(q));
        }
        strbuf_adds(&b, "}\n");
    } else {
        strbuf_adds(&b, "strata serve: ");
        strbuf_adds(&b, text);
        if (!b.len || b.s[b.len - 1] != '\n') strbuf_adds(&b, "\n");
    }
    fwrite(b.s, 1, b.len, stderr);
    fflush(stderr);
    free(b.s);
}

static void server_vlog(struct server *s, const char *fmt, va_list ap) {
    if (s->opt.quiet) return;
    char line[1024];
    vsnprintf(line, sizeof line, fmt, ap);
    pthread_mutex_lock(&s->log_mu);
    if (log_take(s)) log_write(s, line, NULL);
    pthread_mutex_unlock(&s->log_mu);
}

void server_logf(struct server *s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    server_vlog(s, fmt, ap);
    va_end(ap);
}

/* One line per request: method, route, status, and for a generation the prompt, cached and
 * generated tokens, the time to the first token, the decode speed and how it ended. */
static void access_log(struct server *s, struct MHD_Connection *c, struct conn *cn,
                       enum MHD_RequestTerminationCode toe) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_HTTP_STATUS);
    const int status = ci ? (int)ci->http_status : 0; /* 0: no response was queued */
    const double ms = now_ms() - cn->t0;
    int have_gen = 0, prompt = 0, cached = 0, generated = 0;
    double ttft = -1, tps = 0;
    const char *end = NULL;
    if (cn->job) {
        struct job *j = cn->job;
        pthread_mutex_lock(&j->mu);
        if (j->done && !j->failed) {
            have_gen = 1;
            prompt = j->res.n_prompt;
            cached = j->res.timings.cache_n;
            generated = j->res.n_generated;
            tps = j->res.timings.predicted_per_second;
            if (j->t_first > 0) ttft = j->t_first - j->t_enqueue;
            end = j->res.finish == ENGINE_FINISH_CANCELLED ? "cancelled"
                                                           : engine_finish_name(j->res.finish);
        } else if (!j->done) {
            end = "client gone";
        } else {
            end = "failed";
        }
        pthread_mutex_unlock(&j->mu);
    }
    if (!end && toe != MHD_REQUEST_TERMINATED_COMPLETED_OK) end = "connection closed";
    struct strbuf b = {0};
    if (s->opt.log_json) {
        strbuf_adds(&b, "\"level\":\"info\",\"event\":\"request\",\"method\":");
        sbuf_json_str(&b, cn->method, strlen(cn->method));
        strbuf_adds(&b, ",\"route\":");
        sbuf_json_str(&b, cn->url, strlen(cn->url));
        strbuf_printf(&b, ",\"status\":%d", status);
        if (have_gen) {
            strbuf_printf(&b, ",\"prompt_tokens\":%d,\"cached_tokens\":%d,\"generated_tokens\":%d",
                          prompt, cached, generated);
            if (ttft >= 0) strbuf_printf(&b, ",\"ttft_ms\":%.1f", ttft);
            strbuf_printf(&b, ",\"tokens_per_second\":%.1f", tps);
        }
        if (end) {
            strbuf_adds(&b, ",\"end\":");
            sbuf_json_str(&b, end, strlen(end));
        }
        strbuf_printf(&b, ",\"duration_ms\":%.1f", ms);
    } else {
        strbuf_printf(&b, "%s %s %d", cn->method, cn->url, status);
        if (have_gen) {
            strbuf_printf(&b, " prompt=%d cached=%d generated=%d", prompt, cached, generated);
            if (ttft >= 0) strbuf_printf(&b, " ttft_ms=%.1f", ttft);
            strbuf_printf(&b, " tok/s=%.1f", tps);
        }
        if (end) strbuf_printf(&b, " end=%s", end);
        strbuf_printf(&b, " ms=%.1f", ms);
    }
    pthread_mutex_lock(&s->log_mu);
    if ((status < 400 || status >= 500) || log_take(s))
        log_write(s, s->opt.log_json ? NULL : b.s, s->opt.log_json ? b.s : NULL);
    pthread_mutex_unlock(&s->log_mu);
    free(b.s);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
    struct server *s = cls;
    struct conn *cn = *con_cls;
    if (s->conns) conns_request_done(s->conns, c);
    if (!cn) return;
    if (!s->opt.quiet) access_log(s, c, cn, toe);
    if (cn->job) job_release(cn->job);
    free(cn->body.s);
    free(cn);
    *con_cls = NULL;
}

static void mhd_log(void *cls, const char *fmt, va_list ap) { server_vlog(cls, fmt, ap); }

static void conns_log(void *user, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void conns_log(void *user, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    server_vlog(user, fmt, ap);
    va_end(ap);
}

/* ---- lifecycle ------------------------------------------------------------------------ */

struct server *server_start(const struct server_options *o, struct error *err) {
    struct server *s = xcalloc(1, sizeof *s);
    s->opt = *o;
    CHECK(s->opt.model_dir);
    if (!s->opt.host) s->opt.host = "127.0.0.1";
    if (s->opt.queue_max <= 0) s->opt.queue_max = 64;
    if (!s->opt.max_body_bytes) s->opt.max_body_bytes = (size_t)8 << 20;
    if (s->opt.header_timeout_s <= 0) s->opt.header_timeout_s = 10;
    if (s->opt.body_timeout_s <= 0) s->opt.body_timeout_s = 30;
    if (s->opt.stream_timeout_s <= 0) s->opt.stream_timeout_s = 600;
    pthread_mutex_init(&s->mu, NULL);
    pthread_mutex_init(&s->log_mu, NULL);
    s->log_tokens = LOG_BURST;
    s->log_t = now_ms();
    pthread_cond_init(&s->cv, NULL);
    s->created = (long)time(NULL);
    s->rng = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32) ^ (uint64_t)(now_ms() * 1e3);

    const char *dir = s->opt.model_dir;
    if (s->opt.model_name) {
        snprintf(s->model_name, sizeof s->model_name, "%s", s->opt.model_name);
    } else {
        char tmp[256];
        snprintf(tmp, sizeof tmp, "%s", dir);
        size_t n = strlen(tmp);
        while (n > 1 && tmp[n - 1] == '/') tmp[--n] = 0;
        const char *base = strrchr(tmp, '/');
        snprintf(s->model_name, sizeof s->model_name, "%s", base ? base + 1 : tmp);
    }

    if (s->opt.api_key) {
        s->api_key_len = strlen(s->opt.api_key);
        if (s->api_key_len == 0 || s->api_key_len > SERVER_API_KEY_MAX) {
            error_set(err, "the API key must be 1 to %d bytes (it has %zu)", SERVER_API_KEY_MAX,
                      s->api_key_len);
            goto fail;
        }
        memcpy(s->api_key, s->opt.api_key, s->api_key_len);
    }
    if (utf8_validate(s->model_name, strlen(s->model_name), NULL) < 0) {
        error_set(err, "the model name '%s' is not UTF-8 (it goes into JSON responses); give "
                  "one with --alias", s->model_name);
        goto fail;
    }

    if (config_check_dir(dir, err) != 0) goto fail; /* before the tokenizer's own error */
    const char *tdir = s->opt.tokenizer_dir ? s->opt.tokenizer_dir : dir;
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer.json", tdir);
    s->tok = tokenizer_load(path, err);
    if (!s->tok) goto fail;
    if (chat_template_load(&s->tmpl, tdir, err) != 0) goto fail;
    server_logf(s, "loading %s\n", dir);
    s->model = model_load(dir, &s->opt.model, err);
    if (!s->model) goto fail;
    s->engine = engine_create(s->model, s->tok);
    { /* the host's first-use costs too: a render of the template and an encode */
        json_t *rq = json_pack("{s:[{s:s,s:s}]}", "messages", "role", "user", "content", "Hello");
        char *text = NULL;
        struct error werr = {{0}};
        int32_t *ids = NULL;
        int n = 0;
        if (rq && chat_render(&s->tmpl, rq, &text, &werr) == 0 && text)
            (void)tokenizer_encode(s->tok, text, strlen(text), &ids, &n, &werr);
        free(ids);
        free(text);
        json_decref(rq);
        api_grammar_warmup(s->model, s->tok);
    }
    engine_set_prefix_reuse(s->engine, !s->opt.no_prefix_reuse);
    /* the cache's sequences are also those of the requests running at once */
    engine_set_cache(s->engine, s->opt.cache_bytes);
    engine_set_parallel(s->engine, s->opt.parallel);
    engine_warmup(s->engine); /* the batched steps' shapes too, now that there are sequences */
    engine_cache_stats(s->engine, &s->met.cache);
    if (!s->opt.no_prefix_reuse)
        server_logf(s, "prefix cache of %.2f GiB: %d sequences, %d checkpoints\n",
                   s->met.cache.budget_bytes / 1073741824.0, s->met.cache.n_seqs, s->met.cache.n_ckpts);
    server_logf(s, "%d requests at once (--parallel)\n", engine_parallel(s->engine));
    if (s->opt.no_http) return s;

    engine_serve(s->engine); /* from now on the engine thread alone runs the rounds */
    if (pthread_create(&s->engine_thread, NULL, engine_main, s) != 0) {
        error_set(err, "cannot start the engine thread");
        goto fail;
    }
    s->engine_started = 1;
    s->workers = xcalloc((size_t)engine_parallel(s->engine), sizeof *s->workers);
    for (int i = 0; i < engine_parallel(s->engine); i++) {
        if (pthread_create(&s->workers[i], NULL, worker_main, s) != 0) {
            error_set(err, "cannot start a request thread");
            goto fail;
        }
        s->n_workers++;
    }

    struct conns_options co = {.host = s->opt.host, .port = s->opt.port,
                               .max_connections = s->opt.max_connections,
                               .max_per_client = s->opt.max_per_client,
                               .header_timeout_s = s->opt.header_timeout_s,
                               .body_timeout_s = s->opt.body_timeout_s,
                               .log = conns_log, .log_user = s};
    s->conns = conns_open(&co, err);
    if (!s->conns) goto fail;
    /* MHD gets connections from conns (no listening socket of its own), one thread each;
     * its inactivity timeout covers headers and bodies (conns adds the totals), and a
     * generation lengthens it for its own connection. Its connection limit is only a
     * backstop: conns keeps far below it. */
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD |
                     MHD_USE_POLL | MHD_USE_ERROR_LOG | MHD_USE_NO_LISTEN_SOCKET | MHD_USE_ITC;
    unsigned idle_s = (unsigned)(s->opt.header_timeout_s > s->opt.body_timeout_s
                                     ? s->opt.header_timeout_s : s->opt.body_timeout_s);
    s->daemon = MHD_start_daemon(flags, 0, NULL, NULL, on_request, s,
                                 MHD_OPTION_EXTERNAL_LOGGER, mhd_log, s,
                                 MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
                                 MHD_OPTION_NOTIFY_CONNECTION, conns_notify, s->conns,
                                 MHD_OPTION_CONNECTION_LIMIT, conns_fd_limit(s->conns),
                                 MHD_OPTION_CONNECTION_TIMEOUT, idle_s,
                                 MHD_OPTION_END);
    if (!s->daemon) {
        error_set(err, "cannot start libmicrohttpd: %s", errno ? strerror(errno) : "refused");
        goto fail;
    }
    if (conns_run(s->conns, s->daemon, err) != 0) goto fail;
    s->port = conns_port(s->conns);
    return s;
fail:
    server_stop(s);
    return NULL;
}

int server_port(const struct server *s) { return s->port; }
const char *server_model_name(const struct server *s) { return s->model_name; }
struct model *server_model(struct server *s) { return s->model; }
struct engine *server_engine(struct server *s) { return s->engine; }
struct tokenizer *server_tokenizer(struct server *s) { return s->tok; }

void server_stop(struct server *s) {
    if (!s) return;
    atomic_store(&s->stopping, 1);
    if (s->engine_started) {
        pthread_mutex_lock(&s->mu);
        pthread_cond_broadcast(&s->cv);
        pthread_mutex_unlock(&s->mu);
        for (int i = 0; i < s->n_workers; i++) pthread_join(s->workers[i], NULL);
        atomic_store(&s->engine_stop, 1); /* nothing more can be submitted */
        engine_wake(s->engine);
        pthread_join(s->engine_thread, NULL);
    }
    free(s->workers);
    /* no new connections; the engine has ended every job (running ones with an error event:
     * api_job_run), so every open stream has its last bytes - wait until MHD has written them
     * (the streams' responses are freed), within a bound, before closing the sockets */
    conns_stop(s->conns);
    pthread_mutex_lock(&s->mu);
    double t0 = now_ms();
    while (s->n_streams > 0 && now_ms() - t0 < SHUTDOWN_EVENT_WAIT_MS) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 20 * 1000000L;
        if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
        pthread_cond_timedwait(&s->cv, &s->mu, &ts);
    }
    pthread_mutex_unlock(&s->mu);
    if (s->daemon) MHD_stop_daemon(s->daemon);
    conns_free(s->conns);
    engine_free(s->engine);
    if (s->model) model_free(s->model);
    if (s->tok) tokenizer_free(s->tok);
    pthread_mutex_destroy(&s->mu);
    pthread_mutex_destroy(&s->log_mu);
    pthread_cond_destroy(&s->cv);
    free(s);
}

int server_run_inprocess(struct server *s, const char *body, size_t len,
                         int (*sink)(void *user, const char *frame, size_t n), void *user,
                         struct server_inprocess_stats *st) {
    struct api_error e = {0};
    double t0 = now_ms();
    struct job *j = api_job_new(s->model, s->tok, &s->tmpl, s->model_name, 1, body, len, &s->rng,
                                &s->mu, s->opt.allow_forced_output, &e);
    if (!j) return e.status;
    j->server = s;
    j->fd = -1;
    j->sink = sink;
    j->sink_user = user;
    j->t_enqueue = t0;
    api_job_run(j, s->engine);
    if (st) {
        st->ttft_ms = j->t_first - t0;
        st->n_tokens = j->res.n_generated;
        st->decode_ms = j->res.timings.predicted_ms;
        st->emit_ms = j->emit_ms;
    }
    int status = j->failed ? j->fail_status : 200;
    api_job_free(j);
    return status;
}
