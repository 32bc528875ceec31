/* safetensors.c - mmap'd, strictly validated reader for Hugging Face safetensors checkpoints.
 *
 * Format (huggingface/safetensors README): an 8-byte little-endian header length N, N bytes of
 * UTF-8 JSON starting with '{' ({name: {dtype, shape, data_offsets: [begin, end]}, optional
 * "__metadata__": {string: string}}), then the byte buffer the offsets point into.
 * What we check, each failure naming the file and the tensor with expected vs found:
 *   - 2 <= N <= file size - 8, N <= 100 MiB (the reference implementation's limit);
 *   - strict JSON (jansson, duplicate keys rejected, nothing after the object but whitespace);
 *   - every entry: a known dtype, a shape of at most ST_MAX_DIMS non-negative integers,
 *     data_offsets [begin, end] with begin <= end <= buffer size, and
 *     product(shape) x dtype size == end - begin (computed with overflow checks);
 *   - holes: the spec says "the byte buffer needs to be entirely indexed, and cannot contain
 *     holes" (it prevents polyglot files). We follow it: sorted by offset, the tensors must tile
 *     the buffer exactly, so overlaps, gaps and trailing bytes are all errors;
 *   - alignment: each tensor's data must sit at a file offset that is a multiple of its dtype
 *     size. The reference writer always produces this (8-byte header padding, tensors sorted by
 *     alignment); we require it so that consumers can read bf16/f32 through typed pointers.
 * A directory holds model.safetensors (preferred, as transformers does) or
 * model.safetensors.index.json whose "weight_map" maps tensor names to shard files; each shard
 * is opened once, shard names may not leave the directory, each indexed tensor must be in the
 * shard the index names, every tensor in a shard must be indexed, and a name may not appear in
 * two shards. Tensors end up sorted by name for safetensors_find's binary search.
 * Nothing here knows about models; model.c decides which tensors it needs. */
#include "safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define ST_MAX_HEADER_BYTES (100ull << 20)

static const struct {
    const char *name;
    size_t size;
} st_dtypes[ST_N_DTYPES] = {
    [ST_BOOL] = {"BOOL", 1},   [ST_U8] = {"U8", 1},     [ST_I8] = {"I8", 1},
    [ST_I16] = {"I16", 2},     [ST_U16] = {"U16", 2},   [ST_F16] = {"F16", 2},
    [ST_BF16] = {"BF16", 2},   [ST_I32] = {"I32", 4},   [ST_U32] = {"U32", 4},
    [ST_F32] = {"F32", 4},     [ST_F64] = {"F64", 8},   [ST_I64] = {"I64", 8},
    [ST_U64] = {"U64", 8},     [ST_F8_E4M3] = {"F8_E4M3", 1}, [ST_F8_E5M2] = {"F8_E5M2", 1},
};

const char *st_dtype_name(enum st_dtype d) {
    CHECK((unsigned)d < ST_N_DTYPES);
    return st_dtypes[d].name;
}

size_t st_dtype_size(enum st_dtype d) {
    CHECK((unsigned)d < ST_N_DTYPES);
    return st_dtypes[d].size;
}

/* "[32, 16]" into buf. */
static const char *shape_str(const int64_t *shape, int ndim, char *buf, size_t n) {
    size_t k = 0;
    k += (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < ndim && k < n; i++)
        k += (size_t)snprintf(buf + k, n - k, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (k < n) snprintf(buf + k, n - k, "]");
    return buf;
}

static const char *json_kind(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a real number";
    case JSON_TRUE: case JSON_FALSE: return "a boolean";
    default: return "null";
    }
}

/* Maps `path` as file number st->n_files. */
static int st_map(struct safetensors *st, const char *path, struct error *err) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return error_set(err, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return error_set(err, "%s: not a regular file", path);
    }
    size_t size = (size_t)sb.st_size;
    void *map = NULL;
    if (size > 0) {
        map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map == MAP_FAILED) {
            int e = errno;
            close(fd);
            return error_set(err, "%s: cannot mmap %zu bytes: %s", path, size, strerror(e));
        }
    }
    close(fd);
    st->files = xrealloc(st->files, sizeof *st->files * (size_t)(st->n_files + 1));
    st->files[st->n_files++] = (struct st_file){xstrdup(path), map, size};
    return 0;
}

struct span {
    uint64_t begin, end;
    const char *name;
};

static int span_cmp(const void *a, const void *b) {
    const struct span *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

/* By name, then by file, so that a duplicate is reported in file order. */
static int tensor_cmp(const void *a, const void *b) {
    const struct st_tensor *x = a, *y = b;
    int c = strcmp(x->name, y->name);
    return c ? c : (x->file > y->file) - (x->file < y->file);
}

/* One header entry into *t (name not yet set). */
static int st_entry(const char *path, const char *name, const json_t *v, uint64_t data_size,
                    uint64_t data_start, struct st_tensor *t, struct span *sp, struct error *err) {
    char sh[256];
    if (!json_is_object(v))
        return error_set(err, "%s: tensor %s: expected an object {dtype, shape, data_offsets}, "
                         "found %s", path, name, json_kind(v));
    const json_t *dt = json_object_get(v, "dtype");
    const json_t *shape = json_object_get(v, "shape");
    const json_t *offs = json_object_get(v, "data_offsets");
    if (!dt || !shape || !offs)
        return error_set(err, "%s: tensor %s: missing \"%s\"", path, name,
                         !dt ? "dtype" : !shape ? "shape" : "data_offsets");
    if (!json_is_string(dt))
        return error_set(err, "%s: tensor %s: dtype: expected a string, found %s", path, name,
                         json_kind(dt));
    int d = -1;
    for (int i = 0; i < ST_N_DTYPES; i++)
        if (!strcmp(json_string_value(dt), st_dtypes[i].name)) d = i;
    if (d < 0)
        return error_set(err, "%s: tensor %s: unknown dtype \"%.32s\" (expected one of BOOL, U8, "
                         "I8, I16, U16, F16, BF16, I32, U32, F32, F64, I64, U64, F8_E4M3, "
                         "F8_E5M2)", path, name, json_string_value(dt));
    t->dtype = (enum st_dtype)d;

    if (!json_is_array(shape))
        return error_set(err, "%s: tensor %s: shape: expected a list of integers, found %s",
                         path, name, json_kind(shape));
    if (json_array_size(shape) > ST_MAX_DIMS)
        return error_set(err, "%s: tensor %s: shape has %zu dimensions, at most %d supported",
                         path, name, json_array_size(shape), ST_MAX_DIMS);
    t->ndim = (int)json_array_size(shape);
    uint64_t count = 1;
    int overflow = 0;
    for (int i = 0; i < t->ndim; i++) {
        const json_t *e = json_array_get(shape, (size_t)i);
        if (!json_is_integer(e) || json_integer_value(e) < 0)
            return error_set(err, "%s: tensor %s: shape[%d]: expected an integer >= 0, found %s",
                             path, name, i, json_is_integer(e) ? "a negative integer"
                                                               : json_kind(e));
        t->shape[i] = json_integer_value(e);
        overflow |= __builtin_mul_overflow(count, (uint64_t)t->shape[i], &count);
    }
    uint64_t need;
    overflow |= __builtin_mul_overflow(count, (uint64_t)st_dtypes[d].size, &need);
    shape_str(t->shape, t->ndim, sh, sizeof sh);

    if (!json_is_array(offs) || json_array_size(offs) != 2 ||
        !json_is_integer(json_array_get(offs, 0)) || !json_is_integer(json_array_get(offs, 1)) ||
        json_integer_value(json_array_get(offs, 0)) < 0 ||
        json_integer_value(json_array_get(offs, 1)) < 0)
        return error_set(err, "%s: tensor %s: data_offsets: expected [begin, end] (two integers "
                         ">= 0), found %s", path, name,
                         json_is_array(offs) ? "another list" : json_kind(offs));
    uint64_t b = (uint64_t)json_integer_value(json_array_get(offs, 0));
    uint64_t e = (uint64_t)json_integer_value(json_array_get(offs, 1));
    if (b > e)
        return error_set(err, "%s: tensor %s: data_offsets [%llu, %llu]: begin is after end",
                         path, name, (unsigned long long)b, (unsigned long long)e);
    if (e > data_size)
        return error_set(err, "%s: tensor %s: data_offsets [%llu, %llu] run past the end of the "
                         "data (%llu bytes after the header; truncated file?)", path, name,
                         (unsigned long long)b, (unsigned long long)e,
                         (unsigned long long)data_size);
    if (overflow)
        return error_set(err, "%s: tensor %s: shape %s %s overflows a 64-bit byte count", path,
                         name, sh, st_dtypes[d].name);
    if (need != e - b)
        return error_set(err, "%s: tensor %s: shape %s %s needs %llu bytes, but data_offsets "
                         "[%llu, %llu] hold %llu", path, name, sh, st_dtypes[d].name,
                         (unsigned long long)need, (unsigned long long)b, (unsigned long long)e,
                         (unsigned long long)(e - b));
    if (need && (data_start + b) % st_dtypes[d].size) /* an empty tensor reads nothing */
        return error_set(err, "%s: tensor %s: data at file offset %llu is not aligned to its "
                         "%zu-byte dtype %s", path, name, (unsigned long long)(data_start + b),
                         st_dtypes[d].size, st_dtypes[d].name);
    t->nbytes = (size_t)need;
    sp->begin = b;
    sp->end = e;
    return 0;
}

/* Parses the header of file number fi and appends its tensors to st->tensors. */
static int st_parse(struct safetensors *st, int fi, struct error *err) {
    const struct st_file *f = &st->files[fi];
    const char *path = f->path;
    const unsigned char *p = f->map;
    json_t *root = NULL;
    struct span *spans = NULL;
    int first = st->n_tensors, n_spans = 0;

    if (f->size < 8)
        return error_set(err, "%s: file is %zu bytes, too short for the 8-byte header length "
                         "(truncated file?)", path, f->size);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = n << 8 | p[i];
    if (n < 2)
        return error_set(err, "%s: header length %llu is too small (expected at least 2, \"{}\")",
                         path, (unsigned long long)n);
    if (n > f->size - 8)
        return error_set(err, "%s: header length %llu runs past the end of the file (%zu bytes, "
                         "so at most %zu are available for the header; truncated file?)", path,
                         (unsigned long long)n, f->size, f->size - 8);
    if (n > ST_MAX_HEADER_BYTES)
        return error_set(err, "%s: header length %llu exceeds the 100 MiB limit", path,
                         (unsigned long long)n);
    if (p[8] != '{')
        return error_set(err, "%s: header must start with '{', found byte 0x%02x", path, p[8]);
    json_error_t jerr;
    root = json_loadb((const char *)p + 8, (size_t)n, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return error_set(err, "%s: header is not valid JSON (at byte %d of %llu: %s)", path,
                         jerr.position, (unsigned long long)n, jerr.text);
    if (!json_is_object(root)) {
        error_set(err, "%s: header: expected a JSON object, found %s", path, json_kind(root));
        goto fail;
    }

    uint64_t data_start = 8 + n, data_size = f->size - 8 - n;
    const unsigned char *data = p + data_start;
    size_t n_entries = json_object_size(root);
    spans = xcalloc(n_entries ? n_entries : 1, sizeof *spans);
    st->tensors = xrealloc(st->tensors, sizeof *st->tensors * (st->n_tensors + n_entries + 1));

    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        if (!strcmp(key, "__metadata__")) {
            const char *mk;
            json_t *mv;
            if (!json_is_object(v)) {
                error_set(err, "%s: __metadata__: expected an object of strings, found %s", path,
                          json_kind(v));
                goto fail;
            }
            json_object_foreach(v, mk, mv) {
                if (!json_is_string(mv)) {
                    error_set(err, "%s: __metadata__[\"%.64s\"]: expected a string, found %s",
                              path, mk, json_kind(mv));
                    goto fail;
                }
            }
            if (!st->metadata_json) st->metadata_json = json_dumps(v, JSON_COMPACT);
            continue;
        }
        struct st_tensor *t = &st->tensors[st->n_tensors];
        memset(t, 0, sizeof *t);
        if (st_entry(path, key, v, data_size, data_start, t, &spans[n_spans], err)) goto fail;
        t->name = xstrdup(key);
        t->file = fi;
        t->data = data + spans[n_spans].begin;
        spans[n_spans].name = t->name;
        st->n_tensors++;
        n_spans++;
    }

    /* No overlaps and no holes: sorted by offset, each tensor starts where the last ended. */
    qsort(spans, (size_t)n_spans, sizeof *spans, span_cmp);
    uint64_t pos = 0;
    for (int i = 0; i < n_spans; i++) {
        if (spans[i].begin < pos) {
            error_set(err, "%s: tensor %s: data_offsets [%llu, %llu] overlap tensor %s [%llu, "
                      "%llu]", path, spans[i].name, (unsigned long long)spans[i].begin,
                      (unsigned long long)spans[i].end, spans[i - 1].name,
                      (unsigned long long)spans[i - 1].begin, (unsigned long long)spans[i - 1].end);
            goto fail;
        }
        if (spans[i].begin > pos) {
            error_set(err, "%s: tensor %s: data_offsets [%llu, %llu] leave a hole: bytes [%llu, "
                      "%llu) belong to no tensor (the format requires the tensors to cover the "
                      "data exactly)", path, spans[i].name, (unsigned long long)spans[i].begin,
                      (unsigned long long)spans[i].end, (unsigned long long)pos,
                      (unsigned long long)spans[i].begin);
            goto fail;
        }
        pos = spans[i].end;
    }
    if (pos != data_size) {
        error_set(err, "%s: %llu bytes of data after the last tensor (tensors end at %llu, the "
                  "data is %llu bytes; the format allows no holes)", path,
                  (unsigned long long)(data_size - pos), (unsigned long long)pos,
                  (unsigned long long)data_size);
        goto fail;
    }
    free(spans);
    json_decref(root);
    return 0;
fail:
    /* tensors appended by this call are freed here; earlier ones belong to the caller */
    for (int i = first; i < st->n_tensors; i++) free(st->tensors[i].name);
    st->n_tensors = first;
    free(spans);
    json_decref(root);
    return -1;
}

/* Sorts by name and rejects a name seen twice (possible only across files). */
static int st_finish(struct safetensors *st, struct error *err) {
    if (st->n_tensors > 1) qsort(st->tensors, (size_t)st->n_tensors, sizeof *st->tensors,
                                 tensor_cmp);
    for (int i = 1; i < st->n_tensors; i++)
        if (!strcmp(st->tensors[i - 1].name, st->tensors[i].name))
            return error_set(err, "tensor %s appears twice: in %s and in %s", st->tensors[i].name,
                             st->files[st->tensors[i - 1].file].path,
                             st->files[st->tensors[i].file].path);
    return 0;
}

int safetensors_open_file(struct safetensors *st, const char *path, struct error *err) {
    memset(st, 0, sizeof *st);
    if (st_map(st, path, err) || st_parse(st, 0, err) || st_finish(st, err)) goto fail;
    return 0;
fail:
    safetensors_close(st);
    return -1;
}

static int path_exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0;
}

static char *path_join(const char *dir, const char *name) {
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = xmalloc(n);
    snprintf(p, n, "%s/%s", dir, name);
    return p;
}

/* A shard name must stay inside the checkpoint directory. */
static int shard_name_ok(const char *s) {
    if (!*s || *s == '/' || strchr(s, '\\')) return 0;
    for (const char *c = s; *c;) {
        size_t len = strcspn(c, "/");
        if (len == 0 || (len == 2 && c[0] == '.' && c[1] == '.')) return 0;
        c += len;
        if (*c == '/') c++;
    }
    return 1;
}

static int str_cmp(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static int st_open_index(struct safetensors *st, const char *dir, const char *index_path,
                         struct error *err) {
    size_t len;
    json_error_t jerr;
    json_t *root = NULL;
    const char **shards = NULL;
    char *text = read_file(index_path, &len, err);
    if (!text) return -1;
    root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        error_set(err, "%s: malformed JSON at line %d, column %d: %s", index_path, jerr.line,
                  jerr.column, jerr.text);
        goto fail;
    }
    const json_t *wm = json_is_object(root) ? json_object_get(root, "weight_map") : NULL;
    if (!json_is_object(wm) || json_object_size(wm) == 0) {
        error_set(err, "%s: expected an object with a non-empty \"weight_map\" {tensor name: "
                  "shard file}", index_path);
        goto fail;
    }

    /* the distinct shard names, each checked, sorted */
    size_t n_names = json_object_size(wm), n_shards = 0;
    shards = xmalloc(sizeof *shards * n_names);
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)wm, key, v) {
        if (!json_is_string(v)) {
            error_set(err, "%s: tensor %s: expected a shard file name, found %s", index_path, key,
                      json_kind(v));
            goto fail;
        }
        if (!shard_name_ok(json_string_value(v))) {
            error_set(err, "%s: tensor %s: shard name \"%.200s\" is not a file inside the "
                      "checkpoint directory", index_path, key, json_string_value(v));
            goto fail;
        }
        shards[n_shards++] = json_string_value(v);
    }
    qsort(shards, n_shards, sizeof *shards, str_cmp);
    size_t u = 0;
    for (size_t i = 0; i < n_shards; i++)
        if (u == 0 || strcmp(shards[u - 1], shards[i])) shards[u++] = shards[i];
    n_shards = u;

    for (size_t i = 0; i < n_shards; i++) {
        char *path = path_join(dir, shards[i]);
        struct error e2;
        if (st_map(st, path, &e2)) {
            /* name one tensor the index puts there, so the message says what is missing */
            const char *who = "";
            json_object_foreach((json_t *)wm, key, v) {
                if (!strcmp(json_string_value(v), shards[i])) {
                    who = key;
                    break;
                }
            }
            error_set(err, "%s: tensor %s: shard \"%s\" is missing or unreadable (%s)",
                      index_path, who, shards[i], e2.msg);
            free(path);
            goto fail;
        }
        free(path);
        if (st_parse(st, st->n_files - 1, err)) goto fail;
    }
    if (st_finish(st, err)) goto fail;

    /* index and shards must agree both ways */
    json_object_foreach((json_t *)wm, key, v) {
        const struct st_tensor *t = safetensors_find(st, key);
        char *want = path_join(dir, json_string_value(v));
        if (!t) {
            error_set(err, "%s: tensor %s: listed in the index under shard \"%s\", but %s does not "
                      "contain it", index_path, key, json_string_value(v), want);
            free(want);
            goto fail;
        }
        if (strcmp(st->files[t->file].path, want)) {
            error_set(err, "%s: tensor %s: the index says shard %s, but it is in %s", index_path,
                      key, want, st->files[t->file].path);
            free(want);
            goto fail;
        }
        free(want);
    }
    for (int i = 0; i < st->n_tensors; i++)
        if (!json_object_get(wm, st->tensors[i].name)) {
            error_set(err, "%s: tensor %s: in this shard but not listed in %s",
                      st->files[st->tensors[i].file].path, st->tensors[i].name, index_path);
            goto fail;
        }
    free(shards);
    free(text);
    json_decref(root);
    return 0;
fail:
    free(shards);
    free(text);
    json_decref(root);
    return -1;
}

int safetensors_open_dir(struct safetensors *st, const char *dir, struct error *err) {
    memset(st, 0, sizeof *st);
    char *single = path_join(dir, "model.safetensors");
    char *index = path_join(dir, "model.safetensors.index.json");
    int rc = -1;
    if (path_exists(single)) {
        if (st_map(st, single, err) || st_parse(st, 0, err) || st_finish(st, err)) goto done;
    } else if (path_exists(index)) {
        if (st_open_index(st, dir, index, err)) goto done;
    } else {
        error_set(err, "%s: no model.safetensors or model.safetensors.index.json", dir);
        goto done;
    }
    rc = 0;
done:
    if (rc) safetensors_close(st);
    free(single);
    free(index);
    return rc;
}

void safetensors_close(struct safetensors *st) {
    for (int i = 0; i < st->n_tensors; i++) free(st->tensors[i].name);
    for (int i = 0; i < st->n_files; i++) {
        if (st->files[i].map) munmap(st->files[i].map, st->files[i].size);
        free(st->files[i].path);
    }
    free(st->tensors);
    free(st->files);
    free(st->metadata_json);
    memset(st, 0, sizeof *st);
}

const struct st_tensor *safetensors_find(const struct safetensors *st, const char *name) {
    int lo = 0, hi = st->n_tensors - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        int c = strcmp(st->tensors[mid].name, name);
        if (c == 0) return &st->tensors[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return NULL;
}
