/* conns.h - connection admission for the HTTP server: strata's own listening socket and accept
 * thread, which hands each accepted socket to libmicrohttpd (MHD_add_connection) only when the
 * caps allow it.
 *
 *   caps       connections per client address, and in all; the global cap stays below the fd
 *              limit (RLIMIT_NOFILE, whose soft value is first raised to the hard one) with fds
 *              kept back for the model, logs and MHD itself, so accept() never runs out of fds
 *   eviction   a new connection over a cap closes the oldest idle connection (of the same
 *              address first, else of anyone): idle means no request in progress - waiting for
 *              its first byte, reading request headers, or kept alive between requests. Only
 *              when every connection is busy is the newcomer refused (503, then close), so idle
 *              sockets, however many, cannot keep a fresh client out
 *   deadlines  headers: a connection must deliver a request's headers within header_timeout_s
 *              of being accepted or of finishing its previous request (slowloris); body: the
 *              whole body within body_timeout_s of the headers. A generation request, once
 *              queued, is exempt: its connection lives as long as the stream (MHD's per
 *              connection inactivity timeout, set to stream_timeout_s by the server)
 *   back-off   accept errors (EMFILE, ENFILE, ENOBUFS, ENOMEM) pause accepting, 10 ms doubling
 *              to 1 s, and are logged once per 10 s with a count; out of fds (other code took
 *              them), the oldest idle connection is closed too, so the next accept succeeds.
 *              STRATA_TEST_FD_HOG=N (tests only) holds N fds open to make that happen
 * The sweep for deadlines runs on the accept thread every 250 ms. A connection is closed by
 * shutdown(2) on its socket: its MHD thread sees the end of input and closes it; the fd stays
 * valid until MHD's CLOSED notification, which takes the same mutex, so it is never reused
 * under us. */
#ifndef STRATA_API_CONNS_H
#define STRATA_API_CONNS_H

#include <microhttpd.h>

#include "util.h"

struct conns_options {
    const char *host; /* address to listen on (numeric or a name; default 127.0.0.1) */
    int port;         /* 0: a free port */
    int max_connections; /* global cap; 0: 1000 (always clipped to the fd limit) */
    int max_per_client;  /* per client address; 0: 64 */
    int header_timeout_s; /* 0: 10 */
    int body_timeout_s;   /* 0: 30 */
    void (*log)(void *user, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
    void *log_user;
};

struct conns;

/* Binds and listens (the accept thread starts with conns_run). */
struct conns *conns_open(const struct conns_options *o, struct error *err);
int conns_port(const struct conns *cs);
/* The caps in effect (after the fd limit). */
int conns_max_connections(const struct conns *cs);
int conns_max_per_client(const struct conns *cs);
/* The fd limit MHD may use as its own connection limit. */
unsigned conns_fd_limit(const struct conns *cs);
/* Starts accepting into d (started with MHD_USE_NO_LISTEN_SOCKET and, as its
 * MHD_OPTION_NOTIFY_CONNECTION, conns_notify with cls = cs). */
int conns_run(struct conns *cs, struct MHD_Daemon *d, struct error *err);
void conns_notify(void *cls, struct MHD_Connection *c, void **socket_context,
                  enum MHD_ConnectionNotificationCode code);
/* From the access handler: a request's headers arrived (busy: not evictable; body deadline
 * starts); the request became a queued generation (no deadline); its answer is done (idle
 * again: the header deadline starts). */
void conns_request_started(struct conns *cs, struct MHD_Connection *c);
void conns_request_generating(struct conns *cs, struct MHD_Connection *c);
void conns_request_done(struct conns *cs, struct MHD_Connection *c);
/* Live connections (not being closed), and connections closed by eviction or a deadline, and
 * newcomers refused, since start (for /metrics and tests). */
void conns_counts(struct conns *cs, int *live, unsigned long *evicted, unsigned long *refused);
/* Stops the accept thread and closes the listening socket (connections stay with MHD). */
void conns_stop(struct conns *cs);
void conns_free(struct conns *cs);

#endif
