/* commplan on NVIDIA GPUs: one rank of a plan over NCCL, its copy kernels
 * and CUDA streams arranged as FSDP2's (copy-in, all-gather, reduce-scatter,
 * all-reduce, plus the caller's compute stream), ordered by events. Every
 * call takes the caller's stream as a void * (a cudaStream_t). */
#ifndef COMMPLAN_GPU_H
#define COMMPLAN_GPU_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "commplan.h"
#include "cp_gpu_kernels.h"
#include "launch.h"

typedef struct cp_gpu cp_gpu;

/* Called at each FORWARD/BACKWARD op of cp_gpu_step with the op's stream (the caller's). */
typedef int (*cp_gpu_compute_fn)(void *user, cp_gpu *g, const cp_op *op, void *stream);

/* Bootstraps from the launcher's environment (see launch.h): sets the device
 * to LOCAL_RANK, creates the world communicator (NCCL_COMM_ID must already
 * be as the launch needs it: cp_launch_export_comm_id in main before any
 * thread starts; the library never changes the environment and refuses one
 * that disagrees, with one line saying what to export or unset),
 * compares every rank's plan fingerprint, splits one communicator per group
 * family the plan uses, and allocates this rank's buffers. Returns 0, or -1
 * with a one-line message naming the failing call, rank and a hint. */
int cp_gpu_init(cp_gpu **out, const cp_plan *plan, const cp_gpu_kernels *kernels, const cp_launch_env *env,
                char *err, size_t errlen);
void cp_gpu_destroy(cp_gpu *g);
const char *cp_gpu_last_error(const cp_gpu *g);
int cp_gpu_rank(const cp_gpu *g);
int cp_gpu_shard_rank(const cp_gpu *g);
int cp_gpu_is_standin(const cp_gpu *g); /* launched with cp_launch_env.standin */
/* The executor this rank runs (runtime/executor.c), for harnesses that
 * hook its compute and collective callbacks (gpu_run.c's --check and --dump). */
cp_executor *cp_gpu_executor(cp_gpu *g);
/* Makes stream the compute stream for executor calls made outside cp_gpu_*
 * (cp_executor_read / cp_executor_write from a harness). */
void cp_gpu_use_stream(cp_gpu *g, void *stream);

/* Device storage of parameter `param` (index into plan->params):
 * sharded: this rank's padded shard (orig dtype), its first cp_param_valid() elements real;
 * unsharded: the full parameter (all-gather dtype), valid between unshard and reshard;
 * grad: the unsharded gradient in the unit's grad_dtype (cp_unit), which the caller's backward
 *       writes on the first micro-step after reduce_grads and accumulates into on later ones,
 *       as autograd's AccumulateGrad does with torch 2.15 FSDP2's grad_dtype: each micro-step's
 *       gradient, computed in the all-gather dtype, cast to grad_dtype, then assigned or added
 *       in grad_dtype;
 * sharded_grad: this rank's reduced gradient shard (orig dtype) after reduce_grads.
 * CPU offload (the unit's cpu_offload, CPUOffloadPolicy): sharded and sharded_grad are host
 * memory (page-locked where pin_memory), as FSDP2 keeps them; the optimizer steps them on the
 * host, after cp_gpu_synchronize (a reduction's D2H may be in flight until then). */
void *cp_gpu_sharded(cp_gpu *g, int param);
void *cp_gpu_unsharded(cp_gpu *g, int param);
void *cp_gpu_grad(cp_gpu *g, int param);
void *cp_gpu_sharded_grad(cp_gpu *g, int param);

/* The pieces of a step, for training loops that drive FSDP themselves.
 * Each of these blocking calls forks its side streams from `stream` and joins them back into it
 * before returning: the GPU runs its work after everything issued earlier
 * on `stream` and before everything issued later, so calls never overlap
 * one another or the caller's compute (cp_gpu_step overlaps them; these do
 * not), and the plan's waits between units order nothing more. What keeps
 * the arena's reused bytes safe is the order of the calls on the stream,
 * which every call checks first: one whose ops (or the backward an unshard
 * opens the gradients for) would write bytes in which
 * another buffer holds data across calls (unsharded parameters until their
 * reshard, unsharded gradients from the unshard before their backward until
 * their reduction, all_reduce_last's partial sums) is refused with one line
 * naming both, before it issues anything; the plan's own order (SCHEDULE.md,
 * each call at its last op) never is. So: one stream for every call and for
 * the compute between them (or order your streams yourself), and the same
 * call order on every rank (collectives pair up in issue order). */
int cp_gpu_unshard(cp_gpu *g, int unit, void *stream);      /* copy-in + all-gather on side streams, copy-out on stream */
int cp_gpu_reshard(cp_gpu *g, int unit, void *stream);
int cp_gpu_reduce_grads(cp_gpu *g, int unit, void *stream); /* pack on stream, RS (+HSDP AR), view-out; stream waits */

/* The same calls split into issue and wait, as FSDP2 splits them
 * (FSDPParamGroup.unshard(async_op) / wait_for_unshard, and the
 * post-backward reduce-scatter on its own stream that the next
 * post-backward or the root's final callback waits for: torch
 * distributed/fsdp/_fully_shard/_fsdp_param_group.py), so that the plan's
 * own streams and event waits order them as they do in cp_gpu_step: an
 * all-gather prefetched under the caller's compute, a reduce-scatter
 * overlapped with the next backward.
 *   cp_gpu_unshard_issue: the copy-in and the all-gather on the plan's side
 *     streams, after the plan's waits only (no fork from `stream`, except
 *     where the call starts a step: then every side stream first waits for
 *     `stream`, as FSDP2's root pre-forward makes its all-gather streams
 *     wait for the current stream); the all-gather buffer holds the unit's
 *     data until its wait.
 *   cp_gpu_unshard_wait: the copy-out on `stream` (its plan wait: the
 *     all-gather's event); the parameters are then as after cp_gpu_unshard.
 *   cp_gpu_reduce_issue: the pack on `stream`, the reduce-scatter, partial
 *     sums, all-reduce and view-out on the plan's side streams; nothing
 *     joins `stream`.
 *   cp_gpu_reduce_wait: `stream` waits for the unit's last issued reduction
 *     (a no-op if none is outstanding); read the sharded grads after it.
 * Every issue is checked before it issues anything (arena.c cp_order_call,
 * besides the check above): refused with one line when one of its ops waits
 * for an event no op of this step recorded yet (a call made before the one
 * the plan orders it after: on a GPU the wait would order nothing), or
 * touches arena bytes that an op still in flight on another stream may
 * write (or read) with no wait of the plan ordering it first. The blocking
 * calls are an issue and its wait with a fork and a join around them
 * (cp_gpu_reshard, all on `stream`, has neither). Mixing them is allowed:
 * a blocking call's join also waits for whatever split work is in flight. */
int cp_gpu_unshard_issue(cp_gpu *g, int unit, void *stream);
int cp_gpu_unshard_wait(cp_gpu *g, int unit, void *stream);
int cp_gpu_reduce_issue(cp_gpu *g, int unit, void *stream);
int cp_gpu_reduce_wait(cp_gpu *g, int unit, void *stream);

/* Expert parallelism through the same calls: an experts unit's token
 * all-to-alls, on its ep communicator, in the plan's order (SCHEDULE.md):
 *   forward:  cp_gpu_set_expert_counts (this rank's tokens per expert, global
 *             expert order), the rows written into the send buffer, then
 *             cp_gpu_exchange_tokens: the counts' all-to-all (read back to
 *             the host: a synchronisation) and the dispatch; the tokens for
 *             this rank's experts are in the receive buffer; the experts write
 *             their output rows over them; cp_gpu_exchange_tokens again: the
 *             combine, the outputs back in the send buffer in the order sent;
 *   backward: the output gradients written into the send buffer,
 *             cp_gpu_exchange_tokens (the combine's gradient) into the
 *             receive buffer; the experts' input gradients written over
 *             them; cp_gpu_exchange_tokens (the dispatch's gradient) back
 *             into the send buffer. Each micro-step's backward exchanges
 *             split by its forward's counts;
 *   under activation checkpointing (the plan's "full" or "selective") the
 *             backward starts with the forward's two calls again, as the
 *             recompute issues them: cp_gpu_set_expert_counts with the
 *             forward's counts (any other count is refused on every
 *             member), the forward's rows, cp_gpu_exchange_tokens, the
 *             experts' rows, cp_gpu_exchange_tokens; then the pair above.
 * Rows are the unit's a2a dim elements of its all-gather dtype. The send
 * buffer packs them by destination ep member, then by expert (torch's
 * all_to_all_single input, as torchtitan sorts them); the receive buffer
 * by source member, then local expert; each member's share at most the
 * plan's capacity (expert_parallel.capacity), which cp_gpu_set_expert_counts
 * and every member's exchange check: past it the layer is refused on every
 * member with one line, never written out of bounds. The token buffers are
 * the arena's from the exchange that opens them to its pair, like the other
 * calls' buffers: write the input rows right before the call that sends
 * them, read the output rows before the next call (both on `stream`); a
 * call that would overwrite them in between is refused with one line. */
int cp_gpu_exchange_tokens(cp_gpu *g, int unit, void *stream);
/* The unit's token buffers (receive 0: send buffer, 1: receive buffer), NULL
 * for a unit without all-to-alls. */
void *cp_gpu_tokens(cp_gpu *g, int unit, int receive);
/* The counts the unit's last cp_gpu_exchange_tokens split by, host memory:
 * [0, E) this rank's tokens per global expert, [E, 2E) the rows received
 * ([source member][local expert]); E the unit's a2a_experts. NULL before
 * the unit's first exchange. */
const int64_t *cp_gpu_exchange_counts(const cp_gpu *g, int unit);

/* The plan's whole op list for one step; compute placeholders call fn. */
void cp_gpu_set_compute(cp_gpu *g, cp_gpu_compute_fn fn, void *user);
int cp_gpu_step(cp_gpu *g, void *stream);
/* cp_gpu_step, adding each op kind's host issue time to host_us[kind] (µs)
 * when host_us is not NULL; host_us[CP_OP_KIND_COUNT] gets the stream fork and join. */
int cp_gpu_step_profiled(cp_gpu *g, void *stream, double host_us[CP_OP_KIND_COUNT + 1]);
/* --trace: with events (2 x plan->nops cudaEvent_t, created by the caller),
 * each later cp_gpu_step records events[2i] on op i's stream when it can
 * start (after its waits) and events[2i + 1] when it is done; NULL: off. */
void cp_gpu_set_trace(cp_gpu *g, void *events);
/* Expert parallelism: this rank's per-expert token counts (n = the unit's
 * a2a_experts, global expert order: what torchtitan's router counted) for
 * the unit's next A2A_COUNTS in cp_gpu_step (call it from the compute
 * callback before that op, or before the step) or cp_gpu_exchange_tokens. Checked now and when the
 * op runs: a negative count or a member's share past the op's capacity is
 * refused with one line (rank, op, member, count, capacity), and every
 * member of the ep group then refuses that layer's all-to-alls. 0 or -1.
 * After -1 still make the exchange (cp_gpu_exchange_tokens, or let the
 * step run the op): it sends -1s instead, so every member refuses with
 * this rank's line; returning early leaves the others waiting in it. */
int cp_gpu_set_expert_counts(cp_gpu *g, int unit, const int64_t *counts, int n);
/* The caller refuses its own counts (values it could not pass as int64):
 * the unit's next exchange refuses with why, on every member, as after a
 * refused cp_gpu_set_expert_counts. Always -1. Then make the exchange. */
int cp_gpu_refuse_expert_counts(cp_gpu *g, int unit, const char *why);
/* Capture one step as a CUDA graph (on stream), then replay it; refused
 * for a plan with expert-parallel all-to-alls (run-time split sizes). */
int cp_gpu_graph_capture(cp_gpu *g, void *stream);
int cp_gpu_graph_launch(cp_gpu *g, void *stream);
/* Waits for stream while polling NCCL for asynchronous errors; after
 * timeout_s seconds aborts the communicators and fails instead of hanging. */
int cp_gpu_synchronize(cp_gpu *g, void *stream, double timeout_s);
/* After a failure: aborts the communicators unless stream finishes, then
 * waits until nothing queued on it can still run (host functions included),
 * so their buffers may be freed; -1 if it is still busy after timeout_s. */
int cp_gpu_quiesce(cp_gpu *g, void *stream, double timeout_s);
/* Prints one nccl-tests-style row per distinct collective of the step and
 * per copy kernel of the largest unit (size, time, algbw, busbw). */
int cp_gpu_bench_ops(cp_gpu *g, void *stream, int warmup, int iters, FILE *out);

/* Host copies of one of a unit's buffers (cp_buffer), ordered on stream
 * and finished on return. */
int cp_gpu_download(cp_gpu *g, int unit, cp_buffer kind, void *host, void *stream);
int cp_gpu_upload(cp_gpu *g, int unit, cp_buffer kind, const void *host, void *stream);
size_t cp_gpu_buffer_bytes(const cp_gpu *g, int unit, cp_buffer kind);

#endif
