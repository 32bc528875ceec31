/* backend.c - what the backend interface needs outside any one backend: the CUDA entry points
 * a build without CUDA kernels still links (test_cuda, which then skips). */
#include "backend.h"

#ifndef STRATA_CUDA
#include "model/cuda/cuda.h"

struct backend *backend_cuda_create(const struct config *c, int max_ctx, int max_T,
                                    struct error *err) {
    (void)c, (void)max_ctx, (void)max_T;
    error_set(err, "this strata was built without CUDA (nvcc not found at build time)");
    return NULL;
}
void backend_cuda_test_knobs(struct backend *be, const struct cuda_test_knobs *k) {
    (void)be, (void)k;
}
long backend_cuda_gemm_picks(struct backend *be) {
    (void)be;
    return 0;
}
int backend_cuda_residency(struct backend *be, char *buf, size_t cap) {
    (void)be, (void)buf, (void)cap;
    return 0;
}
#endif
