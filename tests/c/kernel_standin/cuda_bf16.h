/* TEST DOUBLE, not CUDA: __nv_bfloat16 and the two conversions
 * runtime/cp_kernels.cuh uses (__bfloat162float, __float2bfloat16_rn), for
 * the host build of the copy kernels in tests/c/test_kernels_host.cc only.
 * Round to nearest even, NaN -> 0x7fff (cuda_bf16.hpp's host path). */
#ifndef COMMPLAN_KERNEL_STANDIN_CUDA_BF16_H
#define COMMPLAN_KERNEL_STANDIN_CUDA_BF16_H

#include <stdint.h>
#include <string.h>

#include "cuda_runtime.h"

struct alignas(2) __nv_bfloat16 {
    unsigned short x;
};

__host__ __device__ inline float __bfloat162float(__nv_bfloat16 h)
{
    uint32_t u = (uint32_t)h.x << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

__host__ __device__ inline __nv_bfloat16 __float2bfloat16_rn(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    __nv_bfloat16 h;
    if ((u & 0x7fffffffu) > 0x7f800000u) h.x = 0x7fff;
    else h.x = (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    return h;
}

#endif
