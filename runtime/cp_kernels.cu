/* The copy kernels, compiled once for every plan: the kernel bodies are
 * plan-independent (cp_kernels.cuh) and read each plan's layout from its
 * generated tables (plan.c) through per-(plan, TP class) tables built on
 * first use. A plan's plan_kernels.cu only binds its name to these. */
#include <mutex>

#include "cp_gpu_kernels.h"
#include "cp_kernels.cuh"

namespace {

/* One entry per (plan, TP class) a process uses: a process runs one plan
 * (one class on the GPU); tests emulate a few. */
struct entry {
    const cp_plan *plan;
    int tp_class;
    cp_ktables tables;
    entry *next;
};
entry *entries;
std::mutex lock;

/* The class's tables, built (host = 1) or also copied to the device
 * (host = 0) under the lock: two threads' first launches must not both
 * build them, nor one read them half built. Later calls find them ready,
 * and cp_ktables_run's own prepare returns at once. */
cp_ktables *tables_of(const cp_plan *p, int tp_class, int host, cudaError_t *err)
{
    std::lock_guard<std::mutex> guard(lock);
    entry *found = nullptr;
    for (entry *e = entries; e && !found; e = e->next)
        if (e->plan == p && e->tp_class == tp_class) found = e;
    if (!found) {
        found = new (std::nothrow) entry{ p, tp_class, cp_ktables{}, entries };
        if (!found) { *err = cudaErrorMemoryAllocation; return nullptr; }
        entries = found;
    }
    *err = host ? cp_ktables_build_host(&found->tables, p, tp_class) : cp_ktables_prepare(&found->tables, p, tp_class);
    return *err == cudaSuccess ? &found->tables : nullptr;
}

cudaError_t run(const cp_plan *p, int tp_class, int op, int unit, int part_first, int part_count, int shard_rank,
                const void *in, void *out, cudaStream_t s, int host)
{
    int nclasses = p->nclasses > 0 ? p->nclasses : 1;
    if (tp_class < 0 || tp_class >= nclasses) return cudaErrorInvalidValue;
    cudaError_t e;
    cp_ktables *t = tables_of(p, tp_class, host, &e);
    if (!t) return e;
    return cp_ktables_run(t, p, tp_class, op, unit, part_first, part_count, shard_rank, in, out, s, host);
}

} // namespace

extern "C" int cp_kernels_prepare(const cp_plan *p, int tp_class)
{
    cudaError_t e;
    tables_of(p, tp_class, 0, &e);
    return (int)e;
}

extern "C" int cp_kernels_launch(const cp_plan *p, int tp_class, int op, int unit, int part_first, int part_count,
                                 int shard_rank, const void *in, void *out, void *stream)
{
    return (int)run(p, tp_class, op, unit, part_first, part_count, shard_rank, in, out, (cudaStream_t)stream, 0);
}

extern "C" int cp_kernels_emulate(const cp_plan *p, int tp_class, int op, int unit, int part_first, int part_count,
                                  int shard_rank, const void *in, void *out)
{
    return (int)run(p, tp_class, op, unit, part_first, part_count, shard_rank, in, out, 0, 1);
}
