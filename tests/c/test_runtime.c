/* cmocka tests for the fixed runtime: dtype conversions, rank geometry,
 * the executor over the host backend on generated plans, and mutations of
 * a plan's op list that the simulation checks must catch. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "commplan.h"
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


/* Walking a plan's own op list, every unshard is accepted by the library's
 * order check (a library unshard does copy-in, all-gather and copy-out at
 * once, where the plan's copy-out is); unsharding a unit whose bytes a live unit holds is
 * refused, and such pairs exist once units are resharded after forward. */
static int arena_order_conflicts(const cp_plan *p)
{
    unsigned char live[64] = { 0 };
    assert_true(p->nunits <= 64);
    for (int i = 0; i < p->nops; i++) {
        const cp_op *o = &p->ops[i];
        if (o->kind == CP_OP_COPY_OUT) {
            assert_int_equal(cp_unshard_conflict(p, o->unit, live), -1);
            live[o->unit] = 1;
        }
        if (o->kind == CP_OP_RESHARD) live[o->unit] = 0;
    }
    int refused = 0;
    for (int u = 0; u < p->nunits; u++)
        for (int v = 0; v < p->nunits; v++) {
            if (u == v) continue;
            memset(live, 0, sizeof live);
            live[v] = 1;
            int c = cp_unshard_conflict(p, u, live);
            assert_true(c == -1 || c == v);
            if (c == v) {
                /* A refusal means real shared bytes. */
                int64_t a = p->units[u].arena_offset[CP_BUF_UNSHARDED], b = p->units[v].arena_offset[CP_BUF_UNSHARDED];
                int64_t g = p->units[u].arena_offset[CP_BUF_AG];
                int64_t nb = cp_arena_buffer_bytes(p, v, CP_BUF_UNSHARDED);
                int64_t na = cp_arena_buffer_bytes(p, u, CP_BUF_UNSHARDED);
                assert_true((a < b + nb && b < a + na) || (g < b + nb && b < g + cp_arena_buffer_bytes(p, u, CP_BUF_AG)));
                refused++;
            }
        }
    return refused;
}

static void test_arena_library_order(void **state)
{
    (void)state;
    int refused = arena_order_conflicts(&hsdp2x3_bf16_plan) + arena_order_conflicts(&hsdp4x2_fp16_plan);
    arena_order_conflicts(&fsdp8_uneven_plan);
    assert_true(refused > 0);
    /* Arena buffer sizes are the executor's. */
    const cp_unit *U = &hsdp2x3_bf16_plan.units[0];
    assert_int_equal(cp_arena_buffer_bytes(&hsdp2x3_bf16_plan, 0, CP_BUF_RS_OUT),
                     U->total * (int64_t)cp_dtype_size(U->reduce_dtype));
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
        cmocka_unit_test(test_wrong_reduce_op_is_caught),
        cmocka_unit_test(test_missing_all_reduce_is_caught),
        cmocka_unit_test(test_compute_on_resharded_params_fails),
        cmocka_unit_test(test_arena_library_order),
        cmocka_unit_test(test_launch_env),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
