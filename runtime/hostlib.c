/* cp_hostlib.h: one rank of the plan, the executor over the host backend
 * with its collectives handed to the caller. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cp_hostlib.h"

enum { CALL_UNSHARD, CALL_RESHARD, CALL_REDUCE, CALL_EXCHANGE, CALLS };

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
        !(h->last_exchange = malloc((size_t)(plan->nunits > 0 ? plan->nunits : 1) * sizeof *h->last_exchange))) {
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

/* The same order check as cp_gpu.h's calls (arena.c): refused before any
 * op runs when the call would write bytes another buffer holds data in. */
static int call(cp_hostlib *h, const char *name, int unit, int which, const cp_op_kind *kinds, int nkinds)
{
    /* A pipeline rank's step is its sends and receives between the units'
     * calls: a caller driving units alone would leave its peers waiting. */
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
    if (cp_run_call(h->plan, unit, kinds, nkinds, &h->cursor[unit][which], run_op, h) < 0) return -1;
    cp_call_apply(&e, &h->live[unit]);
    if (which == CALL_EXCHANGE && e.ops) h->last_exchange[unit] = e.last;
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

int cp_hostlib_unshard(cp_hostlib *h, int unit) { return call(h, "cp_hostlib_unshard", unit, CALL_UNSHARD, cp_call_unshard, 3); }
int cp_hostlib_reshard(cp_hostlib *h, int unit) { return call(h, "cp_hostlib_reshard", unit, CALL_RESHARD, cp_call_reshard, 1); }
int cp_hostlib_reduce_grads(cp_hostlib *h, int unit)
{
    return call(h, "cp_hostlib_reduce_grads", unit, CALL_REDUCE, cp_call_reduce, 8);
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
    return call(h, "cp_hostlib_exchange_tokens", unit, CALL_EXCHANGE, cp_call_exchange, 2);
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
