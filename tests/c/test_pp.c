/* cmocka tests for pipeline parallelism's runtime half: hand-written tables
 * of 2- and 4-stage pipelines (the pp mesh dim only) run on the host
 * backend, every rank a thread, every message written and checked by the
 * harness; a receive that disagrees with its sender, a receive nobody
 * sends, a corrupted message, and the executor's group bracketing of
 * batches (counted by a fake backend). */
#define _GNU_SOURCE /* pthread_timedjoin_np (bounded.h) */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "commplan.h"
#include "cp_hostlib.h"
#include "harness.h"
#include "host.h"
#include "simulate.h"
#include "bounded.h"

/* ---- hand-written tables ---- */

#define MAX_STAGES 4
#define MAX_OPS 64

typedef struct {
    cp_plan plan;
    cp_group_family family;
    cp_class classes[MAX_STAGES];
    int class_of[MAX_STAGES];
    cp_unit units[MAX_STAGES][2];
    char unit_names[MAX_STAGES][2][32];
    cp_op ops[MAX_STAGES][MAX_OPS];
    int waits[MAX_STAGES][4];
} pp_tables;

/* One stage's ops as they are written down. */
typedef struct {
    pp_tables *t;
    int stage, n;
    cp_dtype dtype;
    int64_t count;
} stage_ops;

static cp_op *add(stage_ops *s, cp_op_kind kind, int unit, int peer, int tag, int micro, int batch)
{
    assert_true(s->n < MAX_OPS);
    cp_op *o = &s->t->ops[s->stage][s->n++];
    *o = (cp_op){ .kind = kind, .unit = unit, .family = 0, .stream = CP_STREAM_COMPUTE, .dtype = s->dtype,
                  .count = s->count, .reduce_op = CP_SUM, .micro_step = micro, .event = -1, .peer = peer,
                  .batch = batch, .tag = tag };
    return o;
}

/* The plan's frame: a world of `stages` ranks on one mesh dim "pp", one
 * family over it, micro_steps micro-batches; stage s's class holds its
 * own units (two where two_units names it: the first receives the
 * activations, the last sends them on). */
static void frame(pp_tables *t, const char *name, int stages, int micro_steps, cp_dtype dtype, int64_t pp_numel,
                  unsigned two_units)
{
    memset(t, 0, sizeof *t);
    t->family = (cp_group_family){ .name = "pp", .axis_mask = 0x1u, .size = stages };
    cp_plan *p = &t->plan;
    p->name = name;
    p->fingerprint = "0000000000000000";
    p->world_size = stages;
    p->mesh_ndim = 1;
    p->mesh_names[0] = "pp";
    p->mesh_sizes[0] = stages;
    p->shard_size = p->replicate_size = 1;
    p->shard_family = p->replicate_family = -1;
    p->micro_steps = micro_steps;
    p->nfamilies = 1;
    p->families = &t->family;
    p->tp_size = 1;
    p->tp_mesh_dim = -1;
    p->nclasses = stages;
    p->classes = t->classes;
    p->class_of = t->class_of;
    p->pp_size = stages;
    p->pp_mesh_dim = 0;
    p->pp_family = 0;
    for (int s = 0; s < stages; s++) {
        int nunits = (two_units >> s) & 1 ? 2 : 1;
        int64_t offset = 0;
        for (int u = 0; u < nunits; u++) {
            cp_unit *U = &t->units[s][u];
            snprintf(t->unit_names[s][u], sizeof t->unit_names[s][u], "stage%d.%d", s, u);
            U->name = t->unit_names[s][u];
            U->orig_dtype = U->ag_dtype = U->reduce_dtype = U->grad_dtype = dtype;
            U->pre_divide = U->post_divide = 1.0;
            /* the last unit's messages a little larger than any message: count <= pp_numel */
            U->pp_numel = pp_numel + (u == nunits - 1 ? 5 : 0);
            U->arena_offset[CP_BUF_PP] = offset;
            offset += 2 * micro_steps * U->pp_numel * (int64_t)cp_dtype_size(dtype);
        }
        t->classes[s] = (cp_class){ .units = t->units[s], .params = NULL, .ops = t->ops[s], .waits = t->waits[s],
                                    .nwaits = 0, .nevents = 0, .arena_bytes = offset, .nunits = nunits,
                                    .nparams = 0, .nops = 0 };
        t->class_of[s] = s;
    }
}

static void finish_stage(stage_ops *s)
{
    s->t->classes[s->stage].nops = s->n;
    if (s->stage == 0) { /* the plan's own fields are class 0's */
        cp_plan *p = &s->t->plan;
        const cp_class *k = &s->t->classes[0];
        p->nunits = k->nunits;
        p->units = k->units;
        p->nops = k->nops;
        p->ops = k->ops;
        p->waits = k->waits;
        p->nwaits = k->nwaits;
        p->nevents = k->nevents;
        p->arena_bytes = k->arena_bytes;
    }
}

/* Two stages, three micro-batches, fp32, 1F1B's steady state as one batch
 * each side: stage 0 sends f0 and f1, then {send f2, recv g0} as a batch
 * (g0's receive records an event the next receive waits for), then
 * receives g1 and g2; stage 1 the mirror. Tags: 2 x sender + 1 for grads. */
static void build_pp2(pp_tables *t)
{
    enum { M = 3 };
    frame(t, "pp2", 2, M, CP_FP32, 37, 0);
    stage_ops s0 = { t, 0, 0, CP_FP32, 37 }, s1 = { t, 1, 0, CP_FP32, 37 };
    add(&s0, CP_OP_SEND, 0, 1, 0, 0, 0);
    add(&s0, CP_OP_SEND, 0, 1, 0, 1, 0);
    add(&s0, CP_OP_SEND, 0, 1, 0, 2, 1);
    add(&s0, CP_OP_RECV, 0, 1, 3, 0, 1)->event = 0;
    cp_op *o = add(&s0, CP_OP_RECV, 0, 1, 3, 1, 0);
    o->wait_first = 0;
    o->wait_count = 1;
    t->waits[0][0] = 0;
    t->classes[0].nwaits = 1;
    t->classes[0].nevents = 1;
    add(&s0, CP_OP_RECV, 0, 1, 3, 2, 0);
    add(&s1, CP_OP_RECV, 0, 0, 0, 0, 0);
    add(&s1, CP_OP_RECV, 0, 0, 0, 1, 0);
    add(&s1, CP_OP_SEND, 0, 0, 3, 0, 1); /* the batch: its receive first, its send after (any order works) */
    add(&s1, CP_OP_RECV, 0, 0, 0, 2, 1);
    add(&s1, CP_OP_SEND, 0, 0, 3, 1, 0);
    add(&s1, CP_OP_SEND, 0, 0, 3, 2, 0);
    finish_stage(&s0);
    finish_stage(&s1);
}

/* Four stages, two micro-batches, bf16; the middle stages have two units
 * (the first receives activations and sends their grads, the last sends
 * activations and receives grads). Forward: receive f_m, then {send f_m,
 * receive f_m+1} batched; backward the same with the grads. */
static void build_pp4(pp_tables *t)
{
    enum { S = 4, M = 2 };
    const int64_t count = 24;
    frame(t, "pp4", S, M, CP_BF16, count, 0x6u);
    for (int s = 0; s < S; s++) {
        stage_ops so = { t, s, 0, CP_BF16, count };
        int first = 0, last = t->classes[s].nunits - 1, batch = 0;
        for (int m = 0; m < M; m++) { /* forward */
            int b = s > 0 && s < S - 1 && m + 1 < M ? ++batch : 0;
            if (s > 0 && m == 0) add(&so, CP_OP_RECV, first, s - 1, 2 * (s - 1), m, 0);
            if (s < S - 1) add(&so, CP_OP_SEND, last, s + 1, 2 * s, m, b);
            if (s > 0 && m + 1 < M) add(&so, CP_OP_RECV, first, s - 1, 2 * (s - 1), m + 1, b);
        }
        for (int m = 0; m < M; m++) { /* backward */
            int b = s > 0 && s < S - 1 && m + 1 < M ? ++batch : 0;
            if (s < S - 1 && m == 0) add(&so, CP_OP_RECV, last, s + 1, 2 * (s + 1) + 1, m, 0);
            if (s > 0) add(&so, CP_OP_SEND, first, s - 1, 2 * s + 1, m, b);
            if (s < S - 1 && m + 1 < M) add(&so, CP_OP_RECV, last, s + 1, 2 * (s + 1) + 1, m + 1, b);
        }
        finish_stage(&so);
    }
}

/* ---- every rank a thread over the host backend, with the harness ---- */

typedef struct pp_rank pp_rank;
struct pp_rank {
    const cp_plan *plan;
    cp_host_world *world;
    int rank, steps;
    cp_backend backend;
    cp_executor ex;
    cp_harness harness;
    cp_p2p_fn harness_p2p; /* the harness's hook, which count_p2p calls */
    int (*host_recv)(cp_backend *b, const cp_op *op, cp_stream s, void *buf, int peer_rank);
    int corrupt;           /* flip a byte of every received message */
    int sends, checked, rc;
    long mismatches;
    char err[512];
    pthread_t thread;
};

static int count_p2p(void *user, cp_executor *ex, const cp_op *op, int after)
{
    pp_rank *r = (pp_rank *)((char *)user - offsetof(pp_rank, harness));
    if (after) r->checked++;
    else r->sends++;
    return r->harness_p2p(user, ex, op, after);
}

static int corrupting_recv(cp_backend *b, const cp_op *op, cp_stream s, void *buf, int peer_rank)
{
    pp_rank *r = (pp_rank *)((char *)b - offsetof(pp_rank, backend));
    int rc = r->host_recv(b, op, s, buf, peer_rank);
    if (rc == 0 && op->count > 3) ((unsigned char *)buf)[3 * cp_dtype_size(op->dtype)] ^= 0x10;
    return rc;
}

static void *rank_main(void *arg)
{
    pp_rank *r = arg;
    r->rc = -1;
    cp_host_backend_init(&r->backend, r->world, r->rank);
    if (r->corrupt) {
        r->host_recv = r->backend.recv;
        r->backend.recv = corrupting_recv;
    }
    r->ex.quiet = 1;
    if (cp_executor_init(&r->ex, r->plan, r->rank, &r->backend) != 0) goto out;
    if (cp_harness_init(&r->harness, &r->ex, CP_PATTERN_UNIQUE) != 0) goto free_ex;
    r->harness_p2p = r->ex.on_p2p;
    r->ex.on_p2p = count_p2p;
    int ok = 1;
    for (int s = 0; s < r->steps && ok; s++)
        ok = cp_harness_begin_step(&r->harness, s) == 0 && cp_executor_step(&r->ex) == 0 &&
             cp_harness_end_step(&r->harness) == 0;
    r->rc = ok ? 0 : -1;
    r->mismatches = r->harness.check.mismatches;
    cp_harness_free(&r->harness);
free_ex:
    snprintf(r->err, sizeof r->err, "%s", r->ex.err);
    cp_executor_free(&r->ex);
out:
    if (r->rc && !r->err[0]) snprintf(r->err, sizeof r->err, "%s", r->ex.err);
    return NULL;
}

/* The job's first failure after run_ranks (cp_host_world_stopped): -1 and "" when none. */
static int first_rank = -1;
static char first_why[1024];

/* Runs every rank for `steps` steps; timeout_s > 0 sets the receive timeout. */
static void run_ranks(const cp_plan *p, pp_rank *ranks, int steps, double timeout_s, int corrupt)
{
    cp_host_world *w = cp_host_world_create(p);
    assert_non_null(w);
    if (timeout_s > 0) cp_host_world_set_p2p_timeout(w, timeout_s);
    for (int r = 0; r < p->world_size; r++) {
        memset(&ranks[r], 0, sizeof ranks[r]);
        ranks[r].plan = p;
        ranks[r].world = w;
        ranks[r].rank = r;
        ranks[r].steps = steps;
        ranks[r].corrupt = corrupt;
        assert_int_equal(pthread_create(&ranks[r].thread, NULL, rank_main, &ranks[r]), 0);
    }
    join_bounded(&ranks[0].thread, sizeof ranks[0], p->world_size, 40.0);
    const char *why = cp_host_world_stopped(w, &first_rank);
    snprintf(first_why, sizeof first_why, "%s", why ? why : "");
    if (!why) first_rank = -1;
    cp_host_world_destroy(w); /* frees any message nobody received */
}

static int count_kind(const cp_plan *p, int rank, cp_op_kind k)
{
    cp_plan v;
    cp_plan_view(p, rank, &v);
    int n = 0;
    for (int i = 0; i < v.nops; i++) n += v.ops[i].kind == k;
    return n;
}

static void expect_clean_run(const cp_plan *p, int steps)
{
    pp_rank ranks[MAX_STAGES];
    run_ranks(p, ranks, steps, 0, 0);
    for (int r = 0; r < p->world_size; r++) {
        if (ranks[r].rc) fprintf(stderr, "rank %d: %s\n", r, ranks[r].err);
        assert_int_equal(ranks[r].rc, 0);
        assert_int_equal(ranks[r].mismatches, 0);
        /* every send wrote its message, every receive was checked */
        assert_int_equal(ranks[r].sends, steps * count_kind(p, r, CP_OP_SEND));
        assert_int_equal(ranks[r].checked, steps * count_kind(p, r, CP_OP_RECV));
    }
}

static void test_pp_geometry(void **state)
{
    (void)state;
    /* dp_shard 2 x pp 3 x tp 2: the pp dim's stride is 2 */
    cp_plan p;
    memset(&p, 0, sizeof p);
    p.world_size = 12;
    p.mesh_ndim = 3;
    p.mesh_sizes[0] = 2, p.mesh_sizes[1] = 3, p.mesh_sizes[2] = 2;
    p.pp_size = 3;
    p.pp_mesh_dim = 1;
    p.tp_size = 2;
    p.tp_mesh_dim = 2;
    for (int r = 0; r < 12; r++) {
        int pp = (r / 2) % 3;
        assert_int_equal(cp_pp_rank(&p, r), pp);
        for (int c = 0; c < 3; c++) {
            int peer = cp_pp_peer_rank(&p, r, c);
            assert_int_equal(cp_pp_rank(&p, peer), c);
            assert_int_equal(peer % 2, r % 2);     /* same TP coordinate */
            assert_int_equal(peer / 6, r / 6);     /* same dp_shard coordinate */
        }
    }
    /* without PP: the rank itself, coordinate 0 */
    p.pp_size = 1;
    p.pp_mesh_dim = -1;
    assert_int_equal(cp_pp_rank(&p, 7), 0);
    assert_int_equal(cp_pp_peer_rank(&p, 7, 0), 7);
}

static void test_pp_view_and_bytes(void **state)
{
    (void)state;
    static pp_tables t;
    build_pp4(&t);
    cp_plan v;
    cp_plan_view(&t.plan, 2, &v);
    assert_int_equal(v.view_class, 2);
    assert_int_equal(v.nunits, 2);
    assert_ptr_equal(v.units, t.units[2]);
    assert_int_equal(v.nops, t.classes[2].nops);
    assert_ptr_equal(v.ops, t.ops[2]);
    /* [direction][micro-step] messages of pp_numel elements of the ag dtype */
    assert_int_equal(cp_arena_buffer_bytes(&v, 1, CP_BUF_PP), 2 * 2 * (24 + 5) * 2);
    assert_int_equal(cp_arena_buffer_bytes(&v, 0, CP_BUF_PP), 2 * 2 * 24 * 2);
    /* an op's slot: ((tag & 1) * micro_steps + micro_step) * count elements */
    cp_executor ex;
    memset(&ex, 0, sizeof ex);
    ex.plan = &v;
    char base[1];
    void *bufs[2] = { base, base };
    ex.buf[CP_BUF_PP] = bufs;
    cp_op op = { .kind = CP_OP_RECV, .unit = 1, .dtype = CP_BF16, .count = 24, .micro_step = 1, .tag = 7 };
    assert_ptr_equal(cp_executor_op_buffer(&ex, &op, CP_BUF_PP, CP_SLOT_PP), base + (1 * 2 + 1) * 24 * 2);
    op.tag = 4;
    assert_ptr_equal(cp_executor_op_buffer(&ex, &op, CP_BUF_PP, CP_SLOT_PP), base + 1 * 24 * 2);
}

static void test_pp2_messages_checked(void **state)
{
    (void)state;
    static pp_tables t;
    build_pp2(&t);
    expect_clean_run(&t.plan, 2);
}

static int no_collective(void *user, int coll, int family, int color, int key, int size, void *in, void *out,
                         int64_t count, int dtype, int reduce_op)
{
    (void)user, (void)coll, (void)family, (void)color, (void)key, (void)size, (void)in, (void)out, (void)count;
    (void)dtype, (void)reduce_op;
    return -1;
}

/* The host library refuses a pipeline plan's unit calls with one line: the
 * sends and receives between them are the binary's, not the caller's. */
static void test_pp_library_calls_refused(void **state)
{
    (void)state;
    static pp_tables t;
    build_pp2(&t);
    cp_hostlib *h = NULL;
    char err[600];
    assert_int_equal(cp_hostlib_init(&h, &t.plan, 0, no_collective, NULL, err, sizeof err), 0);
    assert_int_equal(cp_hostlib_unshard(h, 0), -1);
    const char *msg = cp_hostlib_last_error(h);
    assert_non_null(strstr(msg, "cp_hostlib_unshard: plan "));
    assert_non_null(strstr(msg, "is a pipeline plan (pp 2)"));
    assert_non_null(strstr(msg, "run its binary"));
    assert_null(strchr(msg, '\n'));
    cp_hostlib_destroy(h);
}

static void test_pp4_messages_checked(void **state)
{
    (void)state;
    static pp_tables t;
    build_pp4(&t);
    expect_clean_run(&t.plan, 2);
    /* the --simulate path (its harness, every rank a thread) too */
    cp_sim_options opt = { .steps = 2, .pattern = CP_PATTERN_UNIQUE, .arith = CP_ARITH_GLOO };
    assert_int_equal(cp_simulate(&t.plan, &opt), 0);
    /* --ranks: a pipeline rank alone has no stand-ins for its peers'
     * messages; refused before anything runs (it waited for them) */
    int only[1] = { 1 };
    opt.only = only;
    opt.nonly = 1;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    assert_int_equal(cp_simulate(&t.plan, &opt), 2);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    assert_true(t1.tv_sec - t0.tv_sec < 5); /* at once, not after a receive's timeout (30 s) */
}

static void test_pp_corrupted_message_is_caught(void **state)
{
    (void)state;
    static pp_tables t;
    build_pp2(&t);
    pp_rank ranks[2];
    run_ranks(&t.plan, ranks, 1, 0, 1);
    for (int r = 0; r < 2; r++) {
        assert_int_equal(ranks[r].rc, 0);
        assert_true(ranks[r].mismatches > 0); /* one line on stderr, the first wrong element */
    }
}

#define MISMATCH_1 "rank 1: recv of tag 2 micro 1 (op 1) from rank 0 got tag 0 micro 1"

/* A failed receive stops every rank at once with the first rank's reason:
 * rank 0, waiting for grads rank 1 will never send, stops on rank 1's line
 * instead of waiting out its receive's timeout (20 s here). */
static void test_pp_tag_mismatch_refused(void **state)
{
    (void)state;
    static pp_tables t;
    build_pp2(&t);
    t.ops[1][1].tag = 2; /* rank 1's second receive names another message than rank 0 sends */
    pp_rank ranks[2];
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    run_ranks(&t.plan, ranks, 1, 20.0, 0);
    double secs = since(&t0);
    assert_int_equal(ranks[1].rc, -1);
    assert_non_null(strstr(ranks[1].err, MISMATCH_1));
    assert_non_null(strstr(ranks[1].err, "the two ranks' tables disagree; regenerate the plan"));
    assert_int_equal(first_rank, 1);
    assert_string_equal(first_why, ranks[1].err);
    assert_int_equal(ranks[0].rc, -1);
    const char *at = strstr(ranks[0].err, "rank 0: stopped: rank 1 failed first: ");
    if (!at || strcmp(at + strlen("rank 0: stopped: rank 1 failed first: "), ranks[1].err) != 0)
        fail_msg("rank 0: %s", ranks[0].err);
    if (secs >= 5.0) fail_msg("the ranks took %.1f s to stop (the receive's timeout: 20 s)", secs);
}

/* The same through --simulate on 4 stages (rank 2's first receive names another message): exit status 2 at
 * once, rank 2's line printed once, nothing from the three ranks it stopped. */
static void test_pp_simulate_failed_receive_stops_every_rank(void **state)
{
    (void)state;
    static pp_tables t;
    build_pp4(&t);
    cp_sim_options opt = { .steps = 1, .pattern = CP_PATTERN_UNIQUE, .arith = CP_ARITH_GLOO };
    char out[4096];
    double secs;
    int first = -1;
    for (int i = 0; i < t.classes[2].nops && first < 0; i++)
        if (t.ops[2][i].kind == CP_OP_RECV) first = i;
    assert_true(first >= 0);
    t.ops[2][first].tag += 2;
    setenv("COMMPLAN_P2P_TIMEOUT", "20", 1);
    int rc = simulate_captured(&t.plan, &opt, 40.0, &secs, out, sizeof out);
    unsetenv("COMMPLAN_P2P_TIMEOUT");
    assert_int_equal(rc, 2);
    if (secs >= 5.0) fail_msg("--simulate took %.1f s to stop (the receive's timeout: 20 s)", secs);
    const char *want = "commplan: rank 2: ";
    if (strncmp(out, want, strlen(want)) != 0 || !strstr(out, "the two ranks' tables disagree") ||
        strchr(out, '\n') != out + strlen(out) - 1)
        fail_msg("stderr, want rank 2's line once: %s", out);
}

static void test_pp_recv_nobody_sends_times_out(void **state)
{
    (void)state;
    static pp_tables t;
    build_pp2(&t);
    stage_ops s1 = { &t, 1, t.classes[1].nops, CP_FP32, 37 };
    add(&s1, CP_OP_RECV, 0, 0, 0, 2, 0); /* a second f2 that rank 0 never sends */
    finish_stage(&s1);
    pp_rank ranks[2];
    /* 1.5 s: rank 0's own receives must not time out first under valgrind on a loaded machine (0.3 s did) */
    run_ranks(&t.plan, ranks, 1, 1.5, 0);
    assert_int_equal(ranks[0].rc, 0);
    assert_int_equal(ranks[1].rc, -1);
    assert_non_null(strstr(ranks[1].err, "rank 1: recv of tag 0 micro 2 (op 6) from rank 0: no message within 1.5 s"));
    assert_non_null(strstr(ranks[1].err, "rank 0 never sent it"));
}

/* ---- the executor's batch bracketing, with a fake backend ---- */

typedef struct {
    char log[64][32];
    int n, starts, ends, open;
} fake_state;

static fake_state fake;

static void note(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (fake.n < 64) vsnprintf(fake.log[fake.n++], sizeof fake.log[0], fmt, ap);
    va_end(ap);
}

static void *f_alloc(cp_backend *b, size_t bytes) { (void)b; return calloc(1, bytes ? bytes : 1); }
static void f_free(cp_backend *b, void *p) { (void)b; free(p); }
static int f_record(cp_backend *b, cp_stream s, int e) { (void)b; (void)s; note("record %d", e); return 0; }
static int f_wait(cp_backend *b, cp_stream s, int e) { (void)b; (void)s; (void)e; return 0; }
static int f_nothing(cp_backend *b) { (void)b; return 0; }
static int f_release(cp_backend *b, void *p, size_t n) { (void)b; (void)p; (void)n; return 0; }
static int f_copy_host(cp_backend *b, cp_stream s, const void *src, void *dst, size_t n)
{
    (void)b;
    (void)s;
    memcpy(dst, src, n);
    return 0;
}
static int f_write(cp_backend *b, cp_stream s, void *dst, const void *src, size_t n) { return f_copy_host(b, s, src, dst, n); }
static int f_send(cp_backend *b, const cp_op *op, cp_stream s, const void *buf, int peer)
{
    (void)b; (void)s; (void)buf;
    note("send %d to %d%s", op->tag, peer, fake.open ? " in" : "");
    return 0;
}
static int f_recv(cp_backend *b, const cp_op *op, cp_stream s, void *buf, int peer)
{
    (void)b; (void)s; (void)buf;
    note("recv %d from %d%s", op->tag, peer, fake.open ? " in" : "");
    return 0;
}
static int f_group_start(cp_backend *b)
{
    (void)b;
    fake.starts++;
    if (fake.open++) return -1; /* never nested */
    note("start");
    return 0;
}
static int f_group_end(cp_backend *b)
{
    (void)b;
    fake.ends++;
    if (fake.open-- != 1) return -1;
    note("end");
    return 0;
}
static int f_on_p2p(void *user, cp_executor *ex, const cp_op *op, int after)
{
    (void)user; (void)ex;
    note("%s %d m%d", after ? "checked" : "wrote", op->tag, op->micro_step);
    return 0;
}

static void fake_backend(cp_backend *b)
{
    memset(b, 0, sizeof *b);
    memset(&fake, 0, sizeof fake);
    b->alloc = f_alloc;
    b->free = f_free;
    b->record = f_record;
    b->wait = f_wait;
    b->fork = f_nothing;
    b->join = f_nothing;
    b->release = f_release;
    b->read = f_copy_host;
    b->write = f_write;
    b->send = f_send;
    b->recv = f_recv;
    b->group_start = f_group_start;
    b->group_end = f_group_end;
}

static void test_pp_batch_bracketing(void **state)
{
    (void)state;
    static pp_tables t;
    build_pp2(&t);
    static const char *const want[] = {
        "wrote 0 m0", "send 0 to 1", "wrote 0 m1", "send 0 to 1",
        "start", "wrote 0 m2", "send 0 to 1 in", "recv 3 from 1 in", "end",
        "checked 3 m0", "record 0", /* after the group closed: the batch's receive, then its event */
        "recv 3 from 1", "checked 3 m1", "recv 3 from 1", "checked 3 m2",
    };
    size_t nwant = sizeof want / sizeof *want;
    for (int by_op = 0; by_op < 2; by_op++) { /* the whole step, then op by op */
        cp_backend b;
        cp_executor ex;
        fake_backend(&b);
        memset(&ex, 0, sizeof ex);
        assert_int_equal(cp_executor_init(&ex, &t.plan, 0, &b), 0);
        ex.on_p2p = f_on_p2p;
        if (by_op)
            for (int i = 0; i < ex.plan->nops; i++) assert_int_equal(cp_executor_run_op(&ex, &ex.plan->ops[i]), 0);
        else assert_int_equal(cp_executor_step(&ex), 0);
        assert_int_equal(fake.starts, 1);
        assert_int_equal(fake.ends, 1);
        assert_int_equal(fake.n, (int)nwant);
        for (size_t i = 0; i < nwant; i++) assert_string_equal(fake.log[i], want[i]);
        cp_executor_free(&ex);
    }
    /* rank 1's batch is a send after a receive; the 4-stage tables have a
     * batch per phase on each middle stage: a group for each */
    build_pp4(&t);
    for (int r = 0; r < 4; r++) {
        cp_backend b;
        cp_executor ex;
        fake_backend(&b);
        memset(&ex, 0, sizeof ex);
        assert_int_equal(cp_executor_init(&ex, &t.plan, r, &b), 0);
        assert_int_equal(cp_executor_step(&ex), 0);
        assert_int_equal(fake.starts, r == 1 || r == 2 ? 2 : 0);
        assert_int_equal(fake.ends, fake.starts);
        assert_int_equal(fake.open, 0);
        cp_executor_free(&ex);
    }
}

static void test_pp_peer_outside_pipeline_refused(void **state)
{
    (void)state;
    static pp_tables t;
    build_pp2(&t);
    t.ops[0][0].peer = 0; /* itself */
    cp_backend b;
    cp_executor ex;
    fake_backend(&b);
    memset(&ex, 0, sizeof ex);
    ex.quiet = 1;
    assert_int_equal(cp_executor_init(&ex, &t.plan, 0, &b), 0);
    assert_int_equal(cp_executor_step(&ex), -1);
    assert_non_null(strstr(ex.err, "names pp peer 0, not another stage"));
    cp_executor_free(&ex);
    build_pp2(&t);
    t.ops[0][0].count = 43; /* beyond the unit's pp_numel (42) */
    fake_backend(&b);
    memset(&ex, 0, sizeof ex);
    ex.quiet = 1;
    assert_int_equal(cp_executor_init(&ex, &t.plan, 0, &b), 0);
    assert_int_equal(cp_executor_step(&ex), -1);
    assert_non_null(strstr(ex.err, "lies outside the unit's"));
    cp_executor_free(&ex);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pp_geometry),
        cmocka_unit_test(test_pp_view_and_bytes),
        cmocka_unit_test(test_pp2_messages_checked),
        cmocka_unit_test(test_pp_library_calls_refused),
        cmocka_unit_test(test_pp4_messages_checked),
        cmocka_unit_test(test_pp_corrupted_message_is_caught),
        cmocka_unit_test(test_pp_tag_mismatch_refused),
        cmocka_unit_test(test_pp_simulate_failed_receive_stops_every_rank),
        cmocka_unit_test(test_pp_recv_nobody_sends_times_out),
        cmocka_unit_test(test_pp_batch_bracketing),
        cmocka_unit_test(test_pp_peer_outside_pipeline_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
