/* TEST DOUBLE, not CUDA: the few names from cuda_runtime.h (and the
 * vector_types.h it includes) that runtime/cp_kernels.cuh and
 * runtime/cp_kernels.cu use outside `#ifdef __CUDACC__`, so that g++ can
 * build the copy kernels' __host__ __device__ bodies and their host loop
 * for tests/c/test_kernels_host.cc. Nothing that ships includes it; it
 * lives under tests/ and is put on the include path of that test only.
 *
 * Provided, and nothing else:
 *   __host__, __device__            function qualifiers (empty on the host)
 *   cudaError_t                     with cudaSuccess, cudaErrorInvalidValue,
 *                                   cudaErrorMemoryAllocation,
 *                                   cudaErrorNotSupported (CUDA's values)
 *   cudaStream_t                    an opaque pointer, never dereferenced
 *   uint2, uint4                    the 8- and 16-byte words the device
 *                                   path loads and stores (CUDA's alignment)
 * Not provided: __global__, launches, cudaMalloc/cudaMemcpy/cudaGetLastError
 * and the rest; the kernels use them only under __CUDACC__, which g++ does
 * not define, so the host build takes cp_krun's host loop and
 * cp_ktables_prepare answers cudaErrorNotSupported.
 *
 * With CP_KHOST_DEVICE_WORDS defined (the test defines it together with
 * __CUDA_ARCH__ in its "device words" build), cp_kload/cp_kstore take
 * their device branch: V elements as one uint4 (two for 32 bytes) or uint2
 * access. Then every such access goes through the assignment below, which
 * reports the address and width to cp_khost_word() (defined by the test):
 * the test asserts each is aligned to the word's size, as the device
 * requires. The bytes move with memcpy, so a misaligned word is reported,
 * not a crash (UBSan's alignment check, in the ASan build, also sees it). */
#ifndef COMMPLAN_KERNEL_STANDIN_CUDA_RUNTIME_H
#define COMMPLAN_KERNEL_STANDIN_CUDA_RUNTIME_H

#ifdef __CUDACC__
#error "tests/c/kernel_standin is a host-only test double; nvcc must use the real CUDA headers"
#endif

#include <string.h>

#define __host__
#define __device__

typedef enum cudaError {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorNotSupported = 801
} cudaError_t;

typedef struct CUstream_st *cudaStream_t;

#ifdef CP_KHOST_DEVICE_WORDS
void cp_khost_word(const void *dst, const void *src, unsigned bytes);
#define CP_KHOST_WORD_ASSIGN(T)                                                                                        \
    T() = default;                                                                                                     \
    T(const T &) = default;                                                                                            \
    T &operator=(const T &o)                                                                                           \
    {                                                                                                                  \
        cp_khost_word(this, &o, (unsigned)sizeof(T));                                                                  \
        /* hide the type's alignment from the optimiser: a misaligned word                                            \
         * is reported above, and must not fault in an aligned vector move */                                         \
        void *d = this;                                                                                                \
        const void *s = &o;                                                                                            \
        __asm__("" : "+r"(d), "+r"(s));                                                                                \
        memcpy(d, s, sizeof(T));                                                                                       \
        return *this;                                                                                                  \
    }
#else
#define CP_KHOST_WORD_ASSIGN(T)
#endif

struct alignas(8) uint2 {
    unsigned int x, y;
    CP_KHOST_WORD_ASSIGN(uint2)
};
struct alignas(16) uint4 {
    unsigned int x, y, z, w;
    CP_KHOST_WORD_ASSIGN(uint4)
};

#endif
