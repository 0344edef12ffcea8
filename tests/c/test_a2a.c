/* cmocka tests for expert parallelism's runtime half: hand-written tables
 * of an ep 2 and an ep 4 group (the ep mesh dim only), one MoE unit whose
 * micro-steps each dispatch and combine, then run the backward's two
 * all-to-alls with the splits swapped, on the host backend, every rank a
 * thread. Routed counts come from the harness's seeded generator (every
 * received count and row checked), or from the test: uneven counts, zero
 * rows to a member, members filled exactly to capacity, one row past it
 * (refused on every rank, one line from the rank that routed it), a round
 * trip returning every token to its origin, a backend that lands rows at
 * the wrong offset (caught), and the executor's refusals of bad tables. */
#define _GNU_SOURCE /* pthread_timedjoin_np: a test that fails instead of hanging */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "commplan.h"
#include "cp_hostlib.h"
#include "harness.h"
#include "host.h"
#include "simulate.h"
#include "bounded.h"

/* ---- hand-written tables ---- */

#define MAX_EP 4
#define MAX_OPS 64

typedef struct {
    cp_plan plan;
    cp_group_family family;
    cp_group_family families[2]; /* build_two_groups' */
    cp_unit unit;
    cp_unit units[2]; /* the order check's: unit, and a second whose buffer overlaps its tokens */
    cp_op ops[MAX_OPS];
    int waits[1];
    int ep, epp, micro;
    int64_t dim, cap;
} ep_tables;

static cp_op *add(ep_tables *t, cp_op_kind kind, int micro, int counts_op, int combine)
{
    assert_true(t->plan.nops < MAX_OPS);
    cp_op *o = &t->ops[t->plan.nops++];
    *o = (cp_op){ .kind = kind, .unit = 0, .family = t->ep > 1 ? 0 : -1, .stream = CP_STREAM_COMPUTE,
                  .dtype = t->unit.ag_dtype, .count = kind == CP_OP_A2A_COUNTS ? t->epp : t->cap * t->dim,
                  .reduce_op = CP_SUM, .micro_step = micro, .event = -1, .peer = -1, .a2a_experts = t->epp,
                  .a2a_slot = micro, .a2a_counts_op = counts_op, .a2a_combine = combine, .a2a_dim = t->dim,
                  .a2a_capacity = t->cap, .a2a_rows = (int64_t)t->ep * t->cap * 2 / 3 };
    return o;
}

/* A world of ep ranks on one mesh dim "ep", one family over it, one unit
 * "moe" with a counts slot per micro-step. Per micro-step m, forward:
 * counts (slot m), dispatch, combine; then backward in reverse micro-step
 * order: combine's gradient (a dispatch by m's counts), dispatch's
 * gradient (a combine). */
static void build_tables(ep_tables *t, const char *name, int ep, int epp, int micro, cp_dtype dtype, int64_t dim,
                         int64_t cap, int recompute)
{
    memset(t, 0, sizeof *t);
    t->ep = ep, t->epp = epp, t->micro = micro, t->dim = dim, t->cap = cap;
    t->family = (cp_group_family){ .name = "ep", .axis_mask = 0x1u, .size = ep };
    cp_plan *p = &t->plan;
    p->name = name;
    p->fingerprint = "0000000000000000";
    p->world_size = ep;
    p->mesh_ndim = 1;
    p->mesh_names[0] = "ep";
    p->mesh_sizes[0] = ep;
    p->shard_size = p->replicate_size = 1;
    p->shard_family = p->replicate_family = -1;
    p->micro_steps = micro;
    p->nfamilies = 1;
    p->families = &t->family;
    p->tp_size = 1;
    p->tp_mesh_dim = -1;
    p->pp_size = 1;
    p->pp_mesh_dim = -1;
    p->pp_family = -1;
    cp_unit *U = &t->unit;
    U->name = "moe";
    U->orig_dtype = U->ag_dtype = U->reduce_dtype = U->grad_dtype = dtype;
    U->pre_divide = U->post_divide = 1.0;
    U->a2a_numel = (int64_t)ep * cap * dim;
    U->a2a_slots = micro;
    U->a2a_experts = ep * epp;
    int64_t counts = 2 * (int64_t)micro * ep * epp * 8, tokens = U->a2a_numel * (int64_t)cp_dtype_size(dtype);
    U->arena_offset[CP_BUF_A2A_COUNTS] = 0;
    U->arena_offset[CP_BUF_A2A_SEND] = counts;
    U->arena_offset[CP_BUF_A2A_RECV] = counts + tokens;
    p->arena_bytes = counts + 2 * tokens;
    p->nunits = 1;
    p->units = U;
    p->ops = t->ops;
    p->waits = t->waits;
    int counts_op[8];
    for (int m = 0; m < micro; m++) {
        counts_op[m] = p->nops;
        add(t, CP_OP_A2A_COUNTS, m, -1, 0);
        add(t, CP_OP_A2A, m, counts_op[m], 0);
        add(t, CP_OP_A2A, m, counts_op[m], 1);
    }
    for (int m = micro - 1; m >= 0; m--) {
        int k = counts_op[m];
        if (recompute) { /* activation checkpointing: the forward's three again, the counts naming the forward's */
            k = t->plan.nops;
            add(t, CP_OP_A2A_COUNTS, m, counts_op[m], 0);
            add(t, CP_OP_A2A, m, k, 0);
            add(t, CP_OP_A2A, m, k, 1);
        }
        add(t, CP_OP_A2A, m, k, 0); /* the combine's gradient */
        add(t, CP_OP_A2A, m, k, 1); /* the dispatch's gradient */
    }
}

static void build(ep_tables *t, const char *name, int ep, int epp, int micro, cp_dtype dtype, int64_t dim, int64_t cap)
{
    build_tables(t, name, ep, epp, micro, dtype, dim, cap, 0);
}

static int count_kind(const cp_plan *p, cp_op_kind k)
{
    int n = 0;
    for (int i = 0; i < p->nops; i++) n += p->ops[i].kind == k;
    return n;
}

/* ---- every rank a thread over the host backend ---- */

typedef struct ep_rank ep_rank;
/* The test's own hook, or NULL for the harness's draws. */
typedef int (*test_hook)(ep_rank *r, cp_executor *ex, const cp_op *op, int after);

struct ep_rank {
    const cp_plan *plan;
    int rank, steps;
    cp_backend backend;
    cp_executor ex;
    cp_harness harness;
    test_hook hook;
    int use_harness; /* the hook passes token ops to the harness (written and checked there) */
    int (*host_a2a)(cp_backend *b, const cp_op *op, cp_stream s, const void *in, void *out, const int64_t *send_rows,
                    const int64_t *recv_rows);
    int shift;       /* the backend lands every received row one row late */
    int hooks, rc;
    long mismatches;
    void *saved;     /* round trip: this rank's dispatched rows */
    long roundtrip_bad;
    char err[512];
    pthread_t thread;
};

static ep_rank *rank_of_harness(void *user) { return (ep_rank *)((char *)user - offsetof(ep_rank, harness)); }

static int counting_a2a(void *user, cp_executor *ex, const cp_op *op, int after)
{
    ep_rank *r = rank_of_harness(user);
    r->hooks++;
    if (r->hook) return r->hook(r, ex, op, after);
    return cp_harness_on_a2a(user, ex, op, after);
}

static int shifting_a2a(cp_backend *b, const cp_op *op, cp_stream s, const void *in, void *out, const int64_t *send_rows,
                        const int64_t *recv_rows)
{
    ep_rank *r = (ep_rank *)((char *)b - offsetof(ep_rank, backend));
    int rc = r->host_a2a(b, op, s, in, out, send_rows, recv_rows);
    int64_t rows = 0;
    for (int m = 0; m < (int)r->plan->families[0].size; m++) rows += recv_rows[m];
    size_t row = (size_t)op->a2a_dim * cp_dtype_size(op->dtype);
    if (rc == 0 && rows > 1) memmove((char *)out + row, out, (size_t)(rows - 1) * row);
    return rc;
}

static void *rank_main(void *arg)
{
    ep_rank *r = arg;
    r->rc = -1;
    if (cp_executor_init(&r->ex, r->plan, r->rank, &r->backend) != 0) goto out;
    if (cp_harness_init(&r->harness, &r->ex, CP_PATTERN_UNIQUE) != 0) goto free_ex;
    r->ex.on_a2a = counting_a2a;
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
    free(r->saved);
    r->saved = NULL;
    return NULL;
}

/* The job's first failure after run_ranks (its world's cp_host_world_stopped): -1 and "" when none. */
static int first_rank = -1;
static char first_why[1024];

static void run_ranks(const cp_plan *p, ep_rank *ranks, int steps, test_hook hook, int shift)
{
    cp_host_world *w = cp_host_world_create(p);
    assert_non_null(w);
    for (int r = 0; r < p->world_size; r++) {
        memset(&ranks[r], 0, sizeof ranks[r]);
        ranks[r].plan = p;
        ranks[r].rank = r;
        ranks[r].steps = steps;
        ranks[r].hook = hook;
        ranks[r].shift = shift;
        cp_host_backend_init(&ranks[r].backend, w, r);
        if (shift) {
            ranks[r].host_a2a = ranks[r].backend.a2a;
            ranks[r].backend.a2a = shifting_a2a;
        }
        ranks[r].ex.quiet = 1;
    }
    for (int r = 0; r < p->world_size; r++)
        assert_int_equal(pthread_create(&ranks[r].thread, NULL, rank_main, &ranks[r]), 0);
    join_bounded(&ranks[0].thread, sizeof ranks[0], p->world_size, 10.0);
    const char *why = cp_host_world_stopped(w, &first_rank);
    snprintf(first_why, sizeof first_why, "%s", why ? why : "");
    if (!why) first_rank = -1;
    cp_host_world_destroy(w);
}

static void expect_clean(const cp_plan *p, ep_rank *ranks, int steps)
{
    for (int r = 0; r < p->world_size; r++) {
        if (ranks[r].rc) fprintf(stderr, "rank %d: %s\n", r, ranks[r].err);
        assert_int_equal(ranks[r].rc, 0);
        assert_int_equal(ranks[r].mismatches, 0);
        assert_int_equal(ranks[r].roundtrip_bad, 0);
        /* every all-to-all's hook ran before and after it */
        assert_int_equal(ranks[r].hooks, 2 * steps * (count_kind(p, CP_OP_A2A_COUNTS) + count_kind(p, CP_OP_A2A)));
    }
}

/* ---- tests ---- */

static void test_a2a_bytes_and_fields(void **state)
{
    (void)state;
    static ep_tables t;
    build(&t, "ep4", 4, 2, 3, CP_BF16, 6, 5);
    assert_int_equal(cp_arena_buffer_bytes(&t.plan, 0, CP_BUF_A2A_COUNTS), 2 * 3 * 8 * 8);
    assert_int_equal(cp_arena_buffer_bytes(&t.plan, 0, CP_BUF_A2A_SEND), 4 * 5 * 6 * 2);
    assert_int_equal(cp_arena_buffer_bytes(&t.plan, 0, CP_BUF_A2A_RECV), 4 * 5 * 6 * 2);
    assert_true(cp_plan_has_a2a(&t.plan));
    assert_string_equal(cp_op_kind_name(CP_OP_A2A_COUNTS), "a2a_counts");
    assert_string_equal(cp_op_kind_name(CP_OP_A2A), "a2a");
    /* the kinds before them keep their numbers */
    assert_int_equal(CP_OP_SEND, 17);
    assert_int_equal(CP_OP_BACKWARD_INPUT, 19);
    assert_int_equal(CP_OP_A2A_COUNTS, 20);
    assert_int_equal(CP_BUF_PP, 7);
    assert_int_equal(CP_BUF_A2A_RECV, 10);
    /* (CPU offload's CP_BUF_H2D and CP_BUF_D2H, then reshard_after_forward = k's
     * CP_BUF_POST_FORWARD, come after the EP buffers) */
    assert_int_equal(CP_BUF_SHARDED, 14);
}

/* The harness's seeded draws: every received count and row checked. */
static void test_a2a_ep2_drawn_counts_checked(void **state)
{
    (void)state;
    static ep_tables t;
    build(&t, "ep2", 2, 2, 2, CP_FP32, 5, 7);
    static ep_rank ranks[MAX_EP];
    run_ranks(&t.plan, ranks, 3, NULL, 0);
    expect_clean(&t.plan, ranks, 3);
}

static void test_a2a_ep4_drawn_counts_checked(void **state)
{
    (void)state;
    static ep_tables t;
    build(&t, "ep4", 4, 2, 2, CP_BF16, 6, 5);
    static ep_rank ranks[MAX_EP];
    run_ranks(&t.plan, ranks, 4, NULL, 0);
    expect_clean(&t.plan, ranks, 4);
    /* --simulate's path too (its harness, every rank a thread), and fp16 with one expert per member */
    cp_sim_options opt = { .steps = 3, .pattern = CP_PATTERN_UNIQUE, .arith = CP_ARITH_GLOO };
    assert_int_equal(cp_simulate(&t.plan, &opt), 0);
    build(&t, "ep4_fp16", 4, 1, 1, CP_FP16, 3, 9);
    assert_int_equal(cp_simulate(&t.plan, &opt), 0);
}

/* The seeded draws: deterministic, never past capacity, some zeros, some members exactly full. */
static void test_a2a_draws(void **state)
{
    (void)state;
    static ep_tables t;
    build(&t, "ep4", 4, 2, 1, CP_FP32, 4, 6);
    cp_checker c;
    assert_int_equal(cp_checker_init(&c, &t.plan, CP_PATTERN_UNIQUE, 0), 0);
    int zero_expert = 0, zero_member = 0, full_member = 0;
    for (int step = 0; step < 40; step++) {
        c.step = step;
        for (int r = 0; r < 4; r++) {
            int64_t a[8], b[8];
            cp_checker_a2a_counts(&c, &t.ops[0], r, 4, a);
            cp_checker_a2a_counts(&c, &t.ops[0], r, 4, b);
            assert_memory_equal(a, b, sizeof a);
            int64_t total = 0;
            for (int m = 0; m < 4; m++) {
                int64_t sum = a[2 * m] + a[2 * m + 1];
                assert_true(a[2 * m] >= 0 && a[2 * m + 1] >= 0 && sum <= 6);
                zero_expert += a[2 * m] == 0 || a[2 * m + 1] == 0;
                zero_member += sum == 0;
                full_member += sum == 6;
                total += sum;
            }
            assert_int_equal(total, t.ops[0].a2a_rows); /* 16 rows fit in 4 x 6 */
        }
    }
    assert_true(zero_expert > 0 && zero_member > 0 && full_member > 0);
    cp_checker_free(&c);
}

/* ---- counts given by the test ---- */

/* ep 4, two experts per member, capacity 6: rank r sends member r+1
 * exactly 6 (all to its first expert), member r+2 nothing, member r+3 one
 * row per expert, itself 3 + micro-step rows. */
static void given_counts(int rank, int micro, int64_t *c)
{
    memset(c, 0, 8 * sizeof *c);
    int full = (rank + 1) % 4, odd = (rank + 3) % 4;
    c[2 * full] = 6;
    c[2 * odd] = 1, c[2 * odd + 1] = 1;
    c[2 * rank + 1] = 3 + micro;
}

static int given_hook(ep_rank *r, cp_executor *ex, const cp_op *op, int after)
{
    if (op->kind == CP_OP_A2A_COUNTS) {
        int64_t c[8];
        if (after) { /* what each member sent this rank: its given counts for this rank's experts */
            const int64_t *got = cp_executor_a2a_counts(ex, 0, op->a2a_slot) + 8;
            for (int m = 0; m < 4; m++) {
                given_counts(m, op->micro_step, c);
                if (got[2 * m] != c[2 * r->rank] || got[2 * m + 1] != c[2 * r->rank + 1]) return -1;
            }
            return 0;
        }
        given_counts(r->rank, op->micro_step, c);
        return cp_executor_set_expert_counts(ex, 0, c, 8);
    }
    /* the tokens: written and checked by the harness, whatever the counts */
    return cp_harness_on_a2a(&r->harness, ex, op, after);
}

static void test_a2a_uneven_zero_and_full_members(void **state)
{
    (void)state;
    static ep_tables t;
    build(&t, "ep4_given", 4, 2, 2, CP_BF16, 3, 6);
    static ep_rank ranks[MAX_EP];
    run_ranks(&t.plan, ranks, 2, given_hook, 0);
    expect_clean(&t.plan, ranks, 2);
}

/* A round trip: the dispatch's rows, combined back with the experts as the
 * identity, return to their origin exactly, each at its own offset. */
static int roundtrip_hook(ep_rank *r, cp_executor *ex, const cp_op *op, int after)
{
    if (op->kind == CP_OP_A2A_COUNTS) {
        if (after) return 0;
        int64_t c[8];
        given_counts(r->rank, op->micro_step, c);
        return cp_executor_set_expert_counts(ex, 0, c, 8);
    }
    size_t row = (size_t)op->a2a_dim * cp_dtype_size(op->dtype);
    int64_t send_rows[4], recv_rows[4], rows = 0;
    assert_int_equal(cp_executor_a2a_splits(ex, op, send_rows, recv_rows), 0);
    for (int m = 0; m < 4; m++) rows += op->a2a_combine ? recv_rows[m] : send_rows[m];
    char *sendbuf = cp_executor_buffer(ex, 0, CP_BUF_A2A_SEND);
    long x = (long)(op - ex->plan->ops);
    if (!op->a2a_combine && !after && x < 3 * r->plan->micro_steps) { /* a forward dispatch: rows from this rank */
        free(r->saved);
        r->saved = malloc((size_t)rows * row + 1);
        for (int64_t i = 0; i < rows * op->a2a_dim; i++)
            cp_store(op->dtype, sendbuf, i, (float)(1 + (r->rank * 37 + i * 5 + op->micro_step) % 200));
        memcpy(r->saved, sendbuf, (size_t)rows * row);
        memset(sendbuf + (size_t)rows * row, 0, (size_t)(4 * op->a2a_capacity - rows) * row);
    }
    if (op->a2a_combine && !after && x < 3 * r->plan->micro_steps) /* the origin's rows, gone before they return */
        memset(sendbuf, 0, (size_t)(4 * op->a2a_capacity) * row);
    if (op->a2a_combine && after && x < 3 * r->plan->micro_steps && memcmp(sendbuf, r->saved, (size_t)rows * row))
        r->roundtrip_bad++;
    return 0;
}

static void test_a2a_round_trip_exact(void **state)
{
    (void)state;
    static ep_tables t;
    build(&t, "ep4_roundtrip", 4, 2, 2, CP_FP32, 4, 6);
    static ep_rank ranks[MAX_EP];
    run_ranks(&t.plan, ranks, 2, roundtrip_hook, 0);
    expect_clean(&t.plan, ranks, 2);
}

/* One row past capacity on rank 1: its line, every other member refuses the layer too; nothing hangs. */
static int over_hook(ep_rank *r, cp_executor *ex, const cp_op *op, int after)
{
    if (op->kind != CP_OP_A2A_COUNTS || after) return cp_harness_on_a2a(&r->harness, ex, op, after);
    int64_t c[4] = { 3, 2, 1, 0 };
    if (r->rank == 1) c[0] = 6; /* 6 + 2 rows for member 0, capacity 7 */
    return cp_executor_set_expert_counts(ex, 0, c, 4);
}

static int negative_hook(ep_rank *r, cp_executor *ex, const cp_op *op, int after)
{
    if (op->kind != CP_OP_A2A_COUNTS || after) return cp_harness_on_a2a(&r->harness, ex, op, after);
    int64_t c[4] = { 3, 2, 1, 0 };
    if (r->rank == 0) c[3] = -2;
    return cp_executor_set_expert_counts(ex, 0, c, 4);
}

static void test_a2a_past_capacity_refused(void **state)
{
    (void)state;
    static ep_tables t;
    build(&t, "ep2", 2, 2, 1, CP_FP32, 5, 7);
    static ep_rank ranks[MAX_EP];
    run_ranks(&t.plan, ranks, 1, over_hook, 0);
    assert_int_equal(ranks[1].rc, -1);
    assert_string_equal(ranks[1].err, "rank 1: op 0 (a2a_counts of unit moe, micro-step 0): 8 tokens for ep "
                                      "member 0 (rank 0, experts 0..1) exceed its capacity of 7 rows: raise the plan's "
                                      "expert capacity or route fewer tokens");
    /* rank 0 stops on rank 1's line (the host backend's threads share one job; over processes it would
     * refuse the layer on the -1s rank 1 sent: test_a2a_hostlib_refused_counts_said) */
    assert_int_equal(ranks[0].rc, -1);
    assert_non_null(strstr(ranks[0].err, "rank 0: stopped: rank 1 failed first: rank 1: op 0 (a2a_counts of unit moe, "
                                         "micro-step 0): 8 tokens"));
    assert_int_equal(first_rank, 1);
    run_ranks(&t.plan, ranks, 1, negative_hook, 0);
    assert_int_equal(ranks[0].rc, -1);
    assert_non_null(strstr(ranks[0].err, "expert 3's count -2 for ep member 1 (rank 1) is negative"));
    assert_int_equal(ranks[1].rc, -1);
    /* counts exactly at capacity pass */
    build(&t, "ep2", 2, 2, 1, CP_FP32, 5, 5);
    run_ranks(&t.plan, ranks, 1, over_hook, 0); /* 3 + 2 = 5 to member 0 from rank 0; rank 1's 8 still refused */
    assert_int_equal(ranks[1].rc, -1);
    assert_non_null(strstr(ranks[1].err, "exceed its capacity of 5 rows"));
}

/* ---- one rank's failure stops every rank of the job, not only its ep group's ---- */

/* Two ep groups and an exchange across them: world 4 on the mesh (x 2, ep 2);
 * unit "moe" exchanges over ep ({0,1}, {2,3}), then unit "moe_x" over x
 * ({0,2}, {1,3}), so after its own group's exchange every rank waits for a
 * member of the other ep group (as a dense collective over efsdp would). */
static void build_two_groups(ep_tables *t)
{
    build_tables(t, "ep2x2", 2, 2, 1, CP_FP32, 5, 7, 0);
    cp_plan *p = &t->plan;
    p->world_size = 4;
    p->mesh_ndim = 2;
    p->mesh_names[0] = "x", p->mesh_sizes[0] = 2;
    p->mesh_names[1] = "ep", p->mesh_sizes[1] = 2;
    t->families[0] = (cp_group_family){ .name = "ep", .axis_mask = 0x2u, .size = 2 };
    t->families[1] = (cp_group_family){ .name = "x", .axis_mask = 0x1u, .size = 2 };
    p->families = t->families;
    p->nfamilies = 2;
    t->units[0] = t->unit;
    t->units[1] = t->unit;
    t->units[1].name = "moe_x";
    for (int k = 0; k < CP_ARENA_BUFFERS; k++) t->units[1].arena_offset[k] += p->arena_bytes;
    p->arena_bytes *= 2;
    p->units = t->units;
    p->nunits = 2;
    int n = p->nops;
    for (int i = 0; i < n; i++) {
        cp_op o = t->ops[i];
        o.unit = 1, o.family = 1;
        if (o.a2a_counts_op >= 0) o.a2a_counts_op += n;
        assert_true(p->nops < MAX_OPS);
        t->ops[p->nops++] = o;
    }
}

#define REFUSAL_1 "rank 1: op 0 (a2a_counts of unit moe, micro-step 0): 8 tokens for ep member 0 (rank 0, experts 0..1) " \
                  "exceed its capacity of 7 rows: raise the plan's expert capacity or route fewer tokens"

/* Rank 1 routes 8 rows to member 0 (capacity 7) in unit moe; every other count the harness's. */
static int refuse_one_hook(ep_rank *r, cp_executor *ex, const cp_op *op, int after)
{
    if (op->kind != CP_OP_A2A_COUNTS || after || r->rank != 1 || op->unit != 0)
        return cp_harness_on_a2a(&r->harness, ex, op, after);
    int64_t c[4] = { 6, 2, 1, 0 };
    return cp_executor_set_expert_counts(ex, 0, c, 4);
}

static void test_a2a_refusal_stops_other_ep_groups(void **state)
{
    (void)state;
    static ep_tables t;
    build_two_groups(&t);
    static ep_rank ranks[4];
    /* the tables run clean: the harness's draws on both units, ranks of both ep groups meeting in moe_x */
    run_ranks(&t.plan, ranks, 2, NULL, 0);
    expect_clean(&t.plan, ranks, 2);
    assert_int_equal(first_rank, -1);
    /* rank 1's counts refused: its group refuses the layer, and ranks 2 and 3 (the other ep group), which
     * would wait in moe_x's exchange for ranks 0 and 1, stop at once with rank 1's line */
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    run_ranks(&t.plan, ranks, 1, refuse_one_hook, 0);
    double secs = since(&t0);
    if (secs >= 5.0) fail_msg("the ranks took %.1f s to stop", secs);
    assert_string_equal(ranks[1].err, REFUSAL_1);
    assert_int_equal(first_rank, 1);
    assert_string_equal(first_why, REFUSAL_1);
    for (int r = 0; r < 4; r++) {
        assert_int_equal(ranks[r].rc, -1);
        if (r == 1) continue;
        char want[64];
        snprintf(want, sizeof want, "rank %d: stopped: rank 1 failed first: ", r);
        const char *at = strstr(ranks[r].err, want);
        if (!at || strcmp(at + strlen(want), REFUSAL_1) != 0) fail_msg("rank %d: %s", r, ranks[r].err);
    }
}

/* The same through --simulate (COMMPLAN_A2A_OVERFLOW=1: rank 1 routes one row past a member's capacity):
 * exit status 2 at once, and the first rank's line printed once, nothing from the ranks it stopped. */
static void test_a2a_simulate_refusal_stops_every_rank(void **state)
{
    (void)state;
    static ep_tables t;
    build_two_groups(&t);
    cp_sim_options opt = { .steps = 2, .pattern = CP_PATTERN_UNIQUE, .arith = CP_ARITH_GLOO };
    char out[4096];
    double secs;
    assert_int_equal(simulate_captured(&t.plan, &opt, 10.0, &secs, out, sizeof out), 0);
    setenv("COMMPLAN_A2A_OVERFLOW", "1", 1);
    int rc = simulate_captured(&t.plan, &opt, 10.0, &secs, out, sizeof out);
    unsetenv("COMMPLAN_A2A_OVERFLOW");
    assert_int_equal(rc, 2);
    if (secs >= 5.0) fail_msg("--simulate took %.1f s to stop", secs);
    const char *want = "commplan: rank 1: op ";
    if (strncmp(out, want, strlen(want)) != 0 || !strstr(out, "exceed its capacity of 7 rows") ||
        strchr(out, '\n') != out + strlen(out) - 1)
        fail_msg("stderr, want rank 1's refusal once: %s", out);
}

/* The binary's path: COMMPLAN_A2A_OVERFLOW=<rank> makes that rank's draw one row past a member's capacity. */
static void test_a2a_simulate_overflow_refused(void **state)
{
    (void)state;
    static ep_tables t;
    build(&t, "ep4", 4, 2, 2, CP_BF16, 6, 5);
    cp_sim_options opt = { .steps = 1, .pattern = CP_PATTERN_UNIQUE, .arith = CP_ARITH_GLOO };
    setenv("COMMPLAN_A2A_OVERFLOW", "2", 1);
    int rc = cp_simulate(&t.plan, &opt);
    unsetenv("COMMPLAN_A2A_OVERFLOW");
    assert_int_equal(rc, 2);
}

/* Rows landed one row late: the checks name the first wrong row. */
static void test_a2a_wrong_offset_caught(void **state)
{
    (void)state;
    static ep_tables t;
    build(&t, "ep2", 2, 2, 1, CP_FP32, 5, 7);
    static ep_rank ranks[MAX_EP];
    run_ranks(&t.plan, ranks, 1, NULL, 1);
    long total = 0;
    for (int r = 0; r < 2; r++) {
        assert_int_equal(ranks[r].rc, 0);
        total += ranks[r].mismatches;
    }
    assert_true(total > 0);
}

/* The library entry's checks, on one executor (no exchange runs). */
static void test_a2a_set_expert_counts_checked(void **state)
{
    (void)state;
    static ep_tables t;
    build(&t, "ep2", 2, 2, 1, CP_FP32, 5, 7);
    cp_host_world *w = cp_host_world_create(&t.plan);
    cp_backend b;
    cp_host_backend_init(&b, w, 0);
    cp_executor ex;
    memset(&ex, 0, sizeof ex);
    ex.quiet = 1;
    assert_int_equal(cp_executor_init(&ex, &t.plan, 0, &b), 0);
    int64_t ok[4] = { 7, 0, 0, 7 }, bad[4] = { 4, 4, 0, 0 }, big[4] = { 0, 0, INT64_MAX, INT64_MAX };
    assert_int_equal(cp_executor_set_expert_counts(&ex, 0, ok, 4), 0);
    assert_int_equal(cp_executor_set_expert_counts(&ex, 0, bad, 4), -1);
    assert_non_null(strstr(ex.err, "rank 0: op 0 (a2a_counts of unit moe, micro-step 0): 8 tokens for ep "
                                   "member 0 (rank 0, experts 0..1) exceed its capacity of 7 rows"));
    assert_int_equal(cp_executor_set_expert_counts(&ex, 0, big, 4), -1); /* no overflow in the sums */
    assert_non_null(strstr(ex.err, "for ep member 1 (rank 1, experts 2..3) exceed its capacity of 7 rows"));
    assert_int_equal(cp_executor_set_expert_counts(&ex, 0, ok, 3), -1);
    assert_non_null(strstr(ex.err, "3 expert counts for unit moe, which has 4 experts"));
    /* the int64 ends: INT64_MIN is negative, not a wrapped large count; no counts at all */
    int64_t low[4] = { 0, 0, INT64_MIN, 0 };
    assert_int_equal(cp_executor_set_expert_counts(&ex, 0, low, 4), -1);
    assert_non_null(strstr(ex.err, "expert 2's count -9223372036854775808 for ep member 1 (rank 1) is negative"));
    assert_int_equal(cp_executor_set_expert_counts(&ex, 0, NULL, 4), -1);
    assert_non_null(strstr(ex.err, "0 expert counts for unit moe, which has 4 experts"));
    assert_int_equal(cp_executor_set_expert_counts(&ex, 0, ok, -1), -1);
    assert_non_null(strstr(ex.err, "-1 expert counts for unit moe"));
    assert_int_equal(cp_executor_set_expert_counts(&ex, 1, ok, 4), -1);
    /* a token all-to-all before its counts this step: refused, no exchange */
    assert_int_equal(cp_executor_run_op(&ex, &t.ops[1]), -1);
    assert_non_null(strstr(ex.err, "runs before its counts op 0 filled slot 0"));
    cp_executor_free(&ex);
    cp_host_world_destroy(w);
}

static int no_collectives(void *user, int coll, int family, int color, int key, int size, void *in, void *out,
                          int64_t count, int dtype, int reduce_op)
{
    (void)user, (void)coll, (void)family, (void)color, (void)key, (void)size, (void)in, (void)out, (void)count;
    (void)dtype, (void)reduce_op;
    return -1;
}

static void test_a2a_hostlib_counts_checked(void **state)
{
    (void)state;
    static ep_tables t;
    build(&t, "ep2", 2, 2, 1, CP_FP32, 5, 7);
    cp_hostlib *h;
    char err[256];
    assert_int_equal(cp_hostlib_init(&h, &t.plan, 1, no_collectives, NULL, err, sizeof err), 0);
    int64_t ok[4] = { 1, 2, 3, 4 }, bad[4] = { 1, 2, 3, 5 };
    assert_int_equal(cp_hostlib_set_expert_counts(h, 0, ok, 4), 0);
    assert_int_equal(cp_hostlib_set_expert_counts(h, 0, bad, 4), -1);
    assert_string_equal(cp_hostlib_last_error(h), "rank 1: op 0 (a2a_counts of unit moe, micro-step 0): 8 "
                                                  "tokens for ep member 1 (rank 1, experts 2..3) exceed its capacity of "
                                                  "7 rows: raise the plan's expert capacity or route fewer tokens");
    cp_hostlib_destroy(h);
}

/* ---- the host library's exchanges, every rank a thread ----
 * One cp_hostlib per rank (one process's view each), its all-to-alls
 * through a callback that exchanges in an in-process mailbox as
 * torch.distributed.all_to_all_single would: rows packed back to back per
 * member, split sizes in rows. The ranks drive the plan's order as
 * tests/lib/ep_library.c drives the GPU library: counts drawn per (rank,
 * step, micro-step), rows whose bytes say sender, expert, row and
 * direction, every received row checked, the experts' output (each byte
 * xor a per-expert key) sent back and checked where it returns. */

typedef struct {
    pthread_barrier_t barrier;
    int size;
    const void *in[MAX_EP];
    const int64_t *send_rows[MAX_EP];
    int64_t row_bytes[MAX_EP];
} mailbox;

typedef struct {
    const cp_plan *plan;
    mailbox *box;
    cp_hostlib *h;
    int rank, steps, step, pairs, no_alltoall, rc;
    int conflict; /* 0: the plan's order (lib_steps), 1: lib_conflict, 2: lib_refused, 3: lib_refused, the caller's line */
    long calls, exchanges, rows_checked, counts_checked, a2a_calls;
    char err[700];
    pthread_t thread;
} lib_rank;

static uint64_t mix64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    return x ^ (x >> 33);
}

/* Rank r's tokens per global expert for counts op k in step `step`: each
 * member's share within capacity, some experts empty, some members full. */
static void lib_draw(const cp_plan *p, const cp_op *k, int r, int step, int64_t *out)
{
    int n = p->families[0].size, epp = k->a2a_experts;
    for (int m = 0; m < n; m++) {
        uint64_t h =
            mix64(((uint64_t)r << 40) ^ ((uint64_t)step << 32) ^ ((uint64_t)k->micro_step << 24) ^ (uint64_t)m);
        int64_t left = (h & 7) == 0 ? k->a2a_capacity : k->a2a_capacity * (int64_t)(h % 100) / 100;
        for (int e = 0; e < epp; e++) {
            int64_t c = e == epp - 1 ? left : (int64_t)(mix64(h + (uint64_t)e) % (uint64_t)(left + 1));
            if ((mix64(h ^ (uint64_t)e) & 3) == 0) c = 0;
            out[m * epp + e] = c;
            left -= c;
        }
    }
}

static unsigned char lib_byte(int s, int step, int micro, int e, int64_t j, size_t b, int dir)
{
    return (unsigned char)mix64(((uint64_t)s << 48) ^ ((uint64_t)step << 40) ^ ((uint64_t)micro << 34) ^
                                ((uint64_t)e << 12) ^ (uint64_t)dir ^ ((uint64_t)j * 0x9e3779b97f4a7c15ULL) ^
                                ((uint64_t)b << 1) * 0x2545f491ULL);
}

static unsigned char lib_key(int e) { return (unsigned char)(0xa5 ^ (e * 37)); }

static int lib_fail(lib_rank *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int lib_fail(lib_rank *r, const char *fmt, ...)
{
    if (r->err[0]) return -1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->err, sizeof r->err, fmt, ap);
    va_end(ap);
    return -1;
}

/* torch's all_to_all_single over the mailbox: every member posts its input
 * and splits, then copies its rows out of every member's input. */
static int mailbox_alltoall(void *user, int family, int color, int key, int size, const void *in, void *out,
                            const int64_t *send_rows, const int64_t *recv_rows, int64_t row_bytes)
{
    lib_rank *r = user;
    mailbox *mb = r->box;
    r->a2a_calls++;
    int bad = family != 0 || color != 0 || size != mb->size || key != r->rank;
    if (!bad) {
        mb->in[key] = in;
        mb->send_rows[key] = send_rows;
        mb->row_bytes[key] = row_bytes;
    }
    pthread_barrier_wait(&mb->barrier);
    int64_t at = 0;
    for (int m = 0; m < mb->size && !bad; m++) {
        if (mb->row_bytes[m] != row_bytes || mb->send_rows[m][key] != recv_rows[m]) {
            bad = lib_fail(r, "member %d sends %lld rows of %lld bytes, rank %d expects %lld of %lld", m,
                           (long long)mb->send_rows[m][key], (long long)mb->row_bytes[m], r->rank,
                           (long long)recv_rows[m], (long long)row_bytes);
            break;
        }
        int64_t from = 0;
        for (int j = 0; j < key; j++) from += mb->send_rows[m][j];
        memcpy((char *)out + at * row_bytes, (const char *)mb->in[m] + from * row_bytes,
               (size_t)(recv_rows[m] * row_bytes));
        at += recv_rows[m];
    }
    pthread_barrier_wait(&mb->barrier); /* no input is reused while a member still copies it */
    return bad ? -1 : 0;
}

/* One exchange (op: the counts op or the A2A itself; a2a: the A2A it runs). */
static int lib_exchange(lib_rank *r, const cp_op *op, const cp_op *a2a)
{
    const cp_plan *p = r->plan;
    const cp_op *k = op->kind == CP_OP_A2A_COUNTS ? op : &p->ops[a2a->a2a_counts_op];
    int n = p->families[0].size, epp = k->a2a_experts, E = n * epp, key = r->rank, micro = k->micro_step;
    size_t row = (size_t)k->a2a_dim * cp_dtype_size(a2a->dtype);
    int dir = a2a->a2a_combine ? r->pairs : ++r->pairs;
    unsigned char *send = cp_hostlib_tokens(r->h, 0, 0), *recv = cp_hostlib_tokens(r->h, 0, 1);
    int64_t counts[MAX_EP * 4], peer[MAX_EP * 4];
    if (!send || !recv) return lib_fail(r, "cp_hostlib_tokens returned NULL");
    lib_draw(p, k, r->rank, r->step, counts);
    if (!a2a->a2a_combine) { /* this rank's rows out, by destination member, then expert */
        size_t at = 0;
        for (int e = 0; e < E; e++)
            for (int64_t j = 0; j < counts[e]; j++, at += row)
                for (size_t b = 0; b < row; b++) send[at + b] = lib_byte(r->rank, r->step, micro, e, j, b, dir);
        if (op->kind == CP_OP_A2A_COUNTS && cp_hostlib_set_expert_counts(r->h, 0, counts, E))
            return lib_fail(r, "%s", cp_hostlib_last_error(r->h));
        if (cp_hostlib_exchange_tokens(r->h, 0)) return lib_fail(r, "%s", cp_hostlib_last_error(r->h));
        const int64_t *got = cp_hostlib_exchange_counts(r->h, 0);
        if (!got) return lib_fail(r, "cp_hostlib_exchange_counts returned NULL after an exchange");
        for (int e = 0; e < E; e++)
            if (got[e] != counts[e])
                return lib_fail(r, "sent count %d: %lld, want %lld", e, (long long)got[e], (long long)counts[e]);
        size_t at2 = 0;
        for (int m = 0; m < n; m++) {
            lib_draw(p, k, m, r->step, peer);
            for (int le = 0; le < epp; le++) {
                int e = key * epp + le;
                r->counts_checked++;
                if (got[E + m * epp + le] != peer[e])
                    return lib_fail(r, "received count from member %d for expert %d: %lld, want %lld", m, e,
                                    (long long)got[E + m * epp + le], (long long)peer[e]);
                for (int64_t j = 0; j < peer[e]; j++, at2 += row) {
                    for (size_t b = 0; b < row; b++) {
                        unsigned char want = lib_byte(m, r->step, micro, e, j, b, dir);
                        if (recv[at2 + b] != want)
                            return lib_fail(r, "step %d micro-step %d: row %lld of expert %d from rank %d, byte %zu: "
                                            "%u, want %u", r->step, micro, (long long)j, e, m, b, recv[at2 + b], want);
                        recv[at2 + b] ^= lib_key(e); /* the experts' work */
                    }
                    r->rows_checked++;
                }
            }
        }
        return 0;
    }
    if (cp_hostlib_exchange_tokens(r->h, 0)) return lib_fail(r, "%s", cp_hostlib_last_error(r->h));
    size_t at = 0;
    for (int e = 0; e < E; e++)
        for (int64_t j = 0; j < counts[e]; j++, at += row) {
            for (size_t b = 0; b < row; b++) {
                unsigned char want = lib_byte(r->rank, r->step, micro, e, j, b, dir) ^ lib_key(e);
                if (send[at + b] != want)
                    return lib_fail(r, "step %d micro-step %d: returned row %lld of expert %d, byte %zu: %u, want %u",
                                    r->step, micro, (long long)j, e, b, send[at + b], want);
            }
            r->rows_checked++;
        }
    return 0;
}

/* The moe unit's exchanges in table order, steps times. */
static void lib_steps(lib_rank *r)
{
    const cp_plan *p = r->plan;
    int ran_with_counts = -1;
    for (r->step = 0; r->step < r->steps; r->step++) {
        r->pairs = 0;
        for (int i = 0; i < p->nops; i++) {
            const cp_op *op = &p->ops[i];
            if (op->unit != 0) continue;
            if (op->kind == CP_OP_A2A_COUNTS) {
                int j = i + 1;
                while (j < p->nops && !(p->ops[j].kind == CP_OP_A2A && p->ops[j].unit == 0)) j++;
                if (j == p->nops) { lib_fail(r, "counts op %d has no dispatch after it", i); return; }
                ran_with_counts = j;
                if (lib_exchange(r, op, &p->ops[j])) return;
            } else if (op->kind == CP_OP_A2A && i != ran_with_counts) {
                if (lib_exchange(r, op, op)) return;
            } else continue;
            r->exchanges++;
        }
    }
    r->rc = 0;
}

/* The order check: after a dispatch the token buffers are the moe unit's
 * until its combine; unit 1 ("dense") copies into bytes they share. */
static void lib_conflict(lib_rank *r)
{
    const cp_plan *p = r->plan;
    int64_t counts[MAX_EP * 4];
    r->step = 0;
    lib_draw(p, &p->ops[0], r->rank, 0, counts);
    if (cp_hostlib_unshard(r->h, 1)) { lib_fail(r, "before the dispatch: %s", cp_hostlib_last_error(r->h)); return; }
    if (cp_hostlib_set_expert_counts(r->h, 0, counts, p->units[0].a2a_experts) || cp_hostlib_exchange_tokens(r->h, 0)) {
        lib_fail(r, "%s", cp_hostlib_last_error(r->h));
        return;
    }
    if (cp_hostlib_unshard(r->h, 1) == 0) {
        lib_fail(r, "unshard between the dispatch and the combine was let through");
        return;
    }
    snprintf(r->err, sizeof r->err, "%s", cp_hostlib_last_error(r->h));
    if (cp_hostlib_exchange_tokens(r->h, 0)) { lib_fail(r, "the combine: %s", cp_hostlib_last_error(r->h)); return; }
    if (cp_hostlib_unshard(r->h, 1)) { lib_fail(r, "after the combine: %s", cp_hostlib_last_error(r->h)); return; }
    r->rc = 0;
}

/* A rank whose counts are refused (rank 1: one row past member 0's
 * capacity) still makes the exchange: it sends -1s, so every member
 * refuses the layer, the refusing rank with the line its
 * cp_hostlib_set_expert_counts gave. */
static void lib_refused(lib_rank *r)
{
    const cp_plan *p = r->plan;
    int64_t counts[MAX_EP * 4] = { 0 };
    r->step = 0;
    lib_draw(p, &p->ops[0], r->rank, 0, counts);
    if (r->rank == 1) {
        counts[0] = p->ops[0].a2a_capacity + 1;
        for (int e = 1; e < p->ops[0].a2a_experts; e++) counts[e] = 0;
    }
    /* conflict 3: the caller refuses its own counts (a value it could not pass as int64), its line with a
     * newline in it (shown as '?': one line) */
    int set = r->conflict == 3 && r->rank == 1
                  ? cp_hostlib_refuse_expert_counts(r->h, 0, "rank 1: set_expert_counts(unit 0): count for expert 0 "
                                                             "is float 2.5,\nnot a whole number of tokens")
                  : cp_hostlib_set_expert_counts(r->h, 0, counts, p->units[0].a2a_experts);
    char said[sizeof r->err];
    snprintf(said, sizeof said, "%s", cp_hostlib_last_error(r->h));
    if (cp_hostlib_exchange_tokens(r->h, 0) == 0) {
        lib_fail(r, "the exchange after counts %s was let through", set ? "refused" : "given");
        return;
    }
    if (r->rank == 1 && (set == 0 || strcmp(said, cp_hostlib_last_error(r->h)) != 0)) {
        lib_fail(r, "set_expert_counts returned %d (%s); the exchange said: %s", set, said,
                 cp_hostlib_last_error(r->h));
        return;
    }
    snprintf(r->err, sizeof r->err, "%s", cp_hostlib_last_error(r->h));
    r->rc = 0;
}

static void *lib_main(void *arg)
{
    lib_rank *r = arg;
    r->rc = -1;
    char err[256];
    if (cp_hostlib_init(&r->h, r->plan, r->rank, no_collectives, NULL, err, sizeof err)) {
        lib_fail(r, "%s", err);
        return NULL;
    }
    if (!r->no_alltoall) cp_hostlib_set_alltoall(r->h, mailbox_alltoall, r);
    if (cp_hostlib_exchange_counts(r->h, 0) != NULL) lib_fail(r, "exchange counts before any exchange");
    else if (cp_hostlib_tokens(r->h, 1, 0) != NULL && !r->conflict) lib_fail(r, "tokens of a unit out of range");
    else if (r->conflict >= 2) lib_refused(r);
    else if (r->conflict) lib_conflict(r);
    else lib_steps(r);
    cp_hostlib_destroy(r->h);
    return NULL;
}

static void lib_run(const cp_plan *p, lib_rank *ranks, int steps, int conflict)
{
    static mailbox box;
    memset(&box, 0, sizeof box);
    box.size = p->families[0].size;
    assert_int_equal(pthread_barrier_init(&box.barrier, NULL, (unsigned)box.size), 0);
    for (int r = 0; r < p->world_size; r++) {
        memset(&ranks[r], 0, sizeof ranks[r]);
        ranks[r].plan = p;
        ranks[r].box = &box;
        ranks[r].rank = r;
        ranks[r].steps = steps;
        ranks[r].conflict = conflict;
    }
    for (int r = 0; r < p->world_size; r++)
        assert_int_equal(pthread_create(&ranks[r].thread, NULL, lib_main, &ranks[r]), 0);
    for (int r = 0; r < p->world_size; r++) pthread_join(ranks[r].thread, NULL);
    pthread_barrier_destroy(&box.barrier);
}

static void test_a2a_hostlib_exchanges_in_order(void **state)
{
    (void)state;
    static ep_tables t;
    static lib_rank ranks[MAX_EP];
    /* ep 4, two experts per member, two micro-steps, bf16 rows of 6 (12 bytes) */
    build(&t, "ep4_lib", 4, 2, 2, CP_BF16, 6, 5);
    lib_run(&t.plan, ranks, 3, 0);
    long rows = 0;
    for (int r = 0; r < 4; r++) {
        if (ranks[r].rc) fprintf(stderr, "rank %d: %s\n", r, ranks[r].err);
        assert_int_equal(ranks[r].rc, 0);
        /* per step and micro-step: dispatch (with its counts), combine, and the backward's pair */
        assert_int_equal(ranks[r].exchanges, 3 * 2 * 4);
        assert_int_equal(ranks[r].a2a_calls, 3 * 2 * 5); /* each micro-step's counts once, its four token exchanges */
        assert_int_equal(ranks[r].counts_checked, 3 * 2 * 2 * 4 * 2);
        rows += ranks[r].rows_checked;
    }
    assert_true(rows > 100);
    /* ep 2, fp32, one micro-step */
    build(&t, "ep2_lib", 2, 2, 1, CP_FP32, 5, 7);
    lib_run(&t.plan, ranks, 2, 0);
    for (int r = 0; r < 2; r++) {
        if (ranks[r].rc) fprintf(stderr, "rank %d: %s\n", r, ranks[r].err);
        assert_int_equal(ranks[r].rc, 0);
        assert_int_equal(ranks[r].exchanges, 2 * 4);
    }
}

/* The recompute's exchanges (activation checkpointing) through the host
 * library: the counts given again (the forward's), the forward's three
 * exchanges again in backward, then the backward's two split by them. */
static void test_a2a_hostlib_recompute_in_order(void **state)
{
    (void)state;
    static ep_tables t;
    static lib_rank ranks[MAX_EP];
    build_tables(&t, "ep4_lib_ac", 4, 2, 2, CP_BF16, 6, 5, 1);
    lib_run(&t.plan, ranks, 2, 0);
    for (int r = 0; r < 4; r++) {
        if (ranks[r].rc) fprintf(stderr, "rank %d: %s\n", r, ranks[r].err);
        assert_int_equal(ranks[r].rc, 0);
        /* per step and micro-step: the forward's two, the recompute's two, the backward's two */
        assert_int_equal(ranks[r].exchanges, 2 * 2 * 6);
        assert_int_equal(ranks[r].a2a_calls, 2 * 2 * 8); /* the counts twice, six token exchanges */
        assert_int_equal(ranks[r].counts_checked, 2 * 2 * 3 * 4 * 2);
    }
}

/* Counts refused by cp_hostlib_set_expert_counts, the exchange made anyway:
 * refused on every member, the refusing rank saying its own line again. */
static void test_a2a_hostlib_refused_counts_said(void **state)
{
    (void)state;
    static ep_tables t;
    static lib_rank ranks[MAX_EP];
    build(&t, "ep2_refused", 2, 2, 1, CP_FP32, 5, 7);
    lib_run(&t.plan, ranks, 1, 2);
    for (int r = 0; r < 2; r++) {
        if (ranks[r].rc) fprintf(stderr, "rank %d: %s\n", r, ranks[r].err);
        assert_int_equal(ranks[r].rc, 0);
    }
    assert_string_equal(ranks[1].err, "rank 1: op 0 (a2a_counts of unit moe, micro-step 0): 8 tokens for ep member 0 "
                                      "(rank 0, experts 0..1) exceed its capacity of 7 rows: raise the plan's expert "
                                      "capacity or route fewer tokens");
    assert_non_null(strstr(ranks[0].err, "rank 0: op 0 (a2a_counts of unit moe, micro-step 0): ep member 1 (rank 1) "
                                         "refused its expert counts"));
}

/* Counts the caller refused itself (cp_hostlib_refuse_expert_counts: Python's set_expert_counts with 2.5,
 * True or 2^64 + 1), the exchange made anyway: refused on every member with the caller's line, one line. */
static void test_a2a_hostlib_caller_refusal_said(void **state)
{
    (void)state;
    static ep_tables t;
    static lib_rank ranks[MAX_EP];
    build(&t, "ep2_refused", 2, 2, 1, CP_FP32, 5, 7);
    lib_run(&t.plan, ranks, 1, 3);
    for (int r = 0; r < 2; r++) {
        if (ranks[r].rc) fprintf(stderr, "rank %d: %s\n", r, ranks[r].err);
        assert_int_equal(ranks[r].rc, 0);
    }
    assert_string_equal(ranks[1].err, "rank 1: set_expert_counts(unit 0): count for expert 0 is float 2.5,?not a "
                                      "whole number of tokens");
    assert_non_null(strstr(ranks[0].err, "rank 0: op 0 (a2a_counts of unit moe, micro-step 0): ep member 1 (rank 1) "
                                         "refused its expert counts"));
    /* a unit without all-to-alls: refused with the library's line, not recorded */
    cp_hostlib *h;
    char err[256];
    assert_int_equal(cp_hostlib_init(&h, &t.plan, 0, no_collectives, NULL, err, sizeof err), 0);
    assert_int_equal(cp_hostlib_refuse_expert_counts(h, 4, "why"), -1);
    assert_string_equal(cp_hostlib_last_error(h), "rank 0: expert counts for unit 4, outside the plan's 1 units");
    cp_hostlib_destroy(h);
}

/* Without an all-to-all callback the exchange is refused, one line. */
static void test_a2a_hostlib_without_alltoall_refused(void **state)
{
    (void)state;
    static ep_tables t;
    build(&t, "ep2", 2, 2, 1, CP_FP32, 5, 7);
    cp_hostlib *h;
    char err[256];
    assert_int_equal(cp_hostlib_init(&h, &t.plan, 0, no_collectives, NULL, err, sizeof err), 0);
    assert_null(cp_hostlib_tokens(h, 1, 0));
    assert_non_null(cp_hostlib_tokens(h, 0, 0));
    assert_null(cp_hostlib_exchange_counts(h, 0));
    int64_t c[4] = { 1, 2, 3, 4 };
    assert_int_equal(cp_hostlib_set_expert_counts(h, 0, c, 4), 0);
    assert_int_equal(cp_hostlib_exchange_tokens(h, 0), -1);
    assert_string_equal(cp_hostlib_last_error(h),
                        "rank 0: the counts all-to-all of a2a_counts of unit moe (op 0) failed: rank 0: a2a_counts "
                        "(op 0): this backend hands its collectives to a callback and was given no all-to-all for "
                        "expert parallelism's tokens (cp_hostlib_set_alltoall; --ranks has none: run --simulate of "
                        "every rank together, or NCCL)");
    assert_null(strchr(cp_hostlib_last_error(h), '\n'));
    assert_int_equal(cp_hostlib_exchange_tokens(h, 7), -1);
    assert_string_equal(cp_hostlib_last_error(h), "unit 7 is outside the plan's 1 units");
    cp_hostlib_destroy(h);
}

/* A call that would write over live token buffers: refused with arena.c's tokens line, on every rank. */
static void test_a2a_hostlib_order_checked(void **state)
{
    (void)state;
    static ep_tables t;
    static lib_rank ranks[MAX_EP];
    build(&t, "ep2_order", 2, 2, 1, CP_FP32, 5, 7);
    /* unit 1: one parameter of 8 fp32 copied into an all-gather buffer that
     * starts inside the moe unit's send buffer */
    t.units[0] = t.unit;
    t.units[1] = (cp_unit){ .name = "dense", .total = 8, .orig_dtype = CP_FP32, .ag_dtype = CP_FP32,
                            .reduce_dtype = CP_FP32, .grad_dtype = CP_FP32, .pre_divide = 1.0, .post_divide = 1.0 };
    for (int k = 0; k < CP_ARENA_BUFFERS; k++) t.units[1].arena_offset[k] = t.plan.arena_bytes;
    t.units[1].arena_offset[CP_BUF_AG] = t.unit.arena_offset[CP_BUF_A2A_SEND] + 16;
    t.plan.arena_bytes += 64;
    t.plan.units = t.units;
    t.plan.nunits = 2;
    cp_op *o = &t.ops[t.plan.nops++];
    *o = (cp_op){ .kind = CP_OP_COPY_IN, .unit = 1, .family = -1, .stream = CP_STREAM_COMPUTE, .dtype = CP_FP32,
                  .count = 8, .reduce_op = CP_SUM, .event = -1, .peer = -1, .a2a_counts_op = -1 };
    lib_run(&t.plan, ranks, 1, 1);
    for (int r = 0; r < 2; r++) {
        if (ranks[r].rc) fprintf(stderr, "rank %d: %s\n", r, ranks[r].err);
        assert_int_equal(ranks[r].rc, 0);
        assert_string_equal(ranks[r].err, "cp_hostlib_unshard(dense) would write its all-gather buffer over the "
                                          "expert-parallel send buffer of unit moe, which hold its tokens between an "
                                          "exchange and its pair: the plan's arena reuses those bytes; exchange moe's "
                                          "tokens back first (cp_gpu_exchange_tokens / cp_hostlib_exchange_tokens), in "
                                          "the order of plans/ep2_order/SCHEDULE.md");
    }
}

/* ---- activation checkpointing's recompute: the forward's exchanges again in backward ---- */

/* The harness's draws (keyed by micro-step and slot: the recompute's are
 * its forward's), every count and row checked; and the binary's path. */
static void test_a2a_recompute_drawn_counts_checked(void **state)
{
    (void)state;
    static ep_tables t;
    build_tables(&t, "ep4_ac", 4, 2, 3, CP_BF16, 6, 5, 1);
    assert_int_equal(count_kind(&t.plan, CP_OP_A2A_COUNTS), 6);
    assert_int_equal(count_kind(&t.plan, CP_OP_A2A), 18);
    static ep_rank ranks[MAX_EP];
    run_ranks(&t.plan, ranks, 2, NULL, 0);
    expect_clean(&t.plan, ranks, 2);
    cp_sim_options opt = { .steps = 2, .pattern = CP_PATTERN_UNIQUE, .arith = CP_ARITH_GLOO };
    assert_int_equal(cp_simulate(&t.plan, &opt), 0);
}

/* Counts given by the test, the forward's again in the recompute; rank
 * reroute_rank (-1: none) moves one row to another expert there. */
static int reroute_rank = -1;

static int recompute_hook(ep_rank *r, cp_executor *ex, const cp_op *op, int after)
{
    if (op->kind == CP_OP_A2A_COUNTS && !after) {
        int64_t c[8];
        given_counts(r->rank, op->micro_step, c);
        if (r->rank == reroute_rank && op->a2a_counts_op >= 0) c[0]++, c[2 * r->rank + 1]--;
        return cp_executor_set_expert_counts(ex, 0, c, 8);
    }
    return given_hook(r, ex, op, after);
}

static void test_a2a_recompute_counts_differ_refused(void **state)
{
    (void)state;
    static ep_tables t;
    build_tables(&t, "ep4_ac", 4, 2, 2, CP_FP32, 3, 6, 1);
    static ep_rank ranks[MAX_EP];
    run_ranks(&t.plan, ranks, 2, recompute_hook, 0);
    expect_clean(&t.plan, ranks, 2);
    /* rank 1 re-routes one row in the recompute: its line, every other member refuses the layer with it */
    reroute_rank = 1;
    run_ranks(&t.plan, ranks, 1, recompute_hook, 0);
    reroute_rank = -1;
    assert_int_equal(ranks[1].rc, -1);
    assert_string_equal(ranks[1].err, "rank 1: op 6 (a2a_counts of unit moe, micro-step 1): the recompute's count for "
                                      "expert 0 is 2, its forward's (op 3) 1: activation checkpointing re-routes the "
                                      "forward's tokens, so the counts given again must be the forward's");
    for (int r = 0; r < 4; r += 2) {
        assert_int_equal(ranks[r].rc, -1);
        assert_non_null(strstr(ranks[r].err, "stopped: rank 1 failed first: rank 1: op 6 (a2a_counts of unit moe, "
                                             "micro-step 1): the recompute's count for expert 0 is 2"));
    }
}

/* A recompute's forward must be an earlier forward counts op of its slot, and still fill it. */
static void test_a2a_recompute_tables_refused(void **state)
{
    (void)state;
    static ep_tables t;
    build_tables(&t, "ep2_ac", 2, 2, 2, CP_FP32, 5, 7, 1);
    /* ops: 0..5 the forward (counts 0 and 3), 6 micro-step 1's recompute counts (of 3), 11 micro-step 0's (of 0) */
    assert_int_equal(t.ops[6].a2a_counts_op, 3);
    assert_int_equal(t.ops[11].a2a_counts_op, 0);
    cp_host_world *w = cp_host_world_create(&t.plan);
    cp_backend b;
    cp_host_backend_init(&b, w, 0);
    cp_executor ex;
    memset(&ex, 0, sizeof ex);
    ex.quiet = 1;
    assert_int_equal(cp_executor_init(&ex, &t.plan, 0, &b), 0);
    /* run before its forward filled the slot */
    assert_int_equal(cp_executor_run_op(&ex, &t.ops[6]), -1);
    assert_non_null(strstr(ex.err, "rank 0: op 6 (a2a_counts of unit moe, micro-step 1) recomputes op 3's counts, "
                                   "which slot 1 does not hold: ops ran out of the plan's order"));
    /* naming another slot's forward, then a dispatch */
    t.ops[6].a2a_counts_op = 0;
    assert_int_equal(cp_executor_run_op(&ex, &t.ops[6]), -1);
    assert_non_null(strstr(ex.err, "op 6 (a2a_counts of unit moe): a recompute names op 0 as its forward, not an "
                                   "earlier forward a2a_counts of its unit, group and slot: regenerate the plan"));
    t.ops[6].a2a_counts_op = 4;
    assert_int_equal(cp_executor_run_op(&ex, &t.ops[6]), -1);
    assert_non_null(strstr(ex.err, "a recompute names op 4 as its forward"));
    /* naming a later op, or another recompute */
    t.ops[6].a2a_counts_op = 11;
    assert_int_equal(cp_executor_run_op(&ex, &t.ops[6]), -1);
    assert_non_null(strstr(ex.err, "a recompute names op 11 as its forward"));
    t.ops[6].a2a_counts_op = 3;
    t.ops[11].a2a_counts_op = 6;
    assert_int_equal(cp_executor_run_op(&ex, &t.ops[11]), -1);
    assert_non_null(strstr(ex.err, "a recompute names op 6 as its forward"));
    cp_executor_free(&ex);
    cp_host_world_destroy(w);
}

/* Tables the executor refuses before any exchange. */
static void test_a2a_bad_tables_refused(void **state)
{
    (void)state;
    static ep_tables t;
    build(&t, "ep2", 2, 2, 1, CP_FP32, 5, 7);
    t.ops[1].a2a_counts_op = 2; /* not a counts op, and not earlier */
    static ep_rank ranks[MAX_EP];
    cp_host_world *w = cp_host_world_create(&t.plan);
    cp_backend b;
    cp_host_backend_init(&b, w, 0);
    cp_executor ex;
    memset(&ex, 0, sizeof ex);
    ex.quiet = 1;
    assert_int_equal(cp_executor_init(&ex, &t.plan, 0, &b), 0);
    assert_int_equal(cp_executor_run_op(&ex, &t.ops[1]), -1);
    assert_non_null(strstr(ex.err, "op 1 (a2a of unit moe): names op 2 as its counts, not an earlier a2a_counts"));
    cp_executor_free(&ex);
    cp_host_world_destroy(w);
    build(&t, "ep2", 2, 2, 1, CP_FP32, 5, 7);
    t.unit.a2a_numel = 2 * 7 * 5 - 1; /* one element short of 2 members x 7 rows x 5 */
    w = cp_host_world_create(&t.plan);
    cp_host_backend_init(&b, w, 0);
    memset(&ex, 0, sizeof ex);
    ex.quiet = 1;
    assert_int_equal(cp_executor_init(&ex, &t.plan, 0, &b), 0);
    ex.a2a_filled[0][0] = 0;
    assert_int_equal(cp_executor_run_op(&ex, &t.ops[1]), -1);
    assert_non_null(strstr(ex.err, "lie outside the unit's 276-byte token buffers"));
    cp_executor_free(&ex);
    cp_host_world_destroy(w);
    (void)ranks;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_a2a_bytes_and_fields),
        cmocka_unit_test(test_a2a_ep2_drawn_counts_checked),
        cmocka_unit_test(test_a2a_ep4_drawn_counts_checked),
        cmocka_unit_test(test_a2a_draws),
        cmocka_unit_test(test_a2a_uneven_zero_and_full_members),
        cmocka_unit_test(test_a2a_round_trip_exact),
        cmocka_unit_test(test_a2a_past_capacity_refused),
        cmocka_unit_test(test_a2a_simulate_overflow_refused),
        cmocka_unit_test(test_a2a_refusal_stops_other_ep_groups),
        cmocka_unit_test(test_a2a_simulate_refusal_stops_every_rank),
        cmocka_unit_test(test_a2a_wrong_offset_caught),
        cmocka_unit_test(test_a2a_set_expert_counts_checked),
        cmocka_unit_test(test_a2a_hostlib_counts_checked),
        cmocka_unit_test(test_a2a_hostlib_exchanges_in_order),
        cmocka_unit_test(test_a2a_hostlib_recompute_in_order),
        cmocka_unit_test(test_a2a_hostlib_refused_counts_said),
        cmocka_unit_test(test_a2a_hostlib_caller_refusal_said),
        cmocka_unit_test(test_a2a_hostlib_without_alltoall_refused),
        cmocka_unit_test(test_a2a_hostlib_order_checked),
        cmocka_unit_test(test_a2a_bad_tables_refused),
        cmocka_unit_test(test_a2a_recompute_drawn_counts_checked),
        cmocka_unit_test(test_a2a_recompute_counts_differ_refused),
        cmocka_unit_test(test_a2a_recompute_tables_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
