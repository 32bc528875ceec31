/* cache.h - the prefix cache: token prefixes of earlier requests -> model state to resume from.
 *
 * Entries are the model's sequences (model_seq: KV rows + DeltaNet states) with the tokens each
 * holds, and checkpoints of their DeltaNet states at chosen positions (model_ckpt). For a new
 * prompt the cache finds, over every sequence, the longest token prefix shared with what that
 * sequence holds, and the latest point at or before it it can resume from: the sequence's live
 * state (the prompt extends everything it holds) or a checkpoint. Resuming at a checkpoint cuts
 * the sequence back to it; when the sequence holds more than the shared prefix (another
 * conversation's continuation, a reply whose reasoning the chat template drops), the cache
 * forks the prefix into another sequence instead (copying its KV rows), so the first stays
 * cached. Sequences and checkpoints are taken from pools sized from a memory budget at creation
 * and reused least-recently-used first: the cache never holds more than its budget.
 *
 * Checkpoints are taken while a prompt is fed: at the first message boundary past the resume
 * point (the end of a system prompt and its tools) and the last two (the start of the final
 * turns: where the next request of a thinking conversation parts from this one), every
 * `every` tokens, and at the end of the prompt with its logits (an identical re-send needs no
 * forward pass). A message boundary is a position whose token is the chat template's
 * <|im_start|>. The live state of a sequence is the checkpoint at the end of its generation.
 *
 * Knows the model's sequence / checkpoint API and token ids; nothing of HTTP or chat formats. */
#ifndef STRATA_ENGINE_CACHE_H
#define STRATA_ENGINE_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "model/model.h"
#include "util.h"

struct cache_params {
    size_t budget_bytes; /* sequences beyond the model's first + checkpoints; 0: the default */
    int every;           /* tokens between checkpoints inside a long prompt; 0: the default */
    int32_t boundary_id; /* the message-start token (<|im_start|>), or -1 */
};

/* Counters since creation (the server's /metrics). */
struct cache_stats {
    long hits, misses;             /* requests that resumed after >= 1 token / from nothing */
    long tokens_reused, tokens_fed; /* prompt tokens resumed / prefilled */
    long evictions;                /* checkpoints and sequences reused for other prefixes */
    long ckpts_taken;
    size_t bytes_held;             /* of the pools' entries that hold a prefix now */
    size_t budget_bytes;           /* the pools' memory (allocated at creation) */
    int n_seqs, n_ckpts;           /* pool sizes */
};

#define CACHE_DEFAULT_EVERY 4096

struct cache;

struct cache *cache_create(struct model *m, const struct cache_params *p);
void cache_free(struct cache *c);

/* The default budget: half of the backend memory free after the model loaded, or a sixteenth of
 * the machine's memory where the backend does not say (the CPU). */
size_t cache_default_budget(struct model *m);

/* Makes the model's current sequence hold the longest prefix of prompt[0..n) the cache can
 * resume, and returns its length r (0 <= r <= n; r == n only with the logits of the prompt's
 * last token current). The caller then feeds prompt[r..n) with cache_feed_prompt. */
int cache_prepare(struct cache *c, const int32_t *prompt, int n);

/* Feeds prompt[r..n) into the current sequence, taking checkpoints on the way, and computes
 * the last token's logits. `cancel` (may be NULL) is checked between pieces: a cancelled feed
 * returns 1 with the tokens fed so far recorded (the state holds exactly those). 0: done; -1:
 * error (err set). */
int cache_feed_prompt(struct cache *c, const int32_t *prompt, int n, int r,
                      int (*cancel)(void *), void *cancel_arg, struct error *err);

/* The same in steps, so that a long prompt can be fed between the decode steps of others:
 * cache_feed_begin plans the checkpoints of the current slot's feed (claiming them);
 * cache_feed_some (with that slot current) feeds the next piece of at most max_tokens (0: no
 * limit; rounded down to the backend's checkpoint alignment, cache_align) and returns 1 while
 * tokens are left, 0 when the prompt is in with its logits (the end checkpoint taken), -1 on
 * error (the sequence forgotten); cache_feed_abort gives back what it claimed and did not fill
 * (a cancel: the state holds the pieces fed, recorded). */
void cache_feed_begin(struct cache *c, const int32_t *prompt, int n, int r);
int cache_feed_some(struct cache *c, int max_tokens, struct error *err);
void cache_feed_abort(struct cache *c);
int cache_align(const struct cache *c);

/* Slots: the sequences the cache manages, by index. cache_prepare leaves its choice current
 * (cache_slot); a caller running several requests at once pins each request's slot while it
 * runs (never taken, cut back or extended by another prompt; another may fork its prefix) and
 * makes it current (cache_use) before feeding it. At most cache_n_slots - 1 may be pinned when
 * cache_prepare runs. */
int cache_slot(const struct cache *c);
void cache_use(struct cache *c, int slot);
void cache_pin(struct cache *c, int slot, int on);
int cache_n_slots(const struct cache *c);
struct model_seq *cache_seq(const struct cache *c, int slot);

/* A token the model state took after the prompt (generation): of the current slot, or of
 * `slot`. */
void cache_push(struct cache *c, int32_t id);
void cache_push_to(struct cache *c, int slot, int32_t id);

/* The tokens the current sequence holds. */
int cache_tokens(const struct cache *c, const int32_t **ids);

/* Forgets everything but the pinned slots (their sequences and checkpoints stay). */
void cache_clear(struct cache *c);

void cache_get_stats(const struct cache *c, struct cache_stats *out);

#endif
