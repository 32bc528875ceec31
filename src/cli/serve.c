/* serve.c - `strata serve`: options, the API key (flag, file or environment), signal handling
 * (SIGINT/SIGTERM taken synchronously by the main thread, then a clean server_stop), the ready
 * line with the URL, and a notice when the server is reachable from the network. Kept apart
 * from server.c so the library's server can be linked without main.c (cli_default_model_dir). */
#include <ctype.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>

#include "cli.h"
#include "api/guard.h"
#include "api/server.h"

/* "123", "512M", "8G", "1.5GiB", "64KB" (powers of 1024) -> bytes; -1 if malformed or zero. */
static int parse_size(const char *v, size_t *out) {
    char *end;
    errno = 0;
    const double x = strtod(v, &end);
    if (errno || end == v || !(x > 0)) return -1;
    double mul = 1;
    const char *units = "KMGT", *u = *end ? strchr(units, toupper((unsigned char)*end)) : NULL;
    if (u) {
        for (const char *k = units; k <= u; k++) mul *= 1024;
        end++;
        if (*end == 'i') end++;
        if (*end == 'B' || *end == 'b') end++;
    }
    if (*end || x * mul > 1e18) return -1;
    *out = (size_t)(x * mul);
    return *out ? 0 : -1;
}

static void serve_usage(FILE *f) {
    fprintf(f, "usage: strata serve [[--model] DIR] [--host 127.0.0.1] [--port 8080] [--ctx N]\n"
               "                    [--api-key-file PATH | --api-key KEY] (or STRATA_API_KEY)\n"
               "                    [--backend cpu|cuda|auto] [--threads N]\n"
               "                    [--alias NAME] [--queue N] [--max-body BYTES] [--quiet]\n"
               "                    [--parallel N]  (requests generated at once, batched; default\n"
               "                    as many as the prefix cache's sequences, at most 64)\n"
               "                    [--log-format text|json]  (a line per request on stderr)\n"
               "                    [--no-prefix-cache] [--cache-mem SIZE]  (bytes, or 512M, 8G: the\n"
               "                    prefix cache's memory; default half the device memory left)\n"
               "                    [--cors-origin ORIGIN]... [--allowed-host NAME]...\n"
               "                    [--max-connections N] [--max-per-client N]\n"
               "                    [--header-timeout S] [--body-timeout S] [--stream-timeout S]\n"
               "                    [--tokenizer-dir DIR]  (tokenizer.json + template; default --model)\n"
               "                    [--test-forced-output]  (tests: accept strata_forced_output)\n");
}

/* The key file's first line, without its line ending; NULL + message when unusable. */
static char *read_key_file(const char *path) {
    struct error err;
    size_t n;
    char *s = read_file(path, &n, &err);
    if (!s) {
        fprintf(stderr, "strata serve: --api-key-file: %s\n", err.msg);
        return NULL;
    }
    size_t k = strcspn(s, "\r\n");
    if (s[k] && s[k + strspn(s + k, "\r\n")]) {
        fprintf(stderr, "strata serve: --api-key-file %s: more than one line\n", path);
        free(s);
        return NULL;
    }
    s[k] = 0;
    if (k == 0 || strlen(s) != k) {
        fprintf(stderr, "strata serve: --api-key-file %s: %s\n", path, k ? "holds a NUL byte" : "is empty");
        free(s);
        return NULL;
    }
    return s;
}

int cmd_serve(int argc, char **argv) {
    struct server_options o = {0};
    o.port = 8080;
    const char **cors = xcalloc((size_t)argc + 1, sizeof *cors);
    const char **hosts = xcalloc((size_t)argc + 1, sizeof *hosts);
    char *key = NULL, *key_file = NULL;
    int rc = 2, n_key_sources = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int bad = 0;
        if (!strcmp(a, "--model") && v) o.model_dir = v, i++;
        else if (!strcmp(a, "--host") && v) o.host = v, i++;
        else if (!strcmp(a, "--tokenizer-dir") && v) o.tokenizer_dir = v, i++;
        else if (!strcmp(a, "--port") && v) bad = cli_int("serve", a, v, 0, 65535, &o.port), i++;
        else if (!strcmp(a, "--ctx") && v) bad = cli_int("serve", a, v, 1, 1 << 24, &o.model.ctx), i++;
        else if (!strcmp(a, "--threads") && v) bad = cli_int("serve", a, v, 1, 4096, &o.model.n_threads), i++;
        else if (!strcmp(a, "--api-key") && v) {
            /* on the command line the key shows in /proc/PID/cmdline and `ps`: take a copy and
             * blank the argument (what is left is the window until here; prefer a file) */
            free(key);
            key = xstrdup(v);
            memset(argv[i + 1], 'x', strlen(argv[i + 1]));
            n_key_sources++;
            i++;
        } else if (!strcmp(a, "--api-key-file") && v) key_file = argv[++i], n_key_sources++;
        else if (!strcmp(a, "--alias") && v) o.model_name = v, i++;
        else if (!strcmp(a, "--queue") && v) bad = cli_int("serve", a, v, 1, 1 << 20, &o.queue_max), i++;
        else if (!strcmp(a, "--parallel") && v) bad = cli_int("serve", a, v, 1, 64, &o.parallel), i++;
        else if (!strcmp(a, "--max-body") && v) o.max_body_bytes = strtoull(v, NULL, 10), i++;
        else if (!strcmp(a, "--cors-origin") && v) cors[o.n_cors_origins++] = v, i++;
        else if (!strcmp(a, "--allowed-host") && v) hosts[o.n_allowed_hosts++] = v, i++;
        else if (!strcmp(a, "--max-connections") && v) bad = cli_int("serve", a, v, 1, 1000000, &o.max_connections), i++;
        else if (!strcmp(a, "--max-per-client") && v) bad = cli_int("serve", a, v, 1, 1000000, &o.max_per_client), i++;
        else if (!strcmp(a, "--header-timeout") && v) bad = cli_int("serve", a, v, 1, 86400, &o.header_timeout_s), i++;
        else if (!strcmp(a, "--body-timeout") && v) bad = cli_int("serve", a, v, 1, 86400, &o.body_timeout_s), i++;
        else if (!strcmp(a, "--stream-timeout") && v) bad = cli_int("serve", a, v, 1, 86400, &o.stream_timeout_s), i++;
        else if (!strcmp(a, "--quiet")) o.quiet = 1;
        else if (!strcmp(a, "--log-format") && v) {
            if (strcmp(v, "text") && strcmp(v, "json")) {
                fprintf(stderr, "strata serve: --log-format '%s': expected text or json\n", v);
                goto out;
            }
            o.log_json = !strcmp(v, "json");
            i++;
        }
        else if (!strcmp(a, "--test-forced-output")) o.allow_forced_output = 1;
        else if (!strcmp(a, "--no-prefix-cache")) o.no_prefix_reuse = 1;
        else if (!strcmp(a, "--cache-mem") && v) {
            if (parse_size(v, &o.cache_bytes) != 0) {
                fprintf(stderr, "strata serve: --cache-mem '%s': expected a size such as 8G, 512M or "
                                "a byte count\n", v);
                return 2;
            }
            i++;
        }
        else if (!strcmp(a, "--backend") && v) {
            if (!strcmp(v, "cpu")) o.model.backend = BACKEND_CPU;
            else if (!strcmp(v, "cuda")) o.model.backend = BACKEND_CUDA;
            else if (!strcmp(v, "auto")) o.model.backend = BACKEND_AUTO;
            else {
                fprintf(stderr, "strata serve: unknown backend '%s' (cpu, cuda, auto)\n", v);
                goto out;
            }
            i++;
        } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            serve_usage(stdout);
            rc = 0;
            goto out;
        } else if (a[0] != '-' && !o.model_dir) {
            o.model_dir = a; /* strata serve DIR */
        } else {
            fprintf(stderr, "strata serve: unknown or incomplete option '%s'\n", a);
            serve_usage(stderr);
            goto out;
        }
        if (bad) goto out;
    }
    if (n_key_sources > 1) {
        fprintf(stderr, "strata serve: give the API key once (--api-key-file or --api-key)\n");
        goto out;
    }
    if (key_file) {
        free(key);
        if (!(key = read_key_file(key_file))) goto out;
    } else if (!key && getenv("STRATA_API_KEY") && *getenv("STRATA_API_KEY")) {
        key = xstrdup(getenv("STRATA_API_KEY"));
    }
    if (key && strlen(key) > SERVER_API_KEY_MAX) {
        fprintf(stderr, "strata serve: the API key is longer than %d bytes\n", SERVER_API_KEY_MAX);
        goto out;
    }
    o.api_key = key;
    o.cors_origins = cors;
    o.allowed_hosts = hosts;
    /* Signals are taken synchronously by this thread only: block them before any thread
     * starts so every thread inherits the mask. SIGPIPE: a vanished client is a write error. */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);

    if (!o.model_dir) o.model_dir = cli_default_model_dir();
    struct error err;
    double t0 = now_ms();
    struct server *s = server_start(&o, &err);
    if (!s) {
        fprintf(stderr, "strata serve: %s\n", err.msg);
        rc = 1;
        goto out;
    }
    const char *h = o.host ? o.host : "127.0.0.1";
    int v6 = strchr(h, ':') != NULL;
    if (!guard_listen_is_loopback(h)) {
        char note[512]; /* said even with --quiet */
        snprintf(note, sizeof note, "NOTE: listening on %s: reachable from the network, not only "
                 "from this machine; %s", h,
                 key ? "an API key is set (clients send Authorization: Bearer KEY)"
                     : "NO API KEY is set: anyone who reaches this port can use the model (set one "
                       "with --api-key-file PATH or STRATA_API_KEY)");
        if (o.quiet) fprintf(stderr, "strata serve: %s\n", note);
        else server_logf(s, "%s\n", note);
    }
    printf("strata serve: model %s (%s backend, context %d, loaded in %.0f ms) listening on "
           "http://%s%s%s:%d\n",
           server_model_name(s), model_backend(server_model(s))->ops->name,
           model_ctx(server_model(s)), now_ms() - t0, v6 ? "[" : "",
           h, v6 ? "]" : "", server_port(s));
    fflush(stdout);
    int sig = 0;
    sigwait(&set, &sig);
    server_logf(s, "%s, shutting down\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
    server_stop(s);
    rc = 0;
out:
    if (key) memset(key, 0, strlen(key));
    free(key);
    free(cors);
    free(hosts);
    return rc;
}
