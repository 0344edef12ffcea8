/* cmocka tests for the fixed runtime: dtype conversions, rank geometry,
 * the executor over the host backend on generated plans, and mutations of
 * a plan's op list that the simulation checks must catch. */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "commplan.h"
#include "check.h"
#include "cp_hostlib.h"
#include "host.h"
#include "launch.h"
#include "simulate.h"
#include "fake_env.h"

extern const cp_plan fsdp8_uneven_plan;
extern const cp_plan hsdp2x3_bf16_plan;
extern const cp_plan hsdp4x2_fp16_plan;
extern const cp_plan llama_tiny_tp_plan;

static void test_bf16_rounding(void **state)
{
    (void)state;
    assert_int_equal(cp_float_to_bf16(1.0f), 0x3f80);
    assert_int_equal(cp_float_to_bf16(-2.0f), 0xc000);
    /* 1 + 2^-8 is a tie: rounds to even (1.0); 1 + 3*2^-8 rounds up. */
    assert_int_equal(cp_float_to_bf16(1.00390625f), 0x3f80);
    assert_int_equal(cp_float_to_bf16(1.01171875f), 0x3f82);
    float nan = cp_bf16_to_float(cp_float_to_bf16(__builtin_nanf("")));
    assert_true(nan != nan);
    for (uint32_t h = 0; h < 0x10000u; h++) {
        if ((h & 0x7f80u) == 0x7f80u && (h & 0x7fu)) continue; /* NaNs */
        assert_int_equal(cp_float_to_bf16(cp_bf16_to_float((uint16_t)h)), h);
    }
}

static void test_fp16_rounding(void **state)
{
    (void)state;
    assert_int_equal(cp_float_to_fp16(1.0f), 0x3c00);
    assert_int_equal(cp_float_to_fp16(65504.0f), 0x7bff);
    assert_int_equal(cp_float_to_fp16(65520.0f), 0x7c00);   /* rounds to inf */
    assert_int_equal(cp_float_to_fp16(0x1p-24f), 0x0001);   /* smallest subnormal */
    assert_int_equal(cp_float_to_fp16(0x1p-25f), 0x0000);   /* tie to even */
    assert_int_equal(cp_float_to_fp16(0x3p-25f), 0x0002);   /* tie to even, up */
    assert_int_equal(cp_float_to_fp16(-0x1p-14f), 0x8400);  /* smallest normal */
    for (uint32_t h = 0; h < 0x10000u; h++) {
        if ((h & 0x7c00u) == 0x7c00u && (h & 0x3ffu)) continue;
        assert_int_equal(cp_float_to_fp16(cp_fp16_to_float((uint16_t)h)), h);
    }
}

static void test_reduce_values(void **state)
{
    (void)state;
    float v[4] = { 1, 2, 3, 4 };
    assert_true(cp_reduce_values(CP_FP32, CP_SUM, v, 4) == 10.0f);
    assert_true(cp_reduce_values(CP_FP32, CP_AVG, v, 4) == 2.5f);
    float w[2] = { 257, 0 };
    assert_true(cp_reduce_values(CP_BF16, CP_SUM, w, 2) == 256.0f); /* rounded to bf16 */
}

static void test_group_geometry(void **state)
{
    (void)state;
    const cp_plan *p = &hsdp2x3_bf16_plan;
    assert_int_equal(p->shard_size, 3);
    assert_int_equal(p->replicate_size, 2);
    for (int f = 0; f < p->nfamilies; f++)
        for (int r = 0; r < p->world_size; r++) {
            int color, key;
            cp_group_of(p, f, r, &color, &key);
            assert_true(key < p->families[f].size);
            assert_int_equal(cp_group_member(p, f, color, key), r);
        }
    /* Mesh (dp_replicate=2, dp_shard=3): rank 4 is replica 1, shard 1. */
    assert_int_equal(cp_shard_rank(p, 4), 1);
    assert_int_equal(cp_replicate_rank(p, 4), 1);
    assert_int_equal(cp_group_member(p, p->replicate_family, 2, 1), 5);
}

static const cp_param *find_param(const cp_plan *p, const char *name)
{
    for (int i = 0; i < p->nparams; i++)
        if (!strcmp(p->params[i].name, name)) return &p->params[i];
    fail_msg("no parameter %s", name);
    return NULL;
}

static void test_shard_lengths(void **state)
{
    (void)state;
    const cp_plan *p = &fsdp8_uneven_plan;
    const cp_param *small = find_param(p, "blocks.0.small"); /* (3,5) over 8 */
    assert_int_equal(small->padded, 5);
    assert_int_equal(cp_param_valid(small, 2), 5);
    assert_int_equal(cp_param_valid(small, 3), 0);
    const cp_param *odd = find_param(p, "blocks.0.odd"); /* (17,3): chunk 3 rows */
    int64_t want[8] = { 9, 9, 9, 9, 9, 6, 0, 0 };
    for (int r = 0; r < 8; r++) assert_int_equal(cp_param_valid(odd, r), want[r]);
    const cp_param *cols = find_param(p, "blocks.0.cols"); /* (4,16) Shard(1): 2 columns each */
    assert_int_equal(cols->outer, 4);
    assert_int_equal(cols->run, 2);
    /* rank 3's local (row 1, col 1) is global (1, 7) = 23 */
    assert_int_equal(cp_param_global_index(cols, 8, 3, 3), 23);
}

static cp_sim_options quiet_opts(void)
{
    cp_sim_options o = { .steps = 2, .pattern = CP_PATTERN_UNIQUE, .dump_dir = NULL, .log = NULL };
    return o;
}

static void test_simulate_generated_plans(void **state)
{
    (void)state;
    cp_sim_options o = quiet_opts();
    assert_int_equal(cp_simulate(&fsdp8_uneven_plan, &o), 0);
    assert_int_equal(cp_simulate(&hsdp2x3_bf16_plan, &o), 0);
    assert_int_equal(cp_simulate(&hsdp4x2_fp16_plan, &o), 0);
    assert_int_equal(cp_simulate(&llama_tiny_tp_plan, &o), 0);
}

/* A mutable copy of a plan whose op list a test may edit. */
typedef struct {
    cp_plan plan;
    cp_op *ops;
} plan_copy;

static plan_copy copy_plan(const cp_plan *src)
{
    plan_copy c = { .plan = *src };
    c.ops = malloc((size_t)src->nops * sizeof *c.ops);
    assert_non_null(c.ops);
    memcpy(c.ops, src->ops, (size_t)src->nops * sizeof *c.ops);
    c.plan.ops = c.ops;
    /* One TP class, the copy's own (ranks view classes[c] otherwise). */
    c.plan.classes = NULL;
    c.plan.nclasses = 0;
    return c;
}

static void drop_op(plan_copy *c, int i)
{
    memmove(&c->ops[i], &c->ops[i + 1], (size_t)(c->plan.nops - i - 1) * sizeof *c->ops);
    c->plan.nops--;
}

static int find_op(const plan_copy *c, cp_op_kind kind, int nth)
{
    for (int i = 0; i < c->plan.nops; i++)
        if (c->ops[i].kind == kind && nth-- == 0) return i;
    fail_msg("op not found");
    return -1;
}

static void test_missing_all_gather_is_caught(void **state)
{
    (void)state;
    /* Dropped with its event: the copy-out's wait names a slot no op of
     * the step recorded, which the host backend refuses (on a GPU that
     * wait would order nothing). */
    plan_copy c = copy_plan(&hsdp2x3_bf16_plan);
    drop_op(&c, find_op(&c, CP_OP_ALL_GATHER, 1));
    cp_sim_options o = quiet_opts();
    assert_int_equal(cp_simulate(&c.plan, &o), 2);
    free(c.ops);
    /* Issued locally instead (its events kept): peers' slots hold stale
     * data, which the exact checks of the unsharded params catch. */
    c = copy_plan(&hsdp2x3_bf16_plan);
    c.ops[find_op(&c, CP_OP_ALL_GATHER, 1)].family = -1;
    assert_int_equal(cp_simulate(&c.plan, &o), 1);
    free(c.ops);
}

/* A plan whose ranks all run one TP class's tables (mutations edit them). */
static plan_copy copy_class(const cp_plan *src, int c)
{
    cp_plan view = *src;
    view.units = src->classes[c].units;
    view.params = src->classes[c].params;
    view.ops = src->classes[c].ops;
    view.waits = src->classes[c].waits;
    view.nwaits = src->classes[c].nwaits;
    view.nevents = src->classes[c].nevents;
    view.arena_bytes = src->classes[c].arena_bytes;
    return copy_plan(&view);
}

static void test_tp_activation_collectives_are_checked(void **state)
{
    (void)state;
    cp_sim_options o = quiet_opts();
    /* The tiny Llama on HSDP + TP has two TP classes; its TP ranks run different tables. */
    assert_int_equal(llama_tiny_tp_plan.nclasses, 2);
    assert_int_equal(llama_tiny_tp_plan.tp_size, 2);
    const cp_tp_class *k0 = &llama_tiny_tp_plan.classes[0], *k1 = &llama_tiny_tp_plan.classes[1];
    int differ = 0;
    for (int u = 0; u < llama_tiny_tp_plan.nunits; u++) differ |= k0->units[u].numel != k1->units[u].numel;
    assert_true(differ);
    /* A TP gather issued locally instead: peers' sequence shards stay stale. */
    const cp_op_kind kinds[] = { CP_OP_TP_ALL_GATHER, CP_OP_TP_REDUCE_SCATTER };
    for (int k = 0; k < 2; k++) {
        plan_copy c = copy_class(&llama_tiny_tp_plan, 0);
        c.ops[find_op(&c, kinds[k], 1)].family = -1;
        assert_int_equal(cp_simulate(&c.plan, &o), 1);
        free(c.ops);
    }
}

/* ChunkedLossWrapper's partial reductions (llama_tiny_tp: the [norm,
 * lm_head] unit's lm_head reduced in the loss, its norm in the backward):
 * the n-th op of a kind with a part of first parameter `first`. */
static int find_part_op(const plan_copy *c, cp_op_kind kind, int first)
{
    for (int i = 0; i < c->plan.nops; i++)
        if (c->ops[i].kind == kind && c->ops[i].part_count > 0 && c->ops[i].part_first == first) return i;
    fail_msg("part op not found");
    return -1;
}

static void test_partial_reduction_is_checked(void **state)
{
    (void)state;
    cp_sim_options o = quiet_opts();
    plan_copy c = copy_class(&llama_tiny_tp_plan, 0);
    assert_int_equal(cp_simulate(&c.plan, &o), 0);
    free(c.ops);
    /* lm_head's view-out written at the norm's offset: wrong reduced grads */
    c = copy_class(&llama_tiny_tp_plan, 0);
    c.ops[find_part_op(&c, CP_OP_VIEW_OUT, 1)].part_first = 0;
    assert_int_equal(cp_simulate(&c.plan, &o), 1);
    free(c.ops);
    /* lm_head's packing as the norm's: its reduce-scatter reduces the wrong rows */
    c = copy_class(&llama_tiny_tp_plan, 0);
    c.ops[find_part_op(&c, CP_OP_PACK, 1)].part_first = 0;
    assert_int_equal(cp_simulate(&c.plan, &o), 1);
    free(c.ops);
    /* a part past the unit's parameters, and a part's collective of the whole unit's count: refused */
    c = copy_class(&llama_tiny_tp_plan, 0);
    c.ops[find_part_op(&c, CP_OP_PACK, 1)].part_count = 2;
    assert_int_equal(cp_simulate(&c.plan, &o), 2);
    free(c.ops);
    c = copy_class(&llama_tiny_tp_plan, 0);
    int rs = find_part_op(&c, CP_OP_REDUCE_SCATTER, 1);
    c.ops[rs].count = c.plan.units[c.ops[rs].unit].total;
    assert_int_equal(cp_simulate(&c.plan, &o), 2);
    free(c.ops);
    /* a part on an op that takes none (an all-gather): refused */
    c = copy_class(&llama_tiny_tp_plan, 0);
    int ag = find_op(&c, CP_OP_ALL_GATHER, 0);
    c.ops[ag].part_first = 0;
    c.ops[ag].part_count = 1;
    assert_int_equal(cp_simulate(&c.plan, &o), 2);
    free(c.ops);
}

static void test_wait_on_unrecorded_event_is_refused(void **state)
{
    (void)state;
    /* An op that records an event stops recording it: its waiter's wait is refused. */
    plan_copy c = copy_plan(&fsdp8_uneven_plan);
    int i = 0;
    while (i < c.plan.nops && c.ops[i].event < 0) i++;
    assert_true(i < c.plan.nops);
    c.ops[i].event = -1;
    cp_sim_options o = quiet_opts();
    assert_int_equal(cp_simulate(&c.plan, &o), 2);
    free(c.ops);
}

static void test_wrong_reduce_op_is_caught(void **state)
{
    (void)state;
    plan_copy c = copy_plan(&fsdp8_uneven_plan);
    c.ops[find_op(&c, CP_OP_REDUCE_SCATTER, 0)].reduce_op = CP_SUM;
    cp_sim_options o = quiet_opts();
    assert_int_equal(cp_simulate(&c.plan, &o), 1);
    free(c.ops);
}

/* FSDP2's default over two micro-steps (fsdp8_uneven): the second
 * reduction's view-out assigning instead of adding drops the first
 * micro-step's gradient, and a first view-out adding reads the poisoned
 * sharded grads: the exact checks catch both. */
static void test_view_out_add_is_checked(void **state)
{
    (void)state;
    cp_sim_options o = quiet_opts();
    plan_copy c = copy_plan(&fsdp8_uneven_plan);
    c.ops[find_op(&c, CP_OP_VIEW_OUT_ADD, 0)].kind = CP_OP_VIEW_OUT;
    assert_int_equal(cp_simulate(&c.plan, &o), 1);
    free(c.ops);
    c = copy_plan(&fsdp8_uneven_plan);
    c.ops[find_op(&c, CP_OP_VIEW_OUT, 0)].kind = CP_OP_VIEW_OUT_ADD;
    assert_int_equal(cp_simulate(&c.plan, &o), 1);
    free(c.ops);
}

static void test_missing_all_reduce_is_caught(void **state)
{
    (void)state;
    plan_copy c = copy_plan(&hsdp2x3_bf16_plan);
    drop_op(&c, find_op(&c, CP_OP_ALL_REDUCE, 2));
    cp_sim_options o = quiet_opts();
    assert_int_equal(cp_simulate(&c.plan, &o), 1);
    free(c.ops);
}

static void test_compute_on_resharded_params_fails(void **state)
{
    (void)state;
    plan_copy c = copy_plan(&fsdp8_uneven_plan);
    drop_op(&c, find_op(&c, CP_OP_COPY_OUT, 1)); /* forward of blocks.0 without its copy-out */
    cp_sim_options o = quiet_opts();
    assert_int_equal(cp_simulate(&c.plan, &o), 2);
    free(c.ops);
}


/* ---- FSDP2's gradient arithmetic on hand-built one-rank plans ----
 * One unit, one parameter of 4 elements, run by the executor over the host
 * backend: copy-in, all-gather and copy-out, a backward per micro-step
 * (the test's callback writes the grads), packing, the (one-rank)
 * reduce-scatter and the view-out. FSDP2's foreach_reduce casts the grads
 * to reduce_dtype, pre-divides there, reduces, post-divides there and only
 * then casts to the parameter's dtype; expected values are worked out by
 * hand from that, not by the code under test. */
enum { HAND_NUMEL = 4 };

static const cp_group_family hand_families[1] = { { .name = "world", .axis_mask = 0x1u, .size = 1 } };
static const cp_param hand_params[1] = { { .name = "w", .ndim = 1, .shape = { HAND_NUMEL }, .numel = HAND_NUMEL,
                                           .chunk = HAND_NUMEL, .outer = 1, .run = HAND_NUMEL,
                                           .padded = HAND_NUMEL } };

static cp_unit hand_unit(cp_dtype orig, cp_dtype ag, cp_dtype reduce, cp_dtype grad, double pre, double post)
{
    cp_unit u = { .name = "u", .first_param = 0, .nparams = 1, .total = HAND_NUMEL, .numel = HAND_NUMEL,
                  .grads_numel = 8, .orig_dtype = orig, .ag_dtype = ag, .reduce_dtype = reduce, .grad_dtype = grad,
                  .is_root = 1, .rs_op = CP_SUM, .ar_op = CP_SUM, .pre_divide = pre, .post_divide = post,
                  /* every buffer apart (act unused) */
                  .arena_offset = { [CP_BUF_AG] = 0, [CP_BUF_UNSHARDED] = 256, [CP_BUF_GRADS] = 512,
                                    [CP_BUF_RS_IN] = 768, [CP_BUF_RS_OUT] = 1024, [CP_BUF_ACT] = 0 } };
    return u;
}

/* The step of a one-rank plan with `micro` micro-steps: unshard once, a
 * forward and a backward per micro-step, then reshard and reduce; with
 * every, FSDP2's default: a reduction after each backward, the later ones
 * adding into the sharded grads (view_out_add). */
static void hand_reduce(cp_op *ops, int *n, int m, const cp_unit *u, int add)
{
    ops[(*n)++] = (cp_op){ .kind = CP_OP_PACK, .family = -1, .stream = CP_STREAM_COMPUTE, .micro_step = m, .event = -1 };
    ops[(*n)++] = (cp_op){ .kind = CP_OP_REDUCE_SCATTER, .family = -1, .stream = CP_STREAM_COMPUTE,
                           .dtype = u->reduce_dtype, .count = u->total, .micro_step = m, .event = -1 };
    ops[(*n)++] = (cp_op){ .kind = add ? CP_OP_VIEW_OUT_ADD : CP_OP_VIEW_OUT, .family = -1, .stream = CP_STREAM_COMPUTE,
                           .micro_step = m, .event = -1 };
}

static int hand_ops_mode(cp_op *ops, int micro, const cp_unit *u, int every)
{
    int n = 0;
    ops[n++] = (cp_op){ .kind = CP_OP_COPY_IN, .family = -1, .stream = CP_STREAM_COPY_IN, .event = -1 };
    ops[n++] = (cp_op){ .kind = CP_OP_ALL_GATHER, .family = -1, .stream = CP_STREAM_COPY_IN, .dtype = u->ag_dtype,
                        .count = u->total, .event = -1 };
    ops[n++] = (cp_op){ .kind = CP_OP_COPY_OUT, .family = -1, .stream = CP_STREAM_COMPUTE, .event = -1 };
    for (int m = 0; m < micro; m++) {
        ops[n++] = (cp_op){ .kind = CP_OP_FORWARD, .family = -1, .stream = CP_STREAM_COMPUTE, .micro_step = m,
                            .event = -1 };
        ops[n++] = (cp_op){ .kind = CP_OP_BACKWARD, .family = -1, .stream = CP_STREAM_COMPUTE, .micro_step = m,
                            .event = -1 };
        if (every) hand_reduce(ops, &n, m, u, m > 0);
    }
    ops[n++] = (cp_op){ .kind = CP_OP_RESHARD, .family = -1, .stream = CP_STREAM_COMPUTE, .micro_step = micro - 1,
                        .event = -1 };
    if (!every) hand_reduce(ops, &n, micro - 1, u, 0);
    return n;
}
static int hand_ops(cp_op *ops, int micro, const cp_unit *u) { return hand_ops_mode(ops, micro, u, 0); }
static int hand_ops_every(cp_op *ops, int micro, const cp_unit *u) { return hand_ops_mode(ops, micro, u, 1); }

static cp_plan hand_plan(const cp_unit *u, cp_op *ops, int micro)
{
    cp_plan p = { .name = "hand", .fingerprint = "0", .world_size = 1, .mesh_ndim = 1, .mesh_names = { "dp_shard" },
                  .mesh_sizes = { 1 }, .shard_size = 1, .replicate_size = 1, .shard_family = -1,
                  .replicate_family = -1, .micro_steps = micro, .nunits = 1, .units = u, .nparams = 1,
                  .params = hand_params, .nfamilies = 1, .families = hand_families, .ops = ops,
                  .arena_bytes = 1280, .tp_size = 1, .tp_mesh_dim = -1 };
    p.nops = hand_ops(ops, micro, u);
    return p;
}

/* Runs one step of a one-rank plan (shards zero) with `backward` as the
 * compute callback; the unit's sharded grads as floats into out. */
static void run_hand_plan(const cp_plan *p, cp_compute_fn backward, void *user, float out[HAND_NUMEL])
{
    cp_host_world *w = cp_host_world_create(p);
    assert_non_null(w);
    cp_backend b;
    cp_host_backend_init(&b, w, 0);
    cp_executor ex = { .quiet = 0 };
    assert_int_equal(cp_executor_init(&ex, p, 0, &b), 0);
    ex.on_compute = backward;
    ex.user = user;
    unsigned char zeros[HAND_NUMEL * 4] = { 0 }, got[HAND_NUMEL * 4];
    assert_int_equal(cp_executor_write(&ex, CP_STREAM_COMPUTE, 0, CP_BUF_SHARDED, zeros), 0);
    assert_int_equal(cp_executor_step(&ex), 0);
    assert_int_equal(cp_executor_read(&ex, CP_STREAM_COMPUTE, 0, CP_BUF_SHARDED_GRADS, got), 0);
    for (int i = 0; i < HAND_NUMEL; i++) out[i] = cp_load(p->units[0].orig_dtype, got, i);
    cp_executor_free(&ex);
    cp_host_world_destroy(w);
}

static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

#define assert_float_bits(got, want)                                                                                   \
    do {                                                                                                               \
        float g_ = (got), w_ = (want);                                                                                 \
        if (f32_bits(g_) != f32_bits(w_))                                                                              \
            fail_msg("%s = %.12g (0x%08x), want %.12g (0x%08x)", #got, (double)g_, f32_bits(g_), (double)w_,          \
                     f32_bits(w_));                                                                                    \
    } while (0)

/* The backward writes these fp32 grads (one micro-step). */
static int write_fixed_grads(void *user, cp_executor *ex, const cp_op *op)
{
    if (op->kind != CP_OP_BACKWARD) return 0;
    return cp_executor_write(ex, op->stream, op->unit, CP_BUF_GRADS, user);
}

/* fp32 parameter and grads reduced in fp16 over 6 data-parallel ranks:
 * FSDP2 pre-divides by 4 and post-divides by 1.5 (_get_gradient_divide_factors).
 * One rank stands in for the sum (the reduce-scatter of one rank is the identity). */
static void test_divides_in_reduce_dtype_then_cast(void **state)
{
    (void)state;
    cp_unit u = hand_unit(CP_FP32, CP_FP32, CP_FP16, CP_FP32, 4.0, 1.5);
    cp_op ops[16];
    cp_plan p = hand_plan(&u, ops, 1);
    const float grads[8] = {
        4.0f,         /* fp16 1.0 after the pre-divide; 1.0 / 1.5 in fp16 is 0x1.554p-1 = 0.66650390625
                       * (the issue's example; dividing in fp32 and rounding once gave 0.6666666865) */
        6.0f,         /* 1.5, then exactly 1.0 */
        0x1.017p-14f, /* 1029.75 * 2^-24: cast to fp16 first (1030 units of 2^-24), / 4 = 257.5 units, a tie in
                       * fp16's subnormals: 258 units; / 1.5 = 172 units exactly = 0x1.58p-17
                       * (divided before the cast: 257 units, then 171.33 units in fp32) */
        131072.0f,    /* beyond fp16: inf before the pre-divide can help, as FSDP2 casts first */
    };
    float got[HAND_NUMEL];
    run_hand_plan(&p, write_fixed_grads, (void *)grads, got);
    assert_float_bits(got[0], 0.66650390625f);
    assert_float_bits(got[1], 1.0f);
    assert_float_bits(got[2], 0x1.58p-17f);
    assert_float_bits(got[3], __builtin_inff());
}

/* bf16 grads 1, 2^-8, 2^-8 over three micro-steps, reduced in fp32 into
 * a bf16 parameter's grads. The backward writes each micro-step's grad as
 * the caller's contract says: assigned in the grad dtype after a
 * reduction (or at the step's start), added in it otherwise. */
typedef struct {
    const float *g; /* per micro-step, the same for every element */
    cp_dtype grad_dtype;
    int every;
} micro_grads;

static int write_micro_grads(void *user, cp_executor *ex, const cp_op *op)
{
    const micro_grads *mg = user;
    if (op->kind != CP_OP_BACKWARD) return 0;
    unsigned char buf[8 * 4];
    int fresh = op->micro_step == 0 || mg->every;
    if (!fresh && cp_executor_read(ex, op->stream, op->unit, CP_BUF_GRADS, buf)) return -1;
    float g = mg->g[op->micro_step];
    for (int i = 0; i < HAND_NUMEL; i++) cp_store(mg->grad_dtype, buf, i, fresh ? g : cp_load(mg->grad_dtype, buf, i) + g);
    return cp_executor_write(ex, op->stream, op->unit, CP_BUF_GRADS, buf);
}

/* FSDP2's default reduces after every backward and adds each result into
 * the sharded grad in the parameter's dtype: 1 + 2^-8 is a tie in bf16
 * (rounds to 1), twice: 1.0. With set_requires_gradient_sync(False) the
 * unsharded grads accumulate in fp32 to 1 + 2^-7, exact in bf16: 1.0078125. */
static void test_fsdp2_default_adds_each_reduction(void **state)
{
    (void)state;
    static const float g[3] = { 1.0f, 0x1p-8f, 0x1p-8f };
    float got[HAND_NUMEL];
    cp_op ops[32];
    /* FSDP2's default: reductions every micro-step, the grads buffer in bf16 */
    cp_unit u = hand_unit(CP_BF16, CP_BF16, CP_FP32, CP_BF16, 1.0, 1.0);
    cp_plan p = hand_plan(&u, ops, 3);
    p.nops = hand_ops_every(ops, 3, &u);
    micro_grads every = { g, CP_BF16, 1 };
    run_hand_plan(&p, write_micro_grads, &every, got);
    for (int i = 0; i < HAND_NUMEL; i++) assert_float_bits(got[i], 1.0f);
    /* set_requires_gradient_sync(False) before the last: fp32 accumulation, one reduction */
    u = hand_unit(CP_BF16, CP_BF16, CP_FP32, CP_FP32, 1.0, 1.0);
    p = hand_plan(&u, ops, 3);
    micro_grads last = { g, CP_FP32, 0 };
    run_hand_plan(&p, write_micro_grads, &last, got);
    for (int i = 0; i < HAND_NUMEL; i++) assert_float_bits(got[i], 1.0078125f);
}

/* What the simulation's backward does (the harness's): the checker's
 * pattern grads into the grads buffer, accumulated on later micro-steps. */
static int checker_backward(void *user, cp_executor *ex, const cp_op *op)
{
    cp_checker *c = user;
    if (op->kind != CP_OP_BACKWARD) return 0;
    unsigned char buf[8 * 4];
    if (op->micro_step > 0 && cp_executor_read(ex, op->stream, op->unit, CP_BUF_GRADS, buf)) return -1;
    cp_checker_add_grads(c, op->unit, op->micro_step, buf);
    return cp_executor_write(ex, op->stream, op->unit, CP_BUF_GRADS, buf);
}

static float bf16_round(double v) { return cp_bf16_to_float(cp_float_to_bf16((float)v)); }

/* Micro-steps accumulate the unsharded grads in reduce_dtype (torch 2.15:
 * the unsharded parameter's grad_dtype, so AccumulateGrad casts each
 * backward's gradient to it and adds in it): bf16 grads summed in fp32 (the
 * casts exact), and fp32 grads with a bf16 reduce_dtype each rounded to
 * bf16, then summed in bf16. Expected: worked out here from the pattern's
 * per-micro-step grads in double, rounded as stated; the simulation's
 * 16-bit pattern makes odd micro-steps 64 times smaller so that bf16 sums
 * must round. */
static void test_micro_steps_accumulate_in_reduce_dtype(void **state)
{
    (void)state;
    const struct {
        cp_dtype ag, reduce;
    } cases[2] = { { CP_BF16, CP_FP32 }, { CP_FP32, CP_BF16 } };
    for (int k = 0; k < 2; k++) {
        cp_dtype ag = cases[k].ag, red = cases[k].reduce;
        cp_unit u = hand_unit(CP_FP32, ag, red, red, 1.0, 1.0);
        cp_op ops[16];
        cp_plan p = hand_plan(&u, ops, 2);
        assert_int_equal(cp_arena_buffer_bytes(&p, 0, CP_BUF_GRADS), 8 * (int64_t)cp_dtype_size(red));
        cp_checker c;
        assert_int_equal(cp_checker_init(&c, &p, CP_PATTERN_UNIQUE, 0), 0);
        float got[HAND_NUMEL];
        run_hand_plan(&p, checker_backward, &c, got);
        int rounds_in_ag = 0;
        for (int e = 0; e < HAND_NUMEL; e++) {
            double g[2];
            for (int m = 0; m < 2; m++) {
                float v = cp_pattern_grad(CP_PATTERN_UNIQUE, ag, 0, e, 0, m, 0);
                g[m] = ag == CP_BF16 ? bf16_round(v) : v;
            }
            /* fp32 sum of two bf16 values < 2^16 apart in scale: exact in a double, and in fp32 here. */
            float want = red == CP_FP32 ? (float)(g[0] + g[1]) : bf16_round(bf16_round(g[0]) + bf16_round(g[1]));
            if (red == CP_FP32) assert_true((double)want == g[0] + g[1]);
            assert_float_bits(got[e], want);
            rounds_in_ag += ag == CP_BF16 && bf16_round(g[0] + g[1]) != want;
        }
        /* The case is sensitive: accumulating in bf16 would have rounded. */
        if (ag == CP_BF16) assert_true(rounds_in_ag > 0);
        assert_int_equal(c.mismatches, 0);
        cp_checker_free(&c);
    }
}

/* ---- NCCL's ring all-reduce positions in the checker ----
 * HSDP over 3 replicas (one shard each), one fp32 unit of 16 elements,
 * AVG: ncclAvg's float(1/3) premultiply makes the bits depend on the ring
 * position that finishes each element, which NCCL's run-time channel and
 * chunk split decides. The checker must take the bits of every position a
 * split can give an element, and no other. */
enum { REP3_NUMEL = 16 };
static const cp_group_family rep3_families[1] = { { .name = "dp_replicate", .axis_mask = 0x1u, .size = 3 } };
static const cp_param rep3_params[1] = { { .name = "w", .ndim = 1, .shape = { REP3_NUMEL }, .numel = REP3_NUMEL,
                                           .chunk = REP3_NUMEL, .outer = 1, .run = REP3_NUMEL,
                                           .padded = REP3_NUMEL } };
static const cp_unit rep3_units[1] = { { .name = "u", .first_param = 0, .nparams = 1, .total = REP3_NUMEL,
                                         .numel = REP3_NUMEL, .grads_numel = REP3_NUMEL, .orig_dtype = CP_FP32,
                                         .ag_dtype = CP_FP32, .reduce_dtype = CP_FP32, .grad_dtype = CP_FP32,
                                         .is_root = 1, .rs_op = CP_AVG, .ar_op = CP_AVG, .pre_divide = 1.0,
                                         .post_divide = 1.0 } };
static const cp_op rep3_ops[2] = {
    { .kind = CP_OP_PACK, .family = -1, .stream = CP_STREAM_COMPUTE, .event = -1 },
    { .kind = CP_OP_ALL_REDUCE, .family = 0, .stream = CP_STREAM_ALL_REDUCE, .dtype = CP_FP32, .count = REP3_NUMEL,
      .reduce_op = CP_AVG, .event = -1 },
};
static const cp_plan rep3_plan = { .name = "rep3", .fingerprint = "0", .world_size = 3, .mesh_ndim = 1,
                                   .mesh_names = { "dp_replicate" }, .mesh_sizes = { 3 }, .shard_size = 1,
                                   .replicate_size = 3, .shard_family = -1, .replicate_family = 0, .micro_steps = 1,
                                   .nunits = 1, .units = rep3_units, .nparams = 1, .params = rep3_params,
                                   .nfamilies = 1, .families = rep3_families, .nops = 2, .ops = rep3_ops,
                                   .tp_size = 1, .tp_mesh_dim = -1 };

/* Rank 0's reduced grad of element i as NCCL computes it when ring position
 * `key` finishes it: the three replicas' pattern grads, ncclAvg's chain. */
static float rep3_value(int step, int64_t i, int key)
{
    float g[3];
    for (int q = 0; q < 3; q++) g[q] = cp_pattern_grad(CP_PATTERN_UNIQUE, CP_FP32, 0, i, q, 0, step);
    return cp_reduce_values_nccl(CP_FP32, CP_AVG, g, 3, key);
}

static long rep3_mismatches(int step, const int *key)
{
    float got[REP3_NUMEL];
    for (int i = 0; i < REP3_NUMEL; i++) got[i] = rep3_value(step, i, key[i]);
    cp_checker c;
    assert_int_equal(cp_checker_init(&c, &rep3_plan, CP_PATTERN_UNIQUE, 0), 0);
    c.step = step;
    cp_checker_check_grads(&c, 0, got);
    long m = c.mismatches;
    cp_checker_free(&c);
    return m;
}

static void test_checker_takes_every_nccl_ring_split(void **state)
{
    (void)state;
    /* Positions NCCL gives (tests/c/test_arith.c runs its runRing): one
     * channel, one loop (chunks of 8: the checker's first guess); two
     * channels of 8 (chunks of 4); one channel with 16-byte chunks (a loop
     * of 12, then 4 elements on position 0). */
    static const int one[REP3_NUMEL] = { 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1 };
    static const int two[REP3_NUMEL] = { 0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1 };
    static const int small[REP3_NUMEL] = { 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 0, 0, 0, 0 };
    int sensitive = 0;
    for (int step = 0; step < 4; step++) {
        for (int i = 0; i < REP3_NUMEL; i++)
            sensitive += f32_bits(rep3_value(step, i, one[i])) != f32_bits(rep3_value(step, i, small[i]));
        assert_int_equal(rep3_mismatches(step, one), 0);
        assert_int_equal(rep3_mismatches(step, two), 0);
        assert_int_equal(rep3_mismatches(step, small), 0);
    }
    assert_true(sensitive > 0); /* the splits do show in the bits */
    /* The first 16 bytes always finish on position 0 (every chunk starts a
     * multiple of 16 bytes into the buffer): position 2's bits there are
     * wrong gradients. */
    int step = -1, at = -1;
    for (int s = 0; s < 16 && at < 0; s++)
        for (int i = 0; i < 4 && at < 0; i++)
            if (f32_bits(rep3_value(s, i, 2)) != f32_bits(rep3_value(s, i, 0)) &&
                f32_bits(rep3_value(s, i, 2)) != f32_bits(rep3_value(s, i, 1)))
                step = s, at = i;
    assert_true(at >= 0);
    int wrong[REP3_NUMEL];
    memcpy(wrong, one, sizeof wrong);
    wrong[at] = 2;
    assert_int_equal(rep3_mismatches(step, wrong), 1);
}

/* ---- the library's call order (arena.c) ----
 * The plan's step as library calls, in the order they may be made: each
 * call is one unit's instance of an op group, made once its last op may be
 * issued, so ordered by its last op (python/commplan/runtime.py
 * library_calls, which CommplanFSDP enforces). */
typedef struct {
    int call, unit, last;
} call_inst;

static const cp_op_kind *const CALL_KINDS[3] = { cp_call_unshard, cp_call_reshard, cp_call_reduce };
static const int CALL_NKINDS[3] = { 4, 2, 10 }; /* (reshard: reshard_after_forward = k's post_forward copy, then the reshard) */
static const char *const CALL_NAMES[3] = { "unshard", "reshard", "reduce" };

static int by_last(const void *a, const void *b)
{
    return ((const call_inst *)a)->last - ((const call_inst *)b)->last;
}

static int plan_calls(const cp_plan *p, call_inst *out, int cap)
{
    int n = 0, open[64][3], at[64][3];
    assert_true(p->nunits <= 64);
    for (int u = 0; u < p->nunits; u++)
        for (int c = 0; c < 3; c++) open[u][c] = -1;
    for (int i = 0; i < p->nops; i++) {
        const cp_op *o = &p->ops[i];
        for (int c = 0; c < 3; c++) {
            int k = 0;
            while (k < CALL_NKINDS[c] && CALL_KINDS[c][k] != o->kind) k++;
            if (k == CALL_NKINDS[c]) continue;
            int *cur = &open[o->unit][c];
            if (k == 0 || *cur < 0 || k < at[o->unit][c]) {
                assert_true(n < cap);
                out[n] = (call_inst){ c, o->unit, i };
                *cur = n++;
            } else
                out[*cur].last = i;
            at[o->unit][c] = k;
            if (k == CALL_NKINDS[c] - 1) *cur = -1;
        }
    }
    qsort(out, (size_t)n, sizeof *out, by_last);
    return n;
}

static int run_nothing(void *ctx, const cp_op *op)
{
    (void)ctx;
    (void)op;
    return 0;
}

/* Two steps of plan p's calls in the plan's order through the order check:
 * every call accepted, and every buffer free at each step's end. */
static void library_order_accepted(const cp_plan *p)
{
    call_inst calls[512];
    int n = plan_calls(p, calls, 512), cursor[64][3] = { { 0 } };
    unsigned live[64] = { 0 };
    for (int step = 0; step < 2; step++) {
        for (int i = 0; i < n; i++) {
            const call_inst *c = &calls[i];
            cp_call_effect e;
            int *cur = &cursor[c->unit][c->call];
            cp_call_effect_of(p, c->unit, CALL_KINDS[c->call], CALL_NKINDS[c->call], *cur, &e);
            assert_int_equal(e.last, c->last); /* the library runs this very instance */
            int wrote = -1, held = -1, v = cp_call_conflict(p, c->unit, &e, live, &wrote, &held);
            if (v >= 0) {
                char m[600];
                cp_call_conflict_message(p, CALL_NAMES[c->call], c->unit, v, wrote, held, m, sizeof m);
                fail_msg("plan %s, call %d of the step: %s", p->name, i, m);
            }
            cp_call_apply(&e, &live[c->unit]);
            assert_int_equal(cp_run_call(p, c->unit, CALL_KINDS[c->call], CALL_NKINDS[c->call], cur, run_nothing,
                                         NULL), 0);
        }
        for (int u = 0; u < p->nunits; u++)
            if (live[u]) fail_msg("plan %s: unit %s still holds buffers 0x%x at the step's end", p->name,
                                  p->units[u].name, live[u]);
    }
}

static void test_library_order_of_plans(void **state)
{
    (void)state;
    const cp_plan *plans[] = { &fsdp8_uneven_plan, &hsdp2x3_bf16_plan, &hsdp4x2_fp16_plan, &llama_tiny_tp_plan };
    for (size_t i = 0; i < sizeof plans / sizeof plans[0]; i++)
        for (int r = 0; r < plans[i]->world_size; r++) { /* every TP class's tables */
            cp_plan view;
            cp_plan_view(plans[i], r, &view);
            library_order_accepted(&view);
        }
    /* Arena buffer sizes are the executor's. */
    const cp_unit *U = &hsdp2x3_bf16_plan.units[0];
    assert_int_equal(cp_arena_buffer_bytes(&hsdp2x3_bf16_plan, 0, CP_BUF_RS_OUT),
                     U->total * (int64_t)cp_dtype_size(U->reduce_dtype));
}

/* Whether unit u's buffer ku and unit v's kv share arena bytes. */
static int bytes_meet(const cp_plan *p, int u, cp_arena_buffer ku, int v, cp_arena_buffer kv)
{
    int64_t a = p->units[u].arena_offset[ku], na = cp_arena_buffer_bytes(p, u, ku);
    int64_t b = p->units[v].arena_offset[kv], nb = cp_arena_buffer_bytes(p, v, kv);
    return na > 0 && nb > 0 && a < b + nb && b < a + na;
}

/* Unsharded gradients hold data from the unshard before their backward to
 * their reduction: llama_tiny_tp's arena gives tok_embeddings' grads bytes
 * that layers.0's unsharded parameters use earlier in the step. After tok_embeddings' backward and reshard, before its
 * reduction, a second unshard of layers.0 (a recompute the plan does not
 * have) would overwrite those grads: refused, though no unit is unsharded
 * any more (the old check saw unsharded parameters only). */
static void test_library_order_guards_grads(void **state)
{
    (void)state;
    cp_plan view;
    cp_plan_view(&llama_tiny_tp_plan, 0, &view);
    const cp_plan *p = &view;
    int tok = -1, l0 = -1, l1 = -1;
    for (int u = 0; u < p->nunits; u++) {
        if (!strcmp(p->units[u].name, "tok_embeddings")) tok = u;
        if (!strcmp(p->units[u].name, "layers.0")) l0 = u;
        if (!strcmp(p->units[u].name, "layers.1")) l1 = u;
    }
    assert_true(tok >= 0 && l0 >= 0 && l1 >= 0);
    call_inst calls[512];
    int n = plan_calls(p, calls, 512), cursor[64][3] = { { 0 } }, reshards = 0, i = 0;
    unsigned live[64] = { 0 };
    /* The plan's calls up to tok_embeddings' second reshard (after its backward). */
    for (; i < n && reshards < 2; i++) {
        const call_inst *c = &calls[i];
        cp_call_effect e;
        cp_call_effect_of(p, c->unit, CALL_KINDS[c->call], CALL_NKINDS[c->call], cursor[c->unit][c->call], &e);
        assert_int_equal(cp_call_conflict(p, c->unit, &e, live, NULL, NULL), -1);
        cp_call_apply(&e, &live[c->unit]);
        assert_int_equal(cp_run_call(p, c->unit, CALL_KINDS[c->call], CALL_NKINDS[c->call],
                                     &cursor[c->unit][c->call], run_nothing, NULL), 0);
        reshards += c->call == 1 && c->unit == tok;
    }
    assert_int_equal(reshards, 2);
    assert_int_equal(live[tok], 1u << CP_BUF_GRADS);
    for (int u = 0; u < p->nunits; u++) assert_false(live[u] & (1u << CP_BUF_UNSHARDED));
    cp_call_effect e;
    cp_call_effect_of(p, l0, cp_call_unshard, 4, cursor[l0][0], &e);
    int wrote = -1, held = -1;
    assert_int_equal(cp_call_conflict(p, l0, &e, live, &wrote, &held), tok);
    assert_int_equal(held, CP_BUF_GRADS);
    char m[600];
    cp_call_conflict_message(p, "cp_gpu_unshard", l0, tok, wrote, held, m, sizeof m);
    assert_non_null(strstr(m, "cp_gpu_unshard(layers.0) would write its "));
    assert_non_null(strstr(m, " over the unsharded gradients of unit tok_embeddings"));
    assert_non_null(strstr(m, "reduce tok_embeddings's gradients first"));
    /* Its reduction frees them: the rest of the step goes through. */
    for (; i < n; i++) {
        const call_inst *c = &calls[i];
        cp_call_effect_of(p, c->unit, CALL_KINDS[c->call], CALL_NKINDS[c->call], cursor[c->unit][c->call], &e);
        assert_int_equal(cp_call_conflict(p, c->unit, &e, live, NULL, NULL), -1);
        cp_call_apply(&e, &live[c->unit]);
        assert_int_equal(cp_run_call(p, c->unit, CALL_KINDS[c->call], CALL_NKINDS[c->call],
                                     &cursor[c->unit][c->call], run_nothing, NULL), 0);
    }
    assert_int_equal(live[tok], 0);

    /* The grads an unshard opens are the caller's backward's to write: a
     * backward of unit a before unit b's (the reverse of the plan's) would
     * have b's backward write its grads over a's, not yet reduced, where
     * the arena gives both grads the same bytes. Refused at b's unshard,
     * whose own buffers touch nothing live. (a and b: the first pair of the
     * plan's units with parameters whose grads share bytes and whose
     * unsharded parameters and all-gather buffer do not meet a's grads.) */
    const int blocks[3] = { tok, l0, l1 };
    int pa = -1, pb = -1;
    for (int i = 0; i < 3 && pa < 0; i++)
        for (int j = 0; j < 3 && pa < 0; j++) {
            int a = blocks[i], b = blocks[j];
            if (a != b && bytes_meet(p, b, CP_BUF_GRADS, a, CP_BUF_GRADS) &&
                !bytes_meet(p, b, CP_BUF_UNSHARDED, a, CP_BUF_GRADS) && !bytes_meet(p, b, CP_BUF_AG, a, CP_BUF_GRADS))
                pa = a, pb = b;
        }
    assert_true(pa >= 0); /* the arena shares some grads' bytes */
    static const char *const fwd[][2] = {
        { "unshard", "tok_embeddings" }, { "reshard", "tok_embeddings" }, { "unshard", "layers.0" },
        { "reshard", "layers.0" },       { "unshard", "layers.1" },       { "reshard", "layers.1" },
        { "unshard", "norm_output" },    { "reshard", "norm_output" },    { "reduce", "norm_output" },
    };
    struct { int call, unit; } seq[16];
    int nseq = 0;
    for (size_t k = 0; k < sizeof fwd / sizeof fwd[0]; k++) {
        int c = 0, u = 0;
        while (strcmp(CALL_NAMES[c], fwd[k][0])) c++;
        while (strcmp(p->units[u].name, fwd[k][1])) u++;
        seq[nseq].call = c, seq[nseq++].unit = u;
    }
    seq[nseq].call = 0, seq[nseq++].unit = pa;
    seq[nseq].call = 1, seq[nseq++].unit = pa;
    seq[nseq].call = 0, seq[nseq++].unit = pb;
    memset(cursor, 0, sizeof cursor);
    memset(live, 0, sizeof live);
    for (int k = 0; k < nseq; k++) {
        int c = seq[k].call, u = seq[k].unit;
        cp_call_effect_of(p, u, CALL_KINDS[c], CALL_NKINDS[c], cursor[u][c], &e);
        int v = cp_call_conflict(p, u, &e, live, &wrote, &held);
        if (k < nseq - 1) {
            assert_int_equal(v, -1);
            cp_call_apply(&e, &live[u]);
            assert_int_equal(cp_run_call(p, u, CALL_KINDS[c], CALL_NKINDS[c], &cursor[u][c], run_nothing, NULL), 0);
            continue;
        }
        assert_int_equal(v, pa);
        assert_int_equal(wrote, CP_BUF_GRADS);
        assert_int_equal(held, CP_BUF_GRADS);
        e.opens = 0; /* its writes alone clash with nothing live */
        assert_int_equal(cp_call_conflict(p, u, &e, live, NULL, NULL), -1);
    }
}

static int no_collective(void *user, int coll, int family, int color, int key, int size, void *in, void *out,
                         int64_t count, int dtype, int reduce_op)
{
    (void)user, (void)coll, (void)family, (void)color, (void)key, (void)size, (void)in, (void)out, (void)count;
    (void)dtype, (void)reduce_op;
    return 0;
}

/* Out of the plan's order through the host library (cp_gpu.h's calls have
 * the same check): hsdp2x3_bf16's arena gives the root's reduce-scatter
 * input the bytes of layers.0's unsharded parameters, free by the time the
 * plan reduces the root. A caller reducing the root's grads while layers.0
 * is unsharded for its backward would overwrite the parameters that
 * backward reads: refused, naming both buffers. So is an unshard over
 * unsharded parameters still in use. */
static void test_library_order_refused(void **state)
{
    (void)state;
    const cp_plan *p = &hsdp2x3_bf16_plan;
    cp_hostlib *h;
    char err[600];
    assert_int_equal(cp_hostlib_init(&h, p, 0, no_collective, NULL, err, sizeof err), 0);
    /* Forward: the root stays unsharded, each layer is resharded after it. */
    assert_int_equal(cp_hostlib_unshard(h, 0), 0);
    assert_int_equal(cp_hostlib_unshard(h, 1), 0);
    assert_int_equal(cp_hostlib_reshard(h, 1), 0);
    assert_int_equal(cp_hostlib_unshard(h, 2), 0);
    assert_int_equal(cp_hostlib_reshard(h, 2), 0);
    /* Backward of layers.1, then layers.0 unsharded for its backward. */
    assert_int_equal(cp_hostlib_unshard(h, 2), 0);
    assert_int_equal(cp_hostlib_reshard(h, 2), 0);
    assert_int_equal(cp_hostlib_reduce_grads(h, 2), 0);
    assert_int_equal(cp_hostlib_unshard(h, 1), 0);
    /* The root's reshard and reduction now, before layers.0's backward. */
    assert_int_equal(cp_hostlib_reshard(h, 0), 0);
    assert_int_equal(cp_hostlib_reduce_grads(h, 0), -1);
    const char *m = cp_hostlib_last_error(h);
    /* Which of layers.0's buffers the root's reduce-scatter input would
     * overwrite depends on the arena's placement (its unsharded parameters,
     * or, over eight micro-steps, the gradients its backward writes): the
     * message names the conflict, the fix and where the order is. */
    if (!strstr(m, "cp_hostlib_reduce_grads(root) would write its reduce-scatter input over the unsharded ") ||
        !strstr(m, "of unit layers.0") || !strstr(m, "layers.0") || !strstr(m, " first") ||
        !strstr(m, "plans/hsdp2x3_bf16/SCHEDULE.md"))
        fail_msg("%s", m);
    cp_hostlib_destroy(h);
}

/* A repeated micro-step (hsdp2x3_bf16: micro-steps 3-6 are one row set)
 * shares an event slot per op offset, so a wait means the latest op that
 * recorded its slot in table order. An op run out of that order (a later
 * instance recorded first) is refused, naming both ops, not waited on. */
static void test_shared_event_binds_to_the_plans_op(void **state)
{
    (void)state;
    const cp_plan *plan = &hsdp2x3_bf16_plan;
    cp_host_world *w = cp_host_world_create(plan);
    assert_non_null(w);
    cp_backend b;
    cp_host_backend_init(&b, w, 0);
    cp_executor ex = { .quiet = 1 };
    assert_int_equal(cp_executor_init(&ex, plan, 0, &b), 0);
    const cp_plan *p = ex.plan;
    /* a wait whose slot more than one op records, and a later recorder of it */
    int waiter = -1, k = -1, later = -1;
    for (int i = 0; i < p->nops && waiter < 0; i++)
        for (int j = 0; j < p->ops[i].wait_count && waiter < 0; j++) {
            int s = p->waits[p->ops[i].wait_first + j];
            for (int r = i + 1; r < p->nops; r++)
                if (p->ops[r].event == s) { waiter = i; k = j; later = r; break; }
        }
    assert_true(waiter >= 0);
    int means = ex.wait_means[ex.wait_base[waiter] + k];
    assert_true(means >= 0 && means < waiter);
    assert_true(p->ops[means].event == p->waits[p->ops[waiter].wait_first + k]);
    /* the op the plan means recorded last: the check lets the wait through */
    ex.slot_last[p->ops[means].event] = means;
    for (int j = 0; j < p->ops[waiter].wait_count; j++) {
        int s = p->waits[p->ops[waiter].wait_first + j];
        ex.slot_last[s] = ex.wait_means[ex.wait_base[waiter] + j];
    }
    /* a later instance recorded first: refused before any wait is issued */
    ex.slot_last[p->ops[means].event] = later;
    assert_int_equal(cp_executor_run_op(&ex, &p->ops[waiter]), -1);
    char want[160];
    snprintf(want, sizeof want, "which op %d recorded last where the plan means op %d", later, means);
    if (!strstr(ex.err, want) || !strstr(ex.err, "plans/hsdp2x3_bf16/SCHEDULE.md")) fail_msg("%s", ex.err);
    cp_executor_free(&ex);
    cp_host_world_destroy(w);
}

static void test_launch_env(void **state)
{
    (void)state;
    cp_launch_env L;
    char err[256];
    const char *none[] = { NULL };
    assert_int_equal(launch(none, &L, err), 0);
    assert_string_equal(L.source, "none");
    assert_int_equal(L.world_size, 1);
    assert_string_equal(L.comm_id, "");

    const char *torchrun[] = { "RANK=5", "WORLD_SIZE=16", "LOCAL_RANK=1", "MASTER_ADDR=node7", "MASTER_PORT=29500",
                               "SLURM_PROCID=9", "SLURM_NTASKS=99", "SLURM_LOCALID=3", NULL };
    assert_int_equal(launch(torchrun, &L, err), 0);
    assert_string_equal(L.source, "torchrun"); /* wins over srun's variables */
    assert_int_equal(L.rank, 5);
    assert_int_equal(L.world_size, 16);
    assert_int_equal(L.local_rank, 1);
    assert_string_equal(L.comm_id, "node7:29500");

    const char *slurm[] = { "SLURM_PROCID=3", "SLURM_NTASKS=8", "SLURM_LOCALID=3", "MASTER_ADDR=fe80::1",
                            "MASTER_PORT=1234", NULL };
    assert_int_equal(launch(slurm, &L, err), 0);
    assert_string_equal(L.source, "slurm");
    assert_string_equal(L.comm_id, "[fe80::1]:1234");

    const char *ompi[] = { "OMPI_COMM_WORLD_RANK=2", "OMPI_COMM_WORLD_SIZE=4", "OMPI_COMM_WORLD_LOCAL_RANK=0",
                           "NCCL_COMM_ID=10.1.1.1:5000", "MASTER_ADDR=ignored", "MASTER_PORT=1", NULL };
    assert_int_equal(launch(ompi, &L, err), 0);
    assert_string_equal(L.source, "openmpi");
    assert_string_equal(L.comm_id, "10.1.1.1:5000");

    const char *partial[] = { "RANK=0", "WORLD_SIZE=2", "MASTER_ADDR=a", "MASTER_PORT=1", NULL };
    assert_int_equal(launch(partial, &L, err), -1);
    assert_non_null(strstr(err, "$LOCAL_RANK is unset"));

    const char *outside[] = { "RANK=2", "WORLD_SIZE=2", "LOCAL_RANK=0", "NCCL_COMM_ID=a:1", NULL };
    assert_int_equal(launch(outside, &L, err), -1);
    assert_non_null(strstr(err, "outside"));

    const char *junk[] = { "RANK=x", "WORLD_SIZE=2", "LOCAL_RANK=0", NULL };
    assert_int_equal(launch(junk, &L, err), -1);
    assert_non_null(strstr(err, "$RANK=x is not an integer"));

    const char *no_addr[] = { "RANK=0", "WORLD_SIZE=2", "LOCAL_RANK=0", NULL };
    assert_int_equal(launch(no_addr, &L, err), -1);
    assert_non_null(strstr(err, "MASTER_ADDR"));

    const char *bad_port[] = { "RANK=0", "WORLD_SIZE=2", "LOCAL_RANK=0", "MASTER_ADDR=a", "MASTER_PORT=70000", NULL };
    assert_int_equal(launch(bad_port, &L, err), -1);
    assert_non_null(strstr(err, "not a TCP port"));
}

/* --simulate --ranks: each rank alone with stand-in peers passes on the
 * linked plans (every rank, both arithmetics, two steps), and the
 * mutations the full simulation catches are caught by a lone rank too. */
/* cp_cursor_install twice (each HostLibrary / GpuLibrary installs it):
 * SIGTERM still ends the process by SIGTERM (exit 143 under a shell), not a
 * handler calling itself as its own previous one forever (SIGALRM's 10 s
 * ends the child then). */
static void test_cursor_install_twice_then_sigterm(void **state)
{
    (void)state;
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        char prefix[64];
        snprintf(prefix, sizeof prefix, "/tmp/cp_cursor_twice_%d", (int)getpid());
        setenv("COMMPLAN_CURSOR_DUMP", prefix, 1);
        if (cp_cursor_install() != 0 || cp_cursor_install() != 0) _exit(3);
        alarm(10);
        raise(SIGTERM);
        _exit(4);
    }
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    char path[96];
    snprintf(path, sizeof path, "/tmp/cp_cursor_twice_%d", (int)pid);
    unlink(path);
    assert_true(WIFSIGNALED(st));
    assert_int_equal(WTERMSIG(st), SIGTERM);
}

static void test_ranks_alone(void **state)
{
    (void)state;
    const cp_plan *plans[] = { &fsdp8_uneven_plan, &hsdp2x3_bf16_plan, &hsdp4x2_fp16_plan, &llama_tiny_tp_plan };
    int all[64];
    for (size_t i = 0; i < sizeof plans / sizeof plans[0]; i++)
        for (int a = 0; a < 2; a++) {
            cp_sim_options o = quiet_opts();
            for (int r = 0; r < plans[i]->world_size; r++) all[r] = r;
            o.only = all;
            o.nonly = plans[i]->world_size;
            o.steps = 2;
            o.arith = (cp_arith)a;
            assert_int_equal(cp_simulate(plans[i], &o), 0);
        }
    cp_sim_options o = quiet_opts();
    int last = 5;
    o.only = &last;
    o.nonly = 1;
    plan_copy c = copy_plan(&hsdp2x3_bf16_plan);
    c.ops[find_op(&c, CP_OP_REDUCE_SCATTER, 0)].reduce_op = CP_SUM; /* the stand-ins' sum, undivided */
    assert_int_equal(cp_simulate(&c.plan, &o), 1);
    free(c.ops);
    c = copy_plan(&hsdp2x3_bf16_plan);
    c.ops[find_op(&c, CP_OP_ALL_GATHER, 1)].family = -1; /* the stand-ins' slots never arrive */
    assert_int_equal(cp_simulate(&c.plan, &o), 1);
    free(c.ops);
    c = copy_plan(&hsdp2x3_bf16_plan);
    c.ops[find_op(&c, CP_OP_ALL_REDUCE, 0)].family = -1; /* the replicas' sum missing */
    assert_int_equal(cp_simulate(&c.plan, &o), 1);
    free(c.ops);
    c = copy_plan(&fsdp8_uneven_plan);
    c.ops[find_op(&c, CP_OP_VIEW_OUT_ADD, 0)].kind = CP_OP_VIEW_OUT;
    int r0 = 0;
    o.only = &r0;
    assert_int_equal(cp_simulate(&c.plan, &o), 1);
    free(c.ops);
}

/* ---- the split calls (cp_hostlib_*_issue / _wait; cp_gpu.h's twins run
 * the same checks, arena.c cp_order_call) ----
 * Rank 0 of a plan alone, its collectives a no-op handed out asynchronous:
 * the log says which tickets were handed out and which the library waited
 * for, and when. */
typedef struct {
    cp_hostlib *h;
    long handed, synced;
} async_log;

static int async_collective(void *user, int coll, int family, int color, int key, int size, void *in, void *out,
                            int64_t count, int dtype, int reduce_op)
{
    async_log *l = user;
    (void)coll, (void)family, (void)color, (void)key, (void)size, (void)in, (void)out, (void)count;
    (void)dtype, (void)reduce_op;
    long t = cp_hostlib_async_ticket(l->h);
    if (t) {
        assert_int_equal(t, l->handed + 1); /* tickets in issue order */
        l->handed = t;
    }
    return 0;
}

static int async_sync(void *user, long t)
{
    async_log *l = user;
    assert_true(t <= l->handed);
    if (t > l->synced) l->synced = t;
    return 0;
}

/* The plan's ops as the bridge makes the split calls (tests/emu/library_run.c
 * split, python/commplan/overlap.py): each unshard issued at its all-gather
 * and waited at its copy-out, each reduction issued at its pack (after
 * waiting for the unit's previous one), every reduction waited at the
 * step's end when end_waits. Ops [from, to); 0, or the op whose call failed
 * + 1 negated. */
static int split_ops(cp_hostlib *h, const cp_plan *p, int from, int to, int end_waits)
{
    for (int i = from; i < to; i++) {
        const cp_op *op = &p->ops[i];
        int u = op->unit, rc = 0;
        switch (op->kind) {
        case CP_OP_ALL_GATHER: rc = cp_hostlib_unshard_issue(h, u); break;
        case CP_OP_COPY_OUT: rc = cp_hostlib_unshard_wait(h, u); break;
        case CP_OP_RESHARD: rc = cp_hostlib_reshard(h, u); break;
        case CP_OP_PACK: rc = cp_hostlib_reduce_wait(h, u) || cp_hostlib_reduce_issue(h, u); break;
        default: break;
        }
        if (rc) return -(i + 1);
    }
    for (int u = 0; end_waits && to == p->nops && u < p->nunits; u++)
        if (cp_hostlib_reduce_wait(h, u)) return -(p->nops + 1);
    return 0;
}

static const cp_plan *const SPLIT_PLANS[] = { &fsdp8_uneven_plan, &hsdp2x3_bf16_plan, &hsdp4x2_fp16_plan,
                                              &llama_tiny_tp_plan };

static cp_hostlib *split_lib(const cp_plan *plan, async_log *l, cp_plan *view)
{
    char err[600];
    cp_hostlib *h;
    assert_int_equal(cp_hostlib_init(&h, plan, 0, async_collective, l, err, sizeof err), 0);
    l->h = h;
    l->handed = l->synced = 0;
    cp_hostlib_set_async(h, async_sync, l);
    cp_plan_view(plan, 0, view);
    return h;
}

/* The plan's own order, split: accepted for two steps; the collectives are
 * handed out asynchronous and left in flight past their issue (an
 * all-gather still running when its unshard_issue returns: the prefetch),
 * and every one is waited for by the step's end. */
static void test_split_calls_in_the_plans_order(void **state)
{
    (void)state;
    for (size_t k = 0; k < sizeof SPLIT_PLANS / sizeof SPLIT_PLANS[0]; k++) {
        async_log l;
        cp_plan view;
        cp_hostlib *h = split_lib(SPLIT_PLANS[k], &l, &view);
        int in_flight = 0;
        for (int step = 0; step < 2; step++) {
            for (int i = 0; i < view.nops; i++) {
                int rc = split_ops(h, &view, i, i + 1, 0);
                if (rc) fail_msg("plan %s step %d op %d: %s", view.name, step, i, cp_hostlib_last_error(h));
                if (view.ops[i].kind == CP_OP_ALL_GATHER && l.synced < l.handed) in_flight++;
            }
            assert_int_equal(split_ops(h, &view, view.nops, view.nops, 1), 0);
            assert_int_equal(l.synced, l.handed); /* everything waited for by the step's end */
        }
        if (!l.handed || !in_flight) fail_msg("plan %s: %ld collectives handed out, %d all-gathers in flight after "
                                              "their issue", view.name, l.handed, in_flight);
        cp_hostlib_destroy(h);
    }
}

/* Orders the plan's waits do not cover, refused before anything runs, with
 * one line naming the op, what it waits for or would overwrite, and where
 * the order is:
 *   a wait before its issue (the copy-out's all-gather not issued);
 *   a prefetch issued before the other unit's copy-out (or reshard) whose
 *   bytes its all-gather reuses (the plan's wait names that op's event,
 *   not yet recorded);
 *   the next step's first all-gather while last step's reductions are in
 *   flight, unwaited, over bytes they still read. */
/* A call whose ops record more events than the order check follows
 * (arena.c CP_ORDER_MAX_RECORDS, 32) is refused in one line, never checked
 * partly: one unshard instance of 40 copy-ins, each recording an event. */
static void test_order_refuses_too_many_records(void **state)
{
    (void)state;
    plan_copy c = copy_plan(&fsdp8_uneven_plan);
    assert_true(c.plan.nops >= 41 && c.plan.nevents > 0);
    cp_op proto = c.ops[0];
    for (int i = 0; i < c.plan.nops; i++)
        if (c.ops[i].kind == CP_OP_COPY_IN) proto = c.ops[i];
    for (int i = 0; i < 40; i++) {
        c.ops[i] = proto;
        c.ops[i].unit = 0;
        c.ops[i].wait_count = 0;
        c.ops[i].event = i % c.plan.nevents;
    }
    c.ops[40].unit = 1; /* the instance ends at the plan's next op of unit 0's group */
    cp_order *o = cp_order_new(&c.plan);
    assert_non_null(o);
    char err[600] = "";
    cp_call_part part = { cp_call_unshard, 4, 0 };
    assert_int_equal(cp_order_call(o, "cp_hostlib_unshard", 0, &part, 1, 0, 0, err, sizeof err), -1);
    assert_non_null(strstr(err, "records more than 32 events in one call"));
    assert_null(strchr(err, '\n'));
    cp_order_free(o);
    free(c.ops);
}

static void test_split_calls_refused_out_of_order(void **state)
{
    (void)state;
    int early = 0, stale = 0;
    for (size_t k = 0; k < sizeof SPLIT_PLANS / sizeof SPLIT_PLANS[0]; k++) {
        async_log l;
        cp_plan view;
        cp_hostlib *h = split_lib(SPLIT_PLANS[k], &l, &view);
        int first_ag = -1;
        for (int i = 0; i < view.nops && first_ag < 0; i++)
            if (view.ops[i].kind == CP_OP_COPY_OUT) first_ag = i;
        assert_int_equal(cp_hostlib_unshard_wait(h, view.ops[first_ag].unit), -1);
        if (!strstr(cp_hostlib_last_error(h), "cp_hostlib_unshard_wait(") ||
            !strstr(cp_hostlib_last_error(h), "not issued yet in this step"))
            fail_msg("%s", cp_hostlib_last_error(h));
        cp_hostlib_destroy(h);

        /* an all-gather waiting for another unit's op (the copy-out that frees
         * the bytes it reuses, a reshard) issued before that op's call */
        int ag = -1, rs = -1;
        for (int i = 0; i < view.nops && ag < 0; i++) {
            const cp_op *op = &view.ops[i];
            if (op->kind != CP_OP_ALL_GATHER) continue;
            for (int w = 0; w < op->wait_count && ag < 0; w++)
                for (int j = i - 1; j >= 0; j--)
                    if (view.ops[j].event == view.waits[op->wait_first + w]) {
                        if (view.ops[j].unit != op->unit) ag = i, rs = j;
                        break;
                    }
        }
        if (ag >= 0) {
            h = split_lib(SPLIT_PLANS[k], &l, &view);
            assert_int_equal(split_ops(h, &view, 0, rs, 0), 0);
            assert_int_equal(cp_hostlib_unshard_issue(h, view.ops[ag].unit), -1);
            /* the all-gather buffer the other unit's issue filled is held
             * until its wait (its copy-out); else the wait names the op */
            char want[200];
            if (view.ops[rs].kind == CP_OP_COPY_OUT)
                snprintf(want, sizeof want, "over the all-gather buffer of unit %s, gathered by its unshard's issue and "
                         "not yet copied out: the plan's arena reuses those bytes; wait for %s's unshard first",
                         view.units[view.ops[rs].unit].name, view.units[view.ops[rs].unit].name);
            else
                snprintf(want, sizeof want, "which waits for op %d (%s of %s), not issued yet in this step", rs,
                         cp_op_kind_name(view.ops[rs].kind), view.units[view.ops[rs].unit].name);
            if (!strstr(cp_hostlib_last_error(h), want) || !strstr(cp_hostlib_last_error(h), "SCHEDULE.md"))
                fail_msg("%s: %s", view.name, cp_hostlib_last_error(h));
            /* nothing ran: the plan's order still goes on from here */
            assert_int_equal(split_ops(h, &view, rs, view.nops, 1), 0);
            cp_hostlib_destroy(h);
            early++;
        }

        /* last step's reductions left in flight */
        h = split_lib(SPLIT_PLANS[k], &l, &view);
        assert_int_equal(split_ops(h, &view, 0, view.nops, 0), 0);
        int rc = split_ops(h, &view, 0, view.nops, 0);
        if (rc) {
            const char *m = cp_hostlib_last_error(h);
            if (!strstr(m, "may still read them: no wait of the plan orders it first") || !strstr(m, "SCHEDULE.md"))
                fail_msg("%s: %s", view.name, m);
            stale++;
        }
        cp_hostlib_destroy(h);
    }
    if (!early || !stale) fail_msg("early prefetches refused in %d plans, unwaited reductions in %d", early, stale);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bf16_rounding),
        cmocka_unit_test(test_fp16_rounding),
        cmocka_unit_test(test_reduce_values),
        cmocka_unit_test(test_group_geometry),
        cmocka_unit_test(test_shard_lengths),
        cmocka_unit_test(test_simulate_generated_plans),
        cmocka_unit_test(test_missing_all_gather_is_caught),
        cmocka_unit_test(test_wait_on_unrecorded_event_is_refused),
        cmocka_unit_test(test_tp_activation_collectives_are_checked),
        cmocka_unit_test(test_partial_reduction_is_checked),
        cmocka_unit_test(test_wrong_reduce_op_is_caught),
        cmocka_unit_test(test_missing_all_reduce_is_caught),
        cmocka_unit_test(test_view_out_add_is_checked),
        cmocka_unit_test(test_compute_on_resharded_params_fails),
        cmocka_unit_test(test_checker_takes_every_nccl_ring_split),
        cmocka_unit_test(test_library_order_of_plans),
        cmocka_unit_test(test_library_order_refused),
        cmocka_unit_test(test_library_order_guards_grads),
        cmocka_unit_test(test_split_calls_in_the_plans_order),
        cmocka_unit_test(test_split_calls_refused_out_of_order),
        cmocka_unit_test(test_order_refuses_too_many_records),
        cmocka_unit_test(test_divides_in_reduce_dtype_then_cast),
        cmocka_unit_test(test_micro_steps_accumulate_in_reduce_dtype),
        cmocka_unit_test(test_fsdp2_default_adds_each_reduction),
        cmocka_unit_test(test_shared_event_binds_to_the_plans_op),
        cmocka_unit_test(test_launch_env),
        cmocka_unit_test(test_ranks_alone),
        cmocka_unit_test(test_cursor_install_twice_then_sigterm),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
