/* guard.c - Host, Origin and Content-Type checks for the HTTP server (see guard.h). */
#include "guard.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <netdb.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

/* Splits an authority "host[:port]" or "[v6]:port" into its host part (brackets removed,
 * lowercased, a trailing dot dropped); -1 if malformed. */
static int authority_host(const char *a, size_t n, char *out, size_t cap) {
    const char *h = a, *end = a + n;
    if (n && a[0] == '[') {
        const char *rb = memchr(a, ']', n);
        if (!rb || (rb + 1 < end && rb[1] != ':')) return -1;
        h = a + 1;
        end = rb;
    } else {
        const char *colon = memchr(a, ':', n);
        if (colon) end = colon;
    }
    size_t hl = (size_t)(end - h);
    if (hl && h[hl - 1] == '.') hl--;
    if (hl == 0 || hl >= cap) return -1;
    for (size_t i = 0; i < hl; i++) {
        char c = h[i];
        out[i] = c >= 'A' && c <= 'Z' ? (char)(c - 'A' + 'a') : c;
        if ((unsigned char)c <= ' ' || c == '/' || c == '@') return -1;
    }
    out[hl] = 0;
    return 0;
}

static int is_ip_literal(const char *h) {
    unsigned char buf[16];
    return inet_pton(AF_INET, h, buf) == 1 || inet_pton(AF_INET6, h, buf) == 1;
}

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

static int is_loopback_name(const char *h) {
    unsigned char a[16];
    if (!strcmp(h, "localhost") || ends_with(h, ".localhost")) return 1;
    if (inet_pton(AF_INET, h, a) == 1) return a[0] == 127;
    if (inet_pton(AF_INET6, h, a) == 1) {
        static const unsigned char one[16] = {[15] = 1};
        static const unsigned char v4[12] = {[10] = 0xff, [11] = 0xff};
        return !memcmp(a, one, 16) || (!memcmp(a, v4, 12) && a[12] == 127);
    }
    return 0;
}

int guard_host_ok(const char *host, const char *const *names, int n_names) {
    if (!host) return 1;
    char h[256];
    if (authority_host(host, strlen(host), h, sizeof h) != 0) return 0;
    if (is_ip_literal(h) || is_loopback_name(h)) return 1;
    for (int i = 0; i < n_names; i++) {
        char want[256];
        if (authority_host(names[i], strlen(names[i]), want, sizeof want) == 0 && !strcmp(h, want)) return 1;
    }
    return 0;
}

int guard_origin_ok(const char *origin, const char *host, const char *const *origins, int n_origins) {
    for (int i = 0; i < n_origins; i++)
        if (!strcmp(origins[i], "*") || !strcasecmp(origins[i], origin)) return 1;
    const char *auth = NULL;
    if (!strncasecmp(origin, "http://", 7)) auth = origin + 7;
    else if (!strncasecmp(origin, "https://", 8)) auth = origin + 8;
    if (!auth || strchr(auth, '/')) return 0; /* "null", other schemes, not an origin */
    char h[256];
    if (authority_host(auth, strlen(auth), h, sizeof h) != 0) return 0;
    if (is_loopback_name(h)) return 1;
    /* the server's own page: same authority as the request went to (Host was checked first) */
    return host && !strcasecmp(auth, host);
}

int guard_json_type(const char *ct) {
    if (!ct) return 0;
    while (*ct == ' ' || *ct == '\t') ct++;
    if (strncasecmp(ct, "application/json", 16) != 0) return 0;
    ct += 16;
    while (*ct == ' ' || *ct == '\t') ct++;
    return *ct == 0 || *ct == ';';
}

int guard_listen_is_loopback(const char *listen_host) {
    if (!listen_host) return 1; /* the default, 127.0.0.1 */
    char h[256];
    if (authority_host(listen_host, strlen(listen_host), h, sizeof h) != 0) {
        if (strlen(listen_host) >= sizeof h) return 0;
        snprintf(h, sizeof h, "%s", listen_host); /* a bare IPv6 address ("::1") */
    }
    if (!is_ip_literal(h) && strcmp(h, "localhost") != 0) {
        /* a name: loopback only if every address it resolves to is */
        struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res = NULL, *r;
        if (getaddrinfo(listen_host, NULL, &hints, &res) != 0 || !res) return 0;
        int all = 1;
        for (r = res; r; r = r->ai_next) {
            char a[INET6_ADDRSTRLEN];
            const void *p = r->ai_family == AF_INET ? (const void *)&((struct sockaddr_in *)r->ai_addr)->sin_addr
                                                    : (const void *)&((struct sockaddr_in6 *)r->ai_addr)->sin6_addr;
            if (!inet_ntop(r->ai_family, p, a, sizeof a) || !is_loopback_name(a)) all = 0;
        }
        freeaddrinfo(res);
        return all;
    }
    return is_loopback_name(h);
}

int guard_header_list_ok(const char *list) {
    if (!list || !*list) return 0;
    size_t n = 0;
    int name = 0;
    for (const char *p = list; *p; p++, n++) {
        unsigned char ch = (unsigned char)*p;
        if (n >= 2048) return 0;
        if (ch == ',' || ch == ' ' || ch == '\t') continue;
        if (!(isalnum(ch) || strchr("!#$%&'*+-.^_`|~", ch))) return 0;
        name = 1;
    }
    return name;
}
