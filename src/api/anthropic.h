/* anthropic.h - Anthropic's Messages API (POST /v1/messages, /v1/messages/count_tokens) on the
 * chat path: the request's messages and content blocks become chat messages, the job runs as a
 * chat job, and its output is framed as Anthropic content blocks and events (anthropic.c). */
#ifndef STRATA_API_ANTHROPIC_H
#define STRATA_API_ANTHROPIC_H

#include "openai.h"

/* Parses and validates a Messages body and turns it into a chat job whose proto frames
 * Anthropic's events and message object. NULL + e (a 400; send it with anthropic_error_json) on
 * a bad request. Arguments as api_job_new's. */
struct job *anthropic_job_new(struct model *m, struct tokenizer *tok,
                              const struct chat_template *tmpl, const char *model_name,
                              const char *body, size_t len, uint64_t *rng, pthread_mutex_t *rng_mu,
                              int allow_forced, struct api_error *e);

/* POST /v1/messages/count_tokens: {"input_tokens": N}, the prompt the same body would give. */
json_t *anthropic_count_tokens(struct tokenizer *tok, const struct chat_template *tmpl,
                               const char *body, size_t len, struct api_error *e);

/* e in Anthropic's shape: {"type":"error","error":{"type","message"}}, the type from the HTTP
 * status (invalid_request_error, authentication_error, not_found_error, ...). */
json_t *anthropic_error_json(const struct api_error *e);

#endif
