/* Copy kernels for one plan's units: all-gather copy-in (with the
 * param_dtype cast), copy-out, reduce-scatter packing (chunk_cat) and the
 * view-out into sharded grads. The per-vector-group bodies are
 * __host__ __device__ so tests run the exact index math on the host
 * against the C executor. Included once, by runtime/cp_kernels.cu. */
#ifndef COMMPLAN_KERNELS_CUH
#define COMMPLAN_KERNELS_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* Work split: every kernel runs one block of CP_KTHREADS threads per tile
 * of consecutive elements of one piece, each thread moving CP_KNV vectors of
 * V elements (16 bytes of the output dtype where the unit is aligned, else
 * 1): CP_KTILE_OF(V) elements per tile. A piece is contiguous on both sides
 * of the copy: (rank slot r, parameter p) for copy-out and packing, the
 * whole unit for copy-in and view-out. The generator numbers each
 * parameter's tiles (tile_out, tile_pack) so a block finds its piece with
 * one division and a short search instead of dividing per element. */
#define CP_KTHREADS 256
#define CP_KNV 4
#define CP_KTILE_OF(V) ((long long)CP_KTHREADS * CP_KNV * (V))

struct cp_kparam {
    long long offset, outer, run, padded, numel, grad_offset;
    long long rs_offset; /* in the reduce-scatter row (cp_param_rs_offset: a frozen parameter has no tiles there) */
    int tile_out, tile_pack; /* first copy-out / packing tile of this parameter within one rank's pieces */
};

struct cp_kunit {
    int first_param, nparams;
    long long total;
    long long rs_total; /* the reduce-scatter row, the sharded grads (cp_unit_rs_total; a part's: its own) */
    float pre_divide, post_divide;
    int vec_ok; /* every offset, run and the total are multiples of 16 bytes' worth of elements */
    int tiles_out, tiles_pack; /* tiles of one rank's pieces: sum over parameters of ceil(padded / tile) */
    int W; /* ranks of the unit's shard group: the plan's, or an experts unit's own (cp_unit_shard_size) */
};

struct cp_kview {
    const cp_kparam *params; /* this unit's parameters (a part's: its first) */
    cp_kunit unit;           /* a part's: its nparams, total (each rank's packed row) and tiles_pack */
    int W; /* the unit's shard group size (unit.W): the rank slots copy-out and packing cut */
    /* A part of the unit (a partial reduction's pack: foreach_reduce over the
     * parameters with a gradient): its first parameter's slot offset and
     * first packing tile, which its rows and tiles count from; 0 for the unit. */
    long long base;
    int tile_base_pack;
};

template <typename T> __host__ __device__ inline float cp_to_float(T v);
template <> __host__ __device__ inline float cp_to_float<float>(float v) { return v; }
template <> __host__ __device__ inline float cp_to_float<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }
template <> __host__ __device__ inline float cp_to_float<__half>(__half v) { return __half2float(v); }
template <typename T> __host__ __device__ inline T cp_from_float(float v);
template <> __host__ __device__ inline float cp_from_float<float>(float v) { return v; }
template <> __host__ __device__ inline __nv_bfloat16 cp_from_float<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <> __host__ __device__ inline __half cp_from_float<__half>(float v) { return __float2half_rn(v); }

/* Parameter owning tile k of a rank's pieces (the last whose first tile is <= k). */
__host__ __device__ inline int cp_kfind_tile(const cp_kview &v, int k, bool pack)
{
    int lo = 0, hi = v.unit.nparams - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if ((pack ? v.params[mid].tile_pack - v.tile_base_pack : v.params[mid].tile_out) <= k) lo = mid; else hi = mid - 1;
    }
    return lo;
}

template <typename A, typename B> struct cp_same { static const bool value = false; };
template <typename A> struct cp_same<A, A> { static const bool value = true; };

/* V elements as one load of V * sizeof(T) bytes where that is 16 (or 8, 4)
 * bytes on the device; memcpy on the host (no aliasing games in the CPU
 * build the tests run). */
template <typename T, int V> struct alignas(sizeof(T) * V) cp_kvec { T e[V]; };

/* The emulated GPU (tests/emu) sees every byte a kernel loads or stores:
 * its race detector and bounds check. Nothing otherwise. */
#ifdef CP_CUDA_EMULATOR
#define CP_KACCESS(p, n, w) cudaEmuAccess((p), (n), (w))
#else
#define CP_KACCESS(p, n, w) ((void)0)
#endif

template <int N> struct cp_kword;
struct alignas(16) cp_kword32 { uint4 lo, hi; }; /* two 16-byte accesses */
template <> struct cp_kword<32> { typedef cp_kword32 type; };
template <> struct cp_kword<16> { typedef uint4 type; };
template <> struct cp_kword<8> { typedef uint2 type; };
template <> struct cp_kword<4> { typedef unsigned int type; };
template <> struct cp_kword<2> { typedef unsigned short type; };

template <typename T, int V> __host__ __device__ inline void cp_kload(cp_kvec<T, V> &d, const T *src)
{
#ifdef __CUDA_ARCH__
    typedef typename cp_kword<sizeof(T) * V>::type word;
    *reinterpret_cast<word *>(d.e) = *reinterpret_cast<const word *>(src);
#else
    CP_KACCESS(src, sizeof(T) * V, 0);
    memcpy(d.e, src, sizeof(T) * V);
#endif
}

template <typename T, int V> __host__ __device__ inline void cp_kstore(T *dst, const cp_kvec<T, V> &d)
{
#ifdef __CUDA_ARCH__
    typedef typename cp_kword<sizeof(T) * V>::type word;
    *reinterpret_cast<word *>(dst) = *reinterpret_cast<const word *>(d.e);
#else
    CP_KACCESS(dst, sizeof(T) * V, 1);
    memcpy(dst, d.e, sizeof(T) * V);
#endif
}

/* One element read outside the vector path (packing's zero padding). */
template <typename T> __host__ __device__ inline T cp_kread1(const T *src)
{
#ifndef __CUDA_ARCH__
    CP_KACCESS(src, sizeof(T), 0);
#endif
    return src[0];
}

/* Divide, cast and divide V loaded elements as FSDP2's foreach_reduce
 * does, then store them (add: into what dst holds, in its dtype, as
 * FSDP2's sharded_param.grad += new_sharded_grad): in_div divides in the
 * input dtype before the cast
 * (the view-out's post-divide: in the reduce dtype, then the cast to the
 * parameter's), out_div in the output dtype after it (the packing's
 * pre-divide: the cast to the reduce dtype, then the divide). Each divide
 * is torch's div_ on a tensor of that dtype: in fp32, rounded to the dtype.
 * (On CUDA div_ by a scalar multiplies by its fp32 reciprocal; FSDP2
 * divides only fp16 tensors, whose quotients by these factors round to the
 * same fp16 either way.) */
template <typename TI, typename TO, int V>
__host__ __device__ inline void cp_kput(TO *dst, const cp_kvec<TI, V> &in, float in_div, float out_div, bool add)
{
    if (!add && cp_same<TI, TO>::value && in_div == 1.0f && out_div == 1.0f) { /* plain move, bits untouched */
        cp_kstore<TO, V>(dst, reinterpret_cast<const cp_kvec<TO, V> &>(in));
        return;
    }
    cp_kvec<TO, V> out = {};
    if (add) cp_kload<TO, V>(out, dst);
    for (int k = 0; k < V; k++) {
        TI a = in.e[k];
        if (in_div != 1.0f) a = cp_from_float<TI>(cp_to_float<TI>(a) / in_div);
        TO b = cp_from_float<TO>(cp_to_float<TI>(a));
        if (out_div != 1.0f) b = cp_from_float<TO>(cp_to_float<TO>(b) / out_div);
        out.e[k] = add ? cp_from_float<TO>(cp_to_float<TO>(out.e[k]) + cp_to_float<TO>(b)) : b;
    }
    cp_kstore<TO, V>(dst, out);
}

/* One tile of one piece: elements [j0, end) of a piece whose source and
 * destination addresses come from Map (src(j), dst(j) for a V-aligned j).
 * Each thread first loads all its vectors, then stores them: NV loads in
 * flight per thread keep HBM busy. A full tile with a contiguous map takes
 * the batched path; the rest goes element group by element group. */
template <typename TI, typename TO, int V, typename Map>
__host__ __device__ inline void cp_ktile(const Map &m, long long j0, long long end, int lane, float in_div,
                                         float out_div, bool add = false)
{
    const int NV = CP_KNV;
    if (m.contiguous(j0, end, CP_KTILE_OF(V))) {
        const TI *src = m.src(j0);
        TO *dst = m.dst(j0);
        cp_kvec<TI, V> in[NV];
        for (int u = 0; u < NV; u++) cp_kload<TI, V>(in[u], src + (u * CP_KTHREADS + lane) * V);
        for (int u = 0; u < NV; u++)
            cp_kput<TI, TO, V>(dst + (u * CP_KTHREADS + lane) * V, in[u], in_div, out_div, add);
        return;
    }
    for (long long j = j0 + (long long)lane * V; j < end; j += (long long)CP_KTHREADS * V) {
        cp_kvec<TI, V> in;
        if (m.readable(j, V)) cp_kload<TI, V>(in, m.src(j));
        else
            for (int k = 0; k < V; k++) in.e[k] = m.readable(j + k, 1) ? cp_kread1(m.src(j + k)) : cp_from_float<TI>(0.0f);
        cp_kput<TI, TO, V>(m.dst(j), in, in_div, out_div, add);
    }
}

/* copy-in: sharded (total) -> this rank's slot of the all-gather buffer. */
template <typename TI, typename TO> struct cp_map_flat {
    const TI *in;
    TO *out;
    long long n;
    __host__ __device__ bool contiguous(long long j0, long long end, long long tile) const { return end - j0 == tile; }
    __host__ __device__ bool readable(long long, int) const { return true; }
    __host__ __device__ const TI *src(long long j) const { return in + j; }
    __host__ __device__ TO *dst(long long j) const { return out + j; }
};

/* copy-out piece (r, p): ag[r][offset + j] -> unsharded param p viewed as
 * (outer, W * run): row j / run, column r * run + j % run. */
template <typename T> struct cp_map_copy_out {
    const T *in;
    T *out;
    long long run, wrun, outer;
    __host__ __device__ bool contiguous(long long j0, long long end, long long tile) const
    {
        return outer == 1 && end - j0 == tile;
    }
    __host__ __device__ bool readable(long long, int) const { return true; }
    __host__ __device__ const T *src(long long j) const { return in + j; }
    __host__ __device__ T *dst(long long j) const
    {
        if (outer == 1) return out + j;
        long long o = j / run;
        return out + o * wrun + (j - o * run);
    }
};

/* packing piece (r, p): rs_in[r][offset - base + j] <- grads of p at element
 * o * W * run + r * run + t (o, t = j / run, j % run); zero past numel
 * (torch.chunk padding). */
template <typename T> struct cp_map_pack {
    const T *in; /* the parameter's grads, element 0 */
    long long run, wrun, outer, numel, rrun;
    __host__ __device__ long long elem(long long j) const
    {
        if (outer == 1) return rrun + j;
        long long o = j / run;
        return o * wrun + rrun + (j - o * run);
    }
    __host__ __device__ bool contiguous(long long j0, long long end, long long tile) const
    {
        return outer == 1 && end - j0 == tile && rrun + end <= numel;
    }
    __host__ __device__ bool readable(long long j, int n) const { return elem(j) + n <= numel; }
    __host__ __device__ const T *src(long long j) const { return in + elem(j); }
};
template <typename TI, typename TO> struct cp_map_pack_to : cp_map_pack<TI> {
    TO *out; /* rs_in + r * total + offset - base */
    __host__ __device__ TO *dst(long long j) const { return out + j; }
};

/* Block b's tile, run by one lane (thread) of CP_KTHREADS. */
template <typename TI, typename TO, int V>
__host__ __device__ inline void cp_copy_in_tile(const cp_kview &v, int shard_rank, const TI *sharded, TO *ag, long long b,
                                                int lane)
{
    cp_map_flat<TI, TO> m = { sharded, ag + (long long)shard_rank * v.unit.total, v.unit.total };
    long long j0 = b * CP_KTILE_OF(V), end = j0 + CP_KTILE_OF(V) < m.n ? j0 + CP_KTILE_OF(V) : m.n;
    cp_ktile<TI, TO, V>(m, j0, end, lane, 1.0f, 1.0f);
}

/* add: a later reduction of the step, adding into the sharded grads. */
template <typename TI, typename TO, int V>
__host__ __device__ inline void cp_view_out_tile(const cp_kview &v, const TI *rs_out, TO *sharded_grads, long long b,
                                                 int lane, bool add)
{
    cp_map_flat<TI, TO> m = { rs_out, sharded_grads, v.unit.rs_total };
    long long j0 = b * CP_KTILE_OF(V), end = j0 + CP_KTILE_OF(V) < m.n ? j0 + CP_KTILE_OF(V) : m.n;
    cp_ktile<TI, TO, V>(m, j0, end, lane, v.unit.post_divide, 1.0f, add);
}

template <typename T, int V>
__host__ __device__ inline void cp_copy_out_tile(const cp_kview &v, const T *ag, T *unsharded, long long b, int lane)
{
    int r = (int)(b / v.unit.tiles_out), k = (int)(b - (long long)r * v.unit.tiles_out);
    const cp_kparam &p = v.params[cp_kfind_tile(v, k, false)];
    long long j0 = (long long)(k - p.tile_out) * CP_KTILE_OF(V);
    long long end = j0 + CP_KTILE_OF(V) < p.padded ? j0 + CP_KTILE_OF(V) : p.padded;
    cp_map_copy_out<T> m = { ag + (long long)r * v.unit.total + p.offset,
                             unsharded + (long long)v.W * p.offset + (long long)r * p.run, p.run,
                             (long long)v.W * p.run, p.outer };
    cp_ktile<T, T, V>(m, j0, end, lane, 1.0f, 1.0f);
}

template <typename TI, typename TO, int V>
__host__ __device__ inline void cp_pack_tile(const cp_kview &v, const TI *grads, TO *rs_in, long long b, int lane)
{
    int r = (int)(b / v.unit.tiles_pack), k = (int)(b - (long long)r * v.unit.tiles_pack);
    const cp_kparam &p = v.params[cp_kfind_tile(v, k, true)];
    long long j0 = (long long)(k - (p.tile_pack - v.tile_base_pack)) * CP_KTILE_OF(V);
    long long end = j0 + CP_KTILE_OF(V) < p.padded ? j0 + CP_KTILE_OF(V) : p.padded;
    cp_map_pack_to<TI, TO> m;
    m.in = grads + p.grad_offset;
    m.run = p.run;
    m.wrun = (long long)v.W * p.run;
    m.outer = p.outer;
    m.numel = p.numel;
    m.rrun = (long long)r * p.run;
    m.out = rs_in + (long long)r * v.unit.rs_total + (p.rs_offset - v.base);
    cp_ktile<TI, TO, V>(m, j0, end, lane, 1.0f, v.unit.pre_divide);
}

/* all_reduce_last's partial sums: total elements of the reduce dtype, copied
 * (partial_reduce_output = reduce_output) or added (+=, one rounding in the
 * reduce dtype, as torch's add_ of two tensors of that dtype). */
template <typename T, int V>
__host__ __device__ inline void cp_flat_tile(const cp_kview &v, const T *in, T *out, long long b, int lane, bool add)
{
    cp_map_flat<T, T> m = { in, out, v.unit.rs_total };
    long long j0 = b * CP_KTILE_OF(V), end = j0 + CP_KTILE_OF(V) < m.n ? j0 + CP_KTILE_OF(V) : m.n;
    cp_ktile<T, T, V>(m, j0, end, lane, 1.0f, 1.0f, add);
}

/* Blocks of each op: one per tile. */
template <int V> __host__ __device__ inline long long cp_kblocks(int op, const cp_kview &v)
{
    if (op == 0) return (v.unit.total + CP_KTILE_OF(V) - 1) / CP_KTILE_OF(V);
    if (op == 3 || op == 4 || op == 5 || op == 6) return (v.unit.rs_total + CP_KTILE_OF(V) - 1) / CP_KTILE_OF(V);
    return (long long)v.W * (op == 1 ? v.unit.tiles_out : v.unit.tiles_pack);
}

#ifdef __CUDACC__
template <typename TI, typename TO, int V>
__global__ void __launch_bounds__(CP_KTHREADS) cp_copy_in_kernel(cp_kview v, int shard_rank, const TI *in, TO *out)
{
    cp_copy_in_tile<TI, TO, V>(v, shard_rank, in, out, blockIdx.x, threadIdx.x);
}
template <typename T, int V>
__global__ void __launch_bounds__(CP_KTHREADS) cp_copy_out_kernel(cp_kview v, const T *in, T *out)
{
    cp_copy_out_tile<T, V>(v, in, out, blockIdx.x, threadIdx.x);
}
template <typename TI, typename TO, int V>
__global__ void __launch_bounds__(CP_KTHREADS) cp_pack_kernel(cp_kview v, const TI *in, TO *out)
{
    cp_pack_tile<TI, TO, V>(v, in, out, blockIdx.x, threadIdx.x);
}
template <typename TI, typename TO, int V>
__global__ void __launch_bounds__(CP_KTHREADS) cp_view_out_kernel(cp_kview v, const TI *in, TO *out, int add)
{
    cp_view_out_tile<TI, TO, V>(v, in, out, blockIdx.x, threadIdx.x, add != 0);
}
template <typename T, int V>
__global__ void __launch_bounds__(CP_KTHREADS) cp_flat_kernel(cp_kview v, const T *in, T *out, int add)
{
    cp_flat_tile<T, V>(v, in, out, blockIdx.x, threadIdx.x, add != 0);
}
#endif

#endif

#ifndef COMMPLAN_KERNELS_DISPATCH
#define COMMPLAN_KERNELS_DISPATCH
#include <stdlib.h>

#include "commplan.h"
/* Dispatch from run-time dtypes (cp_dtype codes: 0 fp32, 1 bf16, 2 fp16)
 * to the typed kernels; host = 1 runs the same group bodies on the CPU. */
enum { CP_K_COPY_IN = 0, CP_K_COPY_OUT = 1, CP_K_PACK = 2, CP_K_VIEW_OUT = 3, CP_K_VIEW_OUT_ADD = 4, CP_K_FLAT_COPY = 5,
       CP_K_FLAT_ADD = 6 };

/* Every lane of every block, in order: the device's work, one thread at a time. */
template <typename TI, typename TO, int V>
static void cp_krun_host(int op, const cp_kview &v, int shard_rank, const TI *src, TO *dst)
{
    long long blocks = cp_kblocks<V>(op, v);
    for (long long b = 0; b < blocks; b++)
        for (int lane = 0; lane < CP_KTHREADS; lane++) switch (op) {
            case CP_K_COPY_IN: cp_copy_in_tile<TI, TO, V>(v, shard_rank, src, dst, b, lane); break;
            case CP_K_COPY_OUT: cp_copy_out_tile<TO, V>(v, reinterpret_cast<const TO *>(src), dst, b, lane); break;
            case CP_K_PACK: cp_pack_tile<TI, TO, V>(v, src, dst, b, lane); break;
            case CP_K_FLAT_COPY:
            case CP_K_FLAT_ADD:
                cp_flat_tile<TO, V>(v, reinterpret_cast<const TO *>(src), dst, b, lane, op == CP_K_FLAT_ADD);
                break;
            default: cp_view_out_tile<TI, TO, V>(v, src, dst, b, lane, op == CP_K_VIEW_OUT_ADD); break;
            }
}

#ifdef CP_CUDA_EMULATOR
/* A launch on the emulated GPU: the host loop, run by the stream's worker. */
struct cp_kemu_args {
    int op, shard_rank;
    cp_kview v;
    const void *in;
    void *out;
};
template <typename TI, typename TO, int V> static void cp_kemu_body(const void *p)
{
    const cp_kemu_args *a = static_cast<const cp_kemu_args *>(p);
    cp_krun_host<TI, TO, V>(a->op, a->v, a->shard_rank, static_cast<const TI *>(a->in), static_cast<TO *>(a->out));
}
static const char *const cp_kemu_names[] = { "copy-in", "copy-out", "pack", "view-out", "view-out (adding)",
                                             "flat copy", "flat add" };
#endif

template <typename TI, typename TO, int V>
static cudaError_t cp_krun(int op, const cp_kview &v, int shard_rank, const void *in, void *out, cudaStream_t s,
                           int host)
{
    const TI *src = static_cast<const TI *>(in);
    TO *dst = static_cast<TO *>(out);
    if (host) {
        cp_krun_host<TI, TO, V>(op, v, shard_rank, src, dst);
        return cudaSuccess;
    }
#if defined(CP_CUDA_EMULATOR)
    if (cp_kblocks<V>(op, v) == 0) return cudaSuccess;
    cp_kemu_args a = { op, shard_rank, v, in, out };
    return cudaEmuLaunchKernel(s, cp_kemu_names[op], &cp_kemu_body<TI, TO, V>, &a, sizeof a, offsetof(cp_kemu_args, out),
                               sizeof(TO));
#elif defined(__CUDACC__)
    long long blocks = cp_kblocks<V>(op, v);
    if (blocks == 0) return cudaSuccess;
    if (blocks > 0x7fffffffLL) return cudaErrorInvalidConfiguration;
    const unsigned grid = (unsigned)blocks;
    /* The launch's own error is read below: clear any non-sticky state an
     * earlier call left (a sticky fault persists and is reported anyway). */
    (void)cudaGetLastError();
    switch (op) {
    case CP_K_COPY_IN: cp_copy_in_kernel<TI, TO, V><<<grid, CP_KTHREADS, 0, s>>>(v, shard_rank, src, dst); break;
    case CP_K_COPY_OUT:
        cp_copy_out_kernel<TO, V><<<grid, CP_KTHREADS, 0, s>>>(v, reinterpret_cast<const TO *>(src), dst);
        break;
    case CP_K_PACK: cp_pack_kernel<TI, TO, V><<<grid, CP_KTHREADS, 0, s>>>(v, src, dst); break;
    case CP_K_FLAT_COPY:
    case CP_K_FLAT_ADD:
        cp_flat_kernel<TO, V><<<grid, CP_KTHREADS, 0, s>>>(v, reinterpret_cast<const TO *>(src), dst,
                                                           op == CP_K_FLAT_ADD);
        break;
    default: cp_view_out_kernel<TI, TO, V><<<grid, CP_KTHREADS, 0, s>>>(v, src, dst, op == CP_K_VIEW_OUT_ADD); break;
    }
    return cudaGetLastError();
#else
    (void)s;
    return cudaErrorNotSupported;
#endif
}

template <typename TI, typename TO>
static cudaError_t cp_kwidth(int op, const cp_kview &v, int shard_rank, const void *in, void *out, cudaStream_t s, int host)
{
    /* 16-byte stores: 16 bytes of the output dtype. On the H100, fp32 ->
     * bf16 copy-in with 32-byte loads ran at 92% of the copy ceiling, while
     * bf16 -> fp32 packing with 32-byte stores fell to 33% (bench/RESULTS.md). */
    const int V = 16 / sizeof(TO);
    if (v.unit.vec_ok) return cp_krun<TI, TO, V>(op, v, shard_rank, in, out, s, host);
    return cp_krun<TI, TO, 1>(op, v, shard_rank, in, out, s, host);
}

template <typename TI>
static cudaError_t cp_kto(int op, int to, const cp_kview &v, int shard_rank, const void *in, void *out, cudaStream_t s,
                          int host)
{
    switch (to) {
    case 0: return cp_kwidth<TI, float>(op, v, shard_rank, in, out, s, host);
    case 1: return cp_kwidth<TI, __nv_bfloat16>(op, v, shard_rank, in, out, s, host);
    default: return cp_kwidth<TI, __half>(op, v, shard_rank, in, out, s, host);
    }
}

/* dtypes = { orig, ag, reduce, grad } of the unit. */
static inline cudaError_t cp_kdispatch_dtypes(int op, const cp_kview &v, const int dtypes[4], int shard_rank, const void *in,
                                       void *out, cudaStream_t s, int host)
{
    int ti, to;
    switch (op) {
    case CP_K_COPY_IN: ti = dtypes[0]; to = dtypes[1]; break;
    case CP_K_COPY_OUT: ti = dtypes[1]; to = dtypes[1]; break;
    case CP_K_PACK: ti = dtypes[3]; to = dtypes[2]; break;
    case CP_K_FLAT_COPY:
    case CP_K_FLAT_ADD: ti = dtypes[2]; to = dtypes[2]; break;
    default: ti = dtypes[2]; to = dtypes[0]; break;
    }
    switch (ti) {
    case 0: return cp_kto<float>(op, to, v, shard_rank, in, out, s, host);
    case 1: return cp_kto<__nv_bfloat16>(op, to, v, shard_rank, in, out, s, host);
    default: return cp_kto<__half>(op, to, v, shard_rank, in, out, s, host);
    }
}
/* ---- a plan's kernel tables, derived once from its cp_plan ----
 * The layout is emitted once, in plan.c; the kernels' per-parameter view
 * of it (and the tile numbering: each parameter's first copy-out and
 * packing tile within one rank's pieces) is computed from those tables
 * when the plan is first used, on the host, and copied to the device by
 * cp_ktables_prepare (never during a graph capture). */
struct cp_ktables {
    cp_kparam *host;   /* plan->nparams */
    cp_kparam *device; /* the same on the device */
    cp_kunit *units;   /* plan->nunits */
    int (*dtypes)[4];  /* orig, ag, reduce, grad per unit (cp_dtype codes) */
};

static inline long long cp_ktile_elems(const cp_unit &u, int out_dtype)
{
    return CP_KTILE_OF(u.vec_ok ? 16 / (out_dtype == 0 ? 4 : 2) : 1);
}

/* Class c's units and params (the plan's own without TP classes). */
static inline const cp_unit *cp_kclass_units(const cp_plan *p, int c)
{
    return p->classes && c < p->nclasses ? p->classes[c].units : p->units;
}
static inline const cp_param *cp_kclass_params(const cp_plan *p, int c)
{
    return p->classes && c < p->nclasses ? p->classes[c].params : p->params;
}
/* Class c's counts: a pipeline rank's class has its own stages' units and
 * params (a class without counts shares the plan's). */
static inline int cp_kclass_nunits(const cp_plan *p, int c)
{
    return p->classes && c < p->nclasses && p->classes[c].nunits > 0 ? p->classes[c].nunits : p->nunits;
}
static inline int cp_kclass_nparams(const cp_plan *p, int c)
{
    return p->classes && c < p->nclasses && p->classes[c].nunits > 0 ? p->classes[c].nparams : p->nparams;
}

static inline cudaError_t cp_ktables_build_host(cp_ktables *t, const cp_plan *p, int c)
{
    if (t->host) return cudaSuccess;
    const cp_unit *punits = cp_kclass_units(p, c);
    const cp_param *pparams = cp_kclass_params(p, c);
    int nunits = cp_kclass_nunits(p, c), nparams = cp_kclass_nparams(p, c);
    size_t np = (size_t)(nparams > 0 ? nparams : 1), nu = (size_t)(nunits > 0 ? nunits : 1);
    cp_kparam *params = (cp_kparam *)calloc(np, sizeof *params);
    cp_kunit *units = (cp_kunit *)calloc(nu, sizeof *units);
    int (*dtypes)[4] = (int (*)[4])calloc(nu, sizeof *dtypes);
    if (!params || !units || !dtypes) {
        free(params);
        free(units);
        free(dtypes);
        return cudaErrorMemoryAllocation;
    }
    for (int u = 0; u < nunits; u++) {
        const cp_unit &U = punits[u];
        long long tile_out = cp_ktile_elems(U, (int)U.ag_dtype), tile_pack = cp_ktile_elems(U, (int)U.reduce_dtype);
        long long tiles_out = 0, tiles_pack = 0;
        for (int j = 0; j < U.nparams; j++) {
            const cp_param &q = pparams[U.first_param + j];
            cp_kparam &k = params[U.first_param + j];
            k.offset = q.offset;
            k.outer = q.outer;
            k.run = q.run;
            k.padded = q.padded;
            k.numel = q.numel;
            k.grad_offset = q.grad_offset;
            k.rs_offset = cp_param_rs_offset(&U, &q);
            k.tile_out = (int)tiles_out;
            k.tile_pack = (int)tiles_pack;
            tiles_out += (q.padded + tile_out - 1) / tile_out;
            if (!q.frozen) tiles_pack += (q.padded + tile_pack - 1) / tile_pack; /* (packed without it) */
        }
        units[u].first_param = U.first_param;
        units[u].nparams = U.nparams;
        units[u].total = U.total;
        units[u].rs_total = cp_unit_rs_total(&U);
        units[u].pre_divide = (float)U.pre_divide;
        units[u].post_divide = (float)U.post_divide;
        units[u].vec_ok = U.vec_ok;
        units[u].tiles_out = (int)tiles_out;
        units[u].tiles_pack = (int)tiles_pack;
        /* An experts unit (expert parallelism) is sharded over its own
         * group (efsdp), not the plan's: its slots are that group's ranks. */
        units[u].W = U.expert ? U.shard_size : p->shard_size;
        if (units[u].W < 1) units[u].W = 1;
        dtypes[u][0] = (int)U.orig_dtype;
        dtypes[u][1] = (int)U.ag_dtype;
        dtypes[u][2] = (int)U.reduce_dtype;
        dtypes[u][3] = (int)U.grad_dtype;
    }
    t->units = units;
    t->dtypes = dtypes;
    t->host = params;
    return cudaSuccess;
}

static inline cudaError_t cp_ktables_prepare(cp_ktables *t, const cp_plan *p, int c)
{
    cudaError_t e = cp_ktables_build_host(t, p, c);
    if (e != cudaSuccess || t->device) return e;
#if defined(__CUDACC__) || defined(CP_CUDA_EMULATOR)
    int nparams = cp_kclass_nparams(p, c);
    size_t bytes = (size_t)(nparams > 0 ? nparams : 1) * sizeof(cp_kparam);
    cp_kparam *d = nullptr;
    if ((e = cudaMalloc((void **)&d, bytes)) != cudaSuccess) return e;
    if ((e = cudaMemcpy(d, t->host, bytes, cudaMemcpyHostToDevice)) != cudaSuccess) {
        cudaFree(d);
        return e;
    }
    t->device = d;
    return cudaSuccess;
#else
    return cudaErrorNotSupported;
#endif
}

/* A unit of mixed all-gather dtypes (cp_unit.ag_bytes > 0: per-parameter
 * param_dtype, FSDP2's uint8 all-gather, _fsdp_collectives.py:369-379):
 * its copy-in casts each parameter's shard to that parameter's own dtype at
 * its byte offset of the rank's slot (a one-parameter view of the copy-in
 * kernel, or a byte copy when the dtype stays), and its copy-out copies
 * each rank's run of bytes to the parameter's unsharded tensor, as FSDP2's
 * split_with_sizes_copy of the uint8 output does: byte offsets in the slot
 * need not be multiples of an fp32 element. A cast to a 4-byte dtype at a
 * byte offset that is not a multiple of 4 (16-bit parameters with a fp32
 * param_dtype, some kept in 16 bits) cannot be stored by the device kernel:
 * cudaErrorInvalidValue (the host bodies do it). */
static inline cudaError_t cp_kbytes(void *dst, const void *src, size_t n, cudaStream_t s, int host)
{
    if (n == 0) return cudaSuccess;
    if (host) {
        memcpy(dst, src, n);
        return cudaSuccess;
    }
#if defined(__CUDACC__) || defined(CP_CUDA_EMULATOR)
    return cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, s);
#else
    (void)s;
    return cudaErrorNotSupported;
#endif
}

static inline cudaError_t cp_kmixed_run(cp_ktables *t, const cp_unit &PU, const cp_param *pparams, int op, int unit,
                                        int shard_rank, const void *in, void *out, cudaStream_t s, int host)
{
    const cp_kunit &U = t->units[unit];
    size_t oes = PU.orig_dtype == CP_FP32 ? 4 : 2;
    for (int j = 0; j < PU.nparams; j++) {
        const cp_param &q = pparams[PU.first_param + j];
        size_t es = q.ag_dtype == CP_FP32 ? 4 : 2;
        cudaError_t e = cudaSuccess;
        if (op == CP_K_COPY_IN) {
            const char *src = static_cast<const char *>(in) + (size_t)q.offset * oes;
            char *dst = static_cast<char *>(out) + (size_t)shard_rank * (size_t)PU.ag_bytes + (size_t)q.ag_offset;
            if (q.ag_dtype == PU.orig_dtype) e = cp_kbytes(dst, src, (size_t)q.padded * es, s, host);
            else if (!host && (size_t)q.ag_offset % es != 0) e = cudaErrorInvalidValue;
            else {
                cp_kunit one = U;
                one.first_param = PU.first_param + j;
                one.nparams = 1;
                one.total = q.padded;
                one.vec_ok = 0;
                cp_kview v = { (host ? t->host : t->device) + PU.first_param + j, one, U.W, 0, 0 };
                int dt[4] = { (int)PU.orig_dtype, (int)q.ag_dtype, (int)PU.reduce_dtype, (int)PU.grad_dtype };
                e = cp_kdispatch_dtypes(CP_K_COPY_IN, v, dt, 0, src, dst, s, host);
            }
        } else {
            char *dst = static_cast<char *>(out) + (size_t)q.unsharded_offset;
            for (int r = 0; r < U.W && e == cudaSuccess; r++)
                for (long long o = 0; o < q.outer && e == cudaSuccess; o++)
                    e = cp_kbytes(dst + (size_t)(o * U.W * q.run + (long long)r * q.run) * es,
                                  static_cast<const char *>(in) + (size_t)r * (size_t)PU.ag_bytes + (size_t)q.ag_offset +
                                      (size_t)(o * q.run) * es,
                                  (size_t)q.run * es, s, host);
        }
        if (e != cudaSuccess) return e;
    }
    return cudaSuccess;
}

/* One unit's copy for TP class c with that class's tables t: on the
 * device (host = 0; prepared on first use) or its group bodies on the CPU
 * (host = 1). shard_rank is this rank's key in the unit's own shard group
 * (cp_unit_shard_rank: an experts unit's efsdp key, else the plan's).
 * part_count > 0: a part of the unit's parameters, part_first .. part_first
 * + part_count - 1 (a partial reduction: its pack rows hold those
 * parameters' padded shards only, its view-out writes them at their offset
 * in the sharded grads); packing and the view-outs only. */
static inline cudaError_t cp_ktables_run(cp_ktables *t, const cp_plan *p, int c, int op, int unit, int part_first,
                                         int part_count, int shard_rank, const void *in, void *out, cudaStream_t s,
                                         int host)
{
    int nclasses = p->nclasses > 0 ? p->nclasses : 1;
    if (c < 0 || c >= nclasses || unit < 0 || unit >= cp_kclass_nunits(p, c) || op < 0 || op > CP_K_FLAT_ADD)
        return cudaErrorInvalidValue;
    cudaError_t e = host ? cp_ktables_build_host(t, p, c) : cp_ktables_prepare(t, p, c);
    if (e != cudaSuccess) return e;
    const cp_kunit &U = t->units[unit];
    const cp_unit &PU = cp_kclass_units(p, c)[unit];
    if (PU.ag_bytes > 0 && (op == CP_K_COPY_IN || op == CP_K_COPY_OUT))
        return cp_kmixed_run(t, PU, cp_kclass_params(p, c), op, unit, shard_rank, in, out, s, host);
    cp_kview v = { (host ? t->host : t->device) + U.first_param, U, U.W, 0, 0 };
    if (part_count != 0 || part_first != 0) {
        if (part_count < 1 || part_first < 0 || part_first > U.nparams - part_count ||
            (op != CP_K_PACK && op != CP_K_VIEW_OUT && op != CP_K_VIEW_OUT_ADD))
            return cudaErrorInvalidValue;
        const cp_kparam *hp = t->host + U.first_param; /* the host copy: where the part starts and ends */
        const cp_kparam &a = hp[part_first], &z = hp[part_first + part_count - 1];
        int tiles_end = part_first + part_count < U.nparams ? hp[part_first + part_count].tile_pack : U.tiles_pack;
        v.params += part_first;
        v.unit.nparams = part_count;
        v.unit.total = z.offset + z.padded - a.offset;
        /* its trainable parameters' shards in the reduce-scatter row */
        v.unit.rs_total = z.rs_offset + (cp_kclass_params(p, c)[U.first_param + part_first + part_count - 1].frozen
                                             ? 0 : z.padded) - a.rs_offset;
        v.unit.tiles_pack = tiles_end - a.tile_pack;
        v.base = a.rs_offset;
        v.tile_base_pack = a.tile_pack;
        if (op != CP_K_PACK) /* the view-outs: the part's elements, at its offset in the sharded grads */
            out = static_cast<char *>(out) + (size_t)a.rs_offset * (t->dtypes[unit][0] == 0 ? 4 : 2);
    }
    return cp_kdispatch_dtypes(op, v, t->dtypes[unit], shard_rank, in, out, s, host);
}
#endif

