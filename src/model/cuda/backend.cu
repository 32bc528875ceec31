/* backend.cu - the CUDA backend: device memory, copies, graph capture and replay, the scratch
 * every op needs (allocated once here, from the config, max_ctx and max_T), and the op table of
 * backend.h, which picks the decode (T = 1) or batched (T > 1) kernels. Kernels live in
 * misc.cu, matmul.cu, attention.cu and gdn.cu; this file launches none itself.
 *
 * Copies: small uploads (token ids, the position) go through a pinned staging ring so they stay
 * ordered on the one stream without a synchronisation; downloads synchronise. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"

/* ---------------------------------------------------------------------------------------------
 * profiling */

void cuda_prof_begin(struct cuda *cu, const char *name) {
    struct cuda_prof *p = &cu->prof;
    if (!p->on || p->n >= CUDA_PROF_MAX) return;
    p->name[p->n] = name;
    gpu_event_record(p->ev[p->n], cu->stream);
}
void cuda_prof_end(struct cuda *cu) {
    struct cuda_prof *p = &cu->prof;
    if (!p->on || p->n >= CUDA_PROF_MAX) return;
    p->n++;
    gpu_event_record(p->ev[p->n], cu->stream);
}

extern "C" long backend_cuda_launches(struct backend *be) { return cuda_of(be)->n_launches; }
extern "C" long backend_cuda_gemm_picks(struct backend *be) { return cuda_of(be)->gemm_picks; }

extern "C" long backend_cuda_graph_nodes(struct backend *be, int key) {
    struct cuda *cu = cuda_of(be);
    for (int i = 0; i < cu->n_graphs; i++)
        if (cu->graphs[i].key == key) return (long)gpu_graph_n_nodes(cu->graphs[i].graph);
    return 0;
}

extern "C" void backend_cuda_profile(struct backend *be, int on) {
    struct cuda *cu = cuda_of(be);
    gpu_stream_sync(cu->stream);
    cu->prof.on = on;
    if (on) {
        cu->prof.n = 0;
        gpu_event_record(cu->prof.ev[0], cu->stream);
    }
}

extern "C" void backend_cuda_profile_report(struct backend *be, FILE *f, int n_steps) {
    struct cuda *cu = cuda_of(be);
    struct cuda_prof *p = &cu->prof;
    gpu_stream_sync(cu->stream);
    /* ops are recorded back to back: event i -> i+1 is op i (the gap to the next launch is
     * counted in the op before it, so the sum is the wall time of the step) */
    const char *names[64];
    double ms[64];
    int calls[64], n_names = 0;
    double total = 0;
    for (int i = 0; i < p->n; i++) {
        double t = gpu_event_ms(p->ev[i], p->ev[i + 1]);
        total += t;
        int j = 0;
        while (j < n_names && strcmp(names[j], p->name[i]) != 0) j++;
        if (j == n_names && n_names < 64) {
            names[n_names] = p->name[i];
            ms[n_names] = 0;
            calls[n_names] = 0;
            n_names++;
        }
        if (j < 64) {
            ms[j] += t;
            calls[j]++;
        }
    }
    if (n_steps < 1) n_steps = 1;
    fprintf(f, "| op | calls/step | us/step | share |\n|---|---|---|---|\n");
    for (int j = 0; j < n_names; j++)
        fprintf(f, "| %s | %d | %.1f | %.1f%% |\n", names[j], calls[j] / n_steps,
                1000.0 * ms[j] / n_steps, total > 0 ? 100.0 * ms[j] / total : 0.0);
    fprintf(f, "| total (ops run one by one, no graph) | | %.1f | |\n", 1000.0 * total / n_steps);
}

/* The mixer kernels' phases (STRATA_TRACE=1), averaged per kind over the step: from the GEMV
 * before (its last block done) to this kernel's first block past its wait, then from that
 * moment to the last block reaching each stamp, and from the end to the next GEMV's inputs. A
 * stamp counts only if written in the last replay (not before the block's entry stamp). */
static void ktrace_report(struct cuda *cu, FILE *f) {
    if (!cu->ktrace || cu->ktrace_n == 0) return;
    size_t n = (size_t)cu->ktrace_n * CUDA_KTRACE_STRIDE, ng = (size_t)cu->trace_n * CUDA_TRACE_STRIDE;
    unsigned long long *t = (unsigned long long *)xmalloc(n * sizeof *t);
    unsigned long long *g = (unsigned long long *)xmalloc((ng ? ng : 1) * sizeof *g);
    gpu_memcpy_d2h(t, cu->ktrace, n * sizeof *t, cu->stream);
    if (ng) gpu_memcpy_d2h(g, cu->trace, ng * sizeof *g, cu->stream);
    gpu_stream_sync(cu->stream);
    double sum[2][8] = {{0}}, bmean[2][8] = {{0}};
    int cnt[2] = {0, 0};
    for (int j = 0; j < cu->ktrace_n; j++) {
        const unsigned long long *tj = t + (size_t)j * CUDA_KTRACE_STRIDE;
        unsigned long long ready = ~0ull, mx[CUDA_KTRACE_STAMPS] = {0};
        double bsum[CUDA_KTRACE_STAMPS] = {0};
        int bn[CUDA_KTRACE_STAMPS] = {0};
        for (int b = 0; b < cu->ktrace_blocks[j]; b++) {
            const unsigned long long *s = tj + (size_t)b * CUDA_KTRACE_STAMPS;
            if (!s[0]) continue;
            if (s[1] >= s[0] && s[1] < ready) ready = s[1];
            for (int k = 0; k < CUDA_KTRACE_STAMPS; k++)
                if (s[k] >= s[0] && s[k] > mx[k]) mx[k] = s[k];
            if (s[1] < s[0]) continue; /* per block: entry -> ready, ready -> each stamp */
            bsum[0] += (double)(s[1] - s[0]), bn[0]++;
            for (int k = 2; k < CUDA_KTRACE_STAMPS; k++)
                if (s[k] >= s[1]) bsum[k - 1] += (double)(s[k] - s[1]), bn[k - 1]++;
        }
        for (int k = 0; k < CUDA_KTRACE_STAMPS - 1; k++)
            bmean[cu->ktrace_kind[j]][k] += bn[k] ? bsum[k] / bn[k] : 0.0;
        if (ready == ~0ull) continue;
        int gi = cu->ktrace_gemv[j], kind = cu->ktrace_kind[j];
        double before = 0, after = 0;
        if (gi >= 0 && gi + 1 < cu->trace_n) {
            const unsigned long long *ga = g + (size_t)gi * CUDA_TRACE_STRIDE;
            const unsigned long long *gb = g + (size_t)(gi + 1) * CUDA_TRACE_STRIDE;
            unsigned long long last = 0, next = ~0ull;
            for (int b = 0; b < cu->trace_blocks[gi]; b++) last = ga[4 * b + 3] > last ? ga[4 * b + 3] : last;
            for (int b = 0; b < cu->trace_blocks[gi + 1]; b++) next = gb[4 * b + 1] < next ? gb[4 * b + 1] : next;
            unsigned long long end = mx[5] > mx[4] ? mx[5] : mx[4] > mx[3] ? mx[4] : mx[3];
            before = (double)ready - (double)last;
            after = (double)next - (double)end;
        }
        sum[kind][0] += before;
        for (int k = 2; k < CUDA_KTRACE_STAMPS; k++) sum[kind][k - 1] += mx[k] ? (double)(mx[k] - ready) : 0;
        sum[kind][5] += after;
        cnt[kind]++;
    }
    fprintf(f, "\n| mixer kernel (mean of n) | GEMV done -> ready | ready -> prep | -> main | -> published | -> last block done | end -> next GEMV ready |\n|---|---|---|---|---|---|---|\n");
    const char *names[2] = {"DeltaNet step", "attention"};
    for (int k = 0; k < 2; k++) {
        if (!cnt[k]) continue;
        fprintf(f, "| %s (%d) |", names[k], cnt[k]);
        for (int i = 0; i < 6; i++) fprintf(f, " %.2f |", sum[k][i] / cnt[k] / 1e3);
        fprintf(f, "\n| %s, mean block: entry -> ready, ready -> stamps |", names[k]);
        for (int i = 0; i < 5; i++) fprintf(f, " %.2f |", bmean[k][i] / cnt[k] / 1e3);
        fprintf(f, " |\n");
    }
    free(t);
    free(g);
}

/* STRATA_TRACE=1: the GEMV timeline of the last decode step (replay of the recorded graph):
 * per GEMV, from its blocks' timestamps, when its inputs were ready (wait / grid barrier left),
 * how long staging x took, when the rows were done (mean and last block), and the gap from its
 * last block to the next GEMV's inputs being ready (other kernels, boundaries, barriers). */
extern "C" int backend_cuda_trace_report(struct backend *be, FILE *f) {
    struct cuda *cu = cuda_of(be);
    if (!cu->trace || cu->trace_n == 0) return 0;
    gpu_stream_sync(cu->stream);
    size_t n = (size_t)cu->trace_n * CUDA_TRACE_STRIDE;
    unsigned long long *t = (unsigned long long *)xmalloc(n * sizeof *t);
    gpu_memcpy_d2h(t, cu->trace, n * sizeof *t, cu->stream);
    gpu_stream_sync(cu->stream);
    unsigned long long t0 = ~0ull;
    for (int j = 0; j < cu->trace_n; j++)
        for (int b = 0; b < cu->trace_blocks[j]; b++) {
            unsigned long long v = t[(size_t)j * CUDA_TRACE_STRIDE + 4 * b + 1];
            if (v && v < t0) t0 = v;
        }
    double sum_active = 0, sum_gap = 0, sum_stage = 0, sum_tail = 0, sum_bytes = 0;
    fprintf(f, "| # | GEMV (N x K) | entry (first block) | ready first..last | stage x | rows done mean..last | active | GB/s | gap to next |\n|---|---|---|---|---|---|---|---|---|\n");
    double prev_last = 0;
    double *act = (double *)xmalloc((size_t)cu->trace_n * sizeof *act);
    double *gapn = (double *)xmalloc((size_t)cu->trace_n * sizeof *gapn);
    for (int j = 0; j < cu->trace_n; j++) {
        const unsigned long long *tj = t + (size_t)j * CUDA_TRACE_STRIDE;
        int nb = cu->trace_blocks[j];
        double e0 = 1e30, r0 = 1e30, r1 = 0, st = 0, dm = 0, d1 = 0;
        for (int b = 0; b < nb; b++) {
            double e = (double)(tj[4 * b] - t0), r = (double)(tj[4 * b + 1] - t0);
            double x = (double)(tj[4 * b + 2] - t0), d = (double)(tj[4 * b + 3] - t0);
            if (e < e0) e0 = e;
            if (r < r0) r0 = r;
            if (r > r1) r1 = r;
            st += x - r;
            dm += d;
            if (d > d1) d1 = d;
        }
        st /= nb;
        dm /= nb;
        double bytes = 2.0 * cu->trace_N[j] * cu->trace_K[j] * ((cu->trace_flags[j] & 4) ? 2 : 1);
        double active = d1 - r0;
        sum_active += active;
        sum_stage += st;
        sum_tail += d1 - dm;
        sum_bytes += bytes;
        if (j > 0) sum_gap += r0 - prev_last;
        prev_last = d1;
        double gap = 0;
        if (j + 1 < cu->trace_n) {
            const unsigned long long *tn = t + (size_t)(j + 1) * CUDA_TRACE_STRIDE;
            double rn = 1e30;
            for (int b = 0; b < cu->trace_blocks[j + 1]; b++)
                if ((double)(tn[4 * b + 1] - t0) < rn) rn = (double)(tn[4 * b + 1] - t0);
            gap = rn - d1;
        }
        act[j] = active;
        gapn[j] = gap;
        if (j < 12 || (j >= 60 && j < 72) || j + 3 >= cu->trace_n)
            fprintf(f, "| %d | %d x %d%s%s%s, %s %d | %.2f | %.2f..%.2f | %.2f | %.2f..%.2f | %.2f | %.0f | %.2f |\n",
                    j, cu->trace_N[j], cu->trace_K[j], cu->trace_flags[j] & 1 ? " norm" : "",
                    cu->trace_flags[j] & 2 ? " +res" : "", cu->trace_flags[j] & 4 ? " swiglu" : "",
                    cu->trace_flags[j] & 8 ? "rows" : "tpr", cu->trace_flags[j] >> 4, e0 / 1e3, r0 / 1e3, r1 / 1e3,
                    st / 1e3, dm / 1e3, d1 / 1e3, active / 1e3, bytes / active, gap / 1e3);
    }
    /* per class (N, K, flags, tpr): the same GEMV in every layer, averaged */
    enum { MAX_CLASSES = 16 };
    struct gemv_class {
        int N, K, flags, n;
        double active, gap;
    } cl[MAX_CLASSES];
    int ncl = 0;
    for (int j = 0; j < cu->trace_n; j++) {
        int c = 0;
        while (c < ncl && !(cl[c].N == cu->trace_N[j] && cl[c].K == cu->trace_K[j] &&
                            cl[c].flags == cu->trace_flags[j]))
            c++;
        if (c == MAX_CLASSES) continue;
        if (c == ncl) {
            cl[c].N = cu->trace_N[j], cl[c].K = cu->trace_K[j], cl[c].flags = cu->trace_flags[j];
            cl[c].n = 0, cl[c].active = cl[c].gap = 0;
            ncl++;
        }
        cl[c].n++;
        cl[c].active += act[j];
        cl[c].gap += gapn[j];
    }
    fprintf(f, "\n| GEMV class | n | mean active us | GB/s | mean gap to next us |\n"
               "|---|---|---|---|---|\n");
    for (int c = 0; c < ncl; c++) {
        const int fl = cl[c].flags;
        double bytes = 2.0 * cl[c].N * cl[c].K * ((fl & 4) ? 2 : 1);
        fprintf(f, "| %d x %d%s%s%s, %s %d | %d | %.2f | %.0f | %.2f |\n", cl[c].N, cl[c].K,
                fl & 1 ? " norm" : "", fl & 2 ? " +res" : "", fl & 4 ? " swiglu" : "",
                fl & 8 ? "rows" : "tpr", fl >> 4,
                cl[c].n, cl[c].active / cl[c].n / 1e3, bytes * cl[c].n / cl[c].active,
                cl[c].gap / cl[c].n / 1e3);
    }
    free(act);
    free(gapn);
    fprintf(f, "\nGEMVs %d: active %.1f us (%.1f GB, %.0f GB/s while active), of which staging x "
               "%.1f us and last-block tail %.1f us; gaps between GEMVs %.1f us; step span %.1f us\n",
            cu->trace_n, sum_active / 1e3, sum_bytes / 1e9, sum_bytes / sum_active, sum_stage / 1e3,
            sum_tail / 1e3, sum_gap / 1e3, prev_last / 1e3);
    free(t);
    ktrace_report(cu, f);
    return 1;
}

extern "C" void backend_cuda_test_knobs(struct backend *be, const struct cuda_test_knobs *k) {
    struct cuda *cu = cuda_of(be);
    CHECK(cu->n_graphs == 0);
    if (k->gemv_shape >= -1) cu->gemv_shape = k->gemv_shape < CUDA_GEMV_SHAPES ? k->gemv_shape : -1;
    if (k->gemv_tail >= -1) cu->gemv_tail = k->gemv_tail > 0 ? k->gemv_tail : 0;
    if (k->gemv_tail_min >= -1) cu->gemv_tail_min = k->gemv_tail_min > 1 ? k->gemv_tail_min : 1;
    if (k->attn_short >= -1) cu->attn_short = k->attn_short > 0 ? k->attn_short : 0;
    if (k->flash_portable > 0) cu->flash_wg = 0;
}

extern "C" size_t backend_cuda_scratch_bytes(struct backend *be) {
    return cuda_of(be)->scratch_bytes;
}

/* Registers are given to a warp in units of 256 (8 per thread). Run 52: when the DeltaNet step's
 * block did not fit beside the in_proj GEMV's two (that GEMV at 120 registers), its blocks
 * started only as the GEMV's left and the step's gap grew from 4 to 8 us per layer. */
extern "C" int backend_cuda_residency(struct backend *be, char *buf, size_t cap) {
    struct cuda *cu = cuda_of(be);
    const struct config *c = be->config;
    if (c->linear_num_value_heads <= 0) return 0;
    int gt, st;
    const int shape = cu->gemv_shape >= 0 ? cu->gemv_shape : cu->gemv_wide;
    const int gr = (cuda_gemv_regs(shape, &gt) + 7) / 8 * 8;
    const int sr = (cuda_gdn_step_regs(cu, c, &st) + 7) / 8 * 8;
    const long need = 2L * gt * gr + (long)st * sr;
    snprintf(buf, cap, "%s: 2 x %d threads x %d + %d x %d = %ld of %d",
             need <= cu->info.regs_per_sm ? "fits" : "does not fit", gt, gr, st, sr, need,
             cu->info.regs_per_sm);
    return 1;
}

extern "C" void backend_cuda_info(struct backend *be, char *name, size_t name_cap, int *n_sm) {
    struct cuda *cu = cuda_of(be);
    if (name) snprintf(name, name_cap, "%s", cu->info.name);
    if (n_sm) *n_sm = cu->info.n_sm;
}

extern "C" double backend_cuda_copy_bandwidth(struct backend *be, size_t bytes) {
    struct cuda *cu = cuda_of(be);
    void *a, *b;
    if (gpu_try_malloc(&a, bytes) < 0) return 0;
    if (gpu_try_malloc(&b, bytes) < 0) {
        gpu_free(a);
        return 0;
    }
    gpu_memset(a, 1, bytes, cu->stream);
    gpu_event e0, e1;
    gpu_event_create(&e0);
    gpu_event_create(&e1);
    for (int i = 0; i < 3; i++) gpu_memcpy_d2d(b, a, bytes, cu->stream);
    const int reps = 20;
    gpu_event_record(e0, cu->stream);
    for (int i = 0; i < reps; i++) gpu_memcpy_d2d(i & 1 ? a : b, i & 1 ? b : a, bytes, cu->stream);
    gpu_event_record(e1, cu->stream);
    double ms = gpu_event_ms(e0, e1);
    gpu_event_destroy(e0);
    gpu_event_destroy(e1);
    gpu_stream_sync(cu->stream);
    gpu_free(a);
    gpu_free(b);
    return 2.0 * (double)bytes * reps / (ms / 1000.0);
}

/* ---------------------------------------------------------------------------------------------
 * memory */

static void *dev_alloc(struct cuda *cu, size_t bytes, const char *what) {
    void *p = NULL;
    cu->scratch_bytes += bytes; /* op_alloc subtracts what the model asks for */
    if (gpu_try_malloc(&p, bytes) < 0) {
        size_t fr = 0, tot = 0;
        gpu_mem_free_total(&fr, &tot);
        fprintf(stderr,
                "cuda: out of device memory allocating %s: %zu bytes needed, %zu free of %zu "
                "(reduce the context with --ctx)\n",
                what, bytes, fr, tot);
        abort();
    }
    gpu_memset(p, 0, bytes, cu->stream);
    return p;
}

static void *op_alloc(struct backend *be, size_t bytes) {
    struct cuda *cu = cuda_of(be);
    void *p = dev_alloc(cu, bytes, "a model buffer");
    cu->scratch_bytes -= bytes;
    gpu_stream_sync(cu->stream);
    return p;
}
static void op_free(struct backend *be, void *p) {
    gpu_stream_sync(cuda_of(be)->stream);
    gpu_free(p);
}
static void op_upload(struct backend *be, void *dst, const void *src, size_t bytes) {
    struct cuda *cu = cuda_of(be);
    CHECK(!cu->capturing);
    if (bytes <= CUDA_STAGE_BYTES / 16) {
        /* staged (up to 64 KiB: a prefill call's ids, a grammar's mask): ordered on the stream,
         * no synchronisation; the ring is reused only after the stream has drained everything
         * that read it */
        if (cu->stage_off + bytes > CUDA_STAGE_BYTES) {
            gpu_stream_sync(cu->stream);
            cu->stage_off = 0;
        }
        uint8_t *s = cu->stage + cu->stage_off;
        memcpy(s, src, bytes);
        gpu_memcpy_h2d(dst, s, bytes, cu->stream);
        cu->stage_off += (bytes + 63) & ~(size_t)63;
        return;
    }
    gpu_memcpy_h2d(dst, src, bytes, cu->stream);
    gpu_stream_sync(cu->stream);
}
static void op_download(struct backend *be, void *dst, const void *src, size_t bytes) {
    struct cuda *cu = cuda_of(be);
    CHECK(!cu->capturing);
    if (bytes <= CUDA_STAGE_BYTES) {
        gpu_memcpy_d2h(cu->stage, src, bytes, cu->stream);
        gpu_stream_sync(cu->stream);
        memcpy(dst, cu->stage, bytes);
    } else {
        gpu_memcpy_d2h(dst, src, bytes, cu->stream);
        gpu_stream_sync(cu->stream);
    }
    cu->stage_off = 0; /* the stream is drained */
}
static void op_zero(struct backend *be, void *dst, size_t bytes) {
    gpu_memset(dst, 0, bytes, cuda_of(be)->stream);
}
static void op_copy(struct backend *be, void *dst, size_t dst_pitch, const void *src,
                    size_t src_pitch, size_t width, size_t rows) {
    struct cuda *cu = cuda_of(be);
    if (rows == 1)
        gpu_memcpy_d2d(dst, src, width, cu->stream);
    else
        gpu_memcpy_d2d_2d(dst, dst_pitch, src, src_pitch, width, rows, cu->stream);
    cu->n_launches++;
}
static void op_sync(struct backend *be) {
    struct cuda *cu = cuda_of(be);
    gpu_stream_sync(cu->stream);
    cu->stage_off = 0;
}
/* Device memory still free (cudaMemGetInfo), for model_load's "needs X GiB, Y GiB free". */
static size_t op_mem_free(struct backend *be) {
    (void)be;
    size_t fr = 0, tot = 0;
    gpu_mem_free_total(&fr, &tot);
    return fr;
}

/* ---------------------------------------------------------------------------------------------
 * graphs */

static int op_graph_replay(struct backend *be, int key) {
    struct cuda *cu = cuda_of(be);
    if (cu->prof.on) return 0;
    for (int i = 0; i < cu->n_graphs; i++)
        if (cu->graphs[i].key == key) {
            gpu_graph_launch(cu->graphs[i].exec, cu->stream);
            cu->n_launches += (long)gpu_graph_n_nodes(cu->graphs[i].graph);
            cu->attn_mode = -1;
            return 1;
        }
    return 0;
}
/* Decode attention: a step at a position the short kernel covers records it alone, a later one
 * the split kernel alone (each would otherwise wait and leave at the other's positions, and
 * the idle one's blocks hold the SMs the next GEMV's early blocks would use). Ops recorded or
 * run outside model_step (no variant set) launch both. */
static int op_graph_variant(struct backend *be, int pos) {
    struct cuda *cu = cuda_of(be);
    cu->attn_mode = cu->attn_short > 0 && pos + 1 <= cu->attn_short ? 0 : 1;
    return cu->attn_mode;
}
static void op_graph_begin(struct backend *be, int key) {
    struct cuda *cu = cuda_of(be);
    cu->trace_n = cu->ktrace_n = 0; /* trace the kernels of the graph being recorded */
    if (cu->prof.on || cu->n_graphs >= CUDA_MAX_GRAPHS) return;
    CHECK(key != 0 && !cu->capturing);
    gpu_capture_begin(cu->stream);
    cu->capturing = key;
}
static void op_graph_end(struct backend *be, int key) {
    struct cuda *cu = cuda_of(be);
    cu->attn_mode = -1;
    if (!cu->capturing) return;
    CHECK(cu->capturing == key);
    struct cuda_graph_slot *g = &cu->graphs[cu->n_graphs++];
    g->key = key;
    gpu_capture_end(cu->stream, &g->graph);
    gpu_graph_instantiate(&g->exec, g->graph);
    cu->capturing = 0;
    /* the captured ops have not run yet: run them once now */
    gpu_graph_launch(g->exec, cu->stream);
}

/* ---------------------------------------------------------------------------------------------
 * ops */

#define PROF(name, body)                                                                       \
    do {                                                                                       \
        cuda_prof_begin(cu, name);                                                             \
        body;                                                                                  \
        cuda_prof_end(cu);                                                                     \
    } while (0)

static void op_embed(struct backend *be, uint16_t *out, const uint16_t *table, const int32_t *ids,
                     int T) {
    struct cuda *cu = cuda_of(be);
    CHECK(T >= 1 && T <= be->max_T);
    PROF("embed", cuda_embed(cu, out, table, ids, T, be->config->hidden_size,
                             be->config->vocab_size));
}

extern "C" void cuda_add_flush(struct cuda *cu) {
    if (!cu->add_x) return;
    uint16_t *x = cu->add_x;
    cu->add_x = NULL;
    cuda_add(cu, x, cu->y, cu->add_n);
}

/* x, or its rows normalised into cu->xn when norm_w is set (the GEMMs that take x as it is); the
 * pending residual add into x (cu->add_x: the GEMM before left x + y to do) in the norm's pass */
static const uint16_t *normed(struct cuda *cu, const uint16_t *x, const uint16_t *norm_w, int T,
                              int K, float eps) {
    if (!norm_w) return x;
    CHECK((size_t)T * K <= cu->xn_elems);
    if (cu->add_x) {
        CHECK(cu->add_x == x && cu->add_n == (size_t)T * K); /* op_matmul flushed any other */
        cu->add_x = NULL;
        cuda_add_rmsnorm(cu, cu->xn, (uint16_t *)x, cu->y, norm_w, T, K, eps);
    } else {
        cuda_rmsnorm(cu, cu->xn, x, norm_w, T, K, eps);
    }
    return cu->xn;
}

/* An op's state for a batched GEMM of x (T, K), the pending residual add launched unless it is
 * into x and the GEMM's RMSNorm of x can take it (normed) */
static struct cuda *cuda_for_gemm(struct backend *be, const uint16_t *x, const uint16_t *norm_w,
                                  int T, int K) {
    struct cuda *cu = cuda_peek(be);
    if (cu->add_x && !(norm_w && T > 1 && x == cu->add_x && cu->add_n == (size_t)T * K &&
                       !cuda_gemm_rows_ok(cu, T, K)))
        cuda_add_flush(cu);
    return cu;
}

static void op_matmul(struct backend *be, uint16_t *out, const uint16_t *x, const uint16_t *norm_w,
                      const uint16_t *W, int T, int N, int K, int accumulate) {
    struct cuda *cu = cuda_for_gemm(be, x, norm_w, T, K);
    float eps = be->config->rms_norm_eps;
    CHECK(T >= 1 && K % 8 == 0);
    if (T == 1) {
        PROF(N >= be->config->vocab_size ? "gemv lm_head" : norm_w ? "gemv (rmsnorm)"
             : "gemv (+residual)",
             cuda_gemv(cu, out, x, norm_w, W, N, K, eps, accumulate, 0));
        return;
    }
    if (cuda_gemm_rows_ok(cu, T, K)) { /* a batched step's rows: the weights once */
        PROF(norm_w ? "gemm rows (rmsnorm)" : "gemm rows (+residual)",
             cuda_gemm_rows(cu, out, x, norm_w, W, T, N, K, eps, accumulate, 0));
        return;
    }
    cuda_prof_begin(cu, "gemm (prefill)");
    const uint16_t *in = normed(cu, x, norm_w, T, K, eps);
    if (accumulate) { /* out += y: left to the next op (in the pass of out's RMSNorm, normed) */
        CHECK((size_t)T * N <= cu->y_elems && !cu->add_x);
        cuda_gemm(cu, cu->y, in, W, T, N, K);
        cu->add_x = out, cu->add_n = (size_t)T * N;
    } else {
        cuda_gemm(cu, out, in, W, T, N, K);
    }
    cuda_prof_end(cu);
}

static void op_matmul_swiglu(struct backend *be, uint16_t *out, const uint16_t *x,
                             const uint16_t *norm_w, const uint16_t *W_gu, int T, int I, int K) {
    struct cuda *cu = cuda_for_gemm(be, x, norm_w, T, K);
    float eps = be->config->rms_norm_eps;
    CHECK(T >= 1 && K % 8 == 0);
    if (T == 1) {
        PROF("gemv gate+up+silu", cuda_gemv(cu, out, x, norm_w, W_gu, I, K, eps, 0, 1));
        return;
    }
    if (cuda_gemm_rows_ok(cu, T, K)) {
        PROF("gemm rows gate+up+silu",
             cuda_gemm_rows(cu, out, x, norm_w, W_gu, T, I, K, eps, 0, 1));
        return;
    }
    cuda_prof_begin(cu, "gemm swiglu (prefill)");
    const uint16_t *in = normed(cu, x, norm_w, T, K, eps);
    CHECK((size_t)T * 2 * I <= cu->y_elems);
    cuda_gemm(cu, cu->y, in, W_gu, T, 2 * I, K);
    cuda_swiglu(cu, out, cu->y, T, I);
    cuda_prof_end(cu);
}

/* The early-start counters (cuda_gemv_early) of the mixer layer whose input projection this is
 * (a pair per layer, in cu->early_cnt; keyed by the weights, which every sequence shares: one
 * step runs at a time and leaves them at zero), or NULL when every slot is taken. */
static int *early_slot(struct cuda *cu, const void *layer_state) {
    for (int i = 0; i < CUDA_EARLY_SLOTS; i++) {
        if (!cu->early_key[i]) cu->early_key[i] = layer_state;
        if (cu->early_key[i] == layer_state) return cu->early_cnt + 2 * i;
    }
    return NULL;
}

/* Whether a decode input projection of `pairs` row pairs (K wide, normed) that writes the
 * mixer's inputs in its first `early` pairs pays for starting the mixer on a count: those pairs
 * must end a round of the GEMV's grid before the last, and the rows after them must stream for
 * longer than the mixer's own work (~3-5 us): 16 MiB or more. Measured: 4B (21 MiB after the
 * mixer's rows, in_proj and qkv alike) +0.8%, 9B (33 MiB) +0.2% (run 78); 2B (8.4 MiB) -0.5%
 * (runs 81-82); 0.8B (4.2 MiB) -1.7% (run 78, the attention's) and -4.5% (run 73, the step's). */
static int early_rounds_pay(struct cuda *cu, long pairs, long early, int K) {
    const long g = cuda_gemv_groups(cu, (int)(2 * pairs), K, 1);
    if (g <= 0 || (pairs - early) * 2 * K * 2 < (16l << 20)) return 0;
    return (early + g - 1) / g < (pairs + g - 1) / g;
}

/* Whether the decode qkv GEMV should start the short attention early (with the DeltaNet step's
 * early start, runs 78 and 83: 4B +1.0%, 9B +0.2%; where the rows after the inputs stream less
 * than 16 MiB, 0.8B and 2B, both lost, run 81): that kernel in this graph, hd / 2 a power of
 * two, and the pairs other than the gates' (k, v, then q first) early enough
 * (early_rounds_pay). */
static int attn_early_pays(struct cuda *cu, const struct config *c) {
    const int nH = c->num_attention_heads, nKV = c->num_key_value_heads, hd = c->head_dim;
    if ((cu->skip & 2) || cu->attn_short <= 0 || cu->attn_mode == 1) return 0;
    if (hd % 4 || ((hd / 2) & (hd / 2 - 1))) return 0;
    const long pairs = (long)nH * hd + (long)nKV * hd, early = (long)nKV * hd + (long)nH * hd / 2;
    return early_rounds_pay(cu, pairs, early, c->hidden_size);
}

static void op_attention(struct backend *be, uint16_t *out, uint16_t *qkv, const uint16_t *h,
                         const uint16_t *in_norm, const uint16_t *W_in, const uint16_t *q_norm,
                         const uint16_t *k_norm, uint16_t *k_cache, uint16_t *v_cache,
                         const int32_t *pos, int T, int q_from) {
    const struct config *c = be->config;
    struct cuda *cu = W_in ? cuda_for_gemm(be, h, in_norm, T, c->hidden_size) : cuda_of(be);
    CHECK(T >= 1 && T <= be->max_T && q_from >= 0 && q_from < T);
    const int nH = c->num_attention_heads, nKV = c->num_key_value_heads, hd = c->head_dim;
    const int N_in = 2 * nH * hd + 2 * nKV * hd;
    int *cnt = NULL, target = 0;
    if (W_in && T == 1 && attn_early_pays(cu, c) && (cnt = early_slot(cu, W_in))) {
        /* pairs in the order k, v, each head's q, each head's gate; the short kernel starts
         * once all but the gates are written */
        struct cuda_early e = {};
        int sh = 0;
        while ((1 << sh) < hd / 2) sh++;
        e.hp_log2 = sh, e.nh = nH, e.kvp = nKV * hd, e.early = nKV * hd + nH * hd / 2, e.cnt = cnt;
        PROF("gemv (rmsnorm)", target = cuda_gemv_early(cu, qkv, h, in_norm, W_in, N_in,
                                                        c->hidden_size, c->rms_norm_eps, &e));
    } else if (W_in) {
        op_matmul(be, qkv, h, in_norm, W_in, T, N_in, c->hidden_size, 0);
    }
    if (T == 1 && (cu->skip & 2)) return;
    cu->attn_cnt = cnt, cu->attn_target = target;
    cuda_prof_begin(cu, T == 1 ? "attention (decode)" : "attention (prefill)");
    cuda_attn_prep(cu, c, be->max_ctx, cu->attn_q, qkv, q_norm, k_norm, k_cache, v_cache, pos, T);
    if (T == 1)
        cuda_attn_decode(cu, c, be->max_ctx, out, cu->attn_q, qkv, k_cache, v_cache, pos);
    else
        cuda_attn_prefill(cu, c, be->max_ctx, out, cu->attn_q, qkv, k_cache, v_cache, pos, T, q_from);
    cuda_prof_end(cu);
}


/* Whether the decode in_proj should start the step early (see attn_early_pays: runs 78, 81,
 * 83): its pairs other than z's (b, a, q, k, v first) early enough (early_rounds_pay). */
static int early_pays(struct cuda *cu, const struct config *c) {
    const int conv_dim = c->conv_dim, value_dim = c->value_dim, Hv = c->linear_num_value_heads;
    if ((cu->skip & 1) || conv_dim % 2 || value_dim % 2) return 0;
    const long pairs = (conv_dim + value_dim + 2L * Hv) / 2, early = Hv + conv_dim / 2;
    return early_rounds_pay(cu, pairs, early, c->hidden_size);
}

static void op_gdn(struct backend *be, uint16_t *h, uint16_t *proj, const uint16_t *in_norm,
                   const uint16_t *W_in, uint16_t *conv_state, const uint16_t *conv_w,
                   const float *A_log, const float *dt_bias, const float *norm_w, float *state,
                   const uint16_t *W_out, const int32_t *pos, int T, const struct backend_snap *snap) {
    const struct config *c = be->config;
    struct cuda *cu = W_in ? cuda_for_gemm(be, h, in_norm, T, c->hidden_size) : cuda_of(be);
    CHECK(T >= 1 && T <= be->max_T);
    const int H = c->hidden_size, value_dim = c->value_dim, conv_dim = c->conv_dim;
    const int Hv = c->linear_num_value_heads;
    const int N_in = conv_dim + value_dim + 2 * Hv;
    int *cnt = NULL, target = 0;
    if (W_in && T == 1 && early_pays(cu, c) && (cnt = early_slot(cu, W_in))) {
        /* pairs in the order b, a, q, k, v, z; the step starts once all but z are written */
        struct cuda_early e = {};
        e.rot = (conv_dim + value_dim) / 2, e.early = Hv + conv_dim / 2, e.cnt = cnt;
        e.sz = cu->gdn_sz, e.z0 = conv_dim, e.nz = value_dim;
        PROF("gemv (rmsnorm)", target = cuda_gemv_early(cu, proj, h, in_norm, W_in, N_in, H,
                                                        c->rms_norm_eps, &e));
    } else if (W_in) {
        cnt = NULL;
        op_matmul(be, proj, h, in_norm, W_in, T, N_in, H, 0);
    }
    if (T == 1) { /* the step's o, then out_proj staging its input through the gated norm */
        if (!(cu->skip & 1))
            PROF("gdn step", cuda_gdn_step(cu, c, cu->gdn_o, cu->gdn_sz, proj, conv_state, conv_w,
                                           A_log, dt_bias, state, pos, cnt, target));
        if (!W_out) { /* the mixer's output is the caller's (h: (1, value_dim)) */
            PROF("gdn norm", cuda_gdn_norm(cu, c, h, proj, norm_w, 1, NULL, NULL));
        } else if (cuda_gemv_gated_ok(value_dim, c->linear_value_head_dim)) {
            PROF("gemv out_proj (gated norm, +residual)",
                 cuda_gemv_gated(cu, h, cu->gdn_o, cu->gdn_sz, norm_w, c->linear_value_head_dim,
                                 W_out, H, value_dim, c->rms_norm_eps));
        } else { /* small shapes (the demo model): the norm as its own kernel, a plain GEMV */
            PROF("gdn norm", cuda_gdn_norm(cu, c, cu->xn, proj, norm_w, 1, NULL, NULL));
            PROF("gemv (+residual)", cuda_gemv(cu, h, cu->xn, NULL, W_out, H, value_dim,
                                               c->rms_norm_eps, 1, 0));
        }
        if (snap && snap->n) { /* a one-token prefill call: the state after it */
            CHECK(snap->n == 1 && snap->t[0] == 1);
            gpu_memcpy_d2d(snap->state[0], state, (size_t)Hv * c->linear_key_head_dim *
                                                      c->linear_value_head_dim * sizeof(float), cu->stream);
            gpu_memcpy_d2d(snap->conv[0], conv_state,
                           (size_t)conv_dim * c->linear_conv_kernel_dim * sizeof(uint16_t), cu->stream);
        }
        return;
    }
    CHECK(!W_out || (size_t)T * value_dim <= cu->xn_elems);
    PROF("gdn (prefill)", cuda_gdn_prefill(cu, c, W_out ? cu->xn : h, proj, conv_state, conv_w, A_log,
                                           dt_bias, norm_w, state, pos, T, snap));
    if (W_out) op_matmul(be, h, cu->xn, NULL, W_out, T, H, value_dim, 1); /* reads xn as it is */
}

/* A batched step's rows: every row's mixer in one launch, the states found through the row
 * tables (so a graph recorded for B rows serves any B sequences); the projections around them
 * are the caller's GEMMs over all rows. */
static void op_attention_rows(struct backend *be, uint16_t *out, uint16_t *qkv,
                              const uint16_t *q_norm, const uint16_t *k_norm,
                              const struct backend_rows *rows, size_t k_off, size_t v_off, int B) {
    struct cuda *cu = cuda_of(be);
    const struct config *c = be->config;
    const int nH = c->num_attention_heads, nKV = c->num_key_value_heads, hd = c->head_dim;
    struct cuda_attn_rows ar = {rows->kv, k_off, v_off, (size_t)2 * nH * hd + (size_t)2 * nKV * hd,
                                (size_t)nH * hd, 0};
    if (cu->skip & 2) return; /* timing only */
    cuda_prof_begin(cu, "attention (decode rows)");
    const int mode = cu->attn_mode;
    if (mode == 1) cu->attn_mode = -1; /* some rows past the short kernel's reach: both kernels */
    cu->attn_cnt = NULL, cu->attn_target = 0;
    cuda_attn_prep(cu, c, be->max_ctx, cu->attn_q, qkv, q_norm, k_norm, NULL, NULL, rows->pos, 1);
    cuda_attn_decode_rows(cu, c, be->max_ctx, out, qkv, &ar, rows->pos, B);
    cu->attn_mode = mode;
    cuda_prof_end(cu);
}

static void op_gdn_rows(struct backend *be, uint16_t *out, uint16_t *proj, const uint16_t *conv_w,
                        const float *A_log, const float *dt_bias, const float *norm_w,
                        const struct backend_rows *rows, size_t state_off, size_t conv_off, int B) {
    struct cuda *cu = cuda_of(be);
    const struct config *c = be->config;
    struct cuda_gdn_rows gr = {rows->gdn, state_off, conv_off,
                               (size_t)c->conv_dim + c->value_dim + 2 * c->linear_num_value_heads};
    CHECK((size_t)B * c->value_dim <= cu->xn_elems);
    if (cu->skip & 1) return; /* timing only */
    PROF("gdn (decode rows)", cuda_gdn_step_rows(cu, c, out, proj, conv_w, A_log, dt_bias, norm_w,
                                                 &gr, rows->pos, B));
}

static void op_argmax(struct backend *be, int32_t *out, const uint16_t *x, int n, int32_t *pos) {
    struct cuda *cu = cuda_of(be);
    PROF("argmax", cuda_argmax(cu, out, x, n, pos));
}

static void op_argmax_rows(struct backend *be, int32_t *out, const uint16_t *x, int n, int B) {
    struct cuda *cu = cuda_of(be);
    if (n % 8) { /* the row kernel reads 16-byte words */
        for (int b = 0; b < B; b++) op_argmax(be, out + b, x + (size_t)b * n, n, NULL);
        return;
    }
    PROF("argmax rows", cuda_argmax_rows(cu, out, x, n, B));
}

static void op_sample(struct backend *be, int32_t *out, const uint16_t *x, int n,
                      const struct backend_sample_state *st, int32_t *pos, int host_pos) {
    struct cuda *cu = cuda_of(be);
    PROF("sample", cuda_sample(cu, out, x, n, st, pos, host_pos));
}

static void op_logprobs(struct backend *be, float *out, const uint16_t *x, int n, int k,
                        const int32_t *chosen) {
    struct cuda *cu = cuda_of(be);
    PROF("logprobs", cuda_logprobs(cu, out, x, n, k, chosen));
}

/* Spins on the mailbox slot of post n (the host's own memory, written by the argmax kernel);
 * now and then asks whether the stream is done, so a device error aborts instead of hanging. */
static int32_t op_choice_wait(struct backend *be, int64_t n) {
    struct cuda *cu = cuda_of(be);
    CHECK(!cu->capturing && n >= 1);
    const unsigned long long *slot = cu->mail + n % BACKEND_POSTS;
    const unsigned long long tag = (unsigned long long)(unsigned)n << 32;
    for (unsigned spin = 1;; spin++) {
        unsigned long long v = __atomic_load_n(slot, __ATOMIC_ACQUIRE);
        if ((v & ~0xffffffffull) == tag) return (int32_t)(unsigned)v;
        if (spin % 1024 == 0 && gpu_stream_done(cu->stream)) {
            v = __atomic_load_n(slot, __ATOMIC_ACQUIRE);
            CHECK((v & ~0xffffffffull) == tag); /* the stream ran without posting n: a bug */
            return (int32_t)(unsigned)v;
        }
    }
}

/* The rows' choices by a copy to pinned memory, an event after it: waiting for the event does
 * not wait for the step queued behind it. */
static int64_t op_rows_post(struct backend *be, const int32_t *src, int B) {
    struct cuda *cu = cuda_of(be);
    CHECK(!cu->capturing && B >= 1 && B <= BACKEND_ROWS_MAX);
    const int64_t n = ++cu->n_rows_posts;
    const int slot = (int)(n % BACKEND_POSTS);
    gpu_memcpy_d2h(cu->rows_mail + (size_t)slot * BACKEND_ROWS_MAX, src, (size_t)B * sizeof *src, cu->stream);
    gpu_event_record(cu->rows_ev[slot], cu->stream);
    return n;
}
static void op_rows_wait(struct backend *be, int64_t n, int32_t *out, int B) {
    struct cuda *cu = cuda_peek(be);
    CHECK(n >= 1 && n <= cu->n_rows_posts && n > cu->n_rows_posts - BACKEND_POSTS);
    CHECK(B >= 1 && B <= BACKEND_ROWS_MAX);
    const int slot = (int)(n % BACKEND_POSTS);
    gpu_event_sync(cu->rows_ev[slot]);
    memcpy(out, cu->rows_mail + (size_t)slot * BACKEND_ROWS_MAX, (size_t)B * sizeof *out);
}

static void op_warm(struct backend *be) {
    cuda_gemm_warm(cuda_of(be), be->max_T);
}

static void op_destroy(struct backend *be) {
    struct cuda *cu = cuda_of(be);
    gpu_stream_sync(cu->stream);
    for (int i = 0; i < cu->n_graphs; i++) gpu_graph_destroy(cu->graphs[i].graph, cu->graphs[i].exec);
    void *bufs[] = {cu->rope_cos, cu->rope_sin, cu->xn, cu->y, cu->attn_q, cu->attn_part, cu->flash_part,
                    cu->gdn_y, cu->gdn_qk, cu->gdn_bg, cu->gdn_o, cu->gdn_w, cu->gdn_kd, cu->gdn_u, cu->gdn_a,
                    cu->gdn_h, cu->gdn_vn, cu->gdn_sz, cu->early_cnt, cu->counters,
                    cu->argmax_part, cu->n_posts, cu->blas_ws, cu->trace, cu->ktrace};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
        if (bufs[i]) gpu_free(bufs[i]);
    for (int i = 0; i <= CUDA_PROF_MAX; i++) gpu_event_destroy(cu->prof.ev[i]);
    gpu_blas_destroy(cu->blas);
    free(cu->gemm_plans);
    gpu_host_free(cu->stage);
    gpu_host_free(cu->mail);
    gpu_host_free(cu->rows_mail);
    for (int i = 0; i < BACKEND_POSTS; i++) gpu_event_destroy(cu->rows_ev[i]);
    gpu_stream_destroy(cu->stream);
    free(cu);
    free(be);
}

static const struct backend_ops cuda_ops = {
    "cuda",
    op_destroy,
    op_alloc,
    op_free,
    op_upload,
    op_download,
    op_zero,
    op_copy,
    op_sync,
    op_mem_free,
    op_graph_replay,
    op_graph_begin,
    op_graph_end,
    op_graph_variant,
    op_embed,
    op_matmul,
    op_matmul_swiglu,
    op_attention,
    op_gdn,
    op_attention_rows,
    op_gdn_rows,
    op_argmax,
    op_argmax_rows,
    op_choice_wait,
    op_sample,
    op_logprobs,
    op_warm,
    op_rows_post,
    op_rows_wait,
};

static size_t max_sz(size_t a, size_t b) { return a > b ? a : b; }

extern "C" struct backend *backend_cuda_create(const struct config *c, int max_ctx, int max_T,
                                               struct error *err) {
    if (gpu_device_count() < 1) {
        error_set(err, "no CUDA device found (%s)", gpu_last_error_string());
        return NULL;
    }
    int H = c->hidden_size, I = c->intermediate_size, nH = c->num_attention_heads;
    int nKV = c->num_key_value_heads, hd = c->head_dim, Hk = c->linear_num_key_heads;
    int Hv = c->linear_num_value_heads, dk = c->linear_key_head_dim, dv = c->linear_value_head_dim;
    if (hd % 8 || hd > 256 || dk != dv || dk % 32 || dk > 128 || dk == 96 || Hv % Hk || H % 8 || I % 8 ||
        c->linear_conv_kernel_dim != 4 || c->rotary_dim % 16 || c->rotary_dim > hd ||
        nH % nKV || nH / nKV > 8 || Hk > 256) {
        error_set(err, "cuda backend: unsupported shape (head_dim %d, dk %d, dv %d, Hk %d, Hv %d, "
                       "conv kernel %d, rotary %d, nH %d, nKV %d)",
                  hd, dk, dv, Hk, Hv, c->linear_conv_kernel_dim, c->rotary_dim, nH, nKV);
        return NULL;
    }
    struct backend *be = (struct backend *)xcalloc(1, sizeof *be);
    struct cuda *cu = (struct cuda *)xcalloc(1, sizeof *cu);
    be->ops = &cuda_ops;
    be->config = c;
    be->max_ctx = max_ctx;
    be->max_T = max_T;
    be->async = 1;
    be->snap_align = cuda_gdn_chunk();
    be->impl = cu;
    gpu_get_info(&cu->info);
    gpu_stream_create(&cu->stream);
    /* the profiling switches (bench/README.md); a malformed value is reported and ignored */
    cu->pdl = env_int("STRATA_PDL", 1, 0, 1);
    cu->gemv_shape = -1; /* chosen per GEMV */
    cu->gemv_tail = 4;    /* run 85: R = 4 from 8 rounds (the lm_head); 2 and 8 gained less */
    cu->gemv_tail_min = 8;
    cu->gemv_wide = cuda_gemv_wide_shape(H);
    if (env_int("STRATA_TRACE", 0, 0, 1)) {
        cu->trace = (unsigned long long *)dev_alloc(cu, (size_t)CUDA_TRACE_JOBS * CUDA_TRACE_STRIDE * 8,
                                                    "the trace buffer");
        cu->ktrace = (unsigned long long *)dev_alloc(
            cu, (size_t)CUDA_KTRACE_JOBS * CUDA_KTRACE_STRIDE * 8, "the trace buffer");
    }
    cu->attn_short = 512; /* run 40: 512 and 1,024 alike at 301-350 tokens, 256 4% slower */
#ifdef STRATA_SM90A
    cu->flash_wg = cu->info.cc == 90;
    cu->bulk = cu->info.cc == 90;
#endif
    cu->attn_mode = -1;
    cu->skip = env_int("STRATA_SKIP_DECODE", 0, 0, 3); /* timing only: 1 gdn step, 2 attention */
    cu->stage = (uint8_t *)gpu_host_alloc(CUDA_STAGE_BYTES);
    cu->blas_ws_bytes = (size_t)32 << 20;
    cu->blas_ws = dev_alloc(cu, cu->blas_ws_bytes, "the cuBLAS workspace");
    gpu_blas_create(&cu->blas);
    for (int i = 0; i <= CUDA_PROF_MAX; i++) gpu_event_create(&cu->prof.ev[i]);

    /* RoPE tables exactly as the CPU backend computes them (fp32 inv_freq, fp32 angle,
     * cos/sin rounded to bf16), so both backends rotate with identical numbers */
    int half = c->rotary_dim / 2;
    if (half > 0) {
        size_t n = (size_t)max_ctx * half;
        uint16_t *hc = (uint16_t *)xmalloc(n * 2), *hs = (uint16_t *)xmalloc(n * 2);
        float *inv = (float *)xmalloc((size_t)half * sizeof(float));
        for (int j = 0; j < half; j++)
            inv[j] = 1.0f / powf((float)c->rope_theta, (float)(2 * j) / (float)c->rotary_dim);
        for (int p = 0; p < max_ctx; p++)
            for (int j = 0; j < half; j++) {
                float angle = (float)p * inv[j];
                hc[(size_t)p * half + j] = f32_to_bf16(cosf(angle));
                hs[(size_t)p * half + j] = f32_to_bf16(sinf(angle));
            }
        cu->rope_cos = (uint16_t *)dev_alloc(cu, n * 2, "the RoPE table");
        cu->rope_sin = (uint16_t *)dev_alloc(cu, n * 2, "the RoPE table");
        gpu_memcpy_h2d(cu->rope_cos, hc, n * 2, cu->stream);
        gpu_memcpy_h2d(cu->rope_sin, hs, n * 2, cu->stream);
        gpu_stream_sync(cu->stream);
        free(hc);
        free(hs);
        free(inv);
    }

    /* scratch */
    size_t T = (size_t)max_T;
    size_t max_K = max_sz(max_sz((size_t)H, (size_t)I), max_sz((size_t)c->value_dim, (size_t)nH * hd));
    size_t mix_rows = max_sz((size_t)c->conv_dim + c->value_dim + 2 * Hv, (size_t)2 * nH * hd + 2 * nKV * hd);
    size_t max_N = max_sz(max_sz((size_t)2 * I, mix_rows), (size_t)H);
    cu->xn_elems = T * max_K;
    cu->y_elems = T * max_N;
    cu->xn = (uint16_t *)dev_alloc(cu, cu->xn_elems * 2, "matmul scratch");
    cu->y = (uint16_t *)dev_alloc(cu, cu->y_elems * 2, "matmul scratch");
    cu->attn_q = (uint16_t *)dev_alloc(cu, T * nH * hd * 2, "attention scratch");
    int splits = (2 * cu->info.n_sm + nKV - 1) / nKV;
    if (splits > 256) splits = 256;
    cu->attn_splits = splits;
    cu->attn_part = (float *)dev_alloc(cu, (size_t)nH * splits * (hd + 4) * sizeof(float),
                                       "attention scratch");
    cu->flash_part_bytes = max_T > 1 ? cuda_flash_part_bytes(cu, c) : 0;
    if (cu->flash_part_bytes)
        cu->flash_part = (float *)dev_alloc(cu, cu->flash_part_bytes, "attention scratch");
    cu->gdn_y = (uint16_t *)dev_alloc(cu, T * c->conv_dim * 2, "deltanet scratch");
    cu->gdn_qk = (float *)dev_alloc(cu, T * 2 * Hk * dk * sizeof(float), "deltanet scratch");
    cu->gdn_bg = (float *)dev_alloc(cu, T * Hv * 2 * sizeof(float), "deltanet scratch");
    cu->gdn_o = (uint16_t *)dev_alloc(cu, T * Hv * dv * 2, "deltanet scratch");
    const size_t chunks = (T + 63) / 64;
    cu->gdn_w = (uint16_t *)dev_alloc(cu, chunks * Hv * 64 * dk * 4, "deltanet scratch");
    cu->gdn_kd = (uint16_t *)dev_alloc(cu, chunks * Hv * dk * 64 * 4, "deltanet scratch");
    cu->gdn_u = (float *)dev_alloc(cu, T * Hv * dv * sizeof(float), "deltanet scratch");
    cu->gdn_a = (float *)dev_alloc(cu, T * Hv * 64 * sizeof(float), "deltanet scratch");
    cu->gdn_h = (uint16_t *)dev_alloc(cu, chunks * Hv * dk * dv * 4, "deltanet scratch");
    cu->gdn_vn = (uint16_t *)dev_alloc(cu, chunks * Hv * dv * 64 * 4, "deltanet scratch");
    cu->gdn_sz = (float *)dev_alloc(cu, (size_t)Hv * dv * sizeof(float), "deltanet scratch");
    cu->early_cnt = (int *)dev_alloc(cu, 2 * CUDA_EARLY_SLOTS * sizeof(int), "counters");
    cu->counters = (int *)dev_alloc(cu, 256 * sizeof(int), "counters");
    cu->argmax_part = (float *)dev_alloc(cu, CUDA_ARGMAX_BLOCKS * 2 * sizeof(float), "argmax scratch");
    cu->sample_part = (float *)dev_alloc(cu, (size_t)(BACKEND_SAMPLE_VMAX / 4096) * (BACKEND_SAMPLE_KMAX + 1) * 2 * sizeof(float),
                                         "sample scratch");
    cu->n_posts = (unsigned *)dev_alloc(cu, sizeof(unsigned), "argmax posts");
    void *mail_dev = NULL;
    cu->mail = (unsigned long long *)gpu_host_alloc_mapped(BACKEND_POSTS * sizeof *cu->mail, &mail_dev);
    cu->mail_dev = (unsigned long long *)mail_dev;
    memset(cu->mail, 0, BACKEND_POSTS * sizeof *cu->mail);
    cu->rows_mail = (int32_t *)gpu_host_alloc((size_t)BACKEND_POSTS * BACKEND_ROWS_MAX * sizeof *cu->rows_mail);
    for (int i = 0; i < BACKEND_POSTS; i++) gpu_event_create_sync(&cu->rows_ev[i]);
    gpu_stream_sync(cu->stream);
    return be;
}
