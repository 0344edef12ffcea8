/* TEST DOUBLE, not NCCL: communicators between the rank processes over a
 * shared-memory file each (docs/emulator.md).
 *
 * A collective runs on the stream worker that reaches it, after the
 * communicator's previous op in this process (NCCL serialises a
 * communicator's kernels): the rank stages its input in its slot, marks
 * itself arrived with the op's number, waits for every member, checks
 * that every member issued the same op (kind, count, dtype, reduction,
 * number on the communicator), then computes its own output from every
 * member's staged input with NCCL's arithmetic (runtime/dtype.c:
 * ncclAvg premultiplies, ring order) and marks itself done. A member that
 * never arrives is reported as a deadlock after COMMPLAN_EMU_DEADLOCK_S
 * seconds (default 30) instead of hanging.
 *
 * Point-to-point (ncclSend / ncclRecv): each ordered pair of members has a
 * ring of P2P_DEPTH message slots in the communicator's file. A send
 * numbers its message at issue (per peer and direction, as NCCL matches a
 * send with the peer's receive of the same order) and, when its stream
 * reaches it, waits for a free slot and writes it; the receive of that
 * number waits for it, checks that count and dtype agree, and copies it.
 * Inside ncclGroupStart .. ncclGroupEnd the operations are held and issued
 * at the group's end, its sends before its receives: posted together, as
 * NCCL's, so no order inside a group deadlocks. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "commplan.h"
#include "emu.h"

typedef struct {
    _Atomic uint64_t arrived, done; /* numbers of the last op this member staged / finished reading */
    _Atomic uint32_t gone;          /* the member's process exited: its peers fail at once, as NCCL's remote error */
    uint32_t kind, dtype, op, pad;
    uint64_t count, seq;
    uint64_t send_win, recv_win; /* emu_coll's: the buffers' window offsets + 1, 0 outside any */
    char label[80];
} slot_t;

/* Point-to-point: one ring per ordered pair (sender, receiver). */
#define P2P_DEPTH 4
typedef struct {
    _Atomic uint64_t posted, taken; /* messages the sender has written, the receiver has read */
    struct {
        uint64_t count;
        uint32_t dtype, pad;
        char label[80];
    } meta[P2P_DEPTH];
} pair_t;

typedef struct {
    _Atomic uint32_t ready, joined;
    uint32_t nranks, pad;
    uint64_t slot_bytes, p2p_bytes; /* a member's collective slot; one message slot of a pair's ring */
    slot_t slots[];
} hdr_t;

struct ncclComm {
    char name[96];
    char shm[128]; /* its shared file's name: unique to the job */
    int nranks, rank;
    hdr_t *h;
    char *data;
    pair_t *pairs;   /* [sender * nranks + receiver] */
    char *p2p_data;  /* [pair][P2P_DEPTH] message slots of h->p2p_bytes */
    uint64_t *sent, *received; /* per peer: the messages issued so far (the next one's number - 1) */
    uint64_t issued;   /* the host's last op number on this communicator */
    uint64_t executed; /* the last op number this process finished */
    void *chain_vc;    /* happens-before along the communicator */
    int aborted, destroyed, used_eagerly, warned_cold;
    ncclResult_t async;
    int held; /* the seeded "swap two ops" fault: an op held back */
    emu_coll held_op;
    cudaStream_t held_stream;
    char held_label[80];
    double premul[16]; /* PreMulSum ops ncclNumOps + i: the factor 1 / scalar; 0 where free */
    struct { char *base; size_t size; int live; } wins[16]; /* ncclCommWindowRegister's, this member's */
};

static __thread char last_msg[512];

/* Every communicator this process joined: at exit each says it is gone. */
static struct ncclComm *joined_comms[256];
static int njoined;
static void say_gone(void)
{
    for (int i = 0; i < njoined; i++)
        if (joined_comms[i]->h) atomic_store(&joined_comms[i]->h->slots[joined_comms[i]->rank].gone, 1);
}
static void remember(struct ncclComm *c)
{
    emu_lock();
    if (njoined == 0) atexit(say_gone);
    if (njoined < (int)(sizeof joined_comms / sizeof *joined_comms)) joined_comms[njoined++] = c;
    emu_unlock();
}

static void say(const char *fmt, const char *a, long b)
{
    snprintf(last_msg, sizeof last_msg, fmt, a, b);
}

const char *ncclGetErrorString(ncclResult_t r)
{
    switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    }
    return "unknown result code";
}

const char *ncclGetLastError(ncclComm_t comm)
{
    (void)comm;
    return last_msg[0] ? last_msg : "emulated NCCL: no message";
}

static uint64_t fnv64(const void *p, size_t n)
{
    const unsigned char *b = p;
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++) { h ^= b[i]; h *= 1099511628211ULL; }
    return h;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id)
{
    memset(id, 0, sizeof *id);
    const char *env = getenv("NCCL_COMM_ID");
    if (env && *env) { /* every rank derives the same id from the address, as NCCL does */
        snprintf(id->internal, sizeof id->internal, "cpemu:env:%s", env);
        return ncclSuccess;
    }
    unsigned char r[16];
    int fd = open("/dev/urandom", O_RDONLY);
    if (fd < 0 || read(fd, r, sizeof r) != (ssize_t)sizeof r) {
        if (fd >= 0) close(fd);
        say("emulated NCCL: reading /dev/urandom failed%s%ld", "", 0);
        return ncclSystemError;
    }
    close(fd);
    int n = snprintf(id->internal, sizeof id->internal, "cpemu:");
    for (size_t i = 0; i < sizeof r; i++) n += snprintf(id->internal + n, sizeof id->internal - (size_t)n, "%02x", r[i]);
    return ncclSuccess;
}

static size_t slot_bytes(void)
{
    const char *m = getenv("COMMPLAN_EMU_SLOT_MB");
    long mb = m ? atol(m) : 8;
    return (size_t)(mb > 0 ? mb : 8) << 20;
}

/* One point-to-point message slot: COMMPLAN_EMU_P2P_KB (default 1024). The
 * file is sparse: a pair's slots take memory only once written. */
static size_t p2p_bytes(void)
{
    const char *m = getenv("COMMPLAN_EMU_P2P_KB");
    long kb = m ? atol(m) : 1024;
    return (size_t)(kb > 0 ? kb : 1024) << 10;
}

/* Polls another process's progress: short naps first, then up to 1 ms
 * (the ranks share few cores; a collective's latency here is no figure). */
static void nap(int *us)
{
    struct timespec ts = { 0, (long)*us * 1000L };
    nanosleep(&ts, NULL);
    if (*us < 1000) *us *= 2;
    if (*us > 1000) *us = 1000;
}

/* Maps the communicator's shared file, waits for every member, unlinks it. */
static ncclResult_t attach(struct ncclComm *c, const char *shm, int nranks, int rank)
{
    size_t sb = slot_bytes(), pb = p2p_bytes(), npairs = (size_t)nranks * (size_t)nranks;
    size_t hdr = (sizeof(hdr_t) + (size_t)nranks * sizeof(slot_t) + 4095) / 4096 * 4096;
    size_t pairs = (npairs * sizeof(pair_t) + 4095) / 4096 * 4096;
    size_t bytes = hdr + (size_t)nranks * sb + pairs + npairs * P2P_DEPTH * pb;
    double deadline = emu_now() + emu_deadlock_s();
    int fd = shm_open(shm, O_RDWR | O_CREAT | O_EXCL, 0600), creator = fd >= 0;
    if (!creator) {
        if (errno != EEXIST || (fd = shm_open(shm, O_RDWR, 0)) < 0) {
            say("emulated NCCL: shm_open(%s) failed (errno %ld)", shm, errno);
            return ncclSystemError;
        }
    } else if (ftruncate(fd, (off_t)bytes) != 0) {
        close(fd);
        say("emulated NCCL: sizing %s failed (errno %ld)", shm, errno);
        return ncclSystemError;
    }
    struct stat st;
    int us = 20;
    while (fstat(fd, &st) == 0 && (size_t)st.st_size < bytes && emu_now() < deadline) nap(&us);
    if ((size_t)st.st_size != bytes) {
        close(fd);
        say("emulated NCCL: communicator file %s has another size: the ranks disagree on the member count, "
            "COMMPLAN_EMU_SLOT_MB or COMMPLAN_EMU_P2P_KB (%ld)", shm, (long)st.st_size);
        return ncclInvalidUsage;
    }
    void *m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED) {
        say("emulated NCCL: mmap of %s failed (errno %ld)", shm, errno);
        return ncclSystemError;
    }
    c->h = m;
    c->data = (char *)m + hdr;
    c->pairs = (pair_t *)(c->data + (size_t)nranks * sb);
    c->p2p_data = (char *)c->pairs + pairs;
    c->nranks = nranks;
    c->rank = rank;
    c->sent = calloc((size_t)nranks, sizeof *c->sent);
    c->received = calloc((size_t)nranks, sizeof *c->received);
    if (!c->sent || !c->received) {
        say("emulated NCCL: out of host memory attaching %s%ld", shm, 0);
        return ncclSystemError;
    }
    if (creator) {
        c->h->nranks = (uint32_t)nranks;
        c->h->slot_bytes = sb;
        c->h->p2p_bytes = pb;
        atomic_store(&c->h->ready, 1);
    }
    us = 20;
    while (!atomic_load(&c->h->ready) && emu_now() < deadline) nap(&us);
    atomic_fetch_add(&c->h->joined, 1);
    us = 20;
    while (atomic_load(&c->h->joined) < (uint32_t)nranks && emu_now() < deadline) nap(&us);
    uint32_t joined = atomic_load(&c->h->joined);
    shm_unlink(shm); /* every member has it mapped (or the job is failing): leave nothing behind */
    remember(c);
    if (joined < (uint32_t)nranks) {
        say("emulated NCCL: only %s of the communicator's members joined within the deadlock limit (%ld ranks)",
            joined == 0 ? "none" : "some", nranks);
        emu_finding("DEADLOCK", "communicator %s: %u of %d ranks joined within %.0f s", c->name, joined, nranks,
                    emu_deadlock_s());
        return ncclSystemError;
    }
    return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank)
{
    emu_rank();
    *comm = NULL;
    if (nranks < 1 || rank < 0 || rank >= nranks) return ncclInvalidArgument;
    if (strncmp(id.internal, "cpemu:", 6) != 0) {
        say("emulated NCCL: the unique id was not made by ncclGetUniqueId of this emulator%s%ld", "", 0);
        return ncclInvalidArgument;
    }
    struct ncclComm *c = calloc(1, sizeof *c);
    if (!c) return ncclSystemError;
    char shm[96];
    uint64_t h = fnv64(id.internal, strnlen(id.internal, sizeof id.internal));
    snprintf(shm, sizeof shm, "/cpemu-%016llx-n%d", (unsigned long long)h, nranks);
    snprintf(c->name, sizeof c->name, "world (%d ranks)", nranks);
    snprintf(c->shm, sizeof c->shm, "%s", shm);
    ncclResult_t r = attach(c, shm, nranks, rank);
    if (r != ncclSuccess) { free(c->sent); free(c->received); free(c); return r; }
    *comm = c;
    return ncclSuccess;
}

/* Waits until every member's counter (arrived or done) reaches want. */
static int wait_members(struct ncclComm *c, int arrived, uint64_t want, const char *label)
{
    double deadline = emu_now() + emu_deadlock_s();
    int us = 20;
    for (;;) {
        int missing = -1;
        for (int q = 0; q < c->nranks && missing < 0; q++)
            if ((arrived ? atomic_load(&c->h->slots[q].arrived) : atomic_load(&c->h->slots[q].done)) < want) missing = q;
        if (missing < 0) return 0;
        if (c->aborted) return -1;
        if (atomic_load(&c->h->slots[missing].gone)) { /* NCCL sees the peer's connections close */
            emu_lock();
            if (c->async == ncclSuccess) c->async = ncclRemoteError;
            emu_unlock();
            snprintf(last_msg, sizeof last_msg, "emulated NCCL: %s: rank %d exited before op #%llu (%s)", c->name,
                     missing, (unsigned long long)want, label);
            fprintf(stderr, "commplan-emu: rank %d: %s\n", emu_rank(), last_msg);
            return -1;
        }
        if (emu_now() > deadline) {
            char who[512];
            int n = 0;
            for (int q = 0; q < c->nranks && n < (int)sizeof who - 80; q++) {
                uint64_t a = atomic_load(&c->h->slots[q].arrived);
                if (a < want)
                    n += snprintf(who + n, sizeof who - (size_t)n, "%s rank %d last arrived at op #%llu", n ? ";" : "", q,
                                  (unsigned long long)a);
            }
            emu_finding("DEADLOCK", "%s: op #%llu (%s) waited %.0f s for %s:%s (an op issued on one rank only, or in "
                        "another order)", c->name, (unsigned long long)want, label, emu_deadlock_s(),
                        arrived ? "every member to arrive" : "every member to finish the previous op", who);
            return -1;
        }
        nap(&us);
    }
}

static int check_same(struct ncclComm *c, uint64_t seq)
{
    const slot_t *me = &c->h->slots[c->rank];
    for (int q = 0; q < c->nranks; q++) {
        const slot_t *o = &c->h->slots[q];
        if (o->seq == seq && o->kind == me->kind && o->count == me->count && o->dtype == me->dtype &&
            (me->kind == EMU_ALL_GATHER || me->kind == EMU_SPLIT || o->op == me->op))
            continue;
        emu_finding("NCCL", "%s: op #%llu differs between members: this rank (%d) issued %s (count %llu, dtype %u, "
                    "op %u), rank %d issued %s (count %llu, dtype %u, op %u, its op #%llu)", c->name,
                    (unsigned long long)seq, c->rank, me->label, (unsigned long long)me->count, me->dtype, me->op, q,
                    o->label, (unsigned long long)o->count, o->dtype, o->op, (unsigned long long)o->seq);
        return -1;
    }
    /* Symmetric windows: every member's buffers at one offset of its window, or none in a window. */
    for (int q = 0; q < c->nranks; q++) {
        const slot_t *o = &c->h->slots[q];
        for (int side = 0; side < 2; side++) {
            uint64_t mine = side ? me->recv_win : me->send_win, theirs = side ? o->recv_win : o->send_win;
            if (mine == theirs) continue;
            char a[40], b[40];
            snprintf(a, sizeof a, mine ? "offset %llu" : "no window", (unsigned long long)(mine - 1));
            snprintf(b, sizeof b, theirs ? "offset %llu" : "no window", (unsigned long long)(theirs - 1));
            emu_finding("SYMMETRIC", "%s: op #%llu (%s): this rank (%d) has its %s buffer at %s of its registered "
                        "window, rank %d at %s: NCCL's symmetric collectives need the same offset on every member",
                        c->name, (unsigned long long)seq, me->label, c->rank, side ? "receive" : "send", a, q, b);
            return -1;
        }
    }
    return 0;
}

/* Stages in (in_bytes) as this member's part of op seq and waits for every member's. */
static int exchange(struct ncclComm *c, uint64_t seq, int kind, int dtype, int op, uint64_t count, const void *in,
                    size_t in_bytes, uint64_t send_win, uint64_t recv_win, const char *label)
{
    if (in_bytes > c->h->slot_bytes) {
        emu_finding("NCCL", "%s: %s stages %zu bytes, more than the emulator's %llu-byte slot (set "
                    "COMMPLAN_EMU_SLOT_MB)", c->name, label, in_bytes, (unsigned long long)c->h->slot_bytes);
        return -1;
    }
    /* Every member has read what this slot held for the previous op. */
    if (wait_members(c, 0, seq - 1, label)) return -1;
    slot_t *me = &c->h->slots[c->rank];
    memcpy(c->data + (size_t)c->rank * c->h->slot_bytes, in, in_bytes);
    me->kind = (uint32_t)kind;
    me->dtype = (uint32_t)dtype;
    me->op = (uint32_t)op;
    me->count = count;
    me->seq = seq;
    me->send_win = send_win;
    me->recv_win = recv_win;
    snprintf(me->label, sizeof me->label, "%s", label);
    atomic_store(&me->arrived, seq);
    if (wait_members(c, 1, seq, label)) return -1;
    return check_same(c, seq);
}

static void finish(struct ncclComm *c, uint64_t seq, int ok)
{
    atomic_store(&c->h->slots[c->rank].done, seq);
    emu_lock();
    if (!ok && c->async == ncclSuccess) c->async = ncclInvalidUsage;
    c->executed = seq;
    emu_broadcast();
    emu_unlock();
}

static const char *part(struct ncclComm *c, int q) { return c->data + (size_t)q * c->h->slot_bytes; }

static cp_dtype cp_type(ncclDataType_t t) { return t == ncclFloat32 ? CP_FP32 : t == ncclBfloat16 ? CP_BF16 : CP_FP16; }
static cp_reduce_op reduce_op_of(ncclRedOp_t op)
{
    return op == ncclAvg ? CP_AVG : op == ncclMax ? CP_MAX : op >= ncclNumOps ? CP_PREMUL_SUM : CP_SUM;
}
static size_t type_size(ncclDataType_t t)
{
    switch (t) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    default: return 8;
    }
}

static int p2p_run(const emu_coll *k, const char *label);

int emu_coll_run(const emu_coll *k, const char *label)
{
    if (k->kind == EMU_SEND || k->kind == EMU_RECV) return p2p_run(k, label);
    struct ncclComm *c = k->comm;
    /* After the communicator's previous op in this process. */
    emu_lock();
    double deadline = emu_now() + emu_deadlock_s();
    int late = 0;
    while (c->executed + 1 != k->seq && !c->aborted && !late) late = emu_wait_until(deadline) != 0;
    emu_unlock();
    if (late) {
        emu_finding("DEADLOCK", "%s: op #%llu (%s) waited %.0f s for op #%llu of the same communicator, which its "
                    "stream never reached", c->name, (unsigned long long)k->seq, label, emu_deadlock_s(),
                    (unsigned long long)c->executed + 1);
        finish(c, k->seq, 0);
        return -1;
    }
    if (c->aborted || c->async != ncclSuccess) { finish(c, k->seq, 0); return -1; }
    emu_vc_join_slot(&c->chain_vc);
    size_t es = type_size(k->dtype), n = (size_t)c->nranks, count = k->count;
    size_t in_bytes = count * es * (k->kind == EMU_REDUCE_SCATTER ? n : 1);
    size_t out_bytes = count * es * (k->kind == EMU_ALL_GATHER ? n : 1);
    cudaEmuAccess(k->send, in_bytes, 0);
    int ok = exchange(c, k->seq, k->kind, (int)k->dtype, (int)k->op, count, k->send, in_bytes, k->send_win, k->recv_win,
                      label) == 0;
    if (ok) {
        cudaEmuAccess(k->recv, out_bytes, 1);
        char *out = k->recv;
        if (k->kind == EMU_ALL_GATHER) {
            for (size_t q = 0; q < n; q++) memmove(out + q * count * es, part(c, (int)q), count * es);
        } else {
            cp_dtype t = cp_type(k->dtype);
            float *v = malloc(n * sizeof *v);
            if (!v) ok = 0;
            for (size_t i = 0; ok && i < count; i++) {
                size_t at = k->kind == EMU_REDUCE_SCATTER ? (size_t)c->rank * count + i : i;
                for (size_t q = 0; q < n; q++) v[q] = cp_load(t, part(c, (int)q), (int64_t)at);
                /* NCCL's ring: reduce-scatter's chunk r ends on rank r; all-reduce's per chunk. */
                int key = k->kind == EMU_REDUCE_SCATTER ? c->rank
                                                        : cp_all_reduce_key(CP_ARITH_NCCL, t, (int64_t)i, (int64_t)count, (int)n);
                cp_store(t, out, (int64_t)i,
                         cp_reduce_arith_pm(CP_ARITH_NCCL, t, reduce_op_of(k->op), k->premul, v, (int)n, key));
            }
            free(v);
        }
    }
    finish(c, k->seq, ok);
    emu_vc_publish_slot(&c->chain_vc);
    return ok ? 0 : -1;
}

uint64_t emu_coll_next_seq(struct ncclComm *c)
{
    emu_lock();
    uint64_t s = ++c->issued;
    emu_unlock();
    return s;
}

uint64_t emu_coll_number(const emu_coll *k)
{
    if (k->kind != EMU_SEND && k->kind != EMU_RECV) return emu_coll_next_seq(k->comm);
    emu_lock();
    uint64_t n = ++(k->kind == EMU_SEND ? k->comm->sent : k->comm->received)[k->peer];
    emu_unlock();
    return n;
}

/* ---- point-to-point ---- */

static void p2p_failed(struct ncclComm *c, ncclResult_t why)
{
    emu_lock();
    if (c->async == ncclSuccess) c->async = why;
    emu_broadcast();
    emu_unlock();
}

/* Waits until *counter reaches want (the peer's progress on the pair). */
static int p2p_wait(struct ncclComm *c, _Atomic uint64_t *counter, uint64_t want, int peer, const char *label,
                    const char *what)
{
    double deadline = emu_now() + emu_deadlock_s();
    int us = 20;
    while (atomic_load(counter) < want) {
        if (c->aborted) return -1;
        if (atomic_load(&c->h->slots[peer].gone)) {
            snprintf(last_msg, sizeof last_msg, "emulated NCCL: %s: rank %d exited before %s (%s)", c->name, peer,
                     what, label);
            fprintf(stderr, "commplan-emu: rank %d: %s\n", emu_rank(), last_msg);
            p2p_failed(c, ncclRemoteError);
            return -1;
        }
        if (emu_now() > deadline) {
            emu_finding("DEADLOCK", "%s: %s (%s) waited %.0f s for rank %d (a send or receive issued on one rank only, "
                        "or in another order, or outside the group its peer posts it in)", c->name, what, label,
                        emu_deadlock_s(), peer);
            p2p_failed(c, ncclSystemError);
            return -1;
        }
        nap(&us);
    }
    return 0;
}

static int p2p_run(const emu_coll *k, const char *label)
{
    struct ncclComm *c = k->comm;
    if (c->aborted || c->async != ncclSuccess) return -1;
    size_t bytes = k->count * type_size(k->dtype), n = (size_t)c->nranks;
    int sends = k->kind == EMU_SEND;
    int from = sends ? c->rank : k->peer, to = sends ? k->peer : c->rank;
    pair_t *pr = &c->pairs[(size_t)from * n + (size_t)to];
    size_t at = (size_t)((k->seq - 1) % P2P_DEPTH);
    char *slot = c->p2p_data + (((size_t)from * n + (size_t)to) * P2P_DEPTH + at) * c->h->p2p_bytes;
    char what[64];
    snprintf(what, sizeof what, "%s #%llu %s rank %d", sends ? "send" : "receive", (unsigned long long)k->seq,
             sends ? "to" : "from", k->peer);
    if (sends) {
        cudaEmuAccess(k->send, bytes, 0);
        /* a free slot: the receiver has taken the message P2P_DEPTH before this one */
        if (k->seq > P2P_DEPTH && p2p_wait(c, &pr->taken, k->seq - P2P_DEPTH, k->peer, label, what)) return -1;
        memcpy(slot, k->send, bytes);
        pr->meta[at].count = k->count;
        pr->meta[at].dtype = (uint32_t)k->dtype;
        snprintf(pr->meta[at].label, sizeof pr->meta[at].label, "%s", label);
        atomic_store(&pr->posted, k->seq);
        return 0;
    }
    if (p2p_wait(c, &pr->posted, k->seq, k->peer, label, what)) return -1;
    if (pr->meta[at].count != k->count || pr->meta[at].dtype != (uint32_t)k->dtype) {
        emu_finding("NCCL", "%s: %s (%s, count %llu, dtype %u) matches rank %d's %s (count %llu, dtype %u): the "
                    "two sides of a message differ", c->name, what, label, (unsigned long long)k->count,
                    (unsigned)k->dtype, k->peer, pr->meta[at].label, (unsigned long long)pr->meta[at].count,
                    pr->meta[at].dtype);
        p2p_failed(c, ncclInvalidUsage);
        return -1;
    }
    cudaEmuAccess(k->recv, bytes, 1);
    memcpy(k->recv, slot, bytes);
    atomic_store(&pr->taken, k->seq);
    return 0;
}

int emu_comm_used_eagerly(struct ncclComm *c) { return c->used_eagerly; }
const char *emu_comm_name(struct ncclComm *c) { return c->name; }

static int overlap(const void *a, size_t na, const void *b, size_t nb)
{
    return (const char *)a < (const char *)b + nb && (const char *)b < (const char *)a + na;
}

/* ptr's offset in one of c's registered windows plus 1, or 0 where it lies in none. */
static uint64_t win_offset(const struct ncclComm *c, const void *ptr, size_t bytes)
{
    const char *p = ptr;
    for (size_t i = 0; i < sizeof c->wins / sizeof *c->wins; i++)
        if (c->wins[i].live && p >= c->wins[i].base && p + bytes <= c->wins[i].base + c->wins[i].size)
            return (uint64_t)(p - c->wins[i].base) + 1;
    return 0;
}

static ncclResult_t issue(int kind, const char *what, const void *send, void *recv, size_t count, ncclDataType_t t,
                          ncclRedOp_t op, ncclComm_t c, cudaStream_t s)
{
    emu_rank();
    if (!c || c->destroyed) { say("emulated NCCL: %s on a destroyed or NULL communicator%ld", what, 0); return ncclInvalidArgument; }
    if (c->aborted) { say("emulated NCCL: %s on an aborted communicator%ld", what, 0); return ncclInvalidUsage; }
    size_t es = type_size(t), n = (size_t)c->nranks;
    if (kind != EMU_ALL_GATHER && t != ncclFloat32 && t != ncclBfloat16 && t != ncclFloat16) {
        say("emulated NCCL: %s reduces only fp32, bf16 and fp16 here (dtype %ld)", what, (long)t);
        return ncclInvalidArgument;
    }
    size_t in_bytes = count * es * (kind == EMU_REDUCE_SCATTER ? n : 1);
    size_t out_bytes = count * es * (kind == EMU_ALL_GATHER ? n : 1);
    if (!emu_is_device(send, in_bytes) || !emu_is_device(recv, out_bytes)) {
        emu_finding("ILLEGAL", "%s on %s: send (%zu bytes at %p) or receive (%zu bytes at %p) buffer is not inside one "
                    "device allocation", what, c->name, in_bytes, send, out_bytes, recv);
        say("emulated NCCL: %s: a buffer is not device memory%ld", what, 0);
        return ncclInvalidArgument;
    }
    /* In place only as NCCL defines it: this rank's part of the larger buffer. */
    if (overlap(send, in_bytes, recv, out_bytes)) {
        int in_place = kind == EMU_ALL_REDUCE ? send == recv
                       : kind == EMU_ALL_GATHER ? (const char *)send == (const char *)recv + (size_t)c->rank * count * es
                                                : (const char *)recv == (const char *)send + (size_t)c->rank * count * es;
        if (!in_place) {
            emu_finding("NCCL", "%s on %s: send and receive buffers overlap other than NCCL's in-place layout", what,
                        c->name);
            return ncclInvalidArgument;
        }
    }
    char label[80];
    snprintf(label, sizeof label, "%s %zu x %s on %s", what, count,
             t == ncclFloat32 ? "fp32" : t == ncclBfloat16 ? "bf16" : t == ncclFloat16 ? "fp16" : "bytes", c->name);
    emu_coll k = { c, kind, send, recv, count, t, op, 0, -1, 0.0, 0, 0 };
    /* Where the buffers lie in a registered window: this rank's part of an in-place one lies at a
     * rank-dependent offset by definition, so only the whole buffer is compared. */
    int in_place_ = overlap(send, in_bytes, recv, out_bytes);
    k.send_win = kind == EMU_ALL_GATHER && in_place_ ? 0 : win_offset(c, send, in_bytes);
    k.recv_win = kind == EMU_REDUCE_SCATTER && in_place_ ? 0 : win_offset(c, recv, out_bytes);
    if (op >= ncclNumOps) {
        int i = (int)op - (int)ncclNumOps;
        if (i >= 16 || c->premul[i] == 0.0) {
            say("emulated NCCL: %s with reduction op %ld, which this communicator never created or destroyed",
                what, (long)op);
            return ncclInvalidArgument;
        }
        k.premul = c->premul[i];
    }
    if (emu_stream_capturing(s)) {
        if (!c->used_eagerly && !c->warned_cold++)
            emu_finding("CAPTURE", "%s: communicator %s is first used inside a stream capture: NCCL connects "
                        "lazily, so its set-up would run inside the capture; run one eager step first", label, c->name);
        return emu_enqueue_coll(s, &k, label) ? ncclUnhandledCudaError : ncclSuccess;
    }
    if (!c->held && emu_fault("swap_coll")) { /* held back, issued after the next op on c */
        c->held = 1;
        c->held_op = k;
        c->held_stream = s;
        snprintf(c->held_label, sizeof c->held_label, "%s", label);
        return ncclSuccess;
    }
    c->used_eagerly = 1;
    k.seq = emu_coll_next_seq(c);
    if (emu_enqueue_coll(s, &k, label)) return ncclUnhandledCudaError;
    if (c->held) {
        c->held = 0;
        c->held_op.seq = emu_coll_next_seq(c);
        if (emu_enqueue_coll(c->held_stream, &c->held_op, c->held_label)) return ncclUnhandledCudaError;
    }
    return ncclSuccess;
}

ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t *op, void *scalar, ncclDataType_t t, ncclScalarResidence_t residence,
                                      ncclComm_t c)
{
    emu_rank();
    if (!c || c->destroyed || !op || !scalar) { say("emulated NCCL: %s: bad argument%.0ld", "ncclRedOpCreatePreMulSum", 0); return ncclInvalidArgument; }
    if (residence != ncclScalarHostImmediate || (t != ncclFloat32 && t != ncclBfloat16 && t != ncclFloat16)) {
        say("emulated NCCL: %s: only host-immediate fp32, bf16 and fp16 scalars here (dtype %ld)", "ncclRedOpCreatePreMulSum", (long)t);
        return ncclInvalidArgument;
    }
    float s = cp_load(cp_type(t), scalar, 0);
    if (!(s != 0.0f)) { say("emulated NCCL: %s: a zero or NaN scalar%.0ld", "ncclRedOpCreatePreMulSum", 0); return ncclInvalidArgument; }
    for (int i = 0; i < 16; i++)
        if (c->premul[i] == 0.0) {
            c->premul[i] = 1.0 / (double)s;
            *op = (ncclRedOp_t)((int)ncclNumOps + i);
            return ncclSuccess;
        }
    say("emulated NCCL: %s: more than 16 live ops on one communicator%.0ld", "ncclRedOpCreatePreMulSum", 0);
    return ncclInternalError;
}

ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t c)
{
    emu_rank();
    int i = (int)op - (int)ncclNumOps;
    if (!c || i < 0 || i >= 16 || c->premul[i] == 0.0) {
        say("emulated NCCL: %s of op %ld, not a live PreMulSum of this communicator", "ncclRedOpDestroy", (long)op);
        return ncclInvalidArgument;
    }
    c->premul[i] = 0.0;
    return ncclSuccess;
}

ncclResult_t ncclAllGather(const void *send, void *recv, size_t count, ncclDataType_t t, ncclComm_t comm, cudaStream_t s)
{
    return issue(EMU_ALL_GATHER, "ncclAllGather", send, recv, count, t, ncclSum, comm, s);
}

ncclResult_t ncclReduceScatter(const void *send, void *recv, size_t count, ncclDataType_t t, ncclRedOp_t op,
                               ncclComm_t comm, cudaStream_t s)
{
    return issue(EMU_REDUCE_SCATTER, "ncclReduceScatter", send, recv, count, t, op, comm, s);
}

ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t t, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t s)
{
    return issue(EMU_ALL_REDUCE, "ncclAllReduce", send, recv, count, t, op, comm, s);
}

/* ncclGroupStart .. ncclGroupEnd on this thread: the sends and receives
 * held until the end, as NCCL posts a group's operations together. */
typedef struct {
    emu_coll k;
    cudaStream_t s;
    char label[80];
} held_p2p;
static __thread int group_depth, group_n, group_cap;
static __thread held_p2p *group_ops;

static ncclResult_t p2p_issue(int kind, const char *what, const void *send, void *recv, size_t count,
                              ncclDataType_t t, int peer, ncclComm_t c, cudaStream_t s)
{
    emu_rank();
    if (!c || c->destroyed) { say("emulated NCCL: %s on a destroyed or NULL communicator%ld", what, 0); return ncclInvalidArgument; }
    if (c->aborted) { say("emulated NCCL: %s on an aborted communicator%ld", what, 0); return ncclInvalidUsage; }
    if (peer < 0 || peer >= c->nranks) {
        emu_finding("NCCL", "%s on %s: peer %d is not a member of its %d", what, c->name, peer, c->nranks);
        say("emulated NCCL: %s: peer %ld outside the communicator", what, (long)peer);
        return ncclInvalidArgument;
    }
    size_t bytes = count * type_size(t);
    const void *buf = kind == EMU_SEND ? send : recv;
    if (!emu_is_device(buf, bytes)) {
        emu_finding("ILLEGAL", "%s on %s: its buffer (%zu bytes at %p) is not inside one device allocation", what,
                    c->name, bytes, buf);
        say("emulated NCCL: %s: a buffer is not device memory%ld", what, 0);
        return ncclInvalidArgument;
    }
    if (bytes > c->h->p2p_bytes) {
        emu_finding("NCCL", "%s on %s: %zu bytes, more than the emulator's %llu-byte message slot (set "
                    "COMMPLAN_EMU_P2P_KB)", what, c->name, bytes, (unsigned long long)c->h->p2p_bytes);
        return ncclInvalidArgument;
    }
    held_p2p h = { .s = s };
    h.k = (emu_coll){ c, kind, send, recv, count, t, ncclSum, 0, peer, 0.0, 0, 0 };
    snprintf(h.label, sizeof h.label, "%s %zu x %s with rank %d on %s", what, count,
             t == ncclFloat32 ? "fp32" : t == ncclBfloat16 ? "bf16" : t == ncclFloat16 ? "fp16" : "bytes", peer,
             c->name);
    if (emu_stream_capturing(s) && !c->used_eagerly && !c->warned_cold++)
        emu_finding("CAPTURE", "%s: communicator %s is first used inside a stream capture: NCCL connects lazily, so "
                    "its set-up would run inside the capture; run one eager step first", h.label, c->name);
    if (group_depth > 0) { /* held until ncclGroupEnd */
        if (group_n == group_cap) {
            int cap = group_cap ? 2 * group_cap : 8;
            held_p2p *more = realloc(group_ops, (size_t)cap * sizeof *more);
            if (!more) return ncclSystemError;
            group_ops = more;
            group_cap = cap;
        }
        group_ops[group_n++] = h;
        return ncclSuccess;
    }
    if (!emu_stream_capturing(s)) {
        c->used_eagerly = 1;
        h.k.seq = emu_coll_number(&h.k); /* captured: each replay numbers its own */
    }
    return emu_enqueue_coll(s, &h.k, h.label) ? ncclUnhandledCudaError : ncclSuccess;
}

ncclResult_t ncclSend(const void *send, size_t count, ncclDataType_t t, int peer, ncclComm_t comm, cudaStream_t s)
{
    return p2p_issue(EMU_SEND, "ncclSend", send, NULL, count, t, peer, comm, s);
}

ncclResult_t ncclRecv(void *recv, size_t count, ncclDataType_t t, int peer, ncclComm_t comm, cudaStream_t s)
{
    return p2p_issue(EMU_RECV, "ncclRecv", NULL, recv, count, t, peer, comm, s);
}

ncclResult_t ncclGroupStart(void)
{
    emu_rank();
    group_depth++;
    return ncclSuccess;
}

/* The outermost end issues the group: its sends first, then its receives
 * (each in call order, so the messages keep their numbers' order). */
ncclResult_t ncclGroupEnd(void)
{
    if (group_depth <= 0) {
        emu_finding("NCCL", "ncclGroupEnd without an open ncclGroupStart on this thread");
        say("emulated NCCL: ncclGroupEnd without ncclGroupStart%s%ld", "", 0);
        return ncclInvalidUsage;
    }
    if (--group_depth > 0) return ncclSuccess;
    ncclResult_t r = ncclSuccess;
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < group_n; i++) {
            held_p2p *h = &group_ops[i];
            if ((h->k.kind == EMU_SEND) != (pass == 0) || r != ncclSuccess) continue;
            if (!emu_stream_capturing(h->s)) {
                h->k.comm->used_eagerly = 1;
                h->k.seq = emu_coll_number(&h->k);
            }
            if (emu_enqueue_coll(h->s, &h->k, h->label)) r = ncclUnhandledCudaError;
        }
    group_n = 0;
    free(group_ops); /* a thread's groups are few: nothing kept past one */
    group_ops = NULL;
    group_cap = 0;
    return r;
}

/* Blocking on the host, after the communicator's earlier ops, as NCCL's. */
ncclResult_t ncclCommSplit(ncclComm_t c, int color, int key, ncclComm_t *newcomm, ncclConfig_t *config)
{
    (void)config;
    *newcomm = NULL;
    if (!c || c->destroyed || c->aborted) return ncclInvalidArgument;
    uint64_t seq = emu_coll_next_seq(c);
    emu_lock();
    double deadline = emu_now() + emu_deadlock_s();
    int late = 0;
    while (c->executed + 1 != seq && !late) late = emu_wait_until(deadline) != 0;
    emu_unlock();
    if (late) return ncclSystemError;
    int32_t mine[2] = { color, key };
    int ok = exchange(c, seq, EMU_SPLIT, ncclInt32, 0, 2, mine, sizeof mine, 0, 0, "ncclCommSplit") == 0;
    int n = 0, me = 0;
    if (ok && color != NCCL_SPLIT_NOCOLOR) {
        for (int q = 0; q < c->nranks; q++) {
            int32_t theirs[2];
            memcpy(theirs, part(c, q), sizeof theirs);
            if (theirs[0] != color) continue;
            n++;
            if (theirs[1] < key || (theirs[1] == key && q < c->rank)) me++;
        }
    }
    finish(c, seq, ok);
    if (!ok) return ncclInvalidUsage;
    if (color == NCCL_SPLIT_NOCOLOR) return ncclSuccess;
    struct ncclComm *s = calloc(1, sizeof *s);
    if (!s) return ncclSystemError;
    char shm[128];
    /* Named by the parent's (unique) file name, the split's number and the color. */
    snprintf(shm, sizeof shm, "/cpemu-%016llx-s%llu-c%d-n%d", (unsigned long long)fnv64(c->shm, strlen(c->shm)),
             (unsigned long long)seq, color, n);
    snprintf(s->shm, sizeof s->shm, "%s", shm);
    snprintf(s->name, sizeof s->name, "split #%llu color %d of %s (%d ranks)", (unsigned long long)seq, color,
             strncmp(c->name, "world", 5) == 0 ? "world" : "a split", n);
    ncclResult_t r = attach(s, shm, n, me);
    if (r != ncclSuccess) { free(s->sent); free(s->received); free(s); return r; }
    *newcomm = s;
    return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t c)
{
    if (!c) return ncclInvalidArgument;
    /* Queued ops may still name it: marked, kept until the process ends. */
    c->destroyed = 1;
    return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t c)
{
    if (!c) return ncclInvalidArgument;
    emu_lock();
    c->aborted = 1;
    emu_broadcast();
    emu_unlock();
    return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t c, ncclResult_t *async)
{
    if (!c) return ncclInvalidArgument;
    emu_lock();
    *async = c->async;
    emu_unlock();
    return ncclSuccess;
}

/* ---- symmetric windows (NCCL 2.27+: ncclMemAlloc, ncclCommWindowRegister) ---- */

ncclResult_t ncclMemAlloc(void **ptr, size_t size)
{
    emu_rank();
    if (!ptr) return ncclInvalidArgument;
    return cudaMalloc(ptr, size) == cudaSuccess ? ncclSuccess : ncclUnhandledCudaError;
}

ncclResult_t ncclMemFree(void *ptr)
{
    emu_rank();
    return cudaFree(ptr) == cudaSuccess ? ncclSuccess : ncclUnhandledCudaError;
}

/* Blocking on the host, after the communicator's earlier ops, and
 * collective, as NCCL's: every member registers, each a window of the same
 * size (NCCL_WIN_COLL_SYMMETRIC); a member of another size is a finding. */
ncclResult_t ncclCommWindowRegister(ncclComm_t c, void *buff, size_t size, ncclWindow_t *win, int flags)
{
    emu_rank();
    if (!c || c->destroyed || c->aborted || !win || size == 0) return ncclInvalidArgument;
    *win = NULL;
    if (!emu_is_device(buff, size)) {
        emu_finding("ILLEGAL", "ncclCommWindowRegister on %s: %zu bytes at %p are not inside one device allocation",
                    c->name, size, buff);
        return ncclInvalidArgument;
    }
    size_t slot = 0;
    while (slot < sizeof c->wins / sizeof *c->wins && c->wins[slot].live) slot++;
    if (slot == sizeof c->wins / sizeof *c->wins) {
        say("emulated NCCL: %s: more than 16 windows on one communicator%ld", "ncclCommWindowRegister", 0);
        return ncclInternalError;
    }
    uint64_t seq = emu_coll_next_seq(c);
    emu_lock();
    double deadline = emu_now() + emu_deadlock_s();
    int late = 0;
    while (c->executed + 1 != seq && !late) late = emu_wait_until(deadline) != 0;
    emu_unlock();
    if (late) return ncclSystemError;
    uint64_t mine[2] = { size, (uint64_t)flags };
    int ok = exchange(c, seq, EMU_WINDOW, ncclUint64, 0, 2, mine, sizeof mine, 0, 0, "ncclCommWindowRegister") == 0;
    for (int q = 0; ok && q < c->nranks; q++) {
        uint64_t theirs[2];
        memcpy(theirs, part(c, q), sizeof theirs);
        if (theirs[0] != mine[0] || theirs[1] != mine[1]) {
            emu_finding("SYMMETRIC", "%s: ncclCommWindowRegister: this rank (%d) registers %llu bytes (flags %llu), "
                        "rank %d %llu bytes (flags %llu): every member registers one size", c->name, c->rank,
                        (unsigned long long)mine[0], (unsigned long long)mine[1], q, (unsigned long long)theirs[0],
                        (unsigned long long)theirs[1]);
            ok = 0;
        }
    }
    finish(c, seq, ok);
    if (!ok) return ncclInvalidUsage;
    c->wins[slot].base = buff;
    c->wins[slot].size = size;
    if (emu_fault("shift_window")) { /* this rank's buffers 256 bytes later in its window than its peers' */
        c->wins[slot].base = (char *)buff - 256;
        c->wins[slot].size = size + 256;
    }
    c->wins[slot].live = 1;
    fprintf(stderr, "commplan-emu: rank %d: symmetric window of %zu bytes registered on %s\n", emu_rank(), size,
            c->name);
    *win = (ncclWindow_t)(uintptr_t)(slot + 1);
    return ncclSuccess;
}

ncclResult_t ncclCommWindowDeregister(ncclComm_t c, ncclWindow_t win)
{
    emu_rank();
    size_t slot = (size_t)(uintptr_t)win;
    if (!c || slot == 0 || slot > sizeof c->wins / sizeof *c->wins || !c->wins[slot - 1].live) {
        say("emulated NCCL: %s of a window this communicator never registered%ld", "ncclCommWindowDeregister", 0);
        return ncclInvalidArgument;
    }
    c->wins[slot - 1].live = 0;
    return ncclSuccess;
}
