/* commplan runtime: the table types every generated plan.c fills in, and
 * the executor that walks them for one rank over a communication backend.
 * Tables are rank-generic: per-rank values (shard index, group instance,
 * valid lengths) follow from the rank's mesh coordinates. */
#ifndef COMMPLAN_H
#define COMMPLAN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The layout of the tables below. A generated plan.c refuses to compile
 * against a runtime whose tables differ (nanopb's PB_PROTO_HEADER_VERSION
 * idea): bump it with every change to a table type or an enum. */
#define CP_TABLES_VERSION 10

#define CP_MAX_DIMS 8      /* tensor dims per parameter */
#define CP_MAX_MESH_DIMS 6 /* dp_replicate, dp_shard, ep, cp, tp, pp */

/* CP_U8: raw bytes, the dtype of the all-gather of a unit whose parameters
 * gather in different dtypes (cp_unit.ag_bytes; FSDP2's uint8 all-gather). */
typedef enum { CP_FP32 = 0, CP_BF16 = 1, CP_FP16 = 2, CP_U8 = 3 } cp_dtype;
/* CP_PREMUL_SUM: NCCL's PreMulSum, each input multiplied by 1 / the op's
 * premul_factor, then summed (FSDP2's set_gradient_divide_factor on
 * fp32/bf16: ReduceOp.PREMUL_SUM(1 / factor), torch 2.15
 * _fsdp_collectives.py:983). */
typedef enum { CP_SUM = 0, CP_AVG = 1, CP_MAX = 2 /* loss_parallel's per-token max */, CP_PREMUL_SUM = 3 } cp_reduce_op;

/* An op kind's facts live in one descriptor (cp_op_descs, executor.c; the
 * generator's twin is gen/opkinds.lua): nothing else switches on the kind. */
typedef enum {
    CP_OP_COPY_IN = 0,     /* sharded params -> this rank's all-gather slot (cast) */
    CP_OP_ALL_GATHER,      /* fused all-gather over the shard group */
    CP_OP_COPY_OUT,        /* all-gather buffer -> per-parameter unsharded storage */
    CP_OP_FORWARD,         /* compute placeholder: params must be unsharded */
    CP_OP_BACKWARD,        /* compute placeholder: params unsharded, grads produced */
    CP_OP_RESHARD,         /* free unsharded storage */
    CP_OP_PACK,            /* unsharded grads -> reduce-scatter input (chunk_cat) */
    CP_OP_REDUCE_SCATTER,  /* over the shard group */
    CP_OP_ALL_REDUCE,      /* HSDP: over the replicate group */
    CP_OP_VIEW_OUT,        /* reduce-scatter output -> sharded grads (cast) */
    /* Tensor parallelism's activation collectives, inside a unit's forward
     * and backward, over the TP group, in place on the unit's activation
     * buffer (its length: the op's count, times the TP size for a gather). */
    CP_OP_TP_ALL_GATHER,     /* sequence-parallel gather (this rank's slot -> whole) */
    CP_OP_TP_REDUCE_SCATTER, /* sequence-parallel reduce-scatter (whole -> this rank's slot, summed) */
    CP_OP_TP_ALL_REDUCE,     /* TP without sequence parallelism, loss-parallel statistics (summed) */
    CP_OP_VIEW_OUT_ADD,    /* a later reduction of the step: reduce-scatter output added into the sharded grads */
    /* HSDP's set_requires_all_reduce(False) (all_reduce_last): FSDP2's
     * partial_reduce_output, in the reduce dtype on the reduce-scatter stream */
    CP_OP_PARTIAL_SAVE,    /* reduce-scatter output -> the partial sums (the step's first) */
    CP_OP_PARTIAL_ADD,     /* partial sums += reduce-scatter output */
    CP_OP_PARTIAL_FOLD,    /* the last micro-step: reduce-scatter output += partial sums, before the all-reduce */
    /* Pipeline parallelism: one message (an activation or its gradient) to or
     * from the rank whose pp coordinate is op->peer, over the pp family. */
    CP_OP_SEND,            /* the unit's pp buffer slot (tag, micro-step) -> the peer */
    CP_OP_RECV,            /* the peer -> the unit's pp buffer slot (tag, micro-step) */
    /* zero bubble's split backward (pipeline schedules' I): the input gradient
     * only, params unsharded, no weight grads (its W is a CP_OP_BACKWARD) */
    CP_OP_BACKWARD_INPUT,
    /* Expert parallelism: torchtitan's MoE token dispatch and combine
     * (ExpertParallel._token_dispatch / _token_combine), over the op's family
     * (the ep group). Split sizes depend on routing, known only at run time:
     * the tables fix each peer's capacity (rows) and the counts come in at
     * run time within it (docs/expert-parallel.md). */
    CP_OP_A2A_COUNTS,      /* all-to-all of the per-expert token counts: a2a_experts int64 to each member,
                              into the unit's counts slot a2a_slot ([sent][received]) */
    CP_OP_A2A,             /* all-to-all of token rows (a2a_dim elements each) split by the counts that
                              op a2a_counts_op exchanged: dispatch send -> recv buffer, combine recv -> send */
    /* CPUOffloadPolicy (cp_unit.offload): the host's sharded params and
     * grads meet the device through these copies over the host link. */
    CP_OP_H2D,             /* host sharded params -> the unit's device copy (CP_BUF_H2D), which its copy-in reads */
    CP_OP_D2H,             /* the view-out's device copy (CP_BUF_D2H) -> the host's sharded grads (assigns) */
    CP_OP_D2H_ADD,         /* the same, then added into the host's sharded grads on the host (a later reduction) */
    /* fully_shard(reshard_after_forward=k) (cp_unit.post_forward = k): after
     * forward, this rank's slice of the unsharded parameters (at its key in
     * its post-forward group: S / k padded shards of each parameter) ->
     * CP_BUF_POST_FORWARD, which backward's all-gather over that group reads
     * (cp_op.post_forward; torch 2.15 _fsdp_param.py:970-1010) */
    CP_OP_POST_FORWARD,
    CP_OP_KIND_COUNT
} cp_op_kind;

typedef struct {
    const char *name;
    int ndim;
    int64_t shape[CP_MAX_DIMS];
    int shard_dim;
    int64_t numel;  /* real elements of the full parameter */
    int64_t chunk;  /* ceil(shape[shard_dim] / W) */
    int64_t outer;  /* product of dims before shard_dim */
    int64_t run;    /* chunk * product of dims after shard_dim */
    int64_t padded; /* outer * run: what every rank stores and sends */
    int64_t offset; /* in the unit's all-gather slot / reduce-scatter row */
    int64_t grad_offset; /* start in the unit's compact unsharded-grads buffer (8-element aligned) */
    /* Tensor parallelism: shape, numel and the geometry above are the
     * TP-local tensor's (what FSDP shards). With tp_sharded, TP split the
     * full parameter's dim tp_dim (tp_full rows) into tp_chunk rows per TP
     * rank; full_numel is the full parameter's. */
    int tp_sharded, tp_dim;
    int64_t tp_full, tp_chunk, full_numel;
    /* A unit of mixed all-gather dtypes (its ag_bytes > 0; per-parameter
     * MixedPrecisionPolicy param_dtype): this parameter's all-gather and
     * compute dtype and its byte offset in the unit's all-gather slot;
     * elsewhere unused (C's zero default): cp_param_ag_dtype / cp_param_ag_offset. */
    cp_dtype ag_dtype;
    int64_t ag_offset;
    int64_t unsharded_offset; /* its byte offset in the unit's unsharded buffer (16-byte aligned) */
    /* A unit with frozen parameters (its nfrozen > 0; requires_grad=False):
     * frozen 1: all-gathered with the rest, never reduced (no gradient, no
     * unsharded or sharded grad); rs_offset: its start in the unit's
     * reduce-scatter row and sharded grads, the trainable parameters'
     * padded shards back to back (torch 2.15 foreach_reduce over the
     * gradients, _fsdp_collectives.py:905-918); elsewhere unused (C's zero
     * default): cp_param_rs_offset. */
    int frozen;
    int64_t rs_offset;
} cp_param;

/* A unit's buffers. The first eight are transient, placed in one arena per
 * rank by the generator's memory plan (gen/memplan.lua); the shards and
 * sharded grads persist (the optimizer owns them). */
typedef enum {
    CP_BUF_AG = 0,    /* W*total, ag dtype: the fused all-gather buffer */
    CP_BUF_UNSHARDED, /* W*total, ag dtype; param p at W*offset */
    CP_BUF_GRADS,     /* grads_numel, grad dtype; param p at its grad_offset */
    CP_BUF_RS_IN,     /* W*total, reduce dtype */
    CP_BUF_RS_OUT,    /* total, reduce dtype */
    CP_BUF_ACT,       /* act_numel, ag dtype: the unit's TP activation collectives */
    CP_BUF_PARTIAL,   /* partial_numel, reduce dtype: reduce-scatter outputs awaiting the all-reduce */
    CP_BUF_PP,        /* 2 x micro_steps x pp_numel, ag dtype: point-to-point messages [direction][micro-step]
                         (direction 0: forward activations, 1: their gradients) */
    /* Expert parallelism's all-to-alls (CP_OP_A2A_COUNTS / CP_OP_A2A): */
    CP_BUF_A2A_COUNTS, /* a2a_slots x 2 x a2a_experts int64: per slot the counts sent (this rank's tokens per
                          expert, global expert order) then received ([source member][its local expert]) */
    CP_BUF_A2A_SEND,   /* a2a_numel, ag dtype: this rank's routed tokens, rows packed by destination member,
                          then expert (torch's all_to_all_single input), at most a2a_capacity rows per member */
    CP_BUF_A2A_RECV,   /* a2a_numel, ag dtype: the tokens for this rank's experts, packed by source member,
                          then local expert */
    CP_BUF_H2D,        /* total, orig dtype: CPU offload's device copy of the host's shards (h2d .. copy-in) */
    CP_BUF_D2H,        /* total, orig dtype: CPU offload's viewed-out grads awaiting their D2H (view-out .. d2h) */
    CP_BUF_POST_FORWARD, /* (S / k) x the slot's bytes: reshard_after_forward = k's kept slice (post_forward ..
                            the all-gather over the post-forward group); 0 bytes elsewhere */
    CP_ARENA_BUFFERS,
    CP_BUF_SHARDED = CP_ARENA_BUFFERS, /* total, orig dtype: this rank's shards (host memory on an offloading unit) */
    CP_BUF_SHARDED_GRADS,              /* total, orig dtype: this rank's reduced grads (likewise) */
    CP_BUFFERS,
    CP_BUF_NONE = -1
} cp_buffer;
typedef cp_buffer cp_arena_buffer;

/* The CUDA streams ops run on: the caller's and FSDP2's four side streams.
 * The generator assigns every op its stream (cp_op.stream). */
typedef enum {
    CP_STREAM_COMPUTE = 0,
    CP_STREAM_COPY_IN,
    CP_STREAM_ALL_GATHER,
    CP_STREAM_REDUCE_SCATTER,
    CP_STREAM_ALL_REDUCE,
    CP_STREAM_COUNT
} cp_stream;

typedef struct {
    const char *name;
    int first_param, nparams;
    int64_t total; /* slot numel: sum of padded */
    int64_t numel; /* sum of real numel */
    int64_t grads_numel; /* unsharded-grads buffer: numel with each param start aligned */
    cp_dtype orig_dtype, ag_dtype, reduce_dtype;
    /* The unsharded grads buffer's dtype, torch 2.15's: reduce_dtype (the
     * unsharded parameter's grad_dtype: each micro-step's grad, computed in
     * ag_dtype, cast to it and added in it), or ag_dtype where reduce_dtype is
     * wider and every backward's grads are reduced before the next. */
    cp_dtype grad_dtype;
    int is_root;
    int reshard_after_forward;
    cp_reduce_op rs_op, ar_op;
    double pre_divide, post_divide;
    int vec_ok; /* offsets, runs and total are multiples of 8 elements: 16-byte copies */
    int64_t act_numel; /* largest activation any of its TP collectives moves (0 without TP) */
    int64_t partial_numel; /* all_reduce_last under HSDP: total (the partial sums, reduce dtype); else 0 */
    int64_t pp_numel;      /* elements (ag dtype) of one point-to-point message of this unit; 0: none */
    /* Expert parallelism: 0, 0, 0 without it. */
    int64_t a2a_numel;     /* elements (ag dtype) of each token buffer: ep x capacity x dim, its A2A ops' largest */
    int a2a_slots;         /* counts slots (a micro-step's counts live from its dispatch to its backward) */
    int a2a_experts;       /* num_experts: int64 entries of each half of a counts slot */
    int64_t arena_offset[CP_ARENA_BUFFERS]; /* bytes into the rank's arena */
    /* Expert parallelism's experts (a MoE block's second FSDP parameter
     * group, gen/parallel/ep.lua); 0 elsewhere (C's zero default). Their
     * FSDP group is shard_family (efsdp; -1 when it has one rank) of
     * shard_size ranks instead of the plan's shard group, and their
     * parameters' dim 0 is split over split_family (ep): the rank's key
     * there picks their rows of the full parameter, as the TP coordinate
     * does for a TP-split one (tp_sharded, tp_full, tp_chunk). */
    int expert;
    int shard_family, shard_size, split_family;
    /* > 0: the parameters gather in different dtypes (each its cp_param.ag_dtype;
     * ag_dtype stays the unit's compute dtype): the all-gather slot is ag_bytes
     * bytes per rank, each parameter's padded shard at its ag_offset, gathered as
     * CP_U8 (torch 2.15 _fsdp_collectives.py:369-379); 0: total elements of ag_dtype. */
    int64_t ag_bytes;
    int64_t unsharded_bytes; /* with ag_bytes: the unsharded buffer's bytes (each parameter 16-byte aligned) */
    /* rs_op CP_PREMUL_SUM: the divide factor f (the reduce-scatter
     * premultiplies by 1 / f); 0 (C's zero default) otherwise. */
    double premul_factor;
    /* fully_shard(offload_policy=CPUOffloadPolicy(pin_memory)): the sharded
     * params and grads in host memory (pinned where pin_memory), copied by
     * CP_OP_H2D / CP_OP_D2H(_ADD); 0, 0 elsewhere. */
    int offload, pin_memory;
    /* fully_shard(reshard_after_forward=k), 1 < k < shard size: k, and the
     * family of its post-forward groups (k consecutive keys of each shard
     * group); 0, 0 elsewhere (C's zero default). */
    int post_forward, post_forward_family;
    /* > 0: that many of its parameters are frozen (cp_param.frozen), and
     * rs_total (0 when all are) is the reduce-scatter row, the sharded
     * grads and the partial sums per rank; 0 (C's zero default): none, the
     * row is total: cp_unit_rs_total. */
    int nfrozen;
    int64_t rs_total;
    /* 1: FSDPModule.set_unshard_in_backward(False) on a unit resharded after
     * forward (torch 2.15 _fully_shard.py:1000-1009): its backward runs on
     * the sharded parameters (none gathered; autograd makes its grads
     * without them), so the backward reads no unsharded buffer; 0 (C's zero
     * default): the backward reads the unsharded parameters. */
    int sharded_backward;
} cp_unit;

/* Whether compute op `kind` of unit U reads its unsharded parameters (all
 * but a set_unshard_in_backward(False) unit's backward). */
static inline int cp_compute_reads_params(const cp_unit *U, int kind)
{
    return !(U->sharded_backward && kind == CP_OP_BACKWARD);
}

/* A parameter's all-gather dtype, its byte offset in its unit's slot, and
 * the slot's bytes per rank, for either kind of unit. */
static inline cp_dtype cp_param_ag_dtype(const cp_unit *U, const cp_param *prm)
{
    return U->ag_bytes > 0 ? prm->ag_dtype : U->ag_dtype;
}
static inline int64_t cp_param_ag_offset(const cp_unit *U, const cp_param *prm)
{
    return U->ag_bytes > 0 ? prm->ag_offset : prm->offset * (U->ag_dtype == CP_FP32 ? 4 : 2);
}
static inline int64_t cp_unit_ag_bytes(const cp_unit *U)
{
    return U->ag_bytes > 0 ? U->ag_bytes : U->total * (U->ag_dtype == CP_FP32 ? 4 : 2);
}
/* The reduce-scatter row (its trainable parameters' padded shards; the
 * sharded grads' layout) per rank, and a parameter's offset in it. */
static inline int64_t cp_unit_rs_total(const cp_unit *U)
{
    return U->nfrozen > 0 ? U->rs_total : U->total;
}
static inline int64_t cp_param_rs_offset(const cp_unit *U, const cp_param *prm)
{
    return U->nfrozen > 0 ? prm->rs_offset : prm->offset;
}
/* Where a parameter's unsharded (W x padded) tensor starts in the unit's
 * unsharded buffer, in bytes, on a shard group of W ranks. */
static inline int64_t cp_param_unsharded_offset(const cp_unit *U, const cp_param *prm, int64_t W)
{
    return U->ag_bytes > 0 ? prm->unsharded_offset : W * prm->offset * (U->ag_dtype == CP_FP32 ? 4 : 2);
}

typedef struct {
    const char *name;
    uint32_t axis_mask; /* bit i set: mesh dim i belongs to the family */
    int size;
    /* > 0: a part family (FSDP2's post-forward groups): the masked axes'
     * row-major key K split into groups of inner consecutive keys, key
     * K % inner, the masked axes' color x (their size / inner) + K / inner
     * (runtime/topology.c); 0 (C's zero default): the masked axes whole. */
    int inner;
} cp_group_family;

typedef struct {
    cp_op_kind kind;
    int unit;
    int family; /* group family for collectives, -1 for local ops */
    cp_stream stream; /* where its GPU work runs; ordered only by stream order and the waits below */
    cp_dtype dtype;
    int64_t count; /* per-rank elements: AG input, RS output, AR buffer */
    cp_reduce_op reduce_op;
    int micro_step;
    int event;                  /* >= 0: record this event slot when the op is done (a later op waits on it) */
    int wait_first, wait_count; /* before running, wait for these slots of plan->waits (data across
                                   streams, arena reuse): the generator's proof covers exactly these */
    int from_sharded; /* an all-gather with no copy-in before it (zero copy-in: the stored dtype is the
                         all-gather dtype): its input is this rank's sharded storage, laid out as its slot */
    /* Point-to-point (CP_OP_SEND / CP_OP_RECV); -1, 0, 0 on every other op. */
    int peer;  /* the peer's coordinate on the pp mesh dim */
    int batch; /* 0: issued alone; > 0: consecutive ops with the same id form one group
                  (torch's batch_isend_irecv, NCCL's ncclGroupStart .. ncclGroupEnd) */
    int tag;   /* the message: 2 x sending stage, + 1 for a gradient; both ends carry the same */
    /* Expert parallelism (CP_OP_A2A_COUNTS / CP_OP_A2A); only those ops read
     * these (C's zero default elsewhere). The family is the ep group: member
     * m holds experts m x a2a_experts .. (m + 1) x a2a_experts - 1. */
    int a2a_experts;      /* experts per member (num_experts / ep) */
    int a2a_slot;         /* A2A_COUNTS: the unit's counts slot it fills (the A2A reads its counts op's) */
    int a2a_counts_op;    /* A2A: index in the rank's op table of the earlier A2A_COUNTS whose counts split it;
                             A2A_COUNTS: -1, or (activation checkpointing's recompute in backward) the forward's
                             A2A_COUNTS of the same slot, whose counts this exchange must repeat exactly */
    int a2a_combine;      /* A2A: 0 dispatch (send buffer -> recv buffer; splits: counts sent to each member,
                             counts received from each), 1 combine (recv -> send; the splits swapped). Backward:
                             dispatch's gradient is a combine, combine's a dispatch */
    int64_t a2a_dim;      /* elements per token row (the model's dim) */
    int64_t a2a_capacity; /* rows per member each buffer holds: counts past it are refused, never sent */
    int64_t a2a_rows;     /* A2A_COUNTS: routed rows per rank (tokens x top_k) --simulate / --check draw; 0: half
                             the capacity */
    /* A partial reduction (torchtitan's ChunkedLossWrapper: the [norm, lm_head]
     * unit's lm_head reduced in the loss, its norm in the decoder's backward):
     * PACK, REDUCE_SCATTER, ALL_REDUCE, VIEW_OUT(_ADD) over the unit's
     * parameters part_first .. part_first + part_count - 1 only, packed as
     * FSDP2's foreach_reduce packs the parameters that have a gradient (each
     * one's padded shard, rank rows of cp_part_total elements; count is that
     * total), and the FORWARD / BACKWARD that computes them. part_count 0 (C's
     * zero default): the whole unit. */
    int part_first, part_count;
    /* reduce_op CP_PREMUL_SUM: the divide factor f (scalar 1 / f); 0 (C's
     * zero default) on every other op. */
    double premul_factor;
    /* 1 on the all-gather over a unit's post-forward group (its input the
     * unit's CP_BUF_POST_FORWARD) and the copy-out after it (its output
     * holds each member's slice: cp_post_forward_piece); 0 elsewhere. */
    int post_forward;
} cp_op;

/* One class: the ranks whose tables agree (TP ranks whose TP-local shapes
 * agree for every parameter; a pipeline rank's own stages' units, params
 * and ops) share these tables (layout, schedule, memory plan). */
typedef struct {
    const cp_unit *units;
    const cp_param *params;
    const cp_op *ops;
    const int *waits;
    int nwaits, nevents;
    int64_t arena_bytes;
    int nunits, nparams, nops;
    int64_t symm_bytes; /* fsdp.symm_mem: the arena's first bytes, one symmetric window (0: none) */
} cp_class;
typedef cp_class cp_tp_class; /* its name before pipeline parallelism */

typedef struct {
    const char *name;
    const char *fingerprint;
    int world_size;
    int mesh_ndim;
    const char *mesh_names[CP_MAX_MESH_DIMS];
    int mesh_sizes[CP_MAX_MESH_DIMS];
    int shard_size, replicate_size;
    int shard_family, replicate_family; /* -1 when the dim is 1 */
    int micro_steps;
    int nunits;
    const cp_unit *units;
    int nparams;
    const cp_param *params;
    int nfamilies;
    const cp_group_family *families;
    int nops;
    const cp_op *ops;
    int64_t arena_bytes; /* one rank's transient buffers with lifetime-based reuse */
    int nevents;         /* event slots */
    int nwaits;
    const int *waits;    /* event slots, indexed by cp_op.wait_first */
    /* Tensor and pipeline parallelism: the fields above are class 0's; a
     * rank runs its own class's tables (cp_plan_view). Without TP and PP:
     * tp_size 1, pp_size 1, one class. */
    int tp_size;
    int tp_mesh_dim;          /* index of "tp" in the mesh, -1 without TP; -2 - i where tp spans the
                                 consecutive axes from i (ep groups inside TP's: cp_tp_rank) */
    int nclasses;
    const cp_class *classes;
    const int *class_of;      /* pp_size x tp_size entries: [pp coordinate * tp_size + tp coordinate] */
    int view_class;           /* in a rank's view (cp_plan_view): its class */
    int pp_size;              /* pipeline stages' ranks along the pp dim; 1 without PP */
    int pp_mesh_dim;          /* index of "pp" in the mesh, -1 without PP */
    int pp_family;            /* the family of the pp axis alone (send / receive), -1 without PP */
    /* fsdp.symm_mem (torchtitan's enable_fsdp_symm_mem): the arena's first symm_bytes are one symmetric
     * window holding every all-gather output and the reduce-scatter inputs and outputs (gen/memplan.lua),
     * at offsets every rank of a communicator shares (gen/symm.lua); 0: none. Class 0's, as arena_bytes. */
    int64_t symm_bytes;
} cp_plan;

/* ---- dtype helpers (dtype.c) ---- */
size_t cp_dtype_size(cp_dtype t);
const char *cp_dtype_name(cp_dtype t);
float cp_load(cp_dtype t, const void *base, int64_t i);
void cp_store(cp_dtype t, void *base, int64_t i, float v);
uint16_t cp_float_to_bf16(float f);
float cp_bf16_to_float(uint16_t h);
uint16_t cp_float_to_fp16(float f);
float cp_fp16_to_float(uint16_t h);
/* Reduce n values in fp32 in member order, AVG dividing once at the end,
 * the result rounded to t once (neither gloo's nor NCCL's order). */
float cp_reduce_values(cp_dtype t, cp_reduce_op op, const float *v, int n);
/* The arithmetic of a backend's reductions: gloo's (cp_reduce_values_gloo,
 * what FSDP2 on gloo does, the host backend's default) or NCCL's. */
typedef enum { CP_ARITH_GLOO = 0, CP_ARITH_NCCL = 1 } cp_arith;
/* gloo's ring reduction of n members' values for the chunk ending on
 * member key: summed from member key-1 down to key, rounded to t after
 * every add; AVG then divides and rounds (dtype.c cites gloo). */
float cp_reduce_values_gloo(cp_dtype t, cp_reduce_op op, const float *v, int n, int key);
/* The member whose chunk holds element i of an n-member gloo all-reduce of
 * count t elements (gloo's ring segmentation). */
int cp_gloo_all_reduce_key(cp_dtype t, int64_t i, int64_t count, int n);
/* NCCL's ring reduction of n members' values as member `key` receives it:
 * ncclAvg premultiplies each input by float(1/n) in t and sums in t, the
 * chain starting at member key+1 and ending with key's own (dtype.c says
 * where this model holds). */
float cp_reduce_values_nccl(cp_dtype t, cp_reduce_op op, const float *v, int n, int key);
/* The member whose ring step finishes element i of an n-member NCCL ring
 * all-reduce of count elements of t, with one channel and one loop (NCCL's
 * split for a small buffer on one channel: chunks of divUp(count, n)
 * elements rounded up to 16 bytes; dtype.c cites NCCL). */
int cp_nccl_all_reduce_key(cp_dtype t, int64_t i, int64_t count, int n);
/* The last ring position that can finish element i under any channel and
 * chunk split NCCL's 16-byte granularity allows: every position 0 ..
 * min(n - 1, i / (16 / size)) can, no other (dtype.c). */
int cp_nccl_all_reduce_max_key(cp_dtype t, int64_t i, int n);
float cp_reduce_arith(cp_arith a, cp_dtype t, cp_reduce_op op, const float *v, int n, int key);
/* The same with CP_PREMUL_SUM's factor f (ignored by the other ops): NCCL
 * premultiplies each input by its scalar t(float(1 / f)) as it does
 * ncclAvg's; gloo has no PREMUL_SUM (torch refuses it there), so gloo's
 * arithmetic premultiplies each input, rounds to t and sums as its SUM. */
float cp_reduce_arith_pm(cp_arith a, cp_dtype t, cp_reduce_op op, double f, const float *v, int n, int key);
/* The key cp_reduce_arith takes for element i of an all-reduce of count
 * elements, and for element i of member key's count-element share of a
 * reduce-scatter (gloo's is an all-reduce of the n x count input). */
int cp_all_reduce_key(cp_arith a, cp_dtype t, int64_t i, int64_t count, int n);
int cp_reduce_scatter_key(cp_arith a, cp_dtype t, int key, int64_t i, int64_t count, int n);
/* The functions above over runs of n elements, bit for bit (dtype.c):
 * typed loops in blocks of CP_BLOCK, a copy where the bits do not change. */
#define CP_BLOCK 256
void cp_load_n(cp_dtype t, const void *src, int64_t n, float *dst);  /* dst[i] = cp_load(t, src, i) */
void cp_store_n(cp_dtype t, void *dst, int64_t n, const float *src); /* cp_store(t, dst, i, src[i]) */
void cp_round_n(cp_dtype t, float *v, int64_t n);                    /* v[i] rounded to t (cp_store, cp_load) */
/* cp_store(to, dst, i, cp_load(from, src, i)); a memmove when to == from. */
void cp_convert_n(cp_dtype to, void *dst, cp_dtype from, const void *src, int64_t n);
/* The key of element i (cp_all_reduce_key, cp_reduce_scatter_key) and in
 * *end the first element after i with another key (at most count). */
int cp_all_reduce_key_run(cp_arith a, cp_dtype t, int64_t i, int64_t count, int n, int64_t *end);
int cp_reduce_scatter_key_run(cp_arith a, cp_dtype t, int key, int64_t i, int64_t count, int n, int64_t *end);
/* out[j] = cp_reduce_arith(a, t, op, {v[0][j], ..., v[n-1][j]}, n, key) for j < len. */
void cp_reduce_arith_f(cp_arith a, cp_dtype t, cp_reduce_op op, const float *const *v, int n, int key, int64_t len,
                       float *out);
/* The same over n members' buffers of t (in[m][j]) into out (t); 0, or -1
 * when scratch for more than 16 members cannot be had. */
int cp_reduce_arith_n(cp_arith a, cp_dtype t, cp_reduce_op op, const void *const *in, int n, int key, int64_t len,
                      void *out);
/* cp_reduce_arith_f / _n with CP_PREMUL_SUM's factor (cp_reduce_arith_pm). */
void cp_reduce_arith_f_pm(cp_arith a, cp_dtype t, cp_reduce_op op, double f, const float *const *v, int n, int key,
                          int64_t len, float *out);
int cp_reduce_arith_n_pm(cp_arith a, cp_dtype t, cp_reduce_op op, double f, const void *const *in, int n, int key,
                         int64_t len, void *out);
const char *cp_op_kind_name(cp_op_kind k);
const char *cp_stream_name(cp_stream s);

/* ---- op kind descriptors (executor.c) ---- */
typedef enum {
    CP_ACT_COPY = 0,   /* a copy kernel (host: its C reference) from `in` to `out` */
    CP_ACT_COLLECTIVE, /* a collective over the op's group; identity on a one-rank group */
    CP_ACT_COMPUTE,    /* the caller's forward / backward */
    CP_ACT_NONE,       /* bookkeeping only (reshard: the arena keeps the bytes) */
    CP_ACT_P2P,        /* a send to or a receive from the op's pp peer (in: a send, out: a receive) */
    CP_ACT_A2A,        /* expert parallelism's all-to-alls (counts, tokens) */
    CP_ACT_HOST        /* CPU offload: a copy between the host's sharded buffers and the unit's device copy */
} cp_op_action;

typedef enum { CP_COLL_ALL_GATHER = 0, CP_COLL_REDUCE_SCATTER, CP_COLL_ALL_REDUCE, CP_COLLECTIVES } cp_collective;

/* Which rank's slot (op->count elements) of a buffer an op touches.
 * CP_SLOT_PP: the message's, [tag & 1][micro_step] of the pp buffer. */
typedef enum { CP_SLOT_NONE = 0, CP_SLOT_SHARD, CP_SLOT_TP, CP_SLOT_PP } cp_slot;

typedef struct {
    const char *name;
    cp_op_action action;
    int kernel;            /* CP_ACT_COPY: the copy (CP_KERNEL_*: 0 copy-in, 1 copy-out, 2 pack, 3 view-out,
                              4 view-out adding into the sharded grads, 5 flat copy, 6 flat add, both in the
                              reduce dtype) */
    int adds;              /* the copy adds into out (reads it too) */
    cp_collective collective; /* CP_ACT_COLLECTIVE */
    cp_buffer in, out;     /* the unit's buffers it reads and writes */
    cp_slot in_slot, out_slot; /* only this rank's slot of in / out (all-gather input, reduce-scatter output) */
    cp_buffer frees;       /* contents dead after the op (the host backend poisons them) */
    int ring_passes;       /* nccl-tests' busbw factor: ring_passes * (n - 1) / n */
    int activation;        /* a TP activation collective: the caller fills its input, reads its output */
} cp_op_desc;

extern const cp_op_desc cp_op_descs[CP_OP_KIND_COUNT];

/* ---- rank geometry (topology.c) ---- */
typedef struct {
    int rank;
    int coords[CP_MAX_MESH_DIMS];
} cp_rank_coords;

void cp_rank_coords_of(const cp_plan *p, int rank, cp_rank_coords *out);
/* Group instance (color) and rank inside it (key) for a family. */
void cp_group_of(const cp_plan *p, int family, int rank, int *color, int *key);
/* Global rank of member `key` of group `color` of the family. */
int cp_group_member(const cp_plan *p, int family, int color, int key);
int cp_shard_rank(const cp_plan *p, int rank);
int cp_tp_rank(const cp_plan *p, int rank);
/* An activation collective's (TP's, CP's) group: rank's key in it (its slot) and its size. */
int cp_op_group_key(const cp_plan *p, const cp_op *op, int rank);
int cp_op_group_size(const cp_plan *p, const cp_op *op);
/* The rank's coordinate on the pp mesh dim (0 without PP). */
int cp_pp_rank(const cp_plan *p, int rank);
/* The global rank whose coordinates are rank's with the pp coordinate
 * replaced by peer_coord (rank itself without PP). */
int cp_pp_peer_rank(const cp_plan *p, int rank, int peer_coord);
/* The plan as `rank` runs it: units, params, ops, waits and arena of the
 * rank's class, picked by its pp and TP coordinates (the plan itself
 * without TP and PP). */
void cp_plan_view(const cp_plan *p, int rank, cp_plan *out);
int cp_replicate_rank(const cp_plan *p, int rank);
/* Real elements of parameter prm on shard rank r (Shard(0): trailing ranks
 * may hold fewer, possibly zero). */
int64_t cp_param_valid(const cp_param *prm, int shard_rank);
/* Element index in the (TP-local) parameter of local element j of rank r's shard. */
int64_t cp_param_global_index(const cp_param *prm, int W, int shard_rank, int64_t j);
/* Element index in the full parameter of element i of TP rank t's local tensor. */
int64_t cp_param_full_index(const cp_param *prm, int tp_rank, int64_t i);
/* Elements of the full parameter (numel without TP). */
int64_t cp_param_full_numel(const cp_param *prm);
/* A unit's FSDP shard group: the plan's, or an experts unit's own
 * (cp_unit.expert): its size, family (-1: one rank) and this rank's key in
 * it; and the coordinate that picks a split parameter's rows (the TP
 * coordinate, or an experts unit's ep key). */
int cp_unit_shard_size(const cp_plan *p, int unit);
/* reshard_after_forward = k (cp_unit.post_forward; Shard(0) parameters):
 * piece i of the post-forward copy (copy_out 0, i < nparams: this rank's
 * slice of parameter i) or of the copy-out after the all-gather over the
 * post-forward group (copy_out 1, i < k x nparams: member i / nparams's
 * slice of parameter i % nparams): byte offsets into the op's input and
 * output buffers and the bytes it moves. */
void cp_post_forward_piece(const cp_plan *p, int unit, int shard_rank, int copy_out, int i, int64_t *in_off,
                           int64_t *out_off, int64_t *bytes);
int cp_unit_shard_family(const cp_plan *p, int unit);
int cp_unit_shard_rank(const cp_plan *p, int unit, int rank);
int cp_unit_split_rank(const cp_plan *p, int unit, int rank);
/* A part of the unit's parameters (cp_op.part_first, part_count; count 0:
 * the whole unit): its trainable parameters' padded shards back to back,
 * total elements from offset in the unit's reduce-scatter row (the
 * parameters are contiguous there; frozen ones take no room). */
int64_t cp_part_total(const cp_plan *p, int unit, int first, int count);
int64_t cp_part_offset(const cp_plan *p, int unit, int first, int count);
/* 0 when the part lies inside the unit (count 0, or first >= 0, count >= 1,
 * first + count <= its nparams), else -1. */
int cp_part_check(const cp_plan *p, int unit, int first, int count);

/* ---- the buffer arena (arena.c) ---- */
/* Bytes of any of a unit's buffers (cp_buffer), arena or persistent. */
int64_t cp_arena_buffer_bytes(const cp_plan *p, int unit, cp_buffer k);
/* Library order check (arena.c says which buffers hold data between
 * calls): a library call's effect on the arena, from the ops it will run
 * (the unit's op group kinds, from its cursor, as cp_run_call picks them). */
typedef struct {
    int ops, first, last;    /* how many ops it runs, the first and last (table index; -1: none) */
    unsigned touches, writes; /* arena buffers (bit k = cp_buffer k) its ops use, and write */
    unsigned opens, closes;   /* arena buffers of the unit holding data after the call / no longer */
} cp_call_effect;
void cp_call_effect_of(const cp_plan *p, int unit, const cp_op_kind *kinds, int nkinds, int cursor, cp_call_effect *e);
/* live[v]: bit k set while unit v's arena buffer k holds data across calls.
 * The unit v whose live buffer (*held) the call would overwrite with its
 * buffer *wrote (one its ops write, or the grads the caller's backward
 * writes after the unshard that opens them), or -1. Calls in the plan's order (each at its last op)
 * never conflict. */
int cp_call_conflict(const cp_plan *p, int unit, const cp_call_effect *e, const unsigned *live, int *wrote,
                     int *held);
/* Split calls (issue / wait: cp_gpu_unshard_issue & co): the order of the
 * GPU work they issue on the plan's streams, followed on the host with a
 * vector clock per stream (arena.c). cp_order_call checks the ops a call
 * would issue (kinds from cursor, as cp_run_call picks them, each after
 * the one before, part after part): 0, or -1 with one line in out when one of them waits
 * for an event no op of this step recorded yet, or touches arena bytes an
 * earlier op on another stream may still use, unordered before it; apply:
 * records them (call it again with apply = 1 once checked). FORK: the side
 * streams wait for the caller's first (a blocking call's fork; a call that
 * starts a step forks anyway); JOIN: the caller's stream waits for every
 * side stream after. */
typedef struct cp_order cp_order;
enum { CP_ORDER_FORK = 1, CP_ORDER_JOIN = 2 };
cp_order *cp_order_new(const cp_plan *p); /* NULL: out of memory */
void cp_order_free(cp_order *o);
typedef struct {
    const cp_op_kind *kinds;
    int nkinds, cursor;
} cp_call_part; /* a call's op group: a blocking unshard is its issue's part, then its wait's */
int cp_order_call(cp_order *o, const char *call, int unit, const cp_call_part *parts, int nparts, int flags, int apply,
                  char *out, size_t n);
/* a's effect followed by b's (a blocking unshard: its issue's, then its wait's). */
void cp_call_effect_merge(cp_call_effect *a, const cp_call_effect *b);
/* Whether issuing op starts a new step (it was issued in this one already). */
int cp_order_starts_step(const cp_order *o, int op);
/* The caller's stream waits for the unit's last issued call (a reduction's wait). */
void cp_order_wait_unit(cp_order *o, int unit);
/* The caller's stream waits for every side stream. */
void cp_order_join(cp_order *o);
/* After the call ran: its unit's live bits. */
void cp_call_apply(const cp_call_effect *e, unsigned *live_of_unit);
/* One line for a refused call ("cp_gpu_unshard(blocks.1) would write ..."). */
void cp_call_conflict_message(const cp_plan *p, const char *call, int unit, int v, int wrote, int held, char *out,
                              size_t n);

/* ---- backend interface (one instance per rank) ----
 * Everything an executor does to memory and streams goes through these:
 * the host backend (threads over host memory, backend_host.c) and the
 * NCCL backend (gpu.c) implement the same calls, so the host simulation
 * runs the very sequence of copies, collectives and event waits the GPU
 * runs. Returns 0 or -1 (message on stderr or in the backend's error). */
typedef struct cp_backend cp_backend;
struct cp_backend {
    void *ctx;
    void *(*alloc)(cp_backend *b, size_t bytes);           /* zeroed; NULL on failure */
    void (*free)(cp_backend *b, void *p);
    /* A copy kernel of `unit` on stream s (cp_op_desc.kernel), over the
     * unit's parameters part_first .. part_first + part_count - 1 (pack,
     * view-out; part_count 0: the whole unit, cp_op.part_count). */
    int (*copy)(cp_backend *b, int kernel, int unit, int part_first, int part_count, cp_stream s, const void *in,
                void *out);
    int (*copy_bytes)(cp_backend *b, cp_stream s, const void *in, void *out, size_t bytes);
    /* The op's collective over its group instance; in may alias out's own slot (in-place all-gather). */
    int (*collective[CP_COLLECTIVES])(cp_backend *b, const cp_op *op, cp_stream s, const void *in, void *out);
    int (*record)(cp_backend *b, cp_stream s, int event); /* event slot done when s reaches this point */
    int (*wait)(cp_backend *b, cp_stream s, int event);   /* s waits for the slot's last record */
    int (*fork)(cp_backend *b);                           /* side streams wait for the compute stream */
    int (*join)(cp_backend *b);                           /* the compute stream waits for every side stream */
    int (*release)(cp_backend *b, void *p, size_t bytes); /* contents dead: the host poisons them */
    /* Host copies of device bytes, ordered on stream s and finished on return. */
    int (*read)(cp_backend *b, cp_stream s, const void *src, void *host, size_t bytes);
    int (*write)(cp_backend *b, cp_stream s, void *dst, const void *host, size_t bytes);
    const char *(*last_error)(cp_backend *b); /* detail of the last failure, or NULL (may be unset) */
    /* p (the backend's memory) as host memory the caller may read and
     * write in place of read / write, where it is (the host backend); NULL
     * when unset: copies through read and write. */
    void *(*host_ptr)(cp_backend *b, void *p);
    /* Point-to-point on stream s with global rank peer_rank (its pp peer),
     * op->count elements of op->dtype; a receive checks that the message is
     * the one op names (tag, micro-step, bytes) where the backend can. */
    int (*send)(cp_backend *b, const cp_op *op, cp_stream s, const void *buf, int peer_rank);
    int (*recv)(cp_backend *b, const cp_op *op, cp_stream s, void *buf, int peer_rank);
    /* Around the sends and receives of one batch (op->batch): posted together. */
    int (*group_start)(cp_backend *b);
    int (*group_end)(cp_backend *b);
    /* Expert parallelism over the op's group (n members, this rank member
     * key): a2a_counts sends op->a2a_experts int64 from in + m x a2a_experts
     * to each member m and receives as many from each into out + m x
     * a2a_experts. a2a sends send_rows[m] rows of op->a2a_dim elements of
     * op->dtype, packed in member order from in, to member m, and receives
     * recv_rows[m] rows from member m packed in member order into out; the
     * executor has checked every split against op->a2a_capacity. */
    int (*a2a_counts)(cp_backend *b, const cp_op *op, cp_stream s, const void *in, void *out);
    int (*a2a)(cp_backend *b, const cp_op *op, cp_stream s, const void *in, void *out, const int64_t *send_rows,
               const int64_t *recv_rows);
    /* This rank failed with `why` (one line; the executor calls it with
     * every failure it reports). A backend whose ranks share a process (the
     * host backend's threads) stops them all with the first reason; NULL:
     * the failure reaches the peers as the ops carry it (a refusal's -1s). */
    void (*abort)(cp_backend *b, const char *why);
    /* CPU offload (optional; NULL: alloc / free, memory the host reaches
     * already, as the host backend's): host memory for an offloading
     * unit's sharded buffers, pinned where asked. */
    void *(*alloc_host)(cp_backend *b, size_t bytes, int pinned);
    void (*free_host)(cp_backend *b, void *p, int pinned);
    /* CPU offload's copy over the host link on stream s (to_host: device
     * -> host, else host -> device); finish: done on return (the host then
     * reads the bytes). NULL: copy_bytes, then nothing to wait for. */
    int (*host_copy)(cp_backend *b, cp_stream s, const void *in, void *out, size_t bytes, int to_host, int finish);
    /* The host waits for stream s's work so far (NULL: nothing to wait for). */
    int (*sync)(cp_backend *b, cp_stream s);
    /* fsdp.symm_mem (plan->symm_bytes > 0; NULL: alloc, as the host backend's: gloo has no symmetric
     * memory): the arena, its first window_bytes registered as one symmetric window on every
     * communicator the rank's all-gathers and reduce-scatters run on (gpu.c: ncclMemAlloc and
     * ncclCommWindowRegister; free releases both). Zeroed; NULL on failure. */
    void *(*alloc_symm)(cp_backend *b, size_t bytes, size_t window_bytes);
};

/* ---- executor (executor.c): the one op walker every backend runs ---- */
typedef struct cp_executor cp_executor;
typedef int (*cp_compute_fn)(void *user, cp_executor *ex, const cp_op *op);
/* After each collective, with host copies of its input and output. */
typedef void (*cp_collective_fn)(void *user, cp_executor *ex, const cp_op *op, const void *in, int64_t in_numel,
                                 const void *out, int64_t out_numel);
/* Around a TP activation collective (the compute that feeds and consumes
 * it): after = 0 before it runs, 1 after. */
typedef int (*cp_activation_fn)(void *user, cp_executor *ex, const cp_op *op, int after);
/* Around a point-to-point op: after = 0 before a send (the caller's compute
 * produced the message: write it), 1 after a receive completed (read it;
 * for a receive inside a batch, after the batch's group closed). */
typedef int (*cp_p2p_fn)(void *user, cp_executor *ex, const cp_op *op, int after);
/* Around expert parallelism's all-to-alls: after = 0 before (A2A_COUNTS:
 * give this rank's counts, cp_executor_set_expert_counts; A2A: write its
 * input rows), 1 after (read the received counts or rows). A failure
 * before an A2A_COUNTS still exchanges (a refusal every member sees). */
typedef int (*cp_a2a_fn)(void *user, cp_executor *ex, const cp_op *op, int after);

struct cp_executor {
    const cp_plan *plan;            /* &view */
    cp_plan view;                   /* the rank's view of the plan (its TP class) */
    int rank, shard_rank, replicate_rank, tp_rank, pp_rank;
    cp_backend *backend;
    void **buf[CP_BUFFERS];         /* per buffer kind, per unit: the backend's memory */
    cp_compute_fn on_compute;       /* FORWARD / BACKWARD placeholders */
    cp_collective_fn on_collective; /* after each collective (tracing, dumps) */
    cp_activation_fn on_activation; /* around each TP activation collective */
    cp_p2p_fn on_p2p;               /* before each send, after each receive */
    cp_a2a_fn on_a2a;               /* around each expert-parallel all-to-all */
    void *user;
    unsigned char *unsharded_live;  /* per unit: 1 between copy-out and reshard */
    /* Which op each event wait means: a repeated micro-step's ops share an
     * event slot per offset (gen/repeat.lua), so a wait means the latest op
     * that recorded the slot in table order. wait_base[op] indexes
     * wait_means (the op's waits, in order); slot_last[slot]: the op that
     * recorded the slot last. A wait whose slot another op recorded last
     * (ops run out of the plan's order: library calls) is refused. */
    int *wait_base, *wait_means, *slot_last;
    char *arena;                    /* plan->arena_bytes: every unit's transient buffers */
    /* The batch (cp_op.batch) whose group is open, 0: none; batch_first:
     * its first op (the batch's receives go to on_p2p and its events are
     * recorded once the group has closed: inside a group NCCL issues
     * nothing until ncclGroupEnd, so an event recorded earlier marks nothing). */
    int open_batch;
    const cp_op *batch_first;
    /* Expert parallelism, per unit with a2a_slots: host copies of the counts
     * slots (a2a_slots x 2 x a2a_experts: what the A2As split by), the op
     * that filled each slot last (-1: none), counts given for the unit's
     * next A2A_COUNTS (cp_executor_set_expert_counts) and where its next
     * search starts; a2a_rows: scratch for one op's splits. */
    int64_t **a2a_counts, **a2a_pending;
    int64_t *a2a_prev; /* a recompute's check: the forward's received counts (the largest unit's a2a_experts) */
    int **a2a_filled;
    /* per unit: 0 no counts given, 1 given, 2 refused (cp_executor_set_expert_counts' -1): its A2A_COUNTS
     * then sends -1s, so every member refuses the layer; a2a_refused: the last such refusal's line, of
     * unit a2a_refused_unit, said again when that exchange refuses */
    unsigned char *a2a_has_pending;
    int a2a_refused_unit;
    char a2a_refused[512];
    int *a2a_cursor;
    int64_t *a2a_rows;
    int quiet;                      /* failures only into err (a library), not also on stderr */
    char err[512];                  /* the last failure: one line naming rank, op, unit and why */
    /* The cursor (issue 40): the step (ops run past the table's end start
     * the next), the table index of the op last entered, 1 while inside
     * it; read by cp_cursor_write from a signal handler. */
    volatile long cur_step, cur_op;
    volatile int cur_in;
    volatile long cur_count; /* the count the op issued (the plan's, or a test fault's) */
    volatile long cur_first; /* the op the step began with (-1: none yet); entering it again, or one before
                              * it, begins the next step (library calls enter the table's ops out of order) */
};

/* Allocates this rank's shards and arena through the backend. */
int cp_executor_init(cp_executor *ex, const cp_plan *p, int rank, cp_backend *b);
void cp_executor_free(cp_executor *ex);
/* Runs every op of one step between a fork and a join; returns 0 or -1. */
int cp_executor_step(cp_executor *ex);
/* One op: its waits, its work on its stream, its event. */
int cp_executor_run_op(cp_executor *ex, const cp_op *op);
/* Every live executor's cursor as JSON lines (one per rank: plan, rank,
 * step, op, kind, unit, micro-step, in_op) on fd; async-signal-safe (a
 * SIGUSR1 handler's; python -m commplan diagnose reads the file). */
void cp_cursor_write(int fd);
/* The cursor file (issue 40): COMMPLAN_CURSOR_DUMP=PREFIX names PREFIX<pid>
 * (0, or -1 for a path too long); cp_cursor_dump writes it (truncated) with
 * every live executor's cursor, after one line naming the event (a
 * "timeout", a "failure") and the failing rank's line why when event is
 * not NULL. Async-signal-safe: the SIGUSR1 handler's, the host backend's
 * first failure's (cp_host_world_stop), the GPU path's timeout, and the
 * bridge's (python/commplan/runtime.py). A no-op without a file. */
int cp_cursor_set_file(const char *prefix);
int cp_cursor_armed(void); /* 1 once a cursor file is named */
void cp_cursor_dump(int rank, const char *event, const char *why);
/* Installs cp_cursor_dump on SIGUSR1 when COMMPLAN_CURSOR_DUMP is set
 * (the binary's main, the bridge's library): 0, or -1 (a path too long). */
int cp_cursor_install(void);
/* Where parameter `param` lives in buffer k (sharded, unsharded, grads,
 * sharded grads) of its unit, or NULL for a parameter out of range. */
void *cp_executor_param_ptr(const cp_executor *ex, int param, cp_buffer k);
/* Start address of buffer k of unit u. */
void *cp_executor_buffer(const cp_executor *ex, int u, cp_buffer k);
/* Where op reads or writes buffer k: the whole, or this rank's slot of op->count elements. */
void *cp_executor_op_buffer(const cp_executor *ex, const cp_op *op, cp_buffer k, cp_slot slot);
/* Library calls (cp_gpu_*, cp_hostlib_*): the unit's next instance of an op
 * group whose kinds are listed in group order (the plan may unshard a unit
 * twice per step, each instance with its own waits), from *cursor (where
 * the unit's previous call of this kind ended) to the group's last kind
 * present, wrapping to the step's start after the last instance; each op
 * through run(ctx, op). The library call kinds, in their ops' order: */
extern const cp_op_kind cp_call_unshard[4], cp_call_reshard[2], cp_call_reduce[10], cp_call_exchange[2];
/* The split unshard: its issue (copy-in, all-gather) and its wait (copy-out). */
extern const cp_op_kind cp_call_unshard_issue[3], cp_call_unshard_wait[1];
/* Returns 0, 1 when the plan has no such op for the unit (nothing to do), or
 * run's failure (-1). *cursor is left where the next search starts. */
int cp_run_call(const cp_plan *p, int unit, const cp_op_kind *kinds, int nkinds, int *cursor,
                int (*run)(void *ctx, const cp_op *op), void *ctx);

/* Expert parallelism: this rank's per-expert token counts (n = the unit's
 * a2a_experts, global expert order) for the unit's next A2A_COUNTS, which
 * sends them instead of asking on_a2a. Checked now against that op and
 * again when it runs: a negative count, or a member's share past the op's
 * a2a_capacity rows, is refused with one line in ex->err naming rank, op,
 * member, count and capacity (0 or -1). */
int cp_executor_set_expert_counts(cp_executor *ex, int unit, const int64_t *counts, int n);
/* The caller's own refusal of the counts for the unit's next A2A_COUNTS
 * (values it could not pass as int64: a fraction, a bool, past 2^63 - 1):
 * why, one line naming the rank, is what that exchange then refuses with,
 * as for counts cp_executor_set_expert_counts refused (every member
 * refuses the layer). Always -1 (a refusal), why in ex->err. */
int cp_executor_refuse_expert_counts(cp_executor *ex, int unit, const char *why);
/* The host copy of the unit's counts slot: [0, a2a_experts) sent, then
 * [a2a_experts, 2 x a2a_experts) received; NULL when out of range. */
const int64_t *cp_executor_a2a_counts(const cp_executor *ex, int unit, int slot);
/* The rows an A2A op sends to and receives from each member (n entries
 * each) as the counts of its A2A_COUNTS give them; 0, or -1 (no counts yet). */
int cp_executor_a2a_splits(const cp_executor *ex, const cp_op *op, int64_t *send_rows, int64_t *recv_rows);

/* The counts slot (as cp_executor_a2a_counts) an A2A op splits by, once its
 * A2A_COUNTS has filled it; NULL before, or for another kind of op. */
const int64_t *cp_executor_a2a_counts_of_op(const cp_executor *ex, const cp_op *op);

/* Whether any class of the plan has an expert-parallel all-to-all. */
int cp_plan_has_a2a(const cp_plan *p);

/* Host copies of a unit's whole buffer (checks, dumps), ordered on stream s. */
int cp_executor_read(cp_executor *ex, cp_stream s, int u, cp_buffer k, void *host);
int cp_executor_write(cp_executor *ex, cp_stream s, int u, cp_buffer k, const void *host);

/* Poison byte written into freed transient buffers so a read of resharded
 * data shows up as NaN / garbage in the checks. */
#define CP_POISON_BYTE 0xA5

#ifdef __cplusplus
}
#endif

#endif
