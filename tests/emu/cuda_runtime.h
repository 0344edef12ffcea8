/* TEST DOUBLE, not CUDA: an emulated CUDA runtime for commplan's tests
 * (tests/emu/emu_cuda.c; docs/emulator.md). It declares exactly the entry
 * points runtime/gpu.c, runtime/gpu_run.c and runtime/cp_kernels.cu call,
 * with CUDA's names, types and error codes, so those files build unchanged
 * against it with a plain C/C++ compiler and run on any machine: streams
 * are worker threads, device memory is host memory watched by a
 * happens-before race detector, graphs are recorded node lists. Nothing
 * that ships includes it; only the emulated test builds put tests/emu on
 * their include path. */
#ifndef COMMPLAN_EMU_CUDA_RUNTIME_H
#define COMMPLAN_EMU_CUDA_RUNTIME_H
/* The host-kernel test double (tests/c/kernel_standin) must not add its own. */
#define COMMPLAN_KERNEL_STANDIN_CUDA_RUNTIME_H

#ifdef __CUDACC__
#error "tests/emu is a host-only test double; nvcc must use the real CUDA headers"
#endif

#include <stddef.h>
#include <string.h>

#define CP_CUDA_EMULATOR 1
#define __host__
#define __device__
#define CUDART_CB

#ifdef __cplusplus
extern "C" {
#endif

/* CUDA's values (driver_types.h, CUDA 13). */
typedef enum cudaError {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInitializationError = 3,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorNoDevice = 100,
    cudaErrorInvalidDevice = 101,
    cudaErrorInvalidResourceHandle = 400,
    cudaErrorNotReady = 600,
    cudaErrorIllegalAddress = 700,
    cudaErrorLaunchFailure = 719,
    cudaErrorNotPermitted = 800,
    cudaErrorNotSupported = 801,
    cudaErrorStreamCaptureUnsupported = 900,
    cudaErrorStreamCaptureInvalidated = 901,
    cudaErrorStreamCaptureUnjoined = 904,
    cudaErrorStreamCaptureIsolation = 905,
    cudaErrorStreamCaptureImplicit = 906,
    cudaErrorCapturedEvent = 907,
    cudaErrorStreamCaptureWrongThread = 908,
    cudaErrorUnknown = 999
} cudaError_t;

typedef enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4
} cudaMemcpyKind;

typedef enum cudaStreamCaptureMode {
    cudaStreamCaptureModeGlobal = 0,
    cudaStreamCaptureModeThreadLocal = 1,
    cudaStreamCaptureModeRelaxed = 2
} cudaStreamCaptureMode;

#define cudaStreamDefault 0x0
#define cudaStreamNonBlocking 0x1
#define cudaEventDefault 0x0
#define cudaEventDisableTiming 0x2

typedef struct CUstream_st *cudaStream_t;
typedef struct CUevent_st *cudaEvent_t;
typedef struct CUgraph_st *cudaGraph_t;
typedef struct CUgraphExec_st *cudaGraphExec_t;
typedef void (*cudaHostFn_t)(void *user);

const char *cudaGetErrorString(cudaError_t e);
cudaError_t cudaGetLastError(void);
cudaError_t cudaGetDeviceCount(int *n);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaDeviceGetStreamPriorityRange(int *least, int *greatest);
cudaError_t cudaDeviceSynchronize(void);

cudaError_t cudaMalloc(void **p, size_t bytes);
cudaError_t cudaFree(void *p);
cudaError_t cudaMallocHost(void **p, size_t bytes);
cudaError_t cudaFreeHost(void *p);
cudaError_t cudaMemset(void *p, int value, size_t bytes);
cudaError_t cudaMemsetAsync(void *p, int value, size_t bytes, cudaStream_t s);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind, cudaStream_t s);

cudaError_t cudaStreamCreate(cudaStream_t *s);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags);
cudaError_t cudaStreamCreateWithPriority(cudaStream_t *s, unsigned flags, int priority);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaStreamQuery(cudaStream_t s);
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags);
cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *graph);

cudaError_t cudaEventCreate(cudaEvent_t *e);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end);

cudaError_t cudaLaunchHostFunc(cudaStream_t s, cudaHostFn_t fn, void *user);

cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph, unsigned long long flags);
cudaError_t cudaGraphUpload(cudaGraphExec_t exec, cudaStream_t s);
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s);
cudaError_t cudaGraphDestroy(cudaGraph_t graph);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec);

/* ---- the emulator's own entry points (not CUDA) ----
 * A kernel launch: body(args) runs on the stream's worker with the
 * launch's place in the happens-before order; args (argbytes) are copied.
 * out_field is the offset in args of the kernel's output pointer and
 * out_elem its element size (the seeded "shifted kernel offset" fault
 * moves that pointer by one element). */
cudaError_t cudaEmuLaunchKernel(cudaStream_t s, const char *name, void (*body)(const void *args), const void *args,
                                size_t argbytes, size_t out_field, size_t out_elem);
/* A kernel body's load (write = 0) or store (write = 1) of bytes at p:
 * checked against the allocation's bounds and every earlier access. */
void cudaEmuAccess(const void *p, size_t bytes, int write);
/* The emulator's own tests (tests/emu/emu_selftest.c): findings so far, and
 * forgetting them (and a sticky fault) between cases. */
long cudaEmuFindings(void);
void cudaEmuClearFindings(void);

#ifdef __cplusplus
}

/* The 8- and 16-byte words the kernels' device branch names (CUDA's alignment). */
struct alignas(8) uint2 {
    unsigned int x, y;
};
struct alignas(16) uint4 {
    unsigned int x, y, z, w;
};
#endif

#endif
