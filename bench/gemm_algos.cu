/* gemm_algos.cu - every algorithm cuBLASLt offers for strata's GEMM shapes, timed on the device:
 * is the library's first choice (what gpu_gemm_pick takes) the fastest, and how far is each from
 * the bandwidth / tensor-core roofline? The same problem as gpu.h's gpu_gemm_run: C (T x N) bf16 =
 * A (T x K) W^T, W (N x K) bf16, fp32 compute, split-K partials in fp32 only. Weights rotate
 * through copies past the L2 size, as a decode step or a prefill sees them.
 *
 *   nvcc -O2 -o gemm_algos bench/gemm_algos.cu -lcublasLt
 *   ./gemm_algos [T,T,...] [N:K,N:K,...]   (default: the 4B shapes at T 8,16,20,36,64,128,512)
 */
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); exit(1); } } while (0)
#define BK(x) do { cublasStatus_t s_ = (x); if (s_ != CUBLAS_STATUS_SUCCESS) { fprintf(stderr, "%s:%d cublas %d\n", __FILE__, __LINE__, (int)s_); exit(1); } } while (0)

enum { MAX_ALGOS = 64, COPIES_BYTES = 256 << 20, REPS = 20 };

static float time_algo(cublasLtHandle_t h, cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t lw,
                       cublasLtMatrixLayout_t la, cublasLtMatrixLayout_t lc, const cublasLtMatmulAlgo_t *algo,
                       void *const *W, int nW, void *A, void *C, void *ws, size_t ws_bytes, cudaStream_t s) {
    const float one = 1.0f, zero = 0.0f;
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    for (int i = 0; i < 3; i++)
        if (cublasLtMatmul(h, d, &one, W[i % nW], lw, A, la, &zero, C, lc, C, lc, algo, ws, ws_bytes, s) !=
            CUBLAS_STATUS_SUCCESS)
            return -1;
    CK(cudaEventRecord(e0, s));
    for (int i = 0; i < REPS; i++)
        BK(cublasLtMatmul(h, d, &one, W[(i + 3) % nW], lw, A, la, &zero, C, lc, C, lc, algo, ws, ws_bytes, s));
    CK(cudaEventRecord(e1, s));
    CK(cudaEventSynchronize(e1));
    float ms;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    return 1000.0f * ms / REPS; /* us */
}

int main(int argc, char **argv) {
    const char *ts = argc > 1 ? argv[1] : "8,16,20,36,64,128,512";
    /* 4B: DeltaNet in_proj, attention qkv+gate, out_proj (both mixers), gate_up, down */
    const char *shapes = argc > 2 ? argv[2] : "12352:2560,10240:2560,2560:4096,18432:2560,2560:9216";
    int T[32], nT = 0, NK[32][2], nS = 0;
    for (const char *p = ts; *p && nT < 32;) {
        T[nT++] = atoi(p);
        p = strchr(p, ',');
        if (!p) break;
        p++;
    }
    for (const char *p = shapes; *p && nS < 32;) {
        sscanf(p, "%d:%d", &NK[nS][0], &NK[nS][1]);
        nS++;
        p = strchr(p, ',');
        if (!p) break;
        p++;
    }
    cublasLtHandle_t h;
    BK(cublasLtCreate(&h));
    cudaStream_t s;
    CK(cudaStreamCreate(&s));
    const size_t ws_bytes = 32u << 20;
    void *ws, *A, *C;
    CK(cudaMalloc(&ws, ws_bytes));
    CK(cudaMalloc(&A, (size_t)512 * 18432 * 2 * 2));
    CK(cudaMalloc(&C, (size_t)512 * 18432 * 2 * 2));
    CK(cudaMemset(A, 0x3c, (size_t)512 * 18432 * 2 * 2));
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("# %s, %d SMs; us per GEMM, weights rotating through %d MiB of copies\n\n", prop.name,
           prop.multiProcessorCount, COPIES_BYTES >> 20);
    printf("| T | N x K | first choice us | best us | best is # | of n | first TB/s | best TB/s | best TFLOP/s | first tile/splitK | best tile/splitK |\n");
    printf("|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (int si = 0; si < nS; si++) {
        const int N = NK[si][0], K = NK[si][1];
        const size_t wb = (size_t)N * K * 2;
        int nW = (int)(COPIES_BYTES / wb) + 1;
        if (nW > 64) nW = 64;
        void *W[64];
        for (int i = 0; i < nW; i++) {
            CK(cudaMalloc(&W[i], wb));
            CK(cudaMemset(W[i], 0x3c, wb));
        }
        for (int ti = 0; ti < nT; ti++) {
            const int t = T[ti];
            cublasLtMatmulDesc_t d;
            cublasLtMatrixLayout_t lw, la, lc;
            const cublasOperation_t tr = CUBLAS_OP_T, no = CUBLAS_OP_N;
            BK(cublasLtMatmulDescCreate(&d, CUBLAS_COMPUTE_32F, CUDA_R_32F));
            BK(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSA, &tr, sizeof tr));
            BK(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSB, &no, sizeof no));
            BK(cublasLtMatrixLayoutCreate(&lw, CUDA_R_16BF, K, N, K));
            BK(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, K, t, K));
            BK(cublasLtMatrixLayoutCreate(&lc, CUDA_R_16BF, N, t, N));
            cublasLtMatmulPreference_t pref;
            BK(cublasLtMatmulPreferenceCreate(&pref));
            const uint64_t wsb = ws_bytes;
            BK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb));
            const uint32_t red = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
            BK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &red, sizeof red));
            cublasLtMatmulHeuristicResult_t r[MAX_ALGOS];
            int n = 0;
            BK(cublasLtMatmulAlgoGetHeuristic(h, d, lw, la, lc, lc, pref, MAX_ALGOS, r, &n));
            float first = -1, best = 1e30f;
            int bi = -1;
            for (int i = 0; i < n; i++) {
                const float us = time_algo(h, d, lw, la, lc, &r[i].algo, W, nW, A, C, ws, ws_bytes, s);
                if (i == 0) first = us;
                if (us > 0 && us < best) best = us, bi = i;
            }
            int tile0 = 0, tileb = 0, sk0 = 0, skb = 0;
            size_t wr;
            if (n > 0) {
                cublasLtMatmulAlgoConfigGetAttribute(&r[0].algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile0, sizeof tile0, &wr);
                cublasLtMatmulAlgoConfigGetAttribute(&r[0].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &sk0, sizeof sk0, &wr);
            }
            if (bi >= 0) {
                cublasLtMatmulAlgoConfigGetAttribute(&r[bi].algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tileb, sizeof tileb, &wr);
                cublasLtMatmulAlgoConfigGetAttribute(&r[bi].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &skb, sizeof skb, &wr);
            }
            const double bytes = (double)N * K * 2 + (double)t * K * 2 + (double)t * N * 2;
            printf("| %d | %d x %d | %.1f | %.1f | %d | %d | %.2f | %.2f | %.0f | %d/%d | %d/%d |\n", t, N, K, first,
                   best, bi, n, bytes / first / 1e6, bytes / best / 1e6, 2.0 * t * N * K / best / 1e6, tile0, sk0,
                   tileb, skb);
            fflush(stdout);
            cublasLtMatmulPreferenceDestroy(pref);
            cublasLtMatrixLayoutDestroy(lw);
            cublasLtMatrixLayoutDestroy(la);
            cublasLtMatrixLayoutDestroy(lc);
            cublasLtMatmulDescDestroy(d);
        }
        for (int i = 0; i < nW; i++) CK(cudaFree(W[i]));
    }
    return 0;
}
