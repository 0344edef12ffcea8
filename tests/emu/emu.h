/* Internal interface between the emulated CUDA runtime (emu_cuda.c) and
 * the emulated NCCL (emu_nccl.c). TEST DOUBLE: see docs/emulator.md. */
#ifndef COMMPLAN_EMU_H
#define COMMPLAN_EMU_H

#include <stdint.h>

#include "nccl.h"

/* One collective as issued: executed by a stream worker or a graph lane. */
typedef struct {
    struct ncclComm *comm;
    int kind; /* EMU_ALL_GATHER, ... */
    const void *send;
    void *recv;
    size_t count;
    ncclDataType_t dtype;
    ncclRedOp_t op;
    uint64_t seq; /* the op's number on its communicator (eager: at issue; graphs: at each launch); a send's or
                     receive's: its message's number between the two ranks, in that direction */
    int peer;     /* EMU_SEND / EMU_RECV: the other rank on comm */
    double premul; /* a PreMulSum op's factor f (its scalar 1 / f in the dtype), taken at issue; else 0 */
    /* the send and receive buffers' offsets in a window registered on comm, plus 1 (0: in none); a
     * collective's members must agree (NCCL's symmetric windows), taken at issue */
    uint64_t send_win, recv_win;
} emu_coll;
enum { EMU_ALL_GATHER = 1, EMU_REDUCE_SCATTER = 2, EMU_ALL_REDUCE = 3, EMU_SPLIT = 4, EMU_SEND = 5, EMU_RECV = 6,
       EMU_WINDOW = 7 };

/* emu_cuda.c */
int emu_rank(void);
void emu_finding(const char *kind, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int emu_fault(const char *name); /* 1 when this call is the seeded fault's occurrence */
void emu_lock(void);
void emu_unlock(void);
/* Waits on the emulator's one condition; 0, or -1 once deadline (CLOCK_MONOTONIC s) passed. */
int emu_wait_until(double deadline);
void emu_broadcast(void);
double emu_now(void);
double emu_deadlock_s(void);
/* Enqueue a collective on s (or record it into s's capture): 0 or a cudaError_t. */
int emu_enqueue_coll(cudaStream_t s, const emu_coll *c, const char *label);
int emu_stream_capturing(cudaStream_t s);
int emu_is_device(const void *p, size_t bytes); /* inside one device allocation */
/* Happens-before order along a communicator (NCCL serialises a
 * communicator's kernels): the running op joins *slot, then publishes itself. */
void emu_vc_join_slot(void **slot);
void emu_vc_publish_slot(void **slot);

/* emu_nccl.c: runs c on the calling worker; 0, or -1 (c->comm's async error set). */
int emu_coll_run(const emu_coll *c, const char *label);
uint64_t emu_coll_next_seq(struct ncclComm *comm);
/* The number a graph replay of c takes: the communicator's next for a
 * collective, the next message's with c's peer for a send or receive. */
uint64_t emu_coll_number(const emu_coll *c);
int emu_comm_used_eagerly(struct ncclComm *comm);
const char *emu_comm_name(struct ncclComm *comm);

#endif
