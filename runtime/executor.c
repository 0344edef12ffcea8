/* The executor: walks a plan's op list for one rank. All geometry comes
 * from the tables (offsets, runs) and the rank's shard index; nothing about
 * the schedule is decided here. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commplan.h"

static void *xcalloc(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) {
        fprintf(stderr, "commplan: out of host memory allocating %zu x %zu bytes\n", n, size);
        exit(1);
    }
    return p;
}

static char *at(void *base, int64_t i, cp_dtype t) { return (char *)base + (size_t)i * cp_dtype_size(t); }

int cp_executor_init(cp_executor *ex, const cp_plan *p, int rank, cp_backend *b)
{
    memset(ex, 0, sizeof *ex);
    if (rank < 0 || rank >= p->world_size) {
        fprintf(stderr, "commplan: rank %d is outside plan %s's world of %d ranks\n", rank, p->name, p->world_size);
        return -1;
    }
    ex->plan = p;
    ex->rank = rank;
    ex->shard_rank = cp_shard_rank(p, rank);
    ex->replicate_rank = cp_replicate_rank(p, rank);
    ex->backend = b;
    size_t n = (size_t)p->nunits;
    cp_rank_buffers *B = &ex->buf;
    B->sharded = xcalloc(n, sizeof(void *));
    B->sharded_grads = xcalloc(n, sizeof(void *));
    B->ag = xcalloc(n, sizeof(void *));
    B->unsharded = xcalloc(n, sizeof(void *));
    B->grads = xcalloc(n, sizeof(void *));
    B->rs_in = xcalloc(n, sizeof(void *));
    B->rs_out = xcalloc(n, sizeof(void *));
    ex->unsharded_live = xcalloc(n, 1);
    /* Transient buffers live in one arena at the generator's offsets, as on
     * the GPU: a wrong memory plan corrupts live data here and the exact
     * checks of --simulate see it. Poisoned: nothing may read a buffer
     * before its first writer (grads included: backward writes them). */
    ex->arena = xcalloc((size_t)p->arena_bytes, 1);
    memset(ex->arena, CP_POISON_BYTE, (size_t)(p->arena_bytes ? p->arena_bytes : 1));
    void **slots[CP_ARENA_BUFFERS] = { B->ag, B->unsharded, B->grads, B->rs_in, B->rs_out };
    for (int u = 0; u < p->nunits; u++) {
        const cp_unit *U = &p->units[u];
        size_t total = (size_t)U->total;
        B->sharded[u] = xcalloc(total, cp_dtype_size(U->orig_dtype));
        B->sharded_grads[u] = xcalloc(total, cp_dtype_size(U->orig_dtype));
        for (int k = 0; k < CP_ARENA_BUFFERS; k++) slots[k][u] = ex->arena + U->arena_offset[k];
    }
    return 0;
}

void cp_executor_free(cp_executor *ex)
{
    if (!ex->plan) return;
    cp_rank_buffers *B = &ex->buf;
    for (int u = 0; u < ex->plan->nunits; u++) {
        free(B->sharded[u]);
        free(B->sharded_grads[u]);
    }
    free(ex->arena);
    free(B->sharded); free(B->sharded_grads); free(B->ag); free(B->unsharded);
    free(B->grads); free(B->rs_in); free(B->rs_out);
    free(ex->unsharded_live);
    memset(ex, 0, sizeof *ex);
}

static void copy_in(cp_executor *ex, const cp_unit *U, int u)
{
    void *slot = at(ex->buf.ag[u], (int64_t)ex->shard_rank * U->total, U->ag_dtype);
    if (U->orig_dtype == U->ag_dtype) {
        memcpy(slot, ex->buf.sharded[u], (size_t)U->total * cp_dtype_size(U->ag_dtype));
        return;
    }
    for (int64_t i = 0; i < U->total; i++)
        cp_store(U->ag_dtype, slot, i, cp_load(U->orig_dtype, ex->buf.sharded[u], i));
}

/* (W, total) all-gather output -> each parameter's (outer, W*run) buffer. */
static void copy_out(cp_executor *ex, const cp_unit *U, int u)
{
    const cp_plan *p = ex->plan;
    int64_t W = p->shard_size;
    size_t es = cp_dtype_size(U->ag_dtype);
    for (int j = 0; j < U->nparams; j++) {
        const cp_param *prm = &p->params[U->first_param + j];
        char *dst = at(ex->buf.unsharded[u], W * prm->offset, U->ag_dtype);
        for (int64_t r = 0; r < W; r++)
            for (int64_t o = 0; o < prm->outer; o++)
                memcpy(dst + (size_t)(o * W * prm->run + r * prm->run) * es,
                       at(ex->buf.ag[u], r * U->total + prm->offset + o * prm->run, U->ag_dtype),
                       (size_t)prm->run * es);
    }
    memset(ex->buf.ag[u], CP_POISON_BYTE, (size_t)(W * U->total) * es);
    ex->unsharded_live[u] = 1;
}

/* chunk_cat: unsharded grads -> (W, total) reduce-scatter input, zero padding. */
static void pack(cp_executor *ex, const cp_unit *U, int u)
{
    const cp_plan *p = ex->plan;
    int64_t W = p->shard_size;
    for (int j = 0; j < U->nparams; j++) {
        const cp_param *prm = &p->params[U->first_param + j];
        const char *g = at(ex->buf.grads[u], prm->grad_offset, U->ag_dtype);
        for (int64_t r = 0; r < W; r++)
            for (int64_t o = 0; o < prm->outer; o++) {
                int64_t src = o * W * prm->run + r * prm->run;
                int64_t dst = r * U->total + prm->offset + o * prm->run;
                for (int64_t t = 0; t < prm->run; t++) {
                    float v = src + t < prm->numel ? cp_load(U->ag_dtype, g, src + t) : 0.0f;
                    if (U->pre_divide != 1.0) v = (float)(v / U->pre_divide);
                    cp_store(U->reduce_dtype, ex->buf.rs_in[u], dst + t, v);
                }
            }
    }
    /* FSDP2 frees the unsharded grads after packing; the next backward
     * writes them afresh (autograd assigns on the first micro-step and
     * accumulates on later ones). Poison shows any read before that write. */
    memset(ex->buf.grads[u], CP_POISON_BYTE, (size_t)U->grads_numel * cp_dtype_size(U->ag_dtype));
}

static void view_out(cp_executor *ex, const cp_unit *U, int u)
{
    for (int64_t i = 0; i < U->total; i++) {
        float v = cp_load(U->reduce_dtype, ex->buf.rs_out[u], i);
        if (U->post_divide != 1.0) v = (float)(v / U->post_divide);
        cp_store(U->orig_dtype, ex->buf.sharded_grads[u], i, v);
    }
    memset(ex->buf.rs_out[u], CP_POISON_BYTE, (size_t)U->total * cp_dtype_size(U->reduce_dtype));
}

static int collective_done(cp_executor *ex, const cp_op *op, int rc, const void *in, int64_t in_n, const void *out,
                           int64_t out_n)
{
    if (rc != 0) {
        fprintf(stderr, "commplan: rank %d: %s of unit %s failed (op %ld)\n", ex->rank, cp_op_kind_name(op->kind),
                ex->plan->units[op->unit].name, (long)(op - ex->plan->ops));
        return -1;
    }
    if (ex->on_collective) ex->on_collective(ex->user, ex, op, in, in_n, out, out_n);
    return 0;
}

int cp_executor_run_op(cp_executor *ex, const cp_op *op)
{
    const cp_plan *p = ex->plan;
    const cp_unit *U = &p->units[op->unit];
    int u = op->unit;
    int64_t W = p->shard_size;
    switch (op->kind) {
    case CP_OP_COPY_IN:
        copy_in(ex, U, u);
        return 0;
    case CP_OP_ALL_GATHER: {
        void *slot = at(ex->buf.ag[u], ex->shard_rank * U->total, U->ag_dtype);
        int rc = op->family < 0 ? 0 : ex->backend->all_gather(ex->backend, op, slot, ex->buf.ag[u]);
        return collective_done(ex, op, rc, slot, U->total, ex->buf.ag[u], W * U->total);
    }
    case CP_OP_COPY_OUT:
        copy_out(ex, U, u);
        return 0;
    case CP_OP_FORWARD:
    case CP_OP_BACKWARD:
        if (!ex->unsharded_live[u]) {
            fprintf(stderr, "commplan: rank %d: %s of unit %s runs on resharded parameters\n", ex->rank,
                    cp_op_kind_name(op->kind), U->name);
            return -1;
        }
        return ex->on_compute ? ex->on_compute(ex->user, ex, op) : 0;
    case CP_OP_RESHARD:
        memset(ex->buf.unsharded[u], CP_POISON_BYTE, (size_t)(W * U->total) * cp_dtype_size(U->ag_dtype));
        ex->unsharded_live[u] = 0;
        return 0;
    case CP_OP_PACK:
        pack(ex, U, u);
        return 0;
    case CP_OP_REDUCE_SCATTER: {
        int rc = 0;
        if (op->family < 0)
            memcpy(ex->buf.rs_out[u], ex->buf.rs_in[u], (size_t)U->total * cp_dtype_size(U->reduce_dtype));
        else
            rc = ex->backend->reduce_scatter(ex->backend, op, ex->buf.rs_in[u], ex->buf.rs_out[u]);
        rc = collective_done(ex, op, rc, ex->buf.rs_in[u], W * U->total, ex->buf.rs_out[u], U->total);
        memset(ex->buf.rs_in[u], CP_POISON_BYTE, (size_t)(W * U->total) * cp_dtype_size(U->reduce_dtype));
        return rc;
    }
    case CP_OP_ALL_REDUCE: {
        /* In place: observers get a copy of the input taken before the call. */
        size_t bytes = (size_t)U->total * cp_dtype_size(U->reduce_dtype);
        void *before = ex->on_collective ? xcalloc(bytes, 1) : NULL;
        if (before) memcpy(before, ex->buf.rs_out[u], bytes);
        int rc = ex->backend->all_reduce(ex->backend, op, ex->buf.rs_out[u]);
        rc = collective_done(ex, op, rc, before, U->total, ex->buf.rs_out[u], U->total);
        free(before);
        return rc;
    }
    case CP_OP_VIEW_OUT:
        view_out(ex, U, u);
        return 0;
    default:
        fprintf(stderr, "commplan: rank %d: unknown op kind %d\n", ex->rank, (int)op->kind);
        return -1;
    }
}

int cp_executor_step(cp_executor *ex)
{
    for (int i = 0; i < ex->plan->nops; i++)
        if (cp_executor_run_op(ex, &ex->plan->ops[i]) != 0) return -1;
    return 0;
}
