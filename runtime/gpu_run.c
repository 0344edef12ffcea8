/* --check and timing on the GPU for the local rank. */
#define _POSIX_C_SOURCE 200809L
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpu_run.h"

typedef struct {
    cp_checker check;
    void *host; /* scratch as large as the largest unit buffer */
    int error;
} check_state;

enum { K_SHARDED = 0, K_UNSHARDED = 1, K_GRADS = 2, K_SHARDED_GRADS = 3 };

static int check_compute(void *user, cp_gpu *g, const cp_op *op, void *stream)
{
    check_state *cs = user;
    (void)stream;
    if (cp_gpu_download(g, op->unit, K_UNSHARDED, cs->host)) { cs->error = 1; return -1; }
    cp_checker_check_unsharded(&cs->check, op->unit, cs->host,
                               op->kind == CP_OP_FORWARD ? "unsharded param in forward" : "unsharded param in backward");
    if (op->kind == CP_OP_BACKWARD) {
        if (cp_gpu_download(g, op->unit, K_GRADS, cs->host)) { cs->error = 1; return -1; }
        cp_checker_add_grads(&cs->check, op->unit, op->micro_step, cs->host);
        if (cp_gpu_upload(g, op->unit, K_GRADS, cs->host)) { cs->error = 1; return -1; }
    }
    return 0;
}

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return 1e6 * (double)ts.tv_sec + 1e-3 * (double)ts.tv_nsec;
}

static int run_check(cp_gpu *g, const cp_plan *p, const cp_gpu_run_options *o, cudaStream_t S)
{
    check_state cs;
    memset(&cs, 0, sizeof cs);
    size_t biggest = 0;
    for (int u = 0; u < p->nunits; u++)
        for (int kind = 0; kind < 4; kind++)
            if (cp_gpu_buffer_bytes(g, u, kind) > biggest) biggest = cp_gpu_buffer_bytes(g, u, kind);
    cs.host = malloc(biggest ? biggest : 1);
    if (!cs.host || cp_checker_init(&cs.check, p, o->pattern, cp_gpu_rank(g)) != 0) {
        fprintf(stderr, "commplan: out of host memory for --check\n");
        free(cs.host);
        return 2;
    }
    int rc = 0;
    cp_gpu_set_compute(g, check_compute, &cs);
    for (int s = 0; s < o->steps && rc == 0; s++) {
        cs.check.step = s;
        for (int u = 0; u < p->nunits && rc == 0; u++) {
            cp_checker_fill_shards(&cs.check, u, cs.host);
            if (cp_gpu_upload(g, u, K_SHARDED, cs.host)) rc = 2;
        }
        if (rc == 0 && (cp_gpu_step(g, S) || cp_gpu_synchronize(g, S, o->timeout_s) || cs.error)) rc = 2;
        for (int u = 0; u < p->nunits && rc == 0; u++) {
            if (cp_gpu_download(g, u, K_SHARDED_GRADS, cs.host)) rc = 2;
            else cp_checker_check_grads(&cs.check, u, cs.host);
        }
    }
    if (rc == 2) fprintf(stderr, "commplan: %s\n", cp_gpu_last_error(g));
    else if (cs.check.mismatches) {
        fprintf(stderr, "commplan: %s rank %d: %ld mismatching elements\n", p->name, cp_gpu_rank(g), cs.check.mismatches);
        rc = 1;
    } else if (!o->quiet)
        printf("%s rank %d: --check passed for %d step(s): unsharded params and reduced grads exact\n", p->name,
               cp_gpu_rank(g), o->steps);
    cp_gpu_set_compute(g, NULL, NULL);
    cp_checker_free(&cs.check);
    free(cs.host);
    return rc;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Host time to issue one step (fn) from an idle GPU: the median over
 * iters, each started after a synchronize so the launch queue never fills
 * and the figure is the host's own cost, not the GPU's pace. */
static int host_us(cp_gpu *g, int (*fn)(cp_gpu *, void *), cudaStream_t S, int iters, double timeout_s, double *out)
{
    double *t = malloc((size_t)iters * sizeof *t);
    if (!t) return -1;
    for (int i = 0; i < iters; i++) {
        if (cp_gpu_synchronize(g, S, timeout_s)) { free(t); return -1; }
        double h0 = now_us();
        if (fn(g, S)) { free(t); return -1; }
        t[i] = now_us() - h0;
    }
    qsort(t, (size_t)iters, sizeof *t, cmp_double);
    *out = t[iters / 2];
    free(t);
    return cp_gpu_synchronize(g, S, timeout_s);
}

/* GPU time per step, steps issued back to back. */
static int gpu_ms(cp_gpu *g, int (*fn)(cp_gpu *, void *), cudaStream_t S, int iters, double timeout_s, double *out)
{
    cudaEvent_t t0, t1;
    if (cudaEventCreate(&t0) != cudaSuccess) return -1;
    if (cudaEventCreate(&t1) != cudaSuccess) { cudaEventDestroy(t0); return -1; }
    int rc = -1;
    float ms = 0.0f;
    if (cudaEventRecord(t0, S) != cudaSuccess) goto out;
    for (int i = 0; i < iters; i++)
        if (fn(g, S)) goto out;
    if (cudaEventRecord(t1, S) != cudaSuccess || cp_gpu_synchronize(g, S, timeout_s) ||
        cudaEventElapsedTime(&ms, t0, t1) != cudaSuccess)
        goto out;
    *out = ms / iters;
    rc = 0;
out:
    cudaEventDestroy(t0);
    cudaEventDestroy(t1);
    return rc;
}

static int step_fn(cp_gpu *g, void *s) { return cp_gpu_step(g, s); }
static int graph_fn(cp_gpu *g, void *s) { return cp_gpu_graph_launch(g, s); }

static int run_timing(cp_gpu *g, const cp_plan *p, const cp_gpu_run_options *o, cudaStream_t S)
{
    int iters = o->iters > 0 ? o->iters : 1;
    double ms, us;
    for (int i = 0; i < o->warmup; i++)
        if (cp_gpu_step(g, S)) goto fail;
    if (cp_gpu_synchronize(g, S, o->timeout_s)) goto fail;
    printf("# %s rank %d: %d ops per step, %d units%s\n", p->name, cp_gpu_rank(g), p->nops, p->nunits,
           cp_gpu_is_standin(g) ? "; stand-in: one-rank communicators, GPU times are not the plan's" : "");
    printf("# host: median time to issue one step from an idle GPU; GPU: steps back to back\n");
    if (gpu_ms(g, step_fn, S, iters, o->timeout_s, &ms) || host_us(g, step_fn, S, iters, o->timeout_s, &us)) goto fail;
    printf("step (eager):  %10.3f ms on the GPU, %10.1f us host enqueue\n", ms, us);
    {
        /* Where the eager host time goes: per op kind, mean over iters. */
        double by_kind[CP_OP_KIND_COUNT + 1] = { 0 };
        int n_kind[CP_OP_KIND_COUNT] = { 0 };
        for (int i = 0; i < p->nops; i++) n_kind[p->ops[i].kind]++;
        for (int i = 0; i < iters; i++) {
            if (cp_gpu_synchronize(g, S, o->timeout_s) || cp_gpu_step_profiled(g, S, by_kind)) goto fail;
        }
        if (cp_gpu_synchronize(g, S, o->timeout_s)) goto fail;
        printf("# host issue time by op kind (eager, mean per step)\n#   %-15s %6s %10s %10s\n", "kind", "ops",
               "us/step", "us/op");
        for (int k = 0; k <= CP_OP_KIND_COUNT; k++) {
            if (k < CP_OP_KIND_COUNT && n_kind[k] == 0) continue;
            double per = by_kind[k] / iters;
            printf("    %-15s %6d %10.1f %10.2f\n", k < CP_OP_KIND_COUNT ? cp_op_kind_name((cp_op_kind)k) : "fork/join",
                   k < CP_OP_KIND_COUNT ? n_kind[k] : 1, per, per / (k < CP_OP_KIND_COUNT ? n_kind[k] : 1));
        }
    }
    if (o->graph) {
        if (cp_gpu_graph_capture(g, S)) goto fail;
        for (int i = 0; i < o->warmup; i++)
            if (cp_gpu_graph_launch(g, S)) goto fail;
        if (cp_gpu_synchronize(g, S, o->timeout_s)) goto fail;
        if (gpu_ms(g, graph_fn, S, iters, o->timeout_s, &ms) || host_us(g, graph_fn, S, iters, o->timeout_s, &us))
            goto fail;
        printf("step (graph):  %10.3f ms on the GPU, %10.1f us host launch\n", ms, us);
    }
    if (cp_gpu_bench_ops(g, S, o->warmup, iters, stdout)) goto fail;
    return 0;
fail:
    fprintf(stderr, "commplan: %s\n", cp_gpu_last_error(g)[0] ? cp_gpu_last_error(g) : "CUDA event or host memory failure");
    return 2;
}

int cp_gpu_run(const cp_plan *p, const cp_gpu_kernels *k, const cp_launch_env *env, const cp_gpu_run_options *o)
{
    cp_gpu *g;
    char err[512];
    if (cp_gpu_init(&g, p, k, env, err, sizeof err) != 0) {
        fprintf(stderr, "commplan: %s\n", err);
        return 2;
    }
    cudaStream_t S;
    if (cudaStreamCreateWithFlags(&S, cudaStreamNonBlocking) != cudaSuccess) {
        fprintf(stderr, "commplan: rank %d: cudaStreamCreate failed\n", env->rank);
        cp_gpu_destroy(g);
        return 2;
    }
    int rc = o->check ? run_check(g, p, o, S) : run_timing(g, p, o, S);
    cudaStreamDestroy(S);
    cp_gpu_destroy(g);
    return rc;
}
