/* The host backend's fast copies and reductions (runtime/dtype.c's run
 * functions, backend_host.c's copy kernels) against the generic
 * per-element path they replaced, kept here as the reference: random bits
 * (NaNs, infinities, subnormals included), every (orig, param, reduce)
 * dtype triple of tests/plans/kernels_all_dtypes.lua, pre- and post-divides,
 * every reduce op, both arithmetics, 1 to 19 members, chain runs against the
 * per-element keys. Byte for byte. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "commplan.h"
#include "host.h"

static uint64_t rng = 0x9e3779b97f4a7c15ULL;
static uint32_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}

/* Random elements of t: mostly ordinary values, some raw bit patterns
 * (NaNs of every payload, infinities, subnormals, zeros of both signs). */
static void fill_random(cp_dtype t, void *buf, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        uint32_t r = rnd();
        if (r % 8 == 0) { /* raw bits */
            if (t == CP_FP32) { uint32_t b = rnd() << 16 ^ rnd(); memcpy((char *)buf + 4 * i, &b, 4); }
            else ((uint16_t *)buf)[i] = (uint16_t)rnd();
            continue;
        }
        float v = (float)((int32_t)(rnd() % 20001u) - 10000) / (float)(1u + rnd() % 97u);
        cp_store(t, buf, i, v);
    }
}

/* Equal bits, or both NaN: where two NaNs meet in an add, which payload
 * survives is the hardware's and the compiler's choice (IEEE 754 leaves it
 * open; gcc may swap an add's operands, scalar or vector), in the old path
 * as in the new. Every other value must match bit for bit. */
static int same_bits(cp_dtype t, const void *a, const void *b, int64_t n, int64_t *at)
{
    for (int64_t i = 0; i < n; i++) {
        float x = cp_load(t, a, i), y = cp_load(t, b, i);
        if (memcmp((const char *)a + (size_t)i * cp_dtype_size(t), (const char *)b + (size_t)i * cp_dtype_size(t),
                   cp_dtype_size(t)) == 0 || (x != x && y != y))
            continue;
        *at = i;
        return 0;
    }
    return 1;
}

/* ---- the reference: the per-element path as it was ---- */

static char *at(void *base, int64_t i, cp_dtype t) { return (char *)base + (size_t)i * cp_dtype_size(t); }

static float round_to(cp_dtype t, float v)
{
    float out;
    cp_store(t, &out, 0, v);
    return cp_load(t, &out, 0);
}

static void ref_copy_in(const cp_plan *p, int u, int shard_rank, const void *sharded, void *ag)
{
    const cp_unit *U = &p->units[u];
    void *slot = at(ag, (int64_t)shard_rank * U->total, U->ag_dtype);
    if (U->orig_dtype == U->ag_dtype) {
        memcpy(slot, sharded, (size_t)U->total * cp_dtype_size(U->ag_dtype));
        return;
    }
    for (int64_t i = 0; i < U->total; i++) cp_store(U->ag_dtype, slot, i, cp_load(U->orig_dtype, sharded, i));
}

static void ref_copy_out(const cp_plan *p, int u, int shard_rank, const void *ag, void *unsharded)
{
    const cp_unit *U = &p->units[u];
    int64_t W = p->shard_size;
    size_t es = cp_dtype_size(U->ag_dtype);
    (void)shard_rank;
    for (int j = 0; j < U->nparams; j++) {
        const cp_param *prm = &p->params[U->first_param + j];
        char *dst = at(unsharded, W * prm->offset, U->ag_dtype);
        for (int64_t r = 0; r < W; r++)
            for (int64_t o = 0; o < prm->outer; o++)
                memcpy(dst + (size_t)(o * W * prm->run + r * prm->run) * es,
                       (const char *)ag + (size_t)(r * U->total + prm->offset + o * prm->run) * es,
                       (size_t)prm->run * es);
    }
}

static void ref_pack(const cp_plan *p, int u, int shard_rank, const void *grads, void *rs_in)
{
    const cp_unit *U = &p->units[u];
    int64_t W = p->shard_size;
    (void)shard_rank;
    for (int j = 0; j < U->nparams; j++) {
        const cp_param *prm = &p->params[U->first_param + j];
        const char *g = (const char *)grads + (size_t)prm->grad_offset * cp_dtype_size(U->grad_dtype);
        for (int64_t r = 0; r < W; r++)
            for (int64_t o = 0; o < prm->outer; o++) {
                int64_t src = o * W * prm->run + r * prm->run;
                int64_t dst = r * U->total + prm->offset + o * prm->run;
                for (int64_t t = 0; t < prm->run; t++) {
                    float v = src + t < prm->numel ? cp_load(U->grad_dtype, g, src + t) : 0.0f;
                    v = round_to(U->reduce_dtype, v);
                    if (U->pre_divide != 1.0) v = (float)(v / U->pre_divide);
                    cp_store(U->reduce_dtype, rs_in, dst + t, v);
                }
            }
    }
}

static void ref_view_out(const cp_plan *p, int u, int shard_rank, const void *rs_out, void *sharded_grads)
{
    const cp_unit *U = &p->units[u];
    (void)shard_rank;
    for (int64_t i = 0; i < U->total; i++) {
        float v = cp_load(U->reduce_dtype, rs_out, i);
        if (U->post_divide != 1.0) v = round_to(U->reduce_dtype, (float)(v / U->post_divide));
        cp_store(U->orig_dtype, sharded_grads, i, v);
    }
}

static void ref_view_out_add(const cp_plan *p, int u, int shard_rank, const void *rs_out, void *sharded_grads)
{
    const cp_unit *U = &p->units[u];
    (void)shard_rank;
    for (int64_t i = 0; i < U->total; i++) {
        float v = cp_load(U->reduce_dtype, rs_out, i);
        if (U->post_divide != 1.0) v = round_to(U->reduce_dtype, (float)(v / U->post_divide));
        v = round_to(U->orig_dtype, v);
        cp_store(U->orig_dtype, sharded_grads, i, cp_load(U->orig_dtype, sharded_grads, i) + v);
    }
}

static void ref_flat_copy(const cp_plan *p, int u, int shard_rank, const void *in, void *out)
{
    const cp_unit *U = &p->units[u];
    (void)shard_rank;
    memcpy(out, in, (size_t)U->total * cp_dtype_size(U->reduce_dtype));
}

static void ref_flat_add(const cp_plan *p, int u, int shard_rank, const void *in, void *out)
{
    const cp_unit *U = &p->units[u];
    (void)shard_rank;
    for (int64_t i = 0; i < U->total; i++)
        cp_store(U->reduce_dtype, out, i, cp_load(U->reduce_dtype, out, i) + cp_load(U->reduce_dtype, in, i));
}

static void (*const REF[7])(const cp_plan *, int, int, const void *, void *) = {
    ref_copy_in, ref_copy_out, ref_pack, ref_view_out, ref_view_out_add, ref_flat_copy, ref_flat_add
};

/* ---- one unit, three shards: Shard(0) with padding, Shard(1), runs past a block ---- */

enum { W = 3 };
static const cp_param PARAMS[3] = {
    /* (7, 5) over 3: chunk 3, run 15, the last rank 5 real of 15 */
    { .name = "a", .ndim = 2, .shape = { 7, 5 }, .shard_dim = 0, .numel = 35, .chunk = 3, .outer = 1, .run = 15,
      .padded = 15, .offset = 0, .grad_offset = 0 },
    /* (4, 9) Shard(1): 4 rows of 3 */
    { .name = "b", .ndim = 2, .shape = { 4, 9 }, .shard_dim = 1, .numel = 36, .chunk = 3, .outer = 4, .run = 3,
      .padded = 12, .offset = 15, .grad_offset = 40 },
    /* (1000, 1) over 3: runs of 334 (more than a block) */
    { .name = "c", .ndim = 2, .shape = { 1000, 1 }, .shard_dim = 0, .numel = 1000, .chunk = 334, .outer = 1,
      .run = 334, .padded = 334, .offset = 27, .grad_offset = 80 },
};
enum { TOTAL = 361, GRADS = 1080 };

static cp_plan one_unit_plan(cp_unit *U)
{
    cp_plan p = { .name = "fastpath", .fingerprint = "0", .world_size = 1, .mesh_ndim = 1, .mesh_names = { "dp_shard" },
                  .mesh_sizes = { 1 }, .shard_size = W, .replicate_size = 1, .shard_family = -1,
                  .replicate_family = -1, .micro_steps = 1, .nunits = 1, .units = U, .nparams = 3, .params = PARAMS,
                  .nevents = 1, .tp_size = 1, .tp_mesh_dim = -1 };
    return p;
}

static size_t kernel_bytes(const cp_unit *U, int kernel, int out)
{
    cp_dtype o = U->orig_dtype, a = U->ag_dtype, r = U->reduce_dtype, g = U->grad_dtype;
    switch (kernel) {
    case 0: return out ? (size_t)W * TOTAL * cp_dtype_size(a) : TOTAL * cp_dtype_size(o);
    case 1: return (size_t)W * TOTAL * cp_dtype_size(a);
    case 2: return out ? (size_t)W * TOTAL * cp_dtype_size(r) : GRADS * cp_dtype_size(g);
    case 3: case 4: return out ? TOTAL * cp_dtype_size(o) : TOTAL * cp_dtype_size(r);
    default: return TOTAL * cp_dtype_size(r);
    }
}

static cp_dtype dtype_of(const cp_unit *U, int kernel, int out)
{
    switch (kernel) {
    case 0: return out ? U->ag_dtype : U->orig_dtype;
    case 1: return U->ag_dtype;
    case 2: return out ? U->reduce_dtype : U->grad_dtype;
    case 3: case 4: return out ? U->orig_dtype : U->reduce_dtype;
    default: return U->reduce_dtype;
    }
}

static void test_copies_every_dtype_triple(void **state)
{
    (void)state;
    static const double divides[][2] = { { 1.0, 1.0 }, { 3.0, 1.0 }, { 1.0, 3.0 }, { 2.0, 4.0 } };
    int checked = 0;
    for (int o = 0; o < 3; o++)
        for (int a = 0; a < 3; a++)
            for (int r = 0; r < 3; r++)
                for (int g = 0; g < 2; g++) /* grads in the reduce dtype, or in the param dtype */
                    for (size_t d = 0; d < sizeof divides / sizeof divides[0]; d++) {
                        cp_unit U = { .name = "u", .first_param = 0, .nparams = 3, .total = TOTAL, .numel = 1071,
                                      .grads_numel = GRADS, .orig_dtype = (cp_dtype)o, .ag_dtype = (cp_dtype)a,
                                      .reduce_dtype = (cp_dtype)r, .grad_dtype = (cp_dtype)(g ? a : r),
                                      .rs_op = CP_SUM, .ar_op = CP_SUM, .pre_divide = divides[d][0],
                                      .post_divide = divides[d][1] };
                        cp_plan p = one_unit_plan(&U);
                        cp_host_world *w = cp_host_world_create(&p);
                        assert_non_null(w);
                        cp_backend b;
                        cp_host_backend_init(&b, w, 0);
                        for (int k = 0; k < 7; k++) {
                            size_t ib = kernel_bytes(&U, k, 0), ob = kernel_bytes(&U, k, 1);
                            unsigned char *in = malloc(ib), *want = malloc(ob), *got = malloc(ob);
                            assert_true(in && want && got);
                            fill_random(dtype_of(&U, k, 0), in, (int64_t)(ib / cp_dtype_size(dtype_of(&U, k, 0))));
                            fill_random(dtype_of(&U, k, 1), want, (int64_t)(ob / cp_dtype_size(dtype_of(&U, k, 1))));
                            memcpy(got, want, ob);
                            REF[k](&p, 0, 0, in, want);
                            assert_int_equal(b.copy(&b, k, 0, 0, 0, CP_STREAM_COMPUTE, in, got), 0);
                            cp_dtype ot = dtype_of(&U, k, 1);
                            int64_t at;
                            if (!same_bits(ot, want, got, (int64_t)(ob / cp_dtype_size(ot)), &at))
                                fail_msg("kernel %d, dtypes %s %s %s (grads %s), divides %g %g: element %lld differs",
                                         k, cp_dtype_name(U.orig_dtype), cp_dtype_name(U.ag_dtype),
                                         cp_dtype_name(U.reduce_dtype), cp_dtype_name(U.grad_dtype), divides[d][0],
                                         divides[d][1], (long long)at);
                            checked++;
                            free(in); free(want); free(got);
                        }
                        cp_host_world_destroy(w);
                    }
    assert_int_equal(checked, 27 * 2 * 4 * 7);
}

/* cp_load_n, cp_store_n, cp_round_n, cp_convert_n against the per-element functions. */
static void test_run_conversions(void **state)
{
    (void)state;
    enum { N = 1000 };
    for (int t = 0; t < 3; t++)
        for (int f = 0; f < 3; f++) {
            unsigned char src[N * 4], want[N * 4], got[N * 4];
            float v[N], fw[N];
            fill_random((cp_dtype)f, src, N);
            for (int i = 0; i < N; i++) cp_store((cp_dtype)t, want, i, cp_load((cp_dtype)f, src, i));
            if (t == f) memcpy(want, src, (size_t)N * cp_dtype_size((cp_dtype)t)); /* the bits, as the copy-in */
            cp_convert_n((cp_dtype)t, got, (cp_dtype)f, src, N);
            assert_memory_equal(want, got, (size_t)N * cp_dtype_size((cp_dtype)t));
            cp_load_n((cp_dtype)f, src, N, v);
            for (int i = 0; i < N; i++) {
                float x = cp_load((cp_dtype)f, src, i);
                assert_memory_equal(&x, &v[i], 4);
                fw[i] = round_to((cp_dtype)t, v[i]);
            }
            cp_round_n((cp_dtype)t, v, N);
            assert_memory_equal(fw, v, sizeof v);
            for (int i = 0; i < N; i++) cp_store((cp_dtype)t, want, i, v[i]);
            cp_store_n((cp_dtype)t, got, N, v);
            assert_memory_equal(want, got, (size_t)N * cp_dtype_size((cp_dtype)t));
        }
}

/* Chain runs: every element's key as the per-element functions give it,
 * and each run ends where the key changes. */
static void test_key_runs(void **state)
{
    (void)state;
    static const int64_t counts[] = { 1, 2, 7, 33, 1000, 300001, 1500000 };
    for (int a = 0; a < 2; a++)
        for (int t = 0; t < 3; t++)
            for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++)
                for (int n = 1; n <= 9; n += 2) {
                    int64_t count = counts[c], end;
                    for (int64_t i = 0; i < count; i = end) {
                        int k = cp_all_reduce_key_run((cp_arith)a, (cp_dtype)t, i, count, n, &end);
                        assert_true(end > i && end <= count);
                        for (int64_t j = i; j < end; j += (end - i > 64 ? (end - i) / 64 : 1))
                            assert_int_equal(cp_all_reduce_key((cp_arith)a, (cp_dtype)t, j, count, n), k);
                        assert_int_equal(cp_all_reduce_key((cp_arith)a, (cp_dtype)t, end - 1, count, n), k);
                        if (end < count) assert_int_not_equal(cp_all_reduce_key((cp_arith)a, (cp_dtype)t, end, count, n), k);
                    }
                    for (int key = 0; key < n; key++)
                        for (int64_t i = 0; i < count; i = end) {
                            int k = cp_reduce_scatter_key_run((cp_arith)a, (cp_dtype)t, key, i, count, n, &end);
                            assert_true(end > i && end <= count);
                            assert_int_equal(cp_reduce_scatter_key((cp_arith)a, (cp_dtype)t, key, i, count, n), k);
                            assert_int_equal(cp_reduce_scatter_key((cp_arith)a, (cp_dtype)t, key, end - 1, count, n), k);
                            if (end < count)
                                assert_int_not_equal(cp_reduce_scatter_key((cp_arith)a, (cp_dtype)t, key, end, count, n), k);
                        }
                }
}

/* cp_reduce_arith_n / _f against cp_reduce_arith element by element. */
static void test_reductions(void **state)
{
    (void)state;
    enum { N = 700, MEMBERS = 19 };
    static const int sizes[] = { 1, 2, 3, 4, 5, 8, 17, MEMBERS };
    for (int a = 0; a < 2; a++)
        for (int t = 0; t < 3; t++)
            for (int op = 0; op < 3; op++)
                for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
                    int n = sizes[s], key = (int)(rnd() % (unsigned)n);
                    size_t es = cp_dtype_size((cp_dtype)t);
                    unsigned char *in[MEMBERS], want[N * 4], got[N * 4];
                    float fv[MEMBERS][N], fout[N];
                    const void *ptr[MEMBERS];
                    const float *fp[MEMBERS];
                    for (int m = 0; m < n; m++) {
                        in[m] = malloc((size_t)N * es);
                        assert_non_null(in[m]);
                        fill_random((cp_dtype)t, in[m], N);
                        ptr[m] = in[m];
                        cp_load_n((cp_dtype)t, in[m], N, fv[m]);
                        fp[m] = fv[m];
                    }
                    for (int i = 0; i < N; i++) {
                        float v[MEMBERS];
                        for (int m = 0; m < n; m++) v[m] = cp_load((cp_dtype)t, in[m], i);
                        cp_store((cp_dtype)t, want, i, cp_reduce_arith((cp_arith)a, (cp_dtype)t, (cp_reduce_op)op, v, n, key));
                    }
                    assert_int_equal(cp_reduce_arith_n((cp_arith)a, (cp_dtype)t, (cp_reduce_op)op, ptr, n, key, N, got), 0);
                    int64_t bad;
                    if (!same_bits((cp_dtype)t, want, got, N, &bad))
                        fail_msg("%s %s %s over %d members, key %d: element %lld differs", a ? "nccl" : "gloo",
                                 cp_dtype_name((cp_dtype)t), op == 0 ? "sum" : op == 1 ? "avg" : "max", n, key,
                                 (long long)bad);
                    cp_reduce_arith_f((cp_arith)a, (cp_dtype)t, (cp_reduce_op)op, fp, n, key, N, fout);
                    for (int i = 0; i < N; i++) {
                        float v[MEMBERS];
                        for (int m = 0; m < n; m++) v[m] = fv[m][i];
                        float w = cp_reduce_arith((cp_arith)a, (cp_dtype)t, (cp_reduce_op)op, v, n, key);
                        int64_t at;
                        if (!same_bits(CP_FP32, &w, &fout[i], 1, &at))
                            fail_msg("run reduction of floats, element %d: %.9g, want %.9g", i, (double)fout[i], (double)w);
                    }
                    for (int m = 0; m < n; m++) free(in[m]);
                }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_copies_every_dtype_triple),
        cmocka_unit_test(test_run_conversions),
        cmocka_unit_test(test_key_runs),
        cmocka_unit_test(test_reductions),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
