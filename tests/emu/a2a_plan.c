/* Hand-written tables for the GPU path's expert-parallel all-to-alls on the
 * emulator (tests/emu_check.sh), as tests/c/test_a2a.c writes them for the
 * host backend: 4 ranks on one mesh dim "ep", one MoE unit with 2 experts
 * per member, bf16 rows of 8 elements, 6 rows of capacity per member, two
 * micro-steps. Per micro-step m: counts (slot m), dispatch, combine; then
 * the backward in reverse micro-step order: the combine's gradient (a
 * dispatch by m's counts) and the dispatch's gradient (a combine). No copy
 * ops: the kernels below are never launched. Built into build/emu/a2a_ep4
 * with runtime/main.c (-DCP_PLAN=a2a_ep4_plan). */
#include "commplan.h"
#include "cp_gpu_kernels.h"

#define EP 4
#define EPP 2
#define DIM 8
#define CAP 6
#define COUNTS_BYTES (2 * 2 * EP * EPP * 8)     /* 256: two slots of [sent][received] int64 */
#define TOKEN_BYTES (EP * CAP * DIM * 2)         /* 384 bf16 */
#define SEND_AT COUNTS_BYTES                     /* 256 */
#define RECV_AT (SEND_AT + 512)                  /* 256-byte aligned */

static const cp_group_family families[1] = { { .name = "ep", .axis_mask = 0x1u, .size = EP } };

static const cp_unit units[1] = {
    { .name = "moe", .orig_dtype = CP_BF16, .ag_dtype = CP_BF16, .reduce_dtype = CP_BF16, .grad_dtype = CP_BF16,
      .pre_divide = 1.0, .post_divide = 1.0, .a2a_numel = EP * CAP * DIM, .a2a_slots = 2, .a2a_experts = EP * EPP,
      .arena_offset = { [CP_BUF_A2A_COUNTS] = 0, [CP_BUF_A2A_SEND] = SEND_AT, [CP_BUF_A2A_RECV] = RECV_AT } },
};

#define A2A(k, micro, counts_op, combine)                                                                         \
    { .kind = k, .unit = 0, .family = 0, .stream = CP_STREAM_COMPUTE, .dtype = CP_BF16,                          \
      .count = k == CP_OP_A2A_COUNTS ? EPP : CAP * DIM, .micro_step = micro, .event = -1, .peer = -1,           \
      .a2a_experts = EPP, .a2a_slot = micro, .a2a_counts_op = counts_op, .a2a_combine = combine, .a2a_dim = DIM,    \
      .a2a_capacity = CAP, .a2a_rows = 16 }

static const cp_op ops[10] = {
    A2A(CP_OP_A2A_COUNTS, 0, -1, 0), A2A(CP_OP_A2A, 0, 0, 0), A2A(CP_OP_A2A, 0, 0, 1), /* a forward's counts name no op */
    A2A(CP_OP_A2A_COUNTS, 1, -1, 0), A2A(CP_OP_A2A, 1, 3, 0), A2A(CP_OP_A2A, 1, 3, 1),
    A2A(CP_OP_A2A, 1, 3, 0),        A2A(CP_OP_A2A, 1, 3, 1), /* micro-step 1's backward first */
    A2A(CP_OP_A2A, 0, 0, 0),        A2A(CP_OP_A2A, 0, 0, 1),
};

static const int waits[1] = { 0 };

const cp_plan a2a_ep4_plan = {
    .name = "a2a_ep4", .fingerprint = "a2a0000000000004", .world_size = EP, .mesh_ndim = 1,
    .mesh_names = { "ep" }, .mesh_sizes = { EP }, .shard_size = 1, .replicate_size = 1, .shard_family = -1,
    .replicate_family = -1, .micro_steps = 2, .nunits = 1, .units = units, .nparams = 0, .params = 0,
    .nfamilies = 1, .families = families, .nops = 10, .ops = ops, .arena_bytes = RECV_AT + TOKEN_BYTES,
    .nevents = 0, .nwaits = 0, .waits = waits, .tp_size = 1, .tp_mesh_dim = -1, .nclasses = 0, .pp_size = 1,
    .pp_mesh_dim = -1, .pp_family = -1,
};

/* No copy ops in these tables: a launch would be a table error. */
static int no_kernel(int tp_class, int op, int unit, int part_first, int part_count, int shard_rank, const void *in,
                     void *out, void *stream)
{
    (void)tp_class, (void)op, (void)unit, (void)part_first, (void)part_count, (void)shard_rank, (void)in, (void)out,
        (void)stream;
    return 1; /* cudaErrorInvalidValue */
}

static int no_emulate(int tp_class, int op, int unit, int part_first, int part_count, int shard_rank, const void *in,
                      void *out)
{
    return no_kernel(tp_class, op, unit, part_first, part_count, shard_rank, in, out, 0);
}

static int prepare(int tp_class)
{
    (void)tp_class;
    return 0;
}

const cp_gpu_kernels a2a_ep4_kernels = { .launch = no_kernel, .emulate = no_emulate, .prepare = prepare };
