/* cp_hostlib.h: one rank of the plan, the executor over the host backend
 * with its collectives handed to the caller. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cp_hostlib.h"

enum { CALL_UNSHARD, CALL_RESHARD, CALL_REDUCE, CALL_EXCHANGE, CALL_UNSHARD_WAIT, CALLS };

struct cp_hostlib {
    const cp_plan *plan;  /* the executor's view: this rank's TP class */
    cp_host_world *world;
    cp_backend backend;
    cp_executor ex;
    int (*cursor)[CALLS]; /* per unit and call: where the next search starts */
    unsigned char *ran;   /* per op: run in this step (every op runs once a step; calls run them out of
                             table order, each group in the order its last op has in the table) */
    unsigned *live;       /* per unit: bit k, arena buffer k holds data across calls (arena.c) */
    int *last_exchange;   /* per unit: the A2A op its last cp_hostlib_exchange_tokens ran, or -1 */
    /* The split calls (cp_hostlib_*_issue / _wait): a GPU's streams kept on
     * one thread. A collective an issue runs may be asynchronous (the
     * caller's: cp_hostlib_async_ticket names it, sync_cb waits for it);
     * what must follow it on the GPU (a later op of its stream, an op
     * waiting for an event recorded after it) first waits for it, and the
     * rest of an issue whose next op would wait is deferred, in order,
     * until something needs it (a later op of its stream, a wait on an
     * event it records, the unit's wait, a new step). */
    cp_order *order;
    cp_host_sync_cb sync_cb;
    void *sync_user;
    long tickets, done, cur_ticket; /* asynchronous collectives handed out, waited for; the one running */
    long stream_ticket[CP_STREAM_COUNT]; /* per stream: its last asynchronous collective */
    long *ev_ticket;      /* per event slot: the collective it follows (0: none) */
    int *queue, *queue_prev, nqueue; /* deferred ops (table index) and the stream of the op before each */
    unsigned char stream_deferred[CP_STREAM_COUNT], *ev_deferred;
    long *unit_ticket;    /* per unit: the last collective its reduction issued */
    char err[600];
};

static int fail(cp_hostlib *h, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(h->err, sizeof h->err, fmt, ap);
    va_end(ap);
    return -1;
}

int cp_hostlib_init(cp_hostlib **out, const cp_plan *plan, int rank, cp_host_collective_cb cb, void *user, char *err,
                    size_t errlen)
{
    *out = NULL;
    if (rank < 0 || rank >= plan->world_size) {
        snprintf(err, errlen, "rank %d is outside plan %s's %d ranks; launch %d ranks", rank, plan->name,
                 plan->world_size, plan->world_size);
        return -1;
    }
    cp_hostlib *h = calloc(1, sizeof *h);
    if (!h || !(h->world = cp_host_world_create(plan)) ||
        !(h->cursor = calloc((size_t)(plan->nunits > 0 ? plan->nunits : 1), sizeof *h->cursor)) ||
        !(h->ran = calloc((size_t)(plan->nops > 0 ? plan->nops : 1), 1)) ||
        !(h->live = calloc((size_t)(plan->nunits > 0 ? plan->nunits : 1), sizeof *h->live)) ||
        !(h->last_exchange = malloc((size_t)(plan->nunits > 0 ? plan->nunits : 1) * sizeof *h->last_exchange)) ||
        !(h->ev_ticket = calloc((size_t)(plan->nevents > 0 ? plan->nevents : 1), sizeof *h->ev_ticket)) ||
        !(h->ev_deferred = calloc((size_t)(plan->nevents > 0 ? plan->nevents : 1), 1)) ||
        !(h->queue = calloc((size_t)(plan->nops > 0 ? plan->nops : 1), sizeof *h->queue)) ||
        !(h->queue_prev = calloc((size_t)(plan->nops > 0 ? plan->nops : 1), sizeof *h->queue_prev)) ||
        !(h->unit_ticket = calloc((size_t)(plan->nunits > 0 ? plan->nunits : 1), sizeof *h->unit_ticket))) {
        snprintf(err, errlen, "rank %d: out of host memory for plan %s", rank, plan->name);
        cp_hostlib_destroy(h);
        return -1;
    }
    for (int u = 0; u < plan->nunits; u++) h->last_exchange[u] = -1;
    cp_host_backend_init_cb(&h->backend, h->world, rank, cb, user);
    h->ex.quiet = 1;
    if (cp_executor_init(&h->ex, plan, rank, &h->backend) != 0) {
        snprintf(err, errlen, "%s", h->ex.err);
        cp_hostlib_destroy(h);
        return -1;
    }
    h->plan = h->ex.plan;
    if (!(h->order = cp_order_new(h->plan))) {
        snprintf(err, errlen, "rank %d: out of host memory for plan %s", rank, plan->name);
        cp_hostlib_destroy(h);
        return -1;
    }
    h->backend.fork(&h->backend); /* the first step */
    *out = h;
    return 0;
}

void cp_hostlib_destroy(cp_hostlib *h)
{
    if (!h) return;
    cp_executor_free(&h->ex);
    cp_host_world_destroy(h->world);
    free(h->cursor);
    free(h->ran);
    free(h->live);
    free(h->last_exchange);
    free(h->ev_ticket);
    free(h->ev_deferred);
    free(h->queue);
    free(h->queue_prev);
    free(h->unit_ticket);
    cp_order_free(h->order);
    free(h);
}

const char *cp_hostlib_last_error(const cp_hostlib *h) { return h->err; }
int cp_hostlib_rank(const cp_hostlib *h) { return h->ex.rank; }
int cp_hostlib_shard_rank(const cp_hostlib *h) { return h->ex.shard_rank; }

int cp_hostlib_group_member(const cp_hostlib *h, int family, int color, int key)
{
    if (family < 0 || family >= h->plan->nfamilies) return -1;
    return cp_group_member(h->plan, family, color, key);
}

static void *param_ptr(cp_hostlib *h, int param, cp_buffer kind) { return cp_executor_param_ptr(&h->ex, param, kind); }

void *cp_hostlib_sharded(cp_hostlib *h, int param) { return param_ptr(h, param, CP_BUF_SHARDED); }
void *cp_hostlib_unsharded(cp_hostlib *h, int param) { return param_ptr(h, param, CP_BUF_UNSHARDED); }
void *cp_hostlib_grad(cp_hostlib *h, int param) { return param_ptr(h, param, CP_BUF_GRADS); }
void *cp_hostlib_sharded_grad(cp_hostlib *h, int param) { return param_ptr(h, param, CP_BUF_SHARDED_GRADS); }

/* One thread, every op when its call comes: the host backend refuses a wait
 * on an event no earlier op of this step recorded, so a call order that
 * would leave a plan's wait unmet on a GPU (an event not yet recorded orders
 * nothing there) fails here instead. A step starts (the backend's fork)
 * when an op that already ran in this step runs again. */
static int run_op(void *ctx, const cp_op *op)
{
    cp_hostlib *h = ctx;
    int i = (int)(op - h->plan->ops);
    if (h->ran[i]) {
        memset(h->ran, 0, (size_t)h->plan->nops);
        if (h->backend.fork(&h->backend)) return fail(h, "starting a step failed");
    }
    h->ran[i] = 1;
    if (cp_executor_run_op(&h->ex, op)) return fail(h, "%s", h->ex.err);
    return 0;
}

/* ---- the split calls ---- */

void cp_hostlib_set_async(cp_hostlib *h, cp_host_sync_cb cb, void *user)
{
    h->sync_cb = cb;
    h->sync_user = user;
}

long cp_hostlib_async_ticket(const cp_hostlib *h) { return h->cur_ticket; }

static int sync_to(cp_hostlib *h, long t)
{
    if (t <= h->done) return 0;
    if (h->sync_cb && h->sync_cb(h->sync_user, t) != 0) return fail(h, "waiting for an asynchronous collective failed");
    h->done = t;
    return 0;
}

/* The last asynchronous collective op must follow on a GPU: its stream's,
 * the previous op's of its call (prev: that op's stream, or -1), its waits'. */
static long needs(const cp_hostlib *h, const cp_op *op, int prev)
{
    long t = h->stream_ticket[op->stream];
    if (prev >= 0 && h->stream_ticket[prev] > t) t = h->stream_ticket[prev];
    for (int w = 0; w < op->wait_count; w++) {
        int ev = h->plan->waits[op->wait_first + w];
        if (ev >= 0 && ev < h->plan->nevents && h->ev_ticket[ev] > t) t = h->ev_ticket[ev];
    }
    return t > h->done ? t : 0;
}

static int deferred_needed(const cp_hostlib *h, const cp_op *op)
{
    if (!h->nqueue) return 0;
    if (h->stream_deferred[op->stream]) return 1;
    for (int w = 0; w < op->wait_count; w++) {
        int ev = h->plan->waits[op->wait_first + w];
        if (ev >= 0 && ev < h->plan->nevents && h->ev_deferred[ev]) return 1;
    }
    return 0;
}

/* Runs op now, its collective asynchronous where allowed (a ticket). */
static int exec_op(cp_hostlib *h, const cp_op *op, int async)
{
    int s = (int)op->stream;
    if (async && h->sync_cb && cp_op_descs[op->kind].action == CP_ACT_COLLECTIVE) h->cur_ticket = ++h->tickets;
    int rc = run_op(h, op);
    if (h->cur_ticket) h->stream_ticket[s] = h->cur_ticket;
    h->cur_ticket = 0;
    if (op->event >= 0 && op->event < h->plan->nevents)
        h->ev_ticket[op->event] = h->stream_ticket[s] > h->done ? h->stream_ticket[s] : 0;
    return rc;
}

static int flush(cp_hostlib *h)
{
    for (int q = 0; q < h->nqueue; q++) {
        const cp_op *op = &h->plan->ops[h->queue[q]];
        if (sync_to(h, needs(h, op, h->queue_prev[q])) || exec_op(h, op, 0)) {
            h->nqueue = 0;
            return -1;
        }
    }
    h->nqueue = 0;
    memset(h->stream_deferred, 0, sizeof h->stream_deferred);
    memset(h->ev_deferred, 0, (size_t)(h->plan->nevents > 0 ? h->plan->nevents : 1));
    return 0;
}

typedef struct {
    cp_hostlib *h;
    int async, prev, deferring, unit;
} split_ctx;

static int run_split_op(void *ctx, const cp_op *op)
{
    split_ctx *c = ctx;
    cp_hostlib *h = c->h;
    int i = (int)(op - h->plan->ops), s = (int)op->stream;
    if (!c->deferring) {
        /* A new step, or an op that needs deferred work: that work first. */
        if ((h->ran[i] || deferred_needed(h, op)) && (flush(h) || (h->ran[i] && sync_to(h, h->tickets)))) return -1;
        long t = needs(h, op, c->prev);
        if (t && c->async && s != CP_STREAM_COMPUTE) c->deferring = 1;
        else if (sync_to(h, t)) return -1;
    }
    if (c->deferring) {
        h->queue_prev[h->nqueue] = c->prev;
        h->queue[h->nqueue++] = i;
        h->stream_deferred[s] = 1;
        if (op->event >= 0 && op->event < h->plan->nevents) h->ev_deferred[op->event] = 1;
    } else if (exec_op(h, op, c->async))
        return -1;
    c->prev = s;
    if (h->stream_ticket[s] > h->unit_ticket[c->unit]) h->unit_ticket[c->unit] = h->stream_ticket[s];
    return 0;
}

/* A split call (async: an issue, its collectives handed out asynchronous;
 * else a wait's copy-out, or a blocking call after everything in flight):
 * the same checks as cp_gpu.h's, before anything runs. */
static int split_call(cp_hostlib *h, const char *name, int unit, int which, const cp_op_kind *kinds, int nkinds,
                      int async, int flags)
{
    if (h->plan->pp_size > 1)
        return fail(h, "%s: plan %s is a pipeline plan (pp %d): the library calls do not run its sends and "
                    "receives; run its binary, or drive a plan without pp", name, h->plan->name, h->plan->pp_size);
    if (unit < 0 || unit >= h->plan->nunits) return fail(h, "unit %d is outside the plan's %d units", unit, h->plan->nunits);
    h->err[0] = '\0';
    cp_call_effect e;
    cp_call_effect_of(h->plan, unit, kinds, nkinds, h->cursor[unit][which], &e);
    int wrote = 0, held = 0, v = cp_call_conflict(h->plan, unit, &e, h->live, &wrote, &held);
    if (v >= 0) {
        cp_call_conflict_message(h->plan, name, unit, v, wrote, held, h->err, sizeof h->err);
        return -1;
    }
    if (!e.ops) return 0;
    cp_call_part part = { kinds, nkinds, h->cursor[unit][which] };
    if (cp_order_call(h->order, name, unit, &part, 1, flags, 0, h->err, sizeof h->err)) return -1;
    (void)cp_order_call(h->order, name, unit, &part, 1, flags, 1, h->err, sizeof h->err);
    split_ctx c = { h, async, -1, 0, unit };
    if (cp_run_call(h->plan, unit, kinds, nkinds, &h->cursor[unit][which], run_split_op, &c) < 0) return -1;
    cp_call_apply(&e, &h->live[unit]);
    if (which == CALL_EXCHANGE) h->last_exchange[unit] = e.last;
    return 0;
}

int cp_hostlib_unshard_issue(cp_hostlib *h, int unit)
{
    return split_call(h, "cp_hostlib_unshard_issue", unit, CALL_UNSHARD, cp_call_unshard_issue, 3, 1, 0);
}

int cp_hostlib_unshard_wait(cp_hostlib *h, int unit)
{
    return split_call(h, "cp_hostlib_unshard_wait", unit, CALL_UNSHARD_WAIT, cp_call_unshard_wait, 1, 0, 0);
}

int cp_hostlib_reduce_issue(cp_hostlib *h, int unit)
{
    if (unit >= 0 && unit < h->plan->nunits) h->unit_ticket[unit] = 0;
    return split_call(h, "cp_hostlib_reduce_issue", unit, CALL_REDUCE, cp_call_reduce, 10, 1, 0);
}

int cp_hostlib_reduce_wait(cp_hostlib *h, int unit)
{
    if (unit < 0 || unit >= h->plan->nunits) return fail(h, "unit %d is outside the plan's %d units", unit, h->plan->nunits);
    if (flush(h) || sync_to(h, h->unit_ticket[unit])) return -1;
    cp_order_wait_unit(h->order, unit);
    return 0;
}

int cp_hostlib_set_expert_counts(cp_hostlib *h, int unit, const int64_t *counts, int n)
{
    if (cp_executor_set_expert_counts(&h->ex, unit, counts, n) == 0) return 0;
    return fail(h, "%s", h->ex.err);
}

int cp_hostlib_refuse_expert_counts(cp_hostlib *h, int unit, const char *why)
{
    cp_executor_refuse_expert_counts(&h->ex, unit, why);
    return fail(h, "%s", h->ex.err);
}

/* The blocking calls: everything in flight first (a GPU's join), then
 * synchronous; an unshard is its issue and its wait. */
static int settle(cp_hostlib *h)
{
    if (flush(h) || sync_to(h, h->tickets)) return -1;
    cp_order_join(h->order);
    return 0;
}

int cp_hostlib_unshard(cp_hostlib *h, int unit)
{
    if (settle(h)) return -1;
    cp_call_effect e;
    if (unit >= 0 && unit < h->plan->nunits) {
        /* refused as one call, before either half runs */
        cp_call_effect_of(h->plan, unit, cp_call_unshard, 4, h->cursor[unit][CALL_UNSHARD], &e);
        int wrote = 0, held = 0, v = cp_call_conflict(h->plan, unit, &e, h->live, &wrote, &held);
        if (v >= 0) {
            cp_call_conflict_message(h->plan, "cp_hostlib_unshard", unit, v, wrote, held, h->err, sizeof h->err);
            return -1;
        }
    }
    if (split_call(h, "cp_hostlib_unshard", unit, CALL_UNSHARD, cp_call_unshard_issue, 3, 0, CP_ORDER_FORK)) return -1;
    return split_call(h, "cp_hostlib_unshard", unit, CALL_UNSHARD_WAIT, cp_call_unshard_wait, 1, 0, CP_ORDER_JOIN);
}
int cp_hostlib_reshard(cp_hostlib *h, int unit)
{
    return split_call(h, "cp_hostlib_reshard", unit, CALL_RESHARD, cp_call_reshard, 2, 0, 0);
}
int cp_hostlib_reduce_grads(cp_hostlib *h, int unit)
{
    return settle(h) ? -1
                     : split_call(h, "cp_hostlib_reduce_grads", unit, CALL_REDUCE, cp_call_reduce, 10, 0,
                                  CP_ORDER_FORK | CP_ORDER_JOIN);
}

void cp_hostlib_set_alltoall(cp_hostlib *h, cp_host_alltoall_cb cb, void *user)
{
    cp_host_backend_set_alltoall(&h->backend, cb, user);
}

/* The unit's next token all-to-all, in the plan's order: forward, its
 * counts exchange and dispatch in one call, then its combine; backward,
 * the combine's gradient, then the dispatch's (cp_gpu_exchange_tokens). */
int cp_hostlib_exchange_tokens(cp_hostlib *h, int unit)
{
    if (settle(h)) return -1;
    return split_call(h, "cp_hostlib_exchange_tokens", unit, CALL_EXCHANGE, cp_call_exchange, 2, 0,
                      CP_ORDER_FORK | CP_ORDER_JOIN);
}

void *cp_hostlib_tokens(cp_hostlib *h, int unit, int receive)
{
    if (unit < 0 || unit >= h->plan->nunits || h->plan->units[unit].a2a_numel <= 0) return NULL;
    return h->ex.buf[receive ? CP_BUF_A2A_RECV : CP_BUF_A2A_SEND][unit];
}

const int64_t *cp_hostlib_exchange_counts(const cp_hostlib *h, int unit)
{
    if (unit < 0 || unit >= h->plan->nunits || h->last_exchange[unit] < 0) return NULL;
    return cp_executor_a2a_counts_of_op(&h->ex, &h->plan->ops[h->last_exchange[unit]]);
}
