/* The executor: the one op walker. For one rank it runs a plan's ops in
 * table order over a backend (host threads or NCCL): each op's event
 * waits, its work on the stream the generator chose, its event record.
 * Every fact about an op kind is in its descriptor below; nothing about
 * the schedule (streams, ordering, buffer placement) is decided here. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commplan.h"

/* Kernel numbers as cp_gpu_kernels.h declares them (that header is the
 * CUDA-side face; this file stays plain C). */
enum { K_COPY_IN = 0, K_COPY_OUT = 1, K_PACK = 2, K_VIEW_OUT = 3, K_VIEW_OUT_ADD = 4, K_FLAT_COPY = 5, K_FLAT_ADD = 6 };

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
};

const cp_op_kind cp_call_unshard[3] = { CP_OP_COPY_IN, CP_OP_ALL_GATHER, CP_OP_COPY_OUT };
const cp_op_kind cp_call_reshard[1] = { CP_OP_RESHARD };
/* Pack, reduce-scatter, all_reduce_last's partial sums, the HSDP all-reduce,
 * the view-out (assigning, or adding on a later reduction of the step). */
const cp_op_kind cp_call_reduce[8] = { CP_OP_PACK,        CP_OP_REDUCE_SCATTER, CP_OP_PARTIAL_SAVE,
                                       CP_OP_PARTIAL_ADD, CP_OP_PARTIAL_FOLD,   CP_OP_ALL_REDUCE,
                                       CP_OP_VIEW_OUT,    CP_OP_VIEW_OUT_ADD };

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
    return -1;
}

static int fail_init(cp_executor *ex);

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
    ex->rank = rank;
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
    /* Transient buffers live in one arena at the generator's offsets: a
     * wrong memory plan corrupts live data and the exact checks see it. */
    ex->arena = b->alloc(b, (size_t)(p->arena_bytes > 0 ? p->arena_bytes : 1));
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
            if (!(ex->buf[k][u] = b->alloc(b, bytes ? bytes : 16))) {
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
    cp_backend *b = ex->backend;
    for (int k = CP_BUF_SHARDED; k < CP_BUFFERS; k++)
        if (ex->buf[k])
            for (int u = 0; u < ex->plan->nunits; u++)
                if (ex->buf[k][u]) b->free(b, ex->buf[k][u]);
    if (ex->arena) b->free(b, ex->arena);
    for (int k = 0; k < CP_BUFFERS; k++) free(ex->buf[k]);
    free(ex->unsharded_live);
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
    case CP_BUF_UNSHARDED: return base + (size_t)(p->shard_size * prm->offset) * cp_dtype_size(U->ag_dtype);
    case CP_BUF_GRADS: return base + (size_t)prm->grad_offset * cp_dtype_size(U->grad_dtype);
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
    char *base = ex->buf[k][op->unit];
    size_t es = cp_dtype_size(op->dtype);
    if (slot == CP_SLOT_PP) { /* [direction][micro-step] messages of op->count elements */
        size_t at = (size_t)(op->tag & 1) * (size_t)ex->plan->micro_steps + (size_t)op->micro_step;
        return base + at * (size_t)op->count * es;
    }
    int r = slot == CP_SLOT_SHARD ? ex->shard_rank : slot == CP_SLOT_TP ? ex->tp_rank : 0;
    return base + (size_t)r * (size_t)op->count * es;
}

int cp_executor_read(cp_executor *ex, cp_stream s, int u, cp_buffer k, void *host)
{
    return ex->backend->read(ex->backend, s, ex->buf[k][u], host, (size_t)cp_arena_buffer_bytes(ex->plan, u, k));
}

int cp_executor_write(cp_executor *ex, cp_stream s, int u, cp_buffer k, const void *host)
{
    return ex->backend->write(ex->backend, s, ex->buf[k][u], host, (size_t)cp_arena_buffer_bytes(ex->plan, u, k));
}

static int failed(cp_executor *ex, const cp_op *op, const char *what)
{
    return ex_error(ex, "rank %d: %s of %s of unit %s (op %ld) failed", ex->rank, what, cp_op_kind_name(op->kind),
                    ex->plan->units[op->unit].name, (long)(op - ex->plan->ops));
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

int cp_executor_run_op(cp_executor *ex, const cp_op *op)
{
    const cp_plan *p = ex->plan;
    if ((unsigned)op->kind >= CP_OP_KIND_COUNT || op->unit < 0 || op->unit >= p->nunits ||
        (unsigned)op->stream >= CP_STREAM_COUNT) {
        return ex_error(ex, "rank %d: op %ld of plan %s is malformed (kind %d, unit %d, stream %d): regenerate the plan",
                        ex->rank, (long)(op - p->ops), p->name, (int)op->kind, op->unit, (int)op->stream);
    }
    const cp_op_desc *d = &cp_op_descs[op->kind];
    cp_backend *b = ex->backend;
    int u = op->unit;
    long x = (long)(op - p->ops);
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
        if (b->copy(b, d->kernel, u, op->stream, in, out)) return failed(ex, op, "the copy kernel");
        if (d->out == CP_BUF_UNSHARDED) ex->unsharded_live[u] = 1;
        break;
    case CP_ACT_COLLECTIVE:
        if (run_collective(ex, op, d, in, out)) return -1;
        break;
    case CP_ACT_COMPUTE:
        if (!ex->unsharded_live[u])
            return ex_error(ex, "rank %d: %s of unit %s runs on resharded parameters", ex->rank, d->name,
                            p->units[u].name);
        if (ex->on_compute && ex->on_compute(ex->user, ex, op)) return failed(ex, op, "the compute callback");
        break;
    case CP_ACT_NONE: break;
    case CP_ACT_P2P:
        if (run_p2p(ex, op, in, out)) return -1;
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
