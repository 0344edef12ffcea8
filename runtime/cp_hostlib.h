/* The plan's library without a GPU: one rank of the plan in this process,
 * over host memory, its collectives handed to the caller (torch.distributed
 * on gloo, through python/commplan/runtime.py's HostLibrary), so that
 * PyTorch training on CPU runs the very op sequence, buffers and copies the
 * NCCL backend runs: the same executor, the same per-unit calls as
 * cp_gpu.h's, in the plan's order. The blocking calls are synchronous;
 * the split ones below may leave collectives in flight. */
#ifndef COMMPLAN_HOSTLIB_H
#define COMMPLAN_HOSTLIB_H

#include <stddef.h>

#include "commplan.h"
#include "host.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cp_hostlib cp_hostlib;

/* 0, or -1 with one line in err (rank out of range, out of memory). */
int cp_hostlib_init(cp_hostlib **out, const cp_plan *plan, int rank, cp_host_collective_cb cb, void *user, char *err,
                    size_t errlen);
void cp_hostlib_destroy(cp_hostlib *h);
const char *cp_hostlib_last_error(const cp_hostlib *h);
int cp_hostlib_rank(const cp_hostlib *h);
int cp_hostlib_shard_rank(const cp_hostlib *h);
/* Members of instance color of family f (for the caller's process groups). */
int cp_hostlib_group_member(const cp_hostlib *h, int family, int color, int key);
/* A parameter's storage, as cp_gpu_sharded & co: its shard (padded), its
 * unsharded tensor (valid between unshard and reshard), its unsharded grad
 * (the backward writes it), its reduced sharded grad. */
void *cp_hostlib_sharded(cp_hostlib *h, int param);
void *cp_hostlib_unsharded(cp_hostlib *h, int param);
void *cp_hostlib_grad(cp_hostlib *h, int param);
void *cp_hostlib_sharded_grad(cp_hostlib *h, int param);
/* The unit's next copy-in + all-gather + copy-out, reshard, or reduction
 * (pack, reduce-scatter, partial sums, all-reduce, view-out): 0 or -1. */
int cp_hostlib_unshard(cp_hostlib *h, int unit);
int cp_hostlib_reshard(cp_hostlib *h, int unit);
int cp_hostlib_reduce_grads(cp_hostlib *h, int unit);
/* The split calls, as cp_gpu.h's (cp_gpu_unshard_issue & co: the same
 * checks, the same order), over one thread: an issue runs its copy-in or
 * pack at once and hands its first collective out asynchronous where the
 * caller set cp_hostlib_set_async (HostLibrary: torch.distributed with
 * async_op=True, gloo running it on its own threads); whatever the plan
 * orders after a collective (a later op of its stream, an op waiting for
 * an event recorded after it) first waits for it through sync_cb, and
 * the rest of an issue whose next op would wait (a reduction's view-out,
 * its HSDP all-reduce) is deferred, in order, until a later op needs it,
 * the unit's wait, a blocking call or the next step. Without
 * cp_hostlib_set_async every collective is synchronous.
 *   unshard_wait: the copy-out (after its all-gather); reduce_wait: the
 *   unit's deferred ops and collectives done, its sharded grads final.
 * The blocking calls above wait for everything in flight first. */
int cp_hostlib_unshard_issue(cp_hostlib *h, int unit);
int cp_hostlib_unshard_wait(cp_hostlib *h, int unit);
int cp_hostlib_reduce_issue(cp_hostlib *h, int unit);
int cp_hostlib_reduce_wait(cp_hostlib *h, int unit);
/* sync_cb(user, t) must return once the caller's asynchronous collectives
 * with tickets up to t are done; during a collective callback,
 * cp_hostlib_async_ticket is its ticket (> 0) when it may return before
 * the collective is done (then the caller keeps its buffers' views alive
 * until sync_cb), else 0. */
void cp_hostlib_set_async(cp_hostlib *h, cp_host_sync_cb cb, void *user);
long cp_hostlib_async_ticket(const cp_hostlib *h);
/* Expert parallelism through the same calls, as cp_gpu.h's (its comment
 * "Expert parallelism through the same calls" says the order): the
 * all-to-alls go to the caller's all-to-all callback (host.h
 * cp_host_alltoall_cb; HostLibrary: torch.distributed.all_to_all_single on
 * the ep group's process group), set before the first exchange; without one
 * an exchange is refused with one line. */
void cp_hostlib_set_alltoall(cp_hostlib *h, cp_host_alltoall_cb cb, void *user);
/* This rank's per-expert token counts (n = the unit's a2a_experts, global
 * expert order) for the unit's next A2A_COUNTS, checked as
 * cp_gpu_set_expert_counts checks them (0, or -1 with one line; after -1
 * still make the exchange, which then refuses on every member). */
int cp_hostlib_set_expert_counts(cp_hostlib *h, int unit, const int64_t *counts, int n);
/* The caller refuses its own counts (cp_executor_refuse_expert_counts):
 * the next exchange refuses with why on this rank, and on every member.
 * Always -1, why in cp_hostlib_last_error. Then make the exchange. */
int cp_hostlib_refuse_expert_counts(cp_hostlib *h, int unit, const char *why);
/* The unit's next token exchange, in the plan's order: forward, the counts'
 * exchange and the dispatch in one call (send buffer -> receive buffer),
 * then the combine (receive -> send); backward, the combine's gradient,
 * then the dispatch's, split by that micro-step's forward counts (under
 * activation checkpointing preceded by the recompute's counts, dispatch
 * and combine, the forward's counts given again: cp_gpu.h). Rows are
 * the unit's a2a dim elements of its all-gather dtype, packed as
 * cp_gpu_exchange_tokens packs them. The token buffers hold data from the
 * exchange that opens them to its pair: a call that would overwrite them
 * in between is refused with one line (arena.c's order check). 0 or -1. */
int cp_hostlib_exchange_tokens(cp_hostlib *h, int unit);
/* The unit's token buffers (receive 0: send buffer, 1: receive buffer),
 * NULL for a unit without all-to-alls. */
void *cp_hostlib_tokens(cp_hostlib *h, int unit, int receive);
/* The counts the unit's last cp_hostlib_exchange_tokens split by: [0, E)
 * this rank's tokens per global expert, [E, 2E) the rows received
 * ([source member][local expert]); E the unit's a2a_experts. NULL before
 * the unit's first exchange. */
const int64_t *cp_hostlib_exchange_counts(const cp_hostlib *h, int unit);

#ifdef __cplusplus
}
#endif

#endif
