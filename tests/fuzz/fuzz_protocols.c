/* fuzz_protocols.c - the Responses and Anthropic Messages protocols (responses.c, anthropic.c):
 * a request body through validation and the conversion to chat messages to the tokenized
 * prompt, and, when it is accepted, a generated text framed as that protocol's response. On the
 * demo model's tokenizer and template; nothing is generated (the text stands in for the model's).
 * Input: byte 0 picks the route and the path (bits 0-1: 0 /v1/responses, 1 /v1/messages,
 * 2 /v1/messages/count_tokens; bit 2: streamed, else the non-streaming object; bit 3: the
 * engine stopped at max_tokens; bit 4: the stream fails half way), then the body up to the first
 * NUL byte, then the generated text (its bad UTF-8 bytes made '?': the engine's text is UTF-8).
 * Properties: a refused body gets a 4xx and an error that encodes as JSON in the route's shape;
 * an accepted one has a prompt that fits the context; a non-streaming response encodes; a stream
 * is a run of "event: T\ndata: {JSON with type T}\n\n" events, Responses' numbered 0, 1, 2, ...
 * and ended by response.completed / response.incomplete / response.failed, Anthropic's by
 * message_stop (or an error event), with every content block started and stopped in order. */
#include "fuzz.h"

#include <jansson.h>
#include <pthread.h>

#include "api/anthropic.h"
#include "api/openai.h"
#include "api/responses.h"
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

static void check_error(const struct api_error *e, int anthropic, const char *what) {
    FUZZ_CHECK(e->status >= 400 && e->status < 500, "%s: status %d (%s)", what, e->status, e->message);
    json_t *j = anthropic ? anthropic_error_json(e) : api_error_json(e);
    char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
    FUZZ_CHECK(s, "%s: the error does not encode as JSON: %s", what, e->message);
    if (anthropic)
        FUZZ_CHECK(!strcmp(json_string_value(json_object_get(j, "type")), "error") &&
                       json_is_string(json_object_get(json_object_get(j, "error"), "message")),
                   "%s: not Anthropic's error shape: %s", what, s);
    free(s);
    json_decref(j);
}

static void on_piece(void *user, const struct chat_delta *d) {
    struct job *j = user;
    j->proto->delta(j, d);
}

/* The stream's events, checked one by one. */
static void check_stream(const struct job *j, int anthropic, int failed) {
    const char *p = j->out.s ? j->out.s : "";
    int seq = 0, open_block = -1, n_blocks = 0;
    char last[64] = "";
    while (*p) {
        FUZZ_CHECK(!strncmp(p, "event: ", 7), "an event does not start with 'event: ': %.80s", p);
        const char *nl = strchr(p, '\n');
        FUZZ_CHECK(nl && nl - p - 7 < (long)sizeof last, "event line");
        snprintf(last, sizeof last, "%.*s", (int)(nl - p - 7), p + 7);
        FUZZ_CHECK(!strncmp(nl + 1, "data: ", 6), "no data line after event %s", last);
        const char *data = nl + 7, *end = strstr(data, "\n\n");
        FUZZ_CHECK(end, "event %s is not ended by a blank line", last);
        json_error_t je;
        json_t *v = json_loadb(data, (size_t)(end - data), JSON_ALLOW_NUL, &je); /* a NUL the model wrote is \u0000 */
        FUZZ_CHECK(json_is_object(v), "event %s: data is not a JSON object (%s)", last, je.text);
        const char *type = json_string_value(json_object_get(v, "type"));
        FUZZ_CHECK(type && !strcmp(type, last), "event %s has data type %s", last, type ? type : "?");
        if (!anthropic) {
            FUZZ_CHECK(json_integer_value(json_object_get(v, "sequence_number")) == seq,
                       "event %s: sequence_number %lld, expected %d", last,
                       (long long)json_integer_value(json_object_get(v, "sequence_number")), seq);
            seq++;
        } else if (!strcmp(type, "content_block_start") || !strcmp(type, "content_block_delta") ||
                   !strcmp(type, "content_block_stop")) {
            int idx = (int)json_integer_value(json_object_get(v, "index"));
            if (!strcmp(type, "content_block_start")) {
                FUZZ_CHECK(open_block < 0 && idx == n_blocks, "block %d started out of order", idx);
                open_block = idx;
            } else {
                FUZZ_CHECK(idx == open_block, "%s for block %d, open %d", type, idx, open_block);
                if (!strcmp(type, "content_block_stop")) open_block = -1, n_blocks++;
            }
        }
        json_decref(v);
        p = end + 2;
    }
    if (!anthropic)
        FUZZ_CHECK(failed ? !strcmp(last, "response.failed")
                          : !strcmp(last, "response.completed") || !strcmp(last, "response.incomplete"),
                   "the stream ends with %s", last);
    else
        FUZZ_CHECK(failed ? !strcmp(last, "error") : !strcmp(last, "message_stop") && open_block < 0,
                   "the stream ends with %s (block %d open)", last, open_block);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const int route = data[0] & 3, stream = data[0] & 4, length = data[0] & 8, fail = data[0] & 16;
    const char *body = (const char *)data + 1;
    const char *nul = memchr(body, 0, size - 1);
    const size_t n = nul ? (size_t)(nul - body) : size - 1;
    struct api_error e;
    memset(&e, 0, sizeof e);
    if (route == 2 || route == 3) {
        json_t *r = anthropic_count_tokens(tok, &tmpl, body, n, &e);
        if (!r) {
            check_error(&e, 1, "count_tokens");
            return 0;
        }
        FUZZ_CHECK(json_integer_value(json_object_get(r, "input_tokens")) > 0, "input_tokens");
        json_decref(r);
        return 0;
    }
    const int anthropic = route == 1;
    struct job *j = (anthropic ? anthropic_job_new : responses_job_new)(
        model, tok, &tmpl, "demo", body, n, &rng, &rng_mu, 1, &e);
    if (!j) {
        check_error(&e, anthropic, anthropic ? "messages" : "responses");
        return 0;
    }
    FUZZ_CHECK(j->n_ids > 0 && j->n_ids < model_ctx(model), "prompt of %d tokens", j->n_ids);

    /* the generated text, valid UTF-8 */
    size_t tl = nul ? size - 1 - n - 1 : 0;
    char *text = malloc(tl + 1);
    if (tl) memcpy(text, nul + 1, tl);
    text[tl] = 0;
    for (size_t i = 0; i < tl;) {
        int k = utf8_char_len(text + i, tl - i);
        if (k <= 0) text[i++] = '?';
        else i += (size_t)k;
    }
    strbuf_add(&j->text, text, tl);
    j->res.n_prompt = j->n_ids;
    j->res.n_generated = (int)(tl / 3) + 1;
    j->res.finish = length ? ENGINE_FINISH_LENGTH : ENGINE_FINISH_STOP;
    j->res.stop_index = -1;
    j->res.stop_token = -1;
    if (stream) {
        j->stream = 1;
        struct chat_stream *cs = chat_stream_new(j->in_thinking, j->tools, NULL, on_piece, j);
        size_t half = fail ? tl / 2 : tl;
        while (half < tl && ((unsigned char)text[half] & 0xC0) == 0x80) half++; /* a character boundary */
        /* pieces of whole characters, as the engine releases text */
        for (size_t i = 0; i < half;) {
            size_t k = i;
            while (k < half && k - i < 7) k += (size_t)utf8_char_len(text + k, tl - k);
            if (k > half) k = half;
            chat_stream_push(cs, text + i, k - i);
            i = k;
        }
        if (fail) {
            api_job_fail(j, 500, "the engine failed");
        } else {
            chat_stream_finish(cs);
            j->cs = cs; /* what api_job_run leaves for the proto's finish */
            cs = NULL;
            j->proto->finish(j);
        }
        if (cs) chat_stream_free(cs);
        check_stream(j, anthropic, fail);
    } else {
        int status = 0;
        json_t *r = api_job_response(j, &status);
        char *s = r ? json_dumps(r, JSON_COMPACT) : NULL;
        FUZZ_CHECK(s && status == 200, "the response does not encode as JSON (status %d)", status);
        free(s);
        json_decref(r);
    }
    free(text);
    api_job_free(j);
    return 0;
}
