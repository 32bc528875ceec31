/* bench_tokenizer.c - tokenizer speed: load time of tokenizer.json and single-threaded encode
 * throughput (MB/s, tokens/s) over a length-prefixed document corpus written by
 * tools/make_tokenizer_corpus.py --bench. Prints a checksum of all ids so that the run can be
 * matched against tools/bench_hf_tokenizer.py on the same corpus (same ids, same checksum).
 *
 *   bench_tokenizer --tokenizer data/qwen3-tokenizer/tokenizer.json --corpus bench.bin [--reps 3]
 *
 * Build: make bench (or: cc -O3 -march=x86-64-v3 -std=c11 -D_GNU_SOURCE -Isrc bench/bench_tokenizer.c
 *        src/text/tokenizer.c src/util.c -ljansson -lpcre2-8 -licuuc -licudata)
 * (for a binary to carry to another machine add -static and -lstdc++ -lm -lpthread: ICU is C++
 * inside). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/tokenizer.h"

int main(int argc, char **argv) {
    const char *tok_path = "data/qwen3-tokenizer/tokenizer.json", *corpus_path = NULL;
    int reps = 3;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--tokenizer") == 0 && i + 1 < argc) tok_path = argv[++i];
        else if (strcmp(argv[i], "--corpus") == 0 && i + 1 < argc) corpus_path = argv[++i];
        else if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc) reps = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: bench_tokenizer [--tokenizer FILE] --corpus FILE [--reps N]\n");
            return 2;
        }
    }
    struct error err = {{0}};
    /* load: first (cold-ish) and best of 5 */
    double first_ms = 0, best_ms = 1e30;
    struct tokenizer *t = NULL;
    for (int i = 0; i < 5; i++) {
        double t0 = now_ms();
        struct tokenizer *x = tokenizer_load(tok_path, &err);
        double dt = now_ms() - t0;
        if (!x) {
            fprintf(stderr, "bench_tokenizer: %s\n", err.msg);
            return 1;
        }
        if (i == 0) first_ms = dt;
        if (dt < best_ms) best_ms = dt;
        if (t) tokenizer_free(t);
        t = x;
    }
    int n_docs = 0;
    size_t total = 0;
    char **docs = NULL;
    size_t *lens = NULL;
    if (corpus_path) {
        size_t len;
        char *buf = read_file(corpus_path, &len, &err);
        if (!buf) {
            fprintf(stderr, "bench_tokenizer: %s\n", err.msg);
            return 1;
        }
        size_t off = 0;
        while (off + 4 <= len) {
            uint32_t n;
            memcpy(&n, buf + off, 4);
            off += 4;
            if (off + n > len) {
                fprintf(stderr, "bench_tokenizer: %s: truncated record\n", corpus_path);
                return 1;
            }
            docs = xrealloc(docs, (size_t)(n_docs + 1) * sizeof *docs);
            lens = xrealloc(lens, (size_t)(n_docs + 1) * sizeof *lens);
            docs[n_docs] = buf + off;
            lens[n_docs++] = n;
            total += n;
            off += n;
        }
    }
    printf("tokenizer: %s (vocab %d)\n", tok_path, tokenizer_vocab_size(t));
    printf("load: first %.1f ms, best of 5 %.1f ms\n", first_ms, best_ms);
    if (!n_docs) return 0;
    double best_s = 1e30;
    long long n_tokens = 0;
    uint64_t sum = 0;
    for (int r = 0; r < reps; r++) {
        n_tokens = 0;
        sum = 0;
        double t0 = now_ms();
        for (int d = 0; d < n_docs; d++) {
            int32_t *ids;
            int n;
            if (tokenizer_encode(t, docs[d], lens[d], &ids, &n, &err) < 0) {
                fprintf(stderr, "bench_tokenizer: doc %d: %s\n", d, err.msg);
                return 1;
            }
            for (int i = 0; i < n; i++) sum = sum * 1000003u + (uint64_t)ids[i];
            n_tokens += n;
            free(ids);
        }
        double s = (now_ms() - t0) / 1e3;
        if (s < best_s) best_s = s;
    }
    printf("corpus: %s, %d docs, %.2f MB, %lld tokens, checksum %016llx\n", corpus_path, n_docs, total / 1e6,
           n_tokens, (unsigned long long)sum);
    printf("| impl | threads | encode MB/s | tokens/s | best of %d (s) |\n|---|---|---|---|---|\n", reps);
    printf("| strata | 1 | %.2f | %.0f | %.3f |\n", total / 1e6 / best_s, n_tokens / best_s, best_s);
    tokenizer_free(t);
    return 0;
}
