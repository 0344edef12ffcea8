/* The executor: the one op walker. For one rank it runs a plan's ops in
 * table order over a backend (host threads or NCCL): each op's event
 * waits, its work on the stream the generator chose, its event record.
 * Every fact about an op kind is in its descriptor below; nothing about
 * the schedule (streams, ordering, buffer placement) is decided here. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "commplan.h"

/* Kernel numbers as cp_gpu_kernels.h declares them (that header is the
 * CUDA-side face; this file stays plain C). */
enum { K_COPY_IN = 0, K_COPY_OUT = 1, K_PACK = 2, K_VIEW_OUT = 3, K_VIEW_OUT_ADD = 4, K_FLAT_COPY = 5, K_FLAT_ADD = 6 };
/* reshard_after_forward = k's copies: byte runs (cp_post_forward_piece) the
 * executor moves with the backend's copy_bytes, no generated kernel. */
enum { K_POST_FORWARD = -2 };

const cp_op_desc cp_op_descs[CP_OP_KIND_COUNT] = {
    [CP_OP_COPY_IN] = { .name = "copy_in", .action = CP_ACT_COPY, .kernel = K_COPY_IN,
                        .in = CP_BUF_SHARDED, .out = CP_BUF_AG, .frees = CP_BUF_NONE },
    [CP_OP_ALL_GATHER] = { .name = "all_gather", .action = CP_ACT_COLLECTIVE, .collective = CP_COLL_ALL_GATHER,
                           .in = CP_BUF_AG, .in_slot = CP_SLOT_SHARD, .out = CP_BUF_AG, .frees = CP_BUF_NONE,
                           .ring_passes = 1 },
    [CP_OP_COPY_OUT] = { .name = "copy_out", .action = CP_ACT_COPY, .kernel = K_COPY_OUT,
                         .in = CP_BUF_AG, .out = CP_BUF_UNSHARDED, .frees = CP_BUF_AG },
    [CP_OP_FORWARD] = { .name = "forward", .action = CP_ACT_COMPUTE, .in = CP_BUF_UNSHARDED, .out = CP_BUF_NONE,
                        .frees = CP_BUF_NONE },
    [CP_OP_BACKWARD] = { .name = "backward", .action = CP_ACT_COMPUTE, .in = CP_BUF_UNSHARDED, .out = CP_BUF_GRADS,
                         .frees = CP_BUF_NONE },
    [CP_OP_RESHARD] = { .name = "reshard", .action = CP_ACT_NONE, .in = CP_BUF_NONE, .out = CP_BUF_NONE,
                        .frees = CP_BUF_UNSHARDED },
    /* FSDP2 frees the unsharded grads after packing; the next backward
     * writes them afresh (autograd assigns on the first micro-step). */
    [CP_OP_PACK] = { .name = "pack", .action = CP_ACT_COPY, .kernel = K_PACK, .in = CP_BUF_GRADS,
                     .out = CP_BUF_RS_IN, .frees = CP_BUF_GRADS },
    [CP_OP_REDUCE_SCATTER] = { .name = "reduce_scatter", .action = CP_ACT_COLLECTIVE,
                               .collective = CP_COLL_REDUCE_SCATTER, .in = CP_BUF_RS_IN, .out = CP_BUF_RS_OUT,
                               .frees = CP_BUF_RS_IN, .ring_passes = 1 },
    [CP_OP_ALL_REDUCE] = { .name = "all_reduce", .action = CP_ACT_COLLECTIVE, .collective = CP_COLL_ALL_REDUCE,
                           .in = CP_BUF_RS_OUT, .out = CP_BUF_RS_OUT, .frees = CP_BUF_NONE, .ring_passes = 2 },
    [CP_OP_VIEW_OUT] = { .name = "view_out", .action = CP_ACT_COPY, .kernel = K_VIEW_OUT, .in = CP_BUF_RS_OUT,
                         .out = CP_BUF_SHARDED_GRADS, .frees = CP_BUF_RS_OUT },
    [CP_OP_TP_ALL_GATHER] = { .name = "tp_all_gather", .action = CP_ACT_COLLECTIVE,
                              .collective = CP_COLL_ALL_GATHER, .in = CP_BUF_ACT, .in_slot = CP_SLOT_TP,
                              .out = CP_BUF_ACT, .frees = CP_BUF_NONE, .ring_passes = 1, .activation = 1 },
    [CP_OP_TP_REDUCE_SCATTER] = { .name = "tp_reduce_scatter", .action = CP_ACT_COLLECTIVE,
                                  .collective = CP_COLL_REDUCE_SCATTER, .in = CP_BUF_ACT, .out = CP_BUF_ACT,
                                  .out_slot = CP_SLOT_TP, .frees = CP_BUF_NONE, .ring_passes = 1, .activation = 1 },
    [CP_OP_TP_ALL_REDUCE] = { .name = "tp_all_reduce", .action = CP_ACT_COLLECTIVE,
                              .collective = CP_COLL_ALL_REDUCE, .in = CP_BUF_ACT, .out = CP_BUF_ACT,
                              .frees = CP_BUF_NONE, .ring_passes = 2, .activation = 1 },
    /* FSDP2's sharded_param.grad += new_sharded_grad: a reduction after the
     * step's first adds into the sharded grads instead of assigning them. */
    [CP_OP_VIEW_OUT_ADD] = { .name = "view_out_add", .action = CP_ACT_COPY, .kernel = K_VIEW_OUT_ADD,
                             .in = CP_BUF_RS_OUT, .out = CP_BUF_SHARDED_GRADS, .frees = CP_BUF_RS_OUT, .adds = 1 },
    /* foreach_reduce without all_reduce_grads: partial_reduce_output = reduce_output
     * (then += reduce_output); with it, reduce_output += partial_reduce_output. */
    [CP_OP_PARTIAL_SAVE] = { .name = "partial_save", .action = CP_ACT_COPY, .kernel = K_FLAT_COPY,
                             .in = CP_BUF_RS_OUT, .out = CP_BUF_PARTIAL, .frees = CP_BUF_RS_OUT },
    [CP_OP_PARTIAL_ADD] = { .name = "partial_add", .action = CP_ACT_COPY, .kernel = K_FLAT_ADD,
                            .in = CP_BUF_RS_OUT, .out = CP_BUF_PARTIAL, .frees = CP_BUF_RS_OUT, .adds = 1 },
    [CP_OP_PARTIAL_FOLD] = { .name = "partial_fold", .action = CP_ACT_COPY, .kernel = K_FLAT_ADD,
                             .in = CP_BUF_PARTIAL, .out = CP_BUF_RS_OUT, .frees = CP_BUF_PARTIAL, .adds = 1 },
    /* Pipeline parallelism: a message of the unit's pp buffer, its slot
     * picked by the op's tag (direction) and micro-step. */
    [CP_OP_SEND] = { .name = "send", .action = CP_ACT_P2P, .in = CP_BUF_PP, .in_slot = CP_SLOT_PP,
                     .out = CP_BUF_NONE, .frees = CP_BUF_NONE },
    [CP_OP_RECV] = { .name = "recv", .action = CP_ACT_P2P, .in = CP_BUF_NONE, .out = CP_BUF_PP,
                     .out_slot = CP_SLOT_PP, .frees = CP_BUF_NONE },
    [CP_OP_BACKWARD_INPUT] = { .name = "backward_input", .action = CP_ACT_COMPUTE, .in = CP_BUF_UNSHARDED,
                               .out = CP_BUF_NONE, .frees = CP_BUF_NONE },
    /* Expert parallelism: in and out are the whole buffers; the counts op
     * uses its slot, and a combine runs recv -> send (run_a2a). */
    [CP_OP_A2A_COUNTS] = { .name = "a2a_counts", .action = CP_ACT_A2A, .in = CP_BUF_A2A_COUNTS,
                           .out = CP_BUF_A2A_COUNTS, .frees = CP_BUF_NONE },
    [CP_OP_A2A] = { .name = "a2a", .action = CP_ACT_A2A, .in = CP_BUF_A2A_SEND, .out = CP_BUF_A2A_RECV,
                    .frees = CP_BUF_NONE },
    /* CPU offload (torch 2.15 _fsdp_param.py:1143-1146, _fsdp_collectives.py:779-824): the
     * host's shards to the device copy the copy-in reads; the viewed-out grads to the host's
     * sharded grads, assigned, or (a later reduction) added on the host after the copy. */
    [CP_OP_H2D] = { .name = "h2d", .action = CP_ACT_HOST, .in = CP_BUF_SHARDED, .out = CP_BUF_H2D,
                    .frees = CP_BUF_NONE },
    [CP_OP_D2H] = { .name = "d2h", .action = CP_ACT_HOST, .in = CP_BUF_D2H, .out = CP_BUF_SHARDED_GRADS,
                    .frees = CP_BUF_D2H },
    [CP_OP_D2H_ADD] = { .name = "d2h_add", .action = CP_ACT_HOST, .in = CP_BUF_D2H, .out = CP_BUF_SHARDED_GRADS,
                        .frees = CP_BUF_D2H, .adds = 1 },
    /* fully_shard(reshard_after_forward=k): this rank's slice of the unsharded
     * parameters kept after forward (torch 2.15 _fsdp_param.py:970-1010); the
     * reshard after it frees them */
    [CP_OP_POST_FORWARD] = { .name = "post_forward", .action = CP_ACT_COPY, .kernel = K_POST_FORWARD,
                             .in = CP_BUF_UNSHARDED, .out = CP_BUF_POST_FORWARD, .frees = CP_BUF_NONE },
};

/* (CP_OP_H2D first: an offloading unit's unshard starts with its shards' copy to the device) */
const cp_op_kind cp_call_unshard[4] = { CP_OP_H2D, CP_OP_COPY_IN, CP_OP_ALL_GATHER, CP_OP_COPY_OUT };
const cp_op_kind cp_call_unshard_issue[3] = { CP_OP_H2D, CP_OP_COPY_IN, CP_OP_ALL_GATHER };
const cp_op_kind cp_call_unshard_wait[1] = { CP_OP_COPY_OUT };
/* (a unit with a post-forward group keeps its slice first: CP_OP_POST_FORWARD) */
const cp_op_kind cp_call_reshard[2] = { CP_OP_POST_FORWARD, CP_OP_RESHARD };
/* A dispatch exchanges the counts first; every other exchange is one A2A. */
const cp_op_kind cp_call_exchange[2] = { CP_OP_A2A_COUNTS, CP_OP_A2A };
/* Pack, reduce-scatter, all_reduce_last's partial sums, the HSDP all-reduce,
 * the view-out (assigning, or adding on a later reduction of the step). */
const cp_op_kind cp_call_reduce[10] = { CP_OP_PACK,        CP_OP_REDUCE_SCATTER, CP_OP_PARTIAL_SAVE,
                                        CP_OP_PARTIAL_ADD, CP_OP_PARTIAL_FOLD,   CP_OP_ALL_REDUCE,
                                        CP_OP_VIEW_OUT,    CP_OP_VIEW_OUT_ADD,   CP_OP_D2H,
                                        CP_OP_D2H_ADD };

int cp_run_call(const cp_plan *p, int unit, const cp_op_kind *kinds, int nkinds, int *cursor,
                int (*run)(void *ctx, const cp_op *op), void *ctx)
{
    /* The group's instance starts at its first kind present: an unshard
     * without a copy-in (zero copy-in) starts at its all-gather. */
    int first = -1;
    for (int pass = 0; pass < 2 && first < 0; pass++)
        for (int i = pass ? 0 : *cursor; i < p->nops && first < 0; i++) {
            if (p->ops[i].unit != unit) continue;
            for (int k = 0; k < nkinds && first < 0; k++)
                if (p->ops[i].kind == kinds[k]) first = i;
        }
    if (first < 0) return 1;
    int i = first, last_kind = 0;
    for (; i < p->nops; i++) {
        const cp_op *op = &p->ops[i];
        if (op->unit != unit) continue;
        int k = 0;
        while (k < nkinds && op->kind != kinds[k]) k++;
        if (k == nkinds) continue;
        if (k < last_kind) break; /* the group's next instance starts */
        if (run(ctx, op)) return -1;
        last_kind = k;
        if (k == nkinds - 1) { i++; break; }
    }
    *cursor = i < p->nops ? i : 0;
    return 0;
}

int cp_plan_has_a2a(const cp_plan *p)
{
    int nclasses = p->classes && p->nclasses > 0 ? p->nclasses : 0;
    for (int c = -1; c < nclasses; c++) {
        const cp_op *ops = c < 0 ? p->ops : p->classes[c].ops;
        int nops = c < 0 ? p->nops : p->classes[c].nops;
        for (int i = 0; i < nops; i++)
            if (ops[i].kind == CP_OP_A2A_COUNTS || ops[i].kind == CP_OP_A2A) return 1;
    }
    return 0;
}

const char *cp_op_kind_name(cp_op_kind k)
{
    return (unsigned)k < CP_OP_KIND_COUNT ? cp_op_descs[k].name : "?";
}

const char *cp_stream_name(cp_stream s)
{
    static const char *const names[CP_STREAM_COUNT] = { "compute", "copy_in", "all_gather", "reduce_scatter",
                                                        "all_reduce" };
    return (unsigned)s < CP_STREAM_COUNT ? names[s] : "?";
}

/* Every failure this rank reports is the job's: the backend stops the
 * ranks that share its process with the first one (cp_backend.abort). */
static void ex_abort(cp_executor *ex, const char *why)
{
    if (ex->backend && ex->backend->abort) ex->backend->abort(ex->backend, why);
}

/* One line into ex->err (and stderr unless quiet), with the backend's detail. */
static int ex_error(cp_executor *ex, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(ex->err, sizeof ex->err, fmt, ap);
    va_end(ap);
    const char *detail = ex->backend && ex->backend->last_error ? ex->backend->last_error(ex->backend) : NULL;
    if (detail && detail[0] && n > 0 && (size_t)n < sizeof ex->err)
        snprintf(ex->err + n, sizeof ex->err - (size_t)n, ": %s", detail);
    if (!ex->quiet) fprintf(stderr, "commplan: %s\n", ex->err);
    ex_abort(ex, ex->err);
    return -1;
}

/* One line into ex->err (and stderr unless quiet), without the backend's
 * detail: a refusal of the caller's data, not a failed call. */
static int ex_refuse(cp_executor *ex, const char *line)
{
    if (line != ex->err) snprintf(ex->err, sizeof ex->err, "%s", line);
    if (!ex->quiet) fprintf(stderr, "commplan: %s\n", ex->err);
    ex_abort(ex, ex->err);
    return -1;
}

static int fail_init(cp_executor *ex);
static int cp_executor_run_op_(cp_executor *ex, const cp_op *op);
enum { FAULT_NONE, FAULT_SKIP, FAULT_COUNT, FAULT_STOP, FAULT_KILL };
static int fault_at(const cp_executor *ex, const cp_op *op);
static int fault_stop(cp_executor *ex, const cp_op *op, int kind);
static const cp_op *fault_count(cp_executor *ex, const cp_op *op, cp_op *wrong);
static void fault_parse(void);
static int fault_check(cp_executor *ex, const cp_plan *p, int rank);
static volatile int fault_released; /* set by the job's first failure: a stopped rank then fails too */
static volatile sig_atomic_t term_dumped; /* a failure's cursor is written: SIGTERM leaves it */
/* The executors of this process, for cp_cursor_write (threads of
 * --simulate: one per rank), by rank % CP_CURSOR_MAX: a process of one
 * rank (the GPU path, the libraries) keeps its cursor whatever its rank; a
 * --simulate run of more ranks keeps the first of each slot's (ranks
 * 0..CP_CURSOR_MAX-1), the others write none (docs/diagnosis.md). */
#define CP_CURSOR_MAX 4096
static cp_executor *volatile cursor_ex[CP_CURSOR_MAX];

int cp_executor_init(cp_executor *ex, const cp_plan *p, int rank, cp_backend *b)
{
    int quiet = ex->quiet;
    memset(ex, 0, sizeof *ex);
    ex->quiet = quiet;
    ex->backend = b;
    if (rank < 0 || rank >= p->world_size)
        return ex_error(ex, "rank %d is outside plan %s's world of %d ranks", rank, p->name, p->world_size);
    cp_plan_view(p, rank, &ex->view);
    ex->plan = p = &ex->view;
    fault_parse();
    if (fault_check(ex, p, rank) != 0) return -1;
    ex->rank = rank;
    ex->cur_op = -1;
    ex->cur_first = -1;
    ex->shard_rank = cp_shard_rank(p, rank);
    ex->replicate_rank = cp_replicate_rank(p, rank);
    ex->tp_rank = cp_tp_rank(p, rank);
    ex->pp_rank = cp_pp_rank(p, rank);
    size_t n = (size_t)(p->nunits > 0 ? p->nunits : 1);
    for (int k = 0; k < CP_BUFFERS; k++)
        if (!(ex->buf[k] = calloc(n, sizeof(void *)))) goto oom;
    if (!(ex->unsharded_live = calloc(n, 1))) goto oom;
    /* Each wait's op: the latest op before it in table order that records
     * its slot (the generator's proof orders exactly that one). */
    {
        size_t nops = (size_t)(p->nops > 0 ? p->nops : 1), nslots = (size_t)(p->nevents > 0 ? p->nevents : 1);
        size_t total = 0;
        for (int i = 0; i < p->nops; i++) total += (size_t)(p->ops[i].wait_count > 0 ? p->ops[i].wait_count : 0);
        if (!(ex->wait_base = calloc(nops, sizeof *ex->wait_base)) ||
            !(ex->wait_means = calloc(total ? total : 1, sizeof *ex->wait_means)) ||
            !(ex->slot_last = malloc(nslots * sizeof *ex->slot_last)))
            goto oom;
        for (size_t s = 0; s < nslots; s++) ex->slot_last[s] = -1;
        int at = 0;
        for (int i = 0; i < p->nops; i++) {
            const cp_op *o = &p->ops[i];
            ex->wait_base[i] = at;
            for (int k = 0; k < o->wait_count; k++) {
                int s = p->waits[o->wait_first + k];
                ex->wait_means[at++] = (s >= 0 && s < p->nevents) ? ex->slot_last[s] : -1;
            }
            if (o->event >= 0 && o->event < p->nevents) ex->slot_last[o->event] = i;
        }
        for (size_t s = 0; s < nslots; s++) ex->slot_last[s] = -1;
    }
    /* Expert parallelism: host copies of every counts slot, the counts given
     * ahead, and one op's splits (2 x the largest family an A2A uses). */
    {
        int most = 1, experts = 1;
        for (int u = 0; u < p->nunits; u++)
            if (p->units[u].a2a_experts > experts) experts = p->units[u].a2a_experts;
        for (int i = 0; i < p->nops; i++)
            if (p->ops[i].kind == CP_OP_A2A && p->ops[i].family >= 0 && p->ops[i].family < p->nfamilies &&
                p->families[p->ops[i].family].size > most)
                most = p->families[p->ops[i].family].size;
        if (!(ex->a2a_counts = calloc(n, sizeof *ex->a2a_counts)) ||
            !(ex->a2a_pending = calloc(n, sizeof *ex->a2a_pending)) ||
            !(ex->a2a_filled = calloc(n, sizeof *ex->a2a_filled)) || !(ex->a2a_has_pending = calloc(n, 1)) ||
            !(ex->a2a_cursor = calloc(n, sizeof *ex->a2a_cursor)) ||
            !(ex->a2a_rows = calloc(2 * (size_t)most, sizeof *ex->a2a_rows)) ||
            !(ex->a2a_prev = calloc((size_t)experts, sizeof *ex->a2a_prev)))
            goto oom;
        for (int u = 0; u < p->nunits; u++) {
            const cp_unit *U = &p->units[u];
            if (U->a2a_slots <= 0 || U->a2a_experts <= 0) continue;
            size_t E = (size_t)U->a2a_experts, slots = (size_t)U->a2a_slots;
            if (!(ex->a2a_counts[u] = calloc(2 * slots * E, sizeof(int64_t))) ||
                !(ex->a2a_pending[u] = calloc(E, sizeof(int64_t))) ||
                !(ex->a2a_filled[u] = malloc(slots * sizeof(int))))
                goto oom;
            for (size_t k = 0; k < slots; k++) ex->a2a_filled[u][k] = -1;
        }
    }
    /* Transient buffers live in one arena at the generator's offsets: a
     * wrong memory plan corrupts live data and the exact checks see it. */
    size_t arena_bytes = (size_t)(p->arena_bytes > 0 ? p->arena_bytes : 1);
    /* fsdp.symm_mem: the arena's first symm_bytes one symmetric window (commplan.h cp_plan.symm_bytes) */
    ex->arena = p->symm_bytes > 0 && b->alloc_symm ? b->alloc_symm(b, arena_bytes, (size_t)p->symm_bytes)
                                                   : b->alloc(b, arena_bytes);
    if (!ex->arena) {
        ex_error(ex, "rank %d: allocating the %lld-byte buffer arena of plan %s failed (SCHEDULE.md's memory section "
                 "says how much a rank needs; use more ranks)", rank, (long long)p->arena_bytes, p->name);
        return fail_init(ex);
    }
    for (int u = 0; u < p->nunits; u++) {
        const cp_unit *U = &p->units[u];
        for (int k = 0; k < CP_ARENA_BUFFERS; k++) ex->buf[k][u] = ex->arena + U->arena_offset[k];
        for (int k = CP_BUF_SHARDED; k < CP_BUFFERS; k++) {
            size_t bytes = (size_t)cp_arena_buffer_bytes(p, u, (cp_buffer)k);
            /* CPU offload: the unit's shards and reduced grads in host memory */
            void *mem = U->offload && b->alloc_host ? b->alloc_host(b, bytes ? bytes : 16, U->pin_memory)
                                                    : b->alloc(b, bytes ? bytes : 16);
            if (!(ex->buf[k][u] = mem)) {
                ex_error(ex, "rank %d: allocating %zu bytes for unit %s of plan %s failed (use more ranks)", rank,
                         bytes, U->name, p->name);
                return fail_init(ex);
            }
        }
    }
    return 0;
oom:
    ex_error(ex, "out of host memory for rank %d's executor", rank);
    return fail_init(ex);
}

/* Frees what init allocated, keeping the message. */
static int fail_init(cp_executor *ex)
{
    char err[sizeof ex->err];
    int quiet = ex->quiet;
    memcpy(err, ex->err, sizeof err);
    cp_executor_free(ex);
    memcpy(ex->err, err, sizeof err);
    ex->quiet = quiet;
    return -1;
}

void cp_executor_free(cp_executor *ex)
{
    if (!ex->plan) return;
    if (cursor_ex[ex->rank % CP_CURSOR_MAX] == ex) cursor_ex[ex->rank % CP_CURSOR_MAX] = NULL;
    cp_backend *b = ex->backend;
    for (int k = CP_BUF_SHARDED; k < CP_BUFFERS; k++)
        if (ex->buf[k])
            for (int u = 0; u < ex->plan->nunits; u++)
                if (ex->buf[k][u]) {
                    const cp_unit *U = &ex->plan->units[u];
                    if (U->offload && b->free_host) b->free_host(b, ex->buf[k][u], U->pin_memory);
                    else b->free(b, ex->buf[k][u]);
                }
    if (ex->arena) b->free(b, ex->arena);
    for (int k = 0; k < CP_BUFFERS; k++) free(ex->buf[k]);
    free(ex->unsharded_live);
    for (int u = 0; u < ex->plan->nunits; u++) {
        if (ex->a2a_counts) free(ex->a2a_counts[u]);
        if (ex->a2a_pending) free(ex->a2a_pending[u]);
        if (ex->a2a_filled) free(ex->a2a_filled[u]);
    }
    free(ex->a2a_counts);
    free(ex->a2a_pending);
    free(ex->a2a_filled);
    free(ex->a2a_has_pending);
    free(ex->a2a_cursor);
    free(ex->a2a_rows);
    free(ex->a2a_prev);
    free(ex->wait_base);
    free(ex->wait_means);
    free(ex->slot_last);
    memset(ex, 0, sizeof *ex);
}

void *cp_executor_param_ptr(const cp_executor *ex, int param, cp_buffer k)
{
    const cp_plan *p = ex->plan;
    if (param < 0 || param >= p->nparams) return NULL;
    int u = 0;
    while (u < p->nunits && param >= p->units[u].first_param + p->units[u].nparams) u++;
    if (u == p->nunits) return NULL;
    const cp_unit *U = &p->units[u];
    const cp_param *prm = &p->params[param];
    char *base = ex->buf[k][u];
    switch (k) {
    case CP_BUF_UNSHARDED: return base + (size_t)cp_param_unsharded_offset(U, prm, cp_unit_shard_size(p, u));
    case CP_BUF_GRADS: return prm->frozen ? NULL : base + (size_t)prm->grad_offset * cp_dtype_size(U->grad_dtype);
    /* (a frozen parameter has no gradient: the sharded grads hold the trainable ones) */
    case CP_BUF_SHARDED_GRADS:
        return prm->frozen ? NULL : base + (size_t)cp_param_rs_offset(U, prm) * cp_dtype_size(U->orig_dtype);
    default: return base + (size_t)prm->offset * cp_dtype_size(U->orig_dtype);
    }
}

void *cp_executor_buffer(const cp_executor *ex, int u, cp_buffer k)
{
    return ex->buf[k][u];
}

void *cp_executor_op_buffer(const cp_executor *ex, const cp_op *op, cp_buffer k, cp_slot slot)
{
    if (k == CP_BUF_NONE) return NULL;
    /* Zero copy-in: the all-gather's input slot is the sharded storage itself. */
    if (op->from_sharded && k == CP_BUF_AG && slot == CP_SLOT_SHARD) return ex->buf[CP_BUF_SHARDED][op->unit];
    /* The all-gather over a post-forward group reads the slice kept after forward. */
    if (op->post_forward && k == CP_BUF_AG && slot == CP_SLOT_SHARD) return ex->buf[CP_BUF_POST_FORWARD][op->unit];
    /* CPU offload: the copy-in reads the device copy of the host's shards, the
     * view-out writes the device copy the D2H then moves to the host. */
    if (ex->plan->units[op->unit].offload) {
        if (op->kind == CP_OP_COPY_IN && k == CP_BUF_SHARDED) return ex->buf[CP_BUF_H2D][op->unit];
        if (op->kind == CP_OP_VIEW_OUT && k == CP_BUF_SHARDED_GRADS) return ex->buf[CP_BUF_D2H][op->unit];
    }
    char *base = ex->buf[k][op->unit];
    size_t es = cp_dtype_size(op->dtype);
    if (slot == CP_SLOT_PP) { /* [direction][micro-step] messages of op->count elements */
        size_t at = (size_t)(op->tag & 1) * (size_t)ex->plan->micro_steps + (size_t)op->micro_step;
        return base + at * (size_t)op->count * es;
    }
    int r = slot == CP_SLOT_SHARD ? (ex->plan->units[op->unit].expert ? cp_unit_shard_rank(ex->plan, op->unit, ex->rank)
                                                                       : ex->shard_rank)
            : slot == CP_SLOT_TP ? cp_op_group_key(ex->plan, op, ex->rank) : 0;
    return base + (size_t)r * (size_t)op->count * es;
}

/* An offloading unit's sharded buffers are host memory: the host reads and
 * writes them in place, after the stream's work (a D2H) is done. */
static int host_side(cp_executor *ex, int u, cp_buffer k)
{
    return ex->plan->units[u].offload && (k == CP_BUF_SHARDED || k == CP_BUF_SHARDED_GRADS);
}

int cp_executor_read(cp_executor *ex, cp_stream s, int u, cp_buffer k, void *host)
{
    if (host_side(ex, u, k)) {
        cp_backend *b = ex->backend;
        if (b->sync && b->sync(b, s)) return -1;
        memcpy(host, ex->buf[k][u], (size_t)cp_arena_buffer_bytes(ex->plan, u, k));
        return 0;
    }
    return ex->backend->read(ex->backend, s, ex->buf[k][u], host, (size_t)cp_arena_buffer_bytes(ex->plan, u, k));
}

int cp_executor_write(cp_executor *ex, cp_stream s, int u, cp_buffer k, const void *host)
{
    if (host_side(ex, u, k)) {
        cp_backend *b = ex->backend;
        if (b->sync && b->sync(b, s)) return -1;
        memcpy(ex->buf[k][u], host, (size_t)cp_arena_buffer_bytes(ex->plan, u, k));
        return 0;
    }
    return ex->backend->write(ex->backend, s, ex->buf[k][u], host, (size_t)cp_arena_buffer_bytes(ex->plan, u, k));
}

/* reshard_after_forward = k: the post-forward copy (this rank's slice of
 * each parameter) or the copy-out after the all-gather over the
 * post-forward group (each member's slice back into place), as byte runs
 * on the op's stream (cp_post_forward_piece). */
static int post_forward_copy(cp_executor *ex, const cp_op *op, const void *in, void *out)
{
    const cp_plan *p = ex->plan;
    const cp_unit *U = &p->units[op->unit];
    int copy_out = op->kind == CP_OP_COPY_OUT, n = U->nparams * (copy_out ? U->post_forward : 1);
    if (U->post_forward < 2) return -1;
    for (int i = 0; i < n; i++) {
        int64_t from, to, bytes;
        cp_post_forward_piece(p, op->unit, cp_unit_shard_rank(p, op->unit, ex->rank), copy_out, i, &from, &to, &bytes);
        if (ex->backend->copy_bytes(ex->backend, op->stream, (const char *)in + from, (char *)out + to, (size_t)bytes))
            return -1;
    }
    return 0;
}

static int failed(cp_executor *ex, const cp_op *op, const char *what)
{
    long x = op >= ex->plan->ops && op < ex->plan->ops + ex->plan->nops ? (long)(op - ex->plan->ops) : ex->cur_op;
    return ex_error(ex, "rank %d: %s of %s of unit %s (op %ld) failed", ex->rank, what, cp_op_kind_name(op->kind),
                    ex->plan->units[op->unit].name, x);
}

/* Host copies of a collective's input and output for the observer. An
 * in-place collective's input is read before it runs (into *before). */
static int observe(cp_executor *ex, const cp_op *op, const void *in, int64_t in_n, void *before, const void *out,
                   int64_t out_n)
{
    cp_backend *b = ex->backend;
    size_t es = cp_dtype_size(op->dtype);
    void *in_host = before, *out_host = malloc((size_t)out_n * es + 1);
    int rc = -1;
    if (!out_host) goto done;
    if (!before) {
        if (!(in_host = malloc((size_t)in_n * es + 1)) || b->read(b, op->stream, in, in_host, (size_t)in_n * es))
            goto done;
    }
    if (b->read(b, op->stream, out, out_host, (size_t)out_n * es)) goto done;
    ex->on_collective(ex->user, ex, op, in_host, in_n, out_host, out_n);
    rc = 0;
done:
    if (in_host != before) free(in_host);
    free(out_host);
    return rc;
}

static int run_collective(cp_executor *ex, const cp_op *op, const cp_op_desc *d, void *in, void *out)
{
    const cp_plan *p = ex->plan;
    cp_backend *b = ex->backend;
    /* Elements in and out, the recordings' in_numel / out_numel. */
    int64_t n = op->family >= 0 ? p->families[op->family].size : 1;
    int64_t in_n = d->collective == CP_COLL_REDUCE_SCATTER ? n * op->count : op->count;
    int64_t out_n = d->collective == CP_COLL_ALL_GATHER ? n * op->count : op->count;
    size_t es = cp_dtype_size(op->dtype);
    if (d->activation && ex->on_activation && ex->on_activation(ex->user, ex, op, 0))
        return failed(ex, op, "preparing the activation");
    void *before = NULL;
    /* In place whenever input and output overlap, not only when they start
     * together: a TP reduce-scatter's output is its rank's slot inside the
     * input, which the collective overwrites. Read the input first. */
    uintptr_t ib = (uintptr_t)in, ob = (uintptr_t)out;
    if (ex->on_collective && ib < ob + (size_t)out_n * es && ob < ib + (size_t)in_n * es) {
        if (!(before = malloc((size_t)in_n * es + 1))) return failed(ex, op, "host copy for the observer");
        if (b->read(b, op->stream, in, before, (size_t)in_n * es)) { free(before); return failed(ex, op, "read"); }
    }
    int rc;
    if (op->family < 0) /* a one-rank group: the collective is the identity */
        rc = in == out ? 0 : b->copy_bytes(b, op->stream, in, out, (size_t)op->count * es);
    else
        rc = b->collective[d->collective](b, op, op->stream, in, out);
    if (rc == 0 && ex->on_collective && observe(ex, op, in, in_n, before, out, out_n)) rc = -1;
    free(before);
    if (rc) return failed(ex, op, "the collective");
    if (d->activation && ex->on_activation && ex->on_activation(ex->user, ex, op, 1))
        return failed(ex, op, "checking the activation");
    return 0;
}

/* A point-to-point op's failure: one line naming rank, op, kind, unit, peer and tag. */
static int p2p_failed(cp_executor *ex, const cp_op *op, const char *what)
{
    const cp_plan *p = ex->plan;
    int send = op->kind == CP_OP_SEND;
    return ex_error(ex, "rank %d: op %ld (%s of unit %s %s pp stage %d = rank %d, tag %d, micro-step %d): %s failed",
                    ex->rank, (long)(op - p->ops), cp_op_kind_name(op->kind), p->units[op->unit].name,
                    send ? "to" : "from", op->peer,
                    op->peer >= 0 && op->peer < p->pp_size ? cp_pp_peer_rank(p, ex->rank, op->peer) : -1, op->tag,
                    op->micro_step, what);
}

/* A send (the caller's message written first: on_p2p after = 0) or a
 * receive (handed to on_p2p once complete: now, or when its batch's group
 * closes) with the rank whose pp coordinate is op->peer. */
static int run_p2p(cp_executor *ex, const cp_op *op, void *in, void *out)
{
    const cp_plan *p = ex->plan;
    cp_backend *b = ex->backend;
    int sends = op->kind == CP_OP_SEND;
    if (p->pp_size <= 1 || op->peer < 0 || op->peer >= p->pp_size || op->peer == ex->pp_rank)
        return ex_error(ex, "rank %d: %s of unit %s (op %ld) names pp peer %d, not another stage of this rank's %d "
                        "(pp coordinate %d): regenerate the plan", ex->rank, cp_op_kind_name(op->kind),
                        p->units[op->unit].name, (long)(op - p->ops), op->peer, p->pp_size, ex->pp_rank);
    /* The message's slot must lie inside the unit's pp buffer (2 x micro_steps x pp_numel). */
    int64_t es = (int64_t)cp_dtype_size(op->dtype), have = cp_arena_buffer_bytes(p, op->unit, CP_BUF_PP);
    int64_t end = (((int64_t)(op->tag & 1) * p->micro_steps + op->micro_step) + 1) * op->count * es;
    if (op->tag < 0 || op->micro_step < 0 || op->micro_step >= p->micro_steps || op->count < 0 ||
        op->count > p->units[op->unit].pp_numel || end > have)
        return ex_error(ex, "rank %d: %s of unit %s (op %ld), tag %d micro-step %d, %lld bytes, lies outside the unit's "
                        "%lld-byte pp buffer: regenerate the plan", ex->rank, cp_op_kind_name(op->kind),
                        p->units[op->unit].name, (long)(op - p->ops), op->tag, op->micro_step,
                        (long long)(op->count * es), (long long)have);
    if (sends ? !b->send : !b->recv)
        return p2p_failed(ex, op, "finding the backend's point-to-point operations");
    int peer = cp_pp_peer_rank(p, ex->rank, op->peer);
    if (sends) {
        if (ex->on_p2p && ex->on_p2p(ex->user, ex, op, 0)) return p2p_failed(ex, op, "writing the message");
        if (b->send(b, op, op->stream, in, peer)) return p2p_failed(ex, op, "the send");
        return 0;
    }
    if (b->recv(b, op, op->stream, out, peer)) return p2p_failed(ex, op, "the receive");
    if (!ex->open_batch && ex->on_p2p && ex->on_p2p(ex->user, ex, op, 1)) return p2p_failed(ex, op, "checking the message");
    return 0;
}

/* ---- expert parallelism's all-to-alls ---- */

/* The op's ep group: n members, this rank member key (1 and 0 without one). */
static void a2a_group(const cp_executor *ex, const cp_op *op, int *n, int *color, int *key)
{
    *n = 1, *color = 0, *key = 0;
    if (op->family < 0) return;
    *n = ex->plan->families[op->family].size;
    cp_group_of(ex->plan, op->family, ex->rank, color, key);
}

/* Whether op's fields fit the unit and the plan; else one line into why. */
static int a2a_fields_ok(const cp_executor *ex, const cp_op *op, char *why, size_t n)
{
    const cp_plan *p = ex->plan;
    const cp_unit *U = &p->units[op->unit];
    if (op->family >= p->nfamilies) return snprintf(why, n, "family %d is outside the plan's %d", op->family,
                                                     p->nfamilies), -1;
    int members = op->family >= 0 ? p->families[op->family].size : 1;
    if (op->a2a_experts <= 0 || (int64_t)members * op->a2a_experts != U->a2a_experts)
        return snprintf(why, n, "%d experts per member x %d members is not the unit's %d experts", op->a2a_experts,
                        members, U->a2a_experts), -1;
    if (op->a2a_dim <= 0 || op->a2a_capacity < 0 || op->a2a_capacity > INT64_MAX / 4 / op->a2a_dim / members)
        return snprintf(why, n, "row length %lld or capacity %lld rows is out of range", (long long)op->a2a_dim,
                        (long long)op->a2a_capacity), -1;
    return 0;
}

/* Counts given for a member-major expert order (counts[m x epp + e]):
 * each >= 0, each member's share at most the op's capacity. 0, or -1 with
 * one line (rank, op, member, count, capacity) into msg. received: counts
 * that came from the members, not the ones this rank sends. */
static int a2a_check_counts(const cp_executor *ex, const cp_op *op, const int64_t *counts, int received, char *msg,
                            size_t len)
{
    const cp_plan *p = ex->plan;
    int n, color, key;
    a2a_group(ex, op, &n, &color, &key);
    int epp = op->a2a_experts;
    long x = (long)(op - p->ops);
    const char *unit = p->units[op->unit].name;
    for (int m = 0; m < n; m++) {
        int peer = op->family >= 0 ? cp_group_member(p, op->family, color, m) : ex->rank;
        int64_t sum = 0; /* saturating: counts near INT64_MAX never wrap */
        for (int e = 0; e < epp; e++) {
            int64_t c = counts[(size_t)m * (size_t)epp + (size_t)e];
            if (c < 0) {
                if (received)
                    snprintf(msg, len, "rank %d: op %ld (a2a_counts of unit %s, micro-step %d): ep member %d (rank %d) "
                             "sent a negative count %lld for local expert %d: the ranks' tables or counts disagree",
                             ex->rank, x, unit, op->micro_step, m, peer, (long long)c, e);
                else
                    snprintf(msg, len, "rank %d: op %ld (a2a_counts of unit %s, micro-step %d): expert %d's count %lld "
                             "for ep member %d (rank %d) is negative (capacity %lld rows per member)", ex->rank, x,
                             unit, op->micro_step, m * epp + e, (long long)c, m, peer, (long long)op->a2a_capacity);
                return -1;
            }
            sum = c > INT64_MAX - sum ? INT64_MAX : sum + c;
        }
        if (sum <= op->a2a_capacity) continue;
        if (received)
            snprintf(msg, len, "rank %d: op %ld (a2a_counts of unit %s, micro-step %d): ep member %d (rank %d) sends "
                     "%lld tokens, past this rank's capacity of %lld rows: the ranks' tables or counts disagree",
                     ex->rank, x, unit, op->micro_step, m, peer, (long long)sum, (long long)op->a2a_capacity);
        else
            snprintf(msg, len, "rank %d: op %ld (a2a_counts of unit %s, micro-step %d): %lld tokens for ep member %d "
                     "(rank %d, experts %d..%d) exceed its capacity of %lld rows: raise the plan's expert capacity or "
                     "route fewer tokens", ex->rank, x, unit, op->micro_step, (long long)sum, m, peer, m * epp,
                     (m + 1) * epp - 1, (long long)op->a2a_capacity);
        return -1;
    }
    return 0;
}

/* The unit's next A2A_COUNTS from its cursor (wrapping), or NULL. */
static const cp_op *next_counts_op(const cp_executor *ex, int unit)
{
    const cp_plan *p = ex->plan;
    for (int pass = 0; pass < 2; pass++)
        for (int i = pass ? 0 : ex->a2a_cursor[unit]; i < p->nops; i++)
            if (p->ops[i].kind == CP_OP_A2A_COUNTS && p->ops[i].unit == unit) return &p->ops[i];
    return NULL;
}

/* The unit's next A2A_COUNTS, or NULL after one line (a unit without one). */
static const cp_op *counts_unit(cp_executor *ex, int unit)
{
    const cp_plan *p = ex->plan;
    if (unit < 0 || unit >= p->nunits) {
        ex_error(ex, "rank %d: expert counts for unit %d, outside the plan's %d units", ex->rank, unit, p->nunits);
        return NULL;
    }
    const cp_op *op = next_counts_op(ex, unit);
    if (!op || !ex->a2a_pending[unit]) {
        ex_error(ex, "rank %d: expert counts for unit %s, which has no expert-parallel all-to-all", ex->rank,
                 p->units[unit].name);
        return NULL;
    }
    return op;
}

int cp_executor_refuse_expert_counts(cp_executor *ex, int unit, const char *why)
{
    if (!counts_unit(ex, unit)) return -1;
    ex->a2a_has_pending[unit] = 2;
    ex->a2a_refused_unit = unit;
    if (why && why[0]) snprintf(ex->a2a_refused, sizeof ex->a2a_refused, "%s", why);
    else snprintf(ex->a2a_refused, sizeof ex->a2a_refused, "rank %d: the caller refused its expert counts for unit %s",
                  ex->rank, ex->plan->units[unit].name);
    /* One line: a newline or other control character in the caller's text is shown as '?'. */
    for (char *c = ex->a2a_refused; *c; c++)
        if ((unsigned char)*c < 0x20 || *c == 0x7f) *c = '?';
    return ex_refuse(ex, ex->a2a_refused);
}

int cp_executor_set_expert_counts(cp_executor *ex, int unit, const int64_t *counts, int n)
{
    const cp_plan *p = ex->plan;
    const cp_op *op = counts_unit(ex, unit);
    if (!op) return -1;
    /* Refused from here on: the counts given before are dropped too, and the exchange this call was for
     * refuses (on every member) with this line rather than running with them. */
    ex->a2a_has_pending[unit] = 2;
    ex->a2a_refused_unit = unit;
    char why[200];
    if (!counts || n != p->units[unit].a2a_experts)
        snprintf(ex->a2a_refused, sizeof ex->a2a_refused, "rank %d: %d expert counts for unit %s, which has %d "
                 "experts", ex->rank, counts ? n : 0, p->units[unit].name, p->units[unit].a2a_experts);
    else if (a2a_fields_ok(ex, op, why, sizeof why))
        snprintf(ex->a2a_refused, sizeof ex->a2a_refused, "rank %d: op %ld (a2a_counts of unit %s): %s: regenerate "
                 "the plan", ex->rank, (long)(op - p->ops), p->units[unit].name, why);
    else if (a2a_check_counts(ex, op, counts, 0, ex->a2a_refused, sizeof ex->a2a_refused) == 0) {
        memcpy(ex->a2a_pending[unit], counts, (size_t)n * sizeof *counts);
        ex->a2a_has_pending[unit] = 1;
        return 0;
    }
    return ex_refuse(ex, ex->a2a_refused);
}

const int64_t *cp_executor_a2a_counts(const cp_executor *ex, int unit, int slot)
{
    const cp_plan *p = ex->plan;
    if (unit < 0 || unit >= p->nunits || !ex->a2a_counts || !ex->a2a_counts[unit] || slot < 0 ||
        slot >= p->units[unit].a2a_slots)
        return NULL;
    return ex->a2a_counts[unit] + 2 * (size_t)slot * (size_t)p->units[unit].a2a_experts;
}

/* Its counts op, when it is one of this unit's earlier A2A_COUNTS with the same group and experts. */
static const cp_op *a2a_counts_of(const cp_executor *ex, const cp_op *op)
{
    const cp_plan *p = ex->plan;
    long x = (long)(op - p->ops);
    int c = op->a2a_counts_op;
    if (c < 0 || c >= p->nops || (x >= 0 && x < p->nops && c >= x)) return NULL;
    const cp_op *k = &p->ops[c];
    if (k->kind != CP_OP_A2A_COUNTS || k->unit != op->unit || k->family != op->family ||
        k->a2a_experts != op->a2a_experts || k->a2a_capacity != op->a2a_capacity || k->a2a_slot < 0 ||
        k->a2a_slot >= p->units[op->unit].a2a_slots)
        return NULL;
    return k;
}

int cp_executor_a2a_splits(const cp_executor *ex, const cp_op *op, int64_t *send_rows, int64_t *recv_rows)
{
    const cp_op *k = a2a_counts_of(ex, op);
    if (!k || ex->a2a_filled[op->unit][k->a2a_slot] != op->a2a_counts_op) return -1;
    const int64_t *c = cp_executor_a2a_counts(ex, op->unit, k->a2a_slot);
    int n, color, key;
    a2a_group(ex, op, &n, &color, &key);
    int epp = op->a2a_experts;
    const int64_t *sent = c, *got = c + (size_t)n * (size_t)epp;
    for (int m = 0; m < n; m++) {
        int64_t to = 0, from = 0;
        for (int e = 0; e < epp; e++) {
            to += sent[(size_t)m * (size_t)epp + (size_t)e];
            from += got[(size_t)m * (size_t)epp + (size_t)e];
        }
        send_rows[m] = op->a2a_combine ? from : to;
        recv_rows[m] = op->a2a_combine ? to : from;
    }
    return 0;
}

/* The counts all-to-all. Every member exchanges whatever happens before
 * it: a rank whose counts are missing or refused sends -1 in every entry
 * instead, so every member refuses the layer together (no peer is left
 * waiting in the tokens' all-to-all). The received counts come back to the
 * host, where the tokens' splits are needed (a stream synchronisation). */
static int run_a2a_counts(cp_executor *ex, const cp_op *op)
{
    const cp_plan *p = ex->plan;
    cp_backend *b = ex->backend;
    const cp_unit *U = &p->units[op->unit];
    long x = (long)(op - p->ops);
    char why[200] = "";
    int bad = a2a_fields_ok(ex, op, why, sizeof why);
    if (!bad && (op->a2a_slot < 0 || op->a2a_slot >= U->a2a_slots || !ex->a2a_counts[op->unit] ||
                 cp_arena_buffer_bytes(p, op->unit, CP_BUF_A2A_COUNTS) <
                     2 * (int64_t)(op->a2a_slot + 1) * U->a2a_experts * (int64_t)sizeof(int64_t))) {
        snprintf(why, sizeof why, "counts slot %d is outside the unit's %d", op->a2a_slot, U->a2a_slots);
        bad = 1;
    }
    /* A recompute (activation checkpointing re-runs the forward in backward): its forward's counts op, which
     * must be an earlier A2A_COUNTS of the unit's same slot and group, the last to fill that slot. */
    const cp_op *fwd = NULL;
    if (!bad && op->a2a_counts_op >= 0) {
        int c = op->a2a_counts_op;
        fwd = c < p->nops && (x < 0 || x >= p->nops || c < x) ? &p->ops[c] : NULL;
        if (!fwd || fwd->kind != CP_OP_A2A_COUNTS || fwd->unit != op->unit || fwd->family != op->family ||
            fwd->a2a_experts != op->a2a_experts || fwd->a2a_slot != op->a2a_slot || fwd->a2a_counts_op >= 0) {
            snprintf(why, sizeof why, "a recompute names op %d as its forward, not an earlier forward a2a_counts of its "
                     "unit, group and slot", c);
            bad = 1;
        }
    }
    if (bad)
        return ex_error(ex, "rank %d: op %ld (a2a_counts of unit %s): %s: regenerate the plan", ex->rank, x, U->name,
                        why);
    if (fwd && ex->a2a_filled[op->unit][op->a2a_slot] != op->a2a_counts_op)
        return ex_error(ex, "rank %d: op %ld (a2a_counts of unit %s, micro-step %d) recomputes op %d's counts, which "
                        "slot %d does not hold: ops ran out of the plan's order", ex->rank, x, U->name, op->micro_step,
                        op->a2a_counts_op, op->a2a_slot);
    int n, color, key;
    a2a_group(ex, op, &n, &color, &key);
    size_t E = (size_t)U->a2a_experts;
    int64_t *host = ex->a2a_counts[op->unit] + 2 * (size_t)op->a2a_slot * E;
    char *dev = (char *)ex->buf[CP_BUF_A2A_COUNTS][op->unit] + 2 * (size_t)op->a2a_slot * E * sizeof(int64_t);
    if (fwd) memcpy(ex->a2a_prev, host + E, E * sizeof *host);
    ex->a2a_filled[op->unit][op->a2a_slot] = -1;
    char refused[sizeof ex->err] = "";
    int quiet = ex->quiet;
    ex->quiet = 1; /* the hook's refusal is said once, below */
    ex->err[0] = '\0';
    if (ex->on_a2a && ex->on_a2a(ex->user, ex, op, 0))
        snprintf(refused, sizeof refused, "%s", ex->err[0] ? ex->err : "the expert counts hook failed");
    ex->quiet = quiet;
    if (!refused[0] && ex->a2a_has_pending[op->unit] == 2 && ex->a2a_refused_unit == op->unit)
        snprintf(refused, sizeof refused, "%s", ex->a2a_refused); /* the caller's -1 said it; every member hears it now */
    else if (!refused[0] && ex->a2a_has_pending[op->unit] != 1)
        snprintf(refused, sizeof refused, "rank %d: op %ld (a2a_counts of unit %s, micro-step %d): no expert counts "
                 "were given for it (cp_gpu_set_expert_counts / cp_executor_set_expert_counts before it runs)",
                 ex->rank, x, U->name, op->micro_step);
    /* The recompute routes the forward's tokens again: its counts are the forward's, entry for entry (the
     * backward's all-to-alls split by them as torchtitan's split by the forward's). */
    for (size_t e = 0; fwd && !refused[0] && e < E; e++)
        if (ex->a2a_pending[op->unit][e] != host[e])
            snprintf(refused, sizeof refused, "rank %d: op %ld (a2a_counts of unit %s, micro-step %d): the recompute's "
                     "count for expert %zu is %lld, its forward's (op %d) %lld: activation checkpointing re-routes the "
                     "forward's tokens, so the counts given again must be the forward's", ex->rank, x, U->name,
                     op->micro_step, e, (long long)ex->a2a_pending[op->unit][e], op->a2a_counts_op, (long long)host[e]);
    if (!refused[0]) {
        memcpy(host, ex->a2a_pending[op->unit], E * sizeof *host);
        a2a_check_counts(ex, op, host, 0, refused, sizeof refused);
    }
    ex->a2a_has_pending[op->unit] = 0;
    if (refused[0]) {
        for (size_t e = 0; e < E; e++) host[e] = -1;
        /* Known now, before the exchange: ranks sharing this process stop with this line (the refusal is
         * the cause; a member's "refused its counts" after the exchange is its echo). */
        ex_abort(ex, refused);
    }
    int rc = b->write(b, op->stream, dev, host, E * sizeof *host);
    if (rc == 0) {
        if (op->family < 0) rc = b->copy_bytes(b, op->stream, dev, dev + E * sizeof *host, E * sizeof *host);
        else if (!b->a2a_counts) return ex_error(ex, "rank %d: op %ld: the backend has no all-to-all", ex->rank, x);
        else rc = b->a2a_counts(b, op, op->stream, dev, dev + E * sizeof *host);
    }
    if (rc == 0) rc = b->read(b, op->stream, dev + E * sizeof *host, host + E, E * sizeof *host);
    if (refused[0]) return ex_refuse(ex, refused); /* whatever the exchange did: the refusal is the reason */
    if (rc) return failed(ex, op, "the counts all-to-all");
    /* A member that refused sent -1s: it said why; everyone else stops here too. */
    for (int m = 0; m < n; m++)
        if (host[E + (size_t)m * (size_t)op->a2a_experts] == -1) {
            char line[sizeof ex->err];
            snprintf(line, sizeof line, "rank %d: op %ld (a2a_counts of unit %s, micro-step %d): ep member %d (rank %d) refused "
                            "its expert counts (its own line says why): the layer's all-to-alls are not run",
                     ex->rank, x, U->name, op->micro_step, m,
                     op->family >= 0 ? cp_group_member(p, op->family, color, m) : ex->rank);
            return ex_refuse(ex, line);
        }
    if (a2a_check_counts(ex, op, host + E, 1, refused, sizeof refused)) return ex_refuse(ex, refused);
    for (size_t e = 0; fwd && e < E; e++)
        if (host[E + e] != ex->a2a_prev[e]) {
            int m = (int)(e / (size_t)op->a2a_experts);
            snprintf(refused, sizeof refused, "rank %d: op %ld (a2a_counts of unit %s, micro-step %d): ep member %d (rank "
                     "%d) recomputed %lld tokens for local expert %d, its forward (op %d) %lld", ex->rank, x, U->name,
                     op->micro_step, m, op->family >= 0 ? cp_group_member(p, op->family, color, m) : ex->rank,
                     (long long)host[E + e], (int)(e % (size_t)op->a2a_experts), op->a2a_counts_op,
                     (long long)ex->a2a_prev[e]);
            return ex_refuse(ex, refused);
        }
    if (x >= 0 && x < p->nops) {
        ex->a2a_filled[op->unit][op->a2a_slot] = (int)x;
        ex->a2a_cursor[op->unit] = (int)x + 1 < p->nops ? (int)x + 1 : 0;
    }
    if (ex->on_a2a && ex->on_a2a(ex->user, ex, op, 1)) return failed(ex, op, "checking the counts");
    return 0;
}

const int64_t *cp_executor_a2a_counts_of_op(const cp_executor *ex, const cp_op *op)
{
    const cp_op *k = op && op->kind == CP_OP_A2A && ex->a2a_filled ? a2a_counts_of(ex, op) : NULL;
    if (!k || ex->a2a_filled[op->unit][k->a2a_slot] != op->a2a_counts_op) return NULL;
    return cp_executor_a2a_counts(ex, op->unit, k->a2a_slot);
}

/* The tokens' all-to-all, split by its counts op's counts (swapped for a combine). */
static int run_a2a(cp_executor *ex, const cp_op *op)
{
    const cp_plan *p = ex->plan;
    cp_backend *b = ex->backend;
    const cp_unit *U = &p->units[op->unit];
    long x = (long)(op - p->ops);
    char why[200] = "";
    if (a2a_fields_ok(ex, op, why, sizeof why) || !a2a_counts_of(ex, op)) {
        if (!why[0])
            snprintf(why, sizeof why, "names op %d as its counts, not an earlier a2a_counts of its unit with its group, "
                     "experts and capacity", op->a2a_counts_op);
        return ex_error(ex, "rank %d: op %ld (a2a of unit %s): %s: regenerate the plan", ex->rank, x, U->name, why);
    }
    int n, color, key;
    a2a_group(ex, op, &n, &color, &key);
    size_t es = cp_dtype_size(op->dtype);
    int64_t need = (int64_t)n * op->a2a_capacity * op->a2a_dim * (int64_t)es;
    if (need > cp_arena_buffer_bytes(p, op->unit, CP_BUF_A2A_SEND) ||
        need > cp_arena_buffer_bytes(p, op->unit, CP_BUF_A2A_RECV))
        return ex_error(ex, "rank %d: op %ld (a2a of unit %s): %d members x %lld rows x %lld elements lie outside the "
                        "unit's %lld-byte token buffers: regenerate the plan", ex->rank, x, U->name, n,
                        (long long)op->a2a_capacity, (long long)op->a2a_dim,
                        (long long)cp_arena_buffer_bytes(p, op->unit, CP_BUF_A2A_SEND));
    int64_t *send_rows = ex->a2a_rows, *recv_rows = ex->a2a_rows + n;
    if (cp_executor_a2a_splits(ex, op, send_rows, recv_rows))
        return ex_error(ex, "rank %d: op %ld (a2a of unit %s, micro-step %d) runs before its counts op %d filled slot "
                        "%d: ops ran out of the plan's order", ex->rank, x, U->name, op->micro_step, op->a2a_counts_op,
                        p->ops[op->a2a_counts_op].a2a_slot);
    for (int m = 0; m < n; m++) /* checked with the counts; a second look costs nothing */
        if (send_rows[m] < 0 || send_rows[m] > op->a2a_capacity || recv_rows[m] < 0 || recv_rows[m] > op->a2a_capacity)
            return ex_error(ex, "rank %d: op %ld (a2a of unit %s): %lld rows to / %lld from ep member %d past its "
                            "capacity of %lld rows", ex->rank, x, U->name, (long long)send_rows[m],
                            (long long)recv_rows[m], m, (long long)op->a2a_capacity);
    void *in = ex->buf[op->a2a_combine ? CP_BUF_A2A_RECV : CP_BUF_A2A_SEND][op->unit];
    void *out = ex->buf[op->a2a_combine ? CP_BUF_A2A_SEND : CP_BUF_A2A_RECV][op->unit];
    if (ex->on_a2a && ex->on_a2a(ex->user, ex, op, 0)) return failed(ex, op, "writing the tokens");
    int rc;
    if (op->family < 0) rc = b->copy_bytes(b, op->stream, in, out, (size_t)(send_rows[0] * op->a2a_dim) * es);
    else if (!b->a2a) return ex_error(ex, "rank %d: op %ld: the backend has no all-to-all", ex->rank, x);
    else rc = b->a2a(b, op, op->stream, in, out, send_rows, recv_rows);
    if (rc) return failed(ex, op, "the tokens' all-to-all");
    if (ex->on_a2a && ex->on_a2a(ex->user, ex, op, 1)) return failed(ex, op, "checking the tokens");
    return 0;
}

/* The op's event, and which op recorded its slot last. */
static int record_event(cp_executor *ex, const cp_op *op)
{
    const cp_plan *p = ex->plan;
    cp_backend *b = ex->backend;
    long x = (long)(op - p->ops);
    if (op->event >= 0 && b->record(b, op->stream, op->event)) return failed(ex, op, "the event record");
    if (x >= 0 && x < p->nops && op->event >= 0 && op->event < p->nevents) ex->slot_last[op->event] = (int)x;
    return 0;
}

/* After the batch's last op (last): the group closes, then its receives
 * are complete (on_p2p) and its ops' events recorded, in table order. */
static int close_batch(cp_executor *ex, const cp_op *last)
{
    cp_backend *b = ex->backend;
    const cp_op *first = ex->batch_first;
    int batch = ex->open_batch;
    ex->open_batch = 0;
    ex->batch_first = NULL;
    if (b->group_end(b))
        return ex_error(ex, "rank %d: closing the group of batch %d (ops %ld .. %ld) failed", ex->rank, batch,
                        (long)(first - ex->plan->ops), (long)(last - ex->plan->ops));
    for (const cp_op *o = first; o <= last; o++) {
        if (o->kind == CP_OP_RECV && ex->on_p2p && ex->on_p2p(ex->user, ex, o, 1))
            return p2p_failed(ex, o, "checking the message");
        if (record_event(ex, o)) return -1;
    }
    return 0;
}

static void cursor_enter(cp_executor *ex, long x)
{
    if (x >= 0 && ex->cur_first < 0) ex->cur_first = x;
    else if (x >= 0 && x <= ex->cur_first && !(x == ex->cur_op && ex->cur_in)) ex->cur_step++;
    ex->cur_op = x;
    ex->cur_in = 1;
    ex->cur_count = x >= 0 && x < ex->plan->nops ? (long)ex->plan->ops[x].count : -1;
    int slot = ex->rank % CP_CURSOR_MAX;
    cp_executor *held = cursor_ex[slot];
    /* the latest executor of this rank; a slot another rank holds stays its (no rank's cursor replaced) */
    if (held != ex && (!held || held->rank == ex->rank)) cursor_ex[slot] = ex;
}

/* CPU offload's copies (CP_ACT_HOST) on an offloading unit: the whole
 * slot (h2d), or the part's parameters' span of it (d2h, d2h_add), in the
 * stored dtype; d2h_add copies into host scratch, waits for the copy, and
 * adds on the host in that dtype (FSDP2: a blocking D2H, then
 * `sharded_param.grad._local_tensor += new_sharded_grad` on the CPU). */
static int run_host_copy(cp_executor *ex, const cp_op *op, const void *in, void *out)
{
    const cp_plan *p = ex->plan;
    const cp_unit *U = &p->units[op->unit];
    cp_backend *b = ex->backend;
    if (!U->offload)
        return ex_error(ex, "rank %d: %s of unit %s (op %ld), which does not offload: regenerate the plan", ex->rank,
                        cp_op_kind_name(op->kind), U->name, (long)(op - p->ops));
    size_t es = cp_dtype_size(U->orig_dtype);
    /* H2D: the shards (the slot's layout); D2H: the sharded grads (the
     * reduce-scatter row's, cp_part_offset / cp_part_total) */
    int64_t from = 0, n = op->kind == CP_OP_H2D ? U->total : cp_unit_rs_total(U);
    if (op->part_count > 0 && op->kind == CP_OP_H2D) {
        const cp_param *a = &p->params[U->first_param + op->part_first];
        const cp_param *z = &p->params[U->first_param + op->part_first + op->part_count - 1];
        from = a->offset, n = z->offset + z->padded - a->offset;
    } else if (op->part_count > 0) {
        from = cp_part_offset(p, op->unit, op->part_first, op->part_count);
        n = cp_part_total(p, op->unit, op->part_first, op->part_count);
    }
    const char *src = (const char *)in + (size_t)from * es;
    char *dst = (char *)out + (size_t)from * es;
    size_t bytes = (size_t)n * es;
    int to_host = op->kind != CP_OP_H2D, adds = cp_op_descs[op->kind].adds;
    void *tmp = NULL;
    if (adds && !(tmp = malloc(bytes ? bytes : 1))) return failed(ex, op, "host scratch for the add");
    void *target = adds ? tmp : (void *)dst;
    int rc = b->host_copy ? b->host_copy(b, op->stream, src, target, bytes, to_host, adds)
                          : b->copy_bytes(b, op->stream, src, target, bytes);
    if (rc == 0 && adds)
        for (int64_t i = 0; i < n; i++)
            cp_store(U->orig_dtype, dst, i, cp_load(U->orig_dtype, dst, i) + cp_load(U->orig_dtype, tmp, i));
    free(tmp);
    return rc ? failed(ex, op, to_host ? "the D2H copy" : "the H2D copy") : 0;
}

int cp_executor_run_op(cp_executor *ex, const cp_op *op)
{
    int rc = cp_executor_run_op_(ex, op);
    if (rc == 0) ex->cur_in = 0;
    return rc;
}

static int cp_executor_run_op_(cp_executor *ex, const cp_op *op)
{
    const cp_plan *p = ex->plan;
    int fault = fault_at(ex, op);
    if (fault == FAULT_STOP || fault == FAULT_KILL) return fault_stop(ex, op, fault);
    cursor_enter(ex, (long)(op - p->ops));
    if ((unsigned)op->kind >= CP_OP_KIND_COUNT || op->unit < 0 || op->unit >= p->nunits ||
        (unsigned)op->stream >= CP_STREAM_COUNT) {
        return ex_error(ex, "rank %d: op %ld of plan %s is malformed (kind %d, unit %d, stream %d): regenerate the plan",
                        ex->rank, (long)(op - p->ops), p->name, (int)op->kind, op->unit, (int)op->stream);
    }
    const cp_op_desc *d = &cp_op_descs[op->kind];
    cp_backend *b = ex->backend;
    int u = op->unit;
    long x = (long)(op - p->ops);
    /* A part of the unit's parameters: inside it, on the ops that take one,
     * a collective's count its elements. */
    if (op->part_count != 0 || op->part_first != 0) {
        int takes = op->kind == CP_OP_PACK || op->kind == CP_OP_REDUCE_SCATTER || op->kind == CP_OP_ALL_REDUCE ||
                    op->kind == CP_OP_VIEW_OUT || op->kind == CP_OP_VIEW_OUT_ADD || op->kind == CP_OP_FORWARD ||
                    op->kind == CP_OP_BACKWARD || op->kind == CP_OP_D2H || op->kind == CP_OP_D2H_ADD;
        if (!takes || cp_part_check(p, u, op->part_first, op->part_count) ||
            (d->action == CP_ACT_COLLECTIVE && op->count != cp_part_total(p, u, op->part_first, op->part_count)))
            return ex_error(ex, "rank %d: op %ld (%s of unit %s) names parameters %d .. %d of the unit's %d (count %lld): "
                            "regenerate the plan", ex->rank, x, d->name, p->units[u].name, op->part_first,
                            op->part_first + op->part_count - 1, p->units[u].nparams, (long long)op->count);
    }
    int in_table = x >= 0 && x < p->nops;
    /* Batches: a group opens before the batch's first op and closes after
     * its last (the next op in the table has another batch, or the step
     * ends), whether the step runs whole or op by op. An op outside the
     * table is a batch of its own. */
    int batch = op->batch > 0 ? op->batch : 0;
    if (ex->open_batch && (batch != ex->open_batch || !in_table)) {
        long from = (long)(ex->batch_first - p->ops);
        int open = ex->open_batch;
        ex->open_batch = 0;
        return ex_error(ex, "rank %d: op %ld (%s of unit %s) runs while the group of batch %d (from op %ld) is still "
                        "open: ops ran out of the plan's order; run them in table order", ex->rank, x,
                        cp_op_kind_name(op->kind), p->units[u].name, open, from);
    }
    if (batch && !ex->open_batch) {
        if (!b->group_start || !b->group_end)
            return ex_error(ex, "rank %d: op %ld (%s of unit %s) is in batch %d, but the backend has no groups", ex->rank,
                            x, cp_op_kind_name(op->kind), p->units[u].name, batch);
        if (b->group_start(b))
            return ex_error(ex, "rank %d: opening the group of batch %d at op %ld (%s of unit %s) failed", ex->rank,
                            batch, x, cp_op_kind_name(op->kind), p->units[u].name);
        ex->open_batch = batch;
        ex->batch_first = op;
    }
    for (int i = 0; i < op->wait_count; i++) {
        int s = p->waits[op->wait_first + i];
        if (in_table && s >= 0 && s < p->nevents) {
            int means = ex->wait_means[ex->wait_base[x] + i], last = ex->slot_last[s];
            if (last >= 0 && last != means)
                return ex_error(ex, "rank %d: op %ld (%s of unit %s) waits for event slot %d, which op %d recorded "
                                "last where the plan means op %d: ops ran out of the plan's order (a library call "
                                "early or late?); make the calls in the order of plans/%s/SCHEDULE.md",
                                ex->rank, x, cp_op_descs[op->kind].name, p->units[op->unit].name, s, last, means,
                                p->name);
        }
        if (b->wait(b, op->stream, s)) return failed(ex, op, "an event wait");
    }
    void *in = cp_executor_op_buffer(ex, op, d->in, d->in_slot);
    void *out = cp_executor_op_buffer(ex, op, d->out, d->out_slot);
    switch (d->action) {
    case CP_ACT_COPY:
        if (d->kernel == K_POST_FORWARD || op->post_forward) { /* reshard_after_forward = k's copies */
            if (post_forward_copy(ex, op, in, out)) return failed(ex, op, "the post-forward copy");
        } else if (b->copy(b, d->kernel, u, op->part_first, op->part_count, op->stream, in, out))
            return failed(ex, op, "the copy kernel");
        if (d->out == CP_BUF_UNSHARDED) ex->unsharded_live[u] = 1;
        /* CPU offload: the device copy of the shards is dead once copied in */
        if (op->kind == CP_OP_COPY_IN && p->units[u].offload &&
            b->release(b, ex->buf[CP_BUF_H2D][u], (size_t)cp_arena_buffer_bytes(p, u, CP_BUF_H2D)))
            return failed(ex, op, "releasing a buffer");
        break;
    case CP_ACT_HOST:
        if (run_host_copy(ex, op, in, out)) return -1;
        break;
    case CP_ACT_COLLECTIVE: {
        cp_op wrong;
        if (fault == FAULT_SKIP) break;
        if (run_collective(ex, fault == FAULT_COUNT ? fault_count(ex, op, &wrong) : op, d, in, out)) return -1;
        break;
    }
    case CP_ACT_COMPUTE:
        if (!ex->unsharded_live[u] && cp_compute_reads_params(&p->units[u], op->kind))
            return ex_error(ex, "rank %d: %s of unit %s runs on resharded parameters", ex->rank, d->name,
                            p->units[u].name);
        if (ex->on_compute && ex->on_compute(ex->user, ex, op)) return failed(ex, op, "the compute callback");
        break;
    case CP_ACT_NONE: break;
    case CP_ACT_P2P:
        if (fault == FAULT_SKIP) break;
        if (run_p2p(ex, op, in, out)) return -1;
        break;
    case CP_ACT_A2A:
        if (ex->open_batch)
            return ex_error(ex, "rank %d: %s of unit %s (op %ld) is inside batch %d: regenerate the plan", ex->rank,
                            d->name, p->units[u].name, x, ex->open_batch);
        if (fault == FAULT_SKIP) { /* withheld counts: the slot keeps its last counts, the tokens' exchange goes on */
            if (op->kind == CP_OP_A2A_COUNTS && ex->a2a_filled[u]) ex->a2a_filled[u][op->a2a_slot] = (int)x;
            break;
        }
        if ((op->kind == CP_OP_A2A_COUNTS ? run_a2a_counts(ex, op) : run_a2a(ex, op)) != 0) return -1;
        break;
    }
    if (d->frees != CP_BUF_NONE) {
        if (b->release(b, ex->buf[d->frees][u], (size_t)cp_arena_buffer_bytes(p, u, d->frees)))
            return failed(ex, op, "releasing a buffer");
        if (d->frees == CP_BUF_UNSHARDED) ex->unsharded_live[u] = 0;
    }
    if (!ex->open_batch) return record_event(ex, op);
    if (!in_table || x + 1 >= p->nops || p->ops[x + 1].batch != batch) return close_batch(ex, op);
    return 0;
}

int cp_executor_step(cp_executor *ex)
{
    cp_backend *b = ex->backend;
    if (b->fork(b)) return ex_error(ex, "rank %d: forking the side streams failed", ex->rank);
    for (int i = 0; i < ex->plan->nops; i++)
        if (cp_executor_run_op(ex, &ex->plan->ops[i]) != 0) return -1;
    if (b->join(b)) return ex_error(ex, "rank %d: joining the side streams failed", ex->rank);
    return 0;
}

/* cp_cursor_write's pieces: text appended to a fixed buffer, no allocation,
 * no stdio (async-signal-safe). */
static size_t cur_put(char *b, size_t at, size_t cap, const char *t)
{
    while (*t && at + 1 < cap) b[at++] = *t++;
    return at;
}

static size_t cur_name(char *b, size_t at, size_t cap, const char *t)
{
    at = cur_put(b, at, cap, "\"");
    for (; t && *t && at + 2 < cap; t++)
        if (*t != '"' && *t != '\\' && (unsigned char)*t >= 0x20) b[at++] = *t;
    return cur_put(b, at, cap, "\"");
}

static size_t cur_long(char *b, size_t at, size_t cap, long v)
{
    char d[24];
    int n = 0;
    unsigned long u = v < 0 ? 0UL - (unsigned long)v : (unsigned long)v;
    do { d[n++] = (char)('0' + u % 10); u /= 10; } while (u && n < 23);
    if (v < 0) d[n++] = '-';
    while (n && at + 1 < cap) b[at++] = d[--n];
    return at;
}

void cp_cursor_write(int fd)
{
    for (int i = 0; i < CP_CURSOR_MAX; i++) {
        cp_executor *ex = cursor_ex[i];
        if (!ex || !ex->plan) continue;
        const cp_plan *p = ex->plan;
        long x = ex->cur_op;
        const cp_op *op = x >= 0 && x < p->nops ? &p->ops[x] : NULL;
        char b[512];
        size_t at = cur_put(b, 0, sizeof b, "{\"commplan_cursor\": 1, \"plan\": ");
        at = cur_name(b, at, sizeof b, p->name);
        at = cur_put(b, at, sizeof b, ", \"rank\": ");
        at = cur_long(b, at, sizeof b, ex->rank);
        at = cur_put(b, at, sizeof b, ", \"step\": ");
        at = cur_long(b, at, sizeof b, ex->cur_step);
        at = cur_put(b, at, sizeof b, ", \"op\": ");
        at = cur_long(b, at, sizeof b, x);
        if (op) {
            at = cur_put(b, at, sizeof b, ", \"kind\": ");
            at = cur_name(b, at, sizeof b, cp_op_kind_name(op->kind));
            at = cur_put(b, at, sizeof b, ", \"unit\": ");
            at = cur_name(b, at, sizeof b, op->unit >= 0 && op->unit < p->nunits ? p->units[op->unit].name : "?");
            at = cur_put(b, at, sizeof b, ", \"micro_step\": ");
            at = cur_long(b, at, sizeof b, op->micro_step);
            at = cur_put(b, at, sizeof b, ", \"count\": ");
            at = cur_long(b, at, sizeof b, ex->cur_count);
        }
        at = cur_put(b, at, sizeof b, ", \"in_op\": ");
        at = cur_long(b, at, sizeof b, ex->cur_in);
        at = cur_put(b, at, sizeof b, "}\n");
        for (size_t off = 0; off < at;) {
            ssize_t w = write(fd, b + off, at - off);
            if (w <= 0) break;
            off += (size_t)w;
        }
    }
}

/* ---- issue 40: the cursor file, written on a signal and on a failure ---- */

static char cursor_file[4096];

int cp_cursor_armed(void) { return cursor_file[0] != 0; }

int cp_cursor_set_file(const char *prefix)
{
    cursor_file[0] = '\0';
    if (!prefix || !*prefix) return 0;
    /* snprintf is not async-signal-safe, but this runs once, before any handler */
    int n = snprintf(cursor_file, sizeof cursor_file, "%s%ld", prefix, (long)getpid());
    if (n <= 0 || (size_t)n >= sizeof cursor_file) {
        cursor_file[0] = '\0';
        return -1;
    }
    return 0;
}

void cp_cursor_dump(int rank, const char *event, const char *why)
{
    if (!cursor_file[0]) {
        if (event) fault_released = 1;
        return;
    }
    if (event) term_dumped = 1, fault_released = 1;
    int fd = open(cursor_file, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) return;
    if (event) {
        const char *plan = "?";
        for (int i = 0; i < CP_CURSOR_MAX; i++)
            if (cursor_ex[i] && cursor_ex[i]->plan) { plan = cursor_ex[i]->plan->name; break; }
        char b[1024];
        size_t at = cur_put(b, 0, sizeof b, "{\"commplan_cursor\": 1, \"plan\": ");
        at = cur_name(b, at, sizeof b, plan);
        at = cur_put(b, at, sizeof b, ", \"event\": ");
        at = cur_name(b, at, sizeof b, event);
        at = cur_put(b, at, sizeof b, ", \"rank\": ");
        at = cur_long(b, at, sizeof b, rank);
        at = cur_put(b, at, sizeof b, ", \"why\": ");
        at = cur_name(b, at, sizeof b, why ? why : "");
        at = cur_put(b, at, sizeof b, "}\n");
        for (size_t off = 0; off < at;) {
            ssize_t w = write(fd, b + off, at - off);
            if (w <= 0) break;
            off += (size_t)w;
        }
    }
    cp_cursor_write(fd);
    close(fd);
}

static void cursor_signal(int sig)
{
    (void)sig;
    int saved = errno;
    cp_cursor_dump(-1, NULL, NULL);
    errno = saved;
}

/* SIGTERM (a launcher stopping the job's other ranks once one died: torchrun, srun) and SIGABRT (a
 * library ending the process: gloo on a size mismatch): the cursor as this process leaves, unless
 * its own failure wrote one already, then what the signal did before (the default: end the
 * process; a handler: called). */
static struct sigaction leave_prev[2];

static void cursor_leave(int sig, siginfo_t *info, void *uc)
{
    int saved = errno, k = sig == SIGABRT;
    if (!term_dumped)
        cp_cursor_dump(-1, k ? "aborted" : "terminated",
                       k ? "SIGABRT: a library ended this process" : "SIGTERM: the launcher stopped this process");
    errno = saved;
    struct sigaction *prev = &leave_prev[k];
    if (prev->sa_flags & SA_SIGINFO) {
        if (prev->sa_sigaction) prev->sa_sigaction(sig, info, uc);
    } else if (prev->sa_handler == SIG_DFL) {
        signal(sig, SIG_DFL);
        raise(sig);
    } else if (prev->sa_handler != SIG_IGN) {
        prev->sa_handler(sig);
    }
}

int cp_cursor_install(void)
{
    const char *prefix = getenv("COMMPLAN_CURSOR_DUMP");
    if (!prefix || !*prefix) return 0;
    if (cp_cursor_set_file(prefix) != 0) return -1;
    /* The handlers once per process (every HostLibrary / GpuLibrary calls
     * this): a second sigaction would store cursor_leave itself as the
     * previous handler, and SIGTERM would then call itself forever. */
    static int installed;
    if (installed) return 0;
    installed = 1;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = cursor_signal;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGUSR1, &sa, NULL);
    struct sigaction st;
    memset(&st, 0, sizeof st);
    st.sa_sigaction = cursor_leave;
    st.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&st.sa_mask);
    sigaction(SIGTERM, &st, &leave_prev[0]);
    sigaction(SIGABRT, &st, &leave_prev[1]);
    return 0;
}

/* ---- issue 40: test-only faults (tests/diagnose/runtime_faults.sh) ----
 * COMMPLAN_TEST_FAULT=KIND:RANK:STEP:OP changes what rank RANK does at op
 * OP (the table index; mN: every op of micro-step N) of step STEP, as a
 * bug or a dying process in the job would, so that the diagnosis of the
 * runtime's cursors can be checked against a known cause:
 *   skip   the op's collective, message or all-to-all is not issued (its
 *          waits, events and frees are: the rest of the step runs on)
 *   count  the collective is issued with one element fewer per rank
 *   stop   the rank stops before the op (never enters it) until the job
 *          fails elsewhere (at most 600 s), then fails itself: a dead rank
 *          among the threads of --simulate
 *   kill   the process kills itself (SIGKILL) before the op: a rank killed
 *          mid-step, where each rank is a process (the bridge, the GPU path)
 * Read once per executor; without the variable nothing here runs. */
static struct { int kind, rank, micro; long step, op; } fault_spec = { FAULT_NONE, -1, -1, -1, -1 };

/* A field of COMMPLAN_TEST_FAULT: a decimal number, the whole field. */
static int fault_number(const char *from, const char *to, long *out)
{
    if (from == to || *from == '-' || *from == '+') return -1;
    char *end = NULL;
    errno = 0;
    long v = strtol(from, &end, 10);
    if (errno || end != to) return -1;
    *out = v;
    return 0;
}

/* What is wrong with the variable, or "" (cp_executor_init refuses it). */
static char fault_bad[320];

static void fault_parse(void)
{
    static int parsed;
    const char *s = getenv("COMMPLAN_TEST_FAULT");
    if (parsed++) return; /* once per process: the executors of --simulate are made one after another */
    if (!s || !*s) return;
    static const char *const names[] = { "", "skip", "count", "stop", "kill" };
    const char *f[5];
    int n = 0;
    f[n++] = s;
    for (const char *c = s; *c && n < 5; c++)
        if (*c == ':') f[n++] = c + 1;
    const char *end = s + strlen(s);
    long rank = -1, step = -1, op = -1, micro = -1;
    int kind = FAULT_NONE;
    if (n == 4)
        for (int k = FAULT_SKIP; k <= FAULT_KILL; k++)
            if ((size_t)(f[1] - 1 - f[0]) == strlen(names[k]) && strncmp(f[0], names[k], strlen(names[k])) == 0)
                kind = k;
    int bad = n != 4 || kind == FAULT_NONE || fault_number(f[1], f[2] - 1, &rank) != 0 || rank > INT_MAX ||
              fault_number(f[2], f[3] - 1, &step) != 0 ||
              (f[3][0] == 'm' ? fault_number(f[3] + 1, end, &micro) != 0 || micro > INT_MAX
                              : fault_number(f[3], end, &op) != 0);
    if (bad) {
        snprintf(fault_bad, sizeof fault_bad, "COMMPLAN_TEST_FAULT=%.64s: expected KIND:RANK:STEP:OP (KIND skip, count, "
                 "stop or kill; RANK and STEP numbers; OP a table index or mN for micro-step N): fix it or unset it", s);
        return;
    }
    fault_spec.kind = kind, fault_spec.rank = (int)rank, fault_spec.step = step;
    fault_spec.micro = (int)micro, fault_spec.op = op;
    fprintf(stderr, "commplan: COMMPLAN_TEST_FAULT=%s: a test fault on rank %ld (docs/diagnosis.md)\n", s, rank);
}

/* The fault against the plan (rank: its world; op / micro-step: the faulted rank's table), at each executor's
 * init: a fault that could never fire is refused, not ignored. 0, or -1 with the executor's error. */
static int fault_check(cp_executor *ex, const cp_plan *p, int rank)
{
    if (fault_bad[0]) return ex_error(ex, "%s", fault_bad);
    if (fault_spec.kind == FAULT_NONE) return 0;
    if (fault_spec.rank >= p->world_size)
        return ex_error(ex, "COMMPLAN_TEST_FAULT: rank %d is outside plan %s's world of %d ranks: use 0..%d",
                        fault_spec.rank, p->name, p->world_size, p->world_size - 1);
    if (rank != fault_spec.rank) return 0;
    int last = 0; /* the table's last micro-step (a pipeline's: its microbatches) */
    for (int i = 0; i < p->nops; i++)
        if (p->ops[i].micro_step > last) last = p->ops[i].micro_step;
    if (fault_spec.micro > last)
        return ex_error(ex, "COMMPLAN_TEST_FAULT: micro-step m%d is outside rank %d's table in plan %s: use m0..m%d",
                        fault_spec.micro, rank, p->name, last);
    if (fault_spec.micro < 0 && fault_spec.op >= p->nops)
        return ex_error(ex, "COMMPLAN_TEST_FAULT: op %ld is outside rank %d's table of %d ops in plan %s: use 0..%d",
                        fault_spec.op, rank, p->nops, p->name, p->nops - 1);
    return 0;
}

static int fault_at(const cp_executor *ex, const cp_op *op)
{
    if (fault_spec.kind == FAULT_NONE || ex->rank != fault_spec.rank) return FAULT_NONE;
    long x = (long)(op - ex->plan->ops);
    /* the step this op runs in: the cursor's, or the next one's where the table starts again */
    long step = ex->cur_step + (x >= 0 && ex->cur_first >= 0 && x <= ex->cur_first && !(x == ex->cur_op && ex->cur_in));
    if (step != fault_spec.step) return FAULT_NONE;
    if (fault_spec.micro >= 0 ? op->micro_step != fault_spec.micro : x != fault_spec.op) return FAULT_NONE;
    return fault_spec.kind;
}

static int fault_stop(cp_executor *ex, const cp_op *op, int kind)
{
    if (kind == FAULT_KILL) raise(SIGKILL);
    for (int i = 0; i < 6000 && !fault_released; i++) {
        struct timespec ts = { 0, 100000000L };
        nanosleep(&ts, NULL);
    }
    return ex_error(ex, "rank %d: stopped before op %ld (%s of unit %s) by COMMPLAN_TEST_FAULT", ex->rank,
                    (long)(op - ex->plan->ops), cp_op_kind_name(op->kind), ex->plan->units[op->unit].name);
}

static const cp_op *fault_count(cp_executor *ex, const cp_op *op, cp_op *wrong)
{
    *wrong = *op;
    if (wrong->count > 1) wrong->count--;
    ex->cur_count = (long)wrong->count;
    return wrong;
}
