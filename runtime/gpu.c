/* The NCCL backend: one rank of a plan on its GPU. It implements the
 * executor's backend interface (memory, copy kernels, collectives, event
 * waits and records on the streams the generator chose) and the library
 * API around the one op walker (runtime/executor.c). Nothing here decides
 * a stream, an order or a wait: the tables do. */
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
#include "rendezvous.h"

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

/* Symmetric windows (fsdp.symm_mem): ncclMemAlloc and ncclCommWindowRegister, NCCL 2.27 and newer. */
#define CP_NCCL_WINDOWS 1
#if defined(NCCL_VERSION_CODE) && defined(NCCL_VERSION)
#if NCCL_VERSION_CODE < NCCL_VERSION(2, 27, 0)
#undef CP_NCCL_WINDOWS
#define CP_NCCL_WINDOWS 0
#endif
#endif
#if CP_NCCL_WINDOWS
typedef ncclWindow_t cp_nccl_window;
#else
typedef void *cp_nccl_window;
#endif

/* Library calls run one unit's next instance of an op group. */
enum { CALL_UNSHARD, CALL_RESHARD, CALL_REDUCE, CALL_EXCHANGE, CALL_UNSHARD_WAIT, CALLS };

struct cp_gpu {
    const cp_plan *plan;
    const cp_gpu_kernels *k;
    cp_launch_env env;
    int shard_rank, device;
    ncclComm_t world;
    ncclComm_t *comms;                       /* per family; NULL where the plan issues nothing */
    cudaStream_t streams[CP_STREAM_COUNT];   /* [CP_STREAM_COMPUTE]: the caller's, set by each call */
    cudaEvent_t fork_event;                  /* side streams start after the caller's stream */
    cudaEvent_t call_event;                  /* a library call's op hands its stream to the next (run_call_op) */
    cudaEvent_t side_done[CP_STREAM_COUNT];  /* joins each side stream back into the caller's */
    cudaEvent_t *events;                     /* plan->nevents slots of the tables' waits */
    cp_backend backend;
    cp_executor ex;
    int have_ex;
    unsigned *live;       /* per unit, library calls: bit k, arena buffer k holds data across calls (arena.c) */
    int (*cursor)[CALLS]; /* per unit and call: next op to scan from */
    int *last_exchange;   /* per unit: the A2A op its last cp_gpu_exchange_tokens ran, or -1 */
    cp_order *order;      /* the split calls' order check (arena.c) */
    cudaEvent_t *reduce_done; /* per unit: recorded after its last cp_gpu_reduce_issue's ops */
    unsigned char *reduce_pending; /* per unit: issued, not waited */
    cp_gpu_compute_fn compute;
    void *compute_user;
    double *profile;      /* cp_gpu_step_profiled's per-kind host time, or NULL */
    cudaEvent_t *trace;   /* cp_gpu_set_trace: a start and an end event per op, or NULL */
    cudaGraphExec_t graph;
    /* fsdp.symm_mem: the arena from ncclMemAlloc, its window registered on each family's communicator */
    void *symm_base;
    cp_nccl_window *symm_wins; /* per family; NULL where not registered */
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

/* CP_U8: the raw-byte all-gather of a unit of mixed all-gather dtypes (ncclUint8, as FSDP2's torch.uint8). */
static ncclDataType_t nccl_type(cp_dtype t)
{
    return t == CP_FP32 ? ncclFloat32 : t == CP_BF16 ? ncclBfloat16 : t == CP_U8 ? ncclUint8 : ncclFloat16;
}
static ncclRedOp_t nccl_op(cp_reduce_op op) { return op == CP_AVG ? ncclAvg : op == CP_MAX ? ncclMax : ncclSum; }

/* Whether any rank issues work on family f: any class's ops name it, or
 * it is the pipeline's (sends and receives use plan->pp_family). Every
 * rank decides alike from the whole plan: the splits are collectives over
 * the world communicator. */
static int uses_family(const cp_plan *p, int f)
{
    if (p->pp_size > 1 && f == p->pp_family) return 1;
    int nclasses = p->classes && p->nclasses > 0 ? p->nclasses : 0;
    for (int c = -1; c < nclasses; c++) {
        const cp_op *ops = c < 0 ? p->ops : p->classes[c].ops;
        int nops = c < 0 ? p->nops : p->classes[c].nops > 0 ? p->classes[c].nops : p->nops;
        for (int i = 0; i < nops; i++)
            if (ops[i].family == f) return 1;
    }
    return 0;
}

static int init_comms(cp_gpu *g)
{
    const cp_plan *p = g->plan;
    /* Stand-in: one-rank communicators everywhere, bootstrapped locally. */
    int nranks = g->env.standin ? 1 : g->env.world_size, me = g->env.standin ? 0 : g->env.rank;
    /* NCCL_COMM_ID only where NCCL bootstraps itself (the user's value, or
     * MASTER_ADDR:MASTER_PORT with nothing listening there). Otherwise rank 0
     * makes the id on a port of NCCL's choosing and rendezvous.c carries it
     * (shared file, torchrun's store): nothing binds the launcher's port.
     * NCCL reads the variable from the environment, which this library only
     * checks: setenv here would race with the getenv of the caller's other
     * threads (PyTorch's); the binary's main set it before any thread. */
    char cerr[400];
    if (cp_comm_id_action(getenv("NCCL_COMM_ID"), cp_launch_comm_id(&g->env), 0, cerr, sizeof cerr) != CP_COMM_ID_KEEP)
        return fail(g, "%s (or call cp_launch_export_comm_id first thing in main)", cerr);
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    if (me == 0) NCCL(ncclGetUniqueId(&id));
    if (!g->env.standin) {
        /* A second under the watchdog's limit, so a timeout names the channel. */
        double t = g->env.init_timeout_s, limit = t > 2 ? t - 1 : t / 2;
        char rerr[sizeof g->err];
        /* Through torchrun's store the ranks also compare plans here, before NCCL. */
        int how = cp_rendezvous_share_plan(&g->env, p->name, p->fingerprint, &id, sizeof id, limit, NULL, rerr,
                                           sizeof rerr);
        if (how == CP_RDZV_ERROR) {
            snprintf(g->err, sizeof g->err, "%s", rerr); /* already names the rank */
            return -1;
        }
        /* With NCCL_COMM_ID set every rank derives the same id itself. */
        if (how == CP_RDZV_NCCL_OWN && me != 0) NCCL(ncclGetUniqueId(&id));
    }
    ncclResult_t init = ncclCommInitRank(&g->world, nranks, id, me);
    if (!g->env.standin) {
        /* COMMPLAN_ID_FILE: NCCL's root answered no rank before every rank
         * had connected with this id, so every rank has read the file;
         * rank 0 removes it (failed init too: the id is dead either way),
         * so a second run in the same job never reads this run's id. */
        char rerr[sizeof g->err];
        if (cp_rendezvous_release(&g->env, p->fingerprint, &id, sizeof id, rerr, sizeof rerr) != 0 &&
            init == ncclSuccess) {
            snprintf(g->err, sizeof g->err, "%s", rerr); /* already names the rank */
            return -1;
        }
    }
    NCCL(init);
    /* Every rank must run the same plan: compare fingerprints first. */
    char *mine, *all;
    CUDA(cudaMalloc((void **)&mine, 32));
    CUDA(cudaMalloc((void **)&all, 32 * (size_t)nranks));
    char fp[32] = { 0 };
    snprintf(fp, sizeof fp, "%s", p->fingerprint);
    /* On the stream the all-gather runs on: a plain cudaMemcpy from pageable
     * memory may return before its bytes land, and the legacy stream does
     * not order the non-blocking COPY_IN stream. */
    CUDA(cudaMemcpyAsync(mine, fp, 32, cudaMemcpyHostToDevice, g->streams[CP_STREAM_COPY_IN]));
    NCCL(ncclAllGather(mine, all, 32, ncclChar, g->world, g->streams[CP_STREAM_COPY_IN]));
    CUDA(cudaStreamSynchronize(g->streams[CP_STREAM_COPY_IN]));
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


/* ---- the backend interface over CUDA and NCCL ---- */

static void *gpu_alloc(cp_backend *b, size_t bytes)
{
    cp_gpu *g = b->ctx;
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes ? bytes : 16);
    if (e != cudaSuccess) {
        fail(g, "cudaMalloc of %zu bytes failed: %s (plan %s needs more memory than this GPU has; SCHEDULE.md's "
             "memory section says how much; use more ranks)", bytes, cudaGetErrorString(e), g->plan->name);
        return NULL;
    }
    if ((e = cudaMemset(p, 0, bytes ? bytes : 16)) != cudaSuccess) {
        fail(g, "cudaMemset failed: %s", cudaGetErrorString(e));
        cudaFree(p);
        return NULL;
    }
    return p;
}

/* The symmetric window's registrations, released while their
 * communicators live (cp_gpu_destroy: before it destroys them). */
static void symm_deregister(cp_gpu *g)
{
#if CP_NCCL_WINDOWS
    for (int f = 0; g->symm_wins && f < g->plan->nfamilies; f++)
        if (g->symm_wins[f] && g->comms && g->comms[f]) ncclCommWindowDeregister(g->comms[f], g->symm_wins[f]);
#endif
    free(g->symm_wins);
    g->symm_wins = NULL;
}

/* fsdp.symm_mem (gen/memplan.lua, gen/symm.lua): the arena from NCCL's
 * allocator, its first window_bytes registered as one symmetric window
 * (NCCL_WIN_COLL_SYMMETRIC) on the communicator of every family the rank's
 * all-gathers and reduce-scatters run on, as FSDP2's SymmMemAllGather /
 * SymmMemReduceScatter rendezvous their buffers on the collective's group
 * (torch 2.15 _fsdp_collectives.py:89-104, 141-231). Registration is
 * collective: every member registers the same size, and each symmetric
 * collective finds its buffers at the same offset on every member (the
 * generator's proof; tests/emu/emu_nccl.c checks both at run time). Every
 * rank walks the families in one order, so the collective calls match. */
static void *gpu_alloc_symm(cp_backend *b, size_t bytes, size_t window_bytes)
{
    cp_gpu *g = b->ctx;
#if !CP_NCCL_WINDOWS
    (void)bytes;
    (void)window_bytes;
    fail(g, "plan %s sets fsdp.symm_mem, which needs NCCL 2.27 or newer (ncclCommWindowRegister); this build has "
         "NCCL %d.%d: build against a newer NCCL or regenerate without fsdp.symm_mem", g->plan->name, NCCL_MAJOR,
         NCCL_MINOR);
    return NULL;
#else
    const cp_plan *p = g->plan;
    cp_plan view;
    cp_plan_view(p, g->env.rank, &view); /* the rank's own ops */
    void *base = NULL;
    ncclResult_t r = ncclMemAlloc(&base, bytes);
    if (r != ncclSuccess) {
        fail(g, "ncclMemAlloc of the %zu-byte arena (its first %zu bytes the symmetric window, fsdp.symm_mem) failed: "
             "%s (%s)", bytes, window_bytes, ncclGetErrorString(r), ncclGetLastError(NULL));
        return NULL;
    }
    cudaError_t e = cudaMemset(base, 0, bytes);
    if (e != cudaSuccess) {
        fail(g, "cudaMemset failed: %s", cudaGetErrorString(e));
        ncclMemFree(base);
        return NULL;
    }
    if (!(g->symm_wins = calloc((size_t)(p->nfamilies > 0 ? p->nfamilies : 1), sizeof *g->symm_wins))) {
        fail(g, "out of host memory");
        ncclMemFree(base);
        return NULL;
    }
    g->symm_base = base;
    for (int f = 0; f < p->nfamilies; f++) {
        if (!g->comms || !g->comms[f]) continue;
        int uses = 0;
        for (int i = 0; i < view.nops && !uses; i++)
            uses = view.ops[i].family == f &&
                   (view.ops[i].kind == CP_OP_ALL_GATHER || view.ops[i].kind == CP_OP_REDUCE_SCATTER);
        if (!uses) continue;
        r = ncclCommWindowRegister(g->comms[f], base, window_bytes, &g->symm_wins[f], NCCL_WIN_COLL_SYMMETRIC);
        if (r != ncclSuccess) {
            fail(g, "ncclCommWindowRegister of the %zu-byte symmetric window on group %s failed: %s (%s; every rank "
                 "of the group registers the same size: deploy the same build everywhere)", window_bytes,
                 p->families[f].name, ncclGetErrorString(r), ncclGetLastError(NULL));
            /* the executor gets no arena, so nothing would free it: the
             * windows registered so far go, then the allocation */
            symm_deregister(g);
            g->symm_base = NULL;
            ncclMemFree(base);
            return NULL;
        }
    }
    return base;
#endif
}

static void gpu_free(cp_backend *b, void *p)
{
    cp_gpu *g = b->ctx;
#if CP_NCCL_WINDOWS
    if (p && p == g->symm_base) {
        symm_deregister(g);
        g->symm_base = NULL;
        ncclMemFree(p);
        return;
    }
#endif
    (void)g;
    cudaFree(p);
}

static int gpu_copy(cp_backend *b, int kernel, int unit, int part_first, int part_count, cp_stream s, const void *in,
                    void *out)
{
    cp_gpu *g = b->ctx;
    /* The unit's own shard group: an experts unit's slot is its efsdp key,
     * not the plan's shard rank (cp_unit_shard_rank; the kernels' tables
     * hold its group size). A part (pack, view-out of a partial reduction):
     * its parameters only. */
    int e = g->k->launch(g->plan->view_class, kernel, unit, part_first, part_count,
                         cp_unit_shard_rank(g->plan, unit, g->env.rank), in, out, g->streams[s]);
    if (e != 0) {
        static const char *const names[] = { "copy-in", "copy-out", "pack", "view-out", "view-out (adding)",
                                             "flat copy", "flat add" };
        return fail(g, "%s kernel of unit %s failed: %s", kernel >= 0 && kernel < 7 ? names[kernel] : "?",
                    g->plan->units[unit].name, cudaGetErrorString((cudaError_t)e));
    }
    return 0;
}

static int gpu_copy_bytes(cp_backend *b, cp_stream s, const void *in, void *out, size_t bytes)
{
    cp_gpu *g = b->ctx;
    CUDA(cudaMemcpyAsync(out, in, bytes, cudaMemcpyDeviceToDevice, g->streams[s]));
    return 0;
}

static int gpu_all_gather(cp_backend *b, const cp_op *op, cp_stream s, const void *in, void *out)
{
    cp_gpu *g = b->ctx;
    NCCL(ncclAllGather(in, out, (size_t)op->count, nccl_type(op->dtype), g->comms[op->family], g->streams[s]));
    return 0;
}

/* The op's NCCL reduction; CP_PREMUL_SUM makes one (*made set): PreMulSum
 * with the host scalar 1 / premul_factor in the op's dtype, as torch 2.15's
 * ProcessGroupNCCL makes ReduceOp.PREMUL_SUM(1 / factor) for FSDP2's
 * set_gradient_divide_factor; destroyed after the call is enqueued (NCCL
 * allows it). */
static int reduce_op_for(cp_gpu *g, const cp_op *op, ncclRedOp_t *red, int *made)
{
    *made = 0;
    if (op->reduce_op != CP_PREMUL_SUM) { *red = nccl_op(op->reduce_op); return 0; }
    float f = (float)(1.0 / op->premul_factor);
    uint16_t h = op->dtype == CP_BF16 ? cp_float_to_bf16(f) : cp_float_to_fp16(f);
    void *scalar = op->dtype == CP_FP32 ? (void *)&f : (void *)&h;
    NCCL(ncclRedOpCreatePreMulSum(red, scalar, nccl_type(op->dtype), ncclScalarHostImmediate, g->comms[op->family]));
    *made = 1;
    return 0;
}

static int gpu_reduce_scatter(cp_backend *b, const cp_op *op, cp_stream s, const void *in, void *out)
{
    cp_gpu *g = b->ctx;
    ncclRedOp_t red;
    int made;
    if (reduce_op_for(g, op, &red, &made)) return -1;
    NCCL(ncclReduceScatter(in, out, (size_t)op->count, nccl_type(op->dtype), red, g->comms[op->family],
                           g->streams[s]));
    if (made) NCCL(ncclRedOpDestroy(red, g->comms[op->family]));
    return 0;
}

static int gpu_all_reduce(cp_backend *b, const cp_op *op, cp_stream s, const void *in, void *out)
{
    cp_gpu *g = b->ctx;
    ncclRedOp_t red;
    int made;
    if (reduce_op_for(g, op, &red, &made)) return -1;
    NCCL(ncclAllReduce(in, out, (size_t)op->count, nccl_type(op->dtype), red, g->comms[op->family], g->streams[s]));
    if (made) NCCL(ncclRedOpDestroy(red, g->comms[op->family]));
    return 0;
}

/* Point-to-point over the pp family's communicator: its ranks are the pp
 * coordinates (the family has the pp axis alone, cp_group_of's key). */
static int pp_comm(cp_gpu *g, const cp_op *op, int peer_rank, ncclComm_t *comm, int *peer)
{
    const cp_plan *p = g->plan;
    int f = p->pp_family;
    if (f < 0 || f >= p->nfamilies || !g->comms || !g->comms[f])
        return fail(g, "%s of unit %s (tag %d) without the plan's pp communicator (pp_family %d): regenerate the plan",
                    cp_op_kind_name(op->kind), p->units[op->unit].name, op->tag, f);
    *comm = g->comms[f];
    *peer = cp_pp_rank(p, peer_rank);
    return 0;
}

static int gpu_send(cp_backend *b, const cp_op *op, cp_stream s, const void *buf, int peer_rank)
{
    cp_gpu *g = b->ctx;
    ncclComm_t comm;
    int peer;
    /* A stand-in's communicators have one rank: no peer to send to (its
     * timing leaves the pipeline's messages out). */
    if (g->env.standin) return 0;
    if (pp_comm(g, op, peer_rank, &comm, &peer)) return -1;
    NCCL(ncclSend(buf, (size_t)op->count, nccl_type(op->dtype), peer, comm, g->streams[s]));
    return 0;
}

static int gpu_recv(cp_backend *b, const cp_op *op, cp_stream s, void *buf, int peer_rank)
{
    cp_gpu *g = b->ctx;
    ncclComm_t comm;
    int peer;
    if (g->env.standin) return 0;
    if (pp_comm(g, op, peer_rank, &comm, &peer)) return -1;
    NCCL(ncclRecv(buf, (size_t)op->count, nccl_type(op->dtype), peer, comm, g->streams[s]));
    return 0;
}

/* A batch: its sends and receives are posted together at the group's end
 * (torch's batch_isend_irecv), so their order inside it cannot deadlock. */
static int gpu_group_start(cp_backend *b)
{
    cp_gpu *g = b->ctx;
    NCCL(ncclGroupStart());
    return 0;
}

static int gpu_group_end(cp_backend *b)
{
    cp_gpu *g = b->ctx;
    NCCL(ncclGroupEnd());
    return 0;
}

/* Expert parallelism's all-to-alls over the ep family's communicator (its
 * ranks are the members' keys): a send and a receive per member inside one
 * group, as torch's all_to_all_single on NCCL posts them (a member with no
 * rows either way gets neither). Every call inside the group is checked,
 * and the group is closed whatever failed, so no group stays open. */
static int a2a_group(cp_gpu *g, const cp_op *op, cp_stream s, const char *in, char *out, size_t send_unit,
                     size_t recv_unit, size_t elems_per_row, ncclDataType_t t, const int64_t *send_rows,
                     const int64_t *recv_rows, size_t fixed)
{
    const cp_plan *p = g->plan;
    ncclComm_t comm = g->comms && op->family >= 0 && op->family < p->nfamilies ? g->comms[op->family] : NULL;
    int n = p->families[op->family].size;
    if (!comm)
        return fail(g, "%s of unit %s without its ep communicator (family %d): regenerate the plan",
                    cp_op_kind_name(op->kind), p->units[op->unit].name, op->family);
    ncclResult_t first = ncclSuccess;
    const char *what = NULL;
    size_t sent = 0, got = 0;
    NCCL(ncclGroupStart());
    for (int m = 0; m < n && first == ncclSuccess; m++) {
        size_t to = send_rows ? (size_t)send_rows[m] : fixed, from = recv_rows ? (size_t)recv_rows[m] : fixed;
        ncclResult_t r = ncclSuccess;
        if (to && (r = ncclSend(in + sent * send_unit, to * elems_per_row, t, m, comm, g->streams[s])) != ncclSuccess)
            what = "ncclSend";
        if (r == ncclSuccess && from &&
            (r = ncclRecv(out + got * recv_unit, from * elems_per_row, t, m, comm, g->streams[s])) != ncclSuccess)
            what = "ncclRecv";
        first = r;
        sent += to;
        got += from;
    }
    ncclResult_t end = ncclGroupEnd();
    if (first != ncclSuccess)
        return fail(g, "%s of %s (unit %s) failed: %s (%s; NCCL_DEBUG=WARN says more)", what, cp_op_kind_name(op->kind),
                    p->units[op->unit].name, ncclGetErrorString(first), ncclGetLastError(NULL));
    if (end != ncclSuccess)
        return fail(g, "ncclGroupEnd of %s (unit %s) failed: %s (%s; NCCL_DEBUG=WARN says more)",
                    cp_op_kind_name(op->kind), p->units[op->unit].name, ncclGetErrorString(end), ncclGetLastError(NULL));
    return 0;
}

static int gpu_a2a_counts(cp_backend *b, const cp_op *op, cp_stream s, const void *in, void *out)
{
    cp_gpu *g = b->ctx;
    size_t share = (size_t)op->a2a_experts, E = share * (size_t)g->plan->families[op->family].size;
    /* A stand-in's communicators have one rank: it receives its own counts (sizes within capacity). */
    if (g->env.standin) {
        CUDA(cudaMemcpyAsync(out, in, E * sizeof(int64_t), cudaMemcpyDeviceToDevice, g->streams[s]));
        return 0;
    }
    return a2a_group(g, op, s, in, out, share * sizeof(int64_t), share * sizeof(int64_t), share, ncclInt64, NULL,
                     NULL, 1);
}

static int gpu_a2a(cp_backend *b, const cp_op *op, cp_stream s, const void *in, void *out, const int64_t *send_rows,
                   const int64_t *recv_rows)
{
    cp_gpu *g = b->ctx;
    size_t row = (size_t)op->a2a_dim * cp_dtype_size(op->dtype);
    if (g->env.standin) { /* its own rows back, as many as it receives from itself */
        size_t rows = 0;
        for (int m = 0; m < g->plan->families[op->family].size; m++) rows += (size_t)recv_rows[m];
        if (rows) CUDA(cudaMemcpyAsync(out, in, rows * row, cudaMemcpyDeviceToDevice, g->streams[s]));
        return 0;
    }
    return a2a_group(g, op, s, in, out, row, row, (size_t)op->a2a_dim, nccl_type(op->dtype), send_rows, recv_rows, 0);
}

static int gpu_record(cp_backend *b, cp_stream s, int event)
{
    cp_gpu *g = b->ctx;
    if (event < 0 || event >= g->plan->nevents) return fail(g, "event slot %d outside the plan's %d", event, g->plan->nevents);
    CUDA(cudaEventRecord(g->events[event], g->streams[s]));
    return 0;
}

static int gpu_wait(cp_backend *b, cp_stream s, int event)
{
    cp_gpu *g = b->ctx;
    if (event < 0 || event >= g->plan->nevents) return fail(g, "event slot %d outside the plan's %d", event, g->plan->nevents);
    CUDA(cudaStreamWaitEvent(g->streams[s], g->events[event], 0));
    return 0;
}

static int gpu_fork(cp_backend *b)
{
    cp_gpu *g = b->ctx;
    CUDA(cudaEventRecord(g->fork_event, g->streams[CP_STREAM_COMPUTE]));
    for (int s = CP_STREAM_COMPUTE + 1; s < CP_STREAM_COUNT; s++) CUDA(cudaStreamWaitEvent(g->streams[s], g->fork_event, 0));
    return 0;
}

/* The caller's stream waits for all side-stream work issued since the
 * fork (every reduction included), so the optimizer, the next step and a
 * graph capture's end see it finished. */
static int gpu_join(cp_backend *b)
{
    cp_gpu *g = b->ctx;
    for (int s = CP_STREAM_COMPUTE + 1; s < CP_STREAM_COUNT; s++) {
        CUDA(cudaEventRecord(g->side_done[s], g->streams[s]));
        CUDA(cudaStreamWaitEvent(g->streams[CP_STREAM_COMPUTE], g->side_done[s], 0));
    }
    return 0;
}

/* The arena keeps its bytes (no allocator churn, graph-capturable); the
 * tables order every later use of them. */
static int gpu_release(cp_backend *b, void *p, size_t bytes)
{
    (void)b;
    (void)p;
    (void)bytes;
    return 0;
}

/* Host copies, stream-ordered and finished on return. A plain cudaMemcpy
 * runs on the legacy default stream, which the side streams (created
 * non-blocking) do not order against, and from pageable memory it may
 * return before the bytes land: a kernel on a side stream could then read
 * the buffer half written. (This was llama_tiny's wrong gradients.) */
static int gpu_read(cp_backend *b, cp_stream s, const void *src, void *host, size_t bytes)
{
    cp_gpu *g = b->ctx;
    CUDA(cudaMemcpyAsync(host, src, bytes, cudaMemcpyDeviceToHost, g->streams[s]));
    CUDA(cudaStreamSynchronize(g->streams[s]));
    return 0;
}

static int gpu_write(cp_backend *b, cp_stream s, void *dst, const void *host, size_t bytes)
{
    cp_gpu *g = b->ctx;
    CUDA(cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, g->streams[s]));
    CUDA(cudaStreamSynchronize(g->streams[s]));
    return 0;
}

/* CPU offload (cp_unit.offload): the unit's sharded params and grads in
 * host memory, page-locked where pin_memory (cudaMallocHost: what torch's
 * pin_memory() allocates), else plain host memory. */
static void *gpu_alloc_host(cp_backend *b, size_t bytes, int pinned)
{
    cp_gpu *g = b->ctx;
    void *p = NULL;
    if (!pinned) {
        if (!(p = calloc(1, bytes ? bytes : 16))) fail(g, "allocating %zu bytes of host memory failed", bytes);
        return p;
    }
    cudaError_t e = cudaMallocHost(&p, bytes ? bytes : 16);
    if (e != cudaSuccess) {
        fail(g, "cudaMallocHost of %zu bytes failed: %s (CPU offload's pinned shards: set pin_memory = false or free "
             "host memory)", bytes, cudaGetErrorString(e));
        return NULL;
    }
    memset(p, 0, bytes ? bytes : 16);
    return p;
}

static void gpu_free_host(cp_backend *b, void *p, int pinned)
{
    (void)b;
    if (pinned) cudaFreeHost(p);
    else free(p);
}

/* CPU offload's copy over the host link on stream s, ordered by the
 * plan's waits like any op; finish: the host waits for it (d2h_add's add on
 * the host, FSDP2's blocking D2H before `grad += ...`). */
static int gpu_host_copy(cp_backend *b, cp_stream s, const void *in, void *out, size_t bytes, int to_host, int finish)
{
    cp_gpu *g = b->ctx;
    CUDA(cudaMemcpyAsync(out, in, bytes, to_host ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice, g->streams[s]));
    if (finish) CUDA(cudaStreamSynchronize(g->streams[s]));
    return 0;
}

static int gpu_sync(cp_backend *b, cp_stream s)
{
    cp_gpu *g = b->ctx;
    CUDA(cudaStreamSynchronize(g->streams[s]));
    return 0;
}

static const char *gpu_last_error(cp_backend *b)
{
    cp_gpu *g = b->ctx;
    return g->err;
}

static void backend_init(cp_gpu *g)
{
    cp_backend *b = &g->backend;
    memset(b, 0, sizeof *b);
    b->ctx = g;
    b->alloc = gpu_alloc;
    b->alloc_symm = gpu_alloc_symm;
    b->free = gpu_free;
    b->copy = gpu_copy;
    b->copy_bytes = gpu_copy_bytes;
    b->alloc_host = gpu_alloc_host;
    b->free_host = gpu_free_host;
    b->host_copy = gpu_host_copy;
    b->sync = gpu_sync;
    b->collective[CP_COLL_ALL_GATHER] = gpu_all_gather;
    b->collective[CP_COLL_REDUCE_SCATTER] = gpu_reduce_scatter;
    b->collective[CP_COLL_ALL_REDUCE] = gpu_all_reduce;
    b->record = gpu_record;
    b->wait = gpu_wait;
    b->fork = gpu_fork;
    b->join = gpu_join;
    b->release = gpu_release;
    b->read = gpu_read;
    b->write = gpu_write;
    b->last_error = gpu_last_error;
    b->send = gpu_send;
    b->recv = gpu_recv;
    b->group_start = gpu_group_start;
    b->group_end = gpu_group_end;
    b->a2a_counts = gpu_a2a_counts;
    b->a2a = gpu_a2a;
}

/* Compute placeholders: the library caller's callback on its stream. */
static int on_compute(void *user, cp_executor *ex, const cp_op *op)
{
    cp_gpu *g = user;
    (void)ex;
    return g->compute ? g->compute(g->compute_user, g, op, g->streams[op->stream]) : 0;
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
    if (env->world_size != p->world_size && strcmp(env->source, "none") == 0) {
        fail(g, "not started by a launcher, but plan %s has %d ranks: start %d processes under torchrun, srun or "
             "mpirun (docs/gpus.md), or use --simulate to run them all on this host", p->name, p->world_size,
             p->world_size);
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
    {
        /* FSDP2's priorities: copy-in, all-gather and reduce-scatter high
         * (they gate compute), the replicate all-reduce low. */
        int least, greatest;
        if (cudaDeviceGetStreamPriorityRange(&least, &greatest) != cudaSuccess ||
            cudaEventCreateWithFlags(&g->fork_event, cudaEventDisableTiming) != cudaSuccess ||
            cudaEventCreateWithFlags(&g->call_event, cudaEventDisableTiming) != cudaSuccess) {
            fail(g, "creating CUDA streams and events failed");
            goto out;
        }
        for (int s = CP_STREAM_COMPUTE + 1; s < CP_STREAM_COUNT; s++)
            if (cudaStreamCreateWithPriority(&g->streams[s], cudaStreamNonBlocking,
                                             s == CP_STREAM_ALL_REDUCE ? least : greatest) != cudaSuccess ||
                cudaEventCreateWithFlags(&g->side_done[s], cudaEventDisableTiming) != cudaSuccess) {
                fail(g, "creating CUDA streams and events failed");
                goto out;
            }
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
    g->live = calloc((size_t)(p->nunits > 0 ? p->nunits : 1), sizeof *g->live);
    g->cursor = calloc((size_t)(p->nunits > 0 ? p->nunits : 1), sizeof *g->cursor);
    g->last_exchange = malloc((size_t)(p->nunits > 0 ? p->nunits : 1) * sizeof *g->last_exchange);
    if (!g->live || !g->cursor || !g->last_exchange) { fail(g, "out of host memory"); goto out; }
    for (int u = 0; u < p->nunits; u++) g->last_exchange[u] = -1;
    backend_init(g);
    g->ex.quiet = 1; /* errors land in g->err, for cp_gpu_last_error */
    if (cp_executor_init(&g->ex, p, env->rank, &g->backend) != 0) {
        if (!g->err[0]) fail(g, "%s", g->ex.err);
        goto out;
    }
    g->have_ex = 1;
    /* From here on the rank's view: its TP class's units, params and ops. */
    g->plan = p = g->ex.plan;
    if (k->prepare && k->prepare(p->view_class) != 0) { fail(g, "preparing the copy kernels' tables failed"); goto out; }
    if (!(g->events = calloc((size_t)(p->nevents > 0 ? p->nevents : 1), sizeof *g->events))) {
        fail(g, "out of host memory");
        goto out;
    }
    for (int i = 0; i < p->nevents; i++)
        if (cudaEventCreateWithFlags(&g->events[i], cudaEventDisableTiming) != cudaSuccess) {
            fail(g, "cudaEventCreate failed");
            goto out;
        }
    if (!(g->order = cp_order_new(p)) ||
        !(g->reduce_done = calloc((size_t)(p->nunits > 0 ? p->nunits : 1), sizeof *g->reduce_done)) ||
        !(g->reduce_pending = calloc((size_t)(p->nunits > 0 ? p->nunits : 1), 1))) {
        fail(g, "out of host memory");
        goto out;
    }
    for (int u = 0; u < p->nunits; u++)
        if (cudaEventCreateWithFlags(&g->reduce_done[u], cudaEventDisableTiming) != cudaSuccess) {
            fail(g, "cudaEventCreate failed");
            goto out;
        }
    g->ex.on_compute = on_compute;
    g->ex.user = g;
    /* gpu_alloc's cudaMemsets and the kernel tables' cudaMemcpy ran on the
     * legacy stream, which the non-blocking streams do not wait for: let
     * them land before any step or upload touches those bytes. */
    if ((ce = cudaDeviceSynchronize()) != cudaSuccess) {
        fail(g, "cudaDeviceSynchronize after allocating the buffers failed: %s", cudaGetErrorString(ce));
        goto out;
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
    /* g->plan may be the executor's view (&g->ex.view): read it before
     * cp_executor_free clears the executor. */
    if (g->events)
        for (int i = 0; i < g->plan->nevents; i++) if (g->events[i]) cudaEventDestroy(g->events[i]);
    free(g->events);
    if (g->reduce_done)
        for (int u = 0; u < g->plan->nunits; u++) if (g->reduce_done[u]) cudaEventDestroy(g->reduce_done[u]);
    free(g->reduce_done);
    free(g->reduce_pending);
    cp_order_free(g->order);
    free(g->live);
    free(g->cursor);
    free(g->last_exchange);
    symm_deregister(g); /* fsdp.symm_mem: before the communicators go */
    if (g->comms)
        for (int f = 0; f < g->plan->nfamilies; f++) if (g->comms[f]) ncclCommDestroy(g->comms[f]);
    free(g->comms);
    if (g->have_ex) cp_executor_free(&g->ex);
#if CP_NCCL_WINDOWS
    /* a symmetric arena the executor never took (gpu_free clears symm_base) */
    if (g->symm_base) ncclMemFree(g->symm_base);
    g->symm_base = NULL;
#endif
    if (g->world) ncclCommDestroy(g->world);
    if (g->fork_event) cudaEventDestroy(g->fork_event);
    if (g->call_event) cudaEventDestroy(g->call_event);
    for (int s = CP_STREAM_COMPUTE + 1; s < CP_STREAM_COUNT; s++) {
        if (g->side_done[s]) cudaEventDestroy(g->side_done[s]);
        if (g->streams[s]) cudaStreamDestroy(g->streams[s]);
    }
    free(g);
}

const char *cp_gpu_last_error(const cp_gpu *g) { return g->err; }
int cp_gpu_rank(const cp_gpu *g) { return g->env.rank; }
int cp_gpu_shard_rank(const cp_gpu *g) { return g->shard_rank; }
int cp_gpu_is_standin(const cp_gpu *g) { return g->env.standin; }
cp_executor *cp_gpu_executor(cp_gpu *g) { return &g->ex; }

void cp_gpu_use_stream(cp_gpu *g, void *stream) { g->streams[CP_STREAM_COMPUTE] = (cudaStream_t)stream; }

static void *param_ptr(cp_gpu *g, int param, cp_buffer kind) { return cp_executor_param_ptr(&g->ex, param, kind); }

void *cp_gpu_sharded(cp_gpu *g, int param) { return param_ptr(g, param, CP_BUF_SHARDED); }
void *cp_gpu_unsharded(cp_gpu *g, int param) { return param_ptr(g, param, CP_BUF_UNSHARDED); }
void *cp_gpu_grad(cp_gpu *g, int param) { return param_ptr(g, param, CP_BUF_GRADS); }
void *cp_gpu_sharded_grad(cp_gpu *g, int param) { return param_ptr(g, param, CP_BUF_SHARDED_GRADS); }

/* An executor failure: its message (which includes ours) for cp_gpu_last_error. */
static int ex_failed(cp_gpu *g)
{
    if (g->ex.err[0]) snprintf(g->err, sizeof g->err, "%s", g->ex.err);
    return -1;
}

/* One op through the walker; with profiling on, its host issue time. */
static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return 1e6 * (double)ts.tv_sec + 1e-3 * (double)ts.tv_nsec;
}

static int run_op(cp_gpu *g, const cp_op *op)
{
    if (g->trace) {
        /* --trace: the op's waits first (the executor repeats them, a no-op),
         * so the start event marks when the op can run on its stream. */
        cudaStream_t s = g->streams[op->stream];
        for (int i = 0; i < op->wait_count; i++)
            CUDA(cudaStreamWaitEvent(s, g->events[g->plan->waits[op->wait_first + i]], 0));
        CUDA(cudaEventRecord(g->trace[2 * (op - g->plan->ops)], s));
    }
    double t = g->profile ? now_us() : 0.0;
    if (cp_executor_run_op(&g->ex, op)) return ex_failed(g);
    if (g->profile) g->profile[op->kind] += now_us() - t;
    if (g->trace) CUDA(cudaEventRecord(g->trace[2 * (op - g->plan->ops) + 1], g->streams[op->stream]));
    return 0;
}

void cp_gpu_set_trace(cp_gpu *g, void *events) { g->trace = events; }

static int fork_join(cp_gpu *g, int join)
{
    double t = g->profile ? now_us() : 0.0;
    if ((join ? g->backend.join : g->backend.fork)(&g->backend)) return -1;
    if (g->profile) g->profile[CP_OP_KIND_COUNT] += now_us() - t;
    return 0;
}

/* Library calls run the unit's next instance of an op group (the plan may
 * unshard a unit twice per step, each instance with its own waits): from
 * the unit's cursor for that call to the group's last kind present,
 * wrapping to the step's start after the last instance. */
/* A call's ops run one after the other, each after the one before it
 * whatever their streams: the plan's own waits leave out what its issue
 * order already implies (an experts unit's all-gather prefetched before
 * the dense one is ordered before its copy-out only through the dense
 * copy-out's wait), which a call that issues one unit alone does not
 * inherit. Each group is a chain of dependent ops anyway (copy-in, gather,
 * copy-out; pack, reduce, view-out; counts, tokens). */
typedef struct {
    cp_gpu *g;
    int prev_stream;
} call_ctx;

static int run_call_op(void *ctx, const cp_op *op)
{
    call_ctx *c = ctx;
    cp_gpu *g = c->g;
    if (c->prev_stream >= 0 && c->prev_stream != (int)op->stream) {
        CUDA(cudaEventRecord(g->call_event, g->streams[c->prev_stream]));
        CUDA(cudaStreamWaitEvent(g->streams[op->stream], g->call_event, 0));
    }
    c->prev_stream = (int)op->stream;
    return run_op(g, op);
}

/* One call: its parts (op groups, each from its unit's cursor for that
 * call; a blocking unshard is its issue's group, then its wait's), checked
 * first and refused before anything is issued when its ops would write
 * arena bytes another buffer holds data in across calls (arena.c
 * cp_call_conflict) or touch bytes an op still in flight may use unordered
 * before them, or wait for an event not recorded yet in this step (arena.c
 * cp_order_call). blocking: forked from and joined into the caller's
 * stream (cp_gpu_unshard & co.; a call whose ops all run on the caller's
 * stream needs neither); else issued on the plan's streams with the
 * plan's waits alone (the split calls), the side streams forked from the
 * caller's only where the call starts a step, as FSDP2's root pre-forward
 * makes its all-gather streams wait for the current stream. */
typedef struct {
    int call;
    const cp_op_kind *kinds;
    int nkinds;
} part;

static int unit_call(cp_gpu *g, const char *name, int unit, const part *parts, int nparts, int blocking, void *stream,
                     int *last_stream)
{
    const cp_plan *p = g->plan;
    /* A pipeline rank's step is its sends and receives between the units'
     * calls: a caller driving units alone would leave its peers waiting. */
    if (p->pp_size > 1)
        return fail(g, "%s: plan %s is a pipeline plan (pp %d): the library calls do not run its sends and "
                    "receives; run its binary, or drive a plan without pp", name, p->name, p->pp_size);
    if (unit < 0 || unit >= p->nunits) return fail(g, "unit %d is outside the plan's %d units", unit, p->nunits);
    cp_call_effect e = { 0 }, ek;
    cp_call_part cp[2];
    int side = 0;
    for (int k = 0; k < nparts; k++) {
        cp[k] = (cp_call_part){ parts[k].kinds, parts[k].nkinds, g->cursor[unit][parts[k].call] };
        cp_call_effect_of(p, unit, parts[k].kinds, parts[k].nkinds, cp[k].cursor, &ek);
        cp_call_effect_merge(&e, &ek);
        for (int i = ek.first; ek.ops && i <= ek.last; i++)
            if (p->ops[i].unit == unit && p->ops[i].stream != CP_STREAM_COMPUTE)
                for (int j = 0; j < parts[k].nkinds; j++) side |= p->ops[i].kind == parts[k].kinds[j];
    }
    int wrote = 0, held = 0, v = cp_call_conflict(p, unit, &e, g->live, &wrote, &held);
    if (v >= 0) {
        char m[sizeof g->err];
        cp_call_conflict_message(p, name, unit, v, wrote, held, m, sizeof m);
        return fail(g, "%s", m);
    }
    /* Nothing to issue (e.g. a unit that is never resharded): no fork either. */
    if (!e.ops) return 0;
    int flags = blocking && side ? CP_ORDER_FORK | CP_ORDER_JOIN : 0;
    char m[sizeof g->err];
    if (cp_order_call(g->order, name, unit, cp, nparts, flags, 0, m, sizeof m)) return fail(g, "%s", m);
    cudaStream_t S = (cudaStream_t)stream;
    g->streams[CP_STREAM_COMPUTE] = S;
    if (((flags & CP_ORDER_FORK) || cp_order_starts_step(g->order, e.first)) && fork_join(g, 0)) return -1;
    (void)cp_order_call(g->order, name, unit, cp, nparts, flags, 1, m, sizeof m);
    call_ctx c = { g, -1 };
    for (int k = 0; k < nparts; k++)
        if (cp_run_call(p, unit, parts[k].kinds, parts[k].nkinds, &g->cursor[unit][parts[k].call], run_call_op, &c) < 0) {
            /* Join what was issued anyway, so the caller's stream does not run
             * ahead of side-stream work it hands back; the first error stands. */
            char first[sizeof g->err];
            memcpy(first, g->err, sizeof first);
            (void)fork_join(g, 1);
            memcpy(g->err, first, sizeof first);
            return -1;
        }
    if ((flags & CP_ORDER_JOIN) && fork_join(g, 1)) return -1;
    cp_call_apply(&e, &g->live[unit]);
    if (last_stream) *last_stream = c.prev_stream;
    return 0;
}

static const part unshard_issue = { CALL_UNSHARD, cp_call_unshard_issue, 3 },
                  unshard_wait = { CALL_UNSHARD_WAIT, cp_call_unshard_wait, 1 },
                  reshard = { CALL_RESHARD, cp_call_reshard, 2 }, reduce = { CALL_REDUCE, cp_call_reduce, 10 },
                  exchange = { CALL_EXCHANGE, cp_call_exchange, 2 };

int cp_gpu_unshard(cp_gpu *g, int unit, void *stream)
{
    const part both[2] = { unshard_issue, unshard_wait };
    return unit_call(g, "cp_gpu_unshard", unit, both, 2, 1, stream, NULL);
}

int cp_gpu_unshard_issue(cp_gpu *g, int unit, void *stream)
{
    return unit_call(g, "cp_gpu_unshard_issue", unit, &unshard_issue, 1, 0, stream, NULL);
}

int cp_gpu_unshard_wait(cp_gpu *g, int unit, void *stream)
{
    return unit_call(g, "cp_gpu_unshard_wait", unit, &unshard_wait, 1, 0, stream, NULL);
}

/* Frees nothing (the arena is fixed) but marks, on the stream, the point
 * after which other units may reuse this unit's unsharded bytes. */
int cp_gpu_reshard(cp_gpu *g, int unit, void *stream)
{
    return unit_call(g, "cp_gpu_reshard", unit, &reshard, 1, 1, stream, NULL);
}

/* Pack, reduce-scatter, the HSDP all-reduce where the plan has one, view-out
 * (assigning the sharded grads, or adding into them on a later reduction of
 * the step, as the plan's op says); under all_reduce_last the reduce-scatter
 * output goes into the partial sums instead until the last micro-step, which
 * folds them in before its all-reduce. */
int cp_gpu_reduce_grads(cp_gpu *g, int unit, void *stream)
{
    return unit_call(g, "cp_gpu_reduce_grads", unit, &reduce, 1, 1, stream, NULL);
}

int cp_gpu_reduce_issue(cp_gpu *g, int unit, void *stream)
{
    int last = -1;
    if (unit_call(g, "cp_gpu_reduce_issue", unit, &reduce, 1, 0, stream, &last)) return -1;
    if (last < 0) return 0; /* nothing issued */
    CUDA(cudaEventRecord(g->reduce_done[unit], g->streams[last]));
    g->reduce_pending[unit] = 1;
    return 0;
}

int cp_gpu_reduce_wait(cp_gpu *g, int unit, void *stream)
{
    if (unit < 0 || unit >= g->plan->nunits) return fail(g, "unit %d is outside the plan's %d units", unit, g->plan->nunits);
    if (!g->reduce_pending[unit]) return 0;
    CUDA(cudaStreamWaitEvent((cudaStream_t)stream, g->reduce_done[unit], 0));
    cp_order_wait_unit(g->order, unit);
    g->reduce_pending[unit] = 0;
    return 0;
}

/* The unit's next token all-to-all, in the plan's order: forward, its
 * counts exchange and dispatch in one call, then its combine; backward,
 * the combine's gradient, then the dispatch's. */
int cp_gpu_exchange_tokens(cp_gpu *g, int unit, void *stream)
{
    if (!g->have_ex) return fail(g, "cp_gpu_exchange_tokens before cp_gpu_init finished");
    int before = unit >= 0 && unit < g->plan->nunits ? g->cursor[unit][CALL_EXCHANGE] : 0;
    cp_call_effect e = { 0 };
    if (unit >= 0 && unit < g->plan->nunits) cp_call_effect_of(g->plan, unit, cp_call_exchange, 2, before, &e);
    if (unit_call(g, "cp_gpu_exchange_tokens", unit, &exchange, 1, 1, stream, NULL)) return -1;
    if (e.ops) g->last_exchange[unit] = e.last;
    return 0;
}

void *cp_gpu_tokens(cp_gpu *g, int unit, int receive)
{
    if (unit < 0 || unit >= g->plan->nunits || g->plan->units[unit].a2a_numel <= 0) return NULL;
    return g->ex.buf[receive ? CP_BUF_A2A_RECV : CP_BUF_A2A_SEND][unit];
}

const int64_t *cp_gpu_exchange_counts(const cp_gpu *g, int unit)
{
    if (unit < 0 || unit >= g->plan->nunits || g->last_exchange[unit] < 0) return NULL;
    return cp_executor_a2a_counts_of_op(&g->ex, &g->plan->ops[g->last_exchange[unit]]);
}

void cp_gpu_set_compute(cp_gpu *g, cp_gpu_compute_fn fn, void *user)
{
    g->compute = fn;
    g->compute_user = user;
    g->ex.on_compute = on_compute;
    g->ex.user = g;
}

/* The step through the walker; with host_us, each op kind's host issue
 * time is added to it (the clock is read only then, off the normal path). */
int cp_gpu_step_profiled(cp_gpu *g, void *stream, double host_us[CP_OP_KIND_COUNT + 1])
{
    g->streams[CP_STREAM_COMPUTE] = (cudaStream_t)stream;
    g->profile = host_us;
    int rc = fork_join(g, 0);
    for (int i = 0; rc == 0 && i < g->plan->nops; i++) rc = run_op(g, &g->plan->ops[i]);
    if (rc == 0) rc = fork_join(g, 1);
    g->profile = NULL;
    return rc;
}

int cp_gpu_step(cp_gpu *g, void *stream) { return cp_gpu_step_profiled(g, stream, NULL); }

int cp_gpu_set_expert_counts(cp_gpu *g, int unit, const int64_t *counts, int n)
{
    if (!g->have_ex) return fail(g, "cp_gpu_set_expert_counts before cp_gpu_init finished");
    if (cp_executor_set_expert_counts(&g->ex, unit, counts, n) == 0) return 0;
    snprintf(g->err, sizeof g->err, "%s", g->ex.err); /* names the rank already */
    return -1;
}

int cp_gpu_refuse_expert_counts(cp_gpu *g, int unit, const char *why)
{
    if (!g->have_ex) return fail(g, "cp_gpu_refuse_expert_counts before cp_gpu_init finished");
    cp_executor_refuse_expert_counts(&g->ex, unit, why);
    snprintf(g->err, sizeof g->err, "%s", g->ex.err);
    return -1;
}

int cp_gpu_graph_capture(cp_gpu *g, void *stream)
{
    cudaStream_t S = (cudaStream_t)stream;
    cudaGraph_t graph;
    if (g->graph) { cudaGraphExecDestroy(g->graph); g->graph = NULL; }
    /* Expert parallelism's split sizes come back to the host each step (the
     * counts all-to-all, then a synchronising copy): a graph would replay
     * the captured sizes, and the copy cannot be captured. Refused. */
    if (cp_plan_has_a2a(g->plan))
        return fail(g, "plan %s has expert-parallel all-to-alls, whose split sizes are read back to the host every "
                    "step: a CUDA graph cannot capture them (run without --graph)", g->plan->name);
    /* CPU offload: the host adds a later reduction's gradient after a
     * synchronising copy, which no graph can hold; FSDP2 says the same
     * ("CUDA graph capture does not support CPU gradient offload", torch
     * 2.15 _fully_shard.py:524). Refused. */
    for (int u = 0; u < g->plan->nunits; u++)
        if (g->plan->units[u].offload)
            return fail(g, "plan %s offloads unit %s to the CPU (cpu_offload): a CUDA graph cannot capture its host "
                        "copies and adds, as FSDP2's capture does not (torch _fully_shard.py:524); run without --graph",
                        g->plan->name, g->plan->units[u].name);
    CUDA(cudaStreamBeginCapture(S, cudaStreamCaptureModeThreadLocal));
    int rc = cp_gpu_step(g, stream);
    cudaError_t e = cudaStreamEndCapture(S, &graph);
    if (rc) {
        if (e == cudaSuccess) cudaGraphDestroy(graph);
        return -1;
    }
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

/* After an asynchronous NCCL error, a sticky CUDA error or a step that
 * never finishes, a collective a dead peer never completes may still be
 * queued: ncclCommDestroy (and so cp_gpu_destroy) would wait for it forever.
 * Abort every communicator instead; destroy then has nothing to wait for. */
static void abort_comms(cp_gpu *g)
{
    if (g->comms)
        for (int f = 0; f < g->plan->nfamilies; f++)
            if (g->comms[f]) { ncclCommAbort(g->comms[f]); g->comms[f] = NULL; }
    if (g->world) { ncclCommAbort(g->world); g->world = NULL; }
}

/* The cursor on the runtime's own timeout or failure (COMMPLAN_CURSOR_DUMP; issue 40): this rank's
 * step and the op it enqueued last, and g->err as the line why; rc passed through. */
static int sync_failed(cp_gpu *g, const char *event, int rc)
{
    cp_cursor_dump(g->ex.rank, event, g->err);
    return rc;
}

int cp_gpu_synchronize(cp_gpu *g, void *stream, double timeout_s)
{
    double deadline = now_s() + timeout_s;
    for (;;) {
        cudaError_t e = cudaStreamQuery((cudaStream_t)stream);
        if (e == cudaSuccess) return 0;
        if (e != cudaErrorNotReady) {
            abort_comms(g);
            return sync_failed(g, "failure", fail(g, "step failed on the GPU: %s; communicators aborted",
                                                  cudaGetErrorString(e)));
        }
        ncclResult_t async = ncclSuccess;
        ncclComm_t comms[1 + 64];
        int n = 0;
        if (g->world) comms[n++] = g->world; /* NULL once aborted */
        for (int f = 0; f < g->plan->nfamilies && n < 65; f++) if (g->comms[f]) comms[n++] = g->comms[f];
        for (int i = 0; i < n; i++) {
            if (ncclCommGetAsyncError(comms[i], &async) != ncclSuccess || async != ncclSuccess) {
                abort_comms(g);
                return sync_failed(g, "failure", fail(g, "NCCL reported an asynchronous error: %s (a peer may have "
                                                      "died; NCCL_DEBUG=WARN); communicators aborted",
                                                      ncclGetErrorString(async)));
            }
        }
        if (now_s() > deadline) {
            abort_comms(g);
            return sync_failed(g, "timeout", fail(g, "step did not finish within %.0f s: a peer is missing or "
                                                  "stuck; communicators aborted", timeout_s));
        }
        struct timespec ts = { 0, 200000 };
        nanosleep(&ts, NULL);
    }
}

/* After a failed step the stream may still hold work: host functions that
 * read the caller's memory, collectives of communicators a peer left. This
 * aborts the communicators (their kernels then end) and waits until
 * nothing queued on stream can still run, so the caller may free what that
 * work uses. -1 if it is still running after timeout_s: then nothing it
 * uses may be freed. */
int cp_gpu_quiesce(cp_gpu *g, void *stream, double timeout_s)
{
    if (cp_gpu_synchronize(g, stream, timeout_s) == 0) return 0;
    abort_comms(g);
    double deadline = now_s() + timeout_s;
    while (cudaStreamQuery((cudaStream_t)stream) == cudaErrorNotReady) {
        if (now_s() > deadline) return -1;
        struct timespec ts = { 0, 200000 };
        nanosleep(&ts, NULL);
    }
    return 0; /* finished, or stopped by a sticky error: nothing more will run */
}

size_t cp_gpu_buffer_bytes(const cp_gpu *g, int u, cp_buffer kind)
{
    return (size_t)cp_arena_buffer_bytes(g->plan, u, kind);
}

int cp_gpu_download(cp_gpu *g, int u, cp_buffer kind, void *host, void *stream)
{
    if (u < 0 || u >= g->plan->nunits || (unsigned)kind >= CP_BUFFERS) return fail(g, "no buffer %d of unit %d", (int)kind, u);
    g->streams[CP_STREAM_COMPUTE] = (cudaStream_t)stream;
    return cp_executor_read(&g->ex, CP_STREAM_COMPUTE, u, kind, host);
}

int cp_gpu_upload(cp_gpu *g, int u, cp_buffer kind, const void *host, void *stream)
{
    if (u < 0 || u >= g->plan->nunits || (unsigned)kind >= CP_BUFFERS) return fail(g, "no buffer %d of unit %d", (int)kind, u);
    g->streams[CP_STREAM_COMPUTE] = (cudaStream_t)stream;
    return cp_executor_write(&g->ex, CP_STREAM_COMPUTE, u, kind, host);
}

/* ---- nccl-tests-style table: every distinct collective of the step and
 * every copy kernel of the largest unit, timed alone on the caller's
 * stream through the same backend calls the step makes. */

int cp_gpu_bench_ops(cp_gpu *g, void *stream, int warmup, int iters, FILE *out)
{
    const cp_plan *p = g->plan;
    cudaStream_t S = (cudaStream_t)stream;
    cp_backend *b = &g->backend;
    cudaEvent_t t0, t1;
    g->streams[CP_STREAM_COMPUTE] = S;
    CUDA(cudaEventCreate(&t0));
    CUDA(cudaEventCreate(&t1));
    fprintf(out, "# %-15s %-12s %6s %14s %12s %10s %10s %10s\n", "op", "group", "type", "size (B)", "count", "time (us)",
            "algbw GB/s", "busbw GB/s");
    if (g->env.standin) fprintf(out, "  (collectives not timed: stand-in communicators have one rank)\n");
    for (int i = 0; i < p->nops && !g->env.standin; i++) {
        const cp_op *op = &p->ops[i];
        const cp_op_desc *d = &cp_op_descs[op->kind];
        if (op->family < 0 || d->action != CP_ACT_COLLECTIVE) continue;
        int dup = 0; /* one row per (kind, group, count, dtype) */
        for (int j = 0; j < i && !dup; j++) {
            const cp_op *o = &p->ops[j];
            dup = o->kind == op->kind && o->family == op->family && o->count == op->count && o->dtype == op->dtype;
        }
        if (dup) continue;
        int n = p->families[op->family].size;
        size_t es = cp_dtype_size(op->dtype);
        /* nccl-tests' size: the larger buffer (all-gather out, reduce-scatter in, all-reduce). */
        size_t size = d->collective == CP_COLL_ALL_REDUCE ? (size_t)op->count * es : (size_t)op->count * (size_t)n * es;
        void *in = cp_executor_op_buffer(&g->ex, op, d->in, d->in_slot);
        void *outb = cp_executor_op_buffer(&g->ex, op, d->out, d->out_slot);
        float ms = 0.0f;
        for (int it = -warmup; it < iters; it++) {
            if (it == 0) CUDA(cudaEventRecord(t0, S));
            if (b->collective[d->collective](b, op, CP_STREAM_COMPUTE, in, outb)) return -1;
        }
        CUDA(cudaEventRecord(t1, S));
        CUDA(cudaEventSynchronize(t1));
        CUDA(cudaEventElapsedTime(&ms, t0, t1));
        double us = 1000.0 * ms / (iters > 0 ? iters : 1);
        double algbw = (double)size / (us * 1e3);
        fprintf(out, "  %-15s %-12s %6s %14zu %12ld %10.1f %10.2f %10.2f\n", d->name, p->families[op->family].name,
                cp_dtype_name(op->dtype), size, (long)op->count, us, algbw,
                algbw * d->ring_passes * (double)(n - 1) / n);
    }
    /* Copy kernels of the largest unit: bytes read + written per launch. */
    int big = 0;
    for (int u = 1; u < p->nunits; u++) if (p->units[u].total > p->units[big].total) big = u;
    for (int kind = 0; kind < CP_OP_KIND_COUNT; kind++) {
        const cp_op_desc *d = &cp_op_descs[kind];
        if (d->action != CP_ACT_COPY) continue;
        size_t bytes = cp_gpu_buffer_bytes(g, big, d->in) + cp_gpu_buffer_bytes(g, big, d->out);
        if (d->out == CP_BUF_AG) /* copy-in writes only this rank's slot */
            bytes = cp_gpu_buffer_bytes(g, big, d->in) + cp_gpu_buffer_bytes(g, big, d->out) / (size_t)cp_unit_shard_size(p, big);
        if (d->adds) bytes += cp_gpu_buffer_bytes(g, big, d->out); /* reads what it adds into too */
        float ms = 0.0f;
        for (int it = -warmup; it < iters; it++) {
            if (it == 0) CUDA(cudaEventRecord(t0, S));
            if (b->copy(b, d->kernel, big, 0, 0, CP_STREAM_COMPUTE, g->ex.buf[d->in][big], g->ex.buf[d->out][big]))
                return -1;
        }
        CUDA(cudaEventRecord(t1, S));
        CUDA(cudaEventSynchronize(t1));
        CUDA(cudaEventElapsedTime(&ms, t0, t1));
        double us = 1000.0 * ms / (iters > 0 ? iters : 1);
        fprintf(out, "  %-15s %-12s %6s %14zu %12s %10.1f %10.2f %10s\n", d->name, p->units[big].name, "-", bytes, "-",
                us, (double)bytes / (us * 1e3), "-");
    }
    cudaEventDestroy(t0);
    cudaEventDestroy(t1);
    return 0;
}
