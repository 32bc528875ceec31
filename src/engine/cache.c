/* cache.c - the prefix cache (see cache.h): pools of sequences and checkpoints, longest-prefix
 * lookup over the sequences, resume / fork / cut, checkpoint placement while a prompt is fed,
 * least-recently-used reuse of both pools.
 *
 * Cost of a lookup: one pass over each sequence's tokens up to where it parts from the prompt
 * (at most 64 sequences). A resume is one copy of the DeltaNet states (4B: 50 MB, ~20 us on an
 * H200); a fork also copies the KV rows before the resume point (4B: 32 KB a token). */
#include "cache.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* A prompt being fed into a slot's sequence (cache_feed_begin .. cache_feed_some). */
struct ckpt;
struct feed {
    const int32_t *prompt;
    int n, pos;            /* prompt tokens; fed so far */
    int at[64], k, i;      /* checkpoint positions claimed, the next to fill */
    struct ckpt *cks[64];
    struct ckpt *end_ck;   /* the end of the prompt's, or NULL */
};

struct slot {
    struct model_seq *seq;
    int32_t *tok; /* (ctx,) the tokens the sequence holds, in order */
    int n_tok;
    uint64_t used;
    int pinned;   /* an active request's: never taken, cut or extended by another */
    struct feed feed;
};

struct ckpt {
    struct model_ckpt *ck;
    int owner; /* slot index, -1: free */
    int busy;  /* claimed by a feed in progress: not taken */
    uint64_t used;
};

struct cache {
    struct model *m;
    struct cache_params p;
    struct slot *slots;
    int n_slots, cur; /* cur: the slot of the model's current sequence */
    struct ckpt *cks;
    int n_cks;
    uint64_t clock;
    struct cache_stats st;
};

size_t cache_default_budget(struct model *m) {
    struct backend *be = model_backend(m);
    size_t fr = be->ops->mem_free ? be->ops->mem_free(be) : 0;
    if (fr) return fr / 2;
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    return pages > 0 && psz > 0 ? (size_t)pages * (size_t)psz / 16 : (size_t)1 << 30;
}

struct cache *cache_create(struct model *m, const struct cache_params *p) {
    struct cache *c = xcalloc(1, sizeof *c);
    c->m = m;
    c->p = *p;
    if (!c->p.budget_bytes) c->p.budget_bytes = cache_default_budget(m);
    if (c->p.every <= 0) c->p.every = CACHE_DEFAULT_EVERY;
    const size_t seq_b = model_seq_bytes(m), ck_b = model_ckpt_bytes(m);
    /* up to half the budget in sequences beyond the model's own (at most 63), the rest in
     * checkpoints (at most 1,024) */
    size_t extra = c->p.budget_bytes / 2 / (seq_b ? seq_b : 1);
    if (extra > 63) extra = 63;
    size_t n_ck = (c->p.budget_bytes - extra * seq_b) / (ck_b ? ck_b : 1);
    if (n_ck > 1024) n_ck = 1024;
    const int ctx = model_ctx(m);
    c->slots = xcalloc(extra + 1, sizeof *c->slots);
    c->slots[0].seq = model_seq_default(m);
    c->n_slots = 1;
    for (size_t i = 0; i < extra; i++) { /* the model's sequences first (an earlier cache's) */
        struct model_seq *s = c->n_slots < model_n_seqs(m) ? model_seq_at(m, c->n_slots) : model_seq_create(m);
        if (!s) break;
        c->slots[c->n_slots++].seq = s;
    }
    for (int i = 0; i < c->n_slots; i++) c->slots[i].tok = xmalloc((size_t)ctx * sizeof(int32_t));
    c->cks = xcalloc(n_ck ? n_ck : 1, sizeof *c->cks);
    for (size_t i = 0; i < n_ck; i++) {
        c->cks[i].ck = model_ckpt_create(m);
        c->cks[i].owner = -1;
    }
    c->n_cks = (int)n_ck;
    c->st.n_seqs = c->n_slots;
    c->st.n_ckpts = c->n_cks;
    c->st.budget_bytes = (size_t)(c->n_slots - 1) * seq_b + (size_t)c->n_cks * ck_b;
    model_seq_use(m, c->slots[0].seq);
    return c;
}

void cache_free(struct cache *c) {
    if (!c) return;
    for (int i = 0; i < c->n_cks; i++) model_ckpt_free(c->m, c->cks[i].ck);
    for (int i = 0; i < c->n_slots; i++) free(c->slots[i].tok);
    free(c->cks);
    free(c->slots);
    free(c);
}

static void drop_ckpts(struct cache *c, int slot, int above) { /* those of slot past `above` */
    for (int i = 0; i < c->n_cks; i++)
        if (c->cks[i].owner == slot && !c->cks[i].busy && model_ckpt_pos(c->cks[i].ck) > above)
            c->cks[i].owner = -1;
}

/* A slot to hold a new prefix, never `keep`: an empty one, else the least recently used. */
static int take_slot(struct cache *c, int keep) {
    int best = -1;
    for (int i = 0; i < c->n_slots; i++) {
        if (i == keep || c->slots[i].pinned) continue;
        if (c->slots[i].n_tok == 0) return i;
        if (best < 0 || c->slots[i].used < c->slots[best].used) best = i;
    }
    if (best >= 0) {
        c->st.evictions++;
        drop_ckpts(c, best, -1);
        c->slots[best].n_tok = 0;
    }
    return best;
}

static int common_prefix(const int32_t *a, int na, const int32_t *b, int nb) {
    int n = na < nb ? na : nb, i = 0;
    while (i < n && a[i] == b[i]) i++;
    return i;
}

static void use_slot(struct cache *c, int i) {
    c->cur = i;
    model_seq_use(c->m, c->slots[i].seq);
}

int cache_prepare(struct cache *c, const int32_t *prompt, int n) {
    struct model *m = c->m;
    int best_r = 0, best_slot = -1, best_ck = -1;
    uint64_t best_used = 0;
    for (int s = 0; s < c->n_slots; s++) {
        const struct slot *sl = &c->slots[s];
        if (sl->n_tok == 0) continue;
        const int L = common_prefix(prompt, n, sl->tok, sl->n_tok);
        if (L == 0) continue;
        /* the live state: the prompt extends all the sequence holds (with the logits current
         * when nothing is left to feed) */
        if (!sl->pinned && L == sl->n_tok && (L < n || (s == c->cur && model_logits_current(m))) &&
            (L > best_r || (L == best_r && best_ck >= 0) || (L == best_r && sl->used > best_used))) {
            best_r = L, best_slot = s, best_ck = -1, best_used = sl->used;
        }
        for (int i = 0; i < c->n_cks; i++) {
            if (c->cks[i].owner != s || c->cks[i].busy) continue;
            const int p = model_ckpt_pos(c->cks[i].ck);
            if (p > L || (p == n && !model_ckpt_has_logits(c->cks[i].ck))) continue;
            if (p > best_r || (p == best_r && best_slot >= 0 && best_ck >= 0 && sl->used > best_used))
                best_r = p, best_slot = s, best_ck = i, best_used = sl->used;
        }
    }
    const uint64_t now = ++c->clock;
    if (best_r == 0) { /* a miss: a fresh sequence, taken from the least recently used */
        int s = c->slots[c->cur].n_tok == 0 && !c->slots[c->cur].pinned ? c->cur : take_slot(c, -1);
        CHECK(s >= 0); /* the caller pins fewer sequences than there are */
        drop_ckpts(c, s, -1);
        c->slots[s].n_tok = 0;
        c->slots[s].used = now;
        use_slot(c, s);
        model_reset(m);
        c->st.misses++;
        return 0;
    }
    c->st.hits++;
    c->st.tokens_reused += best_r;
    struct slot *S = &c->slots[best_slot];
    S->used = now;
    if (best_ck < 0) { /* the live state */
        use_slot(c, best_slot);
        return best_r;
    }
    struct ckpt *ck = &c->cks[best_ck];
    ck->used = now;
    const int p = best_r;
    /* a sequence another request is using is forked from, never cut */
    int d = S->n_tok > p || S->pinned ? take_slot(c, best_slot) : -1;
    CHECK(d >= 0 || !S->pinned);
    if (d >= 0) {
        /* fork: the prefix to another sequence, so this one keeps what it holds past p; the
         * checkpoints up to p go with the fork (the fresher of the two) */
        struct slot *D = &c->slots[d];
        use_slot(c, d);
        model_seq_fork(m, D->seq, S->seq, p);
        model_ckpt_restore(m, ck->ck, p == n);
        memcpy(D->tok, S->tok, (size_t)p * sizeof *D->tok);
        D->n_tok = p;
        D->used = now;
        for (int i = 0; i < c->n_cks; i++)
            if (c->cks[i].owner == best_slot && model_ckpt_pos(c->cks[i].ck) <= p) c->cks[i].owner = d;
    } else { /* cut back in place */
        use_slot(c, best_slot);
        model_ckpt_restore(m, ck->ck, p == n);
        S->n_tok = p;
        drop_ckpts(c, best_slot, p);
    }
    return p;
}

/* A free checkpoint, else the least recently used one (of any sequence but never one the
 * current feed placed: `floor` is the clock at its start). NULL if the pool is empty. */
static struct ckpt *take_ckpt(struct cache *c, uint64_t floor) {
    struct ckpt *best = NULL;
    for (int i = 0; i < c->n_cks; i++) {
        struct ckpt *k = &c->cks[i];
        if (k->owner < 0) return k;
        if (k->used >= floor || k->busy) continue;
        if (!best || k->used < best->used) best = k;
    }
    if (best) c->st.evictions++;
    return best;
}

static void record(struct cache *c, const int32_t *ids, int n) {
    struct slot *S = &c->slots[c->cur];
    memcpy(S->tok + S->n_tok, ids, (size_t)n * sizeof *ids);
    S->n_tok += n;
}

/* Releases the checkpoints a feed claimed and did not fill. */
static void feed_release(struct feed *f) {
    for (int q = f->i; q < f->k; q++) f->cks[q]->owner = -1, f->cks[q]->busy = 0;
    if (f->end_ck) f->end_ck->owner = -1, f->end_ck->busy = 0;
    f->k = f->i = 0;
    f->end_ck = NULL;
    f->prompt = NULL;
}

void cache_feed_begin(struct cache *c, const int32_t *prompt, int n, int r) {
    struct model *m = c->m;
    struct feed *f = &c->slots[c->cur].feed;
    CHECK(r >= 0 && r <= n && c->slots[c->cur].n_tok == r && model_pos(m) == r);
    memset(f, 0, sizeof *f);
    f->prompt = prompt, f->n = n, f->pos = r;
    if (r == n) return; /* resumed with the prompt's logits */
    /* where to checkpoint in (r, n): the first message boundary and the last two, every
     * `every` tokens (positions), in order */
    int at[64], n_at = 0;
    int first = -1, last1 = -1, last2 = -1;
    if (c->p.boundary_id >= 0)
        for (int q = r + 1; q < n; q++)
            if (prompt[q] == c->p.boundary_id) {
                if (first < 0) first = q;
                last2 = last1, last1 = q;
            }
    /* the backend takes them where its prefill computes the states anyway (CUDA: every 64th
     * token of a call, and calls start at r): each goes back to the last such point, so resuming
     * there re-feeds up to 63 tokens more than the boundary would */
    const int A = cache_align(c);
    for (int q = r + 1; q < n && n_at < 60; q++) {
        if (q != first && q != last1 && q != last2 && q % c->p.every != 0) continue;
        const int qa = r + (q - r) / A * A;
        if (qa > r && (n_at == 0 || at[n_at - 1] != qa)) at[n_at++] = qa;
    }
    if (first >= 0) first = r + (first - r) / A * A;
    if (last1 >= 0) last1 = r + (last1 - r) / A * A;
    if (last2 >= 0) last2 = r + (last2 - r) / A * A;
    /* claimed in the order of their worth when the pool is short: the end of the prompt, the
     * last boundary, the one before, the first, then the rest from the end */
    const uint64_t floor = c->clock;
    f->end_ck = take_ckpt(c, floor);
    if (f->end_ck) f->end_ck->owner = c->cur, f->end_ck->busy = 1, f->end_ck->used = ++c->clock;
    int want[64], n_want = 0;
    for (int pass = 0; pass < 4; pass++)
        for (int i = n_at - 1; i >= 0; i--) {
            const int q = at[i];
            const int cls = q == last1 ? 0 : q == last2 ? 1 : q == first ? 2 : 3;
            if (cls == pass) want[n_want++] = i;
        }
    struct ckpt *slots[64];
    int got[64] = {0};
    for (int w = 0; w < n_want; w++) {
        struct ckpt *e = take_ckpt(c, floor);
        if (!e) break;
        e->owner = c->cur; /* claimed (its position is set by the feed) */
        e->busy = 1;
        e->used = ++c->clock;
        got[want[w]] = 1;
        slots[want[w]] = e;
    }
    for (int i = 0; i < n_at; i++)
        if (got[i]) {
            f->cks[f->k] = slots[i];
            f->at[f->k++] = at[i];
        }
}

int cache_align(const struct cache *c) {
    const int A = model_backend(c->m)->snap_align;
    return A > 0 ? A : 1;
}

int cache_feed_some(struct cache *c, int max_tokens, struct error *err) {
    struct model *m = c->m;
    struct feed *f = &c->slots[c->cur].feed;
    CHECK(f->prompt && model_pos(m) == f->pos);
    if (f->pos < f->n) {
        /* a piece: up to 8 checkpoints (it then ends at its last), at most max_tokens (a
         * multiple of the alignment, so the checkpoints after it stay where the backend takes
         * them) */
        const int A = cache_align(c);
        int j = f->i, end = f->n;
        while (j < f->k && j - f->i < BACKEND_MAX_SNAPS) j++;
        if (j < f->k) end = f->at[j - 1];
        if (max_tokens > 0) {
            const int cap = max_tokens < A ? A : max_tokens / A * A;
            if (end - f->pos > cap) end = f->pos + cap;
            while (j > f->i && f->at[j - 1] > end) j--;
        }
        int rel[BACKEND_MAX_SNAPS];
        struct model_ckpt *cks[BACKEND_MAX_SNAPS];
        for (int q = f->i; q < j; q++) rel[q - f->i] = f->at[q] - f->pos, cks[q - f->i] = f->cks[q]->ck;
        if (model_prefill_ckpt(m, f->prompt + f->pos, end - f->pos, cks, rel, j - f->i, err) != 0) {
            feed_release(f);
            /* the state is unknown after a failed feed: forget the sequence */
            drop_ckpts(c, c->cur, -1);
            c->slots[c->cur].n_tok = 0;
            model_reset(m);
            return -1;
        }
        record(c, f->prompt + f->pos, end - f->pos);
        for (int q = f->i; q < j; q++) f->cks[q]->busy = 0;
        c->st.ckpts_taken += j - f->i;
        c->st.tokens_fed += end - f->pos;
        f->pos = end;
        f->i = j;
        if (f->pos < f->n) return 1;
    }
    /* the end of the prompt, with its logits */
    if (f->end_ck) {
        model_ckpt_take(m, f->end_ck->ck, 1);
        f->end_ck->busy = 0;
        f->end_ck = NULL;
        c->st.ckpts_taken++;
    }
    f->prompt = NULL;
    return 0;
}

void cache_feed_abort(struct cache *c) { feed_release(&c->slots[c->cur].feed); }

int cache_feed_prompt(struct cache *c, const int32_t *prompt, int n, int r,
                      int (*cancel)(void *), void *cancel_arg, struct error *err) {
    cache_feed_begin(c, prompt, n, r);
    for (;;) {
        if (n > r && cancel && cancel(cancel_arg)) {
            cache_feed_abort(c);
            return 1;
        }
        const int rc = cache_feed_some(c, 0, err);
        if (rc <= 0) return rc;
    }
}

int cache_slot(const struct cache *c) { return c->cur; }

void cache_use(struct cache *c, int slot) {
    CHECK(slot >= 0 && slot < c->n_slots);
    use_slot(c, slot);
}

void cache_pin(struct cache *c, int slot, int on) {
    CHECK(slot >= 0 && slot < c->n_slots);
    c->slots[slot].pinned = on;
}

int cache_n_slots(const struct cache *c) { return c->n_slots; }

struct model_seq *cache_seq(const struct cache *c, int slot) { return c->slots[slot].seq; }

void cache_push_to(struct cache *c, int slot, int32_t id) {
    struct slot *S = &c->slots[slot];
    if (S->n_tok < model_ctx(c->m)) S->tok[S->n_tok++] = id;
}

void cache_push(struct cache *c, int32_t id) { cache_push_to(c, c->cur, id); }

int cache_tokens(const struct cache *c, const int32_t **ids) {
    if (ids) *ids = c->slots[c->cur].tok;
    return c->slots[c->cur].n_tok;
}

void cache_clear(struct cache *c) { /* what active requests use stays */
    for (int i = 0; i < c->n_slots; i++)
        if (!c->slots[i].pinned) {
            drop_ckpts(c, i, -1);
            c->slots[i].n_tok = 0;
        }
    if (!c->slots[c->cur].pinned) model_reset(c->m);
}

void cache_get_stats(const struct cache *c, struct cache_stats *out) {
    *out = c->st;
    size_t held = 0;
    for (int i = 1; i < c->n_slots; i++)
        if (c->slots[i].n_tok > 0) held += model_seq_bytes(c->m);
    for (int i = 0; i < c->n_cks; i++)
        if (c->cks[i].owner >= 0) held += model_ckpt_bytes(c->m);
    out->bytes_held = held;
}
