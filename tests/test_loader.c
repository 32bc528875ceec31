/* test_loader.c - checkpoint loading: config.json in both forms (defaults, legacy keys, derived
 * sizes), safetensors reading (bytes, sorting, lookup, edge cases of the format), the tests/bad
 * corpus (each case rejected by the stage its prefix names, with every line of its expected.txt
 * in the message, the earlier stages accepting it, and model_load failing the same way), and a
 * seeded random-mutation loop over a valid file and config that must never crash and must name
 * the file in every failure (run it longer with STRATA_FUZZ_ITERS=N under ASan).
 * Exact comparisons throughout: loading moves bytes, it computes nothing. */
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model/config.h"
#include "harness.h"
#include "model/model.h"
#include "model/safetensors.h"

static char bad_dir[1024]; /* tests/bad */
static char tmp_dir[256];

/* "a/b" (or "a/b/c" when c is non-NULL) in one of 4 rotating static buffers. */
static char *path3(const char *a, const char *b, const char *c) {
    static char buf[4][2048];
    static int k;
    char *p = buf[k++ & 3];
    snprintf(p, sizeof buf[0], c ? "%s/%s/%s" : "%s/%s", a, b, c);
    return p;
}
#define path2(a, b) path3(a, b, NULL)

static int write_file(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    size_t w = fwrite(data, 1, n, f);
    return (fclose(f) == 0 && w == n) ? 0 : -1;
}

/* ---------------------------------------------------------------------------------------------
 * config.json */

/* The published 0.8B config's text part (qwen35-model.md 1.3), in the nested form. */
static const char *cfg_08b =
    "{\"architectures\": [\"Qwen3_5ForConditionalGeneration\"], \"model_type\": \"qwen3_5\","
    " \"tie_word_embeddings\": true, \"image_token_id\": 248056,"
    " \"text_config\": {\"model_type\": \"qwen3_5_text\", \"vocab_size\": 248320,"
    " \"hidden_size\": 1024, \"intermediate_size\": 3584, \"num_hidden_layers\": 24,"
    " \"num_attention_heads\": 8, \"num_key_value_heads\": 2, \"head_dim\": 256,"
    " \"linear_conv_kernel_dim\": 4, \"linear_key_head_dim\": 128, \"linear_value_head_dim\": 128,"
    " \"linear_num_key_heads\": 16, \"linear_num_value_heads\": 16, \"rms_norm_eps\": 1e-06,"
    " \"max_position_embeddings\": 262144, \"hidden_act\": \"silu\", \"attention_bias\": false,"
    " \"full_attention_interval\": 4, \"eos_token_id\": 248044, \"attn_output_gate\": true,"
    " \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 10000000,"
    " \"partial_rotary_factor\": 0.25, \"mrope_section\": [11, 11, 10], \"mrope_interleaved\": true}},"
    " \"vision_config\": {\"model_type\": \"qwen3_5_vision\"}}";

/* A flat config with every optional key left out or in its legacy spelling. */
static const char *cfg_flat_legacy =
    "{\"architectures\": [\"Qwen3_5ForCausalLM\"], \"model_type\": \"qwen3_5_text\","
    " \"vocab_size\": 64, \"hidden_size\": 32, \"intermediate_size\": 48, \"num_hidden_layers\": 6,"
    " \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"head_dim\": 16,"
    " \"linear_conv_kernel_dim\": 3, \"linear_key_head_dim\": 8, \"linear_value_head_dim\": 4,"
    " \"linear_num_key_heads\": 2, \"linear_num_value_heads\": 6,"
    " \"full_attention_interval\": 3, \"rope_theta\": 500000, \"partial_rotary_factor\": 0.5,"
    " \"eos_token_id\": [7, 9]}";

static void test_config(void) {
    struct config c;
    struct error err = {{0}};
    int rc = config_parse(&c, cfg_08b, strlen(cfg_08b), "0.8b/config.json", &err);
    EXPECT(rc == 0, "0.8B config: %s", err.msg);
    if (rc == 0) {
        EXPECT(c.nested == 1 && !strcmp(c.architecture, "Qwen3_5ForConditionalGeneration"),
               "nested %d arch %s", c.nested, c.architecture);
        EXPECT(c.vocab_size == 248320 && c.hidden_size == 1024 && c.intermediate_size == 3584 &&
                   c.num_hidden_layers == 24 && c.num_attention_heads == 8 &&
                   c.num_key_value_heads == 2 && c.head_dim == 256,
               "0.8B dims");
        EXPECT(c.linear_conv_kernel_dim == 4 && c.linear_key_head_dim == 128 &&
                   c.linear_value_head_dim == 128 && c.linear_num_key_heads == 16 &&
                   c.linear_num_value_heads == 16,
               "0.8B linear dims");
        EXPECT(c.rope_theta == 1e7 && c.partial_rotary_factor == 0.25f && c.rotary_dim == 64,
               "rope theta %g factor %g dim %d", c.rope_theta, c.partial_rotary_factor,
               c.rotary_dim);
        EXPECT(c.rms_norm_eps == 1e-6f && c.max_position_embeddings == 262144, "eps, max pos");
        EXPECT(c.tie_word_embeddings == 1, "tie from the top level");
        EXPECT(c.n_eos_token_id == 1 && c.eos_token_id[0] == 248044, "eos");
        EXPECT(c.key_dim == 2048 && c.value_dim == 2048 && c.conv_dim == 6144, "derived dims %d %d %d",
               c.key_dim, c.value_dim, c.conv_dim);
        EXPECT(c.n_full_layers == 6 && c.n_linear_layers == 18, "6 full, 18 linear");
        int pattern_ok = 1;
        for (int i = 0; i < 24; i++)
            pattern_ok &= c.layer_types[i] == ((i % 4 == 3) ? LAYER_FULL_ATTENTION
                                                            : LAYER_LINEAR_ATTENTION);
        EXPECT(pattern_ok, "layer i full iff (i+1) %% 4 == 0");
    }

    rc = config_parse(&c, cfg_flat_legacy, strlen(cfg_flat_legacy), "flat.json", &err);
    EXPECT(rc == 0, "flat legacy config: %s", err.msg);
    if (rc == 0) {
        EXPECT(c.nested == 0 && !strcmp(c.architecture, "Qwen3_5ForCausalLM"), "flat");
        EXPECT(c.rope_theta == 500000 && c.partial_rotary_factor == 0.5f && c.rotary_dim == 8,
               "legacy top-level rope keys: theta %g factor %g", c.rope_theta,
               c.partial_rotary_factor);
        EXPECT(c.max_position_embeddings == 32768 && c.rms_norm_eps == 1e-6f,
               "Qwen3_5TextConfig defaults");
        EXPECT(c.tie_word_embeddings == 0, "tie defaults to false");
        EXPECT(c.n_eos_token_id == 2 && c.eos_token_id[0] == 7 && c.eos_token_id[1] == 9,
               "eos list");
        EXPECT(c.layer_types[2] == LAYER_FULL_ATTENTION && c.layer_types[5] == LAYER_FULL_ATTENTION &&
                   c.n_full_layers == 2 && c.layer_types[0] == LAYER_LINEAR_ATTENTION,
               "full_attention_interval 3");
        EXPECT(c.key_dim == 16 && c.value_dim == 24 && c.conv_dim == 56, "derived");
    }

    /* small variations on the flat form, each a complete config */
    struct {
        const char *extra; /* spliced in before the closing brace */
        const char *what;
    } v[] = {
        {", \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 1000}", "rope_parameters wins"},
        {", \"rope_scaling\": {\"type\": \"default\", \"rope_theta\": 2000, \"partial_rotary_factor\": 0.25}",
         "rope_scaling alias"},
        {", \"layer_types\": [\"mamba\", \"attention\", \"linear_attention\", \"full_attention\", "
         "\"mamba\", \"mamba\"]", "legacy layer type names"},
        {", \"tie_word_embeddings\": true", "flat tie"},
    };
    char buf[4096];
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        size_t n = strlen(cfg_flat_legacy) - 1;
        snprintf(buf, sizeof buf, "%.*s%s}", (int)n, cfg_flat_legacy, v[i].extra);
        rc = config_parse(&c, buf, strlen(buf), "flat.json", &err);
        EXPECT(rc == 0, "%s: %s", v[i].what, err.msg);
        if (rc) continue;
        if (i == 0) EXPECT(c.rope_theta == 1000 && c.rotary_dim == 8, "%s: %g", v[i].what, c.rope_theta);
        if (i == 1) EXPECT(c.rope_theta == 2000 && c.rotary_dim == 4, "%s", v[i].what);
        if (i == 2)
            EXPECT(c.layer_types[0] == LAYER_LINEAR_ATTENTION &&
                       c.layer_types[1] == LAYER_FULL_ATTENTION && c.n_full_layers == 2,
                   "%s", v[i].what);
        if (i == 3) EXPECT(c.tie_word_embeddings == 1, "%s", v[i].what);
    }

    /* nested: tie and eos precedence between the top level and text_config */
    const char *tc_no_vocab = "\"hidden_size\": 16, \"intermediate_size\": 32,"
                              " \"num_hidden_layers\": 4, \"num_attention_heads\": 2,"
                              " \"num_key_value_heads\": 1, \"head_dim\": 8,"
                              " \"linear_conv_kernel_dim\": 4, \"linear_key_head_dim\": 4,"
                              " \"linear_value_head_dim\": 4, \"linear_num_key_heads\": 2,"
                              " \"linear_num_value_heads\": 4";
    const char *tc = "\"vocab_size\": 32, \"hidden_size\": 16, \"intermediate_size\": 32,"
                     " \"num_hidden_layers\": 4, \"num_attention_heads\": 2,"
                     " \"num_key_value_heads\": 1, \"head_dim\": 8, \"linear_conv_kernel_dim\": 4,"
                     " \"linear_key_head_dim\": 4, \"linear_value_head_dim\": 4,"
                     " \"linear_num_key_heads\": 2, \"linear_num_value_heads\": 4";
    struct {
        const char *top, *text;
        int tie, n_eos, eos0;
    } p[] = {
        {"", "", 0, 0, 0},
        {"", ", \"tie_word_embeddings\": true", 1, 0, 0},
        {"\"tie_word_embeddings\": false,", ", \"tie_word_embeddings\": true", 0, 0, 0},
        {"\"tie_word_embeddings\": true,", ", \"tie_word_embeddings\": false", 1, 0, 0},
        {"\"eos_token_id\": [3, 4],", "", 0, 2, 3},
        {"\"eos_token_id\": [3, 4],", ", \"eos_token_id\": 5", 0, 1, 5},
        {"\"eos_token_id\": 6,", ", \"eos_token_id\": null", 0, 1, 6},
    };
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) {
        snprintf(buf, sizeof buf, "{%s \"text_config\": {%s%s}}", p[i].top, tc, p[i].text);
        rc = config_parse(&c, buf, strlen(buf), "nested.json", &err);
        EXPECT(rc == 0, "precedence %zu: %s", i, err.msg);
        if (rc) continue;
        EXPECT(c.nested && c.tie_word_embeddings == p[i].tie, "precedence %zu: tie %d, want %d", i,
               c.tie_word_embeddings, p[i].tie);
        EXPECT(c.n_eos_token_id == p[i].n_eos && (!p[i].n_eos || c.eos_token_id[0] == p[i].eos0),
               "precedence %zu: %d eos, first %d", i, c.n_eos_token_id, c.eos_token_id[0]);
        EXPECT(c.rope_theta == 10000 && c.rotary_dim == 2, "no rope keys: transformers' defaults");
    }
    /* text fields at the top level of a nested file are not used (transformers ignores them) */
    snprintf(buf, sizeof buf, "{\"vocab_size\": 32, \"text_config\": {%s}}", tc_no_vocab);
    rc = config_parse(&c, buf, strlen(buf), "nested.json", &err);
    EXPECT(rc != 0 && strstr(err.msg, "nested.json: text_config.vocab_size: missing"),
           "top-level text field in a nested file: %s", err.msg);
}

/* ---------------------------------------------------------------------------------------------
 * safetensors */

/* The value make_bad_corpus.py writes at element j of tensor `name`. */
static float corpus_value(const char *name, size_t j) {
    return (float)((int)((7 * j + strlen(name)) % 17) - 8) / 16.0f;
}

static int check_tensor_bytes(const struct st_tensor *t) {
    size_t n = t->nbytes / st_dtype_size(t->dtype);
    for (size_t j = 0; j < n; j++) {
        float x;
        if (t->dtype == ST_BF16)
            x = bf16_to_f32(((const uint16_t *)t->data)[j]);
        else if (t->dtype == ST_F32)
            memcpy(&x, (const char *)t->data + 4 * j, 4);
        else
            return 0;
        if (x != corpus_value(t->name, j)) return 0;
    }
    return 1;
}

/* Invariants of a successfully opened checkpoint. Returns a description of the first violation. */
static const char *st_invariants(const struct safetensors *st) {
    for (int i = 0; i < st->n_tensors; i++) {
        const struct st_tensor *t = &st->tensors[i];
        if (i && strcmp(st->tensors[i - 1].name, t->name) >= 0) return "not sorted / duplicate";
        if (t->file < 0 || t->file >= st->n_files) return "bad file index";
        const struct st_file *f = &st->files[t->file];
        const char *lo = f->map, *d = t->data;
        if (t->nbytes && (d < lo + 8 || d + t->nbytes > lo + f->size)) return "data outside the file";
        if ((uintptr_t)d % st_dtype_size(t->dtype)) return "misaligned";
        uint64_t count = st_dtype_size(t->dtype);
        if (t->ndim < 0 || t->ndim > ST_MAX_DIMS) return "ndim";
        for (int k = 0; k < t->ndim; k++) count *= (uint64_t)t->shape[k];
        if (count != t->nbytes) return "nbytes != shape x dtype";
        if (safetensors_find(st, t->name) != t) return "find";
    }
    return NULL;
}

static void test_safetensors(void) {
    struct safetensors a, b;
    struct error err = {{0}};
    EXPECT(!strcmp(st_dtype_name(ST_BF16), "BF16") && st_dtype_size(ST_BF16) == 2 &&
               st_dtype_size(ST_F32) == 4 && st_dtype_size(ST_F8_E4M3) == 1 &&
               !strcmp(st_dtype_name(ST_F8_E5M2), "F8_E5M2"),
           "dtype table");

    int ra = safetensors_open_dir(&a, path2(bad_dir, "ok_nested_single"), &err);
    EXPECT(ra == 0, "ok_nested_single: %s", err.msg);
    int rb = safetensors_open_dir(&b, path2(bad_dir, "ok_nested_sharded"), &err);
    EXPECT(rb == 0, "ok_nested_sharded: %s", err.msg);
    if (ra == 0 && rb == 0) {
        /* 2 + 3 linear x 14 + 1 full x 11 text tensors, + 2 visual + 2 mtp */
        EXPECT(a.n_tensors == 2 + 3 * 14 + 11 + 4 && b.n_tensors == a.n_tensors,
               "tensor counts %d %d", a.n_tensors, b.n_tensors);
        EXPECT(a.n_files == 1 && b.n_files == 2, "files %d %d", a.n_files, b.n_files);
        EXPECT(a.metadata_json && !strcmp(a.metadata_json, "{\"format\":\"pt\"}"), "metadata %s",
               a.metadata_json ? a.metadata_json : "(null)");
        EXPECT(st_invariants(&a) == NULL && st_invariants(&b) == NULL, "invariants");
        int same = 1, bytes_ok = 1, in_shard2 = 0;
        for (int i = 0; i < a.n_tensors && i < b.n_tensors; i++) {
            const struct st_tensor *x = &a.tensors[i], *y = &b.tensors[i];
            same &= !strcmp(x->name, y->name) && x->dtype == y->dtype && x->ndim == y->ndim &&
                    x->nbytes == y->nbytes && !memcmp(x->data, y->data, x->nbytes);
            bytes_ok &= check_tensor_bytes(x);
            in_shard2 += y->file == 1;
        }
        EXPECT(same, "single file and 2 shards hold the same tensors");
        EXPECT(bytes_ok, "every tensor holds the values make_bad_corpus.py wrote");
        EXPECT(in_shard2 > 0 && in_shard2 < b.n_tensors, "both shards used (%d in the second)",
               in_shard2);
        const struct st_tensor *t = safetensors_find(&a, "model.language_model.layers.0.linear_attn.A_log");
        EXPECT(t && t->dtype == ST_F32 && t->ndim == 1 && t->shape[0] == 4 && t->nbytes == 16,
               "A_log F32 [4]");
        t = safetensors_find(&a, "model.language_model.layers.0.linear_attn.conv1d.weight");
        EXPECT(t && t->dtype == ST_BF16 && t->ndim == 3 && t->shape[0] == 32 && t->shape[1] == 1 &&
                   t->shape[2] == 4,
               "conv1d BF16 [32, 1, 4]");
        EXPECT(safetensors_find(&a, "model.language_model.layers.9.mlp.up_proj.weight") == NULL &&
                   safetensors_find(&a, "") == NULL && safetensors_find(&a, "zzz") == NULL,
               "find of absent names");
    }
    if (ra == 0) safetensors_close(&a);
    if (rb == 0) safetensors_close(&b);

    /* safetensors_open_file on the single file */
    int rc = safetensors_open_file(&a, path3(bad_dir, "ok_nested_single", "model.safetensors"), &err);
    EXPECT(rc == 0 && a.n_tensors == 59, "open_file: %s", rc ? err.msg : "");
    if (rc == 0) safetensors_close(&a);

    /* edge cases the spec allows: empty header, zero-size and 0-rank tensors */
    struct {
        const char *header;
        size_t data;
        int ok;
        const char *msg;
    } e[] = {
        {"{}", 0, 1, NULL},
        {"{\"__metadata__\":{}}      ", 0, 1, NULL},
        {"{\"e\":{\"dtype\":\"F32\",\"shape\":[0,4],\"data_offsets\":[0,0]},"
         "\"s\":{\"dtype\":\"BF16\",\"shape\":[],\"data_offsets\":[0,2]}}",
         2, 1, NULL},
        {"{\"a\":{\"dtype\":\"BF16\",\"shape\":[1],\"data_offsets\":[0,2]},"
         "\"e\":{\"dtype\":\"BF16\",\"shape\":[0],\"data_offsets\":[1,1]}}",
         2, 0, "tensor e: data_offsets [1, 1] overlap tensor a [0, 2]"},
        {"{\"a\":{\"dtype\":\"BF16\",\"shape\":[1],\"data_offsets\":[0,2],\"extra\":1}}", 2, 1, NULL},
        {"{\"a\":{\"dtype\":\"BF16\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,2]}}", 2, 0,
         "tensor a: shape has 9 dimensions, at most 8"},
        {"{\"a\":{\"dtype\":\"BF16\",\"shape\":[1.5],\"data_offsets\":[0,2]}}", 2, 0,
         "tensor a: shape[0]: expected an integer >= 0, found a real number"},
        {"{\"a\":{\"dtype\":\"BF16\",\"shape\":[1],\"data_offsets\":[0,2,4]}}", 2, 0,
         "tensor a: data_offsets: expected [begin, end]"},
        {"{\"a\":{\"dtype\":\"BF16\",\"shape\":[1],\"data_offsets\":[0,99999999999999999999]}}", 2,
         0, "header is not valid JSON"},
        {"{\"a\":[]}", 0, 0, "tensor a: expected an object {dtype, shape, data_offsets}, found an array"},
        {"{\"a\":{\"dtype\":\"BF16\",\"shape\":[1],\"data_offsets\":[0,2]}}x", 2, 0,
         "header is not valid JSON"},
        {"{\"a\":{\"dtype\":7,\"shape\":[1],\"data_offsets\":[0,2]}}", 2, 0,
         "tensor a: dtype: expected a string, found an integer"},
    };
    char *file = path2(tmp_dir, "edge.safetensors");
    for (size_t i = 0; i < sizeof e / sizeof e[0]; i++) {
        /* the header padded with spaces to a multiple of 8, as the reference writer does */
        size_t hn = strlen(e[i].header), n = (hn + 7) / 8 * 8, total = 8 + n + e[i].data;
        unsigned char *buf = calloc(1, total);
        for (int k = 0; k < 8; k++) buf[k] = (unsigned char)((uint64_t)n >> (8 * k));
        memset(buf + 8, ' ', n);
        memcpy(buf + 8, e[i].header, hn);
        write_file(file, buf, total);
        free(buf);
        err.msg[0] = 0;
        rc = safetensors_open_file(&a, file, &err);
        if (e[i].ok) {
            EXPECT(rc == 0, "edge %zu (%s): %s", i, e[i].header, err.msg);
            if (rc == 0) {
                EXPECT(st_invariants(&a) == NULL, "edge %zu invariants", i);
                safetensors_close(&a);
            }
        } else {
            EXPECT(rc != 0 && strstr(err.msg, e[i].msg) && strstr(err.msg, file),
                   "edge %zu (%s): got \"%s\", want \"%s\"", i, e[i].header, err.msg, e[i].msg);
        }
    }

    /* a header nested far deeper than any parser stack should go */
    size_t depth = 200000, n = 6 + depth;
    char *deep = malloc(8 + n);
    for (int k = 0; k < 8; k++) deep[k] = (char)((uint64_t)n >> (8 * k));
    memcpy(deep + 8, "{\"a\":", 5);
    memset(deep + 13, '[', depth);
    deep[8 + n - 1] = '}';
    write_file(file, deep, 8 + n);
    free(deep);
    rc = safetensors_open_file(&a, file, &err);
    EXPECT(rc != 0 && strstr(err.msg, "header is not valid JSON"), "deep nesting: %s", err.msg);
    unlink(file);

    rc = safetensors_open_dir(&a, path2(tmp_dir, "nonexistent"), &err);
    EXPECT(rc != 0 && strstr(err.msg, "no model.safetensors"), "missing dir: %s", err.msg);
    rc = safetensors_open_file(&a, tmp_dir, &err);
    EXPECT(rc != 0 && strstr(err.msg, "not a regular file"), "a directory: %s", err.msg);
}

/* ---------------------------------------------------------------------------------------------
 * the tests/bad corpus */

static int name_cmp(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Every line of expected.txt must be in msg. Returns the first missing line or NULL. */
static const char *missing_line(char *expected, const char *msg) {
    for (char *line = strtok(expected, "\n"); line; line = strtok(NULL, "\n"))
        if (*line && !strstr(msg, line)) return line;
    return NULL;
}

static void test_corpus(void) {
    DIR *d = opendir(bad_dir);
    EXPECT(d != NULL, "cannot open %s", bad_dir);
    if (!d) return;
    char *names[256];
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)) && n < 256)
        if (de->d_name[0] != '.' && strcmp(de->d_name, "README.md")) names[n++] = strdup(de->d_name);
    closedir(d);
    qsort(names, (size_t)n, sizeof *names, name_cmp);
    int n_st = 0, n_cfg = 0, n_model = 0, n_ok = 0;

    for (int i = 0; i < n; i++) {
        const char *name = names[i];
        char dir[1100], cfg_path[1200];
        snprintf(dir, sizeof dir, "%s/%s", bad_dir, name);
        snprintf(cfg_path, sizeof cfg_path, "%s/config.json", dir);
        size_t len;
        struct error err = {{0}};
        char *expected = read_file(path2(dir, "expected.txt"), &len, &err);
        EXPECT(expected != NULL, "%s: %s", name, err.msg);
        if (!expected) continue;
        char *exp_copy = strdup(expected);
        const char *miss = NULL;

        struct config c;
        struct safetensors st;
        int is_st = !strncmp(name, "st_", 3), is_cfg = !strncmp(name, "cfg_", 4);
        int is_model = !strncmp(name, "model_", 6), is_ok = !strncmp(name, "ok_", 3);
        EXPECT(is_st + is_cfg + is_model + is_ok == 1, "%s: unknown case prefix", name);

        int rc_cfg = config_load(&c, cfg_path, &err);
        if (is_cfg) {
            n_cfg++;
            EXPECT(rc_cfg != 0, "%s: config_load accepted it", name);
            EXPECT(rc_cfg == 0 || !(miss = missing_line(expected, err.msg)),
                   "%s: config_load message \"%s\" lacks \"%s\"", name, err.msg, miss);
        } else {
            EXPECT(rc_cfg == 0, "%s: config_load should accept it: %s", name, err.msg);
            int rc_st = safetensors_open_dir(&st, dir, &err);
            if (is_st) {
                n_st++;
                EXPECT(rc_st != 0, "%s: safetensors_open_dir accepted it", name);
                EXPECT(rc_st == 0 || !(miss = missing_line(expected, err.msg)),
                       "%s: safetensors message \"%s\" lacks \"%s\"", name, err.msg, miss);
            } else {
                EXPECT(rc_st == 0, "%s: safetensors_open_dir should accept it: %s", name, err.msg);
            }
            if (rc_st == 0) {
                EXPECT(st_invariants(&st) == NULL, "%s: %s", name, st_invariants(&st));
                safetensors_close(&st);
            }
        }

        /* and the whole way, as `strata` loads it */
        struct model_options opt = {.backend = BACKEND_CPU, .quiet = 1};
        err.msg[0] = 0;
        struct model *m = model_load(dir, &opt, &err);
        if (is_ok) {
            n_ok++;
            int skipped = -1;
            const char *s = strstr(exp_copy, "skipped ");
            if (s) skipped = atoi(s + 8);
            EXPECT(m != NULL, "%s: model_load failed: %s", name, err.msg);
            if (m) {
                EXPECT(model_n_skipped(m) == skipped, "%s: skipped %d tensors, expected %d", name,
                       model_n_skipped(m), skipped);
                const struct config *mc = model_config(m);
                EXPECT(mc->vocab_size == 32 && mc->num_hidden_layers == 4 && mc->n_full_layers == 1,
                       "%s: config", name);
                EXPECT(model_n_params(m) > 0 && model_weight_bytes(m) > 0, "%s: sizes", name);
            }
        } else {
            if (is_model) n_model++;
            EXPECT(m == NULL, "%s: model_load accepted it", name);
            EXPECT(m != NULL || !(miss = missing_line(exp_copy, err.msg)),
                   "%s: model_load message \"%s\" lacks \"%s\"", name, err.msg, miss);
        }
        if (getenv("STRATA_LOADER_VERBOSE")) printf("%-32s %s\n", name, m ? "loads" : err.msg);
        model_free(m);
        free(expected);
        free(exp_copy);
    }
    /* the corpus must really be there: a missing directory must not pass quietly */
    EXPECT(n_st >= 30 && n_cfg >= 15 && n_model >= 8 && n_ok >= 4,
           "corpus too small: %d st, %d cfg, %d model, %d ok", n_st, n_cfg, n_model, n_ok);
    printf("corpus: %d safetensors, %d config, %d model cases, %d valid checkpoints\n", n_st,
           n_cfg, n_model, n_ok);
    for (int i = 0; i < n; i++) free(names[i]);
}

/* ---------------------------------------------------------------------------------------------
 * random mutations */

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint64_t next(void) { /* xorshift64* */
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return rng * 0x2545f4914f6cdd1dull;
}
static size_t below(size_t n) { return n ? (size_t)(next() % n) : 0; }

static const char json_chars[] = "{}[],:\"0123456789-+eE. \\tnulrf";

/* Mutates buf (len *n, capacity cap), mostly within its first `hot` bytes. */
static void mutate(unsigned char *buf, size_t *n, size_t cap, size_t hot) {
    int k = 1 + (int)below(4);
    for (int r = 0; r < k && *n > 0; r++) {
        size_t at = below(next() % 10 ? (hot < *n ? hot : *n) : *n);
        switch (below(7)) {
        case 0: buf[at] ^= (unsigned char)(1u << below(8)); break;
        case 1: buf[at] = (unsigned char)json_chars[below(sizeof json_chars - 1)]; break;
        case 2: buf[at] = (unsigned char)next(); break;
        case 3: /* delete */
            memmove(buf + at, buf + at + 1, *n - at - 1);
            (*n)--;
            break;
        case 4: /* insert */
            if (*n < cap) {
                memmove(buf + at + 1, buf + at, *n - at);
                buf[at] = (unsigned char)json_chars[below(sizeof json_chars - 1)];
                (*n)++;
            }
            break;
        case 5: *n = below(*n + 1); break; /* truncate */
        case 6: /* copy a run of bytes over another spot */
        {
            size_t from = below(*n), len = 1 + below(16);
            if (from + len <= *n && at + len <= *n) memmove(buf + at, buf + from, len);
            break;
        }
        }
    }
}

static void test_fuzz(void) {
    long iters = 2000;
    const char *env = getenv("STRATA_FUZZ_ITERS");
    if (env) iters = atol(env);
    struct error err;
    size_t len, cfg_len;
    char *orig = read_file(path3(bad_dir, "ok_nested_single", "model.safetensors"), &len, &err);
    char *cfg = read_file(path3(bad_dir, "ok_nested_single", "config.json"), &cfg_len, &err);
    EXPECT(orig && cfg, "fuzz seeds: %s", err.msg);
    if (!orig || !cfg) return;
    size_t hot = 8;
    for (int k = 0; k < 8; k++) hot += (size_t)(unsigned char)orig[k] << (8 * k);

    size_t cap = len + 64;
    unsigned char *buf = malloc(cap);
    char *file = path2(tmp_dir, "fuzz.safetensors");
    long n_ok = 0, n_fail = 0, no_name = 0, broken = 0;
    for (long it = 0; it < iters; it++) {
        memcpy(buf, orig, len);
        size_t n = len;
        mutate(buf, &n, cap, hot);
        if (next() % 8 == 0) { /* the header length field itself */
            uint64_t h = hot - 8;
            h = next() % 2 ? h + below(64) - 32 : next() >> below(64);
            for (int k = 0; k < 8 && n >= 8; k++) buf[k] = (unsigned char)(h >> (8 * k));
        }
        write_file(file, buf, n);
        struct safetensors st;
        err.msg[0] = 0;
        if (safetensors_open_file(&st, file, &err) == 0) {
            n_ok++;
            if (st_invariants(&st)) broken++;
            safetensors_close(&st);
        } else {
            n_fail++;
            if (!strstr(err.msg, file)) {
                if (!no_name) fprintf(stderr, "fuzz: message without the file name: %s\n", err.msg);
                no_name++;
            }
        }
    }
    unlink(file);
    EXPECT(broken == 0, "fuzz: %ld accepted files broke an invariant", broken);
    EXPECT(no_name == 0, "fuzz: %ld messages without the file name", no_name);
    EXPECT(n_fail > iters / 4 && n_ok > 0, "fuzz exercised both outcomes: %ld ok, %ld rejected",
           n_ok, n_fail);
    printf("safetensors fuzz: %ld mutated files, %ld accepted, %ld rejected\n", iters, n_ok, n_fail);

    /* config.json text */
    cap = cfg_len + 64;
    buf = realloc(buf, cap);
    long c_ok = 0, c_fail = 0, c_noname = 0, c_broken = 0;
    for (long it = 0; it < iters; it++) {
        memcpy(buf, cfg, cfg_len);
        size_t n = cfg_len;
        mutate(buf, &n, cap, n);
        struct config c;
        err.msg[0] = 0;
        if (config_parse(&c, (const char *)buf, n, "fuzz/config.json", &err) == 0) {
            c_ok++;
            int L = c.num_hidden_layers;
            if (L < 1 || L > CONFIG_MAX_LAYERS || c.n_full_layers + c.n_linear_layers != L ||
                c.rotary_dim < 2 || c.rotary_dim % 2 || c.rotary_dim > c.head_dim ||
                c.conv_dim != 2 * c.key_dim + c.value_dim ||
                c.num_attention_heads % c.num_key_value_heads ||
                c.linear_num_value_heads % c.linear_num_key_heads || c.n_eos_token_id > CONFIG_MAX_EOS)
                c_broken++;
        } else {
            c_fail++;
            if (!strstr(err.msg, "fuzz/config.json")) c_noname++;
        }
    }
    EXPECT(c_broken == 0, "config fuzz: %ld accepted configs broke an invariant", c_broken);
    EXPECT(c_noname == 0, "config fuzz: %ld messages without the file name", c_noname);
    EXPECT(c_fail > 0 && c_ok > 0, "config fuzz exercised both outcomes: %ld ok, %ld rejected",
           c_ok, c_fail);
    printf("config fuzz: %ld mutated configs, %ld accepted, %ld rejected\n", iters, c_ok, c_fail);

    /* model.safetensors.index.json text, beside the two valid shards */
    static const char *const shard_names[] = {"model-00001-of-00002.safetensors",
                                              "model-00002-of-00002.safetensors",
                                              "model.safetensors.index.json"};
    char *ix = NULL;
    size_t ix_len = 0;
    for (int i = 0; i < 3; i++) {
        size_t sl;
        char *data = read_file(path3(bad_dir, "ok_nested_sharded", shard_names[i]), &sl, &err);
        EXPECT(data != NULL, "index fuzz seed: %s", err.msg);
        if (!data) return;
        if (i < 2) {
            write_file(path2(tmp_dir, shard_names[i]), data, sl);
            free(data);
        } else {
            ix = data;
            ix_len = sl;
        }
    }
    cap = ix_len + 64;
    buf = realloc(buf, cap);
    long x_ok = 0, x_fail = 0, x_noname = 0, x_broken = 0, x_iters = iters / 4;
    for (long it = 0; it < x_iters; it++) {
        memcpy(buf, ix, ix_len);
        size_t n = ix_len;
        mutate(buf, &n, cap, n);
        write_file(path2(tmp_dir, shard_names[2]), buf, n);
        struct safetensors st;
        err.msg[0] = 0;
        if (safetensors_open_dir(&st, tmp_dir, &err) == 0) {
            x_ok++;
            if (st_invariants(&st)) x_broken++;
            safetensors_close(&st);
        } else {
            x_fail++;
            if (!strstr(err.msg, tmp_dir)) x_noname++;
        }
    }
    for (int i = 0; i < 3; i++) unlink(path2(tmp_dir, shard_names[i]));
    EXPECT(x_broken == 0, "index fuzz: %ld accepted checkpoints broke an invariant", x_broken);
    EXPECT(x_noname == 0, "index fuzz: %ld messages without the path", x_noname);
    EXPECT(x_fail > 0 && x_ok > 0, "index fuzz exercised both outcomes: %ld ok, %ld rejected",
           x_ok, x_fail);
    printf("index fuzz: %ld mutated indexes, %ld accepted, %ld rejected\n", x_iters, x_ok, x_fail);
    free(ix);
    free(buf);
    free(orig);
    free(cfg);
}

/* env_int: the settings read from the environment (the CUDA backend's measuring switches) */
static void test_env_int(void) {
    const char *name = "STRATA_TEST_ENV_INT";
    unsetenv(name);
    EXPECT(env_int(name, 7, 0, 9) == 7, "unset: the default");
    struct { const char *v; int want; } c[] = {
        {"5", 5}, {"-1", -1}, {"0", 0}, {"9", 9}, {"10", 7}, {"-2", 7}, {"abc", 7}, {"5x", 7},
        {"", 7}, {" 3", 3}, {"99999999999999999999", 7},
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        setenv(name, c[i].v, 1);
        int got = env_int(name, 7, -1, 9);
        EXPECT(got == c[i].want, "env_int(\"%s\") = %d, want %d", c[i].v, got, c[i].want);
    }
    unsetenv(name);
}

/* generation_config.json: absent is fine, the demo's is read, a malformed one names the field */
static void test_gen_defaults(void) {
    struct gen_defaults g;
    struct error err = {{0}};
    char path[600];
    snprintf(path, sizeof path, "%s/none.json", tmp_dir);
    EXPECT(gen_defaults_load(&g, path, &err) == 0 && !g.present && g.do_sample, "no generation_config.json");
    EXPECT(gen_defaults_load(&g, "demo/generation_config.json", &err) == 0 && g.present &&
               g.has_temperature && g.temperature > 0.69f && g.temperature < 0.71f && g.top_k == 20 &&
               g.has_top_p && !g.has_min_p,
           "the demo's generation_config.json: %s", err.msg);
    static const struct {
        const char *json, *msg;
    } bad[] = {{"{\"temperature\": \"hot\"}", "temperature: expected a number"},
               {"{\"top_p\": 1.5}", "top_p: expected a number in [0, 1]"},
               {"{\"top_k\": 2.5}", "top_k: expected a number in [0, 1e+09] (an integer)"},
               {"{\"do_sample\": 1}", "do_sample: expected true or false"},
               {"[1, 2]", "expected a JSON object"},
               {"{\"temperature\": 0.7,}", "malformed JSON at line 1"}};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        snprintf(path, sizeof path, "%s/generation_config.json", tmp_dir);
        FILE *f = fopen(path, "w");
        CHECK(f);
        fputs(bad[i].json, f);
        fclose(f);
        memset(&err, 0, sizeof err);
        EXPECT(gen_defaults_load(&g, path, &err) < 0 && strstr(err.msg, bad[i].msg) &&
                   strstr(err.msg, "generation_config.json"),
               "generation_config %s: %s (want '%s')", bad[i].json, err.msg, bad[i].msg);
        remove(path);
    }
}

int main(void) {
    const char *env = getenv("STRATA_BAD_DIR");
    if (env) {
        snprintf(bad_dir, sizeof bad_dir, "%s", env);
    } else { /* tests/bad next to this source file */
        snprintf(bad_dir, sizeof bad_dir, "%s", __FILE__);
        char *slash = strrchr(bad_dir, '/');
        if (slash)
            strcpy(slash, "/bad");
        else
            snprintf(bad_dir, sizeof bad_dir, "bad");
    }
    snprintf(tmp_dir, sizeof tmp_dir, "/tmp/strata_loader_XXXXXX");
    if (!mkdtemp(tmp_dir)) {
        perror("mkdtemp");
        return 1;
    }
    test_config();
    test_env_int();
    test_gen_defaults();
    test_safetensors();
    test_corpus();
    test_fuzz();
    rmdir(tmp_dir);
    return TEST_DONE();
}
