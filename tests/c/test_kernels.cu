/* The generated copy kernels against the host backend's C copies (the
 * reference): random inputs, poisoned outputs, every unit of plans with
 * odd sizes, empty shards, Shard(1), casts and pre/post divides, for every
 * shard rank. The kernels' group bodies run on the CPU here; with a CUDA
 * device present the same launches run on it and are compared too. */
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <cuda_runtime.h>

#include "commplan.h"
#include "cp_gpu_kernels.h"
#include "host.h"

extern "C" const cp_plan fsdp8_uneven_plan, hsdp2x3_bf16_plan, hsdp4x2_fp16_plan, llama_tiny_plan, kernels_big_plan,
    kernels_all_dtypes_plan, ep2_mixtral_plan, ep2_dsv3_shard1_plan;
extern "C" const cp_gpu_kernels fsdp8_uneven_kernels, hsdp2x3_bf16_kernels, hsdp4x2_fp16_kernels, llama_tiny_kernels,
    kernels_big_kernels, kernels_all_dtypes_kernels, ep2_mixtral_kernels, ep2_dsv3_shard1_kernels;

static int failures, checks, device_checks;
static int have_device = -1;
static char no_device_reason[256];

static void fill_random(void *buf, cp_dtype t, int64_t n, unsigned *seed)
{
    for (int64_t i = 0; i < n; i++) {
        *seed = *seed * 1103515245u + 12345u;
        float v = (float)((int)((*seed >> 8) % 4001u) - 2000) / 16.0f;
        cp_store(t, buf, i, v);
    }
}

static int device_available(void)
{
    if (have_device < 0) {
        int n = 0;
        cudaError_t e = cudaGetDeviceCount(&n);
        have_device = e == cudaSuccess && n > 0;
        if (!have_device)
            snprintf(no_device_reason, sizeof no_device_reason, "%s", e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    }
    return have_device;
}

#define CUDA_OK(call)                                                                                                  \
    do {                                                                                                               \
        cudaError_t e_ = (call);                                                                                       \
        if (e_ != cudaSuccess) {                                                                                       \
            fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_));              \
            exit(1);                                                                                                   \
        }                                                                                                              \
    } while (0)

/* Runs kernel op on a copy of `in` and compares its output with `want`
 * (the executor's), starting from the same poisoned `out0`. */
static void compare(const char *plan, const char *what, int unit, int rank, const cp_gpu_kernels *k, int tp_class, int op,
                    int shard_rank, const void *in, size_t in_bytes, const void *out0, const void *want,
                    size_t out_bytes)
{
    std::vector<unsigned char> got(out0 == nullptr ? 0 : out_bytes);
    memcpy(got.data(), out0, out_bytes);
    checks++;
    int rc = k->emulate(tp_class, op, unit, 0, 0, shard_rank, in, got.data());
    if (rc != 0 || memcmp(got.data(), want, out_bytes) != 0) {
        size_t i = 0;
        while (i < out_bytes && got[i] == ((const unsigned char *)want)[i]) i++;
        fprintf(stderr, "FAIL %s %s unit %d rank %d: rc %d, first differing byte %zu of %zu\n", plan, what, unit, rank,
                rc, i, out_bytes);
        failures++;
    }
    if (!device_available()) return;
    void *din, *dout;
    CUDA_OK(cudaMalloc(&din, in_bytes ? in_bytes : 1));
    CUDA_OK(cudaMalloc(&dout, out_bytes ? out_bytes : 1));
    CUDA_OK(cudaMemcpy(din, in, in_bytes, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dout, out0, out_bytes, cudaMemcpyHostToDevice));
    CUDA_OK((cudaError_t)k->launch(tp_class, op, unit, 0, 0, shard_rank, din, dout, nullptr));
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaMemcpy(got.data(), dout, out_bytes, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaFree(din));
    CUDA_OK(cudaFree(dout));
    device_checks++;
    if (memcmp(got.data(), want, out_bytes) != 0) {
        fprintf(stderr, "FAIL %s %s unit %d rank %d on the device\n", plan, what, unit, rank);
        failures++;
    }
}

/* One unit's copy `kernel` by the host reference (the host backend's copy)
 * and by the kernels, on the CPU and the device, from the same input and
 * the same poisoned output. */
static void check_copy(const cp_plan *p, cp_backend *ref, const cp_gpu_kernels *k, const char *what, int kernel,
                       int u, int rank, int shard_rank, cp_buffer in_kind, cp_buffer out_kind, unsigned *seed)
{
    /* p is the rank's view: its TP class's layout. */
    const cp_unit *U = &p->units[u];
    cp_dtype in_t = kernel == CP_KERNEL_COPY_IN                                          ? U->orig_dtype
                    : kernel == CP_KERNEL_VIEW_OUT || kernel == CP_KERNEL_VIEW_OUT_ADD ||
                      kernel == CP_KERNEL_FLAT_COPY || kernel == CP_KERNEL_FLAT_ADD      ? U->reduce_dtype
                    : kernel == CP_KERNEL_PACK                                         ? U->grad_dtype
                                                                                       : U->ag_dtype;
    size_t in_bytes = (size_t)cp_arena_buffer_bytes(p, u, in_kind);
    size_t out_bytes = (size_t)cp_arena_buffer_bytes(p, u, out_kind);
    std::vector<unsigned char> in(in_bytes + 1), want(out_bytes + 1, CP_POISON_BYTE), out0(out_bytes + 1, CP_POISON_BYTE);
    fill_random(in.data(), in_t, (int64_t)(in_bytes / cp_dtype_size(in_t)), seed);
    if (kernel == CP_KERNEL_VIEW_OUT_ADD) { /* adds into sharded grads an earlier reduction set */
        fill_random(out0.data(), U->orig_dtype, (int64_t)(out_bytes / cp_dtype_size(U->orig_dtype)), seed);
        memcpy(want.data(), out0.data(), out_bytes);
    }
    if (kernel == CP_KERNEL_FLAT_ADD) { /* all_reduce_last's partial sums: adds into what the output holds */
        fill_random(out0.data(), U->reduce_dtype, (int64_t)(out_bytes / cp_dtype_size(U->reduce_dtype)), seed);
        memcpy(want.data(), out0.data(), out_bytes);
    }
    if (ref->copy(ref, kernel, u, 0, 0, CP_STREAM_COMPUTE, in.data(), want.data()) != 0) exit(1);
    compare(p->name, what, u, rank, k, p->view_class, kernel, shard_rank, in.data(), in_bytes, out0.data(), want.data(),
            out_bytes);
}

static void check_plan(const cp_plan *plan, const cp_gpu_kernels *k)
{
    unsigned seed = 12345;
    cp_host_world *w = cp_host_world_create(plan);
    if (!w) exit(1);
    /* The first rank of every (TP class, shard rank): the kernels' only per-rank inputs (a
     * unit's own shard rank, an experts unit's efsdp key, follows from the plan's). */
    int nclasses = plan->nclasses > 0 ? plan->nclasses : 1;
    std::vector<int> seen((size_t)(plan->shard_size * nclasses), 0);
    for (int rank = 0; rank < plan->world_size; rank++) {
        cp_plan view;
        cp_plan_view(plan, rank, &view);
        const cp_plan *p = &view;
        int sr = cp_shard_rank(p, rank);
        if (seen[(size_t)(view.view_class * plan->shard_size + sr)]++) continue;
        cp_backend b;
        cp_host_backend_init(&b, w, rank);
        for (int u = 0; u < p->nunits; u++) {
            int usr = cp_unit_shard_rank(p, u, rank); /* the unit's own group: the kernels' tables hold its size */
            check_copy(p, &b, k, "copy_in", CP_KERNEL_COPY_IN, u, rank, usr, CP_BUF_SHARDED, CP_BUF_AG, &seed);
            check_copy(p, &b, k, "copy_out", CP_KERNEL_COPY_OUT, u, rank, usr, CP_BUF_AG, CP_BUF_UNSHARDED, &seed);
            check_copy(p, &b, k, "pack", CP_KERNEL_PACK, u, rank, usr, CP_BUF_GRADS, CP_BUF_RS_IN, &seed);
            check_copy(p, &b, k, "view_out", CP_KERNEL_VIEW_OUT, u, rank, usr, CP_BUF_RS_OUT, CP_BUF_SHARDED_GRADS, &seed);
            check_copy(p, &b, k, "view_out_add", CP_KERNEL_VIEW_OUT_ADD, u, rank, usr, CP_BUF_RS_OUT,
                       CP_BUF_SHARDED_GRADS, &seed);
            /* all_reduce_last's partial sums, on every unit whatever the plan's mode: reduce-scatter-output-
             * sized buffers of the reduce dtype */
            check_copy(p, &b, k, "flat_copy", CP_KERNEL_FLAT_COPY, u, rank, usr, CP_BUF_RS_OUT, CP_BUF_RS_OUT, &seed);
            check_copy(p, &b, k, "flat_add", CP_KERNEL_FLAT_ADD, u, rank, usr, CP_BUF_RS_OUT, CP_BUF_RS_OUT, &seed);
        }
    }
    cp_host_world_destroy(w);
}

int main(void)
{
    check_plan(&fsdp8_uneven_plan, &fsdp8_uneven_kernels);
    check_plan(&hsdp2x3_bf16_plan, &hsdp2x3_bf16_kernels);
    check_plan(&hsdp4x2_fp16_plan, &hsdp4x2_fp16_kernels);
    check_plan(&llama_tiny_plan, &llama_tiny_kernels);
    check_plan(&kernels_big_plan, &kernels_big_kernels);
    /* every (orig, param, reduce) dtype triple; fp16 divides by 4 then 1.5 (HSDP 2 x 3) */
    check_plan(&kernels_all_dtypes_plan, &kernels_all_dtypes_kernels);
    /* expert parallel: experts units sharded over their own efsdp group, Shard(0) and Shard(1) */
    check_plan(&ep2_mixtral_plan, &ep2_mixtral_kernels);
    check_plan(&ep2_dsv3_shard1_plan, &ep2_dsv3_shard1_kernels);
    printf("kernels vs host reference: %d checks on the CPU, %d on the device, %d failed\n", checks, device_checks,
           failures);
    if (!device_available()) printf("SKIP device kernel launches: no CUDA device here (%s)\n", no_device_reason);
    return failures ? 1 : 0;
}
