/* fuzz_request.c - request bodies of every route, through validation to the rendered and
 * tokenized prompt, on the demo model's tokenizer and template (the model itself is loaded for
 * its context and vocabulary; nothing is generated). The first byte picks the route, the rest
 * is the body:
 *   0 /v1/chat/completions   1 /v1/completions   2 /tokenize   3 /detokenize
 *   4 the text quoted into an error message (api_quote), and the Host / Origin / Content-Type
 *     guards on it as a header value
 *   'O' /api/chat, 'G' /api/generate, 'S' /api/show (Ollama's API: ollama.c), bytes outside
 *     0..4 so the older seeds keep their routes
 * Properties: a refused body gets a 4xx status and an error that encodes as JSON (a 500 from a
 * message quoting client bytes is a failure); an accepted one has a prompt that fits the
 * context; responses encode as JSON; quoted text is valid UTF-8 and fits its buffer. */
#include "fuzz.h"

#include <jansson.h>
#include <pthread.h>

#include "api/guard.h"
#include "api/ollama.h"
#include "api/openai.h"
#include "model/model.h"
#include "text/chat.h"
#include "text/tokenizer.h"

static struct model *model;
static struct tokenizer *tok;
static struct chat_template tmpl;
static uint64_t rng = 1;
static pthread_mutex_t rng_mu = PTHREAD_MUTEX_INITIALIZER;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    struct error err;
    char path[1024];
    snprintf(path, sizeof path, "%s/tokenizer.json", fuzz_model_dir());
    tok = tokenizer_load(path, &err);
    FUZZ_CHECK(tok, "%s (run from the repository root)", err.msg);
    FUZZ_CHECK(chat_template_load(&tmpl, fuzz_model_dir(), &err) == 0, "%s", err.msg);
    struct model_options mo = {.backend = BACKEND_CPU, .ctx = 512, .n_threads = 1, .quiet = 1};
    model = model_load(fuzz_model_dir(), &mo, &err);
    FUZZ_CHECK(model, "%s", err.msg);
    return 0;
}

static void check_error(const struct api_error *e, const char *what) {
    FUZZ_CHECK(e->status >= 400 && e->status < 500, "%s: status %d (%s)", what, e->status, e->message);
    json_t *j = api_error_json(e);
    char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
    FUZZ_CHECK(s, "%s: the error does not encode as JSON: %s", what, e->message);
    free(s);
    json_decref(j);
}

static void check_encodes(json_t *v, const char *what) {
    char *s = json_dumps(v, JSON_COMPACT);
    FUZZ_CHECK(s, "%s: the response does not encode as JSON", what);
    free(s);
    json_decref(v);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const char *body = (const char *)data + 1;
    size_t n = size - 1;
    struct api_error e;
    memset(&e, 0, sizeof e);
    if (data[0] == 'O' || data[0] == 'G' || data[0] == 'S') {
        struct ollama_model om = {"demo", fuzz_model_dir(), NULL, model, 0};
        if (data[0] == 'S') {
            json_t *r = ollama_show(&om, body, n, &e);
            if (r) check_encodes(r, "ollama show");
            else FUZZ_CHECK(e.ollama && (e.status == 400 || e.status == 404), "show: %d", e.status);
            return 0;
        }
        json_t *now = NULL;
        char note[256];
        struct job *j = ollama_job_new(&om, tok, &tmpl, data[0] == 'G', body, n, &rng, &rng_mu, 1,
                                       &now, note, sizeof note, &e);
        if (now) {
            FUZZ_CHECK(!j, "a job and an immediate answer");
            check_encodes(now, "ollama load");
        } else if (!j) {
            FUZZ_CHECK(e.ollama, "ollama: an error not in Ollama's shape");
            check_error(&e, data[0] == 'G' ? "ollama generate" : "ollama chat");
        } else {
            FUZZ_CHECK(j->n_ids > 0 && j->n_ids < model_ctx(model), "ollama prompt of %d tokens", j->n_ids);
            FUZZ_CHECK(j->proto && j->proto_state, "ollama job without its framing");
            api_job_free(j);
        }
        return 0;
    }
    switch (data[0] % 5) {
    case 0:
    case 1: {
        int chat = data[0] % 5 == 0;
        struct job *j = api_job_new(model, tok, &tmpl, "demo", chat, body, n, &rng, &rng_mu, 1, &e);
        if (!j) {
            check_error(&e, chat ? "chat" : "completions");
            break;
        }
        FUZZ_CHECK(j->n_ids > 0 && j->n_ids < model_ctx(model), "prompt of %d tokens", j->n_ids);
        for (int i = 0; i < j->n_ids; i++)
            FUZZ_CHECK(j->ids[i] >= 0 && j->ids[i] < tokenizer_vocab_size(tok), "prompt id %d", j->ids[i]);
        api_job_free(j);
        break;
    }
    case 2:
    case 3: {
        json_t *r = data[0] % 5 == 2 ? api_tokenize(tok, body, n, &e) : api_detokenize(tok, body, n, &e);
        if (r) check_encodes(r, "tokenize/detokenize");
        else check_error(&e, "tokenize/detokenize");
        break;
    }
    case 4: {
        char q[96];
        size_t max_chars = n ? (unsigned char)body[0] % 40 : 0;
        api_quote(q, sizeof q, body, n, max_chars);
        size_t ql = strlen(q);
        FUZZ_CHECK(ql < sizeof q && utf8_validate(q, ql, NULL) == 0, "api_quote gave bad UTF-8");
        /* as header values (NUL-terminated) */
        char *h = malloc(n + 1);
        memcpy(h, body, n);
        h[n] = 0;
        const char *names[] = {"myhost.test"}, *origins[] = {"https://app.example"};
        (void)guard_host_ok(h, names, 1);
        (void)guard_origin_ok(h, "127.0.0.1:8080", origins, 1);
        (void)guard_origin_ok(h, h, origins, 0);
        (void)guard_json_type(h);
        free(h);
        break;
    }
    }
    return 0;
}
