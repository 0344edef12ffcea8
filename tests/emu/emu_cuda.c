/* TEST DOUBLE, not CUDA: the emulated CUDA runtime under the unchanged
 * runtime/gpu.c and gpu_run.c (docs/emulator.md says what it models and
 * what it does not).
 *
 *   streams   in-order worker threads, each op after a seeded random delay;
 *             the legacy stream (NULL) orders blocking streams only, as CUDA's
 *   events    generations: a wait waits for the record issued last before it
 *   memory    host memory; cudaMemset and pageable cudaMemcpy to the device
 *             return before the bytes land (CUDA's weak ordering)
 *   graphs    capture records node lists with CUDA's dependency and join
 *             rules and refuses what CUDA refuses inside a capture; a replay
 *             runs every captured stream's nodes on a lane of its own
 *   races     a happens-before detector (vector clocks over streams, graph
 *             lanes and the host) sees every byte a kernel, copy, memset or
 *             collective touches and reports any access not ordered after the
 *             last conflicting one
 *
 * Findings (races, broken rules, NCCL mismatches, deadlocks) are printed
 * as "commplan-emu: rank R: KIND: ..." and make the process exit 3. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cuda_runtime.h"
#include "emu.h"

#define MAX_AGENTS 64
#define EV_HIST 64
#define MAX_MEMBERS 32
#define CLOCK_BITS 24

typedef struct {
    uint32_t c[MAX_AGENTS];
} vclock;

static pthread_mutex_t L = PTHREAD_MUTEX_INITIALIZER; /* streams, events, captures, agents */
static pthread_cond_t CV = PTHREAD_COND_INITIALIZER;
static pthread_mutex_t SH = PTHREAD_MUTEX_INITIALIZER; /* allocations and shadow memory */
static cudaError_t sticky; /* a device fault: every later call fails with it, as CUDA's */

/* ---- configuration, findings and seeded faults ---- */

static int g_rank = -1;
static unsigned g_seed;
static double g_deadlock_s;
static int g_max_delay_us;
static long n_race, n_rule, n_nccl, n_illegal, n_ops, n_kernels, n_colls, n_graph_launches;
static char g_fault[32];
static long g_fault_at, g_fault_seen_calls;
static int g_fault_rank, g_fault_fired, g_fault_vacuous, g_lost_pending;
static int g_configured;

static void summary(void);

static void configure(void)
{
    if (g_configured) return;
    g_configured = 1;
    const char *r = getenv("RANK");
    g_rank = r ? atoi(r) : 0;
    const char *s = getenv("COMMPLAN_EMU_SEED");
    g_seed = s ? (unsigned)strtoul(s, NULL, 10) : 1u;
    const char *d = getenv("COMMPLAN_EMU_DEADLOCK_S");
    g_deadlock_s = d && atof(d) > 0 ? atof(d) : 30.0;
    const char *m = getenv("COMMPLAN_EMU_MAX_DELAY_US");
    g_max_delay_us = m ? atoi(m) : 200;
    const char *f = getenv("COMMPLAN_EMU_FAULT"); /* name:N, the Nth occurrence (1-based) */
    if (f && *f) {
        const char *colon = strchr(f, ':');
        size_t n = colon ? (size_t)(colon - f) : strlen(f);
        if (n >= sizeof g_fault) n = sizeof g_fault - 1;
        memcpy(g_fault, f, n);
        g_fault_at = colon ? atol(colon + 1) : 1;
        const char *fr = getenv("COMMPLAN_EMU_FAULT_RANK");
        g_fault_rank = fr ? atoi(fr) : 0;
    }
    fprintf(stderr, "commplan-emu: rank %d: emulated CUDA and NCCL (a test double, not a GPU), seed %u%s%s\n", g_rank,
            g_seed, g_fault[0] ? ", seeded fault " : "", g_fault[0] ? f : "");
    atexit(summary);
}

int emu_rank(void)
{
    configure();
    return g_rank;
}
double emu_deadlock_s(void)
{
    configure();
    return g_deadlock_s;
}

int emu_fault(const char *name)
{
    configure();
    if (!g_fault[0] || strcmp(g_fault, name) != 0 || g_rank != g_fault_rank) return 0;
    if (++g_fault_seen_calls != g_fault_at) return 0;
    g_fault_fired = 1;
    fprintf(stderr, "commplan-emu: rank %d: seeded fault %s:%ld injected here\n", g_rank, name, g_fault_at);
    return 1;
}

void emu_finding(const char *kind, const char *fmt, ...)
{
    configure();
    long *counter = !strcmp(kind, "RACE") ? &n_race : !strcmp(kind, "NCCL") || !strcmp(kind, "DEADLOCK") ? &n_nccl
                    : !strcmp(kind, "ILLEGAL") ? &n_illegal : &n_rule;
    long n = __atomic_add_fetch(counter, 1, __ATOMIC_RELAXED);
    if (n > 10) return; /* the first ten of each kind say enough */
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "commplan-emu: rank %d: %s: %s\n", g_rank, kind, msg);
}

static void summary(void)
{
    long findings = n_race + n_rule + n_nccl + n_illegal;
    if (__atomic_load_n(&g_lost_pending, __ATOMIC_RELAXED) > 0) { /* nothing ran after it on its stream */
        fprintf(stderr, "commplan-emu: rank %d: seeded fault: no op ran after the removed wait on its stream: the "
                "removed wait was vacuous\n", g_rank);
        g_fault_vacuous = 1;
    }
    fprintf(stderr,
            "commplan-emu: rank %d: summary: seed %u, %ld stream ops (%ld kernels, %ld collectives, %ld graph launches); "
            "%ld races, %ld rule violations, %ld NCCL mismatches or deadlocks, %ld illegal accesses%s%s\n",
            g_rank, g_seed, n_ops, n_kernels, n_colls, n_graph_launches, n_race, n_rule, n_nccl, n_illegal,
            g_fault[0] ? (!g_fault_fired ? "; seeded fault never reached" : g_fault_vacuous ? "; seeded fault fired, vacuous"
                                                                                   : "; seeded fault fired") : "",
            findings ? " (exit 3)" : "");
    fflush(stderr);
    if (findings) _exit(3);
}

double emu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void emu_lock(void) { pthread_mutex_lock(&L); }
void emu_unlock(void) { pthread_mutex_unlock(&L); }
void emu_broadcast(void) { pthread_cond_broadcast(&CV); }

int emu_wait_until(double deadline)
{
    double now = emu_now();
    if (now >= deadline) return -1;
    /* The condition uses CLOCK_REALTIME: wait at most 50 ms and recheck. */
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    double step = deadline - now < 0.05 ? deadline - now : 0.05;
    ts.tv_nsec += (long)(step * 1e9);
    ts.tv_sec += ts.tv_nsec / 1000000000L;
    ts.tv_nsec %= 1000000000L;
    pthread_cond_timedwait(&CV, &L, &ts);
    return 0;
}

/* ---- agents and vector clocks ---- */

typedef struct {
    char name[48];
    uint32_t clock;
    char (*label)[80]; /* label[clock]: what ran at that tick, for race reports */
    uint32_t cap;
} agent;
static agent agents[MAX_AGENTS] = { { "host", 0, NULL, 0 } };
static int nagents = 1;
static vclock host_vc;

static void vc_join(vclock *a, const vclock *b)
{
    for (int i = 0; i < MAX_AGENTS; i++)
        if (b->c[i] > a->c[i]) a->c[i] = b->c[i];
}

static int new_agent(const char *fmt, ...) /* under L */
{
    if (nagents >= MAX_AGENTS) return -1;
    agent *a = &agents[nagents];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(a->name, sizeof a->name, fmt, ap);
    va_end(ap);
    return nagents++;
}

static void tick(vclock *vc, int ag, const char *label) /* under L */
{
    agent *a = &agents[ag];
    uint32_t c = ++a->clock;
    vc->c[ag] = c;
    if (c >= a->cap && c < (1u << CLOCK_BITS)) {
        uint32_t cap = a->cap ? a->cap * 2 : 256;
        while (cap <= c) cap *= 2;
        void *p = realloc(a->label, (size_t)cap * sizeof *a->label);
        if (p) {
            a->label = p;
            a->cap = cap;
        }
    }
    if (c < a->cap) snprintf(a->label[c], sizeof a->label[c], "%s", label);
}

static uint32_t epoch_of(int ag, uint32_t clock) { return (uint32_t)ag << CLOCK_BITS | (clock & ((1u << CLOCK_BITS) - 1)); }
static int ordered(uint32_t e, const vclock *vc) { return e == 0 || (e & ((1u << CLOCK_BITS) - 1)) <= vc->c[e >> CLOCK_BITS]; }
static void describe(uint32_t e, char *out, size_t n)
{
    int ag = (int)(e >> CLOCK_BITS);
    uint32_t c = e & ((1u << CLOCK_BITS) - 1);
    snprintf(out, n, "%s (%s, op #%u)", ag < nagents && c < agents[ag].cap ? agents[ag].label[c] : "?",
             ag < nagents ? agents[ag].name : "?", c);
}

/* What the running op is: its agent, its vector clock and its name. */
typedef struct {
    int agent;
    vclock vc;
    const char *label;
    int in_hostfn;
    int has_lost; /* a seeded fault removed a wait for lost (described by lost_what) */
    vclock lost;
    char lost_what[160];
} exec_ctx;
static __thread exec_ctx *cur;

void emu_vc_join_slot(void **slot)
{
    if (!cur || !*slot) return;
    pthread_mutex_lock(&L);
    vc_join(&cur->vc, *slot);
    pthread_mutex_unlock(&L);
}

void emu_vc_publish_slot(void **slot)
{
    if (!cur) return;
    pthread_mutex_lock(&L);
    if (!*slot) *slot = calloc(1, sizeof(vclock));
    if (*slot) vc_join(*slot, &cur->vc);
    pthread_mutex_unlock(&L);
}

/* ---- device memory and the race detector's shadow ---- */

typedef struct {
    uint32_t w, r[4]; /* last write; up to four reads not ordered with each other */
} cell;
/* Bytes per shadow cell: the smallest element the kernels and collectives
 * move is 2 bytes (the fingerprint's ncclChar all-gather moves whole 32-byte rows). */
#define GRANULE 2

typedef struct {
    char *base;
    size_t size;
    cell *shadow; /* device allocations; NULL for pinned host memory */
    int id;
} alloc_t;
static alloc_t *allocs;
static int nallocs, allocs_cap, next_alloc_id;
static uint32_t last_race_me, last_race_prev;

static int last_hit; /* under SH: kernels touch one allocation many times in a row */
static alloc_t *find_alloc(const void *p) /* under SH */
{
    if (last_hit < nallocs && (const char *)p >= allocs[last_hit].base &&
        (const char *)p < allocs[last_hit].base + allocs[last_hit].size)
        return &allocs[last_hit];
    for (int i = 0; i < nallocs; i++)
        if ((const char *)p >= allocs[i].base && (const char *)p < allocs[i].base + allocs[i].size) {
            last_hit = i;
            return &allocs[i];
        }
    return NULL;
}

int emu_is_device(const void *p, size_t bytes)
{
    pthread_mutex_lock(&SH);
    alloc_t *a = find_alloc(p);
    int ok = a && a->shadow && (const char *)p + bytes <= a->base + a->size;
    pthread_mutex_unlock(&SH);
    return ok;
}

static int is_pinned(const void *p)
{
    pthread_mutex_lock(&SH);
    alloc_t *a = find_alloc(p);
    int ok = a && !a->shadow;
    pthread_mutex_unlock(&SH);
    return ok;
}

/* An illegal access by device work is sticky, as a GPU fault is. */
static void fault_sticky(void)
{
    pthread_mutex_lock(&L);
    if (!sticky) sticky = cudaErrorIllegalAddress;
    pthread_mutex_unlock(&L);
}

static void access_range(const void *p, size_t n, int write)
{
    if (n == 0) return;
    exec_ctx *x = cur;
    pthread_mutex_lock(&SH);
    alloc_t *a = find_alloc(p);
    if (!a || !a->shadow) {
        pthread_mutex_unlock(&SH);
        if (x && !a) fault_sticky();
        if (x && !a) /* a kernel or copy touching memory that is not the device's */
            emu_finding("ILLEGAL", "%s %s %zu bytes at %p, outside every device allocation (an illegal address on a GPU)",
                        x->label, write ? "writes" : "reads", n, p);
        return;
    }
    if (!x) {
        pthread_mutex_unlock(&SH);
        emu_finding("ILLEGAL", "the host thread %s device memory at %p directly; copy it with cudaMemcpy",
                    write ? "writes" : "reads", p);
        return;
    }
    size_t off = (size_t)((const char *)p - a->base);
    if (off + n > a->size) {
        size_t size = a->size;
        int id = a->id;
        pthread_mutex_unlock(&SH);
        fault_sticky();
        emu_finding("ILLEGAL", "%s %s bytes [%zu, %zu) of device allocation #%d, which has %zu bytes", x->label,
                    write ? "writes" : "reads", off, off + n, id, size);
        pthread_mutex_lock(&SH);
        n = size - off;
    }
    uint32_t me = epoch_of(x->agent, x->vc.c[x->agent]);
    uint32_t prev = 0;
    int prev_wrote = 0;
    size_t first = 0, last = 0;
    /* Neighbouring granules usually hold the same history (one op wrote
     * them all): the same state before gives the same verdict and the same
     * state after, so it is worked out once per run of equal granules. */
    cell before = { 0, { 0, 0, 0, 0 } }, after = before;
    int have = 0;
    for (size_t i = off / GRANULE; i <= (off + n - 1) / GRANULE; i++) {
        cell *c = &a->shadow[i];
        if (have && !memcmp(c, &before, sizeof *c)) {
            if (prev) last = i * GRANULE;
            *c = after;
            continue;
        }
        before = *c;
        have = 1;
        if (!prev) {
            if (!ordered(c->w, &x->vc)) { prev = c->w; prev_wrote = 1; first = i * GRANULE; }
            else if (write)
                for (int k = 0; k < 4; k++)
                    if (!ordered(c->r[k], &x->vc)) { prev = c->r[k]; first = i * GRANULE; break; }
        }
        if (prev) last = i * GRANULE;
        if (write) {
            c->w = me;
            memset(c->r, 0, sizeof c->r);
        } else {
            int slot = -1;
            for (int k = 0; k < 4 && slot < 0; k++)
                if (c->r[k] >> CLOCK_BITS == (uint32_t)x->agent) slot = k;
            for (int k = 0; k < 4 && slot < 0; k++)
                if (ordered(c->r[k], &x->vc)) slot = k; /* an empty slot or a read this one follows */
            c->r[slot < 0 ? 0 : slot] = me;
        }
        after = *c;
    }
    last += GRANULE - 1;
    int id = a->id;
    int fresh = prev && !(me == last_race_me && prev == last_race_prev);
    if (fresh) { last_race_me = me; last_race_prev = prev; }
    pthread_mutex_unlock(&SH);
    if (fresh) {
        char then[160];
        pthread_mutex_lock(&L);
        describe(prev, then, sizeof then);
        pthread_mutex_unlock(&L);
        emu_finding("RACE",
                    "%s (%s) %s bytes [%zu, %zu] of device allocation #%d, which %s %s; no stream order, event, host "
                    "synchronisation or communicator orders the two",
                    x->label, agents[x->agent].name, write ? "writes" : "reads", first, last, id, then,
                    prev_wrote ? "wrote" : "read");
    }
}

void cudaEmuAccess(const void *p, size_t bytes, int write) { access_range(p, bytes, write); }

/* ---- streams ---- */

typedef enum { OP_KERNEL, OP_MEMCPY, OP_MEMSET, OP_RECORD, OP_WAIT, OP_HOSTFN, OP_COLL, OP_GRAPH } op_kind;
typedef struct op {
    struct op *next;
    op_kind kind;
    char label[80];
    vclock host_vc; /* what the host had seen when it issued the op */
    void (*body)(const void *);
    void *args;
    size_t argbytes;
    void *dst;
    const void *src;
    size_t bytes;
    int value, src_dev, dst_dev;
    void *staging; /* pageable host bytes copied at issue */
    struct CUevent_st *ev;
    uint64_t gen;
    cudaHostFn_t fn;
    void *user;
    emu_coll coll;
    struct CUgraphExec_st *gx;
    uint64_t *seqs;
} op;

typedef struct {
    op *o; /* never run itself: copied into each launch */
    int lane;
    int *deps, ndeps;
} gnode;

struct capture {
    cudaStream_t origin;
    cudaStreamCaptureMode mode;
    pthread_t thread;
    gnode *nodes;
    int n, cap;
    cudaError_t invalid;
    cudaStream_t members[MAX_MEMBERS];
    int nmembers;
    uint64_t id; /* events name their capture by it: a freed capture's address may come back */
};
static uint64_t next_capture_id;

struct CUstream_st {
    int agent;
    unsigned flags;
    int priority, legacy;
    op *head, *tail;
    uint64_t issued, done;
    int busy, quit;
    vclock vc;
    pthread_t th;
    pthread_cond_t work; /* its worker waits here for ops, not on the shared condition */
    unsigned rng;
    struct capture *cap;
    int *front, nfront;
};

struct CUevent_st {
    unsigned flags;
    uint64_t issued;
    struct {
        uint64_t gen;
        int done, agent; /* the recording stream */
        vclock vc;
        double t;
    } h[EV_HIST];
    uint64_t cap_id; /* recorded last inside the capture of this id (0: outside any) */
    int *capnodes, ncap;
    int refs, destroyed; /* queued records and waits naming it; cudaEventDestroy called */
};

struct CUgraph_st {
    gnode *nodes;
    int n, nlanes;
    char lane_names[MAX_MEMBERS][48];
};

struct CUgraphExec_st {
    gnode *nodes;
    int n, nlanes;
    int lane_agent[MAX_MEMBERS];
    int refs, destroyed; /* queued launches; cudaGraphExecDestroy called */
};

static cudaStream_t streams[256];
static int nstreams;
static cudaStream_t legacy;
static __thread cudaError_t last_error;
static struct capture *captures[8];
static int ncaptures;

static void *worker(void *arg);

static cudaStream_t make_stream(unsigned flags, int priority, int is_legacy) /* under L */
{
    if (nstreams >= (int)(sizeof streams / sizeof *streams)) return NULL;
    cudaStream_t s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->agent = new_agent(is_legacy ? "legacy stream" : "stream %d (priority %d%s)", nstreams, priority,
                         flags & cudaStreamNonBlocking ? ", non-blocking" : ", blocking");
    if (s->agent < 0) { free(s); return NULL; }
    s->flags = flags;
    s->priority = priority;
    s->legacy = is_legacy;
    s->rng = g_seed * 1000003u + (unsigned)g_rank * 7919u + (unsigned)s->agent * 104729u;
    pthread_cond_init(&s->work, NULL);
    if (pthread_create(&s->th, NULL, worker, s) != 0) { free(s); return NULL; }
    pthread_detach(s->th);
    streams[nstreams++] = s;
    return s;
}

static cudaStream_t resolve(cudaStream_t s) /* under L: NULL is the legacy stream */
{
    if (s) return s;
    if (!legacy) legacy = make_stream(0, 0, 1);
    return legacy;
}

static unsigned next_rand(unsigned *r)
{
    *r = *r * 1103515245u + 12345u;
    return (*r >> 8) & 0xffffffu;
}

static void jitter(unsigned *rng)
{
    if (g_max_delay_us <= 0) return;
    unsigned r = next_rand(rng);
    if (r % 3 == 0) return;
    struct timespec ts = { 0, (long)(r % (unsigned)g_max_delay_us) * 1000L };
    nanosleep(&ts, NULL);
}

/* The capture the calling thread is in, where CUDA would refuse an unsafe call. */
static struct capture *capture_of_thread(void) /* under L */
{
    for (int i = 0; i < ncaptures; i++) {
        struct capture *c = captures[i];
        if (c->mode == cudaStreamCaptureModeGlobal ||
            (c->mode == cudaStreamCaptureModeThreadLocal && pthread_equal(c->thread, pthread_self())))
            return c;
    }
    return NULL;
}

static void invalidate(struct capture *c, cudaError_t why) /* under L */
{
    if (!c->invalid) c->invalid = why;
}

/* Calls CUDA refuses while this thread captures: the capture is invalidated. */
static cudaError_t unsafe(const char *what)
{
    pthread_mutex_lock(&L);
    struct capture *c = capture_of_thread();
    if (c) invalidate(c, cudaErrorStreamCaptureUnsupported);
    pthread_mutex_unlock(&L);
    if (!c) return cudaSuccess;
    emu_finding("CAPTURE", "%s while a stream capture is under way (CUDA answers cudaErrorStreamCaptureUnsupported "
                "and invalidates the capture); do it before cudaStreamBeginCapture", what);
    return cudaErrorStreamCaptureUnsupported;
}

/* API entry: a CUDA call from inside a host function is forbidden. */
static int from_host_fn(const char *what)
{
    configure();
    if (cur && cur->in_hostfn) {
        emu_finding("RULE", "%s called from a host function (cudaLaunchHostFunc): CUDA forbids CUDA calls there", what);
        return 1;
    }
    return 0;
}
#define ENTER(what)                                                                                                    \
    do {                                                                                                               \
        if (from_host_fn(what)) return cudaErrorNotPermitted;                                                          \
    } while (0)

static op *new_op(op_kind k, const char *label)
{
    op *o = calloc(1, sizeof *o);
    if (o) {
        o->kind = k;
        snprintf(o->label, sizeof o->label, "%s", label);
    }
    return o;
}

static void free_op(op *o)
{
    if (!o) return;
    free(o->args);
    free(o->staging);
    free(o->seqs);
    free(o);
}

static void free_nodes(gnode *nodes, int n);

/* CUDA defers destroying an event or graph still named by queued work: so does this. */
static void maybe_free_event(struct CUevent_st *e) /* under L */
{
    if (!e->destroyed || e->refs) return;
    free(e->capnodes);
    free(e);
}
static void maybe_free_exec(struct CUgraphExec_st *x) /* under L */
{
    if (!x->destroyed || x->refs) return;
    free_nodes(x->nodes, x->n);
    free(x);
}
static void release_refs(op *o) /* under L: o has run */
{
    if (o->ev) { o->ev->refs--; maybe_free_event(o->ev); }
    if (o->gx) { o->gx->refs--; maybe_free_exec(o->gx); }
}

static cudaError_t add_node(struct capture *c, cudaStream_t s, op *o) /* under L */
{
    if (c->invalid) { free_op(o); return cudaErrorStreamCaptureInvalidated; }
    int lane = -1;
    for (int i = 0; i < c->nmembers; i++)
        if (c->members[i] == s) lane = i;
    if (lane < 0) { free_op(o); return cudaErrorUnknown; }
    if (c->n == c->cap) {
        int cap = c->cap ? 2 * c->cap : 64;
        gnode *p = realloc(c->nodes, (size_t)cap * sizeof *p);
        if (!p) { free_op(o); return cudaErrorMemoryAllocation; }
        c->nodes = p;
        c->cap = cap;
    }
    gnode *g = &c->nodes[c->n];
    g->o = o;
    g->lane = lane;
    g->ndeps = s->nfront;
    g->deps = s->nfront ? malloc((size_t)s->nfront * sizeof *g->deps) : NULL;
    if (s->nfront && !g->deps) { free_op(o); return cudaErrorMemoryAllocation; }
    if (s->nfront) memcpy(g->deps, s->front, (size_t)s->nfront * sizeof *g->deps);
    int *f = realloc(s->front, sizeof *f);
    if (!f) return cudaErrorMemoryAllocation;
    s->front = f;
    s->front[0] = c->n++;
    s->nfront = 1;
    return cudaSuccess;
}

static void push(cudaStream_t s, op *o) /* under L */
{
    o->host_vc = host_vc;
    if (o->ev) o->ev->refs++;
    if (o->gx) o->gx->refs++;
    if (s->tail) s->tail->next = o;
    else s->head = o;
    s->tail = o;
    s->issued++;
    pthread_cond_signal(&s->work);
}

static cudaError_t record_on(cudaStream_t s, struct CUevent_st *e, const char *label); /* under L */
static cudaError_t wait_on(cudaStream_t s, struct CUevent_st *e, const char *label);   /* under L */

/* The legacy stream and blocking streams wait for each other's earlier work. */
static struct CUevent_st legacy_events[256];
static int in_implicit; /* under L: the ordering records and waits add none of their own */
static void implicit_sync(cudaStream_t s) /* under L, s not capturing */
{
    if (in_implicit) return;
    in_implicit = 1;
    if (s->legacy) {
        for (int i = 0; i < nstreams; i++) {
            cudaStream_t b = streams[i];
            if (b == s || b->legacy || (b->flags & cudaStreamNonBlocking) || b->issued == b->done) continue;
            record_on(b, &legacy_events[i], "legacy-stream ordering (record)");
            wait_on(s, &legacy_events[i], "legacy-stream ordering (wait)");
        }
    } else if (!(s->flags & cudaStreamNonBlocking) && legacy && legacy->issued != legacy->done) {
        static struct CUevent_st before_blocking;
        record_on(legacy, &before_blocking, "legacy-stream ordering (record)");
        wait_on(s, &before_blocking, "legacy-stream ordering (wait)");
    }
    in_implicit = 0;
}

/* Enqueue o on s, or record it into s's capture. */
static cudaError_t submit(cudaStream_t s, op *o) /* under L */
{
    if (!o) return cudaErrorMemoryAllocation;
    if (s->cap) return add_node(s->cap, s, o);
    if (s->legacy) {
        struct capture *c = capture_of_thread();
        if (c) {
            invalidate(c, cudaErrorStreamCaptureImplicit);
            free_op(o);
            return cudaErrorStreamCaptureImplicit;
        }
    }
    if (sticky) { free_op(o); return sticky; }
    implicit_sync(s);
    push(s, o);
    return cudaSuccess;
}

static cudaError_t enqueue(cudaStream_t s, op *o, const char *api)
{
    pthread_mutex_lock(&L);
    s = resolve(s);
    int capturing = s && s->cap != NULL;
    pthread_mutex_unlock(&L);
    if (!s) { free_op(o); return cudaErrorMemoryAllocation; }
    if (capturing && emu_fault("alloc_in_capture")) { /* as if the runtime allocated lazily here */
        void *p = NULL;
        if (cudaMalloc(&p, 256) == cudaSuccess) cudaFree(p);
    }
    (void)api;
    pthread_mutex_lock(&L);
    cudaError_t e = submit(s, o);
    pthread_mutex_unlock(&L);
    return e;
}

/* ---- running ops ---- */

static void run_graph(struct CUgraphExec_st *gx, const uint64_t *seqs, exec_ctx *x);

static void run_op(op *o, exec_ctx *x)
{
    __atomic_add_fetch(&n_ops, 1, __ATOMIC_RELAXED);
    switch (o->kind) {
    case OP_KERNEL:
        __atomic_add_fetch(&n_kernels, 1, __ATOMIC_RELAXED);
        cur = x;
        o->body(o->args);
        cur = NULL;
        break;
    case OP_MEMCPY:
        cur = x;
        if (o->src_dev) access_range(o->src, o->bytes, 0);
        if (o->dst_dev) access_range(o->dst, o->bytes, 1);
        cur = NULL;
        memmove(o->dst, o->staging ? o->staging : o->src, o->bytes);
        break;
    case OP_MEMSET:
        cur = x;
        access_range(o->dst, o->bytes, 1);
        cur = NULL;
        memset(o->dst, o->value, o->bytes);
        break;
    case OP_RECORD: {
        pthread_mutex_lock(&L);
        struct CUevent_st *e = o->ev;
        int k = (int)(o->gen % EV_HIST);
        if (e->h[k].gen == o->gen) {
            e->h[k].vc = x->vc;
            e->h[k].agent = x->agent;
            e->h[k].t = emu_now();
            e->h[k].done = 1;
        }
        pthread_cond_broadcast(&CV);
        pthread_mutex_unlock(&L);
        break;
    }
    case OP_WAIT: {
        pthread_mutex_lock(&L);
        struct CUevent_st *e = o->ev;
        int k = (int)(o->gen % EV_HIST);
        if (o->value) { /* a seeded fault removed this wait: did it order anything? */
            /* Keep real time as the wait would (the data stay right), so only
             * the race detector can tell: the order is what was removed. */
            while (e->h[k].gen == o->gen && !e->h[k].done) pthread_cond_wait(&CV, &L);
            /* Judged at the next op of this stream, after all its waits. */
            int ra = e->h[k].agent;
            x->lost = e->h[k].vc;
            x->has_lost = 1;
            __atomic_add_fetch(&g_lost_pending, 1, __ATOMIC_RELAXED);
            snprintf(x->lost_what, sizeof x->lost_what, "?");
            if (e->h[k].gen == o->gen) describe(epoch_of(ra, e->h[k].vc.c[ra]), x->lost_what, sizeof x->lost_what);
            pthread_mutex_unlock(&L);
            break;
        }
        while (e->h[k].gen == o->gen && !e->h[k].done) pthread_cond_wait(&CV, &L);
        if (e->h[k].gen == o->gen) vc_join(&x->vc, &e->h[k].vc);
        else /* overwritten by a much later record, which follows this one */
            for (int i = 0; i < EV_HIST; i++) if (e->h[i].done) vc_join(&x->vc, &e->h[i].vc);
        pthread_mutex_unlock(&L);
        break;
    }
    case OP_HOSTFN:
        cur = x;
        x->in_hostfn = 1;
        o->fn(o->user);
        x->in_hostfn = 0;
        cur = NULL;
        break;
    case OP_COLL:
        __atomic_add_fetch(&n_colls, 1, __ATOMIC_RELAXED);
        cur = x;
        emu_coll_run(&o->coll, o->label);
        cur = NULL;
        break;
    case OP_GRAPH:
        __atomic_add_fetch(&n_graph_launches, 1, __ATOMIC_RELAXED);
        run_graph(o->gx, o->seqs, x);
        break;
    }
}

static void *worker(void *arg)
{
    cudaStream_t s = arg;
    exec_ctx x;
    memset(&x, 0, sizeof x);
    pthread_mutex_lock(&L);
    for (;;) {
        while (!s->head && !s->quit) pthread_cond_wait(&s->work, &L);
        if (!s->head) break;
        op *o = s->head;
        s->head = o->next;
        if (!s->head) s->tail = NULL;
        s->busy = 1;
        vc_join(&s->vc, &o->host_vc);
        /* Records and waits touch no memory: only ops that do take a tick,
         * so an event's clock names the last access it covers. */
        if (o->kind != OP_RECORD && o->kind != OP_WAIT) tick(&s->vc, s->agent, o->label);
        x.agent = s->agent;
        x.vc = s->vc;
        x.label = o->label;
        if (x.has_lost && o->kind != OP_RECORD && o->kind != OP_WAIT) {
            /* The first op after a removed wait: do its other waits (or NCCL's
             * order of a communicator's ops) order it after that work anyway? */
            int vacuous = 1;
            for (int i = 0; vacuous && i < MAX_AGENTS; i++) vacuous = x.lost.c[i] <= x.vc.c[i];
            x.has_lost = 0;
            __atomic_sub_fetch(&g_lost_pending, 1, __ATOMIC_RELAXED);
            fprintf(stderr, "commplan-emu: rank %d: seeded fault: %s %s no longer waits for %s%s\n", g_rank,
                    o->label, agents[s->agent].name, x.lost_what,
                    vacuous ? ", but it is ordered after it anyway: the removed wait was vacuous" : "");
            if (vacuous) g_fault_vacuous = 1;
        }
        int skip = sticky != cudaSuccess && o->kind != OP_RECORD && o->kind != OP_WAIT;
        pthread_mutex_unlock(&L);
        jitter(&s->rng);
        if (!skip) run_op(o, &x);
        pthread_mutex_lock(&L);
        vc_join(&s->vc, &x.vc);
        s->busy = 0;
        s->done++;
        pthread_cond_broadcast(&CV);
        release_refs(o);
        free_op(o);
    }
    pthread_mutex_unlock(&L);
    return NULL;
}

/* ---- graph replay: a lane per captured stream, nodes after their edges ---- */

typedef struct {
    struct CUgraphExec_st *gx;
    const uint64_t *seqs;
    vclock launch_vc;
    vclock *node_vc;
    char *done;
    int lane;
    unsigned rng;
} lane_run;

static void *lane_main(void *arg)
{
    lane_run *lr = arg;
    struct CUgraphExec_st *gx = lr->gx;
    for (int i = 0; i < gx->n; i++) {
        gnode *g = &gx->nodes[i];
        if (g->lane != lr->lane) continue;
        exec_ctx x;
        memset(&x, 0, sizeof x);
        pthread_mutex_lock(&L);
        for (int d = 0; d < g->ndeps; d++)
            while (!lr->done[g->deps[d]]) pthread_cond_wait(&CV, &L);
        x.vc = lr->launch_vc;
        for (int d = 0; d < g->ndeps; d++) vc_join(&x.vc, &lr->node_vc[g->deps[d]]);
        x.agent = gx->lane_agent[g->lane];
        char label[80];
        snprintf(label, sizeof label, "%s [graph]", g->o->label);
        tick(&x.vc, x.agent, label);
        x.label = g->o->label;
        pthread_mutex_unlock(&L);
        jitter(&lr->rng);
        op copy = *g->o; /* each launch its own collective numbers */
        copy.coll.seq = lr->seqs[i];
        copy.args = g->o->args;
        run_op(&copy, &x);
        pthread_mutex_lock(&L);
        lr->node_vc[i] = x.vc;
        lr->done[i] = 1;
        pthread_cond_broadcast(&CV);
        pthread_mutex_unlock(&L);
    }
    return NULL;
}

static void run_graph(struct CUgraphExec_st *gx, const uint64_t *seqs, exec_ctx *x)
{
    lane_run lr[MAX_MEMBERS];
    pthread_t th[MAX_MEMBERS];
    vclock *node_vc = calloc((size_t)(gx->n ? gx->n : 1), sizeof *node_vc);
    char *done = calloc((size_t)(gx->n ? gx->n : 1), 1);
    if (!node_vc || !done) {
        free(node_vc);
        free(done);
        emu_finding("RULE", "out of host memory replaying a graph");
        return;
    }
    for (int l = 0; l < gx->nlanes; l++) {
        lr[l] = (lane_run){ gx, seqs, x->vc, node_vc, done, l, g_seed * 31u + (unsigned)l };
        if (pthread_create(&th[l], NULL, lane_main, &lr[l]) != 0) {
            lane_main(&lr[l]);
            th[l] = 0;
        }
    }
    for (int l = 0; l < gx->nlanes; l++)
        if (th[l]) pthread_join(th[l], NULL);
    for (int i = 0; i < gx->n; i++) vc_join(&x->vc, &node_vc[i]);
    free(node_vc);
    free(done);
}

/* ---- the API ---- */

static const struct {
    cudaError_t e;
    const char *s;
} error_names[] = {
    { cudaSuccess, "no error" },
    { cudaErrorInvalidValue, "invalid argument" },
    { cudaErrorMemoryAllocation, "out of memory" },
    { cudaErrorInitializationError, "initialization error" },
    { cudaErrorInvalidConfiguration, "invalid configuration argument" },
    { cudaErrorNoDevice, "no CUDA-capable device is detected" },
    { cudaErrorInvalidDevice, "invalid device ordinal" },
    { cudaErrorInvalidResourceHandle, "invalid resource handle" },
    { cudaErrorNotReady, "device not ready" },
    { cudaErrorIllegalAddress, "an illegal memory access was encountered" },
    { cudaErrorLaunchFailure, "unspecified launch failure" },
    { cudaErrorNotPermitted, "operation not permitted" },
    { cudaErrorNotSupported, "operation not supported" },
    { cudaErrorStreamCaptureUnsupported, "operation not permitted when stream is capturing" },
    { cudaErrorStreamCaptureInvalidated, "operation failed due to a previous error during capture" },
    { cudaErrorStreamCaptureUnjoined, "capture was not joined back into the origin stream" },
    { cudaErrorStreamCaptureIsolation, "dependency created on uncaptured work in another stream" },
    { cudaErrorStreamCaptureImplicit, "operation would make the legacy stream depend on a capturing blocking stream" },
    { cudaErrorCapturedEvent, "operation not permitted on an event last recorded in a capturing stream" },
    { cudaErrorStreamCaptureWrongThread, "attempt to terminate a thread-local capture sequence from another thread" },
};

const char *cudaGetErrorString(cudaError_t e)
{
    for (size_t i = 0; i < sizeof error_names / sizeof *error_names; i++)
        if (error_names[i].e == e) return error_names[i].s;
    return "unrecognized error code";
}

cudaError_t cudaGetLastError(void)
{
    cudaError_t e = last_error ? last_error : sticky;
    last_error = cudaSuccess;
    return e;
}

cudaError_t cudaGetDeviceCount(int *n)
{
    ENTER("cudaGetDeviceCount");
    const char *d = getenv("COMMPLAN_EMU_DEVICES");
    *n = d ? atoi(d) : 8;
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int device)
{
    ENTER("cudaSetDevice");
    int n;
    cudaGetDeviceCount(&n);
    return device >= 0 && device < n ? cudaSuccess : cudaErrorInvalidDevice;
}

cudaError_t cudaDeviceGetStreamPriorityRange(int *least, int *greatest)
{
    ENTER("cudaDeviceGetStreamPriorityRange");
    *least = 0;
    *greatest = -5;
    return cudaSuccess;
}

static int idle(cudaStream_t s) { return s->issued == s->done && !s->busy; }

cudaError_t cudaDeviceSynchronize(void)
{
    ENTER("cudaDeviceSynchronize");
    cudaError_t e = unsafe("cudaDeviceSynchronize");
    if (e) return e;
    pthread_mutex_lock(&L);
    for (int i = 0; i < nstreams; i++) {
        while (!idle(streams[i])) pthread_cond_wait(&CV, &L);
        vc_join(&host_vc, &streams[i]->vc);
    }
    e = sticky;
    pthread_mutex_unlock(&L);
    return e;
}

static cudaError_t register_alloc(void *p, size_t bytes, int device)
{
    pthread_mutex_lock(&SH);
    if (nallocs == allocs_cap) {
        int cap = allocs_cap ? 2 * allocs_cap : 64;
        alloc_t *a = realloc(allocs, (size_t)cap * sizeof *a);
        if (!a) { pthread_mutex_unlock(&SH); return cudaErrorMemoryAllocation; }
        allocs = a;
        allocs_cap = cap;
    }
    cell *sh = NULL;
    if (device && !(sh = calloc(bytes / GRANULE + 1, sizeof *sh))) { pthread_mutex_unlock(&SH); return cudaErrorMemoryAllocation; }
    allocs[nallocs++] = (alloc_t){ p, bytes, sh, next_alloc_id++ };
    pthread_mutex_unlock(&SH);
    return cudaSuccess;
}

static int unregister_alloc(void *p, int device)
{
    pthread_mutex_lock(&SH);
    for (int i = 0; i < nallocs; i++)
        if (allocs[i].base == p && (allocs[i].shadow != NULL) == device) {
            free(allocs[i].shadow);
            allocs[i] = allocs[--nallocs];
            pthread_mutex_unlock(&SH);
            return 1;
        }
    pthread_mutex_unlock(&SH);
    return 0;
}

cudaError_t cudaMalloc(void **p, size_t bytes)
{
    ENTER("cudaMalloc");
    cudaError_t e = unsafe("cudaMalloc");
    if (e) return e;
    /* 256-byte aligned, as cudaMalloc's; uninitialised bytes are not zeros. */
    void *m = NULL;
    if (posix_memalign(&m, 256, bytes ? bytes : 1) != 0) return cudaErrorMemoryAllocation;
    memset(m, 0xA5, bytes);
    if ((e = register_alloc(m, bytes, 1)) != cudaSuccess) { free(m); return e; }
    *p = m;
    return cudaSuccess;
}

cudaError_t cudaFree(void *p)
{
    ENTER("cudaFree");
    if (!p) return cudaSuccess;
    cudaError_t e = unsafe("cudaFree");
    if (e) return e;
    /* cudaFree waits for the device: nothing may still use the bytes. */
    pthread_mutex_lock(&L);
    int capturing = capture_of_thread() != NULL;
    pthread_mutex_unlock(&L);
    if (!capturing) cudaDeviceSynchronize();
    if (!unregister_alloc(p, 1)) return cudaErrorInvalidValue;
    free(p);
    return cudaSuccess;
}

cudaError_t cudaMallocHost(void **p, size_t bytes)
{
    ENTER("cudaMallocHost");
    cudaError_t e = unsafe("cudaMallocHost");
    if (e) return e;
    void *m = malloc(bytes ? bytes : 1);
    if (!m) return cudaErrorMemoryAllocation;
    if ((e = register_alloc(m, bytes, 0)) != cudaSuccess) { free(m); return e; }
    *p = m;
    return cudaSuccess;
}

cudaError_t cudaFreeHost(void *p)
{
    ENTER("cudaFreeHost");
    if (!p) return cudaSuccess;
    cudaError_t e = unsafe("cudaFreeHost");
    if (e) return e;
    cudaDeviceSynchronize();
    if (!unregister_alloc(p, 0)) return cudaErrorInvalidValue;
    free(p);
    return cudaSuccess;
}

static cudaError_t memcpy_op(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind, op **out)
{
    int sd = emu_is_device(src, bytes), dd = emu_is_device(dst, bytes);
    int want_sd = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
    int want_dd = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
    if (kind != cudaMemcpyDefault && (sd != want_sd || dd != want_dd)) {
        emu_finding("ILLEGAL", "cudaMemcpy of %zu bytes from %s %p to %s %p with kind %d: the pointers are not what the "
                    "kind says (or the range runs past its allocation)", bytes, sd ? "device" : "host", src,
                    dd ? "device" : "host", dst, (int)kind);
        return cudaErrorInvalidValue;
    }
    char label[80];
    snprintf(label, sizeof label, "cudaMemcpy %s->%s %zu B", sd ? "device" : "host", dd ? "device" : "host", bytes);
    op *o = new_op(OP_MEMCPY, label);
    if (!o) return cudaErrorMemoryAllocation;
    o->dst = dst;
    o->src = src;
    o->bytes = bytes;
    o->src_dev = sd;
    o->dst_dev = dd;
    *out = o;
    return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind, cudaStream_t s)
{
    ENTER("cudaMemcpyAsync");
    op *o = NULL;
    cudaError_t e = memcpy_op(dst, src, bytes, kind, &o);
    if (e) return e;
    if ((!o->src_dev && !is_pinned(src)) || (!o->dst_dev && !is_pinned(dst))) {
        pthread_mutex_lock(&L);
        int capturing = resolve(s)->cap != NULL;
        pthread_mutex_unlock(&L);
        if (capturing) {
            free_op(o);
            e = unsafe("cudaMemcpyAsync with pageable host memory");
            return e ? e : cudaErrorStreamCaptureUnsupported;
        }
    }
    /* From pageable memory the bytes are taken at the call (CUDA stages them). */
    if (!o->src_dev && !is_pinned(src)) {
        if (!(o->staging = malloc(bytes ? bytes : 1))) { free_op(o); return cudaErrorMemoryAllocation; }
        memcpy(o->staging, src, bytes);
    }
    return enqueue(s, o, "cudaMemcpyAsync");
}

static cudaError_t sync_stream(cudaStream_t s)
{
    pthread_mutex_lock(&L);
    s = resolve(s);
    while (!idle(s)) pthread_cond_wait(&CV, &L);
    vc_join(&host_vc, &s->vc);
    cudaError_t e = sticky;
    pthread_mutex_unlock(&L);
    return e;
}

/* On the legacy stream. To the device from pageable memory it returns once
 * the bytes are staged, before they land (as CUDA's); otherwise it waits. */
cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind)
{
    ENTER("cudaMemcpy");
    cudaError_t e = unsafe("cudaMemcpy");
    if (e) return e;
    op *o = NULL;
    if ((e = memcpy_op(dst, src, bytes, kind, &o))) return e;
    int async = !o->src_dev && o->dst_dev && !is_pinned(src);
    if (async) {
        if (!(o->staging = malloc(bytes ? bytes : 1))) { free_op(o); return cudaErrorMemoryAllocation; }
        memcpy(o->staging, src, bytes);
    }
    if ((e = enqueue(NULL, o, "cudaMemcpy"))) return e;
    return async ? cudaSuccess : sync_stream(NULL);
}

/* On the legacy stream, returning before the bytes are set (device memory). */
/* A memset of device bytes queued on stream s (NULL: the legacy stream). */
static cudaError_t memset_on(void *p, int value, size_t bytes, cudaStream_t s, const char *what)
{
    if (!emu_is_device(p, bytes)) {
        emu_finding("ILLEGAL", "%s of %zu bytes at %p: not inside one device allocation", what, bytes, p);
        return cudaErrorInvalidValue;
    }
    op *o = new_op(OP_MEMSET, what);
    if (!o) return cudaErrorMemoryAllocation;
    o->dst = p;
    o->value = value;
    o->bytes = bytes;
    return enqueue(s, o, what);
}

cudaError_t cudaMemset(void *p, int value, size_t bytes)
{
    ENTER("cudaMemset");
    cudaError_t e = unsafe("cudaMemset");
    if (e) return e;
    return memset_on(p, value, bytes, NULL, "cudaMemset");
}

/* On stream s (capturable, as CUDA's: a memset node). */
cudaError_t cudaMemsetAsync(void *p, int value, size_t bytes, cudaStream_t s)
{
    ENTER("cudaMemsetAsync");
    return memset_on(p, value, bytes, s, "cudaMemsetAsync");
}

cudaError_t cudaStreamCreateWithPriority(cudaStream_t *s, unsigned flags, int priority)
{
    ENTER("cudaStreamCreate");
    configure();
    pthread_mutex_lock(&L);
    *s = make_stream(flags, priority, 0);
    pthread_mutex_unlock(&L);
    return *s ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags) { return cudaStreamCreateWithPriority(s, flags, 0); }
cudaError_t cudaStreamCreate(cudaStream_t *s) { return cudaStreamCreateWithPriority(s, 0, 0); }

cudaError_t cudaStreamDestroy(cudaStream_t s)
{
    ENTER("cudaStreamDestroy");
    if (!s) return cudaErrorInvalidResourceHandle;
    /* CUDA lets queued work finish; the worker stays for it, then idles. */
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
    ENTER("cudaStreamSynchronize");
    pthread_mutex_lock(&L);
    int capturing = resolve(s)->cap != NULL;
    pthread_mutex_unlock(&L);
    if (capturing) {
        cudaError_t e = unsafe("cudaStreamSynchronize on a capturing stream");
        return e ? e : cudaErrorStreamCaptureUnsupported;
    }
    return sync_stream(s);
}

cudaError_t cudaStreamQuery(cudaStream_t s)
{
    ENTER("cudaStreamQuery");
    pthread_mutex_lock(&L);
    s = resolve(s);
    cudaError_t e;
    if (s->cap) e = cudaErrorStreamCaptureUnsupported;
    else if (!idle(s)) e = cudaErrorNotReady;
    else {
        vc_join(&host_vc, &s->vc); /* a query that answers "done" orders the host after the work */
        e = sticky;
    }
    pthread_mutex_unlock(&L);
    if (e == cudaErrorStreamCaptureUnsupported) unsafe("cudaStreamQuery on a capturing stream");
    return e;
}

static cudaError_t record_on(cudaStream_t s, struct CUevent_st *e, const char *label) /* under L */
{
    if (s->cap) {
        if (s->cap->invalid) return cudaErrorStreamCaptureInvalidated;
        free(e->capnodes);
        e->capnodes = s->nfront ? malloc((size_t)s->nfront * sizeof(int)) : NULL;
        if (s->nfront && !e->capnodes) return cudaErrorMemoryAllocation;
        if (s->nfront) memcpy(e->capnodes, s->front, (size_t)s->nfront * sizeof(int));
        e->ncap = s->nfront;
        e->cap_id = s->cap->id;
        return cudaSuccess;
    }
    op *o = new_op(OP_RECORD, label);
    if (!o) return cudaErrorMemoryAllocation;
    uint64_t g = ++e->issued;
    int k = (int)(g % EV_HIST);
    e->h[k].gen = g;
    e->h[k].done = 0;
    e->cap_id = 0;
    o->ev = e;
    o->gen = g;
    return submit(s, o);
}

static cudaError_t wait_on(cudaStream_t s, struct CUevent_st *e, const char *label) /* under L */
{
    if (e->cap_id) {
        struct capture *c = NULL;
        for (int i = 0; i < ncaptures; i++)
            if (captures[i]->id == e->cap_id) c = captures[i];
        if (!c) {
            emu_finding("CAPTURE", "%s on an event last recorded inside a capture that has ended: its graph does not "
                        "record the event, so the wait orders nothing", label);
            return cudaErrorStreamCaptureIsolation;
        }
        if (c->invalid) return cudaErrorStreamCaptureInvalidated;
        if (!s->cap) { /* the stream joins the capture (a fork) */
            if (c->nmembers == MAX_MEMBERS) return cudaErrorNotSupported;
            c->members[c->nmembers++] = s;
            s->cap = c;
            free(s->front);
            s->front = NULL;
            s->nfront = 0;
        } else if (s->cap != c) {
            invalidate(c, cudaErrorStreamCaptureIsolation);
            return cudaErrorStreamCaptureIsolation;
        }
        int *f = realloc(s->front, (size_t)(s->nfront + e->ncap + 1) * sizeof *f);
        if (!f) return cudaErrorMemoryAllocation;
        s->front = f;
        for (int i = 0; i < e->ncap; i++) {
            int dup = 0;
            for (int j = 0; j < s->nfront; j++) dup |= s->front[j] == e->capnodes[i];
            if (!dup) s->front[s->nfront++] = e->capnodes[i];
        }
        return cudaSuccess;
    }
    if (s->cap) {
        if (e->issued == 0) return cudaSuccess; /* never recorded: nothing to wait for */
        emu_finding("CAPTURE", "%s inside a capture on an event recorded before it: the graph keeps no such "
                    "dependency, so a replay is not ordered after that work", label);
        invalidate(s->cap, cudaErrorStreamCaptureIsolation);
        return cudaErrorStreamCaptureIsolation;
    }
    if (e->issued == 0) return cudaSuccess;
    op *o = new_op(OP_WAIT, label);
    if (!o) return cudaErrorMemoryAllocation;
    o->ev = e;
    o->gen = e->issued; /* the record issued last before this call */
    return submit(s, o);
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags)
{
    ENTER("cudaEventCreate");
    *e = calloc(1, sizeof **e);
    if (!*e) return cudaErrorMemoryAllocation;
    (*e)->flags = flags;
    return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t *e) { return cudaEventCreateWithFlags(e, cudaEventDefault); }

cudaError_t cudaEventDestroy(cudaEvent_t e)
{
    ENTER("cudaEventDestroy");
    if (!e) return cudaErrorInvalidResourceHandle;
    pthread_mutex_lock(&L);
    e->destroyed = 1;
    maybe_free_event(e);
    pthread_mutex_unlock(&L);
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s)
{
    ENTER("cudaEventRecord");
    if (!e) return cudaErrorInvalidResourceHandle;
    pthread_mutex_lock(&L);
    cudaError_t r = record_on(resolve(s), e, "cudaEventRecord");
    pthread_mutex_unlock(&L);
    return r;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags)
{
    ENTER("cudaStreamWaitEvent");
    if (!e || flags) return cudaErrorInvalidValue;
    /* drop_wait: as if the runtime had not issued this wait; reuse_event: as
     * if its event slot had been recorded again, on the waiting stream,
     * before the wait. Either way a marker (no waiting) says at run time
     * whether the lost wait ordered anything. */
    int drop = emu_fault("drop_wait"), reuse = !drop && emu_fault("reuse_event");
    pthread_mutex_lock(&L);
    cudaStream_t rs = resolve(s);
    cudaError_t r = cudaSuccess;
    if ((drop || reuse) && !rs->cap && e->issued) {
        op *o = new_op(OP_WAIT, "seeded fault: the lost wait");
        if (!o) r = cudaErrorMemoryAllocation;
        else {
            o->ev = e;
            o->gen = e->issued;
            o->value = 1;
            r = submit(rs, o);
        }
    }
    if (!r && reuse) r = record_on(rs, e, "cudaEventRecord (seeded fault: the slot reused)");
    if (!r && !drop) r = wait_on(rs, e, "cudaStreamWaitEvent");
    pthread_mutex_unlock(&L);
    return r;
}

cudaError_t cudaEventSynchronize(cudaEvent_t e)
{
    ENTER("cudaEventSynchronize");
    if (!e) return cudaErrorInvalidResourceHandle;
    pthread_mutex_lock(&L);
    if (e->cap_id) {
        pthread_mutex_unlock(&L);
        emu_finding("CAPTURE", "cudaEventSynchronize on an event last recorded inside a capture");
        return cudaErrorCapturedEvent;
    }
    uint64_t g = e->issued;
    int k = (int)(g % EV_HIST);
    while (g && e->h[k].gen == g && !e->h[k].done) pthread_cond_wait(&CV, &L);
    if (g && e->h[k].gen == g) vc_join(&host_vc, &e->h[k].vc);
    cudaError_t r = sticky;
    pthread_mutex_unlock(&L);
    return r;
}

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b)
{
    ENTER("cudaEventElapsedTime");
    if (!a || !b) return cudaErrorInvalidResourceHandle;
    if ((a->flags | b->flags) & cudaEventDisableTiming) return cudaErrorInvalidResourceHandle;
    pthread_mutex_lock(&L);
    int ka = (int)(a->issued % EV_HIST), kb = (int)(b->issued % EV_HIST);
    cudaError_t r = cudaSuccess;
    if (!a->issued || !b->issued) r = cudaErrorInvalidResourceHandle;
    else if (!a->h[ka].done || !b->h[kb].done) r = cudaErrorNotReady;
    else *ms = (float)(1e3 * (b->h[kb].t - a->h[ka].t));
    pthread_mutex_unlock(&L);
    return r;
}

cudaError_t cudaLaunchHostFunc(cudaStream_t s, cudaHostFn_t fn, void *user)
{
    ENTER("cudaLaunchHostFunc");
    op *o = new_op(OP_HOSTFN, "host function");
    if (!o) return cudaErrorMemoryAllocation;
    o->fn = fn;
    o->user = user;
    return enqueue(s, o, "cudaLaunchHostFunc");
}

cudaError_t cudaEmuLaunchKernel(cudaStream_t s, const char *name, void (*body)(const void *), const void *args,
                                size_t argbytes, size_t out_field, size_t out_elem)
{
    ENTER("a kernel launch");
    char label[80];
    snprintf(label, sizeof label, "kernel %s", name);
    op *o = new_op(OP_KERNEL, label);
    if (!o || !(o->args = malloc(argbytes))) { free_op(o); return last_error = cudaErrorMemoryAllocation; }
    memcpy(o->args, args, argbytes);
    o->argbytes = argbytes;
    if (emu_fault("shift_kernel")) { /* the kernel's output one element further on */
        char *outp;
        memcpy(&outp, (char *)o->args + out_field, sizeof outp);
        outp += out_elem;
        memcpy((char *)o->args + out_field, &outp, sizeof outp);
    }
    o->body = body;
    cudaError_t e = enqueue(s, o, "kernel launch");
    if (e) last_error = e;
    return e;
}

/* ---- capture and graphs ---- */

int emu_stream_capturing(cudaStream_t s)
{
    pthread_mutex_lock(&L);
    int c = resolve(s)->cap != NULL;
    pthread_mutex_unlock(&L);
    return c;
}

int emu_enqueue_coll(cudaStream_t s, const emu_coll *c, const char *label)
{
    op *o = new_op(OP_COLL, label);
    if (!o) return cudaErrorMemoryAllocation;
    o->coll = *c;
    return enqueue(s, o, label);
}

cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode)
{
    ENTER("cudaStreamBeginCapture");
    pthread_mutex_lock(&L);
    cudaError_t e = cudaSuccess;
    if (!s) e = cudaErrorStreamCaptureImplicit; /* the legacy stream cannot be captured */
    else if (s->cap) e = cudaErrorStreamCaptureUnsupported;
    else if (ncaptures == (int)(sizeof captures / sizeof *captures)) e = cudaErrorNotSupported;
    else {
        struct capture *c = calloc(1, sizeof *c);
        if (!c) e = cudaErrorMemoryAllocation;
        else {
            c->origin = s;
            c->id = ++next_capture_id;
            c->mode = mode;
            c->thread = pthread_self();
            c->members[c->nmembers++] = s;
            s->cap = c;
            free(s->front);
            s->front = NULL;
            s->nfront = 0;
            captures[ncaptures++] = c;
        }
    }
    pthread_mutex_unlock(&L);
    return e;
}

static void ancestors(const struct capture *c, int node, char *seen)
{
    if (seen[node]) return;
    seen[node] = 1;
    for (int d = 0; d < c->nodes[node].ndeps; d++) ancestors(c, c->nodes[node].deps[d], seen);
}

static void free_nodes(gnode *nodes, int n)
{
    for (int i = 0; i < n; i++) {
        free_op(nodes[i].o);
        free(nodes[i].deps);
    }
    free(nodes);
}

cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *graph)
{
    ENTER("cudaStreamEndCapture");
    *graph = NULL;
    pthread_mutex_lock(&L);
    struct capture *c = s ? s->cap : NULL;
    if (!c || c->origin != s) { pthread_mutex_unlock(&L); return cudaErrorInvalidValue; }
    if (c->mode != cudaStreamCaptureModeRelaxed && !pthread_equal(c->thread, pthread_self())) {
        pthread_mutex_unlock(&L);
        return cudaErrorStreamCaptureWrongThread;
    }
    /* Every stream that joined must be joined back into the origin. */
    char *seen = calloc((size_t)(c->n ? c->n : 1), 1);
    int unjoined = -1;
    if (seen) {
        for (int i = 0; i < s->nfront; i++) ancestors(c, s->front[i], seen);
        for (int m = 1; m < c->nmembers && unjoined < 0; m++)
            for (int i = 0; i < c->members[m]->nfront; i++)
                if (!seen[c->members[m]->front[i]]) unjoined = m;
    }
    free(seen);
    if (unjoined >= 0 && !c->invalid) invalidate(c, cudaErrorStreamCaptureUnjoined);
    /* As CUDA: an unjoined fork says so; any other broken rule, "invalidated". */
    cudaError_t e = c->invalid == cudaErrorStreamCaptureUnjoined ? c->invalid
                    : c->invalid                                 ? cudaErrorStreamCaptureInvalidated
                                                                 : cudaSuccess;
    struct CUgraph_st *g = NULL;
    if (!e && !(g = calloc(1, sizeof *g))) e = cudaErrorMemoryAllocation;
    if (!e) {
        g->nodes = c->nodes;
        g->n = c->n;
        g->nlanes = c->nmembers;
        for (int m = 0; m < c->nmembers; m++)
            snprintf(g->lane_names[m], sizeof g->lane_names[m], "%s", agents[c->members[m]->agent].name);
        c->nodes = NULL;
    } else
        free_nodes(c->nodes, c->n);
    for (int m = 0; m < c->nmembers; m++) {
        c->members[m]->cap = NULL;
        free(c->members[m]->front);
        c->members[m]->front = NULL;
        c->members[m]->nfront = 0;
    }
    for (int i = 0; i < ncaptures; i++)
        if (captures[i] == c) captures[i] = captures[--ncaptures];
    pthread_mutex_unlock(&L);
    if (unjoined >= 0)
        emu_finding("CAPTURE", "a stream forked into the capture was not joined back into the origin stream before "
                    "cudaStreamEndCapture (cudaErrorStreamCaptureUnjoined)");
    free(c);
    *graph = g;
    return e;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph, unsigned long long flags)
{
    ENTER("cudaGraphInstantiate");
    (void)flags;
    if (!graph) return cudaErrorInvalidValue;
    struct CUgraphExec_st *x = calloc(1, sizeof *x);
    if (!x || !(x->nodes = calloc((size_t)(graph->n ? graph->n : 1), sizeof *x->nodes))) { free(x); return cudaErrorMemoryAllocation; }
    x->n = graph->n;
    x->nlanes = graph->nlanes;
    for (int i = 0; i < graph->n; i++) {
        gnode *s = &graph->nodes[i], *d = &x->nodes[i];
        *d = *s;
        d->o = malloc(sizeof *d->o);
        d->deps = s->ndeps ? malloc((size_t)s->ndeps * sizeof *d->deps) : NULL;
        if (!d->o || (s->ndeps && !d->deps)) return cudaErrorMemoryAllocation;
        *d->o = *s->o;
        d->o->staging = NULL;
        d->o->seqs = NULL;
        d->o->args = NULL;
        if (s->o->args) {
            if (!(d->o->args = malloc(s->o->argbytes))) return cudaErrorMemoryAllocation;
            memcpy(d->o->args, s->o->args, s->o->argbytes);
        }
        if (s->o->staging) {
            if (!(d->o->staging = malloc(s->o->bytes ? s->o->bytes : 1))) return cudaErrorMemoryAllocation;
            memcpy(d->o->staging, s->o->staging, s->o->bytes);
        }
        if (s->ndeps) memcpy(d->deps, s->deps, (size_t)s->ndeps * sizeof *d->deps);
    }
    pthread_mutex_lock(&L);
    for (int l = 0; l < x->nlanes; l++) {
        x->lane_agent[l] = new_agent("graph lane of %s", graph->lane_names[l]);
        if (x->lane_agent[l] < 0) { pthread_mutex_unlock(&L); return cudaErrorMemoryAllocation; }
    }
    pthread_mutex_unlock(&L);
    *exec = x;
    return cudaSuccess;
}

cudaError_t cudaGraphUpload(cudaGraphExec_t exec, cudaStream_t s)
{
    ENTER("cudaGraphUpload");
    (void)s;
    return exec ? cudaSuccess : cudaErrorInvalidValue;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s)
{
    ENTER("cudaGraphLaunch");
    if (!exec) return cudaErrorInvalidValue;
    op *o = new_op(OP_GRAPH, "graph launch");
    if (!o || !(o->seqs = calloc((size_t)(exec->n ? exec->n : 1), sizeof *o->seqs))) {
        free_op(o);
        return cudaErrorMemoryAllocation;
    }
    o->gx = exec;
    /* Each replay's collectives take the next numbers on their communicators, in capture order. */
    for (int i = 0; i < exec->n; i++)
        if (exec->nodes[i].o->kind == OP_COLL) o->seqs[i] = emu_coll_number(&exec->nodes[i].o->coll);
    return enqueue(s, o, "cudaGraphLaunch");
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph)
{
    ENTER("cudaGraphDestroy");
    if (!graph) return cudaErrorInvalidValue;
    free_nodes(graph->nodes, graph->n);
    free(graph);
    return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec)
{
    ENTER("cudaGraphExecDestroy");
    if (!exec) return cudaErrorInvalidValue;
    pthread_mutex_lock(&L);
    exec->destroyed = 1;
    maybe_free_exec(exec);
    pthread_mutex_unlock(&L);
    return cudaSuccess;
}

/* ---- the emulator's own tests ---- */

long cudaEmuFindings(void) { return n_race + n_rule + n_nccl + n_illegal; }

void cudaEmuClearFindings(void)
{
    n_race = n_rule = n_nccl = n_illegal = 0;
    pthread_mutex_lock(&L);
    sticky = cudaSuccess;
    pthread_mutex_unlock(&L);
    last_race_me = last_race_prev = 0;
}
