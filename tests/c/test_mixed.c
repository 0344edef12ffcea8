/* cmocka tests for a unit of mixed all-gather dtypes (issue 39: a
 * parameter's own MixedPrecisionPolicy param_dtype, which torch 2.15's
 * FSDP2 all-gathers as raw bytes, _fsdp_collectives.py:369-379): the host
 * backend's copy-in casts each shard to its parameter's dtype at its byte
 * offset of the rank's slot, the copy-out moves each rank's run of bytes
 * into the parameter's (16-byte aligned) unsharded tensor, Shard(1) rows
 * included, and the arena sizes its buffers in bytes. Hand-written tables:
 * world 2 on one mesh dim, fp32 parameters gathered in bf16 but for some
 * kept in fp32, one of them at a byte offset that is not a multiple of 4. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "commplan.h"
#include "host.h"

#define W 2
#define NP 5
#define TOTAL 14     /* slot elements (the reduce-scatter's, unchanged) */
#define AG_BYTES 42  /* the slot in bytes: 8 + 12 + 2 + 4 + 16 */
#define UNSH_BYTES 112

/* norm {3} fp32, w {3,3} bf16, b {1} bf16, g {2} fp32 at byte 22, s1 {2,4} Shard(1) fp32. */
static const cp_param params[NP] = {
    { .name = "norm", .ndim = 1, .shape = { 3 }, .numel = 3, .chunk = 2, .outer = 1, .run = 2, .padded = 2,
      .offset = 0, .ag_dtype = CP_FP32, .ag_offset = 0, .unsharded_offset = 0 },
    { .name = "w", .ndim = 2, .shape = { 3, 3 }, .numel = 9, .chunk = 2, .outer = 1, .run = 6, .padded = 6,
      .offset = 2, .ag_dtype = CP_BF16, .ag_offset = 8, .unsharded_offset = 16 },
    { .name = "b", .ndim = 1, .shape = { 1 }, .numel = 1, .chunk = 1, .outer = 1, .run = 1, .padded = 1,
      .offset = 8, .ag_dtype = CP_BF16, .ag_offset = 20, .unsharded_offset = 48 },
    { .name = "g", .ndim = 1, .shape = { 2 }, .numel = 2, .chunk = 1, .outer = 1, .run = 1, .padded = 1,
      .offset = 9, .ag_dtype = CP_FP32, .ag_offset = 22, .unsharded_offset = 64 },
    { .name = "s1", .ndim = 2, .shape = { 2, 4 }, .shard_dim = 1, .numel = 8, .chunk = 2, .outer = 2, .run = 2,
      .padded = 4, .offset = 10, .ag_dtype = CP_FP32, .ag_offset = 26, .unsharded_offset = 80 },
};

static cp_unit unit = {
    .name = "mixed", .first_param = 0, .nparams = NP, .total = TOTAL, .numel = 23, .grads_numel = 48,
    .orig_dtype = CP_FP32, .ag_dtype = CP_BF16, .reduce_dtype = CP_FP32, .grad_dtype = CP_FP32,
    .rs_op = CP_AVG, .ar_op = CP_AVG, .pre_divide = 1, .post_divide = 1, .ag_bytes = AG_BYTES,
    .unsharded_bytes = UNSH_BYTES,
};
static const cp_group_family family = { .name = "dp_shard", .axis_mask = 0x1u, .size = W };

static cp_plan plan(void)
{
    cp_plan p;
    memset(&p, 0, sizeof p);
    p.name = "mixed";
    p.fingerprint = "0000000000000000";
    p.world_size = W;
    p.mesh_ndim = 1;
    p.mesh_names[0] = "dp_shard";
    p.mesh_sizes[0] = W;
    p.shard_size = W;
    p.replicate_size = 1;
    p.shard_family = 0;
    p.replicate_family = -1;
    p.micro_steps = 1;
    p.nunits = 1;
    p.units = &unit;
    p.nparams = NP;
    p.params = params;
    p.nfamilies = 1;
    p.families = &family;
    p.tp_size = 1;
    p.tp_mesh_dim = -1;
    p.pp_size = 1;
    p.pp_mesh_dim = -1;
    p.pp_family = -1;
    return p;
}

/* The value of slot element i of rank r's shard (fp32, exact in bf16 only for some). */
static float shard_value(int r, int64_t i) { return 1.0f + (float)i + 0.00390625f * (float)(r + 1) + (float)(100 * r); }

static float round_to(cp_dtype t, float v)
{
    unsigned char b[4];
    cp_store(t, b, 0, v);
    return cp_load(t, b, 0);
}

static void test_u8_dtype(void **state)
{
    (void)state;
    assert_int_equal(cp_dtype_size(CP_U8), 1);
    assert_string_equal(cp_dtype_name(CP_U8), "u8");
    unsigned char b[2] = { 0 };
    cp_store(CP_U8, b, 1, 200.0f);
    assert_int_equal(b[1], 200);
    assert_true(cp_load(CP_U8, b, 1) == 200.0f);
}

static void test_helpers_and_arena(void **state)
{
    (void)state;
    cp_plan p = plan();
    assert_int_equal(cp_unit_ag_bytes(&unit), AG_BYTES);
    assert_int_equal(cp_param_ag_dtype(&unit, &params[1]), CP_BF16);
    assert_int_equal(cp_param_ag_offset(&unit, &params[3]), 22);
    assert_int_equal(cp_param_unsharded_offset(&unit, &params[4], W), 80);
    assert_int_equal(cp_arena_buffer_bytes(&p, 0, CP_BUF_AG), W * AG_BYTES);
    assert_int_equal(cp_arena_buffer_bytes(&p, 0, CP_BUF_UNSHARDED), UNSH_BYTES);
    assert_int_equal(cp_arena_buffer_bytes(&p, 0, CP_BUF_RS_IN), W * TOTAL * 4);
    /* a uniform unit: element offsets times its one dtype, as before */
    cp_unit u1 = unit;
    u1.ag_bytes = 0;
    assert_int_equal(cp_unit_ag_bytes(&u1), TOTAL * 2);
    assert_int_equal(cp_param_ag_offset(&u1, &params[3]), 9 * 2);
    assert_int_equal(cp_param_unsharded_offset(&u1, &params[3], W), W * 9 * 2);
    assert_int_equal(cp_param_ag_dtype(&u1, &params[3]), CP_BF16);
}

/* Copy-in on each rank: every parameter in its own dtype at its byte offset of the rank's slot. */
static void test_copy_in(void **state)
{
    (void)state;
    cp_plan p = plan();
    cp_host_world *w = cp_host_world_create(&p);
    assert_non_null(w);
    for (int r = 0; r < W; r++) {
        cp_backend b;
        cp_host_backend_init(&b, w, r);
        float sharded[TOTAL];
        unsigned char ag[W * AG_BYTES + 1];
        memset(ag, 0xa5, sizeof ag);
        for (int i = 0; i < TOTAL; i++) sharded[i] = shard_value(r, i);
        assert_int_equal(b.copy(&b, 0, 0, 0, 0, CP_STREAM_COPY_IN, sharded, ag), 0);
        for (int j = 0; j < NP; j++) {
            const cp_param *q = &params[j];
            const unsigned char *at = ag + r * AG_BYTES + q->ag_offset;
            for (int64_t i = 0; i < q->padded; i++) {
                float got;
                unsigned char e[4];
                memcpy(e, at + i * (int64_t)cp_dtype_size(q->ag_dtype), cp_dtype_size(q->ag_dtype));
                got = cp_load(q->ag_dtype, e, 0);
                float want = round_to(q->ag_dtype, shard_value(r, q->offset + i));
                if (got != want) fail_msg("rank %d %s[%ld]: %g, want %g", r, q->name, (long)i, (double)got, (double)want);
            }
        }
        /* the other rank's slot and the byte past the buffer are untouched */
        for (int i = 0; i < AG_BYTES; i++) assert_int_equal(ag[(1 - r) * AG_BYTES + i], 0xa5);
        assert_int_equal(ag[W * AG_BYTES], 0xa5);
    }
    cp_host_world_destroy(w);
}

/* Copy-out: each rank's bytes of each parameter into its unsharded (outer, W x run) tensor. */
static void test_copy_out(void **state)
{
    (void)state;
    cp_plan p = plan();
    cp_host_world *w = cp_host_world_create(&p);
    assert_non_null(w);
    cp_backend b;
    cp_host_backend_init(&b, w, 0);
    unsigned char ag[W * AG_BYTES], unsharded[UNSH_BYTES];
    memset(unsharded, 0xa5, sizeof unsharded);
    for (int r = 0; r < W; r++)
        for (int j = 0; j < NP; j++) {
            const cp_param *q = &params[j];
            size_t es = cp_dtype_size(q->ag_dtype);
            for (int64_t i = 0; i < q->padded; i++) {
                unsigned char e[4];
                cp_store(q->ag_dtype, e, 0, shard_value(r, q->offset + i));
                memcpy(ag + r * AG_BYTES + q->ag_offset + i * (int64_t)es, e, es);
            }
        }
    assert_int_equal(b.copy(&b, 1, 0, 0, 0, CP_STREAM_COMPUTE, ag, unsharded), 0);
    for (int j = 0; j < NP; j++) {
        const cp_param *q = &params[j];
        size_t es = cp_dtype_size(q->ag_dtype);
        for (int64_t o = 0; o < q->outer; o++)
            for (int r = 0; r < W; r++)
                for (int64_t i = 0; i < q->run; i++) {
                    unsigned char e[4];
                    memcpy(e, unsharded + q->unsharded_offset + (size_t)(o * W * q->run + r * q->run + i) * es, es);
                    float got = cp_load(q->ag_dtype, e, 0);
                    float want = round_to(q->ag_dtype, shard_value(r, q->offset + o * q->run + i));
                    if (got != want)
                        fail_msg("%s row %ld rank %d [%ld]: %g, want %g", q->name, (long)o, r, (long)i, (double)got,
                                 (double)want);
                }
    }
    /* the alignment gaps between the unsharded tensors are not written */
    for (int i = 8 * W; i < 16; i++) assert_int_equal(unsharded[i], 0xa5);
    cp_host_world_destroy(w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_u8_dtype),
        cmocka_unit_test(test_helpers_and_arena),
        cmocka_unit_test(test_copy_in),
        cmocka_unit_test(test_copy_out),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
