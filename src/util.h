/* util.h - small things every module needs: error reporting, CHECK, allocation, bf16
 * conversion, timing. No model knowledge lives here. */
#ifndef STRATA_UTIL_H
#define STRATA_UTIL_H

#include <stddef.h>
#include <stdio.h>
#include <stdint.h>
#include <string.h>

/* A load or request error: functions return -1 (or NULL) and fill this. */
struct error {
    char msg[1024];
};

/* Formats into err->msg (if err is non-NULL) and returns -1, so `return error_set(...)` works. */
int error_set(struct error *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* A bug, not bad input: prints file:line and aborts, also in release builds. */
#define CHECK(cond)                                                                            \
    do {                                                                                       \
        if (!(cond)) check_fail(__FILE__, __LINE__, #cond);                                    \
    } while (0)
void check_fail(const char *file, int line, const char *cond) __attribute__((noreturn));

/* Allocation that aborts on out-of-memory (host memory exhaustion is not recoverable here). */
void *xmalloc(size_t n);
void *xcalloc(size_t n, size_t size);
void *xrealloc(void *p, size_t n);
char *xstrdup(const char *s);

/* bf16 <-> fp32. Rounding is round-to-nearest-even, as torch's .to(torch.bfloat16). */
static inline float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
/* Round a float through bf16 and back: the value a bf16 tensor would hold. */
static inline float bf16r(float f) { return bf16_to_f32(f32_to_bf16(f)); }

/* A growable byte string, always NUL-terminated once anything was added; zero-initialise it. */
struct strbuf {
    char *s; /* NULL while empty */
    size_t len, cap;
};
void strbuf_add(struct strbuf *b, const char *s, size_t n);
void strbuf_adds(struct strbuf *b, const char *s);
void strbuf_printf(struct strbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Returns the string ("" if nothing was added; the caller frees it) and resets b. */
char *strbuf_take(struct strbuf *b);

/* Monotonic wall clock in milliseconds. */
double now_ms(void);

/* The integer in environment variable `name` if it is one in [lo, hi]; `def` when unset, and
 * when malformed or out of range (then with a warning on stderr naming the variable). */
int env_int(const char *name, int def, int lo, int hi);

/* Reads a whole stream (e.g. stdin) into a NUL-terminated buffer; NULL on a read error. */
char *read_stream(FILE *f, size_t *len_out);
/* Reads a whole file into a NUL-terminated buffer; returns NULL and fills err on failure. */
char *read_file(const char *path, size_t *len_out, struct error *err);

#endif
