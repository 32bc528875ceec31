/* kernel_trace.c - every kernel's start and end on the GPU, as it ran in the real program (its
 * stream, programmatic dependent launch and graphs included), for the device machine, where
 * Nsight Systems cannot make a report. A CUDA injection library: the driver loads it when
 * CUDA_INJECTION64_PATH names it and calls InitializeInjection(), which turns on CUPTI's kernel
 * activity records; at exit they go to $KTRACE_OUT (default ktrace.csv) as
 *   start_ns,end_ns,graph_id,graph_node,grid,block,registers,name
 * and bench/ktrace.py splits them into phases and sums each kernel's time.
 *
 *   cc -std=c11 -O2 -shared -fPIC -I/usr/local/cuda/include -o libkernel_trace.so \
 *       bench/kernel_trace.c -L/usr/local/cuda/lib -lcupti -lstdc++
 *   CUDA_INJECTION64_PATH=$PWD/libkernel_trace.so KTRACE_OUT=t.csv strata run ...
 *
 * (bench/kernels.sh builds it in `stage` and runs it with KTRACE=...) */
#include <cupti.h>
#include <stdio.h>
#include <stdlib.h>

char *__cxa_demangle(const char *mangled, char *out, size_t *len, int *status);

#define BUF_BYTES (8u << 20)

static FILE *out;

static void CUPTIAPI buffer_requested(uint8_t **buf, size_t *size, size_t *max_records) {
    *buf = aligned_alloc(8, BUF_BYTES);
    *size = *buf ? BUF_BYTES : 0;
    *max_records = 0;
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t *buf, size_t size,
                                      size_t valid) {
    (void)ctx, (void)stream, (void)size;
    CUpti_Activity *rec = NULL;
    while (out && cuptiActivityGetNextRecord(buf, valid, &rec) == CUPTI_SUCCESS) {
        if (rec->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && rec->kind != CUPTI_ACTIVITY_KIND_KERNEL)
            continue;
        const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *)rec;
        int st = -1;
        char *dm = k->name ? __cxa_demangle(k->name, NULL, NULL, &st) : NULL;
        const char *name = st == 0 && dm ? dm : k->name ? k->name : "?";
        /* commas inside template arguments would split the CSV: the name is the last column */
        fprintf(out, "%llu,%llu,%u,%llu,%d,%d,%u,%s\n", (unsigned long long)k->start,
                (unsigned long long)k->end, k->graphId, (unsigned long long)k->graphNodeId,
                k->gridX * k->gridY * k->gridZ, k->blockX * k->blockY * k->blockZ,
                k->registersPerThread, name);
        free(dm);
    }
    free(buf);
}

static void flush_at_exit(void) {
    cuptiActivityFlushAll(1);
    if (out) fclose(out);
    out = NULL;
}

int InitializeInjection(void) {
    const char *path = getenv("KTRACE_OUT");
    out = fopen(path && *path ? path : "ktrace.csv", "w");
    if (!out) return 0;
    if (cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS ||
        cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) {
        fprintf(stderr, "kernel_trace: CUPTI would not trace kernels\n");
        return 0;
    }
    atexit(flush_at_exit);
    return 1;
}
