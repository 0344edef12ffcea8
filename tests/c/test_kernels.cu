/* The generated copy kernels against the C executor (the host reference):
 * random inputs, poisoned outputs, every unit of plans with odd sizes,
 * empty shards, Shard(1), casts and pre/post divides, for the first and
 * last shard rank. The kernels' group bodies run on the CPU here; with a
 * CUDA device present the same launches run on it and are compared too. */
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <cuda_runtime.h>

extern "C" {
#include "commplan.h"
}
#include "cp_gpu_kernels.h"

extern "C" const cp_plan fsdp8_uneven_plan, hsdp2x3_bf16_plan, hsdp4x2_fp16_plan, llama_tiny_plan, kernels_big_plan;
extern "C" const cp_gpu_kernels fsdp8_uneven_kernels, hsdp2x3_bf16_kernels, hsdp4x2_fp16_kernels, llama_tiny_kernels,
    kernels_big_kernels;

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
static void compare(const char *plan, const char *what, int unit, int rank, const cp_gpu_kernels *k, int op,
                    int shard_rank, const void *in, size_t in_bytes, const void *out0, const void *want,
                    size_t out_bytes)
{
    std::vector<unsigned char> got(out0 == nullptr ? 0 : out_bytes);
    memcpy(got.data(), out0, out_bytes);
    checks++;
    int rc = k->emulate(op, unit, shard_rank, in, got.data());
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
    CUDA_OK((cudaError_t)k->launch(op, unit, shard_rank, din, dout, nullptr));
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

static int no_collective(cp_backend *, const cp_op *, const void *, void *) { return -1; }

static void check_plan(const cp_plan *p, const cp_gpu_kernels *k)
{
    unsigned seed = 12345;
    int64_t W = p->shard_size;
    int ranks[2] = { 0, p->world_size - 1 };
    for (int ri = 0; ri < 2; ri++) {
        cp_backend b = { nullptr, no_collective, no_collective, nullptr };
        cp_executor ex;
        if (cp_executor_init(&ex, p, ranks[ri], &b) != 0) exit(1);
        for (int u = 0; u < p->nunits; u++) {
            const cp_unit *U = &p->units[u];
            size_t es_o = cp_dtype_size(U->orig_dtype), es_a = cp_dtype_size(U->ag_dtype);
            size_t es_r = cp_dtype_size(U->reduce_dtype);
            size_t ag_bytes = (size_t)(W * U->total) * es_a, rs_bytes = (size_t)(W * U->total) * es_r;
            std::vector<unsigned char> poison_ag(ag_bytes, CP_POISON_BYTE), poison_rs(rs_bytes, CP_POISON_BYTE);
            std::vector<unsigned char> poison_sg((size_t)U->total * es_o, CP_POISON_BYTE);
            cp_op op = {};
            op.unit = u;
            op.family = -1;

            fill_random(ex.buf.sharded[u], U->orig_dtype, U->total, &seed);
            memset(ex.buf.ag[u], CP_POISON_BYTE, ag_bytes);
            op.kind = CP_OP_COPY_IN;
            cp_executor_run_op(&ex, &op);
            compare(p->name, "copy_in", u, ranks[ri], k, CP_KERNEL_COPY_IN, ex.shard_rank, ex.buf.sharded[u],
                    (size_t)U->total * es_o, poison_ag.data(), ex.buf.ag[u], ag_bytes);

            fill_random(ex.buf.ag[u], U->ag_dtype, W * U->total, &seed);
            std::vector<unsigned char> ag_in((unsigned char *)ex.buf.ag[u], (unsigned char *)ex.buf.ag[u] + ag_bytes);
            memset(ex.buf.unsharded[u], CP_POISON_BYTE, ag_bytes);
            op.kind = CP_OP_COPY_OUT;
            cp_executor_run_op(&ex, &op);
            compare(p->name, "copy_out", u, ranks[ri], k, CP_KERNEL_COPY_OUT, ex.shard_rank, ag_in.data(), ag_bytes,
                    poison_ag.data(), ex.buf.unsharded[u], ag_bytes);

            size_t g_bytes = (size_t)U->grads_numel * es_a;
            fill_random(ex.buf.grads[u], U->ag_dtype, U->grads_numel, &seed);
            std::vector<unsigned char> g_in((unsigned char *)ex.buf.grads[u], (unsigned char *)ex.buf.grads[u] + g_bytes);
            memset(ex.buf.rs_in[u], CP_POISON_BYTE, rs_bytes);
            op.kind = CP_OP_PACK;
            cp_executor_run_op(&ex, &op);
            compare(p->name, "pack", u, ranks[ri], k, CP_KERNEL_PACK, ex.shard_rank, g_in.data(), g_bytes,
                    poison_rs.data(), ex.buf.rs_in[u], rs_bytes);

            size_t ro_bytes = (size_t)U->total * es_r;
            fill_random(ex.buf.rs_out[u], U->reduce_dtype, U->total, &seed);
            std::vector<unsigned char> ro_in((unsigned char *)ex.buf.rs_out[u], (unsigned char *)ex.buf.rs_out[u] + ro_bytes);
            memset(ex.buf.sharded_grads[u], CP_POISON_BYTE, poison_sg.size());
            op.kind = CP_OP_VIEW_OUT;
            cp_executor_run_op(&ex, &op);
            compare(p->name, "view_out", u, ranks[ri], k, CP_KERNEL_VIEW_OUT, ex.shard_rank, ro_in.data(), ro_bytes,
                    poison_sg.data(), ex.buf.sharded_grads[u], poison_sg.size());
        }
        cp_executor_free(&ex);
    }
}

int main(void)
{
    check_plan(&fsdp8_uneven_plan, &fsdp8_uneven_kernels);
    check_plan(&hsdp2x3_bf16_plan, &hsdp2x3_bf16_kernels);
    check_plan(&hsdp4x2_fp16_plan, &hsdp4x2_fp16_kernels);
    check_plan(&llama_tiny_plan, &llama_tiny_kernels);
    check_plan(&kernels_big_plan, &kernels_big_kernels);
    printf("kernels vs host reference: %d checks on the CPU, %d on the device, %d failed\n", checks, device_checks,
           failures);
    if (!device_available()) printf("SKIP device kernel launches: no CUDA device here (%s)\n", no_device_reason);
    return failures ? 1 : 0;
}
