/* model.h - a loaded Qwen3.5 text model with its per-sequence state (KV cache for the
 * full-attention layers, conv + recurrent state for the Gated DeltaNet layers), running on one
 * backend. Only model.c knows the layer order. */
#ifndef STRATA_MODEL_H
#define STRATA_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "config.h"
#include "safetensors.h"

enum backend_kind { BACKEND_AUTO = 0, BACKEND_CPU, BACKEND_CUDA };

struct model_options {
    enum backend_kind backend;
    int ctx;        /* context length (positions); 0: max_position_embeddings, or as much of it
                       as the device's memory holds beside the weights */
    int n_threads;  /* CPU threads; 0: default */
    int max_T;      /* tokens per prefill chunk; 0: default 512 */
    int quiet;      /* no progress output */
};

struct model;

/* Loads config.json + safetensors from `dir`, validates every tensor, uploads the weights. */
struct model *model_load(const char *dir, const struct model_options *opt, struct error *err);
void model_free(struct model *m);

const struct config *model_config(const struct model *m);
/* The checkpoint's generation_config.json (present 0 when it has none). */
const struct gen_defaults *model_gen_defaults(const struct model *m);
struct backend *model_backend(struct model *m);
int model_ctx(const struct model *m);      /* positions available */
/* Whether model_step returns before the step has run (a device backend): the caller can do
 * host work while it runs; model_argmax / model_logits wait for it. */
int model_async(const struct model *m);
int model_pos(const struct model *m);      /* tokens in the state so far */
size_t model_weight_bytes(const struct model *m);
int64_t model_n_params(const struct model *m);
int model_n_skipped(const struct model *m); /* vision / mtp tensors ignored at load */

/* Forgets the current sequence: position 0, zero states. */
void model_reset(struct model *m);

/* Sequences. A sequence is the state of one conversation apart from the weights: the KV rows of
 * the full-attention layers (ctx positions each) and the conv + fp32 recurrent state of the
 * DeltaNet layers. The model makes one at load (model_seq_default); more live beside it, up to
 * MODEL_MAX_SEQS, each kept until model_free (a device backend records a decode graph per
 * sequence, bound to its buffers). Prefill and step act on the current sequence. */
struct model_seq;
struct model_seq *model_seq_create(struct model *m); /* NULL when MODEL_MAX_SEQS exist */
size_t model_seq_bytes(const struct model *m);         /* backend memory of one sequence */
struct model_seq *model_seq_default(struct model *m);
int model_n_seqs(const struct model *m);                  /* made so far */
struct model_seq *model_seq_at(struct model *m, int i);   /* the i-th made (0: the default) */
struct model_seq *model_seq_current(struct model *m);
void model_seq_use(struct model *m, struct model_seq *s);
int model_seq_pos(const struct model_seq *s);          /* tokens fed */
/* dst takes src's KV rows [0, n) and position n; its DeltaNet states are then the caller's to
 * set (model_ckpt_restore of a checkpoint of src at n, with dst current). */
void model_seq_fork(struct model *m, struct model_seq *dst, const struct model_seq *src, int n);

/* Checkpoints: a copy of the current sequence's DeltaNet states at its position, taken and
 * restored on the backend (device to device, queued with the forward pass, no host round trip).
 * The KV part needs no copy: rows before the position are never written again, so restoring a
 * checkpoint at p into the sequence it was taken from (or a fork of it to p) cuts it back to p.
 * With logits, the checkpoint also keeps the current logits (those of the token before p, when
 * the last call computed them): resuming there needs no forward pass. */
struct model_ckpt;
size_t model_ckpt_bytes(const struct model *m);
struct model_ckpt *model_ckpt_create(struct model *m);
void model_ckpt_free(struct model *m, struct model_ckpt *ck);
void model_ckpt_take(struct model *m, struct model_ckpt *ck, int with_logits);
/* The current sequence -> ck's position and states (with_logits: and its logits, if it has them). */
void model_ckpt_restore(struct model *m, const struct model_ckpt *ck, int with_logits);
int model_ckpt_pos(const struct model_ckpt *ck);
int model_ckpt_has_logits(const struct model_ckpt *ck);
/* Whether the current logits are those at the current position (the last prefill or step
 * computed them, or a restore brought them). */
int model_logits_current(const struct model *m);

/* After a warm-up that ran every op: the backend prepares what it would otherwise do on the
 * first use of a shape (backend_ops.warm). */
void model_warm(struct model *m);

/* Feeds n tokens (any n >= 1, split into chunks internally) and computes the logits of the
 * last one. Fails (-1, err) if pos + n exceeds the context. If all_logits is non-NULL it
 * receives the logits of every position as float (n, vocab_size). */
int model_prefill(struct model *m, const int32_t *ids, int n, float *all_logits,
                  struct error *err);

/* model_prefill that also fills checkpoints partway: ck[i] gets the state after the first at[i]
 * tokens (0 < at[i] <= n, increasing), taken inside the forward calls (no extra pass over the
 * weights). */
int model_prefill_ckpt(struct model *m, const int32_t *ids, int n, struct model_ckpt *const *ck,
                       const int *at, int n_ck, struct error *err);

/* Feeds one token and computes its logits. -1 if the context is full. */
int model_step(struct model *m, int32_t token);

/* Greedy decoding with the choice kept on the device: feeds the greedy choice of the current
 * logits and returns it (-1 if the context is full). After a step, that choice is already on the
 * device: this step is queued behind it before the host has read it, so on a device backend the
 * host never stands between two steps (the same tokens as model_argmax + model_step, which it
 * runs after a prefill; run 77: 4B +0.6%, 0.8B +2.6% against reading each choice back). */
int32_t model_step_greedy(struct model *m);

/* Greedy choice over the current logits (on the backend). */
int32_t model_argmax(struct model *m);

/* Sampling on the backend (backend.h, struct backend_sampling: the processing and the draw).
 * model_sample_begin sets it up for one request: the parameters, the logit bias, the output
 * counts at zero and the prompt's tokens (repetition penalty); it returns 1 when the backend
 * takes these parameters (top_k 1..BACKEND_SAMPLE_KMAX with any top_p / min_p, or no filter at
 * all), 0 when they stay with the host sampler (top_p or min_p over the whole vocabulary,
 * top_k above the limit, temperature 0). Then model_sample draws from the current logits and
 * model_step_sample is model_step_greedy's sampled twin: it feeds the drawn token and returns
 * it, the next draw queued on the device behind it. */
struct model_sampling {
    float temperature, top_p, min_p, presence, frequency, repetition;
    int top_k;
    uint64_t seed;
    const int32_t *bias_ids;
    const float *bias_values;
    int n_bias;
};
int model_sample_begin(struct model *m, const struct model_sampling *p, const int32_t *prompt, int n);
int32_t model_sample(struct model *m);
int32_t model_step_sample(struct model *m);
/* The allowed tokens of the next draws (a grammar's: bit i % 64 of word i / 64), or NULL for
 * all; a draw under a mask is made by model_sample, never run ahead (model_step_sample). */
void model_sample_mask(struct model *m, const uint64_t *mask);

/* Log-probabilities of the current (raw) logits on the backend: *lse = log sum exp, the chosen
 * token's logit, and the k (<= BACKEND_LOGPROBS_KMAX, 20) largest logits with their ids, most
 * likely first (a token's log-probability is its logit - *lse). -1 when the backend has no such
 * op (the caller then reads the logits). */
int model_logprobs(struct model *m, int k, int32_t chosen, float *lse, float *chosen_logit,
                   int32_t *top_ids, float *top_logits);

/* Batched decode (continuous batching): one step over B <= MODEL_MAX_BATCH distinct sequences,
 * seqs[b] taking tokens[b] at its position, in one pass over the weights (the projections and
 * the MLP are matmuls over the B rows; attention and DeltaNet run on each sequence's own state).
 * Each row computes what model_step computes for its sequence alone (bit-identical on the CPU
 * backend, whose matmul sums a row the same way in any batch). Row b's logits stay in the
 * step's rows: model_row_sample (under s's sampling, model_sample_begin with
 * s current; its mask: model_seq_sample_mask) queue row b's choice (model_rows_argmax: the
 * greedy choice of rows 0..B-1 at once, a later model_row_sample replacing row b's), model_row_choices waits and
 * reads the first B; model_row_logits / model_row_logprobs read them for the host. -1 when a
 * sequence's context is full (nothing run). */
#define MODEL_MAX_BATCH 64
int model_step_rows(struct model *m, struct model_seq *const *seqs, const int32_t *tokens, int B);
void model_rows_argmax(struct model *m, int B);
void model_row_sample(struct model *m, int b, struct model_seq *s);
void model_row_choices(struct model *m, int B, int32_t *out);
/* Running ahead (the next batched step queued before the host has read this one's choices):
 * model_rows_post queues the choices of rows 0..B-1 (as model_row_choices reads them) on their
 * way to the host and numbers them; model_rows_wait reads post n (one of the last two), waiting
 * for it but not for the work queued after it. model_step_rows_from is model_step_rows where row
 * b's token, for from[b] >= 0, is the choice of row from[b] of the last batched step as the
 * device holds it (tokens[b] is then not read). */
int64_t model_rows_post(struct model *m, int B);
void model_rows_wait(struct model *m, int64_t n, int B, int32_t *out);
int model_step_rows_from(struct model *m, struct model_seq *const *seqs, const int32_t *tokens,
                         const int *from, int B);
void model_row_logits(struct model *m, int b, float *out);
int model_row_logprobs(struct model *m, int b, int k, int32_t chosen, float *lse,
                       float *chosen_logit, int32_t *top_ids, float *top_logits);
void model_seq_sample_mask(struct model *m, struct model_seq *s, const uint64_t *mask);

/* A mixed step: batched decode rows that ride along the next prefill call, so that a prompt
 * admitted while others decode costs them no pass of its own over the weights (chunked
 * prefill, as vLLM's). model_rows_ride registers seqs / tokens as model_step_rows takes them;
 * the next model_prefill / model_prefill_ckpt runs them in its first call (the matmuls over the
 * rows and the prompt's tokens together; the rows' mixers as model_step_rows', the prompt's as a
 * prefill's), after which they stand exactly as after model_step_rows (row b's logits, the
 * positions advanced). model_rows_rode ends the registration and returns how many rows rode
 * (0: no prefill call ran, or the first call had no room: the caller steps them itself). The
 * rows compute what model_step_rows computes (bit-identical on the CPU backend). */
void model_rows_ride(struct model *m, struct model_seq *const *seqs, const int32_t *tokens, int B);
int model_rows_rode(struct model *m);
long model_n_mixed(const struct model *m); /* prefill calls that carried rows since the load */

/* Copies the current logits as float (vocab_size,). */
void model_logits(struct model *m, float *out);

/* Copies the states of linear-attention layer `layer` (a model layer index):
 * conv (conv_dim, K) as float, the last K inputs oldest first, recurrent (Hv, dk, dv) float.
 * Either may be NULL. */
void model_gdn_state(struct model *m, int layer, float *conv, float *recurrent);

#endif
