/* Copy kernels for one plan's units: all-gather copy-in (with the
 * param_dtype cast), copy-out, reduce-scatter packing (chunk_cat) and the
 * view-out into sharded grads. The per-vector-group bodies are
 * __host__ __device__ so tests run the exact index math on the host
 * against the C executor. Included by each generated plan_kernels.cu. */
#ifndef COMMPLAN_KERNELS_CUH
#define COMMPLAN_KERNELS_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <string.h>

struct cp_kparam {
    long long offset, outer, run, padded, numel, grad_offset;
};

struct cp_kunit {
    int first_param, nparams;
    long long total;
    float pre_divide, post_divide;
    int vec_ok; /* every offset, run and the total are multiples of 16 bytes' worth of elements */
};

struct cp_kview {
    const cp_kparam *params; /* this unit's parameters */
    cp_kunit unit;
    int W;
};

template <typename T> __host__ __device__ inline float cp_to_float(T v);
template <> __host__ __device__ inline float cp_to_float<float>(float v) { return v; }
template <> __host__ __device__ inline float cp_to_float<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }
template <> __host__ __device__ inline float cp_to_float<__half>(__half v) { return __half2float(v); }
template <typename T> __host__ __device__ inline T cp_from_float(float v);
template <> __host__ __device__ inline float cp_from_float<float>(float v) { return v; }
template <> __host__ __device__ inline __nv_bfloat16 cp_from_float<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <> __host__ __device__ inline __half cp_from_float<__half>(float v) { return __float2half_rn(v); }

/* Parameter whose slot range [offset, offset + padded) holds slot index i. */
__host__ __device__ inline int cp_kfind(const cp_kview &v, long long i)
{
    int lo = 0, hi = v.unit.nparams - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (v.params[mid].offset <= i) lo = mid; else hi = mid - 1;
    }
    return lo;
}

template <typename A, typename B> struct cp_same { static const bool value = false; };
template <typename A> struct cp_same<A, A> { static const bool value = true; };

/* 16-byte moves: one vector instruction on the device; memcpy on the host
 * (no aliasing games in the CPU build the tests run). */
__host__ __device__ inline void cp_move16(void *dst, const void *src)
{
#ifdef __CUDA_ARCH__
    *reinterpret_cast<uint4 *>(dst) = *reinterpret_cast<const uint4 *>(src);
#else
    memcpy(dst, src, 16);
#endif
}

/* V consecutive elements from src to dst with a cast and a divide; V is
 * 16 bytes of the wider type when the unit is aligned, else 1. */
template <typename TI, typename TO, int V>
__host__ __device__ inline void cp_kcopy(const TI *src, TO *dst, float scale)
{
    if (cp_same<TI, TO>::value && scale == 1.0f) { /* plain move, bits untouched */
        if (sizeof(TI) * V == 16) cp_move16(dst, src);
        else for (int k = 0; k < V; k++) dst[k] = reinterpret_cast<const TO *>(src)[k];
        return;
    }
    TI in[V];
    if (sizeof(TI) * V == 16) cp_move16(in, src);
    else for (int k = 0; k < V; k++) in[k] = src[k];
    TO out[V];
    for (int k = 0; k < V; k++) {
        float f = cp_to_float<TI>(in[k]);
        out[k] = cp_from_float<TO>(scale == 1.0f ? f : f / scale);
    }
    if (sizeof(TO) * V == 16) cp_move16(dst, out);
    else for (int k = 0; k < V; k++) dst[k] = out[k];
}

/* Group q covers elements [q*V, q*V + V) of the operation's output. */

template <typename TI, typename TO, int V>
__host__ __device__ inline void cp_copy_in_group(const cp_kview &v, int shard_rank, const TI *sharded, TO *ag,
                                                 long long q)
{
    long long i = q * V;
    cp_kcopy<TI, TO, V>(sharded + i, ag + (long long)shard_rank * v.unit.total + i, 1.0f);
}

/* ag (W, total) -> unsharded, each parameter as (outer, W*run). */
template <typename T, int V>
__host__ __device__ inline void cp_copy_out_group(const cp_kview &v, const T *ag, T *unsharded, long long q)
{
    long long g = q * V;
    const cp_kparam &p = v.params[cp_kfind(v, g / v.W)];
    long long local = g - (long long)v.W * p.offset;
    long long row = (long long)v.W * p.run;
    long long o = local / row, rem = local - o * row;
    long long r = rem / p.run, t = rem - r * p.run;
    cp_kcopy<T, T, V>(ag + r * v.unit.total + p.offset + o * p.run + t, unsharded + g, 1.0f);
}

/* unsharded grads (compact, real numel per parameter) -> (W, total) with
 * zero padding, cast to the reduce dtype, divided by pre_divide. */
template <typename TI, typename TO, int V>
__host__ __device__ inline void cp_pack_group(const cp_kview &v, const TI *grads, TO *rs_in, long long q)
{
    long long g = q * V;
    long long r = g / v.unit.total, i = g - r * v.unit.total;
    const cp_kparam &p = v.params[cp_kfind(v, i)];
    long long j = i - p.offset, o = j / p.run, t = j - o * p.run;
    long long e = o * (long long)v.W * p.run + r * p.run + t;
    if (e + V <= p.numel) {
        cp_kcopy<TI, TO, V>(grads + p.grad_offset + e, rs_in + g, v.unit.pre_divide);
        return;
    }
    for (int k = 0; k < V; k++) {
        float f = e + k < p.numel ? cp_to_float<TI>(grads[p.grad_offset + e + k]) : 0.0f;
        rs_in[g + k] = cp_from_float<TO>(v.unit.pre_divide == 1.0f ? f : f / v.unit.pre_divide);
    }
}

template <typename TI, typename TO, int V>
__host__ __device__ inline void cp_view_out_group(const cp_kview &v, const TI *rs_out, TO *sharded_grads, long long q)
{
    long long i = q * V;
    cp_kcopy<TI, TO, V>(rs_out + i, sharded_grads + i, v.unit.post_divide);
}

#ifdef __CUDACC__
/* Grid-stride kernels over vector groups. */
template <typename TI, typename TO, int V>
__global__ void cp_copy_in_kernel(cp_kview v, int shard_rank, const TI *in, TO *out, long long groups)
{
    for (long long q = blockIdx.x * (long long)blockDim.x + threadIdx.x; q < groups; q += (long long)gridDim.x * blockDim.x)
        cp_copy_in_group<TI, TO, V>(v, shard_rank, in, out, q);
}
template <typename T, int V>
__global__ void cp_copy_out_kernel(cp_kview v, const T *in, T *out, long long groups)
{
    for (long long q = blockIdx.x * (long long)blockDim.x + threadIdx.x; q < groups; q += (long long)gridDim.x * blockDim.x)
        cp_copy_out_group<T, V>(v, in, out, q);
}
template <typename TI, typename TO, int V>
__global__ void cp_pack_kernel(cp_kview v, const TI *in, TO *out, long long groups)
{
    for (long long q = blockIdx.x * (long long)blockDim.x + threadIdx.x; q < groups; q += (long long)gridDim.x * blockDim.x)
        cp_pack_group<TI, TO, V>(v, in, out, q);
}
template <typename TI, typename TO, int V>
__global__ void cp_view_out_kernel(cp_kview v, const TI *in, TO *out, long long groups)
{
    for (long long q = blockIdx.x * (long long)blockDim.x + threadIdx.x; q < groups; q += (long long)gridDim.x * blockDim.x)
        cp_view_out_group<TI, TO, V>(v, in, out, q);
}
#endif

#endif

#ifndef COMMPLAN_KERNELS_DISPATCH
#define COMMPLAN_KERNELS_DISPATCH
/* Dispatch from run-time dtypes (cp_dtype codes: 0 fp32, 1 bf16, 2 fp16)
 * to the typed kernels; host = 1 runs the same group bodies on the CPU. */
enum { CP_K_COPY_IN = 0, CP_K_COPY_OUT = 1, CP_K_PACK = 2, CP_K_VIEW_OUT = 3 };

template <typename TI, typename TO, int V>
static cudaError_t cp_krun(int op, const cp_kview &v, int shard_rank, const void *in, void *out, cudaStream_t s,
                           int host)
{
    long long n = (op == CP_K_COPY_IN || op == CP_K_VIEW_OUT) ? v.unit.total : (long long)v.W * v.unit.total;
    long long groups = n / V;
    const TI *src = static_cast<const TI *>(in);
    TO *dst = static_cast<TO *>(out);
    if (host) {
        for (long long q = 0; q < groups; q++) {
            switch (op) {
            case CP_K_COPY_IN: cp_copy_in_group<TI, TO, V>(v, shard_rank, src, dst, q); break;
            case CP_K_COPY_OUT: cp_copy_out_group<TO, V>(v, reinterpret_cast<const TO *>(src), dst, q); break;
            case CP_K_PACK: cp_pack_group<TI, TO, V>(v, src, dst, q); break;
            default: cp_view_out_group<TI, TO, V>(v, src, dst, q); break;
            }
        }
        return cudaSuccess;
    }
#ifdef __CUDACC__
    if (groups == 0) return cudaSuccess;
    const int threads = 256;
    /* Enough blocks to fill an H100 (132 SMs x 8 resident blocks); grid-stride beyond that. */
    long long blocks = (groups + threads - 1) / threads;
    if (blocks > 132 * 8) blocks = 132 * 8;
    switch (op) {
    case CP_K_COPY_IN: cp_copy_in_kernel<TI, TO, V><<<(unsigned)blocks, threads, 0, s>>>(v, shard_rank, src, dst, groups); break;
    case CP_K_COPY_OUT:
        cp_copy_out_kernel<TO, V><<<(unsigned)blocks, threads, 0, s>>>(v, reinterpret_cast<const TO *>(src), dst, groups);
        break;
    case CP_K_PACK: cp_pack_kernel<TI, TO, V><<<(unsigned)blocks, threads, 0, s>>>(v, src, dst, groups); break;
    default: cp_view_out_kernel<TI, TO, V><<<(unsigned)blocks, threads, 0, s>>>(v, src, dst, groups); break;
    }
    return cudaGetLastError();
#else
    (void)s;
    return cudaErrorNotSupported;
#endif
}

template <typename TI, typename TO>
static cudaError_t cp_kvec(int op, const cp_kview &v, int shard_rank, const void *in, void *out, cudaStream_t s, int host)
{
    const int V = 16 / (sizeof(TI) > sizeof(TO) ? sizeof(TI) : sizeof(TO));
    if (v.unit.vec_ok) return cp_krun<TI, TO, V>(op, v, shard_rank, in, out, s, host);
    return cp_krun<TI, TO, 1>(op, v, shard_rank, in, out, s, host);
}

template <typename TI>
static cudaError_t cp_kto(int op, int to, const cp_kview &v, int shard_rank, const void *in, void *out, cudaStream_t s,
                          int host)
{
    switch (to) {
    case 0: return cp_kvec<TI, float>(op, v, shard_rank, in, out, s, host);
    case 1: return cp_kvec<TI, __nv_bfloat16>(op, v, shard_rank, in, out, s, host);
    default: return cp_kvec<TI, __half>(op, v, shard_rank, in, out, s, host);
    }
}

/* dtypes = { orig, ag, reduce } of the unit. */
static inline cudaError_t cp_kdispatch(int op, const cp_kview &v, const int dtypes[3], int shard_rank, const void *in,
                                       void *out, cudaStream_t s, int host)
{
    int ti, to;
    switch (op) {
    case CP_K_COPY_IN: ti = dtypes[0]; to = dtypes[1]; break;
    case CP_K_COPY_OUT: ti = dtypes[1]; to = dtypes[1]; break;
    case CP_K_PACK: ti = dtypes[1]; to = dtypes[2]; break;
    default: ti = dtypes[2]; to = dtypes[0]; break;
    }
    switch (ti) {
    case 0: return cp_kto<float>(op, to, v, shard_rank, in, out, s, host);
    case 1: return cp_kto<__nv_bfloat16>(op, to, v, shard_rank, in, out, s, host);
    default: return cp_kto<__half>(op, to, v, shard_rank, in, out, s, host);
    }
}
#endif
