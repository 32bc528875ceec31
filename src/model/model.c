/* model.c - the Qwen3.5 text model: binds checkpoint tensors by their Hugging Face names, owns
 * the per-sequence state, and runs the forward pass through the backend's operations. This is
 * the only file that knows the layer order; it reads like transformers'
 * models/qwen3_5/modeling_qwen3_5.py (Qwen3_5TextModel.forward, Qwen3_5DecoderLayer.forward).
 *
 * Weights that read the same input are concatenated at load (rows stacked, so each output row is
 * computed exactly as by the separate projection): [in_proj_qkv; in_proj_z; in_proj_b; in_proj_a]
 * for a DeltaNet layer, [q_proj; k_proj; v_proj] for an attention layer, [gate_proj; up_proj] for
 * the MLP. */
#include "model.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { GRAPH_STEP = 1, GRAPH_STEP_LONG = 2 }; /* the decode step's graph, by graph_variant */
/* the step's graph ending in the sample op: keys above every argmax step's */
#define GRAPH_SAMPLE (2 * MODEL_MAX_SEQS)
/* a batched step's, by its row count and graph_variant: keys above those */
#define GRAPH_ROWS (4 * MODEL_MAX_SEQS + 8)
enum { CHOICE_NONE, CHOICE_ARGMAX, CHOICE_SAMPLE };
#define LOGITS_ROWS 16 /* rows of logits computed per matmul when every position is wanted */

struct layer {
    enum layer_type type;
    uint16_t *input_layernorm;          /* (H,) */
    uint16_t *post_attention_layernorm; /* (H,) */
    uint16_t *w_mix;  /* GDN: (conv_dim + value_dim + 2 Hv, H); attention: (2 nH hd + 2 nKV hd, H) */
    uint16_t *w_out;  /* GDN out_proj (H, value_dim); attention o_proj (H, nH hd) */
    uint16_t *w_gate_up; /* (2 I, H) */
    uint16_t *w_down;    /* (H, I) */
    /* full attention */
    uint16_t *q_norm, *k_norm; /* (hd,) */
    /* gated deltanet */
    uint16_t *conv_w;     /* (conv_dim, K) */
    float *A_log, *dt_bias; /* (Hv,) bf16-rounded values */
    float *norm_w;        /* (dv,) bf16-rounded values */
    int linear_index;     /* this layer's place among the DeltaNet layers (their state blocks) */
    int full_index;       /* ... among the attention layers (their KV blocks) */
};

/* A sequence: the state of one conversation, apart from the weights. The KV rows of position
 * p are written when token p is fed and never again, so cutting the sequence back to p (a
 * restored checkpoint) needs no copy of them; the DeltaNet states cannot be rewound and live in
 * one block, so a checkpoint is one copy of it. */
struct seq_layer {
    uint16_t *k_cache, *v_cache; /* attention: (nKV, ctx, hd) */
    uint16_t *conv_state;        /* DeltaNet: (conv_dim, K) raw inputs, a ring: column q % K
                                    holds position q (inside gdn_block) */
    float *state;                /* DeltaNet: (Hv, dk, dv) (inside gdn_block) */
};
struct model_seq {
    int index; /* in m->seqs: its decode graphs' keys */
    int pos;   /* tokens fed */
    struct seq_layer *l; /* (num_hidden_layers,) */
    void *gdn_block;     /* (gdn_block_bytes,) every DeltaNet layer's state, then conv state */
    void *kv_block;      /* every attention layer's k cache, then its v cache (kv_bytes each) */
    struct backend_sample_state samp; /* model_sample_begin's (allocated at its first call) */
    struct backend_sampling samp_host; /* the parameters as last uploaded to samp.params */
};
/* A checkpoint: a copy of a sequence's gdn_block at a position, and optionally the logits of the
 * token before it (the end of a prompt: resuming there needs no forward pass at all). */
struct model_ckpt {
    int pos, has_logits;
    void *block;      /* (gdn_block_bytes,) */
    uint16_t *logits; /* (V,) */
};
#define MODEL_MAX_SEQS 64
/* What a batched step uploads (one copy) to m->rows_dev: the rows' positions and ids, then the
 * bases of their sequences' blocks (struct backend_rows). */
struct rows_host {
    int32_t pos[MODEL_MAX_BATCH], ids[MODEL_MAX_BATCH];
    char *kv[MODEL_MAX_BATCH], *gdn[MODEL_MAX_BATCH];
};
_Static_assert(MODEL_MAX_BATCH <= BACKEND_ROWS_MAX, "a batched step's choices in one rows_post");

struct model {
    struct config config;
    struct safetensors st;
    struct backend *be;
    int ctx, max_T, quiet;
    struct layer *layers;
    struct model_seq *seqs[MODEL_MAX_SEQS]; /* seqs[0] made at load */
    int n_seqs;
    struct model_seq *cur;                   /* the sequence prefill and step act on */
    size_t gdn_block_bytes, gdn_state_bytes, gdn_conv_bytes; /* per sequence; per layer */
    uint16_t *embed_tokens; /* (V, H) */
    uint16_t *norm;         /* (H,) */
    uint16_t *lm_head;      /* (V, H); == embed_tokens when tied */
    /* activations, max_T rows */
    uint16_t *h;      /* (max_T, H) residual stream */
    uint16_t *proj;   /* (max_T, max(mix rows)) projection outputs */
    uint16_t *mix;    /* (max_T, max(value_dim, nH hd)) mixer outputs */
    uint16_t *mlp;    /* (max_T, I) */
    uint16_t *logits; /* (LOGITS_ROWS, V) */
    int32_t *ids;     /* (max_T,): pos_dev + 1, inside its allocation */
    int32_t *pos_dev; /* (1 + max_T,): the position of the first token of the call, then ids */
    size_t weight_bytes;
    int64_t n_params;
    int n_skipped;
    /* The choice of the current logits lies in ids[0], where a step's argmax (or sample) writes
     * it so that the next step can take it as its token without the host: */
    int choice;       /* what ids[0] holds: CHOICE_NONE, _ARGMAX, _SAMPLE */
    int posted;       /* ... and is the backend's post number n_posts: a step's choice, whose
                         argmax also advanced pos_dev[0] to pos */
    /* a batched step (model_step_rows): */
    uint16_t *row_logits; /* (MODEL_MAX_BATCH + 1, V) row b's logits (+ a riding prompt's) */
    void *rows_dev;       /* struct rows_host's layout: the rows' positions, ids, blocks */
    int32_t *row_choice;  /* (MODEL_MAX_BATCH,) the rows' choices */
    int n_rows;           /* rows of the last batched step */
    int32_t row_post[2][MODEL_MAX_BATCH]; /* model_rows_post without the backend's op */
    int64_t n_row_posts;
    struct model_seq *ride[MODEL_MAX_BATCH]; /* model_rows_ride: rows for the next prefill call */
    int32_t ride_tok[MODEL_MAX_BATCH];
    int n_ride, rode;     /* registered; carried by the prefill since */
    long n_mixed;         /* prefill calls that carried rows */
    float *lp_out;       /* model_logprobs: the op's output (2 + 2 BACKEND_LOGPROBS_KMAX,) */
    int32_t *lp_chosen;  /* ... and the chosen token (1,) */
    int64_t n_posts;  /* steps run: each posts its choice */
    struct gen_defaults gen; /* generation_config.json */
    int logits_pos;   /* m->logits row 0 holds the logits of the current sequence at this
                         position (of its token pos - 1), or -1 */
    const char *prefix;
};

/* ---------------------------------------------------------------------------------------------
 * loading */

struct loader {
    struct model *m;
    const char *dir;
    struct error *err;
    uint8_t *seen; /* (n_tensors,) */
};

static int shape_str(char *buf, size_t cap, const int64_t *shape, int ndim) {
    size_t n = 0;
    n += (size_t)snprintf(buf + n, cap - n, "[");
    for (int i = 0; i < ndim && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (n < cap) snprintf(buf + n, cap - n, "]");
    return 0;
}

/* Finds `name` (after the language-model prefix, or top level when name starts with "lm_head")
 * and checks its dtype and shape exactly. `dims` names the config fields behind the shape, for the
 * message. allow_f32: the tensor may be F32 instead of BF16 (A_log, dt_bias, gated norm). */
static const struct st_tensor *find_tensor(struct loader *ld, const char *name, const char *dims,
                                           int ndim, const int64_t *shape, int allow_f32) {
    char full[512];
    if (strncmp(name, "lm_head", 7) == 0)
        snprintf(full, sizeof full, "%s", name);
    else
        snprintf(full, sizeof full, "%s%s", ld->m->prefix, name);
    const struct st_tensor *t = safetensors_find(&ld->m->st, full);
    const char *want_dtype = allow_f32 ? "BF16 or F32" : "BF16";
    char want[128], got[128];
    shape_str(want, sizeof want, shape, ndim);
    if (!t) {
        const struct safetensors *st = &ld->m->st;
        error_set(ld->err, "%s%s: tensor %s: missing (expected shape %s %s %s)",
                  st->n_files == 1 ? st->files[0].path : ld->dir,
                  st->n_files == 1 ? "" : "/model.safetensors.index.json", full, want, dims,
                  want_dtype);
        return NULL;
    }
    const char *file = ld->m->st.files[t->file].path;
    shape_str(got, sizeof got, t->shape, t->ndim);
    int shape_ok = t->ndim == ndim;
    for (int i = 0; shape_ok && i < ndim; i++) shape_ok = t->shape[i] == shape[i];
    int dtype_ok = t->dtype == ST_BF16 || (allow_f32 && t->dtype == ST_F32);
    if (!shape_ok || !dtype_ok) {
        error_set(ld->err, "%s: tensor %s: expected shape %s %s %s, found %s %s", file, full, want,
                  dims, want_dtype, got, st_dtype_name(t->dtype));
        return NULL;
    }
    ld->seen[t - ld->m->st.tensors] = 1;
    return t;
}

/* Uploads one bf16 tensor (or several stacked by rows) to a new device buffer. */
static uint16_t *upload_rows(struct loader *ld, const struct st_tensor **parts, int n_parts) {
    size_t bytes = 0;
    for (int i = 0; i < n_parts; i++) bytes += parts[i]->nbytes;
    struct backend *be = ld->m->be;
    uint16_t *dst = be->ops->alloc(be, bytes);
    size_t off = 0;
    for (int i = 0; i < n_parts; i++) {
        be->ops->upload(be, (char *)dst + off, parts[i]->data, parts[i]->nbytes);
        off += parts[i]->nbytes;
        ld->m->n_params += (int64_t)(parts[i]->nbytes / 2);
    }
    ld->m->weight_bytes += bytes;
    return dst;
}

/* Uploads a small vector as fp32 holding bf16-rounded values (qwen35-model.md T3: transformers
 * loads the F32 A_log / norm.weight of the checkpoint as bf16). */
static float *upload_vec_f32(struct loader *ld, const struct st_tensor *t, int n) {
    float *tmp = xmalloc((size_t)n * sizeof(float));
    for (int i = 0; i < n; i++) {
        float v;
        if (t->dtype == ST_F32)
            memcpy(&v, (const char *)t->data + (size_t)i * 4, 4);
        else
            v = bf16_to_f32(((const uint16_t *)t->data)[i]);
        tmp[i] = bf16r(v);
    }
    struct backend *be = ld->m->be;
    float *dst = be->ops->alloc(be, (size_t)n * sizeof(float));
    be->ops->upload(be, dst, tmp, (size_t)n * sizeof(float));
    free(tmp);
    ld->m->n_params += n;
    ld->m->weight_bytes += t->nbytes;
    return dst;
}

#define SHAPE(...) ((const int64_t[]){__VA_ARGS__})
#define NDIM(...) ((int)(sizeof((const int64_t[]){__VA_ARGS__}) / sizeof(int64_t)))
#define FIND(ld, name, dims, ...)                                                              \
    find_tensor(ld, name, dims, NDIM(__VA_ARGS__), SHAPE(__VA_ARGS__), 0)
#define FIND_F32(ld, name, dims, ...)                                                          \
    find_tensor(ld, name, dims, NDIM(__VA_ARGS__), SHAPE(__VA_ARGS__), 1)

static void progress(struct model *m, int done, int total) {
    if (m->quiet || m->weight_bytes < ((size_t)256 << 20)) return;
    int w = 40, fill = total ? done * w / total : w;
    fprintf(stderr, "\rloading weights [%.*s%*s] %d/%d layers, %.2f GB", fill,
            "########################################", w - fill, "", done, total,
            (double)m->weight_bytes / 1e9);
    if (done == total) fputc('\n', stderr);
}

static int load_layer(struct loader *ld, int l) {
    struct model *m = ld->m;
    const struct config *c = &m->config;
    struct layer *L = &m->layers[l];
    int64_t H = c->hidden_size, I = c->intermediate_size;
    char n[256];
    const struct st_tensor *t[4];
    L->type = c->layer_types[l];

#define NAME(suffix) (snprintf(n, sizeof n, "layers.%d.%s", l, suffix), n)
    if (!(t[0] = FIND(ld, NAME("input_layernorm.weight"), "(hidden_size)", H))) return -1;
    L->input_layernorm = upload_rows(ld, t, 1);
    if (!(t[0] = FIND(ld, NAME("post_attention_layernorm.weight"), "(hidden_size)", H))) return -1;
    L->post_attention_layernorm = upload_rows(ld, t, 1);
    if (!(t[0] = FIND(ld, NAME("mlp.gate_proj.weight"), "(intermediate_size, hidden_size)", I, H))) return -1;
    if (!(t[1] = FIND(ld, NAME("mlp.up_proj.weight"), "(intermediate_size, hidden_size)", I, H))) return -1;
    L->w_gate_up = upload_rows(ld, t, 2);
    if (!(t[0] = FIND(ld, NAME("mlp.down_proj.weight"), "(hidden_size, intermediate_size)", H, I))) return -1;
    L->w_down = upload_rows(ld, t, 1);

    if (L->type == LAYER_FULL_ATTENTION) {
        int64_t nH = c->num_attention_heads, nKV = c->num_key_value_heads, hd = c->head_dim;
        if (!(t[0] = FIND(ld, NAME("self_attn.q_proj.weight"), "(2 num_attention_heads head_dim, hidden_size)", 2 * nH * hd, H))) return -1;
        if (!(t[1] = FIND(ld, NAME("self_attn.k_proj.weight"), "(num_key_value_heads head_dim, hidden_size)", nKV * hd, H))) return -1;
        if (!(t[2] = FIND(ld, NAME("self_attn.v_proj.weight"), "(num_key_value_heads head_dim, hidden_size)", nKV * hd, H))) return -1;
        L->w_mix = upload_rows(ld, t, 3);
        if (!(t[0] = FIND(ld, NAME("self_attn.o_proj.weight"), "(hidden_size, num_attention_heads head_dim)", H, nH * hd))) return -1;
        L->w_out = upload_rows(ld, t, 1);
        if (!(t[0] = FIND(ld, NAME("self_attn.q_norm.weight"), "(head_dim)", hd))) return -1;
        L->q_norm = upload_rows(ld, t, 1);
        if (!(t[0] = FIND(ld, NAME("self_attn.k_norm.weight"), "(head_dim)", hd))) return -1;
        L->k_norm = upload_rows(ld, t, 1);
    } else {
        int64_t Hv = c->linear_num_value_heads, K = c->linear_conv_kernel_dim;
        int64_t conv_dim = c->conv_dim, value_dim = c->value_dim;
        if (!(t[0] = FIND(ld, NAME("linear_attn.in_proj_qkv.weight"), "(2 key_dim + value_dim, hidden_size)", conv_dim, H))) return -1;
        if (!(t[1] = FIND(ld, NAME("linear_attn.in_proj_z.weight"), "(value_dim, hidden_size)", value_dim, H))) return -1;
        if (!(t[2] = FIND(ld, NAME("linear_attn.in_proj_b.weight"), "(linear_num_value_heads, hidden_size)", Hv, H))) return -1;
        if (!(t[3] = FIND(ld, NAME("linear_attn.in_proj_a.weight"), "(linear_num_value_heads, hidden_size)", Hv, H))) return -1;
        L->w_mix = upload_rows(ld, t, 4);
        if (!(t[0] = FIND(ld, NAME("linear_attn.out_proj.weight"), "(hidden_size, value_dim)", H, value_dim))) return -1;
        L->w_out = upload_rows(ld, t, 1);
        if (!(t[0] = FIND(ld, NAME("linear_attn.conv1d.weight"), "(conv_dim, 1, linear_conv_kernel_dim)", conv_dim, 1, K))) return -1;
        L->conv_w = upload_rows(ld, t, 1);
        if (!(t[0] = FIND_F32(ld, NAME("linear_attn.A_log"), "(linear_num_value_heads)", Hv))) return -1;
        L->A_log = upload_vec_f32(ld, t[0], (int)Hv);
        if (!(t[0] = FIND_F32(ld, NAME("linear_attn.dt_bias"), "(linear_num_value_heads)", Hv))) return -1;
        L->dt_bias = upload_vec_f32(ld, t[0], (int)Hv);
        if (!(t[0] = FIND_F32(ld, NAME("linear_attn.norm.weight"), "(linear_value_head_dim)", c->linear_value_head_dim)))
            return -1;
        L->norm_w = upload_vec_f32(ld, t[0], c->linear_value_head_dim);
    }
#undef NAME
    return 0;
}

static int is_skipped_name(const char *name) {
    return strncmp(name, "mtp.", 4) == 0 || strncmp(name, "model.visual.", 13) == 0 ||
           strncmp(name, "visual.", 7) == 0;
}

/* Device memory the model will take: weights (as in the checkpoint, minus skipped tensors), KV
 * cache for ctx positions, DeltaNet states, activations for max_T tokens. The backend's scratch is
 * already allocated when this runs, so the free memory it reports accounts for it. Fails with
 * bytes needed vs free when the model cannot fit. */
/* Bytes of device memory the model needs at context ctx (as check_memory counts them). */
static size_t model_need(const struct model *m, int ctx) {
    const struct config *c = &m->config;
    size_t need = 0;
    for (int i = 0; i < m->st.n_tensors; i++)
        if (!is_skipped_name(m->st.tensors[i].name)) need += m->st.tensors[i].nbytes;
    need += (size_t)2 * c->num_key_value_heads * c->head_dim * c->n_full_layers * 2 * ctx;
    need += (size_t)c->n_linear_layers *
            ((size_t)c->linear_num_value_heads * c->linear_key_head_dim * c->linear_value_head_dim *
                 4 + (size_t)c->conv_dim * c->linear_conv_kernel_dim * 2);
    need += (size_t)m->max_T * 2 * (c->hidden_size + c->conv_dim + c->value_dim +
                                     c->intermediate_size + 2 * c->num_attention_heads * c->head_dim);
    return need;
}

/* The largest context (a multiple of 256) whose model fits in the backend's free memory with a
 * tenth of it to spare (the prefix cache then takes half of what is left): INT_MAX if memory
 * is unknown. */
static int fit_ctx(const struct model *m) {
    struct backend *be = m->be;
    const size_t avail = be->ops->mem_free ? be->ops->mem_free(be) : 0;
    if (!avail) return 0x7fffffff;
    const struct config *c = &m->config;
    const size_t per_tok = (size_t)2 * c->num_key_value_heads * c->head_dim * c->n_full_layers * 2;
    const size_t base = model_need(m, 0), room = avail - avail / 10;
    if (base >= room || !per_tok) return 0;
    const size_t n = (room - base) / per_tok;
    return n > 0x7fffff00 ? 0x7fffff00 : (int)(n / 256 * 256);
}

static int check_memory(struct model *m, const char *dir, struct error *err) {
    struct backend *be = m->be;
    size_t avail = be->ops->mem_free ? be->ops->mem_free(be) : 0;
    if (!avail) return 0;
    const size_t need = model_need(m, m->ctx);
    if (need > avail)
        return error_set(err, "%s: not enough %s memory for a %d-token context: the model needs "
                              "%.2f GiB (weights, KV cache, states, activations), %.2f GiB free; "
                              "try a smaller --ctx",
                         dir, be->ops->name, m->ctx, need / 1073741824.0, avail / 1073741824.0);
    return 0;
}

struct model *model_load(const char *dir, const struct model_options *opt, struct error *err) {
    struct model_options defaults = {0};
    if (!opt) opt = &defaults;
    struct model *m = xcalloc(1, sizeof *m);
    struct loader ld = {.m = m, .dir = dir, .err = err};
    char path[4096];
    m->quiet = opt->quiet;

    if (config_check_dir(dir, err) != 0) {
        free(m);
        return NULL;
    }
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (config_load(&m->config, path, err) < 0) goto fail;
    const struct config *c = &m->config;
    if (safetensors_open_dir(&m->st, dir, err) < 0) goto fail;
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    if (gen_defaults_load(&m->gen, path, err) < 0) goto fail;

    /* language-model tensors live under model.language_model. (published multimodal checkpoints)
     * or model. (text-only exports) */
    m->prefix = safetensors_find(&m->st, "model.language_model.embed_tokens.weight")
                    ? "model.language_model."
                    : "model.";
    ld.seen = xcalloc((size_t)m->st.n_tensors + 1, 1);

    int max_pos = c->max_position_embeddings > 0 ? c->max_position_embeddings : 4096;
    /* default: the model's whole context, cut below to what the device holds (fit_ctx) */
    m->ctx = opt->ctx > 0 ? opt->ctx : max_pos;
    if (m->ctx > max_pos) {
        error_set(err, "%s: requested context %d exceeds max_position_embeddings %d", dir, m->ctx,
                  max_pos);
        goto fail;
    }
    /* Tokens per forward call. On the GPU a prompt of up to 8192 tokens is one call, so the
     * launch count of a prefill does not grow with its length; the CPU gains nothing from more
     * than 512 rows at a time. */
    enum backend_kind kind = opt->backend;
    if (kind == BACKEND_CUDA || kind == BACKEND_AUTO) {
        struct error cuda_err = {{0}};
        m->max_T = opt->max_T > 0 ? opt->max_T : (m->ctx < 8192 ? m->ctx : 8192);
        m->be = backend_cuda_create(c, m->ctx, m->max_T, &cuda_err);
        if (!m->be && kind == BACKEND_CUDA) {
            error_set(err, "cuda backend: %s", cuda_err.msg);
            goto fail;
        }
    }
    if (!m->be) {
        m->max_T = opt->max_T > 0 ? opt->max_T : 512;
        m->be = backend_cpu_create(c, m->ctx, m->max_T, opt->n_threads);
    }
    if (opt->ctx <= 0 && m->be->ops->mem_free) { /* the default context that fits */
        const int fit = fit_ctx(m);
        if (fit < m->ctx && fit >= 256) {
            m->be->ops->destroy(m->be); /* its scratch is sized by the context */
            m->ctx = fit;
            if (m->max_T > m->ctx) m->max_T = m->ctx;
            m->be = backend_cuda_create(c, m->ctx, m->max_T, err);
            if (!m->be) goto fail;
        }
    }
    struct backend *be = m->be;
    if (!m->quiet && opt->ctx <= 0 && m->ctx < max_pos)
        fprintf(stderr, "strata: context %d tokens (the model's %d does not fit in %s memory)\n",
                m->ctx, max_pos, be->ops->name);

    if (check_memory(m, dir, err) < 0) goto fail;

    int64_t V = c->vocab_size, H = c->hidden_size;
    const struct st_tensor *t[1];
    if (!(t[0] = FIND(&ld, "embed_tokens.weight", "(vocab_size, hidden_size)", V, H))) goto fail;
    m->embed_tokens = upload_rows(&ld, t, 1);
    if (!(t[0] = FIND(&ld, "norm.weight", "(hidden_size)", H))) goto fail;
    m->norm = upload_rows(&ld, t, 1);
    const struct st_tensor *lm = safetensors_find(&m->st, "lm_head.weight");
    if (c->tie_word_embeddings) {
        m->lm_head = m->embed_tokens;
        if (lm) ld.seen[lm - m->st.tensors] = 1; /* tied: an lm_head copy is ignored */
    } else {
        if (!(t[0] = FIND(&ld, "lm_head.weight", "(vocab_size, hidden_size)", V, H))) goto fail;
        m->lm_head = upload_rows(&ld, t, 1);
    }

    m->layers = xcalloc((size_t)c->num_hidden_layers, sizeof *m->layers);
    for (int l = 0; l < c->num_hidden_layers; l++) {
        if (load_layer(&ld, l) < 0) goto fail;
        progress(m, l + 1, c->num_hidden_layers);
    }
    /* the DeltaNet states of a sequence in one block: each layer's recurrent state, then each
     * layer's conv ring (sizes multiples of 256 bytes, so every piece stays aligned) */
    m->gdn_state_bytes = (size_t)c->linear_num_value_heads * c->linear_key_head_dim *
                         c->linear_value_head_dim * sizeof(float);
    m->gdn_conv_bytes = ((size_t)c->conv_dim * c->linear_conv_kernel_dim * 2 + 255) & ~(size_t)255;
    for (int l = 0, n = 0, f = 0; l < c->num_hidden_layers; l++) {
        m->layers[l].linear_index = m->layers[l].type == LAYER_LINEAR_ATTENTION ? n++ : -1;
        m->layers[l].full_index = m->layers[l].type == LAYER_FULL_ATTENTION ? f++ : -1;
    }
    m->gdn_block_bytes = (size_t)c->n_linear_layers * (m->gdn_state_bytes + m->gdn_conv_bytes);
    m->cur = model_seq_create(m);
    m->logits_pos = -1;
    for (int i = 0; i < m->st.n_tensors; i++) {
        if (ld.seen[i]) continue;
        const char *name = m->st.tensors[i].name;
        if (!is_skipped_name(name)) {
            error_set(err, "%s: tensor %s: not part of a %d-layer Qwen3.5 text model (config and "
                           "weights disagree?)",
                      m->st.files[m->st.tensors[i].file].path, name, c->num_hidden_layers);
            goto fail;
        }
        m->n_skipped++;
    }

    int nH = c->num_attention_heads, nKV = c->num_key_value_heads, hd = c->head_dim;
    int mix_rows = c->conv_dim + c->value_dim + 2 * c->linear_num_value_heads;
    if (2 * nH * hd + 2 * nKV * hd > mix_rows) mix_rows = 2 * nH * hd + 2 * nKV * hd;
    int mix_out = c->value_dim > nH * hd ? c->value_dim : nH * hd;
    size_t T = (size_t)m->max_T;
    m->h = be->ops->alloc(be, T * H * 2);
    m->proj = be->ops->alloc(be, T * mix_rows * 2);
    m->mix = be->ops->alloc(be, T * mix_out * 2);
    m->mlp = be->ops->alloc(be, T * c->intermediate_size * 2);
    m->logits = be->ops->alloc(be, (size_t)LOGITS_ROWS * V * 2);
    /* the position, then the ids: a call uploads both in one copy */
    m->pos_dev = be->ops->alloc(be, (size_t)(T + 1) * sizeof(int32_t));
    m->ids = m->pos_dev + 1;
    m->row_logits = be->ops->alloc(be, (size_t)(MODEL_MAX_BATCH + 1) * V * 2); /* + a prompt's */
    m->rows_dev = be->ops->alloc(be, sizeof(struct rows_host));
    m->row_choice = be->ops->alloc(be, MODEL_MAX_BATCH * sizeof(int32_t));
    free(ld.seen);
    safetensors_close(&m->st); /* every weight is on the backend now */
    memset(&m->st, 0, sizeof m->st);
    return m;

fail:
    free(ld.seen);
    model_free(m);
    return NULL;
}

void model_free(struct model *m) {
    if (!m) return;
    struct backend *be = m->be;
    if (be) {
        /* every buffer was allocated on this backend; destroying it releases them all only on
         * backends that track allocations, so free them one by one */
        void *bufs[] = {m->embed_tokens, m->norm, m->h, m->proj, m->mix, m->mlp,
                        m->logits, m->pos_dev, /* ids: inside pos_dev's */
                        m->row_logits, m->rows_dev, m->row_choice, m->lp_out, m->lp_chosen};
        for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
            if (bufs[i]) be->ops->free(be, bufs[i]);
        for (int i = 0; i < m->n_seqs; i++) {
            struct model_seq *s = m->seqs[i];
            if (s->kv_block) be->ops->free(be, s->kv_block);
            if (s->gdn_block) be->ops->free(be, s->gdn_block);
            void *sb[] = {s->samp.params, s->samp.bias, s->samp.count, s->samp.in_prompt, s->samp.mask};
            for (size_t i = 0; i < sizeof sb / sizeof *sb; i++)
                if (sb[i]) be->ops->free(be, sb[i]);
            free(s->l);
            free(s);
        }
        if (m->lm_head && m->lm_head != m->embed_tokens) be->ops->free(be, m->lm_head);
        for (int l = 0; m->layers && l < m->config.num_hidden_layers; l++) {
            struct layer *L = &m->layers[l];
            void *lb[] = {L->input_layernorm, L->post_attention_layernorm, L->w_mix, L->w_out,
                          L->w_gate_up, L->w_down, L->q_norm, L->k_norm, L->conv_w, L->A_log,
                          L->dt_bias, L->norm_w};
            for (size_t i = 0; i < sizeof lb / sizeof *lb; i++)
                if (lb[i]) be->ops->free(be, lb[i]);
        }
        be->ops->destroy(be);
    }
    free(m->layers);
    safetensors_close(&m->st);
    free(m);
}

const struct config *model_config(const struct model *m) { return &m->config; }
const struct gen_defaults *model_gen_defaults(const struct model *m) { return &m->gen; }
struct backend *model_backend(struct model *m) { return m->be; }
int model_ctx(const struct model *m) { return m->ctx; }
int model_async(const struct model *m) { return m->be->async; }
int model_pos(const struct model *m) { return m->cur->pos; }
size_t model_weight_bytes(const struct model *m) { return m->weight_bytes; }
int64_t model_n_params(const struct model *m) { return m->n_params; }
int model_n_skipped(const struct model *m) { return m->n_skipped; }

void model_reset(struct model *m) {
    /* the KV rows are overwritten by position; the DeltaNet states start from zero */
    if (m->gdn_block_bytes) m->be->ops->zero(m->be, m->cur->gdn_block, m->gdn_block_bytes);
    m->cur->pos = 0;
    m->choice = m->posted = 0;
    m->logits_pos = -1;
}

/* ---------------------------------------------------------------------------------------------
 * sequences and checkpoints */

/* One attention layer's k (or v) cache of a sequence: (nKV, ctx, hd) bf16. */
static size_t kv_cache_bytes(const struct model *m) {
    const struct config *c = &m->config;
    return (size_t)c->num_key_value_heads * m->ctx * c->head_dim * sizeof(uint16_t);
}

struct model_seq *model_seq_create(struct model *m) {
    const struct config *c = &m->config;
    struct backend *be = m->be;
    if (m->n_seqs >= MODEL_MAX_SEQS) return NULL;
    struct model_seq *s = xcalloc(1, sizeof *s);
    s->index = m->n_seqs;
    s->l = xcalloc((size_t)c->num_hidden_layers, sizeof *s->l);
    if (m->gdn_block_bytes) s->gdn_block = be->ops->alloc(be, m->gdn_block_bytes);
    const size_t kv_bytes = kv_cache_bytes(m);
    if (c->n_full_layers) s->kv_block = be->ops->alloc(be, (size_t)c->n_full_layers * 2 * kv_bytes);
    for (int l = 0; l < c->num_hidden_layers; l++) {
        struct seq_layer *sl = &s->l[l];
        if (m->layers[l].type == LAYER_FULL_ATTENTION) {
            char *b = (char *)s->kv_block + (size_t)m->layers[l].full_index * 2 * kv_bytes;
            sl->k_cache = (uint16_t *)b;
            sl->v_cache = (uint16_t *)(b + kv_bytes);
        } else {
            int j = m->layers[l].linear_index;
            char *b = s->gdn_block;
            sl->state = (float *)(b + (size_t)j * m->gdn_state_bytes);
            sl->conv_state = (uint16_t *)(b + (size_t)c->n_linear_layers * m->gdn_state_bytes +
                                          (size_t)j * m->gdn_conv_bytes);
        }
    }
    m->seqs[m->n_seqs++] = s;
    return s;
}

size_t model_seq_bytes(const struct model *m) {
    const struct config *c = &m->config;
    return m->gdn_block_bytes +
           (size_t)c->n_full_layers * 2 * c->num_key_value_heads * m->ctx * c->head_dim * 2;
}

struct model_seq *model_seq_default(struct model *m) { return m->seqs[0]; }
int model_n_seqs(const struct model *m) { return m->n_seqs; }
struct model_seq *model_seq_at(struct model *m, int i) {
    CHECK(i >= 0 && i < m->n_seqs);
    return m->seqs[i];
}
struct model_seq *model_seq_current(struct model *m) { return m->cur; }
int model_seq_pos(const struct model_seq *s) { return s->pos; }

void model_seq_use(struct model *m, struct model_seq *s) {
    if (s == m->cur) return;
    m->cur = s;
    m->choice = m->posted = 0; /* ids[0] and the logits are the other sequence's */
    m->logits_pos = -1;
}

void model_seq_fork(struct model *m, struct model_seq *dst, const struct model_seq *src, int n) {
    const struct config *c = &m->config;
    struct backend *be = m->be;
    CHECK(dst != src && n >= 0 && n <= src->pos);
    const size_t row = (size_t)c->head_dim * 2, pitch = (size_t)m->ctx * row;
    for (int l = 0; n > 0 && l < c->num_hidden_layers; l++)
        if (m->layers[l].type == LAYER_FULL_ATTENTION) { /* rows [0, n) of every KV head */
            be->ops->copy(be, dst->l[l].k_cache, pitch, src->l[l].k_cache, pitch, n * row,
                          (size_t)c->num_key_value_heads);
            be->ops->copy(be, dst->l[l].v_cache, pitch, src->l[l].v_cache, pitch, n * row,
                          (size_t)c->num_key_value_heads);
        }
    dst->pos = n; /* its DeltaNet states are the caller's to restore (a checkpoint at n) */
    if (dst == m->cur) m->choice = m->posted = 0;
}

size_t model_ckpt_bytes(const struct model *m) {
    return m->gdn_block_bytes + (size_t)m->config.vocab_size * 2;
}

struct model_ckpt *model_ckpt_create(struct model *m) {
    struct model_ckpt *ck = xcalloc(1, sizeof *ck);
    struct backend *be = m->be;
    ck->pos = -1;
    if (m->gdn_block_bytes) ck->block = be->ops->alloc(be, m->gdn_block_bytes);
    ck->logits = be->ops->alloc(be, (size_t)m->config.vocab_size * 2);
    return ck;
}

void model_ckpt_free(struct model *m, struct model_ckpt *ck) {
    if (!ck) return;
    if (ck->block) m->be->ops->free(m->be, ck->block);
    m->be->ops->free(m->be, ck->logits);
    free(ck);
}

int model_ckpt_pos(const struct model_ckpt *ck) { return ck->pos; }
int model_logits_current(const struct model *m) { return m->logits_pos == m->cur->pos; }
int model_ckpt_has_logits(const struct model_ckpt *ck) { return ck->has_logits; }

void model_ckpt_take(struct model *m, struct model_ckpt *ck, int with_logits) {
    struct backend *be = m->be;
    if (m->gdn_block_bytes)
        be->ops->copy(be, ck->block, 0, m->cur->gdn_block, 0, m->gdn_block_bytes, 1);
    ck->pos = m->cur->pos;
    ck->has_logits = with_logits && m->logits_pos == m->cur->pos;
    if (ck->has_logits)
        be->ops->copy(be, ck->logits, 0, m->logits, 0, (size_t)m->config.vocab_size * 2, 1);
}

void model_ckpt_restore(struct model *m, const struct model_ckpt *ck, int with_logits) {
    struct backend *be = m->be;
    CHECK(ck->pos >= 0 && ck->pos <= m->ctx);
    if (m->gdn_block_bytes)
        be->ops->copy(be, m->cur->gdn_block, 0, ck->block, 0, m->gdn_block_bytes, 1);
    m->cur->pos = ck->pos;
    m->choice = m->posted = 0;
    m->logits_pos = -1;
    if (with_logits && ck->has_logits) {
        be->ops->copy(be, m->logits, 0, ck->logits, 0, (size_t)m->config.vocab_size * 2, 1);
        m->logits_pos = ck->pos;
    }
}

/* ---------------------------------------------------------------------------------------------
 * forward */

/* Checkpoints to fill partway through a forward call: after the call's first t[i] tokens. */
struct snaps {
    int n;
    int t[BACKEND_MAX_SNAPS];
    struct model_ckpt *ck[BACKEND_MAX_SNAPS];
};

/* Row `from` of a bf16 activation of `width` columns to row `to`. */
static void move_row(struct backend *be, uint16_t *buf, int width, int to, int from) {
    const size_t bytes = (size_t)width * 2;
    be->ops->copy(be, buf + (size_t)to * width, bytes, buf + (size_t)from * width, bytes, bytes, 1);
}

/* Runs T tokens (already in m->ids, position in m->pos_dev) through every layer, leaving the
 * final residual stream in m->h; fills sn's checkpoints' DeltaNet states on the way (sn may be
 * NULL). With R > 0 (a mixed step), R decode rows of other sequences (m->rows_dev, as
 * forward_rows) come first: rows 0..R-1 of every activation are theirs and the prompt's follow,
 * the projections and the MLP run over all R + T rows, each part's mixers on its own state.
 * With `tail`, only rows 0..R-1 and the prompt's last row are wanted at the end: the last layer's
 * mixer writes every token's KV cache or state, but an attention layer attends from the last
 * token alone, and its o_proj and MLP run over those rows alone (llama.cpp's output-row
 * selection; the other T - 1 rows of h are left stale): the last row in place (row T - 1) when
 * R = 0, else moved to row R to follow the riders'.
 * HF: Qwen3_5TextModel.forward up to the final norm; logits_to_keep. */
static void forward(struct model *m, int T, const struct snaps *sn, int R, int tail) {
    const struct config *c = &m->config;
    struct backend *be = m->be;
    const struct backend_ops *op = be->ops;
    int H = c->hidden_size, I = c->intermediate_size;
    int nH = c->num_attention_heads, nKV = c->num_key_value_heads, hd = c->head_dim;
    const int N_attn = 2 * nH * hd + 2 * nKV * hd, N_gdn = c->conv_dim + c->value_dim + 2 * c->linear_num_value_heads;
    const struct rows_host *rd = m->rows_dev;
    const struct backend_rows rows = {rd->pos, rd->kv, rd->gdn};
    const size_t kv_bytes = kv_cache_bytes(m);

    if (R) op->embed(be, m->h, m->embed_tokens, rd->ids, R);
    op->embed(be, m->h + (size_t)R * H, m->embed_tokens, m->ids, T); /* HF: inputs_embeds = embed_tokens(ids) */
    for (int l = 0; l < c->num_hidden_layers; l++) {
        struct layer *L = &m->layers[l];
        struct seq_layer *S = &m->cur->l[l];
        /* the last layer's tail: the o_proj (attention) and the MLP over n_out rows from row o */
        const int cut = tail && T > 1 && l == c->num_hidden_layers - 1;
        const int n_out = cut ? R + 1 : R + T, o = cut && !R ? T - 1 : 0;
        const int q_from = cut ? T - 1 : 0; /* the attention's first query */
        if (L->type == LAYER_FULL_ATTENTION) {
            /* HF: hidden = input_layernorm(residual); q_proj/k_proj/v_proj(hidden); q/k norm,
             * rope, cache update, attention, * sigmoid(gate) */
            if (R) {
                const size_t k_off = (size_t)L->full_index * 2 * kv_bytes;
                op->matmul(be, m->proj, m->h, L->input_layernorm, L->w_mix, R + T, N_attn, H, 0);
                op->attention_rows(be, m->mix, m->proj, L->q_norm, L->k_norm, &rows, k_off,
                                   k_off + kv_bytes, R);
                op->attention(be, m->mix + (size_t)R * nH * hd, m->proj + (size_t)R * N_attn, NULL,
                              NULL, NULL, L->q_norm, L->k_norm, S->k_cache, S->v_cache, m->pos_dev, T,
                              q_from);
            } else {
                op->attention(be, m->mix, m->proj, m->h, L->input_layernorm, L->w_mix, L->q_norm,
                              L->k_norm, S->k_cache, S->v_cache, m->pos_dev, T, q_from);
            }
            if (cut && R) {
                move_row(be, m->h, H, R, R + T - 1);
                move_row(be, m->mix, nH * hd, R, R + T - 1);
            }
            /* HF: residual + o_proj(attn_output) */
            op->matmul(be, m->h + (size_t)o * H, m->mix + (size_t)o * nH * hd, NULL, L->w_out, n_out, H,
                       nH * hd, 1);
        } else {
            /* HF: in_proj_qkv / in_proj_z / in_proj_b / in_proj_a of input_layernorm(residual),
             * conv1d + silu, gated delta rule, core_attn_out = norm(core_attn_out, z),
             * residual + out_proj(core_attn_out) */
            struct backend_snap bs = {0};
            for (int i = 0; sn && i < sn->n; i++) { /* this layer's pieces of the blocks */
                char *b = sn->ck[i]->block;
                bs.t[bs.n] = sn->t[i];
                bs.state[bs.n] = (float *)(b + (size_t)L->linear_index * m->gdn_state_bytes);
                bs.conv[bs.n++] = (uint16_t *)(b + (size_t)c->n_linear_layers * m->gdn_state_bytes +
                                               (size_t)L->linear_index * m->gdn_conv_bytes);
            }
            if (R) {
                const size_t state_off = (size_t)L->linear_index * m->gdn_state_bytes;
                const size_t conv_off = (size_t)c->n_linear_layers * m->gdn_state_bytes +
                                        (size_t)L->linear_index * m->gdn_conv_bytes;
                op->matmul(be, m->proj, m->h, L->input_layernorm, L->w_mix, R + T, N_gdn, H, 0);
                op->gdn_rows(be, m->mix, m->proj, L->conv_w, L->A_log, L->dt_bias, L->norm_w, &rows,
                             state_off, conv_off, R);
                /* the prompt's mixer stops before out_proj: one out_proj over all R + T rows */
                op->gdn(be, m->mix + (size_t)R * c->value_dim, m->proj + (size_t)R * N_gdn, NULL, NULL,
                        S->conv_state, L->conv_w, L->A_log, L->dt_bias, L->norm_w, S->state, NULL,
                        m->pos_dev, T, bs.n ? &bs : NULL);
                op->matmul(be, m->h, m->mix, NULL, L->w_out, R + T, H, c->value_dim, 1);
            } else {
                op->gdn(be, m->h, m->proj, L->input_layernorm, L->w_mix, S->conv_state, L->conv_w,
                        L->A_log, L->dt_bias, L->norm_w, S->state, L->w_out, m->pos_dev, T,
                        bs.n ? &bs : NULL);
            }
            if (cut && R) move_row(be, m->h, H, R, R + T - 1);
        }
        /* HF: residual + mlp(post_attention_layernorm(residual)) */
        op->matmul_swiglu(be, m->mlp, m->h + (size_t)o * H, L->post_attention_layernorm, L->w_gate_up, n_out,
                          I, H);
        op->matmul(be, m->h + (size_t)o * H, m->mlp, NULL, L->w_down, n_out, H, I, 1);
    }
}

/* logits of `rows` consecutive rows of m->h starting at `row`. HF: lm_head(norm(hidden)) */
static void logits_rows(struct model *m, int row, int rows) {
    const struct config *c = &m->config;
    m->be->ops->matmul(m->be, m->logits, m->h + (size_t)row * c->hidden_size, m->norm, m->lm_head,
                       rows, c->vocab_size, c->hidden_size, 0);
}

static int rows_upload(struct model *m, struct model_seq *const *seqs, const int32_t *tokens, int B);
static void rows_advance(struct model *m, struct model_seq *const *seqs, int B);
static void logits_of_rows(struct model *m, int B);

/* Feeds ids[0..n) in calls of at most max_T tokens; ck[i] takes the state after the first
 * at[i] of them (0 < at[i] <= n, increasing), taken inside the calls (no extra pass). */
static int prefill(struct model *m, const int32_t *ids, int n, float *all_logits,
                   int want_logits, struct model_ckpt *const *ck, const int *at, int n_ck,
                   struct error *err) {
    const struct config *c = &m->config;
    struct backend *be = m->be;
    struct model_seq *s = m->cur;
    if (n <= 0) return error_set(err, "empty prompt");
    if (s->pos + n > m->ctx)
        return error_set(err, "prompt of %d tokens does not fit the context: %d of %d positions "
                              "used", n, s->pos, m->ctx);
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= c->vocab_size)
            return error_set(err, "token id %d at prompt position %d is outside the vocabulary "
                                  "(%d)", ids[i], i, c->vocab_size);
    uint16_t *tmp = all_logits ? xmalloc((size_t)LOGITS_ROWS * c->vocab_size * 2) : NULL;
    int32_t *pos_ids = xmalloc((size_t)(m->max_T + 1) * sizeof *pos_ids);
    for (int i = 0; i < n_ck; i++) CHECK(at[i] > (i ? at[i - 1] : 0) && at[i] <= n);
    int next_ck = 0;
    for (int done = 0; done < n;) {
        int T = n - done < m->max_T ? n - done : m->max_T;
        /* riders (model_rows_ride) on the first call, which then takes at most max_T - R
         * tokens (a multiple of the snapshot alignment, so later calls' snapshots stay on it) */
        int R = 0;
        if (done == 0 && m->n_ride && !all_logits) {
            R = m->n_ride;
            if (T + R > m->max_T) T = (m->max_T - R) / be->snap_align * be->snap_align;
            if (T <= 0 || rows_upload(m, m->ride, m->ride_tok, R) < 0) R = 0, T = n < m->max_T ? n : m->max_T;
        }
        struct snaps sn = {0};
        for (; next_ck < n_ck && at[next_ck] <= done + T; next_ck++) {
            if (sn.n == BACKEND_MAX_SNAPS) { /* more than a call takes: end the call there */
                T = at[next_ck - 1] - done;
                break;
            }
            sn.t[sn.n] = at[next_ck] - done;
            sn.ck[sn.n++] = ck[next_ck];
            ck[next_ck]->pos = s->pos + sn.t[sn.n - 1];
            ck[next_ck]->has_logits = 0;
        }
        pos_ids[0] = s->pos; /* pos_dev[0], then ids: one copy */
        memcpy(pos_ids + 1, ids + done, (size_t)T * sizeof *pos_ids);
        be->ops->upload(be, m->pos_dev, pos_ids, (size_t)(T + 1) * sizeof *pos_ids);
        /* without all_logits only the riders' rows and the prompt's last row (row T - 1, or
         * row R after riders) leave the last layer */
        const int last_row = !all_logits && R && T > 1 ? R : R + T - 1;
        forward(m, T, &sn, R, !all_logits);
        /* a prompt that ends in this call with riders: its last row rides in their lm_head pass
         * (at row R of h), its logits copied from row R of the rows' logits */
        const int last_rides = R && want_logits && done + T == n;
        if (R) { /* as model_step_rows: the rows' logits, their positions */
            if (last_rides) {
                const size_t lrow = (size_t)c->vocab_size * 2;
                logits_of_rows(m, R + 1);
                be->ops->copy(be, m->logits, lrow, m->row_logits + (size_t)R * c->vocab_size, lrow, lrow, 1);
            } else {
                logits_of_rows(m, R);
            }
            rows_advance(m, m->ride, R);
            m->rode = R;
            m->n_ride = 0;
            m->n_mixed++;
        }
        if (all_logits) {
            for (int r = 0; r < T; r += LOGITS_ROWS) {
                int rows = T - r < LOGITS_ROWS ? T - r : LOGITS_ROWS;
                logits_rows(m, r, rows);
                be->ops->download(be, tmp, m->logits, (size_t)rows * c->vocab_size * 2);
                for (size_t i = 0; i < (size_t)rows * c->vocab_size; i++)
                    all_logits[(size_t)(done + r) * c->vocab_size + i] = bf16_to_f32(tmp[i]);
            }
        }
        s->pos += T;
        done += T;
        if (done == n && want_logits && !last_rides) logits_rows(m, last_row, 1);
    }
    free(tmp);
    free(pos_ids);
    m->choice = m->posted = 0;
    m->logits_pos = want_logits ? s->pos : -1;
    return 0;
}

void model_warm(struct model *m) {
    if (m->be->ops->warm) m->be->ops->warm(m->be);
}

int model_prefill(struct model *m, const int32_t *ids, int n, float *all_logits,
                  struct error *err) {
    return prefill(m, ids, n, all_logits, 1, NULL, NULL, 0, err);
}

int model_prefill_ckpt(struct model *m, const int32_t *ids, int n, struct model_ckpt *const *ck,
                       const int *at, int n_ck, struct error *err) {
    return prefill(m, ids, n, NULL, 1, ck, at, n_ck, err);
}

/* One decode step on the token in ids[0] at the position in pos_dev[0] (== m->cur->pos): the graph
 * ends with the argmax (sample: the sample op) that writes the choice to ids[0], advances
 * pos_dev[0] and posts it. */
static void step(struct model *m, int sample) {
    const struct config *c = &m->config;
    struct backend *be = m->be;
    const int variant = be->ops->graph_variant && be->ops->graph_variant(be, m->cur->pos);
    const int key = (variant ? GRAPH_STEP_LONG : GRAPH_STEP) + 2 * m->cur->index + (sample ? GRAPH_SAMPLE : 0);
    if (!be->ops->graph_replay(be, key)) {
        be->ops->graph_begin(be, key);
        forward(m, 1, NULL, 0, 0);
        logits_rows(m, 0, 1);
        if (sample)
            be->ops->sample(be, m->ids, m->logits, c->vocab_size, &m->cur->samp, m->pos_dev, 0);
        else
            be->ops->argmax(be, m->ids, m->logits, c->vocab_size, m->pos_dev);
        be->ops->graph_end(be, key);
    }
    m->cur->pos++;
    m->n_posts++;
    m->choice = sample ? CHOICE_SAMPLE : CHOICE_ARGMAX;
    m->posted = 1;
    m->logits_pos = m->cur->pos;
}

static void step_on(struct model *m, int32_t token, int sample) {
    const int32_t pos_token[2] = {m->cur->pos, token}; /* pos_dev[0], ids[0]: one copy */
    m->be->ops->upload(m->be, m->pos_dev, pos_token, sizeof pos_token);
    step(m, sample);
}

int model_step(struct model *m, int32_t token) {
    if (m->cur->pos >= m->ctx) return -1;
    CHECK(token >= 0 && token < m->config.vocab_size);
    step_on(m, token, 0);
    return 0;
}

int32_t model_step_greedy(struct model *m) {
    struct backend *be = m->be;
    if (m->cur->pos >= m->ctx) return -1;
    if (!m->posted || m->choice != CHOICE_ARGMAX) { /* no step posted a greedy choice yet (after
                                                        a prefill): the host reads it */
        int32_t id = model_argmax(m);
        return model_step(m, id) == 0 ? id : -1;
    }
    const int64_t post = m->n_posts; /* the last step's choice: in ids[0], its position too */
    step(m, 0);
    int32_t id = be->ops->choice_wait(be, post);
    CHECK(id >= 0 && id < m->config.vocab_size);
    return id;
}

int32_t model_argmax(struct model *m) {
    struct backend *be = m->be;
    if (m->choice != CHOICE_ARGMAX) {
        be->ops->argmax(be, m->ids, m->logits, m->config.vocab_size, NULL);
        m->choice = CHOICE_ARGMAX;
        m->posted = 0; /* ids[0] is no longer the last post */
    }
    int32_t id;
    be->ops->download(be, &id, m->ids, sizeof id);
    return id;
}

int model_sample_begin(struct model *m, const struct model_sampling *p, const int32_t *prompt, int n) {
    struct backend *be = m->be;
    const int V = m->config.vocab_size;
    const int topk_on = p->top_k > 0 && p->top_k < V;
    if (!be->ops->sample || V > BACKEND_SAMPLE_VMAX || !(p->temperature > 0.0f)) return 0;
    if (topk_on ? p->top_k > BACKEND_SAMPLE_KMAX : (p->top_p < 1.0f || p->min_p > 0.0f)) return 0;
    struct backend_sample_state *st = &m->cur->samp;
    if (!st->params) {
        st->params = be->ops->alloc(be, sizeof *st->params);
        st->bias = be->ops->alloc(be, (size_t)V * sizeof *st->bias);
        st->count = be->ops->alloc(be, (size_t)V * sizeof *st->count);
        st->in_prompt = be->ops->alloc(be, (size_t)V);
        st->mask = be->ops->alloc(be, ((size_t)V + 63) / 64 * sizeof *st->mask);
    }
    struct backend_sampling sp = {p->temperature, p->top_p, p->min_p, p->presence, p->frequency,
                                  p->repetition, topk_on ? p->top_k : 0, 0, p->seed};
    if (p->n_bias > 0) {
        float *bias = xcalloc((size_t)V, sizeof *bias);
        for (int i = 0; i < p->n_bias; i++)
            if (p->bias_ids[i] >= 0 && p->bias_ids[i] < V) bias[p->bias_ids[i]] += p->bias_values[i];
        be->ops->upload(be, st->bias, bias, (size_t)V * sizeof *bias);
        free(bias);
        sp.flags |= BACKEND_SAMPLE_BIAS;
    }
    if (p->presence != 0.0f || p->frequency != 0.0f || p->repetition != 1.0f) {
        sp.flags |= BACKEND_SAMPLE_PENALTIES;
        be->ops->zero(be, st->count, (size_t)V * sizeof *st->count);
        uint8_t *flag = xcalloc((size_t)V, 1);
        if (p->repetition != 1.0f)
            for (int i = 0; i < n; i++)
                if (prompt[i] >= 0 && prompt[i] < V) flag[prompt[i]] = 1;
        be->ops->upload(be, st->in_prompt, flag, (size_t)V);
        free(flag);
    }
    be->ops->upload(be, st->params, &sp, sizeof sp);
    m->cur->samp_host = sp;
    if (m->choice == CHOICE_SAMPLE) m->choice = m->posted = 0; /* drawn under other parameters */
    return 1;
}

void model_seq_sample_mask(struct model *m, struct model_seq *s, const uint64_t *mask) {
    struct backend *be = m->be;
    struct backend_sample_state *st = &s->samp;
    CHECK(st->params);
    const int on = mask != NULL;
    if (on) be->ops->upload(be, st->mask, mask, ((size_t)m->config.vocab_size + 63) / 64 * sizeof *mask);
    if (on != !!(s->samp_host.flags & BACKEND_SAMPLE_MASK)) {
        s->samp_host.flags ^= BACKEND_SAMPLE_MASK;
        be->ops->upload(be, st->params, &s->samp_host, sizeof s->samp_host);
    }
    if (s == m->cur && m->choice == CHOICE_SAMPLE) m->choice = m->posted = 0; /* drawn under another mask */
}

void model_sample_mask(struct model *m, const uint64_t *mask) { model_seq_sample_mask(m, m->cur, mask); }

int32_t model_sample(struct model *m) {
    struct backend *be = m->be;
    CHECK(m->cur->samp.params);
    if (m->choice != CHOICE_SAMPLE) {
        be->ops->sample(be, m->ids, m->logits, m->config.vocab_size, &m->cur->samp, NULL, m->cur->pos);
        m->choice = CHOICE_SAMPLE;
        m->posted = 0;
    }
    int32_t id;
    be->ops->download(be, &id, m->ids, sizeof id);
    return id;
}

int32_t model_step_sample(struct model *m) {
    if (m->cur->pos >= m->ctx) return -1;
    if (!m->posted || m->choice != CHOICE_SAMPLE) { /* no sampled step posted yet: the host reads it */
        const int32_t id = model_sample(m);
        step_on(m, id, 1);
        return id;
    }
    const int64_t post = m->n_posts;
    step(m, 1);
    const int32_t id = m->be->ops->choice_wait(m->be, post);
    CHECK(id >= 0 && id < m->config.vocab_size);
    return id;
}

/* ---------------------------------------------------------------------------------------------
 * batched decode */

/* The lm_head of rows 0..B-1 of m->h into the row logits. HF: lm_head(norm(hidden)) */
static void logits_of_rows(struct model *m, int B) {
    const struct config *c = &m->config;
    m->be->ops->matmul(m->be, m->row_logits, m->h, m->norm, m->lm_head, B, c->vocab_size,
                       c->hidden_size, 0);
}

/* forward() for B sequences at one token each (ids and positions in m->rows_dev): the
 * projections and the MLP as matmuls over the B rows (one pass over the weights), the mixers
 * row by row on each sequence's own state. */
static void forward_rows(struct model *m, int B) {
    const struct config *c = &m->config;
    struct backend *be = m->be;
    const struct backend_ops *op = be->ops;
    const int H = c->hidden_size, I = c->intermediate_size;
    const int nH = c->num_attention_heads, nKV = c->num_key_value_heads, hd = c->head_dim;
    const struct rows_host *rd = m->rows_dev;
    const struct backend_rows rows = {rd->pos, rd->kv, rd->gdn};
    const size_t kv_bytes = kv_cache_bytes(m);
    op->embed(be, m->h, m->embed_tokens, rd->ids, B);
    for (int l = 0; l < c->num_hidden_layers; l++) {
        struct layer *L = &m->layers[l];
        if (L->type == LAYER_FULL_ATTENTION) {
            const size_t k_off = (size_t)L->full_index * 2 * kv_bytes;
            op->matmul(be, m->proj, m->h, L->input_layernorm, L->w_mix, B,
                       2 * nH * hd + 2 * nKV * hd, H, 0);
            op->attention_rows(be, m->mix, m->proj, L->q_norm, L->k_norm, &rows, k_off,
                               k_off + kv_bytes, B);
            op->matmul(be, m->h, m->mix, NULL, L->w_out, B, H, nH * hd, 1);
        } else {
            const size_t state_off = (size_t)L->linear_index * m->gdn_state_bytes;
            const size_t conv_off = (size_t)c->n_linear_layers * m->gdn_state_bytes +
                                    (size_t)L->linear_index * m->gdn_conv_bytes;
            op->matmul(be, m->proj, m->h, L->input_layernorm, L->w_mix, B,
                       c->conv_dim + c->value_dim + 2 * c->linear_num_value_heads, H, 0);
            op->gdn_rows(be, m->mix, m->proj, L->conv_w, L->A_log, L->dt_bias, L->norm_w, &rows,
                         state_off, conv_off, B);
            op->matmul(be, m->h, m->mix, NULL, L->w_out, B, H, c->value_dim, 1);
        }
        op->matmul_swiglu(be, m->mlp, m->h, L->post_attention_layernorm, L->w_gate_up, B, I, H);
        op->matmul(be, m->h, m->mlp, NULL, L->w_down, B, H, I, 1);
    }
    logits_of_rows(m, B);
}

/* The rows' positions, ids and blocks to m->rows_dev (one copy); the largest position, or -1
 * when a sequence's context is full (nothing uploaded). */
static int rows_upload(struct model *m, struct model_seq *const *seqs, const int32_t *tokens, int B) {
    struct backend *be = m->be;
    CHECK(B >= 1 && B <= MODEL_MAX_BATCH && B <= m->max_T);
    struct rows_host host;
    memset(&host, 0, sizeof host);
    int max_pos = 0;
    for (int b = 0; b < B; b++) {
        if (seqs[b]->pos >= m->ctx) return -1;
        CHECK(tokens[b] >= 0 && tokens[b] < m->config.vocab_size);
        CHECK(seqs[b] != m->cur || !m->n_ride); /* riders are other sequences than the prompt's */
        for (int j = 0; j < b; j++) CHECK(seqs[j] != seqs[b]);
        host.pos[b] = seqs[b]->pos;
        host.ids[b] = tokens[b];
        host.kv[b] = seqs[b]->kv_block;
        host.gdn[b] = seqs[b]->gdn_block;
        if (seqs[b]->pos > max_pos) max_pos = seqs[b]->pos;
    }
    be->ops->upload(be, m->rows_dev, &host, sizeof host);
    return max_pos;
}

/* After the rows' forward: their positions advance, and row b's logits are theirs. */
static void rows_advance(struct model *m, struct model_seq *const *seqs, int B) {
    for (int b = 0; b < B; b++) {
        seqs[b]->pos++;
        if (seqs[b] == m->cur) m->choice = m->posted = 0, m->logits_pos = -1; /* its logits: row b */
    }
    m->n_rows = B;
}

/* The graph of B rows, their positions, ids and blocks uploaded (rows_dev: any B sequences) */
static void rows_run(struct model *m, struct model_seq *const *seqs, int B, int max_pos) {
    struct backend *be = m->be;
    const int variant = be->ops->graph_variant && be->ops->graph_variant(be, max_pos);
    const int key = GRAPH_ROWS + 2 * B + variant;
    if (!be->ops->graph_replay(be, key)) {
        be->ops->graph_begin(be, key);
        forward_rows(m, B);
        be->ops->graph_end(be, key);
    }
    rows_advance(m, seqs, B);
}

int model_step_rows(struct model *m, struct model_seq *const *seqs, const int32_t *tokens, int B) {
    const int max_pos = rows_upload(m, seqs, tokens, B);
    if (max_pos < 0) return -1;
    rows_run(m, seqs, B, max_pos);
    return 0;
}

int model_step_rows_from(struct model *m, struct model_seq *const *seqs, const int32_t *tokens,
                         const int *from, int B) {
    struct backend *be = m->be;
    int32_t toks[MODEL_MAX_BATCH];
    CHECK(B >= 1 && B <= MODEL_MAX_BATCH);
    for (int b = 0; b < B; b++) {
        CHECK(from[b] < m->n_rows);
        toks[b] = from[b] >= 0 ? 0 : tokens[b]; /* 0: a place the choice is copied to */
    }
    const int max_pos = rows_upload(m, seqs, toks, B);
    if (max_pos < 0) return -1;
    /* the choices into the uploaded ids, queued behind the upload: a copy a run of rows */
    int32_t *ids_dev = (int32_t *)((char *)m->rows_dev + offsetof(struct rows_host, ids));
    for (int b = 0; b < B;) {
        if (from[b] < 0) {
            b++;
            continue;
        }
        int e = b + 1;
        while (e < B && from[e] == from[e - 1] + 1) e++;
        be->ops->copy(be, ids_dev + b, 0, m->row_choice + from[b], 0, (size_t)(e - b) * sizeof *ids_dev, 1);
        b = e;
    }
    rows_run(m, seqs, B, max_pos);
    return 0;
}

void model_rows_ride(struct model *m, struct model_seq *const *seqs, const int32_t *tokens, int B) {
    CHECK(B >= 0 && B <= MODEL_MAX_BATCH);
    for (int b = 0; b < B; b++) m->ride[b] = seqs[b], m->ride_tok[b] = tokens[b];
    m->n_ride = B;
    m->rode = 0;
}

long model_n_mixed(const struct model *m) { return m->n_mixed; }

int model_rows_rode(struct model *m) {
    const int r = m->rode;
    m->n_ride = m->rode = 0;
    return r;
}

static const uint16_t *row_logits(const struct model *m, int b) {
    CHECK(b >= 0 && b < m->n_rows);
    return m->row_logits + (size_t)b * m->config.vocab_size;
}

void model_rows_argmax(struct model *m, int B) {
    CHECK(B >= 1 && B <= m->n_rows);
    m->be->ops->argmax_rows(m->be, m->row_choice, m->row_logits, m->config.vocab_size, B);
}

void model_row_sample(struct model *m, int b, struct model_seq *s) {
    CHECK(s->samp.params);
    m->be->ops->sample(m->be, m->row_choice + b, row_logits(m, b), m->config.vocab_size, &s->samp,
                       NULL, s->pos);
}

void model_row_choices(struct model *m, int B, int32_t *out) {
    CHECK(B >= 1 && B <= m->n_rows);
    m->be->ops->download(m->be, out, m->row_choice, (size_t)B * sizeof *out);
}

int64_t model_rows_post(struct model *m, int B) {
    struct backend *be = m->be;
    CHECK(B >= 1 && B <= m->n_rows && B <= BACKEND_ROWS_MAX);
    if (be->ops->rows_post) return be->ops->rows_post(be, m->row_choice, B);
    const int64_t n = ++m->n_row_posts; /* a backend without the op: read now */
    be->ops->download(be, m->row_post[n % 2], m->row_choice, (size_t)B * sizeof(int32_t));
    return n;
}

void model_rows_wait(struct model *m, int64_t n, int B, int32_t *out) {
    struct backend *be = m->be;
    if (be->ops->rows_wait) {
        be->ops->rows_wait(be, n, out, B);
        return;
    }
    CHECK(n >= 1 && n <= m->n_row_posts && n >= m->n_row_posts - 1 && B >= 1 && B <= MODEL_MAX_BATCH);
    memcpy(out, m->row_post[n % 2], (size_t)B * sizeof *out);
}

void model_row_logits(struct model *m, int b, float *out) {
    const int V = m->config.vocab_size;
    uint16_t *tmp = xmalloc((size_t)V * 2);
    m->be->ops->download(m->be, tmp, row_logits(m, b), (size_t)V * 2);
    for (int i = 0; i < V; i++) out[i] = bf16_to_f32(tmp[i]);
    free(tmp);
}

static int logprobs_of(struct model *m, const uint16_t *x, int k, int32_t chosen, float *lse,
                       float *chosen_logit, int32_t *top_ids, float *top_logits);

int model_row_logprobs(struct model *m, int b, int k, int32_t chosen, float *lse,
                       float *chosen_logit, int32_t *top_ids, float *top_logits) {
    return logprobs_of(m, row_logits(m, b), k, chosen, lse, chosen_logit, top_ids, top_logits);
}

int model_logprobs(struct model *m, int k, int32_t chosen, float *lse, float *chosen_logit,
                   int32_t *top_ids, float *top_logits) {
    return logprobs_of(m, m->logits, k, chosen, lse, chosen_logit, top_ids, top_logits);
}

static int logprobs_of(struct model *m, const uint16_t *x, int k, int32_t chosen, float *lse,
                       float *chosen_logit, int32_t *top_ids, float *top_logits) {
    struct backend *be = m->be;
    if (!be->ops->logprobs) return -1;
    CHECK(k >= 0 && k <= BACKEND_LOGPROBS_KMAX && chosen >= 0 && chosen < m->config.vocab_size);
    if (!m->lp_out) {
        m->lp_out = be->ops->alloc(be, (2 + 2 * BACKEND_LOGPROBS_KMAX) * sizeof(float));
        m->lp_chosen = be->ops->alloc(be, sizeof(int32_t));
    }
    be->ops->upload(be, m->lp_chosen, &chosen, sizeof chosen);
    be->ops->logprobs(be, m->lp_out, x, m->config.vocab_size, k, m->lp_chosen);
    float out[2 + 2 * BACKEND_LOGPROBS_KMAX];
    be->ops->download(be, out, m->lp_out, (2 + 2 * (size_t)k) * sizeof(float));
    *lse = out[0];
    *chosen_logit = out[1];
    for (int j = 0; j < k; j++) {
        top_logits[j] = out[2 + j];
        memcpy(&top_ids[j], &out[2 + k + j], sizeof top_ids[j]);
    }
    return 0;
}

void model_logits(struct model *m, float *out) {
    int V = m->config.vocab_size;
    uint16_t *tmp = xmalloc((size_t)V * 2);
    m->be->ops->download(m->be, tmp, m->logits, (size_t)V * 2);
    for (int i = 0; i < V; i++) out[i] = bf16_to_f32(tmp[i]);
    free(tmp);
}

void model_gdn_state(struct model *m, int layer, float *conv, float *recurrent) {
    const struct config *c = &m->config;
    CHECK(layer >= 0 && layer < c->num_hidden_layers);
    CHECK(m->layers[layer].type == LAYER_LINEAR_ATTENTION);
    const struct seq_layer *L = &m->cur->l[layer];
    struct backend *be = m->be;
    if (conv) { /* the ring (column q % K holds position q) read oldest first */
        int K = c->linear_conv_kernel_dim;
        size_t n = (size_t)c->conv_dim * K;
        uint16_t *tmp = xmalloc(n * 2);
        be->ops->download(be, tmp, L->conv_state, n * 2);
        for (size_t ch = 0; ch < (size_t)c->conv_dim; ch++)
            for (int j = 0; j < K; j++) conv[ch * K + j] = bf16_to_f32(tmp[ch * K + (m->cur->pos + j) % K]);
        free(tmp);
    }
    if (recurrent)
        be->ops->download(be, recurrent, L->state, (size_t)c->linear_num_value_heads *
                                                       c->linear_key_head_dim *
                                                       c->linear_value_head_dim * sizeof(float));
}
