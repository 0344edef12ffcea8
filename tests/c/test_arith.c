/* The backends' reduction arithmetic (runtime/dtype.c). NCCL's
 * (cp_reduce_values_nccl) against values worked out independently, in
 * exact rational arithmetic, for NCCL's ring with ncclAvg's premultiply
 * contracted into one rounding per step. Each vector is chosen so that a
 * wrong model shows: gloo's order (sum, then divide), an unfused
 * multiply-add, or the wrong ring start. Gloo's (cp_reduce_values_gloo and
 * its chunk keys), further down, against torch 2.15's gloo as recorded. */
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

/* ---- where NCCL's ring all-reduce finishes each element ----
 * runRing of NVIDIA/nccl src/device/all_reduce.h, its offset arithmetic
 * copied: the channels' parts in order (ncclCollCbdPart), in each part
 * loops of n x chunkCount elements, the last loop's chunkCount
 * alignUp(divUp(remCount, n), 16 / sizeof(T)), and chunk c of a loop finished
 * by ring position c (step k-1, chunk = ringIx). pos[i]: that position. */
static void nccl_ring_positions(int64_t count, int n, int es, const int64_t *parts, const int64_t *chunks, int nparts,
                                int *pos)
{
    int64_t grid = 0, align = 16 / es;
    for (int ch = 0; ch < nparts; ch++) {
        int64_t channelCount = parts[ch], chunkCount = chunks[ch];
        const int64_t loopCount = n * chunkCount;
        for (int64_t elemOffset = 0; elemOffset < channelCount; elemOffset += loopCount) {
            int64_t remCount = channelCount - elemOffset;
            if (remCount < loopCount) chunkCount = ((remCount + n - 1) / n + align - 1) / align * align;
            for (int c = 0; c < n; c++) {
                int64_t chunkOffset = c * chunkCount;
                int64_t nelem = chunkCount < remCount - chunkOffset ? chunkCount : remCount - chunkOffset;
                for (int64_t j = 0; j < nelem; j++) pos[grid + elemOffset + chunkOffset + j] = c;
            }
        }
        grid += channelCount;
    }
    assert_int_equal(grid, count);
}

/* One channel, one loop (a buffer smaller than n chunks): chunks of
 * divUp(count, n) rounded up to 16 bytes, so with 7 fp32 elements over 3
 * ranks position 1 finishes elements 4..6 and position 2 none, where equal
 * thirds (ceil(7 / 3) = 3) would have put element 6 on position 2. On
 * inexact data (ncclAvg's float(1/3) premultiply) the position shows in the
 * bits: the model's value is NCCL's for every element. */
static void all_reduce_key_one_channel(void **state)
{
    (void)state;
    static const cp_dtype types[2] = { CP_FP32, CP_BF16 };
    int pos[64], differs = 0;
    for (int ti = 0; ti < 2; ti++)
        for (int n = 2; n <= 5; n++)
            for (int64_t count = 1; count <= 40; count++) {
                cp_dtype t = types[ti];
                int64_t part[1] = { count }, chunk[1] = { 1 << 20 };
                nccl_ring_positions(count, n, (int)cp_dtype_size(t), part, chunk, 1, pos);
                for (int64_t i = 0; i < count; i++) {
                    if (cp_nccl_all_reduce_key(t, i, count, n) != pos[i])
                        fail_msg("%s, %d ranks, %ld elements: element %ld on position %d, NCCL's %d", cp_dtype_name(t),
                                 n, (long)count, (long)i, cp_nccl_all_reduce_key(t, i, count, n), pos[i]);
                    assert_int_equal(cp_all_reduce_key(CP_ARITH_NCCL, t, i, count, n), pos[i]);
                    if (n != 3) continue;
                    const float v[3] = { 0.1f * (float)(i + 1), 7.3f - (float)i, 1e3f / (float)(i + 3) };
                    float nccl = cp_reduce_values_nccl(t, CP_AVG, v, 3, pos[i]);
                    assert_bits(cp_reduce_arith(CP_ARITH_NCCL, t, CP_AVG, v, 3,
                                                cp_all_reduce_key(CP_ARITH_NCCL, t, i, count, 3)),
                                nccl);
                    int thirds = (int)(i / ((count + 2) / 3)); /* the equal split NCCL does not make */
                    differs += bits(cp_reduce_values_nccl(t, CP_AVG, v, 3, thirds)) != bits(nccl);
                }
            }
    assert_true(differs > 0); /* the data are order-sensitive enough to tell the splits apart */
    assert_int_equal(cp_nccl_all_reduce_key(CP_FP32, 6, 7, 3), 1);
    assert_int_equal(cp_nccl_all_reduce_key(CP_BF16, 8, 10, 3), 1);
    assert_int_equal(cp_nccl_all_reduce_key(CP_FP32, 0, 0, 3), 0);
}

/* Every split NCCL's 16-byte granularity allows (one or two channels, the
 * boundary on any 16-byte multiple; every chunk size a multiple of 16
 * bytes): element i finishes on exactly the positions 0 ..
 * cp_nccl_all_reduce_max_key(i), each reached by some split, no later one. */
static void all_reduce_positions_of_every_split(void **state)
{
    (void)state;
    static const cp_dtype types[2] = { CP_FP32, CP_BF16 };
    int pos[64];
    for (int ti = 0; ti < 2; ti++)
        for (int n = 3; n <= 4; n++)
            for (int64_t count = 1; count <= 40; count++) {
                cp_dtype t = types[ti];
                int es = (int)cp_dtype_size(t);
                int64_t a = 16 / es, blocks = (count + a - 1) / a;
                unsigned reached[64] = { 0 };
                for (int64_t cut = 0; cut < blocks; cut++) /* 0: one channel; else the second starts at block cut */
                    for (int64_t c0 = 1; c0 <= blocks; c0++)
                        for (int64_t c1 = 1; c1 <= (cut ? blocks : 1); c1++) {
                            int64_t parts[2] = { cut ? cut * a : count, count - cut * a }, chunks[2] = { c0 * a, c1 * a };
                            nccl_ring_positions(count, n, es, parts, chunks, cut ? 2 : 1, pos);
                            for (int64_t i = 0; i < count; i++) {
                                if (pos[i] > cp_nccl_all_reduce_max_key(t, i, n))
                                    fail_msg("%s, %d ranks, %ld elements: element %ld finished on %d, past the bound %d",
                                             cp_dtype_name(t), n, (long)count, (long)i, pos[i],
                                             cp_nccl_all_reduce_max_key(t, i, n));
                                reached[i] |= 1u << pos[i];
                            }
                        }
                for (int64_t i = 0; i < count; i++)
                    assert_int_equal(reached[i], (1u << (cp_nccl_all_reduce_max_key(t, i, n) + 1)) - 1);
            }
    assert_int_equal(cp_nccl_all_reduce_max_key(CP_FP32, 3, 8), 0);  /* the first 16 bytes: position 0 only */
    assert_int_equal(cp_nccl_all_reduce_max_key(CP_FP32, 4, 8), 1);
    assert_int_equal(cp_nccl_all_reduce_max_key(CP_BF16, 4000, 8), 7);
}

/* ---- gloo's arithmetic (cp_reduce_values_gloo, cp_gloo_all_reduce_key):
 * values recorded from torch 2.15's ProcessGroupGloo on CPU, one process
 * per rank, every element of rank r's input set to V[r] so each output
 * element shows which ring chain summed it (dist.all_reduce,
 * dist.reduce_scatter_tensor, then all_gather of the outputs). V was
 * picked so that the chains starting on different ranks round apart. */

/* Every element of an n-rank all-reduce (or member `rs` of a
 * reduce-scatter, rs >= 0) of count elements a rank against gloo's. */
static void expect_gloo(cp_dtype t, cp_reduce_op op, const float *V, int n, int rs, int64_t count, const float *want)
{
    for (int64_t i = 0; i < count; i++) {
        int key = rs >= 0 ? cp_reduce_scatter_key(CP_ARITH_GLOO, t, rs, i, count, n)
                          : cp_all_reduce_key(CP_ARITH_GLOO, t, i, count, n);
        float got = cp_reduce_arith(CP_ARITH_GLOO, t, op, V, n, key);
        if (bits(got) != bits(want[i]))
            fail_msg("element %ld: %.9g (0x%08x), gloo %.9g (0x%08x)", (long)i, (double)got, bits(got),
                     (double)want[i], bits(want[i]));
    }
}

/* 3 ranks, 7 elements: gloo cuts 6 segments of 2 elements (the last one
 * short), 2 to a chunk: elements 0-3 end on rank 0 (summed 2, 1, 0),
 * 4-6 on rank 1 (0, 2, 1), rank 2's chunk is empty. An fp32 sum rounded
 * once gives 1020 everywhere in bf16 and 7844 in fp16. */
static void gloo_all_reduce_three_ranks(void **state)
{
    (void)state;
    const float b[3] = { 348.0f, 390.0f, 282.0f }, h[3] = { 2710.0f, 2412.0f, 2722.0f };
    const float b_sum[7] = { 1020, 1020, 1020, 1020, 1024, 1024, 1024 };
    const float b_avg[7] = { 340, 340, 340, 340, 342, 342, 342 };
    const float h_sum[7] = { 7848, 7848, 7848, 7848, 7844, 7844, 7844 };
    expect_gloo(CP_BF16, CP_SUM, b, 3, -1, 7, b_sum);
    expect_gloo(CP_BF16, CP_AVG, b, 3, -1, 7, b_avg);
    expect_gloo(CP_FP16, CP_SUM, h, 3, -1, 7, h_sum);
    /* rank 2's chain (1, 0, 2), in no output above */
    assert_bits(cp_reduce_values_gloo(CP_BF16, CP_SUM, b, 3, 2), 1016.0f);
}

/* fp32 rounds every add too: the chains differ in the last bit. */
static void gloo_all_reduce_fp32(void **state)
{
    (void)state;
    const float v[3] = { 0x1.b1a1e8p+5f, 0x1.476d52p+6f, 0x1.7d58f6p+6f };
    const float sum[7] = { 0x1.cecb9ep+7f, 0x1.cecb9ep+7f, 0x1.cecb9ep+7f, 0x1.cecb9ep+7f,
                           0x1.cecb9cp+7f, 0x1.cecb9cp+7f, 0x1.cecb9cp+7f };
    const float avg[7] = { 0x1.3487bep+6f, 0x1.3487bep+6f, 0x1.3487bep+6f, 0x1.3487bep+6f,
                           0x1.3487bep+6f, 0x1.3487bep+6f, 0x1.3487bep+6f };
    expect_gloo(CP_FP32, CP_SUM, v, 3, -1, 7, sum);
    expect_gloo(CP_FP32, CP_AVG, v, 3, -1, 7, avg);
}

/* reduce_scatter_tensor is an all-reduce of the 9-element input: chunks
 * 0-3, 4-7, 8, so rank 1 gets one element of chunk 0 and rank 2 two of
 * chunk 1, not their own chain. */
static void gloo_reduce_scatter_is_an_all_reduce(void **state)
{
    (void)state;
    const float b[3] = { 348.0f, 390.0f, 282.0f };
    const float want[3][3] = { { 1020, 1020, 1020 }, { 1020, 1024, 1024 }, { 1024, 1024, 1016 } };
    for (int r = 0; r < 3; r++) expect_gloo(CP_BF16, CP_SUM, b, 3, r, 3, want[r]);
}

/* 4 ranks, 10 elements: 8 segments of 2, chunks 0-3, 4-7, 8-9 and an
 * empty one; the chains 3-2-1-0, 0-3-2-1, 1-0-3-2. */
static void gloo_all_reduce_four_ranks(void **state)
{
    (void)state;
    const float b[4] = { 173.0f, 158.0f, 290.0f, 398.0f };
    const float want[10] = { 1020, 1020, 1020, 1020, 1024, 1024, 1024, 1024, 1016, 1016 };
    expect_gloo(CP_BF16, CP_SUM, b, 4, -1, 10, want);
}

/* Past 2 x ranks MiB the 1 MiB segment bound sets the count: 3 ranks,
 * 4000001 fp16 elements (8000002 bytes) make 9 segments of 444445, 3 to a
 * chunk (a probe with these counts matched gloo on every element). */
static void gloo_all_reduce_key_large(void **state)
{
    (void)state;
    assert_int_equal(cp_gloo_all_reduce_key(CP_FP16, 1333334, 4000001, 3), 0);
    assert_int_equal(cp_gloo_all_reduce_key(CP_FP16, 1333335, 4000001, 3), 1);
    assert_int_equal(cp_gloo_all_reduce_key(CP_FP16, 2666669, 4000001, 3), 1);
    assert_int_equal(cp_gloo_all_reduce_key(CP_FP16, 2666670, 4000001, 3), 2);
    /* fp32: 16000004 bytes, 18 segments of 222223, 6 to a chunk */
    assert_int_equal(cp_gloo_all_reduce_key(CP_FP32, 1333337, 4000001, 3), 0);
    assert_int_equal(cp_gloo_all_reduce_key(CP_FP32, 1333338, 4000001, 3), 1);
    assert_int_equal(cp_gloo_all_reduce_key(CP_BF16, 0, 0, 3), 0);
}

/* PREMUL_SUM(1 / f) (set_gradient_divide_factor): NCCL's chain is
 * ncclAvg's with the scalar t(float(1 / f)), so f = n gives AVG's bits;
 * gloo's (it has none) premultiplies each input, rounds, and sums as SUM.
 * The block path gives the scalar path's bits. */
static void premul_sum(void **state)
{
    (void)state;
    const float v[3] = { 211910.0f, 22975.0f, 125606.0f };
    for (int t = 0; t < 3; t++)
        for (int k = 0; k < 3; k++)
            assert_bits(cp_reduce_arith_pm(CP_ARITH_NCCL, (cp_dtype)t, CP_PREMUL_SUM, 3.0, v, 3, k),
                        cp_reduce_values_nccl((cp_dtype)t, CP_AVG, v, 3, k));
    const float w[2] = { 3.0f, 5.0f };
    assert_bits(cp_reduce_arith_pm(CP_ARITH_GLOO, CP_FP32, CP_PREMUL_SUM, 4.0, w, 2, 0), 2.0f);
    /* 1/3 rounds in fp32: 3 x float(1/3) + 5 x float(1/3), each product rounded, then summed */
    float s = (float)(1.0 / 3.0), a = 3.0f * s, b = 5.0f * s;
    assert_bits(cp_reduce_arith_pm(CP_ARITH_GLOO, CP_FP32, CP_PREMUL_SUM, 3.0, w, 2, 0), b + a);
    float x[3][40], out[40];
    const float *vp[3] = { x[0], x[1], x[2] };
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 40; j++) x[i][j] = (float)((i * 7919 + j * 104729) % 2003) / 17.0f - 50.0f;
    for (int a2 = 0; a2 < 2; a2++)
        for (int t = 0; t < 3; t++) {
            cp_reduce_arith_f_pm((cp_arith)a2, (cp_dtype)t, CP_PREMUL_SUM, 2.5, vp, 3, 1, 40, out);
            for (int j = 0; j < 40; j++) {
                float col[3] = { x[0][j], x[1][j], x[2][j] };
                float want = cp_reduce_arith_pm((cp_arith)a2, (cp_dtype)t, CP_PREMUL_SUM, 2.5, col, 3, 1);
                assert_bits(out[j], want);
            }
        }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(fp32_avg_three_ranks_as_recorded),
        cmocka_unit_test(premul_sum),
        cmocka_unit_test(fp32_avg_is_fused),
        cmocka_unit_test(bf16_avg_each_ring_start),
        cmocka_unit_test(fp16_avg_is_fused),
        cmocka_unit_test(fp16_sum_ring_order),
        cmocka_unit_test(one_and_two_ranks),
        cmocka_unit_test(all_reduce_key_one_channel),
        cmocka_unit_test(all_reduce_positions_of_every_split),
        cmocka_unit_test(gloo_all_reduce_three_ranks),
        cmocka_unit_test(gloo_all_reduce_fp32),
        cmocka_unit_test(gloo_reduce_scatter_is_an_all_reduce),
        cmocka_unit_test(gloo_all_reduce_four_ranks),
        cmocka_unit_test(gloo_all_reduce_key_large),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
