/* make bench-host: the host backend's copies and reductions in GB/s beside a
 * plain memcpy in the same run, and the per-element path they replaced
 * (cp_load / cp_store / cp_reduce_arith per element, as the backend ran
 * them before), one thread. Bytes counted: every byte read plus every byte
 * written (a memcpy of B bytes moves 2B). Usage: host_bench [Melements]. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "commplan.h"
#include "host.h"

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static double memcpy_gbs;

static void report(const char *what, double bytes, double secs)
{
    double gbs = bytes / secs / 1e9;
    printf("| %-58s | %8.0f | %7.3f | %6.2f | %5.0f%% |\n", what, bytes / 1e6, secs, gbs, 100.0 * gbs / memcpy_gbs);
}

/* The best of three runs of f. */
#define TIME(secs, f)                                                                                                  \
    do {                                                                                                               \
        secs = 1e30;                                                                                                   \
        for (int rep_ = 0; rep_ < 3; rep_++) {                                                                         \
            double t0_ = now();                                                                                        \
            f;                                                                                                         \
            double d_ = now() - t0_;                                                                                   \
            if (d_ < secs) secs = d_;                                                                                  \
        }                                                                                                              \
    } while (0)

int main(int argc, char **argv)
{
    int64_t n = (argc > 1 ? atoll(argv[1]) : 16) * 1000000; /* elements of one shard slot */
    enum { W = 4 };
    size_t big = (size_t)n * W * 4;
    char *a = malloc(big), *b = malloc(big), *c = malloc(big), *m[W];
    if (!a || !b || !c) { fprintf(stderr, "host_bench: out of memory\n"); return 2; }
    for (size_t i = 0; i < big; i++) a[i] = (char)(i * 2654435761u >> 13), b[i] = (char)i, c[i] = 0;
    for (int64_t i = 0; i < n * W; i++) ((float *)a)[i] = (float)(i % 1000) * 0.37f; /* finite, ordinary values */
    double s;
    printf("host_bench: %lld elements a shard slot, %d members, one thread\n\n", (long long)n, W);
    printf("| %-58s | %8s | %7s | %6s | %6s |\n", "operation", "MB moved", "seconds", "GB/s", "of memcpy");
    printf("|%s|%s|%s|%s|%s|\n", "------------------------------------------------------------", "----------",
           "---------", "--------", "--------");
    TIME(s, memcpy(b, a, (size_t)n * 4));
    memcpy_gbs = 2.0 * (double)n * 4 / s / 1e9;
    report("memcpy (fp32 slot)", 2.0 * (double)n * 4, s);

    /* A one-unit plan: one parameter of W x n elements, Shard(0). */
    cp_param prm = { .name = "w", .ndim = 1, .shape = { n * W }, .numel = n * W, .chunk = n, .outer = 1, .run = n,
                     .padded = n };
    cp_unit U = { .name = "u", .nparams = 1, .total = n, .numel = n * W, .grads_numel = n * W,
                  .orig_dtype = CP_FP32, .ag_dtype = CP_BF16, .reduce_dtype = CP_FP32, .grad_dtype = CP_FP32,
                  .rs_op = CP_AVG, .ar_op = CP_AVG, .pre_divide = 1.0, .post_divide = 1.0 };
    cp_plan p = { .name = "bench", .fingerprint = "0", .world_size = 1, .mesh_ndim = 1, .mesh_sizes = { 1 },
                  .shard_size = W, .replicate_size = 1, .shard_family = -1, .replicate_family = -1, .micro_steps = 1,
                  .nunits = 1, .units = &U, .nparams = 1, .params = &prm, .nevents = 1, .tp_size = 1,
                  .tp_mesh_dim = -1 };
    cp_host_world *w = cp_host_world_create(&p);
    cp_backend be;
    cp_host_backend_init(&be, w, 0);
    double fp = (double)n * 4, hp = (double)n * 2;

    TIME(s, be.copy(&be, 0, 0, 0, 0, CP_STREAM_COMPUTE, a, b));
    report("copy-in fp32 -> bf16 (cast)", fp + hp, s);
    TIME(s, for (int64_t i = 0; i < n; i++) cp_store(CP_BF16, b, i, cp_load(CP_FP32, a, i)));
    report("  per-element path before (cp_load/cp_store)", fp + hp, s);
    U.ag_dtype = CP_FP32;
    TIME(s, be.copy(&be, 0, 0, 0, 0, CP_STREAM_COMPUTE, a, b));
    report("copy-in fp32 -> fp32 (memcpy)", 2 * fp, s);
    U.ag_dtype = CP_BF16;
    TIME(s, be.copy(&be, 1, 0, 0, 0, CP_STREAM_COMPUTE, a, b));
    report("copy-out bf16, 4 slots", 2 * W * hp, s);
    TIME(s, be.copy(&be, 2, 0, 0, 0, CP_STREAM_COMPUTE, a, b));
    report("pack fp32 -> fp32, 4 slots (memcpy)", 2 * W * fp, s);
    U.pre_divide = 4.0;
    TIME(s, be.copy(&be, 2, 0, 0, 0, CP_STREAM_COMPUTE, a, b));
    report("pack fp32 -> fp32 with pre-divide, 4 slots", 2 * W * fp, s);
    U.grad_dtype = CP_BF16;
    U.reduce_dtype = CP_BF16;
    TIME(s, be.copy(&be, 2, 0, 0, 0, CP_STREAM_COMPUTE, a, b));
    report("pack bf16 -> bf16 with pre-divide, 4 slots", 2 * W * hp, s);
    TIME(s, for (int64_t i = 0; i < n * W; i++) {
        float v = cp_load(CP_BF16, a, i);
        v = cp_bf16_to_float(cp_float_to_bf16(v));
        cp_store(CP_BF16, b, i, (float)(v / 4.0));
    });
    report("  per-element path before", 2 * W * hp, s);
    U.grad_dtype = CP_FP32;
    U.reduce_dtype = CP_FP32;
    U.pre_divide = 1.0;
    TIME(s, be.copy(&be, 3, 0, 0, 0, CP_STREAM_COMPUTE, a, b));
    report("view-out fp32 -> fp32", 2 * fp, s);
    U.post_divide = 4.0;
    TIME(s, be.copy(&be, 3, 0, 0, 0, CP_STREAM_COMPUTE, a, b));
    report("view-out fp32 -> fp32 with post-divide", 2 * fp, s);
    U.orig_dtype = CP_BF16;
    TIME(s, be.copy(&be, 4, 0, 0, 0, CP_STREAM_COMPUTE, a, b));
    report("view-out adding fp32 -> bf16 with post-divide", fp + 2 * hp, s);
    U.orig_dtype = CP_FP32;
    U.post_divide = 1.0;
    TIME(s, be.copy(&be, 6, 0, 0, 0, CP_STREAM_COMPUTE, a, b));
    report("flat add fp32", 3 * fp, s);

    /* Reductions as the backend runs them: W members' slots, one chain run at a time. */
    for (int k = 0; k < W; k++) m[k] = a + (size_t)k * n * 4;
    static const struct { cp_arith a; cp_dtype t; cp_reduce_op op; const char *name; } R[] = {
        { CP_ARITH_GLOO, CP_FP32, CP_AVG, "reduce-scatter slot, gloo fp32 avg, 4 members" },
        { CP_ARITH_GLOO, CP_FP32, CP_SUM, "reduce-scatter slot, gloo fp32 sum, 4 members" },
        { CP_ARITH_GLOO, CP_BF16, CP_SUM, "reduce-scatter slot, gloo bf16 sum, 4 members" },
        { CP_ARITH_NCCL, CP_FP32, CP_AVG, "reduce-scatter slot, nccl fp32 avg, 4 members" },
        { CP_ARITH_NCCL, CP_FP32, CP_SUM, "reduce-scatter slot, nccl fp32 sum, 4 members" },
        { CP_ARITH_GLOO, CP_FP32, CP_MAX, "reduce-scatter slot, fp32 max, 4 members" },
    };
    for (size_t r = 0; r < sizeof R / sizeof R[0]; r++) {
        double bytes = (double)(W + 1) * (double)n * (double)cp_dtype_size(R[r].t);
        TIME(s, {
            int64_t end;
            const void *at[W];
            for (int64_t i = 0; i < n; i = end) {
                int key = cp_reduce_scatter_key_run(R[r].a, R[r].t, 1, i, n, W, &end);
                for (int k = 0; k < W; k++) at[k] = m[k] + (size_t)i * cp_dtype_size(R[r].t);
                cp_reduce_arith_n(R[r].a, R[r].t, R[r].op, at, W, key, end - i, c + (size_t)i * cp_dtype_size(R[r].t));
            }
        });
        report(R[r].name, bytes, s);
        if (r == 0 || r == 3) {
            TIME(s, {
                float v[W];
                for (int64_t i = 0; i < n; i++) {
                    for (int k = 0; k < W; k++) v[k] = cp_load(R[r].t, m[k], i);
                    int key = cp_reduce_scatter_key(R[r].a, R[r].t, 1, i, n, W);
                    cp_store(R[r].t, c, i, cp_reduce_arith(R[r].a, R[r].t, R[r].op, v, W, key));
                }
            });
            report("  per-element path before (a key per element)", bytes, s);
        }
    }
    cp_host_world_destroy(w);
    free(a);
    free(b);
    free(c);
    return 0;
}
