/* responses.h - OpenAI's Responses API (POST /v1/responses), stateless, on the chat path: the
 * request's input items become chat messages, the job runs as a chat job, and its output is
 * framed as Responses output items and events (responses.c). */
#ifndef STRATA_API_RESPONSES_H
#define STRATA_API_RESPONSES_H

#include "openai.h"

/* Parses and validates a Responses body and turns it into a chat job whose proto frames the
 * Responses events and object. NULL + e (an OpenAI-shaped 400 naming the field) on a bad
 * request. Arguments as api_job_new's. */
struct job *responses_job_new(struct model *m, struct tokenizer *tok,
                              const struct chat_template *tmpl, const char *model_name,
                              const char *body, size_t len, uint64_t *rng, pthread_mutex_t *rng_mu,
                              int allow_forced, struct api_error *e);

#endif
