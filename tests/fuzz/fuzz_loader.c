/* fuzz_loader.c - the checkpoint loaders on arbitrary bytes. The first byte picks the loader,
 * the rest is the file:
 *   0  config.json            config_parse
 *   1  a .safetensors file    safetensors_open_file (header, offsets, dtypes, the data region)
 *   2  an index.json          safetensors_open_dir over two valid shards
 *                             (tests/bad/ok_flat_sharded), so weight_map is checked against them
 *   3  tokenizer.json         tokenizer_load (without a tokenizer_config.json beside it)
 * Property: each returns success or a message, never crashes, leaks or reads out of bounds
 * (ASan/UBSan, LeakSanitizer); a failure always fills the message. */
#include "fuzz.h"

#include "model/config.h"
#include "model/safetensors.h"
#include "text/tokenizer.h"

static char st_path[600], idx_dir[600], idx_path[700], tok_path[600];

static void copy_file(const char *from, const char *to) {
    struct error err;
    size_t n;
    char *b = read_file(from, &n, &err);
    FUZZ_CHECK(b, "%s (run from the repository root)", err.msg);
    fuzz_write(to, b, n);
    free(b);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    const char *d = fuzz_tmpdir();
    snprintf(st_path, sizeof st_path, "%s/model.safetensors", d);
    snprintf(idx_dir, sizeof idx_dir, "%s/sharded", d);
    mkdir(idx_dir, 0700);
    snprintf(idx_path, sizeof idx_path, "%s/model.safetensors.index.json", idx_dir);
    snprintf(tok_path, sizeof tok_path, "%s/tokenizer.json", d);
    char to[800];
    for (int i = 1; i <= 2; i++) {
        char from[200];
        snprintf(from, sizeof from, "tests/bad/ok_flat_sharded/model-0000%d-of-00002.safetensors", i);
        snprintf(to, sizeof to, "%s/model-0000%d-of-00002.safetensors", idx_dir, i);
        copy_file(from, to);
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const char *body = (const char *)data + 1;
    size_t n = size - 1;
    struct error err;
    err.msg[0] = 0;
    switch (data[0] % 4) {
    case 0: {
        struct config c;
        if (config_parse(&c, body, n, "config.json", &err) != 0)
            FUZZ_CHECK(err.msg[0], "config_parse failed without a message");
        break;
    }
    case 1: {
        fuzz_write(st_path, body, n);
        struct safetensors st;
        if (safetensors_open_file(&st, st_path, &err) == 0) {
            /* every tensor lies inside the file */
            for (int i = 0; i < st.n_tensors; i++) {
                const struct st_tensor *t = &st.tensors[i];
                const char *base = st.files[t->file].map;
                FUZZ_CHECK((const char *)t->data >= base &&
                               (const char *)t->data + t->nbytes <= base + st.files[t->file].size,
                           "tensor %s outside its file", t->name);
            }
            safetensors_close(&st);
        } else {
            FUZZ_CHECK(err.msg[0], "safetensors_open_file failed without a message");
        }
        break;
    }
    case 2: {
        fuzz_write(idx_path, body, n);
        struct safetensors st;
        if (safetensors_open_dir(&st, idx_dir, &err) == 0) safetensors_close(&st);
        else FUZZ_CHECK(err.msg[0], "safetensors_open_dir failed without a message");
        break;
    }
    case 3: {
        fuzz_write(tok_path, body, n);
        struct tokenizer *t = tokenizer_load(tok_path, &err);
        if (t) {
            /* a loaded tokenizer encodes and decodes */
            int32_t *ids;
            int k;
            struct error e2;
            if (tokenizer_encode(t, "Hello, world! <|im_end|> 123", 27, &ids, &k, &e2) == 0) {
                size_t dl;
                free(tokenizer_decode(t, ids, k, &dl));
            }
            free(ids);
            tokenizer_free(t);
        } else {
            FUZZ_CHECK(err.msg[0], "tokenizer_load failed without a message");
        }
        break;
    }
    }
    return 0;
}
