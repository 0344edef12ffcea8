/* The generator's per-rank buffer arena, seen from the runtime: buffer
 * sizes and the order check for library calls. */
#include <stdio.h>

#include "commplan.h"

int64_t cp_arena_buffer_bytes(const cp_plan *p, int unit, cp_buffer k)
{
    const cp_unit *U = &p->units[unit];
    int64_t W = cp_unit_shard_size(p, unit);
    switch (k) {
    case CP_BUF_SHARDED:
    case CP_BUF_SHARDED_GRADS: return U->total * (int64_t)cp_dtype_size(U->orig_dtype);
    case CP_BUF_AG:
    case CP_BUF_UNSHARDED: return W * U->total * (int64_t)cp_dtype_size(U->ag_dtype);
    case CP_BUF_GRADS: return U->grads_numel * (int64_t)cp_dtype_size(U->grad_dtype);
    case CP_BUF_RS_IN: return W * U->total * (int64_t)cp_dtype_size(U->reduce_dtype);
    case CP_BUF_ACT: return U->act_numel * (int64_t)cp_dtype_size(U->ag_dtype);
    case CP_BUF_PARTIAL: return U->partial_numel * (int64_t)cp_dtype_size(U->reduce_dtype);
    case CP_BUF_PP: /* [direction][micro-step] messages */
        return 2 * (int64_t)p->micro_steps * U->pp_numel * (int64_t)cp_dtype_size(U->ag_dtype);
    case CP_BUF_A2A_COUNTS: /* [slot][sent, received][expert] */
        return 2 * (int64_t)U->a2a_slots * U->a2a_experts * (int64_t)sizeof(int64_t);
    case CP_BUF_A2A_SEND:
    case CP_BUF_A2A_RECV: return U->a2a_numel * (int64_t)cp_dtype_size(U->ag_dtype);
    default: return U->total * (int64_t)cp_dtype_size(U->reduce_dtype);
    }
}

static int overlap(const cp_plan *p, int u, cp_arena_buffer ku, int v, cp_arena_buffer kv)
{
    int64_t a = p->units[u].arena_offset[ku], na = cp_arena_buffer_bytes(p, u, ku);
    int64_t b = p->units[v].arena_offset[kv], nb = cp_arena_buffer_bytes(p, v, kv);
    return na > 0 && nb > 0 && a < b + nb && b < a + na;
}

/* ---- library calls: which arena bytes hold data between calls ----
 * A library call (cp_gpu_unshard / _reshard / _reduce_grads, the
 * cp_hostlib_* twins) runs one op group of one unit, forked from and joined
 * into the caller's stream: the GPU finishes it before anything the caller
 * issues after it on that stream, so no two calls overlap, and the plan's
 * waits between units order nothing more (their events may be recorded by
 * calls not made yet). What keeps the arena's reuse safe is the call order:
 * no call may write bytes in which another buffer holds data across calls:
 *   unsharded  copy-out .. reshard (the caller's forward and backward read it)
 *   grads      the copy-out before the unit's backward .. pack, where
 *              that unshard serves the backward (no other unit's forward
 *              or backward between), as gen/memplan.lua lays it out (the
 *              caller's backward writes it, later micro-steps add into
 *              it); or from a reduction after which the unit, still
 *              unsharded, runs backward again. After a forward's unshard
 *              kept through the forward (reshard_after_forward = false)
 *              the plan gives the grads their bytes from the backward on,
 *              past every call before it: no call opens them then (a call
 *              order that differs from the plan's goes unchecked there)
 *   partial    partial_save .. partial_fold (all_reduce_last's sums)
 *   tokens     expert parallelism's send and receive buffers: from the
 *              caller's rows written before a dispatch (or before the
 *              combine's gradient) to its pair, the combine (or the
 *              dispatch's gradient), whose output the caller reads before
 *              its next call (gen/memplan.lua keeps them per exchange pair)
 * The all-gather buffer and the reduce-scatter input and output live inside
 * one call; the TP activation buffer and the pipeline's messages belong to
 * cp_gpu_step alone. */

/* The next op of unit u after op i among BACKWARD, PACK and COPY_OUT: whether
 * the caller's backward writes the grads before anything packs or regathers.
 * own: and no other unit's forward or backward comes first (the unshard at
 * op i serves that backward). */
static int backward_next(const cp_plan *p, int u, int i, int own)
{
    for (int j = i + 1; j < p->nops; j++) {
        const cp_op *o = &p->ops[j];
        if (o->unit != u) {
            if (own && (o->kind == CP_OP_FORWARD || o->kind == CP_OP_BACKWARD)) return 0;
            continue;
        }
        if (o->kind == CP_OP_BACKWARD) return 1;
        if (o->kind == CP_OP_PACK || o->kind == CP_OP_COPY_OUT) return 0;
    }
    return 0;
}

typedef struct {
    const cp_plan *p;
    cp_call_effect *e;
} scan_ctx;

static int scan_op(void *ctx, const cp_op *op)
{
    scan_ctx *c = ctx;
    cp_call_effect *e = c->e;
    const cp_op_desc *d = &cp_op_descs[op->kind];
    int i = (int)(op - c->p->ops);
    if (e->ops++ == 0) e->first = i;
    e->last = i;
    if (d->in >= 0 && d->in < CP_ARENA_BUFFERS) e->touches |= 1u << d->in;
    if (d->out >= 0 && d->out < CP_ARENA_BUFFERS) e->touches |= 1u << d->out, e->writes |= 1u << d->out;
    switch (op->kind) {
    case CP_OP_COPY_OUT:
        e->opens |= 1u << CP_BUF_UNSHARDED;
        if (backward_next(c->p, op->unit, i, 1)) e->opens |= 1u << CP_BUF_GRADS;
        break;
    case CP_OP_RESHARD: e->closes |= 1u << CP_BUF_UNSHARDED; break;
    case CP_OP_PACK:
        e->closes |= 1u << CP_BUF_GRADS;
        e->opens &= ~(1u << CP_BUF_GRADS);
        break;
    case CP_OP_PARTIAL_SAVE: e->opens |= 1u << CP_BUF_PARTIAL; break;
    case CP_OP_PARTIAL_FOLD:
        e->closes |= 1u << CP_BUF_PARTIAL;
        e->opens &= ~(1u << CP_BUF_PARTIAL);
        break;
    case CP_OP_A2A: {
        /* Both token buffers hold the caller's rows: its input written
         * before the call, the exchange's output after it. A dispatch
         * (or the combine's gradient) opens them for the experts between
         * it and its pair; the combine (or the dispatch's gradient) closes
         * them, its rows left for the caller to read before its next call. */
        unsigned both = (1u << CP_BUF_A2A_SEND) | (1u << CP_BUF_A2A_RECV);
        e->touches |= both;
        e->writes |= both;
        if (op->a2a_combine) {
            e->closes |= both;
            e->opens &= ~both;
        } else {
            e->opens |= both;
            e->closes &= ~both;
        }
        break;
    }
    default: break;
    }
    return 0;
}

void cp_call_effect_of(const cp_plan *p, int unit, const cp_op_kind *kinds, int nkinds, int cursor, cp_call_effect *e)
{
    e->ops = e->touches = e->writes = e->opens = e->closes = 0;
    e->first = e->last = -1;
    if (unit < 0 || unit >= p->nunits) return;
    scan_ctx c = { p, e };
    int cur = cursor; /* a copy: the call itself moves the real cursor */
    cp_run_call(p, unit, kinds, nkinds, &cur, scan_op, &c);
    /* A reduction after which the unit, still unsharded, runs backward
     * again: the caller may write the grads as soon as the call returns. */
    if (e->ops && (e->closes & (1u << CP_BUF_GRADS)) && backward_next(p, unit, e->last, 0))
        e->opens |= 1u << CP_BUF_GRADS;
}

int cp_call_conflict(const cp_plan *p, int unit, const cp_call_effect *e, const unsigned *live, int *wrote,
                     int *held)
{
    /* What it writes, and what it opens: the caller's backward writes the
     * grads an unshard opens, so their bytes must be free from then on. */
    unsigned mine = e->writes | e->opens;
    for (int k = 0; k < CP_ARENA_BUFFERS; k++) {
        if (!(mine & (1u << k))) continue;
        for (int v = 0; v < p->nunits; v++)
            for (int j = 0; j < CP_ARENA_BUFFERS; j++) {
                /* The call's own buffers in use by it (the grads it packs or
                 * keeps open, the sums it adds to, the parameters it
                 * regathers) are its. */
                if (!(live[v] & (1u << j)) || (v == unit && ((e->touches | e->opens) & (1u << j)))) continue;
                if (overlap(p, unit, (cp_arena_buffer)k, v, (cp_arena_buffer)j)) {
                    if (wrote) *wrote = k;
                    if (held) *held = j;
                    return v;
                }
            }
    }
    return -1;
}

void cp_call_apply(const cp_call_effect *e, unsigned *live_of_unit)
{
    *live_of_unit = (*live_of_unit & ~e->closes) | e->opens;
}

void cp_call_conflict_message(const cp_plan *p, const char *call, int unit, int v, int wrote, int held, char *out,
                              size_t n)
{
    static const char *const bufs[CP_ARENA_BUFFERS] = { "all-gather buffer", "unsharded parameters",
                                                        "unsharded gradients", "reduce-scatter input",
                                                        "reduce-scatter output", "activation buffer",
                                                        "partial gradient sums", "point-to-point messages",
                                                        "expert counts", "expert-parallel send buffer",
                                                        "expert-parallel receive buffer" };
    const char *name = p->units[v].name, *why;
    char fix[300];
    if (held == CP_BUF_UNSHARDED) {
        why = "still unsharded";
        snprintf(fix, sizeof fix, "reshard %s first", name);
    } else if (held == CP_BUF_GRADS) {
        why = "which its backward writes until its gradients are reduced";
        snprintf(fix, sizeof fix, "reduce %s's gradients first", name);
    } else if (held == CP_BUF_A2A_SEND || held == CP_BUF_A2A_RECV) {
        why = "which hold its tokens between an exchange and its pair";
        snprintf(fix, sizeof fix, "exchange %s's tokens back first (cp_gpu_exchange_tokens / cp_hostlib_exchange_tokens)",
                 name);
    } else {
        why = "which its next reduction adds into";
        snprintf(fix, sizeof fix, "make %s's reductions first", name);
    }
    snprintf(out, n, "%s(%s) would %s %s over the %s of unit %s, %s: the plan's arena reuses those bytes; %s, in the "
             "order of plans/%s/SCHEDULE.md", call, p->units[unit].name,
             wrote == CP_BUF_GRADS ? "let its backward write its" : "write its",
             (unsigned)wrote < CP_ARENA_BUFFERS ? bufs[wrote] : "buffers",
             (unsigned)held < CP_ARENA_BUFFERS ? bufs[held] : "buffers", name, why, fix, p->name);
}
