/* The GPU library as a training program drives it (docs/example.c), on the
 * emulated GPU: cp_gpu_unshard / cp_gpu_reshard / cp_gpu_reduce_grads in
 * the order of the plan's own op list (SCHEDULE.md's order; each unshard at
 * its copy-out's place, as the library allows), with the caller's forward and backward as kernels on the
 * caller's stream that read every unsharded parameter of their unit and
 * write (then, on later micro-steps, read and write) its gradients. The
 * emulator's race detector then says whether the library's calls order the
 * caller's compute against the collectives and copies: a race, a refusal
 * or a mismatch between ranks fails the run (exit 3 or 1). Built per plan
 * with -DCP_PLAN=<name>_plan -DCP_KERNELS=<name>_kernels (Makefile,
 * build/emu/<plan>/library_run); launched like the plan's binary. */
#define _POSIX_C_SOURCE 200809L
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cp_gpu.h"

extern const cp_plan CP_PLAN;
extern const cp_gpu_kernels CP_KERNELS;

/* The caller's compute: what it reads and writes of the plan's buffers. */
typedef struct {
    const void *unsharded;
    size_t unsharded_bytes;
    void *grads;
    size_t grads_bytes;
    int accumulate;
} compute_args;

static void compute_body(const void *p)
{
    const compute_args *a = p;
    cudaEmuAccess(a->unsharded, a->unsharded_bytes, 0);
    if (!a->grads) return;
    if (a->accumulate) cudaEmuAccess(a->grads, a->grads_bytes, 0);
    cudaEmuAccess(a->grads, a->grads_bytes, 1);
    memset(a->grads, 0x3c, a->grads_bytes); /* a finite value in every float type */
}

int main(int argc, char **argv)
{
    int steps = argc > 1 ? atoi(argv[1]) : 2;
    /* split: the issue / wait calls at the plan's places, as the bridge
     * makes them: each unshard issued at its all-gather, waited at its
     * copy-out; each reduction issued at its pack, waited before the unit's
     * next reduction and at the step's end (FSDP2's final callback). */
    int split = argc > 2 && strncmp(argv[2], "split", 5) == 0;
    /* split-early: a wrong order, the next unit's unshard issued before this
     * unit's copy-out (its all-gather would reuse the bytes still holding
     * this one's): the library must refuse it on every rank. */
    int early = argc > 2 && strcmp(argv[2], "split-early") == 0;
    cp_launch_env env;
    char err[512];
    /* As docs/example.c: NCCL_COMM_ID set before any thread starts. */
    if (cp_launch_from_env(&env, getenv, err, sizeof err) != 0 || cp_launch_export_comm_id(&env, err, sizeof err) != 0) {
        fprintf(stderr, "%s\n", err);
        return 2;
    }
    cp_gpu *g;
    if (cp_gpu_init(&g, &CP_PLAN, &CP_KERNELS, &env, err, sizeof err) != 0) {
        fprintf(stderr, "%s\n", err);
        return 2;
    }
    const cp_plan *p = cp_gpu_executor(g)->plan; /* this rank's view */
    cudaStream_t s;
    if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) return 2;
    int calls = 0, computes = 0;
    for (int step = 0; step < steps; step++) {
        for (int i = 0; i < p->nops; i++) {
            const cp_op *op = &p->ops[i];
            int u = op->unit, rc = 0;
            switch (op->kind) {
            /* cp_gpu_unshard does copy-in, all-gather and copy-out in one call:
             * at the copy-out's place, after the reshard whose bytes it reuses
             * (a prefetch at the copy-in's place is refused). */
            case CP_OP_ALL_GATHER:
                if (split) rc = cp_gpu_unshard_issue(g, u, s), calls++;
                break;
            case CP_OP_COPY_OUT:
                for (int j = i + 1; early && j < p->nops; j++)
                    if (p->ops[j].kind == CP_OP_ALL_GATHER && p->ops[j].unit != u) {
                        rc = cp_gpu_unshard_issue(g, p->ops[j].unit, s);
                        break;
                    }
                if (rc == 0) rc = split ? cp_gpu_unshard_wait(g, u, s) : cp_gpu_unshard(g, u, s);
                calls++;
                break;
            case CP_OP_RESHARD: rc = cp_gpu_reshard(g, u, s); calls++; break;
            case CP_OP_PACK:
                if (split) rc = cp_gpu_reduce_wait(g, u, s) || cp_gpu_reduce_issue(g, u, s);
                else rc = cp_gpu_reduce_grads(g, u, s);
                calls++;
                break;
            case CP_OP_FORWARD:
            case CP_OP_BACKWARD: {
                const cp_unit *U = &p->units[u];
                compute_args a = { cp_gpu_unsharded(g, U->first_param), cp_gpu_buffer_bytes(g, u, CP_BUF_UNSHARDED),
                                   NULL, 0, 0 };
                if (op->kind == CP_OP_BACKWARD) {
                    a.grads = cp_gpu_grad(g, U->first_param);
                    a.grads_bytes = cp_gpu_buffer_bytes(g, u, CP_BUF_GRADS);
                    a.accumulate = op->micro_step > 0;
                }
                if (cudaEmuLaunchKernel(s, op->kind == CP_OP_FORWARD ? "caller's forward" : "caller's backward",
                                        compute_body, &a, sizeof a, offsetof(compute_args, grads), 1) != cudaSuccess)
                    rc = -1;
                computes++;
                break;
            }
            default: break;
            }
            if (rc != 0) {
                fprintf(stderr, "commplan: library run of %s: op %d (%s of %s): %s\n", p->name, i,
                        cp_op_kind_name(op->kind), p->units[u].name, cp_gpu_last_error(g));
                cp_gpu_destroy(g);
                return 1;
            }
        }
        for (int u = 0; split && u < p->nunits; u++)
            if (cp_gpu_reduce_wait(g, u, s) != 0) {
                fprintf(stderr, "commplan: %s\n", cp_gpu_last_error(g));
                cp_gpu_destroy(g);
                return 1;
            }
        if (cp_gpu_synchronize(g, s, 60.0) != 0) {
            fprintf(stderr, "commplan: %s\n", cp_gpu_last_error(g));
            cp_gpu_destroy(g);
            return 1;
        }
    }
    printf("%s rank %d: %slibrary calls in the plan's order for %d step(s): %d calls, %d compute kernels\n", p->name,
           cp_gpu_rank(g), split ? "split " : "", steps, calls, computes);
    cudaStreamDestroy(s);
    cp_gpu_destroy(g);
    return 0;
}
