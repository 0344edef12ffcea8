/* Element types: fp32, bf16 and fp16 conversions with round-to-nearest-even,
 * and the reduction rules the backends and checks share: gloo's (ring
 * order, rounded per add, then divide) and NCCL's (ncclAvg premultiplies). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "commplan.h"
#include "cp_simd.h"

size_t cp_dtype_size(cp_dtype t) { return t == CP_FP32 ? 4 : t == CP_U8 ? 1 : 2; }

const char *cp_dtype_name(cp_dtype t)
{
    switch (t) {
    case CP_FP32: return "fp32";
    case CP_BF16: return "bf16";
    case CP_FP16: return "fp16";
    case CP_U8: return "u8";
    }
    return "?";
}

static uint32_t f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

uint16_t cp_float_to_bf16(float f)
{
    uint32_t u = f2u(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float cp_bf16_to_float(uint16_t h) { return u2f((uint32_t)h << 16); }

uint16_t cp_float_to_fp16(float f)
{
    uint32_t u = f2u(f);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* rounds to >= 65520: inf */
    if (a < 0x38800000u) {                                    /* subnormal or zero in fp16 */
        if (a < 0x33000000u) return (uint16_t)sign;           /* < half the smallest subnormal */
        uint32_t mant = (a & 0x7fffffu) | 0x800000u;
        int shift = 126 - (int)(a >> 23); /* 14..24 */
        uint32_t q = mant >> shift;
        uint32_t rem = mant & ((1u << shift) - 1u);
        uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1u))) q++;
        return (uint16_t)(sign | q);
    }
    uint32_t r = a + 0xfffu + ((a >> 13) & 1u);
    return (uint16_t)(sign | ((r - 0x38000000u) >> 13));
}

float cp_fp16_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
    if (exp == 0) {
        float v = ldexpf((float)mant, -24);
        return sign ? -v : v;
    }
    if (exp == 31) return u2f(sign | 0x7f800000u | (mant << 13));
    return u2f(sign | ((exp + 112u) << 23) | (mant << 13));
}

/* CP_U8 (raw bytes: a mixed-dtype unit's all-gather) loads and stores a
 * byte's value, 0..255, as the recordings print torch's uint8. */
float cp_load(cp_dtype t, const void *base, int64_t i)
{
    if (t == CP_FP32) return ((const float *)base)[i];
    if (t == CP_U8) return (float)((const unsigned char *)base)[i];
    uint16_t h = ((const uint16_t *)base)[i];
    return t == CP_BF16 ? cp_bf16_to_float(h) : cp_fp16_to_float(h);
}

void cp_store(cp_dtype t, void *base, int64_t i, float v)
{
    if (t == CP_FP32) ((float *)base)[i] = v;
    else if (t == CP_U8) ((unsigned char *)base)[i] = (unsigned char)v;
    else ((uint16_t *)base)[i] = t == CP_BF16 ? cp_float_to_bf16(v) : cp_float_to_fp16(v);
}

static float round_to(cp_dtype t, float v)
{
    if (t == CP_BF16) return cp_bf16_to_float(cp_float_to_bf16(v));
    if (t == CP_FP16) return cp_fp16_to_float(cp_float_to_fp16(v));
    return v;
}

/* MAX is exact in every backend's order: the largest input, unrounded. */
static float max_of(const float *v, int n)
{
    float m = v[0];
    for (int i = 1; i < n; i++) m = v[i] > m ? v[i] : m;
    return m;
}

float cp_reduce_values(cp_dtype t, cp_reduce_op op, const float *v, int n)
{
    if (op == CP_MAX) return max_of(v, n);
    float acc = 0.0f;
    for (int i = 0; i < n; i++) acc += v[i];
    if (op == CP_AVG) acc /= (float)n;
    return round_to(t, acc);
}

/* ---- NCCL's arithmetic (NVIDIA/nccl, master as of 2.28/2.29) ----
 *
 * ncclAvg on floating types is ncclDevPreMulSum (src/enqueue.cc,
 * hostToDevRedOp): the scalar is float(1.0 / nRanks), converted with
 * __float2half / __float2bfloat16 for the 16-bit types. Every input is
 * multiplied by it (Apply_PreOp<FuncPreMulSum>, src/device/reduce_kernel.h:
 * a * scalar in fp32, __hmul / __hmul2 in half and bfloat16 on sm_80+) and
 * the products are summed with FuncSum (fp32 +, __hadd / __hadd2), all in
 * the reduction dtype. The preOp is applied to the rank's own input as it
 * is loaded (reduceCopyPacks in src/device/common_kernel.h, LLGenericOp in
 * prims_ll.h: acc = preOp(local); acc = acc + recv), so nvcc contracts the
 * multiply and the add into one fma.rn.f32 (checked: nvcc 13 -O3 sm_90
 * emits fma.rn.f32 for that sequence; __hmul is documented as contractible,
 * unlike __hmul_rn). Only the rank that starts a chain rounds its product
 * alone.
 *
 * The order is the ring's (src/device/reduce_scatter.h runRing,
 * all_reduce.h runRing): the chunk that ends on ring position d starts on
 * d+1, which sends its premultiplied input; d+2 .. d-1 each add theirs
 * (recvReduceSend) and d adds its own last (recvReduceCopy). NCCL orders
 * the ring by communicator rank when every rank is its own node (one GPU
 * per host, as in the recordings: tests/oracle/nccl/fsdp3.*), so member
 * key+1 starts the chunk that member key receives.
 *
 * Where it does not hold: tree all-reduce, NVLS / CollNet and PAT (SUM
 * reduce-scatter with one GPU per node; AVG is never PAT), rings whose
 * intra-node order is not the rank order, and ring all-reduce, whose
 * finishing rank for an element depends on NCCL's channel and chunk split
 * (see cp_nccl_all_reduce_key; the checker accepts every position
 * cp_nccl_all_reduce_max_key allows). With 2 ranks (ncclAvg's 0.5 is exact,
 * and a sum of two halves rounds the same either way), or any power-of-two
 * group on exact data, every order gives the same bits. */

/* float(1.0 / n) in t, as hostToDevRedOp computes ncclAvg's scalar. */
static float nccl_avg_scalar(cp_dtype t, int n) { return round_to(t, (float)(1.0 / n)); }

/* a*s + c rounded once to t: the contracted preOp + FuncSum. */
static float fma_to(cp_dtype t, float a, float s, float c)
{
    if (t == CP_FP32) return fmaf(a, s, c);
    /* 16-bit a and s: a*s has at most 22 significant bits, exact in a
     * double; TwoSum gives the exact sum as d + e. Rounding d + e to float
     * with round-to-odd (24 bits >= 11 + 2) makes the final round to t a
     * correct rounding of the exact value. */
    double p = (double)a * (double)s;
    double d = p + (double)c;
    double bp = d - p;
    double e = (p - (d - bp)) + ((double)c - bp);
    float f = (float)d;
    if ((double)f != d || e != 0.0) {
        double dir = (double)f != d ? d - (double)f : e; /* where the exact value lies from f */
        if (!(f2u(f) & 1u)) f = nextafterf(f, dir > 0 ? INFINITY : -INFINITY);
    }
    return round_to(t, f);
}

float cp_reduce_values_nccl(cp_dtype t, cp_reduce_op op, const float *v, int n, int key)
{
    if (n == 1) return round_to(t, v[0]); /* ncclLaunchOneRank: a copy (scalar 1.0) */
    float s = op == CP_AVG ? nccl_avg_scalar(t, n) : 1.0f;
    int m = (key + 1) % n;
    float first = op == CP_AVG ? v[m] * s : v[m]; /* the chain's start: a plain, rounded product */
    float acc = round_to(t, first);
    for (int j = 2; j <= n; j++) {
        m = (key + j) % n;
        acc = op == CP_AVG ? fma_to(t, v[m], s, acc) : round_to(t, acc + v[m]);
    }
    return acc;
}

/* Where ring all-reduce finishes an element (NVIDIA/nccl master, 2.28/2.29:
 * src/device/all_reduce.h runRing, src/include/device.h ncclCollCbdPart,
 * src/enqueue.cc's channel split and calcCollChunking). The count is cut
 * into channel parts (whole 16-byte-multiple "cells", the last part taking
 * the remainder); each channel walks its part in loops of nranks x
 * chunkCount elements (chunkCount a multiple of the protocol's grain, 16 B
 * or more, from NCCL's buffer sizes, NCCL_BUFFSIZE or a tuner plugin); in a
 * loop, chunk c is finished on ring position c (step k-1,
 * directRecvReduceCopyDirectSend of chunk ringIx); the last, short loop
 * uses chunkCount = alignUp(divUp(remaining, nranks), 16 / sizeof(T)).
 * Channel count, cell size and chunk size are NCCL's run-time choices.
 *
 * cp_nccl_all_reduce_key models one channel and one loop (count under
 * nranks x chunkCount, what a small buffer on one channel gets): chunks of
 * alignUp(divUp(count, n), 16 / size) elements, so the 16-byte alignment
 * can leave the last positions without elements. */
int cp_nccl_all_reduce_key(cp_dtype t, int64_t i, int64_t count, int n)
{
    int64_t align = 16 / (int64_t)cp_dtype_size(t);
    int64_t chunk = (count + n - 1) / n;
    chunk = (chunk + align - 1) / align * align;
    return chunk > 0 && n > 0 ? (int)(i / chunk) : 0;
}

/* Every split: an element's position is (i - start of its loop) / chunk,
 * with the loop's start >= 0 and every chunk >= 16 bytes, so element i sits
 * in 16-byte block i / (16 / size) and can finish no later than that
 * position; every position up to it is reached by some split that 16-byte
 * granularity allows (a channel starting `position` blocks before the
 * element, 16-byte chunks), a superset of the splits NCCL makes. */
int cp_nccl_all_reduce_max_key(cp_dtype t, int64_t i, int n)
{
    int64_t block = i / (16 / (int64_t)cp_dtype_size(t));
    return n <= 0 ? 0 : block < n - 1 ? (int)block : n - 1;
}

/* ---- gloo's arithmetic (pytorch/gloo gloo/allreduce.cc, as torch 2.15's
 * ProcessGroupGloo calls it on CPU tensors) ----
 *
 * all_reduce is gloo::allreduce with the default algorithm, ring(). The
 * buffer is cut into numSegments = roundUp(max(ceil(bytes /
 * kMaxSegmentSize), 2 * size), size) segments of ceil(count / numSegments)
 * elements (kMaxSegmentSize = 1 MiB, gloo/allreduce.h), numSegments / size
 * consecutive segments to a chunk; chunk c ends on rank c (the last
 * segments may be short or empty, so chunks need not be count / size
 * long). Each rank r first sends its own chunk r+1 to rank r-1, which adds
 * its own and passes it on (computeReduceScatterOffsets), so chunk c is
 * summed in the order c-1, c-2, ..., c, every add rounded to the dtype
 * (gloo::sum<T>: c[i] = a[i] + b[i] in T; the 16-bit types add in fp32
 * and round). AVG is that sum, then divided by size and rounded again.
 * reduce_scatter_tensor (ProcessGroupGloo::reduce_scatter_tensor_coalesced)
 * is an all_reduce of the whole size x count input and rank r keeps chunk
 * r of at::chunk's split: its elements finish where the all_reduce of
 * size x count elements puts them, not necessarily on rank r.
 * Checked against torch 2.15 on gloo, fp32/bf16/fp16, SUM and AVG: 2 to 8
 * ranks with 1 to 333 elements a rank (all_reduce and reduce_scatter), 3
 * and 4 ranks all-reducing 4000001 and 5000003: every element matched. */

/* Gloo's ring sum of n members' values for the chunk ending on member key:
 * key-1, key-2, ..., key, rounded to t after every add. */
float cp_reduce_values_gloo(cp_dtype t, cp_reduce_op op, const float *v, int n, int key)
{
    float acc = round_to(t, v[((key - 1) % n + n) % n]);
    for (int j = 2; j <= n; j++) acc = round_to(t, acc + v[((key - j) % n + n) % n]);
    if (op == CP_AVG) acc = round_to(t, acc / (float)n);
    return acc;
}

int cp_gloo_all_reduce_key(cp_dtype t, int64_t i, int64_t count, int n)
{
    int64_t es = (int64_t)cp_dtype_size(t);
    int64_t max_segment = 1024 * 1024; /* gloo AllreduceOptionsImpl::kMaxSegmentSize, bytes */
    int64_t segments = (count * es + max_segment - 1) / max_segment;
    if (segments < 2 * (int64_t)n) segments = 2 * (int64_t)n;
    segments = (segments + n - 1) / n * n;
    int64_t segment = (count + segments - 1) / segments; /* elements: segmentBytes / elementSize */
    return segment > 0 ? (int)(i / segment / (segments / n)) : 0;
}

int cp_all_reduce_key(cp_arith a, cp_dtype t, int64_t i, int64_t count, int n)
{
    return a == CP_ARITH_NCCL ? cp_nccl_all_reduce_key(t, i, count, n) : cp_gloo_all_reduce_key(t, i, count, n);
}

int cp_reduce_scatter_key(cp_arith a, cp_dtype t, int key, int64_t i, int64_t count, int n)
{
    return a == CP_ARITH_NCCL ? key : cp_gloo_all_reduce_key(t, (int64_t)key * count + i, (int64_t)n * count, n);
}

float cp_reduce_arith(cp_arith a, cp_dtype t, cp_reduce_op op, const float *v, int n, int key)
{
    return cp_reduce_arith_pm(a, t, op, 0.0, v, n, key);
}

/* PREMUL_SUM's scalar in t: torch 2.15's ProcessGroupNCCL makes the
 * PreMulSum op with the scalar 1 / factor (a double) converted to the
 * tensor's type (ncclRedOpCreatePreMulSum, ncclScalarHostImmediate), as
 * ncclAvg's float(1.0 / nRanks). */
static float premul_scalar(cp_dtype t, double f) { return round_to(t, (float)(1.0 / f)); }

float cp_reduce_arith_pm(cp_arith a, cp_dtype t, cp_reduce_op op, double f, const float *v, int n, int key)
{
    if (op == CP_MAX) return max_of(v, n);
    if (op != CP_PREMUL_SUM)
        return a == CP_ARITH_NCCL ? cp_reduce_values_nccl(t, op, v, n, key) : cp_reduce_values_gloo(t, op, v, n, key);
    float s = premul_scalar(t, f);
    if (a == CP_ARITH_NCCL) { /* cp_reduce_values_nccl's ncclAvg chain with this scalar */
        int m = (key + 1) % n;
        float acc = round_to(t, v[m] * s);
        for (int j = 2; j <= n; j++) {
            m = (key + j) % n;
            acc = fma_to(t, v[m], s, acc);
        }
        return acc;
    }
    float acc = round_to(t, round_to(t, v[((key - 1) % n + n) % n] * s));
    for (int j = 2; j <= n; j++) acc = round_to(t, acc + round_to(t, v[((key - j) % n + n) % n] * s));
    return acc;
}

/* ---- the same arithmetic over runs of elements (the host backend's copies
 * and reductions, the checker's patterns) ----
 *
 * Each function below gives, element for element, the bits of the
 * per-element function it names (tests/c/test_runtime.c compares them on
 * random data, NaNs and infinities included, for every dtype). Work goes in
 * blocks of CP_BLOCK floats on the stack: loops of a constant trip count
 * over restrict pointers, which gcc -O2 vectorizes (its very-cheap cost
 * model takes no loop whose count it does not know). */

static inline uint16_t bf16_of(float f)
{
    uint32_t u = f2u(f);
    uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16, q = (u >> 16) | 0x40u;
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? q : r);
}

static inline float bf16_round(float f) { return u2f((uint32_t)bf16_of(f) << 16); }

CP_HOT static void load_block(cp_dtype t, const void *restrict src, int64_t n, float *restrict dst)
{
    if (t == CP_FP32) { memcpy(dst, src, (size_t)n * 4); return; }
    const uint16_t *restrict h = src;
    if (t == CP_BF16) {
        if (n == CP_BLOCK) for (int i = 0; i < CP_BLOCK; i++) dst[i] = u2f((uint32_t)h[i] << 16);
        else for (int64_t i = 0; i < n; i++) dst[i] = u2f((uint32_t)h[i] << 16);
        return;
    }
    for (int64_t i = 0; i < n; i++) dst[i] = cp_fp16_to_float(h[i]);
}

CP_HOT static void store_block(cp_dtype t, void *restrict dst, int64_t n, const float *restrict src)
{
    if (t == CP_FP32) { memcpy(dst, src, (size_t)n * 4); return; }
    uint16_t *restrict h = dst;
    if (t == CP_BF16) {
        if (n == CP_BLOCK) for (int i = 0; i < CP_BLOCK; i++) h[i] = bf16_of(src[i]);
        else for (int64_t i = 0; i < n; i++) h[i] = bf16_of(src[i]);
        return;
    }
    for (int64_t i = 0; i < n; i++) h[i] = cp_float_to_fp16(src[i]);
}

CP_HOT static void round_block(cp_dtype t, float *restrict v, int64_t n)
{
    if (t == CP_BF16) {
        if (n == CP_BLOCK) for (int i = 0; i < CP_BLOCK; i++) v[i] = bf16_round(v[i]);
        else for (int64_t i = 0; i < n; i++) v[i] = bf16_round(v[i]);
    } else if (t == CP_FP16)
        for (int64_t i = 0; i < n; i++) v[i] = cp_fp16_to_float(cp_float_to_fp16(v[i]));
}

void cp_load_n(cp_dtype t, const void *src, int64_t n, float *dst)
{
    size_t es = cp_dtype_size(t);
    for (int64_t i = 0; i < n; i += CP_BLOCK)
        load_block(t, (const char *)src + (size_t)i * es, n - i < CP_BLOCK ? n - i : CP_BLOCK, dst + i);
}

void cp_store_n(cp_dtype t, void *dst, int64_t n, const float *src)
{
    size_t es = cp_dtype_size(t);
    for (int64_t i = 0; i < n; i += CP_BLOCK)
        store_block(t, (char *)dst + (size_t)i * es, n - i < CP_BLOCK ? n - i : CP_BLOCK, src + i);
}

void cp_round_n(cp_dtype t, float *v, int64_t n)
{
    for (int64_t i = 0; i < n; i += CP_BLOCK) round_block(t, v + i, n - i < CP_BLOCK ? n - i : CP_BLOCK);
}

void cp_convert_n(cp_dtype to, void *dst, cp_dtype from, const void *src, int64_t n)
{
    size_t es_to = cp_dtype_size(to), es_from = cp_dtype_size(from);
    if (to == from) { memmove(dst, src, (size_t)n * es_to); return; }
    float buf[CP_BLOCK];
    for (int64_t i = 0; i < n; i += CP_BLOCK) {
        int64_t m = n - i < CP_BLOCK ? n - i : CP_BLOCK;
        load_block(from, (const char *)src + (size_t)i * es_from, m, buf);
        store_block(to, (char *)dst + (size_t)i * es_to, m, buf);
    }
}

/* ---- reductions over runs of elements that share one chain ---- */

/* Where the key of cp_gloo_all_reduce_key changes: elements [k * period,
 * (k + 1) * period) of the count share key k. */
static int64_t gloo_key_period(cp_dtype t, int64_t count, int n)
{
    int64_t es = (int64_t)cp_dtype_size(t);
    int64_t max_segment = 1024 * 1024;
    int64_t segments = (count * es + max_segment - 1) / max_segment;
    if (segments < 2 * (int64_t)n) segments = 2 * (int64_t)n;
    segments = (segments + n - 1) / n * n;
    int64_t segment = (count + segments - 1) / segments;
    return segment * (segments / n);
}

int cp_all_reduce_key_run(cp_arith a, cp_dtype t, int64_t i, int64_t count, int n, int64_t *end)
{
    int key = cp_all_reduce_key(a, t, i, count, n);
    int64_t period;
    if (a == CP_ARITH_NCCL) {
        int64_t align = 16 / (int64_t)cp_dtype_size(t);
        period = (count + n - 1) / n;
        period = (period + align - 1) / align * align;
    } else period = gloo_key_period(t, count, n);
    *end = period > 0 && n > 0 ? ((int64_t)key + 1) * period : count;
    if (*end > count) *end = count;
    if (*end <= i) *end = i + 1;
    return key;
}

int cp_reduce_scatter_key_run(cp_arith a, cp_dtype t, int key, int64_t i, int64_t count, int n, int64_t *end)
{
    if (a == CP_ARITH_NCCL) { *end = count > i ? count : i + 1; return key; }
    int64_t g = (int64_t)key * count + i, gend;
    int k = cp_all_reduce_key_run(a, t, g, (int64_t)n * count, n, &gend);
    *end = gend - (int64_t)key * count;
    if (*end > count) *end = count;
    if (*end <= i) *end = i + 1;
    return k;
}

CP_HOT static void max_block(const float *const *v, int n, int64_t off, int64_t len, float *restrict out)
{
    memcpy(out, v[0] + off, (size_t)len * sizeof *out);
    for (int m = 1; m < n; m++) {
        const float *restrict x = v[m] + off;
        if (len == CP_BLOCK) for (int i = 0; i < CP_BLOCK; i++) out[i] = x[i] > out[i] ? x[i] : out[i];
        else for (int64_t i = 0; i < len; i++) out[i] = x[i] > out[i] ? x[i] : out[i];
    }
}

CP_HOT static void add_round_block(cp_dtype t, float *restrict acc, const float *restrict x, int64_t len)
{
    if (len == CP_BLOCK) for (int i = 0; i < CP_BLOCK; i++) acc[i] += x[i];
    else for (int64_t i = 0; i < len; i++) acc[i] += x[i];
    round_block(t, acc, len);
}

/* acc[i] = fmaf(x[i], s, acc[i]): NCCL's fused premultiply and add in
 * fp32, one rounding (fma_to's fp32 case). A clone for CPUs with FMA makes
 * it one instruction a lane instead of a call to libm's fmaf; the bits are
 * the same (both round the exact a*s+c once). */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
__attribute__((target_clones("fma", "default")))
#endif
static void fma_block(float *restrict acc, const float *restrict x, float s, int64_t len)
{
    CP_LOOP(len, acc[j] = fmaf(x[j], s, acc[j]));
}

/* One block (len <= CP_BLOCK) of cp_reduce_arith with one key. */
static void reduce_block(cp_arith a, cp_dtype t, cp_reduce_op op, double f, const float *const *v, int n, int key,
                         int64_t off, int64_t len, float *restrict out)
{
    if (op == CP_MAX) { max_block(v, n, off, len, out); return; }
    int pm = op == CP_AVG || op == CP_PREMUL_SUM; /* NCCL premultiplies */
    if (a == CP_ARITH_NCCL) {
        if (n == 1 && op != CP_PREMUL_SUM) {
            memcpy(out, v[0] + off, (size_t)len * sizeof *out);
            round_block(t, out, len);
            return;
        }
        float s = op == CP_AVG ? nccl_avg_scalar(t, n) : op == CP_PREMUL_SUM ? premul_scalar(t, f) : 1.0f;
        const float *x = v[(key + 1) % n] + off;
        if (pm) for (int64_t i = 0; i < len; i++) out[i] = x[i] * s;
        else memcpy(out, x, (size_t)len * sizeof *out);
        round_block(t, out, len);
        for (int j = 2; j <= n; j++) {
            x = v[(key + j) % n] + off;
            if (pm && t == CP_FP32) fma_block(out, x, s, len);
            else if (pm) for (int64_t i = 0; i < len; i++) out[i] = fma_to(t, x[i], s, out[i]);
            else add_round_block(t, out, x, len);
        }
        return;
    }
    if (op == CP_PREMUL_SUM) { /* gloo has none: each input premultiplied and rounded, then its SUM */
        float s = premul_scalar(t, f), x[CP_BLOCK];
        for (int j = 1; j <= n; j++) {
            const float *in = v[((key - j) % n + n) % n] + off;
            float *dst = j == 1 ? out : x;
            for (int64_t i = 0; i < len; i++) dst[i] = in[i] * s;
            round_block(t, dst, len);
            if (j > 1) add_round_block(t, out, x, len);
        }
        return;
    }
    memcpy(out, v[((key - 1) % n + n) % n] + off, (size_t)len * sizeof *out);
    round_block(t, out, len);
    for (int j = 2; j <= n; j++) add_round_block(t, out, v[((key - j) % n + n) % n] + off, len);
    if (op == CP_AVG) {
        float d = (float)n;
        for (int64_t i = 0; i < len; i++) out[i] /= d;
        round_block(t, out, len);
    }
}

void cp_reduce_arith_f(cp_arith a, cp_dtype t, cp_reduce_op op, const float *const *v, int n, int key, int64_t len,
                       float *out)
{
    cp_reduce_arith_f_pm(a, t, op, 0.0, v, n, key, len, out);
}

void cp_reduce_arith_f_pm(cp_arith a, cp_dtype t, cp_reduce_op op, double f, const float *const *v, int n, int key,
                          int64_t len, float *out)
{
    for (int64_t i = 0; i < len; i += CP_BLOCK)
        reduce_block(a, t, op, f, v, n, key, i, len - i < CP_BLOCK ? len - i : CP_BLOCK, out + i);
}

int cp_reduce_arith_n(cp_arith a, cp_dtype t, cp_reduce_op op, const void *const *in, int n, int key, int64_t len,
                      void *out)
{
    return cp_reduce_arith_n_pm(a, t, op, 0.0, in, n, key, len, out);
}

int cp_reduce_arith_n_pm(cp_arith a, cp_dtype t, cp_reduce_op op, double f, const void *const *in, int n, int key,
                         int64_t len, void *out)
{
    enum { MAX_STACK = 16 };
    float stack[MAX_STACK][CP_BLOCK], *heap = NULL, res[CP_BLOCK];
    const float *vp_stack[MAX_STACK], **vp = vp_stack;
    float *rows = &stack[0][0];
    if (n > MAX_STACK) {
        heap = malloc((size_t)n * CP_BLOCK * sizeof(float) + (size_t)n * sizeof *vp);
        if (!heap) return -1;
        rows = heap;
        vp = (const float **)(void *)(heap + (size_t)n * CP_BLOCK);
    }
    size_t es = cp_dtype_size(t);
    for (int64_t i = 0; i < len; i += CP_BLOCK) {
        int64_t m = len - i < CP_BLOCK ? len - i : CP_BLOCK;
        for (int q = 0; q < n; q++) {
            load_block(t, (const char *)in[q] + (size_t)i * es, m, rows + (size_t)q * CP_BLOCK);
            vp[q] = rows + (size_t)q * CP_BLOCK;
        }
        reduce_block(a, t, op, f, vp, n, key, 0, m, res);
        store_block(t, (char *)out + (size_t)i * es, m, res);
    }
    free(heap);
    return 0;
}
