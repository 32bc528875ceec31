/* ollama.h - Ollama's native API beside the OpenAI one: /api/chat and /api/generate (NDJSON
 * streaming, Ollama's default, or one JSON object), /api/tags, /api/show, /api/ps,
 * /api/version. A generation request is converted to the chat (or, with raw, completion)
 * request the OpenAI path validates, renders and runs (openai.h), so both share one engine
 * path; only the framing is Ollama's (struct api_proto). Errors are {"error":"message"}.
 * Internal to the server (server.c, ollama.c and the tests that drive them). */
#ifndef STRATA_API_OLLAMA_H
#define STRATA_API_OLLAMA_H

#include <jansson.h>
#include <pthread.h>
#include <stdint.h>

#include "openai.h"

struct ollama_model {
    const char *name;         /* the server's model name ("demo"); listed as "demo:latest" */
    const char *dir;          /* checkpoint directory (the template is read from tokenizer_dir) */
    const char *tokenizer_dir;
    struct model *model;
    long created;             /* server start, Unix seconds */
};

/* POST /api/chat (is_generate 0) or /api/generate. Returns the job to queue, or NULL with
 * either *immediate (a body to answer with 200 at once: an empty prompt or message list only
 * loads the model, as in Ollama) or e (e->ollama set). note (cap bytes) receives a line for the
 * log when a request was adjusted (num_ctx above the server's context is clamped), else "". */
struct job *ollama_job_new(const struct ollama_model *om, struct tokenizer *tok,
                           const struct chat_template *tmpl, int is_generate, const char *body,
                           size_t len, uint64_t *rng, pthread_mutex_t *rng_mu, int allow_forced,
                           json_t **immediate, char *note, size_t note_cap, struct api_error *e);

json_t *ollama_tags(const struct ollama_model *om);
json_t *ollama_ps(const struct ollama_model *om);
json_t *ollama_version(void);
/* POST /api/show {"model": NAME}: NULL + e (404) for another name. */
json_t *ollama_show(const struct ollama_model *om, const char *body, size_t len,
                    struct api_error *e);
/* The answer for an /api/ route strata does not serve: 501 naming what is missing (pull,
 * embeddings, ...), or 404 for a path Ollama does not have either. e->ollama is set. */
void ollama_unsupported(const char *url, struct api_error *e);

/* The Ollama API level /api/version reports (what clients check features against). */
#define OLLAMA_API_VERSION "0.12.6"

#endif
