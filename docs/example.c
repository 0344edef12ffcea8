/* Driving a generated plan from a training program: one rank per process
 * (launch with torchrun or srun), FSDP-style unshard / reduce around the
 * caller's own forward and backward on the caller's stream.
 *
 *   make PLAN=single.lua
 *   cc -std=c11 -Iruntime -Iplans/single -I/usr/local/cuda/include docs/example.c \
 *      build/single/libsingle.a -L/usr/local/cuda/lib64 -L/usr/local/cuda/lib -lcudart -lnccl -lstdc++ -lm -o example
 */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#include "cp_gpu.h"
#include "plan.h"

extern const cp_gpu_kernels single_kernels;

int main(void)
{
    cp_launch_env env;
    char err[512];
    /* NCCL_COMM_ID as the launch needs it, set before any thread starts
     * (cp_gpu_init only checks it: a library never writes the environment). */
    if (cp_launch_from_env(&env, getenv, err, sizeof err) != 0 || cp_launch_export_comm_id(&env, err, sizeof err) != 0) {
        fprintf(stderr, "%s\n", err);
        return 2;
    }
    cp_gpu *g;
    if (cp_gpu_init(&g, &single_plan, &single_kernels, &env, err, sizeof err) != 0) {
        fprintf(stderr, "%s\n", err);
        return 2;
    }
    cudaStream_t s;
    if (cudaStreamCreate(&s) != cudaSuccess) return 2;

    /* The optimizer owns the shards: write initial values into them. */
    float *w = cp_gpu_sharded(g, SINGLE_PARAM_BLOCK_W);
    if (cudaMemsetAsync(w, 0, 15 * sizeof(float), s) != cudaSuccess) return 2;

    /* FSDP2's order, which the plan's memory arena assumes (SCHEDULE.md
     * lists it): each unit resharded after its forward unless the plan
     * keeps it (the root), unsharded again for its backward. */
    for (int u = 0; u < SINGLE_UNIT_COUNT; u++) {
        if (cp_gpu_unshard(g, u, s) != 0) goto fail;
        /* ... forward of unit u reads cp_gpu_unsharded(g, param) on s ... */
        if (single_plan.units[u].reshard_after_forward && cp_gpu_reshard(g, u, s) != 0) goto fail;
    }
    for (int u = SINGLE_UNIT_COUNT - 1; u >= 0; u--) {
        if (single_plan.units[u].reshard_after_forward && cp_gpu_unshard(g, u, s) != 0) goto fail;
        /* ... backward of unit u writes cp_gpu_grad(g, param) on s (accumulates on later micro-steps) ... */
        /* FSDP2's post-backward: reshard, then reduce-scatter (the plan's
         * arena may give the reduce-scatter input the unsharded bytes). */
        if (cp_gpu_reshard(g, u, s) != 0) goto fail;
        if (cp_gpu_reduce_grads(g, u, s) != 0) goto fail;
    }
    if (cp_gpu_synchronize(g, s, 60.0) != 0) goto fail;
    /* cp_gpu_sharded_grad(g, param) now holds this rank's reduced gradient shard. */
    printf("rank %d: step done\n", cp_gpu_rank(g));
    cp_gpu_destroy(g);
    return 0;
fail:
    fprintf(stderr, "%s\n", cp_gpu_last_error(g));
    cp_gpu_destroy(g);
    return 1;
}
