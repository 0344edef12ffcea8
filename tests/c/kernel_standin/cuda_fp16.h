/* TEST DOUBLE, not CUDA: __half and the two conversions runtime/cp_kernels.cuh
 * uses (__half2float, __float2half_rn), for the host build of the copy
 * kernels in tests/c/test_kernels_host.cc only. Written from IEEE 754
 * binary16 and CUDA's documented behaviour (round to nearest even,
 * overflow to infinity, subnormals kept, NaN -> 0x7fff as cuda_fp16.hpp's
 * host path), independently of runtime/dtype.c, which the test compares
 * against. */
#ifndef COMMPLAN_KERNEL_STANDIN_CUDA_FP16_H
#define COMMPLAN_KERNEL_STANDIN_CUDA_FP16_H

#include <stdint.h>
#include <string.h>

#include "cuda_runtime.h"

struct alignas(2) __half {
    unsigned short x;
};

__host__ __device__ inline float __half2float(__half h)
{
    uint32_t sign = (uint32_t)(h.x >> 15) << 31, exp = (h.x >> 10) & 31u, mant = h.x & 1023u, u;
    if (exp == 31) u = sign | 0x7f800000u | (mant << 13);
    else if (exp != 0) u = sign | ((exp + 112u) << 23) | (mant << 13);
    else if (mant == 0) u = sign;
    else { /* subnormal: mant * 2^-24, exact in float */
        float f = (float)mant * (1.0f / 16777216.0f);
        memcpy(&u, &f, 4);
        u |= sign;
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

__host__ __device__ inline __half __float2half_rn(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    __half h;
    if (a > 0x7f800000u) { h.x = 0x7fff; return h; } /* NaN */
    int e = (int)(a >> 23) - 127;
    uint32_t m = (a & 0x7fffffu) | 0x800000u; /* 24 significant bits */
    uint32_t bits;
    if (a == 0x7f800000u || e > 15) bits = 0x7c00u; /* inf, or overflow */
    else if (a == 0) bits = 0;
    else {
        /* the value is m * 2^(e-23); fp16 keeps units of 2^(max(e,-14)-10) */
        int q = (e < -14 ? -14 : e) - 10;     /* exponent of fp16's last place */
        int sh = q - (e - 23);                 /* bits of m below that place, >= 13 */
        uint32_t r = sh >= 32 ? 0u : m >> sh;
        uint64_t rem = sh >= 32 ? m : (uint64_t)(m & ((1u << sh) - 1u));
        uint64_t halfway = sh >= 33 ? ~0ull : 1ull << (sh - 1);
        if (sh < 33 && (rem > halfway || (rem == halfway && (r & 1u)))) r++;
        /* r counts units of 2^q: normal when e >= -14 (r in [1024, 2048]) */
        if (e < -14) bits = r;                             /* subnormal (or 1024: the smallest normal) */
        else if (r == 2048u) bits = (uint32_t)(e + 1 + 15) << 10; /* rounded up to the next binade */
        else bits = ((uint32_t)(e + 15) << 10) | (r & 1023u);
        if (bits >= 0x7c00u) bits = 0x7c00u;
    }
    h.x = (unsigned short)(sign | bits);
    return h;
}

#endif
