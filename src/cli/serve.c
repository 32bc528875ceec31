/* serve.c - `strata serve`: options, signal handling (SIGINT/SIGTERM taken synchronously
 * by the main thread, then a clean server_stop), the ready line with the URL. Kept apart from
 * server.c so the library's server can be linked without main.c (cli_default_model_dir). */
#include <ctype.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>

#include "cli.h"
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
    fprintf(f, "usage: strata serve [--model DIR] [--host 127.0.0.1] [--port 8080] [--ctx N]\n"
               "                    [--api-key KEY] [--backend cpu|cuda|auto] [--threads N]\n"
               "                    [--alias NAME] [--queue N] [--max-body BYTES] [--quiet]\n"
               "                    [--no-prefix-cache] [--cache-mem SIZE]  (bytes, or 512M, 8G: the\n"
               "                    prefix cache's memory; default half the device memory left)\n"
               "                    [--tokenizer-dir DIR]  (tokenizer.json + template; default --model)\n"
               "                    [--test-forced-output]  (tests: accept strata_forced_output)\n");
}

int cmd_serve(int argc, char **argv) {
    struct server_options o = {0};
    o.port = 8080;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--model") && v) o.model_dir = v, i++;
        else if (!strcmp(a, "--host") && v) o.host = v, i++;
        else if (!strcmp(a, "--tokenizer-dir") && v) o.tokenizer_dir = v, i++;
        else if (!strcmp(a, "--port") && v) o.port = atoi(v), i++;
        else if (!strcmp(a, "--ctx") && v) o.model.ctx = atoi(v), i++;
        else if (!strcmp(a, "--threads") && v) o.model.n_threads = atoi(v), i++;
        else if (!strcmp(a, "--api-key") && v) o.api_key = v, i++;
        else if (!strcmp(a, "--alias") && v) o.model_name = v, i++;
        else if (!strcmp(a, "--queue") && v) o.queue_max = atoi(v), i++;
        else if (!strcmp(a, "--max-body") && v) o.max_body_bytes = strtoull(v, NULL, 10), i++;
        else if (!strcmp(a, "--quiet")) o.quiet = 1;
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
                return 2;
            }
            i++;
        } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            serve_usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "strata serve: unknown or incomplete option '%s'\n", a);
            serve_usage(stderr);
            return 2;
        }
    }
    if (o.port < 0 || o.port > 65535) {
        fprintf(stderr, "strata serve: --port must be 0..65535\n");
        return 2;
    }
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
        return 1;
    }
    const char *h = o.host ? o.host : "127.0.0.1";
    int v6 = strchr(h, ':') != NULL;
    printf("strata serve: model %s (%s backend, context %d, loaded in %.0f ms) listening on "
           "http://%s%s%s:%d\n",
           server_model_name(s), model_backend(server_model(s))->ops->name,
           model_ctx(server_model(s)), now_ms() - t0, v6 ? "[" : "",
           h, v6 ? "]" : "", server_port(s));
    fflush(stdout);
    int sig = 0;
    sigwait(&set, &sig);
    if (!o.quiet) fprintf(stderr, "strata serve: %s, shutting down\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
    server_stop(s);
    return 0;
}
