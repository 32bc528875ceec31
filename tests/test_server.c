/* test_server.c - the HTTP server end to end over loopback, with a raw-socket client: every
 * endpoint, every bad-input case of issue 5 item 6 (status, OpenAI error shape, the field
 * named), streaming (one event per token, role first, [DONE] last, usage chunk, stream ==
 * non-stream under greedy), stop strings across token boundaries, disconnect -> cancel,
 * full queue -> 503 + Retry-After, the arrival time of every SSE event, and the load test:
 * 16 concurrent streaming clients x 5 requests, each response equal to the same request served
 * alone (greedy decoding is deterministic on the CPU backend, so equality is exact).
 * Runs the server in-process on the demo model (STRATA_DEMO_MODEL overrides), CPU backend, one
 * thread; under `make test-asan` LeakSanitizer checks that nothing leaks. Finally, if
 * $BUILD/strata exists, `strata serve` is started and stopped with SIGTERM mid-stream. */
#include <arpa/inet.h>
#include <jansson.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "api/server.h"
#include "api/openai.h"

static int g_port;
static const char *g_key = "sekret";

/* ---- a minimal HTTP/1.1 client -------------------------------------------------------- */

struct resp {
    int status;
    char head[8192];
    char *body; /* de-chunked, NUL-terminated */
    size_t len;
    /* SSE: arrival time (ms since send) of each complete event, and the recv() batch it came in */
    int n_events;
    double ev_ms[4096];
    int ev_batch[4096];
    char *events[4096];
    int n_batches;
};

static void resp_free(struct resp *r) {
    free(r->body);
    for (int i = 0; i < r->n_events; i++) free(r->events[i]);
    memset(r, 0, sizeof *r);
}

static int connect_port(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return -1;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

static int send_all(int fd, const char *p, size_t n) {
    while (n) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w <= 0) return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Sends a request; hdrs: extra header lines ("K: V\r\n"). auth: add the API key. */
static int send_request(int fd, const char *method, const char *path, const char *hdrs,
                        const char *body, size_t len, int auth) {
    char head[2048];
    int n = snprintf(head, sizeof head,
                     "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n%s%s%s%s",
                     method, path, auth ? "Authorization: Bearer " : "", auth ? g_key : "",
                     auth ? "\r\n" : "", hdrs ? hdrs : "");
    if (body && !(hdrs && strstr(hdrs, "Transfer-Encoding")))
        n += snprintf(head + n, sizeof head - (size_t)n,
                      "Content-Type: application/json\r\nContent-Length: %zu\r\n", len);
    n += snprintf(head + n, sizeof head - (size_t)n, "\r\n");
    if (send_all(fd, head, (size_t)n)) return -1;
    return body && len ? send_all(fd, body, len) : 0;
}

static double ms_since(const struct timespec *t0) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (t.tv_sec - t0->tv_sec) * 1e3 + (t.tv_nsec - t0->tv_nsec) / 1e6;
}

/* Reads the whole response (the server closes: Connection: close), de-chunks the body and
 * splits SSE events as they arrive. stop_after_events > 0: return after that many events. */
static int read_response(int fd, struct resp *r, const struct timespec *t0, int stop_after_events) {
    size_t cap = 1 << 16, n = 0;
    char *raw = malloc(cap);
    size_t head_end = 0;
    int chunked = 0;
    struct {
        char *s;
        size_t len, cap;
    } body = {malloc(1 << 16), 0, 1 << 16};
    size_t parse = 0; /* raw offset of the next chunk header */
    size_t ev_start = 0;
    for (;;) {
        if (n + 4096 > cap) raw = realloc(raw, cap *= 2);
        ssize_t got = recv(fd, raw + n, cap - n - 1, 0);
        if (got <= 0) break;
        n += (size_t)got;
        raw[n] = 0;
        double t = ms_since(t0);
        r->n_batches++;
        if (!head_end) {
            char *e = strstr(raw, "\r\n\r\n");
            if (!e) continue;
            head_end = (size_t)(e - raw) + 4;
            size_t hl = head_end < sizeof r->head - 1 ? head_end : sizeof r->head - 1;
            memcpy(r->head, raw, hl);
            r->head[hl] = 0;
            r->status = atoi(raw + 9);
            chunked = strcasestr(r->head, "Transfer-Encoding: chunked") != NULL;
            parse = head_end;
        }
        /* append newly complete body bytes */
        for (;;) {
            size_t avail = n - parse;
            if (!chunked) {
                if (body.len + avail + 1 > body.cap) body.s = realloc(body.s, body.cap = 2 * (body.len + avail + 1));
                memcpy(body.s + body.len, raw + parse, avail);
                body.len += avail;
                parse = n;
                break;
            }
            char *crlf = memmem(raw + parse, avail, "\r\n", 2);
            if (!crlf) break;
            size_t csz = strtoul(raw + parse, NULL, 16);
            size_t data = (size_t)(crlf - raw) + 2;
            if (n < data + csz + 2) break;
            if (body.len + csz + 1 > body.cap) body.s = realloc(body.s, body.cap = 2 * (body.len + csz + 1));
            memcpy(body.s + body.len, raw + data, csz);
            body.len += csz;
            parse = data + csz + 2;
            if (csz == 0) break;
        }
        body.s[body.len] = 0;
        /* complete SSE events */
        char *sep;
        while ((sep = memmem(body.s + ev_start, body.len - ev_start, "\n\n", 2)) && r->n_events < 4096) {
            size_t el = (size_t)(sep - (body.s + ev_start));
            char *ev = malloc(el + 1);
            memcpy(ev, body.s + ev_start, el);
            ev[el] = 0;
            r->events[r->n_events] = ev;
            r->ev_ms[r->n_events] = t;
            r->ev_batch[r->n_events] = r->n_batches;
            r->n_events++;
            ev_start += el + 2;
        }
        if (stop_after_events && r->n_events >= stop_after_events) break;
    }
    free(raw);
    r->body = body.s;
    r->len = body.len;
    return head_end ? 0 : -1;
}

static int http(const char *method, const char *path, const char *hdrs, const char *body,
                int auth, struct resp *r) {
    memset(r, 0, sizeof *r);
    int fd = connect_port(g_port);
    if (fd < 0) return -1;
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    send_request(fd, method, path, hdrs, body, body ? strlen(body) : 0, auth);
    int rc = read_response(fd, r, &t0, 0);
    close(fd);
    return rc;
}

static json_t *body_json(const struct resp *r) {
    return json_loads(r->body ? r->body : "", JSON_ALLOW_NUL, NULL);
}

/* Status and error shape; the message must contain `needle` and param equal `param` (NULL:
 * not checked). */
static void expect_error(const char *what, const char *method, const char *path, const char *hdrs,
                         const char *body, int auth, int status, const char *needle,
                         const char *param) {
    struct resp r;
    http(method, path, hdrs, body, auth, &r);
    json_t *j = body_json(&r);
    json_t *err = json_object_get(j, "error");
    const char *msg = json_string_value(json_object_get(err, "message"));
    const char *type = json_string_value(json_object_get(err, "type"));
    json_t *p = json_object_get(err, "param");
    EXPECT(r.status == status, "%s: status %d, want %d (%s)", what, r.status, status,
           r.body ? r.body : "");
    EXPECT(msg && type && p && json_object_get(err, "code"),
           "%s: not an OpenAI error body: %s", what, r.body ? r.body : "");
    if (msg && needle) EXPECT(strstr(msg, needle), "%s: message '%s' lacks '%s'", what, msg, needle);
    if (param) EXPECT(json_is_string(p) && !strcmp(json_string_value(p), param),
                      "%s: param should be '%s': %s", what, param, r.body);
    json_decref(j);
    resp_free(&r);
}

/* Concatenated delta content (chat) or text (completions) of an SSE response; checks the
 * framing. finish: the finish_reason seen. */
static char *sse_text(const struct resp *r, int chat, char *finish, size_t fcap, int *ok,
                      json_t **usage, json_t **timings) {
    size_t cap = 4096, len = 0;
    char *out = malloc(cap);
    out[0] = 0;
    *ok = r->n_events >= 2 && !strcmp(r->events[r->n_events - 1], "data: [DONE]");
    for (int i = 0; i < r->n_events - 1; i++) {
        if (strncmp(r->events[i], "data: ", 6) != 0) {
            *ok = 0;
            continue;
        }
        json_t *j = json_loads(r->events[i] + 6, 0, NULL);
        if (!j) {
            *ok = 0;
            continue;
        }
        if (usage && json_object_get(j, "usage") && json_is_object(json_object_get(j, "usage")))
            *usage = json_incref(json_object_get(j, "usage"));
        if (timings && json_object_get(j, "timings")) *timings = json_incref(json_object_get(j, "timings"));
        json_t *c0 = json_array_get(json_object_get(j, "choices"), 0);
        const char *s = NULL;
        if (chat) {
            json_t *d = json_object_get(c0, "delta");
            s = json_string_value(json_object_get(d, "content"));
            if (i == 0 && c0 && !json_object_get(d, "role")) *ok = 0; /* role first */
        } else {
            s = json_string_value(json_object_get(c0, "text"));
        }
        const char *fr = json_string_value(json_object_get(c0, "finish_reason"));
        if (fr) snprintf(finish, fcap, "%s", fr);
        if (s) {
            size_t sl = strlen(s);
            if (len + sl + 1 > cap) out = realloc(out, cap = 2 * (len + sl + 1));
            memcpy(out + len, s, sl + 1);
            len += sl;
        }
        json_decref(j);
    }
    return out;
}

static char *json_text_of(const struct resp *r, int chat, char *finish, size_t fcap) {
    json_t *j = body_json(r);
    json_t *c0 = json_array_get(json_object_get(j, "choices"), 0);
    const char *s = chat ? json_string_value(json_object_get(json_object_get(c0, "message"), "content"))
                         : json_string_value(json_object_get(c0, "text"));
    const char *fr = json_string_value(json_object_get(c0, "finish_reason"));
    snprintf(finish, fcap, "%s", fr ? fr : "");
    char *out = strdup(s ? s : "");
    json_decref(j);
    return out;
}

static double metric(const char *name) {
    struct resp r;
    http("GET", "/metrics", NULL, NULL, 1, &r);
    double v = -1;
    char key[128];
    snprintf(key, sizeof key, "\n%s ", name);
    char *p = r.body ? strstr(r.body, key) : NULL;
    if (p) v = atof(p + strlen(key));
    resp_free(&r);
    return v;
}

/* ---- load test ------------------------------------------------------------------------ */

#define N_CLIENTS 16
#define N_PER_CLIENT 5

static char *load_body(int client, int k, int stream) {
    char *b = malloc(512);
    snprintf(b, 512,
             "{\"messages\":[{\"role\":\"user\",\"content\":\"Client %d asks question %d: tell me "
             "about rivers.\"}],\"max_tokens\":%d,\"temperature\":0,\"stream\":%s,"
             "\"chat_template_kwargs\":{\"enable_thinking\":false}}",
             client, k, 12 + (client * 7 + k * 3) % 20, stream ? "true" : "false");
    return b;
}

static char *g_ref[N_CLIENTS][N_PER_CLIENT];
static int g_load_bad[N_CLIENTS];

static void *load_client(void *arg) {
    int c = (int)(intptr_t)arg;
    for (int k = 0; k < N_PER_CLIENT; k++) {
        char *b = load_body(c, k, 1);
        struct resp r;
        http("POST", "/v1/chat/completions", NULL, b, 1, &r);
        char fin[32] = "";
        int ok;
        char *t = sse_text(&r, 1, fin, sizeof fin, &ok, NULL, NULL);
        if (r.status != 200 || !ok || strcmp(t, g_ref[c][k]) != 0) {
            fprintf(stderr, "load client %d req %d: status %d ok %d\n  got  '%s'\n  want '%s'\n", c,
                    k, r.status, ok, t, g_ref[c][k]);
            g_load_bad[c]++;
        }
        free(t);
        free(b);
        resp_free(&r);
    }
    return NULL;
}

/* During the load: a client that opens long streams and goes away after a few events (its
 * generation cancelled while others share its steps), and a watcher of how many requests run at
 * once (continuous batching: more than one). */
/* Opens a chat stream with body b on port (auth: with the key), reads n of its events into *r;
 * returns the socket, the rest of the stream unread. */
static int stream_open(int port, const char *b, int auth, int n, struct resp *r) {
    int fd = connect_port(port);
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    send_request(fd, "POST", "/v1/chat/completions", NULL, b, strlen(b), auth);
    memset(r, 0, sizeof *r);
    read_response(fd, r, &t0, n);
    return fd;
}
/* Opens an endless stream, reads n events, goes away; returns the events it got. */
static int stream_and_drop(int n) {
    const char *b = "{\"messages\":[{\"role\":\"user\",\"content\":\"Go on forever.\"}],"
                    "\"max_tokens\":100000,\"ignore_eos\":true,\"temperature\":0,\"stream\":true}";
    struct resp r;
    int fd = stream_open(g_port, b, 1, n, &r);
    const int got = r.n_events;
    close(fd);
    resp_free(&r);
    return got;
}
static atomic_int g_load_done;
static int g_max_running, g_dropped;
static void *dropper_client(void *arg) {
    (void)arg;
    for (int i = 0; i < 4; i++)
        if (stream_and_drop(3) >= 3) g_dropped++;
    return NULL;
}
static void *running_watcher(void *arg) {
    (void)arg;
    while (!atomic_load(&g_load_done)) {
        const int n = (int)metric("strata_requests_running");
        if (n > g_max_running) g_max_running = n;
        usleep(20000);
    }
    return NULL;
}

/* ---- tests ---------------------------------------------------------------------------- */

static const char *CHAT_SMALL =
    "{\"model\":\"x\",\"messages\":[{\"role\":\"user\",\"content\":\"Hello there\"}],"
    "\"max_tokens\":24,\"temperature\":0,\"chat_template_kwargs\":{\"enable_thinking\":false}}";


/* Mutated requests (byte flips, truncation, duplication) never take the server down: every one
 * gets an HTTP status, 200 or 4xx, and /health still answers. Under ASan this is a memory-safety
 * check of the whole request path. */
static void test_fuzz(void) {
    const char *seeds[] = {
        "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":2,\"temperature\":0.5,"
        "\"stop\":[\"a\",\"b\"],\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],"
        "\"stream\":true,\"stream_options\":{\"include_usage\":true},\"logit_bias\":{\"5\":1}}",
        "{\"prompt\":[1,2,3],\"max_tokens\":2,\"seed\":4,\"top_k\":3,\"top_p\":0.5,\"min_p\":0.1}",
    };
    const char *paths[] = {"/v1/chat/completions", "/v1/completions"};
    uint32_t x = 2463534242u;
    int bad = 0;
    for (int it = 0; it < 150; it++) {
        int k = it % 2;
        char body[1024];
        size_t n = strlen(seeds[k]);
        memcpy(body, seeds[k], n + 1);
        int muts = 1 + it % 4;
        for (int m = 0; m < muts; m++) {
            x ^= x << 13, x ^= x >> 17, x ^= x << 5;
            if (n < 2) break;
            size_t pos = x % n;
            switch ((x >> 8) % 4) {
            case 0: body[pos] = (char)(x >> 16); break;            /* any byte, also invalid UTF-8 */
            case 1: n = pos; body[n] = 0; break;                      /* truncate */
            case 2: body[pos] = "{}[]\",:0-eE."[(x >> 16) % 12]; break; /* JSON syntax */
            case 3: if (n * 2 < sizeof body) { memcpy(body + n, body, n); n *= 2; body[n] = 0; } break;
            }
        }
        struct resp r;
        memset(&r, 0, sizeof r);
        int fd = connect_port(g_port);
        struct timespec t0;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        send_request(fd, "POST", paths[k], NULL, body, n, 1);
        read_response(fd, &r, &t0, 0);
        close(fd);
        if (!(r.status == 200 || (r.status >= 400 && r.status < 500))) {
            bad++;
            fprintf(stderr, "fuzz %d: status %d for %.*s\n", it, r.status, (int)n, body);
        }
        resp_free(&r);
    }
    EXPECT(bad == 0, "%d of 150 mutated requests got no 200/4xx answer", bad);
    struct resp r;
    http("GET", "/health", NULL, NULL, 0, &r);
    EXPECT(r.status == 200, "alive after the fuzzing");
    resp_free(&r);
}

/* JSON string escaping of the hand-made SSE frames: bytes 0x01..0x7e and a 2-byte UTF-8
 * character round-trip through jansson. */
static void test_escape(void) {
    char raw[128];
    for (int i = 1; i < 128; i++) raw[i - 1] = (char)i;
    memcpy(raw + 127 - 1, "\xc3\xa9", 2); /* and a 2-byte UTF-8 character */
    struct strbuf b = {0};
    sbuf_json_str(&b, raw, 128);
    json_t *v = json_loadb(b.s, b.len, JSON_DECODE_ANY, NULL);
    EXPECT(v && json_string_length(v) == 128 && !memcmp(json_string_value(v), raw, 128),
           "sbuf_json_str round trip: %s", b.s);
    json_decref(v);
    free(b.s);
}

static void test_basic_endpoints(void) {
    struct resp r;
    /* issue 24 item 4: " \xed" + "\x8f\xe8\xbf\xb0" is " \ufffd\u8ff0" (one U+FFFD) */
    http("POST", "/detokenize", NULL, "{\"tokens\":[10764,44834]}", 1, &r);
    {
        json_t *j = body_json(&r);
        const char *c = json_string_value(json_object_get(j, "content"));
        EXPECT(r.status == 200 && c && !strcmp(c, " \xef\xbf\xbd\xe8\xbf\xb0"),
               "/detokenize [10764, 44834]: %s", r.body);
        json_decref(j);
    }
    resp_free(&r);
    http("GET", "/health", NULL, NULL, 0, &r);
    EXPECT(r.status == 200 && r.body && strstr(r.body, "\"ok\""), "/health: %d", r.status);
    resp_free(&r);
    /* CORS (issue 24): loopback origins are echoed, others refused; no wildcard */
    http("OPTIONS", "/v1/chat/completions", "Origin: http://localhost:5173\r\n"
         "Access-Control-Request-Method: POST\r\n", NULL, 0, &r);
    EXPECT(r.status == 204 && strcasestr(r.head, "Access-Control-Allow-Origin: http://localhost:5173\r\n") &&
               !strcasestr(r.head, "Access-Control-Allow-Origin: *"),
           "CORS preflight from a loopback origin: %d\n%s", r.status, r.head);
    resp_free(&r);
    http("OPTIONS", "/v1/chat/completions", "Origin: https://evil.example\r\n"
         "Access-Control-Request-Method: POST\r\n", NULL, 0, &r);
    EXPECT(r.status == 403 && !strcasestr(r.head, "Access-Control-Allow-Origin"),
           "CORS preflight from another origin: %d\n%s", r.status, r.head);
    resp_free(&r);
    http("GET", "/v1/models", NULL, NULL, 1, &r);
    json_t *j = body_json(&r);
    EXPECT(r.status == 200 && json_is_string(json_object_get(json_array_get(json_object_get(j, "data"), 0), "id")),
           "/v1/models: %d %s", r.status, r.body);
    json_decref(j);
    resp_free(&r);

    http("POST", "/tokenize", NULL, "{\"content\":\"Hello world, héllo!\"}", 1, &r);
    j = body_json(&r);
    json_t *toks = json_object_get(j, "tokens");
    EXPECT(r.status == 200 && json_array_size(toks) > 2, "/tokenize: %s", r.body);
    char req[1024] = "{\"tokens\":";
    char *ts = json_dumps(toks, JSON_COMPACT);
    strncat(req, ts ? ts : "[]", sizeof req - strlen(req) - 2);
    strcat(req, "}");
    free(ts);
    json_decref(j);
    resp_free(&r);
    http("POST", "/detokenize", NULL, req, 1, &r);
    j = body_json(&r);
    EXPECT(r.status == 200 && json_string_value(json_object_get(j, "content")) &&
               !strcmp(json_string_value(json_object_get(j, "content")), "Hello world, héllo!"),
           "/detokenize round trip: %s", r.body);
    json_decref(j);
    resp_free(&r);
}


static const char *TOOL_REQ =
    "{\"messages\":[{\"role\":\"user\",\"content\":\"Weather in Paris?\"}],"
    "\"chat_template_kwargs\":{\"enable_thinking\":true},"
    "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":"
    "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"},\"days\":{\"type\":"
    "\"integer\"}}}}}],"
    "\"strata_forced_output\":\"Let me check.\\n</think>\\n\\n<tool_call>\\n<function=get_weather>"
    "\\n<parameter=city>\\nParis\\n</parameter>\\n<parameter=days>\\n3\\n</parameter>\\n</function>"
    "\\n</tool_call>\",\"stream\":%s}";

/* Tool calls and reasoning through the real output path: the demo model would not write them,
 * so the engine is teacher-forced with the text (strata_forced_output) and everything after
 * the sampler - detokenizer, parser, framing - runs as in production. */
static void test_tool_calls(void) {
    char body[2048];
    struct resp r;
    snprintf(body, sizeof body, TOOL_REQ, "false");
    http("POST", "/v1/chat/completions", NULL, body, 1, &r);
    json_t *j = body_json(&r);
    json_t *c0 = json_array_get(json_object_get(j, "choices"), 0);
    json_t *msg = json_object_get(c0, "message");
    json_t *tc = json_array_get(json_object_get(msg, "tool_calls"), 0);
    json_t *args = json_loads(json_string_value(json_object_get(json_object_get(tc, "function"),
                                                               "arguments")) ?: "", 0, NULL);
    EXPECT(r.status == 200 && json_is_null(json_object_get(msg, "content")) &&
               !strcmp(json_string_value(json_object_get(c0, "finish_reason")) ?: "", "tool_calls"),
           "tool call response: %s", r.body);
    EXPECT(!strcmp(json_string_value(json_object_get(json_object_get(tc, "function"), "name")) ?: "",
                   "get_weather") &&
               !strcmp(json_string_value(json_object_get(args, "city")) ?: "", "Paris") &&
               json_integer_value(json_object_get(args, "days")) == 3,
           "tool call name/arguments (days typed integer by the schema): %s", r.body);
    EXPECT(!strcmp(json_string_value(json_object_get(msg, "reasoning_content")) ?: "", "Let me check."),
           "reasoning_content split: %s", r.body);
    char *want_args = strdup(json_string_value(json_object_get(json_object_get(tc, "function"), "arguments")) ?: "");
    json_decref(args);
    json_decref(j);
    resp_free(&r);

    /* streamed: accumulate deltas as the openai clients do (by index) */
    snprintf(body, sizeof body, TOOL_REQ, "true");
    http("POST", "/v1/chat/completions", NULL, body, 1, &r);
    char name[64] = "", argbuf[512] = "", reasoning[256] = "", finish[32] = "";
    int n_ids = 0;
    for (int i = 0; i < r.n_events; i++) {
        if (strncmp(r.events[i], "data: {", 7)) continue;
        json_t *ev = json_loads(r.events[i] + 6, 0, NULL);
        json_t *ch = json_array_get(json_object_get(ev, "choices"), 0);
        json_t *d = json_object_get(ch, "delta");
        const char *rc = json_string_value(json_object_get(d, "reasoning_content"));
        if (rc) strncat(reasoning, rc, sizeof reasoning - strlen(reasoning) - 1);
        json_t *t = json_array_get(json_object_get(d, "tool_calls"), 0);
        if (t) {
            if (json_object_get(t, "id")) n_ids++;
            const char *nm = json_string_value(json_object_get(json_object_get(t, "function"), "name"));
            const char *a = json_string_value(json_object_get(json_object_get(t, "function"), "arguments"));
            if (nm) snprintf(name, sizeof name, "%s", nm);
            if (a) strncat(argbuf, a, sizeof argbuf - strlen(argbuf) - 1);
        }
        const char *fr = json_string_value(json_object_get(ch, "finish_reason"));
        if (fr) snprintf(finish, sizeof finish, "%s", fr);
        json_decref(ev);
    }
    EXPECT(!strcmp(name, "get_weather") && !strcmp(argbuf, want_args) && n_ids == 1 &&
               !strcmp(finish, "tool_calls") && !strcmp(reasoning, "Let me check."),
           "streamed tool call: name '%s' args '%s' (want '%s') ids %d finish '%s' reasoning '%s'",
           name, argbuf, want_args, n_ids, finish, reasoning);
    free(want_args);
    resp_free(&r);
}


/* Multi-byte characters split across byte-level tokens: every event must carry whole UTF-8
 * characters (jansson refuses to parse an event holding a broken sequence) and the events
 * must add up to the text exactly. */
static void test_utf8_stream(void) {
    const char *text = "Ünïcödé 😀🎉 ✓ 漢字かな 👩‍👩‍👧 done";
    json_t *rq = json_pack("{s:[{s:s,s:s}],s:s,s:b,s:{s:b}}", "messages", "role", "user",
                           "content", "hi", "strata_forced_output", text, "stream", 1,
                           "chat_template_kwargs", "enable_thinking", 0);
    char *b = json_dumps(rq, JSON_COMPACT);
    json_decref(rq);
    struct resp r;
    http("POST", "/v1/chat/completions", NULL, b, 1, &r);
    char fin[32];
    int ok;
    char *got = sse_text(&r, 1, fin, sizeof fin, &ok, NULL, NULL);
    EXPECT(ok && !strcmp(got, text) && !strcmp(fin, "stop"),
           "UTF-8 stream: ok %d, got '%s' (%s)", ok, got, fin);
    int32_t n_tok = 0;
    struct resp t;
    char tb[512];
    snprintf(tb, sizeof tb, "{\"content\":\"%s\"}", text);
    http("POST", "/tokenize", NULL, tb, 1, &t);
    json_t *tj = body_json(&t);
    n_tok = (int32_t)json_array_size(json_object_get(tj, "tokens"));
    json_decref(tj);
    resp_free(&t);
    EXPECT(n_tok > r.n_events - 3, "some characters span tokens (%d tokens, %d events)", n_tok,
           r.n_events);
    free(got);
    free(b);
    resp_free(&r);
}

/* issue 24 item 5: a NUL byte the model writes is text in both forms (the non-streaming answer
 * was cut at the NUL while the stream carried \u0000 on). Id 188 is byte 0x00 ("\u0100" in
 * the byte-level alphabet); +100 makes greedy decoding write it. */
static void test_nul_output(void) {
    static const char want[] = "\0\0\0";
    for (int stream = 0; stream < 2; stream++) {
        char body[512];
        snprintf(body, sizeof body,
                 "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"stream\":%s,"
                 "\"max_tokens\":3,\"temperature\":0,\"logit_bias\":{\"188\":100},"
                 "\"chat_template_kwargs\":{\"enable_thinking\":false}}", stream ? "true" : "false");
        struct resp r;
        http("POST", "/v1/chat/completions", NULL, body, 1, &r);
        struct strbuf got = {0};
        strbuf_add(&got, "", 0);
        if (!stream) {
            json_t *j = body_json(&r);
            json_t *c = json_object_get(json_object_get(json_array_get(json_object_get(j, "choices"), 0),
                                                        "message"), "content");
            if (json_is_string(c)) strbuf_add(&got, json_string_value(c), json_string_length(c));
            json_decref(j);
        } else {
            for (int i = 0; i < r.n_events; i++) {
                json_t *j = strncmp(r.events[i], "data: {", 7) ? NULL
                                                                 : json_loads(r.events[i] + 6, JSON_ALLOW_NUL, NULL);
                json_t *c = json_object_get(json_object_get(json_array_get(json_object_get(j, "choices"), 0),
                                                            "delta"), "content");
                if (json_is_string(c)) strbuf_add(&got, json_string_value(c), json_string_length(c));
                json_decref(j);
            }
        }
        EXPECT(r.status == 200 && got.len == sizeof want - 1 && !memcmp(got.s, want, got.len),
               "NUL in the output (%s): %zu bytes, want %zu: %s", stream ? "stream" : "non-stream",
               got.len, sizeof want - 1, r.body);
        free(got.s);
        resp_free(&r);
    }
}

static void test_bad_input(void) {
    expect_error("unknown route", "GET", "/v1/nope", NULL, NULL, 1, 404, "no such route", NULL);
    expect_error("wrong method", "GET", "/v1/chat/completions", NULL, NULL, 1, 405, "method", NULL);
    expect_error("wrong method 2", "POST", "/health", NULL, "{}", 1, 405, "method", NULL);
    expect_error("no key", "POST", "/v1/chat/completions", NULL, CHAT_SMALL, 0, 401, "API key", NULL);
    expect_error("wrong key", "POST", "/v1/chat/completions",
                 "Authorization: Bearer nope\r\n", CHAT_SMALL, 0, 401, "API key", NULL);
    expect_error("malformed JSON", "POST", "/v1/chat/completions", NULL,
                 "{\"messages\": [\n  {\"role\": \"user\", }]}", 1, 400, "line 2, column", NULL);
    expect_error("non-UTF-8 JSON", "POST", "/v1/chat/completions", NULL,
                 "{\"messages\":[{\"role\":\"user\",\"content\":\"\xff\xfe\"}]}", 1, 400,
                 "line 1", NULL);
    expect_error("empty body", "POST", "/v1/chat/completions", NULL, "", 1, 400, "empty", NULL);
    expect_error("not an object", "POST", "/v1/chat/completions", NULL, "[1,2]", 1, 400,
                 "JSON object", NULL);
    expect_error("missing messages", "POST", "/v1/chat/completions", NULL, "{\"model\":\"x\"}", 1,
                 400, "required", "messages");
    expect_error("messages not array", "POST", "/v1/chat/completions", NULL,
                 "{\"messages\":\"hi\"}", 1, 400, "array", "messages");
    expect_error("bad role", "POST", "/v1/chat/completions", NULL,
                 "{\"messages\":[{\"role\":\"wizard\",\"content\":\"hi\"}]}", 1, 400, "wizard",
                 "messages");
    expect_error("image part", "POST", "/v1/chat/completions", NULL,
                 "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\","
                 "\"image_url\":{\"url\":\"http://x/y.png\"}}]}]}", 1, 400, "text model", "messages");
    expect_error("template refusal", "POST", "/v1/chat/completions", NULL,
                 "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"system\","
                 "\"content\":\"b\"}]}", 1, 400, "System message", "messages");
    const struct {
        const char *field, *value;
    } bads[] = {
        {"temperature", "\"hot\""}, {"temperature", "-1"},     {"temperature", "3"},
        {"top_p", "0"},             {"top_p", "1.5"},          {"top_k", "1.5"},
        {"min_p", "2"},             {"presence_penalty", "3"}, {"frequency_penalty", "-9"},
        {"repetition_penalty", "0"}, {"max_tokens", "0"},      {"max_tokens", "\"10\""},
        {"max_completion_tokens", "-5"}, {"seed", "\"abc\""},  {"n", "17"},
        {"stop", "5"},              {"stop", "[\"\"]"},        {"stream", "\"yes\""},
        {"stream_options", "3"},    {"tools", "{}"},           {"tool_choice", "\"required\""},
        {"top_logprobs", "3"},   {"logprobs", "2"},       {"response_format", "{\"type\":\"xml\"}"},
        {"response_format", "{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"x\",\"schema\":{\"type\":\"string\",\"format\":\"date\"}}}"},
        {"grammar", "\"root ::= (\""}, {"grammar", "5"}, {"tool_choice", "{\"type\":\"function\",\"function\":{\"name\":\"f\"}}"},
        {"chat_template_kwargs", "[]"}, {"model", "7"}, {"logit_bias", "{\"abc\":1}"},
        {"logit_bias", "{\"5\":500}"},
    };
    for (size_t i = 0; i < sizeof bads / sizeof bads[0]; i++) {
        char body[512], what[128];
        snprintf(body, sizeof body,
                 "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"%s\":%s}", bads[i].field,
                 bads[i].value);
        snprintf(what, sizeof what, "%s=%s", bads[i].field, bads[i].value);
        expect_error(what, "POST", "/v1/chat/completions", NULL, body, 1, 400, bads[i].field,
                     bads[i].field);
    }
    expect_error("completions without prompt", "POST", "/v1/completions", NULL, "{}", 1, 400,
                 "required", "prompt");
    expect_error("completions echo", "POST", "/v1/completions", NULL,
                 "{\"prompt\":\"a\",\"echo\":true}", 1, 400, "echo", "echo");
    expect_error("completions best_of", "POST", "/v1/completions", NULL,
                 "{\"prompt\":\"a\",\"best_of\":3}", 1, 400, "best_of", "best_of");
    expect_error("prompt ids out of range", "POST", "/v1/completions", NULL,
                 "{\"prompt\":[1,2,99999999]}", 1, 400, "token id", "prompt");
    expect_error("tokenize without content", "POST", "/tokenize", NULL, "{}", 1, 400, "content",
                 "content");

    /* issue 24 item 3: messages quoting client bytes cut inside a UTF-8 character gave 500 */
    expect_error("escape before a 2-byte character", "POST", "/v1/chat/completions", NULL,
                 "{\"a\":\"\\\xc3\xa9\"}", 1, 400, "invalid JSON", NULL);
    {
        struct strbuf role = {0};
        for (int i = 0; i < 300; i++) strbuf_adds(&role, "\xc3\xa9");
        char *body = xmalloc(role.len + 128);
        snprintf(body, role.len + 128, "{\"messages\":[{\"role\":\"%s\",\"content\":\"hi\"}]}", role.s);
        expect_error("300 x \"\xc3\xa9\" role", "POST", "/v1/chat/completions", NULL, body, 1, 400,
                     "\xc3\xa9\xc3\xa9...' is not one of", "messages");
        snprintf(body, role.len + 128, "{\"prompt\":\"a\",\"logit_bias\":{\"%s\":1}}", role.s);
        expect_error("300 x \"\xc3\xa9\" logit_bias key", "POST", "/v1/completions", NULL, body, 1, 400,
                     "logit_bias key", "logit_bias");
        free(body);
        free(role.s);
    }
    expect_error("GET /%ff", "GET", "/%ff", NULL, NULL, 1, 404, "GET /\\xff: no such route", NULL);
    expect_error("GET /v1/models/%ff", "GET", "/v1/models/%ff", NULL, NULL, 1, 404,
                 "the model '\\xff' does not exist", NULL);
    expect_error("GET /%c3 (a cut character)", "GET", "/v1/x%c3", NULL, NULL, 1, 404,
                 "/v1/x\\xc3: no such route", NULL);

    /* 413: announced by Content-Length (answered before the body), and sent chunked */
    size_t big = (1u << 20) + 10;
    char *huge = malloc(big + 1);
    memset(huge, ' ', big);
    huge[0] = '{';
    huge[big - 1] = '}';
    huge[big] = 0;
    expect_error("body too large", "POST", "/v1/chat/completions", NULL, huge, 1, 413, "limit",
                 NULL);
    {
        struct resp r;
        memset(&r, 0, sizeof r);
        int fd = connect_port(g_port);
        struct timespec t0;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        send_request(fd, "POST", "/v1/chat/completions",
                     "Transfer-Encoding: chunked\r\nContent-Type: application/json\r\n", "x", 0, 1);
        char hdr[32];
        for (size_t off = 0; off < big; off += 65536) {
            size_t n = big - off < 65536 ? big - off : 65536;
            snprintf(hdr, sizeof hdr, "%zx\r\n", n);
            if (send_all(fd, hdr, strlen(hdr)) || send_all(fd, huge + off, n) ||
                send_all(fd, "\r\n", 2))
                break;
        }
        send_all(fd, "0\r\n\r\n", 5);
        read_response(fd, &r, &t0, 0);
        close(fd);
        EXPECT(r.status == 413, "chunked body too large: %d", r.status);
        resp_free(&r);
    }
    free(huge);

    /* prompt longer than the context (512) */
    char *longp = malloc(20000);
    strcpy(longp, "{\"messages\":[{\"role\":\"user\",\"content\":\"");
    for (int i = 0; i < 1200; i++) strcat(longp, "word ");
    strcat(longp, "\"}]}");
    expect_error("prompt too long", "POST", "/v1/chat/completions", NULL, longp, 1, 400,
                 "context", "messages");
    free(longp);

    /* the server is still fine */
    struct resp r;
    http("GET", "/health", NULL, NULL, 0, &r);
    EXPECT(r.status == 200, "alive after bad input");
    resp_free(&r);
}

static void test_generation(void) {
    struct resp r, rs;
    char f1[32], f2[32];
    int ok;
    /* chat, non-stream vs stream (greedy: identical) */
    http("POST", "/v1/chat/completions", NULL, CHAT_SMALL, 1, &r);
    json_t *j = body_json(&r);
    json_t *u = json_object_get(j, "usage"), *tm = json_object_get(j, "timings");
    EXPECT(r.status == 200 && json_integer_value(json_object_get(u, "completion_tokens")) == 24 &&
               json_integer_value(json_object_get(u, "total_tokens")) ==
                   24 + json_integer_value(json_object_get(u, "prompt_tokens")),
           "chat usage: %s", r.body);
    EXPECT(tm && json_object_get(tm, "prompt_n") && json_object_get(tm, "prompt_ms") &&
               json_object_get(tm, "prompt_per_second") && json_object_get(tm, "predicted_n") &&
               json_object_get(tm, "predicted_ms") && json_object_get(tm, "predicted_per_second"),
           "timings with llama-server's names");
    EXPECT(!strcmp(json_string_value(json_object_get(j, "object")), "chat.completion"), "object");
    json_decref(j);
    char *plain = json_text_of(&r, 1, f1, sizeof f1);
    EXPECT(!strcmp(f1, "length"), "max_tokens -> finish length (%s)", f1);

    char body[1024];
    snprintf(body, sizeof body, "%.*s,\"stream\":true,\"stream_options\":{\"include_usage\":true}}",
             (int)strlen(CHAT_SMALL) - 1, CHAT_SMALL);
    http("POST", "/v1/chat/completions", NULL, body, 1, &rs);
    json_t *usage = NULL, *timings = NULL;
    char *streamed = sse_text(&rs, 1, f2, sizeof f2, &ok, &usage, &timings);
    EXPECT(rs.status == 200 && strcasestr(rs.head, "text/event-stream"), "stream content type");
    EXPECT(ok, "stream framing (role first, data: JSON events, [DONE] last)");
    EXPECT(!strcmp(plain, streamed), "stream == non-stream:\n '%s'\n '%s'", streamed, plain);
    EXPECT(!strcmp(f2, "length"), "stream finish %s", f2);
    EXPECT(usage && json_integer_value(json_object_get(usage, "completion_tokens")) == 24,
           "include_usage chunk");
    EXPECT(timings != NULL, "timings in the final chunk");
    /* one event per token: 24 tokens -> at most 24 content events + final + usage + [DONE] */
    EXPECT(rs.n_events >= 4 && rs.n_events <= 24 + 3, "events: %d for 24 tokens", rs.n_events);
    json_decref(usage);
    json_decref(timings);
    free(streamed);
    resp_free(&rs);
    resp_free(&r);

    /* completions + a stop string cut across the text */
    const char *cbody = "{\"prompt\":\"The river flows\",\"max_tokens\":30,\"temperature\":0}";
    http("POST", "/v1/completions", NULL, cbody, 1, &r);
    char *full = json_text_of(&r, 0, f1, sizeof f1);
    EXPECT(r.status == 200 && strlen(full) > 8, "completion text: %s", r.body);
    resp_free(&r);
    if (strlen(full) > 8) {
        /* a 3-byte stop starting at a character boundary in the middle */
        size_t a = strlen(full) / 2;
        while (a > 0 && (full[a] & 0xc0) == 0x80) a--;
        size_t b = a + 3;
        while (full[b] && (full[b] & 0xc0) == 0x80) b++;
        char stop[64];
        snprintf(stop, sizeof stop, "%.*s", (int)(b - a), full + a);
        size_t want = (size_t)(strstr(full, stop) - full);
        json_t *rq = json_loads(cbody, 0, NULL);
        json_object_set_new(rq, "stop", json_pack("[s,s]", "NEVER-SEEN-1", stop));
        json_object_set_new(rq, "stream", json_true());
        char *sb = json_dumps(rq, JSON_COMPACT);
        http("POST", "/v1/completions", NULL, sb, 1, &rs);
        char *st = sse_text(&rs, 0, f2, sizeof f2, &ok, NULL, NULL);
        EXPECT(ok && strlen(st) == want && !strncmp(st, full, want) && !strcmp(f2, "stop"),
               "stop string '%s': got '%s' (%s), want the first %zu bytes of '%s'", stop, st, f2,
               want, full);
        for (int i = 0; i < rs.n_events; i++)
            EXPECT(!strstr(rs.events[i], stop), "a stream event carries the stop string");
        free(st);
        free(sb);
        resp_free(&rs);
        json_object_del(rq, "stream");
        sb = json_dumps(rq, JSON_COMPACT);
        http("POST", "/v1/completions", NULL, sb, 1, &r);
        char *nt = json_text_of(&r, 0, f1, sizeof f1);
        EXPECT(strlen(nt) == want && !strcmp(f1, "stop"), "non-stream stop: '%s' %s", nt, f1);
        free(nt);
        free(sb);
        resp_free(&r);
        json_decref(rq);
    }
    free(full);


    /* prompt + max_tokens beyond the context (512): generation stops at the context's end */
    {
        char *lp = malloc(8000);
        strcpy(lp, "{\"prompt\":\"");
        for (int i = 0; i < 480; i++) strcat(lp, " a");
        strcat(lp, "\",\"max_tokens\":400,\"temperature\":0,\"ignore_eos\":true}");
        http("POST", "/v1/completions", NULL, lp, 1, &r);
        json_t *jl = body_json(&r);
        json_t *ul = json_object_get(jl, "usage");
        long long np = json_integer_value(json_object_get(ul, "prompt_tokens"));
        long long nc = json_integer_value(json_object_get(ul, "completion_tokens"));
        const char *fr = json_string_value(json_object_get(json_array_get(json_object_get(jl, "choices"), 0), "finish_reason"));
        EXPECT(r.status == 200 && np < 512 && nc == 512 - np + 1 && fr && !strcmp(fr, "length"),
               "context full: %d, prompt %lld + %lld generated (want %lld), finish %s", r.status, np,
               nc, 512 - np + 1, fr ? fr : "?");
        json_decref(jl);
        resp_free(&r);
        free(lp);
    }


    /* logit_bias +100 on "." (id 13 in the Qwen vocabulary) under greedy: only dots */
    http("POST", "/v1/completions", NULL,
         "{\"prompt\":\"Hi\",\"max_tokens\":5,\"temperature\":0,\"logit_bias\":{\"13\":100}}", 1, &r);
    {
        char *dots = json_text_of(&r, 0, f1, sizeof f1);
        EXPECT(!strcmp(dots, "....."), "logit_bias: '%s'", dots);
        free(dots);
    }
    resp_free(&r);

    /* seeds */
    const char *sbody = "{\"prompt\":\"Hello\",\"max_tokens\":16,\"temperature\":1.0,\"seed\":11}";
    http("POST", "/v1/completions", NULL, sbody, 1, &r);
    http("POST", "/v1/completions", NULL, sbody, 1, &rs);
    char *s1 = json_text_of(&r, 0, f1, sizeof f1), *s2 = json_text_of(&rs, 0, f2, sizeof f2);
    EXPECT(!strcmp(s1, s2) && strlen(s1) > 0, "same seed, same text");
    free(s1);
    free(s2);
    resp_free(&r);
    resp_free(&rs);
    free(plain);
}

/* Every SSE event's arrival, measured from the request's send. */
static void test_timing(void) {
    const char *b = "{\"messages\":[{\"role\":\"user\",\"content\":\"Write a long story.\"}],"
                    "\"max_tokens\":200,\"temperature\":0,\"ignore_eos\":true,\"stream\":true,"
                    "\"chat_template_kwargs\":{\"enable_thinking\":false}}";
    struct resp r;
    http("POST", "/v1/chat/completions", NULL, b, 1, &r);
    char fin[32];
    int ok;
    json_t *timings = NULL;
    char *t = sse_text(&r, 1, fin, sizeof fin, &ok, NULL, &timings);
    double prompt_ms = json_number_value(json_object_get(timings, "prompt_ms"));
    double pred_ms = json_number_value(json_object_get(timings, "predicted_ms"));
    int n = r.n_events;
    EXPECT(ok && n > 20, "timing stream: %d events", n);
    if (n > 20) {
        double first = r.ev_ms[0], last = r.ev_ms[n - 3]; /* last content event */
        int distinct = 1;
        for (int i = 1; i < n - 2; i++) distinct += r.ev_batch[i] != r.ev_batch[i - 1];
        printf("SSE timing: first event %.2f ms after send (engine prompt_ms %.2f); %d events over "
               "%.2f ms (engine predicted_ms %.2f); %d of %d content events arrived in their own "
               "recv()\n",
               first, prompt_ms, n, last - first, pred_ms, distinct, n - 2);
        /* Buffering would hold the first event back by many tokens (the 8 KB buffer of the
         * engine this project follows held 55) or by a 200 ms cork timer. 50 ms of slack covers
         * request parsing and a loaded 2-core CI machine. */
        EXPECT(first < prompt_ms + 50, "first event %.2f ms after send, prefill %.2f ms", first,
               prompt_ms);
        EXPECT(last - first > 0.5 * pred_ms - 5,
               "events bunched: spread %.2f ms over a %.2f ms decode", last - first, pred_ms);
    }
    json_decref(timings);
    free(t);
    resp_free(&r);
}

static void test_disconnect(void) {
    double before = metric("strata_generations_cancelled_total");
    EXPECT(stream_and_drop(2) >= 2, "got the first events before disconnecting");
    /* the engine is free again: a short request completes quickly */
    struct timespec t0;
    struct resp r;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    http("POST", "/v1/chat/completions", NULL, CHAT_SMALL, 1, &r);
    double ms = ms_since(&t0);
    EXPECT(r.status == 200 && ms < 5000, "request after a disconnect: %d in %.0f ms", r.status, ms);
    resp_free(&r);
    EXPECT(metric("strata_generations_cancelled_total") >= before + 1,
           "the disconnected generation was cancelled");
}

static void test_load(void) {
    /* references: each request alone, non-streaming */
    for (int c = 0; c < N_CLIENTS; c++)
        for (int k = 0; k < N_PER_CLIENT; k++) {
            char *b = load_body(c, k, 0);
            struct resp r;
            http("POST", "/v1/chat/completions", NULL, b, 1, &r);
            char fin[32];
            g_ref[c][k] = json_text_of(&r, 1, fin, sizeof fin);
            free(b);
            resp_free(&r);
        }
    const double cancelled0 = metric("strata_generations_cancelled_total");
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    pthread_t th[N_CLIENTS], dropper, watcher;
    atomic_store(&g_load_done, 0);
    pthread_create(&watcher, NULL, running_watcher, NULL);
    for (int c = 0; c < N_CLIENTS; c++) pthread_create(&th[c], NULL, load_client, (void *)(intptr_t)c);
    pthread_create(&dropper, NULL, dropper_client, NULL);
    for (int c = 0; c < N_CLIENTS; c++) pthread_join(th[c], NULL);
    pthread_join(dropper, NULL);
    double ms = ms_since(&t0);
    atomic_store(&g_load_done, 1);
    pthread_join(watcher, NULL);
    EXPECT(g_max_running >= 2, "requests generated at once during the load: at most %d", g_max_running);
    EXPECT(g_dropped == 4, "the dropping client got its first events %d of 4 times", g_dropped);
    for (int i = 0; i < 100 && metric("strata_generations_cancelled_total") < cancelled0 + 4; i++) usleep(20000);
    EXPECT(metric("strata_generations_cancelled_total") >= cancelled0 + 4,
           "the 4 streams whose client went away mid-load were cancelled");
    int bad = 0;
    for (int c = 0; c < N_CLIENTS; c++) bad += g_load_bad[c];
    printf("load: %d clients x %d streaming requests in %.0f ms, %d mismatched, up to %d at once\n",
           N_CLIENTS, N_PER_CLIENT, ms, bad, g_max_running);
    EXPECT(bad == 0, "%d of %d concurrent responses differ from the same request alone", bad,
           N_CLIENTS * N_PER_CLIENT);
#ifdef __SANITIZE_ADDRESS__
    const double bound_ms = 900000; /* ASan + UBSan slow the CPU forward pass ~40x */
#else
    const double bound_ms = 120000;
#endif
    EXPECT(ms < bound_ms, "load test took %.0f ms (bound %.0f s)", ms, bound_ms / 1e3);
    for (int c = 0; c < N_CLIENTS; c++)
        for (int k = 0; k < N_PER_CLIENT; k++) free(g_ref[c][k]);
    EXPECT(metric("strata_queue_depth") == 0, "queue empty after the load");
}

static void test_queue_full(const char *dir) {
    /* one request at a time: the second waits in the queue, the third finds it full */
    struct server_options o = {.model_dir = dir, .port = 0, .queue_max = 1, .parallel = 1, .quiet = 1};
    o.model.backend = BACKEND_CPU;
    o.model.ctx = 4096;
    o.model.n_threads = 1;
    o.model.quiet = 1;
    struct error err;
    struct server *s = server_start(&o, &err);
    EXPECT(s != NULL, "second server: %s", s ? "" : err.msg);
    if (!s) return;
    int saved = g_port;
    g_port = server_port(s);
    const char *b = "{\"messages\":[{\"role\":\"user\",\"content\":\"Long.\"}],"
                    "\"max_tokens\":3000,\"ignore_eos\":true,\"stream\":true}";
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int fa = connect_port(g_port);
    send_request(fa, "POST", "/v1/chat/completions", NULL, b, strlen(b), 0);
    struct resp ra;
    memset(&ra, 0, sizeof ra);
    read_response(fa, &ra, &t0, 1); /* A is running */
    int fb = connect_port(g_port);
    send_request(fb, "POST", "/v1/chat/completions", NULL, b, strlen(b), 0);
    for (int i = 0; i < 100 && metric("strata_queue_depth") < 1; i++) usleep(50000); /* B queued */
    EXPECT(metric("strata_queue_depth") == 1, "the second request is queued");
    struct resp rc;
    http("POST", "/v1/chat/completions", NULL,
         "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"strata_forced_output\":\"hi\"}",
         0, &rc);
    EXPECT(rc.status == 400 && strstr(rc.body, "--test-forced-output"),
           "forced output refused without the flag: %d", rc.status);
    resp_free(&rc);
    http("POST", "/v1/chat/completions", NULL, b, 0, &rc);
    EXPECT(rc.status == 503 && strcasestr(rc.head, "Retry-After:"), "full queue: %d\n%s",
           rc.status, rc.head);
    resp_free(&rc);
    resp_free(&ra);
    close(fa);
    close(fb);
    g_port = saved;
    server_stop(s); /* with B possibly still queued and A cancelling: must not hang or leak */
}

/* `strata serve` under SIGTERM while a stream is open: exits 0 within 5 s. */
static void test_sigterm(const char *dir) {
    const char *build = getenv("BUILD") ? getenv("BUILD") : "build";
    char exe[512];
    snprintf(exe, sizeof exe, "%s/strata", build);
    if (access(exe, X_OK) != 0) {
        printf("(no %s: SIGTERM test not run)\n", exe);
        return;
    }
    /* below the ephemeral range (32768 on): an outgoing connection elsewhere may hold a port
     * there (CI once found 37749 in use) */
    int port = 22000 + getpid() % 8000;
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        freopen("/dev/null", "w", stdout);
        execl(exe, exe, "serve", "--model", dir, "--port", ps, "--backend", "cpu", "--threads",
              "1", "--quiet", (char *)NULL);
        _exit(127);
    }
    int saved = g_port;
    g_port = port;
    struct resp r;
    int up = 0;
    for (int i = 0; i < 100 && !up; i++) {
        usleep(100000);
        up = http("GET", "/health", NULL, NULL, 0, &r) == 0 && r.status == 200;
        resp_free(&r);
    }
    EXPECT(up, "strata serve came up on port %d", port);
    const char *b = "{\"messages\":[{\"role\":\"user\",\"content\":\"Long.\"}],"
                    "\"max_tokens\":100000,\"ignore_eos\":true,\"stream\":true}";
    int fd = stream_open(port, b, 0, 2, &r);
    kill(pid, SIGTERM);
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    /* the stream ends with a word (issue 24): an error event, or a final chunk and [DONE] */
    {
        struct strbuf raw = {0};
        char buf[4096];
        ssize_t got;
        while ((got = recv(fd, buf, sizeof buf, 0)) > 0) strbuf_add(&raw, buf, (size_t)got);
        const char *last = NULL;
        for (const char *p = raw.s; p && (p = strstr(p, "data: ")); p++) last = p;
        EXPECT(last && (!strncmp(last, "data: {\"error\":", 15) || !strncmp(last, "data: [DONE]", 12)),
               "the stream cut by SIGTERM ends with '%.80s' (want an error event or [DONE])",
               last ? last : "(no event)");
        if (last && !strncmp(last, "data: {\"error\":", 15))
            EXPECT(strstr(last, "shutting down"), "the error event says why: %.200s", last);
        free(raw.s);
    }
    int status = -1;
    for (int i = 0; i < 50; i++) {
        if (waitpid(pid, &status, WNOHANG) == pid) break;
        usleep(100000);
        status = -1;
    }
    if (status == -1) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        EXPECT(0, "strata serve did not exit within 5 s of SIGTERM");
    } else {
        EXPECT(WIFEXITED(status) && WEXITSTATUS(status) == 0, "strata serve exit status %d",
               status);
        printf("SIGTERM mid-stream: exited in %.0f ms\n", ms_since(&t0));
    }
    close(fd);
    resp_free(&r);
    g_port = saved;
}

int main(void) {
    signal(SIGPIPE, SIG_IGN);
    const char *dir = getenv("STRATA_DEMO_MODEL") ? getenv("STRATA_DEMO_MODEL") : "demo";
    struct server_options o = {.model_dir = dir, .port = 0, .api_key = g_key, .quiet = 1,
                               .max_body_bytes = 1 << 20, .allow_forced_output = 1};
    o.model.backend = BACKEND_CPU;
    o.model.ctx = 512;
    o.model.n_threads = 1;
    o.model.quiet = 1;
    struct error err;
    struct server *s = server_start(&o, &err);
    EXPECT(s != NULL, "server_start on %s: %s", dir, s ? "" : err.msg);
    if (!s) return TEST_DONE();
    g_port = server_port(s);
    test_escape();
    test_basic_endpoints();
    test_bad_input();
    test_generation();
    test_tool_calls();
    test_utf8_stream();
    test_nul_output();
    test_timing();
    test_disconnect();
    test_fuzz();
    test_load();
    double reqs = metric("strata_requests_total");
    EXPECT(reqs > 100, "metrics count requests (%g)", reqs);
    /* the load's concurrent streams ran batched rounds; their wait is a part of their time */
    const double rounds = metric("strata_batched_rounds_total"), rrows = metric("strata_batched_round_rows_total");
    const double rsec = metric("strata_batched_round_seconds_total"),
                 rwait = metric("strata_batched_round_wait_seconds_total");
    EXPECT(rounds > 0 && rrows >= rounds && rsec > 0 && rwait >= 0 && rwait <= rsec,
           "batched round metrics: %g rounds, %g rows, %g s, %g s waiting", rounds, rrows, rsec, rwait);
    server_stop(s);
    test_queue_full(dir);
    test_sigterm(dir);
    return TEST_DONE();
}
