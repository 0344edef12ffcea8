-- Stage 7 (audit numbers): bytes per collective, wire bytes per rank per
-- group family, peak memory per rank, and predicted time per op with an
-- alpha-beta model and nccl-tests' busbw factors.
local layout = require("gen.layout")
local groups = require("gen.groups")

local cost = {}

local ES = layout.DTYPE_BYTES

-- nccl-tests: busbw = algbw * factor; size is the larger buffer (AG out,
-- RS in, AR buffer).
function cost.bus_factor(kind, n)
  if n <= 1 then return 0 end
  if kind == "all_reduce" then return 2 * (n - 1) / n end
  return (n - 1) / n
end

function cost.op_size_bytes(o, fams)
  local es = ES[o.dtype]
  if o.kind == "all_reduce" then return o.count * es end
  local n = o.group and fams.by_name[o.group].size or 1
  return o.count * n * es
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
      total_us = total_us + o.predicted_us
      local acc = per_family[o.group] or { ops = 0, size_bytes = 0, wire_bytes = 0, us = 0 }
      acc.ops = acc.ops + 1
      acc.size_bytes = acc.size_bytes + size
      acc.wire_bytes = acc.wire_bytes + o.wire_bytes
      acc.us = acc.us + o.predicted_us
      per_family[o.group] = acc
    end
  end
  return { per_family = per_family, total_us = total_us, intra = intra }
end

-- Peak bytes per rank: persistent sharded params + sharded grads, plus the
-- largest set of transient buffers live at any point of the step.
function cost.memory(lay, ops)
  local W = lay.W
  local persistent = 0
  local sizes = {}
  for _, u in ipairs(lay.units) do
    local numel = 0
    for _, p in ipairs(u.params) do numel = numel + p.numel end
    persistent = persistent + 2 * u.total * ES[u.orig_dtype]
    sizes[u.index] = {
      ag = W * u.total * ES[u.ag_dtype], unsharded = W * u.total * ES[u.ag_dtype],
      grads = numel * ES[u.ag_dtype], rs_in = W * u.total * ES[u.reduce_dtype],
      rs_out = u.total * ES[u.reduce_dtype],
    }
  end
  local live, cur, peak, peak_at = {}, 0, 0, nil
  local function alloc(u, what)
    local key = u .. what
    if not live[key] then live[key] = true; cur = cur + sizes[u][what] end
  end
  local function free(u, what)
    local key = u .. what
    if live[key] then live[key] = nil; cur = cur - sizes[u][what] end
  end
  for _, o in ipairs(ops) do
    local u, k = o.unit, o.kind
    if k == "copy_in" then alloc(u, "ag")
    elseif k == "copy_out" then alloc(u, "unsharded")
    elseif k == "backward" then alloc(u, "grads")
    elseif k == "reshard" then free(u, "unsharded")
    elseif k == "pack" then alloc(u, "rs_in"); alloc(u, "rs_out")
    end
    if cur > peak then peak, peak_at = cur, o.seq end
    -- Released once the op that consumed them is done.
    if k == "copy_out" then free(u, "ag")
    elseif k == "pack" then free(u, "grads")
    elseif k == "reduce_scatter" then free(u, "rs_in")
    elseif k == "view_out" then free(u, "rs_out") end
  end
  return { persistent_bytes = persistent, peak_transient_bytes = peak, peak_bytes = persistent + peak,
           peak_at_op = peak_at }
end

return cost
