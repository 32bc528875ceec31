/* gemm_algos.c - how far cuBLASLt's first heuristic choice is from the best of its first K, for
 * the prefill's GEMM shapes (out (T, N) = x (T, K) W^T, bf16 in and out, fp32 compute, split-K
 * partials reduced in fp32, 256-byte alignment: strata's gpu_gemm_pick preferences, 32 MiB of
 * workspace).
 *
 *   bash bench/kernels.sh stage, then on the GPU machine:
 *   build-http-gpu/gemm_algos [K_ALGOS] [T ...]     (defaults: 16; 512 4096 8192)
 *
 * Each candidate, hot: 3 untimed runs, then the median of 9 timed by events (the weights stay in
 * L2 when they fit); cold: the stack's copies of the shape's weights one after another (as the
 * layers run them, so each call reads its weights from DRAM), the median of 5 timed passes over
 * them, per call. Prints per shape and mode the first choice's time, the best one's (its index in
 * the heuristic's order) and the gain, and per T the sums over a 4B layer stack (24 DeltaNet + 8
 * attention layers). Neither mode predicts the pipeline: runs 254 and 256 (bench/RESULTS.md) forced
 * its winners there and the prefill did not gain. */
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e_)); exit(1); } } while (0)
#define BK(x) do { cublasStatus_t s_ = (x); if (s_ != CUBLAS_STATUS_SUCCESS) { fprintf(stderr, "%s: %d\n", #x, (int)s_); exit(1); } } while (0)

struct shape { const char *name; int N, K, per_stack; };

static int cmpf(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    const int KA = argc > 1 ? atoi(argv[1]) : 16;
    int Ts[8] = {512, 4096, 8192}, nT = 3;
    if (argc > 2) {
        nT = 0;
        for (int i = 2; i < argc && nT < 8; i++) Ts[nT++] = atoi(argv[i]);
    }
    /* 4B (hidden 2560, intermediate 9216, 16 / 4 heads of 256, DeltaNet 16 key / 32 value heads
     * of 128), per layer stack: the projections into each mixer, the outputs, the MLP */
    const struct shape sh[] = {
        {"gdn in  (12352 x 2560)", 12352, 2560, 24}, {"attn in (10240 x 2560)", 10240, 2560, 8},
        {"out     (2560 x 4096)", 2560, 4096, 32},   {"gate_up (18432 x 2560)", 18432, 2560, 32},
        {"down    (2560 x 9216)", 2560, 9216, 32},
    };
    const int nS = sizeof sh / sizeof *sh;
    cublasLtHandle_t h;
    BK(cublasLtCreate(&h));
    cudaStream_t st;
    CK(cudaStreamCreate(&st));
    size_t maxW = 0, maxX = 0, maxC = 0;
    int maxT = 0;
    for (int i = 0; i < nT; i++) maxT = Ts[i] > maxT ? Ts[i] : maxT;
    for (int s = 0; s < nS; s++) {
        size_t w = (size_t)sh[s].N * sh[s].K, x = (size_t)maxT * sh[s].K, c = (size_t)maxT * sh[s].N;
        maxW = w > maxW ? w : maxW, maxX = x > maxX ? x : maxX, maxC = c > maxC ? c : maxC;
    }
    void *W, *X, *C, *ws, *Wc[32];
    const size_t ws_bytes = (size_t)32 << 20;
    CK(cudaMalloc(&W, maxW * 2));
    CK(cudaMalloc(&X, maxX * 2));
    CK(cudaMalloc(&C, maxC * 2));
    CK(cudaMalloc(&ws, ws_bytes));
    CK(cudaMemset(W, 0x3c, maxW * 2)); /* bf16 ~0.0115: finite, non-zero */
    CK(cudaMemset(X, 0x3c, maxX * 2));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    cublasLtMatmulHeuristicResult_t *res = calloc((size_t)KA, sizeof *res);
    for (int ti = 0; ti < nT; ti++) {
        const int T = Ts[ti];
        double sum_first = 0, sum_best = 0, csum_first = 0, csum_best = 0;
        printf("T = %d\n", T);
        for (int s = 0; s < nS; s++) {
            const int N = sh[s].N, K = sh[s].K;
            cublasLtMatmulDesc_t d;
            BK(cublasLtMatmulDescCreate(&d, CUBLAS_COMPUTE_32F, CUDA_R_32F));
            const cublasOperation_t tr = CUBLAS_OP_T, nt = CUBLAS_OP_N;
            BK(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSA, &tr, sizeof tr));
            BK(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSB, &nt, sizeof nt));
            cublasLtMatrixLayout_t lw, la, lc;
            BK(cublasLtMatrixLayoutCreate(&lw, CUDA_R_16BF, K, N, K));
            BK(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, K, T, K));
            BK(cublasLtMatrixLayoutCreate(&lc, CUDA_R_16BF, N, T, N));
            cublasLtMatmulPreference_t pref;
            BK(cublasLtMatmulPreferenceCreate(&pref));
            const uint64_t wsb = ws_bytes;
            BK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb));
            const uint32_t a256 = 256; /* strata's pointers: 256-byte aligned (gpu_gemm_pick) */
            const cublasLtMatmulPreferenceAttributes_t al[] = {
                CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
            for (int j = 0; j < 4; j++) BK(cublasLtMatmulPreferenceSetAttribute(pref, al[j], &a256, sizeof a256));
            const uint32_t red = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
            BK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &red, sizeof red));
            int n = 0;
            BK(cublasLtMatmulAlgoGetHeuristic(h, d, lw, la, lc, lc, pref, KA, res, &n));
            const float one = 1.0f, zero = 0.0f;
            float first = -1, best = 1e30f, cfirst = -1, cbest = 1e30f;
            int best_i = -1, cbest_i = -1;
            const int P = sh[s].per_stack;
            for (int c = 0; c < P; c++) {
                CK(cudaMalloc(&Wc[c], (size_t)N * K * 2));
                CK(cudaMemset(Wc[c], 0x3c, (size_t)N * K * 2));
            }
            for (int i = 0; i < n; i++) {
                float t[9];
                int ok = 1;
                for (int r = 0; r < 12 && ok; r++) {
                    if (r >= 3) CK(cudaEventRecord(e0, st));
                    ok = cublasLtMatmul(h, d, &one, W, lw, X, la, &zero, C, lc, C, lc, &res[i].algo, ws,
                                        ws_bytes, st) == CUBLAS_STATUS_SUCCESS;
                    if (r >= 3) {
                        CK(cudaEventRecord(e1, st));
                        CK(cudaEventSynchronize(e1));
                        CK(cudaEventElapsedTime(&t[r - 3], e0, e1));
                    }
                }
                if (!ok) continue;
                qsort(t, 9, sizeof *t, cmpf);
                const float med = t[4] * 1000.0f; /* us */
                if (i == 0) first = med;
                if (med < best) best = med, best_i = i;
                float tc[5];
                for (int r = 0; r < 6; r++) {
                    if (r >= 1) CK(cudaEventRecord(e0, st));
                    for (int c = 0; c < P; c++)
                        BK(cublasLtMatmul(h, d, &one, Wc[c], lw, X, la, &zero, C, lc, C, lc, &res[i].algo, ws,
                                          ws_bytes, st));
                    if (r >= 1) {
                        CK(cudaEventRecord(e1, st));
                        CK(cudaEventSynchronize(e1));
                        CK(cudaEventElapsedTime(&tc[r - 1], e0, e1));
                    }
                }
                qsort(tc, 5, sizeof *tc, cmpf);
                const float cmed = tc[2] * 1000.0f / P;
                if (i == 0) cfirst = cmed;
                if (cmed < cbest) cbest = cmed, cbest_i = i;
            }
            for (int c = 0; c < P; c++) CK(cudaFree(Wc[c]));
            const double tf = 2.0 * T * N * K / 1e12;
            printf("  %-24s %2d algos: first %8.1f us (%5.0f TFLOP/s), best #%-2d %8.1f us (%5.0f): %+5.1f%%\n",
                   sh[s].name, n, first, tf / (first * 1e-6), best_i, best, tf / (best * 1e-6),
                   100.0 * (best - first) / first);
            printf("  %-24s    cold: first %8.1f us (%5.0f TFLOP/s), best #%-2d %8.1f us (%5.0f): %+5.1f%%\n", "",
                   cfirst, tf / (cfirst * 1e-6), cbest_i, cbest, tf / (cbest * 1e-6), 100.0 * (cbest - cfirst) / cfirst);
            sum_first += first * P, sum_best += best * P, csum_first += cfirst * P, csum_best += cbest * P;
            cublasLtMatmulPreferenceDestroy(pref);
            cublasLtMatrixLayoutDestroy(lw), cublasLtMatrixLayoutDestroy(la), cublasLtMatrixLayoutDestroy(lc);
            cublasLtMatmulDescDestroy(d);
        }
        printf("  4B stack (ops one by one): first %.0f us, best %.0f us (%+.1f%%)\n", sum_first, sum_best,
               100.0 * (sum_best - sum_first) / sum_first);
        printf("  4B stack cold (each layer's own weights): first %.0f us, best %.0f us (%+.1f%%)\n", csum_first,
               csum_best, 100.0 * (csum_best - csum_first) / csum_first);
    }
    return 0;
}
