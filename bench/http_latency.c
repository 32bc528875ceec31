/* http_latency.c - where streaming time goes (issue 5 item 8). One process, one model:
 *   A  engine alone: engine_generate on the prompt ids, a no-op emit callback
 *   B  + detokenizer, chat output parser and SSE/JSON framing (server_run_inprocess, frames
 *      built and dropped)
 *   C  + socket write: every frame written to a loopback TCP socket (TCP_NODELAY) whose other
 *      end a thread reads
 *   H  over HTTP: a raw-socket client against the real server, TTFT from socket open to the
 *      first SSE event, decode tok/s over the streamed tokens (event arrival times)
 * Same request everywhere: a chat prompt of --prompt-tokens tokens (default 54), greedy,
 * ignore_eos, --n tokens (default 350), thinking off. Each variant runs --reps times after one
 * warm-up; the median is printed.
 *
 *   make bench   (or: cc -O2 -std=c11 -D_GNU_SOURCE -Isrc bench/http_latency.c build/libstrata.a $(LDLIBS) \
 *      -o build/http_latency)
 *   build/http_latency --model DIR [--backend cuda|cpu] [--n 350] [--prompt-tokens 54]
 *                      [--tokenizer-dir demo]   (random checkpoints carry no tokenizer)
 * Decode tok/s counts every generated token (predicted_n): tokens of a random model past the
 * tokenizer's vocabulary produce no text and no event, but cost the same. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "text/chat.h"
#include "engine/engine.h"
#include "api/server.h"
#include "text/tokenizer.h"

#define MAX_REPS 16

struct sample {
    double ttft_ms;   /* request start -> first token (A, B, C) or first SSE event (H) */
    double decode_tps; /* tokens after the first / time after the first */
};

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* ---- A: engine only -------------------------------------------------------------------- */

struct count {
    int n;
    double t_first, t_last;
};

static int count_emit(void *user, const struct engine_event *ev) {
    struct count *c = user;
    if (ev->id < 0) return 0;
    double t = now_ms();
    if (c->n == 0) c->t_first = t;
    c->t_last = t;
    c->n++;
    return 0;
}

/* ---- B / C: in-process server path ------------------------------------------------------- */

struct frames {
    int fd; /* -1: drop */
    int n;
    double t0, t_first, t_last;
};

static int frame_sink(void *user, const char *frame, size_t n) {
    struct frames *f = user;
    if (f->fd >= 0) {
        while (n) {
            ssize_t w = send(f->fd, frame, n, MSG_NOSIGNAL);
            if (w <= 0) return 1;
            frame += w;
            n -= (size_t)w;
        }
    }
    double t = now_ms();
    if (f->n == 0) f->t_first = t;
    f->t_last = t;
    f->n++;
    return 0;
}

static void *drain(void *arg) {
    int fd = (int)(intptr_t)arg;
    char buf[65536];
    while (recv(fd, buf, sizeof buf, 0) > 0) {
    }
    return NULL;
}

static int loopback_pair(int *wfd, int *rfd) {
    int l = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t al = sizeof a;
    if (bind(l, (struct sockaddr *)&a, sizeof a) || listen(l, 1) ||
        getsockname(l, (struct sockaddr *)&a, &al))
        return -1;
    *wfd = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(*wfd, (struct sockaddr *)&a, sizeof a)) return -1;
    *rfd = accept(l, NULL, NULL);
    close(l);
    int one = 1;
    setsockopt(*wfd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return 0;
}

/* ---- H: HTTP client --------------------------------------------------------------------- */

static int http_stream(int port, const char *body, struct sample *out, double *engine_prompt_ms) {
    double t0 = now_ms();
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof a)) return -1;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    char head[512];
    int hn = snprintf(head, sizeof head,
                      "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                      "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n",
                      strlen(body));
    send(fd, head, (size_t)hn, MSG_NOSIGNAL);
    send(fd, body, strlen(body), MSG_NOSIGNAL);
    size_t cap = 1 << 20, n = 0, scanned = 0;
    char *raw = malloc(cap);
    int events = 0;
    double t_first = 0, t_last = 0;
    for (;;) {
        if (n + 65536 > cap) raw = realloc(raw, cap *= 2);
        ssize_t got = recv(fd, raw + n, cap - n - 1, 0);
        if (got <= 0) break;
        n += (size_t)got;
        raw[n] = 0;
        double t = now_ms();
        char *p;
        /* the first event leaves with the first token; the final chunk (finish_reason) right
         * after the last one */
        while ((p = strstr(raw + scanned, "\n\n"))) {
            char *ev = strstr(raw + scanned, "data: {");
            if (ev && ev < p) {
                if (events == 0) t_first = t;
                char *fr = strstr(ev, "\"finish_reason\":\"");
                if (fr && fr < p) t_last = t;
                events++;
            }
            scanned = (size_t)(p - raw) + 2;
        }
    }
    close(fd);
    char *tm = strstr(raw, "\"prompt_ms\":");
    *engine_prompt_ms = tm ? atof(tm + 12) : 0;
    char *pn = strstr(raw, "\"predicted_n\":");
    int n_tok = pn ? atoi(pn + 14) : 0;
    free(raw);
    out->ttft_ms = t_first - t0;
    out->decode_tps = n_tok > 1 && t_last > t_first ? (n_tok - 1) / ((t_last - t_first) / 1e3) : 0;
    return events;
}

/* One value from GET /metrics. */
static double metric(int port, const char *name) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof a)) return 0;
    const char *rq = "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    send(fd, rq, strlen(rq), MSG_NOSIGNAL);
    static char buf[1 << 16];
    size_t n = 0;
    ssize_t got;
    while (n < sizeof buf - 1 && (got = recv(fd, buf + n, sizeof buf - 1 - n, 0)) > 0) n += (size_t)got;
    buf[n] = 0;
    close(fd);
    char key[128];
    snprintf(key, sizeof key, "\n%s ", name);
    char *p = strstr(buf, key);
    return p ? atof(p + strlen(key)) : 0;
}

int main(int argc, char **argv) {
    const char *dir = "demo";
    const char *tdir = NULL;
    int n_gen = 350, want_prompt = 54, reps = 5;
    struct server_options o = {.port = 0, .quiet = 1};
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(argv[i], "--model") && v) dir = v, i++;
        else if (!strcmp(argv[i], "--n") && v) n_gen = atoi(v), i++;
        else if (!strcmp(argv[i], "--tokenizer-dir") && v) tdir = v, i++;
        else if (!strcmp(argv[i], "--prompt-tokens") && v) want_prompt = atoi(v), i++;
        else if (!strcmp(argv[i], "--reps") && v) reps = atoi(v), i++;
        else if (!strcmp(argv[i], "--threads") && v) o.model.n_threads = atoi(v), i++;
        else if (!strcmp(argv[i], "--backend") && v) {
            o.model.backend = !strcmp(v, "cpu") ? BACKEND_CPU : !strcmp(v, "cuda") ? BACKEND_CUDA
                                                                                 : BACKEND_AUTO;
            i++;
        } else {
            fprintf(stderr, "usage: http_latency --model DIR [--backend cpu|cuda] [--n 350] "
                            "[--prompt-tokens 54] [--reps 5] [--threads N]\n"
                            "       [--tokenizer-dir DIR]\n");
            return 2;
        }
    }
    if (reps > MAX_REPS) reps = MAX_REPS;
    signal(SIGPIPE, SIG_IGN);
    o.model_dir = dir;
    o.tokenizer_dir = tdir;
    o.model.quiet = 1;
    struct error err;
    struct server *s = server_start(&o, &err);
    if (!s) {
        fprintf(stderr, "http_latency: %s\n", err.msg);
        return 1;
    }
    struct tokenizer *tok = server_tokenizer(s);
    struct chat_template tmpl;
    if (chat_template_load(&tmpl, tdir ? tdir : dir, &err)) {
        fprintf(stderr, "http_latency: %s\n", err.msg);
        return 1;
    }

    /* a user message whose rendered prompt has want_prompt tokens */
    static const char *words[] = {"Please", "write", "a", "detailed", "story", "about", "the",
                                  "river", "that", "runs", "past", "an", "old", "mill", "and",
                                  "the", "people", "who", "live", "near", "it"};
    char content[4096] = "";
    char body[8192];
    int32_t *ids = NULL;
    int n_ids = 0;
    for (int w = 0; w < 400; w++) {
        if (w) strcat(content, " ");
        strcat(content, words[w % (sizeof words / sizeof *words)]);
        json_t *rq = json_pack("{s:[{s:s,s:s}],s:{s:b}}", "messages", "role", "user", "content",
                               content, "chat_template_kwargs", "enable_thinking", 0);
        char *prompt;
        CHECK(chat_render(&tmpl, rq, &prompt, &err) == 0);
        json_decref(rq);
        free(ids);
        CHECK(tokenizer_encode(tok, prompt, strlen(prompt), &ids, &n_ids, &err) == 0);
        free(prompt);
        if (n_ids >= want_prompt) break;
    }
    snprintf(body, sizeof body,
             "{\"messages\":[{\"role\":\"user\",\"content\":\"%s\"}],\"max_tokens\":%d,"
             "\"temperature\":0,\"ignore_eos\":true,\"stream\":true,"
             "\"chat_template_kwargs\":{\"enable_thinking\":false}}",
             content, n_gen);

    double a_ttft[MAX_REPS], a_tps[MAX_REPS], b_ttft[MAX_REPS], b_tps[MAX_REPS], c_ttft[MAX_REPS],
        c_tps[MAX_REPS], h_ttft[MAX_REPS], h_tps[MAX_REPS], h_eng[MAX_REPS], b_emit[MAX_REPS],
        b_emit_us[MAX_REPS], c_emit[MAX_REPS], c_emit_us[MAX_REPS], h_emit[MAX_REPS];
    struct engine *e = server_engine(s);
    for (int r = -1; r < reps; r++) { /* r = -1: warm-up */
        struct count c = {0};
        struct engine_request rq = {.prompt = ids, .n_prompt = n_ids, .max_tokens = n_gen,
                                    .ignore_eos = 1, .emit = count_emit, .user = &c};
        sampler_params_default(&rq.sampling);
        rq.sampling.temperature = 0;
        struct engine_result res;
        double t0 = now_ms();
        CHECK(engine_generate(e, &rq, &res, &err) == 0);
        if (r < 0) continue;
        a_ttft[r] = c.t_first - t0;
        a_tps[r] = (c.n - 1) / ((c.t_last - c.t_first) / 1e3);

        struct frames f = {.fd = -1};
        struct server_inprocess_stats st;
        CHECK(server_run_inprocess(s, body, strlen(body), frame_sink, &f, &st) == 200);
        b_ttft[r] = st.ttft_ms;
        b_tps[r] = (st.n_tokens - 1) / ((f.t_last - f.t_first) / 1e3);
        b_emit[r] = 100 * st.emit_ms / st.decode_ms;
        b_emit_us[r] = 1e3 * st.emit_ms / st.n_tokens;

        int wfd, rfd;
        CHECK(loopback_pair(&wfd, &rfd) == 0);
        pthread_t th;
        pthread_create(&th, NULL, drain, (void *)(intptr_t)rfd);
        struct frames fc = {.fd = wfd};
        CHECK(server_run_inprocess(s, body, strlen(body), frame_sink, &fc, &st) == 200);
        shutdown(wfd, SHUT_WR);
        pthread_join(th, NULL);
        close(wfd);
        close(rfd);
        c_ttft[r] = st.ttft_ms;
        c_tps[r] = (st.n_tokens - 1) / ((fc.t_last - fc.t_first) / 1e3);
        c_emit[r] = 100 * st.emit_ms / st.decode_ms;
        c_emit_us[r] = 1e3 * st.emit_ms / st.n_tokens;

        struct sample h;
        double em0 = metric(server_port(s), "strata_stream_emit_seconds_total"),
               dm0 = metric(server_port(s), "strata_decode_seconds_total");
        CHECK(http_stream(server_port(s), body, &h, &h_eng[r]) > 1);
        double em1 = metric(server_port(s), "strata_stream_emit_seconds_total"),
               dm1 = metric(server_port(s), "strata_decode_seconds_total");
        h_emit[r] = dm1 > dm0 ? 100 * (em1 - em0) / (dm1 - dm0) : 0;
        h_ttft[r] = h.ttft_ms;
        h_tps[r] = h.decode_tps;
    }
    double A = median(a_tps, reps), B = median(b_tps, reps), C = median(c_tps, reps),
           H = median(h_tps, reps);
    double At = median(a_ttft, reps), Bt = median(b_ttft, reps), Ct = median(c_ttft, reps),
           Ht = median(h_ttft, reps), He = median(h_eng, reps);
    printf("\nhttp_latency: model %s, backend %s, prompt %d tokens, %d generated, median of %d\n",
           dir, model_backend(server_model(s))->ops->name, n_ids, n_gen, reps);
    printf("| variant | TTFT ms | decode tok/s | decode time vs A | emit callback, share of decode "
           "|\n|---|---|---|---|---|\n");
    printf("| A engine only | %.2f | %.1f | - | - |\n", At, A);
    printf("| B + detok, parser, SSE framing | %.2f | %.1f | %+.2f%% | %.3f%% (%.1f us/token) |\n", Bt,
           B, 100 * (A / B - 1), median(b_emit, reps), median(b_emit_us, reps));
    printf("| C + socket write | %.2f | %.1f | %+.2f%% | %.3f%% (%.1f us/token) |\n", Ct, C,
           100 * (A / C - 1), median(c_emit, reps), median(c_emit_us, reps));
    printf("| H over HTTP (client clock) | %.2f | %.1f | %+.2f%% | %.3f%% (engine thread; the "
           "socket write runs on the connection thread) |\n",
           Ht, H, 100 * (A / H - 1), median(h_emit, reps));
    printf("HTTP TTFT - engine TTFT (same request's prompt_ms): %.2f ms; HTTP TTFT - A TTFT: %.2f "
           "ms (targets: < 2 ms, decode overhead < 1%%)\n",
           Ht - He, Ht - At);
    free(ids);
    server_stop(s);
    return 0;
}
