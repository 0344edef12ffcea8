/* Host backend. Each collective: every member posts its buffer and op
 * signature, waits on the group's barrier, reads its peers' buffers, then
 * waits again so no one reuses a buffer a peer may still read. Members
 * whose signatures differ fail loudly instead of exchanging wrong data.
 * Point-to-point: a mailbox per (sender, receiver), first in first out; a
 * send queues a copy of its bytes and returns, a receive takes the head
 * of its peer's queue and refuses one that is not the message it names.
 * One job: the first rank that fails stops the world (cp_host_world_stop),
 * and every rank blocked in it, or blocking later, fails at once with that
 * rank's reason instead of waiting for a peer that will never come. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cp_simd.h"
#include "host.h"

/* A barrier a stopped job can leave (pthread_barrier_wait cannot be
 * interrupted): members arrive under the lock; the last one starts the
 * next generation and wakes the others. */
typedef struct {
    pthread_mutex_t lock;
    pthread_cond_t cv;
    unsigned size, arrived;
    unsigned long generation;
} host_barrier;

typedef struct {
    host_barrier barrier;
    const void **ptrs;      /* per member */
    const cp_op **sigs;     /* per member */
    void **slices;          /* per member: its share of an all-reduce's result */
    const int64_t **rows;   /* per member: the rows it sends each member (expert parallelism's all-to-all) */
} group_instance;

typedef struct {
    int ninstances;
    group_instance *inst;
} family_state;

/* One message in flight: the sender's op named by its tag and micro-step. */
typedef struct p2p_msg {
    struct p2p_msg *next;
    int tag, micro_step;
    long op; /* the sender's op index */
    size_t bytes;
    unsigned char data[];
} p2p_msg;

/* A receiver's mailboxes, one queue per sending pp coordinate. */
typedef struct {
    pthread_mutex_t lock;
    pthread_cond_t arrived;
    p2p_msg **head, **tail; /* [sender's pp coordinate] */
} p2p_inbox;

/* A receive of a group, run when the group ends (after its sends). */
typedef struct {
    const cp_op *op;
    void *buf;
    int peer;
} p2p_pending;

typedef struct {
    cp_host_world *world;
    cp_plan view; /* the rank's view (its class's tables) */
    int rank, shard_rank;
    /* Event slots: the step (fork count) in which each was last recorded.
     * Host work is synchronous, so a wait can only be wrong in one way:
     * waiting for a slot no earlier op of this step recorded, which on a
     * GPU silently orders nothing. The host refuses it. */
    long generation;
    long *recorded;
    cp_host_collective_cb cb; /* cp_host_backend_init_cb: collectives go there */
    void *cb_user;
    cp_host_alltoall_cb a2a_cb; /* cp_host_backend_set_alltoall: the all-to-alls, or NULL */
    void *a2a_user;
    /* Point-to-point: inside a group its receives wait for the group's end,
     * so the group's sends (which never block) are all posted first. */
    int in_group, npending, cap_pending;
    p2p_pending *pending;
    char err[1024]; /* the last failure (last_error) */
} rank_ctx;

struct cp_host_world {
    const cp_plan *plan;
    cp_arith arith; /* whose reduction arithmetic to emulate (gloo by default) */
    family_state *fam;
    rank_ctx *ranks;
    p2p_inbox *inbox;  /* per receiving rank; NULL without PP */
    double p2p_timeout_s; /* how long a receive waits for its message */
    double timeout_s;     /* how long a rendezvous waits for its members (0: for ever) */
    /* The job's first failure: set once (stop_lock), then read without it. */
    atomic_int stopped;
    pthread_mutex_t stop_lock;
    int stop_rank;
    char stop_why[1024];
};

static int barrier_init(host_barrier *b, unsigned size)
{
    memset(b, 0, sizeof *b);
    b->size = size;
    if (pthread_mutex_init(&b->lock, NULL) != 0) return -1;
    /* A monotonic deadline (the rendezvous timeout): a wall-clock jump neither ends nor stretches it. */
    pthread_condattr_t ca;
    int bad = pthread_condattr_init(&ca) != 0;
    if (!bad) {
        pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
        bad = pthread_cond_init(&b->cv, &ca) != 0;
        pthread_condattr_destroy(&ca);
    }
    if (bad) {
        pthread_mutex_destroy(&b->lock);
        return -1;
    }
    return 0;
}

static void barrier_destroy(host_barrier *b)
{
    pthread_cond_destroy(&b->cv);
    pthread_mutex_destroy(&b->lock);
}

/* 0 once every member arrived. Stoppable (the first barrier of an
 * exchange, where a member may never come): -1 when the job was stopped
 * before the generation completed; this member then withdraws, so no
 * member passes without all of them. The later barriers of an exchange
 * are not stoppable: every member is inside it and will arrive. */
static int barrier_wait(cp_host_world *w, host_barrier *b, int stoppable)
{
    struct timespec until;
    int timed = stoppable && w->timeout_s > 0, late = 0;
    if (timed) {
        clock_gettime(CLOCK_MONOTONIC, &until);
        until.tv_sec += (time_t)w->timeout_s;
        until.tv_nsec += (long)((w->timeout_s - (double)(time_t)w->timeout_s) * 1e9);
        if (until.tv_nsec >= 1000000000L) { until.tv_sec++; until.tv_nsec -= 1000000000L; }
    }
    pthread_mutex_lock(&b->lock);
    if (stoppable && atomic_load(&w->stopped)) {
        pthread_mutex_unlock(&b->lock);
        return -1;
    }
    unsigned long gen = b->generation;
    if (++b->arrived == b->size) {
        b->arrived = 0;
        b->generation++;
        pthread_cond_broadcast(&b->cv);
        pthread_mutex_unlock(&b->lock);
        return 0;
    }
    while (b->generation == gen && !(stoppable && atomic_load(&w->stopped)) && !late) {
        if (timed) late = pthread_cond_timedwait(&b->cv, &b->lock, &until) == ETIMEDOUT;
        else pthread_cond_wait(&b->cv, &b->lock);
    }
    int left = b->generation == gen;
    if (left) b->arrived--;
    pthread_mutex_unlock(&b->lock);
    return left ? (late && !atomic_load(&w->stopped) ? -2 : -1) : 0;
}

/* COMMPLAN_P2P_TIMEOUT (seconds) or 30: a receive that waits longer fails. */
static double default_p2p_timeout(void)
{
    const char *t = getenv("COMMPLAN_P2P_TIMEOUT");
    double s = t ? atof(t) : 0.0;
    return s > 0 ? s : 30.0;
}

static int inbox_init(p2p_inbox *in, int pp)
{
    in->head = calloc((size_t)pp, sizeof *in->head);
    in->tail = calloc((size_t)pp, sizeof *in->tail);
    if (!in->head || !in->tail) {
        free(in->head);
        free(in->tail);
        in->head = in->tail = NULL;
        return -1;
    }
    pthread_condattr_t ca;
    /* A monotonic deadline: a wall-clock jump neither ends nor stretches the wait. */
    if (pthread_condattr_init(&ca) != 0) return -1;
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    int bad = pthread_cond_init(&in->arrived, &ca) != 0;
    pthread_condattr_destroy(&ca);
    if (bad || pthread_mutex_init(&in->lock, NULL) != 0) {
        if (!bad) pthread_cond_destroy(&in->arrived);
        free(in->head);
        free(in->tail);
        in->head = in->tail = NULL;
        return -1;
    }
    return 0;
}

cp_host_world *cp_host_world_create(const cp_plan *p)
{
    cp_host_world *w = calloc(1, sizeof *w);
    if (!w) return NULL;
    w->plan = p;
    atomic_init(&w->stopped, 0);
    if (pthread_mutex_init(&w->stop_lock, NULL) != 0) { free(w); return NULL; }
    w->fam = calloc((size_t)p->nfamilies, sizeof *w->fam);
    w->ranks = calloc((size_t)p->world_size, sizeof *w->ranks);
    if (!w->fam || !w->ranks) { cp_host_world_destroy(w); return NULL; }
    for (int f = 0; f < p->nfamilies; f++) {
        int size = p->families[f].size;
        family_state *fs = &w->fam[f];
        fs->inst = calloc((size_t)(p->world_size / size), sizeof *fs->inst);
        if (!fs->inst) { cp_host_world_destroy(w); return NULL; }
        for (int i = 0; i < p->world_size / size; i++) {
            group_instance *g = &fs->inst[i];
            g->ptrs = calloc((size_t)size, sizeof *g->ptrs);
            g->sigs = calloc((size_t)size, sizeof *g->sigs);
            g->slices = calloc((size_t)size, sizeof *g->slices);
            g->rows = calloc((size_t)size, sizeof *g->rows);
            if (!g->ptrs || !g->sigs || !g->slices || !g->rows ||
                barrier_init(&g->barrier, (unsigned)size) != 0) {
                free(g->ptrs); free(g->sigs); free(g->slices); free(g->rows);
                g->ptrs = NULL; g->sigs = NULL; g->slices = NULL; g->rows = NULL;
                cp_host_world_destroy(w);
                return NULL;
            }
            fs->ninstances = i + 1;
        }
    }
    w->p2p_timeout_s = default_p2p_timeout();
    if (p->pp_size > 1) {
        if (!(w->inbox = calloc((size_t)p->world_size, sizeof *w->inbox))) { cp_host_world_destroy(w); return NULL; }
        for (int r = 0; r < p->world_size; r++)
            if (inbox_init(&w->inbox[r], p->pp_size) != 0) { cp_host_world_destroy(w); return NULL; }
    }
    for (int r = 0; r < p->world_size; r++) {
        rank_ctx *rc = &w->ranks[r];
        rc->world = w;
        cp_plan_view(p, r, &rc->view);
        rc->rank = r;
        rc->shard_rank = cp_shard_rank(p, r);
        rc->generation = 1;
        if (!(rc->recorded = calloc((size_t)(rc->view.nevents > 0 ? rc->view.nevents : 1), sizeof *rc->recorded))) {
            cp_host_world_destroy(w);
            return NULL;
        }
    }
    return w;
}

void cp_host_world_destroy(cp_host_world *w)
{
    if (!w) return;
    if (w->fam) {
        for (int f = 0; f < w->plan->nfamilies; f++) {
            family_state *fs = &w->fam[f];
            for (int i = 0; i < fs->ninstances; i++) {
                barrier_destroy(&fs->inst[i].barrier);
                free(fs->inst[i].ptrs);
                free(fs->inst[i].sigs);
                free(fs->inst[i].slices);
                free(fs->inst[i].rows);
            }
            free(fs->inst);
        }
    }
    free(w->fam);
    if (w->ranks)
        for (int r = 0; r < w->plan->world_size; r++) {
            free(w->ranks[r].recorded);
            free(w->ranks[r].pending);
        }
    free(w->ranks);
    /* Messages nobody received (a failed run) go with the world. */
    if (w->inbox)
        for (int r = 0; r < w->plan->world_size; r++) {
            p2p_inbox *in = &w->inbox[r];
            if (!in->head) continue;
            for (int q = 0; q < w->plan->pp_size; q++)
                for (p2p_msg *m = in->head[q], *next; m; m = next) {
                    next = m->next;
                    free(m);
                }
            free(in->head);
            free(in->tail);
            pthread_mutex_destroy(&in->lock);
            pthread_cond_destroy(&in->arrived);
        }
    free(w->inbox);
    pthread_mutex_destroy(&w->stop_lock);
    free(w);
}

int cp_host_world_stop(cp_host_world *w, int rank, const char *why)
{
    pthread_mutex_lock(&w->stop_lock);
    int first = !atomic_load(&w->stopped);
    if (first) {
        w->stop_rank = rank;
        snprintf(w->stop_why, sizeof w->stop_why, "%s", why && why[0] ? why : "(no reason given)");
        atomic_store(&w->stopped, 1);
    }
    pthread_mutex_unlock(&w->stop_lock);
    if (!first) return 0;
    /* Every rank's cursor, before the others leave their waits (COMMPLAN_CURSOR_DUMP; issue 40),
     * after a moment for ranks leaving a collective that completed to reach their next wait (the
     * job is stopped: a rendezvous then fails at once), so that no cursor is caught between the two. */
    if (cp_cursor_armed()) {
        struct timespec settle = { 0, 100000000L };
        nanosleep(&settle, NULL);
    }
    cp_cursor_dump(rank, strstr(w->stop_why, "timed out") || strstr(w->stop_why, "no message within") ? "timeout"
                                                                                                       : "failure",
                   w->stop_why);
    /* Wake every waiter: each checks the flag under its own lock, so one
     * that saw it unset is already waiting when this broadcast comes. */
    for (int f = 0; w->fam && f < w->plan->nfamilies; f++)
        for (int i = 0; i < w->fam[f].ninstances; i++) {
            host_barrier *b = &w->fam[f].inst[i].barrier;
            pthread_mutex_lock(&b->lock);
            pthread_cond_broadcast(&b->cv);
            pthread_mutex_unlock(&b->lock);
        }
    for (int r = 0; w->inbox && r < w->plan->world_size; r++) {
        p2p_inbox *in = &w->inbox[r];
        if (!in->head) continue;
        pthread_mutex_lock(&in->lock);
        pthread_cond_broadcast(&in->arrived);
        pthread_mutex_unlock(&in->lock);
    }
    return 1;
}

const char *cp_host_world_stopped(cp_host_world *w, int *rank)
{
    if (!atomic_load(&w->stopped)) return NULL;
    if (rank) *rank = w->stop_rank;
    return w->stop_why;
}

void cp_host_world_set_timeout(cp_host_world *w, double seconds) { w->timeout_s = seconds > 0 ? seconds : 0; }

void cp_host_world_set_p2p_timeout(cp_host_world *w, double seconds)
{
    w->p2p_timeout_s = seconds > 0 ? seconds : default_p2p_timeout();
}

static int p2p_error(rank_ctx *rc, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int p2p_error(rank_ctx *rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(rc->err, sizeof rc->err, fmt, ap);
    va_end(ap);
    return -1;
}

/* A rank stopped because another failed first: that rank and its reason. */
static int stopped_error(rank_ctx *rc)
{
    int first = -1;
    const char *why = cp_host_world_stopped(rc->world, &first);
    return p2p_error(rc, "rank %d: stopped: rank %d failed first: %s", rc->rank, first, why ? why : "?");
}

static cp_host_world *rc_world(cp_backend *b) { return ((rank_ctx *)b->ctx)->world; }

static cp_arith rc_arith(cp_backend *b) { return ((rank_ctx *)b->ctx)->world->arith; }

void cp_host_world_set_arith(cp_host_world *w, cp_arith a) { w->arith = a; }

/* Post, wait, check signatures. Returns the instance and this rank's key,
 * or NULL when the job stopped before every member came (nothing read). */
static long op_index(const rank_ctx *rc, const cp_op *op);
static group_instance *rendezvous(cp_backend *b, const cp_op *op, const void *ptr, int *key_out, int *size_out,
                                  int *bad)
{
    rank_ctx *rc = b->ctx;
    const cp_plan *p = rc->world->plan;
    int color, key;
    rc->err[0] = '\0';
    cp_group_of(p, op->family, rc->rank, &color, &key);
    group_instance *g = &rc->world->fam[op->family].inst[color];
    g->ptrs[key] = ptr;
    g->sigs[key] = op;
    int waited = barrier_wait(rc->world, &g->barrier, 1);
    if (waited == -2) {
        p2p_error(rc, "rank %d: %s on %s group %d (op %ld) timed out after %.3g s: a member did not come (a rank "
                  "behind, gone, or in another op; COMMPLAN_CURSOR_DUMP writes where each rank is)", rc->rank,
                  cp_op_kind_name(op->kind), p->families[op->family].name, color, op_index(rc, op),
                  rc->world->timeout_s);
        return NULL;
    }
    if (waited) {
        stopped_error(rc);
        return NULL;
    }
    int size = p->families[op->family].size;
    *bad = 0;
    for (int m = 0; m < size && !*bad; m++) {
        const cp_op *o = g->sigs[m];
        if (o->kind != op->kind || o->count != op->count || o->dtype != op->dtype || o->reduce_op != op->reduce_op)
            *bad = p2p_error(rc, "rank %d: %s on group %s disagrees with member %d (rank %d): %s count %ld; here "
                             "count %ld: the ranks' tables disagree; regenerate the plan", rc->rank,
                             cp_op_kind_name(op->kind), p->families[op->family].name, m,
                             cp_group_member(p, op->family, color, m), cp_op_kind_name(o->kind), (long)o->count,
                             (long)op->count) != 0;
    }
    *key_out = key;
    *size_out = size;
    return g;
}

static int host_all_gather(cp_backend *b, const cp_op *op, cp_stream s, const void *in, void *out)
{
    (void)s;
    int key, size, bad;
    group_instance *g = rendezvous(b, op, in, &key, &size, &bad);
    if (!g) return -1;
    size_t bytes = (size_t)op->count * cp_dtype_size(op->dtype);
    if (!bad)
        for (int m = 0; m < size; m++) {
            char *dst = (char *)out + (size_t)m * bytes;
            if (dst != g->ptrs[m]) memcpy(dst, g->ptrs[m], bytes);
        }
    barrier_wait(rc_world(b), &g->barrier, 0);
    return bad ? -1 : 0;
}

static int host_reduce_scatter(cp_backend *b, const cp_op *op, cp_stream s, const void *in, void *out)
{
    (void)s;
    int key, size, bad;
    group_instance *g = rendezvous(b, op, in, &key, &size, &bad);
    if (!g) return -1;
    if (!bad) {
        /* Runs of elements that share one chain: each a typed loop. */
        size_t es = cp_dtype_size(op->dtype);
        const void *in_at[size];
        int64_t end;
        for (int64_t i = 0; i < op->count && !bad; i = end) {
            int chain = cp_reduce_scatter_key_run(rc_arith(b), op->dtype, key, i, op->count, size, &end);
            for (int m = 0; m < size; m++) in_at[m] = (const char *)g->ptrs[m] + ((size_t)key * (size_t)op->count + (size_t)i) * es;
            if (cp_reduce_arith_n_pm(rc_arith(b), op->dtype, op->reduce_op, op->premul_factor, in_at, size, chain,
                                     end - i, (char *)out + (size_t)i * es)) {
                fprintf(stderr, "commplan: out of host memory in reduce_scatter\n");
                bad = 1;
            }
        }
    }
    barrier_wait(rc_world(b), &g->barrier, 0);
    return bad ? -1 : 0;
}

/* Each member reduces only its 1/size share of the elements (for all
 * members), then copies every member's share: O(size x count) work in all
 * rather than every member reducing everything (O(size^2 x count)). */
static int host_all_reduce(cp_backend *b, const cp_op *op, cp_stream s, const void *in, void *buf)
{
    (void)s;
    (void)in; /* in place: in == buf */
    int key, size, bad;
    group_instance *g = rendezvous(b, op, buf, &key, &size, &bad);
    if (!g) return -1;
    size_t es = cp_dtype_size(op->dtype);
    int64_t share = (op->count + size - 1) / size;
    int64_t lo = (int64_t)key * share < op->count ? (int64_t)key * share : op->count;
    int64_t hi = lo + share < op->count ? lo + share : op->count;
    void *mine = bad ? NULL : malloc((size_t)(hi - lo) * es + 1);
    if (!bad && !mine) {
        fprintf(stderr, "commplan: out of host memory in all_reduce\n");
        bad = 1;
    }
    if (!bad) {
        const void *in_at[size];
        int64_t end;
        for (int64_t i = lo; i < hi && !bad; i = end) {
            int chain = cp_all_reduce_key_run(rc_arith(b), op->dtype, i, op->count, size, &end);
            if (end > hi) end = hi;
            for (int m = 0; m < size; m++) in_at[m] = (const char *)g->ptrs[m] + (size_t)i * es;
            if (cp_reduce_arith_n_pm(rc_arith(b), op->dtype, op->reduce_op, op->premul_factor, in_at, size, chain,
                                     end - i, (char *)mine + (size_t)(i - lo) * es)) {
                fprintf(stderr, "commplan: out of host memory in all_reduce\n");
                bad = 1;
            }
        }
    }
    g->slices[key] = mine;
    /* Everyone has read every input (and posted its share) before anyone overwrites its own. */
    barrier_wait(rc_world(b), &g->barrier, 0);
    for (int m = 0; m < size && !bad; m++) {
        int64_t mlo = (int64_t)m * share < op->count ? (int64_t)m * share : op->count;
        int64_t mhi = mlo + share < op->count ? mlo + share : op->count;
        if (!g->slices[m]) { bad = 1; break; } /* that member failed: its signature said why */
        memcpy((char *)buf + (size_t)mlo * es, g->slices[m], (size_t)(mhi - mlo) * es);
    }
    /* No share is freed while a peer still copies it. */
    barrier_wait(rc_world(b), &g->barrier, 0);
    g->slices[key] = NULL;
    free(mine);
    return bad ? -1 : 0;
}

/* ---- collectives handed to the caller (cp_host_backend_init_cb) ---- */

static int cb_collective(cp_backend *b, int coll, const cp_op *op, const void *in, void *out)
{
    rank_ctx *rc = b->ctx;
    const cp_plan *p = rc->world->plan;
    int color, key;
    cp_group_of(p, op->family, rc->rank, &color, &key);
    int size = p->families[op->family].size, red = (int)op->reduce_op;
    if (op->reduce_op == CP_PREMUL_SUM) {
        /* The caller's library (torch.distributed on gloo) has no
         * PREMUL_SUM: this rank's input premultiplied in place (the
         * reduce-scatter's packed input, dead after it; an all-reduce's
         * buffer), rounded to the dtype, then a SUM, as gloo's arithmetic
         * here (cp_reduce_arith_pm). */
        int64_t n = op->count * (coll == CP_COLL_REDUCE_SCATTER ? size : 1);
        float blk[CP_BLOCK];
        blk[0] = (float)(1.0 / op->premul_factor);
        cp_round_n(op->dtype, blk, 1);
        float s = blk[0];
        for (int64_t i = 0; i < n; i += CP_BLOCK) {
            int64_t m = n - i < CP_BLOCK ? n - i : CP_BLOCK;
            void *at = (char *)in + (size_t)i * cp_dtype_size(op->dtype);
            cp_load_n(op->dtype, at, m, blk);
            for (int64_t j = 0; j < m; j++) blk[j] *= s;
            cp_store_n(op->dtype, at, m, blk); /* rounds each product to the dtype */
        }
        red = CP_SUM;
    }
    return rc->cb(rc->cb_user, coll, op->family, color, key, size, (void *)in, out, op->count, (int)op->dtype, red);
}

static int cb_all_gather(cp_backend *b, const cp_op *op, cp_stream s, const void *in, void *out)
{
    (void)s;
    return cb_collective(b, CP_COLL_ALL_GATHER, op, in, out);
}

static int cb_reduce_scatter(cp_backend *b, const cp_op *op, cp_stream s, const void *in, void *out)
{
    (void)s;
    return cb_collective(b, CP_COLL_REDUCE_SCATTER, op, in, out);
}

static int cb_all_reduce(cp_backend *b, const cp_op *op, cp_stream s, const void *in, void *out)
{
    (void)s;
    return cb_collective(b, CP_COLL_ALL_REDUCE, op, in, out);
}

/* ---- point-to-point: mailboxes per (sender, receiver) ---- */

static long op_index(const rank_ctx *rc, const cp_op *op)
{
    long x = (long)(op - rc->view.ops);
    return x >= 0 && x < rc->view.nops ? x : -1;
}

/* The peer's pp coordinate, or -1 where peer_rank is not a pp peer of rc's rank. */
static int pp_peer_coord(const rank_ctx *rc, int peer_rank)
{
    const cp_plan *p = rc->world->plan;
    if (!rc->world->inbox || peer_rank < 0 || peer_rank >= p->world_size || peer_rank == rc->rank) return -1;
    int c = cp_pp_rank(p, peer_rank);
    return cp_pp_peer_rank(p, rc->rank, c) == peer_rank ? c : -1;
}

/* Buffered: a copy of the bytes joins the peer's queue from this rank. */
static int host_send(cp_backend *b, const cp_op *op, cp_stream s, const void *buf, int peer_rank)
{
    rank_ctx *rc = b->ctx;
    (void)s;
    rc->err[0] = '\0';
    int me = cp_pp_rank(rc->world->plan, rc->rank);
    if (pp_peer_coord(rc, peer_rank) < 0)
        return p2p_error(rc, "rank %d: send of tag %d (op %ld) to rank %d, which is not a pipeline peer of this rank",
                         rc->rank, op->tag, op_index(rc, op), peer_rank);
    size_t bytes = (size_t)op->count * cp_dtype_size(op->dtype);
    p2p_msg *m = malloc(sizeof *m + (bytes ? bytes : 1));
    if (!m) return p2p_error(rc, "rank %d: out of host memory queueing a %zu-byte message", rc->rank, bytes);
    m->next = NULL;
    m->tag = op->tag;
    m->micro_step = op->micro_step;
    m->op = op_index(rc, op);
    m->bytes = bytes;
    memcpy(m->data, buf, bytes);
    p2p_inbox *in = &rc->world->inbox[peer_rank];
    pthread_mutex_lock(&in->lock);
    if (in->tail[me]) in->tail[me]->next = m;
    else in->head[me] = m;
    in->tail[me] = m;
    pthread_cond_broadcast(&in->arrived);
    pthread_mutex_unlock(&in->lock);
    return 0;
}

/* Waits for the head of peer -> me and takes it if it is op's message. */
static int recv_now(rank_ctx *rc, const cp_op *op, void *buf, int peer_rank)
{
    int from = pp_peer_coord(rc, peer_rank);
    long x = op_index(rc, op);
    if (from < 0)
        return p2p_error(rc, "rank %d: recv of tag %d (op %ld) from rank %d, which is not a pipeline peer of this rank",
                         rc->rank, op->tag, x, peer_rank);
    size_t bytes = (size_t)op->count * cp_dtype_size(op->dtype);
    double limit = rc->world->p2p_timeout_s;
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    until.tv_sec += (time_t)limit;
    until.tv_nsec += (long)((limit - (double)(time_t)limit) * 1e9);
    if (until.tv_nsec >= 1000000000L) { until.tv_sec++; until.tv_nsec -= 1000000000L; }
    p2p_inbox *in = &rc->world->inbox[rc->rank];
    pthread_mutex_lock(&in->lock);
    int late = 0;
    /* A stopped job ends the wait at once: the sender may be the rank that failed. */
    while (!in->head[from] && !late && !atomic_load(&rc->world->stopped))
        late = pthread_cond_timedwait(&in->arrived, &in->lock, &until) == ETIMEDOUT;
    p2p_msg *m = in->head[from];
    if (atomic_load(&rc->world->stopped)) {
        pthread_mutex_unlock(&in->lock); /* a message left queued: the world frees it */
        return stopped_error(rc);
    }
    if (!m) {
        pthread_mutex_unlock(&in->lock);
        return p2p_error(rc, "rank %d: recv of tag %d micro %d (op %ld) from rank %d: no message within %.3g s (rank %d "
                         "never sent it: the two ranks' tables disagree, or it failed; COMMPLAN_P2P_TIMEOUT sets the "
                         "limit)", rc->rank, op->tag, op->micro_step, x, peer_rank, limit, peer_rank);
    }
    if (m->tag != op->tag || m->micro_step != op->micro_step || m->bytes != bytes) {
        int tag = m->tag, micro = m->micro_step;
        size_t got = m->bytes;
        long sent_by = m->op;
        pthread_mutex_unlock(&in->lock); /* left queued: the world frees it */
        return p2p_error(rc, "rank %d: recv of tag %d micro %d (op %ld) from rank %d got tag %d micro %d (%zu bytes, "
                         "%zu expected; its op %ld): the two ranks' tables disagree; regenerate the plan", rc->rank,
                         op->tag, op->micro_step, x, peer_rank, tag, micro, got, bytes, sent_by);
    }
    in->head[from] = m->next;
    if (!m->next) in->tail[from] = NULL;
    pthread_mutex_unlock(&in->lock);
    memcpy(buf, m->data, bytes);
    free(m);
    return 0;
}

static int host_recv(cp_backend *b, const cp_op *op, cp_stream s, void *buf, int peer_rank)
{
    rank_ctx *rc = b->ctx;
    (void)s;
    rc->err[0] = '\0';
    if (!rc->in_group) return recv_now(rc, op, buf, peer_rank);
    if (rc->npending == rc->cap_pending) {
        int cap = rc->cap_pending ? 2 * rc->cap_pending : 8;
        p2p_pending *more = realloc(rc->pending, (size_t)cap * sizeof *more);
        if (!more) return p2p_error(rc, "rank %d: out of host memory for a group's receives", rc->rank);
        rc->pending = more;
        rc->cap_pending = cap;
    }
    rc->pending[rc->npending++] = (p2p_pending){ op, buf, peer_rank };
    return 0;
}

static int host_group_start(cp_backend *b)
{
    rank_ctx *rc = b->ctx;
    rc->err[0] = '\0';
    if (rc->in_group) return p2p_error(rc, "rank %d: a group opened inside another", rc->rank);
    rc->in_group = 1;
    rc->npending = 0;
    return 0;
}

/* The group's receives, in issue order, once all its sends are queued. */
static int host_group_end(cp_backend *b)
{
    rank_ctx *rc = b->ctx;
    rc->err[0] = '\0';
    if (!rc->in_group) return p2p_error(rc, "rank %d: a group closed that was never opened", rc->rank);
    rc->in_group = 0;
    int n = rc->npending;
    rc->npending = 0;
    for (int i = 0; i < n; i++)
        if (recv_now(rc, rc->pending[i].op, rc->pending[i].buf, rc->pending[i].peer)) return -1;
    return 0;
}

/* ---- expert parallelism's all-to-alls: a rendezvous like the collectives ---- */

/* The members' a2a fields agree (the rendezvous compared kind, count and dtype). */
static int a2a_agree(rank_ctx *rc, group_instance *g, const cp_op *op, int size)
{
    for (int m = 0; m < size; m++) {
        const cp_op *o = g->sigs[m];
        if (o->a2a_experts != op->a2a_experts || o->a2a_dim != op->a2a_dim || o->a2a_capacity != op->a2a_capacity ||
            (op->kind == CP_OP_A2A && o->a2a_combine != op->a2a_combine))
            return p2p_error(rc, "rank %d: %s (op %ld) disagrees with ep member %d's (%d experts per member, row %lld, "
                             "capacity %lld, combine %d; here %d, %lld, %lld, %d): regenerate the plan", rc->rank,
                             cp_op_kind_name(op->kind), op_index(rc, op), m, o->a2a_experts, (long long)o->a2a_dim,
                             (long long)o->a2a_capacity, o->a2a_combine, op->a2a_experts, (long long)op->a2a_dim,
                             (long long)op->a2a_capacity, op->a2a_combine);
    }
    return 0;
}

static int host_a2a_counts(cp_backend *b, const cp_op *op, cp_stream s, const void *in, void *out)
{
    rank_ctx *rc = b->ctx;
    (void)s;
    rc->err[0] = '\0';
    int key, size, bad;
    group_instance *g = rendezvous(b, op, in, &key, &size, &bad);
    if (!g) return -1;
    if (!bad) bad = a2a_agree(rc, g, op, size) != 0;
    size_t share = (size_t)op->a2a_experts;
    if (!bad) /* member m's counts for this rank's experts */
        for (int m = 0; m < size; m++)
            memcpy((int64_t *)out + (size_t)m * share, (const int64_t *)g->ptrs[m] + (size_t)key * share,
                   share * sizeof(int64_t));
    barrier_wait(rc_world(b), &g->barrier, 0);
    return bad ? -1 : 0;
}

static int host_a2a(cp_backend *b, const cp_op *op, cp_stream s, const void *in, void *out, const int64_t *send_rows,
                    const int64_t *recv_rows)
{
    rank_ctx *rc = b->ctx;
    (void)s;
    rc->err[0] = '\0';
    const cp_plan *p = rc->world->plan;
    int color, key0;
    cp_group_of(p, op->family, rc->rank, &color, &key0);
    rc->world->fam[op->family].inst[color].rows[key0] = send_rows; /* posted before the rendezvous' barrier */
    int key, size, bad;
    group_instance *g = rendezvous(b, op, in, &key, &size, &bad);
    if (!g) return -1;
    if (!bad) bad = a2a_agree(rc, g, op, size) != 0;
    /* What each member sends this rank must be what this rank's counts say it receives. */
    for (int m = 0; m < size && !bad; m++)
        if (g->rows[m][key] != recv_rows[m])
            bad = p2p_error(rc, "rank %d: a2a (op %ld) expects %lld rows from ep member %d, which sends %lld: the "
                            "counts all-to-all and the tokens' disagree", rc->rank, op_index(rc, op),
                            (long long)recv_rows[m], m, (long long)g->rows[m][key]) != 0;
    size_t row = (size_t)op->a2a_dim * cp_dtype_size(op->dtype), at = 0;
    for (int m = 0; m < size && !bad; m++) {
        size_t from = 0; /* this rank's rows in member m's packed input */
        for (int j = 0; j < key; j++) from += (size_t)g->rows[m][j];
        memcpy((char *)out + at * row, (const char *)g->ptrs[m] + from * row, (size_t)recv_rows[m] * row);
        at += (size_t)recv_rows[m];
    }
    barrier_wait(rc_world(b), &g->barrier, 0);
    return bad ? -1 : 0;
}

/* The host library hands its collectives to the caller: the all-to-alls
 * too once it has given an all-to-all callback (cp_host_backend_set_alltoall),
 * as torch's all_to_all_single takes them: rows packed back to back per
 * member. The counts are one row of a2a_experts int64 per member. */
static int cb_no_a2a(cp_backend *b, const cp_op *op)
{
    return p2p_error(b->ctx, "rank %d: %s (op %ld): this backend hands its collectives to a callback and was given no "
                     "all-to-all for expert parallelism's tokens (cp_hostlib_set_alltoall; --ranks has none: run "
                     "--simulate of every rank together, or NCCL)", ((rank_ctx *)b->ctx)->rank,
                     cp_op_kind_name(op->kind), op_index(b->ctx, op));
}

static int cb_alltoall(cp_backend *b, const cp_op *op, const void *in, void *out, const int64_t *send_rows,
                       const int64_t *recv_rows, int64_t row_bytes)
{
    rank_ctx *rc = b->ctx;
    rc->err[0] = '\0';
    if (!rc->a2a_cb) return cb_no_a2a(b, op);
    const cp_plan *p = rc->world->plan;
    int color, key;
    cp_group_of(p, op->family, rc->rank, &color, &key);
    return rc->a2a_cb(rc->a2a_user, op->family, color, key, p->families[op->family].size, in, out, send_rows,
                      recv_rows, row_bytes);
}

static int cb_a2a_counts(cp_backend *b, const cp_op *op, cp_stream s, const void *in, void *out)
{
    (void)s;
    int size = ((rank_ctx *)b->ctx)->world->plan->families[op->family].size;
    int64_t *ones = malloc((size_t)size * sizeof *ones);
    if (!ones)
        return p2p_error(b->ctx, "rank %d: a2a_counts (op %ld): out of host memory", ((rank_ctx *)b->ctx)->rank,
                         op_index(b->ctx, op));
    for (int m = 0; m < size; m++) ones[m] = 1;
    int rc = cb_alltoall(b, op, in, out, ones, ones, (int64_t)op->a2a_experts * (int64_t)sizeof(int64_t));
    free(ones);
    return rc;
}

static int cb_a2a(cp_backend *b, const cp_op *op, cp_stream s, const void *in, void *out, const int64_t *send_rows,
                  const int64_t *recv_rows)
{
    (void)s;
    return cb_alltoall(b, op, in, out, send_rows, recv_rows, op->a2a_dim * (int64_t)cp_dtype_size(op->dtype));
}

/* This rank failed: the whole job stops with the first such reason. */
static void host_abort(cp_backend *b, const char *why)
{
    rank_ctx *rc = b->ctx;
    cp_host_world_stop(rc->world, rc->rank, why);
}

static const char *host_last_error(cp_backend *b)
{
    rank_ctx *rc = b->ctx;
    return rc->err;
}

/* ---- copies: the C reference of the generated copy kernels ---- */

static char *at(void *base, int64_t i, cp_dtype t) { return (char *)base + (size_t)i * cp_dtype_size(t); }

/* sharded (total, orig dtype) -> this rank's slot of the all-gather buffer, cast. */
static void copy_in(const cp_plan *p, int u, int pf, int pc, int shard_rank, const void *sharded, void *ag)
{
    const cp_unit *U = &p->units[u];
    (void)pf;
    (void)pc;
    if (U->ag_bytes > 0) { /* mixed all-gather dtypes: each shard cast to its own at its byte offset */
        char *slot = (char *)ag + (size_t)shard_rank * (size_t)U->ag_bytes;
        for (int j = 0; j < U->nparams; j++) {
            const cp_param *prm = &p->params[U->first_param + j];
            cp_convert_n(prm->ag_dtype, slot + prm->ag_offset, U->orig_dtype, at((void *)sharded, prm->offset, U->orig_dtype),
                         prm->padded);
        }
        return;
    }
    void *slot = at(ag, (int64_t)shard_rank * U->total, U->ag_dtype);
    cp_convert_n(U->ag_dtype, slot, U->orig_dtype, sharded, U->total); /* a memcpy when the dtype stays */
}

/* (W, total) all-gather output -> each parameter's (outer, W*run) buffer. */
static void copy_out(const cp_plan *p, int u, int pf, int pc, int shard_rank, const void *ag, void *unsharded)
{
    const cp_unit *U = &p->units[u];
    (void)pf;
    (void)pc;
    int64_t W = cp_unit_shard_size(p, u);
    /* By bytes: a unit of mixed all-gather dtypes has each parameter in its
     * own at its byte offset of a rank's slot (ag_bytes per rank), as
     * FSDP2's copy-out views the uint8 output (_copy_all_gather_outputs). */
    int64_t slot = cp_unit_ag_bytes(U);
    (void)shard_rank;
    for (int j = 0; j < U->nparams; j++) {
        const cp_param *prm = &p->params[U->first_param + j];
        size_t es = cp_dtype_size(cp_param_ag_dtype(U, prm));
        int64_t off = cp_param_ag_offset(U, prm);
        char *dst = (char *)unsharded + cp_param_unsharded_offset(U, prm, W);
        if (prm->outer == 1) { /* rows in rank order already: one copy per rank */
            for (int64_t r = 0; r < W; r++)
                memcpy(dst + (size_t)(r * prm->run) * es, (const char *)ag + (size_t)(r * slot + off),
                       (size_t)prm->run * es);
            continue;
        }
        for (int64_t r = 0; r < W; r++)
            for (int64_t o = 0; o < prm->outer; o++)
                memcpy(dst + (size_t)(o * W * prm->run + r * prm->run) * es,
                       (const char *)ag + (size_t)(r * slot + off) + (size_t)(o * prm->run) * es,
                       (size_t)prm->run * es);
    }
}

/* x / d in double, rounded to float: FSDP2's divides as the reference wrote them. */
CP_HOT static void divide_n(float *restrict v, int64_t n, double d)
{
    CP_LOOP(n, v[j] = (float)(v[j] / d));
}

/* chunk_cat: unsharded grads (grad dtype) -> (W, total) reduce-scatter
 * input, zero padding; cast to the reduce dtype first, then the pre-divide
 * in it, as FSDP2's foreach_reduce does (the copy-in casts,
 * _div_if_needed's div_ rounds to the reduce dtype). Each run in blocks:
 * load, round to the reduce dtype, divide, store (rounding again). */
static void pack(const cp_plan *p, int u, int pf, int pc, int shard_rank, const void *grads, void *rs_in)
{
    const cp_unit *U = &p->units[u];
    int64_t W = cp_unit_shard_size(p, u);
    size_t ges = cp_dtype_size(U->grad_dtype), res = cp_dtype_size(U->reduce_dtype);
    int plain = U->grad_dtype == CP_FP32 && U->reduce_dtype == CP_FP32 && U->pre_divide == 1.0;
    /* A part (foreach_reduce over the parameters with a gradient): its
     * parameters only, each rank's row its total elements, offsets from its first. */
    int64_t total = cp_part_total(p, u, pf, pc), base = cp_part_offset(p, u, pf, pc);
    int j0 = pc > 0 ? pf : 0, j1 = pc > 0 ? pf + pc : U->nparams;
    float buf[CP_BLOCK];
    (void)shard_rank;
    for (int j = j0; j < j1; j++) {
        const cp_param *prm = &p->params[U->first_param + j];
        if (prm->frozen) continue; /* (no gradient: FSDP2 packs the ones it has) */
        const char *g = (const char *)grads + (size_t)prm->grad_offset * ges;
        for (int64_t r = 0; r < W; r++)
            for (int64_t o = 0; o < prm->outer; o++) {
                int64_t src = o * W * prm->run + r * prm->run;
                int64_t dst = r * total + cp_param_rs_offset(U, prm) - base + o * prm->run;
                int64_t real = prm->numel - src < 0 ? 0 : prm->numel - src < prm->run ? prm->numel - src : prm->run;
                char *out = (char *)rs_in + (size_t)dst * res;
                if (plain) { /* fp32 to fp32 undivided: the bits stay */
                    memcpy(out, g + (size_t)src * ges, (size_t)real * res);
                    memset(out + (size_t)real * res, 0, (size_t)(prm->run - real) * res);
                    continue;
                }
                for (int64_t t = 0; t < prm->run; t += CP_BLOCK) {
                    int64_t n = prm->run - t < CP_BLOCK ? prm->run - t : CP_BLOCK;
                    int64_t have = real - t < 0 ? 0 : real - t < n ? real - t : n;
                    cp_load_n(U->grad_dtype, g + (size_t)(src + t) * ges, have, buf);
                    for (int64_t i = have; i < n; i++) buf[i] = 0.0f;
                    cp_round_n(U->reduce_dtype, buf, n);
                    if (U->pre_divide != 1.0) divide_n(buf, n, U->pre_divide);
                    cp_store_n(U->reduce_dtype, out + (size_t)t * res, n, buf);
                }
            }
    }
}

/* reduce-scatter output (reduce dtype) -> sharded grads (orig dtype): the
 * post-divide in the reduce dtype (rounded to it), then the cast, as
 * FSDP2's foreach_reduce does. */
static void view_out(const cp_plan *p, int u, int pf, int pc, int shard_rank, const void *rs_out, void *sharded_grads)
{
    const cp_unit *U = &p->units[u];
    size_t res = cp_dtype_size(U->reduce_dtype), oes = cp_dtype_size(U->orig_dtype);
    /* a part: its total elements, into the sharded grads at its offset */
    int64_t total = cp_part_total(p, u, pf, pc);
    sharded_grads = (char *)sharded_grads + (size_t)cp_part_offset(p, u, pf, pc) * oes;
    float buf[CP_BLOCK];
    (void)shard_rank;
    if (U->post_divide == 1.0 && U->reduce_dtype == CP_FP32) {
        cp_convert_n(U->orig_dtype, sharded_grads, CP_FP32, rs_out, total);
        return;
    }
    for (int64_t i = 0; i < total; i += CP_BLOCK) {
        int64_t n = total - i < CP_BLOCK ? total - i : CP_BLOCK;
        cp_load_n(U->reduce_dtype, (const char *)rs_out + (size_t)i * res, n, buf);
        if (U->post_divide != 1.0) {
            divide_n(buf, n, U->post_divide);
            cp_round_n(U->reduce_dtype, buf, n);
        }
        cp_store_n(U->orig_dtype, (char *)sharded_grads + (size_t)i * oes, n, buf);
    }
}

/* A later reduction of the step: the view-out's value added into the
 * sharded grads in their dtype, as FSDP2's sharded_param.grad += new_sharded_grad
 * (the new grad cast to the parameter's dtype first). */
static void view_out_add(const cp_plan *p, int u, int pf, int pc, int shard_rank, const void *rs_out,
                         void *sharded_grads)
{
    const cp_unit *U = &p->units[u];
    size_t res = cp_dtype_size(U->reduce_dtype), oes = cp_dtype_size(U->orig_dtype);
    int64_t total = cp_part_total(p, u, pf, pc);
    sharded_grads = (char *)sharded_grads + (size_t)cp_part_offset(p, u, pf, pc) * oes;
    float buf[CP_BLOCK], cur[CP_BLOCK];
    (void)shard_rank;
    for (int64_t i = 0; i < total; i += CP_BLOCK) {
        int64_t n = total - i < CP_BLOCK ? total - i : CP_BLOCK;
        char *sg = (char *)sharded_grads + (size_t)i * oes;
        cp_load_n(U->reduce_dtype, (const char *)rs_out + (size_t)i * res, n, buf);
        if (U->post_divide != 1.0) {
            divide_n(buf, n, U->post_divide);
            cp_round_n(U->reduce_dtype, buf, n);
        }
        cp_round_n(U->orig_dtype, buf, n);
        cp_load_n(U->orig_dtype, sg, n, cur);
        for (int64_t k = 0; k < n; k++) cur[k] += buf[k];
        cp_store_n(U->orig_dtype, sg, n, cur);
    }
}

/* all_reduce_last's partial sums (FSDP2's partial_reduce_output): total
 * elements of the reduce dtype, copied bit for bit, or added into out with
 * one rounding to the reduce dtype (torch's += on two tensors of it). */
static void flat_copy(const cp_plan *p, int u, int pf, int pc, int shard_rank, const void *in, void *out)
{
    const cp_unit *U = &p->units[u];
    (void)pf;
    (void)pc;
    (void)shard_rank;
    memcpy(out, in, (size_t)cp_unit_rs_total(U) * cp_dtype_size(U->reduce_dtype));
}

static void flat_add(const cp_plan *p, int u, int pf, int pc, int shard_rank, const void *in, void *out)
{
    const cp_unit *U = &p->units[u];
    size_t es = cp_dtype_size(U->reduce_dtype);
    float a[CP_BLOCK], x[CP_BLOCK];
    (void)pf;
    (void)pc;
    (void)shard_rank;
    int64_t total = cp_unit_rs_total(U);
    for (int64_t i = 0; i < total; i += CP_BLOCK) {
        int64_t n = total - i < CP_BLOCK ? total - i : CP_BLOCK;
        cp_load_n(U->reduce_dtype, (const char *)out + (size_t)i * es, n, a);
        cp_load_n(U->reduce_dtype, (const char *)in + (size_t)i * es, n, x);
        for (int64_t k = 0; k < n; k++) a[k] += x[k];
        cp_store_n(U->reduce_dtype, (char *)out + (size_t)i * es, n, a);
    }
}

/* Indexed by kernel number (cp_gpu_kernels.h: copy-in, copy-out, pack, view-out, view-out adding, flat copy,
 * flat add). */
#define HOST_KERNELS 7
static void (*const HOST_COPIES[HOST_KERNELS])(const cp_plan *, int, int, int, int, const void *, void *) = {
    copy_in, copy_out, pack, view_out, view_out_add, flat_copy, flat_add
};

static int host_copy(cp_backend *b, int kernel, int unit, int part_first, int part_count, cp_stream s, const void *in,
                     void *out)
{
    rank_ctx *rc = b->ctx;
    (void)s;
    if (kernel < 0 || kernel >= HOST_KERNELS || cp_part_check(&rc->view, unit, part_first, part_count)) return -1;
    HOST_COPIES[kernel](&rc->view, unit, part_first, part_count, cp_unit_shard_rank(&rc->view, unit, rc->rank), in,
                        out);
    return 0;
}

static int host_copy_bytes(cp_backend *b, cp_stream s, const void *in, void *out, size_t bytes)
{
    (void)b;
    (void)s;
    memmove(out, in, bytes);
    return 0;
}

/* ---- memory, events, streams: host work is synchronous ---- */

static void *host_alloc(cp_backend *b, size_t bytes)
{
    (void)b;
    /* Poisoned, not zeroed: nothing may read a buffer before its first writer. */
    void *p = malloc(bytes ? bytes : 1);
    if (p) memset(p, CP_POISON_BYTE, bytes);
    return p;
}

static void host_free(cp_backend *b, void *p)
{
    (void)b;
    free(p);
}

static int host_record(cp_backend *b, cp_stream s, int event)
{
    rank_ctx *rc = b->ctx;
    (void)s;
    if (event < 0 || event >= rc->view.nevents) {
        fprintf(stderr, "commplan: rank %d: event slot %d is outside the plan's %d\n", rc->rank, event,
                rc->view.nevents);
        return -1;
    }
    rc->recorded[event] = rc->generation;
    return 0;
}

static int host_wait(cp_backend *b, cp_stream s, int event)
{
    rank_ctx *rc = b->ctx;
    if (event < 0 || event >= rc->view.nevents || rc->recorded[event] != rc->generation) {
        fprintf(stderr, "commplan: rank %d: the %s stream waits for event slot %d, which no earlier op of this step "
                "recorded (on a GPU that wait orders nothing): regenerate the plan\n", rc->rank, cp_stream_name(s),
                event);
        return -1;
    }
    return 0;
}

static int host_fork(cp_backend *b)
{
    rank_ctx *rc = b->ctx;
    rc->generation++;
    return 0;
}

static int host_join(cp_backend *b)
{
    (void)b;
    return 0;
}

static int host_release(cp_backend *b, void *p, size_t bytes)
{
    (void)b;
    memset(p, CP_POISON_BYTE, bytes);
    return 0;
}

static int host_read(cp_backend *b, cp_stream s, const void *src, void *host, size_t bytes)
{
    (void)b;
    (void)s;
    memcpy(host, src, bytes);
    return 0;
}

static int host_write(cp_backend *b, cp_stream s, void *dst, const void *host, size_t bytes)
{
    (void)b;
    (void)s;
    memcpy(dst, host, bytes);
    return 0;
}

static void *host_ptr(cp_backend *b, void *p)
{
    (void)b;
    return p;
}

void cp_host_backend_init(cp_backend *b, cp_host_world *w, int rank)
{
    memset(b, 0, sizeof *b);
    b->ctx = &w->ranks[rank];
    b->alloc = host_alloc;
    b->free = host_free;
    b->copy = host_copy;
    b->copy_bytes = host_copy_bytes;
    b->collective[CP_COLL_ALL_GATHER] = host_all_gather;
    b->collective[CP_COLL_REDUCE_SCATTER] = host_reduce_scatter;
    b->collective[CP_COLL_ALL_REDUCE] = host_all_reduce;
    b->record = host_record;
    b->wait = host_wait;
    b->fork = host_fork;
    b->join = host_join;
    b->release = host_release;
    b->read = host_read;
    b->write = host_write;
    b->host_ptr = host_ptr;
    b->send = host_send;
    b->recv = host_recv;
    b->group_start = host_group_start;
    b->group_end = host_group_end;
    b->a2a_counts = host_a2a_counts;
    b->a2a = host_a2a;
    b->last_error = host_last_error;
    b->abort = host_abort;
}

void cp_host_backend_init_cb(cp_backend *b, cp_host_world *w, int rank, cp_host_collective_cb cb, void *user)
{
    cp_host_backend_init(b, w, rank);
    w->ranks[rank].cb = cb;
    w->ranks[rank].cb_user = user;
    b->collective[CP_COLL_ALL_GATHER] = cb_all_gather;
    b->collective[CP_COLL_REDUCE_SCATTER] = cb_reduce_scatter;
    b->collective[CP_COLL_ALL_REDUCE] = cb_all_reduce;
    b->a2a_counts = cb_a2a_counts;
    b->a2a = cb_a2a;
}

void cp_host_backend_set_alltoall(cp_backend *b, cp_host_alltoall_cb cb, void *user)
{
    rank_ctx *rc = b->ctx;
    rc->a2a_cb = cb;
    rc->a2a_user = user;
}
