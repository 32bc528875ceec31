/* safetensors.h - read-only, mmap'd access to Hugging Face safetensors checkpoints.
 * A directory holds either model.safetensors or model.safetensors.index.json plus its shards.
 * Headers are validated strictly (sizes, offsets inside the file, no overlaps, known dtypes,
 * shape x dtype == byte length) and every failure names the file and the tensor. */
#ifndef STRATA_SAFETENSORS_H
#define STRATA_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "util.h"

enum st_dtype { ST_BOOL, ST_U8, ST_I8, ST_I16, ST_U16, ST_F16, ST_BF16, ST_I32, ST_U32, ST_F32,
                ST_F64, ST_I64, ST_U64, ST_F8_E4M3, ST_F8_E5M2, ST_N_DTYPES };

#define ST_MAX_DIMS 8

struct st_tensor {
    char *name;
    enum st_dtype dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    const void *data; /* into the mmap */
    size_t nbytes;
    int file;         /* index into safetensors.files */
};

struct st_file {
    char *path;
    void *map;
    size_t size;
};

struct safetensors {
    struct st_file *files;
    int n_files;
    struct st_tensor *tensors; /* sorted by name */
    int n_tensors;
    char *metadata_json; /* the "__metadata__" object of the first file as JSON text, or NULL */
};

/* Opens every file of the checkpoint in `dir`. */
int safetensors_open_dir(struct safetensors *st, const char *dir, struct error *err);
/* Opens one .safetensors file. */
int safetensors_open_file(struct safetensors *st, const char *path, struct error *err);
void safetensors_close(struct safetensors *st);

const struct st_tensor *safetensors_find(const struct safetensors *st, const char *name);
const char *st_dtype_name(enum st_dtype d);
size_t st_dtype_size(enum st_dtype d);

#endif
