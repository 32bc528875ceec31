/* main.c - the strata command line: dispatches subcommands and implements `run` and `info`. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "text/chat.h"
#include "cli.h"
#include "engine/engine.h"
#include "model/model.h"
#include "text/tokenizer.h"

#define STRATA_VERSION "0.17 (2026-12-01)" /* the development session that made it */

static void usage(FILE *f) {
    fprintf(f,
            "usage: strata <command> [options]\n"
            "commands:\n"
            "  serve     OpenAI-compatible HTTP server (default: the bundled demo model)\n"
            "  run       generate: strata run [--model DIR] (--prompt TEXT [--chat] | --prompt-ids \"1 2 3\")\n"
            "            [-n 32] [--temp T] [--seed S]\n"
            "  bench     llama-bench style measurements: strata bench --model DIR\n"
            "  info      config, parameter count, memory: strata info [--model DIR]\n"
            "  tokenize  text on stdin -> ids (or --decode ids -> text)\n"
            "  render    OpenAI chat request on stdin -> prompt text\n"
            "common options: --model DIR, --backend cpu|cuda, --ctx N, --threads N\n"
            "strata --version; strata COMMAND --help\n");
}

int cli_int(const char *cmd, const char *flag, const char *v, int lo, int hi, int *out) {
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || end == v || *end || x < lo || x > hi) {
        fprintf(stderr, "strata %s: %s must be an integer from %d to %d (got '%s')\n", cmd, flag,
                lo, hi, v);
        return -1;
    }
    *out = (int)x;
    return 0;
}

const char *cli_default_model_dir(void) {
    static char path[PATH_MAX + 16];
    const char *env = getenv("STRATA_DEMO_MODEL");
    if (env && *env) return env;
    /* the demo model sits in demo/ beside build/ in the source tree */
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = 0;
        char *slash = strrchr(exe, '/');
        if (slash) {
            *slash = 0;
            snprintf(path, sizeof path, "%s/../demo", exe);
            if (access(path, R_OK) == 0) return path;
        }
    }
    return "demo";
}

/* --backend cpu|cuda|auto */
static int parse_backend(const char *s, enum backend_kind *out) {
    if (strcmp(s, "cpu") == 0) *out = BACKEND_CPU;
    else if (strcmp(s, "cuda") == 0) *out = BACKEND_CUDA;
    else if (strcmp(s, "auto") == 0) *out = BACKEND_AUTO;
    else return -1;
    return 0;
}

static int parse_ids(const char *s, int32_t **ids_out, int *n_out) {
    int cap = 64, n = 0;
    int32_t *ids = xmalloc((size_t)cap * sizeof *ids);
    while (*s) {
        while (*s == ' ' || *s == ',' || *s == '\t' || *s == '\n') s++;
        if (!*s) break;
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v < 0 || v > INT32_MAX) {
            free(ids);
            return -1;
        }
        if (n == cap) ids = xrealloc(ids, (size_t)(cap *= 2) * sizeof *ids);
        ids[n++] = (int32_t)v;
        s = end;
    }
    *ids_out = ids;
    *n_out = n;
    return 0;
}

/* Streams generated text to stdout as the engine releases it. */
static int run_emit(void *user, const struct engine_event *ev) {
    (void)user;
    if (ev->len) {
        fwrite(ev->text, 1, ev->len, stdout);
        fflush(stdout);
    }
    return 0;
}

/* --chat: the reply parsed as it streams (chat.h): the answer to stdout, the reasoning to stderr
 * (dim on a terminal), so neither <think> tags nor the thinking end up in the answer. */
struct run_chat {
    struct chat_stream *cs;
    int tty, in_reasoning;
};

static void run_chat_delta(void *user, const struct chat_delta *d) {
    struct run_chat *rc = user;
    const int reasoning = d->kind == CHAT_DELTA_REASONING;
    if (rc->in_reasoning && !reasoning) {
        fprintf(stderr, rc->tty ? "\033[0m\n" : "\n");
        rc->in_reasoning = 0;
    }
    switch (d->kind) {
    case CHAT_DELTA_REASONING:
        if (!rc->in_reasoning) fprintf(stderr, rc->tty ? "\033[2mthinking: " : "thinking: ");
        rc->in_reasoning = 1;
        fwrite(d->text, 1, d->len, stderr);
        fflush(stderr);
        break;
    case CHAT_DELTA_CONTENT:
        fwrite(d->text, 1, d->len, stdout);
        break;
    case CHAT_DELTA_TOOL_START:
        printf("[tool call %s] ", d->name);
        break;
    case CHAT_DELTA_TOOL_ARGS:
        fwrite(d->text, 1, d->len, stdout);
        break;
    }
    fflush(stdout);
}

static int run_chat_emit(void *user, const struct engine_event *ev) {
    struct run_chat *rc = user;
    if (ev->len) chat_stream_push(rc->cs, ev->text, ev->len);
    return 0;
}

/* --prompt TEXT: tokenize (after rendering it as one user message with --chat), generate with
 * the engine (sampling, EOS, streaming detokenization), print text as it streams. */
static int run_text(struct model *m, const char *dir, const char *prompt, int chat, int n_gen,
                    const struct sampler_params *sp) {
    char path[4096];
    struct error err;
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    struct tokenizer *tok = tokenizer_load(path, &err);
    if (!tok) {
        fprintf(stderr, "strata run: %s\n", err.msg);
        return 1;
    }
    char *text = NULL;
    int rc = 1;
    int32_t *ids = NULL;
    int n_ids = 0;
    struct engine *e = NULL;
    if (chat) {
        struct chat_template tpl;
        if (chat_template_load(&tpl, dir, &err) < 0) goto fail;
        json_t *req = json_pack("{s:[{s:s,s:s}]}", "messages", "role", "user", "content", prompt);
        int r = chat_render(&tpl, req, &text, &err);
        json_decref(req);
        if (r < 0) goto fail;
    } else {
        text = xstrdup(prompt);
    }
    if (tokenizer_encode(tok, text, strlen(text), &ids, &n_ids, &err) < 0) goto fail;
    e = engine_create(m, tok);
    struct run_chat rchat = {.tty = isatty(2)};
    struct engine_request req = {.prompt = ids, .n_prompt = n_ids, .max_tokens = n_gen,
                                 .sampling = *sp, .emit = run_emit};
    if (chat) {
        rchat.cs = chat_stream_new(chat_prompt_opens_thinking(text), NULL, "call_", run_chat_delta,
                                   &rchat);
        req.emit = run_chat_emit;
        req.user = &rchat;
    }
    struct engine_result res;
    int gen_rc = engine_generate(e, &req, &res, &err);
    if (rchat.cs) {
        chat_stream_finish(rchat.cs);
        chat_stream_free(rchat.cs);
        if (rchat.in_reasoning) fprintf(stderr, rchat.tty ? "\033[0m\n" : "\n");
    }
    if (gen_rc < 0) goto fail;
    printf("\n");
    fprintf(stderr,
            "backend %s | prompt %d tokens, prefill %.2f ms (%.1f tok/s) | generated %d tokens, "
            "decode %.2f tok/s | finish: %s\n",
            model_backend(m)->ops->name, res.timings.prompt_n, res.timings.prompt_ms,
            res.timings.prompt_per_second, res.timings.predicted_n,
            res.timings.predicted_per_second, engine_finish_name(res.finish));
    rc = 0;
fail:
    if (rc) fprintf(stderr, "strata run: %s\n", err.msg);
    if (e) engine_free(e);
    free(ids);
    free(text);
    tokenizer_free(tok);
    return rc;
}

int cmd_run(int argc, char **argv) {
    const char *dir = NULL, *prompt_ids = NULL, *prompt = NULL;
    int n_gen = 32, chat = 0;
    struct model_options opt = {0};
    struct sampler_params sp;
    sampler_params_default(&sp);
    sp.temperature = 0; /* greedy unless --temp is given */
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--model") && v) dir = v, i++;
        else if (!strcmp(a, "--prompt-ids") && v) prompt_ids = v, i++;
        else if (!strcmp(a, "--prompt") && v) prompt = v, i++;
        else if (!strcmp(a, "--chat")) chat = 1;
        else if ((!strcmp(a, "-n") || !strcmp(a, "--n-predict")) && v) {
            if (cli_int("run", a, v, 1, 1 << 30, &n_gen) < 0) return 2;
            i++;
        }
        else if (!strcmp(a, "--temp") && v) sp.temperature = (float)atof(v), i++;
        else if (!strcmp(a, "--seed") && v) sp.seed = strtoull(v, NULL, 10), i++;
        else if (!strcmp(a, "--ctx") && v) {
            if (cli_int("run", a, v, 1, 1 << 24, &opt.ctx) < 0) return 2;
            i++;
        } else if (!strcmp(a, "--threads") && v) {
            if (cli_int("run", a, v, 1, 4096, &opt.n_threads) < 0) return 2;
            i++;
        } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            printf("usage: strata run [[--model] DIR] (--prompt TEXT [--chat] | --prompt-ids \"1 2 3\")\n"
                   "                  [-n 32] [--temp T] [--seed S] [--ctx N] [--threads N]\n"
                   "                  [--backend cpu|cuda|auto]   (greedy unless --temp)\n");
            return 0;
        } else if (!strcmp(a, "--backend") && v) {
            if (parse_backend(v, &opt.backend) < 0) {
                fprintf(stderr, "strata run: unknown backend '%s' (cpu, cuda, auto)\n", v);
                return 2;
            }
            i++;
        } else if (a[0] != '-' && !dir) {
            dir = a; /* strata run DIR */
        } else {
            fprintf(stderr, "strata run: unknown or incomplete option '%s'\n", a);
            return 2;
        }
    }
    if (!dir) dir = cli_default_model_dir();
    if (!prompt_ids == !prompt) {
        fprintf(stderr, "strata run: give either --prompt TEXT or --prompt-ids \"1 2 3\"\n");
        return 2;
    }
    if (n_gen < 1) {
        fprintf(stderr, "strata run: -n must be at least 1\n");
        return 2;
    }
    int32_t *ids = NULL;
    int n_ids = 0;
    if (prompt_ids && (parse_ids(prompt_ids, &ids, &n_ids) < 0 || n_ids == 0)) {
        fprintf(stderr, "strata run: --prompt-ids must be non-negative integers\n");
        free(ids);
        return 2;
    }
    struct error err;
    struct model *m = model_load(dir, &opt, &err);
    if (!m) {
        fprintf(stderr, "strata run: %s\n", err.msg);
        free(ids);
        return 1;
    }
    if (prompt) {
        int rc = run_text(m, dir, prompt, chat, n_gen, &sp);
        model_free(m);
        return rc;
    }
    /* --prompt-ids: greedy on the backend, ids out */
    double t0 = now_ms();
    if (model_prefill(m, ids, n_ids, NULL, &err) < 0) {
        fprintf(stderr, "strata run: %s\n", err.msg);
        model_free(m);
        free(ids);
        return 1;
    }
    const struct config *c = model_config(m);
    const char *finish = "length";
    double t1 = t0;
    int n_done = 0;
    while (n_done < n_gen) {
        /* on a device every token but the last is fed to the next step as it is read
         * (model_step_greedy: that step is queued before the host reads the token) */
        const int last = n_done + 1 == n_gen || model_pos(m) >= model_ctx(m);
        const int ahead = !last && model_async(m);
        const int32_t tok = ahead ? model_step_greedy(m) : model_argmax(m);
        if (n_done == 0) t1 = now_ms(); /* prefill + the first choice read */
        printf(n_done ? " %d" : "%d", tok);
        fflush(stdout);
        n_done++;
        int is_eos = 0;
        for (int e = 0; e < c->n_eos_token_id; e++) is_eos |= tok == c->eos_token_id[e];
        if (is_eos) {
            finish = "stop";
            break;
        }
        if (last) {
            if (n_done < n_gen) finish = "length (context full)";
            break;
        }
        if (!ahead) CHECK(model_step(m, tok) == 0);
    }
    double t2 = now_ms();
    printf("\n");
    fprintf(stderr,
            "backend %s | prompt %d tokens, prefill %.2f ms (%.1f tok/s) | generated %d tokens, "
            "decode %.2f tok/s | finish: %s\n",
            model_backend(m)->ops->name, n_ids, t1 - t0, n_ids / ((t1 - t0) / 1e3), n_done,
            n_done > 1 ? (n_done - 1) / ((t2 - t1) / 1e3) : 0.0, finish);
    model_free(m);
    free(ids);
    return 0;
}

int cmd_info(int argc, char **argv) {
    const char *dir = NULL;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--model") && i + 1 < argc) dir = argv[++i];
        else if (argv[i][0] != '-' && !dir) dir = argv[i]; /* strata info DIR */
        else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            printf("usage: strata info [[--model] DIR]   (config, parameters, weight bytes, KV cache "
                   "per token, DeltaNet state)\n");
            return 0;
        } else {
            fprintf(stderr, "strata info: unknown or incomplete option '%s'\n", argv[i]);
            return 2;
        }
    }
    if (!dir) dir = cli_default_model_dir();
    struct error err;
    struct model_options opt = {.backend = BACKEND_CPU, .quiet = 1, .ctx = 1, .max_T = 1};
    /* Reading sizes needs only the headers, but validating the checkpoint needs a full load;
     * load on the CPU backend with a 1-position context to keep memory to the weights. */
    struct model *m = model_load(dir, &opt, &err);
    if (!m) {
        fprintf(stderr, "strata info: %s\n", err.msg);
        return 1;
    }
    const struct config *c = model_config(m);
    printf("model          %s\n", dir);
    printf("architecture   %s (%s config)\n", c->architecture, c->nested ? "nested text_config" : "flat");
    printf("layers         %d (%d Gated DeltaNet, %d full attention)\n", c->num_hidden_layers,
           c->n_linear_layers, c->n_full_layers);
    printf("layer types    ");
    for (int l = 0; l < c->num_hidden_layers; l++)
        putchar(c->layer_types[l] == LAYER_FULL_ATTENTION ? 'A' : 'L');
    printf("  (L = linear attention, A = full attention)\n");
    printf("hidden_size    %d, intermediate_size %d, vocab_size %d\n", c->hidden_size,
           c->intermediate_size, c->vocab_size);
    printf("attention      %d heads, %d kv heads, head_dim %d, rotary_dim %d, rope_theta %g\n",
           c->num_attention_heads, c->num_key_value_heads, c->head_dim, c->rotary_dim, c->rope_theta);
    printf("deltanet       %d key heads x %d, %d value heads x %d, conv kernel %d\n",
           c->linear_num_key_heads, c->linear_key_head_dim, c->linear_num_value_heads,
           c->linear_value_head_dim, c->linear_conv_kernel_dim);
    printf("embeddings     %s\n", c->tie_word_embeddings ? "tied" : "untied (separate lm_head)");
    printf("max positions  %d\n", c->max_position_embeddings);
    printf("parameters     %lld (%.3f B)\n", (long long)model_n_params(m), model_n_params(m) / 1e9);
    printf("weight bytes   %zu (%.2f GB)\n", model_weight_bytes(m), model_weight_bytes(m) / 1e9);
    printf("skipped        %d tensors (vision tower, mtp head)\n", model_n_skipped(m));
    size_t kv = (size_t)2 * c->num_key_value_heads * c->head_dim * c->n_full_layers * 2;
    size_t gdn = (size_t)c->n_linear_layers *
                 ((size_t)c->linear_num_value_heads * c->linear_key_head_dim *
                      c->linear_value_head_dim * 4 +
                  (size_t)c->conv_dim * c->linear_conv_kernel_dim * 2);
    printf("KV cache       %zu bytes per token (bf16; %.1f MiB at 4096 tokens)\n", kv,
           kv * 4096.0 / (1 << 20));
    printf("DeltaNet state %zu bytes per sequence (%.2f MiB: fp32 recurrent + bf16 conv)\n", gdn,
           gdn / (double)(1 << 20));
    model_free(m);
    return 0;
}

struct command {
    const char *name;
    int (*fn)(int argc, char **argv);
};

static const struct command commands[] = {
    {"run", cmd_run},
    {"info", cmd_info},
    {"render", cmd_render},
    {"tokenize", cmd_tokenize},
    {"serve", cmd_serve},
    {"bench", cmd_bench},
};

int main(int argc, char **argv) {
    if (argc >= 2 && (!strcmp(argv[1], "--version") || !strcmp(argv[1], "-V"))) {
        printf("strata %s\n", STRATA_VERSION);
        return 0;
    }
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof *commands; i++)
        if (!strcmp(argv[1], commands[i].name)) return commands[i].fn(argc - 2, argv + 2);
    fprintf(stderr, "strata: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
