/* Element types: fp32, bf16 and fp16 conversions with round-to-nearest-even,
 * and the one reduction rule every backend and check shares. */
#include <math.h>
#include <string.h>

#include "commplan.h"

size_t cp_dtype_size(cp_dtype t) { return t == CP_FP32 ? 4 : 2; }

const char *cp_dtype_name(cp_dtype t)
{
    switch (t) {
    case CP_FP32: return "fp32";
    case CP_BF16: return "bf16";
    case CP_FP16: return "fp16";
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

float cp_load(cp_dtype t, const void *base, int64_t i)
{
    if (t == CP_FP32) return ((const float *)base)[i];
    uint16_t h = ((const uint16_t *)base)[i];
    return t == CP_BF16 ? cp_bf16_to_float(h) : cp_fp16_to_float(h);
}

void cp_store(cp_dtype t, void *base, int64_t i, float v)
{
    if (t == CP_FP32) ((float *)base)[i] = v;
    else ((uint16_t *)base)[i] = t == CP_BF16 ? cp_float_to_bf16(v) : cp_float_to_fp16(v);
}

static float round_to(cp_dtype t, float v)
{
    if (t == CP_BF16) return cp_bf16_to_float(cp_float_to_bf16(v));
    if (t == CP_FP16) return cp_fp16_to_float(cp_float_to_fp16(v));
    return v;
}

float cp_reduce_values(cp_dtype t, cp_reduce_op op, const float *v, int n)
{
    float acc = 0.0f;
    for (int i = 0; i < n; i++) acc += v[i];
    if (op == CP_AVG) acc /= (float)n;
    return round_to(t, acc);
}
