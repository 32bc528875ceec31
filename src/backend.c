/* backend.c - what the backend interface needs outside any one backend: the CUDA entry point of a
 * build without CUDA kernels. */
#include "backend.h"

#ifndef STRATA_CUDA
struct backend *backend_cuda_create(const struct config *c, int max_ctx, int max_T,
                                    struct error *err) {
    (void)c, (void)max_ctx, (void)max_T;
    error_set(err, "this strata was built without CUDA (nvcc not found at build time)");
    return NULL;
}
#endif
