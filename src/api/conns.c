/* conns.c - connection admission: the listening socket, the accept thread, caps, eviction of
 * idle connections, header and body deadlines, accept back-off (see conns.h).
 *
 * Why not libmicrohttpd's own listener: its MHD_OPTION_CONNECTION_LIMIT closes every newcomer
 * once the limit is reached (1,024 idle sockets shut everyone out), its per-IP limit likewise,
 * and on EMFILE its accept loop retries at once (a core at 100% and a log line per try). Here
 * a newcomer over a cap takes the place of the oldest idle connection instead, and accept
 * errors pause the loop. */
#include "conns.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

struct peer { /* one accepted connection */
    int fd;
    unsigned char key[16]; /* client address (IPv4 as ::ffff:a.b.c.d) */
    int claimed;           /* MHD announced it (CONNECTION_NOTIFY_STARTED) */
    int busy;              /* a request's headers arrived and its answer is not done */
    int generating;        /* that request is a queued or running generation */
    int closing;           /* shut down by us: no longer counted as live */
    double t_phase;        /* now_ms() when the current phase (idle / busy) began */
    struct peer *prev, *next;
};

struct conns {
    struct conns_options o;
    int listen_fd, wake[2];
    int port;
    int *hog, n_hog; /* STRATA_TEST_FD_HOG fds held open (tests: fds used outside conns) */
    int cap, per_client, hard; /* live connections in all / per address; fds for sockets */
    unsigned fd_limit;
    double header_ms, body_ms;
    struct MHD_Daemon *d;
    pthread_t thread;
    int running, stopping;

    pthread_mutex_t mu; /* everything below */
    struct peer *head;
    struct peer **by_fd; /* (fd_limit,) */
    int n_live, n_all;   /* n_all also counts connections being closed */
    unsigned long evicted, refused;
};

static void logf_(struct conns *cs, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void logf_(struct conns *cs, const char *fmt, ...) {
    if (!cs->o.log) return;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    cs->o.log(cs->o.log_user, "%s", msg);
}

static void addr_key(const struct sockaddr_storage *ss, unsigned char key[16]) {
    memset(key, 0, 16);
    if (ss->ss_family == AF_INET) {
        key[10] = key[11] = 0xff;
        memcpy(key + 12, &((const struct sockaddr_in *)ss)->sin_addr, 4);
    } else if (ss->ss_family == AF_INET6) {
        memcpy(key, &((const struct sockaddr_in6 *)ss)->sin6_addr, 16);
    }
}

/* ---- caps ------------------------------------------------------------------------------ */

/* Raises the soft fd limit to the hard one (at most 65,536) and returns it. */
static unsigned fd_limit_raise(void) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return 1024;
    rlim_t want = rl.rlim_max == RLIM_INFINITY || rl.rlim_max > 65536 ? 65536 : rl.rlim_max;
    if (rl.rlim_cur < want) {
        rl.rlim_cur = want;
        if (setrlimit(RLIMIT_NOFILE, &rl) != 0) getrlimit(RLIMIT_NOFILE, &rl);
    }
    return rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur > 65536 ? 65536 : (unsigned)rl.rlim_cur;
}

/* The oldest connection with no request in progress (of one address when key != NULL). */
static struct peer *oldest_idle(struct conns *cs, const unsigned char *key) {
    struct peer *best = NULL;
    for (struct peer *p = cs->head; p; p = p->next)
        if (!p->closing && !p->busy && (!key || !memcmp(p->key, key, 16)) &&
            (!best || p->t_phase < best->t_phase))
            best = p;
    return best;
}

/* mu held. The fd stays open until MHD's CLOSED notification (which needs mu). */
static void peer_close(struct conns *cs, struct peer *p) {
    p->closing = 1;
    cs->n_live--;
    cs->evicted++;
    shutdown(p->fd, SHUT_RDWR);
}

static void peer_unlink(struct conns *cs, struct peer *p) {
    if (p->prev) p->prev->next = p->next;
    else cs->head = p->next;
    if (p->next) p->next->prev = p->prev;
    if (!p->closing) cs->n_live--;
    cs->n_all--;
    if (p->fd >= 0 && (unsigned)p->fd < cs->fd_limit && cs->by_fd[p->fd] == p) cs->by_fd[p->fd] = NULL;
    free(p);
}

/* A newcomer over a cap with no idle connection to replace: a short 503, then close. */
static void refuse(int fd) {
    static const char body[] =
        "{\"error\":{\"message\":\"too many connections, all of them busy; retry later\","
        "\"type\":\"unavailable_error\",\"param\":null,\"code\":null}}\n";
    char msg[512];
    int n = snprintf(msg, sizeof msg,
                     "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                     "Retry-After: 1\r\nConnection: close\r\nContent-Length: %zu\r\n\r\n%s",
                     sizeof body - 1, body);
    if (send(fd, msg, (size_t)n, MSG_NOSIGNAL | MSG_DONTWAIT) < 0) { /* best effort */ }
    close(fd);
}

/* Decides on one accepted socket; returns its peer (registered) or NULL (refused and closed). */
static struct peer *admit(struct conns *cs, int fd, const struct sockaddr_storage *ss) {
    unsigned char key[16];
    addr_key(ss, key);
    pthread_mutex_lock(&cs->mu);
    struct peer *victim = NULL;
    int ok = (unsigned)fd < cs->fd_limit && cs->n_all < cs->hard;
    if (ok) {
        int same = 0;
        for (struct peer *p = cs->head; p; p = p->next) same += !p->closing && !memcmp(p->key, key, 16);
        if (same >= cs->per_client) ok = (victim = oldest_idle(cs, key)) != NULL;
        else if (cs->n_live >= cs->cap) ok = (victim = oldest_idle(cs, NULL)) != NULL;
    }
    if (!ok) {
        cs->refused++;
        pthread_mutex_unlock(&cs->mu);
        refuse(fd);
        return NULL;
    }
    if (victim) peer_close(cs, victim);
    struct peer *p = xcalloc(1, sizeof *p);
    p->fd = fd;
    memcpy(p->key, key, 16);
    p->t_phase = now_ms();
    p->next = cs->head;
    if (cs->head) cs->head->prev = p;
    cs->head = p;
    cs->by_fd[fd] = p;
    cs->n_live++;
    cs->n_all++;
    pthread_mutex_unlock(&cs->mu);
    return p;
}

static void sweep(struct conns *cs) {
    double now = now_ms();
    pthread_mutex_lock(&cs->mu);
    for (struct peer *p = cs->head; p; p = p->next) {
        if (p->closing || p->generating) continue;
        if (now - p->t_phase > (p->busy ? cs->body_ms : cs->header_ms)) peer_close(cs, p);
    }
    pthread_mutex_unlock(&cs->mu);
}

/* ---- the accept thread ----------------------------------------------------------------- */

static void *accept_main(void *arg) {
    struct conns *cs = arg;
    int backoff_ms = 0;
    double next_sweep = now_ms() + 250, last_err_log = -1e18;
    unsigned long errs_unlogged = 0;
    for (;;) {
        struct pollfd pf[2] = {{.fd = backoff_ms ? -1 : cs->listen_fd, .events = POLLIN},
                               {.fd = cs->wake[0], .events = POLLIN}};
        double now = now_ms();
        int timeout = backoff_ms ? backoff_ms : (int)(next_sweep - now) + 1;
        if (timeout < 0) timeout = 0;
        if (timeout > 250) timeout = 250;
        poll(pf, 2, timeout);
        if (__atomic_load_n(&cs->stopping, __ATOMIC_ACQUIRE)) break;
        now = now_ms();
        if (now >= next_sweep) {
            sweep(cs);
            next_sweep = now + 250;
        }
        /* after a pause, accept is simply tried again (and the pause doubles if it fails) */
        for (int n = 0; n < 64; n++) {
            /* every fd for sockets taken, some by connections being closed: leave newcomers
             * in the listen backlog a moment rather than refuse them */
            pthread_mutex_lock(&cs->mu);
            int wait = cs->n_all >= cs->hard && cs->n_all > cs->n_live;
            pthread_mutex_unlock(&cs->mu);
            if (wait) {
                backoff_ms = 5;
                break;
            }
            struct sockaddr_storage ss;
            socklen_t sl = sizeof ss;
            int fd = accept4(cs->listen_fd, (struct sockaddr *)&ss, &sl, SOCK_CLOEXEC);
            if (fd < 0) {
                int e = errno;
                if (e == EAGAIN || e == EWOULDBLOCK || e == EINTR || e == ECONNABORTED ||
                    e == EPROTO || e == EPERM) {
                    backoff_ms = 0;
                    break;
                }
                /* out of fds or memory: pause, and say so once per 10 s. Out of fds, the
                 * oldest idle connection also makes room, so the next try can succeed */
                backoff_ms = backoff_ms ? (backoff_ms * 2 > 1000 ? 1000 : backoff_ms * 2) : 10;
                if (e == EMFILE || e == ENFILE) {
                    pthread_mutex_lock(&cs->mu);
                    struct peer *victim = oldest_idle(cs, NULL);
                    if (victim) peer_close(cs, victim);
                    pthread_mutex_unlock(&cs->mu);
                }
                errs_unlogged++;
                if (now - last_err_log >= 10000) {
                    logf_(cs, "accept failed: %s (%lu times since the last report); pausing "
                              "accepts for up to 1 s at a time\n", strerror(e), errs_unlogged);
                    last_err_log = now;
                    errs_unlogged = 0;
                }
                break;
            }
            backoff_ms = 0;
            struct peer *p = admit(cs, fd, &ss);
            if (!p) continue;
            if (MHD_add_connection(cs->d, fd, (struct sockaddr *)&ss, sl) != MHD_YES) {
                /* MHD closed the socket; drop the peer unless its CLOSED notification did */
                pthread_mutex_lock(&cs->mu);
                if (cs->by_fd[fd] == p && !p->claimed) peer_unlink(cs, p);
                pthread_mutex_unlock(&cs->mu);
            }
        }
    }
    return NULL;
}

/* ---- MHD hooks ------------------------------------------------------------------------- */

void conns_notify(void *cls, struct MHD_Connection *c, void **socket_context,
                  enum MHD_ConnectionNotificationCode code) {
    struct conns *cs = cls;
    pthread_mutex_lock(&cs->mu);
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        int fd = ci ? ci->connect_fd : -1;
        struct peer *p = fd >= 0 && (unsigned)fd < cs->fd_limit ? cs->by_fd[fd] : NULL;
        if (p) p->claimed = 1;
        *socket_context = p;
    } else if (*socket_context) {
        peer_unlink(cs, *socket_context);
        *socket_context = NULL;
    }
    pthread_mutex_unlock(&cs->mu);
}

static struct peer *peer_of(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

void conns_request_started(struct conns *cs, struct MHD_Connection *c) {
    pthread_mutex_lock(&cs->mu);
    struct peer *p = peer_of(c);
    if (p) p->busy = 1, p->generating = 0, p->t_phase = now_ms();
    pthread_mutex_unlock(&cs->mu);
}

void conns_request_generating(struct conns *cs, struct MHD_Connection *c) {
    pthread_mutex_lock(&cs->mu);
    struct peer *p = peer_of(c);
    if (p) p->generating = 1;
    pthread_mutex_unlock(&cs->mu);
}

void conns_request_done(struct conns *cs, struct MHD_Connection *c) {
    pthread_mutex_lock(&cs->mu);
    struct peer *p = peer_of(c);
    if (p) p->busy = 0, p->generating = 0, p->t_phase = now_ms();
    pthread_mutex_unlock(&cs->mu);
}

/* ---- lifecycle ------------------------------------------------------------------------- */

struct conns *conns_open(const struct conns_options *o, struct error *err) {
    struct conns *cs = xcalloc(1, sizeof *cs);
    cs->o = *o;
    cs->listen_fd = cs->wake[0] = cs->wake[1] = -1;
    pthread_mutex_init(&cs->mu, NULL);
    const char *host = o->host ? o->host : "127.0.0.1";
    cs->header_ms = 1e3 * (o->header_timeout_s > 0 ? o->header_timeout_s : 10);
    cs->body_ms = 1e3 * (o->body_timeout_s > 0 ? o->body_timeout_s : 30);

    /* 32 fds plus an eighth of the limit (at most half of it) stay for everything but client
     * sockets: model and tokenizer files, logs, MHD's own, the accept pipe */
    cs->fd_limit = fd_limit_raise();
    int reserve = 32 + (int)(cs->fd_limit / 8);
    if (reserve > (int)cs->fd_limit / 2) reserve = (int)cs->fd_limit / 2;
    cs->hard = (int)cs->fd_limit - reserve;
    int headroom = 16; /* sockets being closed after eviction, not yet released by MHD */
    cs->cap = o->max_connections > 0 ? o->max_connections : 1000;
    if (cs->cap > cs->hard - headroom) cs->cap = cs->hard - headroom;
    if (cs->cap < 1) {
        error_set(err, "the fd limit (%u, ulimit -n) leaves no room for connections", cs->fd_limit);
        goto fail;
    }
    cs->per_client = o->max_per_client > 0 ? o->max_per_client : 64;
    if (cs->per_client > cs->cap) cs->per_client = cs->cap;
    cs->by_fd = xcalloc(cs->fd_limit, sizeof *cs->by_fd);

    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_NUMERICSERV | AI_PASSIVE},
                    *res = NULL;
    char ps[16];
    snprintf(ps, sizeof ps, "%d", o->port);
    int rc = getaddrinfo(host, ps, &hints, &res);
    if (rc != 0 || !res) {
        error_set(err, "cannot resolve host '%s': %s", host, gai_strerror(rc));
        goto fail;
    }
    cs->listen_fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    int one = 1;
    if (cs->listen_fd >= 0) setsockopt(cs->listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (cs->listen_fd < 0 || bind(cs->listen_fd, res->ai_addr, res->ai_addrlen) != 0 ||
        listen(cs->listen_fd, 1024) != 0) {
        error_set(err, "cannot listen on %s:%d: %s", host, o->port, strerror(errno));
        freeaddrinfo(res);
        goto fail;
    }
    freeaddrinfo(res);
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    getsockname(cs->listen_fd, (struct sockaddr *)&ss, &sl);
    cs->port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                              : ((struct sockaddr_in *)&ss)->sin_port);
    if (pipe2(cs->wake, O_CLOEXEC | O_NONBLOCK) != 0) {
        error_set(err, "pipe: %s", strerror(errno));
        goto fail;
    }
    /* tests only: take fds behind conns' back, so that accept() meets EMFILE */
    int hog = env_int("STRATA_TEST_FD_HOG", 0, 0, (int)cs->fd_limit);
    if (hog > 0) {
        cs->hog = xmalloc((size_t)hog * sizeof *cs->hog);
        while (cs->n_hog < hog && (cs->hog[cs->n_hog] = open("/dev/null", O_RDONLY | O_CLOEXEC)) >= 0) cs->n_hog++;
    }
    return cs;
fail:
    conns_free(cs);
    return NULL;
}

int conns_port(const struct conns *cs) { return cs->port; }
int conns_max_connections(const struct conns *cs) { return cs->cap; }
int conns_max_per_client(const struct conns *cs) { return cs->per_client; }
unsigned conns_fd_limit(const struct conns *cs) { return cs->fd_limit; }

int conns_run(struct conns *cs, struct MHD_Daemon *d, struct error *err) {
    cs->d = d;
    if (pthread_create(&cs->thread, NULL, accept_main, cs) != 0)
        return error_set(err, "cannot start the accept thread");
    cs->running = 1;
    return 0;
}

void conns_counts(struct conns *cs, int *live, unsigned long *evicted, unsigned long *refused) {
    pthread_mutex_lock(&cs->mu);
    if (live) *live = cs->n_live;
    if (evicted) *evicted = cs->evicted;
    if (refused) *refused = cs->refused;
    pthread_mutex_unlock(&cs->mu);
}

void conns_stop(struct conns *cs) {
    if (!cs) return;
    if (cs->running) {
        __atomic_store_n(&cs->stopping, 1, __ATOMIC_RELEASE);
        if (write(cs->wake[1], "x", 1) < 0) { /* the poll timeout wakes it anyway */ }
        pthread_join(cs->thread, NULL);
        cs->running = 0;
    }
    if (cs->listen_fd >= 0) close(cs->listen_fd);
    cs->listen_fd = -1;
}

/* After MHD_stop_daemon (every connection closed and notified). */
void conns_free(struct conns *cs) {
    if (!cs) return;
    conns_stop(cs);
    if (cs->wake[0] >= 0) close(cs->wake[0]), close(cs->wake[1]);
    for (int i = 0; i < cs->n_hog; i++) close(cs->hog[i]);
    free(cs->hog);
    while (cs->head) peer_unlink(cs, cs->head);
    free(cs->by_fd);
    pthread_mutex_destroy(&cs->mu);
    free(cs);
}
