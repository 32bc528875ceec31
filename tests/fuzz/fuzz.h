/* fuzz.h - what the libFuzzer targets in tests/fuzz/ share: FUZZ_CHECK (a property that must
 * hold for every input: prints and aborts, so libFuzzer keeps the input as a crash), a scratch
 * directory for targets that go through files, and the repository paths they load once.
 * Each target is built two ways: with clang -fsanitize=fuzzer (make fuzz) and with replay.c as
 * main (make test: every file of tests/fuzz/corpus/<target>/ - seeds and crash reproducers -
 * run once, as a regression test). */
#ifndef STRATA_FUZZ_H
#define STRATA_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define FUZZ_CHECK(cond, ...)                                                                  \
    do {                                                                                       \
        if (!(cond)) {                                                                         \
            fprintf(stderr, "FUZZ_CHECK %s:%d: %s: ", __FILE__, __LINE__, #cond);              \
            fprintf(stderr, __VA_ARGS__);                                                      \
            fputc('\n', stderr);                                                               \
            abort();                                                                           \
        }                                                                                      \
    } while (0)

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A directory of this process for files the target writes ($TMPDIR or /tmp). */
static inline const char *fuzz_tmpdir(void) {
    static char dir[512];
    if (!dir[0]) {
        const char *t = getenv("TMPDIR");
        snprintf(dir, sizeof dir, "%s/strata-fuzz-%d", t && *t ? t : "/tmp", (int)getpid());
        mkdir(dir, 0700);
    }
    return dir;
}

static inline void fuzz_write(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    FUZZ_CHECK(f, "cannot write %s", path);
    if (n) fwrite(data, 1, n, f);
    fclose(f);
}

/* The demo model (STRATA_DEMO_MODEL overrides) and the Qwen3 tokenizer, relative to the
 * repository root, where make runs the targets. */
static inline const char *fuzz_model_dir(void) {
    const char *m = getenv("STRATA_DEMO_MODEL");
    return m && *m ? m : "demo";
}

#endif
