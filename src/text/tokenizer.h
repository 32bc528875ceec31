/* tokenizer.h - the Qwen byte-level BPE tokenizer, loaded from a checkpoint's tokenizer.json
 * (+ tokenizer_config.json beside it), exact against Hugging Face `tokenizers`:
 *   encode: added tokens split out of the raw text first (leftmost-longest), NFC (ICU, with
 *           tokenizers' Unicode 9.0 view: later characters are left alone), the Split regex read
 *           from the file (PCRE2, UTF + UCP + JIT, \s rewritten to onig's White_Space set),
 *           byte-level mapping, BPE by merge rank;
 *   decode: token bytes concatenated (raw bytes, may be invalid UTF-8 for partial sequences);
 *   detok:  streaming decode that only ever emits complete UTF-8 (for SSE).
 * Supported tokenizer.json shapes: model BPE (merges as "a b" or ["a","b"]), normalizer NFC or
 * null, pre_tokenizer Sequence[Split(Regex|String, Isolated), ByteLevel(use_regex=false)] or a lone
 * Split, decoder ByteLevel. Anything else is refused at load with a message naming the field.
 * A loaded tokenizer is immutable: encode/decode may be called from many threads at once. */
#ifndef STRATA_TOKENIZER_H
#define STRATA_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "util.h"

struct tokenizer;

/* Loads tokenizer.json (strict; fills err naming the file and the field on any problem) and,
 * if present, tokenizer_config.json in the same directory (eos/bos/pad tokens, add_bos_token,
 * and added_tokens_decoder entries missing from tokenizer.json). */
struct tokenizer *tokenizer_load(const char *tokenizer_json_path, struct error *err);
void tokenizer_free(struct tokenizer *t);

/* Encodes len bytes of UTF-8 text (NUL bytes allowed) into a malloc'd id array (*ids_out, freed by
 * the caller; set even when *n_out is 0). No BOS/EOS is added (Qwen adds none). Returns 0, or -1
 * with a message like "invalid UTF-8 at byte 12 (0xff)" on invalid input. Thread-safe. */
int tokenizer_encode(const struct tokenizer *t, const char *text, size_t len, int32_t **ids_out,
                     int *n_out, struct error *err);

/* Raw bytes of the tokens concatenated, NUL-terminated, malloc'd; *len_out (if non-NULL) excludes
 * the NUL. Ids outside [0, vocab_size) or unassigned are skipped (as tokenizers does). */
char *tokenizer_decode(const struct tokenizer *t, const int32_t *ids, int n, size_t *len_out);

int tokenizer_vocab_size(const struct tokenizer *t); /* highest id + 1 */
/* Id of an exact token string as written in tokenizer.json ("<|im_end|>", "Ġthe"), or -1. */
int32_t tokenizer_token_id(const struct tokenizer *t, const char *token);
/* The raw bytes of one token (not NUL-terminated); NULL and *len = 0 for an unknown id. */
const char *tokenizer_token_bytes(const struct tokenizer *t, int32_t id, size_t *len);
/* 1 if id is an added token marked "special": true (e.g. <|im_end|>), else 0. */
int tokenizer_is_special(const struct tokenizer *t, int32_t id);
/* 1 if id is any added token (special or not, e.g. <think>), else 0. */
int tokenizer_is_added(const struct tokenizer *t, int32_t id);
/* From tokenizer_config.json (-1 / 0 when absent). */
int32_t tokenizer_eos_id(const struct tokenizer *t);
int32_t tokenizer_bos_id(const struct tokenizer *t);
int32_t tokenizer_pad_id(const struct tokenizer *t);
int tokenizer_add_bos(const struct tokenizer *t);
/* Longest token in bytes (sizes the detok output buffer). */
size_t tokenizer_max_token_bytes(const struct tokenizer *t);

/* Unicode NFC of valid UTF-8 as tokenizers applies it (characters assigned after Unicode 9.0 are
 * treated as unassigned, like its normalization tables do); malloc'd, NUL-terminated. */
char *tokenizer_nfc(const char *text, size_t len, size_t *len_out);
/* Checks UTF-8 validity (no overlongs, surrogates or code points past U+10FFFF); returns -1 and
 * the offset of the first bad byte in *bad_at, or 0. */
int utf8_validate(const char *s, size_t len, size_t *bad_at);
/* The character at s (n > 0 bytes available): its length when valid, 0 when s[0] starts no valid
 * sequence, or -k when all n bytes are a valid but incomplete prefix of k < 4 bytes. */
int utf8_char_len(const char *s, size_t n);

/* Streaming detokenizer. No allocation: all state lives in the struct, and detok_push writes into
 * the caller's buffer, which must hold at least detok_max_out(t) bytes (CHECKed). Output is
 * always complete, valid UTF-8: bytes of a sequence still being completed are held back (at most
 * 3); bytes that can never form a valid sequence become U+FFFD, one per maximal invalid subpart,
 * exactly as Rust's String::from_utf8_lossy (what tokenizers' decode does) - so the concatenated
 * stream equals the lossy decode of all ids. detok_flush turns a never-completed tail into U+FFFD.
 * Set d->skip_special = 1 after init to drop special added tokens (<|im_end|>) from the output. */
struct detok {
    const struct tokenizer *t;
    unsigned char pending[4]; /* (n_pending,) bytes of an incomplete UTF-8 sequence */
    int n_pending;
    int skip_special;
};
void detok_init(struct detok *d, const struct tokenizer *t);
size_t detok_max_out(const struct tokenizer *t);
/* Appends the text that token `id` completes; returns the number of bytes written (may be 0). */
size_t detok_push(struct detok *d, int32_t id, char *out, size_t cap);
/* Writes U+FFFD for a held-back incomplete tail (if any) and resets; returns bytes written. */
size_t detok_flush(struct detok *d, char *out, size_t cap);

#endif
