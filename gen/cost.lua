-- Stage 7 (audit numbers): bytes per collective, wire bytes per rank per
-- group family, peak memory per rank, and predicted time per op with an
-- alpha-beta model and nccl-tests' busbw factors.
local util = require("gen.util")
local groups = require("gen.groups")

local cost = {}

local ES = util.DTYPE_BYTES

-- nccl-tests: busbw = algbw * factor; size is the larger buffer (AG out,
-- RS in, AR buffer).
cost.bus_factor = require("gen.opkinds").bus_factor

function cost.op_size_bytes(o, fams)
  local es = ES[o.dtype]
  local n = o.group and fams.by_name[o.group].size or 1
  return require("gen.opkinds").size_elems(o.kind, o.count, n) * es
end

-- Predicted microseconds: latency * ceil(log2 n) (tree/PAT-like start-up)
-- plus size * busbw factor / link bandwidth of the family's slowest hop.
function cost.predict(ops, fams, topo)
  local intra = {}
  for _, f in ipairs(fams.list) do intra[f.name] = groups.intra_node(f, topo.gpus_per_node) end
  local per_family, total_us = {}, 0
  for _, o in ipairs(ops) do
    if o.group then
      local f = fams.by_name[o.group]
      local size = cost.op_size_bytes(o, fams)
      local wire = size * cost.bus_factor(o.kind, f.size)
      local bw = intra[o.group] and topo.intra_node_GBps or topo.inter_node_GBps
      local steps = math.ceil(math.log(f.size, 2))
      o.size_bytes = size
      o.wire_bytes = math.floor(wire + 0.5)
      o.intra_node = intra[o.group]
      o.predicted_us = topo.latency_us * steps + wire / (bw * 1e3)
      -- a repeated micro-step's op counts once per repetition (gen/repeat.lua)
      local times = o.times or 1
      total_us = total_us + o.predicted_us * times
      local acc = per_family[o.group] or { ops = 0, size_bytes = 0, wire_bytes = 0, us = 0 }
      acc.ops = acc.ops + times
      acc.size_bytes = acc.size_bytes + size * times
      acc.wire_bytes = acc.wire_bytes + o.wire_bytes * times
      acc.us = acc.us + o.predicted_us * times
      per_family[o.group] = acc
    end
  end
  return { per_family = per_family, total_us = total_us, intra = intra }
end

-- Peak bytes per rank: persistent sharded params + sharded grads, plus the
-- largest set of transient buffers live at any point of the step.
-- Per-rank memory from the arena plan's lifetimes: the peak of bytes live
-- at any one op (a lower bound for any allocator) and the arena the plan
-- actually reserves.
function cost.memory(lay, ops, arena)
  local persistent = 0
  for _, u in ipairs(lay.units) do persistent = persistent + 2 * u.total * ES[u.orig_dtype] end
  local delta = {}
  for _, b in ipairs(arena.buffers) do
    for _, iv in ipairs(b.lives) do
      delta[iv.first] = (delta[iv.first] or 0) + b.bytes
      delta[iv.last + 1] = (delta[iv.last + 1] or 0) - b.bytes
    end
  end
  local cur, peak, peak_at = 0, 0, nil
  for _, o in ipairs(ops) do
    cur = cur + (delta[o.seq] or 0)
    if cur > peak then peak, peak_at = cur, o.seq end
  end
  return { persistent_bytes = persistent, peak_transient_bytes = peak, peak_bytes = persistent + peak,
           peak_at_op = peak_at, arena_bytes = arena.arena_bytes, unplanned_bytes = arena.unplanned_bytes,
           allocated_bytes = persistent + arena.arena_bytes }
end

return cost
