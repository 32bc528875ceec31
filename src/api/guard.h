/* guard.h - request guards that keep the web pages a user visits from driving a local server
 * (pure functions on header values; server.c applies them before any body is read):
 *   Host          an IP literal, "localhost" (or a name under .localhost), or a configured
 *                 name. A DNS-rebinding page reaches the server under its own domain name,
 *                 which fails here (an IP literal cannot be rebound).
 *   Origin        (browsers send it) a loopback origin - http(s)://localhost, 127.x.x.x, [::1],
 *                 any port -, the server's own (the authority the request was sent to, i.e.
 *                 the Host header: the built-in page), one configured, or any with "*". Others
 *                 get no CORS headers and are refused (403), on preflight and on simple
 *                 requests alike, since a browser sends a simple request without asking first.
 *   Content-Type  a JSON route takes application/json only: a page can POST text/plain or a
 *                 form without a preflight, never application/json.
 * Mirrors what llama.cpp's server and Ollama settled on (OLLAMA_ORIGINS; loopback by default). */
#ifndef STRATA_API_GUARD_H
#define STRATA_API_GUARD_H

/* host: the Host header (NULL: absent, allowed - HTTP/1.0); names: extra host names. */
int guard_host_ok(const char *host, const char *const *names, int n_names);
/* origin: the Origin header (not NULL); host: the Host header or NULL. */
int guard_origin_ok(const char *origin, const char *host, const char *const *origins, int n_origins);
/* 1 for "application/json" (any case, parameters allowed), else 0 (also for NULL). */
int guard_json_type(const char *content_type);
/* 1 for an Access-Control-Request-Headers value that may be echoed as Allow-Headers: a
 * comma-separated list of header names (RFC 9110 token characters, spaces), 1 to 2048 bytes.
 * 0 for NULL, empty or anything else (the caller answers with its default list). */
int guard_header_list_ok(const char *list);
/* 1 when a listen address (as given to --host) is reachable only from this machine. */
int guard_listen_is_loopback(const char *listen_host);

#endif
