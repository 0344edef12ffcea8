-- The op kinds of a step, one descriptor each, in the order the C enum
-- cp_op_kind declares them (runtime/commplan.h holds the C side of the
-- same table: cp_op_descs). Every stage that needs a fact about a kind
-- reads it here instead of switching on the kind's name:
--   reads, writes  the unit's buffers the op accesses (the memory plan
--                  derives its data dependencies from them)
--   ring_passes    nccl-tests' busbw factor is ring_passes * (n - 1) / n
--   collective     issues a collective over the op's group
--   p2p            a point-to-point send or receive with the op's pp peer
local opkinds = {}

-- Zero copy-in: where a unit's stored dtype is its all-gather dtype, the
-- copy-in would only move bytes, so the all-gather reads this rank's
-- sharded storage itself (laid out as its fused slot: the same offsets and
-- padding), as a flat parameter buffer does; op.from_sharded marks it.
local FROM_SHARDED = { reads = { "sharded" }, writes = { "ag" } }
-- The all-gather over a post-forward group reads the post-forward buffer.
local FROM_POST_FORWARD = { reads = { "post_forward" }, writes = { "ag" } }

opkinds.LIST = {
  { name = "copy_in", reads = { "sharded" }, writes = { "ag" } },
  { name = "all_gather", reads = { "ag" }, writes = { "ag" }, collective = true, ring_passes = 1 },
  { name = "copy_out", reads = { "ag" }, writes = { "unsharded" } },
  { name = "forward", reads = { "unsharded" }, writes = {} },
  { name = "backward", reads = { "unsharded" }, writes = { "grads" } },
  { name = "reshard", reads = {}, writes = {} },
  { name = "pack", reads = { "grads" }, writes = { "rs_in" } },
  { name = "reduce_scatter", reads = { "rs_in" }, writes = { "rs_out" }, collective = true, ring_passes = 1 },
  { name = "all_reduce", reads = { "rs_out" }, writes = { "rs_out" }, collective = true, ring_passes = 2 },
  { name = "view_out", reads = { "rs_out" }, writes = { "sharded_grads" } },
  -- TP activation collectives inside a unit's forward and backward, in
  -- place on its activation buffer (gen/parallel/tp_acts.lua).
  { name = "tp_all_gather", reads = { "act" }, writes = { "act" }, collective = true, ring_passes = 1, tp = true },
  { name = "tp_reduce_scatter", reads = { "act" }, writes = { "act" }, collective = true, ring_passes = 1, tp = true },
  { name = "tp_all_reduce", reads = { "act" }, writes = { "act" }, collective = true, ring_passes = 2, tp = true },
  -- The view-out of a later reduction in the step: adds into the sharded
  -- grads (FSDP2's sharded_param.grad += new_sharded_grad, in their dtype).
  { name = "view_out_add", reads = { "rs_out", "sharded_grads" }, writes = { "sharded_grads" } },
  -- HSDP's set_requires_all_reduce(False) (grad_accumulation = "all_reduce_last"):
  -- foreach_reduce keeps each micro-step's reduce-scatter output in
  -- partial_reduce_output (the first one as it is, later ones added into it,
  -- in the reduce dtype) and the last micro-step adds it into its own output
  -- before the all-reduce, all on the reduce-scatter stream.
  { name = "partial_save", reads = { "rs_out" }, writes = { "partial" } },
  { name = "partial_add", reads = { "rs_out", "partial" }, writes = { "partial" } },
  { name = "partial_fold", reads = { "rs_out", "partial" }, writes = { "rs_out" } },
  -- Pipeline parallelism: one message (a stage's activation or its
  -- gradient) to or from the pp peer (op.peer, op.tag, op.batch), in the
  -- unit's pp buffer (gen/parallel/pp_*.lua fills them).
  { name = "send", reads = { "pp" }, writes = {}, p2p = true },
  { name = "recv", reads = {}, writes = { "pp" }, p2p = true },
  -- zero bubble's split backward: I (the input gradient, no weight grads);
  -- its W is a "backward" (gen/parallel/pp_tables.lua)
  { name = "backward_input", reads = { "unsharded" }, writes = {} },
  -- Expert parallelism (runtime/commplan.h CP_OP_A2A_COUNTS / CP_OP_A2A):
  -- torchtitan's token dispatch and combine over the ep group, the counts
  -- first (fixed size), then the tokens split by them within the op's
  -- per-member capacity (a2a_* fields, docs/expert-parallel.md). A
  -- dispatch reads a2a_send and writes a2a_recv, a combine the reverse.
  -- Priced as an all-gather of the same size (every member sends (n - 1) / n
  -- of it over the ring's links; gen/cost.lua): the counts as int64, the
  -- tokens at the uniform routing's share (the capacity bound is the audit's).
  { name = "a2a_counts", reads = { "a2a_counts" }, writes = { "a2a_counts" }, a2a = true, ring_passes = 1 },
  { name = "a2a", reads = { "a2a_counts", "a2a_send", "a2a_recv" }, writes = { "a2a_send", "a2a_recv" }, a2a = true,
    ring_passes = 1 },
  -- CPUOffloadPolicy (runtime/commplan.h CP_OP_H2D / CP_OP_D2H / CP_OP_D2H_ADD):
  -- the host's sharded parameters copied to the device before the copy-in
  -- (h2d: `sharded_param_data.to(device, non_blocking=True)`, torch 2.15
  -- _fsdp_param.py:1143-1146), the device's viewed-out gradient copied to
  -- the host's sharded grads after the reduction (d2h assigns, d2h_add adds
  -- on the host after a blocking copy: _fsdp_collectives.py:779-824).
  -- host = true: a copy over the host link (priced at topology.host_GBps).
  { name = "h2d", reads = { "sharded" }, writes = { "h2d" }, host = true },
  { name = "d2h", reads = { "d2h" }, writes = { "sharded_grads" }, host = true },
  { name = "d2h_add", reads = { "d2h", "sharded_grads" }, writes = { "sharded_grads" }, host = true },
  -- fully_shard(reshard_after_forward=k) (runtime/commplan.h CP_OP_POST_FORWARD):
  -- after forward, this rank's slice of the unsharded parameters copied to
  -- the post-forward buffer (FSDPParam.to_sharded_post_forward, torch 2.15
  -- _fsdp_param.py:970-1010), which backward's all-gather over the
  -- post-forward group reads (op.post_forward)
  { name = "post_forward", reads = { "unsharded" }, writes = { "post_forward" } },
}

-- An offloaded unit's copy-in reads the device copy h2d made, and its
-- view-out writes the device copy d2h then moves (op.offload).
local OFFLOADED = { copy_in = { reads = { "h2d" }, writes = { "ag" } },
                    view_out = { reads = { "rs_out" }, writes = { "d2h" } } }

opkinds.BY_NAME = {}
for i, d in ipairs(opkinds.LIST) do
  d.index = i - 1
  opkinds.BY_NAME[d.name] = d
end

-- CUDA streams, in the order the C enum cp_stream declares them: the
-- caller's compute stream and FSDP2's four side streams.
opkinds.STREAMS = { "compute", "copy_in", "all_gather", "reduce_scatter", "all_reduce" }

-- The stream each op runs on, as FSDP2 places them: copy-in and the
-- all-gather on their own high-priority streams (a one-rank shard group's
-- all-gather is a no-op on the copy-in stream), copy-out, compute and
-- resharding on the caller's stream, the chunk_cat packing too (foreach_reduce
-- runs foreach_reduce_scatter_copy_in on the current stream, into a buffer
-- allocated there, then makes the reduce-scatter stream wait for it), the
-- reduce-scatter on its own stream, the HSDP all-reduce on its own, and the
-- view-out on whichever ran the last reduction. The generator decides it
-- here; the executor obeys.
function opkinds.stream_of(o, hsdp)
  local k = o.kind
  if k == "copy_in" or k == "h2d" then return "copy_in"
  elseif k == "all_gather" then return o.group and "all_gather" or "copy_in"
  elseif k == "reduce_scatter" or k:sub(1, 8) == "partial_" then return "reduce_scatter"
  elseif k == "all_reduce" then return "all_reduce"
  elseif k == "view_out" or k == "view_out_add" or k == "d2h" or k == "d2h_add" then
    return hsdp and "all_reduce" or "reduce_scatter"
  end
  return "compute"
end

-- nccl-tests' size of a collective: the larger buffer (all-gather output,
-- reduce-scatter input, the all-reduce buffer), count being per rank.
function opkinds.size_elems(kind, count, n)
  if opkinds.BY_NAME[kind].ring_passes == 2 then return count end
  return count * n
end

-- nccl-tests: busbw = algbw * factor.
function opkinds.bus_factor(kind, n)
  if n <= 1 then return 0 end
  return (opkinds.BY_NAME[kind].ring_passes or 0) * (n - 1) / n
end

-- The buffers op o reads and writes: its kind's, but for an all-gather
-- from the sharded storage.
-- a backward on sharded parameters (set_unshard_in_backward(False),
-- gen/parallel/fsdp_layout.lua): the gradients only
local SHARDED_BACKWARD = { name = "backward", reads = {}, writes = { "grads" } }

function opkinds.access(o)
  if o.sharded and o.kind == "backward" then return SHARDED_BACKWARD end
  if o.from_sharded then return FROM_SHARDED end
  if o.post_forward and o.kind == "all_gather" then return FROM_POST_FORWARD end
  if o.offload and OFFLOADED[o.kind] then return OFFLOADED[o.kind] end
  return opkinds.BY_NAME[o.kind]
end

return opkinds
