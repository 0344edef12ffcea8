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

static int run_timing(cp_gpu *g, const cp_plan *p, const cp_gpu_run_options *o, cudaStream_t S)
{
    cudaEvent_t t0, t1;
    if (cudaEventCreate(&t0) != cudaSuccess || cudaEventCreate(&t1) != cudaSuccess) {
        fprintf(stderr, "commplan: cudaEventCreate failed\n");
        return 2;
    }
    int iters = o->iters > 0 ? o->iters : 1;
    for (int i = 0; i < o->warmup; i++)
        if (cp_gpu_step(g, S)) goto fail;
    if (cp_gpu_synchronize(g, S, o->timeout_s)) goto fail;
    double host = 0.0;
    cudaEventRecord(t0, S);
    for (int i = 0; i < iters; i++) {
        double h0 = now_us();
        if (cp_gpu_step(g, S)) goto fail;
        host += now_us() - h0;
    }
    cudaEventRecord(t1, S);
    if (cp_gpu_synchronize(g, S, o->timeout_s)) goto fail;
    float ms = 0.0f;
    cudaEventElapsedTime(&ms, t0, t1);
    printf("# %s rank %d: %d ops per step\n", p->name, cp_gpu_rank(g), p->nops);
    printf("step (eager):  %10.3f ms on the GPU, %10.1f us host enqueue\n", ms / iters, host / iters);
    if (o->graph) {
        if (cp_gpu_graph_capture(g, S)) goto fail;
        for (int i = 0; i < o->warmup; i++)
            if (cp_gpu_graph_launch(g, S)) goto fail;
        if (cp_gpu_synchronize(g, S, o->timeout_s)) goto fail;
        host = 0.0;
        cudaEventRecord(t0, S);
        for (int i = 0; i < iters; i++) {
            double h0 = now_us();
            if (cp_gpu_graph_launch(g, S)) goto fail;
            host += now_us() - h0;
        }
        cudaEventRecord(t1, S);
        if (cp_gpu_synchronize(g, S, o->timeout_s)) goto fail;
        cudaEventElapsedTime(&ms, t0, t1);
        printf("step (graph):  %10.3f ms on the GPU, %10.1f us host launch\n", ms / iters, host / iters);
    }
    if (cp_gpu_bench_ops(g, S, o->warmup, iters, stdout)) goto fail;
    cudaEventDestroy(t0);
    cudaEventDestroy(t1);
    return 0;
fail:
    fprintf(stderr, "commplan: %s\n", cp_gpu_last_error(g));
    cudaEventDestroy(t0);
    cudaEventDestroy(t1);
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
