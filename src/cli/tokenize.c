/* tokenize.c - `strata tokenize`: UTF-8 text on stdin -> ids on one line (space-separated),
 * or with --decode, ids on stdin -> the text (raw bytes, as the model would emit them). The
 * tokenizer defaults to the bundled demo model's tokenizer.json. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "text/tokenizer.h"

static void tokenize_usage(FILE *f) {
    fprintf(f,
            "usage: strata tokenize [--tokenizer FILE] [--decode] < input\n"
            "  text on stdin -> token ids on one line; --decode: ids on stdin -> text\n"
            "  --tokenizer FILE  tokenizer.json (default: the demo model's)\n");
}

/* argv holds the arguments after "tokenize" (main.c strips "strata tokenize"). */
int cmd_tokenize(int argc, char **argv) {
    const char *path = NULL;
    int decode = 0;
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--tokenizer") == 0 && i + 1 < argc) path = argv[++i];
        else if (strcmp(argv[i], "--decode") == 0) decode = 1;
        else if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            tokenize_usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "strata tokenize: unknown argument '%s'\n", argv[i]);
            tokenize_usage(stderr);
            return 2;
        }
    }
    char def[4096];
    if (!path) {
        snprintf(def, sizeof def, "%s/tokenizer.json", cli_default_model_dir());
        path = def;
    }
    struct error err = {{0}};
    struct tokenizer *t = tokenizer_load(path, &err);
    if (!t) {
        fprintf(stderr, "strata tokenize: %s\n", err.msg);
        return 1;
    }
    size_t len;
    char *in = read_stream(stdin, &len);
    if (!in) {
        fprintf(stderr, "strata tokenize: error reading stdin\n");
        tokenizer_free(t);
        return 1;
    }
    int rc = 0;
    if (decode) {
        int cap = 1024, n = 0;
        int32_t *ids = xmalloc((size_t)cap * sizeof *ids);
        char *p = in;
        for (;;) {
            while (*p == ' ' || *p == '\n' || *p == '\t' || *p == '\r' || *p == ',') p++;
            if (!*p) break;
            char *end;
            errno = 0;
            long v = strtol(p, &end, 10);
            if (end == p || errno || v < 0 || v >= tokenizer_vocab_size(t)) {
                int w = (int)strcspn(p, " \t\r\n,");
                fprintf(stderr, "strata tokenize: bad token id \"%.*s\" (ids are 0..%d)\n", w > 20 ? 20 : w, p,
                        tokenizer_vocab_size(t) - 1);
                rc = 1;
                break;
            }
            if (n == cap) ids = xrealloc(ids, (size_t)(cap *= 2) * sizeof *ids);
            ids[n++] = (int32_t)v;
            p = end;
        }
        if (rc == 0) {
            size_t out_len;
            char *text = tokenizer_decode(t, ids, n, &out_len);
            fwrite(text, 1, out_len, stdout);
            free(text);
        }
        free(ids);
    } else {
        int32_t *ids;
        int n;
        if (tokenizer_encode(t, in, len, &ids, &n, &err) < 0) {
            fprintf(stderr, "strata tokenize: %s\n", err.msg);
            rc = 1;
        } else {
            for (int i = 0; i < n; i++) printf(i ? " %d" : "%d", ids[i]);
            printf("\n");
        }
        free(ids);
    }
    free(in);
    tokenizer_free(t);
    return rc;
}
