/* The C face of a plan's generated copy kernels (plan_kernels.cu). */
#ifndef COMMPLAN_GPU_KERNELS_H
#define COMMPLAN_GPU_KERNELS_H

#include "commplan.h"

#ifdef __cplusplus
extern "C" {
#endif

enum cp_kernel_op {
    CP_KERNEL_COPY_IN = 0,
    CP_KERNEL_COPY_OUT = 1,
    CP_KERNEL_PACK = 2,
    CP_KERNEL_VIEW_OUT = 3,
    CP_KERNEL_VIEW_OUT_ADD = 4, /* the view-out adding into the sharded grads */
    CP_KERNEL_FLAT_COPY = 5,    /* total elements of the reduce dtype, bits untouched (partial_save) */
    CP_KERNEL_FLAT_ADD = 6,     /* out += in, total elements, added in the reduce dtype (partial_add, _fold) */
    CP_KERNEL_COUNT
};

typedef struct {
    /* Enqueue one unit's copy, with the tables of TP class tp_class (0
     * without TP), on a cudaStream_t; returns a cudaError_t. part_first,
     * part_count: a part of the unit's parameters (a partial reduction's
     * pack and view-out, cp_op.part_first / part_count; 0, 0: the whole unit). */
    int (*launch)(int tp_class, int op, int unit, int part_first, int part_count, int shard_rank, const void *in,
                  void *out, void *stream);
    /* The same group bodies run on the CPU over host buffers (tests). */
    int (*emulate)(int tp_class, int op, int unit, int part_first, int part_count, int shard_rank, const void *in,
                   void *out);
    /* Builds the device copy of a class's tables; called once before the
     * first launch (cp_gpu_init does), never during a graph capture. 0 or a cudaError_t. */
    int (*prepare)(int tp_class);
} cp_gpu_kernels;

/* The kernels themselves (runtime/cp_kernels.cu, compiled once), for any
 * plan's tables; a plan's generated plan_kernels.cu binds them to its name. */
int cp_kernels_prepare(const cp_plan *plan, int tp_class);
int cp_kernels_launch(const cp_plan *plan, int tp_class, int op, int unit, int part_first, int part_count,
                      int shard_rank, const void *in, void *out, void *stream);
int cp_kernels_emulate(const cp_plan *plan, int tp_class, int op, int unit, int part_first, int part_count,
                       int shard_rank, const void *in, void *out);

#ifdef __cplusplus
}
#endif
#endif
