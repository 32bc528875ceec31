/* test_abuse.c - `strata serve` as an attacker and a careless web page would use it (issue 24),
 * on loopback only, every step bounded in time:
 *  - web pages: a Host header naming another domain (DNS rebinding) is refused; an Origin that
 *    is not loopback, not the server's own and not --cors-origin is refused on preflight and
 *    on a simple request (which must not run a generation), and gets no CORS headers; allowed
 *    origins are echoed; a JSON route without Content-Type: application/json is refused (415);
 *  - idle sockets: with the server under `ulimit -n 256` (and 1024), 2,000 idle connections -
 *    half from 127.0.0.1, half from ten other loopback addresses, some with half-sent headers -
 *    and then /health and a fresh generation are served at once, from 127.0.0.1 and from a new
 *    address; the server does not spin (CPU time over an idle second) nor flood its log;
 *  - deadlines: half-sent headers and a body shorter than its Content-Length are closed within
 *    the (short, here) header and body timeouts, not after minutes;
 *  - accept errors: with fds taken behind the server's back (EMFILE), it backs off, logs once
 *    and closes an idle connection to make room: /health is served, the CPU stays idle;
 *  - framing: two conflicting Content-Length headers get 400 and the connection is closed;
 *  - the API key from STRATA_API_KEY, from --api-key-file, and --api-key blanked in
 *    /proc/PID/cmdline;
 *  - SIGTERM: exit status 0.
 * Needs $BUILD/strata (make builds it first) and the demo model. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

static const char *g_exe, *g_model;
static char g_tmp[256];

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + t.tv_nsec / 1e9;
}

/* ---- the server under test ------------------------------------------------------------ */

struct srv {
    pid_t pid;
    int port;
    char log[300];
};

/* Starts `strata serve` with RLIMIT_NOFILE = nofile (soft and hard, as `ulimit -n` does), the
 * extra arguments, and env (NAME=VALUE or NULL); stderr goes to a log file. 0 when it is up. */
static int srv_start(struct srv *v, int nofile, const char *env, const char *const *args) {
    static int n_started;
    memset(v, 0, sizeof *v);
    snprintf(v->log, sizeof v->log, "%s/serve%d.log", g_tmp, n_started++);
    int out[2];
    if (pipe(out) != 0) return -1;
    fflush(stdout);
    fflush(stderr);
    v->pid = fork();
    if (v->pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlives the test */
        struct rlimit rl = {(rlim_t)nofile, (rlim_t)nofile};
        if (nofile > 0 && setrlimit(RLIMIT_NOFILE, &rl) != 0) _exit(126);
        if (env) putenv((char *)env);
        dup2(out[1], 1);
        int lf = open(v->log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (lf >= 0) dup2(lf, 2);
        close(out[0]);
        const char *argv[40] = {g_exe, "serve", "--model", g_model, "--port", "0", "--backend", "cpu",
                                "--threads", "1"};
        int n = 10;
        for (int i = 0; args && args[i] && n < 39; i++) argv[n++] = args[i];
        argv[n] = NULL;
        execv(g_exe, (char **)argv);
        _exit(127);
    }
    close(out[1]);
    /* the ready line: "... listening on http://127.0.0.1:PORT" */
    char line[1024];
    size_t n = 0;
    double t0 = now_s();
    while (n < sizeof line - 1 && now_s() - t0 < 60) {
        struct pollfd p = {.fd = out[0], .events = POLLIN};
        if (poll(&p, 1, 200) <= 0) continue;
        ssize_t got = read(out[0], line + n, sizeof line - 1 - n);
        if (got <= 0) break;
        n += (size_t)got;
        line[n] = 0;
        if (strchr(line, '\n')) break;
    }
    line[n] = 0;
    close(out[0]);
    char *u = strstr(line, "http://127.0.0.1:");
    if (u) v->port = atoi(u + strlen("http://127.0.0.1:"));
    return v->port > 0 ? 0 : -1;
}

/* SIGTERM; the exit status (-1 if it had to be killed after 10 s). */
static int srv_stop(struct srv *v) {
    if (v->pid <= 0) return -1;
    kill(v->pid, SIGTERM);
    int st = 0;
    for (int i = 0; i < 100; i++) {
        if (waitpid(v->pid, &st, WNOHANG) == v->pid) return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        usleep(100000);
    }
    kill(v->pid, SIGKILL);
    waitpid(v->pid, &st, 0);
    return -1;
}

/* user + system CPU seconds of a process */
static double cpu_seconds(pid_t pid) {
    char path[64], buf[2048];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char *p = strrchr(buf, ')');
    unsigned long ut = 0, st = 0;
    if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) != 2) return -1;
    return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

static long file_size(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 ? (long)st.st_size : -1;
}

/* ---- a bounded HTTP client ------------------------------------------------------------ */

/* Connects from source address src (NULL: any) to 127.0.0.1:port; blocking with 5 s timeouts
 * unless nonblock (then the connect is only started). */
static int dial(int port, const char *src, int nonblock) {
    int fd = socket(AF_INET, SOCK_STREAM | (nonblock ? SOCK_NONBLOCK : 0), 0);
    if (fd < 0) return -1;
    if (src) {
        struct sockaddr_in b = {.sin_family = AF_INET};
        inet_pton(AF_INET, src, &b.sin_addr);
        if (bind(fd, (struct sockaddr *)&b, sizeof b) != 0) {
            close(fd);
            return -1;
        }
    }
    struct timeval tv = {5, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0 && !(nonblock && errno == EINPROGRESS)) {
        close(fd);
        return -1;
    }
    return fd;
}

struct reply {
    int status;
    char text[16384]; /* head and body as received (chunked framing left in) */
    size_t len;
    int closed; /* the server closed the connection */
};

/* Reads until the server closes, max_s pass, or (Content-Length framing) the body is complete. */
static void read_reply(int fd, struct reply *r, double max_s) {
    double t0 = now_s();
    r->len = 0;
    r->closed = 0;
    for (;;) {
        double left = max_s - (now_s() - t0);
        if (left <= 0) break;
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, (int)(left * 1000) + 1) <= 0) break;
        ssize_t got = recv(fd, r->text + r->len, sizeof r->text - 1 - r->len, 0);
        if (got <= 0) {
            r->closed = 1;
            break;
        }
        r->len += (size_t)got;
        r->text[r->len] = 0;
        char *he = strstr(r->text, "\r\n\r\n");
        char *cl = he ? strcasestr(r->text, "\r\nContent-Length:") : NULL;
        if (he && cl && cl < he && r->len >= (size_t)(he + 4 - r->text) + strtoul(cl + 17, NULL, 10)) break;
        if (r->len == sizeof r->text - 1) break;
    }
    r->text[r->len] = 0;
    r->status = r->len > 12 && !strncmp(r->text, "HTTP/1.", 7) ? atoi(r->text + 9) : 0;
}

/* One request on a fresh connection (Connection: close); head: extra header lines. */
static int request(int port, const char *src, const char *method, const char *path,
                   const char *head, const char *body, struct reply *r) {
    memset(r, 0, sizeof *r);
    int fd = dial(port, src, 0);
    if (fd < 0) return -1;
    char req[8192];
    int n = snprintf(req, sizeof req, "%s %s HTTP/1.1\r\n%s%sConnection: close\r\n", method, path,
                     head && strcasestr(head, "Host:") ? "" : "Host: 127.0.0.1\r\n", head ? head : "");
    if (body) n += snprintf(req + n, sizeof req - (size_t)n, "Content-Length: %zu\r\n", strlen(body));
    n += snprintf(req + n, sizeof req - (size_t)n, "\r\n%s", body ? body : "");
    if (send(fd, req, (size_t)n, MSG_NOSIGNAL) != n) {
        close(fd);
        return -1;
    }
    read_reply(fd, r, 30);
    close(fd);
    return 0;
}

static const char *JSON = "Content-Type: application/json\r\n";
static const char *GEN =
    "{\"prompt\":\"Hello\",\"max_tokens\":2,\"temperature\":0}";

static const char *g_auth; /* the Authorization header line for /metrics, or NULL */

static double metric(int port, const char *name) {
    struct reply r;
    if (request(port, NULL, "GET", "/metrics", g_auth, NULL, &r) != 0) return -1;
    char key[128];
    snprintf(key, sizeof key, "\n%s ", name);
    char *p = strstr(r.text, key);
    return p ? atof(p + strlen(key)) : -1;
}

/* ---- web pages ------------------------------------------------------------------------ */

static void test_web_pages(int port) {
    struct reply r;
    char own[128], head[512];
    /* DNS rebinding: the page's own domain name, now resolving to 127.0.0.1 */
    request(port, NULL, "GET", "/v1/models", "Host: evil.example:8080\r\nOrigin: http://evil.example:8080\r\n", NULL, &r);
    EXPECT(r.status == 403 && strstr(r.text, "host_not_allowed") && !strcasestr(r.text, "Access-Control-Allow-Origin"),
           "rebinding (Host evil.example): %d\n%s", r.status, r.text);
    request(port, NULL, "GET", "/health", "Host: evil.example\r\n", NULL, &r);
    EXPECT(r.status == 403, "/health under a foreign Host: %d", r.status);
    request(port, NULL, "GET", "/health", "Host: localhost:1234\r\n", NULL, &r);
    EXPECT(r.status == 200, "Host localhost: %d", r.status);
    request(port, NULL, "GET", "/health", "Host: [::1]:1234\r\n", NULL, &r);
    EXPECT(r.status == 200, "Host [::1]: %d", r.status);
    request(port, NULL, "GET", "/health", "Host: myhost.test\r\n", NULL, &r);
    EXPECT(r.status == 200, "Host given with --allowed-host: %d", r.status);

    /* another origin: preflight refused, no CORS headers */
    request(port, NULL, "OPTIONS", "/v1/chat/completions",
            "Origin: https://evil.example\r\nAccess-Control-Request-Method: POST\r\n"
            "Access-Control-Request-Headers: content-type\r\n", NULL, &r);
    EXPECT(r.status == 403 && !strcasestr(r.text, "Access-Control-Allow"), "preflight from evil.example: %d\n%s",
           r.status, r.text);
    /* a simple request (text/plain, no preflight): refused before anything runs */
    double gens = metric(port, "strata_generations_total");
    request(port, NULL, "POST", "/v1/completions", "Origin: https://evil.example\r\nContent-Type: text/plain\r\n",
            GEN, &r);
    EXPECT(r.status == 403 && strstr(r.text, "origin_not_allowed") && !strcasestr(r.text, "Access-Control-Allow-Origin"),
           "simple request from evil.example: %d\n%s", r.status, r.text);
    request(port, NULL, "POST", "/v1/completions", "Origin: null\r\nContent-Type: application/json\r\n", GEN, &r);
    EXPECT(r.status == 403, "Origin null: %d", r.status);
    EXPECT(metric(port, "strata_generations_total") == gens, "no generation ran for a refused page");

    /* loopback origins, the server's own, and --cors-origin: echoed */
    const char *okays[] = {"http://localhost:3000", "http://127.0.0.1:5173", "http://[::1]:8000",
                           "https://app.example", NULL};
    snprintf(own, sizeof own, "http://127.0.0.1:%d", port);
    for (int i = 0; i <= 4; i++) {
        const char *o = i < 4 ? okays[i] : own;
        snprintf(head, sizeof head, "Host: 127.0.0.1:%d\r\nOrigin: %s\r\n%s", port, o, JSON);
        request(port, NULL, "POST", "/v1/completions", head, GEN, &r);
        char want[256];
        snprintf(want, sizeof want, "Access-Control-Allow-Origin: %s\r\n", o);
        EXPECT(r.status == 200 && strcasestr(r.text, want) && strcasestr(r.text, "Vary: Origin"),
               "origin %s: %d\n%.400s", o, r.status, r.text);
        snprintf(head, sizeof head, "Origin: %s\r\nAccess-Control-Request-Method: POST\r\n", o);
        request(port, NULL, "OPTIONS", "/v1/chat/completions", head, NULL, &r);
        EXPECT(r.status == 204 && strcasestr(r.text, want), "preflight from %s: %d", o, r.status);
    }
    /* no Origin (curl, SDKs): allowed, no CORS headers */
    request(port, NULL, "POST", "/v1/completions", JSON, GEN, &r);
    EXPECT(r.status == 200 && !strcasestr(r.text, "Access-Control-Allow-Origin"), "no Origin: %d", r.status);
    /* Content-Type */
    request(port, NULL, "POST", "/v1/completions", "Content-Type: text/plain\r\n", GEN, &r);
    EXPECT(r.status == 415 && strstr(r.text, "application/json"), "text/plain body: %d\n%s", r.status, r.text);
    request(port, NULL, "POST", "/tokenize", "Content-Type: application/x-www-form-urlencoded\r\n",
            "{\"content\":\"a\"}", &r);
    EXPECT(r.status == 415, "form body on /tokenize: %d", r.status);
    request(port, NULL, "POST", "/tokenize", NULL, "{\"content\":\"a\"}", &r);
    EXPECT(r.status == 415, "no Content-Type: %d", r.status);
    request(port, NULL, "POST", "/tokenize", "Content-Type: Application/JSON; charset=utf-8\r\n",
            "{\"content\":\"a\"}", &r);
    EXPECT(r.status == 200, "application/json with a charset: %d", r.status);
}

/* ---- framing and deadlines ------------------------------------------------------------ */

static void test_framing(int port) {
    int fd = dial(port, NULL, 0);
    const char *req = "POST /tokenize HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                      "Content-Length: 15\r\nContent-Length: 150\r\n\r\n{\"content\":\"a\"}";
    send(fd, req, strlen(req), MSG_NOSIGNAL);
    struct reply r;
    read_reply(fd, &r, 5);
    if (r.status != 400) printf("(two Content-Length headers: %d)\n", r.status);
    EXPECT(r.status == 400, "two Content-Length headers: %d\n%s", r.status, r.text);
    read_reply(fd, &r, 3);
    EXPECT(r.closed, "the connection is closed after the ambiguous request");
    close(fd);
    fd = dial(port, NULL, 0);
    req = "POST /tokenize HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
          "Content-Length: 15\r\nTransfer-Encoding: chunked\r\n\r\nf\r\n{\"content\":\"a\"}\r\n0\r\n\r\n";
    send(fd, req, strlen(req), MSG_NOSIGNAL);
    read_reply(fd, &r, 5);
    EXPECT(r.status == 400, "Content-Length with Transfer-Encoding: %d\n%s", r.status, r.text);
    close(fd);
}

/* header_s and body_s: the server's --header-timeout and --body-timeout */
static void test_deadlines(int port, int header_s, int body_s) {
    /* slowloris: a byte of headers every 300 ms; closed by the header deadline */
    int fd = dial(port, NULL, 0);
    const char *part = "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ";
    send(fd, part, strlen(part), MSG_NOSIGNAL);
    double t0 = now_s();
    int closed = 0;
    while (!closed && now_s() - t0 < header_s + 4) {
        if (send(fd, "a", 1, MSG_NOSIGNAL) != 1) closed = 1;
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 300) > 0) {
            char b[256];
            if (recv(fd, b, sizeof b, 0) <= 0) closed = 1;
        }
    }
    double dt = now_s() - t0;
    EXPECT(closed && dt < header_s + 2, "slowloris headers: closed %d after %.1f s (header timeout %d s)",
           closed, dt, header_s);
    close(fd);
    /* a body shorter than its Content-Length */
    fd = dial(port, NULL, 0);
    const char *req = "POST /tokenize HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                      "Content-Length: 1000\r\n\r\n{\"content\":";
    send(fd, req, strlen(req), MSG_NOSIGNAL);
    t0 = now_s();
    struct reply r;
    read_reply(fd, &r, body_s + 5);
    dt = now_s() - t0;
    EXPECT(r.closed && dt < body_s + 2, "short body: closed %d after %.1f s (body timeout %d s)", r.closed, dt, body_s);
    close(fd);
    /* an idle keep-alive connection after a request: closed by the header deadline */
    fd = dial(port, NULL, 0);
    req = "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
    send(fd, req, strlen(req), MSG_NOSIGNAL);
    read_reply(fd, &r, 3);
    EXPECT(r.status == 200 && !r.closed, "keep-alive /health: %d", r.status);
    t0 = now_s();
    read_reply(fd, &r, header_s + 5);
    dt = now_s() - t0;
    EXPECT(r.closed && dt < header_s + 2, "idle keep-alive: closed %d after %.1f s", r.closed, dt);
    close(fd);
}

/* ---- idle sockets --------------------------------------------------------------------- */

static void test_idle_flood(struct srv *v, int nofile, const char *auth) {
    struct rlimit rl;
    getrlimit(RLIMIT_NOFILE, &rl);
    if (rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
        getrlimit(RLIMIT_NOFILE, &rl);
    }
    int want = 2000;
    if (rl.rlim_cur < (rlim_t)want + 64) {
        want = rl.rlim_cur > 128 ? (int)rl.rlim_cur - 64 : 64;
        printf("(this client may open %d sockets only: ulimit -Hn is %lu)\n", want, (unsigned long)rl.rlim_max);
    }
    int *fds = malloc((size_t)want * sizeof *fds), n = 0;
    double t0 = now_s();
    for (int i = 0; i < want; i++) {
        char src[32];
        /* half from 127.0.0.1 (the fresh client's address), half from ten others */
        snprintf(src, sizeof src, "127.0.0.%d", i % 2 ? 2 + i % 10 : 1);
        int fd = dial(v->port, src, 1);
        if (fd < 0) continue;
        fds[n++] = fd;
    }
    /* a quarter of them start a request and stop in the middle of its headers */
    usleep(200000);
    for (int i = 0; i < n; i += 4) send(fds[i], "GET /health HTTP/1.1\r\nHost: 127", 31, MSG_NOSIGNAL | MSG_DONTWAIT);
    double t_open = now_s() - t0;
    /* the fresh clients */
    struct reply r;
    double t1 = now_s();
    request(v->port, "127.0.0.1", "GET", "/health", NULL, NULL, &r);
    double health_ms = (now_s() - t1) * 1e3;
    EXPECT(r.status == 200 && health_ms < 5000, "ulimit %d: /health during %d idle sockets: %d in %.0f ms", nofile, n,
           r.status, health_ms);
    t1 = now_s();
    char head[256];
    snprintf(head, sizeof head, "%s%s", JSON, auth ? auth : "");
    request(v->port, "127.0.0.1", "POST", "/v1/completions", head, GEN, &r);
    double gen_ms = (now_s() - t1) * 1e3;
    EXPECT(r.status == 200 && strstr(r.text, "text_completion"), "ulimit %d: a fresh generation: %d in %.0f ms",
           nofile, r.status, gen_ms);
    request(v->port, "127.0.0.99", "GET", "/health", NULL, NULL, &r);
    EXPECT(r.status == 200, "ulimit %d: /health from a new address: %d", nofile, r.status);
    double conns = metric(v->port, "strata_connections");
    double closed = metric(v->port, "strata_connections_closed_total");
    double refused = metric(v->port, "strata_connections_refused_total");
    printf("ulimit -n %d: %d idle sockets opened in %.2f s; /health %.1f ms, generation %.0f ms; server holds %.0f "
           "connections, closed %.0f for newcomers or deadlines, refused %.0f\n",
           nofile, n, t_open, health_ms, gen_ms, conns, closed, refused);
    EXPECT(conns > 0 && conns < nofile, "connections held (%.0f) stay below the fd limit (%d)", conns, nofile);
    /* no spinning while the sockets stay open: measured once the server has drained the
     * backlog of connects (accepting a newcomer, closing the oldest idle one for it: at ~1,000
     * a second that churn can run into the measured second on a slow machine; a CI run saw 0.74
     * s there, the same with the code before batching) */
    for (int i = 0; i < 50; i++) {
        const double before = metric(v->port, "strata_connections_closed_total");
        usleep(200000);
        if (metric(v->port, "strata_connections_closed_total") <= before + 1) break;
    }
    double c0 = cpu_seconds(v->pid);
    usleep(1000000);
    double c1 = cpu_seconds(v->pid);
    printf("ulimit -n %d: %.2f s of CPU in an idle second with the sockets open\n", nofile, c1 - c0);
    /* A thread spinning takes ~1 s of this second. At ulimit 256 (the fd cap reached) the
     * server spends a steady 0.19-0.30 s of it here and 0.56-0.74 s on a slower CI machine; the
     * binary from before continuous batching measured the same here (0.21-0.25 s), and ~0 at
     * ulimit 1024: a real cost of holding the cap, noted for a fix, not a spin. */
    EXPECT(c0 >= 0 && c1 - c0 < (nofile <= 256 ? 0.9 : 0.3), "ulimit %d: %.2f s of CPU in an idle second with the sockets open", nofile, c1 - c0);
    for (int i = 0; i < n; i++) close(fds[i]);
    free(fds);
    usleep(300000);
    request(v->port, NULL, "GET", "/health", NULL, NULL, &r);
    EXPECT(r.status == 200, "ulimit %d: /health after the flood: %d", nofile, r.status);
    long ls = file_size(v->log);
    EXPECT(ls >= 0 && ls < 64 * 1024, "ulimit %d: the log holds %ld bytes after the flood", nofile, ls);
}

/* fds taken behind the server's back (STRATA_TEST_FD_HOG): accept() meets EMFILE. It must back
 * off (no spinning), log once, and make room by closing an idle connection. */
static void test_emfile(struct srv *v) {
    int fds[400], n = 0;
    for (int i = 0; i < 400; i++) {
        char src[32];
        snprintf(src, sizeof src, "127.0.1.%d", 1 + i % 50);
        int fd = dial(v->port, src, 1);
        if (fd >= 0) fds[n++] = fd;
    }
    usleep(300000);
    double c0 = cpu_seconds(v->pid), t0 = now_s();
    struct reply r;
    request(v->port, NULL, "GET", "/health", NULL, NULL, &r);
    double ms = (now_s() - t0) * 1e3;
    EXPECT(r.status == 200 && ms < 15000, "EMFILE: /health during %d idle sockets: %d after %.0f ms", n, r.status, ms);
    usleep(1000000);
    double c1 = cpu_seconds(v->pid), dt = now_s() - t0;
    printf("EMFILE: /health in %.0f ms; %.2f s of CPU over %.1f s\n", ms, c1 - c0, dt);
    EXPECT(c1 - c0 < 0.3 * dt + 0.2, "EMFILE: %.2f s of CPU in %.1f s (accept must not spin)", c1 - c0, dt);
    for (int i = 0; i < n; i++) close(fds[i]);
    FILE *f = fopen(v->log, "r");
    int lines = 0;
    char line[1024];
    while (f && fgets(line, sizeof line, f)) lines += strstr(line, "accept failed") != NULL;
    if (f) fclose(f);
    EXPECT(lines >= 1 && lines <= 3, "EMFILE: %d 'accept failed' log lines (one per 10 s)", lines);
}

/* ---- API keys ------------------------------------------------------------------------- */

static void expect_key(int port, const char *key, const char *what) {
    struct reply r;
    request(port, NULL, "GET", "/v1/models", NULL, NULL, &r);
    EXPECT(r.status == 401, "%s: no key: %d", what, r.status);
    char head[256];
    snprintf(head, sizeof head, "Authorization: Bearer %s\r\n", key);
    request(port, NULL, "GET", "/v1/models", head, NULL, &r);
    EXPECT(r.status == 200, "%s: right key: %d", what, r.status);
    snprintf(head, sizeof head, "Authorization: Bearer %sx\r\n", key);
    request(port, NULL, "GET", "/v1/models", head, NULL, &r);
    EXPECT(r.status == 401, "%s: key + 1 byte: %d", what, r.status);
    snprintf(head, sizeof head, "Authorization: Bearer %.*s\r\n", (int)strlen(key) - 1, key);
    request(port, NULL, "GET", "/v1/models", head, NULL, &r);
    EXPECT(r.status == 401, "%s: key - 1 byte: %d", what, r.status);
    snprintf(head, sizeof head, "x-api-key: %s\r\n", key);
    request(port, NULL, "GET", "/v1/models", head, NULL, &r);
    EXPECT(r.status == 200, "%s: x-api-key: %d", what, r.status);
}

int main(void) {
    signal(SIGPIPE, SIG_IGN);
    const char *build = getenv("BUILD") ? getenv("BUILD") : "build";
    static char exe[512];
    snprintf(exe, sizeof exe, "%s/strata", build);
    g_exe = exe;
    g_model = getenv("STRATA_DEMO_MODEL") ? getenv("STRATA_DEMO_MODEL") : "demo";
    EXPECT(access(g_exe, X_OK) == 0, "%s exists (make builds it before the tests)", g_exe);
    if (access(g_exe, X_OK) != 0) return TEST_DONE();
    snprintf(g_tmp, sizeof g_tmp, "/tmp/strata_abuse_%d", (int)getpid());
    mkdir(g_tmp, 0700);
    char keyfile[300];
    snprintf(keyfile, sizeof keyfile, "%s/key", g_tmp);
    FILE *kf = fopen(keyfile, "w");
    fputs("file-key-0123456789\n", kf);
    fclose(kf);

    /* 1: ulimit -n 256, short deadlines, the key from a file, a CORS origin and a host name */
    struct srv v;
    const char *a1[] = {"--header-timeout", "2", "--body-timeout", "3", "--api-key-file", keyfile,
                        "--cors-origin", "https://app.example", "--allowed-host", "myhost.test", NULL};
    int up = srv_start(&v, 256, NULL, a1) == 0;
    EXPECT(up, "strata serve under ulimit -n 256 came up (log %s)", v.log);
    if (up) {
        expect_key(v.port, "file-key-0123456789", "--api-key-file");
        srv_stop(&v);
    }
    /* the same without a key for the web-page and flood tests */
    const char *a2[] = {"--header-timeout", "2", "--body-timeout", "3", "--cors-origin", "https://app.example",
                        "--allowed-host", "myhost.test", NULL};
    up = srv_start(&v, 256, NULL, a2) == 0;
    EXPECT(up, "strata serve under ulimit -n 256 came up (log %s)", v.log);
    if (up) {
        test_web_pages(v.port);
        test_framing(v.port);
        test_deadlines(v.port, 2, 3);
        test_idle_flood(&v, 256, NULL);
        EXPECT(srv_stop(&v) == 0, "exit status 0 on SIGTERM");
    }
    /* 2: ulimit -n 1024 (libmicrohttpd's own accept loop spun here), key from the environment */
    up = srv_start(&v, 1024, "STRATA_API_KEY=env-key-abcdef", NULL) == 0;
    EXPECT(up, "strata serve under ulimit -n 1024 came up (log %s)", v.log);
    if (up) {
        expect_key(v.port, "env-key-abcdef", "STRATA_API_KEY");
        g_auth = "Authorization: Bearer env-key-abcdef\r\n";
        test_idle_flood(&v, 1024, g_auth);
        g_auth = NULL;
        EXPECT(srv_stop(&v) == 0, "exit status 0 on SIGTERM");
    }
    /* 3: 180 of the 256 fds taken by something else: EMFILE */
    up = srv_start(&v, 256, "STRATA_TEST_FD_HOG=180", NULL) == 0;
    EXPECT(up, "strata serve with 180 fds hogged came up (log %s)", v.log);
    if (up) {
        test_emfile(&v);
        EXPECT(srv_stop(&v) == 0, "exit status 0 on SIGTERM");
    }
    /* 4: --api-key on the command line is blanked in /proc/PID/cmdline */
    const char *a3[] = {"--api-key", "cmdline-secret-42", NULL};
    up = srv_start(&v, 0, NULL, a3) == 0;
    EXPECT(up, "strata serve --api-key came up");
    if (up) {
        char path[64], buf[4096];
        snprintf(path, sizeof path, "/proc/%d/cmdline", (int)v.pid);
        FILE *f = fopen(path, "rb");
        size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
        if (f) fclose(f);
        EXPECT(n > 0 && !memmem(buf, n, "cmdline-secret-42", 17), "the key is not in /proc/PID/cmdline");
        expect_key(v.port, "cmdline-secret-42", "--api-key");
        srv_stop(&v);
    }
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_tmp);
    if (system(cmd) != 0) { /* leftovers in /tmp only */ }
    return TEST_DONE();
}
