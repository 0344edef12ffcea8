-- Stage 7 (audit numbers): bytes per collective, wire bytes per rank per
-- group family (nccl-tests' busbw factors), peak memory per rank, and
-- predicted time per op (NCCL's tuning model, or an alpha-beta model).
local util = require("gen.util")
local groups = require("gen.groups")
local hardware = require("gen.hardware")
local nccl_model = require("gen.nccl_model")

local cost = {}

local ES = util.DTYPE_BYTES

-- nccl-tests: busbw = algbw * factor; size is the larger buffer (AG out,
-- RS in, AR buffer).
cost.bus_factor = require("gen.opkinds").bus_factor

-- training (optional): the plan's training section; under float8's
-- tensorwise recipe the TP all-gathers feeding a block's linears move
-- float8 (torchao's float8 TP: the input cast before its gather, the
-- gradient cast before the backward's), one byte an element.
function cost.op_size_bytes(o, fams, training)
  local es = ES[o.dtype]
  if o.f8_gather and training and training.float8 == "tensorwise" then es = 1 end
  local n = o.group and fams.by_name[o.group].size or 1
  -- expert parallelism: the counts are int64; the tokens at the uniform share
  if o.kind == "a2a_counts" then return n * o.count * 8 end
  if o.kind == "a2a" then return n * (o.a2a_uniform or o.count) * es end
  return require("gen.opkinds").size_elems(o.kind, o.count, n) * es
end

-- The shape NCCL sees for a family's communicators: nodes, and GPUs of
-- the group on each (ranks fill nodes in order, gen/load.lua, so a mesh
-- group holds the same number of GPUs on each node it touches).
function cost.shape(f, gpus_per_node)
  local nodes = groups.nodes_spanned(f, gpus_per_node)
  return nodes, math.ceil(f.size / nodes)
end

-- NCCL's name for an op kind's collective (TP's run the same calls).
local function nccl_kind(kind)
  if kind == "a2a" or kind == "a2a_counts" then return "all_gather" end -- (opkinds: priced as one)
  return (kind:gsub("^tp_", ""))
end

-- One collective's predicted microseconds and, under the nccl model, the
-- algorithm/protocol NCCL picks. Results are memoised per (kind, bytes,
-- dtype, shape): a step repeats few distinct collectives.
local function pricer(topo)
  if topo.collectives == "alpha_beta" then
    return function(kind, size, _, nodes, k)
      local n = nodes * k
      local bw = nodes == 1 and topo.intra_node_GBps or topo.inter_node_GBps
      return topo.latency_us * math.ceil(math.log(n, 2)) + size * cost.bus_factor(kind, n) / (bw * 1e3)
    end
  end
  local net, memo = hardware.network(topo), {}
  return function(kind, size, dtype, nodes, k)
    local key = kind .. "|" .. size .. "|" .. dtype .. "|" .. nodes .. "|" .. k
    local r = memo[key]
    if not r then
      local m = nccl_model.predict({ kind = nccl_kind(kind), bytes = size, dtype = dtype, nodes = nodes,
                                     gpus_per_node = k }, net)
      r = { m.us, m.algorithm .. "/" .. m.protocol }
      memo[key] = r
    end
    return r[1], r[2]
  end
end

-- Predicted microseconds of every collective op (o.predicted_us; o.algorithm
-- under the nccl model), its size and wire bytes (nccl-tests' busbw
-- factor), and the totals per family.
-- topo.collectives = "nccl": gen/nccl_model.lua, NCCL 2.28's own tuning
-- model on the group's shape (nodes x GPUs per node); "alpha_beta":
-- latency x ceil(log2 n) + wire bytes / the bandwidth inside a node or across.
function cost.predict(ops, fams, topo, training)
  local intra, shape = {}, {}
  for _, f in ipairs(fams.list) do
    intra[f.name] = groups.intra_node(f, topo.gpus_per_node)
    local nodes, k = cost.shape(f, topo.gpus_per_node)
    shape[f.name] = { nodes = nodes, gpus_per_node = k }
  end
  local price = pricer(topo)
  local per_family, total_us = {}, 0
  for _, o in ipairs(ops) do
    if o.group then
      local f = fams.by_name[o.group]
      local sh = shape[o.group]
      local size = cost.op_size_bytes(o, fams, training)
      local wire = size * cost.bus_factor(o.kind, f.size)
      o.size_bytes = size
      o.wire_bytes = math.floor(wire + 0.5)
      o.intra_node = intra[o.group]
      o.predicted_us, o.algorithm = price(o.kind, size, o.dtype, sh.nodes, sh.gpus_per_node)
      -- a repeated micro-step's op counts once per repetition (gen/repeat.lua)
      local times = o.times or 1
      total_us = total_us + o.predicted_us * times
      local acc = per_family[o.group] or { ops = 0, size_bytes = 0, wire_bytes = 0, us = 0, algorithms = {} }
      acc.ops = acc.ops + times
      if o.algorithm then acc.algorithms[o.algorithm] = (acc.algorithms[o.algorithm] or 0) + times end
      acc.size_bytes = acc.size_bytes + size * times
      acc.wire_bytes = acc.wire_bytes + o.wire_bytes * times
      acc.us = acc.us + o.predicted_us * times
      per_family[o.group] = acc
    end
  end
  return { per_family = per_family, total_us = total_us, intra = intra, shape = shape }
end

-- A point-to-point transfer (pipeline activations), which NCCL's tuning
-- model does not price: a ring/Simple latency step on the link it crosses
-- (NCCL's base + hardware latency, gen/nccl_model.lua's tables) plus the
-- bytes over that link: one NIC (its line rate or its PCIe path, the lower)
-- across nodes, the GPU's NVLinks inside one.
function cost.p2p_us(bytes, same_node, topo)
  if topo.collectives == "alpha_beta" then
    return topo.latency_us + bytes / ((same_node and topo.intra_node_GBps or topo.inter_node_GBps) * 1e3)
  end
  local net = hardware.network(topo)
  local ring, simple, hw = 2, 3, same_node and 1 or 3
  local lat = nccl_model.BASE_LAT[ring][simple] + nccl_model.HW_LAT[hw][ring][simple] + net.net_latency_us
  local GBps = same_node and net.nvlinks * net.nvlink_GBps or math.min(net.pci_GBps, net.nic_Gbps / 8)
  return lat + bytes / (GBps * 1e3)
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
