/* The generator's per-rank buffer arena, seen from the runtime: buffer
 * sizes and the order check for library calls. */
#include <stdio.h>

#include "commplan.h"

int64_t cp_arena_buffer_bytes(const cp_plan *p, int unit, cp_buffer k)
{
    const cp_unit *U = &p->units[unit];
    int64_t W = cp_unit_shard_size(p, unit);
    switch (k) {
    case CP_BUF_SHARDED: return U->total * (int64_t)cp_dtype_size(U->orig_dtype);
    /* (the trainable parameters' shards: cp_unit_rs_total) */
    case CP_BUF_SHARDED_GRADS: return cp_unit_rs_total(U) * (int64_t)cp_dtype_size(U->orig_dtype);
    /* CPU offload's device copies of the shards and the viewed-out grads (none without it) */
    case CP_BUF_H2D: return U->offload ? U->total * (int64_t)cp_dtype_size(U->orig_dtype) : 0;
    case CP_BUF_D2H: return U->offload ? cp_unit_rs_total(U) * (int64_t)cp_dtype_size(U->orig_dtype) : 0;
    case CP_BUF_AG: return W * cp_unit_ag_bytes(U);
    /* reshard_after_forward = k: the kept slice, S / k of the slot (none without it) */
    case CP_BUF_POST_FORWARD: return U->post_forward > 1 ? W / U->post_forward * cp_unit_ag_bytes(U) : 0;
    case CP_BUF_UNSHARDED: return U->ag_bytes > 0 ? U->unsharded_bytes : W * cp_unit_ag_bytes(U);
    case CP_BUF_GRADS: return U->grads_numel * (int64_t)cp_dtype_size(U->grad_dtype);
    case CP_BUF_RS_IN: return W * cp_unit_rs_total(U) * (int64_t)cp_dtype_size(U->reduce_dtype);
    case CP_BUF_ACT: return U->act_numel * (int64_t)cp_dtype_size(U->ag_dtype);
    case CP_BUF_PARTIAL: return U->partial_numel * (int64_t)cp_dtype_size(U->reduce_dtype);
    case CP_BUF_PP: /* [direction][micro-step] messages */
        return 2 * (int64_t)p->micro_steps * U->pp_numel * (int64_t)cp_dtype_size(U->ag_dtype);
    case CP_BUF_A2A_COUNTS: /* [slot][sent, received][expert] */
        return 2 * (int64_t)U->a2a_slots * U->a2a_experts * (int64_t)sizeof(int64_t);
    case CP_BUF_A2A_SEND:
    case CP_BUF_A2A_RECV: return U->a2a_numel * (int64_t)cp_dtype_size(U->ag_dtype);
    default: return cp_unit_rs_total(U) * (int64_t)cp_dtype_size(U->reduce_dtype); /* CP_BUF_RS_OUT */
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
 *   all-gather buffer  a split unshard's issue (its all-gather) .. its wait
 *              (the copy-out); inside the blocking cp_gpu_unshard
 * The reduce-scatter input and output live inside one call (what a split
 * reduction's issue leaves in flight the order tracker below checks); the TP activation buffer and the pipeline's messages belong to
 * cp_gpu_step alone. */

/* The next op of unit u after op i among BACKWARD, PACK and COPY_OUT: whether
 * the caller's backward writes the grads before anything packs or regathers.
 * own: and no other unit's forward or backward comes first (the unshard at
 * op i serves that backward); own == 2: and not the unit's own forward. */
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
        /* its next micro-step's forward first (set_reshard_after_backward(False):
         * kept unsharded, no copy-out): the backward after it writes them */
        if (o->kind == CP_OP_FORWARD && own == 2) return 0;
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
    case CP_OP_ALL_GATHER:
        e->opens |= 1u << CP_BUF_AG; /* until its copy-out (a split unshard's wait) */
        if (op->post_forward) {
            e->closes |= 1u << CP_BUF_POST_FORWARD;
            e->opens &= ~(1u << CP_BUF_POST_FORWARD);
            e->touches |= 1u << CP_BUF_POST_FORWARD;
        }
        break;
    case CP_OP_COPY_OUT:
        e->closes |= 1u << CP_BUF_AG;
        e->opens &= ~(1u << CP_BUF_AG);
        e->opens |= 1u << CP_BUF_UNSHARDED;
        if (backward_next(c->p, op->unit, i, 1)) e->opens |= 1u << CP_BUF_GRADS;
        break;
    case CP_OP_RESHARD: e->closes |= 1u << CP_BUF_UNSHARDED; break;
    /* reshard_after_forward = k: the kept slice holds from the reshard call
     * to the unshard call whose all-gather reads it */
    case CP_OP_POST_FORWARD: e->opens |= 1u << CP_BUF_POST_FORWARD; break;
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
    if (e->ops && (e->closes & (1u << CP_BUF_GRADS)) && backward_next(p, unit, e->last, 2))
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
                                                        "expert-parallel receive buffer",
                                                        "device copy of the offloaded shards",
                                                        "device copy of the offloaded gradients",
                                                        "post-forward slice" };
    const char *name = p->units[v].name, *why;
    char fix[300];
    if (held == CP_BUF_UNSHARDED) {
        why = "still unsharded";
        snprintf(fix, sizeof fix, "reshard %s first", name);
    } else if (held == CP_BUF_GRADS) {
        why = "which its backward writes until its gradients are reduced";
        snprintf(fix, sizeof fix, "reduce %s's gradients first", name);
    } else if (held == CP_BUF_AG) {
        why = "gathered by its unshard's issue and not yet copied out";
        snprintf(fix, sizeof fix, "wait for %s's unshard first (cp_gpu_unshard_wait / cp_hostlib_unshard_wait)", name);
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

/* ---- split calls: the order of the GPU work they issue ----
 * cp_gpu_unshard_issue / cp_gpu_reduce_issue (and the cp_hostlib_ twins)
 * issue a call's ops on the plan's side streams without joining them into
 * the caller's: what orders them against earlier and later work is only
 * stream order and the plan's event waits, as in cp_gpu_step. This tracker
 * follows that order on the host, with a vector clock per stream (what of
 * every stream's issued work a stream's next op runs after): an event
 * records its stream's clock, a wait takes the maximum, each op of a call
 * runs after the one before it (the calls chain their ops). A call is
 * refused before it issues anything when one of its ops waits for an event
 * no op of this step has recorded yet (on a GPU that wait orders nothing),
 * or touches arena bytes that an earlier op of another stream may still
 * write (or, for a write, read) unordered before it. */
#include <stdlib.h>
#include <string.h>

#define S CP_STREAM_COUNT
struct cp_order {
    const cp_plan *p;
    long gen;              /* the step: bumped when an op that ran in this step runs again */
    unsigned char *ran;    /* per op: issued in this step */
    long *ev_gen;          /* per event slot: the step that last recorded it */
    long (*ev_vc)[S];      /* per event slot: the clock of its stream then */
    long vc[S][S];         /* per stream: the clock its next op runs after */
    long (*acc)[CP_ARENA_BUFFERS][S][2]; /* per unit, buffer, stream: its last read [0] and write [1] there */
    int (*acc_op)[CP_ARENA_BUFFERS][S][2];
    long (*done_vc)[S];    /* per unit: the clock at the end of its last issued reduction */
    int *ov_first, *ov;    /* per (unit, buffer): the (unit, buffer) pairs sharing bytes with it, itself
                              included (v * CP_ARENA_BUFFERS + j), ov[ov_first[i] .. ov_first[i + 1]) */
};

cp_order *cp_order_new(const cp_plan *p)
{
    size_t nu = (size_t)(p->nunits > 0 ? p->nunits : 1), no = (size_t)(p->nops > 0 ? p->nops : 1),
           ne = (size_t)(p->nevents > 0 ? p->nevents : 1);
    cp_order *o = calloc(1, sizeof *o);
    if (!o) return NULL;
    o->p = p;
    o->ran = calloc(no, 1);
    o->ev_gen = calloc(ne, sizeof *o->ev_gen);
    o->ev_vc = calloc(ne, sizeof *o->ev_vc);
    o->acc = calloc(nu, sizeof *o->acc);
    o->acc_op = calloc(nu, sizeof *o->acc_op);
    o->done_vc = calloc(nu, sizeof *o->done_vc);
    if (!o->ran || !o->ev_gen || !o->ev_vc || !o->acc || !o->acc_op || !o->done_vc) {
        cp_order_free(o);
        return NULL;
    }
    for (size_t e = 0; e < ne; e++) o->ev_gen[e] = -1;
    /* Which buffers share bytes, once (a call's checks then walk only those). */
    int nb = p->nunits * CP_ARENA_BUFFERS, n = 0;
    if (!(o->ov_first = calloc((size_t)nb + 1, sizeof *o->ov_first))) {
        cp_order_free(o);
        return NULL;
    }
    for (int pass = 0; pass < 2; pass++) {
        n = 0;
        for (int a = 0; a < nb; a++) {
            if (pass) o->ov_first[a] = n;
            for (int b = 0; b < nb; b++)
                if (a == b || overlap(p, a / CP_ARENA_BUFFERS, (cp_arena_buffer)(a % CP_ARENA_BUFFERS),
                                      b / CP_ARENA_BUFFERS, (cp_arena_buffer)(b % CP_ARENA_BUFFERS))) {
                    if (pass) o->ov[n] = b;
                    n++;
                }
        }
        if (pass) o->ov_first[nb] = n;
        else if (!(o->ov = calloc((size_t)(n > 0 ? n : 1), sizeof *o->ov))) {
            cp_order_free(o);
            return NULL;
        }
    }
    return o;
}

void cp_order_free(cp_order *o)
{
    if (!o) return;
    free(o->ran);
    free(o->ev_gen);
    free(o->ev_vc);
    free(o->acc);
    free(o->acc_op);
    free(o->done_vc);
    free(o->ov_first);
    free(o->ov);
    free(o);
}

static void vc_max(long *a, const long *b)
{
    for (int s = 0; s < S; s++) if (b[s] > a[s]) a[s] = b[s];
}

int cp_order_starts_step(const cp_order *o, int op) { return op >= 0 && op < o->p->nops && o->ran[op]; }

/* Events one call's ops may record (today's calls record at most 8); a call
 * recording more is refused with one line, never checked partly. */
#define CP_ORDER_MAX_RECORDS 32

typedef struct {
    cp_order *o;
    const char *call;
    int unit, flags, apply, prev, failed, step_start;
    long vc[S][S];        /* the streams' clocks as this call leaves them */
    int nrec, rec_ev[CP_ORDER_MAX_RECORDS]; /* events this call's earlier ops record (checked before applied) */
    long rec_vc[CP_ORDER_MAX_RECORDS][S];
    char *out;
    size_t n;
} order_ctx;

static const char *const buf_names[CP_ARENA_BUFFERS] = { "all-gather buffer", "unsharded parameters",
                                                          "unsharded gradients", "reduce-scatter input",
                                                          "reduce-scatter output", "activation buffer",
                                                          "partial gradient sums", "point-to-point messages",
                                                          "expert counts", "expert-parallel send buffer",
                                                          "expert-parallel receive buffer" };

/* One access of op i (stream s, clock vc) to its unit's buffer k: checked
 * against every earlier op's conflicting access to overlapping bytes. */
static int order_access(order_ctx *c, int i, const long *vc, int k, int write)
{
    cp_order *o = c->o;
    const cp_plan *p = o->p;
    const cp_op *op = &p->ops[i];
    int s = (int)op->stream, u = op->unit, a = u * CP_ARENA_BUFFERS + k;
    for (int q = o->ov_first[a]; q < o->ov_first[a + 1]; q++) {
        int v = o->ov[q] / CP_ARENA_BUFFERS, j = o->ov[q] % CP_ARENA_BUFFERS;
        for (int t = 0; t < S; t++) {
            if (t == s) continue; /* stream order */
            for (int w = write ? 0 : 1; w < 2; w++) {
                if (o->acc[v][j][t][w] <= vc[t]) continue;
                const cp_op *h = &p->ops[o->acc_op[v][j][t][w]];
                snprintf(c->out, c->n, "%s(%s) would issue its %s (op %d, %s stream), which %s the %s of unit %s, "
                         "while %s's %s (op %d, %s stream) may still %s them: no wait of the plan orders it "
                         "first; make the calls in the order of plans/%s/SCHEDULE.md",
                         c->call, p->units[c->unit].name, cp_op_kind_name(op->kind), i, cp_stream_name(op->stream),
                         write ? "writes" : "reads", buf_names[k], p->units[u].name, p->units[v].name,
                         cp_op_kind_name(h->kind), o->acc_op[v][j][t][w], cp_stream_name(h->stream),
                         w ? "write" : "read", p->name);
                return -1;
            }
        }
    }
    return 0;
}

static void order_record(order_ctx *c, int i, const long *vc, int k, int write)
{
    const cp_op *op = &c->o->p->ops[i];
    int s = (int)op->stream;
    c->o->acc[op->unit][k][s][write] = vc[s];
    c->o->acc_op[op->unit][k][s][write] = i;
}

static int order_op(void *ctx, const cp_op *op)
{
    order_ctx *c = ctx;
    cp_order *o = c->o;
    const cp_plan *p = o->p;
    int i = (int)(op - p->ops), s = (int)op->stream;
    long gen = o->gen + c->step_start;
    long *vc = c->vc[s];
    if (c->prev >= 0 && c->prev != s) vc_max(vc, c->vc[c->prev]);
    for (int w = 0; w < op->wait_count; w++) {
        int ev = p->waits[op->wait_first + w];
        int mine = -1;
        for (int r = 0; r < c->nrec; r++) if (c->rec_ev[r] == ev) mine = r;
        if (mine >= 0) {
            vc_max(vc, c->rec_vc[mine]);
            continue;
        }
        if (ev < 0 || ev >= p->nevents || o->ev_gen[ev] != gen) {
            int by = -1;
            for (int j = 0; j < p->nops; j++) if (p->ops[j].event == ev) by = j;
            if (by >= 0)
                snprintf(c->out, c->n, "%s(%s) would issue its %s (op %d), which waits for op %d (%s of %s), not "
                         "issued yet in this step: on a GPU that wait orders nothing; make the call that issues op %d "
                         "first, in the order of plans/%s/SCHEDULE.md", c->call, p->units[c->unit].name,
                         cp_op_kind_name(op->kind), i, by, cp_op_kind_name(p->ops[by].kind), p->units[p->ops[by].unit].name,
                         by, p->name);
            else
                snprintf(c->out, c->n, "%s(%s): op %d waits for event slot %d, which no op records: regenerate the plan",
                         c->call, p->units[c->unit].name, i, ev);
            return -1;
        }
        vc_max(vc, o->ev_vc[ev]);
    }
    vc[s]++;
    const cp_op_desc *d = &cp_op_descs[op->kind];
    int in = op->kind == CP_OP_ALL_GATHER && op->from_sharded ? -1
             : op->kind == CP_OP_ALL_GATHER && op->post_forward ? (int)CP_BUF_POST_FORWARD : (int)d->in;
    int out = (int)d->out;
    if (in >= 0 && in < CP_ARENA_BUFFERS && order_access(c, i, vc, in, 0)) return -1;
    if (out >= 0 && out < CP_ARENA_BUFFERS && order_access(c, i, vc, out, 1)) return -1;
    if (op->event >= 0) {
        if (c->nrec == CP_ORDER_MAX_RECORDS) {
            snprintf(c->out, c->n, "%s(%s) records more than %d events in one call (op %d): the order check "
                     "cannot follow them; raise CP_ORDER_MAX_RECORDS in runtime/arena.c", c->call,
                     p->units[c->unit].name, CP_ORDER_MAX_RECORDS, i);
            return -1;
        }
        c->rec_ev[c->nrec] = op->event;
        memcpy(c->rec_vc[c->nrec++], vc, sizeof c->rec_vc[0]);
    }
    if (c->apply) {
        if (in >= 0 && in < CP_ARENA_BUFFERS) order_record(c, i, vc, in, 0);
        if (out >= 0 && out < CP_ARENA_BUFFERS) order_record(c, i, vc, out, 1);
        /* The caller's last use of what an op frees (a reshard: its forward
         * and backward; a pack: the backward's gradients) precedes it on
         * its stream: whoever reuses the bytes must come after it. */
        if ((int)d->frees >= 0 && (int)d->frees < CP_ARENA_BUFFERS) order_record(c, i, vc, (int)d->frees, 1);
        if (op->event >= 0 && op->event < p->nevents) {
            o->ev_gen[op->event] = gen;
            memcpy(o->ev_vc[op->event], vc, sizeof o->ev_vc[op->event]);
        }
        o->ran[i] = 1;
    }
    c->prev = s;
    return 0;
}

int cp_order_call(cp_order *o, const char *call, int unit, const cp_call_part *parts, int nparts, int flags, int apply,
                  char *out, size_t n)
{
    const cp_plan *p = o->p;
    cp_call_effect e[4];
    int first = -1, last = -1;
    unsigned opens = 0;
    if (nparts > 4) nparts = 4;
    for (int k = 0; k < nparts; k++) {
        cp_call_effect_of(p, unit, parts[k].kinds, parts[k].nkinds, parts[k].cursor, &e[k]);
        if (!e[k].ops) continue;
        if (first < 0) first = e[k].first;
        last = e[k].last;
        opens = (opens & ~e[k].closes) | e[k].opens;
    }
    if (first < 0) return 0;
    order_ctx c = { o, call, unit, flags, apply, -1, 0, cp_order_starts_step(o, first), { { 0 } }, 0, { 0 }, { { 0 } },
                    out, n };
    memcpy(c.vc, o->vc, sizeof c.vc);
    if (c.step_start || (flags & CP_ORDER_FORK)) /* the side streams start after the caller's stream */
        for (int s = CP_STREAM_COMPUTE + 1; s < S; s++) vc_max(c.vc[s], c.vc[CP_STREAM_COMPUTE]);
    if (apply && c.step_start) {
        o->gen++;
        memset(o->ran, 0, (size_t)p->nops);
        c.step_start = 0;
    }
    for (int k = 0; k < nparts; k++) {
        int cur = parts[k].cursor;
        if (e[k].ops && cp_run_call(p, unit, parts[k].kinds, parts[k].nkinds, &cur, order_op, &c) < 0) return -1;
    }
    if (flags & CP_ORDER_JOIN)
        for (int s = CP_STREAM_COMPUTE + 1; s < S; s++) vc_max(c.vc[CP_STREAM_COMPUTE], c.vc[s]);
    /* The buffers the caller uses after the call (an unshard's parameters,
     * the gradients its backward writes) are written on its stream. */
    unsigned opened = opens & ((1u << CP_BUF_UNSHARDED) | (1u << CP_BUF_GRADS));
    if (p->ops[last].stream == CP_STREAM_COMPUTE)
        for (int k = 0; k < CP_ARENA_BUFFERS; k++) {
            if (!(opened & (1u << k))) continue;
            if (order_access(&c, last, c.vc[CP_STREAM_COMPUTE], k, 1)) return -1;
            if (apply) order_record(&c, last, c.vc[CP_STREAM_COMPUTE], k, 1);
        }
    if (apply) {
        memcpy(o->vc, c.vc, sizeof o->vc);
        if (c.prev >= 0) memcpy(o->done_vc[unit], c.vc[c.prev], sizeof o->done_vc[unit]);
    }
    return 0;
}

void cp_call_effect_merge(cp_call_effect *a, const cp_call_effect *b)
{
    if (!b->ops) return;
    if (!a->ops) {
        *a = *b;
        return;
    }
    a->ops += b->ops;
    a->last = b->last;
    a->touches |= b->touches;
    a->writes |= b->writes;
    a->opens = (a->opens & ~b->closes) | b->opens;
    a->closes = (a->closes & ~b->opens) | b->closes;
}

void cp_order_wait_unit(cp_order *o, int unit)
{
    if (unit >= 0 && unit < o->p->nunits) vc_max(o->vc[CP_STREAM_COMPUTE], o->done_vc[unit]);
}

void cp_order_join(cp_order *o)
{
    for (int s = CP_STREAM_COMPUTE + 1; s < S; s++) vc_max(o->vc[CP_STREAM_COMPUTE], o->vc[s]);
}
#undef S
