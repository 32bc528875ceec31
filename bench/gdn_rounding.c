/* gdn_rounding.c - what rounding the chunked gated delta rule's operands to bf16 costs, on the
 * CPU: one (dk 128, dv 128) head over T random tokens (q, k L2-normalised as the conv kernel
 * leaves them, q times dk^-0.5; v = bf16(silu(3 N(0,1))); beta = bf16(sigmoid(3 U(-1,1)));
 * g = -exp(0.5 U) GSCALE softplus(3 U + 0.5 U); a random starting state), the chunked form of
 * gdn.cu's kernels (chunks of 64: A_kk, A_qk, the substitution, W and U, then v_new = U - W S,
 * o = (q exp(gamma)) S + A_qk v_new, S <- exp(gamma_last) S + k_d^T v_new) in fp32 with the
 * operands a MODE rounds to bf16, against the recurrent rule in double (what cpu.c runs). It
 * prints the relative L2 error of o (as computed, and after o's own bf16 rounding, as the kernel
 * hands it on) and of the final state, which test_cuda bounds at 1e-3.
 *
 * MODE bits: 1 W, 2 the state update's decayed k, 4 S (as W S's and q S's operand), 8 v_new,
 * 16 q exp(gamma), 32 A_qk (and q k^T from bf16 q, k), 64 A_kk (from bf16 k). Mode 0 stands for
 * main's split operands (~16 bits: fp32 here); 21 is STRATA_EXP_BF=1, 127 STRATA_EXP_BF=2.
 *
 *   cc -O2 -o /tmp/gdn_rounding bench/gdn_rounding.c -lm
 *   /tmp/gdn_rounding T GSCALE [SEED] [MODE...]      (default MODEs: 0 21 127) */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DK 128
#define DV 128
#define C 64

static float bf(float x) { /* round to nearest even bf16 */
    uint32_t u;
    memcpy(&u, &x, 4);
    u += 0x7fff + ((u >> 16) & 1);
    u &= 0xffff0000u;
    memcpy(&x, &u, 4);
    return x;
}
static float rb(float x, int mode, int bit) { return mode & bit ? bf(x) : x; }
static double rnorm(void) {
    double a = (rand() + 1.0) / (RAND_MAX + 2.0), b = (rand() + 1.0) / (RAND_MAX + 2.0);
    return sqrt(-2 * log(a)) * cos(6.283185307179586 * b);
}
static double runif(void) { return 2.0 * rand() / RAND_MAX - 1.0; }

static int T;
static float *q, *k, *v, *be, *g, *S0;

static void chunked(int mode, float *o, float *S) {
    static float gam[C], A[C][C], Aq[C][C], X[C][DK + DV], W[C][DK], U[C][DV], kd[C][DK], vn[C][DV];
    static float Sb[DK][DV], qe[C][DK];
    memcpy(S, S0, sizeof(float) * DK * DV);
    for (int t0 = 0; t0 < T; t0 += C) {
        const int L = T - t0 < C ? T - t0 : C;
        float acc = 0;
        for (int i = 0; i < C; i++) gam[i] = acc += i < L ? g[t0 + i] : 0;
        for (int i = 0; i < C; i++)
            for (int j = 0; j < C; j++) {
                float kk = 0, qk = 0;
                if (i < L && j < L)
                    for (int d = 0; d < DK; d++) {
                        const float ki = k[(t0 + i) * DK + d], kj = k[(t0 + j) * DK + d], qi = q[(t0 + i) * DK + d];
                        kk += rb(ki, mode, 64) * rb(kj, mode, 64);
                        qk += rb(qi, mode, 32) * rb(kj, mode, 32);
                    }
                const float dec = j <= i ? expf(gam[i] - gam[j]) : 0;
                A[i][j] = j < i && i < L ? be[t0 + i] * kk * dec : 0;
                Aq[i][j] = rb(qk * dec, mode, 32);
            }
        for (int i = 0; i < C; i++) {
            const float bi = i < L ? be[t0 + i] : 0;
            for (int d = 0; d < DK; d++) X[i][d] = i < L ? bi * k[(t0 + i) * DK + d] * expf(gam[i]) : 0;
            for (int d = 0; d < DV; d++) X[i][DK + d] = i < L ? bi * v[(t0 + i) * DV + d] : 0;
        }
        for (int i = 0; i < C; i++) /* (I + A_kk) X = [beta k exp(gamma) | beta v] */
            for (int col = 0; col < DK + DV; col++) {
                float a = X[i][col];
                for (int j = 0; j < i; j++) a -= A[i][j] * X[j][col];
                X[i][col] = a;
            }
        const float gl = gam[L - 1];
        for (int i = 0; i < C; i++) {
            for (int d = 0; d < DK; d++) {
                W[i][d] = rb(X[i][d], mode, 1);
                kd[i][d] = rb(i < L ? k[(t0 + i) * DK + d] * expf(gl - gam[i]) : 0, mode, 2);
                qe[i][d] = rb(i < L ? q[(t0 + i) * DK + d] * expf(gam[i]) : 0, mode, 16);
            }
            for (int d = 0; d < DV; d++) U[i][d] = X[i][DK + d];
        }
        for (int d = 0; d < DK; d++)
            for (int e = 0; e < DV; e++) Sb[d][e] = rb(S[d * DV + e], mode, 4);
        for (int i = 0; i < C; i++)
            for (int e = 0; e < DV; e++) {
                float a = 0;
                for (int d = 0; d < DK; d++) a += W[i][d] * Sb[d][e];
                vn[i][e] = rb(U[i][e] - a, mode, 8);
            }
        for (int i = 0; i < L; i++)
            for (int e = 0; e < DV; e++) {
                float a = 0;
                for (int d = 0; d < DK; d++) a += qe[i][d] * Sb[d][e];
                for (int j = 0; j <= i; j++) a += Aq[i][j] * vn[j][e];
                o[(t0 + i) * DV + e] = a;
            }
        const float el = expf(gl);
        for (int d = 0; d < DK; d++)
            for (int e = 0; e < DV; e++) {
                float a = 0;
                for (int i = 0; i < C; i++) a += kd[i][d] * vn[i][e];
                S[d * DV + e] = el * S[d * DV + e] + a;
            }
    }
}

static void recurrent(double *o, double *S) {
    for (int i = 0; i < DK * DV; i++) S[i] = S0[i];
    for (int t = 0; t < T; t++) {
        const double dec = exp(g[t]);
        for (int i = 0; i < DK * DV; i++) S[i] *= dec;
        for (int e = 0; e < DV; e++) {
            double u = 0, a = 0;
            for (int d = 0; d < DK; d++) u += S[d * DV + e] * k[t * DK + d];
            const double delta = be[t] * (v[t * DV + e] - u);
            for (int d = 0; d < DK; d++) S[d * DV + e] += k[t * DK + d] * delta;
            for (int d = 0; d < DK; d++) a += S[d * DV + e] * q[t * DK + d];
            o[t * DV + e] = a;
        }
    }
}

static double rel_l2(const float *x, const double *ref, size_t n) {
    double se = 0, ss = 0;
    for (size_t i = 0; i < n; i++) se += (x[i] - ref[i]) * (x[i] - ref[i]), ss += ref[i] * ref[i];
    return sqrt(se / ss);
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s T GSCALE [SEED] [MODE...]\n", argv[0]);
        return 2;
    }
    T = atoi(argv[1]);
    const double gscale = atof(argv[2]);
    if (T < 1 || T > 100000 || !(gscale > 0)) {
        fprintf(stderr, "%s: T in 1 .. 100000 and GSCALE > 0\n", argv[0]);
        return 2;
    }
    srand(argc > 3 ? (unsigned)atoi(argv[3]) : 1);
    q = malloc(sizeof(float) * T * DK), k = malloc(sizeof(float) * T * DK), v = malloc(sizeof(float) * T * DV);
    be = malloc(sizeof(float) * T), g = malloc(sizeof(float) * T), S0 = malloc(sizeof(float) * DK * DV);
    double *oref = malloc(sizeof(double) * T * DV), *Sref = malloc(sizeof(double) * DK * DV);
    float *o = malloc(sizeof(float) * T * DV), *ob = malloc(sizeof(float) * T * DV), *S = malloc(sizeof(float) * DK * DV);
    if (!q || !k || !v || !be || !g || !S0 || !oref || !Sref || !o || !ob || !S) {
        fprintf(stderr, "%s: out of memory for T = %d\n", argv[0], T);
        return 1;
    }
    for (int t = 0; t < T; t++) {
        double nq = 0, nk = 0;
        for (int d = 0; d < DK; d++) {
            q[t * DK + d] = (float)rnorm(), k[t * DK + d] = (float)rnorm();
            nq += (double)q[t * DK + d] * q[t * DK + d], nk += (double)k[t * DK + d] * k[t * DK + d];
        }
        for (int d = 0; d < DK; d++) q[t * DK + d] /= (float)(sqrt(nq) * sqrt(DK)), k[t * DK + d] /= (float)sqrt(nk);
        for (int d = 0; d < DV; d++) {
            const double x = 3 * rnorm();
            v[t * DV + d] = bf((float)(x / (1 + exp(-x))));
        }
        be[t] = bf((float)(1 / (1 + exp(-3 * runif()))));
        const double a = 3 * runif() + 0.5 * runif();
        g[t] = (float)(-exp(0.5 * runif()) * gscale * (a > 20 ? a : log1p(exp(a))));
    }
    for (int i = 0; i < DK * DV; i++) S0[i] = (float)(0.25 * runif());
    recurrent(oref, Sref);
    static const int dflt[] = {0, 21, 127};
    const int nm = argc > 4 ? argc - 4 : 3;
    for (int m = 0; m < nm; m++) {
        const int mode = argc > 4 ? atoi(argv[4 + m]) : dflt[m];
        chunked(mode, o, S);
        for (int i = 0; i < T * DV; i++) ob[i] = bf(o[i]);
        printf("T %d gscale %g mode %3d: o rel_l2 %.2e (after o's bf16 rounding %.2e), state rel_l2 %.2e\n", T, gscale,
               mode, rel_l2(o, oref, (size_t)T * DV), rel_l2(ob, oref, (size_t)T * DV), rel_l2(S, Sref, DK * DV));
    }
    free(q), free(k), free(v), free(be), free(g), free(S0), free(oref), free(Sref), free(o), free(ob), free(S);
    return 0;
}
