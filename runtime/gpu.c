/* GPU executor: one rank of a plan over NCCL with FSDP2's streams. */
#define _POSIX_C_SOURCE 200809L
#include <cuda_runtime.h>
#include <nccl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cp_gpu.h"

/* NCCL's bootstrap blocks until every rank has connected; a rank that was
 * never started would leave the others waiting forever. The watchdog ends
 * the process with a clear message instead. */
typedef struct {
    pthread_mutex_t lock;
    pthread_cond_t done_cv;
    int done, rank, world;
    double timeout_s;
    const char *comm_id;
} watchdog;

static void *watchdog_main(void *arg)
{
    watchdog *w = arg;
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += (time_t)w->timeout_s;
    pthread_mutex_lock(&w->lock);
    while (!w->done)
        if (pthread_cond_timedwait(&w->done_cv, &w->lock, &until) != 0 && !w->done) {
            fprintf(stderr,
                    "commplan: rank %d: NCCL bootstrap of %d ranks through %s did not finish within %.0f s: start every "
                    "rank and check that MASTER_ADDR:MASTER_PORT is reachable (COMMPLAN_INIT_TIMEOUT sets the limit)\n",
                    w->rank, w->world, w->comm_id[0] ? w->comm_id : "NCCL's default interface", w->timeout_s);
            fflush(stderr);
            _exit(2);
        }
    pthread_mutex_unlock(&w->lock);
    return NULL;
}

enum { BUF_SHARDED, BUF_UNSHARDED, BUF_GRADS, BUF_SHARDED_GRADS, BUF_AG, BUF_RS_IN, BUF_RS_OUT, BUF_COUNT };
enum { EV_COPY_IN, EV_AG, EV_COPY_OUT, EV_PACK, EV_RS, EV_COUNT };

/* gpu.c's buffer kinds that live in the arena, in cp_arena_buffer order. */
static const int ARENA_BUF[CP_ARENA_BUFFERS] = { BUF_AG, BUF_UNSHARDED, BUF_GRADS, BUF_RS_IN, BUF_RS_OUT };

typedef struct {
    void *buf[BUF_COUNT]; /* sharded ones owned; the rest point into the arena */
    cudaEvent_t ev[EV_COUNT];
    int copy_out_this_step; /* ev[EV_COPY_OUT] was recorded in the current step */
    int cursor[3];          /* library calls: next op to scan from for unshard, reshard, reduce */
} unit_state;

struct cp_gpu {
    const cp_plan *plan;
    const cp_gpu_kernels *k;
    cp_launch_env env;
    int shard_rank, device;
    ncclComm_t world;
    ncclComm_t *comms; /* per family; NULL where the plan issues nothing */
    cudaStream_t copy_in, all_gather, reduce_scatter, all_reduce;
    cudaEvent_t start;
    cudaEvent_t side_done[4]; /* joins each side stream back into the caller's */
    unit_state *units;
    void *arena;          /* plan->arena_bytes of transient buffers */
    unsigned char *live;  /* per unit, library calls: unsharded between cp_gpu_unshard and cp_gpu_reshard */
    cudaEvent_t *events;  /* plan->nevents: arena reuse across streams */
    cp_gpu_compute_fn compute;
    void *compute_user;
    cudaGraphExec_t graph;
    char err[512];
};

static int fail(cp_gpu *g, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = snprintf(g->err, sizeof g->err, "rank %d: ", g->env.rank);
    vsnprintf(g->err + n, sizeof g->err - (size_t)n, fmt, ap);
    va_end(ap);
    return -1;
}

#define CUDA(call)                                                                                                     \
    do {                                                                                                               \
        cudaError_t e_ = (call);                                                                                       \
        if (e_ != cudaSuccess)                                                                                         \
            return fail(g, "%s failed: %s%s", #call, cudaGetErrorString(e_),                                           \
                        e_ == cudaErrorMemoryAllocation ? " (out of GPU memory: spread the plan over more ranks)" : ""); \
    } while (0)
#define NCCL(call)                                                                                                     \
    do {                                                                                                               \
        ncclResult_t r_ = (call);                                                                                      \
        if (r_ != ncclSuccess)                                                                                         \
            return fail(g, "%s failed: %s (%s; NCCL_DEBUG=WARN says more)", #call, ncclGetErrorString(r_),             \
                        ncclGetLastError(NULL));                                                                       \
    } while (0)

static ncclDataType_t nccl_type(cp_dtype t) { return t == CP_FP32 ? ncclFloat32 : t == CP_BF16 ? ncclBfloat16 : ncclFloat16; }
static ncclRedOp_t nccl_op(cp_reduce_op op) { return op == CP_AVG ? ncclAvg : ncclSum; }

size_t cp_gpu_buffer_bytes(const cp_gpu *g, int u, int kind)
{
    const cp_unit *U = &g->plan->units[u];
    if (kind == BUF_SHARDED || kind == BUF_SHARDED_GRADS) return (size_t)U->total * cp_dtype_size(U->orig_dtype);
    for (int k = 0; k < CP_ARENA_BUFFERS; k++)
        if (ARENA_BUF[k] == kind) return (size_t)cp_arena_buffer_bytes(g->plan, u, (cp_arena_buffer)k);
    return 0;
}

static int uses_family(const cp_plan *p, int f)
{
    for (int i = 0; i < p->nops; i++)
        if (p->ops[i].family == f) return 1;
    return 0;
}

static int init_comms(cp_gpu *g)
{
    const cp_plan *p = g->plan;
    /* Stand-in: one-rank communicators everywhere, bootstrapped locally. */
    int nranks = g->env.standin ? 1 : g->env.world_size, me = g->env.standin ? 0 : g->env.rank;
    if (g->env.standin) unsetenv("NCCL_COMM_ID");
    else if (g->env.comm_id[0] && setenv("NCCL_COMM_ID", g->env.comm_id, 1) != 0)
        return fail(g, "setenv(NCCL_COMM_ID) failed");
    ncclUniqueId id;
    /* With NCCL_COMM_ID set every rank derives the same id and rank 0
     * listens on that address: no MPI and no side channel needed. */
    NCCL(ncclGetUniqueId(&id));
    NCCL(ncclCommInitRank(&g->world, nranks, id, me));
    /* Every rank must run the same plan: compare fingerprints first. */
    char *mine, *all;
    CUDA(cudaMalloc((void **)&mine, 32));
    CUDA(cudaMalloc((void **)&all, 32 * (size_t)nranks));
    char fp[32] = { 0 };
    snprintf(fp, sizeof fp, "%s", p->fingerprint);
    CUDA(cudaMemcpy(mine, fp, 32, cudaMemcpyHostToDevice));
    NCCL(ncclAllGather(mine, all, 32, ncclChar, g->world, g->copy_in));
    CUDA(cudaStreamSynchronize(g->copy_in));
    char *host = malloc(32 * (size_t)nranks);
    if (!host) return fail(g, "out of host memory");
    cudaError_t e = cudaMemcpy(host, all, 32 * (size_t)nranks, cudaMemcpyDeviceToHost);
    cudaFree(mine);
    cudaFree(all);
    if (e != cudaSuccess) { free(host); return fail(g, "cudaMemcpy of fingerprints failed: %s", cudaGetErrorString(e)); }
    for (int r = 0; r < nranks; r++)
        if (strncmp(host + 32 * (size_t)r, fp, 32) != 0) {
            int rc = fail(g, "rank %d runs plan fingerprint %.16s, this rank %s (%s); deploy the same build everywhere",
                          r, host + 32 * (size_t)r, fp, p->name);
            free(host);
            return rc;
        }
    free(host);
    g->comms = calloc((size_t)p->nfamilies, sizeof *g->comms);
    if (!g->comms) return fail(g, "out of host memory");
    for (int f = 0; f < p->nfamilies; f++) {
        if (!uses_family(p, f) || p->families[f].size < 2) continue;
        int color, key;
        cp_group_of(p, f, g->env.rank, &color, &key);
        if (g->env.standin) color = key = 0;
        NCCL(ncclCommSplit(g->world, color, key, &g->comms[f], NULL));
    }
    return 0;
}

int cp_gpu_init(cp_gpu **out, const cp_plan *p, const cp_gpu_kernels *k, const cp_launch_env *env, char *err,
                size_t errlen)
{
    *out = NULL;
    cp_gpu *g = calloc(1, sizeof *g);
    if (!g) { snprintf(err, errlen, "out of host memory"); return -1; }
    g->plan = p;
    g->k = k;
    g->env = *env;
    int rc = -1;
    if (env->standin && env->world_size != p->world_size) {
        fail(g, "stand-in run of plan %s needs world_size %d (got %d)", p->name, p->world_size, env->world_size);
        goto out;
    }
    if (env->world_size != p->world_size) {
        fail(g, "the launcher started %d ranks but plan %s is for %d; launch %d or regenerate with world_size = %d",
             env->world_size, p->name, p->world_size, p->world_size, env->world_size);
        goto out;
    }
    int ndev = 0;
    cudaError_t ce = cudaGetDeviceCount(&ndev);
    if (ce != cudaSuccess || ndev == 0) {
        fail(g, "no CUDA device (%s); run on a GPU node or use --simulate",
             ce != cudaSuccess ? cudaGetErrorString(ce) : "0 devices");
        goto out;
    }
    if (env->local_rank >= ndev) {
        fail(g, "LOCAL_RANK=%d but only %d GPU(s) are visible; start at most %d ranks per node or fix CUDA_VISIBLE_DEVICES",
             env->local_rank, ndev, ndev);
        goto out;
    }
    g->device = env->local_rank;
    g->shard_rank = cp_shard_rank(p, env->rank);
    if (cudaSetDevice(g->device) != cudaSuccess) { fail(g, "cudaSetDevice(%d) failed", g->device); goto out; }
    int least, greatest;
    if (cudaDeviceGetStreamPriorityRange(&least, &greatest) != cudaSuccess ||
        cudaStreamCreateWithPriority(&g->copy_in, cudaStreamNonBlocking, greatest) != cudaSuccess ||
        cudaStreamCreateWithPriority(&g->all_gather, cudaStreamNonBlocking, greatest) != cudaSuccess ||
        cudaStreamCreateWithPriority(&g->reduce_scatter, cudaStreamNonBlocking, greatest) != cudaSuccess ||
        cudaStreamCreateWithPriority(&g->all_reduce, cudaStreamNonBlocking, least) != cudaSuccess ||
        cudaEventCreateWithFlags(&g->start, cudaEventDisableTiming) != cudaSuccess ||
        cudaEventCreateWithFlags(&g->side_done[0], cudaEventDisableTiming) != cudaSuccess ||
        cudaEventCreateWithFlags(&g->side_done[1], cudaEventDisableTiming) != cudaSuccess ||
        cudaEventCreateWithFlags(&g->side_done[2], cudaEventDisableTiming) != cudaSuccess ||
        cudaEventCreateWithFlags(&g->side_done[3], cudaEventDisableTiming) != cudaSuccess) {
        fail(g, "creating CUDA streams and events failed");
        goto out;
    }
    {
        const char *t = getenv("COMMPLAN_INIT_TIMEOUT");
        watchdog w = { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, env->rank, env->world_size,
                       t ? atof(t) : 300.0, env->comm_id };
        if (w.timeout_s <= 0) w.timeout_s = 300.0;
        pthread_t th;
        int have_watchdog = pthread_create(&th, NULL, watchdog_main, &w) == 0;
        int crc = init_comms(g);
        if (have_watchdog) {
            pthread_mutex_lock(&w.lock);
            w.done = 1;
            pthread_cond_signal(&w.done_cv);
            pthread_mutex_unlock(&w.lock);
            pthread_join(th, NULL);
        }
        if (crc != 0) goto out;
    }
    g->units = calloc((size_t)p->nunits, sizeof *g->units);
    g->events = calloc((size_t)(p->nevents > 0 ? p->nevents : 1), sizeof *g->events);
    g->live = calloc((size_t)p->nunits, 1);
    if (!g->units || !g->events || !g->live) { fail(g, "out of host memory"); goto out; }
    {
        size_t bytes = (size_t)p->arena_bytes;
        cudaError_t e = cudaMalloc(&g->arena, bytes ? bytes : 16);
        if (e != cudaSuccess) {
            fail(g, "cudaMalloc of the %zu-byte buffer arena failed: %s (plan %s needs more memory than this GPU has; "
                 "SCHEDULE.md's memory section says how much; use more ranks)", bytes, cudaGetErrorString(e), p->name);
            goto out;
        }
        if (cudaMemset(g->arena, 0, bytes ? bytes : 16) != cudaSuccess) { fail(g, "cudaMemset failed"); goto out; }
    }
    for (int i = 0; i < p->nevents; i++)
        if (cudaEventCreateWithFlags(&g->events[i], cudaEventDisableTiming) != cudaSuccess) {
            fail(g, "cudaEventCreate failed");
            goto out;
        }
    for (int u = 0; u < p->nunits; u++) {
        unit_state *s = &g->units[u];
        for (int k = 0; k < CP_ARENA_BUFFERS; k++)
            s->buf[ARENA_BUF[k]] = (char *)g->arena + p->units[u].arena_offset[k];
        for (int b = 0; b < BUF_COUNT; b++) {
            if (b != BUF_SHARDED && b != BUF_SHARDED_GRADS) continue;
            size_t bytes = cp_gpu_buffer_bytes(g, u, b);
            cudaError_t e = cudaMalloc(&s->buf[b], bytes ? bytes : 16);
            if (e != cudaSuccess) {
                fail(g, "cudaMalloc of %zu bytes for unit %s failed: %s (plan %s needs more memory than this GPU has; "
                     "use more ranks)", bytes, p->units[u].name, cudaGetErrorString(e), p->name);
                goto out;
            }
            if (cudaMemset(s->buf[b], 0, bytes ? bytes : 16) != cudaSuccess) { fail(g, "cudaMemset failed"); goto out; }
        }
        for (int e = 0; e < EV_COUNT; e++)
            if (cudaEventCreateWithFlags(&s->ev[e], cudaEventDisableTiming) != cudaSuccess) {
                fail(g, "cudaEventCreate failed");
                goto out;
            }
    }
    rc = 0;
out:
    if (rc != 0) {
        snprintf(err, errlen, "%s", g->err);
        cp_gpu_destroy(g);
        return -1;
    }
    *out = g;
    return 0;
}

void cp_gpu_destroy(cp_gpu *g)
{
    if (!g) return;
    if (g->graph) cudaGraphExecDestroy(g->graph);
    if (g->units)
        for (int u = 0; u < g->plan->nunits; u++) {
            if (g->units[u].buf[BUF_SHARDED]) cudaFree(g->units[u].buf[BUF_SHARDED]);
            if (g->units[u].buf[BUF_SHARDED_GRADS]) cudaFree(g->units[u].buf[BUF_SHARDED_GRADS]);
            for (int e = 0; e < EV_COUNT; e++) if (g->units[u].ev[e]) cudaEventDestroy(g->units[u].ev[e]);
        }
    free(g->units);
    if (g->events)
        for (int i = 0; i < g->plan->nevents; i++) if (g->events[i]) cudaEventDestroy(g->events[i]);
    free(g->events);
    free(g->live);
    if (g->arena) cudaFree(g->arena);
    if (g->comms)
        for (int f = 0; f < g->plan->nfamilies; f++) if (g->comms[f]) ncclCommDestroy(g->comms[f]);
    free(g->comms);
    if (g->world) ncclCommDestroy(g->world);
    if (g->start) cudaEventDestroy(g->start);
    for (int i = 0; i < 4; i++) if (g->side_done[i]) cudaEventDestroy(g->side_done[i]);
    cudaStream_t streams[4] = { g->copy_in, g->all_gather, g->reduce_scatter, g->all_reduce };
    for (int i = 0; i < 4; i++) if (streams[i]) cudaStreamDestroy(streams[i]);
    free(g);
}

const char *cp_gpu_last_error(const cp_gpu *g) { return g->err; }
int cp_gpu_rank(const cp_gpu *g) { return g->env.rank; }
int cp_gpu_shard_rank(const cp_gpu *g) { return g->shard_rank; }
int cp_gpu_is_standin(const cp_gpu *g) { return g->env.standin; }

static int unit_of(const cp_plan *p, int param)
{
    for (int u = 0; u < p->nunits; u++)
        if (param >= p->units[u].first_param && param < p->units[u].first_param + p->units[u].nparams) return u;
    return -1;
}

static void *param_ptr(cp_gpu *g, int param, int kind)
{
    int u = unit_of(g->plan, param);
    if (u < 0) return NULL;
    const cp_unit *U = &g->plan->units[u];
    const cp_param *prm = &g->plan->params[param];
    char *base = g->units[u].buf[kind];
    switch (kind) {
    case BUF_SHARDED:
    case BUF_SHARDED_GRADS: return base + (size_t)prm->offset * cp_dtype_size(U->orig_dtype);
    case BUF_UNSHARDED: return base + (size_t)(g->plan->shard_size * prm->offset) * cp_dtype_size(U->ag_dtype);
    default: return base + (size_t)prm->grad_offset * cp_dtype_size(U->ag_dtype);
    }
}

void *cp_gpu_sharded(cp_gpu *g, int param) { return param_ptr(g, param, BUF_SHARDED); }
void *cp_gpu_unsharded(cp_gpu *g, int param) { return param_ptr(g, param, BUF_UNSHARDED); }
void *cp_gpu_grad(cp_gpu *g, int param) { return param_ptr(g, param, BUF_GRADS); }
void *cp_gpu_sharded_grad(cp_gpu *g, int param) { return param_ptr(g, param, BUF_SHARDED_GRADS); }

static int kernel(cp_gpu *g, int op, int u, const void *in, void *out, cudaStream_t s)
{
    int e = g->k->launch(op, u, g->shard_rank, in, out, s);
    if (e != 0) {
        static const char *const names[] = { "copy-in", "copy-out", "pack", "view-out" };
        return fail(g, "%s kernel of unit %s failed: %s", names[op], g->plan->units[u].name,
                    cudaGetErrorString((cudaError_t)e));
    }
    return 0;
}

/* The stream an op's GPU work runs on (gen/memplan.lua models the same). */
static cudaStream_t op_stream(cp_gpu *g, const cp_op *op, cudaStream_t S)
{
    switch (op->kind) {
    case CP_OP_COPY_IN: return g->copy_in;
    case CP_OP_ALL_GATHER: return op->family >= 0 ? g->all_gather : g->copy_in;
    case CP_OP_REDUCE_SCATTER: return g->reduce_scatter;
    case CP_OP_ALL_REDUCE: return g->all_reduce;
    case CP_OP_VIEW_OUT: return g->plan->replicate_family >= 0 ? g->all_reduce : g->reduce_scatter;
    default: return S;
    }
}

static int run_op_body(cp_gpu *g, const cp_op *op, cudaStream_t S);

/* One op: first the arena waits (its buffer's bytes were last used by
 * another op, maybe on another stream), then its work, then its event if
 * a later op reuses bytes it used. */
static int run_op(cp_gpu *g, const cp_op *op, cudaStream_t S)
{
    const cp_plan *p = g->plan;
    if (op->wait_count > 0 || op->event >= 0) {
        cudaStream_t s = op_stream(g, op, S);
        for (int i = 0; i < op->wait_count; i++) CUDA(cudaStreamWaitEvent(s, g->events[p->waits[op->wait_first + i]], 0));
        if (run_op_body(g, op, S)) return -1;
        if (op->event >= 0) CUDA(cudaEventRecord(g->events[op->event], s));
        return 0;
    }
    return run_op_body(g, op, S);
}

static int run_op_body(cp_gpu *g, const cp_op *op, cudaStream_t S)
{
    const cp_plan *p = g->plan;
    int u = op->unit;
    unit_state *s = &g->units[u];
    const cp_unit *U = &p->units[u];
    size_t W = (size_t)p->shard_size;
    switch (op->kind) {
    case CP_OP_COPY_IN:
        /* The all-gather buffer may still feed this unit's earlier copy-out. */
        if (s->copy_out_this_step) CUDA(cudaStreamWaitEvent(g->copy_in, s->ev[EV_COPY_OUT], 0));
        if (kernel(g, CP_KERNEL_COPY_IN, u, s->buf[BUF_SHARDED], s->buf[BUF_AG], g->copy_in)) return -1;
        CUDA(cudaEventRecord(s->ev[EV_COPY_IN], g->copy_in));
        return 0;
    case CP_OP_ALL_GATHER:
        if (op->family < 0) { /* one-rank shard group: the slot is the whole buffer */
            CUDA(cudaEventRecord(s->ev[EV_AG], g->copy_in));
            return 0;
        }
        CUDA(cudaStreamWaitEvent(g->all_gather, s->ev[EV_COPY_IN], 0));
        NCCL(ncclAllGather((char *)s->buf[BUF_AG] + (size_t)g->shard_rank * (size_t)U->total * cp_dtype_size(U->ag_dtype),
                           s->buf[BUF_AG], (size_t)op->count, nccl_type(op->dtype), g->comms[op->family],
                           g->all_gather));
        CUDA(cudaEventRecord(s->ev[EV_AG], g->all_gather));
        return 0;
    case CP_OP_COPY_OUT:
        CUDA(cudaStreamWaitEvent(S, s->ev[EV_AG], 0));
        if (kernel(g, CP_KERNEL_COPY_OUT, u, s->buf[BUF_AG], s->buf[BUF_UNSHARDED], S)) return -1;
        CUDA(cudaEventRecord(s->ev[EV_COPY_OUT], S));
        s->copy_out_this_step = 1;
        return 0;
    case CP_OP_FORWARD:
    case CP_OP_BACKWARD:
        return g->compute ? g->compute(g->compute_user, g, op, S) : 0;
    case CP_OP_RESHARD:
        /* Buffers persist (no allocator churn, graph-capturable); the
         * schedule guarantees no reader until the next copy-out. */
        return 0;
    case CP_OP_PACK:
        if (kernel(g, CP_KERNEL_PACK, u, s->buf[BUF_GRADS], s->buf[BUF_RS_IN], S)) return -1;
        /* FSDP2 frees the unsharded grads here: the next backward writes
         * them afresh (first micro-step) rather than accumulating, so no
         * memset is needed. */
        CUDA(cudaEventRecord(s->ev[EV_PACK], S));
        return 0;
    case CP_OP_REDUCE_SCATTER:
        CUDA(cudaStreamWaitEvent(g->reduce_scatter, s->ev[EV_PACK], 0));
        if (op->family < 0)
            CUDA(cudaMemcpyAsync(s->buf[BUF_RS_OUT], s->buf[BUF_RS_IN], cp_gpu_buffer_bytes(g, u, BUF_RS_OUT),
                                 cudaMemcpyDeviceToDevice, g->reduce_scatter));
        else
            NCCL(ncclReduceScatter(s->buf[BUF_RS_IN], s->buf[BUF_RS_OUT], (size_t)op->count, nccl_type(op->dtype),
                                   nccl_op(op->reduce_op), g->comms[op->family], g->reduce_scatter));
        CUDA(cudaEventRecord(s->ev[EV_RS], g->reduce_scatter));
        (void)W;
        return 0;
    case CP_OP_ALL_REDUCE:
        CUDA(cudaStreamWaitEvent(g->all_reduce, s->ev[EV_RS], 0));
        NCCL(ncclAllReduce(s->buf[BUF_RS_OUT], s->buf[BUF_RS_OUT], (size_t)op->count, nccl_type(op->dtype),
                           nccl_op(op->reduce_op), g->comms[op->family], g->all_reduce));
        /* Nothing waits on the all-reduce alone: view-out follows on its stream. */
        return 0;
    case CP_OP_VIEW_OUT: {
        /* On the post-reduce stream: all-reduce's with HSDP, else reduce-scatter's. */
        cudaStream_t post = p->replicate_family >= 0 ? g->all_reduce : g->reduce_scatter;
        /* The step's end joins this stream into the caller's (finish). */
        return kernel(g, CP_KERNEL_VIEW_OUT, u, s->buf[BUF_RS_OUT], s->buf[BUF_SHARDED_GRADS], post);
    }
    default:
        return fail(g, "unknown op kind %d", (int)op->kind);
    }
}

static int begin(cp_gpu *g, cudaStream_t S)
{
    CUDA(cudaEventRecord(g->start, S));
    cudaStream_t side[4] = { g->copy_in, g->all_gather, g->reduce_scatter, g->all_reduce };
    for (int i = 0; i < 4; i++) CUDA(cudaStreamWaitEvent(side[i], g->start, 0));
    return 0;
}

/* Join: the caller's stream waits for all side-stream work issued since
 * begin (which includes every reduction), so the next step, the optimizer
 * and a graph capture's end see it finished. */
static int finish(cp_gpu *g, cudaStream_t S)
{
    cudaStream_t side[4] = { g->copy_in, g->all_gather, g->reduce_scatter, g->all_reduce };
    for (int i = 0; i < 4; i++) {
        CUDA(cudaEventRecord(g->side_done[i], side[i]));
        CUDA(cudaStreamWaitEvent(S, g->side_done[i], 0));
    }
    for (int u = 0; u < g->plan->nunits; u++) {
        g->units[u].copy_out_this_step = 0;
    }
    return 0;
}

/* Library calls run the unit's next instance of an op group (the plan may
 * unshard a unit twice per step, each instance with its own arena waits):
 * from the unit's cursor for that call to the group's last kind, wrapping
 * to the step's start after the last instance. */
static int run_unit_ops(cp_gpu *g, int unit, int call, const cp_op_kind *kinds, int nkinds, cudaStream_t S)
{
    const cp_plan *p = g->plan;
    if (unit < 0 || unit >= p->nunits) return fail(g, "unit %d is outside the plan's %d units", unit, p->nunits);
    unit_state *us = &g->units[unit];
    int first = -1;
    for (int pass = 0; pass < 2 && first < 0; pass++)
        for (int i = pass ? 0 : us->cursor[call]; i < p->nops && first < 0; i++)
            if (p->ops[i].unit == unit && p->ops[i].kind == kinds[0]) first = i;
    if (first < 0) return 0; /* the plan has no such op for this unit (e.g. nothing to reshard) */
    if (begin(g, S)) return -1;
    int i = first;
    for (; i < p->nops; i++) {
        const cp_op *op = &p->ops[i];
        if (op->unit != unit) continue;
        for (int k = 0; k < nkinds; k++)
            if (op->kind == kinds[k]) {
                if (run_op(g, op, S)) return -1;
                break;
            }
        if (op->kind == kinds[nkinds - 1]) break;
    }
    us->cursor[call] = i + 1 < p->nops ? i + 1 : 0;
    return finish(g, S);
}

int cp_gpu_unshard(cp_gpu *g, int unit, void *stream)
{
    static const cp_op_kind kinds[] = { CP_OP_COPY_IN, CP_OP_ALL_GATHER, CP_OP_COPY_OUT };
    const cp_plan *p = g->plan;
    if (unit < 0 || unit >= p->nunits) return fail(g, "unit %d is outside the plan's %d units", unit, p->nunits);
    /* The arena holds units in the plan's order only: refuse an unshard
     * whose bytes another still-unsharded unit is using. */
    int v = cp_unshard_conflict(p, unit, g->live);
    if (v >= 0)
        return fail(g, "cp_gpu_unshard(%s) would overwrite unit %s, still unsharded: the plan's arena reuses "
                    "those bytes; call cp_gpu_reshard(%s) first, in the order of plans/%s/SCHEDULE.md",
                    p->units[unit].name, p->units[v].name, p->units[v].name, p->name);
    if (run_unit_ops(g, unit, 0, kinds, 3, (cudaStream_t)stream)) return -1;
    g->live[unit] = 1;
    return 0;
}

/* Frees nothing (the arena is fixed) but marks, on the stream, the point
 * after which other units may reuse this unit's unsharded bytes. */
int cp_gpu_reshard(cp_gpu *g, int unit, void *stream)
{
    static const cp_op_kind kinds[] = { CP_OP_RESHARD };
    if (run_unit_ops(g, unit, 1, kinds, 1, (cudaStream_t)stream)) return -1;
    g->live[unit] = 0;
    return 0;
}

int cp_gpu_reduce_grads(cp_gpu *g, int unit, void *stream)
{
    int hsdp = g->plan->replicate_family >= 0;
    static const cp_op_kind with_ar[] = { CP_OP_PACK, CP_OP_REDUCE_SCATTER, CP_OP_ALL_REDUCE, CP_OP_VIEW_OUT };
    static const cp_op_kind without_ar[] = { CP_OP_PACK, CP_OP_REDUCE_SCATTER, CP_OP_VIEW_OUT };
    return hsdp ? run_unit_ops(g, unit, 2, with_ar, 4, (cudaStream_t)stream)
                : run_unit_ops(g, unit, 2, without_ar, 3, (cudaStream_t)stream);
}

void cp_gpu_set_compute(cp_gpu *g, cp_gpu_compute_fn fn, void *user)
{
    g->compute = fn;
    g->compute_user = user;
}

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return 1e6 * (double)ts.tv_sec + 1e-3 * (double)ts.tv_nsec;
}

/* The step; with host_us, each op kind's host issue time is added to it
 * (the clock is read only then, off the normal path). */
int cp_gpu_step_profiled(cp_gpu *g, void *stream, double host_us[CP_OP_KIND_COUNT + 1])
{
    cudaStream_t S = (cudaStream_t)stream;
    double t = host_us ? now_us() : 0.0;
    if (begin(g, S)) return -1;
    if (host_us) host_us[CP_OP_KIND_COUNT] += now_us() - t;
    for (int i = 0; i < g->plan->nops; i++) {
        const cp_op *op = &g->plan->ops[i];
        if (host_us) t = now_us();
        if (run_op(g, op, S)) return -1;
        if (host_us) host_us[op->kind] += now_us() - t;
    }
    if (host_us) t = now_us();
    int rc = finish(g, S);
    if (host_us) host_us[CP_OP_KIND_COUNT] += now_us() - t;
    return rc;
}

int cp_gpu_step(cp_gpu *g, void *stream) { return cp_gpu_step_profiled(g, stream, NULL); }

int cp_gpu_graph_capture(cp_gpu *g, void *stream)
{
    cudaStream_t S = (cudaStream_t)stream;
    cudaGraph_t graph;
    if (g->graph) { cudaGraphExecDestroy(g->graph); g->graph = NULL; }
    CUDA(cudaStreamBeginCapture(S, cudaStreamCaptureModeThreadLocal));
    int rc = cp_gpu_step(g, stream);
    cudaError_t e = cudaStreamEndCapture(S, &graph);
    if (rc) return -1;
    if (e != cudaSuccess) return fail(g, "cudaStreamEndCapture failed: %s", cudaGetErrorString(e));
    e = cudaGraphInstantiate(&g->graph, graph, 0);
    cudaGraphDestroy(graph);
    if (e != cudaSuccess) return fail(g, "cudaGraphInstantiate failed: %s", cudaGetErrorString(e));
    /* Upload now so the first replay does not pay for it. */
    CUDA(cudaGraphUpload(g->graph, S));
    return 0;
}

int cp_gpu_graph_launch(cp_gpu *g, void *stream)
{
    if (!g->graph) return fail(g, "no captured graph: call cp_gpu_graph_capture first");
    CUDA(cudaGraphLaunch(g->graph, (cudaStream_t)stream));
    return 0;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int cp_gpu_synchronize(cp_gpu *g, void *stream, double timeout_s)
{
    double deadline = now_s() + timeout_s;
    for (;;) {
        cudaError_t e = cudaStreamQuery((cudaStream_t)stream);
        if (e == cudaSuccess) return 0;
        if (e != cudaErrorNotReady) return fail(g, "step failed on the GPU: %s", cudaGetErrorString(e));
        ncclResult_t async;
        ncclComm_t comms[1 + 64];
        int n = 0;
        comms[n++] = g->world;
        for (int f = 0; f < g->plan->nfamilies && n < 65; f++) if (g->comms[f]) comms[n++] = g->comms[f];
        for (int i = 0; i < n; i++) {
            if (ncclCommGetAsyncError(comms[i], &async) != ncclSuccess || async != ncclSuccess)
                return fail(g, "NCCL reported an asynchronous error: %s (a peer may have died; NCCL_DEBUG=WARN)",
                            ncclGetErrorString(async));
        }
        if (now_s() > deadline) {
            for (int i = 0; i < n; i++) ncclCommAbort(comms[i]);
            g->world = NULL;
            for (int f = 0; f < g->plan->nfamilies; f++) g->comms[f] = NULL;
            return fail(g, "step did not finish within %.0f s: a peer is missing or stuck; communicators aborted",
                        timeout_s);
        }
        struct timespec ts = { 0, 200000 };
        nanosleep(&ts, NULL);
    }
}

int cp_gpu_download(cp_gpu *g, int u, int kind, void *host)
{
    CUDA(cudaDeviceSynchronize());
    CUDA(cudaMemcpy(host, g->units[u].buf[kind], cp_gpu_buffer_bytes(g, u, kind), cudaMemcpyDeviceToHost));
    return 0;
}

int cp_gpu_upload(cp_gpu *g, int u, int kind, const void *host)
{
    CUDA(cudaMemcpy(g->units[u].buf[kind], host, cp_gpu_buffer_bytes(g, u, kind), cudaMemcpyHostToDevice));
    return 0;
}

/* ---- nccl-tests-style table: every distinct collective of the step and
 * every copy kernel of the largest unit, timed alone on the caller's stream. */

static double bus_factor(cp_op_kind k, int n)
{
    if (n <= 1) return 0.0;
    return k == CP_OP_ALL_REDUCE ? 2.0 * (n - 1) / n : (double)(n - 1) / n;
}

int cp_gpu_bench_ops(cp_gpu *g, void *stream, int warmup, int iters, FILE *out)
{
    const cp_plan *p = g->plan;
    cudaStream_t S = (cudaStream_t)stream;
    cudaEvent_t t0, t1;
    CUDA(cudaEventCreate(&t0));
    CUDA(cudaEventCreate(&t1));
    fprintf(out, "# %-15s %-12s %6s %14s %12s %10s %10s %10s\n", "op", "group", "type", "size (B)", "count", "time (us)",
            "algbw GB/s", "busbw GB/s");
    if (g->env.standin) fprintf(out, "  (collectives not timed: stand-in communicators have one rank)\n");
    for (int i = 0; i < p->nops && !g->env.standin; i++) {
        const cp_op *op = &p->ops[i];
        if (op->family < 0 || (op->kind != CP_OP_ALL_GATHER && op->kind != CP_OP_REDUCE_SCATTER &&
                               op->kind != CP_OP_ALL_REDUCE))
            continue;
        int dup = 0; /* one row per (kind, group, count, dtype) */
        for (int j = 0; j < i && !dup; j++) {
            const cp_op *o = &p->ops[j];
            dup = o->kind == op->kind && o->family == op->family && o->count == op->count && o->dtype == op->dtype;
        }
        if (dup) continue;
        unit_state *s = &g->units[op->unit];
        int n = p->families[op->family].size;
        size_t es = cp_dtype_size(op->dtype);
        size_t size = op->kind == CP_OP_ALL_REDUCE ? (size_t)op->count * es : (size_t)op->count * (size_t)n * es;
        float ms = 0.0f;
        for (int it = -warmup; it < iters; it++) {
            if (it == 0) CUDA(cudaEventRecord(t0, S));
            if (op->kind == CP_OP_ALL_GATHER)
                NCCL(ncclAllGather((char *)s->buf[BUF_AG] + (size_t)g->shard_rank * (size_t)op->count * es, s->buf[BUF_AG],
                                   (size_t)op->count, nccl_type(op->dtype), g->comms[op->family], S));
            else if (op->kind == CP_OP_REDUCE_SCATTER)
                NCCL(ncclReduceScatter(s->buf[BUF_RS_IN], s->buf[BUF_RS_OUT], (size_t)op->count, nccl_type(op->dtype),
                                       nccl_op(op->reduce_op), g->comms[op->family], S));
            else
                NCCL(ncclAllReduce(s->buf[BUF_RS_OUT], s->buf[BUF_RS_OUT], (size_t)op->count, nccl_type(op->dtype),
                                   nccl_op(op->reduce_op), g->comms[op->family], S));
        }
        CUDA(cudaEventRecord(t1, S));
        CUDA(cudaEventSynchronize(t1));
        CUDA(cudaEventElapsedTime(&ms, t0, t1));
        double us = 1000.0 * ms / (iters > 0 ? iters : 1);
        double algbw = (double)size / (us * 1e3);
        fprintf(out, "  %-15s %-12s %6s %14zu %12ld %10.1f %10.2f %10.2f\n", cp_op_kind_name(op->kind),
                p->families[op->family].name, cp_dtype_name(op->dtype), size, (long)op->count, us, algbw,
                algbw * bus_factor(op->kind, n));
    }
    /* Copy kernels of the largest unit: bytes read + written per launch. */
    int big = 0;
    for (int u = 1; u < p->nunits; u++) if (p->units[u].total > p->units[big].total) big = u;
    unit_state *s = &g->units[big];
    static const char *const names[] = { "copy_in", "copy_out", "pack", "view_out" };
    const int in_buf[] = { BUF_SHARDED, BUF_AG, BUF_GRADS, BUF_RS_OUT };
    const int out_buf[] = { BUF_AG, BUF_UNSHARDED, BUF_RS_IN, BUF_SHARDED_GRADS };
    for (int k = 0; k < 4; k++) {
        size_t bytes = cp_gpu_buffer_bytes(g, big, in_buf[k]) + cp_gpu_buffer_bytes(g, big, out_buf[k]);
        if (k == 0) bytes = cp_gpu_buffer_bytes(g, big, BUF_SHARDED) + cp_gpu_buffer_bytes(g, big, BUF_AG) / (size_t)p->shard_size;
        float ms = 0.0f;
        for (int it = -warmup; it < iters; it++) {
            if (it == 0) CUDA(cudaEventRecord(t0, S));
            if (kernel(g, k, big, s->buf[in_buf[k]], s->buf[out_buf[k]], S)) return -1;
        }
        CUDA(cudaEventRecord(t1, S));
        CUDA(cudaEventSynchronize(t1));
        CUDA(cudaEventElapsedTime(&ms, t0, t1));
        double us = 1000.0 * ms / (iters > 0 ? iters : 1);
        fprintf(out, "  %-15s %-12s %6s %14zu %12s %10.1f %10.2f %10s\n", names[k], p->units[big].name, "-", bytes, "-",
                us, (double)bytes / (us * 1e3), "-");
    }
    cudaEventDestroy(t0);
    cudaEventDestroy(t1);
    return 0;
}
