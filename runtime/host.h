/* Host backend: every rank of a plan as a thread of one process over host
 * memory. Collectives rendezvous on a barrier per group instance; sends
 * and receives go through a mailbox per (sender, receiver). */
#ifndef COMMPLAN_HOST_H
#define COMMPLAN_HOST_H

#include "commplan.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cp_host_world cp_host_world;

cp_host_world *cp_host_world_create(const cp_plan *p);
void cp_host_world_destroy(cp_host_world *w);
/* Reductions with gloo's arithmetic (the default) or NCCL's (ring order,
 * ncclAvg's premultiply; cp_reduce_values_nccl). */
void cp_host_world_set_arith(cp_host_world *w, cp_arith a);
/* How long a point-to-point receive waits for its message before it fails
 * naming both ranks (COMMPLAN_P2P_TIMEOUT seconds, else 30; <= 0: that). */
void cp_host_world_set_p2p_timeout(cp_host_world *w, double seconds);
/* How long a collective's or all-to-all's rendezvous waits for its members
 * before the rank fails naming the group and the members missing (0, the
 * default: for ever); the job's first failure then writes the cursor file
 * (cp_cursor_dump, COMMPLAN_CURSOR_DUMP). */
void cp_host_world_set_timeout(cp_host_world *w, double seconds);
/* The job's first failure: every rank of the world blocked in it (a
 * collective's or all-to-all's rendezvous, a receive) or blocking in it
 * later fails at once with "rank R: stopped: rank F failed first: <why>",
 * not after a timeout or never. Returns 1 for the first call, 0 after (the
 * first reason stays). Each rank's backend calls it through cp_backend.abort
 * when the executor fails; a driver calls it for failures of its own. */
int cp_host_world_stop(cp_host_world *w, int rank, const char *why);
/* NULL while running; else the first failure's line (and its rank). */
const char *cp_host_world_stopped(cp_host_world *w, int *rank);
/* b->ctx is owned by the world; valid until cp_host_world_destroy. */
void cp_host_backend_init(cp_backend *b, cp_host_world *w, int rank);

/* One rank per process, its collectives someone else's (torch.distributed
 * under PyTorch: python/commplan/runtime.py HostLibrary): coll is CP_COLL_*,
 * the group is instance `color` of the op's family (cp_group_member gives
 * its ranks), this rank its member `key` of `size`; in and out as the
 * executor passes them (an all-gather's in is this rank's slot of out, an
 * all-reduce's in is out), count per rank (the op's count), dtype and
 * reduce_op the cp_dtype and cp_reduce_op codes. Returns 0, or -1 after
 * the callee has said why. */
typedef int (*cp_host_collective_cb)(void *user, int coll, int family, int color, int key, int size, void *in,
                                     void *out, int64_t count, int dtype, int reduce_op);
/* Waits until the caller's asynchronous collectives up to `ticket` are
 * done (cp_hostlib_set_async). Returns 0, or -1 after saying why. */
typedef int (*cp_host_sync_cb)(void *user, long ticket);
/* Rank `rank`'s backend with the host copies, memory and event checks of
 * cp_host_backend_init and every collective through cb. */
void cp_host_backend_init_cb(cp_backend *b, cp_host_world *w, int rank, cp_host_collective_cb cb, void *user);
/* Expert parallelism's all-to-alls, someone else's too (HostLibrary:
 * torch.distributed.all_to_all_single): the group as for the collectives;
 * in holds send_rows[m] rows of row_bytes for member m, back to back in
 * member order, out receives recv_rows[m] rows from member m likewise
 * (torch's input and output split sizes, in rows). The counts' exchange is
 * one row of a2a_experts int64 to and from each member; the tokens' are
 * the op's a2a_dim elements of its dtype per row, split by those counts.
 * Returns 0, or -1 after the callee has said why. */
typedef int (*cp_host_alltoall_cb)(void *user, int family, int color, int key, int size, const void *in, void *out,
                                   const int64_t *send_rows, const int64_t *recv_rows, int64_t row_bytes);
/* A backend of cp_host_backend_init_cb: its all-to-alls through cb (NULL:
 * refused with one line, the default). */
void cp_host_backend_set_alltoall(cp_backend *b, cp_host_alltoall_cb cb, void *user);

#ifdef __cplusplus
}
#endif

#endif
