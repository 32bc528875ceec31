/* fuzz_tokenizer.c - the Qwen3 tokenizer (data/qwen3-tokenizer/tokenizer.json). The first byte
 * picks the mode, the rest is the input:
 *   even  text: encode. Invalid UTF-8 must be refused (with the offset), valid UTF-8 encoded to
 *         ids inside the vocabulary; when the text is already NFC, decode(encode(text)) is the
 *         text again, byte for byte
 *   odd   ids (three bytes each, little-endian, modulo vocab + 16 so unknown ids occur):
 *         the streaming decode (detok_push, id by id, then detok_flush) writes valid UTF-8 in
 *         every piece and, concatenated, equals the lossy UTF-8 decoding (tests/utf8_lossy.h,
 *         Rust's from_utf8_lossy as tokenizers uses it) of tokenizer_decode's bytes; the second
 *         byte's low bit sets skip_special, which must equal decoding without the specials */
#include "fuzz.h"

#include "../utf8_lossy.h"
#include "text/tokenizer.h"

static struct tokenizer *tok;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    struct error err;
    tok = tokenizer_load("data/qwen3-tokenizer/tokenizer.json", &err);
    FUZZ_CHECK(tok, "%s (run from the repository root)", err.msg);
    return 0;
}

static void fuzz_text(const char *s, size_t n) {
    int32_t *ids;
    int k;
    struct error err;
    size_t bad;
    int valid = utf8_validate(s, n, &bad) == 0;
    int rc = tokenizer_encode(tok, s, n, &ids, &k, &err);
    FUZZ_CHECK(valid ? rc == 0 : rc != 0 && strstr(err.msg, "invalid UTF-8 at byte"),
               "valid %d, encode rc %d: %s", valid, rc, rc ? err.msg : "");
    if (rc != 0) return;
    for (int i = 0; i < k; i++) FUZZ_CHECK(ids[i] >= 0 && ids[i] < tokenizer_vocab_size(tok), "id %d", ids[i]);
    size_t nl;
    char *nfc = tokenizer_nfc(s, n, &nl);
    if (nl == n && !memcmp(nfc, s, n)) {
        size_t dl;
        char *d = tokenizer_decode(tok, ids, k, &dl);
        FUZZ_CHECK(dl == n && !memcmp(d, s, n), "decode(encode(text)) != text (%zu vs %zu bytes)", dl, n);
        free(d);
    }
    free(nfc);
    free(ids);
}

static void fuzz_ids(const uint8_t *p, size_t n, int skip_special) {
    int vocab = tokenizer_vocab_size(tok), k = (int)(n / 3);
    int32_t *ids = malloc((size_t)(k ? k : 1) * sizeof *ids), *kept = malloc((size_t)(k ? k : 1) * sizeof *kept);
    int nk = 0;
    for (int i = 0; i < k; i++) {
        ids[i] = (int32_t)((uint32_t)(p[3 * i] | p[3 * i + 1] << 8 | p[3 * i + 2] << 16) % (uint32_t)(vocab + 16));
        if (!(skip_special && tokenizer_is_special(tok, ids[i]))) kept[nk++] = ids[i];
    }
    size_t rl;
    char *raw = tokenizer_decode(tok, kept, nk, &rl);
    unsigned char *want = malloc(3 * rl + 1);
    size_t wl = utf8_lossy((const unsigned char *)raw, rl, want);
    struct detok d;
    detok_init(&d, tok);
    d.skip_special = skip_special;
    size_t cap = detok_max_out(tok), gl = 0;
    char *piece = malloc(cap), *got = malloc(3 * rl + 8);
    for (int i = 0; i <= k; i++) {
        size_t m = i < k ? detok_push(&d, ids[i], piece, cap) : detok_flush(&d, piece, cap);
        FUZZ_CHECK(m <= cap && utf8_validate(piece, m, NULL) == 0, "a piece of invalid UTF-8 at id %d", i);
        FUZZ_CHECK(gl + m <= 3 * rl + 8, "streamed more than the lossy decoding can hold");
        memcpy(got + gl, piece, m);
        gl += m;
    }
    FUZZ_CHECK(gl == wl && !memcmp(got, want, wl), "streaming decode (%zu bytes) != lossy reference (%zu)", gl, wl);
    free(piece), free(got), free(want), free(raw), free(ids), free(kept);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    if (data[0] % 2 == 0) fuzz_text((const char *)data + 1, size - 1);
    else if (size >= 2) fuzz_ids(data + 2, size - 2, data[1] & 1);
    return 0;
}
