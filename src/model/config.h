/* config.h - the text model's hyper-parameters, read from a Hugging Face config.json.
 * Accepts the published multimodal form (Qwen3_5ForConditionalGeneration, fields under
 * "text_config") and the flat Qwen3_5ForCausalLM form. Names follow config.json exactly. */
#ifndef STRATA_CONFIG_H
#define STRATA_CONFIG_H

#include "util.h"

#define CONFIG_MAX_LAYERS 256
#define CONFIG_MAX_EOS 8

enum layer_type { LAYER_LINEAR_ATTENTION = 0, LAYER_FULL_ATTENTION = 1 };

struct config {
    char architecture[128]; /* architectures[0], e.g. "Qwen3_5ForConditionalGeneration" */
    int nested;             /* 1 when the text fields came from "text_config" */

    int vocab_size;
    int hidden_size;
    int intermediate_size;
    int num_hidden_layers;
    int num_attention_heads;
    int num_key_value_heads;
    int head_dim;
    int linear_conv_kernel_dim;
    int linear_key_head_dim;
    int linear_value_head_dim;
    int linear_num_key_heads;
    int linear_num_value_heads;
    float rms_norm_eps;
    double rope_theta;
    float partial_rotary_factor;
    int max_position_embeddings;
    int tie_word_embeddings;
    int eos_token_id[CONFIG_MAX_EOS]; /* from text_config / top level; may be empty */
    int n_eos_token_id;
    enum layer_type layer_types[CONFIG_MAX_LAYERS];

    /* derived */
    int rotary_dim;     /* int(head_dim * partial_rotary_factor) */
    int key_dim;        /* linear_num_key_heads * linear_key_head_dim */
    int value_dim;      /* linear_num_value_heads * linear_value_head_dim */
    int conv_dim;       /* 2 * key_dim + value_dim */
    int n_full_layers;  /* count of LAYER_FULL_ATTENTION */
    int n_linear_layers;
};

/* The sampling defaults a checkpoint publishes in generation_config.json (transformers'
 * GenerationConfig): what a request that names none of these gets. A field is set only when the
 * file gives it; do_sample false means greedy. */
struct gen_defaults {
    int present;          /* the file exists */
    int do_sample;        /* 1 unless the file says false */
    int has_temperature, has_top_p, has_top_k, has_min_p, has_repetition_penalty,
        has_presence_penalty;
    float temperature, top_p, min_p, repetition_penalty, presence_penalty;
    int top_k;
};

/* Reads generation_config.json at `path`: 0 with g->present 0 if there is no such file, -1 (err
 * names the file and field) if it is malformed or a value is out of range. */
int gen_defaults_load(struct gen_defaults *g, const char *path, struct error *err);

/* Reads and validates config.json at `path`. Every required field must be present with a sane
 * value; on failure err names the file and the field. */
int config_load(struct config *c, const char *path, struct error *err);

/* Same, from a JSON text already in memory (`path` is used only in messages). */
int config_parse(struct config *c, const char *json, size_t len, const char *path, struct error *err);

/* Before loading DIR: -1 + err naming the problem when it is a GGUF file, another file, or a
 * directory of GGUF files without config.json; else 0 (the loader reports what else is wrong). */
int config_check_dir(const char *dir, struct error *err);

#endif
