/* NCCL's reduction arithmetic (cp_reduce_values_nccl, runtime/dtype.c)
 * against values worked out independently, in exact rational arithmetic,
 * for NCCL's ring with ncclAvg's premultiply contracted into one rounding
 * per step. Each vector is chosen so that a wrong model shows: gloo's order
 * (sum, then divide), an unfused multiply-add, or the wrong ring start. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "commplan.h"

static uint32_t bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* Bit equality, so a one-ulp difference fails with both values shown. */
#define assert_bits(got, want)                                                                                         \
    do {                                                                                                               \
        float g_ = (got), w_ = (want);                                                                                 \
        if (bits(g_) != bits(w_)) fail_msg("%s = %.9g (0x%08x), want %.9g (0x%08x)", #got, (double)g_, bits(g_),      \
                                           (double)w_, bits(w_));                                                      \
    } while (0)

/* The recording's case (tests/oracle/nccl/fsdp3): grads c, 2c, 3c on ranks
 * 0..2 with c = 5. gloo gives 10 everywhere; NCCL's chain 1 -> 2 -> 0 ends
 * on rank 0 one ulp high, the other two chains give 10. */
static void fp32_avg_three_ranks_as_recorded(void **state)
{
    (void)state;
    const float v[3] = { 5.0f, 10.0f, 15.0f };
    assert_bits(cp_reduce_values_nccl(CP_FP32, CP_AVG, v, 3, 0), 10.000000953674316f);
    assert_bits(cp_reduce_values_nccl(CP_FP32, CP_AVG, v, 3, 1), 10.0f);
    assert_bits(cp_reduce_values_nccl(CP_FP32, CP_AVG, v, 3, 2), 10.0f);
    assert_bits(cp_reduce_values(CP_FP32, CP_AVG, v, 3), 10.0f);
    assert_bits(cp_reduce_arith(CP_ARITH_NCCL, CP_FP32, CP_AVG, v, 3, 0), 10.000000953674316f);
    assert_bits(cp_reduce_arith(CP_ARITH_GLOO, CP_FP32, CP_AVG, v, 3, 0), 10.0f);
}

/* fma(v, 1/3, acc), not round(v * 1/3) + acc: 120163.6796875 unfused, and
 * gloo's 120163.6640625. */
static void fp32_avg_is_fused(void **state)
{
    (void)state;
    const float v[3] = { 211910.0f, 22975.0f, 125606.0f };
    assert_bits(cp_reduce_values_nccl(CP_FP32, CP_AVG, v, 3, 1), 120163.671875f);
    assert_bits(cp_reduce_values(CP_FP32, CP_AVG, v, 3), 120163.6640625f);
}

/* bf16: scalar bf16(1/3) = 0.333984375 and every step rounded to bf16.
 * The three ring starts give three values; unfused, chain 1 -> 2 -> 0 would
 * give 120, gloo 119. */
static void bf16_avg_each_ring_start(void **state)
{
    (void)state;
    const float v[3] = { 227.0f, 128.0f, 2.75f };
    assert_bits(cp_reduce_values_nccl(CP_BF16, CP_AVG, v, 3, 0), 119.5f);
    assert_bits(cp_reduce_values_nccl(CP_BF16, CP_AVG, v, 3, 1), 119.0f);
    assert_bits(cp_reduce_values_nccl(CP_BF16, CP_AVG, v, 3, 2), 120.0f);
    assert_bits(cp_reduce_values(CP_BF16, CP_AVG, v, 3), 119.0f);
}

/* fp16: scalar fp16(1/3) = 0.333251953125; unfused key 2 would give 1104. */
static void fp16_avg_is_fused(void **state)
{
    (void)state;
    const float v[3] = { 997.5f, 1397.0f, 916.5f };
    assert_bits(cp_reduce_values_nccl(CP_FP16, CP_AVG, v, 3, 0), 1103.0f);
    assert_bits(cp_reduce_values_nccl(CP_FP16, CP_AVG, v, 3, 1), 1104.0f);
    assert_bits(cp_reduce_values_nccl(CP_FP16, CP_AVG, v, 3, 2), 1103.0f);
}

/* SUM (FSDP2's fp16 path): rounded to fp16 after every add, in ring order:
 * 1 + 1 + 2048 = 2050 exactly, 2048 + 1 rounds back to 2048 (a tie, even). */
static void fp16_sum_ring_order(void **state)
{
    (void)state;
    const float v[3] = { 2048.0f, 1.0f, 1.0f };
    assert_bits(cp_reduce_values_nccl(CP_FP16, CP_SUM, v, 3, 0), 2050.0f);
    assert_bits(cp_reduce_values_nccl(CP_FP16, CP_SUM, v, 3, 1), 2048.0f);
    assert_bits(cp_reduce_values_nccl(CP_FP16, CP_SUM, v, 3, 2), 2048.0f);
}

/* One rank copies; two ranks' AVG (scalar 0.5, exact) is the same from
 * either start. */
static void one_and_two_ranks(void **state)
{
    (void)state;
    const float one[1] = { 3.0f }, two[2] = { 3.0f, 8.0f };
    assert_bits(cp_reduce_values_nccl(CP_FP32, CP_AVG, one, 1, 0), 3.0f);
    assert_bits(cp_reduce_values_nccl(CP_FP32, CP_AVG, two, 2, 0), 5.5f);
    assert_bits(cp_reduce_values_nccl(CP_FP32, CP_AVG, two, 2, 1), 5.5f);
    assert_bits(cp_reduce_values_nccl(CP_BF16, CP_SUM, two, 2, 1), 11.0f);
}

/* A one-channel ring all-reduce: n chunks of ceil(count / n), chunk c
 * finished on ring position c. */
static void all_reduce_key_is_the_chunk(void **state)
{
    (void)state;
    const int want[10] = { 0, 0, 0, 0, 1, 1, 1, 1, 2, 2 };
    for (int i = 0; i < 10; i++) assert_int_equal(cp_nccl_all_reduce_key(i, 10, 3), want[i]);
    assert_int_equal(cp_nccl_all_reduce_key(0, 0, 3), 0);
    assert_int_equal(cp_nccl_all_reduce_key(5, 6, 2), 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(fp32_avg_three_ranks_as_recorded),
        cmocka_unit_test(fp32_avg_is_fused),
        cmocka_unit_test(bf16_avg_each_ring_start),
        cmocka_unit_test(fp16_avg_is_fused),
        cmocka_unit_test(fp16_sum_ring_order),
        cmocka_unit_test(one_and_two_ranks),
        cmocka_unit_test(all_reduce_key_is_the_chunk),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
