/* tokenizer.c - Qwen byte-level BPE, exact against Hugging Face `tokenizers` (see tokenizer.h).
 * Mirrors tokenizers' pipeline: AddedVocabulary split (non-normalized tokens on the raw text,
 * leftmost-longest) -> NFC normalizer -> normalized added tokens -> Split(regex, Isolated) ->
 * ByteLevel -> BPE (models/bpe/word.rs merge_word: lowest rank first, leftmost on ties).
 * tokenizer.json is read with a purpose-built strict JSON scanner (jansson takes ~300 ms on the
 * 11 MB file; this ~50 ms): the vocab and merges are scanned in place, the small sections
 * (added_tokens, normalizer, pre_tokenizer, decoder) are handed to jansson.
 * Not supported: other models (WordPiece, Unigram), other normalizers/pre-tokenizers, BPE
 * dropout, byte fallback, continuing-subword prefixes, single_word added tokens. lstrip/rstrip
 * added tokens follow tokenizers' documented meaning but no Qwen file uses them, so they are not
 * checked against it. */
#include "tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <errno.h>
#include <jansson.h>
#include <pcre2.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unicode/uchar.h>
#include <unicode/unorm2.h>
#include <unicode/ustring.h>

/* ---------------------------------------------------------------------------------------------
 * UTF-8 */

/* Decodes one code point of valid UTF-8 at s (caller validated); returns its length. */
static inline int utf8_next(const unsigned char *s, uint32_t *cp) {
    unsigned c = s[0];
    if (c < 0x80) { *cp = c; return 1; }
    if (c < 0xE0) { *cp = ((c & 0x1Fu) << 6) | (s[1] & 0x3Fu); return 2; }
    if (c < 0xF0) { *cp = ((c & 0x0Fu) << 12) | ((s[1] & 0x3Fu) << 6) | (s[2] & 0x3Fu); return 3; }
    *cp = ((c & 0x07u) << 18) | ((s[1] & 0x3Fu) << 12) | ((s[2] & 0x3Fu) << 6) | (s[3] & 0x3Fu);
    return 4;
}

static inline int utf8_put(uint32_t cp, char *out) {
    if (cp < 0x80) { out[0] = (char)cp; return 1; }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Length of the valid UTF-8 sequence at s (n bytes available), 0 if invalid there, or -k if the
 * n bytes are a valid but incomplete prefix. Follows the Unicode "maximal subpart" rules. */
static int utf8_seq(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    if (c < 0x80) return 1;
    int need;
    unsigned lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) need = 1;
    else if (c >= 0xE0 && c <= 0xEF) {
        need = 2;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 3;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else return 0;
    for (int i = 1; i <= need; i++) {
        if ((size_t)i >= n) return -i; /* valid so far, incomplete */
        unsigned b = s[i];
        unsigned l = i == 1 ? lo : 0x80, h = i == 1 ? hi : 0xBF;
        if (b < l || b > h) return 0;
    }
    return need + 1;
}

int utf8_char_len(const char *s, size_t n) { return utf8_seq((const unsigned char *)s, n); }

int utf8_validate(const char *s, size_t len, size_t *bad_at) {
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    while (i < len) {
        /* ASCII fast path, 8 bytes at a time */
        while (i + 8 <= len) {
            uint64_t w;
            memcpy(&w, p + i, 8);
            if (w & 0x8080808080808080ull) break;
            i += 8;
        }
        if (i >= len) break;
        if (p[i] < 0x80) { i++; continue; }
        int k = utf8_seq(p + i, len - i);
        if (k <= 0) {
            if (bad_at) *bad_at = i;
            return -1;
        }
        i += (size_t)k;
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * Byte-level alphabet (GPT-2 bytes_to_unicode): printable bytes map to themselves, the other 68
 * to U+0100.. in byte order. */

static uint32_t byte_char[256];   /* byte -> code point */
static int16_t char_byte[0x144];  /* code point (< 0x144) -> byte, or -1 */
static pthread_once_t byte_tables_once = PTHREAD_ONCE_INIT;

static void byte_tables_build(void) {
    int n = 0;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        byte_char[b] = printable ? (uint32_t)b : (uint32_t)(256 + n++);
    }
    for (int i = 0; i < 0x144; i++) char_byte[i] = -1;
    for (int b = 0; b < 256; b++) char_byte[byte_char[b]] = (int16_t)b;
}

static void byte_tables_init(void) { pthread_once(&byte_tables_once, byte_tables_build); }

/* Maps a byte-level token string (valid UTF-8) to raw bytes in out (>= len bytes); returns the
 * byte count, or -1 if some character is outside the byte-level alphabet. */
static long bytelevel_to_bytes(const char *s, size_t len, char *out) {
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    long n = 0;
    while (i < len) {
        uint32_t cp;
        i += (size_t)utf8_next(p + i, &cp);
        if (cp >= 0x144 || char_byte[cp] < 0) return -1;
        out[n++] = (char)char_byte[cp];
    }
    return n;
}

/* ---------------------------------------------------------------------------------------------
 * Hash tables */

static inline uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ n;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, s + i, 8);
        h = (h ^ w) * 0xFF51AFD7ED558CCDull;
        h ^= h >> 32;
    }
    uint64_t w = 0;
    memcpy(&w, s + i, n - i);
    h = (h ^ w) * 0xC4CEB9FE1A85EC53ull;
    h ^= h >> 29;
    return h;
}

static inline uint64_t hash_u64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xFF51AFD7ED558CCDull;
    x ^= x >> 33;
    return x;
}

struct vocab_slot { /* open addressing, empty when id < 0 */
    uint32_t tag;      /* high half of the key's hash: most mismatches never touch the bytes */
    int32_t id;
    uint32_t off, len; /* key bytes in t->bytes */
};

struct merge_slot { /* key (left id << 32 | right id); empty when rank < 0 */
    uint64_t key;
    int32_t rank, id;
};

struct added_token {
    char *content; /* (content_len,) the literal matched in text */
    size_t content_len;
    int32_t id;
    int special, normalized, lstrip, rstrip;
};

struct tokenizer {
    char *path;
    int vocab_size;          /* highest id + 1 */
    int tok_cap;             /* allocated length of tok_off/tok_len/tok_flags */
    char *bytes;             /* all token bytes */
    size_t bytes_len, bytes_cap;
    uint32_t *tok_off, *tok_len; /* (vocab_size,) decode bytes of each id; len UINT32_MAX = none */
    uint8_t *tok_flags;      /* (vocab_size,) TOKF_* */
    size_t max_token_bytes;
    struct vocab_slot *vocab; /* byte string -> id, for BPE and token_id */
    size_t vocab_mask;
    struct merge_slot *merges;
    size_t merges_mask;
    int32_t byte_id[256];    /* single-byte token ids */
    int ignore_merges;
    struct added_token *added;
    int n_added;
    int has_normalized_added;
    uint8_t added_first[256]; /* bit 1: a raw added token starts with this byte, bit 2: normalized */
    int nfc;
    pcre2_code *re;          /* NULL: no Split (whole segment is one piece) */
    int32_t eos_id, bos_id, pad_id;
    int add_bos;
};

enum { TOKF_ADDED = 1, TOKF_SPECIAL = 2 };

static size_t pow2_at_least(size_t n) {
    size_t p = 16;
    while (p < n) p <<= 1;
    return p;
}

static uint32_t bytes_append(struct tokenizer *t, const char *s, size_t n) {
    if (t->bytes_len + n > t->bytes_cap) {
        while (t->bytes_len + n > t->bytes_cap) t->bytes_cap = t->bytes_cap ? t->bytes_cap * 2 : 1 << 20;
        t->bytes = xrealloc(t->bytes, t->bytes_cap);
    }
    CHECK(t->bytes_len + n < UINT32_MAX);
    if (n) memcpy(t->bytes + t->bytes_len, s, n);
    uint32_t off = (uint32_t)t->bytes_len;
    t->bytes_len += n;
    return off;
}

static int32_t vocab_find_h(const struct tokenizer *t, const char *s, size_t n, uint64_t h) {
    size_t i = h & t->vocab_mask;
    uint32_t tag = (uint32_t)(h >> 32);
    for (;;) {
        const struct vocab_slot *e = &t->vocab[i];
        if (e->id < 0) return -1;
        if (e->tag == tag && e->len == n && memcmp(t->bytes + e->off, s, n) == 0) return e->id;
        i = (i + 1) & t->vocab_mask;
    }
}

static int32_t vocab_find(const struct tokenizer *t, const char *s, size_t n) {
    return vocab_find_h(t, s, n, hash_bytes(s, n));
}

static inline const struct merge_slot *merge_find(const struct tokenizer *t, int32_t a, int32_t b) {
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    size_t i = hash_u64(key) & t->merges_mask;
    for (;;) {
        const struct merge_slot *e = &t->merges[i];
        if (e->rank < 0) return NULL;
        if (e->key == key) return e;
        i = (i + 1) & t->merges_mask;
    }
}

/* ---------------------------------------------------------------------------------------------
 * Strict JSON scanner for tokenizer.json */

struct jscan {
    const char *base, *p, *end;
    const char *path;
    struct error *err;
    char *buf; /* decoded string scratch */
    size_t buf_cap;
};

static int js_fail(struct jscan *s, const char *what) {
    return error_set(s->err, "%s: invalid JSON at byte %zu: %s", s->path, (size_t)(s->p - s->base), what);
}

static inline void js_ws(struct jscan *s) {
    while (s->p < s->end && (*s->p == ' ' || *s->p == '\n' || *s->p == '\r' || *s->p == '\t')) s->p++;
}

static int js_expect(struct jscan *s, char c) {
    js_ws(s);
    if (s->p >= s->end || *s->p != c) {
        char m[40];
        snprintf(m, sizeof m, "expected '%c'", c);
        return js_fail(s, m);
    }
    s->p++;
    return 0;
}

static int hex4(const char *p, uint32_t *v) {
    uint32_t x = 0;
    for (int i = 0; i < 4; i++) {
        char c = p[i];
        x <<= 4;
        if (c >= '0' && c <= '9') x |= (uint32_t)(c - '0');
        else if (c >= 'a' && c <= 'f') x |= (uint32_t)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') x |= (uint32_t)(c - 'A' + 10);
        else return -1;
    }
    *v = x;
    return 0;
}

/* Reads a JSON string at s->p into s->buf (decoded, NUL-terminated, valid UTF-8). */
static int js_string(struct jscan *s, size_t *len_out) {
    js_ws(s);
    if (s->p >= s->end || *s->p != '"') return js_fail(s, "expected a string");
    s->p++;
    size_t n = 0;
    for (;;) {
        /* copy a run of plain bytes */
        const char *q = s->p;
        while (q < s->end && *q != '"' && *q != '\\' && (unsigned char)*q >= 0x20) q++;
        size_t run = (size_t)(q - s->p);
        if (n + run + 8 > s->buf_cap) {
            while (n + run + 8 > s->buf_cap) s->buf_cap *= 2;
            s->buf = xrealloc(s->buf, s->buf_cap);
        }
        memcpy(s->buf + n, s->p, run);
        size_t bad;
        if (utf8_validate(s->p, run, &bad) < 0) {
            s->p += bad;
            return js_fail(s, "invalid UTF-8 in a string");
        }
        n += run;
        s->p = q;
        if (q >= s->end) return js_fail(s, "unterminated string");
        if (*q == '"') { s->p++; break; }
        if ((unsigned char)*q < 0x20) return js_fail(s, "control character in a string");
        /* escape */
        if (q + 1 >= s->end) return js_fail(s, "unterminated escape");
        char e = q[1];
        s->p = q + 2;
        switch (e) {
        case '"': s->buf[n++] = '"'; break;
        case '\\': s->buf[n++] = '\\'; break;
        case '/': s->buf[n++] = '/'; break;
        case 'b': s->buf[n++] = '\b'; break;
        case 'f': s->buf[n++] = '\f'; break;
        case 'n': s->buf[n++] = '\n'; break;
        case 'r': s->buf[n++] = '\r'; break;
        case 't': s->buf[n++] = '\t'; break;
        case 'u': {
            uint32_t cp, lo;
            if (s->end - s->p < 4 || hex4(s->p, &cp) < 0) return js_fail(s, "bad \\u escape");
            s->p += 4;
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                if (s->end - s->p < 6 || s->p[0] != '\\' || s->p[1] != 'u' || hex4(s->p + 2, &lo) < 0 ||
                    lo < 0xDC00 || lo > 0xDFFF)
                    return js_fail(s, "unpaired surrogate in \\u escape");
                s->p += 6;
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                return js_fail(s, "unpaired surrogate in \\u escape");
            }
            n += (size_t)utf8_put(cp, s->buf + n);
            break;
        }
        default: return js_fail(s, "bad escape");
        }
    }
    s->buf[n] = 0;
    *len_out = n;
    return 0;
}

static int js_number(struct jscan *s, long long *v) {
    js_ws(s);
    const char *p = s->p;
    int neg = 0;
    if (p < s->end && *p == '-') { neg = 1; p++; }
    if (p >= s->end || *p < '0' || *p > '9') return js_fail(s, "expected a number");
    if (*p == '0' && p + 1 < s->end && p[1] >= '0' && p[1] <= '9') return js_fail(s, "leading zero");
    long long x = 0;
    while (p < s->end && *p >= '0' && *p <= '9') {
        if (x > (1ll << 40)) return js_fail(s, "number too large");
        x = x * 10 + (*p++ - '0');
    }
    int frac = 0;
    if (p < s->end && *p == '.') {
        frac = 1;
        p++;
        if (p >= s->end || *p < '0' || *p > '9') return js_fail(s, "bad number");
        while (p < s->end && *p >= '0' && *p <= '9') p++;
    }
    if (p < s->end && (*p == 'e' || *p == 'E')) {
        frac = 1;
        p++;
        if (p < s->end && (*p == '+' || *p == '-')) p++;
        if (p >= s->end || *p < '0' || *p > '9') return js_fail(s, "bad number");
        while (p < s->end && *p >= '0' && *p <= '9') p++;
    }
    s->p = p;
    if (v) {
        if (frac) return js_fail(s, "expected an integer");
        *v = neg ? -x : x;
    }
    return 0;
}

static int js_skip(struct jscan *s, int depth) {
    js_ws(s);
    if (depth > 64) return js_fail(s, "nesting too deep");
    if (s->p >= s->end) return js_fail(s, "unexpected end");
    char c = *s->p;
    size_t n;
    if (c == '"') return js_string(s, &n);
    if (c == '{' || c == '[') {
        char close = c == '{' ? '}' : ']';
        s->p++;
        js_ws(s);
        if (s->p < s->end && *s->p == close) { s->p++; return 0; }
        for (;;) {
            if (c == '{') {
                if (js_string(s, &n) < 0 || js_expect(s, ':') < 0) return -1;
            }
            if (js_skip(s, depth + 1) < 0) return -1;
            js_ws(s);
            if (s->p < s->end && *s->p == ',') { s->p++; continue; }
            if (s->p < s->end && *s->p == close) { s->p++; return 0; }
            return js_fail(s, c == '{' ? "expected ',' or '}'" : "expected ',' or ']'");
        }
    }
    static const char *lits[] = {"true", "false", "null"};
    for (int i = 0; i < 3; i++) {
        size_t l = strlen(lits[i]);
        if ((size_t)(s->end - s->p) >= l && memcmp(s->p, lits[i], l) == 0) {
            s->p += l;
            return 0;
        }
    }
    return js_number(s, NULL);
}

/* Skips a value and parses it with jansson (for the small sections). */
static json_t *js_jansson(struct jscan *s, const char *field) {
    js_ws(s);
    const char *start = s->p;
    if (js_skip(s, 0) < 0) return NULL;
    json_error_t je;
    json_t *j = json_loadb(start, (size_t)(s->p - start), JSON_DECODE_ANY | JSON_ALLOW_NUL | JSON_REJECT_DUPLICATES, &je);
    if (!j) error_set(s->err, "%s: %s: %s", s->path, field, je.text);
    return j;
}

/* Iterates an object: call with *first = 1; returns 1 with the key in s->buf, 0 at '}', -1. */
static int js_next_key(struct jscan *s, int *first, size_t *klen) {
    js_ws(s);
    if (*first) {
        if (js_expect(s, '{') < 0) return -1;
        js_ws(s);
        *first = 0;
        if (s->p < s->end && *s->p == '}') { s->p++; return 0; }
    } else {
        if (s->p < s->end && *s->p == ',') s->p++;
        else if (s->p < s->end && *s->p == '}') { s->p++; return 0; }
        else return js_fail(s, "expected ',' or '}'");
    }
    if (js_string(s, klen) < 0 || js_expect(s, ':') < 0) return -1;
    return 1;
}

/* Array iteration: returns 1 when an element follows, 0 at ']', -1. */
static int js_next_elem(struct jscan *s, int *first) {
    js_ws(s);
    if (*first) {
        if (js_expect(s, '[') < 0) return -1;
        js_ws(s);
        *first = 0;
        if (s->p < s->end && *s->p == ']') { s->p++; return 0; }
        return 1;
    }
    if (s->p < s->end && *s->p == ',') { s->p++; return 1; }
    if (s->p < s->end && *s->p == ']') { s->p++; return 0; }
    return js_fail(s, "expected ',' or ']'");
}

/* ---------------------------------------------------------------------------------------------
 * Loading */

struct merge_raw { /* a merge's two parts as raw bytes in a scratch arena */
    uint32_t a_off, a_len, b_off, b_len;
};

struct model_scan {
    struct merge_raw *m;
    size_t n_m, cap_m;
    char *arena;
    size_t arena_len, arena_cap;
    int have_vocab, have_merges;
};

static void set_token(struct tokenizer *t, int32_t id, uint32_t off, uint32_t len) {
    if (id >= t->tok_cap) {
        int old = t->tok_cap, cap = old ? old : 1024;
        while (cap <= id) cap *= 2;
        t->tok_off = xrealloc(t->tok_off, (size_t)cap * sizeof *t->tok_off);
        t->tok_len = xrealloc(t->tok_len, (size_t)cap * sizeof *t->tok_len);
        t->tok_flags = xrealloc(t->tok_flags, (size_t)cap);
        for (int i = old; i < cap; i++) t->tok_len[i] = UINT32_MAX, t->tok_off[i] = 0, t->tok_flags[i] = 0;
        t->tok_cap = cap;
    }
    if (id >= t->vocab_size) t->vocab_size = id + 1; /* trimmed at the end to the highest assigned id */
    t->tok_off[id] = off;
    t->tok_len[id] = len;
}

static int scan_vocab(struct tokenizer *t, struct jscan *s, int *max_id) {
    int first = 1, r;
    size_t klen;
    char *tmp = xmalloc(1024);
    size_t tmp_cap = 1024;
    int n = 0;
    while ((r = js_next_key(s, &first, &klen)) == 1) {
        if (klen > tmp_cap) tmp = xrealloc(tmp, tmp_cap = klen);
        long nb = bytelevel_to_bytes(s->buf, klen, tmp);
        long long id;
        if (js_number(s, &id) < 0) { free(tmp); return -1; }
        js_ws(s);
        if (s->p >= s->end || (*s->p != ',' && *s->p != '}')) { free(tmp); return js_fail(s, "expected ',' or '}'"); }
        if (id < 0 || id > 10000000) {
            free(tmp);
            return error_set(s->err, "%s: model.vocab: token id %lld out of range", s->path, id);
        }
        if (nb < 0) {
            free(tmp);
            return error_set(s->err, "%s: model.vocab: token \"%.60s\" is not byte-level (a character outside the ByteLevel alphabet)",
                             s->path, s->buf);
        }
        if (id < t->vocab_size && t->tok_len[id] != UINT32_MAX) {
            free(tmp);
            return error_set(s->err, "%s: model.vocab: id %lld assigned twice", s->path, id);
        }
        uint32_t off = bytes_append(t, tmp, (size_t)nb);
        set_token(t, (int32_t)id, off, (uint32_t)nb);
        if ((int)id > *max_id) *max_id = (int)id;
        n++;
    }
    free(tmp);
    if (r < 0) return -1;
    if (n == 0) return error_set(s->err, "%s: model.vocab is empty", s->path);
    return 0;
}

static uint32_t arena_put(struct model_scan *ms, const char *p, size_t n) {
    if (ms->arena_len + n > ms->arena_cap) {
        while (ms->arena_len + n > ms->arena_cap) ms->arena_cap = ms->arena_cap ? ms->arena_cap * 2 : 1 << 20;
        ms->arena = xrealloc(ms->arena, ms->arena_cap);
    }
    if (n) memcpy(ms->arena + ms->arena_len, p, n);
    uint32_t off = (uint32_t)ms->arena_len;
    ms->arena_len += n;
    return off;
}

static int merge_part(struct jscan *s, struct model_scan *ms, const char *p, size_t n, uint32_t *off, uint32_t *len) {
    char tmp[4096];
    if (n > sizeof tmp) return error_set(s->err, "%s: model.merges: part longer than 4096 bytes", s->path);
    long nb = bytelevel_to_bytes(p, n, tmp);
    if (nb < 0) return error_set(s->err, "%s: model.merges: \"%.60s\" is not byte-level", s->path, p);
    *off = arena_put(ms, tmp, (size_t)nb);
    *len = (uint32_t)nb;
    return 0;
}

static int scan_merges(struct jscan *s, struct model_scan *ms) {
    int first = 1, r;
    while ((r = js_next_elem(s, &first)) == 1) {
        struct merge_raw m;
        js_ws(s);
        size_t n;
        if (s->p < s->end && *s->p == '"') { /* "a b" */
            if (js_string(s, &n) < 0) return -1;
            char *sp = memchr(s->buf, ' ', n);
            if (!sp || memchr(sp + 1, ' ', n - (size_t)(sp + 1 - s->buf)))
                return error_set(s->err, "%s: model.merges[%zu]: \"%.60s\" is not two tokens separated by one space",
                                 s->path, ms->n_m, s->buf);
            if (merge_part(s, ms, s->buf, (size_t)(sp - s->buf), &m.a_off, &m.a_len) < 0 ||
                merge_part(s, ms, sp + 1, n - (size_t)(sp + 1 - s->buf), &m.b_off, &m.b_len) < 0)
                return -1;
        } else { /* ["a", "b"] */
            int f2 = 1;
            if (js_next_elem(s, &f2) != 1 || js_string(s, &n) < 0) return js_fail(s, "model.merges: expected [\"a\", \"b\"]");
            if (merge_part(s, ms, s->buf, n, &m.a_off, &m.a_len) < 0) return -1;
            if (js_next_elem(s, &f2) != 1 || js_string(s, &n) < 0) return js_fail(s, "model.merges: expected [\"a\", \"b\"]");
            if (merge_part(s, ms, s->buf, n, &m.b_off, &m.b_len) < 0) return -1;
            if (js_next_elem(s, &f2) != 0) return js_fail(s, "model.merges: a pair has more than two parts");
        }
        if (ms->n_m == ms->cap_m) ms->m = xrealloc(ms->m, (ms->cap_m = ms->cap_m ? ms->cap_m * 2 : 1 << 16) * sizeof *ms->m);
        ms->m[ms->n_m++] = m;
    }
    return r < 0 ? -1 : 0;
}

/* Checks a small jansson value: null or the given string. */
static int expect_str_or_null(struct jscan *s, json_t *j, const char *field, const char *allowed) {
    if (json_is_null(j) || (json_is_string(j) && strcmp(json_string_value(j), allowed) == 0)) return 0;
    return error_set(s->err, "%s: model.%s: unsupported value (only null or \"%s\")", s->path, field, allowed);
}

static int scan_model(struct tokenizer *t, struct jscan *s, struct model_scan *ms, int *max_id) {
    int first = 1, r;
    size_t klen;
    int have_type = 0;
    while ((r = js_next_key(s, &first, &klen)) == 1) {
        char key[64];
        snprintf(key, sizeof key, "%s", s->buf);
        if ((strcmp(key, "vocab") == 0 && ms->have_vocab) || (strcmp(key, "merges") == 0 && ms->have_merges) ||
            (strcmp(key, "type") == 0 && have_type))
            return error_set(s->err, "%s: model.%s is given twice", s->path, key);
        if (strcmp(key, "vocab") == 0) {
            if (scan_vocab(t, s, max_id) < 0) return -1;
            ms->have_vocab = 1;
        } else if (strcmp(key, "merges") == 0) {
            if (scan_merges(s, ms) < 0) return -1;
            ms->have_merges = 1;
        } else {
            json_t *j = js_jansson(s, key);
            if (!j) return -1;
            int bad = 0;
            if (strcmp(key, "type") == 0) {
                have_type = 1;
                if (!json_is_string(j) || strcmp(json_string_value(j), "BPE") != 0)
                    bad = error_set(s->err, "%s: model.type must be \"BPE\"", s->path);
            } else if (strcmp(key, "dropout") == 0) {
                if (!json_is_null(j) && !(json_is_number(j) && json_number_value(j) == 0.0))
                    bad = error_set(s->err, "%s: model.dropout: BPE dropout is not supported", s->path);
            } else if (strcmp(key, "continuing_subword_prefix") == 0 || strcmp(key, "end_of_word_suffix") == 0) {
                bad = expect_str_or_null(s, j, key, "");
            } else if (strcmp(key, "byte_fallback") == 0) {
                if (json_is_true(j)) bad = error_set(s->err, "%s: model.byte_fallback = true is not supported", s->path);
            } else if (strcmp(key, "ignore_merges") == 0) {
                t->ignore_merges = json_is_true(j);
            } /* unk_token, fuse_unk: no effect for byte-level BPE (every byte has a token) */
            json_decref(j);
            if (bad) return -1;
        }
    }
    if (r < 0) return -1;
    if (!have_type) return error_set(s->err, "%s: model.type missing", s->path);
    if (!ms->have_vocab) return error_set(s->err, "%s: model.vocab missing", s->path);
    if (!ms->have_merges) return error_set(s->err, "%s: model.merges missing", s->path);
    return 0;
}

/* Translates an Oniguruma pattern (as tokenizers compiles it) for PCRE2: \s and \S become onig's
 * Unicode White_Space set (PCRE2's UCP \s also takes U+180E). Everything else used by tokenizer
 * files (\p{L}, (?i:...), (?!...), classes) has the same meaning in both. */
#define WS_SET "\\t-\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}"
static char *onig_to_pcre2(const char *p, size_t n) {
    size_t cap = n * 4 + 64 + 64 * n / 2, o = 0;
    char *out = xmalloc(cap);
    int in_class = 0;
    for (size_t i = 0; i < n; i++) {
        char c = p[i];
        CHECK(o + 128 < cap);
        if (c == '\\' && i + 1 < n) {
            char d = p[i + 1];
            if (d == 's') {
                o += (size_t)sprintf(out + o, in_class ? "%s" : "[%s]", WS_SET);
                i++;
                continue;
            }
            if (d == 'S' && !in_class) {
                o += (size_t)sprintf(out + o, "[^%s]", WS_SET);
                i++;
                continue;
            }
            out[o++] = c;
            out[o++] = d;
            i++;
            continue;
        }
        if (c == '[' && !in_class) {
            in_class = 1;
            out[o++] = c;
            if (i + 1 < n && p[i + 1] == '^') out[o++] = p[++i];
            if (i + 1 < n && p[i + 1] == ']') out[o++] = p[++i]; /* literal ] first */
            continue;
        }
        if (c == ']' && in_class) in_class = 0;
        out[o++] = c;
    }
    out[o] = 0;
    return out;
}

static int setup_normalizer(struct tokenizer *t, struct jscan *s, json_t *j) {
    if (!j || json_is_null(j)) return 0;
    const char *type = json_string_value(json_object_get(j, "type"));
    if (type && strcmp(type, "NFC") == 0) { t->nfc = 1; return 0; }
    if (type && strcmp(type, "Sequence") == 0) {
        json_t *arr = json_object_get(j, "normalizers");
        size_t i;
        json_t *v;
        if (!json_is_array(arr)) return error_set(s->err, "%s: normalizer.normalizers missing", s->path);
        json_array_foreach(arr, i, v) if (setup_normalizer(t, s, v) < 0) return -1;
        return 0;
    }
    return error_set(s->err, "%s: normalizer type \"%s\" is not supported (only NFC)", s->path, type ? type : "?");
}

static int setup_split(struct tokenizer *t, struct jscan *s, json_t *j) {
    const char *beh = json_string_value(json_object_get(j, "behavior"));
    if (!beh || strcmp(beh, "Isolated") != 0)
        return error_set(s->err, "%s: pre_tokenizer Split behavior \"%s\" is not supported (only Isolated)", s->path, beh ? beh : "?");
    if (json_is_true(json_object_get(j, "invert")))
        return error_set(s->err, "%s: pre_tokenizer Split invert = true is not supported", s->path);
    if (t->re) return error_set(s->err, "%s: more than one Split pre-tokenizer", s->path);
    json_t *pat = json_object_get(j, "pattern");
    const char *rx = json_string_value(json_object_get(pat, "Regex"));
    const char *lit = json_string_value(json_object_get(pat, "String"));
    if (!rx && !lit) return error_set(s->err, "%s: pre_tokenizer Split pattern needs Regex or String", s->path);
    int ec;
    PCRE2_SIZE eo;
    if (rx) {
        char *p2 = onig_to_pcre2(rx, strlen(rx));
        t->re = pcre2_compile((PCRE2_SPTR)p2, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &ec, &eo, NULL);
        free(p2);
    } else {
        t->re = pcre2_compile((PCRE2_SPTR)lit, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_LITERAL, &ec, &eo, NULL);
    }
    if (!t->re) {
        char msg[256];
        pcre2_get_error_message(ec, (PCRE2_UCHAR *)msg, sizeof msg);
        return error_set(s->err, "%s: pre_tokenizer Split pattern does not compile at offset %zu: %s", s->path, (size_t)eo, msg);
    }
    pcre2_jit_compile(t->re, PCRE2_JIT_COMPLETE); /* falls back to the interpreter if JIT is unavailable */
    return 0;
}

static int setup_bytelevel(struct jscan *s, json_t *j, const char *where) {
    if (json_is_true(json_object_get(j, "add_prefix_space")))
        return error_set(s->err, "%s: %s ByteLevel add_prefix_space = true is not supported", s->path, where);
    if (strcmp(where, "pre_tokenizer") == 0 && json_is_true(json_object_get(j, "use_regex")))
        return error_set(s->err, "%s: pre_tokenizer ByteLevel use_regex = true is not supported", s->path);
    return 0;
}

static int setup_pretok(struct tokenizer *t, struct jscan *s, json_t *j, int *have_bl) {
    if (!j || json_is_null(j)) return error_set(s->err, "%s: pre_tokenizer missing (a byte-level BPE needs ByteLevel)", s->path);
    const char *type = json_string_value(json_object_get(j, "type"));
    if (!type) return error_set(s->err, "%s: pre_tokenizer without a type", s->path);
    if (strcmp(type, "Sequence") == 0) {
        json_t *arr = json_object_get(j, "pretokenizers");
        size_t i;
        json_t *v;
        if (!json_is_array(arr)) return error_set(s->err, "%s: pre_tokenizer.pretokenizers missing", s->path);
        json_array_foreach(arr, i, v) {
            if (*have_bl) return error_set(s->err, "%s: pre_tokenizer: nothing may follow ByteLevel", s->path);
            if (setup_pretok(t, s, v, have_bl) < 0) return -1;
        }
        return 0;
    }
    if (strcmp(type, "Split") == 0) return setup_split(t, s, j);
    if (strcmp(type, "ByteLevel") == 0) {
        *have_bl = 1;
        return setup_bytelevel(s, j, "pre_tokenizer");
    }
    return error_set(s->err, "%s: pre_tokenizer type \"%s\" is not supported", s->path, type);
}

static int add_added_token(struct tokenizer *t, struct jscan *s, json_t *a, const char *where) {
    json_t *jid = json_object_get(a, "id"), *jc = json_object_get(a, "content");
    if (!json_is_integer(jid) || !json_is_string(jc))
        return error_set(s->err, "%s: %s: an added token needs an integer id and a string content", s->path, where);
    long long id = json_integer_value(jid);
    if (id < 0 || id > 10000000) return error_set(s->err, "%s: %s: added token id %lld out of range", s->path, where, id);
    const char *content = json_string_value(jc);
    size_t clen = json_string_length(jc);
    if (clen == 0) return error_set(s->err, "%s: %s: added token %lld has empty content", s->path, where, id);
    if (json_is_true(json_object_get(a, "single_word")))
        return error_set(s->err, "%s: %s: added token \"%s\": single_word = true is not supported", s->path, where, content);
    for (int i = 0; i < t->n_added; i++) {
        if (t->added[i].id == id) {
            if (t->added[i].content_len != clen || memcmp(t->added[i].content, content, clen) != 0)
                return error_set(s->err, "%s: %s: added token id %lld is \"%s\" here but \"%s\" in tokenizer.json",
                                 s->path, where, id, content, t->added[i].content);
            return 0; /* same token listed again */
        }
    }
    t->added = xrealloc(t->added, (size_t)(t->n_added + 1) * sizeof *t->added);
    struct added_token *at = &t->added[t->n_added++];
    at->content = xmalloc(clen + 1);
    memcpy(at->content, content, clen + 1);
    at->content_len = clen;
    at->id = (int32_t)id;
    at->special = json_is_true(json_object_get(a, "special"));
    json_t *jn = json_object_get(a, "normalized");
    at->normalized = jn ? json_is_true(jn) : !at->special; /* tokenizers' default */
    at->lstrip = json_is_true(json_object_get(a, "lstrip"));
    at->rstrip = json_is_true(json_object_get(a, "rstrip"));
    /* decode bytes: ByteLevel-mapped when every char is in the alphabet, else the UTF-8 itself
     * (tokenizers' ByteLevel decoder rule) */
    char *tmp = xmalloc(clen);
    long nb = bytelevel_to_bytes(content, clen, tmp);
    uint32_t off = nb >= 0 ? bytes_append(t, tmp, (size_t)nb) : bytes_append(t, content, clen);
    free(tmp);
    if (id >= t->vocab_size || t->tok_len[id] == UINT32_MAX) set_token(t, (int32_t)id, 0, 0);
    t->tok_off[id] = off;
    t->tok_len[id] = (uint32_t)(nb >= 0 ? (size_t)nb : clen);
    t->tok_flags[id] = (uint8_t)(TOKF_ADDED | (at->special ? TOKF_SPECIAL : 0));
    unsigned char fb = (unsigned char)content[0];
    t->added_first[fb] |= at->normalized ? 2 : 1;
    if (at->normalized) t->has_normalized_added = 1;
    return 0;
}

static int build_tables(struct tokenizer *t, struct jscan *s, struct model_scan *ms, int max_id) {
    /* vocab hash over the BPE vocabulary (ids 0..max_id that have bytes) */
    size_t n = 0;
    for (int i = 0; i <= max_id; i++) n += t->tok_len[i] != UINT32_MAX;
    size_t cap = pow2_at_least(n * 2);
    t->vocab = xmalloc(cap * sizeof *t->vocab);
    for (size_t i = 0; i < cap; i++) t->vocab[i].id = -1;
    t->vocab_mask = cap - 1;
    /* Loading is bound by cache misses on these tables, so lookups go in batches: hash and
     * prefetch a batch's slots first, then resolve them. */
    enum { BATCH = 32 };
    uint64_t hs[3 * BATCH];
    for (int id0 = 0; id0 <= max_id; id0 += BATCH) {
        int id1 = id0 + BATCH <= max_id + 1 ? id0 + BATCH : max_id + 1;
        for (int id = id0; id < id1; id++) {
            if (t->tok_len[id] == UINT32_MAX) continue;
            hs[id - id0] = hash_bytes(t->bytes + t->tok_off[id], t->tok_len[id]);
            __builtin_prefetch(&t->vocab[hs[id - id0] & t->vocab_mask], 1);
        }
        for (int id = id0; id < id1; id++) {
            if (t->tok_len[id] == UINT32_MAX) continue;
            const char *b = t->bytes + t->tok_off[id];
            size_t len = t->tok_len[id];
            uint64_t hh = hs[id - id0];
            size_t h = hh & t->vocab_mask;
            for (;;) {
                struct vocab_slot *e = &t->vocab[h];
                if (e->id < 0) {
                    e->tag = (uint32_t)(hh >> 32), e->off = t->tok_off[id], e->len = (uint32_t)len, e->id = id;
                    break;
                }
                if (e->tag == (uint32_t)(hh >> 32) && e->len == len && memcmp(t->bytes + e->off, b, len) == 0)
                    return error_set(s->err, "%s: model.vocab: ids %d and %d are the same token", s->path, e->id, id);
                h = (h + 1) & t->vocab_mask;
            }
        }
    }
    for (int b = 0; b < 256; b++) {
        char c = (char)b;
        t->byte_id[b] = vocab_find(t, &c, 1);
        if (t->byte_id[b] < 0)
            return error_set(s->err, "%s: model.vocab lacks the single-byte token for byte 0x%02x (U+%04X)", s->path, b, byte_char[b]);
    }
    /* merges: (left id, right id) -> (rank, merged id); a repeated pair keeps its last rank, as
     * tokenizers' HashMap insert does */
    cap = pow2_at_least(ms->n_m * 2);
    t->merges = xmalloc(cap * sizeof *t->merges);
    for (size_t i = 0; i < cap; i++) t->merges[i].rank = -1;
    t->merges_mask = cap - 1;
    /* the parts of a merge lie back to back in the arena, so a+b needs no copy */
    for (size_t r0 = 0; r0 < ms->n_m; r0 += BATCH) {
        size_t r1 = r0 + BATCH < ms->n_m ? r0 + BATCH : ms->n_m;
        for (size_t r = r0; r < r1; r++) {
            const struct merge_raw *m = &ms->m[r];
            CHECK(m->b_off == m->a_off + m->a_len);
            uint64_t *h3 = &hs[3 * (r - r0)];
            h3[0] = hash_bytes(ms->arena + m->a_off, m->a_len);
            h3[1] = hash_bytes(ms->arena + m->b_off, m->b_len);
            h3[2] = hash_bytes(ms->arena + m->a_off, m->a_len + m->b_len);
            for (int k = 0; k < 3; k++) __builtin_prefetch(&t->vocab[h3[k] & t->vocab_mask]);
        }
        for (size_t r = r0; r < r1; r++) /* second stage: the key bytes of the home slots */
            for (int k = 0; k < 3; k++) {
                const struct vocab_slot *e = &t->vocab[hs[3 * (r - r0) + k] & t->vocab_mask];
                if (e->id >= 0) __builtin_prefetch(t->bytes + e->off);
            }
        int32_t res[3 * BATCH];
        for (size_t r = r0; r < r1; r++) {
            const struct merge_raw *m = &ms->m[r];
            const uint64_t *h3 = &hs[3 * (r - r0)];
            int32_t ia = vocab_find_h(t, ms->arena + m->a_off, m->a_len, h3[0]);
            int32_t ib = vocab_find_h(t, ms->arena + m->b_off, m->b_len, h3[1]);
            int32_t inew = vocab_find_h(t, ms->arena + m->a_off, m->a_len + m->b_len, h3[2]);
            if (ia < 0 || ib < 0 || inew < 0)
                return error_set(s->err, "%s: model.merges[%zu]: %s not in the vocabulary", s->path, r,
                                 ia < 0 ? "left part" : ib < 0 ? "right part" : "merged token");
            int32_t *x = &res[3 * (r - r0)];
            x[0] = ia, x[1] = ib, x[2] = inew;
            __builtin_prefetch(&t->merges[hash_u64((uint64_t)(uint32_t)ia << 32 | (uint32_t)ib) & t->merges_mask], 1);
        }
        for (size_t r = r0; r < r1; r++) { /* in rank order: a repeated pair keeps its last rank */
            const int32_t *x = &res[3 * (r - r0)];
            uint64_t key = (uint64_t)(uint32_t)x[0] << 32 | (uint32_t)x[1];
            size_t h = hash_u64(key) & t->merges_mask;
            for (;;) {
                struct merge_slot *e = &t->merges[h];
                if (e->rank < 0 || e->key == key) {
                    e->key = key, e->rank = (int32_t)r, e->id = x[2];
                    break;
                }
                h = (h + 1) & t->merges_mask;
            }
        }
    }
    return 0;
}

static int32_t added_id_by_content(const struct tokenizer *t, const char *c) {
    if (!c) return -1;
    for (int i = 0; i < t->n_added; i++)
        if (strcmp(t->added[i].content, c) == 0) return t->added[i].id;
    return tokenizer_token_id(t, c);
}

/* tokenizer_config.json: the bos/eos/pad strings may be plain strings or {"content": ...}. */
static int load_config(struct tokenizer *t, const char *json_path, struct error *err) {
    const char *slash = strrchr(json_path, '/');
    size_t dl = slash ? (size_t)(slash - json_path + 1) : 0;
    char *cp = xmalloc(dl + 32);
    memcpy(cp, json_path, dl);
    strcpy(cp + dl, "tokenizer_config.json");
    struct stat st;
    if (stat(cp, &st) != 0) { free(cp); return 0; }
    json_error_t je;
    json_t *j = json_load_file(cp, JSON_ALLOW_NUL, &je);
    if (!j || !json_is_object(j)) {
        error_set(err, "%s: line %d: %s", cp, je.line, j ? "not a JSON object" : je.text);
        json_decref(j);
        free(cp);
        return -1;
    }
    struct jscan s = {.path = cp, .err = err};
    json_t *dec = json_object_get(j, "added_tokens_decoder");
    const char *k;
    json_t *v;
    int rc = 0;
    json_object_foreach(dec, k, v) {
        json_t *a = json_deep_copy(v);
        char *end;
        long long id = strtoll(k, &end, 10);
        if (*end || !json_is_object(a)) {
            json_decref(a);
            rc = error_set(err, "%s: added_tokens_decoder key \"%s\" is not an id", cp, k);
            break;
        }
        json_object_set_new(a, "id", json_integer(id));
        rc = add_added_token(t, &s, a, "added_tokens_decoder");
        json_decref(a);
        if (rc < 0) break;
    }
    if (rc == 0) {
        static const char *names[] = {"eos_token", "bos_token", "pad_token"};
        int32_t *dst[] = {&t->eos_id, &t->bos_id, &t->pad_id};
        for (int i = 0; i < 3; i++) {
            json_t *x = json_object_get(j, names[i]);
            if (json_is_object(x)) x = json_object_get(x, "content");
            if (!json_is_string(x)) continue;
            *dst[i] = added_id_by_content(t, json_string_value(x));
            if (*dst[i] < 0) {
                rc = error_set(err, "%s: %s \"%s\" is not a token", cp, names[i], json_string_value(x));
                break;
            }
        }
        t->add_bos = json_is_true(json_object_get(j, "add_bos_token"));
    }
    json_decref(j);
    free(cp);
    return rc;
}

static char *slurp(const char *path, size_t *len, struct error *err) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        error_set(err, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fileno(f), &st) == 0 && S_ISDIR(st.st_mode)) {
        fclose(f);
        error_set(err, "%s: is a directory (give the path of tokenizer.json)", path);
        return NULL;
    }
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) { /* a pipe or device: read to the end */
        fclose(f);
        return read_file(path, len, err);
    }
    char *buf = xmalloc((size_t)st.st_size + 1);
    size_t n = fread(buf, 1, (size_t)st.st_size, f);
    int bad = ferror(f) || n != (size_t)st.st_size;
    fclose(f);
    if (bad) {
        free(buf);
        error_set(err, "%s: read error", path);
        return NULL;
    }
    buf[n] = 0;
    *len = n;
    return buf;
}

struct tokenizer *tokenizer_load(const char *path, struct error *err) {
    byte_tables_init();
    struct tokenizer *t = xcalloc(1, sizeof *t);
    t->path = xstrdup(path);
    t->eos_id = t->bos_id = t->pad_id = -1;
    struct model_scan ms = {0};
    json_t *j_added = NULL, *j_norm = NULL, *j_pretok = NULL, *j_dec = NULL;
    int have_model = 0, have_added = 0, have_norm = 0, have_pretok = 0, have_dec = 0, max_id = -1;
    size_t len = 0;
    char *text = slurp(path, &len, err);
    if (!text) goto fail;
    struct jscan s = {.base = text, .p = text, .end = text + len, .path = path, .err = err};
    s.buf_cap = 4096;
    s.buf = xmalloc(s.buf_cap);
    int first = 1, r;
    size_t klen;
    while ((r = js_next_key(&s, &first, &klen)) == 1) {
        /* a key given twice is refused (the first value would be parsed, then dropped) */
        static const char *const once[] = {"model", "added_tokens", "normalizer", "pre_tokenizer", "decoder"};
        int *const seen[] = {&have_model, &have_added, &have_norm, &have_pretok, &have_dec};
        for (int k = 0; k < 5; k++)
            if (strcmp(s.buf, once[k]) == 0 && *seen[k]) {
                error_set(err, "%s: the key \"%s\" is given twice", path, once[k]);
                goto fail_s;
            }
        if (strcmp(s.buf, "model") == 0) {
            if (scan_model(t, &s, &ms, &max_id) < 0) goto fail_s;
            have_model = 1;
        } else if (strcmp(s.buf, "added_tokens") == 0) {
            if (!(j_added = js_jansson(&s, "added_tokens"))) goto fail_s;
            have_added = 1;
        } else if (strcmp(s.buf, "normalizer") == 0) {
            if (!(j_norm = js_jansson(&s, "normalizer"))) goto fail_s;
            have_norm = 1;
        } else if (strcmp(s.buf, "pre_tokenizer") == 0) {
            if (!(j_pretok = js_jansson(&s, "pre_tokenizer"))) goto fail_s;
            have_pretok = 1;
        } else if (strcmp(s.buf, "decoder") == 0) {
            if (!(j_dec = js_jansson(&s, "decoder"))) goto fail_s;
            have_dec = 1;
        } else if (js_skip(&s, 0) < 0) {
            goto fail_s;
        }
    }
    if (r < 0) goto fail_s;
    js_ws(&s);
    if (s.p != s.end) { js_fail(&s, "trailing data after the top-level object"); goto fail_s; }
    if (!have_model) { error_set(err, "%s: \"model\" missing", path); goto fail_s; }
    if (!have_pretok) { error_set(err, "%s: \"pre_tokenizer\" missing", path); goto fail_s; }
    if (!have_dec || !json_is_object(j_dec) ||
        !json_is_string(json_object_get(j_dec, "type")) ||
        strcmp(json_string_value(json_object_get(j_dec, "type")), "ByteLevel") != 0) {
        error_set(err, "%s: decoder must be ByteLevel", path);
        goto fail_s;
    }
    if (setup_bytelevel(&s, j_dec, "decoder") < 0) goto fail_s;
    (void)have_norm;
    if (setup_normalizer(t, &s, j_norm) < 0) goto fail_s;
    int have_bl = 0;
    if (setup_pretok(t, &s, j_pretok, &have_bl) < 0) goto fail_s;
    if (!have_bl) { error_set(err, "%s: pre_tokenizer has no ByteLevel step", path); goto fail_s; }
    if (build_tables(t, &s, &ms, max_id) < 0) goto fail_s;
    if (have_added && !json_is_null(j_added)) {
        if (!json_is_array(j_added)) { error_set(err, "%s: added_tokens is not an array", path); goto fail_s; }
        size_t i;
        json_t *a;
        json_array_foreach(j_added, i, a) if (add_added_token(t, &s, a, "added_tokens") < 0) goto fail_s;
    }
    if (load_config(t, path, err) < 0) goto fail_s;
    /* vocab_size: highest assigned id + 1 */
    int hi = -1;
    for (int i = 0; i < t->vocab_size; i++)
        if (t->tok_len[i] != UINT32_MAX) {
            hi = i;
            if (t->tok_len[i] > t->max_token_bytes) t->max_token_bytes = t->tok_len[i];
        }
    t->vocab_size = hi + 1;
    free(s.buf);
    free(text);
    free(ms.m);
    free(ms.arena);
    json_decref(j_added);
    json_decref(j_norm);
    json_decref(j_pretok);
    json_decref(j_dec);
    return t;
fail_s:
    free(s.buf);
fail:
    free(text);
    free(ms.m);
    free(ms.arena);
    json_decref(j_added);
    json_decref(j_norm);
    json_decref(j_pretok);
    json_decref(j_dec);
    tokenizer_free(t);
    return NULL;
}

void tokenizer_free(struct tokenizer *t) {
    if (!t) return;
    for (int i = 0; i < t->n_added; i++) free(t->added[i].content);
    free(t->added);
    if (t->re) pcre2_code_free(t->re);
    free(t->path);
    free(t->bytes);
    free(t->tok_off);
    free(t->tok_len);
    free(t->tok_flags);
    free(t->vocab);
    free(t->merges);
    free(t);
}

/* ---------------------------------------------------------------------------------------------
 * NFC */

/* tokenizers normalizes with the crate unicode-normalization-alignments, whose tables are
 * Unicode 9.0: a code point assigned later is, to it, an unassigned starter (combining class 0,
 * no decomposition, composes with nothing). ICU (Unicode 15 in Debian 12) would reorder or
 * compose such characters (e.g. U+09FE BENGALI SANDHI MARK, ccc 230, Unicode 10), so they are
 * cut out of the runs ICU sees and copied unchanged - which is exactly what an unassigned starter
 * does in NFC. Characters of Unicode <= 9.0 have the same normalization properties in both (the
 * Unicode stability policy freezes decompositions and combining classes once assigned). */
#define NFC_MAX_AGE 9

static int nfc_too_new(uint32_t cp) {
    UVersionInfo v;
    u_charAge((UChar32)cp, v);
    return v[0] > NFC_MAX_AGE;
}

/* NFC of one run of valid UTF-8 through ICU (UTF-16 in between), appended to *out. */
static void nfc_run_icu(const char *s, size_t n, char **out, size_t *o, size_t *cap) {
    const UNormalizer2 *nf;
    UErrorCode e = U_ZERO_ERROR;
    nf = unorm2_getNFCInstance(&e);
    CHECK(U_SUCCESS(e)); /* ICU's data is part of libicuuc's install */
    UChar ubuf[512], nbuf[1024];
    UChar *u = ubuf, *nb = nbuf;
    int32_t ul = 0, nl;
    CHECK(n < INT32_MAX / 4);
    u_strFromUTF8(u, 512, &ul, s, (int32_t)n, &e);
    if (e == U_BUFFER_OVERFLOW_ERROR) {
        e = U_ZERO_ERROR;
        u = xmalloc((size_t)(ul + 1) * sizeof *u);
        u_strFromUTF8(u, ul + 1, &ul, s, (int32_t)n, &e);
    }
    CHECK(U_SUCCESS(e));
    nl = unorm2_normalize(nf, u, ul, nb, 1024, &e);
    if (e == U_BUFFER_OVERFLOW_ERROR) {
        e = U_ZERO_ERROR;
        nb = xmalloc((size_t)(nl + 1) * sizeof *nb);
        nl = unorm2_normalize(nf, u, ul, nb, nl + 1, &e);
    }
    CHECK(U_SUCCESS(e));
    int32_t need = 0;
    UErrorCode e2 = U_ZERO_ERROR;
    u_strToUTF8(NULL, 0, &need, nb, nl, &e2); /* preflight: exact UTF-8 length */
    if (*o + (size_t)need + 1 > *cap) *out = xrealloc(*out, *cap = (*o + (size_t)need) * 2 + 16);
    u_strToUTF8(*out + *o, need + 1, &need, nb, nl, &e);
    CHECK(U_SUCCESS(e) || e == U_STRING_NOT_TERMINATED_WARNING);
    *o += (size_t)need;
    if (u != ubuf) free(u);
    if (nb != nbuf) free(nb);
}

/* Code points below U+0300 are NFC-stable starters: they never combine with what precedes them
 * and nothing before them reorders across them, so text can be split before each one and the
 * runs between normalized independently (ICU's "boundary before" property). A run needing ICU
 * starts at the starter before it (which may compose with the marks that follow) and ends before
 * the next stable starter or the next code point newer than Unicode 9.0. Pure Latin text never
 * reaches ICU. */
char *tokenizer_nfc(const char *text, size_t len, size_t *len_out) {
    const unsigned char *p = (const unsigned char *)text;
    size_t cap = len + 16, o = 0;
    char *out = xmalloc(cap);
    size_t i = 0;
    int prev_stable = 0; /* the code point just before i is a genuine < U+0300 starter */
    while (i < len) {
        /* copy the stable run: lead bytes < 0xCC encode code points < U+0300 */
        size_t j = i;
        while (j < len && p[j] < 0xCC) j++;
        if (j > i) {
            if (o + (j - i) + 1 > cap) out = xrealloc(out, cap = (o + (j - i)) * 2 + 16);
            memcpy(out + o, p + i, j - i);
            o += j - i;
            i = j;
            prev_stable = 1;
            if (i >= len) break;
        }
        uint32_t cp;
        int w = utf8_next(p + i, &cp);
        if (nfc_too_new(cp)) { /* an unassigned starter to tokenizers: copied as is */
            if (o + (size_t)w + 1 > cap) out = xrealloc(out, cap = (o + (size_t)w) * 2 + 16);
            memcpy(out + o, p + i, (size_t)w);
            o += (size_t)w;
            i += (size_t)w;
            prev_stable = 0;
            continue;
        }
        size_t start = i;
        if (prev_stable) { /* take back the starter before the run */
            size_t k = i - 1;
            while (k > 0 && (p[k] & 0xC0) == 0x80) k--;
            o -= i - k;
            start = k;
        }
        j = i + (size_t)w;
        while (j < len && p[j] >= 0xCC) {
            w = utf8_next(p + j, &cp);
            if (nfc_too_new(cp)) break;
            j += (size_t)w;
        }
        nfc_run_icu(text + start, j - start, &out, &o, &cap);
        i = j;
        prev_stable = 0;
    }
    out[o] = 0;
    if (len_out) *len_out = o;
    return out;
}

/* ---------------------------------------------------------------------------------------------
 * Encoding */

struct idvec {
    int32_t *v;
    int n, cap;
};

static inline void idvec_push(struct idvec *v, int32_t id) {
    if (v->n == v->cap) v->v = xrealloc(v->v, (size_t)(v->cap = v->cap ? v->cap * 2 : 256) * sizeof *v->v);
    v->v[v->n++] = id;
}

struct bpe_sym {
    int32_t id;
    int32_t prev, next; /* -1 at the ends */
    int32_t len;        /* 0 once merged into its left neighbour */
};

struct bpe_heap_item {
    int32_t rank, pos, new_id;
};

/* Scratch reused across the pieces of one encode call (not shared between threads). */
struct bpe_scratch {
    struct bpe_sym *sym;
    struct bpe_heap_item *heap;
    int cap_sym, cap_heap;
};

static inline int heap_less(const struct bpe_heap_item *a, const struct bpe_heap_item *b) {
    return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static void heap_push(struct bpe_scratch *sc, int *n, struct bpe_heap_item it) {
    if (*n == sc->cap_heap) sc->heap = xrealloc(sc->heap, (size_t)(sc->cap_heap = sc->cap_heap * 2 + 64) * sizeof *sc->heap);
    int i = (*n)++;
    while (i > 0) {
        int par = (i - 1) / 2;
        if (!heap_less(&it, &sc->heap[par])) break;
        sc->heap[i] = sc->heap[par];
        i = par;
    }
    sc->heap[i] = it;
}

static struct bpe_heap_item heap_pop(struct bpe_scratch *sc, int *n) {
    struct bpe_heap_item top = sc->heap[0], last = sc->heap[--(*n)];
    int i = 0;
    for (;;) {
        int c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && heap_less(&sc->heap[c + 1], &sc->heap[c])) c++;
        if (!heap_less(&sc->heap[c], &last)) break;
        sc->heap[i] = sc->heap[c];
        i = c;
    }
    if (*n > 0) sc->heap[i] = last;
    return top;
}

/* BPE of one pre-token's bytes, as tokenizers' Word::merge_all: repeatedly merge the adjacent
 * pair with the lowest rank, the leftmost one on ties. Short pieces use a direct scan (cheaper
 * than a heap below ~16 symbols); long ones a heap with lazy invalidation, O(n log n). */
static void bpe_piece(const struct tokenizer *t, const unsigned char *p, int n, struct idvec *out,
                      struct bpe_scratch *sc) {
    if (n == 1) { idvec_push(out, t->byte_id[p[0]]); return; }
    if (t->ignore_merges) {
        int32_t id = vocab_find(t, (const char *)p, (size_t)n);
        if (id >= 0) { idvec_push(out, id); return; }
    }
    if (n <= 24) {
        int32_t ids[24];
        for (int i = 0; i < n; i++) ids[i] = t->byte_id[p[i]];
        int m = n;
        while (m > 1) {
            int best = -1;
            int32_t best_rank = INT32_MAX, best_id = 0;
            for (int i = 0; i + 1 < m; i++) {
                const struct merge_slot *e = merge_find(t, ids[i], ids[i + 1]);
                if (e && e->rank < best_rank) best_rank = e->rank, best = i, best_id = e->id;
            }
            if (best < 0) break;
            ids[best] = best_id;
            memmove(ids + best + 1, ids + best + 2, (size_t)(m - best - 2) * sizeof *ids);
            m--;
        }
        for (int i = 0; i < m; i++) idvec_push(out, ids[i]);
        return;
    }
    if (n > sc->cap_sym) sc->sym = xrealloc(sc->sym, (size_t)(sc->cap_sym = n) * sizeof *sc->sym);
    struct bpe_sym *sym = sc->sym;
    for (int i = 0; i < n; i++) {
        sym[i].id = t->byte_id[p[i]];
        sym[i].prev = i - 1;
        sym[i].next = i + 1 < n ? i + 1 : -1;
        sym[i].len = 1;
    }
    int hn = 0;
    for (int i = 0; i + 1 < n; i++) {
        const struct merge_slot *e = merge_find(t, sym[i].id, sym[i + 1].id);
        if (e) heap_push(sc, &hn, (struct bpe_heap_item){e->rank, i, e->id});
    }
    while (hn > 0) {
        struct bpe_heap_item top = heap_pop(sc, &hn);
        struct bpe_sym *s = &sym[top.pos];
        if (s->len == 0 || s->next < 0) continue;
        struct bpe_sym *r = &sym[s->next];
        const struct merge_slot *e = merge_find(t, s->id, r->id);
        if (!e || e->id != top.new_id) continue; /* stale entry */
        s->id = top.new_id;
        s->len += r->len;
        r->len = 0;
        s->next = r->next;
        if (r->next >= 0) sym[r->next].prev = top.pos;
        if (s->prev >= 0) {
            const struct merge_slot *e2 = merge_find(t, sym[s->prev].id, s->id);
            if (e2) heap_push(sc, &hn, (struct bpe_heap_item){e2->rank, s->prev, e2->id});
        }
        if (s->next >= 0) {
            const struct merge_slot *e2 = merge_find(t, s->id, sym[s->next].id);
            if (e2) heap_push(sc, &hn, (struct bpe_heap_item){e2->rank, top.pos, e2->id});
        }
    }
    for (int i = 0; i >= 0; i = sym[i].next) idvec_push(out, sym[i].id);
}

/* Pre-tokenizes one normalized segment with the Split regex (Isolated: matches and the gaps
 * between them are pieces) and BPE-encodes each piece. */
static int encode_segment(const struct tokenizer *t, const char *s, size_t n, struct idvec *out,
                          struct bpe_scratch *sc, pcre2_match_data *md, struct error *err) {
    if (n == 0) return 0;
    if (!t->re) {
        bpe_piece(t, (const unsigned char *)s, (int)n, out, sc);
        return 0;
    }
    size_t gap = 0, search = 0; /* gap: start of the unmatched text before the next match */
    while (search < n) {
        int rc = pcre2_match(t->re, (PCRE2_SPTR)s, n, search, PCRE2_NO_UTF_CHECK, md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            char msg[256];
            pcre2_get_error_message(rc, (PCRE2_UCHAR *)msg, sizeof msg);
            return error_set(err, "pre-tokenizer regex failed at byte %zu: %s", search, msg);
        }
        const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t ms = ov[0], me = ov[1];
        if (me == ms) { /* empty match: not a split point; search again one character on */
            search = ms + 1;
            while (search < n && ((unsigned char)s[search] & 0xC0) == 0x80) search++;
            continue;
        }
        CHECK(me - ms < INT32_MAX && ms - gap < INT32_MAX);
        if (ms > gap) bpe_piece(t, (const unsigned char *)s + gap, (int)(ms - gap), out, sc);
        bpe_piece(t, (const unsigned char *)s + ms, (int)(me - ms), out, sc);
        gap = search = me;
    }
    if (gap < n) bpe_piece(t, (const unsigned char *)s + gap, (int)(n - gap), out, sc);
    return 0;
}

/* Finds the leftmost-longest added token (of the given kind: 1 raw, 2 normalized) in s[from, n). */
static int find_added(const struct tokenizer *t, const char *s, size_t n, size_t from, int kind,
                      size_t *at, size_t *mlen, int32_t *id) {
    for (size_t i = from; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (!(t->added_first[c] & kind)) continue;
        size_t best = 0;
        int32_t bid = -1;
        for (int k = 0; k < t->n_added; k++) {
            const struct added_token *a = &t->added[k];
            if ((a->normalized ? 2 : 1) != kind || a->content_len <= best || a->content_len > n - i) continue;
            if ((unsigned char)a->content[0] == c && memcmp(a->content, s + i, a->content_len) == 0)
                best = a->content_len, bid = a->id;
        }
        if (bid >= 0) {
            *at = i, *mlen = best, *id = bid;
            return 1;
        }
    }
    return 0;
}

static inline int is_ws_byte_at(const char *s, size_t n, size_t i, size_t *w) {
    /* Rust char::is_whitespace for lstrip/rstrip: ASCII + common Unicode spaces */
    unsigned char c = (unsigned char)s[i];
    if (c == ' ' || (c >= '\t' && c <= '\r')) { *w = 1; return 1; }
    if (c < 0x80) return 0;
    uint32_t cp;
    if (utf8_seq((const unsigned char *)s + i, n - i) <= 0) return 0;
    *w = (size_t)utf8_next((const unsigned char *)s + i, &cp);
    return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 ||
           cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

/* Splits s by added tokens of one kind, calling seg() for the text between them. lstrip/rstrip
 * tokens swallow the whitespace beside them (tokenizers' AddedToken semantics). */
struct enc_ctx {
    const struct tokenizer *t;
    struct idvec *out;
    struct bpe_scratch *sc;
    pcre2_match_data *md;
    struct error *err;
};

static int encode_normalized(struct enc_ctx *c, const char *s, size_t n);

static int split_added(struct enc_ctx *c, const char *s, size_t n, int kind) {
    const struct tokenizer *t = c->t;
    size_t pos = 0;
    for (;;) {
        size_t at, ml;
        int32_t id;
        if (!t->n_added || !find_added(t, s, n, pos, kind, &at, &ml, &id)) break;
        const struct added_token *a = NULL;
        for (int k = 0; k < t->n_added; k++)
            if (t->added[k].id == id) a = &t->added[k];
        size_t seg_end = at, next = at + ml;
        if (a->lstrip) {
            while (seg_end > pos) {
                size_t b = seg_end - 1, w;
                while (b > pos && ((unsigned char)s[b] & 0xC0) == 0x80) b--;
                if (!is_ws_byte_at(s, n, b, &w) || b + w != seg_end) break;
                seg_end = b;
            }
        }
        if (a->rstrip) {
            size_t w;
            while (next < n && is_ws_byte_at(s, n, next, &w)) next += w;
        }
        if (seg_end > pos) {
            int rc = kind == 1 ? encode_normalized(c, s + pos, seg_end - pos)
                               : encode_segment(t, s + pos, seg_end - pos, c->out, c->sc, c->md, c->err);
            if (rc < 0) return -1;
        }
        idvec_push(c->out, id);
        pos = next;
    }
    if (pos < n) {
        return kind == 1 ? encode_normalized(c, s + pos, n - pos)
                         : encode_segment(t, s + pos, n - pos, c->out, c->sc, c->md, c->err);
    }
    return 0;
}

/* A raw segment between non-normalized added tokens: NFC, then normalized added tokens. */
static int encode_normalized(struct enc_ctx *c, const char *s, size_t n) {
    const struct tokenizer *t = c->t;
    char *norm = NULL;
    size_t nn = n;
    if (t->nfc) {
        /* skip the copy when the segment holds nothing at or above U+0300 */
        size_t i = 0;
        while (i < n && (unsigned char)s[i] < 0xCC) i++;
        if (i < n) {
            norm = tokenizer_nfc(s, n, &nn);
            s = norm;
        }
    }
    int rc = t->has_normalized_added ? split_added(c, s, nn, 2) : encode_segment(t, s, nn, c->out, c->sc, c->md, c->err);
    free(norm);
    return rc;
}

int tokenizer_encode(const struct tokenizer *t, const char *text, size_t len, int32_t **ids_out, int *n_out,
                     struct error *err) {
    *ids_out = NULL;
    *n_out = 0;
    size_t bad;
    if (utf8_validate(text, len, &bad) < 0)
        return error_set(err, "invalid UTF-8 at byte %zu (0x%02x): text must be UTF-8", bad, (unsigned char)text[bad]);
    if (len > (size_t)INT32_MAX / 2) return error_set(err, "text too long (%zu bytes)", len);
    struct idvec out = {0};
    out.cap = (int)(len / 3 + 16);
    out.v = xmalloc((size_t)out.cap * sizeof *out.v);
    struct bpe_scratch sc = {0};
    pcre2_match_data *md = t->re ? pcre2_match_data_create_from_pattern(t->re, NULL) : NULL;
    struct enc_ctx c = {t, &out, &sc, md, err};
    int rc = split_added(&c, text, len, 1);
    pcre2_match_data_free(md);
    free(sc.sym);
    free(sc.heap);
    if (rc < 0) {
        free(out.v);
        return -1;
    }
    *ids_out = out.v;
    *n_out = out.n;
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * Decoding */

char *tokenizer_decode(const struct tokenizer *t, const int32_t *ids, int n, size_t *len_out) {
    size_t total = 0;
    for (int i = 0; i < n; i++)
        if (ids[i] >= 0 && ids[i] < t->vocab_size && t->tok_len[ids[i]] != UINT32_MAX) total += t->tok_len[ids[i]];
    char *out = xmalloc(total + 1);
    size_t o = 0;
    for (int i = 0; i < n; i++) {
        int32_t id = ids[i];
        if (id < 0 || id >= t->vocab_size || t->tok_len[id] == UINT32_MAX) continue;
        memcpy(out + o, t->bytes + t->tok_off[id], t->tok_len[id]);
        o += t->tok_len[id];
    }
    out[o] = 0;
    if (len_out) *len_out = o;
    return out;
}

int tokenizer_vocab_size(const struct tokenizer *t) { return t->vocab_size; }

int32_t tokenizer_token_id(const struct tokenizer *t, const char *token) {
    size_t n = strlen(token);
    for (int i = 0; i < t->n_added; i++)
        if (t->added[i].content_len == n && memcmp(t->added[i].content, token, n) == 0) return t->added[i].id;
    if (utf8_validate(token, n, NULL) < 0) return -1;
    char *tmp = xmalloc(n + 1);
    long nb = bytelevel_to_bytes(token, n, tmp);
    int32_t id = nb < 0 ? -1 : vocab_find(t, tmp, (size_t)nb);
    free(tmp);
    return id;
}

const char *tokenizer_token_bytes(const struct tokenizer *t, int32_t id, size_t *len) {
    if (id < 0 || id >= t->vocab_size || t->tok_len[id] == UINT32_MAX) {
        *len = 0;
        return NULL;
    }
    *len = t->tok_len[id];
    return t->bytes + t->tok_off[id];
}

int tokenizer_is_special(const struct tokenizer *t, int32_t id) {
    return id >= 0 && id < t->vocab_size && (t->tok_flags[id] & TOKF_SPECIAL);
}
int tokenizer_is_added(const struct tokenizer *t, int32_t id) {
    return id >= 0 && id < t->vocab_size && (t->tok_flags[id] & TOKF_ADDED);
}
int32_t tokenizer_eos_id(const struct tokenizer *t) { return t->eos_id; }
int32_t tokenizer_bos_id(const struct tokenizer *t) { return t->bos_id; }
int32_t tokenizer_pad_id(const struct tokenizer *t) { return t->pad_id; }
int tokenizer_add_bos(const struct tokenizer *t) { return t->add_bos; }
size_t tokenizer_max_token_bytes(const struct tokenizer *t) { return t->max_token_bytes; }

/* ---------------------------------------------------------------------------------------------
 * Streaming detokenizer */

void detok_init(struct detok *d, const struct tokenizer *t) {
    memset(d, 0, sizeof *d);
    d->t = t;
}

size_t detok_max_out(const struct tokenizer *t) { return 3 * (t->max_token_bytes + 4) + 4; }

static const char REPL[3] = {(char)0xEF, (char)0xBF, (char)0xBD}; /* U+FFFD */

size_t detok_push(struct detok *d, int32_t id, char *out, size_t cap) {
    const struct tokenizer *t = d->t;
    CHECK(cap >= detok_max_out(t));
    size_t n;
    const char *b = tokenizer_token_bytes(t, id, &n);
    if (!b || (d->skip_special && tokenizer_is_special(t, id))) return 0;
    size_t o = 0;
    /* process pending + b as one stream; pending is a valid incomplete prefix */
    unsigned char win[8];
    size_t i = 0; /* index into b */
    while (d->n_pending > 0 || i < n) {
        if (d->n_pending > 0) {
            /* extend the pending prefix with bytes from b */
            int np = d->n_pending;
            memcpy(win, d->pending, (size_t)np);
            size_t take = 0;
            while (np + take < 4 && i + take < n) win[np + take] = (unsigned char)b[i + take], take++;
            int k = utf8_seq(win, (size_t)np + take);
            if (k > 0) { /* completes */
                memcpy(out + o, win, (size_t)k);
                o += (size_t)k;
                i += (size_t)k - (size_t)np;
                d->n_pending = 0;
            } else if (k < 0) { /* still incomplete: all of b was absorbed */
                CHECK((size_t)(-k) == (size_t)np + take && i + take == n);
                memcpy(d->pending, win, (size_t)np + take);
                d->n_pending = np + (int)take;
                return o;
            } else {
                /* invalid: the maximal subpart is the longest valid prefix of win, which may
                 * include bytes of b that extended the pending prefix; they are consumed with
                 * it (one U+FFFD for all of them, as from_utf8_lossy) */
                size_t m = (size_t)np;
                while (m < (size_t)np + take && utf8_seq(win, m + 1) < 0) m++;
                memcpy(out + o, REPL, 3);
                o += 3;
                i += m - (size_t)np;
                d->n_pending = 0;
            }
            continue;
        }
        unsigned char c = (unsigned char)b[i];
        if (c < 0x80) { out[o++] = (char)c; i++; continue; }
        int k = utf8_seq((const unsigned char *)b + i, n - i);
        if (k > 0) {
            memcpy(out + o, b + i, (size_t)k);
            o += (size_t)k;
            i += (size_t)k;
        } else if (k < 0) { /* valid prefix running to the end of b: hold back */
            memcpy(d->pending, b + i, n - i);
            d->n_pending = (int)(n - i);
            return o;
        } else {
            /* maximal invalid subpart: the lead byte plus the continuation bytes that were valid */
            size_t m = 1;
            while (i + m < n && utf8_seq((const unsigned char *)b + i, m + 1) < 0) m++;
            /* utf8_seq(...m+1) < 0 means the first m+1 bytes are a valid prefix; stop before the bad one */
            memcpy(out + o, REPL, 3);
            o += 3;
            i += m;
        }
    }
    return o;
}

size_t detok_flush(struct detok *d, char *out, size_t cap) {
    CHECK(cap >= 3);
    if (d->n_pending == 0) return 0;
    d->n_pending = 0;
    memcpy(out, REPL, 3);
    return 3;
}
