/* utf8_lossy.h - a reference for lossy UTF-8 decoding, written apart from the tokenizer's own
 * code so that tests (test_tokenizer.c) and fuzz targets (tests/fuzz/) can check detok against
 * it: Rust's String::from_utf8_lossy (what tokenizers' decode does), i.e. the Unicode "maximal
 * subpart" practice. The well-formed sequences are those of Unicode Table 3-7; at an ill-formed
 * position, the bytes that were still a valid prefix (at least one) become one U+FFFD. */
#ifndef STRATA_TESTS_UTF8_LOSSY_H
#define STRATA_TESTS_UTF8_LOSSY_H

#include <stddef.h>

/* Writes the lossy decoding of s[0..n) to out (room for 3 * n bytes); returns its length. */
static size_t utf8_lossy(const unsigned char *s, size_t n, unsigned char *out) {
    size_t i = 0, o = 0;
    while (i < n) {
        unsigned c = s[i];
        if (c < 0x80) {
            out[o++] = (unsigned char)c;
            i++;
            continue;
        }
        size_t len = 0;
        unsigned lo = 0x80, hi = 0xBF; /* the second byte's range (Table 3-7) */
        if (c >= 0xC2 && c <= 0xDF) len = 2;
        else if (c == 0xE0) len = 3, lo = 0xA0;
        else if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF) len = 3;
        else if (c == 0xED) len = 3, hi = 0x9F;
        else if (c == 0xF0) len = 4, lo = 0x90;
        else if (c >= 0xF1 && c <= 0xF3) len = 4;
        else if (c == 0xF4) len = 4, hi = 0x8F;
        size_t k = 1;
        while (len && k < len && i + k < n) {
            unsigned b = s[i + k];
            if (k == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) break;
            k++;
        }
        if (len && k == len) {
            for (size_t q = 0; q < len; q++) out[o++] = s[i + q];
            i += len;
        } else {
            out[o++] = 0xEF, out[o++] = 0xBF, out[o++] = 0xBD;
            i += k;
        }
    }
    return o;
}

#endif
