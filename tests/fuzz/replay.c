/* replay.c - main() for a fuzz target outside libFuzzer: runs LLVMFuzzerTestOneInput once on
 * every file named (or in every directory named; default tests/fuzz/corpus/FUZZ_NAME) and
 * prints "N passed, 0 failed". A failing input aborts the process (FUZZ_CHECK, or a sanitizer
 * under make test-asan) after its path is printed, so the suite reports it. */
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz.h"

static const char *current;

static void on_fatal(int sig) {
    static const char m[] = "replay: the input that failed: ";
    if (write(2, m, sizeof m - 1) < 0 || write(2, current, strlen(current)) < 0 || write(2, "\n", 1) < 0) {
    }
    signal(sig, SIG_DFL);
    raise(sig);
}

static int run_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *buf = malloc(n > 0 ? (size_t)n : 1);
    size_t got = n > 0 ? fread(buf, 1, (size_t)n, f) : 0;
    fclose(f);
    current = path;
    LLVMFuzzerTestOneInput(buf, got);
    free(buf);
    return 1;
}

static int cmp(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static int run_path(const char *path) {
    struct stat st;
    if (stat(path, &st) != 0) {
        fprintf(stderr, "replay: %s: not found\n", path);
        return -1;
    }
    if (!S_ISDIR(st.st_mode)) return run_file(path);
    DIR *d = opendir(path);
    if (!d) return -1;
    char **names = NULL;
    int n = 0, done = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        names = realloc(names, (size_t)(n + 1) * sizeof *names);
        names[n] = malloc(strlen(path) + strlen(e->d_name) + 2);
        sprintf(names[n++], "%s/%s", path, e->d_name);
    }
    closedir(d);
    qsort(names, (size_t)n, sizeof *names, cmp);
    for (int i = 0; i < n; i++) {
        done += run_file(names[i]);
        free(names[i]);
    }
    free(names);
    return done;
}

int main(int argc, char **argv) {
    signal(SIGABRT, on_fatal);
    signal(SIGSEGV, on_fatal);
    current = "(initialisation)";
    LLVMFuzzerInitialize(&argc, &argv);
    int total = 0, bad = 0;
    if (argc < 2) {
        int k = run_path("tests/fuzz/corpus/" FUZZ_NAME);
        if (k < 0) bad++;
        else total += k;
    }
    for (int i = 1; i < argc; i++) {
        int k = run_path(argv[i]);
        if (k < 0) bad++;
        else total += k;
    }
    printf(FUZZ_NAME ": %d inputs replayed\n", total);
    printf("%d passed, %d failed\n", total, bad);
    return bad ? 1 : 0;
}
