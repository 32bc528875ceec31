/* config.c - reads a Hugging Face Qwen3.5 config.json into struct config and checks it.
 *
 * Mirrors transformers' Qwen3_5Config / Qwen3_5TextConfig (models/qwen3_5/configuration_qwen3_5.py)
 * and the RoPE standardisation in PreTrainedConfig:
 *   - nested form (architectures ["Qwen3_5ForConditionalGeneration"], model_type "qwen3_5"): the
 *     text fields live under "text_config"; flat form (Qwen3_5ForCausalLM, "qwen3_5_text"): at the
 *     top level. Text fields are never taken from the top level of a nested file, as transformers
 *     builds the text config from the text_config dict alone.
 *   - layer_types explicit (legacy "attention"/"mamba" remapped as transformers does) or built from
 *     full_attention_interval (default 4): layer i is full attention iff (i + 1) % interval == 0.
 *   - rope_theta / partial_rotary_factor from rope_parameters (or its legacy alias rope_scaling),
 *     else the legacy top-level keys, else transformers' defaults (theta 10000, factor 0.25).
 *     Only rope_type "default" is supported; mrope_section is irrelevant to text-only positions.
 *   - eos_token_id: an int or a list, text_config first, then the top level.
 *   - tie_word_embeddings: in the nested form transformers reads the top-level key (default false);
 *     we fall back to text_config's value when the top level has none, then to false.
 * Defaults are taken only where Qwen3_5TextConfig has one AND real checkpoints may omit the field
 * (max_position_embeddings 32768, rms_norm_eps 1e-6, rope, layer_types, tie false). The fields
 * that fix the weight shapes (vocab_size, hidden_size, intermediate_size, num_hidden_layers,
 * num_attention_heads, num_key_value_heads, head_dim, linear_*) are required even though the class
 * has defaults: every published config carries them, and silently assuming the 9B's values for a
 * missing field would turn a broken file into a confusing shape error much later.
 * This file does not look at the weights; model.c checks that they agree with the config. */
#include "config.h"

#include <dirent.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct cfg_ctx {
    const char *path;   /* for messages */
    const char *prefix; /* "text_config." in the nested form, "" in the flat one */
    struct error *err;
};

/* A short description of a JSON value for "found ..." in messages. */
static const char *json_describe(const json_t *v, char *buf, size_t n) {
    if (!v) {
        snprintf(buf, n, "nothing");
    } else if (json_is_string(v)) {
        snprintf(buf, n, "the string \"%.40s\"", json_string_value(v));
    } else if (json_is_integer(v)) {
        snprintf(buf, n, "%lld", (long long)json_integer_value(v));
    } else if (json_is_real(v)) {
        snprintf(buf, n, "%g", json_real_value(v));
    } else if (json_is_boolean(v)) {
        snprintf(buf, n, "%s", json_is_true(v) ? "true" : "false");
    } else if (json_is_null(v)) {
        snprintf(buf, n, "null");
    } else if (json_is_array(v)) {
        snprintf(buf, n, "an array");
    } else {
        snprintf(buf, n, "an object");
    }
    return buf;
}

/* An integer field >= min. Missing: error if required, else *out = def. */
static int cfg_int(const struct cfg_ctx *cx, const json_t *obj, const char *key, int required,
                   int def, int min, int *out) {
    char d[80];
    const json_t *v = json_object_get(obj, key);
    if (!v) {
        if (required)
            return error_set(cx->err, "%s: %s%s: missing (a required field: it fixes the weight "
                             "shapes and real Qwen3.5 checkpoints always carry it)",
                             cx->path, cx->prefix, key);
        *out = def;
        return 0;
    }
    if (!json_is_integer(v))
        return error_set(cx->err, "%s: %s%s: expected an integer, found %s", cx->path, cx->prefix,
                         key, json_describe(v, d, sizeof d));
    long long x = json_integer_value(v);
    if (x < min || x > INT_MAX)
        return error_set(cx->err, "%s: %s%s: expected an integer >= %d, found %lld", cx->path,
                         cx->prefix, key, min, x);
    *out = (int)x;
    return 0;
}

/* A finite number (integer or real) in (lo, hi]. Missing: *out = def. */
static int cfg_num(const struct cfg_ctx *cx, const char *where, const json_t *obj,
                   const char *key, double def, double lo, double hi, double *out) {
    char d[80];
    const json_t *v = json_object_get(obj, key);
    if (!v) {
        *out = def;
        return 0;
    }
    if (!json_is_number(v))
        return error_set(cx->err, "%s: %s%s: expected a number, found %s", cx->path, where, key,
                         json_describe(v, d, sizeof d));
    double x = json_number_value(v);
    if (!isfinite(x) || !(x > lo) || !(x <= hi))
        return error_set(cx->err, "%s: %s%s: expected a number in (%g, %g], found %g", cx->path,
                         where, key, lo, hi, x);
    *out = x;
    return 0;
}

/* A boolean; missing or null: *out unchanged and returns 0 with *found = 0. */
static int cfg_bool(const struct cfg_ctx *cx, const char *where, const json_t *obj,
                    const char *key, int *out, int *found) {
    char d[80];
    const json_t *v = json_object_get(obj, key);
    *found = 0;
    if (!v || json_is_null(v)) return 0;
    if (!json_is_boolean(v))
        return error_set(cx->err, "%s: %s%s: expected true or false, found %s", cx->path, where,
                         key, json_describe(v, d, sizeof d));
    *out = json_is_true(v);
    *found = 1;
    return 0;
}

/* eos_token_id: an int, a list of ints, or null. Returns 1 if a value was taken. */
static int cfg_eos(const struct cfg_ctx *cx, const char *where, const json_t *obj,
                   struct config *c) {
    char d[80];
    const json_t *v = json_object_get(obj, "eos_token_id");
    if (!v || json_is_null(v)) return 0;
    if (json_is_integer(v)) {
        long long x = json_integer_value(v);
        if (x < 0 || x > INT_MAX)
            return error_set(cx->err, "%s: %seos_token_id: expected a token id >= 0, found %lld",
                             cx->path, where, x);
        c->eos_token_id[0] = (int)x;
        c->n_eos_token_id = 1;
        return 1;
    }
    if (!json_is_array(v))
        return error_set(cx->err, "%s: %seos_token_id: expected an integer or a list of "
                         "integers, found %s", cx->path, where, json_describe(v, d, sizeof d));
    size_t n = json_array_size(v);
    if (n > CONFIG_MAX_EOS)
        return error_set(cx->err, "%s: %seos_token_id: %zu ids, at most %d supported", cx->path,
                         where, n, CONFIG_MAX_EOS);
    for (size_t i = 0; i < n; i++) {
        const json_t *e = json_array_get(v, i);
        if (!json_is_integer(e) || json_integer_value(e) < 0 || json_integer_value(e) > INT_MAX)
            return error_set(cx->err, "%s: %seos_token_id[%zu]: expected a token id >= 0, "
                             "found %s", cx->path, where, i, json_describe(e, d, sizeof d));
        c->eos_token_id[i] = (int)json_integer_value(e);
    }
    c->n_eos_token_id = (int)n;
    return 1;
}

/* Optional string field that, when present, must equal one of the accepted values. */
static int cfg_enum(const struct cfg_ctx *cx, const json_t *obj, const char *key,
                    const char *const *ok, const char *what) {
    char d[80];
    const json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) return 0;
    if (json_is_string(v))
        for (int i = 0; ok[i]; i++)
            if (!strcmp(json_string_value(v), ok[i])) return 0;
    return error_set(cx->err, "%s: %s%s: %s, found %s", cx->path, cx->prefix, key, what,
                     json_describe(v, d, sizeof d));
}

static int cfg_layer_types(const struct cfg_ctx *cx, const json_t *t, struct config *c) {
    char d[80];
    const json_t *lt = json_object_get(t, "layer_types");
    if (!lt || json_is_null(lt)) {
        int interval;
        if (cfg_int(cx, t, "full_attention_interval", 0, 4, 1, &interval)) return -1;
        for (int i = 0; i < c->num_hidden_layers; i++)
            c->layer_types[i] =
                (i + 1) % interval == 0 ? LAYER_FULL_ATTENTION : LAYER_LINEAR_ATTENTION;
        return 0;
    }
    if (!json_is_array(lt))
        return error_set(cx->err, "%s: %slayer_types: expected a list of strings, found %s",
                         cx->path, cx->prefix, json_describe(lt, d, sizeof d));
    if (json_array_size(lt) != (size_t)c->num_hidden_layers)
        return error_set(cx->err, "%s: %slayer_types: expected %d entries (num_hidden_layers), "
                         "found %zu", cx->path, cx->prefix, c->num_hidden_layers,
                         json_array_size(lt));
    for (int i = 0; i < c->num_hidden_layers; i++) {
        const json_t *e = json_array_get(lt, (size_t)i);
        const char *s = json_is_string(e) ? json_string_value(e) : NULL;
        /* "attention" and "mamba" are the legacy names transformers remaps. */
        if (s && (!strcmp(s, "full_attention") || !strcmp(s, "attention")))
            c->layer_types[i] = LAYER_FULL_ATTENTION;
        else if (s && (!strcmp(s, "linear_attention") || !strcmp(s, "mamba")))
            c->layer_types[i] = LAYER_LINEAR_ATTENTION;
        else
            return error_set(cx->err, "%s: %slayer_types[%d]: expected \"linear_attention\" or "
                             "\"full_attention\", found %s", cx->path, cx->prefix, i,
                             json_describe(e, d, sizeof d));
    }
    return 0;
}

static int cfg_rope(const struct cfg_ctx *cx, const json_t *t, struct config *c) {
    char d[80], where[64];
    const char *rp_key = "rope_parameters";
    const json_t *rp = json_object_get(t, rp_key);
    if (!rp || json_is_null(rp)) {
        rp_key = "rope_scaling"; /* the pre-v5 name of the same dict */
        rp = json_object_get(t, rp_key);
    }
    if (rp && json_is_null(rp)) rp = NULL;
    if (rp && !json_is_object(rp))
        return error_set(cx->err, "%s: %s%s: expected an object, found %s", cx->path, cx->prefix,
                         rp_key, json_describe(rp, d, sizeof d));

    double theta = 10000.0, factor = 0.25; /* transformers' default_theta and the BC default */
    if (cfg_num(cx, cx->prefix, t, "rope_theta", theta, 0, INFINITY, &theta)) return -1;
    if (cfg_num(cx, cx->prefix, t, "partial_rotary_factor", factor, 0, 1, &factor)) return -1;
    if (rp) {
        snprintf(where, sizeof where, "%s%s.", cx->prefix, rp_key);
        const json_t *type = json_object_get(rp, "rope_type");
        if (!type) type = json_object_get(rp, "type");
        if (type && !json_is_null(type) &&
            !(json_is_string(type) && (!strcmp(json_string_value(type), "default") ||
                                       !strcmp(json_string_value(type), "mrope"))))
            return error_set(cx->err, "%s: %srope_type: only \"default\" RoPE is supported, "
                             "found %s", cx->path, where, json_describe(type, d, sizeof d));
        if (cfg_num(cx, where, rp, "rope_theta", theta, 0, INFINITY, &theta)) return -1;
        if (cfg_num(cx, where, rp, "partial_rotary_factor", factor, 0, 1, &factor)) return -1;
    }
    c->rope_theta = theta;
    c->partial_rotary_factor = (float)factor;
    /* HF: dim = int(head_dim * partial_rotary_factor), computed in double as Python does */
    c->rotary_dim = (int)((double)c->head_dim * factor);
    if (c->rotary_dim < 2 || c->rotary_dim % 2 || c->rotary_dim > c->head_dim)
        return error_set(cx->err, "%s: %spartial_rotary_factor: head_dim %d x %g gives a rotary "
                         "dimension of %d; expected an even number in [2, head_dim]", cx->path,
                         cx->prefix, c->head_dim, factor, c->rotary_dim);
    return 0;
}

/* Products that model.c turns into int tensor sizes must fit an int. */
static int cfg_product(const struct cfg_ctx *cx, const char *what, long long a, long long b,
                       int *out) {
    long long p;
    if (__builtin_mul_overflow(a, b, &p) || p > INT_MAX)
        return error_set(cx->err, "%s: %s = %lld x %lld is too large (at most %d)", cx->path,
                         what, a, b, INT_MAX);
    if (out) *out = (int)p;
    return 0;
}

int config_parse(struct config *c, const char *json, size_t len, const char *path,
                 struct error *err) {
    char d[80];
    json_error_t jerr;
    memset(c, 0, sizeof *c);
    json_t *root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &jerr);
    struct cfg_ctx cx = {path, "", err};
    if (!root)
        return error_set(err, "%s: malformed JSON at line %d, column %d: %s", path, jerr.line,
                         jerr.column, jerr.text);
    if (!json_is_object(root)) {
        error_set(err, "%s: expected a JSON object at the top level, found %s", path,
                  json_describe(root, d, sizeof d));
        goto fail;
    }

    const json_t *arch = json_object_get(root, "architectures");
    if (arch && !json_is_null(arch)) {
        const json_t *a0 = json_is_array(arch) ? json_array_get(arch, 0) : NULL;
        if (!json_is_string(a0)) {
            error_set(err, "%s: architectures: expected a list of strings, found %s", path,
                      json_describe(arch, d, sizeof d));
            goto fail;
        }
        const char *a = json_string_value(a0);
        if (strcmp(a, "Qwen3_5ForConditionalGeneration") && strcmp(a, "Qwen3_5ForCausalLM")) {
            const char *mt = json_string_value(json_object_get(root, "model_type"));
            error_set(err, "%s: architectures[0]: expected \"Qwen3_5ForConditionalGeneration\" or "
                      "\"Qwen3_5ForCausalLM\" (a dense Qwen3.5 model), found \"%.80s\"%s%.40s%s: "
                      "this is not a Qwen3.5 checkpoint, and strata runs only the Qwen3.5 dense "
                      "models", path, a, mt ? " (model_type \"" : "", mt ? mt : "", mt ? "\")" : "");
            goto fail;
        }
        snprintf(c->architecture, sizeof c->architecture, "%s", a);
    }
    const char *mt = json_string_value(json_object_get(root, "model_type"));
    if (mt && strcmp(mt, "qwen3_5") && strcmp(mt, "qwen3_5_text")) {
        error_set(err, "%s: model_type: expected \"qwen3_5\" or \"qwen3_5_text\", found \"%.40s\": "
                  "this is not a Qwen3.5 checkpoint, and strata runs only the Qwen3.5 dense models",
                  path, mt);
        goto fail;
    }
    static const char *const model_types[] = {"qwen3_5", "qwen3_5_text", NULL};
    if (cfg_enum(&cx, root, "model_type", model_types, "expected \"qwen3_5\" or \"qwen3_5_text\""))
        goto fail;

    const json_t *t = root;
    const json_t *tc = json_object_get(root, "text_config");
    if (tc && !json_is_null(tc)) {
        if (!json_is_object(tc)) {
            error_set(err, "%s: text_config: expected an object, found %s", path,
                      json_describe(tc, d, sizeof d));
            goto fail;
        }
        t = tc;
        c->nested = 1;
        cx.prefix = "text_config.";
        static const char *const text_types[] = {"qwen3_5_text", NULL};
        if (cfg_enum(&cx, t, "model_type", text_types, "expected \"qwen3_5_text\"")) goto fail;
    }

    static const struct { const char *key; size_t off; } required[] = {
        {"vocab_size", offsetof(struct config, vocab_size)},
        {"hidden_size", offsetof(struct config, hidden_size)},
        {"intermediate_size", offsetof(struct config, intermediate_size)},
        {"num_hidden_layers", offsetof(struct config, num_hidden_layers)},
        {"num_attention_heads", offsetof(struct config, num_attention_heads)},
        {"num_key_value_heads", offsetof(struct config, num_key_value_heads)},
        {"head_dim", offsetof(struct config, head_dim)},
        {"linear_conv_kernel_dim", offsetof(struct config, linear_conv_kernel_dim)},
        {"linear_key_head_dim", offsetof(struct config, linear_key_head_dim)},
        {"linear_value_head_dim", offsetof(struct config, linear_value_head_dim)},
        {"linear_num_key_heads", offsetof(struct config, linear_num_key_heads)},
        {"linear_num_value_heads", offsetof(struct config, linear_num_value_heads)},
    };
    for (size_t i = 0; i < sizeof required / sizeof required[0]; i++)
        if (cfg_int(&cx, t, required[i].key, 1, 0, 1, (int *)((char *)c + required[i].off)))
            goto fail;
    if (cfg_int(&cx, t, "max_position_embeddings", 0, 32768, 1, &c->max_position_embeddings))
        goto fail;
    double eps;
    if (cfg_num(&cx, cx.prefix, t, "rms_norm_eps", 1e-6, 0, 1, &eps)) goto fail;
    c->rms_norm_eps = (float)eps;

    static const char *const acts[] = {"silu", NULL};
    if (cfg_enum(&cx, t, "hidden_act", acts, "only \"silu\" is supported")) goto fail;
    int bias = 0, found;
    if (cfg_bool(&cx, cx.prefix, t, "attention_bias", &bias, &found)) goto fail;
    if (bias) {
        error_set(err, "%s: %sattention_bias: true is not supported (Qwen3.5 has no attention "
                  "biases)", path, cx.prefix);
        goto fail;
    }

    if (c->num_hidden_layers > CONFIG_MAX_LAYERS) {
        error_set(err, "%s: %snum_hidden_layers: %d layers, at most %d supported", path,
                  cx.prefix, c->num_hidden_layers, CONFIG_MAX_LAYERS);
        goto fail;
    }
    if (c->num_attention_heads % c->num_key_value_heads) {
        error_set(err, "%s: %snum_attention_heads %d is not a multiple of num_key_value_heads %d",
                  path, cx.prefix, c->num_attention_heads, c->num_key_value_heads);
        goto fail;
    }
    if (c->linear_conv_kernel_dim > 8) { /* published: 4; the backends' window buffers hold 8 */
        error_set(err, "%s: %slinear_conv_kernel_dim %d: at most 8 supported", path, cx.prefix,
                  c->linear_conv_kernel_dim);
        goto fail;
    }
    if (c->linear_num_value_heads % c->linear_num_key_heads) {
        error_set(err, "%s: %slinear_num_value_heads %d is not a multiple of "
                  "linear_num_key_heads %d", path, cx.prefix, c->linear_num_value_heads,
                  c->linear_num_key_heads);
        goto fail;
    }
    if (cfg_layer_types(&cx, t, c) || cfg_rope(&cx, t, c)) goto fail;

    /* eos: text_config first, then the top level */
    int got = c->nested ? cfg_eos(&cx, cx.prefix, t, c) : 0;
    if (got < 0) goto fail;
    if (!got && cfg_eos(&cx, "", root, c) < 0) goto fail;

    /* tie: the top level (what transformers reads), else text_config, else false */
    c->tie_word_embeddings = 0;
    if (cfg_bool(&cx, "", root, "tie_word_embeddings", &c->tie_word_embeddings, &found)) goto fail;
    if (!found && c->nested &&
        cfg_bool(&cx, cx.prefix, t, "tie_word_embeddings", &c->tie_word_embeddings, &found))
        goto fail;

    /* derived, with the sizes model.c will allocate checked against int overflow */
    char what[96];
    snprintf(what, sizeof what, "%skey_dim (linear_num_key_heads x linear_key_head_dim)",
             cx.prefix);
    if (cfg_product(&cx, what, c->linear_num_key_heads, c->linear_key_head_dim, &c->key_dim))
        goto fail;
    snprintf(what, sizeof what, "%svalue_dim (linear_num_value_heads x linear_value_head_dim)",
             cx.prefix);
    if (cfg_product(&cx, what, c->linear_num_value_heads, c->linear_value_head_dim,
                    &c->value_dim))
        goto fail;
    snprintf(what, sizeof what, "%sconv_dim (2 x key_dim + value_dim)", cx.prefix);
    if (cfg_product(&cx, what, 1, 2LL * c->key_dim + c->value_dim, &c->conv_dim)) goto fail;
    snprintf(what, sizeof what, "%sq_proj rows (2 x num_attention_heads x head_dim)", cx.prefix);
    if (cfg_product(&cx, what, 2LL * c->num_attention_heads, c->head_dim, NULL)) goto fail;
    c->n_full_layers = c->n_linear_layers = 0;
    for (int i = 0; i < c->num_hidden_layers; i++) {
        if (c->layer_types[i] == LAYER_FULL_ATTENTION)
            c->n_full_layers++;
        else
            c->n_linear_layers++;
    }
    json_decref(root);
    return 0;
fail:
    json_decref(root);
    return -1;
}

int config_load(struct config *c, const char *path, struct error *err) {
    size_t len;
    memset(c, 0, sizeof *c);
    char *text = read_file(path, &len, err);
    if (!text) return -1;
    int rc = config_parse(c, text, len, path, err);
    free(text);
    return rc;
}

int gen_defaults_load(struct gen_defaults *g, const char *path, struct error *err) {
    memset(g, 0, sizeof *g);
    g->do_sample = 1;
    if (access(path, F_OK) != 0) return 0;
    json_error_t jerr;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return error_set(err, "%s: malformed JSON at line %d, column %d: %s", path, jerr.line,
                         jerr.column, jerr.text);
    int rc = -1;
    if (!json_is_object(root)) {
        error_set(err, "%s: expected a JSON object at the top level", path);
        goto done;
    }
    const json_t *ds = json_object_get(root, "do_sample");
    if (ds && !json_is_null(ds)) {
        if (!json_is_boolean(ds)) {
            error_set(err, "%s: do_sample: expected true or false", path);
            goto done;
        }
        g->do_sample = json_is_true(ds);
    }
    static const struct {
        const char *name;
        double lo, hi;
    } fields[] = {{"temperature", 0, 100}, {"top_p", 0, 1}, {"top_k", 0, 1e9},
                  {"min_p", 0, 1}, {"repetition_penalty", 1e-6, 100}, {"presence_penalty", -2, 2}};
    int *has[] = {&g->has_temperature, &g->has_top_p, &g->has_top_k, &g->has_min_p,
                  &g->has_repetition_penalty, &g->has_presence_penalty};
    for (size_t i = 0; i < sizeof fields / sizeof *fields; i++) {
        const json_t *v = json_object_get(root, fields[i].name);
        if (!v || json_is_null(v)) continue;
        const double x = json_is_number(v) ? json_number_value(v) : -1e300;
        if (!json_is_number(v) || !(x >= fields[i].lo && x <= fields[i].hi) ||
            (i == 2 && x != (double)(long)x)) {
            error_set(err, "%s: %s: expected a number in [%g, %g]%s", path, fields[i].name,
                      fields[i].lo, fields[i].hi, i == 2 ? " (an integer)" : "");
            goto done;
        }
        *has[i] = 1;
        switch (i) {
        case 0: g->temperature = (float)x; break;
        case 1: g->top_p = (float)x; break;
        case 2: g->top_k = (int)x; break;
        case 3: g->min_p = (float)x; break;
        case 4: g->repetition_penalty = (float)x; break;
        default: g->presence_penalty = (float)x; break;
        }
    }
    g->present = 1;
    rc = 0;
done:
    json_decref(root);
    return rc;
}

/* A GGUF file (or a directory of them) is what llama.cpp and Ollama read; say so rather than
 * fail on a config.json that is not there. */
int config_check_dir(const char *dir, struct error *err) {
    struct stat st;
    if (stat(dir, &st) != 0) return 0; /* the config.json error names it */
    size_t n = strlen(dir);
    if (S_ISREG(st.st_mode)) {
        char magic[4] = {0};
        FILE *f = fopen(dir, "rb");
        size_t got = f ? fread(magic, 1, 4, f) : 0;
        if (f) fclose(f);
        if ((got == 4 && !memcmp(magic, "GGUF", 4)) || (n > 5 && !strcasecmp(dir + n - 5, ".gguf")))
            return error_set(err, "%s is a GGUF file: strata does not read GGUF (llama.cpp's "
                             "format); it loads Hugging Face checkpoints as published, a directory "
                             "with config.json, *.safetensors (BF16) and tokenizer.json (e.g. "
                             "huggingface-cli download Qwen/Qwen3.5-4B)", dir);
        return error_set(err, "%s is a file, not a checkpoint directory (config.json, "
                         "*.safetensors and tokenizer.json)", dir);
    }
    if (!S_ISDIR(st.st_mode)) return 0;
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (access(path, F_OK) == 0) return 0;
    DIR *d = opendir(dir);
    struct dirent *de;
    char gguf[256] = "";
    while (d && (de = readdir(d))) {
        size_t k = strlen(de->d_name);
        if (k > 5 && !strcasecmp(de->d_name + k - 5, ".gguf")) {
            snprintf(gguf, sizeof gguf, "%s", de->d_name);
            break;
        }
    }
    if (d) closedir(d);
    if (gguf[0])
        return error_set(err, "%s holds GGUF files (%s) and no config.json: strata does not read "
                         "GGUF; it loads Hugging Face checkpoints (config.json, *.safetensors, "
                         "tokenizer.json)", dir, gguf);
    return 0;
}
